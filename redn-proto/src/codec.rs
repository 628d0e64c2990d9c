//! Varlink messages on a byte stream: one JSON object, then a NUL byte.
//!
//! [`MessageBuffer`] collects bytes as they arrive and hands out whole messages, refusing one
//! that grows past [`Limits::max_message`] before its NUL arrives (the stream cannot be
//! trusted after that, so the caller closes it). [`Call::parse`] checks JSON nesting against
//! [`Limits::max_depth`] *before* building a value, then the header rules of the spec.

use crate::{Error, Result};
use serde_json::{Map, Value};

/// Caps on what one peer may send in one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest message in bytes, without its NUL.
    pub max_message: usize,
    /// Most file descriptors passed with one message.
    pub max_fds: usize,
    /// Deepest nesting of JSON arrays and objects (the message object itself is depth 1).
    pub max_depth: usize,
}

impl Default for Limits {
    /// 1 MiB messages (sd-varlink allows 16 MiB; nothing in our API needs more than a few
    /// KiB), 4 fds per message (`RegisterRegion` takes one), nesting depth 16 (our deepest
    /// parameters nest 4 deep).
    fn default() -> Limits {
        Limits {
            max_message: 1 << 20,
            max_fds: 4,
            max_depth: 16,
        }
    }
}

/// Bytes received on one connection, split into messages at NUL bytes.
#[derive(Debug)]
pub struct MessageBuffer {
    limits: Limits,
    bytes: Vec<u8>,
    /// Bytes before this index were handed out already (moved out in bulk, not per
    /// message, so a burst of small messages costs linear time).
    start: usize,
    /// Bytes from `start` to this index hold no NUL (saves rescanning a growing partial
    /// message).
    scanned: usize,
}

/// Handed-out bytes are moved out once there are this many.
const COMPACT_AT: usize = 64 << 10;
/// An emptied buffer larger than this is shrunk back to it.
const KEEP_CAPACITY: usize = 16 << 10;

impl MessageBuffer {
    /// An empty buffer enforcing `limits`.
    pub fn new(limits: Limits) -> MessageBuffer {
        MessageBuffer {
            limits,
            bytes: Vec::new(),
            start: 0,
            scanned: 0,
        }
    }

    /// Append received bytes.
    pub fn extend(&mut self, data: &[u8]) {
        if self.is_empty() {
            self.bytes.clear();
            self.bytes.shrink_to(KEEP_CAPACITY);
            (self.start, self.scanned) = (0, 0);
        } else if self.start >= COMPACT_AT {
            self.bytes.drain(..self.start);
            self.scanned -= self.start;
            self.start = 0;
        }
        self.bytes.extend_from_slice(data);
    }

    /// True if no bytes are waiting (the next byte received starts a message).
    pub fn is_empty(&self) -> bool {
        self.start == self.bytes.len()
    }

    /// Memory held, in bytes.
    pub fn held(&self) -> usize {
        self.bytes.capacity()
    }

    /// Drop everything buffered (the connection is being closed).
    pub fn clear(&mut self) {
        self.bytes = Vec::new();
        (self.start, self.scanned) = (0, 0);
    }

    /// The next whole message (without its NUL), `None` if none is complete yet.
    ///
    /// # Errors
    /// [`Error::Protocol`] (`message-size`) if a message is, or has grown, larger than
    /// [`Limits::max_message`]; the buffer cannot find the next message after that.
    pub fn next_message(&mut self) -> Option<Result<Vec<u8>>> {
        let from = self.scanned.max(self.start);
        match self.bytes[from..].iter().position(|&b| b == 0) {
            Some(i) => {
                let end = from + i;
                let begin = self.start;
                self.start = end + 1;
                self.scanned = self.start;
                if end - begin > self.limits.max_message {
                    return Some(Err(too_large(self.limits.max_message)));
                }
                Some(Ok(self.bytes[begin..end].to_vec()))
            }
            None => {
                self.scanned = self.bytes.len();
                (self.bytes.len() - self.start > self.limits.max_message)
                    .then(|| Err(too_large(self.limits.max_message)))
            }
        }
    }
}

