//! Figures a user's objectives are judged by, computed from the trace alone.
//!
//! The invariants say whether the library kept its promises; these figures
//! say how the configuration served its callers: how slow calls were, how
//! many failed, how much load reached impaired servers, how much the retries
//! multiplied it, and how long goodput took to come back after the last
//! fault. Each is a pure function over the trace (and the scenario where it
//! needs the fault schedule), so each can be checked on a hand-made trace.
//!
//! Definitions used throughout:
//!
//! - A call is *deferred* when a limit of the caller's own put it off —
//!   requests per window (`rate_limited`), tokens per window
//!   (`token_limited`) or a deployment's limit (`deployment_limited`),
//!   counted alike: it was never offered to a server. Deferred calls are
//!   left out of latencies, the failed fraction and the offered load. A
//!   call refused by the breaker or by a quota cooldown is judged (it
//!   failed).
//! - A call is *judged* when it ended and was not deferred.
//! - Calls still in flight at the end of the run have no latency and no
//!   outcome; they are left out of latencies and the failed fraction (the
//!   report counts them as `in_flight`), but count as offered and not ok in
//!   goodput recovery, where they arrived after the heal.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::evidence::episodes::episodes;
use crate::evidence::outcome::CallOutcome;
use crate::evidence::trace::{CallEnded, Kind, TraceEvent};
use crate::judgement::episode_figures::{EpisodeFigures, episode_figures};
use crate::judgement::invariants::{Heal, heal};
use crate::scenario::Scenario;

/// The sliding window goodput recovery is measured over, in seconds.
pub const RECOVERY_WINDOW_S: u64 = 5;

/// The share of offered calls that must succeed in a window for goodput to
/// count as recovered, in percent.
pub const RECOVERY_PERCENT: u64 = 95;

/// How goodput came back after the last fault.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Recovery {
    /// The scenario has no fault, so nothing to recover from.
    NoFault,
    /// The run ended less than one window after the faults were over.
    TooLate,
    /// Goodput came back this many whole seconds after the heal.
    Recovered {
        /// Seconds from the heal to the start of the first good window.
        s: f64,
    },
    /// No window after the heal reached the threshold.
    NotRecovered,
    /// A server was not ready again within the run, so there is no instant
    /// to measure recovery from.
    NotReady,
}

impl Recovery {
    /// The recovery time, when goodput came back.
    pub fn seconds(&self) -> Option<f64> {
        match self {
            Recovery::Recovered { s } => Some(*s),
            _ => None,
        }
    }
}

/// Every figure of one run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Figures {
    /// Median latency of judged calls, seconds (`None`: no judged call).
    pub latency_p50_s: Option<f64>,
    /// 95th-percentile latency of judged calls, seconds.
    pub latency_p95_s: Option<f64>,
    /// 99th-percentile latency of judged calls, seconds.
    pub latency_p99_s: Option<f64>,
    /// Judged calls that did not end `ok`, over judged calls.
    pub failed_fraction: Option<f64>,
    /// Requests the model servers received while impaired.
    pub impaired_requests: u64,
    /// Requests per call admitted by the limiter (`None`: none admitted).
    pub retry_amplification: Option<f64>,
    /// Calls a limit of the caller's own deferred (requests or tokens per
    /// window, or a deployment's limit): calls never offered to a server,
    /// which every other figure leaves out.
    pub calls_deferred: u64,
    /// Requests the servers answered with a 429 (a rate limit, a spent
    /// quota or llama-swap's concurrency limit:
    /// [`Answer::is_429`](crate::evidence::outcome::Answer::is_429)).
    pub throttled_requests: u64,
    /// How goodput came back after the last fault.
    pub goodput_recovery: Recovery,
    /// The same questions asked of each fault episode of a server, from the
    /// fault until the server was ready again (see [`episode_figures`]).
    pub episodes: Vec<EpisodeFigures>,
    /// Per priority class (`high`, `low`), how its calls fared, when a
    /// scenario's tenants are of both classes (empty otherwise): what a
    /// reserve buys one class and costs the other.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub classes: BTreeMap<String, ClassFigures>,
}

/// How the calls of one priority class fared.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ClassFigures {
    /// Calls of the class that ended (in flight at the end left out).
    pub calls: u64,
    /// Those a limit of the caller's own deferred (never offered to a
    /// server).
    pub deferred: u64,
    /// Judged calls of the class that did not end `ok`, over its judged
    /// calls (`None`: none judged).
    pub failed_fraction: Option<f64>,
}

