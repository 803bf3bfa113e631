//! Faults on a real Redis: a dead server is a typed `Unavailable` within the
//! timeout, the limiter's and the breaker's policies hold meanwhile, the
//! adapter recovers by itself when the server returns, and a password never
//! leaks into errors or `Debug`.

use std::sync::Arc;
use std::time::Duration;

use crate::support::redis::{LiveRedis, bounded, wait};
use redstring::cache::redis::{ConnectionManager, RedisCache};
use redstring::cache::{BreakerStore, KeyValue, LimiterStore, SlotRequest};
use redstring::decide::breaker::{BreakerCommand, BreakerKeys, BreakerParams, Origin};
use redstring::decide::window::SlotOutcome;
use redstring::{
    AcquireError, Cache, CacheError, CircuitBreaker, Clock, Env, Event, ManualClock, OnCacheError, OnCacheUnavailable,
    RateLimiter, RecordingObserver, SystemClock, TenantId,
};
use testkit::redis::RedisServer;

fn request(now: redstring::Timestamp) -> SlotRequest {
    SlotRequest {
        now,
        window: Duration::from_secs(60),
        limit: 5,
        ttl: Duration::from_secs(120),
        max_ahead: Duration::ZERO,
    }
}

fn params() -> BreakerParams {
    BreakerParams {
        failure_threshold: 1,
        recovery_timeout: Duration::from_secs(60),
        max_recovery_timeout: Duration::from_secs(60),
        half_open_max_calls: 1,
        probe_lease: Duration::from_secs(60),
    }
}

fn assert_unavailable<T: std::fmt::Debug>(result: Result<T, CacheError>, operation: &str) {
    match result {
        Err(CacheError::Unavailable { operation: op, .. }) => assert_eq!(op, operation),
        other => panic!("{operation}: expected Unavailable, got {other:?}"),
    }
}

