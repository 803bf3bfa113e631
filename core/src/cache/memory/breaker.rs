//! The breaker's atomic step over the shards its five keys live on.
//!
//! The keys [`BreakerKeys::new`] builds begin with a hash tag and so share one
//! shard: one lock. Hand-made keys may not; then every shard they touch is
//! locked, in index order (so two steps never wait for each other crosswise),
//! for the whole step.
//!
//! # Nothing stored: no lock
//!
//! A healthy breaker stores nothing — no state key (closed), no failure
//! count, no open timestamp, no leases — and most of its steps (every
//! `Allow`, every success report) then write nothing either. When the tagged
//! shard held no value at all as its lock was last released, [`unlocked_step`]
//! runs the same [`machine::step`] on [`BreakerSnapshot::EMPTY`] without
//! taking the lock, and answers with it if it writes nothing. That is exact:
//! the shard's value count is published before every unlock, so a step that
//! reads zero is ordered before any write that has not yet finished, and a
//! step that would write goes through the lock as always.
//!
//! The same test is the store's
//! [`breaker_quiet`](crate::cache::BreakerStore::breaker_quiet), split in
//! two: whether a breaker's keys all live on the tagged shard
//! ([`all_tagged`], asked once when the breaker is built) and whether that
//! shard is empty and the cache open ([`tagged_shard_empty`], asked on each
//! call). A breaker with no observer listening then answers an admission or
//! a success report from the step it ran once over an empty store, without
//! running it again — and without testing its five keys again, which cost
//! the hot path about 40 instructions a call.

use std::sync::atomic::Ordering;

use super::{Guard, MemoryCache, State, TAGGED, Value, deadline, shard_of};
use crate::decide::breaker::{
    self as machine, BreakerCommand, BreakerKeys, BreakerParams, BreakerSnapshot, BreakerStep, BreakerView,
    CircuitState, FailuresWrite, ProbeLeases, StoredState, Write,
};
use crate::error::CacheError;
use crate::mutants::{self, Mutant};
use crate::time::Timestamp;

/// The breaker's keys, in the order [`Held`] indexes them.
#[derive(Clone, Copy)]
enum Key {
    State,
    Failures,
    OpenedAt,
    Probes,
    CooldownUntil,
}

impl Key {
    fn of(self, keys: &BreakerKeys) -> &str {
        match self {
            Key::State => &keys.state,
            Key::Failures => &keys.failures,
            Key::OpenedAt => &keys.opened_at,
            Key::Probes => &keys.probes,
            Key::CooldownUntil => &keys.cooldown_until,
        }
    }
}

/// The step for `command` without a lock, when the tagged shard holds no
/// value (so `keys` read as [`BreakerSnapshot::EMPTY`]) and the step writes
/// nothing; `None` when the step must take the lock.
#[inline]
pub(super) fn unlocked_step(
    cache: &MemoryCache,
    keys: &BreakerKeys,
    command: BreakerCommand,
    params: &BreakerParams,
    now: Timestamp,
) -> Option<BreakerStep> {
    if !quiet(cache, keys) {
        return None;
    }
    let step = machine::step(&BreakerSnapshot::EMPTY, command, params, now);
    step.writes.is_empty().then_some(step)
}

/// Whether `keys` read as [`BreakerSnapshot::EMPTY`] now, known without the
/// lock: they share the tagged shard, which held no value at all as its
/// lock was last released, and the cache is open.
#[inline]
pub(super) fn quiet(cache: &MemoryCache, keys: &BreakerKeys) -> bool {
    tagged_shard_empty(cache) && all_tagged(keys)
}

/// Whether the tagged shard held no value at all as its lock was last
/// released, and the cache is open: every key set [`all_tagged`] accepts
/// then reads as [`BreakerSnapshot::EMPTY`].
#[inline]
pub(super) fn tagged_shard_empty(cache: &MemoryCache) -> bool {
    cache.shared.shards[TAGGED].values.load(Ordering::Acquire) == 0 && !cache.shared.closed.load(Ordering::Acquire)
}

/// Whether all five of `keys` begin with a hash tag, and so live on the
/// tagged shard (every key set [`BreakerKeys::new`] builds does).
pub(super) fn all_tagged(keys: &BreakerKeys) -> bool {
    keys.all().iter().all(|k| k.starts_with('{'))
}

