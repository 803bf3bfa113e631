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
