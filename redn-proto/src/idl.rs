//! The interface definitions, embedded, and a small parser for the varlink IDL.
//!
//! The parser follows varlink.org's Interface-Definition grammar (and UAPI.20's): an
//! `interface` line, then `type`, `method` and `error` declarations sharing one namespace,
//! `#` comments, the types `bool int float string object`, named types, `?T` (not `??T`),
//! `[]T`, `[string]T`, enums `(a, b)` and structs `(f: T)`. It checks the name rules and
//! that every named type is declared. The manager serves the files exactly as shipped;
//! the parser is what the tests use to hold them and the code to each other.

use crate::{Error, Result};
use std::collections::BTreeSet;

/// `io.redn.Manager.varlink`, the apps' interface.
pub const MANAGER_IDL: &str = include_str!("../interfaces/io.redn.Manager.varlink");
/// `io.redn.Admin.varlink`, the admins' interface.
pub const ADMIN_IDL: &str = include_str!("../interfaces/io.redn.Admin.varlink");
/// `org.varlink.service.varlink`, which every varlink service implements.
pub const SERVICE_IDL: &str = include_str!("../interfaces/org.varlink.service.varlink");

/// A type in the IDL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Type {
    /// `bool`, `int`, `float`, `string`, `object` or `any`.
    Builtin(String),
    /// A type declared with `type`.
    Named(String),
    /// `?T`.
    Optional(Box<Type>),
    /// `[]T`.
    Array(Box<Type>),
    /// `[string]T`.
    Map(Box<Type>),
    /// `(a, b, c)`.
    Enum(Vec<String>),
    /// `(f: T, ...)`.
    Struct(Vec<Field>),
}

/// A struct field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// Its name.
    pub name: String,
    /// Its type.
    pub ty: Type,
}

/// A declaration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Member {
    /// `type Name T`.
    Type {
        /// Name.
        name: String,
        /// Definition.
        ty: Type,
    },
    /// `method Name (in) -> (out)`.
    Method {
        /// Name.
        name: String,
        /// Parameters.
        input: Vec<Field>,
        /// Reply parameters.
        output: Vec<Field>,
    },
    /// `error Name (params)`.
    Error {
        /// Name.
        name: String,
        /// Parameters.
        params: Vec<Field>,
    },
}

impl Member {
    /// The declared name.
    pub fn name(&self) -> &str {
        match self {
            Member::Type { name, .. }
            | Member::Method { name, .. }
            | Member::Error { name, .. } => name,
        }
    }
}

/// A parsed interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    /// Its name, such as `io.redn.Manager`.
    pub name: String,
    /// Its declarations in file order.
    pub members: Vec<Member>,
}

impl Interface {
    /// The method called `name`.
    pub fn method(&self, name: &str) -> Option<(&[Field], &[Field])> {
        self.members.iter().find_map(|m| match m {
            Member::Method {
                name: n,
                input,
                output,
            } if n == name => Some((input.as_slice(), output.as_slice())),
            _ => None,
        })
    }

    /// Names of its methods.
    pub fn methods(&self) -> Vec<&str> {
        self.members
            .iter()
            .filter(|m| matches!(m, Member::Method { .. }))
            .map(Member::name)
            .collect()
    }

    /// Its errors: full name and parameter names (sorted).
    pub fn errors(&self) -> Vec<(String, Vec<String>)> {
        self.members
            .iter()
            .filter_map(|m| match m {
                Member::Error { name, params } => {
                    let mut p: Vec<String> = params.iter().map(|f| f.name.clone()).collect();
                    p.sort();
                    Some((format!("{}.{name}", self.name), p))
                }
                _ => None,
            })
            .collect()
    }
}