/// The locked shards of one breaker's keys.
pub(super) enum Held<'a> {
    /// The keys share one shard (every key set [`BreakerKeys::new`] builds).
    One(Guard<'a>),
    /// Hand-made keys over several shards: their guards in lock order, and
    /// which guard each key's shard is (state, failures, opened_at, probes,
    /// cooldown_until).
    Many(Vec<Guard<'a>>, [usize; 5]),
}

impl<'a> Held<'a> {
    /// Locks (and opens) the shards of `keys`.
    #[inline]
    pub(super) fn lock(cache: &'a MemoryCache, keys: &BreakerKeys, now: Timestamp) -> Result<Self, CacheError> {
        // The keys `BreakerKeys::new` builds all begin with a tag: one shard.
        if all_tagged(keys) {
            return Ok(Held::One(cache.open_shard(TAGGED, now)?));
        }
        let shards = keys.all().map(shard_of);
        if shards.iter().all(|s| *s == shards[0]) {
            return Ok(Held::One(cache.open_shard(shards[0], now)?));
        }
        let mut distinct = shards.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let slot = shards.map(|s| distinct.iter().position(|d| *d == s).unwrap_or(0));
        let guards = distinct
            .iter()
            .map(|shard| cache.open_shard(*shard, now))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Held::Many(guards, slot))
    }

    #[inline]
    fn shard(&self, key: Key) -> &State {
        match self {
            Held::One(guard) => guard,
            Held::Many(guards, slot) => &guards[slot[key as usize]],
        }
    }

    #[inline]
    fn shard_mut(&mut self, key: Key) -> &mut State {
        match self {
            Held::One(guard) => guard,
            Held::Many(guards, slot) => &mut guards[slot[key as usize]],
        }
    }

    /// Runs [`machine::step`] over the stored keys and writes what it says.
    #[inline]
    pub(super) fn step(
        &mut self,
        keys: &BreakerKeys,
        command: BreakerCommand,
        params: &BreakerParams,
        now: Timestamp,
        clock_now: Timestamp,
    ) -> BreakerStep {
        let step = machine::step(
            &LiveKeys {
                held: self,
                keys,
                now: clock_now,
            },
            command,
            params,
            now,
        );
        let w = &step.writes;
        match w.state {
            Write::Keep => {}
            Write::Set(s) => self
                .shard_mut(Key::State)
                .put(&keys.state, Value::Text(s.as_str().to_owned()), None),
            Write::Delete => {
                self.shard_mut(Key::State).values.remove(&keys.state);
            }
        }
        match w.failures {
            FailuresWrite::Keep => {}
            FailuresWrite::Create => self.shard_mut(Key::Failures).put(
                &keys.failures,
                Value::Int(1),
                deadline(clock_now, Some(params.recovery_timeout)),
            ),
            FailuresWrite::Bump(n) => {
                let shard = self.shard_mut(Key::Failures);
                if let Some(entry) = shard.values.get_mut(&keys.failures) {
                    entry.value = Value::Int(i64::from(n));
                    if mutants::active(Mutant::FailureTtlRefreshed) {
                        let refreshed = clock_now.saturating_add(params.recovery_timeout);
                        entry.deadline = Some(refreshed);
                        shard.expires(refreshed);
                    }
                }
            }
            // A closed circuit's success asked to clear the count.
            FailuresWrite::Delete
                if step.after == CircuitState::Closed
                    && step.before == CircuitState::Closed
                    && mutants::active(Mutant::SuccessKeepsFailures) => {}
            FailuresWrite::Delete => {
                self.shard_mut(Key::Failures).values.remove(&keys.failures);
            }
        }
        match w.opened_at {
            Write::Keep => {}
            Write::Set(t) => self
                .shard_mut(Key::OpenedAt)
                .put(&keys.opened_at, Value::Text(t.to_string()), None),
            Write::Delete => {
                self.shard_mut(Key::OpenedAt).values.remove(&keys.opened_at);
            }
        }
        match &w.probes {
            Write::Keep => {}
            Write::Set(leases) => self
                .shard_mut(Key::Probes)
                .put(&keys.probes, Value::Text(leases.encode()), None),
            Write::Delete => {
                self.shard_mut(Key::Probes).values.remove(&keys.probes);
            }
        }
        match w.cooldown_until {
            Write::Keep => {}
            // It expires with the cooldown, on the cache's clock.
            Write::Set(until) => self.shard_mut(Key::CooldownUntil).put(
                &keys.cooldown_until,
                Value::Text(until.as_micros().to_string()),
                deadline(clock_now, Some(until.saturating_duration_since(now))),
            ),
            Write::Delete => {
                self.shard_mut(Key::CooldownUntil).values.remove(&keys.cooldown_until);
            }
        }
        step
    }

    /// Everything stored, decoded, as live at `now`.
    pub(super) fn snapshot(&self, keys: &BreakerKeys, now: Timestamp) -> BreakerSnapshot {
        let view = LiveKeys { held: self, keys, now };
        BreakerSnapshot {
            state: view.state(),
            failures: view.failures(),
            opened_at: view.opened_at(),
            probes: view.probes(),
            cooldown_until: view.cooldown_until(),
        }
    }
}

/// The breaker's keys read straight from the maps, only as the state machine
/// asks for them; expired entries read as absent.
struct LiveKeys<'h, 'a> {
    held: &'h Held<'a>,
    keys: &'h BreakerKeys,
    now: Timestamp,
}

impl LiveKeys<'_, '_> {
    fn value(&self, key: Key) -> Option<&Value> {
        self.held
            .shard(key)
            .values
            .get(key.of(self.keys))
            .filter(|e| e.live(self.now))
            .map(|e| &e.value)
    }
}

impl BreakerView for LiveKeys<'_, '_> {
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
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::cache::BreakerStore;
    use crate::clock::{Clock, ManualClock};
    use crate::decide::breaker::Origin;

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

