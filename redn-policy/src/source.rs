//! Reading configuration files under a size cap, and turning positions and key paths into
//! the `FILE:LINE:COLUMN: KEY: MESSAGE` form of [`Error::Invalid`].

use crate::error::{Error, Location, Result};
use serde::de::DeserializeOwned;
use std::fmt::Write as _;
use std::io::Read;
use std::ops::Range;
use std::path::Path;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// Largest configuration file accepted, in bytes (1 MiB). Larger files are refused before
/// they are parsed.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Read `path` as UTF-8 text, refusing files larger than [`MAX_FILE_BYTES`] without reading
/// more than one byte past the cap.
pub(crate) fn read_capped(path: &Path) -> Result<String> {
    let read_error = |source| Error::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    let origin = path.display().to_string();
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(Error::TooLarge {
            origin,
            cap: MAX_FILE_BYTES,
        });
    }
    String::from_utf8(bytes).map_err(|e| {
        let good = e.utf8_error().valid_up_to();
        // Everything before `good` is valid UTF-8, so positions there can be computed.
        let prefix = String::from_utf8_lossy(&e.as_bytes()[..good]).into_owned();
        Error::Invalid {
            location: Some(location_in(&prefix, good)),
            origin,
            key: None,
            message: "the file is not valid UTF-8".into(),
        }
    })
}

/// One step of a key path: a table key, or a position in an array.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// A path from the document root to a key, such as `app[2].client.on_violation`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeyPath(Vec<Seg>);

impl KeyPath {
    pub(crate) fn root() -> Self {
        KeyPath(Vec::new())
    }

    /// This path extended by a key.
    pub(crate) fn key(&self, key: &str) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Key(key.to_owned()));
        p
    }

    /// This path extended by an array index.
    pub(crate) fn index(&self, index: usize) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Index(index));
        p
    }
}

/// A semantic error found after deserialization: where (as a key path) and what.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Invalid {
    pub(crate) path: KeyPath,
    pub(crate) message: String,
}

/// Shorthand for building an [`Invalid`].
pub(crate) fn invalid(path: KeyPath, message: impl Into<String>) -> Invalid {
    Invalid {
        path,
        message: message.into(),
    }
}

/// A parsed TOML document kept next to the typed value, so that errors found later can be
/// given a line and column.
pub(crate) struct Document<'a> {
    origin: &'a str,
    text: &'a str,
    root: Spanned<DeTable<'a>>,
}

/// A key or array element of the document with its path and spans.
struct Entry {
    path: Vec<Seg>,
    key_span: Option<Range<usize>>,
    value_span: Range<usize>,
}

