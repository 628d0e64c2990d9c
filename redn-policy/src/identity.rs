//! Who is asking: choosing the app rule for a local peer, and the tokens remote clients
//! present.
//!
//! # Which rule applies
//!
//! The manager fills a [`PeerIdentity`] from `SO_PEERCRED` and `/proc/PID/{exe,cgroup,stat}`
//! when an app connects; [`Policy::match_app`](crate::Policy::match_app) picks the rule:
//!
//! 1. A rule *matches* a peer only if **every** matcher it has matches:
//!    - `uid`: equals the peer's effective uid;
//!    - `gid`: equals the peer's effective (primary) gid from `SO_PEERCRED`; supplementary
//!      groups are not considered;
//!    - `exe`: equals the peer's executable path (`/proc/PID/exe`), compared as a path;
//!    - `cgroup`: is the peer's cgroup v2 path or a parent of it, compared whole component by
//!      component (`/system.slice/kv.service` covers `/system.slice/kv.service` and
//!      `/system.slice/kv.service/worker`, not `/system.slice/kv.service2`); `/` covers all.
//!
//!    A rule with no matcher is refused when the policy is loaded.
//! 2. Among the matching rules, the **most specific** wins. Specificity ([`Specificity`]) is
//!    compared first by a score, the sum of `exe` 8, `cgroup` 4, `uid` 2 and `gid` 1 for the
//!    matchers the rule has, so a rule with `exe` beats any rule without one, and so on down;
//!    on equal scores, the longer `cgroup` prefix wins.
//! 3. Two rules of equal specificity that could match the same peer are refused when the
//!    policy is loaded, so the choice never depends on the order of the file. (Equal scores
//!    mean the same kinds of matcher; equal cgroup lengths then mean equal cgroups, since both
//!    are prefixes of the one peer path; so two such rules overlap exactly when all their
//!    matchers are equal.)
//! 4. No matching rule: the peer is not an app the policy knows, and the manager refuses it.
//!
//! `pid` and `start_time` take no part in matching: the manager keeps them to notice a pid
//! reused by another process.
//!
//! # Remote clients
//!
//! A remote client has no local credentials; it proves which app it belongs to with the
//! [`Token`] that app was handed by the manager and passed on.

use crate::error::{Error, Result};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use subtle::ConstantTimeEq;

/// What the manager knows about a local peer when it connects.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PeerIdentity {
    /// Effective uid (`SO_PEERCRED`).
    pub uid: u32,
    /// Effective gid (`SO_PEERCRED`).
    pub gid: u32,
    /// Process id (`SO_PEERCRED`).
    pub pid: u32,
    /// Executable (`/proc/PID/exe`).
    pub exe: PathBuf,
    /// cgroup v2 path (the `0::` line of `/proc/PID/cgroup`), such as
    /// `/system.slice/kv.service`.
    pub cgroup: String,
    /// Start time in clock ticks since boot (field 22 of `/proc/PID/stat`).
    pub start_time: u64,
}

/// The matchers of an app rule (`uid`, `gid`, `exe`, `cgroup` in `policy.toml`). At least one
/// is present in a loaded policy.
///
/// To build one outside a policy, start from [`Matchers::default`] (no matcher) and set
/// fields.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Matchers {
    /// The peer's uid must equal this.
    pub uid: Option<u32>,
    /// The peer's gid must equal this.
    pub gid: Option<u32>,
    /// The peer's executable must be this absolute path.
    pub exe: Option<PathBuf>,
    /// The peer's cgroup must be this one or below it.
    pub cgroup: Option<String>,
}

impl Matchers {
    /// Whether no matcher is set (such a rule would match every peer; the policy refuses it).
    pub fn is_empty(&self) -> bool {
        self.uid.is_none() && self.gid.is_none() && self.exe.is_none() && self.cgroup.is_none()
    }

    /// Whether every matcher that is set matches `peer`. An empty set matches nothing.
    #[must_use]
    pub fn matches(&self, peer: &PeerIdentity) -> bool {
        !self.is_empty()
            && self.uid.map_or(true, |uid| uid == peer.uid)
            && self.gid.map_or(true, |gid| gid == peer.gid)
            && self
                .exe
                .as_deref()
                .map_or(true, |exe| exe == peer.exe.as_path())
            && self
                .cgroup
                .as_deref()
                .map_or(true, |prefix| cgroup_covers(prefix, &peer.cgroup))
    }

