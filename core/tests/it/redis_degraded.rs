//! A misbehaving Redis degrades the way the policies say: a server refusing
//! writes (out of memory, a replica after a failover) is `Unavailable` and the
//! components' fallbacks apply; a wrong or missing password is one clear,
//! permanent error; keys corrupted by a foreign writer heal on the next write.

use std::sync::Arc;
use std::time::Duration;

use crate::support::redis::{LiveRedis, bounded};
use redstring::cache::redis::{RedisCache, window_key};
use redstring::cache::{BreakerStore, HitWindow, KeyValue, LimiterStore, SlotRequest};
use redstring::decide::breaker::{BreakerCommand, BreakerKeys, BreakerParams, Origin};
use redstring::decide::window::SlotOutcome;
use redstring::{
    AcquireError, CacheError, CircuitBreaker, CircuitState, Clock, Env, Event, ManualClock, OnCacheError,
    OnCacheUnavailable, RateLimiter, RecordingObserver, SystemClock, TenantId,
};
use testkit::redis::RedisServer;

fn request(now: redstring::Timestamp) -> SlotRequest {
    SlotRequest {
        now,
        window: Duration::from_secs(60),
        limit: 2,
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

fn assert_unavailable<T: std::fmt::Debug>(result: Result<T, CacheError>, operation: &str, code: &str) {
    match result {
        Err(e @ CacheError::Unavailable { .. }) => {
            let CacheError::Unavailable { operation: op, reason } = &e else {
                unreachable!()
            };
            assert_eq!(*op, operation);
            assert!(reason.contains(code), "{operation}: {reason} should name {code}");
            assert!(e.is_transient());
        }
        other => panic!("{operation}: expected Unavailable ({code}), got {other:?}"),
    }
}

fn ok(reply: Option<String>) {
    let reply = reply.expect("server reachable");
    assert!(reply.starts_with('+') || reply.starts_with(':'), "{reply}");
}

fn unavailable_events(observer: &RecordingObserver) -> Vec<(&'static str, String)> {
    observer
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::CacheUnavailable { fallback, error, .. } => Some((*fallback, error.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_out_of_memory_is_unavailable_and_the_policies_apply() {
    let Some(server) = RedisServer::start() else { return };
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let cache = server.cache();
    let keys = BreakerKeys::new("oom");
    cache.set("before", "v", None).await.unwrap();

    ok(server.command(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]));
    ok(server.command(&["CONFIG", "SET", "maxmemory", "1"]));

    // Plain commands and writes inside scripts alike.
    assert_unavailable(bounded(cache.set("k", "v", None)).await, "set", "OOM");
    assert_unavailable(bounded(cache.increment("n", None)).await, "increment", "OOM");
    assert_unavailable(
        bounded(cache.record_hit("w", clock.now(), Duration::from_secs(60))).await,
        "record_hit",
        "OOM",
    );
    assert_unavailable(
        bounded(cache.acquire_slot("t", request(clock.now()))).await,
        "acquire_slot",
        "OOM",
    );
    assert_unavailable(
        bounded(cache.breaker_step(
            &keys,
            BreakerCommand::RecordFailure(Origin::Untracked),
            params(),
            clock.now(),
        ))
        .await,
        "breaker_step",
        "OOM",
    );
    // Reads still answer.
    assert_eq!(cache.get("before").await.unwrap().as_deref(), Some("v"));

    // The limiter's policy applies, with an event each time.
    let observer = Arc::new(RecordingObserver::new());
    let limiter = RateLimiter::builder(2)
        .cache(Arc::new(server.cache()))
        .env(Env::default().with_clock(clock.clone()).with_observer(observer.clone()))
        .on_cache_unavailable(OnCacheUnavailable::LocalLimit)
        .build()
        .unwrap();
    let tenant = TenantId::from_u128(3);
    assert!(bounded(limiter.acquire(tenant)).await.is_ok());
    assert!(bounded(limiter.acquire(tenant)).await.is_ok());
    assert!(matches!(
        bounded(limiter.acquire(tenant)).await,
        Err(AcquireError::Limited(_))
    ));
    let events = unavailable_events(&observer);
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(events.iter().all(|(f, e)| *f == "local limit" && e.contains("OOM")));

    // The breaker: a transition the server cannot store falls back to
    // OnCacheError, with an event.
    ok(server.command(&["CONFIG", "SET", "maxmemory", "0"]));
    let breaker_events = Arc::new(RecordingObserver::new());
    let breaker = CircuitBreaker::builder()
        .failure_threshold(1)
        .recovery_timeout(Duration::from_micros(1))
        .key_prefix("oom-breaker")
        .cache(Arc::new(server.cache()))
        .env(
            Env::default()
                .with_clock(clock.clone())
                .with_observer(breaker_events.clone()),
        )
        .on_cache_error(OnCacheError::Refuse)
        .build()
        .unwrap();
    breaker.record_failure().await.unwrap();
    clock.advance(Duration::from_secs(1));
    ok(server.command(&["CONFIG", "SET", "maxmemory", "1"]));
    // Open past its recovery timeout: the move to half-open is a write the
    // server refuses, so the breaker answers by its policy.
    assert!(!bounded(breaker.allow_request()).await);
    let events = unavailable_events(&breaker_events);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "refused");
    assert!(events[0].1.contains("OOM"), "{events:?}");

    // Memory back: everything answers again on the same caches.
    ok(server.command(&["CONFIG", "SET", "maxmemory", "0"]));
    cache.set("k", "v", None).await.unwrap();
    assert!(matches!(
        cache.acquire_slot("t", request(clock.now())).await,
        Ok(SlotOutcome::Admitted { .. })
    ));
    assert!(breaker.allow_request().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_refusing_writes_is_unavailable() {
    let Some(server) = RedisServer::start() else { return };
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let cache = server.cache();
    // A replica of a master that is nowhere: READONLY for every write.
    ok(server.command(&["REPLICAOF", "127.0.0.1", "1"]));
    assert_unavailable(bounded(cache.set("k", "v", None)).await, "set", "READONLY");
    assert_unavailable(
        bounded(cache.acquire_slot("t", request(clock.now()))).await,
        "acquire_slot",
        "READONLY",
    );
    ok(server.command(&["REPLICAOF", "NO", "ONE"]));
    cache.set("k", "v", None).await.unwrap();
}

const SECRET: &str = "hunter2-do-not-print";

fn assert_authentication_error(error: &CacheError, target: &str) {
    let text = format!("{error} {error:?}");
    assert!(!text.contains("hunter2"), "password leaked: {text}");
    assert!(
        matches!(error, CacheError::Authentication { .. }),
        "expected an authentication error, got {error:?}"
    );
    assert!(!error.is_transient());
    assert!(text.contains("authentication failed"), "{text}");
    assert!(text.contains("wrong or missing password"), "{text}");
    assert!(text.contains(target), "{text} should name {target}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_or_missing_password_is_one_clear_permanent_error() {
    let Some(server) = RedisServer::start_with_password(SECRET) else {
        return;
    };
    let socket = server.socket().display().to_string();
    let wrong = RedisCache::from_url(&format!("unix://{socket}?pass=hunter2-wrong")).unwrap();
    let missing = RedisCache::from_url(&format!("unix://{socket}")).unwrap();
    for cache in [&wrong, &missing] {
        // At first use, and on every use after.
        for _ in 0..2 {
            let error = bounded(cache.get("k")).await.unwrap_err();
            assert_authentication_error(&error, &socket);
            let error = bounded(cache.acquire_slot("t", request(SystemClock.now())))
                .await
                .unwrap_err();
            assert_authentication_error(&error, &socket);
        }
    }

    // Not routed to the unavailable policy: the limiter says what is wrong.
    for cache in [wrong, missing] {
        let observer = Arc::new(RecordingObserver::new());
        let limiter = RateLimiter::builder(2)
            .cache(Arc::new(cache))
            .env(Env::default().with_observer(observer.clone()))
            .on_cache_unavailable(OnCacheUnavailable::LocalLimit)
            .build()
            .unwrap();
        match bounded(limiter.acquire(TenantId::from_u128(1))).await {
            Err(AcquireError::Cache(e)) => assert_authentication_error(&e, &socket),
            other => panic!("expected the authentication error, got {other:?}"),
        }
        assert!(unavailable_events(&observer).is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_typed_breaker_keys_are_reported_and_replaced() {
    let Some(server) = RedisServer::start() else { return };
    let keys = BreakerKeys::new("corrupt");
    ok(server.command(&["HSET", &keys.state, "a", "b"]));
    ok(server.command(&["ZADD", &keys.failures, "1", "x"]));
    ok(server.command(&["SADD", &keys.opened_at, "x"]));
    ok(server.command(&["LPUSH", &keys.probes, "x"]));
    let observer = Arc::new(RecordingObserver::new());
    let cache = Arc::new(server.cache());
    let breaker = CircuitBreaker::builder()
        .failure_threshold(2)
        .key_prefix("corrupt")
        .cache(cache.clone())
        .env(Env::default().with_observer(observer.clone()))
        .build()
        .unwrap();
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Closed);
    assert!(breaker.allow_request().await);
    let unreadable = observer
        .events()
        .iter()
        .filter(|e| matches!(e, Event::BreakerStateUnreadable { .. }))
        .count();
    assert!(unreadable >= 2, "{:?}", observer.events());
    // The next writes replace the foreign values.
    breaker.record_failure().await.unwrap();
    assert_eq!(cache.get(&keys.failures).await.unwrap().as_deref(), Some("1"));
    breaker.record_failure().await.unwrap();
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Open);
    assert_eq!(cache.get(&keys.state).await.unwrap().as_deref(), Some("open"));
    assert!(cache.get(&keys.opened_at).await.unwrap().is_some());
    breaker.reset().await.unwrap();
    ok(server.command(&["LPUSH", &keys.probes, "x"]));
    assert!(breaker.allow_request().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_typed_window_is_replaced_by_the_next_hit() {
    let Some(server) = RedisServer::start() else { return };
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let cache = Arc::new(server.cache());
    let window = window_key("w");
    ok(server.command(&["SET", &window, "garbage"]));
    assert_eq!(cache.count_since("w", clock.now()).await.unwrap(), 0);
    assert_eq!(cache.oldest_since("w", clock.now()).await.unwrap(), None);
    cache
        .record_hit("w", clock.now(), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(cache.count_since("w", clock.now()).await.unwrap(), 1);

    // The limiter's window, corrupted under a running limiter.
    let limiter = RateLimiter::builder(2)
        .cache(cache.clone())
        .env(Env::default().with_clock(clock.clone()))
        .build()
        .unwrap();
    let tenant = TenantId::from_u128(5);
    let tenant_window = window_key(&format!("kg:ratelimit:{tenant}"));
    ok(server.command(&["HSET", &tenant_window, "a", "b"]));
    assert_eq!(limiter.acquire(tenant).await.unwrap().remaining, 1);
    let ttl = server.command(&["PTTL", &tenant_window]).unwrap();
    let ms: i64 = ttl.trim().trim_start_matches(':').parse().unwrap();
    assert!(ms > 0, "the window has a TTL: {ttl}");
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    let reply = server.command(&["PTTL", key]).unwrap();
    reply.trim().trim_start_matches(':').parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_without_ttl_gets_one_even_when_refused() {
    let Some(server) = RedisServer::start() else { return };
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let cache = server.cache();
    let window = window_key("t");
    cache
        .record_hit("t", clock.now(), Duration::from_secs(60))
        .await
        .unwrap();
    cache
        .record_hit("t", clock.now(), Duration::from_secs(60))
        .await
        .unwrap();
    ok(server.command(&["PERSIST", &window]));
    assert_eq!(pttl(&server, &window), -1);
    assert!(matches!(
        cache.acquire_slot("t", request(clock.now())).await.unwrap(),
        SlotOutcome::Refused { .. }
    ));
    let ms = pttl(&server, &window);
    assert!(ms > 0 && ms <= 120_000, "PTTL {ms}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_infinite_score_holds_no_slot() {
    let Some(server) = RedisServer::start() else { return };
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let cache = server.cache();
    let window = window_key("t");
    ok(server.command(&["ZADD", &window, "+inf", "x", "+inf", "y"]));
    assert_eq!(cache.count_since("t", clock.now()).await.unwrap(), 0);
    assert_eq!(cache.oldest_since("t", clock.now()).await.unwrap(), None);
    match cache.acquire_slot("t", request(clock.now())).await.unwrap() {
        SlotOutcome::Admitted { remaining, .. } => assert_eq!(remaining, 1),
        other => panic!("the infinite hits held the slots: {other:?}"),
    }
    assert!(pttl(&server, &window) > 0);
}
