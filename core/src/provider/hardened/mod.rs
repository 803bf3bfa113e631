//! `HardenedProvider`: any provider, wrapped in the breaker, the limiter and
//! retry, in the spec's order.
//!
//! ```text
//! breaker.allow_request()           should we call at all?
//!     limiter.acquire(tenant)       are we allowed to right now?
//!         retry(inner.extract)      did the wire drop?
//! breaker.record_success() / record_failure()
//! ```
//!
//! Each layer answers the question the next one down should not be asked: a
//! refused-without-calling request never spends a tenant's allowance, and no
//! retry ever pays for a call the breaker already decided not to make. Retry
//! is per attempt; the limiter and the breaker are per call — one slot and at
//! most one breaker report for one extraction, however many attempts it took.
//!
//! Two budgets join them when configured. Under a limiter's
//! [`tokens_per_window`](crate::RateLimiterBuilder::tokens_per_window) the
//! slot comes with a reservation of the call's estimated tokens, settled
//! after the call to the response's `usage` (plus the estimate for each
//! failed attempt that may have spent tokens; released when none did). With a
//! [`retry_budget`](HardenedProviderBuilder::retry_budget) every retry is
//! first asked of the fleet's budget, and a denied one ends the call.
//!
//! What the breaker hears, once per call:
//!
//! | outcome | report |
//! |---|---|
//! | success | `record_success` |
//! | transient failures that exhausted the schedule, or ran out of deadline | `record_failure` |
//! | a transient failure the classifier refused to retry (a 503's `Retry-After` over the cap) | `record_failure` |
//! | the server answered unusably: malformed, empty, truncated, 4xx, a spent quota, a redirect, llama.cpp's unusable-output 500, oversized body | `record_success` — the server is up |
//! | success slower than [`slow_call_threshold`](HardenedProviderBuilder::slow_call_threshold) (the caller still gets the answer) | `record_failure`, and [`Event::SlowCall`](crate::observe::Event::SlowCall) |
//! | a refusal | `record_success`, or `record_failure` with [`refusals_trip_breaker`](HardenedProviderBuilder::refusals_trip_breaker) |
//! | no call made after admission (limiter refusal, every deployment's own limit refusing, an inner wrapper's refusal) | `release` — a half-open probe's lease ends at once, so the next caller probes |
//!
//! A [`hedge`](HardenedProviderBuilder::hedge)d call may hold attempts at
//! two deployments at once: each breaker hears what its attempt said, and
//! an attempt cancelled because another answered first hears `release`.
//!
//! Every report names the [`Permit`](crate::breaker::Permit) the call was admitted with, so a probe
//! reports exactly its own lease and a late report changes nothing. The call
//! is cancellation-safe: a future dropped mid-call (a caller's timeout, a
//! `select!`, an aborted task) reports nothing to the breaker (its observer
//! hears the call end with outcome `cancelled`), and a probe it held stops
//! counting when its lease ends
//! ([`probe_lease`](crate::CircuitBreakerBuilder::probe_lease)) — the circuit
//! probes again instead of staying half-open for good.
//!
//! # Quota signals, shared
//!
//! An attempt whose answer carries a quota signal — a 429 or 503 asking for
//! a wait ([`ExtractError::quota_wait`]), or any response with an exhausted
//! `x-ratelimit-*` limit ([`Extracted::quota`]) — is followed by one
//! [`CircuitBreaker::cool_down`](crate::CircuitBreaker::cool_down) of that wait, bounded by
//! [`max_server_delay`](HardenedProviderBuilder::max_server_delay): every
//! worker sharing the breaker's store is refused at admission until it ends,
//! with no polling. The call itself then goes on as before (its own retry
//! waits at least the server's delay). A **spent quota** — a 429
//! `insufficient_quota`, or a 429 or an answer whose limit resets further
//! away than `max_server_delay` (a daily or monthly cap) — cools the
//! deployment until its reset instead (at most
//! [`max_quota_cooldown`](HardenedProviderBuilder::max_quota_cooldown);
//! [`quota_cooldown`](HardenedProviderBuilder::quota_cooldown) when no
//! reset past the cap is given), reported as
//! [`Event::QuotaExhausted`](crate::observe::Event::QuotaExhausted); the
//! attempt ends as [`ProviderError::QuotaExhausted`], never retried there.
//! A call refused at admission by a cooldown sleeps it off when the wait
//! fits its deadline, `max_server_delay` and its
//! [`cooldown_waits`](HardenedProviderBuilder::cooldown_waits) allowance,
//! and otherwise returns [`CircuitOpen`](crate::CircuitOpen) with reason
//! [`Refusal::Cooldown`](crate::breaker::Refusal::Cooldown) (kind `cooldown`) and the wait.
//!
//! # Several deployments
//!
//! Built [`over`](HardenedProvider::over) several [`Deployment`]s (or with
//! [`fallback`](HardenedProviderBuilder::fallback)), the provider routes each
//! call: it orders the deployments by its policy (the order given,
//! [`weighted`](HardenedProviderBuilder::weighted), or
//! [`least_loaded`](HardenedProviderBuilder::least_loaded) fleet-wide),
//! admits the call at the first whose breaker admits it — a refusal is data
//! from that one admission, remembered until its wait passes so later calls
//! ask that deployment last, each reporting it
//! ([`Event::DeploymentDeferred`](crate::observe::Event::DeploymentDeferred), naming it and why) — and sends each retry after a transient
//! failure to the next deployment that admits it, cycling back when every
//! other refuses. A fallover is a retry: the schedule's backoff, the
//! deadline and the retry budget bound it (as Envoy's retry policy picks
//! another host for a retry, with its backoff). A wait one deployment's
//! server asked for (`Retry-After`) does not hold back a retry that goes to
//! another, but a retry that comes back there (every other refused) sleeps
//! it off first when it fits the deadline and `max_server_delay`, as a
//! retry at one deployment would; otherwise the call ends as it would at
//! one deployment (a cooldown refusal for a wait over the cap, a deadline
//! error for one past the deadline). A failure about the request (malformed, a 400)
//! does not fall over, while one about the deployment (its quota exhausted,
//! its key refused, the model unknown there, an inner wrapper's refusal)
//! does — and, since its server answered and its circuit will not open,
//! later calls of this provider ask that deployment last for one
//! `recovery_timeout` of its breaker.
//!
//! Per call, each admission a breaker gave it is answered by exactly one
//! report (what the call's last attempt there said, or a release when none
//! was sent), and the limiter charges one slot;
//! under a token budget the reservation covers the largest `max_tokens`
//! among the deployments. A deployment's own
//! [`limit`](Deployment::limit) is per attempt: each attempt there takes a
//! slot (and reserves its estimate, settled after the attempt); a
//! deployment whose limit refuses is skipped like one whose circuit
//! refuses, and when every limit refuses the soonest wait is slept off
//! within [`limiter_waits`](HardenedProviderBuilder::limiter_waits) and the
//! deadline, then the call ends with [`ExtractError::DeploymentLimited`]. When every deployment
//! refuses and the soonest to admit again is a shared cooldown, it is slept
//! off as with one deployment; a cooldown on one deployment of several is
//! skipped, not waited for — unless a retry comes back to that deployment
//! because every other refuses, when it waits out what the server asked
//! (above).
//!
//! Under a [`slow_start`](HardenedProviderBuilder::slow_start), a
//! deployment whose circuit closed less than the ramp's window ago takes
//! a call it admits only when a draw falls within the ramp's share
//! ([`crate::decide::ramp`]); otherwise the call goes to the next
//! deployment that admits it (the event names the ramping one, as
//! [`Event::SlowStartDraw`](crate::observe::Event::SlowStartDraw)), and
//! comes back when none does.
//!
//! Under [`adaptive_concurrency`](HardenedProviderBuilder::adaptive_concurrency),
//! each attempt first takes a lease under its deployment's limit on calls
//! in flight, shared by the fleet through the breaker store and adapted to
//! what the server answers ([`crate::decide::concurrency`]: AIMD); a
//! deployment at its limit is skipped like one whose own limit refuses,
//! and when every deployment is at its limit the attempt ends unsent with
//! [`ExtractError::ConcurrencyLimited`]. No wait is known (room comes back
//! as calls end), so the default classifier retries it after the
//! schedule's backoff, as a transient failure; a call whose retries run
//! out that way ends in [`ExtractError::RetryExhausted`] with it as the
//! last error. Its breaker hears a release, nothing more.
//!
//! Provenance stays the answer's: [`Extracted::model`] names the model of
//! the deployment that produced it. [`LlmProvider::model`] is the primary's
//! configured identity; a pipeline recording provenance from a router reads
//! the answer's.
//!
//! Every wait (limiter, backoff, the server's `Retry-After`) is slept on the
//! injected clock and checked against the call's deadline first, so a test on
//! a [`ManualClock`](crate::ManualClock) never sleeps and a production call
//! never oversleeps its budget.

