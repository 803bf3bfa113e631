//! The world: a turmoil simulation built from a scenario, driven through its
//! fault schedule.
//!
//! [`World::build`] makes the turmoil hosts of the modelled deployment —
//! one per model server, the optional shared cache host, and the workers'
//! hosts, which several workers may share ([`layout`]; turmoil clients, so
//! the run ends when they do); [`World::apply`] applies one
//! [`Fault`] now; [`World::run`] steps the simulation to its end, applying
//! each fault of the schedule at its instant (in the order
//! [`fault::in_order`] defines); [`run_within`] builds and runs one and
//! hands back its [`Evidence`], judged a layer up
//! ([`crate::campaign::simulate`]). Every random stream is
//! seeded from the run's seed ([`seeds`]) and the epoch is fixed, so a run is
//! a pure function of (scenario, seed).
//!
//! A run is bounded: [`Budget`] caps the work one simulation may take on —
//! host-steps, calls and attempts — and a scenario that asks for
//! more ends with [`SimError::OverBudget`] naming what ran out, before it
//! starts (the calls and attempts are the schedule's expected numbers, known
//! up front) or, for steps, as soon as the count passes the cap.

pub mod layout;
pub mod seeds;

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use redstring::MemoryCache;

use crate::evidence::Evidence;
use crate::evidence::trace::{DRIVER, Kind, Trace, TraceEvent};
use crate::hosts::cache_host::{RemoteCache, cache_host};
use crate::hosts::clock::{EPOCH, SimClock};
use crate::hosts::server::quota::Credit;
use crate::hosts::server::{HostFuture, PORT, ServerHandle, server_on, servers_host};
use crate::hosts::transport::{ConnectionLimit, EPHEMERAL_PORTS};
use crate::hosts::worker::{Net, Target, WorkerPlan, run_worker};
use crate::scenario::{CACHE_HOST, CacheKind, CacheLayout, Fault, FleetMember, Network, Scenario, fault};

/// Connection backlog per host: turmoil panics ("server socket buffer full")
/// when more connection attempts than this wait for one host's accept, so it
/// is above what a valid fleet can open at once — at most
/// [`MAX_FLEET`](crate::scenario::limits::MAX_FLEET) workers, each holding
/// at most [`MAX_OPEN_CONNECTIONS`](crate::hosts::transport::MAX_OPEN_CONNECTIONS)
/// requests and as many cache operations. turmoil allocates the backlog only
/// as it fills, and a stream's buffer as segments arrive, so a large figure
/// costs nothing.
const TCP_CAPACITY: usize =
    crate::scenario::limits::MAX_FLEET as usize * 2 * crate::hosts::transport::MAX_OPEN_CONNECTIONS;

/// How long a worker waits for the cache host when the scenario does not say.
pub(crate) const DEFAULT_CACHE_TIMEOUT_MS: u64 = 250;

/// Whose clock the shared cache stamps with: the scenario's choice, unless
/// the [`CallerStampedTime`](redstring::mutants::Mutant::CallerStampedTime)
/// mutant is injected on this thread, which makes the cache trust every
/// worker's clock while the checkers still believe the scenario.
fn stamping(scenario: &Scenario) -> redstring::TimeSource {
    #[cfg(feature = "mutants")]
    if redstring::mutants::injected() == Some(redstring::mutants::Mutant::CallerStampedTime) {
        return redstring::TimeSource::Caller;
    }
    scenario.cache.time_source
}

/// The stores the workers are built over: the scenario's layout, unless
/// the [`PerReplicaLimits`](redstring::mutants::Mutant::PerReplicaLimits)
/// mutant is injected on this thread, which gives every worker an
/// in-process store of its own while the checkers still believe the fleet
/// shares one (a gateway's replicas each counting in memory).
fn layout_of(scenario: &Scenario) -> CacheLayout {
    #[cfg(feature = "mutants")]
    if redstring::mutants::injected() == Some(redstring::mutants::Mutant::PerReplicaLimits) {
        return CacheLayout {
            kind: CacheKind::PerWorker,
            ..scenario.cache.clone()
        };
    }
    scenario.cache.clone()
}

