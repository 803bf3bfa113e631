//! `lab`: a scenario run for real against real `llama-server` processes,
//! then predicted against measured.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use redstring_sim::campaign::{parallel_map, seed_record};
use redstring_sim::evidence::episodes;
use redstring_sim::evidence::trace::Trace;
use redstring_sim::judgement::report::Report;
use redstring_sim::judgement::sweep::SeedRecord;
use redstring_sim::lab::fidelity;
use redstring_sim::lab::llama::Tools;
use redstring_sim::lab::run::{self as lab_run, Calibrated, calibrated, unsupported};
use redstring_sim::scenario::Scenario;

use crate::shared::{BAD_SCENARIO, Outcome, Outputs, SIM_FAILED, fail, inputs_of, jobs_or_cores, load, progress};

/// The most repetitions one `lab` runs.
const MAX_REPEAT: u64 = 100;

/// The arguments of `lab`.
#[derive(clap::Args)]
pub struct LabArgs {
    /// The scenario file (servers of kind `llama_cpp`; faults crash,
    /// restart and burst).
    scenario: PathBuf,
    /// Times the scenario runs for real, each a repetition with its own
    /// arrivals (seeds 1, 2, …).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=MAX_REPEAT))]
    repeat: u64,
    /// Seeds the calibrated scenario is simulated over for the prediction:
    /// seed `k` under the calibration taken before repetition `k`, the
    /// seeds past the last repetition under each calibration in turn.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    seeds: u64,
    /// Simulate the scenario as written instead of calibrating its servers
    /// before each repetition (the prediction then tests its server
    /// model's speed too).
    #[arg(long)]
    no_calibrate: bool,
    /// Simulations run at once (default: every core).
    #[arg(long)]
    jobs: Option<usize>,
    /// Write the predicted-against-measured rows as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write each repetition's trace, as `run --trace` writes a
    /// simulation's, to this path with the repetition's number before its
    /// extension (`real.jsonl`: `real-1.jsonl`, `real-2.jsonl`, …).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Write the scenario each calibration predicted with, its servers'
    /// fitted numbers in place, to this path with the repetition's number
    /// before its extension (`calibrated.toml`: `calibrated-1.toml`, …):
    /// `run calibrated-2.toml --seed 2` simulates what repetition 2 ran.
    #[arg(long, conflicts_with = "no_calibrate")]
    calibrated: Option<PathBuf>,
}

/// Prints what calibrating each server found.
fn show_calibration(found: &[Calibrated]) {
    for c in found {
        let s = c.fit.step;
        let paced = match c.generation_ms_per_token {
            Some(ms) if c.step != s => format!(
                ", generating at {ms:.2} ms a token alone: predicted with {:.3}·B",
                c.step.decode_per_sequence_ms
            ),
            Some(ms) => format!(", generating at {ms:.2} ms a token alone"),
            None => String::new(),
        };
        println!(
            "   calibrated {}: step {:.3} + {:.4}·T ms prefill, {:.3} + {:.3}·B + {:.5}·C ms decode (fit within {:.1} % on average{}); load {:.2} s ({:.2}–{:.2} over {} restarts); the workers' request {} prompt ({} cached) + {} output tokens{paced}",
            c.server,
            s.prefill_base_ms,
            s.prefill_per_token_ms,
            s.decode_base_ms,
            s.decode_per_sequence_ms,
            s.decode_per_context_token_ms,
            c.fit.mean_error * 100.0,
            if c.measurements > 1 {
                format!(", the best of {} measurements", c.measurements)
            } else {
                String::new()
            },
            c.reload_s,
            c.reload_range.0,
            c.reload_range.1,
            lab_run::RESTARTS,
            c.tokens.0,
            c.cached_tokens,
            c.tokens.1
        );
    }
}

/// Prints how fast each server generated its answers to requests alone
/// in a repetition, beside the pace its calibration measured alone: a
/// prediction that misses while the two differ missed the machine's
/// speed, not the model.
fn show_paces(paces: &std::collections::BTreeMap<String, Vec<f64>>, found: &[Calibrated]) {
    for (server, ms) in paces {
        let mut sorted = ms.clone();
        sorted.sort_by(f64::total_cmp);
        let Some(&median) = sorted.get(sorted.len() / 2) else {
            continue;
        };
        let alone = found
            .iter()
            .find(|c| c.server == *server)
            .and_then(|c| c.generation_ms_per_token)
            .map(|a| format!("; calibrated alone at {a:.2} ({:+.0} %)", (median / a - 1.0) * 100.0))
            .unwrap_or_default();
        println!(
            "   {server} generated at a median {median:.2} ms a token in its {} answers to a request alone{alone}",
            ms.len()
        );
    }
}

