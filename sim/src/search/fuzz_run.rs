//! A fuzz run as data, so that its cases can be split over several machines
//! and joined into the result one machine would have printed.
//!
//! `redstring-sim fuzz` draws `--cases` scenarios from a proptest runner
//! seeded by `--seed`, stops at the first case that breaks a claimed
//! invariant and shrinks it. Two facts make that splittable:
//!
//! - **Drawing does not depend on testing.** Case `k` is drawn from the
//!   runner's random stream after cases `1..k` were drawn, whatever their
//!   tests did (proptest draws a new case only after the previous one
//!   passed; a test never touches the stream). So every shard draws every
//!   case, cheaply, and simulates only its own: case `k` belongs to shard
//!   `i` of `n` when `(k − 1) mod n = i − 1` ([`Shard::owns`]).
//! - **Shrinking depends on the failing case alone.** Proptest shrinks the
//!   failing case's own value tree, calling the test on each simpler
//!   candidate; the simulations are deterministic, so the shard that owns
//!   the case shrinks it to what an unsharded run does.
//!
//! The rule: a shard simulates its cases in order and stops at *its* first
//! failure, which it shrinks (it cannot know whether another shard failed
//! earlier). An unsharded run stops at the first failing case `F` overall;
//! `F` is the first failure of the shard that owns it, and every other
//! shard's first failure comes after `F` (or never). So [`merge`] keeps the
//! earliest stop among the shards — `F`, shrunk as one machine shrinks it —
//! and every case record up to it, and drops what shards ran beyond it.
//! Each case's record carries what its simulations added to the tallies
//! (cases tried by layout and fault, the coverage of the hardening's paths,
//! the simulations themselves, the shrinking's included), so the sums are
//! those of the unsharded run. An abort (proptest could not draw case `k`)
//! is a stop at `k` that every shard reaching `k` meets alike.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};
use serde::{Deserialize, Serialize};

use crate::judgement::report;
use crate::judgement::shard::{Shard, ShardError};
use crate::scenario::CacheKind;
use crate::search::coverage::Coverage;
use crate::search::fuzz::{self, Bounds, Regression, regression};

/// What one case's simulations (its shrinking's included) added to a run's
/// tallies.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CaseRecord {
    /// The case, from 1, in the order the runner drew them.
    pub case: u32,
    /// Simulations run for it: 1, or 1 plus the shrinking's.
    pub simulations: u64,
    /// Simulations by cache layout and by fault kind (a simulation counts
    /// once per fault of that kind).
    pub tried: BTreeMap<String, u64>,
    /// Paths of the hardening its simulations reached, as
    /// [`Coverage::tally`] gives them.
    pub coverage: BTreeMap<String, u64>,
}

/// How a fuzz run (or one shard of it) ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum FuzzOutcome {
    /// No case broke a claimed invariant.
    Passed,
    /// A case broke one; it was shrunk to `regression`.
    Failed {
        /// The failing case (from 1).
        case: u32,
        /// What the smallest failing case broke, and its report.
        reason: String,
        /// The smallest failing case.
        regression: Regression,
    },
    /// The runner could not draw a case.
    Aborted {
        /// The case it could not draw (from 1).
        case: u32,
        /// Why.
        reason: String,
    },
}

impl FuzzOutcome {
    /// The case the run stopped at (`None`: it ran every case).
    pub fn stop(&self) -> Option<u32> {
        match self {
            FuzzOutcome::Passed => None,
            FuzzOutcome::Failed { case, .. } | FuzzOutcome::Aborted { case, .. } => Some(*case),
        }
    }
}

/// What `fuzz --json` writes, and what `merge` joins.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FuzzRun {
    /// Always `"fuzz"`: what `merge` reads this as.
    pub command: &'static str,
    /// The bounds file, as given.
    pub bounds: String,
    /// The search's seed.
    pub seed: u64,
    /// Cases asked for.
    pub cases: u32,
    /// Most shrinking steps.
    pub shrink: u32,
    /// The known-bad variant injected (absent: the real hardening).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mutant: Option<String>,
    /// Which shard of the cases this is (null: all of them).
    pub shard: Option<Shard>,
    /// Simulations run, shrinking included.
    pub simulations: u64,
    /// Simulations by cache layout and by fault kind.
    pub tried: BTreeMap<String, u64>,
    /// Every path of the hardening reached, as [`Coverage::tally`] gives it.
    pub coverage: BTreeMap<String, u64>,
    /// How it ended.
    pub outcome: FuzzOutcome,
    /// Per case this file simulated, in case order: what the tallies above
    /// are the sums of.
    pub per_case: Vec<CaseRecord>,
}

