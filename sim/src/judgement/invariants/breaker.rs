//! The breaker's promises: a bounded number of probes per half-open
//! episode, no opening on sparse failures, and no call while open.
//!
//! Each checker replays breaker state through the one fold,
//! [`Breakers`], and keeps only what its own subject needs.

use std::collections::BTreeMap;
use std::time::Duration;

use redstring::{CircuitState, TimeSource};

use super::limiter::clock_spread;
use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::timeline::{Breakers, Change};
use crate::evidence::trace::{Kind, TraceEvent};
use crate::scenario::Fault;

/// Invariant 3: a half-open episode never holds more than
/// `half_open_max_calls` live probes. A probe is live from its admission until
/// its lease (`probe_lease_s`, by default the recovery timeout) ends on the
/// clock that stamped it, it is handed back, or the episode ends.
pub(super) fn half_open_probes(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let max = ctx.scenario.hardening.half_open_max_calls as usize;
    let lease = ctx.lease_us;
    let mut breakers = Breakers::new(ctx.scopes);
    // The live probes of each breaker's current half-open episode: (seq, stamp).
    let mut live: BTreeMap<String, Vec<(u32, u64)>> = BTreeMap::new();
    let (mut episodes, mut most, mut verdict) = (0, 0, Verdict::Held);
    for e in events {
        // A breaker that says it began an episode the circuit is already in
        // (it decided on a stale read) begins nothing: its probe joins the
        // episode in hand.
        let prior = match &e.kind {
            Kind::Breaker { breaker, .. } => Some(breakers.state(&ctx.scopes.breaker(e, breaker))),
            _ => None,
        };
        match breakers.observe(e) {
            Some(Change::Moved {
                to: CircuitState::HalfOpen,
                ..
            }) if prior == Some(CircuitState::HalfOpen) => {}
            Some(Change::Moved {
                scope,
                to: CircuitState::HalfOpen,
                ..
            }) => {
                episodes += 1;
                live.insert(scope, Vec::new());
            }
            Some(Change::Moved { .. } | Change::Forgotten) | None => {}
        }
        match &e.kind {
            Kind::ProbeReleased { breaker, seq } => {
                if let Some(probes) = live.get_mut(&ctx.scopes.breaker(e, breaker)) {
                    probes.retain(|(s, _)| s != seq);
                }
            }
            Kind::Allowed {
                breaker,
                state: CircuitState::HalfOpen,
                probe: Some(seq),
                at_us,
            } => {
                let scope = ctx.scopes.breaker(e, breaker);
                if breakers.state(&scope) == CircuitState::HalfOpen
                    && let Some(probes) = live.get_mut(&scope)
                {
                    probes.retain(|(_, stamp)| stamp.saturating_add(lease) > *at_us);
                    probes.push((*seq, *at_us));
                    most = most.max(probes.len());
                    if probes.len() > max && verdict == Verdict::Held {
                        verdict = violated(e, format!("{} live probes (half_open_max_calls {max})", probes.len()));
                    }
                }
            }
            _ => {}
        }
    }
    if episodes == 0 {
        return not_applicable("no half-open episode");
    }
    (
        verdict,
        format!("episodes: {episodes}; most live probes at once: {most} (max {max})"),
    )
}

/// Invariant 4: failures spaced further apart than `recovery_timeout` never
/// open the circuit (threshold ≥ 2). Checked as the necessary condition: the
/// `failure_threshold` failures before an opening span at most one timeout.
pub(super) fn sparse_failures(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let threshold = ctx.scenario.hardening.failure_threshold as usize;
    if threshold < 2 {
        return not_applicable("failure_threshold is 1");
    }
    // Tolerance for a shared cache's TTLs running on a drifting clock.
    let slack = ctx.scenario.tick_ms * 1000 + ctx.recovery_us / 1000;
    let mut breakers = Breakers::new(ctx.scopes);
    // Failures reported while the breaker is closed, since it last closed.
    let mut failures: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let (mut openings, mut widest, mut verdict) = (0, 0u64, Verdict::Held);
    for e in events {
        match &e.kind {
            Kind::FailureRecorded { breaker, at_us } => {
                let scope = ctx.scopes.breaker(e, breaker);
                if breakers.state(&scope) == CircuitState::Closed {
                    failures.entry(scope).or_default().push(ctx.instant(e, *at_us));
                }
            }
            Kind::FailuresCleared { breaker, .. } => {
                let scope = ctx.scopes.breaker(e, breaker);
                if breakers.state(&scope) == CircuitState::Closed {
                    failures.entry(scope).or_default().clear();
                }
            }
            _ => {}
        }
        match breakers.observe(e) {
            Some(Change::Moved { scope, from, to }) => {
                let list = failures.entry(scope).or_default();
                if (from, to) == (CircuitState::Closed, CircuitState::Open) {
                    openings += 1;
                    let now = match e.kind {
                        Kind::Breaker { at_us, .. } => ctx.instant(e, at_us),
                        _ => e.t_us,
                    };
                    if list.len() >= threshold {
                        let first = list[list.len() - threshold];
                        let span = now.saturating_sub(first);
                        widest = widest.max(span);
                        if span > ctx.recovery_us + slack && verdict == Verdict::Held {
                            verdict = violated(
                                e,
                                format!("opened on {threshold} failures spread over {} ms", span / 1000),
                            );
                        }
                    }
                }
                list.clear();
            }
            Some(Change::Forgotten) => failures.clear(),
            None => {}
        }
    }
    if openings == 0 {
        return not_applicable("the circuit never opened");
    }
    (
        verdict,
        format!(
            "openings: {openings}; widest spread of the failures that opened it: {} ms",
            widest / 1000
        ),
    )
}

