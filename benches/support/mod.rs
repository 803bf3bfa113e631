//! What the Redis benches share: the limiter request they send and the
//! concurrent-acquire load, so a single node and a cluster are measured by
//! the same loop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redstring::Timestamp;
use redstring::cache::redis::RedisCache;
use redstring::cache::{LimiterStore, SlotRequest};

/// Hits allowed per window: high, so the load measures admissions.
pub const RPM: u32 = 1_000;
/// The limiter's window.
pub const WINDOW: Duration = Duration::from_secs(60);
/// How far each iteration's stamp moves on: a little more than window /
/// rpm, so the window holds about `rpm` hits, the steady state of a tenant
/// at its limit.
pub const STEP: Duration = Duration::from_millis(61);

/// The acquire request stamped `now`.
pub fn request(now: Timestamp) -> SlotRequest {
    SlotRequest {
        now,
        window: WINDOW,
        limit: RPM,
        ttl: WINDOW * 2,
        max_ahead: Duration::ZERO,
    }
}

/// Iteration `i`'s stamp: `STEP` apart from `t0` on.
pub fn stamp(t0: Timestamp, i: u64) -> Timestamp {
    t0.saturating_add(STEP * u32::try_from(i % 1_000_000).unwrap_or(0))
}

/// `tasks` tasks on `cache`, each on its own tenant key, each acquiring
/// `iters` times as fast as the server answers; the wall time it took.
pub fn acquire_race(
    rt: &tokio::runtime::Runtime,
    cache: &Arc<RedisCache>,
    tasks: u64,
    iters: u64,
    t0: Timestamp,
) -> Duration {
    rt.block_on(async {
        let start = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|t| {
                let cache = cache.clone();
                tokio::spawn(async move {
                    let key = format!("tp-{t}");
                    for i in 0..iters {
                        cache.acquire_slot(&key, request(stamp(t0, i))).await.unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap();
        }
        start.elapsed()
    })
}
