//! A deployment's own limit (`Deployment::limit`): requests and tokens per
//! window shared by every tenant's attempts there, as a hosted deployment's
//! quota is. Two real local HTTP servers behind their own breakers, on a
//! manual clock: a deployment over its limit is skipped and never sent the
//! attempt, a reservation settles to the answer's `usage` (or is released
//! when the server generated nothing), and a single deployment waits its
//! limit out or refuses with an error naming it.

use std::sync::Arc;
use std::time::Duration;

use redstring::decide::tokens::RefusedBy;
use redstring::provider::{
    Deployment, DeploymentLimited, ExtractError, HardenedProvider, HardenedProviderBuilder, LlmProviderExt,
    OpenAiCompatible, ReqwestTransport,
};
use redstring::{
    CircuitBreaker, CircuitState, Env, Event, ManualClock, MemoryCache, Priority, RateLimiter, RecordingObserver,
    RetryPolicy, SeededRandom, TenantId,
};
use testkit::http::{Reply, TestServer};

const LOADING: &str = r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#;
/// Every attempt's token estimate, fixed so the arithmetic is the test's.
const ESTIMATE: u64 = 100;

#[derive(Debug, PartialEq, serde::Deserialize, schemars::JsonSchema)]
struct Person {
    name: String,
}

fn adapter(server: &TestServer, model: &str) -> OpenAiCompatible<ReqwestTransport> {
    OpenAiCompatible::builder(server.base_url(), model)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// Two servers on one manual clock; the primary has its own limit.
struct Rig {
    primary: TestServer,
    fallback: TestServer,
    clock: Arc<ManualClock>,
    observer: Arc<RecordingObserver>,
    /// The clock and the observer, for the rig's builders.
    env: Env,
    breakers: [Arc<CircuitBreaker>; 2],
    /// The primary's own limit.
    limit: Arc<RateLimiter>,
}

impl Rig {
    /// The primary's limit: `rpm` requests and, when given, `tokens` per 60 s.
    async fn new(rpm: u32, tokens: Option<u64>) -> Self {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let observer = Arc::new(RecordingObserver::new());
        let env = Env::default().with_clock(clock.clone()).with_observer(observer.clone());
        let mut limit = RateLimiter::builder(rpm).key_prefix("deployment:big").env(env.clone());
        if let Some(tokens) = tokens {
            limit = limit.tokens_per_window(tokens);
        }
        let breaker = |name: &str| {
            Arc::new(
                CircuitBreaker::builder()
                    .failure_threshold(1)
                    .key_prefix(format!("kg:circuit:{name}"))
                    .env(env.clone())
                    .build()
                    .unwrap(),
            )
        };
        Rig {
            primary: TestServer::start().await,
            fallback: TestServer::start().await,
            breakers: [breaker("big"), breaker("small")],
            limit: Arc::new(limit.build().unwrap()),
            clock,
            observer,
            env,
        }
    }

    /// A provider for `tenant`: the limited primary, then the fallback when
    /// `fallback`, with `max_retries` and no jitter.
    fn provider(
        &self,
        tenant: TenantId,
        fallback: bool,
        max_retries: u32,
    ) -> HardenedProviderBuilder<OpenAiCompatible<ReqwestTransport>, MemoryCache, MemoryCache> {
        let tenants = Arc::new(
            RateLimiter::builder(1_000)
                .env(Env::default().with_clock(self.clock.clone()))
                .build()
                .unwrap(),
        );
        let primary =
            Deployment::new(adapter(&self.primary, "big"), self.breakers[0].clone()).limit(self.limit.clone());
        let mut builder = HardenedProvider::over(primary, tenant, tenants)
            .retry_policy(
                RetryPolicy::builder()
                    .max_retries(max_retries)
                    .jitter(0.0)
                    .build()
                    .unwrap(),
            )
            .token_estimate(|_| ESTIMATE)
            .env(self.env.clone().with_rng(Arc::new(SeededRandom::from_seed(5))));
        if fallback {
            builder = builder.fallback(adapter(&self.fallback, "small"), self.breakers[1].clone());
        }
        builder
    }

    fn reroutes(&self) -> Vec<&'static str> {
        self.observer
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Rerouted { reason, .. } => Some(reason),
                _ => None,
            })
            .collect()
    }
}

