//! `MemoryCache`: the in-process adapter, and the default.
//!
//! It is not a test double: one process with a `MemoryCache` limits and breaks
//! correctly. Its only limitation is that processes cannot share it.
//!
//! # Exactness
//!
//! The keys are split over a few shards, each a table (`table.rs`) behind
//! its own mutex. A key that begins with a hash tag (`{…}`, as a breaker's
//! seven keys `{prefix}:state`, … do) lives on one shard with every other
//! tagged key, and every other key (a limiter's `{prefix}:{tenant}`) is
//! placed by its hash over the rest. Every operation locks the shards of the
//! keys it touches (one, for every key set the crate builds) for its whole
//! step, so each atomic operation is one critical section and racing tasks
//! see exactly the answers a single caller would. The decisions are the pure
//! functions of [`crate::decide`]; this store only reads their inputs and
//! writes what they say. Calls in flight (a router's picks span several
//! keys) are kept under one lock of their own.
//!
//! # Time and memory
//!
//! TTLs are measured on the injected [`Clock`] — never on the OS — so
//! simulated time and TTL time agree. Expired entries are dropped when
//! touched, and a shard is swept in bulk once its operations since its last
//! sweep exceed [`SWEEP_SLACK`](table::SWEEP_SLACK) plus the keys that sweep
//! kept; each such sweep also sweeps another shard, in turn, so a shard
//! nobody touches is swept too. Memory therefore stays bounded by live
//! tenants × their hits (a limiter's series holds the hits of one series
//! lifetime, about `2 × rpm` — see [`RateLimiter`](crate::RateLimiter)), and
//! idle tenants go away.

mod breaker;
mod series;
mod table;

use std::hash::BuildHasher as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use series::Series;
use table::{Map, Table, Value};

use super::{
    BreakerStore, BudgetStore, Cache, HitWindow, InFlightStore, KeyValue, LimiterStore, SlotRequest, TimeSource,
    TokenStore,
};
use crate::clock::{Clock, SystemClock};
use crate::decide::breaker::{BreakerCommand, BreakerKeys, BreakerParams, BreakerSnapshot, BreakerStep};
use crate::decide::budget::{
    BudgetCommand, BudgetParams, BudgetState, BudgetStep, clamp_budget_stamp, step as budget_step,
};
use crate::decide::concurrency::{ConcurrencyCommand, ConcurrencyParams, ConcurrencyStep, step as concurrency_step};
use crate::decide::pick::{Pick, PickRequest, check_pick, least_loaded};
use crate::decide::tokens::{ReservationId, TokenAsk, TokenEntry, TokenOutcome, combine, decide_tokens, settle_entry};
use crate::decide::window::{SlotOutcome, clamp_stamp, decide};
use crate::error::CacheError;
use crate::time::{MAX_STORED, Timestamp, stored_number};

/// How many shards untagged keys are spread over.
const HASHED: usize = 8;

/// The shard every key that begins with `{` lives on.
const TAGGED: usize = 0;

/// How many shards a cache has: one for tagged keys, [`HASHED`] for the rest.
const SHARDS: usize = 1 + HASHED;

/// The in-process [`Cache`]: every capability of the port, over sharded maps.
///
/// Cheap to clone; clones share one store.
#[derive(Clone)]
pub struct MemoryCache {
    shared: Arc<Shared>,
}

struct Shared {
    clock: Arc<dyn Clock>,
    time_source: TimeSource,
    shards: [Mutex<Table>; SHARDS],
    /// Calls in flight per key, as (id, lease end).
    in_flight: Mutex<Map<Vec<(u64, Timestamp)>>>,
    /// Set by `close` before it empties each lock's data; read under a lock.
    closed: AtomicBool,
}

/// The shard `key` lives on: keys that begin with a hash tag (`{…}`) share
/// one; every other key is placed by its hash over the rest.
fn shard_of(key: &str) -> usize {
    if key.starts_with('{') {
        return TAGGED;
    }
    let hash = rustc_hash::FxBuildHasher.hash_one(key);
    // The high bits mix best.
    1 + (hash >> 32) as usize % HASHED
}

