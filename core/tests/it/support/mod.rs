//! What several test modules share, compiled once for the whole binary.

pub mod cooldown;
pub mod lease;
pub mod provider;
#[cfg(feature = "redis")]
pub mod redis;
pub mod skew;
