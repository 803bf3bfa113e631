//! What a model call can fail with, and which failures deserve a second attempt.
//!
//! Two layers of vocabulary. [`ProviderError`] is what one call to a model
//! server ends in: the server answered and the answer is unusable (malformed,
//! empty, refused), the server said no over HTTP (429, 503, 5xx, 401/403, 404,
//! 400), or the wire failed (refused, reset, timed out). Each knows whether it
//! is transient ([`ProviderError::is_transient`]) and, for a retry loop, how long
//! the server asked us to wait ([`ProviderError::retryable`]).
//!
//! [`ExtractError`] is what [`LlmProvider`](super::LlmProvider) returns: a
//! provider's error unwrapped, or one of the hardening layers' own outcomes —
//! an open circuit, a rate-limit refusal, an exhausted retry schedule, a
//! deadline that could not cover the next wait. One type for every provider,
//! so a hardened provider drops in wherever a plain one was.

use std::time::Duration;

use crate::breaker::CircuitOpen;
use crate::decide::tokens::RefusedBy;
use crate::error::CacheError;
use crate::limiter::{RateLimitExceeded, TokenLimitExceeded};
use crate::retry::{RetryDenied, RetryExhausted, Retryable};
use crate::tenant::Priority;
use crate::time::secs;

/// How the wire failed, as far as the transport could tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransportErrorKind {
    /// No connection was made (refused, unreachable, DNS, TLS handshake).
    Connect,
    /// The connection dropped after the request was sent, or the response was
    /// cut off.
    Reset,
    /// The request did not complete within its timeout.
    Timeout,
    /// Anything else the transport reports.
    Other,
    /// The peer answered with something that is not HTTP — another service
    /// on that port, or garbage. Permanent: the base URL points at the wrong
    /// thing.
    Protocol,
    /// The transport followed redirects until it gave up (a loop). Permanent.
    Redirect,
    /// The transport could not build the request from its URL or headers.
    /// Permanent.
    Invalid,
}

impl TransportErrorKind {
    /// A short lowercase name (`connect`, `reset`, `timeout`, `other`).
    pub fn as_str(self) -> &'static str {
        match self {
            TransportErrorKind::Connect => "connect",
            TransportErrorKind::Reset => "reset",
            TransportErrorKind::Timeout => "timeout",
            TransportErrorKind::Other => "other",
            TransportErrorKind::Protocol => "protocol",
            TransportErrorKind::Redirect => "redirect",
            TransportErrorKind::Invalid => "invalid",
        }
    }

    /// Whether the same request may get through if sent again: a failed
    /// connection, a reset, a timeout, or an unrecognised failure. A reply
    /// that is not HTTP, a redirect loop and an unbuildable request fail the
    /// same way every time.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            TransportErrorKind::Connect
                | TransportErrorKind::Reset
                | TransportErrorKind::Timeout
                | TransportErrorKind::Other
        )
    }
}

