//! Values with units: sizes, durations and rates, written the way systemd writes them.
//!
//! | type | TOML forms | unit of a plain number |
//! |---|---|---|
//! | [`ByteSize`] | `4096`, `"4096"`, `"64K"`, `"64KiB"`, `"1G"` | bytes |
//! | [`TimeSpan`] | `30`, `"30s"`, `"5min"`, `"1h 30min"`, `"1d"`, `"infinity"` | seconds |
//! | [`KbitRate`] | `1000000`, `"infinity"` | kbit/s |
//! | [`WqeRate`] | `2000000`, `"2M"`, `"500k"`, `"infinity"` | WQEs per second |
//!
//! **Sizes** are base 1024, like systemd (`LimitMEMLOCK=64M`): `K` = 1024, `M` = 1024², `G`,
//! `T`, `P`, `E`; the IEC spellings `KiB`, `MiB`, `GiB`, `TiB`, `PiB`, `EiB` mean the same, and
//! `B` means bytes. Suffixes are case-sensitive. The decimal-looking `KB`, `MB`, `kB`... are
//! refused as ambiguous rather than guessed. Only whole numbers: write `1536M`, not `1.5G`.
//!
//! **Durations** are one or more `NUMBER UNIT` parts, added up (`"1h 30min"`). Units:
//! `ns`/`nsec`, `us`/`usec`/`µs`, `ms`/`msec`, `s`/`sec`/`second`/`seconds`,
//! `m`/`min`/`minute`/`minutes`, `h`/`hr`/`hour`/`hours`, `d`/`day`/`days`,
//! `w`/`week`/`weeks` (systemd.time(7) without months and years). A lone number is seconds.
//! `"infinity"` means no end.
//!
//! **Rates** are never zero: a limit of 0 would stop the client outright, so "no limit" is
//! spelled `"infinity"`. `rate_limit_kbps` ([`KbitRate`]) is a plain number of kbit/s, the unit
//! and 32-bit range of verbs' `ibv_qp_rate_limit_attr.rate_limit`; it takes no suffix, because
//! `"1M"` kbit/s would be easy to misread. `wqes_per_second` ([`WqeRate`]) is a count, so its
//! suffixes are decimal: `k`/`K` = 1000, `M` = 10⁶, `G` = 10⁹ — unlike sizes.
//!
//! Every type parses from a string with [`FromStr`], prints back in a form that parses to the
//! same value with [`Display`](fmt::Display), and deserializes from a TOML integer or string.
//! Errors name the refused text.

use crate::error::{Error, Result};
use serde::de::{self, Deserialize, Deserializer, Visitor};
use std::fmt;
use std::num::{NonZeroU32, NonZeroU64};
use std::str::FromStr;
use std::time::Duration;

/// Split `s` into its leading ASCII digits and the rest.
fn split_number(s: &str) -> (&str, &str) {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s.split_at(end)
}

// ---------------------------------------------------------------------------------------------
// Sizes

/// A size in bytes; see the [module docs](self) for the suffixes (base 1024).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(u64);

const SIZE_SUFFIXES: [(&str, &str, u32); 6] = [
    ("K", "KiB", 10),
    ("M", "MiB", 20),
    ("G", "GiB", 30),
    ("T", "TiB", 40),
    ("P", "PiB", 50),
    ("E", "EiB", 60),
];

