//! The search: looking for a scenario that breaks a configuration.
//!
//! [`fuzz`] generates whole scenarios within user-given bounds and shrinks a
//! failing one to a replayable file.

pub mod fuzz;
