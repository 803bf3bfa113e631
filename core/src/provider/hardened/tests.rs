//! The hardened provider's unit tests: routing, token charges and probes
//! over scripted providers on a manual clock.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use super::*;
use crate::breaker::{CircuitBreaker, CircuitOpen, CircuitState};
use crate::clock::ManualClock;
use crate::env::Env;
use crate::observe::{Event, RecordingObserver};
use crate::provider::{LlmProviderExt, OutputSchema};
use crate::random::SeededRandom;
use crate::retry::RetryPolicy;

/// A provider answering from a queue, counting calls.
struct Scripted {
    answers: Mutex<VecDeque<Result<Value, ExtractError>>>,
    calls: AtomicU32,
}

impl Scripted {
    fn new(answers: Vec<Result<Value, ExtractError>>) -> Self {
        Scripted {
            answers: Mutex::new(answers.into()),
            calls: AtomicU32::new(0),
        }
    }
}

impl LlmProvider for Scripted {
    fn model(&self) -> &str {
        "scripted/m"
    }
    fn extract_answer<'a>(
        &'a self,
        _: ExtractRequest<'a>,
        _: Option<Duration>,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let next = self
            .answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
            .unwrap_or(Err(ProviderError::BlankText.into()))
            .map(|value| Extracted {
                value,
                model: "scripted/m".to_owned(),
                usage: None,
                quota: None,
            });
        Box::pin(async move { next })
    }
}

fn unavailable() -> Result<Value, ExtractError> {
    Err(ProviderError::Unavailable {
        retry_after: None,
        message: "Loading model".into(),
    }
    .into())
}

/// `clock` and a stream seeded with `seed`.
fn env(clock: &Arc<ManualClock>, seed: u64) -> Env {
    Env::default()
        .with_clock(clock.clone())
        .with_rng(Arc::new(SeededRandom::from_seed(seed)))
}

fn harden<P: LlmProvider>(inner: P, clock: &Arc<ManualClock>, threshold: u32) -> HardenedProvider<P> {
    let limiter = Arc::new(
        RateLimiter::builder(100)
            .env(Env::default().with_clock(clock.clone()))
            .build()
            .unwrap(),
    );
    let breaker = Arc::new(
        CircuitBreaker::builder()
            .failure_threshold(threshold)
            .env(Env::default().with_clock(clock.clone()))
            .build()
            .unwrap(),
    );
    HardenedProvider::builder(inner, TenantId::from_u128(9), limiter, breaker)
        .retry_policy(RetryPolicy::builder().max_retries(1).jitter(0.0).build().unwrap())
        .env(env(clock, 1))
        .build()
}

#[tokio::test]
async fn a_retried_call_is_charged_for_every_attempt_that_may_have_spent_tokens() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let limiter = Arc::new(
        RateLimiter::builder(100)
            .tokens_per_window(1000)
            .env(Env::default().with_clock(clock.clone()))
            .build()
            .unwrap(),
    );
    let breaker = Arc::new(
        CircuitBreaker::builder()
            .env(Env::default().with_clock(clock.clone()))
            .build()
            .unwrap(),
    );
    let timeout = || -> Result<Value, ExtractError> {
        Err(ProviderError::Transport {
            kind: crate::provider::TransportErrorKind::Timeout,
            detail: "timed out".into(),
        }
        .into())
    };
    // A timeout (the server may have generated), then a 503 (it did not).
    let inner = Scripted::new(vec![timeout(), unavailable(), unavailable(), unavailable()]);
    let provider = HardenedProvider::builder(inner, TenantId::from_u128(9), limiter.clone(), breaker)
        .retry_policy(RetryPolicy::builder().max_retries(1).jitter(0.0).build().unwrap())
        .env(env(&clock, 1))
        .token_estimate(|_| 300)
        .build();
    provider.extract::<String>("text", None).await.unwrap_err();
    let left = limiter
        .acquire_tokens(TenantId::from_u128(9), 1)
        .await
        .unwrap()
        .tokens_left;
    assert_eq!(left, 1000 - 300 - 1, "the timed-out attempt's estimate stays charged");
    // Two 503s generated nothing: the reservation is released.
    provider.extract::<String>("text", None).await.unwrap_err();
    let left = limiter
        .acquire_tokens(TenantId::from_u128(9), 1)
        .await
        .unwrap()
        .tokens_left;
    assert_eq!(left, 1000 - 300 - 2);
}

/// Answers at once, naming its own model, counting calls; hangs instead
/// while `hang` is set.
struct Named {
    model: &'static str,
    calls: AtomicU32,
    hang: std::sync::atomic::AtomicBool,
}

impl Named {
    fn new(model: &'static str) -> Arc<Named> {
        Arc::new(Named {
            model,
            calls: AtomicU32::new(0),
            hang: std::sync::atomic::AtomicBool::new(false),
        })
    }
}

impl LlmProvider for Named {
    fn model(&self) -> &str {
        self.model
    }
    fn extract_answer<'a>(
        &'a self,
        _: ExtractRequest<'a>,
        _: Option<Duration>,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.hang.load(Ordering::SeqCst) {
            return Box::pin(std::future::pending());
        }
        answered(self.model)
    }
}

/// An answer `"v"` from `model`, at once.
fn answered(model: &str) -> BoxFuture<'static, Result<Extracted<Value>, ExtractError>> {
    let model = model.to_owned();
    Box::pin(async move {
        Ok(Extracted {
            value: Value::from("v"),
            model,
            usage: None,
            quota: None,
        })
    })
}

