//! Least-loaded routing for a fleet on a real Redis: five providers (five
//! workers) route ten concurrent calls over two deployments, and because the
//! count, the pick and the lease are one script, the calls in flight split
//! exactly evenly — no two workers read the same counts and herd onto one.
//! And a deployment's own token limit, shared by five workers of five
//! tenants, admits exactly the attempts its tokens cover.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::support;
use crate::support::redis::LiveRedis;
use redstring::cache::redis::RedisCache;
use redstring::provider::{
    BoxFuture, Deployment, ExtractError, ExtractRequest, Extracted, HardenedProvider, LlmProvider, LlmProviderExt,
};
use redstring::{CircuitBreaker, Env, RateLimiter, TenantId};
use serde_json::Value;
use testkit::redis::RedisServer;
use tokio::sync::Semaphore;

/// A deployment whose calls wait at a gate until released, counting how
/// many came in; it answers without `usage` (a reservation settles to its
/// estimate).
struct Gated {
    model: &'static str,
    inside: AtomicU32,
    gate: Semaphore,
}

impl LlmProvider for Gated {
    fn model(&self) -> &str {
        self.model
    }
    fn extract_answer<'a>(
        &'a self,
        _: ExtractRequest<'a>,
        _: Option<Duration>,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>> {
        Box::pin(async move {
            self.inside.fetch_add(1, Ordering::SeqCst);
            let _permit = self
                .gate
                .acquire()
                .await
                .map_err(|_| ExtractError::from(redstring::provider::ProviderError::BlankText))?;
            Ok(Extracted {
                value: Value::from("ok"),
                model: self.model.to_owned(),
                usage: None,
                quota: None,
            })
        })
    }
}

#[test]
fn a_fleet_routing_least_loaded_on_redis_splits_calls_in_flight_exactly() {
    let Some(server) = RedisServer::start() else { return };
    let rt = support::redis::runtime();
    rt.block_on(async {
        let gated = |model| {
            Arc::new(Gated {
                model,
                inside: AtomicU32::new(0),
                gate: Semaphore::new(0),
            })
        };
        let (a, b) = (gated("a"), gated("b"));
        let mut fleet = Vec::new();
        for worker in 0..5u64 {
            // Each worker its own connection, breakers and limiter, as
            // separate processes would have.
            let cache = Arc::new(server.cache());
            let breaker = |name: &str| {
                Arc::new(
                    CircuitBreaker::builder()
                        .key_prefix(format!("kg:circuit:{name}"))
                        .cache(cache.clone())
                        .build()
                        .unwrap(),
                )
            };
            let limiter: Arc<RateLimiter<RedisCache>> =
                Arc::new(RateLimiter::builder(1000).cache(cache.clone()).build().unwrap());
            let provider = HardenedProvider::builder(a.clone(), TenantId::from_u128(1), limiter, breaker("a"))
                .fallback(b.clone(), breaker("b"))
                .least_loaded(Duration::from_secs(60))
                .env(Env::default().with_rng(Arc::new(redstring::SeededRandom::from_seed(worker))))
                .build();
            fleet.push(Arc::new(provider));
        }
        let mut calls = Vec::new();
        for _ in 0..2 {
            for p in &fleet {
                let p = p.clone();
                calls.push(tokio::spawn(async move {
                    p.extract_with_model::<String>("t", None).await.map(|x| x.model)
                }));
            }
        }
        while a.inside.load(Ordering::SeqCst) + b.inside.load(Ordering::SeqCst) < 10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            (a.inside.load(Ordering::SeqCst), b.inside.load(Ordering::SeqCst)),
            (5, 5),
            "ten calls in flight from five workers split exactly"
        );
        a.gate.add_permits(10);
        b.gate.add_permits(10);
        let mut models = Vec::new();
        for call in calls {
            models.push(call.await.unwrap().unwrap());
        }
        assert_eq!(models.iter().filter(|m| *m == "a").count(), 5);

        // Every call ended its lease: a fresh call goes to the first again.
        let answer = fleet[0].extract_with_model::<String>("t", None).await.unwrap();
        assert_eq!(answer.model, "a");
    });
}

#[test]
fn a_deployments_own_token_limit_on_redis_admits_exactly_its_tokens_across_tenants_and_workers() {
    let Some(server) = RedisServer::start() else { return };
    let rt = support::redis::runtime();
    rt.block_on(async {
        // Gates left open: each deployment answers at once, counting its calls.
        let open = |model| {
            Arc::new(Gated {
                model,
                inside: AtomicU32::new(0),
                gate: Semaphore::new(Semaphore::MAX_PERMITS),
            })
        };
        let (a, b) = (open("a"), open("b"));
        let mut fleet = Vec::new();
        for worker in 0..5u128 {
            // Each worker its own connection, tenant, breakers and limits.
            let cache = Arc::new(server.cache());
            let breaker = |name: &str| {
                Arc::new(
                    CircuitBreaker::builder()
                        .key_prefix(format!("kg:circuit:{name}"))
                        .cache(cache.clone())
                        .build()
                        .unwrap(),
                )
            };
            let tenants: Arc<RateLimiter<RedisCache>> =
                Arc::new(RateLimiter::builder(1000).cache(cache.clone()).build().unwrap());
            // Room for ten attempts of 100 tokens at deployment a, fleet-wide.
            let limit: Arc<RateLimiter<RedisCache>> = Arc::new(
                RateLimiter::builder(1000)
                    .key_prefix("deployment:a")
                    .tokens_per_window(1000)
                    .cache(cache.clone())
                    .build()
                    .unwrap(),
            );
            let primary = Deployment::new(a.clone(), breaker("a")).limit(limit);
            let provider = HardenedProvider::over(primary, TenantId::from_u128(worker + 1), tenants)
                .fallback(b.clone(), breaker("b"))
                .token_estimate(|_| 100)
                .env(Env::default().with_rng(Arc::new(redstring::SeededRandom::from_seed(worker as u64))))
                .build();
            fleet.push(Arc::new(provider));
        }
        let mut calls = Vec::new();
        for _ in 0..10 {
            for p in &fleet {
                let p = p.clone();
                calls.push(tokio::spawn(async move {
                    p.extract_with_model::<String>("t", None).await.map(|x| x.model)
                }));
            }
        }
        let mut models = Vec::new();
        for call in calls {
            models.push(call.await.unwrap().unwrap());
        }
        assert_eq!(
            (a.inside.load(Ordering::SeqCst), b.inside.load(Ordering::SeqCst)),
            (10, 40),
            "fifty racing calls from five workers: exactly ten fit deployment a's tokens"
        );
        assert_eq!(
            models.iter().filter(|m| *m == "a").count(),
            10,
            "each answer names its deployment"
        );
    });
}
