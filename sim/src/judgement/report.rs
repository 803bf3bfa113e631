//! The end-of-run report: what happened, in figures, and how to replay it.
//!
//! Computed from the trace and the checkers' verdicts alone. The text form is
//! what `redstring-sim run` prints; the JSON form is what `--json` writes.
//! Wall-clock figures (how fast the simulation ran) are the only part that
//! varies between identical runs, so they are kept apart from everything else
//! and left out of snapshots.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use redstring::CircuitState;
use redstring::cache::TimeSource;
use serde::Serialize;

use crate::evidence::trace::{DRIVER, Kind, TraceEvent};
use crate::judgement::Run;
use crate::judgement::episode_figures::{EpisodeFigures, Latencies};
use crate::judgement::figures::{Figures, Recovery};
use crate::judgement::invariants::{Check, Verdict};
use crate::judgement::objectives::{self, Judged, ObjectiveVerdict};
use crate::scenario::{CacheKind, Scenario};

/// What reached one model server.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ServerLoad {
    /// Requests it received.
    pub received: u64,
    /// Of those, received while loading, collapsed or misbehaving.
    pub while_impaired: u64,
    /// Received, by how they were answered.
    pub by_outcome: BTreeMap<String, u64>,
    /// Received while impaired, by how they were answered (the part of
    /// `by_outcome` that makes up `while_impaired`).
    pub impaired_by_outcome: BTreeMap<String, u64>,
}

/// Everything a run produced, as figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The scenario's name.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
    /// Simulated seconds.
    pub simulated_s: f64,
    /// Units of work that arrived.
    pub arrivals: u64,
    /// Units of work that ended, by outcome (`ok` or an error kind).
    pub outcomes: BTreeMap<String, u64>,
    /// What kind of ending each outcome of `outcomes` is
    /// ([`CallOutcome::class`](crate::evidence::outcome::CallOutcome::class)), for the text.
    #[serde(skip)]
    pub outcome_classes: BTreeMap<String, &'static str>,
    /// Units of work still in flight when the run ended.
    pub in_flight: u64,
    /// Requests the workers sent.
    pub requests: u64,
    /// Calls admitted by the breaker and then by the limiter: the calls
    /// that reached the retry layer.
    pub admitted_calls: u64,
    /// Requests per call that reached the retry layer.
    pub retry_amplification: f64,
    /// Per server.
    pub servers: BTreeMap<String, ServerLoad>,
    /// Breaker openings (closed or half-open → open), fleet-wide.
    pub breaker_openings: u64,
    /// Seconds from the first disruptive fault to the first opening.
    pub time_to_open_s: Option<f64>,
    /// Seconds from the last fault to the last breaker closing after it.
    pub time_to_recover_s: Option<f64>,
    /// Limiter refusals, by requests or by tokens per window (a call the
    /// limiter refused and then admitted after a wait counts each refusal).
    pub rate_limited: u64,
    /// What `rpm` limits, in plain words: per worker (each worker's
    /// in-process cache) or fleet-wide (one shared cache), and whose clock
    /// stamps a shared cache's hits.
    pub rpm_scope: String,
    /// The checkers' verdicts.
    pub checks: Vec<Check>,
    /// The figures objectives are judged by.
    pub figures: Figures,
    /// The verdict on each objective the scenario sets (absent when none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub objectives: Vec<ObjectiveVerdict>,
    /// The command that replays this run.
    pub replay: String,
}

