//! Slow-call breaking on a real Redis: three workers, each with its own
//! connection and breaker, share one circuit in the store; each worker's
//! slow answers (timed on its own clock) are failures in the shared count,
//! so together they open the circuit for all of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::support::redis::{LiveRedis, bounded};
use redstring::Clock;
use redstring::provider::{
    BoxFuture, ExtractError, ExtractRequest, Extracted, HardenedProvider, LlmProvider, LlmProviderExt,
};
use redstring::{CircuitBreaker, CircuitState, Env, ManualClock, RateLimiter, RetryPolicy, SystemClock, TenantId};
use serde_json::Value;
use testkit::redis::RedisServer;

/// A server that answers every call correctly, `took` later on the
/// workers' manual clock, counting calls.
struct Slow {
    clock: Arc<ManualClock>,
    took: Duration,
    calls: AtomicU32,
}

impl LlmProvider for Slow {
    fn model(&self) -> &str {
        "slow/m"
    }
    fn extract_answer<'a>(
        &'a self,
        _: ExtractRequest<'a>,
        _: Option<Duration>,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.clock.advance(self.took);
        Box::pin(async {
            Ok(Extracted {
                value: Value::from("Ann"),
                model: "slow/m".to_owned(),
                usage: None,
                quota: None,
            })
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleets_slow_answers_open_the_circuit_it_shares_through_redis() {
    let Some(server) = RedisServer::start() else { return };
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let slow = Arc::new(Slow {
        clock: clock.clone(),
        took: Duration::from_secs(3),
        calls: AtomicU32::new(0),
    });
    let env = Env::default().with_clock(clock.clone());
    let mut fleet = Vec::new();
    let mut breakers = Vec::new();
    for worker in 0..3u128 {
        // Each worker its own connection and breaker, as processes have.
        let cache = Arc::new(server.cache());
        let breaker = Arc::new(
            CircuitBreaker::builder()
                .key_prefix("kg:circuit:slow")
                .failure_threshold(3)
                .recovery_timeout(Duration::from_secs(60))
                .env(env.clone())
                .cache(cache.clone())
                .build()
                .unwrap(),
        );
        let limiter = Arc::new(
            RateLimiter::builder(1000)
                .env(env.clone())
                .cache(cache)
                .build()
                .unwrap(),
        );
        let provider = HardenedProvider::builder(slow.clone(), TenantId::from_u128(worker), limiter, breaker.clone())
            .retry_policy(RetryPolicy::builder().max_retries(0).build().unwrap())
            .env(env.clone())
            .deadline(Duration::from_secs(30))
            .slow_call_threshold(Duration::from_secs(2))
            .unwrap()
            .build();
        fleet.push(provider);
        breakers.push(breaker);
    }
    for (i, worker) in fleet.iter().enumerate() {
        assert_eq!(
            bounded(breakers[i].state()).await.unwrap(),
            CircuitState::Closed,
            "before worker {i}'s call"
        );
        // Each gets its answer: the calls succeeded.
        assert_eq!(bounded(worker.extract::<String>("t", None)).await.unwrap(), "Ann");
    }
    // Three slow answers from three workers: the shared circuit is open.
    for (i, worker) in fleet.iter().enumerate() {
        assert_eq!(bounded(breakers[i].state()).await.unwrap(), CircuitState::Open);
        let e = bounded(worker.extract::<String>("t", None)).await.unwrap_err();
        assert_eq!(e.kind(), "circuit_open", "worker {i}");
    }
    assert_eq!(slow.calls.load(Ordering::SeqCst), 3);
}
