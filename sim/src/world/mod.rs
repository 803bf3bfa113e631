//! The world: a turmoil simulation built from a scenario, driven through its
//! fault schedule.
//!
//! One host per machine in the modelled deployment — model servers, the
//! optional shared cache host, and the workers (turmoil clients, so the run
//! ends when they do). The driver steps the simulation and applies each fault
//! at its instant: crashes and restarts, behaviour changes, partitions, clock
//! steps, the cache host going down and coming back. Everything is seeded from
//! the scenario's seed and the epoch is fixed, so a run is a pure function of
//! (scenario, seed).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use redstring::MemoryCache;

use crate::hosts::cache_host::{RemoteCache, cache_host};
use crate::hosts::clock::{EPOCH, SimClock};
use crate::scenario::{CacheKind, Fault, Scenario};
use crate::hosts::server::{ServerHandle, server_host};
use crate::evidence::trace::{Kind, Trace, TraceEvent};
use crate::hosts::worker::{WorkerPlan, run_worker, stream_seed};

/// The cache host's name on the simulated network.
pub const CACHE_HOST: &str = "cache";

/// Connection backlog per host; well above any fleet's simultaneous connects.
const TCP_CAPACITY: usize = 8192;

/// A finished run.
#[derive(Clone, Debug)]
pub struct Run {
    /// The seed it ran with.
    pub seed: u64,
    /// Simulated time covered.
    pub simulated: Duration,
    /// Every event, in order.
    pub events: Vec<TraceEvent>,
}

/// The simulation itself failed (not an invariant: a host returned an error,
/// or turmoil stopped the run).
#[derive(Debug, thiserror::Error)]
#[error("simulation failed at {at_s:.3} s: {message}")]
pub struct SimError {
    /// Simulated seconds when it failed.
    pub at_s: f64,
    /// turmoil's or the host's description.
    pub message: String,
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
}

/// Runs `scenario` with `seed` to completion.
pub fn run(scenario: &Scenario, seed: u64) -> Result<Run, SimError> {
    let duration = secs(scenario.duration_s);
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .epoch(UNIX_EPOCH + Duration::from_micros(EPOCH.as_micros()))
        .tick_duration(Duration::from_millis(scenario.tick_ms))
        .simulation_duration(duration + Duration::from_secs(5))
        .min_message_latency(Duration::from_millis(scenario.network.min_latency_ms))
        .max_message_latency(Duration::from_millis(scenario.network.max_latency_ms))
        // turmoil panics when more connection attempts reach one host in a
        // tick than this; every call and cache operation opens one.
        .tcp_capacity(TCP_CAPACITY)
        .build();
    let trace = Trace::new();

    let mut servers = BTreeMap::new();
    for (i, spec) in scenario.servers.iter().enumerate() {
        let handle = ServerHandle::new(spec.behaviour);
        sim.host(
            spec.name.as_str(),
            server_host(
                spec.clone(),
                handle.clone(),
                trace.clone(),
                stream_seed(seed, 10_000 + i as u64, 0),
            ),
        );
        servers.insert(spec.name.clone(), handle);
    }

    let mut clocks: BTreeMap<String, SimClock> = BTreeMap::new();
    let shared = scenario.cache.kind == CacheKind::Shared;
    if shared {
        let clock = SimClock::new(scenario.cache.clock);
        sim.host(CACHE_HOST, cache_host(clock.clone(), scenario.cache.time_source));
        clocks.insert(CACHE_HOST.into(), clock);
    }
    let cache_timeout = Duration::from_millis(scenario.cache.timeout_ms.unwrap_or(250));

    let bursts: Vec<(Duration, u64, u32)> = scenario
        .faults
        .iter()
        .filter_map(|f| match f {
            Fault::Burst { at_s, calls, tenant } => Some((secs(*at_s), *tenant, *calls)),
            _ => None,
        })
        .collect();
    let mut index = 0u64;
    for group in &scenario.workers {
        for i in 0..group.count {
            let name = if group.count == 1 {
                group.name.clone()
            } else {
                format!("{}-{i}", group.name)
            };
            let server = group.servers[i as usize % group.servers.len()].clone();
            let model = scenario
                .servers
                .iter()
                .find(|s| s.name == server)
                .map(|s| s.model.clone())
                .unwrap_or_default();
            let clock = SimClock::new(group.clock);
            clocks.insert(name.clone(), clock.clone());
            let plan = WorkerPlan {
                name: name.clone(),
                index,
                server,
                model,
                tenants: group.tenants.clone(),
                clock: clock.clone(),
                hardening: scenario.hardening.clone(),
                seed,
                until: duration,
                bursts: bursts.clone(),
            };
            index += 1;
            let trace = trace.clone();
            if shared {
                let store = Arc::new(RemoteCache::new(CACHE_HOST, cache_timeout));
                sim.client(name.as_str(), async move { run_worker(plan, store, trace).await });
            } else {
                let store = Arc::new(MemoryCache::new(Arc::new(clock)));
                sim.client(name.as_str(), async move { run_worker(plan, store, trace).await });
            }
        }
    }

    let mut faults: Vec<&Fault> = scenario.faults.iter().collect();
    faults.sort_by(|a, b| a.at_s().total_cmp(&b.at_s()));
    let mut next = 0;
    loop {
        let now = sim.elapsed();
        while next < faults.len() && secs(faults[next].at_s()) <= now {
            apply(&mut sim, faults[next], &servers, &clocks, &trace);
            next += 1;
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => {
                return Err(SimError {
                    at_s: sim.elapsed().as_secs_f64(),
                    message: e.to_string(),
                });
            }
        }
    }
    Ok(Run {
        seed,
        simulated: sim.elapsed(),
        events: trace.events(),
    })
}

