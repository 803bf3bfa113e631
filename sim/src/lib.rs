//! A deterministic simulator for redstring's hardening.
//!
//! The same core code that runs in production — limiter, breaker, retry, the
//! OpenAI-compatible adapter and the hardened provider — runs here inside the
//! `turmoil` network simulator against flaky GPU model servers, fleets sharing
//! a cache, partitions and skewed clocks. A run is a pure function of its
//! scenario and seed: the same pair gives the same trace, byte for byte.

pub mod cache_host;
pub mod clock;
pub mod fuzz;
pub mod invariants;
pub mod report;
pub mod scenario;
pub mod server;
pub mod timeline;
pub mod trace;
pub mod transport;
pub mod worker;
pub mod world;
