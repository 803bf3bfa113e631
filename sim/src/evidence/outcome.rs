//! How things ended, as data: a unit of work at a worker ([`CallOutcome`]) and
//! a request at a model server ([`Answer`]).
//!
//! The trace, the invariants, the report and the plots all decide by these
//! types, never by their names; the names exist once, here, for the written
//! trace and the report's tables. A call's error kind is the core's own
//! ([`ExtractError::kind`]): the simulator never spells it.

use std::fmt;
use std::time::Duration;

use redstring::provider::ExtractError;
use serde::{Serialize, Serializer};

use crate::scenario::Mode;

/// How a unit of work ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallOutcome {
    /// The extraction succeeded.
    Ok,
    /// The breaker refused the call ([`ExtractError::CircuitOpen`]).
    CircuitOpen,
    /// The limiter deferred the call ([`ExtractError::RateLimited`]).
    RateLimited,
    /// Any other error, named by the core's [`ExtractError::kind`].
    ///
    /// `ExtractError` is `#[non_exhaustive]`, so an error kind the core adds
    /// later lands here: a failure, which is what an unknown error is.
    Failed(&'static str),
}

impl CallOutcome {
    /// The outcome of `result`, classified by the core's error variants.
    pub fn of<T>(result: &Result<T, ExtractError>) -> CallOutcome {
        match result {
            Ok(_) => CallOutcome::Ok,
            Err(ExtractError::CircuitOpen(_)) => CallOutcome::CircuitOpen,
            Err(ExtractError::RateLimited(_)) => CallOutcome::RateLimited,
            Err(other) => CallOutcome::Failed(other.kind()),
        }
    }

    /// Its name in the trace and the report: `ok`, or the core's error kind.
    pub fn name(self) -> &'static str {
        match self {
            CallOutcome::Ok => "ok",
            CallOutcome::CircuitOpen => circuit_open_kind(),
            CallOutcome::RateLimited => rate_limited_kind(),
            CallOutcome::Failed(kind) => kind,
        }
    }

    /// Whether it succeeded.
    pub fn is_ok(self) -> bool {
        self == CallOutcome::Ok
    }
}

/// The core's name for a breaker refusal, asked of a refusal (no allocation).
fn circuit_open_kind() -> &'static str {
    ExtractError::CircuitOpen(redstring::CircuitOpen::new(String::new(), Duration::ZERO)).kind()
}

/// The core's name for a limiter refusal, asked of a refusal.
fn rate_limited_kind() -> &'static str {
    ExtractError::RateLimited(redstring::RateLimitExceeded {
        tenant: redstring::TenantId::from_u128(0),
        used: 0,
        window: Duration::ZERO,
        retry_after: Duration::ZERO,
    })
    .kind()
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

    #[test]
    fn outcomes_take_the_cores_names() {
        let open = ExtractError::from(redstring::CircuitOpen::new("gpu", Duration::from_secs(1)));
        assert_eq!(CallOutcome::CircuitOpen.name(), open.kind());
        assert_eq!(CallOutcome::of(&Err::<(), _>(open)), CallOutcome::CircuitOpen);
        assert_eq!(CallOutcome::of(&Ok::<(), ExtractError>(())).name(), "ok");
    }

    #[test]
    fn every_mode_has_its_answer() {
        for mode in Mode::ALL {
            let answer = Answer::of_mode(mode);
            assert_eq!(answer.impaired(), mode != Mode::Normal, "{mode:?}");
        }
    }
}
