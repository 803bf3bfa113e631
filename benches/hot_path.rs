//! The in-process hot path — limiter acquire, breaker allow + record_success,
//! and the two together — beside `governor`'s keyed limiter and `recloser`'s
//! lock-free breaker, in one criterion run.
//!
//! redstring's futures complete without suspending over `MemoryCache`, so they
//! are polled once with a no-op waker: the figures are the code's own cost,
//! not an executor's. The manual clock advances a little more than window /
//! rpm per call, so the window holds about `rpm` hits — the steady
//! state of a tenant at its limit, not an ever-growing series.
//!
//! Two groups read the production clock, as governor does (it reads its own
//! `quanta` clock on every check): `hot_path_system_clock` (one thread) and
//! `threads2` (both cores racing one hot tenant, then 1 000 tenants). There
//! redstring runs on [`SystemClock`] with a 1 ms window and an `rpm` it never
//! reaches — like governor's quota here — so every call is an admission and a
//! series holds about three milliseconds of hits instead of growing.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use redstring::{CircuitBreaker, Env, ManualClock, NoopObserver, RateLimiter, SystemClock, TenantId};
use testkit::ready;

const RPM: u32 = 1_000;
const WINDOW: Duration = Duration::from_secs(60);
const STEP: Duration = Duration::from_millis(61);

/// A limiter and a breaker on the production clock; the limiter admits every
/// call and keeps about three milliseconds of hits per tenant.
fn ours_system() -> (RateLimiter, CircuitBreaker) {
    let env = Env::default()
        .with_clock(Arc::new(SystemClock))
        .with_observer(Arc::new(NoopObserver));
    let limiter = RateLimiter::builder(u32::MAX)
        .window(Duration::from_millis(1))
        .env(env.clone())
        .build()
        .unwrap();
    let breaker = CircuitBreaker::builder().env(env).build().unwrap();
    (limiter, breaker)
}

/// Runs `op(thread, i)` for `iters` iterations on each of two threads at once
/// and returns the wall time: one criterion iteration is two calls.
fn on_two_threads(iters: u64, op: impl Fn(usize, u64) + Sync) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for thread in 0..2 {
            let op = &op;
            s.spawn(move || {
                for i in 0..iters {
                    op(thread, i);
                }
            });
        }
    });
    start.elapsed()
}

fn ours() -> (Arc<ManualClock>, RateLimiter, CircuitBreaker) {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let env = Env::default()
        .with_clock(clock.clone())
        .with_observer(Arc::new(NoopObserver));
    let limiter = RateLimiter::builder(RPM)
        .window(WINDOW)
        .env(env.clone())
        .build()
        .unwrap();
    let breaker = CircuitBreaker::builder().env(env).build().unwrap();
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

    let mut g = c.benchmark_group("hot_path_system_clock");
    let (limiter, breaker) = ours_system();
    g.bench_function("redstring", |b| {
        b.iter(|| {
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

    // Both cores: the throughput criterion reports is calls per second over
    // the two threads together.
    let mut g = c.benchmark_group("threads2");
    g.throughput(Throughput::Elements(2));
    let (limiter, _) = ours_system();
    g.bench_function("hot_tenant/redstring", |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, |_, _| {
                ready(limiter.acquire(tenant)).unwrap();
            })
        })
    });
    let gov = governor();
    g.bench_function("hot_tenant/governor", |b| {
        b.iter_custom(|iters| on_two_threads(iters, |_, _| gov.check_key(&tenant).unwrap()))
    });
    let (limiter, _) = ours_system();
    // The two threads walk the tenants from opposite ends.
    let pick = |thread: usize, i: u64| {
        let i = (i % 1_000) as usize;
        if thread == 0 { i } else { 999 - i }
    };
    g.bench_function("1000_tenants/redstring", |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, |thread, i| {
                ready(limiter.acquire(tenants[pick(thread, i)])).unwrap();
            })
        })
    });
    let gov = governor();
    g.bench_function("1000_tenants/governor", |b| {
        b.iter_custom(|iters| on_two_threads(iters, |thread, i| gov.check_key(&tenants[pick(thread, i)]).unwrap()))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
