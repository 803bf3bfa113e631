//! Adaptive concurrency: no server takes more requests at once than the
//! limit in force when each was admitted.
//!
//! Under `hardening.adaptive_concurrency` each request takes a lease under
//! its server's limit before it is sent, and the trace records every
//! admission ([`Kind::ConcurrencyAdmitted`], with the limit the store held
//! then) and every end ([`Kind::ConcurrencyEnded`]). The judgement counts
//! the requests in flight itself, from those records, and holds each
//! admission to its limit: at most `limit − 1` others may be in flight in
//! its scope (the fleet's over a shared cache, the worker's otherwise).
//! Under `hardening.reserve` a low-priority admission is held to the
//! limit less its reserve: at most `limit − ⌈limit × reserve⌉ − 1` others,
//! whoever's, so the reserved requests are always free for high-priority
//! tenants — the class's share of calls in flight, as invariant 21 checks
//! it of the servers' windows.
//!
//! Events are recorded when a store's answer comes back, so the trace's
//! order is not quite the store's. The count therefore leans towards
//! fewer: another request counts against an admission only when its own
//! admission was recorded a round trip before this one's (so the store
//! surely saw it first), its end was not recorded within a round trip
//! after (so the store surely had not ended it), and it is less than half
//! its lease old (the store drops it at its lease's end). A shared cache
//! that restarts forgets every lease, and so does the count; a request
//! whose call later could not reach the step is not counted at all (its
//! end may have reached the store with the answer lost). Every excess the
//! count finds is one the store admitted.

use std::collections::BTreeMap;

use redstring::Priority;

use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::observe::CONCURRENCY_STEP;
use crate::evidence::trace::{Kind, TraceEvent};
use crate::scenario::Fault;

/// One request in flight as the judgement counts it.
struct Lease {
    /// When its admission was recorded, simulated µs.
    admitted_us: u64,
    /// When its end was recorded, if it was.
    ended_us: Option<u64>,
}