impl ByteSize {
    /// A size of `bytes` bytes.
    pub const fn new(bytes: u64) -> Self {
        ByteSize(bytes)
    }

    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let bad = |reason: &str| Error::value("size", text, reason);
        let s = text.trim();
        let (digits, suffix) = split_number(s);
        if digits.is_empty() {
            return Err(bad("expected a whole number of bytes, optionally followed by K, M, G, T, P or E (base 1024)"));
        }
        let suffix = suffix.trim_start();
        let shift = match suffix {
            "" | "B" => 0,
            _ => match SIZE_SUFFIXES
                .iter()
                .find(|(short, iec, _)| suffix == *short || suffix == *iec)
            {
                Some(&(_, _, shift)) => shift,
                None if suffix.starts_with('.') => {
                    return Err(bad("only whole numbers are accepted; use a smaller unit, e.g. 1536M for 1.5G"))
                }
                None if matches!(
                    suffix,
                    "KB" | "kB" | "kb" | "MB" | "mb" | "GB" | "gb" | "TB" | "tb" | "PB" | "EB"
                ) =>
                {
                    return Err(bad(
                        "ambiguous unit: write K, M, G, T (or KiB, MiB, GiB, TiB), which are base 1024",
                    ))
                }
                None => {
                    return Err(bad(
                        "unknown unit: use K, M, G, T, P, E or KiB, MiB, GiB, TiB, PiB, EiB (base 1024), or B",
                    ))
                }
            },
        };
        let number: u64 = digits
            .parse()
            .map_err(|_| bad("the number does not fit in 64 bits"))?;
        number
            .checked_mul(1u64 << shift)
            .map(ByteSize)
            .ok_or_else(|| bad("the size does not fit in 64 bits"))
    }
}

impl fmt::Display for ByteSize {
    /// The largest suffix that represents the size exactly (`1G`, `1536M`, `1000`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for &(short, _, shift) in SIZE_SUFFIXES.iter().rev() {
            let unit = 1u64 << shift;
            if self.0 != 0 && self.0 % unit == 0 {
                return write!(f, "{}{short}", self.0 / unit);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UnitVisitor {
            expecting: "a size such as \"64M\" or a number of bytes",
            what: "size",
            from_int: |n| Ok(ByteSize(n)),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Durations

/// A duration, or no end at all; see the [module docs](self) for the units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TimeSpan {
    /// This long.
    Finite(Duration),
    /// Forever (`"infinity"`). Orders after every finite span.
    Infinite,
}

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Units of a duration and their length in nanoseconds.
const TIME_UNITS: [(&[&str], u128); 8] = [
    (&["ns", "nsec"], 1),
    (&["us", "usec", "µs"], 1_000),
    (&["ms", "msec"], 1_000_000),
    (&["s", "sec", "second", "seconds"], NANOS_PER_SEC),
    (&["m", "min", "minute", "minutes"], 60 * NANOS_PER_SEC),
    (&["h", "hr", "hour", "hours"], 3_600 * NANOS_PER_SEC),
    (&["d", "day", "days"], 86_400 * NANOS_PER_SEC),
    (&["w", "week", "weeks"], 7 * 86_400 * NANOS_PER_SEC),
];

impl TimeSpan {
    /// The finite duration, or `None` for [`TimeSpan::Infinite`].
    pub fn as_duration(self) -> Option<Duration> {
        match self {
            TimeSpan::Finite(d) => Some(d),
            TimeSpan::Infinite => None,
        }
    }

    /// Whether this is a zero-length span.
    pub fn is_zero(self) -> bool {
        self == TimeSpan::Finite(Duration::ZERO)
    }

    fn from_nanos(nanos: u128) -> Option<Self> {
        let secs = u64::try_from(nanos / NANOS_PER_SEC).ok()?;
        let subsec = u32::try_from(nanos % NANOS_PER_SEC).ok()?;
        Some(TimeSpan::Finite(Duration::new(secs, subsec)))
    }
}

impl FromStr for TimeSpan {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let bad = |reason: &str| Error::value("duration", text, reason);
        let s = text.trim();
        if s == "infinity" {
            return Ok(TimeSpan::Infinite);
        }
        if s.is_empty() {
            return Err(bad(
                "empty; write e.g. \"30s\", \"5min\", \"2h\", \"1d\" or \"infinity\"",
            ));
        }
        let mut rest = s;
        let mut total: u128 = 0;
        let mut parts = 0;
        while !rest.is_empty() {
            let (digits, after) = split_number(rest);
            if digits.is_empty() {
                return Err(bad(
                    "expected a number followed by a unit such as s, min, h or d",
                ));
            }
            let after = after.trim_start();
            let unit_len = after
                .find(|c: char| !c.is_alphabetic())
                .unwrap_or(after.len());
            let (unit, tail) = after.split_at(unit_len);
            let nanos_per_unit = if unit.is_empty() {
                // A lone number is seconds; in a sum every part needs a unit.
                if parts > 0 || !tail.trim().is_empty() {
                    return Err(bad("each part needs a unit, as in \"1h 30min\""));
                }
                NANOS_PER_SEC
            } else {
                TIME_UNITS
                    .iter()
                    .find(|(names, _)| names.contains(&unit))
                    .map(|&(_, n)| n)
                    .ok_or_else(|| {
                        bad("unknown unit: use ns, us, ms, s, min, h, d or w (or \"infinity\")")
                    })?
            };
            let number: u128 = digits.parse().map_err(|_| bad("the number is too large"))?;
            total = number
                .checked_mul(nanos_per_unit)
                .and_then(|n| total.checked_add(n))
                .ok_or_else(|| bad("the duration is too long"))?;
            parts += 1;
            rest = tail.trim_start();
        }
        TimeSpan::from_nanos(total).ok_or_else(|| bad("the duration is too long"))
    }
}

impl fmt::Display for TimeSpan {
    /// systemd style: `1d 2h 30min`, `500ms`, `0s`, `infinity`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = match self {
            TimeSpan::Infinite => return f.write_str("infinity"),
            TimeSpan::Finite(d) => *d,
        };
        let mut nanos = d.as_nanos();
        if nanos == 0 {
            return f.write_str("0s");
        }
        // Largest first; weeks are left out so that `7d` prints as written most often.
        let units: [(&str, u128); 7] = [
            ("d", 86_400 * NANOS_PER_SEC),
            ("h", 3_600 * NANOS_PER_SEC),
            ("min", 60 * NANOS_PER_SEC),
            ("s", NANOS_PER_SEC),
            ("ms", 1_000_000),
            ("us", 1_000),
            ("ns", 1),
        ];
        let mut first = true;
        for (name, len) in units {
            let count = nanos / len;
            if count > 0 {
                if !first {
                    f.write_str(" ")?;
                }
                write!(f, "{count}{name}")?;
                first = false;
                nanos %= len;
            }
        }
        Ok(())
    }
}