mod builder;
mod call;
mod concurrency;
mod hedge;
mod report;
mod routing;
#[cfg(test)]
mod tests;
mod tokens;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tracing::Instrument;

pub use builder::HardenedProviderBuilder;
use call::Call;
pub use concurrency::CONCURRENCY_PREFIX;
pub use hedge::{HedgeAfter, MAX_HEDGE_DELAY, MAX_HEDGE_WINDOW, MAX_HEDGES, MIN_HEDGE_WINDOW};

use super::error::{ExtractError, ProviderError};
use super::route::{Deployment, Policy};
use super::spans;
use super::transport::BoxFuture;
use super::{ExtractRequest, Extracted, LlmProvider};
use crate::cache::{BreakerStore, MemoryCache, TokenStore};
use crate::clock::Clock;
use crate::decide::ramp::SlowStart;
use crate::limiter::RateLimiter;
use crate::observe::Observer;
use crate::random::RandomSource;
use crate::retry::{Retry, Retryable};
use crate::tenant::{Priority, TenantId};
use crate::time::Timestamp;

/// How many times a rate-limit refusal is slept off before it is returned.
pub const DEFAULT_LIMITER_WAITS: u32 = 1;
/// How many times a shared cooldown's refusal is slept off before it is returned.
pub const DEFAULT_COOLDOWN_WAITS: u32 = 1;
/// The longest server-requested wait (`Retry-After`) the default classifier
/// honours; a longer one ends the call at once (the OpenAI SDKs' rule).
pub const DEFAULT_MAX_SERVER_DELAY: Duration = Duration::from_secs(120);

