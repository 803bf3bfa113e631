//! Accounting: every unit of work ends once, classified, and no call sends
//! more requests than its retry schedule allows.

use std::collections::BTreeMap;

use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::timeline::FLEET;
use crate::evidence::trace::{Kind, TraceEvent};

/// Invariant 7: every unit of work ends once as a success, a classified error
/// or a deferral; and requests ≤ (max_retries + 1) × the calls that reached
/// the retry layer.
pub(super) fn accounting(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let mut open: BTreeMap<(&str, u64), u64> = BTreeMap::new();
    let (mut arrivals, mut ended, mut requests, mut calls) = (0u64, 0u64, 0u64, 0u64);
    let mut verdict = Verdict::Held;
    for e in events {
        match &e.kind {
            Kind::Arrival { call, .. } => {
                arrivals += 1;
                open.insert((e.host.as_str(), *call), e.t_us);
            }
            Kind::CallEnd { call, .. } => {
                ended += 1;
                if open.remove(&(e.host.as_str(), *call)).is_none() && verdict == Verdict::Held {
                    verdict = violated(e, format!("call {call} ended without arriving, or ended twice"));
                }
            }
            Kind::Request { .. } => requests += 1,
            kind if kind.reaches_retry() => calls += 1,
            _ => {}
        }
    }
    if arrivals == 0 {
        return not_applicable("no work arrived");
    }
    let per_call = u64::from(ctx.scenario.hardening.max_retries) + 1;
    if requests > per_call * calls && verdict == Verdict::Held {
        verdict = Verdict::Violated {
            t_us: events.last().map_or(0, |e| e.t_us),
            host: FLEET.into(),
            detail: format!("{requests} requests for {calls} admitted calls (at most {per_call} each)"),
        };
    }
    let in_flight = open.len();
    let amplification = if calls == 0 {
        0.0
    } else {
        requests as f64 / calls as f64
    };
    (
        verdict,
        format!(
            "{arrivals} arrived, {ended} ended, {in_flight} in flight at the end; {requests} requests for {calls} admitted calls ({amplification:.2}×)"
        ),
    )
}