/// A breaker named `name` on `cache` that opens on `threshold` failures
/// and stays open for `recovery_s` seconds.
fn breaker(
    clock: &Arc<ManualClock>,
    cache: &Arc<MemoryCache>,
    name: &str,
    threshold: u32,
    recovery_s: u64,
) -> Arc<CircuitBreaker> {
    Arc::new(
        CircuitBreaker::builder()
            .key_prefix(format!("kg:circuit:{name}"))
            .failure_threshold(threshold)
            .recovery_timeout(Duration::from_secs(recovery_s))
            .env(Env::default().with_clock(clock.clone()))
            .cache(cache.clone())
            .build()
            .unwrap(),
    )
}

#[tokio::test]
async fn weighted_routing_shares_first_choices_by_weight() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let (a, b) = (Named::new("a"), Named::new("b"));
    let limiter = Arc::new(
        RateLimiter::builder(100_000)
            .env(Env::default().with_clock(clock.clone()))
            .build()
            .unwrap(),
    );
    let p = HardenedProvider::over(
        Deployment::new(a.clone(), breaker(&clock, &cache, "a", 5, 60)).weight(3),
        TenantId::from_u128(9),
        limiter,
    )
    .deployment(Deployment::new(b.clone(), breaker(&clock, &cache, "b", 5, 60)).weight(1))
    .weighted()
    .env(env(&clock, 11))
    .build();
    for _ in 0..4000 {
        p.extract::<String>("t", None).await.unwrap();
    }
    let (a, b) = (a.calls.load(Ordering::SeqCst), b.calls.load(Ordering::SeqCst));
    assert_eq!(a + b, 4000);
    // 3:1 of 4000 is 3000 ± 27 (one standard deviation); allow 4.
    assert!(
        (2890..=3110).contains(&a),
        "{a} first choices of the weight-3 deployment"
    );
}

#[tokio::test]
async fn least_loaded_routing_sends_a_call_where_fewest_are_in_flight_and_ends_its_lease() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let (a, b) = (Named::new("a"), Named::new("b"));
    let limiter = Arc::new(
        RateLimiter::builder(100)
            .env(Env::default().with_clock(clock.clone()))
            .build()
            .unwrap(),
    );
    let build = || {
        HardenedProvider::builder(
            a.clone(),
            TenantId::from_u128(9),
            limiter.clone(),
            breaker(&clock, &cache, "a", 5, 60),
        )
        .fallback(b.clone(), breaker(&clock, &cache, "b", 5, 60))
        .least_loaded(Duration::from_secs(60))
        .env(env(&clock, 5))
        .build()
    };
    // Two providers (two workers) over one store: the count is the fleet's.
    let (p1, p2) = (build(), build());
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());

    a.hang.store(true, Ordering::SeqCst);
    let mut held = Box::pin(p1.extract_with_model::<String>("t", None));
    assert!(held.as_mut().poll(&mut cx).is_pending(), "one call in flight at a");
    let answer = p2.extract_with_model::<String>("t", None).await.unwrap();
    assert_eq!(answer.model, "b", "the other worker's call goes to the idle deployment");

    // A call that ends stops counting: ties go to the first again.
    let answer = p2.extract_with_model::<String>("t", None).await.unwrap();
    assert_eq!(answer.model, "b", "still one in flight at a");
    drop(held);
    clock.advance(Duration::from_secs(61));
    a.hang.store(false, Ordering::SeqCst);
    let answer = p2.extract_with_model::<String>("t", None).await.unwrap();
    assert_eq!(answer.model, "a", "the dropped call's lease ran out");
    let answer = p1.extract_with_model::<String>("t", None).await.unwrap();
    assert_eq!(answer.model, "a", "the finished call's lease was ended");
}

#[tokio::test]
async fn wrappers_nest_and_the_outer_one_never_retries_the_inner_ones_verdicts() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let inner = harden(Scripted::new(vec![unavailable(), unavailable()]), &clock, 1);
    let outer = harden(inner, &clock, 5);
    assert_eq!(outer.model(), "scripted/m");

    let e = outer.extract::<String>("text", None).await.unwrap_err();
    assert_eq!(e.kind(), "retry_exhausted", "the inner wrapper exhausted its schedule");
    assert_eq!(
        clock.sleeps(),
        [Duration::from_secs(1)],
        "and the outer one did not retry it"
    );
    let e = outer.extract::<String>("text", None).await.unwrap_err();
    assert_eq!(e.kind(), "circuit_open", "the inner circuit opened at threshold 1");
    assert_eq!(outer.inner().inner().calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_probe_that_ends_with_nothing_to_report_is_released_and_the_next_call_probes() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let inner_refusal = Err(CircuitOpen::new("inner is unavailable", Duration::ZERO).into());
    let p = harden(
        Scripted::new(vec![unavailable(), unavailable(), inner_refusal, Ok(Value::from("up"))]),
        &clock,
        1,
    );
    let e = p.extract::<String>("t", None).await.unwrap_err();
    assert_eq!(e.kind(), "retry_exhausted");
    assert_eq!(p.deployments[0].breaker.state().await.unwrap(), CircuitState::Open);

    clock.advance(Duration::from_secs(60));
    let e = p.extract::<String>("t", None).await.unwrap_err();
    assert_eq!(e.kind(), "circuit_open", "the inner wrapper's refusal, passed on");
    assert_eq!(p.deployments[0].breaker.state().await.unwrap(), CircuitState::HalfOpen);

    // Not wedged: the probe was released, so the very next call probes.
    assert_eq!(p.extract::<String>("t", None).await.unwrap(), "up");
    assert_eq!(p.deployments[0].breaker.state().await.unwrap(), CircuitState::Closed);
}