/// One call to a model server, failed.
///
/// Messages quoted from a server are truncated and have the configured API
/// key removed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// The text to extract from is empty or whitespace: a caller bug, returned
    /// before any network call.
    #[error("text to extract from is blank")]
    BlankText,
    /// Content arrived and does not validate against the caller's type. The
    /// serde error is the `source()`. Permanent: the same request gets the
    /// same answer.
    #[error("completion does not match schema {schema}")]
    Malformed {
        /// The schema's name (the caller's type).
        schema: String,
        /// Why serde rejected the content.
        #[source]
        source: serde_json::Error,
    },
    /// The server stopped generating at the output budget (`finish_reason:
    /// length`) before the JSON was complete. Permanent for this budget:
    /// raise `max_tokens`. The parse error is the `source()`.
    #[error(
        "completion was cut off at max_tokens (finish_reason: length) before its JSON for schema {schema} was complete; raise max_tokens"
    )]
    Truncated {
        /// The schema's name (the caller's type).
        schema: String,
        /// Where the JSON parser ran out of input.
        #[source]
        source: serde_json::Error,
    },
    /// The content is JSON wrapped in a Markdown code fence: the server
    /// ignored the strict structured output it was asked for
    /// (`response_format` `json_schema`) and let the model write free text.
    /// Permanent: check that the server supports and enables it.
    #[error(
        "completion for schema {schema} is JSON inside a Markdown code fence: the server ignored the strict structured output (response_format json_schema) it was asked for"
    )]
    StructuredOutputIgnored {
        /// The schema's name (the caller's type).
        schema: String,
    },
    /// HTTP 200 with no content. Permanent: `length` wants a larger
    /// `max_tokens`, `stop` a different prompt.
    #[error(
        "model returned no content (finish_reason: {}){}",
        finish_reason.as_deref().unwrap_or("none"),
        if *reasoning { "; it produced reasoning text only, so the token budget may have gone to reasoning" } else { "" }
    )]
    Empty {
        /// The server's `finish_reason`, when it gave one.
        finish_reason: Option<String>,
        /// Whether the message carried reasoning text (`reasoning` or
        /// `reasoning_content`).
        reasoning: bool,
    },
    /// The model declined: `message.refusal`, or `finish_reason:
    /// content_filter`. Permanent for this content.
    #[error("model refused: {reason}")]
    Refused {
        /// The refusal text, or `content_filter`.
        reason: String,
    },
    /// HTTP 429 asking us to slow down. Transient; honour `retry_after`.
    #[error("model server rate-limited the call{}: {message}", retry_after.map(|d| format!(" (retry after {}s)", secs(d))).unwrap_or_default())]
    RateLimited {
        /// The server's `retry-after-ms` / `retry-after`, when it sent one.
        retry_after: Option<Duration>,
        /// The server's message.
        message: String,
    },
    /// HTTP 429 `insufficient_quota`: the account is out of credit — or,
    /// as a [`HardenedProvider`](super::HardenedProvider) sees it, any quota
    /// signal whose reset is further away than its `max_server_delay` (a
    /// daily or monthly limit). Permanent: not retried at the deployment
    /// that said it.
    #[error("model server quota exhausted{}: {message}", retry_after.map(|d| format!(" (resets in {}s)", secs(d))).unwrap_or_default())]
    QuotaExhausted {
        /// When the quota resets, when the server said.
        retry_after: Option<Duration>,
        /// The server's message.
        message: String,
    },
    /// HTTP 503: the server is loading a model or its queue is full. Transient.
    #[error("model server unavailable (503){}: {message}", retry_after.map(|d| format!(" (retry after {}s)", secs(d))).unwrap_or_default())]
    Unavailable {
        /// The server's `retry-after`, when it sent one.
        retry_after: Option<Duration>,
        /// The server's message (`Loading model`).
        message: String,
    },
    /// A 5xx whose body says the server generated an answer and then could not
    /// use it — llama.cpp's chat parser rejecting the model's finished output
    /// (`The model produced output that does not match the expected
    /// peg-native format`). The server is up and answered; the same request
    /// costs the same generation again. Permanent, and not a breaker failure.
    /// `core/src/provider/wire.rs` lists the bodies recognised.
    #[error("model server could not use its model's output ({status}): {message}")]
    UnusableOutput {
        /// The HTTP status.
        status: u16,
        /// The server's message.
        message: String,
    },
    /// A 3xx: the base URL is not where the endpoint lives. Redirects are not
    /// followed for a POST (a client may re-send it as a GET, or loop), so
    /// this is permanent: set the base URL to where it points.
    #[error(
        "model server redirected the request ({status}) to {}; redirects are not followed: set the base URL to the endpoint itself",
        location.as_deref().unwrap_or("nowhere (no location header)")
    )]
    Redirected {
        /// The HTTP status.
        status: u16,
        /// The `location` header, when there was one.
        location: Option<String>,
    },
    /// Another 5xx, or 408. Transient.
    #[error("model server error {status}: {message}")]
    Server {
        /// The HTTP status.
        status: u16,
        /// The server's message.
        message: String,
    },
    /// HTTP 401 or 403: the key is wrong, expired or not allowed. Permanent.
    #[error("model server rejected the credentials ({status}): {message}")]
    Authentication {
        /// The HTTP status.
        status: u16,
        /// The server's message.
        message: String,
    },
    /// HTTP 404: the server has no such model (or the base URL is wrong).
    /// Permanent.
    #[error("model server does not know model `{model}` (check the model id and the /v1 base URL): {message}")]
    UnknownModel {
        /// The model id the request named.
        model: String,
        /// The server's message.
        message: String,
    },
    /// HTTP 400 (or another 4xx): the request itself is wrong, for example too
    /// long for the context. Permanent.
    #[error("model server rejected the request ({status}): {message}")]
    BadRequest {
        /// The HTTP status.
        status: u16,
        /// The server's message.
        message: String,
    },
    /// HTTP 200 whose body is not a chat completion. Permanent.
    #[error("model server answered with something that is not a chat completion: {detail}")]
    InvalidResponse {
        /// What was wrong with it.
        detail: String,
    },
    /// The response body exceeded the configured limit and was not read
    /// further. Permanent.
    #[error("model server response exceeds the {limit}-byte limit")]
    ResponseTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The request never got a usable HTTP answer: refused, reset, timed out
    /// (transient), or a reply that is not HTTP, a redirect loop, an
    /// unbuildable request (permanent; see [`TransportErrorKind::is_transient`]).
    #[error("transport error ({}): {detail}", kind.as_str())]
    Transport {
        /// How the wire failed.
        kind: TransportErrorKind,
        /// The transport's description.
        detail: String,
    },
}

