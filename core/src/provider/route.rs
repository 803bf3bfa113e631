//! Routing across deployments: the least-loaded pick, fleet-wide.
//!
//! A router that sends each call to the deployment with the fewest calls in
//! flight balances load only if it sees every worker's calls. Counting them
//! in each process sees one process's; counting them in a shared store and
//! then picking is a read-then-write a racing fleet turns into a herd (every
//! worker reads the same counts and picks the same deployment). Here the
//! count, the pick and the new lease are one atomic step in the store
//! ([`InFlightStore::pick_least_loaded`](crate::cache::InFlightStore::pick_least_loaded)),
//! deciding by [`least_loaded`], the one definition every adapter runs.
//!
//! Each call in flight is a **lease** at its deployment's key, ended by
//! [`InFlightStore::end_in_flight`](crate::cache::InFlightStore::end_in_flight)
//! when the call ends; a call whose future is dropped stops counting when its
//! lease runs out, so a crashed worker cannot make a deployment look busy for
//! good.

use std::time::Duration;

use crate::time::Timestamp;

/// The most deployments one pick weighs.
pub const MAX_DEPLOYMENTS: usize = 64;

/// What [`InFlightStore::pick_least_loaded`](crate::cache::InFlightStore::pick_least_loaded)
/// is asked.
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
pub(crate) fn check_pick(keys: &[&str], weights: &[u32]) -> Result<(), crate::error::CacheError> {
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
        Some(detail) => Err(crate::error::CacheError::Protocol {
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
}
