//! `compare`: several scenarios, or one with a field varied by `--set`, over
//! the same seeds, their figures side by side with the differences that hold
//! across seeds marked.
//!
//! Several `--set` vary several fields at once, as a full factorial design:
//! every combination of one value per key, the first `--set` varying
//! slowest (nested loops), at most
//! [`MAX_VARIANTS`](redstring_sim::judgement::compare::MAX_VARIANTS)
//! variants, all in one table against the first combination.

use std::path::PathBuf;
use std::process::ExitCode;

use redstring_sim::campaign::run_seeds;
use redstring_sim::judgement::{compare, plots, report, shard};
use redstring_sim::merge::Merged;
use redstring_sim::scenario::Scenario;
use redstring_sim::world::Budget;

use crate::shared::{
    BAD_SCENARIO, Outcome, Outputs, Parallel, SIM_FAILED, SeedArgs, fail, fits_memory, inputs_of, jobs_or_cores, load,
    loads, progress, verdict, warned,
};
use crate::sweep::DEFAULT_SEEDS;

/// The arguments of `compare`.
#[derive(clap::Args)]
pub struct CompareArgs {
    /// The scenario files (one, with --set).
    #[arg(required = true)]
    scenarios: Vec<PathBuf>,
    #[command(flatten)]
    seeds: SeedArgs,
    /// Vary one field of the one scenario: a dotted TOML key and its
    /// values, e.g. `hardening.failure_threshold=1,3,5`. Repeat it to vary
    /// several fields as a full factorial design: every combination of one
    /// value per key, the first --set varying slowest (like nested loops),
    /// each named by its key=value pairs joined by a space, at most 64
    /// variants; a key may be given once.
    #[arg(long, action = clap::ArgAction::Append)]
    set: Vec<String>,
    /// Write the comparison as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write an SVG of the distributions side by side here.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Refuse (exit 2) a scenario with any warning.
    #[arg(long)]
    strict: bool,
    #[command(flatten)]
    parallel: Parallel,
}

/// One variant `compare` runs: the name it is shown by, the scenario, the
/// files it was read from, and how to replay one of its seeds.
struct Variant {
    name: String,
    scenario: Scenario,
    inputs: Vec<PathBuf>,
    /// The scenario file and, for a variant of `--set`, its `key=value`
    /// pairs ([`compare::replay`]).
    replay: (String, compare::Setting),
}

/// The variants `compare` runs: each file, or the one file once per
/// combination of the `--set` values ([`compare::design`]).
fn variants(paths: &[PathBuf], sets: &[String], strict: bool) -> Result<Vec<Variant>, ExitCode> {
    let bad = |e: &dyn std::fmt::Display| fail(BAD_SCENARIO, e);
    if sets.is_empty() {
        return paths
            .iter()
            .map(|p| {
                load(p, strict).map(|s| Variant {
                    name: p.display().to_string(),
                    inputs: inputs_of(p, &s),
                    scenario: s,
                    replay: (p.display().to_string(), Vec::new()),
                })
            })
            .collect();
    }
    let [path] = paths else {
        return Err(bad(&format!("--set varies one scenario; {} were given", paths.len())));
    };
    let settings = compare::design(sets).map_err(|e| bad(&e))?;
    let file = path.display().to_string();
    let text = redstring_sim::scenario::input::read_text(path).map_err(|e| bad(&format!("cannot read {file}: {e}")))?;
    let mut out = Vec::with_capacity(settings.len());
    for setting in settings {
        let name = compare::setting_name(&setting);
        let flags = match setting.as_slice() {
            [(key, value)] => format!("--set {key}={value}"),
            _ => compare::setting_flags(&setting),
        };
        let varied = compare::apply(&text, &setting).map_err(|e| bad(&e))?;
        let keys: Vec<&str> = setting.iter().map(|(k, _)| k.as_str()).collect();
        let parsed =
            Scenario::parse_varied(&file, &text, &varied, &keys).map_err(|e| bad(&format!("with {flags}: {e}")))?;
        let scenario = warned(&format!("{file} {name}"), parsed, strict)?;
        out.push(Variant {
            name,
            inputs: inputs_of(path, &scenario),
            scenario,
            replay: (file.clone(), setting),
        });
    }
    Ok(out)
}

