//! Routing across deployments: where a hardened provider sends each call,
//! and the least-loaded pick, fleet-wide.
//!
//! A [`HardenedProvider`](crate::provider::HardenedProvider) over several
//! [`Deployment`]s — each a provider with its own circuit breaker and a
//! weight — orders them per call by its policy (in the order given, the
//! first drawn by weight, or the least loaded), calls the first whose
//! circuit admits it, and moves a retry to the next one that admits. A
//! refusal is data from the admission itself, so skipping a deployment costs
//! no extra round trip, and the wait it carries is remembered: a deployment
//! known to refuse is tried last until that wait has passed, and every call
//! that routes past it reports it, with why, so no skip goes unseen.
//!
//! A router that sends each call to the deployment with the fewest calls in
//! flight balances load only if it sees every worker's calls. Counting them
//! in each process sees one process's; counting them in a shared store and
//! then picking is a read-then-write a racing fleet turns into a herd (every
//! worker reads the same counts and picks the same deployment). Here the
//! count, the pick and the new lease are one atomic step in the store
//! ([`InFlightStore::pick_least_loaded`]),
//! deciding by [`least_loaded`](crate::decide::pick::least_loaded), the one definition every adapter runs.
//!
//! Each call in flight is a **lease** at its deployment's key, ended by
//! [`InFlightStore::end_in_flight`]
//! when the call ends; a call whose future is dropped stops counting when its
//! lease runs out, so a crashed worker cannot make a deployment look busy for
//! good.
//!
//! A deployment may also have its **own limit** ([`Deployment::limit`]): a
//! [`RateLimiter`] whose requests and tokens per window every tenant's
//! attempts there share, as a hosted deployment's quota is shared (Azure
//! OpenAI sets tokens and requests per minute per deployment). Each attempt
//! takes a slot there, and under a token budget reserves its estimate in
//! the same atomic step, settled after the attempt to the answer's `usage`;
//! a deployment whose limit refuses is skipped like one whose circuit does.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use crate::breaker::CircuitBreaker;
use crate::cache::{InFlightStore, MemoryCache, TokenStore};
use crate::decide::concurrency::{ConcurrencyCommand, ConcurrencyParams, ConcurrencyStep};
use crate::error::CacheError;
use crate::limiter::{RateLimiter, Reservation, TokenAcquireError};
use crate::provider::BoxFuture;
use crate::tenant::{Priority, TenantId};
use crate::time::Timestamp;

pub(crate) use crate::decide::pick::{MAX_DEPLOYMENTS, Pick, PickRequest};

/// The prefix of the in-flight keys a least-loaded provider counts calls
/// at, one per deployment (`{redstring:in_flight}:kg:circuit:a`). The hash
/// tag keeps them in one slot, as a Redis Cluster's atomic pick needs.
pub const IN_FLIGHT_PREFIX: &str = "{redstring:in_flight}";

/// The tenant a deployment's own limit keys its window by: the nil UUID,
/// under the limit's own key prefix, so every tenant's attempts share it.
pub const DEPLOYMENT_LIMIT_TENANT: TenantId = TenantId::from_u128(0);

/// One place a hardened provider may send a call: a provider, the circuit
/// breaker that guards it (its own key prefix: two deployments sharing a
/// breaker are one deployment to the circuit), its weight, and optionally
/// its own limit.
pub struct Deployment<P, B = MemoryCache> {
    pub(crate) inner: P,
    pub(crate) breaker: Arc<CircuitBreaker<B>>,
    pub(crate) weight: u32,
    pub(crate) limit: Option<Arc<dyn Limit>>,
    /// The provider account whose quota it spends, if it shares one with
    /// other deployments (see [`Deployment::quota_group`]).
    pub(crate) quota_group: Option<Arc<str>>,
    /// Until when (µs on the provider's clock) this deployment's last
    /// admission said it refuses; zero when it admitted. Only a hint: a
    /// deployment known to refuse is tried last, never skipped.
    refused_until: AtomicU64,
    /// Why it refuses: a [`Deferral`] as its `u8`.
    refused_why: AtomicU8,
}

