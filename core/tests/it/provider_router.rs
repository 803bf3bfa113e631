//! A hardened provider over two deployments — two real local HTTP servers,
//! each behind its own breaker — on a manual clock: where calls and their
//! retries go, what each breaker hears, what the limiter charges, and which
//! model the answer says produced it.

use std::sync::Arc;
use std::time::Duration;

use redstring::provider::{
    ExtractError, HardenedProvider, HardenedProviderBuilder, LlmProvider, LlmProviderExt, OpenAiCompatible,
    ReqwestTransport,
};
use redstring::{
    CircuitBreaker, CircuitState, Env, Event, ManualClock, MemoryCache, RateLimiter, RecordingObserver, RetryBudget,
    RetryPolicy, SeededRandom, TenantId,
};
use testkit::http::{Reply, TestServer};

const LOADING: &str = r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#;
const BAD_REQUEST: &str = r#"{"error":{"code":400,"message":"bad request","type":"invalid_request_error"}}"#;
const T: TenantId = TenantId::from_u128(1);

#[derive(Debug, PartialEq, serde::Deserialize, schemars::JsonSchema)]
struct Person {
    name: String,
}

type Builder = HardenedProviderBuilder<OpenAiCompatible<ReqwestTransport>, MemoryCache, MemoryCache>;

/// Two servers, their breakers (threshold `threshold`, 30 s recovery) and
/// one limiter, on one manual clock.
struct Rig {
    primary: TestServer,
    fallback: TestServer,
    clock: Arc<ManualClock>,
    observer: Arc<RecordingObserver>,
    /// The clock and the observer, for the rig's builders.
    env: Env,
    limiter: Arc<RateLimiter>,
    breakers: [Arc<CircuitBreaker>; 2],
}

impl Rig {
    async fn new(threshold: u32) -> Self {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let observer = Arc::new(RecordingObserver::new());
        let env = Env::default().with_clock(clock.clone()).with_observer(observer.clone());
        let limiter = Arc::new(RateLimiter::builder(100).env(env.clone()).build().unwrap());
        let breaker = |name: &str| {
            Arc::new(
                CircuitBreaker::builder()
                    .failure_threshold(threshold)
                    .recovery_timeout(Duration::from_secs(30))
                    .key_prefix(format!("kg:circuit:{name}"))
                    .env(env.clone())
                    .build()
                    .unwrap(),
            )
        };
        Rig {
            primary: TestServer::start().await,
            fallback: TestServer::start().await,
            breakers: [breaker("primary"), breaker("fallback")],
            clock,
            observer,
            env,
            limiter,
        }
    }

    fn adapter(server: &TestServer, model: &str) -> OpenAiCompatible<ReqwestTransport> {
        OpenAiCompatible::builder(server.base_url(), model)
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap()
    }

    /// The primary then the fallback, jitter off, `max_retries`.
    fn provider(&self, max_retries: u32) -> Builder {
        HardenedProvider::builder(
            Self::adapter(&self.primary, "big"),
            T,
            self.limiter.clone(),
            self.breakers[0].clone(),
        )
        .fallback(Self::adapter(&self.fallback, "small"), self.breakers[1].clone())
        .retry_policy(
            RetryPolicy::builder()
                .max_retries(max_retries)
                .jitter(0.0)
                .build()
                .unwrap(),
        )
        .env(self.env.clone().with_rng(Arc::new(SeededRandom::from_seed(3))))
    }

    /// Each call's move to another deployment: (from, to, reason).
    fn reroutes(&self) -> Vec<(String, String, &'static str)> {
        self.observer
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Rerouted { from, to, reason, .. } => Some((from.to_string(), to.to_string(), reason)),
                _ => None,
            })
            .collect()
    }

    /// How many admissions each breaker refused, from its own events.
    fn refusals(&self, prefix: &str) -> usize {
        self.observer
            .events()
            .into_iter()
            .filter(|e| matches!(e, Event::BreakerRejected { breaker, .. } if &**breaker == prefix))
            .count()
    }

    /// Failures each breaker recorded.
    fn failures(&self, prefix: &str) -> usize {
        self.observer
            .events()
            .into_iter()
            .filter(|e| matches!(e, Event::BreakerFailureRecorded { breaker, .. } if &**breaker == prefix))
            .count()
    }
}

