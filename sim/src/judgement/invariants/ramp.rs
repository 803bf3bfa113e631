//! Slow start: a server whose circuit just closed takes only its ramp's
//! share of the calls its breaker admits.
//!
//! Under `hardening.slow_start_s` each call a ramping server's breaker
//! admits is drawn against the ramp's share, and the trace records the
//! draw ([`Kind::SlowStart`]): the close it ramps from, the instant, the
//! share and the draw. So the judgement is exact, with no statistics: each
//! draw's close must be one of that breaker's recorded closes (the latest
//! one, where one clock stamps the scope), its share the curve's at its
//! instant, and the call must go where the draw sent it; and no call a
//! ramping breaker admits may go without a draw.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use redstring::CircuitState;
use redstring::provider::SlowStart;

use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::timeline::{Breakers, Change};
use crate::evidence::trace::{Kind, TraceEvent};
use crate::hosts::worker::breaker_prefix;

/// What one call showed before its first request.
#[derive(Default)]
struct Admitting {
    /// A closed circuit's admission, waiting for the draw that may follow:
    /// the breaker, the admission's stamp and event, and whether a draw
    /// must follow (its breaker was in its ramp).
    undrawn: Option<(String, u64, TraceEvent, bool)>,
    /// Breakers whose draw passed the call on.
    passed: BTreeSet<String>,
    /// Where the call was to go: the first breaker that admitted it and
    /// kept it (a draw within its share, or no draw).
    kept: Option<String>,
    /// A cache could not be reached in the call (a fallback admitted it).
    unreachable: bool,
    /// Its first request was judged.
    sent: bool,
}