    fn params() -> BreakerParams {
        BreakerParams {
            failure_threshold: 3,
            recovery_timeout: Duration::from_secs(60),
            half_open_max_calls: 1,
            probe_lease: Duration::from_secs(60),
        }
    }

    #[test]
    fn the_unlocked_step_answers_only_while_nothing_is_stored() {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let cache = MemoryCache::new(clock.clone());
        let keys = BreakerKeys::new("kg:circuit");
        let now = clock.now();
        let success = BreakerCommand::RecordSuccess(Origin::Untracked);
        let fail = BreakerCommand::RecordFailure(Origin::Untracked);
        assert!(unlocked_step(&cache, &keys, BreakerCommand::Allow, &params(), now).is_some());
        assert!(unlocked_step(&cache, &keys, success, &params(), now).is_some());
        assert!(
            unlocked_step(&cache, &keys, fail, &params(), now).is_none(),
            "a step that writes locks"
        );
        ready(cache.breaker_step(&keys, fail, params(), now)).unwrap();
        assert!(
            unlocked_step(&cache, &keys, success, &params(), now).is_none(),
            "a stored failure count must be cleared under the lock"
        );
        let cleared = ready(cache.breaker_step(&keys, success, params(), now)).unwrap();
        assert_eq!(cleared.writes.failures, FailuresWrite::Delete);
        let (snapshot, _) = ready(cache.breaker_read(&keys, now)).unwrap();
        assert_eq!(snapshot, BreakerSnapshot::EMPTY);
        assert!(
            unlocked_step(&cache, &keys, success, &params(), now).is_some(),
            "empty again"
        );
        ready(crate::cache::Cache::close(&cache)).unwrap();
        assert!(unlocked_step(&cache, &keys, BreakerCommand::Allow, &params(), now).is_none());
        assert!(matches!(
            ready(cache.breaker_step(&keys, BreakerCommand::Allow, params(), now)),
            Err(CacheError::Closed)
        ));
    }

    #[test]
    fn the_quiet_test_covers_tagged_keys_and_reads_the_tagged_shard() {
        use crate::cache::BreakerStore as _;
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let cache = MemoryCache::new(clock.clone());
        let keys = BreakerKeys::new("kg:circuit");
        let mut untagged = keys.clone();
        untagged.probes = "probes".to_owned();
        assert!(cache.breaker_quiet_covers(&keys));
        assert!(!cache.breaker_quiet_covers(&untagged), "one key off the tagged shard");
        let now = clock.now();
        let fail = BreakerCommand::RecordFailure(Origin::Untracked);
        assert!(cache.breaker_quiet());
        // A failure stored at keys it does not cover is not its business…
        let elsewhere = BreakerKeys {
            state: "s".to_owned(),
            failures: "f".to_owned(),
            opened_at: "o".to_owned(),
            probes: "p".to_owned(),
            cooldown_until: "c".to_owned(),
        };
        ready(cache.breaker_step(&elsewhere, fail, params(), now)).unwrap();
        assert!(cache.breaker_quiet());
        // …one at covered keys is.
        ready(cache.breaker_step(&keys, fail, params(), now)).unwrap();
        assert!(!cache.breaker_quiet());
        ready(cache.breaker_step(&keys, BreakerCommand::RecordSuccess(Origin::Untracked), params(), now)).unwrap();
        assert!(cache.breaker_quiet(), "the failure count cleared");
        ready(crate::cache::Cache::close(&cache)).unwrap();
        assert!(!cache.breaker_quiet(), "a closed cache answers no step");
    }

    #[test]
    fn keys_on_different_shards_still_step_as_one() {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let cache = MemoryCache::new(clock.clone());
        // Untagged keys chosen to land on more than one shard.
        let keys = BreakerKeys {
            state: "s".to_owned(),
            failures: "f".to_owned(),
            opened_at: "o".to_owned(),
            probes: "p".to_owned(),
            cooldown_until: "c".to_owned(),
        };
        let shards = keys.all().map(shard_of);
        assert!(
            shards.iter().any(|s| *s != shards[0]),
            "the keys span shards: {shards:?}"
        );
        let params = BreakerParams {
            failure_threshold: 2,
            recovery_timeout: Duration::from_secs(60),
            half_open_max_calls: 1,
            probe_lease: Duration::from_secs(60),
        };
        let fail = BreakerCommand::RecordFailure(Origin::Untracked);
        let now = clock.now();
        let first = ready(cache.breaker_step(&keys, fail, params, now)).unwrap();
        assert_eq!(first.after, CircuitState::Closed);
        let second = ready(cache.breaker_step(&keys, fail, params, now)).unwrap();
        assert_eq!(second.after, CircuitState::Open);
        let (snapshot, _) = ready(cache.breaker_read(&keys, now)).unwrap();
        assert_eq!(snapshot.state, StoredState::Valid(CircuitState::Open));
        assert_eq!(snapshot.opened_at, Some(now));
        assert_eq!(snapshot.failures, None);
    }
}
