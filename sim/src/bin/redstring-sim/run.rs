//! `run`: one scenario, one seed, its report, and optionally its JSON, trace,
//! timeline and metrics.
//!
//! A run's wall time is estimated before it starts ([`Work::wall_estimate`]):
//! one estimated past `--max-wall` is refused with the estimate and the flag
//! that allows it, one of more than a few seconds says so and shows its
//! progress on a terminal, and one that takes longer than `--max-wall` after
//! all is stopped with what it had simulated, writing nothing.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use redstring_sim::campaign::{simulate_metered, simulate_watched};
use redstring_sim::evidence::episodes;
use redstring_sim::evidence::metrics::MetricLog;
use redstring_sim::evidence::trace::Trace;
use redstring_sim::hosts::clock::EPOCH;
use redstring_sim::judgement::report::{self, Report};
use redstring_sim::judgement::{plots, shell_word};
use redstring_sim::scenario::Scenario;
use redstring_sim::world::{Budget, Work};

use crate::shared::{BAD_SCENARIO, Outcome, Outputs, SIM_FAILED, fits_memory, inputs_of, load, loads, verdict};

/// A run estimated to take longer than this says so before it starts, and
/// shows a progress bar on a terminal.
const ANNOUNCE_AFTER: Duration = Duration::from_secs(3);

/// The latest `--metrics-at`: 2100-01-01, past which a stamp plus a run is
/// no instant Prometheus takes.
const METRICS_AT_MAX: u64 = 4_102_444_800;

/// The arguments of `run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// The scenario file.
    scenario: PathBuf,
    /// The seed (default: the scenario's own).
    #[arg(long)]
    seed: Option<u64>,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the full trace as JSON lines here.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Write an SVG timeline here.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Write the run's metrics here as OpenMetrics text: the series the
    /// hardening exports in production (`redstring::metrics`), one sample a
    /// simulated second, for `promtool tsdb create-blocks-from openmetrics`.
    #[arg(long)]
    metrics: Option<PathBuf>,
    /// The Unix time, in seconds, the run's first instant is stamped with in
    /// `--metrics` (default: the simulation's epoch, 1700000000).
    #[arg(long, value_name = "UNIX_S", requires = "metrics", value_parser = clap::value_parser!(u64).range(0..=METRICS_AT_MAX))]
    metrics_at: Option<u64>,
    /// Refuse (exit 2) a scenario with any warning.
    #[arg(long)]
    strict: bool,
    /// The most seconds of wall time the run may take: one estimated to
    /// take longer is refused before it starts (exit 2), and one that takes
    /// longer is stopped there (exit 3), writing nothing.
    #[arg(long, value_name = "S", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=31_536_000))]
    max_wall: u64,
    /// Inject this known-bad variant of the hardening (see `mutants`),
    /// to replay a case that catches it.
    #[cfg(feature = "mutants")]
    #[arg(long, value_parser = crate::mutants::parse_mutant)]
    mutant: Option<redstring_sim::search::mutants::Mutant>,
}