fn too_large(max: usize) -> Error {
    Error::protocol(
        "message-size",
        format!("a message is larger than {max} bytes"),
    )
}

/// Refuse `json` if its arrays and objects nest deeper than `max`, without parsing it
/// (serde_json would recurse up to 128 levels before refusing).
///
/// # Errors
/// [`Error::Protocol`] (`nesting`).
pub fn check_depth(json: &[u8], max: usize) -> Result<()> {
    let mut depth = 0usize;
    for b in outside_strings(json) {
        match b {
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return Err(Error::protocol(
                        "nesting",
                        format!("JSON nests deeper than {max} levels"),
                    ));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// The bytes of `json` that are not inside one of its strings (an opening quote is, the rest
/// of the string and its closing quote are not), for checks of its shape that do not parse
/// it.
pub(crate) fn outside_strings(json: &[u8]) -> impl Iterator<Item = u8> + '_ {
    let mut in_string = false;
    let mut escaped = false;
    json.iter().copied().filter(move |&b| {
        if !in_string {
            in_string = b == b'"';
            return true;
        }
        match (escaped, b) {
            (true, _) => escaped = false,
            (false, b'\\') => escaped = true,
            (false, b'"') => in_string = false,
            _ => {}
        }
        false
    })
}

/// Parse one message as a JSON object, checking its depth first.
///
/// # Errors
/// [`Error::Protocol`]: `nesting`, or `json` for text that is not a JSON object.
pub fn parse_object(json: &[u8], limits: &Limits) -> Result<Map<String, Value>> {
    check_depth(json, limits.max_depth)?;
    match serde_json::from_slice::<Value>(json) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(Error::protocol("json", "a message must be a JSON object")),
        Err(e) => Err(Error::protocol("json", format!("not valid JSON: {e}"))),
    }
}

/// A method call.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// `interface.Method`.
    pub method: String,
    /// The parameters (absent, `null` and `{}` are all an empty object).
    pub parameters: Map<String, Value>,
    /// The caller wants no reply.
    pub oneway: bool,
    /// The caller accepts several replies.
    pub more: bool,
    /// The caller asks to leave varlink for another protocol.
    pub upgrade: bool,
}

impl Call {
    /// A call of `method` with `parameters` and no flags.
    pub fn new(method: &str, parameters: Map<String, Value>) -> Call {
        Call {
            method: method.to_owned(),
            parameters,
            oneway: false,
            more: false,
            upgrade: false,
        }
    }

    /// Parse a call: a JSON object with a string `method`, optional object `parameters`,
    /// optional bool `oneway`/`more`/`upgrade` (at most one true), and no other key unless
    /// it is a vendor extension (a reverse-domain name, which holds a dot).
    ///
    /// # Errors
    /// [`Error::Protocol`] naming the rule broken.
    pub fn parse(json: &[u8], limits: &Limits) -> Result<Call> {
        let mut map = parse_object(json, limits)?;
        let header = |reason: String| Error::protocol("header", reason);
        let method = match map.remove("method") {
            Some(Value::String(m)) => m,
            Some(_) => return Err(header("\"method\" must be a string".into())),
            None => return Err(header("a call needs a \"method\"".into())),
        };
        let parameters = match map.remove("parameters") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(p)) => p,
            Some(_) => return Err(header("\"parameters\" must be an object".into())),
        };
        let mut flag = |name: &str| match map.remove(name) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(b),
            Some(_) => Err(header(format!("\"{name}\" must be true or false"))),
        };
        let (oneway, more, upgrade) = (flag("oneway")?, flag("more")?, flag("upgrade")?);
        if [oneway, more, upgrade].iter().filter(|&&f| f).count() > 1 {
            return Err(header(
                "at most one of \"oneway\", \"more\" and \"upgrade\" may be true".into(),
            ));
        }
        if let Some(key) = map.keys().find(|k| !k.contains('.')) {
            return Err(header(format!("unknown header key {key:?}")));
        }
        Ok(Call {
            method,
            parameters,
            oneway,
            more,
            upgrade,
        })
    }

    /// The interface part of the method name (before the last dot), if it has one.
    pub fn interface(&self) -> Option<&str> {
        self.method.rsplit_once('.').map(|(i, _)| i)
    }

    /// The call as a message, NUL included.
    pub fn encode(&self) -> Vec<u8> {
        let mut map = Map::new();
        map.insert("method".into(), Value::String(self.method.clone()));
        map.insert("parameters".into(), Value::Object(self.parameters.clone()));
        for (name, set) in [
            ("oneway", self.oneway),
            ("more", self.more),
            ("upgrade", self.upgrade),
        ] {
            if set {
                map.insert(name.into(), Value::Bool(true));
            }
        }
        encode(&Value::Object(map))
    }
}

