//! The retry budget's promise: a fleet's retries stay within a ratio of its
//! first attempts plus a floor, however hard the server it retries falls over.
//!
//! The core's budget is a token bucket ([`redstring::RetryBudget`]), so over
//! any interval of its clock, the retries it grants are at most
//! `max_balance + ratio × deposits + min_retries_per_sec × interval`
//! ([`redstring::decide::budget::BudgetParams::bound`]). This checker reads every
//! budget step in the trace, bucket by bucket (each worker's own, or the
//! fleet's in a shared cache, and each worker's local fallback), and checks
//! that bound over every interval — and that no call sent a retry the budget
//! did not grant it.

use std::collections::BTreeMap;

use redstring::decide::budget::BudgetCommand;

use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::trace::{Decider, Kind, TraceEvent};
use crate::scenario::{CACHE_HOST, Fault};

/// Millionths of a retry, the bucket's unit.
const MICRO: i128 = redstring::decide::budget::MICROS_PER_RETRY as i128;

/// One bucket's steps that share a stamp.
struct Instant {
    at_us: u64,
    deposits: i128,
    grants: i128,
    /// The first granted withdrawal at this stamp, for the report.
    first_grant: Option<usize>,
}

pub(super) fn retry_budget(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let Some(spec) = ctx.scenario.hardening.retry_budget else {
        return not_applicable("no retry budget configured");
    };
    let built = redstring::RetryBudget::builder()
        .ratio(spec.ratio)
        .min_retries_per_sec(spec.min_retries_per_sec)
        .max_balance(spec.max_balance)
        .build();
    let Ok(budget) = built else {
        return not_applicable("the retry budget's numbers are invalid");
    };
    let params = *budget.params();

    // Every retry a call sends must follow a grant within that call.
    let mut per_call: BTreeMap<(&str, u64), (u64, u64)> = BTreeMap::new();
    let mut verdict = Verdict::Held;
    let (mut deposits, mut granted, mut denied, mut retries) = (0u64, 0u64, 0u64, 0u64);
    // Each bucket's steps, by its deciding clock's stamp.
    let mut buckets: BTreeMap<(String, Decider), BTreeMap<u64, Instant>> = BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        match &e.kind {
            Kind::Budget {
                budget,
                command,
                granted: ok,
                at_us,
                decided_by,
                ..
            } => {
                let deposit = *command == BudgetCommand::Deposit;
                match (deposit, *ok) {
                    (true, _) => deposits += 1,
                    (false, true) => granted += 1,
                    (false, false) => denied += 1,
                }
                if !deposit
                    && *ok
                    && let Some(call) = e.call
                {
                    per_call.entry((e.host.as_ref(), call)).or_default().0 += 1;
                }
                let scope = match decided_by {
                    Decider::Cache => ctx.scopes.breaker(e, budget),
                    // A worker's local fallback is its own bucket.
                    _ => format!("{}/{budget}", e.host),
                };
                let instant = buckets
                    .entry((scope, *decided_by))
                    .or_default()
                    .entry(*at_us)
                    .or_insert(Instant {
                        at_us: *at_us,
                        deposits: 0,
                        grants: 0,
                        first_grant: None,
                    });
                if deposit {
                    instant.deposits += 1;
                } else if *ok {
                    instant.grants += 1;
                    instant.first_grant.get_or_insert(i);
                }
            }
            Kind::Retry { .. } => {
                retries += 1;
                let Some(call) = e.call else { continue };
                let (grants, sent) = per_call.entry((e.host.as_ref(), call)).or_default();
                *sent += 1;
                if *sent > *grants && verdict == Verdict::Held {
                    verdict = violated(
                        e,
                        format!("call {call} retried {sent} times with {grants} retries granted by the budget"),
                    );
                }
            }
            _ => {}
        }
    }
    if deposits == 0 {
        return not_applicable("no call reached the retry budget");
    }

    // A step whose reply was lost was applied or not: the trace cannot say,
    // so the cache's buckets are not judged after one.
    let lost = events
        .iter()
        .any(|e| matches!(&e.kind, Kind::CacheUnavailable { operation, .. } if *operation == "budget_step"));
    let unchecked = unchecked_clocks(ctx).or(lost.then_some("a budget step's reply was lost"));
    let local_stepped = ctx
        .scenario
        .faults
        .iter()
        .any(|f| matches!(f, Fault::ClockStep { host, by_ms, .. } if *by_ms < 0 && host != CACHE_HOST));
    let mut worst_excess = i128::MIN;
    for ((scope, decider), steps) in &buckets {
        let skip = match decider {
            Decider::Cache => unchecked.is_some(),
            // A worker's local bucket runs on that worker's clock.
            Decider::Local => local_stepped,
            // Granted without a bucket: nothing to bound.
            Decider::Unlimited => true,
        };
        if skip {
            continue;
        }
        let _ = scope;
        if let Some((at, excess)) = first_excess(steps.values(), &params) {
            worst_excess = worst_excess.max(excess);
            if verdict == Verdict::Held {
                let e = &events[at];
                verdict = violated(
                    e,
                    format!(
                        "{:.2} retries granted beyond the budget's bound (cap {}, ratio {}, floor {}/s) on {scope}",
                        excess as f64 / MICRO as f64,
                        spec.max_balance,
                        spec.ratio,
                        spec.min_retries_per_sec
                    ),
                );
            }
        }
    }
    let mut figure =
        format!("{deposits} calls deposited, {granted} retries granted, {denied} denied; {retries} retries sent");
    if let Some(why) = unchecked {
        figure.push_str(&format!("; the bound is not checked on the cache's bucket ({why})"));
    }
    if local_stepped && buckets.keys().any(|(_, d)| *d == Decider::Local) {
        figure.push_str("; nor on local fallbacks (a worker's clock steps back)");
    }
    (verdict, figure)
}

