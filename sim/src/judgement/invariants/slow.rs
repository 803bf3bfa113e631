//! Slow-call breaking: a server that answers slowly is counted as failing.
//!
//! Under `hardening.slow_call_ms` a successful answer that took longer
//! than the threshold must reach its breaker as a failure — the trace shows
//! the provider counting it ([`Kind::SlowCall`]) and its breaker clearing
//! nothing and closing nothing on it — and a faster one must not. The
//! duration judged is the worker's transport's own timing of the answering
//! request, on the worker's clock ([`CallEnded::answer_us`]), not
//! the provider's.

use std::collections::BTreeMap;

use redstring::CircuitState;

use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::outcome::CallOutcome;
use crate::evidence::trace::{CallEnded, Kind, TraceEvent};
use crate::hosts::worker::breaker_prefix;

/// What one call showed since its last request: where it went, and what
/// the provider and the breakers said after it.
#[derive(Default)]
struct SinceLast {
    /// The server of the call's last request.
    server: Option<String>,
    /// Each slow call the provider counted: its breaker and duration.
    slow: Vec<(String, u64)>,
    /// Breakers that heard a failure.
    failed: Vec<String>,
    /// Breakers that heard a success: a failure count cleared, or a
    /// half-open circuit closed.
    succeeded: Vec<String>,
}

