//! Tenant identity, the rate limiter's key.
//!
//! A tenant is whoever an allowance belongs to. It is a UUID, as in the
//! pipeline that writes under it, so the id a caller limits against is the same
//! id its data is stored under.

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
