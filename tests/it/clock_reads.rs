//! One clock read per decision over a store that stamps with its own clock.
//!
//! A `MemoryCache` under `TimeSource::Store` ignores the caller's `now`, so the
//! limiter and the breaker do not read their clock for it: even a reading of
//! the production clock's counter is a few nanoseconds, and a reading of the
//! OS clock (at an anchor, or where the counter is not used) a system call's
//! worth. A caller-stamped cache still gets the caller's reading.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redstring::{
    CircuitBreaker, Clock, Env, ManualClock, MemoryCache, NoopObserver, Observer, RateLimiter, RecordingObserver,
    Sleep, TenantId, TimeSource, Timestamp,
};
use testkit::ready;

/// A manual clock that counts its readings.
#[derive(Default)]
struct Counted {
    clock: ManualClock,
    reads: AtomicUsize,
}

impl Counted {
    fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }
}

impl Clock for Counted {
    fn now(&self) -> Timestamp {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.clock.now()
    }
    fn sleep(&self, duration: Duration) -> Sleep {
        self.clock.sleep(duration)
    }
}

fn cache(clock: &Arc<Counted>, time_source: TimeSource) -> Arc<MemoryCache> {
    Arc::new(MemoryCache::with_time_source(clock.clone(), time_source))
}

#[test]
fn a_store_stamped_decision_reads_the_clock_once() {
    let clock = Arc::new(Counted::default());
    let store = cache(&clock, TimeSource::Store);
    let env = Env::default().with_clock(clock.clone());
    let limiter = RateLimiter::builder(10)
        .env(env.clone().with_observer(Arc::new(NoopObserver)))
        .cache(store.clone())
        .build()
        .unwrap();
    let breaker = |observer: Arc<dyn Observer>| {
        CircuitBreaker::builder()
            .env(env.clone().with_observer(observer))
            .cache(store.clone())
            .build()
            .unwrap()
    };
    let before = clock.reads();
    ready(limiter.acquire(TenantId::from_u128(1))).unwrap();
    assert_eq!(clock.reads() - before, 1, "acquire");
    // Observed or not, each breaker step reads the store's clock once and
    // the breaker's not at all.
    let observers: [Arc<dyn Observer>; 2] = [Arc::new(RecordingObserver::new()), Arc::new(NoopObserver)];
    for observer in observers {
        let breaker = breaker(observer);
        let before = clock.reads();
        assert!(ready(breaker.allow_request()));
        ready(breaker.record_success()).unwrap();
        assert_eq!(clock.reads() - before, 2, "allow + record_success, one reading each");
    }
}

#[test]
fn a_caller_stamped_decision_still_gets_the_callers_reading() {
    let clock = Arc::new(Counted::default());
    let store = cache(&clock, TimeSource::Caller);
    let limiter = RateLimiter::builder(10)
        .env(
            Env::default()
                .with_clock(clock.clone())
                .with_observer(Arc::new(NoopObserver)),
        )
        .cache(store)
        .build()
        .unwrap();
    let before = clock.reads();
    ready(limiter.acquire(TenantId::from_u128(1))).unwrap();
    assert_eq!(clock.reads() - before, 2, "the caller's reading and the store's");
}
