//! What a live tenant at its limit costs in memory, and that it is bounded by
//! `rpm`.
//!
//! A counting global allocator (this test binary only) tracks the bytes held.
//! Tenants are driven at their limit — one admission per `window / rpm` — for
//! three windows, long enough for their series to reach the steady size the
//! limiter's series lifetime (`2 × window + max_clock_ahead`) allows: about
//! `2 × rpm` hits of 8 bytes, in a ring buffer (`VecDeque`) whose capacity
//! is a power of two.
//!
//! A test binary of its own, not a module of `tests/it`: the allocator
//! counts the bytes every thread holds, so another test running beside it
//! in a shared binary would change the figures, and every test there would
//! allocate through the counter.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redstring::{Env, ManualClock, NoopObserver, RateLimiter, TenantId};
use testkit::ready;

struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HELD.fetch_add(new_size, Ordering::Relaxed);
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const TENANTS: u128 = 100;
const WINDOW: Duration = Duration::from_secs(60);

/// Drives tenants `0..tenants` at `rpm` for three windows.
fn drive(limiter: &RateLimiter, clock: &ManualClock, rpm: u32, tenants: u128) {
    let step = WINDOW / rpm + Duration::from_micros(1);
    for _ in 0..3 * rpm {
        for n in 0..tenants {
            ready(limiter.acquire(TenantId::from_u128(n))).expect("one admission per window / rpm");
        }
        clock.advance(step);
    }
}

/// What a cache's tenants cost at `rpm`, in bytes: per live tenant (what
/// `TENANTS` more tenants added to `TENANTS` at their limit), and the
/// cache's own (what the first `TENANTS` held beyond as many tenants'
/// cost: the shards' maps made with their first tenants).
fn bytes_held(rpm: u32) -> (usize, usize) {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let limiter = RateLimiter::builder(rpm)
        .window(WINDOW)
        .env(
            Env::default()
                .with_clock(clock.clone())
                .with_observer(Arc::new(NoopObserver)),
        )
        .build()
        .unwrap();
    let before = HELD.load(Ordering::SeqCst);
    drive(&limiter, &clock, rpm, TENANTS);
    let first = HELD.load(Ordering::SeqCst) - before;
    drive(&limiter, &clock, rpm, 2 * TENANTS);
    let both = HELD.load(Ordering::SeqCst) - before;
    drop(limiter);
    let per_tenant = (both - first) / TENANTS as usize;
    (per_tenant, first.saturating_sub(per_tenant * TENANTS as usize))
}

/// The bound documented in BENCHMARKS.md: 8 bytes per instant the series'
/// ring has room for — the next power of two above the most hits it can
/// hold — plus the tenant's entry (its key and its place in a shard's map).
fn bound(rpm: u32) -> usize {
    let hits = 2 * rpm as usize + (rpm as usize).div_ceil(60) + 2;
    8 * hits.next_power_of_two() + 512
}

/// The bound on a cache's own bytes documented in BENCHMARKS.md: the
/// shards' maps beyond their tenants' entries.
const CACHE_BOUND: usize = 16 * 1024;

#[test]
fn a_live_tenant_at_its_limit_costs_memory_bounded_by_rpm() {
    for rpm in [10, 100, 1_000] {
        let (bytes, cache) = bytes_held(rpm);
        eprintln!(
            "rpm {rpm}: {bytes} bytes per live tenant (bound {}), {cache} bytes the cache's own (bound {CACHE_BOUND})",
            bound(rpm)
        );
        assert!(bytes <= bound(rpm), "rpm {rpm}: {bytes} bytes > {}", bound(rpm));
        // It does hold the window: at least 8 bytes per hit in it.
        assert!(
            bytes >= 8 * rpm as usize,
            "rpm {rpm}: {bytes} bytes hold less than a window"
        );
        assert!(
            cache <= CACHE_BOUND,
            "rpm {rpm}: the cache's own {cache} bytes > {CACHE_BOUND}"
        );
    }
}