/// Why the shared or per-worker buckets' stamps cannot be compared as one
/// clock's, if they cannot: a stamping clock stepped back, or a fleet stamps
/// a shared cache with its members' own clocks.
fn unchecked_clocks(ctx: &Ctx) -> Option<&'static str> {
    if !ctx.single_clock {
        return Some("a caller-stamped shared cache is stamped by several clocks");
    }
    let shared = ctx.scopes.shared();
    let stepped_back = ctx
        .scenario
        .faults
        .iter()
        .any(|f| matches!(f, Fault::ClockStep { host, by_ms, .. } if *by_ms < 0 && (host == CACHE_HOST) == shared));
    stepped_back.then_some("its clock steps back")
}

/// The first stamp at which some interval of `steps` (in stamp order) granted
/// more than the bound allows, with the first grant there and by how much
/// (millionths of a retry).
///
/// Over the interval of stamps `[t_i, t_j]`, the bound is
/// `cap + deposit × D + floor × (t_j − t_i)`: with prefix sums, the excess
/// `G − deposit × D − floor × (t_j − t_i) − cap` is `P(j) − Q(i)`, where
/// `P(j)` counts through stamp `j` and `Q(i)` before stamp `i`; a running
/// minimum of `Q` checks every interval in one pass.
fn first_excess<'a>(
    steps: impl Iterator<Item = &'a Instant>,
    params: &redstring::decide::budget::BudgetParams,
) -> Option<(usize, i128)> {
    let deposit = i128::from(params.deposit);
    let floor = i128::from(params.refill_per_sec);
    let cap = i128::from(params.max_balance);
    let (mut grants, mut deposits) = (0i128, 0i128);
    let mut min_q = i128::MAX;
    for s in steps {
        let t = i128::from(s.at_us);
        min_q = min_q.min(grants * MICRO - deposits * deposit - floor * t);
        grants += s.grants;
        deposits += s.deposits;
        let p = grants * MICRO - deposits * deposit - floor * t;
        let excess = p - min_q - cap;
        if excess > 0
            && let Some(first) = s.first_grant
        {
            return Some((first, excess));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::{Ctx, event};
    use super::*;
    use crate::scenario::Scenario;

    const BUDGETED: &str = r#"
name = "budgeted"
duration_s = 100
[hardening]
max_retries = 3
[hardening.retry_budget]
ratio = 0.5
min_retries_per_sec = 1
max_balance = 2
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 1 }]
"#;

    fn step(t_s: f64, call: u64, command: BudgetCommand, granted: bool) -> TraceEvent {
        let t_us = (t_s * 1e6) as u64;
        event(
            t_us,
            "w",
            Some(call),
            Kind::Budget {
                budget: "kg:retrybudget:gpu".into(),
                command,
                granted,
                balance: 0,
                at_us: t_us,
                decided_by: Decider::Cache,
            },
        )
    }

    fn retry(t_s: f64, call: u64) -> TraceEvent {
        event(
            (t_s * 1e6) as u64,
            "w",
            Some(call),
            Kind::Retry {
                attempt: 1,
                delay_us: 1,
                floor_us: 0,
            },
        )
    }

    fn check(events: &[TraceEvent]) -> Finding {
        let s = Scenario::parse("budgeted.toml", BUDGETED).unwrap();
        retry_budget(&Ctx::new(&s), events)
    }

    #[test]
    fn grants_within_cap_deposits_and_floor_hold() {
        // Four deposits fill the bucket to its cap of 2, two grants take it;
        // a second later the floor has earned one more.
        let mut events = Vec::new();
        for call in 0..4 {
            events.push(step(0.0, call, BudgetCommand::Deposit, true));
        }
        for (t, call) in [(0.0, 0), (0.0, 1), (1.0, 2)] {
            events.push(step(t, call, BudgetCommand::Withdraw, true));
            events.push(retry(t, call));
        }
        assert_eq!(check(&events).0, Verdict::Held, "{:?}", check(&events));
    }

    #[test]
    fn one_grant_beyond_the_bound_is_caught_at_that_grant() {
        // Cap 2, one deposit (half a retry), no time: two grants fit, three do not.
        let mut events = vec![step(10.0, 0, BudgetCommand::Deposit, true)];
        for call in 1..4 {
            events.push(step(10.0, call, BudgetCommand::Withdraw, true));
        }
        let (verdict, _) = check(&events);
        let Verdict::Violated { detail, .. } = verdict else {
            panic!("{verdict:?}")
        };
        assert!(detail.contains("0.50 retries granted beyond"), "{detail}");
    }

    #[test]
    fn the_floor_over_a_long_interval_allows_more_grants() {
        // Three grants at t = 0 break the cap of 2; spread over 2 s they fit.
        let spread = [
            step(0.0, 0, BudgetCommand::Deposit, true),
            step(0.0, 0, BudgetCommand::Withdraw, true),
            step(1.0, 1, BudgetCommand::Withdraw, true),
            step(2.0, 2, BudgetCommand::Withdraw, true),
        ];
        assert_eq!(check(&spread).0, Verdict::Held);
    }

    #[test]
    fn a_retry_sent_after_a_denial_is_caught() {
        let events = [
            step(0.0, 7, BudgetCommand::Deposit, true),
            step(1.0, 7, BudgetCommand::Withdraw, false),
            retry(1.0, 7),
        ];
        let (verdict, _) = check(&events);
        let Verdict::Violated { detail, .. } = verdict else {
            panic!("{verdict:?}")
        };
        assert_eq!(detail, "call 7 retried 1 times with 0 retries granted by the budget");
    }

    #[test]
    fn a_retry_granted_without_a_bucket_is_granted_and_a_lost_reply_suspends_the_bound() {
        // Cut off from the cache under `admit`: the grant is reported.
        let mut unlimited = step(1.0, 4, BudgetCommand::Withdraw, true);
        if let Kind::Budget { decided_by, .. } = &mut unlimited.kind {
            *decided_by = Decider::Unlimited;
        }
        let events = [step(0.0, 4, BudgetCommand::Deposit, true), unlimited, retry(1.0, 4)];
        assert_eq!(check(&events).0, Verdict::Held);
        // Three grants at one instant break cap 2, unless a budget step's
        // reply was lost (its deposit may have reached the store).
        let mut events = vec![step(10.0, 0, BudgetCommand::Deposit, true)];
        for call in 1..4 {
            events.push(step(10.0, call, BudgetCommand::Withdraw, true));
        }
        assert!(matches!(check(&events).0, Verdict::Violated { .. }));
        events.push(event(
            11_000_000,
            "w",
            Some(9),
            Kind::CacheUnavailable {
                operation: "budget_step",
                fallback: "local limit",
                admitted_call: false,
            },
        ));
        let (verdict, figure) = check(&events);
        assert_eq!(verdict, Verdict::Held);
        assert!(figure.contains("a budget step's reply was lost"), "{figure}");
    }

    #[test]
    fn without_a_budget_there_is_nothing_to_check() {
        let s = Scenario::parse(
            "plain.toml",
            &BUDGETED.replace(
                "[hardening.retry_budget]\nratio = 0.5\nmin_retries_per_sec = 1\nmax_balance = 2\n",
                "",
            ),
        )
        .unwrap();
        assert!(matches!(
            retry_budget(&Ctx::new(&s), &[]).0,
            Verdict::NotApplicable { .. }
        ));
    }
}
