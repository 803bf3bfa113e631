//! The evidence a run leaves behind.
//!
//! [`trace`] is the typed, ordered record every host writes into;
//! [`outcome`] says how calls and requests ended; [`observe`] is the one place
//! the core's `Event`s become trace entries; [`timeline`] is the one fold of
//! breaker and limiter state over the trace that the invariants and the plots
//! read; [`episodes`] finds each server's fault episodes and when it was
//! ready again; [`metrics`] keeps the workers' events as the production
//! metrics, when a run is asked for them. [`Evidence`] is what one run hands on: no verdict, which is
//! [`crate::judgement`]'s to give.

pub mod episodes;
pub mod metrics;
pub mod observe;
pub mod outcome;
pub mod timeline;
pub mod trace;

/// What one run leaves behind: its seed, the simulated time it covered, and
/// every event in order.
#[derive(Clone, Debug)]
pub struct Evidence {
    /// The seed it ran with.
    pub seed: u64,
    /// Simulated time covered.
    pub simulated: std::time::Duration,
    /// Every event, in order.
    pub events: Vec<trace::TraceEvent>,
}
