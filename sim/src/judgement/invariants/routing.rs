//! The router's promises to whoever operates it: no call passes over a
//! deployment unseen, and a call refused everywhere says when to come back.
//!
//! A router that skips a failing deployment without saying so leaves its
//! operators asking whether the breaker works at all and what state it is
//! in. Kept apart from `breaker.rs`: this is about what the events of a
//! routed call show, not about the circuit's own decisions.

use std::collections::{BTreeMap, BTreeSet};

use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::outcome::CallOutcome;
use crate::evidence::trace::{Kind, TraceEvent};
use crate::hosts::worker::breaker_prefix;
use crate::scenario::Routing;

/// What one call showed before its first request.
#[derive(Default)]
struct Shown {
    /// Breakers named by a refusal or a deferral in the call.
    named: BTreeSet<String>,
    /// A cache could not be reached in the call (the fallback may have
    /// decided where it went, and names no breaker).
    unreachable: bool,
    /// Its first request was judged.
    sent: bool,
}

/// Invariant 15: under ordered routing, a call whose first request goes to
/// a server after the first in its worker's list has, before that request,
/// an event naming each server ahead of it — its breaker's refusal (with the
/// circuit's state, or the cooldown), or the call's deferral of it (known
/// to refuse, and why). Weighted and least-loaded routing pick the first
/// server by draw or load, so only ordered routing says where a call would
/// have gone; a call in which a cache could not be reached is not judged.
pub(super) fn skips_visible(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    match ctx.scenario.hardening.routing {
        None => return not_applicable("no routing: each worker calls one server"),
        Some(Routing::Weighted | Routing::LeastLoaded) => {
            return not_applicable("only ordered routing says where a call would go first");
        }
        Some(Routing::Ordered) => {}
    }
    let servers: BTreeMap<String, Vec<String>> =
        ctx.scenario.fleet().into_iter().map(|m| (m.name, m.servers)).collect();
    let mut calls: BTreeMap<(&str, u64), Shown> = BTreeMap::new();
    let (mut routed_past, mut unseen) = (0u64, 0u64);
    let mut verdict = Verdict::Held;
    for e in events {
        let Some(call) = e.call else { continue };
        let shown = calls.entry((e.host.as_ref(), call)).or_default();
        match &e.kind {
            // A slow start's draw that passes a call on names the ramping
            // server too (and one that keeps it names it harmlessly).
            // So does a server's adaptive limit refusing the call.
            Kind::Rejected { breaker, .. }
            | Kind::CooldownRefused { breaker, .. }
            | Kind::Deferred { breaker, .. }
            | Kind::SlowStart { breaker, .. }
            | Kind::ConcurrencyRefused { breaker, .. } => {
                shown.named.insert(breaker.to_string());
            }
            Kind::CacheUnavailable { .. } => shown.unreachable = true,
            Kind::Request { server } if !shown.sent => {
                shown.sent = true;
                let Some(list) = servers.get(e.host.as_ref()) else {
                    continue;
                };
                let Some(at) = list.iter().position(|s| **s == **server) else {
                    continue;
                };
                if at == 0 || shown.unreachable {
                    continue;
                }
                routed_past += 1;
                let missing = list[..at]
                    .iter()
                    .find(|ahead| !shown.named.contains(&breaker_prefix(ahead)));
                if let Some(ahead) = missing {
                    unseen += 1;
                    if verdict == Verdict::Held {
                        verdict = violated(
                            e,
                            format!("call {call} went to {server} past {ahead} with no event naming {ahead}"),
                        );
                    }
                }
            }
            _ => {}
        }
    }
    if routed_past == 0 {
        return not_applicable("no call went past the first server in its list");
    }
    (
        verdict,
        format!("{routed_past} calls went past a server ahead of theirs; {unseen} without an event naming it"),
    )
}

/// A call's refusals so far: each breaker's latest, as (when, wait), µs.
type Refusals = BTreeMap<String, (u64, u64)>;