impl ProviderError {
    /// Whether the same request may succeed if sent again: 429 (not
    /// `insufficient_quota`), 503, other 5xx and 408 (not a server saying it
    /// could not use its model's output), and the transport failures that
    /// are not the same every time. Everything else is the server having
    /// answered — retrying spends tokens and rate-limit slots to get the same
    /// answer.
    pub fn is_transient(&self) -> bool {
        match self {
            ProviderError::RateLimited { .. } | ProviderError::Unavailable { .. } | ProviderError::Server { .. } => {
                true
            }
            ProviderError::Transport { kind, .. } => kind.is_transient(),
            _ => false,
        }
    }

    /// The default retry verdict: [`Retryable::No`] for permanent errors,
    /// [`Retryable::After`] with the server's `Retry-After` when it sent one,
    /// [`Retryable::Yes`] otherwise.
    pub fn retryable(&self) -> Retryable {
        if !self.is_transient() {
            return Retryable::No;
        }
        match self.retry_after() {
            Some(d) => Retryable::After(d),
            None => Retryable::Yes,
        }
    }

    /// The wait the server asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ProviderError::RateLimited { retry_after, .. }
            | ProviderError::Unavailable { retry_after, .. }
            | ProviderError::QuotaExhausted { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether the model server answered (any HTTP status, including one
    /// whose body was too large to read, or a 200 whose content was unusable)
    /// rather than the wire failing or the caller being refused before a call.
    pub fn server_answered(&self) -> bool {
        !matches!(self, ProviderError::BlankText | ProviderError::Transport { .. })
    }

    /// Whether the server certainly generated nothing for this call: it was
    /// never reached (a refused connection), or it refused the request
    /// before any work (429, 503, a spent quota, a redirect, a 4xx). A token
    /// budget then releases the call's reservation; after anything else (a
    /// timeout, a reset, a 5xx, an unusable 200) the server may have spent
    /// tokens, and the estimate stays charged.
    pub fn generated_nothing(&self) -> bool {
        matches!(
            self,
            ProviderError::BlankText
                | ProviderError::RateLimited { .. }
                | ProviderError::QuotaExhausted { .. }
                | ProviderError::Unavailable { .. }
                | ProviderError::Redirected { .. }
                | ProviderError::Authentication { .. }
                | ProviderError::UnknownModel { .. }
                | ProviderError::BadRequest { .. }
                | ProviderError::Transport {
                    kind: TransportErrorKind::Connect | TransportErrorKind::Invalid | TransportErrorKind::Redirect,
                    ..
                }
        )
    }

    /// A short stable name for metrics and events (`malformed`, `empty`,
    /// `transport_timeout`).
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderError::BlankText => "blank_text",
            ProviderError::Malformed { .. } => "malformed",
            ProviderError::Truncated { .. } => "truncated",
            ProviderError::StructuredOutputIgnored { .. } => "structured_output_ignored",
            ProviderError::Empty { .. } => "empty",
            ProviderError::Refused { .. } => "refused",
            ProviderError::RateLimited { .. } => "rate_limited_by_server",
            ProviderError::QuotaExhausted { .. } => "quota_exhausted",
            ProviderError::Unavailable { .. } => "unavailable",
            ProviderError::UnusableOutput { .. } => "unusable_output",
            ProviderError::Redirected { .. } => "redirected",
            ProviderError::Server { .. } => "server_error",
            ProviderError::Authentication { .. } => "authentication",
            ProviderError::UnknownModel { .. } => "unknown_model",
            ProviderError::BadRequest { .. } => "bad_request",
            ProviderError::InvalidResponse { .. } => "invalid_response",
            ProviderError::ResponseTooLarge { .. } => "response_too_large",
            ProviderError::Transport { kind, .. } => match kind {
                TransportErrorKind::Connect => "transport_connect",
                TransportErrorKind::Reset => "transport_reset",
                TransportErrorKind::Timeout => "transport_timeout",
                TransportErrorKind::Other => "transport_other",
                TransportErrorKind::Protocol => "transport_protocol",
                TransportErrorKind::Redirect => "transport_redirect",
                TransportErrorKind::Invalid => "transport_invalid",
            },
        }
    }
}