impl Report {
    /// Builds the report for `run` of `scenario`, read from `path`.
    pub fn new(scenario: &Scenario, path: &str, run: &Run) -> Report {
        let events = &run.events;
        let mut report = Report {
            scenario: scenario.name.clone(),
            seed: run.seed,
            simulated_s: run.simulated.as_secs_f64(),
            arrivals: 0,
            outcomes: BTreeMap::new(),
            outcome_classes: BTreeMap::new(),
            in_flight: 0,
            requests: 0,
            admitted_calls: 0,
            retry_amplification: 0.0,
            servers: scenario
                .servers
                .iter()
                .map(|s| (s.name.clone(), ServerLoad::default()))
                .collect(),
            breaker_openings: 0,
            time_to_open_s: None,
            time_to_recover_s: None,
            rate_limited: 0,
            rpm_scope: rpm_scope(scenario),
            checks: run.checks.clone(),
            figures: Figures::new(
                scenario,
                events,
                u64::try_from(run.simulated.as_micros()).unwrap_or(u64::MAX),
            ),
            objectives: Vec::new(),
            replay: format!("redstring-sim run {} --seed {}", super::shell_word(path), run.seed),
        };
        let first_fault = scenario
            .faults
            .iter()
            .filter(|f| f.is_disruptive())
            .map(|f| f.at_s())
            .min_by(f64::total_cmp);
        let last_fault = scenario.faults.iter().map(|f| f.at_s()).max_by(f64::total_cmp);
        let mut last_close_after_fault = None;
        for e in events {
            let t = e.t_us as f64 / 1e6;
            match &e.kind {
                Kind::Arrival { .. } => report.arrivals += 1,
                Kind::CallEnd(end) => {
                    let outcome = end.outcome;
                    *report.outcomes.entry(outcome.name().to_owned()).or_default() += 1;
                    report
                        .outcome_classes
                        .entry(outcome.name().to_owned())
                        .or_insert(outcome.class());
                }
                Kind::Request { .. } => report.requests += 1,
                Kind::Limited { .. } | Kind::TokensRefused { .. } => report.rate_limited += 1,
                Kind::Served { outcome, .. } => {
                    let load = report.servers.entry(e.host.to_string()).or_default();
                    load.received += 1;
                    *load.by_outcome.entry(outcome.name().to_owned()).or_default() += 1;
                    if outcome.impaired() {
                        load.while_impaired += 1;
                        *load.impaired_by_outcome.entry(outcome.name().to_owned()).or_default() += 1;
                    }
                }
                kind if kind.reaches_retry() => report.admitted_calls += 1,
                Kind::Breaker { to, .. } => {
                    if *to == CircuitState::Open {
                        report.breaker_openings += 1;
                        if let (None, Some(f)) = (report.time_to_open_s, first_fault)
                            && t >= f
                        {
                            report.time_to_open_s = Some(round_ms(t - f));
                        }
                    }
                    if let (CircuitState::Closed, Some(f)) = (to, last_fault)
                        && t >= f
                    {
                        last_close_after_fault = Some(round_ms(t - f));
                    }
                }
                _ => {}
            }
        }
        report.time_to_recover_s = last_close_after_fault;
        report.objectives = objectives::judge(&scenario.objectives, &report.figures);
        let ended: u64 = report.outcomes.values().sum();
        report.in_flight = report.arrivals.saturating_sub(ended);
        report.retry_amplification = report.figures.retry_amplification.map_or(0.0, round_ms);
        report
    }

    /// Whether any invariant failed (violated and not declared `may_violate`).
    pub fn failed(&self) -> bool {
        self.checks.iter().any(Check::failed)
    }

    /// Whether any objective was missed.
    pub fn missed(&self) -> bool {
        self.objectives.iter().any(ObjectiveVerdict::missed)
    }

