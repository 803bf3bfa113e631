//! The in-process success path allocates nothing per call.
//!
//! A counting global allocator (this test binary only) tallies allocations
//! while a warmed-up limiter and breaker run allow → acquire → record_success
//! thousands of times on the default observer.

use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use redstring::{CircuitBreaker, ManualClock, RateLimiter, TenantId};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("MemoryCache operations never suspend"),
    }
}

#[test]
fn the_success_path_allocates_nothing_per_call() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let limiter = RateLimiter::builder(100).clock(clock.clone()).build().unwrap();
    let breaker = CircuitBreaker::builder().clock(clock.clone()).build().unwrap();
    let tenant = TenantId::from_u128(1);
    let call = || {
        clock.advance(Duration::from_millis(700));
        assert!(ready(breaker.allow_request()));
        ready(limiter.acquire(tenant)).unwrap();
        ready(breaker.record_success()).unwrap();
    };
    // Warm up: the tenant's key and its hit series reach their steady size
    // (two windows of hits at one call per 0.7 s).
    for _ in 0..1_000 {
        call();
    }
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    for _ in 0..10_000 {
        call();
    }
    let per_call = (ALLOCATIONS.load(Ordering::SeqCst) - before) as f64 / 10_000.0;
    assert_eq!(per_call, 0.0, "allocations per call on the success path");
}
