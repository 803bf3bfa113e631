//! One key's hit series: a buffer of instants, ascending, with a cursor
//! where the last window began.
//!
//! A limiter at its steady state asks for `[now − window, now]` with `now`
//! moving forward a little each call, so the window's first hit is at or just
//! after where it was last time. The cursor remembers that index and a lookup
//! walks a few hits forward from it; only a window that moved back, or far,
//! falls back to a binary search. The cursor is a hint, never a fact: every
//! answer is checked against the hits themselves, so a stale cursor costs time
//! and never a wrong count.
//!
//! Pruning is lazy. Each push sets the **floor** (`ttl` before `now`, on the
//! store's clock) and every read treats the hits below it as gone; they leave
//! the buffer when it is full, when the floor moves back (so that none
//! reappears), and when they would stretch the span the buffer's offsets
//! must reach (`ring.rs`). Over many tenants a tenant's buffer is out of cache between
//! its calls, and pruning on every push read its front — a third line
//! touched per decision, beside the window's start and the back
//! (BENCHMARKS.md).
//!
//! The buffer is a ring (`ring.rs`): dropping pruned hits never moves the
//! rest, its hits are 4-byte offsets from a base, and its small header lets
//! a tenant's id and its series' header share one cache line (`tenants.rs`;
//! the floor is kept as an offset too, for the header to fit). A lookup
//! turns `since` into an offset once and walks the offsets themselves,
//! asking once, not per hit, whether the buffer is narrow. It grows to the most hits the series
//! has held at once (to a power of two) and is reused after that — no
//! allocation per hit. The answers are those of a sorted list pruned on
//! every push, as the Redis scripts keep it; the property test below holds
//! the two together.

use std::time::Duration;

use super::ring::{Full, Offsets, Ring};
use crate::time::Timestamp;

/// Hits a lookup walks forward from the cursor before it binary-searches.
const WALK: usize = 8;

/// A key's hit instants and the series' deadline.
pub(super) struct Series {
    /// Hit instants, ascending.
    hits: Ring,
    /// When the series expires on the cache's clock.
    pub(super) deadline: Timestamp,
    /// Hits before this many microseconds after the buffer's base are
    /// pruned, whether or not they are still held; they are the buffer's
    /// front. Kept, as the hits are, against the base (the header stays
    /// within its line): a floor before the base is kept as the base, and
    /// one more than a word past it as a word past it (`set_floor`), each
    /// pruning the same hits as the real floor.
    floor: u32,
    /// Index of the first hit at or after the last `since` looked up: a
    /// hint (a ring holds at most 2³¹ hits, so it fits; its arithmetic
    /// saturates all the same).
    cursor: u32,
}

impl Series {
    /// A series holding one hit at `at`, living `ttl` from `now` — or none,
    /// when `at` is already more than `ttl` before `now` (pruned on arrival,
    /// as [`push`](Series::push) prunes every later hit).
    pub(super) fn first(at: Timestamp, ttl: Duration, now: Timestamp) -> Result<Series, Full> {
        let mut series = Series {
            hits: Ring::new(),
            // Past at `now`: the push gives the series its life.
            deadline: now,
            floor: 0,
            cursor: 0,
        };
        series.push(at, ttl, now)?;
        Ok(series)
    }

    /// A series with no hits and no buffer, expired at any instant: what a
    /// free slot holds (`slots.rs`).
    pub(super) fn none() -> Series {
        Series {
            hits: Ring::new(),
            deadline: Timestamp::EPOCH,
            floor: 0,
            cursor: 0,
        }
    }

    /// Hits in the buffer, pruned ones not yet dropped included: what the
    /// series spends memory on (at most twice the most hits it has held
    /// unpruned at once, or four).
    pub(super) fn held(&self) -> usize {
        self.hits.len()
    }

