//! The in-process success path allocates nothing per call.
//!
//! A counting global allocator (this test binary only) tallies allocations
//! while a warmed-up limiter and breaker run allow → acquire → record_success
//! thousands of times on the default observer and on one that listens, and
//! while one limiter serves a thousand tenants (every shard of its
//! `MemoryCache`) at their limits.
//!
//! A test binary of its own, not a module of `tests/it`: a
//! `#[global_allocator]` serves the whole binary, so every test there would
//! allocate through the counter.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use redstring::{CircuitBreaker, Env, Event, ManualClock, Observer, RateLimiter, TenantId};
use testkit::ready;

struct Counting;

thread_local! {
    /// Allocations made on this thread: the test harness's other threads
    /// (another test starting) are not counted.
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

fn count_one() {
    // `try_with`: a thread being torn down has no counter left.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: forwards to the system allocator unchanged; only counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// An observer that listens to every event and keeps none: every decision
/// then builds its events.
struct Listening;

impl Observer for Listening {
    fn on_event(&self, event: &Event) {
        std::hint::black_box(event);
    }
}

#[test]
fn the_success_path_allocates_nothing_per_call() {
    // On the default observer (no subscriber: nothing listens) and on one
    // that listens, so building the events counts too.
    success_path_allocations(None);
    success_path_allocations(Some(Arc::new(Listening)));
}

fn success_path_allocations(observer: Option<Arc<dyn Observer>>) {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let mut env = Env::default().with_clock(clock.clone());
    if let Some(observer) = observer {
        env = env.with_observer(observer);
    }
    let limiter = RateLimiter::builder(100).env(env.clone()).build().unwrap();
    let breaker = CircuitBreaker::builder().env(env).build().unwrap();
    let tenant = TenantId::from_u128(1);
    let call = || {
        clock.advance(Duration::from_millis(700));
        // The permit's form, then the spec's.
        let permit = ready(breaker.admit());
        assert!(permit.is_admitted());
        ready(limiter.acquire(tenant)).unwrap();
        ready(breaker.record_success_for(&permit)).unwrap();
        assert!(ready(breaker.allow_request()));
        ready(breaker.record_success()).unwrap();
    };
    // Warm up: the tenant's key and its hit series reach their steady size
    // (two windows of hits at one call per 0.7 s).
    for _ in 0..1_000 {
        call();
    }
    let before = allocations();
    for _ in 0..10_000 {
        call();
    }
    let per_call = (allocations() - before) as f64 / 10_000.0;
    assert_eq!(per_call, 0.0, "allocations per call on the success path");
}

#[test]
fn a_thousand_tenants_at_their_limits_allocate_nothing_per_call() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let limiter = RateLimiter::builder(10)
        .env(Env::default().with_clock(clock.clone()))
        .build()
        .unwrap();
    let tenants: Vec<TenantId> = (0..1_000u128).map(TenantId::from_u128).collect();
    let round = || {
        // One admission per tenant every window / rpm: each at its limit.
        clock.advance(Duration::from_millis(6_001));
        for tenant in &tenants {
            ready(limiter.acquire(*tenant)).unwrap();
        }
    };
    // Warm up: every series reaches its steady size (two windows and the
    // clock lead of hits, at one per 6 s).
    for _ in 0..40 {
        round();
    }
    let before = allocations();
    for _ in 0..20 {
        round();
    }
    let per_call = (allocations() - before) as f64 / 20_000.0;
    assert_eq!(per_call, 0.0, "allocations per call over a thousand tenants");
}
