//! Tuning: searching the hardening's numbers for the configuration that meets
//! the scenario's objectives with the most room to spare.
//!
//! A scenario's `[objectives]` say what its users need; [`crate::judgement::compare`]
//! can set a handful of hand-picked configurations side by side, but choosing
//! a recovery timeout *and* a threshold *and* a retry count by hand is a
//! search over hundreds of combinations, each judged over many seeds. This
//! module does that search, deterministically for a given seed:
//!
//! 1. **Design** ([`design`]). Each `--vary KEY=SPEC` is a dimension
//!    ([`Dim`]): integers `lo..hi`, decimals `lo..hi` (continuous) or
//!    `lo..hi:step`, or a list. When every dimension is discrete and the grid
//!    of all combinations has at most `budget` points, the whole grid is the
//!    design; otherwise `budget` candidates are drawn by a seeded Latin
//!    hypercube (each dimension's range cut into `budget` equal strata, one
//!    candidate per stratum, the strata paired at random across dimensions),
//!    duplicates dropped.
//! 2. **Successive halving** ([`tune`]). A grid is evaluated on every seed.
//!    A drawn design is evaluated on 2 seeds, the better half (at least 4
//!    candidates) kept by [`Candidate::rank`] (the order the recommendation
//!    is chosen by), the seeds doubled, and so on
//!    until the last rung runs every seed: cheap evidence weeds out the
//!    hopeless configurations, the close ones get all of it.
//! 3. **Judgement.** A candidate *meets* an objective when the objective was
//!    not missed on any seed it ran, that is when its worst seed's figure is
//!    within the target (a seed where the objective is not applicable does
//!    not count against it). Each objective's *normalised slack* is
//!    `(target − worst) / target` (a target of 0 divides by 1); the
//!    candidate's **margin** is the smallest slack (objectives not
//!    applicable on any seed left out). An invariant failure (or a
//!    simulation that failed) disqualifies the candidate and is reported
//!    with the seed: a configuration that breaks the library's promises is a
//!    bug report, not a trade-off.
//! 4. **Result.** The **Pareto front**: the last rung's candidates that no
//!    other last-rung candidate beats or ties on every objective's worst
//!    figure. The **recommendation**: the best last-rung candidate by
//!    [`Candidate::rank`] — meeting every objective on every seed, then the
//!    most (objective, seed) pairs met, then the largest margin — named as
//!    the closest when none meets every objective, with each objective no
//!    candidate meets and what bounds it. Its `[hardening]` section is
//!    written as TOML.
//!
//! Every simulation is single-threaded and builds its own world; the
//! (candidate, seed) pairs of a rung are run on `jobs` threads and gathered
//! in order, so the result is that of `jobs = 1`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use rand::Rng as _;
use rand::SeedableRng as _;
use rand::seq::SliceRandom as _;
use serde::{Deserialize, Serialize};

use crate::judgement::compare::{SetError, set_field};
use crate::judgement::objectives::{Judged, ObjectiveVerdict};
use crate::judgement::report::Report;
use crate::judgement::shard::Shard;
use crate::judgement::sweep::{SeedRecord, SweepSummary};
use crate::scenario::Scenario;
use crate::world::{Budget, simulate};

/// Most candidates a tune may be given (`--budget`): far beyond what a
/// machine simulates in a day, and a bound on the design's memory.
pub const MAX_BUDGET: u64 = 100_000;
/// Seeds every candidate of a drawn design runs on in the first rung.
pub const FIRST_RUNG_SEEDS: u64 = 2;
/// Successive halving never keeps fewer candidates than this (or all, if
/// fewer), so the last rung still has a front to show.
pub const MIN_KEPT: usize = 4;
/// Most values a continuous range is rounded to: decimals are kept to this
/// many places.
pub const DECIMALS: usize = 3;

/// Why a tune cannot start.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TuneError {
    /// The `--vary` argument is not `KEY=SPEC`.
    #[error(
        "--vary {arg:?}: {why}; expected KEY=lo..hi (integers), KEY=lo..hi with decimals, KEY=lo..hi:step, or KEY=v1,v2,…"
    )]
    Syntax {
        /// The argument.
        arg: String,
        /// What is wrong with it.
        why: String,
    },
    /// The same key is varied twice.
    #[error("--vary {0}: the key is varied twice")]
    Twice(String),
    /// Nothing to vary.
    #[error("tune needs at least one --vary KEY=SPEC")]
    NothingVaried,
    /// The scenario sets no objectives, so there is nothing to tune for.
    #[error(
        "{0}: the scenario has no [objectives]; tune searches for the configuration that meets them, so set at least one (see docs/objectives.md)"
    )]
    NoObjectives(String),
    /// A value of a varied key cannot be set in the scenario, or the
    /// scenario refuses it.
    #[error("--vary {key}: {value} is refused: {why}")]
    Refused {
        /// The dotted key.
        key: String,
        /// The value tried.
        value: String,
        /// The set or validation error.
        why: String,
    },
    /// `--resume` was given the state of another tune.
    #[error("--resume: the state is of another tune: {0}")]
    Resume(String),
    /// `--seeds` or `--budget` is zero.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// `--budget` is above [`MAX_BUDGET`], or the seeds run past the last
    /// 64-bit seed.
    #[error("{0}")]
    TooLarge(String),
}

/// The values one dimension takes.
#[derive(Clone, Debug, PartialEq)]
pub enum Spec {
    /// Every integer from `lo` to `hi`, both included.
    Ints {
        /// The smallest.
        lo: i64,
        /// The largest.
        hi: i64,
    },
    /// `lo`, `lo + step`, … up to `hi` (included when on a step).
    Steps {
        /// The smallest.
        lo: f64,
        /// The step.
        step: f64,
        /// How many values.
        count: u64,
        /// Decimal places to print (those of `lo` and `step`).
        decimals: usize,
    },
    /// Any value from `lo` to `hi`, rounded to [`DECIMALS`] places.
    Reals {
        /// The smallest.
        lo: f64,
        /// The largest.
        hi: f64,
    },
    /// These values, each read as TOML as `--set` reads it.
    List(Vec<String>),
}

/// One varied key: a dotted TOML key, as `compare --set` takes it, and its values.
#[derive(Clone, Debug, PartialEq)]
pub struct Dim {
    /// The dotted key (`hardening.failure_threshold`).
    pub key: String,
    /// Its values.
    pub spec: Spec,
}

/// Most values a stepped range may have (a larger one is a typo, not a design).
const MAX_LEVELS: u64 = 1_000_000;

fn decimals_of(text: &str) -> usize {
    text.split_once('.').map_or(0, |(_, d)| d.len())
}

/// `v` to `decimals` places, trailing zeros dropped but one kept after the
/// point: TOML reads `3` as an integer, and a decimal range stays a float.
fn format_decimal(v: f64, decimals: usize) -> String {
    let s = format!("{v:.decimals$}");
    match s.split_once('.') {
        None => format!("{s}.0"),
        Some((whole, frac)) => {
            let frac = frac.trim_end_matches('0');
            format!("{whole}.{}", if frac.is_empty() { "0" } else { frac })
        }
    }
}

