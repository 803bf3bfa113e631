//! The evidence a run leaves behind.
//!
//! [`trace`] is the typed, ordered record every host writes into;
//! [`outcome`] says how calls and requests ended; [`observe`] is the one place
//! the core's `Event`s become trace entries; [`timeline`] is the one fold of
//! breaker and limiter state over the trace that the invariants and the plots
//! read; [`episodes`] finds each server's fault episodes and when it was
//! ready again.

pub mod episodes;
pub mod observe;
pub mod outcome;
pub mod timeline;
pub mod trace;