    /// Hits held and not pruned.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.hits.len() - self.hits.partition_point(|h| h < self.floor())
    }

    /// Hits before this instant are pruned.
    #[inline]
    fn floor(&self) -> Timestamp {
        Timestamp::from_micros(self.hits.base().as_micros() + u64::from(self.floor))
    }

    /// Prunes the hits before `floor` from now on, kept against the
    /// buffer's base: a floor more than a word past the base drops what it
    /// prunes and is kept as a word past it, which then prunes the same
    /// hits — none is held below the real one — with no hit rewritten.
    fn set_floor(&mut self, floor: Timestamp) {
        self.floor = match u32::try_from(self.hits.offset_of(floor)) {
            Ok(ahead) => ahead,
            Err(_) => {
                self.drop_below(floor);
                u32::MAX
            }
        };
    }

    /// Forgets every hit if the series has expired at `now` (keeping the
    /// buffer): what every lookup does before it reads a series.
    #[inline]
    pub(super) fn expire(&mut self, now: Timestamp) {
        if self.deadline <= now {
            self.clear();
        }
    }

    /// Forgets every hit (the series expired), keeping the buffer.
    pub(super) fn clear(&mut self) {
        self.hits.clear();
        self.cursor = 0;
    }

    /// Index of the first hit held at or after `since` (and the floor),
    /// and that hit; moves the cursor there.
    #[inline(always)]
    fn start(&mut self, since: Timestamp) -> (usize, Option<Timestamp>) {
        // As an offset from the base, as the floor is kept.
        let since = self.hits.offset_of(since).max(u64::from(self.floor));
        let hint = self.cursor as usize;
        let (found, offset) = match self.hits.narrow() {
            Some(offsets) => first_at_or_after(&offsets, since, hint),
            None => first_at_or_after(&self.hits, since, hint),
        };
        self.cursor = u32::try_from(found).unwrap_or(u32::MAX);
        // No overflow: the offset was taken from an instant after the base.
        let base = self.hits.base().as_micros();
        (found, offset.map(|offset| Timestamp::from_micros(base + offset)))
    }

    /// Hits at or after `since`.
    pub(super) fn count_since(&mut self, since: Timestamp) -> u64 {
        (self.hits.len() - self.start(since).0) as u64
    }

    /// The earliest hit at or after `since`.
    pub(super) fn oldest_since(&mut self, since: Timestamp) -> Option<Timestamp> {
        self.start(since).1
    }

    /// How many hits are at or after `since`, and the earliest of them.
    #[inline]
    pub(super) fn window(&mut self, since: Timestamp) -> (u64, Option<Timestamp>) {
        let (start, oldest) = self.start(since);
        ((self.hits.len() - start) as u64, oldest)
    }

    /// Adds a hit at `at`, extends the series' life to `ttl` from `now`, and
    /// prunes hits more than `ttl` older than `now` — the store's clock, never
    /// the newest stamp, so one caller's far-future stamp cannot prune
    /// everyone else's hits. [`Full`] when the hit would be one more than a
    /// buffer holds (`ring.rs`): then the hit is not held and the series'
    /// life not extended (the pruning stands, as the Redis scripts prune
    /// before they add).
    // Inlined: as a call it cost each acquire 11 instructions.
    #[inline(always)]
    pub(super) fn push(&mut self, at: Timestamp, ttl: Duration, now: Timestamp) -> Result<(), Full> {
        let floor = now.saturating_sub(ttl);
        // Compared as the floor is kept, against the base: a new floor
        // before the base reads as the base, and moved back only from a
        // kept floor past it (a kept floor at the base prunes nothing).
        if self.hits.offset_of(floor) < u64::from(self.floor) {
            // The clock moved back: what the old floor pruned stays pruned.
            self.drop_below(self.floor());
        }
        let held = if at >= floor { self.hold(at, floor) } else { Ok(()) };
        // The pruning stands whether or not the hit was held.
        self.set_floor(floor);
        held?;
        let deadline = now.saturating_add(ttl);
        self.deadline = if self.deadline <= now {
            deadline
        } else {
            self.deadline.max(deadline)
        };
        Ok(())
    }

    /// Puts a hit at `at`, at or after the new `floor`, in its place among
    /// the others.
    #[inline(always)]
    fn hold(&mut self, at: Timestamp, floor: Timestamp) -> Result<(), Full> {
        if self.hits.append_in_place(at) {
            return Ok(());
        }
        self.hold_elsewhere(at, floor)
    }

    /// [`hold`](Series::hold) when the hit does not go in the next slot of
    /// a narrow buffer with room: out of order, or the buffer full, wide or
    /// out of the hit's span.
    #[inline(never)]
    fn hold_elsewhere(&mut self, at: Timestamp, floor: Timestamp) -> Result<(), Full> {
        if self.hits.len() == self.hits.capacity() || !self.hits.fits(at) {
            // Full, or out of the buffer's span: make room, and narrow the
            // span, from what is pruned before growing or widening.
            self.drop_below(floor);
            // The common case: a full buffer with pruned hits at its front.
            if self.hits.append_in_place(at) {
                return Ok(());
            }
        }
        // In order, at the back, without a search over the buffer.
        let pos = match self.hits.last() {
            Some(last) if last > at => self.hits.partition_point(|h| h <= at),
            _ => self.hits.len(),
        };
        self.hits.insert(pos, at)?;
        if pos < self.cursor as usize {
            self.cursor = self.cursor.saturating_add(1);
        }
        Ok(())
    }

    /// Removes the buffer's hits before `floor`: walking from the front, over
    /// lines in order, where a binary search over a buffer out of cache would
    /// miss on every probe.
    fn drop_below(&mut self, floor: Timestamp) {
        let floor = self.hits.offset_of(floor);
        let gone = match self.hits.narrow() {
            Some(offsets) => count_before(&offsets, floor),
            None => count_before(&self.hits, floor),
        };
        self.hits.drop_front(gone);
        self.cursor = self.cursor.saturating_sub(u32::try_from(gone).unwrap_or(u32::MAX));
    }
}