/// How long a deployment cools down after a spent quota with no reset
/// given (`insufficient_quota`).
pub const DEFAULT_QUOTA_COOLDOWN: Duration = Duration::from_secs(60 * 60);
/// The longest cooldown a hard quota signal writes, however far away the
/// reset it gives.
pub const DEFAULT_MAX_QUOTA_COOLDOWN: Duration = Duration::from_secs(24 * 60 * 60);

/// The retry name in messages: `Exhausted 3 retries for extract`.
const OPERATION: &str = "extract";

type Classifier = Arc<dyn Fn(&ExtractError) -> Retryable + Send + Sync>;

/// How many tokens a call may use, for a token budget's reservation.
type TokenEstimate = Arc<dyn Fn(&ExtractRequest<'_>) -> u64 + Send + Sync>;

/// The output a token budget reserves for a provider that sets no
/// `max_tokens` (the server's own default then bounds the answer).
pub const DEFAULT_OUTPUT_ESTIMATE: u64 = 1024;

/// The default estimate of a call's tokens: its prompt — the text, the
/// system prompt and the schema, at one token per three bytes, rounded up,
/// plus 32 for the chat template — and its output, `max_tokens` (or
/// [`DEFAULT_OUTPUT_ESTIMATE`]). Tokenizers spend about four bytes of
/// English per token, so the prompt is estimated from above.
pub fn default_token_estimate(request: &ExtractRequest<'_>, max_tokens: Option<u32>) -> u64 {
    let schema = request.schema.schema().to_string().len();
    let bytes = request.text.len() + request.system_prompt.map_or(0, str::len) + schema;
    let prompt = u64::try_from(bytes.div_ceil(3)).unwrap_or(u64::MAX).saturating_add(32);
    prompt.saturating_add(max_tokens.map_or(DEFAULT_OUTPUT_ESTIMATE, u64::from))
}

/// An [`LlmProvider`] that survives a flaky model server, for one tenant.
///
/// Build one per tenant around a shared limiter and breaker: the limiter keys
/// by tenant, the breaker by model server, so sharing them is what makes one
/// tenant's traffic count against its own allowance and one outage trip every
/// tenant's circuit. Give the limiter, the breaker and this provider the same
/// clock.
///
/// # Traces
///
/// Each call is a `tracing` span at level `INFO`, and each attempt sent to
/// a model server a span inside it, so the backoff between attempts is the
/// gap between them. Their fields are named as OpenTelemetry's semantic
/// conventions for GenAI client spans name them
/// (<https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/>) —
/// the call span is that inference span, covering the logical operation
/// with its retries — and the rest under `redstring.`; the `otel.*` fields
/// are the ones `tracing-opentelemetry` reads as the span's name, kind and
/// status, so its layer exports the spans unchanged. Models are split as
/// the metrics split them (`openai-compatible/qwen3`: provider
/// `openai-compatible`, model `qwen3`), and `error.type` and
/// `redstring.outcome` are the metrics' `outcome` (an error's
/// [`kind`](ExtractError::kind)).
///
/// | span | field | value |
/// |---|---|---|
/// | `chat` (the call) | `otel.name` | `chat {gen_ai.request.model}` |
/// | | `otel.kind` | `client` |
/// | | `gen_ai.operation.name` | `chat` |
/// | | `gen_ai.provider.name`, `gen_ai.request.model` | the primary deployment's |
/// | | `gen_ai.response.model` | the model that answered (a success) |
/// | | `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens` | the answer's `usage`, when the server sent one |
/// | | `error.type`, `otel.status_code` = `error` | a failed call's kind |
/// | | `redstring.outcome` | `ok`, the error's kind, or `cancelled` (the caller dropped the call; `error.type` too) |
/// | | `redstring.attempts` | attempts sent to a model server (0: refused unsent) |
/// | | `redstring.tenant` | the tenant (a span attribute, never a metric label) |
/// | `redstring.attempt` (each attempt) | `gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model` | the deployment it was sent to |
/// | | `redstring.attempt` | its number, from 1 |
/// | | `gen_ai.response.model`, `gen_ai.usage.*`, `error.type`, `otel.status_code`, `redstring.outcome` | as on the call, for this attempt |
pub struct HardenedProvider<P, L = MemoryCache, B = MemoryCache> {
    /// Where calls may go, never empty; the first is the primary.
    deployments: Vec<Deployment<P, B>>,
    policy: Policy,
    /// The least-loaded policy's key per deployment (empty otherwise).
    in_flight_keys: Vec<String>,
    /// For each deployment, the first deployment with the same breaker: a
    /// call holds one admission per breaker, however many deployments
    /// share it.
    holders: Vec<usize>,
    /// Whether any deployment has its own limit or an adaptive
    /// concurrency limit: each attempt then takes its room there.
    limited: bool,
    tenant: TenantId,
    limiter: Arc<RateLimiter<L>>,
    retry: Retry,
    /// Routing draws (weighted picks, in-flight lease ids).
    rng: Arc<dyn RandomSource>,
    clock: Arc<dyn Clock>,
    observer: Arc<dyn Observer>,
    classifier: Option<Classifier>,
    limiter_waits: u32,
    cooldown_waits: u32,
    deadline: Option<Duration>,
    refusals_trip_breaker: bool,
    max_server_delay: Duration,
    quota_cooldown: Duration,
    max_quota_cooldown: Duration,
    /// A success slower than this reports a failure to its breaker.
    slow_call_threshold: Option<Duration>,
    /// Hedged attempts, when configured.
    hedging: Option<hedge::Hedging>,
    /// Ramps a deployment up after its circuit closes.
    slow_start: Option<SlowStart>,
    /// Limits each deployment's calls in flight, adapting to its server.
    adaptive: Option<concurrency::Adaptive>,
    token_estimate: Option<TokenEstimate>,
    /// The class every limiter this provider asks sees its calls as.
    priority: Priority,
}

impl<P: fmt::Debug, L, B> fmt::Debug for HardenedProvider<P, L, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HardenedProvider")
            .field("deployments", &self.deployments)
            .field("policy", &self.policy)
            .field("tenant", &self.tenant)
            .field("limiter", &self.limiter)
            .field("retry", &self.retry)
            .field("limiter_waits", &self.limiter_waits)
            .field("cooldown_waits", &self.cooldown_waits)
            .field("deadline", &self.deadline)
            .field("refusals_trip_breaker", &self.refusals_trip_breaker)
            .field("max_server_delay", &self.max_server_delay)
            .field("quota_cooldown", &self.quota_cooldown)
            .field("max_quota_cooldown", &self.max_quota_cooldown)
            .field("slow_call_threshold", &self.slow_call_threshold)
            .field("hedging", &self.hedging.as_ref().map(|h| (h.after, h.max)))
            .field("slow_start", &self.slow_start)
            .field("adaptive_concurrency", &self.adaptive.as_ref().map(|a| a.settings))
            .finish_non_exhaustive()
    }
}