#[tokio::test]
async fn the_default_classifier_refuses_server_delays_over_the_cap() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let p = harden(Scripted::new(vec![]), &clock, 5);
    let asks = |d: Duration| -> ExtractError {
        ProviderError::RateLimited {
            retry_after: Some(d),
            message: String::new(),
        }
        .into()
    };
    assert_eq!(
        p.classify(&asks(Duration::from_secs(120))),
        Retryable::After(Duration::from_secs(120))
    );
    assert_eq!(p.classify(&asks(Duration::from_secs(121))), Retryable::No);
    assert_eq!(p.classify(&ProviderError::BlankText.into()), Retryable::No);
}

#[tokio::test]
async fn a_success_after_a_transient_failure_is_one_call_and_a_success_report() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let p = harden(Scripted::new(vec![unavailable(), Ok(Value::from("done"))]), &clock, 1);
    let schema = OutputSchema::for_type::<String>();
    let v = p
        .extract_value(ExtractRequest {
            text: "t",
            system_prompt: None,
            schema: &schema,
        })
        .await
        .unwrap();
    assert_eq!(v, Value::from("done"));
    assert_eq!(p.deployments[0].breaker.state().await.unwrap(), CircuitState::Closed);
    assert_eq!(p.limiter.remaining(p.tenant()).await.unwrap(), 99);
}

/// Hangs on its first call (a probe to a server that never answers),
/// answers at once after that.
struct HangsOnce {
    calls: AtomicU32,
}

impl LlmProvider for HangsOnce {
    fn model(&self) -> &str {
        "hangs/m"
    }
    fn extract_answer<'a>(
        &'a self,
        _: ExtractRequest<'a>,
        _: Option<Duration>,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            Box::pin(std::future::pending())
        } else {
            Box::pin(async {
                Ok(Extracted {
                    value: Value::from("up"),
                    model: "hangs/m".to_owned(),
                    usage: None,
                    quota: None,
                })
            })
        }
    }
}

/// Issue: dropping a call's future while it held the half-open probe (a
/// caller's timeout, `select!`, an aborted task) left the circuit half-open
/// with its probe spent, refusing every later call for good.
#[tokio::test]
async fn a_dropped_probe_future_cannot_wedge_the_circuit() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let p = harden(
        HangsOnce {
            calls: AtomicU32::new(0),
        },
        &clock,
        1,
    );
    p.deployments[0].breaker.record_failure().await.unwrap();
    clock.advance(Duration::from_secs(60));

    let mut hung = Box::pin(p.extract::<String>("t", None));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(hung.as_mut().poll(&mut cx).is_pending(), "the probe is in flight");
    drop(hung);
    assert_eq!(p.deployments[0].breaker.state().await.unwrap(), CircuitState::HalfOpen);

    let e = p.extract::<String>("t", None).await.unwrap_err();
    assert_eq!(e.kind(), "circuit_open");
    assert_eq!(
        e.to_string(),
        "hangs/m is unavailable; the next probe is due in 60.00s",
        "refused while the lost probe's lease lives, saying until when"
    );

    clock.advance(Duration::from_secs(60));
    assert_eq!(
        p.extract::<String>("t", None).await.unwrap(),
        "up",
        "a fresh probe after the lease"
    );
    assert_eq!(p.deployments[0].breaker.state().await.unwrap(), CircuitState::Closed);
}

/// A clock that opens `breaker` (threshold 1) at the end of every sleep:
/// the circuit a call waited beside has opened by the time it wakes.
struct OpensOnWake {
    clock: Arc<ManualClock>,
    breaker: Arc<CircuitBreaker>,
}

impl Clock for OpensOnWake {
    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn sleep(&self, duration: Duration) -> crate::clock::Sleep {
        let slept = self.clock.sleep(duration);
        let breaker = self.breaker.clone();
        Box::pin(async move {
            slept.await;
            let permit = breaker.admit().await;
            breaker.record_failure_for(&permit).await.unwrap();
        })
    }
}

#[tokio::test]
async fn a_call_every_breaker_refuses_while_placing_is_handed_back_the_soonest_wait() {
    let manual = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(manual.clone()));
    let opens_on_one = |name: &str, recovery: u64| breaker(&manual, &cache, name, 1, recovery);
    // The primary's own limit is spent for 5 s; the two others are open,
    // for 30 s and 10 s. The call is admitted at the primary, sleeps its
    // limit off, and wakes to find the primary's circuit open for 50 s.
    let (a, b, c) = (opens_on_one("a", 50), opens_on_one("b", 30), opens_on_one("c", 10));
    for open in [&b, &c] {
        let permit = open.admit().await;
        open.record_failure_for(&permit).await.unwrap();
    }
    let limit = Arc::new(
        RateLimiter::builder(1)
            .window(Duration::from_secs(5))
            .key_prefix("deployment:a")
            .env(Env::default().with_clock(manual.clone()))
            .cache(cache.clone())
            .build()
            .unwrap(),
    );
    limit
        .acquire(super::super::route::DEPLOYMENT_LIMIT_TENANT)
        .await
        .unwrap();
    let clock: Arc<dyn Clock> = Arc::new(OpensOnWake {
        clock: manual.clone(),
        breaker: a.clone(),
    });
    let tenants = Arc::new(
        RateLimiter::builder(100)
            .env(Env::default().with_clock(manual.clone()))
            .build()
            .unwrap(),
    );
    let named = [Named::new("a"), Named::new("b"), Named::new("c")];
    let p = HardenedProvider::over(
        Deployment::new(named[0].clone(), a).limit(limit),
        TenantId::from_u128(9),
        tenants,
    )
    .deployment(Deployment::new(named[1].clone(), b))
    .deployment(Deployment::new(named[2].clone(), c))
    .env(
        Env::default()
            .with_clock(clock)
            .with_rng(Arc::new(SeededRandom::from_seed(3))),
    )
    .build();
    let result = p.extract::<String>("t", None).await;
    let Err(ExtractError::CircuitOpen(open)) = result else {
        panic!(
            "every deployment refuses: {result:?} after sleeps {:?}",
            manual.sleeps()
        );
    };
    assert!(named.iter().all(|n| n.calls.load(Ordering::SeqCst) == 0));
    // One sleep: the primary's limit, about 5 s.
    assert_eq!(manual.sleeps().len(), 1);
    // c's circuit admits again first: 10 s after it opened, about 5 s after
    // the call woke — not the primary's 50 s nor b's 25 s.
    let soonest = Duration::from_secs(10) - manual.slept();
    assert_eq!(open.retry_after, soonest, "{}", open.message);
}

