//! Slow start: the share of calls a deployment takes while it ramps up
//! after its circuit closed.
//!
//! A model server that just came back (a reload, a restart) is at its
//! weakest: its caches are cold, and a server that went down under load is
//! often one whose capacity that load exceeds. When its circuit closes, a
//! router that sends it its full share at once can knock it over again,
//! and the circuit opens, closes and opens. Envoy's slow-start mode ramps a
//! host's weight up over a window instead: `weight × max(min_weight,
//! (t / window)^(1 / aggression))`. Here the same curve is a **share**: a
//! call admitted by a ramping deployment goes there with probability
//! [`SlowStart::share`], drawn from the injected random source, and to the
//! next deployment that admits it otherwise.
//!
//! The ramp starts at the instant the circuit closed, stored by the
//! breaker's closing step ([`BreakerKeys::closed_at`](crate::decide::breaker::BreakerKeys::closed_at))
//! and handed back by each closed admission with the store's `now`
//! ([`BreakerStep::closed_at`](crate::decide::breaker::BreakerStep::closed_at)),
//! so every worker sharing the store computes the same share at the same
//! instant. Shares are whole parts per million, and a draw is compared with
//! one as an integer ([`takes`]), so a trace can be judged exactly.

use std::time::Duration;

use crate::error::ConfigError;
use crate::time::Timestamp;

/// A whole share: parts per million.
pub const FULL_SHARE: u32 = 1_000_000;

/// The longest ramp a slow start accepts: a day. Anything longer is a
/// mistake in units (a window of milliseconds given as seconds).
pub const MAX_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

/// The largest aggression accepted (Envoy's curve flattens to a step well
/// before it).
pub const MAX_AGGRESSION: f64 = 100.0;

/// The share a ramp starts at unless told otherwise: Envoy's default
/// `min_weight_percent`, 10 %.
pub const DEFAULT_MIN_SHARE: u32 = 100_000;

/// A validated slow start: how long a ramp lasts, its curve, and its floor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlowStart {
    window: Duration,
    aggression: f64,
    min_share: u32,
}

impl SlowStart {
    /// A linear ramp over `window` (aggression 1) from a floor of 10 %.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for `slow_start_window` when it is zero or longer
    /// than [`MAX_WINDOW`].
    pub fn new(window: Duration) -> Result<Self, ConfigError> {
        if window.is_zero() || window > MAX_WINDOW {
            return Err(ConfigError::new(
                "slow_start_window",
                "positive and at most 86400 s",
                crate::time::secs(window),
            ));
        }
        Ok(SlowStart {
            window,
            aggression: 1.0,
            min_share: DEFAULT_MIN_SHARE,
        })
    }

    /// The curve's aggression (default 1, linear): the share at `t` into
    /// the window is `(t / window)^(1 / aggression)`; above 1 it rises fast
    /// then flattens, below 1 it stays low longer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for `slow_start_aggression` unless it is finite,
    /// positive and at most [`MAX_AGGRESSION`].
    pub fn aggression(mut self, aggression: f64) -> Result<Self, ConfigError> {
        if !(aggression.is_finite() && aggression > 0.0 && aggression <= MAX_AGGRESSION) {
            return Err(ConfigError::new(
                "slow_start_aggression",
                "finite, positive and at most 100",
                aggression,
            ));
        }
        self.aggression = aggression;
        Ok(self)
    }

    /// The least share a ramping deployment takes (default 0.1), in (0, 1].
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for `slow_start_min_share` outside (0, 1], or
    /// below one part per million.
    pub fn min_share(mut self, share: f64) -> Result<Self, ConfigError> {
        let ppm = share * f64::from(FULL_SHARE);
        if !(ppm.is_finite() && ppm >= 1.0 && share <= 1.0) {
            return Err(ConfigError::new("slow_start_min_share", "in (0, 1]", share));
        }
        // Within [1, 1e6] by the check above.
        self.min_share = ppm.round() as u32;
        Ok(self)
    }

    /// How long a ramp lasts.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The curve's aggression.
    pub fn curve(&self) -> f64 {
        self.aggression
    }

    /// The floor, in parts per million.
    pub fn floor(&self) -> u32 {
        self.min_share
    }

