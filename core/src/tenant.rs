//! Tenant identity, the rate limiter's key, and the class a caller asks as.
//!
//! A tenant is whoever an allowance belongs to. It is a UUID, as in the
//! pipeline that writes under it, so the id a caller limits against is the same
//! id its data is stored under. Callers sharing one allowance can carry a
//! [`Priority`], so part of it can be kept for the interactive ones.

use std::fmt;
use std::str::FromStr;

use uuid::Uuid;

/// The id of a tenant: a UUID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct TenantId(Uuid);

impl TenantId {
    /// Wraps a UUID.
    pub const fn new(id: Uuid) -> Self {
        TenantId(id)
    }

    /// A tenant id from the 128 bits of a UUID; handy for fixed ids in tests and
    /// scenarios (`TenantId::from_u128(1)` is `00000000-…-000000000001`).
    pub const fn from_u128(bits: u128) -> Self {
        TenantId(Uuid::from_u128(bits))
    }

    /// The UUID.
    pub const fn as_uuid(&self) -> &Uuid {
        &self.0
    }
}

impl From<Uuid> for TenantId {
    fn from(id: Uuid) -> Self {
        TenantId(id)
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

impl FromStr for TenantId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(TenantId)
    }
}

/// A caller's class under an allowance that keeps a
/// [`reserve`](crate::RateLimiterBuilder::reserve) for the higher one: interactive
/// traffic beside batch jobs, say, on one deployment's limit. Without a
/// reserve both classes see the whole limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// May use the whole limit, the reserve included (the default, and what
    /// [`RateLimiter::acquire`](crate::RateLimiter::acquire) asks as).
    #[default]
    High,
    /// May use the limit but the reserve: refused once the window holds
    /// `limit − reserve` hits, whoever made them.
    Low,
}

impl Priority {
    /// The class's name in messages and metrics: `high` or `low`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Low => "low",
        }
    }
}

/// A reserve's share in whole parts per million, the unit every store step
/// takes it in: `share` in (0, 1) rounds into `1..=999_999` (a builder
/// refuses anything else; out of range it is clamped).
pub(crate) fn share_ppm(share: f64) -> u32 {
    // Exact: the clamped product rounds into 0..=10⁶.
    (share.clamp(0.0, 1.0) * 1e6).round() as u32
}

/// What a reserve of `ppm` parts per million keeps of `limit`:
/// `⌈limit × ppm / 10⁶⌉`, rounded up so the high class gets at least its
/// share; never more than `limit`.
pub(crate) fn reserved_ppm(limit: u64, ppm: u32) -> u64 {
    u64::try_from((u128::from(limit) * u128::from(ppm.min(1_000_000))).div_ceil(1_000_000)).unwrap_or(limit)
}
