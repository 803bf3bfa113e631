//! Retry with exponential backoff and jitter, for failures the server may
//! answer differently next time.
//!
//! [`Retry::run`] re-invokes an async operation while a caller-given predicate
//! calls its error retryable, sleeping the [`RetryPolicy`]'s schedule on the
//! injected clock between attempts. There is no default predicate: which
//! failures deserve a second attempt depends on the transport, and a
//! too-wide one turns a permanent failure into the same failure, slower. An
//! error the predicate rejects comes back on the first attempt, unwrapped
//! ([`RetryError::Permanent`]). When every attempt fails,
//! [`RetryError::Exhausted`] carries the calls made and the last error as its
//! `source()`.
//!
//! A policy bounds each call's retries; a [`RetryBudget`] ([`Retry::budget`])
//! bounds a whole fleet's, as a ratio of first attempts plus a floor, kept
//! in the shared cache: a retry it denies ends the run with
//! [`RetryError::Denied`].

mod budget;
mod policy;

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use budget::{
    DEFAULT_KEY as DEFAULT_BUDGET_KEY, DEFAULT_MAX_BALANCE, DEFAULT_MIN_RETRIES_PER_SEC, DEFAULT_RATIO,
    MAX_MAX_BALANCE, MAX_MIN_RETRIES_PER_SEC, MAX_RATIO, RetryBudget, RetryBudgetBuilder,
};
pub use policy::{
    DEFAULT_INITIAL_DELAY, DEFAULT_JITTER, DEFAULT_MAX_DELAY, DEFAULT_MAX_RETRIES, DEFAULT_MULTIPLIER, MAX_DELAY_LIMIT,
    RetryPolicy, RetryPolicyBuilder,
};

use crate::env::Env;
use crate::observe::Event;
use crate::time::{Timestamp, secs};

/// A predicate's verdict on one failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retryable {
    /// Permanent: return it now, unwrapped.
    No,
    /// Transient: sleep the schedule's delay and try again.
    Yes,
    /// Transient, and the server asked for at least this long (`Retry-After`):
    /// sleep the larger of this and the schedule's delay, a server's wait
    /// spread upwards by the policy's jitter
    /// ([`RetryPolicy::delay_at_least`]): never shorter than asked.
    After(Duration),
}

impl From<bool> for Retryable {
    fn from(retry: bool) -> Self {
        if retry { Retryable::Yes } else { Retryable::No }
    }
}

/// Every attempt failed on a retryable error.
///
/// The message counts retries (`Exhausted 3 retries for extract`); `attempts`
/// counts calls and is always `max_retries + 1`. The last failure is
/// [`source()`](StdError::source) — read it, it is the real error.
#[derive(Debug)]
pub struct RetryExhausted<E> {
    /// Calls made, including the first.
    pub attempts: u32,
    /// The policy's retry count.
    pub max_retries: u32,
    /// The operation's name, as given to [`Retry::run`].
    pub operation: String,
    /// The failure of the last attempt.
    pub last: E,
}

impl<E> fmt::Display for RetryExhausted<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Exhausted {} retries for {}", self.max_retries, self.operation)
    }
}

impl<E: StdError + 'static> StdError for RetryExhausted<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.last)
    }
}

/// The next wait would run past the caller's deadline, so the loop stopped
/// before sleeping.
#[derive(Debug)]
pub struct DeadlineExceeded<E> {
    /// Calls made so far.
    pub attempts: u32,
    /// The wait the next attempt needed.
    pub needed: Duration,
    /// What was left of the deadline.
    pub remaining: Duration,
    /// The operation's name.
    pub operation: String,
    /// The failure of the last attempt.
    pub last: E,
}

impl<E> fmt::Display for DeadlineExceeded<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "deadline for {} leaves {}s but the next retry needs {}s (after {} attempts)",
            self.operation,
            secs(self.remaining),
            secs(self.needed),
            self.attempts
        )
    }
}

impl<E: StdError + 'static> StdError for DeadlineExceeded<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.last)
    }
}

