//! Figures per fault episode: what one outage of one server cost its callers.
//!
//! The whole-run figures ([`crate::judgement::figures`]) blend every outage
//! with the quiet time around it. These are measured over one episode
//! ([`Episode`]: from the fault that impaired a server until it was ready
//! again) and over the calls of the workers that use that server only:
//!
//! - `requests_reached`: answers the server gave (or requests it dropped)
//!   during the outage — requests that reached it while it was impaired;
//! - `amplification`: requests the workers sent to it during the outage per
//!   call that arrived at them during it (`None`: no call arrived);
//! - `time_to_open_s`: from the episode's start to the first breaker of
//!   those workers opening during it (`None`: none opened);
//! - `goodput_recovery`: [`goodput_recovery`] from the instant the server
//!   was ready again, over those workers' calls;
//! - `calls_failed`, `calls_deferred`: calls that arrived during the outage
//!   and ended failed (not `ok`, not deferred), or deferred by the limiter;
//! - latency p50/p95/p99 of judged calls that arrived *before* (since the
//!   end of the server's previous episode), *during*, and *after* (until its
//!   next episode, or the end of the run) the outage.
//!
//! A call is placed by its arrival, as in goodput recovery.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use redstring::CircuitState;
use serde::Serialize;

use crate::evidence::episodes::{Episode, ReadyBasis};
use crate::evidence::outcome::CallOutcome;
use crate::evidence::trace::{Kind, TraceEvent};
use crate::hosts::worker::breaker_prefix;
use crate::judgement::figures::{Recovery, goodput_recovery, percentile_ms};
use crate::scenario::{FaultKind, Scenario};

/// Latency percentiles of judged calls over one stretch of time, seconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Latencies {
    /// Judged calls in the stretch.
    pub calls: u64,
    /// Median (`None`: no judged call).
    pub p50_s: Option<f64>,
    /// 95th percentile.
    pub p95_s: Option<f64>,
    /// 99th percentile.
    pub p99_s: Option<f64>,
}

impl Latencies {
    fn of(mut ms: Vec<u64>) -> Latencies {
        ms.sort_unstable();
        let pct = |p| percentile_ms(&ms, p).map(|v| v as f64 / 1000.0);
        Latencies {
            calls: ms.len() as u64,
            p50_s: pct(50),
            p95_s: pct(95),
            p99_s: pct(99),
        }
    }
}

/// The figures of one fault episode.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EpisodeFigures {
    /// The impaired server.
    pub server: String,
    /// The kind of fault that began the episode.
    pub kind: FaultKind,
    /// When it began, seconds since the start.
    pub start_s: f64,
    /// When the server was ready again (`None`: not within the run).
    pub ready_s: Option<f64>,
    /// How the ready instant was established.
    pub ready_basis: Option<ReadyBasis>,
    /// Requests that reached the server while it was impaired.
    pub requests_reached: u64,
    /// Requests to the server per call that arrived at its workers, during
    /// the outage.
    pub amplification: Option<f64>,
    /// Seconds from the episode's start to the first breaker opening.
    pub time_to_open_s: Option<f64>,
    /// Goodput recovery from the ready instant.
    pub goodput_recovery: Recovery,
    /// Calls that arrived during the outage and failed.
    pub calls_failed: u64,
    /// Calls that arrived during the outage and were deferred by the limiter.
    pub calls_deferred: u64,
    /// Latencies of calls that arrived before the outage.
    pub latency_before: Latencies,
    /// … during it.
    pub latency_during: Latencies,
    /// … after it.
    pub latency_after: Latencies,
}

/// One call of the run: where and when it arrived, and how it ended.
struct Call {
    host: Arc<str>,
    arrived_us: u64,
    end: Option<(CallOutcome, u64)>,
}

fn calls(events: &[TraceEvent]) -> Vec<Call> {
    let mut index: BTreeMap<(&str, u64), usize> = BTreeMap::new();
    let mut out: Vec<Call> = Vec::new();
    for e in events {
        match &e.kind {
            Kind::Arrival { call, .. } => {
                index.insert((e.host.as_ref(), *call), out.len());
                out.push(Call {
                    host: e.host.clone(),
                    arrived_us: e.t_us,
                    end: None,
                });
            }
            Kind::CallEnd(end) => match index.get(&(e.host.as_ref(), end.call)) {
                Some(&i) => out[i].end = Some((end.outcome, end.latency_ms)),
                None => out.push(Call {
                    host: e.host.clone(),
                    arrived_us: e.t_us.saturating_sub(end.latency_ms.saturating_mul(1000)),
                    end: Some((end.outcome, end.latency_ms)),
                }),
            },
            _ => {}
        }
    }
    out
}

fn secs(us: u64) -> f64 {
    us as f64 / 1e6
}

