//! `merge`: the `--json` of every shard of one sweep, comparison, tune round
//! or fuzz run joined, printed and written as one machine would have.

use std::path::PathBuf;
use std::process::ExitCode;

use redstring_sim::merge::{Merged, merge as join};
use redstring_sim::search::tune_shard;

use crate::fuzz::finish_fuzz;
use crate::shared::{BAD_SCENARIO, Outcome, Outputs, fail, loads, verdict};
use crate::tune::finish_tune;

/// The arguments of `merge`.
#[derive(clap::Args)]
pub struct MergeArgs {
    /// Each shard's `--json` file.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Write the joined JSON here (as the unsharded command would).
    #[arg(long)]
    json: Option<PathBuf>,
    /// For a fuzz run: where its failing case is written (as `fuzz --out`).
    #[arg(long, default_value = "scenarios/regressions")]
    out: PathBuf,
}

/// Runs `merge`: its exit code is the unsharded command's.
pub fn merge(args: MergeArgs) -> Outcome {
    let mut outputs = Outputs::reserve([("--json", args.json)])?;
    outputs.refuse_inputs(&args.files)?;
    let mut texts = Vec::new();
    for f in &args.files {
        let text = redstring_sim::scenario::input::read_text(f)
            .map_err(|e| fail(BAD_SCENARIO, &format!("cannot read {}: {e}", f.display())))?;
        texts.push((f.display().to_string(), text));
    }
    let merged = join(&texts).map_err(|e| fail(BAD_SCENARIO, &e))?;
    match &merged {
        Merged::Fuzz(run) => return finish_fuzz(run, &args.out, outputs),
        Merged::Tune(tune_shard::Joined::Done { tuning, dims, scenario }) => {
            print!("{}", loads(scenario));
            return finish_tune(tuning, dims, outputs);
        }
        Merged::Tune(tune_shard::Joined::Next(_)) if !outputs.has("--json") => {
            eprintln!(
                "error: the tune has rungs left: give --json STATE to write the state the next round resumes from"
            );
            return Err(ExitCode::from(BAD_SCENARIO));
        }
        _ => {}
    }
    print!("{}", merged.render());
    outputs.write("--json", || merged.to_json())?;
    outputs.commit()?;
    let (failed, missed) = merged.verdict();
    Ok(verdict(failed, missed))
}
