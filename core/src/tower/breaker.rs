//! `CircuitBreakerLayer`: ask the breaker before each call, report after.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use tower_layer::Layer;
use tower_service::Service;

use super::{BoxError, ResponseFuture, is_refusal};
use crate::breaker::{CircuitBreaker, CircuitOpen, Permit};
use crate::cache::{BreakerStore, MemoryCache};
use crate::env::Env;
use crate::observe::{Event, Observer, TracingObserver};

/// What a call's result tells the breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The server is up: closes a half-open circuit, clears a closed
    /// circuit's failure count.
    Success,
    /// The server failed: counted toward the threshold, reopens a half-open
    /// circuit.
    Failure,
    /// Nothing about the server (the call never reached it): the permit is
    /// handed back, and a probe's lease ends at once.
    Release,
}

/// Reads a call's result as an [`Outcome`] for the breaker.
///
/// Any `Fn(&Result<Resp, E>) -> Outcome` is one; [`ErrIsFailure`] is the
/// plain reading. A server that answers errors as responses (an HTTP
/// client's 503 is an `Ok`) needs its own, as does an error type that
/// includes answers showing the server is up (a 400 about the request).
pub trait Classify<Resp, E> {
    /// What `result` tells the breaker.
    fn classify(&self, result: &Result<Resp, E>) -> Outcome;
}

impl<Resp, E, F> Classify<Resp, E> for F
where
    F: Fn(&Result<Resp, E>) -> Outcome,
{
    fn classify(&self, result: &Result<Resp, E>) -> Outcome {
        self(result)
    }
}

/// The plain reading of a result: `Ok` is a success, `Err` a failure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrIsFailure;

impl<Resp, E> Classify<Resp, E> for ErrIsFailure {
    fn classify(&self, result: &Result<Resp, E>) -> Outcome {
        match result {
            Ok(_) => Outcome::Success,
            Err(_) => Outcome::Failure,
        }
    }
}

/// A [`Layer`] that puts a [`CircuitBreaker`] in front of a service.
///
/// Every call is admitted by [`CircuitBreaker::admit`] first. A refusal
/// answers a [`CircuitOpen`] — named by the breaker's key prefix, with the
/// wait and the reason — and never calls the inner service. An admitted
/// call is reported once it ends, exactly by its permit
/// ([`record_success_for`](CircuitBreaker::record_success_for),
/// [`record_failure_for`](CircuitBreaker::record_failure_for) or
/// [`release`](CircuitBreaker::release)), as the layer's [`Classify`]
/// reads the result — except that a refusal by a layer inside (a
/// [`RateLimitExceeded`](crate::RateLimitExceeded), a [`CircuitOpen`], an
/// [`AcquireError`](crate::AcquireError)) is always a release: the call never
/// reached the server. A report the store cannot take is reported to the
/// observer as [`Event::CacheUnavailable`] (fallback `not recorded`), and
/// the call's own result is answered as it was.
///
/// Breakers are per model server: layer one breaker over the service that
/// calls one server.
pub struct CircuitBreakerLayer<C, B = MemoryCache> {
    breaker: Arc<CircuitBreaker<B>>,
    classify: Arc<C>,
    observer: Arc<dyn Observer>,
}

impl<C, B: BreakerStore> CircuitBreakerLayer<C, B> {
    /// A layer over `breaker` reading results with `classify`
    /// ([`ErrIsFailure`], or a closure), reporting to a [`TracingObserver`].
    pub fn new(breaker: Arc<CircuitBreaker<B>>, classify: C) -> Self {
        CircuitBreakerLayer {
            breaker,
            classify: Arc::new(classify),
            observer: Arc::new(TracingObserver),
        }
    }

    /// Tells a report the store could not take to `env`'s observer (default
    /// [`TracingObserver`]); the layer reads no clock and draws nothing. The
    /// breaker's own events go to its own observer.
    pub fn env(mut self, env: Env) -> Self {
        self.observer = env.observer().clone();
        self
    }

    /// The breaker.
    pub fn breaker(&self) -> &Arc<CircuitBreaker<B>> {
        &self.breaker
    }
}

impl<C, B> Clone for CircuitBreakerLayer<C, B> {
    fn clone(&self) -> Self {
        CircuitBreakerLayer {
            breaker: self.breaker.clone(),
            classify: self.classify.clone(),
            observer: self.observer.clone(),
        }
    }
}

impl<C, B> fmt::Debug for CircuitBreakerLayer<C, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerLayer")
            .field("breaker", &self.breaker)
            .finish_non_exhaustive()
    }
}

impl<S, C, B> Layer<S> for CircuitBreakerLayer<C, B> {
    type Service = CircuitBreakerService<S, C, B>;

