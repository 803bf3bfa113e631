//! Priority classes: low-priority tenants never take the reserve a server's
//! limit keeps for the high class.
//!
//! Under `hardening.deployment_rpm` with `hardening.reserve`, every slot an
//! attempt takes or is refused at a server's own limit is traced with the
//! class it asked as ([`Kind::DeploymentAdmitted`],
//! [`Kind::DeploymentLimited`]). The limit decides by its store's stamps, so
//! the judgement is in stamp time, per limit (per worker with per-worker
//! caches, fleet-wide with a shared one):
//!
//! - no window of stamps holds more low admissions than the low class's
//!   share, `rpm − reserve_of(rpm, reserve)` — times one more for each
//!   restart of a shared cache within a window, which forgets every hit (as
//!   invariant 1 allows);
//! - every high refusal found at least the reserve taken by high admissions
//!   in its window: the reserve was the high class's to use. This half
//!   counts traced admissions, so it is judged only where every hit the
//!   store holds was traced: no restart of the shared cache, no call
//!   deadline or hedge (a future dropped while its slot request is in
//!   flight leaves an untraced hit), and no cache the workers could not
//!   reach (a reply that times out after the store recorded its hit).
//!
//! Both are exact when one clock that never steps back stamps a limit's
//! decisions; otherwise there is nothing exact to judge and the invariant
//! is not applicable. Decisions a worker made without its cache (a local
//! limit, or admitted unlimited) are in no shared window and are not
//! counted.

use std::collections::BTreeMap;
use std::time::Duration;

use redstring::Priority;
use redstring::limiter::reserve_of;

use super::limiter::restarts_in_a_window;
use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::trace::{Decider, Kind, TraceEvent};
use crate::scenario::{CACHE_HOST, Fault};