/// A reply: parameters, or an error name with its parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    /// The error's full name, `None` for a success.
    pub error: Option<String>,
    /// The reply's (or error's) parameters.
    pub parameters: Map<String, Value>,
    /// More replies follow (only for calls that set `more`).
    pub continues: bool,
}

impl Reply {
    /// A successful reply.
    pub fn ok(parameters: Map<String, Value>) -> Reply {
        Reply {
            error: None,
            parameters,
            continues: false,
        }
    }

    /// The reply as a message, NUL included.
    pub fn encode(&self) -> Vec<u8> {
        let mut map = Map::new();
        map.insert("parameters".into(), Value::Object(self.parameters.clone()));
        if let Some(e) = &self.error {
            map.insert("error".into(), Value::String(e.clone()));
        }
        if self.continues {
            map.insert("continues".into(), Value::Bool(true));
        }
        encode(&Value::Object(map))
    }

    /// Parse a reply. Unknown keys are ignored, as the spec asks of clients.
    ///
    /// # Errors
    /// [`Error::Protocol`] for text that is not a reply.
    pub fn parse(json: &[u8], limits: &Limits) -> Result<Reply> {
        let mut map = parse_object(json, limits)?;
        let header = |reason: &str| Error::protocol("header", reason);
        let error = match map.remove("error") {
            None | Some(Value::Null) => None,
            Some(Value::String(e)) => Some(e),
            Some(_) => return Err(header("\"error\" must be a string")),
        };
        let parameters = match map.remove("parameters") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(p)) => p,
            Some(_) => return Err(header("\"parameters\" must be an object")),
        };
        let continues = matches!(map.remove("continues"), Some(Value::Bool(true)));
        Ok(Reply {
            error,
            parameters,
            continues,
        })
    }
}

