//! Per-call promises: the limiter and the breaker are per call, retry is per
//! attempt, and retries are spread by their jitter.
//!
//! Both checkers read what each call's own task recorded (events carry the
//! call's number, [`TraceEvent::call`]), so they hold every call to its own
//! layers however many calls a worker interleaves.

use std::collections::{BTreeMap, BTreeSet};

use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::trace::{Kind, TraceEvent};
use crate::hosts::worker::breaker_prefix;

/// Invariant 8: a call takes at most one limiter slot and at most one
/// admission from each breaker, however many attempts it makes — retry sits
/// inside both. A call routed over several servers is admitted once by each
/// server's breaker it goes to, and a retry back to one it already holds an
/// admission from takes no second one. The one exception is the core's
/// own: a server's own limit (`hardening.deployment_rpm`) that refuses the
/// attempt there makes the call hand back that server's admission, when no
/// request was sent under it, before it sleeps the limit's wait, and the
/// call is admitted afresh after it.
pub(super) fn once_per_call(_ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    // (host, call) → slots, and (host, call, breaker) → admissions
    let mut per_call: BTreeMap<(&str, u64), u32> = BTreeMap::new();
    let mut per_breaker: BTreeMap<(&str, u64, String), u32> = BTreeMap::new();
    // (host, call, breaker) a request was sent under.
    let mut used: BTreeSet<(&str, u64, String)> = BTreeSet::new();
    let (mut most_slots, mut most_admissions, mut verdict) = (0, 0, Verdict::Held);
    for e in events {
        let Some(call) = e.call else { continue };
        let key = (e.host.as_ref(), call);
        let slots = per_call.entry(key).or_default();
        let (slots, admissions) = match &e.kind {
            Kind::Admitted { .. } => {
                *slots += 1;
                (*slots, 0)
            }
            Kind::Allowed { breaker, .. } => {
                let admissions = per_breaker.entry((key.0, call, breaker.to_string())).or_default();
                *admissions += 1;
                (0, *admissions)
            }
            // A request there uses the admission: the core keeps it.
            Kind::Request { server } => {
                used.insert((key.0, call, breaker_prefix(server)));
                continue;
            }
            // The core hands back an unused admission when the server's own
            // limit refuses the attempt it was taken for.
            Kind::DeploymentLimited { server, .. } => {
                let held = (key.0, call, breaker_prefix(server));
                if !used.contains(&held) {
                    per_breaker.remove(&held);
                }
                continue;
            }
            _ => continue,
        };
        most_slots = most_slots.max(slots);
        most_admissions = most_admissions.max(admissions);
        if verdict == Verdict::Held {
            if slots > 1 {
                verdict = violated(e, format!("call {call} took {slots} limiter slots"));
            } else if admissions > 1 {
                let breaker = match &e.kind {
                    Kind::Allowed { breaker, .. } => breaker.as_ref(),
                    _ => "",
                };
                verdict = violated(
                    e,
                    format!("call {call} took {admissions} breaker admissions from {breaker}"),
                );
            }
        }
    }
    if per_call.is_empty() {
        return not_applicable("no call reached the breaker or the limiter");
    }
    (
        verdict,
        format!(
            "{} calls; most limiter slots for one call: {most_slots}; most breaker admissions: {most_admissions}",
            per_call.len()
        ),
    )
}

/// The fewest schedule-decided retries after one attempt number worth
/// judging: fewer say nothing about spread.
const MIN_RETRIES: usize = 3;

