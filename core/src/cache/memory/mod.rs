//! `MemoryCache`: the in-process adapter, and the default.
//!
//! It is not a test double: one process with a `MemoryCache` limits and breaks
//! correctly. Its only limitation is that processes cannot share it.
//!
//! # Exactness and sharding
//!
//! The keys are split over [`SHARDS`] shards, each behind its own mutex, so
//! tenants on different shards never wait for each other. A key that begins
//! with a **hash tag** (`{…}`, as a breaker's five keys `{prefix}:state`, …
//! do, so that Redis Cluster puts them in one slot) lives on one shard with
//! every other tagged key; a limiter's `{prefix}:{tenant}` key is placed by
//! its tenant's id, and every other key by its hash, over the rest. Telling
//! them apart costs one byte, and a breaker's step finds its five keys
//! together without hashing any of them. (A limiter prefix that begins with
//! `{` puts all its tenants on the tagged shard: still exact, only not
//! spread.) A limiter's tenant is looked up by id, never by formatting its
//! key (`names.rs`); the key names the same series.
//!
//! Every operation locks the shards its keys live on (one, for every key the
//! crate builds), so each atomic operation is still one critical section for
//! its keys and racing tasks in one process see exactly the answers a single
//! caller would — with two exceptions. A breaker step over an empty store
//! that writes nothing needs no lock at all (`breaker.rs`). And a limiter's
//! decision for a tenant that holds one of its shard's **slots** takes only
//! the tenant's own lock (`slots.rs`): two cores deciding for tenants of one
//! shard then write no line of the shard's (but in one decision in 65). A
//! tenant lives in exactly one place — a slot, or the shard's table of
//! tenants (`tenants.rs`) — so its decisions are still one critical section
//! each.
//!
//! # Time and memory
//!
//! TTLs are measured on the injected [`Clock`] — never on the OS — so simulated
//! time and TTL time agree. Expired entries are dropped when touched, and a
//! shard is swept in bulk once its operations since its last sweep exceed
//! [`SWEEP_SLACK`] plus the keys that sweep kept: a walk over every key is
//! paid for by at least as many operations (each adds at most a few keys),
//! and keys added since do not put it off. (After `UNLOCKED_RUN` decisions
//! in its slot a tenant's next goes through the shard's lock, so a shard
//! whose tenants all decide in their slots is still counted toward its
//! sweep.) Every such sweep also sweeps
//! another shard, each shard's sweeps visiting all the others in turn, so a
//! shard nobody touches is swept too. A shard keeps a bound below every
//! deadline it holds, so a sweep due before anything can have expired (busy
//! tenants keep extending theirs) skips its walk over the entries. Memory
//! therefore stays bounded by live tenants × their hits (a limiter's tenant
//! holds the hits of one series lifetime, about `2 × rpm` — see
//! [`RateLimiter`](crate::RateLimiter) — and pruned ones only while its
//! buffer has room for them), and idle tenants go away. Beside them, a
//! shard that has held a tenant keeps its slot table (2.5 KiB; 80 KiB over
//! the 32 hashed shards) and each slot once used a 128-byte cell, emptied
//! of its buffer when its tenant goes.

mod breaker;
mod names;
mod ring;
mod series;
mod slots;
mod tenants;

use std::collections::HashMap;
use std::hash::Hasher as _;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use names::{Name, Prefixes, TenantName, tenant_key};
use ring::Full;
use series::Series;
use slots::{CellGuard, Slots, UNLOCKED_RUN};
use tenants::Tenants;

use super::{
    BreakerStore, BudgetStore, Cache, HitWindow, ImmediateStore, InFlightStore, KeyValue, LimiterStore, Resolved,
    SlotRequest, TenantPrefix, TimeSource, TokenStore,
};
use crate::clock::{Clock, SystemClock};
use crate::decide::breaker::{BreakerCommand, BreakerKeys, BreakerParams, BreakerSnapshot, BreakerStep};
use crate::decide::budget::{
    BudgetCommand, BudgetParams, BudgetState, BudgetStep, clamp_budget_stamp, step as budget_step,
};
use crate::decide::pick::{Pick, PickRequest, check_pick, least_loaded};
use crate::decide::tokens::{ReservationId, TokenAsk, TokenEntry, TokenOutcome, combine, decide_tokens, settle_entry};
use crate::decide::window::{SlotOutcome, clamp_stamp, decide};
use crate::error::CacheError;
use crate::tenant::TenantId;
use crate::time::Timestamp;

/// Maps keyed by cache key with a fast, fixed-seed hasher: lookups are the hot
/// path's main cost, and iteration order never depends on a random seed (the
/// simulator's byte-for-byte determinism needs that).
type Map<V> = HashMap<String, V, rustc_hash::FxBuildHasher>;

/// How many shards a cache splits untagged keys (a limiter's tenants) over.
const HASHED: usize = 32;

/// The shard every key that begins with `{` lives on.
const TAGGED: usize = 0;

/// How many shards a cache has: one for tagged keys, [`HASHED`] for the rest.
pub const SHARDS: usize = 1 + HASHED;

/// Operations a shard takes, beyond the keys its last sweep kept, before it
/// is swept again.
pub const SWEEP_SLACK: usize = 16;

/// The in-process [`Cache`]: every capability of the port, over sharded maps.
///
/// Cheap to clone; clones share one store.
#[derive(Clone)]
pub struct MemoryCache {
    shared: Arc<Shared>,
}

struct Shared {
    /// This cache's identity among every cache of the process, for the
    /// prefixes it resolved ([`TenantPrefix`]) to tell it apart.
    id: u64,
    clock: Arc<dyn Clock>,
    time_source: TimeSource,
    shards: Box<[Shard]>,
    /// Set (under every shard's lock) by `close`, for the paths that take none.
    closed: AtomicBool,
    /// The limiter prefixes whose tenants' series are named by id.
    prefixes: Prefixes,
    /// Calls in flight per key, as (id, lease end): a router's picks span
    /// several keys, so they share one lock of their own.
    in_flight: Mutex<Map<Vec<(u64, Timestamp)>>>,
}

/// One shard on cache lines of its own, so two cores working on two shards
/// never contend for one line.
///
/// Every field a limiter's decision under the lock writes on its way to its
/// tenant's entry — the lock and the sweep's counter (and on the tagged
/// shard, the published value count) — is in the shard's first 64 bytes,
/// with the first prefix's table of tenants, which it reads (`repr(C)`,
/// hot fields first; pinned by a test): a decision moves one shard line
/// between cores, where it moved two. (What it only reads, it shares with
/// every core without moving it.)
#[repr(C, align(128))]
#[derive(Default)]
struct Shard {
    /// How many values the shard held when its lock was last released —
    /// kept by the tagged shard alone, whose count the breaker's lock-free
    /// empty test reads (`breaker.rs`): written before its every unlock
    /// ([`Guard`]), so a reader that sees zero may take the shard as
    /// holding no value at that instant. The other shards leave it alone,
    /// so a limiter's decision reads no map's length on its way out.
    values: AtomicUsize,
    state: parking_lot::Mutex<State>,
    /// The limiter tenants found without the lock (`slots.rs`): read on
    /// every decision in a slot, written when a tenant takes or leaves
    /// one; on lines of their own, which no decision under the lock writes.
    slots: Slots,
}

/// A shard's lock, which publishes the tagged shard's value count as it is
/// released.
struct Guard<'a> {
    locked: parking_lot::MutexGuard<'a, State>,
    /// The tagged shard's count; `None` on every other shard.
    published: Option<&'a AtomicUsize>,
    /// The shard's slots, which hold some of its tenants.
    slots: &'a Slots,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        // Before the field drops and the mutex unlocks.
        if let Some(published) = self.published {
            published.store(self.locked.values.len(), Ordering::Release);
        }
    }
}

impl Deref for Guard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.locked
    }
}

impl DerefMut for Guard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.locked
    }
}