impl std::fmt::Debug for MemoryCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (mut values, mut windows) = (0, 0);
        for shard in &self.shared.shards {
            let table = shard.lock();
            values += table.values.len();
            windows += table.series.len();
        }
        f.debug_struct("MemoryCache")
            .field("time_source", &self.shared.time_source)
            .field("values", &values)
            .field("windows", &windows)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Default for MemoryCache {
    /// A cache on the system clock.
    fn default() -> Self {
        Self::new(Arc::new(SystemClock))
    }
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
        MemoryCache {
            shared: Arc::new(Shared {
                clock,
                time_source,
                shards: std::array::from_fn(|_| Mutex::default()),
                in_flight: Mutex::default(),
                closed: AtomicBool::new(false),
            }),
        }
    }

    /// Live keys holding a value, and keys holding a hit window — what memory is
    /// spent on. Expired entries still waiting for a sweep are not counted.
    pub fn len(&self) -> (usize, usize) {
        let now = self.shared.clock.now();
        let (mut values, mut windows) = (0, 0);
        for shard in &self.shared.shards {
            let table = shard.lock();
            values += table.values.values().filter(|e| e.live(now)).count();
            windows += table.series.values().filter(|s| !s.expired(now)).count();
        }
        (values, windows)
    }

    /// Total hits held in memory across every window, expired series not
    /// yet swept included: bounded by live tenants × the hits of one series
    /// lifetime each.
    pub fn stored_hits(&self) -> usize {
        let held = |shard: &Mutex<Table>| shard.lock().series.values().map(Series::held).sum::<usize>();
        self.shared.shards.iter().map(held).sum()
    }

    fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// Locks `key`'s shard, checks the cache is open, and sweeps if due.
    fn lock(&self, key: &str, now: Timestamp) -> Result<MutexGuard<'_, Table>, CacheError> {
        self.lock_shard(shard_of(key), now)
    }

    /// Locks shard `index`, checks the cache is open, and sweeps the shard
    /// (and the next other one, if nobody holds it) if due.
    fn lock_shard(&self, index: usize, now: Timestamp) -> Result<MutexGuard<'_, Table>, CacheError> {
        let mut table = self.shared.shards[index].lock();
        if self.is_closed() {
            return Err(CacheError::Closed);
        }
        if table.tick() {
            table.sweep(now);
            let other = table.sweeps_next;
            table.sweeps_next = (other + 1) % SHARDS;
            // Never waits: a shard in use (this one included) is skipped.
            if let Some(mut other) = self.shared.shards[other].try_lock() {
                other.sweep(now);
            }
        }
        Ok(table)
    }

    /// The instant an atomic step stamps with: the caller's or the store's.
    fn stamp(&self, caller_now: Timestamp, clock_now: Timestamp) -> Timestamp {
        match self.shared.time_source {
            TimeSource::Caller => caller_now,
            TimeSource::Store => clock_now,
        }
    }

    /// A limiter decision's stamp, and whether it was clamped
    /// ([`clamp_stamp`]).
    fn slot_stamp(&self, request: &SlotRequest, clock_now: Timestamp) -> (Timestamp, bool) {
        match self.shared.time_source {
            TimeSource::Store => (clock_now, false),
            TimeSource::Caller => clamp_stamp(request.now, clock_now, request.window, request.max_ahead),
        }
    }

    /// The atomic slot decision at `key`: count, decide, record if admitted.
    fn acquire(&self, key: &str, request: &SlotRequest) -> Result<SlotOutcome, CacheError> {
        let clock_now = self.shared.clock.now();
        let (now, clamped) = self.slot_stamp(request, clock_now);
        let since = now.saturating_sub(request.window);
        let mut table = self.lock(key, clock_now)?;
        let (count, freeing) = table
            .series(key, clock_now)
            .map_or((0, None), |s| s.slot(since, request.limit));
        let outcome = decide(count, freeing, request.limit, now, request.window);
        if let SlotOutcome::Admitted { .. } = outcome {
            table
                .record(key, now, request.ttl, clock_now)
                .map_err(|_| full("acquire_slot", key))?;
        }
        Ok(outcome.with_clamped(clamped))
    }
}

