//! How things ended, as data: a unit of work at a worker ([`CallOutcome`]) and
//! a request at a model server ([`Answer`]).
//!
//! The trace, the invariants, the report and the plots all decide by these
//! types, never by their names; the names exist once, here, for the written
//! trace and the report's tables. A call's error kind is the core's own
//! ([`ExtractError::kind`]): the simulator never spells it.

use std::fmt;

use redstring::provider::ExtractError;
use serde::{Serialize, Serializer};

use crate::scenario::Mode;

/// How a unit of work ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallOutcome {
    /// The extraction succeeded.
    Ok,
    /// The breaker refused the call ([`ExtractError::CircuitOpen`]): the
    /// model server is believed down.
    CircuitOpen,
    /// A shared quota cooldown refused the call: a server's 429 or spent
    /// rate limit set one, and it was still in force
    /// ([`ExtractError::CircuitOpen`] with the reason
    /// [`Refusal::Cooldown`](redstring::Refusal::Cooldown)).
    Cooldown,
    /// A limit of the caller's own held the call back, still, after its
    /// waits: no request was sent for it.
    Deferred(Limit),
    /// Any other error, named by the core's [`ExtractError::kind`].
    ///
    /// `ExtractError` is `#[non_exhaustive]`, so an error kind the core adds
    /// later lands here: a failure, which is what an unknown error is.
    Failed(&'static str),
}

/// Which of the caller's own limits deferred a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    /// The tenant's requests per window (`rpm`): [`ExtractError::RateLimited`].
    Requests,
    /// The tenant's tokens per window: [`ExtractError::TokenLimited`].
    Tokens,
    /// A deployment's own limit, shared by every tenant:
    /// [`ExtractError::DeploymentLimited`].
    Deployment,
    /// A deployment's adaptive concurrency limit, shared by every tenant:
    /// [`ExtractError::ConcurrencyLimited`].
    Concurrency,
}

impl CallOutcome {
    /// The outcome of `result`, classified by the core's error variants.
    pub fn of<T>(result: &Result<T, ExtractError>) -> CallOutcome {
        match result {
            Ok(_) => CallOutcome::Ok,
            Err(ExtractError::CircuitOpen(open)) if open.reason == redstring::Refusal::Cooldown => {
                CallOutcome::Cooldown
            }
            Err(ExtractError::CircuitOpen(_)) => CallOutcome::CircuitOpen,
            Err(ExtractError::RateLimited(_)) => CallOutcome::Deferred(Limit::Requests),
            Err(ExtractError::TokenLimited(_)) => CallOutcome::Deferred(Limit::Tokens),
            Err(ExtractError::DeploymentLimited(_)) => CallOutcome::Deferred(Limit::Deployment),
            Err(ExtractError::ConcurrencyLimited(_)) => CallOutcome::Deferred(Limit::Concurrency),
            Err(other) => CallOutcome::Failed(other.kind()),
        }
    }

    /// Its name in the trace and the report: `ok`, or the core's error kind
    /// ([`ExtractError::kind`]: `circuit_open`, `cooldown`, `rate_limited`,
    /// `token_limited`, `deployment_limited`, `concurrency_limited`, …).
    pub fn name(self) -> &'static str {
        match self {
            CallOutcome::Ok => "ok",
            CallOutcome::CircuitOpen => "circuit_open",
            CallOutcome::Cooldown => "cooldown",
            CallOutcome::Deferred(Limit::Requests) => "rate_limited",
            CallOutcome::Deferred(Limit::Tokens) => "token_limited",
            CallOutcome::Deferred(Limit::Deployment) => "deployment_limited",
            CallOutcome::Deferred(Limit::Concurrency) => "concurrency_limited",
            CallOutcome::Failed(kind) => kind,
        }
    }

    /// What kind of ending it is, in a few words, for the report's table.
    pub fn class(self) -> &'static str {
        match self {
            CallOutcome::Ok => "succeeded",
            CallOutcome::CircuitOpen => "refused by the breaker",
            CallOutcome::Cooldown => "refused by a quota cooldown",
            CallOutcome::Deferred(Limit::Requests) => "deferred by the limiter (requests per window)",
            CallOutcome::Deferred(Limit::Tokens) => "deferred by the limiter (tokens per window)",
            CallOutcome::Deferred(Limit::Deployment) => "deferred by a deployment's own limit",
            CallOutcome::Deferred(Limit::Concurrency) => "deferred by a deployment's concurrency limit",
            CallOutcome::Failed(_) => "failed",
        }
    }

    /// Whether it succeeded.
    pub fn is_ok(self) -> bool {
        self == CallOutcome::Ok
    }

    /// Whether a limit of the caller's own deferred it: such a call was
    /// never offered to a server, so the figures that judge how calls to
    /// the servers went leave it out, whichever limit held it back.
    pub fn is_deferred(self) -> bool {
        matches!(self, CallOutcome::Deferred(_))
    }
}

