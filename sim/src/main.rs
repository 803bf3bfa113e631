//! `redstring-sim`: run outage scenarios against the real hardening code.
//!
//! ```text
//! redstring-sim run scenarios/llama-swap-reload.toml [--seed N] [--json F] [--trace F] [--svg F] [--strict]
//! redstring-sim sweep scenarios/llama-swap-reload.toml --seeds 1..50 [--json F] [--strict] [--jobs N] [--shard i/n]
//! redstring-sim compare a.toml b.toml --seeds 1..20 [--set key=v1,v2] [--json F] [--svg F] [--strict] [--jobs N] [--shard i/n]
//! redstring-sim tune scenario.toml --vary hardening.failure_threshold=1..10 [--vary KEY=SPEC …] [--seeds N] [--seed S] [--budget CASES] [--jobs N] [--json F] [--out F] [--svg F] [--shard i/n [--resume STATE]]
//! redstring-sim sweep … --shard 1/2 --json a.json; … --shard 2/2 --json b.json; redstring-sim merge a.json b.json [--json F]
//! redstring-sim check [scenarios/] [--strict]
//! redstring-sim fuzz scenarios/bounds/default.toml --cases 200 [--seed N] [--shrink N] [--out scenarios/regressions] [--json F] [--shard i/n]
//! redstring-sim merge shard-1.json shard-2.json … [--json F] [--out scenarios/regressions]
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

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use redstring_sim::evidence::episodes;
use redstring_sim::evidence::trace::Trace;
use redstring_sim::judgement::report::{self, Report};
use redstring_sim::judgement::sweep::{SeedRecord, SweepSummary};
use redstring_sim::judgement::{compare, plots, shard};
use redstring_sim::scenario::{Scenario, Warning, sanity};
use redstring_sim::search::coverage::Coverage;
use redstring_sim::search::fuzz::{self, BOUNDS_DIR, Bounds};
use redstring_sim::search::fuzz_run;
use redstring_sim::search::{tune, tune_shard};
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
        /// Inject this known-bad variant of the hardening (see `mutants`),
        /// to replay a case that catches it.
        #[cfg(feature = "mutants")]
        #[arg(long, value_parser = parse_mutant)]
        mutant: Option<redstring_sim::search::mutants::Mutant>,
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
        /// Simulations run at once (default: every core); the results do
        /// not depend on it.
        #[arg(long)]
        jobs: Option<usize>,
        /// Run only shard `i` of `n` of the seeds (every `n`th from the
        /// `i`th); `merge` joins the shards' `--json`.
        #[arg(long, value_parser = parse_shard)]
        shard: Option<shard::Shard>,
    },
    /// Run several scenarios (or one with a field varied by --set) over the
    /// same seeds and set their figures side by side, marking which
    /// differences hold across seeds (a paired sign test against the first).
    Compare {
        /// The scenario files (one, with --set).
        #[arg(required = true)]
        scenarios: Vec<PathBuf>,
        /// Seeds as `A..B` (B exclusive).
        #[arg(long, default_value = "1..21")]
        seeds: String,
        /// Vary one field of the one scenario: a dotted TOML key and its
        /// values, e.g. `hardening.failure_threshold=1,3,5`.
        #[arg(long)]
        set: Option<String>,
        /// Write the comparison as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write an SVG of the distributions side by side here.
        #[arg(long)]
        svg: Option<PathBuf>,
        /// Refuse (exit 2) a scenario with any warning.
        #[arg(long)]
        strict: bool,
        /// Simulations run at once (default: every core); the results do
        /// not depend on it.
        #[arg(long)]
        jobs: Option<usize>,
        /// Run only shard `i` of `n` of the seeds (every `n`th from the
        /// `i`th); `merge` joins the shards' `--json`.
        #[arg(long, value_parser = parse_shard)]
        shard: Option<shard::Shard>,
    },
    /// Join the `--json` of every shard of one sweep, comparison or fuzz
    /// run (`--shard i/n`) and print the result one machine would have
    /// printed.
    Merge {
        /// Each shard's `--json` file.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Write the joined JSON here (as the unsharded command would).
        #[arg(long)]
        json: Option<PathBuf>,
        /// For a fuzz run: where its failing case is written (as `fuzz --out`).
        #[arg(long, default_value = "scenarios/regressions")]
        out: PathBuf,
    },
    /// Search the hardening's numbers for the configuration that meets the
    /// scenario's objectives with the most margin: a grid when small, else a
    /// seeded Latin hypercube refined by successive halving over seeds;
    /// prints the Pareto front and the recommended `[hardening]` section.
    Tune {
        /// The scenario file (it must set `[objectives]`).
        scenario: PathBuf,
        /// A dotted key and its values: `lo..hi` (integers), `lo..hi` with
        /// decimals (continuous), `lo..hi:step`, or `v1,v2,…`. Repeatable.
        #[arg(long = "vary", required = true)]
        vary: Vec<String>,
        /// Seeds the final candidates run on (`--seed` onwards).
        #[arg(long, default_value_t = 16)]
        seeds: u64,
        /// The design's seed and the first simulation seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Most candidates: the full grid when it has at most this many,
        /// else this many Latin-hypercube draws.
        #[arg(long, default_value_t = 32)]
        budget: u64,
        /// Simulations run at once (default: every core); the results do
        /// not depend on it.
        #[arg(long)]
        jobs: Option<usize>,
        /// Write the result (every candidate, the front, the
        /// recommendation) as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write the recommended `[hardening]` section (TOML) here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Write an SVG of the Pareto front here.
        #[arg(long)]
        svg: Option<PathBuf>,
        /// Refuse (exit 2) a scenario with any warning.
        #[arg(long)]
        strict: bool,
        /// Run only shard `i` of `n` of the next rung's simulations and
        /// write them with every earlier result to `--json`; `merge` joins
        /// a round's shards into the result, or into the state the next
        /// round resumes from.
        #[arg(long, value_parser = parse_shard)]
        shard: Option<shard::Shard>,
        /// Continue from this state (what `merge` wrote after a rung).
        #[arg(long)]
        resume: Option<PathBuf>,
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
        /// Most shrinking steps for a failing case.
        #[arg(long, default_value_t = 512)]
        shrink: u32,
        /// Where a failing case is written.
        #[arg(long, default_value = "scenarios/regressions")]
        out: PathBuf,
        /// Write the result, per case, as JSON here (what `merge` joins).
        #[arg(long)]
        json: Option<PathBuf>,
        /// Simulate only shard `i` of `n` of the cases (every `n`th from
        /// the `i`th; every case is still drawn); `merge` joins the
        /// shards' `--json`.
        #[arg(long, value_parser = parse_shard)]
        shard: Option<shard::Shard>,
        /// Inject this known-bad variant of the hardening (see `mutants`):
        /// a search that must fail.
        #[cfg(feature = "mutants")]
        #[arg(long, value_parser = parse_mutant)]
        mutant: Option<redstring_sim::search::mutants::Mutant>,
    },
    /// Show that the invariants catch every known-bad variant of the
    /// hardening: hunt each with its targeted scenario and then the fuzzer,
    /// run the correct hardening on the same budget, and print the table.
    #[cfg(feature = "mutants")]
    Mutants {
        /// Fuzz cases per variant after its targeted scenario passed.
        #[arg(long, default_value_t = 16)]
        cases: u32,
        /// The search's seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// The bounds file the fuzzer draws from.
        #[arg(long, default_value = "scenarios/bounds/default.toml")]
        bounds: PathBuf,
        /// The scenarios directory (the targeted scenarios are in its `mutants/`).
        #[arg(long, default_value = "scenarios")]
        scenarios: PathBuf,
        /// Where the cases the fuzzer caught a variant with are written
        /// (copy one into `scenarios/regressions/mutants/` to keep it).
        #[arg(long, default_value = "target/mutants")]
        out: PathBuf,
        /// Only these variants (by name; default all).
        #[arg(long = "only", value_parser = parse_mutant)]
        only: Vec<redstring_sim::search::mutants::Mutant>,
        /// Skip the targeted scenarios: measure what the fuzzer alone catches.
        #[arg(long)]
        fuzz_only: bool,
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
            #[cfg(feature = "mutants")]
            mutant,
        } => {
            #[cfg(feature = "mutants")]
            let _injected = redstring::mutants::inject(mutant);
            run(&scenario, seed, Outputs::open(json, trace, svg), strict)
        }
        #[cfg(feature = "mutants")]
        Command::Mutants {
            cases,
            seed,
            bounds,
            scenarios,
            out,
            only,
            fuzz_only,
        } => mutants(MutantsRun { cases, seed, fuzz_only }, &bounds, &scenarios, &out, &only),
        Command::Sweep {
            scenario,
            seeds,
            strict,
            json,
            jobs,
            shard,
        } => sweep(&scenario, &seeds, json, strict, jobs, shard),
        Command::Compare {
            scenarios,
            seeds,
            set,
            json,
            svg,
            strict,
            jobs,
            shard,
        } => compare(&scenarios, &seeds, set.as_deref(), [json, svg], strict, jobs, shard),
        Command::Merge { files, json, out } => merge(&files, json, &out),
        Command::Tune {
            scenario,
            vary,
            seeds,
            seed,
            budget,
            jobs,
            json,
            out,
            svg,
            strict,
            shard,
            resume,
        } => tune(
            &scenario,
            &vary,
            tune::Settings {
                seeds,
                first_seed: seed,
                budget,
                jobs: jobs_or_cores(jobs),
            },
            [json, out, svg],
            strict,
            (shard, resume.as_deref()),
        ),
        Command::Check { dir, strict } => check(&dir, strict),
        Command::Fuzz {
            bounds,
            cases,
            seed,
            shrink,
            out,
            json,
            shard,
            #[cfg(feature = "mutants")]
            mutant,
        } => {
            #[cfg(feature = "mutants")]
            let _injected = redstring::mutants::inject(mutant);
            #[cfg(feature = "mutants")]
            let mutant = mutant.map(|m| m.name().to_owned());
            #[cfg(not(feature = "mutants"))]
            let mutant = None;
            let settings = fuzz_run::Settings {
                bounds: bounds.display().to_string(),
                cases,
                seed,
                shrink,
                mutant,
                shard,
            };
            fuzz(&bounds, &settings, &out, json)
        }
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

