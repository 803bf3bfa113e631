//! The buffer a hit series keeps its instants in: a ring whose capacity is a
//! power of two, so that dropping hits from the front never moves the rest
//! and finding a slot is an add and a mask, with a 24-byte header (where
//! `VecDeque`'s is 32) so that a tenant's id and its series' header share
//! one 64-byte cache line (`tenants.rs`).
//!
//! The price of the small header is a bound: a ring holds at most 2³¹
//! instants (16 GiB of them); asking it to hold more — or for room the
//! allocator cannot give — is an error its owner reports, never a panic.

use crate::time::Timestamp;

/// The most instants a ring holds.
const MAX_SLOTS: usize = 1 << 31;

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

/// Instants in a ring: `len` of them, the first at `head`, wrapping.
pub(super) struct Ring {
    /// A power of two of them, or none.
    slots: Box<[Timestamp]>,
    head: u32,
    len: u32,
}

impl Ring {
    /// An empty ring with no room.
    pub(super) fn new() -> Self {
        Ring {
            slots: Box::default(),
            head: 0,
            len: 0,
        }
    }

    /// Instants held.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len as usize
    }

    /// Instants the ring has room for.
    #[inline]
    pub(super) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Where the `i`th instant from the front lives.
    #[inline]
    fn slot(&self, i: usize) -> usize {
        (self.head as usize + i) & self.slots.len().wrapping_sub(1)
    }

    /// The `i`th instant from the front. `i` must be below `len`.
    #[inline]
    pub(super) fn at(&self, i: usize) -> Timestamp {
        debug_assert!(i < self.len());
        self.slots[self.slot(i)]
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

    /// Forgets every instant, keeping the room.
    pub(super) fn clear(&mut self) {
        self.head = 0;
        self.len = 0;
    }

    /// Appends `at`, growing first if the ring is full; [`Full`] when it
    /// already holds as many instants as a ring can.
    #[inline]
    pub(super) fn push(&mut self, at: Timestamp) -> Result<(), Full> {
        if self.len() == self.capacity() {
            self.grow()?;
        }
        let slot = self.slot(self.len());
        self.slots[slot] = at;
        self.len += 1;
        Ok(())
    }

    /// Puts `at` at `pos` (at most `len`), moving the instants after it back
    /// by one, growing first if the ring is full.
    pub(super) fn insert(&mut self, pos: usize, at: Timestamp) -> Result<(), Full> {
        debug_assert!(pos <= self.len());
        if self.len() == self.capacity() {
            self.grow()?;
        }
        let mut i = self.len();
        while i > pos {
            let (to, from) = (self.slot(i), self.slot(i - 1));
            self.slots[to] = self.slots[from];
            i -= 1;
        }
        let slot = self.slot(pos);
        self.slots[slot] = at;
        self.len += 1;
        Ok(())
    }

    /// Drops the first `n` instants (at most `len`) without moving the rest.
    pub(super) fn drop_front(&mut self, n: usize) {
        let n = n.min(self.len());
        // Both below the capacity, itself at most 2³¹.
        self.head = u32::try_from(self.slot(n)).unwrap_or(0);
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

    /// Doubles the room (to four, from none), the instants moving to the
    /// front of the new buffer in order; [`Full`], changing nothing, past
    /// the most a ring holds or when the allocator refuses.
    #[cold]
    fn grow(&mut self) -> Result<(), Full> {
        let capacity = self.capacity().saturating_mul(2).max(4);
        if capacity > most() {
            return Err(Full);
        }
        let mut slots = Vec::new();
        slots.try_reserve_exact(capacity).map_err(|_| Full)?;
        slots.extend(self.iter());
        slots.resize(capacity, Timestamp::EPOCH);
        self.slots = slots.into_boxed_slice();
        self.head = 0;
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
    fn the_header_is_24_bytes() {
        assert_eq!(size_of::<Ring>(), 24);
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
