//! The tower layers over `tower-test`'s scripted service, on a manual clock:
//! what reaches the inner service, what the breaker, the limiter and the
//! retry loop decide, and what a dropped call hands back.

use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use redstring::tower::{
    AttemptError, BoxError, CircuitBreakerLayer, ErrIsFailure, Outcome, RateLimitLayer, RetryLayer, retry_after_of,
};
use redstring::{
    CircuitBreaker, CircuitOpen, CircuitState, Env, ManualClock, RateLimitExceeded, RateLimiter, Refusal, Retry,
    RetryBudget, RetryDenied, RetryExhausted, RetryPolicy, Retryable, TenantId,
};
use tower::Service;
use tower_test::mock::{self, Handle, Spawn};

/// A request: the tenant's number and a text.
pub(crate) type Req = (u128, &'static str);
pub(crate) type Inner = Handle<Req, &'static str>;

pub(crate) fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn breaker(clock: &Arc<ManualClock>, threshold: u32, recovery: Duration) -> Arc<CircuitBreaker> {
    let breaker = CircuitBreaker::builder()
        .failure_threshold(threshold)
        .recovery_timeout(recovery)
        .env(Env::default().with_clock(clock.clone()))
        .build()
        .unwrap();
    Arc::new(breaker)
}

fn limiter(clock: &Arc<ManualClock>, rpm: u32) -> Arc<RateLimiter> {
    Arc::new(
        RateLimiter::builder(rpm)
            .env(Env::default().with_clock(clock.clone()))
            .build()
            .unwrap(),
    )
}

pub(crate) fn tenant_of(req: &Req) -> TenantId {
    TenantId::from_u128(req.0)
}

/// What the scripted inner service answers.
pub(crate) enum Reply {
    Ok(&'static str),
    Err(&'static str),
}

pub(crate) fn ready<S>(svc: &mut Spawn<S>)
where
    S: Service<Req, Error = BoxError>,
{
    match svc.poll_ready() {
        Poll::Ready(Ok(())) => {}
        Poll::Ready(Err(e)) => panic!("not ready: {e}"),
        Poll::Pending => panic!("not ready: pending"),
    }
}

/// A call the layers admit: the inner service sees `req` and answers `reply`.
pub(crate) async fn through<S>(
    svc: &mut Spawn<S>,
    inner: &mut Inner,
    req: Req,
    reply: Reply,
) -> Result<&'static str, BoxError>
where
    S: Service<Req, Response = &'static str, Error = BoxError>,
    S::Future: Send + 'static,
{
    ready(svc);
    let mut call = tokio::spawn(svc.call(req));
    let (seen, respond) = tokio::select! {
        request = inner.next_request() => request.expect("the inner service is called"),
        ended = &mut call => panic!("refused before the inner service: {:?}", ended.unwrap().err()),
    };
    assert_eq!(seen, req);
    match reply {
        Reply::Ok(v) => respond.send_response(v),
        Reply::Err(e) => respond.send_error(e),
    }
    call.await.unwrap()
}

/// A call the layers refuse: its error, and the inner service never sees it.
pub(crate) async fn refused<S>(svc: &mut Spawn<S>, inner: &mut Inner, req: Req) -> BoxError
where
    S: Service<Req, Response = &'static str, Error = BoxError>,
{
    ready(svc);
    let error = svc.call(req).await.unwrap_err();
    assert!(
        inner.poll_request().is_pending(),
        "a refused call reached the inner service"
    );
    error
}

/// An `Ok("overloaded")` is a failure too: what a client that answers
/// errors as responses needs.
fn overloaded_fails(result: &Result<&'static str, BoxError>) -> Outcome {
    match result {
        Ok("overloaded") | Err(_) => Outcome::Failure,
        Ok(_) => Outcome::Success,
    }
}

#[tokio::test]
async fn the_breaker_opens_on_classified_failures_and_refuses_without_calling() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let breaker = breaker(&clock, 2, secs(30));
    let (mut svc, mut inner) = mock::spawn_layer(CircuitBreakerLayer::new(breaker.clone(), overloaded_fails));

    // A success between failures clears the count, as the breaker's own
    // reports do: the classifier's verdicts reach it.
    through(&mut svc, &mut inner, (0, "a"), Reply::Err("boom"))
        .await
        .unwrap_err();
    through(&mut svc, &mut inner, (0, "b"), Reply::Ok("fine"))
        .await
        .unwrap();
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Closed);
    through(&mut svc, &mut inner, (0, "c"), Reply::Err("boom"))
        .await
        .unwrap_err();
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Closed);
    // An Ok the classifier reads as a failure is answered as it came.
    assert_eq!(
        through(&mut svc, &mut inner, (0, "d"), Reply::Ok("overloaded"))
            .await
            .unwrap(),
        "overloaded"
    );
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Open);

    clock.advance(secs(10));
    let error = refused(&mut svc, &mut inner, (0, "e")).await;
    let open = error.downcast_ref::<CircuitOpen>().expect("a CircuitOpen");
    assert_eq!(open.retry_after, secs(20));
    assert_eq!(open.reason, Refusal::Circuit);
    assert_eq!(
        open.message,
        "kg:circuit is unavailable; the next probe is due in 20.00s"
    );
}

