//! The token budget's promise: in any window, the tokens of a tenant's
//! admitted calls are at most the limit plus what calls used beyond their
//! estimates.
//!
//! The limiter reserves each call's estimate with its slot and refuses a
//! reservation that would take the window over the limit, so at every
//! decision the window plus the new estimate fit. Settling to the server's
//! `usage` can only add what a call used beyond its estimate. So over every
//! window of the deciding ledger's stamps, the tokens the calls in it were
//! finally charged (their settled use, or their estimate when never settled)
//! are at most `tokens_per_window + Σ (used − estimate)⁺` over those calls
//! ([`redstring::decide::tokens`] states the bound) — times one more per
//! restart of a shared cache within a window, which forgets its ledgers.

use std::collections::BTreeMap;

use redstring::TenantId;

use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::trace::{Decider, Kind, TraceEvent};

/// One admitted call's reservation, as the trace tells it.
struct Charge {
    /// The event that reserved it.
    event: usize,
    at_us: u64,
    estimate: u64,
    settled: Option<u64>,
}

impl Charge {
    fn used(&self) -> u64 {
        self.settled.unwrap_or(self.estimate)
    }
}

pub(super) fn tokens_per_window(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let Some(limit) = ctx.scenario.hardening.tokens_per_window else {
        return not_applicable("no token budget configured");
    };
    // Each ledger (tenant, limiter scope, decider) and its reservations; the
    // reservation each call holds, to settle.
    let mut ledgers: BTreeMap<(TenantId, String, Decider), Vec<Charge>> = BTreeMap::new();
    let mut open: BTreeMap<(&str, u64), (TenantId, String, Decider, usize)> = BTreeMap::new();
    let (mut refused, mut settled, mut excess_total) = (0u64, 0u64, 0u64);
    for (i, e) in events.iter().enumerate() {
        match &e.kind {
            Kind::Reserved {
                tenant,
                estimate,
                at_us,
                decided_by,
            } => {
                let scope = match decided_by {
                    Decider::Cache => ctx.scopes.limiter(e).to_owned(),
                    _ => e.host.to_string(),
                };
                let ledger = ledgers.entry((*tenant, scope.clone(), *decided_by)).or_default();
                if let Some(call) = e.call {
                    open.insert((e.host.as_ref(), call), (*tenant, scope, *decided_by, ledger.len()));
                }
                ledger.push(Charge {
                    event: i,
                    at_us: *at_us,
                    estimate: *estimate,
                    settled: None,
                });
            }
            Kind::Settled { actual, .. } => {
                settled += 1;
                let Some(call) = e.call else { continue };
                if let Some((tenant, scope, decider, index)) = open.remove(&(e.host.as_ref(), call))
                    && let Some(charge) = ledgers
                        .get_mut(&(tenant, scope, decider))
                        .and_then(|l| l.get_mut(index))
                {
                    charge.settled = Some(*actual);
                    excess_total += actual.saturating_sub(charge.estimate);
                }
            }
            // A settle whose reply was lost may have refunded the call in the
            // store: charge it nothing, the least the store can hold.
            Kind::CacheUnavailable { operation, .. } if *operation == "settle_tokens" => {
                let Some(call) = e.call else { continue };
                if let Some((tenant, scope, decider, index)) = open.remove(&(e.host.as_ref(), call))
                    && let Some(charge) = ledgers
                        .get_mut(&(tenant, scope, decider))
                        .and_then(|l| l.get_mut(index))
                {
                    charge.settled = Some(0);
                }
            }
            Kind::TokensRefused { .. } => refused += 1,
            _ => {}
        }
    }
    if ledgers.is_empty() {
        return not_applicable("no call reserved tokens");
    }
    let restarts = super::rpm_bound(ctx.scenario).restarts;
    let allowed = limit.saturating_mul(restarts.saturating_add(1));
    let window_us = ctx.window_us;
    let mut verdict = Verdict::Held;
    let mut worst: u64 = 0;
    for ((tenant, scope, _), charges) in &mut ledgers {
        charges.sort_by_key(|c| c.at_us);
        // A sliding window over the stamps: [end − window, end] for each end.
        let (mut start, mut used, mut excess) = (0usize, 0u64, 0u64);
        for end in 0..charges.len() {
            used += charges[end].used();
            excess += charges[end].used().saturating_sub(charges[end].estimate);
            let from = charges[end].at_us.saturating_sub(window_us);
            while charges[start].at_us < from {
                used -= charges[start].used();
                excess -= charges[start].used().saturating_sub(charges[start].estimate);
                start += 1;
            }
            worst = worst.max(used.saturating_sub(excess));
            if used > allowed.saturating_add(excess) && verdict == Verdict::Held {
                let e = &events[charges[end].event];
                verdict = violated(
                    e,
                    format!(
                        "tenant {tenant} on {scope}: {used} tokens in one window, over the limit {allowed} plus {excess} used beyond estimates"
                    ),
                );
            }
        }
    }
    let reserved: usize = ledgers.values().map(Vec::len).sum();
    let bound = if restarts == 0 {
        format!("limit {limit}")
    } else {
        format!("bound {allowed}: limit {limit} × {} for cache restarts", restarts + 1)
    };
    let figure = format!(
        "{reserved} reservations, {settled} settled, {refused} refused; most in a window beyond estimates' excess: {worst} ({bound}); {excess_total} tokens used beyond estimates in all"
    );
    (verdict, figure)
}

