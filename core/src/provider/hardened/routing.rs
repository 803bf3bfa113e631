//! Where a call goes: its route over the deployments, planned by the
//! routing policy, admitted by their breakers, placed attempt by attempt
//! within their own limits and the waits their servers asked for, and the
//! fleet-wide in-flight lease that follows it.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::HardenedProvider;
use super::call::Call;
use super::report::BreakerReport;
use super::tokens::Slot;
use crate::breaker::{BreakerAdmission, CircuitOpen, Permit, Refusal};
use crate::cache::{BreakerStore, TokenStore};
use crate::decide::pick::weighted_pick;
use crate::observe::Event;
use crate::provider::route::{Deferral, IN_FLIGHT_PREFIX, PickRequest, Policy, call_order, live_weights};
use crate::provider::{ExtractError, Extracted, LlmProvider, ProviderError};
use crate::time::Timestamp;

/// One call's route: the deployments in the order it tries them, the
/// admissions it holds, where its attempts go now, and its in-flight lease.
pub(super) struct CallRoute {
    /// Deployment indices, in the order this call tries them.
    pub(super) order: Vec<usize>,
    /// The position in `order` of the deployment attempts go to.
    pub(super) at: usize,
    /// The admission held from each breaker, by the index of the first
    /// deployment behind it (`holders`).
    pub(super) held: Vec<Option<Permit>>,
    /// What each breaker hears for the call, from the last attempt at a
    /// deployment behind it (same index as `held`).
    pub(super) reports: Vec<Option<BreakerReport>>,
    /// The least-loaded lease: the deployment it counts at, and its id.
    pub(super) lease: Option<(usize, u64)>,
    /// Refusals by deployments' own limits slept off so far.
    pub(super) limit_waits: u32,
    /// Until when each breaker's server asked this call to wait
    /// (`Retry-After`), from the last attempt at a deployment behind it
    /// (same index as `held`): a retry that comes back there sleeps it off
    /// first, as a retry at one deployment would.
    pub(super) asked: Vec<Option<Timestamp>>,
    /// Shared cooldowns and asked waits slept off so far in this call.
    pub(super) cooldown_waits: u32,
    /// Set when a retry found nowhere to go but a deployment whose asked
    /// wait it could not sleep (over `max_server_delay`, or past the
    /// deadline): that wait, for the retry loop's verdict.
    pub(super) stuck: Option<Duration>,
    /// The breakers (same index as `held`) whose deployment a slow start's
    /// draw passed the call over: no hedge goes there.
    pub(super) passed: Vec<bool>,
    /// The breakers (same index as `held`) whose admission the call keeps
    /// though its deployment's adaptive concurrency limit refused an
    /// attempt there: room comes back as calls end, and a retry that comes
    /// back takes no second admission (one a breaker per call). Released
    /// with the call's reports.
    pub(super) kept: Vec<bool>,
}

impl CallRoute {
    /// A route over `n` deployments, before the call's plan: the primary
    /// first, nothing held.
    pub(super) fn new(n: usize) -> Self {
        CallRoute {
            order: vec![0],
            at: 0,
            held: vec![None; n],
            reports: vec![None; n],
            lease: None,
            limit_waits: 0,
            asked: vec![None; n],
            cooldown_waits: 0,
            stuck: None,
            passed: vec![false; n],
            kept: vec![false; n],
        }
    }

    /// The deployment attempts go to.
    pub(super) fn current(&self) -> usize {
        self.order[self.at]
    }
}

/// Why a retry's placement holds back from a deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hold {
    /// Its own limit refused the attempt.
    Limit,
    /// Its server asked the call's last attempt to wait (`Retry-After`).
    Asked,
}

/// Whether a refusal's `wait` ends sooner than `known`'s: a zero wait
/// (unknown, or a probe due at any moment) is never sooner, and any known
/// wait is sooner than a zero one — so a call refused everywhere is handed
/// back the soonest instant a deployment admits again.
fn sooner(wait: Duration, known: Duration) -> bool {
    !wait.is_zero() && (known.is_zero() || wait < known)
}

