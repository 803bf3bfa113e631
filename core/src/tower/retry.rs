//! `RetryLayer`: retry a service's transient failures on the retry loop's
//! schedule, within the fleet's retry budget.

use std::fmt;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_layer::Layer;
use tower_service::Service;

use super::{BoxError, ResponseFuture};
use crate::breaker::CircuitOpen;
use crate::limiter::RateLimitExceeded;
use crate::retry::{Retry, RetryError, Retryable};

/// Decides whether a failed call is worth another attempt.
///
/// Any `Fn(&BoxError) -> Retryable` is one. There is no default, as
/// [`Retry`] has none: which failures are transient depends on the inner
/// service. Answer [`Retryable::After`] with the wait a server asked for
/// (its `Retry-After`) so the next attempt waits at least that long;
/// [`retry_after_of`] reads it off this crate's own refusals.
pub trait ClassifyRetry {
    /// Whether `error`, the failure of one attempt, is retried.
    fn retryable(&self, error: &BoxError) -> Retryable;
}

impl<F> ClassifyRetry for F
where
    F: Fn(&BoxError) -> Retryable,
{
    fn retryable(&self, error: &BoxError) -> Retryable {
        self(error)
    }
}

/// The wait a refusal by one of this crate's layers asks for: a
/// [`CircuitOpen`]'s (until a probe is due, or the quota cooldown ends) or
/// a [`RateLimitExceeded`]'s (until the tenant's window has room). `None`
/// for any other error.
///
/// A classifier that retries these with [`Retryable::After`] makes a
/// [`RetryLayer`] outside the breaker wait out an open circuit instead of
/// failing at once; one that answers [`Retryable::No`] for them passes the
/// refusal straight back.
pub fn retry_after_of(error: &BoxError) -> Option<Duration> {
    if let Some(open) = error.downcast_ref::<CircuitOpen>() {
        return Some(open.retry_after);
    }
    error.downcast_ref::<RateLimitExceeded>().map(|r| r.retry_after)
}

/// The failure of one attempt, as the retry loop carries it: the inner
/// service's error, boxed.
///
/// A call whose retries ended answers one of the loop's own errors over
/// it — [`RetryExhausted<AttemptError>`](crate::RetryExhausted),
/// [`RetryDenied<AttemptError>`](crate::RetryDenied) — with this as its
/// `source()`; find them with `error.downcast_ref::<RetryExhausted<AttemptError>>()`.
#[derive(Debug)]
pub struct AttemptError(pub BoxError);

impl fmt::Display for AttemptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for AttemptError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// A [`Layer`] that retries a service's transient failures.
///
/// Each call runs the [`Retry`] loop it is given — its policy's backoff and
/// jitter on its clock and RNG, its [`RetryBudget`](crate::RetryBudget)
/// when it has one (one deposit per call, one withdrawal per retry), its
/// observer — over attempts at the inner service, as the layer's
/// [`ClassifyRetry`] reads each failure. Requests are cloned for each
/// attempt, so they must be [`Clone`]; each retry polls a fresh clone of
/// the inner service ready before calling it.
///
/// A failure the classifier calls permanent is answered as it came, from
/// the attempt that raised it. When the retries end, the call answers
/// [`RetryExhausted<AttemptError>`](crate::RetryExhausted) (every attempt
/// failed) or [`RetryDenied<AttemptError>`](crate::RetryDenied) (the budget
/// denied a retry), the last failure as its `source()`. Dropping the
/// response future stops the loop wherever it is, mid-sleep included.
pub struct RetryLayer<C> {
    retry: Arc<Retry>,
    classify: Arc<C>,
    operation: Arc<str>,
}

impl<C: ClassifyRetry> RetryLayer<C> {
    /// A layer running `retry` over attempts, each failure read by
    /// `classify`.
    pub fn new(retry: Retry, classify: C) -> Self {
        RetryLayer {
            retry: Arc::new(retry),
            classify: Arc::new(classify),
            operation: Arc::from("call"),
        }
    }

    /// Names the calls in the loop's events and messages (default `call`).
    pub fn operation(mut self, name: &str) -> Self {
        self.operation = Arc::from(name);
        self
    }
}

impl<C> Clone for RetryLayer<C> {
    fn clone(&self) -> Self {
        RetryLayer {
            retry: self.retry.clone(),
            classify: self.classify.clone(),
            operation: self.operation.clone(),
        }
    }
}

impl<C> fmt::Debug for RetryLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryLayer")
            .field("retry", &self.retry)
            .field("operation", &self.operation)
            .finish_non_exhaustive()
    }
}

impl<S, C> Layer<S> for RetryLayer<C> {
    type Service = RetryService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RetryService {
            inner,
            retry: self.retry.clone(),
            classify: self.classify.clone(),
            operation: self.operation.clone(),
        }
    }
}

/// A service whose transient failures are retried; built by [`RetryLayer`].
pub struct RetryService<S, C> {
    inner: S,
    retry: Arc<Retry>,
    classify: Arc<C>,
    operation: Arc<str>,
}

impl<S, C> RetryService<S, C> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Clone, C> Clone for RetryService<S, C> {
    fn clone(&self) -> Self {
        RetryService {
            inner: self.inner.clone(),
            retry: self.retry.clone(),
            classify: self.classify.clone(),
            operation: self.operation.clone(),
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for RetryService<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryService")
            .field("inner", &self.inner)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl<S, C, Req> Service<Req> for RetryService<S, C>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    C: ClassifyRetry + Send + Sync + 'static,
    Req: Clone + Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Response>;

    /// The inner service's readiness, for the first attempt; each retry
    /// polls its own clone ready.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let polled = super::take_polled(&mut self.inner);
        let template = polled.clone();
        let mut polled = Some(polled);
        let (retry, classify, operation) = (self.retry.clone(), self.classify.clone(), self.operation.clone());
        ResponseFuture::new(async move {
            let attempt = move || {
                let ready = polled.take();
                let first = ready.is_some();
                let mut service = ready.unwrap_or_else(|| template.clone());
                let request = request.clone();
                async move {
                    if !first {
                        poll_fn(|cx| service.poll_ready(cx))
                            .await
                            .map_err(|e| AttemptError(e.into()))?;
                    }
                    service.call(request).await.map_err(|e| AttemptError(e.into()))
                }
            };
            let result = retry
                .run(&operation, |e: &AttemptError| classify.retryable(&e.0), attempt)
                .await;
            result.map_err(|error| -> BoxError {
                match error {
                    RetryError::Permanent(e) => e.0,
                    RetryError::Exhausted(x) => Box::new(x),
                    RetryError::Deadline(d) => Box::new(d),
                    RetryError::Denied(d) => Box::new(d),
                }
            })
        })
    }
}
