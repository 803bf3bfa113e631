//! The breaker's promises: a bounded number of probes per half-open
//! episode, no opening on sparse failures, and no call while open.
//!
//! Each checker replays breaker state through the one fold,
//! [`Breakers`], and keeps only what its own subject needs.

use std::collections::BTreeMap;

use redstring::CircuitState;

use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::timeline::{Breakers, Change};
use crate::evidence::trace::{Kind, TraceEvent};

/// Invariant 3: a half-open episode never holds more than
/// `half_open_max_calls` live probes. A probe is live from its admission until
/// its lease (the recovery timeout, the breaker's default) ends on the clock
/// that stamped it, it is handed back, or the episode ends.
pub(super) fn half_open_probes(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let max = ctx.scenario.hardening.half_open_max_calls as usize;
    let lease = ctx.recovery_us;
    let mut breakers = Breakers::new(ctx.scopes);
    // The live probes of each breaker's current half-open episode: (seq, stamp).
    let mut live: BTreeMap<String, Vec<(u32, u64)>> = BTreeMap::new();
    let (mut episodes, mut most, mut verdict) = (0, 0, Verdict::Held);
    for e in events {
        match breakers.observe(e) {
            Some(Change::Moved {
                scope,
                to: CircuitState::HalfOpen,
                ..
            }) => {
                episodes += 1;
                live.insert(scope, Vec::new());
            }
            Some(Change::Moved { .. } | Change::Forgotten) | None => {}
        }
        match &e.kind {
            Kind::ProbeReleased { breaker, seq } => {
                if let Some(probes) = live.get_mut(&ctx.scopes.breaker(e, breaker)) {
                    probes.retain(|(s, _)| s != seq);
                }
            }
            Kind::Allowed {
                breaker,
                state: CircuitState::HalfOpen,
                probe: Some(seq),
                at_us,
            } => {
                let scope = ctx.scopes.breaker(e, breaker);
                if breakers.state(&scope) == CircuitState::HalfOpen
                    && let Some(probes) = live.get_mut(&scope)
                {
                    probes.retain(|(_, stamp)| stamp.saturating_add(lease) > *at_us);
                    probes.push((*seq, *at_us));
                    most = most.max(probes.len());
                    if probes.len() > max && verdict == Verdict::Held {
                        verdict = violated(e, format!("{} live probes (half_open_max_calls {max})", probes.len()));
                    }
                }
            }
            _ => {}
        }
    }
    if episodes == 0 {
        return not_applicable("no half-open episode");
    }
    (
        verdict,
        format!("episodes: {episodes}; most live probes at once: {most} (max {max})"),
    )
}

/// Invariant 4: failures spaced further apart than `recovery_timeout` never
/// open the circuit (threshold ≥ 2). Checked as the necessary condition: the
/// `failure_threshold` failures before an opening span at most one timeout.
pub(super) fn sparse_failures(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let threshold = ctx.scenario.hardening.failure_threshold as usize;
    if threshold < 2 {
        return not_applicable("failure_threshold is 1");
    }
    // Tolerance for a shared cache's TTLs running on a drifting clock.
    let slack = ctx.scenario.tick_ms * 1000 + ctx.recovery_us / 1000;
    let mut breakers = Breakers::new(ctx.scopes);
    // Failures reported while the breaker is closed, since it last closed.
    let mut failures: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let (mut openings, mut widest, mut verdict) = (0, 0u64, Verdict::Held);
    for e in events {
        match &e.kind {
            Kind::FailureRecorded { breaker, at_us } => {
                let scope = ctx.scopes.breaker(e, breaker);
                if breakers.state(&scope) == CircuitState::Closed {
                    failures.entry(scope).or_default().push(ctx.instant(e, *at_us));
                }
            }
            Kind::FailuresCleared { breaker, .. } => {
                let scope = ctx.scopes.breaker(e, breaker);
                if breakers.state(&scope) == CircuitState::Closed {
                    failures.entry(scope).or_default().clear();
                }
            }
            _ => {}
        }
        match breakers.observe(e) {
            Some(Change::Moved { scope, from, to }) => {
                let list = failures.entry(scope).or_default();
                if (from, to) == (CircuitState::Closed, CircuitState::Open) {
                    openings += 1;
                    let now = match e.kind {
                        Kind::Breaker { at_us, .. } => ctx.instant(e, at_us),
                        _ => e.t_us,
                    };
                    if list.len() >= threshold {
                        let first = list[list.len() - threshold];
                        let span = now.saturating_sub(first);
                        widest = widest.max(span);
                        if span > ctx.recovery_us + slack && verdict == Verdict::Held {
                            verdict = violated(
                                e,
                                format!("opened on {threshold} failures spread over {} ms", span / 1000),
                            );
                        }
                    }
                }
                list.clear();
            }
            Some(Change::Forgotten) => failures.clear(),
            None => {}
        }
    }
    if openings == 0 {
        return not_applicable("the circuit never opened");
    }
    (
        verdict,
        format!(
            "openings: {openings}; widest spread of the failures that opened it: {} ms",
            widest / 1000
        ),
    )
}

/// Invariant 5: no call is admitted while its breaker is open and not yet due
/// to probe — per worker, or fleet-wide with a shared cache.
pub(super) fn no_call_while_open(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let mut breakers = Breakers::new(ctx.scopes);
    let (mut admitted_while_impaired, mut verdict) = (0, Verdict::Held);
    let mut any_open = false;
    // Calls the breaker's fallback let through while the cache could not be
    // reached (`on_cache_error = "allow"`): no circuit decided them, so they
    // are outside the claim, and counted.
    let mut unchecked = 0;
    for e in events {
        if let Kind::CacheUnavailable {
            admitted_call: true, ..
        } = e.kind
        {
            unchecked += 1;
        }
        if let Kind::Allowed {
            breaker,
            state: decided,
            ..
        } = &e.kind
        {
            let current = breakers.state(&ctx.scopes.breaker(e, breaker));
            let stale = match decided {
                CircuitState::Closed => current != CircuitState::Closed,
                CircuitState::HalfOpen | CircuitState::Open => current == CircuitState::Open,
            };
            if stale {
                admitted_while_impaired += 1;
                if verdict == Verdict::Held {
                    verdict = violated(e, format!("admitted as {decided:?} while the circuit was {current:?}"));
                }
            }
        }
        if let Some(Change::Moved { to, .. }) = breakers.observe(e) {
            any_open |= to == CircuitState::Open;
        }
    }
    if !any_open {
        return not_applicable("the circuit never opened");
    }
    let mut figure = format!("{admitted_while_impaired} admissions while open");
    if unchecked > 0 {
        figure.push_str(&format!(
            "; {unchecked} calls let through by the breaker's fallback while the cache was unreachable (on_cache_error = allow)"
        ));
    }
    (verdict, figure)
}
