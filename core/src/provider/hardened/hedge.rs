//! Hedged requests: a call whose attempt has not answered after a delay
//! sends a second attempt to another deployment, and the first success
//! wins. A model server's latency has a long tail — a request queued
//! behind a long generation, a batch preempted, a GC pause in a proxy —
//! that retries cannot cut, since nothing failed. A hedge trades extra
//! load on the servers for the tail, so it is bounded three ways: a delay
//! (fixed, or the observed p95 of recent answers from that deployment, so
//! only the slowest ~5 % are hedged), at most `max_hedges` per call, and a
//! withdrawal from the fleet's retry budget for each, so a fleet whose
//! servers are all slow hedges less rather than doubling its load.
//!
//! This module holds the configuration ([`HedgeAfter`], its limits), the
//! per-process latency windows the observed p95 is read from, and the race:
//! one step of a call's retry schedule with its hedges in flight
//! (`Call::race`), each attempt sent by `HardenedProvider::attempt` and
//! folded in by `Call::absorb` as it ends.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use serde_json::Value;

use super::call::Call;
use super::report::BreakerReport;
use super::tokens::Slot;
use crate::breaker::Permit;
use crate::cache::{BreakerStore, TokenStore};
use crate::clock::Sleep;
use crate::error::ConfigError;
use crate::observe::Event;
use crate::provider::route::Deferral;
use crate::provider::{ExtractError, Extracted, LlmProvider};

/// The most hedges one call may send ([`HardenedProviderBuilder::hedge`](crate::provider::HardenedProviderBuilder::hedge)'s
/// `max_hedges`): each is another request to a server; past a few, a
/// hedge adds load and no latency back.
pub const MAX_HEDGES: u32 = 4;

/// The longest fixed hedge delay (and observed-p95 floor) accepted: ten
/// minutes. A call still waiting then is not in a latency tail.
pub const MAX_HEDGE_DELAY: Duration = Duration::from_secs(600);

/// The fewest answers an observed p95 is read from: fewer make the 95th
/// percentile the largest sample.
pub const MIN_HEDGE_WINDOW: u32 = 20;

/// The most answers an observed p95 is read from, per deployment.
pub const MAX_HEDGE_WINDOW: u32 = 10_000;

/// When a call's attempt that has not answered is hedged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HedgeAfter {
    /// A fixed delay after the attempt (or the hedge before it) was sent.
    Fixed(Duration),
    /// The 95th percentile of how long the last `window` successful
    /// attempts at the deployment being hedged took, or `floor` when that
    /// is longer. Measured by this process alone, on its clock: until the
    /// deployment has answered `window` times here, it is not hedged.
    ObservedP95 {
        /// How many recent answers per deployment the p95 is read from.
        window: u32,
        /// The shortest delay, however fast recent answers were.
        floor: Duration,
    },
}

impl HedgeAfter {
    /// Checks the delay and `max_hedges` against their limits and the
    /// provider's `deadline`, naming the field that is out of range.
    pub(super) fn validate(self, max_hedges: u32, deadline: Option<Duration>) -> Result<(), ConfigError> {
        let (field, delay) = match self {
            HedgeAfter::Fixed(d) => ("hedge_after", d),
            HedgeAfter::ObservedP95 { window, floor } => {
                if !(MIN_HEDGE_WINDOW..=MAX_HEDGE_WINDOW).contains(&window) {
                    return Err(ConfigError::new("hedge_window", "20 ..= 10000 answers", window));
                }
                ("hedge_floor", floor)
            }
        };
        if delay.is_zero() {
            return Err(ConfigError::new(field, "positive", format!("{delay:?}")));
        }
        if delay > MAX_HEDGE_DELAY {
            return Err(ConfigError::new(field, "at most 600 s", format!("{delay:?}")));
        }
        if deadline.is_some_and(|deadline| delay >= deadline) {
            return Err(ConfigError::new(
                field,
                "shorter than the deadline",
                format!("{delay:?}"),
            ));
        }
        if !(1..=MAX_HEDGES).contains(&max_hedges) {
            return Err(ConfigError::new("max_hedges", "1 ..= 4", max_hedges));
        }
        Ok(())
    }
}

