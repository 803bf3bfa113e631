//! `redstring-sim`: run outage scenarios against the real hardening code.
//!
//! ```text
//! redstring-sim run scenarios/llama-cpp-reload.toml [--seed N] [--json F] [--trace F] [--svg F] [--strict]
//! redstring-sim sweep scenarios/llama-cpp-reload.toml [--seeds N|A..B|A..=B] [--seed S] [--json F] [--strict] [--jobs N] [--shard i/n]
//! redstring-sim compare a.toml b.toml [--seeds …] [--set key=v1,v2 [--set KEY=V1,V2 …]] [--json F] [--svg F] [--strict] [--jobs N] [--shard i/n]
//! redstring-sim tune scenario.toml --vary hardening.failure_threshold=1..10 [--vary KEY=SPEC …] [--seeds …] [--seed S] [--budget CASES] [--jobs N] [--json F] [--out F] [--svg F] [--shard i/n [--resume STATE]]
//! redstring-sim sweep … --shard 1/2 --json a.json; … --shard 2/2 --json b.json; redstring-sim merge a.json b.json [--json F]
//! redstring-sim check [scenarios/] [--strict]
//! redstring-sim fuzz scenarios/bounds/default.toml --cases 200 [--seed N] [--shrink N] [--out scenarios/regressions] [--json F] [--shard i/n]
//! redstring-sim merge shard-1.json shard-2.json … [--json F] [--out scenarios/regressions]
//! redstring-sim lab scenarios/lab/crash-restart.toml [--repeat M] [--seeds N] [--no-calibrate] [--json F] [--trace F]
//! redstring-sim calibrate --base-url http://127.0.0.1:8080 [--model M] [--name N] [--max-concurrency C] [--requests-per-client R] [--out F]
//! ```
//!
//! One file per command; what they share (exit codes, `--seeds`, `--jobs`,
//! `--shard`, loading a scenario, writing outputs safely) is in `shared`.
//! Every command goes through [`redstring_sim::campaign::simulate`]: build the
//! world, run it, check the invariants. `run`, `sweep` and `check` first print
//! each server's offered load against its capacity and what is odd about the
//! scenario (`redstring_sim::scenario::sanity`); with `--strict` anything odd
//! is an error.
//!
//! Exit codes: 0 every invariant held (or was expected not to), 1 an invariant
//! failed, 2 a scenario (or bounds) file is unusable (or, under `--strict`,
//! odd), 3 the simulation itself failed, ran over its work budget or would
//! not fit the process's address-space limit, 4 an
//! output file could not be written or was refused (it is an input, or two
//! flags name it), 5 every invariant held but an objective (`[objectives]`)
//! was missed. A command that fails leaves every existing file as it was.

mod calibrate;
mod check;
mod compare;
mod fuzz;
mod lab;
mod merge;
#[cfg(feature = "mutants")]
mod mutants;
mod run;
mod shared;
mod sweep;
mod tune;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The allocator of every command: a fleet's peak memory is mostly small
/// buffers of its connections and its trace (BENCHMARKS.md, "Simulator at
/// fleet scale").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "redstring-sim",
    version,
    about = "Simulate the outage you fear before it happens."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The most megabytes one input file (scenario, bounds, trace, shard or
    /// tune state) may have; default 1024. Inputs must be regular files.
    #[arg(long, global = true, value_name = "MB")]
    max_input_mb: Option<u64>,
}

#[derive(Subcommand)]
enum Command {
    /// Run one scenario and print its report.
    Run(run::RunArgs),
    /// Run one scenario over a range of seeds and list every failing seed.
    Sweep(sweep::SweepArgs),
    /// Run several scenarios (or one with fields varied by --set, several
    /// --set making every combination) over the same seeds and set their
    /// figures side by side, marking which
    /// differences hold across seeds (a paired sign test against the first).
    Compare(compare::CompareArgs),
    /// Join the `--json` of every shard of one sweep, comparison or fuzz
    /// run (`--shard i/n`) and print the result one machine would have
    /// printed.
    Merge(merge::MergeArgs),
    /// Search the hardening's numbers for the configuration that meets the
    /// scenario's objectives: a grid when small, else a seeded Latin
    /// hypercube refined by successive halving over seeds; prints the
    /// Pareto front and the recommended `[hardening]` section.
    Tune(tune::TuneArgs),
    /// Search generated scenarios within bounds for one that breaks a claimed
    /// invariant; write the smallest one found as a replayable scenario.
    Fuzz(fuzz::FuzzArgs),
    /// Show that the invariants catch every known-bad variant of the
    /// hardening: hunt each with its targeted scenario and then the fuzzer,
    /// run the correct hardening on the same budget, and print the table.
    #[cfg(feature = "mutants")]
    Mutants(mutants::MutantsArgs),
    /// Run every scenario under a directory (subdirectories included, bounds
    /// directories skipped) with its own seed and check its invariants.
    Check(check::CheckArgs),
    /// Measure a running OpenAI-compatible server (latency against
    /// concurrency, prompt and output tokens; its slots from `/props`) and
    /// print the `[[servers]]` section that gives a scenario its speed.
    Calibrate(calibrate::CalibrateArgs),
    /// Run a scenario for real, in real time, against real llama-server
    /// processes (`lab/setup.sh` builds them), report each repetition as
    /// `run` does, then set the simulator's prediction beside what was
    /// measured, figure by figure.
    Lab(lab::LabArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(mb) = cli.max_input_mb {
        redstring_sim::scenario::input::set_max_input_bytes(mb.saturating_mul(1 << 20));
    }
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Sweep(args) => sweep::sweep(args),
        Command::Compare(args) => compare::compare(args),
        Command::Merge(args) => merge::merge(args),
        Command::Tune(args) => tune::tune(args),
        Command::Fuzz(args) => fuzz::fuzz(args),
        #[cfg(feature = "mutants")]
        Command::Mutants(args) => mutants::run(args),
        Command::Check(args) => check::check(args),
        Command::Calibrate(args) => calibrate::calibrate(args),
        Command::Lab(args) => lab::lab(args),
    };
    result.unwrap_or_else(|code| code)
}