impl<'de> Deserialize<'de> for TimeSpan {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UnitVisitor {
            expecting: "a duration such as \"30s\", \"5min\", \"2h\", \"1d\" or \"infinity\", or a number of seconds",
            what: "duration",
            from_int: |n| Ok(TimeSpan::Finite(Duration::from_secs(n))),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Rates

const NO_ZERO_RATE: &str = "a rate of 0 would stop the client; write \"infinity\" for no limit";

/// A bandwidth limit in kbit/s (`rate_limit_kbps`), or none. Never zero.
///
/// The unit and range are those of verbs' `ibv_qp_rate_limit_attr.rate_limit` (a `u32` of
/// kbit/s); the manager clamps it to the device's `packet_pacing_caps`, and the softnic
/// enforces it with a token bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KbitRate {
    /// At most this many kbit/s.
    Limited(NonZeroU32),
    /// No bandwidth limit (`"infinity"`). Orders after every finite rate.
    Unlimited,
}

impl KbitRate {
    fn from_number(n: u64) -> Result<Self> {
        let bad = |reason: &str| Error::value("rate in kbit/s", n.to_string(), reason);
        let n = u32::try_from(n).map_err(|_| {
            bad("above the verbs limit of 4294967295 kbit/s; write \"infinity\" for no limit")
        })?;
        NonZeroU32::new(n)
            .map(KbitRate::Limited)
            .ok_or_else(|| bad(NO_ZERO_RATE))
    }
}

impl FromStr for KbitRate {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let s = text.trim();
        if s == "infinity" {
            return Ok(KbitRate::Unlimited);
        }
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            let n = s.parse::<u64>().map_err(|_| {
                Error::value(
                    "rate in kbit/s",
                    text,
                    "above the verbs limit of 4294967295 kbit/s",
                )
            })?;
            return KbitRate::from_number(n);
        }
        Err(Error::value(
            "rate in kbit/s",
            text,
            "expected a plain number of kbit/s (no suffix) or \"infinity\"",
        ))
    }
}

