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
//! | a transient failure the classifier refused to retry (a `Retry-After` over the cap) | `record_failure` |
//! | the server answered unusably: malformed, empty, truncated, 4xx, a redirect, llama.cpp's unusable-output 500, oversized body | `record_success` — the server is up |
//! | a refusal | `record_success`, or `record_failure` with [`refusals_trip_breaker`](HardenedProviderBuilder::refusals_trip_breaker) |
//! | no call made after admission (limiter refusal, every deployment's own limit refusing, an inner wrapper's refusal) | `release` — a half-open probe's lease ends at once, so the next caller probes |
//!
//! Every report names the [`Permit`] the call was admitted with, so a probe
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
//! [`CircuitBreaker::cool_down`] of that wait, bounded by
//! [`max_server_delay`](HardenedProviderBuilder::max_server_delay): every
//! worker sharing the breaker's store is refused at admission until it ends,
//! with no polling. The call itself then goes on as before (its own retry
//! waits at least the server's delay). A call refused by a cooldown sleeps
//! it off when the wait fits its deadline and its
//! [`cooldown_waits`](HardenedProviderBuilder::cooldown_waits) allowance,
//! and otherwise returns [`CircuitOpen`] with reason
//! [`Refusal::Cooldown`] (kind `cooldown`) and the wait.
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
//! ([`Event::DeploymentDeferred`], naming it and why) — and sends each retry after a transient
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
//! Provenance stays the answer's: [`Extracted::model`] names the model of
//! the deployment that produced it. [`LlmProvider::model`] is the primary's
//! configured identity; a pipeline recording provenance from a router reads
//! the answer's.
//!
//! Every wait (limiter, backoff, the server's `Retry-After`) is slept on the
//! injected clock and checked against the call's deadline first, so a test on
//! a [`ManualClock`](crate::ManualClock) never sleeps and a production call
//! never oversleeps its budget.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::Value;
use tracing::Instrument;

use super::error::{DeadlineExceeded, DeadlineWait, DeploymentLimited, ExtractError, ProviderError};
use super::route::{Deferral, Deployment, IN_FLIGHT_PREFIX, InFlight, PickRequest, Policy, call_order, live_weights};
use super::spans;
use super::transport::BoxFuture;
use super::{ExtractRequest, Extracted, LlmProvider};
use crate::breaker::{CircuitBreaker, CircuitOpen, Permit, Refusal};
use crate::cache::{BreakerStore, BudgetStore, InFlightStore, MemoryCache, TokenStore};
use crate::clock::{Clock, SystemClock};
use crate::decide::pick::weighted_pick;
use crate::decide::tokens::RefusedBy;
use crate::limiter::{AcquireError, RateLimiter, Reservation, TokenAcquireError};
use crate::observe::{Event, Observer, TracingObserver};
use crate::random::{RandomSource, SeededRandom};
use crate::retry::{Retry, RetryBudget, RetryDenied, RetryError, RetryExhausted, RetryPolicy, Retryable};
use crate::tenant::TenantId;
use crate::time::Timestamp;

/// How many times a rate-limit refusal is slept off before it is returned.
pub const DEFAULT_LIMITER_WAITS: u32 = 1;
/// How many times a shared cooldown's refusal is slept off before it is returned.
pub const DEFAULT_COOLDOWN_WAITS: u32 = 1;
/// The longest server-requested wait (`Retry-After`) the default classifier
/// honours; a longer one ends the call at once (the OpenAI SDKs' rule).
pub const DEFAULT_MAX_SERVER_DELAY: Duration = Duration::from_secs(120);

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

/// Whether a failed attempt may have spent tokens: the server may have
/// generated for it ([`ProviderError::generated_nothing`] is not sure it
/// did not).
fn may_have_spent(error: &ExtractError) -> bool {
    !error.provider_error().is_none_or(ProviderError::generated_nothing)
}

/// The tokens an answer used: its `usage`, or the estimate when it sent none.
fn answer_tokens(estimate: u64, answer: &Extracted<Value>) -> u64 {
    answer.usage.map_or(estimate, |u| u.total())
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
    /// Whether any deployment has its own limit.
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
    token_estimate: Option<TokenEstimate>,
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
            .finish_non_exhaustive()
    }
}

/// Configures a [`HardenedProvider`]; unset options take the defaults.
pub struct HardenedProviderBuilder<P, L, B> {
    deployments: Vec<Deployment<P, B>>,
    routing: Policy,
    tenant: TenantId,
    limiter: Arc<RateLimiter<L>>,
    policy: RetryPolicy,
    clock: Option<Arc<dyn Clock>>,
    rng: Option<Arc<dyn RandomSource>>,
    observer: Option<Arc<dyn Observer>>,
    classifier: Option<Classifier>,
    limiter_waits: u32,
    cooldown_waits: u32,
    deadline: Option<Duration>,
    refusals_trip_breaker: bool,
    max_server_delay: Duration,
    /// Applies the retry budget to the loop, when one was given.
    budget: Option<Box<dyn FnOnce(Retry) -> Retry + Send>>,
    token_estimate: Option<TokenEstimate>,
}

impl<P: LlmProvider, L: TokenStore, B: BreakerStore> HardenedProvider<P, L, B> {
    /// Starts configuring a hardened `inner` for `tenant`, over a shared
    /// `limiter` and `breaker`.
    pub fn builder(
        inner: P,
        tenant: TenantId,
        limiter: Arc<RateLimiter<L>>,
        breaker: Arc<CircuitBreaker<B>>,
    ) -> HardenedProviderBuilder<P, L, B> {
        Self::over(Deployment::new(inner, breaker), tenant, limiter)
    }

    /// Starts configuring a provider for `tenant` over deployments, `first`
    /// the primary; add the others with
    /// [`fallback`](HardenedProviderBuilder::fallback) or
    /// [`deployment`](HardenedProviderBuilder::deployment).
    pub fn over(
        first: Deployment<P, B>,
        tenant: TenantId,
        limiter: Arc<RateLimiter<L>>,
    ) -> HardenedProviderBuilder<P, L, B> {
        HardenedProviderBuilder {
            deployments: vec![first],
            routing: Policy::Ordered,
            tenant,
            limiter,
            policy: RetryPolicy::default(),
            clock: None,
            rng: None,
            observer: None,
            classifier: None,
            limiter_waits: DEFAULT_LIMITER_WAITS,
            cooldown_waits: DEFAULT_COOLDOWN_WAITS,
            deadline: None,
            refusals_trip_breaker: false,
            max_server_delay: DEFAULT_MAX_SERVER_DELAY,
            budget: None,
            token_estimate: None,
        }
    }
}

impl<P: LlmProvider, L: TokenStore, B: BreakerStore> HardenedProviderBuilder<P, L, B> {
    /// Adds a deployment a call may go to, after those already given.
    pub fn deployment(mut self, deployment: Deployment<P, B>) -> Self {
        self.deployments.push(deployment);
        self
    }

