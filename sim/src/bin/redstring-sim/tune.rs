//! `tune`: search the hardening's numbers for the configuration that meets
//! the scenario's objectives, whole or one shard of a rung at a time.

use std::path::PathBuf;
use std::process::ExitCode;

use redstring_sim::search::{tune, tune_shard};

use crate::shared::{
    BAD_SCENARIO, Outcome, Outputs, Parallel, SeedArgs, fail, fits_memory, inputs_of, jobs_or_cores, load, loads,
    progress, verdict,
};

/// Seeds the final candidates run on when `--seeds` is not given.
pub const DEFAULT_SEEDS: u64 = 16;

/// The arguments of `tune`.
#[derive(clap::Args)]
pub struct TuneArgs {
    /// The scenario file (it must set `[objectives]`).
    scenario: PathBuf,
    /// A dotted key and its values: `lo..hi` (integers), `lo..hi` with
    /// decimals (continuous), `lo..hi:step`, or `v1,v2,…`. Repeatable.
    #[arg(long = "vary", required = true)]
    vary: Vec<String>,
    // The seeds the final candidates run on (default 16 from --seed); the
    // first is also the design's seed.
    #[command(flatten)]
    seeds: SeedArgs,
    /// Most candidates: the full grid when it has at most this many,
    /// else this many Latin-hypercube draws.
    #[arg(long, default_value_t = 32)]
    budget: u64,
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
    // `--shard` runs only its part of the next rung's simulations and writes
    // them with every earlier result to `--json`; `merge` joins a round's
    // shards into the result, or into the state the next round resumes from.
    #[command(flatten)]
    parallel: Parallel,
    /// Continue from this state (what `merge` wrote after a rung).
    #[arg(long)]
    resume: Option<PathBuf>,
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

/// Runs `tune`: exit 0 when the recommendation meets every objective, 5
/// when no candidate does, 1 when a candidate broke an invariant (a bug,
/// printed with its seed), 2 for a bad scenario, `--vary` or `--resume`.
/// With `--shard`, one round: exit 0 once its part is written.
pub fn tune(args: TuneArgs) -> Outcome {
    let bad = |e: &dyn std::fmt::Display| fail(BAD_SCENARIO, e);
    let path = args.scenario.as_path();
    let mut outputs = Outputs::reserve([("--json", args.json), ("--out", args.out), ("--svg", args.svg)])?;
    let scenario = load(path, args.strict)?;
    let mut inputs = inputs_of(path, &scenario);
    inputs.extend(args.resume.clone());
    outputs.refuse_inputs(&inputs)?;
    let range = args.seeds.range(DEFAULT_SEEDS)?;
    let settings = tune::Settings {
        seeds: range.end - range.start,
        first_seed: range.start,
        budget: args.budget,
        jobs: jobs_or_cores(args.parallel.jobs),
    };
    let file = path.display().to_string();
    let text = redstring_sim::scenario::input::read_text(path).map_err(|e| bad(&format!("cannot read {file}: {e}")))?;
    let dims = args
        .vary
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
    fits_memory([&scenario], settings.jobs)?;
    let shard = args.parallel.shard;
    if shard.is_some() && !outputs.has("--json") {
        return Err(bad(&"tune --shard writes its part to --json: give --json FILE"));
    }
    let from = args
        .resume
        .as_deref()
        .map(|p| {
            let text = redstring_sim::scenario::input::read_text(p)
                .map_err(|e| bad(&format!("cannot read {}: {e}", p.display())))?;
            serde_json::from_str::<tune_shard::TunePart>(&text)
                .map_err(|e| bad(&format!("--resume {}: not a tune state: {e}", p.display())))
        })
        .transpose()?;
    print!("{}", loads(&scenario));
    let bar = progress(0, "simulations");
    let shown = TuneBar(bar.clone());
    let vary = &args.vary;
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
                outputs.write("--json", || serde_json::to_string_pretty(&part).unwrap_or_default())?;
                outputs.commit()?;
                return Ok(ExitCode::SUCCESS);
            }
            Err(e) => Err(e),
        },
    }
    .map_err(|e| bad(&e))?;
    bar.finish_and_clear();
    finish_tune(&tuning, &dims, outputs)
}

/// Prints a tune's result (whole, or merged from shards), writes its files
/// and gives its exit code.
pub fn finish_tune(tuning: &tune::Tuning, dims: &[tune::Dim], mut outputs: Outputs) -> Outcome {
    print!("{}", tuning.render(dims));
    outputs.write("--json", || serde_json::to_string_pretty(tuning).unwrap_or_default())?;
    if let Some(toml) = &tuning.hardening_toml {
        outputs.write("--out", || toml.clone())?;
    }
    outputs.write("--svg", || tune::pareto(tuning))?;
    outputs.commit()?;
    Ok(verdict(tuning.broke(), !tuning.met()))
}
