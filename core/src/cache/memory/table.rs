//! One shard's contents: values with TTLs, hit series and token ledgers by
//! key, and the sweep that drops what expired.
//!
//! Every entry carries its deadline on the cache's clock. A read treats an
//! expired entry as absent (and a lookup that may write drops it); the
//! [sweep](Table::sweep) drops the rest in bulk, once the operations since the
//! last sweep exceed [`SWEEP_SLACK`] plus the keys that sweep kept: a walk
//! over every key is paid for by at least as many operations (each adds at
//! most a few keys), and keys added since do not put it off.

use std::collections::HashMap;
use std::time::Duration;

use super::series::{Full, Series};
use crate::decide::tokens::TokenEntry;
use crate::time::Timestamp;

/// Maps keyed by cache key with a fixed-seed hasher: iteration order never
/// depends on a random seed (the simulator's byte-for-byte determinism
/// needs that).
pub(super) type Map<V> = HashMap<String, V, rustc_hash::FxBuildHasher>;

/// Operations a shard takes, beyond the keys its last sweep kept, before it
/// is swept again.
pub(super) const SWEEP_SLACK: usize = 16;

/// A string value, or a counter.
pub(super) enum Value {
    Text(String),
    Int(i64),
}

pub(super) struct ValueEntry {
    pub(super) value: Value,
    /// `None`: it never expires.
    pub(super) deadline: Option<Timestamp>,
}

impl ValueEntry {
    pub(super) fn live(&self, now: Timestamp) -> bool {
        self.deadline.is_none_or(|d| d > now)
    }
}

/// A key's token reservations, in the order they were made, and the
/// ledger's deadline.
pub(super) struct Ledger {
    pub(super) entries: Vec<TokenEntry>,
    pub(super) deadline: Timestamp,
}

/// What one shard's lock guards.
#[derive(Default)]
pub(super) struct Table {
    pub(super) values: Map<ValueEntry>,
    pub(super) series: Map<Series>,
    pub(super) ledgers: Map<Ledger>,
    /// Operations since the last sweep.
    ops: usize,
    /// The keys the last sweep kept.
    kept: usize,
    /// The shard this one's next sweep also sweeps, so that a shard nobody
    /// touches is swept too.
    pub(super) sweeps_next: usize,
}

impl Table {
    /// Counts an operation: whether a sweep is due.
    pub(super) fn tick(&mut self) -> bool {
        self.ops += 1;
        self.ops > SWEEP_SLACK + self.kept
    }

    /// Drops every entry expired at `now`.
    pub(super) fn sweep(&mut self, now: Timestamp) {
        self.values.retain(|_, e| e.live(now));
        self.series.retain(|_, s| !s.expired(now));
        self.ledgers.retain(|_, l| l.deadline > now);
        self.ops = 0;
        self.kept = self.keys();
    }

    /// Every key held, expired ones not yet swept included.
    pub(super) fn keys(&self) -> usize {
        self.values.len() + self.series.len() + self.ledgers.len()
    }

    /// Forgets everything, and frees the maps.
    pub(super) fn clear(&mut self) {
        self.values = Map::default();
        self.series = Map::default();
        self.ledgers = Map::default();
        self.kept = 0;
    }

    /// The live value at `key`, an expired one dropped.
    pub(super) fn value(&mut self, key: &str, now: Timestamp) -> Option<&mut ValueEntry> {
        if self.values.get(key).is_some_and(|e| !e.live(now)) {
            self.values.remove(key);
        }
        self.values.get_mut(key)
    }

    /// The live value at `key`, read without changing anything.
    pub(super) fn live_value(&self, key: &str, now: Timestamp) -> Option<&Value> {
        self.values.get(key).filter(|e| e.live(now)).map(|e| &e.value)
    }

    /// Stores `value` at `key` until `deadline`, replacing any value.
    pub(super) fn put(&mut self, key: &str, value: Value, deadline: Option<Timestamp>) {
        match self.values.get_mut(key) {
            Some(entry) => *entry = ValueEntry { value, deadline },
            None => {
                self.values.insert(key.to_owned(), ValueEntry { value, deadline });
            }
        }
    }

    /// The series at `key`, emptied first if it expired at `now`.
    pub(super) fn series(&mut self, key: &str, now: Timestamp) -> Option<&mut Series> {
        let series = self.series.get_mut(key)?;
        series.expire(now);
        Some(series)
    }

    /// Records a hit at `at` in `key`'s series, living `ttl` from `now`
    /// ([`Series::push`]); a key with no series gets one.
    pub(super) fn record(&mut self, key: &str, at: Timestamp, ttl: Duration, now: Timestamp) -> Result<(), Full> {
        if let Some(series) = self.series(key, now) {
            return series.push(at, ttl, now);
        }
        let mut series = Series::default();
        series.push(at, ttl, now)?;
        self.series.insert(key.to_owned(), series);
        Ok(())
    }

    /// The live token ledger at `key`.
    pub(super) fn ledger(&mut self, key: &str, now: Timestamp) -> Option<&mut Ledger> {
        self.ledgers.get_mut(key).filter(|l| l.deadline > now)
    }

    /// Adds `entry` to `key`'s ledger, which lives until `deadline` at least
    /// (a ledger expired at `now` starts again).
    pub(super) fn reserve(&mut self, key: &str, entry: TokenEntry, deadline: Timestamp, now: Timestamp) {
        match self.ledgers.get_mut(key) {
            Some(ledger) if ledger.deadline > now => {
                ledger.entries.push(entry);
                ledger.deadline = ledger.deadline.max(deadline);
            }
            Some(expired) => {
                expired.entries.clear();
                expired.entries.push(entry);
                expired.deadline = deadline;
            }
            None => {
                self.ledgers.insert(
                    key.to_owned(),
                    Ledger {
                        entries: vec![entry],
                        deadline,
                    },
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u64) -> Timestamp {
        Timestamp::from_secs(n)
    }

    #[test]
    fn a_sweep_comes_due_after_the_slack_plus_what_the_last_one_kept() {
        let mut table = Table::default();
        let due = |table: &mut Table| (0..).take_while(|_| !table.tick()).count();
        // Nothing kept yet: the slack alone.
        assert_eq!(due(&mut table), SWEEP_SLACK);
        table.put("stays", Value::Int(1), None);
        table.put("goes", Value::Int(1), Some(t(5)));
        table.record("hits", t(1), Duration::from_secs(100), t(1)).unwrap();
        table.sweep(t(5));
        assert_eq!(table.keys(), 2, "the expired value dropped");
        assert_eq!(due(&mut table), SWEEP_SLACK + 2);
        table.sweep(t(101));
        assert_eq!(table.keys(), 1);
    }

    #[test]
    fn an_expired_ledger_starts_again_and_a_live_one_lives_on() {
        let mut table = Table::default();
        let entry = |at| TokenEntry {
            id: crate::decide::tokens::ReservationId { at: t(at), seq: 0 },
            tokens: 1,
            lease_end: None,
        };
        table.reserve("k", entry(1), t(10), t(1));
        table.reserve("k", entry(2), t(5), t(2));
        assert_eq!(
            table.ledger("k", t(9)).map(|l| (l.entries.len(), l.deadline)),
            Some((2, t(10)))
        );
        assert!(table.ledger("k", t(10)).is_none());
        table.reserve("k", entry(11), t(20), t(11));
        assert_eq!(
            table.ledger("k", t(11)).map(|l| (l.entries.len(), l.deadline)),
            Some((1, t(20)))
        );
    }
}
