//! Liveness: once the last fault is over, the fleet recovers — every breaker
//! closes again within a bound, and calls succeed again. Under
//! `hardening.routing` a breaker is held to it only if it refused a call
//! after the bound: a spare that no call asks again (the recovered primary
//! takes them all) keeps the state its last call left it in, and harms no one.
//!
//! Only a scenario that can recover is held to it. When the scenario itself
//! rules recovery out — a server crashed and never restarted, a request
//! timeout shorter than a server's service time, steady offered load above
//! a server's capacity — the verdict is *not applicable*, with the reason
//! ([`unrecoverable`]): the hardening cannot be blamed for it, and a failure
//! there would hide real ones. A run that ends before the bound is not
//! applicable too, and says which `duration_s` would be long enough.

use std::collections::BTreeMap;

use redstring::CircuitState;

use super::{Ctx, Finding, Verdict, not_applicable, secs_us, violated};
use crate::evidence::episodes::{Episode, episodes};
use crate::evidence::outcome::CallOutcome;
use crate::evidence::timeline::{Breakers, FLEET};
use crate::evidence::trace::{Kind, TraceEvent};
use crate::scenario::fault::in_order;
use crate::scenario::{Fault, Scenario, ServerSpec, sanity};

/// When the last fault of one run is over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Heal {
    /// The scenario has no fault.
    NoFault,
    /// Every fault was over at this instant, microseconds since the start.
    At(u64),
    /// This server was restarted and not ready again within the run (its
    /// model never loaded, or it crashed again for good).
    NotReady(String),
}

impl Heal {
    /// The instant, when every fault was over within the run.
    pub fn at_us(&self) -> Option<u64> {
        match self {
            Heal::At(t) => Some(*t),
            Heal::NoFault | Heal::NotReady(_) => None,
        }
    }
}

/// When the last fault of a run is over, given its fault episodes
/// ([`episodes`]): the latest fault; a restart only once its episode is over (
/// when this run's server recorded its model loaded — the load time this run
/// drew, not the longest a drawn reload may take); a burst once its backlog
/// is drained by the slowest server.
pub fn heal(s: &Scenario, eps: &[Episode]) -> Heal {
    let workers = s.fleet().len() as f64;
    let slowest = s
        .servers
        .iter()
        .map(ServerSpec::throughput)
        .fold(f64::INFINITY, f64::min);
    let mut last = None;
    for f in &s.faults {
        let at = secs_us(f.at_s());
        let over = match f {
            Fault::Burst { calls, .. } => at.saturating_add(secs_us(
                f64::from(*calls) * workers / slowest + s.hardening.request_timeout_s,
            )),
            _ => at,
        };
        last = last.max(Some(over));
    }
    // A restart is over once its episode is: the server loaded (or, for a
    // kind that loads on demand, at once). Other faults are over at their
    // instant, so a server misbehaving to the end still has a heal.
    for f in &s.faults {
        let Fault::Restart { server, .. } = f else { continue };
        let at = secs_us(f.at_s());
        let ep = eps
            .iter()
            .find(|e| e.server == *server && e.start_us <= at && e.ready_us.is_none_or(|r| r >= at));
        match ep.map(|e| e.ready_us) {
            Some(Some(ready)) => last = last.max(Some(ready)),
            Some(None) => return Heal::NotReady(server.clone()),
            // A restart of a running server does nothing.
            None => {}
        }
    }
    last.map_or(Heal::NoFault, Heal::At)
}

/// Why `s` cannot recover whatever its hardening does, if it cannot: a
/// server crashed and never restarted, a request timeout or a slow-call
/// threshold below a server's (unloaded) service time (every answer too
/// late, or counted slow: its circuit never stays closed), or steady
/// offered load above a server's capacity (the figures `redstring-sim`
/// prints before a run, [`sanity::loads`]).
pub fn unrecoverable(s: &Scenario) -> Option<String> {
    let mut down: Vec<&str> = Vec::new();
    for f in in_order(&s.faults) {
        match f {
            Fault::Crash { server, .. } if !down.contains(&server.as_str()) => down.push(server),
            Fault::Restart { server, .. } => down.retain(|d| d != server),
            _ => {}
        }
    }
    if let Some(server) = down.first() {
        return Some(format!("{server} crashed and is never restarted"));
    }
    let timeout = s.hardening.request_timeout_s;
    for spec in &s.servers {
        let service = spec.service_time_s();
        if timeout < service {
            return Some(format!(
                "request_timeout_s {timeout} is below {}'s service time of {service:.3} s, so no call can succeed",
                spec.name
            ));
        }
        if let Some(ms) = s.hardening.slow_call_ms
            && (ms as f64) < service * 1000.0
        {
            return Some(format!(
                "slow_call_ms {ms} is below {}'s service time of {service:.3} s, so every answer is counted slow and its circuit never stays closed",
                spec.name
            ));
        }
    }
    for load in sanity::loads(s) {
        if load.utilisation() > 1.0 {
            return Some(format!(
                "{} is offered {:.2} calls/s, above its capacity of {:.2} calls/s",
                load.server, load.offered_per_s, load.capacity_per_s
            ));
        }
    }
    None
}

