//! Unit tests of the private parsers and writers (numbers, addresses, operands, patch
//! sources, access rights, hex bytes, quoted strings, names) and of the format example in the
//! module docs.

use super::fields::{check_name, parse_access, parse_addr, parse_hex, parse_operand, parse_source};
use super::raw::{parse_u64, RawOperand};
use super::write::{addr_text, operand_text, quote, source_text, uint};
use super::{parse_definition, write_definition};
use crate::source::{Invalid, KeyPath};
use redn_program::program::{Addr, Form, Operand, PatchSource, Slots, MAX_OPERAND};
use redn_program::Access;
use std::fmt;

fn at() -> KeyPath {
    KeyPath::root().key("x")
}

fn msg(r: std::result::Result<impl fmt::Debug, Invalid>) -> String {
    r.expect_err("accepted").message
}

#[test]
fn numbers() {
    assert_eq!(parse_u64("0"), Ok(0));
    assert_eq!(parse_u64("1_000"), Ok(1000));
    assert_eq!(parse_u64("0xFF_ff"), Ok(0xffff));
    assert_eq!(parse_u64("0xffffffffffffffff"), Ok(u64::MAX));
    assert_eq!(parse_u64("18446744073709551615"), Ok(u64::MAX));
    for bad in [
        "",
        "0x",
        "-1",
        "+1",
        "1e3",
        "0x1_0000_0000_0000_0000",
        "18446744073709551616",
        "0b1",
        " 1",
    ] {
        assert!(parse_u64(bad).is_err(), "{bad}");
    }
    assert_eq!(uint(5), "5");
    assert_eq!(uint(i64::MAX as u64), i64::MAX.to_string());
    assert_eq!(uint(1 << 63), "\"0x8000000000000000\"");
}

#[test]
fn addresses() {
    assert_eq!(
        parse_addr(&at(), "region:table+16"),
        Ok(Addr::region("table", 16))
    );
    assert_eq!(
        parse_addr(&at(), "region:table"),
        Ok(Addr::region("table", 0))
    );
    assert_eq!(
        parse_addr(&at(), "static:c.recv+0x8"),
        Ok(Addr::static_("c.recv", 8))
    );
    assert_eq!(
        parse_addr(&at(), "wqe:0.b0.if@41"),
        Ok(Addr::wqe("0.b0.if", 41))
    );
    for (a, text) in [
        (Addr::region("t", u64::MAX), "region:t+18446744073709551615"),
        (Addr::static_("s", 3), "static:s+3"),
        (Addr::wqe("w", 7), "wqe:w@7"),
    ] {
        assert_eq!(addr_text(&a), text);
        assert_eq!(parse_addr(&at(), text), Ok(a));
    }
    assert!(msg(parse_addr(&at(), "table+16")).starts_with("unknown address form \"table+16\""));
    assert!(msg(parse_addr(&at(), "wqe:w@4294967296")).contains("beyond any WQE"));
    assert!(msg(parse_addr(&at(), "wqe:w+1")).contains("invalid name \"w+1\""));
    assert!(msg(parse_addr(&at(), "region:t+")).contains("invalid offset \"\""));
    assert!(msg(parse_addr(&at(), "region:+1")).contains("invalid name \"\""));
}

#[test]
fn operands() {
    let op = |t: &str| parse_operand(&at(), &RawOperand::Text(t.into()));
    assert_eq!(op("0x10"), Ok(Operand::Lit(16)));
    assert_eq!(
        op("ctrl:r:active:real"),
        Ok(Operand::ctrl("r", Form::Active, Slots::Real))
    );
    assert_eq!(
        op("ctrl:r:nop:operand=0x0"),
        Ok(Operand::ctrl("r", Form::Nop, Slots::Operand(0)))
    );
    assert_eq!(
        op("ctrl:r:active:real:ds=2"),
        Ok(Operand::Ctrl {
            label: "r".into(),
            form: Form::Active,
            slots: Slots::Real,
            ds: Some(2)
        })
    );
    for o in [
        Operand::Lit(u64::MAX),
        Operand::ctrl("a.b", Form::Nop, Slots::Operand(MAX_OPERAND)),
        Operand::Ctrl {
            label: "x".into(),
            form: Form::Nop,
            slots: Slots::Real,
            ds: Some(63),
        },
    ] {
        let text = operand_text(&o);
        assert_eq!(op(text.trim_matches('"')), Ok(o));
    }
    for bad in [
        "ctrl:x",
        "ctrl:r:active",
        "ctrl:r:active:real:ds=2:x",
        "ctrl:r:on:real",
        "ctrl:r:nop:operand=",
        "ctrl:r:nop:ds=2",
        "ctrl::nop:real",
        "ctrl:r:nop:real:ds=x",
        "real",
    ] {
        assert!(
            msg(op(bad)).starts_with(&format!("unknown operand form {bad:?}")),
            "{bad}"
        );
    }
    assert!(msg(op("ctrl:r:nop:operand=0x1000000000000")).contains("wider than 48 bits"));
    assert!(msg(op("ctrl:r:nop:real:ds=64")).contains("above 63"));
    assert!(msg(op("ctrl:r:nop:real:ds=256")).contains("above 63"));
}