/// Invariant 18: under a slow-call threshold, every call that succeeded
/// after its answering request took longer than `slow_call_ms` (timed by
/// the worker's transport) shows, after that request, the provider counting
/// it slow at that server's breaker, with the same duration, and that
/// breaker hearing no success; every one that took no longer shows neither
/// a slow count nor a failure at that breaker.
pub(super) fn slow_calls_counted(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let Some(ms) = ctx.scenario.hardening.slow_call_ms else {
        return not_applicable("no slow-call threshold configured");
    };
    let threshold_us = ms.saturating_mul(1000);
    let mut calls: BTreeMap<(&str, u64), SinceLast> = BTreeMap::new();
    let (mut slow, mut fast) = (0u64, 0u64);
    let mut verdict = Verdict::Held;
    for e in events {
        if let Kind::CallEnd(end) = &e.kind
            && let CallEnded {
                call,
                outcome: CallOutcome::Ok,
                answer_us: Some(took),
                ..
            } = &**end
        {
            let Some(seen) = calls.remove(&(e.host.as_ref(), *call)) else {
                continue;
            };
            let Some(server) = &seen.server else { continue };
            let breaker = breaker_prefix(server);
            let counted: Vec<u64> = seen
                .slow
                .iter()
                .filter(|(b, _)| *b == breaker)
                .map(|(_, t)| *t)
                .collect();
            let wrong = if *took > threshold_us {
                slow += 1;
                if counted.is_empty() {
                    Some(format!(
                        "call {call} answered by {server} in {} ms, over the threshold of {ms} ms, was not counted slow",
                        took / 1000
                    ))
                } else if counted != [*took] {
                    Some(format!(
                        "call {call} answered by {server} in {took} µs was counted slow at {counted:?} µs"
                    ))
                } else if seen.succeeded.contains(&breaker) {
                    Some(format!(
                        "call {call} answered by {server} in {} ms, over the threshold of {ms} ms, was reported to {breaker} as a success",
                        took / 1000
                    ))
                } else {
                    None
                }
            } else {
                fast += 1;
                if !counted.is_empty() || seen.failed.contains(&breaker) {
                    Some(format!(
                        "call {call} answered by {server} in {} ms, within the threshold of {ms} ms, was reported to {breaker} as a failure",
                        took / 1000
                    ))
                } else {
                    None
                }
            };
            if let (Some(detail), Verdict::Held) = (wrong, &verdict) {
                verdict = violated(e, detail);
            }
            continue;
        }
        let Some(call) = e.call else { continue };
        let seen = calls.entry((e.host.as_ref(), call)).or_default();
        match &e.kind {
            Kind::Request { server } => {
                *seen = SinceLast {
                    server: Some(server.to_string()),
                    ..SinceLast::default()
                };
            }
            Kind::SlowCall { breaker, took_us } => seen.slow.push((breaker.to_string(), *took_us)),
            Kind::FailureRecorded { breaker, .. } => seen.failed.push(breaker.to_string()),
            Kind::FailuresCleared { breaker, .. }
            | Kind::Breaker {
                breaker,
                from: CircuitState::HalfOpen,
                to: CircuitState::Closed,
                ..
            } => seen.succeeded.push(breaker.to_string()),
            _ => {}
        }
    }
    if slow + fast == 0 {
        return not_applicable("no call succeeded");
    }
    (
        verdict,
        format!("{slow} successes over {ms} ms counted slow, {fast} within it counted as successes"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judgement::invariants::{Invariant, check_all, event};
    use crate::scenario::Scenario;

    const SLOW: &str = r#"
name = "synthetic"
duration_s = 100
[hardening]
rpm = 60
failure_threshold = 2
request_timeout_s = 10
slow_call_ms = 2000
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 1 }]
"#;

    fn verdict(text: &str, events: &[TraceEvent]) -> (Verdict, String) {
        let s = Scenario::parse("synthetic.toml", text).unwrap();
        let c = check_all(&s, events)
            .into_iter()
            .find(|c| c.name == Invariant::SlowCallsCounted)
            .unwrap();
        (c.verdict, c.figure)
    }

    fn in_call(t_ms: u64, kind: Kind) -> TraceEvent {
        event(t_ms * 1000, "w", Some(1), kind)
    }

    fn request(t_ms: u64) -> TraceEvent {
        in_call(t_ms, Kind::Request { server: "gpu".into() })
    }

    fn counted_slow(t_ms: u64, took_ms: u64) -> TraceEvent {
        in_call(
            t_ms,
            Kind::SlowCall {
                breaker: "kg:circuit:gpu".into(),
                took_us: took_ms * 1000,
            },
        )
    }

    fn failure(t_ms: u64) -> TraceEvent {
        in_call(
            t_ms,
            Kind::FailureRecorded {
                breaker: "kg:circuit:gpu".into(),
                at_us: t_ms * 1000,
            },
        )
    }

    fn cleared(t_ms: u64) -> TraceEvent {
        in_call(
            t_ms,
            Kind::FailuresCleared {
                breaker: "kg:circuit:gpu".into(),
                at_us: t_ms * 1000,
            },
        )
    }

    fn ended(t_ms: u64, took_ms: u64) -> TraceEvent {
        event(
            t_ms * 1000,
            "w",
            None,
            Kind::CallEnd(Box::new(CallEnded {
                call: 1,
                tenant: redstring::TenantId::from_u128(1),
                outcome: CallOutcome::Ok,
                attempts: 1,
                latency_ms: took_ms,
                retry_after_us: None,
                answer_us: Some(took_ms * 1000),
            })),
        )
    }

    #[test]
    fn a_slow_success_counted_slow_and_reported_as_a_failure_holds() {
        let events = [request(0), counted_slow(3000, 3000), failure(3000), ended(3000, 3000)];
        let (v, figure) = verdict(SLOW, &events);
        assert_eq!(v, Verdict::Held);
        assert_eq!(
            figure,
            "1 successes over 2000 ms counted slow, 0 within it counted as successes"
        );
        // A fast one that clears the count holds too.
        let fast = [request(0), cleared(1500), ended(1500, 1500)];
        assert_eq!(verdict(SLOW, &fast).0, Verdict::Held);
    }

    #[test]
    fn a_slow_success_reported_as_a_success_is_caught() {
        // Not counted at all: a breaker that hears only errors.
        let ignored = [request(0), cleared(3000), ended(3000, 3000)];
        match verdict(SLOW, &ignored).0 {
            Verdict::Violated { detail, t_us, .. } => {
                assert_eq!(t_us, 3_000_000);
                assert_eq!(
                    detail,
                    "call 1 answered by gpu in 3000 ms, over the threshold of 2000 ms, was not counted slow"
                );
            }
            other => panic!("{other:?}"),
        }
        // Counted, but its breaker heard a success: it closed a half-open circuit.
        let closed = [
            request(0),
            counted_slow(3000, 3000),
            in_call(
                3000,
                Kind::Breaker {
                    breaker: "kg:circuit:gpu".into(),
                    from: CircuitState::HalfOpen,
                    to: CircuitState::Closed,
                    at_us: 3_000_000,
                },
            ),
            ended(3000, 3000),
        ];
        match verdict(SLOW, &closed).0 {
            Verdict::Violated { detail, .. } => assert!(detail.ends_with("as a success"), "{detail}"),
            other => panic!("{other:?}"),
        }
        // Counted for a span other than the answer's.
        let mismeasured = [request(0), counted_slow(3000, 2500), ended(3000, 3000)];
        assert!(matches!(verdict(SLOW, &mismeasured).0, Verdict::Violated { .. }));
    }

    #[test]
    fn a_fast_success_counted_slow_or_failed_is_caught() {
        // At the threshold exactly is not slower than it.
        for after in [counted_slow(2000, 2000), failure(2000)] {
            let events = [request(0), after, ended(2000, 2000)];
            match verdict(SLOW, &events).0 {
                Verdict::Violated { detail, .. } => assert_eq!(
                    detail,
                    "call 1 answered by gpu in 2000 ms, within the threshold of 2000 ms, was reported to kg:circuit:gpu as a failure"
                ),
                other => panic!("{other:?}"),
            }
        }
        // A failure reported for an earlier attempt, before the answering
        // request, is not this answer's.
        let earlier = [request(0), failure(500), request(1000), ended(2000, 1000)];
        assert_eq!(verdict(SLOW, &earlier).0, Verdict::Held);
    }

    #[test]
    fn without_a_threshold_or_a_success_there_is_nothing_to_judge() {
        let none = SLOW.replace("slow_call_ms = 2000\n", "");
        assert!(matches!(
            verdict(&none, &[request(0), ended(3000, 3000)]).0,
            Verdict::NotApplicable { .. }
        ));
        assert!(matches!(verdict(SLOW, &[request(0)]).0, Verdict::NotApplicable { .. }));
    }
}
