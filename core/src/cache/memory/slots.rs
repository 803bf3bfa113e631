//! A shard's slots: where a limiter's tenants are found without the shard's
//! lock, each behind a lock of its own on cache lines of its own.
//!
//! Two cores deciding for tenants of one shard both wrote the shard's lock
//! on every call, and that line moved between them on about every other
//! call: it is what two threads over many tenants lost to a keyed GCRA
//! limiter (BENCHMARKS.md). A decision for a tenant that holds a slot writes
//! no line of the shard's (but one decision in 65, which takes the shard's
//! lock): only its cell (the lock, and the series' header on the next
//! line) and its ring's back.
//!
//! # Exactness
//!
//! Each slot holds a tenant's name in atomics and, once made, a cell: the
//! series behind a mutex, the lock on one line and what it guards on the
//! next (a thread waiting for the lock reads its line without taking the
//! one the holder writes: two threads on one tenant ran 3–6 % faster so
//! than with both on one line, two threads over 1 000 tenants 3–11 %
//! slower, still well ahead of governor — BENCHMARKS.md). The names sit in
//! the slot table, which only a change of tenant writes, so every core
//! keeps a copy.
//!
//! - A slot's name changes only under the shard's lock **and** its cell's
//!   lock, and only to a tenant found nowhere (a free slot, or one whose
//!   series has expired and so counts nothing) — but for a slot's first
//!   name, written under the shard's lock before its cell is made: a lookup
//!   reaches a slot only through its cell, which is published after.
//! - A lock-free lookup ([`Slots::find`]) probes for the name, locks the
//!   cell and reads the name again: under the cell's lock it cannot change,
//!   so a decision made there is on the tenant's one series. A name that
//!   changed meanwhile sends the caller to the shard's lock.
//! - Under the shard's lock a tenant is looked for in its slots and then in
//!   the shard's table (`tenants.rs`), and made in one of them only when it
//!   is in neither: no tenant has two series.
//! - A slot's cell, once made, is never unmade, and a tenant is placed in
//!   the first slot of its probe sequence that is free, has no cell yet or
//!   holds an expired series: so a probe may stop at the first slot with
//!   no cell.
//!
//! # Memory
//!
//! The table (64 slots of 40 bytes) is made with a shard's first tenant, a
//! cell (128 bytes and the ring) with a slot's first tenant. A sweep frees an
//! expired tenant's slot and its ring's buffer; a tenant beyond the table's
//! room (or its probe's reach) lives in the shard's table, as every tenant
//! did before.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Mutex, MutexGuard};

use super::names::TenantName;
use super::series::Series;
use crate::time::Timestamp;

/// Slots per shard: a power of two.
const SLOTS: usize = 64;

/// Slots a tenant's probe visits from its first.
const PROBE: usize = 16;

/// Decisions a cell takes without the shard's lock before the next goes
/// through it (one in 65): a shard's sweep is paced by the operations under
/// its lock, and this keeps a busy slot counting toward it.
pub(super) const UNLOCKED_RUN: u32 = 64;

/// A tenant's series behind its own lock: the lock on a line of its own
/// (`Held` is line-aligned), the series on the next.
struct Cell {
    lock: Mutex<Held>,
}

// The point of the layout: the lock and the series' header on two lines.
const _: () = assert!(size_of::<Cell>() == 128 && align_of::<Cell>() == 64);

/// What a cell's lock guards, on a line of its own.
#[repr(align(64))]
pub(super) struct Held {
    /// The tenant's series (one with no hits and no buffer while the slot
    /// is free).
    pub(super) series: Series,
    /// Decisions left before one goes through the shard's lock.
    pub(super) unlocked: u32,
}

/// A slot: a tenant's name, and its cell once made.
struct Slot {
    /// The tenant's prefix id plus one; 0 while the slot is free.
    prefix: AtomicU32,
    /// The tenant's id, high and low words.
    high: AtomicU64,
    low: AtomicU64,
    cell: OnceLock<Box<Cell>>,
}

impl Slot {
    fn new() -> Self {
        Slot {
            prefix: AtomicU32::new(0),
            high: AtomicU64::new(0),
            low: AtomicU64::new(0),
            cell: OnceLock::new(),
        }
    }