/// The simulation itself failed (not an invariant).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A host returned an error, or turmoil stopped the run.
    #[error("simulation failed at {at_s:.3} s: {message}")]
    Failed {
        /// Simulated seconds when it failed.
        at_s: f64,
        /// turmoil's or the host's description.
        message: String,
    },
    /// The run's watch stopped it before its end (`run --max-wall`):
    /// nothing was judged.
    #[error(
        "stopped at {at_s:.1} s of {duration_s} s simulated: {reason}; by then {arrived} calls had arrived and {ended} had ended"
    )]
    Stopped {
        /// Simulated seconds covered.
        at_s: f64,
        /// The scenario's duration.
        duration_s: f64,
        /// Why the watch stopped it.
        reason: String,
        /// Calls that had arrived.
        arrived: usize,
        /// Calls that had ended.
        ended: usize,
    },
    /// The scenario asks for more work than the [`Budget`] allows.
    #[error(
        "simulation over its work budget: {resource} would reach {needed} (budget {budget}); shorten the run, shrink the fleet or lower the load"
    )]
    OverBudget {
        /// What ran out.
        resource: Resource,
        /// How much the scenario needs (or had used when it stopped).
        needed: u64,
        /// The budget for it.
        budget: u64,
    },
}

/// A kind of work a [`Budget`] caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    /// Simulation steps times hosts: the time a run takes even when idle.
    HostSteps,
    /// Calls the fleet's tenants and bursts start (expected, from the
    /// schedule): the trace and the tasks grow with them.
    Calls,
    /// Admission attempts if every call used all its retries and limiter
    /// waits.
    Attempts,
}

impl std::fmt::Display for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Resource::HostSteps => "host-steps (steps × hosts)",
            Resource::Calls => "calls (expected arrivals and burst calls)",
            Resource::Attempts => "attempts (calls × (1 + max_retries + limiter_waits))",
        })
    }
}

/// The most work one simulation may take on, so that every scenario that
/// passes validation runs in bounded time and memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Most simulation steps times hosts.
    pub host_steps: u64,
    /// Most calls started, expected from the tenants' rates and the bursts.
    pub calls: u64,
    /// Most attempts, calls times `1 + max_retries + limiter_waits`: every
    /// request and every limiter refusal waited out leaves events behind.
    pub attempts: u64,
}

impl Budget {
    /// The budget [`crate::campaign::simulate`] runs with: ample for any fleet worth
    /// simulating (the 20-worker reference fleet uses under 1 % of it), and a
    /// few minutes of wall-clock time and a few GB of trace at most.
    pub const DEFAULT: Budget = Budget {
        host_steps: 250_000_000,
        calls: 1_000_000,
        attempts: 5_000_000,
    };

    /// The work `scenario` asks for, checked against this budget before it
    /// runs.
    pub fn check(&self, scenario: &Scenario) -> Result<(), SimError> {
        let work = Work::of(scenario);
        for (resource, needed, budget) in [
            (Resource::HostSteps, work.host_steps, self.host_steps),
            (Resource::Calls, work.calls, self.calls),
            (Resource::Attempts, work.attempts, self.attempts),
        ] {
            if needed > budget {
                return Err(SimError::OverBudget {
                    resource,
                    needed,
                    budget,
                });
            }
        }
        Ok(())
    }
}

/// The work a scenario asks for, known before it runs: what a [`Budget`]
/// caps, and what a run's wall time is estimated from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Work {
    /// Simulation steps.
    pub steps: u64,
    /// turmoil hosts.
    pub hosts: u64,
    /// Steps times hosts.
    pub host_steps: u64,
    /// Calls expected to start: arrivals and burst calls.
    pub calls: u64,
    /// Attempts if every call used all its retries and limiter waits.
    pub attempts: u64,
}

/// Wall time one host's runtime takes for a step it has nothing to do in,
/// as turmoil 0.7 ticks it: the floor every step pays per host (measured by
/// `cargo run --release -p redstring-sim --example idle_floor`; BENCHMARKS.md).
const WALL_PER_HOST_STEP: Duration = Duration::from_nanos(1_000);

/// Wall time one call takes on average through the whole stack — limiter,
/// breaker and cache operations over the network, the request, the server,
/// the trace — as measured on fleets of 500 to 5 000 workers (80 to 140 µs;
/// BENCHMARKS.md).
const WALL_PER_CALL: Duration = Duration::from_micros(120);

/// Memory one call holds at the peak of a run, rounded up from the 5.4 KB
/// measured on 50 000 replayed requests arriving at one instant.
pub const BYTES_PER_CALL: u64 = 6 * 1024;