impl<P: LlmProvider, L: TokenStore, B: BreakerStore> Call<'_, P, L, B> {
    /// The call's route before its admission: every deployment, the first
    /// chosen by the policy (the least-loaded pick also leases the call
    /// there), the rest in order, those known to refuse last.
    pub(super) async fn plan(&mut self) {
        let p = self.provider;
        let n = p.deployments.len();
        if n == 1 && !matches!(p.policy, Policy::LeastLoaded { .. }) {
            return;
        }
        let deadline = self.deadline;
        let now = p.clock.now();
        let first = match &p.policy {
            Policy::Ordered => None,
            Policy::Weighted => weighted_pick(&live_weights(&p.deployments, now), p.rng.next_u64()),
            Policy::LeastLoaded { store, lease } => {
                let weights = live_weights(&p.deployments, now);
                let keys: Vec<&str> = p.in_flight_keys.iter().map(String::as_str).collect();
                let id = p.rng.next_u64();
                let request = PickRequest {
                    now,
                    id,
                    lease: p.lease_for(*lease, deadline),
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
                            self.route.lease = Some((index, id));
                            Some(index)
                        }
                        Err(error) => {
                            p.observer.on_event(&Event::CacheUnavailable {
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
        self.route.order = call_order(&p.deployments, now, first);
        p.report_deferred(&self.route.order, now);
    }

    /// The first admission of the call: each deployment in the route's
    /// order until one admits (a refusal is remembered, and costs nothing
    /// more than the admission that said it). Under a slow start, a
    /// deployment in its ramp that admits the call takes it only when the
    /// draw falls within its share; otherwise the call is offered on, and
    /// comes back to the first one passed over when no other admits. When
    /// all refuse and the soonest to admit again is a shared cooldown, up
    /// to `cooldown_waits` of them are slept off within the deadline;
    /// otherwise that refusal is the call's error.
    pub(super) async fn admit(&mut self) -> Result<(), ExtractError> {
        let p = self.provider;
        loop {
            // The refusal that ends soonest (an unknown, zero wait last), the first on a tie.
            let mut soonest: Option<(usize, Duration, Refusal)> = None;
            // The first deployment a slow start passed the call over, with its admission.
            let mut passed: Option<(usize, Permit)> = None;
            for at in 0..self.route.order.len() {
                let i = self.route.order[at];
                if self.route.passed[p.holders[i]] {
                    // Its breaker admitted the call already and the draw
                    // passed it over: one admission and one draw a breaker.
                    continue;
                }
                let deployment = &p.deployments[i];
                let admission = deployment.breaker.admit_since().await;
                let permit = admission.permit;
                let Permit::Refused {
                    state,
                    retry_after,
                    reason,
                } = permit
                else {
                    p.hear(i, None);
                    if !p.ramp_takes(i, &admission) {
                        // Held, so a retry that comes here is not admitted twice.
                        self.route.held[p.holders[i]] = Some(permit);
                        self.route.passed[p.holders[i]] = true;
                        passed = passed.or(Some((at, permit)));
                        continue;
                    }
                    self.take_admission(at, permit, if passed.is_some() { "ramping" } else { "refused" })
                        .await;
                    return Ok(());
                };
                p.hear_refusal(i, state, reason, retry_after);
                if soonest.is_none_or(|(_, wait, _)| sooner(retry_after, wait)) {
                    soonest = Some((i, retry_after, reason));
                }
            }
            if let Some((at, permit)) = passed {
                // No other deployment admits it: the ramping one takes it.
                self.take_admission(at, permit, "refused").await;
                return Ok(());
            }
            let Some((i, retry_after, reason)) = soonest else {
                return Err(CircuitOpen::new("no deployment to call", Duration::ZERO).into());
            };
            let fits = self
                .deadline
                .is_none_or(|d| retry_after <= d.saturating_duration_since(p.clock.now()));
            // The call's first admission: every cooldown wait so far was slept here.
            let waits = self.route.cooldown_waits;
            // A cooldown longer than any wait a server may ask for (a spent
            // quota's) is not slept off: the call ends, told when it resets.
            let sleepable = reason == Refusal::Cooldown && !retry_after.is_zero() && retry_after <= p.max_server_delay;
            if !sleepable || waits >= p.cooldown_waits || !fits {
                // The call ends with this refusal: its events name this deployment.
                self.route.at = self.route.order.iter().position(|&j| j == i).unwrap_or(0);
                return Err(CircuitOpen::refused(p.deployments[i].inner.model(), retry_after, reason).into());
            }
            self.route.cooldown_waits = waits + 1;
            p.observer.on_event(&Event::CooldownWait {
                model: p.model_of(i),
                tenant: p.tenant,
                wait: retry_after,
                waits: waits + 1,
            });
            p.clock.sleep(retry_after).await;
        }
    }

    /// Holds `permit`, the admission of the deployment at position `at` of
    /// the call's order, as the call's: attempts go there, and a call moved
    /// off the first deployment tells why and moves its lease.
    async fn take_admission(&mut self, at: usize, permit: Permit, why: &'static str) {
        let p = self.provider;
        let i = self.route.order[at];
        self.route.at = at;
        self.route.held[p.holders[i]] = Some(permit);
        if at > 0 {
            p.rerouted(self.route.order[0], i, why);
            self.route.lease = p.follow_lease(self.route.lease.take(), i, self.deadline).await;
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
    pub(super) async fn place(&mut self, retry: bool) -> Result<Slot, ExtractError> {
        let p = self.provider;
        let deadline = self.deadline;
        let (from, start, n) = (self.route.current(), self.route.at, self.route.order.len());
        if !p.limited && (!retry || n == 1) {
            return Ok(Slot::default());
        }
        // A retry asks the others first and its own deployment last.
        let steps = if retry { 1..n + 1 } else { 0..n };
        loop {
            // The refusal that ends soonest (no wait last), the first on a
            // tie — a limit's, or the wait a server asked the last attempt
            // for — and, should neither have been met, a breaker's.
            let mut soonest: Option<(usize, ExtractError, Option<Duration>, Hold)> = None;
            // The breaker refusal that ends soonest, by the same rule.
            let mut circuit: Option<(Duration, ExtractError)> = None;
            for step in steps.clone() {
                let at = (start + step) % n;
                let i = self.route.order[at];
                let held = self.route.held[p.holders[i]].is_some();
                if let Some(wait) = self.asked_wait(i) {
                    // Its server asked to be left alone for `wait`: it is
                    // not called before then.
                    if soonest
                        .as_ref()
                        .is_none_or(|(_, _, known, _)| known.is_none_or(|k| wait < k))
                    {
                        let refusal = CircuitOpen::refused(p.deployments[i].inner.model(), wait, Refusal::Cooldown);
                        soonest = Some((i, refusal.into(), Some(wait), Hold::Asked));
                    }
                    continue;
                }
                let mut admitted_now = None;
                if !held {
                    let permit = p.deployments[i].breaker.admit().await;
                    if let Permit::Refused {
                        state,
                        retry_after,
                        reason,
                    } = permit
                    {
                        p.hear_refusal(i, state, reason, retry_after);
                        if circuit.as_ref().is_none_or(|(wait, _)| sooner(retry_after, *wait)) {
                            let refusal = CircuitOpen::refused(p.deployments[i].inner.model(), retry_after, reason);
                            circuit = Some((retry_after, refusal.into()));
                        }
                        continue;
                    }
                    p.hear(i, None);
                    self.route.held[p.holders[i]] = Some(permit);
                    admitted_now = Some(permit);
                }
                match p.take_limit(i, &self.request).await {
                    Ok(slot) => {
                        if i != from {
                            if p.holders[i] != p.holders[from] {
                                self.hand_back_unused(from).await;
                            }
                            self.route.at = at;
                            p.rerouted(from, i, if retry { "failed" } else { "limited" });
                            self.route.lease = p.follow_lease(self.route.lease.take(), i, deadline).await;
                        }
                        return Ok(slot);
                    }
                    Err((error, wait)) => {
                        if let Some(wait) = wait {
                            p.hear(i, Some((wait, Deferral::Limited)));
                        }
                        if matches!(error, ExtractError::ConcurrencyLimited(_)) {
                            self.route.kept[p.holders[i]] = true;
                        } else if let Some(permit) = admitted_now {
                            self.route.held[p.holders[i]] = None;
                            p.report_to_breaker(&p.deployments[i].breaker, &permit, BreakerReport::Release)
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
                return Err(circuit.map_or_else(
                    || CircuitOpen::new("no deployment to call", Duration::ZERO).into(),
                    |(_, refusal)| refusal,
                ));
            };
            let fits = |w: Duration| deadline.is_none_or(|d| w <= d.saturating_duration_since(p.clock.now()));
            let (waits, cooldown_waits) = (self.route.limit_waits, self.route.cooldown_waits);
            match (wait, hold) {
                // As the retry at one deployment would: a wait over
                // `max_server_delay` or past the deadline is not slept.
                (Some(wait), Hold::Asked) if wait <= p.max_server_delay && fits(wait) => {
                    self.route.cooldown_waits = cooldown_waits + 1;
                    p.observer.on_event(&Event::CooldownWait {
                        model: p.model_of(i),
                        tenant: p.tenant,
                        wait,
                        waits: cooldown_waits + 1,
                    });
                    p.clock.sleep(wait).await;
                }
                (Some(wait), Hold::Limit) if waits < p.limiter_waits && !wait.is_zero() && fits(wait) => {
                    self.route.limit_waits = waits + 1;
                    self.hand_back_unused(from).await;
                    p.observer.on_event(&Event::RateLimitWait {
                        model: p.model_of(i),
                        tenant: p.tenant,
                        wait,
                        waits: waits + 1,
                    });
                    p.clock.sleep(wait).await;
                }
                (wait, hold) => {
                    if hold == Hold::Asked {
                        self.route.stuck = wait;
                        // A breaker that admits again sooner than the
                        // server's wait ends is when the call may come back.
                        if let (Some(asked), Some((refused, _))) = (wait, &circuit)
                            && sooner(*refused, asked)
                        {
                            return Err(circuit.map_or(error, |(_, refusal)| refusal));
                        }
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
    pub(super) fn heed(&mut self, at: usize, result: &Result<Extracted<Value>, ExtractError>) {
        let p = self.provider;
        let error = result.as_ref().err();
        let asked = error
            .and_then(|e| p.server_wait(e))
            .map(|wait| p.clock.now().saturating_add(wait));
        self.route.asked[p.holders[at]] = asked;
        // A spent quota's cooldown, heard when the attempt ended, already
        // says for how long: an unusable deferral would cut it short.
        let spent = match error {
            Some(ExtractError::Provider(ProviderError::QuotaExhausted { retry_after, .. })) => {
                !p.spent_cooldown(*retry_after).0.is_zero()
            }
            _ => false,
        };
        if !spent && error.is_some_and(|e| p.about_deployment(e)) {
            p.hear(
                at,
                Some((p.deployments[at].breaker.params().recovery_timeout, Deferral::Unusable)),
            );
        }
    }

    /// The rest of the wait the server behind deployment `i`'s breaker
    /// asked the call's last attempt there for, if it has not passed.
    pub(super) fn asked_wait(&self, i: usize) -> Option<Duration> {
        let p = self.provider;
        let until = self.route.asked[p.holders[i]]?;
        let left = until.saturating_duration_since(p.clock.now());
        (!left.is_zero()).then_some(left)
    }

    /// Hands back the call's admission at deployment `i` when no attempt
    /// was sent there (its breaker has nothing to hear), so a probe is not
    /// held while the call is elsewhere or asleep — unless the call keeps
    /// it for a retry after an adaptive concurrency refusal
    /// ([`CallRoute::kept`]).
    async fn hand_back_unused(&mut self, i: usize) {
        let p = self.provider;
        let h = p.holders[i];
        if self.route.kept[h]
            || matches!(
                self.route.reports[h],
                Some(BreakerReport::Success | BreakerReport::Failure)
            )
        {
            return;
        }
        if let Some(permit) = self.route.held[h].take() {
            p.report_to_breaker(&p.deployments[i].breaker, &permit, BreakerReport::Release)
                .await;
        }
    }
}

impl<P: LlmProvider, L: TokenStore, B: BreakerStore> HardenedProvider<P, L, B> {
    /// Reports each deployment a call's order asks last because it is known
    /// to refuse — those after the first one not known to: the call passes
    /// over them unless every other refuses, and the events say so, naming
    /// each and why.
    pub(super) fn report_deferred(&self, order: &[usize], now: Timestamp) {
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

    /// Moves a call's least-loaded `lease` to deployment `to`, so the
    /// fleet's counts follow where the call really is; the lease it holds
    /// then.
    pub(super) async fn follow_lease(
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
    pub(super) async fn end_lease(&self, lease: Option<(usize, u64)>) {
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

    /// Remembers what deployment `i`'s admission said (see
    /// [`Deployment::heard`](crate::provider::route::Deployment::heard)); with one deployment there is nothing to order.
    pub(super) fn hear(&self, i: usize, refused_for: Option<(Duration, Deferral)>) {
        if self.deployments.len() > 1 {
            self.deployments[i].heard(self.clock.now(), refused_for);
        }
    }

    /// Remembers a refusal by deployment `i`'s breaker: one by an open
    /// circuit or a cooldown, whose wait is when it may admit again. A
    /// half-open circuit's wait is only until a live probe's lease ends —
    /// the probe may close it at any moment — so it is not remembered.
    pub(super) fn hear_refusal(&self, i: usize, state: crate::breaker::CircuitState, reason: Refusal, wait: Duration) {
        if reason == Refusal::Cooldown {
            self.hear(i, Some((wait, Deferral::Cooldown)));
        } else if state == crate::breaker::CircuitState::Open {
            self.hear(i, Some((wait, Deferral::Open)));
        }
    }

    /// Whether deployment `i`, which just admitted a call, takes it under
    /// the slow start: always, unless it is in its ramp (its circuit closed
    /// less than the window ago, judged at the admission's instant) and the
    /// provider has another breaker's deployment to offer the call to; then only when
    /// a draw from the provider's random source falls within the ramp's
    /// share, and every draw is reported.
    pub(super) fn ramp_takes(&self, i: usize, admission: &BreakerAdmission) -> bool {
        let (Some(ramp), Some(closed_at)) = (self.slow_start, admission.closed_at) else {
            return true;
        };
        let alone = self.holders.iter().all(|&h| h == self.holders[i]);
        if alone || crate::mutants::active(crate::mutants::Mutant::SlowStartIgnored) {
            return true;
        }
        let Some(share) = ramp.share(closed_at, admission.at) else {
            return true;
        };
        let draw = crate::decide::ramp::draw_share(self.rng.next_u64());
        self.observer.on_event(&Event::SlowStartDraw {
            breaker: Arc::from(self.deployments[i].breaker.key_prefix()),
            tenant: self.tenant,
            closed_at,
            at: admission.at,
            share,
            draw,
        });
        crate::decide::ramp::takes(share, draw)
    }

    /// Tells the observer a call moved from deployment `from` to `to`.
    pub(super) fn rerouted(&self, from: usize, to: usize, reason: &'static str) {
        self.observer.on_event(&Event::Rerouted {
            tenant: self.tenant,
            from: Arc::from(self.deployments[from].breaker.key_prefix()),
            to: Arc::from(self.deployments[to].breaker.key_prefix()),
            reason,
        });
    }
}
