//! A deployment's adaptive concurrency limit, per attempt: the lease an
//! attempt takes before it is sent (or the refusal that skips the
//! deployment), and how the attempt's end moves the limit.
//!
//! The decision is [`crate::decide::concurrency::step`], run by the store
//! in one atomic step ([`InFlightStore::concurrency_step`](crate::cache::InFlightStore::concurrency_step)),
//! so a fleet sharing the store shares each deployment's limit and its
//! count of calls in flight. This file only asks, and reports.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::HardenedProvider;
use crate::cache::{BreakerStore, TokenStore};
use crate::decide::concurrency::{AdaptiveConcurrency, CallEnd, ConcurrencyCommand, whole};
use crate::decide::pick::PickRequest;
use crate::observe::Event;
use crate::provider::error::{ConcurrencyLimited, ExtractError, ProviderError, TransportErrorKind};
use crate::provider::route::InFlight;
use crate::provider::{Extracted, LlmProvider};

/// The prefix of the keys a deployment's adaptive limit lives at, one per
/// breaker (`{redstring:concurrency}:kg:circuit:a`); its leases live in
/// the store's in-flight set of that key.
pub const CONCURRENCY_PREFIX: &str = "{redstring:concurrency}";

/// Adaptive concurrency as a provider holds it: the settings, the store
/// they are kept in, and each deployment's key.
pub(super) struct Adaptive {
    pub(super) settings: AdaptiveConcurrency,
    pub(super) store: Arc<dyn InFlight>,
    /// Per deployment: `{CONCURRENCY_PREFIX}:{breaker prefix}`.
    pub(super) keys: Vec<String>,
}

/// How an attempt's end counts for its deployment's limit: a 429, a 503 or
/// a timeout is the server saying it is overloaded; an answer is a success;
/// anything else says nothing about its capacity.
pub(super) fn call_end(result: &Result<Extracted<Value>, ExtractError>) -> CallEnd {
    match result {
        Ok(_) => CallEnd::Success,
        Err(ExtractError::Provider(
            ProviderError::RateLimited { .. }
            | ProviderError::Unavailable { .. }
            | ProviderError::Transport {
                kind: TransportErrorKind::Timeout,
                ..
            },
        )) => CallEnd::Overload,
        Err(_) => CallEnd::Neither,
    }
}

impl<P: LlmProvider, L: TokenStore, B: BreakerStore> HardenedProvider<P, L, B> {
    /// Takes a lease under deployment `i`'s adaptive limit for one attempt
    /// (nothing without one): the lease's id, or the refusal as the
    /// attempt's error — with no wait, since when a call ends is unknown
    /// (the retry loop's backoff is the wait). A store that cannot be
    /// reached admits (the limit protects the server; an unreachable store
    /// must not stop every call), and says so.
    pub(super) async fn take_concurrency(&self, i: usize) -> Result<Option<u64>, (ExtractError, Option<Duration>)> {
        let Some(adaptive) = &self.adaptive else {
            return Ok(None);
        };
        let id = self.rng.next_u64();
        let request = PickRequest {
            now: self.clock.now(),
            id,
            lease: adaptive.settings.call_lease(),
            max_ahead: crate::limiter::DEFAULT_MAX_CLOCK_AHEAD,
        };
        let key = adaptive.keys[i].as_str();
        let params = adaptive.settings.params(self.priority);
        let step = match adaptive
            .store
            .concurrency(key, ConcurrencyCommand::Admit, params, request)
            .await
        {
            Ok(step) => step,
            Err(error) => {
                self.observer.on_event(&Event::CacheUnavailable {
                    component: Arc::from(CONCURRENCY_PREFIX),
                    operation: "concurrency_step",
                    fallback: "admitted without a concurrency limit",
                    error: error.to_string(),
                });
                return Ok(None);
            }
        };
        let breaker = || Arc::from(self.deployments[i].breaker.key_prefix());
        if step.admitted || crate::mutants::active(crate::mutants::Mutant::ConcurrencyLimitIgnored) {
            if self.observer.enabled() {
                self.observer.on_event(&Event::ConcurrencyAdmitted {
                    breaker: breaker(),
                    tenant: self.tenant,
                    priority: self.priority,
                    id,
                    in_flight: step.in_flight,
                    limit: whole(step.limit),
                });
            }
            // A refusal the mutant ignored leased nothing: nothing to end.
            return Ok(step.admitted.then_some(id));
        }
        let limit = whole(step.limit);
        self.observer.on_event(&Event::ConcurrencyRefused {
            breaker: breaker(),
            tenant: self.tenant,
            priority: self.priority,
            in_flight: step.in_flight,
            limit,
        });
        let error = ConcurrencyLimited {
            model: self.deployments[i].inner.model().to_owned(),
            priority: self.priority,
            in_flight: step.in_flight,
            limit,
            reserved: crate::tenant::reserved_ppm(limit, params.reserve),
        };
        Err((error.into(), None))
    }

    /// Ends lease `id` under deployment `i`'s adaptive limit, its attempt
    /// having ended as `end`.
    pub(super) async fn end_concurrency(&self, i: usize, id: Option<u64>, end: CallEnd) {
        let (Some(adaptive), Some(id)) = (&self.adaptive, id) else {
            return;
        };
        let request = PickRequest {
            now: self.clock.now(),
            id,
            lease: adaptive.settings.call_lease(),
            max_ahead: crate::limiter::DEFAULT_MAX_CLOCK_AHEAD,
        };
        let key = adaptive.keys[i].as_str();
        match adaptive
            .store
            .concurrency(
                key,
                ConcurrencyCommand::Complete(end),
                adaptive.settings.params(self.priority),
                request,
            )
            .await
        {
            Ok(step) => {
                if self.observer.enabled() {
                    self.observer.on_event(&Event::ConcurrencyEnded {
                        breaker: Arc::from(self.deployments[i].breaker.key_prefix()),
                        tenant: self.tenant,
                        id,
                        end,
                        counted: step.admitted,
                        from: step.limit,
                        to: step.next,
                    });
                }
            }
            Err(error) => self.observer.on_event(&Event::CacheUnavailable {
                component: Arc::from(CONCURRENCY_PREFIX),
                operation: "concurrency_step",
                fallback: "not ended; the lease counts until it runs out",
                error: error.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overload_is_a_429_a_503_or_a_timeout_and_nothing_else() {
        let err = |e: ProviderError| -> Result<Extracted<Value>, ExtractError> { Err(ExtractError::Provider(e)) };
        let overload = [
            ProviderError::RateLimited {
                retry_after: None,
                message: String::new(),
            },
            ProviderError::Unavailable {
                retry_after: None,
                message: String::new(),
            },
            ProviderError::Transport {
                kind: TransportErrorKind::Timeout,
                detail: String::new(),
            },
        ];
        for e in overload {
            assert_eq!(call_end(&err(e)), CallEnd::Overload);
        }
        let neither = [
            ProviderError::Server {
                status: 500,
                message: String::new(),
            },
            ProviderError::Transport {
                kind: TransportErrorKind::Reset,
                detail: String::new(),
            },
            ProviderError::QuotaExhausted {
                retry_after: None,
                message: String::new(),
            },
        ];
        for e in neither {
            assert_eq!(call_end(&err(e)), CallEnd::Neither);
        }
    }
}
