//! The circuit breaker's state machine as a pure function.
//!
//! [`step`] takes what is stored (a [`BreakerView`]), a command, the
//! parameters and `now`, and returns the decision and the [`Writes`] that
//! carry it out. It reads no clock and touches no cache. Every adapter runs it
//! (or, on Redis, a script proven equal to it by the compliance suite) inside
//! one atomic step; the property tests and the simulator's checker reason
//! about the same function.
//!
//! The transitions are the spec's, with two additions: **admission is data**
//! (an `Allow` answers with a [`Permit`]: a normal call, an identified probe,
//! or a refusal carrying its `retry_after`), and **probes are leases** (a probe
//! that neither reports nor is released within `probe_lease` stops counting,
//! so no vanished caller can wedge a half-open circuit).
//!
//! | state     | `Allow`                                   | success report | failure report | `Release(probe)` |
//! |-----------|-------------------------------------------|----------------|----------------|------------------|
//! | closed    | [`Permit::Call`]                          | clear failure count | count it (TTL on creation); open at threshold | nothing |
//! | open      | refuse until due; then → half-open, and the transitioning call is the first probe | nothing | nothing | nothing |
//! | half-open | a probe while fewer than `half_open_max_calls` leases are live, else refuse until the earliest lease ends | → closed, clear all | → open with a fresh `opened_at` | the lease ends |
//!
//! Who reports matters ([`Origin`]). A probe's report decides the half-open
//! episode only while its lease is live; a late one (its lease expired, or its
//! episode is over) changes nothing. A call admitted while closed is counted
//! while the circuit is closed and ignored otherwise — it says nothing about
//! the episode in hand. An untracked report (the spec's bare
//! `record_success()` / `record_failure()`) acts on whatever state is stored,
//! as the spec's breaker did.
//!
//! **Escalation** (optional): a probe that fails re-opens the circuit for
//! longer. The openings since the circuit last closed are counted
//! ([`BreakerKeys::openings`]), and the `n`-th stays open
//! `min(recovery_timeout × 2^(n−1), max_recovery_timeout)` ([`open_period`]),
//! as Envoy's outlier detection multiplies its ejection time by the number
//! of ejections in a row: a server that stays down is probed less and less
//! often, and one that recovers is back at the base period once a probe
//! succeeds. The count is written in the same step as the opening, so a
//! fleet agrees on it. `max_recovery_timeout = recovery_timeout` (the
//! default) is the spec's fixed period.
//!
//! **The last close** ([`BreakerKeys::closed_at`]): the step that closes a
//! half-open circuit stores its instant, and a closed circuit's `Allow`
//! hands it back ([`BreakerStep::closed_at`]), so every caller sharing the
//! store ramps a recovered server up from the same instant (a slow start,
//! [`crate::decide::ramp`]). Only `Reset` clears it.
//!
//! **Cooldowns** sit beside the circuit: a server's quota signal (a 429 or
//! 503 with `Retry-After`, `x-ratelimit-remaining-*: 0` with its reset)
//! becomes [`BreakerCommand::CoolDown`], which stores `cooldown_until`, a
//! store-clock instant, as `max(stored, now + duration)` — a cooldown is never
//! shortened — and touches nothing else. While `now < cooldown_until` every
//! `Allow` is refused with [`Refusal::Cooldown`] and `retry_after =
//! cooldown_until − now`, whatever the circuit's state: a closed circuit
//! admits no call, an open one due for recovery stays open, a half-open one
//! issues no probe. A cooldown is not a failure of the server: it opens
//! nothing and counts toward no threshold.
//!
//! `Reset` clears every key (the cooldown included) from any state. An unreadable stored state is taken
//! as closed; a missing `opened_at` means recovery is due; a half-open circuit
//! with a damaged or missing lease record starts a fresh episode. All of these
//! fail toward calling the model.

use std::fmt;
use std::time::Duration;

use crate::mutants::{self, Mutant};
use crate::time::{Timestamp, stored_number};

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

/// The most probes a half-open episode may hold at once: what
/// `half_open_max_calls` accepts, and what a stored lease record may list.
pub const MAX_HALF_OPEN_CALLS: u32 = 1000;

/// The validated numbers a breaker runs with (see
/// [`CircuitBreakerBuilder`](crate::breaker::CircuitBreakerBuilder)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BreakerParams {
    /// Failures (within one `recovery_timeout` of the first) that open the circuit.
    pub failure_threshold: u32,
    /// How long the circuit stays open before probing after its first
    /// opening; also the failure count's TTL.
    pub recovery_timeout: Duration,
    /// The longest an escalated opening lasts: each consecutive opening
    /// (a failed probe re-opening the circuit) doubles the open period, up
    /// to this (see [`open_period`]). Equal to `recovery_timeout`: no
    /// escalation, the spec's behaviour.
    pub max_recovery_timeout: Duration,
    /// Probes live at once in a half-open episode, the transitioning call included.
    pub half_open_max_calls: u32,
    /// How long a probe counts without reporting or being released.
    pub probe_lease: Duration,
}

/// The keys one breaker's state lives under.
///
/// The spec's `{key_prefix}:{name}` with the prefix wrapped in braces —
/// `{kg:circuit}:state` — so that on Redis Cluster all seven hash to one slot and
/// a transition can be one script.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BreakerKeys {
    /// The current [`CircuitState`].
    pub state: String,
    /// The failure counter (expires `recovery_timeout` after the first failure).
    pub failures: String,
    /// When the circuit last opened, as decimal epoch seconds.
    pub opened_at: String,
    /// The half-open episode's probe leases ([`ProbeLeases`], encoded).
    pub probes: String,
    /// The end of a shared cooldown, as decimal epoch microseconds on the
    /// stamping clock; it expires with the cooldown.
    pub cooldown_until: String,
    /// Consecutive openings since the circuit last closed, as a decimal
    /// count: what escalates the open period.
    pub openings: String,
    /// When a half-open circuit last closed, as decimal epoch microseconds
    /// on the stamping clock: where a slow start's ramp begins.
    pub closed_at: String,
}

impl BreakerKeys {
    /// The keys under `prefix`.
    pub fn new(prefix: &str) -> Self {
        let k = |name: &str| format!("{{{prefix}}}:{name}");
        BreakerKeys {
            state: k("state"),
            failures: k("failures"),
            opened_at: k("opened_at"),
            probes: k("probes"),
            cooldown_until: k("cooldown_until"),
            openings: k("openings"),
            closed_at: k("closed_at"),
        }
    }