impl fmt::Display for CallOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for CallOutcome {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// How a model server answered a request (or did not).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Answer {
    /// Served normally.
    Ok,
    /// `503 Loading model`: reloading after a start, or the `loading` mode.
    Loading,
    /// `503 server busy`: slots and queue full.
    QueueFull,
    /// Hung by an overload collapse.
    Collapsed,
    /// A path other than chat completions.
    NotFound,
    /// A body that is not JSON.
    BadRequest,
    /// Its client left (or the server crashed) while it was queued or running.
    Abandoned,
    /// The `empty` mode's answer.
    Empty,
    /// The `malformed` mode's answer.
    Malformed,
    /// The `refuse` mode's answer.
    Refuse,
    /// The `rate_limit` mode's 429.
    RateLimit,
    /// The `error` mode's 500.
    Error,
    /// The `hang` mode: never answered.
    Hang,
    /// The `drop` mode: the connection closed unanswered.
    Drop,
    /// `400 exceed_context_size_error`: the prompt does not fit the context.
    ContextExceeded,
    /// 200 cut off at `max_tokens` or the context: `finish_reason: "length"`.
    Truncated,
    /// A 429 from a real limit: llama-swap's concurrency limit or a hosted
    /// endpoint's request or token bucket.
    Throttled,
    /// `429 insufficient_quota`: the hosted endpoint's credit is spent.
    QuotaExhausted,
    /// The model failed to load (llama-swap's health check timed out): 500.
    LoadFailed,
}

impl Answer {
    /// The answer a request gets when behaviour `mode` applies to it.
    pub fn of_mode(mode: Mode) -> Answer {
        match mode {
            Mode::Normal => Answer::Ok,
            Mode::Empty => Answer::Empty,
            Mode::Malformed => Answer::Malformed,
            Mode::Refuse => Answer::Refuse,
            Mode::RateLimit => Answer::RateLimit,
            Mode::Error => Answer::Error,
            Mode::Loading => Answer::Loading,
            Mode::Hang => Answer::Hang,
            Mode::Drop => Answer::Drop,
        }
    }

    /// Whether the server was impaired when it gave this answer (loading,
    /// full, collapsed, throttled or misbehaving); false only for `ok`, for
    /// requests the server rightly turned away, and for answers cut off at
    /// the limit the request or the context set.
    pub fn impaired(self) -> bool {
        match self {
            Answer::Ok | Answer::NotFound | Answer::BadRequest | Answer::ContextExceeded | Answer::Truncated => false,
            Answer::Loading
            | Answer::QueueFull
            | Answer::Collapsed
            | Answer::Abandoned
            | Answer::Empty
            | Answer::Malformed
            | Answer::Refuse
            | Answer::RateLimit
            | Answer::Error
            | Answer::Hang
            | Answer::Drop
            | Answer::Throttled
            | Answer::QuotaExhausted
            | Answer::LoadFailed => true,
        }
    }

    /// The answers that are a 429: a real limit's (`throttled`), the
    /// `rate_limit` mode's, and a spent quota's (`quota_exhausted`).
    pub const TOO_MANY_REQUESTS: [Answer; 3] = [Answer::Throttled, Answer::RateLimit, Answer::QuotaExhausted];