/// One limit's decisions.
#[derive(Default)]
struct Limit<'a> {
    /// Low-priority admissions: stamp and event.
    low: Vec<(u64, &'a TraceEvent)>,
    /// High-priority admissions' stamps.
    high: Vec<u64>,
    /// High-priority refusals: stamp and event.
    refused: Vec<(u64, &'a TraceEvent)>,
}

/// Invariant 21: at every server's own limit with a reserve, no window holds
/// more low-priority admissions than the low class's share, and every
/// high-priority refusal found at least the reserve used by high calls in
/// its window (where every hit is traced).
pub(super) fn priority_share(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let s = ctx.scenario;
    let h = &s.hardening;
    let (Some(rpm), Some(share)) = (h.deployment_rpm, h.reserve) else {
        return not_applicable("no server's limit keeps a reserve");
    };
    if !ctx.single_clock {
        return not_applicable("a caller-stamped shared cache: the limits' stamps come from many clocks");
    }
    let shared = ctx.scopes.shared();
    let steps_back = s
        .faults
        .iter()
        .any(|f| matches!(f, Fault::ClockStep { host, by_ms, .. } if *by_ms < 0 && (host == CACHE_HOST) == shared));
    if steps_back {
        return not_applicable("a clock that stamps the limits steps back");
    }
    let reserved = usize::try_from(reserve_of(u64::from(rpm), share)).unwrap_or(usize::MAX);
    let low_share = usize::try_from(rpm).unwrap_or(usize::MAX).saturating_sub(reserved);
    let restarts = if shared {
        usize::try_from(restarts_in_a_window(s, Duration::from_micros(ctx.window_us))).unwrap_or(usize::MAX)
    } else {
        0
    };
    let low_bound = low_share.saturating_mul(restarts.saturating_add(1));
    let restarted = shared && s.faults.iter().any(|f| matches!(f, Fault::CacheUp { .. }));
    let mut untraced = if restarted {
        Some("a restart of the shared cache")
    } else if h.deadline_s.is_some() {
        Some("call deadlines")
    } else if h.hedge_after_ms.is_some() {
        Some("hedging")
    } else {
        None
    };
    let mut limits: BTreeMap<String, Limit> = BTreeMap::new();
    for e in events {
        match &e.kind {
            Kind::CacheUnavailable { .. } => {
                untraced.get_or_insert("a cache the workers could not reach");
            }
            Kind::DeploymentAdmitted {
                server,
                priority,
                at_us,
                decided_by: Decider::Cache,
            } => {
                let limit = limits.entry(ctx.scopes.breaker(e, server)).or_default();
                match priority {
                    Priority::Low => limit.low.push((*at_us, e)),
                    Priority::High => limit.high.push(*at_us),
                }
            }
            Kind::DeploymentLimited {
                server,
                priority: Priority::High,
                at_us,
                decided_by: Decider::Cache,
                ..
            } => limits
                .entry(ctx.scopes.breaker(e, server))
                .or_default()
                .refused
                .push((*at_us, e)),
            _ => {}
        }
    }
    let mut verdict = Verdict::Held;
    let (mut most_low, mut refusals, mut fewest_high) = (0, 0, None::<usize>);
    for limit in limits.values_mut() {
        limit.low.sort_by_key(|(at, _)| *at);
        // Each window of stamps starting at a low admission's stamp: every
        // window's count is at most that of the one starting at its first.
        for (i, (start, _)) in limit.low.iter().enumerate() {
            let end = start.saturating_add(ctx.window_us);
            let within = limit.low[i..].partition_point(|(at, _)| *at <= end);
            most_low = most_low.max(within);
            if within > low_bound && verdict == Verdict::Held {
                let (_, last) = limit.low[i + within - 1];
                verdict = violated(
                    last,
                    format!(
                        "{within} low-priority admissions in one window at a server's limit, over the low share of {low_bound}"
                    ),
                );
            }
        }
        if untraced.is_some() {
            continue;
        }
        limit.high.sort_unstable();
        for (at, e) in &limit.refused {
            let from = at.saturating_sub(ctx.window_us);
            let before = limit.high.partition_point(|h| *h < from);
            let found = limit.high.partition_point(|h| h <= at).saturating_sub(before);
            refusals += 1;
            fewest_high = Some(fewest_high.map_or(found, |f| f.min(found)));
            if found < reserved && verdict == Verdict::Held {
                verdict = violated(
                    e,
                    format!(
                        "a high-priority call was refused at a server's limit with only {found} high admissions in its window, under the reserve of {reserved}"
                    ),
                );
            }
        }
    }
    let high = match (untraced, fewest_high) {
        (Some(why), _) => format!("high refusals not judged under {why}"),
        (None, None) => "no high refusal".to_owned(),
        (None, Some(n)) => format!("fewest high {n} at {refusals} high refusals"),
    };
    let figure = format!("most low {most_low} of {low_bound} per window; {high} (reserve {reserved})");
    (verdict, figure)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judgement::invariants::{Invariant, check_all};
    use crate::scenario::Scenario;

    /// One server whose own limit is 10 per 60 s, 3 of them reserved.
    const SCENARIO: &str = r#"
name = "priority"
duration_s = 60
[hardening]
deployment_rpm = 10
reserve = 0.3
[[servers]]
name = "gpu"
[[workers]]
name = "worker"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 1 }, { id = 2, calls_per_min = 1, priority = "low" }]
"#;

    fn slot(t_s: u64, priority: Priority, admitted: bool) -> TraceEvent {
        let at_us = t_s * 1_000_000;
        let kind = if admitted {
            Kind::DeploymentAdmitted {
                server: "gpu".into(),
                priority,
                at_us,
                decided_by: Decider::Cache,
            }
        } else {
            Kind::DeploymentLimited {
                server: "gpu".into(),
                priority,
                retry_after_us: 1,
                at_us,
                decided_by: Decider::Cache,
            }
        };
        TraceEvent {
            t_us: at_us,
            host: "worker-0".into(),
            call: None,
            kind,
        }
    }

    fn verdict(events: &[TraceEvent]) -> Verdict {
        verdict_of(SCENARIO, events).0
    }

    fn verdict_of(text: &str, events: &[TraceEvent]) -> (Verdict, String) {
        let scenario = Scenario::parse("priority.toml", text).unwrap();
        let check = check_all(&scenario, events)
            .into_iter()
            .find(|c| c.name == Invariant::PriorityShare)
            .unwrap();
        (check.verdict, check.figure)
    }

    #[test]
    fn the_low_class_at_its_share_and_a_high_refusal_after_the_reserve_hold() {
        let mut events: Vec<_> = (0..7).map(|i| slot(i, Priority::Low, true)).collect();
        events.extend((7..10).map(|i| slot(i, Priority::High, true)));
        events.push(slot(11, Priority::Low, false));
        events.push(slot(12, Priority::High, false));
        // A window later, seven low again.
        events.extend((70..77).map(|i| slot(i, Priority::Low, true)));
        assert_eq!(verdict(&events), Verdict::Held);
    }

    #[test]
    fn an_eighth_low_admission_in_a_window_is_a_violation() {
        let events: Vec<_> = (0..8).map(|i| slot(i * 5, Priority::Low, true)).collect();
        match verdict(&events) {
            Verdict::Violated { t_us, detail, .. } => {
                assert_eq!(t_us, 35_000_000);
                assert!(detail.contains("8 low-priority admissions"), "{detail}");
            }
            other => panic!("expected a violation, got {other:?}"),
        }
    }

    #[test]
    fn a_high_refusal_before_the_high_class_used_its_reserve_is_a_violation() {
        // Nine low and one high fill the limit: the low class took reserve.
        let mut events: Vec<_> = (0..9).map(|i| slot(i, Priority::Low, true)).collect();
        events.push(slot(9, Priority::High, true));
        events.push(slot(10, Priority::High, false));
        match verdict(&events) {
            Verdict::Violated { detail, .. } => assert!(detail.contains("low share of 7"), "{detail}"),
            other => panic!("expected a violation, got {other:?}"),
        }
        let mut events: Vec<_> = (0..7).map(|i| slot(i, Priority::Low, true)).collect();
        events.push(slot(9, Priority::High, true));
        events.push(slot(10, Priority::High, false));
        match verdict(&events) {
            Verdict::Violated { t_us, detail, .. } => {
                assert_eq!(t_us, 10_000_000);
                assert!(detail.contains("only 1 high admissions"), "{detail}");
            }
            other => panic!("expected a violation, got {other:?}"),
        }
        // Under call deadlines a dropped slot request may leave an
        // untraced high hit in the store: high refusals are not judged.
        let with_deadline = SCENARIO.replace("reserve = 0.3", "reserve = 0.3\ndeadline_s = 30");
        let (verdict, figure) = verdict_of(&with_deadline, &events);
        assert_eq!(verdict, Verdict::Held);
        assert!(
            figure.contains("high refusals not judged under call deadlines"),
            "{figure}"
        );
    }
}
