//! The sliding-window decision as a pure function.
//!
//! Given how many hits are in `[now − window, now]` and the oldest of them,
//! [`decide`] admits or refuses and says when a slot frees. Stores run it
//! inside their atomic [`acquire_slot`](crate::cache::LimiterStore::acquire_slot);
//! nothing here reads a clock.

use std::time::Duration;

use crate::time::Timestamp;

/// The answer to one slot request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotOutcome {
    /// A hit was recorded at `at`.
    Admitted {
        /// Slots left in the window after this one.
        remaining: u32,
        /// The instant the hit was stamped with.
        at: Timestamp,
    },
    /// Nothing was recorded.
    Refused {
        /// Hits already in the window.
        used: u64,
        /// How long until the oldest hit in the window has aged out:
        /// `(oldest + window) − now`, plus the one microsecond after which
        /// that hit is outside the inclusive window — so a caller that sleeps
        /// exactly this long and asks again is admitted. The full window if
        /// the store knew of no oldest hit. Never zero.
        retry_after: Duration,
        /// The instant the decision was made at.
        at: Timestamp,
    },
}

/// The resolution of [`Timestamp`]: a window `[now − window, now]` still
/// holds a hit stamped exactly `now − window`, and drops it one tick later.
const RESOLUTION: Duration = Duration::from_micros(1);

/// Admit if fewer than `limit` hits are in the window; otherwise refuse with
/// the wait until the oldest of them ages out.
pub fn decide(count: u64, oldest: Option<Timestamp>, limit: u32, now: Timestamp, window: Duration) -> SlotOutcome {
    if count < u64::from(limit) {
        // count < limit ≤ u32::MAX, so the subtraction fits.
        let remaining = u32::try_from(u64::from(limit) - count - 1).unwrap_or(0);
        SlotOutcome::Admitted { remaining, at: now }
    } else {
        let retry_after = match oldest {
            Some(oldest) => oldest
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
            SlotOutcome::Admitted { remaining: 4, at: NOW }
        );
        assert_eq!(
            decide(4, None, 5, NOW, W),
            SlotOutcome::Admitted { remaining: 0, at: NOW }
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
                at: NOW
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
                at: NOW
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
                at: NOW
            }
        );
    }
}
