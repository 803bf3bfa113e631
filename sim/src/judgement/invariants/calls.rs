//! Per-call promises: the limiter and the breaker are per call, retry is per
//! attempt, and retries are spread by their jitter.
//!
//! Both checkers read what each call's own task recorded (events carry the
//! call's number, [`TraceEvent::call`]), so they hold every call to its own
//! layers however many calls a worker interleaves.

use std::collections::BTreeMap;

use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::trace::{Kind, TraceEvent};

/// Invariant 8: a call takes at most one limiter slot and at most one breaker
/// admission, however many attempts it makes — retry sits inside both.
pub(super) fn once_per_call(_ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    // (host, call) → (slots, admissions)
    let mut per_call: BTreeMap<(&str, u64), (u32, u32)> = BTreeMap::new();
    let (mut most_slots, mut most_admissions, mut verdict) = (0, 0, Verdict::Held);
    for e in events {
        let Some(call) = e.call else { continue };
        let entry = per_call.entry((e.host.as_str(), call)).or_default();
        match &e.kind {
            Kind::Admitted { .. } => entry.0 += 1,
            Kind::Allowed { .. } => entry.1 += 1,
            _ => continue,
        }
        let (slots, admissions) = *entry;
        most_slots = most_slots.max(slots);
        most_admissions = most_admissions.max(admissions);
        if (slots > 1 || admissions > 1) && verdict == Verdict::Held {
            verdict = violated(
                e,
                format!("call {call} took {slots} limiter slots and {admissions} breaker admissions"),
            );
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

/// Invariant 9: retries are spread by the configured jitter. Of the retries
/// after the same attempt number whose wait the schedule decided (above any
/// `Retry-After` floor the server set), no more than half may sit exactly at
/// the unjittered delay — with jitter `j` a draw lands there with probability
/// about one in `2 · delay · j` microseconds. Attempt numbers whose jitter
/// band is under a millisecond wide are not judged (the microsecond trace
/// cannot tell them apart).
pub(super) fn retry_jitter(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let h = &ctx.scenario.hardening;
    if h.jitter == 0.0 {
        return not_applicable("jitter is 0: retries are not spread by design");
    }
    let Ok(policy) = h.retry_policy() else {
        return not_applicable("the retry policy is invalid");
    };
    // attempt → (retries judged, retries at exactly the unjittered delay)
    let mut by_attempt: BTreeMap<u32, (usize, usize, Option<&TraceEvent>)> = BTreeMap::new();
    for e in events {
        let Kind::Retry {
            attempt,
            delay_us,
            floor_us,
        } = &e.kind
        else {
            continue;
        };
        if delay_us <= floor_us {
            continue;
        }
        let base = policy.base_delay(attempt.saturating_sub(1));
        let band_us = base.as_secs_f64() * h.jitter * 2e6;
        if band_us < 1000.0 {
            continue;
        }
        let base_us = u64::try_from(base.as_micros()).unwrap_or(u64::MAX);
        let entry = by_attempt.entry(*attempt).or_default();
        entry.0 += 1;
        if delay_us.abs_diff(base_us) == 0 {
            entry.1 += 1;
            entry.2 = Some(e);
        }
    }
    let judged: usize = by_attempt.values().map(|(n, _, _)| n).sum();
    if judged == 0 {
        return not_applicable("no retry waited on the schedule's delay");
    }
    let mut verdict = Verdict::Held;
    for (attempt, (n, exact, last)) in &by_attempt {
        if *n >= MIN_RETRIES
            && 2 * exact > *n
            && let Some(e) = last
        {
            verdict = violated(
                e,
                format!("{exact} of {n} retries after attempt {attempt} waited exactly the unjittered delay"),
            );
            break;
        }
    }
    let exact: usize = by_attempt.values().map(|(_, x, _)| x).sum();
    (
        verdict,
        format!("{judged} retries on the schedule's delay; {exact} at exactly the unjittered delay"),
    )
}
