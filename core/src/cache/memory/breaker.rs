//! The breaker's atomic step over its seven keys.
//!
//! The keys [`BreakerKeys::new`] builds begin with a hash tag and so share
//! one shard: one lock. Hand-made keys may not; then every shard they touch
//! is locked, in index order (so two steps never wait for each other
//! crosswise), for the whole step. Under the locks the stored keys are read
//! as [`machine::step`] asks for them, and what it says is written.

use parking_lot::MutexGuard;

use super::table::{Table, Value};
use super::{MemoryCache, SHARDS, shard_of};
use crate::decide::breaker::{
    self as machine, BreakerCommand, BreakerKeys, BreakerParams, BreakerSnapshot, BreakerStep, BreakerView,
    CircuitState, FailuresWrite, ProbeLeases, StoredState, Write,
};
use crate::error::CacheError;
use crate::mutants::{self, Mutant};
use crate::time::Timestamp;

/// The breaker's keys, in the order [`BreakerKeys::all`] gives them.
#[derive(Clone, Copy)]
enum Key {
    State,
    Failures,
    OpenedAt,
    Probes,
    CooldownUntil,
    Openings,
    ClosedAt,
}

/// The locked shards of one breaker's keys.
pub(super) struct Held<'a> {
    keys: &'a BreakerKeys,
    /// Each key's shard, in [`Key`] order.
    shards: [usize; 7],
    /// The locks, by shard: those of `shards`, and no other.
    locks: [Option<MutexGuard<'a, Table>>; SHARDS],
}

impl<'a> Held<'a> {
    /// Locks (and opens) the shards of `keys`, in index order.
    pub(super) fn lock(cache: &'a MemoryCache, keys: &'a BreakerKeys, now: Timestamp) -> Result<Self, CacheError> {
        let shards = keys.all().map(shard_of);
        let mut locks = std::array::from_fn(|_| None);
        for (shard, lock) in locks.iter_mut().enumerate() {
            if shards.contains(&shard) {
                *lock = Some(cache.lock_shard(shard, now)?);
            }
        }
        Ok(Held { keys, shards, locks })
    }

    fn key(&self, key: Key) -> &'a str {
        self.keys.all()[key as usize]
    }

    fn table(&mut self, key: Key) -> &mut Table {
        self.locks[self.shards[key as usize]]
            .as_deref_mut()
            .unwrap_or_else(|| unreachable!("every key's shard is locked"))
    }

    fn value(&self, key: Key, now: Timestamp) -> Option<&Value> {
        let table = self.locks[self.shards[key as usize]].as_deref()?;
        table.live_value(self.key(key), now)
    }

    fn put(&mut self, key: Key, value: Value, deadline: Option<Timestamp>) {
        let name = self.key(key);
        self.table(key).put(name, value, deadline);
    }

    fn delete(&mut self, key: Key) {
        let name = self.key(key);
        self.table(key).values.remove(name);
    }

    /// Runs [`machine::step`] over the stored keys (live at `clock_now`, the
    /// cache's clock) for `command` at `now`, and writes what it says.
    pub(super) fn step(
        &mut self,
        command: BreakerCommand,
        params: &BreakerParams,
        now: Timestamp,
        clock_now: Timestamp,
    ) -> BreakerStep {
        let step = machine::step(
            &Live {
                held: self,
                now: clock_now,
            },
            command,
            params,
            now,
        );
        let w = &step.writes;
        match w.state {
            Write::Keep => {}
            Write::Set(s) => self.put(Key::State, Value::Text(s.as_str().to_owned()), None),
            Write::Delete => self.delete(Key::State),
        }
        match w.failures {
            FailuresWrite::Keep => {}
            FailuresWrite::Create => self.put(
                Key::Failures,
                Value::Int(1),
                Some(clock_now.saturating_add(params.recovery_timeout)),
            ),
            FailuresWrite::Bump(n) => {
                let name = self.key(Key::Failures);
                if let Some(entry) = self.table(Key::Failures).values.get_mut(name) {
                    entry.value = Value::Int(i64::from(n));
                    if mutants::active(Mutant::FailureTtlRefreshed) {
                        entry.deadline = Some(clock_now.saturating_add(params.recovery_timeout));
                    }
                }
            }
            // A closed circuit's success asked to clear the count.
            FailuresWrite::Delete
                if step.after == CircuitState::Closed
                    && step.before == CircuitState::Closed
                    && mutants::active(Mutant::SuccessKeepsFailures) => {}
            FailuresWrite::Delete => self.delete(Key::Failures),
        }
        match w.opened_at {
            Write::Keep => {}
            Write::Set(t) => self.put(Key::OpenedAt, Value::Text(t.to_string()), None),
            Write::Delete => self.delete(Key::OpenedAt),
        }
        match &w.probes {
            Write::Keep => {}
            Write::Set(leases) => self.put(Key::Probes, Value::Text(leases.encode()), None),
            Write::Delete => self.delete(Key::Probes),
        }
        match w.cooldown_until {
            Write::Keep => {}
            // It expires with the cooldown, on the cache's clock.
            Write::Set(until) => self.put(
                Key::CooldownUntil,
                Value::Text(until.as_micros().to_string()),
                Some(clock_now.saturating_add(until.saturating_duration_since(now))),
            ),
            Write::Delete => self.delete(Key::CooldownUntil),
        }
        match w.openings {
            Write::Keep => {}
            Write::Set(n) => self.put(Key::Openings, Value::Int(i64::from(n)), None),
            Write::Delete => self.delete(Key::Openings),
        }
        match w.closed_at {
            Write::Keep => {}
            Write::Set(t) => self.put(Key::ClosedAt, Value::Text(t.as_micros().to_string()), None),
            Write::Delete => self.delete(Key::ClosedAt),
        }
        step
    }

    /// Everything stored, decoded, as live at `now`.
    pub(super) fn snapshot(&self, now: Timestamp) -> BreakerSnapshot {
        let view = Live { held: self, now };
        BreakerSnapshot {
            state: view.state(),
            failures: view.failures(),
            opened_at: view.opened_at(),
            probes: view.probes(),
            cooldown_until: view.cooldown_until(),
            openings: view.openings(),
            closed_at: view.closed_at(),
        }
    }
}