#[tokio::test]
async fn a_deployment_over_its_token_limit_is_skipped_for_every_tenant_and_never_sent_the_attempt() {
    let rig = Rig::new(100, Some(250)).await;
    // The primary's answers use 120 tokens each, more than the estimate.
    rig.primary.otherwise(Reply::answered_by("big", 120));
    rig.fallback.otherwise(Reply::answered_by("small", 10));
    let ann = rig.provider(TenantId::from_u128(1), true, 0).build();
    let bob = rig.provider(TenantId::from_u128(2), true, 0).build();

    // 120 charged after the first, 240 after the second: 240 + 100 > 250.
    assert_eq!(
        ann.extract_with_model::<Person>("Ann.", None).await.unwrap().model,
        "openai-compatible/big"
    );
    assert_eq!(
        bob.extract_with_model::<Person>("Ann.", None).await.unwrap().model,
        "openai-compatible/big"
    );
    for provider in [&ann, &bob] {
        let answer = provider.extract_with_model::<Person>("Ann.", None).await.unwrap();
        assert_eq!(
            answer.model, "openai-compatible/small",
            "the limit is the deployment's, not a tenant's"
        );
    }
    assert_eq!((rig.primary.count(), rig.fallback.count()), (2, 2));
    assert_eq!(
        rig.reroutes(),
        ["limited", "limited"],
        "each provider asked the limit once"
    );
    // Ann's provider remembers the refusal's wait: the primary is not asked again.
    let answer = ann.extract_with_model::<Person>("Ann.", None).await.unwrap();
    assert_eq!(answer.model, "openai-compatible/small");
    assert_eq!(rig.reroutes().len(), 2, "no ask, no reroute");
    assert_eq!(rig.fallback.count(), 3);
    assert!(rig.clock.sleeps().is_empty(), "skipped, not waited for");
    assert_eq!(
        rig.breakers[0].state().await.unwrap(),
        CircuitState::Closed,
        "a refusal is no failure"
    );

    // A window later the primary's tokens are free again.
    rig.clock.advance(Duration::from_secs(61));
    assert_eq!(
        ann.extract_with_model::<Person>("Ann.", None).await.unwrap().model,
        "openai-compatible/big"
    );
    assert_eq!(rig.primary.count(), 3);
}

#[tokio::test]
async fn an_attempts_reservation_settles_to_the_usage_the_server_reports() {
    // 250 tokens: two estimates fit, but five answers of 15 tokens each do too,
    // since each reservation settles to 15.
    let rig = Rig::new(100, Some(250)).await;
    rig.primary.otherwise(Reply::answered_by("big", 15));
    rig.fallback.otherwise(Reply::answered_by("small", 15));
    let provider = rig.provider(TenantId::from_u128(1), true, 0).build();
    for _ in 0..5 {
        provider.extract::<Person>("Ann.", None).await.unwrap();
    }
    assert_eq!((rig.primary.count(), rig.fallback.count()), (5, 0));
}

#[tokio::test]
async fn a_failure_that_generated_nothing_releases_the_reservation_and_falls_over() {
    // Room for one estimate only.
    let rig = Rig::new(100, Some(ESTIMATE)).await;
    rig.primary.push(Reply::status(503, LOADING));
    rig.primary.otherwise(Reply::answered_by("big", 50));
    rig.fallback.otherwise(Reply::answered_by("small", 10));
    let provider = rig.provider(TenantId::from_u128(1), true, 1).build();

    let first = provider.extract_with_model::<Person>("Ann.", None).await.unwrap();
    assert_eq!(first.model, "openai-compatible/small", "the 503 fell over");
    // The 503 generated nothing: its reservation was released, so the next
    // call's estimate fits the primary again (with it kept, it would not).
    rig.breakers[0].reset().await.unwrap();
    let second = provider.extract_with_model::<Person>("Ann.", None).await.unwrap();
    assert_eq!(second.model, "openai-compatible/big");
    assert_eq!((rig.primary.count(), rig.fallback.count()), (2, 1));
}