impl Dim {
    /// Parses `KEY=SPEC`.
    pub fn parse(arg: &str) -> Result<Dim, TuneError> {
        let bad = |why: &str| TuneError::Syntax {
            arg: arg.to_owned(),
            why: why.to_owned(),
        };
        let (key, spec) = arg.split_once('=').ok_or_else(|| bad("no `=`"))?;
        let (key, spec) = (key.trim(), spec.trim());
        if key.is_empty() || key.split('.').any(str::is_empty) {
            return Err(bad("the key is empty or has an empty step"));
        }
        let spec = if let Some((lo, rest)) = spec.split_once("..") {
            let (hi, step) = match rest.split_once(':') {
                Some((hi, step)) => (hi.trim(), Some(step.trim())),
                None => (rest.trim(), None),
            };
            let lo = lo.trim();
            let integral = |t: &str| t.parse::<i64>().ok();
            match (integral(lo), integral(hi), step) {
                (Some(lo), Some(hi), None) => {
                    if lo > hi {
                        return Err(bad("lo is above hi"));
                    }
                    Spec::Ints { lo, hi }
                }
                _ => {
                    let num = |t: &str, what: &str| {
                        t.parse::<f64>()
                            .ok()
                            .filter(|v| v.is_finite())
                            .ok_or_else(|| bad(&format!("{what} {t:?} is not a finite number")))
                    };
                    let (l, h) = (num(lo, "lo")?, num(hi, "hi")?);
                    if l > h {
                        return Err(bad("lo is above hi"));
                    }
                    match step {
                        None => Spec::Reals { lo: l, hi: h },
                        Some(st) => {
                            let s = num(st, "step")?;
                            if s <= 0.0 {
                                return Err(bad("the step must be above 0"));
                            }
                            // A tolerance of a millionth of a step, so that
                            // 0.1..0.3:0.1 includes 0.3.
                            let steps = ((h - l) / s + 1e-6).floor();
                            if steps >= MAX_LEVELS as f64 {
                                return Err(bad(&format!("more than {MAX_LEVELS} values")));
                            }
                            Spec::Steps {
                                lo: l,
                                step: s,
                                count: steps as u64 + 1,
                                decimals: decimals_of(lo).max(decimals_of(st)),
                            }
                        }
                    }
                }
            }
        } else {
            let values: Vec<String> = spec.split(',').map(|v| v.trim().to_owned()).collect();
            if values.iter().any(String::is_empty) {
                return Err(bad("an empty value in the list"));
            }
            Spec::List(values)
        };
        if let Spec::Ints { lo, hi } = spec
            && hi.abs_diff(lo) >= MAX_LEVELS
        {
            return Err(bad(&format!("more than {MAX_LEVELS} values")));
        }
        Ok(Dim {
            key: key.to_owned(),
            spec,
        })
    }

    /// How many values the dimension has; `None` for a continuous range.
    pub fn levels(&self) -> Option<u64> {
        match &self.spec {
            Spec::Ints { lo, hi } => Some(hi.abs_diff(*lo) + 1),
            Spec::Steps { count, .. } => Some(*count),
            Spec::Reals { .. } => None,
            Spec::List(v) => Some(v.len() as u64),
        }
    }

    /// The `i`th value of a discrete dimension (`i < levels`).
    fn level(&self, i: u64) -> String {
        match &self.spec {
            Spec::Ints { lo, .. } => (lo + i as i64).to_string(),
            Spec::Steps { lo, step, decimals, .. } => format_decimal(lo + step * i as f64, *decimals),
            Spec::Reals { lo, .. } => format_decimal(*lo, DECIMALS),
            Spec::List(v) => v[i as usize].clone(),
        }
    }

    /// The value at `u` in `[0, 1)` of the dimension's range: the level
    /// whose equal share of `[0, 1)` holds `u`, or a continuous range's
    /// point, rounded.
    fn at(&self, u: f64) -> String {
        match (&self.spec, self.levels()) {
            (Spec::Reals { lo, hi }, _) => format_decimal(lo + (hi - lo) * u, DECIMALS),
            (_, Some(n)) => self.level(((u * n as f64) as u64).min(n - 1)),
            (_, None) => unreachable!("only a continuous range has no levels"),
        }
    }

    /// The values that bound the dimension, each checked against the
    /// scenario before any simulation: every level of a discrete one, the
    /// ends of a continuous one.
    fn checked_values(&self) -> Vec<String> {
        match (&self.spec, self.levels()) {
            (Spec::Reals { lo, hi }, _) => vec![format_decimal(*lo, DECIMALS), format_decimal(*hi, DECIMALS)],
            (_, Some(n)) if n <= 64 => (0..n).map(|i| self.level(i)).collect(),
            (_, Some(n)) => vec![self.level(0), self.level(n - 1)],
            (_, None) => Vec::new(),
        }
    }
}

/// How the candidates were chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DesignKind {
    /// Every combination.
    Grid,
    /// A seeded Latin hypercube.
    LatinHypercube,
}

/// The candidates to evaluate: per candidate, one value per dimension.
#[derive(Clone, Debug, PartialEq)]
pub struct Design {
    /// Grid or drawn.
    pub kind: DesignKind,
    /// The grid's size (`None`: a continuous dimension makes it infinite,
    /// or it does not fit in 64 bits).
    pub grid_size: Option<u64>,
    /// Per candidate, its values in `dims` order.
    pub candidates: Vec<Vec<String>>,
}

/// The design for `dims`: the grid when it has at most `budget` points,
/// else `budget` Latin-hypercube draws from `seed` (duplicates dropped).
pub fn design(dims: &[Dim], budget: u64, seed: u64) -> Design {
    let grid_size = dims
        .iter()
        .try_fold(1u64, |acc, d| d.levels().and_then(|n| acc.checked_mul(n)));
    if let Some(size) = grid_size.filter(|&s| s <= budget) {
        let mut candidates = Vec::new();
        for mut i in 0..size {
            let mut values = Vec::with_capacity(dims.len());
            // The last dimension varies fastest.
            for d in dims.iter().rev() {
                let n = d.levels().unwrap_or(1);
                values.push(d.level(i % n));
                i /= n;
            }
            values.reverse();
            candidates.push(values);
        }
        return Design {
            kind: DesignKind::Grid,
            grid_size,
            candidates,
        };
    }
    let n = usize::try_from(budget).unwrap_or(usize::MAX).max(1);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let columns: Vec<Vec<String>> = dims
        .iter()
        .map(|d| {
            let mut strata: Vec<usize> = (0..n).collect();
            strata.shuffle(&mut rng);
            strata
                .into_iter()
                .map(|s| {
                    let jitter: f64 = rng.random();
                    d.at((s as f64 + jitter) / n as f64)
                })
                .collect()
        })
        .collect();
    let mut candidates: Vec<Vec<String>> = Vec::with_capacity(n);
    for i in 0..n {
        let values: Vec<String> = columns.iter().map(|c| c[i].clone()).collect();
        if !candidates.contains(&values) {
            candidates.push(values);
        }
    }
    Design {
        kind: DesignKind::LatinHypercube,
        grid_size,
        candidates,
    }
}

/// What the tune starts from: the scenario's text and its parsed form.
pub struct Base<'a> {
    /// The file, as shown in messages.
    pub file: &'a str,
    /// The file's text.
    pub text: &'a str,
    /// The parsed scenario (its objectives are what the tune judges by).
    pub scenario: &'a Scenario,
}

