//! `redstring-sim`: run outage scenarios against the real hardening code.
//!
//! ```text
//! redstring-sim run scenarios/llama-swap-reload.toml [--seed N] [--json F] [--trace F] [--svg F] [--strict]
//! redstring-sim sweep scenarios/llama-swap-reload.toml --seeds 1..50 [--json F] [--strict]
//! redstring-sim check [scenarios/] [--strict]
//! redstring-sim fuzz scenarios/bounds/default.toml --cases 200 [--seed N] [--out scenarios/regressions]
//! ```
//!
//! Every command goes through [`redstring_sim::world::simulate`]: build the
//! world, run it, check the invariants. `run`, `sweep` and `check` first print
//! each server's offered load against its capacity and what is odd about the
//! scenario (`redstring_sim::scenario::sanity`); with `--strict` anything odd
//! is an error.
//!
//! Exit codes: 0 every invariant held (or was expected not to), 1 an invariant
//! failed, 2 a scenario (or bounds) file is unusable (or, under `--strict`,
//! odd), 3 the simulation itself failed or ran over its work budget, 4 an
//! output file could not be written, 5 every invariant held but an objective
//! (`[objectives]`) was missed.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use redstring_sim::evidence::episodes;
use redstring_sim::evidence::trace::Trace;
use redstring_sim::judgement::plots;
use redstring_sim::judgement::report::{self, Report};
use redstring_sim::judgement::sweep::SweepSummary;
use redstring_sim::scenario::{CacheKind, Scenario, Warning, sanity};
use redstring_sim::search::fuzz::{self, BOUNDS_DIR, Bounds};
use redstring_sim::world::{Budget, simulate};

const INVARIANT_FAILED: u8 = 1;
const BAD_SCENARIO: u8 = 2;
const SIM_FAILED: u8 = 3;
const IO_FAILED: u8 = 4;
/// Every invariant held but an objective was missed.
const OBJECTIVE_MISSED: u8 = 5;

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
        /// Refuse (exit 2) a scenario with any warning.
        #[arg(long)]
        strict: bool,
    },
    /// Run one scenario over a range of seeds and list every failing seed.
    Sweep {
        /// The scenario file.
        scenario: PathBuf,
        /// Seeds as `A..B` (B exclusive).
        #[arg(long, default_value = "1..21")]
        seeds: String,
        /// Write the summary (distributions and pass rates) as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Refuse (exit 2) a scenario with any warning.
        #[arg(long)]
        strict: bool,
    },
    /// Search generated scenarios within bounds for one that breaks a claimed
    /// invariant; write the smallest one found as a replayable scenario.
    Fuzz {
        /// The bounds file (see `redstring_sim::search::fuzz::Bounds`), not a scenario.
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
    /// Run every scenario under a directory (subdirectories included, bounds
    /// directories skipped) with its own seed and check its invariants.
    Check {
        /// The directory (default `scenarios`).
        #[arg(default_value = "scenarios")]
        dir: PathBuf,
        /// Count a scenario with any warning as bad (exit 2) and do not run it.
        #[arg(long)]
        strict: bool,
    },
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Run {
            scenario,
            seed,
            json,
            trace,
            svg,
            strict,
        } => run(&scenario, seed, Outputs::open(json, trace, svg), strict),
        Command::Sweep {
            scenario,
            seeds,
            strict,
            json,
        } => sweep(&scenario, &seeds, json, strict),
        Command::Check { dir, strict } => check(&dir, strict),
        Command::Fuzz {
            bounds,
            cases,
            seed,
            out,
        } => fuzz(&bounds, cases, seed, &out),
    };
    result.unwrap_or_else(|code| code)
}

/// A command's early end: the exit code, its message already printed.
type Outcome = Result<ExitCode, ExitCode>;

/// Loads a scenario and prints every warning; under `strict` a warning is
/// an error.
fn load(path: &Path, strict: bool) -> Result<Scenario, ExitCode> {
    let (scenario, warnings) = Scenario::load_checked(path).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(BAD_SCENARIO)
    })?;
    let file = path.display().to_string();
    if strict && !warnings.is_empty() {
        for w in warnings {
            eprintln!("error: {} (--strict)", w.into_error(&file));
        }
        return Err(ExitCode::from(BAD_SCENARIO));
    }
    print_warnings(&file, &warnings);
    Ok(scenario)
}

/// Each server's offered load against its capacity, one line each.
fn loads(scenario: &Scenario) -> String {
    sanity::loads(scenario)
        .iter()
        .map(|load| format!("   load {load}\n"))
        .collect()
}

fn print_warnings(file: &str, warnings: &[Warning]) {
    for w in warnings {
        eprintln!("warning: {file}: {w}");
    }
}