    /// How specific these matchers are; see the [module docs](self).
    pub fn specificity(&self) -> Specificity {
        let mut score = 0;
        if self.exe.is_some() {
            score += Specificity::EXE;
        }
        if self.cgroup.is_some() {
            score += Specificity::CGROUP;
        }
        if self.uid.is_some() {
            score += Specificity::UID;
        }
        if self.gid.is_some() {
            score += Specificity::GID;
        }
        Specificity {
            score,
            cgroup_len: self.cgroup.as_ref().map_or(0, String::len),
        }
    }
}

/// Whether cgroup `prefix` is `path` or one of its parents.
fn cgroup_covers(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return path.starts_with('/');
    }
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// How specific an app rule is: ordered by [`score`](Self::score), then by the length of the
/// cgroup prefix. The greater value wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Specificity {
    // Field order is the comparison order (derived `Ord`).
    score: u8,
    cgroup_len: usize,
}

impl Specificity {
    /// Score of an `exe` matcher.
    pub const EXE: u8 = 8;
    /// Score of a `cgroup` matcher.
    pub const CGROUP: u8 = 4;
    /// Score of a `uid` matcher.
    pub const UID: u8 = 2;
    /// Score of a `gid` matcher.
    pub const GID: u8 = 1;

    /// The sum of the scores of the matchers present, 0..=15.
    pub const fn score(self) -> u8 {
        self.score
    }

    /// Length in bytes of the cgroup prefix, 0 without one.
    pub const fn cgroup_len(self) -> usize {
        self.cgroup_len
    }
}

/// Whether `path` is an absolute path written without `.`/`..` components, empty components
/// or a trailing `/` (the form `/proc` reports, so that a comparison can succeed).
pub(crate) fn is_normal_absolute(path: &str) -> bool {
    path == "/"
        || (path.starts_with('/')
            && !path.ends_with('/')
            && path[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".."))
}

/// A client token: 32 bytes, written as 64 hex digits.
///
/// The manager draws a token from a CSPRNG for each grant and hands it to the app, which
/// passes it on to its remote clients; a client presents it to be recognised. Tokens are
/// secrets, so this type:
/// - compares in constant time (`==` is `subtle`'s `ConstantTimeEq`, which looks at every
///   byte whatever differs);
/// - has no `Display` and a redacted `Debug`, so it does not end up in logs by accident;
///   [`Token::to_hex`] is the one way to write it out;
/// - never repeats the refused text in a parse error.
#[derive(Clone)]
pub struct Token([u8; Token::BYTES]);

impl Token {
    /// Length of a token in bytes.
    pub const BYTES: usize = 32;
    /// Length of a token's text form: two hex digits per byte.
    pub const HEX_LEN: usize = 2 * Token::BYTES;

    /// A token from its bytes.
    pub const fn from_bytes(bytes: [u8; Token::BYTES]) -> Self {
        Token(bytes)
    }

    /// The token's bytes.
    pub const fn as_bytes(&self) -> &[u8; Token::BYTES] {
        &self.0
    }

    /// The text form: [`Token::HEX_LEN`] lower-case hex digits. Never log it.
    pub fn to_hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = String::with_capacity(Token::HEX_LEN);
        for b in self.0 {
            out.push(char::from(DIGITS[usize::from(b >> 4)]));
            out.push(char::from(DIGITS[usize::from(b & 0xf)]));
        }
        out
    }
}

impl FromStr for Token {
    type Err = Error;

    /// Parse exactly [`Token::HEX_LEN`] hex digits (either case). The all-zero token is
    /// refused: the manager never issues it, so it can only be a placeholder.
    fn from_str(text: &str) -> Result<Self> {
        let bad = |reason: String| Error::Token { reason };
        if text.len() != Token::HEX_LEN {
            return Err(bad(format!(
                "expected {} hex digits, got {} bytes",
                Token::HEX_LEN,
                text.len()
            )));
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        };
        let mut bytes = [0u8; Token::BYTES];
        for (i, pair) in text.as_bytes().chunks_exact(2).enumerate() {
            match (nibble(pair[0]), nibble(pair[1])) {
                (Some(hi), Some(lo)) => bytes[i] = hi << 4 | lo,
                _ => return Err(bad("contains a character that is not a hex digit".into())),
            }
        }
        let token = Token(bytes);
        if token == Token([0; Token::BYTES]) {
            return Err(bad("the all-zero token is never issued".into()));
        }
        Ok(token)
    }
}

