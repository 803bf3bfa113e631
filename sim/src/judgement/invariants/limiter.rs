//! The limiter's promises: never more than `rpm` admissions of one tenant in
//! any window, and a refusal's wait that never grows while nothing is added.

use std::collections::BTreeMap;

use redstring::TenantId;

use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::timeline::admissions;
use crate::evidence::trace::{Kind, TraceEvent};

/// A tenant as the report shows it: the last four hex digits of its UUID.
fn short(tenant: TenantId) -> String {
    format!("…{:04x}", tenant.as_uuid().as_u128() & 0xffff)
}

/// Invariant 1: never more than `rpm` admissions of one tenant in a window.
pub(super) fn rpm_per_window(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let admitted = admissions(ctx.scopes, events);
    if admitted.is_empty() {
        return not_applicable("no admissions");
    }
    let rpm = ctx.scenario.hardening.rpm as usize;
    // In true time an admission is seen up to one round trip after the cache
    // decided it, so true-time windows are narrowed by that much.
    let width = if ctx.single_clock {
        ctx.window_us
    } else {
        ctx.window_us.saturating_sub(ctx.round_trip_us)
    };
    let mut verdict = Verdict::Held;
    let (mut worst, mut true_worst) = (0, 0);
    // The most any one tenant got in a window, per tenant (across scopes).
    let mut per_tenant: BTreeMap<TenantId, usize> = BTreeMap::new();
    for ((_, tenant), list) in &admitted {
        let mut stamped: Vec<(u64, &TraceEvent)> = list
            .iter()
            .map(|e| match e.kind {
                Kind::Admitted { at_us, .. } => (ctx.instant(e, at_us), *e),
                _ => (e.t_us, *e),
            })
            .collect();
        stamped.sort_by_key(|(t, _)| *t);
        let (max, first_bad) = max_in_window(stamped.iter().map(|(t, _)| *t), width, rpm);
        worst = worst.max(max);
        let best = per_tenant.entry(*tenant).or_default();
        *best = (*best).max(max);
        if let (Verdict::Held, Some(i)) = (&verdict, first_bad) {
            verdict = violated(stamped[i].1, format!("{max} admissions in one window (rpm {rpm})"));
        }
        let mut true_time: Vec<u64> = list.iter().map(|e| e.t_us).collect();
        true_time.sort_unstable();
        true_worst = true_worst.max(max_in_window(true_time.into_iter(), width, rpm).0);
    }
    let tenants: Vec<String> = per_tenant.iter().map(|(t, n)| format!("{}: {n}", short(*t))).collect();
    let figure = format!(
        "max admitted per window: {worst} (rpm {rpm}); in true time: {true_worst}; per tenant: {}",
        tenants.join(", ")
    );
    (verdict, figure)
}

/// The most instants in any closed window `[t − width, t]`, and the index of
/// the first instant at which the count exceeded `limit`.
pub(super) fn max_in_window(sorted: impl Iterator<Item = u64>, width: u64, limit: usize) -> (usize, Option<usize>) {
    let times: Vec<u64> = sorted.collect();
    let (mut start, mut max, mut first_bad) = (0, 0, None);
    for (end, t) in times.iter().enumerate() {
        while times[start] < t.saturating_sub(width) {
            start += 1;
        }
        let count = end - start + 1;
        max = max.max(count);
        if count > limit && first_bad.is_none() {
            first_bad = Some(end);
        }
    }
    (max, first_bad)
}

/// Invariant 2: successive refusals of one tenant never report a longer wait
/// while no hit is added.
pub(super) fn retry_after_monotone(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    // Each worker's refusals of a tenant, in its own order; between two of
    // them a hit may have been added anywhere in the limiter's scope (with a
    // shared cache, by another worker — seen in the trace up to a round trip
    // late), and then the wait may legitimately change.
    let admitted = admissions(ctx.scopes, events);
    let mut last: BTreeMap<(&str, TenantId), (u64, u64)> = BTreeMap::new();
    let mut refusals = 0;
    let mut verdict = Verdict::Held;
    let mut worst_growth = 0u64;
    for e in events {
        let Kind::Limited {
            tenant, retry_after_us, ..
        } = &e.kind
        else {
            continue;
        };
        refusals += 1;
        let key = (e.host.as_str(), *tenant);
        if let Some(&(t_prev, prev)) = last.get(&key) {
            let hit_between = admitted.get(&(ctx.scopes.limiter(e), *tenant)).is_some_and(|hits| {
                hits.iter()
                    .any(|h| h.t_us + ctx.round_trip_us >= t_prev && h.t_us <= e.t_us)
            });
            if !hit_between && *retry_after_us > prev {
                worst_growth = worst_growth.max(retry_after_us - prev);
                if verdict == Verdict::Held {
                    verdict = violated(e, format!("wait grew from {prev} µs to {retry_after_us} µs"));
                }
            }
        }
        last.insert(key, (e.t_us, *retry_after_us));
    }
    if refusals == 0 {
        return not_applicable("no refusals");
    }
    (
        verdict,
        format!("{refusals} refusals; worst growth {} ms", worst_growth / 1000),
    )
}
