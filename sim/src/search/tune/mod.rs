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
//!    hopeless configurations, the close ones get all of it. A kept
//!    candidate runs only the seeds it lacks, and one that another
//!    candidate of its rung [outclasses](Candidate::outclasses) on the
//!    seeds so far (meets every objective on them with a strictly better
//!    worst figure on each) stops there too, even in the better half: it
//!    ranks below its better and could only overtake it by luck. The
//!    simulations run are counted, per rung and in all.
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
//! 5. **Why** ([`Explanation`]). The objective that binds the recommendation
//!    (its smallest slack), how the runner-up differs and where it falls
//!    behind, and each varied setting's effect per step on each objective,
//!    a least-squares estimate from the results already known (no further
//!    simulation). The front is drawn over every objective ([`pareto`]).
//!
//! Every simulation is single-threaded and builds its own world; the
//! (candidate, seed) pairs of a rung are run on `jobs` threads and gathered
//! in order, so the result is that of `jobs = 1`.

mod design;
mod explain;
mod halving;
mod judging;
mod plot;
mod render;
mod spec;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use rand::Rng as _;
use rand::SeedableRng as _;
use rand::seq::SliceRandom as _;
use serde::{Deserialize, Serialize};

use crate::campaign::simulate;
use crate::judgement::compare::{SetError, set_field};
use crate::judgement::objectives::{Judged, ObjectiveVerdict};
use crate::judgement::report::Report;
use crate::judgement::shard::Shard;
use crate::judgement::sweep::{SeedRecord, SweepSummary};
use crate::scenario::Scenario;
use crate::world::Budget;

pub use design::*;
pub use explain::*;
pub use halving::*;
pub use judging::*;
pub use plot::*;
pub use spec::*;

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
    /// A `--vary` key names an objective: tuning would loosen the target
    /// rather than find the configuration that meets it.
    #[error(
        "--vary {0}: objectives are what the tune must meet, not a setting to search; vary the [hardening] (or the deployment) instead"
    )]
    VariesObjective(String),
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
    /// Simulations run in all: each (candidate, seed) pair once.
    pub simulations: u64,
    /// Every candidate, as of the last rung it reached, by id.
    pub candidates: Vec<Candidate>,
    /// Ids of the last rung's Pareto front, best-ranked first.
    pub front: Vec<usize>,
    /// The recommended candidate's id (null: every candidate disqualified).
    pub recommended: Option<usize>,
    /// The recommended `[hardening]` section, TOML ready to paste.
    pub hardening_toml: Option<String>,
    /// Why the recommendation (null: there is none).
    pub explanation: Option<Explanation>,
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