    /// The share, in parts per million, of a deployment whose circuit
    /// closed at `closed_at`, judged at `at` (both on the store's clock):
    /// `max(floor, ((at − closed_at) / window)^(1 / aggression))`, rounded
    /// down; `None` once the window has passed (the full share, nothing to
    /// draw). An `at` before the close (a stamp from a clock behind) is the
    /// ramp's start.
    pub fn share(&self, closed_at: Timestamp, at: Timestamp) -> Option<u32> {
        let elapsed = at.saturating_duration_since(closed_at);
        if elapsed >= self.window {
            return None;
        }
        let ratio = elapsed.as_micros() as f64 / self.window.as_micros() as f64;
        let curve = if self.aggression == 1.0 {
            ratio
        } else {
            ratio.powf(1.0 / self.aggression)
        };
        // In [0, 1): the product is below a million.
        let ppm = (curve * f64::from(FULL_SHARE)).floor() as u32;
        Some(ppm.clamp(self.min_share, FULL_SHARE))
    }
}

/// A random draw as parts per million, in `0..FULL_SHARE`.
pub fn draw_share(random: u64) -> u32 {
    // Below a million, so it fits.
    (random % u64::from(FULL_SHARE)) as u32
}

/// Whether a call drawn `draw` (parts per million, [`draw_share`]) goes to
/// a deployment ramping at `share`: `draw < share`.
pub fn takes(share: u32, draw: u32) -> bool {
    draw < share
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Timestamp = Timestamp::from_secs(1_000);

    fn after(ms: u64) -> Timestamp {
        T0.saturating_add(Duration::from_millis(ms))
    }

    #[test]
    fn a_linear_ramp_rises_from_its_floor_and_ends_with_its_window() {
        let ramp = SlowStart::new(Duration::from_secs(10)).unwrap();
        assert_eq!(ramp.share(T0, T0), Some(DEFAULT_MIN_SHARE));
        assert_eq!(
            ramp.share(T0, after(500)),
            Some(DEFAULT_MIN_SHARE),
            "5 % is under the floor"
        );
        assert_eq!(ramp.share(T0, after(2_500)), Some(250_000));
        assert_eq!(ramp.share(T0, after(9_999)), Some(999_900));
        assert_eq!(ramp.share(T0, after(10_000)), None, "the window is over at its end");
        // A stamp before the close (a clock behind) is the start.
        assert_eq!(ramp.share(after(1_000), T0), Some(DEFAULT_MIN_SHARE));
    }

    #[test]
    fn aggression_bends_the_curve_and_the_floor_is_settable() {
        let fast = SlowStart::new(Duration::from_secs(10))
            .unwrap()
            .aggression(2.0)
            .unwrap();
        // sqrt(0.25) = 0.5.
        assert_eq!(fast.share(T0, after(2_500)), Some(500_000));
        let slow = SlowStart::new(Duration::from_secs(10))
            .unwrap()
            .aggression(0.5)
            .unwrap()
            .min_share(0.01)
            .unwrap();
        // 0.5^2 = 0.25.
        assert_eq!(slow.share(T0, after(5_000)), Some(250_000));
        assert_eq!(slow.share(T0, after(500)), Some(10_000));
    }

    #[test]
    fn bad_settings_are_refused_naming_the_field() {
        let field = |e: ConfigError| e.field;
        assert_eq!(SlowStart::new(Duration::ZERO).map_err(field), Err("slow_start_window"));
        assert_eq!(
            SlowStart::new(MAX_WINDOW + Duration::from_secs(1)).map_err(field),
            Err("slow_start_window")
        );
        assert!(SlowStart::new(MAX_WINDOW).is_ok());
        let ramp = SlowStart::new(Duration::from_secs(30)).unwrap();
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 101.0] {
            assert_eq!(
                ramp.aggression(bad).map_err(field),
                Err("slow_start_aggression"),
                "{bad}"
            );
        }
        for bad in [0.0, -0.5, 1.5, f64::NAN, 1e-9] {
            assert_eq!(ramp.min_share(bad).map_err(field), Err("slow_start_min_share"), "{bad}");
        }
        assert_eq!(ramp.min_share(1.0).unwrap().floor(), FULL_SHARE);
    }

    #[test]
    fn a_draw_takes_below_the_share() {
        assert!(takes(250_000, 249_999));
        assert!(!takes(250_000, 250_000));
        assert_eq!(draw_share(1_000_000 + 7), 7);
        assert!(draw_share(u64::MAX) < FULL_SHARE);
    }
}