/// The breaker's keys read straight from the tables, only as the state
/// machine asks for them; expired entries read as absent.
struct Live<'h, 'a> {
    held: &'h Held<'a>,
    now: Timestamp,
}

impl Live<'_, '_> {
    fn value(&self, key: Key) -> Option<&Value> {
        self.held.value(key, self.now)
    }
}

impl BreakerView for Live<'_, '_> {
    fn state(&self) -> StoredState {
        match self.value(Key::State) {
            None => StoredState::Missing,
            Some(Value::Text(s)) => StoredState::read(Some(s)),
            Some(Value::Int(n)) => StoredState::Unreadable(n.to_string()),
        }
    }

    fn failures(&self) -> Option<u32> {
        match self.value(Key::Failures)? {
            Value::Int(n) => u32::try_from(*n).ok(),
            Value::Text(s) => s.parse().ok(),
        }
    }

    fn opened_at(&self) -> Option<Timestamp> {
        match self.value(Key::OpenedAt)? {
            Value::Text(s) => Timestamp::parse_secs(s),
            Value::Int(_) => None,
        }
    }

    fn probes(&self) -> Option<ProbeLeases> {
        match self.value(Key::Probes)? {
            Value::Text(s) => ProbeLeases::decode(s),
            Value::Int(_) => None,
        }
    }

    fn cooldown_until(&self) -> Option<Timestamp> {
        match self.value(Key::CooldownUntil)? {
            Value::Text(s) => machine::decode_cooldown(s),
            Value::Int(n) => u64::try_from(*n)
                .ok()
                .and_then(|n| machine::decode_cooldown(&n.to_string())),
        }
    }

    fn openings(&self) -> Option<u32> {
        match self.value(Key::Openings)? {
            Value::Int(n) => u32::try_from(*n).ok(),
            Value::Text(s) => machine::decode_openings(s),
        }
    }

    fn closed_at(&self) -> Option<Timestamp> {
        match self.value(Key::ClosedAt)? {
            Value::Text(s) => machine::decode_closed_at(s),
            Value::Int(n) => u64::try_from(*n).ok().map(Timestamp::from_micros),
        }
    }
}