fn io_failed(path: &Path, e: std::io::Error) -> ExitCode {
    eprintln!("error: cannot write {}: {e}", path.display());
    ExitCode::from(IO_FAILED)
}

/// The files `run` writes, created before the run so that an unwritable
/// path fails at once rather than after the simulation.
struct Outputs {
    json: Option<(PathBuf, File)>,
    trace: Option<(PathBuf, File)>,
    svg: Option<(PathBuf, File)>,
}

impl Outputs {
    fn open(json: Option<PathBuf>, trace: Option<PathBuf>, svg: Option<PathBuf>) -> Result<Outputs, ExitCode> {
        let create = |p: Option<PathBuf>| -> Result<Option<(PathBuf, File)>, ExitCode> {
            p.map(|p| File::create(&p).map(|f| (p.clone(), f)).map_err(|e| io_failed(&p, e)))
                .transpose()
        };
        Ok(Outputs {
            json: create(json)?,
            trace: create(trace)?,
            svg: create(svg)?,
        })
    }

    fn write(slot: Option<(PathBuf, File)>, contents: impl FnOnce() -> String) -> Result<(), ExitCode> {
        match slot {
            Some((path, mut file)) => file.write_all(contents().as_bytes()).map_err(|e| io_failed(&path, e)),
            None => Ok(()),
        }
    }
}

fn run(path: &Path, seed: Option<u64>, outputs: Result<Outputs, ExitCode>, strict: bool) -> Outcome {
    let scenario = load(path, strict)?;
    let outputs = outputs?;
    let seed = seed.unwrap_or(scenario.seed);
    println!("{}{}", scenario_header(&scenario, path, seed), loads(&scenario));
    let started = Instant::now();
    let result = simulate(&scenario, seed);
    let wall = started.elapsed();
    let run = result.map_err(|e| {
        eprintln!("error: {e}\nreplay: redstring-sim run {} --seed {seed}", path.display());
        ExitCode::from(SIM_FAILED)
    })?;
    let report = Report::new(&scenario, &path.display().to_string(), &run);
    print!("{}", report.render(Some(wall)));
    Outputs::write(outputs.json, || {
        serde_json::to_string_pretty(&report).unwrap_or_default()
    })?;
    Outputs::write(outputs.trace, || {
        Trace::to_json_lines(&episodes::with_ready_marks(&scenario, &run.events))
    })?;
    Outputs::write(outputs.svg, || plots::render(&scenario, &run.events))?;
    Ok(verdict(report.failed(), report.missed()))
}

/// The exit code: a failed invariant wins over a missed objective.
fn verdict(failed: bool, missed: bool) -> ExitCode {
    if failed {
        ExitCode::from(INVARIANT_FAILED)
    } else if missed {
        ExitCode::from(OBJECTIVE_MISSED)
    } else {
        ExitCode::SUCCESS
    }
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

fn parse_range(seeds: &str) -> Option<(u64, u64)> {
    let (a, b) = seeds.split_once("..")?;
    let (a, b) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    (a < b).then_some((a, b))
}

fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!("{{bar:40}} {{pos}}/{{len}} {what} {{msg}}"))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

fn names<T: std::fmt::Display>(items: &[T]) -> String {
    items.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

fn sweep(path: &Path, seeds: &str, json: Option<PathBuf>, strict: bool) -> Outcome {
    let scenario = load(path, strict)?;
    let json = match json {
        Some(p) => Some(File::create(&p).map(|f| (p.clone(), f)).map_err(|e| io_failed(&p, e))?),
        None => None,
    };
    print!("{}", loads(&scenario));
    let Some((from, to)) = parse_range(seeds) else {
        eprintln!("error: --seeds must look like A..B with A < B, got {seeds:?}");
        return Err(ExitCode::from(BAD_SCENARIO));
    };
    // Every seed asks for the same work: over the budget is one failure, not
    // one per seed.
    Budget::DEFAULT.check(&scenario).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(SIM_FAILED)
    })?;
    let bar = progress(to - from, "seeds");
    let shown = path.display().to_string();
    let mut failing = Vec::new();
    let mut missing = Vec::new();
    let mut reports = Vec::new();
    for seed in from..to {
        match simulate(&scenario, seed) {
            Ok(run) => {
                let report = Report::new(&scenario, &shown, &run);
                if !run.failed().is_empty() {
                    failing.push((seed, names(&run.failed())));
                }
                let missed: Vec<&str> = report
                    .objectives
                    .iter()
                    .filter(|o| o.missed())
                    .map(|o| o.name)
                    .collect();
                if !missed.is_empty() {
                    missing.push((seed, missed.join(", ")));
                }
                reports.push(report);
            }
            Err(e) => failing.push((seed, format!("simulation failed: {e}"))),
        }
        bar.set_message(format!("{} failing", failing.len()));
        bar.inc(1);
    }
    bar.finish();
    println!("{} of {} seeds failed", failing.len(), to - from);
    for (seed, why) in &failing {
        println!("  seed {seed}: {why}\n    replay: redstring-sim run {shown} --seed {seed}");
    }
    if !missing.is_empty() {
        println!("{} of {} seeds missed an objective", missing.len(), to - from);
        for (seed, which) in &missing {
            println!("  seed {seed}: missed {which}\n    replay: redstring-sim run {shown} --seed {seed}");
        }
    }
    let summary = SweepSummary::new(&reports);
    print!("{}", summary.render());
    Outputs::write(json, || serde_json::to_string_pretty(&summary).unwrap_or_default())?;
    Ok(verdict(!failing.is_empty(), !missing.is_empty()))
}