/// Per priority class, how its tenants' calls fared, when `scenario` has
/// tenants of both classes; empty otherwise.
pub fn class_figures(scenario: &Scenario, events: &[TraceEvent]) -> BTreeMap<String, ClassFigures> {
    let class: BTreeMap<redstring::TenantId, redstring::Priority> = scenario
        .workers
        .iter()
        .flat_map(|g| &g.tenants)
        .map(|t| (t.tenant(), t.priority))
        .collect();
    if !class.values().any(|p| *p == redstring::Priority::Low)
        || !class.values().any(|p| *p == redstring::Priority::High)
    {
        return BTreeMap::new();
    }
    let mut tallies: BTreeMap<String, (ClassFigures, u64, u64)> = BTreeMap::new();
    for e in events {
        if let Kind::CallEnd(end) = &e.kind {
            let CallEnded { tenant, outcome, .. } = &**end;
            let priority = class.get(tenant).copied().unwrap_or_default();
            let (f, judged, failed) = tallies.entry(priority.as_str().to_owned()).or_default();
            f.calls += 1;
            if outcome.is_deferred() {
                f.deferred += 1;
            } else {
                *judged += 1;
                *failed += u64::from(!outcome.is_ok());
            }
        }
    }
    tallies
        .into_iter()
        .map(|(name, (mut f, judged, failed))| {
            f.failed_fraction = (judged > 0).then(|| failed as f64 / judged as f64);
            (name, f)
        })
        .collect()
}

impl Figures {
    /// Computes every figure of a run of `scenario` that lasted `end_us`.
    pub fn new(scenario: &Scenario, events: &[TraceEvent], end_us: u64) -> Figures {
        let lat = latencies_ms(events);
        let pct = |p: u32| percentile_ms(&lat, p).map(|ms| ms as f64 / 1000.0);
        let eps = episodes(scenario, events);
        Figures {
            latency_p50_s: pct(50),
            latency_p95_s: pct(95),
            latency_p99_s: pct(99),
            failed_fraction: failed_fraction(events),
            impaired_requests: impaired_requests(events),
            retry_amplification: retry_amplification(events),
            calls_deferred: calls_deferred(events),
            throttled_requests: throttled_requests(events),
            goodput_recovery: match heal(scenario, &eps) {
                Heal::At(t) => goodput_recovery(Some(t), events, end_us),
                Heal::NoFault => Recovery::NoFault,
                Heal::NotReady(_) => Recovery::NotReady,
            },
            episodes: episode_figures(scenario, &eps, events, end_us),
            classes: class_figures(scenario, events),
        }
    }
}

/// The latencies of judged calls, in milliseconds, sorted.
pub fn latencies_ms(events: &[TraceEvent]) -> Vec<u64> {
    let mut out: Vec<u64> = events
        .iter()
        .filter_map(|e| match &e.kind {
            Kind::CallEnd(end) if !end.outcome.is_deferred() => Some(end.latency_ms),
            _ => None,
        })
        .collect();
    out.sort_unstable();
    out
}

/// The `p`th percentile (1..=100) of `sorted` by nearest rank: the smallest
/// value with at least `p` % of the values at or below it, i.e. the value at
/// rank ⌈p·n/100⌉. `None` for no values.
pub fn percentile_ms(sorted: &[u64], p: u32) -> Option<u64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = (n * p.clamp(1, 100) as usize).div_ceil(100);
    sorted.get(rank.max(1) - 1).copied()
}

/// Judged calls that did not end `ok` (a server error, a timeout, an open
/// breaker), over all judged calls. `None` when no call was judged.
pub fn failed_fraction(events: &[TraceEvent]) -> Option<f64> {
    let (mut judged, mut failed) = (0u64, 0u64);
    for e in events {
        if let Kind::CallEnd(end) = &e.kind
            && !end.outcome.is_deferred()
        {
            judged += 1;
            failed += u64::from(!end.outcome.is_ok());
        }
    }
    (judged > 0).then(|| failed as f64 / judged as f64)
}

/// Requests the model servers received while loading, collapsed or
/// misbehaving (each `Served` event marked impaired).
pub fn impaired_requests(events: &[TraceEvent]) -> u64 {
    events
        .iter()
        .filter(|e| matches!(e.kind, Kind::Served { impaired: true, .. }))
        .count() as u64
}

/// Requests the servers answered with a 429.
pub fn throttled_requests(events: &[TraceEvent]) -> u64 {
    events
        .iter()
        .filter(|e| matches!(e.kind, Kind::Served { outcome, .. } if outcome.is_429()))
        .count() as u64
}

