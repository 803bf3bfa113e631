//! What a call is charged: the tenant's slot and token reservation, each
//! deployment's own limit per attempt, and their settlement to what the
//! server reported using.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::HardenedProvider;
use crate::cache::{BreakerStore, TokenStore};
use crate::decide::concurrency::CallEnd;
use crate::decide::tokens::RefusedBy;
use crate::limiter::{AcquireError, Reservation, TokenAcquireError};
use crate::observe::Event;
use crate::provider::error::{DeadlineExceeded, DeadlineWait, DeploymentLimited};
use crate::provider::{ExtractError, ExtractRequest, Extracted, LlmProvider, ProviderError};
use crate::time::Timestamp;

/// Whether a failed attempt may have spent tokens: the server may have
/// generated for it ([`ProviderError::generated_nothing`] is not sure it
/// did not).
pub(super) fn may_have_spent(error: &ExtractError) -> bool {
    !error.provider_error().is_none_or(ProviderError::generated_nothing)
}

/// The tokens an answer used: its `usage`, or the estimate when it sent none.
pub(super) fn answer_tokens(estimate: u64, answer: &Extracted<Value>) -> u64 {
    answer.usage.map_or(estimate, |u| u.total())
}

/// What one attempt holds at its deployment until it ends: its reservation
/// at the deployment's own limit, and its lease under the adaptive
/// concurrency limit.
#[derive(Debug, Default)]
pub(super) struct Slot {
    pub(super) reservation: Option<Reservation>,
    pub(super) lease: Option<u64>,
}

impl<P: LlmProvider, L: TokenStore, B: BreakerStore> HardenedProvider<P, L, B> {
    /// Takes the tenant's slot (and, under a token budget, reserves the
    /// call's estimate with it, by deployment `at`'s `max_tokens`), sleeping
    /// off up to `limiter_waits` refusals (each for exactly its
    /// `retry_after`, after which the slot is free unless another caller
    /// took it first).
    pub(super) async fn acquire(
        &self,
        deadline: Option<Timestamp>,
        request: &ExtractRequest<'_>,
        at: usize,
    ) -> Result<Option<Reservation>, ExtractError> {
        // A call may end at any deployment: reserve for the largest answer.
        let estimate = self.limiter.tokens_per_window().map(|_| {
            (0..self.deployments.len())
                .map(|i| self.estimate_at(request, i))
                .max()
                .unwrap_or(0)
        });
        let mut waits = 0u32;
        loop {
            let (refusal, wait): (ExtractError, Duration) = match estimate {
                None => match self.limiter.acquire_as(self.tenant, self.priority).await {
                    Ok(_) => return Ok(None),
                    Err(AcquireError::Limited(refusal)) => (refusal.clone().into(), refusal.retry_after),
                    Err(AcquireError::Cache(e)) => return Err(ExtractError::LimiterCache(e)),
                },
                Some(estimate) => match self
                    .limiter
                    .acquire_tokens_as(self.tenant, estimate, self.priority)
                    .await
                {
                    Ok(admission) => return Ok(admission.reservation),
                    Err(TokenAcquireError::Limited(refusal)) => (refusal.clone().into(), refusal.retry_after),
                    Err(TokenAcquireError::Tokens(refusal)) => {
                        match TokenAcquireError::Tokens(refusal.clone()).retry_after() {
                            Some(wait) => (refusal.into(), wait),
                            // An estimate over the whole limit never fits: no wait helps.
                            None => return Err(refusal.into()),
                        }
                    }
                    Err(TokenAcquireError::Cache(e)) => return Err(ExtractError::LimiterCache(e)),
                },
            };
            if waits >= self.limiter_waits {
                return Err(refusal);
            }
            if let Some(deadline) = deadline {
                let remaining = deadline.saturating_duration_since(self.clock.now());
                if wait > remaining {
                    self.report_deadline(at, DeadlineWait::RateLimit, wait, remaining);
                    return Err(ExtractError::Deadline(DeadlineExceeded {
                        waiting_for: DeadlineWait::RateLimit,
                        attempts: 0,
                        needed: wait,
                        remaining,
                        last: Box::new(refusal),
                    }));
                }
            }
            waits += 1;
            self.observer.on_event(&Event::RateLimitWait {
                model: self.model_of(at),
                tenant: self.tenant,
                wait,
                waits,
            });
            self.clock.sleep(wait).await;
        }
    }

