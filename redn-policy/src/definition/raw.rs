//! The file as written: the serde types a definition deserializes into, before anything is
//! checked — [`RawDefinition`] and the tables it holds, [`U64`] for numbers a TOML integer
//! may not hold and [`RawOperand`] for operands. `super::build` checks them and converts them
//! into a [`Program`](redn_program::program::Program).

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use std::fmt;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDefinition {
    pub(super) name: String,
    pub(super) summary: String,
    #[serde(default)]
    pub(super) response: String,
    pub(super) iterations: RawIterations,
    pub(super) trigger_len: Option<u32>,
    #[serde(default)]
    pub(super) entry: Vec<RawEnable>,
    #[serde(default)]
    pub(super) recv_entry: Vec<RawEnable>,
    #[serde(default)]
    pub(super) region: Vec<RawRegion>,
    #[serde(default)]
    pub(super) param: Vec<RawParam>,
    #[serde(default, rename = "static")]
    pub(super) statics: Vec<RawStatic>,
    #[serde(default)]
    pub(super) queue: Vec<RawQueue>,
    #[serde(default)]
    pub(super) patch: Vec<RawPatch>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIterations {
    pub(super) kind: IterKind,
    pub(super) invocations: Option<u32>,
    pub(super) wqes_per_invocation: Option<u32>,
    pub(super) wqes_per_round: Option<u32>,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum IterKind {
    Bounded,
    Recycled,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEnable {
    pub(super) queue: String,
    pub(super) count: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRegion {
    pub(super) name: String,
    pub(super) role: RegionKind,
    pub(super) access: Option<String>,
    pub(super) min_len: U64,
    #[serde(default)]
    pub(super) doc: String,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RegionKind {
    Data,
    Response,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawParam {
    pub(super) name: String,
    pub(super) offset: Option<u32>,
    pub(super) len: u32,
    #[serde(default)]
    pub(super) doc: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStatic {
    pub(super) name: String,
    pub(super) len: Option<U64>,
    pub(super) bytes: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQueue {
    pub(super) name: String,
    pub(super) role: RoleKind,
    #[serde(default)]
    pub(super) managed_send: bool,
    #[serde(default)]
    pub(super) managed_recv: bool,
    pub(super) pu: Option<u32>,
    pub(super) sq_bbs: u32,
    pub(super) rq_slots: u32,
    pub(super) rq_sges: u32,
    #[serde(default)]
    pub(super) wqe: Vec<RawWqe>,
    #[serde(default)]
    pub(super) recv: Vec<RawRecv>,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RoleKind {
    Worker,
    Client,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWqe {
    pub(super) label: String,
    pub(super) op: Option<OpName>,
    pub(super) opcode: Option<u8>,
    pub(super) form: Option<FormKind>,
    pub(super) signaled: Option<bool>,
    pub(super) fence: Option<bool>,
    pub(super) solicited: Option<bool>,
    pub(super) flags: Option<u8>,
    pub(super) remote: Option<String>,
    pub(super) sgl: Option<Vec<RawSge>>,
    pub(super) imm: Option<u32>,
    pub(super) compare: Option<RawOperand>,
    pub(super) compare_mask: Option<U64>,
    pub(super) swap: Option<RawOperand>,
    pub(super) swap_mask: Option<U64>,
    pub(super) add: Option<U64>,
    pub(super) result: Option<RawSge>,
    pub(super) queue: Option<String>,
    pub(super) count: Option<u32>,
}

#[derive(Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum OpName {
    Nop,
    Write,
    Read,
    Cas,
    MaskedCas,
    Faa,
    Wait,
    SendEn,
    RecvEn,
}

impl OpName {
    pub(super) fn name(self) -> &'static str {
        match self {
            OpName::Nop => "nop",
            OpName::Write => "write",
            OpName::Read => "read",
            OpName::Cas => "cas",
            OpName::MaskedCas => "masked-cas",
            OpName::Faa => "faa",
            OpName::Wait => "wait",
            OpName::SendEn => "send-en",
            OpName::RecvEn => "recv-en",
        }
    }

    /// The operand keys the operation takes.
    pub(super) fn keys(self) -> &'static [&'static str] {
        match self {
            OpName::Nop => &[],
            OpName::Write => &["remote", "sgl", "imm"],
            OpName::Read => &["remote", "sgl"],
            OpName::Cas => &["remote", "compare", "swap", "result"],
            OpName::MaskedCas => &["remote", "compare", "compare_mask", "swap", "swap_mask"],
            OpName::Faa => &["remote", "add", "result"],
            OpName::Wait | OpName::SendEn | OpName::RecvEn => &["queue", "count"],
        }
    }
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum FormKind {
    Active,
    Nop,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSge {
    pub(super) addr: String,
    pub(super) len: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRecv {
    #[serde(default)]
    pub(super) sgl: Vec<RawSge>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPatch {
    pub(super) label: String,
    pub(super) bytes: Option<Vec<u32>>,
    pub(super) byte: Option<u32>,
    pub(super) len: Option<u32>,
    pub(super) source: String,
}

/// A 64-bit value: a TOML integer from 0, or a string (`"0xff00000000000000"`, decimal or
/// hex with `0x`) for values a TOML integer cannot hold.
#[derive(Clone, Copy)]
pub(super) struct U64(pub(super) u64);

/// An operand as written: a number, or text to parse (`ctrl:...` or a number in a string).
pub(super) enum RawOperand {
    Num(u64),
    Text(String),
}

const U64_EXPECTING: &str =
    "a whole number from 0, or a string such as \"0xff00000000000000\" for values above 2^63";

pub(super) fn parse_u64(text: &str) -> std::result::Result<u64, String> {
    let digits: String = text.chars().filter(|&c| c != '_').collect();
    let parsed = match digits.strip_prefix("0x") {
        Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            u64::from_str_radix(hex, 16).ok()
        }
        Some(_) => None,
        None if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
            digits.parse().ok()
        }
        None => None,
    };
    parsed.ok_or_else(|| format!("invalid number {text:?}: expected {U64_EXPECTING}"))
}

/// A visitor for values written as a TOML integer from 0 or as a string: `from_u64` and
/// `from_str` make the value; a negative integer is refused with the message `negative`
/// gives.
struct IntOrStr<T> {
    expecting: &'static str,
    negative: fn(i64) -> String,
    from_u64: fn(u64) -> T,
    from_str: fn(&str) -> std::result::Result<T, String>,
}

impl<T> Visitor<'_> for IntOrStr<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expecting)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<T, E> {
        u64::try_from(v)
            .map(self.from_u64)
            .map_err(|_| E::custom((self.negative)(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<T, E> {
        Ok((self.from_u64)(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<T, E> {
        (self.from_str)(v).map_err(E::custom)
    }
}

impl<'de> Deserialize<'de> for U64 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        deserializer.deserialize_any(IntOrStr {
            expecting: U64_EXPECTING,
            negative: |v| format!("{v} is negative; expected {U64_EXPECTING}"),
            from_u64: U64,
            from_str: |v| parse_u64(v).map(U64),
        })
    }
}

impl<'de> Deserialize<'de> for RawOperand {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        deserializer.deserialize_any(IntOrStr {
            expecting: "a number, or a control image such as \"ctrl:LABEL:active:real\"",
            negative: |v| format!("{v} is negative; write a large operand as \"0x...\""),
            from_u64: RawOperand::Num,
            from_str: |v| Ok(RawOperand::Text(v.to_owned())),
        })
    }
}