/// Calls that ended deferred by a limit of the caller's own (requests or
/// tokens per window, or a deployment's limit), whichever held them back.
pub fn calls_deferred(events: &[TraceEvent]) -> u64 {
    events
        .iter()
        .filter(|e| matches!(&e.kind, Kind::CallEnd(end) if end.outcome.is_deferred()))
        .count() as u64
}

/// Requests sent per call the limiter admitted (the calls that reached the
/// retry layer). `None` when no call was admitted.
pub fn retry_amplification(events: &[TraceEvent]) -> Option<f64> {
    let requests = events.iter().filter(|e| matches!(e.kind, Kind::Request { .. })).count();
    let admitted = events.iter().filter(|e| e.kind.reaches_retry()).count();
    (admitted > 0).then(|| requests as f64 / admitted as f64)
}

/// Seconds from `heal_us` (when the last fault is over, see
/// [`heal`]) until goodput is back.
///
/// Calls are binned by the second, after the heal, in which they *arrived*
/// (so a call's fate is charged to when it was offered). A call is offered
/// unless it ended deferred; it is ok when it ended `ok`. Goodput is back at
/// the first whole second `k ≥ 0` such that, over the window
/// `[heal + k, heal + k + RECOVERY_WINDOW_S)`, the offered calls are more
/// than none and at least [`RECOVERY_PERCENT`] % of them ended ok. Only
/// windows that end by `end_us` are looked at; calls in flight at the end are
/// offered and not ok.
pub fn goodput_recovery(heal_us: Option<u64>, events: &[TraceEvent], end_us: u64) -> Recovery {
    let Some(heal) = heal_us else {
        return Recovery::NoFault;
    };
    let window_us = RECOVERY_WINDOW_S * 1_000_000;
    let Some(last_start) = end_us.checked_sub(heal).and_then(|d| d.checked_sub(window_us)) else {
        return Recovery::TooLate;
    };
    let seconds = (last_start / 1_000_000) as usize + 1;
    let span = seconds + RECOVERY_WINDOW_S as usize;
    let (mut offered, mut ok) = (vec![0u64; span], vec![0u64; span]);
    let mut arrived: BTreeMap<(&str, u64), u64> = BTreeMap::new();
    let bin = |t: u64| {
        t.checked_sub(heal)
            .map(|d| (d / 1_000_000) as usize)
            .filter(|b| *b < span)
    };
    for e in events {
        match &e.kind {
            Kind::Arrival { call, .. } => {
                arrived.insert((e.host.as_ref(), *call), e.t_us);
                if let Some(b) = bin(e.t_us) {
                    offered[b] += 1;
                }
            }
            Kind::CallEnd(end) => {
                let CallEnded {
                    call,
                    outcome,
                    latency_ms,
                    ..
                } = &**end;
                let at = arrived
                    .get(&(e.host.as_ref(), *call))
                    .copied()
                    .unwrap_or_else(|| e.t_us.saturating_sub(latency_ms.saturating_mul(1000)));
                if let Some(b) = bin(at) {
                    match outcome {
                        o if o.is_deferred() => offered[b] = offered[b].saturating_sub(1),
                        CallOutcome::Ok => ok[b] += 1,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let w = RECOVERY_WINDOW_S as usize;
    (0..seconds)
        .find(|&k| {
            let o: u64 = offered[k..k + w].iter().sum();
            let g: u64 = ok[k..k + w].iter().sum();
            o > 0 && g * 100 >= o * RECOVERY_PERCENT
        })
        .map_or(Recovery::NotRecovered, |k| Recovery::Recovered { s: k as f64 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::outcome::{Answer, Limit};
    use crate::scenario::tenant;

    fn at(t_us: u64, kind: Kind) -> TraceEvent {
        TraceEvent {
            t_us,
            host: "w".into(),
            call: None,
            kind,
        }
    }

    fn arrival(t_us: u64, call: u64) -> TraceEvent {
        at(
            t_us,
            Kind::Arrival {
                call,
                tenant: tenant(1),
            },
        )
    }

    fn end(t_us: u64, call: u64, outcome: CallOutcome, latency_ms: u64) -> TraceEvent {
        at(
            t_us,
            Kind::CallEnd(Box::new(CallEnded {
                call,
                tenant: tenant(1),
                outcome,
                attempts: 1,
                latency_ms,
                retry_after_us: None,
                answer_us: None,
            })),
        )
    }

    #[test]
    fn class_figures_split_the_calls_by_their_tenants_priority_when_both_classes_exist() {
        let text = "name = \"c\"\nduration_s = 10\n[[servers]]\nname = \"gpu\"\n[[workers]]\nname = \"w\"\nservers = [\"gpu\"]\ntenants = [{ id = 1, calls_per_min = 1 }, { id = 2, calls_per_min = 1, priority = \"low\" }]\n";
        let scenario = Scenario::parse("c.toml", text).unwrap();
        let of = |t: u64, outcome| {
            let mut e = end(1, 1, outcome, 10);
            if let Kind::CallEnd(end) = &mut e.kind {
                end.tenant = tenant(t);
            }
            e
        };
        let events = [
            of(1, CallOutcome::Ok),
            of(1, CallOutcome::Failed("timeout")),
            of(2, CallOutcome::Deferred(Limit::Deployment)),
            of(2, CallOutcome::Deferred(Limit::Deployment)),
            of(2, CallOutcome::Ok),
        ];
        let classes = class_figures(&scenario, &events);
        let high = &classes["high"];
        assert_eq!((high.calls, high.deferred, high.failed_fraction), (2, 0, Some(0.5)));
        let low = &classes["low"];
        assert_eq!((low.calls, low.deferred, low.failed_fraction), (3, 2, Some(0.0)));
        // One class only: nothing to split.
        let single = Scenario::parse("c.toml", &text.replace(", priority = \"low\"", "")).unwrap();
        assert!(class_figures(&single, &events).is_empty());
    }

    #[test]
    fn calls_deferred_counts_the_calls_the_limiter_ended() {
        let events = [
            end(1, 1, CallOutcome::Ok, 10),
            end(2, 2, CallOutcome::Deferred(Limit::Requests), 0),
            end(3, 3, CallOutcome::Failed("timeout"), 10),
            end(4, 4, CallOutcome::Deferred(Limit::Tokens), 0),
            end(5, 5, CallOutcome::Deferred(Limit::Deployment), 0),
            end(6, 6, CallOutcome::Cooldown, 0),
            arrival(7, 7),
        ];
        assert_eq!(calls_deferred(&events), 3);
        assert_eq!(calls_deferred(&[]), 0);
    }

    #[test]
    fn percentiles_are_nearest_rank_over_judged_calls() {
        // Latencies 100..=1000 ms in steps of 100 (ten calls), plus a
        // deferred call of 9 s that must not count.
        let mut events: Vec<TraceEvent> = (1..=10)
            .map(|i| end(i * 1_000_000, i, CallOutcome::Ok, i * 100))
            .collect();
        events.push(end(20_000_000, 11, CallOutcome::Deferred(Limit::Requests), 9_000));
        let lat = latencies_ms(&events);
        assert_eq!(lat.len(), 10);
        // p50: rank ⌈5⌉ = 5 → 500; p95: rank ⌈9.5⌉ = 10 → 1000; p99 → 1000.
        assert_eq!(percentile_ms(&lat, 50), Some(500));
        assert_eq!(percentile_ms(&lat, 95), Some(1000));
        assert_eq!(percentile_ms(&lat, 99), Some(1000));
        assert_eq!(percentile_ms(&lat, 10), Some(100));
        assert_eq!(percentile_ms(&[], 50), None);
    }

    #[test]
    fn failed_fraction_leaves_deferred_calls_out() {
        // 2 ok, 1 circuit open, 1 failed, 2 deferred (one by requests, one
        // by tokens: alike): 2 failed of 4 judged.
        let events = vec![
            end(1, 1, CallOutcome::Ok, 1),
            end(2, 2, CallOutcome::Ok, 1),
            end(3, 3, CallOutcome::CircuitOpen, 1),
            end(4, 4, CallOutcome::Failed("timeout"), 1),
            end(5, 5, CallOutcome::Deferred(Limit::Requests), 1),
            end(6, 6, CallOutcome::Deferred(Limit::Tokens), 1),
        ];
        assert_eq!(failed_fraction(&events), Some(0.5));
        assert_eq!(failed_fraction(&events[4..]), None);
    }

    #[test]
    fn impaired_requests_count_impaired_answers_only() {
        let events = vec![
            at(1, Kind::served(Answer::Ok)),
            at(2, Kind::served(Answer::Loading)),
            at(3, Kind::served(Answer::Collapsed)),
            at(4, Kind::served(Answer::NotFound)),
        ];
        assert_eq!(impaired_requests(&events), 2);
    }

    #[test]
    fn throttled_requests_count_every_kind_of_429_and_nothing_else() {
        let events = vec![
            at(1, Kind::served(Answer::Throttled)),
            at(2, Kind::served(Answer::RateLimit)),
            at(3, Kind::served(Answer::QuotaExhausted)),
            at(4, Kind::served(Answer::QueueFull)),
            at(5, Kind::served(Answer::Ok)),
            end(6, 1, CallOutcome::Cooldown, 0),
        ];
        assert_eq!(throttled_requests(&events), 3);
    }

    #[test]
    fn amplification_is_requests_per_admitted_call() {
        let admitted = || {
            at(
                1,
                Kind::Admitted {
                    tenant: tenant(1),
                    remaining: 1,
                    at_us: 1,
                    decided_by: Default::default(),
                },
            )
        };
        let request = || at(2, Kind::Request { server: "gpu".into() });
        let events = vec![
            admitted(),
            admitted(),
            request(),
            request(),
            request(),
            request(),
            request(),
        ];
        assert_eq!(retry_amplification(&events), Some(2.5));
        assert_eq!(retry_amplification(&events[2..]), None);
    }

    /// One call a second from `from_s` to `to_s` (exclusive), each ending
    /// 100 ms later as `outcome(second)`.
    fn calls(from_s: u64, to_s: u64, outcome: impl Fn(u64) -> CallOutcome) -> Vec<TraceEvent> {
        let mut out = Vec::new();
        for s in from_s..to_s {
            let t = s * 1_000_000 + 10;
            out.push(arrival(t, s));
            out.push(end(t + 100_000, s, outcome(s), 100));
        }
        out
    }

    #[test]
    fn goodput_recovers_at_the_first_window_with_95_percent_ok() {
        // Heal at 10 s; calls fail up to and including 12 s, succeed from
        // 13 s. Windows of 5 s from the heal: [10,15) has 2 ok of 5, ...,
        // [13,18) has 5 of 5 — recovered 3 s after the heal.
        let events = calls(0, 30, |s| {
            if s <= 12 {
                CallOutcome::CircuitOpen
            } else {
                CallOutcome::Ok
            }
        });
        assert_eq!(
            goodput_recovery(Some(10_000_000), &events, 30_000_000),
            Recovery::Recovered { s: 3.0 }
        );
        // Already good at the heal: 0 s.
        assert_eq!(
            goodput_recovery(Some(20_000_000), &events, 30_000_000),
            Recovery::Recovered { s: 0.0 }
        );
    }

    #[test]
    fn deferred_calls_are_not_offered_and_in_flight_calls_are_not_ok() {
        // Heal at 0; every call ok except those of seconds 0 and 1, which
        // the limiter deferred: the first window holds 3 offered, 3 ok.
        let events = calls(0, 10, |s| {
            if s < 2 {
                CallOutcome::Deferred(Limit::Requests)
            } else {
                CallOutcome::Ok
            }
        });
        assert_eq!(
            goodput_recovery(Some(0), &events, 10_000_000),
            Recovery::Recovered { s: 0.0 }
        );
        // Calls that arrive and never end are offered and not ok.
        let hung: Vec<TraceEvent> = (0..10).map(|s| arrival(s * 1_000_000, s)).collect();
        assert_eq!(goodput_recovery(Some(0), &hung, 10_000_000), Recovery::NotRecovered);
    }

    #[test]
    fn recovery_needs_a_fault_and_a_whole_window() {
        let events = calls(0, 10, |_| CallOutcome::Ok);
        assert_eq!(goodput_recovery(None, &events, 10_000_000), Recovery::NoFault);
        assert_eq!(
            goodput_recovery(Some(6_000_000), &events, 10_000_000),
            Recovery::TooLate
        );
        // Exactly one window fits.
        assert_eq!(
            goodput_recovery(Some(5_000_000), &events, 10_000_000),
            Recovery::Recovered { s: 0.0 }
        );
    }

    #[test]
    fn one_failure_in_twenty_is_still_recovered_but_two_are_not() {
        // Four calls a second; heal at 0, a 10 s run (6 windows).
        let mut one = Vec::new();
        let mut two = Vec::new();
        for i in 0..40u64 {
            let t = i * 250_000 + 10;
            let bad1 = i == 2;
            let bad2 = i % 10 == 2 || i % 10 == 3;
            for (v, bad) in [(&mut one, bad1), (&mut two, bad2)] {
                v.push(arrival(t, i));
                let o = if bad {
                    CallOutcome::Failed("timeout")
                } else {
                    CallOutcome::Ok
                };
                v.push(end(t + 1_000, i, o, 1));
            }
        }
        // [0,5): 19 ok of 20 = 95 % → recovered at 0.
        assert_eq!(
            goodput_recovery(Some(0), &one, 10_000_000),
            Recovery::Recovered { s: 0.0 }
        );
        // Two failures in every 10 calls (2.5 s): every 5 s window holds
        // at least 3 failures of 20 → never.
        assert_eq!(goodput_recovery(Some(0), &two, 10_000_000), Recovery::NotRecovered);
    }
}