#[tokio::test]
async fn a_transient_failure_falls_over_and_the_answer_names_the_model_that_produced_it() {
    let rig = Rig::new(5).await;
    rig.primary.otherwise(Reply::status(503, LOADING));
    rig.fallback.otherwise(Reply::answered_by("small", 15));
    let provider = rig.provider(1).build();

    let answer = provider.extract_with_model::<Person>("Ann.", None).await.unwrap();
    assert_eq!(answer.value.name, "Ann");
    assert_eq!(
        answer.model, "openai-compatible/small",
        "provenance is the fallback's, never the primary's"
    );
    assert_eq!(
        provider.model(),
        "openai-compatible/big",
        "the configured identity is the primary's"
    );
    assert_eq!((rig.primary.count(), rig.fallback.count()), (1, 1));
    assert_eq!(
        rig.clock.sleeps(),
        [Duration::from_secs(1)],
        "a retry: the schedule's backoff"
    );
    assert_eq!(
        rig.reroutes(),
        [("kg:circuit:primary".into(), "kg:circuit:fallback".into(), "failed")]
    );
    assert_eq!(rig.failures("kg:circuit:primary"), 1, "the primary hears its failure");
    assert_eq!(rig.failures("kg:circuit:fallback"), 0);
    assert_eq!(rig.limiter.remaining(T).await.unwrap(), 99, "one slot for the call");
    let finished: Vec<_> = rig
        .observer
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::CallFinished { model, attempts, .. } => Some((model.to_string(), attempts)),
            _ => None,
        })
        .collect();
    assert_eq!(finished, [("openai-compatible/small".to_owned(), 2)]);
}

#[tokio::test]
async fn an_open_primary_is_skipped_at_once_and_then_not_even_asked_until_its_probe_is_due() {
    let rig = Rig::new(1).await;
    rig.fallback.otherwise(Reply::answered_by("small", 15));
    rig.primary.otherwise(Reply::answered_by("big", 15));
    rig.breakers[0].record_failure().await.unwrap();
    let provider = rig.provider(3).build();

    for _ in 0..3 {
        let answer = provider.extract_with_model::<Person>("Ann.", None).await.unwrap();
        assert_eq!(answer.model, "openai-compatible/small");
    }
    assert_eq!(rig.primary.count(), 0);
    assert!(
        rig.clock.sleeps().is_empty(),
        "no wait: the refusal is skipped, not retried"
    );
    assert_eq!(
        rig.refusals("kg:circuit:primary"),
        1,
        "only the first call asked the open circuit; its refusal's wait was remembered"
    );
    assert_eq!(rig.reroutes().len(), 1);

    // Once the probe is due, the primary is asked first again and probes.
    rig.clock.advance(Duration::from_secs(30));
    let answer = provider.extract_with_model::<Person>("Ann.", None).await.unwrap();
    assert_eq!(answer.model, "openai-compatible/big");
    assert_eq!(rig.breakers[0].state().await.unwrap(), CircuitState::Closed);
}