impl<P: LlmProvider, L: TokenStore, B: BreakerStore> HardenedProvider<P, L, B> {
    /// The wrapped provider (the primary's, with several deployments).
    pub fn inner(&self) -> &P {
        &self.deployments[0].inner
    }

    /// Every deployment, the primary first.
    pub fn deployments(&self) -> &[Deployment<P, B>] {
        &self.deployments
    }

    /// The tenant every call is charged to.
    pub fn tenant(&self) -> TenantId {
        self.tenant
    }

    /// The retry loop's verdict on one failure.
    pub(super) fn classify(&self, error: &ExtractError) -> Retryable {
        if let Some(custom) = &self.classifier {
            return custom(error);
        }
        if let ExtractError::ConcurrencyLimited(_) = error {
            // Room comes back as calls end: try again after a backoff.
            return Retryable::Yes;
        }
        match error.retryable() {
            Retryable::After(d) if d > self.max_server_delay => Retryable::No,
            verdict => verdict,
        }
    }

    /// The wait a failure's server asked for (`Retry-After`), as the retry
    /// loop would honour it at one deployment: the classifier's, or under
    /// the default classifier also one over `max_server_delay`; for a spent
    /// quota, until its reset (`quota_cooldown` when none was given).
    pub(super) fn server_wait(&self, error: &ExtractError) -> Option<Duration> {
        if let ExtractError::Provider(ProviderError::QuotaExhausted { retry_after, .. }) = error {
            // A spent quota: nothing is sent there until it resets.
            let (reset, _) = self.spent_cooldown(*retry_after);
            return (!reset.is_zero()).then_some(reset);
        }
        match self.classify(error) {
            Retryable::After(wait) => Some(wait),
            _ if self.classifier.is_none() => match error.retryable() {
                Retryable::After(wait) => Some(wait),
                _ => None,
            },
            _ => None,
        }
    }