/// Why a deployment is known to refuse, and so is asked last: the state a
/// call routing past it reports ([`Event::DeploymentDeferred`](crate::observe::Event::DeploymentDeferred)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Deferral {
    /// Its circuit is open.
    Open = 1,
    /// A quota signal's shared cooldown is in force.
    Cooldown = 2,
    /// Its own limit refused.
    Limited = 3,
    /// Its server answered about itself (its quota, its key, its model).
    Unusable = 4,
}

impl Deferral {
    /// The spelling events use.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Deferral::Open => "open",
            Deferral::Cooldown => "cooldown",
            Deferral::Limited => "limited",
            Deferral::Unusable => "unusable",
        }
    }

    fn from_u8(n: u8) -> Option<Deferral> {
        [
            Deferral::Open,
            Deferral::Cooldown,
            Deferral::Limited,
            Deferral::Unusable,
        ]
        .into_iter()
        .find(|d| *d as u8 == n)
    }
}

impl<P: fmt::Debug, B> fmt::Debug for Deployment<P, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deployment")
            .field("inner", &self.inner)
            .field("breaker", &self.breaker)
            .field("weight", &self.weight)
            .field("limit", &self.limit.as_ref().map(|l| l.name()))
            .field("quota_group", &self.quota_group)
            .finish_non_exhaustive()
    }
}

impl<P, B> Deployment<P, B> {
    /// `inner` behind `breaker`, at weight 1.
    pub fn new(inner: P, breaker: Arc<CircuitBreaker<B>>) -> Self {
        Deployment {
            inner,
            breaker,
            weight: 1,
            limit: None,
            quota_group: None,
            refused_until: AtomicU64::new(0),
            refused_why: AtomicU8::new(0),
        }
    }

    /// The deployment's own limit, shared by every tenant (default: none):
    /// each attempt sent here takes one of `limiter`'s requests per window,
    /// keyed by [`DEPLOYMENT_LIMIT_TENANT`] under its key prefix, and — when
    /// it has [`tokens_per_window`](crate::RateLimiterBuilder::tokens_per_window)
    /// — reserves the attempt's token estimate in the same atomic step,
    /// settled after the attempt to the answer's `usage` (released when the
    /// server certainly generated nothing, kept at the estimate when it may
    /// have). An attempt the limit refuses goes to the next deployment that
    /// admits it, and is never sent here. Give each deployment its own key
    /// prefix; deployments given the same limiter share one limit. Over a
    /// shared cache the limit is the fleet's.
    pub fn limit<S: TokenStore + 'static>(mut self, limiter: Arc<RateLimiter<S>>) -> Self {
        self.limit = Some(limiter);
        self
    }

    /// The provider account this deployment's key belongs to, when several
    /// deployments are keys of one account (default: none, a quota of its
    /// own). Deployments of one group share a spent quota: when one hears
    /// that the account's quota is spent (`insufficient_quota`, or a limit
    /// whose reset is further away than
    /// [`max_server_delay`](crate::provider::HardenedProviderBuilder::max_server_delay)),
    /// every deployment of the group in that provider cools down until the
    /// reset — each breaker's fleet-wide cooldown, so no worker sharing
    /// those breakers sends the account's other keys a request the account
    /// must refuse. A member whose breaker a deployment outside the group
    /// shares is left alone: that deployment's quota is not spent. What is said of one key
    /// only stays with that key: a per-minute rate limit cools it alone, and
    /// an error about the key itself (a revoked key, an unknown model)
    /// defers it alone.
    pub fn quota_group(mut self, group: impl Into<Arc<str>>) -> Self {
        self.quota_group = Some(group.into());
        self
    }

    /// The account whose quota this deployment spends, if it shares one.
    pub fn group(&self) -> Option<&str> {
        self.quota_group.as_deref()
    }

    /// Its share of calls under weighted and least-loaded routing (default
    /// 1). Weight 0 is never chosen first, only fallen over to.
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// The provider.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// The breaker guarding it.
    pub fn breaker(&self) -> &Arc<CircuitBreaker<B>> {
        &self.breaker
    }

    /// Whether its last admission refused until after `now`.
    pub(crate) fn known_to_refuse(&self, now: Timestamp) -> bool {
        self.refused_until.load(Ordering::Relaxed) > now.as_micros()
    }

    /// Why and until when this deployment is known to refuse at `now`.
    pub(crate) fn deferral(&self, now: Timestamp) -> Option<(Deferral, Timestamp)> {
        let until = self.refused_until.load(Ordering::Relaxed);
        (until > now.as_micros())
            .then(|| Deferral::from_u8(self.refused_why.load(Ordering::Relaxed)))
            .flatten()
            .map(|why| (why, Timestamp::from_micros(until)))
    }

    /// Remembers what an admission at `now` said: refused for `wait` and
    /// why (a zero wait says nothing), or admitted.
    pub(crate) fn heard(&self, now: Timestamp, refused_for: Option<(Duration, Deferral)>) {
        match refused_for {
            Some((wait, why)) if !wait.is_zero() => {
                self.refused_why.store(why as u8, Ordering::Relaxed);
                self.refused_until
                    .store(now.saturating_add(wait).as_micros(), Ordering::Relaxed);
            }
            Some(_) => {}
            None => self.refused_until.store(0, Ordering::Relaxed),
        }
    }
}