/// Invariant 5: no call is admitted while its breaker is open and not yet due
/// to probe — per worker, or fleet-wide with a shared cache. An admission
/// is judged by the state when it reached the trace — exact for a
/// per-worker breaker — and, on a shared cache stamping with its own time,
/// by the state at its own stamp too: it is stale only if both say so.
/// Either alone can mislead there: a decision reaches the trace a network
/// trip after the store made it, so trace order can put it after a
/// transition the store made later; and a clock that steps back puts later
/// decisions at earlier stamps.
pub(super) fn no_call_while_open(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let mut breakers = Breakers::new(ctx.scopes);
    let (mut admitted_while_impaired, mut verdict) = (0, Verdict::Held);
    let mut any_open = false;
    // Calls the breaker's fallback let through while the cache could not be
    // reached (`on_cache_error = "allow"`): no circuit decided them, so they
    // are outside the claim, and counted.
    let mut unchecked = 0;
    let stamped = (ctx.single_clock && ctx.scopes.shared()).then(|| Transitions::of(ctx, events));
    for (i, e) in events.iter().enumerate() {
        if let Kind::CacheUnavailable {
            admitted_call: true, ..
        } = e.kind
        {
            unchecked += 1;
        }
        if let Kind::Allowed {
            breaker,
            state: decided,
            at_us,
            ..
        } = &e.kind
        {
            let scope = ctx.scopes.breaker(e, breaker);
            let stale = |current: CircuitState| match decided {
                CircuitState::Closed => current != CircuitState::Closed,
                CircuitState::HalfOpen | CircuitState::Open => current == CircuitState::Open,
            };
            let current = breakers.state(&scope);
            // Stale in trace order, and — where stamps order decisions —
            // by stamp too: each order alone can mislead (a late delivery;
            // a stamping clock stepped back).
            let by_stamp = stamped
                .as_ref()
                .is_none_or(|t| stale(t.state_at(&scope, i, *at_us, *decided == CircuitState::Closed)));
            if stale(current) && by_stamp {
                admitted_while_impaired += 1;
                if verdict == Verdict::Held {
                    verdict = violated(e, format!("admitted as {decided:?} while the circuit was {current:?}"));
                }
            }
        }
        if let Some(Change::Moved { to, .. }) = breakers.observe(e) {
            any_open |= to == CircuitState::Open;
        }
    }
    if !any_open {
        return not_applicable("the circuit never opened");
    }
    let mut figure = format!("{admitted_while_impaired} admissions while open");
    if unchecked > 0 {
        figure.push_str(&format!(
            "; {unchecked} calls let through by the breaker's fallback while the cache was unreachable (on_cache_error = allow)"
        ));
    }
    (verdict, figure)
}

/// Entries of each breaker scope, in a fixed order.
type PerScope<T> = BTreeMap<String, Vec<T>>;

/// Every breaker's transitions by the stamp of the step that made them, per
/// life of the store (a restarted shared cache starts every breaker closed).
struct Transitions {
    /// Per life: the trace index it begins at, and per scope the
    /// transitions (stamp, state after) in stamp order.
    lives: Vec<(usize, PerScope<(u64, CircuitState)>)>,
}

