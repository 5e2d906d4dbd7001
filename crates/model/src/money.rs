//! Money as integer micro-dollars with checked arithmetic. Never floats.

use std::fmt;
use std::ops::{Add, Sub};

/// An amount of US dollars in millionths. Prices are `Micros` per GPU-hour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Micros(pub i64);

impl Micros {
    pub const ZERO: Micros = Micros(0);
    pub const MAX: Micros = Micros(i64::MAX);
    pub const PER_DOLLAR: i64 = 1_000_000;

    pub fn from_dollars(dollars: i64) -> Micros {
        Micros(
            dollars
                .checked_mul(Self::PER_DOLLAR)
                .expect("dollar amount fits in i64 micros"),
        )
    }

    /// Parses "2.10", "$2.1" or "3" as dollars; at most six decimals.
    pub fn parse_dollars(text: &str) -> Option<Micros> {
        let text = text.trim().trim_start_matches('$');
        let (negative, text) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
        if whole.is_empty() && fraction.is_empty() || fraction.len() > 6 {
            return None;
        }
        if !whole.chars().chain(fraction.chars()).all(|c| c.is_ascii_digit()) {
            return None;
        }
        let whole: i64 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
        let mut fraction_micros: i64 = if fraction.is_empty() { 0 } else { fraction.parse().ok()? };
        for _ in fraction.len()..6 {
            fraction_micros *= 10;
        }
        let value = whole.checked_mul(Self::PER_DOLLAR)?.checked_add(fraction_micros)?;
        Some(Micros(if negative { -value } else { value }))
    }

    pub fn checked_add(self, other: Micros) -> Option<Micros> {
        self.0.checked_add(other.0).map(Micros)
    }

    pub fn checked_sub(self, other: Micros) -> Option<Micros> {
        self.0.checked_sub(other.0).map(Micros)
    }

    /// The cost of holding `gpu_milli` thousandths of a GPU for `seconds` at this hourly rate,
    /// rounded half up to the micro-dollar.
    pub fn cost_for(self, gpu_milli: u64, seconds: u64) -> Option<Micros> {
        let numerator = (self.0 as i128)
            .checked_mul(gpu_milli as i128)?
            .checked_mul(seconds as i128)?;
        let denominator: i128 = 1000 * 3600;
        let rounded = (numerator + denominator / 2).div_euclid(denominator);
        i64::try_from(rounded).ok().map(Micros)
    }

    /// This rate scaled by `numerator / denominator`, rounded down; `None` on overflow or a zero denominator.
    pub fn scale(self, numerator: u64, denominator: u64) -> Option<Micros> {
        if denominator == 0 {
            return None;
        }
        let value = (self.0 as i128) * (numerator as i128) / (denominator as i128);
        i64::try_from(value).ok().map(Micros)
    }
}

impl Add for Micros {
    type Output = Micros;
    fn add(self, other: Micros) -> Micros {
        self.checked_add(other)
            .expect("money overflow: sums stay far below i64::MAX micro-dollars")
    }
}

impl Sub for Micros {
    type Output = Micros;
    fn sub(self, other: Micros) -> Micros {
        self.checked_sub(other)
            .expect("money overflow: differences stay far below i64::MAX micro-dollars")
    }
}

impl fmt::Display for Micros {
    /// `$2.10` for whole cents, `$2.104500` otherwise.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let magnitude = self.0.unsigned_abs();
        let dollars = magnitude / 1_000_000;
        let micros = magnitude % 1_000_000;
        if micros.is_multiple_of(10_000) {
            write!(f, "{sign}${dollars}.{:02}", micros / 10_000)
        } else {
            write!(f, "{sign}${dollars}.{micros:06}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_dollars() {
        assert_eq!(Micros::parse_dollars("2.10"), Some(Micros(2_100_000)));
        assert_eq!(Micros::parse_dollars("$3"), Some(Micros(3_000_000)));
        assert_eq!(Micros::parse_dollars(".5"), Some(Micros(500_000)));
        assert_eq!(Micros::parse_dollars("1.0000001"), None);
        assert_eq!(Micros::parse_dollars("abc"), None);
        assert_eq!(Micros::parse_dollars(""), None);
        assert_eq!(Micros(2_100_000).to_string(), "$2.10");
        assert_eq!(Micros(2_104_500).to_string(), "$2.104500");
        assert_eq!(Micros(-50_000).to_string(), "-$0.05");
    }

    #[test]
    fn cost_is_exact_and_rounded() {
        // $2/GPU-hour for half an hour on one GPU: $1.
        assert_eq!(Micros(2_000_000).cost_for(1000, 1800), Some(Micros(1_000_000)));
        // A quarter GPU for one second at $3.60/h: $0.00025.
        assert_eq!(Micros(3_600_000).cost_for(250, 1), Some(Micros(250)));
        assert_eq!(Micros(1).cost_for(1000, 1), Some(Micros(0)));
    }
}