#[tokio::test]
async fn after_the_recovery_timeout_a_probe_goes_through() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let breaker = breaker(&clock, 1, secs(30));
    let (mut svc, mut inner) = mock::spawn_layer(CircuitBreakerLayer::new(breaker.clone(), ErrIsFailure));
    through(&mut svc, &mut inner, (0, "a"), Reply::Err("boom"))
        .await
        .unwrap_err();
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Open);

    clock.advance(secs(30));
    assert_eq!(
        through(&mut svc, &mut inner, (0, "probe"), Reply::Ok("fine"))
            .await
            .unwrap(),
        "fine"
    );
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Closed);
}

#[tokio::test]
async fn a_dropped_probe_releases_it_and_the_next_call_probes() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let breaker = breaker(&clock, 1, secs(30));
    let (mut svc, mut inner) = mock::spawn_layer(CircuitBreakerLayer::new(breaker.clone(), ErrIsFailure));
    through(&mut svc, &mut inner, (0, "a"), Reply::Err("boom"))
        .await
        .unwrap_err();
    clock.advance(secs(30));

    // The probe is admitted and in flight at the inner service.
    ready(&mut svc);
    let probe = tokio::spawn(svc.call((0, "probe")));
    let (_, unanswered) = inner.next_request().await.unwrap();
    assert_eq!(breaker.state().await.unwrap(), CircuitState::HalfOpen);
    // While it is held, no other call probes.
    let error = refused(&mut svc, &mut inner, (0, "b")).await;
    assert!(error.is::<CircuitOpen>());

    // The caller gives up: the future is dropped, unanswered.
    probe.abort();
    assert!(probe.await.unwrap_err().is_cancelled());
    drop(unanswered);

    // Released at once, not after the 30 s lease: the next call probes.
    assert_eq!(
        through(&mut svc, &mut inner, (0, "c"), Reply::Ok("fine"))
            .await
            .unwrap(),
        "fine"
    );
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Closed);
}

#[tokio::test]
async fn the_limiter_admits_rpm_per_tenant_then_refuses_with_the_wait() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let limiter = limiter(&clock, 2);
    let (mut svc, mut inner) = mock::spawn_layer(RateLimitLayer::new(limiter, tenant_of));

    through(&mut svc, &mut inner, (1, "a"), Reply::Ok("ok")).await.unwrap();
    clock.advance(secs(10));
    through(&mut svc, &mut inner, (1, "b"), Reply::Ok("ok")).await.unwrap();
    let error = refused(&mut svc, &mut inner, (1, "c")).await;
    let limited = error.downcast_ref::<RateLimitExceeded>().expect("a RateLimitExceeded");
    assert_eq!(limited.tenant, TenantId::from_u128(1));
    assert_eq!(limited.used, 2);
    // The first hit leaves the inclusive 60 s window 50 s and 1 µs from now.
    let wait = secs(50) + Duration::from_micros(1);
    assert_eq!(limited.retry_after, wait);

    // Another tenant has its own allowance.
    through(&mut svc, &mut inner, (2, "a"), Reply::Ok("ok")).await.unwrap();
    through(&mut svc, &mut inner, (2, "b"), Reply::Ok("ok")).await.unwrap();
    assert!(refused(&mut svc, &mut inner, (2, "c")).await.is::<RateLimitExceeded>());

    // An inner failure spends the slot and comes back as it was.
    clock.advance(wait);
    let error = through(&mut svc, &mut inner, (1, "d"), Reply::Err("boom"))
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "boom");
    assert!(refused(&mut svc, &mut inner, (1, "e")).await.is::<RateLimitExceeded>());
}