    /// The report as text. `wall` adds how long the run took in real time.
    pub fn render(&self, wall: Option<Duration>) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "scenario {}  seed {}", self.scenario, self.seed);
        match wall {
            Some(w) => {
                let _ = writeln!(
                    out,
                    "simulated {:.1} s in {:.2} s of wall time ({} real time)",
                    self.simulated_s,
                    w.as_secs_f64(),
                    speed(self.simulated_s, w)
                );
            }
            None => {
                let _ = writeln!(out, "simulated {:.1} s", self.simulated_s);
            }
        }
        let _ = writeln!(
            out,
            "\ncalls: {} arrived, {} in flight at the end",
            self.arrivals, self.in_flight
        );
        for (outcome, n) in &self.outcomes {
            let class = self.outcome_classes.get(outcome).copied().unwrap_or("");
            let _ = writeln!(out, "  {outcome:<18} {n:<7} {class}");
        }
        let _ = writeln!(
            out,
            "requests: {} for {} admitted calls (retry amplification {:.2}×); {} answered 429; {} limiter refusals; rpm {}",
            self.requests,
            self.admitted_calls,
            self.retry_amplification,
            self.figures.throttled_requests,
            self.rate_limited,
            self.rpm_scope
        );
        let _ = writeln!(out, "\nservers:");
        for (name, load) in &self.servers {
            let impaired: Vec<String> = load
                .impaired_by_outcome
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            let breakdown = if impaired.is_empty() {
                String::new()
            } else {
                format!(" ({})", impaired.join(", "))
            };
            let _ = writeln!(
                out,
                "  {name:<12} received {:<6} while impaired {}{breakdown}",
                load.received, load.while_impaired,
            );
        }
        let show = |v: Option<f64>| v.map_or("-".to_owned(), |s| format!("{s:.1} s"));
        let _ = writeln!(
            out,
            "\nbreakers: {} openings; time to open {}; time to recover after the last fault {}",
            self.breaker_openings,
            show(self.time_to_open_s),
            show(self.time_to_recover_s)
        );
        if !self.figures.episodes.is_empty() {
            let _ = writeln!(
                out,
                "\nfault episodes (from the fault until the server is ready again):"
            );
            for ep in &self.figures.episodes {
                out.push_str(&render_episode(ep));
            }
        }
        let _ = writeln!(out, "\ninvariants:");
        for c in &self.checks {
            let (mark, detail) = match &c.verdict {
                Verdict::Held => ("held", String::new()),
                Verdict::Violated { t_us, host, detail } => (
                    if c.may_violate {
                        "violated, as the scenario declares it may be"
                    } else {
                        "VIOLATED"
                    },
                    format!(" at {:.3} s on {host}: {detail}", *t_us as f64 / 1e6),
                ),
                Verdict::NotApplicable { why } => ("not applicable", format!(" ({why})")),
            };
            let figure = if c.figure.is_empty() {
                String::new()
            } else {
                format!(" — {}", c.figure)
            };
            let _ = writeln!(out, "  {:<22} {mark}{detail}{figure}", c.name);
        }
        if !self.objectives.is_empty() {
            let _ = writeln!(out, "\nobjectives:");
            for o in &self.objectives {
                let _ = writeln!(out, "  {:<22} {}", o.name, describe(o));
            }
        }
        let _ = writeln!(out, "\nreplay: {}", self.replay);
        out
    }

    /// A compact, deterministic digest of the trace for snapshots: every
    /// fault and breaker transition, and per-10-second counts.
    pub fn compact_trace(events: &[TraceEvent]) -> String {
        let mut out = String::new();
        let mut buckets: BTreeMap<u64, [u64; 4]> = BTreeMap::new();
        for e in events {
            let t = e.t_us as f64 / 1e6;
            match &e.kind {
                Kind::Fault { fault } => {
                    let _ = writeln!(out, "{t:>9.3} {DRIVER}  {fault}");
                }
                Kind::Breaker { breaker, from, to, .. } => {
                    let _ = writeln!(out, "{t:>9.3} {}  {breaker} {from:?} -> {to:?}", e.host);
                }
                Kind::CallEnd(end) => {
                    let outcome = end.outcome;
                    let b = buckets.entry(e.t_us / 10_000_000).or_default();
                    if outcome.is_ok() { b[0] += 1 } else { b[1] += 1 }
                }
                Kind::Limited { .. } | Kind::TokensRefused { .. } => {
                    buckets.entry(e.t_us / 10_000_000).or_default()[2] += 1
                }
                Kind::Request { .. } => buckets.entry(e.t_us / 10_000_000).or_default()[3] += 1,
                _ => {}
            }
        }
        let _ = writeln!(out, "-- per 10 s: ok / failed / limited / requests");
        for (b, [ok, failed, limited, requests]) in buckets {
            let _ = writeln!(out, "{:>5}s {ok:>5} {failed:>5} {limited:>5} {requests:>5}", b * 10);
        }
        out
    }
}

/// What `rpm` limits under `scenario`'s cache layout, in plain words.
pub fn rpm_scope(scenario: &Scenario) -> String {
    let h = &scenario.hardening;
    let limit = format!("{} per {} s per tenant", h.rpm, h.window_s);
    match scenario.cache.kind {
        CacheKind::PerWorker => format!("{limit}, per worker (each worker's in-process cache)"),
        CacheKind::Shared => format!(
            "{limit}, fleet-wide (one shared cache, {})",
            stamped_by(scenario.cache.time_source)
        ),
    }
}

/// Whose clock stamps a shared cache's hits, in plain words.
pub fn stamped_by(source: TimeSource) -> &'static str {
    match source {
        TimeSource::Store => "stamped by the store",
        TimeSource::Caller => "stamped by each caller",
    }
}

