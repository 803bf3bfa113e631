//! The buffer a hit series keeps its instants in: a ring whose capacity is a
//! power of two, so that dropping hits from the front never moves the rest
//! and finding a slot is an add and a mask, with a 32-byte header so that a
//! tenant's id and its series' header share one 64-byte cache line
//! (`tenants.rs`).
//!
//! An instant is kept as its offset from the ring's **base**, in four bytes
//! where its own microseconds take eight: a tenant at its limit holds about
//! `2 × rpm` hits, and over many tenants those buffers are what a decision
//! waits on memory for (BENCHMARKS.md). Four bytes of microseconds span 71
//! minutes; a ring whose instants span more than [`NARROW_SPAN`] (about 54
//! minutes: a limiter's series lives twice its window, so a window of more
//! than about 26 minutes), or that is given a stamp far from the rest,
//! keeps each offset in two words instead (**wide**). A ring moves its base
//! up as time moves on, when a new instant no longer fits (an add per
//! instant held, at most once per 2³⁰ microseconds), and down for an
//! instant earlier than every other.
//!
//! The price of the small header is a bound: a ring holds at most 2³¹
//! instants (8 GiB of them, 16 GiB wide); asking it to hold more — or for
//! room the allocator cannot give — is an error its owner reports, never a
//! panic.

use crate::time::Timestamp;

/// The most instants a ring holds.
const MAX_SLOTS: usize = 1 << 31;

/// The bit of `head` that says the ring is wide: a slot index stays below
/// the capacity, at most 2³¹, so it never reaches that bit — and masking
/// an index by the capacity drops it.
const WIDE: u32 = 1 << 31;

/// The widest span of instants a narrow ring takes on when it rebases: a
/// quarter of a four-byte offset's range stays free for the instants to
/// come, so a series moving forward in time rebases at most once per 2³⁰
/// microseconds (about 18 minutes), never once per push.
const NARROW_SPAN: u64 = (1 << 32) - (1 << 30);

#[cfg(test)]
thread_local! {
    /// The most instants a ring holds on this test's thread (a power of two):
    /// lowered by a test that fills a series to see what a full one does.
    pub(super) static MOST: std::cell::Cell<usize> = const { std::cell::Cell::new(MAX_SLOTS) };
}

/// The most instants a ring holds here: [`MAX_SLOTS`], or a unit test's
/// `MOST`. Asked only when a ring grows.
fn most() -> usize {
    #[cfg(test)]
    return MOST.get();
    #[cfg(not(test))]
    MAX_SLOTS
}

/// A ring asked to hold more instants than it can.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Full;

/// A ring's offsets from its base, front to back: what a walk over many
/// of them reads.
pub(super) trait Offsets {
    /// Offsets held.
    fn len(&self) -> usize;
    /// The `i`th from the front, in microseconds after the base. `i` must
    /// be below `len`.
    fn offset(&self, i: usize) -> u64;
}

/// A narrow ring's offsets, read with no question of width.
pub(super) struct Narrow<'a> {
    words: &'a [u32],
    head: usize,
    len: usize,
}

impl Offsets for Narrow<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    fn offset(&self, i: usize) -> u64 {
        u64::from(self.words[(self.head + i) & self.words.len().wrapping_sub(1)])
    }
}

impl Offsets for Ring {
    #[inline]
    fn len(&self) -> usize {
        self.len as usize
    }

    #[inline]
    fn offset(&self, i: usize) -> u64 {
        self.offset_in(self.slot(i))
    }
}

/// Instants in a ring: `len` of them, the first at `head`, wrapping, each
/// kept as its offset from `base`.
pub(super) struct Ring {
    /// The offsets: one word per slot, or two (high word first) when wide;
    /// a power of two of slots, or none.
    words: Box<[u32]>,
    /// The first instant's slot, and [`WIDE`].
    head: u32,
    len: u32,
    /// No instant held is earlier; in a narrow ring none is more than
    /// `u32::MAX` microseconds later.
    base: Timestamp,
}

impl Ring {
    /// An empty ring with no room.
    pub(super) fn new() -> Self {
        Ring {
            words: Box::default(),
            head: 0,
            len: 0,
            base: Timestamp::EPOCH,
        }
    }

