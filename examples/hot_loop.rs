//! Loops one hot-path operation for an instruction-count profiler.
//!
//! Wall-clock figures need a quiet machine; instruction counts do not. Run a
//! case under `valgrind --tool=callgrind` twice with different iteration
//! counts and divide the difference in instructions by the difference in
//! iterations: that is the instructions one call costs, setup and warm-up
//! excluded.
//!
//! ```text
//! cargo build --profile bench --example hot_loop
//! valgrind --tool=callgrind target/release/examples/hot_loop hot 10000
//! ```
//!
//! Cases: `acquire`, `breaker`, `hot`, `hot_system`, `tenants`, `tenants8`
//! (its decisions over 8 tenants, every series in cache), `tenants1`
//! (1 000 tenants on `SystemClock`, as `tenants2` on one thread),
//! `tenants2` and `hot2` (two threads), `tenants2_apart` (`tenants2` with a
//! limiter per thread: nothing shared, so what sharing costs is the
//! difference), `tenants2_disjoint` (one cache, each thread its own 1 000
//! tenants: the shards shared, the tenants not), `governor`, `recloser`,
//! `governor_recloser`, `governor_tenants`, `governor_tenants1`, and
//! governor's two-thread sides `governor_hot2`, `governor_tenants2`,
//! `governor_tenants2_apart` and `governor_tenants2_disjoint`.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use redstring::{CircuitBreaker, Env, ManualClock, NoopObserver, RateLimiter, SystemClock, TenantId};
use testkit::ready;

const RPM: u32 = 1_000;
const WINDOW: Duration = Duration::from_secs(60);
const STEP: Duration = Duration::from_millis(61);
const WARM_UP: usize = 5_000;

/// `clock`, and no observer.
fn quiet(clock: Arc<dyn redstring::Clock>) -> Env {
    Env::default().with_clock(clock).with_observer(Arc::new(NoopObserver))
}

fn limiter(clock: Arc<dyn redstring::Clock>, rpm: u32, window: Duration) -> RateLimiter {
    RateLimiter::builder(rpm)
        .window(window)
        .env(quiet(clock))
        .build()
        .expect("valid limiter")
}

/// The bench's production-clock limiter: `SystemClock`, a 1 ms window and
/// an rpm never reached, so every call is an admission.
fn system_limiter() -> RateLimiter {
    limiter(Arc::new(SystemClock), u32::MAX, Duration::from_millis(1))
}

fn breaker(clock: Arc<dyn redstring::Clock>) -> CircuitBreaker {
    CircuitBreaker::builder()
        .env(quiet(clock))
        .build()
        .expect("valid breaker")
}

type Governor = governor::DefaultKeyedRateLimiter<TenantId>;

fn governor() -> Governor {
    governor::RateLimiter::keyed(governor::Quota::per_second(NonZeroU32::MAX))
}

fn recloser() -> recloser::Recloser {
    recloser::Recloser::custom().closed_len(100).build()
}

/// Runs `f` for the warm-up and then `iters` times.
fn repeat(iters: usize, mut f: impl FnMut(usize)) {
    for i in 0..WARM_UP + iters {
        f(i);
    }
}

/// Runs `f(thread, i)` as [`repeat`] does on each of two threads at once.
fn on_two_threads(iters: usize, f: impl Fn(usize, usize) + Sync) {
    std::thread::scope(|s| {
        for thread in 0..2 {
            let f = &f;
            s.spawn(move || repeat(iters, |i| f(thread, i)));
        }
    });
}

/// Two sets of 1 000 tenants, one for each of two threads, none in both.
fn disjoint() -> [Vec<TenantId>; 2] {
    let set = |from: u128| (from..from + 1_000).map(TenantId::from_u128).collect();
    [set(0), set(1_000)]
}