/// The liveness bound and what it is made of.
struct Bound {
    /// The instant, microseconds since the start.
    us: u64,
    /// How it was reached, in words.
    parts: String,
}

/// The instant after which the fleet must have recovered, or why there is
/// none within the run.
fn bound_us(ctx: &Ctx, events: &[TraceEvent], heal: &Heal) -> Result<Bound, String> {
    let s = ctx.scenario;
    let heal = match heal {
        Heal::At(t) => *t,
        Heal::NoFault => return Err("no faults".into()),
        Heal::NotReady(server) => {
            return Err(format!("{server} restarted and was not ready again within the run"));
        }
    };
    let h = &s.hardening;
    let policy_wait = h.retry_policy().map_or(0.0, |p| p.worst_case_wait().as_secs_f64());
    // Calls in flight at the heal may still fail and open a breaker up to one
    // call later; it then waits out its open period (the recovery timeout, or
    // its escalation) and probes with one call,
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
        let prev = last_arrival.insert(e.host.as_ref(), e.t_us).unwrap_or(heal);
        lull = lull.max(e.t_us - prev);
    }
    let (open_s, open_name) = h.longest_open_s();
    let bound = heal + lull + secs_us(2.0 * one_call + open_s + limiter_wait + 1.0);
    let parts = format!(
        "the last fault over at {:.1} s + the longest lull in a worker's arrivals {:.1} s + two calls of {one_call:.1} s each + {open_name} {open_s} + limiter waits {limiter_wait:.1} s + 1 s",
        heal as f64 / 1e6,
        lull as f64 / 1e6,
    );
    if bound >= secs_us(s.duration_s) {
        return Err(format!(
            "the run ends at {} s, before the liveness bound at {:.1} s ({parts}); duration_s = {} would be long enough",
            s.duration_s,
            bound as f64 / 1e6,
            bound / 1_000_000 + 2
        ));
    }
    Ok(Bound { us: bound, parts })
}

