//! Which turmoil host each worker and each model server runs on.
//!
//! turmoil links every host to every other and each host's delivery walks
//! every link each step, so its cost per step grows with the cube of the
//! hosts, and a fleet of one host per worker or per server spends its time
//! walking links. Workers therefore share hosts, in fleet order, every one
//! still with its own clock, cache, random streams, connection limit and
//! name in the trace. A host takes [`WORKERS_PER_HOST`] workers, as it
//! always has, and more, up to [`MOST_WORKERS_PER_HOST`], while the
//! connections its workers are estimated to hold at once fit in seven
//! eighths of its ports, so that sharing them is not what refuses a worker
//! a connection. Model servers share one host, [`SERVERS_HOST`], each
//! listening on a port of its own ([`server_hosts`]) and still reached by
//! its own name ([`Addresses`]); a server's crash, restart and behaviour
//! act on its process, not on the host. A host is the unit turmoil
//! partitions and delays, so a worker or a server a network fault names (a
//! `partition`, `heal` or `latency` with it as `a` or `b`) keeps a host of
//! its own, under its own name, and the fault acts on it alone. Every other
//! fault that names a worker — a clock step — acts on the worker's own
//! clock wherever it runs.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::hosts::server::PORT;
use crate::hosts::transport::{self, Addresses};
use crate::scenario::{Fault, FleetMember, Scenario};

/// The workers a shared host always takes (fewer only at the fleet's end).
pub const WORKERS_PER_HOST: usize = 64;

/// The most workers one shared host runs, however few connections they
/// need. Measured on the fleets of `benches/fleet-scale.sh` with fixed
/// sizes (5 000 × 50: 64 a host took 146 s, 256 took 89 s, 1 024 took
/// 78 s; 500 × 10: 5.2–5.8 s, 5.2 s, 4.7 s): fewer hosts walk fewer links
/// each step.
pub const MOST_WORKERS_PER_HOST: usize = 1024;

/// The connections the workers on one shared host may need at once, in
/// all: seven eighths of the host's
/// [`HOST_PORTS`](crate::hosts::transport::HOST_PORTS), the rest left to
/// connections in `TIME_WAIT` (closed within two link latencies).
const HOST_PORT_BUDGET: f64 = (transport::HOST_PORTS - transport::HOST_PORTS / 8) as f64;

/// One turmoil host of workers.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerHost {
    /// The host's name: its worker's own when it has one worker of its
    /// own, else `workers#k`, which no scenario name can be (names are
    /// letters, digits and dashes).
    pub name: String,
    /// The workers on it, in fleet order.
    pub members: Vec<FleetMember>,
}

/// The hosts `scenario`'s fleet runs on: one for each worker a network
/// fault names, in fleet order, then the rest in shared hosts, in fleet
/// order: [`WORKERS_PER_HOST`] on each, or more while the connections they
/// may need fit the host's ports, up to [`MOST_WORKERS_PER_HOST`].
pub fn worker_hosts(scenario: &Scenario) -> Vec<WorkerHost> {
    let named = network_named(scenario);
    let (own, shared): (Vec<FleetMember>, Vec<FleetMember>) = scenario
        .fleet()
        .into_iter()
        .partition(|m| named.contains(m.name.as_str()));
    let mut hosts: Vec<WorkerHost> = own
        .into_iter()
        .map(|m| WorkerHost {
            name: m.name.clone(),
            members: vec![m],
        })
        .collect();
    let bursts = scenario.bursts();
    let mut groups: Vec<Vec<FleetMember>> = Vec::new();
    let mut needed = 0.0;
    for member in shared {
        let need = ports_needed(scenario, &member, &bursts);
        match groups.last_mut() {
            Some(group)
                if group.len() < WORKERS_PER_HOST
                    || (group.len() < MOST_WORKERS_PER_HOST && needed + need <= HOST_PORT_BUDGET) =>
            {
                needed += need;
                group.push(member);
            }
            _ => {
                needed = need;
                groups.push(vec![member]);
            }
        }
    }
    hosts.extend(groups.into_iter().enumerate().map(|(k, members)| WorkerHost {
        name: format!("workers#{k}"),
        members,
    }));
    hosts
}

