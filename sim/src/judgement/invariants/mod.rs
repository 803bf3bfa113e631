//! The invariant checkers: each reads the finished trace and returns a verdict.
//!
//! Checkers are kept apart from the fault injectors: they know nothing about
//! how the world was driven, only what the trace says happened. Each returns
//! held, violated (with the first violating event), or not applicable (with
//! why), plus a figure worth reporting either way. A scenario may declare that
//! it expects an invariant to be violated (a caller-stamped fleet under clock
//! skew overshoots `rpm`); the violation is then reported as a measurement,
//! not a failure.
//!
//! Scope: with per-worker caches every worker has its own limiter and breaker,
//! so the checks run per worker; with a shared cache they run fleet-wide.

use std::collections::BTreeMap;

use redstring::CircuitState;
use serde::Serialize;

use crate::scenario::{CacheKind, Fault, Scenario, ServerSpec};
use crate::evidence::trace::{Kind, TraceEvent};

/// One invariant's outcome.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// It held over the whole run.
    Held,
    /// It did not; the first violation.
    Violated {
        /// Simulated time of the violating event, microseconds.
        t_us: u64,
        /// The host that recorded it.
        host: String,
        /// What was wrong.
        detail: String,
    },
    /// The run gives it nothing to check.
    NotApplicable {
        /// Why.
        why: String,
    },
}

/// An invariant's verdict, with what the scenario expected and a figure.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Check {
    /// The invariant's name (see [`crate::scenario::INVARIANTS`]).
    pub name: &'static str,
    /// The verdict.
    #[serde(flatten)]
    pub verdict: Verdict,
    /// The scenario declared it may be violated.
    pub may_violate: bool,
    /// A measurement that goes with it (the excess, the worst case seen).
    pub figure: String,
}

impl Check {
    /// Whether this check fails the run: violated and not expected to be.
    pub fn failed(&self) -> bool {
        matches!(self.verdict, Verdict::Violated { .. }) && !self.may_violate
    }
}

/// Runs every checker over `events`.
pub fn check_all(scenario: &Scenario, events: &[TraceEvent]) -> Vec<Check> {
    let ctx = Ctx::new(scenario);
    let results = [
        ("rpm_per_window", rpm_per_window(&ctx, events)),
        ("retry_after_monotone", retry_after_monotone(&ctx, events)),
        ("half_open_probes", half_open_probes(&ctx, events)),
        ("sparse_failures", sparse_failures(&ctx, events)),
        ("no_call_while_open", no_call_while_open(&ctx, events)),
        ("liveness", liveness(&ctx, events)),
        ("accounting", accounting(&ctx, events)),
    ];
    results
        .into_iter()
        .map(|(name, (verdict, figure))| Check {
            name,
            verdict,
            may_violate: scenario.expect.may_violate.contains(name),
            figure,
        })
        .collect()
}

struct Ctx<'a> {
    scenario: &'a Scenario,
    shared: bool,
    /// One clock stamps everything a scope decides (per-worker, or a shared
    /// cache stamping with its own time).
    single_clock: bool,
    window_us: u64,
    recovery_us: u64,
    /// The longest a request and its reply can spend on the network.
    round_trip_us: u64,
}

impl<'a> Ctx<'a> {
    fn new(scenario: &'a Scenario) -> Self {
        let shared = scenario.cache.kind == CacheKind::Shared;
        Ctx {
            scenario,
            shared,
            single_clock: !shared || scenario.cache.time_source == redstring::TimeSource::Store,
            window_us: secs_us(scenario.hardening.window_s),
            recovery_us: secs_us(scenario.hardening.recovery_timeout_s),
            round_trip_us: 2 * (scenario.network.max_latency_ms + scenario.tick_ms) * 1000,
        }
    }

    /// The limiter scope an event belongs to: the worker, or the fleet.
    fn scope<'e>(&self, e: &'e TraceEvent) -> &'e str {
        if self.shared { "fleet" } else { &e.host }
    }

    /// The breaker an event belongs to: one per model server, per worker or
    /// fleet-wide.
    fn breaker(&self, e: &TraceEvent, prefix: &str) -> String {
        if self.shared {
            prefix.to_owned()
        } else {
            format!("{}/{prefix}", e.host)
        }
    }

    /// The instant the checks compare: the deciding clock's stamp when one
    /// clock decides everything in a scope, otherwise true simulated time.
    fn instant(&self, e: &TraceEvent, stamp_us: u64) -> u64 {
        if self.single_clock { stamp_us } else { e.t_us }
    }
}

