//! The hardened provider over the real adapter and a real local HTTP server,
//! on a manual clock: attempts, sleeps, breaker and limiter decisions, the
//! deadline, and what it reports.

use std::sync::Arc;
use std::time::Duration;

use redstring::provider::{
    BoxFuture, DeadlineWait, ExtractError, HardenedProvider, HttpRequest, HttpResponse, HttpTransport, LlmProvider,
    LlmProviderExt, OpenAiCompatible, ProviderError, ReqwestTransport, TransportError,
};
use redstring::{
    CircuitBreaker, CircuitState, Clock, Env, Event, ManualClock, RateLimiter, RecordingObserver, RetryPolicy,
    Retryable, SeededRandom, TenantId,
};
use testkit::http::{PEG_NATIVE_500, RawServer, Reply, TestServer, refused_base_url};

const KEY: &str = "sk-hardened-5ecret";
const LOADING: &str = r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#;
const ANN: &str = r#"{"name":"Ann"}"#;

#[derive(Debug, PartialEq, serde::Deserialize, schemars::JsonSchema)]
struct Person {
    name: String,
}

/// The pieces one test wires together, all on one manual clock.
struct Rig {
    server: TestServer,
    clock: Arc<ManualClock>,
    observer: Arc<RecordingObserver>,
    /// The clock and the observer, for the rig's builders.
    env: Env,
    limiter: Arc<RateLimiter>,
    breaker: Arc<CircuitBreaker>,
}

impl Rig {
    async fn new(rpm: u32, failure_threshold: u32) -> Self {
        Rig::on(TestServer::start().await, rpm, failure_threshold)
    }

    fn on(server: TestServer, rpm: u32, failure_threshold: u32) -> Self {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let observer = Arc::new(RecordingObserver::new());
        let env = Env::default().with_clock(clock.clone()).with_observer(observer.clone());
        let limiter = Arc::new(RateLimiter::builder(rpm).env(env.clone()).build().unwrap());
        let breaker = Arc::new(
            CircuitBreaker::builder()
                .failure_threshold(failure_threshold)
                .recovery_timeout(Duration::from_secs(30))
                .env(env.clone())
                .build()
                .unwrap(),
        );
        Rig {
            server,
            clock,
            observer,
            env,
            limiter,
            breaker,
        }
    }

    fn adapter(&self, base_url: &str) -> OpenAiCompatible<ReqwestTransport> {
        OpenAiCompatible::builder(base_url, "qwen3")
            .api_key(KEY)
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap()
    }

    /// A hardened provider for `tenant` with jitter off and `max_retries`.
    fn provider(
        &self,
        tenant: TenantId,
        max_retries: u32,
    ) -> redstring::provider::HardenedProviderBuilder<
        OpenAiCompatible<ReqwestTransport>,
        redstring::MemoryCache,
        redstring::MemoryCache,
    > {
        self.provider_at(&self.server.base_url(), tenant, max_retries)
    }

    fn provider_at(
        &self,
        base_url: &str,
        tenant: TenantId,
        max_retries: u32,
    ) -> redstring::provider::HardenedProviderBuilder<
        OpenAiCompatible<ReqwestTransport>,
        redstring::MemoryCache,
        redstring::MemoryCache,
    > {
        HardenedProvider::builder(
            self.adapter(base_url),
            tenant,
            self.limiter.clone(),
            self.breaker.clone(),
        )
        .retry_policy(
            RetryPolicy::builder()
                .max_retries(max_retries)
                .jitter(0.0)
                .build()
                .unwrap(),
        )
        .env(self.env.clone().with_rng(Arc::new(SeededRandom::from_seed(7))))
    }