/// Invariant 16: a call every breaker refused ends with an error that says
/// when to come back — its [`retry_after`](redstring::provider::ExtractError::retry_after)
/// is not zero, and it ends at the soonest instant a refusal in the call
/// said a breaker would admit again (each breaker's latest refusal, its
/// instant plus its wait; a zero wait says nothing and is not counted):
/// no earlier (one millisecond of rounding), and no later than the time the
/// call's last refusals took to arrive allows. So a gateway
/// in front of redstring can answer its own caller with `Retry-After`, and
/// that instant is the first at which a deployment may take the call.
pub(super) fn retry_after_returned(_ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let mut calls: BTreeMap<(&str, u64), Refusals> = BTreeMap::new();
    let (mut judged, mut silent, mut early, mut late) = (0u64, 0u64, 0u64, 0u64);
    let mut verdict = Verdict::Held;
    for e in events {
        // A call's own events carry its number; its end names it itself.
        let call = match &e.kind {
            Kind::CallEnd(end) => end.call,
            _ => match e.call {
                Some(call) => call,
                None => continue,
            },
        };
        let key = (e.host.as_ref(), call);
        match &e.kind {
            Kind::Rejected {
                breaker,
                retry_after_us,
                ..
            }
            | Kind::CooldownRefused {
                breaker,
                retry_after_us,
                ..
            } => {
                calls
                    .entry(key)
                    .or_default()
                    .insert(breaker.to_string(), (e.t_us, *retry_after_us));
            }
            Kind::Allowed { breaker, .. } => {
                if let Some(refusals) = calls.get_mut(&key) {
                    refusals.remove(breaker.as_ref());
                }
            }
            Kind::CallEnd(end) if matches!(end.outcome, CallOutcome::CircuitOpen | CallOutcome::Cooldown) => {
                let refusals = calls.remove(&key).unwrap_or_default();
                let known = refusals.values().filter(|(_, wait)| *wait > 0);
                let Some(soonest) = known.clone().map(|(t, wait)| t.saturating_add(*wait)).min() else {
                    continue;
                };
                let first = known.map(|(t, _)| *t).min().unwrap_or(e.t_us);
                judged += 1;
                let handed = end.retry_after_us.unwrap_or(0);
                // The refusals took `e.t_us - first` to arrive; a wait is
                // counted from its own refusal. One millisecond of rounding.
                let allowed = soonest
                    .saturating_add(e.t_us.saturating_sub(first))
                    .saturating_add(1_000);
                let problem = if handed == 0 {
                    silent += 1;
                    Some(format!(
                        "call {call} was refused by every breaker and handed back no wait; one admits again in {} ms",
                        soonest.saturating_sub(e.t_us) / 1000
                    ))
                } else if e.t_us.saturating_add(handed).saturating_add(1_000) < soonest {
                    // The soonest wait was measured before the call ended:
                    // handed back, it can only end at or after the soonest.
                    early += 1;
                    Some(format!(
                        "call {call} was told to come back in {} ms; no breaker admits again for {} ms",
                        handed / 1000,
                        soonest.saturating_sub(e.t_us) / 1000
                    ))
                } else if e.t_us.saturating_add(handed) > allowed {
                    late += 1;
                    Some(format!(
                        "call {call} was told to come back in {} ms; a breaker admits again in {} ms",
                        handed / 1000,
                        soonest.saturating_sub(e.t_us) / 1000
                    ))
                } else {
                    None
                };
                if let Some(detail) = problem
                    && verdict == Verdict::Held
                {
                    verdict = violated(e, detail);
                }
            }
            Kind::CallEnd { .. } => {
                calls.remove(&key);
            }
            _ => {}
        }
    }
    if judged == 0 {
        return not_applicable("no call was refused by every breaker with a known wait");
    }
    (
        verdict,
        format!(
            "{judged} calls refused by every breaker; {silent} handed back no wait, {early} an earlier one than the soonest, {late} a later one"
        ),
    )
}

#[cfg(test)]
mod tests {
    use redstring::CircuitState;

    use super::super::{Invariant, check_all, event};
    use super::*;
    use crate::evidence::trace::CallEnded;
    use crate::scenario::Scenario;

    const ROUTED: &str = r#"
name = "synthetic"
duration_s = 100
[hardening]
rpm = 100
routing = "ordered"
[[servers]]
name = "a"
[[servers]]
name = "b"
[[workers]]
name = "w"
servers = ["a", "b"]
tenants = [{ id = 1, calls_per_min = 1 }]
"#;

    fn verdict(text: &str, events: &[TraceEvent]) -> Verdict {
        let s = Scenario::parse("synthetic.toml", text).unwrap();
        check_all(&s, events)
            .into_iter()
            .find(|c| c.name == Invariant::SkipsVisible)
            .map(|c| c.verdict)
            .unwrap()
    }

    fn request(t: u64, call: u64, server: &str) -> TraceEvent {
        event(t, "w", Some(call), Kind::Request { server: server.into() })
    }

