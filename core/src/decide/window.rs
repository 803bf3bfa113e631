//! The sliding-window decision as a pure function.
//!
//! Given how many hits are in `[now − window, now]` and the one whose ageing
//! out frees a slot ([`freeing_rank`]), [`decide`] admits or refuses and says
//! when a slot frees. Stores run it
//! inside their atomic [`acquire_slot`](crate::cache::LimiterStore::acquire_slot);
//! nothing here reads a clock.
//!
//! # Stamps, skew and the bound
//!
//! A store stamps each hit with its own clock ([`TimeSource::Store`], the
//! default) or with the caller's ([`TimeSource::Caller`]). A caller's stamp is
//! first put through [`clamp_stamp`]: never more than a small tolerance
//! (`max_ahead`) ahead of the store's clock and never more than one window
//! behind it. Every decision counts *all* hits
//! stamped at or after `now − window`, later ones included, and stores prune
//! only hits older than their series' lifetime before their own clock (the
//! limiter's series live `2 × window + max_ahead` plus one microsecond), which
//! no clamped caller's window can reach. Together:
//!
//! - **In stamp time the limit is exact**: any `window`-wide interval of
//!   stamps holds at most `limit` admitted hits, however the decisions
//!   interleave. (Take the hit in the interval admitted last: every other hit
//!   in it was already stored and was counted by its decision.)
//! - **In true time the excess is bounded by the skew**: if the stamps of
//!   the callers admitted in a window spread over at most `Δ` (the largest
//!   difference between their clocks, after clamping, so
//!   `Δ ≤ window + max_ahead`), any `window` of true time holds at most
//!   `limit × (1 + ⌈Δ / window⌉)` admissions — exactly `limit` when every
//!   clock agrees or the store stamps, `2 × limit` while the clocks stay
//!   within one window of each other, and `3 × limit` however wild a
//!   caller's clock. [`skew_bound`] computes it.
//!
//! A clock far ahead can therefore no longer prune everyone else's hits (the
//! store prunes by its own clock), and is reported when clamped.
//!
//! [`TimeSource::Store`]: crate::TimeSource::Store
//! [`TimeSource::Caller`]: crate::TimeSource::Caller

use std::time::Duration;

use crate::time::Timestamp;

/// The answer to one slot request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum SlotOutcome {
    /// A hit was recorded at `at`.
    Admitted {
        /// Slots left in the window after this one.
        remaining: u32,
        /// The instant the hit was stamped with.
        at: Timestamp,
        /// The caller's stamp was outside the store's tolerance and was
        /// clamped to `at` (see [`clamp_stamp`]).
        clamped: bool,
    },
    /// Nothing was recorded.
    Refused {
        /// Hits already in the window.
        used: u64,
        /// How long until enough hits have aged out for a slot to free:
        /// `(freeing + window) − now`, where `freeing` is the hit at
        /// [`freeing_rank`] (the oldest, at the limit), plus the one
        /// microsecond after which that hit is outside the inclusive window
        /// — so a caller that sleeps exactly this long and asks again is
        /// admitted if nobody took the slot meanwhile. The full window if
        /// the store knew of no such hit. Never zero.
        retry_after: Duration,
        /// The instant the decision was made at.
        at: Timestamp,
        /// The caller's stamp was outside the store's tolerance and was
        /// clamped to `at` (see [`clamp_stamp`]).
        clamped: bool,
    },
}

impl SlotOutcome {
    /// The same outcome, marked as decided at a clamped stamp or not.
    pub fn with_clamped(self, was_clamped: bool) -> Self {
        match self {
            SlotOutcome::Admitted { remaining, at, .. } => SlotOutcome::Admitted {
                remaining,
                at,
                clamped: was_clamped,
            },
            SlotOutcome::Refused {
                used, retry_after, at, ..
            } => SlotOutcome::Refused {
                used,
                retry_after,
                at,
                clamped: was_clamped,
            },
        }
    }