    fn finished(&self) -> Vec<(&'static str, u32)> {
        self.observer
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Event::CallFinished { outcome, attempts, .. } => Some((outcome, attempts)),
                _ => None,
            })
            .collect()
    }

    /// Failures the breaker recorded, from its own events.
    fn breaker_failures(&self) -> usize {
        self.observer
            .events()
            .into_iter()
            .filter(|e| matches!(e, Event::BreakerFailureRecorded { .. }))
            .count()
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

const A: TenantId = TenantId::from_u128(1);
const B: TenantId = TenantId::from_u128(2);

#[tokio::test]
async fn a_success_passes_through_and_records_success() {
    let rig = Rig::new(10, 3).await;
    rig.server.push(Reply::completion(ANN));
    let provider = rig.provider(A, 3).build();
    assert_eq!(provider.model(), "openai-compatible/qwen3", "provenance reads through");
    let person: Person = provider.extract("Ann.", Some("sys")).await.unwrap();
    assert_eq!(person.name, "Ann");
    assert_eq!(rig.server.requests()[0].body["messages"][0]["content"], "sys");
    assert_eq!(rig.finished(), [("ok", 1)]);
    assert_eq!(rig.breaker_failures(), 0);
    assert_eq!(rig.limiter.remaining(A).await.unwrap(), 9);
    assert!(rig.clock.sleeps().is_empty());
}

#[tokio::test]
async fn a_malformed_answer_is_one_attempt_with_no_sleeping_and_no_breaker_failure() {
    let rig = Rig::new(10, 1).await;
    rig.server.otherwise(Reply::completion(r#"{"nom":"Ann"}"#));
    let provider = rig.provider(A, 3).build();
    let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
    assert!(
        matches!(e, ExtractError::Provider(ProviderError::Malformed { .. })),
        "{e:?}"
    );
    assert_eq!(rig.server.count(), 1);
    assert!(rig.clock.sleeps().is_empty());
    assert_eq!(rig.finished(), [("malformed", 1)]);
    assert_eq!(
        rig.breaker.state().await.unwrap(),
        CircuitState::Closed,
        "threshold 1, yet closed"
    );
}

#[tokio::test]
async fn empty_answers_never_open_the_circuit() {
    let rig = Rig::new(10, 2).await;
    rig.server.otherwise(Reply::completion_message(
        serde_json::json!({"content": null, "reasoning_content": "thinking"}),
        "length",
    ));
    let provider = rig.provider(A, 3).build();
    for _ in 0..4 {
        let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
        assert!(
            matches!(e, ExtractError::Provider(ProviderError::Empty { .. })),
            "{e:?}"
        );
    }
    assert_eq!(rig.server.count(), 4);
    assert!(rig.clock.sleeps().is_empty());
    assert_eq!(rig.breaker.state().await.unwrap(), CircuitState::Closed);
    assert_eq!(rig.breaker_failures(), 0);
}

#[tokio::test]
async fn a_503_storm_exhausts_the_schedule_with_exact_delays() {
    let rig = Rig::new(10, 5).await;
    rig.server.otherwise(Reply::status(503, LOADING));
    let provider = rig.provider(A, 3).build();
    let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
    let ExtractError::RetryExhausted(x) = &e else {
        panic!("{e:?}")
    };
    assert_eq!((x.attempts, x.max_retries), (4, 3));
    assert_eq!(e.to_string(), "Exhausted 3 retries for extract");
    assert!(matches!(
        e.provider_error(),
        Some(ProviderError::Unavailable { message, .. }) if message == "Loading model"
    ));
    assert_eq!(rig.server.count(), 4);
    assert_eq!(rig.clock.sleeps(), [secs(1), secs(2), secs(4)]);
    assert_eq!(rig.finished(), [("retry_exhausted", 4)]);
    assert_eq!(rig.breaker_failures(), 1, "one breaker failure per exhausted call");
    assert_eq!(
        rig.limiter.remaining(A).await.unwrap(),
        9,
        "one slot per call, not per attempt"
    );
}

#[tokio::test]
async fn a_retry_budget_bounds_a_storms_retries_across_providers() {
    // Breaker and limiter wide open, so only the budget decides.
    let rig = Rig::new(1000, 1000).await;
    rig.server.otherwise(Reply::status(503, LOADING));
    let budget = Arc::new(
        redstring::RetryBudget::builder()
            .ratio(0.2)
            .min_retries_per_sec(0)
            .env(rig.env.clone())
            .build()
            .unwrap(),
    );
    // Two tenants' providers share one budget, as a fleet's workers would.
    let providers = [A, B].map(|t| rig.provider(t, 3).retry_budget(budget.clone()).build());
    for i in 0..20 {
        let e = providers[i % 2].extract::<Person>("Ann.", None).await.unwrap_err();
        // Every fifth call has earned one retry; the rest are denied at once.
        let ExtractError::RetryDenied(d) = &e else {
            panic!("call {i}: {e:?}")
        };
        assert_eq!(d.attempts, if i % 5 == 4 { 2 } else { 1 }, "call {i}");
        assert!(matches!(e.provider_error(), Some(ProviderError::Unavailable { .. })));
        assert_eq!(e.kind(), "retry_denied");
    }
    // Twenty calls without a budget would have sent 80 requests.
    assert_eq!(rig.server.count(), 24, "20 first attempts and 4 budgeted retries");
    let denied = rig
        .observer
        .events()
        .into_iter()
        .filter(|e| matches!(e, Event::RetryBudgetStep { granted: false, .. }))
        .count();
    assert_eq!(denied, 20, "every call ended on one denial");
    assert_eq!(rig.breaker_failures(), 20, "a denied retry reports the failure");
}

#[tokio::test]
async fn the_servers_retry_after_is_the_floor_of_the_backoff() {
    let rig = Rig::new(10, 5).await;
    rig.server
        .push(Reply::status(429, r#"{"error":{"message":"slow down"}}"#).header("retry-after", "5"))
        .push(Reply::status(503, LOADING).header("retry-after-ms", "100"))
        .push(Reply::completion(ANN));
    let provider = rig.provider(A, 3).build();
    let person: Person = provider.extract("Ann.", None).await.unwrap();
    assert_eq!(person.name, "Ann");
    // 5 s asked > 1 s backoff; then 0.1 s asked < 2 s backoff.
    assert_eq!(rig.clock.sleeps(), [secs(5), secs(2)]);
    assert_eq!(rig.finished(), [("ok", 3)]);
}

/// The cooldown a later call is refused with, unsent: its reason and wait.
async fn refused_by_cooldown(rig: &Rig, provider: &impl LlmProvider) -> Duration {
    let sent = rig.server.count();
    let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
    assert_eq!(rig.server.count(), sent, "a call inside the cooldown is not sent");
    match e {
        ExtractError::CircuitOpen(open) if open.reason == redstring::Refusal::Cooldown => open.retry_after,
        other => panic!("refused by a cooldown: {other:?}"),
    }
}

fn quota_events(rig: &Rig) -> Vec<(Duration, bool)> {
    rig.observer
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::QuotaExhausted { wait, reset_given, .. } => Some((wait, reset_given)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_reset_beyond_the_cap_is_a_spent_quota_that_cools_the_deployment_until_it() {
    let rig = Rig::new(10, 5).await;
    rig.server
        .push(Reply::status(429, r#"{"error":{"message":"come back tomorrow"}}"#).header("retry-after", "86400"));
    let provider = rig.provider(A, 3).max_server_delay(secs(60)).build();
    let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
    assert!(
        matches!(&e, ExtractError::Provider(ProviderError::QuotaExhausted { retry_after: Some(d), .. }) if *d == secs(86_400)),
        "{e:?}"
    );
    assert_eq!(e.kind(), "quota_exhausted");
    assert_eq!(e.retry_after(), Some(secs(86_400)));
    assert_eq!(rig.server.count(), 1);
    assert!(rig.clock.sleeps().is_empty());
    // The whole day, not max_server_delay's minute: nothing is sent there
    // until the reset, and the server's answer opened no circuit.
    assert_eq!(quota_events(&rig), [(secs(86_400), true)]);
    rig.clock.advance(secs(3_600));
    assert_eq!(refused_by_cooldown(&rig, &provider).await, secs(86_400 - 3_600));
    assert_eq!(rig.breaker.state().await.unwrap(), CircuitState::Closed);
    assert_eq!(rig.breaker_failures(), 0);
}

#[tokio::test]
async fn a_spent_quota_cools_for_its_reset_at_most_max_quota_cooldown() {
    let rig = Rig::new(10, 5).await;
    rig.server.push(
        Reply::status(429, r#"{"error":{"message":"requests per day"}}"#)
            .header("x-ratelimit-remaining-requests", "0")
            .header("x-ratelimit-reset-requests", "5h0m0s"),
    );
    let provider = rig.provider(A, 3).max_quota_cooldown(secs(7_200)).build();
    let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
    assert_eq!(e.kind(), "quota_exhausted", "{e:?}");
    assert_eq!(quota_events(&rig), [(secs(7_200), true)]);
    assert_eq!(refused_by_cooldown(&rig, &provider).await, secs(7_200));
}

#[tokio::test]
async fn insufficient_quota_cools_the_deployment_for_quota_cooldown() {
    let rig = Rig::new(10, 5).await;
    let spent = r#"{"error":{"message":"quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
    rig.server
        .push(Reply::status(429, spent))
        .push(Reply::status(429, spent));
    let provider = rig.provider(A, 3).build();
    let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
    assert_eq!(e.kind(), "quota_exhausted");
    assert_eq!(quota_events(&rig), [(secs(3_600), false)]);
    assert_eq!(refused_by_cooldown(&rig, &provider).await, secs(3_600));

    // Zero writes no cooldown: the next call is sent, and spent again.
    rig.clock.advance(secs(3_600));
    let unguarded = rig.provider(A, 3).quota_cooldown(Duration::ZERO).build();
    assert_eq!(
        unguarded.extract::<Person>("Ann.", None).await.unwrap_err().kind(),
        "quota_exhausted"
    );
    assert_eq!(rig.server.count(), 2);
}

#[tokio::test]
async fn a_short_reset_on_a_spent_account_and_a_long_503_are_not_taken_at_their_word() {
    let rig = Rig::new(10, 5).await;
    // Out of credit, with a proxy's one-second Retry-After: the account's
    // quota_cooldown, not a second.
    let spent = r#"{"error":{"message":"quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
    rig.server.push(Reply::status(429, spent).header("retry-after", "1"));
    let provider = rig.provider(A, 0).cooldown_waits(0).build();
    assert_eq!(
        provider.extract::<Person>("Ann.", None).await.unwrap_err().kind(),
        "quota_exhausted"
    );
    assert_eq!(quota_events(&rig), [(secs(3_600), false)]);
    assert_eq!(refused_by_cooldown(&rig, &provider).await, secs(3_600));

    // A server reloading for ten minutes is no spent quota: its cooldown
    // is capped at max_server_delay, and no quota event is heard.
    let rig = Rig::new(10, 5).await;
    rig.server
        .push(Reply::status(503, LOADING).header("retry-after", "600"));
    let provider = rig.provider(A, 0).cooldown_waits(0).build();
    provider.extract::<Person>("Ann.", None).await.unwrap_err();
    assert!(quota_events(&rig).is_empty());
    assert_eq!(refused_by_cooldown(&rig, &provider).await, secs(120));
}

#[tokio::test]
async fn a_per_minute_429_keeps_its_short_cooldown() {
    let rig = Rig::new(10, 5).await;
    rig.server
        .push(Reply::status(429, r#"{"error":{"message":"slow down"}}"#).header("retry-after", "30"))
        .push(Reply::completion(ANN));
    // No cooldown slept off, so the next call shows it.
    let provider = rig.provider(A, 0).cooldown_waits(0).build();
    let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
    assert_eq!(e.kind(), "retry_exhausted");
    assert!(quota_events(&rig).is_empty());
    assert_eq!(refused_by_cooldown(&rig, &provider).await, secs(30));
    rig.clock.advance(secs(30));
    let person: Person = provider.extract("Ann.", None).await.unwrap();
    assert_eq!(person.name, "Ann");
}

#[tokio::test]
async fn permanent_http_failures_are_returned_unwrapped_on_the_first_attempt() {
    let rig = Rig::new(10, 1).await;
    rig.server
        .push(Reply::status(401, r#"{"error":{"message":"bad key"}}"#))
        .push(Reply::status(
            404,
            r#"{"error":"model \"qwen3\" not found, try pulling it first"}"#,
        ))
        .push(Reply::status(400, r#"{"error":{"message":"context exceeded"}}"#))
        .push(Reply::status(
            429,
            r#"{"error":{"message":"quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
        ));
    let provider = rig.provider(A, 3).build();
    let mut kinds = Vec::new();
    for _ in 0..4 {
        let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
        assert!(matches!(e, ExtractError::Provider(_)), "{e:?}");
        kinds.push(e.kind());
    }
    assert_eq!(
        kinds,
        ["authentication", "unknown_model", "bad_request", "quota_exhausted"]
    );
    assert_eq!(rig.server.count(), 4);
    assert!(rig.clock.sleeps().is_empty());
    assert_eq!(rig.breaker.state().await.unwrap(), CircuitState::Closed);
}

#[tokio::test]
async fn the_breaker_opens_after_the_threshold_then_recovers_through_a_probe() {
    let rig = Rig::new(100, 2).await;
    rig.server.push(Reply::status(502, "bad gateway")).push(Reply::Drop);
    let provider = rig.provider(A, 0).build();
    for expected in ["server_error", "transport_reset"] {
        let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
        assert!(matches!(e, ExtractError::RetryExhausted(_)), "{e:?}");
        assert_eq!(e.provider_error().map(ProviderError::kind), Some(expected));
    }
    assert_eq!(rig.breaker.state().await.unwrap(), CircuitState::Open);
    let slots_before = rig.limiter.remaining(A).await.unwrap();

    rig.clock.advance(secs(10));
    let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
    match &e {
        ExtractError::CircuitOpen(open) => {
            assert_eq!(open.retry_after, secs(20));
            assert_eq!(
                open.message,
                "openai-compatible/qwen3 is unavailable; the next probe is due in 20.00s"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(rig.server.count(), 2, "an open circuit makes no request");
    assert_eq!(
        rig.limiter.remaining(A).await.unwrap(),
        slots_before,
        "nor spends a slot"
    );
    assert!(rig.clock.sleeps().is_empty(), "nor sleeps");

    rig.clock.advance(secs(20));
    rig.server.push(Reply::completion(ANN));
    let person: Person = provider.extract("Ann.", None).await.unwrap();
    assert_eq!(person.name, "Ann");
    assert_eq!(rig.breaker.state().await.unwrap(), CircuitState::Closed);
    assert_eq!(
        rig.finished(),
        [
            ("retry_exhausted", 1),
            ("retry_exhausted", 1),
            ("circuit_open", 0),
            ("ok", 1)
        ]
    );
    let transitions: Vec<(CircuitState, CircuitState)> = rig
        .observer
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::BreakerTransition { from, to, .. } => Some((from, to)),
            _ => None,
        })
        .collect();
    assert_eq!(
        transitions,
        [
            (CircuitState::Closed, CircuitState::Open),
            (CircuitState::Open, CircuitState::HalfOpen),
            (CircuitState::HalfOpen, CircuitState::Closed)
        ]
    );
}

#[tokio::test]
async fn a_server_that_refuses_connections_opens_the_circuit() {
    let rig = Rig::new(100, 2).await;
    let dead = refused_base_url().await;
    let provider = rig.provider_at(&dead, A, 1).build();
    for _ in 0..2 {
        let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
        assert_eq!(
            e.provider_error().map(ProviderError::kind),
            Some("transport_connect"),
            "{e:?}"
        );
    }
    assert_eq!(rig.clock.sleeps(), [secs(1), secs(1)]);
    assert!(matches!(
        provider.extract::<Person>("Ann.", None).await,
        Err(ExtractError::CircuitOpen(_))
    ));
}

#[tokio::test]
async fn refusals_count_as_breaker_failures_only_when_configured() {
    let refusal = Reply::completion_message(serde_json::json!({"content": null, "refusal": "no"}), "stop");
    for (trips, expected) in [(false, CircuitState::Closed), (true, CircuitState::Open)] {
        let rig = Rig::new(10, 1).await;
        rig.server.otherwise(refusal.clone());
        let provider = rig.provider(A, 3).refusals_trip_breaker(trips).build();
        let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
        assert_eq!(e.kind(), "refused");
        assert_eq!(rig.server.count(), 1, "a refusal is never retried");
        assert_eq!(
            rig.breaker.state().await.unwrap(),
            expected,
            "refusals_trip_breaker({trips})"
        );
    }
}

#[tokio::test]
async fn the_limiter_waits_exactly_retry_after_and_is_per_tenant() {
    let rig = Rig::new(1, 5).await;
    rig.server.otherwise(Reply::completion(ANN));
    let a = rig.provider(A, 0).build();
    let b = rig.provider(B, 0).build();

    let _: Person = a.extract("one", None).await.unwrap();
    rig.clock.advance(secs(15));
    let _: Person = b.extract("B is not limited by A", None).await.unwrap();
    assert!(rig.clock.sleeps().is_empty());

    let _: Person = a.extract("two", None).await.unwrap();
    // A's first hit ages out 45 s (and one microsecond: the window is
    // inclusive) later; one sleep of exactly that frees the slot.
    let wait = secs(45) + Duration::from_micros(1);
    assert_eq!(rig.clock.sleeps(), [wait]);
    assert_eq!(rig.server.count(), 3);
    let waits: Vec<(TenantId, Duration)> = rig
        .observer
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::RateLimitWait { tenant, wait, .. } => Some((tenant, wait)),
            _ => None,
        })
        .collect();
    assert_eq!(waits, [(A, wait)]);
}

#[tokio::test]
async fn a_refusal_that_outlasts_the_allowed_waits_is_returned() {
    let rig = Rig::new(1, 5).await;
    rig.server.otherwise(Reply::completion(ANN));
    let patient = rig.provider(A, 0).build();
    let impatient = rig.provider(A, 0).limiter_waits(0).build();
    let _: Person = patient.extract("one", None).await.unwrap();
    let e = impatient.extract::<Person>("two", None).await.unwrap_err();
    match &e {
        ExtractError::RateLimited(r) => assert_eq!(r.retry_after, secs(60) + Duration::from_micros(1)),
        other => panic!("{other:?}"),
    }
    assert_eq!(e.retry_after(), Some(secs(60) + Duration::from_micros(1)));
    assert_eq!(rig.server.count(), 1);
    assert!(rig.clock.sleeps().is_empty());
    assert_eq!(rig.finished(), [("ok", 1), ("rate_limited", 0)]);
}

#[tokio::test]
async fn the_deadline_stops_before_a_backoff_it_cannot_cover() {
    let rig = Rig::new(10, 5).await;
    rig.server.otherwise(Reply::status(503, LOADING));
    let provider = rig.provider(A, 3).deadline(Duration::from_millis(2500)).build();
    let start = rig.clock.now();
    let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
    let ExtractError::Deadline(d) = &e else { panic!("{e:?}") };
    assert_eq!(d.waiting_for, DeadlineWait::Retry);
    assert_eq!(d.attempts, 2);
    assert_eq!(d.needed, secs(2));
    assert_eq!(d.remaining, Duration::from_millis(1500));
    assert_eq!(
        e.to_string(),
        "deadline leaves 1.5s but the next retry needs 2s (after 2 attempts)"
    );
    assert_eq!(d.last.kind(), "unavailable");
    assert_eq!(rig.server.count(), 2);
    assert_eq!(rig.clock.sleeps(), [secs(1)]);
    assert!(rig.clock.now().saturating_duration_since(start) <= Duration::from_millis(2500));
    assert_eq!(rig.finished(), [("deadline_exceeded", 2)]);
    assert_eq!(rig.breaker_failures(), 1);
}

#[tokio::test]
async fn the_deadline_covers_the_servers_retry_after_too() {
    let rig = Rig::new(10, 5).await;
    rig.server
        .push(Reply::status(429, r#"{"error":{"message":"slow down"}}"#).header("retry-after", "30"));
    let provider = rig.provider(A, 3).deadline(secs(10)).build();
    let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
    let ExtractError::Deadline(d) = &e else { panic!("{e:?}") };
    assert_eq!((d.needed, d.remaining), (secs(30), secs(10)));
    assert_eq!(rig.server.count(), 1);
    assert!(rig.clock.sleeps().is_empty());
}

#[tokio::test]
async fn the_deadline_covers_the_limiter_wait() {
    let rig = Rig::new(1, 5).await;
    rig.server.otherwise(Reply::completion(ANN));
    let provider = rig.provider(A, 0).deadline(secs(30)).build();
    let _: Person = provider.extract("one", None).await.unwrap();
    let e = provider.extract::<Person>("two", None).await.unwrap_err();
    let ExtractError::Deadline(d) = &e else { panic!("{e:?}") };
    assert_eq!(d.waiting_for, DeadlineWait::RateLimit);
    assert_eq!(
        (d.needed, d.remaining, d.attempts),
        (secs(60) + Duration::from_micros(1), secs(30), 0)
    );
    assert!(matches!(*d.last, ExtractError::RateLimited(_)));
    assert_eq!(rig.server.count(), 1);
    assert!(rig.clock.sleeps().is_empty());
}

#[tokio::test]
async fn blank_text_touches_nothing() {
    let rig = Rig::new(10, 5).await;
    let provider = rig.provider(A, 3).build();
    let e = provider.extract::<Person>("  ", None).await.unwrap_err();
    assert!(matches!(e, ExtractError::Provider(ProviderError::BlankText)));
    let request_schema = redstring::provider::OutputSchema::for_type::<Person>();
    let direct = provider
        .extract_value(redstring::provider::ExtractRequest {
            text: "\n",
            system_prompt: None,
            schema: &request_schema,
        })
        .await;
    assert!(matches!(direct, Err(ExtractError::Provider(ProviderError::BlankText))));
    assert_eq!(rig.server.count(), 0);
    assert_eq!(rig.limiter.remaining(A).await.unwrap(), 10);
}

#[tokio::test]
async fn a_custom_classifier_replaces_the_default() {
    let rig = Rig::new(10, 5).await;
    rig.server.otherwise(Reply::status(503, LOADING));
    let provider = rig.provider(A, 3).classifier(|_| Retryable::No).build();
    let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
    assert_eq!(e.kind(), "unavailable");
    assert_eq!(rig.server.count(), 1);
}

#[tokio::test]
async fn the_key_never_appears_in_errors_events_or_debug() {
    let rig = Rig::new(10, 5).await;
    rig.server
        .push(Reply::status(
            401,
            format!(r#"{{"error":{{"message":"Incorrect API key provided: {KEY}"}}}}"#),
        ))
        .push(Reply::status(500, format!("internal error near {KEY}")))
        .otherwise(Reply::status(
            503,
            format!(r#"{{"error":{{"message":"{KEY} loading"}}}}"#),
        ));
    let provider = rig.provider(A, 2).build();
    let mut shown = format!("{provider:?}");
    for _ in 0..2 {
        let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
        shown.push_str(&format!("{e} {e:?}"));
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            shown.push_str(&s.to_string());
            source = s.source();
        }
    }
    shown.push_str(&format!("{:?}", rig.observer.events()));
    assert!(
        rig.observer
            .events()
            .iter()
            .any(|e| matches!(e, Event::RetryScheduled { .. }))
    );
    assert!(!shown.contains(KEY), "the key leaked");
    assert!(shown.contains("[redacted]"));
}

#[tokio::test]
async fn a_hardened_provider_is_a_provider_and_nests_behind_a_trait_object() {
    let rig = Rig::new(10, 5).await;
    rig.server.push(Reply::completion(ANN));
    let provider: Arc<dyn LlmProvider> = Arc::new(rig.provider(A, 0).build());
    assert_eq!(provider.model(), "openai-compatible/qwen3");
    let person: Person = provider.extract("Ann.", None).await.unwrap();
    assert_eq!(person.name, "Ann");
}

#[tokio::test]
async fn a_probe_the_limiter_refuses_is_handed_back_instead_of_wedging_the_circuit() {
    let rig = Rig::new(1, 1).await;
    rig.server.push(Reply::status(502, "bad gateway"));
    let provider = rig.provider(A, 0).limiter_waits(0).build();
    let e = provider.extract::<Person>("one", None).await.unwrap_err();
    assert!(matches!(e, ExtractError::RetryExhausted(_)), "{e:?}");
    assert_eq!(rig.breaker.state().await.unwrap(), CircuitState::Open);

    // Recovery is due at +30 s, but the tenant's only slot frees at +60 s: the
    // probe is admitted by the breaker and refused by the limiter.
    rig.clock.advance(secs(30));
    let e = provider.extract::<Person>("two", None).await.unwrap_err();
    assert!(matches!(e, ExtractError::RateLimited(_)), "{e:?}");
    assert_eq!(rig.server.count(), 1);
    assert_eq!(
        rig.breaker.state().await.unwrap(),
        CircuitState::HalfOpen,
        "still half-open, but the probe was released, not held"
    );
    assert!(
        rig.breaker.allow_request().await,
        "the released probe's slot goes to the next caller at once"
    );

    // That bare probe never reports; its lease ends at +60 s and the next
    // call probes again.
    rig.clock.advance(secs(31));
    rig.server.push(Reply::completion(ANN));
    let person: Person = provider.extract("three", None).await.unwrap();
    assert_eq!(person.name, "Ann");
    assert_eq!(rig.breaker.state().await.unwrap(), CircuitState::Closed);
}

/// The production transport, recording the timeout each request was sent with.
#[derive(Clone)]
struct TimedTransport {
    inner: ReqwestTransport,
    timeouts: Arc<std::sync::Mutex<Vec<Duration>>>,
}

impl HttpTransport for TimedTransport {
    fn post(&self, request: HttpRequest) -> BoxFuture<'_, Result<HttpResponse, TransportError>> {
        self.timeouts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(request.timeout);
        self.inner.post(request)
    }
}

#[tokio::test]
async fn the_deadline_bounds_each_attempt_in_flight() {
    let rig = Rig::new(10, 5).await;
    rig.server
        .push(Reply::status(503, LOADING))
        .push(Reply::completion(ANN));
    let transport = TimedTransport {
        inner: ReqwestTransport::new().unwrap(),
        timeouts: Arc::default(),
    };
    let adapter = OpenAiCompatible::builder(rig.server.base_url(), "qwen3")
        .timeout(secs(20))
        .build_with(transport.clone())
        .unwrap();
    let provider = HardenedProvider::builder(adapter, A, rig.limiter.clone(), rig.breaker.clone())
        .retry_policy(RetryPolicy::builder().jitter(0.0).build().unwrap())
        .env(
            Env::default()
                .with_clock(rig.clock.clone())
                .with_rng(Arc::new(SeededRandom::from_seed(7))),
        )
        .deadline(secs(3))
        .build();
    let _: Person = provider.extract("Ann.", None).await.unwrap();
    // 3 s left for the first attempt; after the 1 s backoff, 2 s for the second.
    assert_eq!(*transport.timeouts.lock().unwrap(), [secs(3), secs(2)]);

    // Without a deadline the adapter's own timeout applies.
    rig.server.push(Reply::completion(ANN));
    let unbounded = HardenedProvider::builder(
        OpenAiCompatible::builder(rig.server.base_url(), "qwen3")
            .timeout(secs(20))
            .build_with(transport.clone())
            .unwrap(),
        A,
        rig.limiter.clone(),
        rig.breaker.clone(),
    )
    .env(Env::default().with_clock(rig.clock.clone()))
    .build();
    let _: Person = unbounded.extract("Ann.", None).await.unwrap();
    assert_eq!(transport.timeouts.lock().unwrap().last(), Some(&secs(20)));
}

#[tokio::test]
async fn llama_cpp_rejecting_its_own_output_is_one_attempt_and_never_opens_the_circuit() {
    let rig = Rig::new(10, 1).await;
    rig.server.otherwise(Reply::status(500, PEG_NATIVE_500));
    let provider = rig.provider(A, 3).build();
    for _ in 0..3 {
        let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
        assert_eq!(e.kind(), "unusable_output", "{e}");
    }
    assert_eq!(rig.server.count(), 3, "one generation per call, not four");
    assert!(rig.clock.sleeps().is_empty());
    assert_eq!(rig.breaker_failures(), 0);
    assert_eq!(rig.breaker.state().await.unwrap(), CircuitState::Closed);
}

#[tokio::test]
async fn a_redirect_loop_is_one_request_and_no_breaker_failure() {
    let rig = Rig::new(10, 1).await;
    rig.server
        .otherwise(Reply::status(307, "").header("location", "/v1/chat/completions"));
    let provider = rig.provider(A, 3).build();
    let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
    assert_eq!(e.kind(), "redirected", "{e}");
    assert_eq!(rig.server.count(), 1);
    assert_eq!(rig.breaker.state().await.unwrap(), CircuitState::Closed);
}

#[tokio::test]
async fn a_reply_that_is_not_http_is_not_retried_nor_a_breaker_failure() {
    let rig = Rig::new(10, 1).await;
    let raw = RawServer::start(b"SSH-2.0-OpenSSH_9.6\r\n").await;
    let provider = rig.provider_at(&raw.base_url(), A, 3).build();
    let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
    assert_eq!(e.kind(), "transport_protocol", "{e}");
    assert_eq!(raw.connections(), 1);
    assert!(rig.clock.sleeps().is_empty());
    assert_eq!(rig.breaker_failures(), 0);
    assert_eq!(rig.breaker.state().await.unwrap(), CircuitState::Closed);
}

#[tokio::test]
async fn the_hardened_answer_carries_the_provenance_of_the_model_that_answered() {
    let rig = Rig::new(10, 5).await;
    rig.server
        .push(Reply::status(503, LOADING))
        .push(Reply::completion(ANN));
    let provider = rig.provider(A, 3).build();
    let answer = provider.extract_with_model::<Person>("Ann.", None).await.unwrap();
    assert_eq!(answer.value, Person { name: "Ann".into() });
    assert_eq!(answer.model, "openai-compatible/served-model");
    assert_eq!(provider.model(), "openai-compatible/qwen3");
}

/// A rig whose limiter also limits tokens: 1000 per window.
fn token_rig(server: TestServer) -> (Rig, Arc<RateLimiter>) {
    let rig = Rig::on(server, 1000, 1000);
    let limiter = Arc::new(
        RateLimiter::builder(1000)
            .tokens_per_window(1000)
            .env(rig.env.clone())
            .build()
            .unwrap(),
    );
    (rig, limiter)
}

#[tokio::test]
async fn a_token_budget_reserves_the_estimate_and_settles_to_the_servers_usage() {
    let (rig, limiter) = token_rig(TestServer::start().await);
    rig.server.otherwise(Reply::completion(ANN));
    let provider = HardenedProvider::builder(
        rig.adapter(&rig.server.base_url()),
        A,
        limiter.clone(),
        rig.breaker.clone(),
    )
    .env(rig.env.clone())
    .token_estimate(|_| 600)
    .build();
    // Each call reserves 600 of 1000 and settles to the 15 the server used:
    // without settling, the second call would not fit.
    for call in 0..5 {
        let answer = provider.extract_with_model::<Person>("Ann.", None).await.unwrap();
        assert_eq!(answer.usage.map(|u| u.total()), Some(15), "call {call}");
    }
    let settled: Vec<(u64, u64)> = rig
        .observer
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::TokensSettled { estimate, actual, .. } => Some((estimate, actual)),
            _ => None,
        })
        .collect();
    assert_eq!(settled, [(600, 15); 5]);
    assert_eq!(
        limiter.acquire_tokens(A, 925).await.unwrap().tokens_left,
        0,
        "5 × 15 used, 925 free"
    );
}

#[tokio::test]
async fn a_call_the_server_refused_releases_its_tokens_and_an_oversized_one_is_refused_unsent() {
    let (rig, limiter) = token_rig(TestServer::start().await);
    rig.server.otherwise(Reply::status(503, LOADING));
    let provider = HardenedProvider::builder(
        rig.adapter(&rig.server.base_url()),
        A,
        limiter.clone(),
        rig.breaker.clone(),
    )
    .retry_policy(RetryPolicy::builder().max_retries(1).jitter(0.0).build().unwrap())
    .env(Env::default().with_clock(rig.clock.clone()))
    .token_estimate(|r| if r.text.len() > 10 { 5000 } else { 900 })
    .build();
    let e = provider.extract::<Person>("Ann.", None).await.unwrap_err();
    assert_eq!(e.kind(), "retry_exhausted");
    // The 503s generated nothing: the 900 reserved are free again.
    assert_eq!(limiter.acquire_tokens(A, 1000).await.unwrap().tokens_left, 0);
    let sent = rig.server.count();
    let big = provider
        .extract::<Person>("A much longer text.", None)
        .await
        .unwrap_err();
    let ExtractError::TokenLimited(refusal) = &big else {
        panic!("{big:?}")
    };
    assert_eq!(refusal.by, redstring::decide::tokens::RefusedBy::TooLarge);
    assert_eq!(big.retry_after(), None, "no wait makes 5000 fit in 1000");
    assert_eq!(rig.server.count(), sent, "nothing was sent");
}

/// The hardened provider as a tower service: the same calls, decisions and
/// errors, through `Service::call`, behind one of tower's own layers.
#[cfg(feature = "tower")]
#[tokio::test]
async fn the_hardened_provider_serves_typed_extractions_as_a_tower_service() {
    use redstring::tower::{BoxError, Extract, ExtractService};
    use tower::{Service, ServiceExt};

    let rig = Rig::new(1, 3).await;
    rig.server.push(Reply::completion(ANN));
    let provider = Arc::new(rig.provider(A, 0).limiter_waits(0).build());
    // Boxed as tower's middleware answers, so it stacks with their layers.
    let mut service = tower::ServiceBuilder::new()
        .map_err(|e: ExtractError| -> BoxError { e.into() })
        .service(ExtractService::new(provider));
    let answer = ServiceExt::<Extract<Person>>::ready(&mut service)
        .await
        .unwrap()
        .call(Extract::<Person>::new("Ann.").system_prompt("sys"))
        .await
        .unwrap();
    assert_eq!(answer.value.name, "Ann");
    // Provenance: the model that answered, as the server named it.
    assert_eq!(answer.model, "openai-compatible/served-model");
    assert_eq!(rig.server.requests()[0].body["messages"][0]["content"], "sys");
    // rpm 1: the second call is the limiter's, typed, and never sent.
    let refused = ServiceExt::<Extract<Person>>::ready(&mut service)
        .await
        .unwrap()
        .call(Extract::<Person>::new("Bob."))
        .await
        .unwrap_err();
    let refused = refused
        .downcast_ref::<ExtractError>()
        .expect("the provider's own error");
    assert!(matches!(refused, ExtractError::RateLimited(_)), "{refused:?}");
    assert_eq!(rig.server.count(), 1);
    assert_eq!(rig.finished(), [("ok", 1), ("rate_limited", 0)]);
}