/// What a shard's lock guards; the fields every operation touches first
/// (see [`Shard`]).
#[repr(C)]
#[derive(Default)]
struct State {
    ops_since_sweep: usize,
    /// The keys the last sweep kept (or found, when it skipped its walk):
    /// the next sweep is due once the operations since exceed
    /// [`SWEEP_SLACK`] plus these.
    kept: usize,
    /// Limiter tenants' series, by interned prefix and tenant id.
    tenants: Tenants,
    closed: bool,
    values: Map<ValueEntry>,
    windows: Map<Series>,
    /// Token ledgers, by key.
    ledgers: Map<Ledger>,
    /// No entry expires before this instant: a sweep due earlier would find
    /// nothing to drop, and skips its walk. Lowered by every write that sets
    /// a deadline below it (a deadline that is only extended cannot break
    /// it), recomputed by every walk.
    earliest: Timestamp,
    /// The shard this one's next sweep also sweeps: each sweep moves it
    /// on, so every shard is visited in turn by any shard that is busy. (A
    /// cursor of the cache's own, which every call's first line shared,
    /// moved that line between cores at every sweep.)
    sweeps_next: usize,
}

/// A key's token reservations, in the order they were made, and the
/// ledger's deadline.
struct Ledger {
    entries: Vec<TokenEntry>,
    deadline: Timestamp,
}

struct ValueEntry {
    value: Value,
    deadline: Option<Timestamp>,
}

enum Value {
    Text(String),
    Int(i64),
}

impl std::fmt::Debug for MemoryCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (mut values, mut windows, mut closed) = (0, 0, false);
        for index in 0..SHARDS {
            let state = lock(&self.shared.shards, index);
            values += state.values.len();
            windows += state.windows.len() + state.tenants.len() + state.slots.len();
            closed |= state.closed;
        }
        f.debug_struct("MemoryCache")
            .field("time_source", &self.shared.time_source)
            .field("values", &values)
            .field("windows", &windows)
            .field("closed", &closed)
            .finish()
    }
}

impl Default for MemoryCache {
    /// A cache on the system clock.
    fn default() -> Self {
        Self::new(Arc::new(SystemClock))
    }
}

/// Locks shard `index` of `shards`.
fn lock(shards: &[Shard], index: usize) -> Guard<'_> {
    // `parking_lot`'s lock spins briefly before it parks (a shard's critical
    // section is short) and has no poisoning: a panic while holding it cannot
    // leave the maps half-updated in a way later operations misread.
    let shard = &shards[index];
    guard(shard, index, shard.state.lock())
}

/// The guard of shard `index`, locked as `locked`: publishing its value
/// count if it is the tagged shard.
fn guard<'a>(shard: &'a Shard, index: usize, locked: parking_lot::MutexGuard<'a, State>) -> Guard<'a> {
    Guard {
        locked,
        published: (index == TAGGED).then_some(&shard.values),
        slots: &shard.slots,
    }
}

/// The shard `key` lives on: keys that begin with a hash tag (`{…}`, as a
/// breaker's do) share the first shard; a limiter's `{prefix}:{tenant}` key
/// is placed by its tenant (as [`shard_of_tenant`]), every other key by its
/// hash, over the rest.
fn shard_of(key: &str) -> usize {
    if key.starts_with('{') {
        return TAGGED;
    }
    if let Some((_, tenant)) = tenant_key(key) {
        return shard_of_tenant(tenant);
    }
    let mut hasher = rustc_hash::FxHasher::default();
    hasher.write(key.as_bytes());
    hashed_shard(hasher.finish())
}

/// The shard a limiter tenant's key lives on, from the tenant's id alone.
fn shard_of_tenant(tenant: u128) -> usize {
    hashed_shard(tenant_hash(tenant))
}

/// A limiter tenant's id, hashed: its high bits choose the tenant's shard,
/// the rest find it in its prefix's table (`tenants.rs`).
fn tenant_hash(tenant: u128) -> u64 {
    let mut hasher = rustc_hash::FxHasher::default();
    hasher.write_u128(tenant);
    hasher.finish()
}

fn hashed_shard(hash: u64) -> usize {
    // The high bits mix best.
    1 + (hash >> (u64::BITS - HASHED.trailing_zeros())) as usize
}

impl MemoryCache {
    /// A cache whose TTLs run on `clock`, and whose atomic operations stamp
    /// with `clock` too ([`TimeSource::Store`], the default). For a cache owned
    /// by one limiter or breaker the two are the same clock.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self::with_time_source(clock, TimeSource::default())
    }

    /// A cache whose TTLs run on `clock`; under [`TimeSource::Store`] its atomic
    /// operations also stamp with `clock`, under [`TimeSource::Caller`] with the
    /// caller's `now`, clamped into one window behind `clock`
    /// ([`crate::decide::window::clamp_stamp`]). The simulator's shared cache host
    /// runs either.
    pub fn with_time_source(clock: Arc<dyn Clock>, time_source: TimeSource) -> Self {
        /// The next cache's identity.
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        MemoryCache {
            shared: Arc::new(Shared {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                clock,
                time_source,
                shards: (0..SHARDS).map(|_| Shard::default()).collect(),
                closed: AtomicBool::new(false),
                prefixes: Prefixes::default(),
                in_flight: Mutex::default(),
            }),
        }
    }

    /// Live keys holding a value, and keys holding a hit window — what memory is
    /// spent on. Expired entries still waiting for a sweep are not counted.
    pub fn len(&self) -> (usize, usize) {
        let now = self.shared.clock.now();
        let (mut values, mut windows) = (0, 0);
        for index in 0..SHARDS {
            let state = lock(&self.shared.shards, index);
            values += state.values.values().filter(|e| e.live(now)).count();
            windows += state.windows.values().filter(|s| s.deadline > now).count();
            windows += state.tenants.iter().filter(|s| s.deadline > now).count();
            state.slots.for_each(|s| windows += usize::from(s.deadline > now));
        }
        (values, windows)
    }

    /// Total hits held in memory across every window — pruned hits a buffer
    /// still has room for included — bounded by live tenants × their hits:
    /// per series, at most twice the most hits it has held unpruned at once,
    /// or four.
    pub fn stored_hits(&self) -> usize {
        (0..SHARDS)
            .map(|index| {
                let state = lock(&self.shared.shards, index);
                let hits = |series: &Series| series.held();
                let mut held = 0;
                state.slots.for_each(|s| held += hits(s));
                held + state.windows.values().map(hits).sum::<usize>() + state.tenants.iter().map(hits).sum::<usize>()
            })
            .sum()
    }

    /// Locks `key`'s shard, checks the cache is open, and sweeps if due.
    fn open(&self, key: &str, now: Timestamp) -> Result<Guard<'_>, CacheError> {
        self.open_shard(shard_of(key), now)
    }

    /// `key`'s series name and its shard, named once: a tenant's key is
    /// parsed and its id hashed once (for its name, whose hash places it, as
    /// [`shard_of`] would), and a prefix met for the first time is interned
    /// before any shard is locked.
    fn named<'k>(&self, key: &'k str) -> (usize, Name<'k>) {
        let name = self.shared.prefixes.name(key);
        let shard = match name {
            Name::Tenant(name) => name.shard(),
            Name::Text(key) => shard_of(key),
        };
        (shard, name)
    }

    // Inlined into every operation: as a call it cost each acquire 32
    // instructions (callgrind, `examples/hot_loop.rs tenants8_now`).
    #[inline(always)]
    fn open_shard(&self, index: usize, now: Timestamp) -> Result<Guard<'_>, CacheError> {
        let mut state = lock(&self.shared.shards, index);
        if state.closed {
            return Err(CacheError::Closed);
        }
        state.ops_since_sweep += 1;
        if state.ops_since_sweep > SWEEP_SLACK + state.kept {
            state.sweep(now);
            let next = state.sweeps_next;
            state.sweeps_next = (next + 1) % SHARDS;
            self.sweep_another(index, next, now);
        }
        Ok(state)
    }

    /// Sweeps shard `next` (not `holding`, whose lock is held), if nobody is
    /// using it: a busy shard sweeps itself.
    fn sweep_another(&self, holding: usize, next: usize, now: Timestamp) {
        if next == holding {
            return;
        }
        let shard = &self.shared.shards[next];
        let Some(locked) = shard.state.try_lock() else {
            return;
        };
        guard(shard, next, locked).sweep(now);
    }

    fn stamp(&self, caller_now: Timestamp, clock_now: Timestamp) -> Timestamp {
        match self.shared.time_source {
            TimeSource::Caller => caller_now,
            TimeSource::Store => clock_now,
        }
    }
}

