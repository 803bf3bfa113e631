//! Priority classes: low-priority tenants never take the reserve a server's
//! limit keeps for the high class.
//!
//! Under `hardening.deployment_rpm` with `hardening.reserve`, every slot an
//! attempt takes or is refused at a server's own limit is traced with the
//! class it asked as ([`Kind::DeploymentAdmitted`],
//! [`Kind::DeploymentLimited`]). The limit decides by its store's stamps, so
//! the judgement is in stamp time, per limit (per worker with per-worker
//! caches, fleet-wide with a shared one) and between restarts of a shared
//! cache, which forget every hit: no window of stamps holds more low
//! admissions than the low class's share, `rpm − ⌈rpm × reserve⌉`, and every
//! high refusal found at least the reserve taken by high admissions in its
//! window — the reserve was the high class's to use. Both are exact when one
//! clock that never steps back stamps a limit's decisions; otherwise there
//! is nothing exact to judge and the invariant is not applicable. Decisions
//! a worker made without its cache (a local limit, or admitted unlimited)
//! are in no shared window and are not counted.

use std::collections::BTreeMap;

use redstring::Priority;

use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::trace::{Decider, Kind, TraceEvent};
use crate::scenario::{CACHE_HOST, Fault};

/// One limit's decisions since its store last started empty.
#[derive(Default)]
struct Epoch<'a> {
    /// Low-priority admissions: stamp and event.
    low: Vec<(u64, &'a TraceEvent)>,
    /// High-priority admissions' stamps.
    high: Vec<u64>,
    /// High-priority refusals: stamp and event.
    refused: Vec<(u64, &'a TraceEvent)>,
}

/// What the judgement found over every epoch, for the figure.
struct Tally {
    /// The most low admissions seen in one window.
    most_low: usize,
    /// High refusals judged.
    refusals: usize,
    /// The fewest high admissions a high refusal found in its window.
    fewest_high: Option<usize>,
}

/// Invariant 21: at every server's own limit with a reserve, no window holds
/// more low-priority admissions than the low class's share, and every
/// high-priority refusal found at least the reserve used by high calls in
/// its window.
pub(super) fn priority_share(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let h = &ctx.scenario.hardening;
    let (Some(rpm), Some(share)) = (h.deployment_rpm, h.reserve) else {
        return not_applicable("no server's limit keeps a reserve");
    };
    if !ctx.single_clock {
        return not_applicable("a caller-stamped shared cache: the limits' stamps come from many clocks");
    }
    let shared = ctx.scopes.shared();
    let steps_back = ctx
        .scenario
        .faults
        .iter()
        .any(|f| matches!(f, Fault::ClockStep { host, by_ms, .. } if *by_ms < 0 && (host == CACHE_HOST) == shared));
    if steps_back {
        return not_applicable("a clock that stamps the limits steps back");
    }
    // As the core reserves: ⌈rpm × share⌉, never the whole limit.
    let reserved = (f64::from(rpm) * share).ceil() as usize;
    let low_share = (rpm as usize).saturating_sub(reserved);
    let window_us = ctx.window_us;
    let mut tally = Tally {
        most_low: 0,
        refusals: 0,
        fewest_high: None,
    };
    let mut verdict = Verdict::Held;
    let mut epochs: BTreeMap<String, Epoch> = BTreeMap::new();
    for e in events {
        match &e.kind {
            Kind::Fault {
                fault: Fault::CacheUp { .. },
            } if shared => {
                for epoch in std::mem::take(&mut epochs).into_values() {
                    judge(&epoch, window_us, low_share, reserved, &mut tally, &mut verdict);
                }
            }
            Kind::DeploymentAdmitted {
                server,
                priority,
                at_us,
                decided_by: Decider::Cache,
            } => {
                let epoch = epochs.entry(ctx.scopes.breaker(e, server)).or_default();
                match priority {
                    Priority::Low => epoch.low.push((*at_us, e)),
                    Priority::High => epoch.high.push(*at_us),
                }
            }
            Kind::DeploymentLimited {
                server,
                priority: Priority::High,
                at_us,
                decided_by: Decider::Cache,
                ..
            } => {
                let epoch = epochs.entry(ctx.scopes.breaker(e, server)).or_default();
                epoch.refused.push((*at_us, e));
            }
            _ => {}
        }
    }
    for epoch in epochs.into_values() {
        judge(&epoch, window_us, low_share, reserved, &mut tally, &mut verdict);
    }
    let fewest = tally.fewest_high.map_or_else(
        || "no high refusal".to_owned(),
        |n| format!("fewest high {n} at a high refusal"),
    );
    let figure = format!(
        "most low {} of {low_share} per window; {fewest} (reserve {reserved}, {} judged)",
        tally.most_low, tally.refusals
    );
    (verdict, figure)
}

/// Judges one limit's epoch, keeping the first violation.
fn judge(epoch: &Epoch, window_us: u64, low_share: usize, reserved: usize, tally: &mut Tally, verdict: &mut Verdict) {
    let mut low = epoch.low.clone();
    low.sort_by_key(|(at, _)| *at);
    // Each window of stamps starting at a low admission's stamp: every
    // window's count is at most that of the one starting at its first.
    for (i, (start, _)) in low.iter().enumerate() {
        let end = start.saturating_add(window_us);
        let within = low[i..].partition_point(|(at, _)| *at <= end);
        tally.most_low = tally.most_low.max(within);
        if within > low_share && *verdict == Verdict::Held {
            let (_, last) = low[i + within - 1];
            *verdict = violated(
                last,
                format!(
                    "{within} low-priority admissions in one window at a server's limit, over the low share of {low_share}"
                ),
            );
        }
    }
    let mut high = epoch.high.clone();
    high.sort_unstable();
    for (at, e) in &epoch.refused {
        let from = at.saturating_sub(window_us);
        let found = high.partition_point(|h| h <= at) - high.partition_point(|h| *h < from);
        tally.refusals += 1;
        tally.fewest_high = Some(tally.fewest_high.map_or(found, |f| f.min(found)));
        if found < reserved && *verdict == Verdict::Held {
            *verdict = violated(
                e,
                format!(
                    "a high-priority call was refused at a server's limit with only {found} high admissions in its window, under the reserve of {reserved}"
                ),
            );
        }
    }
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
        let scenario = Scenario::parse("priority.toml", SCENARIO).unwrap();
        check_all(&scenario, events)
            .into_iter()
            .find(|c| c.name == Invariant::PriorityShare)
            .unwrap()
            .verdict
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
    }
}