#[tokio::test]
async fn a_limiter_refusal_inside_the_breaker_is_no_failure_and_frees_the_probe() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let breaker = breaker(&clock, 1, secs(30));
    let layers = tower::ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(breaker.clone(), ErrIsFailure))
        .layer(RateLimitLayer::new(limiter(&clock, 1), tenant_of));
    let (mut svc, mut inner) = mock::spawn_layer(layers);

    // Closed: a refusal by the limiter counts as nothing (threshold 1).
    through(&mut svc, &mut inner, (1, "a"), Reply::Ok("ok")).await.unwrap();
    assert!(refused(&mut svc, &mut inner, (1, "b")).await.is::<RateLimitExceeded>());
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Closed);

    // Half-open: the probe the limiter refused is handed back, so another
    // tenant's call probes at once.
    through(&mut svc, &mut inner, (2, "a"), Reply::Err("boom"))
        .await
        .unwrap_err();
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Open);
    clock.advance(secs(30));
    assert!(refused(&mut svc, &mut inner, (1, "c")).await.is::<RateLimitExceeded>());
    assert_eq!(breaker.state().await.unwrap(), CircuitState::HalfOpen);
    through(&mut svc, &mut inner, (3, "a"), Reply::Ok("ok")).await.unwrap();
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Closed);
}

#[tokio::test]
async fn poll_ready_reports_the_inner_readiness_only() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());

    let breaker = breaker(&clock, 1, secs(30));
    let (mut svc, mut inner) = mock::spawn_layer(CircuitBreakerLayer::new(breaker.clone(), ErrIsFailure));
    through(&mut svc, &mut inner, (0, "a"), Reply::Err("boom"))
        .await
        .unwrap_err();
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Open);
    inner.allow(0);
    assert!(svc.poll_ready().is_pending());
    inner.allow(1);
    // Ready though the circuit is open: the breaker is asked in `call`.
    assert!(matches!(svc.poll_ready(), Poll::Ready(Ok(()))));
    inner.send_error("down");
    match svc.poll_ready() {
        Poll::Ready(Err(e)) => assert_eq!(e.to_string(), "down"),
        other => panic!("expected the inner error, got {other:?}"),
    }

    let (mut svc, mut inner) = mock::spawn_layer(RateLimitLayer::new(limiter(&clock, 1), tenant_of));
    through(&mut svc, &mut inner, (1, "a"), Reply::Ok("ok")).await.unwrap();
    inner.allow(0);
    assert!(svc.poll_ready().is_pending());
    inner.allow(1);
    // Ready though the tenant is out of slots: the limiter is asked in `call`.
    assert!(matches!(svc.poll_ready(), Poll::Ready(Ok(()))));
    inner.send_error("down");
    match svc.poll_ready() {
        Poll::Ready(Err(e)) => assert_eq!(e.to_string(), "down"),
        other => panic!("expected the inner error, got {other:?}"),
    }
}

fn retrying(clock: &Arc<ManualClock>, max_retries: u32) -> Retry {
    let policy = RetryPolicy::builder()
        .max_retries(max_retries)
        .initial_delay(secs(1))
        .jitter(0.0)
        .build()
        .unwrap();
    Retry::new(policy).env(Env::default().with_clock(clock.clone()))
}