impl ValueEntry {
    fn live(&self, now: Timestamp) -> bool {
        self.deadline.is_none_or(|d| d > now)
    }
}

/// The error `operation` reports for a hit the series named `name` has no
/// room for: it already holds as many as one series can (`ring.rs`).
#[cold]
fn full(operation: &'static str, name: Name<'_>) -> CacheError {
    let named = match name {
        Name::Tenant(name) => format!("tenant {}", TenantId::from_u128(name.tenant)),
        Name::Text(key) => key.to_owned(),
    };
    CacheError::Unavailable {
        operation,
        reason: format!("the hit series of {named} already holds as many hits as one series can"),
    }
}

fn deadline(now: Timestamp, ttl: Option<Duration>) -> Option<Timestamp> {
    ttl.map(|ttl| now.saturating_add(ttl))
}

impl State {
    /// Drops every expired entry — unless none can have expired yet, as
    /// `earliest` tells without reading an entry: a shard of busy tenants
    /// keeps extending their deadlines and rarely has anything to drop.
    fn sweep(&mut self, slots: &Slots, now: Timestamp) {
        self.ops_since_sweep = 0;
        if now < self.earliest {
            debug_assert!(self.nothing_expired(slots, now), "a deadline was set below `earliest`");
            self.kept = self.keys(slots);
            return;
        }
        let mut earliest = Timestamp::MAX;
        let mut keep = |deadline: Timestamp| {
            let live = deadline > now;
            if live {
                earliest = earliest.min(deadline);
            }
            live
        };
        self.values.retain(|_, e| e.deadline.is_none_or(&mut keep));
        self.windows.retain(|_, s| keep(s.deadline));
        self.tenants.retain(|s| keep(s.deadline));
        slots.retain(|s| keep(s.deadline));
        self.ledgers.retain(|_, l| keep(l.deadline));
        self.earliest = earliest;
        self.kept = self.keys(slots);
    }

    /// Every key the shard holds (with its slots), expired ones not yet
    /// swept included.
    fn keys(&self, slots: &Slots) -> usize {
        self.values.len() + self.windows.len() + self.tenants.len() + slots.len() + self.ledgers.len()
    }

    /// Notes an entry now expiring at `deadline`, keeping `earliest` a
    /// bound below every deadline.
    fn expires(&mut self, deadline: Timestamp) {
        self.earliest = self.earliest.min(deadline);
    }

    /// Whether no entry has expired at `now` (what `earliest` promises;
    /// checked in debug builds).
    fn nothing_expired(&self, slots: &Slots, now: Timestamp) -> bool {
        let mut slots_live = true;
        slots.for_each(|s| slots_live &= s.deadline > now);
        slots_live
            && self.values.values().all(|e| e.live(now))
            && self.windows.values().all(|s| s.deadline > now)
            && self.tenants.iter().all(|s| s.deadline > now)
            && self.ledgers.values().all(|l| l.deadline > now)
    }

    fn value(&mut self, key: &str, now: Timestamp) -> Option<&mut ValueEntry> {
        if self.values.get(key).is_some_and(|e| !e.live(now)) {
            self.values.remove(key);
        }
        self.values.get_mut(key)
    }

    fn put(&mut self, key: &str, value: Value, deadline: Option<Timestamp>) {
        if let Some(deadline) = deadline {
            self.expires(deadline);
        }
        match self.values.get_mut(key) {
            Some(entry) => {
                entry.value = value;
                entry.deadline = deadline;
            }
            None => {
                self.values.insert(key.to_owned(), ValueEntry { value, deadline });
            }
        }
    }
}

/// A series where it lives: a tenant's slot (`slots.rs`), or a map of the
/// shard's.
enum SeriesMut<'a> {
    Slot(CellGuard<'a>),
    Map(&'a mut Series),
}

impl Deref for SeriesMut<'_> {
    type Target = Series;
    fn deref(&self) -> &Series {
        match self {
            SeriesMut::Slot(held) => &held.series,
            SeriesMut::Map(series) => series,
        }
    }
}

impl DerefMut for SeriesMut<'_> {
    fn deref_mut(&mut self) -> &mut Series {
        match self {
            SeriesMut::Slot(held) => &mut held.series,
            SeriesMut::Map(series) => series,
        }
    }
}

/// The live series named `name` among a shard's (under its lock), emptied
/// first if it expired. A tenant's is looked for in its slots, then in the
/// table; found in a slot, its run of decisions without the shard's lock
/// starts again. A slot's series stays locked for as long as the answer is
/// held.
fn live_series<'a>(
    slots: &'a Slots,
    tenants: &'a mut Tenants,
    windows: &'a mut Map<Series>,
    name: Name<'_>,
    now: Timestamp,
) -> Option<SeriesMut<'a>> {
    let mut series = match name {
        Name::Tenant(name) => match slots.get(name) {
            Some(mut held) => {
                held.unlocked = UNLOCKED_RUN;
                SeriesMut::Slot(held)
            }
            None => SeriesMut::Map(tenants.get_mut(name)?),
        },
        Name::Text(key) => SeriesMut::Map(windows.get_mut(key)?),
    };
    series.expire(now);
    Some(series)
}

impl Guard<'_> {
    /// Sweeps the shard, its slots with it.
    fn sweep(&mut self, now: Timestamp) {
        let slots = self.slots;
        self.locked.sweep(slots, now);
    }

    /// The live series named `name`, emptied first if it expired (see
    /// [`live_series`]).
    fn series_mut(&mut self, name: Name<'_>, now: Timestamp) -> Option<SeriesMut<'_>> {
        let State { tenants, windows, .. } = &mut *self.locked;
        live_series(self.slots, tenants, windows, name, now)
    }

    /// Stores a new series under `name`, found nowhere: a tenant's in a
    /// slot of its probe if one is free, unmade or expired, else in the
    /// table.
    fn insert_series(&mut self, name: Name<'_>, series: Series, now: Timestamp) {
        self.locked.expires(series.deadline);
        match name {
            Name::Tenant(name) => {
                if let Err(series) = self.slots.place(name, series, now) {
                    self.locked.tenants.insert(name, series);
                }
            }
            Name::Text(key) => {
                self.locked.windows.insert(key.to_owned(), series);
            }
        }
    }

    fn remove_series(&mut self, name: Name<'_>) {
        match name {
            Name::Tenant(name) => {
                self.slots.remove(name);
                self.locked.tenants.remove(name);
            }
            Name::Text(key) => {
                self.locked.windows.remove(key);
            }
        }
    }

    fn record(&mut self, name: Name<'_>, at: Timestamp, ttl: Duration, now: Timestamp) -> Result<(), Full> {
        if let Some(mut series) = self.series_mut(name, now) {
            return series.push(at, ttl, now);
        }
        self.insert_first(name, at, ttl, now)
    }

    /// Stores a series of one hit at `at` under `name`, found nowhere (as
    /// [`record`](Guard::record) does for a name it did not find).
    fn insert_first(&mut self, name: Name<'_>, at: Timestamp, ttl: Duration, now: Timestamp) -> Result<(), Full> {
        let series = Series::first(at, ttl, now)?;
        self.insert_series(name, series, now);
        Ok(())
    }
}

impl Cache for MemoryCache {
    async fn close(&self) -> Result<(), CacheError> {
        for index in 0..SHARDS {
            let mut state = lock(&self.shared.shards, index);
            self.shared.closed.store(true, Ordering::Release);
            state.closed = true;
            state.values.clear();
            state.windows.clear();
            state.tenants.clear();
            state.slots.clear();
            state.ledgers.clear();
        }
        self.in_flight().clear();
        Ok(())
    }

    fn stamps_with_own_clock(&self) -> bool {
        self.shared.time_source == TimeSource::Store
    }
}

impl KeyValue for MemoryCache {
    async fn get(&self, key: &str) -> Result<Option<String>, CacheError> {
        let now = self.shared.clock.now();
        let mut state = self.open(key, now)?;
        Ok(state.value(key, now).map(|e| match &e.value {
            Value::Text(s) => s.clone(),
            Value::Int(n) => n.to_string(),
        }))
    }

