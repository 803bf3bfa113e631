//! Hedged requests: a hedge trades load on the servers for the latency
//! tail, so each one must be earned and bounded.
//!
//! Under `hardening.hedge_after_ms` every hedge the provider reports
//! ([`Kind::Hedged`]) is judged against the call's own records: it comes
//! no sooner than the hedge delay after the call's request before it
//! ([`Kind::Request`]; under `"p95"` the floor, the least it may be); a
//! call hedges at most `max_hedges` times; with a retry budget, each hedge
//! is paid — a granted withdrawal ([`Kind::Budget`]) since the call's last
//! request, retry or hedge, each of which spends one; and once a hedged call has its answer, no server
//! answers it again ([`Kind::Served`] `ok` for that call more than a
//! one-way latency after its end, on a link never cut): the losing attempt
//! was cancelled, so its server saw the client leave and stopped
//! generating.

use std::collections::{BTreeMap, BTreeSet};

use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::outcome::{Answer, CallOutcome};
use crate::evidence::trace::{Kind, TraceEvent};
use crate::scenario::Fault;

/// One call's hedging so far.
#[derive(Default)]
struct Hedges {
    /// When its latest request went out, µs.
    last_request_us: Option<u64>,
    /// Whether the budget granted a withdrawal since its latest request,
    /// retry or hedge (each of which spends one).
    paid: bool,
    /// Hedges sent.
    sent: u32,
    /// When it ended with an answer, µs.
    answered_us: Option<u64>,
}

