//! One call through a [`HardenedProvider`], as a value: [`Call`] owns the
//! call's route, its reservation and its counters, and steps from
//! admission through its attempts to its reports, asking the retry policy
//! and budget for each next step directly. Nothing per call sits behind a
//! lock or inside a closure. An attempt is sent by
//! [`HardenedProvider::attempt`], which reads nothing of the call: what it
//! said is folded into the call after it ends ([`Call::absorb`]), so a
//! call can hold more than one attempt in flight.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tracing::Instrument;

use super::concurrency::call_end;
use super::report::{BreakerReport, CallEnd};
use super::routing::CallRoute;
use super::tokens::{Slot, answer_tokens, may_have_spent};
use super::{HardenedProvider, OPERATION};
#[cfg(feature = "mutants")]
use crate::breaker::{CircuitOpen, Permit};
use crate::cache::{BreakerStore, TokenStore};
#[cfg(feature = "mutants")]
use crate::limiter::AcquireError;
use crate::limiter::Reservation;
use crate::observe::Event;
use crate::provider::error::{DeadlineExceeded, DeadlineWait};
use crate::provider::route::Deferral;
use crate::provider::{ExtractError, ExtractRequest, Extracted, LlmProvider, ProviderError, spans};
use crate::retry::{RetryDenied, RetryError, RetryExhausted, Retryable};
use crate::time::Timestamp;

/// One call: where it is in its route, what it reserved, how many
/// attempts it made and how it will end.
pub(super) struct Call<'a, P, L, B> {
    pub(super) provider: &'a HardenedProvider<P, L, B>,
    pub(super) request: ExtractRequest<'a>,
    /// When the call must be over, from the provider's deadline and the
    /// caller's timeout; set once the call starts.
    pub(super) deadline: Option<Timestamp>,
    pub(super) route: CallRoute,
    /// The tenant's token reservation, settled when the call ends.
    reservation: Option<Reservation>,
    /// Attempts the retry schedule counted: each placement, sent or not.
    pub(super) tries: u32,
    /// Failed (or cancelled) attempts the server may have generated tokens
    /// for, each charged the estimate besides the answer.
    pub(super) spent: u32,
    /// Hedges sent so far; set to the most allowed when the retry budget
    /// denies one, which ends the call's hedging.
    pub(super) hedges: u32,
    /// The call's end, told once: by [`run`](Self::run), or by the drop
    /// of a call its caller abandoned.
    pub(super) end: CallEnd<'a>,
}

impl<'a, P: LlmProvider, L: TokenStore, B: BreakerStore> Call<'a, P, L, B> {
    /// A call of `request` on `provider`, started now (its observer hears
    /// so) and told on `span`.
    pub(super) fn new(
        provider: &'a HardenedProvider<P, L, B>,
        request: ExtractRequest<'a>,
        span: tracing::Span,
    ) -> Self {
        Call {
            provider,
            request,
            deadline: None,
            route: CallRoute::new(provider.deployments.len()),
            reservation: None,
            tries: 0,
            spent: 0,
            hedges: 0,
            end: CallEnd::start(provider, span),
        }
    }

    /// Runs the call to its end; `timeout`, a caller's bound on the whole
    /// call, tightens the deadline.
    pub(super) async fn run(mut self, timeout: Option<Duration>) -> Result<Extracted<Value>, ExtractError> {
        let result = self.steps(timeout).await;
        #[cfg(feature = "mutants")]
        let result = withheld(result);
        let model = self.provider.deployments[self.route.current()].inner.model();
        self.end.finish(&result, model);
        result
    }

    /// Admission, the tenant's allowance, then attempts until the retry
    /// schedule ends the call, then one report to each breaker.
    async fn steps(&mut self, timeout: Option<Duration>) -> Result<Extracted<Value>, ExtractError> {
        let p = self.provider;
        if self.request.is_blank() {
            return Err(ProviderError::BlankText.into());
        }
        let start = p.clock.now();
        self.deadline = match (p.deadline, timeout) {
            (Some(a), Some(b)) => Some(start.saturating_add(a.min(b))),
            (budget, timeout) => budget.or(timeout).map(|t| start.saturating_add(t)),
        };

        self.plan().await;
        if let Err(refused) = self.admit().await {
            p.end_lease(self.route.lease.take()).await;
            return Err(refused);
        }
        match p.acquire(self.deadline, &self.request, self.route.current()).await {
            Ok(reservation) => self.reservation = reservation,
            Err(e) => {
                self.report_all(BreakerReport::Release).await;
                return Err(e);
            }
        }

        p.retry.begin().await;
        let (result, report) = loop {
            self.tries = self.tries.saturating_add(1);
            let error = match self.try_once().await {
                Ok(answer) => break (Ok(answer), BreakerReport::Success),
                Err(error) => error,
            };
            let verdict = self.classify_routed(&error);
            if let Err(end) = p
                .retry
                .back_off(self.tries, error, verdict, self.deadline, OPERATION)
                .await
            {
                break self.conclude(end);
            }
        };
        if let Some(reservation) = self.reservation.take() {
            p.settle_tokens(&reservation, &result, self.spent).await;
        }
        self.report_all(report).await;
        result
    }