impl<'a> Document<'a> {
    /// Parse `text` (after the size check) and deserialize it into `T`. Syntax errors and
    /// deserialization errors (unknown keys, wrong types, units) come back located.
    pub(crate) fn parse<T: DeserializeOwned>(text: &'a str, origin: &'a str) -> Result<(T, Self)> {
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(Error::TooLarge {
                origin: origin.to_owned(),
                cap: MAX_FILE_BYTES,
            });
        }
        let (root, errors) = DeTable::parse_recoverable(text);
        let doc = Document { origin, text, root };
        if let Some(e) = errors.first() {
            return Err(doc.toml_error(e, false));
        }
        let value = T::deserialize(toml::de::Deserializer::from(doc.root.clone()))
            .map_err(|e| doc.toml_error(&e, true))?;
        Ok((value, doc))
    }

    /// Convert a semantic error into [`Error::Invalid`], located at the key the path names
    /// (or the deepest part of it present in the file).
    pub(crate) fn error(&self, invalid: Invalid) -> Error {
        Error::Invalid {
            origin: self.origin.to_owned(),
            location: self
                .span_of(&invalid.path.0)
                .map(|s| self.location(s.start)),
            key: Some(self.render(&invalid.path.0)).filter(|k| !k.is_empty()),
            message: invalid.message,
        }
    }

    /// The line of the key the path names, if present.
    pub(crate) fn line_of(&self, path: &KeyPath) -> Option<usize> {
        self.span_of(&path.0).map(|s| self.location(s.start).line)
    }

    /// Locate a toml error by its span. `deserializing` tells errors from the deserializer
    /// (whose empty span at the root means "the document") from syntax errors.
    fn toml_error(&self, e: &toml::de::Error, deserializing: bool) -> Error {
        let mut message = e.message().to_owned();
        let span = e.span();
        let mut path = match &span {
            Some(span) if deserializing && *span == self.root.span() => Some(Vec::new()),
            Some(span) => self.path_at(span),
            None => None,
        };
        // serde names the key itself in these two messages; move it into the key path.
        if let Some(field) = quoted_field(&message, "missing field `") {
            if let Some(p) = &mut path {
                p.push(Seg::Key(field.to_owned()));
            }
            message = "this key is required but missing".into();
        } else if let Some(field) = quoted_field(&message, "unknown field `") {
            let rest = message
                .strip_prefix(&format!("unknown field `{field}`"))
                .unwrap_or("")
                .to_owned();
            message = format!("unknown key{rest}");
        }
        let key = match path {
            Some(p) => Some(self.render(&p)),
            None => span.as_ref().and_then(|s| self.textual_key(s.start)),
        }
        // A blank key names nothing: the document root (an empty path), a key the parser
        // recovered as empty (`= 1`), or an empty header (`[]`) above or on the line.
        .filter(|k| !k.trim().is_empty());
        Error::Invalid {
            origin: self.origin.to_owned(),
            location: span.map(|s| self.location(s.start)),
            key,
            message,
        }
    }

    fn location(&self, offset: usize) -> Location {
        location_in(self.text, offset)
    }

    /// Every key and array element, depth first.
    fn entries(&self) -> Vec<Entry> {
        fn walk_value(value: &Spanned<DeValue<'_>>, path: &mut Vec<Seg>, out: &mut Vec<Entry>) {
            match value.get_ref() {
                DeValue::Table(table) => walk_table(table, path, out),
                DeValue::Array(array) => {
                    for (i, element) in array.iter().enumerate() {
                        path.push(Seg::Index(i));
                        out.push(Entry {
                            path: path.clone(),
                            key_span: None,
                            value_span: element.span(),
                        });
                        walk_value(element, path, out);
                        path.pop();
                    }
                }
                _ => {}
            }
        }
        fn walk_table(table: &DeTable<'_>, path: &mut Vec<Seg>, out: &mut Vec<Entry>) {
            for (key, value) in table.iter() {
                path.push(Seg::Key(key.get_ref().to_string()));
                out.push(Entry {
                    path: path.clone(),
                    key_span: Some(key.span()),
                    value_span: value.span(),
                });
                walk_value(value, path, out);
                path.pop();
            }
        }
        let mut out = Vec::new();
        walk_table(self.root.get_ref(), &mut Vec::new(), &mut out);
        out
    }

    /// The path of the smallest key or value containing `span` (the deepest on ties).
    fn path_at(&self, span: &Range<usize>) -> Option<Vec<Seg>> {
        let contains = |outer: &Range<usize>| {
            outer.start <= span.start
                && (span.end <= outer.end)
                && (span.start < outer.end || outer.start == outer.end)
        };
        self.entries()
            .into_iter()
            .filter_map(|e| {
                let hit = [e.key_span.clone(), Some(e.value_span.clone())]
                    .into_iter()
                    .flatten()
                    .filter(|s| contains(s))
                    .map(|s| s.len())
                    .min()?;
                Some((hit, std::cmp::Reverse(e.path.len()), e.path))
            })
            .min_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)))
            .map(|(_, _, path)| path)
    }

    /// One step down from `at` (the root when `None`): the span of the key (or of the
    /// element, for an index) and its value.
    fn child<'d>(
        &'d self,
        at: Option<&'d Spanned<DeValue<'a>>>,
        seg: &Seg,
    ) -> Option<(Range<usize>, &'d Spanned<DeValue<'a>>)> {
        let table = match at.map(Spanned::get_ref) {
            None => Some(self.root.get_ref()),
            Some(DeValue::Table(t)) => Some(t),
            Some(_) => None,
        };
        match (seg, table, at.map(Spanned::get_ref)) {
            (Seg::Key(k), Some(t), _) => {
                t.get_key_value(k.as_str()).map(|(key, v)| (key.span(), v))
            }
            (Seg::Index(i), _, Some(DeValue::Array(a))) => a.get(*i).map(|v| (v.span(), v)),
            _ => None,
        }
    }

    /// The span of the key the path names: its key, or for an array element the element;
    /// if the full path is absent, the deepest present prefix.
    fn span_of(&self, path: &[Seg]) -> Option<Range<usize>> {
        let mut span = None;
        let mut at = None;
        for seg in path {
            let Some((s, v)) = self.child(at, seg) else {
                break;
            };
            span = Some(s);
            at = Some(v);
        }
        span
    }

    /// Render a key path for people: keys joined by dots; an array element that is a table
    /// with a string `name` (or, failing that, `label`) shows as ` "name"`
    /// (`app "kv" client.on_violation`, `queue "worker0" wqe "0.b0.if" swap`), any other as
    /// `[index]`.
    fn render(&self, path: &[Seg]) -> String {
        let mut out = String::new();
        let mut at = None;
        let mut lost = false;
        let mut after_name = false;
        for seg in path {
            let next = if lost {
                None
            } else {
                self.child(at, seg).map(|(_, v)| v)
            };
            lost = next.is_none();
            match seg {
                Seg::Key(k) => {
                    if after_name {
                        out.push(' ');
                    } else if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(k);
                    after_name = false;
                }
                Seg::Index(i) => {
                    let name = next.and_then(|e| e.get_ref().as_table()).and_then(|t| {
                        ["name", "label"]
                            .iter()
                            .find_map(|k| t.get(*k).and_then(|n| n.get_ref().as_str()))
                    });
                    match name {
                        Some(name) => {
                            let _ = write!(out, " {name:?}");
                            after_name = true;
                        }
                        None => {
                            let _ = write!(out, "[{i}]");
                            after_name = false;
                        }
                    }
                }
            }
            at = next;
        }
        out
    }

    /// For syntax errors outside anything the parser recovered: the key written on the line
    /// at `offset`, prefixed by the last table header above it. It may be empty (an empty
    /// header, `[]`): the caller names no key then, as for any blank key.
    fn textual_key(&self, offset: usize) -> Option<String> {
        let offset = floor_char_boundary(self.text, offset);
        let line_start = self.text[..offset].rfind('\n').map_or(0, |i| i + 1);
        let line_end = self.text[offset..]
            .find('\n')
            .map_or(self.text.len(), |i| offset + i);
        let line = self.text[line_start..line_end].trim();
        // The dotted key between a header's brackets, whatever follows them
        // (`[[app]] junk` names `app`, `[ a . b ]` names `a.b`).
        let header = |l: &str| -> Option<String> {
            let inner = l.trim().strip_prefix('[')?;
            let inner = inner.strip_prefix('[').unwrap_or(inner);
            let inner = inner.split(']').next().unwrap_or("");
            Some(
                inner
                    .split('.')
                    .map(str::trim)
                    .collect::<Vec<_>>()
                    .join("."),
            )
        };
        if let Some(h) = header(line) {
            return Some(h);
        }
        let table = self.text[..line_start].lines().rev().find_map(header);
        let key = line
            .split_once('=')
            .map(|(k, _)| k.trim().to_owned())
            .filter(|k| !k.is_empty() && !k.starts_with('#'));
        match (table, key) {
            (Some(t), Some(k)) if !t.is_empty() => Some(format!("{t}.{k}")),
            (_, Some(k)) => Some(k),
            (table, None) => table,
        }
    }
}

