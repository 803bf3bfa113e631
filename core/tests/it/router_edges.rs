//! `HardenedProvider` over several deployments at its edges, on a manual
//! clock with scripted deployments: a server's wait that belongs to one
//! deployment, a fallover to a deployment with a larger answer, two
//! deployments sharing a breaker, every deployment refusing, a half-open
//! refusal, and failures that are about one deployment rather than the
//! request.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redstring::provider::{
    BoxFuture, Deployment, ExtractError, ExtractRequest, Extracted, HardenedProvider, LlmProvider, LlmProviderExt,
    ProviderError, TransportErrorKind,
};
use redstring::{
    CircuitBreaker, CircuitState, Clock, Env, ManualClock, MemoryCache, RateLimiter, RetryPolicy, SeededRandom,
    TenantId,
};
use serde_json::Value;

const T: TenantId = TenantId::from_u128(1);

/// Answers from a queue (then `"v"`), naming `model`, counting calls.
struct Scripted {
    model: &'static str,
    max_tokens: Option<u32>,
    answers: Mutex<VecDeque<Result<(), ExtractError>>>,
    calls: AtomicU32,
}

impl Scripted {
    fn new(model: &'static str, answers: Vec<Result<(), ExtractError>>) -> Arc<Self> {
        Self::with_max_tokens(model, None, answers)
    }
    fn with_max_tokens(
        model: &'static str,
        max_tokens: Option<u32>,
        answers: Vec<Result<(), ExtractError>>,
    ) -> Arc<Self> {
        Arc::new(Scripted {
            model,
            max_tokens,
            answers: Mutex::new(answers.into()),
            calls: AtomicU32::new(0),
        })
    }
    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

impl LlmProvider for Scripted {
    fn model(&self) -> &str {
        self.model
    }
    fn max_tokens(&self) -> Option<u32> {
        self.max_tokens
    }
    fn extract_answer<'a>(
        &'a self,
        _: ExtractRequest<'a>,
        _: Option<Duration>,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let next = self.answers.lock().unwrap().pop_front().unwrap_or(Ok(()));
        let model = self.model;
        Box::pin(async move { next.map(|()| answered_by(model)) })
    }
}

/// The answer `"v"`, produced by `model`.
fn answered_by(model: &str) -> Extracted<Value> {
    Extracted {
        value: Value::from("v"),
        model: model.to_owned(),
        usage: None,
        quota: None,
    }
}

fn rate_limited(after: Duration) -> Result<(), ExtractError> {
    Err(ProviderError::RateLimited {
        retry_after: Some(after),
        message: "slow down".into(),
    }
    .into())
}

fn unavailable() -> Result<(), ExtractError> {
    Err(ProviderError::Unavailable {
        retry_after: None,
        message: "Loading model".into(),
    }
    .into())
}

fn timed_out() -> Result<(), ExtractError> {
    Err(ProviderError::Transport {
        kind: TransportErrorKind::Timeout,
        detail: "timed out".into(),
    }
    .into())
}

fn breaker(clock: &Arc<ManualClock>, cache: &Arc<MemoryCache>, name: &str, threshold: u32) -> Arc<CircuitBreaker> {
    Arc::new(
        CircuitBreaker::builder()
            .key_prefix(format!("kg:circuit:{name}"))
            .failure_threshold(threshold)
            .env(Env::default().with_clock(clock.clone()))
            .cache(cache.clone())
            .build()
            .unwrap(),
    )
}

/// A manual clock, the breakers' cache on it, and a tenant limiter no test
/// here reaches.
/// `clock`, and a stream seeded with `seed`.
fn env(clock: &Arc<ManualClock>, seed: u64) -> Env {
    Env::default()
        .with_clock(clock.clone())
        .with_rng(Arc::new(SeededRandom::from_seed(seed)))
}