    /// The instant the decision was made at.
    pub fn at(&self) -> Timestamp {
        match *self {
            SlotOutcome::Admitted { at, .. } | SlotOutcome::Refused { at, .. } => at,
        }
    }

    /// Whether the caller's stamp was clamped.
    pub fn clamped(&self) -> bool {
        match *self {
            SlotOutcome::Admitted { clamped, .. } | SlotOutcome::Refused { clamped, .. } => clamped,
        }
    }
}

/// The stamp a store decides a caller-stamped request at: the caller's `now`,
/// clamped into `[store_now − window, store_now + max_ahead]`, and whether it
/// was clamped.
///
/// A caller further ahead of the store is taken `max_ahead` ahead (its hits
/// can never sit far in the future, where they would block everyone and
/// outlive their series); a caller more than one window behind is taken one
/// window behind (its hits would otherwise fall below what the store prunes).
/// Callers within that range keep their own clock. A series must then live
/// longer than `2 × window + max_ahead` for no decision to miss a hit it
/// should count; the limiter asks for that plus one microsecond.
pub fn clamp_stamp(
    caller_now: Timestamp,
    store_now: Timestamp,
    window: Duration,
    max_ahead: Duration,
) -> (Timestamp, bool) {
    let floor = store_now.saturating_sub(window);
    let ceiling = store_now.saturating_add(max_ahead);
    if caller_now > ceiling {
        (ceiling, true)
    } else if caller_now < floor {
        (floor, true)
    } else {
        (caller_now, false)
    }
}

/// The most admissions one tenant can get in any `window` of true time when
/// the clocks stamping its hits spread over `spread`:
/// `limit × (1 + ⌈spread / window⌉)`, with `spread` capped at
/// `window + max_ahead` (what [`clamp_stamp`] lets through). `limit` when the
/// clocks agree.
pub fn skew_bound(limit: u32, window: Duration, max_ahead: Duration, spread: Duration) -> u64 {
    if window.is_zero() {
        return u64::from(limit);
    }
    let spread = spread.min(window.saturating_add(max_ahead)).as_nanos();
    let extra = spread.div_ceil(window.as_nanos());
    u64::from(limit).saturating_mul(1 + u64::try_from(extra).unwrap_or(u64::MAX - 1))
}

/// The resolution of [`Timestamp`]: a window `[now − window, now]` still
/// holds a hit stamped exactly `now − window`, and drops it one tick later.
const RESOLUTION: Duration = Duration::from_micros(1);

/// Which hit in the window, counted from the oldest (0-based), must age out
/// before `count` hits leave room under `limit`: the `(count − limit + 1)`-th
/// oldest. Zero — the oldest — while the window holds exactly `limit`; later
/// ones when it holds more, as it does for a caller whose class may fill only
/// part of the limit ([`Priority::Low`](crate::Priority::Low)) or after skewed
/// stamps. What a store looks up for [`decide`] when it refuses.
pub fn freeing_rank(count: u64, limit: u32) -> u64 {
    count.saturating_sub(u64::from(limit))
}

