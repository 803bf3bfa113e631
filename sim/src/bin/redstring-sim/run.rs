//! `run`: one scenario, one seed, its report, and optionally its JSON, trace
//! and timeline.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use redstring_sim::campaign::simulate;
use redstring_sim::evidence::episodes;
use redstring_sim::evidence::trace::Trace;
use redstring_sim::judgement::report::{self, Report};
use redstring_sim::judgement::{plots, shell_word};
use redstring_sim::scenario::Scenario;

use crate::shared::{Outcome, Outputs, SIM_FAILED, inputs_of, load, loads, verdict};

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
    /// Refuse (exit 2) a scenario with any warning.
    #[arg(long)]
    strict: bool,
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
    let mut outputs = Outputs::reserve([("--json", args.json), ("--trace", args.trace), ("--svg", args.svg)])?;
    let scenario = load(path, args.strict)?;
    outputs.refuse_inputs(&inputs_of(path, &scenario))?;
    let seed = args.seed.unwrap_or(scenario.seed);
    println!("{}{}", scenario_header(&scenario, path, seed), loads(&scenario));
    let started = Instant::now();
    let result = simulate(&scenario, seed);
    let wall = started.elapsed();
    let run = result.map_err(|e| {
        eprintln!(
            "error: {e}\nreplay: redstring-sim run {} --seed {seed}",
            shell_word(&path.display().to_string())
        );
        ExitCode::from(SIM_FAILED)
    })?;
    let report = Report::new(&scenario, &path.display().to_string(), &run);
    print!("{}", report.render(Some(wall)));
    outputs.write("--json", || serde_json::to_string_pretty(&report).unwrap_or_default())?;
    outputs.write("--trace", || {
        Trace::to_json_lines(&episodes::with_ready_marks(&scenario, &run.events))
    })?;
    outputs.write("--svg", || plots::render(&scenario, &run.events))?;
    outputs.commit()?;
    Ok(verdict(report.failed(), report.missed()))
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
