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
//! | no call made after admission (limiter refusal, an inner wrapper's refusal) | `release` — a half-open probe's lease ends at once, so the next caller probes |
//!
//! Every report names the [`Permit`] the call was admitted with, so a probe
//! reports exactly its own lease and a late report changes nothing. The call
//! is cancellation-safe: a future dropped mid-call (a caller's timeout, a
//! `select!`, an aborted task) reports nothing, and a probe it held stops
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
//! Every wait (limiter, backoff, the server's `Retry-After`) is slept on the
//! injected clock and checked against the call's deadline first, so a test on
//! a [`ManualClock`](crate::ManualClock) never sleeps and a production call
//! never oversleeps its budget.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::Value;

use super::error::{DeadlineExceeded, DeadlineWait, ExtractError, ProviderError};
use super::transport::BoxFuture;
use super::{ExtractRequest, Extracted, LlmProvider};
use crate::breaker::{CircuitBreaker, CircuitOpen, Permit, Refusal};
use crate::cache::{BreakerStore, BudgetStore, MemoryCache, TokenStore};
use crate::clock::{Clock, SystemClock};
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

/// An [`LlmProvider`] that survives a flaky model server, for one tenant.
///
/// Build one per tenant around a shared limiter and breaker: the limiter keys
/// by tenant, the breaker by model server, so sharing them is what makes one
/// tenant's traffic count against its own allowance and one outage trip every
/// tenant's circuit. Give the limiter, the breaker and this provider the same
/// clock.
pub struct HardenedProvider<P, L = MemoryCache, B = MemoryCache> {
    inner: P,
    tenant: TenantId,
    limiter: Arc<RateLimiter<L>>,
    breaker: Arc<CircuitBreaker<B>>,
    retry: Retry,
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
            .field("inner", &self.inner)
            .field("tenant", &self.tenant)
            .field("limiter", &self.limiter)
            .field("breaker", &self.breaker)
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
    inner: P,
    tenant: TenantId,
    limiter: Arc<RateLimiter<L>>,
    breaker: Arc<CircuitBreaker<B>>,
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
        HardenedProviderBuilder {
            inner,
            tenant,
            limiter,
            breaker,
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

    /// Builds the provider.
    pub fn build(self) -> HardenedProvider<P, L, B> {
        let clock = self.clock.unwrap_or_else(|| Arc::new(SystemClock));
        let observer = self.observer.unwrap_or_else(|| Arc::new(TracingObserver));
        let rng = self
            .rng
            .unwrap_or_else(|| Arc::new(SeededRandom::from_os_entropy()) as Arc<dyn RandomSource>);
        let mut retry = Retry::new(self.policy)
            .clock(clock.clone())
            .rng(rng)
            .observer(observer.clone());
        if let Some(budget) = self.budget {
            retry = budget(retry);
        }
        HardenedProvider {
            inner: self.inner,
            tenant: self.tenant,
            limiter: self.limiter,
            breaker: self.breaker,
            retry,
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

/// The admission a mutated call holds now (see `mutated_attempt`).
#[cfg(feature = "mutants")]
fn latest(permit: &std::sync::Mutex<Permit>) -> Permit {
    *permit.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
    /// The wrapped provider.
    pub fn inner(&self) -> &P {
        &self.inner
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

    /// The whole call, returning the outcome and the attempts that reached the
    /// inner provider.
    /// `timeout`, a caller's bound on the whole call, tightens the deadline.
    async fn run(
        &self,
        request: ExtractRequest<'_>,
        timeout: Option<Duration>,
    ) -> (Result<Extracted<Value>, ExtractError>, u32) {
        if request.is_blank() {
            return (Err(ProviderError::BlankText.into()), 0);
        }
        let start = self.clock.now();
        let deadline = match (self.deadline, timeout) {
            (Some(a), Some(b)) => Some(start.saturating_add(a.min(b))),
            (budget, timeout) => budget.or(timeout).map(|t| start.saturating_add(t)),
        };

        let permit = match self.admit(deadline).await {
            Ok(permit) => permit,
            Err(refused) => return (Err(refused), 0),
        };

        let reservation = match self.acquire(deadline, &request).await {
            Ok(reservation) => reservation,
            Err(e) => {
                self.report_to_breaker(&permit, BreakerReport::Release).await;
                return (Err(e), 0);
            }
        };

        let mut attempts = 0u32;
        let spent = AtomicU32::new(0);
        #[cfg(feature = "mutants")]
        let (outcome, permit) = {
            let permit = std::sync::Mutex::new(permit);
            let outcome = self
                .retry
                .run_until(
                    deadline,
                    OPERATION,
                    |e| self.classify(e),
                    || {
                        attempts = attempts.saturating_add(1);
                        let left = deadline.map(|d| d.saturating_duration_since(self.clock.now()));
                        self.mutated_attempt(request, left, attempts, &permit, &spent)
                    },
                )
                .await;
            (outcome, latest(&permit))
        };
        #[cfg(not(feature = "mutants"))]
        let outcome = self
            .retry
            .run_until(
                deadline,
                OPERATION,
                |e| self.classify(e),
                || {
                    attempts = attempts.saturating_add(1);
                    // The attempt may take no longer than the deadline leaves.
                    let left = deadline.map(|d| d.saturating_duration_since(self.clock.now()));
                    self.attempt(request, left, &spent)
                },
            )
            .await;

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
                self.report_deadline(DeadlineWait::Retry, d.needed, d.remaining);
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
        #[cfg(feature = "mutants")]
        if crate::mutants::active(crate::mutants::Mutant::ProbeNeverReports)
            && matches!(permit, Permit::Probe(_))
            && report == BreakerReport::Failure
        {
            // The failed probe is lost: no report, no release.
            return (result, attempts);
        }
        self.report_to_breaker(&permit, report).await;
        (result, attempts)
    }

    /// One attempt with a per-call layer pushed inside the retry loop, when
    /// that [`Mutant`](crate::mutants::Mutant) is injected: every attempt
    /// after the first takes its own limiter slot, or reports the attempt
    /// before it to the breaker and asks the breaker again (`permit` then
    /// holds the latest admission, which the call's final report names).
    #[cfg(feature = "mutants")]
    fn mutated_attempt<'a>(
        &'a self,
        request: ExtractRequest<'a>,
        left: Option<Duration>,
        attempt: u32,
        permit: &'a std::sync::Mutex<Permit>,
        spent: &'a AtomicU32,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>> {
        use crate::mutants::{Mutant, active};
        Box::pin(async move {
            if attempt > 1 && active(Mutant::RetryOutsideLimiter) {
                match self.limiter.acquire(self.tenant).await {
                    Ok(_) => {}
                    Err(AcquireError::Limited(refusal)) => return Err(refusal.into()),
                    Err(AcquireError::Cache(e)) => return Err(ExtractError::LimiterCache(e)),
                }
            }
            if attempt > 1 && active(Mutant::RetryOutsideBreaker) {
                self.report_to_breaker(&latest(permit), BreakerReport::Failure).await;
                let next = self.breaker.admit().await;
                // The reported permit is done with: a refusal takes its place.
                *permit.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = next;
                if let Permit::Refused {
                    retry_after, reason, ..
                } = next
                {
                    return Err(CircuitOpen::refused(self.inner.model(), retry_after, reason).into());
                }
            }
            self.attempt(request, left, spent).await
        })
    }

    /// The breaker's admission, sleeping off up to `cooldown_waits` refusals
    /// by a shared cooldown that end within the deadline. A refusal by the
    /// circuit, or one not slept off, is the call's error.
    async fn admit(&self, deadline: Option<Timestamp>) -> Result<Permit, ExtractError> {
        let mut waits = 0u32;
        loop {
            let permit = self.breaker.admit().await;
            let Permit::Refused {
                retry_after, reason, ..
            } = permit
            else {
                return Ok(permit);
            };
            let fits = deadline.is_none_or(|d| retry_after <= d.saturating_duration_since(self.clock.now()));
            if reason != Refusal::Cooldown || waits >= self.cooldown_waits || !fits || retry_after.is_zero() {
                return Err(CircuitOpen::refused(self.inner.model(), retry_after, reason).into());
            }
            waits += 1;
            self.observer.on_event(&Event::CooldownWait {
                model: Arc::from(self.inner.model()),
                tenant: self.tenant,
                wait: retry_after,
                waits,
            });
            self.clock.sleep(retry_after).await;
        }
    }

    /// One attempt on the inner provider; a quota signal in its answer
    /// becomes the fleet's cooldown (one breaker step) before the answer is
    /// handed back.
    async fn attempt(
        &self,
        request: ExtractRequest<'_>,
        left: Option<Duration>,
        spent: &AtomicU32,
    ) -> Result<Extracted<Value>, ExtractError> {
        let result = self.inner.extract_answer(request, left).await;
        // A failed attempt the server may have generated for still used
        // tokens a token budget must charge.
        if let Err(e) = &result
            && !e.provider_error().is_none_or(ProviderError::generated_nothing)
        {
            spent.fetch_add(1, Ordering::Relaxed);
        }
        let wait = match &result {
            Ok(answer) => answer.quota.map(|q| q.wait),
            Err(e) => e.quota_wait(),
        };
        if let Some(wait) = wait.filter(|w| !w.is_zero())
            && let Err(error) = self.breaker.cool_down(wait.min(self.max_server_delay)).await
        {
            self.observer.on_event(&Event::CacheUnavailable {
                component: Arc::from(self.breaker.key_prefix()),
                operation: "cool_down",
                fallback: "not recorded",
                error: error.to_string(),
            });
        }
        result
    }

    /// Takes the tenant's slot (and, under a token budget, reserves the
    /// call's estimate with it), sleeping off up to `limiter_waits` refusals
    /// (each for exactly its `retry_after`, after which the slot is free
    /// unless another caller took it first).
    async fn acquire(
        &self,
        deadline: Option<Timestamp>,
        request: &ExtractRequest<'_>,
    ) -> Result<Option<Reservation>, ExtractError> {
        let estimate = self.limiter.tokens_per_window().map(|_| match &self.token_estimate {
            Some(estimate) => estimate(request),
            None => default_token_estimate(request, self.inner.max_tokens()),
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
                    self.report_deadline(DeadlineWait::RateLimit, wait, remaining);
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
                model: Arc::from(self.inner.model()),
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
            Ok(answer) => answer.usage.map_or(reservation.estimate, |u| u.total()),
            Err(_) => 0,
        }
        .saturating_add(failed);
        if let Err(error) = self.limiter.settle(self.tenant, reservation, actual).await {
            self.observer.on_event(&Event::CacheUnavailable {
                component: Arc::from(self.limiter.key_prefix()),
                operation: "settle_tokens",
                fallback: "not settled; the reservation counts until its lease ends",
                error: error.to_string(),
            });
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

    /// Tells the breaker how the call `permit` admitted went — exactly that
    /// permit, in one step, with no read of the state first.
    async fn report_to_breaker(&self, permit: &Permit, report: BreakerReport) {
        let (operation, result) = match report {
            BreakerReport::Success => ("record_success", self.breaker.record_success_for(permit).await),
            BreakerReport::Failure => ("record_failure", self.breaker.record_failure_for(permit).await),
            BreakerReport::Release => ("release", self.breaker.release(permit).await),
        };
        if let Err(error) = result {
            self.observer.on_event(&Event::CacheUnavailable {
                component: Arc::from(self.breaker.key_prefix()),
                operation,
                fallback: "not recorded",
                error: error.to_string(),
            });
        }
    }

    fn report_deadline(&self, waiting_for: DeadlineWait, needed: Duration, remaining: Duration) {
        self.observer.on_event(&Event::DeadlineExceeded {
            model: Arc::from(self.inner.model()),
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
    /// The inner provider's identity, read through on every call.
    fn model(&self) -> &str {
        self.inner.model()
    }

    /// The inner provider's answer, provenance included; `timeout` bounds the
    /// whole call like a deadline.
    fn extract_answer<'a>(
        &'a self,
        request: ExtractRequest<'a>,
        timeout: Option<Duration>,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>> {
        Box::pin(async move {
            let (result, attempts) = self.run(request, timeout).await;
            self.observer.on_event(&Event::CallFinished {
                model: Arc::from(self.inner.model()),
                tenant: self.tenant,
                outcome: match &result {
                    Ok(_) => "ok",
                    Err(e) => e.kind(),
                },
                attempts,
            });
            result
        })
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
        assert_eq!(p.breaker.state().await.unwrap(), CircuitState::Open);

        clock.advance(Duration::from_secs(60));
        let e = p.extract::<String>("t", None).await.unwrap_err();
        assert_eq!(e.kind(), "circuit_open", "the inner wrapper's refusal, passed on");
        assert_eq!(p.breaker.state().await.unwrap(), CircuitState::HalfOpen);

        // Not wedged: the probe was released, so the very next call probes.
        assert_eq!(p.extract::<String>("t", None).await.unwrap(), "up");
        assert_eq!(p.breaker.state().await.unwrap(), CircuitState::Closed);
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
        assert_eq!(p.breaker.state().await.unwrap(), CircuitState::Closed);
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
        p.breaker.record_failure().await.unwrap();
        clock.advance(Duration::from_secs(60));

        let mut hung = Box::pin(p.extract::<String>("t", None));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(hung.as_mut().poll(&mut cx).is_pending(), "the probe is in flight");
        drop(hung);
        assert_eq!(p.breaker.state().await.unwrap(), CircuitState::HalfOpen);

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
        assert_eq!(p.breaker.state().await.unwrap(), CircuitState::Closed);
    }
}
