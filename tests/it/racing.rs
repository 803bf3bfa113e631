//! Threads racing one in-process limiter are admitted exactly `rpm` times.
//!
//! The compliance suite races tasks on one runtime; this races OS threads on
//! both cores through the sharded `MemoryCache`, for one hot tenant and for
//! tenants spread over every shard.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use redstring::{Env, ManualClock, NoopObserver, RateLimiter, TenantId};

use testkit::ready;

fn limiter(rpm: u32) -> RateLimiter {
    RateLimiter::builder(rpm)
        .env(
            Env::default()
                .with_clock(Arc::new(ManualClock::at_fixed_epoch()))
                .with_observer(Arc::new(NoopObserver)),
        )
        .build()
        .unwrap()
}

#[test]
fn threads_racing_one_tenant_are_admitted_exactly_rpm_times() {
    let limiter = limiter(100);
    let admitted = AtomicU32::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..200 {
                    if ready(limiter.acquire(TenantId::from_u128(7))).is_ok() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(admitted.into_inner(), 100);
}

#[test]
fn threads_racing_a_thousand_tenants_admit_each_exactly_rpm_times() {
    let limiter = limiter(3);
    let admitted: Vec<AtomicU32> = (0..1_000).map(|_| AtomicU32::new(0)).collect();
    std::thread::scope(|s| {
        for thread in 0..2u128 {
            let (limiter, admitted) = (&limiter, &admitted);
            s.spawn(move || {
                for round in 0..5u128 {
                    for n in 0..1_000u128 {
                        // The threads walk the tenants in opposite directions.
                        let n = if (thread + round) % 2 == 0 { n } else { 999 - n };
                        if ready(limiter.acquire(TenantId::from_u128(n))).is_ok() {
                            admitted[n as usize].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    for (n, count) in admitted.iter().enumerate() {
        assert_eq!(count.load(Ordering::Relaxed), 3, "tenant {n}");
    }
}