#[tokio::test]
async fn a_single_deployment_waits_its_limit_out_once_and_then_refuses_without_calling() {
    let rig = Rig::new(1, None).await;
    rig.primary.otherwise(Reply::answered_by("big", 10));
    let provider = rig.provider(TenantId::from_u128(1), false, 0).build();
    provider.extract::<Person>("Ann.", None).await.unwrap();
    rig.clock.advance(Duration::from_secs(20));

    // Refused for the 40 s left of the window (and the inclusive edge's
    // microsecond): one wait, then the slot is free.
    provider.extract::<Person>("Ann.", None).await.unwrap();
    assert_eq!(rig.clock.sleeps(), [Duration::from_micros(40_000_001)]);
    assert_eq!(rig.primary.count(), 2);

    let strict = rig.provider(TenantId::from_u128(1), false, 0).limiter_waits(0).build();
    let e = strict.extract::<Person>("Ann.", None).await.unwrap_err();
    let ExtractError::DeploymentLimited(limited) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(
        *limited,
        DeploymentLimited {
            model: "openai-compatible/big".into(),
            limit: "deployment:big".into(),
            by: RefusedBy::Requests,
            retry_after: Some(Duration::from_micros(60_000_001)),
        }
    );
    assert_eq!(e.kind(), "deployment_limited");
    assert_eq!(
        e.to_string(),
        "deployment openai-compatible/big (limit \"deployment:big\") is over its requests per window; retry in 60.00s"
    );
    assert_eq!(rig.primary.count(), 2, "never sent");
    let finished: Vec<u32> = rig
        .observer
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::CallFinished { attempts, .. } => Some(attempts),
            _ => None,
        })
        .collect();
    assert_eq!(finished, [1, 1, 0], "an attempt the limit refused is no attempt sent");
    // The breaker heard nothing of the refused call: one failure would open it.
    assert_eq!(rig.breakers[0].state().await.unwrap(), CircuitState::Closed);
}

#[tokio::test]
async fn an_estimate_over_the_whole_token_limit_never_waits() {
    let rig = Rig::new(100, Some(ESTIMATE - 1)).await;
    rig.primary.otherwise(Reply::answered_by("big", 10));
    let provider = rig.provider(TenantId::from_u128(1), false, 3).build();
    let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
    let ExtractError::DeploymentLimited(limited) = &e else {
        panic!("{e:?}")
    };
    assert_eq!((limited.by, limited.retry_after), (RefusedBy::TooLarge, None));
    assert!(e.to_string().ends_with("the estimate alone is over it"), "{e}");
    assert!(rig.clock.sleeps().is_empty(), "no wait helps, no retry is made");
    assert_eq!(rig.primary.count(), 0);
}

#[tokio::test]
async fn limit_waits_are_counted_per_call_not_per_attempt() {
    let rig = Rig::new(1, None).await;
    rig.primary.otherwise(Reply::status(503, LOADING));
    let provider = rig.provider(TenantId::from_u128(1), false, 2).build();
    let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
    // 503, 1 s backoff, the limit's wait slept off (the call's one), 503,
    // 2 s backoff, the limit refuses again and no wait is left.
    assert!(matches!(e, ExtractError::DeploymentLimited(_)), "{e:?}");
    assert_eq!(rig.primary.count(), 2);
    let sleeps = rig.clock.sleeps();
    assert_eq!(sleeps.len(), 3, "{sleeps:?}");
    assert_eq!(sleeps[0], Duration::from_secs(1));
    assert_eq!(sleeps[1], Duration::from_micros(59_000_001));
    assert_eq!(sleeps[2], Duration::from_secs(2));
}

/// A deployment that, while answering, asks another breaker for a probe
/// and keeps what it said.
struct Asking {
    model: &'static str,
    other: Arc<CircuitBreaker>,
    probe_free: std::sync::Mutex<Vec<bool>>,
}