#[tokio::test]
async fn a_retry_refused_everywhere_after_a_spent_quota_is_told_the_soonest_breakers_wait() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let opens_on_one = |name: &str| breaker(&clock, &cache, name, 1, 20);
    let (a, b) = (opens_on_one("a"), opens_on_one("b"));
    // b's circuit was opened by another worker; this provider has not heard.
    let permit = b.admit().await;
    b.record_failure_for(&permit).await.unwrap();
    let spent = Err(ProviderError::RateLimited {
        retry_after: Some(Duration::from_secs(5 * 3_600)),
        message: "requests per day".into(),
    }
    .into());
    let (first, second) = (Scripted::new(vec![spent]), Scripted::new(vec![]));
    let tenants = Arc::new(RateLimiter::builder(100).env(env(&clock, 1)).build().unwrap());
    let p = HardenedProvider::over(Deployment::new(first, a), TenantId::from_u128(9), tenants)
        .deployment(Deployment::new(second, b))
        .retry_policy(RetryPolicy::builder().max_retries(2).jitter(0.0).build().unwrap())
        .env(env(&clock, 1))
        .build();
    let Err(ExtractError::CircuitOpen(open)) = p.extract::<String>("t", None).await else {
        panic!("both refuse");
    };
    // b admits again 20 s after it opened, less the backoff slept; a not
    // for five hours.
    assert_eq!(
        open.retry_after,
        Duration::from_secs(20) - clock.slept(),
        "{}",
        open.message
    );
    assert_eq!(p.deployments()[0].inner.calls.load(Ordering::SeqCst), 1);
}

/// Answers every call after `took`, advanced on the manual clock as a
/// server's latency would pass: the next from the queue, or the last
/// when the queue runs out. Counts calls.
struct Slow {
    model: &'static str,
    clock: Arc<ManualClock>,
    took: Mutex<VecDeque<Duration>>,
    calls: AtomicU32,
}

impl Slow {
    fn new(model: &'static str, clock: &Arc<ManualClock>, took: &[u64]) -> Arc<Slow> {
        Arc::new(Slow {
            model,
            clock: clock.clone(),
            took: Mutex::new(took.iter().map(|ms| Duration::from_millis(*ms)).collect()),
            calls: AtomicU32::new(0),
        })
    }
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
        self.calls.fetch_add(1, Ordering::SeqCst);
        let took = {
            let mut queue = self.took.lock().unwrap_or_else(|p| p.into_inner());
            if queue.len() > 1 {
                queue.pop_front()
            } else {
                queue.front().copied()
            }
        }
        .unwrap_or_default();
        self.clock.advance(took);
        answered(self.model)
    }
}

/// A provider of tenant 9 over `inner` behind `breaker`, its slow-call
/// threshold `threshold_ms` (none when `None`), reporting to `events`.
fn slow_calls_over<P: LlmProvider>(
    inner: P,
    breaker: Arc<CircuitBreaker>,
    clock: &Arc<ManualClock>,
    threshold_ms: Option<u64>,
    events: &Arc<RecordingObserver>,
) -> HardenedProvider<P> {
    let limiter = Arc::new(
        RateLimiter::builder(100_000)
            .env(Env::default().with_clock(clock.clone()))
            .build()
            .unwrap(),
    );
    let builder = HardenedProvider::builder(inner, TenantId::from_u128(9), limiter, breaker)
        .retry_policy(RetryPolicy::builder().max_retries(0).build().unwrap())
        .env(env(clock, 1).with_observer(events.clone()));
    match threshold_ms {
        Some(ms) => builder.slow_call_threshold(Duration::from_millis(ms)).unwrap().build(),
        None => builder.build(),
    }
}

