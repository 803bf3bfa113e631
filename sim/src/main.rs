//! `redstring-sim`: run outage scenarios against the real hardening code.
//!
//! ```text
//! redstring-sim run scenarios/llama-swap-reload.toml [--seed N] [--json F] [--trace F] [--svg F]
//! redstring-sim sweep scenarios/llama-swap-reload.toml --seeds 1..50
//! redstring-sim check [scenarios/]
//! redstring-sim fuzz bounds.toml --cases 200 [--seed N] [--out scenarios/regressions]
//! ```
//!
//! Exit codes: 0 every invariant held (or was expected not to), 1 an invariant
//! failed, 2 a scenario file is unusable, 3 the simulation itself failed.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use redstring_sim::judgement::report::Report;
use redstring_sim::scenario::Scenario;
use redstring_sim::judgement::plots;
use redstring_sim::evidence::trace::Trace;
use redstring_sim::world;

const INVARIANT_FAILED: u8 = 1;
const BAD_SCENARIO: u8 = 2;
const SIM_FAILED: u8 = 3;

#[derive(Parser)]
#[command(
    name = "redstring-sim",
    version,
    about = "Simulate the outage you fear before it happens."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one scenario and print its report.
    Run {
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
    },
    /// Run one scenario over a range of seeds and list every failing seed.
    Sweep {
        /// The scenario file.
        scenario: PathBuf,
        /// Seeds as `A..B` (B exclusive).
        #[arg(long, default_value = "1..21")]
        seeds: String,
    },
    /// Search generated scenarios within bounds for one that breaks a claimed
    /// invariant; write the smallest one found as a replayable scenario.
    Fuzz {
        /// The bounds file (see `redstring_sim::search::fuzz::Bounds`).
        bounds: PathBuf,
        /// Cases to try.
        #[arg(long, default_value_t = 32)]
        cases: u32,
        /// The search's seed (the same seed tries the same cases).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Where a failing case is written.
        #[arg(long, default_value = "scenarios/regressions")]
        out: PathBuf,
    },
    /// Run every scenario in a directory with its own seed and check its invariants.
    Check {
        /// The directory (default `scenarios`).
        #[arg(default_value = "scenarios")]
        dir: PathBuf,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Run {
            scenario,
            seed,
            json,
            trace,
            svg,
        } => run(&scenario, seed, json, trace, svg),
        Command::Sweep { scenario, seeds } => sweep(&scenario, &seeds),
        Command::Check { dir } => check(&dir),
        Command::Fuzz {
            bounds,
            cases,
            seed,
            out,
        } => fuzz(&bounds, cases, seed, &out),
    }
}

fn load(path: &Path) -> Result<Scenario, ExitCode> {
    Scenario::load(path).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(BAD_SCENARIO)
    })
}

fn write(path: &Path, contents: &str) -> Result<(), ExitCode> {
    std::fs::write(path, contents).map_err(|e| {
        eprintln!("error: cannot write {}: {e}", path.display());
        ExitCode::from(SIM_FAILED)
    })
}