/// `value` as a message: compact JSON and a NUL.
pub fn encode(value: &Value) -> Vec<u8> {
    // Serialising a Value cannot fail: its map keys are strings.
    let mut out = serde_json::to_vec(value).unwrap_or_default();
    out.push(0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(text: &str) -> Result<Call> {
        Call::parse(text.as_bytes(), &Limits::default())
    }

    #[test]
    fn messages_split_at_nul_across_reads() {
        let mut buf = MessageBuffer::new(Limits::default());
        buf.extend(b"{\"a\":1}\0{\"b\"");
        assert_eq!(buf.next_message().unwrap().unwrap(), b"{\"a\":1}");
        assert!(buf.next_message().is_none());
        buf.extend(b":2}\0{}\0");
        assert_eq!(buf.next_message().unwrap().unwrap(), b"{\"b\":2}");
        assert_eq!(buf.next_message().unwrap().unwrap(), b"{}");
        assert!(buf.next_message().is_none());
        assert!(buf.is_empty());
    }

    #[test]
    fn a_stream_of_small_messages_is_split_in_order_and_memory_is_given_back() {
        let mut buf = MessageBuffer::new(Limits::default());
        let mut next = 0u32;
        for chunk in 0..64 {
            // Messages cut at every possible place across reads.
            let text: String = (0..1000)
                .map(|i| format!("{}\0", chunk * 1000 + i))
                .collect();
            for piece in text.as_bytes().chunks(4093) {
                buf.extend(piece);
                while let Some(m) = buf.next_message() {
                    assert_eq!(m.unwrap(), next.to_string().as_bytes());
                    next += 1;
                }
            }
        }
        assert_eq!(next, 64_000);
        assert!(buf.is_empty());
        // A burst that grew the buffer to 1 MiB does not keep it.
        buf.extend(&[b' '; 1 << 20]);
        buf.extend(b"\0");
        assert_eq!(buf.next_message().unwrap().unwrap().len(), 1 << 20);
        buf.extend(b"{}");
        assert!(buf.held() <= KEEP_CAPACITY, "{}", buf.held());
        buf.extend(b"\0");
        assert_eq!(buf.next_message().unwrap().unwrap(), b"{}");
    }

    #[test]
    fn an_oversize_message_is_refused_before_its_nul_arrives() {
        let limits = Limits {
            max_message: 16,
            ..Limits::default()
        };
        let mut buf = MessageBuffer::new(limits);
        buf.extend(&[b' '; 16]);
        assert!(buf.next_message().is_none(), "16 bytes are within the cap");
        buf.extend(b" ");
        let err = buf.next_message().unwrap().unwrap_err();
        assert!(err.to_string().starts_with("message-size"), "{err}");
        let mut whole = MessageBuffer::new(limits);
        whole.extend(&[b' '; 17]);
        whole.extend(b"\0");
        assert!(whole.next_message().unwrap().is_err());
    }

    #[test]
    fn only_the_bytes_outside_strings_are_seen() {
        // Opening quotes are seen; the strings' bytes, escaped quotes and closing quotes not.
        let seen: Vec<u8> = outside_strings(br#"{"a,[":[1,"\"{,"],"b":2}"#).collect();
        assert_eq!(seen, br#"{":[1,"],":2}"#);
    }

    #[test]
    fn nesting_is_counted_outside_strings_only() {
        assert!(check_depth(b"[[[1]]]", 3).is_ok());
        assert!(check_depth(b"[[[[1]]]]", 3).is_err());
        assert!(check_depth(br#"{"a":"[[[[[[\"[["}"#, 1).is_ok());
        assert!(check_depth(br#"{"a":"\\",  "b":[[1]]}"#, 2).is_err());
        let deep = format!(
            "{{\"method\":\"a.B\",\"parameters\":{{\"x\":{}1{}}}}}",
            "[".repeat(40),
            "]".repeat(40)
        );
        let err = call(&deep).unwrap_err();
        assert!(err.to_string().starts_with("nesting"), "{err}");
    }

    #[test]
    fn calls_follow_the_header_rules() {
        let c = call(r#" { "method" : "a.b.C", "more": true } "#).unwrap();
        assert_eq!(
            (c.method.as_str(), c.more, c.oneway),
            ("a.b.C", true, false)
        );
        assert!(c.parameters.is_empty());
        assert_eq!(c.interface(), Some("a.b"));
        assert!(call(r#"{"method":"a.B","parameters":null}"#)
            .unwrap()
            .parameters
            .is_empty());
        assert!(
            call(r#"{"method":"a.B","io.redn.trace":{}}"#).is_ok(),
            "vendor keys pass"
        );
        for (bad, why) in [
            ("[1]", "must be a JSON object"),
            ("{\"method\":", "not valid JSON"),
            ("{}", "needs a \"method\""),
            ("{\"method\":7}", "must be a string"),
            (
                "{\"method\":\"a.B\",\"parameters\":[]}",
                "must be an object",
            ),
            ("{\"method\":\"a.B\",\"oneway\":1}", "true or false"),
            (
                "{\"method\":\"a.B\",\"oneway\":true,\"more\":true}",
                "at most one",
            ),
            (
                "{\"method\":\"a.B\",\"color\":1}",
                "unknown header key \"color\"",
            ),
        ] {
            let err = call(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn calls_and_replies_round_trip() {
        let mut p = Map::new();
        p.insert("x".into(), Value::from(3));
        let mut c = Call::new("io.redn.Manager.Stats", p.clone());
        c.oneway = true;
        let bytes = c.encode();
        assert_eq!(bytes.last(), Some(&0));
        assert_eq!(
            call(std::str::from_utf8(&bytes[..bytes.len() - 1]).unwrap()).unwrap(),
            c
        );
        let r = Reply {
            error: Some("x.Y".into()),
            parameters: p,
            continues: false,
        };
        let bytes = r.encode();
        assert_eq!(
            Reply::parse(&bytes[..bytes.len() - 1], &Limits::default()).unwrap(),
            r
        );
    }
}