impl Transitions {
    fn of(ctx: &Ctx, events: &[TraceEvent]) -> Transitions {
        let mut breakers = Breakers::new(ctx.scopes);
        let mut lives = vec![(0, BTreeMap::new())];
        for (i, e) in events.iter().enumerate() {
            if let Kind::Breaker { breaker, to, at_us, .. } = &e.kind
                && let Some((_, life)) = lives.last_mut()
            {
                life.entry(ctx.scopes.breaker(e, breaker))
                    .or_insert_with(Vec::new)
                    .push((*at_us, *to));
            }
            if let Some(Change::Forgotten) = breakers.observe(e) {
                lives.push((i, BTreeMap::new()));
            }
        }
        for (_, life) in &mut lives {
            for list in life.values_mut() {
                list.sort_by_key(|(stamp, _)| *stamp);
            }
        }
        Transitions { lives }
    }

    /// The state of `scope` at `stamp`, in the life trace event `index` is
    /// in: after every transition stamped before it (`strictly`), or at or
    /// before it (a probe's own transition shares its stamp).
    fn state_at(&self, scope: &str, index: usize, stamp: u64, strictly: bool) -> CircuitState {
        let life = self
            .lives
            .iter()
            .rev()
            .find(|(begins, _)| *begins <= index)
            .and_then(|(_, life)| life.get(scope));
        let Some(list) = life else {
            return CircuitState::Closed;
        };
        let before = list.partition_point(|(t, _)| if strictly { *t < stamp } else { *t <= stamp });
        before.checked_sub(1).map_or(CircuitState::Closed, |last| list[last].1)
    }
}

/// Invariant 17: with escalation, the `n`-th opening of a circuit in a row
/// lets no probe through before its period, `min(recovery_timeout ×
/// 2^(n−1), max_recovery_timeout)`. Openings are counted from the trace: an
/// opening from closed is the first, one from half-open (a failed probe)
/// the one after the last seen (at least the second), and a close or a
/// restarted shared cache starts again; a transition from another state
/// than the one traced (the trace lost one) leaves the count unknown, and
/// unjudged, until the circuit next opens from closed. Judged on the deciding clock's
/// stamps where one clock decides (exact: the store compares the same
/// stamps); otherwise in simulated time, loosened by the fleet's clock
/// spread and a network round trip.
pub(super) fn escalation(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    if ctx.longest_open_us <= ctx.recovery_us {
        return not_applicable("no escalation: max_recovery_timeout_s is unset or not above recovery_timeout_s");
    }
    let slack = if ctx.single_clock {
        0
    } else {
        // The fleet's clock spread, and a round trip at the longest latency
        // the scenario sets (a latency fault may raise it far above the
        // network's): an opening is traced when its reply is back.
        let spread = clock_spread(ctx.scenario, Duration::MAX, Duration::MAX);
        let s = ctx.scenario;
        let trip_us = 2u64
            .saturating_mul(s.longest_latency_ms().saturating_add(s.tick_ms))
            .saturating_mul(1000);
        u64::try_from(spread.as_micros())
            .unwrap_or(u64::MAX)
            .saturating_add(trip_us)
    };
    let period_us = |n: u32| {
        let doublings = n.saturating_sub(1).min(64);
        let escalated = u128::from(ctx.recovery_us) << doublings;
        u64::try_from(escalated.min(u128::from(ctx.longest_open_us))).unwrap_or(u64::MAX)
    };
    let mut breakers = Breakers::new(ctx.scopes);
    // Per scope: the opening in force (its stamp and number in a row), and
    // the number of the last opening since the circuit last closed.
    let mut open: BTreeMap<String, (u64, u32)> = BTreeMap::new();
    let mut streak: BTreeMap<String, u32> = BTreeMap::new();
    // Scopes whose count the trace lost.
    let mut unknown: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let (mut reopenings, mut most, mut verdict) = (0u32, 0u32, Verdict::Held);
    for e in events {
        let stamp = match e.kind {
            Kind::Breaker { at_us, .. } => ctx.instant(e, at_us),
            _ => e.t_us,
        };
        // A transition from another state than the one traced means the
        // trace lost some (a reply lost to a partition): the count is
        // unknown until the circuit next opens from closed.
        if let Kind::Breaker { breaker, from, .. } = &e.kind {
            let scope = ctx.scopes.breaker(e, breaker);
            if breakers.state(&scope) != *from {
                streak.remove(&scope);
                open.remove(&scope);
                unknown.insert(scope);
            }
        }
        match breakers.observe(e) {
            Some(Change::Moved {
                scope,
                from,
                to: CircuitState::Open,
            }) => {
                let n = match from {
                    CircuitState::HalfOpen if unknown.contains(&scope) => continue,
                    CircuitState::HalfOpen => streak.get(&scope).map_or(2, |n| n.saturating_add(1)),
                    _ => 1,
                };
                unknown.remove(&scope);
                if n > 1 {
                    reopenings += 1;
                }
                most = most.max(n);
                streak.insert(scope.clone(), n);
                open.insert(scope, (stamp, n));
            }
            Some(Change::Moved {
                scope,
                from: CircuitState::Open,
                to: CircuitState::HalfOpen,
            }) => {
                if let Some((opened, n)) = open.remove(&scope) {
                    let period = period_us(n);
                    let held = stamp.saturating_sub(opened);
                    if held.saturating_add(slack) < period && verdict == Verdict::Held {
                        verdict = violated(
                            e,
                            format!(
                                "opening {n} in a row let a probe through after {} ms; it lasts {} ms",
                                held / 1000,
                                period / 1000
                            ),
                        );
                    }
                }
            }
            Some(Change::Moved {
                scope,
                to: CircuitState::Closed,
                ..
            }) => {
                streak.remove(&scope);
                open.remove(&scope);
            }
            Some(Change::Forgotten) => {
                streak.clear();
                open.clear();
                unknown.clear();
            }
            Some(Change::Moved { .. }) | None => {}
        }
    }
    if reopenings == 0 {
        return not_applicable("no circuit re-opened on a failed probe");
    }
    (
        verdict,
        format!(
            "{reopenings} re-openings on a failed probe; up to {most} openings in a row, the last lasting {} s",
            period_us(most) as f64 / 1e6
        ),
    )
}