/// Each variant's load line: what its limiter limits and each server's
/// offered load against its capacity, so that a variant whose limiter holds
/// calls back is seen to be offered less.
fn load_lines(variants: &[Variant]) -> String {
    variants
        .iter()
        .map(|v| {
            format!(
                "{}:\n   rpm {}\n{}",
                v.name,
                report::rpm_scope(&v.scenario),
                loads(&v.scenario)
            )
        })
        .collect()
}

/// A warning for each variant whose cache changes what `hardening.rpm`
/// means against the first: per worker, a fleet of `n` workers admits up to
/// `n` times what one shared cache admits.
fn scope_warnings(variants: &[Variant]) -> Vec<String> {
    let Some((first, rest)) = variants.split_first() else {
        return Vec::new();
    };
    rest.iter()
        .filter(|v| v.scenario.cache.kind != first.scenario.cache.kind)
        .map(|v| {
            format!(
                "{} changes what hardening.rpm means against {}: {} there, {} here ({} workers); the limiter, not the server, then decides how many calls are let through — a difference in calls deferred, failed or impaired requests is the limiter's, not the hardening's; set rpm per variant so both admit the same fleet-wide load to compare the rest",
                v.name,
                first.name,
                report::rpm_scope(&first.scenario),
                report::rpm_scope(&v.scenario),
                v.scenario.fleet().len()
            )
        })
        .collect()
}

/// Runs `compare`.
pub fn compare(args: CompareArgs) -> Outcome {
    let mut outputs = Outputs::reserve([("--json", args.json), ("--svg", args.svg)])?;
    outputs.refuse_inputs(&args.scenarios)?;
    let variants = variants(&args.scenarios, &args.set, args.strict)?;
    for v in &variants {
        outputs.refuse_inputs(&v.inputs)?;
    }
    let range = args.seeds.range(DEFAULT_SEEDS)?;
    let preamble = load_lines(&variants);
    print!("{preamble}");
    for w in scope_warnings(&variants) {
        eprintln!("warning: {w}");
    }
    for v in &variants {
        Budget::DEFAULT
            .check(&v.scenario)
            .map_err(|e| fail(SIM_FAILED, &format!("{}: {e}", v.name)))?;
    }
    let jobs = jobs_or_cores(args.parallel.jobs);
    let shard = args.parallel.shard;
    let seeds = shard::seeds_of(shard, range.start, range.end);
    fits_memory(variants.iter().map(|v| &v.scenario), jobs.min(seeds.len()))?;
    let bar = progress((seeds.len() as u64).saturating_mul(variants.len() as u64), "runs");
    let mut runs = Vec::new();
    let mut failing = String::new();
    for v in &variants {
        let records = run_seeds(&v.scenario, &v.name, &seeds, jobs, || bar.inc(1));
        for r in records.iter().filter(|r| r.is_failure()) {
            let why = r.error.clone().unwrap_or_else(|| r.failed_invariants().join(", "));
            let (file, setting) = &v.replay;
            failing.push_str(&format!(
                "{} seed {}: {why}\n    replay: {}\n",
                v.name,
                r.seed,
                compare::replay(file, setting, r.seed)
            ));
        }
        runs.push(compare::Variant {
            name: v.name.clone(),
            records,
        });
    }
    bar.finish();
    // On stderr, so that the table on stdout is the same as `merge` prints.
    eprint!("{failing}");
    let mut comparison = compare::Comparison::new(range.start, range.end, shard, preamble, &runs);
    comparison.digest = Scenario::digest_all(variants.iter().map(|v| &v.scenario));
    print!("{}", comparison.render());
    outputs.write("--json", || {
        serde_json::to_string_pretty(&comparison).unwrap_or_default()
    })?;
    outputs.write("--svg", || plots::distributions(&comparison))?;
    outputs.commit()?;
    let (failed, missed) = Merged::Compare(comparison).verdict();
    Ok(verdict(failed, missed))
}