/// How a hardened provider chooses the deployment a call tries first; the
/// rest follow in the order they were given (those known to refuse last).
pub(crate) enum Policy {
    /// The first in the order given: fallback.
    Ordered,
    /// Drawn by weight from the provider's random source.
    Weighted,
    /// The fewest calls in flight per weight, fleet-wide, in one atomic
    /// step of the store.
    LeastLoaded {
        /// Where the calls in flight are counted.
        store: Arc<dyn InFlight>,
        /// How long a call counts unless it ends first.
        lease: Duration,
    },
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Ordered => f.write_str("Ordered"),
            Policy::Weighted => f.write_str("Weighted"),
            Policy::LeastLoaded { lease, .. } => f.debug_struct("LeastLoaded").field("lease", lease).finish(),
        }
    }
}

/// A deployment's own limit behind a trait object, so a deployment's type
/// does not name the store it counts in.
pub(crate) trait Limit: Send + Sync {
    /// Its key prefix, naming it in errors and events.
    fn name(&self) -> &str;

    /// Whether it limits tokens, so attempts need an estimate.
    fn counts_tokens(&self) -> bool;

    /// Takes one attempt's slot as a caller of `priority`, and reserves
    /// `estimate` tokens with it when it limits tokens.
    fn take(&self, estimate: u64, priority: Priority) -> BoxFuture<'_, Result<Option<Reservation>, TokenAcquireError>>;

    /// Settles an attempt's reservation to what it used.
    fn settle<'a>(&'a self, reservation: &'a Reservation, actual: u64) -> BoxFuture<'a, Result<bool, CacheError>>;
}

impl<S: TokenStore + 'static> Limit for RateLimiter<S> {
    fn name(&self) -> &str {
        self.key_prefix()
    }

    fn counts_tokens(&self) -> bool {
        self.tokens_per_window().is_some()
    }

    fn take(&self, estimate: u64, priority: Priority) -> BoxFuture<'_, Result<Option<Reservation>, TokenAcquireError>> {
        Box::pin(async move {
            if self.counts_tokens() {
                self.acquire_tokens_as(DEPLOYMENT_LIMIT_TENANT, estimate, priority)
                    .await
                    .map(|admission| admission.reservation)
            } else {
                match self.acquire_as(DEPLOYMENT_LIMIT_TENANT, priority).await {
                    Ok(_) => Ok(None),
                    Err(crate::limiter::AcquireError::Limited(refusal)) => Err(TokenAcquireError::Limited(refusal)),
                    Err(crate::limiter::AcquireError::Cache(e)) => Err(TokenAcquireError::Cache(e)),
                }
            }
        })
    }

    fn settle<'a>(&'a self, reservation: &'a Reservation, actual: u64) -> BoxFuture<'a, Result<bool, CacheError>> {
        Box::pin(RateLimiter::settle(self, DEPLOYMENT_LIMIT_TENANT, reservation, actual))
    }
}

/// An [`InFlightStore`] behind a trait object, so a provider's type does not
/// name the store its routing counts calls in.
pub(crate) trait InFlight: Send + Sync {
    /// [`InFlightStore::pick_least_loaded`].
    fn pick<'a>(
        &'a self,
        keys: &'a [&'a str],
        weights: &'a [u32],
        request: PickRequest,
    ) -> BoxFuture<'a, Result<Pick, CacheError>>;

    /// [`InFlightStore::end_in_flight`].
    fn end<'a>(&'a self, key: &'a str, id: u64) -> BoxFuture<'a, Result<(), CacheError>>;

    /// [`InFlightStore::concurrency_step`].
    fn concurrency<'a>(
        &'a self,
        key: &'a str,
        command: ConcurrencyCommand,
        params: ConcurrencyParams,
        request: PickRequest,
    ) -> BoxFuture<'a, Result<ConcurrencyStep, CacheError>>;
}