/// One fault episode's figures as text, three lines.
fn render_episode(ep: &EpisodeFigures) -> String {
    let ready = match (ep.ready_s, ep.ready_basis) {
        (Some(t), Some(basis)) => format!("ready at {t:.1} s ({})", basis.describe()),
        _ => "not ready again within the run".to_owned(),
    };
    let amp = ep
        .amplification
        .map_or("-".to_owned(), |a| format!("{:.2}", round_ms(a)));
    let open = ep.time_to_open_s.map_or("-".to_owned(), |s| format!("{s:.1} s"));
    let recovery = match &ep.goodput_recovery {
        Recovery::Recovered { s } => format!("{s:.0} s after ready"),
        Recovery::TooLate => "run ends too soon to tell".to_owned(),
        Recovery::NotRecovered => "not within the run".to_owned(),
        Recovery::NotReady | Recovery::NoFault => "-".to_owned(),
    };
    let lat = |l: &Latencies| match (l.p50_s, l.p95_s, l.p99_s) {
        (Some(a), Some(b), Some(c)) => format!("{} / {} / {}", round_ms(a), round_ms(b), round_ms(c)),
        _ => "-".to_owned(),
    };
    format!(
        "  {} {} at {:.1} s, {ready}\n    requests reaching it {}; {amp} requests per arriving call; time to open {open}; goodput back {recovery}\n    calls failed {}, deferred {}; latency p50 / p95 / p99 s before {}, during {}, after {}\n",
        ep.server,
        ep.kind,
        ep.start_s,
        ep.requests_reached,
        ep.calls_failed,
        ep.calls_deferred,
        lat(&ep.latency_before),
        lat(&ep.latency_during),
        lat(&ep.latency_after),
    )
}

/// One objective's verdict as text: the verdict, then the figure beside the
/// target.
fn describe(o: &ObjectiveVerdict) -> String {
    let target = format!("target ≤ {}", o.target);
    match &o.judged {
        Judged::Met { measured } => format!("met — {} ({target})", round_ms(*measured)),
        Judged::Missed { measured: Some(m), .. } => format!("MISSED — {} ({target})", round_ms(*m)),
        Judged::Missed { why, .. } => format!("MISSED — {} ({target})", why.as_deref().unwrap_or("no figure")),
        Judged::NotApplicable { why } => format!("n/a ({why})"),
    }
}

fn round_ms(s: f64) -> f64 {
    (s * 1000.0).round() / 1000.0
}

