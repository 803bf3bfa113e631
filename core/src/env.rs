//! The environment a component runs in: the clock it reads and sleeps on, the
//! source its random draws come from and the observer its events go to.
//!
//! Every component takes the same three inputs, and a hardened setup wants
//! them shared — one clock for the limiter, the breaker and the provider, one
//! seeded stream for a reproducible run, one observer for every event — so
//! they travel together as one [`Env`], given to each builder with `.env(…)`,
//! instead of three setters repeated on every builder. [`Env::system`] (the
//! default) is production's: the calibrated [`SystemClock`], an OS-seeded
//! [`SeededRandom`] and the [`TracingObserver`]; a test or a simulation
//! replaces what it controls with `with_*`. A part not replaced is made when
//! first asked for, so an environment whose clock and randomness are
//! replaced never calibrates the counter or draws OS entropy.
//!
//! ```
//! use std::sync::Arc;
//! use redstring::{CircuitBreaker, Env, ManualClock, RateLimiter, SeededRandom};
//!
//! let clock = Arc::new(ManualClock::at_fixed_epoch());
//! let env = Env::default()
//!     .with_clock(clock.clone())
//!     .with_rng(Arc::new(SeededRandom::from_seed(7)));
//! let limiter = RateLimiter::builder(60).env(env.clone()).build().unwrap();
//! let breaker = CircuitBreaker::builder().env(env).build().unwrap();
//! # let _ = (limiter, breaker);
//! ```

use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::clock::{Clock, SystemClock};
use crate::observe::{Observer, TracingObserver};
use crate::random::{RandomSource, SeededRandom};

/// The clock, random source and observer a component is built with.
///
/// Cloning shares each part already made (they are `Arc`s); a production
/// part not yet asked for is made by each clone on its own — a
/// [`SystemClock`] is the same clock however many there are, and two
/// OS-seeded streams are as good as one.
#[derive(Clone)]
pub struct Env {
    clock: OnceLock<Arc<dyn Clock>>,
    rng: OnceLock<Arc<dyn RandomSource>>,
    observer: OnceLock<Arc<dyn Observer>>,
}

impl Env {
    /// Production's environment: [`SystemClock`], calibrated when first
    /// asked for (see [`SystemClock::calibrate`]) — by a builder, when it
    /// builds; [`SeededRandom::from_os_entropy`]; [`TracingObserver`].
    pub fn system() -> Self {
        Env {
            clock: OnceLock::new(),
            rng: OnceLock::new(),
            observer: OnceLock::new(),
        }
    }

    /// This environment reading and sleeping on `clock` instead.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = OnceLock::from(clock);
        self
    }

    /// This environment drawing from `rng` instead.
    pub fn with_rng(mut self, rng: Arc<dyn RandomSource>) -> Self {
        self.rng = OnceLock::from(rng);
        self
    }

    /// This environment reporting to `observer` instead.
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = OnceLock::from(observer);
        self
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        self.clock.get_or_init(SystemClock::calibrated)
    }

    /// The random source.
    pub fn rng(&self) -> &Arc<dyn RandomSource> {
        self.rng.get_or_init(|| Arc::new(SeededRandom::from_os_entropy()))
    }

    /// The observer.
    pub fn observer(&self) -> &Arc<dyn Observer> {
        self.observer.get_or_init(|| Arc::new(TracingObserver))
    }
}

impl Default for Env {
    /// [`Env::system`].
    fn default() -> Self {
        Env::system()
    }
}

impl fmt::Debug for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Env").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::observe::NoopObserver;

    #[test]
    fn clones_share_what_they_were_given() {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let rng: Arc<dyn RandomSource> = Arc::new(SeededRandom::from_seed(1));
        let observer: Arc<dyn Observer> = Arc::new(NoopObserver);
        let env = Env::default()
            .with_clock(clock.clone())
            .with_rng(rng.clone())
            .with_observer(observer.clone());
        let copy = env.clone();
        clock.advance(std::time::Duration::from_secs(5));
        assert_eq!(copy.clock().now(), clock.now());
        assert!(Arc::ptr_eq(copy.rng(), &rng));
        assert!(Arc::ptr_eq(copy.observer(), &observer));
        assert_eq!(format!("{env:?}"), "Env { .. }");
    }
}