    /// All seven keys, in the order the stores read them: state, failures,
    /// opened_at, probes, cooldown_until, openings, closed_at.
    pub fn all(&self) -> [&str; 7] {
        [
            &self.state,
            &self.failures,
            &self.opened_at,
            &self.probes,
            &self.cooldown_until,
            &self.openings,
            &self.closed_at,
        ]
    }
}

/// One half-open probe: the episode it belongs to (the instant the circuit
/// went half-open) and its number within the episode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ProbeId {
    /// When the episode began.
    pub episode: Timestamp,
    /// 1 for the transitioning call, then 2, 3, …
    pub seq: u32,
}

impl fmt::Display for ProbeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "probe {} of the episode begun at {}", self.seq, self.episode)
    }
}

/// A live probe's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Lease {
    /// The probe's number in its episode.
    pub seq: u32,
    /// When it stops counting if it has not reported.
    pub expires: Timestamp,
}

/// The leases of a half-open episode, as stored at [`BreakerKeys::probes`].
///
/// Encoded as `"<episode µs> <issued> <seq>:<expires µs> …"`: single spaces,
/// decimal digits only, instants at most 2^53 µs (what a Redis script holds
/// exactly), at most [`MAX_HALF_OPEN_CALLS`] leases. Anything else is damage
/// and reads as no record.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ProbeLeases {
    /// When the episode began.
    pub episode: Timestamp,
    /// Probes issued in the episode so far (the next one is `issued + 1`).
    pub issued: u32,
    /// The leases not yet ended, in issue order (some may have expired since).
    pub live: Vec<Lease>,
}

/// The largest instant a stored record may hold: 2^53 µs.
const MAX_STORED_MICROS: u64 = crate::time::MAX_STORED;

/// Parses a stored `cooldown_until`: 1 to 16 decimal digits, at most 2^53 µs.
/// Anything else is damage and reads as no cooldown.
pub fn decode_cooldown(stored: &str) -> Option<Timestamp> {
    stored_number(stored).map(Timestamp::from_micros)
}

/// Parses a stored count of openings: a stored number (1 to 16 decimal
/// digits) that fits a `u32`. Anything else is damage and reads as no count
/// (the first opening).
pub fn decode_openings(stored: &str) -> Option<u32> {
    stored_u32(stored)
}

/// Parses a stored `closed_at`: 1 to 16 decimal digits, at most 2^53 µs.
/// Anything else is damage and reads as no close (no ramp).
pub fn decode_closed_at(stored: &str) -> Option<Timestamp> {
    stored_number(stored).map(Timestamp::from_micros)
}

fn stored_u32(token: &str) -> Option<u32> {
    stored_number(token).and_then(|n| u32::try_from(n).ok())
}

impl ProbeLeases {
    /// Parses the stored form; `None` for anything damaged.
    pub fn decode(stored: &str) -> Option<Self> {
        let mut tokens = stored.split(' ');
        let episode = Timestamp::from_micros(stored_number(tokens.next()?)?);
        let issued = stored_u32(tokens.next()?)?;
        let mut live = Vec::new();
        for token in tokens {
            if live.len() >= MAX_HALF_OPEN_CALLS as usize {
                return None;
            }
            let (seq, expires) = token.split_once(':')?;
            live.push(Lease {
                seq: stored_u32(seq)?,
                expires: Timestamp::from_micros(stored_number(expires)?),
            });
        }
        Some(ProbeLeases { episode, issued, live })
    }

    /// The stored form.
    pub fn encode(&self) -> String {
        use fmt::Write as _;
        let mut out = format!("{} {}", self.episode.as_micros(), self.issued);
        for lease in &self.live {
            let _ = write!(out, " {}:{}", lease.seq, lease.expires.as_micros());
        }
        out
    }

    /// Whether `probe` holds a lease that is live at `now`.
    pub fn holds(&self, probe: ProbeId, now: Timestamp) -> bool {
        probe.episode == self.episode && self.live.iter().any(|l| l.seq == probe.seq && l.expires > now)
    }
}

/// What is stored in the state key.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum StoredState {
    /// Nothing: a breaker that never opened, or was reset. Reads as closed.
    Missing,
    /// A valid state.
    Valid(CircuitState),
    /// Something that is not a state; reads as closed, with a warning. Holds
    /// an [`excerpt`] of what was stored, never the whole of a large value.
    Unreadable(String),
}

impl StoredState {
    /// Decodes the state key's stored text, as every adapter reads it: a
    /// damaged value keeps only its [`excerpt`], so a foreign writer's
    /// megabyte is never copied past this point.
    pub fn read(stored: Option<&str>) -> Self {
        match stored {
            None => StoredState::Missing,
            Some(s) => match CircuitState::parse(s) {
                Some(state) => StoredState::Valid(state),
                None => StoredState::Unreadable(excerpt(s)),
            },
        }
    }
}

/// Everything a breaker has stored, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BreakerSnapshot {
    /// The state key.
    pub state: StoredState,
    /// The live failure count; `None` when absent, expired or not a number.
    pub failures: Option<u32>,
    /// When the circuit last opened; `None` when absent or unparseable.
    pub opened_at: Option<Timestamp>,
    /// The half-open episode's leases; `None` when absent or damaged.
    pub probes: Option<ProbeLeases>,
    /// When the shared cooldown ends; `None` when absent or damaged.
    pub cooldown_until: Option<Timestamp>,
    /// Consecutive openings since the circuit last closed; `None` when
    /// absent or not a number.
    pub openings: Option<u32>,
    /// When a half-open circuit last closed; `None` when absent or damaged.
    pub closed_at: Option<Timestamp>,
}

impl BreakerSnapshot {
    /// A breaker with nothing stored.
    pub const EMPTY: BreakerSnapshot = BreakerSnapshot {
        state: StoredState::Missing,
        failures: None,
        opened_at: None,
        probes: None,
        cooldown_until: None,
        openings: None,
        closed_at: None,
    };

    /// Decodes the seven stored strings (in [`BreakerKeys::all`]'s order), as
    /// any adapter reads them.
    pub fn decode(stored: [Option<&str>; 7]) -> Self {
        let [state, failures, opened_at, probes, cooldown_until, openings, closed_at] = stored;
        BreakerSnapshot {
            state: StoredState::read(state),
            failures: failures.and_then(|s| s.parse().ok()),
            opened_at: opened_at.and_then(Timestamp::parse_secs),
            probes: probes.and_then(ProbeLeases::decode),
            cooldown_until: cooldown_until.and_then(decode_cooldown),
            openings: openings.and_then(decode_openings),
            closed_at: closed_at.and_then(decode_closed_at),
        }
    }

