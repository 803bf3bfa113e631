//! The world: a turmoil simulation built from a scenario, driven through its
//! fault schedule.
//!
//! [`World::build`] makes one host per machine in the modelled deployment —
//! model servers, the optional shared cache host, and the workers (turmoil
//! clients, so the run ends when they do); [`World::apply`] applies one
//! [`Fault`] now; [`World::run`] steps the simulation to its end, applying
//! each fault of the schedule at its instant (in the order
//! [`fault::in_order`] defines). [`simulate`] is the whole pipeline every
//! caller uses — build, run, check the invariants. Every random stream is
//! seeded from the run's seed ([`seeds`]) and the epoch is fixed, so a run is
//! a pure function of (scenario, seed).

pub mod seeds;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use redstring::MemoryCache;

use crate::evidence::trace::{DRIVER, Kind, Trace, TraceEvent};
use crate::hosts::cache_host::{RemoteCache, cache_host};
use crate::hosts::clock::{EPOCH, SimClock};
use crate::hosts::server::{ServerHandle, server_host};
use crate::hosts::worker::{WorkerPlan, run_worker};
use crate::judgement::invariants::{Check, Invariant, check_all};
use crate::scenario::{CACHE_HOST, CacheKind, Fault, Network, Scenario, fault};

/// Connection backlog per host; well above any fleet's simultaneous connects.
const TCP_CAPACITY: usize = 8192;

/// How long a worker waits for the cache host when the scenario does not say.
const DEFAULT_CACHE_TIMEOUT_MS: u64 = 250;

/// A finished run: its evidence and the invariants' verdicts on it.
#[derive(Clone, Debug)]
pub struct Run {
    /// The seed it ran with.
    pub seed: u64,
    /// Simulated time covered.
    pub simulated: Duration,
    /// Every event, in order.
    pub events: Vec<TraceEvent>,
    /// Every invariant's verdict, in [`Invariant::ALL`] order.
    pub checks: Vec<Check>,
}

impl Run {
    /// The invariants that failed (violated and not declared `may_violate`).
    pub fn failed(&self) -> Vec<Invariant> {
        self.checks.iter().filter(|c| c.failed()).map(|c| c.name).collect()
    }
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

/// Runs `scenario` with `seed` to completion and checks every invariant.
pub fn simulate(scenario: &Scenario, seed: u64) -> Result<Run, SimError> {
    let (simulated, events) = World::build(scenario, seed).run()?;
    Ok(Run {
        seed,
        simulated,
        checks: check_all(scenario, &events),
        events,
    })
}

/// The turmoil settings every simulation uses: seeded from `seed`, from the
/// fixed epoch, stepping by `tick`, with `network`'s link latencies, for
/// `duration`.
pub fn sim_builder(seed: u64, tick: Duration, network: &Network, duration: Duration) -> turmoil::Builder {
    let mut builder = turmoil::Builder::new();
    builder
        .rng_seed(seeds::network(seed))
        .epoch(UNIX_EPOCH + Duration::from_micros(EPOCH.as_micros()))
        .tick_duration(tick)
        .simulation_duration(duration)
        .min_message_latency(Duration::from_millis(network.min_latency_ms))
        .max_message_latency(Duration::from_millis(network.max_latency_ms))
        // turmoil panics when more connection attempts reach one host in a
        // tick than this; every call and cache operation opens one.
        .tcp_capacity(TCP_CAPACITY);
    builder
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
}

/// A simulation built from a scenario, ready to run.
pub struct World<'s> {
    scenario: &'s Scenario,
    sim: turmoil::Sim<'static>,
    trace: Trace,
    servers: BTreeMap<String, ServerHandle>,
    clocks: BTreeMap<String, SimClock>,
}

