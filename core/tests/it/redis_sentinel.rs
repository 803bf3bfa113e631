//! `RedisCache` over the primary a Sentinel names: the compliance suite and
//! the fleet race on a primary with a replica, and failover — the primary
//! killed while 50 tasks acquire — under each of the limiter's
//! cache-unavailable policies: bounded over-admission during the gap, no
//! panic, and calls decided by the store again soon after the Sentinel
//! promotes the replica.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use crate::support;
use crate::support::redis::{LiveRedis, OnLive, wait};
use redstring::DecidedBy;
use redstring::cache::KeyValue;
use redstring::cache::redis::RedisCache;
use redstring::testing::run_all;
use redstring::{
    AcquireError, CacheError, Clock, Env, Event, OnCacheUnavailable, RateLimiter, RecordingObserver, SystemClock,
    TenantId, Timestamp,
};
use testkit::redis::SentinelGroup;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sentinel_cache_passes_the_compliance_suite() {
    let Some(group) = SentinelGroup::start() else { return };
    run_all(&OnLive(group)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_tasks_over_five_sentinel_connections_admit_exactly_rpm() {
    let Some(group) = SentinelGroup::start() else { return };
    let (admitted, limited, _) = support::redis::race_one_tenant(|| group.cache(), 5, 50, 10).await;
    assert_eq!((admitted, limited), (10, 40));
    // The writes reached the replica too.
    group.sync_replica();
    let replica = group.replica_command(&["ZCARD", &format!("{{kg:ratelimit:{}}}:hits", TenantId::from_u128(42))]);
    assert_eq!(replica.as_deref().map(str::trim), Some(":10"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sentinel_configurations_are_typed_errors() {
    let none: [&str; 0] = [];
    let e = RedisCache::builder().build_sentinel("m", none).unwrap_err();
    assert_eq!(e.field, "sentinels");
    let e = RedisCache::builder()
        .build_sentinel("", ["redis://127.0.0.1:26379"])
        .unwrap_err();
    assert_eq!(e.field, "master_name");
    let e = RedisCache::builder()
        .build_sentinel("m", ["unix:///tmp/s.sock?pass=hunter2"])
        .unwrap_err();
    assert_eq!(e.field, "sentinels");
    assert!(!e.to_string().contains("hunter2"), "{e}");
    let builder = RedisCache::builder().sentinel_master_password("hunter2");
    assert!(!format!("{builder:?}").contains("hunter2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sentinel_answering_is_unavailable() {
    let port = testkit::redis::free_port();
    let cache = RedisCache::builder()
        .connect_timeout(Duration::from_millis(200))
        .response_timeout(Duration::from_millis(200))
        .build_sentinel("m", [format!("redis://127.0.0.1:{port}")])
        .unwrap();
    let e = support::redis::bounded(cache.get("k")).await.unwrap_err();
    assert!(matches!(e, CacheError::Unavailable { .. }), "{e:?}");
}

/// What one failover run saw.
#[derive(Debug, Default)]
struct Failover {
    /// Admissions before the kill (the store's, exactly `rpm`).
    before: u32,
    /// Admissions from the kill to the end, by who decided them.
    gap_store: u32,
    gap_local: u32,
    gap_unlimited: u32,
    /// Acquires that failed with a cache error (policy `Refuse`).
    unavailable: u32,
    /// From the kill until the Sentinel named the replica.
    promotion: Duration,
    /// From the promotion until the first decision by the store.
    recovery: Duration,
}

/// The real time from `a` to `b`.
fn between(a: Timestamp, b: Timestamp) -> Duration {
    Duration::from_micros(b.as_micros().saturating_sub(a.as_micros()))
}

const RPM: u32 = 20;
const WORKERS: usize = 5;
const TASKS: usize = 50;

/// Kills the primary while `TASKS` tasks over `WORKERS` limiters acquire one
/// tenant's slots in a loop, and reports what the gap allowed.
async fn failover_under(policy: OnCacheUnavailable) -> Option<Failover> {
    let mut group = SentinelGroup::start()?;
    let observer = Arc::new(RecordingObserver::new());
    let limiters: Vec<_> = (0..WORKERS)
        .map(|_| {
            Arc::new(
                RateLimiter::builder(RPM)
                    .window(Duration::from_secs(60))
                    .cache(Arc::new(group.cache()))
                    .on_cache_unavailable(policy)
                    .env(Env::default().with_observer(observer.clone()))
                    .build()
                    .unwrap(),
            )
        })
        .collect();
    let tenant = TenantId::from_u128(42);
    let stop = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new(AtomicU32::new(0));
    let unavailable = Arc::new(AtomicU32::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let limiter = limiters[i % WORKERS].clone();
            let (stop, admitted, unavailable) = (stop.clone(), admitted.clone(), unavailable.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    match limiter.acquire(tenant).await {
                        Ok(_) => {
                            admitted.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(AcquireError::Limited(_)) => {}
                        Err(AcquireError::Cache(CacheError::Unavailable { .. })) => {
                            unavailable.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(other) => panic!("unexpected error: {other:?}"),
                    }
                    SystemClock.sleep(Duration::from_millis(10)).await;
                }
            })
        })
        .collect();
    // The store fills the window, and the replica has every hit.
    while admitted.load(Ordering::SeqCst) < RPM {
        SystemClock.sleep(Duration::from_millis(10)).await;
    }
    wait(Duration::from_millis(200)).await;
    group.sync_replica();
    let before = admitted.load(Ordering::SeqCst);
    assert_eq!(before, RPM, "the store admits exactly rpm before the failover");
    let mut events = observer.take();
    assert!(events.iter().all(|e| match e {
        Event::RateLimitAdmitted { decided_by, .. } | Event::RateLimitRefused { decided_by, .. } =>
            *decided_by == DecidedBy::Store,
        _ => true,
    }));
    events.clear();

    let killed = SystemClock.now();
    group.kill_primary();
    let group = Arc::new(group);
    let g = group.clone();
    tokio::task::spawn_blocking(move || testkit::redis::wait_until("the replica is promoted", || g.replica_promoted()))
        .await
        .unwrap();
    let promoted = SystemClock.now();
    // Calls are decided by the store again within 10 s of the promotion.
    let recovered = loop {
        let fresh = observer.take();
        let by_store = fresh.iter().any(|e| {
            matches!(
                e,
                Event::RateLimitAdmitted {
                    decided_by: DecidedBy::Store,
                    ..
                } | Event::RateLimitRefused {
                    decided_by: DecidedBy::Store,
                    ..
                }
            )
        });
        events.extend(fresh);
        if by_store {
            break SystemClock.now();
        }
        assert!(
            between(promoted, SystemClock.now()) < Duration::from_secs(10),
            "no decision by the store 10 s after the promotion"
        );
        SystemClock.sleep(Duration::from_millis(10)).await;
    };
    // Let the recovered fleet run a little, then stop it.
    wait(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.expect("no acquiring task panicked");
    }
    events.extend(observer.take());
    let mut run = Failover {
        before,
        unavailable: unavailable.load(Ordering::SeqCst),
        promotion: between(killed, promoted),
        recovery: between(promoted, recovered),
        ..Failover::default()
    };
    for e in &events {
        if let Event::RateLimitAdmitted { decided_by, .. } = e {
            match decided_by {
                DecidedBy::Store => run.gap_store += 1,
                DecidedBy::Local => run.gap_local += 1,
                DecidedBy::Unlimited => run.gap_unlimited += 1,
            }
        }
    }
    assert_eq!(
        run.before + run.gap_store + run.gap_local + run.gap_unlimited,
        admitted.load(Ordering::SeqCst),
        "every admission was reported"
    );
    // The promoted replica had every hit: the store admitted nothing more.
    assert_eq!(run.gap_store, 0, "{run:?}");
    eprintln!(
        "failover under {policy:?}: promoted {:?} after the kill, store deciding {:?} after that; {run:?}",
        run.promotion, run.recovery
    );
    Some(run)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_under_local_limit_over_admits_at_most_rpm_per_worker() {
    let Some(run) = failover_under(OnCacheUnavailable::LocalLimit).await else {
        return;
    };
    assert_eq!(run.gap_unlimited, 0, "{run:?}");
    assert!(run.gap_local <= RPM * WORKERS as u32, "{run:?}");
    assert!(run.gap_local > 0, "the gap was served locally: {run:?}");
    assert_eq!(run.unavailable, 0, "{run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_under_refuse_admits_nothing_beyond_rpm() {
    let Some(run) = failover_under(OnCacheUnavailable::Refuse).await else {
        return;
    };
    assert_eq!((run.gap_local, run.gap_unlimited), (0, 0), "{run:?}");
    assert!(run.unavailable > 0, "the gap refused calls: {run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_under_admit_admits_only_unlimited_during_the_gap() {
    let Some(run) = failover_under(OnCacheUnavailable::Admit).await else {
        return;
    };
    assert_eq!(run.gap_local, 0, "{run:?}");
    assert!(run.gap_unlimited > 0, "the gap admitted without a limit: {run:?}");
    assert_eq!(run.unavailable, 0, "{run:?}");
}