    /// Adds `inner` behind its own `breaker` at weight 1: where a call goes
    /// when the deployments before it refuse, and where a retry goes after
    /// a transient failure.
    pub fn fallback(self, inner: P, breaker: Arc<CircuitBreaker<B>>) -> Self {
        self.deployment(Deployment::new(inner, breaker))
    }

    /// Routes each call first to a deployment drawn by weight (from the
    /// [`rng`](Self::rng)), the others following in order (default: the
    /// order given).
    pub fn weighted(mut self) -> Self {
        self.routing = Policy::Weighted;
        self
    }

    /// The retry schedule (default [`RetryPolicy::default`]: 3 retries, 1 s, ×2, ±10 %).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The clock every wait is slept on and the deadline measured by (default
    /// [`SystemClock`]). Use the limiter's and the breaker's.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Where backoff jitter is drawn from (default: OS-seeded).
    pub fn rng(mut self, rng: Arc<dyn RandomSource>) -> Self {
        self.rng = Some(rng);
        self
    }

    /// Where events go (default [`TracingObserver`]).
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Replaces the default retry verdict ([`ExtractError::retryable`], with
    /// server delays over [`max_server_delay`](Self::max_server_delay)
    /// refused). Return [`Retryable::After`] to set a floor under the backoff.
    pub fn classifier(mut self, classifier: impl Fn(&ExtractError) -> Retryable + Send + Sync + 'static) -> Self {
        self.classifier = Some(Arc::new(classifier));
        self
    }

    /// How many rate-limit refusals are slept off (each for exactly its
    /// `retry_after`) before the refusal is returned (default
    /// [`DEFAULT_LIMITER_WAITS`]; `0` returns the first refusal).
    pub fn limiter_waits(mut self, n: u32) -> Self {
        self.limiter_waits = n;
        self
    }

    /// How many refusals by a shared cooldown are slept off (each for exactly
    /// its `retry_after`, when that fits the deadline) before the refusal is
    /// returned (default [`DEFAULT_COOLDOWN_WAITS`]; `0` returns the first).
    pub fn cooldown_waits(mut self, n: u32) -> Self {
        self.cooldown_waits = n;
        self
    }

    /// A budget for each call, measured on the clock from its start: no wait
    /// may end after it, and each attempt is sent with what it leaves as its
    /// timeout (the inner provider's own timeout still applies when it is
    /// shorter), so a slow answer cannot outlast it either (default: none).
    pub fn deadline(mut self, budget: Duration) -> Self {
        self.deadline = Some(budget);
        self
    }

    /// Whether a refusal by the model (`message.refusal`, `content_filter`)
    /// counts as a breaker failure (default `false`: refusals are about the
    /// content, not the server). Turn it on where a refusal means a
    /// misconfigured endpoint.
    pub fn refusals_trip_breaker(mut self, yes: bool) -> Self {
        self.refusals_trip_breaker = yes;
        self
    }

    /// The longest `Retry-After` the default classifier waits for (default
    /// [`DEFAULT_MAX_SERVER_DELAY`]); a server asking for more gets its error
    /// returned at once. Also the longest shared cooldown a quota signal
    /// writes: a longer signal cools the deployment down for this long.
    pub fn max_server_delay(mut self, d: Duration) -> Self {
        self.max_server_delay = d;
        self
    }

    /// A retry budget shared with other providers (default: none): each call
    /// deposits once and asks the budget before each retry, and a denied
    /// retry ends the call with [`ExtractError::RetryDenied`], its last error
    /// as `source()`, reported to the breaker as a failure. Give every
    /// provider calling one model server the same budget (over a shared
    /// cache, the whole fleet's) to bound the retries a recovering server
    /// receives.
    pub fn retry_budget<S: BudgetStore>(mut self, budget: Arc<RetryBudget<S>>) -> Self {
        self.budget = Some(Box::new(move |retry: Retry| retry.budget(budget)));
        self
    }

    /// How many tokens a call may use, reserved when the limiter has a token
    /// budget ([`tokens_per_window`](crate::RateLimiterBuilder::tokens_per_window);
    /// default [`default_token_estimate`] with the inner provider's
    /// `max_tokens`). Estimate from above: a call that uses more than its
    /// estimate is charged the difference, and that is what the budget's
    /// bound allows beyond its limit.
    pub fn token_estimate(mut self, estimate: impl Fn(&ExtractRequest<'_>) -> u64 + Send + Sync + 'static) -> Self {
        self.token_estimate = Some(Arc::new(estimate));
        self
    }

    /// Builds the provider. More than
    /// [`MAX_DEPLOYMENTS`](super::route::MAX_DEPLOYMENTS) deployments
    /// under least-loaded routing are counted in order instead: the
    /// store's pick weighs at most that many.
    pub fn build(self) -> HardenedProvider<P, L, B> {
        let clock = self.clock.unwrap_or_else(SystemClock::calibrated);
        let observer = self.observer.unwrap_or_else(|| Arc::new(TracingObserver));
        let rng = self
            .rng
            .unwrap_or_else(|| Arc::new(SeededRandom::from_os_entropy()) as Arc<dyn RandomSource>);
        let mut retry = Retry::new(self.policy)
            .clock(clock.clone())
            .rng(rng.clone())
            .observer(observer.clone());
        if let Some(budget) = self.budget {
            retry = budget(retry);
        }
        let routing = match self.routing {
            Policy::LeastLoaded { .. } if self.deployments.len() > super::route::MAX_DEPLOYMENTS => Policy::Ordered,
            routing => routing,
        };
        let in_flight_keys = match routing {
            Policy::LeastLoaded { .. } => self
                .deployments
                .iter()
                .map(|d| format!("{IN_FLIGHT_PREFIX}:{}", d.breaker.key_prefix()))
                .collect(),
            Policy::Ordered | Policy::Weighted => Vec::new(),
        };
        let holders = (0..self.deployments.len())
            .map(|i| {
                let prefix = self.deployments[i].breaker.key_prefix();
                (0..i)
                    .find(|&j| self.deployments[j].breaker.key_prefix() == prefix)
                    .unwrap_or(i)
            })
            .collect();
        HardenedProvider {
            limited: self.deployments.iter().any(|d| d.limit.is_some()),
            deployments: self.deployments,
            policy: routing,
            in_flight_keys,
            holders,
            tenant: self.tenant,
            limiter: self.limiter,
            retry,
            rng,
            clock,
            observer,
            classifier: self.classifier,
            limiter_waits: self.limiter_waits,
            cooldown_waits: self.cooldown_waits,
            deadline: self.deadline,
            refusals_trip_breaker: self.refusals_trip_breaker,
            max_server_delay: self.max_server_delay,
            token_estimate: self.token_estimate,
        }
    }
}

impl<P: LlmProvider, L: TokenStore, B: BreakerStore + InFlightStore> HardenedProviderBuilder<P, L, B> {
    /// Routes each call first to the deployment with the fewest calls in
    /// flight per weight, counted for the whole fleet in the first
    /// deployment's breaker store (one atomic pick that also leases the
    /// call: [`InFlightStore::pick_least_loaded`]); the others follow in order. A
    /// call counts until it ends. Its lease — how long it counts if its
    /// future is dropped — is `lease`, or until the call's deadline when
    /// that is later; with no deadline, choose a `lease` longer than the
    /// slowest call, or a call still running stops counting when its lease
    /// ends.
    pub fn least_loaded(mut self, lease: Duration) -> Self {
        let store: Arc<dyn InFlight> = self.deployments[0].breaker.cache().clone();
        self.routing = Policy::LeastLoaded { store, lease };
        self
    }
}

/// One call's route: the deployments in the order it tries them, the
/// admissions it holds, where its attempts go now, and its in-flight lease.
struct CallRoute {
    /// Deployment indices, in the order this call tries them.
    order: Vec<usize>,
    /// The position in `order` of the deployment attempts go to.
    at: usize,
    /// The admission held from each breaker, by the index of the first
    /// deployment behind it (`holders`).
    held: Vec<Option<Permit>>,
    /// What each breaker hears for the call, from the last attempt at a
    /// deployment behind it (same index as `held`).
    reports: Vec<Option<BreakerReport>>,
    /// The least-loaded lease: the deployment it counts at, and its id.
    lease: Option<(usize, u64)>,
    /// Refusals by deployments' own limits slept off so far.
    limit_waits: u32,
    /// Until when each breaker's server asked this call to wait
    /// (`Retry-After`), from the last attempt at a deployment behind it
    /// (same index as `held`): a retry that comes back there sleeps it off
    /// first, as a retry at one deployment would.
    asked: Vec<Option<Timestamp>>,
    /// Shared cooldowns and asked waits slept off so far in this call.
    cooldown_waits: u32,
    /// Set when a retry found nowhere to go but a deployment whose asked
    /// wait it could not sleep (over `max_server_delay`, or past the
    /// deadline): that wait, for the retry loop's verdict.
    stuck: Option<Duration>,
}

impl CallRoute {
    /// The deployment attempts go to.
    fn current(&self) -> usize {
        self.order[self.at]
    }
}

/// Locks a call's route (a poisoned lock still holds a consistent route:
/// no code panics while holding it).
fn lock(route: &std::sync::Mutex<CallRoute>) -> std::sync::MutexGuard<'_, CallRoute> {
    route.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Why a retry's placement holds back from a deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hold {
    /// Its own limit refused the attempt.
    Limit,
    /// Its server asked the call's last attempt to wait (`Retry-After`).
    Asked,
}

/// What an outcome tells the breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BreakerReport {
    Success,
    Failure,
    /// Nothing about the server: the permit is handed back unused.
    Release,
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
    fn classify(&self, error: &ExtractError) -> Retryable {
        if let Some(custom) = &self.classifier {
            return custom(error);
        }
        match error.retryable() {
            Retryable::After(d) if d > self.max_server_delay => Retryable::No,
            verdict => verdict,
        }
    }