/// Index of the first of `hits`' offsets at or after `since`, and that
/// offset, walking a few from the cursor `hint` before it binary-searches —
/// read through the narrow words when the buffer is narrow, so that no read
/// asks.
#[inline(always)]
fn first_at_or_after(hits: &impl Offsets, since: u64, hint: usize) -> (usize, Option<u64>) {
    let len = hits.len();
    let hint = hint.min(len);
    let found = if hint > 0 && hits.offset(hint - 1) >= since {
        // The window moved back: the start is before the cursor.
        search(hits, 0, hint - 1, since)
    } else {
        // The start is at or after the cursor: walk, then search.
        let mut i = hint;
        let stop = len.min(hint + WALK);
        while i < stop && hits.offset(i) < since {
            i += 1;
        }
        if i == stop && i < len && hits.offset(i) < since {
            search(hits, i, len, since)
        } else {
            i
        }
    };
    (found, (found < len).then(|| hits.offset(found)))
}

/// How many of `hits`' offsets, from the front, are before `floor`.
fn count_before(hits: &impl Offsets, floor: u64) -> usize {
    (0..hits.len()).take_while(|&i| hits.offset(i) < floor).count()
}

/// The first index in `lo..hi` whose offset is at or after `since`, given
/// that every offset before `lo` is earlier than `since` and every offset
/// from `hi` on is not.
fn search(hits: &impl Offsets, mut lo: usize, mut hi: usize, since: u64) -> usize {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if hits.offset(mid) < since {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(1_000_000);

    fn t(n: u64) -> Timestamp {
        Timestamp::from_secs(n)
    }

    fn series(hits: &[u64]) -> Series {
        let mut s = Series::first(t(hits[0]), TTL, t(0)).unwrap();
        for &h in &hits[1..] {
            s.push(t(h), TTL, t(0)).unwrap();
        }
        s
    }

    /// The hits held, in seconds.
    fn held(s: &Series) -> Vec<u64> {
        s.hits
            .iter()
            .filter(|h| *h >= s.floor())
            .map(|h| h.as_micros() / 1_000_000)
            .collect()
    }

    /// The answer a plain scan gives.
    fn scan(s: &Series, since: Timestamp) -> usize {
        s.hits.iter().take_while(|h| *h < since.max(s.floor())).count()
    }

    #[test]
    fn the_start_is_exact_wherever_the_cursor_was() {
        let hits: Vec<u64> = (0..100).map(|n| n * 3).collect();
        let mut s = series(&hits);
        // Forward in small steps, a long jump, back, far back, past the end.
        for since in [0, 1, 2, 3, 4, 10, 11, 200, 5, 0, 299, 300, 1_000, 150, 149, 151] {
            let expected = scan(&s, t(since));
            assert_eq!(s.start(t(since)).0, expected, "since {since}");
        }
    }

    #[test]
    fn a_stale_cursor_after_pruning_and_inserting_still_answers_exactly() {
        let mut s = series(&[10, 20, 30, 40, 50]);
        assert_eq!(s.start(t(45)).0, 4);
        // An out-of-order hit before the cursor, then a prune of two hits.
        s.push(t(15), TTL, t(0)).unwrap();
        assert_eq!(s.count_since(t(45)), 1);
        s.push(t(60), Duration::from_secs(45), t(70)).unwrap();
        assert_eq!(held(&s), [30, 40, 50, 60]);
        assert_eq!(s.len(), 4);
        for since in [0, 30, 31, 50, 61, 35] {
            let expected = scan(&s, t(since));
            assert_eq!(s.start(t(since)).0, expected, "since {since}");
        }
        assert_eq!(s.oldest_since(t(31)), Some(t(40)));
        assert_eq!(s.window(t(41)), (2, Some(t(50))));
    }

    #[test]
    fn equal_instants_are_counted_from_the_first() {
        let mut s = series(&[5, 5, 5, 7]);
        assert_eq!(s.start(t(6)).0, 3);
        assert_eq!(s.count_since(t(5)), 4);
    }

    #[test]
    fn a_first_hit_already_past_its_life_is_not_held() {
        let s = Series::first(t(10), Duration::from_secs(5), t(100)).unwrap();
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn hits_a_floor_pruned_stay_pruned_when_the_clock_moves_back() {
        let ttl = Duration::from_secs(10);
        let mut s = Series::first(t(100), ttl, t(100)).unwrap();
        s.push(t(101), ttl, t(101)).unwrap();
        // Now 111: the floor 101 prunes 100 (lazily: it is still held).
        s.push(t(111), ttl, t(111)).unwrap();
        assert_eq!(held(&s), [101, 111]);
        // The clock steps back to 105: floor 95, but 100 stays pruned.
        s.push(t(105), ttl, t(105)).unwrap();
        assert_eq!(held(&s), [101, 105, 111]);
        assert_eq!(s.count_since(t(0)), 3);
    }

    #[test]
    fn a_steady_state_prunes_only_when_the_buffer_is_full() {
        // The window slides one hit per push; the front is left alone until
        // the buffer is full, and the buffer stops growing.
        let ttl = Duration::from_secs(100);
        let mut s = Series::first(t(0), ttl, t(0)).unwrap();
        for n in 1..1_000u64 {
            let (count, oldest) = s.window(t(n.saturating_sub(50)));
            assert_eq!(count, n.min(50));
            assert_eq!(oldest, Some(t(n.saturating_sub(50))));
            s.push(t(n), ttl, t(n)).unwrap();
        }
        assert_eq!(s.len(), 101);
        assert!(s.hits.len() > 101, "pruned hits are still held: {}", s.hits.len());
        assert!(s.hits.capacity() <= 256, "{}", s.hits.capacity());
    }

    #[test]
    fn a_floor_far_past_a_wide_buffers_base_rewrites_no_hit() {
        let us = Timestamp::from_micros;
        let ttl = Duration::from_secs(7_200);
        // A hit now and one far ahead: a wide buffer based at the first.
        let far = 1_000_000_000_000;
        let mut s = Series::first(us(1_000), ttl, us(1_000)).unwrap();
        s.push(us(far), ttl, us(1_000)).unwrap();
        assert!(s.hits.narrow().is_none(), "wide");
        // The clock moves on 72 minutes a push: from the third its floor is
        // more than a word past the base, and the hits far ahead are kept.
        for step in 1..=6u64 {
            let now = us(1_000 + step * 4_320_000_000);
            s.push(us(far), ttl, now).unwrap();
            assert_eq!(s.hits.base(), us(1_000), "step {step}: no hit rewritten");
            let expected = if step == 1 {
                (3, Some(us(1_000)))
            } else {
                (step + 1, Some(us(far)))
            };
            assert_eq!(s.window(Timestamp::EPOCH), expected, "step {step}");
        }
    }

    /// A sorted list pruned on every push, as the Redis scripts keep it.
    #[derive(Default)]
    struct Eager {
        hits: Vec<Timestamp>,
    }

    impl Eager {
        fn push(&mut self, at: Timestamp, ttl: Duration, now: Timestamp) {
            let pos = self.hits.partition_point(|h| *h <= at);
            self.hits.insert(pos, at);
            let floor = now.saturating_sub(ttl);
            self.hits.retain(|h| *h >= floor);
        }

        fn window(&self, since: Timestamp) -> (u64, Option<Timestamp>) {
            let start = self.hits.partition_point(|h| *h < since);
            ((self.hits.len() - start) as u64, self.hits.get(start).copied())
        }
    }

    /// One step of the property test: a push, a read, or an expiry.
    #[derive(Clone, Debug)]
    enum Step {
        /// A hit stamped anywhere, on a clock anywhere.
        Push {
            at: u64,
            now: u64,
            ttl: u64,
        },
        /// The test's clock moves on by `by` and a hit is stamped then: the
        /// steady state, in order.
        Tick {
            by: u64,
        },
        /// At `since`, or `since` before the clock.
        Read {
            since: u64,
            relative: bool,
        },
        Clear,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            6 => (0u64..60, 0u64..60, 1u64..30).prop_map(|(at, now, ttl)| Step::Push { at, now, ttl }),
            // Mostly in order: the clock moves on and hits are stamped now.
            6 => (0u64..3).prop_map(|by| Step::Tick { by }),
            6 => (0u64..70, any::<bool>()).prop_map(|(since, relative)| Step::Read { since, relative }),
            1 => Just(Step::Clear),
        ]
    }

    proptest::proptest! {
        /// The series answers every read as a list pruned on every push does,
        /// through out-of-order stamps, a clock that steps back, full buffers
        /// and cursors left anywhere.
        ///
        /// The steps' numbers are `unit`s after `origin`: microseconds, where
        /// every span fits a narrow buffer; seconds; minutes and 17-minute
        /// units, where the hits held span more than a word of microseconds
        /// and the buffer rebases and turns wide.
        #[test]
        fn the_series_answers_as_a_list_pruned_on_every_push(
            steps in proptest::collection::vec(step(), 1..300),
            unit in proptest::sample::select(vec![1u64, 1_000_000, 60_000_000, 1_000_000_000]),
            origin in proptest::sample::select(vec![0u64, 1_700_000_000_000_000]),
        ) {
            let t = |n: u64| Timestamp::from_micros(origin + n * unit);
            let mut lazy: Option<Series> = None;
            let mut eager = Eager::default();
            let mut most = 0;
            // In-order steps are relative to a clock that moves forward.
            let mut clock = 0u64;
            for step in steps {
                let pushed = match step {
                    Step::Push { at, now, ttl } => Some((at, now, ttl)),
                    Step::Tick { by } => {
                        clock += by;
                        Some((clock, clock, 20))
                    }
                    Step::Read { since, relative } => {
                        let since = if relative { clock.saturating_sub(since) } else { since };
                        if let Some(series) = lazy.as_mut() {
                            proptest::prop_assert_eq!(series.window(t(since)), eager.window(t(since)));
                        }
                        None
                    }
                    Step::Clear => {
                        if let Some(series) = lazy.as_mut() {
                            series.clear();
                        }
                        eager.hits.clear();
                        None
                    }
                };
                if let Some((at, now, ttl)) = pushed {
                    let (at, ttl, now) = (t(at), Duration::from_micros(ttl * unit), t(now));
                    match lazy.as_mut() {
                        Some(series) => series.push(at, ttl, now).unwrap(),
                        None => lazy = Some(Series::first(at, ttl, now).unwrap()),
                    }
                    eager.push(at, ttl, now);
                    most = most.max(eager.hits.len());
                }
                if let Some(series) = lazy.as_mut() {
                    proptest::prop_assert_eq!(series.len(), eager.hits.len());
                    // The buffer grows no further than twice the most hits held.
                    proptest::prop_assert!(series.hits.capacity() <= (2 * most).max(4));
                }
            }
        }
    }
}
