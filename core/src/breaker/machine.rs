//! The circuit breaker's state machine as a pure function.
//!
//! [`step`] takes what is stored (a [`BreakerSnapshot`]), a command, the
//! parameters and `now`, and returns the decision and the [`Writes`] that
//! carry it out. It reads no clock and touches no cache. Every adapter runs it
//! (or, on Redis, a script proven equal to it by the compliance suite) inside
//! one atomic step; the property tests and the simulator's checker reason
//! about the same function.
//!
//! The transitions are the spec's:
//!
//! | state     | `Allow`                                   | `RecordSuccess`      | `RecordFailure`                              |
//! |-----------|-------------------------------------------|----------------------|----------------------------------------------|
//! | closed    | admit                                      | clear failure count  | count it (TTL on creation); open at threshold |
//! | open      | refuse; once due, → half-open and count as a probe | nothing     | nothing                                       |
//! | half-open | admit while probes < `half_open_max_calls` | → closed, clear all | → open with a fresh `opened_at`              |
//!
//! `Reset` clears every key from any state. An unreadable stored state is taken
//! as closed; a missing `opened_at` means recovery is due. Both fail toward
//! calling the model.

use std::time::Duration;

use crate::time::Timestamp;

/// The three states of a circuit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CircuitState {
    /// Normal: calls go through and failures are counted.
    Closed,
    /// Refusing immediately, without calling the model.
    Open,
    /// Letting a limited number of probes through to see whether the model is back.
    HalfOpen,
}

impl CircuitState {
    /// The stored spelling: `closed`, `open`, `half_open`.
    pub const fn as_str(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(stored: &str) -> Option<Self> {
        match stored {
            "closed" => Some(CircuitState::Closed),
            "open" => Some(CircuitState::Open),
            "half_open" => Some(CircuitState::HalfOpen),
            _ => None,
        }
    }
}

/// The validated numbers a breaker runs with (see
/// [`CircuitBreakerBuilder`](crate::breaker::CircuitBreakerBuilder)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerParams {
    /// Failures (within one `recovery_timeout` of the first) that open the circuit.
    pub failure_threshold: u32,
    /// How long the circuit stays open before probing; also the failure count's TTL.
    pub recovery_timeout: Duration,
    /// Probes admitted per half-open episode, the transitioning call included.
    pub half_open_max_calls: u32,
}

/// The four keys one breaker's state lives under.
///
/// The spec's `{key_prefix}:{name}` with the prefix wrapped in braces —
/// `{kg:circuit}:state` — so that on Redis Cluster all four hash to one slot and
/// a transition can be one script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerKeys {
    /// The current [`CircuitState`].
    pub state: String,
    /// The failure counter (expires `recovery_timeout` after the first failure).
    pub failures: String,
    /// When the circuit last opened, as decimal epoch seconds.
    pub opened_at: String,
    /// Probes admitted in the current half-open episode.
    pub half_open_calls: String,
}

impl BreakerKeys {
    /// The keys under `prefix`.
    pub fn new(prefix: &str) -> Self {
        let k = |name: &str| format!("{{{prefix}}}:{name}");
        BreakerKeys {
            state: k("state"),
            failures: k("failures"),
            opened_at: k("opened_at"),
            half_open_calls: k("half_open_calls"),
        }
    }
}

/// What is stored in the state key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoredState {
    /// Nothing: a breaker that never opened, or was reset. Reads as closed.
    Missing,
    /// A valid state.
    Valid(CircuitState),
    /// Something that is not a state; reads as closed, with a warning.
    Unreadable(String),
}

/// Everything a breaker has stored, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerSnapshot {
    /// The state key.
    pub state: StoredState,
    /// The live failure count; `None` when absent, expired or not a number.
    pub failures: Option<u32>,
    /// When the circuit last opened; `None` when absent or unparseable.
    pub opened_at: Option<Timestamp>,
    /// Probes admitted this half-open episode (absent or damaged reads as 0).
    pub half_open_calls: u32,
}

impl BreakerSnapshot {
    /// A breaker with nothing stored.
    pub const EMPTY: BreakerSnapshot = BreakerSnapshot {
        state: StoredState::Missing,
        failures: None,
        opened_at: None,
        half_open_calls: 0,
    };

