//! The limiter's promises: never more than `rpm` admissions of one tenant in
//! any window, and a refusal's wait that never grows while nothing is added.

use std::collections::BTreeMap;
use std::time::Duration;

use redstring::limiter::{default_max_clock_ahead, skew_bound};
use redstring::{TenantId, TimeSource};

use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::timeline::admissions;
use crate::evidence::trace::{Kind, TraceEvent};
use crate::scenario::{CACHE_HOST, CacheKind, ClockSpec, Fault, Scenario};

/// What invariant 1 claims for a scenario: at most `limit` admissions of one
/// tenant in any window. `rpm` when one clock stamps each limiter's hits (per
/// worker caches, or a shared cache stamping with its own clock); with a
/// caller-stamped shared cache, the limiter's documented
/// [`skew_bound`] for the spread of the fleet's clocks after the store's clamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RpmBound {
    /// Admissions claimed per window.
    pub limit: u64,
    /// The spread of the stamping clocks the limit allows for (zero: exact).
    pub spread: Duration,
}

/// The bound invariant 1 holds `s` to — the one place it is computed, for the
/// checker and the fuzzer alike.
pub fn rpm_bound(s: &Scenario) -> RpmBound {
    let rpm = s.hardening.rpm;
    let exact = RpmBound {
        limit: u64::from(rpm),
        spread: Duration::ZERO,
    };
    if s.cache.kind != CacheKind::Shared || s.cache.time_source != TimeSource::Caller {
        return exact;
    }
    let window = Duration::from_secs_f64(s.hardening.window_s);
    let ahead = default_max_clock_ahead(window);
    let spread = clock_spread(s, window, ahead);
    RpmBound {
        limit: skew_bound(rpm, window, ahead, spread),
        spread,
    }
}

/// The largest difference, over the run, between two workers' clocks as the
/// shared cache takes them: each worker's offset from the cache host's clock
/// (offset, drift and steps on both sides), clamped into `[−window, ahead]`
/// as `limiter::clamp_stamp` clamps a stamp. Offsets move linearly between
/// steps, so their extremes are at the start, the end and either side of a
/// step.
fn clock_spread(s: &Scenario, window: Duration, ahead: Duration) -> Duration {
    let steps = |host: &str, t_s: f64, inclusive: bool| -> f64 {
        s.faults
            .iter()
            .filter_map(|f| match f {
                Fault::ClockStep { at_s, host: h, by_ms }
                    if h == host && (*at_s < t_s || (inclusive && *at_s <= t_s)) =>
                {
                    Some(*by_ms as f64)
                }
                _ => None,
            })
            .sum()
    };
    let offset_ms = |clock: &ClockSpec, host: &str, t_s: f64, inclusive: bool| {
        clock.offset_ms as f64 + clock.drift_ppm as f64 * 1e-3 * t_s + steps(host, t_s, inclusive)
    };
    let mut instants = vec![0.0, s.duration_s];
    instants.extend(s.faults.iter().filter_map(|f| match f {
        Fault::ClockStep { at_s, .. } => Some(*at_s),
        _ => None,
    }));
    let (lo, hi) = (-(window.as_secs_f64() * 1e3), ahead.as_secs_f64() * 1e3);
    let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
    for member in s.fleet() {
        for &t in &instants {
            for inclusive in [false, true] {
                let relative = offset_ms(&member.clock, &member.name, t, inclusive)
                    - offset_ms(&s.cache.clock, CACHE_HOST, t, inclusive);
                let clamped = relative.clamp(lo, hi);
                min = min.min(clamped);
                max = max.max(clamped);
            }
        }
    }
    if min > max {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(((max - min) / 1e3).max(0.0))
}

/// A tenant as the report shows it: the last four hex digits of its UUID.
fn short(tenant: TenantId) -> String {
    format!("…{:04x}", tenant.as_uuid().as_u128() & 0xffff)
}

/// Invariant 1: never more than `rpm` admissions of one tenant in a window —
/// or, under a caller-stamped shared cache, never more than the limiter's
/// skew bound for the fleet's clocks ([`rpm_bound`]).
pub(super) fn rpm_per_window(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let admitted = admissions(ctx.scopes, events);
    if admitted.is_empty() {
        return not_applicable("no admissions");
    }
    let rpm = ctx.scenario.hardening.rpm;
    let bound = rpm_bound(ctx.scenario);
    let limit = usize::try_from(bound.limit).unwrap_or(usize::MAX);
    let claim = if bound.spread.is_zero() {
        format!("rpm {rpm}")
    } else {
        format!(
            "bound {} = rpm {rpm} for a clock spread of {:.1} s",
            bound.limit,
            bound.spread.as_secs_f64()
        )
    };
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
        let (max, first_bad) = max_in_window(stamped.iter().map(|(t, _)| *t), width, limit);
        worst = worst.max(max);
        let best = per_tenant.entry(*tenant).or_default();
        *best = (*best).max(max);
        if let (Verdict::Held, Some(i)) = (&verdict, first_bad) {
            verdict = violated(stamped[i].1, format!("{max} admissions in one window ({claim})"));
        }
        let mut true_time: Vec<u64> = list.iter().map(|e| e.t_us).collect();
        true_time.sort_unstable();
        true_worst = true_worst.max(max_in_window(true_time.into_iter(), width, limit).0);
    }
    let tenants: Vec<String> = per_tenant.iter().map(|(t, n)| format!("{}: {n}", short(*t))).collect();
    let figure = format!(
        "max admitted per window: {worst} ({claim}); in true time: {true_worst}; per tenant: {}",
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