impl redstring::provider::LlmProvider for Asking {
    fn model(&self) -> &str {
        self.model
    }
    fn extract_answer<'a>(
        &'a self,
        _: redstring::provider::ExtractRequest<'a>,
        _: Option<Duration>,
    ) -> redstring::provider::BoxFuture<'a, Result<redstring::provider::Extracted<serde_json::Value>, ExtractError>>
    {
        Box::pin(async move {
            let admitted = self.other.admit().await;
            let free = matches!(admitted, redstring::Permit::Probe(_));
            if let redstring::Permit::Probe(_) = admitted {
                self.other.release(&admitted).await.unwrap();
            }
            self.probe_free.lock().unwrap().push(free);
            Ok(redstring::provider::Extracted {
                value: serde_json::Value::from("ok"),
                model: self.model.to_owned(),
                usage: None,
                quota: None,
            })
        })
    }
}

#[tokio::test]
async fn a_probe_admitted_where_the_limit_refuses_is_handed_back_before_the_call_goes_elsewhere() {
    let rig = Rig::new(1, None).await;
    // The primary's limit is spent and its circuit is half-open: the call's
    // admission there is the probe.
    rig.breakers[0].record_failure().await.unwrap();
    rig.clock.advance(redstring::breaker::DEFAULT_RECOVERY_TIMEOUT);
    rig.limit
        .acquire(redstring::provider::DEPLOYMENT_LIMIT_TENANT)
        .await
        .unwrap();
    let asking = |model, other: &Arc<CircuitBreaker>| {
        Arc::new(Asking {
            model,
            other: other.clone(),
            probe_free: std::sync::Mutex::new(Vec::new()),
        })
    };
    let (big, small) = (asking("big", &rig.breakers[1]), asking("small", &rig.breakers[0]));
    let tenants = Arc::new(
        RateLimiter::builder(10)
            .env(Env::default().with_clock(rig.clock.clone()))
            .build()
            .unwrap(),
    );
    let provider = HardenedProvider::over(
        Deployment::new(big.clone(), rig.breakers[0].clone()).limit(rig.limit.clone()),
        TenantId::from_u128(1),
        tenants,
    )
    .fallback(small.clone(), rig.breakers[1].clone())
    .limiter_waits(0)
    .env(rig.env.clone())
    .build();

    let answer = provider.extract_with_model::<String>("Ann.", None).await.unwrap();
    assert_eq!(answer.model, "small");
    assert_eq!(
        *small.probe_free.lock().unwrap(),
        [true],
        "while the fallback answers, the primary's probe is free for another caller"
    );
    assert_eq!(rig.reroutes(), ["limited"]);
}

#[tokio::test]
async fn a_low_priority_provider_leaves_the_reserve_of_a_deployments_limit_to_high_priority_calls() {
    let mut rig = Rig::new(10, None).await;
    rig.limit = Arc::new(
        RateLimiter::builder(10)
            .reserve(0.3)
            .key_prefix("deployment:big")
            .env(rig.env.clone())
            .build()
            .unwrap(),
    );
    rig.primary.otherwise(Reply::answered_by("big", 10));
    rig.fallback.otherwise(Reply::answered_by("small", 10));
    let batch = rig
        .provider(TenantId::from_u128(1), true, 0)
        .priority(Priority::Low)
        .build();
    let chat = rig.provider(TenantId::from_u128(2), true, 0).build();
    for _ in 0..10 {
        batch.extract::<Person>("Ann.", None).await.unwrap();
    }
    assert_eq!(
        (rig.primary.count(), rig.fallback.count()),
        (7, 3),
        "the batch calls take 7 of 10 and spill over"
    );
    for _ in 0..3 {
        let answer = chat.extract_with_model::<Person>("Ann.", None).await.unwrap();
        assert_eq!(answer.model, "openai-compatible/big", "the reserve is the chat's");
    }
    let answer = chat.extract_with_model::<Person>("Ann.", None).await.unwrap();
    assert_eq!(answer.model, "openai-compatible/small", "and no more than the limit");
    assert_eq!((rig.primary.count(), rig.fallback.count()), (10, 4));
}