    /// Whether the slot names `name` (exact under the cell's lock, or the
    /// shard's).
    #[inline(always)]
    fn names(&self, name: TenantName) -> bool {
        self.prefix.load(Ordering::Relaxed) == name.prefix + 1
            && self.low.load(Ordering::Relaxed) == name.tenant as u64
            && self.high.load(Ordering::Relaxed) == (name.tenant >> 64) as u64
    }

    /// Whether the slot names no tenant.
    fn is_free(&self) -> bool {
        self.prefix.load(Ordering::Relaxed) == 0
    }

    /// Names `name` (under the shard's lock and the cell's).
    fn set_name(&self, name: Option<TenantName>) {
        let (prefix, tenant) = name.map_or((0, 0), |n| (n.prefix + 1, n.tenant));
        self.high.store((tenant >> 64) as u64, Ordering::Relaxed);
        self.low.store(tenant as u64, Ordering::Relaxed);
        self.prefix.store(prefix, Ordering::Relaxed);
    }
}

/// A locked cell: its tenant's series, found by [`Slots::find`] or under
/// the shard's lock.
pub(super) type CellGuard<'a> = MutexGuard<'a, Held>;

/// A shard's slots, on a line of their own in the shard: every decision in
/// a slot reads the table's pointer, and no field of the shard's lock
/// shares the line (`named`, beside the pointer, changes only as a tenant
/// takes or leaves a slot).
#[derive(Default)]
#[repr(align(64))]
pub(super) struct Slots {
    table: OnceLock<Box<[Slot; SLOTS]>>,
    /// Slots naming a tenant (written under the shard's lock).
    named: AtomicUsize,
}

/// The first slot of `name`'s probe: middle bits of its hash (the shard
/// was chosen by the top ones, so within a shard these still vary), mixed
/// with its prefix.
#[inline]
fn first_slot(name: TenantName) -> usize {
    let mixed = name.hash() ^ u64::from(name.prefix).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (mixed >> 20) as usize & (SLOTS - 1)
}

impl Slots {
    /// The slot naming `name` and its cell, probing from its first slot
    /// up to the first with no cell.
    #[inline(always)]
    fn locate(&self, name: TenantName) -> Option<(&Slot, &Cell)> {
        let table = self.table.get()?;
        let first = first_slot(name);
        for i in 0..PROBE {
            let slot = &table[(first + i) & (SLOTS - 1)];
            let cell = slot.cell.get()?;
            if slot.names(name) {
                return Some((slot, cell));
            }
        }
        None
    }