/// The turmoil host the model servers no network fault names share. No
/// scenario name can be it (names are letters, digits and dashes).
pub const SERVERS_HOST: &str = "servers#";

/// One turmoil host of model servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerHost {
    /// The host's name: its server's own when a network fault names the
    /// server, else [`SERVERS_HOST`].
    pub name: String,
    /// The servers on it, each as its index in the scenario's `servers`
    /// and the port it listens on.
    pub members: Vec<(usize, u16)>,
}

/// The hosts `scenario`'s model servers run on: one for each server a
/// network fault names, on [`PORT`], in the scenario's order, then one,
/// [`SERVERS_HOST`], for the rest, the `k`-th of them on port `PORT + k`.
pub fn server_hosts(scenario: &Scenario) -> Vec<ServerHost> {
    let named = network_named(scenario);
    let (own, shared): (Vec<usize>, Vec<usize>) =
        (0..scenario.servers.len()).partition(|&i| named.contains(scenario.servers[i].name.as_str()));
    let mut hosts: Vec<ServerHost> = own
        .into_iter()
        .map(|i| ServerHost {
            name: scenario.servers[i].name.clone(),
            members: vec![(i, PORT)],
        })
        .collect();
    if !shared.is_empty() {
        // At most `MAX_SERVERS` (100) servers: every port stays below 8 180.
        let port = |k: usize| PORT.saturating_add(u16::try_from(k).unwrap_or(u16::MAX));
        hosts.push(ServerHost {
            name: SERVERS_HOST.to_owned(),
            members: shared.into_iter().enumerate().map(|(k, i)| (i, port(k))).collect(),
        });
    }
    hosts
}

/// Where each of `scenario`'s servers listens: its host and port, by the
/// name workers reach it by.
pub fn addresses(scenario: &Scenario) -> Addresses {
    Addresses::new(server_hosts(scenario).into_iter().flat_map(|host| {
        host.members
            .into_iter()
            .map(move |(i, port)| (scenario.servers[i].name.clone(), (host.name.clone(), port)))
            .collect::<Vec<_>>()
    }))
}

/// About how many connections `member` holds at once at its busiest: by
/// Little's law, the calls it starts a second (its tenants' peak rate)
/// times how long a call can hold connections — its attempts, each up to a
/// request timeout, and its cache operations (a limiter acquire for each
/// wait and the first try, a breaker admission and report for each
/// attempt), each up to the cache's timeout — plus every call of a burst
/// and every request of a replayed trace at once (they may all arrive
/// together). A call holds one connection to its server and one to the
/// cache for itself and for each hedge, and its pool keeps one for every
/// server it routes over. An estimate, not a bound: calls that arrive
/// bunched hold more for a while.
fn ports_needed(scenario: &Scenario, member: &FleetMember, bursts: &[crate::scenario::Burst]) -> f64 {
    let h = &scenario.hardening;
    let attempts = f64::from(h.max_retries) + 1.0;
    let cache_s = scenario
        .cache
        .timeout_ms
        .unwrap_or(crate::world::DEFAULT_CACHE_TIMEOUT_MS) as f64
        / 1000.0;
    let holding_s = attempts * h.request_timeout_s + (2.0 * attempts + f64::from(h.limiter_waits) + 1.0) * cache_s;
    let at_once: f64 = member
        .tenants
        .iter()
        .map(|t| {
            let replayed = t.replay.as_ref().map_or(0, |r| r.requests.len());
            t.peak_calls_per_min() / 60.0 * holding_s + replayed as f64
        })
        .sum();
    let burst: f64 = bursts
        .iter()
        .filter(|b| member.tenants.iter().any(|t| t.id == b.tenant))
        .map(|b| f64::from(b.calls))
        .sum();
    let hedges = if h.hedge_after_ms.is_some() { h.max_hedges } else { 0 };
    let branches = 1.0 + f64::from(hedges);
    (at_once + burst) * branches * (1.0 + member.servers.len() as f64)
}

/// The host names network faults name.
fn network_named(scenario: &Scenario) -> BTreeSet<&str> {
    scenario
        .faults
        .iter()
        .flat_map(|f| match f {
            Fault::Partition { a, b, .. } | Fault::Heal { a, b, .. } | Fault::Latency { a, b, .. } => {
                vec![a.as_str(), b.as_str()]
            }
            _ => Vec::new(),
        })
        .collect()
}