/// Admit if fewer than `limit` hits are in the window; otherwise refuse with
/// the wait until `freeing` — the hit at [`freeing_rank`] in the window, the
/// one whose ageing out leaves room under `limit` — has aged out.
pub fn decide(count: u64, freeing: Option<Timestamp>, limit: u32, now: Timestamp, window: Duration) -> SlotOutcome {
    if count < u64::from(limit) {
        // count < limit ≤ u32::MAX, so the subtraction fits.
        let remaining = u32::try_from(u64::from(limit) - count - 1).unwrap_or(0);
        SlotOutcome::Admitted {
            remaining,
            at: now,
            clamped: false,
        }
    } else {
        let retry_after = match freeing {
            Some(freeing) => freeing
                .saturating_add(window)
                .saturating_add(RESOLUTION)
                .saturating_duration_since(now)
                .max(RESOLUTION),
            None => window,
        };
        SlotOutcome::Refused {
            used: count,
            retry_after,
            at: now,
            clamped: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Timestamp = Timestamp::from_secs(100);
    const W: Duration = Duration::from_secs(60);

    #[test]
    fn admits_below_the_limit_and_counts_down() {
        assert_eq!(
            decide(0, None, 5, NOW, W),
            SlotOutcome::Admitted {
                remaining: 4,
                at: NOW,
                clamped: false
            }
        );
        assert_eq!(
            decide(4, None, 5, NOW, W),
            SlotOutcome::Admitted {
                remaining: 0,
                at: NOW,
                clamped: false
            }
        );
    }

    #[test]
    fn refuses_at_the_limit_until_the_oldest_ages_out() {
        let oldest = NOW.saturating_sub(Duration::from_secs(45));
        assert_eq!(
            decide(5, Some(oldest), 5, NOW, W),
            SlotOutcome::Refused {
                used: 5,
                retry_after: Duration::from_secs(15) + RESOLUTION,
                at: NOW,
                clamped: false
            }
        );
    }

    #[test]
    fn a_hit_exactly_one_window_old_still_counts_for_one_more_tick() {
        let oldest = NOW.saturating_sub(W);
        assert_eq!(
            decide(5, Some(oldest), 5, NOW, W),
            SlotOutcome::Refused {
                used: 5,
                retry_after: RESOLUTION,
                at: NOW,
                clamped: false
            }
        );
    }

    #[test]
    fn over_the_limit_the_wait_is_for_the_hit_that_leaves_room() {
        // Five hits under a limit of three (a lower class's share of five):
        // the third oldest must age out before a slot frees.
        assert_eq!((freeing_rank(5, 3), freeing_rank(3, 3), freeing_rank(2, 3)), (2, 0, 0));
        let third = NOW.saturating_sub(Duration::from_secs(20));
        assert_eq!(
            decide(5, Some(third), 3, NOW, W),
            SlotOutcome::Refused {
                used: 5,
                retry_after: Duration::from_secs(40) + RESOLUTION,
                at: NOW,
                clamped: false
            }
        );
    }

    #[test]
    fn full_window_without_an_oldest_hit() {
        assert_eq!(
            decide(5, None, 5, NOW, W),
            SlotOutcome::Refused {
                used: 5,
                retry_after: W,
                at: NOW,
                clamped: false
            }
        );
    }

    #[test]
    fn a_caller_ahead_is_taken_at_the_store_clock_and_one_far_behind_a_window_back() {
        let store = NOW;
        let ahead = Duration::from_secs(1);
        assert_eq!(clamp_stamp(NOW, store, W, ahead), (NOW, false));
        let behind = NOW.saturating_sub(Duration::from_secs(59));
        assert_eq!(clamp_stamp(behind, store, W, ahead), (behind, false));
        let slightly_ahead = NOW.saturating_add(ahead);
        assert_eq!(clamp_stamp(slightly_ahead, store, W, ahead), (slightly_ahead, false));
        assert_eq!(
            clamp_stamp(NOW.saturating_add(Duration::from_secs(3600)), store, W, ahead),
            (slightly_ahead, true)
        );
        assert_eq!(
            clamp_stamp(NOW.saturating_sub(Duration::from_secs(61)), store, W, ahead),
            (NOW.saturating_sub(W), true)
        );
    }

    #[test]
    fn the_skew_bound_is_the_limit_when_clocks_agree_and_grows_by_a_limit_per_window_of_spread() {
        let ahead = Duration::from_secs(1);
        assert_eq!(skew_bound(20, W, ahead, Duration::ZERO), 20);
        assert_eq!(skew_bound(20, W, ahead, Duration::from_secs(5)), 40);
        assert_eq!(skew_bound(20, W, ahead, W), 40);
        assert_eq!(skew_bound(20, W, ahead, Duration::from_secs(3600)), 60);
        assert_eq!(skew_bound(20, W, Duration::ZERO, Duration::from_secs(3600)), 40);
    }
}
