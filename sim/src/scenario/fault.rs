//! The fault schedule's vocabulary: what can happen to a deployment, when, and
//! in which order faults at one instant apply.
//!
//! A [`Fault`] is data — the scenario file writes it, the world applies it,
//! the trace records it and the fuzzer generates it — and [`FaultKind`] names
//! its kinds without their fields, for the fuzzer's bounds and the report's
//! tallies. Both are matched exhaustively wherever they are used, so a new
//! kind of fault is a new variant here and then every place the compiler
//! points at.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{Behaviour, Mode};

/// A timed event.
///
/// # Faults at the same instant
///
/// Faults apply in time order. Faults at the same `at_s` apply in two
/// phases: first every fault that begins an outage or changes something
/// ([`Phase::Begin`]), then every fault that ends one — `restart`, `heal`,
/// `cache_up` ([`Phase::End`]); within a phase, in file order. So a crash
/// and a restart at one instant are a crash followed by a restart — a
/// zero-length outage, which still costs the server its reload — whichever
/// of the two the file lists first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Fault {
    /// Kill a server's process; connections are refused until it restarts.
    Crash {
        /// When.
        at_s: f64,
        /// Which server.
        server: String,
    },
    /// Start a crashed server again; it loads its model for `reload_s`.
    Restart {
        /// When.
        at_s: f64,
        /// Which server.
        server: String,
    },
    /// Change how a server answers.
    Behave {
        /// When.
        at_s: f64,
        /// Which server.
        server: String,
        /// The new behaviour.
        behaviour: Behaviour,
    },
    /// Cut the link between two hosts (both directions).
    Partition {
        /// When.
        at_s: f64,
        /// One host.
        a: String,
        /// The other.
        b: String,
    },
    /// Restore a cut link.
    Heal {
        /// When.
        at_s: f64,
        /// One host.
        a: String,
        /// The other.
        b: String,
    },
    /// Set the latency of the link between two hosts (both directions).
    Latency {
        /// When.
        at_s: f64,
        /// One host.
        a: String,
        /// The other.
        b: String,
        /// The new one-way latency.
        ms: u64,
    },
    /// Step a host's clock.
    ClockStep {
        /// When.
        at_s: f64,
        /// Which host (a worker, or `cache`).
        host: String,
        /// By how much (negative steps back).
        by_ms: i64,
    },
    /// Every worker fires `calls` extra calls for one tenant at once.
    Burst {
        /// When.
        at_s: f64,
        /// Calls per worker.
        calls: u32,
        /// The tenant they are for.
        tenant: u64,
    },
    /// Kill the cache host.
    CacheDown {
        /// When.
        at_s: f64,
    },
    /// Restart the cache host (its state is lost).
    CacheUp {
        /// When.
        at_s: f64,
    },
}

/// The kind of a [`Fault`], without its fields: what a bounds file names and
/// what a report tallies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// [`Fault::Crash`].
    Crash,
    /// [`Fault::Restart`].
    Restart,
    /// [`Fault::Behave`].
    Behave,
    /// [`Fault::Partition`].
    Partition,
    /// [`Fault::Heal`].
    Heal,
    /// [`Fault::Latency`].
    Latency,
    /// [`Fault::ClockStep`].
    ClockStep,
    /// [`Fault::Burst`].
    Burst,
    /// [`Fault::CacheDown`].
    CacheDown,
    /// [`Fault::CacheUp`].
    CacheUp,
}

/// Which of the two passes at one instant a fault applies in (see [`Fault`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Begins an outage or changes something: applied first.
    Begin,
    /// Ends an outage: applied after everything else at the same instant.
    End,
}

impl FaultKind {
    /// Every kind, in declaration order.
    pub const ALL: [FaultKind; 10] = [
        FaultKind::Crash,
        FaultKind::Restart,
        FaultKind::Behave,
        FaultKind::Partition,
        FaultKind::Heal,
        FaultKind::Latency,
        FaultKind::ClockStep,
        FaultKind::Burst,
        FaultKind::CacheDown,
        FaultKind::CacheUp,
    ];

    /// This kind's place in [`FaultKind::ALL`]; a new variant fails to
    /// compile here until it is given one (and a test checks `ALL` agrees).
    pub const fn position(self) -> usize {
        match self {
            FaultKind::Crash => 0,
            FaultKind::Restart => 1,
            FaultKind::Behave => 2,
            FaultKind::Partition => 3,
            FaultKind::Heal => 4,
            FaultKind::Latency => 5,
            FaultKind::ClockStep => 6,
            FaultKind::Burst => 7,
            FaultKind::CacheDown => 8,
            FaultKind::CacheUp => 9,
        }
    }

    /// When a fault of this kind applies among faults at the same instant.
    pub const fn phase(self) -> Phase {
        match self {
            FaultKind::Restart | FaultKind::Heal | FaultKind::CacheUp => Phase::End,
            FaultKind::Crash
            | FaultKind::Behave
            | FaultKind::Partition
            | FaultKind::Latency
            | FaultKind::ClockStep
            | FaultKind::Burst
            | FaultKind::CacheDown => Phase::Begin,
        }
    }