    /// The state this snapshot behaves as: unreadable and missing are closed.
    pub fn effective_state(&self) -> CircuitState {
        match self.state {
            StoredState::Valid(state) => state,
            StoredState::Missing | StoredState::Unreadable(_) => CircuitState::Closed,
        }
    }

    /// Probes whose leases are live at `now` (0 unless half-open).
    pub fn live_probes(&self, now: Timestamp) -> usize {
        match (&self.probes, self.effective_state()) {
            (Some(p), CircuitState::HalfOpen) => p.live.iter().filter(|l| l.expires > now).count(),
            _ => 0,
        }
    }
}

/// Read access to a breaker's stored keys, decoded.
///
/// [`step`] asks only for what the transition in hand needs — a closed
/// circuit's `Allow` reads the state and nothing else — so an in-process store
/// can answer from its maps without reading all seven keys. A
/// [`BreakerSnapshot`] is the eager implementation every other store uses.
pub trait BreakerView {
    /// The state key.
    fn state(&self) -> StoredState;
    /// The live failure count; `None` when absent, expired or not a number.
    fn failures(&self) -> Option<u32>;
    /// When the circuit last opened; `None` when absent or unparseable.
    fn opened_at(&self) -> Option<Timestamp>;
    /// The half-open episode's leases; `None` when absent or damaged.
    fn probes(&self) -> Option<ProbeLeases>;
    /// When the shared cooldown ends; `None` when absent, expired or damaged.
    fn cooldown_until(&self) -> Option<Timestamp>;
    /// Consecutive openings since the circuit last closed; `None` when
    /// absent or damaged.
    fn openings(&self) -> Option<u32>;
    /// When a half-open circuit last closed; `None` when absent or damaged.
    fn closed_at(&self) -> Option<Timestamp>;
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
    fn probes(&self) -> Option<ProbeLeases> {
        self.probes.clone()
    }
    fn cooldown_until(&self) -> Option<Timestamp> {
        self.cooldown_until
    }
    fn openings(&self) -> Option<u32> {
        self.openings
    }
    fn closed_at(&self) -> Option<Timestamp> {
        self.closed_at
    }
}

/// Who a report comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Origin {
    /// Unknown: the spec's bare `record_success()` / `record_failure()`, which
    /// act on whatever state is stored.
    Untracked,
    /// A call admitted while the circuit was closed ([`Permit::Call`]).
    Call,
    /// A half-open probe ([`Permit::Probe`]).
    Probe(ProbeId),
}

/// A command to the state machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum BreakerCommand {
    /// May a call go through? Drives open → half-open; answers with a [`Permit`].
    Allow,
    /// A call succeeded.
    RecordSuccess(Origin),
    /// A call failed.
    RecordFailure(Origin),
    /// A probe ended without reaching the model: its lease ends at once.
    Release(ProbeId),
    /// Force closed and clear everything, the cooldown included.
    Reset,
    /// A quota signal: refuse every admission until `duration` from the
    /// step's instant (stored as `cooldown_until`, never shortening a longer
    /// cooldown already stored). Touches neither the state, the failure
    /// count nor the probes.
    CoolDown {
        /// How long from the step's instant the cooldown lasts.
        duration: Duration,
    },
}

/// Why an admission was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// The circuit refused: open and not yet due, or half-open with every
    /// probe lease live (the server is believed down).
    Circuit,
    /// A shared cooldown is in force: the server said its quota is spent
    /// (the server is up, but must not be called until the reset).
    Cooldown,
}

impl Refusal {
    /// The spelling events and scripts use: `circuit`, `cooldown`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Refusal::Circuit => "circuit",
            Refusal::Cooldown => "cooldown",
        }
    }
}

/// The answer to [`BreakerCommand::Allow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Permit {
    /// A call through a closed circuit.
    Call,
    /// A half-open probe: report it, or release it, by this identity.
    Probe(ProbeId),
    /// Refused.
    Refused {
        /// The circuit's state when it refused (open, or half-open with its
        /// probes live; any state for a cooldown).
        state: CircuitState,
        /// How long until a call may be admitted: the rest of the recovery
        /// timeout, until the earliest live lease ends, or until the cooldown
        /// ends. Zero when unknown.
        retry_after: Duration,
        /// Why: the circuit, or a shared cooldown.
        reason: Refusal,
    },
}

impl Permit {
    /// Whether the call may go through.
    pub fn is_admitted(&self) -> bool {
        !matches!(self, Permit::Refused { .. })
    }

    /// Who the call's report comes from.
    pub fn origin(&self) -> Option<Origin> {
        match *self {
            Permit::Call => Some(Origin::Call),
            Permit::Probe(id) => Some(Origin::Probe(id)),
            Permit::Refused { .. } => None,
        }
    }
}

/// A change to one stored key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Writes {
    /// The state key.
    pub state: Write<CircuitState>,
    /// The failure counter.
    pub failures: FailuresWrite,
    /// The open timestamp.
    pub opened_at: Write<Timestamp>,
    /// The probe leases.
    pub probes: Write<ProbeLeases>,
    /// The cooldown's end; a `Set` carries a TTL of `cooldown_until − now`,
    /// so the key expires with the cooldown.
    pub cooldown_until: Write<Timestamp>,
    /// The count of consecutive openings.
    pub openings: Write<u32>,
    /// The instant a half-open circuit closed.
    pub closed_at: Write<Timestamp>,
}

impl Writes {
    /// No change at all.
    pub const NONE: Writes = Writes {
        state: Write::Keep,
        failures: FailuresWrite::Keep,
        opened_at: Write::Keep,
        probes: Write::Keep,
        cooldown_until: Write::Keep,
        openings: Write::Keep,
        closed_at: Write::Keep,
    };

    /// Whether any key changes.
    pub fn is_empty(&self) -> bool {
        *self == Writes::NONE
    }
}

/// The result of one step: the decision and what to store.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BreakerStep {
    /// The effective state before the step.
    pub before: CircuitState,
    /// The state after the step.
    pub after: CircuitState,
    /// The instant the step was judged at (the caller's `now`, or the store's).
    pub at: Timestamp,
    /// For [`BreakerCommand::Allow`], the answer; `None` for other commands.
    pub permit: Option<Permit>,
    /// Probe leases this step found expired and dropped.
    pub expired_probes: u32,
    /// The stored state was damaged and read as closed: an excerpt of what
    /// was there (see [`excerpt`]), never the whole of a large value.
    pub unreadable: Option<String>,
    /// For an `Allow` admitted by a closed circuit, when a half-open
    /// circuit last closed (the stored `closed_at`): where a slow start's
    /// ramp begins, the same instant for every caller sharing the store.
    /// `None` for every other step.
    pub closed_at: Option<Timestamp>,
    /// What to store.
    pub writes: Writes,
}