/// Creates an output file (`--json`, `--out`, `--svg`) before any simulation runs.
fn create(json: Option<PathBuf>) -> Result<Option<(PathBuf, File)>, ExitCode> {
    json.map(|p| File::create(&p).map(|f| (p.clone(), f)).map_err(|e| io_failed(&p, e)))
        .transpose()
}

fn seed_range(seeds: &str) -> Result<(u64, u64), ExitCode> {
    parse_range(seeds).ok_or_else(|| {
        eprintln!("error: --seeds must look like A..B with A < B, got {seeds:?}");
        ExitCode::from(BAD_SCENARIO)
    })
}

/// `--jobs`, or every core.
fn jobs_or_cores(jobs: Option<usize>) -> usize {
    jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1)
}

/// Runs `scenario` over `seeds` on `jobs` threads and returns each seed's
/// record in the order given, whatever the order they finished in: each
/// simulation is single-threaded and builds its own world, so the results
/// are those of a run on one thread.
fn run_seeds(
    scenario: &Scenario,
    shown: &str,
    seeds: &[u64],
    jobs: usize,
    bar: &indicatif::ProgressBar,
) -> Vec<SeedRecord> {
    redstring_sim::search::parallel_map(seeds, jobs, |&seed| {
        let record = match simulate(scenario, seed) {
            Ok(run) => SeedRecord::of(&Report::new(scenario, shown, &run)),
            Err(e) => SeedRecord::failed(seed, format!("simulation failed: {e}")),
        };
        bar.inc(1);
        record
    })
}

