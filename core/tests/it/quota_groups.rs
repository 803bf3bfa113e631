//! Key groups: deployments that are keys of one provider account share a
//! spent quota — one key's `insufficient_quota` cools every key of the
//! account, fleet-wide — while a key's own rate limit and its own errors
//! stay with it. Two workers, three deployments (`a` and `b` of account
//! `org`, then `other`), on a `MemoryCache` and on a real Redis.

use std::sync::Arc;
use std::time::Duration;

use crate::support::cooldown::{Scripted, ok, rate_limited, respond};
use crate::support::redis::{LiveRedis, bounded};
use redstring::cache::{BreakerStore, TokenStore};
use redstring::provider::{Deployment, HardenedProvider, LlmProviderExt, OpenAiCompatible};
use redstring::{
    CircuitBreaker, Clock, Env, Event, ManualClock, MemoryCache, Permit, RateLimiter, RecordingObserver, Refusal,
    RetryPolicy, SeededRandom, SystemClock, TenantId,
};
use testkit::redis::RedisServer;

const SPENT: &str = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
const BAD_KEY: &str =
    r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Each deployment behind a breaker of its own.
const OWN: [&str; 3] = ["a", "b", "other"];

/// The three deployments' servers, shared by every worker.
#[derive(Clone, Default)]
struct Servers {
    a: Scripted,
    b: Scripted,
    other: Scripted,
}

/// One worker: a provider over `a`, `b` (both of account `org`) and
/// `other`, in that order, each behind the breaker on `cache` named by
/// `breakers` (one each unless two share a name); up to two retries,
/// jitter off; the breakers, to read their cooldowns.
struct Worker<C> {
    provider: HardenedProvider<OpenAiCompatible<Scripted>, C, C>,
    breakers: Vec<Arc<CircuitBreaker<C>>>,
}

fn worker<C: BreakerStore + TokenStore>(
    cache: &Arc<C>,
    servers: &Servers,
    clock: &Arc<ManualClock>,
    observer: &Arc<RecordingObserver>,
    tenant: u128,
    breakers: [&str; 3],
) -> Worker<C> {
    let env = Env::default().with_clock(clock.clone()).with_observer(observer.clone());
    let limiter = Arc::new(
        RateLimiter::builder(100)
            .env(env.clone())
            .cache(cache.clone())
            .build()
            .unwrap(),
    );
    let deployment = |name: &str, breaker: &str, server: &Scripted| {
        let breaker = Arc::new(
            CircuitBreaker::builder()
                .key_prefix(format!("kg:circuit:{breaker}"))
                .env(env.clone())
                .cache(cache.clone())
                .build()
                .unwrap(),
        );
        let adapter = OpenAiCompatible::builder(format!("http://{name}.test/v1"), "gpt")
            .env(Env::default().with_clock(clock.clone()))
            .build_with(server.clone())
            .unwrap();
        (Deployment::new(adapter, breaker.clone()), breaker)
    };
    let (a, breaker_a) = deployment("a", breakers[0], &servers.a);
    let (b, breaker_b) = deployment("b", breakers[1], &servers.b);
    let (other, breaker_other) = deployment("other", breakers[2], &servers.other);
    let provider = HardenedProvider::over(a.quota_group("org"), TenantId::from_u128(tenant), limiter)
        .deployment(b.quota_group("org"))
        .deployment(other)
        .retry_policy(RetryPolicy::builder().max_retries(2).jitter(0.0).build().unwrap())
        .env(env.with_rng(Arc::new(SeededRandom::from_seed(tenant as u64))))
        .cooldown_waits(0)
        .build();
    Worker {
        provider,
        breakers: vec![breaker_a, breaker_b, breaker_other],
    }
}

/// How long each breaker refuses for a cooldown now (zero: it admits, or
/// refuses for its circuit). Admission is a step, so a probe it issues
/// is handed back.
async fn cooling<C: BreakerStore>(w: &Worker<C>) -> Vec<Duration> {
    let mut out = Vec::new();
    for breaker in &w.breakers {
        out.push(match breaker.admit().await {
            Permit::Refused {
                reason: Refusal::Cooldown,
                retry_after,
                ..
            } => retry_after,
            _ => Duration::ZERO,
        });
    }
    out
}

/// What the provider has slept on `clock` so far (its backoff).
fn slept(clock: &ManualClock) -> Duration {
    clock.sleeps().iter().sum()
}

/// Every deployment whose breaker was told to cool down, by prefix.
fn cooled(observer: &RecordingObserver) -> Vec<String> {
    observer
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::BreakerCooldown { breaker, .. } => Some(breaker.to_string()),
            _ => None,
        })
        .collect()
}

