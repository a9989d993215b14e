//! Quantities with units: sizes (`256G`) and time spans (`10s`, `5m`).

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::text::ValueError;

const KIB: u64 = 1024;

/// A size in bytes, written with a binary unit: `512M`, `256G`, `1T` (also `256GiB`, `256GB`;
/// all mean powers of 1024, as Proxmox does). A bare number is refused, except 0, because
/// Proxmox reads memory in MiB and disks in GiB and a bare number invites mistakes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Size(u64);

impl Size {
    /// A size of `bytes`.
    pub const fn from_bytes(bytes: u64) -> Self {
        Size(bytes)
    }

    /// Bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }

    /// Whole MiB, rounding down.
    pub fn mib(self) -> u64 {
        self.0 / (KIB * KIB)
    }

    /// GiB as Proxmox writes disk sizes (`200` or `0.5`).
    pub fn gib_text(self) -> String {
        let gib = KIB * KIB * KIB;
        if self.0.is_multiple_of(gib) {
            (self.0 / gib).to_string()
        } else {
            let v = self.0 as f64 / gib as f64;
            format!("{v:.3}")
                .trim_end_matches('0')
                .trim_end_matches('.')
                .to_string()
        }
    }

    /// Parses `256G`, `512MiB`, `1.5T`, `0`.
    pub fn parse(s: &str) -> Result<Self, ValueError> {
        let t = s.trim();
        if t == "0" {
            return Ok(Size(0));
        }
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| {
                ValueError::new(format!("`{s}` has no unit"))
                    .hint(format!("write a unit: `{t}M` for MiB or `{t}G` for GiB"))
            })?;
        let (num, unit) = t.split_at(split);
        let mult = match unit.trim() {
            "K" | "KiB" | "KB" | "k" => KIB,
            "M" | "MiB" | "MB" => KIB * KIB,
            "G" | "GiB" | "GB" => KIB * KIB * KIB,
            "T" | "TiB" | "TB" => KIB * KIB * KIB * KIB,
            other => {
                return Err(
                    ValueError::new(format!("unknown size unit `{other}` in `{s}`"))
                        .hint("use K, M, G or T (powers of 1024), e.g. `256G`"),
                );
            }
        };
        let value: f64 = num.parse().map_err(|_| {
            ValueError::new(format!("`{s}` is not a size"))
                .hint("write a number and a unit, e.g. `256G`")
        })?;
        let bytes = value * mult as f64;
        if !bytes.is_finite() || bytes > u64::MAX as f64 / 2.0 {
            return Err(ValueError::new(format!("`{s}` is too large")));
        }
        Ok(Size(bytes.round() as u64))
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = [
            ("T", KIB.pow(4)),
            ("G", KIB.pow(3)),
            ("M", KIB.pow(2)),
            ("K", KIB),
        ];
        if self.0 == 0 {
            return f.write_str("0");
        }
        for (name, mult) in units {
            if self.0.is_multiple_of(mult) {
                return write!(f, "{}{name}", self.0 / mult);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size with a unit, like 256G")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Size, E> {
                Size::parse(s).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Size, E> {
                if v == 0 {
                    Ok(Size(0))
                } else {
                    Err(E::custom(
                        ValueError::new(format!("`{v}` has no unit"))
                            .hint(format!("write a unit: `{v}M` for MiB or `{v}G` for GiB")),
                    ))
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Size, E> {
                if v < 0 {
                    Err(E::custom(format!("a size cannot be negative (`{v}`)")))
                } else {
                    self.visit_u64(v as u64)
                }
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Size, E> {
                Err(E::custom(
                    ValueError::new(format!("`{v}` has no unit"))
                        .hint(format!("write a unit, e.g. `{v}G`")),
                ))
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for Size {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl JsonSchema for Size {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("Size")
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A size with a binary unit (powers of 1024): 512M, 256G, 1T; or 0.",
            "oneOf": [
                {"type": "string", "pattern": "^([0-9]+(\\.[0-9]+)?\\s*(K|k|KiB|KB|M|MiB|MB|G|GiB|GB|T|TiB|TB)|0)$"},
                {"type": "integer", "const": 0}
            ]
        })
    }
}

/// A span of time: `500ms`, `10s`, `5m` (or `5min`), `2h`; a bare number means seconds, as
/// in systemd.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimeSpan(u64);

impl TimeSpan {
    /// A span of `secs` seconds.
    pub const fn secs(secs: u64) -> Self {
        TimeSpan(secs * 1000)
    }

    /// A span of `ms` milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        TimeSpan(ms)
    }

    /// Milliseconds.
    pub fn millis(self) -> u64 {
        self.0
    }

    /// As a standard duration.
    pub fn as_duration(self) -> std::time::Duration {
        std::time::Duration::from_millis(self.0)
    }

    /// As systemd writes it (`10s`, `5min`, `1500ms`).
    pub fn systemd(self) -> String {
        if self.0.is_multiple_of(60_000) && self.0 >= 60_000 {
            format!("{}min", self.0 / 60_000)
        } else if self.0.is_multiple_of(1000) {
            format!("{}s", self.0 / 1000)
        } else {
            format!("{}ms", self.0)
        }
    }

    /// Parses `10s`, `5m`, `5min`, `2h`, `500ms`, `30`.
    pub fn parse(s: &str) -> Result<Self, ValueError> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().map_err(|_| {
            ValueError::new(format!("`{s}` is not a time span"))
                .hint("write a number and a unit, e.g. `10s` or `5m`")
        })?;
        let mult = match unit.trim() {
            "ms" => 1,
            "" | "s" | "sec" => 1000,
            "m" | "min" => 60_000,
            "h" => 3_600_000,
            other => {
                return Err(
                    ValueError::new(format!("unknown time unit `{other}` in `{s}`"))
                        .hint("use ms, s, m (or min) or h, e.g. `10s`"),
                );
            }
        };
        n.checked_mul(mult)
            .map(TimeSpan)
            .ok_or_else(|| ValueError::new(format!("`{s}` is too long")))
    }
}

impl fmt::Display for TimeSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(3_600_000) && self.0 > 0 {
            write!(f, "{}h", self.0 / 3_600_000)
        } else if self.0.is_multiple_of(60_000) && self.0 > 0 {
            write!(f, "{}m", self.0 / 60_000)
        } else if self.0.is_multiple_of(1000) {
            write!(f, "{}s", self.0 / 1000)
        } else {
            write!(f, "{}ms", self.0)
        }
    }
}

impl<'de> Deserialize<'de> for TimeSpan {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = TimeSpan;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a time span like 10s or 5m")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<TimeSpan, E> {
                TimeSpan::parse(s).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<TimeSpan, E> {
                v.checked_mul(1000)
                    .map(TimeSpan)
                    .ok_or_else(|| E::custom("time span too long"))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<TimeSpan, E> {
                if v < 0 {
                    Err(E::custom(format!("a time span cannot be negative (`{v}`)")))
                } else {
                    self.visit_u64(v as u64)
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for TimeSpan {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl JsonSchema for TimeSpan {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("TimeSpan")
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A time span: 500ms, 10s, 5m (or 5min), 2h; a bare number is seconds.",
            "oneOf": [
                {"type": "string", "pattern": "^[0-9]+\\s*(ms|s|sec|m|min|h)?$"},
                {"type": "integer", "minimum": 0}
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(Size::parse("256G").unwrap().mib(), 256 * 1024);
        assert_eq!(Size::parse("512MiB").unwrap().mib(), 512);
        assert_eq!(Size::parse("1.5T").unwrap().gib_text(), "1536");
        assert_eq!(Size::parse("512M").unwrap().gib_text(), "0.5");
        assert_eq!(Size::parse("0").unwrap().bytes(), 0);
        assert!(Size::parse("256").unwrap_err().to_string().contains("256G"));
        assert!(
            Size::parse("3Q")
                .unwrap_err()
                .to_string()
                .contains("unknown size unit")
        );
        assert_eq!(Size::parse("256G").unwrap().to_string(), "256G");
    }

    #[test]
    fn time_spans() {
        assert_eq!(TimeSpan::parse("10s").unwrap().millis(), 10_000);
        assert_eq!(TimeSpan::parse("5m").unwrap().systemd(), "5min");
        assert_eq!(TimeSpan::parse("90").unwrap().systemd(), "90s");
        assert_eq!(TimeSpan::parse("1500ms").unwrap().systemd(), "1500ms");
        assert_eq!(TimeSpan::parse("2h").unwrap().to_string(), "2h");
        assert!(TimeSpan::parse("5 days").is_err());
    }
}