fn sweep(
    path: &Path,
    seeds: &str,
    json: Option<PathBuf>,
    strict: bool,
    jobs: Option<usize>,
    shard: Option<shard::Shard>,
) -> Outcome {
    let scenario = load(path, strict)?;
    let json = create(json)?;
    let preamble = loads(&scenario);
    print!("{preamble}");
    let (from, to) = seed_range(seeds)?;
    // Every seed asks for the same work: over the budget is one failure, not
    // one per seed.
    Budget::DEFAULT.check(&scenario).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(SIM_FAILED)
    })?;
    let seeds = shard::seeds_of(shard, from, to);
    let bar = progress(seeds.len() as u64, "seeds");
    let shown = path.display().to_string();
    let records = run_seeds(&scenario, &shown, &seeds, jobs_or_cores(jobs), &bar);
    bar.finish();
    let run = shard::SweepRun {
        command: "sweep",
        scenario: shown,
        seed_range: [from, to],
        shard,
        preamble,
        summary: SweepSummary::of_records(records),
    };
    print!("{}", run.render());
    Outputs::write(json, || serde_json::to_string_pretty(&run).unwrap_or_default())?;
    let (failed, missed) = run.verdict();
    Ok(verdict(failed, missed))
}

/// `merge`: the shards' JSON joined, printed and written as the unsharded
/// command would (a fuzz run's failing case written into `out`); its exit
/// code too.
fn merge(files: &[PathBuf], json: Option<PathBuf>, out: &Path) -> Outcome {
    let json = create(json)?;
    let mut texts = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| {
            eprintln!("error: cannot read {}: {e}", f.display());
            ExitCode::from(BAD_SCENARIO)
        })?;
        texts.push((f.display().to_string(), text));
    }
    let merged = shard::merge(&texts).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(BAD_SCENARIO)
    })?;
    match &merged {
        shard::Merged::Fuzz(run) => return finish_fuzz(run, out, json),
        shard::Merged::Tune(tune_shard::Joined::Done { tuning, dims, scenario }) => {
            print!("{}", loads(scenario));
            return finish_tune(tuning, dims, [json, None, None]);
        }
        shard::Merged::Tune(tune_shard::Joined::Next(_)) if json.is_none() => {
            eprintln!(
                "error: the tune has rungs left: give --json STATE to write the state the next round resumes from"
            );
            return Err(ExitCode::from(BAD_SCENARIO));
        }
        _ => {}
    }
    print!("{}", merged.render());
    Outputs::write(json, || merged.to_json())?;
    let (failed, missed) = merged.verdict();
    Ok(verdict(failed, missed))
}