impl BreakerStep {
    /// For `Allow`, whether the call may go through; `true` for other commands.
    pub fn allowed(&self) -> bool {
        self.permit.is_none_or(|p| p.is_admitted())
    }
}

/// The most doublings an escalated open period takes: past it every
/// period is the cap (a recovery timeout of 1 µs doubled 64 times is
/// already 584 000 years).
pub const MAX_DOUBLINGS: u32 = 64;

/// How long the circuit stays open after its `openings`-th consecutive
/// opening: `min(recovery_timeout × 2^(openings − 1), max_recovery_timeout)`,
/// with at most [`MAX_DOUBLINGS`] doublings. No count (absent or damaged)
/// and a count of zero read as the first opening. With
/// `max_recovery_timeout ≤ recovery_timeout` it is `recovery_timeout`
/// whatever the count.
pub fn open_period(params: &BreakerParams, openings: Option<u32>) -> Duration {
    let base = params.recovery_timeout;
    let cap = params.max_recovery_timeout;
    if cap <= base {
        return base;
    }
    let doublings = openings.unwrap_or(1).saturating_sub(1).min(MAX_DOUBLINGS);
    let mut escalated = if mutants::active(Mutant::EscalationForgotten) {
        0
    } else {
        base.as_micros().saturating_mul(1u128 << doublings)
    };
    escalated = escalated.max(base.as_micros());
    let micros = escalated.min(cap.as_micros());
    Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX))
}

/// Whether an open circuit opened at `opened_at` (its `openings`-th
/// consecutive opening) may probe at `now`. A missing timestamp means
/// recovery is due.
pub fn recovery_due(
    opened_at: Option<Timestamp>,
    openings: Option<u32>,
    params: &BreakerParams,
    now: Timestamp,
) -> bool {
    match opened_at {
        None => true,
        Some(t) => now.saturating_duration_since(t) >= open_period(params, openings),
    }
}

/// How long until an open circuit will admit a probe:
/// `max(0, open period − (now − opened_at))`; zero with no `opened_at`.
pub fn retry_after(snapshot: &BreakerSnapshot, params: &BreakerParams, now: Timestamp) -> Duration {
    open_wait(snapshot.opened_at, snapshot.openings, params, now)
}

fn open_wait(opened_at: Option<Timestamp>, openings: Option<u32>, params: &BreakerParams, now: Timestamp) -> Duration {
    match opened_at {
        None => Duration::ZERO,
        Some(t) => open_period(params, openings).saturating_sub(now.saturating_duration_since(t)),
    }
}

/// The most bytes of a damaged stored value [`excerpt`] keeps.
pub const EXCERPT_BYTES: usize = 64;

/// What a report shows of a damaged stored value: the value itself when it is
/// at most [`EXCERPT_BYTES`] long, else its first bytes (cut at a character
/// boundary) and its full length — `"xxxx… (1048576 bytes)"`. A foreign
/// writer's megabyte never travels whole into an event or a log line.
pub fn excerpt(stored: &str) -> String {
    if stored.len() <= EXCERPT_BYTES {
        return stored.to_owned();
    }
    let mut end = EXCERPT_BYTES;
    while !stored.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &stored[..end], stored.len())
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
    let mut permit = None;
    let mut expired_probes = 0;
    let mut closed_at = None;
    if command == BreakerCommand::Allow
        && let Some(until) = stored.cooldown_until().filter(|until| *until > now)
    {
        // A cooldown refuses whatever the circuit would say, and changes
        // nothing: no transition, no probe, no lease pruned.
        return BreakerStep {
            before,
            after: before,
            at: now,
            permit: Some(Permit::Refused {
                state: before,
                retry_after: until.saturating_duration_since(now),
                reason: Refusal::Cooldown,
            }),
            expired_probes,
            unreadable,
            closed_at: None,
            writes,
        };
    }
    let after = match (command, before) {
        (BreakerCommand::Reset, _) => {
            writes = clear_all();
            writes.cooldown_until = Write::Delete;
            writes.closed_at = Write::Delete;
            Closed
        }
        (BreakerCommand::CoolDown { duration }, _) => {
            let until = cooldown_end(now, duration);
            // The later signal wins only when it ends later: never shortened.
            let extends = |stored: Timestamp| until > stored && !mutants::active(Mutant::CooldownNotExtended);
            if until > now && stored.cooldown_until().is_none_or(extends) {
                writes.cooldown_until = Write::Set(until);
            }
            before
        }
        (BreakerCommand::Allow, Closed) => {
            permit = Some(Permit::Call);
            closed_at = stored.closed_at();
            Closed
        }
        (BreakerCommand::Allow, Open) => {
            if recovery_due(stored.opened_at(), stored.openings(), params, now) {
                // The transitioning call is itself the first probe.
                let (mut leases, id) = first_probe(params, now);
                if mutants::active(Mutant::TransitionNotProbe) {
                    leases.live.clear();
                }
                writes.state = Write::Set(HalfOpen);
                writes.probes = Write::Set(leases);
                permit = Some(Permit::Probe(id));
                HalfOpen
            } else {
                permit = Some(Permit::Refused {
                    state: Open,
                    retry_after: open_wait(stored.opened_at(), stored.openings(), params, now),
                    reason: Refusal::Circuit,
                });
                Open
            }
        }
        (BreakerCommand::Allow, HalfOpen) => {
            match stored.probes() {
                None => {
                    // No readable record: begin a fresh episode now.
                    let (leases, id) = first_probe(params, now);
                    writes.probes = Write::Set(leases);
                    permit = Some(Permit::Probe(id));
                }
                Some(mut leases) => {
                    let held = leases.live.len();
                    leases.live.retain(|l| l.expires > now);
                    expired_probes = u32::try_from(held - leases.live.len()).unwrap_or(u32::MAX);
                    if leases.live.len() < params.half_open_max_calls as usize
                        || mutants::active(Mutant::UnlimitedProbes)
                    {
                        let seq = leases.issued.saturating_add(1);
                        leases.issued = seq;
                        leases.live.push(Lease {
                            seq,
                            expires: lease_end(params, now),
                        });
                        permit = Some(Permit::Probe(ProbeId {
                            episode: leases.episode,
                            seq,
                        }));
                        writes.probes = Write::Set(leases);
                    } else {
                        let earliest = leases.live.iter().map(|l| l.expires).min();
                        permit = Some(Permit::Refused {
                            state: HalfOpen,
                            retry_after: earliest.map_or(Duration::ZERO, |t| t.saturating_duration_since(now)),
                            reason: Refusal::Circuit,
                        });
                    }
                }
            }
            HalfOpen
        }
        (BreakerCommand::RecordSuccess(Origin::Untracked | Origin::Call), Closed) => {
            if stored.failures().is_some() {
                writes.failures = FailuresWrite::Delete;
            }
            Closed
        }
        (BreakerCommand::RecordFailure(Origin::Untracked | Origin::Call), Closed) => {
            let failures = stored.failures();
            let count = failures.map_or(1, |n| n.saturating_add(1));
            if count >= params.failure_threshold {
                writes = open_now(now, 1);
                Open
            } else {
                writes.failures = match failures {
                    None => FailuresWrite::Create,
                    Some(_) => FailuresWrite::Bump(count),
                };
                Closed
            }
        }
        (BreakerCommand::RecordSuccess(origin), HalfOpen) => {
            if decides_episode(stored, origin, now) {
                writes = clear_all();
                // The close a slow start ramps from, written in this step,
                // so a fleet agrees on it.
                writes.closed_at = Write::Set(now);
                Closed
            } else {
                HalfOpen
            }
        }
        (BreakerCommand::RecordFailure(origin), HalfOpen) => {
            if decides_episode(stored, origin, now) {
                // One more consecutive opening: the circuit never closed.
                writes = open_now(now, stored.openings().unwrap_or(1).saturating_add(1));
                Open
            } else {
                HalfOpen
            }
        }
        (BreakerCommand::Release(probe), HalfOpen) => {
            if let Some(mut leases) = stored.probes().filter(|l| l.holds(probe, now)) {
                leases.live.retain(|l| l.seq != probe.seq);
                writes.probes = Write::Set(leases);
            }
            HalfOpen
        }
        // Late reports change nothing: about calls admitted before the circuit
        // opened (they never push the recovery out), from probes of an episode
        // that is over, or releases of a probe no episode holds.
        (BreakerCommand::RecordSuccess(_) | BreakerCommand::RecordFailure(_), Open)
        | (BreakerCommand::RecordSuccess(Origin::Probe(_)) | BreakerCommand::RecordFailure(Origin::Probe(_)), Closed)
        | (BreakerCommand::Release(_), Closed | Open) => before,
    };
    BreakerStep {
        before,
        after,
        at: now,
        permit,
        expired_probes,
        unreadable,
        closed_at,
        writes,
    }
}