/// What a fuzz run is asked to do.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// The bounds file, as shown.
    pub bounds: String,
    /// Cases to draw.
    pub cases: u32,
    /// The search's seed.
    pub seed: u64,
    /// Most shrinking steps.
    pub shrink: u32,
    /// The known-bad variant injected, by name, for the record (the caller
    /// injects it).
    pub mutant: Option<String>,
    /// Which shard of the cases to simulate (`None`: all).
    pub shard: Option<Shard>,
}

impl FuzzRun {
    /// The run made of `per_case` (in case order) and its `outcome`; the
    /// tallies are their sums.
    fn of(settings: &Settings, outcome: FuzzOutcome, per_case: Vec<CaseRecord>) -> FuzzRun {
        let add = |into: &mut BTreeMap<String, u64>, from: &BTreeMap<String, u64>| {
            for (k, n) in from {
                let t = into.entry(k.clone()).or_default();
                *t = t.saturating_add(*n);
            }
        };
        let (mut tried, mut coverage) = (BTreeMap::new(), BTreeMap::new());
        let mut simulations = 0u64;
        for r in &per_case {
            simulations = simulations.saturating_add(r.simulations);
            add(&mut tried, &r.tried);
            add(&mut coverage, &r.coverage);
        }
        FuzzRun {
            command: "fuzz",
            bounds: settings.bounds.clone(),
            seed: settings.seed,
            cases: settings.cases,
            shrink: settings.shrink,
            mutant: settings.mutant.clone(),
            shard: settings.shard,
            simulations,
            tried,
            coverage,
            outcome,
            per_case,
        }
    }

    /// The coverage of every simulation.
    pub fn coverage(&self) -> Coverage {
        let mut c = Coverage::new();
        // Every key was made by `Coverage::tally` (`merge` refuses a file
        // with any other): each parses.
        let _ = c.add_tally(self.simulations, &self.coverage);
        c
    }

    /// The text `fuzz` prints, up to its verdict line (where a failing case
    /// was written is the caller's to add).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let shard = self
            .shard
            .map_or(String::new(), |s| format!(", shard {}/{}", s.index, s.count));
        let mutant = self.mutant.as_ref().map_or(String::new(), |m| format!(", mutant {m}"));
        let _ = writeln!(
            out,
            "fuzz {}: {} simulations, seed {}{shard}{mutant}",
            self.bounds, self.simulations, self.seed
        );
        for (what, n) in &self.tried {
            let _ = writeln!(out, "  {what:<28} {n}");
        }
        let _ = write!(
            out,
            "exercised (every simulation, shrinking included):\n{}",
            self.coverage()
        );
        match (&self.outcome, self.shard) {
            (FuzzOutcome::Passed, None) => {
                let _ = writeln!(out, "no case broke a claimed invariant in {} cases", self.cases);
            }
            (FuzzOutcome::Passed, Some(s)) => {
                let _ = writeln!(
                    out,
                    "no case of shard {}/{} broke a claimed invariant ({} of the {} cases)",
                    s.index,
                    s.count,
                    self.per_case.len(),
                    self.cases
                );
            }
            (FuzzOutcome::Failed { case, reason, .. }, _) => {
                let _ = writeln!(out, "FAILED (case {case} of {}): {reason}", self.cases);
            }
            (FuzzOutcome::Aborted { .. }, _) => {}
        }
        out
    }
}

/// Where the run is: the cases begun, whether the current one failed (so
/// every later call is a shrinking step of it), the records so far.
#[derive(Default)]
struct State {
    begun: u32,
    shrinking: bool,
    records: Vec<CaseRecord>,
}