    /// The kind whose episode this kind belongs to: a restart ends a crash, a
    /// heal a partition, a cache coming up a cache going down; every other
    /// kind starts (and, for `behave` and `latency`, also ends) its own.
    pub const fn episode(self) -> FaultKind {
        match self {
            FaultKind::Restart => FaultKind::Crash,
            FaultKind::Heal => FaultKind::Partition,
            FaultKind::CacheUp => FaultKind::CacheDown,
            FaultKind::Crash
            | FaultKind::Behave
            | FaultKind::Partition
            | FaultKind::Latency
            | FaultKind::ClockStep
            | FaultKind::Burst
            | FaultKind::CacheDown => self,
        }
    }

    /// Whether faults of this kind need a shared cache host.
    pub const fn needs_shared_cache(self) -> bool {
        matches!(self.episode(), FaultKind::CacheDown)
    }

    /// The name a scenario or bounds file writes.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Crash => "crash",
            FaultKind::Restart => "restart",
            FaultKind::Behave => "behave",
            FaultKind::Partition => "partition",
            FaultKind::Heal => "heal",
            FaultKind::Latency => "latency",
            FaultKind::ClockStep => "clock_step",
            FaultKind::Burst => "burst",
            FaultKind::CacheDown => "cache_down",
            FaultKind::CacheUp => "cache_up",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Fault {
    /// When it happens, in simulated seconds.
    pub fn at_s(&self) -> f64 {
        match self {
            Fault::Crash { at_s, .. }
            | Fault::Restart { at_s, .. }
            | Fault::Behave { at_s, .. }
            | Fault::Partition { at_s, .. }
            | Fault::Heal { at_s, .. }
            | Fault::Latency { at_s, .. }
            | Fault::ClockStep { at_s, .. }
            | Fault::Burst { at_s, .. }
            | Fault::CacheDown { at_s }
            | Fault::CacheUp { at_s } => *at_s,
        }
    }

    /// Its kind.
    pub fn kind(&self) -> FaultKind {
        match self {
            Fault::Crash { .. } => FaultKind::Crash,
            Fault::Restart { .. } => FaultKind::Restart,
            Fault::Behave { .. } => FaultKind::Behave,
            Fault::Partition { .. } => FaultKind::Partition,
            Fault::Heal { .. } => FaultKind::Heal,
            Fault::Latency { .. } => FaultKind::Latency,
            Fault::ClockStep { .. } => FaultKind::ClockStep,
            Fault::Burst { .. } => FaultKind::Burst,
            Fault::CacheDown { .. } => FaultKind::CacheDown,
            Fault::CacheUp { .. } => FaultKind::CacheUp,
        }
    }

    /// Whether it starts (rather than ends) an outage, for the liveness phase.
    pub fn is_disruptive(&self) -> bool {
        match self {
            Fault::Crash { .. }
            | Fault::Partition { .. }
            | Fault::CacheDown { .. }
            | Fault::Burst { .. }
            | Fault::Latency { .. } => true,
            Fault::Behave { behaviour, .. } => behaviour.mode != Mode::Normal,
            Fault::Restart { .. } | Fault::Heal { .. } | Fault::CacheUp { .. } | Fault::ClockStep { .. } => false,
        }
    }
}

/// The fault as the trace and the compact trace describe it.
impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Crash { server, .. } => write!(f, "crash {server}"),
            Fault::Restart { server, .. } => write!(f, "restart {server}"),
            Fault::Behave { server, behaviour, .. } => {
                write!(f, "{server} behaves {:?} (p={})", behaviour.mode, behaviour.probability)
            }
            Fault::Partition { a, b, .. } => write!(f, "partition {a} / {b}"),
            Fault::Heal { a, b, .. } => write!(f, "heal {a} / {b}"),
            Fault::Latency { a, b, ms, .. } => write!(f, "latency {a} / {b} set to {ms} ms"),
            Fault::ClockStep { host, by_ms, .. } => write!(f, "step {host}'s clock by {by_ms} ms"),
            Fault::Burst { calls, tenant, .. } => {
                write!(f, "burst of {calls} calls per worker for tenant {tenant}")
            }
            Fault::CacheDown { .. } => f.write_str("cache host down"),
            Fault::CacheUp { .. } => f.write_str("cache host up"),
        }
    }
}

/// The faults of a schedule in the order they apply: by time, then by
/// [`Phase`], then as written.
pub fn in_order(faults: &[Fault]) -> Vec<&Fault> {
    let mut ordered: Vec<&Fault> = faults.iter().collect();
    ordered.sort_by(|a, b| {
        a.at_s()
            .total_cmp(&b.at_s())
            .then(a.kind().phase().cmp(&b.kind().phase()))
    });
    ordered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_kind_once_in_position_order() {
        for (i, kind) in FaultKind::ALL.iter().enumerate() {
            assert_eq!(kind.position(), i, "{kind}");
        }
    }

    #[test]
    fn kind_names_are_the_scenario_files_tags() {
        for kind in FaultKind::ALL {
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json, kind.name());
        }
    }

    #[test]
    fn at_one_instant_an_outage_begins_before_it_ends() {
        let restart = Fault::Restart {
            at_s: 5.0,
            server: "gpu".into(),
        };
        let crash = Fault::Crash {
            at_s: 5.0,
            server: "gpu".into(),
        };
        let early = Fault::CacheUp { at_s: 1.0 };
        let faults = [restart.clone(), crash.clone(), early.clone()];
        assert_eq!(in_order(&faults), [&early, &crash, &restart]);
    }
}