/// Which wait a deadline could not cover.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeadlineWait {
    /// Waiting for the rate limiter to free a slot.
    RateLimit,
    /// The backoff (or the server's `Retry-After`) before the next attempt.
    Retry,
}

impl DeadlineWait {
    /// The phrase messages use for it (`the rate-limit wait`, `the next retry`).
    pub fn as_str(self) -> &'static str {
        match self {
            DeadlineWait::RateLimit => "the rate-limit wait",
            DeadlineWait::Retry => "the next retry",
        }
    }
}

/// The call's deadline could not cover the next wait, so it stopped before
/// sleeping. The failure that made the wait necessary is the `source()`.
#[derive(Debug, thiserror::Error)]
#[error(
    "deadline leaves {}s but {} needs {}s (after {attempts} attempts)",
    secs(*remaining),
    waiting_for.as_str(),
    secs(*needed)
)]
pub struct DeadlineExceeded {
    /// Which wait did not fit.
    pub waiting_for: DeadlineWait,
    /// Calls that reached the model server so far.
    pub attempts: u32,
    /// The wait that was needed.
    pub needed: Duration,
    /// What was left of the deadline.
    pub remaining: Duration,
    /// The failure (or refusal) that made the wait necessary.
    #[source]
    pub last: Box<ExtractError>,
}

