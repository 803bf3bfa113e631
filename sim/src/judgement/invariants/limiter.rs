//! The limiter's promises: never more than `rpm` admissions of one tenant in
//! any window, and a refusal's wait that never grows while nothing is added.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use redstring::decide::window::skew_bound;
use redstring::limiter::default_max_clock_ahead;
use redstring::{TenantId, TimeSource};

use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::timeline::admissions;
use crate::evidence::trace::{Decider, Kind, TraceEvent};
use crate::scenario::{CACHE_HOST, CacheKind, ClockSpec, Fault, Scenario};

/// What invariant 1 claims for a scenario: how many admissions of one tenant
/// any window may hold, from three allowances, each documented where the
/// behaviour it allows for is built:
///
/// - the configured cache's own decisions: `rpm` when one clock stamps them
///   (per-worker caches, or a shared cache stamping with its own clock); with
///   a caller-stamped shared cache, the limiter's [`skew_bound`] for the
///   spread of the fleet's clocks after the store's clamp;
/// - a shared cache that restarts forgets every hit: each restart within one
///   window lets it decide that many again;
/// - a worker cut off from the shared cache limits locally
///   (`OnCacheUnavailable::LocalLimit`): `rpm` more per worker that fell
///   back. `Admit` admits without any limit: those admissions are counted
///   and reported, outside the bound, which cannot exist for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RpmBound {
    /// The limiter's `rpm`.
    pub rpm: u32,
    /// Admissions the configured cache may decide per window.
    pub decided: u64,
    /// The spread of the stamping clocks `decided` allows for (zero: exact).
    pub spread: Duration,
    /// The most restarts of the shared cache within one window.
    pub restarts: u64,
}

impl RpmBound {
    /// The most admissions of one tenant per window when `fell_back` of the
    /// workers serving it limited locally.
    pub fn limit(&self, fell_back: u64) -> u64 {
        self.decided
            .saturating_mul(self.restarts.saturating_add(1))
            .saturating_add(u64::from(self.rpm).saturating_mul(fell_back))
    }

    /// How [`RpmBound::limit`] is made up, in the report's words: `rpm 30`
    /// when it is exact, else for example `bound 60: rpm 30 + 30 × 1 worker
    /// that limited locally`.
    pub fn explain(&self, fell_back: u64) -> String {
        let rpm = self.rpm;
        let mut text = if self.spread.is_zero() {
            format!("rpm {rpm}")
        } else {
            format!(
                "rpm {rpm} × {} for a clock spread of {:.1} s",
                self.decided / u64::from(rpm.max(1)),
                self.spread.as_secs_f64()
            )
        };
        if self.restarts > 0 {
            let plural = if self.restarts == 1 { "" } else { "s" };
            text = format!(
                "({text}) × {} for {} cache restart{plural} in one window",
                self.restarts + 1,
                self.restarts
            );
        }
        if fell_back > 0 {
            let plural = if fell_back == 1 { "" } else { "s" };
            text = format!("{text} + {rpm} × {fell_back} worker{plural} that limited locally");
        }
        if self.limit(fell_back) == u64::from(rpm) {
            text
        } else {
            format!("bound {}: {text}", self.limit(fell_back))
        }
    }
}

/// The bound invariant 1 holds `s` to — the one place it is computed, for the
/// checker and the fuzzer alike (see [`RpmBound`]).
pub fn rpm_bound(s: &Scenario) -> RpmBound {
    let rpm = s.hardening.rpm;
    let mut bound = RpmBound {
        rpm,
        decided: u64::from(rpm),
        spread: Duration::ZERO,
        restarts: 0,
    };
    if s.cache.kind != CacheKind::Shared {
        return bound;
    }
    let window = Duration::from_secs_f64(s.hardening.window_s);
    bound.restarts = restarts_in_a_window(s, window);
    if s.cache.time_source == TimeSource::Caller {
        let ahead = default_max_clock_ahead(window);
        bound.spread = clock_spread(s, window, ahead);
        bound.decided = skew_bound(rpm, window, ahead, bound.spread);
    }
    bound
}