/// Each slow call's duration and threshold, in ms, as the events report them.
fn slow_calls(events: &RecordingObserver) -> Vec<(String, u128, u128)> {
    events
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::SlowCall {
                breaker,
                duration,
                threshold,
                tenant,
                ..
            } => {
                assert_eq!(tenant, TenantId::from_u128(9));
                Some((breaker.to_string(), duration.as_millis(), threshold.as_millis()))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn slow_successes_are_answered_and_open_the_breaker_at_its_failure_threshold() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let events = Arc::new(RecordingObserver::new());
    let breaker = breaker(&clock, &cache, "gpu", 3, 60);
    let server = Slow::new("slow/m", &clock, &[1500]);
    let p = slow_calls_over(server.clone(), breaker.clone(), &clock, Some(1000), &events);
    for n in 1..=3 {
        assert_eq!(
            breaker.state().await.unwrap(),
            CircuitState::Closed,
            "before slow call {n}"
        );
        // The caller gets every slow answer: the call succeeded.
        let answer = p.extract::<String>("t", None).await.unwrap();
        assert_eq!(answer, "v");
    }
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Open);
    let refused = p.extract::<String>("t", None).await.unwrap_err();
    assert!(matches!(refused, ExtractError::CircuitOpen(_)), "{refused:?}");
    assert_eq!(
        server.calls.load(Ordering::SeqCst),
        3,
        "the open circuit sheds the fourth"
    );
    assert_eq!(slow_calls(&events), vec![("kg:circuit:gpu".to_owned(), 1500, 1000); 3]);
}

#[tokio::test]
async fn an_answer_within_the_threshold_is_a_success_that_clears_the_slow_count() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let events = Arc::new(RecordingObserver::new());
    let breaker = breaker(&clock, &cache, "gpu", 2, 60);
    // Slow, fast (at the threshold exactly: not slower), slow, fast, slow.
    let server = Slow::new("slow/m", &clock, &[1001, 1000, 5000, 10, 1001]);
    let p = slow_calls_over(server.clone(), breaker.clone(), &clock, Some(1000), &events);
    for _ in 0..5 {
        p.extract::<String>("t", None).await.unwrap();
    }
    // Three slow calls at a threshold of two, but a fast one after each of
    // the first two cleared the count: never open.
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Closed);
    let slow: Vec<u128> = slow_calls(&events).into_iter().map(|(_, took, _)| took).collect();
    assert_eq!(slow, [1001, 5000, 1001]);
    // One more slow call after the last: two in a row open it.
    p.extract::<String>("t", None).await.unwrap();
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Open);
}

#[tokio::test]
async fn without_a_threshold_a_slow_answer_is_a_success() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let events = Arc::new(RecordingObserver::new());
    let breaker = breaker(&clock, &cache, "gpu", 1, 60);
    let p = slow_calls_over(
        Slow::new("slow/m", &clock, &[60_000]),
        breaker.clone(),
        &clock,
        None,
        &events,
    );
    for _ in 0..3 {
        p.extract::<String>("t", None).await.unwrap();
    }
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Closed);
    assert!(slow_calls(&events).is_empty());
}

#[tokio::test]
async fn a_fleets_slow_calls_open_the_breaker_it_shares() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let events = Arc::new(RecordingObserver::new());
    let server = Slow::new("slow/m", &clock, &[2500]);
    // Three workers, each with its own breaker over the one store.
    let fleet: Vec<_> = (0..3)
        .map(|_| {
            slow_calls_over(
                server.clone(),
                breaker(&clock, &cache, "gpu", 3, 60),
                &clock,
                Some(2000),
                &events,
            )
        })
        .collect();
    for worker in &fleet {
        worker.extract::<String>("t", None).await.unwrap();
    }
    // One slow call each: three failures in the shared count.
    for worker in &fleet {
        let refused = worker.extract::<String>("t", None).await.unwrap_err();
        assert!(matches!(refused, ExtractError::CircuitOpen(_)), "{refused:?}");
    }
    assert_eq!(server.calls.load(Ordering::SeqCst), 3);
    assert_eq!(slow_calls(&events).len(), 3);
}

#[tokio::test]
async fn a_slow_primary_is_shed_and_calls_go_to_the_fallback() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let events = Arc::new(RecordingObserver::new());
    let (slow, spare) = (
        Slow::new("slow/m", &clock, &[3000]),
        Slow::new("spare/m", &clock, &[200]),
    );
    let limiter = Arc::new(
        RateLimiter::builder(100_000)
            .env(Env::default().with_clock(clock.clone()))
            .build()
            .unwrap(),
    );
    let p = HardenedProvider::over(
        Deployment::new(slow.clone(), breaker(&clock, &cache, "slow", 2, 60)),
        TenantId::from_u128(9),
        limiter,
    )
    .deployment(Deployment::new(spare.clone(), breaker(&clock, &cache, "spare", 2, 60)))
    .env(env(&clock, 1).with_observer(events.clone()))
    .deadline(Duration::from_secs(10))
    .slow_call_threshold(Duration::from_secs(2))
    .unwrap()
    .build();
    let models: Vec<String> = {
        let mut models = Vec::new();
        for _ in 0..4 {
            models.push(p.extract_with_model::<String>("t", None).await.unwrap().model);
        }
        models
    };
    assert_eq!(models, ["slow/m", "slow/m", "spare/m", "spare/m"]);
    let breakers: Vec<String> = slow_calls(&events).into_iter().map(|(b, _, _)| b).collect();
    assert_eq!(
        breakers, ["kg:circuit:slow"; 2],
        "the spare answered within the threshold"
    );
}

