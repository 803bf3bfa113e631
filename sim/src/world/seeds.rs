//! Seed derivation: every random stream of a run, from the run's one seed.
//!
//! A run is a pure function of (scenario, seed), so every source of
//! randomness — turmoil's own, each server's behaviour draws, each tenant's
//! arrivals and each tenant's retry jitter — gets a seed derived here, by one
//! named function per stream. Streams are told apart by a (worker, stream)
//! pair mixed into the run's seed; the numbering below is part of the replay
//! contract — changing it changes every trace.

/// Worker numbers at and above this one name model servers, not workers (no
/// fleet reaches it: a scenario has at most 500 workers per group).
const SERVER_STREAMS: u64 = 10_000;

/// Stream numbers at and above this one are a worker's retry-jitter streams
/// (one per tenant); below it, its arrival streams.
const JITTER_STREAMS: u64 = 1_000;

/// turmoil's own RNG (message latencies within the link's range).
pub fn network(run: u64) -> u64 {
    run
}

/// Model server `server`'s behaviour draws (the `probability` of its mode).
pub fn server_behaviour(run: u64, server: usize) -> u64 {
    mix(run, SERVER_STREAMS + server as u64, 0)
}

/// The arrival process of the `tenant`-th tenant of fleet member `worker`.
pub fn arrivals(run: u64, worker: u64, tenant: usize) -> u64 {
    mix(run, worker, tenant as u64)
}

/// The retry jitter of the `tenant`-th tenant of fleet member `worker`.
pub fn retry_jitter(run: u64, worker: u64, tenant: usize) -> u64 {
    mix(run, worker, JITTER_STREAMS + tenant as u64)
}

/// Stream numbers at and above this one (and below [`THINK_STREAMS`]) are a
/// worker's token-count streams, one per tenant.
const TOKEN_STREAMS: u64 = 2_000;

/// The prompt and output token counts drawn for the calls of the `tenant`-th
/// tenant of fleet member `worker` (tenants with `prompt_tokens` or
/// `output_tokens` distributions only).
pub fn tokens(run: u64, worker: u64, tenant: usize) -> u64 {
    mix(run, worker, TOKEN_STREAMS + tenant as u64)
}

/// Stream numbers at and above this one are a worker's closed-loop think
/// times (one per tenant and client); they sit above every other stream.
const THINK_STREAMS: u64 = 1 << 32;

/// The think times of closed-loop client `client` of the `tenant`-th tenant
/// of fleet member `worker`.
pub fn think(run: u64, worker: u64, tenant: usize, client: u32) -> u64 {
    mix(run, worker, THINK_STREAMS + ((tenant as u64) << 20) + u64::from(client))
}

/// SplitMix64-style mixing keeps nearby inputs' streams unrelated.
fn mix(seed: u64, worker: u64, stream: u64) -> u64 {
    let mut z = seed ^ worker.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ stream.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_of_one_run_differ() {
        let seeds = [
            server_behaviour(1, 0),
            server_behaviour(1, 1),
            arrivals(1, 0, 0),
            arrivals(1, 0, 1),
            arrivals(1, 1, 0),
            retry_jitter(1, 0, 0),
            tokens(1, 0, 0),
            tokens(1, 0, 1),
            think(1, 0, 0, 0),
            think(1, 0, 0, 1),
            think(1, 0, 1, 0),
        ];
        let unique: std::collections::BTreeSet<_> = seeds.iter().collect();
        assert_eq!(unique.len(), seeds.len());
        assert_ne!(arrivals(1, 0, 0), arrivals(2, 0, 0));
    }
}