    /// Decodes the four stored strings, as any adapter reads them.
    pub fn decode(
        state: Option<&str>,
        failures: Option<&str>,
        opened_at: Option<&str>,
        half_open_calls: Option<&str>,
    ) -> Self {
        BreakerSnapshot {
            state: match state {
                None => StoredState::Missing,
                Some(s) => match CircuitState::parse(s) {
                    Some(state) => StoredState::Valid(state),
                    None => StoredState::Unreadable(s.to_owned()),
                },
            },
            failures: failures.and_then(|s| s.parse().ok()),
            opened_at: opened_at.and_then(Timestamp::parse_secs),
            half_open_calls: half_open_calls.and_then(|s| s.parse().ok()).unwrap_or(0),
        }
    }

    /// The state this snapshot behaves as: unreadable and missing are closed.
    pub fn effective_state(&self) -> CircuitState {
        match self.state {
            StoredState::Valid(state) => state,
            StoredState::Missing | StoredState::Unreadable(_) => CircuitState::Closed,
        }
    }
}

/// Read access to a breaker's stored keys, decoded.
///
/// [`step`] asks only for what the transition in hand needs — a closed
/// circuit's `Allow` reads the state and nothing else — so an in-process store
/// can answer from its maps without reading all four keys. A
/// [`BreakerSnapshot`] is the eager implementation every other store uses.
pub trait BreakerView {
    /// The state key.
    fn state(&self) -> StoredState;
    /// The live failure count; `None` when absent, expired or not a number.
    fn failures(&self) -> Option<u32>;
    /// When the circuit last opened; `None` when absent or unparseable.
    fn opened_at(&self) -> Option<Timestamp>;
    /// Probes admitted this half-open episode (absent or damaged reads as 0).
    fn half_open_calls(&self) -> u32;
}

impl BreakerView for BreakerSnapshot {
    fn state(&self) -> StoredState {
        self.state.clone()
    }
    fn failures(&self) -> Option<u32> {
        self.failures
    }
    fn opened_at(&self) -> Option<Timestamp> {
        self.opened_at
    }
    fn half_open_calls(&self) -> u32 {
        self.half_open_calls
    }
}

/// A command to the state machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakerCommand {
    /// `allow_request`: may a call go through? Drives open → half-open.
    Allow,
    /// The call succeeded.
    RecordSuccess,
    /// The call failed.
    RecordFailure,
    /// Force closed and clear everything.
    Reset,
}

/// A change to one stored key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write<T> {
    /// Leave it as it is.
    Keep,
    /// Store this value (no TTL).
    Set(T),
    /// Remove the key.
    Delete,
}

/// A change to the failure counter, whose TTL is applied on creation only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailuresWrite {
    /// Leave it as it is.
    Keep,
    /// Create it at 1 with a TTL of `recovery_timeout` (it was absent, expired or damaged).
    Create,
    /// Store this count, keeping the live key's deadline.
    Bump(u32),
    /// Remove the key.
    Delete,
}

/// The writes that carry out a step, one per key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Writes {
    /// The state key.
    pub state: Write<CircuitState>,
    /// The failure counter.
    pub failures: FailuresWrite,
    /// The open timestamp.
    pub opened_at: Write<Timestamp>,
    /// The probe count.
    pub half_open_calls: Write<u32>,
}

impl Writes {
    /// No change at all.
    pub const NONE: Writes = Writes {
        state: Write::Keep,
        failures: FailuresWrite::Keep,
        opened_at: Write::Keep,
        half_open_calls: Write::Keep,
    };

    /// Whether any key changes.
    pub fn is_empty(&self) -> bool {
        *self == Writes::NONE
    }
}

/// The result of one step: the decision and what to store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerStep {
    /// The effective state before the step.
    pub before: CircuitState,
    /// The state after the step.
    pub after: CircuitState,
    /// The instant the step was judged at (the caller's `now`, or the store's).
    pub at: Timestamp,
    /// For [`BreakerCommand::Allow`], whether the call may go through; for the
    /// other commands, always `true`.
    pub allowed: bool,
    /// The stored state was damaged and read as closed: what was there.
    pub unreadable: Option<String>,
    /// What to store.
    pub writes: Writes,
}