/// The most times the shared cache comes back (restarted, with nothing in
/// it) within any one window of the run.
pub(super) fn restarts_in_a_window(s: &Scenario, window: Duration) -> u64 {
    let mut ups: Vec<f64> = s
        .faults
        .iter()
        .filter_map(|f| match f {
            Fault::CacheUp { at_s } => Some(*at_s),
            _ => None,
        })
        .collect();
    ups.sort_by(f64::total_cmp);
    let w = window.as_secs_f64();
    let mut most = 0;
    for (i, t) in ups.iter().enumerate() {
        let within = ups[i..].iter().take_while(|u| **u <= t + w).count();
        most = most.max(within);
    }
    most as u64
}

/// How much a refusal's wait may grow over the one before it (same worker,
/// tenant and deciding limiter, no hit added in between) — invariant 2's
/// allowance, the one place it is computed. Zero with one clock and one
/// limiter: the window never holds more than `rpm` hits, so the wait is
/// always until the oldest of them ages out and only shrinks. Two things put
/// more than `rpm` hits in the window; when the oldest ages out the next
/// refusal then waits for the next-oldest, up to a window later:
///
/// - a step back of `b` of the clock that stamps the decisions widens the
///   window over hits already counted, for one window plus `b` after the
///   step: the wait may grow by up to the window plus `b` there;
/// - a caller-stamped shared cache under skew holds up to [`skew_bound`]
///   hits: the wait may grow by up to the window plus the clocks' spread
///   (no stamp is further than the spread ahead of another).
///
/// `bound` is [`rpm_bound`]`(s)`, computed once by the caller.
pub fn wait_growth_bound(
    s: &Scenario,
    bound: &RpmBound,
    host: &str,
    decider: Decider,
    between_us: (u64, u64),
) -> Duration {
    let shared_cache_decided = s.cache.kind == CacheKind::Shared && decider == Decider::Cache;
    let stamper = if shared_cache_decided && s.cache.time_source == TimeSource::Store {
        CACHE_HOST
    } else {
        host
    };
    let window = Duration::from_secs_f64(s.hardening.window_s);
    let (from, to) = between_us;
    // Steps back whose aftermath reaches the later refusal.
    let back = s
        .faults
        .iter()
        .filter_map(|f| match f {
            Fault::ClockStep { at_s, host: h, by_ms } if h == stamper && *by_ms < 0 => {
                let step = Duration::from_millis(by_ms.unsigned_abs());
                let at = Duration::from_secs_f64(at_s.max(0.0));
                let until = at.saturating_add(window).saturating_add(step);
                let (from, to) = (Duration::from_micros(from), Duration::from_micros(to));
                (at <= to && until >= from).then_some(step)
            }
            _ => None,
        })
        .fold(Duration::ZERO, Duration::saturating_add);
    let mut widened = back;
    if shared_cache_decided && s.cache.time_source == TimeSource::Caller {
        widened = widened.saturating_add(bound.spread);
    }
    if widened.is_zero() {
        Duration::ZERO
    } else {
        window.saturating_add(widened)
    }
}