/// Invariant 10: nothing wedges a circuit. No refusal says to wait longer
/// than the state allows: an open circuit at most its longest open period
/// (the recovery timeout, or with escalation `max_recovery_timeout_s`), a
/// half-open one at most one probe lease (`probe_lease_s`, by default the
/// recovery timeout) — a probe that never reports stops counting when its
/// lease ends, so the next caller probes. Both are measured on the clock
/// that stamped the opening or the lease, so the bound grows by what can
/// stand between that clock and the refusing one: the fleet's clock spread
/// under a caller-stamped shared cache, and every step back of a clock.
pub(super) fn no_wedged_circuit(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let s = ctx.scenario;
    let spread_us = if ctx.scopes.shared() && s.cache.time_source == TimeSource::Caller {
        let spread = clock_spread(s, Duration::MAX, Duration::MAX);
        u64::try_from(spread.as_micros()).unwrap_or(u64::MAX)
    } else {
        0
    };
    let back_us: u64 = s
        .faults
        .iter()
        .filter_map(|f| match f {
            Fault::ClockStep { by_ms, .. } if *by_ms < 0 => Some(by_ms.unsigned_abs().saturating_mul(1000)),
            _ => None,
        })
        .fold(0, u64::saturating_add);
    let extra = spread_us.saturating_add(back_us);
    let open_bound = ctx.longest_open_us.saturating_add(extra);
    let half_open_bound = ctx.lease_us.saturating_add(extra);
    let (mut refusals, mut longest, mut verdict) = (0u64, 0u64, Verdict::Held);
    for e in events {
        if let Kind::Rejected {
            state, retry_after_us, ..
        } = &e.kind
        {
            refusals += 1;
            longest = longest.max(*retry_after_us);
            let (bound, what) = match state {
                CircuitState::HalfOpen => (half_open_bound, "a half-open refusal waits for a probe lease"),
                _ => (open_bound, "an open refusal waits for its open period"),
            };
            if *retry_after_us > bound && verdict == Verdict::Held {
                verdict = violated(
                    e,
                    format!(
                        "refused {state:?} for {} ms; {what} of at most {} ms",
                        retry_after_us / 1000,
                        bound / 1000
                    ),
                );
            }
        }
    }
    if refusals == 0 {
        return not_applicable("the breaker refused nothing");
    }
    (
        verdict,
        format!(
            "{refusals} refusals; longest wait given: {} ms (at most {} ms open, {} ms half-open)",
            longest / 1000,
            open_bound / 1000,
            half_open_bound / 1000
        ),
    )
}