/// Every `*.toml` under `dir`, in subdirectories too (but not in fuzzer
/// bounds directories), sorted.
fn scenario_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                if path.file_name().is_none_or(|n| n != BOUNDS_DIR) {
                    pending.push(path);
                }
            } else if path.extension().is_some_and(|x| x == "toml") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

fn check(dir: &Path, strict: bool) -> Outcome {
    let files = scenario_files(dir).map_err(|e| {
        eprintln!("error: cannot read {}: {e}", dir.display());
        ExitCode::from(BAD_SCENARIO)
    })?;
    if files.is_empty() {
        eprintln!(
            "error: no scenario files (*.toml) in {} or its subdirectories",
            dir.display()
        );
        return Err(ExitCode::from(BAD_SCENARIO));
    }
    let mut worst = 0u8;
    for path in files {
        let scenario = match Scenario::load_checked(&path) {
            Ok((s, warnings)) => {
                let file = path.display().to_string();
                if strict && !warnings.is_empty() {
                    for w in warnings {
                        println!("BAD   {} (--strict)", w.into_error(&file));
                    }
                    worst = worst.max(BAD_SCENARIO);
                    continue;
                }
                for w in &warnings {
                    println!("WARN  {file}: {w}");
                }
                s
            }
            Err(e) => {
                println!("BAD   {e}");
                worst = worst.max(BAD_SCENARIO);
                continue;
            }
        };
        let started = Instant::now();
        match simulate(&scenario, scenario.seed) {
            Ok(run) if run.failed().is_empty() => {
                println!("ok    {} ({:.1} s)", path.display(), started.elapsed().as_secs_f64());
            }
            Ok(run) => {
                println!(
                    "FAIL  {}: {}\n      replay: redstring-sim run {} --seed {}",
                    path.display(),
                    names(&run.failed()),
                    path.display(),
                    run.seed
                );
                worst = worst.max(INVARIANT_FAILED);
            }
            Err(e) => {
                println!("ERROR {}: {e}", path.display());
                worst = worst.max(SIM_FAILED);
            }
        }
    }
    Ok(ExitCode::from(worst))
}

fn fuzz(path: &Path, cases: u32, seed: u64, out: &Path) -> Outcome {
    use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

    let bounds = Bounds::load(path).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(BAD_SCENARIO)
    })?;
    let mut runner = TestRunner::new(Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: 512,
        ..Config::default()
    });
    let bar = progress(u64::from(cases), "cases");
    let tried: RefCell<BTreeMap<String, u64>> = RefCell::new(BTreeMap::new());
    let runs = RefCell::new(0u64);
    let started = Instant::now();
    let result = runner.run(&fuzz::scenarios(&bounds), |scenario| {
        *runs.borrow_mut() += 1;
        let mut t = tried.borrow_mut();
        let layout = match scenario.cache.kind {
            CacheKind::PerWorker => "cache per worker".to_owned(),
            CacheKind::Shared => format!("cache shared, {}", report::stamped_by(scenario.cache.time_source)),
        };
        *t.entry(layout).or_default() += 1;
        for f in &scenario.faults {
            *t.entry(format!("fault {}", f.kind())).or_default() += 1;
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
            Ok(ExitCode::SUCCESS)
        }
        Err(TestError::Fail(reason, minimal)) => {
            println!("FAILED: {reason}");
            match fuzz::write_regression(out, &minimal) {
                Ok(written) => println!(
                    "smallest failing case: {}\nreplay: redstring-sim run {}",
                    written.display(),
                    written.display()
                ),
                Err(e) => eprintln!(
                    "error: cannot write the failing case to {}: {e}\n{}",
                    out.display(),
                    minimal.to_toml()
                ),
            }
            Ok(ExitCode::from(INVARIANT_FAILED))
        }
        Err(TestError::Abort(reason)) => {
            eprintln!("error: the search stopped: {reason}");
            Err(ExitCode::from(SIM_FAILED))
        }
    }
}