/// The driver's description of the cache host restarting (see `world::apply`).
const CACHE_UP: &str = "cache host up";

fn secs_us(s: f64) -> u64 {
    (s * 1e6).round().max(0.0) as u64
}

fn not_applicable(why: impl Into<String>) -> (Verdict, String) {
    (Verdict::NotApplicable { why: why.into() }, String::new())
}

fn violated(e: &TraceEvent, detail: String) -> Verdict {
    Verdict::Violated {
        t_us: e.t_us,
        host: e.host.clone(),
        detail,
    }
}

/// Invariant 1: never more than `rpm` admissions of one tenant in any window.
fn rpm_per_window(ctx: &Ctx, events: &[TraceEvent]) -> (Verdict, String) {
    let mut series: BTreeMap<(&str, &str), Vec<(u64, &TraceEvent)>> = BTreeMap::new();
    let mut true_time: BTreeMap<(&str, &str), Vec<u64>> = BTreeMap::new();
    for e in events {
        if let Kind::Admitted { tenant, at_us, .. } = &e.kind {
            let key = (ctx.scope(e), tenant.as_str());
            series.entry(key).or_default().push((ctx.instant(e, *at_us), e));
            true_time.entry(key).or_default().push(e.t_us);
        }
    }
    if series.is_empty() {
        return not_applicable("no admissions");
    }
    let rpm = ctx.scenario.hardening.rpm as usize;
    // In true time an admission is seen up to one round trip after the cache
    // decided it, so true-time windows are narrowed by that much.
    let width = if ctx.single_clock {
        ctx.window_us
    } else {
        ctx.window_us.saturating_sub(ctx.round_trip_us)
    };
    let mut verdict = Verdict::Held;
    let mut worst = 0;
    // The most any one tenant got in a window, per tenant (across scopes).
    let mut per_tenant: BTreeMap<&str, usize> = BTreeMap::new();
    for ((_, tenant), list) in series.iter_mut() {
        list.sort_by_key(|(t, _)| *t);
        let (max, first_bad) = max_in_window(list.iter().map(|(t, _)| *t), width, rpm);
        worst = worst.max(max);
        let best = per_tenant.entry(tenant).or_default();
        *best = (*best).max(max);
        if let (Verdict::Held, Some(i)) = (&verdict, first_bad) {
            let e = list[i].1;
            verdict = violated(e, format!("{max} admissions in one window (rpm {rpm})"));
        }
    }
    let mut true_worst = 0;
    for list in true_time.values_mut() {
        list.sort_unstable();
        true_worst = true_worst.max(max_in_window(list.iter().copied(), width, rpm).0);
    }
    let tenants: Vec<String> = per_tenant
        .iter()
        .map(|(t, n)| format!("…{}: {n}", t.get(t.len().saturating_sub(4)..).unwrap_or(t)))
        .collect();
    let figure = format!(
        "max admitted per window: {worst} (rpm {rpm}); in true time: {true_worst}; per tenant: {}",
        tenants.join(", ")
    );
    (verdict, figure)
}

/// The most instants in any closed window `[t − width, t]`, and the index of
/// the first instant at which the count exceeded `limit`.
fn max_in_window(sorted: impl Iterator<Item = u64>, width: u64, limit: usize) -> (usize, Option<usize>) {
    let times: Vec<u64> = sorted.collect();
    let (mut start, mut max, mut first_bad) = (0, 0, None);
    for (end, t) in times.iter().enumerate() {
        while times[start] < t.saturating_sub(width) {
            start += 1;
        }
        let count = end - start + 1;
        max = max.max(count);
        if count > limit && first_bad.is_none() {
            first_bad = Some(end);
        }
    }
    (max, first_bad)
}