/// How long a connection a worker of `scenario` closed keeps its port:
/// [`transport::time_wait`] of the longest one-way latency the scenario's
/// network or any of its latency faults sets.
pub fn time_wait(scenario: &Scenario) -> Duration {
    transport::time_wait(
        Duration::from_millis(scenario.longest_latency_ms()),
        Duration::from_millis(scenario.tick_ms.max(1)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(workers: u32, faults: &str) -> Scenario {
        at_rate(workers, 6, faults)
    }

    /// `workers` workers of one tenant at `calls_per_min`, with the default
    /// hardening: four attempts of at most 30 s each.
    fn at_rate(workers: u32, calls_per_min: u32, faults: &str) -> Scenario {
        let text = format!(
            "name = \"layout\"\nduration_s = 10\n[cache]\nkind = \"shared\"\n[[servers]]\nname = \"gpu\"\n\
             [[workers]]\nname = \"w\"\ncount = {workers}\nservers = [\"gpu\"]\ntenants = [{{ id = 1, calls_per_min = {calls_per_min} }}]\n{faults}"
        );
        Scenario::parse("layout.toml", &text).unwrap()
    }

    fn names(hosts: &[WorkerHost]) -> Vec<(String, usize)> {
        hosts.iter().map(|h| (h.name.clone(), h.members.len())).collect()
    }

    fn sizes(hosts: &[WorkerHost]) -> Vec<usize> {
        hosts.iter().map(|h| h.members.len()).collect()
    }

    #[test]
    fn workers_share_hosts_in_fleet_order_up_to_the_most_per_host() {
        // 0.1 calls/s × 122.5 s × 2 connections: 24.5 ports each.
        let workers = u32::try_from(MOST_WORKERS_PER_HOST).unwrap() * 2 + 1;
        let hosts = worker_hosts(&scenario(workers, ""));
        assert_eq!(
            names(&hosts),
            [
                ("workers#0".to_owned(), MOST_WORKERS_PER_HOST),
                ("workers#1".to_owned(), MOST_WORKERS_PER_HOST),
                ("workers#2".to_owned(), 1),
            ]
        );
        let order: Vec<u64> = hosts.iter().flat_map(|h| h.members.iter().map(|m| m.index)).collect();
        assert_eq!(order, (0..u64::from(workers)).collect::<Vec<_>>());
    }

    #[test]
    fn a_host_takes_only_the_workers_whose_connections_fit_its_ports() {
        // 1 call/s, each holding connections for 4 attempts of 30 s and 10
        // cache operations of 0.25 s, one to the server and one to the
        // cache: 245 ports a worker, and 56 000 of a host's 64 000 to
        // share: 228 workers.
        assert_eq!(sizes(&worker_hosts(&at_rate(500, 60, ""))), [228, 228, 44]);
        let mut hedging = at_rate(500, 60, "");
        hedging.hardening.hedge_after_ms = Some(crate::scenario::HedgeAfterMs::Ms(500));
        hedging.hardening.max_hedges = 1;
        // Twice the connections for a call that hedges once: 114 workers.
        assert_eq!(sizes(&worker_hosts(&hedging)), [114, 114, 114, 114, 44]);
    }

    #[test]
    fn a_worker_that_routes_keeps_connections_to_each_server() {
        let text = "name = \"layout\"\nduration_s = 10\n[hardening]\nrouting = \"weighted\"\n\
                    [cache]\nkind = \"shared\"\n[[servers]]\nname = \"a\"\n[[servers]]\nname = \"b\"\n\
                    [[workers]]\nname = \"w\"\ncount = 500\nservers = [\"a\", \"b\"]\n\
                    tenants = [{ id = 1, calls_per_min = 60 }]\n";
        let routed = Scenario::parse("layout.toml", text).unwrap();
        // 122.5 calls at once, each with a pooled connection to either
        // server and one to the cache: 367.5 ports a worker, 152 workers.
        assert_eq!(sizes(&worker_hosts(&routed)), [152, 152, 152, 44]);
    }

    #[test]
    fn a_burst_counts_all_its_calls_at_once() {
        // 0.1 calls/s (12.25 calls at once) and a burst of 100 calls, two
        // connections each: 224.5 ports a worker, 249 workers.
        let burst = "[[faults]]\nkind = \"burst\"\nat_s = 2\ntenant = 1\ncalls = 100\n";
        assert_eq!(sizes(&worker_hosts(&at_rate(300, 6, burst))), [249, 51]);
    }

    #[test]
    fn a_host_always_takes_the_workers_it_took_before_sharing_by_ports() {
        // 10 calls/s: 2 450 ports each, 22 workers' worth; a host still
        // takes its 64.
        let workers = u32::try_from(WORKERS_PER_HOST).unwrap() * 2 + 1;
        assert_eq!(
            sizes(&worker_hosts(&at_rate(workers, 600, ""))),
            [WORKERS_PER_HOST, WORKERS_PER_HOST, 1]
        );
    }

    #[test]
    fn servers_share_one_host_each_on_a_port_of_its_own_but_those_a_network_fault_names() {
        let text = "name = \"layout\"\nduration_s = 10\n\
                    [[servers]]\nname = \"a\"\n[[servers]]\nname = \"b\"\n[[servers]]\nname = \"c\"\n\
                    [[workers]]\nname = \"w\"\nservers = [\"a\", \"b\", \"c\"]\n\
                    tenants = [{ id = 1, calls_per_min = 6 }]\n\
                    [[faults]]\nkind = \"latency\"\nat_s = 1\na = \"w\"\nb = \"b\"\nms = 50\n";
        let s = Scenario::parse("layout.toml", text).unwrap();
        assert_eq!(
            server_hosts(&s),
            [
                ServerHost {
                    name: "b".to_owned(),
                    members: vec![(1, PORT)],
                },
                ServerHost {
                    name: SERVERS_HOST.to_owned(),
                    members: vec![(0, PORT), (2, PORT + 1)],
                },
            ]
        );
        let at = addresses(&s);
        assert_eq!(at.of("a", PORT), (SERVERS_HOST, PORT));
        assert_eq!(at.of("b", PORT), ("b", PORT));
        assert_eq!(at.of("c", PORT), (SERVERS_HOST, PORT + 1));
        assert_eq!(
            at.of("elsewhere", 81),
            ("elsewhere", 81),
            "a name it does not know is a host"
        );
        let alone = Scenario::parse("layout.toml", &text[..text.find("[[faults]]").unwrap()]).unwrap();
        assert_eq!(
            server_hosts(&alone),
            [ServerHost {
                name: SERVERS_HOST.to_owned(),
                members: vec![(0, PORT), (1, PORT + 1), (2, PORT + 2)],
            }]
        );
    }

    #[test]
    fn a_worker_a_network_fault_names_runs_on_a_host_of_its_own() {
        let faults = "[[faults]]\nkind = \"partition\"\nat_s = 1\na = \"w-1\"\nb = \"cache\"\n\
                      [[faults]]\nkind = \"latency\"\nat_s = 2\na = \"gpu\"\nb = \"w-3\"\nms = 50\n\
                      [[faults]]\nkind = \"clock_step\"\nat_s = 3\nhost = \"w-2\"\nby_ms = 500\n";
        let hosts = worker_hosts(&scenario(4, faults));
        assert_eq!(
            names(&hosts),
            [
                ("w-1".to_owned(), 1),
                ("w-3".to_owned(), 1),
                ("workers#0".to_owned(), 2)
            ],
            "a clock step acts on the worker's own clock, so w-2 still shares"
        );
    }

    #[test]
    fn time_wait_covers_the_longest_latency_the_scenario_sets() {
        let quiet = scenario(1, "");
        let slow = scenario(
            1,
            "[[faults]]\nkind = \"latency\"\nat_s = 2\na = \"gpu\"\nb = \"w\"\nms = 30000\n",
        );
        let tick = Duration::from_millis(quiet.tick_ms);
        assert_eq!(
            time_wait(&quiet),
            (Duration::from_millis(quiet.network.max_latency_ms) + tick) * 2
        );
        assert_eq!(time_wait(&slow), (Duration::from_secs(30) + tick) * 2);
    }
}
