//! Wall-clock instants as exact integers.
//!
//! Every component stamps cache entries and compares windows in wall time (the
//! spec's epoch seconds). Holding them as whole microseconds since the Unix
//! epoch keeps the window boundary exact — "at or after `since`" never depends on
//! floating-point rounding — and gives Redis sorted-set scores that are exact in a
//! double (about 1.8e15 today, far below 2^53).

use std::fmt;
use std::time::Duration;

/// An instant of wall time: whole microseconds since the Unix epoch.
///
/// Produced by a [`Clock`](crate::Clock); arithmetic saturates rather than
/// wrapping, so a clock stepped backwards past the epoch reads as the epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(transparent))]
pub struct Timestamp(u64);

impl Timestamp {
    /// The Unix epoch itself.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// The latest instant representable, where saturating arithmetic stops.
    pub const MAX: Timestamp = Timestamp(u64::MAX);

    /// An instant `micros` microseconds after the epoch.
    pub const fn from_micros(micros: u64) -> Self {
        Timestamp(micros)
    }

    /// An instant `secs` seconds after the epoch.
    pub const fn from_secs(secs: u64) -> Self {
        Timestamp(secs.saturating_mul(1_000_000))
    }

    /// An instant from fractional epoch seconds (the spec's representation);
    /// negative and non-finite inputs clamp to the epoch and to the far future.
    pub fn from_secs_f64(secs: f64) -> Self {
        if secs.is_nan() || secs <= 0.0 {
            return Timestamp::EPOCH;
        }
        let micros = (secs * 1e6).round();
        if micros >= u64::MAX as f64 {
            Timestamp::MAX
        } else {
            Timestamp(micros as u64)
        }
    }

    /// Microseconds since the epoch.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// Fractional seconds since the epoch.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e6
    }

    /// This instant moved `d` later, saturating at the far future.
    pub fn saturating_add(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(duration_micros(d)))
    }

    /// This instant moved `d` earlier, saturating at the epoch.
    pub fn saturating_sub(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_sub(duration_micros(d)))
    }

    /// Time elapsed from `earlier` to `self`; zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }

    /// Parses the stored form written by its [`Display`](std::fmt::Display) impl: decimal seconds
    /// with up to six fractional digits (`"1700000000.25"`). Returns `None` for
    /// anything else, so a damaged cache entry is detected rather than guessed at.
    pub fn parse_secs(text: &str) -> Option<Self> {
        let (whole, frac) = match text.split_once('.') {
            Some((w, f)) => (w, f),
            None => (text, ""),
        };
        if whole.is_empty() || frac.len() > 6 || !all_digits(whole) || !all_digits(frac) {
            return None;
        }
        let secs: u64 = whole.parse().ok()?;
        let mut micros: u64 = if frac.is_empty() { 0 } else { frac.parse().ok()? };
        for _ in frac.len()..6 {
            micros *= 10;
        }
        secs.checked_mul(1_000_000)?.checked_add(micros).map(Timestamp)
    }
}

fn all_digits(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit())
}

/// A duration in whole microseconds, saturating.
pub(crate) fn duration_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Formats as decimal seconds with six fractional digits (`1700000000.250000`),
/// the form stored in caches and parsed back by [`Timestamp::parse_secs`].
impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:06}", self.0 / 1_000_000, self.0 % 1_000_000)
    }
}

/// Formats a duration as seconds the way messages in this crate show them
/// (`60`, `0.5`, `1.25`): no unit, no trailing zeros.
pub(crate) fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    format!("{s}")
}

/// The largest number a stored record may hold: 2^53, what a Redis script's
/// doubles hold exactly.
pub(crate) const MAX_STORED: u64 = 1 << 53;

/// Parses one number of a stored record as every adapter writes it: 1 to 16
/// decimal digits, at most [`MAX_STORED`]. Anything else (a sign, a space, a
/// foreign writer's value) is `None`, and the record reads as damaged.
pub(crate) fn stored_number(token: &str) -> Option<u64> {
    if token.is_empty() || token.len() > 16 || !token.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    token.parse().ok().filter(|n| *n <= MAX_STORED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_round_trips_through_parse() {
        for micros in [0, 1, 999_999, 1_000_000, 1_700_000_000_250_000, 1_700_000_000_000_001] {
            let t = Timestamp::from_micros(micros);
            assert_eq!(Timestamp::parse_secs(&t.to_string()), Some(t));
        }
    }

    #[test]
    fn parse_accepts_short_fractions_and_whole_seconds() {
        assert_eq!(Timestamp::parse_secs("12"), Some(Timestamp::from_secs(12)));
        assert_eq!(Timestamp::parse_secs("12.5"), Some(Timestamp::from_micros(12_500_000)));
    }

    #[test]
    fn parse_rejects_damage() {
        for bad in ["", ".5", "1.2.3", "-1", "1e9", "12.1234567", "abc", " 1"] {
            assert_eq!(Timestamp::parse_secs(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn arithmetic_saturates() {
        let t = Timestamp::from_secs(10);
        assert_eq!(t.saturating_sub(Duration::from_secs(20)), Timestamp::EPOCH);
        assert_eq!(Timestamp::from_secs(1).saturating_duration_since(t), Duration::ZERO);
        assert_eq!(Timestamp::MAX.saturating_add(Duration::from_secs(1)), Timestamp::MAX);
    }

    #[test]
    fn from_secs_f64_clamps() {
        assert_eq!(Timestamp::from_secs_f64(-5.0), Timestamp::EPOCH);
        assert_eq!(Timestamp::from_secs_f64(f64::NAN), Timestamp::EPOCH);
        assert_eq!(Timestamp::from_secs_f64(1.5), Timestamp::from_micros(1_500_000));
    }
}