impl<S: InFlightStore> InFlight for S {
    fn pick<'a>(
        &'a self,
        keys: &'a [&'a str],
        weights: &'a [u32],
        request: PickRequest,
    ) -> BoxFuture<'a, Result<Pick, CacheError>> {
        Box::pin(self.pick_least_loaded(keys, weights, request))
    }

    fn end<'a>(&'a self, key: &'a str, id: u64) -> BoxFuture<'a, Result<(), CacheError>> {
        Box::pin(self.end_in_flight(key, id))
    }

    fn concurrency<'a>(
        &'a self,
        key: &'a str,
        command: ConcurrencyCommand,
        params: ConcurrencyParams,
        request: PickRequest,
    ) -> BoxFuture<'a, Result<ConcurrencyStep, CacheError>> {
        Box::pin(self.concurrency_step(key, command, params, request))
    }
}

/// The deployments in the order a call tries them, at `now`: those not
/// known to refuse first, then those known to, each in the order given,
/// with the deployment at `first` (when chosen) moved to the front.
pub(crate) fn call_order<P, B>(deployments: &[Deployment<P, B>], now: Timestamp, first: Option<usize>) -> Vec<usize> {
    let refusing = |i: &usize| deployments[*i].known_to_refuse(now);
    let mut order: Vec<usize> = (0..deployments.len()).filter(|i| !refusing(i)).collect();
    order.extend((0..deployments.len()).filter(refusing));
    if let Some(first) = first
        && let Some(at) = order.iter().position(|&i| i == first)
    {
        order[..=at].rotate_right(1);
    }
    order
}

/// The weights a policy chooses by at `now`: each deployment's own, and 0
/// for those known to refuse — unless every deployment is known to refuse,
/// when all weigh their own. (Live deployments all of weight 0 leave no
/// choice: the call then goes in order, the live ones first.)
pub(crate) fn live_weights<P, B>(deployments: &[Deployment<P, B>], now: Timestamp) -> Vec<u32> {
    if deployments.iter().all(|d| d.known_to_refuse(now)) {
        return deployments.iter().map(|d| d.weight).collect();
    }
    deployments
        .iter()
        .map(|d| if d.known_to_refuse(now) { 0 } else { d.weight })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployments_known_to_refuse_go_last_and_the_chosen_one_first() {
        let breaker = Arc::new(CircuitBreaker::builder().build().unwrap());
        let deployments: Vec<Deployment<(), MemoryCache>> =
            (0..4).map(|_| Deployment::new((), breaker.clone())).collect();
        let now = Timestamp::from_secs(100);
        assert_eq!(call_order(&deployments, now, None), [0, 1, 2, 3]);
        deployments[1].heard(now, Some((Duration::from_secs(5), Deferral::Open)));
        assert_eq!(call_order(&deployments, now, None), [0, 2, 3, 1]);
        assert_eq!(
            deployments[1].deferral(now),
            Some((Deferral::Open, Timestamp::from_secs(105)))
        );
        assert_eq!(deployments[0].deferral(now), None);
        assert_eq!(call_order(&deployments, now, Some(3)), [3, 0, 2, 1]);
        assert_eq!(live_weights(&deployments, now), [1, 0, 1, 1]);
        // The hint ends with the refusal's wait, or with an admission.
        assert_eq!(call_order(&deployments, Timestamp::from_secs(105), None), [0, 1, 2, 3]);
        deployments[1].heard(now, None);
        assert_eq!(call_order(&deployments, now, None), [0, 1, 2, 3]);
        // A refusal with no estimate says nothing.
        deployments[2].heard(now, Some((Duration::ZERO, Deferral::Cooldown)));
        assert_eq!(call_order(&deployments, now, None), [0, 1, 2, 3]);
        // When every one refuses, the weights are their own.
        for d in &deployments {
            d.heard(now, Some((Duration::from_secs(1), Deferral::Limited)));
        }
        assert_eq!(live_weights(&deployments, now), [1, 1, 1, 1]);
    }
}