    /// The retry loop's verdict over several deployments: a retry goes to
    /// another deployment, so a wait one deployment's server asked for
    /// (`Retry-After`, also one over the cap) does not hold it back, and a
    /// failure that is about the deployment rather than the request — its
    /// account's quota exhausted, its key refused, the model unknown there,
    /// an inner wrapper's refusal — is retried there (under the default
    /// classifier), whenever another deployment is not known to refuse.
    fn classify_routed(&self, error: &ExtractError, route: &std::sync::Mutex<CallRoute>) -> Retryable {
        let verdict = self.classify(error);
        if self.deployments.len() == 1 {
            return verdict;
        }
        if let Some(wait) = lock(route).stuck.take() {
            // Nowhere to go but a server's wait: the verdict one deployment
            // gets on it (over the cap, final; else a wait the deadline
            // then refuses), not another placement that sends nothing.
            return if wait > self.max_server_delay {
                Retryable::No
            } else {
                Retryable::After(wait)
            };
        }
        if self.server_wait(error).is_none() && !self.about_deployment(error) {
            return verdict;
        }
        let now = self.clock.now();
        let here = self.holders[lock(route).current()];
        let elsewhere =
            (0..self.deployments.len()).any(|j| self.holders[j] != here && !self.deployments[j].known_to_refuse(now));
        if elsewhere { Retryable::Yes } else { verdict }
    }

