//! The crate's integration tests, one module per area, all in one test
//! binary: one link instead of one per file, and the shared helpers under
//! `support/` compiled once instead of into every binary that used them —
//! building the test binaries was most of CI's time. `cargo test -p redstring
//! --test it <filter>` runs part of it (`properties::`, `redis_`, …).
//!
//! None of the tests stands alone: none installs a global allocator or a
//! global `tracing` subscriber (`observer`'s is scoped to its thread), sets
//! an environment variable, or needs its own harness, and each
//! `#[tokio::test]` builds its own runtime. What the process shares is the
//! two Redis Clusters (`testkit::redis::Cluster`, plain and TLS, each
//! started by the first test that asks and serialised by its own lock).
//!
//! The servers to test against come from the `testkit` crate (redis-server
//! topologies, the scripted HTTP server), which does not depend on
//! redstring; what needs redstring's types (a `RedisCache` for each
//! topology, the compliance harness) is in `support/`.
//!
//! A module that needs an optional feature (`openai`, `redis`, `redis-tls`,
//! `redis-cluster`, `redis-sentinel`, `tower`, `metrics`) is compiled only with
//! it.

mod support;

mod adaptive_concurrency;
mod breaker;
mod compliance_memory;
mod deployment_limits;
mod hedging;
mod limiter;
#[cfg(all(feature = "metrics", feature = "openai"))]
mod metrics;
mod observer;
mod properties;
#[cfg(feature = "openai")]
mod provider_hardened;
#[cfg(feature = "openai")]
mod provider_openai;
mod provider_router;
#[cfg(feature = "redis")]
mod quota_groups;
#[cfg(feature = "redis-cluster")]
mod redis_cluster;
#[cfg(all(feature = "redis-cluster", feature = "redis-tls"))]
mod redis_cluster_tls;
#[cfg(feature = "redis")]
mod redis_compliance;
#[cfg(feature = "redis")]
mod redis_concurrency;
#[cfg(feature = "redis")]
mod redis_cooldown;
#[cfg(feature = "redis")]
mod redis_degraded;
#[cfg(feature = "redis")]
mod redis_differential;
#[cfg(feature = "redis")]
mod redis_faults;
#[cfg(feature = "redis")]
mod redis_leases;
#[cfg(feature = "redis")]
mod redis_router;
#[cfg(feature = "redis-sentinel")]
mod redis_sentinel;
#[cfg(feature = "redis")]
mod redis_skew;
#[cfg(feature = "redis")]
mod redis_slow_calls;
#[cfg(feature = "redis")]
mod redis_slow_start;
#[cfg(feature = "redis")]
mod redis_time_source;
#[cfg(feature = "redis-tls")]
mod redis_tls;
#[cfg(all(feature = "redis", feature = "tower"))]
mod redis_tower;
mod redis_unavailable_policy;
mod retry;
mod router_edges;
mod shared_cooldown;
mod slow_start;
#[cfg(feature = "tower")]
mod tower;
#[cfg(feature = "openai")]
mod traces;
