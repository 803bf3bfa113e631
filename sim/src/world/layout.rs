//! Which turmoil host each worker runs on.
//!
//! turmoil's cost per step grows with the hosts times the links between
//! them (every host's delivery walks every link), so a fleet of one host per
//! worker is quadratic in its size. Workers therefore share hosts: up to
//! [`WORKERS_PER_HOST`] in fleet order on each, every one still with its own
//! clock, cache, random streams, connection limit and name in the trace. A
//! host is the unit turmoil partitions and delays, so a worker a network
//! fault names (a `partition`, `heal` or `latency` with the worker as `a` or
//! `b`) keeps a host of its own, under its own name, and the fault acts on it
//! alone. Every other fault that names a worker — a clock step — acts on the
//! worker's own clock wherever it runs.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::hosts::transport;
use crate::scenario::{Fault, FleetMember, Scenario};

/// The most workers one shared host runs. Its clients share the host's
/// ports ([`HOST_PORTS`](crate::hosts::transport::HOST_PORTS)), so this
/// leaves each about a thousand connections open or in `TIME_WAIT` on
/// average before the host's limit is what refuses one. Measured on the
/// fleets of `benches/fleet-scale.sh` (500 × 10 and 2 000 × 20): 16 a host
/// took 28 s and 390 s, 64 took 12 s and 80 s, 256 took 15 s and 107 s —
/// fewer hosts walk fewer links each step, bigger ones cost more per event.
pub const WORKERS_PER_HOST: usize = 64;

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
/// fault names, in fleet order, then the rest in shared hosts of at most
/// [`WORKERS_PER_HOST`], in fleet order.
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
    hosts.extend(
        shared
            .chunks(WORKERS_PER_HOST)
            .enumerate()
            .map(|(k, members)| WorkerHost {
                name: format!("workers#{k}"),
                members: members.to_vec(),
            }),
    );
    hosts
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
        let text = format!(
            "name = \"layout\"\nduration_s = 10\n[cache]\nkind = \"shared\"\n[[servers]]\nname = \"gpu\"\n\
             [[workers]]\nname = \"w\"\ncount = {workers}\nservers = [\"gpu\"]\ntenants = [{{ id = 1, calls_per_min = 6 }}]\n{faults}"
        );
        Scenario::parse("layout.toml", &text).unwrap()
    }

    fn names(hosts: &[WorkerHost]) -> Vec<(String, usize)> {
        hosts.iter().map(|h| (h.name.clone(), h.members.len())).collect()
    }

    #[test]
    fn workers_share_hosts_in_fleet_order_up_to_the_most_per_host() {
        let workers = u32::try_from(WORKERS_PER_HOST).unwrap() * 2 + 1;
        let hosts = worker_hosts(&scenario(workers, ""));
        assert_eq!(
            names(&hosts),
            [
                ("workers#0".to_owned(), WORKERS_PER_HOST),
                ("workers#1".to_owned(), WORKERS_PER_HOST),
                ("workers#2".to_owned(), 1),
            ]
        );
        let order: Vec<u64> = hosts.iter().flat_map(|h| h.members.iter().map(|m| m.index)).collect();
        assert_eq!(order, (0..u64::from(workers)).collect::<Vec<_>>());
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