impl Base<'_> {
    /// The scenario text with `values` set at `dims`' keys.
    fn text_with(&self, dims: &[Dim], values: &[String]) -> Result<String, SetError> {
        let mut text = self.text.to_owned();
        for (d, v) in dims.iter().zip(values) {
            text = set_field(&text, &d.key, v)?;
        }
        Ok(text)
    }

    /// The scenario with `values` set, validated; an error says why not.
    fn scenario_with(&self, dims: &[Dim], values: &[String]) -> Result<Scenario, String> {
        let text = self.text_with(dims, values).map_err(|e| e.to_string())?;
        let scenario = Scenario::parse(self.file, &text).map_err(|e| e.to_string())?;
        Budget::DEFAULT.check(&scenario).map_err(|e| e.to_string())?;
        Ok(scenario)
    }
}

/// Checks what can be checked before any simulation: at least one
/// dimension, no key twice, objectives set, and every bounding value of
/// every dimension accepted by the scenario on its own.
pub fn precheck(base: &Base<'_>, dims: &[Dim]) -> Result<(), TuneError> {
    if dims.is_empty() {
        return Err(TuneError::NothingVaried);
    }
    for (i, d) in dims.iter().enumerate() {
        if dims[..i].iter().any(|e| e.key == d.key) {
            return Err(TuneError::Twice(d.key.clone()));
        }
    }
    if base.scenario.objectives.is_empty() {
        return Err(TuneError::NoObjectives(base.file.to_owned()));
    }
    for d in dims {
        for value in d.checked_values() {
            base.scenario_with(std::slice::from_ref(d), std::slice::from_ref(&value))
                .map_err(|why| TuneError::Refused {
                    key: d.key.clone(),
                    value,
                    why,
                })?;
        }
    }
    Ok(())
}

/// The tune's settings.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Seeds every last-rung candidate runs on: `first_seed..first_seed + seeds`.
    pub seeds: u64,
    /// The design's seed and the first simulation seed.
    pub first_seed: u64,
    /// Most candidates: the grid is used when it has at most this many.
    pub budget: u64,
    /// Simulations run at once.
    pub jobs: usize,
}

/// An objective's worst figure across the seeds a candidate ran.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Worst {
    /// The largest measured figure.
    Measured {
        /// The figure.
        value: f64,
    },
    /// On some seed it could not be measured and was missed (goodput never
    /// came back).
    Never,
    /// Not applicable on any seed.
    NotApplicable,
}

impl Worst {
    /// For ordering: lower is better; never is worst, not applicable best.
    fn key(self) -> f64 {
        match self {
            Worst::Measured { value } => value,
            Worst::Never => f64::INFINITY,
            Worst::NotApplicable => f64::NEG_INFINITY,
        }
    }
}

/// One objective judged over a candidate's seeds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ObjectiveFigure {
    /// The objective, as the scenario names it.
    pub name: String,
    /// Its target.
    pub target: f64,
    /// The worst seed's figure.
    pub worst: Worst,
    /// Seeds where it was not missed.
    pub passed: u64,
    /// Seeds judged.
    pub seeds: u64,
    /// `(target − worst) / target` (a target of 0 divides by 1); null when
    /// never measured (goodput never came back: below every number) or
    /// not applicable on any seed.
    pub slack: Option<f64>,
}

impl ObjectiveFigure {
    /// Whether the objective was not missed on any seed.
    pub fn met(&self) -> bool {
        self.passed == self.seeds
    }
}

/// Why a candidate was left out.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Disqualified {
    /// The seed it happened on (none: the configuration itself was refused).
    pub seed: Option<u64>,
    /// The failed invariants, the simulation error, or the refusal.
    pub why: String,
}

/// One configuration and how it did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Candidate {
    /// Its number in the design (from 1), as the text names it.
    pub id: usize,
    /// Per varied key, its value.
    pub values: BTreeMap<String, String>,
    /// Seeds it ran on (those of the last rung it reached).
    pub seeds: u64,
    /// Its figures' distributions over those seeds, as `sweep` gives them.
    pub summary: SweepSummary,
    /// Per objective, its worst figure and slack.
    pub objectives: Vec<ObjectiveFigure>,
    /// The smallest slack (null: an objective never measured).
    pub margin: Option<f64>,
    /// Whether every objective was met on every seed.
    pub meets_all: bool,
    /// Why it was left out, if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disqualified: Option<Disqualified>,
}

fn slack_key(s: Option<f64>) -> f64 {
    s.unwrap_or(f64::NEG_INFINITY)
}

impl Candidate {
    /// The (objective, seed) pairs it met, and how many were judged.
    pub fn pairs_met(&self) -> (u64, u64) {
        self.objectives
            .iter()
            .fold((0, 0), |(met, all), o| (met + o.passed, all + o.seeds))
    }

    /// The ranking halving keeps by and the recommendation is chosen by,
    /// best first: meets every objective on every seed; then the larger
    /// share of (objective, seed) pairs met (the count, when the seeds are
    /// the same); then the larger margin; then the larger mean slack; then
    /// the smaller id. The margin comes after the pairs met: one objective
    /// no candidate can meet would otherwise decide the ranking by how
    /// badly it is missed, whatever the others do.
    pub fn rank(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
        let mean = |c: &Candidate| {
            let s: Vec<f64> = c.objectives.iter().filter_map(|o| o.slack).collect();
            if s.len() < c.objectives.iter().filter(|o| o.worst != Worst::NotApplicable).count() {
                f64::NEG_INFINITY
            } else {
                s.iter().sum::<f64>() / s.len().max(1) as f64
            }
        };
        // a.met / a.all against b.met / b.all, without division.
        let share = |met: u64, other_all: u64| u128::from(met) * u128::from(other_all.max(1));
        let ((met_a, all_a), (met_b, all_b)) = (a.pairs_met(), b.pairs_met());
        b.meets_all
            .cmp(&a.meets_all)
            .then_with(|| share(met_b, all_a).cmp(&share(met_a, all_b)))
            .then_with(|| slack_key(b.margin).total_cmp(&slack_key(a.margin)))
            .then_with(|| mean(b).total_cmp(&mean(a)))
            .then_with(|| a.id.cmp(&b.id))
    }

    /// Whether `self` is at least as good as `other` on every objective's
    /// worst figure and better on one.
    fn dominates(&self, other: &Candidate) -> bool {
        let pairs = self.objectives.iter().zip(&other.objectives);
        let mut better = false;
        for (a, b) in pairs {
            match a.worst.key().total_cmp(&b.worst.key()) {
                std::cmp::Ordering::Greater => return false,
                std::cmp::Ordering::Less => better = true,
                std::cmp::Ordering::Equal => {}
            }
        }
        better
    }