/// `path` with `-repetition` before its extension.
fn numbered(path: &Path, repetition: u64) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}-{repetition}.{}", ext.to_string_lossy()),
        None => format!("{stem}-{repetition}"),
    };
    path.with_file_name(name)
}

/// Runs `lab`.
pub fn lab(args: LabArgs) -> Outcome {
    let path = args.scenario.as_path();
    let traces = (1..=args.repeat).map(|k| ("--trace", args.trace.as_deref().map(|p| numbered(p, k))));
    let calibrations = (1..=args.repeat).map(|k| ("--calibrated", args.calibrated.as_deref().map(|p| numbered(p, k))));
    let mut outputs = Outputs::reserve(
        std::iter::once(("--json", args.json.clone()))
            .chain(traces)
            .chain(calibrations),
    )?;
    let scenario = load(path, false)?;
    outputs.refuse_inputs(&inputs_of(path, &scenario))?;
    if let Some((field, problem)) = unsupported(&scenario) {
        return Err(fail(
            BAD_SCENARIO,
            &format!("{}: field `{field}` {problem}", path.display()),
        ));
    }
    let tools = Tools::find().map_err(|e| fail(BAD_SCENARIO, &e))?;
    let shown = path.display().to_string();
    println!(
        "== lab {shown}: {} repetition(s) of {} s for real, the prediction over {} simulated seeds",
        args.repeat, scenario.duration_s, args.seeds
    );
    // One prediction for each repetition, its servers calibrated just
    // before it ran: the machine's speed drifts within minutes.
    let mut predictions: Vec<Scenario> = Vec::new();
    let mut measured: Vec<SeedRecord> = Vec::new();
    for repetition in 1..=args.repeat {
        let mut found = Vec::new();
        if !args.no_calibrate {
            let predicted;
            (predicted, found) = calibrated(&scenario, &tools).map_err(|e| fail(SIM_FAILED, &e))?;
            println!("\n-- calibration {repetition}, before repetition {repetition}");
            show_calibration(&found);
            outputs.write("--calibrated", || predicted.to_toml())?;
            predictions.push(predicted);
        }
        let start = Instant::now();
        let ran = lab_run::run(&scenario, &tools, repetition).map_err(|e| fail(SIM_FAILED, &e))?;
        let run = redstring_sim::judgement::judge(&scenario, ran.evidence);
        outputs.write("--trace", || {
            Trace::to_json_lines(&episodes::with_ready_marks(&scenario, &run.events))
        })?;
        let mut report = Report::new(&scenario, &shown, &run);
        // A real run cannot be replayed; the simulation of its arrivals can.
        report.replay = format!("{} (its arrivals, simulated)", report.replay);
        println!("\n-- repetition {repetition}, run for real");
        print!("{}", report.render(Some(start.elapsed())));
        show_paces(&ran.generation_ms_per_token, &found);
        measured.push(SeedRecord::of(&report));
    }
    if predictions.is_empty() {
        predictions.push(scenario.clone());
    }
    let seeds: Vec<u64> = (1..=args.seeds).collect();
    let bar = progress(seeds.len() as u64, "seeds");
    let simulated = parallel_map(&seeds, jobs_or_cores(args.jobs), |&seed| {
        let under = predictions
            .get(fidelity::calibration_of(seed, predictions.len()))
            .unwrap_or(&scenario);
        let record = seed_record(under, &shown, seed);
        bar.inc(1);
        record
    });
    bar.finish();
    let rows = fidelity::compare(&simulated, &measured);
    println!(
        "\n== predicted ({} simulated seeds{}) against measured ({} repetitions for real)",
        args.seeds,
        if args.no_calibrate {
            ""
        } else {
            ", seed k under calibration k, the rest in turn"
        },
        args.repeat
    );
    print!("{}", fidelity::render(&rows));
    outputs.write("--json", || serde_json::to_string_pretty(&rows).unwrap_or_default())?;
    outputs.commit()?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repetition_s_trace_is_named_by_its_number() {
        assert_eq!(
            numbered(Path::new("out/real.jsonl"), 3),
            PathBuf::from("out/real-3.jsonl")
        );
        assert_eq!(numbered(Path::new("real"), 1), PathBuf::from("real-1"));
        assert_eq!(numbered(Path::new("a.b.jsonl"), 12), PathBuf::from("a.b-12.jsonl"));
    }
}
