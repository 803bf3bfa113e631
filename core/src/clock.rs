//! The clock port: the only way anything in this crate learns the time or waits.
//!
//! Retry sleeps, limiter windows, breaker timeouts and cache TTLs all read one
//! injected [`Clock`], so a unit test can run an hour of backoff in a
//! microsecond ([`ManualClock`]) and the simulator can give every host its own
//! skewed, drifting sense of "now". [`SystemClock`] is the production clock and
//! the one place in the crate allowed to read the operating system's time.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::time::{Timestamp, duration_micros};

/// A boxed sleep future, as returned by [`Clock::sleep`].
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Wall time and waiting, injected into every component.
///
/// `now` is wall time (what cache entries are stamped with); it may jump, as
/// real wall clocks do. `sleep` waits for a duration on whatever timeline the
/// clock lives on: real time, a manual test timeline, or simulated time.
pub trait Clock: Send + Sync + 'static {
    /// The current wall time.
    fn now(&self) -> Timestamp;

    /// A future that completes after `duration` has passed on this clock.
    fn sleep(&self, duration: Duration) -> Sleep;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
    fn sleep(&self, duration: Duration) -> Sleep {
        (**self).sleep(duration)
    }
}

/// The production clock: the operating system's wall time and tokio's timer.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // allowed: the production clock is the one reader of OS time.
    fn now(&self) -> Timestamp {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp::from_micros(duration_micros(since))
    }

    #[allow(clippy::disallowed_methods)] // allowed: the production clock owns real sleeping.
    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// A clock for tests: time moves only when told to, and `sleep` advances it
/// instead of waiting.
///
/// Clones share one timeline. Every sleep is recorded, so a test can assert the
/// exact backoff schedule a retry loop slept (see [`ManualClock::sleeps`]).
#[derive(Clone, Debug)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

#[derive(Debug)]
struct ManualInner {
    now_micros: AtomicU64,
    sleeps: Mutex<Vec<Duration>>,
}

impl ManualClock {
    /// A clock reading `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock {
            inner: Arc::new(ManualInner {
                now_micros: AtomicU64::new(start.as_micros()),
                sleeps: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A clock reading 2023-11-14T22:13:20Z (1 700 000 000 s), a fixed, recent
    /// instant so test output is stable.
    pub fn at_fixed_epoch() -> Self {
        Self::new(Timestamp::from_secs(1_700_000_000))
    }

    /// Moves time forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.inner.now_micros.fetch_add(duration_micros(d), Ordering::SeqCst);
    }

    /// Sets the time, forwards or backwards (a stepped wall clock).
    pub fn set(&self, t: Timestamp) {
        self.inner.now_micros.store(t.as_micros(), Ordering::SeqCst);
    }

    /// Every duration passed to [`Clock::sleep`] so far, in order.
    pub fn sleeps(&self) -> Vec<Duration> {
        self.inner.sleeps.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The sum of every sleep so far.
    pub fn slept(&self) -> Duration {
        self.sleeps().iter().sum()
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::at_fixed_epoch()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_micros(self.inner.now_micros.load(Ordering::SeqCst))
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        self.inner
            .sleeps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(duration);
        self.advance(duration);
        Box::pin(YieldOnce(false))
    }
}

/// Completes on its second poll, letting other tasks run in between — what a
/// manual sleep does instead of waiting.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if self.0 {
            std::task::Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn manual_sleep_advances_instead_of_waiting() {
        let clock = ManualClock::at_fixed_epoch();
        let start = clock.now();
        clock.sleep(Duration::from_secs(3600)).await;
        assert_eq!(clock.now().saturating_duration_since(start), Duration::from_secs(3600));
        assert_eq!(clock.sleeps(), vec![Duration::from_secs(3600)]);
    }

    #[test]
    fn clones_share_one_timeline() {
        let a = ManualClock::at_fixed_epoch();
        let b = a.clone();
        a.advance(Duration::from_millis(1500));
        assert_eq!(b.now(), Timestamp::from_micros(1_700_000_001_500_000));
        b.set(Timestamp::from_secs(5));
        assert_eq!(a.now(), Timestamp::from_secs(5));
    }

    #[test]
    fn system_clock_reads_a_recent_wall_time() {
        assert!(SystemClock.now() > Timestamp::from_secs(1_700_000_000));
    }
}