/// Invariant 9: retries are spread by the configured jitter, whoever chose
/// the wait. Of the retries after the same attempt number, no more than half
/// may sit exactly at the unjittered wait: the schedule's base delay, or —
/// where a server asked for longer (`Retry-After`) — the wait it asked for,
/// which the jitter spreads upwards. With jitter `j` a draw lands exactly
/// there with probability about one in `delay · j` microseconds. Waits whose
/// jitter band is under a millisecond wide are not judged (the microsecond
/// trace cannot tell them apart).
pub(super) fn retry_jitter(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let h = &ctx.scenario.hardening;
    if h.jitter == 0.0 {
        return not_applicable("jitter is 0: retries are not spread by design");
    }
    let Ok(policy) = h.retry_policy() else {
        return not_applicable("the retry policy is invalid");
    };
    // attempt → (retries judged, retries at exactly the unjittered wait)
    let mut by_attempt: BTreeMap<u32, (usize, usize, Option<&TraceEvent>)> = BTreeMap::new();
    let (mut floored, mut floored_exact) = (0usize, 0usize);
    for e in events {
        let Kind::Retry {
            attempt,
            delay_us,
            floor_us,
        } = &e.kind
        else {
            continue;
        };
        let base = policy.base_delay(attempt.saturating_sub(1));
        let base_us = u64::try_from(base.as_micros()).unwrap_or(u64::MAX);
        // The server's wait binds when it is longer than the schedule's
        // longest jittered delay; between the two, either may have.
        let most_scheduled = base.as_secs_f64() * (1.0 + h.jitter) * 1e6;
        let (unjittered_us, band_us) = if *floor_us as f64 > most_scheduled {
            (*floor_us, *floor_us as f64 * h.jitter)
        } else if delay_us > floor_us {
            (base_us, base.as_secs_f64() * h.jitter * 2e6)
        } else {
            continue;
        };
        if band_us < 1000.0 {
            continue;
        }
        let exact = *delay_us == unjittered_us;
        if unjittered_us == *floor_us {
            floored += 1;
            floored_exact += usize::from(exact);
        }
        let entry = by_attempt.entry(*attempt).or_default();
        entry.0 += 1;
        if exact {
            entry.1 += 1;
            entry.2 = Some(e);
        }
    }
    let judged: usize = by_attempt.values().map(|(n, _, _)| n).sum();
    if judged == 0 {
        return not_applicable("no retry waited a jittered wait");
    }
    let mut verdict = Verdict::Held;
    for (attempt, (n, exact, last)) in &by_attempt {
        if *n >= MIN_RETRIES
            && 2 * exact > *n
            && let Some(e) = last
        {
            verdict = violated(
                e,
                format!("{exact} of {n} retries after attempt {attempt} waited exactly the unjittered wait"),
            );
            break;
        }
    }
    let exact: usize = by_attempt.values().map(|(_, x, _)| x).sum();
    (
        verdict,
        format!(
            "{judged} retries judged ({floored} on a server's wait); {exact} at exactly the unjittered wait ({floored_exact} of them a server's)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use redstring::CircuitState;

    use super::super::Ctx;
    use super::*;
    use crate::evidence::trace::Decider;
    use crate::scenario::{Scenario, tenant};

    const SCENARIO: &str = r#"
name = "calls"
duration_s = 100
[hardening]
rpm = 100
initial_delay_s = 1
multiplier = 2
max_delay_s = 8
jitter = 0.1
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 1 }]
"#;

    fn scenario(jitter: f64) -> Scenario {
        let text = SCENARIO.replace("jitter = 0.1", &format!("jitter = {jitter}"));
        Scenario::parse("calls.toml", &text).unwrap()
    }

    fn in_call(call: u64, t_us: u64, kind: Kind) -> TraceEvent {
        super::super::event(t_us, "w", Some(call), kind)
    }

    fn slot(call: u64, t_us: u64) -> TraceEvent {
        in_call(
            call,
            t_us,
            Kind::Admitted {
                tenant: tenant(1),
                remaining: 5,
                at_us: t_us,
                decided_by: Decider::Cache,
            },
        )
    }

    fn admission(call: u64, t_us: u64) -> TraceEvent {
        admission_from(call, t_us, "b")
    }

    fn admission_from(call: u64, t_us: u64, breaker: &str) -> TraceEvent {
        in_call(
            call,
            t_us,
            Kind::Allowed {
                breaker: breaker.into(),
                state: CircuitState::Closed,
                probe: None,
                at_us: t_us,
            },
        )
    }

    fn retry(call: u64, attempt: u32, delay_us: u64, floor_us: u64) -> TraceEvent {
        in_call(
            call,
            0,
            Kind::Retry {
                attempt,
                delay_us,
                floor_us,
            },
        )
    }

    #[test]
    fn a_servers_limit_refusal_frees_an_unused_admission_only() {
        let s = scenario(0.1);
        let ctx = Ctx::new(&s);
        let limited = |call, t_us| {
            in_call(
                call,
                t_us,
                Kind::DeploymentLimited {
                    server: "gpu".into(),
                    priority: redstring::Priority::Low,
                    retry_after_us: 1,
                    at_us: t_us,
                    decided_by: Decider::Cache,
                },
            )
        };
        let gpu = breaker_prefix("gpu");
        let request = |call, t_us| in_call(call, t_us, Kind::Request { server: "gpu".into() });
        // Admitted, refused by the limit before any request, admitted again.
        let handed_back = [admission_from(1, 1, &gpu), limited(1, 2), admission_from(1, 3, &gpu)];
        assert_eq!(once_per_call(&ctx, &handed_back).0, Verdict::Held);
        // A request went out under the admission: the core keeps it, so a
        // second admission after the limit's refusal is one too many.
        let kept = [
            admission_from(1, 1, &gpu),
            request(1, 2),
            limited(1, 3),
            admission_from(1, 4, &gpu),
        ];
        assert!(matches!(once_per_call(&ctx, &kept).0, Verdict::Violated { .. }));
    }

    #[test]
    fn one_slot_and_one_admission_per_call_holds_across_interleaved_calls() {
        let s = scenario(0.1);
        let events = [admission(1, 1), admission(2, 2), slot(2, 3), slot(1, 4)];
        let (verdict, figure) = once_per_call(&Ctx::new(&s), &events);
        assert_eq!(verdict, Verdict::Held, "{figure}");
        assert!(figure.contains("2 calls"), "{figure}");
    }

    #[test]
    fn a_second_slot_or_admission_for_one_call_is_a_violation() {
        let s = scenario(0.1);
        let (slots, _) = once_per_call(&Ctx::new(&s), &[slot(1, 1), slot(2, 2), slot(1, 3)]);
        assert!(
            matches!(&slots, Verdict::Violated { t_us: 3, detail, .. } if detail.contains("call 1 took 2 limiter slots")),
            "{slots:?}"
        );
        let (admissions, _) = once_per_call(&Ctx::new(&s), &[admission(7, 1), admission(7, 2)]);
        let (routed, _) = once_per_call(&Ctx::new(&s), &[admission(7, 1), admission_from(7, 2, "kg:circuit:b")]);
        assert_eq!(routed, Verdict::Held, "one admission from each of two breakers");
        assert!(
            matches!(&admissions, Verdict::Violated { detail, .. } if detail.contains("2 breaker admissions")),
            "{admissions:?}"
        );
    }

    #[test]
    fn jittered_retries_hold_and_unjittered_ones_are_caught() {
        let s = scenario(0.1);
        // After attempt 1 the base is 1 s; after attempt 2, 2 s.
        let jittered = [
            retry(1, 1, 950_123, 0),
            retry(2, 1, 1_040_001, 0),
            retry(3, 1, 1_000_000, 0),
        ];
        assert_eq!(
            retry_jitter(&Ctx::new(&s), &jittered).0,
            Verdict::Held,
            "one draw on the base is chance"
        );
        let synchronised = [
            retry(1, 2, 2_000_000, 0),
            retry(2, 2, 2_000_000, 0),
            retry(3, 2, 2_000_000, 0),
        ];
        let (verdict, _) = retry_jitter(&Ctx::new(&s), &synchronised);
        assert!(
            matches!(&verdict, Verdict::Violated { detail, .. } if detail.contains("3 of 3 retries after attempt 2")),
            "{verdict:?}"
        );
    }

    #[test]
    fn a_servers_wait_must_be_spread_too_and_zero_jitter_is_not_judged() {
        let s = scenario(0.1);
        // Three callers told to wait 600 s who all wait exactly 600 s come
        // back together: the synchronised retries a server's wait makes.
        let floored = [
            retry(1, 1, 600_000_000, 600_000_000),
            retry(2, 1, 600_000_000, 600_000_000),
            retry(3, 1, 600_000_000, 600_000_000),
        ];
        let (verdict, figure) = retry_jitter(&Ctx::new(&s), &floored);
        assert!(
            matches!(&verdict, Verdict::Violated { detail, .. } if detail.contains("3 of 3 retries after attempt 1")),
            "{verdict:?}"
        );
        assert!(figure.contains("3 on a server's wait"), "{figure}");
        // Spread above the wait asked: held.
        let spread = [
            retry(1, 1, 612_000_000, 600_000_000),
            retry(2, 1, 633_000_000, 600_000_000),
            retry(3, 1, 600_000_000, 600_000_000),
        ];
        assert_eq!(retry_jitter(&Ctx::new(&s), &spread).0, Verdict::Held);
        let exact = scenario(0.0);
        let synchronised = [
            retry(1, 1, 1_000_000, 0),
            retry(2, 1, 1_000_000, 0),
            retry(3, 1, 1_000_000, 0),
        ];
        assert!(matches!(
            retry_jitter(&Ctx::new(&exact), &synchronised).0,
            Verdict::NotApplicable { .. }
        ));
    }
}