impl fmt::Display for KbitRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KbitRate::Limited(n) => write!(f, "{n}"),
            KbitRate::Unlimited => f.write_str("infinity"),
        }
    }
}

impl<'de> Deserialize<'de> for KbitRate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UnitVisitor {
            expecting: "a number of kbit/s or \"infinity\"",
            what: "rate in kbit/s",
            from_int: KbitRate::from_number,
        })
    }
}

/// A work-request rate in WQEs per second (`wqes_per_second`), or none. Never zero.
///
/// Suffixes are decimal: `k`/`K` = 1000, `M` = 1 000 000, `G` = 10⁹.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WqeRate {
    /// At most this many WQEs per second.
    Limited(NonZeroU64),
    /// No WQE rate limit (`"infinity"`). Orders after every finite rate.
    Unlimited,
}

const RATE_SUFFIXES: [(&str, u64); 4] = [
    ("k", 1_000),
    ("K", 1_000),
    ("M", 1_000_000),
    ("G", 1_000_000_000),
];

impl WqeRate {
    fn from_number(n: u64) -> Result<Self> {
        NonZeroU64::new(n)
            .map(WqeRate::Limited)
            .ok_or_else(|| Error::value("WQE rate", n.to_string(), NO_ZERO_RATE))
    }
}

impl FromStr for WqeRate {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let bad = |reason: &str| Error::value("WQE rate", text, reason);
        let s = text.trim();
        if s == "infinity" {
            return Ok(WqeRate::Unlimited);
        }
        let (digits, suffix) = split_number(s);
        if digits.is_empty() {
            return Err(bad("expected a number of WQEs per second, optionally with k, M or G (base 1000), or \"infinity\""));
        }
        let multiplier = match suffix.trim_start() {
            "" => 1,
            suffix => RATE_SUFFIXES
                .iter()
                .find(|(name, _)| *name == suffix)
                .map(|&(_, m)| m)
                .ok_or_else(|| bad("unknown suffix: use k, M or G (base 1000)"))?,
        };
        let n = digits
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(multiplier))
            .ok_or_else(|| bad("the rate does not fit in 64 bits"))?;
        if n == 0 {
            return Err(bad(NO_ZERO_RATE));
        }
        WqeRate::from_number(n)
    }
}

impl fmt::Display for WqeRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WqeRate::Limited(n) => write!(f, "{n}"),
            WqeRate::Unlimited => f.write_str("infinity"),
        }
    }
}