/// Invariant 11: a circuit opens only on `failure_threshold` failures counted
/// since it last closed or a success cleared the count. Checked per breaker
/// scope where one clock decides. A per-worker breaker's events reach the
/// trace in the order it decided, so they are counted in trace order. On a
/// shared cache stamping with its own time an opening on too few must be
/// one in trace order and in stamp order (a store's answer reaches the
/// trace a network trip late; a clock stepped back misorders stamps), and a
/// failure report whose step timed out counts as a failure the store may
/// have recorded. A restarted shared cache forgets every count, so each of
/// its lives is checked on its own.
pub(super) fn opens_at_threshold(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    if !ctx.single_clock {
        return not_applicable("a caller-stamped shared cache orders reports by several clocks");
    }
    let threshold = ctx.scenario.hardening.failure_threshold;
    let shared = ctx.scopes.shared();
    let mut breakers = Breakers::new(ctx.scopes);
    // Per life of the store: scope → (stamp, step, event index). Ties of
    // stamps are taken as reset, then failures, then the opening.
    let mut lives: Vec<PerScope<(u64, Step, usize)>> = Vec::new();
    let mut life: PerScope<(u64, Step, usize)> = BTreeMap::new();
    // Failure reports whose step timed out on a shared cache: the store may
    // have counted them, though the trace has no failure event for them.
    let mut unsure: Vec<usize> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        match &e.kind {
            Kind::CacheUnavailable {
                operation: "record_failure",
                ..
            } => unsure.push(i),
            Kind::FailureRecorded { breaker, at_us } => {
                life.entry(ctx.scopes.breaker(e, breaker))
                    .or_default()
                    .push((*at_us, Step::Failure, i));
            }
            Kind::FailuresCleared { breaker, at_us } => {
                life.entry(ctx.scopes.breaker(e, breaker))
                    .or_default()
                    .push((*at_us, Step::Reset, i));
            }
            Kind::Breaker {
                breaker,
                from,
                to,
                at_us,
                ..
            } => {
                let step = match (from, to) {
                    (_, CircuitState::Closed) => Some(Step::Reset),
                    (CircuitState::Closed, CircuitState::Open) => Some(Step::Open),
                    _ => None,
                };
                if let Some(step) = step {
                    life.entry(ctx.scopes.breaker(e, breaker))
                        .or_default()
                        .push((*at_us, step, i));
                }
            }
            _ => {}
        }
        if let Some(Change::Forgotten) = breakers.observe(e) {
            lives.push(std::mem::take(&mut life));
        }
    }
    lives.push(life);
    let (mut openings, mut fewest, mut verdict) = (0u64, u32::MAX, Verdict::Held);
    for list in lives.iter_mut().flat_map(|life| life.values_mut()) {
        // The count at each opening in trace order — exact for an
        // in-process breaker, whose events reach the trace in the order it
        // decided — and, on a shared cache, in stamp order too.
        let by_trace = counts_at_openings(list.iter());
        list.sort();
        let by_stamp = counts_at_openings(list.iter());
        for (i, (in_trace, since)) in by_trace {
            let mut count = in_trace;
            if shared {
                let stamped = by_stamp.get(&i).map_or(0, |(n, _)| *n);
                let timed_out = unsure.iter().filter(|u| (since..i).contains(u)).count();
                count = count
                    .max(stamped)
                    .saturating_add(u32::try_from(timed_out).unwrap_or(u32::MAX));
            }
            openings += 1;
            fewest = fewest.min(count);
            if count < threshold && verdict == Verdict::Held {
                verdict = violated(
                    &events[i],
                    format!(
                        "opened on {count} failures since the count was last cleared (failure_threshold {threshold})"
                    ),
                );
            }
        }
    }
    if openings == 0 {
        return not_applicable("the circuit never opened");
    }
    (
        verdict,
        format!("openings: {openings}; fewest failures counted at an opening: {fewest} (threshold {threshold})"),
    )
}

/// Walks one breaker's steps in the order given and returns, for each
/// opening (by its trace index), the failures counted since the last reset
/// and the trace index of that reset (0 if none).
fn counts_at_openings<'a>(steps: impl Iterator<Item = &'a (u64, Step, usize)>) -> BTreeMap<usize, (u32, usize)> {
    let mut out = BTreeMap::new();
    let (mut count, mut since) = (0u32, 0usize);
    for &(_, step, i) in steps {
        match step {
            Step::Reset => (count, since) = (0, i),
            Step::Failure => count = count.saturating_add(1),
            Step::Open => {
                out.insert(i, (count, since));
                (count, since) = (0, i);
            }
        }
    }
    out
}

/// What a report or a transition did to a breaker's failure count, in the
/// order a tie of stamps is taken in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    /// The count was cleared (a success) or the circuit closed.
    Reset,
    /// A failure was counted.
    Failure,
    /// The closed circuit opened.
    Open,
}