    /// One step of the retry schedule: the attempt placed (a deployment
    /// and its own limit), sent, and folded into the call. An attempt no
    /// deployment would take ends unsent with that refusal.
    async fn try_once(&mut self) -> Result<Extracted<Value>, ExtractError> {
        let p = self.provider;
        let slot = match self.place(self.tries > 1).await {
            Ok(slot) => slot,
            Err(limited) => {
                // Not sent: the breaker hears nothing of it, unless nothing was sent there at all.
                let here = p.holders[self.route.current()];
                self.route.reports[here].get_or_insert(BreakerReport::Release);
                return Err(limited);
            }
        };
        let at = self.route.current();
        #[cfg(feature = "mutants")]
        if let Some(refused) = self.mutated_layers().await {
            p.settle_limit(at, slot, 0, crate::decide::concurrency::CallEnd::Neither)
                .await;
            return Err(refused);
        }
        // The attempt may take no longer than the deadline leaves.
        let left = self.deadline.map(|d| d.saturating_duration_since(p.clock.now()));
        self.end.sent = self.end.sent.saturating_add(1);
        if let Some(hedging) = &p.hedging
            && p.deployments.len() > 1
            && self.hedges < hedging.max
        {
            return self.race(at, slot, left).await;
        }
        let sent = p.attempt(at, self.tries, self.request, left).await;
        #[cfg(feature = "mutants")]
        let sent = self.retried_anew(at, left, sent).await;
        let (result, took) = sent;
        self.absorb(at, slot, &result, took).await;
        result
    }

    /// Folds what an attempt at deployment `at` said into the call: the
    /// tokens it may have spent, its reservation at the deployment's own
    /// limit settled and its adaptive concurrency lease ended, the wait its server asked for and whether it was
    /// about the deployment (for routing), and what the breaker behind it
    /// will hear — a failure for a success slower than the slow-call
    /// threshold (`took`, measured only under one).
    pub(super) async fn absorb(
        &mut self,
        at: usize,
        slot: Slot,
        result: &Result<Extracted<Value>, ExtractError>,
        took: Option<Duration>,
    ) {
        let p = self.provider;
        // A failed attempt the server may have generated for still used
        // tokens a token budget must charge.
        if result.as_ref().err().is_some_and(may_have_spent) {
            self.spent = self.spent.saturating_add(1);
        }
        let actual = slot.reservation.as_ref().map_or(0, |reservation| match result {
            Ok(answer) => answer_tokens(reservation.estimate, answer),
            Err(e) if may_have_spent(e) => reservation.estimate,
            Err(_) => 0,
        });
        p.settle_limit(at, slot, actual, call_end(result)).await;
        if p.deployments.len() > 1 {
            self.heed(at, result);
        }
        if result.is_ok() && p.slow(at, took) {
            // The answer stands; its breaker hears a failure.
            self.route.reports[p.holders[at]] = Some(BreakerReport::Failure);
        } else if p.deployments.len() > 1 || p.limited {
            let report = match result {
                Ok(_) => BreakerReport::Success,
                Err(e) => match p.classify(e) {
                    Retryable::No => p.permanent_report(e),
                    Retryable::Yes | Retryable::After(_) => BreakerReport::Failure,
                },
            };
            self.route.reports[p.holders[at]] = Some(report);
        }
    }