/// `a`'s spent quota cools `b` too: the call falls over to `other`, and the
/// second worker's next call goes straight there — `b` never hears a
/// request the account must refuse.
async fn a_spent_account_cools_every_key_of_it<C: BreakerStore + TokenStore>(cache: Arc<C>, clock: Arc<ManualClock>) {
    let observer = Arc::new(RecordingObserver::new());
    let servers = Servers::default();
    let (one, two) = (
        worker(&cache, &servers, &clock, &observer, 1, OWN),
        worker(&cache, &servers, &clock, &observer, 2, OWN),
    );
    servers.a.push(respond(429, &[], SPENT));
    assert_eq!(bounded(one.provider.extract::<String>("t", None)).await.unwrap(), "Ann");
    assert_eq!((servers.a.calls(), servers.b.calls(), servers.other.calls()), (1, 0, 1));
    assert_eq!(cooled(&observer), ["kg:circuit:a", "kg:circuit:b"]);
    // The hour of `quota_cooldown`, less the backoff slept before the
    // fallover.
    let left = secs(3_600) - slept(&clock);
    assert_eq!(cooling(&two).await, [left, left, Duration::ZERO]);
    clock.advance(secs(60));
    assert_eq!(bounded(two.provider.extract::<String>("t", None)).await.unwrap(), "Ann");
    assert_eq!(
        (servers.a.calls(), servers.b.calls(), servers.other.calls()),
        (1, 0, 2),
        "the second worker skips the whole account"
    );
}

/// A key's per-minute 429 and a revoked key are that key's alone: the
/// account's other key still serves.
async fn a_keys_own_limit_and_error_stay_with_it<C: BreakerStore + TokenStore>(cache: Arc<C>, clock: Arc<ManualClock>) {
    let observer = Arc::new(RecordingObserver::new());
    let servers = Servers::default();
    let one = worker(&cache, &servers, &clock, &observer, 1, OWN);
    servers.a.push(rate_limited(&[("retry-after", "30")]));
    assert_eq!(bounded(one.provider.extract::<String>("t", None)).await.unwrap(), "Ann");
    assert_eq!((servers.a.calls(), servers.b.calls()), (1, 1), "b served the retry");
    assert_eq!(cooled(&observer), ["kg:circuit:a"]);
    assert_eq!(
        cooling(&one).await,
        [secs(30) - slept(&clock), Duration::ZERO, Duration::ZERO]
    );

    clock.advance(secs(31));
    servers.a.push(respond(401, &[], BAD_KEY));
    let _ = bounded(one.provider.extract::<String>("t", None)).await;
    assert_eq!(servers.a.calls(), 2);
    assert_eq!(cooled(&observer), ["kg:circuit:a"], "a key error cools nothing");
    assert_eq!(cooling(&one).await, [Duration::ZERO; 3]);
    servers.b.push(ok(&[]));
    let before = servers.b.calls();
    assert_eq!(bounded(one.provider.extract::<String>("t", None)).await.unwrap(), "Ann");
    assert_eq!(servers.b.calls(), before + 1, "b, not the dead key a, serves");
}

#[tokio::test]
async fn on_memory_a_spent_account_cools_every_key_of_it() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    a_spent_account_cools_every_key_of_it(Arc::new(MemoryCache::new(clock.clone())), clock).await;
}

#[tokio::test]
async fn on_memory_a_keys_own_limit_and_error_stay_with_it() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    a_keys_own_limit_and_error_stay_with_it(Arc::new(MemoryCache::new(clock.clone())), clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_spent_account_cools_every_key_of_it() {
    let Some(server) = RedisServer::start() else { return };
    // Caller-stamped on a manual clock at the present, so the test moves time.
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    a_spent_account_cools_every_key_of_it(Arc::new(server.cache()), clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_keys_own_limit_and_error_stay_with_it() {
    let Some(server) = RedisServer::start() else { return };
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    a_keys_own_limit_and_error_stay_with_it(Arc::new(server.cache()), clock).await;
}

/// A group member whose breaker a deployment outside the group shares is
/// not cooled by the account's spent quota: the other deployment's quota is
/// not spent, and its breaker must keep admitting it.
#[tokio::test]
async fn a_breaker_shared_with_a_deployment_outside_the_group_is_not_cooled() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let observer = Arc::new(RecordingObserver::new());
    let servers = Servers::default();
    // b, of `org`, and `other`, of another account, share one breaker.
    let one = worker(&cache, &servers, &clock, &observer, 1, ["a", "shared", "shared"]);
    servers.a.push(respond(429, &[], SPENT));
    assert_eq!(bounded(one.provider.extract::<String>("t", None)).await.unwrap(), "Ann");
    assert_eq!(cooled(&observer), ["kg:circuit:a"]);
    assert!(
        one.breakers[2].admit().await.is_admitted(),
        "the shared breaker still admits"
    );
}