    /// `key=value` for each varied key, in the order given.
    pub fn label(&self, dims: &[Dim]) -> String {
        dims.iter()
            .map(|d| format!("{}={}", d.key, self.values.get(&d.key).map_or("?", String::as_str)))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// One objective's verdict on one seed, as judging needs it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeedObjective {
    /// The objective, as the scenario names it.
    pub name: String,
    /// Its target.
    pub target: f64,
    /// Whether it was not missed on this seed.
    pub passed: bool,
    /// This seed's figure, as [`Worst`] orders it (a single seed's worst).
    pub figure: Worst,
}

impl SeedObjective {
    /// The verdict `v` as judging needs it.
    pub fn of(v: &ObjectiveVerdict) -> SeedObjective {
        let figure = match v.judged {
            Judged::Met { measured }
            | Judged::Missed {
                measured: Some(measured),
                ..
            } => Worst::Measured { value: measured },
            Judged::Missed { measured: None, .. } => Worst::Never,
            Judged::NotApplicable { .. } => Worst::NotApplicable,
        };
        SeedObjective {
            name: v.name.to_owned(),
            target: v.target,
            passed: !v.missed(),
            figure,
        }
    }
}

/// What judging needs of one candidate's simulation on one seed: kept per
/// (candidate, seed) so that the simulations of a rung can run on several
/// machines and be joined ([`crate::search::tune_shard`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeedResult {
    /// The candidate's id (from 1).
    pub candidate: usize,
    /// The seed.
    pub seed: u64,
    /// Its record, as `sweep` keeps it (`error` set: the simulation
    /// failed, and nothing else is).
    pub record: SeedRecord,
    /// Per objective the scenario sets, its verdict.
    #[serde(default)]
    pub objectives: Vec<SeedObjective>,
}

impl SeedResult {
    /// The result of candidate `candidate`'s simulation on `seed`.
    pub fn of(candidate: usize, seed: u64, result: &Result<Report, String>) -> SeedResult {
        match result {
            Ok(report) => SeedResult {
                candidate,
                seed,
                record: SeedRecord::of(report),
                objectives: report.objectives.iter().map(SeedObjective::of).collect(),
            },
            Err(why) => SeedResult {
                candidate,
                seed,
                record: SeedRecord::failed(seed, why.clone()),
                objectives: Vec::new(),
            },
        }
    }
}

/// Judges one objective from each seed's verdict on it.
fn objective_figure(verdicts: &[&SeedObjective]) -> Option<ObjectiveFigure> {
    let first = verdicts.first()?;
    let (mut worst, mut passed) = (Worst::NotApplicable, 0u64);
    for v in verdicts {
        passed += u64::from(v.passed);
        if v.figure.key() > worst.key() {
            worst = v.figure;
        }
    }
    let scale = if first.target > 0.0 { first.target } else { 1.0 };
    let slack = match worst {
        Worst::Measured { value } => Some((first.target - value) / scale),
        Worst::Never | Worst::NotApplicable => None,
    };
    Some(ObjectiveFigure {
        name: first.name.clone(),
        target: first.target,
        worst,
        passed,
        seeds: verdicts.len() as u64,
        slack,
    })
}

/// The candidate `id` with `values`, judged on `reports` (one per seed, in
/// seed order; an `Err` is a simulation that failed).
#[cfg(test)]
fn judge(id: usize, dims: &[Dim], values: &[String], reports: &[(u64, Result<Report, String>)]) -> Candidate {
    let results: Vec<SeedResult> = reports.iter().map(|(seed, r)| SeedResult::of(id, *seed, r)).collect();
    judge_results(id, dims, values, &results.iter().collect::<Vec<_>>())
}

/// The candidate `id` with `values`, judged on `results` (one per seed, in
/// seed order).
fn judge_results(id: usize, dims: &[Dim], values: &[String], results: &[&SeedResult]) -> Candidate {
    let mut disqualified = None;
    let mut ran: Vec<&SeedResult> = Vec::new();
    for r in results {
        if disqualified.is_none() {
            let why = match &r.record.error {
                Some(why) => Some(why.clone()),
                None => {
                    let failed = r.record.failed_invariants();
                    (!failed.is_empty()).then(|| format!("invariant failed: {}", failed.join(", ")))
                }
            };
            disqualified = why.map(|why| Disqualified {
                seed: Some(r.seed),
                why,
            });
        }
        if r.record.error.is_none() {
            ran.push(r);
        }
    }
    let names: Vec<&str> = ran
        .first()
        .map_or(Vec::new(), |r| r.objectives.iter().map(|o| o.name.as_str()).collect());
    let objectives: Vec<ObjectiveFigure> = names
        .iter()
        .filter_map(|name| {
            let verdicts: Vec<&SeedObjective> = ran
                .iter()
                .filter_map(|r| r.objectives.iter().find(|o| o.name == *name))
                .collect();
            objective_figure(&verdicts)
        })
        .collect();
    let judged: Vec<&ObjectiveFigure> = objectives.iter().filter(|o| o.worst != Worst::NotApplicable).collect();
    // Every objective not applicable on any seed: nothing to fall short of.
    let margin = if judged.iter().any(|o| o.slack.is_none()) {
        None
    } else {
        Some(judged.iter().filter_map(|o| o.slack).reduce(f64::min).unwrap_or(0.0))
    };
    Candidate {
        id,
        values: dims.iter().map(|d| d.key.clone()).zip(values.iter().cloned()).collect(),
        seeds: results.len() as u64,
        summary: SweepSummary::of_records(ran.iter().map(|r| r.record.clone()).collect()),
        meets_all: disqualified.is_none() && objectives.iter().all(ObjectiveFigure::met),
        objectives,
        margin,
        disqualified,
    }
}

/// One rung of successive halving.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rung {
    /// Seeds each candidate of the rung ran on.
    pub seeds: u64,
    /// Candidates evaluated.
    pub candidates: usize,
    /// Of those, disqualified.
    pub disqualified: usize,
    /// Kept for the next rung (the last rung keeps all that qualify).
    pub kept: usize,
}

/// A tune's result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Tuning {
    /// The scenario file.
    pub scenario: String,
    /// The varied keys, in the order given.
    pub keys: Vec<String>,
    /// How the candidates were chosen.
    pub design: DesignKind,
    /// The grid's size (null: infinite or beyond 64 bits).
    pub grid_size: Option<u64>,
    /// The simulation seeds of the last rung, `[from, to)`.
    pub seeds: [u64; 2],
    /// The rungs, first to last.
    pub rungs: Vec<Rung>,
    /// Every candidate, as of the last rung it reached, by id.
    pub candidates: Vec<Candidate>,
    /// Ids of the last rung's Pareto front, best-ranked first.
    pub front: Vec<usize>,
    /// The recommended candidate's id (null: every candidate disqualified).
    pub recommended: Option<usize>,
    /// The recommended `[hardening]` section, TOML ready to paste.
    pub hardening_toml: Option<String>,
}

/// Reports progress: a rung of `n` simulations starts, one ended.
pub trait Progress: Sync {
    /// A rung of `n` more simulations starts.
    fn rung(&self, n: u64);
    /// One simulation ended.
    fn one(&self);
}

/// No progress shown.
pub struct Quiet;

impl Progress for Quiet {
    fn rung(&self, _: u64) {}
    fn one(&self) {}
}

/// The seed counts of the rungs: `FIRST_RUNG_SEEDS`, doubled until `seeds`.
fn rung_seeds(seeds: u64, grid: bool) -> Vec<u64> {
    if grid {
        return vec![seeds];
    }
    let mut out = vec![FIRST_RUNG_SEEDS.min(seeds)];
    while let Some(&last) = out.last()
        && last < seeds
    {
        out.push(last.saturating_mul(2).min(seeds));
    }
    out
}

/// The fixed part of a tune: its design and each candidate's scenario (or
/// why it was refused).
pub(crate) struct Plan {
    design: Design,
    scenarios: Vec<Option<Scenario>>,
    refusals: Vec<Option<String>>,
    schedule: Vec<u64>,
}