/// Runs the search of `settings` over `bounds`, simulating only the cases
/// of `settings.shard`; `progress` is called once per case drawn.
pub fn run(bounds: &Bounds, settings: &Settings, progress: impl Fn()) -> FuzzRun {
    let mut runner = TestRunner::new(Config {
        cases: settings.cases,
        rng_seed: RngSeed::Fixed(settings.seed),
        failure_persistence: None,
        max_shrink_iters: settings.shrink,
        // No wall-clock limit: where shrinking stops must not depend on
        // the machine.
        max_shrink_time: 0,
        timeout: 0,
        ..Config::default()
    });
    let state = RefCell::new(State::default());
    let result = runner.run(&fuzz::scenarios(bounds), |scenario| {
        let mut st = state.borrow_mut();
        if !st.shrinking {
            st.begun += 1;
            progress();
            if settings.shard.is_some_and(|s| !s.owns(u64::from(st.begun - 1))) {
                return Ok(());
            }
            let case = st.begun;
            st.records.push(CaseRecord {
                case,
                ..CaseRecord::default()
            });
        }
        let Some(record) = st.records.last_mut() else {
            return Ok(());
        };
        record.simulations += 1;
        let layout = match scenario.cache.kind {
            CacheKind::PerWorker => "cache per worker".to_owned(),
            CacheKind::Shared => format!("cache shared, {}", report::stamped_by(scenario.cache.time_source)),
        };
        *record.tried.entry(layout).or_default() += 1;
        if let Some(routing) = scenario.hardening.routing {
            *record.tried.entry(format!("routing {}", routing.name())).or_default() += 1;
        }
        for f in &scenario.faults {
            *record.tried.entry(format!("fault {}", f.kind())).or_default() += 1;
        }
        let mut coverage = Coverage::new();
        let result = fuzz::check_case_covered(&scenario, &mut coverage);
        for (k, n) in coverage.tally() {
            *record.coverage.entry(k).or_default() += n;
        }
        if result.is_err() {
            st.shrinking = true;
        }
        result.map_err(TestCaseError::fail)
    });
    let State { begun, records, .. } = state.into_inner();
    let outcome = match result {
        Ok(()) => FuzzOutcome::Passed,
        Err(TestError::Fail(reason, minimal)) => FuzzOutcome::Failed {
            case: begun,
            reason: reason.to_string(),
            regression: regression(&minimal),
        },
        // Proptest could not draw the next case.
        Err(TestError::Abort(reason)) => FuzzOutcome::Aborted {
            case: begun + 1,
            reason: reason.to_string(),
        },
    };
    FuzzRun::of(settings, outcome, records)
}

/// A shard's `--json`, as `merge` reads it.
#[derive(Deserialize)]
struct FuzzFile {
    bounds: String,
    seed: u64,
    cases: u32,
    shrink: u32,
    #[serde(default)]
    mutant: Option<String>,
    shard: Option<Shard>,
    outcome: FuzzOutcome,
    per_case: Vec<CaseRecord>,
}