/// The largest difference, over the run, between two workers' clocks as the
/// shared cache takes them: each worker's offset from the cache host's clock
/// (offset, drift and steps on both sides), clamped into `[−window, ahead]`
/// as `decide::window::clamp_stamp` clamps a stamp. Offsets move linearly between
/// steps, so a worker's extremes are at the start, the end and either side
/// of its own or the cache host's steps. Each host's steps are summed once
/// (a schedule may hold thousands), so this is O(steps · log steps).
pub(super) fn clock_spread(s: &Scenario, window: Duration, ahead: Duration) -> Duration {
    // Each host's steps in time order, with the running total after each.
    let mut steps: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for f in &s.faults {
        if let Fault::ClockStep { at_s, host, by_ms } = f {
            steps.entry(host.as_str()).or_default().push((*at_s, *by_ms as f64));
        }
    }
    for list in steps.values_mut() {
        list.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut total = 0.0;
        for step in list.iter_mut() {
            total += step.1;
            step.1 = total;
        }
    }
    // The total of `host`'s steps before `t_s` (at or before, if inclusive).
    let stepped = |host: &str, t_s: f64, inclusive: bool| -> f64 {
        let Some(list) = steps.get(host) else { return 0.0 };
        let n = list.partition_point(|(at, _)| *at < t_s || (inclusive && *at <= t_s));
        if n == 0 { 0.0 } else { list[n - 1].1 }
    };
    let offset_ms = |clock: &ClockSpec, host: &str, t_s: f64, inclusive: bool| {
        clock.offset_ms as f64 + clock.drift_ppm as f64 * 1e-3 * t_s + stepped(host, t_s, inclusive)
    };
    let cache_steps: Vec<f64> = steps
        .get(CACHE_HOST)
        .map_or(Vec::new(), |l| l.iter().map(|x| x.0).collect());
    let (lo, hi) = (-(window.as_secs_f64() * 1e3), ahead.as_secs_f64() * 1e3);
    let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
    for member in s.fleet() {
        let own = steps.get(member.name.as_str()).into_iter().flatten().map(|x| x.0);
        let instants = [0.0, s.duration_s]
            .into_iter()
            .chain(own)
            .chain(cache_steps.iter().copied());
        for t in instants {
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
/// or, where the scenario allows more, never more than [`rpm_bound`] says.
pub(super) fn rpm_per_window(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let admitted = admissions(ctx.scopes, events);
    if admitted.is_empty() {
        return not_applicable("no admissions");
    }
    let bound = rpm_bound(ctx.scenario);
    let mut verdict = Verdict::Held;
    let (mut worst, mut worst_claim, mut true_worst, mut unlimited) = (0, String::new(), 0, 0);
    // The most any one tenant got in a window, per tenant (across scopes).
    let mut per_tenant: BTreeMap<TenantId, usize> = BTreeMap::new();
    for ((_, tenant), list) in &admitted {
        let decided_by = |e: &TraceEvent| match e.kind {
            Kind::Admitted { decided_by, .. } => decided_by,
            _ => Decider::Cache,
        };
        // Admissions nobody decided (the `admit` fallback) have no bound.
        let limited: Vec<&TraceEvent> = list
            .iter()
            .copied()
            .filter(|e| decided_by(e) != Decider::Unlimited)
            .collect();
        unlimited += list.len() - limited.len();
        let fell_back: BTreeSet<&str> = limited
            .iter()
            .filter(|e| decided_by(e) == Decider::Local)
            .map(|e| e.host.as_ref())
            .collect();
        let fell_back = fell_back.len() as u64;
        let limit = usize::try_from(bound.limit(fell_back)).unwrap_or(usize::MAX);
        let claim = bound.explain(fell_back);
        // Stamps are comparable when one clock made them all; otherwise (a
        // caller-stamped cache, or local limiters stamping with each worker's
        // clock) true time, where an admission is seen up to one round trip
        // after it was decided, so windows are narrowed by that much.
        let one_clock = ctx.single_clock && fell_back == 0;
        let width = if one_clock {
            ctx.window_us
        } else {
            ctx.window_us.saturating_sub(ctx.round_trip_us)
        };
        let mut stamped: Vec<(u64, &TraceEvent)> = limited
            .iter()
            .map(|e| match e.kind {
                Kind::Admitted { at_us, .. } if one_clock => (at_us, *e),
                _ => (e.t_us, *e),
            })
            .collect();
        stamped.sort_by_key(|(t, _)| *t);
        let (max, first_bad) = max_in_window(stamped.iter().map(|(t, _)| *t), width, limit);
        if max >= worst {
            worst = max;
            worst_claim = claim.clone();
        }
        let best = per_tenant.entry(*tenant).or_default();
        *best = (*best).max(max);
        if let (Verdict::Held, Some(i)) = (&verdict, first_bad) {
            verdict = violated(stamped[i].1, format!("{max} admissions in one window ({claim})"));
        }
        let mut true_time: Vec<u64> = limited.iter().map(|e| e.t_us).collect();
        true_time.sort_unstable();
        let true_width = ctx.window_us.saturating_sub(ctx.round_trip_us);
        let (in_true_time, first_true_bad) = max_in_window(true_time.iter().copied(), true_width, limit);
        true_worst = true_worst.max(in_true_time);
        // A shared cache stamping with its own steady clock decides in what
        // is, up to its drift, true time: the claim holds there too. More in
        // true time than the stamps show means the stamps were not the
        // store's.
        if let (Verdict::Held, Some(i), Some(drift_us), 0) = (&verdict, first_true_bad, store_drift_us(ctx), fell_back)
        {
            let width = true_width.saturating_sub(drift_us);
            if max_in_window(true_time.iter().copied(), width, limit).1.is_some() {
                let e = limited
                    .iter()
                    .find(|e| e.t_us == true_time[i])
                    .copied()
                    .unwrap_or(limited[0]);
                verdict = violated(
                    e,
                    format!(
                        "{in_true_time} admissions in one window of true time ({claim}), though the store's stamps show at most {max}"
                    ),
                );
            }
        }
    }
    let tenants: Vec<String> = per_tenant.iter().map(|(t, n)| format!("{}: {n}", short(*t))).collect();
    let mut figure = format!(
        "max admitted per window: {worst} ({worst_claim}); in true time: {true_worst}; per tenant: {}",
        tenants.join(", ")
    );
    if unlimited > 0 {
        figure.push_str(&format!(
            "; {unlimited} admitted without a limit while the cache was unreachable (on_cache_unavailable = admit: unbounded)"
        ));
    }
    (verdict, figure)
}

/// When a shared cache stamps every decision with its own clock, that clock
/// never steps, and no fault slows a link to it beyond the network's round
/// trip: how far its clock can drift from true time over one window,
/// microseconds. `None` otherwise.
fn store_drift_us(ctx: &Ctx) -> Option<u64> {
    let s = ctx.scenario;
    let unsteady = s.faults.iter().any(|f| match f {
        Fault::ClockStep { host, .. } => host == CACHE_HOST,
        Fault::Latency { a, b, .. } => a == CACHE_HOST || b == CACHE_HOST,
        _ => false,
    });
    (ctx.scopes.shared() && s.cache.time_source == TimeSource::Store && !unsteady)
        .then(|| ctx.window_us.saturating_mul(s.cache.clock.drift_ppm.unsigned_abs()) / 1_000_000 + 1)
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

/// Invariant 2: successive refusals of one tenant by one limiter never report
/// a longer wait while no hit is added — or longer by at most
/// [`wait_growth_bound`] where the scenario's clocks allow it.
pub(super) fn retry_after_monotone(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    // Each worker's refusals of a tenant by each of its limiters (the
    // configured cache, or its local fallback), in its own order; between two
    // of them a hit may have been added anywhere in the limiter's scope (with
    // a shared cache, by another worker — seen in the trace up to a round
    // trip late), and then the wait may legitimately change.
    let admitted = admissions(ctx.scopes, events);
    let bound = rpm_bound(ctx.scenario);
    let mut last: BTreeMap<(&str, TenantId, Decider), (u64, u64)> = BTreeMap::new();
    let mut refusals = 0;
    let mut verdict = Verdict::Held;
    let (mut worst_growth, mut worst_allowed) = (0u64, 0u64);
    let mut largest_allowance = 0u64;
    for e in events {
        let Kind::Limited {
            tenant,
            retry_after_us,
            decided_by,
            ..
        } = &e.kind
        else {
            continue;
        };
        refusals += 1;
        let key = (e.host.as_ref(), *tenant, *decided_by);
        if let Some(&(t_prev, prev)) = last.get(&key) {
            // Admissions are in trace order, so in time order: the first
            // one late enough tells whether any fell in between.
            let hit_between = admitted.get(&(ctx.scopes.limiter(e), *tenant)).is_some_and(|hits| {
                let first = hits.partition_point(|h| h.t_us.saturating_add(ctx.round_trip_us) < t_prev);
                hits.get(first).is_some_and(|h| h.t_us <= e.t_us)
            });
            if !hit_between && *retry_after_us > prev {
                let growth = retry_after_us - prev;
                let allowed = micros(wait_growth_bound(
                    ctx.scenario,
                    &bound,
                    &e.host,
                    *decided_by,
                    (t_prev, e.t_us),
                ));
                if growth > worst_growth {
                    (worst_growth, worst_allowed) = (growth, allowed);
                }
                if growth > allowed && verdict == Verdict::Held {
                    verdict = violated(
                        e,
                        format!(
                            "wait grew from {prev} µs to {retry_after_us} µs (allowed growth {} ms)",
                            allowed / 1000
                        ),
                    );
                }
            }
        } else {
            // The most this worker's limiter may ever allow, for the figure.
            let most = wait_growth_bound(ctx.scenario, &bound, &e.host, *decided_by, (0, u64::MAX));
            largest_allowance = largest_allowance.max(micros(most));
        }
        last.insert(key, (e.t_us, *retry_after_us));
    }
    if refusals == 0 {
        return not_applicable("no refusals");
    }
    let figure = if largest_allowance == 0 {
        format!("{refusals} refusals; worst growth {} ms", worst_growth / 1000)
    } else {
        let s = ctx.scenario;
        let stepped_back = s
            .faults
            .iter()
            .any(|f| matches!(f, Fault::ClockStep { by_ms, .. } if *by_ms < 0));
        let skewed = ctx.scopes.shared() && s.cache.time_source == TimeSource::Caller && !bound.spread.is_zero();
        let why = match (stepped_back, skewed) {
            (true, true) => "a window plus the steps back and the clocks' spread",
            (true, false) => "a window plus the steps back",
            _ => "a window plus the clocks' spread",
        };
        let bound = if worst_allowed == largest_allowance {
            format!("bound {} ms", worst_allowed / 1000)
        } else {
            format!(
                "bound {} ms there, {} ms at most",
                worst_allowed / 1000,
                largest_allowance / 1000
            )
        };
        format!(
            "{refusals} refusals; worst growth {} ms, {bound} ({why})",
            worst_growth / 1000
        )
    };
    (verdict, figure)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::super::{Ctx, event};
    use super::*;
    use crate::scenario::tenant;

    const SHARED: &str = r#"
name = "true-time"
duration_s = 60
[hardening]
rpm = 10
window_s = 10
[cache]
kind = "shared"
time_source = "store"
[[servers]]
name = "gpu"
[[workers]]
name = "a"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 1 }]
[[workers]]
name = "b"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 1 }]
"#;

    /// An admission traced on `host` at `t_ms` and stamped `stamp_ms`.
    fn admitted(host: &str, t_ms: u64, stamp_ms: u64) -> TraceEvent {
        event(
            t_ms * 1000,
            host,
            None,
            Kind::Admitted {
                tenant: tenant(1),
                remaining: 0,
                at_us: stamp_ms * 1000,
                decided_by: Decider::Cache,
            },
        )
    }

    /// Ten admissions on `a` stamped as they happened, and ten on `b` five
    /// seconds later stamped fifteen seconds later: the stamps show ten in
    /// any window, true time twenty in six seconds.
    fn stamped_elsewhere() -> Vec<TraceEvent> {
        let mut events: Vec<TraceEvent> = (0..10).map(|i| admitted("a", i * 100, i * 100)).collect();
        events.extend((0..10).map(|i| admitted("b", 5_000 + i * 100, 20_000 + i * 100)));
        events
    }

    #[test]
    fn a_store_stamped_cache_is_held_to_the_limit_in_true_time_too() {
        let s = Scenario::parse("true-time.toml", SHARED).unwrap();
        let (verdict, figure) = rpm_per_window(&Ctx::new(&s), &stamped_elsewhere());
        assert!(
            matches!(&verdict, Verdict::Violated { detail, .. }
                if detail.contains("20 admissions in one window of true time") && detail.contains("at most 10")),
            "{verdict:?} {figure}"
        );
    }

    #[test]
    fn a_slowed_cache_link_or_a_stepped_store_clock_drops_the_true_time_claim() {
        for fault in [
            "[[faults]]\nkind = \"latency\"\nat_s = 1\na = \"b\"\nb = \"cache\"\nms = 500\n",
            "[[faults]]\nkind = \"clock_step\"\nat_s = 1\nhost = \"cache\"\nby_ms = -100\n",
        ] {
            let s = Scenario::parse("true-time.toml", &format!("{SHARED}{fault}")).unwrap();
            let (verdict, figure) = rpm_per_window(&Ctx::new(&s), &stamped_elsewhere());
            assert_eq!(verdict, Verdict::Held, "{fault}: {figure}");
        }
    }
}