fn idl_error(line: usize, reason: impl Into<String>) -> Error {
    Error::Protocol {
        limit: "idl",
        reason: format!("line {line}: {}", reason.into()),
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Word(String),
    Punct(&'static str),
}

fn tokenize(text: &str) -> Result<Vec<(usize, Tok)>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        let code = line.split('#').next().unwrap_or("");
        let mut chars = code.char_indices().peekable();
        while let Some(&(i, c)) = chars.peek() {
            if c.is_whitespace() {
                chars.next();
            } else if c.is_ascii_alphanumeric()
                || c == '_'
                || c == '.'
                || c == '-' && !code[i..].starts_with("->")
            {
                let mut end = i;
                while let Some(&(j, d)) = chars.peek() {
                    let arrow = d == '-' && code[j..].starts_with("->");
                    if (d.is_ascii_alphanumeric() || d == '_' || d == '.' || d == '-') && !arrow {
                        end = j + d.len_utf8();
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push((line_no, Tok::Word(code[i..end].to_owned())));
            } else {
                let p = ["->", "(", ")", ":", ",", "[", "]", "?"]
                    .into_iter()
                    .find(|p| code[i..].starts_with(p))
                    .ok_or_else(|| idl_error(line_no, format!("unexpected character {c:?}")))?;
                for _ in 0..p.len() {
                    chars.next();
                }
                out.push((line_no, Tok::Punct(p)));
            }
        }
    }
    Ok(out)
}

fn is_interface_name(s: &str) -> bool {
    let labels: Vec<&str> = s.split('.').collect();
    labels.len() >= 2
        && labels.iter().enumerate().all(|(i, l)| {
            let b = l.as_bytes();
            !b.is_empty()
                && (if i == 0 {
                    b[0].is_ascii_alphabetic()
                } else {
                    b[0].is_ascii_alphanumeric()
                })
                && !l.ends_with('-')
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        })
}

fn is_member_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty() && b[0].is_ascii_uppercase() && b.iter().all(u8::is_ascii_alphanumeric)
}

fn is_field_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphabetic()
        && !s.ends_with('_')
        && !s.contains("__")
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

struct Parser {
    toks: Vec<(usize, Tok)>,
    at: usize,
}

impl Parser {
    fn line(&self) -> usize {
        self.toks
            .get(self.at)
            .or_else(|| self.toks.last())
            .map_or(0, |t| t.0)
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at).map(|t| &t.1)
    }

    fn next(&mut self) -> Result<Tok> {
        let t = self
            .toks
            .get(self.at)
            .map(|t| t.1.clone())
            .ok_or_else(|| idl_error(self.line(), "unexpected end of file"))?;
        self.at += 1;
        Ok(t)
    }

    fn word(&mut self) -> Result<String> {
        match self.next()? {
            Tok::Word(w) => Ok(w),
            Tok::Punct(p) => Err(idl_error(
                self.line(),
                format!("expected a name, got {p:?}"),
            )),
        }
    }

    fn punct(&mut self, want: &'static str) -> Result<()> {
        match self.next()? {
            Tok::Punct(p) if p == want => Ok(()),
            other => Err(idl_error(
                self.line(),
                format!("expected {want:?}, got {other:?}"),
            )),
        }
    }

    fn eat(&mut self, want: &'static str) -> bool {
        if self.peek() == Some(&Tok::Punct(want)) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    /// `( ... )`: an enum or a struct (an empty one is a struct).
    fn paren(&mut self) -> Result<Type> {
        self.punct("(")?;
        if self.eat(")") {
            return Ok(Type::Struct(Vec::new()));
        }
        let mut fields = Vec::new();
        let mut variants = Vec::new();
        loop {
            let name = self.word()?;
            if !is_field_name(&name) {
                return Err(idl_error(self.line(), format!("bad field name {name:?}")));
            }
            if self.eat(":") {
                if !variants.is_empty() {
                    return Err(idl_error(self.line(), "an enum mixed with struct fields"));
                }
                fields.push(Field {
                    name,
                    ty: self.ty()?,
                });
            } else {
                if !fields.is_empty() {
                    return Err(idl_error(self.line(), "a struct field without a type"));
                }
                variants.push(name);
            }
            if self.eat(")") {
                break;
            }
            self.punct(",")?;
        }
        let mut seen = BTreeSet::new();
        for n in fields.iter().map(|f| &f.name).chain(&variants) {
            if !seen.insert(n.clone()) {
                return Err(idl_error(self.line(), format!("{n:?} appears twice")));
            }
        }
        Ok(if variants.is_empty() {
            Type::Struct(fields)
        } else {
            Type::Enum(variants)
        })
    }

    fn ty(&mut self) -> Result<Type> {
        if self.eat("?") {
            if self.peek() == Some(&Tok::Punct("?")) {
                return Err(idl_error(self.line(), "\"??\" is not a type"));
            }
            return Ok(Type::Optional(Box::new(self.ty()?)));
        }
        if self.eat("[") {
            if self.eat("]") {
                return Ok(Type::Array(Box::new(self.ty()?)));
            }
            let key = self.word()?;
            if key != "string" {
                return Err(idl_error(self.line(), "map keys must be string"));
            }
            self.punct("]")?;
            return Ok(Type::Map(Box::new(self.ty()?)));
        }
        if self.peek() == Some(&Tok::Punct("(")) {
            return self.paren();
        }
        let w = self.word()?;
        match w.as_str() {
            "bool" | "int" | "float" | "string" | "object" | "any" => Ok(Type::Builtin(w)),
            _ if is_member_name(&w) => Ok(Type::Named(w)),
            _ => Err(idl_error(self.line(), format!("unknown type {w:?}"))),
        }
    }

    fn fields(&mut self) -> Result<Vec<Field>> {
        match self.paren()? {
            Type::Struct(f) => Ok(f),
            _ => Err(idl_error(self.line(), "expected (name: type, ...)")),
        }
    }
}

/// Parse an interface definition.
///
/// # Errors
/// [`Error::Protocol`] (`idl`) naming the line and what was wrong.
pub fn parse(text: &str) -> Result<Interface> {
    let mut p = Parser {
        toks: tokenize(text)?,
        at: 0,
    };
    if p.word()? != "interface" {
        return Err(idl_error(
            p.line(),
            "a definition starts with \"interface NAME\"",
        ));
    }
    let name = p.word()?;
    if !is_interface_name(&name) {
        return Err(idl_error(p.line(), format!("bad interface name {name:?}")));
    }
    let mut members = Vec::new();
    while p.peek().is_some() {
        let kind = p.word()?;
        let member_name = p.word()?;
        if !is_member_name(&member_name) {
            return Err(idl_error(p.line(), format!("bad name {member_name:?}")));
        }
        let m = match kind.as_str() {
            "type" => Member::Type {
                name: member_name,
                ty: p.ty()?,
            },
            "method" => {
                let input = p.fields()?;
                p.punct("->")?;
                Member::Method {
                    name: member_name,
                    input,
                    output: p.fields()?,
                }
            }
            "error" => Member::Error {
                name: member_name,
                params: p.fields()?,
            },
            _ => return Err(idl_error(p.line(), format!("unknown declaration {kind:?}"))),
        };
        if members.iter().any(|x: &Member| x.name() == m.name()) {
            return Err(idl_error(
                p.line(),
                format!("{:?} declared twice", m.name()),
            ));
        }
        members.push(m);
    }
    let iface = Interface { name, members };
    check_named_types(&iface)?;
    Ok(iface)
}

fn check_named_types(iface: &Interface) -> Result<()> {
    fn walk<'t>(t: &'t Type, out: &mut Vec<&'t str>) {
        match t {
            Type::Named(n) => out.push(n),
            Type::Optional(t) | Type::Array(t) | Type::Map(t) => walk(t, out),
            Type::Struct(f) => f.iter().for_each(|f| walk(&f.ty, out)),
            Type::Builtin(_) | Type::Enum(_) => {}
        }
    }
    let declared: BTreeSet<&str> = iface
        .members
        .iter()
        .filter(|m| matches!(m, Member::Type { .. }))
        .map(Member::name)
        .collect();
    let mut used = Vec::new();
    for m in &iface.members {
        match m {
            Member::Type { ty, .. } => walk(ty, &mut used),
            Member::Method { input, output, .. } => {
                input
                    .iter()
                    .chain(output)
                    .for_each(|f| walk(&f.ty, &mut used));
            }
            Member::Error { params, .. } => params.iter().for_each(|f| walk(&f.ty, &mut used)),
        }
    }
    match used.into_iter().find(|u| !declared.contains(u)) {
        Some(u) => Err(idl_error(0, format!("type {u:?} is used but not declared"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors;

    #[test]
    fn the_shipped_interfaces_parse_and_declare_every_error_the_code_sends() {
        let ifaces: Vec<Interface> = [SERVICE_IDL, MANAGER_IDL, ADMIN_IDL]
            .into_iter()
            .map(|t| parse(t).expect("shipped IDL parses"))
            .collect();
        assert_eq!(
            ifaces.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
            ["org.varlink.service", "io.redn.Manager", "io.redn.Admin"]
        );
        let mut in_idl: Vec<(String, Vec<String>)> =
            ifaces.iter().flat_map(Interface::errors).collect();
        let mut in_code = errors::declared();
        for e in &mut in_code {
            e.1.sort();
        }
        in_idl.sort();
        in_code.sort();
        assert_eq!(
            in_idl, in_code,
            "errors in the IDL files and in errors.rs differ"
        );
        let manager = &ifaces[1];
        assert_eq!(
            manager.methods(),
            [
                "GetInfo",
                "ListOffloads",
                "RegisterRegion",
                "InstallOffload",
                "Uninstall",
                "Stats"
            ]
        );
        let (input, output) = manager.method("InstallOffload").unwrap();
        assert_eq!(
            input[1].ty,
            Type::Array(Box::new(Type::Named("Binding".into())))
        );
        assert_eq!(
            output[2].ty,
            Type::Optional(Box::new(Type::Builtin("string".into())))
        );
        assert_eq!(
            ifaces[2].methods(),
            [
                "ListClients",
                "ListOffloads",
                "Dump",
                "KillClient",
                "ReloadPolicy",
                "TestRun",
                "TriggerTimes",
                "ListRemoteClients",
                "DisconnectRemote",
                "ListBans",
                "BanRemote",
                "LiftBan",
                "ListDevices",
                "Monitor"
            ]
        );
    }

    #[test]
    fn broken_definitions_are_refused_with_their_line() {
        for (text, why) in [
            ("interface foo\n", "bad interface name"),
            ("interface a.b\nmethod lower() -> ()\n", "bad name"),
            ("interface a.b\ntype T (a: ??int)\n", "\"??\""),
            (
                "interface a.b\nerror E\nmethod M() -> ()\n",
                "expected \"(\"",
            ),
            ("interface a.b\ntype T (_a: int)\n", "bad field name"),
            ("interface a.b\ntype T (a: Missing)\n", "not declared"),
            (
                "interface a.b\ntype T (a: int)\ntype T (b: int)\n",
                "declared twice",
            ),
            (
                "interface a.b\nmethod M() -> (a: [int]string)\n",
                "map keys",
            ),
            (
                "interface a.b\n\nmethod M(a: int, a: int) -> ()\n",
                "line 3",
            ),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(why), "{text:?}: {err}");
        }
        let ok = parse(
            "interface a.b-c.d\n# doc\ntype E (x, y)\nmethod M(e: ?E, m: [string]()) -> ()\n",
        )
        .unwrap();
        assert_eq!(ok.members.len(), 2);
    }
}
