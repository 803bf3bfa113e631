//! `mutants`: show that the invariants catch every known-bad variant of the
//! hardening, and that the correct hardening passes the same budget.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use redstring_sim::search::coverage::Coverage;
use redstring_sim::search::fuzz::Bounds;
use redstring_sim::search::mutants::Mutant;

use crate::shared::{BAD_SCENARIO, INVARIANT_FAILED, IO_FAILED, Outcome, SIM_FAILED, fail, names, progress};

/// The arguments of `mutants`.
#[derive(clap::Args)]
pub struct MutantsArgs {
    /// Fuzz cases per variant after its targeted scenario passed.
    #[arg(long, default_value_t = 16)]
    cases: u32,
    /// The search's seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The bounds file the fuzzer draws from.
    #[arg(long, default_value = "scenarios/bounds/default.toml")]
    bounds: PathBuf,
    /// The scenarios directory (the targeted scenarios are in its `mutants/`
    /// and `conformance/`, and one is a shipped scenario).
    #[arg(long, default_value = "scenarios")]
    scenarios: PathBuf,
    /// Where the cases the fuzzer caught a variant with are written
    /// (copy one into `scenarios/regressions/mutants/` to keep it).
    #[arg(long, default_value = "target/mutants")]
    out: PathBuf,
    /// Only these variants (by name; default all).
    #[arg(long = "only", value_parser = parse_mutant)]
    only: Vec<Mutant>,
    /// Skip the targeted scenarios: measure what the fuzzer alone catches.
    #[arg(long)]
    fuzz_only: bool,
}

/// Parses a variant's name, listing the catalogue when it is unknown.
pub fn parse_mutant(name: &str) -> Result<Mutant, String> {
    Mutant::parse(name).ok_or_else(|| {
        let names: Vec<&str> = Mutant::ALL.iter().map(|m| m.name()).collect();
        format!("no mutant named {name:?}; the catalogue has: {}", names.join(", "))
    })
}

/// Runs `mutants`.
pub fn run(args: MutantsArgs) -> Outcome {
    mutants(&args, &args.bounds, &args.scenarios, &args.out, &args.only)
}

/// `mutants`: every variant hunted, the correct hardening on the same
/// budget, one table, and what the searches exercised. Exit 0 when every
/// variant was caught by the invariant that names it and the correct
/// hardening passed; 1 otherwise.
fn mutants(run: &MutantsArgs, bounds: &Path, scenarios: &Path, out: &Path, only: &[Mutant]) -> Outcome {
    use redstring_sim::search::mutants::{self, Budget, CATALOGUE, Stage};

    let (cases, seed, fuzz_only) = (run.cases, run.seed, run.fuzz_only);
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
            (Some(Stage::Targeted), _) => scenarios.join(v.scenario).display().to_string(),
            (Some(Stage::Fuzzed(_)), Some(case)) => match mutants::write_case(out, v.mutant, case) {
                Ok(p) => p.display().to_string(),
                Err(e) => return Err(fail(IO_FAILED, &format!("cannot write {}: {e}", out.display()))),
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
        "{:<25} {:<20} {:<36} {:<10} {:>5} {:>10}  case",
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
            "{:<25} {:<20} {:<36} {:<10} {:>5} {:>8.0} s  {written}{}",
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
