//! How a [`HardenedProvider`] is configured: the deployments, the retry
//! policy and budget, the waits a call may sleep off, and the environment
//! it reads time, randomness and its observer from.

use std::sync::Arc;
use std::time::Duration;

use super::hedge::{HedgeAfter, Hedging};
use super::{
    Classifier, DEFAULT_COOLDOWN_WAITS, DEFAULT_LIMITER_WAITS, DEFAULT_MAX_QUOTA_COOLDOWN, DEFAULT_MAX_SERVER_DELAY,
    DEFAULT_QUOTA_COOLDOWN, HardenedProvider, TokenEstimate,
};
use crate::breaker::CircuitBreaker;
use crate::cache::{BreakerStore, BudgetStore, InFlightStore, TokenStore};
use crate::decide::concurrency::AdaptiveConcurrency;
use crate::decide::ramp::SlowStart;
use crate::env::Env;
use crate::error::ConfigError;
use crate::limiter::RateLimiter;
use crate::provider::route::{Deployment, IN_FLIGHT_PREFIX, InFlight, Policy};
use crate::provider::{ExtractError, ExtractRequest, LlmProvider};
use crate::retry::{Retry, RetryBudget, RetryPolicy, Retryable};
use crate::tenant::{Priority, TenantId};

/// Configures a [`HardenedProvider`]; unset options take the defaults.
pub struct HardenedProviderBuilder<P, L, B> {
    deployments: Vec<Deployment<P, B>>,
    routing: Policy,
    tenant: TenantId,
    limiter: Arc<RateLimiter<L>>,
    policy: RetryPolicy,
    env: Option<Env>,
    classifier: Option<Classifier>,
    limiter_waits: u32,
    cooldown_waits: u32,
    deadline: Option<Duration>,
    refusals_trip_breaker: bool,
    max_server_delay: Duration,
    quota_cooldown: Duration,
    max_quota_cooldown: Duration,
    slow_call_threshold: Option<Duration>,
    hedging: Option<(HedgeAfter, u32)>,
    slow_start: Option<SlowStart>,
    adaptive: Option<super::concurrency::Adaptive>,
    /// Applies the retry budget to the loop, when one was given.
    budget: Option<Box<dyn FnOnce(Retry) -> Retry + Send>>,
    token_estimate: Option<TokenEstimate>,
    priority: Priority,
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
            env: None,
            classifier: None,
            limiter_waits: DEFAULT_LIMITER_WAITS,
            cooldown_waits: DEFAULT_COOLDOWN_WAITS,
            deadline: None,
            refusals_trip_breaker: false,
            max_server_delay: DEFAULT_MAX_SERVER_DELAY,
            quota_cooldown: DEFAULT_QUOTA_COOLDOWN,
            max_quota_cooldown: DEFAULT_MAX_QUOTA_COOLDOWN,
            slow_call_threshold: None,
            hedging: None,
            slow_start: None,
            adaptive: None,
            budget: None,
            token_estimate: None,
            priority: Priority::High,
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