/// A provider's hedging: when, how many, and each deployment's recent
/// answer times (per process).
pub(super) struct Hedging {
    pub(super) after: HedgeAfter,
    pub(super) max: u32,
    /// Per deployment, its recent successful attempts' durations (empty
    /// under a fixed delay).
    recent: Vec<Mutex<VecDeque<Duration>>>,
}

impl Hedging {
    /// Hedging over `deployments` deployments.
    pub(super) fn new(after: HedgeAfter, max: u32, deployments: usize) -> Self {
        let windows = match after {
            HedgeAfter::Fixed(_) => 0,
            HedgeAfter::ObservedP95 { .. } => deployments,
        };
        Hedging {
            after,
            max,
            recent: (0..windows).map(|_| Mutex::new(VecDeque::new())).collect(),
        }
    }

    /// Whether attempts are timed for an observed p95.
    pub(super) fn observes(&self) -> bool {
        matches!(self.after, HedgeAfter::ObservedP95 { .. })
    }

    /// Remembers that a successful attempt at deployment `at` took `took`.
    pub(super) fn observe(&self, at: usize, took: Duration) {
        let (HedgeAfter::ObservedP95 { window, .. }, Some(recent)) = (self.after, self.recent.get(at)) else {
            return;
        };
        let mut recent = recent.lock().unwrap_or_else(|p| p.into_inner());
        if recent.len() >= window as usize {
            recent.pop_front();
        }
        recent.push_back(took);
    }

    /// How long an attempt at deployment `at` waits unanswered before it is
    /// hedged; `None` while its observed p95 is unknown.
    pub(super) fn delay(&self, at: usize) -> Option<Duration> {
        match self.after {
            HedgeAfter::Fixed(d) => Some(d),
            HedgeAfter::ObservedP95 { window, floor } => {
                let recent = self.recent.get(at)?.lock().unwrap_or_else(|p| p.into_inner());
                if recent.len() < window as usize {
                    return None;
                }
                Some(p95(recent.iter().copied().collect()).max(floor))
            }
        }
    }
}

/// The 95th percentile of `samples` (nearest rank), never empty.
fn p95(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    let rank = (samples.len() * 95).div_ceil(100).max(1);
    samples[rank - 1]
}

/// What an attempt said, and how long it took when timed.
type Answer = (Result<Extracted<Value>, ExtractError>, Option<Duration>);

/// One attempt of a hedged call in flight: where it went, its reservation
/// at that deployment's own limit, and its answer to come. Dropping it
/// drops the request, whose connection closes.
struct Flight<'a> {
    at: usize,
    /// What the attempt holds at its deployment.
    slot: Slot,
    answer: Pin<Box<dyn Future<Output = Answer> + Send + 'a>>,
}

/// What a hedged call woke for.
enum Woke {
    /// The attempt at this index answered.
    Answered(usize, Answer),
    /// The hedge delay passed with nothing answered.
    Due,
}

/// Where a hedge may go.
enum Placed {
    /// To this deployment, with what it holds there; the budget paid.
    At(usize, Slot),
    /// Nowhere admits it now.
    Nowhere,
    /// The retry budget denied it: the call hedges no more.
    Denied,
}