    /// `name`'s cell, locked, if a slot names it — without the shard's
    /// lock. `None` sends the caller to the shard's lock (the tenant is
    /// elsewhere, nowhere, or changing place).
    #[inline]
    pub(super) fn find(&self, name: TenantName) -> Option<CellGuard<'_>> {
        let (slot, cell) = self.locate(name)?;
        let held = cell.lock.lock();
        // Under the cell's lock the name cannot change: read it again.
        slot.names(name).then_some(held)
    }

    /// `name`'s cell, locked, if a slot names it; under the shard's lock,
    /// where that is the whole answer.
    pub(super) fn get(&self, name: TenantName) -> Option<CellGuard<'_>> {
        let (_, cell) = self.locate(name)?;
        Some(cell.lock.lock())
    }

    /// Places `series` as `name`'s (found nowhere: the caller holds the
    /// shard's lock and looked) in the first slot of its probe that is
    /// free, has no cell yet, or holds a series expired at `now`; gives it
    /// back when there is none.
    pub(super) fn place(&self, name: TenantName, series: Series, now: Timestamp) -> Result<(), Series> {
        let table = self
            .table
            .get_or_init(|| Box::new(std::array::from_fn(|_| Slot::new())));
        let first = first_slot(name);
        for i in 0..PROBE {
            let slot = &table[(first + i) & (SLOTS - 1)];
            let Some(cell) = slot.cell.get() else {
                slot.set_name(Some(name));
                self.named.fetch_add(1, Ordering::Relaxed);
                let made = slot.cell.set(Box::new(Cell {
                    lock: Mutex::new(Held {
                        series,
                        unlocked: UNLOCKED_RUN,
                    }),
                }));
                debug_assert!(made.is_ok(), "cells are made under the shard's lock");
                return Ok(());
            };
            let mut held = cell.lock.lock();
            let free = slot.is_free();
            if free || held.series.deadline <= now {
                if free {
                    self.named.fetch_add(1, Ordering::Relaxed);
                }
                slot.set_name(Some(name));
                held.series = series;
                held.unlocked = UNLOCKED_RUN;
                return Ok(());
            }
        }
        Err(series)
    }

    /// Frees `name`'s slot, if one names it, and its buffer.
    pub(super) fn remove(&self, name: TenantName) {
        if let Some((slot, cell)) = self.locate(name) {
            self.free(slot, &mut cell.lock.lock());
        }
    }

    /// Frees `slot`, whose cell's lock `held` is, and its buffer (under
    /// the shard's lock too).
    fn free(&self, slot: &Slot, held: &mut Held) {
        slot.set_name(None);
        held.series = Series::none();
        self.named.fetch_sub(1, Ordering::Relaxed);
    }

    /// Frees every slot whose series `keep` turns down, and its buffer.
    pub(super) fn retain(&self, mut keep: impl FnMut(&Series) -> bool) {
        for (slot, cell) in self.cells() {
            if slot.is_free() {
                continue;
            }
            let mut held = cell.lock.lock();
            if !keep(&held.series) {
                self.free(slot, &mut held);
            }
        }
    }

    /// Calls `f` with every named slot's series.
    pub(super) fn for_each(&self, mut f: impl FnMut(&Series)) {
        for (slot, cell) in self.cells() {
            if !slot.is_free() {
                f(&cell.lock.lock().series);
            }
        }
    }

    /// Slots naming a tenant.
    pub(super) fn len(&self) -> usize {
        self.named.load(Ordering::Relaxed)
    }

    /// Frees every slot and its buffer (the cells stay, empty).
    pub(super) fn clear(&self) {
        self.retain(|_| false);
    }

    /// Every slot with a cell.
    fn cells(&self) -> impl Iterator<Item = (&Slot, &Cell)> {
        self.table
            .get()
            .into_iter()
            .flat_map(|t| t.iter())
            .filter_map(|slot| slot.cell.get().map(|cell| (slot, &**cell)))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn t(secs: u64) -> Timestamp {
        Timestamp::from_secs(secs)
    }

    /// A series with one hit at `at`, living until `at + 100 s`.
    fn series(at: u64) -> Series {
        Series::first(t(at), Duration::from_secs(100), t(at)).unwrap()
    }

    /// `count` names under prefix 0 whose probes start at the same slot.
    fn colliding(count: usize) -> Vec<TenantName> {
        let first = first_slot(TenantName::new(0, 0));
        (0u128..)
            .map(|id| TenantName::new(0, id))
            .filter(|name| first_slot(*name) == first)
            .take(count)
            .collect()
    }

    /// The instant of the first hit of the series a lookup finds.
    fn first_hit(held: &mut CellGuard<'_>) -> Option<Timestamp> {
        held.series.oldest_since(Timestamp::EPOCH)
    }

    #[test]
    fn a_tenant_is_found_under_its_own_name_only() {
        let slots = Slots::default();
        assert!(slots.find(TenantName::new(0, 7)).is_none(), "no table yet");
        slots.place(TenantName::new(0, 7), series(1), t(1)).ok().unwrap();
        slots.place(TenantName::new(3, 7), series(2), t(1)).ok().unwrap();
        let mut held = slots.find(TenantName::new(0, 7)).unwrap();
        assert_eq!(first_hit(&mut held), Some(t(1)));
        drop(held);
        let mut held = slots.find(TenantName::new(3, 7)).unwrap();
        assert_eq!(first_hit(&mut held), Some(t(2)));
        drop(held);
        assert!(slots.find(TenantName::new(0, 8)).is_none());
        assert!(slots.find(TenantName::new(1, 7)).is_none());
        // A tenant id whose low word matches and high word does not.
        assert!(slots.find(TenantName::new(0, 7 | (1 << 64))).is_none());
        assert_eq!(slots.len(), 2);
    }

    #[test]
    fn an_expired_tenants_slot_is_taken_by_the_next_and_a_live_ones_is_not() {
        let [a, b, c] = colliding(3)[..] else { unreachable!() };
        let slots = Slots::default();
        slots.place(a, series(0), t(0)).ok().unwrap();
        // At 50 s `a` lives (until 100 s): `b` takes the next slot.
        slots.place(b, series(50), t(50)).ok().unwrap();
        assert_eq!(slots.len(), 2);
        // At 120 s `a` has expired and `b` lives: `c` takes `a`'s slot.
        slots.place(c, series(120), t(120)).ok().unwrap();
        assert_eq!(slots.len(), 2, "a slot changed hands; none was added");
        assert!(slots.find(a).is_none(), "the expired tenant is gone");
        assert_eq!(first_hit(&mut slots.find(b).unwrap()), Some(t(50)));
        assert_eq!(first_hit(&mut slots.find(c).unwrap()), Some(t(120)));
        let table = slots.table.get().unwrap();
        assert!(table[first_slot(c)].names(c), "in the first slot of its probe");
    }

    #[test]
    fn a_probe_whose_every_slot_is_live_gives_the_series_back() {
        let names = colliding(PROBE + 1);
        let slots = Slots::default();
        for name in &names[..PROBE] {
            slots.place(*name, series(0), t(0)).ok().unwrap();
        }
        let refused = slots.place(names[PROBE], series(5), t(5));
        assert_eq!(refused.err().map(|s| s.held()), Some(1), "the series comes back whole");
        assert!(slots.find(names[PROBE]).is_none());
        assert_eq!(slots.len(), PROBE);
    }

    #[test]
    fn removing_and_sweeping_free_the_slot_and_its_buffer() {
        let [a, b, c] = colliding(3)[..] else { unreachable!() };
        let slots = Slots::default();
        slots.place(a, series(0), t(0)).ok().unwrap();
        slots.place(b, series(50), t(50)).ok().unwrap();
        slots.place(c, series(60), t(60)).ok().unwrap();
        slots.remove(a);
        slots.remove(a);
        assert_eq!(slots.len(), 2);
        assert!(slots.find(a).is_none());
        // `b`'s probe still reaches it past the freed slot.
        assert!(slots.find(b).is_some());
        slots.retain(|s| s.deadline > t(155));
        assert_eq!(slots.len(), 1);
        assert!(slots.find(b).is_none());
        let mut buffers = 0;
        slots.for_each(|s| buffers += s.held());
        assert_eq!(buffers, 1, "only `c`'s hit is held");
        // The freed cells hold no buffer.
        let table = slots.table.get().unwrap();
        let free: Vec<usize> = table
            .iter()
            .filter(|s| s.is_free())
            .filter_map(|s| s.cell.get())
            .map(|cell| cell.lock.lock().series.held())
            .collect();
        assert_eq!(free, [0, 0]);
        slots.clear();
        assert_eq!(slots.len(), 0);
        assert!(slots.find(c).is_none());
    }

    #[test]
    fn a_lookup_that_waited_while_its_slot_changed_hands_finds_nothing() {
        let [a, b] = colliding(2)[..] else { unreachable!() };
        let slots = Slots::default();
        slots.place(a, series(0), t(0)).ok().unwrap();
        let table = slots.table.get().unwrap();
        let slot = &table[first_slot(a)];
        // Hold `a`'s cell (as the shard's lock would, to hand the slot on),
        // let a lookup for `a` start and wait on it, then hand the slot to `b`.
        let held = slots.get(a).unwrap();
        std::thread::scope(|s| {
            let lookup = s.spawn(|| slots.find(a).map(|mut held| first_hit(&mut held)));
            std::thread::sleep(Duration::from_millis(50));
            slot.set_name(Some(b));
            drop(held);
            assert_eq!(lookup.join().unwrap(), None, "the lookup read the name again");
        });
    }
}