/// A call that passes over a deployment known to refuse says so: one
/// event per call, naming the deployment, why (its open circuit) and until
/// when — so no skip is invisible, though the open circuit is not asked.
#[tokio::test]
async fn every_call_routed_past_an_open_primary_reports_it_and_its_state() {
    let rig = Rig::new(1).await;
    rig.fallback.otherwise(Reply::answered_by("small", 15));
    rig.breakers[0].record_failure().await.unwrap();
    let provider = rig.provider(3).build();
    for _ in 0..3 {
        provider.extract::<Person>("Ann.", None).await.unwrap();
    }
    let deferred: Vec<(String, &'static str, redstring::Timestamp)> = rig
        .observer
        .events()
        .iter()
        .filter_map(|e| match e {
            redstring::Event::DeploymentDeferred {
                breaker, state, until, ..
            } => Some((breaker.to_string(), *state, *until)),
            _ => None,
        })
        .collect();
    let due = redstring::Clock::now(&*rig.clock).saturating_add(Duration::from_secs(30));
    assert_eq!(
        deferred,
        [
            ("kg:circuit:primary".to_owned(), "open", due),
            ("kg:circuit:primary".to_owned(), "open", due)
        ],
        "the first call asked and was refused (a breaker event); the next two passed it over"
    );
    assert_eq!(rig.refusals("kg:circuit:primary"), 1);
}

#[tokio::test]
async fn a_permanent_failure_does_not_fall_over() {
    let rig = Rig::new(5).await;
    rig.primary.otherwise(Reply::status(400, BAD_REQUEST));
    rig.fallback.otherwise(Reply::answered_by("small", 15));
    let provider = rig.provider(3).build();
    let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
    assert_eq!(e.kind(), "bad_request", "{e:?}");
    assert_eq!((rig.primary.count(), rig.fallback.count()), (1, 0));
    assert!(rig.reroutes().is_empty());
}

#[tokio::test]
async fn fallover_is_a_retry_bounded_by_the_schedule_the_deadline_and_the_budget() {
    // No retries: no fallover.
    let rig = Rig::new(5).await;
    rig.primary.otherwise(Reply::status(503, LOADING));
    rig.fallback.otherwise(Reply::answered_by("small", 15));
    let e = rig
        .provider(0)
        .build()
        .extract::<Person>("Ann.", None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "retry_exhausted");
    assert_eq!(rig.fallback.count(), 0);

    // A deadline shorter than the backoff: no fallover.
    let e = rig
        .provider(3)
        .deadline(Duration::from_millis(500))
        .build()
        .extract::<Person>("Ann.", None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "deadline_exceeded");
    assert_eq!(rig.fallback.count(), 0);

    // An empty retry budget: no fallover.
    let budget = Arc::new(
        RetryBudget::builder()
            .ratio(0.0)
            .min_retries_per_sec(0)
            .max_balance(1)
            .env(Env::default().with_clock(rig.clock.clone()))
            .build()
            .unwrap(),
    );
    let e = rig
        .provider(3)
        .retry_budget(budget)
        .build()
        .extract::<Person>("Ann.", None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "retry_denied");
    assert_eq!(rig.fallback.count(), 0);
}

#[tokio::test]
async fn retries_cycle_through_the_deployments_with_one_admission_and_one_report_each() {
    let rig = Rig::new(5).await;
    rig.primary.otherwise(Reply::status(503, LOADING));
    rig.fallback.otherwise(Reply::status(503, LOADING));
    let e = rig
        .provider(3)
        .build()
        .extract::<Person>("Ann.", None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "retry_exhausted");
    assert_eq!((rig.primary.count(), rig.fallback.count()), (2, 2), "A, B, A, B");
    let allowed = |prefix: &str| {
        rig.observer
            .events()
            .into_iter()
            .filter(|e| matches!(e, Event::BreakerAllowed { breaker, .. } if &**breaker == prefix))
            .count()
    };
    assert_eq!((allowed("kg:circuit:primary"), allowed("kg:circuit:fallback")), (1, 1));
    assert_eq!(
        (rig.failures("kg:circuit:primary"), rig.failures("kg:circuit:fallback")),
        (1, 1),
        "one failure report per breaker for the call"
    );
    assert_eq!(rig.limiter.remaining(T).await.unwrap(), 99);
}

#[tokio::test]
async fn a_cooldown_on_the_primary_sends_calls_to_the_fallback_without_waiting() {
    let rig = Rig::new(5).await;
    rig.primary.otherwise(Reply::answered_by("big", 15));
    rig.fallback.otherwise(Reply::answered_by("small", 15));
    rig.breakers[0].cool_down(Duration::from_secs(20)).await.unwrap();
    let provider = rig.provider(3).build();
    let answer = provider.extract_with_model::<Person>("Ann.", None).await.unwrap();
    assert_eq!(answer.model, "openai-compatible/small");
    assert!(rig.clock.sleeps().is_empty(), "skipped, not waited out");
    assert_eq!(rig.primary.count(), 0);
    assert_eq!(
        rig.reroutes(),
        [("kg:circuit:primary".into(), "kg:circuit:fallback".into(), "refused")]
    );
}

#[tokio::test]
async fn when_every_deployment_refuses_the_soonest_cooldown_is_waited_out() {
    let rig = Rig::new(1).await;
    rig.primary.otherwise(Reply::answered_by("big", 15));
    rig.fallback.otherwise(Reply::answered_by("small", 15));
    rig.breakers[0].record_failure().await.unwrap(); // open: 30 s
    rig.breakers[1].cool_down(Duration::from_secs(4)).await.unwrap();
    let provider = rig.provider(3).build();
    let answer = provider.extract_with_model::<Person>("Ann.", None).await.unwrap();
    assert_eq!(answer.model, "openai-compatible/small");
    assert_eq!(rig.clock.sleeps(), [Duration::from_secs(4)]);

    // Both refusing by their circuits: the error names the soonest.
    let rig = Rig::new(1).await;
    rig.breakers[0].record_failure().await.unwrap();
    rig.clock.advance(Duration::from_secs(10));
    rig.breakers[1].record_failure().await.unwrap();
    let e = rig
        .provider(3)
        .build()
        .extract::<Person>("Ann.", None)
        .await
        .unwrap_err();
    let ExtractError::CircuitOpen(open) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(open.retry_after, Duration::from_secs(20));
    assert_eq!(
        e.to_string(),
        "openai-compatible/big is unavailable; the next probe is due in 20.00s"
    );
}