impl<'s> World<'s> {
    /// Builds the hosts of `scenario` for a run with `seed`.
    pub fn build(scenario: &'s Scenario, seed: u64) -> World<'s> {
        let duration = secs(scenario.duration_s);
        let sim = sim_builder(
            seed,
            Duration::from_millis(scenario.tick_ms),
            &scenario.network,
            duration + Duration::from_secs(5),
        )
        .build();
        let mut world = World {
            scenario,
            sim,
            trace: Trace::new(),
            servers: BTreeMap::new(),
            clocks: BTreeMap::new(),
        };
        world.add_servers(seed);
        if scenario.cache.kind == CacheKind::Shared {
            let clock = SimClock::new(scenario.cache.clock);
            world
                .sim
                .host(CACHE_HOST, cache_host(clock.clone(), scenario.cache.time_source));
            world.clocks.insert(CACHE_HOST.into(), clock);
        }
        world.add_workers(seed, duration);
        world
    }

    fn add_servers(&mut self, seed: u64) {
        for (i, spec) in self.scenario.servers.iter().enumerate() {
            let handle = ServerHandle::new(spec.behaviour);
            let host = server_host(
                spec.clone(),
                handle.clone(),
                self.trace.clone(),
                seeds::server_behaviour(seed, i),
            );
            self.sim.host(spec.name.as_str(), host);
            self.servers.insert(spec.name.clone(), handle);
        }
    }

    fn add_workers(&mut self, seed: u64, until: Duration) {
        let s = self.scenario;
        let cache_timeout = Duration::from_millis(s.cache.timeout_ms.unwrap_or(DEFAULT_CACHE_TIMEOUT_MS));
        let bursts = s.bursts();
        for member in s.fleet() {
            let clock = SimClock::new(member.clock);
            self.clocks.insert(member.name.clone(), clock.clone());
            let plan = WorkerPlan {
                model: s.server(&member.server).map(|x| x.model.clone()).unwrap_or_default(),
                name: member.name,
                index: member.index,
                server: member.server,
                tenants: member.tenants,
                clock: clock.clone(),
                hardening: s.hardening.clone(),
                seed,
                until,
                bursts: bursts.clone(),
            };
            let (name, trace) = (plan.name.clone(), self.trace.clone());
            match s.cache.kind {
                CacheKind::Shared => {
                    let store = Arc::new(RemoteCache::new(CACHE_HOST, cache_timeout));
                    self.sim
                        .client(name.as_str(), async move { run_worker(plan, store, trace).await });
                }
                CacheKind::PerWorker => {
                    let store = Arc::new(MemoryCache::new(Arc::new(clock)));
                    self.sim
                        .client(name.as_str(), async move { run_worker(plan, store, trace).await });
                }
            }
        }
    }

    /// Applies `fault` now and records it in the trace.
    pub fn apply(&mut self, fault: &Fault) {
        let sim = &mut self.sim;
        match fault {
            // The server process dies but the machine stays up, so connections
            // are refused at once (turmoil's own crash would hold them instead).
            Fault::Crash { server, .. } => self.servers.get(server).into_iter().for_each(ServerHandle::kill),
            Fault::Restart { server, .. } => self.servers.get(server).into_iter().for_each(ServerHandle::restart),
            Fault::Behave { server, behaviour, .. } => {
                if let Some(h) = self.servers.get(server) {
                    h.set_behaviour(*behaviour);
                }
            }
            Fault::Partition { a, b, .. } => sim.partition(a.as_str(), b.as_str()),
            Fault::Heal { a, b, .. } => sim.repair(a.as_str(), b.as_str()),
            Fault::Latency { a, b, ms, .. } => {
                sim.set_link_latency(a.as_str(), b.as_str(), Duration::from_millis(*ms));
            }
            Fault::ClockStep { host, by_ms, .. } => {
                if let Some(c) = self.clocks.get(host) {
                    c.step(*by_ms);
                }
            }
            // A burst is load: each worker's plan fires it on the worker's own
            // timer (see `WorkerPlan::bursts`), at the exact instant rather
            // than at the driver's next step.
            Fault::Burst { .. } => {}
            Fault::CacheDown { .. } => {
                if sim.is_host_running(CACHE_HOST) {
                    sim.crash(CACHE_HOST);
                }
            }
            Fault::CacheUp { .. } => sim.bounce(CACHE_HOST),
        }
        self.trace
            .record_at(sim.elapsed(), DRIVER, Kind::Fault { fault: fault.clone() });
    }

    /// Runs to the end, applying the scenario's faults at their instants;
    /// returns the simulated time covered and the trace.
    pub fn run(mut self) -> Result<(Duration, Vec<TraceEvent>), SimError> {
        let scenario = self.scenario;
        let schedule = fault::in_order(&scenario.faults);
        let mut next = 0;
        loop {
            let now = self.sim.elapsed();
            while let Some(f) = schedule.get(next).filter(|f| secs(f.at_s()) <= now) {
                self.apply(f);
                next += 1;
            }
            match self.sim.step() {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    return Err(SimError {
                        at_s: self.sim.elapsed().as_secs_f64(),
                        message: e.to_string(),
                    });
                }
            }
        }
        Ok((self.sim.elapsed(), self.trace.events()))
    }
}
