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
///
/// A read of the OS wall clock costs a `clock_gettime` (tens of
/// nanoseconds on a virtual machine — as much as a whole limiter decision).
/// Where the kernel itself keeps time by the CPU's timestamp counter (Linux
/// with clocksource `tsc`), `now` reads the OS clock only to anchor: each
/// thread pairs one OS reading with the counter (through `quanta`, which
/// calibrates it against the OS's monotonic clock) and, for the next
/// [`SYSTEM_CLOCK_ANCHOR`], answers the anchor plus the counter's elapsed
/// time. Everywhere else every reading asks the OS.
///
/// Between anchors the reading is the OS wall time to within the counter's
/// rate error over that interval — microseconds, tens at worst while NTP
/// slews the OS clock — and a step of the OS clock (NTP, an operator) is
/// followed at the next anchor, as any wall clock's jump is. Each thread
/// anchors on its own, so two threads' readings may differ by as much, and a
/// reading may move backwards slightly at an anchor or when a task moves to
/// another thread; like every wall clock's jumps, nothing in this crate
/// needs it not to.
///
/// The counter is calibrated once per process, by the first reading
/// (typically milliseconds, up to 200 ms): [`SystemClock::calibrate`] pays
/// that up front, and the builders that default to this clock call it.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

/// How long a thread's [`SystemClock`] reading follows the CPU's counter
/// before it reads the OS wall clock again.
pub const SYSTEM_CLOCK_ANCHOR: Duration = Duration::from_millis(100);

thread_local! {
    /// This thread's last OS wall-clock reading, in µs since the Unix epoch,
    /// and the counter's raw reading just after it (so a reading between
    /// anchors lags the OS clock by the gap, and leads it by no more than
    /// the counter's calibration errs, a rounding included). No destructor:
    /// usable while the thread is torn down.
    static ANCHOR: std::cell::Cell<Option<(u64, u64)>> = const { std::cell::Cell::new(None) };
}

/// The CPU's counter, calibrated by `quanta`, with its scale to
/// microseconds worked out once.
struct Counter {
    clock: quanta::Clock,
    /// Microseconds per tick, times 2^[`TICK_SHIFT`]: a reading between
    /// anchors is one multiply and one shift away from the anchor's time
    /// (not `quanta`'s 128-bit scale to nanoseconds and a division).
    micros_per_tick: u64,
    /// The counter's ticks in [`SYSTEM_CLOCK_ANCHOR`]: a reading that many
    /// ticks past its anchor, or behind it, re-anchors.
    anchor_ticks: u64,
}

/// The fixed point of [`Counter::micros_per_tick`]: 2^40 ticks are about
/// 220 s on a 5 GHz counter, so rounding their microseconds errs by under
/// half a nanosecond over an anchor's 100 ms; and within an anchor
/// `ticks × micros_per_tick` stays below 10⁵ µs × 2^40 < 2^57.
const TICK_SHIFT: u32 = 40;

impl Counter {
    /// `clock` and its scale, or `None` for a calibration that makes no
    /// sense here: a tick so short that 2^40 of them round to no
    /// microsecond, or one longer than the anchor's whole span.
    fn new(clock: quanta::Clock) -> Option<Counter> {
        // quanta scales 2^40 ticks to nanoseconds in 128 bits; to the
        // nearest microsecond.
        let micros_per_tick = clock.delta_as_nanos(0, 1 << TICK_SHIFT).saturating_add(500) / 1_000;
        let anchor_micros = u128::from(duration_micros(SYSTEM_CLOCK_ANCHOR));
        let anchor_ticks = (anchor_micros << TICK_SHIFT).checked_div(u128::from(micros_per_tick))?;
        // At most 10⁵ × 2^40 (a tick of one unit), so it fits in 64 bits,
        // and `anchor_ticks × micros_per_tick` ≤ 10⁵ µs × 2^40 < 2^57.
        let anchor_ticks = u64::try_from(anchor_ticks).ok()?;
        debug_assert!(anchor_ticks.checked_mul(micros_per_tick).is_some_and(|p| p < 1 << 57));
        (anchor_ticks > 0).then_some(Counter {
            clock,
            micros_per_tick,
            anchor_ticks,
        })
    }

    /// The microseconds in `ticks` counted from an anchor, or `None` once
    /// they reach the anchor's span.
    #[inline]
    fn micros_within_anchor(&self, ticks: u64) -> Option<u64> {
        // No overflow: below the span, the product is under 2^57 (`new`).
        (ticks < self.anchor_ticks).then(|| ticks.wrapping_mul(self.micros_per_tick) >> TICK_SHIFT)
    }
}