/// The tenant thread `thread` takes at step `i`: the two threads walk the
/// tenants from opposite ends, as the bench's `threads2/1000_tenants` does.
fn walked(tenants: &[TenantId], thread: usize, i: usize) -> TenantId {
    let i = i % tenants.len();
    tenants[if thread == 0 { i } else { tenants.len() - 1 - i }]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let case = args.next().unwrap_or_else(|| "hot".to_owned());
    let iters: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let tenant = TenantId::from_u128(42);
    let tenants: Vec<TenantId> = (0..1_000u128).map(TenantId::from_u128).collect();
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    match case.as_str() {
        "acquire" => {
            let l = limiter(clock.clone(), RPM, WINDOW);
            repeat(iters, |_| {
                clock.advance(STEP);
                ready(l.acquire(tenant)).expect("admitted");
            });
        }
        "breaker" => {
            let b = breaker(clock.clone());
            repeat(iters, |_| {
                assert!(ready(b.allow_request()));
                ready(b.record_success()).expect("recorded");
            });
        }
        "hot" => {
            let (l, b) = (limiter(clock.clone(), RPM, WINDOW), breaker(clock.clone()));
            repeat(iters, |_| {
                clock.advance(STEP);
                assert!(ready(b.allow_request()));
                ready(l.acquire(tenant)).expect("admitted");
                ready(b.record_success()).expect("recorded");
            });
        }
        "hot_system" => {
            // As the bench: an rpm never reached, a 1 ms window.
            let (l, b) = (system_limiter(), breaker(Arc::new(SystemClock)));
            repeat(iters, |_| {
                assert!(ready(b.allow_request()));
                ready(l.acquire(tenant)).expect("admitted");
                ready(b.record_success()).expect("recorded");
            });
        }
        "tenants" => {
            let l = limiter(clock.clone(), RPM, WINDOW);
            repeat(iters, |i| {
                let i = i % tenants.len();
                if i == 0 {
                    clock.advance(STEP);
                }
                ready(l.acquire(tenants[i])).expect("admitted");
            });
        }
        "tenants8" => {
            // tenants over 8 tenants, whose series stay in the first-level
            // cache: what the misses over 1 000 cost.
            let l = limiter(clock.clone(), RPM, WINDOW);
            repeat(iters, |i| {
                let i = i % 8;
                if i == 0 {
                    clock.advance(STEP);
                }
                ready(l.acquire(tenants[i])).expect("admitted");
            });
        }
        "tenants2" => {
            // As the bench's threads2/1000_tenants, on the production clock.
            let l = system_limiter();
            on_two_threads(iters, |thread, i| {
                ready(l.acquire(walked(&tenants, thread, i))).expect("admitted");
            });
        }
        "tenants2_apart" => {
            // tenants2 with a limiter per thread: nothing shared.
            let ls = [system_limiter(), system_limiter()];
            on_two_threads(iters, |thread, i| {
                ready(ls[thread].acquire(walked(&tenants, thread, i))).expect("admitted");
            });
        }
        "tenants2_disjoint" => {
            // tenants2 with the threads' tenants apart (1 000 each) and
            // the cache shared: what sharing the shards' locks alone costs.
            let l = system_limiter();
            let own = disjoint();
            on_two_threads(iters, |thread, i| {
                ready(l.acquire(walked(&own[thread], 0, i))).expect("admitted");
            });
        }
        "governor_tenants2_disjoint" => {
            // governor_tenants2 with the threads' tenants apart.
            let g = governor();
            let own = disjoint();
            on_two_threads(iters, |thread, i| {
                g.check_key(&walked(&own[thread], 0, i)).expect("admitted")
            });
        }
        "governor_tenants2_apart" => {
            // governor_tenants2 with a limiter per thread.
            let gs = [governor(), governor()];
            on_two_threads(iters, |thread, i| {
                gs[thread].check_key(&walked(&tenants, thread, i)).expect("admitted")
            });
        }
        "tenants1" => {
            // tenants2 on one thread: what contention costs the pair.
            let l = system_limiter();
            repeat(iters, |i| {
                ready(l.acquire(walked(&tenants, 0, i))).expect("admitted");
            });
        }
        "governor_tenants1" => {
            // governor_tenants2 on one thread.
            let g = governor();
            repeat(iters, |i| g.check_key(&walked(&tenants, 0, i)).expect("admitted"));
        }
        "hot2" => {
            // As the bench's threads2/hot_tenant: two threads on one tenant.
            let l = system_limiter();
            on_two_threads(iters, |_, _| {
                ready(l.acquire(tenant)).expect("admitted");
            });
        }
        "governor_hot2" => {
            // threads2/hot_tenant's governor side.
            let g = governor();
            on_two_threads(iters, |_, _| g.check_key(&tenant).expect("admitted"));
        }
        "governor_tenants2" => {
            // threads2/1000_tenants' governor side.
            let g = governor();
            on_two_threads(iters, |thread, i| {
                g.check_key(&walked(&tenants, thread, i)).expect("admitted")
            });
        }
        "governor" => {
            let g = governor();
            repeat(iters, |_| g.check_key(&tenant).expect("admitted"));
        }
        "governor_tenants" => {
            let g = governor();
            repeat(iters, |i| g.check_key(&tenants[i % tenants.len()]).expect("admitted"));
        }
        "recloser" => {
            let r = recloser();
            repeat(iters, |_| r.call(|| Ok::<_, ()>(())).expect("closed"));
        }
        "governor_recloser" => {
            let (g, r) = (governor(), recloser());
            repeat(iters, |_| {
                r.call(|| {
                    g.check_key(&tenant).expect("admitted");
                    Ok::<_, ()>(())
                })
                .expect("closed")
            });
        }
        other => {
            eprintln!("unknown case {other:?}");
            std::process::exit(2);
        }
    }
}