/// A retryable error, but the [`RetryBudget`] denied the retry: the fleet has
/// retried as much as its budget allows, so the loop stopped.
#[derive(Debug)]
pub struct RetryDenied<E> {
    /// Calls made, including the first.
    pub attempts: u32,
    /// The operation's name.
    pub operation: String,
    /// The failure of the last attempt.
    pub last: E,
}

impl<E> fmt::Display for RetryDenied<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "retry budget denied a retry of {} (after {} attempts)",
            self.operation, self.attempts
        )
    }
}

impl<E: StdError + 'static> StdError for RetryDenied<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.last)
    }
}

/// How a retried operation failed.
#[derive(Debug)]
pub enum RetryError<E> {
    /// The predicate called the error permanent; it is returned as it came, from
    /// the first attempt that raised it.
    Permanent(E),
    /// Every attempt failed on a retryable error.
    Exhausted(RetryExhausted<E>),
    /// A retryable error, but the wait before the next attempt would overrun the
    /// deadline.
    Deadline(DeadlineExceeded<E>),
    /// A retryable error, but the [`RetryBudget`] denied the retry.
    Denied(RetryDenied<E>),
}

impl<E> RetryError<E> {
    /// The underlying error of the last attempt, whichever way the loop ended.
    pub fn last(&self) -> &E {
        match self {
            RetryError::Permanent(e) => e,
            RetryError::Exhausted(x) => &x.last,
            RetryError::Deadline(d) => &d.last,
            RetryError::Denied(d) => &d.last,
        }
    }

    /// The underlying error, by value.
    pub fn into_last(self) -> E {
        match self {
            RetryError::Permanent(e) => e,
            RetryError::Exhausted(x) => x.last,
            RetryError::Deadline(d) => d.last,
            RetryError::Denied(d) => d.last,
        }
    }

    /// Calls made, or `None` for [`RetryError::Permanent`] (whose attempt count
    /// the loop does not wrap).
    pub fn attempts(&self) -> Option<u32> {
        match self {
            RetryError::Permanent(_) => None,
            RetryError::Exhausted(x) => Some(x.attempts),
            RetryError::Deadline(d) => Some(d.attempts),
            RetryError::Denied(d) => Some(d.attempts),
        }
    }
}

impl<E: fmt::Display> fmt::Display for RetryError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetryError::Permanent(e) => e.fmt(f),
            RetryError::Exhausted(x) => x.fmt(f),
            RetryError::Deadline(d) => d.fmt(f),
            RetryError::Denied(d) => d.fmt(f),
        }
    }
}

impl<E: StdError + 'static> StdError for RetryError<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            RetryError::Permanent(e) => e.source(),
            RetryError::Exhausted(x) => Some(&x.last),
            RetryError::Deadline(d) => Some(&d.last),
            RetryError::Denied(d) => Some(&d.last),
        }
    }
}

/// A retry loop: a policy plus the clock it sleeps on, the RNG its jitter
/// comes from and the observer it reports to.
#[derive(Clone)]
pub struct Retry {
    policy: RetryPolicy,
    env: Env,
    budget: Option<Arc<dyn budget::Gate>>,
}

impl fmt::Debug for Retry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("policy", &self.policy)
            .field("budgeted", &self.budget.is_some())
            .finish_non_exhaustive()
    }
}

impl Retry {
    /// A loop with `policy` in [`Env::system`]: the system clock, OS-seeded
    /// jitter and `tracing`.
    pub fn new(policy: RetryPolicy) -> Self {
        Retry {
            policy,
            env: Env::system(),
            budget: None,
        }
    }

