//! Accounting: every unit of work ends once, classified, and no call sends
//! more requests than its retry schedule and its hedges allow — however
//! many deployments it falls over to.

use std::collections::BTreeMap;

use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::timeline::FLEET;
use crate::evidence::trace::{Kind, TraceEvent};

/// Invariant 7: every unit of work ends once as a success, a classified error
/// or a deferral; no call sends more than max_retries + 1 requests (a
/// fallover to another deployment is one of its retries), plus
/// `max_hedges` under hedging; and requests ≤ that many × the calls that
/// reached the retry layer.
pub(super) fn accounting(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let h = &ctx.scenario.hardening;
    let hedges = if h.hedge_after_ms.is_some() { h.max_hedges } else { 0 };
    let per_call = u64::from(h.max_retries) + 1 + u64::from(hedges);
    let mut open: BTreeMap<(&str, u64), u64> = BTreeMap::new();
    let mut sent: BTreeMap<(&str, u64), u64> = BTreeMap::new();
    let (mut arrivals, mut ended, mut requests, mut calls) = (0u64, 0u64, 0u64, 0u64);
    let mut verdict = Verdict::Held;
    for e in events {
        match &e.kind {
            Kind::Arrival { call, .. } => {
                arrivals += 1;
                open.insert((e.host.as_ref(), *call), e.t_us);
            }
            Kind::CallEnd(end) => {
                let call = &end.call;
                ended += 1;
                if open.remove(&(e.host.as_ref(), *call)).is_none() && verdict == Verdict::Held {
                    verdict = violated(e, format!("call {call} ended without arriving, or ended twice"));
                }
            }
            Kind::Request { .. } => {
                requests += 1;
                if let Some(call) = e.call {
                    let n = sent.entry((e.host.as_ref(), call)).or_default();
                    *n += 1;
                    if *n > per_call && verdict == Verdict::Held {
                        verdict = violated(e, format!("call {call} sent {n} requests (at most {per_call})"));
                    }
                }
            }
            kind if kind.reaches_retry() => calls += 1,
            _ => {}
        }
    }
    if arrivals == 0 {
        return not_applicable("no work arrived");
    }
    if requests > per_call * calls && verdict == Verdict::Held {
        verdict = Verdict::Violated {
            t_us: events.last().map_or(0, |e| e.t_us),
            host: FLEET.into(),
            detail: format!("{requests} requests for {calls} admitted calls (at most {per_call} each)"),
        };
    }
    let in_flight = open.len();
    let amplification = if calls == 0 {
        0.0
    } else {
        requests as f64 / calls as f64
    };
    (
        verdict,
        format!(
            "{arrivals} arrived, {ended} ended, {in_flight} in flight at the end; {requests} requests for {calls} admitted calls ({amplification:.2}×)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::super::{Invariant, check_all, event};
    use super::*;
    use crate::evidence::outcome::CallOutcome;
    use crate::evidence::trace::CallEnded;
    use crate::scenario::Scenario;

    const SCENARIO: &str = r#"
name = "synthetic"
duration_s = 100
[hardening]
rpm = 100
max_retries = 2
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 1 }]
"#;

    fn verdict(events: &[TraceEvent]) -> Verdict {
        let s = Scenario::parse("synthetic.toml", SCENARIO).unwrap();
        check_all(&s, events)
            .into_iter()
            .find(|c| c.name == Invariant::Accounting)
            .map(|c| c.verdict)
            .unwrap()
    }

    /// One call of `requests` requests, and another of one: together
    /// within the aggregate bound of 3 a call when `requests` is 5.
    fn calls(requests: u64) -> Vec<TraceEvent> {
        let tenant = crate::scenario::tenant(1);
        let mut events = Vec::new();
        for (call, n) in [(1, requests), (2, 1)] {
            let t = call * 1_000_000;
            events.push(event(t, "w", Some(call), Kind::Arrival { call, tenant }));
            events.push(event(
                t,
                "w",
                Some(call),
                Kind::Admitted {
                    tenant,
                    remaining: 10,
                    at_us: t,
                    decided_by: Default::default(),
                },
            ));
            for i in 0..n {
                events.push(event(
                    t + i + 1,
                    "w",
                    Some(call),
                    Kind::Request { server: "gpu".into() },
                ));
            }
            events.push(event(
                t + n + 1,
                "w",
                Some(call),
                Kind::CallEnd(Box::new(CallEnded {
                    call,
                    tenant,
                    outcome: CallOutcome::Ok,
                    attempts: u32::try_from(n).unwrap(),
                    latency_ms: 1,
                    retry_after_us: None,
                    answer_us: None,
                })),
            ));
        }
        events
    }

    #[test]
    fn a_call_sending_more_than_its_schedule_allows_is_caught_even_within_the_aggregate() {
        assert_eq!(verdict(&calls(3)), Verdict::Held);
        match verdict(&calls(4)) {
            Verdict::Violated { detail, .. } => assert_eq!(detail, "call 1 sent 4 requests (at most 3)"),
            other => panic!("{other:?}"),
        }
    }
}