impl Work {
    /// The work of one run of `scenario`.
    pub fn of(scenario: &Scenario) -> Work {
        let fleet = scenario.fleet();
        let hosts = hosts(scenario);
        let tick = Duration::from_millis(scenario.tick_ms.max(1));
        let steps = u64::try_from(run_length(scenario).as_nanos().div_ceil(tick.as_nanos())).unwrap_or(u64::MAX);
        let arrivals: f64 = fleet
            .iter()
            .flat_map(|m| m.tenants.iter())
            .map(|t| t.most_calls_per_min(scenario.duration_s) / 60.0 * scenario.duration_s)
            .sum();
        let bursts: f64 = scenario
            .bursts()
            .iter()
            .map(|b| {
                let workers = fleet
                    .iter()
                    .filter(|m| m.tenants.iter().any(|t| t.id == b.tenant))
                    .count();
                f64::from(b.calls) * workers as f64
            })
            .sum();
        // Saturating float-to-int conversions: NaN is 0, too large is u64::MAX.
        let calls = (arrivals + bursts).ceil() as u64;
        let h = &scenario.hardening;
        let per_call = 1 + u64::from(h.max_retries) + u64::from(h.limiter_waits);
        Work {
            steps,
            hosts,
            host_steps: steps.saturating_mul(hosts),
            calls,
            attempts: calls.saturating_mul(per_call),
        }
    }

    /// About how much memory a run of this work holds at its peak: its
    /// calls' tasks and trace events, [`BYTES_PER_CALL`] each. A trace
    /// replaying every request at one instant, all waiting out the limiter
    /// at once, holds the most (5.4 KB a call, measured); calls spread over
    /// the run and answered hold less.
    pub fn memory_estimate(&self) -> u64 {
        self.calls.saturating_mul(BYTES_PER_CALL)
    }

    /// About how long a run of this work takes on one core of the machine
    /// BENCHMARKS.md was measured on: within a factor of two or so either
    /// way, enough to warn of a run of minutes before it starts.
    pub fn wall_estimate(&self) -> Duration {
        // turmoil ticks the network's own runtime as well as every host's.
        let runtime_steps = self.steps as f64 * (self.hosts as f64 + 1.0);
        let s = runtime_steps * WALL_PER_HOST_STEP.as_secs_f64() + self.calls as f64 * WALL_PER_CALL.as_secs_f64();
        Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
    }
}

/// The turmoil hosts a run of `scenario` has: its servers' hosts, the cache
/// host if shared, and the workers' hosts ([`layout`]).
fn hosts(scenario: &Scenario) -> u64 {
    let cache = u64::from(scenario.cache.kind == CacheKind::Shared);
    (layout::server_hosts(scenario).len() as u64)
        .saturating_add(layout::worker_hosts(scenario).len() as u64)
        .saturating_add(cache)
}

/// Simulated time a run of `scenario` covers: its duration and a grace
/// period for calls in flight to end.
pub fn run_length(scenario: &Scenario) -> Duration {
    secs(scenario.duration_s).saturating_add(Duration::from_secs(5))
}

/// Runs `scenario` with `seed` to completion within `budget` and returns
/// what it left behind; judging it is [`crate::judgement::judge`]'s, and
/// [`crate::campaign::simulate`] does both.
pub fn run_within(scenario: &Scenario, seed: u64, budget: Budget) -> Result<Evidence, SimError> {
    run_watched(scenario, seed, budget, &mut |_| ControlFlow::Continue(()))
}

/// Like [`run_within`], with `watch` told the simulated time as the run
/// goes ([`World::run_watched`]).
pub fn run_watched(scenario: &Scenario, seed: u64, budget: Budget, watch: Watch<'_>) -> Result<Evidence, SimError> {
    run_traced(scenario, seed, budget, watch, Trace::new())
}