    /// Instants held.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len as usize
    }

    /// The offsets, read one word each, when the ring is narrow.
    #[inline]
    pub(super) fn narrow(&self) -> Option<Narrow<'_>> {
        (!self.is_wide()).then_some(Narrow {
            words: &self.words,
            head: self.head as usize,
            len: self.len as usize,
        })
    }

    /// Whether each offset takes two words.
    #[inline]
    fn is_wide(&self) -> bool {
        self.head & WIDE != 0
    }

    /// Instants the ring has room for.
    #[inline]
    pub(super) fn capacity(&self) -> usize {
        self.words.len() >> (self.head >> 31)
    }

    /// No instant held is earlier: what the owner keeps its own instants
    /// relative to.
    #[inline]
    pub(super) fn base(&self) -> Timestamp {
        self.base
    }

    /// Where the `i`th instant from the front lives.
    #[inline]
    fn slot(&self, i: usize) -> usize {
        (self.head as usize + i) & self.capacity().wrapping_sub(1)
    }

    /// The offset kept in `slot`.
    #[inline]
    fn offset_in(&self, slot: usize) -> u64 {
        if self.is_wide() {
            (u64::from(self.words[2 * slot]) << 32) | u64::from(self.words[2 * slot + 1])
        } else {
            u64::from(self.words[slot])
        }
    }

    /// Keeps `offset` in `slot`; a narrow ring's offsets fit in a word
    /// (its callers see to it, [`fits`](Ring::fits)).
    #[inline]
    fn set_offset(&mut self, slot: usize, offset: u64) {
        if self.is_wide() {
            self.words[2 * slot] = (offset >> 32) as u32;
            self.words[2 * slot + 1] = offset as u32;
        } else {
            debug_assert!(offset <= u64::from(u32::MAX));
            self.words[slot] = offset as u32;
        }
    }

    /// The `i`th instant from the front. `i` must be below `len`.
    #[inline]
    pub(super) fn at(&self, i: usize) -> Timestamp {
        debug_assert!(i < self.len());
        // No overflow: the offset was taken from an instant at or after the base.
        Timestamp::from_micros(self.base.as_micros() + self.offset_in(self.slot(i)))
    }

    /// The `i`th instant from the front, if held.
    #[inline]
    pub(super) fn get(&self, i: usize) -> Option<Timestamp> {
        (i < self.len()).then(|| self.at(i))
    }

    /// The last instant.
    #[inline]
    pub(super) fn last(&self) -> Option<Timestamp> {
        self.len().checked_sub(1).map(|i| self.at(i))
    }

    /// `at`'s offset from the base, or 0 for an instant before it: as a
    /// bound to compare offsets with, it says the same of every instant
    /// held (none is before the base).
    #[inline]
    pub(super) fn offset_of(&self, at: Timestamp) -> u64 {
        at.as_micros().saturating_sub(self.base.as_micros())
    }

    /// Whether `at` can be kept against the present base.
    #[inline]
    pub(super) fn fits(&self, at: Timestamp) -> bool {
        at >= self.base && (self.is_wide() || at.as_micros() - self.base.as_micros() <= u64::from(u32::MAX))
    }

    /// Forgets every instant, keeping the room.
    pub(super) fn clear(&mut self) {
        self.head &= WIDE;
        self.len = 0;
    }

    /// Appends `at` when that takes one store: the ring narrow and not
    /// full, `at` at or after the last instant and within a word of the
    /// base. Whether it did.
    #[inline(always)]
    pub(super) fn append_in_place(&mut self, at: Timestamp) -> bool {
        let capacity = self.words.len();
        let Some(offset) = at.as_micros().checked_sub(self.base.as_micros()) else {
            return false;
        };
        let Ok(offset) = u32::try_from(offset) else {
            return false;
        };
        let len = self.len();
        // Wide, or full (an empty buffer is full).
        if self.is_wide() || len == capacity {
            return false;
        }
        let mask = capacity - 1;
        if len > 0 && self.words[(self.head as usize + len - 1) & mask] > offset {
            return false;
        }
        self.words[(self.head as usize + len) & mask] = offset;
        self.len += 1;
        true
    }

    /// Appends `at` (at or after the last instant), as
    /// [`insert`](Ring::insert) at the back.
    #[cfg(test)]
    pub(super) fn push(&mut self, at: Timestamp) -> Result<(), Full> {
        self.insert(self.len(), at)
    }

    /// Puts `at` at `pos` (at most `len`), moving the instants after it back
    /// by one: rebasing first if it does not fit against the base, and
    /// growing if the ring is full; [`Full`] when it already holds as many
    /// instants as a ring can, or the allocator refuses.
    pub(super) fn insert(&mut self, pos: usize, at: Timestamp) -> Result<(), Full> {
        debug_assert!(pos <= self.len());
        if !self.fits(at) {
            self.rebase(at)?;
        }
        if self.len() == self.capacity() {
            self.grow()?;
        }
        let mut i = self.len();
        while i > pos {
            let (to, from) = (self.slot(i), self.slot(i - 1));
            let offset = self.offset_in(from);
            self.set_offset(to, offset);
            i -= 1;
        }
        let slot = self.slot(pos);
        self.set_offset(slot, at.as_micros() - self.base.as_micros());
        self.len += 1;
        Ok(())
    }

    /// Drops the first `n` instants (at most `len`) without moving the rest.
    pub(super) fn drop_front(&mut self, n: usize) {
        let n = n.min(self.len());
        // Both below the capacity, itself at most 2³¹.
        self.head = u32::try_from(self.slot(n)).unwrap_or(0) | (self.head & WIDE);
        self.len -= u32::try_from(n).unwrap_or(self.len);
    }

    /// The first index whose instant fails `pred`, given that `pred` holds
    /// for a prefix of the ring and fails for the rest.
    pub(super) fn partition_point(&self, pred: impl Fn(Timestamp) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if pred(self.at(mid)) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The instants, front to back.
    pub(super) fn iter(&self) -> impl Iterator<Item = Timestamp> + '_ {
        (0..self.len()).map(|i| self.at(i))
    }

    /// Makes `at` fit: the base moves to the earlier of `at` and the front,
    /// and a narrow ring whose instants would then span more than
    /// [`NARROW_SPAN`] turns wide ([`Full`], changing nothing, when the
    /// allocator refuses the room).
    #[cold]
    fn rebase(&mut self, at: Timestamp) -> Result<(), Full> {
        let (Some(front), Some(back)) = (self.get(0), self.last()) else {
            self.base = at;
            return Ok(());
        };
        let (lo, hi) = (front.min(at), back.max(at));
        if self.is_wide() || hi.as_micros() - lo.as_micros() <= NARROW_SPAN {
            self.shift(lo);
            Ok(())
        } else {
            self.relayout(self.capacity(), true, lo)
        }
    }

    /// Keeps every instant against the base `to`, which none is earlier
    /// than, and in a narrow ring none more than a word later.
    fn shift(&mut self, to: Timestamp) {
        for i in 0..self.len() {
            let slot = self.slot(i);
            let at = self.base.as_micros() + self.offset_in(slot);
            self.set_offset(slot, at - to.as_micros());
        }
        self.base = to;
    }

    /// Doubles the room (to four, from none), the instants moving to the
    /// front of the new buffer in order; [`Full`], changing nothing, past
    /// the most a ring holds or when the allocator refuses.
    #[cold]
    fn grow(&mut self) -> Result<(), Full> {
        let capacity = self.capacity().saturating_mul(2).max(4);
        self.relayout(capacity, self.is_wide(), self.base)
    }

    /// A new buffer of `capacity` slots, wide or not, with the instants at
    /// its front against `base` (at or before the front); [`Full`],
    /// changing nothing, past the most a ring holds or when the allocator
    /// refuses.
    fn relayout(&mut self, capacity: usize, wide: bool, base: Timestamp) -> Result<(), Full> {
        if capacity > most() {
            return Err(Full);
        }
        let words_len = capacity.checked_mul(if wide { 2 } else { 1 }).ok_or(Full)?;
        let mut words = Vec::new();
        words.try_reserve_exact(words_len).map_err(|_| Full)?;
        for at in self.iter() {
            let offset = at.as_micros() - base.as_micros();
            if wide {
                words.extend([(offset >> 32) as u32, offset as u32]);
            } else {
                // A narrow ring's instants span at most a word: the error
                // only keeps a broken invariant from truncating one.
                words.push(u32::try_from(offset).map_err(|_| Full)?);
            }
        }
        words.resize(words_len, 0);
        self.words = words.into_boxed_slice();
        self.head = if wide { WIDE } else { 0 };
        self.base = base;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u64) -> Timestamp {
        Timestamp::from_secs(n)
    }

    fn held(ring: &Ring) -> Vec<u64> {
        ring.iter().map(|h| h.as_micros() / 1_000_000).collect()
    }

    #[test]
    fn the_header_is_32_bytes() {
        assert_eq!(size_of::<Ring>(), 32);
    }

    fn us(n: u64) -> Timestamp {
        Timestamp::from_micros(n)
    }

    /// Words the buffer holds per slot: 1 narrow, 2 wide.
    fn words_per_slot(ring: &Ring) -> usize {
        ring.words.len() / ring.capacity()
    }

    #[test]
    fn instants_take_four_bytes_each_while_they_span_less_than_a_word() {
        let mut ring = Ring::new();
        // Far from the epoch, as every real instant is.
        let start = 1_700_000_000_000_000;
        for n in 0..1_000 {
            ring.push(us(start + n * 60_000)).unwrap();
        }
        assert_eq!(
            (ring.capacity(), ring.words.len(), words_per_slot(&ring)),
            (1_024, 1_024, 1)
        );
        assert_eq!(ring.base(), us(start));
        assert_eq!(
            ring.iter().collect::<Vec<_>>(),
            (0..1_000).map(|n| us(start + n * 60_000)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_ring_whose_instants_span_more_than_a_word_turns_wide_and_keeps_them_exact() {
        let mut ring = Ring::new();
        let held = [10, 11, 11 + u64::from(u32::MAX), u64::MAX - 1, u64::MAX];
        for at in held {
            ring.push(us(at)).unwrap();
        }
        assert!(ring.is_wide());
        assert_eq!(words_per_slot(&ring), 2);
        // Before everything held: the base moves down.
        ring.insert(0, us(3)).unwrap();
        assert_eq!(ring.base(), us(3));
        let mut expected = vec![3];
        expected.extend(held);
        assert_eq!(ring.iter().map(Timestamp::as_micros).collect::<Vec<_>>(), expected);
        // It grows wide, and a clear keeps the room as it is.
        for _ in 0..4 {
            ring.push(us(u64::MAX)).unwrap();
        }
        assert_eq!((ring.capacity(), words_per_slot(&ring)), (16, 2));
        ring.clear();
        assert_eq!((ring.len(), ring.capacity(), ring.last()), (0, 16, None));
    }

    #[test]
    fn a_ring_moving_forward_for_hours_stays_narrow_and_rebases_from_time_to_time() {
        let mut ring = Ring::new();
        let start = 1_700_000_000_000_000u64;
        let mut rebases = 0;
        // One instant a second for five hours, the front dropped past two
        // minutes: far more than a word of microseconds from the first.
        for n in 0..5 * 3_600u64 {
            let base = ring.base();
            ring.push(us(start + n * 1_000_000)).unwrap();
            let front = ring
                .iter()
                .take_while(|at| at.as_micros() < start + n.saturating_sub(120) * 1_000_000)
                .count();
            ring.drop_front(front);
            if ring.base() != base {
                rebases += 1;
            }
            assert_eq!(ring.last(), Some(us(start + n * 1_000_000)));
        }
        assert!(!ring.is_wide());
        assert!(ring.capacity() <= 128, "{}", ring.capacity());
        // The first push sets the base; after that, one rebase per 2³⁰ µs or more.
        assert!((2..=1 + 5 * 3_600 / 1_073).contains(&rebases), "{rebases}");
        assert_eq!(ring.get(0), Some(us(start + (5 * 3_600 - 121) * 1_000_000)));
    }

    #[test]
    fn instants_wrap_around_and_keep_their_order() {
        let mut ring = Ring::new();
        assert_eq!((ring.len(), ring.last(), ring.get(0)), (0, None, None));
        for n in 1..=4 {
            ring.push(t(n)).unwrap();
        }
        assert_eq!(ring.capacity(), 4);
        ring.drop_front(3);
        assert_eq!(held(&ring), [4]);
        ring.push(t(6)).unwrap();
        ring.push(t(7)).unwrap();
        // Wrapped: 4 is in the last slot, 6 and 7 in the first two.
        ring.insert(1, t(5)).unwrap();
        assert_eq!((ring.capacity(), held(&ring)), (4, vec![4, 5, 6, 7]));
        assert_eq!((ring.get(3), ring.get(4), ring.last()), (Some(t(7)), None, Some(t(7))));
        assert_eq!(ring.partition_point(|h| h < t(6)), 2);
        assert_eq!(ring.partition_point(|h| h < t(100)), 4);
        // Full: the insert grows it, unwrapping.
        ring.insert(0, t(3)).unwrap();
        assert_eq!((ring.capacity(), held(&ring)), (8, vec![3, 4, 5, 6, 7]));
        ring.drop_front(10);
        assert_eq!((ring.len(), ring.last()), (0, None));
        ring.push(t(9)).unwrap();
        ring.clear();
        assert_eq!(held(&ring), Vec::<u64>::new());
    }

    #[test]
    fn a_ring_never_grows_past_its_most_and_says_so() {
        MOST.set(8);
        let mut ring = Ring::new();
        for n in 0..8 {
            ring.push(t(n)).unwrap();
        }
        assert_eq!(ring.push(t(8)), Err(Full));
        assert_eq!(ring.insert(0, t(0)), Err(Full));
        assert_eq!((ring.len(), ring.capacity()), (8, 8), "nothing changed");
        ring.drop_front(1);
        assert_eq!(ring.push(t(8)), Ok(()));
        assert_eq!(held(&ring), (1..=8).collect::<Vec<_>>());
    }
}
