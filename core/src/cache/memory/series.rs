//! One key's hit series: its instants, ascending, and when it expires.
//!
//! A series is a sorted list pruned on every push, as the Redis scripts keep
//! theirs: a push drops the hits more than `ttl` before the store's clock
//! from the front, so a series never holds more than one lifetime of hits,
//! and a read counts what is left. The instants live in a `VecDeque` that is
//! reused from push to push (hits leave at the front and arrive at the
//! back), so a series at its steady size allocates nothing.

use std::collections::VecDeque;
use std::time::Duration;

use crate::decide::window::freeing_rank;
use crate::time::Timestamp;

/// A hit the allocator had no room for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Full;

/// A key's hit instants and the series' deadline.
#[derive(Default)]
pub(super) struct Series {
    /// Hit instants, ascending.
    hits: VecDeque<Timestamp>,
    /// When the series expires on the cache's clock.
    pub(super) deadline: Timestamp,
}

impl Series {
    /// Hits held.
    pub(super) fn held(&self) -> usize {
        self.hits.len()
    }

    /// Whether the series has expired at `now`.
    pub(super) fn expired(&self, now: Timestamp) -> bool {
        self.deadline <= now
    }

    /// Forgets every hit if the series has expired at `now`, keeping the
    /// buffer: what every lookup does before it reads a series.
    pub(super) fn expire(&mut self, now: Timestamp) {
        if self.expired(now) {
            self.hits.clear();
        }
    }

    /// How many hits are at or after `since`, and the earliest of them.
    pub(super) fn window(&self, since: Timestamp) -> (u64, Option<Timestamp>) {
        let start = self.hits.partition_point(|h| *h < since);
        ((self.hits.len() - start) as u64, self.hits.get(start).copied())
    }

    /// How many hits are at or after `since`, and the one among them whose
    /// ageing out leaves room under `limit` (at
    /// [`freeing_rank`](crate::decide::window::freeing_rank): the earliest,
    /// unless the window holds more than `limit`).
    pub(super) fn slot(&self, since: Timestamp, limit: u32) -> (u64, Option<Timestamp>) {
        let start = self.hits.partition_point(|h| *h < since);
        let count = (self.hits.len() - start) as u64;
        let rank = usize::try_from(freeing_rank(count, limit)).unwrap_or(usize::MAX);
        (count, start.checked_add(rank).and_then(|i| self.hits.get(i)).copied())
    }

    /// Drops the hits more than `ttl` before `now` — the store's clock, never
    /// the newest stamp, so one caller's far-future stamp cannot prune
    /// everyone else's hits — then adds a hit at `at` (unless it is itself
    /// that old) and extends the series' life to `ttl` from `now`. [`Full`]
    /// when the allocator refuses the room: the hit is not held and the life
    /// not extended, the pruning stands (as the Redis scripts prune before
    /// they add).
    pub(super) fn push(&mut self, at: Timestamp, ttl: Duration, now: Timestamp) -> Result<(), Full> {
        let floor = now.saturating_sub(ttl);
        while self.hits.front().is_some_and(|h| *h < floor) {
            self.hits.pop_front();
        }
        if at >= floor {
            self.hits.try_reserve(1).map_err(|_| Full)?;
            // In order at the back, the steady state; else in its place.
            let pos = match self.hits.back() {
                Some(last) if *last > at => self.hits.partition_point(|h| *h <= at),
                _ => self.hits.len(),
            };
            self.hits.insert(pos, at);
        }
        let deadline = now.saturating_add(ttl);
        self.deadline = if self.expired(now) {
            deadline
        } else {
            self.deadline.max(deadline)
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u64) -> Timestamp {
        Timestamp::from_secs(n)
    }

    fn held(s: &Series) -> Vec<u64> {
        s.hits.iter().map(|h| h.as_micros() / 1_000_000).collect()
    }

    #[test]
    fn hits_keep_their_order_and_equal_instants_count_from_the_first() {
        let ttl = Duration::from_secs(1_000);
        let mut s = Series::default();
        for at in [10, 30, 20, 30, 5] {
            s.push(t(at), ttl, t(30)).unwrap();
        }
        assert_eq!(held(&s), [5, 10, 20, 30, 30]);
        assert_eq!(s.window(t(30)), (2, Some(t(30))));
        assert_eq!(s.window(t(11)), (3, Some(t(20))));
        assert_eq!(s.window(t(31)), (0, None));
        // Under a limit of 3, the 5 hits from 5 free a slot when the third
        // oldest (20) ages out; under 5 or more, when the oldest does.
        assert_eq!(s.slot(t(5), 3), (5, Some(t(20))));
        assert_eq!(s.slot(t(5), 5), (5, Some(t(5))));
        assert_eq!(s.slot(t(11), 9), (3, Some(t(20))));
        assert_eq!(s.slot(t(31), 1), (0, None));
    }

    #[test]
    fn a_push_prunes_by_the_stores_clock_and_a_hit_already_past_its_life_is_not_held() {
        let ttl = Duration::from_secs(10);
        let mut s = Series::default();
        s.push(t(100), ttl, t(100)).unwrap();
        s.push(t(101), ttl, t(101)).unwrap();
        // A stamp far ahead of the clock prunes nothing.
        s.push(t(500), ttl, t(105)).unwrap();
        assert_eq!(held(&s), [100, 101, 500]);
        // Now 111: the floor 101 prunes 100, and a hit at 99 is not held.
        s.push(t(99), ttl, t(111)).unwrap();
        assert_eq!(held(&s), [101, 500]);
        // The clock steps back to 105: what was pruned stays pruned.
        s.push(t(100), ttl, t(105)).unwrap();
        assert_eq!(held(&s), [100, 101, 500]);
        assert_eq!(s.deadline, t(121), "a life is never shortened");
    }

    #[test]
    fn an_expired_series_forgets_its_hits_and_lives_again_from_its_next_push() {
        let ttl = Duration::from_secs(10);
        let mut s = Series::default();
        assert!(s.expired(Timestamp::EPOCH));
        s.push(t(1), ttl, t(1)).unwrap();
        s.expire(t(10));
        assert_eq!(s.held(), 1);
        s.expire(t(11));
        assert_eq!((s.held(), s.window(Timestamp::EPOCH)), (0, (0, None)));
        s.push(t(12), ttl, t(12)).unwrap();
        assert_eq!(s.deadline, t(22));
    }
}