    /// Settles the call's token reservation: to the server's `usage` after a
    /// success (the estimate when it sent none), released when the server
    /// certainly generated nothing
    /// ([`ProviderError::generated_nothing`]), and left at the estimate
    /// otherwise (a timeout or an unusable answer may have spent tokens).
    ///
    /// Each failed attempt the server may have generated for (`spent`, the
    /// final one included) is charged the estimate besides: one reservation
    /// covers a call whatever its retries, and a timed-out attempt followed
    /// by a 503 still spent tokens.
    pub(super) async fn settle_tokens(
        &self,
        reservation: &Reservation,
        result: &Result<Extracted<Value>, ExtractError>,
        spent: u32,
    ) {
        let failed = reservation.estimate.saturating_mul(u64::from(spent));
        let actual = match result {
            Ok(answer) => answer_tokens(reservation.estimate, answer),
            Err(_) => 0,
        }
        .saturating_add(failed);
        if let Err(error) = self.limiter.settle(self.tenant, reservation, actual).await {
            self.unsettled(self.limiter.key_prefix(), &error);
        }
    }

    /// Takes what one attempt at deployment `i` needs there: a lease under
    /// its adaptive concurrency limit, then its own limit's reservation
    /// (each nothing when not configured) — or the first refusal as the
    /// attempt's error with the wait until it would admit (none when no
    /// wait can help). A lease taken for an attempt the limit then refuses
    /// is ended at once.
    pub(super) async fn take_limit(
        &self,
        i: usize,
        request: &ExtractRequest<'_>,
    ) -> Result<Slot, (ExtractError, Option<Duration>)> {
        let lease = self.take_concurrency(i).await?;
        match self.take_rate_limit(i, request).await {
            Ok(reservation) => Ok(Slot { reservation, lease }),
            Err(refused) => {
                self.end_concurrency(i, lease, CallEnd::Neither).await;
                Err(refused)
            }
        }
    }

    /// Takes deployment `i`'s own limit for one attempt (nothing without
    /// one): its reservation, or the refusal as the attempt's error with the
    /// wait until it would admit (none when no wait can help).
    async fn take_rate_limit(
        &self,
        i: usize,
        request: &ExtractRequest<'_>,
    ) -> Result<Option<Reservation>, (ExtractError, Option<Duration>)> {
        let Some(limit) = &self.deployments[i].limit else {
            return Ok(None);
        };
        let estimate = if limit.counts_tokens() {
            self.estimate_at(request, i)
        } else {
            0
        };
        let refused = |by: RefusedBy, retry_after: Option<Duration>| {
            let error = DeploymentLimited {
                model: self.deployments[i].inner.model().to_owned(),
                limit: limit.name().to_owned(),
                by,
                retry_after,
            };
            (error.into(), retry_after)
        };
        match limit.take(estimate, self.priority).await {
            Ok(reservation) => Ok(reservation),
            Err(TokenAcquireError::Limited(refusal)) => Err(refused(RefusedBy::Requests, Some(refusal.retry_after))),
            Err(TokenAcquireError::Tokens(refusal)) => {
                let wait = (refusal.by != RefusedBy::TooLarge).then_some(refusal.retry_after);
                Err(refused(refusal.by, wait))
            }
            Err(TokenAcquireError::Cache(e)) => Err((ExtractError::LimiterCache(e), None)),
        }
    }

    /// Settles what an attempt at deployment `i` held: its reservation at
    /// the deployment's own limit to the `actual` tokens it used, and its
    /// lease under the adaptive limit, ended as `end`.
    pub(super) async fn settle_limit(&self, i: usize, slot: Slot, actual: u64, end: CallEnd) {
        self.end_concurrency(i, slot.lease, end).await;
        let (Some(limit), Some(reservation)) = (&self.deployments[i].limit, slot.reservation) else {
            return;
        };
        if let Err(error) = limit.settle(&reservation, actual).await {
            self.unsettled(limit.name(), &error);
        }
    }

    /// Reports a settlement the store at `component` could not record.
    pub(super) fn unsettled(&self, component: &str, error: &crate::error::CacheError) {
        self.observer.on_event(&Event::CacheUnavailable {
            component: Arc::from(component),
            operation: "settle_tokens",
            fallback: "not settled; the reservation counts until its lease ends",
            error: error.to_string(),
        });
    }
}