/// Checks `settings` and makes the design and its scenarios.
pub(crate) fn plan(base: &Base<'_>, dims: &[Dim], settings: Settings) -> Result<Plan, TuneError> {
    if settings.seeds == 0 {
        return Err(TuneError::Zero("--seeds"));
    }
    if settings.budget == 0 {
        return Err(TuneError::Zero("--budget"));
    }
    if settings.budget > MAX_BUDGET {
        return Err(TuneError::TooLarge(format!(
            "--budget {} is above the most a tune takes, {MAX_BUDGET}",
            settings.budget
        )));
    }
    if settings.first_seed.checked_add(settings.seeds).is_none() {
        return Err(TuneError::TooLarge(format!(
            "--seed {} with --seeds {} runs past the last seed",
            settings.first_seed, settings.seeds
        )));
    }
    let design = design(dims, settings.budget, settings.first_seed);
    let (mut scenarios, mut refusals) = (Vec::new(), Vec::new());
    for values in &design.candidates {
        match base.scenario_with(dims, values) {
            Ok(s) => {
                scenarios.push(Some(s));
                refusals.push(None);
            }
            Err(why) => {
                scenarios.push(None);
                refusals.push(Some(why));
            }
        }
    }
    let schedule = rung_seeds(settings.seeds, design.kind == DesignKind::Grid);
    Ok(Plan {
        design,
        scenarios,
        refusals,
        schedule,
    })
}

/// Where a tune stands, given the (candidate, seed) results known so far.
#[derive(Debug)]
pub enum Step {
    /// Every rung's results are known: the result.
    Done(Box<Tuning>),
    /// Rung `rung` (from 1, of `rungs`) needs `work`: (candidate id, seed)
    /// pairs, in the order one machine runs them.
    Pending {
        /// The rung (from 1).
        rung: usize,
        /// How many rungs the schedule has.
        rungs: usize,
        /// Its simulations, in order: (candidate id, seed).
        work: Vec<(usize, u64)>,
    },
}

/// Replays the halving over the results in `known` (by candidate id and
/// seed) until a rung lacks one. The result depends on `known` alone, so a
/// tune run on one machine and one whose rungs ran in shards and were
/// merged give the same.
pub(crate) fn step(
    base: &Base<'_>,
    dims: &[Dim],
    settings: Settings,
    plan: &Plan,
    known: &BTreeMap<(usize, u64), SeedResult>,
) -> Step {
    let first = settings.first_seed;
    let design = &plan.design;
    let mut candidates: Vec<Candidate> = design
        .candidates
        .iter()
        .enumerate()
        .map(|(i, values)| match &plan.refusals[i] {
            Some(why) => Candidate {
                id: i + 1,
                values: dims.iter().map(|d| d.key.clone()).zip(values.iter().cloned()).collect(),
                seeds: 0,
                summary: SweepSummary::default(),
                objectives: Vec::new(),
                margin: None,
                meets_all: false,
                disqualified: Some(Disqualified {
                    seed: None,
                    why: format!("refused: {why}"),
                }),
            },
            None => judge_results(i + 1, dims, values, &[]),
        })
        .collect();
    // Per candidate: how many of its seeds (from `first`) are judged.
    let mut judged = vec![0u64; candidates.len()];
    let mut alive: Vec<usize> = (0..candidates.len()).filter(|&i| plan.scenarios[i].is_some()).collect();
    let mut rungs = Vec::new();
    for (r, &seeds) in plan.schedule.iter().enumerate() {
        let work: Vec<(usize, u64)> = alive
            .iter()
            .flat_map(|&i| (first + judged[i]..first + seeds).map(move |s| (i + 1, s)))
            .collect();
        if work.iter().any(|key| !known.contains_key(key)) {
            return Step::Pending {
                rung: r + 1,
                rungs: plan.schedule.len(),
                work,
            };
        }
        for &i in &alive {
            judged[i] = seeds;
            let results: Vec<&SeedResult> = (first..first + seeds).filter_map(|s| known.get(&(i + 1, s))).collect();
            candidates[i] = judge_results(i + 1, dims, &design.candidates[i], &results);
        }
        let evaluated = alive.len();
        let before = alive.len();
        alive.retain(|&i| candidates[i].disqualified.is_none());
        let disqualified = before - alive.len();
        alive.sort_by(|&a, &b| Candidate::rank(&candidates[a], &candidates[b]));
        if r + 1 < plan.schedule.len() {
            let keep = alive.len().div_ceil(2).max(MIN_KEPT.min(alive.len()));
            alive.truncate(keep);
        }
        rungs.push(Rung {
            seeds,
            candidates: evaluated,
            disqualified,
            kept: alive.len(),
        });
        // Later rungs' seeds are added in the order the candidates were drawn.
        alive.sort_unstable();
    }
    // The last rung's candidates, best-ranked first.
    alive.sort_by(|&a, &b| Candidate::rank(&candidates[a], &candidates[b]));
    let front: Vec<usize> = alive
        .iter()
        .filter(|&&i| !alive.iter().any(|&j| j != i && candidates[j].dominates(&candidates[i])))
        .map(|&i| i + 1)
        .collect();
    let recommended = alive.first().map(|&i| i + 1);
    let hardening_toml = recommended.and_then(|id| hardening_section(base, dims, &design.candidates[id - 1]));
    Step::Done(Box::new(Tuning {
        scenario: base.file.to_owned(),
        keys: dims.iter().map(|d| d.key.clone()).collect(),
        design: design.kind,
        grid_size: design.grid_size,
        seeds: [first, first + settings.seeds],
        rungs,
        candidates,
        front,
        recommended,
        hardening_toml,
    }))
}

/// Runs the simulations of `work` (in order) that `shard` owns (all of
/// them without one) and are not yet `known`, on `settings.jobs` threads,
/// adding their results to `known`; how many it ran.
pub(crate) fn run_work(
    base: &Base<'_>,
    settings: Settings,
    plan: &Plan,
    work: &[(usize, u64)],
    shard: Option<Shard>,
    known: &mut BTreeMap<(usize, u64), SeedResult>,
    progress: &dyn Progress,
) -> usize {
    let mine: Vec<(usize, u64)> = work
        .iter()
        .enumerate()
        .filter(|(p, key)| shard.is_none_or(|s| s.owns(*p as u64)) && !known.contains_key(*key))
        .map(|(_, key)| *key)
        .collect();
    progress.rung(mine.len() as u64);
    let ran = super::parallel_map(&mine, settings.jobs, |&(id, seed)| {
        let result = plan.scenarios[id - 1].as_ref().map_or_else(
            || Err("refused".to_owned()),
            |scenario| {
                simulate(scenario, seed)
                    .map(|run| Report::new(scenario, base.file, &run))
                    .map_err(|e| format!("simulation failed: {e}"))
            },
        );
        progress.one();
        SeedResult::of(id, seed, &result)
    });
    for r in ran {
        known.insert((r.candidate, r.seed), r);
    }
    mine.len()
}

/// Searches `dims` over `base` (see the module docs). Call [`precheck`] first.
pub fn tune(base: &Base<'_>, dims: &[Dim], settings: Settings, progress: &dyn Progress) -> Result<Tuning, TuneError> {
    let plan = plan(base, dims, settings)?;
    let mut known = BTreeMap::new();
    loop {
        match step(base, dims, settings, &plan, &known) {
            Step::Done(tuning) => return Ok(*tuning),
            Step::Pending { work, .. } => {
                run_work(base, settings, &plan, &work, None, &mut known, progress);
            }
        }
    }
}