#[test]
fn a_threshold_of_zero_or_not_below_the_deadline_is_refused_naming_the_field() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let builder = || {
        let limiter = Arc::new(RateLimiter::builder(10).build().unwrap());
        HardenedProvider::builder(
            Slow::new("slow/m", &clock, &[0]),
            TenantId::from_u128(9),
            limiter,
            breaker(&clock, &cache, "gpu", 1, 60),
        )
    };
    let zero = builder().slow_call_threshold(Duration::ZERO).err().unwrap();
    assert_eq!(zero.to_string(), "slow_call_threshold must be positive, got 0");
    let deadline = builder()
        .deadline(Duration::from_secs(5))
        .slow_call_threshold(Duration::from_secs(5))
        .err()
        .unwrap();
    assert_eq!(
        (deadline.field, deadline.expected),
        ("slow_call_threshold", "shorter than the deadline")
    );
    assert!(
        builder()
            .deadline(Duration::from_secs(5))
            .slow_call_threshold(Duration::from_millis(4999))
            .is_ok()
    );
}

/// Answers each call after its step of a script — the manual clock
/// advanced by the step's milliseconds, then `polls` more polls, each
/// yielding (a reply still on its way) — the last step repeating. Counts
/// calls, and calls whose future was dropped before it answered.
struct Lagging {
    model: &'static str,
    clock: Arc<ManualClock>,
    script: Mutex<VecDeque<(u64, u32)>>,
    calls: AtomicU32,
    cancelled: Arc<AtomicU32>,
}

/// Never answers within a test: a reply in the latency tail.
const FOREVER: u32 = u32::MAX;

impl Lagging {
    fn new(model: &'static str, clock: &Arc<ManualClock>, script: &[(u64, u32)]) -> Arc<Lagging> {
        Arc::new(Lagging {
            model,
            clock: clock.clone(),
            script: Mutex::new(script.iter().copied().collect()),
            calls: AtomicU32::new(0),
            cancelled: Arc::new(AtomicU32::new(0)),
        })
    }
}

/// [`Lagging`]'s reply: ready after `polls` more polls; counted as
/// cancelled when dropped before.
struct Reply {
    model: &'static str,
    polls: u32,
    done: bool,
    cancelled: Arc<AtomicU32>,
}

impl std::future::Future for Reply {
    type Output = Result<Extracted<Value>, ExtractError>;
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        if self.polls == 0 {
            self.done = true;
            return std::task::Poll::Ready(Ok(Extracted {
                value: Value::from("v"),
                model: self.model.to_owned(),
                usage: None,
                quota: None,
            }));
        }
        self.polls -= 1;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if !self.done {
            self.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl LlmProvider for Lagging {
    fn model(&self) -> &str {
        self.model
    }
    fn extract_answer<'a>(
        &'a self,
        _: ExtractRequest<'a>,
        _: Option<Duration>,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let (ms, polls) = {
            let mut script = self.script.lock().unwrap_or_else(|p| p.into_inner());
            if script.len() > 1 {
                script.pop_front()
            } else {
                script.front().copied()
            }
        }
        .unwrap_or_default();
        self.clock.advance(Duration::from_millis(ms));
        Box::pin(Reply {
            model: self.model,
            polls,
            done: false,
            cancelled: self.cancelled.clone(),
        })
    }
}

/// A provider of tenant 9 over `servers` (each behind its breaker, in
/// order), hedging `after` at most `max` times, with no retries, reporting
/// to `events`; with `budget`, hedges are paid from it.
fn hedged_over(
    servers: &[(Arc<Lagging>, Arc<CircuitBreaker>)],
    clock: &Arc<ManualClock>,
    after: HedgeAfter,
    max: u32,
    events: &Arc<RecordingObserver>,
    budget: Option<Arc<crate::RetryBudget>>,
) -> HardenedProvider<Arc<Lagging>> {
    let limiter = Arc::new(
        RateLimiter::builder(100_000)
            .env(Env::default().with_clock(clock.clone()))
            .build()
            .unwrap(),
    );
    let (first, rest) = servers.split_first().unwrap();
    let mut builder = HardenedProvider::over(
        Deployment::new(first.0.clone(), first.1.clone()),
        TenantId::from_u128(9),
        limiter,
    );
    for (server, breaker) in rest {
        builder = builder.deployment(Deployment::new(server.clone(), breaker.clone()));
    }
    builder = builder
        .retry_policy(RetryPolicy::builder().max_retries(0).build().unwrap())
        .env(env(clock, 1).with_observer(events.clone()))
        .deadline(Duration::from_secs(30));
    if let Some(budget) = budget {
        builder = builder.retry_budget(budget);
    }
    builder.hedge(after, max).unwrap().build()
}

/// Each hedge as the events report it: from, to, and after how many ms.
fn hedges(events: &RecordingObserver) -> Vec<(String, String, u128)> {
    events
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Hedged {
                from,
                to,
                after,
                tenant,
            } => {
                assert_eq!(tenant, TenantId::from_u128(9));
                Some((from.to_string(), to.to_string(), after.as_millis()))
            }
            _ => None,
        })
        .collect()
}

fn fixed_ms(ms: u64) -> HedgeAfter {
    HedgeAfter::Fixed(Duration::from_millis(ms))
}