/// Invariant 22: every request an adaptive concurrency limit admitted found
/// fewer requests in flight in its scope than the limit it was admitted
/// under (less the reserve, for a low-priority one), and every limit stayed
/// within the configured `[min, max]`.
pub(super) fn concurrency_limit(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let Some(spec) = ctx.scenario.hardening.adaptive_concurrency else {
        return not_applicable("no adaptive concurrency configured");
    };
    let half_lease_us = u64::try_from(ctx.scenario.hardening.concurrency_lease().as_micros() / 2).unwrap_or(u64::MAX);
    let trip = ctx.round_trip_us;
    // When each lease's end was recorded, and when each call could not
    // reach the step: the count looks ahead.
    let mut ends: BTreeMap<(String, u64), u64> = BTreeMap::new();
    let mut unreachable: BTreeMap<(&str, u64), u64> = BTreeMap::new();
    for e in events {
        match &e.kind {
            Kind::ConcurrencyEnded { breaker, id, .. } => {
                ends.entry((ctx.scopes.breaker(e, breaker), *id)).or_insert(e.t_us);
            }
            Kind::CacheUnavailable { operation, .. } if *operation == CONCURRENCY_STEP => {
                if let Some(call) = e.call {
                    unreachable.insert((e.host.as_ref(), call), e.t_us);
                }
            }
            _ => {}
        }
    }
    let mut leases: BTreeMap<String, BTreeMap<u64, Lease>> = BTreeMap::new();
    let (mut admitted, mut refused, mut highest, mut lowest) = (0u64, 0u64, 0u64, u64::MAX);
    let reserve = ctx.scenario.hardening.reserve;
    let (mut low_admitted, mut low_refused) = (0u64, 0u64);
    let mut verdict = Verdict::Held;
    for e in events {
        match &e.kind {
            Kind::Fault { fault } if matches!(**fault, Fault::CacheUp { .. }) && ctx.scopes.shared() => leases.clear(),
            Kind::ConcurrencyAdmitted {
                breaker,
                priority,
                id,
                limit,
                ..
            } => {
                admitted += 1;
                // What a low request may not take of this limit.
                let reserved = match (priority, reserve) {
                    (Priority::Low, Some(share)) => {
                        low_admitted += 1;
                        redstring::limiter::reserve_of(*limit, share)
                    }
                    _ => 0,
                };
                highest = highest.max(*limit);
                lowest = lowest.min(*limit);
                let scope = ctx.scopes.breaker(e, breaker);
                let live = leases.entry(scope.clone()).or_default();
                live.retain(|_, l| l.admitted_us.saturating_add(half_lease_us) > e.t_us);
                let others = live
                    .values()
                    .filter(|l| {
                        l.admitted_us.saturating_add(trip) <= e.t_us
                            && l.ended_us.is_none_or(|end| end > e.t_us.saturating_add(trip))
                    })
                    .count() as u64;
                if verdict == Verdict::Held {
                    if others >= *limit {
                        verdict = violated(
                            e,
                            format!("{breaker} admitted a request with {others} in flight, at a limit of {limit}"),
                        );
                    } else if others >= limit - reserved {
                        verdict = violated(
                            e,
                            format!(
                                "{breaker} admitted a low-priority request with {others} in flight, at a limit of {limit} less {reserved} reserved for high priority"
                            ),
                        );
                    } else if *limit < u64::from(spec.min) || *limit > u64::from(spec.max) {
                        verdict = violated(
                            e,
                            format!(
                                "{breaker} held a limit of {limit}, outside [{}, {}]",
                                spec.min, spec.max
                            ),
                        );
                    }
                }
                // A call that later could not reach the step counts none
                // of its requests: ended as soon as admitted.
                let lost = e
                    .call
                    .and_then(|call| unreachable.get(&(e.host.as_ref(), call)))
                    .is_some_and(|t| *t >= e.t_us);
                let ended_us = if lost {
                    Some(e.t_us)
                } else {
                    ends.get(&(scope, *id)).copied()
                };
                live.insert(
                    *id,
                    Lease {
                        admitted_us: e.t_us,
                        ended_us,
                    },
                );
            }
            Kind::ConcurrencyRefused { priority, .. } => {
                refused += 1;
                low_refused += u64::from(*priority == Priority::Low);
            }
            _ => {}
        }
    }
    if admitted == 0 && verdict == Verdict::Held {
        return not_applicable("no request was admitted under an adaptive limit");
    }
    let lowest = if admitted == 0 { 0 } else { lowest };
    let classes = match reserve {
        Some(share) => format!(
            "; low priority: {low_admitted} admitted, {low_refused} refused, {share} of each limit kept from them"
        ),
        None => String::new(),
    };
    (
        verdict,
        format!("{admitted} requests admitted under limits of {lowest}..={highest}, {refused} refused{classes}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judgement::invariants::{Invariant, check_all, event};
    use crate::scenario::Scenario;

    /// One server, a limit of 2 that may back off to 1, per-worker caches.
    const LIMITED: &str = r#"
name = "synthetic"
duration_s = 100
[hardening]
rpm = 60
adaptive_concurrency = { initial = 2, min = 1, max = 4 }
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 1 }]
"#;

    const S: u64 = 1_000_000;
    const GPU: &str = "kg:circuit:gpu";

    fn verdict(events: &[TraceEvent]) -> (Verdict, String) {
        verdict_in(LIMITED, events)
    }

    /// Invariant 22's verdict and figure on `events` in scenario `text`.
    fn verdict_in(text: &str, events: &[TraceEvent]) -> (Verdict, String) {
        let s = Scenario::parse("synthetic.toml", text).unwrap();
        let c = check_all(&s, events)
            .into_iter()
            .find(|c| c.name == Invariant::ConcurrencyLimit)
            .unwrap();
        (c.verdict, c.figure)
    }

    fn admitted(t_us: u64, id: u64, in_flight: u64, limit: u64) -> TraceEvent {
        admitted_as(Priority::High, t_us, id, in_flight, limit)
    }

    fn admitted_as(priority: Priority, t_us: u64, id: u64, in_flight: u64, limit: u64) -> TraceEvent {
        event(
            t_us,
            "w",
            Some(id),
            Kind::ConcurrencyAdmitted {
                breaker: GPU.into(),
                priority,
                id,
                in_flight,
                limit,
            },
        )
    }

    fn ended(t_us: u64, id: u64) -> TraceEvent {
        event(
            t_us,
            "w",
            Some(id),
            Kind::ConcurrencyEnded {
                breaker: GPU.into(),
                id,
                end: redstring::decide::concurrency::CallEnd::Success,
                counted: true,
                from: 2_000_000,
                to: 2_000_000,
            },
        )
    }

    #[test]
    fn requests_within_the_limit_in_force_hold() {
        let events = [
            admitted(S, 1, 0, 2),
            admitted(2 * S, 2, 1, 2),
            ended(3 * S, 1),
            // One in flight again: a third fits, and after the limit backs
            // off to 1 a fourth fits once both have ended.
            admitted(4 * S, 3, 1, 2),
            ended(5 * S, 2),
            ended(6 * S, 3),
            admitted(7 * S, 4, 0, 1),
        ];
        let (v, figure) = verdict(&events);
        assert_eq!(v, Verdict::Held, "{figure}");
        assert_eq!(figure, "4 requests admitted under limits of 1..=2, 0 refused");
    }

    #[test]
    fn a_request_admitted_past_its_limit_is_caught() {
        let events = [
            admitted(S, 1, 0, 2),
            admitted(2 * S, 2, 1, 2),
            // The store said 2 in flight at a limit of 2, and admitted anyway.
            admitted(3 * S, 3, 2, 2),
            ended(4 * S, 1),
        ];
        let (v, _) = verdict(&events);
        assert!(
            matches!(&v, Verdict::Violated { detail, t_us, .. }
                if *t_us == 3 * S && detail.contains("with 2 in flight, at a limit of 2")),
            "{v:?}"
        );
    }

    #[test]
    fn an_end_the_store_may_have_seen_first_does_not_count() {
        // The end of request 1 is recorded just after the third admission,
        // within a round trip: the store may have ended it first.
        let events = [
            admitted(S, 1, 0, 2),
            admitted(2 * S, 2, 1, 2),
            admitted(3 * S, 3, 1, 2),
            ended(3 * S + 1, 1),
        ];
        assert_eq!(verdict(&events).0, Verdict::Held);
    }

    #[test]
    fn a_request_whose_call_lost_the_store_is_not_counted() {
        // Request 1's end reached the store, but its answer was lost: the
        // call heard the store as unreachable, and the trace has no end.
        let lost = event(
            4 * S,
            "w",
            Some(1),
            Kind::CacheUnavailable {
                operation: CONCURRENCY_STEP,
                fallback: "not ended; the lease counts until it runs out",
                admitted_call: false,
            },
        );
        let events = [
            admitted(S, 1, 0, 2),
            admitted(2 * S, 2, 1, 2),
            lost,
            admitted(5 * S, 3, 1, 2),
        ];
        assert_eq!(verdict(&events).0, Verdict::Held);
    }

    /// [`LIMITED`] with a limit of 4 keeping a quarter (one request) for
    /// high-priority tenants.
    fn verdict_reserved(events: &[TraceEvent]) -> (Verdict, String) {
        let text = LIMITED
            .replace("initial = 2, min = 1, max = 4", "initial = 4, min = 2, max = 8")
            .replace("rpm = 60", "rpm = 60\nreserve = 0.25");
        verdict_in(&text, events)
    }

    #[test]
    fn low_priority_requests_within_the_unreserved_part_hold() {
        let events = [
            admitted_as(Priority::Low, S, 1, 0, 4),
            admitted_as(Priority::Low, 2 * S, 2, 1, 4),
            admitted_as(Priority::Low, 3 * S, 3, 2, 4),
            // The fourth is the reserve's: a high request may take it.
            admitted_as(Priority::High, 4 * S, 4, 3, 4),
        ];
        let (v, figure) = verdict_reserved(&events);
        assert_eq!(v, Verdict::Held, "{figure}");
        assert!(
            figure.ends_with("low priority: 3 admitted, 0 refused, 0.25 of each limit kept from them"),
            "{figure}"
        );
    }

    #[test]
    fn a_low_priority_request_admitted_into_the_reserve_is_caught() {
        let events = [
            admitted_as(Priority::High, S, 1, 0, 4),
            admitted_as(Priority::Low, 2 * S, 2, 1, 4),
            admitted_as(Priority::Low, 3 * S, 3, 2, 4),
            // Three in flight, whoever's: the last is the high class's.
            admitted_as(Priority::Low, 4 * S, 4, 3, 4),
        ];
        let (v, _) = verdict_reserved(&events);
        assert!(
            matches!(&v, Verdict::Violated { detail, t_us, .. }
                if *t_us == 4 * S && detail.contains("low-priority request with 3 in flight, at a limit of 4 less 1 reserved")),
            "{v:?}"
        );
        // Without a reserve the same trace holds.
        assert_eq!(verdict(&events).0, Verdict::Held);
    }

    #[test]
    fn a_limit_outside_its_bounds_is_caught() {
        let (v, _) = verdict(&[admitted(S, 1, 0, 9)]);
        assert!(
            matches!(&v, Verdict::Violated { detail, .. } if detail.contains("outside [1, 4]")),
            "{v:?}"
        );
    }
}