    /// The wait a failure's server asked for (`Retry-After`), as the retry
    /// loop would honour it at one deployment: the classifier's, or under
    /// the default classifier also one over `max_server_delay`.
    fn server_wait(&self, error: &ExtractError) -> Option<Duration> {
        match self.classify(error) {
            Retryable::After(wait) => Some(wait),
            _ if self.classifier.is_none() => match error.retryable() {
                Retryable::After(wait) => Some(wait),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether a failure is about the deployment rather than the request
    /// (under the default classifier): its account's quota exhausted, its
    /// key refused, the model unknown there, an inner wrapper's refusal.
    fn about_deployment(&self, error: &ExtractError) -> bool {
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
    fn lease_for(&self, lease: Duration, deadline: Option<Timestamp>) -> Duration {
        match deadline {
            Some(d) => lease.max(d.saturating_duration_since(self.clock.now())),
            None => lease,
        }
    }

    /// How many tokens an attempt at deployment `i` may use: the
    /// configured estimate, or the default by its `max_tokens`.
    fn estimate_at(&self, request: &ExtractRequest<'_>, i: usize) -> u64 {
        match &self.token_estimate {
            Some(estimate) => estimate(request),
            None => default_token_estimate(request, self.deployments[i].inner.max_tokens()),
        }
    }

    /// The model of deployment `i`, for events.
    fn model_of(&self, i: usize) -> Arc<str> {
        Arc::from(self.deployments[i].inner.model())
    }

    /// The whole call, returning the outcome and the deployment the last
    /// attempt went to, counting into `sent` each attempt that reached an
    /// inner provider. `timeout`, a caller's bound on the whole call,
    /// tightens the deadline.
    async fn run(
        &self,
        request: ExtractRequest<'_>,
        timeout: Option<Duration>,
        sent: &AtomicU32,
    ) -> (Result<Extracted<Value>, ExtractError>, usize) {
        if request.is_blank() {
            return (Err(ProviderError::BlankText.into()), 0);
        }
        let start = self.clock.now();
        let deadline = match (self.deadline, timeout) {
            (Some(a), Some(b)) => Some(start.saturating_add(a.min(b))),
            (budget, timeout) => budget.or(timeout).map(|t| start.saturating_add(t)),
        };

        let mut route = self.plan(deadline).await;
        if let Err(refused) = self.admit(deadline, &mut route).await {
            self.end_lease(route.lease.take()).await;
            return (Err(refused), route.current());
        }

        let reservation = match self.acquire(deadline, &request, route.current()).await {
            Ok(reservation) => reservation,
            Err(e) => {
                self.report_all(&mut route, BreakerReport::Release).await;
                return (Err(e), route.current());
            }
        };

        let mut attempts = 0u32;
        let spent = AtomicU32::new(0);
        let route = std::sync::Mutex::new(route);
        let outcome = self
            .retry
            .run_until(
                deadline,
                OPERATION,
                |e| self.classify_routed(e, &route),
                || {
                    attempts = attempts.saturating_add(1);
                    let attempt = attempts;
                    let route = &route;
                    let spent = &spent;
                    async move {
                        let reservation = match self.place(route, &request, deadline, attempt > 1).await {
                            Ok(reservation) => reservation,
                            Err(limited) => {
                                // Not sent: the breaker hears nothing of it, unless nothing was sent there at all.
                                let here = self.holders[lock(route).current()];
                                lock(route).reports[here].get_or_insert(BreakerReport::Release);
                                return Err(limited);
                            }
                        };
                        let at = lock(route).current();
                        #[cfg(feature = "mutants")]
                        if let Some(refused) = self.mutated_layers(route, attempt).await {
                            self.settle_limit(at, reservation, 0).await;
                            return Err(refused);
                        }
                        // The attempt may take no longer than the deadline leaves.
                        let left = deadline.map(|d| d.saturating_duration_since(self.clock.now()));
                        sent.fetch_add(1, Ordering::Relaxed);
                        let result = self.attempt(at, attempt, request, left, spent).await;
                        #[cfg(feature = "mutants")]
                        let result = self.retried_anew(at, request, left, spent, sent, result).await;
                        if let Some(reservation) = reservation {
                            let actual = match &result {
                                Ok(answer) => answer_tokens(reservation.estimate, answer),
                                Err(e) if may_have_spent(e) => reservation.estimate,
                                Err(_) => 0,
                            };
                            self.settle_limit(at, Some(reservation), actual).await;
                        }
                        if self.deployments.len() > 1 {
                            self.heed(route, at, &result);
                        }
                        if self.deployments.len() > 1 || self.limited {
                            let report = match &result {
                                Ok(_) => BreakerReport::Success,
                                Err(e) => match self.classify(e) {
                                    Retryable::No => self.permanent_report(e),
                                    Retryable::Yes | Retryable::After(_) => BreakerReport::Failure,
                                },
                            };
                            lock(route).reports[self.holders[at]] = Some(report);
                        }
                        result
                    }
                },
            )
            .await;
        let mut route = route.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);

        let (result, report) = match outcome {
            Ok(value) => (Ok(value), BreakerReport::Success),
            Err(RetryError::Exhausted(x)) => (
                Err(ExtractError::RetryExhausted(RetryExhausted {
                    attempts: x.attempts,
                    max_retries: x.max_retries,
                    operation: x.operation,
                    last: Box::new(x.last),
                })),
                BreakerReport::Failure,
            ),
            Err(RetryError::Deadline(d)) => {
                self.report_deadline(route.current(), DeadlineWait::Retry, d.needed, d.remaining);
                (
                    Err(ExtractError::Deadline(DeadlineExceeded {
                        waiting_for: DeadlineWait::Retry,
                        attempts: d.attempts,
                        needed: d.needed,
                        remaining: d.remaining,
                        last: Box::new(d.last),
                    })),
                    BreakerReport::Failure,
                )
            }
            Err(RetryError::Denied(d)) => (
                Err(ExtractError::RetryDenied(RetryDenied {
                    attempts: d.attempts,
                    operation: d.operation,
                    last: Box::new(d.last),
                })),
                BreakerReport::Failure,
            ),
            Err(RetryError::Permanent(e)) => {
                let report = self.permanent_report(&e);
                (Err(e), report)
            }
        };
        if let Some(reservation) = reservation {
            self.settle_tokens(&reservation, &result, spent.load(Ordering::Relaxed))
                .await;
        }
        self.report_all(&mut route, report).await;
        (result, route.current())
    }

    /// The call's route before its admission: every deployment, the first
    /// chosen by the policy (the least-loaded pick also leases the call
    /// there), the rest in order, those known to refuse last.
    async fn plan(&self, deadline: Option<Timestamp>) -> CallRoute {
        let n = self.deployments.len();
        let mut route = CallRoute {
            order: vec![0],
            at: 0,
            held: vec![None; n],
            reports: vec![None; n],
            lease: None,
            limit_waits: 0,
            asked: vec![None; n],
            cooldown_waits: 0,
            stuck: None,
        };
        if n == 1 && !matches!(self.policy, Policy::LeastLoaded { .. }) {
            return route;
        }
        let now = self.clock.now();
        let first = match &self.policy {
            Policy::Ordered => None,
            Policy::Weighted => weighted_pick(&live_weights(&self.deployments, now), self.rng.next_u64()),
            Policy::LeastLoaded { store, lease } => {
                let weights = live_weights(&self.deployments, now);
                let keys: Vec<&str> = self.in_flight_keys.iter().map(String::as_str).collect();
                let id = self.rng.next_u64();
                let request = PickRequest {
                    now,
                    id,
                    lease: self.lease_for(*lease, deadline),
                    max_ahead: crate::limiter::DEFAULT_MAX_CLOCK_AHEAD,
                };
                if weights.iter().all(|w| *w == 0) {
                    None
                } else {
                    let picked = store.pick(&keys, &weights, request).await.and_then(|pick| {
                        if pick.index < n {
                            Ok(pick.index)
                        } else {
                            Err(crate::error::CacheError::Protocol {
                                operation: "pick_least_loaded",
                                detail: format!("picked deployment {} of {n}", pick.index),
                            })
                        }
                    });
                    match picked {
                        Ok(index) => {
                            route.lease = Some((index, id));
                            Some(index)
                        }
                        Err(error) => {
                            self.observer.on_event(&Event::CacheUnavailable {
                                component: Arc::from(IN_FLIGHT_PREFIX),
                                operation: "pick_least_loaded",
                                fallback: "routed in order",
                                error: error.to_string(),
                            });
                            None
                        }
                    }
                }
            }
        };
        route.order = call_order(&self.deployments, now, first);
        self.report_deferred(&route.order, now);
        route
    }

    /// Reports each deployment a call's order asks last because it is known
    /// to refuse — those after the first one not known to: the call passes
    /// over them unless every other refuses, and the events say so, naming
    /// each and why.
    fn report_deferred(&self, order: &[usize], now: Timestamp) {
        if !self.observer.enabled() || crate::mutants::active(crate::mutants::Mutant::SkipsUnreported) {
            return;
        }
        let Some(live) = order.iter().position(|&i| self.deployments[i].deferral(now).is_none()) else {
            return;
        };
        for &i in &order[live + 1..] {
            if let Some((why, until)) = self.deployments[i].deferral(now) {
                self.observer.on_event(&Event::DeploymentDeferred {
                    tenant: self.tenant,
                    breaker: Arc::from(self.deployments[i].breaker.key_prefix()),
                    state: why.name(),
                    until,
                });
            }
        }
    }

    /// The first admission of the call: each deployment in the route's
    /// order until one admits (a refusal is remembered, and costs nothing
    /// more than the admission that said it). When all refuse and the
    /// soonest to admit again is a shared cooldown, up to `cooldown_waits`
    /// of them are slept off within the deadline; otherwise that refusal is
    /// the call's error.
    async fn admit(&self, deadline: Option<Timestamp>, route: &mut CallRoute) -> Result<(), ExtractError> {
        loop {
            // The refusal that ends soonest (an unknown, zero wait last), the first on a tie.
            let mut soonest: Option<(usize, Duration, Refusal)> = None;
            for at in 0..route.order.len() {
                let i = route.order[at];
                let deployment = &self.deployments[i];
                let permit = deployment.breaker.admit().await;
                let Permit::Refused {
                    state,
                    retry_after,
                    reason,
                } = permit
                else {
                    self.hear(i, None);
                    route.at = at;
                    route.held[self.holders[i]] = Some(permit);
                    if at > 0 {
                        self.rerouted(route.order[0], i, "refused");
                        route.lease = self.follow_lease(route.lease.take(), i, deadline).await;
                    }
                    return Ok(());
                };
                self.hear_refusal(i, state, reason, retry_after);
                let sooner = |(_, wait, _): (usize, Duration, Refusal)| {
                    !retry_after.is_zero() && (wait.is_zero() || retry_after < wait)
                };
                if soonest.is_none_or(sooner) {
                    soonest = Some((i, retry_after, reason));
                }
            }
            let Some((i, retry_after, reason)) = soonest else {
                return Err(CircuitOpen::new("no deployment to call", Duration::ZERO).into());
            };
            let fits = deadline.is_none_or(|d| retry_after <= d.saturating_duration_since(self.clock.now()));
            // The call's first admission: every cooldown wait so far was slept here.
            let waits = route.cooldown_waits;
            if reason != Refusal::Cooldown || waits >= self.cooldown_waits || !fits || retry_after.is_zero() {
                // The call ends with this refusal: its events name this deployment.
                route.at = route.order.iter().position(|&j| j == i).unwrap_or(0);
                return Err(CircuitOpen::refused(self.deployments[i].inner.model(), retry_after, reason).into());
            }
            route.cooldown_waits = waits + 1;
            self.observer.on_event(&Event::CooldownWait {
                model: self.model_of(i),
                tenant: self.tenant,
                wait: retry_after,
                waits: waits + 1,
            });
            self.clock.sleep(retry_after).await;
        }
    }

    /// Before each attempt: where it goes, and its reservation at that
    /// deployment's own limit. The first attempt goes where the call was
    /// admitted and a retry to the next deployment in the call's order,
    /// cycling back to where it was when every other refuses; a deployment
    /// is taken only when its breaker admits the call (or already has) and
    /// its own limit admits the attempt. A limit's refusal is remembered,
    /// an admission taken only to be refused by the limit is handed back —
    /// as is the call's admission where it leaves or waits without having
    /// sent anything there, so a probe is never held idle — and the next
    /// deployment is asked. A deployment whose server asked this call to
    /// wait (`Retry-After`, at it or at another deployment behind its
    /// breaker) is not called before the wait ends. When every deployment
    /// asked refuses or waits, the soonest wait is slept off — a limit's up
    /// to `limiter_waits` times per call, a server's when it is within
    /// `max_server_delay` — within the deadline; otherwise the attempt ends
    /// unsent with that refusal (a server's wait as a cooldown refusal, and
    /// the retry loop then gets one deployment's verdict on that wait:
    /// [`CallRoute::stuck`]).
    async fn place(
        &self,
        route: &std::sync::Mutex<CallRoute>,
        request: &ExtractRequest<'_>,
        deadline: Option<Timestamp>,
        retry: bool,
    ) -> Result<Option<Reservation>, ExtractError> {
        let (from, start, n) = {
            let r = lock(route);
            (r.current(), r.at, r.order.len())
        };
        if !self.limited && (!retry || n == 1) {
            return Ok(None);
        }
        // A retry asks the others first and its own deployment last.
        let steps = if retry { 1..n + 1 } else { 0..n };
        loop {
            // The refusal that ends soonest (no wait last), the first on a
            // tie — a limit's, or the wait a server asked the last attempt
            // for — and, should neither have been met, a breaker's.
            let mut soonest: Option<(usize, ExtractError, Option<Duration>, Hold)> = None;
            let mut circuit: Option<ExtractError> = None;
            for step in steps.clone() {
                let (at, i, held) = {
                    let r = lock(route);
                    let at = (start + step) % n;
                    let i = r.order[at];
                    (at, i, r.held[self.holders[i]].is_some())
                };
                if let Some(wait) = self.asked_wait(route, i) {
                    // Its server asked to be left alone for `wait`: it is
                    // not called before then.
                    if soonest
                        .as_ref()
                        .is_none_or(|(_, _, known, _)| known.is_none_or(|k| wait < k))
                    {
                        let refusal = CircuitOpen::refused(self.deployments[i].inner.model(), wait, Refusal::Cooldown);
                        soonest = Some((i, refusal.into(), Some(wait), Hold::Asked));
                    }
                    continue;
                }
                let mut admitted_now = None;
                if !held {
                    let permit = self.deployments[i].breaker.admit().await;
                    if let Permit::Refused {
                        state,
                        retry_after,
                        reason,
                    } = permit
                    {
                        self.hear_refusal(i, state, reason, retry_after);
                        circuit.get_or_insert_with(|| {
                            CircuitOpen::refused(self.deployments[i].inner.model(), retry_after, reason).into()
                        });
                        continue;
                    }
                    self.hear(i, None);
                    lock(route).held[self.holders[i]] = Some(permit);
                    admitted_now = Some(permit);
                }
                match self.take_limit(i, request).await {
                    Ok(reservation) => {
                        if i != from {
                            if self.holders[i] != self.holders[from] {
                                self.hand_back_unused(route, from).await;
                            }
                            let lease = {
                                let mut r = lock(route);
                                r.at = at;
                                r.lease.take()
                            };
                            self.rerouted(from, i, if retry { "failed" } else { "limited" });
                            let lease = self.follow_lease(lease, i, deadline).await;
                            lock(route).lease = lease;
                        }
                        return Ok(reservation);
                    }
                    Err((error, wait)) => {
                        if let Some(wait) = wait {
                            self.hear(i, Some((wait, Deferral::Limited)));
                        }
                        if let Some(permit) = admitted_now {
                            lock(route).held[self.holders[i]] = None;
                            self.report_to_breaker(&self.deployments[i].breaker, &permit, BreakerReport::Release)
                                .await;
                        }
                        let sooner =
                            |(_, _, known, _): &(usize, ExtractError, Option<Duration>, Hold)| match (wait, known) {
                                (Some(w), Some(k)) => w < *k,
                                (Some(_), None) => true,
                                (None, _) => false,
                            };
                        if soonest.as_ref().is_none_or(sooner) {
                            soonest = Some((i, error, wait, Hold::Limit));
                        }
                    }
                }
            }
            let Some((i, error, wait, hold)) = soonest else {
                // Every breaker refused, the call's own too (its admission
                // was handed back while it waited).
                return Err(circuit.unwrap_or_else(|| CircuitOpen::new("no deployment to call", Duration::ZERO).into()));
            };
            let fits = |w: Duration| deadline.is_none_or(|d| w <= d.saturating_duration_since(self.clock.now()));
            let (waits, cooldown_waits) = {
                let r = lock(route);
                (r.limit_waits, r.cooldown_waits)
            };
            match (wait, hold) {
                // As the retry at one deployment would: a wait over
                // `max_server_delay` or past the deadline is not slept.
                (Some(wait), Hold::Asked) if wait <= self.max_server_delay && fits(wait) => {
                    lock(route).cooldown_waits = cooldown_waits + 1;
                    self.observer.on_event(&Event::CooldownWait {
                        model: self.model_of(i),
                        tenant: self.tenant,
                        wait,
                        waits: cooldown_waits + 1,
                    });
                    self.clock.sleep(wait).await;
                }
                (Some(wait), Hold::Limit) if waits < self.limiter_waits && !wait.is_zero() && fits(wait) => {
                    lock(route).limit_waits = waits + 1;
                    self.hand_back_unused(route, from).await;
                    self.observer.on_event(&Event::RateLimitWait {
                        model: self.model_of(i),
                        tenant: self.tenant,
                        wait,
                        waits: waits + 1,
                    });
                    self.clock.sleep(wait).await;
                }
                (wait, hold) => {
                    if hold == Hold::Asked {
                        lock(route).stuck = wait;
                    }
                    return Err(error);
                }
            }
        }
    }

    /// What an attempt at deployment `at` tells later routing: the wait its
    /// server asked for, which a retry coming back there sleeps off first;
    /// and a failure about the deployment itself (its quota, its key, its
    /// model), after which later calls ask it last for one recovery timeout
    /// of its breaker — its server answered, so its circuit never opens,
    /// and every call would otherwise pay its failed round trip first.
    fn heed(&self, route: &std::sync::Mutex<CallRoute>, at: usize, result: &Result<Extracted<Value>, ExtractError>) {
        let error = result.as_ref().err();
        let asked = error
            .and_then(|e| self.server_wait(e))
            .map(|wait| self.clock.now().saturating_add(wait));
        lock(route).asked[self.holders[at]] = asked;
        if error.is_some_and(|e| self.about_deployment(e)) {
            self.hear(
                at,
                Some((
                    self.deployments[at].breaker.params().recovery_timeout,
                    Deferral::Unusable,
                )),
            );
        }
    }

    /// The rest of the wait the server behind deployment `i`'s breaker
    /// asked the call's last attempt there for, if it has not passed.
    fn asked_wait(&self, route: &std::sync::Mutex<CallRoute>, i: usize) -> Option<Duration> {
        let until = lock(route).asked[self.holders[i]]?;
        let left = until.saturating_duration_since(self.clock.now());
        (!left.is_zero()).then_some(left)
    }

    /// Hands back the call's admission at deployment `i` when no attempt
    /// was sent there (its breaker has nothing to hear), so a probe is not
    /// held while the call is elsewhere or asleep.
    async fn hand_back_unused(&self, route: &std::sync::Mutex<CallRoute>, i: usize) {
        let h = self.holders[i];
        let permit = {
            let mut r = lock(route);
            if matches!(r.reports[h], Some(BreakerReport::Success | BreakerReport::Failure)) {
                return;
            }
            r.held[h].take()
        };
        if let Some(permit) = permit {
            self.report_to_breaker(&self.deployments[i].breaker, &permit, BreakerReport::Release)
                .await;
        }
    }

    /// Takes deployment `i`'s own limit for one attempt (nothing without
    /// one): its reservation, or the refusal as the attempt's error with the
    /// wait until it would admit (none when no wait can help).
    async fn take_limit(
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
        match limit.take(estimate).await {
            Ok(reservation) => Ok(reservation),
            Err(TokenAcquireError::Limited(refusal)) => Err(refused(RefusedBy::Requests, Some(refusal.retry_after))),
            Err(TokenAcquireError::Tokens(refusal)) => {
                let wait = (refusal.by != RefusedBy::TooLarge).then_some(refusal.retry_after);
                Err(refused(refusal.by, wait))
            }
            Err(TokenAcquireError::Cache(e)) => Err((ExtractError::LimiterCache(e), None)),
        }
    }

    /// Settles an attempt's reservation at deployment `i`'s own limit to
    /// the `actual` tokens it used.
    async fn settle_limit(&self, i: usize, reservation: Option<Reservation>, actual: u64) {
        let (Some(limit), Some(reservation)) = (&self.deployments[i].limit, reservation) else {
            return;
        };
        if let Err(error) = limit.settle(&reservation, actual).await {
            self.unsettled(limit.name(), &error);
        }
    }

    /// Reports a settlement the store at `component` could not record.
    fn unsettled(&self, component: &str, error: &crate::error::CacheError) {
        self.observer.on_event(&Event::CacheUnavailable {
            component: Arc::from(component),
            operation: "settle_tokens",
            fallback: "not settled; the reservation counts until its lease ends",
            error: error.to_string(),
        });
    }

    /// Moves a call's least-loaded `lease` to deployment `to`, so the
    /// fleet's counts follow where the call really is; the lease it holds
    /// then.
    async fn follow_lease(
        &self,
        held: Option<(usize, u64)>,
        to: usize,
        deadline: Option<Timestamp>,
    ) -> Option<(usize, u64)> {
        let Policy::LeastLoaded { store, lease } = &self.policy else {
            return None;
        };
        if held.is_some_and(|(at, _)| at == to) {
            return held;
        }
        self.end_lease(held).await;
        let key = self.in_flight_keys[to].as_str();
        let id = self.rng.next_u64();
        let request = PickRequest {
            now: self.clock.now(),
            id,
            lease: self.lease_for(*lease, deadline),
            max_ahead: crate::limiter::DEFAULT_MAX_CLOCK_AHEAD,
        };
        match store.pick(&[key], &[1], request).await {
            Ok(_) => Some((to, id)),
            Err(error) => {
                self.observer.on_event(&Event::CacheUnavailable {
                    component: Arc::from(IN_FLIGHT_PREFIX),
                    operation: "pick_least_loaded",
                    fallback: "not counted",
                    error: error.to_string(),
                });
                None
            }
        }
    }

    /// Ends a call's least-loaded lease, if it holds one.
    async fn end_lease(&self, lease: Option<(usize, u64)>) {
        let (Policy::LeastLoaded { store, .. }, Some((at, id))) = (&self.policy, lease) else {
            return;
        };
        if let Err(error) = store.end(&self.in_flight_keys[at], id).await {
            self.observer.on_event(&Event::CacheUnavailable {
                component: Arc::from(IN_FLIGHT_PREFIX),
                operation: "end_in_flight",
                fallback: "the lease counts until it runs out",
                error: error.to_string(),
            });
        }
    }

    /// Reports the call to every breaker that admitted it, once each: the
    /// one the call ended at hears `last`; one it left hears what its last
    /// attempt there said (a failure, or what a permanent answer tells the
    /// breaker). Then its lease ends.
    async fn report_all(&self, route: &mut CallRoute, last: BreakerReport) {
        let current = self.holders[route.current()];
        for (i, permit) in route.held.iter().enumerate() {
            let Some(permit) = permit else { continue };
            let report = match route.reports[i] {
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
            self.report_to_breaker(&self.deployments[i].breaker, permit, report)
                .await;
        }
        self.end_lease(route.lease.take()).await;
    }

    /// Remembers what deployment `i`'s admission said (see
    /// [`Deployment::heard`]); with one deployment there is nothing to order.
    fn hear(&self, i: usize, refused_for: Option<(Duration, Deferral)>) {
        if self.deployments.len() > 1 {
            self.deployments[i].heard(self.clock.now(), refused_for);
        }
    }

    /// Remembers a refusal by deployment `i`'s breaker: one by an open
    /// circuit or a cooldown, whose wait is when it may admit again. A
    /// half-open circuit's wait is only until a live probe's lease ends —
    /// the probe may close it at any moment — so it is not remembered.
    fn hear_refusal(&self, i: usize, state: crate::breaker::CircuitState, reason: Refusal, wait: Duration) {
        if reason == Refusal::Cooldown {
            self.hear(i, Some((wait, Deferral::Cooldown)));
        } else if state == crate::breaker::CircuitState::Open {
            self.hear(i, Some((wait, Deferral::Open)));
        }
    }

    /// Tells the observer a call moved from deployment `from` to `to`.
    fn rerouted(&self, from: usize, to: usize, reason: &'static str) {
        self.observer.on_event(&Event::Rerouted {
            tenant: self.tenant,
            from: Arc::from(self.deployments[from].breaker.key_prefix()),
            to: Arc::from(self.deployments[to].breaker.key_prefix()),
            reason,
        });
    }

    /// The per-call layers pushed inside the retry loop, when that
    /// [`Mutant`](crate::mutants::Mutant) is injected: every attempt after
    /// the first takes its own limiter slot, or reports the attempt before
    /// it to the breaker and asks the breaker again (the route then holds
    /// the latest admission, which the call's final report names). A
    /// refusal is the attempt's error.
    #[cfg(feature = "mutants")]
    async fn mutated_layers(&self, route: &std::sync::Mutex<CallRoute>, attempt: u32) -> Option<ExtractError> {
        use crate::mutants::{Mutant, active};
        if attempt > 1 && active(Mutant::RetryOutsideLimiter) {
            match self.limiter.acquire(self.tenant).await {
                Ok(_) => {}
                Err(AcquireError::Limited(refusal)) => return Some(refusal.into()),
                Err(AcquireError::Cache(e)) => return Some(ExtractError::LimiterCache(e)),
            }
        }
        if attempt > 1 && active(Mutant::RetryOutsideBreaker) {
            let (i, held) = {
                let r = lock(route);
                let i = r.current();
                (i, r.held[self.holders[i]])
            };
            let breaker = &self.deployments[i].breaker;
            if let Some(permit) = held {
                self.report_to_breaker(breaker, &permit, BreakerReport::Failure).await;
            }
            let next = breaker.admit().await;
            // The reported permit is done with: a refusal takes its place.
            lock(route).held[self.holders[i]] = Some(next);
            if let Permit::Refused {
                retry_after, reason, ..
            } = next
            {
                return Some(CircuitOpen::refused(self.deployments[i].inner.model(), retry_after, reason).into());
            }
        }
        None
    }

    /// The [`FallbackRetriesAnew`](crate::mutants::Mutant::FallbackRetriesAnew)
    /// mutant: when a call routes over several deployments, each one it
    /// reaches retries a transient failure on its own, up to the schedule's
    /// `max_retries` more attempts there at once, before the fallback moves
    /// on — attempts multiply by the deployments instead of being bounded
    /// by one schedule.
    #[cfg(feature = "mutants")]
    async fn retried_anew(
        &self,
        at: usize,
        request: ExtractRequest<'_>,
        left: Option<Duration>,
        spent: &AtomicU32,
        sent: &AtomicU32,
        mut result: Result<Extracted<Value>, ExtractError>,
    ) -> Result<Extracted<Value>, ExtractError> {
        use crate::mutants::{Mutant, active};
        if self.deployments.len() < 2 || !active(Mutant::FallbackRetriesAnew) {
            return result;
        }
        for _ in 0..self.retry.policy().max_retries() {
            match &result {
                Err(e) if !matches!(self.classify(e), Retryable::No) => {}
                _ => break,
            }
            let number = sent.fetch_add(1, Ordering::Relaxed);
            result = self.attempt(at, number, request, left, spent).await;
        }
        result
    }

    /// Attempt `number` of the call, on deployment `at`, in its own span; a
    /// quota signal in its answer becomes that deployment's fleet-wide
    /// cooldown (one breaker step) before the answer is handed back.
    async fn attempt(
        &self,
        at: usize,
        number: u32,
        request: ExtractRequest<'_>,
        left: Option<Duration>,
        spent: &AtomicU32,
    ) -> Result<Extracted<Value>, ExtractError> {
        let span = spans::attempt_span(self.deployments[at].inner.model(), number);
        let result = self
            .attempt_in_span(at, request, left, spent)
            .instrument(span.clone())
            .await;
        spans::record_result(&span, &result);
        result
    }

    /// [`attempt`](Self::attempt)'s work, inside its span.
    async fn attempt_in_span(
        &self,
        at: usize,
        request: ExtractRequest<'_>,
        left: Option<Duration>,
        spent: &AtomicU32,
    ) -> Result<Extracted<Value>, ExtractError> {
        let deployment = &self.deployments[at];
        let result = deployment.inner.extract_answer(request, left).await;
        // A failed attempt the server may have generated for still used
        // tokens a token budget must charge.
        if let Err(e) = &result
            && may_have_spent(e)
        {
            spent.fetch_add(1, Ordering::Relaxed);
        }
        let wait = match &result {
            Ok(answer) => answer.quota.map(|q| q.wait),
            Err(e) => e.quota_wait(),
        };
        let wait = wait.filter(|w| !w.is_zero());
        if let Some(wait) = wait {
            // The cooldown just written refuses this deployment until then.
            self.hear(at, Some((wait.min(self.max_server_delay), Deferral::Cooldown)));
        }
        if let Some(wait) = wait
            && let Err(error) = deployment.breaker.cool_down(wait.min(self.max_server_delay)).await
        {
            self.observer.on_event(&Event::CacheUnavailable {
                component: Arc::from(deployment.breaker.key_prefix()),
                operation: "cool_down",
                fallback: "not recorded",
                error: error.to_string(),
            });
        }
        result
    }

    /// Takes the tenant's slot (and, under a token budget, reserves the
    /// call's estimate with it, by deployment `at`'s `max_tokens`), sleeping
    /// off up to `limiter_waits` refusals (each for exactly its
    /// `retry_after`, after which the slot is free unless another caller
    /// took it first).
    async fn acquire(
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
                None => match self.limiter.acquire(self.tenant).await {
                    Ok(_) => return Ok(None),
                    Err(AcquireError::Limited(refusal)) => (refusal.clone().into(), refusal.retry_after),
                    Err(AcquireError::Cache(e)) => return Err(ExtractError::LimiterCache(e)),
                },
                Some(estimate) => match self.limiter.acquire_tokens(self.tenant, estimate).await {
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
    async fn settle_tokens(
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

    /// A permanent failure reports a failure only when it is a transient kind
    /// the classifier cut short (a `Retry-After` too long to honour), or a
    /// refusal when so configured; any other answer from the server shows the
    /// server is up and closes a half-open circuit. Failures that say nothing
    /// about the server (an inner wrapper's own refusal) report nothing.
    fn permanent_report(&self, error: &ExtractError) -> BreakerReport {
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
    async fn report_to_breaker(&self, breaker: &CircuitBreaker<B>, permit: &Permit, report: BreakerReport) {
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

    fn report_deadline(&self, at: usize, waiting_for: DeadlineWait, needed: Duration, remaining: Duration) {
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
        Box::pin(
            async move {
                // Nobody listening: no event to build, no clock to read.
                let start = self.observer.enabled().then(|| {
                    self.observer.on_event(&Event::CallStarted {
                        model: self.model_of(0),
                        tenant: self.tenant,
                    });
                    self.clock.now()
                });
                let end = CallEnd {
                    observer: &*self.observer,
                    clock: &*self.clock,
                    primary: self.model(),
                    tenant: self.tenant,
                    start,
                    sent: AtomicU32::new(0),
                    span: recorded,
                    done: false,
                };
                let (result, at) = self.run(request, timeout, &end.sent).await;
                end.finish(&result, self.deployments[at].inner.model());
                result
            }
            .instrument(span),
        )
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
struct CallEnd<'p> {
    observer: &'p dyn Observer,
    clock: &'p dyn Clock,
    /// The primary deployment's model: where a dropped call is counted.
    primary: &'p str,
    tenant: TenantId,
    /// When the call started; `None` when the observer listens to nothing.
    start: Option<Timestamp>,
    /// Attempts that reached an inner provider so far.
    sent: AtomicU32,
    span: tracing::Span,
    done: bool,
}

impl CallEnd<'_> {
    /// Ends the call with `result`, its last attempt sent to `model`.
    fn finish(mut self, result: &Result<Extracted<Value>, ExtractError>, model: &str) {
        self.done = true;
        let attempts = self.sent.load(Ordering::Relaxed);
        spans::record_result(&self.span, result);
        self.span.record("redstring.attempts", attempts);
        let usage = result.as_ref().ok().and_then(|a| a.usage);
        let outcome = match result {
            Ok(_) => "ok",
            Err(e) => e.kind(),
        };
        self.tell(model, outcome, attempts, usage);
    }

    fn tell(&self, model: &str, outcome: &'static str, attempts: u32, usage: Option<super::Usage>) {
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
        let attempts = self.sent.load(Ordering::Relaxed);
        spans::record_cancelled(&self.span, CANCELLED, attempts);
        self.tell(self.primary, CANCELLED, attempts, None);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::breaker::CircuitState;
    use crate::clock::ManualClock;
    use crate::provider::{LlmProviderExt, OutputSchema};

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

    fn harden<P: LlmProvider>(inner: P, clock: &Arc<ManualClock>, threshold: u32) -> HardenedProvider<P> {
        let limiter = Arc::new(RateLimiter::builder(100).clock(clock.clone()).build().unwrap());
        let breaker = Arc::new(
            CircuitBreaker::builder()
                .failure_threshold(threshold)
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        HardenedProvider::builder(inner, TenantId::from_u128(9), limiter, breaker)
            .retry_policy(RetryPolicy::builder().max_retries(1).jitter(0.0).build().unwrap())
            .clock(clock.clone())
            .rng(Arc::new(SeededRandom::from_seed(1)))
            .build()
    }

    #[tokio::test]
    async fn a_retried_call_is_charged_for_every_attempt_that_may_have_spent_tokens() {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let limiter = Arc::new(
            RateLimiter::builder(100)
                .tokens_per_window(1000)
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let breaker = Arc::new(CircuitBreaker::builder().clock(clock.clone()).build().unwrap());
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
            .clock(clock.clone())
            .rng(Arc::new(SeededRandom::from_seed(1)))
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
            let model = self.model.to_owned();
            Box::pin(async move {
                Ok(Extracted {
                    value: Value::from("v"),
                    model,
                    usage: None,
                    quota: None,
                })
            })
        }
    }

    fn breaker_named(clock: &Arc<ManualClock>, cache: &Arc<MemoryCache>, name: &str) -> Arc<CircuitBreaker> {
        Arc::new(
            CircuitBreaker::builder()
                .key_prefix(format!("kg:circuit:{name}"))
                .clock(clock.clone())
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
        let limiter = Arc::new(RateLimiter::builder(100_000).clock(clock.clone()).build().unwrap());
        let p = HardenedProvider::over(
            Deployment::new(a.clone(), breaker_named(&clock, &cache, "a")).weight(3),
            TenantId::from_u128(9),
            limiter,
        )
        .deployment(Deployment::new(b.clone(), breaker_named(&clock, &cache, "b")).weight(1))
        .weighted()
        .clock(clock.clone())
        .rng(Arc::new(SeededRandom::from_seed(11)))
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
        let limiter = Arc::new(RateLimiter::builder(100).clock(clock.clone()).build().unwrap());
        let build = || {
            HardenedProvider::builder(
                a.clone(),
                TenantId::from_u128(9),
                limiter.clone(),
                breaker_named(&clock, &cache, "a"),
            )
            .fallback(b.clone(), breaker_named(&clock, &cache, "b"))
            .least_loaded(Duration::from_secs(60))
            .clock(clock.clone())
            .rng(Arc::new(SeededRandom::from_seed(5)))
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
}