/// Whether an open circuit opened at `opened_at` may probe at `now`. A
/// missing timestamp means recovery is due.
pub fn recovery_due(opened_at: Option<Timestamp>, params: &BreakerParams, now: Timestamp) -> bool {
    match opened_at {
        None => true,
        Some(t) => now.saturating_duration_since(t) >= params.recovery_timeout,
    }
}

/// Seconds until an open circuit will admit a probe:
/// `max(0, recovery_timeout − (now − opened_at))`; zero with no `opened_at`.
pub fn retry_after(snapshot: &BreakerSnapshot, params: &BreakerParams, now: Timestamp) -> Duration {
    match snapshot.opened_at {
        None => Duration::ZERO,
        Some(t) => params.recovery_timeout.saturating_sub(now.saturating_duration_since(t)),
    }
}

/// One transition of the breaker. Pure: the same inputs give the same step.
pub fn step(stored: &impl BreakerView, command: BreakerCommand, params: &BreakerParams, now: Timestamp) -> BreakerStep {
    use CircuitState::*;
    let (before, unreadable) = match stored.state() {
        StoredState::Valid(state) => (state, None),
        StoredState::Missing => (Closed, None),
        StoredState::Unreadable(s) => (Closed, Some(s)),
    };
    let mut writes = Writes::NONE;
    let (after, allowed) = match (command, before) {
        (BreakerCommand::Reset, _) => {
            writes = clear_all();
            (Closed, true)
        }
        (BreakerCommand::Allow, Closed) => (Closed, true),
        (BreakerCommand::Allow, Open) => {
            if recovery_due(stored.opened_at(), params, now) {
                // The transitioning call is itself the first probe.
                writes.state = Write::Set(HalfOpen);
                writes.half_open_calls = Write::Set(1);
                (HalfOpen, true)
            } else {
                (Open, false)
            }
        }
        (BreakerCommand::Allow, HalfOpen) => {
            let calls = stored.half_open_calls();
            if calls < params.half_open_max_calls {
                writes.half_open_calls = Write::Set(calls + 1);
                (HalfOpen, true)
            } else {
                (HalfOpen, false)
            }
        }
        (BreakerCommand::RecordSuccess, Closed) => {
            if stored.failures().is_some() {
                writes.failures = FailuresWrite::Delete;
            }
            (Closed, true)
        }
        (BreakerCommand::RecordSuccess, HalfOpen) => {
            writes = clear_all();
            (Closed, true)
        }
        (BreakerCommand::RecordSuccess, Open) | (BreakerCommand::RecordFailure, Open) => {
            // Late reports about calls admitted before the circuit opened change
            // nothing: in particular they never push the recovery out.
            (Open, true)
        }
        (BreakerCommand::RecordFailure, Closed) => {
            let failures = stored.failures();
            let count = failures.map_or(1, |n| n.saturating_add(1));
            if count >= params.failure_threshold {
                writes.state = Write::Set(Open);
                writes.opened_at = Write::Set(now);
                writes.failures = FailuresWrite::Delete;
                writes.half_open_calls = Write::Delete;
                (Open, true)
            } else {
                writes.failures = match failures {
                    None => FailuresWrite::Create,
                    Some(_) => FailuresWrite::Bump(count),
                };
                (Closed, true)
            }
        }
        (BreakerCommand::RecordFailure, HalfOpen) => {
            writes.state = Write::Set(Open);
            writes.opened_at = Write::Set(now);
            writes.half_open_calls = Write::Delete;
            (Open, true)
        }
    };
    BreakerStep {
        before,
        after,
        at: now,
        allowed,
        unreadable,
        writes,
    }
}

fn clear_all() -> Writes {
    Writes {
        state: Write::Delete,
        failures: FailuresWrite::Delete,
        opened_at: Write::Delete,
        half_open_calls: Write::Delete,
    }
}

