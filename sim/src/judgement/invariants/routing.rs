//! The router's promise to whoever operates it: no call passes over a
//! deployment unseen.
//!
//! A router that skips a failing deployment without saying so leaves its
//! operators asking whether the breaker works at all and what state it is
//! in. Kept apart from `breaker.rs`: this is about what the events of a
//! routed call show, not about the circuit's own decisions.

use std::collections::{BTreeMap, BTreeSet};

use super::{Ctx, Finding, Verdict, not_applicable, violated};
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
        let shown = calls.entry((e.host.as_str(), call)).or_default();
        match &e.kind {
            Kind::Rejected { breaker, .. } | Kind::CooldownRefused { breaker, .. } | Kind::Deferred { breaker, .. } => {
                shown.named.insert(breaker.clone());
            }
            Kind::CacheUnavailable { .. } => shown.unreachable = true,
            Kind::Request { server } if !shown.sent => {
                shown.sent = true;
                let Some(list) = servers.get(&e.host) else { continue };
                let Some(at) = list.iter().position(|s| s == server) else {
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

#[cfg(test)]
mod tests {
    use redstring::CircuitState;

    use super::super::{Invariant, check_all, event};
    use super::*;
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
}