/// Invariant 19: under hedging, every hedge waits at least its delay after
/// the call's request before it, is paid from the retry budget when there
/// is one, and no call hedges more than `max_hedges` times; a hedged call
/// that has its answer is answered by no server later than the closed
/// connection could reach it.
pub(super) fn hedging(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let h = &ctx.scenario.hardening;
    let Some(after) = h.hedge_after_ms else {
        return not_applicable("no hedging configured");
    };
    let least_us = after.least_ms(h.hedge_floor_ms).saturating_mul(1000);
    let budgeted = h.retry_budget.is_some();
    // A cancelled request's server learns of it when the closed connection
    // reaches it: a one-way latency later (a tick's granularity on top),
    // and never while their link is cut.
    let s = ctx.scenario;
    let slack_us = s.longest_latency_ms().saturating_add(s.tick_ms).saturating_mul(1000);
    let cut: BTreeSet<(&str, &str)> = s
        .faults
        .iter()
        .filter_map(|f| match f {
            Fault::Partition { a, b, .. } => Some([(a.as_str(), b.as_str()), (b.as_str(), a.as_str())]),
            _ => None,
        })
        .flatten()
        .collect();
    let mut calls: BTreeMap<(&str, u64), Hedges> = BTreeMap::new();
    let (mut hedges, mut hedged_calls, mut cancelled) = (0u64, 0u64, 0u64);
    let mut verdict = Verdict::Held;
    let fail = |verdict: &mut Verdict, e: &TraceEvent, detail: String| {
        if *verdict == Verdict::Held {
            *verdict = violated(e, detail);
        }
    };
    for e in events {
        match &e.kind {
            Kind::CallEnd(end) if end.outcome == CallOutcome::Ok => {
                if let Some(seen) = calls.get_mut(&(e.host.as_ref(), end.call))
                    && seen.sent > 0
                {
                    seen.answered_us = Some(e.t_us);
                }
                continue;
            }
            Kind::Served { outcome, caller, .. } => {
                let Some((host, call)) = caller.as_deref().and_then(|c| c.rsplit_once('/')) else {
                    continue;
                };
                let Ok(call) = call.parse::<u64>() else { continue };
                let Some(seen) = calls.get(&(host, call)) else { continue };
                match (outcome, seen.answered_us) {
                    (Answer::Abandoned, _) if seen.sent > 0 => cancelled += 1,
                    (Answer::Ok, Some(end))
                        if e.t_us > end.saturating_add(slack_us) && !cut.contains(&(host, e.host.as_ref())) =>
                    {
                        fail(
                            &mut verdict,
                            e,
                            format!(
                                "{} answered {host}'s call {call} {} ms after it ended with a hedge's answer (more than a one-way latency, {} ms, after): the losing attempt was not cancelled",
                                e.host,
                                (e.t_us - end) / 1000,
                                slack_us / 1000
                            ),
                        );
                    }
                    _ => {}
                }
                continue;
            }
            _ => {}
        }
        let Some(call) = e.call else { continue };
        let seen = calls.entry((e.host.as_ref(), call)).or_default();
        match &e.kind {
            Kind::Request { .. } => {
                seen.last_request_us = Some(e.t_us);
                seen.paid = false;
            }
            Kind::Budget {
                command: redstring::decide::budget::BudgetCommand::Withdraw,
                granted,
                ..
            } => seen.paid = *granted,
            Kind::Retry { .. } => seen.paid = false,
            Kind::Hedged { from, to, .. } => {
                hedges += 1;
                seen.sent += 1;
                if seen.sent == 1 {
                    hedged_calls += 1;
                }
                let waited = seen.last_request_us.map(|t| e.t_us.saturating_sub(t));
                if seen.sent > h.max_hedges {
                    fail(
                        &mut verdict,
                        e,
                        format!("call {call} hedged {} times (at most {})", seen.sent, h.max_hedges),
                    );
                } else if waited.is_none_or(|w| w < least_us) {
                    fail(
                        &mut verdict,
                        e,
                        format!(
                            "call {call} hedged from {from} to {to} {} ms after its request, before the delay of {} ms",
                            waited.unwrap_or(0) / 1000,
                            least_us / 1000
                        ),
                    );
                } else if budgeted && !seen.paid {
                    fail(
                        &mut verdict,
                        e,
                        format!(
                            "call {call} hedged from {from} to {to} without a withdrawal granted by the retry budget"
                        ),
                    );
                }
                seen.paid = false;
            }
            _ => {}
        }
    }
    if hedges == 0 {
        return not_applicable("no call was hedged");
    }
    (
        verdict,
        format!("{hedges} hedges in {hedged_calls} calls; {cancelled} losing requests abandoned at their servers"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::trace::{CallEnded, Decider};
    use crate::judgement::invariants::{Invariant, check_all, event};
    use crate::scenario::Scenario;

    const HEDGED: &str = r#"
name = "synthetic"
duration_s = 100
[hardening]
rpm = 60
request_timeout_s = 10
routing = "ordered"
hedge_after_ms = 800
max_hedges = 1
[hardening.retry_budget]
ratio = 0.2
[[servers]]
name = "tail"
[[servers]]
name = "spare"
[[workers]]
name = "w"
servers = ["tail", "spare"]
tenants = [{ id = 1, calls_per_min = 1 }]
"#;

    fn verdict(text: &str, events: &[TraceEvent]) -> (Verdict, String) {
        let s = Scenario::parse("synthetic.toml", text).unwrap();
        let c = check_all(&s, events)
            .into_iter()
            .find(|c| c.name == Invariant::Hedging)
            .unwrap();
        (c.verdict, c.figure)
    }

    fn in_call(t_ms: u64, kind: Kind) -> TraceEvent {
        event(t_ms * 1000, "w", Some(1), kind)
    }

    fn request(t_ms: u64, server: &str) -> TraceEvent {
        in_call(t_ms, Kind::Request { server: server.into() })
    }

    fn withdrawal(t_ms: u64, granted: bool) -> TraceEvent {
        in_call(
            t_ms,
            Kind::Budget {
                budget: "kg:retrybudget".into(),
                command: redstring::decide::budget::BudgetCommand::Withdraw,
                granted,
                balance: 0,
                at_us: t_ms * 1000,
                decided_by: Decider::Cache,
            },
        )
    }

    fn hedged(t_ms: u64) -> TraceEvent {
        in_call(
            t_ms,
            Kind::Hedged {
                from: "kg:circuit:tail".into(),
                to: "kg:circuit:spare".into(),
                after_us: 800_000,
            },
        )
    }

    fn served(t_ms: u64, server: &str, outcome: Answer) -> TraceEvent {
        event(t_ms * 1000, server, None, Kind::served_for(outcome, Some("w/1".into())))
    }

    fn ended(t_ms: u64) -> TraceEvent {
        event(
            t_ms * 1000,
            "w",
            None,
            Kind::CallEnd(Box::new(CallEnded {
                call: 1,
                tenant: redstring::TenantId::from_u128(1),
                outcome: CallOutcome::Ok,
                attempts: 2,
                latency_ms: t_ms,
                retry_after_us: None,
                answer_us: None,
            })),
        )
    }

    /// A call whose tail is hedged at 800 ms, paid, the spare answering
    /// first and the tail's request abandoned.
    fn won_by_the_hedge() -> Vec<TraceEvent> {
        vec![
            request(0, "tail"),
            withdrawal(805, true),
            hedged(805),
            request(805, "spare"),
            served(900, "spare", Answer::Ok),
            ended(910),
            served(912, "tail", Answer::Abandoned),
        ]
    }

    #[test]
    fn a_paid_hedge_after_its_delay_whose_loser_is_abandoned_holds() {
        let (v, figure) = verdict(HEDGED, &won_by_the_hedge());
        assert_eq!(v, Verdict::Held);
        assert_eq!(
            figure,
            "1 hedges in 1 calls; 1 losing requests abandoned at their servers"
        );
        // Without a budget there is nothing to pay.
        let free = HEDGED.replace("[hardening.retry_budget]\nratio = 0.2\n", "");
        let unpaid: Vec<TraceEvent> = won_by_the_hedge()
            .into_iter()
            .filter(|e| !matches!(e.kind, Kind::Budget { .. }))
            .collect();
        assert_eq!(verdict(&free, &unpaid).0, Verdict::Held);
    }

    #[test]
    fn an_unpaid_hedge_is_caught() {
        for paid in [None, Some(false)] {
            let mut events = won_by_the_hedge();
            events.remove(1);
            if let Some(granted) = paid {
                events.insert(1, withdrawal(805, granted));
            }
            match verdict(HEDGED, &events).0 {
                Verdict::Violated { detail, t_us, .. } => {
                    assert_eq!(t_us, 805_000);
                    assert_eq!(
                        detail,
                        "call 1 hedged from kg:circuit:tail to kg:circuit:spare without a withdrawal granted by the retry budget"
                    );
                }
                other => panic!("{other:?}"),
            }
        }
        // A withdrawal a retry or a request spent before it does not pay for it.
        for spent in [
            Kind::Request { server: "tail".into() },
            Kind::Retry {
                attempt: 1,
                delay_us: 0,
                floor_us: 0,
            },
        ] {
            let mut events = won_by_the_hedge();
            events.insert(2, in_call(805, spent));
            assert!(matches!(verdict(HEDGED, &events).0, Verdict::Violated { .. }));
        }
        // The breaker's admission between the grant and the hedge does not.
        let mut events = won_by_the_hedge();
        events.insert(
            2,
            in_call(
                805,
                Kind::Allowed {
                    breaker: "kg:circuit:spare".into(),
                    state: redstring::CircuitState::Closed,
                    probe: None,
                    at_us: 805_000,
                },
            ),
        );
        assert_eq!(verdict(HEDGED, &events).0, Verdict::Held);
    }

    #[test]
    fn an_early_hedge_or_one_too_many_is_caught() {
        let early = [request(0, "tail"), withdrawal(799, true), hedged(799), ended(900)];
        match verdict(HEDGED, &early).0 {
            Verdict::Violated { detail, .. } => assert_eq!(
                detail,
                "call 1 hedged from kg:circuit:tail to kg:circuit:spare 799 ms after its request, before the delay of 800 ms"
            ),
            other => panic!("{other:?}"),
        }
        let twice = [
            request(0, "tail"),
            withdrawal(800, true),
            hedged(800),
            request(800, "spare"),
            withdrawal(1600, true),
            hedged(1600),
            ended(1700),
        ];
        match verdict(HEDGED, &twice).0 {
            Verdict::Violated { detail, .. } => assert_eq!(detail, "call 1 hedged 2 times (at most 1)"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            verdict(&HEDGED.replace("max_hedges = 1", "max_hedges = 2"), &twice).0,
            Verdict::Held
        );
    }

    #[test]
    fn a_loser_answered_after_the_call_ended_is_caught() {
        let mut events = won_by_the_hedge();
        events.pop();
        events.push(served(3000, "tail", Answer::Ok));
        match verdict(HEDGED, &events).0 {
            Verdict::Violated { detail, t_us, .. } => {
                assert_eq!(t_us, 3_000_000);
                assert_eq!(
                    detail,
                    "tail answered w's call 1 2090 ms after it ended with a hedge's answer (more than a one-way latency, 15 ms, after): the losing attempt was not cancelled"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_loser_answered_before_the_disconnect_could_reach_its_server_holds() {
        // Within a one-way latency and a tick of the call's end.
        let mut events = won_by_the_hedge();
        events.pop();
        events.push(served(925, "tail", Answer::Ok));
        assert_eq!(verdict(HEDGED, &events).0, Verdict::Held);
        // On a link a partition cut, the server never hears of it.
        let mut late = won_by_the_hedge();
        late.pop();
        late.push(served(3000, "tail", Answer::Ok));
        let cut = format!("{HEDGED}\n[[faults]]\nkind = \"partition\"\nat_s = 50\na = \"w\"\nb = \"tail\"\n");
        assert_eq!(verdict(&cut, &late).0, Verdict::Held);
    }

    #[test]
    fn without_hedging_or_a_hedge_there_is_nothing_to_judge() {
        let off = HEDGED.replace("hedge_after_ms = 800\n", "");
        assert!(matches!(
            verdict(&off, &won_by_the_hedge()).0,
            Verdict::NotApplicable { .. }
        ));
        let calm = [request(0, "tail"), served(100, "tail", Answer::Ok), ended(110)];
        assert!(matches!(verdict(HEDGED, &calm).0, Verdict::NotApplicable { .. }));
    }
}