    /// Whether the server answered with a 429 ([`Answer::TOO_MANY_REQUESTS`]).
    pub fn is_429(self) -> bool {
        Answer::TOO_MANY_REQUESTS.contains(&self)
    }

    /// Its name in the trace and the report.
    pub fn name(self) -> &'static str {
        match self {
            Answer::Ok => "ok",
            Answer::Loading => "loading",
            Answer::QueueFull => "queue_full",
            Answer::Collapsed => "collapsed",
            Answer::NotFound => "not_found",
            Answer::BadRequest => "bad_request",
            Answer::Abandoned => "abandoned",
            Answer::Empty => "empty",
            Answer::Malformed => "malformed",
            Answer::Refuse => "refuse",
            Answer::RateLimit => "rate_limit",
            Answer::Error => "error",
            Answer::Hang => "hang",
            Answer::Drop => "drop",
            Answer::ContextExceeded => "context_exceeded",
            Answer::Truncated => "truncated",
            Answer::Throttled => "throttled",
            Answer::QuotaExhausted => "quota_exhausted",
            Answer::LoadFailed => "load_failed",
        }
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Answer {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::Duration;

    use redstring::decide::tokens::RefusedBy;
    use redstring::limiter::TokenLimitExceeded;
    use redstring::provider::DeploymentLimited;

    /// One error of each kind the classification tells apart, with the
    /// outcome it must get.
    fn classified() -> Vec<(ExtractError, CallOutcome)> {
        let tenant = redstring::TenantId::from_u128(1);
        let second = Duration::from_secs(1);
        vec![
            (
                redstring::CircuitOpen::new("gpu", second).into(),
                CallOutcome::CircuitOpen,
            ),
            (
                redstring::CircuitOpen::refused("api", second, redstring::Refusal::Cooldown).into(),
                CallOutcome::Cooldown,
            ),
            (
                redstring::RateLimitExceeded {
                    tenant,
                    priority: redstring::Priority::High,
                    limit: 3,
                    reserved: 0,
                    used: 3,
                    window: second,
                    retry_after: second,
                }
                .into(),
                CallOutcome::Deferred(Limit::Requests),
            ),
            (
                TokenLimitExceeded {
                    tenant,
                    by: RefusedBy::Tokens,
                    asked: 10,
                    used: 95,
                    limit: 100,
                    window: second,
                    retry_after: second,
                }
                .into(),
                CallOutcome::Deferred(Limit::Tokens),
            ),
            (
                DeploymentLimited {
                    model: "gpu".into(),
                    limit: "east".into(),
                    by: RefusedBy::Requests,
                    retry_after: Some(second),
                }
                .into(),
                CallOutcome::Deferred(Limit::Deployment),
            ),
        ]
    }

    #[test]
    fn outcomes_take_the_cores_names() {
        for (error, outcome) in classified() {
            assert_eq!(outcome.name(), error.kind(), "{error}");
            assert_eq!(CallOutcome::of(&Err::<(), _>(error)), outcome);
        }
        assert_eq!(CallOutcome::of(&Ok::<(), ExtractError>(())).name(), "ok");
    }

    #[test]
    fn a_quota_cooldown_is_not_the_breaker_and_every_own_limit_defers() {
        let outcomes: Vec<CallOutcome> = classified().into_iter().map(|(_, o)| o).collect();
        assert_ne!(outcomes[1], CallOutcome::CircuitOpen);
        assert!(!outcomes[0].is_deferred() && !outcomes[1].is_deferred());
        assert!(outcomes[2..].iter().all(|o| o.is_deferred()));
        assert!(!CallOutcome::Failed("retry_exhausted").is_deferred());
    }

    #[test]
    fn every_mode_has_its_answer() {
        for mode in Mode::ALL {
            let answer = Answer::of_mode(mode);
            assert_eq!(answer.impaired(), mode != Mode::Normal, "{mode:?}");
        }
    }
}
