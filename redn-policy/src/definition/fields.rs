//! Parsers of single values of a definition: names, access rights, addresses,
//! scatter/gather entries, operands, patch sources and hex bytes. Each refuses a bad value
//! with an [`Invalid`] at the key it is given.

use super::raw::{parse_u64, RawOperand, RawSge};
use crate::names::{self, MAX_NAME_LEN};
use crate::source::{invalid, Invalid, KeyPath};
use redn_program::program::{Addr, Form, Operand, PatchSource, Sge, Slots, MAX_OPERAND};
use redn_program::wqe::MAX_DS;
use redn_program::Access;

/// Check a name: 1 to 64 letters, digits, `_`, `-` or `.`, starting with a letter or digit
/// (the rule of app and offload names in `policy.toml`).
pub(super) fn check_name(at: &KeyPath, text: &str) -> std::result::Result<(), Invalid> {
    names::check_name(text)
        .map_err(|rule| invalid(at.clone(), format!("invalid name {text:?}: {rule}")))
}

pub(super) fn parse_access(at: &KeyPath, text: &str) -> std::result::Result<Access, Invalid> {
    if text == "local-read" {
        return Ok(Access::NONE);
    }
    let mut access = Access::NONE;
    for part in text.split('|') {
        access = access
            | match part.trim() {
                "local-write" => Access::LOCAL_WRITE,
                "remote-write" => Access::REMOTE_WRITE,
                "remote-read" => Access::REMOTE_READ,
                "remote-atomic" => Access::REMOTE_ATOMIC,
                other => {
                    return Err(invalid(
                        at.clone(),
                        format!(
                            "unknown right {other:?}: expected \"local-read\" (no other right), or rights joined by \"|\" among local-write, remote-write, remote-read, remote-atomic"
                        ),
                    ))
                }
            };
    }
    Ok(access)
}

/// `NAME+OFFSET` (offset optional) with a number parser.
fn split_offset(text: &str, sep: char) -> (&str, Option<&str>) {
    match text.rsplit_once(sep) {
        Some((name, off)) => (name, Some(off)),
        None => (text, None),
    }
}

pub(super) fn parse_addr(at: &KeyPath, text: &str) -> std::result::Result<Addr, Invalid> {
    let bad = |why: String| invalid(at.clone(), why);
    let form_help = "expected \"region:NAME+OFFSET\", \"static:NAME+OFFSET\" or \"wqe:LABEL@BYTE\"";
    let (kind, rest) = text
        .split_once(':')
        .ok_or_else(|| bad(format!("unknown address form {text:?}: {form_help}")))?;
    let (sep, what) = match kind {
        "region" | "static" => ('+', "offset"),
        "wqe" => ('@', "byte"),
        _ => return Err(bad(format!("unknown address form {text:?}: {form_help}"))),
    };
    let (name, off) = split_offset(rest, sep);
    check_name(at, name).map_err(|_| {
        bad(format!(
            "invalid name {name:?} in address {text:?}: names are 1 to {MAX_NAME_LEN} letters, digits, '_', '-' or '.'"
        ))
    })?;
    let off = match off {
        None => 0,
        Some(o) => parse_u64(o).map_err(|_| {
            bad(format!(
                "invalid {what} {o:?} in address {text:?}: expected a whole number (decimal, or hex with 0x)"
            ))
        })?,
    };
    Ok(match kind {
        "region" => Addr::Region {
            region: name.into(),
            offset: off,
        },
        "static" => Addr::Static {
            name: name.into(),
            offset: off,
        },
        _ => Addr::Wqe {
            label: name.into(),
            byte: u32::try_from(off)
                .map_err(|_| bad(format!("byte {off} in address {text:?} is beyond any WQE")))?,
        },
    })
}

pub(super) fn parse_sge(at: &KeyPath, raw: &RawSge) -> std::result::Result<Sge, Invalid> {
    Ok(Sge {
        addr: parse_addr(&at.key("addr"), &raw.addr)?,
        len: raw.len,
    })
}

pub(super) fn parse_sgl(at: &KeyPath, raw: &[RawSge]) -> std::result::Result<Vec<Sge>, Invalid> {
    raw.iter()
        .enumerate()
        .map(|(i, s)| parse_sge(&at.index(i), s))
        .collect()
}

