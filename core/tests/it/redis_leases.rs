//! The probe-lease property on a real Redis: the breaker script, run through
//! any interleaving of admissions, reports, releases, vanished callers and
//! clock steps, holds at most `half_open_max_calls` live probes, never refuses
//! in half-open for longer than one lease, and lets only a live probe decide
//! an episode — the same checks `properties.rs` runs on `MemoryCache`.

use crate::support;
use crate::support::redis::LiveRedis;
use redstring::decide::breaker::BreakerKeys;
use redstring::{Clock, SystemClock};
use testkit::redis::RedisServer;

#[test]
fn probe_leases_hold_on_redis() {
    let Some(server) = RedisServer::start() else { return };
    let rt = support::redis::runtime();
    let redis = rt.block_on(async { server.cache() });
    let mut runner = support::redis::runner(48);
    let strategy = (1u32..3, 1u32..4, 1u64..15, support::lease::actions(80));
    let result = runner.run(&strategy, |(threshold, probes, lease_s, actions)| {
        server.flush();
        let keys = BreakerKeys::new("prop");
        let params = support::lease::params(threshold, probes, lease_s);
        rt.block_on(support::lease::run(&redis, &keys, params, SystemClock.now(), &actions));
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
