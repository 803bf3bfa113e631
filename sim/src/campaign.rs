//! Campaigns: one scenario run over many seeds (and several variants), on
//! as many threads as asked, with the same result as on one.
//!
//! [`simulate`] is the whole pipeline for one seed — build the world, run
//! it ([`crate::world`]), judge its evidence ([`crate::judgement`]);
//! [`run_seeds`] runs it over seeds on `jobs` threads and keeps each seed's
//! record, which `sweep`, `compare` and `tune` summarise; [`parallel_map`]
//! is the one place work is spread over threads. Each simulation is
//! single-threaded and builds its own world, so results never depend on the
//! number of threads.

use crate::judgement::Run;
use crate::judgement::report::Report;
use crate::judgement::sweep::SeedRecord;
use crate::scenario::Scenario;
use crate::world::{Budget, SimError, Watch, run_watched, run_within};

/// Most seeds one command runs: far beyond what a machine simulates in a
/// day, and a bound on the memory of their records. Past it, split the work
/// with `--shard` and `merge`.
pub const MAX_SEEDS: u64 = 100_000;

/// Runs `scenario` with `seed` to completion and checks every invariant,
/// within [`Budget::DEFAULT`].
pub fn simulate(scenario: &Scenario, seed: u64) -> Result<Run, SimError> {
    simulate_within(scenario, seed, Budget::DEFAULT)
}

/// Runs `scenario` with `seed` to completion within `budget` and checks
/// every invariant.
pub fn simulate_within(scenario: &Scenario, seed: u64, budget: Budget) -> Result<Run, SimError> {
    run_within(scenario, seed, budget).map(|evidence| crate::judgement::judge(scenario, evidence))
}

/// Like [`simulate`], with `watch` told the simulated time as the run goes
/// and able to stop it ([`crate::world::World::run_watched`]).
pub fn simulate_watched(scenario: &Scenario, seed: u64, watch: Watch<'_>) -> Result<Run, SimError> {
    run_watched(scenario, seed, Budget::DEFAULT, watch).map(|evidence| crate::judgement::judge(scenario, evidence))
}

/// Like [`simulate_watched`], the workers' events also recorded as the
/// production metrics into `metrics`
/// ([`crate::evidence::metrics::MetricLog`]).
pub fn simulate_metered(
    scenario: &Scenario,
    seed: u64,
    watch: Watch<'_>,
    metrics: &crate::evidence::metrics::MetricLog,
) -> Result<Run, SimError> {
    let trace = crate::evidence::trace::Trace::metered(metrics.clone());
    crate::world::run_traced(scenario, seed, Budget::DEFAULT, watch, trace)
        .map(|evidence| crate::judgement::judge(scenario, evidence))
}

/// Runs `scenario` over `seeds` on `jobs` threads and returns each seed's
/// record (shown as `shown` in its replay command) in the order given,
/// calling `done` after each.
pub fn run_seeds(
    scenario: &Scenario,
    shown: &str,
    seeds: &[u64],
    jobs: usize,
    done: impl Fn() + Sync,
) -> Vec<SeedRecord> {
    parallel_map(seeds, jobs, |&seed| {
        let record = seed_record(scenario, shown, seed);
        done();
        record
    })
}

/// Simulates `scenario` with `seed` and keeps its record (shown as `shown`
/// in its replay command), a failed simulation's as a failed record.
pub fn seed_record(scenario: &Scenario, shown: &str, seed: u64) -> SeedRecord {
    match simulate(scenario, seed) {
        Ok(run) => SeedRecord::of(&Report::new(scenario, shown, &run)),
        Err(e) => SeedRecord::failed(seed, format!("simulation failed: {e}")),
    }
}

/// Runs `f` on every item on `jobs` threads and returns the results in item
/// order, whatever order they finished in: with each simulation
/// single-threaded and building its own world, the results are those of a
/// run on one thread (`sweep`, `compare` and `tune` all run on it).
pub fn parallel_map<T: Sync, R: Send>(items: &[T], jobs: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: std::sync::Mutex<Vec<(usize, R)>> = std::sync::Mutex::new(Vec::with_capacity(items.len()));
    let work = || {
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(item) = items.get(i) else { break };
            let r = f(item);
            results.lock().unwrap_or_else(|p| p.into_inner()).push((i, r));
        }
    };
    let threads = jobs.min(items.len()).max(1);
    std::thread::scope(|scope| {
        for _ in 1..threads {
            // The main thread's stack size: a world's futures nest deeply.
            let spawned = std::thread::Builder::new()
                .stack_size(8 << 20)
                .spawn_scoped(scope, work);
            if spawned.is_err() {
                break;
            }
        }
        work();
    });
    let mut results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}