impl<'de> Deserialize<'de> for WqeRate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UnitVisitor {
            expecting: "a number of WQEs per second (\"2M\", \"500k\") or \"infinity\"",
            what: "WQE rate",
            from_int: WqeRate::from_number,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Shared deserialization

/// Accepts a non-negative TOML integer (through `from_int`) or a string (through `FromStr`).
struct UnitVisitor<T> {
    expecting: &'static str,
    what: &'static str,
    from_int: fn(u64) -> Result<T>,
}

impl<'de, T: FromStr<Err = Error>> Visitor<'de> for UnitVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expecting)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        (self.from_int)(v).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => Err(E::custom(Error::value(
                self.what,
                v.to_string(),
                "must not be negative",
            ))),
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        v.parse().map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(s: &str) -> u64 {
        s.parse::<ByteSize>().unwrap().bytes()
    }

    fn size_err(s: &str) -> String {
        s.parse::<ByteSize>().unwrap_err().to_string()
    }

    #[test]
    fn sizes_are_base_1024() {
        assert_eq!(size("0"), 0);
        assert_eq!(size("4096"), 4096);
        assert_eq!(size("512B"), 512);
        assert_eq!(size("64K"), 64 << 10);
        assert_eq!(size("64KiB"), 64 << 10);
        assert_eq!(size("64M"), 64 << 20);
        assert_eq!(size(" 64 M "), 64 << 20);
        assert_eq!(size("1G"), 1 << 30);
        assert_eq!(size("1GiB"), 1 << 30);
        assert_eq!(size("2T"), 2 << 40);
        assert_eq!(size("1P"), 1 << 50);
        assert_eq!(size("15E"), 15 << 60);
    }

    #[test]
    fn bad_sizes_name_the_value() {
        for (text, why) in [
            ("64Q", "unknown unit"),
            ("64MB", "ambiguous"),
            ("64kB", "ambiguous"),
            ("64k", "unknown unit"),
            ("1.5G", "whole numbers"),
            ("", "expected a whole number"),
            ("M", "expected a whole number"),
            ("-1", "expected a whole number"),
            ("16E", "does not fit"),
            ("99999999999999999999", "does not fit"),
        ] {
            let e = size_err(text);
            assert!(e.contains(&format!("invalid size {text:?}")), "{e}");
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn sizes_print_back_exactly() {
        for n in [
            0,
            1,
            1000,
            1024,
            1536 << 20,
            1 << 30,
            3 << 40,
            u64::MAX,
            5 << 60,
        ] {
            let s = ByteSize::new(n);
            assert_eq!(s.to_string().parse::<ByteSize>().unwrap(), s, "{s}");
        }
        assert_eq!(ByteSize::new(1 << 30).to_string(), "1G");
        assert_eq!(ByteSize::new(1536 << 20).to_string(), "1536M");
        assert_eq!(ByteSize::new(1000).to_string(), "1000");
    }

    fn span(s: &str) -> TimeSpan {
        s.parse().unwrap()
    }

    #[test]
    fn durations() {
        assert_eq!(span("30s"), TimeSpan::Finite(Duration::from_secs(30)));
        assert_eq!(span("30"), TimeSpan::Finite(Duration::from_secs(30)));
        assert_eq!(span("5min"), TimeSpan::Finite(Duration::from_secs(300)));
        assert_eq!(span("5m"), TimeSpan::Finite(Duration::from_secs(300)));
        assert_eq!(span("2h"), TimeSpan::Finite(Duration::from_secs(7200)));
        assert_eq!(span("1d"), TimeSpan::Finite(Duration::from_secs(86_400)));
        assert_eq!(
            span("1w"),
            TimeSpan::Finite(Duration::from_secs(7 * 86_400))
        );
        assert_eq!(
            span("1h 30min"),
            TimeSpan::Finite(Duration::from_secs(5400))
        );
        assert_eq!(span("1h30min"), TimeSpan::Finite(Duration::from_secs(5400)));
        assert_eq!(span("250ms"), TimeSpan::Finite(Duration::from_millis(250)));
        assert_eq!(span("10 µs"), TimeSpan::Finite(Duration::from_micros(10)));
        assert_eq!(span("infinity"), TimeSpan::Infinite);
        assert!(span("0s").is_zero());
        assert!(TimeSpan::Finite(Duration::MAX) < TimeSpan::Infinite);
    }

    #[test]
    fn bad_durations_name_the_value() {
        for (text, why) in [
            ("5 fortnights", "unknown unit"),
            ("1h 30", "each part needs a unit"),
            ("30 5s", "each part needs a unit"),
            ("", "empty"),
            ("forever", "expected a number"),
            ("-5s", "expected a number"),
            ("99999999999999999999999w", "too long"),
        ] {
            let e = text.parse::<TimeSpan>().unwrap_err().to_string();
            assert!(e.contains(&format!("invalid duration {text:?}")), "{e}");
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn durations_print_back_exactly() {
        for s in [
            "0s",
            "1s",
            "90s",
            "1d 2h 3min 4s",
            "1ms",
            "1us 1ns",
            "infinity",
            "3w",
        ] {
            let t = span(s);
            assert_eq!(span(&t.to_string()), t, "{s} -> {t}");
        }
        assert_eq!(span("90s").to_string(), "1min 30s");
        assert_eq!(
            TimeSpan::Finite(Duration::MAX)
                .to_string()
                .parse::<TimeSpan>()
                .unwrap(),
            TimeSpan::Finite(Duration::MAX)
        );
    }

    #[test]
    fn kbit_rates() {
        assert_eq!(
            "1000000".parse::<KbitRate>().unwrap(),
            KbitRate::Limited(NonZeroU32::new(1_000_000).unwrap())
        );
        assert_eq!("infinity".parse::<KbitRate>().unwrap(), KbitRate::Unlimited);
        for (text, why) in [
            ("0", "would stop the client"),
            ("1M", "no suffix"),
            ("4294967296", "verbs limit"),
            ("99999999999999999999999", "verbs limit"),
        ] {
            let e = text.parse::<KbitRate>().unwrap_err().to_string();
            assert!(e.contains(&format!("{text:?}")), "{e}");
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn wqe_rates_are_decimal() {
        let r = |s: &str| s.parse::<WqeRate>().unwrap();
        assert_eq!(
            r("2000000"),
            WqeRate::Limited(NonZeroU64::new(2_000_000).unwrap())
        );
        assert_eq!(r("2M"), r("2000000"));
        assert_eq!(r("500k"), r("500000"));
        assert_eq!(r("500K"), r("500000"));
        assert_eq!(r("1G"), r("1000000000"));
        assert_eq!(r("infinity"), WqeRate::Unlimited);
        for (text, why) in [
            ("0", "would stop"),
            ("0k", "would stop"),
            ("2Mi", "unknown suffix"),
            ("fast", "expected a number"),
            ("99999999999G", "does not fit"),
        ] {
            let e = text.parse::<WqeRate>().unwrap_err().to_string();
            assert!(e.contains(&format!("invalid WQE rate {text:?}")), "{e}");
            assert!(e.contains(why), "{text}: {e}");
        }
        assert_eq!(r(&r("2M").to_string()), r("2M"));
    }

    #[derive(Debug, serde::Deserialize)]
    struct Units {
        size: ByteSize,
        span: TimeSpan,
        kbps: KbitRate,
        wqes: WqeRate,
    }

    #[test]
    fn deserialize_from_integers_and_strings() {
        let u: Units = toml::from_str("size = 4096\nspan = 30\nkbps = 1000\nwqes = 5").unwrap();
        assert_eq!(u.size, ByteSize::new(4096));
        assert_eq!(u.span, span("30s"));
        assert_eq!(u.kbps, "1000".parse().unwrap());
        assert_eq!(u.wqes, "5".parse().unwrap());
        let u: Units = toml::from_str(
            "size = \"1G\"\nspan = \"infinity\"\nkbps = \"infinity\"\nwqes = \"1M\"",
        )
        .unwrap();
        assert_eq!(u.size, ByteSize::new(1 << 30));
        assert_eq!(u.span, TimeSpan::Infinite);
        assert_eq!(u.kbps, KbitRate::Unlimited);
        assert_eq!(u.wqes, "1000000".parse().unwrap());
        let e = toml::from_str::<Units>("size = -1\nspan = 1\nkbps = 1\nwqes = 1").unwrap_err();
        assert!(
            e.message()
                .contains("invalid size \"-1\": must not be negative"),
            "{e}"
        );
        let e = toml::from_str::<Units>("size = 1.5\nspan = 1\nkbps = 1\nwqes = 1").unwrap_err();
        assert!(e.message().contains("expected a size"), "{e}");
    }
}