    async fn set(&self, key: &str, value: &str, ttl: Option<Duration>) -> Result<(), CacheError> {
        let now = self.shared.clock.now();
        let mut state = self.open(key, now)?;
        state.put(key, Value::Text(value.to_owned()), deadline(now, ttl));
        Ok(())
    }

    async fn increment(&self, key: &str, ttl: Option<Duration>) -> Result<i64, CacheError> {
        let now = self.shared.clock.now();
        let mut state = self.open(key, now)?;
        match state.value(key, now) {
            Some(entry) => {
                let current = match &entry.value {
                    Value::Int(n) => *n,
                    Value::Text(s) => s
                        .parse::<i64>()
                        .map_err(|_| CacheError::NotAnInteger { key: key.to_owned() })?,
                };
                let next = current.checked_add(1).ok_or_else(|| CacheError::Protocol {
                    operation: "increment",
                    detail: format!("{key} would overflow"),
                })?;
                entry.value = Value::Int(next);
                Ok(next)
            }
            None => {
                state.put(key, Value::Int(1), deadline(now, ttl));
                Ok(1)
            }
        }
    }

    async fn delete(&self, key: &str) -> Result<(), CacheError> {
        let now = self.shared.clock.now();
        let (shard, name) = self.named(key);
        let mut state = self.open_shard(shard, now)?;
        state.values.remove(key);
        state.ledgers.remove(key);
        state.remove_series(name);
        drop(state);
        self.in_flight().remove(key);
        Ok(())
    }
}

impl HitWindow for MemoryCache {
    async fn record_hit(&self, key: &str, at: Timestamp, ttl: Duration) -> Result<(), CacheError> {
        let now = self.shared.clock.now();
        let (shard, name) = self.named(key);
        let mut state = self.open_shard(shard, now)?;
        state.record(name, at, ttl, now).map_err(|_| full("record_hit", name))
    }

    async fn count_since(&self, key: &str, since: Timestamp) -> Result<u64, CacheError> {
        let now = self.shared.clock.now();
        let (shard, name) = self.named(key);
        let mut state = self.open_shard(shard, now)?;
        Ok(state.series_mut(name, now).map_or(0, |mut s| s.count_since(since)))
    }

    async fn oldest_since(&self, key: &str, since: Timestamp) -> Result<Option<Timestamp>, CacheError> {
        let now = self.shared.clock.now();
        let (shard, name) = self.named(key);
        let mut state = self.open_shard(shard, now)?;
        Ok(state.series_mut(name, now).and_then(|mut s| s.oldest_since(since)))
    }
}

impl MemoryCache {
    /// The id of a prefix another cache resolved, or none did, by its text
    /// (interned if it has none and there is room).
    #[cold]
    #[inline(never)]
    fn prefix_id(&self, prefix: &str) -> Option<u32> {
        self.shared.prefixes.id(prefix)
    }

    /// The slot decision for a tenant whose prefix cannot be interned: by
    /// the key's string form.
    // Out of line, so that this path's copy of the inlined decision below
    // is kept out of `acquire_tenant_slot_now`.
    #[cold]
    #[inline(never)]
    fn acquire_by_key(&self, prefix: &str, tenant: TenantId, request: &SlotRequest) -> Result<SlotOutcome, CacheError> {
        let key = super::KeyBuf::tenant(prefix, &tenant);
        let (shard, name) = self.named(key.as_str());
        self.acquire_named(shard, name, request)
    }

    /// The atomic slot decision for the series named `name` on `shard`: a
    /// tenant in a slot without the shard's lock (but for one decision in
    /// 65, after [`UNLOCKED_RUN`] without it, which keeps the shard's sweep
    /// paced), everything else under it.
    // Inlined into the tenant-slot entry: as a call it cost each acquire 23
    // instructions (callgrind, `examples/hot_loop.rs tenants8_now`).
    #[inline(always)]
    fn acquire_named(&self, shard: usize, name: Name<'_>, request: &SlotRequest) -> Result<SlotOutcome, CacheError> {
        let clock_now = self.shared.clock.now();
        let (now, clamped) = match self.shared.time_source {
            TimeSource::Store => (clock_now, false),
            TimeSource::Caller => clamp_stamp(request.now, clock_now, request.window, request.max_ahead),
        };
        let since = now.saturating_sub(request.window);
        if let Name::Tenant(tenant) = name
            && let Some(mut held) = self.shared.shards[shard].slots.find(tenant)
            && held.unlocked > 0
        {
            // No test of `closed`: `close` empties every slot under its
            // cell's lock, so a decision that found its tenant here came
            // before the close, as one that took the shard's lock first.
            held.unlocked -= 1;
            held.series.expire(clock_now);
            let outcome = slot_step(&mut held.series, since, now, clock_now, request);
            return Ok(outcome.map_err(|_| full("acquire_slot", name))?.with_clamped(clamped));
        }
        let mut state = self.open_shard(shard, clock_now)?;
        let outcome = if let Some(mut series) = state.series_mut(name, clock_now) {
            slot_step(&mut series, since, now, clock_now, request)
        } else {
            let outcome = decide(0, None, request.limit, now, request.window);
            match outcome {
                // Found nowhere just now, under the lock still held.
                SlotOutcome::Admitted { .. } => state.insert_first(name, now, request.ttl, clock_now).map(|()| outcome),
                SlotOutcome::Refused { .. } => Ok(outcome),
            }
        };
        Ok(outcome.map_err(|_| full("acquire_slot", name))?.with_clamped(clamped))
    }
}

/// The slot decision over `series` for a request stamped `now` (the store's
/// clock reading `clock_now`): the hit pushed if admitted.
#[inline(always)]
fn slot_step(
    series: &mut Series,
    since: Timestamp,
    now: Timestamp,
    clock_now: Timestamp,
    request: &SlotRequest,
) -> Result<SlotOutcome, Full> {
    let (count, oldest) = series.window(since);
    let outcome = decide(count, oldest, request.limit, now, request.window);
    if let SlotOutcome::Admitted { .. } = outcome {
        series.push(now, request.ttl, clock_now)?;
    }
    Ok(outcome)
}

impl LimiterStore for MemoryCache {
    async fn acquire_slot(&self, key: &str, request: SlotRequest) -> Result<SlotOutcome, CacheError> {
        let (shard, name) = self.named(key);
        self.acquire_named(shard, name, &request)
    }

    /// By the tenant's id: no key is formatted, checked or hashed. The key
    /// `{prefix}:{tenant}` names the same series.
    async fn acquire_tenant_slot(
        &self,
        prefix: &TenantPrefix,
        tenant: TenantId,
        request: SlotRequest,
    ) -> Result<SlotOutcome, CacheError> {
        self.acquire_tenant_slot_now(prefix, tenant, &request)
    }

    /// Interned (if there is room): the prefix's id, which a decision finds
    /// the prefix's table of tenants by.
    fn resolve_prefix(&self, prefix: Arc<str>) -> TenantPrefix {
        match self.shared.prefixes.id(&prefix) {
            Some(id) => TenantPrefix::resolved(
                prefix,
                Resolved {
                    store: self.shared.id,
                    id,
                },
            ),
            None => TenantPrefix::new(prefix),
        }
    }
}

impl ImmediateStore for MemoryCache {
    /// By the tenant's id and the prefix's id this cache resolved it to,
    /// with no lookup (a prefix another cache resolved is looked up by its
    /// text): no key is formatted, checked or hashed. The key
    /// `{prefix}:{tenant}` names the same series.
    fn acquire_tenant_slot_now(
        &self,
        prefix: &TenantPrefix,
        tenant: TenantId,
        request: &SlotRequest,
    ) -> Result<SlotOutcome, CacheError> {
        let id = match prefix.id_for(self.shared.id) {
            Some(id) => Some(id),
            None => self.prefix_id(prefix.as_str()),
        };
        match id {
            Some(id) => {
                let name = TenantName::new(id, tenant.as_uuid().as_u128());
                self.acquire_named(name.shard(), Name::Tenant(name), request)
            }
            None => self.acquire_by_key(prefix.as_str(), tenant, request),
        }
    }

