//! `RateLimitLayer`: take the tenant's slot before each call.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_layer::Layer;
use tower_service::Service;

use super::{BoxError, ResponseFuture};
use crate::cache::{LimiterStore, MemoryCache};
use crate::limiter::{AcquireError, RateLimiter};
use crate::tenant::TenantId;

/// A [`Layer`] that takes a slot from a [`RateLimiter`] before each call,
/// for the tenant `tenant_of` reads off the request.
///
/// A call is admitted by [`RateLimiter::acquire`] first. A refusal answers
/// the limiter's [`RateLimitExceeded`](crate::RateLimitExceeded), with the
/// exact `retry_after`; a limiter that could not reach its cache and whose
/// [`OnCacheUnavailable`](crate::OnCacheUnavailable) policy refuses answers
/// its [`AcquireError`]. Either way the inner service is not called. A
/// granted slot is spent, whatever the call does after.
pub struct RateLimitLayer<T, L = MemoryCache> {
    limiter: Arc<RateLimiter<L>>,
    tenant_of: Arc<T>,
}

impl<T, L: LimiterStore> RateLimitLayer<T, L> {
    /// A layer over `limiter`, charging each request to `tenant_of(&request)`.
    pub fn new(limiter: Arc<RateLimiter<L>>, tenant_of: T) -> Self {
        RateLimitLayer {
            limiter,
            tenant_of: Arc::new(tenant_of),
        }
    }

    /// The limiter.
    pub fn limiter(&self) -> &Arc<RateLimiter<L>> {
        &self.limiter
    }
}

impl<T, L> Clone for RateLimitLayer<T, L> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            limiter: self.limiter.clone(),
            tenant_of: self.tenant_of.clone(),
        }
    }
}

impl<T, L> fmt::Debug for RateLimitLayer<T, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

impl<S, T, L> Layer<S> for RateLimitLayer<T, L> {
    type Service = RateLimitService<S, T, L>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            limiter: self.limiter.clone(),
            tenant_of: self.tenant_of.clone(),
        }
    }
}

/// A service behind a per-tenant [`RateLimiter`]; built by [`RateLimitLayer`].
pub struct RateLimitService<S, T, L = MemoryCache> {
    inner: S,
    limiter: Arc<RateLimiter<L>>,
    tenant_of: Arc<T>,
}

impl<S, T, L> RateLimitService<S, T, L> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Clone, T, L> Clone for RateLimitService<S, T, L> {
    fn clone(&self) -> Self {
        RateLimitService {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            tenant_of: self.tenant_of.clone(),
        }
    }
}

impl<S: fmt::Debug, T, L> fmt::Debug for RateLimitService<S, T, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

impl<S, T, L, Req> Service<Req> for RateLimitService<S, T, L>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    T: Fn(&Req) -> TenantId,
    L: LimiterStore,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Response>;

    /// The inner service's readiness: the limiter is asked in `call`.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let tenant = (self.tenant_of)(&request);
        let mut inner = super::take_polled(&mut self.inner);
        let limiter = self.limiter.clone();
        ResponseFuture::new(async move {
            match limiter.acquire(tenant).await {
                Ok(_) => inner.call(request).await.map_err(Into::into),
                Err(AcquireError::Limited(refusal)) => Err(BoxError::from(refusal)),
                Err(error @ AcquireError::Cache(_)) => Err(BoxError::from(error)),
            }
        })
    }
}