#[cfg(test)]
mod tests {
    use super::super::{Ctx, event};
    use super::*;
    use crate::scenario::{Scenario, tenant};

    const TOKENS: &str = r#"
name = "tokens"
duration_s = 100
[hardening]
window_s = 10
tokens_per_window = 1000
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 1 }]
"#;

    fn reserved(t_s: u64, call: u64, estimate: u64) -> TraceEvent {
        event(
            t_s * 1_000_000,
            "w",
            Some(call),
            Kind::Reserved {
                tenant: tenant(1),
                estimate,
                at_us: t_s * 1_000_000,
                decided_by: Decider::Cache,
            },
        )
    }

    fn settled(t_s: u64, call: u64, estimate: u64, actual: u64) -> TraceEvent {
        event(
            t_s * 1_000_000,
            "w",
            Some(call),
            Kind::Settled {
                tenant: tenant(1),
                estimate,
                actual,
                found: true,
            },
        )
    }

    fn check(events: &[TraceEvent]) -> Finding {
        let s = Scenario::parse("tokens.toml", TOKENS).unwrap();
        tokens_per_window(&Ctx::new(&s), events)
    }

    #[test]
    fn refunds_make_room_and_charges_beyond_estimates_are_allowed_for() {
        let events = [
            reserved(0, 1, 600),
            settled(1, 1, 600, 100),
            reserved(2, 2, 800),
            // This call used 300 more than it reserved: allowed for.
            settled(3, 2, 800, 1100),
        ];
        assert_eq!(check(&events).0, Verdict::Held, "{:?}", check(&events));
    }

    #[test]
    fn reservations_over_the_limit_in_one_window_are_caught() {
        let events = [reserved(0, 1, 600), reserved(5, 2, 600), reserved(20, 3, 900)];
        let (verdict, _) = check(&events);
        let Verdict::Violated { detail, t_us, .. } = verdict else {
            panic!("{verdict:?}")
        };
        assert_eq!(t_us, 5_000_000, "caught at the reservation that broke it");
        assert!(
            detail.contains("1200 tokens in one window, over the limit 1000"),
            "{detail}"
        );
    }

    #[test]
    fn without_a_token_budget_there_is_nothing_to_check() {
        let s = Scenario::parse("plain.toml", &TOKENS.replace("tokens_per_window = 1000\n", "")).unwrap();
        assert!(matches!(
            tokens_per_window(&Ctx::new(&s), &[]).0,
            Verdict::NotApplicable { .. }
        ));
    }
}