/// Polls until the cache answers again (the server was restarted); the cache
/// is never rebuilt.
async fn until_recovered(cache: &RedisCache) {
    for _ in 0..200 {
        if bounded(cache.get("probe")).await.is_ok() {
            return;
        }
        wait(Duration::from_millis(50)).await;
    }
    panic!("the cache did not recover after the server came back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_unavailable_and_the_same_cache_recovers() {
    let Some(mut server) = RedisServer::start() else { return };
    let cache = server.cache();
    let keys = BreakerKeys::new("faults");
    cache.set("k", "v", None).await.unwrap();
    assert!(matches!(
        cache.acquire_slot("t", request(SystemClock.now())).await.unwrap(),
        SlotOutcome::Admitted { remaining: 4, .. }
    ));

    server.kill();
    assert_unavailable(bounded(cache.get("k")).await, "get");
    assert_unavailable(
        bounded(cache.acquire_slot("t", request(SystemClock.now()))).await,
        "acquire_slot",
    );
    assert_unavailable(
        bounded(cache.breaker_step(
            &keys,
            BreakerCommand::RecordFailure(Origin::Untracked),
            params(),
            SystemClock.now(),
        ))
        .await,
        "breaker_step",
    );
    assert_unavailable(bounded(cache.increment("n", None)).await, "increment");
    assert!(bounded(cache.get("k")).await.unwrap_err().is_transient());

    server.restart();
    until_recovered(&cache).await;
    // The restarted server is empty and has no scripts loaded: the first
    // EVALSHA gets NOSCRIPT and the adapter loads the script itself.
    assert!(matches!(
        cache.acquire_slot("t", request(SystemClock.now())).await.unwrap(),
        SlotOutcome::Admitted { remaining: 4, .. }
    ));
    let step = cache
        .breaker_step(
            &keys,
            BreakerCommand::RecordFailure(Origin::Untracked),
            params(),
            SystemClock.now(),
        )
        .await
        .unwrap();
    assert!(step.allowed());
    assert_eq!(cache.get(&keys.state).await.unwrap().as_deref(), Some("open"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_answering_times_out_as_unavailable() {
    let Some(server) = RedisServer::start() else { return };
    let cache = server.cache();
    cache.set("k", "v", None).await.unwrap();
    server.pause();
    // The connection is up but nothing answers: only the timeout ends the call.
    let error = bounded(cache.acquire_slot("t", request(SystemClock.now())))
        .await
        .unwrap_err();
    assert_unavailable::<()>(Err(error), "acquire_slot");
    assert_unavailable(bounded(cache.get("k")).await, "get");
    server.resume();
    until_recovered(&cache).await;
    assert_eq!(cache.get("k").await.unwrap().as_deref(), Some("v"));
}

#[tokio::test]
async fn scripts_flushed_from_the_server_are_reloaded() {
    let Some(server) = RedisServer::start() else { return };
    let cache = server.cache();
    let now = SystemClock.now();
    cache.acquire_slot("t", request(now)).await.unwrap();
    assert!(server.command(&["SCRIPT", "FLUSH"]).unwrap().starts_with("+OK"));
    assert!(matches!(
        cache.acquire_slot("t", request(now)).await.unwrap(),
        SlotOutcome::Admitted { remaining: 3, .. }
    ));
}

#[tokio::test]
async fn construction_never_touches_a_dead_server() {
    let Some(mut server) = RedisServer::start() else { return };
    server.kill();
    // Nothing listens on the socket; building still succeeds at once.
    let cache = server.cache();
    assert_unavailable(bounded(cache.get("k")).await, "get");
    server.restart();
    until_recovered(&cache).await;
}

fn fallbacks(observer: &RecordingObserver) -> Vec<&'static str> {
    observer
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::CacheUnavailable {
                fallback, operation, ..
            } => {
                assert_eq!(*operation, "acquire_slot");
                Some(*fallback)
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limiters_policy_applies_while_redis_is_down_and_stops_when_it_returns() {
    let Some(mut server) = RedisServer::start() else { return };
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let tenant = TenantId::from_u128(9);
    let limiter = |policy: OnCacheUnavailable, observer: Arc<RecordingObserver>| {
        RateLimiter::builder(2)
            .cache(Arc::new(server.cache()))
            .env(Env::default().with_clock(clock.clone()).with_observer(observer))
            .on_cache_unavailable(policy)
            .build()
            .unwrap()
    };
    let (local_events, admit_events, refuse_events) = (
        Arc::new(RecordingObserver::new()),
        Arc::new(RecordingObserver::new()),
        Arc::new(RecordingObserver::new()),
    );
    let local = limiter(OnCacheUnavailable::LocalLimit, local_events.clone());
    let admit = limiter(OnCacheUnavailable::Admit, admit_events.clone());
    let refuse = limiter(OnCacheUnavailable::Refuse, refuse_events.clone());
    let default = RateLimiter::builder(2).cache(Arc::new(server.cache())).build().unwrap();
    assert!(
        format!("{default:?}").contains("LocalLimit"),
        "the default: {default:?}"
    );

    server.kill();

    // Local limit: this process still holds the tenant to rpm.
    assert!(bounded(local.acquire(tenant)).await.is_ok());
    assert!(bounded(local.acquire(tenant)).await.is_ok());
    match bounded(local.acquire(tenant)).await {
        Err(AcquireError::Limited(e)) => assert_eq!(e.retry_after, Duration::from_secs(60) + Duration::from_micros(1)),
        other => panic!("expected a local refusal, got {other:?}"),
    }
    assert_eq!(fallbacks(&local_events), ["local limit"; 3]);

    // Fail open: everything is admitted, with nothing known about what remains.
    for _ in 0..4 {
        assert_eq!(bounded(admit.acquire(tenant)).await.unwrap().remaining, 0);
    }
    assert_eq!(fallbacks(&admit_events), ["allowed"; 4]);

    // Fail closed: the cache error is the answer.
    match bounded(refuse.acquire(tenant)).await {
        Err(AcquireError::Cache(e @ CacheError::Unavailable { .. })) => assert!(e.is_transient()),
        other => panic!("expected a cache error, got {other:?}"),
    }
    assert!(
        bounded(refuse.acquire(tenant))
            .await
            .unwrap_err()
            .retry_after()
            .is_none()
    );
    assert_eq!(fallbacks(&refuse_events), ["refused"; 2]);

    server.restart();
    for limiter in [&local, &admit, &refuse] {
        until_recovered(limiter.cache()).await;
    }
    // Back on the shared cache (empty after the restart): the three limiters
    // share one allowance of 2 again, and no more fallbacks are reported.
    assert_eq!(local.acquire(tenant).await.unwrap().remaining, 1);
    assert_eq!(admit.acquire(tenant).await.unwrap().remaining, 0);
    assert!(matches!(refuse.acquire(tenant).await, Err(AcquireError::Limited(_))));
    assert_eq!(fallbacks(&local_events).len(), 3);
    assert_eq!(fallbacks(&admit_events).len(), 4);
    assert_eq!(fallbacks(&refuse_events).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breakers_cache_error_policy_holds_against_a_dead_redis() {
    let Some(mut server) = RedisServer::start() else { return };
    let breaker = |policy: OnCacheError, observer: Arc<RecordingObserver>| {
        CircuitBreaker::builder()
            .failure_threshold(1)
            .cache(Arc::new(server.cache()))
            .on_cache_error(policy)
            .env(Env::default().with_observer(observer))
            .build()
            .unwrap()
    };
    let allow_events = Arc::new(RecordingObserver::new());
    let refuse_events = Arc::new(RecordingObserver::new());
    let allow = breaker(OnCacheError::default(), allow_events.clone());
    let refuse = breaker(OnCacheError::Refuse, refuse_events.clone());
    server.kill();
    assert!(
        bounded(allow.allow_request()).await,
        "the default fails toward calling the model"
    );
    assert!(!bounded(refuse.allow_request()).await);
    assert_unavailable(bounded(allow.record_failure()).await, "breaker_step");
    assert_unavailable(bounded(allow.state()).await, "breaker_read");
    let fallback = |o: &RecordingObserver| {
        o.events()
            .iter()
            .find_map(|e| match e {
                Event::CacheUnavailable { fallback, .. } => Some(*fallback),
                _ => None,
            })
            .expect("a CacheUnavailable event")
    };
    assert_eq!(fallback(&allow_events), "allowed");
    assert_eq!(fallback(&refuse_events), "refused");
    server.restart();
    until_recovered(allow.cache()).await;
    until_recovered(refuse.cache()).await;
    assert!(allow.allow_request().await);
    allow.record_failure().await.unwrap();
    assert_eq!(
        refuse.state().await.unwrap(),
        redstring::CircuitState::Open,
        "one shared circuit"
    );
    assert!(!allow.allow_request().await);
}

const SECRET: &str = "hunter2-do-not-print";

fn assert_no_secret(text: &str) {
    assert!(!text.contains(SECRET), "password leaked: {text}");
    assert!(!text.contains("hunter2"), "password leaked: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_never_reaches_debug_or_errors() {
    let Some(mut server) = RedisServer::start_with_password(SECRET) else {
        return;
    };
    let cache = server.cache();
    cache.set("k", "v", None).await.unwrap();
    assert_eq!(cache.get("k").await.unwrap().as_deref(), Some("v"));
    let debug = format!("{cache:?}");
    assert_no_secret(&debug);
    assert!(debug.contains("pass=***"), "{debug}");
    assert_no_secret(cache.target());

    // A wrong password is refused; the refusal does not echo it.
    let wrong = RedisCache::from_url(&format!("unix://{}?pass=hunter2-wrong", server.socket().display())).unwrap();
    let error = bounded(wrong.get("k")).await.unwrap_err();
    assert_no_secret(&format!("{error} {error:?} {wrong:?}"));

    server.kill();
    let error = bounded(cache.get("k")).await.unwrap_err();
    assert!(error.is_transient());
    assert_no_secret(&format!("{error} {error:?}"));

    // TCP URLs, and URLs that do not parse.
    let tcp = RedisCache::from_url(&format!("redis://user:{SECRET}@127.0.0.1:1/0")).unwrap();
    assert_eq!(tcp.target(), "redis://user:***@127.0.0.1:1/0");
    let error = bounded(tcp.get("k")).await.unwrap_err();
    assert!(error.is_transient());
    assert_no_secret(&format!("{error} {error:?} {tcp:?}"));
    let error = RedisCache::from_url(&format!("nonsense://:{SECRET}@host")).unwrap_err();
    assert_no_secret(&format!("{error} {error:?}"));
}

#[tokio::test]
async fn close_releases_an_owned_connection_but_never_the_callers() {
    let Some(server) = RedisServer::start() else { return };
    let owned = server.cache();
    assert!(owned.owns_connection());
    owned.set("k", "v", None).await.unwrap();
    owned.close().await.unwrap();
    owned.close().await.unwrap();
    assert!(matches!(owned.get("k").await, Err(CacheError::Closed)));

    let client = redis::Client::open(server.url()).unwrap();
    let mut mine = ConnectionManager::new(client).await.unwrap();
    let borrowed = RedisCache::from_connection(mine.clone());
    assert!(!borrowed.owns_connection());
    assert_eq!(borrowed.get("k").await.unwrap().as_deref(), Some("v"));
    borrowed.close().await.unwrap();
    assert!(matches!(borrowed.get("k").await, Err(CacheError::Closed)));
    let still_mine: Option<String> = redis::cmd("GET").arg("k").query_async(&mut mine).await.unwrap();
    assert_eq!(still_mine.as_deref(), Some("v"), "the caller's connection stays open");
}

#[tokio::test]
async fn a_limiter_over_a_shared_redis_cache_leaves_it_open() {
    let Some(server) = RedisServer::start() else { return };
    let cache = Arc::new(server.cache());
    let limiter = RateLimiter::builder(1).cache(cache.clone()).build().unwrap();
    limiter.acquire(TenantId::from_u128(1)).await.unwrap();
    limiter.close().await.unwrap();
    assert_eq!(cache.get("absent").await.unwrap(), None);
}
