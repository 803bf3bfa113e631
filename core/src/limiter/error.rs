//! The limiter's refusal, and what `acquire` can fail with.

use std::time::Duration;

use super::tokens::RefusedBy;
use crate::error::CacheError;
use crate::tenant::{Priority, TenantId};
use crate::time::secs;

/// A tenant is over its allowance: "not now", with the exact wait.
///
/// The message names the tenant, as the original library's does: `tenant
/// 00000000-0000-0000-0000-00000000000a has used 60 calls in 60s; retry in
/// 0.42s`; a caller kept from a reserve names its class's share: `… has
/// used 45 calls in 60s, low priority's share is 42; retry in …`. Sleep on
/// [`retry_after`](Self::retry_after), never on a number parsed from the message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("tenant {tenant} has used {used} calls in {window_secs}s{}; retry in {retry_secs:.2}s", if *reserved > 0 { format!(", {} priority's share is {limit}", priority.as_str()) } else { String::new() }, window_secs = secs(*window), retry_secs = retry_after.as_secs_f64())]
pub struct RateLimitExceeded {
    /// The tenant refused.
    pub tenant: TenantId,
    /// The class it asked as.
    pub priority: Priority,
    /// Calls per window that class may take: `rpm`, less the reserve for a
    /// low one.
    pub limit: u32,
    /// Calls per window kept from this caller for a higher class (zero for
    /// a high caller, or without a reserve).
    pub reserved: u32,
    /// Hits in the window at the moment of refusal.
    pub used: u64,
    /// The limiter's window.
    pub window: Duration,
    /// When enough hits have aged out for a slot to be free to this class
    /// (at the limit, when the oldest has):
    /// sleeping exactly this long and asking again succeeds (unless another
    /// caller takes the slot first). At most one window, plus the microsecond
    /// after which a hit exactly one window old has left the inclusive window.
    pub retry_after: Duration,
}

/// Why [`RateLimiter::acquire`](super::RateLimiter::acquire) granted no slot.
#[derive(Debug, thiserror::Error)]
pub enum AcquireError {
    /// The tenant is over its allowance.
    #[error(transparent)]
    Limited(#[from] RateLimitExceeded),
    /// The cache could not answer.
    #[error("rate limiter could not reach its cache")]
    Cache(#[source] CacheError),
}

impl AcquireError {
    /// The wait to honour, when this is a rate-limit refusal.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            AcquireError::Limited(e) => Some(e.retry_after),
            AcquireError::Cache(_) => None,
        }
    }
}

/// A tenant is over its tokens per window: "not now", with the wait until the
/// estimate fits (or never, when the estimate alone is over the limit).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("tenant {tenant} asked for {asked} tokens with {used} of {limit} used in {window_secs}s{}", if *by == RefusedBy::TooLarge { "; the estimate alone is over the limit".to_owned() } else { format!("; retry in {:.2}s", retry_after.as_secs_f64()) }, window_secs = secs(*window))]
pub struct TokenLimitExceeded {
    /// The tenant refused.
    pub tenant: TenantId,
    /// Which limit refused: tokens, or tokens and requests together (a
    /// refusal by requests alone is a [`RateLimitExceeded`]), or an estimate
    /// over the whole limit.
    pub by: RefusedBy,
    /// The estimate asked for.
    pub asked: u64,
    /// Tokens counted in the window.
    pub used: u64,
    /// Tokens allowed per window.
    pub limit: u64,
    /// The limiter's window.
    pub window: Duration,
    /// How long until every refusing limit would admit this estimate, if
    /// nothing else is reserved meanwhile (the window for
    /// [`RefusedBy::TooLarge`], which never fits).
    pub retry_after: Duration,
}

/// Why [`RateLimiter::acquire_tokens`](super::RateLimiter::acquire_tokens)
/// granted nothing.
#[derive(Debug, thiserror::Error)]
pub enum TokenAcquireError {
    /// The tenant is over its requests per window.
    #[error(transparent)]
    Limited(#[from] RateLimitExceeded),
    /// The tenant is over its tokens per window.
    #[error(transparent)]
    Tokens(#[from] TokenLimitExceeded),
    /// The cache could not answer.
    #[error("rate limiter could not reach its cache")]
    Cache(#[source] CacheError),
}

impl TokenAcquireError {
    /// The wait to honour, when this is a refusal that a wait can end.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            TokenAcquireError::Limited(e) => Some(e.retry_after),
            TokenAcquireError::Tokens(e) if e.by != RefusedBy::TooLarge => Some(e.retry_after),
            _ => None,
        }
    }
}