fn setup() -> (Arc<ManualClock>, Arc<MemoryCache>, Arc<RateLimiter>) {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let limiter = Arc::new(
        RateLimiter::builder(100)
            .env(Env::default().with_clock(clock.clone()))
            .build()
            .unwrap(),
    );
    (clock, cache, limiter)
}

fn policy(max_retries: u32) -> RetryPolicy {
    RetryPolicy::builder()
        .max_retries(max_retries)
        .jitter(0.0)
        .build()
        .unwrap()
}

/// A 429 from the primary asks *the primary* to be left alone for 30 s; the
/// fallback is healthy. The retry that falls over to the fallback must not
/// wait out the primary's Retry-After (nor be refused by the deadline for it).
#[tokio::test]
async fn a_primarys_retry_after_does_not_hold_or_forbid_the_fallover() {
    let (clock, cache, limiter) = setup();
    let (a, b) = (
        Scripted::new("a", vec![rate_limited(Duration::from_secs(30))]),
        Scripted::new("b", vec![]),
    );
    let p = HardenedProvider::over(Deployment::new(a.clone(), breaker(&clock, &cache, "a", 5)), T, limiter)
        .deployment(Deployment::new(b.clone(), breaker(&clock, &cache, "b", 5)))
        .retry_policy(policy(2))
        .deadline(Duration::from_secs(10))
        .env(env(&clock, 1))
        .build();
    let answer = p.extract_with_model::<String>("t", None).await;
    assert_eq!(b.calls(), 1, "the fallback was never tried: {answer:?}");
    assert_eq!(answer.unwrap().model, "b");
    assert!(
        clock.sleeps().iter().all(|s| *s < Duration::from_secs(30)),
        "slept the primary's Retry-After before calling the fallback: {:?}",
        clock.sleeps()
    );
}

/// The same with a Retry-After over `max_server_delay`, which one deployment
/// would take as permanent: the call still falls over to the fallback.
#[tokio::test]
async fn a_primarys_long_retry_after_does_not_end_the_call_before_the_fallback() {
    let (clock, cache, limiter) = setup();
    let (a, b) = (
        Scripted::new("a", vec![rate_limited(Duration::from_secs(600))]),
        Scripted::new("b", vec![]),
    );
    let p = HardenedProvider::over(Deployment::new(a.clone(), breaker(&clock, &cache, "a", 5)), T, limiter)
        .deployment(Deployment::new(b.clone(), breaker(&clock, &cache, "b", 5)))
        .retry_policy(policy(2))
        .env(env(&clock, 1))
        .build();
    let answer = p.extract_with_model::<String>("t", None).await;
    assert_eq!(b.calls(), 1, "the fallback was never tried: {answer:?}");
    assert_eq!(answer.unwrap().model, "b");
}

/// A retry that falls over to a deployment with a larger `max_tokens` and
/// times out there (it may have generated up to that) is charged that
/// deployment's estimate, not the primary's smaller one.
#[tokio::test]
async fn a_fallover_to_a_bigger_max_tokens_is_charged_by_that_deployments_estimate() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let limiter = Arc::new(
        RateLimiter::builder(100)
            .tokens_per_window(100_000)
            .env(Env::default().with_clock(clock.clone()))
            .build()
            .unwrap(),
    );
    let a = Scripted::with_max_tokens("a", Some(10), vec![unavailable()]);
    let b = Scripted::with_max_tokens("b", Some(50_000), vec![timed_out()]);
    let p = HardenedProvider::over(
        Deployment::new(a.clone(), breaker(&clock, &cache, "a", 5)),
        T,
        limiter.clone(),
    )
    .deployment(Deployment::new(b.clone(), breaker(&clock, &cache, "b", 5)))
    .retry_policy(policy(1))
    .env(env(&clock, 1))
    .build();
    p.extract::<String>("t", None).await.unwrap_err();
    assert_eq!((a.calls(), b.calls()), (1, 1));
    let left = limiter.acquire_tokens(T, 1).await.unwrap().tokens_left;
    let charged = 100_000 - 1 - left;
    assert!(
        charged >= 50_000,
        "the timed-out attempt at b (max_tokens 50000) was charged {charged} tokens"
    );
}

