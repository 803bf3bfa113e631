//! Liveness: once the last fault is over, the fleet recovers — every breaker
//! closes again within a bound, and calls succeed again.

use std::collections::BTreeMap;

use redstring::CircuitState;

use super::{Ctx, Finding, Verdict, not_applicable, secs_us, violated};
use crate::evidence::outcome::CallOutcome;
use crate::evidence::timeline::{Breakers, FLEET};
use crate::evidence::trace::{Kind, TraceEvent};
use crate::scenario::{Fault, Scenario, ServerSpec};

/// When the last fault is over: the latest fault, with a restart's reload,
/// and a burst's backlog drained by the slowest server.
pub fn heal_time_us(s: &Scenario) -> Option<u64> {
    let workers = s.fleet().len() as f64;
    let slowest = s
        .servers
        .iter()
        .map(ServerSpec::throughput)
        .fold(f64::INFINITY, f64::min);
    s.faults
        .iter()
        .map(|f| {
            let extra = match f {
                Fault::Restart { server, .. } => s.server(server).map_or(0.0, ServerSpec::longest_reload_s),
                Fault::Burst { calls, .. } => f64::from(*calls) * workers / slowest + s.hardening.request_timeout_s,
                Fault::Crash { .. }
                | Fault::Behave { .. }
                | Fault::Partition { .. }
                | Fault::Heal { .. }
                | Fault::Latency { .. }
                | Fault::ClockStep { .. }
                | Fault::CacheDown { .. }
                | Fault::CacheUp { .. } => 0.0,
            };
            secs_us(f.at_s() + extra)
        })
        .max()
}

/// The instant after which the fleet must have recovered, or why there is
/// none within the run.
fn bound_us(ctx: &Ctx, events: &[TraceEvent]) -> Result<u64, String> {
    let s = ctx.scenario;
    let heal = heal_time_us(s).ok_or("no faults")?;
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
    if bound >= secs_us(s.duration_s) {
        return Err(format!(
            "the run ends before the liveness bound ({} s)",
            bound / 1_000_000
        ));
    }
    Ok(bound)
}

/// Invariant 6: once the last fault is over, every breaker closes again
/// within a bound, and calls succeed again.
pub(super) fn liveness(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let bound = match bound_us(ctx, events) {
        Ok(bound) => bound,
        Err(why) => return not_applicable(why),
    };
    let mut breakers = Breakers::new(ctx.scopes);
    let (mut ok_after, mut ended_after) = (0u64, 0u64);
    let mut open_after_bound: Option<&TraceEvent> = None;
    for e in events {
        breakers.observe(e);
        if let Kind::CallEnd { outcome, .. } = &e.kind
            && e.t_us >= bound
        {
            match outcome {
                // Deferrals by the limiter say nothing about the server's health.
                CallOutcome::RateLimited => {}
                CallOutcome::Ok => {
                    ended_after += 1;
                    ok_after += 1;
                }
                CallOutcome::CircuitOpen => {
                    ended_after += 1;
                    open_after_bound.get_or_insert(e);
                }
                CallOutcome::Failed(_) => ended_after += 1,
            }
        }
    }
    let figure = format!(
        "bound {} s after the start; {ok_after} of {ended_after} calls not deferred by the limiter ok after it",
        bound / 1_000_000
    );
    for (scope, st, since) in breakers.iter() {
        let detail = if st != CircuitState::Closed {
            format!(
                "breaker of {scope} still {st:?} at the end (since {} s)",
                since / 1_000_000
            )
        } else if since > bound {
            format!("breaker of {scope} closed only at {} s", since / 1_000_000)
        } else {
            continue;
        };
        let verdict = Verdict::Violated {
            t_us: since,
            host: scope.to_owned(),
            detail,
        };
        return (verdict, figure);
    }
    if let Some(e) = open_after_bound {
        return (
            violated(e, "a call was refused as circuit_open after the bound".into()),
            figure,
        );
    }
    if ended_after > 0 && ok_after == 0 {
        let verdict = Verdict::Violated {
            t_us: bound,
            host: FLEET.into(),
            detail: "no call succeeded after the bound".into(),
        };
        return (verdict, figure);
    }
    (Verdict::Held, figure)
}