impl PartialEq for Token {
    /// Constant time, by `subtle`'s [`ConstantTimeEq`]: every byte is compared whatever the
    /// first difference, and the result is kept out of the optimiser's sight.
    fn eq(&self, other: &Self) -> bool {
        self.0[..].ct_eq(&other.0[..]).into()
    }
}

impl Eq for Token {}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A peer with these credentials, pid 4242 and start time 123456.
    pub(crate) fn peer(uid: u32, gid: u32, exe: &str, cgroup: &str) -> PeerIdentity {
        PeerIdentity {
            uid,
            gid,
            pid: 4242,
            exe: exe.into(),
            cgroup: cgroup.into(),
            start_time: 123_456,
        }
    }

    #[test]
    fn cgroup_prefixes_match_whole_components() {
        assert!(cgroup_covers("/a/b", "/a/b"));
        assert!(cgroup_covers("/a/b", "/a/b/c"));
        assert!(!cgroup_covers("/a/b", "/a/bc"));
        assert!(!cgroup_covers("/a/b", "/a"));
        assert!(cgroup_covers("/", "/a"));
        assert!(cgroup_covers("/", "/"));
        assert!(!cgroup_covers("/", ""));
    }

    #[test]
    fn specificity_is_ordered_as_documented() {
        let m = |uid: bool, gid: bool, exe: bool, cgroup: Option<&str>| {
            Matchers {
                uid: uid.then_some(1),
                gid: gid.then_some(1),
                exe: exe.then(|| "/bin/x".into()),
                cgroup: cgroup.map(str::to_owned),
            }
            .specificity()
        };
        assert_eq!(m(true, true, true, Some("/a")).score(), 15);
        assert!(m(false, false, true, None) > m(true, true, false, Some("/a/b/c")));
        assert!(m(false, false, false, Some("/a")) > m(true, true, false, None));
        assert!(m(true, false, false, None) > m(false, true, false, None));
        assert!(m(false, false, false, Some("/a/b")) > m(false, false, false, Some("/a")));
        assert_eq!(m(false, false, false, Some("/a/b")).cgroup_len(), 4);
        assert!(!Matchers::default().matches(&peer(0, 0, "/x", "/")));
    }

    #[test]
    fn tokens_parse_and_format() {
        let hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
        let t: Token = hex.parse().unwrap();
        assert_eq!(t.to_hex(), hex);
        assert_eq!(t.as_bytes()[1], 0x11);
        assert_eq!(hex.to_uppercase().parse::<Token>().unwrap(), t);
        assert_eq!(Token::from_bytes(*t.as_bytes()), t);
        let mut other = *t.as_bytes();
        other[31] ^= 1;
        assert_ne!(Token::from_bytes(other), t);
        assert_eq!(format!("{t:?}"), "Token(<redacted>)");
    }

    #[test]
    fn bad_tokens_are_refused_without_echo() {
        let secretish = "deadbeef".repeat(8);
        for (text, why) in [
            (&secretish[..63], "got 63 bytes"),
            (&format!("{secretish}0")[..], "got 65 bytes"),
            (&format!("{}g", &secretish[..63])[..], "not a hex digit"),
            (&"0".repeat(64)[..], "all-zero"),
            ("", "got 0 bytes"),
            (&format!("{}é", &secretish[..62])[..], "not a hex digit"),
        ] {
            let e = text.parse::<Token>().unwrap_err().to_string();
            assert!(e.starts_with("invalid token: "), "{e}");
            assert!(e.contains(why), "{text}: {e}");
            assert!(!e.contains("deadbeef"), "{e}");
        }
    }

    #[test]
    fn path_normal_form() {
        for good in ["/", "/usr/bin/kv", "/a"] {
            assert!(is_normal_absolute(good), "{good}");
        }
        for bad in [
            "",
            "usr/bin",
            "/usr/bin/",
            "/usr//bin",
            "/usr/./bin",
            "/usr/../bin",
            "//",
        ] {
            assert!(!is_normal_absolute(bad), "{bad}");
        }
    }
}
