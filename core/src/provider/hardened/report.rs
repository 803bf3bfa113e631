//! What a call tells: one report to each breaker that admitted it, the
//! deadline it ran out of, and its end to the observer and its span —
//! exactly once, a dropped call included.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::HardenedProvider;
use super::call::Call;
use crate::breaker::{CircuitBreaker, Permit};
use crate::cache::{BreakerStore, TokenStore};
use crate::clock::Clock;
use crate::observe::{Event, Observer};
use crate::provider::error::DeadlineWait;
use crate::provider::{ExtractError, Extracted, LlmProvider, ProviderError, Usage, spans};
use crate::tenant::TenantId;
use crate::time::Timestamp;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BreakerReport {
    Success,
    Failure,
    /// Nothing about the server: the permit is handed back unused.
    Release,
}

impl<P: LlmProvider, L: TokenStore, B: BreakerStore> HardenedProvider<P, L, B> {
    /// A permanent failure reports a failure only when it is a transient kind
    /// the classifier cut short (a `Retry-After` too long to honour), or a
    /// refusal when so configured; any other answer from the server shows the
    /// server is up and closes a half-open circuit. Failures that say nothing
    /// about the server (an inner wrapper's own refusal) report nothing.
    pub(super) fn permanent_report(&self, error: &ExtractError) -> BreakerReport {
        let ExtractError::Provider(e) = error else {
            return BreakerReport::Release;
        };
        let refusal_counts = matches!(e, ProviderError::Refused { .. }) && self.refusals_trip_breaker;
        if e.is_transient() || refusal_counts {
            BreakerReport::Failure
        } else if e.server_answered() {
            BreakerReport::Success
        } else {
            BreakerReport::Release
        }
    }

    /// Tells `breaker` how the call `permit` admitted went — exactly that
    /// permit, in one step, with no read of the state first.
    pub(super) async fn report_to_breaker(&self, breaker: &CircuitBreaker<B>, permit: &Permit, report: BreakerReport) {
        let (operation, result) = match report {
            BreakerReport::Success => ("record_success", breaker.record_success_for(permit).await),
            BreakerReport::Failure => ("record_failure", breaker.record_failure_for(permit).await),
            BreakerReport::Release => ("release", breaker.release(permit).await),
        };
        if let Err(error) = result {
            self.observer.on_event(&Event::CacheUnavailable {
                component: Arc::from(breaker.key_prefix()),
                operation,
                fallback: "not recorded",
                error: error.to_string(),
            });
        }
    }

    pub(super) fn report_deadline(&self, at: usize, waiting_for: DeadlineWait, needed: Duration, remaining: Duration) {
        self.observer.on_event(&Event::DeadlineExceeded {
            model: self.model_of(at),
            tenant: self.tenant,
            waiting_for: match waiting_for {
                DeadlineWait::RateLimit => "rate_limit",
                DeadlineWait::Retry => "retry",
            },
            needed,
            remaining,
        });
    }
}

impl<P: LlmProvider, L: TokenStore, B: BreakerStore> Call<'_, P, L, B> {
    /// Reports the call to every breaker that admitted it, once each: the
    /// one the call ended at hears `last`; one it left hears what its last
    /// attempt there said (a failure, or what a permanent answer tells the
    /// breaker). Then its lease ends.
    pub(super) async fn report_all(&mut self, last: BreakerReport) {
        let p = self.provider;
        let current = p.holders[self.route.current()];
        for (i, permit) in self.route.held.iter().enumerate() {
            let Some(permit) = permit else { continue };
            let report = match self.route.reports[i] {
                Some(heard) => heard,
                None if i == current => last,
                None => BreakerReport::Release,
            };
            #[cfg(feature = "mutants")]
            if crate::mutants::active(crate::mutants::Mutant::ProbeNeverReports)
                && matches!(permit, Permit::Probe(_))
                && report == BreakerReport::Failure
            {
                // The failed probe is lost: no report, no release.
                continue;
            }
            p.report_to_breaker(&p.deployments[i].breaker, permit, report).await;
        }
        p.end_lease(self.route.lease.take()).await;
    }
}

/// The outcome of a dropped call, in its `CallFinished` event and its span.
const CANCELLED: &str = "cancelled";

/// A started call's end, told exactly once — to the observer
/// ([`Event::CallFinished`], matching its `CallStarted`) and on the call's
/// span: by [`finish`](CallEnd::finish) with the call's result, or, when
/// the caller drops the call first (a timeout, a `select!`), by the drop,
/// with outcome `cancelled`. So a count of calls in flight never keeps a
/// call nobody is waiting for.
pub(super) struct CallEnd<'p> {
    observer: &'p dyn Observer,
    clock: &'p dyn Clock,
    /// The primary deployment's model: where a dropped call is counted.
    primary: &'p str,
    tenant: TenantId,
    /// When the call started; `None` when the observer listens to nothing.
    start: Option<Timestamp>,
    /// Attempts that reached an inner provider so far.
    pub(super) sent: u32,
    span: tracing::Span,
    done: bool,
}

impl<'p> CallEnd<'p> {
    /// A call of `provider`'s starting now, told on `span`: its observer
    /// hears it start.
    pub(super) fn start<P: LlmProvider, L, B>(provider: &'p HardenedProvider<P, L, B>, span: tracing::Span) -> Self {
        // Nobody listening: no event to build, no clock to read.
        let start = provider.observer.enabled().then(|| {
            provider.observer.on_event(&Event::CallStarted {
                model: Arc::from(provider.deployments[0].inner.model()),
                tenant: provider.tenant,
            });
            provider.clock.now()
        });
        CallEnd {
            observer: &*provider.observer,
            clock: &*provider.clock,
            primary: provider.deployments[0].inner.model(),
            tenant: provider.tenant,
            start,
            sent: 0,
            span,
            done: false,
        }
    }

    /// Ends the call with `result`, its last attempt sent to `model`.
    pub(super) fn finish(mut self, result: &Result<Extracted<Value>, ExtractError>, model: &str) {
        self.done = true;
        let attempts = self.sent;
        spans::record_result(&self.span, result);
        self.span.record("redstring.attempts", attempts);
        let usage = result.as_ref().ok().and_then(|a| a.usage);
        let outcome = match result {
            Ok(_) => "ok",
            Err(e) => e.kind(),
        };
        self.tell(model, outcome, attempts, usage);
    }

    fn tell(&self, model: &str, outcome: &'static str, attempts: u32, usage: Option<Usage>) {
        let Some(start) = self.start else { return };
        self.observer.on_event(&Event::CallFinished {
            model: Arc::from(model),
            tenant: self.tenant,
            outcome,
            attempts,
            duration: self.clock.now().saturating_duration_since(start),
            input_tokens: usage.map(|u| u.prompt_tokens),
            output_tokens: usage.map(|u| u.completion_tokens),
        });
    }
}

impl Drop for CallEnd<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let attempts = self.sent;
        spans::record_cancelled(&self.span, CANCELLED, attempts);
        self.tell(self.primary, CANCELLED, attempts, None);
    }
}
