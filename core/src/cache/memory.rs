//! `MemoryCache`: the in-process adapter, and the default.
//!
//! It is not a test double: one process with a `MemoryCache` limits and breaks
//! correctly. Its only limitation is that processes cannot share it. All state
//! sits behind one mutex, so each atomic operation is one critical section and
//! racing tasks in one process see exactly the answers a single caller would.
//!
//! TTLs are measured on the injected [`Clock`] — never on the OS — so simulated
//! time and TTL time agree. Expired entries are dropped when touched and swept
//! in bulk once the number of operations since the last sweep exceeds the
//! number of live keys, so memory stays bounded by live tenants × rpm and idle
//! tenants go away.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::{BreakerStore, Cache, HitWindow, KeyValue, LimiterStore, SlotRequest, TimeSource};
use crate::breaker::machine::{
    self, BreakerCommand, BreakerKeys, BreakerParams, BreakerSnapshot, BreakerStep, BreakerView, FailuresWrite,
    ProbeLeases, StoredState, Write,
};
use crate::clock::{Clock, SystemClock};
use crate::error::CacheError;
use crate::limiter::{SlotOutcome, clamp_stamp, decide};
use crate::time::Timestamp;

/// Maps keyed by cache key with a fast, fixed-seed hasher: lookups are the hot
/// path's main cost, and iteration order never depends on a random seed (the
/// simulator's byte-for-byte determinism needs that).
type Map<V> = HashMap<String, V, rustc_hash::FxBuildHasher>;

/// The in-process [`Cache`]: every capability of the port, behind one mutex.
///
/// Cheap to clone; clones share one store.
#[derive(Clone)]
pub struct MemoryCache {
    shared: Arc<Shared>,
}

struct Shared {
    clock: Arc<dyn Clock>,
    time_source: TimeSource,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    values: Map<ValueEntry>,
    windows: Map<Series>,
    ops_since_sweep: usize,
    closed: bool,
}

struct ValueEntry {
    value: Value,
    deadline: Option<Timestamp>,
}

enum Value {
    Text(String),
    Int(i64),
}

struct Series {
    /// Hit instants, ascending.
    hits: VecDeque<Timestamp>,
    deadline: Timestamp,
}