/// The error `operation` reports for a hit `key`'s series has no room for.
#[cold]
fn full(operation: &'static str, key: &str) -> CacheError {
    CacheError::Unavailable {
        operation,
        reason: format!("no memory for another hit in the series of {key}"),
    }
}

impl Cache for MemoryCache {
    async fn close(&self) -> Result<(), CacheError> {
        self.shared.closed.store(true, Ordering::Release);
        for shard in &self.shared.shards {
            shard.lock().clear();
        }
        *self.shared.in_flight.lock() = Map::default();
        Ok(())
    }

    fn stamps_with_own_clock(&self) -> bool {
        self.shared.time_source == TimeSource::Store
    }
}

impl KeyValue for MemoryCache {
    async fn get(&self, key: &str) -> Result<Option<String>, CacheError> {
        let now = self.shared.clock.now();
        let mut table = self.lock(key, now)?;
        Ok(table.value(key, now).map(|e| match &e.value {
            Value::Text(s) => s.clone(),
            Value::Int(n) => n.to_string(),
        }))
    }

    async fn set(&self, key: &str, value: &str, ttl: Option<Duration>) -> Result<(), CacheError> {
        let now = self.shared.clock.now();
        let mut table = self.lock(key, now)?;
        table.put(
            key,
            Value::Text(value.to_owned()),
            ttl.map(|ttl| now.saturating_add(ttl)),
        );
        Ok(())
    }

    async fn increment(&self, key: &str, ttl: Option<Duration>) -> Result<i64, CacheError> {
        let now = self.shared.clock.now();
        let mut table = self.lock(key, now)?;
        let Some(entry) = table.value(key, now) else {
            table.put(key, Value::Int(1), ttl.map(|ttl| now.saturating_add(ttl)));
            return Ok(1);
        };
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

    async fn delete(&self, key: &str) -> Result<(), CacheError> {
        let now = self.shared.clock.now();
        let mut table = self.lock(key, now)?;
        table.values.remove(key);
        table.series.remove(key);
        table.ledgers.remove(key);
        // Under the shard's lock still: one critical section.
        self.shared.in_flight.lock().remove(key);
        Ok(())
    }
}

impl HitWindow for MemoryCache {
    async fn record_hit(&self, key: &str, at: Timestamp, ttl: Duration) -> Result<(), CacheError> {
        let now = self.shared.clock.now();
        let mut table = self.lock(key, now)?;
        table.record(key, at, ttl, now).map_err(|_| full("record_hit", key))
    }

    async fn count_since(&self, key: &str, since: Timestamp) -> Result<u64, CacheError> {
        let now = self.shared.clock.now();
        let mut table = self.lock(key, now)?;
        Ok(table.series(key, now).map_or(0, |s| s.window(since).0))
    }

    async fn oldest_since(&self, key: &str, since: Timestamp) -> Result<Option<Timestamp>, CacheError> {
        let now = self.shared.clock.now();
        let mut table = self.lock(key, now)?;
        Ok(table.series(key, now).and_then(|s| s.window(since).1))
    }
}

impl LimiterStore for MemoryCache {
    async fn acquire_slot(&self, key: &str, request: SlotRequest) -> Result<SlotOutcome, CacheError> {
        self.acquire(key, &request)
    }

