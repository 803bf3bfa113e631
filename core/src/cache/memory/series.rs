//! One key's hit series: a ring buffer of instants, ascending, with a cursor
//! where the last window began.
//!
//! A limiter at its steady state asks for `[now − window, now]` with `now`
//! moving forward a little each call, so the window's first hit is at or just
//! after where it was last time. The cursor remembers that index and a lookup
//! walks a few hits forward from it; only a window that moved back, or far,
//! falls back to a binary search. The cursor is a hint, never a fact: every
//! answer is checked against the hits themselves, so a stale cursor costs time
//! and never a wrong count. The buffer grows to the most hits the series has
//! held at once and is reused after that — no allocation per hit.

use std::collections::VecDeque;
use std::time::Duration;

use crate::time::Timestamp;

/// Hits a lookup walks forward from the cursor before it binary-searches.
const WALK: usize = 8;

/// A key's hit instants and the series' deadline.
pub(super) struct Series {
    /// Hit instants, ascending.
    hits: VecDeque<Timestamp>,
    /// When the series expires on the cache's clock.
    pub(super) deadline: Timestamp,
    /// Index of the first hit at or after the last `since` looked up: a hint.
    cursor: usize,
}

impl Series {
    /// A series holding one hit at `at`, living `ttl` from `now` — or none,
    /// when `at` is already more than `ttl` before `now` (pruned on arrival,
    /// as [`push`](Series::push) prunes every later hit).
    pub(super) fn first(at: Timestamp, ttl: Duration, now: Timestamp) -> Series {
        let hits = if at >= now.saturating_sub(ttl) {
            VecDeque::from([at])
        } else {
            VecDeque::new()
        };
        Series {
            hits,
            deadline: now.saturating_add(ttl),
            cursor: 0,
        }
    }

    /// Hits held.
    pub(super) fn len(&self) -> usize {
        self.hits.len()
    }

    /// Forgets every hit (the series expired), keeping the buffer.
    pub(super) fn clear(&mut self) {
        self.hits.clear();
        self.cursor = 0;
    }

    /// Index of the first hit at or after `since`; moves the cursor there.
    pub(super) fn start(&mut self, since: Timestamp) -> usize {
        let len = self.hits.len();
        let hint = self.cursor.min(len);
        let found = if hint > 0 && self.hits[hint - 1] >= since {
            // The window moved back: the start is before the cursor.
            self.search(0, hint - 1, since)
        } else {
            // The start is at or after the cursor: walk, then search.
            let mut i = hint;
            let stop = len.min(hint + WALK);
            while i < stop && self.hits[i] < since {
                i += 1;
            }
            if i == stop && i < len && self.hits[i] < since {
                self.search(i, len, since)
            } else {
                i
            }
        };
        self.cursor = found;
        found
    }

    /// The first index in `lo..hi` whose hit is at or after `since`, given
    /// that every hit before `lo` is earlier than `since` and every hit from
    /// `hi` on is not.
    fn search(&self, mut lo: usize, mut hi: usize, since: Timestamp) -> usize {
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.hits[mid] < since {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Hits at or after `since`.
    pub(super) fn count_since(&mut self, since: Timestamp) -> u64 {
        (self.hits.len() - self.start(since)) as u64
    }

    /// The earliest hit at or after `since`.
    pub(super) fn oldest_since(&mut self, since: Timestamp) -> Option<Timestamp> {
        let start = self.start(since);
        self.hits.get(start).copied()
    }

    /// How many hits are at or after `since`, and the earliest of them.
    pub(super) fn window(&mut self, since: Timestamp) -> (u64, Option<Timestamp>) {
        let start = self.start(since);
        ((self.hits.len() - start) as u64, self.hits.get(start).copied())
    }

    /// Adds a hit at `at`, extends the series' life to `ttl` from `now`, and
    /// drops hits more than `ttl` older than `now` — the store's clock, never
    /// the newest stamp, so one caller's far-future stamp cannot prune
    /// everyone else's hits.
    pub(super) fn push(&mut self, at: Timestamp, ttl: Duration, now: Timestamp) {
        if self.hits.back().is_none_or(|last| *last <= at) {
            self.hits.push_back(at);
        } else {
            let pos = self.hits.partition_point(|h| *h <= at);
            self.hits.insert(pos, at);
            if pos < self.cursor {
                self.cursor += 1;
            }
        }
        let deadline = now.saturating_add(ttl);
        self.deadline = if self.deadline <= now {
            deadline
        } else {
            self.deadline.max(deadline)
        };
        let floor = now.saturating_sub(ttl);
        while self.hits.front().is_some_and(|h| *h < floor) {
            self.hits.pop_front();
            self.cursor = self.cursor.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(1_000_000);

    fn t(n: u64) -> Timestamp {
        Timestamp::from_secs(n)
    }

    fn series(hits: &[u64]) -> Series {
        let mut s = Series::first(t(hits[0]), TTL, t(0));
        for &h in &hits[1..] {
            s.push(t(h), TTL, t(0));
        }
        s
    }

    /// The answer a plain scan gives.
    fn scan(s: &Series, since: Timestamp) -> usize {
        s.hits.iter().take_while(|h| **h < since).count()
    }

    #[test]
    fn the_start_is_exact_wherever_the_cursor_was() {
        let hits: Vec<u64> = (0..100).map(|n| n * 3).collect();
        let mut s = series(&hits);
        // Forward in small steps, a long jump, back, far back, past the end.
        for since in [0, 1, 2, 3, 4, 10, 11, 200, 5, 0, 299, 300, 1_000, 150, 149, 151] {
            let expected = scan(&s, t(since));
            assert_eq!(s.start(t(since)), expected, "since {since}");
        }
    }

    #[test]
    fn a_stale_cursor_after_pruning_and_inserting_still_answers_exactly() {
        let mut s = series(&[10, 20, 30, 40, 50]);
        assert_eq!(s.start(t(45)), 4);
        // An out-of-order hit before the cursor, then a prune of two hits.
        s.push(t(15), TTL, t(0));
        assert_eq!(s.count_since(t(45)), 1);
        s.push(t(60), Duration::from_secs(45), t(70));
        assert_eq!(
            s.hits.iter().map(|h| h.as_micros() / 1_000_000).collect::<Vec<_>>(),
            [30, 40, 50, 60]
        );
        for since in [0, 30, 31, 50, 61, 35] {
            let expected = scan(&s, t(since));
            assert_eq!(s.start(t(since)), expected, "since {since}");
        }
        assert_eq!(s.oldest_since(t(31)), Some(t(40)));
        assert_eq!(s.window(t(41)), (2, Some(t(50))));
    }

    #[test]
    fn equal_instants_are_counted_from_the_first() {
        let mut s = series(&[5, 5, 5, 7]);
        assert_eq!(s.start(t(6)), 3);
        assert_eq!(s.count_since(t(5)), 4);
    }
}