/// Retries `busy` and `slow down` (the server asking for 5 s), nothing else.
fn busy_is_transient(error: &BoxError) -> Retryable {
    match error.to_string().as_str() {
        "busy" => Retryable::Yes,
        "slow down" => Retryable::After(secs(5)),
        _ => Retryable::No,
    }
}

/// Calls `svc` with `req`, answering each attempt the inner service sees
/// from `script` in order: the call's result and the attempts that reached
/// the inner service. An attempt beyond the script fails the test.
async fn scripted<S>(
    svc: &mut Spawn<S>,
    inner: &mut Inner,
    req: Req,
    script: Vec<Reply>,
) -> (Result<&'static str, BoxError>, usize)
where
    S: Service<Req, Response = &'static str, Error = BoxError>,
    S::Future: Send + 'static,
{
    ready(svc);
    let mut call = tokio::spawn(svc.call(req));
    let mut seen = 0;
    for reply in script {
        let (request, respond) = tokio::select! {
            request = inner.next_request() => request.expect("an attempt"),
            ended = &mut call => return (ended.unwrap(), seen),
        };
        assert_eq!(request, req);
        seen += 1;
        match reply {
            Reply::Ok(v) => respond.send_response(v),
            Reply::Err(e) => respond.send_error(e),
        }
    }
    tokio::select! {
        ended = &mut call => (ended.unwrap(), seen),
        extra = inner.next_request() => panic!("an attempt beyond the script: {:?}", extra.map(|(r, _)| r)),
    }
}

#[tokio::test]
async fn the_retry_layer_retries_transient_failures_on_the_policys_schedule() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let (mut svc, mut inner) = mock::spawn_layer(RetryLayer::new(retrying(&clock, 3), busy_is_transient));
    let script = vec![Reply::Err("busy"), Reply::Err("busy"), Reply::Ok("done")];
    let (result, attempts) = scripted(&mut svc, &mut inner, (1, "a"), script).await;
    assert_eq!(result.unwrap(), "done");
    assert_eq!(attempts, 3);
    // 1 s, then 2 s: the policy's backoff, slept on the injected clock.
    assert_eq!(clock.sleeps(), [secs(1), secs(2)]);
}

#[tokio::test]
async fn the_retry_layer_waits_at_least_what_the_server_asked() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let (mut svc, mut inner) = mock::spawn_layer(RetryLayer::new(retrying(&clock, 3), busy_is_transient));
    let script = vec![Reply::Err("slow down"), Reply::Ok("done")];
    let (result, _) = scripted(&mut svc, &mut inner, (1, "a"), script).await;
    assert_eq!(result.unwrap(), "done");
    assert_eq!(clock.sleeps(), [secs(5)]);
}

#[tokio::test]
async fn a_permanent_failure_comes_back_unwrapped_from_its_attempt() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let (mut svc, mut inner) = mock::spawn_layer(RetryLayer::new(retrying(&clock, 3), busy_is_transient));
    let (result, attempts) = scripted(&mut svc, &mut inner, (1, "a"), vec![Reply::Err("bad request")]).await;
    let error = result.unwrap_err();
    assert_eq!(error.to_string(), "bad request");
    assert!(error.downcast_ref::<RetryExhausted<AttemptError>>().is_none());
    assert_eq!(attempts, 1);
    assert!(clock.sleeps().is_empty());
}

#[tokio::test]
async fn spent_retries_answer_the_loops_error_with_the_last_failure_as_source() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let layer = RetryLayer::new(retrying(&clock, 2), busy_is_transient).operation("extract");
    let (mut svc, mut inner) = mock::spawn_layer(layer);
    let script = vec![Reply::Err("busy"), Reply::Err("busy"), Reply::Err("busy")];
    let (result, attempts) = scripted(&mut svc, &mut inner, (1, "a"), script).await;
    assert_eq!(attempts, 3);
    let error = result.unwrap_err();
    let spent = error
        .downcast_ref::<RetryExhausted<AttemptError>>()
        .expect("a RetryExhausted");
    assert_eq!((spent.attempts, spent.max_retries), (3, 2));
    assert_eq!(error.to_string(), "Exhausted 2 retries for extract");
    assert_eq!(std::error::Error::source(&*error).unwrap().to_string(), "busy");
}

