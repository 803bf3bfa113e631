//! The Redis tests' side of `testkit::redis`, whose launchers know nothing
//! of redstring: a `RedisCache` for each running topology ([`LiveRedis`]),
//! the compliance suite's harness over one ([`OnLive`]), and the races and
//! property runners several tests share.

use std::time::Duration;

use redstring::Env;
use redstring::cache::redis::{RedisCache, RedisCacheBuilder};
use testkit::redis::RedisServer;

pub mod differential;

/// Waits `d` of real time without blocking the runtime's worker.
pub async fn wait(d: Duration) {
    tokio::task::spawn_blocking(move || std::thread::sleep(d))
        .await
        .expect("sleeping task");
}

/// Fails the test instead of hanging if `f` never finishes; the adapter's own
/// bounds are far inside this guard.
pub async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("a cache call hung past its timeout")
}

/// A two-thread runtime for a plain `#[test]` that drives a real server
/// through a property test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A proptest runner for `default_cases` cases (`PROPTEST_CASES` overrides),
/// persisting nothing: a failure prints its minimal input.
pub fn runner(default_cases: u32) -> proptest::test_runner::TestRunner {
    proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: super::proptest_cases(default_cases),
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    })
}

/// Races `tasks` acquires of one tenant (42) over `connections` limiters at
/// `rpm`, each on its own cache from `cache`, spread round-robin; returns
/// the admitted and limited counts and the limiters (for follow-up reads).
/// Any other error fails the test.
pub async fn race_one_tenant(
    cache: impl Fn() -> redstring::cache::redis::RedisCache,
    connections: usize,
    tasks: usize,
    rpm: u32,
) -> (
    u32,
    u32,
    Vec<std::sync::Arc<redstring::RateLimiter<redstring::cache::redis::RedisCache>>>,
) {
    use std::sync::Arc;
    let limiters: Vec<_> = (0..connections)
        .map(|_| {
            Arc::new(
                redstring::RateLimiter::builder(rpm)
                    .cache(Arc::new(cache()))
                    .env(Env::default().with_observer(Arc::new(redstring::NoopObserver)))
                    .build()
                    .unwrap(),
            )
        })
        .collect();
    let tenant = redstring::TenantId::from_u128(42);
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let limiter = limiters[i % limiters.len()].clone();
            tokio::spawn(async move { limiter.acquire(tenant).await })
        })
        .collect();
    let (mut admitted, mut limited) = (0, 0);
    for handle in handles {
        match handle.await.unwrap() {
            Ok(_) => admitted += 1,
            Err(redstring::AcquireError::Limited(_)) => limited += 1,
            Err(other) => panic!("unexpected error: {other:?}"),
        }
    }
    (admitted, limited, limiters)
}

/// A running Redis topology the tests talk to: a `RedisCache` on it, and a
/// way to empty it.
pub trait LiveRedis: Send + Sync + 'static {
    /// A builder with short timeouts, stamping with the caller's clock (what
    /// the compliance suite and the differential test judge at), trusting
    /// the topology's CA when it uses TLS.
    fn builder(&self) -> RedisCacheBuilder;
    /// A new cache connected to it, owning its own connections.
    fn cache(&self) -> RedisCache;
    /// Removes every key.
    fn flush(&self);
}

/// Short timeouts and the caller's clock: what every topology's builder
/// starts from.
fn quick(timeout: Duration) -> RedisCacheBuilder {
    RedisCache::builder()
        .time_source(redstring::TimeSource::Caller)
        .connect_timeout(timeout)
        .response_timeout(timeout)
}

impl LiveRedis for RedisServer {
    fn builder(&self) -> RedisCacheBuilder {
        quick(Duration::from_millis(500))
    }
    fn cache(&self) -> RedisCache {
        self.builder().build_from_url(&self.url()).expect("valid url")
    }
    fn flush(&self) {
        RedisServer::flush(self)
    }
}