fn parse_shard(text: &str) -> Result<shard::Shard, String> {
    shard::Shard::parse(text).map_err(|e| e.to_string())
}

/// The variants `compare` runs: each file, or the one file once per `--set`
/// value, each with the name it is shown by.
fn variants(paths: &[PathBuf], set: Option<&str>, strict: bool) -> Result<Vec<(String, Scenario)>, ExitCode> {
    let bad = |e: &dyn std::fmt::Display| {
        eprintln!("error: {e}");
        ExitCode::from(BAD_SCENARIO)
    };
    let Some(set) = set else {
        return paths
            .iter()
            .map(|p| load(p, strict).map(|s| (p.display().to_string(), s)))
            .collect();
    };
    let [path] = paths else {
        eprintln!("error: --set varies one scenario; {} were given", paths.len());
        return Err(ExitCode::from(BAD_SCENARIO));
    };
    let (key, values) = compare::parse_set(set).map_err(|e| bad(&e))?;
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| bad(&format!("cannot read {file}: {e}")))?;
    let mut out = Vec::new();
    for value in values {
        let varied = compare::set_field(&text, &key, &value).map_err(|e| bad(&e))?;
        let (scenario, warnings) =
            Scenario::parse_checked(&file, &varied).map_err(|e| bad(&format!("with --set {key}={value}: {e}")))?;
        let shown = format!("{file} {key}={value}");
        if strict && !warnings.is_empty() {
            for w in warnings {
                eprintln!("error: {} (--strict)", w.into_error(&shown));
            }
            return Err(ExitCode::from(BAD_SCENARIO));
        }
        print_warnings(&shown, &warnings);
        out.push((format!("{key}={value}"), scenario));
    }
    Ok(out)
}

fn compare(
    paths: &[PathBuf],
    seeds: &str,
    set: Option<&str>,
    [json, svg]: [Option<PathBuf>; 2],
    strict: bool,
    jobs: Option<usize>,
    shard: Option<shard::Shard>,
) -> Outcome {
    let variants = variants(paths, set, strict)?;
    let json = create(json)?;
    let svg = create(svg)?;
    let (from, to) = seed_range(seeds)?;
    for (name, scenario) in &variants {
        Budget::DEFAULT.check(scenario).map_err(|e| {
            eprintln!("error: {name}: {e}");
            ExitCode::from(SIM_FAILED)
        })?;
    }
    let jobs = jobs_or_cores(jobs);
    let seeds = shard::seeds_of(shard, from, to);
    let bar = progress((seeds.len() as u64).saturating_mul(variants.len() as u64), "runs");
    let mut runs = Vec::new();
    for (name, scenario) in &variants {
        let records = run_seeds(scenario, name, &seeds, jobs, &bar);
        for r in &records {
            if let Some(why) = &r.error {
                bar.println(format!("{name} seed {}: {why}", r.seed));
            }
        }
        runs.push(compare::Variant {
            name: name.clone(),
            records,
        });
    }
    bar.finish();
    let comparison = compare::Comparison::new(from, to, shard, &runs);
    print!("{}", comparison.render());
    Outputs::write(json, || serde_json::to_string_pretty(&comparison).unwrap_or_default())?;
    Outputs::write(svg, || plots::distributions(&comparison))?;
    let merged = shard::Merged::Compare(comparison);
    let (failed, missed) = merged.verdict();
    Ok(verdict(failed, missed))
}

