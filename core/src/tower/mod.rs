//! tower middleware: the breaker, the limiter and the retry loop as
//! [`Layer`]s.
//!
//! Services that compose their middleware as tower layers get the same
//! hardening as [`HardenedProvider`](crate::HardenedProvider), over any
//! [`Service`]: [`CircuitBreakerLayer`] asks a [`CircuitBreaker`] before each
//! call and reports how the call went, as a [`Classify`] reads the result;
//! [`RateLimitLayer`] takes a slot from a [`RateLimiter`] for the tenant a
//! function reads off the request; [`RetryLayer`] runs a [`Retry`] loop
//! (backoff, jitter, the fleet's retry budget, a server's `Retry-After`)
//! over attempts, as a [`ClassifyRetry`] reads each failure. In the spec's
//! order the breaker is the outer layer: a call the limiter refuses never
//! reaches the model, and is no verdict on it. A retry layer inside the
//! breaker retries within one admission; outside it, each attempt is
//! admitted afresh, and [`retry_after_of`] lets a classifier wait out an
//! open circuit's or a limiter's `retry_after`. [`ExtractService`] is the
//! other way round: a provider — a whole
//! [`HardenedProvider`](crate::HardenedProvider) — as a service of typed
//! [`Extract`] requests, for tower's own layers or a web framework.
//!
//! Admission is decided in `call`, where the request — and so the tenant —
//! is known, and asynchronously, since a shared store answers over the
//! network. `poll_ready` reports the inner service's readiness and nothing
//! else. A layer's `call` therefore takes the inner service it polled ready
//! into the response future (leaving a clone in its place, as tower's
//! guidance for such middleware says) and calls it only once admitted: a
//! refused call never reaches the inner service, and the inner services must
//! be [`Clone`].
//!
//! # Errors
//!
//! As tower's own middleware does (`Elapsed`, `Overloaded`), the services
//! answer a [`BoxError`], so that layers stack without nesting their error
//! types: the inner service's error as it converts, or the refusal's own
//! type — [`CircuitOpen`] (circuit open or cooling down) or
//! [`RateLimitExceeded`] (the tenant is over its allowance), each carrying
//! the `retry_after` to honour — or an [`AcquireError`] when the limiter
//! could not reach its cache and its policy refuses. Find them with
//! `error.downcast_ref::<CircuitOpen>()`. The breaker knows these refusals
//! when they come from a layer inside it: they are no verdict on the
//! server, and the call's permit is handed back.
//!
//! # Cancellation
//!
//! A response future dropped after its breaker admission (a caller's
//! timeout, a `select!`) hands a half-open probe back at once, so the next
//! caller probes instead of waiting out the
//! [`probe_lease`](crate::CircuitBreakerBuilder::probe_lease): the release
//! runs in the drop when the store answers at once ([`MemoryCache`]), and
//! on the current tokio runtime otherwise; outside a runtime, the lease
//! still ends it. A dropped call through a closed circuit holds nothing and
//! reports nothing. A limiter slot, once granted, is spent — the window
//! counts calls admitted, and a dropped call was admitted.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use redstring::tower::{BoxError, CircuitBreakerLayer, ErrIsFailure, RateLimitLayer};
//! use redstring::{CircuitBreaker, Env, ManualClock, RateLimitExceeded, RateLimiter, TenantId};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! struct Ask {
//!     tenant: TenantId,
//!     prompt: String,
//! }
//! let env = Env::default().with_clock(Arc::new(ManualClock::at_fixed_epoch()));
//! let breaker = Arc::new(CircuitBreaker::builder().env(env.clone()).build().unwrap());
//! let limiter = Arc::new(RateLimiter::builder(1).env(env).build().unwrap());
//! let model = service_fn(|ask: Ask| async move { Ok::<_, BoxError>(ask.prompt.len()) });
//! let service = ServiceBuilder::new()
//!     .layer(CircuitBreakerLayer::new(breaker, ErrIsFailure))
//!     .layer(RateLimitLayer::new(limiter, |ask: &Ask| ask.tenant))
//!     .service(model);
//!
//! let ask = |prompt: &str| Ask { tenant: TenantId::from_u128(7), prompt: prompt.into() };
//! assert_eq!(service.clone().oneshot(ask("hello")).await.unwrap(), 5);
//! let refused = service.oneshot(ask("again")).await.unwrap_err();
//! let refused = refused.downcast_ref::<RateLimitExceeded>().unwrap();
//! assert_eq!(refused.retry_after, Duration::from_micros(60_000_001));
//! # });
//! ```
//!
//! [`Layer`]: tower_layer::Layer
//! [`Service`]: tower_service::Service
//! [`CircuitBreaker`]: crate::CircuitBreaker
//! [`RateLimiter`]: crate::RateLimiter
//! [`MemoryCache`]: crate::MemoryCache
//! [`AcquireError`]: crate::AcquireError
//! [`Retry`]: crate::Retry

mod breaker;
mod extract;
mod future;
mod limiter;
mod retry;

pub use breaker::{CircuitBreakerLayer, CircuitBreakerService, Classify, ErrIsFailure, Outcome};
pub use extract::{Extract, ExtractFuture, ExtractService};
pub use future::ResponseFuture;
pub use limiter::{RateLimitLayer, RateLimitService};
pub use retry::{AttemptError, ClassifyRetry, RetryLayer, RetryService, retry_after_of};

use crate::breaker::CircuitOpen;
use crate::limiter::{AcquireError, RateLimitExceeded};

/// The error the layers' services answer: tower's `BoxError`, the same type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The inner service polled ready, taken for the call, leaving a clone in
/// its place for the next `poll_ready` — as tower's guidance says a layer
/// that calls its inner service from its response future must.
fn take_polled<S: Clone>(inner: &mut S) -> S {
    let fresh = inner.clone();
    std::mem::replace(inner, fresh)
}

/// Whether `error` is a refusal by one of these layers (or a limiter that
/// could not reach its cache): the call never reached the server.
fn is_refusal(error: &BoxError) -> bool {
    error.is::<CircuitOpen>() || error.is::<RateLimitExceeded>() || error.is::<AcquireError>()
}