#[cfg(test)]
mod tests {
    use super::super::Ctx;
    use super::*;
    use crate::scenario::Scenario;

    const SCENARIO: &str = r#"
name = "breaker"
duration_s = 100
[hardening]
failure_threshold = 3
recovery_timeout_s = 5
half_open_max_calls = 1
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 1 }]
"#;

    fn scenario(extra: &str) -> Scenario {
        Scenario::parse("breaker.toml", &format!("{SCENARIO}{extra}")).unwrap()
    }

    /// An event on host `w` at `t_ms`.
    fn at(t_ms: u64, kind: Kind) -> TraceEvent {
        super::super::event(t_ms * 1000, "w", None, kind)
    }

    fn moved(t_ms: u64, from: CircuitState, to: CircuitState) -> TraceEvent {
        at(
            t_ms,
            Kind::Breaker {
                breaker: "b".into(),
                from,
                to,
                at_us: t_ms * 1000,
            },
        )
    }

    fn failure(t_ms: u64) -> TraceEvent {
        at(
            t_ms,
            Kind::FailureRecorded {
                breaker: "b".into(),
                at_us: t_ms * 1000,
            },
        )
    }

    fn cleared(t_ms: u64) -> TraceEvent {
        at(
            t_ms,
            Kind::FailuresCleared {
                breaker: "b".into(),
                at_us: t_ms * 1000,
            },
        )
    }

    fn refused(t_ms: u64, state: CircuitState, wait_ms: u64) -> TraceEvent {
        at(
            t_ms,
            Kind::Rejected {
                breaker: "b".into(),
                state,
                retry_after_us: wait_ms * 1000,
            },
        )
    }

    fn probe(t_ms: u64, seq: u32) -> TraceEvent {
        at(
            t_ms,
            Kind::Allowed {
                breaker: "b".into(),
                state: CircuitState::HalfOpen,
                probe: Some(seq),
                at_us: t_ms * 1000,
            },
        )
    }

    use CircuitState::{Closed, HalfOpen, Open};

    #[test]
    fn refusals_within_the_recovery_timeout_hold_and_a_longer_one_is_a_wedge() {
        let s = scenario("");
        let fine = [refused(1, Open, 5000), refused(2, HalfOpen, 4999)];
        assert_eq!(no_wedged_circuit(&Ctx::new(&s), &fine).0, Verdict::Held);
        let wedged = [refused(1, Open, 5000), refused(9, HalfOpen, 9_000_000)];
        let (verdict, _) = no_wedged_circuit(&Ctx::new(&s), &wedged);
        assert!(
            matches!(&verdict, Verdict::Violated { t_us: 9000, detail, .. } if detail.contains("probe lease")),
            "{verdict:?}"
        );
    }

    /// Recovery 5 s escalating to at most 15 s: openings of 5, 10, 15, 15 s.
    fn escalating() -> Scenario {
        let text = SCENARIO.replace(
            "recovery_timeout_s = 5",
            "recovery_timeout_s = 5\nmax_recovery_timeout_s = 15",
        );
        Scenario::parse("escalation.toml", &text).unwrap()
    }

    /// A circuit that opens at 0 and re-opens on a failed probe after each
    /// of `periods` (ms), each probe going half-open at the period's end.
    fn reopenings(periods: &[u64]) -> Vec<TraceEvent> {
        let mut events = vec![moved(0, Closed, Open)];
        let mut t = 0;
        for p in periods {
            t += p;
            events.push(moved(t, Open, HalfOpen));
            events.push(moved(t, HalfOpen, Open));
        }
        events
    }

    #[test]
    fn escalated_openings_that_last_their_periods_hold_and_a_short_one_is_caught() {
        let s = escalating();
        let ctx = Ctx::new(&s);
        let (verdict, figure) = escalation(&ctx, &reopenings(&[5000, 10_000, 15_000, 15_000]));
        assert_eq!(verdict, Verdict::Held, "{figure}");
        assert!(
            figure.contains("4 re-openings") && figure.contains("5 openings in a row"),
            "{figure}"
        );
        // The second opening let a probe through after 5 s, as a breaker that
        // forgets its escalation would.
        let (verdict, _) = escalation(&ctx, &reopenings(&[5000, 5000]));
        assert!(
            matches!(&verdict, Verdict::Violated { t_us: 10_000_000, detail, .. }
                if detail.contains("opening 2 in a row") && detail.contains("lasts 10000 ms")),
            "{verdict:?}"
        );
    }

    #[test]
    fn a_close_starts_the_escalation_again_and_without_escalation_it_does_not_apply() {
        let s = escalating();
        let ctx = Ctx::new(&s);
        let mut events = reopenings(&[5000]);
        // The second opening (10 s) ends with a probe that succeeds.
        events.push(moved(15_000, Open, HalfOpen));
        events.push(moved(15_000, HalfOpen, Closed));
        // A first opening again: 5 s is its whole period.
        events.push(moved(20_000, Closed, Open));
        events.push(moved(25_000, Open, HalfOpen));
        assert_eq!(escalation(&ctx, &events).0, Verdict::Held);
        let plain = scenario("");
        assert!(matches!(
            escalation(&Ctx::new(&plain), &reopenings(&[5000, 5000])).0,
            Verdict::NotApplicable { .. }
        ));
        assert!(matches!(
            escalation(&ctx, &[moved(0, Closed, Open), moved(5000, Open, HalfOpen)]).0,
            Verdict::NotApplicable { .. }
        ));
    }

    #[test]
    fn a_count_the_trace_lost_is_not_judged() {
        let s = escalating();
        // The close at 15 s and the first opening after it, at 16 s, never
        // reached the trace (their replies were lost); the store's next
        // re-opening, at 21 s, is its second (10 s), not the third (15 s).
        let events = [
            moved(0, Closed, Open),
            moved(5000, Open, HalfOpen),
            moved(5000, HalfOpen, Open),
            moved(15_000, Open, HalfOpen),
            moved(21_000, Open, HalfOpen),
            moved(21_000, HalfOpen, Open),
            moved(31_000, Open, HalfOpen),
        ];
        assert_eq!(escalation(&Ctx::new(&s), &events).0, Verdict::Held);
    }

    #[test]
    fn an_escalated_open_refusal_is_bounded_by_the_cap_not_the_recovery_timeout() {
        let s = escalating();
        let fine = [refused(1, Open, 15_000)];
        assert_eq!(no_wedged_circuit(&Ctx::new(&s), &fine).0, Verdict::Held);
        let too_long = [refused(1, Open, 15_001)];
        assert!(matches!(
            no_wedged_circuit(&Ctx::new(&s), &too_long).0,
            Verdict::Violated { .. }
        ));
    }

    #[test]
    fn a_half_open_refusal_is_bounded_by_the_probe_lease_an_open_one_by_the_recovery_timeout() {
        let text = SCENARIO.replace("half_open_max_calls = 1", "half_open_max_calls = 1\nprobe_lease_s = 20");
        let s = Scenario::parse("lease.toml", &text).unwrap();
        let events = [refused(1, Open, 5000), refused(2, HalfOpen, 19_000)];
        assert_eq!(no_wedged_circuit(&Ctx::new(&s), &events).0, Verdict::Held);
        let open_too_long = [refused(1, Open, 6000)];
        assert!(matches!(
            no_wedged_circuit(&Ctx::new(&s), &open_too_long).0,
            Verdict::Violated { .. }
        ));
    }

    #[test]
    fn a_clock_step_back_widens_the_wedge_bound_by_the_step() {
        let s = scenario("[[faults]]\nkind = \"clock_step\"\nat_s = 10\nhost = \"w\"\nby_ms = -2000\n");
        let stepped = [refused(11_000, HalfOpen, 6_900)];
        assert_eq!(no_wedged_circuit(&Ctx::new(&s), &stepped).0, Verdict::Held);
        let beyond = [refused(11_000, HalfOpen, 7_001)];
        assert!(matches!(
            no_wedged_circuit(&Ctx::new(&s), &beyond).0,
            Verdict::Violated { .. }
        ));
    }

    #[test]
    fn an_opening_needs_threshold_failures_since_the_last_clear() {
        let s = scenario("");
        let honest = [
            failure(1),
            cleared(2),
            failure(3),
            failure(4),
            failure(5),
            moved(5, Closed, Open),
        ];
        let (verdict, figure) = opens_at_threshold(&Ctx::new(&s), &honest);
        assert_eq!(verdict, Verdict::Held, "{figure}");
        assert!(figure.contains("fewest failures counted at an opening: 3"), "{figure}");
        let kept = [failure(1), failure(2), cleared(3), failure(4), moved(4, Closed, Open)];
        let (verdict, _) = opens_at_threshold(&Ctx::new(&s), &kept);
        assert!(
            matches!(&verdict, Verdict::Violated { t_us: 4000, detail, .. } if detail.contains("opened on 1 failures")),
            "{verdict:?}"
        );
    }

    const SHARED: &str = "[cache]\nkind = \"shared\"\n";

    #[test]
    fn reports_are_ordered_by_their_stamps_not_their_arrival() {
        let s = scenario(SHARED);
        // The clear was decided at 2 ms but reached the trace after the
        // failures decided at 3–5 ms: by stamp, three failures follow it.
        let mut late_clear = cleared(2);
        late_clear.t_us = 6000;
        let events = [failure(3), failure(4), failure(5), late_clear, moved(5, Closed, Open)];
        assert_eq!(opens_at_threshold(&Ctx::new(&s), &events).0, Verdict::Held);
        // The clock stepped back before the third failure: by stamp it
        // sorts first, but in trace order three failures precede the opening.
        let stepped = [failure(10), failure(11), failure(9), moved(9, Closed, Open)];
        assert_eq!(opens_at_threshold(&Ctx::new(&s), &stepped).0, Verdict::Held);
        // A failure report that timed out may have been counted by the store.
        let unsure = at(
            12,
            Kind::CacheUnavailable {
                operation: "record_failure",
                fallback: "not recorded",
                admitted_call: false,
            },
        );
        let events = [failure(10), unsure, failure(13), moved(13, Closed, Open)];
        assert_eq!(opens_at_threshold(&Ctx::new(&s), &events).0, Verdict::Held);
        let events = [failure(10), failure(13), moved(13, Closed, Open)];
        assert!(matches!(
            opens_at_threshold(&Ctx::new(&s), &events).0,
            Verdict::Violated { .. }
        ));
    }

    #[test]
    fn a_per_worker_breaker_is_counted_in_the_order_it_decided() {
        let s = scenario("");
        // In-process: the trace is the decision order, whatever the stamps.
        let stepped = [failure(10), failure(11), failure(9), moved(9, Closed, Open)];
        assert_eq!(opens_at_threshold(&Ctx::new(&s), &stepped).0, Verdict::Held);
        let late_clear = [failure(3), failure(4), failure(5), cleared(2), moved(5, Closed, Open)];
        assert!(matches!(
            opens_at_threshold(&Ctx::new(&s), &late_clear).0,
            Verdict::Violated { .. }
        ));
    }

    #[test]
    fn a_second_breaker_beginning_the_same_episode_adds_a_probe_to_it() {
        let s = scenario("");
        let events = [
            moved(1, Closed, Open),
            moved(6000, Open, HalfOpen),
            probe(6000, 1),
            // Decided on a stale read: it too says it began the episode.
            moved(6001, Open, HalfOpen),
            probe(6001, 1),
        ];
        let (verdict, figure) = half_open_probes(&Ctx::new(&s), &events);
        assert!(
            matches!(&verdict, Verdict::Violated { detail, .. } if detail.contains("2 live probes")),
            "{verdict:?} {figure}"
        );
    }

    #[test]
    fn a_stamped_admission_is_judged_by_the_state_at_its_stamp() {
        let s = scenario(SHARED);
        // Admitted closed at 10 ms; the opening was stamped at 12 ms but
        // reached the trace first.
        let mut admitted = at(
            10,
            Kind::Allowed {
                breaker: "b".into(),
                state: Closed,
                probe: None,
                at_us: 10_000,
            },
        );
        admitted.t_us = 15_000;
        let events = [moved(12, Closed, Open), admitted.clone()];
        assert_eq!(no_call_while_open(&Ctx::new(&s), &events).0, Verdict::Held);
        // Stamped after the opening: admitted while open.
        admitted.kind = Kind::Allowed {
            breaker: "b".into(),
            state: Closed,
            probe: None,
            at_us: 13_000,
        };
        let events = [moved(12, Closed, Open), admitted.clone()];
        assert!(matches!(
            no_call_while_open(&Ctx::new(&s), &events).0,
            Verdict::Violated { .. }
        ));
        // In the trace before the opening, though its stamp is later (a
        // clock stepped back between them): not stale.
        let events = [admitted.clone(), moved(12, Closed, Open)];
        assert_eq!(no_call_while_open(&Ctx::new(&s), &events).0, Verdict::Held);
        // A per-worker breaker's trace is its decision order: an admission
        // after the opening is stale, whatever its stamp says.
        let per_worker = scenario("");
        let events = [moved(12, Closed, Open), admitted];
        assert!(matches!(
            no_call_while_open(&Ctx::new(&per_worker), &events).0,
            Verdict::Violated { .. }
        ));
    }
}