/// Applies `writes` to a snapshot the way a store applies them to its keys —
/// the reference every adapter is checked against, and what the property tests
/// use to run the machine without a cache. TTLs are the store's business and
/// are not modelled here.
pub fn apply(snapshot: &BreakerSnapshot, writes: &Writes) -> BreakerSnapshot {
    let mut next = snapshot.clone();
    match writes.state {
        Write::Keep => {}
        Write::Set(s) => next.state = StoredState::Valid(s),
        Write::Delete => next.state = StoredState::Missing,
    }
    match writes.failures {
        FailuresWrite::Keep => {}
        FailuresWrite::Create => next.failures = Some(1),
        FailuresWrite::Bump(n) => next.failures = Some(n),
        FailuresWrite::Delete => next.failures = None,
    }
    match writes.opened_at {
        Write::Keep => {}
        Write::Set(t) => next.opened_at = Some(t),
        Write::Delete => next.opened_at = None,
    }
    match writes.half_open_calls {
        Write::Keep => {}
        Write::Set(n) => next.half_open_calls = n,
        Write::Delete => next.half_open_calls = 0,
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(threshold: u32, timeout_s: u64, probes: u32) -> BreakerParams {
        BreakerParams {
            failure_threshold: threshold,
            recovery_timeout: Duration::from_secs(timeout_s),
            half_open_max_calls: probes,
        }
    }

    const T0: Timestamp = Timestamp::from_secs(1_000);

    fn open_at(t: Timestamp) -> BreakerSnapshot {
        BreakerSnapshot {
            state: StoredState::Valid(CircuitState::Open),
            failures: None,
            opened_at: Some(t),
            half_open_calls: 0,
        }
    }

    #[test]
    fn failures_below_threshold_count_then_open() {
        let p = params(2, 60, 1);
        let s1 = step(&BreakerSnapshot::EMPTY, BreakerCommand::RecordFailure, &p, T0);
        assert_eq!(s1.writes.failures, FailuresWrite::Create);
        assert_eq!(s1.after, CircuitState::Closed);
        let snap = apply(&BreakerSnapshot::EMPTY, &s1.writes);
        let s2 = step(&snap, BreakerCommand::RecordFailure, &p, T0);
        assert_eq!(s2.after, CircuitState::Open);
        assert_eq!(s2.writes.opened_at, Write::Set(T0));
    }

    #[test]
    fn open_refuses_until_due_then_the_transitioning_call_is_a_probe() {
        let p = params(1, 60, 2);
        let early = step(
            &open_at(T0),
            BreakerCommand::Allow,
            &p,
            T0.saturating_add(Duration::from_secs(59)),
        );
        assert!(!early.allowed);
        assert!(early.writes.is_empty());
        let due = step(
            &open_at(T0),
            BreakerCommand::Allow,
            &p,
            T0.saturating_add(Duration::from_secs(60)),
        );
        assert!(due.allowed);
        assert_eq!(due.after, CircuitState::HalfOpen);
        assert_eq!(due.writes.half_open_calls, Write::Set(1));
    }

    #[test]
    fn missing_opened_at_is_recovery_due() {
        let mut snap = open_at(T0);
        snap.opened_at = None;
        assert!(step(&snap, BreakerCommand::Allow, &params(1, 60, 1), T0).allowed);
        assert_eq!(retry_after(&snap, &params(1, 60, 1), T0), Duration::ZERO);
    }

    #[test]
    fn unreadable_state_is_closed_and_reported() {
        let snap = BreakerSnapshot::decode(Some("bogus"), None, None, None);
        let s = step(&snap, BreakerCommand::Allow, &params(1, 60, 1), T0);
        assert!(s.allowed);
        assert_eq!(s.before, CircuitState::Closed);
        assert_eq!(s.unreadable.as_deref(), Some("bogus"));
    }

    #[test]
    fn failures_while_open_change_nothing() {
        let s = step(
            &open_at(T0),
            BreakerCommand::RecordFailure,
            &params(1, 60, 1),
            T0.saturating_add(Duration::from_secs(30)),
        );
        assert!(s.writes.is_empty());
        assert_eq!(s.after, CircuitState::Open);
    }

    #[test]
    fn retry_after_counts_down_and_clamps() {
        let p = params(1, 60, 1);
        assert_eq!(
            retry_after(&open_at(T0), &p, T0.saturating_add(Duration::from_secs(20))),
            Duration::from_secs(40)
        );
        assert_eq!(
            retry_after(&open_at(T0), &p, T0.saturating_add(Duration::from_secs(90))),
            Duration::ZERO
        );
    }

    #[test]
    fn keys_share_a_hash_tag() {
        let k = BreakerKeys::new("kg:circuit");
        assert_eq!(k.state, "{kg:circuit}:state");
        assert_eq!(k.half_open_calls, "{kg:circuit}:half_open_calls");
    }
}