/// The process's calibrated counter, if the kernel keeps time by it.
fn counter() -> Option<&'static Counter> {
    static COUNTER: std::sync::OnceLock<Option<Counter>> = std::sync::OnceLock::new();
    COUNTER
        .get_or_init(|| {
            kernel_keeps_time_by_the_counter()
                .then(quanta::Clock::new)
                .and_then(Counter::new)
        })
        .as_ref()
}

/// Whether the kernel's own clocksource is the CPU's timestamp counter: then
/// the counter is synchronised across cores and steady, as the kernel checks
/// before it trusts it. Anywhere this cannot be read, no.
fn kernel_keeps_time_by_the_counter() -> bool {
    #[cfg(target_os = "linux")]
    {
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .is_ok_and(|source| source.trim() == "tsc")
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// The OS wall clock, in µs since the Unix epoch (0 before it).
#[allow(clippy::disallowed_methods)] // allowed: the production clock is the one reader of OS time.
fn os_wall_micros() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    duration_micros(since)
}

/// Reads the OS wall clock and makes it this thread's anchor, with the
/// counter's reading just after it.
#[cold]
#[allow(clippy::disallowed_methods)] // allowed: the production clock is the one reader of the CPU's counter.
fn reanchor(counter: &Counter) -> Timestamp {
    let wall = os_wall_micros();
    ANCHOR.set(Some((wall, counter.clock.raw())));
    Timestamp::from_micros(wall)
}

impl SystemClock {
    /// Calibrates the CPU's counter now (once per process; later calls
    /// return at once) instead of at the first reading.
    pub fn calibrate() {
        let _ = counter();
    }

    /// A calibrated system clock: the default of every builder here.
    pub(crate) fn calibrated() -> Arc<dyn Clock> {
        Self::calibrate();
        Arc::new(SystemClock)
    }
}

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // allowed: the production clock is the one reader of the CPU's counter.
    fn now(&self) -> Timestamp {
        let Some(counter) = counter() else {
            return Timestamp::from_micros(os_wall_micros());
        };
        let at = counter.clock.raw();
        if let Some((wall, anchored_at)) = ANCHOR.get() {
            // One compare for both ways out: a counter behind its anchor
            // (another core's, unsynchronised) wraps to far past it.
            if let Some(micros) = counter.micros_within_anchor(at.wrapping_sub(anchored_at)) {
                return Timestamp::from_micros(wall.saturating_add(micros));
            }
        }
        reanchor(counter)
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

    /// The counter's scale, worked out once, reads as quanta's own: on a
    /// 1 GHz counter (quanta's mock, a tick a nanosecond) 100 ms are 10⁸
    /// ticks, and a millisecond of ticks is a thousand microseconds.
    #[test]
    fn the_counters_scale_is_quantas_in_microseconds() {
        let (clock, _) = quanta::Clock::mock();
        let counter = Counter::new(clock).expect("a 1 GHz counter scales");
        assert!(
            counter.anchor_ticks.abs_diff(100_000_000) <= 1,
            "{}",
            counter.anchor_ticks
        );
        for (ticks, micros) in [(0, 0), (999, 0), (1_000, 1), (1_000_000, 1_000), (99_999_000, 99_999)] {
            assert_eq!(counter.micros_within_anchor(ticks), Some(micros), "{ticks} ticks");
        }
        // Past the span, or behind the anchor (wrapped): re-anchor.
        assert_eq!(counter.micros_within_anchor(counter.anchor_ticks), None);
        assert_eq!(counter.micros_within_anchor(5u64.wrapping_sub(9)), None);
    }

    #[test]
    fn system_clock_reads_a_recent_wall_time() {
        assert!(SystemClock.now() > Timestamp::from_secs(1_700_000_000));
    }

    /// Between anchors the counter stands in for the OS clock: every
    /// reading, on several threads and across several anchors, lies between
    /// the OS readings taken just before and just after it, to within the
    /// counter's rate error (allowed a millisecond here), and a thread's
    /// readings go backwards by no more than that.
    #[test]
    fn system_clock_follows_the_os_wall_clock_across_anchors() {
        let slack = 1_000;
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(move || {
                    let start = os_wall_micros();
                    let mut last = 0;
                    let mut reads = 0u64;
                    while os_wall_micros() < start + 3 * duration_micros(SYSTEM_CLOCK_ANCHOR) {
                        let before = os_wall_micros();
                        let read = SystemClock.now().as_micros();
                        let after = os_wall_micros();
                        assert!(
                            before.saturating_sub(slack) <= read && read <= after + slack,
                            "{before} <= {read} <= {after}"
                        );
                        assert!(read + slack >= last, "went back from {last} to {read}");
                        last = read;
                        reads += 1;
                    }
                    assert!(reads > 10, "{reads} reads in three anchors");
                });
            }
        });
    }
}