/// The progress bar as a tune's progress.
struct TuneBar(indicatif::ProgressBar);

impl tune::Progress for TuneBar {
    fn rung(&self, n: u64) {
        self.0.inc_length(n);
    }
    fn one(&self) {
        self.0.inc(1);
    }
}

/// `tune`: exit 0 when the recommendation meets every objective, 5 when no
/// candidate does, 1 when a candidate broke an invariant (a bug, printed
/// with its seed), 2 for a bad scenario, `--vary` or `--resume`. With
/// `--shard`, one round: exit 0 once its part is written.
fn tune(
    path: &Path,
    vary: &[String],
    settings: tune::Settings,
    files: [Option<PathBuf>; 3],
    strict: bool,
    (shard, resume): (Option<shard::Shard>, Option<&Path>),
) -> Outcome {
    let bad = |e: &dyn std::fmt::Display| {
        eprintln!("error: {e}");
        ExitCode::from(BAD_SCENARIO)
    };
    let scenario = load(path, strict)?;
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| bad(&format!("cannot read {file}: {e}")))?;
    let dims = vary
        .iter()
        .map(|v| tune::Dim::parse(v))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&e))?;
    let base = tune::Base {
        file: &file,
        text: &text,
        scenario: &scenario,
    };
    tune::precheck(&base, &dims).map_err(|e| bad(&e))?;
    if shard.is_some() && files[0].is_none() {
        return Err(bad(&"tune --shard writes its part to --json: give --json FILE"));
    }
    let from = resume
        .map(|p| {
            let text = std::fs::read_to_string(p).map_err(|e| bad(&format!("cannot read {}: {e}", p.display())))?;
            serde_json::from_str::<tune_shard::TunePart>(&text)
                .map_err(|e| bad(&format!("--resume {}: not a tune state: {e}", p.display())))
        })
        .transpose()?;
    let [json, out, svg] = files.map(create);
    let (json, out, svg) = (json?, out?, svg?);
    print!("{}", loads(&scenario));
    let bar = progress(0, "simulations");
    let shown = TuneBar(bar.clone());
    let tuning = match (shard, &from) {
        (None, None) => tune::tune(&base, &dims, settings, &shown),
        (None, Some(from)) => tune_shard::finish(&base, &dims, vary, settings, from, &shown),
        (Some(shard), from) => match tune_shard::round(&base, &dims, vary, settings, from.as_ref(), shard, &shown) {
            Ok(tune_shard::Round::Done(tuning)) => Ok(*tuning),
            Ok(tune_shard::Round::Ran {
                rung,
                rungs,
                ran,
                of,
                part,
            }) => {
                bar.finish_and_clear();
                println!(
                    "tune {file}: rung {rung} of {rungs}, shard {}/{}: ran {ran} of the rung's {of} simulations\nnext: `redstring-sim merge` every shard's --json of this round; it prints the result once every rung is run, else writes the state to resume the next round from (tune … --resume STATE --shard i/n)",
                    shard.index, shard.count
                );
                Outputs::write(json, || serde_json::to_string_pretty(&part).unwrap_or_default())?;
                return Ok(ExitCode::SUCCESS);
            }
            Err(e) => Err(e),
        },
    }
    .map_err(|e| bad(&e))?;
    bar.finish_and_clear();
    finish_tune(&tuning, &dims, [json, out, svg])
}