/// How many times faster than real time `simulated_s` took in `wall`, to
/// three significant figures (`0.312×`, `27.3×`, `1177×`): a run slower than
/// real time never reads as `0×`.
pub fn speed(simulated_s: f64, wall: Duration) -> String {
    let x = simulated_s / wall.as_secs_f64().max(1e-9);
    let decimals = if x >= 100.0 {
        0
    } else if x >= 10.0 {
        1
    } else if x >= 1.0 {
        2
    } else {
        // Three significant figures below 1, as far as 0.000001×.
        (2.0 - x.max(1e-6).log10().floor()).min(8.0) as usize
    };
    format!("{x:.decimals$}×")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use redstring::CircuitState;

    use super::*;
    use crate::evidence::trace::CallEnded;
    use crate::judgement::invariants::check_all;
    use crate::scenario::tenant;

    #[test]
    fn a_speed_keeps_three_significant_figures_and_never_reads_zero() {
        let at = |simulated: f64, wall_ms: u64| speed(simulated, Duration::from_millis(wall_ms));
        assert_eq!(at(120.0, 393_000), "0.305×", "200 workers slower than real time");
        assert_eq!(at(120.0, 12_460), "9.63×");
        assert_eq!(at(120.0, 4_440), "27.0×");
        assert_eq!(at(200.0, 170), "1176×");
        assert_eq!(at(1.0, 5_000_000), "0.000200×");
    }

    const MINIMAL: &str = r#"
name = "synthetic"
duration_s = 10
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 1 }]
"#;

    fn ev(kind: Kind) -> TraceEvent {
        TraceEvent {
            t_us: 1,
            host: "w".into(),
            call: None,
            kind,
        }
    }

    #[test]
    fn retry_amplification_counts_only_calls_that_reached_the_retry_layer() {
        // Four calls past the breaker; the limiter refused two of them and
        // admitted two, which sent three requests between them.
        let allowed = || {
            ev(Kind::Allowed {
                breaker: "b".into(),
                state: CircuitState::Closed,
                probe: None,
                at_us: 1,
            })
        };
        let admitted = || {
            ev(Kind::Admitted {
                tenant: tenant(1),
                remaining: 1,
                at_us: 1,
                decided_by: Default::default(),
            })
        };
        let limited = || {
            ev(Kind::Limited {
                tenant: tenant(1),
                retry_after_us: 5,
                at_us: 1,
                decided_by: Default::default(),
            })
        };
        let request = || ev(Kind::Request { server: "gpu".into() });
        let events = vec![
            allowed(),
            allowed(),
            allowed(),
            allowed(),
            admitted(),
            limited(),
            admitted(),
            limited(),
            request(),
            request(),
            request(),
        ];
        let scenario = Scenario::parse("synthetic.toml", MINIMAL).unwrap();
        let run = Run {
            seed: 1,
            simulated: Duration::from_secs(1),
            checks: check_all(&scenario, &events),
            events,
        };
        let report = Report::new(&scenario, "synthetic.toml", &run);
        assert_eq!(report.admitted_calls, 2);
        assert_eq!(report.retry_amplification, 1.5);
    }

    #[test]
    fn the_report_says_whether_rpm_is_per_worker_or_fleet_wide_in_plain_words() {
        let mut s = Scenario::parse("synthetic.toml", MINIMAL).unwrap();
        let per_worker = rpm_scope(&s);
        assert!(per_worker.contains("per worker"), "{per_worker}");
        s.cache.kind = CacheKind::Shared;
        assert!(rpm_scope(&s).contains("fleet-wide (one shared cache, stamped by the store)"));
        s.cache.time_source = TimeSource::Caller;
        let caller = rpm_scope(&s);
        assert!(caller.contains("stamped by each caller"), "{caller}");
        assert!(!caller.contains("Shared") && !caller.contains("Caller"), "{caller}");
    }

    #[test]
    fn token_refusals_are_limiter_refusals_and_each_ending_says_what_it_is() {
        use crate::evidence::outcome::{Answer, CallOutcome, Limit};
        let end = |call, outcome| {
            ev(Kind::CallEnd(Box::new(CallEnded {
                call,
                tenant: tenant(1),
                outcome,
                attempts: 0,
                latency_ms: 1,
                retry_after_us: None,
                answer_us: None,
            })))
        };
        let events = vec![
            ev(Kind::Limited {
                tenant: tenant(1),
                retry_after_us: 5,
                at_us: 1,
                decided_by: Default::default(),
            }),
            ev(Kind::TokensRefused {
                tenant: tenant(1),
                estimate: 10,
                used: 95,
                retry_after_us: 5,
                decided_by: Default::default(),
            }),
            ev(Kind::served(Answer::Throttled)),
            end(1, CallOutcome::Deferred(Limit::Requests)),
            end(2, CallOutcome::Deferred(Limit::Tokens)),
            end(3, CallOutcome::Cooldown),
            end(4, CallOutcome::CircuitOpen),
        ];
        let scenario = Scenario::parse("synthetic.toml", MINIMAL).unwrap();
        let run = Run {
            seed: 1,
            simulated: Duration::from_secs(1),
            checks: Vec::new(),
            events,
        };
        let report = Report::new(&scenario, "synthetic.toml", &run);
        assert_eq!(report.rate_limited, 2);
        assert_eq!(report.figures.calls_deferred, 2);
        assert_eq!(report.figures.throttled_requests, 1);
        let text = report.render(None);
        for line in [
            "  cooldown           1       refused by a quota cooldown",
            "  circuit_open       1       refused by the breaker",
            "  rate_limited       1       deferred by the limiter (requests per window)",
            "  token_limited      1       deferred by the limiter (tokens per window)",
            "1 answered 429; 2 limiter refusals",
        ] {
            assert!(text.contains(line), "{line:?} in\n{text}");
        }
    }

    #[test]
    fn the_impaired_breakdown_lists_impaired_answers_only() {
        use crate::evidence::outcome::Answer;
        let served = |a| TraceEvent {
            t_us: 1,
            host: "gpu".into(),
            call: None,
            kind: Kind::served(a),
        };
        let events = vec![served(Answer::Ok), served(Answer::Ok), served(Answer::Loading)];
        let scenario = Scenario::parse("synthetic.toml", MINIMAL).unwrap();
        let run = Run {
            seed: 1,
            simulated: Duration::from_secs(1),
            checks: check_all(&scenario, &events),
            events,
        };
        let report = Report::new(&scenario, "synthetic.toml", &run);
        let text = report.render(None);
        assert!(
            text.contains("gpu          received 3      while impaired 1 (loading 1)\n"),
            "{text}"
        );
        assert_eq!(report.servers["gpu"].by_outcome.len(), 2);
    }
}