/// Invariant 6: once the last fault is over, every breaker closes again
/// within a bound, and calls succeed again.
pub(super) fn liveness(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let over = heal(ctx.scenario, &episodes(ctx.scenario, events));
    if over == Heal::NoFault {
        return not_applicable("no faults");
    }
    if let Some(why) = unrecoverable(ctx.scenario) {
        return not_applicable(format!("the scenario cannot recover: {why}"));
    }
    let Bound { us: bound, parts } = match bound_us(ctx, events, &over) {
        Ok(bound) => bound,
        Err(why) => return not_applicable(why),
    };
    let mut breakers = Breakers::new(ctx.scopes);
    let (mut ok_after, mut ended_after) = (0u64, 0u64);
    let mut open_after_bound: Option<&TraceEvent> = None;
    // Under routing, breakers that refused a call after the bound: one no
    // call asked (the primary took every call) may stay as it was.
    let routed = ctx.scenario.hardening.routing.is_some();
    let mut asked_after = std::collections::BTreeSet::new();
    for e in events {
        breakers.observe(e);
        if let Kind::Rejected { breaker, .. } = &e.kind
            && e.t_us >= bound
        {
            asked_after.insert(ctx.scopes.breaker(e, breaker));
        }
        if let Kind::CallEnd(end) = &e.kind
            && e.t_us >= bound
        {
            match &end.outcome {
                // Deferrals by the caller's own limits say nothing about the
                // server's health.
                CallOutcome::Deferred(_) => {}
                CallOutcome::Ok => {
                    ended_after += 1;
                    ok_after += 1;
                }
                CallOutcome::CircuitOpen => {
                    ended_after += 1;
                    open_after_bound.get_or_insert(e);
                }
                // A quota cooldown is the server's own limit speaking, not
                // a breaker that failed to close.
                CallOutcome::Cooldown | CallOutcome::Failed(_) => ended_after += 1,
            }
        }
    }
    let figure = format!(
        "bound {} s after the start ({parts}); {ok_after} of {ended_after} calls not deferred by the limiter ok after it",
        bound / 1_000_000
    );
    for (scope, st, since) in breakers.iter() {
        if routed && !asked_after.contains(scope) {
            continue;
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judgement::invariants::{Invariant, check_all};

    /// A 300 s run: one generic server (4 slots, 2 s a call) and one worker
    /// sending `cpm` calls a minute, with `extra` appended.
    fn scenario(cpm: u32, extra: &str) -> Scenario {
        let text = format!(
            r#"
name = "liveness"
duration_s = 300
[hardening]
rpm = 1000
request_timeout_s = 10
[[servers]]
name = "gpu"
slots = 4
reload_s = 5
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{{ id = 1, calls_per_min = {cpm} }}]
{extra}"#
        );
        Scenario::parse("liveness.toml", &text).unwrap()
    }

    const CRASH: &str = "[[faults]]\nkind = \"crash\"\nat_s = 50\nserver = \"gpu\"\n";
    const RESTART: &str = "[[faults]]\nkind = \"restart\"\nat_s = 80\nserver = \"gpu\"\n";

    /// The trace's record that the restarted gpu loaded (80 s + `reload_s`).
    fn loaded() -> [TraceEvent; 1] {
        [TraceEvent {
            t_us: 85_000_000,
            host: "gpu".into(),
            call: None,
            kind: Kind::Loaded,
        }]
    }

    fn verdict(s: &Scenario) -> Verdict {
        let checks = check_all(s, &loaded());
        let c = checks.into_iter().find(|c| c.name == Invariant::Liveness).unwrap();
        assert!(!c.failed(), "not applicable must not fail the run");
        c.verdict
    }

    fn why(s: &Scenario) -> String {
        match verdict(s) {
            Verdict::NotApplicable { why } => why,
            other => panic!("expected not applicable, got {other:?}"),
        }
    }

    #[test]
    fn a_server_crashed_and_never_restarted_cannot_recover() {
        let s = scenario(6, CRASH);
        assert_eq!(unrecoverable(&s).as_deref(), Some("gpu crashed and is never restarted"));
        assert!(why(&s).starts_with("the scenario cannot recover: gpu crashed"));
        // Restarted: it can.
        assert_eq!(unrecoverable(&scenario(6, &format!("{CRASH}{RESTART}"))), None);
    }

    #[test]
    fn a_request_timeout_below_the_service_time_cannot_recover() {
        let mut s = scenario(6, &format!("{CRASH}{RESTART}"));
        s.hardening.request_timeout_s = 0.5;
        let why = why(&s);
        assert!(
            why.contains("request_timeout_s 0.5 is below gpu's service time"),
            "{why}"
        );
    }

    #[test]
    fn offered_load_above_capacity_cannot_recover() {
        // 4 slots of about 2 s serve about 2 calls a second; 600 a minute is 10.
        let s = scenario(600, &format!("{CRASH}{RESTART}"));
        let why = why(&s);
        assert!(
            why.contains("gpu is offered 10.00 calls/s, above its capacity"),
            "{why}"
        );
    }

    #[test]
    fn a_run_too_short_for_the_bound_names_a_long_enough_duration() {
        let mut s = scenario(6, &format!("{CRASH}{RESTART}"));
        s.duration_s = 90.0;
        let why = why(&s);
        assert!(
            why.starts_with("the run ends at 90 s, before the liveness bound at"),
            "{why}"
        );
        let wanted: f64 = why
            .rsplit_once("duration_s = ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        // That duration is indeed long enough: the bound then lies within the run.
        s.duration_s = wanted;
        assert!(!matches!(verdict(&s), Verdict::NotApplicable { .. }));
    }

    #[test]
    fn a_restarted_server_that_never_loaded_is_not_held_to_the_bound() {
        let s = scenario(6, &format!("{CRASH}{RESTART}"));
        let checks = check_all(&s, &[]);
        let c = checks.iter().find(|c| c.name == Invariant::Liveness).unwrap();
        assert_eq!(
            c.verdict,
            Verdict::NotApplicable {
                why: "gpu restarted and was not ready again within the run".into()
            }
        );
    }

    #[test]
    fn the_figure_explains_the_bound() {
        let s = scenario(6, &format!("{CRASH}{RESTART}"));
        let checks = check_all(&s, &loaded());
        let c = checks.iter().find(|c| c.name == Invariant::Liveness).unwrap();
        assert!(c.figure.contains("the last fault over at 85.0 s"), "{}", c.figure);
        assert!(c.figure.contains("recovery_timeout_s"), "{}", c.figure);
    }
}
