//! The search: looking for a scenario that breaks a configuration.
//!
//! [`fuzz`] generates whole scenarios within user-given bounds and shrinks a
//! failing one to a replayable file; [`mutants`] hunts each known-bad variant
//! of the hardening with both, to show the checkers catch it; [`coverage`]
//! says which paths through the hardening a search exercised, and which it
//! never did.

pub mod coverage;
pub mod fuzz;
#[cfg(feature = "mutants")]
pub mod mutants;
