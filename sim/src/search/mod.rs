//! The search: looking for a scenario that breaks a configuration.
//!
//! [`fuzz`] generates whole scenarios within user-given bounds and shrinks a
//! failing one to a replayable file, and [`fuzz_run`] keeps a run's results
//! per case so that its shards can be merged; [`mutants`] hunts each known-bad variant
//! of the hardening with both, to show the checkers catch it; [`coverage`]
//! says which paths through the hardening a search exercised, and which it
//! never did; [`tune`] searches a configuration's numbers for the one that
//! meets the scenario's objectives with the most margin, and [`tune_shard`]
//! runs its rungs' simulations over several machines.

pub mod coverage;
pub mod fuzz;
pub mod fuzz_run;
#[cfg(feature = "mutants")]
pub mod mutants;
pub mod tune;
pub mod tune_shard;

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