    /// The class this provider's calls carry at every limit they take a
    /// slot from — the tenant's limiter and each deployment's
    /// [`limit`](Deployment::limit) — (default [`Priority::High`]): where a
    /// limit keeps a [`reserve`](crate::RateLimiterBuilder::reserve), a
    /// [`Priority::Low`] provider's calls may use only the rest, so batch
    /// work sharing a deployment with interactive calls cannot crowd them
    /// out.
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Routes each call first to a deployment drawn by weight (from the
    /// [`env`](Self::env)'s random source), the others following in order (default: the
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

    /// The clock every wait is slept on and the deadline measured by, the
    /// source of backoff jitter and routing draws, and where events go
    /// (default [`Env::system`]). Use the limiter's and the breaker's clock.
    pub fn env(mut self, env: Env) -> Self {
        self.env = Some(env);
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

    /// How many refusals by a shared cooldown at the call's admission are
    /// slept off (each for exactly its `retry_after`, when that fits the
    /// deadline and is no longer than
    /// [`max_server_delay`](Self::max_server_delay), so a spent quota's day
    /// is never slept) before the refusal is returned (default
    /// [`DEFAULT_COOLDOWN_WAITS`]; `0` returns the first). A retry is not
    /// sent inside a cooldown either: it goes to another deployment, or
    /// waits out what its server asked within `max_server_delay`.
    pub fn cooldown_waits(mut self, n: u32) -> Self {
        self.cooldown_waits = n;
        self
    }

    /// A budget for each call, measured on the clock from its start: no wait
    /// may end after it, and each attempt is sent with what it leaves as its
    /// timeout (the inner provider's own timeout still applies when it is
    /// shorter), so a slow answer cannot outlast it either (default: none).
    /// Set it before a [`slow_call_threshold`](Self::slow_call_threshold),
    /// which must be shorter.
    pub fn deadline(mut self, budget: Duration) -> Self {
        self.deadline = Some(budget);
        self
    }

    /// Counts an answer slower than `threshold` as a failure of its
    /// deployment's breaker (default: off), as resilience4j's
    /// `slowCallDurationThreshold` does: a server that answers ever more
    /// slowly under load is shed — its circuit opens after
    /// `failure_threshold` slow or failed calls, and routing goes to
    /// another deployment — before its answers time out. The call itself
    /// succeeds: the caller gets the answer. An attempt is timed on the
    /// [`env`](Self::env)'s clock from the moment it is sent until its
    /// answer is back; a slow one is reported as
    /// [`Event::SlowCall`](crate::observe::Event::SlowCall).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for `slow_call_threshold` when it is zero (every
    /// answer would be slow), or not shorter than the
    /// [`deadline`](Self::deadline) set before it (no attempt could take
    /// longer, so none would count).
    pub fn slow_call_threshold(mut self, threshold: Duration) -> Result<Self, ConfigError> {
        if threshold.is_zero() {
            return Err(ConfigError::new(
                "slow_call_threshold",
                "positive",
                crate::time::secs(threshold),
            ));
        }
        if self.deadline.is_some_and(|deadline| threshold >= deadline) {
            return Err(ConfigError::new(
                "slow_call_threshold",
                "shorter than the deadline",
                crate::time::secs(threshold),
            ));
        }
        self.slow_call_threshold = Some(threshold);
        Ok(self)
    }

    /// Hedges a call's attempt that has not answered `after` its delay
    /// (default: off): another attempt goes to the next deployment in the
    /// call's order whose breaker (and any cooldown, and its own limit)
    /// admits it, and the first success wins — the other attempts' futures
    /// are dropped, so their connections close and the server stops
    /// generating. At most `max_hedges` hedges per call, each `after` the
    /// attempt sent before it. Each hedge is first withdrawn from the
    /// [`retry_budget`](Self::retry_budget) (set it before or after this),
    /// and a denied withdrawal ends the call's hedging: a fleet whose
    /// servers are all slow hedges less. With no deployment to go to
    /// (one deployment, or every other refusing), nothing is hedged.
    ///
    /// A hedge is not a retry: it does not count against `max_retries`,
    /// and a cancelled attempt reports nothing to its breaker (its
    /// admission is released), while its token reservation is charged its
    /// estimate — the server may have generated before it saw the
    /// disconnect. Each hedge is reported as
    /// [`Event::Hedged`](crate::observe::Event::Hedged). The observed p95
    /// ([`HedgeAfter::ObservedP95`]) is this process's estimate, from its
    /// own answers; the retry budget and the breakers are the fleet's.
    /// Under [`least_loaded`](Self::least_loaded) the call's lease stays at
    /// the deployment it counts at: a hedge is not counted in flight. Under
    /// a [`slow_start`](Self::slow_start), a hedge to a deployment in its
    /// ramp is drawn as an admission is, and never goes where the call's
    /// own draw passed it over.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `hedge_after` (a fixed delay) or
    /// `hedge_floor` (an observed p95's floor) when it is zero, over
    /// [`MAX_HEDGE_DELAY`](crate::provider::MAX_HEDGE_DELAY), or not shorter
    /// than the [`deadline`](Self::deadline) set before it; `hedge_window`
    /// outside [`MIN_HEDGE_WINDOW`](crate::provider::MIN_HEDGE_WINDOW) ..=
    /// [`MAX_HEDGE_WINDOW`](crate::provider::MAX_HEDGE_WINDOW); `max_hedges`
    /// outside 1 ..= [`MAX_HEDGES`](crate::provider::MAX_HEDGES).
    pub fn hedge(mut self, after: HedgeAfter, max_hedges: u32) -> Result<Self, ConfigError> {
        after.validate(max_hedges, self.deadline)?;
        self.hedging = Some((after, max_hedges));
        Ok(self)
    }

    /// Ramps a deployment up after its circuit closes (default: off), as
    /// Envoy's slow-start mode does: for `ramp`'s window after a half-open
    /// circuit closed, a call that deployment admits goes there with
    /// probability [`SlowStart::share`] — from the ramp's floor up to the
    /// whole — drawn from the [`env`](Self::env)'s random source, and
    /// otherwise to the next deployment in the call's order that admits
    /// it. A server that just reloaded its model is not handed its full
    /// load at once and knocked over again.
    ///
    /// The ramp starts at the close the breaker's own atomic step stored
    /// ([`BreakerKeys::closed_at`](crate::decide::breaker::BreakerKeys::closed_at)),
    /// and each admission judges it at the store's instant, so every worker
    /// sharing the breaker's store takes the same share at the same moment.
    /// Each draw is [`Event::SlowStartDraw`](crate::observe::Event::SlowStartDraw).
    ///
    /// It shapes where a call is admitted, not its retries (a retry after a
    /// failure goes where routing sends it), and it never refuses a call:
    /// a call passed on that no other deployment admits goes to the ramping
    /// one after all, as Envoy still sends a host in slow start its scaled
    /// share. With one deployment there is nothing to draw. A backup taking
    /// over from a failed primary takes the calls at once: only a close
    /// starts a ramp.
    pub fn slow_start(mut self, ramp: SlowStart) -> Self {
        self.slow_start = Some(ramp);
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
    /// returned at once. Also the line between a rate limit and a spent
    /// quota: a quota signal asking for up to this long cools the
    /// deployment down for that long, and one asking for more is a **hard
    /// quota** (a daily or monthly limit, a reset hours away) — see
    /// [`max_quota_cooldown`](Self::max_quota_cooldown).
    pub fn max_server_delay(mut self, d: Duration) -> Self {
        self.max_server_delay = d;
        self
    }

    /// How long a deployment whose account is out of quota with no reset
    /// given (`429 insufficient_quota`) cools down, fleet-wide (default
    /// [`DEFAULT_QUOTA_COOLDOWN`], an hour): no call is sent there until it
    /// ends, and a call there goes to another deployment at once. Zero
    /// writes no cooldown.
    pub fn quota_cooldown(mut self, d: Duration) -> Self {
        self.quota_cooldown = d;
        self
    }

    /// The longest cooldown a hard quota writes (default
    /// [`DEFAULT_MAX_QUOTA_COOLDOWN`], a day): a 429 whose reset is further
    /// away than [`max_server_delay`](Self::max_server_delay) cools its
    /// deployment down until that reset, at most this long, instead of for
    /// `max_server_delay` — so routing leaves a spent daily quota at once
    /// and does not come back to it every two minutes.
    pub fn max_quota_cooldown(mut self, d: Duration) -> Self {
        self.max_quota_cooldown = d;
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
    /// default [`default_token_estimate`](super::default_token_estimate) with the inner provider's
    /// `max_tokens`). Estimate from above: a call that uses more than its
    /// estimate is charged the difference, and that is what the budget's
    /// bound allows beyond its limit.
    pub fn token_estimate(mut self, estimate: impl Fn(&ExtractRequest<'_>) -> u64 + Send + Sync + 'static) -> Self {
        self.token_estimate = Some(Arc::new(estimate));
        self
    }

    /// Builds the provider. More than
    /// [`MAX_DEPLOYMENTS`](crate::provider::route::MAX_DEPLOYMENTS) deployments
    /// under least-loaded routing are counted in order instead: the
    /// store's pick weighs at most that many.
    pub fn build(self) -> HardenedProvider<P, L, B> {
        let env = self.env.unwrap_or_default();
        // Made here, once, so the retry loop and routing share them.
        let clock = env.clock().clone();
        let rng = env.rng().clone();
        let observer = env.observer().clone();
        let mut retry = Retry::new(self.policy).env(env);
        if let Some(budget) = self.budget {
            retry = budget(retry);
        }
        let routing = match self.routing {
            Policy::LeastLoaded { .. } if self.deployments.len() > crate::provider::route::MAX_DEPLOYMENTS => {
                Policy::Ordered
            }
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
        let n = self.deployments.len();
        let adaptive = self.adaptive.map(|mut adaptive| {
            adaptive.keys = self
                .deployments
                .iter()
                .map(|d| format!("{}:{}", super::CONCURRENCY_PREFIX, d.breaker.key_prefix()))
                .collect();
            adaptive
        });
        let hedging = self.hedging.map(|(after, max)| Hedging::new(after, max, n));
        HardenedProvider {
            limited: adaptive.is_some() || self.deployments.iter().any(|d| d.limit.is_some()),
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
            quota_cooldown: self.quota_cooldown,
            max_quota_cooldown: self.max_quota_cooldown,
            slow_call_threshold: self.slow_call_threshold,
            hedging,
            slow_start: self.slow_start,
            adaptive,
            token_estimate: self.token_estimate,
            priority: self.priority,
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

    /// Limits each deployment's calls in flight to a number learnt from
    /// its server (default: no limit): each attempt takes a lease under
    /// its deployment's limit before it is sent, and a deployment at its
    /// limit is skipped like one whose own limit refuses — the attempt
    /// goes to the next deployment that admits it, or ends unsent with
    /// [`ExtractError::ConcurrencyLimited`], which the default classifier
    /// retries after the schedule's backoff. An attempt answered with a
    /// 429, a 503 or a timeout multiplies its deployment's limit by
    /// `settings`' backoff; an answer adds `1 / limit` while at least half
    /// the limit is in flight (AIMD, [`crate::decide::concurrency`]). The
    /// limit and the leases live in the first deployment's breaker store
    /// (one atomic step per admission and per end:
    /// [`InFlightStore::concurrency_step`]), so over a shared store the
    /// fleet shares each deployment's limit, and a lease of a worker that
    /// died ends with its [`lease`](AdaptiveConcurrency::lease). Deployments
    /// behind one breaker share one limit.
    pub fn adaptive_concurrency(mut self, settings: AdaptiveConcurrency) -> Self {
        let store: Arc<dyn InFlight> = self.deployments[0].breaker.cache().clone();
        // Read when the provider is built, once every deployment is known.
        self.adaptive = Some(super::concurrency::Adaptive {
            settings,
            store,
            keys: Vec::new(),
        });
        self
    }
}