/// Why an extraction produced no value: what every
/// [`LlmProvider`](super::LlmProvider) returns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExtractError {
    /// The model call failed, unwrapped: a permanent failure on its first
    /// attempt, or any failure from an unhardened provider.
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// The circuit is open: the model server is believed down, for every
    /// tenant; or (its [`reason`](CircuitOpen::reason) is
    /// [`Refusal::Cooldown`](crate::Refusal::Cooldown)) a shared cooldown
    /// after a quota signal is in force. No call was made; `retry_after`
    /// estimates when a probe is due, or when the cooldown ends.
    #[error(transparent)]
    CircuitOpen(#[from] CircuitOpen),
    /// The tenant is over its allowance, still, after the configured waits.
    /// No call was made.
    #[error(transparent)]
    RateLimited(#[from] RateLimitExceeded),
    /// Every attempt failed on a transient error. The message counts retries;
    /// `attempts` counts calls; the last failure is the `source()`.
    #[error(transparent)]
    RetryExhausted(RetryExhausted<Box<ExtractError>>),
    /// The deadline could not cover the next wait.
    #[error(transparent)]
    Deadline(#[from] DeadlineExceeded),
    /// A transient failure, but the fleet's retry budget denied the retry;
    /// the last failure is the `source()`.
    #[error(transparent)]
    RetryDenied(RetryDenied<Box<ExtractError>>),
    /// The rate limiter could not reach its cache, so no slot was granted.
    #[error("rate limiter could not reach its cache")]
    LimiterCache(#[source] CacheError),
    /// The tenant is over its tokens per window, still, after the configured
    /// waits — or the call's estimate alone is over the limit. No call was
    /// made.
    #[error(transparent)]
    TokenLimited(#[from] TokenLimitExceeded),
    /// Every deployment a call could go to was over its own limit
    /// ([`Deployment::limit`](super::Deployment::limit): requests or tokens
    /// per window, shared by every tenant), still, after the configured
    /// waits. That attempt made no call.
    #[error(transparent)]
    DeploymentLimited(#[from] DeploymentLimited),
    /// Every deployment a call could go to had as many calls in flight as
    /// its adaptive concurrency limit allows
    /// ([`adaptive_concurrency`](super::HardenedProviderBuilder::adaptive_concurrency)):
    /// the attempt made no call. No wait is known (calls end when they end):
    /// the hardened provider's default classifier retries it after the
    /// schedule's backoff.
    #[error(transparent)]
    ConcurrencyLimited(#[from] ConcurrencyLimited),
}

/// A deployment's adaptive concurrency limit refused an attempt: no call
/// was made to it.
///
/// The message names the model and the numbers: `deployment qwen3 has 8
/// calls in flight, at its adaptive limit of 8`; a caller kept from a
/// reserve names it: `deployment qwen3 has 6 calls in flight, at its
/// adaptive limit of 8 less 2 kept for high priority`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("deployment {model} has {in_flight} calls in flight, at its adaptive limit of {limit}{}", if *reserved > 0 { format!(" less {reserved} kept for high priority") } else { String::new() })]
pub struct ConcurrencyLimited {
    /// The model of the deployment refused.
    pub model: String,
    /// The class the call asked as.
    pub priority: Priority,
    /// Its calls in flight, fleet-wide, when it refused.
    pub in_flight: u64,
    /// Its limit then, in whole calls.
    pub limit: u64,
    /// Calls of that limit kept from this caller for a higher class (zero
    /// for a high caller, or without a reserve).
    pub reserved: u64,
}

/// A deployment's own limit refused an attempt: no call was made to it.
///
/// The message names the model and the limit: `deployment gpt-4o-mini
/// (limit "azure-east") is over its tokens per window; retry in 4.20s`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("deployment {model} (limit {limit:?}) is over its {}{}", by_words(*by), retry_after.map_or_else(|| "; the estimate alone is over it".to_owned(), |d| format!("; retry in {:.2}s", d.as_secs_f64())))]
pub struct DeploymentLimited {
    /// The model of the deployment refused.
    pub model: String,
    /// Its limit's key prefix (deployments sharing one limit share this).
    pub limit: String,
    /// Which of its limits refused.
    pub by: RefusedBy,
    /// How long until it would admit this attempt, if nothing else takes
    /// its room meanwhile; `None` when the attempt's estimate alone is over
    /// its tokens per window.
    pub retry_after: Option<Duration>,
}

/// A refusal's limit in words.
fn by_words(by: RefusedBy) -> &'static str {
    match by {
        RefusedBy::Requests => "requests per window",
        RefusedBy::Tokens => "tokens per window",
        RefusedBy::Both => "requests and tokens per window",
        RefusedBy::TooLarge => "tokens per window",
    }
}

impl ExtractError {
    /// The provider error behind this one, if it is one (looking through retry
    /// exhaustion and deadlines to the last attempt's failure).
    pub fn provider_error(&self) -> Option<&ProviderError> {
        match self {
            ExtractError::Provider(e) => Some(e),
            ExtractError::RetryExhausted(x) => x.last.provider_error(),
            ExtractError::Deadline(d) => d.last.provider_error(),
            ExtractError::RetryDenied(d) => d.last.provider_error(),
            _ => None,
        }
    }

    /// Whether sending the same request again may succeed: only a transient
    /// [`ProviderError`]. The hardening layers' own outcomes are final for this
    /// call (they already waited, or were told not to).
    pub fn is_transient(&self) -> bool {
        matches!(self, ExtractError::Provider(e) if e.is_transient())
    }

    /// The default retry verdict: the provider error's
    /// [`retryable`](ProviderError::retryable), and [`Retryable::No`] for
    /// everything else.
    pub fn retryable(&self) -> Retryable {
        match self {
            ExtractError::Provider(e) => e.retryable(),
            _ => Retryable::No,
        }
    }

    /// When the caller may usefully try again, if anything says: the
    /// breaker's estimate, the limiter's exact wait, or the server's
    /// `Retry-After`.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ExtractError::CircuitOpen(e) => Some(e.retry_after),
            ExtractError::RateLimited(e) => Some(e.retry_after),
            ExtractError::TokenLimited(e) if e.by != RefusedBy::TooLarge => Some(e.retry_after),
            ExtractError::DeploymentLimited(e) => e.retry_after,
            ExtractError::Provider(e) => e.retry_after(),
            _ => None,
        }
    }

    /// The quota signal a failed attempt carries: a server's 429 or 503
    /// asking for a non-zero wait (`Retry-After`, or the reset of an
    /// exhausted `x-ratelimit-*` limit). Only the attempt's own error — a
    /// hardening layer's outcome is no word from the server.
    pub fn quota_wait(&self) -> Option<Duration> {
        match self {
            ExtractError::Provider(
                ProviderError::RateLimited { retry_after, .. } | ProviderError::Unavailable { retry_after, .. },
            ) => retry_after.filter(|d| !d.is_zero()),
            _ => None,
        }
    }

    /// A short stable name for metrics and events: the provider error's
    /// [`kind`](ProviderError::kind), or `circuit_open`, `cooldown`,
    /// `rate_limited`, `retry_exhausted`, `deadline_exceeded`, `retry_denied`,
    /// `limiter_cache`, `token_limited`, `deployment_limited`,
    /// `concurrency_limited`.
    pub fn kind(&self) -> &'static str {
        match self {
            ExtractError::Provider(e) => e.kind(),
            ExtractError::CircuitOpen(CircuitOpen {
                reason: crate::Refusal::Cooldown,
                ..
            }) => "cooldown",
            ExtractError::CircuitOpen(_) => "circuit_open",
            ExtractError::RateLimited(_) => "rate_limited",
            ExtractError::RetryExhausted(_) => "retry_exhausted",
            ExtractError::Deadline(_) => "deadline_exceeded",
            ExtractError::RetryDenied(_) => "retry_denied",
            ExtractError::LimiterCache(_) => "limiter_cache",
            ExtractError::TokenLimited(_) => "token_limited",
            ExtractError::DeploymentLimited(_) => "deployment_limited",
            ExtractError::ConcurrencyLimited(_) => "concurrency_limited",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transport(kind: TransportErrorKind) -> ProviderError {
        ProviderError::Transport {
            kind,
            detail: "x".into(),
        }
    }

    #[test]
    fn transient_errors_are_exactly_the_ones_the_server_may_answer_differently() {
        let transient = [
            ProviderError::RateLimited {
                retry_after: None,
                message: String::new(),
            },
            ProviderError::Unavailable {
                retry_after: None,
                message: String::new(),
            },
            ProviderError::Server {
                status: 502,
                message: String::new(),
            },
            transport(TransportErrorKind::Connect),
            transport(TransportErrorKind::Reset),
            transport(TransportErrorKind::Timeout),
        ];
        for e in &transient {
            assert!(e.is_transient(), "{e}");
            assert_eq!(e.retryable(), Retryable::Yes, "{e}");
        }
        let permanent = [
            ProviderError::BlankText,
            ProviderError::Empty {
                finish_reason: Some("length".into()),
                reasoning: true,
            },
            ProviderError::Refused { reason: "no".into() },
            ProviderError::QuotaExhausted {
                retry_after: None,
                message: String::new(),
            },
            ProviderError::Authentication {
                status: 401,
                message: String::new(),
            },
            ProviderError::UnknownModel {
                model: "m".into(),
                message: String::new(),
            },
            ProviderError::BadRequest {
                status: 400,
                message: String::new(),
            },
            ProviderError::ResponseTooLarge { limit: 10 },
        ];
        for e in &permanent {
            assert!(!e.is_transient(), "{e}");
            assert_eq!(e.retryable(), Retryable::No, "{e}");
        }
    }

    #[test]
    fn server_delay_becomes_the_backoff_floor() {
        let e = ProviderError::RateLimited {
            retry_after: Some(Duration::from_millis(1500)),
            message: "slow down".into(),
        };
        assert_eq!(e.retryable(), Retryable::After(Duration::from_millis(1500)));
        assert_eq!(
            e.to_string(),
            "model server rate-limited the call (retry after 1.5s): slow down"
        );
        assert_eq!(
            ExtractError::from(e).retryable(),
            Retryable::After(Duration::from_millis(1500))
        );
    }

    #[test]
    fn hardening_outcomes_are_never_retried() {
        let open = ExtractError::from(CircuitOpen::new("m is unavailable", Duration::from_secs(3)));
        assert_eq!(open.retryable(), Retryable::No);
        assert_eq!(open.retry_after(), Some(Duration::from_secs(3)));
        assert_eq!(open.kind(), "circuit_open");
    }

    #[test]
    fn empty_notes_reasoning() {
        let e = ProviderError::Empty {
            finish_reason: Some("length".into()),
            reasoning: true,
        };
        assert!(
            e.to_string()
                .starts_with("model returned no content (finish_reason: length); it produced reasoning")
        );
        let e = ProviderError::Empty {
            finish_reason: None,
            reasoning: false,
        };
        assert_eq!(e.to_string(), "model returned no content (finish_reason: none)");
    }

    #[test]
    fn exhaustion_exposes_the_last_provider_error() {
        let x = ExtractError::RetryExhausted(RetryExhausted {
            attempts: 4,
            max_retries: 3,
            operation: "extract".into(),
            last: Box::new(transport(TransportErrorKind::Reset).into()),
        });
        assert_eq!(x.to_string(), "Exhausted 3 retries for extract");
        assert_eq!(x.provider_error().map(ProviderError::kind), Some("transport_reset"));
        let source = std::error::Error::source(&x).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("transport error (reset): x"));
    }
}