/// Invariant 20: under a slow start, every draw ramps from a close of its
/// breaker (on one clock, the latest at or before its instant) with the
/// curve's share at its instant; a call whose draw fell within the share
/// sends its first request to that server, and one passed on does not
/// while another server kept it; and every call admitted by a closed
/// circuit within the window after its close, by a worker with another
/// server to go to, was drawn.
pub(super) fn slow_start(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let Some(window_s) = ctx.scenario.hardening.slow_start_s else {
        return not_applicable("no slow start configured");
    };
    let Ok(ramp) = SlowStart::new(Duration::try_from_secs_f64(window_s).unwrap_or(Duration::MAX)) else {
        return not_applicable("the slow start's window is out of range");
    };
    let window_us = u64::try_from(ramp.window().as_micros()).unwrap_or(u64::MAX);
    let choices: BTreeMap<String, usize> = ctx
        .scenario
        .fleet()
        .into_iter()
        .map(|m| (m.name, m.servers.len()))
        .collect();
    // Every close of every breaker, by its stamp: a draw may be recorded
    // before the close it read is (the closing worker's reply is slower).
    let mut every_close: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for e in events {
        if let Kind::Breaker {
            breaker,
            from: CircuitState::HalfOpen,
            to: CircuitState::Closed,
            at_us,
        } = &e.kind
        {
            every_close
                .entry(ctx.scopes.breaker(e, breaker))
                .or_default()
                .insert(*at_us);
        }
    }
    // The closes seen so far, in trace order, forgotten with the cache.
    let mut closes: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    let mut fold = Breakers::new(ctx.scopes);
    let mut calls: BTreeMap<(&str, u64), Admitting> = BTreeMap::new();
    let (mut draws, mut passed_on) = (0u64, 0u64);
    let mut verdict = Verdict::Held;
    let fail = |verdict: &mut Verdict, e: &TraceEvent, detail: String| {
        if *verdict == Verdict::Held {
            *verdict = violated(e, detail);
        }
    };
    for e in events {
        match fold.observe(e) {
            Some(Change::Forgotten) => closes.clear(),
            Some(Change::Moved {
                scope,
                from: CircuitState::HalfOpen,
                to: CircuitState::Closed,
            }) => {
                if let Kind::Breaker { at_us, .. } = &e.kind {
                    closes.entry(scope).or_default().insert(*at_us);
                }
            }
            _ => {}
        }
        let Some(call) = e.call else { continue };
        let seen = calls.entry((e.host.as_ref(), call)).or_default();
        if seen.sent {
            continue;
        }
        // A closed admission is drawn by the next event, or kept; one in
        // its ramp must be drawn.
        if let Some((breaker, at, admitted, required)) = seen.undrawn.take()
            && !matches!(&e.kind, Kind::SlowStart { breaker: b, at_us, .. } if **b == *breaker && *at_us == at)
        {
            if required {
                fail(
                    &mut verdict,
                    &admitted,
                    format!("call {call} was admitted by {breaker} within its slow start and not drawn"),
                );
            }
            seen.kept.get_or_insert(breaker);
        }
        match &e.kind {
            Kind::Allowed {
                breaker,
                state: CircuitState::Closed,
                probe: None,
                at_us,
            } => {
                let scope = ctx.scopes.breaker(e, breaker);
                let ramping = closes
                    .get(&scope)
                    .and_then(|c| c.range(..=*at_us).next_back())
                    .is_some_and(|closed| at_us - closed < window_us);
                let elsewhere = choices.get(e.host.as_ref()).is_some_and(|n| *n > 1);
                let required = ramping && elsewhere && ctx.single_clock && !seen.unreachable;
                seen.undrawn = Some((breaker.to_string(), *at_us, e.clone(), required));
            }
            Kind::Allowed { breaker, .. } => {
                seen.kept.get_or_insert_with(|| breaker.to_string());
            }
            Kind::SlowStart {
                breaker,
                closed_at_us,
                at_us,
                share,
                draw,
            } => {
                draws += 1;
                let scope = ctx.scopes.breaker(e, breaker);
                let known = every_close.get(&scope).is_some_and(|c| c.contains(closed_at_us));
                let latest = closes.get(&scope).and_then(|c| c.range(..=*at_us).next_back()).copied();
                let expected = ramp.share(
                    redstring::Timestamp::from_micros(*closed_at_us),
                    redstring::Timestamp::from_micros(*at_us),
                );
                if !known {
                    fail(
                        &mut verdict,
                        e,
                        format!(
                            "call {call}'s draw at {breaker} ramps from {closed_at_us} µs, when its circuit never closed"
                        ),
                    );
                } else if ctx.single_clock && latest.is_some_and(|l| l != *closed_at_us) {
                    fail(
                        &mut verdict,
                        e,
                        format!(
                            "call {call}'s draw at {breaker} ramps from {closed_at_us} µs, not from its latest close at {} µs",
                            latest.unwrap_or_default()
                        ),
                    );
                } else if expected != Some(*share) {
                    fail(
                        &mut verdict,
                        e,
                        format!(
                            "call {call}'s draw at {breaker} had a share of {share} ppm, {} µs after the close, where the ramp gives {expected:?}",
                            at_us.saturating_sub(*closed_at_us)
                        ),
                    );
                }
                if draw < share {
                    seen.kept.get_or_insert_with(|| breaker.to_string());
                } else {
                    passed_on += 1;
                    seen.passed.insert(breaker.to_string());
                }
            }
            Kind::CacheUnavailable { .. } => seen.unreachable = true,
            Kind::Request { server } => {
                seen.sent = true;
                if seen.unreachable {
                    continue;
                }
                let to = breaker_prefix(server);
                match &seen.kept {
                    Some(kept) if *kept != to => fail(
                        &mut verdict,
                        e,
                        format!("call {call} was kept by {kept}, but its first request went to {server}"),
                    ),
                    None if !seen.passed.is_empty() && !seen.passed.contains(&to) => fail(
                        &mut verdict,
                        e,
                        format!("call {call}, passed on by every server that admitted it, went to {server}"),
                    ),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    if draws == 0 && verdict == Verdict::Held {
        return not_applicable("no call was admitted by a ramping server");
    }
    (
        verdict,
        format!(
            "{draws} calls drawn in a slow start, {passed_on} passed on to another server ({} ppm floor)",
            ramp.floor()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judgement::invariants::{Invariant, check_all, event};
    use crate::scenario::Scenario;

    /// Two servers in order, a 10 s slow start; per-worker caches (one
    /// clock stamps each worker's breakers).
    const RAMP: &str = r#"
name = "synthetic"
duration_s = 100
[hardening]
rpm = 60
failure_threshold = 1
recovery_timeout_s = 5
slow_start_s = 10
routing = "ordered"
[[servers]]
name = "gpu"
[[servers]]
name = "spare"
[[workers]]
name = "w"
servers = ["gpu", "spare"]
tenants = [{ id = 1, calls_per_min = 1 }]
"#;

    const S: u64 = 1_000_000;

    fn verdict(events: &[TraceEvent]) -> (Verdict, String) {
        let s = Scenario::parse("synthetic.toml", RAMP).unwrap();
        let c = check_all(&s, events)
            .into_iter()
            .find(|c| c.name == Invariant::SlowStart)
            .unwrap();
        (c.verdict, c.figure)
    }

    fn in_call(call: u64, t_us: u64, kind: Kind) -> TraceEvent {
        event(t_us, "w", Some(call), kind)
    }

    /// The gpu's circuit closes at 20 s (its probe's success).
    fn closed_at_20s() -> TraceEvent {
        in_call(
            1,
            20 * S,
            Kind::Breaker {
                breaker: "kg:circuit:gpu".into(),
                from: CircuitState::HalfOpen,
                to: CircuitState::Closed,
                at_us: 20 * S,
            },
        )
    }

    fn allowed(call: u64, server: &str, t_us: u64) -> TraceEvent {
        in_call(
            call,
            t_us,
            Kind::Allowed {
                breaker: breaker_prefix(server).into(),
                state: CircuitState::Closed,
                probe: None,
                at_us: t_us,
            },
        )
    }

    fn drawn(call: u64, t_us: u64, closed_at_us: u64, share: u32, draw: u32) -> TraceEvent {
        in_call(
            call,
            t_us,
            Kind::SlowStart {
                breaker: "kg:circuit:gpu".into(),
                closed_at_us,
                at_us: t_us,
                share,
                draw,
            },
        )
    }

    fn request(call: u64, server: &str, t_us: u64) -> TraceEvent {
        in_call(call, t_us, Kind::Request { server: server.into() })
    }

    /// At 22.5 s, a quarter into the window: a draw within the share goes
    /// to the gpu, one above it to the spare.
    fn ramped() -> Vec<TraceEvent> {
        let t = 22_500_000;
        vec![
            closed_at_20s(),
            allowed(2, "gpu", t),
            drawn(2, t, 20 * S, 250_000, 100_000),
            request(2, "gpu", t),
            allowed(3, "gpu", t),
            drawn(3, t, 20 * S, 250_000, 700_000),
            allowed(3, "spare", t),
            request(3, "spare", t),
        ]
    }

    #[test]
    fn draws_on_the_curve_that_send_calls_where_they_fell_hold() {
        let (v, figure) = verdict(&ramped());
        assert_eq!(v, Verdict::Held);
        assert_eq!(
            figure,
            "2 calls drawn in a slow start, 1 passed on to another server (100000 ppm floor)"
        );
        // Passed on with nowhere else to go, the call comes back: holds.
        let t = 21 * S;
        let back = [
            closed_at_20s(),
            allowed(4, "gpu", t),
            drawn(4, t, 20 * S, 100_000, 900_000),
            request(4, "gpu", t),
        ];
        assert_eq!(verdict(&back).0, Verdict::Held);
        // After the window, a closed admission needs no draw.
        let after = [closed_at_20s(), allowed(5, "gpu", 30 * S), request(5, "gpu", 30 * S)];
        assert!(matches!(verdict(&after).0, Verdict::NotApplicable { .. }));
    }

    #[test]
    fn an_admission_in_the_ramp_without_a_draw_is_caught() {
        let t = 25 * S;
        let events = [closed_at_20s(), allowed(2, "gpu", t), request(2, "gpu", t)];
        let (v, _) = verdict(&events);
        let Verdict::Violated { detail, t_us, .. } = v else {
            panic!("{v:?}")
        };
        assert_eq!(t_us, t);
        assert!(detail.contains("within its slow start and not drawn"), "{detail}");
    }

    #[test]
    fn a_draw_off_the_curve_or_from_another_close_is_caught() {
        let t = 22_500_000;
        let wrong_share = [
            closed_at_20s(),
            allowed(2, "gpu", t),
            drawn(2, t, 20 * S, 500_000, 100_000),
            request(2, "gpu", t),
        ];
        let (v, _) = verdict(&wrong_share);
        assert!(
            matches!(&v, Verdict::Violated { detail, .. } if detail.contains("where the ramp gives Some(250000)")),
            "{v:?}"
        );
        // Ramping from an instant the circuit never closed at (a worker's
        // own idea of when it saw the close).
        let local = [
            closed_at_20s(),
            allowed(2, "gpu", t),
            drawn(2, t, 21 * S, 150_000, 100_000),
            request(2, "gpu", t),
        ];
        let (v, _) = verdict(&local);
        assert!(
            matches!(&v, Verdict::Violated { detail, .. } if detail.contains("when its circuit never closed")),
            "{v:?}"
        );
    }

    #[test]
    fn a_call_sent_against_its_draw_is_caught() {
        let t = 22_500_000;
        // Drawn within the share, sent to the spare.
        let kept_but_left = [
            closed_at_20s(),
            allowed(2, "gpu", t),
            drawn(2, t, 20 * S, 250_000, 100_000),
            allowed(2, "spare", t),
            request(2, "spare", t),
        ];
        let (v, _) = verdict(&kept_but_left);
        assert!(
            matches!(&v, Verdict::Violated { detail, .. } if detail.contains("was kept by kg:circuit:gpu")),
            "{v:?}"
        );
        // Passed on, the spare admitted it, and it went to the gpu anyway.
        let passed_but_sent = [
            closed_at_20s(),
            allowed(2, "gpu", t),
            drawn(2, t, 20 * S, 250_000, 900_000),
            allowed(2, "spare", t),
            request(2, "gpu", t),
        ];
        let (v, _) = verdict(&passed_but_sent);
        assert!(
            matches!(&v, Verdict::Violated { detail, .. } if detail.contains("was kept by kg:circuit:spare")),
            "{v:?}"
        );
    }
}
