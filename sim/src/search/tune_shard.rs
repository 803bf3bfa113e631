//! A tune split over several machines, rung by rung.
//!
//! Successive halving chooses a rung's candidates from every candidate's
//! results on the rungs before, so the machines must meet after every rung;
//! within a rung the (candidate, seed) simulations are independent. So a
//! sharded tune runs in rounds, one per rung:
//!
//! 1. `tune … --shard i/n --json part-i.json` on each machine: replays the
//!    halving over the results it is given (none at first; `--resume
//!    STATE` later), finds the first rung with a simulation not yet run,
//!    and runs the `i`th of every `n` of that rung's simulations, in the
//!    order one machine runs them. Its file carries every result it knows.
//! 2. `merge part-*.json --json STATE`: joins the results. When they
//!    complete every rung, it prints and writes the tune's result, byte for
//!    byte what one machine prints and writes ([`crate::search::tune`]'s
//!    halving is replayed over the same results, `tune::step`). Otherwise it
//!    writes `STATE`, the joined results, for the next round.
//!
//! A grid is one rung: one round. A drawn design of `budget` candidates and
//! `S` seeds takes `1 + log2(S / 2)` rounds (4 for 16 seeds).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::judgement::shard::{Shard, ShardError};
use crate::scenario::Scenario;
use crate::search::tune::{Base, Dim, Progress, SeedResult, Settings, Step, TuneError, Tuning, plan, run_work, step};

/// What `tune --shard --json` writes, and what `merge` writes between
/// rounds (`shard` null then): the tune's arguments and every
/// (candidate, seed) result known.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TunePart {
    /// Always `"tune"`: what `merge` reads this as.
    pub command: String,
    /// The scenario file, as shown.
    pub scenario: String,
    /// The scenario's text, so that every round and the merge tune the
    /// same scenario.
    pub text: String,
    /// The `--vary` arguments, in the order given.
    pub vary: Vec<String>,
    /// `--seeds`.
    pub seeds: u64,
    /// `--seed`.
    pub seed: u64,
    /// `--budget`.
    pub budget: u64,
    /// Which shard of the rung's simulations this file ran (null: a merged
    /// state).
    pub shard: Option<Shard>,
    /// The rung (from 1) this file adds results to; for a merged state, the
    /// rung the next round runs.
    pub rung: usize,
    /// Every result known, by candidate id then seed.
    pub results: Vec<SeedResult>,
}

impl TunePart {
    /// Whether `self` is a part of the tune `other` is (same scenario,
    /// text, keys, seeds, seed and budget); if not, how they differ, `other`
    /// named `whose`.
    fn differs(&self, other: &TunePart, whose: &str) -> Option<String> {
        let key = |p: &TunePart| (p.scenario.clone(), p.vary.clone(), p.seeds, p.seed, p.budget);
        let show = |p: &TunePart| {
            format!(
                "tune {} --vary {:?} --seeds {} --seed {} --budget {}",
                p.scenario, p.vary, p.seeds, p.seed, p.budget
            )
        };
        if key(self) != key(other) {
            return Some(format!("{}, {whose} {}", show(self), show(other)));
        }
        (self.text != other.text).then(|| format!("the text of {} differs from {whose}", self.scenario))
    }
}

/// What one `tune --shard` round did.
#[derive(Debug)]
pub enum Round {
    /// The results given complete every rung: nothing to run; the result.
    Done(Box<Tuning>),
    /// It ran its part of rung `rung`.
    Ran {
        /// The rung (from 1).
        rung: usize,
        /// Of how many.
        rungs: usize,
        /// Simulations it ran.
        ran: usize,
        /// Simulations the rung has.
        of: usize,
        /// What it writes.
        part: Box<TunePart>,
    },
}