/// Like [`run_watched`], the hosts writing into `trace` (one
/// [`Trace::metered`] keeps the run's metrics too).
pub fn run_traced(
    scenario: &Scenario,
    seed: u64,
    budget: Budget,
    watch: Watch<'_>,
    trace: Trace,
) -> Result<Evidence, SimError> {
    budget.check(scenario)?;
    let (simulated, events) = World::build_traced(scenario, seed, trace).run_watched(budget, watch)?;
    Ok(Evidence {
        seed,
        simulated,
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
        .tcp_capacity(TCP_CAPACITY)
        .ephemeral_ports(EPHEMERAL_PORTS);
    builder
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
}

/// Runs one worker over its store: a client of the shared cache host, or an
/// in-process cache of its own on its own clock.
async fn worker(
    plan: WorkerPlan,
    cache: CacheLayout,
    ports: Arc<ConnectionLimit>,
    trace: Trace,
) -> Result<(), Box<dyn std::error::Error>> {
    match cache.kind {
        CacheKind::Shared => {
            let timeout = Duration::from_millis(cache.timeout_ms.unwrap_or(DEFAULT_CACHE_TIMEOUT_MS));
            let store = Arc::new(RemoteCache::on(CACHE_HOST, timeout, ports));
            run_worker(plan, store, trace).await
        }
        CacheKind::PerWorker => {
            let store = Arc::new(MemoryCache::new(Arc::new(plan.clock.clone())));
            run_worker(plan, store, trace).await
        }
    }
}

/// The plan of fleet member `member` of `scenario` for a run with `seed`
/// until `until`, over `net`, each server at the base URL `url` gives it:
/// the one way a worker is set up, simulated or in the laboratory.
pub fn worker_plan(
    scenario: &Scenario,
    member: FleetMember,
    seed: u64,
    until: Duration,
    net: Net,
    url: impl Fn(&str) -> String,
) -> WorkerPlan {
    let deployments = member
        .servers
        .iter()
        .map(|name| {
            let spec = scenario.server(name);
            Target {
                server: name.clone(),
                url: url(name),
                model: spec.map(|x| x.model.clone()).unwrap_or_default(),
                weight: spec.map_or(1, |x| x.slots),
                quota_group: spec.and_then(|x| x.quota_group.clone()),
            }
        })
        .collect();
    WorkerPlan {
        deployments,
        name: member.name,
        index: member.index,
        tenants: member.tenants,
        clock: SimClock::new(member.clock),
        hardening: scenario.hardening.clone(),
        seed,
        until,
        bursts: scenario.bursts(),
        net,
    }
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
        Self::build_traced(scenario, seed, Trace::new())
    }

    /// Like [`World::build`], the hosts writing into `trace`, which should
    /// be empty.
    pub fn build_traced(scenario: &'s Scenario, seed: u64, trace: Trace) -> World<'s> {
        let duration = secs(scenario.duration_s);
        let sim = sim_builder(
            seed,
            Duration::from_millis(scenario.tick_ms),
            &scenario.network,
            run_length(scenario),
        )
        .build();
        let mut world = World {
            scenario,
            sim,
            trace,
            servers: BTreeMap::new(),
            clocks: BTreeMap::new(),
        };
        world.add_servers(seed);
        if scenario.cache.kind == CacheKind::Shared {
            let clock = SimClock::new(scenario.cache.clock);
            world
                .sim
                .host(CACHE_HOST, cache_host(clock.clone(), stamping(scenario)));
            world.clocks.insert(CACHE_HOST.into(), clock);
        }
        world.add_workers(seed, duration);
        world
    }

    fn add_servers(&mut self, seed: u64) {
        // One account per quota group, its credit shared by the group's keys.
        let mut accounts: BTreeMap<&str, Credit> = BTreeMap::new();
        for host in layout::server_hosts(self.scenario) {
            let mut servers: Vec<Box<dyn Fn() -> HostFuture>> = Vec::new();
            for (i, port) in host.members {
                let Some(spec) = self.scenario.servers.get(i) else {
                    continue;
                };
                let mut handle = ServerHandle::new(spec.behaviour);
                if let Some(group) = &spec.quota_group {
                    let credit = accounts
                        .entry(group.as_str())
                        .or_insert_with(|| Credit::new(spec.quota.and_then(|q| q.credit_tokens)));
                    handle = handle.on_account(credit.clone());
                }
                servers.push(Box::new(server_on(
                    spec.clone(),
                    handle.clone(),
                    self.trace.clone(),
                    seeds::server_behaviour(seed, i),
                    port,
                )));
                self.servers.insert(spec.name.clone(), handle);
            }
            self.sim.host(host.name.as_str(), servers_host(servers));
        }
    }

    fn add_workers(&mut self, seed: u64, until: Duration) {
        let time_wait = layout::time_wait(self.scenario);
        let addresses = Arc::new(layout::addresses(self.scenario));
        for host in layout::worker_hosts(self.scenario) {
            let ports = ConnectionLimit::host(time_wait);
            let net = Net::Sim {
                ports: ports.clone(),
                addresses: addresses.clone(),
            };
            let plans: Vec<WorkerPlan> = host
                .members
                .into_iter()
                .map(|member| self.plan(member, seed, until, net.clone()))
                .collect();
            let trace = self.trace.clone();
            let cache = layout_of(self.scenario);
            self.sim.client(host.name.as_str(), async move {
                let workers: Vec<_> = plans
                    .into_iter()
                    .map(|plan| tokio::task::spawn_local(worker(plan, cache.clone(), ports.clone(), trace.clone())))
                    .collect();
                for w in workers {
                    w.await.map_err(|e| e.to_string())??;
                }
                Ok(())
            });
        }
    }

    /// The plan of one fleet member, whose clock the driver may then step.
    fn plan(&mut self, member: FleetMember, seed: u64, until: Duration, net: Net) -> WorkerPlan {
        let plan = worker_plan(self.scenario, member, seed, until, net, |server| {
            format!("http://{server}:{PORT}/v1")
        });
        self.clocks.insert(plan.name.clone(), plan.clock.clone());
        plan
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
        self.trace.host(DRIVER).record_at(
            sim.elapsed(),
            Kind::Fault {
                fault: Box::new(fault.clone()),
            },
        );
    }

    /// Runs to the end, applying the scenario's faults at their instants;
    /// returns the simulated time covered and the trace.
    pub fn run(self) -> Result<(Duration, Vec<TraceEvent>), SimError> {
        self.run_within(Budget::DEFAULT)
    }

    /// Like [`World::run`], but ends with [`SimError::OverBudget`] as soon as
    /// the steps taken times the hosts pass `budget.host_steps`.
    pub fn run_within(self, budget: Budget) -> Result<(Duration, Vec<TraceEvent>), SimError> {
        self.run_watched(budget, &mut |_| ControlFlow::Continue(()))
    }

    /// Like [`World::run_within`], telling `watch` the simulated time
    /// covered every [`WATCH_EVERY`] steps; a watch that breaks with a
    /// reason ends the run there with [`SimError::Stopped`].
    pub fn run_watched(mut self, budget: Budget, watch: Watch<'_>) -> Result<(Duration, Vec<TraceEvent>), SimError> {
        let scenario = self.scenario;
        let schedule = fault::in_order(&scenario.faults);
        let hosts = hosts(scenario).max(1);
        let mut host_steps: u64 = 0;
        let mut steps: u64 = 0;
        let mut next = 0;
        loop {
            host_steps = host_steps.saturating_add(hosts);
            if host_steps > budget.host_steps {
                return Err(SimError::OverBudget {
                    resource: Resource::HostSteps,
                    needed: host_steps,
                    budget: budget.host_steps,
                });
            }
            let now = self.sim.elapsed();
            steps += 1;
            if steps.is_multiple_of(WATCH_EVERY)
                && let ControlFlow::Break(reason) = watch(now)
            {
                return Err(SimError::Stopped {
                    at_s: now.as_secs_f64(),
                    duration_s: scenario.duration_s,
                    reason,
                    arrived: self.trace.count(|k| matches!(k, Kind::Arrival { .. })),
                    ended: self.trace.count(|k| matches!(k, Kind::CallEnd { .. })),
                });
            }
            while let Some(f) = schedule.get(next).filter(|f| secs(f.at_s()) <= now) {
                self.apply(f);
                next += 1;
            }
            match self.sim.step() {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    return Err(SimError::Failed {
                        at_s: self.sim.elapsed().as_secs_f64(),
                        message: e.to_string(),
                    });
                }
            }
        }
        let simulated = self.sim.elapsed();
        // Calls still in flight end with their hosts, after the run.
        if let Some(metrics) = self.trace.metrics() {
            metrics.seal();
        }
        // The hosts go first: whatever they hold of the run is freed before
        // the evidence is judged.
        drop(self.sim);
        Ok((simulated, self.trace.take()))
    }
}

/// How many steps apart a run's [`Watch`] is called.
pub const WATCH_EVERY: u64 = 1024;

/// Watches a run as it goes ([`World::run_watched`]): given the simulated
/// time covered, it lets the run go on or stops it with a reason.
pub type Watch<'a> = &'a mut dyn FnMut(Duration) -> ControlFlow<String>;