#[tokio::test]
async fn an_unanswered_attempt_is_hedged_after_its_delay_and_the_first_answer_wins() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let events = Arc::new(RecordingObserver::new());
    let (tail, spare) = (
        Lagging::new("tail/m", &clock, &[(0, FOREVER)]),
        Lagging::new("spare/m", &clock, &[(0, 0)]),
    );
    // One failure would open the tail's circuit.
    let tail_breaker = breaker(&clock, &cache, "tail", 1, 60);
    let servers = [
        (tail.clone(), tail_breaker.clone()),
        (spare.clone(), breaker(&clock, &cache, "spare", 1, 60)),
    ];
    let p = hedged_over(&servers, &clock, fixed_ms(200), 1, &events, None);
    for n in 1..=2u32 {
        let answer = p.extract_with_model::<String>("t", None).await.unwrap();
        assert_eq!(answer.model, "spare/m", "call {n}");
        // The tail's attempt was sent, then dropped when the hedge won.
        assert_eq!(tail.calls.load(Ordering::SeqCst), n);
        assert_eq!(tail.cancelled.load(Ordering::SeqCst), n);
        // A cancelled attempt is no failure: the circuit stays closed.
        assert_eq!(tail_breaker.state().await.unwrap(), CircuitState::Closed, "call {n}");
    }
    assert_eq!(
        clock.sleeps(),
        [Duration::from_millis(200); 2],
        "each hedge after its delay"
    );
    assert_eq!(
        hedges(&events),
        vec![("kg:circuit:tail".to_owned(), "kg:circuit:spare".to_owned(), 200); 2]
    );
    let attempts: Vec<u32> = events
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::CallFinished { attempts, .. } => Some(attempts),
            _ => None,
        })
        .collect();
    assert_eq!(attempts, [2, 2], "a hedge is a request sent");
}

#[tokio::test]
async fn a_hedge_is_paid_from_the_retry_budget_and_none_is_sent_when_it_is_spent() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let events = Arc::new(RecordingObserver::new());
    // The tail answers on its eighth poll: after the hedge delay.
    let (tail, spare) = (
        Lagging::new("tail/m", &clock, &[(0, 8)]),
        Lagging::new("spare/m", &clock, &[(0, 0)]),
    );
    // Each call deposits half a retry, and nothing refills: every second
    // call may hedge.
    let budget = Arc::new(
        crate::RetryBudget::builder()
            .ratio(0.5)
            .min_retries_per_sec(0)
            .max_balance(10)
            .env(Env::default().with_clock(clock.clone()).with_observer(events.clone()))
            .cache(cache.clone())
            .build()
            .unwrap(),
    );
    let servers = [
        (tail.clone(), breaker(&clock, &cache, "tail", 5, 60)),
        (spare.clone(), breaker(&clock, &cache, "spare", 5, 60)),
    ];
    let p = hedged_over(&servers, &clock, fixed_ms(100), 1, &events, Some(budget));
    let mut models = Vec::new();
    for _ in 0..4 {
        models.push(p.extract_with_model::<String>("t", None).await.unwrap().model);
    }
    assert_eq!(models, ["tail/m", "spare/m", "tail/m", "spare/m"]);
    assert_eq!(spare.calls.load(Ordering::SeqCst), 2, "a denied hedge is not sent");
    assert_eq!(hedges(&events).len(), 2);
    let withdrawals: Vec<bool> = events
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::RetryBudgetStep {
                command: crate::decide::budget::BudgetCommand::Withdraw,
                granted,
                ..
            } => Some(granted),
            _ => None,
        })
        .collect();
    assert_eq!(withdrawals, [false, true, false, true]);
}

#[tokio::test]
async fn a_call_sends_at_most_max_hedges_each_after_the_attempt_before_it() {
    for (max, answered_by, cancelled) in [(1, "a/m", 1), (2, "c/m", 2)] {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let cache = Arc::new(MemoryCache::new(clock.clone()));
        let events = Arc::new(RecordingObserver::new());
        // `a` answers on its sixth poll; `b` never; `c` at once.
        let servers = [
            (
                Lagging::new("a/m", &clock, &[(0, 6)]),
                breaker(&clock, &cache, "a", 5, 60),
            ),
            (
                Lagging::new("b/m", &clock, &[(0, FOREVER)]),
                breaker(&clock, &cache, "b", 5, 60),
            ),
            (
                Lagging::new("c/m", &clock, &[(0, 0)]),
                breaker(&clock, &cache, "c", 5, 60),
            ),
        ];
        let p = hedged_over(&servers, &clock, fixed_ms(50), max, &events, None);
        let answer = p.extract_with_model::<String>("t", None).await.unwrap();
        assert_eq!(answer.model, answered_by, "max_hedges {max}");
        let sent: Vec<u32> = servers.iter().map(|(s, _)| s.calls.load(Ordering::SeqCst)).collect();
        let dropped: u32 = servers.iter().map(|(s, _)| s.cancelled.load(Ordering::SeqCst)).sum();
        assert_eq!(sent.iter().sum::<u32>(), 1 + max, "max_hedges {max}: {sent:?}");
        assert_eq!(dropped, cancelled, "max_hedges {max}");
        let to: Vec<String> = hedges(&events).into_iter().map(|(_, to, _)| to).collect();
        assert_eq!(to, ["kg:circuit:b", "kg:circuit:c"][..max as usize], "max_hedges {max}");
        assert_eq!(clock.sleeps(), vec![Duration::from_millis(50); max as usize]);
    }
}