/// The tune's arguments as a part, with no results yet.
pub fn part_of(base: &Base<'_>, vary: &[String], settings: Settings) -> TunePart {
    TunePart {
        command: "tune".into(),
        scenario: base.file.to_owned(),
        text: base.text.to_owned(),
        vary: vary.to_vec(),
        seeds: settings.seeds,
        seed: settings.first_seed,
        budget: settings.budget,
        shard: None,
        rung: 1,
        results: Vec::new(),
    }
}

fn known_of(results: &[SeedResult]) -> BTreeMap<(usize, u64), SeedResult> {
    results.iter().map(|r| ((r.candidate, r.seed), r.clone())).collect()
}

/// Runs shard `shard` of the first rung the results of `from` (a merged
/// state, or none) do not complete. `from` must be a part of this tune.
pub fn round(
    base: &Base<'_>,
    dims: &[Dim],
    vary: &[String],
    settings: Settings,
    from: Option<&TunePart>,
    shard: Shard,
    progress: &dyn Progress,
) -> Result<Round, TuneError> {
    let mut part = part_of(base, vary, settings);
    if let Some(from) = from
        && let Some(why) = from.differs(&part, "this one is")
    {
        return Err(TuneError::Resume(why));
    }
    let plan = plan(base, dims, settings)?;
    let mut known = known_of(from.map_or(&[][..], |f| &f.results));
    match step(base, dims, settings, &plan, &known) {
        Step::Done(tuning) => Ok(Round::Done(tuning)),
        Step::Pending { rung, rungs, work } => {
            let ran = run_work(base, settings, &plan, &work, Some(shard), &mut known, progress);
            part.shard = Some(shard);
            part.rung = rung;
            part.results = known.into_values().collect();
            Ok(Round::Ran {
                rung,
                rungs,
                ran,
                of: work.len(),
                part: Box::new(part),
            })
        }
    }
}

/// Runs every rung the results of `from` do not complete, on one machine.
pub fn finish(
    base: &Base<'_>,
    dims: &[Dim],
    vary: &[String],
    settings: Settings,
    from: &TunePart,
    progress: &dyn Progress,
) -> Result<Tuning, TuneError> {
    if let Some(why) = from.differs(&part_of(base, vary, settings), "this one is") {
        return Err(TuneError::Resume(why));
    }
    let plan = plan(base, dims, settings)?;
    let mut known = known_of(&from.results);
    loop {
        match step(base, dims, settings, &plan, &known) {
            Step::Done(tuning) => return Ok(*tuning),
            Step::Pending { work, .. } => {
                run_work(base, settings, &plan, &work, None, &mut known, progress);
            }
        }
    }
}

/// What joining a round's parts gave.
#[derive(Clone, Debug, PartialEq)]
pub enum Joined {
    /// Every rung is complete: the tune's result, its scenario (for the
    /// load lines) and its keys (for the text).
    Done {
        /// The result.
        tuning: Box<Tuning>,
        /// The scenario tuned.
        scenario: Box<Scenario>,
        /// The varied keys.
        dims: Vec<Dim>,
    },
    /// Rung `next.rung` is still to run: the state for the next round.
    Next(Box<TunePart>),
}