    #[cfg(feature = "mutants")]
    fn hit_window(&self) -> Option<&impl HitWindow> {
        Some(self)
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
        let clock_now = self.shared.clock.now();
        let now = match self.shared.time_source {
            TimeSource::Caller => clamp_budget_stamp(request.now, clock_now, request.max_ahead),
            TimeSource::Store => clock_now,
        };
        let mut map = self.shared.in_flight.lock();
        if self.is_closed() {
            return Err(CacheError::Closed);
        }
        let mut counts = Vec::with_capacity(keys.len());
        for key in keys {
            let live = map.get_mut(*key).map_or(0, |leases| {
                leases.retain(|&(_, end)| end >= now);
                leases.len()
            });
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

    async fn concurrency_step(
        &self,
        key: &str,
        command: ConcurrencyCommand,
        params: ConcurrencyParams,
        request: PickRequest,
    ) -> Result<ConcurrencyStep, CacheError> {
        let clock_now = self.shared.clock.now();
        let now = match self.shared.time_source {
            TimeSource::Caller => clamp_budget_stamp(request.now, clock_now, request.max_ahead),
            TimeSource::Store => clock_now,
        };
        // The shard's lock, then the leases': `delete`'s order.
        let mut table = self.lock(key, clock_now)?;
        let (stored, healed) = match table.value(key, clock_now).map(|e| &e.value) {
            None => (None, false),
            Some(Value::Text(text)) => match stored_number(text) {
                Some(limit) => (Some(limit), false),
                None => (None, true),
            },
            Some(Value::Int(n)) => match u64::try_from(*n).ok().filter(|n| *n <= MAX_STORED) {
                Some(limit) => (Some(limit), false),
                None => (None, true),
            },
        };
        let mut map = self.shared.in_flight.lock();
        let leases = map.entry(key.to_owned()).or_default();
        leases.retain(|&(_, end)| end >= now);
        let held = leases.iter().any(|&(id, _)| id == request.id);
        let mut step = concurrency_step(stored, leases.len() as u64, held, command, &params);
        step.healed = healed;
        match command {
            ConcurrencyCommand::Admit if step.admitted => {
                leases.retain(|&(id, _)| id != request.id);
                leases.push((request.id, now.saturating_add(request.lease)));
            }
            ConcurrencyCommand::Admit => {}
            ConcurrencyCommand::Complete(_) => leases.retain(|&(id, _)| id != request.id),
        }
        if leases.is_empty() {
            map.remove(key);
        }
        table.put(
            key,
            Value::Text(step.next.to_string()),
            Some(clock_now.saturating_add(params.ttl)),
        );
        Ok(step)
    }

    async fn end_in_flight(&self, key: &str, id: u64) -> Result<(), CacheError> {
        let mut map = self.shared.in_flight.lock();
        if self.is_closed() {
            return Err(CacheError::Closed);
        }
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
        let (now, clamped) = self.slot_stamp(&request, clock_now);
        let since = now.saturating_sub(request.window);
        let mut table = self.lock(key, clock_now)?;
        let (count, freeing) = table
            .series(key, clock_now)
            .map_or((0, None), |s| s.slot(since, request.limit));
        let slot = decide(count, freeing, request.limit, now, request.window);
        // Reservations older than the series' lifetime are pruned, as hits are.
        let horizon = clock_now.saturating_sub(request.ttl);
        let entries: &[TokenEntry] = match table.ledger(key, clock_now) {
            Some(ledger) => {
                ledger.entries.retain(|e| e.id.at >= horizon);
                &ledger.entries
            }
            None => &[],
        };
        let tokens = decide_tokens(entries, &ask, now, request.window);
        let seq = entries.iter().filter(|e| e.id.at == now).count();
        let seq = u32::try_from(seq).unwrap_or(u32::MAX);
        let outcome = combine(count, slot, tokens, now, seq, request.window);
        if let TokenOutcome::Admitted { reservation, .. } = outcome {
            table
                .record(key, now, request.ttl, clock_now)
                .map_err(|_| full("acquire_with_tokens", key))?;
            // The mutant checks the estimate but holds nothing until the
            // call settles to what it used.
            let held = if crate::mutants::active(crate::mutants::Mutant::TokensChargedAfterCall) {
                0
            } else {
                ask.tokens
            };
            let entry = TokenEntry {
                id: reservation,
                tokens: held,
                lease_end: Some(now.saturating_add(ask.lease)),
            };
            table.reserve(key, entry, clock_now.saturating_add(request.ttl), clock_now);
        }
        Ok(with_clamped(outcome, clamped))
    }

    async fn settle_tokens(&self, key: &str, id: ReservationId, actual: u64) -> Result<bool, CacheError> {
        let clock_now = self.shared.clock.now();
        let mut table = self.lock(key, clock_now)?;
        Ok(table
            .ledger(key, clock_now)
            .is_some_and(|ledger| settle_entry(&mut ledger.entries, id, actual)))
    }
}

/// `outcome`, saying whether its stamp was clamped.
fn with_clamped(outcome: TokenOutcome, clamped: bool) -> TokenOutcome {
    match outcome {
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
        let mut table = self.lock(key, clock_now)?;
        let (stored, healed) = match table.value(key, clock_now).map(|e| &e.value) {
            None => (None, false),
            Some(Value::Text(text)) => match BudgetState::decode(text) {
                Some(bucket) => (Some(bucket), false),
                None => (None, true),
            },
            Some(Value::Int(_)) => (None, true),
        };
        let mut step = budget_step(stored, command, &params, at);
        step.healed = healed;
        table.put(
            key,
            Value::Text(step.state.encode()),
            Some(clock_now.saturating_add(params.ttl)),
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
        let clock_now = self.shared.clock.now();
        let now = self.stamp(now, clock_now);
        let mut held = breaker::Held::lock(self, keys, clock_now)?;
        Ok(held.step(command, &params, now, clock_now))
    }

    async fn breaker_read(
        &self,
        keys: &BreakerKeys,
        now: Timestamp,
    ) -> Result<(BreakerSnapshot, Timestamp), CacheError> {
        let clock_now = self.shared.clock.now();
        let now = self.stamp(now, clock_now);
        let held = breaker::Held::lock(self, keys, clock_now)?;
        Ok((held.snapshot(clock_now), now))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::ManualClock;
    use crate::cache::KeyBuf;
    use crate::decide::breaker::{CircuitState, Origin, StoredState};
    use crate::tenant::TenantId;

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

    fn manual() -> (Arc<ManualClock>, MemoryCache) {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let cache = MemoryCache::new(clock.clone());
        (clock, cache)
    }

    /// Entries the shards hold, expired ones not yet swept included.
    fn entries_held(cache: &MemoryCache) -> usize {
        cache.shared.shards.iter().map(|shard| shard.lock().keys()).sum()
    }

    /// A limiter's decision for `tenant` under `prefix`, at its key.
    fn tenant_slot(
        cache: &MemoryCache,
        prefix: &str,
        tenant: TenantId,
        request: SlotRequest,
    ) -> Result<SlotOutcome, CacheError> {
        ready(cache.acquire_slot(KeyBuf::tenant(prefix, &tenant).as_str(), request))
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
    fn tagged_keys_share_a_shard_and_untagged_ones_spread_over_the_rest() {
        let keys = BreakerKeys::new("kg:circuit");
        assert!(keys.all().iter().all(|key| shard_of(key) == TAGGED));
        let mut used = [false; SHARDS];
        for n in 0..1_000u128 {
            used[shard_of(KeyBuf::tenant("kg:ratelimit", &TenantId::from_u128(n)).as_str())] = true;
        }
        assert!(!used[TAGGED]);
        assert!(
            used[1..].iter().all(|u| *u),
            "every hashed shard holds some of 1 000 tenants"
        );
    }

    #[test]
    fn a_shard_is_swept_once_its_operations_exceed_the_slack_plus_what_its_last_sweep_kept() {
        use table::SWEEP_SLACK;
        let (clock, cache) = manual();
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
        use table::SWEEP_SLACK;
        let (clock, cache) = manual();
        let short = Duration::from_secs(1);
        set_tagged(&cache, "old", 5, short);
        clock.advance(2 * short);
        // Counting the keys held now, ops would never catch up with them.
        for n in 0..SWEEP_SLACK * 4 {
            ready(cache.set(&format!("{{t}}:new{n}"), "1", Some(Duration::from_secs(1_000)))).unwrap();
        }
        assert_eq!(
            entries_held(&cache),
            SWEEP_SLACK * 4,
            "the expired keys outlived every sweep"
        );
    }

    #[test]
    fn a_shard_nobody_touches_is_swept_by_the_others() {
        let (clock, cache) = manual();
        set_tagged(&cache, "idle", 3, Duration::from_secs(1));
        clock.advance(Duration::from_secs(2));
        // Operations on untagged keys only: every shard but the tagged one.
        for n in 0..SHARDS * (table::SWEEP_SLACK + 2) * 2 {
            ready(cache.get(&format!("churn:{n}"))).unwrap();
        }
        assert_eq!(entries_held(&cache), 0);
    }

    #[test]
    fn every_kind_of_entry_is_swept_once_expired() {
        let (clock, cache) = manual();
        let (short, long) = (Duration::from_secs(1), Duration::from_secs(1_000));
        let churn = |cache: &MemoryCache| {
            for n in 0..SHARDS * (table::SWEEP_SLACK + 16) * 2 {
                ready(cache.get(&format!("churn:{n}"))).unwrap();
            }
        };
        ready(cache.set("stays", "1", Some(long))).unwrap();
        ready(cache.set("shortened", "1", Some(long))).unwrap();
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
        tenant_slot(&cache, "kg:ratelimit", TenantId::from_u128(7), request).unwrap();
        let ask = TokenAsk {
            tokens: 1,
            limit: 10,
            lease: short,
        };
        ready(cache.acquire_with_tokens("ledger", request, ask)).unwrap();
        // A ledger whose key's series lives long: only the ledger is short.
        ready(cache.record_hit("long ledger", clock.now(), long)).unwrap();
        ready(cache.acquire_with_tokens("long ledger", request, ask)).unwrap();
        // Three values; four series (a window, a tenant's and the two
        // ledgers' keys'); two ledgers.
        assert_eq!(entries_held(&cache), 3 + 4 + 2);
        clock.advance(2 * short);
        churn(&cache);
        assert_eq!(
            entries_held(&cache),
            2,
            "what expired was swept, \"stays\" and the series of \"long ledger\" kept"
        );
    }

    #[test]
    fn closing_the_cache_frees_everything_and_refuses_every_operation() {
        let (clock, cache) = manual();
        let request = SlotRequest {
            now: clock.now(),
            window: Duration::from_secs(60),
            limit: 10,
            ttl: Duration::from_secs(121),
            max_ahead: Duration::ZERO,
        };
        tenant_slot(&cache, "kg:ratelimit", TenantId::from_u128(5), request).unwrap();
        ready(cache.set("k", "v", None)).unwrap();
        let pick = PickRequest {
            now: clock.now(),
            id: 1,
            lease: Duration::from_secs(60),
            max_ahead: Duration::ZERO,
        };
        ready(cache.pick_least_loaded(&["d"], &[1], pick)).unwrap();
        ready(Cache::close(&cache)).unwrap();
        ready(Cache::close(&cache)).unwrap();
        assert_eq!((entries_held(&cache), cache.stored_hits()), (0, 0));
        assert!(cache.shared.in_flight.lock().is_empty());
        assert!(matches!(
            tenant_slot(&cache, "kg:ratelimit", TenantId::from_u128(5), request),
            Err(CacheError::Closed)
        ));
        assert!(matches!(ready(cache.get("k")), Err(CacheError::Closed)));
        assert!(matches!(ready(cache.end_in_flight("d", 1)), Err(CacheError::Closed)));
    }

    fn breaker_params(failure_threshold: u32) -> BreakerParams {
        BreakerParams {
            failure_threshold,
            recovery_timeout: Duration::from_secs(60),
            max_recovery_timeout: Duration::from_secs(60),
            half_open_max_calls: 1,
            probe_lease: Duration::from_secs(60),
        }
    }

    /// Untagged keys over more than one shard.
    fn spread_keys() -> BreakerKeys {
        BreakerKeys {
            state: "s".to_owned(),
            failures: "f".to_owned(),
            opened_at: "o".to_owned(),
            probes: "p".to_owned(),
            cooldown_until: "c".to_owned(),
            openings: "n".to_owned(),
            closed_at: "z".to_owned(),
        }
    }

    #[test]
    fn keys_on_different_shards_still_step_as_one() {
        let (clock, cache) = manual();
        let keys = spread_keys();
        let shards = keys.all().map(shard_of);
        assert!(
            shards.iter().any(|s| *s != shards[0]),
            "the keys span shards: {shards:?}"
        );
        let fail = BreakerCommand::RecordFailure(Origin::Untracked);
        let now = clock.now();
        let first = ready(cache.breaker_step(&keys, fail, breaker_params(2), now)).unwrap();
        assert_eq!(first.after, CircuitState::Closed);
        let second = ready(cache.breaker_step(&keys, fail, breaker_params(2), now)).unwrap();
        assert_eq!(second.after, CircuitState::Open);
        let (snapshot, _) = ready(cache.breaker_read(&keys, now)).unwrap();
        assert_eq!(snapshot.state, StoredState::Valid(CircuitState::Open));
        assert_eq!(snapshot.opened_at, Some(now));
        assert_eq!(snapshot.failures, None);
    }

    #[test]
    fn idle_tenants_are_swept_and_their_hits_freed() {
        let (clock, cache) = manual();
        let request = |clock: &ManualClock| SlotRequest {
            now: clock.now(),
            window: Duration::from_secs(60),
            limit: 10,
            ttl: Duration::from_secs(121),
            max_ahead: Duration::ZERO,
        };
        for n in 0..500u128 {
            tenant_slot(&cache, "kg:ratelimit", TenantId::from_u128(n), request(&clock)).unwrap();
        }
        assert_eq!((cache.len().1, cache.stored_hits()), (500, 500));
        clock.advance(Duration::from_secs(122));
        assert_eq!(cache.len().1, 0, "expired, if not yet swept");
        for _ in 0..SHARDS * (table::SWEEP_SLACK + 500) {
            tenant_slot(&cache, "kg:ratelimit", TenantId::from_u128(7), request(&clock)).unwrap();
        }
        assert_eq!((entries_held(&cache), cache.stored_hits()), (1, 10));
    }

    #[test]
    fn racing_threads_admit_exactly_the_limit_for_each_tenant() {
        // Four threads over 300 tenants, each thread through the slot
        // decision or the token path in turn; the clock stands still, so
        // each tenant admits exactly `LIMIT`.
        const LIMIT: u32 = 5;
        const TRIES: usize = 3;
        let (clock, cache) = manual();
        let prefix = "kg:ratelimit";
        let tenants: Vec<TenantId> = (0..300u128).map(TenantId::from_u128).collect();
        let request = SlotRequest {
            now: clock.now(),
            window: Duration::from_secs(60),
            limit: LIMIT,
            ttl: Duration::from_secs(121),
            max_ahead: Duration::ZERO,
        };
        let ask = TokenAsk {
            tokens: 1,
            limit: u64::MAX,
            lease: Duration::from_secs(60),
        };
        let counts: Vec<AtomicUsize> = tenants.iter().map(|_| AtomicUsize::new(0)).collect();
        std::thread::scope(|s| {
            for thread in 0..4usize {
                let (cache, counts, tenants) = (&cache, &counts, &tenants);
                s.spawn(move || {
                    for n in 0..TRIES * tenants.len() {
                        // An order of its own per thread (7 is prime to 300).
                        let i = (n * 7 + thread * 13) % tenants.len();
                        let key = KeyBuf::tenant(prefix, &tenants[i]);
                        let admitted = if (n + thread) % 2 == 0 {
                            matches!(
                                ready(cache.acquire_slot(key.as_str(), request)),
                                Ok(SlotOutcome::Admitted { .. })
                            )
                        } else {
                            matches!(
                                ready(cache.acquire_with_tokens(key.as_str(), request, ask)),
                                Ok(TokenOutcome::Admitted { .. })
                            )
                        };
                        if admitted {
                            counts[i].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        for (tenant, count) in tenants.iter().zip(&counts) {
            assert_eq!(count.load(Ordering::Relaxed), LIMIT as usize, "{tenant}");
        }
    }
}