fn run(
    path: &Path,
    seed: Option<u64>,
    json: Option<PathBuf>,
    trace: Option<PathBuf>,
    svg: Option<PathBuf>,
) -> ExitCode {
    let scenario = match load(path) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let seed = seed.unwrap_or(scenario.seed);
    println!("{}", scenario_header(&scenario, path, seed));
    let started = Instant::now();
    let result = world::run(&scenario, seed);
    let wall = started.elapsed();
    let run = match result {
        Ok(run) => run,
        Err(e) => {
            eprintln!("error: {e}\nreplay: redstring-sim run {} --seed {seed}", path.display());
            return ExitCode::from(SIM_FAILED);
        }
    };
    let report = Report::new(&scenario, &path.display().to_string(), &run);
    print!("{}", report.render(Some(wall)));
    let outputs = (|| -> Result<(), ExitCode> {
        if let Some(p) = &json {
            write(p, &serde_json::to_string_pretty(&report).unwrap_or_default())?;
        }
        if let Some(p) = &trace {
            write(p, &Trace::to_json_lines(&run.events))?;
        }
        if let Some(p) = &svg {
            write(p, &plots::render(&scenario, &run.events))?;
        }
        Ok(())
    })();
    if let Err(code) = outputs {
        return code;
    }
    if report.failed() {
        ExitCode::from(INVARIANT_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

/// The seed and every resolved option, printed before the run.
fn scenario_header(s: &Scenario, path: &Path, seed: u64) -> String {
    let h = &s.hardening;
    format!(
        "== {} ({}), seed {seed}\n   {} s simulated, tick {} ms, {} servers, {} workers, cache {:?} stamped by {:?}\n   rpm {} per {} s; breaker threshold {} timeout {} s probes {}; retries {} from {} s ×{} cap {} s jitter {}; timeout {} s\n",
        s.name,
        path.display(),
        s.duration_s,
        s.tick_ms,
        s.servers.len(),
        s.worker_names().len(),
        s.cache.kind,
        s.cache.time_source,
        h.rpm,
        h.window_s,
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

fn parse_range(seeds: &str) -> Option<(u64, u64)> {
    let (a, b) = seeds.split_once("..")?;
    let (a, b) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    (a < b).then_some((a, b))
}

fn sweep(path: &Path, seeds: &str) -> ExitCode {
    let scenario = match load(path) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let Some((from, to)) = parse_range(seeds) else {
        eprintln!("error: --seeds must look like A..B with A < B, got {seeds:?}");
        return ExitCode::from(BAD_SCENARIO);
    };
    let bar = indicatif::ProgressBar::new(to - from);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} seeds {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut failing = Vec::new();
    for seed in from..to {
        match world::run(&scenario, seed) {
            Ok(run) => {
                let report = Report::new(&scenario, &path.display().to_string(), &run);
                if report.failed() {
                    let names: Vec<&str> = report.checks.iter().filter(|c| c.failed()).map(|c| c.name).collect();
                    failing.push((seed, names.join(", ")));
                }
            }
            Err(e) => failing.push((seed, format!("simulation failed: {e}"))),
        }
        bar.set_message(format!("{} failing", failing.len()));
        bar.inc(1);
    }
    bar.finish();
    println!("{} of {} seeds failed", failing.len(), to - from);
    for (seed, why) in &failing {
        println!(
            "  seed {seed}: {why}\n    replay: redstring-sim run {} --seed {seed}",
            path.display()
        );
    }
    if failing.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(INVARIANT_FAILED)
    }
}

fn check(dir: &Path) -> ExitCode {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect(),
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", dir.display());
            return ExitCode::from(BAD_SCENARIO);
        }
    };
    files.sort();
    let mut worst = 0u8;
    for path in files {
        let scenario = match Scenario::load(&path) {
            Ok(s) => s,
            Err(e) => {
                println!("BAD   {e}");
                worst = worst.max(BAD_SCENARIO);
                continue;
            }
        };
        let started = Instant::now();
        match world::run(&scenario, scenario.seed) {
            Ok(run) => {
                let report = Report::new(&scenario, &path.display().to_string(), &run);
                let failed: Vec<&str> = report.checks.iter().filter(|c| c.failed()).map(|c| c.name).collect();
                if failed.is_empty() {
                    println!("ok    {} ({:.1} s)", path.display(), started.elapsed().as_secs_f64());
                } else {
                    println!(
                        "FAIL  {}: {}\n      replay: {}",
                        path.display(),
                        failed.join(", "),
                        report.replay
                    );
                    worst = worst.max(INVARIANT_FAILED);
                }
            }
            Err(e) => {
                println!("ERROR {}: {e}", path.display());
                worst = worst.max(SIM_FAILED);
            }
        }
    }
    ExitCode::from(worst)
}

fn fuzz(path: &Path, cases: u32, seed: u64, out: &Path) -> ExitCode {
    use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};
    use redstring_sim::search::fuzz::{self, Bounds};
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    let bounds = match Bounds::load(path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(BAD_SCENARIO);
        }
    };
    let mut runner = TestRunner::new(Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: 512,
        ..Config::default()
    });
    let bar = indicatif::ProgressBar::new(u64::from(cases));
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} cases {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let tried: RefCell<BTreeMap<String, u64>> = RefCell::new(BTreeMap::new());
    let runs = RefCell::new(0u64);
    let started = Instant::now();
    let result = runner.run(&fuzz::scenarios(&bounds), |scenario| {
        *runs.borrow_mut() += 1;
        let mut t = tried.borrow_mut();
        *t.entry(format!(
            "cache {:?}/{:?}",
            scenario.cache.kind, scenario.cache.time_source
        ))
        .or_default() += 1;
        for f in &scenario.faults {
            let kind = serde_json::to_value(f)
                .ok()
                .and_then(|v| v["kind"].as_str().map(str::to_owned));
            *t.entry(format!("fault {}", kind.unwrap_or_default())).or_default() += 1;
        }
        drop(t);
        bar.inc(1);
        fuzz::check_case(&scenario).map_err(TestCaseError::fail)
    });
    bar.finish_and_clear();
    let wall = started.elapsed().as_secs_f64();
    let runs = *runs.borrow();
    println!(
        "fuzz {}: {runs} simulations in {wall:.1} s ({:.0} per minute), seed {seed}",
        path.display(),
        runs as f64 / wall.max(1e-9) * 60.0
    );
    for (what, n) in tried.borrow().iter() {
        println!("  {what:<28} {n}");
    }
    match result {
        Ok(()) => {
            println!("no case broke a claimed invariant in {cases} cases");
            ExitCode::SUCCESS
        }
        Err(TestError::Fail(reason, minimal)) => {
            println!("FAILED: {reason}");
            match fuzz::write_regression(out, &minimal) {
                Ok(written) => {
                    println!(
                        "smallest failing case: {}\nreplay: redstring-sim run {}",
                        written.display(),
                        written.display()
                    );
                    ExitCode::from(INVARIANT_FAILED)
                }
                Err(e) => {
                    eprintln!(
                        "error: cannot write the failing case to {}: {e}\n{}",
                        out.display(),
                        minimal.to_toml()
                    );
                    ExitCode::from(INVARIANT_FAILED)
                }
            }
        }
        Err(TestError::Abort(reason)) => {
            eprintln!("error: the search stopped: {reason}");
            ExitCode::from(SIM_FAILED)
        }
    }
}
