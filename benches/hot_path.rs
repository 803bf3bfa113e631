//! The in-process hot path — limiter acquire, breaker allow + record_success,
//! and the two together — beside `governor`'s keyed limiter and `recloser`'s
//! lock-free breaker, in one criterion run.
//!
//! redstring's futures complete without suspending over `MemoryCache`, so they
//! are polled once with a no-op waker: the figures are the code's own cost,
//! not an executor's. The manual clock advances a little more than
//! window / rpm per call, so the window holds about `rpm` hits — the steady
//! state of a tenant at its limit, not an ever-growing series.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use redstring::{CircuitBreaker, ManualClock, NoopObserver, RateLimiter, TenantId};

const RPM: u32 = 1_000;
const WINDOW: Duration = Duration::from_secs(60);
const STEP: Duration = Duration::from_millis(61);

fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("MemoryCache operations never suspend"),
    }
}

fn ours() -> (Arc<ManualClock>, RateLimiter, CircuitBreaker) {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let limiter = RateLimiter::builder(RPM)
        .window(WINDOW)
        .clock(clock.clone())
        .observer(Arc::new(NoopObserver))
        .build()
        .unwrap();
    let breaker = CircuitBreaker::builder()
        .clock(clock.clone())
        .observer(Arc::new(NoopObserver))
        .build()
        .unwrap();
    (clock, limiter, breaker)
}

type Governor = governor::DefaultKeyedRateLimiter<TenantId>;

fn governor() -> Governor {
    // A quota no benchmark reaches: every check is an admission, like ours.
    governor::RateLimiter::keyed(governor::Quota::per_second(NonZeroU32::new(u32::MAX).unwrap()))
}

fn recloser() -> recloser::Recloser {
    recloser::Recloser::custom().closed_len(100).build()
}

fn bench(c: &mut Criterion) {
    let tenant = TenantId::from_u128(42);

    let mut g = c.benchmark_group("acquire");
    let (clock, limiter, _) = ours();
    g.bench_function("redstring", |b| {
        b.iter(|| {
            clock.advance(STEP);
            ready(limiter.acquire(tenant)).unwrap()
        })
    });
    let gov = governor();
    g.bench_function("governor", |b| b.iter(|| gov.check_key(&tenant).unwrap()));
    g.finish();

    let mut g = c.benchmark_group("breaker");
    let (_, _, breaker) = ours();
    g.bench_function("redstring", |b| {
        b.iter(|| {
            assert!(ready(breaker.allow_request()));
            ready(breaker.record_success()).unwrap()
        })
    });
    let rec = recloser();
    g.bench_function("recloser", |b| b.iter(|| rec.call(|| Ok::<_, ()>(())).unwrap()));
    g.finish();

    let mut g = c.benchmark_group("hot_path");
    let (clock, limiter, breaker) = ours();
    g.bench_function("redstring", |b| {
        b.iter(|| {
            clock.advance(STEP);
            assert!(ready(breaker.allow_request()));
            ready(limiter.acquire(tenant)).unwrap();
            ready(breaker.record_success()).unwrap()
        })
    });
    let (gov, rec) = (governor(), recloser());
    g.bench_function("governor+recloser", |b| {
        b.iter(|| {
            rec.call(|| {
                gov.check_key(&tenant).unwrap();
                Ok::<_, ()>(())
            })
            .unwrap()
        })
    });
    g.finish();

    let mut g = c.benchmark_group("acquire_1000_tenants");
    let tenants: Vec<TenantId> = (0..1_000u128).map(TenantId::from_u128).collect();
    let (clock, limiter, _) = ours();
    let mut i = 0usize;
    g.bench_function("redstring", |b| {
        b.iter(|| {
            i = (i + 1) % tenants.len();
            if i == 0 {
                clock.advance(STEP);
            }
            ready(limiter.acquire(tenants[i])).unwrap()
        })
    });
    let gov = governor();
    let mut j = 0usize;
    g.bench_function("governor", |b| {
        b.iter(|| {
            j = (j + 1) % tenants.len();
            gov.check_key(&tenants[j]).unwrap()
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