    /// How long a spent quota keeps its deployment cooling down, and
    /// whether that is the server's reset: the reset it gave when that is
    /// further away than `max_server_delay` (at most `max_quota_cooldown`),
    /// else `quota_cooldown` — a shorter reset on a spent account is a
    /// per-minute bucket's or a proxy's, not the account's.
    pub(super) fn spent_cooldown(&self, reset: Option<Duration>) -> (Duration, bool) {
        match reset.filter(|r| *r > self.max_server_delay) {
            Some(reset) => (reset.min(self.max_quota_cooldown), true),
            None => (self.quota_cooldown, false),
        }
    }

    /// Whether a failure is about the deployment rather than the request
    /// (under the default classifier): its account's quota exhausted, its
    /// key refused, the model unknown there, an inner wrapper's refusal.
    pub(super) fn about_deployment(&self, error: &ExtractError) -> bool {
        self.classifier.is_none()
            && (matches!(error, ExtractError::CircuitOpen(_))
                || matches!(
                    error.provider_error(),
                    Some(
                        ProviderError::QuotaExhausted { .. }
                            | ProviderError::Authentication { .. }
                            | ProviderError::UnknownModel { .. }
                    )
                ))
    }

    /// How long a least-loaded lease lasts: the configured `lease`, or
    /// until the call's deadline when that is later — a call cannot run
    /// past its deadline, so it counts for as long as it can be in flight.
    pub(super) fn lease_for(&self, lease: Duration, deadline: Option<Timestamp>) -> Duration {
        match deadline {
            Some(d) => lease.max(d.saturating_duration_since(self.clock.now())),
            None => lease,
        }
    }

    /// How many tokens an attempt at deployment `i` may use: the
    /// configured estimate, or the default by its `max_tokens`.
    pub(super) fn estimate_at(&self, request: &ExtractRequest<'_>, i: usize) -> u64 {
        match &self.token_estimate {
            Some(estimate) => estimate(request),
            None => default_token_estimate(request, self.deployments[i].inner.max_tokens()),
        }
    }

    /// The model of deployment `i`, for events.
    pub(super) fn model_of(&self, i: usize) -> Arc<str> {
        Arc::from(self.deployments[i].inner.model())
    }
}

impl<P: LlmProvider, L: TokenStore, B: BreakerStore> LlmProvider for HardenedProvider<P, L, B> {
    /// The primary deployment's identity, read through on every call. With
    /// several deployments an answer may come from another: its
    /// [`Extracted::model`] (from [`extract_answer`](LlmProvider::extract_answer)
    /// or [`extract_with_model`](super::LlmProviderExt::extract_with_model))
    /// always names the model that produced it — record that, not this.
    fn model(&self) -> &str {
        self.deployments[0].inner.model()
    }

    /// The primary deployment's `max_tokens`.
    fn max_tokens(&self) -> Option<u32> {
        self.deployments[0].inner.max_tokens()
    }

    /// The answering deployment's answer, provenance included; `timeout`
    /// bounds the whole call like a deadline.
    fn extract_answer<'a>(
        &'a self,
        request: ExtractRequest<'a>,
        timeout: Option<Duration>,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>> {
        let span = spans::call_span(self.model(), self.tenant);
        let recorded = span.clone();
        Box::pin(async move { Call::new(self, request, recorded).run(timeout).await }.instrument(span))
    }
}
