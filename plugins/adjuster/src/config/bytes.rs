//! Byte counts with units (`128Mi`, `2G`).

use std::fmt;

use serde::{Deserialize, Deserializer};

/// A byte count: a TOML integer (bytes; -1 means unlimited) or a string
/// with a Kubernetes-style unit: `k`, `M`, `G`, `T` (powers of 1000) or
/// `Ki`, `Mi`, `Gi`, `Ti` (powers of 1024).
///
/// ```
/// use nri_adjuster::Bytes;
/// assert_eq!("128Mi".parse::<Bytes>().unwrap(), Bytes(128 << 20));
/// assert_eq!("2G".parse::<Bytes>().unwrap(), Bytes(2_000_000_000));
/// assert_eq!("4096".parse::<Bytes>().unwrap(), Bytes(4096));
/// assert!("12MB".parse::<Bytes>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub i64);

impl std::str::FromStr for Bytes {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (num, unit) = s.split_at(digits);
        let bad = || {
            format!("invalid byte count {s:?}: expected a number with an optional unit k, M, G, T, Ki, Mi, Gi or Ti")
        };
        let n: i64 = num.parse().map_err(|_| bad())?;
        let mult: i64 = match unit {
            "" => 1,
            "k" => 1000,
            "M" => 1000_i64.pow(2),
            "G" => 1000_i64.pow(3),
            "T" => 1000_i64.pow(4),
            "Ki" => 1 << 10,
            "Mi" => 1 << 20,
            "Gi" => 1 << 30,
            "Ti" => 1 << 40,
            _ => return Err(bad()),
        };
        n.checked_mul(mult)
            .map(Bytes)
            .ok_or_else(|| format!("byte count {s:?} is too large"))
    }
}

impl fmt::Display for Bytes {
    /// The count in bytes, and in the largest unit that divides it, for
    /// error messages: `134217728 (128Mi)`, `-1 (unlimited)`, `4095`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, i64); 8] = [
            ("Ti", 1 << 40),
            ("T", 1000_i64.pow(4)),
            ("Gi", 1 << 30),
            ("G", 1000_i64.pow(3)),
            ("Mi", 1 << 20),
            ("M", 1000_i64.pow(2)),
            ("Ki", 1 << 10),
            ("k", 1000),
        ];
        let n = self.0;
        if n == -1 {
            return f.write_str("-1 (unlimited)");
        }
        match UNITS.iter().find(|(_, m)| n > 0 && n % m == 0) {
            Some((unit, m)) => write!(f, "{n} ({}{unit})", n / m),
            None => write!(f, "{n}"),
        }
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Bytes;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte count: an integer, -1 (unlimited), or a string such as \"128Mi\"")
            }

            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Bytes, E> {
                if v < -1 {
                    return Err(E::custom(format!(
                        "invalid byte count {v}: must be -1 (unlimited) or a byte count"
                    )));
                }
                Ok(Bytes(v))
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Bytes, E> {
                i64::try_from(v)
                    .map(Bytes)
                    .map_err(|_| E::custom(format!("byte count {v} is too large")))
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Bytes, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}