/// Runs `run`.
pub fn run(args: RunArgs) -> Outcome {
    #[cfg(feature = "mutants")]
    let _injected = redstring::mutants::inject(args.mutant);
    let path = args.scenario.as_path();
    let mut outputs = Outputs::reserve([
        ("--json", args.json),
        ("--trace", args.trace),
        ("--svg", args.svg),
        ("--metrics", args.metrics),
    ])?;
    let scenario = load(path, args.strict)?;
    outputs.refuse_inputs(&inputs_of(path, &scenario))?;
    let seed = args.seed.unwrap_or(scenario.seed);
    println!("{}{}", scenario_header(&scenario, path, seed), loads(&scenario));
    let replay = format!(
        "replay: redstring-sim run {} --seed {seed}",
        shell_word(&path.display().to_string())
    );
    // Work past the budget is refused whatever --max-wall allows.
    Budget::DEFAULT.check(&scenario).map_err(|e| {
        eprintln!("error: {e}\n{replay}");
        ExitCode::from(SIM_FAILED)
    })?;
    fits_memory([&scenario], 1).inspect_err(|_| eprintln!("{replay}"))?;
    let work = Work::of(&scenario);
    let estimate = work.wall_estimate();
    let max_wall = Duration::from_secs(args.max_wall);
    if estimate > max_wall {
        return Err(fail_long(&work, estimate, args.max_wall));
    }
    if estimate > ANNOUNCE_AFTER {
        println!("   estimated wall time: {}\n", human(estimate));
    }
    let bar = (estimate > ANNOUNCE_AFTER).then(|| progress_bar(scenario.duration_s));
    let started = Instant::now();
    let mut watch = |simulated: Duration| {
        let wall = started.elapsed();
        if let Some(bar) = &bar {
            bar.set_position(u64::try_from(simulated.as_millis()).unwrap_or(u64::MAX));
            bar.set_message(report::speed(simulated.as_secs_f64(), wall));
        }
        if wall > max_wall {
            ControlFlow::Break(format!(
                "it took more than --max-wall {} s of wall time; pass a larger --max-wall to let it finish",
                args.max_wall
            ))
        } else {
            ControlFlow::Continue(())
        }
    };
    let metrics = outputs.has("--metrics").then(MetricLog::new);
    let result = match &metrics {
        Some(log) => simulate_metered(&scenario, seed, &mut watch, log),
        None => simulate_watched(&scenario, seed, &mut watch),
    };
    let wall = started.elapsed();
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let run = result.map_err(|e| {
        eprintln!("error: {e}\n{replay}");
        ExitCode::from(SIM_FAILED)
    })?;
    let report = Report::new(&scenario, &path.display().to_string(), &run);
    print!("{}", report.render(Some(wall)));
    outputs.write("--json", || serde_json::to_string_pretty(&report).unwrap_or_default())?;
    outputs.write("--trace", || {
        Trace::to_json_lines(&episodes::with_ready_marks(&scenario, &run.events))
    })?;
    outputs.write("--svg", || plots::render(&scenario, &run.events))?;
    if let Some(log) = &metrics {
        let start = args.metrics_at.unwrap_or(EPOCH.as_micros() / 1_000_000);
        outputs.write("--metrics", || log.to_openmetrics(run.simulated, start))?;
    }
    outputs.commit()?;
    Ok(verdict(report.failed(), report.missed()))
}

/// The refusal of a run estimated to take longer than `--max-wall`.
fn fail_long(work: &Work, estimate: Duration, max_wall: u64) -> ExitCode {
    let allow = estimate.as_secs().saturating_mul(2).max(max_wall.saturating_add(1));
    eprintln!(
        "error: this run would take about {} of wall time ({} steps × {} hosts, about {} calls), more than --max-wall {max_wall} s allows; pass --max-wall {allow} to run it, or shorten duration_s, raise tick_ms or shrink the fleet",
        human(estimate),
        work.steps,
        work.hosts,
        work.calls,
    );
    ExitCode::from(BAD_SCENARIO)
}

/// A duration as a person reads it: seconds, minutes or hours.
fn human(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{:.1} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

/// A progress bar over the simulated milliseconds of a run of `duration_s`,
/// with its speed and time left; indicatif draws it on stderr only when that
/// is a terminal.
fn progress_bar(duration_s: f64) -> indicatif::ProgressBar {
    let millis = Duration::try_from_secs_f64(duration_s)
        .unwrap_or(Duration::MAX)
        .as_millis();
    let bar = indicatif::ProgressBar::new(u64::try_from(millis).unwrap_or(u64::MAX));
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {percent:>3}% simulated, {msg} real time, {eta} left")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// The seed and every resolved option, printed before the run.
fn scenario_header(s: &Scenario, path: &Path, seed: u64) -> String {
    let h = &s.hardening;
    format!(
        "== {} ({}), seed {seed}\n   {} s simulated, tick {} ms, {} servers, {} workers\n   rpm {}; breaker threshold {} timeout {} s probes {}; retries {} from {} s ×{} cap {} s jitter {}; timeout {} s\n",
        s.name,
        path.display(),
        s.duration_s,
        s.tick_ms,
        s.servers.len(),
        s.fleet().len(),
        report::rpm_scope(s),
        h.failure_threshold,
        h.recovery_timeout_s,
        h.half_open_max_calls,
        h.max_retries,
        h.initial_delay_s,
        h.multiplier,
        h.max_delay_s,
        h.jitter,
        h.request_timeout_s,
    )
}