/// The text between "`prefix`" and the next backquote.
fn quoted_field<'m>(message: &'m str, prefix: &str) -> Option<&'m str> {
    message.strip_prefix(prefix)?.split('`').next()
}

fn floor_char_boundary(text: &str, offset: usize) -> usize {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    offset
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
pub(crate) fn location_in(text: &str, offset: usize) -> Location {
    let before = &text[..floor_char_boundary(text, offset)];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    Location {
        line: before.matches('\n').count() + 1,
        column: before[line_start..].chars().count() + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // only deserialized, to test error locations
    struct Doc {
        #[serde(default)]
        app: Vec<App>,
        top: Option<u32>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // only deserialized, to test error locations
    struct App {
        name: String,
        uid: Option<u32>,
        client: Client,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // only deserialized, to test error locations
    struct Client {
        rate: u32,
    }

    fn err(text: &str) -> String {
        match Document::parse::<Doc>(text, "t.toml") {
            Ok(_) => panic!("parsed: {text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn locations() {
        let t = "ab\ncdé\nx";
        assert_eq!(location_in(t, 0), Location { line: 1, column: 1 });
        assert_eq!(location_in(t, 3), Location { line: 2, column: 1 });
        assert_eq!(location_in(t, 7), Location { line: 2, column: 4 });
        assert_eq!(location_in(t, 6), Location { line: 2, column: 3 }); // inside 'é'
        assert_eq!(location_in(t, 100), Location { line: 3, column: 2 });
    }

    #[test]
    fn deserialization_errors_name_line_and_key() {
        let base = "[[app]]\nname = \"a\"\nuid = 5\n[app.client]\nrate = 3\n";
        let e = err(&format!(
            "{base}[[app]]\nname = \"b\"\nbogus = 1\n[app.client]\nrate = 1\n"
        ));
        assert_eq!(
            e,
            "t.toml:8:1: app \"b\" bogus: unknown key, expected one of `name`, `uid`, `client`"
        );
        let e = err("[[app]]\nname = \"a\"\nuid = \"x\"\n[app.client]\nrate = 3\n");
        assert_eq!(
            e,
            "t.toml:3:7: app \"a\" uid: invalid type: string \"x\", expected u32"
        );
        let e = err("[[app]]\nname = \"a\"\nuid = 5\n");
        assert_eq!(
            e,
            "t.toml:1:1: app \"a\" client: this key is required but missing"
        );
        let e = err("[[app]]\nuid = 5\n[app.client]\nrate = 1\n");
        assert_eq!(
            e,
            "t.toml:1:1: app[0].name: this key is required but missing"
        );
        let e = err("app = [{name = \"a\", client = {rate = 1, x = 2}}]\n");
        assert_eq!(
            e,
            "t.toml:1:41: app \"a\" client.x: unknown key, expected `rate`"
        );
        let e = err("[app]\nname = \"a\"\n");
        assert_eq!(e, "t.toml:1:1: app: invalid type: map, expected a sequence");
        let e = err("# comment\ntop = -1\n");
        assert!(e.starts_with("t.toml:2:7: top: invalid value"), "{e}");
        let e = err("# comment\nnope = 1\n");
        assert!(e.starts_with("t.toml:2:1: nope: unknown key"), "{e}");
    }

    #[test]
    fn syntax_errors_name_line_and_key() {
        let e = err("[[app]]\nname = \"a\"\nname = \"b\"\n");
        assert!(e.starts_with("t.toml:3:1: app"), "{e}");
        assert!(e.contains("name"), "{e}");
        assert!(e.contains("duplicate key"), "{e}");
        let e = err("top = 1\n[[app]]\nname = \"a\nuid = 5\n");
        assert!(e.starts_with("t.toml:3:"), "{e}");
        assert!(e.contains("name"), "{e}");
        let e = err("top = = 1\n");
        assert!(e.starts_with("t.toml:1:"), "{e}");
        assert!(e.contains(": top: "), "{e}");
    }

    #[test]
    fn semantic_errors_find_their_key() {
        let text = "[[app]]\nname = \"a\"\nuid = 5\n[app.client]\nrate = 3\n\n[[app]]\nname = \"b\"\n[app.client]\nrate = 1\n";
        let (_, doc) = Document::parse::<Doc>(text, "t.toml").unwrap();
        let apps = KeyPath::root().key("app");
        let e = doc.error(invalid(apps.index(1).key("client").key("rate"), "too fast"));
        assert_eq!(
            e.to_string(),
            "t.toml:10:1: app \"b\" client.rate: too fast"
        );
        // A missing key is located at its table.
        let e = doc.error(invalid(apps.index(1).key("uid"), "needed"));
        assert_eq!(e.to_string(), "t.toml:7:1: app \"b\" uid: needed");
        assert_eq!(doc.line_of(&apps.index(0)), Some(1));
        let e = doc.error(invalid(KeyPath::root(), "empty"));
        assert_eq!(e.to_string(), "t.toml: empty");
    }

    #[test]
    fn oversize_text_is_refused_before_parsing() {
        let text = "#".repeat(usize::try_from(MAX_FILE_BYTES).unwrap() + 1);
        let e = err(&text);
        assert!(
            e.starts_with("t.toml: larger than the 1048576-byte limit"),
            "{e}"
        );
    }

    #[test]
    fn read_capped_refuses_large_and_non_utf8_files() {
        let dir = std::env::temp_dir().join(format!("redn-policy-source-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big.toml");
        std::fs::write(
            &big,
            vec![b'#'; usize::try_from(MAX_FILE_BYTES).unwrap() + 10],
        )
        .unwrap();
        let e = read_capped(&big).unwrap_err().to_string();
        assert!(
            e.contains("big.toml: larger than the 1048576-byte limit"),
            "{e}"
        );
        let exact = dir.join("exact.toml");
        std::fs::write(&exact, vec![b'#'; usize::try_from(MAX_FILE_BYTES).unwrap()]).unwrap();
        assert!(read_capped(&exact).is_ok());
        let bin = dir.join("bin.toml");
        std::fs::write(&bin, b"a = 1\nb = \"\xff\"\n").unwrap();
        let e = read_capped(&bin).unwrap_err().to_string();
        assert!(
            e.contains("bin.toml:2:6: the file is not valid UTF-8"),
            "{e}"
        );
        let e = read_capped(&dir.join("missing.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.toml: cannot read"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_error_at_the_root_names_no_key() {
        // The document as a whole has the wrong type: no key to name, not an empty one.
        let e = match Document::parse::<u32>("a = 1\n", "t.toml") {
            Ok(_) => panic!("parsed"),
            Err(e) => e.to_string(),
        };
        assert_eq!(e, "t.toml:1:1: invalid type: map, expected u32");
    }

    #[test]
    fn syntax_errors_outside_any_key_take_the_table_above() {
        let e = err("[a]\nx\n");
        assert!(e.starts_with("t.toml:2:2: a: "), "{e}");
        // An empty header (`[]`, or a line `[` opening an array of arrays) names nothing.
        let e = err("top = 1\n[]\nx\n");
        assert_eq!(e, "t.toml:3:2: key with no value, expected `=`");
        let e = err("a = [\n[\n1]\n]\nb = = 1\n");
        assert!(e.starts_with("t.toml:5:5: b: "), "{e}");
        // Text after a header names the header's key, not the rest of the line.
        let e = err("[[app]] junk\n");
        assert!(e.starts_with("t.toml:1:9: app: "), "{e}");
        let e = err("[ app . client ] x\n");
        assert!(e.starts_with("t.toml:1:18: app.client: "), "{e}");
    }

    #[test]
    fn an_empty_key_is_not_named() {
        let e = err("= 1\n");
        assert!(
            e.starts_with("t.toml:1:1: unquoted keys cannot be empty"),
            "{e}"
        );
    }
    #[test]
    fn an_error_just_past_a_value_names_the_key_that_holds_it() {
        // The span is empty, just past the value of `b` (and of the table `a`): the table
        // left open is `a`'s, so the error is `a`'s, not `b`'s.
        let e = err("a = {b = 1\n");
        assert!(
            e.starts_with("t.toml:1:11: a: unclosed inline table"),
            "{e}"
        );
        // An empty value of `b`, inside `a`'s table: the empty span is inside both; `b` is
        // the smallest.
        let e = err("a = {b = }\n");
        assert!(e.starts_with("t.toml:1:10: a.b: "), "{e}");
    }

    #[test]
    fn a_header_line_names_its_key_when_the_parser_kept_nothing() {
        let e = err("[a\n");
        assert!(e.starts_with("t.toml:1:3: a: unclosed table"), "{e}");
        let e = err("[a] x\n");
        assert!(e.starts_with("t.toml:1:5: a: "), "{e}");
    }

    #[test]
    fn a_comment_line_names_no_key() {
        // A control character in a comment that holds `=`: the comment's text is no key.
        let e = err("[t]\n# a = \u{1}\n");
        assert!(
            e.starts_with("t.toml:2:7: t: invalid comment character"),
            "{e}"
        );
        let e = err("# a = \u{1}\n");
        assert!(
            e.starts_with("t.toml:1:7: invalid comment character"),
            "{e}"
        );
    }
}