    fn breaker_step_now(
        &self,
        keys: &BreakerKeys,
        command: BreakerCommand,
        params: BreakerParams,
        now: Timestamp,
    ) -> Result<BreakerStep, CacheError> {
        let clock_now = self.shared.clock.now();
        let now = self.stamp(now, clock_now);
        if let Some(step) = breaker::unlocked_step(self, keys, command, &params, now) {
            return Ok(step);
        }
        let mut held = breaker::Held::lock(self, keys, clock_now)?;
        Ok(held.step(keys, command, &params, now, clock_now))
    }
}

impl MemoryCache {
    /// The calls in flight, locked (a panic elsewhere cannot poison a map
    /// whose every update is one statement).
    fn in_flight(&self) -> MutexGuard<'_, Map<Vec<(u64, Timestamp)>>> {
        self.shared
            .in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl InFlightStore for MemoryCache {
    async fn pick_least_loaded(
        &self,
        keys: &[&str],
        weights: &[u32],
        request: PickRequest,
    ) -> Result<Pick, CacheError> {
        check_pick(keys, weights)?;
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(CacheError::Closed);
        }
        let clock_now = self.shared.clock.now();
        let now = match self.shared.time_source {
            TimeSource::Caller => clamp_budget_stamp(request.now, clock_now, request.max_ahead),
            TimeSource::Store => clock_now,
        };
        let mut map = self.in_flight();
        let mut counts = Vec::with_capacity(keys.len());
        for key in keys {
            let live = match map.get_mut(*key) {
                Some(leases) => {
                    leases.retain(|&(_, end)| end >= now);
                    leases.len()
                }
                None => 0,
            };
            counts.push(live as u64);
        }
        let index = least_loaded(&counts, weights).unwrap_or(0);
        let lease = (request.id, now.saturating_add(request.lease));
        match map.get_mut(keys[index]) {
            Some(leases) => {
                leases.retain(|&(id, _)| id != request.id);
                leases.push(lease);
            }
            None => {
                map.insert(keys[index].to_owned(), vec![lease]);
            }
        }
        map.retain(|_, leases| !leases.is_empty());
        Ok(Pick { index, counts })
    }

    async fn end_in_flight(&self, key: &str, id: u64) -> Result<(), CacheError> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(CacheError::Closed);
        }
        let mut map = self.in_flight();
        if let Some(leases) = map.get_mut(key) {
            leases.retain(|&(lease, _)| lease != id);
            if leases.is_empty() {
                map.remove(key);
            }
        }
        Ok(())
    }
}

impl TokenStore for MemoryCache {
    async fn acquire_with_tokens(
        &self,
        key: &str,
        request: SlotRequest,
        ask: TokenAsk,
    ) -> Result<TokenOutcome, CacheError> {
        let clock_now = self.shared.clock.now();
        let (now, clamped) = match self.shared.time_source {
            TimeSource::Store => (clock_now, false),
            TimeSource::Caller => clamp_stamp(request.now, clock_now, request.window, request.max_ahead),
        };
        let (shard, name) = self.named(key);
        let mut state = self.open_shard(shard, clock_now)?;
        let since = now.saturating_sub(request.window);
        let (outcome, found) = {
            let slots = state.slots;
            let State {
                tenants,
                windows,
                ledgers,
                ..
            } = &mut *state.locked;
            // Held (a slot's series locked) until the hit is pushed: a
            // decision in the slot, which takes no shard lock, cannot come
            // between.
            let mut series = live_series(slots, tenants, windows, name, clock_now);
            let (count, oldest) = match series.as_deref_mut() {
                Some(series) => series.window(since),
                None => (0, None),
            };
            let slot = decide(count, oldest, request.limit, now, request.window);
            // Reservations older than the series' lifetime are pruned, as hits are.
            let horizon = clock_now.saturating_sub(request.ttl);
            let entries: &[TokenEntry] = match ledgers.get_mut(key) {
                Some(ledger) if ledger.deadline > clock_now => {
                    ledger.entries.retain(|e| e.id.at >= horizon);
                    &ledger.entries
                }
                _ => &[],
            };
            let tokens = decide_tokens(entries, &ask, now, request.window);
            let seq = entries.iter().filter(|e| e.id.at == now).count();
            let seq = u32::try_from(seq).unwrap_or(u32::MAX);
            let outcome = combine(count, slot, tokens, now, seq, request.window);
            // The hit, pushed to the held series (a tenant found nowhere gets
            // its first below, under the shard's lock still held).
            if let (TokenOutcome::Admitted { .. }, Some(series)) = (&outcome, series.as_deref_mut()) {
                series
                    .push(now, request.ttl, clock_now)
                    .map_err(|_| full("acquire_with_tokens", name))?;
            }
            (outcome, series.is_some())
        };
        if let TokenOutcome::Admitted { reservation, .. } = outcome {
            if !found {
                state
                    .insert_first(name, now, request.ttl, clock_now)
                    .map_err(|_| full("acquire_with_tokens", name))?;
            }
            let entry = TokenEntry {
                id: reservation,
                tokens: ask.tokens,
                lease_end: Some(now.saturating_add(ask.lease)),
            };
            let deadline = clock_now.saturating_add(request.ttl);
            state.expires(deadline);
            match state.ledgers.get_mut(key) {
                Some(ledger) if ledger.deadline > clock_now => {
                    ledger.entries.push(entry);
                    ledger.deadline = ledger.deadline.max(deadline);
                }
                _ => {
                    state.ledgers.insert(
                        key.to_owned(),
                        Ledger {
                            entries: vec![entry],
                            deadline,
                        },
                    );
                }
            }
        }
        Ok(match outcome {
            TokenOutcome::Admitted {
                remaining,
                tokens_used,
                reservation,
                ..
            } => TokenOutcome::Admitted {
                remaining,
                tokens_used,
                reservation,
                clamped,
            },
            TokenOutcome::Refused {
                by,
                requests_used,
                tokens_used,
                retry_after,
                at,
                ..
            } => TokenOutcome::Refused {
                by,
                requests_used,
                tokens_used,
                retry_after,
                at,
                clamped,
            },
        })
    }

    async fn settle_tokens(&self, key: &str, id: ReservationId, actual: u64) -> Result<bool, CacheError> {
        let clock_now = self.shared.clock.now();
        let mut state = self.open(key, clock_now)?;
        Ok(match state.ledgers.get_mut(key) {
            Some(ledger) if ledger.deadline > clock_now => settle_entry(&mut ledger.entries, id, actual),
            _ => false,
        })
    }
}

impl BudgetStore for MemoryCache {
    async fn budget_step(
        &self,
        key: &str,
        command: BudgetCommand,
        params: BudgetParams,
        now: Timestamp,
    ) -> Result<BudgetStep, CacheError> {
        let clock_now = self.shared.clock.now();
        let at = match self.shared.time_source {
            TimeSource::Caller => clamp_budget_stamp(now, clock_now, params.max_ahead),
            TimeSource::Store => clock_now,
        };
        let mut state = self.open(key, clock_now)?;
        let (stored, healed) = match state.value(key, clock_now).map(|e| &e.value) {
            None => (None, false),
            Some(Value::Text(text)) => match BudgetState::decode(text) {
                Some(bucket) => (Some(bucket), false),
                None => (None, true),
            },
            Some(Value::Int(_)) => (None, true),
        };
        let mut step = budget_step(stored, command, &params, at);
        step.healed = healed;
        state.put(
            key,
            Value::Text(step.state.encode()),
            deadline(clock_now, Some(params.ttl)),
        );
        Ok(step)
    }
}

impl BreakerStore for MemoryCache {
    async fn breaker_step(
        &self,
        keys: &BreakerKeys,
        command: BreakerCommand,
        params: BreakerParams,
        now: Timestamp,
    ) -> Result<BreakerStep, CacheError> {
        self.breaker_step_now(keys, command, params, now)
    }

    /// Keys that all begin with a hash tag: they live on the tagged shard,
    /// whose value count the quiet test reads.
    fn breaker_quiet_covers(&self, keys: &BreakerKeys) -> bool {
        breaker::all_tagged(keys)
    }

    #[inline]
    fn breaker_quiet(&self) -> bool {
        breaker::tagged_shard_empty(self)
    }