/// Two deployments may share one breaker. A call that fails at one and falls
/// over to the other is admitted once by that breaker and reports one
/// failure: a threshold-2 circuit stays closed after a single call.
#[tokio::test]
async fn two_deployments_sharing_a_breaker_hear_one_report_per_call() {
    let (clock, cache, limiter) = setup();
    let shared = breaker(&clock, &cache, "gpu", 2);
    let (a, b) = (
        Scripted::new("a", vec![unavailable()]),
        Scripted::new("b", vec![unavailable()]),
    );
    let p = HardenedProvider::over(Deployment::new(a.clone(), shared.clone()), T, limiter)
        .deployment(Deployment::new(b.clone(), shared.clone()))
        .retry_policy(policy(1))
        .env(env(&clock, 1))
        .build();
    p.extract::<String>("t", None).await.unwrap_err();
    assert_eq!((a.calls(), b.calls()), (1, 1));
    assert_eq!(
        shared.state().await.unwrap(),
        CircuitState::Closed,
        "one failed call opened a threshold-2 circuit"
    );
}

/// Every deployment refuses; the error names the one that admits soonest
/// (b), and so does the call's `CallFinished` event — not a, the first in
/// order, which was never called.
#[tokio::test]
async fn when_every_deployment_refuses_the_finished_event_names_the_refusal_returned() {
    let (clock, cache, limiter) = setup();
    let observer = Arc::new(redstring::RecordingObserver::new());
    let (ba, bb) = (breaker(&clock, &cache, "a", 1), breaker(&clock, &cache, "b", 1));
    bb.record_failure().await.unwrap();
    clock.advance(Duration::from_secs(10));
    ba.record_failure().await.unwrap();
    let p = HardenedProvider::over(Deployment::new(Scripted::new("a", vec![]), ba), T, limiter)
        .deployment(Deployment::new(Scripted::new("b", vec![]), bb))
        .env(env(&clock, 1).with_observer(observer.clone()))
        .build();
    let e = p.extract::<String>("t", None).await.unwrap_err();
    assert!(e.to_string().starts_with("b is unavailable"), "{e}");
    let finished: Vec<String> = observer
        .events()
        .into_iter()
        .filter_map(|e| match e {
            redstring::Event::CallFinished { model, .. } => Some(model.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(finished, ["b"]);
}

/// Another worker holds a's half-open probe when this provider asks: the
/// refusal's wait is the probe's whole lease, which is not remembered as "a
/// refuses until then" — the probe may close the circuit at any moment. It
/// succeeds at once, and the next call goes to the recovered primary first.
#[tokio::test]
async fn a_half_open_refusal_does_not_keep_a_recovered_primary_last_for_a_whole_probe_lease() {
    let (clock, cache, limiter) = setup();
    let (ba, bb) = (breaker(&clock, &cache, "a", 1), breaker(&clock, &cache, "b", 1));
    ba.record_failure().await.unwrap();
    clock.advance(Duration::from_secs(61));
    let (a, b) = (Scripted::new("a", vec![]), Scripted::new("b", vec![]));
    let p = HardenedProvider::over(Deployment::new(a.clone(), ba.clone()), T, limiter)
        .deployment(Deployment::new(b.clone(), bb))
        .env(env(&clock, 1))
        .build();
    // Another worker's probe.
    let probe = ba.admit().await;
    assert!(matches!(probe, redstring::breaker::Permit::Probe(_)), "{probe:?}");
    assert_eq!(p.extract_with_model::<String>("t", None).await.unwrap().model, "b");
    ba.record_success_for(&probe).await.unwrap();
    assert_eq!(ba.state().await.unwrap(), CircuitState::Closed);
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        p.extract_with_model::<String>("t", None).await.unwrap().model,
        "a",
        "the closed primary is asked first again"
    );
}

fn quota_exhausted() -> Result<(), ExtractError> {
    Err(ProviderError::QuotaExhausted {
        retry_after: None,
        message: "You exceeded your current quota".into(),
    }
    .into())
}

/// An account out of credit, a refused key, a model the deployment does not
/// serve: the next deployment may well answer, so the call falls over; a
/// malformed request would fail everywhere, so it does not.
#[tokio::test]
async fn a_failure_about_the_deployment_falls_over_and_one_about_the_request_does_not() {
    let (clock, cache, limiter) = setup();
    let a = Scripted::new("a", vec![quota_exhausted()]);
    let b = Scripted::new("b", vec![]);
    let p = HardenedProvider::builder(a.clone(), T, limiter.clone(), breaker(&clock, &cache, "a", 1))
        .fallback(b.clone(), breaker(&clock, &cache, "b", 1))
        .retry_policy(policy(1))
        .env(env(&clock, 1))
        .build();
    let answer = p.extract_with_model::<String>("t", None).await.unwrap();
    assert_eq!(answer.model, "b");
    assert_eq!((a.calls(), b.calls()), (1, 1));
    let bad_request = || -> Result<(), ExtractError> {
        Err(ProviderError::BadRequest {
            status: 400,
            message: "bad".into(),
        }
        .into())
    };
    let a = Scripted::new("a", vec![bad_request()]);
    let b = Scripted::new("b", vec![]);
    let p = HardenedProvider::builder(a.clone(), T, limiter, breaker(&clock, &cache, "a2", 1))
        .fallback(b.clone(), breaker(&clock, &cache, "b2", 1))
        .retry_policy(policy(1))
        .env(env(&clock, 1))
        .build();
    assert_eq!(p.extract::<String>("t", None).await.unwrap_err().kind(), "bad_request");
    assert_eq!((a.calls(), b.calls()), (1, 0));
}

/// a answers 429 with `Retry-After: 30`; the retry goes to b, whose circuit
/// is open (this provider has not heard so yet), so it comes back to a. It
/// must honour the wait a's server asked for — as the one-deployment retry
/// does — and not call a again inside the cooldown it just wrote.
#[tokio::test]
async fn a_retry_that_comes_back_to_a_cooling_deployment_waits_out_its_retry_after() {
    let (clock, cache, limiter) = setup();
    let observer = Arc::new(redstring::RecordingObserver::new());
    let (ba, bb) = (breaker(&clock, &cache, "a", 5), breaker(&clock, &cache, "b", 1));
    bb.record_failure().await.unwrap();
    let (a, b) = (
        Scripted::new("a", vec![rate_limited(Duration::from_secs(30))]),
        Scripted::new("b", vec![]),
    );
    let p = HardenedProvider::over(Deployment::new(a.clone(), ba), T, limiter)
        .deployment(Deployment::new(b.clone(), bb))
        .retry_policy(policy(2))
        .env(env(&clock, 1).with_observer(observer.clone()))
        .build();
    let start = clock.now();
    let answer = p.extract_with_model::<String>("t", None).await.unwrap();
    assert_eq!((answer.model.as_str(), a.calls(), b.calls()), ("a", 2, 0));
    let elapsed = clock.now().saturating_duration_since(start);
    assert!(
        elapsed >= Duration::from_secs(30),
        "a was called again {elapsed:?} after its 429 asked for 30 s"
    );
    let waited: Vec<Duration> = observer
        .events()
        .into_iter()
        .filter_map(|e| match e {
            redstring::Event::CooldownWait { wait, .. } => Some(wait),
            _ => None,
        })
        .collect();
    assert_eq!(waited.len(), 1, "the wait is reported: {waited:?}");
}

/// The same when the call's deadline cannot cover a's wait: a is not called
/// again at all, and the call ends within its deadline.
#[tokio::test]
async fn a_retry_that_comes_back_to_a_cooling_deployment_past_its_deadline_does_not_call_it() {
    let (clock, cache, limiter) = setup();
    let (ba, bb) = (breaker(&clock, &cache, "a", 5), breaker(&clock, &cache, "b", 1));
    bb.record_failure().await.unwrap();
    let (a, b) = (
        Scripted::new("a", vec![rate_limited(Duration::from_secs(30))]),
        Scripted::new("b", vec![]),
    );
    let p = HardenedProvider::over(Deployment::new(a.clone(), ba), T, limiter)
        .deployment(Deployment::new(b.clone(), bb))
        .retry_policy(policy(2))
        .deadline(Duration::from_secs(10))
        .env(env(&clock, 1))
        .build();
    let start = clock.now();
    let e = p.extract::<String>("t", None).await.unwrap_err();
    assert_eq!((a.calls(), b.calls()), (1, 0), "{e}");
    assert_eq!(e.kind(), "deadline_exceeded", "{e}");
    assert!(clock.now().saturating_duration_since(start) <= Duration::from_secs(10));
}

/// a's key is refused: every call there fails for a reason about a, not the
/// request, and its server answered (its circuit never opens). Later calls
/// of this provider ask b first instead of paying a's failed round trip
/// (and, with no retries, failing) every time — until a's recovery timeout
/// has passed, when a is asked first again. (A spent quota says more: it
/// cools a down fleet-wide until its reset.)
#[tokio::test]
async fn a_deployment_failing_for_its_own_reasons_is_asked_last_until_its_recovery_timeout() {
    let (clock, cache, limiter) = setup();
    let refused_key = || -> Result<(), ExtractError> {
        Err(ProviderError::Authentication {
            status: 401,
            message: "invalid key".into(),
        }
        .into())
    };
    let a = Scripted::new("a", vec![refused_key(), refused_key(), refused_key()]);
    let b = Scripted::new("b", vec![]);
    let p = HardenedProvider::builder(a.clone(), T, limiter, breaker(&clock, &cache, "a", 1))
        .fallback(b.clone(), breaker(&clock, &cache, "b", 1))
        .retry_policy(policy(0))
        .env(env(&clock, 1))
        .build();
    p.extract::<String>("t", None).await.unwrap_err();
    assert_eq!((a.calls(), b.calls()), (1, 0));
    for _ in 0..3 {
        assert_eq!(p.extract_with_model::<String>("t", None).await.unwrap().model, "b");
    }
    assert_eq!((a.calls(), b.calls()), (1, 3), "a was asked first again");
    clock.advance(redstring::breaker::DEFAULT_RECOVERY_TIMEOUT + Duration::from_secs(1));
    p.extract::<String>("t", None).await.unwrap_err();
    assert_eq!(a.calls(), 2, "a is asked first again after its recovery timeout");
}

/// Answers after `delay` on the manual clock; the first deployment's first
/// call also makes a call through `then` (another worker) while it is in
/// flight, and keeps the model that answered it.
struct Slow {
    model: &'static str,
    clock: Arc<ManualClock>,
    delay: Duration,
    then: Option<HardenedProvider<Arc<Scripted>>>,
    seen: Mutex<Option<String>>,
}

impl LlmProvider for Slow {
    fn model(&self) -> &str {
        self.model
    }
    fn extract_answer<'a>(
        &'a self,
        _: ExtractRequest<'a>,
        _: Option<Duration>,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>> {
        Box::pin(async move {
            self.clock.sleep(self.delay).await;
            if let Some(other) = &self.then {
                let model = other.extract_with_model::<String>("t", None).await.unwrap().model;
                *self.seen.lock().unwrap() = Some(model);
            }
            Ok(answered_by(self.model))
        })
    }
}

/// A least-loaded call with a 60 s deadline takes 30 s at a, longer than the
/// 10 s lease: while it is in flight, another worker's pick must still count
/// it and choose b. (A lease shorter than the call let it lapse mid-call.)
#[tokio::test]
async fn a_least_loaded_call_counts_until_it_ends_within_its_deadline_whatever_the_lease() {
    let (clock, cache, limiter) = setup();
    let (ba, bb) = (breaker(&clock, &cache, "a", 5), breaker(&clock, &cache, "b", 5));
    let other = HardenedProvider::over(
        Deployment::new(Scripted::new("a", vec![]), ba.clone()),
        T,
        limiter.clone(),
    )
    .deployment(Deployment::new(Scripted::new("b", vec![]), bb.clone()))
    .least_loaded(Duration::from_secs(10))
    .deadline(Duration::from_secs(60))
    .env(env(&clock, 2))
    .build();
    let slow = |model, then| {
        Arc::new(Slow {
            model,
            clock: clock.clone(),
            delay: Duration::from_secs(30),
            then,
            seen: Mutex::new(None),
        })
    };
    let (a, b) = (slow("a", Some(other)), slow("b", None));
    let p = HardenedProvider::over(Deployment::new(a.clone(), ba), T, limiter)
        .deployment(Deployment::new(b, bb))
        .least_loaded(Duration::from_secs(10))
        .deadline(Duration::from_secs(60))
        .env(env(&clock, 1))
        .build();
    assert_eq!(p.extract_with_model::<String>("t", None).await.unwrap().model, "a");
    assert_eq!(
        a.seen.lock().unwrap().as_deref(),
        Some("b"),
        "the call in flight at a for 30 s was no longer counted"
    );
}

/// a answers 429 with `Retry-After: 30`; the retry goes to b, which times
/// out; the next retry must not cycle back to a inside the wait a's server
/// asked for — the attempt at b in between does not erase it.
#[tokio::test]
async fn an_asked_wait_outlives_an_attempt_elsewhere() {
    let (clock, cache, limiter) = setup();
    let (a, b) = (
        Scripted::new("a", vec![rate_limited(Duration::from_secs(30))]),
        Scripted::new("b", vec![timed_out()]),
    );
    let p = HardenedProvider::over(Deployment::new(a.clone(), breaker(&clock, &cache, "a", 5)), T, limiter)
        .deployment(Deployment::new(b.clone(), breaker(&clock, &cache, "b", 5)))
        .retry_policy(policy(2))
        .env(env(&clock, 1))
        .build();
    let start = clock.now();
    let answer = p.extract_with_model::<String>("t", None).await.unwrap();
    let elapsed = clock.now().saturating_duration_since(start);
    assert!(
        a.calls() == 1 || elapsed >= Duration::from_secs(30),
        "a was called again {elapsed:?} after its 429 asked for 30 s ({} calls, answer from {})",
        a.calls(),
        answer.model
    );
    assert_eq!((answer.model.as_str(), a.calls(), b.calls()), ("b", 1, 2));
}

/// a and a2 share one breaker (one server behind two deployments). a
/// answers 429 with `Retry-After: 30`; b's circuit is open. The retry must
/// not go to a2 inside the wait the server behind that breaker asked for.
#[tokio::test]
async fn an_asked_wait_holds_every_deployment_behind_that_breaker() {
    let (clock, cache, limiter) = setup();
    let shared = breaker(&clock, &cache, "gpu", 5);
    let bb = breaker(&clock, &cache, "b", 1);
    bb.record_failure().await.unwrap();
    let (a, a2, b) = (
        Scripted::new("a", vec![rate_limited(Duration::from_secs(30))]),
        Scripted::new("a2", vec![]),
        Scripted::new("b", vec![]),
    );
    let p = HardenedProvider::over(Deployment::new(a.clone(), shared.clone()), T, limiter)
        .deployment(Deployment::new(a2.clone(), shared))
        .deployment(Deployment::new(b.clone(), bb))
        .retry_policy(policy(2))
        .env(env(&clock, 1))
        .build();
    let start = clock.now();
    let answer = p.extract_with_model::<String>("t", None).await.unwrap();
    let elapsed = clock.now().saturating_duration_since(start);
    assert_eq!(b.calls(), 0);
    assert!(
        elapsed >= Duration::from_secs(30),
        "{} was called {elapsed:?} after the shared server's 429 asked for 30 s",
        answer.model
    );
}

/// A call that sleeps off a shared cooldown at its admission and then a
/// wait its server asked for reports the two `CooldownWait`s as its first
/// and second: the count is the call's, not each step's.
#[tokio::test]
async fn cooldown_waits_are_counted_across_the_call() {
    let (clock, cache, limiter) = setup();
    let observer = Arc::new(redstring::RecordingObserver::new());
    let (ba, bb) = (breaker(&clock, &cache, "a", 5), breaker(&clock, &cache, "b", 1));
    bb.record_failure().await.unwrap();
    clock.advance(Duration::from_secs(61));
    // Another worker holds b's half-open probe; a is cooling down for 5 s.
    let probe = bb.admit().await;
    assert!(matches!(probe, redstring::breaker::Permit::Probe(_)), "{probe:?}");
    ba.cool_down(Duration::from_secs(5)).await.unwrap();
    let a = Scripted::new("a", vec![rate_limited(Duration::from_secs(30))]);
    let p = HardenedProvider::over(Deployment::new(a.clone(), ba), T, limiter)
        .deployment(Deployment::new(Scripted::new("b", vec![]), bb))
        .retry_policy(policy(2))
        .env(env(&clock, 1).with_observer(observer.clone()))
        .build();
    assert_eq!(p.extract_with_model::<String>("t", None).await.unwrap().model, "a");
    let waits: Vec<u32> = observer
        .events()
        .into_iter()
        .filter_map(|e| match e {
            redstring::Event::CooldownWait { waits, .. } => Some(waits),
            _ => None,
        })
        .collect();
    assert_eq!(waits, [1, 2]);
}

/// a's 429 asks for 600 s, over `max_server_delay` (a spent quota); b's
/// circuit is half-open with another worker's probe (never remembered as
/// refusing). A retry has nowhere to go: b refuses and a's wait is too long
/// to honour. The call ends then, as one deployment's would on such a 429 —
/// not after spending every remaining retry (and the fleet's retry budget)
/// on placements that send nothing — told to come back when b's probe
/// lease ends, the sooner of the two.
#[tokio::test]
async fn a_retry_with_nowhere_to_go_but_an_unhonourable_wait_ends_the_call() {
    let (clock, cache, limiter) = setup();
    let (ba, bb) = (breaker(&clock, &cache, "a", 5), breaker(&clock, &cache, "b", 1));
    bb.record_failure().await.unwrap();
    clock.advance(Duration::from_secs(61));
    let probe = bb.admit().await;
    assert!(matches!(probe, redstring::breaker::Permit::Probe(_)), "{probe:?}");
    let a = Scripted::new("a", vec![rate_limited(Duration::from_secs(600))]);
    let b = Scripted::new("b", vec![]);
    let p = HardenedProvider::over(Deployment::new(a.clone(), ba), T, limiter)
        .deployment(Deployment::new(b.clone(), bb))
        .retry_policy(policy(4))
        .env(env(&clock, 1))
        .build();
    let e = p.extract::<String>("t", None).await.unwrap_err();
    assert_eq!((a.calls(), b.calls()), (1, 0));
    assert_eq!(e.kind(), "circuit_open", "{e}");
    assert!(e.retry_after().is_some_and(|w| w < Duration::from_secs(600)), "{e}");
    assert_eq!(
        clock.sleeps().len(),
        1,
        "backed off again for nothing: {:?} ({e})",
        clock.sleeps()
    );
}