#[cfg(feature = "redis-tls")]
impl LiveRedis for testkit::redis::TlsServer {
    /// Also presents the client certificate when the server requires it.
    fn builder(&self) -> RedisCacheBuilder {
        let builder = quick(Duration::from_millis(1000)).tls_ca_file(self.pki().ca());
        match self.auth() {
            testkit::redis::ClientAuth::Required => {
                builder.tls_client_cert(self.pki().client_cert(), self.pki().client_key())
            }
            testkit::redis::ClientAuth::Optional => builder,
        }
    }
    fn cache(&self) -> RedisCache {
        self.builder()
            .build_from_url(&self.url())
            .expect("valid TLS configuration")
    }
    fn flush(&self) {
        testkit::redis::TlsServer::flush(self)
    }
}

#[cfg(feature = "redis-cluster")]
impl LiveRedis for testkit::redis::Cluster {
    fn builder(&self) -> RedisCacheBuilder {
        let builder = quick(Duration::from_millis(1000));
        #[cfg(feature = "redis-tls")]
        if let Some(ca) = self.ca() {
            return builder.tls_ca_file(ca);
        }
        builder
    }
    fn cache(&self) -> RedisCache {
        self.builder()
            .build_cluster(self.urls())
            .expect("valid cluster configuration")
    }
    fn flush(&self) {
        testkit::redis::Cluster::flush(self)
    }
}

#[cfg(feature = "redis-sentinel")]
impl LiveRedis for testkit::redis::SentinelGroup {
    fn builder(&self) -> RedisCacheBuilder {
        quick(Duration::from_millis(500))
    }
    /// A cache over the primary the Sentinel names.
    fn cache(&self) -> RedisCache {
        self.builder()
            .build_sentinel(testkit::redis::sentinel::MASTER_NAME, [self.sentinel_url()])
            .expect("valid sentinel configuration")
    }
    fn flush(&self) {
        testkit::redis::SentinelGroup::flush(self)
    }
}

impl<T: LiveRedis> LiveRedis for &'static T {
    fn builder(&self) -> RedisCacheBuilder {
        (**self).builder()
    }
    fn cache(&self) -> RedisCache {
        (**self).cache()
    }
    fn flush(&self) {
        (**self).flush()
    }
}

/// The compliance suite's harness over any live topology: each cache starts
/// from an empty server, and time is real (TTLs are waited out).
pub struct OnLive<T>(pub T);

impl<T: LiveRedis> redstring::testing::Harness for OnLive<T> {
    type Cache = RedisCache;

    async fn cache(&self) -> std::sync::Arc<RedisCache> {
        self.0.flush();
        std::sync::Arc::new(self.0.cache())
    }

    async fn advance(&self, d: Duration) {
        wait(d).await;
    }

    fn now(&self) -> redstring::Timestamp {
        use redstring::Clock as _;
        redstring::SystemClock.now()
    }
}

/// Four breakers sharing one circuit through caches `make` builds (the
/// probe-race fleet): threshold 2, a 30 s recovery, 3 probes per episode,
/// all on `clock`.
pub fn probe_fleet(
    make: impl Fn() -> RedisCache,
    clock: &std::sync::Arc<redstring::ManualClock>,
) -> Vec<std::sync::Arc<redstring::CircuitBreaker<RedisCache>>> {
    (0..4)
        .map(|_| {
            std::sync::Arc::new(
                redstring::CircuitBreaker::builder()
                    .failure_threshold(2)
                    .recovery_timeout(Duration::from_secs(30))
                    .half_open_max_calls(3)
                    .cache(std::sync::Arc::new(make()))
                    .env(
                        Env::default()
                            .with_clock(clock.clone())
                            .with_observer(std::sync::Arc::new(redstring::NoopObserver)),
                    )
                    .build()
                    .expect("a valid breaker"),
            )
        })
        .collect()
}

/// 40 tasks over `fleet` ask at once whether to call; how many were let
/// through.
pub async fn race_for_probes(fleet: &[std::sync::Arc<redstring::CircuitBreaker<RedisCache>>]) -> usize {
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let b = fleet[i % fleet.len()].clone();
            tokio::spawn(async move { b.allow_request().await })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await.expect("the task ran"));
    }
    admitted
}
