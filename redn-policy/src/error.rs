//! The crate's one error type.

use std::fmt;
use std::path::PathBuf;

/// A position in a configuration file, both 1-based. The column counts characters, not bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Location {
    /// Line number, from 1.
    pub line: usize,
    /// Column number in characters, from 1.
    pub column: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// Errors of the redn-policy crate.
///
/// Configuration errors render as `FILE:LINE:COLUMN: KEY: MESSAGE`, for example
/// `/etc/redn/policy.toml:14:1: app "kv" client.on_violation: "ban" requires ban_duration`,
/// so that editors and `grep` can jump to them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration file could not be opened or read.
    #[error("{}: cannot read the file", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A configuration file (or text given to a `parse_*` function) exceeds the size cap; it
    /// was refused before parsing.
    #[error(
        "{origin}: larger than the {cap}-byte limit for configuration files; refusing to parse it"
    )]
    TooLarge {
        /// The file, or the origin given to a `parse_*` function.
        origin: String,
        /// The cap in bytes ([`MAX_FILE_BYTES`](crate::MAX_FILE_BYTES)).
        cap: u64,
    },
    /// A configuration file is invalid: bad syntax, an unknown or missing key, a wrong type, a
    /// malformed unit, or a value the schema refuses.
    #[error("{}", render_invalid(.origin, .location.as_ref(), .key.as_deref(), .message))]
    Invalid {
        /// The file, or the origin given to a `parse_*` function.
        origin: String,
        /// Where in the file, when known.
        location: Option<Location>,
        /// The key path, such as `backend.pci_address` or `app "kv" client.on_violation`, when
        /// known (a syntax error outside any key has none).
        key: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// A value given as a string (a size, a duration, a rate, an address...) is malformed.
    #[error("invalid {what} {value:?}: {reason}")]
    Value {
        /// What kind of value was expected ("size", "duration", ...).
        what: &'static str,
        /// The text that was refused.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// A client token is malformed. The text is never repeated: it may be a secret.
    #[error("invalid token: {reason}")]
    Token {
        /// Why it was refused.
        reason: String,
    },
}

impl Error {
    /// Build an [`Error::Value`].
    pub(crate) fn value(
        what: &'static str,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Error::Value {
            what,
            value: value.into(),
            reason: reason.into(),
        }
    }
}

fn render_invalid(
    origin: &str,
    location: Option<&Location>,
    key: Option<&str>,
    message: &str,
) -> String {
    let mut out = String::from(origin);
    if let Some(location) = location {
        out.push(':');
        out.push_str(&location.to_string());
    }
    out.push_str(": ");
    if let Some(key) = key {
        out.push_str(key);
        out.push_str(": ");
    }
    out.push_str(message);
    out
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_renders_file_line_column_key() {
        let e = Error::Invalid {
            origin: "policy.toml".into(),
            location: Some(Location {
                line: 14,
                column: 1,
            }),
            key: Some("app \"kv\" client.on_violation".into()),
            message: "\"ban\" requires ban_duration".into(),
        };
        assert_eq!(
            e.to_string(),
            "policy.toml:14:1: app \"kv\" client.on_violation: \"ban\" requires ban_duration"
        );
        let e = Error::Invalid {
            origin: "x.toml".into(),
            location: None,
            key: None,
            message: "bad".into(),
        };
        assert_eq!(e.to_string(), "x.toml: bad");
    }

    #[test]
    fn read_error_does_not_repeat_its_source() {
        let e = Error::Read {
            path: "/nope".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert_eq!(e.to_string(), "/nope: cannot read the file");
        assert!(std::error::Error::source(&e).is_some());
    }
}
