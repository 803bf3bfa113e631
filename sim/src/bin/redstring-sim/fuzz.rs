//! `fuzz`: generated scenarios within bounds searched for one that breaks a
//! claimed invariant, the smallest failing one written as a scenario.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use redstring_sim::judgement::shard;
use redstring_sim::search::fuzz::{self, Bounds};
use redstring_sim::search::fuzz_run;

use crate::shared::{BAD_SCENARIO, INVARIANT_FAILED, Outcome, Outputs, SIM_FAILED, fail, parse_shard, progress};

/// The arguments of `fuzz`.
#[derive(clap::Args)]
pub struct FuzzArgs {
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
    #[arg(long, value_parser = crate::mutants::parse_mutant)]
    mutant: Option<redstring_sim::search::mutants::Mutant>,
}

/// Runs `fuzz`.
pub fn fuzz(args: FuzzArgs) -> Outcome {
    #[cfg(feature = "mutants")]
    let _injected = redstring::mutants::inject(args.mutant);
    #[cfg(feature = "mutants")]
    let mutant = args.mutant.map(|m| m.name().to_owned());
    #[cfg(not(feature = "mutants"))]
    let mutant = None;
    let path = args.bounds.as_path();
    let settings = fuzz_run::Settings {
        bounds: path.display().to_string(),
        cases: args.cases,
        seed: args.seed,
        shrink: args.shrink,
        mutant,
        shard: args.shard,
    };
    let outputs = Outputs::reserve([("--json", args.json)])?;
    outputs.refuse_inputs(std::slice::from_ref(&args.bounds))?;
    let bounds = Bounds::load(path).map_err(|e| fail(BAD_SCENARIO, &e))?;
    let bar = progress(u64::from(settings.cases), "cases");
    let started = Instant::now();
    let run = fuzz_run::run(&bounds, &settings, || bar.inc(1));
    bar.finish_and_clear();
    let wall = started.elapsed().as_secs_f64();
    // How fast is the machine's, not the search's: on stderr, so that the
    // text on stdout is the same on every machine and for merged shards.
    eprintln!(
        "fuzz: {} simulations in {wall:.1} s ({:.0} per minute)",
        run.simulations,
        run.simulations as f64 / wall.max(1e-9) * 60.0
    );
    finish_fuzz(&run, &args.out, outputs)
}

/// Prints a fuzz run (whole, a shard, or merged shards), writes its failing
/// case into `out` and its `--json`, and gives its exit code: 0 no case
/// failed, 1 one did, 3 the search stopped.
pub fn finish_fuzz(run: &fuzz_run::FuzzRun, out: &Path, mut outputs: Outputs) -> Outcome {
    print!("{}", run.render());
    match &run.outcome {
        fuzz_run::FuzzOutcome::Failed { regression, .. } => match fuzz::write(out, regression) {
            Ok(written) => println!(
                "smallest failing case: {}\nreplay: redstring-sim run {}",
                written.display(),
                redstring_sim::judgement::shell_word(&written.display().to_string())
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
    outputs.write("--json", || serde_json::to_string_pretty(run).unwrap_or_default())?;
    outputs.commit()?;
    match run.outcome {
        fuzz_run::FuzzOutcome::Passed => Ok(ExitCode::SUCCESS),
        fuzz_run::FuzzOutcome::Failed { .. } => Ok(ExitCode::from(INVARIANT_FAILED)),
        fuzz_run::FuzzOutcome::Aborted { .. } => Err(ExitCode::from(SIM_FAILED)),
    }
}