const CTRL_HELP: &str = "expected a number, or ctrl:LABEL:FORM:SLOTS[:ds=N] with FORM active or nop and SLOTS real or operand=0x... (48 bits)";

pub(super) fn parse_operand(
    at: &KeyPath,
    raw: &RawOperand,
) -> std::result::Result<Operand, Invalid> {
    let text = match raw {
        RawOperand::Num(v) => return Ok(Operand::Lit(*v)),
        RawOperand::Text(t) => t,
    };
    let bad = || {
        invalid(
            at.clone(),
            format!("unknown operand form {text:?}: {CTRL_HELP}"),
        )
    };
    let Some(rest) = text.strip_prefix("ctrl:") else {
        return parse_u64(text).map(Operand::Lit).map_err(|_| bad());
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let (label, form, slots, ds) = match parts.as_slice() {
        [l, f, s] => (*l, *f, *s, None),
        [l, f, s, d] => (*l, *f, *s, Some(*d)),
        _ => return Err(bad()),
    };
    check_name(at, label).map_err(|_| bad())?;
    let form = match form {
        "active" => Form::Active,
        "nop" => Form::Nop,
        _ => return Err(bad()),
    };
    let slots = match slots {
        "real" => Slots::Real,
        s => {
            let v = s
                .strip_prefix("operand=")
                .and_then(|v| parse_u64(v).ok())
                .ok_or_else(bad)?;
            if v > MAX_OPERAND {
                return Err(invalid(
                    at.clone(),
                    format!("operand {v:#x} in {text:?} is wider than 48 bits"),
                ));
            }
            Slots::Operand(v)
        }
    };
    let ds = match ds {
        None => None,
        Some(d) => {
            let v = d
                .strip_prefix("ds=")
                .and_then(|v| parse_u64(v).ok())
                .ok_or_else(bad)?;
            match u8::try_from(v) {
                Ok(v) if v <= MAX_DS => Some(v),
                _ => {
                    return Err(invalid(
                        at.clone(),
                        format!("ds {v} in {text:?} is above {MAX_DS}, the most a WQE holds"),
                    ))
                }
            }
        }
    };
    Ok(Operand::Ctrl {
        label: label.into(),
        form,
        slots,
        ds,
    })
}

pub(super) fn parse_source(at: &KeyPath, text: &str) -> std::result::Result<PatchSource, Invalid> {
    let bad = || {
        invalid(
            at.clone(),
            format!(
                "unknown patch source {text:?}: expected trigger:PARAM, read:LABEL, cas:LABEL, result:LABEL or write:LABEL"
            ),
        )
    };
    let (kind, name) = text.split_once(':').ok_or_else(bad)?;
    check_name(at, name).map_err(|_| bad())?;
    let name = name.to_owned();
    Ok(match kind {
        "trigger" => PatchSource::Trigger { param: name },
        "read" => PatchSource::Read { label: name },
        "cas" => PatchSource::Cas { label: name },
        "result" => PatchSource::AtomicResult { label: name },
        "write" => PatchSource::Write { label: name },
        _ => return Err(bad()),
    })
}

pub(super) fn parse_hex(at: &KeyPath, text: &str) -> std::result::Result<Vec<u8>, Invalid> {
    let digits: Vec<u8> = text
        .bytes()
        .filter(|b| !b.is_ascii_whitespace() && *b != b'_')
        .collect();
    let bad = |why: &str| invalid(at.clone(), format!("invalid hex bytes: {why}"));
    if digits.len() % 2 != 0 {
        return Err(bad("an odd number of hex digits (two per byte)"));
    }
    digits
        .chunks(2)
        .map(|pair| {
            let hi = (pair[0] as char).to_digit(16);
            let lo = (pair[1] as char).to_digit(16);
            // Two hex digits make at most 0xff, so the conversion cannot fail.
            match hi.zip(lo).and_then(|(h, l)| u8::try_from(h * 16 + l).ok()) {
                Some(byte) => Ok(byte),
                None => Err(bad(
                    "expected hex digits 0-9 a-f, optionally separated by spaces or _",
                )),
            }
        })
        .collect()
}