#[tokio::test]
async fn no_hedge_goes_to_a_deployment_whose_circuit_is_open() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let events = Arc::new(RecordingObserver::new());
    let (tail, spare) = (
        Lagging::new("tail/m", &clock, &[(0, 8)]),
        Lagging::new("spare/m", &clock, &[(0, 0)]),
    );
    let spare_breaker = breaker(&clock, &cache, "spare", 1, 60);
    let permit = spare_breaker.admit().await;
    spare_breaker.record_failure_for(&permit).await.unwrap();
    assert_eq!(spare_breaker.state().await.unwrap(), CircuitState::Open);
    let servers = [
        (tail.clone(), breaker(&clock, &cache, "tail", 5, 60)),
        (spare.clone(), spare_breaker),
    ];
    let p = hedged_over(&servers, &clock, fixed_ms(100), 1, &events, None);
    let answer = p.extract_with_model::<String>("t", None).await.unwrap();
    assert_eq!(answer.model, "tail/m");
    assert_eq!(spare.calls.load(Ordering::SeqCst), 0);
    assert!(hedges(&events).is_empty());
    assert_eq!(tail.cancelled.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_observed_p95_hedges_only_once_a_window_of_answers_is_known() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let events = Arc::new(RecordingObserver::new());
    // Twenty answers of 10, 20, …, 200 ms, then one that never comes.
    let mut script: Vec<(u64, u32)> = (1..=20).map(|i| (i * 10, 0)).collect();
    script.push((0, FOREVER));
    let (tail, spare) = (
        Lagging::new("tail/m", &clock, &script),
        Lagging::new("spare/m", &clock, &[(0, 0)]),
    );
    let servers = [
        (tail.clone(), breaker(&clock, &cache, "tail", 5, 60)),
        (spare.clone(), breaker(&clock, &cache, "spare", 5, 60)),
    ];
    let after = HedgeAfter::ObservedP95 {
        window: 20,
        floor: Duration::from_millis(20),
    };
    let p = hedged_over(&servers, &clock, after, 1, &events, None);
    for _ in 0..20 {
        assert_eq!(p.extract_with_model::<String>("t", None).await.unwrap().model, "tail/m");
    }
    assert!(hedges(&events).is_empty(), "no p95 before a full window");
    assert_eq!(
        p.extract_with_model::<String>("t", None).await.unwrap().model,
        "spare/m"
    );
    // The nearest-rank p95 of 10..=200 ms is 190 ms.
    assert_eq!(
        hedges(&events),
        [("kg:circuit:tail".to_owned(), "kg:circuit:spare".to_owned(), 190)]
    );
}

#[test]
fn hedge_settings_out_of_range_are_refused_naming_the_field() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let builder = || {
        let limiter = Arc::new(RateLimiter::builder(10).build().unwrap());
        HardenedProvider::builder(
            Slow::new("slow/m", &clock, &[0]),
            TenantId::from_u128(9),
            limiter,
            breaker(&clock, &cache, "gpu", 1, 60),
        )
        .deadline(Duration::from_secs(5))
    };
    let field = |after: HedgeAfter, max: u32| builder().hedge(after, max).err().unwrap().field;
    assert_eq!(field(fixed_ms(0), 1), "hedge_after");
    assert_eq!(field(fixed_ms(5000), 1), "hedge_after");
    assert_eq!(field(fixed_ms(100), 0), "max_hedges");
    assert_eq!(field(fixed_ms(100), MAX_HEDGES + 1), "max_hedges");
    let p95 = |window, floor_ms| HedgeAfter::ObservedP95 {
        window,
        floor: Duration::from_millis(floor_ms),
    };
    assert_eq!(field(p95(5, 100), 1), "hedge_window");
    assert_eq!(field(p95(100, 0), 1), "hedge_floor");
    assert_eq!(field(p95(100, 5000), 1), "hedge_floor");
    assert!(builder().hedge(fixed_ms(4999), MAX_HEDGES).is_ok());
}

/// Hedging beside a slow start: a call whose draw passed over a ramping
/// deployment is not hedged there (nor drawn there again), so the ramp
/// keeps the load it turned away.
#[tokio::test]
async fn a_hedge_does_not_go_where_a_slow_start_passed_the_call_over() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let events = Arc::new(RecordingObserver::new());
    let (ramping, slow) = (
        Lagging::new("ramping/m", &clock, &[(0, 0)]),
        Lagging::new("slow/m", &clock, &[(0, 50)]),
    );
    let ramping_breaker = breaker(&clock, &cache, "ramping", 1, 60);
    // Its circuit opened, and a probe closed it just now: its ramp begins.
    ramping_breaker.record_failure().await.unwrap();
    clock.advance(Duration::from_secs(60));
    let probe = ramping_breaker.admit().await;
    ramping_breaker.record_success_for(&probe).await.unwrap();
    let limiter = Arc::new(
        RateLimiter::builder(100_000)
            .env(Env::default().with_clock(clock.clone()))
            .build()
            .unwrap(),
    );
    // A floor of one in a million: the draw passes the ramping one over.
    let ramp = SlowStart::new(Duration::from_secs(600))
        .unwrap()
        .min_share(0.000_001)
        .unwrap();
    let p = HardenedProvider::over(
        Deployment::new(ramping.clone(), ramping_breaker),
        TenantId::from_u128(9),
        limiter,
    )
    .deployment(Deployment::new(slow.clone(), breaker(&clock, &cache, "slow", 1, 60)))
    .retry_policy(RetryPolicy::builder().max_retries(0).build().unwrap())
    .env(env(&clock, 1).with_observer(events.clone()))
    .deadline(Duration::from_secs(30))
    .slow_start(ramp)
    .hedge(fixed_ms(200), 1)
    .unwrap()
    .build();
    let answer = p.extract_with_model::<String>("t", None).await.unwrap();
    assert_eq!(answer.model, "slow/m");
    let drawn = events
        .events()
        .iter()
        .filter(|e| matches!(e, Event::SlowStartDraw { .. }))
        .count();
    assert_eq!(drawn, 1, "one draw, which passed the call over");
    assert_eq!(hedges(&events), [], "nowhere else to hedge to");
    assert_eq!(ramping.calls.load(Ordering::SeqCst), 0);
}