impl std::fmt::Debug for MemoryCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("MemoryCache")
            .field("time_source", &self.shared.time_source)
            .field("values", &state.values.len())
            .field("windows", &state.windows.len())
            .field("closed", &state.closed)
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
    /// ([`crate::limiter::clamp_stamp`]). The simulator's shared cache host
    /// runs either.
    pub fn with_time_source(clock: Arc<dyn Clock>, time_source: TimeSource) -> Self {
        MemoryCache {
            shared: Arc::new(Shared {
                clock,
                time_source,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Live keys holding a value, and keys holding a hit window — what memory is
    /// spent on. Expired entries still waiting for a sweep are not counted.
    pub fn len(&self) -> (usize, usize) {
        let now = self.shared.clock.now();
        let state = self.lock();
        let values = state.values.values().filter(|e| e.live(now)).count();
        let windows = state.windows.values().filter(|s| s.deadline > now).count();
        (values, windows)
    }

    /// Total hits held across every window (bounded by live tenants × rpm × 2).
    pub fn stored_hits(&self) -> usize {
        self.lock().windows.values().map(|s| s.hits.len()).sum()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a
        // way later operations misread, so a poisoned lock is still usable.
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Locks, checks the cache is open, and sweeps if due.
    fn open(&self, now: Timestamp) -> Result<MutexGuard<'_, State>, CacheError> {
        let mut state = self.lock();
        if state.closed {
            return Err(CacheError::Closed);
        }
        state.ops_since_sweep += 1;
        if state.ops_since_sweep > 64 + state.values.len() + state.windows.len() {
            state.sweep(now);
        }
        Ok(state)
    }

    fn stamp(&self, caller_now: Timestamp, clock_now: Timestamp) -> Timestamp {
        match self.shared.time_source {
            TimeSource::Caller => caller_now,
            TimeSource::Store => clock_now,
        }
    }
}

impl Series {
    fn first(at: Timestamp, ttl: Duration, now: Timestamp) -> Series {
        Series {
            hits: VecDeque::from([at]),
            deadline: now.saturating_add(ttl),
        }
    }

    /// Index of the first hit at or after `since`.
    fn start(&self, since: Timestamp) -> usize {
        self.hits.partition_point(|h| *h < since)
    }

    /// Adds a hit at `at`, extends the series' life to `ttl` from `now`, and
    /// drops hits more than `ttl` older than `now` — the store's clock, never
    /// the newest stamp, so one caller's far-future stamp cannot prune
    /// everyone else's hits.
    fn push(&mut self, at: Timestamp, ttl: Duration, now: Timestamp) {
        if self.hits.back().is_none_or(|last| *last <= at) {
            self.hits.push_back(at);
        } else {
            let pos = self.hits.partition_point(|h| *h <= at);
            self.hits.insert(pos, at);
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
        }
    }
}

impl ValueEntry {
    fn live(&self, now: Timestamp) -> bool {
        self.deadline.is_none_or(|d| d > now)
    }
}

fn deadline(now: Timestamp, ttl: Option<Duration>) -> Option<Timestamp> {
    ttl.map(|ttl| now.saturating_add(ttl))
}

impl State {
    fn sweep(&mut self, now: Timestamp) {
        self.values.retain(|_, e| e.live(now));
        self.windows.retain(|_, s| s.deadline > now);
        self.ops_since_sweep = 0;
    }

    fn value(&mut self, key: &str, now: Timestamp) -> Option<&mut ValueEntry> {
        if self.values.get(key).is_some_and(|e| !e.live(now)) {
            self.values.remove(key);
        }
        self.values.get_mut(key)
    }

    fn put(&mut self, key: &str, value: Value, deadline: Option<Timestamp>) {
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

    fn series(&mut self, key: &str, now: Timestamp) -> Option<&Series> {
        if self.windows.get(key).is_some_and(|s| s.deadline <= now) {
            self.windows.remove(key);
        }
        self.windows.get(key)
    }

    /// The live series at `key`, emptied first if it expired — one lookup.
    fn series_mut(&mut self, key: &str, now: Timestamp) -> Option<&mut Series> {
        let series = self.windows.get_mut(key)?;
        if series.deadline <= now {
            series.hits.clear();
        }
        Some(series)
    }

    fn record(&mut self, key: &str, at: Timestamp, ttl: Duration, now: Timestamp) {
        match self.series_mut(key, now) {
            Some(series) => series.push(at, ttl, now),
            None => {
                self.windows.insert(key.to_owned(), Series::first(at, ttl, now));
            }
        }
    }
}

/// The breaker's keys read straight from the maps, only as the state machine
/// asks for them; expired entries read as absent.
struct LiveKeys<'a> {
    state: &'a State,
    keys: &'a BreakerKeys,
    now: Timestamp,
}

impl LiveKeys<'_> {
    fn value(&self, key: &str) -> Option<&Value> {
        self.state
            .values
            .get(key)
            .filter(|e| e.live(self.now))
            .map(|e| &e.value)
    }

    fn count(&self, key: &str) -> Option<u32> {
        match self.value(key)? {
            Value::Int(n) => u32::try_from(*n).ok(),
            Value::Text(s) => s.parse().ok(),
        }
    }

    fn snapshot(&self) -> BreakerSnapshot {
        BreakerSnapshot {
            state: self.state(),
            failures: self.failures(),
            opened_at: self.opened_at(),
            probes: self.probes(),
        }
    }
}

impl BreakerView for LiveKeys<'_> {
    fn state(&self) -> StoredState {
        match self.value(&self.keys.state) {
            None => StoredState::Missing,
            Some(Value::Text(s)) => StoredState::read(Some(s)),
            Some(Value::Int(n)) => StoredState::Unreadable(n.to_string()),
        }
    }

    fn failures(&self) -> Option<u32> {
        self.count(&self.keys.failures)
    }

    fn opened_at(&self) -> Option<Timestamp> {
        match self.value(&self.keys.opened_at)? {
            Value::Text(s) => Timestamp::parse_secs(s),
            Value::Int(_) => None,
        }
    }

    fn probes(&self) -> Option<ProbeLeases> {
        match self.value(&self.keys.probes)? {
            Value::Text(s) => ProbeLeases::decode(s),
            Value::Int(_) => None,
        }
    }
}

impl Cache for MemoryCache {
    async fn close(&self) -> Result<(), CacheError> {
        let mut state = self.lock();
        state.closed = true;
        state.values.clear();
        state.windows.clear();
        Ok(())
    }
}

impl KeyValue for MemoryCache {
    async fn get(&self, key: &str) -> Result<Option<String>, CacheError> {
        let now = self.shared.clock.now();
        let mut state = self.open(now)?;
        Ok(state.value(key, now).map(|e| match &e.value {
            Value::Text(s) => s.clone(),
            Value::Int(n) => n.to_string(),
        }))
    }

    async fn set(&self, key: &str, value: &str, ttl: Option<Duration>) -> Result<(), CacheError> {
        let now = self.shared.clock.now();
        let mut state = self.open(now)?;
        state.put(key, Value::Text(value.to_owned()), deadline(now, ttl));
        Ok(())
    }

    async fn increment(&self, key: &str, ttl: Option<Duration>) -> Result<i64, CacheError> {
        let now = self.shared.clock.now();
        let mut state = self.open(now)?;
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
        let mut state = self.open(now)?;
        state.values.remove(key);
        state.windows.remove(key);
        Ok(())
    }
}

impl HitWindow for MemoryCache {
    async fn record_hit(&self, key: &str, at: Timestamp, ttl: Duration) -> Result<(), CacheError> {
        let now = self.shared.clock.now();
        let mut state = self.open(now)?;
        state.record(key, at, ttl, now);
        Ok(())
    }

    async fn count_since(&self, key: &str, since: Timestamp) -> Result<u64, CacheError> {
        let now = self.shared.clock.now();
        let mut state = self.open(now)?;
        Ok(state.series(key, now).map_or(0, |s| count_since(s, since)))
    }

    async fn oldest_since(&self, key: &str, since: Timestamp) -> Result<Option<Timestamp>, CacheError> {
        let now = self.shared.clock.now();
        let mut state = self.open(now)?;
        Ok(state.series(key, now).and_then(|s| oldest_since(s, since)))
    }
}

fn count_since(series: &Series, since: Timestamp) -> u64 {
    (series.hits.len() - series.start(since)) as u64
}

fn oldest_since(series: &Series, since: Timestamp) -> Option<Timestamp> {
    series.hits.get(series.start(since)).copied()
}

impl LimiterStore for MemoryCache {
    async fn acquire_slot(&self, key: &str, request: SlotRequest) -> Result<SlotOutcome, CacheError> {
        let clock_now = self.shared.clock.now();
        let (now, clamped) = match self.shared.time_source {
            TimeSource::Store => (clock_now, false),
            TimeSource::Caller => clamp_stamp(request.now, clock_now, request.window, request.max_ahead),
        };
        let mut state = self.open(clock_now)?;
        let since = now.saturating_sub(request.window);
        let outcome = match state.series_mut(key, clock_now) {
            Some(series) => {
                let start = series.start(since);
                let count = (series.hits.len() - start) as u64;
                let outcome = decide(
                    count,
                    series.hits.get(start).copied(),
                    request.limit,
                    now,
                    request.window,
                );
                if let SlotOutcome::Admitted { .. } = outcome {
                    series.push(now, request.ttl, clock_now);
                }
                outcome
            }
            None => {
                let outcome = decide(0, None, request.limit, now, request.window);
                if let SlotOutcome::Admitted { .. } = outcome {
                    state
                        .windows
                        .insert(key.to_owned(), Series::first(now, request.ttl, clock_now));
                }
                outcome
            }
        };
        Ok(outcome.with_clamped(clamped))
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
        let mut state = self.open(clock_now)?;
        let step = machine::step(
            &LiveKeys {
                state: &state,
                keys,
                now: clock_now,
            },
            command,
            &params,
            now,
        );
        let w = &step.writes;
        match w.state {
            Write::Keep => {}
            Write::Set(s) => state.put(&keys.state, Value::Text(s.as_str().to_owned()), None),
            Write::Delete => {
                state.values.remove(&keys.state);
            }
        }
        match w.failures {
            FailuresWrite::Keep => {}
            FailuresWrite::Create => state.put(
                &keys.failures,
                Value::Int(1),
                deadline(clock_now, Some(params.recovery_timeout)),
            ),
            FailuresWrite::Bump(n) => {
                if let Some(entry) = state.values.get_mut(&keys.failures) {
                    entry.value = Value::Int(i64::from(n));
                }
            }
            FailuresWrite::Delete => {
                state.values.remove(&keys.failures);
            }
        }
        match w.opened_at {
            Write::Keep => {}
            Write::Set(t) => state.put(&keys.opened_at, Value::Text(t.to_string()), None),
            Write::Delete => {
                state.values.remove(&keys.opened_at);
            }
        }
        match &w.probes {
            Write::Keep => {}
            Write::Set(leases) => state.put(&keys.probes, Value::Text(leases.encode()), None),
            Write::Delete => {
                state.values.remove(&keys.probes);
            }
        }
        Ok(step)
    }

    async fn breaker_read(
        &self,
        keys: &BreakerKeys,
        now: Timestamp,
    ) -> Result<(BreakerSnapshot, Timestamp), CacheError> {
        let clock_now = self.shared.clock.now();
        let now = self.stamp(now, clock_now);
        let state = self.open(clock_now)?;
        let snapshot = LiveKeys {
            state: &state,
            keys,
            now: clock_now,
        }
        .snapshot();
        Ok((snapshot, now))
    }
}