    /// Spends retries from a (fleet-wide) [`RetryBudget`]: each run deposits
    /// once, before its first attempt, and asks the budget before each retry;
    /// a denied retry ends the run with [`RetryError::Denied`], carrying the
    /// last error. Without a budget every retry the policy allows is made.
    pub fn budget<S: crate::cache::BudgetStore>(mut self, budget: Arc<RetryBudget<S>>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Sleeps on `env`'s clock, draws jitter from its random source and
    /// reports to its observer instead.
    pub fn env(mut self, env: Env) -> Self {
        self.env = env;
        self
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// Runs `op` until it succeeds, fails permanently, or the schedule is spent.
    ///
    /// `operation` names it in the exhaustion message; `is_retryable` decides
    /// each failure. Cancellation (dropping the future) stops the loop
    /// wherever it is, mid-sleep included.
    pub async fn run<T, E, F, Fut>(
        &self,
        operation: &str,
        is_retryable: impl Fn(&E) -> Retryable,
        op: F,
    ) -> Result<T, RetryError<E>>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: fmt::Display,
    {
        self.run_until(None, operation, is_retryable, op).await
    }

    /// [`run`](Self::run) with a deadline on this loop's clock: a wait that
    /// would end after `deadline` is not slept; the loop returns
    /// [`RetryError::Deadline`] at once.
    pub async fn run_until<T, E, F, Fut>(
        &self,
        deadline: Option<Timestamp>,
        operation: &str,
        is_retryable: impl Fn(&E) -> Retryable,
        mut op: F,
    ) -> Result<T, RetryError<E>>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: fmt::Display,
    {
        self.begin().await;
        let mut attempts = 0u32;
        loop {
            attempts = attempts.saturating_add(1);
            let error = match op().await {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            let verdict = is_retryable(&error);
            self.back_off(attempts, error, verdict, deadline, operation).await?;
        }
    }

    /// Opens one run: its deposit into the retry budget, before the first
    /// attempt.
    pub(crate) async fn begin(&self) {
        if let Some(budget) = &self.budget {
            budget.deposit().await;
        }
    }

    /// Asks the budget for a hedge — another attempt while one is still in
    /// flight — as for a retry: `true` when granted, or when there is no
    /// budget.
    pub(crate) async fn try_hedge(&self) -> bool {
        #[cfg(feature = "mutants")]
        if crate::mutants::active(crate::mutants::Mutant::HedgesSkipBudget) {
            // A hedge taken for something other than a retry: nobody asks the budget.
            return true;
        }
        match &self.budget {
            Some(budget) => budget.try_withdraw().await,
            None => true,
        }
    }

    /// The step after attempt number `attempts` (from 1) failed with
    /// `error`, judged `verdict`: the run's end — the error itself when
    /// permanent, or exhausted, past `deadline`, or denied by the budget —
    /// or, when another attempt may follow, the schedule's delay slept on
    /// this loop's clock. [`run_until`](Self::run_until) is this step in a
    /// loop; a caller that keeps its own per-attempt state (the hardened
    /// provider) calls it directly.
    pub(crate) async fn back_off<E: fmt::Display>(
        &self,
        attempts: u32,
        error: E,
        verdict: Retryable,
        deadline: Option<Timestamp>,
        operation: &str,
    ) -> Result<(), RetryError<E>> {
        let floor = match verdict {
            Retryable::No => return Err(RetryError::Permanent(error)),
            Retryable::Yes => Duration::ZERO,
            Retryable::After(d) => d,
        };
        let retry = attempts.saturating_sub(1);
        if retry >= self.policy.max_retries() {
            self.env.observer().on_event(&Event::RetryExhausted {
                operation: Arc::from(operation),
                attempts,
                error: error.to_string(),
            });
            return Err(RetryError::Exhausted(RetryExhausted {
                attempts,
                max_retries: self.policy.max_retries(),
                operation: operation.to_owned(),
                last: error,
            }));
        }
        let delay = self.policy.delay_at_least(retry, floor, &**self.env.rng());
        if let Some(deadline) = deadline {
            let remaining = deadline.saturating_duration_since(self.env.clock().now());
            if delay > remaining {
                return Err(RetryError::Deadline(DeadlineExceeded {
                    attempts,
                    needed: delay,
                    remaining,
                    operation: operation.to_owned(),
                    last: error,
                }));
            }
        }
        if let Some(budget) = &self.budget
            && !budget.try_withdraw().await
        {
            return Err(RetryError::Denied(RetryDenied {
                attempts,
                operation: operation.to_owned(),
                last: error,
            }));
        }
        self.env.observer().on_event(&Event::RetryScheduled {
            operation: Arc::from(operation),
            attempt: attempts,
            delay,
            floor,
            error: error.to_string(),
        });
        self.env.clock().sleep(delay).await;
        Ok(())
    }
}