/// Invariant 2: successive refusals of one tenant never report a longer wait
/// while no hit is added.
fn retry_after_monotone(ctx: &Ctx, events: &[TraceEvent]) -> (Verdict, String) {
    // Each worker's refusals of a tenant, in its own order; between two of
    // them a hit may have been added anywhere in the limiter's scope (with a
    // shared cache, by another worker — seen in the trace up to a round trip
    // late), and then the wait may legitimately change.
    let mut admissions: BTreeMap<(&str, &str), Vec<u64>> = BTreeMap::new();
    for e in events {
        if let Kind::Admitted { tenant, .. } = &e.kind {
            admissions
                .entry((ctx.scope(e), tenant.as_str()))
                .or_default()
                .push(e.t_us);
        }
    }
    let mut last: BTreeMap<(&str, &str), (u64, u64)> = BTreeMap::new();
    let mut refusals = 0;
    let mut verdict = Verdict::Held;
    let mut worst_growth = 0u64;
    for e in events {
        let Kind::Limited {
            tenant, retry_after_us, ..
        } = &e.kind
        else {
            continue;
        };
        refusals += 1;
        let key = (e.host.as_str(), tenant.as_str());
        if let Some(&(t_prev, prev)) = last.get(&key) {
            let hit_between = admissions
                .get(&(ctx.scope(e), tenant.as_str()))
                .is_some_and(|ts| ts.iter().any(|t| *t + ctx.round_trip_us >= t_prev && *t <= e.t_us));
            if !hit_between && *retry_after_us > prev {
                worst_growth = worst_growth.max(retry_after_us - prev);
                if verdict == Verdict::Held {
                    verdict = violated(e, format!("wait grew from {prev} µs to {retry_after_us} µs"));
                }
            }
        }
        last.insert(key, (e.t_us, *retry_after_us));
    }
    if refusals == 0 {
        return not_applicable("no refusals");
    }
    (
        verdict,
        format!("{refusals} refusals; worst growth {} ms", worst_growth / 1000),
    )
}