fn apply(
    sim: &mut turmoil::Sim<'_>,
    fault: &Fault,
    servers: &BTreeMap<String, ServerHandle>,
    clocks: &BTreeMap<String, SimClock>,
    trace: &Trace,
) {
    let what = match fault {
        // The server process dies but the machine stays up, so connections
        // are refused at once (turmoil's own crash would hold them instead).
        Fault::Crash { server, .. } => {
            if let Some(h) = servers.get(server) {
                h.kill();
            }
            format!("crash {server}")
        }
        Fault::Restart { server, .. } => {
            if let Some(h) = servers.get(server) {
                h.restart();
            }
            format!("restart {server}")
        }
        Fault::Behave { server, behaviour, .. } => {
            if let Some(h) = servers.get(server) {
                h.set_behaviour(*behaviour);
            }
            format!("{server} behaves {:?} (p={})", behaviour.mode, behaviour.probability)
        }
        Fault::Partition { a, b, .. } => {
            sim.partition(a.as_str(), b.as_str());
            format!("partition {a} / {b}")
        }
        Fault::Heal { a, b, .. } => {
            sim.repair(a.as_str(), b.as_str());
            format!("heal {a} / {b}")
        }
        Fault::Latency { a, b, ms, .. } => {
            sim.set_link_latency(a.as_str(), b.as_str(), Duration::from_millis(*ms));
            format!("latency {a} / {b} set to {ms} ms")
        }
        Fault::ClockStep { host, by_ms, .. } => {
            if let Some(c) = clocks.get(host) {
                c.step(*by_ms);
            }
            format!("step {host}'s clock by {by_ms} ms")
        }
        Fault::Burst { calls, tenant, .. } => format!("burst of {calls} calls per worker for tenant {tenant}"),
        Fault::CacheDown { .. } => {
            if sim.is_host_running(CACHE_HOST) {
                sim.crash(CACHE_HOST);
            }
            "cache host down".into()
        }
        Fault::CacheUp { .. } => {
            sim.bounce(CACHE_HOST);
            "cache host up".into()
        }
    };
    trace.record_at(sim.elapsed(), "driver", Kind::Fault { what });
}
