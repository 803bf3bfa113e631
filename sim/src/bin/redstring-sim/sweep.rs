//! `sweep`: one scenario over many seeds, every failing seed listed with its
//! replay command, each figure's distribution and each objective's pass rate.

use std::path::PathBuf;

use redstring_sim::campaign::run_seeds;
use redstring_sim::judgement::shard;
use redstring_sim::judgement::sweep::{SweepRun, SweepSummary};
use redstring_sim::world::Budget;

use crate::shared::{
    Outcome, Outputs, Parallel, SIM_FAILED, SeedArgs, fail, fits_memory, inputs_of, jobs_or_cores, load, loads,
    progress, verdict,
};

/// Seeds `sweep` and `compare` run when `--seeds` is not given.
pub const DEFAULT_SEEDS: u64 = 20;

/// The arguments of `sweep`.
#[derive(clap::Args)]
pub struct SweepArgs {
    /// The scenario file.
    scenario: PathBuf,
    #[command(flatten)]
    seeds: SeedArgs,
    /// Write the summary (distributions and pass rates) as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Refuse (exit 2) a scenario with any warning.
    #[arg(long)]
    strict: bool,
    #[command(flatten)]
    parallel: Parallel,
}

/// Runs `sweep`.
pub fn sweep(args: SweepArgs) -> Outcome {
    let path = args.scenario.as_path();
    let mut outputs = Outputs::reserve([("--json", args.json)])?;
    let scenario = load(path, args.strict)?;
    outputs.refuse_inputs(&inputs_of(path, &scenario))?;
    let range = args.seeds.range(DEFAULT_SEEDS)?;
    let preamble = loads(&scenario);
    print!("{preamble}");
    // Every seed asks for the same work: over the budget is one failure, not
    // one per seed.
    Budget::DEFAULT.check(&scenario).map_err(|e| fail(SIM_FAILED, &e))?;
    let shard = args.parallel.shard;
    let seeds = shard::seeds_of(shard, range.start, range.end);
    let jobs = jobs_or_cores(args.parallel.jobs);
    fits_memory([&scenario], jobs.min(seeds.len()))?;
    let bar = progress(seeds.len() as u64, "seeds");
    let shown = path.display().to_string();
    let records = run_seeds(&scenario, &shown, &seeds, jobs, || bar.inc(1));
    bar.finish();
    let run = SweepRun {
        command: "sweep",
        scenario: shown,
        seed_range: [range.start, range.end],
        shard,
        preamble,
        digest: scenario.digest(),
        summary: SweepSummary::of_records(records),
    };
    print!("{}", run.render());
    outputs.write("--json", || serde_json::to_string_pretty(&run).unwrap_or_default())?;
    outputs.commit()?;
    let (failed, missed) = run.verdict();
    Ok(verdict(failed, missed))
}