impl<'a, P: LlmProvider, L: TokenStore, B: BreakerStore> Call<'a, P, L, B> {
    /// One step of the retry schedule under hedging: the attempt placed at
    /// `at` is sent, and each time the hedge delay passes with nothing
    /// answered another goes to the next deployment that admits it, while
    /// the call has hedges left and the budget grants them. The first
    /// success wins: it is the step's answer, and every attempt still in
    /// flight is cancelled. A failure waits for the others; when the last
    /// one fails, its failure is the step's, as one attempt's would be.
    /// Every answered attempt is folded into the call as it ends.
    pub(super) async fn race(
        &mut self,
        at: usize,
        slot: Slot,
        left: Option<Duration>,
    ) -> Result<Extracted<Value>, ExtractError> {
        let p = self.provider;
        let mut flights = vec![Flight {
            at,
            slot,
            answer: Box::pin(p.attempt(at, self.tries, self.request, left)),
        }];
        let mut timer = self.hedge_timer(at);
        loop {
            let woke = poll_fn(|cx| {
                for (k, flight) in flights.iter_mut().enumerate() {
                    if let Poll::Ready(answer) = flight.answer.as_mut().poll(cx) {
                        return Poll::Ready(Woke::Answered(k, answer));
                    }
                }
                if let Some((_, sleep)) = timer.as_mut()
                    && sleep.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(Woke::Due);
                }
                Poll::Pending
            })
            .await;
            match woke {
                Woke::Due => {
                    let after = timer.take().map_or(Duration::ZERO, |(after, _)| after);
                    let busy: Vec<usize> = flights.iter().map(|f| f.at).collect();
                    match self.place_hedge(&busy).await {
                        Placed::At(to, slot) => {
                            let from = busy.last().copied().unwrap_or(at);
                            self.hedges = self.hedges.saturating_add(1);
                            self.end.sent = self.end.sent.saturating_add(1);
                            if p.observer.enabled() {
                                p.observer.on_event(&Event::Hedged {
                                    tenant: p.tenant,
                                    from: Arc::from(p.deployments[from].breaker.key_prefix()),
                                    to: Arc::from(p.deployments[to].breaker.key_prefix()),
                                    after,
                                });
                            }
                            let left = self.deadline.map(|d| d.saturating_duration_since(p.clock.now()));
                            flights.push(Flight {
                                at: to,
                                slot,
                                answer: Box::pin(p.attempt(to, self.end.sent, self.request, left)),
                            });
                            timer = self.hedge_timer(to);
                        }
                        Placed::Nowhere => {}
                        Placed::Denied => self.hedges = p.hedging.as_ref().map_or(0, |h| h.max),
                    }
                }
                Woke::Answered(k, (result, took)) => {
                    let flight = flights.remove(k);
                    if let (Ok(_), Some(took), Some(hedging)) = (&result, took, &p.hedging) {
                        hedging.observe(flight.at, took);
                    }
                    // The call is where its latest answer came from.
                    if let Some(position) = self.route.order.iter().position(|&i| i == flight.at) {
                        self.route.at = position;
                    }
                    self.absorb(flight.at, flight.slot, &result, took).await;
                    if result.is_ok() || flights.is_empty() {
                        for loser in flights.drain(..) {
                            self.cancel(loser).await;
                        }
                        return result;
                    }
                }
            }
        }
    }

    /// The hedge delay of an attempt just sent to deployment `at`, and its
    /// sleep, while the call has hedges left and the delay is known.
    fn hedge_timer(&self, at: usize) -> Option<(Duration, Sleep)> {
        let p = self.provider;
        let hedging = p.hedging.as_ref().filter(|h| self.hedges < h.max)?;
        let delay = hedging.delay(at)?;
        Some((delay, p.clock.sleep(delay)))
    }

    /// Where a hedge goes: the next deployment in the call's order after
    /// where it is, behind a breaker none of the attempts in flight
    /// (`busy`) is behind, not known to refuse, not asked by its server to
    /// wait, whose breaker admits the call (or already has) and whose own
    /// limit admits the attempt. The retry budget is asked first, once some
    /// deployment may take the hedge, so a denied hedge takes no admission
    /// (the call is admitted at most once per breaker); a grant that no
    /// deployment then takes is spent. An admission taken for a hedge its
    /// deployment's limit refuses is handed back.
    async fn place_hedge(&mut self, busy: &[usize]) -> Placed {
        let p = self.provider;
        let now = p.clock.now();
        let n = self.route.order.len();
        let candidates: Vec<usize> = (1..n)
            .map(|step| self.route.order[(self.route.at + step) % n])
            .filter(|&i| {
                let h = p.holders[i];
                !busy.iter().any(|&b| p.holders[b] == h)
                    && !self.route.passed[h]
                    && !p.deployments[i].known_to_refuse(now)
                    && self.asked_wait(i).is_none()
            })
            .collect();
        if candidates.is_empty() {
            return Placed::Nowhere;
        }
        if !p.retry.try_hedge().await {
            return Placed::Denied;
        }
        for i in candidates {
            let h = p.holders[i];
            let mut admitted_now = None;
            if self.route.held[h].is_none() {
                let admission = p.deployments[i].breaker.admit_since().await;
                let permit = admission.permit;
                if let Permit::Refused {
                    state,
                    retry_after,
                    reason,
                } = permit
                {
                    p.hear_refusal(i, state, reason, retry_after);
                    continue;
                }
                p.hear(i, None);
                if !p.ramp_takes(i, &admission) {
                    // In its slow start, and the draw says no: not there.
                    self.route.passed[h] = true;
                    p.report_to_breaker(&p.deployments[i].breaker, &permit, BreakerReport::Release)
                        .await;
                    continue;
                }
                self.route.held[h] = Some(permit);
                admitted_now = Some(permit);
            }
            match p.take_limit(i, &self.request).await {
                Ok(slot) => return Placed::At(i, slot),
                Err((error, wait)) => {
                    if let Some(wait) = wait {
                        p.hear(i, Some((wait, Deferral::Limited)));
                    }
                    if matches!(error, ExtractError::ConcurrencyLimited(_)) {
                        // Kept for a retry, as a placement keeps it.
                        self.route.kept[h] = true;
                    } else if let Some(permit) = admitted_now {
                        self.route.held[h] = None;
                        p.report_to_breaker(&p.deployments[i].breaker, &permit, BreakerReport::Release)
                            .await;
                    }
                }
            }
        }
        Placed::Nowhere
    }

    /// Cancels an attempt another's success made needless: its request is
    /// dropped, so its connection closes and its server stops generating.
    /// It may have generated some tokens by then, so the call's token
    /// budget charges it as a failed attempt that may have spent, and its
    /// reservation at the deployment's own limit is settled at its
    /// estimate. Its breaker hears nothing of it: the admission taken for
    /// it is released with the call's reports, never a failure.
    async fn cancel(&mut self, loser: Flight<'a>) {
        let Flight { at, slot, answer } = loser;
        drop(answer);
        self.spent = self.spent.saturating_add(1);
        let estimate = slot.reservation.as_ref().map_or(0, |r| r.estimate);
        self.provider
            .settle_limit(at, slot, estimate, crate::decide::concurrency::CallEnd::Neither)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_observed_p95_waits_for_a_full_window_then_reads_nearest_rank_above_the_floor() {
        let hedging = Hedging::new(
            HedgeAfter::ObservedP95 {
                window: 20,
                floor: ms(50),
            },
            1,
            2,
        );
        for i in 1..=19 {
            hedging.observe(0, ms(i * 10));
        }
        assert_eq!(hedging.delay(0), None, "19 answers are not a window");
        hedging.observe(0, ms(200));
        // 10, 20, …, 190, 200: the 19th of 20 is 190 ms.
        assert_eq!(hedging.delay(0), Some(ms(190)));
        assert_eq!(hedging.delay(1), None, "each deployment has its own window");
        for _ in 0..20 {
            hedging.observe(0, ms(1));
        }
        assert_eq!(hedging.delay(0), Some(ms(50)), "the oldest left; the floor holds");
    }

    #[test]
    fn out_of_range_settings_are_refused_by_name() {
        let fixed = |ms_: u64| HedgeAfter::Fixed(ms(ms_));
        let field = |after: HedgeAfter, max: u32, deadline: Option<Duration>| {
            after.validate(max, deadline).unwrap_err().to_string()
        };
        assert!(field(fixed(0), 1, None).contains("hedge_after"));
        assert!(field(fixed(600_001), 1, None).contains("hedge_after"));
        assert!(field(fixed(2000), 1, Some(ms(2000))).contains("hedge_after"));
        assert!(field(fixed(100), 0, None).contains("max_hedges"));
        assert!(field(fixed(100), 5, None).contains("max_hedges"));
        let p95 = |window: u32, floor: u64| HedgeAfter::ObservedP95 {
            window,
            floor: ms(floor),
        };
        assert!(field(p95(19, 10), 1, None).contains("hedge_window"));
        assert!(field(p95(10_001, 10), 1, None).contains("hedge_window"));
        assert!(field(p95(20, 0), 1, None).contains("hedge_floor"));
        assert!(fixed(100).validate(4, Some(ms(101))).is_ok());
        assert!(p95(10_000, 600_000).validate(1, None).is_ok());
    }
}