#[tokio::test]
async fn the_retry_budget_bounds_the_layers_retries() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    // Each call deposits one retry and there is no floor: the call may
    // retry once, whatever the policy allows.
    let budget = RetryBudget::builder()
        .ratio(1.0)
        .min_retries_per_sec(0)
        .max_balance(1)
        .env(Env::default().with_clock(clock.clone()))
        .build()
        .unwrap();
    let retry = retrying(&clock, 5).budget(Arc::new(budget));
    let (mut svc, mut inner) = mock::spawn_layer(RetryLayer::new(retry, busy_is_transient));
    let script = vec![Reply::Err("busy"), Reply::Err("busy"), Reply::Err("busy")];
    let (result, attempts) = scripted(&mut svc, &mut inner, (1, "a"), script).await;
    let error = result.unwrap_err();
    let denied = error
        .downcast_ref::<RetryDenied<AttemptError>>()
        .expect("a RetryDenied");
    assert_eq!(denied.attempts, attempts as u32);
    assert_eq!(attempts, 2, "the budget, not the policy's 5 retries, ended it");
}

#[tokio::test]
async fn a_retry_layer_outside_the_breaker_waits_out_the_open_circuit() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let breaker = breaker(&clock, 1, secs(10));
    // Every failure is retried, at least as late as a refusal asks.
    let classify = |error: &BoxError| retry_after_of(error).map_or(Retryable::Yes, Retryable::After);
    let layer = tower::ServiceBuilder::new()
        .layer(RetryLayer::new(retrying(&clock, 3), classify))
        .layer(CircuitBreakerLayer::new(breaker.clone(), ErrIsFailure))
        .into_inner();
    let (mut svc, mut inner) = mock::spawn_layer(layer);
    // The first attempt fails and opens the circuit; the second, 1 s later,
    // is refused for the 9 s left; the third is the probe, and succeeds.
    let script = vec![Reply::Err("boom"), Reply::Ok("done")];
    let (result, attempts) = scripted(&mut svc, &mut inner, (1, "a"), script).await;
    assert_eq!(result.unwrap(), "done");
    assert_eq!(attempts, 2, "the refused attempt never reached the server");
    assert_eq!(clock.sleeps(), [secs(1), secs(9)]);
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Closed);
}

#[tokio::test]
async fn a_probe_dropped_during_its_retry_goes_back_through_the_whole_stack() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let breaker = breaker(&clock, 1, secs(30));
    // The breaker outermost, the retry loop within one admission, the
    // limiter innermost: the stack a service built in the spec's order has.
    let layers = tower::ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(breaker.clone(), ErrIsFailure))
        .layer(RetryLayer::new(retrying(&clock, 3), busy_is_transient))
        .layer(RateLimitLayer::new(limiter(&clock, 100), tenant_of));
    let (mut svc, mut inner) = mock::spawn_layer(layers);
    through(&mut svc, &mut inner, (1, "a"), Reply::Err("boom"))
        .await
        .unwrap_err();
    clock.advance(secs(30));

    // The probe's first attempt finds the server busy; its retry is in
    // flight when the caller gives up.
    ready(&mut svc);
    let probe = tokio::spawn(svc.call((1, "probe")));
    let (_, respond) = inner.next_request().await.unwrap();
    respond.send_error("busy");
    let (_, unanswered) = inner.next_request().await.unwrap();
    assert_eq!(breaker.state().await.unwrap(), CircuitState::HalfOpen);
    let error = refused(&mut svc, &mut inner, (2, "b")).await;
    assert!(error.is::<CircuitOpen>(), "{error}");
    probe.abort();
    assert!(probe.await.unwrap_err().is_cancelled());
    drop(unanswered);

    // Handed back through every layer, with the clock still: the next
    // call is the probe, and it closes the circuit.
    through(&mut svc, &mut inner, (2, "c"), Reply::Ok("fine"))
        .await
        .unwrap();
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Closed);
}
