//! Fixtures the simulator's host tests share.
// Each test crate uses only some of these.
#![allow(dead_code)]

use std::time::{Duration, UNIX_EPOCH};

use redstring_sim::hosts::clock::EPOCH;
use redstring_sim::scenario::ServerSpec;
use turmoil::{Builder, Sim};

/// A seeded simulation from the fixed epoch, 10 ms steps, 1–5 ms links.
pub fn sim<'a>(seed: u64, secs: u64) -> Sim<'a> {
    Builder::new()
        .rng_seed(seed)
        .epoch(UNIX_EPOCH + Duration::from_micros(EPOCH.as_micros()))
        .tick_duration(Duration::from_millis(10))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(5))
        .simulation_duration(Duration::from_secs(secs))
        .build()
}

/// A small server (two slots, a queue of four) that is ready at once.
pub fn spec() -> ServerSpec {
    ServerSpec {
        slots: 2,
        queue: 4,
        reload_s: 0.0,
        ..ServerSpec::named("gpu")
    }
}