    /// The call's error when the retry schedule ends it, and what the
    /// breaker where it ended hears.
    fn conclude(&self, end: RetryError<ExtractError>) -> (Result<Extracted<Value>, ExtractError>, BreakerReport) {
        let p = self.provider;
        match end {
            RetryError::Exhausted(x) => (
                Err(ExtractError::RetryExhausted(RetryExhausted {
                    attempts: x.attempts,
                    max_retries: x.max_retries,
                    operation: x.operation,
                    last: Box::new(x.last),
                })),
                BreakerReport::Failure,
            ),
            RetryError::Deadline(d) => {
                p.report_deadline(self.route.current(), DeadlineWait::Retry, d.needed, d.remaining);
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
            RetryError::Denied(d) => (
                Err(ExtractError::RetryDenied(RetryDenied {
                    attempts: d.attempts,
                    operation: d.operation,
                    last: Box::new(d.last),
                })),
                BreakerReport::Failure,
            ),
            RetryError::Permanent(e) => {
                let report = p.permanent_report(&e);
                (Err(e), report)
            }
        }
    }

    /// The retry loop's verdict over several deployments: a retry goes to
    /// another deployment, so a wait one deployment's server asked for
    /// (`Retry-After`, also one over the cap) does not hold it back, and a
    /// failure that is about the deployment rather than the request — its
    /// account's quota exhausted, its key refused, the model unknown there,
    /// an inner wrapper's refusal — is retried there (under the default
    /// classifier), whenever another deployment is not known to refuse.
    fn classify_routed(&mut self, error: &ExtractError) -> Retryable {
        let p = self.provider;
        let verdict = p.classify(error);
        if p.deployments.len() == 1 {
            return verdict;
        }
        if let Some(wait) = self.route.stuck.take() {
            // Nowhere to go but a server's wait: the verdict one deployment
            // gets on it (over the cap, final; else a wait the deadline
            // then refuses), not another placement that sends nothing.
            return if wait > p.max_server_delay {
                Retryable::No
            } else {
                Retryable::After(wait)
            };
        }
        if p.server_wait(error).is_none() && !p.about_deployment(error) {
            return verdict;
        }
        let now = p.clock.now();
        let here = p.holders[self.route.current()];
        let elsewhere =
            (0..p.deployments.len()).any(|j| p.holders[j] != here && !p.deployments[j].known_to_refuse(now));
        if elsewhere { Retryable::Yes } else { verdict }
    }

    /// The per-call layers pushed inside the retry loop, when that
    /// [`Mutant`](crate::mutants::Mutant) is injected: every attempt after
    /// the first takes its own limiter slot, or reports the attempt before
    /// it to the breaker and asks the breaker again (the route then holds
    /// the latest admission, which the call's final report names). A
    /// refusal is the attempt's error.
    #[cfg(feature = "mutants")]
    async fn mutated_layers(&mut self) -> Option<ExtractError> {
        use crate::mutants::{Mutant, active};
        let p = self.provider;
        let attempt = self.tries;
        if attempt > 1 && active(Mutant::RetryOutsideLimiter) {
            match p.limiter.acquire_as(p.tenant, p.priority).await {
                Ok(_) => {}
                Err(AcquireError::Limited(refusal)) => return Some(refusal.into()),
                Err(AcquireError::Cache(e)) => return Some(ExtractError::LimiterCache(e)),
            }
        }
        if attempt > 1 && active(Mutant::RetryOutsideBreaker) {
            let i = self.route.current();
            let held = self.route.held[p.holders[i]];
            let breaker = &p.deployments[i].breaker;
            if let Some(permit) = held {
                p.report_to_breaker(breaker, &permit, BreakerReport::Failure).await;
            }
            let next = breaker.admit().await;
            // The reported permit is done with: a refusal takes its place.
            self.route.held[p.holders[i]] = Some(next);
            if let Permit::Refused {
                retry_after, reason, ..
            } = next
            {
                return Some(CircuitOpen::refused(p.deployments[i].inner.model(), retry_after, reason).into());
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
        &mut self,
        at: usize,
        left: Option<Duration>,
        mut sent: (Result<Extracted<Value>, ExtractError>, Option<Duration>),
    ) -> (Result<Extracted<Value>, ExtractError>, Option<Duration>) {
        use crate::mutants::{Mutant, active};
        let p = self.provider;
        if p.deployments.len() < 2 || !active(Mutant::FallbackRetriesAnew) {
            return sent;
        }
        for _ in 0..p.retry.policy().max_retries() {
            match &sent.0 {
                Err(e) if !matches!(p.classify(e), Retryable::No) => {}
                _ => break,
            }
            // The attempt this one replaces may have spent tokens too.
            if sent.0.as_ref().err().is_some_and(may_have_spent) {
                self.spent = self.spent.saturating_add(1);
            }
            let number = self.end.sent;
            self.end.sent = self.end.sent.saturating_add(1);
            sent = p.attempt(at, number, self.request, left).await;
        }
        sent
    }
}

impl<P: LlmProvider, L: TokenStore, B: BreakerStore> HardenedProvider<P, L, B> {
    /// Attempt `number` of the call, on deployment `at`, in its own span; a
    /// quota signal in its answer becomes that deployment's fleet-wide
    /// cooldown (one breaker step) before the answer is handed back, with
    /// how long the server took to give it when a slow-call threshold or an
    /// observed-p95 hedge delay is set (the cooldown's step not included).
    pub(super) async fn attempt(
        &self,
        at: usize,
        number: u32,
        request: ExtractRequest<'_>,
        left: Option<Duration>,
    ) -> (Result<Extracted<Value>, ExtractError>, Option<Duration>) {
        let span = spans::attempt_span(self.deployments[at].inner.model(), number);
        let (result, took) = self.attempt_in_span(at, request, left).instrument(span.clone()).await;
        spans::record_result(&span, &result);
        (result, took)
    }

    /// [`attempt`](Self::attempt)'s work, inside its span.
    async fn attempt_in_span(
        &self,
        at: usize,
        request: ExtractRequest<'_>,
        left: Option<Duration>,
    ) -> (Result<Extracted<Value>, ExtractError>, Option<Duration>) {
        // Timed only under a slow-call threshold or an observed-p95 hedge
        // delay: otherwise no clock is read.
        let timed = self.slow_call_threshold.is_some() || self.hedging.as_ref().is_some_and(|h| h.observes());
        let sent_at = timed.then(|| self.clock.now());
        let answer = self.deployments[at].inner.extract_answer(request, left).await;
        let took = sent_at.map(|t| self.clock.now().saturating_duration_since(t));
        let (result, heard) = self.quota_heard(at, answer);
        if let Some(heard) = heard {
            for i in self.cooled_by(at, heard) {
                let deployment = &self.deployments[i];
                // The cooldown just written refuses it until then.
                self.hear(i, Some((heard.wait, Deferral::Cooldown)));
                if let Err(error) = deployment.breaker.cool_down(heard.wait).await {
                    self.observer.on_event(&Event::CacheUnavailable {
                        component: Arc::from(deployment.breaker.key_prefix()),
                        operation: "cool_down",
                        fallback: "not recorded",
                        error: error.to_string(),
                    });
                }
            }
        }
        (result, took)
    }

    /// Whether an attempt at deployment `at` that succeeded after `took`
    /// was slow: longer than the slow-call threshold. A slow one is
    /// reported ([`Event::SlowCall`]); its breaker then hears a failure.
    pub(super) fn slow(&self, at: usize, took: Option<Duration>) -> bool {
        let (Some(threshold), Some(took)) = (self.slow_call_threshold, took) else {
            return false;
        };
        if took <= threshold {
            return false;
        }
        #[cfg(feature = "mutants")]
        if crate::mutants::active(crate::mutants::Mutant::SlowCallsIgnored) {
            // Only errors count: a slow answer is a success like any other.
            return false;
        }
        if self.observer.enabled() {
            self.observer.on_event(&Event::SlowCall {
                breaker: Arc::from(self.deployments[at].breaker.key_prefix()),
                tenant: self.tenant,
                duration: took,
                threshold,
                at: self.clock.now(),
            });
        }
        true
    }

    /// The deployments a quota signal heard from deployment `at` cools:
    /// `at` alone for a rate limit; for a spent quota, every deployment of
    /// its [`quota_group`](crate::provider::Deployment::quota_group) in this
    /// provider (the account's quota is spent on every key), in the order
    /// given — except one whose breaker a deployment outside the group
    /// shares, whose quota is not spent. Each breaker is cooled once.
    fn cooled_by(&self, at: usize, heard: Heard) -> Vec<usize> {
        let group = self.deployments[at].quota_group.as_deref().filter(|_| heard.spent);
        #[cfg(feature = "mutants")]
        let group = group.filter(|_| !crate::mutants::active(crate::mutants::Mutant::QuotaGroupIgnored));
        let prefix = |i: usize| self.deployments[i].breaker.key_prefix();
        let in_group = |i: usize| group.is_some_and(|g| self.deployments[i].quota_group.as_deref() == Some(g));
        let mut cooled: Vec<usize> = Vec::new();
        for i in 0..self.deployments.len() {
            let shared_outside = (0..self.deployments.len()).any(|j| prefix(j) == prefix(i) && !in_group(j));
            let member = i == at || (in_group(i) && !shared_outside);
            if member && !cooled.iter().any(|&c| prefix(c) == prefix(i)) {
                cooled.push(i);
            }
        }
        cooled
    }

    /// What an attempt's answer says of deployment `at`'s quota: the
    /// cooldown to write there, and the answer as the call sees it. A rate
    /// limit — a 429 or 503 asking for a wait, or an exhausted
    /// `x-ratelimit-*` limit — cools it for that wait, at most
    /// `max_server_delay`. A spent quota — `insufficient_quota`, or a 429
    /// or an answer whose limit resets further away than
    /// `max_server_delay` — cools it for
    /// [`spent_cooldown`](HardenedProvider::spent_cooldown), is reported
    /// ([`Event::QuotaExhausted`]), and a 429 saying so becomes
    /// [`ProviderError::QuotaExhausted`]: final there. Only the server's
    /// own answer counts: a hardening layer's outcome wrapping one (an
    /// inner provider's) is no word from this deployment's server.
    fn quota_heard(
        &self,
        at: usize,
        answer: Result<Extracted<Value>, ExtractError>,
    ) -> (Result<Extracted<Value>, ExtractError>, Option<Heard>) {
        let wait = match &answer {
            Ok(answer) => answer.quota.map(|q| q.wait),
            Err(e) => e.quota_wait(),
        }
        .filter(|w| !w.is_zero());
        let past_cap = wait.is_some_and(|w| w > self.max_server_delay);
        let spent = match &answer {
            Err(ExtractError::Provider(ProviderError::QuotaExhausted { retry_after, .. })) => {
                Some(self.spent_cooldown(*retry_after))
            }
            // A 503's wait is a server loading or full, never a quota.
            Err(ExtractError::Provider(ProviderError::RateLimited { .. })) | Ok(_) if past_cap => {
                Some(self.spent_cooldown(wait))
            }
            _ => None,
        };
        let rate_limit = |wait: Option<Duration>| {
            wait.map(|w| Heard {
                wait: w.min(self.max_server_delay),
                spent: false,
            })
        };
        let Some((cooldown, reset_given)) = spent else {
            return (answer, rate_limit(wait));
        };
        if self.observer.enabled() {
            let now = self.clock.now();
            self.observer.on_event(&Event::QuotaExhausted {
                breaker: Arc::from(self.deployments[at].breaker.key_prefix()),
                tenant: self.tenant,
                wait: cooldown,
                until: now.saturating_add(cooldown),
                at: now,
                reset_given,
            });
        }
        #[cfg(feature = "mutants")]
        if crate::mutants::active(crate::mutants::Mutant::HardQuotaAsRateLimit) {
            // A spent quota taken for a rate limit: its wait capped, and
            // `insufficient_quota` (no rate limit's wait) none.
            return (answer, rate_limit(wait));
        }
        let answer = match answer {
            Err(ExtractError::Provider(ProviderError::RateLimited { retry_after, message })) => {
                Err(ProviderError::QuotaExhausted { retry_after, message }.into())
            }
            other => other,
        };
        let heard = Heard {
            wait: cooldown,
            spent: true,
        };
        (answer, (!cooldown.is_zero()).then_some(heard))
    }
}

/// A quota signal in an attempt's answer: how long its deployment cools,
/// and whether the account's quota is spent (which cools its whole
/// quota group) or only rate-limited.
#[derive(Clone, Copy, Debug)]
struct Heard {
    wait: Duration,
    spent: bool,
}

/// The [`RetryAfterWithheld`](crate::mutants::Mutant::RetryAfterWithheld)
/// mutant: a call every breaker refused ends with no wait to come back
/// after.
#[cfg(feature = "mutants")]
fn withheld(result: Result<Extracted<Value>, ExtractError>) -> Result<Extracted<Value>, ExtractError> {
    use crate::mutants::{Mutant, active};
    match result {
        Err(ExtractError::CircuitOpen(mut open)) if active(Mutant::RetryAfterWithheld) => {
            open.retry_after = Duration::ZERO;
            Err(ExtractError::CircuitOpen(open))
        }
        other => other,
    }
}