#[test]
fn sources_access_and_hex() {
    for (s, text) in [
        (
            PatchSource::Trigger {
                param: "key0".into(),
            },
            "trigger:key0",
        ),
        (
            PatchSource::Read {
                label: "0.b0.read".into(),
            },
            "read:0.b0.read",
        ),
        (PatchSource::Cas { label: "if".into() }, "cas:if"),
        (
            PatchSource::AtomicResult {
                label: "adv".into(),
            },
            "result:adv",
        ),
        (
            PatchSource::Write {
                label: "copy".into(),
            },
            "write:copy",
        ),
    ] {
        assert_eq!(source_text(&s), text);
        assert_eq!(parse_source(&at(), text), Ok(s));
    }
    assert!(msg(parse_source(&at(), "atomic:x")).starts_with("unknown patch source"));
    assert!(msg(parse_source(&at(), "read")).starts_with("unknown patch source"));
    for bits in 0..16u8 {
        let a = Access::from_bits_truncate(bits);
        assert_eq!(parse_access(&at(), &a.to_string()), Ok(a), "{a}");
    }
    assert_eq!(
        parse_access(&at(), "remote-read | local-write"),
        Ok(Access::REMOTE_READ | Access::LOCAL_WRITE)
    );
    assert!(msg(parse_access(&at(), "")).contains("unknown right \"\""));
    assert!(
        msg(parse_access(&at(), "local-read|remote-read")).contains("unknown right \"local-read\"")
    );
    assert_eq!(
        parse_hex(&at(), "00ff 10_ab"),
        Ok(vec![0, 0xff, 0x10, 0xab])
    );
    assert_eq!(parse_hex(&at(), ""), Ok(vec![]));
    assert!(parse_hex(&at(), "abc").is_err());
    assert!(parse_hex(&at(), "zz").is_err());
    assert!(parse_hex(&at(), "é1").is_err());
}

#[test]
fn quoted_strings_parse_back() {
    for text in [
        "",
        "plain",
        "q\"uo\\te",
        "line\nbreak\r\ttab",
        "\u{0}\u{1f}\u{7f}",
        "ünï ☃ \u{2028}",
        "# not a comment",
    ] {
        let doc = format!("s = {}\n", quote(text));
        let table: toml::Table = toml::from_str(&doc).unwrap_or_else(|e| panic!("{doc:?}: {e}"));
        assert_eq!(table["s"].as_str(), Some(text), "{doc}");
    }
}

/// The format example of the module docs is a valid program.
#[test]
fn the_documented_example_loads() {
    let source = include_str!("mod.rs");
    let start = source.find("//! ```toml\n").expect("example") + "//! ```toml\n".len();
    let len = source[start..].find("//! ```\n").expect("end of example");
    let text: String = source[start..start + len]
        .lines()
        .map(|l| {
            format!(
                "{}\n",
                l.strip_prefix("//!").unwrap_or(l).trim_start_matches(' ')
            )
        })
        .collect();
    let p = parse_definition(&text, "tiny.toml").unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(p.name, "tiny");
    assert_eq!(p.wqe_count(), 4);
    assert_eq!(p.patches.len(), 3);
    assert_eq!(p.statics[0].bytes, [2, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        parse_definition(&write_definition(&p), "again.toml").ok(),
        Some(p)
    );
}

#[test]
fn names() {
    for good in [
        "a",
        "0.b0.if",
        "hash-get",
        "c.recv",
        "key0_break",
        &"x".repeat(64),
    ] {
        assert!(check_name(&at(), good).is_ok(), "{good}");
    }
    for bad in [
        "",
        ".a",
        "-a",
        "_a",
        "a b",
        "a:b",
        "a+b",
        "a@b",
        "é",
        &"x".repeat(65),
    ] {
        assert!(check_name(&at(), bad).is_err(), "{bad}");
    }
}