/// Prints a tune's result (whole, or merged from shards), writes its files
/// and gives its exit code.
fn finish_tune(tuning: &tune::Tuning, dims: &[tune::Dim], [json, out, svg]: [Option<(PathBuf, File)>; 3]) -> Outcome {
    print!("{}", tuning.render(dims));
    Outputs::write(json, || serde_json::to_string_pretty(tuning).unwrap_or_default())?;
    Outputs::write(out, || tuning.hardening_toml.clone().unwrap_or_default())?;
    Outputs::write(svg, || plots::pareto(tuning))?;
    Ok(verdict(tuning.broke(), !tuning.met()))
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

fn fuzz(path: &Path, settings: &fuzz_run::Settings, out: &Path, json: Option<PathBuf>) -> Outcome {
    let bounds = Bounds::load(path).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(BAD_SCENARIO)
    })?;
    let json = create(json)?;
    let bar = progress(u64::from(settings.cases), "cases");
    let started = Instant::now();
    let run = fuzz_run::run(&bounds, settings, || bar.inc(1));
    bar.finish_and_clear();
    let wall = started.elapsed().as_secs_f64();
    // How fast is the machine's, not the search's: on stderr, so that the
    // text on stdout is the same on every machine and for merged shards.
    eprintln!(
        "fuzz: {} simulations in {wall:.1} s ({:.0} per minute)",
        run.simulations,
        run.simulations as f64 / wall.max(1e-9) * 60.0
    );
    finish_fuzz(&run, out, json)
}

/// Prints a fuzz run (whole, a shard, or merged shards), writes its failing
/// case into `out` and its `--json`, and gives its exit code: 0 no case
/// failed, 1 one did, 3 the search stopped.
fn finish_fuzz(run: &fuzz_run::FuzzRun, out: &Path, json: Option<(PathBuf, File)>) -> Outcome {
    print!("{}", run.render());
    match &run.outcome {
        fuzz_run::FuzzOutcome::Failed { regression, .. } => match fuzz::write(out, regression) {
            Ok(written) => println!(
                "smallest failing case: {}\nreplay: redstring-sim run {}",
                written.display(),
                written.display()
            ),
            Err(e) => eprintln!(
                "error: cannot write the failing case to {}: {e}\n{}",
                out.display(),
                regression.toml
            ),
        },
        fuzz_run::FuzzOutcome::Aborted { reason, .. } => eprintln!("error: the search stopped: {reason}"),
        fuzz_run::FuzzOutcome::Passed => {}
    }
    Outputs::write(json, || serde_json::to_string_pretty(run).unwrap_or_default())?;
    match run.outcome {
        fuzz_run::FuzzOutcome::Passed => Ok(ExitCode::SUCCESS),
        fuzz_run::FuzzOutcome::Failed { .. } => Ok(ExitCode::from(INVARIANT_FAILED)),
        fuzz_run::FuzzOutcome::Aborted { .. } => Err(ExitCode::from(SIM_FAILED)),
    }
}

#[cfg(feature = "mutants")]
fn parse_mutant(name: &str) -> Result<redstring_sim::search::mutants::Mutant, String> {
    use redstring_sim::search::mutants::Mutant;
    Mutant::parse(name).ok_or_else(|| {
        let names: Vec<&str> = Mutant::ALL.iter().map(|m| m.name()).collect();
        format!("no mutant named {name:?}; the catalogue has: {}", names.join(", "))
    })
}

/// The budget of one `mutants` run.
#[cfg(feature = "mutants")]
#[derive(Clone, Copy)]
struct MutantsRun {
    cases: u32,
    seed: u64,
    fuzz_only: bool,
}