    #[test]
    fn a_call_past_a_deployment_needs_an_event_naming_it() {
        let rejected = event(
            1,
            "w",
            Some(1),
            Kind::Rejected {
                breaker: "kg:circuit:a".into(),
                state: CircuitState::Open,
                retry_after_us: 5,
            },
        );
        let deferred = event(
            3,
            "w",
            Some(2),
            Kind::Deferred {
                breaker: "kg:circuit:a".into(),
                state: "open",
                until_us: 9,
            },
        );
        let seen = [
            rejected,
            request(2, 1, "b"),
            deferred,
            request(4, 2, "b"),
            request(5, 3, "a"),
        ];
        assert_eq!(verdict(ROUTED, &seen), Verdict::Held);
        // Call 4 goes to b with nothing said about a; a retry's request
        // (call 1's second) is not its first and is not judged.
        let unseen = [request(6, 4, "b"), request(7, 4, "a")];
        match verdict(ROUTED, &unseen) {
            Verdict::Violated { t_us, detail, .. } => {
                assert_eq!(t_us, 6);
                assert_eq!(detail, "call 4 went to b past a with no event naming a");
            }
            other => panic!("{other:?}"),
        }
        let weighted = ROUTED.replace("\"ordered\"", "\"weighted\"");
        assert!(matches!(verdict(&weighted, &unseen), Verdict::NotApplicable { .. }));
    }

    fn refused(t: u64, breaker: &str, wait_us: u64) -> TraceEvent {
        event(
            t,
            "w",
            Some(1),
            Kind::Rejected {
                breaker: format!("kg:circuit:{breaker}").into(),
                state: CircuitState::Open,
                retry_after_us: wait_us,
            },
        )
    }

    fn ended(t: u64, retry_after_us: Option<u64>) -> TraceEvent {
        event(
            t,
            "w",
            None,
            Kind::CallEnd(Box::new(CallEnded {
                call: 1,
                tenant: redstring::TenantId::from_u128(1),
                outcome: CallOutcome::CircuitOpen,
                attempts: 0,
                latency_ms: 0,
                retry_after_us,
                answer_us: None,
            })),
        )
    }

    fn returned(events: &[TraceEvent]) -> Verdict {
        let s = Scenario::parse("synthetic.toml", ROUTED).unwrap();
        check_all(&s, events)
            .into_iter()
            .find(|c| c.name == Invariant::RetryAfterReturned)
            .map(|c| c.verdict)
            .unwrap()
    }

    #[test]
    fn a_call_every_breaker_refuses_is_told_the_soonest_wait() {
        // a refuses for 9 s at 1 s, b for 3 s at 2 s: b admits first, at 5 s.
        let refusals = [refused(1_000_000, "a", 9_000_000), refused(2_000_000, "b", 3_000_000)];
        let with = |end: TraceEvent| {
            let mut events = refusals.to_vec();
            events.push(end);
            returned(&events)
        };
        assert_eq!(with(ended(2_000_000, Some(3_000_000))), Verdict::Held);
        match with(ended(2_000_000, Some(8_000_000))) {
            Verdict::Violated { detail, .. } => {
                assert_eq!(
                    detail,
                    "call 1 was told to come back in 8000 ms; a breaker admits again in 3000 ms"
                );
            }
            other => panic!("{other:?}"),
        }
        match with(ended(2_000_000, Some(1_000_000))) {
            Verdict::Violated { detail, .. } => {
                assert_eq!(
                    detail,
                    "call 1 was told to come back in 1000 ms; no breaker admits again for 3000 ms"
                );
            }
            other => panic!("{other:?}"),
        }
        match with(ended(2_000_000, None)) {
            Verdict::Violated { detail, .. } => assert!(detail.contains("handed back no wait"), "{detail}"),
            other => panic!("{other:?}"),
        }
        // A breaker that admitted the call since its refusal says nothing
        // of when the call may come back.
        let mut admitted = refusals.to_vec();
        admitted.push(event(
            2_500_000,
            "w",
            Some(1),
            Kind::Allowed {
                breaker: "kg:circuit:b".into(),
                state: CircuitState::Closed,
                probe: None,
                at_us: 2_500_000,
            },
        ));
        admitted.push(ended(3_000_000, Some(7_000_000)));
        assert_eq!(returned(&admitted), Verdict::Held);
        assert!(matches!(returned(&refusals), Verdict::NotApplicable { .. }));
    }
}