/// Whether a report from `origin` decides the half-open episode: an untracked
/// one always (the spec's behaviour), a probe's only while its lease is live,
/// a closed-circuit call's never.
fn decides_episode(stored: &impl BreakerView, origin: Origin, now: Timestamp) -> bool {
    match origin {
        Origin::Untracked => true,
        Origin::Call => false,
        Origin::Probe(id) => stored.probes().is_some_and(|l| l.holds(id, now)),
    }
}

fn first_probe(params: &BreakerParams, now: Timestamp) -> (ProbeLeases, ProbeId) {
    let leases = ProbeLeases {
        episode: now,
        issued: 1,
        live: vec![Lease {
            seq: 1,
            expires: lease_end(params, now),
        }],
    };
    (leases, ProbeId { episode: now, seq: 1 })
}

/// When a cooldown of `duration` written at `now` ends: at most 2^53 µs, the
/// largest instant a store holds exactly.
pub fn cooldown_end(now: Timestamp, duration: Duration) -> Timestamp {
    let end = now.saturating_add(duration);
    Timestamp::from_micros(end.as_micros().min(MAX_STORED_MICROS))
}

/// When a probe admitted at `now` stops counting.
fn lease_end(params: &BreakerParams, now: Timestamp) -> Timestamp {
    if mutants::active(Mutant::ProbeNeverReports) {
        // No lease: the probe counts until it reports, if it ever does.
        return Timestamp::from_micros(MAX_STORED_MICROS);
    }
    now.saturating_add(params.probe_lease)
}

/// Opens the circuit at `now`, its `openings`-th consecutive opening.
fn open_now(now: Timestamp, openings: u32) -> Writes {
    Writes {
        state: Write::Set(CircuitState::Open),
        failures: FailuresWrite::Delete,
        opened_at: Write::Set(now),
        probes: Write::Delete,
        cooldown_until: Write::Keep,
        openings: Write::Set(openings),
        closed_at: Write::Keep,
    }
}

