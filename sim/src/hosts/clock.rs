//! Per-host clocks with offset, drift and steps.
//!
//! turmoil gives every host the same virtual time and no skew of its own. A
//! [`SimClock`] reads that shared simulated time and bends it the way a real
//! machine's wall clock goes wrong: a constant offset, a rate error in parts
//! per million, and steps applied by the fault schedule (an NTP correction, an
//! operator's `date -s`). Sleeping uses tokio's timer, which turmoil
//! virtualises; it is not skewed (a drifting oscillator barely changes a
//! timeout, but it moves wall-clock stamps, which is what the limiter and
//! breaker compare).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use redstring::{Clock, Sleep, Timestamp};

use crate::scenario::ClockSpec;

/// The instant every simulation starts at: 2023-11-14T22:13:20Z.
pub const EPOCH: Timestamp = Timestamp::from_secs(1_700_000_000);

/// A host's wall clock inside the simulation.
#[derive(Clone, Debug)]
pub struct SimClock {
    spec: ClockSpec,
    steps_us: Arc<AtomicI64>,
}

impl SimClock {
    /// A clock with `spec`'s offset and drift and no steps yet.
    pub fn new(spec: ClockSpec) -> Self {
        SimClock {
            spec,
            steps_us: Arc::new(AtomicI64::new(0)),
        }
    }

    /// Steps the clock by `by_ms` (negative steps it back). Clones share steps.
    pub fn step(&self, by_ms: i64) {
        self.steps_us.fetch_add(by_ms.saturating_mul(1000), Ordering::SeqCst);
    }

    /// What this clock reads at true simulated time `elapsed`.
    pub fn reading_at(&self, elapsed: Duration) -> Timestamp {
        let e = i64::try_from(elapsed.as_micros()).unwrap_or(i64::MAX);
        let drift = (i128::from(e) * i128::from(self.spec.drift_ppm) / 1_000_000) as i64;
        let micros = i64::try_from(EPOCH.as_micros()).unwrap_or(i64::MAX)
            + e
            + self.spec.offset_ms.saturating_mul(1000)
            + drift
            + self.steps_us.load(Ordering::SeqCst);
        Timestamp::from_micros(u64::try_from(micros).unwrap_or(0))
    }
}

/// True simulated time since the run began: turmoil's on a simulated host,
/// real time since [`RealTime`] began on a thread the laboratory runs in
/// real time, and zero elsewhere.
pub fn sim_elapsed() -> Duration {
    turmoil::sim_elapsed()
        .or_else(|| REAL_EPOCH.with(|e| e.get()).map(|epoch| epoch.elapsed()))
        .unwrap_or_default()
}

thread_local! {
    /// When this thread's real-time run began, if it runs one.
    static REAL_EPOCH: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) };
}

/// While it lives, this thread's time outside a simulation is real time
/// since it was made: the laboratory runs the simulator's workers, clocks
/// and trace on a real runtime this way, unchanged.
#[derive(Debug)]
pub struct RealTime(());

impl RealTime {
    /// Starts real time at zero on this thread.
    pub fn begin() -> RealTime {
        REAL_EPOCH.with(|e| e.set(Some(std::time::Instant::now())));
        RealTime(())
    }
}

impl Drop for RealTime {
    fn drop(&mut self) {
        REAL_EPOCH.with(|e| e.set(None));
    }
}

impl Clock for SimClock {
    fn now(&self) -> Timestamp {
        self.reading_at(sim_elapsed())
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_drift_and_steps_compose() {
        let c = SimClock::new(ClockSpec {
            offset_ms: 250,
            drift_ppm: 100,
        });
        let at = |s| c.reading_at(Duration::from_secs(s)).as_micros() - EPOCH.as_micros();
        assert_eq!(at(0), 250_000);
        // 100 ppm over 1000 s is 0.1 s fast.
        assert_eq!(at(1000), 1_000_000_000 + 250_000 + 100_000);
        c.clone().step(-2_000);
        assert_eq!(at(1000), 1_000_000_000 + 250_000 + 100_000 - 2_000_000);
    }

    #[test]
    fn a_perfect_clock_reads_true_time() {
        let c = SimClock::new(ClockSpec::default());
        assert_eq!(
            c.reading_at(Duration::from_millis(1500)),
            EPOCH.saturating_add(Duration::from_millis(1500))
        );
    }
}
