//! Judging a candidate: each objective's worst seed, its slack, the
//! margin, and the order candidates are ranked by.

use super::*;

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
    pub(super) fn key(self) -> f64 {
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
    /// Of those, seeds where it was measured (not "not applicable").
    pub measured: u64,
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

/// One of [`Candidate::rank`]'s keys, in the order it applies them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RankKey {
    /// Meets every objective on every seed.
    MeetsAll,
    /// Measured at least one objective.
    Measured,
    /// The larger share of measured (objective, seed) pairs met.
    PairsMet,
    /// The larger margin.
    Margin,
    /// The larger mean slack.
    MeanSlack,
    /// The smaller id (the figures tie).
    Id,
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

pub(super) fn slack_key(s: Option<f64>) -> f64 {
    s.unwrap_or(f64::NEG_INFINITY)
}

impl Candidate {
    /// The (objective, seed) pairs it met, and how many were measured: a
    /// pair not applicable (nothing to measure on that seed) counts in
    /// neither, so a candidate cannot rank high by measuring nothing.
    pub fn pairs_met(&self) -> (u64, u64) {
        self.objectives.iter().fold((0, 0), |(met, all), o| {
            let not_applicable = o.seeds.saturating_sub(o.measured);
            (met + o.passed.saturating_sub(not_applicable), all + o.measured)
        })
    }

    /// The ranking halving keeps by and the recommendation is chosen by,
    /// best first: meets every objective on every seed; then measured at
    /// least one (a candidate that measured nothing tells nothing); then
    /// the larger share of the measured (objective, seed) pairs met (the
    /// count, when the seeds are the same); then the larger margin; then
    /// the larger mean slack; then the smaller id. The margin comes after the pairs met: one objective
    /// no candidate can meet would otherwise decide the ranking by how
    /// badly it is missed, whatever the others do.
    pub fn rank(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
        Candidate::rank_stages(a, b)
            .into_iter()
            .map(|(_, o)| o)
            .find(|o| o.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    }

    /// Which of [`Candidate::rank`]'s keys sets `a` and `b` apart (none:
    /// the same candidate).
    pub fn decided_by(a: &Candidate, b: &Candidate) -> Option<RankKey> {
        Candidate::rank_stages(a, b)
            .into_iter()
            .find(|(_, o)| o.is_ne())
            .map(|(k, _)| k)
    }

    /// Each of [`Candidate::rank`]'s keys, in order, and how `a` and `b`
    /// compare on it (`Less`: `a` ranks first).
    fn rank_stages(a: &Candidate, b: &Candidate) -> [(RankKey, std::cmp::Ordering); 6] {
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
        [
            (RankKey::MeetsAll, b.meets_all.cmp(&a.meets_all)),
            (RankKey::Measured, (all_b > 0).cmp(&(all_a > 0))),
            (RankKey::PairsMet, share(met_b, all_a).cmp(&share(met_a, all_b))),
            (RankKey::Margin, slack_key(b.margin).total_cmp(&slack_key(a.margin))),
            (RankKey::MeanSlack, mean(b).total_cmp(&mean(a))),
            (RankKey::Id, a.id.cmp(&b.id)),
        ]
    }

    /// Whether `self` is at least as good as `other` on every objective's
    /// worst figure and better on one.
    pub(super) fn dominates(&self, other: &Candidate) -> bool {
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

    /// Whether `self` makes running `other` on more seeds a waste: both
    /// ran the same seeds, `self` met every objective on each of them, and
    /// its worst figure is strictly better than `other`'s on every
    /// objective (one not applicable on any seed for either is left out;
    /// at least one is compared). Then `self` ranks above `other` by
    /// [`Candidate::rank`]: it meets every objective, and if `other` does
    /// too, each of `self`'s slacks is the larger, so its margin is.
    pub fn outclasses(&self, other: &Candidate) -> bool {
        if !self.meets_all
            || self.disqualified.is_some()
            || self.seeds != other.seeds
            || self.objectives.len() != other.objectives.len()
        {
            return false;
        }
        let mut compared = false;
        for (a, b) in self.objectives.iter().zip(&other.objectives) {
            if a.name != b.name {
                return false;
            }
            if a.worst == Worst::NotApplicable && b.worst == Worst::NotApplicable {
                continue;
            }
            if a.worst.key().total_cmp(&b.worst.key()) != std::cmp::Ordering::Less {
                return false;
            }
            compared = true;
        }
        compared
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
pub(super) fn objective_figure(verdicts: &[&SeedObjective]) -> Option<ObjectiveFigure> {
    let first = verdicts.first()?;
    let (mut worst, mut passed, mut measured) = (Worst::NotApplicable, 0u64, 0u64);
    for v in verdicts {
        passed += u64::from(v.passed);
        measured += u64::from(v.figure != Worst::NotApplicable);
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
        measured,
        slack,
    })
}

/// The candidate `id` with `values`, judged on `reports` (one per seed, in
/// seed order; an `Err` is a simulation that failed).
#[cfg(test)]
pub(super) fn judge(
    id: usize,
    dims: &[Dim],
    values: &[String],
    reports: &[(u64, Result<Report, String>)],
) -> Candidate {
    let results: Vec<SeedResult> = reports.iter().map(|(seed, r)| SeedResult::of(id, *seed, r)).collect();
    judge_results(id, dims, values, &results.iter().collect::<Vec<_>>())
}

/// The candidate `id` with `values`, judged on `results` (one per seed, in
/// seed order).
pub(super) fn judge_results(id: usize, dims: &[Dim], values: &[String], results: &[&SeedResult]) -> Candidate {
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
        // An objective not applicable on any seed measured nothing: a
        // candidate meets its objectives only if one of them was measured.
        meets_all: disqualified.is_none()
            && objectives.iter().all(ObjectiveFigure::met)
            && objectives.iter().any(|o| o.worst != Worst::NotApplicable),
        objectives,
        margin,
        disqualified,
    }
}