/// Clears the circuit's five keys, its count of openings included; a
/// cooldown is the server's word, not the circuit's, and outlives a closing
/// (only `Reset` clears it), as does the last close (a closing sets it).
fn clear_all() -> Writes {
    Writes {
        state: Write::Delete,
        failures: FailuresWrite::Delete,
        opened_at: Write::Delete,
        probes: Write::Delete,
        cooldown_until: Write::Keep,
        openings: Write::Delete,
        closed_at: Write::Keep,
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
    match &writes.probes {
        Write::Keep => {}
        Write::Set(p) => next.probes = Some(p.clone()),
        Write::Delete => next.probes = None,
    }
    match writes.cooldown_until {
        Write::Keep => {}
        Write::Set(t) => next.cooldown_until = Some(t),
        Write::Delete => next.cooldown_until = None,
    }
    match writes.openings {
        Write::Keep => {}
        Write::Set(n) => next.openings = Some(n),
        Write::Delete => next.openings = None,
    }
    match writes.closed_at {
        Write::Keep => {}
        Write::Set(t) => next.closed_at = Some(t),
        Write::Delete => next.closed_at = None,
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
            max_recovery_timeout: Duration::from_secs(timeout_s),
            half_open_max_calls: probes,
            probe_lease: Duration::from_secs(timeout_s),
        }
    }

    const FAIL: BreakerCommand = BreakerCommand::RecordFailure(Origin::Untracked);

    const TICK_1US: Duration = Duration::from_micros(1);

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    const T0: Timestamp = Timestamp::from_secs(1_000);

    fn open_at(t: Timestamp) -> BreakerSnapshot {
        BreakerSnapshot {
            state: StoredState::Valid(CircuitState::Open),
            failures: None,
            opened_at: Some(t),
            probes: None,
            cooldown_until: None,
            openings: None,
            closed_at: None,
        }
    }

    #[test]
    fn a_close_stamps_closed_at_which_closed_admissions_carry_and_reset_clears() {
        let p = params(1, 10, 1);
        let due = T0.saturating_add(secs(10));
        let probe = step(&open_at(T0), BreakerCommand::Allow, &p, due);
        let Some(Permit::Probe(id)) = probe.permit else {
            panic!("a probe at the recovery: {probe:?}")
        };
        assert_eq!(probe.closed_at, None, "a probe is not ramped");
        let half = apply(&open_at(T0), &probe.writes);
        let closing = step(&half, BreakerCommand::RecordSuccess(Origin::Probe(id)), &p, due);
        assert_eq!(closing.after, CircuitState::Closed);
        assert_eq!(closing.writes.closed_at, Write::Set(due));
        let closed = apply(&half, &closing.writes);
        let later = due.saturating_add(secs(3));
        let call = step(&closed, BreakerCommand::Allow, &p, later);
        assert_eq!((call.permit, call.closed_at), (Some(Permit::Call), Some(due)));
        assert!(call.writes.is_empty(), "an admission writes nothing");
        // An opening keeps it (the next close replaces it); a failed probe
        // writes none; a reset clears it.
        let opened = step(&closed, FAIL, &p, later);
        assert_eq!(opened.writes.closed_at, Write::Keep);
        let reopened = step(&half, BreakerCommand::RecordFailure(Origin::Probe(id)), &p, due);
        assert_eq!(reopened.writes.closed_at, Write::Keep);
        let reset = step(&closed, BreakerCommand::Reset, &p, later);
        assert_eq!(reset.writes.closed_at, Write::Delete);
        // A damaged value reads as no close.
        assert_eq!(decode_closed_at("soon"), None);
        assert_eq!(decode_closed_at("12"), Some(Timestamp::from_micros(12)));
    }

    #[test]
    fn failures_below_threshold_count_then_open() {
        let p = params(2, 60, 1);
        let s1 = step(&BreakerSnapshot::EMPTY, FAIL, &p, T0);
        assert_eq!(s1.writes.failures, FailuresWrite::Create);
        assert_eq!(s1.after, CircuitState::Closed);
        let snap = apply(&BreakerSnapshot::EMPTY, &s1.writes);
        let s2 = step(&snap, FAIL, &p, T0);
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
        assert_eq!(
            early.permit,
            Some(Permit::Refused {
                state: CircuitState::Open,
                retry_after: secs(1),
                reason: Refusal::Circuit,
            })
        );
        assert!(early.writes.is_empty());
        let due = step(
            &open_at(T0),
            BreakerCommand::Allow,
            &p,
            T0.saturating_add(Duration::from_secs(60)),
        );
        let at = T0.saturating_add(secs(60));
        let first = ProbeId { episode: at, seq: 1 };
        assert_eq!(due.permit, Some(Permit::Probe(first)));
        assert_eq!(due.after, CircuitState::HalfOpen);
        assert_eq!(
            due.writes.probes,
            Write::Set(ProbeLeases {
                episode: at,
                issued: 1,
                live: vec![Lease {
                    seq: 1,
                    expires: at.saturating_add(secs(60))
                }]
            })
        );
    }

    #[test]
    fn missing_opened_at_is_recovery_due() {
        let mut snap = open_at(T0);
        snap.opened_at = None;
        assert!(step(&snap, BreakerCommand::Allow, &params(1, 60, 1), T0).allowed());
        assert_eq!(retry_after(&snap, &params(1, 60, 1), T0), Duration::ZERO);
    }

    #[test]
    fn a_large_unreadable_state_is_reported_by_excerpt() {
        let big = "x".repeat(1 << 20);
        let snap = BreakerSnapshot::decode([Some(&big), None, None, None, None, None, None]);
        let s = step(&snap, BreakerCommand::Allow, &params(1, 60, 1), T0);
        let shown = s.unreadable.expect("reported");
        assert!(shown.len() <= EXCERPT_BYTES + 32, "{} bytes", shown.len());
        assert!(shown.starts_with(&"x".repeat(EXCERPT_BYTES)));
        assert!(shown.ends_with("(1048576 bytes)"), "{shown}");
        // Never cut inside a character.
        let wide = "é".repeat(100);
        assert!(excerpt(&wide).starts_with(&"é".repeat(EXCERPT_BYTES / 2)));
        assert_eq!(excerpt("bogus"), "bogus");
    }

    #[test]
    fn unreadable_state_is_closed_and_reported() {
        let snap = BreakerSnapshot::decode([Some("bogus"), None, None, None, None, None, None]);
        let s = step(&snap, BreakerCommand::Allow, &params(1, 60, 1), T0);
        assert_eq!(s.permit, Some(Permit::Call));
        assert_eq!(s.before, CircuitState::Closed);
        assert_eq!(s.unreadable.as_deref(), Some("bogus"));
    }

    #[test]
    fn failures_while_open_change_nothing() {
        let s = step(
            &open_at(T0),
            FAIL,
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
        assert_eq!(k.probes, "{kg:circuit}:probes");
        assert_eq!(k.cooldown_until, "{kg:circuit}:cooldown_until");
    }

    /// Runs `commands` from an open circuit, returning each step.
    fn run(p: &BreakerParams, commands: &[(BreakerCommand, u64)]) -> Vec<BreakerStep> {
        let mut snap = open_at(T0);
        commands
            .iter()
            .map(|&(command, at)| {
                let s = step(&snap, command, p, T0.saturating_add(secs(at)));
                snap = apply(&snap, &s.writes);
                s
            })
            .collect()
    }

    fn probe_of(s: &BreakerStep) -> ProbeId {
        match s.permit {
            Some(Permit::Probe(id)) => id,
            other => panic!("expected a probe, got {other:?}"),
        }
    }

    #[test]
    fn a_probe_that_never_reports_stops_counting_after_its_lease() {
        let p = params(1, 60, 1);
        let steps = run(
            &p,
            &[
                (BreakerCommand::Allow, 60),
                (BreakerCommand::Allow, 90),
                (BreakerCommand::Allow, 120),
            ],
        );
        let first = probe_of(&steps[0]);
        assert_eq!(
            steps[1].permit,
            Some(Permit::Refused {
                state: CircuitState::HalfOpen,
                retry_after: secs(30),
                reason: Refusal::Circuit,
            }),
            "refused until the live lease ends, and says when"
        );
        let second = probe_of(&steps[2]);
        assert_eq!(steps[2].expired_probes, 1);
        assert_eq!(
            second,
            ProbeId {
                episode: first.episode,
                seq: 2
            }
        );
    }

    #[test]
    fn a_late_report_after_the_lease_changes_nothing_and_a_live_one_decides() {
        let p = params(1, 60, 1);
        let steps = run(&p, &[(BreakerCommand::Allow, 60), (BreakerCommand::Allow, 120)]);
        let (first, second) = (probe_of(&steps[0]), probe_of(&steps[1]));
        let mut snap = apply(&apply(&open_at(T0), &steps[0].writes), &steps[1].writes);
        let late = step(
            &snap,
            BreakerCommand::RecordFailure(Origin::Probe(first)),
            &p,
            T0.saturating_add(secs(121)),
        );
        assert!(late.writes.is_empty(), "the expired probe's failure is ignored");
        assert_eq!(late.after, CircuitState::HalfOpen);
        let live = step(
            &snap,
            BreakerCommand::RecordSuccess(Origin::Probe(second)),
            &p,
            T0.saturating_add(secs(121)),
        );
        assert_eq!(live.after, CircuitState::Closed);
        snap = apply(&snap, &live.writes);
        let closed = BreakerSnapshot {
            closed_at: Some(T0.saturating_add(secs(121))),
            ..BreakerSnapshot::EMPTY
        };
        assert_eq!(snap, closed, "everything cleared but the close");
    }

    #[test]
    fn a_released_probe_frees_its_slot_at_once() {
        let p = params(1, 60, 1);
        let steps = run(&p, &[(BreakerCommand::Allow, 60)]);
        let id = probe_of(&steps[0]);
        let snap = apply(&open_at(T0), &steps[0].writes);
        let released = step(&snap, BreakerCommand::Release(id), &p, T0.saturating_add(secs(61)));
        let snap = apply(&snap, &released.writes);
        assert_eq!(snap.live_probes(T0.saturating_add(secs(61))), 0);
        let next = step(&snap, BreakerCommand::Allow, &p, T0.saturating_add(secs(61)));
        assert_eq!(probe_of(&next).seq, 2);
        let again = step(&snap, BreakerCommand::Release(id), &p, T0.saturating_add(secs(61)));
        assert!(again.writes.is_empty(), "releasing twice does nothing");
    }

    #[test]
    fn a_closed_calls_report_does_not_decide_a_half_open_episode() {
        let p = params(1, 60, 1);
        let steps = run(&p, &[(BreakerCommand::Allow, 60)]);
        let snap = apply(&open_at(T0), &steps[0].writes);
        for command in [
            BreakerCommand::RecordFailure(Origin::Call),
            BreakerCommand::RecordSuccess(Origin::Call),
        ] {
            assert!(step(&snap, command, &p, T0.saturating_add(secs(61))).writes.is_empty());
        }
        let untracked = step(&snap, FAIL, &p, T0.saturating_add(secs(61)));
        assert_eq!(
            untracked.after,
            CircuitState::Open,
            "the spec's bare report still decides"
        );
    }

    #[test]
    fn a_damaged_lease_record_starts_a_fresh_episode() {
        let snap = BreakerSnapshot::decode([Some("half_open"), None, None, Some("1 2 x"), None, None, None]);
        assert_eq!(snap.probes, None);
        let s = step(&snap, BreakerCommand::Allow, &params(1, 60, 1), T0);
        assert_eq!(probe_of(&s), ProbeId { episode: T0, seq: 1 });
    }

    fn cool(d: u64) -> BreakerCommand {
        BreakerCommand::CoolDown { duration: secs(d) }
    }

    fn refused_for_cooldown(state: CircuitState, wait: u64) -> Option<Permit> {
        Some(Permit::Refused {
            state,
            retry_after: secs(wait),
            reason: Refusal::Cooldown,
        })
    }

    #[test]
    fn a_cooldown_refuses_every_admission_until_it_ends_and_touches_nothing_else() {
        let p = params(2, 60, 1);
        let wrote = step(&BreakerSnapshot::EMPTY, cool(30), &p, T0);
        assert_eq!(
            wrote.writes,
            Writes {
                cooldown_until: Write::Set(T0.saturating_add(secs(30))),
                ..Writes::NONE
            }
        );
        assert_eq!(
            (wrote.before, wrote.after, wrote.permit),
            (CircuitState::Closed, CircuitState::Closed, None)
        );
        let snap = apply(&BreakerSnapshot::EMPTY, &wrote.writes);
        let during = step(&snap, BreakerCommand::Allow, &p, T0.saturating_add(secs(10)));
        assert_eq!(during.permit, refused_for_cooldown(CircuitState::Closed, 20));
        assert!(during.writes.is_empty());
        let at_end = step(&snap, BreakerCommand::Allow, &p, T0.saturating_add(secs(30)));
        assert_eq!(at_end.permit, Some(Permit::Call), "the cooldown ends at its instant");
        // Reports still count as before: a cooldown is no failure, and a
        // call's own failure is still one.
        let failed = step(&snap, FAIL, &p, T0);
        assert_eq!(failed.writes.failures, FailuresWrite::Create);
        assert_eq!(failed.writes.cooldown_until, Write::Keep);
    }

    /// Threshold 1, 10 s recovery escalating to at most 45 s.
    fn escalating() -> BreakerParams {
        BreakerParams {
            max_recovery_timeout: secs(45),
            ..params(1, 10, 1)
        }
    }

    /// Runs `command` on `snap` at `now` and applies its writes.
    fn stepped(
        snap: &BreakerSnapshot,
        command: BreakerCommand,
        p: &BreakerParams,
        now: Timestamp,
    ) -> (BreakerStep, BreakerSnapshot) {
        let s = step(snap, command, p, now);
        let next = apply(snap, &s.writes);
        (s, next)
    }

    #[test]
    fn each_failed_probe_doubles_the_open_period_up_to_the_cap() {
        let p = escalating();
        let (opened, mut snap) = stepped(&BreakerSnapshot::EMPTY, FAIL, &p, T0);
        assert_eq!(opened.writes.openings, Write::Set(1));
        let mut at = T0;
        // 10 s, then 20, 40, and 45 (the cap) for every opening after.
        for (n, period) in [(1u32, 10u64), (2, 20), (3, 40), (4, 45), (5, 45)] {
            assert_eq!(snap.openings, Some(n));
            let early = step(
                &snap,
                BreakerCommand::Allow,
                &p,
                at.saturating_add(secs(period) - TICK_1US),
            );
            assert_eq!(
                early.permit,
                Some(Permit::Refused {
                    state: CircuitState::Open,
                    retry_after: TICK_1US,
                    reason: Refusal::Circuit,
                }),
                "opening {n} lasts {period} s"
            );
            at = at.saturating_add(secs(period));
            let (probe, half) = stepped(&snap, BreakerCommand::Allow, &p, at);
            let Some(Permit::Probe(id)) = probe.permit else {
                panic!("opening {n} ends after {period} s: {:?}", probe.permit)
            };
            let (failed, next) = stepped(&half, BreakerCommand::RecordFailure(Origin::Probe(id)), &p, at);
            assert_eq!(failed.after, CircuitState::Open);
            assert_eq!(failed.writes.openings, Write::Set(n + 1));
            snap = next;
        }
    }

    #[test]
    fn a_closing_resets_the_escalation_and_a_reset_clears_it() {
        let p = escalating();
        let mut snap = open_at(T0);
        snap.openings = Some(3);
        // The third opening lasts 40 s: a probe at 40 s succeeds and closes.
        let due = T0.saturating_add(secs(40));
        let (probe, half) = stepped(&snap, BreakerCommand::Allow, &p, due);
        let Some(Permit::Probe(id)) = probe.permit else {
            panic!("{:?}", probe.permit)
        };
        let (closed, closed_snap) = stepped(&half, BreakerCommand::RecordSuccess(Origin::Probe(id)), &p, due);
        assert_eq!(closed.after, CircuitState::Closed);
        assert_eq!(closed.writes.openings, Write::Delete);
        // The next opening is a first one again: 10 s.
        let (_, reopened) = stepped(&closed_snap, FAIL, &p, due);
        assert_eq!(reopened.openings, Some(1));
        assert_eq!(retry_after(&reopened, &p, due), secs(10));
        assert_eq!(
            step(&snap, BreakerCommand::Reset, &p, T0).writes.openings,
            Write::Delete
        );
    }

    #[test]
    fn without_a_higher_cap_or_with_a_damaged_count_the_period_is_the_recovery_timeout() {
        let fixed = params(1, 10, 1);
        for openings in [None, Some(0), Some(1), Some(7), Some(u32::MAX)] {
            assert_eq!(open_period(&fixed, openings), secs(10), "{openings:?}");
        }
        let p = escalating();
        assert_eq!(open_period(&p, None), secs(10), "no count is a first opening");
        assert_eq!(open_period(&p, Some(0)), secs(10));
        assert_eq!(
            open_period(&p, Some(u32::MAX)),
            secs(45),
            "no overflow past 64 doublings"
        );
        // Numbers no builder accepts still saturate rather than wrap.
        let huge = BreakerParams {
            recovery_timeout: Duration::from_secs(u64::MAX / 4),
            max_recovery_timeout: Duration::MAX,
            ..p
        };
        assert_eq!(open_period(&huge, Some(u32::MAX)), Duration::from_micros(u64::MAX));
        for damaged in ["", "-1", "x", "4294967296", "99999999999999999"] {
            assert_eq!(decode_openings(damaged), None, "{damaged:?}");
        }
        assert_eq!(decode_openings("4294967295"), Some(u32::MAX));
    }

    #[test]
    fn a_cooldown_is_never_shortened_only_extended() {
        let p = params(2, 60, 1);
        let snap = apply(
            &BreakerSnapshot::EMPTY,
            &step(&BreakerSnapshot::EMPTY, cool(30), &p, T0).writes,
        );
        let shorter = step(&snap, cool(10), &p, T0.saturating_add(secs(5)));
        assert!(shorter.writes.is_empty(), "15 s left is more than 10 s");
        let longer = step(&snap, cool(40), &p, T0.saturating_add(secs(5)));
        assert_eq!(longer.writes.cooldown_until, Write::Set(T0.saturating_add(secs(45))));
        assert!(
            step(&snap, cool(0), &p, T0.saturating_add(secs(40))).writes.is_empty(),
            "a zero wait writes nothing"
        );
        let huge = step(
            &BreakerSnapshot::EMPTY,
            BreakerCommand::CoolDown {
                duration: Duration::MAX,
            },
            &p,
            T0,
        );
        assert_eq!(
            huge.writes.cooldown_until,
            Write::Set(Timestamp::from_micros(MAX_STORED_MICROS))
        );
    }

    #[test]
    fn a_cooldown_holds_an_open_circuit_due_for_recovery_and_a_half_open_one_probes_nothing() {
        let p = params(1, 60, 1);
        let mut open = open_at(T0);
        open.cooldown_until = Some(T0.saturating_add(secs(90)));
        let due = step(&open, BreakerCommand::Allow, &p, T0.saturating_add(secs(60)));
        assert_eq!(due.permit, refused_for_cooldown(CircuitState::Open, 30));
        assert_eq!(due.after, CircuitState::Open, "no transition, no probe");
        assert!(due.writes.is_empty());
        let after = step(&open, BreakerCommand::Allow, &p, T0.saturating_add(secs(90)));
        assert!(matches!(after.permit, Some(Permit::Probe(_))));
        // Half-open with a free probe slot and an expired lease: still nothing.
        let mut half = apply(
            &open_at(T0),
            &step(&open_at(T0), BreakerCommand::Allow, &p, T0.saturating_add(secs(60))).writes,
        );
        half.cooldown_until = Some(T0.saturating_add(secs(200)));
        let s = step(&half, BreakerCommand::Allow, &p, T0.saturating_add(secs(150)));
        assert_eq!(s.permit, refused_for_cooldown(CircuitState::HalfOpen, 50));
        assert_eq!((s.expired_probes, s.writes.is_empty()), (0, true));
        // A success closes the circuit and leaves the cooldown; Reset clears it.
        let closed = step(
            &half,
            BreakerCommand::RecordSuccess(Origin::Untracked),
            &p,
            T0.saturating_add(secs(61)),
        );
        assert_eq!(closed.writes.cooldown_until, Write::Keep);
        assert_eq!(
            step(&half, BreakerCommand::Reset, &p, T0).writes.cooldown_until,
            Write::Delete
        );
    }

    #[test]
    fn stored_cooldowns_decode_strictly() {
        assert_eq!(
            decode_cooldown("1700000000000000"),
            Some(Timestamp::from_micros(1_700_000_000_000_000))
        );
        for damaged in ["", "x", "-1", "1.5", "99999999999999999", "9007199254740993"] {
            assert_eq!(decode_cooldown(damaged), None, "{damaged:?}");
        }
        let snap = BreakerSnapshot::decode([None, None, None, None, Some("junk"), None, None]);
        assert_eq!(snap.cooldown_until, None);
    }

    #[test]
    fn lease_records_round_trip_and_reject_damage() {
        let leases = ProbeLeases {
            episode: T0,
            issued: 3,
            live: vec![
                Lease {
                    seq: 2,
                    expires: T0.saturating_add(secs(5)),
                },
                Lease {
                    seq: 3,
                    expires: T0.saturating_add(secs(6)),
                },
            ],
        };
        assert_eq!(ProbeLeases::decode(&leases.encode()), Some(leases));
        for damaged in [
            "",
            "1",
            "1 2 ",
            " 1 2",
            "1  2",
            "1 2 3",
            "1 2 3:",
            "+1 2",
            "1 4294967296",
            "99999999999999999 1",
            "1 2 3:4 x:5",
        ] {
            assert_eq!(ProbeLeases::decode(damaged), None, "{damaged:?}");
        }
    }
}