/// Joins the shards' `--json` (`(file, text)` each; [`crate::merge::merge`]
/// has checked they are the `n` shards of one command) into the unsharded
/// run: the earliest stop, and every case record up to it.
pub fn merge(files: &[(String, String)]) -> Result<FuzzRun, ShardError> {
    let mismatch = |file: &str, why: String| ShardError::Mismatch {
        file: file.to_owned(),
        why,
    };
    let mut parsed = Vec::new();
    for (file, text) in files {
        let f: FuzzFile = serde_json::from_str(text).map_err(|e| ShardError::NotAShard {
            file: file.clone(),
            why: e.to_string(),
        })?;
        parsed.push((file.as_str(), f));
    }
    let Some((first_file, first)) = parsed.first() else {
        return Err(ShardError::Nothing);
    };
    let key = |f: &FuzzFile| (f.bounds.clone(), f.seed, f.cases, f.shrink, f.mutant.clone());
    let want = key(first);
    for (file, f) in &parsed {
        if key(f) != want {
            return Err(mismatch(
                file,
                format!(
                    "{} seed {} cases {} shrink {} mutant {:?}, the first file's {} seed {} cases {} shrink {} mutant {:?}",
                    f.bounds, f.seed, f.cases, f.shrink, f.mutant, want.0, want.1, want.2, want.3, want.4
                ),
            ));
        }
    }
    // A failing case's file is written where `merge --out` says: its name
    // must be one `fuzz` gives, not a path.
    for (file, f) in &parsed {
        if let FuzzOutcome::Failed { regression, .. } = &f.outcome
            && !is_regression_name(&regression.file_name)
        {
            return Err(mismatch(
                file,
                format!("{:?} is not a regression file's name", regression.file_name),
            ));
        }
    }
    // The earliest stop: an unsharded run's.
    let mut outcome = FuzzOutcome::Passed;
    for (file, f) in &parsed {
        match (f.outcome.stop(), outcome.stop()) {
            (Some(a), Some(b)) if a == b && f.outcome != outcome => {
                return Err(mismatch(
                    file,
                    format!("a different outcome at case {a} than another shard's"),
                ));
            }
            (Some(a), b) if b.is_none_or(|b| a < b) => outcome = f.outcome.clone(),
            _ => {}
        }
    }
    let last = match &outcome {
        FuzzOutcome::Passed => first.cases,
        FuzzOutcome::Failed { case, .. } => *case,
        FuzzOutcome::Aborted { case, .. } => case.saturating_sub(1),
    };
    let mut records = Vec::new();
    for (file, f) in &parsed {
        let shard = f.shard.unwrap_or(Shard { index: 1, count: 1 });
        for r in &f.per_case {
            if r.case == 0 || !shard.owns(u64::from(r.case - 1)) {
                return Err(mismatch(
                    file,
                    format!("case {} is not one of shard {}/{}'s", r.case, shard.index, shard.count),
                ));
            }
            Coverage::new()
                .add_tally(r.simulations, &r.coverage)
                .map_err(|why| ShardError::NotAShard {
                    file: file.to_string(),
                    why: format!("case {}: {why}", r.case),
                })?;
            if r.case <= last {
                records.push(r.clone());
            }
        }
    }
    records.sort_by_key(|r| r.case);
    if !records.iter().map(|r| r.case).eq(1..=last) {
        return Err(mismatch(
            first_file,
            format!("the shards' cases are not each of 1..={last} once"),
        ));
    }
    let settings = Settings {
        bounds: first.bounds.clone(),
        cases: first.cases,
        seed: first.seed,
        shrink: first.shrink,
        mutant: first.mutant.clone(),
        shard: None,
    };
    Ok(FuzzRun::of(&settings, outcome, records))
}