/// The scenario's `[hardening]` table with `values` set, as TOML; keys
/// outside `hardening` follow as comments.
fn hardening_section(base: &Base<'_>, dims: &[Dim], values: &[String]) -> Option<String> {
    let text = base.text_with(dims, values).ok()?;
    let mut table: toml::Table = toml::from_str(&text).ok()?;
    let hardening = table
        .remove("hardening")
        .unwrap_or(toml::Value::Table(toml::Table::new()));
    let mut wrapped = toml::Table::new();
    wrapped.insert("hardening".into(), hardening);
    let mut out = toml::to_string(&wrapped).ok()?;
    for (d, v) in dims.iter().zip(values) {
        if !d.key.starts_with("hardening.") {
            let _ = writeln!(out, "# and, outside [hardening]: {} = {v}", d.key);
        }
    }
    Some(out)
}

fn round(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn worst_text(w: Worst) -> String {
    match w {
        Worst::Measured { value } => round(value).to_string(),
        Worst::Never => "never".into(),
        Worst::NotApplicable => "n/a".into(),
    }
}

fn margin_text(m: Option<f64>) -> String {
    m.map_or("-inf".into(), |m| format!("{:+.3}", round(m)))
}

impl Tuning {
    /// Whether a candidate broke an invariant (or its simulation failed):
    /// a bug, `tune`'s exit code 1.
    pub fn broke(&self) -> bool {
        self.candidates
            .iter()
            .any(|c| c.disqualified.as_ref().is_some_and(|d| d.seed.is_some()))
    }

    /// Whether the recommendation meets every objective (else exit 5).
    pub fn met(&self) -> bool {
        self.recommended
            .and_then(|id| self.candidate(id))
            .is_some_and(|c| c.meets_all)
    }

    /// The candidate with `id`.
    pub fn candidate(&self, id: usize) -> Option<&Candidate> {
        self.candidates.get(id.checked_sub(1)?)
    }

    /// One line per objective that no candidate of the last rung (of
    /// `seeds` seeds) met on every seed: its best worst figure and, where
    /// the tool can tell, what bounds it.
    fn unmet(&self, seeds: u64) -> Vec<String> {
        let last: Vec<&Candidate> = self
            .candidates
            .iter()
            .filter(|c| c.seeds == seeds && c.disqualified.is_none())
            .collect();
        let Some(first) = last.first() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, o) in first.objectives.iter().enumerate() {
            let figures: Vec<(&Candidate, &ObjectiveFigure)> = last
                .iter()
                .filter_map(|c| c.objectives.get(i).map(|f| (*c, f)))
                .collect();
            if figures.iter().any(|(_, f)| f.met()) {
                continue;
            }
            let best = figures
                .iter()
                .min_by(|a, b| a.1.worst.key().total_cmp(&b.1.worst.key()).then(a.0.id.cmp(&b.0.id)));
            let mut line = format!("no candidate meets {} ≤ {} on every seed", o.name, round(o.target));
            if let Some((c, f)) = best {
                let _ = write!(line, "; the best worst figure is {} (#{})", worst_text(f.worst), c.id);
            }
            if let Some(bound) = bound_of(&o.name) {
                let _ = write!(line, "\n  {bound}");
            }
            out.push(line);
        }
        out
    }

    /// The result as text, as `tune` prints it.
    pub fn render(&self, dims: &[Dim]) -> String {
        let mut out = String::new();
        let [from, to] = self.seeds;
        let grid = self
            .grid_size
            .map_or("infinite: a continuous range".to_owned(), |g| g.to_string());
        let how = match self.design {
            DesignKind::Grid => format!("the full grid of {} candidates", self.candidates.len()),
            DesignKind::LatinHypercube => format!(
                "a Latin hypercube of {} candidates (grid size {grid}), refined by successive halving",
                self.candidates.len()
            ),
        };
        let _ = writeln!(out, "tune {}: {how}; seeds {from}..{to}", self.scenario);
        for (i, r) in self.rungs.iter().enumerate() {
            let _ = writeln!(
                out,
                "  rung {}: {} candidates × {} seeds, {} disqualified, {} kept",
                i + 1,
                r.candidates,
                r.seeds,
                r.disqualified,
                r.kept
            );
        }
        let bad: Vec<&Candidate> = self.candidates.iter().filter(|c| c.disqualified.is_some()).collect();
        for c in &bad {
            let Some(d) = &c.disqualified else { continue };
            match d.seed {
                Some(seed) => {
                    let _ = writeln!(
                        out,
                        "DISQUALIFIED #{} {}: {} at seed {seed} — a configuration that breaks an invariant is a bug; replay: set these values in {} and run `redstring-sim run {} --seed {seed}`",
                        c.id,
                        c.label(dims),
                        d.why,
                        self.scenario,
                        self.scenario
                    );
                }
                None => {
                    let _ = writeln!(out, "refused #{} {}: {}", c.id, c.label(dims), d.why);
                }
            }
        }
        let Some(last) = self.rungs.last() else {
            return out;
        };
        let names: Vec<&str> = self
            .recommended
            .and_then(|id| self.candidate(id))
            .map_or(Vec::new(), |c| c.objectives.iter().map(|o| o.name.as_str()).collect());
        let targets: Vec<String> = self
            .recommended
            .and_then(|id| self.candidate(id))
            .map_or(Vec::new(), |c| {
                c.objectives
                    .iter()
                    .map(|o| format!("{} ≤ {}", o.name, round(o.target)))
                    .collect()
            });
        let _ = writeln!(
            out,
            "\nPareto front over the worst seed's figures ({} of the {} candidates that ran all {} seeds; objectives: {}):",
            self.front.len(),
            last.kept,
            last.seeds,
            targets.join(", ")
        );
        let mut header = format!("  {:>4}", "id");
        for d in dims {
            let _ = write!(
                header,
                "  {:>w$}",
                d.key.rsplit('.').next().unwrap_or(&d.key),
                w = width(&d.key)
            );
        }
        for n in &names {
            let _ = write!(header, "  {n:>w$}", w = n.len());
        }
        let _ = write!(header, "  {:>7}  meets", "margin");
        let _ = writeln!(out, "{header}");
        for &id in &self.front {
            let Some(c) = self.candidate(id) else { continue };
            let mut line = format!("  {:>4}", format!("#{id}"));
            for d in dims {
                let _ = write!(
                    line,
                    "  {:>w$}",
                    c.values.get(&d.key).map_or("?", String::as_str),
                    w = width(&d.key)
                );
            }
            for (n, o) in names.iter().zip(&c.objectives) {
                let _ = write!(line, "  {:>w$}", worst_text(o.worst), w = n.len());
            }
            let meets = if c.meets_all { "all" } else { "no" };
            let _ = write!(line, "  {:>7}  {meets}", margin_text(c.margin));
            let _ = writeln!(out, "{line}");
        }
        match self.recommended.and_then(|id| self.candidate(id)) {
            None => {
                let _ = writeln!(out, "\nno recommendation: every candidate was disqualified");
            }
            Some(c) => {
                let tightest = c
                    .objectives
                    .iter()
                    .filter(|o| o.worst != Worst::NotApplicable)
                    .min_by(|a, b| slack_key(a.slack).total_cmp(&slack_key(b.slack)))
                    .map_or("-", |o| o.name.as_str());
                if c.meets_all {
                    let _ = writeln!(
                        out,
                        "\nrecommendation: #{} {} meets every objective on all {} seeds, margin {} (smallest normalised slack, on {tightest})",
                        c.id,
                        c.label(dims),
                        c.seeds,
                        margin_text(c.margin)
                    );
                } else {
                    let missed: Vec<String> = c
                        .objectives
                        .iter()
                        .filter(|o| !o.met())
                        .map(|o| format!("{} on {} of {} seeds", o.name, o.seeds - o.passed, o.seeds))
                        .collect();
                    let (met, all) = c.pairs_met();
                    let _ = writeln!(
                        out,
                        "\nno candidate meets every objective on every seed; the closest: #{} {}, meets {met} of {all} (objective, seed) pairs, margin {} (misses {})",
                        c.id,
                        c.label(dims),
                        margin_text(c.margin),
                        missed.join(", ")
                    );
                    for line in self.unmet(last.seeds) {
                        let _ = writeln!(out, "{line}");
                    }
                }
                let _ = write!(out, "its figures over {} seeds:{}", c.seeds, c.summary.render());
            }
        }
        if let Some(toml) = &self.hardening_toml {
            let _ = write!(out, "\nrecommended settings, ready to paste:\n{toml}");
        }
        out
    }
}