/// The figures of every episode in `episodes`, for a run of `scenario`
/// that lasted `end_us`.
pub fn episode_figures(
    scenario: &Scenario,
    episodes: &[Episode],
    events: &[TraceEvent],
    end_us: u64,
) -> Vec<EpisodeFigures> {
    let all_calls = calls(events);
    let fleet = scenario.fleet();
    episodes
        .iter()
        .map(|ep| {
            let workers: BTreeSet<&str> = fleet
                .iter()
                .filter(|m| m.servers.contains(&ep.server))
                .map(|m| m.name.as_str())
                .collect();
            // The same server's neighbouring episodes bound before and after.
            let same: Vec<&Episode> = episodes.iter().filter(|o| o.server == ep.server).collect();
            let before_from = same
                .iter()
                .filter(|o| o.start_us < ep.start_us)
                .map(|o| o.outage_end_us(end_us))
                .max()
                .unwrap_or(0);
            let after_to = same
                .iter()
                .filter(|o| o.start_us > ep.start_us)
                .map(|o| o.start_us)
                .min()
                .unwrap_or(end_us);
            figures_of(ep, &workers, events, &all_calls, (before_from, after_to), end_us)
        })
        .collect()
}

fn figures_of(
    ep: &Episode,
    workers: &BTreeSet<&str>,
    events: &[TraceEvent],
    all_calls: &[Call],
    (before_from, after_to): (u64, u64),
    end_us: u64,
) -> EpisodeFigures {
    let (start, stop) = (ep.start_us, ep.outage_end_us(end_us));
    let during = |t: u64| t >= start && t < stop;
    let mut requests_reached = 0u64;
    let mut requests_sent = 0u64;
    let mut opened = None;
    for e in events {
        match &e.kind {
            Kind::Served { .. } if *e.host == *ep.server && during(e.t_us) => requests_reached += 1,
            Kind::Request { server } if **server == *ep.server && during(e.t_us) => requests_sent += 1,
            Kind::Breaker {
                breaker,
                to: CircuitState::Open,
                ..
            } if opened.is_none()
                && **breaker == *breaker_prefix(&ep.server)
                && workers.contains(e.host.as_ref())
                && during(e.t_us) =>
            {
                opened = Some(e.t_us - start);
            }
            _ => {}
        }
    }
    let mine: Vec<&Call> = all_calls.iter().filter(|c| workers.contains(&*c.host)).collect();
    let arrived_during = mine.iter().filter(|c| during(c.arrived_us)).count() as u64;
    let (mut failed, mut deferred) = (0u64, 0u64);
    let (mut before, mut within, mut after) = (Vec::new(), Vec::new(), Vec::new());
    for c in &mine {
        let Some((outcome, latency_ms)) = c.end else { continue };
        if outcome.is_deferred() {
            deferred += u64::from(during(c.arrived_us));
            continue;
        }
        if during(c.arrived_us) {
            failed += u64::from(!outcome.is_ok());
            within.push(latency_ms);
        } else if c.arrived_us >= before_from && c.arrived_us < start {
            before.push(latency_ms);
        } else if c.arrived_us >= stop && c.arrived_us < after_to {
            after.push(latency_ms);
        }
    }
    let own: Vec<TraceEvent> = events
        .iter()
        .filter(|e| workers.contains(e.host.as_ref()))
        .cloned()
        .collect();
    let goodput = match ep.ready_us {
        Some(ready) => goodput_recovery(Some(ready), &own, end_us),
        None => Recovery::NotReady,
    };
    EpisodeFigures {
        server: ep.server.clone(),
        kind: ep.kind,
        start_s: secs(start),
        ready_s: ep.ready_us.map(secs),
        ready_basis: ep.basis,
        requests_reached,
        amplification: (arrived_during > 0).then(|| requests_sent as f64 / arrived_during as f64),
        time_to_open_s: opened.map(secs),
        goodput_recovery: goodput,
        calls_failed: failed,
        calls_deferred: deferred,
        latency_before: Latencies::of(before),
        latency_during: Latencies::of(within),
        latency_after: Latencies::of(after),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::outcome::{Answer, Limit};
    use crate::evidence::trace::CallEnded;
    use crate::scenario::tenant;

    const SCENARIO: &str = r#"
name = "episode"
duration_s = 60
[[servers]]
name = "gpu"
reload_s = 5
[[servers]]
name = "other"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 60 }]
[[workers]]
name = "x"
servers = ["other"]
tenants = [{ id = 1, calls_per_min = 60 }]
[[faults]]
kind = "crash"
at_s = 10
server = "gpu"
[[faults]]
kind = "restart"
at_s = 20
server = "gpu"
"#;

    const S: u64 = 1_000_000;

    fn at(t_us: u64, host: &str, kind: Kind) -> TraceEvent {
        TraceEvent {
            t_us,
            host: host.into(),
            call: None,
            kind,
        }
    }

    /// A call on `host` arriving at `t_us` and ending `latency_ms` later.
    fn call(out: &mut Vec<TraceEvent>, host: &str, n: u64, t_us: u64, outcome: CallOutcome, latency_ms: u64) {
        out.push(at(
            t_us,
            host,
            Kind::Arrival {
                call: n,
                tenant: tenant(1),
            },
        ));
        out.push(at(
            t_us + latency_ms * 1000,
            host,
            Kind::CallEnd(Box::new(CallEnded {
                call: n,
                tenant: tenant(1),
                outcome,
                attempts: 1,
                latency_ms,
                retry_after_us: None,
                answer_us: None,
            })),
        ));
    }

    fn request(t_us: u64, host: &str, server: &str) -> TraceEvent {
        at(t_us, host, Kind::Request { server: server.into() })
    }

    /// The hand-checked trace: the crash at 10 s, ready at 25 s (restart at
    /// 20 s, loaded 5 s later).
    fn trace() -> Vec<TraceEvent> {
        let mut ev = Vec::new();
        // Before: two ok calls of 100 and 300 ms.
        call(&mut ev, "w", 1, 2 * S, CallOutcome::Ok, 100);
        call(&mut ev, "w", 2, 5 * S, CallOutcome::Ok, 300);
        // During: 3 calls; one failed after 3 requests, one circuit-open,
        // one deferred by the limiter.
        ev.push(request(11 * S, "w", "gpu"));
        ev.push(request(12 * S, "w", "gpu"));
        ev.push(request(13 * S, "w", "gpu"));
        call(&mut ev, "w", 3, 11 * S, CallOutcome::Failed("retry_exhausted"), 4000);
        ev.push(at(
            14 * S,
            "w",
            Kind::Breaker {
                breaker: "kg:circuit:gpu".into(),
                from: CircuitState::Closed,
                to: CircuitState::Open,
                at_us: 0,
            },
        ));
        call(&mut ev, "w", 4, 16 * S, CallOutcome::CircuitOpen, 1);
        call(&mut ev, "w", 5, 17 * S, CallOutcome::Deferred(Limit::Requests), 2);
        // While loading (20..25 s) the server answers two requests `loading`.
        ev.push(at(21 * S, "gpu", Kind::served(Answer::Loading)));
        ev.push(at(22 * S, "gpu", Kind::served(Answer::Loading)));
        ev.push(request(21 * S, "w", "gpu"));
        ev.push(request(22 * S, "w", "gpu"));
        ev.push(at(25 * S, "gpu", Kind::Loaded));
        // Another server's worker and answers do not count.
        call(&mut ev, "x", 1, 12 * S, CallOutcome::Failed("timeout"), 10);
        ev.push(request(12 * S, "x", "other"));
        // After: one ok call a second from 25 s to 59 s, 200 ms each.
        for (i, s) in (25..60).enumerate() {
            call(&mut ev, "w", 10 + i as u64, s * S, CallOutcome::Ok, 200);
        }
        ev.sort_by_key(|e| e.t_us);
        ev
    }

    fn figures() -> EpisodeFigures {
        let s = Scenario::parse("episode.toml", SCENARIO).unwrap();
        let events = trace();
        let eps = crate::evidence::episodes::episodes(&s, &events);
        let mut all = episode_figures(&s, &eps, &events, 60 * S);
        assert_eq!(all.len(), 1);
        all.remove(0)
    }

    #[test]
    fn the_episode_runs_from_the_crash_until_the_server_is_ready() {
        let f = figures();
        assert_eq!((f.server.as_str(), f.kind), ("gpu", FaultKind::Crash));
        assert_eq!((f.start_s, f.ready_s), (10.0, Some(25.0)));
        assert_eq!(f.ready_basis, Some(ReadyBasis::Loaded));
    }

    #[test]
    fn requests_reached_and_amplification_count_the_outage_only() {
        let f = figures();
        // Two loading answers; five requests for three arriving calls.
        assert_eq!(f.requests_reached, 2);
        assert_eq!(f.amplification, Some(5.0 / 3.0));
        assert_eq!(f.time_to_open_s, Some(4.0));
    }

    #[test]
    fn failed_and_deferred_calls_are_those_that_arrived_during_the_outage() {
        let f = figures();
        assert_eq!((f.calls_failed, f.calls_deferred), (2, 1));
    }

    #[test]
    fn latencies_are_split_before_during_and_after() {
        let f = figures();
        assert_eq!(
            f.latency_before,
            Latencies {
                calls: 2,
                p50_s: Some(0.1),
                p95_s: Some(0.3),
                p99_s: Some(0.3)
            }
        );
        // During: 4000 ms and 1 ms (the deferred call is left out).
        assert_eq!(f.latency_during.calls, 2);
        assert_eq!(
            (f.latency_during.p50_s, f.latency_during.p99_s),
            (Some(0.001), Some(4.0))
        );
        assert_eq!((f.latency_after.calls, f.latency_after.p50_s), (35, Some(0.2)));
    }

    #[test]
    fn goodput_recovery_counts_from_the_ready_instant() {
        // Every call after 25 s is ok: recovered at once after ready.
        assert_eq!(figures().goodput_recovery, Recovery::Recovered { s: 0.0 });
        // Never ready: no recovery to measure.
        let s = Scenario::parse("episode.toml", SCENARIO).unwrap();
        let mut eps = crate::evidence::episodes::episodes(&s, &trace());
        eps[0].ready_us = None;
        let f = episode_figures(&s, &eps, &trace(), 60 * S);
        assert_eq!(f[0].goodput_recovery, Recovery::NotReady);
        assert_eq!(f[0].latency_after.calls, 0);
    }
}