/// Invariant 3: a half-open episode admits at most `half_open_max_calls` probes.
fn half_open_probes(ctx: &Ctx, events: &[TraceEvent]) -> (Verdict, String) {
    let max = ctx.scenario.hardening.half_open_max_calls;
    let mut open: BTreeMap<String, u32> = BTreeMap::new();
    let (mut episodes, mut most, mut verdict) = (0, 0, Verdict::Held);
    for e in events {
        match &e.kind {
            Kind::Breaker {
                breaker,
                to: CircuitState::HalfOpen,
                ..
            } => {
                episodes += 1;
                open.insert(ctx.breaker(e, breaker), 0);
            }
            Kind::Breaker {
                breaker,
                from: CircuitState::HalfOpen,
                ..
            } => {
                open.remove(&ctx.breaker(e, breaker));
            }
            Kind::Allowed {
                breaker,
                state: CircuitState::HalfOpen,
                ..
            } => {
                if let Some(n) = open.get_mut(&ctx.breaker(e, breaker)) {
                    *n += 1;
                    most = most.max(*n);
                    if *n > max && verdict == Verdict::Held {
                        verdict = violated(e, format!("probe {n} admitted (half_open_max_calls {max})"));
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
        format!("episodes: {episodes}; most probes in one: {most} (max {max})"),
    )
}

/// Invariant 4: failures spaced further apart than `recovery_timeout` never
/// open the circuit (threshold ≥ 2). Checked as the necessary condition: the
/// `failure_threshold` failures before an opening span at most one timeout.
fn sparse_failures(ctx: &Ctx, events: &[TraceEvent]) -> (Verdict, String) {
    let threshold = ctx.scenario.hardening.failure_threshold as usize;
    if threshold < 2 {
        return not_applicable("failure_threshold is 1");
    }
    // Tolerance for a shared cache's TTLs running on a drifting clock.
    let slack = ctx.scenario.tick_ms * 1000 + ctx.recovery_us / 1000;
    // Failures reported while the breaker is closed, since it last closed.
    let mut failures: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut state: BTreeMap<String, CircuitState> = BTreeMap::new();
    let (mut openings, mut widest, mut verdict) = (0, 0u64, Verdict::Held);
    for e in events {
        match &e.kind {
            Kind::FailureRecorded { breaker, at_us } => {
                let scope = ctx.breaker(e, breaker);
                if state.get(&scope).is_none_or(|s| *s == CircuitState::Closed) {
                    failures.entry(scope).or_default().push(ctx.instant(e, *at_us));
                }
            }
            Kind::SuccessRecorded { breaker } => {
                let scope = ctx.breaker(e, breaker);
                if state.get(&scope).is_none_or(|s| *s == CircuitState::Closed) {
                    failures.entry(scope).or_default().clear();
                }
            }
            Kind::Breaker {
                breaker,
                from,
                to,
                at_us,
            } => {
                let scope = ctx.breaker(e, breaker);
                state.insert(scope.clone(), *to);
                let list = failures.entry(scope).or_default();
                if (*from, *to) == (CircuitState::Closed, CircuitState::Open) {
                    openings += 1;
                    let now = ctx.instant(e, *at_us);
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
            _ => {}
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
/// to probe — per worker, or fleet-wide with a shared cache.
fn no_call_while_open(ctx: &Ctx, events: &[TraceEvent]) -> (Verdict, String) {
    let mut state: BTreeMap<String, CircuitState> = BTreeMap::new();
    let (mut admitted_while_impaired, mut verdict) = (0, Verdict::Held);
    let mut any_open = false;
    for e in events {
        match &e.kind {
            Kind::Breaker { breaker, to, .. } => {
                any_open |= *to == CircuitState::Open;
                state.insert(ctx.breaker(e, breaker), *to);
            }
            Kind::Allowed {
                breaker,
                state: decided,
                ..
            } => {
                let current = state
                    .get(&ctx.breaker(e, breaker))
                    .copied()
                    .unwrap_or(CircuitState::Closed);
                let stale = match decided {
                    CircuitState::Closed => current != CircuitState::Closed,
                    _ => current == CircuitState::Open,
                };
                if stale {
                    admitted_while_impaired += 1;
                    if verdict == Verdict::Held {
                        verdict = violated(e, format!("admitted as {decided:?} while the circuit was {current:?}"));
                    }
                }
            }
            _ => {}
        }
    }
    if !any_open {
        return not_applicable("the circuit never opened");
    }
    (verdict, format!("{admitted_while_impaired} admissions while open"))
}

/// When the last fault is over: the latest fault, with a restart's reload,
/// and a burst's backlog drained by the slowest server.
fn heal_time_us(s: &Scenario) -> Option<u64> {
    let workers = s.worker_names().len() as f64;
    let slowest = s
        .servers
        .iter()
        .map(ServerSpec::throughput)
        .fold(f64::INFINITY, f64::min);
    s.faults
        .iter()
        .map(|f| {
            let extra = match f {
                Fault::Restart { server, .. } => {
                    s.servers.iter().find(|x| &x.name == server).map_or(0.0, |x| x.reload_s)
                }
                Fault::Burst { calls, .. } => f64::from(*calls) * workers / slowest + s.hardening.request_timeout_s,
                _ => 0.0,
            };
            secs_us(f.at_s() + extra)
        })
        .max()
}

/// Invariant 6: once the last fault is over, every breaker closes again
/// within a bound, and calls succeed again.
fn liveness(ctx: &Ctx, events: &[TraceEvent]) -> (Verdict, String) {
    let s = ctx.scenario;
    let Some(heal) = heal_time_us(s) else {
        return not_applicable("no faults");
    };
    let h = &s.hardening;
    let policy_wait = h.retry_policy().map_or(0.0, |p| p.worst_case_wait().as_secs_f64());
    // Calls in flight at the heal may still fail and open a breaker up to one
    // call later; it then waits out recovery_timeout and probes with one call,
    // which the limiter may first hold for its waits.
    let one_call = f64::from(h.max_retries + 1) * h.request_timeout_s + policy_wait;
    let limited = events.iter().any(|e| matches!(e.kind, Kind::Limited { .. }));
    let limiter_wait = if limited {
        h.window_s * f64::from(h.limiter_waits)
    } else {
        0.0
    };
    // A breaker only moves when a call asks, so a lull in a worker's arrivals
    // after the heal delays its probe by as much.
    let mut last_arrival: BTreeMap<&str, u64> = BTreeMap::new();
    let mut lull = 0u64;
    for e in events
        .iter()
        .filter(|e| matches!(e.kind, Kind::Arrival { .. }) && e.t_us >= heal)
    {
        let prev = last_arrival.insert(e.host.as_str(), e.t_us).unwrap_or(heal);
        lull = lull.max(e.t_us - prev);
    }
    let bound = heal + lull + secs_us(2.0 * one_call + h.recovery_timeout_s + limiter_wait + 1.0);
    let end = secs_us(s.duration_s);
    if bound >= end {
        return not_applicable(format!(
            "the run ends before the liveness bound ({} s)",
            bound / 1_000_000
        ));
    }
    let mut state: BTreeMap<String, (CircuitState, u64)> = BTreeMap::new();
    let (mut ok_after, mut ended_after) = (0u64, 0u64);
    let mut open_after_bound: Option<&TraceEvent> = None;
    for e in events {
        match &e.kind {
            Kind::Breaker { breaker, to, .. } => {
                state.insert(ctx.breaker(e, breaker), (*to, e.t_us));
            }
            // A restarted cache host has forgotten every breaker: all closed.
            Kind::Fault { what } if ctx.shared && what == CACHE_UP => {
                for v in state.values_mut() {
                    *v = (CircuitState::Closed, e.t_us);
                }
            }
            // Deferrals by the limiter say nothing about the server's health.
            Kind::CallEnd { outcome, .. } if e.t_us >= bound && outcome != "rate_limited" => {
                ended_after += 1;
                if outcome == "ok" {
                    ok_after += 1;
                } else if outcome == "circuit_open" && open_after_bound.is_none() {
                    open_after_bound = Some(e);
                }
            }
            _ => {}
        }
    }
    let figure = format!(
        "bound {} s after the start; {ok_after} of {ended_after} calls not deferred by the limiter ok after it",
        bound / 1_000_000
    );
    for (scope, (st, since)) in &state {
        if *st != CircuitState::Closed {
            let detail = format!(
                "breaker of {scope} still {st:?} at the end (since {} s)",
                since / 1_000_000
            );
            return (
                Verdict::Violated {
                    t_us: *since,
                    host: scope.clone(),
                    detail,
                },
                figure,
            );
        }
        if *since > bound {
            let detail = format!("breaker of {scope} closed only at {} s", since / 1_000_000);
            return (
                Verdict::Violated {
                    t_us: *since,
                    host: scope.clone(),
                    detail,
                },
                figure,
            );
        }
    }
    if let Some(e) = open_after_bound {
        return (
            violated(e, "a call was refused as circuit_open after the bound".into()),
            figure,
        );
    }
    if ended_after > 0 && ok_after == 0 {
        return (
            Verdict::Violated {
                t_us: bound,
                host: "fleet".into(),
                detail: "no call succeeded after the bound".into(),
            },
            figure,
        );
    }
    (Verdict::Held, figure)
}

/// Invariant 7: every unit of work ends once as a success, a classified error
/// or a deferral; and requests ≤ (max_retries + 1) × admitted calls.
fn accounting(ctx: &Ctx, events: &[TraceEvent]) -> (Verdict, String) {
    let mut open: BTreeMap<(&str, u64), u64> = BTreeMap::new();
    let (mut arrivals, mut ended, mut requests, mut allowed) = (0u64, 0u64, 0u64, 0u64);
    let mut verdict = Verdict::Held;
    for e in events {
        match &e.kind {
            Kind::Arrival { call, .. } => {
                arrivals += 1;
                open.insert((e.host.as_str(), *call), e.t_us);
            }
            Kind::CallEnd { call, outcome, .. } => {
                ended += 1;
                if open.remove(&(e.host.as_str(), *call)).is_none() && verdict == Verdict::Held {
                    verdict = violated(e, format!("call {call} ended without arriving, or ended twice"));
                }
                if outcome.is_empty() && verdict == Verdict::Held {
                    verdict = violated(e, format!("call {call} ended unclassified"));
                }
            }
            Kind::Request { .. } => requests += 1,
            kind if kind.admits_call() => allowed += 1,
            _ => {}
        }
    }
    if arrivals == 0 {
        return not_applicable("no work arrived");
    }
    let per_call = u64::from(ctx.scenario.hardening.max_retries) + 1;
    if requests > per_call * allowed && verdict == Verdict::Held {
        verdict = Verdict::Violated {
            t_us: events.last().map_or(0, |e| e.t_us),
            host: "fleet".into(),
            detail: format!("{requests} requests for {allowed} admitted calls (at most {per_call} each)"),
        };
    }
    let in_flight = open.len();
    let amplification = if allowed == 0 {
        0.0
    } else {
        requests as f64 / allowed as f64
    };
    (
        verdict,
        format!(
            "{arrivals} arrived, {ended} ended, {in_flight} in flight at the end; {requests} requests for {allowed} admitted calls ({amplification:.2}×)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
name = "synthetic"
duration_s = 100
[hardening]
rpm = 2
window_s = 10
half_open_max_calls = 1
failure_threshold = 2
recovery_timeout_s = 5
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 1 }]
"#;

    fn scenario() -> Scenario {
        Scenario::parse("synthetic.toml", MINIMAL).unwrap()
    }

    fn ev(t_s: f64, kind: Kind) -> TraceEvent {
        TraceEvent {
            t_us: secs_us(t_s),
            host: "w".into(),
            kind,
        }
    }

    fn admitted(t_s: f64) -> TraceEvent {
        ev(
            t_s,
            Kind::Admitted {
                tenant: "t".into(),
                remaining: 0,
                at_us: secs_us(t_s),
            },
        )
    }

    fn breaker(t_s: f64, from: CircuitState, to: CircuitState) -> TraceEvent {
        ev(
            t_s,
            Kind::Breaker {
                breaker: "b".into(),
                from,
                to,
                at_us: secs_us(t_s),
            },
        )
    }

    fn verdict(name: &str, events: &[TraceEvent]) -> Verdict {
        check_all(&scenario(), events)
            .into_iter()
            .find(|c| c.name == name)
            .unwrap()
            .verdict
    }

    #[test]
    fn an_extra_admission_in_a_window_is_caught() {
        assert_eq!(
            verdict("rpm_per_window", &[admitted(0.0), admitted(5.0), admitted(11.0)]),
            Verdict::Held
        );
        let v = verdict("rpm_per_window", &[admitted(0.0), admitted(5.0), admitted(10.0)]);
        assert!(matches!(v, Verdict::Violated { t_us: 10_000_000, .. }), "{v:?}");
    }

    #[test]
    fn a_second_probe_in_one_episode_is_caught() {
        use CircuitState::*;
        let probe = |t| {
            ev(
                t,
                Kind::Allowed {
                    breaker: "b".into(),
                    state: HalfOpen,
                    at_us: secs_us(t),
                },
            )
        };
        let one = [breaker(1.0, Closed, Open), breaker(6.0, Open, HalfOpen), probe(6.0)];
        assert_eq!(verdict("half_open_probes", &one), Verdict::Held);
        let two = [
            breaker(1.0, Closed, Open),
            breaker(6.0, Open, HalfOpen),
            probe(6.0),
            probe(6.5),
        ];
        assert!(matches!(verdict("half_open_probes", &two), Verdict::Violated { .. }));
    }

    #[test]
    fn an_admission_while_open_is_caught() {
        use CircuitState::*;
        let allowed = ev(
            2.0,
            Kind::Allowed {
                breaker: "b".into(),
                state: Closed,
                at_us: secs_us(2.0),
            },
        );
        let v = verdict("no_call_while_open", &[breaker(1.0, Closed, Open), allowed]);
        assert!(matches!(v, Verdict::Violated { .. }), "{v:?}");
    }

    #[test]
    fn an_opening_on_sparse_failures_is_caught() {
        use CircuitState::*;
        let failure = |t| {
            ev(
                t,
                Kind::FailureRecorded {
                    breaker: "b".into(),
                    at_us: secs_us(t),
                },
            )
        };
        let dense = [failure(1.0), failure(3.0), breaker(3.0, Closed, Open)];
        assert_eq!(verdict("sparse_failures", &dense), Verdict::Held);
        let sparse = [failure(1.0), failure(9.0), breaker(9.0, Closed, Open)];
        assert!(matches!(verdict("sparse_failures", &sparse), Verdict::Violated { .. }));
    }

    #[test]
    fn work_that_ends_twice_or_unannounced_is_caught() {
        let end = |call| {
            ev(
                3.0,
                Kind::CallEnd {
                    call,
                    tenant: 1,
                    outcome: "ok".into(),
                    attempts: 1,
                    latency_ms: 1,
                },
            )
        };
        let arrive = ev(1.0, Kind::Arrival { call: 0, tenant: 1 });
        assert_eq!(verdict("accounting", &[arrive.clone(), end(0)]), Verdict::Held);
        assert!(matches!(
            verdict("accounting", &[arrive, end(0), end(0)]),
            Verdict::Violated { .. }
        ));
    }

    #[test]
    fn a_declared_violation_does_not_fail_the_run() {
        let mut s = scenario();
        s.expect.may_violate.insert("rpm_per_window".into());
        let checks = check_all(&s, &[admitted(0.0), admitted(1.0), admitted(2.0)]);
        let rpm = checks.iter().find(|c| c.name == "rpm_per_window").unwrap();
        assert!(matches!(rpm.verdict, Verdict::Violated { .. }));
        assert!(!rpm.failed());
    }

    #[test]
    fn window_counting_is_inclusive_and_finds_the_first_excess() {
        assert_eq!(max_in_window([0, 10, 20].into_iter(), 20, 3), (3, None));
        assert_eq!(max_in_window([0, 10, 20, 20].into_iter(), 20, 3), (4, Some(3)));
        assert_eq!(max_in_window([0, 21, 42].into_iter(), 20, 1), (1, None));
    }
}