/// Joins one round's parts (`(file, text)` each; [`crate::merge::merge`]
/// has checked they are the `n` shards of one command).
pub fn merge(files: &[(String, String)]) -> Result<Joined, ShardError> {
    let mismatch = |file: &str, why: String| ShardError::Mismatch {
        file: file.to_owned(),
        why,
    };
    let mut parts = Vec::new();
    for (file, text) in files {
        let p: TunePart = serde_json::from_str(text).map_err(|e| ShardError::NotAShard {
            file: file.clone(),
            why: e.to_string(),
        })?;
        parts.push((file.as_str(), p));
    }
    let Some((first_file, first)) = parts.first() else {
        return Err(ShardError::Nothing);
    };
    let mut known: BTreeMap<(usize, u64), SeedResult> = BTreeMap::new();
    for (file, p) in &parts {
        if let Some(why) = p.differs(first, "the first file's") {
            return Err(mismatch(file, why));
        }
        if p.rung != first.rung {
            return Err(mismatch(
                file,
                format!("rung {}, the first file's rung {}", p.rung, first.rung),
            ));
        }
        for r in &p.results {
            match known.get(&(r.candidate, r.seed)) {
                Some(had) if had != r => {
                    return Err(mismatch(
                        file,
                        format!(
                            "candidate #{} seed {} differs from another shard's",
                            r.candidate, r.seed
                        ),
                    ));
                }
                _ => {
                    known.insert((r.candidate, r.seed), r.clone());
                }
            }
        }
    }
    let bad = |why: String| ShardError::NotAShard {
        file: first_file.to_string(),
        why,
    };
    let scenario = Scenario::parse(&first.scenario, &first.text).map_err(|e| bad(e.to_string()))?;
    let dims = first
        .vary
        .iter()
        .map(|v| Dim::parse(v))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    let settings = Settings {
        seeds: first.seeds,
        first_seed: first.seed,
        budget: first.budget,
        jobs: 1,
    };
    let base = Base {
        file: &first.scenario,
        text: &first.text,
        scenario: &scenario,
    };
    let plan = plan(&base, &dims, settings).map_err(|e| bad(e.to_string()))?;
    match step(&base, &dims, settings, &plan, &known) {
        Step::Done(tuning) => Ok(Joined::Done {
            tuning,
            dims,
            scenario: Box::new(scenario),
        }),
        Step::Pending { rung, rungs, work } if rung <= first.rung => {
            let missing = work.iter().filter(|k| !known.contains_key(k)).count();
            Err(ShardError::Missing(format!(
                "{missing} of rung {rung} of {rungs}'s {} simulations (give every shard's --json of that round)",
                work.len()
            )))
        }
        Step::Pending { rung, .. } => Ok(Joined::Next(Box::new(TunePart {
            shard: None,
            rung,
            results: known.into_values().collect(),
            ..first.clone()
        }))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judgement::sweep::SeedRecord;

    fn part(index: u64, rung: usize, results: Vec<SeedResult>) -> (String, String) {
        let p = TunePart {
            command: "tune".into(),
            scenario: "s.toml".into(),
            text: "name = \"s\"".into(),
            vary: vec!["hardening.failure_threshold=1..8".into()],
            seeds: 4,
            seed: 1,
            budget: 6,
            shard: Some(Shard { index, count: 2 }),
            rung,
            results,
        };
        (format!("part-{index}.json"), serde_json::to_string(&p).unwrap())
    }

    fn result(candidate: usize, seed: u64, error: Option<&str>) -> SeedResult {
        SeedResult {
            candidate,
            seed,
            record: SeedRecord {
                seed,
                error: error.map(str::to_owned),
                ..SeedRecord::default()
            },
            objectives: Vec::new(),
        }
    }

    #[test]
    fn parts_that_disagree_on_a_result_or_on_the_rung_are_refused() {
        // Both carry candidate 1's seed 1 (an earlier rung's), differently.
        let one = part(1, 2, vec![result(1, 1, None)]);
        let two = part(2, 2, vec![result(1, 1, Some("simulation failed: boom"))]);
        assert!(matches!(
            merge(&[one.clone(), two]),
            Err(ShardError::Mismatch { file, why })
                if file == "part-2.json" && why.contains("candidate #1 seed 1 differs")
        ));
        // The same result twice is the same result.
        let same = part(2, 2, vec![result(1, 1, None)]);
        assert!(!matches!(merge(&[one.clone(), same]), Err(ShardError::Mismatch { .. })));
        // A part of another rung's round.
        let late = part(2, 3, vec![]);
        assert!(matches!(
            merge(&[one, late]),
            Err(ShardError::Mismatch { why, .. }) if why.contains("rung 3, the first file's rung 2")
        ));
    }
}