/// Whether `name` is `regression-` and 16 hex digits, `.toml`: the name
/// [`regression`] gives.
fn is_regression_name(name: &str) -> bool {
    name.strip_prefix("regression-")
        .and_then(|n| n.strip_suffix(".toml"))
        .is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(shard: Option<Shard>) -> Settings {
        Settings {
            bounds: "b.toml".into(),
            cases: 8,
            seed: 3,
            shrink: 16,
            mutant: None,
            shard,
        }
    }

    /// Case `k`'s record: `k` simulations (a failing case's shrinking
    /// included), one crash each, and `k` breaker openings.
    fn record(case: u32) -> CaseRecord {
        let n = u64::from(case);
        CaseRecord {
            case,
            simulations: n,
            tried: [("fault crash".to_owned(), n)].into(),
            coverage: [("breaker: closed → open".to_owned(), n)].into(),
        }
    }

    fn failed(case: u32) -> FuzzOutcome {
        FuzzOutcome::Failed {
            case,
            reason: format!("invariants failed at {case}"),
            regression: Regression {
                file_name: format!("regression-{case:016x}.toml"),
                toml: String::new(),
            },
        }
    }

    fn file(name: &str, shard: Option<Shard>, outcome: FuzzOutcome, cases: &[u32]) -> (String, String) {
        let run = FuzzRun::of(&settings(shard), outcome, cases.iter().map(|&c| record(c)).collect());
        (name.to_owned(), serde_json::to_string(&run).unwrap())
    }

    fn half(i: u64) -> Option<Shard> {
        Some(Shard { index: i, count: 2 })
    }

    #[test]
    fn the_merge_keeps_the_earliest_failure_and_drops_what_shards_ran_beyond_it() {
        // The whole run fails at case 5; shard 1 (odd cases) stops there,
        // shard 2 (even cases) ran on to its own failure at 8.
        let whole = FuzzRun::of(&settings(None), failed(5), (1..=5).map(record).collect());
        let one = file("a.json", half(1), failed(5), &[1, 3, 5]);
        let two = file("b.json", half(2), failed(8), &[2, 4, 6, 8]);
        let merged = merge(&[two, one]).unwrap();
        assert_eq!(merged, whole);
        assert_eq!(
            serde_json::to_string_pretty(&merged).unwrap(),
            serde_json::to_string_pretty(&whole).unwrap()
        );
        assert_eq!(merged.render(), whole.render());
        // 1 + 2 + 3 + 4 + 5 simulations, case 6's and 8's left out.
        assert_eq!(merged.simulations, 15);
        assert_eq!(merged.tried["fault crash"], 15);
        assert!(merged.render().contains("closed → open 15"), "{}", merged.render());
        assert!(merged.render().contains("FAILED (case 5 of 8): invariants failed at 5"));
    }

    #[test]
    fn shards_that_all_pass_merge_into_every_case() {
        let whole = FuzzRun::of(&settings(None), FuzzOutcome::Passed, (1..=8).map(record).collect());
        let one = file("a.json", half(1), FuzzOutcome::Passed, &[1, 3, 5, 7]);
        let two = file("b.json", half(2), FuzzOutcome::Passed, &[2, 4, 6, 8]);
        assert_eq!(merge(&[one, two]).unwrap(), whole);
        assert!(
            whole
                .render()
                .ends_with("no case broke a claimed invariant in 8 cases\n")
        );
    }

    #[test]
    fn an_abort_stops_the_merge_before_the_case_it_could_not_draw() {
        let abort = FuzzOutcome::Aborted {
            case: 4,
            reason: "too many rejects".into(),
        };
        let one = file("a.json", half(1), abort.clone(), &[1, 3]);
        let two = file("b.json", half(2), abort.clone(), &[2]);
        let merged = merge(&[one, two]).unwrap();
        assert_eq!(merged.outcome, abort);
        assert_eq!(merged.per_case.iter().map(|r| r.case).collect::<Vec<_>>(), [1, 2, 3]);
    }

    #[test]
    fn a_missing_case_a_foreign_case_or_another_search_is_refused() {
        // Shard 2 lacks case 4, before the stop.
        let one = file("a.json", half(1), failed(5), &[1, 3, 5]);
        let two = file("b.json", half(2), FuzzOutcome::Passed, &[2, 6, 8]);
        assert!(matches!(
            merge(&[one.clone(), two]),
            Err(ShardError::Mismatch { why, .. }) if why.contains("not each of 1..=5")
        ));
        // Shard 2 claims case 3, which is shard 1's.
        let two = file("b.json", half(2), FuzzOutcome::Passed, &[2, 3, 4]);
        assert!(matches!(
            merge(&[one.clone(), two]),
            Err(ShardError::Mismatch { file, why }) if file == "b.json" && why.contains("case 3")
        ));
        // Another seed.
        let mut other = settings(half(2));
        other.seed = 4;
        let run = FuzzRun::of(&other, FuzzOutcome::Passed, vec![record(2)]);
        let two = ("b.json".to_owned(), serde_json::to_string(&run).unwrap());
        assert!(matches!(
            merge(&[one.clone(), two]),
            Err(ShardError::Mismatch { why, .. }) if why.contains("seed 4")
        ));
        // A failing case named as a path.
        let mut forged: serde_json::Value = serde_json::from_str(&one.1).unwrap();
        forged["outcome"]["regression"]["file_name"] = "../../etc/x.toml".into();
        let forged = ("a.json".to_owned(), forged.to_string());
        let two = file("b.json", half(2), FuzzOutcome::Passed, &[2, 4, 6, 8]);
        assert!(matches!(
            merge(&[forged, two]),
            Err(ShardError::Mismatch { why, .. }) if why.contains("not a regression file's name")
        ));
        // A forged coverage key.
        let mut forged: serde_json::Value = serde_json::from_str(&one.1).unwrap();
        forged["per_case"][0]["coverage"] = serde_json::json!({"warp: drive": 1});
        let forged = ("a.json".to_owned(), forged.to_string());
        let two = file("b.json", half(2), FuzzOutcome::Passed, &[2, 4, 6, 8]);
        assert!(matches!(
            merge(&[forged, two]),
            Err(ShardError::NotAShard { why, .. }) if why.contains("warp: drive")
        ));
    }
}