    async fn breaker_read(
        &self,
        keys: &BreakerKeys,
        now: Timestamp,
    ) -> Result<(BreakerSnapshot, Timestamp), CacheError> {
        let clock_now = self.shared.clock.now();
        let now = self.stamp(now, clock_now);
        let held = breaker::Held::lock(self, keys, clock_now)?;
        Ok((held.snapshot(keys, clock_now), now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_keys_share_a_shard_and_untagged_ones_never_use_it() {
        assert_eq!(shard_of("{kg:circuit}:state"), TAGGED);
        assert_ne!(shard_of("kg:ratelimit:x"), TAGGED);
        let keys = BreakerKeys::new("kg:circuit");
        let shard = shard_of(&keys.state);
        for key in [&keys.failures, &keys.opened_at, &keys.probes] {
            assert_eq!(shard_of(key), shard, "{key}");
        }
    }

    fn ready<F: std::future::Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        match f
            .as_mut()
            .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
        {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => panic!("MemoryCache operations never suspend"),
        }
    }

    #[test]
    fn a_tenants_id_and_its_key_name_one_series() {
        let clock = Arc::new(crate::ManualClock::at_fixed_epoch());
        let cache = MemoryCache::new(clock.clone());
        let now = clock.now();
        let request = SlotRequest {
            now,
            window: Duration::from_secs(60),
            limit: 2,
            ttl: Duration::from_secs(121),
            max_ahead: Duration::from_secs(1),
        };
        for prefix in ["kg:ratelimit", "{tagged}", &"p".repeat(120)] {
            let tenant = TenantId::from_u128(9);
            let key = super::super::KeyBuf::tenant(prefix, &tenant);
            let key = key.as_str();
            // Resolved (interned) where it can be, by its text where not.
            let resolved = cache.resolve_prefix(Arc::from(prefix));
            ready(cache.acquire_tenant_slot(&resolved, tenant, request)).unwrap();
            assert_eq!(ready(cache.count_since(key, now)).unwrap(), 1, "{prefix}");
            ready(cache.record_hit(key, now, request.ttl)).unwrap();
            assert!(
                matches!(
                    ready(cache.acquire_tenant_slot(&resolved, tenant, request)).unwrap(),
                    SlotOutcome::Refused { used: 2, .. }
                ),
                "{prefix}: the hit recorded by key counts against the tenant"
            );
            ready(cache.delete(key)).unwrap();
            assert_eq!(ready(cache.count_since(key, now)).unwrap(), 0, "{prefix}");
            assert!(matches!(
                ready(cache.acquire_slot(key, request)).unwrap(),
                SlotOutcome::Admitted { remaining: 1, .. }
            ));
        }
    }

    /// Entries the shards physically hold, expired ones not yet swept included.
    fn entries_held(cache: &MemoryCache) -> usize {
        (0..SHARDS)
            .map(|index| {
                let state = lock(&cache.shared.shards, index);
                state.keys(state.slots)
            })
            .sum()
    }

    /// Enough operations that every shard's sweep comes due (each sweep also
    /// visits the next shard in turn).
    fn churn(cache: &MemoryCache) {
        for n in 0..SHARDS * (SWEEP_SLACK + 8) * 2 {
            ready(cache.get(&format!("churn:{n}"))).unwrap();
        }
    }

    /// Sets `{t}:{name}{n}` for `n` in `0..count` to live `ttl`: tagged
    /// keys, on one shard, which nothing else sweeps.
    fn set_tagged(cache: &MemoryCache, name: &str, count: usize, ttl: Duration) {
        for n in 0..count {
            ready(cache.set(&format!("{{t}}:{name}{n}"), "1", Some(ttl))).unwrap();
        }
    }

    /// `count` operations on the tagged shard that write nothing.
    fn miss_tagged(cache: &MemoryCache, count: usize) {
        for _ in 0..count {
            ready(cache.get("{t}:missing")).unwrap();
        }
    }

    #[test]
    fn a_shard_is_swept_once_its_operations_exceed_the_slack_plus_what_its_last_sweep_kept() {
        let clock = Arc::new(crate::ManualClock::at_fixed_epoch());
        let cache = MemoryCache::new(clock.clone());
        let (short, long) = (Duration::from_secs(1), Duration::from_secs(1_000));
        // Nothing swept yet, nothing kept: due after the slack alone, the
        // keys written meanwhile (the sets are operations too) or not.
        set_tagged(&cache, "short", 5, short);
        clock.advance(2 * short);
        miss_tagged(&cache, SWEEP_SLACK - 5);
        assert_eq!(
            entries_held(&cache),
            5,
            "swept before its operations exceeded the slack"
        );
        miss_tagged(&cache, 1);
        assert_eq!(entries_held(&cache), 0, "not swept once they did");
        // Live keys written before a sweep are kept by it, and the next
        // waits for them too.
        set_tagged(&cache, "long", 5, long);
        miss_tagged(&cache, SWEEP_SLACK + 1 - 5);
        assert_eq!(entries_held(&cache), 5);
        set_tagged(&cache, "short", 3, short);
        clock.advance(2 * short);
        miss_tagged(&cache, SWEEP_SLACK + 5 - 3);
        assert_eq!(entries_held(&cache), 8, "swept before slack + the 5 kept");
        miss_tagged(&cache, 1);
        assert_eq!(entries_held(&cache), 5, "the expired 3 outlived slack + the 5 kept");
    }

    #[test]
    fn a_shard_whose_every_operation_adds_a_key_is_still_swept() {
        let clock = Arc::new(crate::ManualClock::at_fixed_epoch());
        let cache = MemoryCache::new(clock.clone());
        let short = Duration::from_secs(1);
        set_tagged(&cache, "old", 5, short);
        clock.advance(2 * short);
        // Counting the keys held now, ops would never catch up with them.
        for n in 0..SWEEP_SLACK * 4 {
            ready(cache.set(&format!("{{t}}:new{n}"), "1", Some(Duration::from_secs(1_000)))).unwrap();
        }
        let held = entries_held(&cache);
        assert_eq!(
            held,
            SWEEP_SLACK * 4,
            "{} expired keys outlived every sweep",
            held - SWEEP_SLACK * 4
        );
    }

    #[test]
    fn what_a_limiter_decision_writes_before_its_tenant_is_on_the_shards_first_line() {
        let shards = [Shard::default()];
        let shard = &shards[0];
        let start = shard as *const Shard as usize;
        let state = lock(&shards, 0);
        let end_of = |field: usize, size: usize| field - start + size;
        let mutex = &shard.state as *const parking_lot::Mutex<State> as usize;
        let data = shard.state.data_ptr() as usize;
        assert_eq!(
            data - mutex + size_of::<State>(),
            size_of::<parking_lot::Mutex<State>>(),
            "the lock word is not before the data it guards"
        );
        let ends = [
            end_of(&shard.values as *const AtomicUsize as usize, size_of::<AtomicUsize>()),
            end_of(data, 0),
            end_of(&state.ops_since_sweep as *const usize as usize, size_of::<usize>()),
            end_of(&state.kept as *const usize as usize, size_of::<usize>()),
            {
                let (table, size) = state.tenants.first_table();
                end_of(table, size)
            },
        ];
        assert!(ends.iter().all(|end| *end <= 64), "{ends:?}");
        assert_eq!(start % 128, 0);
    }

    #[test]
    fn an_entry_written_with_a_shorter_life_than_every_other_is_still_swept() {
        let clock = Arc::new(crate::ManualClock::at_fixed_epoch());
        let cache = MemoryCache::new(clock.clone());
        let long = Some(Duration::from_secs(1_000));
        let short = Duration::from_secs(1);
        ready(cache.set("stays", "1", long)).unwrap();
        // Every sweep now finds its shard's first deadline 1 000 s away.
        churn(&cache);
        assert_eq!(entries_held(&cache), 1);
        // Each write below sets a deadline earlier than any a shard held.
        ready(cache.set("shortened", "1", long)).unwrap();
        ready(cache.set("shortened", "2", Some(short))).unwrap();
        ready(cache.increment("counted", Some(short))).unwrap();
        ready(cache.record_hit("window", clock.now(), short)).unwrap();
        let request = SlotRequest {
            now: clock.now(),
            window: short,
            limit: 5,
            ttl: short,
            max_ahead: Duration::ZERO,
        };
        let prefix = TenantPrefix::new("kg:ratelimit");
        ready(cache.acquire_tenant_slot(&prefix, TenantId::from_u128(7), request)).unwrap();
        let ask = TokenAsk {
            tokens: 1,
            limit: 10,
            lease: short,
        };
        ready(cache.acquire_with_tokens("ledger", request, ask)).unwrap();
        // A ledger whose key's series lives long: only the ledger is short.
        ready(cache.record_hit("long ledger", clock.now(), Duration::from_secs(1_000))).unwrap();
        ready(cache.acquire_with_tokens("long ledger", request, ask)).unwrap();
        // "ledger" and "long ledger" hold a series and a ledger each.
        assert_eq!(entries_held(&cache), 1 + 8);
        clock.advance(Duration::from_secs(2));
        churn(&cache);
        assert_eq!(
            entries_held(&cache),
            2,
            "what expired was swept, \"stays\" and the series of \"long ledger\" kept"
        );
    }

    #[test]
    fn a_series_at_its_most_hits_refuses_the_next_with_a_typed_error_and_loses_none() {
        const MOST: u64 = 1 << 10;
        // On this test's thread, a series holds 2^10 hits at most.
        ring::MOST.set(MOST as usize);
        let clock = Arc::new(crate::ManualClock::at_fixed_epoch());
        let cache = MemoryCache::new(clock.clone());
        let now = clock.now();
        let ttl = Duration::from_secs(60);
        for _ in 0..MOST {
            ready(cache.record_hit("k", now, ttl)).unwrap();
        }
        let error = ready(cache.record_hit("k", now, ttl)).unwrap_err();
        assert!(error.is_transient(), "{error}");
        assert!(
            error.to_string().contains("record_hit") && error.to_string().contains("the hit series of k"),
            "{error}"
        );
        assert_eq!(
            ready(cache.count_since("k", now)).unwrap(),
            MOST,
            "every hit recorded is kept"
        );
        let request = SlotRequest {
            now,
            window: ttl,
            limit: u32::MAX,
            ttl,
            max_ahead: Duration::ZERO,
        };
        // A token reservation on that key: refused whole, no ledger entry
        // written beside the hit that could not be kept.
        let ask = TokenAsk {
            tokens: 1,
            limit: 10,
            lease: ttl,
        };
        let error = ready(cache.acquire_with_tokens("k", request, ask)).unwrap_err();
        assert!(error.to_string().contains("acquire_with_tokens"), "{error}");
        assert!((0..SHARDS).all(|index| lock(&cache.shared.shards, index).ledgers.is_empty()));
        assert_eq!(ready(cache.count_since("k", now)).unwrap(), MOST);
        // A limiter's tenant at its most: the decision admits, the store cannot keep it.
        let tenant = TenantId::from_u128(5);
        let prefix = cache.resolve_prefix(Arc::from("kg:ratelimit"));
        for _ in 0..MOST {
            assert!(matches!(
                cache.acquire_tenant_slot_now(&prefix, tenant, &request),
                Ok(SlotOutcome::Admitted { .. })
            ));
        }
        let error = cache.acquire_tenant_slot_now(&prefix, tenant, &request).unwrap_err();
        assert!(error.to_string().contains("acquire_slot"), "{error}");
        let key = super::super::KeyBuf::tenant("kg:ratelimit", &tenant);
        assert_eq!(ready(cache.count_since(key.as_str(), now)).unwrap(), MOST);
        // Once the hits age out of the series' life there is room again.
        clock.advance(ttl + Duration::from_secs(1));
        assert!(matches!(
            cache.acquire_tenant_slot_now(&prefix, tenant, &request),
            Ok(SlotOutcome::Admitted { .. })
        ));
        ready(cache.record_hit("k", clock.now(), ttl)).unwrap();
    }

    #[test]
    fn a_prefix_resolved_by_another_cache_is_found_by_its_text() {
        let clock = Arc::new(crate::ManualClock::at_fixed_epoch());
        let (a, b) = (MemoryCache::new(clock.clone()), MemoryCache::new(clock.clone()));
        // In `a`, "first" is interned first and "second" after it; in `b`,
        // "second" first: the ids the two caches gave "second" differ.
        let first = a.resolve_prefix(Arc::from("first"));
        let _ = a.resolve_prefix(Arc::from("second"));
        let second_by_b = b.resolve_prefix(Arc::from("second"));
        let tenant = TenantId::from_u128(9);
        let request = SlotRequest {
            now: clock.now(),
            window: Duration::from_secs(60),
            limit: 1,
            ttl: Duration::from_secs(120),
            max_ahead: Duration::ZERO,
        };
        let admitted = |r: Result<SlotOutcome, CacheError>| matches!(r, Ok(SlotOutcome::Admitted { .. }));
        assert!(admitted(a.acquire_tenant_slot_now(&first, tenant, &request)));
        assert!(
            !admitted(a.acquire_tenant_slot_now(&first, tenant, &request)),
            "at its limit"
        );
        // `b`'s "second", asked of `a`, is `a`'s "second" — whose tenant has
        // no hit yet — not whatever `a` gave `b`'s id to ("first").
        assert!(admitted(a.acquire_tenant_slot_now(&second_by_b, tenant, &request)));
        assert!(!admitted(a.acquire_tenant_slot_now(&second_by_b, tenant, &request)));
        // A prefix no cache resolved goes by its text as well.
        assert!(!admitted(a.acquire_tenant_slot_now(
            &TenantPrefix::new("first"),
            tenant,
            &request
        )));
        // The keys name the series the ids found; `b` was asked nothing.
        let now = clock.now();
        for prefix in ["first", "second"] {
            let key = super::super::KeyBuf::tenant(prefix, &tenant);
            assert_eq!(ready(a.count_since(key.as_str(), now)).unwrap(), 1, "{prefix}");
            assert_eq!(ready(b.count_since(key.as_str(), now)).unwrap(), 0, "{prefix}");
        }
    }

    /// `count` tenants the cache puts on shard 1.
    fn tenants_on_one_shard(count: usize) -> Vec<TenantId> {
        (0u128..)
            .filter(|id| shard_of_tenant(*id) == 1)
            .take(count)
            .map(TenantId::from_u128)
            .collect()
    }

    /// A cache on a manual clock, and the prefix `kg:ratelimit` it resolved.
    fn limiter_cache() -> (Arc<crate::ManualClock>, MemoryCache, TenantPrefix) {
        let clock = Arc::new(crate::ManualClock::at_fixed_epoch());
        let cache = MemoryCache::new(clock.clone());
        let prefix = cache.resolve_prefix(Arc::from("kg:ratelimit"));
        (clock, cache, prefix)
    }

    /// A request for `limit` hits a minute, at the clock's instant.
    fn minute_request(clock: &crate::ManualClock, limit: u32) -> SlotRequest {
        SlotRequest {
            now: clock.now(),
            window: Duration::from_secs(60),
            limit,
            ttl: Duration::from_secs(121),
            max_ahead: Duration::ZERO,
        }
    }

    fn admitted(outcome: Result<SlotOutcome, CacheError>) -> bool {
        matches!(outcome.unwrap(), SlotOutcome::Admitted { .. })
    }

    #[test]
    fn tenants_beyond_the_slots_room_live_in_the_table_and_each_keeps_one_count() {
        let (clock, cache, prefix) = limiter_cache();
        let request = minute_request(&clock, 3);
        let tenants = tenants_on_one_shard(200);
        // Round by round, each tenant's count goes on from where it was,
        // through its slot or the table, with or without the shard's lock.
        for round in 0..4u32 {
            for tenant in &tenants {
                let outcome = cache.acquire_tenant_slot_now(&prefix, *tenant, &request).unwrap();
                match round {
                    0..3 => assert!(
                        matches!(outcome, SlotOutcome::Admitted { remaining, .. } if remaining == 2 - round),
                        "round {round}: {outcome:?}"
                    ),
                    _ => assert!(matches!(outcome, SlotOutcome::Refused { used: 3, .. }), "{outcome:?}"),
                }
            }
        }
        let state = lock(&cache.shared.shards, 1);
        let in_slots = state.slots.len();
        assert!((1..=64).contains(&in_slots), "{in_slots} in slots");
        assert_eq!(
            in_slots + state.tenants.len(),
            tenants.len(),
            "each tenant in one place"
        );
        drop(state);
        assert_eq!(cache.len().1, tenants.len());
        assert_eq!(cache.stored_hits(), 3 * tenants.len());
    }

    #[test]
    fn a_shard_whose_tenants_decide_without_its_lock_is_still_swept() {
        let (clock, cache, prefix) = limiter_cache();
        let [busy, idle] = tenants_on_one_shard(2)[..] else {
            unreachable!()
        };
        assert!(admitted(cache.acquire_tenant_slot_now(
            &prefix,
            idle,
            &minute_request(&clock, 10)
        )));
        clock.advance(Duration::from_secs(122));
        let ops = || lock(&cache.shared.shards, 1).ops_since_sweep;
        // `busy` is placed under the shard's lock, then takes its run of
        // decisions in its slot without it, then one under it.
        let before = ops();
        for _ in 0..=UNLOCKED_RUN + 1 {
            clock.advance(Duration::from_millis(1));
            let request = minute_request(&clock, u32::MAX);
            assert!(admitted(cache.acquire_tenant_slot_now(&prefix, busy, &request)));
        }
        assert_eq!(ops() - before, 2, "two of {} decisions took the lock", UNLOCKED_RUN + 2);
        // `idle` has expired; `busy` takes decisions, almost all without
        // the shard's lock, long enough for its sweep to come due.
        let decisions = UNLOCKED_RUN as usize * (SWEEP_SLACK + 4);
        for _ in 0..decisions {
            clock.advance(Duration::from_millis(1));
            let request = minute_request(&clock, u32::MAX);
            assert!(admitted(cache.acquire_tenant_slot_now(&prefix, busy, &request)));
        }
        let state = lock(&cache.shared.shards, 1);
        assert_eq!(state.slots.len(), 1, "the idle tenant's slot was freed");
        drop(state);
        assert_eq!(entries_held(&cache), 1);
    }

    #[test]
    fn closing_the_cache_empties_the_slots_and_refuses_their_tenants() {
        let (clock, cache, prefix) = limiter_cache();
        let tenant = TenantId::from_u128(5);
        let request = minute_request(&clock, 10);
        assert!(admitted(cache.acquire_tenant_slot_now(&prefix, tenant, &request)));
        assert!(admitted(cache.acquire_tenant_slot_now(&prefix, tenant, &request)));
        let shard = TenantName::new(0, 5).shard();
        assert_eq!(
            lock(&cache.shared.shards, shard).slots.len(),
            1,
            "the tenant is in a slot"
        );
        ready(cache.close()).unwrap();
        assert!(matches!(
            cache.acquire_tenant_slot_now(&prefix, tenant, &request),
            Err(CacheError::Closed)
        ));
        assert_eq!(cache.stored_hits(), 0);
        assert_eq!(lock(&cache.shared.shards, shard).slots.len(), 0);
    }

    #[test]
    fn racing_threads_over_more_tenants_than_slots_admit_exactly_the_limit_each() {
        // Four threads over 300, then 450, tenants of one shard (64
        // slots): tenants race for slots, into the table, and — once the
        // first phase's series have expired — for the slots of expired
        // tenants, while other threads decide for those tenants. The clock
        // stands still within a phase, so each tenant admits exactly
        // `LIMIT`.
        const LIMIT: u32 = 5;
        const TRIES: usize = 3;
        let (clock, cache, prefix) = limiter_cache();
        let tenants = tenants_on_one_shard(600);
        for (phase, tenants) in [&tenants[..300], &tenants[150..]].into_iter().enumerate() {
            let request = minute_request(&clock, LIMIT);
            let counts: Vec<AtomicUsize> = tenants.iter().map(|_| AtomicUsize::new(0)).collect();
            std::thread::scope(|s| {
                for thread in 0..4usize {
                    let (cache, prefix, counts) = (&cache, &prefix, &counts);
                    s.spawn(move || {
                        // Each thread tries every tenant `TRIES` times, in
                        // an order of its own (7 is prime to both counts).
                        for n in 0..TRIES * tenants.len() {
                            let i = (n * 7 + thread * 13) % tenants.len();
                            if admitted(cache.acquire_tenant_slot_now(prefix, tenants[i], &request)) {
                                counts[i].fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                }
            });
            let since = clock.now().saturating_sub(request.window);
            for (tenant, count) in tenants.iter().zip(&counts) {
                let key = super::super::KeyBuf::tenant("kg:ratelimit", tenant);
                assert_eq!(count.load(Ordering::Relaxed), LIMIT as usize, "phase {phase}: {tenant}");
                let held = ready(cache.count_since(key.as_str(), since)).unwrap();
                assert_eq!(held, u64::from(LIMIT), "phase {phase}: {tenant}'s one series");
            }
            clock.advance(Duration::from_secs(122));
        }
    }

    #[test]
    fn a_token_decision_and_a_decision_in_the_slot_racing_on_one_tenant_admit_the_limit_once() {
        // One thread decides through the tenant's slot (no shard lock), the
        // other through the token path (the shard's lock, then the slot's):
        // the token path must hold the series from its count to its push.
        // Round after round (each a fresh window), the two start on each
        // tenant together.
        const LIMIT: u32 = 4;
        const ROUNDS: usize = 60;
        let (clock, cache, prefix) = limiter_cache();
        let ask = TokenAsk {
            tokens: 1,
            limit: u64::MAX,
            lease: Duration::from_secs(60),
        };
        // Few enough for every one to find a slot.
        let tenants: Vec<TenantId> = (0..1_000u128).map(TenantId::from_u128).collect();
        let keys: Vec<_> = tenants
            .iter()
            .map(|t| super::super::KeyBuf::tenant("kg:ratelimit", t))
            .collect();
        for round in 0..ROUNDS {
            let request = minute_request(&clock, LIMIT);
            let counts: Vec<AtomicUsize> = tenants.iter().map(|_| AtomicUsize::new(0)).collect();
            // Both threads at tenant `i`: spun for, not parked for, so that
            // neither is still waking when the other has decided.
            let arrived = AtomicUsize::new(0);
            let start = |i: usize| {
                arrived.fetch_add(1, Ordering::AcqRel);
                while arrived.load(Ordering::Acquire) < 2 * (i + 1) {
                    std::hint::spin_loop();
                }
            };
            std::thread::scope(|s| {
                s.spawn(|| {
                    for (i, tenant) in tenants.iter().enumerate() {
                        start(i);
                        for _ in 0..LIMIT {
                            if admitted(cache.acquire_tenant_slot_now(&prefix, *tenant, &request)) {
                                counts[i].fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                });
                s.spawn(|| {
                    for (i, key) in keys.iter().enumerate() {
                        start(i);
                        for _ in 0..LIMIT {
                            let outcome = ready(cache.acquire_with_tokens(key.as_str(), request, ask)).unwrap();
                            if let TokenOutcome::Admitted { .. } = outcome {
                                counts[i].fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                });
            });
            let other: Vec<usize> = (0..tenants.len())
                .filter(|i| counts[*i].load(Ordering::Relaxed) != LIMIT as usize)
                .collect();
            assert!(
                other.is_empty(),
                "round {round}: admitted other than {LIMIT}: {other:?}"
            );
            clock.advance(Duration::from_secs(122));
        }
        let in_slots: usize = (0..SHARDS).map(|i| lock(&cache.shared.shards, i).slots.len()).sum();
        assert_eq!(in_slots, tenants.len(), "every tenant raced in its slot");
    }

    #[test]
    fn keys_spread_over_the_shards() {
        let mut used = [false; SHARDS];
        for n in 0..1_000u128 {
            used[shard_of(&format!("kg:ratelimit:{}", crate::TenantId::from_u128(n)))] = true;
        }
        assert!(!used[TAGGED]);
        assert!(
            used[1..].iter().all(|u| *u),
            "every hashed shard holds some of 1 000 tenants"
        );
    }
}