/// `mutants`: every variant hunted, the correct hardening on the same
/// budget, one table, and what the searches exercised. Exit 0 when every
/// variant was caught by the invariant that names it and the correct
/// hardening passed; 1 otherwise.
#[cfg(feature = "mutants")]
fn mutants(
    run: MutantsRun,
    bounds: &Path,
    scenarios: &Path,
    out: &Path,
    only: &[redstring_sim::search::mutants::Mutant],
) -> Outcome {
    use redstring_sim::search::mutants::{self, Budget, CATALOGUE, Stage};

    let MutantsRun { cases, seed, fuzz_only } = run;
    let budget = Budget::new(cases, seed);
    let bounds = Bounds::load(bounds).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(BAD_SCENARIO)
    })?;
    let chosen: Vec<_> = CATALOGUE
        .iter()
        .filter(|v| only.is_empty() || only.contains(&v.mutant))
        .collect();
    let load = |v: &mutants::Variant| {
        mutants::targeted(scenarios, v).map_err(|e| {
            eprintln!("error: {e}");
            ExitCode::from(BAD_SCENARIO)
        })
    };
    let started = Instant::now();
    let bar = progress(chosen.len() as u64 + 1, "variants");
    let mut coverage = Coverage::new();
    let mut rows = Vec::new();
    let mut all_caught = true;
    for v in &chosen {
        let targeted = if fuzz_only { None } else { Some(load(v)?) };
        bar.set_message(v.mutant.name());
        let hunt =
            mutants::hunt(Some(v.mutant), targeted.as_ref(), &bounds, budget, Some(&mut coverage)).map_err(|e| {
                eprintln!("error: {}: {e}", v.mutant);
                ExitCode::from(SIM_FAILED)
            })?;
        bar.inc(1);
        let caught = hunt.caught_by_name(v.named_by);
        all_caught &= caught;
        let written = match (&hunt.stage, &hunt.case) {
            (Some(Stage::Targeted), _) => scenarios
                .join(mutants::SCENARIO_DIR)
                .join(v.scenario)
                .display()
                .to_string(),
            (Some(Stage::Fuzzed(_)), Some(case)) => match mutants::write_case(out, v.mutant, case) {
                Ok(p) => p.display().to_string(),
                Err(e) => return Err(io_failed(out, e)),
            },
            _ => "-".into(),
        };
        rows.push((v, hunt, caught, written));
    }
    // The correct hardening on the same budget: every targeted scenario,
    // then the same fuzz cases.
    bar.set_message("correct hardening");
    let mut control = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for v in chosen.iter().filter(|v| !fuzz_only && seen.insert(v.scenario)) {
        let targeted = load(v)?;
        let hunt = mutants::hunt(None, Some(&targeted), &bounds, Budget::new(0, seed), None).map_err(|e| {
            eprintln!("error: correct hardening: {e}");
            ExitCode::from(SIM_FAILED)
        })?;
        if !hunt.failed.is_empty() {
            control.push(format!("{}: {}", v.scenario, names(&hunt.failed)));
        }
    }
    let fuzzed = mutants::hunt(None, None, &bounds, budget, None).map_err(|e| {
        eprintln!("error: correct hardening: {e}");
        ExitCode::from(SIM_FAILED)
    })?;
    if !fuzzed.failed.is_empty() {
        control.push(format!("fuzz case: {}", names(&fuzzed.failed)));
    }
    bar.inc(1);
    bar.finish_and_clear();

    println!(
        "mutants: {} variants; {} then up to {cases} fuzz cases each, seed {seed} ({:.1} s)",
        chosen.len(),
        if fuzz_only {
            "no targeted scenario"
        } else {
            "the targeted scenario"
        },
        started.elapsed().as_secs_f64()
    );
    println!(
        "{:<24} {:<20} {:<36} {:<10} {:>5} {:>10}  case",
        "variant", "named by", "caught by", "stage", "sims", "simulated"
    );
    for (v, hunt, caught, written) in &rows {
        let stage = match hunt.stage {
            Some(Stage::Targeted) => "targeted".to_string(),
            Some(Stage::Fuzzed(n)) => format!("fuzz #{n}"),
            None => "NOT CAUGHT".to_string(),
        };
        let by = if hunt.failed.is_empty() {
            "-".to_string()
        } else {
            names(&hunt.failed)
        };
        println!(
            "{:<24} {:<20} {:<36} {:<10} {:>5} {:>8.0} s  {written}{}",
            v.mutant.name(),
            v.named_by.name(),
            by,
            stage,
            hunt.simulations,
            hunt.simulated.as_secs_f64(),
            if *caught {
                ""
            } else {
                "  (not by the invariant that names it)"
            }
        );
    }
    if control.is_empty() {
        println!(
            "correct hardening: passed the same budget ({} simulations)",
            fuzzed.simulations + seen.len() as u32
        );
    } else {
        println!("correct hardening: FAILED {}", control.join("; "));
    }
    print!("exercised by the hunts, until each caught its variant:\n{coverage}");
    if all_caught && control.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::from(INVARIANT_FAILED))
    }
}
