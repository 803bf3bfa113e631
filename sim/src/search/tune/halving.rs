//! Successive halving: the rungs, the plan, replaying the halving over the
//! results known so far, and running a rung's simulations.

use super::*;

/// One rung of successive halving.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rung {
    /// Seeds each candidate of the rung ran on.
    pub seeds: u64,
    /// Candidates evaluated.
    pub candidates: usize,
    /// Of those, disqualified.
    pub disqualified: usize,
    /// Of the better half, stopped because another candidate of the rung
    /// outclasses them on its seeds ([`Candidate::outclasses`]).
    pub dominated: usize,
    /// Kept for the next rung (the last rung keeps all that qualify).
    pub kept: usize,
    /// Simulations the rung ran: each candidate's seeds it had not run on
    /// an earlier rung (a candidate moving up a rung keeps its results).
    pub simulations: u64,
}

/// The seed counts of the rungs: `FIRST_RUNG_SEEDS`, doubled until `seeds`.
pub(super) fn rung_seeds(seeds: u64, grid: bool) -> Vec<u64> {
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
        alive.retain(|&i| candidates[i].disqualified.is_none());
        let disqualified = evaluated - alive.len();
        let dominated;
        (alive, dominated) = select(&candidates, alive, r + 1 == plan.schedule.len());
        rungs.push(Rung {
            seeds,
            candidates: evaluated,
            disqualified,
            dominated,
            kept: alive.len(),
            simulations: work.len() as u64,
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
    // Nothing to paste when no objective was measured: nothing chose it.
    let measured = |id: usize| {
        candidates[id - 1]
            .objectives
            .iter()
            .any(|o| o.worst != Worst::NotApplicable)
    };
    let hardening_toml = recommended
        .filter(|&id| measured(id))
        .and_then(|id| hardening_section(base, dims, &design.candidates[id - 1]));
    let simulations = rungs.iter().map(|r| r.simulations).sum();
    // The effects rest on the seeds every candidate ran: the first rung's.
    let common = [first, first + plan.schedule.first().copied().unwrap_or(0)];
    let explanation = recommended
        .and_then(|id| candidates.get(id - 1))
        .map(|c| explain(dims, &candidates, c, known, common));
    Step::Done(Box::new(Tuning {
        scenario: base.file.to_owned(),
        keys: dims.iter().map(|d| d.key.clone()).collect(),
        design: design.kind,
        grid_size: design.grid_size,
        seeds: [first, first + settings.seeds],
        rungs,
        simulations,
        candidates,
        front,
        recommended,
        hardening_toml,
        explanation,
    }))
}

/// Of a rung's qualified candidates `alive` (indices into `candidates`),
/// those kept for the next rung, best-ranked first, and how many of the
/// better half were stopped as dominated. On the last rung all are kept.
/// Before it, the better half by [`Candidate::rank`] (never fewer than
/// [`MIN_KEPT`], or all if fewer), less each one another candidate of the
/// rung [outclasses](Candidate::outclasses) on the seeds so far: that one
/// ranks above it and leaves it nothing to show on more seeds but by luck.
pub(super) fn select(candidates: &[Candidate], mut alive: Vec<usize>, last: bool) -> (Vec<usize>, usize) {
    alive.sort_by(|&a, &b| Candidate::rank(&candidates[a], &candidates[b]));
    if last {
        return (alive, 0);
    }
    let keep = alive.len().div_ceil(2).max(MIN_KEPT.min(alive.len()));
    alive.truncate(keep);
    // An outclassing candidate ranks above the one it outclasses, so it is
    // among the better half whenever that one is.
    let kept: Vec<usize> = alive
        .iter()
        .copied()
        .filter(|&i| !alive.iter().any(|&j| candidates[j].outclasses(&candidates[i])))
        .collect();
    let dominated = alive.len() - kept.len();
    (kept, dominated)
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
    let ran = crate::campaign::parallel_map(&mine, settings.jobs, |&(id, seed)| {
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

/// The scenario's `[hardening]` table with `values` set, as TOML; keys
/// outside `hardening` follow as comments.
pub(super) fn hardening_section(base: &Base<'_>, dims: &[Dim], values: &[String]) -> Option<String> {
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
