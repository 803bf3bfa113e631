//! The least-loaded pick as a pure function, and the draw by weight.
//!
//! A router that sends each call to the deployment with the fewest calls in
//! flight balances a fleet's load only if the count, the pick and the new
//! lease are one atomic step in a shared store
//! ([`InFlightStore::pick_least_loaded`]); every store must then pick alike,
//! or which deployment a call lands on would depend on where the counts are
//! kept. [`least_loaded`] is that one definition, counts and weights in, an
//! index out; `weighted_pick` is the weighted policy's draw. Neither reads a
//! clock or touches a store.
//!
//! [`InFlightStore::pick_least_loaded`]: crate::cache::InFlightStore::pick_least_loaded

use std::time::Duration;

use crate::error::CacheError;
use crate::time::Timestamp;

/// A draw by weight: `draw` (uniform over `u64`) scaled onto the weights'
/// sum, the deployment whose share it lands in. `None` when every weight is 0.
pub(crate) fn weighted_pick(weights: &[u32], draw: u64) -> Option<usize> {
    let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
    if total == 0 {
        return None;
    }
    // Lemire's multiply-shift: exact for any total below 2^64.
    let mut point = ((u128::from(draw) * u128::from(total)) >> 64) as u64;
    for (i, w) in weights.iter().enumerate() {
        let w = u64::from(*w);
        if point < w {
            return Some(i);
        }
        point -= w;
    }
    None
}

/// The most deployments one pick weighs.
pub const MAX_DEPLOYMENTS: usize = 64;

/// What [`InFlightStore::pick_least_loaded`](crate::cache::InFlightStore::pick_least_loaded) is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PickRequest {
    /// The caller's now (ignored under a store's own clock).
    pub now: Timestamp,
    /// The new call's id, unique among the calls in flight (a random draw).
    pub id: u64,
    /// How long the new call's lease lasts unless ended first.
    pub lease: Duration,
    /// Under [`TimeSource::Caller`](crate::TimeSource::Caller), how far
    /// ahead of the store's clock a caller's `now` is taken as it is;
    /// further ahead it is clamped, so one fast clock cannot end everyone
    /// else's leases early.
    pub max_ahead: Duration,
}

/// The answer: which deployment was picked, and the live calls each had.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Pick {
    /// The index (into the keys asked about) of the deployment picked.
    pub index: usize,
    /// Live calls in flight at each key before this one was added.
    pub counts: Vec<u64>,
}

/// The least-loaded deployment: the smallest `counts[i] / weights[i]`,
/// compared exactly by cross-multiplying, the earliest on a tie (so a caller
/// lists deployments in its order of preference). `None` when there are no
/// candidates or every weight is zero (a zero weight is never picked).
pub fn least_loaded(counts: &[u64], weights: &[u32]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, (&count, &weight)) in counts.iter().zip(weights).enumerate() {
        if weight == 0 {
            continue;
        }
        let better = match best {
            None => true,
            Some(b) => u128::from(count) * u128::from(weights[b]) < u128::from(counts[b]) * u128::from(weight),
        };
        if better {
            best = Some(i);
        }
    }
    best
}

/// Refuses a pick no adapter can make: no keys, keys and weights of
/// different lengths, more than [`MAX_DEPLOYMENTS`], or every weight zero.
pub(crate) fn check_pick(keys: &[&str], weights: &[u32]) -> Result<(), CacheError> {
    let wrong = if keys.is_empty() {
        Some("no deployments to pick from".to_owned())
    } else if keys.len() != weights.len() {
        Some(format!("{} keys but {} weights", keys.len(), weights.len()))
    } else if keys.len() > MAX_DEPLOYMENTS {
        Some(format!("{} deployments, more than {MAX_DEPLOYMENTS}", keys.len()))
    } else if weights.iter().all(|w| *w == 0) {
        Some("every weight is zero".to_owned())
    } else {
        None
    };
    match wrong {
        Some(detail) => Err(CacheError::Protocol {
            operation: "pick_least_loaded",
            detail,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fewest_calls_per_weight_win_and_ties_go_to_the_first() {
        assert_eq!(least_loaded(&[3, 1, 2], &[1, 1, 1]), Some(1));
        assert_eq!(least_loaded(&[1, 1], &[1, 1]), Some(0));
        // 4 calls on weight 4 is lighter than 2 on weight 1.
        assert_eq!(least_loaded(&[2, 4], &[1, 4]), Some(1));
        assert_eq!(least_loaded(&[0, 0], &[0, 3]), Some(1), "a zero weight is never picked");
        assert_eq!(least_loaded(&[0], &[0]), None);
        assert_eq!(least_loaded(&[], &[]), None);
    }

    #[test]
    fn a_weighted_draw_lands_in_each_share_exactly() {
        let weights = [3, 0, 1];
        // The draw scaled onto 0..4: [0, 3) is the first, [3, 4) the third.
        let at = |point: u64| weighted_pick(&weights, point.saturating_mul(u64::MAX / 4) + point);
        assert_eq!(at(0), Some(0));
        assert_eq!(at(2), Some(0));
        assert_eq!(at(3), Some(2), "a zero weight takes no share");
        assert_eq!(weighted_pick(&weights, u64::MAX), Some(2));
        assert_eq!(weighted_pick(&[0, 0], 7), None);
        assert_eq!(weighted_pick(&[u32::MAX; 64], u64::MAX), Some(63), "no overflow");
    }
}