/// What bounds an objective from below whatever the breaker does, where
/// the tool knows it.
fn bound_of(objective: &str) -> Option<&'static str> {
    match objective {
        "impaired_requests_max" => Some(
            "what bounds it: before any breaker can open, every call that arrives until failures are reported reaches the impaired server — a server that holds requests (hung, loading, slow) reports each only after hardening.request_timeout_s, so offered calls/s × request_timeout_s requests reach it first; request_timeout_s (and failure_threshold) move this floor, recovery_timeout_s does not",
        ),
        _ => None,
    }
}

fn width(key: &str) -> usize {
    key.rsplit('.').next().unwrap_or(key).len().max(5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_as_integers_decimals_steps_and_lists() {
        let d = Dim::parse("hardening.failure_threshold=1..10").unwrap();
        assert_eq!((d.key.as_str(), d.levels()), ("hardening.failure_threshold", Some(10)));
        assert_eq!(d.level(0), "1");
        assert_eq!(d.level(9), "10");
        let d = Dim::parse("hardening.jitter=0.1..0.3:0.1").unwrap();
        assert_eq!(d.levels(), Some(3));
        assert_eq!((d.level(0), d.level(2)), ("0.1".into(), "0.3".into()));
        let d = Dim::parse("hardening.recovery_timeout_s=5..10:2.5").unwrap();
        assert_eq!(d.levels(), Some(3));
        assert_eq!(d.level(1), "7.5");
        let d = Dim::parse("hardening.multiplier=1.5..3").unwrap();
        assert_eq!(d.levels(), None);
        assert_eq!(d.at(0.0), "1.5");
        assert_eq!(d.at(0.5), "2.25");
        // A whole-number step over integers is a float range.
        let d = Dim::parse("hardening.recovery_timeout_s=5..20:5").unwrap();
        assert_eq!(d.level(3), "20.0");
        let d = Dim::parse("cache.kind=per_worker,shared").unwrap();
        assert_eq!(d.levels(), Some(2));
        assert_eq!(d.at(0.99), "shared");
    }

    #[test]
    fn bad_specs_are_refused_naming_the_argument() {
        for arg in [
            "no-equals",
            "=1..2",
            "a..b=1..2",
            "k=5..1",
            "k=1.5..0.5",
            "k=1..x",
            "k=0..1:0",
            "k=0..1:-1",
            "k=1,,2",
            "k=0..1e9:1e-9",
            "k=nan..1.0",
        ] {
            match Dim::parse(arg) {
                Err(TuneError::Syntax { arg: got, .. }) => assert_eq!(got, arg),
                other => panic!("{arg}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_small_grid_is_the_design_in_order() {
        let dims = [Dim::parse("a=1..2").unwrap(), Dim::parse("b=x,y,z").unwrap()];
        let d = design(&dims, 6, 1);
        assert_eq!(d.kind, DesignKind::Grid);
        assert_eq!(d.grid_size, Some(6));
        let got: Vec<String> = d.candidates.iter().map(|c| c.join(",")).collect();
        assert_eq!(got, ["1,x", "1,y", "1,z", "2,x", "2,y", "2,z"]);
    }

    #[test]
    fn a_large_space_is_a_latin_hypercube_one_per_stratum() {
        let dims = [Dim::parse("a=0..99").unwrap(), Dim::parse("b=0.0..1.0").unwrap()];
        let d = design(&dims, 10, 7);
        assert_eq!(d.kind, DesignKind::LatinHypercube);
        assert_eq!(d.grid_size, None);
        assert_eq!(d.candidates.len(), 10);
        // Each tenth of each range holds exactly one candidate.
        let mut a: Vec<u64> = d.candidates.iter().map(|c| c[0].parse::<u64>().unwrap() / 10).collect();
        let mut b: Vec<u64> = d
            .candidates
            .iter()
            .map(|c| (c[1].parse::<f64>().unwrap() * 10.0) as u64)
            .collect();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, (0..10).collect::<Vec<_>>());
        assert_eq!(b, (0..10).collect::<Vec<_>>());
        // The same seed draws the same design; another seed another.
        assert_eq!(design(&dims, 10, 7), d);
        assert_ne!(design(&dims, 10, 8).candidates, d.candidates);
    }

    #[test]
    fn rungs_double_the_seeds_up_to_the_count() {
        assert_eq!(rung_seeds(16, false), [2, 4, 8, 16]);
        assert_eq!(rung_seeds(10, false), [2, 4, 8, 10]);
        assert_eq!(rung_seeds(1, false), [1]);
        assert_eq!(rung_seeds(16, true), [16]);
    }

    fn figure(name: &'static str, target: f64, worst: Worst, passed: u64) -> ObjectiveFigure {
        let scale = if target > 0.0 { target } else { 1.0 };
        ObjectiveFigure {
            name: name.to_owned(),
            target,
            worst,
            passed,
            seeds: 4,
            slack: match worst {
                Worst::Measured { value } => Some((target - value) / scale),
                _ => None,
            },
        }
    }

    fn verdict(name: &'static str, target: f64, judged: Judged) -> ObjectiveVerdict {
        ObjectiveVerdict { name, target, judged }
    }

    fn seed_objectives(v: &[ObjectiveVerdict]) -> Vec<SeedObjective> {
        v.iter().map(SeedObjective::of).collect()
    }

    #[test]
    fn an_objective_is_judged_by_its_worst_seed_and_not_applicable_seeds_do_not_count() {
        let v = [
            verdict("p99_latency_s", 10.0, Judged::Met { measured: 4.0 }),
            verdict("p99_latency_s", 10.0, Judged::NotApplicable { why: "x".into() }),
            verdict("p99_latency_s", 10.0, Judged::Met { measured: 8.0 }),
        ];
        let f = objective_figure(&seed_objectives(&v).iter().collect::<Vec<_>>()).unwrap();
        assert_eq!(f.worst, Worst::Measured { value: 8.0 });
        assert_eq!((f.passed, f.seeds, f.met()), (3, 3, true));
        assert!((f.slack.unwrap() - 0.2).abs() < 1e-12);
        let never = [
            verdict("goodput_recovery_s", 30.0, Judged::Met { measured: 4.0 }),
            verdict(
                "goodput_recovery_s",
                30.0,
                Judged::Missed {
                    measured: None,
                    why: None,
                },
            ),
        ];
        let f = objective_figure(&seed_objectives(&never).iter().collect::<Vec<_>>()).unwrap();
        assert_eq!((f.worst, f.slack, f.met()), (Worst::Never, None, false));
        // A target of 0 divides by 1.
        let zero = [verdict(
            "impaired_requests_max",
            0.0,
            Judged::Missed {
                measured: Some(3.0),
                why: None,
            },
        )];
        assert_eq!(
            objective_figure(&seed_objectives(&zero).iter().collect::<Vec<_>>())
                .unwrap()
                .slack,
            Some(-3.0)
        );
    }

    fn candidate(id: usize, objectives: Vec<ObjectiveFigure>) -> Candidate {
        let margin = if objectives.iter().any(|o| o.slack.is_none()) {
            None
        } else {
            objectives.iter().filter_map(|o| o.slack).reduce(f64::min)
        };
        Candidate {
            id,
            values: BTreeMap::new(),
            seeds: 4,
            summary: SweepSummary::default(),
            meets_all: objectives.iter().all(ObjectiveFigure::met),
            objectives,
            margin,
            disqualified: None,
        }
    }

    #[test]
    fn a_candidate_meeting_more_objective_seed_pairs_outranks_a_larger_margin() {
        let m = |v| Worst::Measured { value: v };
        // Misses the impossible objective by less, but misses goodput too on
        // every seed: 4 of 12 pairs met (the failed fraction's).
        let worse = candidate(
            1,
            vec![
                figure("impaired_requests_max", 1.0, m(5.0), 0),
                figure("goodput_recovery_s", 10.0, m(18.0), 0),
                figure("failed_fraction_max", 0.1, m(0.05), 4),
            ],
        );
        // Misses only the impossible objective, by more: 8 of 12 met.
        let better = candidate(
            2,
            vec![
                figure("impaired_requests_max", 1.0, m(7.0), 0),
                figure("goodput_recovery_s", 10.0, m(4.0), 4),
                figure("failed_fraction_max", 0.1, m(0.05), 4),
            ],
        );
        assert!(worse.margin > better.margin, "the old ranking's key favours the worse");
        assert_eq!((worse.pairs_met(), better.pairs_met()), ((4, 12), (8, 12)));
        let mut all = [worse, better];
        all.sort_by(Candidate::rank);
        assert_eq!(all.map(|c| c.id), [2, 1]);
    }

    #[test]
    fn the_closest_candidate_is_named_with_its_pairs_and_each_objective_none_meets() {
        let m = |v| Worst::Measured { value: v };
        let a = candidate(
            1,
            vec![
                figure("impaired_requests_max", 1.0, m(7.0), 0),
                figure("goodput_recovery_s", 10.0, m(4.0), 4),
            ],
        );
        let b = candidate(
            2,
            vec![
                figure("impaired_requests_max", 1.0, m(5.0), 0),
                figure("goodput_recovery_s", 10.0, m(18.0), 1),
            ],
        );
        let tuning = Tuning {
            scenario: "s.toml".into(),
            keys: Vec::new(),
            design: DesignKind::Grid,
            grid_size: Some(2),
            seeds: [1, 5],
            rungs: vec![Rung {
                seeds: 4,
                candidates: 2,
                disqualified: 0,
                kept: 2,
            }],
            candidates: vec![a, b],
            front: vec![1, 2],
            recommended: Some(1),
            hardening_toml: None,
        };
        let text = tuning.render(&[]);
        assert!(
            text.contains("the closest: #1 , meets 4 of 8 (objective, seed) pairs"),
            "{text}"
        );
        assert!(
            text.contains("no candidate meets impaired_requests_max ≤ 1 on every seed; the best worst figure is 5 (#2)\n  what bounds it:"),
            "{text}"
        );
        assert!(text.contains("request_timeout_s"), "{text}");
        // goodput_recovery_s is met by #1 on every seed: not listed.
        assert!(!text.contains("no candidate meets goodput_recovery_s"), "{text}");
    }

    #[test]
    fn ranking_puts_meeting_all_first_then_the_larger_margin() {
        let m = |v| Worst::Measured { value: v };
        // Meets both, margin 0.1.
        let a = candidate(1, vec![figure("r", 10.0, m(9.0), 4), figure("i", 10.0, m(5.0), 4)]);
        // Meets both, margin 0.5.
        let b = candidate(2, vec![figure("r", 10.0, m(5.0), 4), figure("i", 10.0, m(4.0), 4)]);
        // Misses one, though its other slack is huge.
        let c = candidate(3, vec![figure("r", 10.0, m(0.0), 4), figure("i", 10.0, m(11.0), 3)]);
        // Never recovered.
        let d = candidate(
            4,
            vec![figure("r", 10.0, Worst::Never, 3), figure("i", 10.0, m(0.0), 4)],
        );
        let mut all = [d.clone(), c.clone(), a.clone(), b.clone()];
        all.sort_by(Candidate::rank);
        let ids: Vec<usize> = all.iter().map(|c| c.id).collect();
        assert_eq!(ids, [2, 1, 3, 4]);
        // Dominance: b beats a on both; c and b trade off; d is beaten by nobody on `i`.
        assert!(b.dominates(&a));
        assert!(!a.dominates(&b));
        assert!(!b.dominates(&c) && !c.dominates(&b));
        assert!(!b.dominates(&d));
        assert!(!a.dominates(&a));
    }

    #[test]
    fn an_invariant_failure_or_a_failed_simulation_disqualifies_naming_the_seed() {
        let text = "name = \"t\"\nduration_s = 10\n[[servers]]\nname = \"gpu\"\n[[workers]]\nname = \"w\"\nservers = [\"gpu\"]\ntenants = [{ id = 1, calls_per_min = 30 }]\n[objectives]\np99_latency_s = 10\n";
        let scenario = Scenario::parse("t.toml", text).unwrap();
        let report = |seed| Report::new(&scenario, "t.toml", &simulate(&scenario, seed).unwrap());
        let dims = [Dim::parse("hardening.failure_threshold=1..2").unwrap()];
        let values = ["1".to_owned()];
        let clean = judge(1, &dims, &values, &[(1, Ok(report(1))), (2, Ok(report(2)))]);
        assert_eq!(clean.disqualified, None);
        assert!(clean.meets_all, "{clean:?}");
        let mut broken = report(2);
        broken.checks[0].verdict = crate::judgement::invariants::Verdict::Violated {
            t_us: 1,
            host: "w".into(),
            detail: "x".into(),
        };
        let name = broken.checks[0].name.to_string();
        let c = judge(1, &dims, &values, &[(1, Ok(report(1))), (2, Ok(broken))]);
        assert_eq!(
            c.disqualified,
            Some(Disqualified {
                seed: Some(2),
                why: format!("invariant failed: {name}"),
            })
        );
        assert!(!c.meets_all);
        let c = judge(
            1,
            &dims,
            &values,
            &[(1, Err("simulation failed: boom".into())), (2, Ok(report(2)))],
        );
        assert_eq!(c.disqualified.map(|d| d.seed), Some(Some(1)));
    }
}