    fn layer(&self, inner: S) -> Self::Service {
        CircuitBreakerService {
            inner,
            breaker: self.breaker.clone(),
            classify: self.classify.clone(),
            observer: self.observer.clone(),
        }
    }
}

/// A service behind a [`CircuitBreaker`]; built by [`CircuitBreakerLayer`].
pub struct CircuitBreakerService<S, C, B = MemoryCache> {
    inner: S,
    breaker: Arc<CircuitBreaker<B>>,
    classify: Arc<C>,
    observer: Arc<dyn Observer>,
}

impl<S, C, B> CircuitBreakerService<S, C, B> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Clone, C, B> Clone for CircuitBreakerService<S, C, B> {
    fn clone(&self) -> Self {
        CircuitBreakerService {
            inner: self.inner.clone(),
            breaker: self.breaker.clone(),
            classify: self.classify.clone(),
            observer: self.observer.clone(),
        }
    }
}

impl<S: fmt::Debug, C, B> fmt::Debug for CircuitBreakerService<S, C, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerService")
            .field("inner", &self.inner)
            .field("breaker", &self.breaker)
            .finish_non_exhaustive()
    }
}

impl<S, C, B, Req> Service<Req> for CircuitBreakerService<S, C, B>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, S::Error> + Send + Sync + 'static,
    B: BreakerStore,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Response>;

    /// The inner service's readiness: the breaker is asked in `call`.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let mut inner = super::take_polled(&mut self.inner);
        let breaker = self.breaker.clone();
        let classify = self.classify.clone();
        let observer = self.observer.clone();
        ResponseFuture::new(async move {
            let permit = breaker.admit().await;
            if let Permit::Refused {
                retry_after, reason, ..
            } = permit
            {
                let refusal = CircuitOpen::refused(breaker.key_prefix(), retry_after, reason);
                return Err(BoxError::from(refusal));
            }
            let held = Held {
                breaker,
                permit: Some(permit),
                observer,
            };
            // In a block of its own: the inner error need not be `Send`,
            // so it must be gone before the report's await.
            let (result, outcome) = {
                let answered = inner.call(request).await;
                let outcome = classify.classify(&answered);
                (answered.map_err(Into::into), outcome)
            };
            let outcome = match &result {
                Err(error) if is_refusal(error) => Outcome::Release,
                _ => outcome,
            };
            held.report(outcome).await;
            result
        })
    }
}

/// An admitted call's permit until it is reported: dropped unreported, it
/// hands a probe back ([`release_detached`]).
struct Held<B: BreakerStore> {
    breaker: Arc<CircuitBreaker<B>>,
    /// `None` once reported.
    permit: Option<Permit>,
    observer: Arc<dyn Observer>,
}

impl<B: BreakerStore> Held<B> {
    /// Reports the call as `outcome`. Held until the report is taken: a
    /// future dropped while reporting still releases the probe, which is
    /// harmless after a report that went through (a late release changes
    /// nothing).
    async fn report(mut self, outcome: Outcome) {
        let Some(permit) = self.permit else { return };
        let (operation, result) = match outcome {
            Outcome::Success => ("record_success", self.breaker.record_success_for(&permit).await),
            Outcome::Failure => ("record_failure", self.breaker.record_failure_for(&permit).await),
            Outcome::Release => ("release", self.breaker.release(&permit).await),
        };
        self.permit = None;
        if let Err(error) = result {
            not_recorded(&*self.observer, self.breaker.key_prefix(), operation, &error);
        }
    }
}

impl<B: BreakerStore> Drop for Held<B> {
    fn drop(&mut self) {
        if let Some(permit @ Permit::Probe(_)) = self.permit.take() {
            release_detached(self.breaker.clone(), permit, self.observer.clone());
        }
    }
}

/// Hands `permit` back from a drop, where nothing can be awaited: the
/// release is polled once — over a store that answers at once, that is the
/// whole release — and, if it is still waiting on the store, spawned on the
/// current tokio runtime. With no runtime, the probe's lease ends it.
fn release_detached<B: BreakerStore>(breaker: Arc<CircuitBreaker<B>>, permit: Permit, observer: Arc<dyn Observer>) {
    let mut release = Box::pin(async move {
        if let Err(error) = breaker.release(&permit).await {
            not_recorded(&*observer, breaker.key_prefix(), "release", &error);
        }
    });
    if release
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_ready()
    {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        drop(runtime.spawn(release));
    }
}

/// Tells `observer` that a report to the breaker `prefix` was lost.
fn not_recorded(observer: &dyn Observer, prefix: &str, operation: &'static str, error: &crate::CacheError) {
    observer.on_event(&Event::CacheUnavailable {
        component: Arc::from(prefix),
        operation,
        fallback: "not recorded",
        error: error.to_string(),
    });
}
