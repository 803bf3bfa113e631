//! The one fold of breaker and limiter state over a trace.
//!
//! Several readers of a trace need to know what state each breaker was in at
//! each event — the probe, sparse-failure, open-circuit and liveness
//! invariants, and the plots — and two need each tenant's admissions per
//! limiter. Each used to rebuild that from the events itself, with its own
//! copy of the rule saying which breaker an event belongs to. Here is the one
//! copy: [`Scopes`] says which breaker and which limiter an event belongs to,
//! [`Breakers`] replays breaker state event by event, and [`admissions`]
//! groups the limiter's admissions.
//!
//! Scope: with per-worker caches every worker has its own limiter and
//! breaker, so state is kept per worker; with a shared cache the fleet shares
//! one of each, and a cache host that restarts forgets every breaker (they
//! all read closed again).

use std::collections::BTreeMap;

use redstring::{CircuitState, TenantId};

use crate::evidence::trace::{Kind, TraceEvent};
use crate::scenario::{CacheKind, Fault, Scenario};

/// Which breaker and which limiter an event belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scopes {
    shared: bool,
}

/// The limiter scope every worker shares when the fleet shares a cache.
pub const FLEET: &str = "fleet";

impl Scopes {
    /// The scopes of `scenario`'s cache layout.
    pub fn of(scenario: &Scenario) -> Scopes {
        Scopes {
            shared: scenario.cache.kind == CacheKind::Shared,
        }
    }

    /// Whether the fleet shares one cache (and so one limiter and breaker).
    pub fn shared(self) -> bool {
        self.shared
    }

    /// The breaker an event about breaker `prefix` belongs to: one per model
    /// server, per worker or fleet-wide.
    pub fn breaker(self, e: &TraceEvent, prefix: &str) -> String {
        if self.shared {
            prefix.to_owned()
        } else {
            format!("{}/{prefix}", e.host)
        }
    }

    /// The limiter an event belongs to: the worker's, or the fleet's.
    pub fn limiter(self, e: &TraceEvent) -> &str {
        if self.shared { FLEET } else { &e.host }
    }
}

/// What one event did to the breakers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A breaker moved between states.
    Moved {
        /// The breaker (see [`Scopes::breaker`]).
        scope: String,
        /// Before.
        from: CircuitState,
        /// After.
        to: CircuitState,
    },
    /// The shared cache host restarted: every breaker reads closed again.
    Forgotten,
}

/// Every breaker's state, replayed event by event.
#[derive(Clone, Debug)]
pub struct Breakers {
    scopes: Scopes,
    /// Each breaker seen so far: its state and since when (simulated µs).
    states: BTreeMap<String, (CircuitState, u64)>,
}

impl Breakers {
    /// No breaker seen yet (each reads closed).
    pub fn new(scopes: Scopes) -> Breakers {
        Breakers {
            scopes,
            states: BTreeMap::new(),
        }
    }

    /// The scope rules in use.
    pub fn scopes(&self) -> Scopes {
        self.scopes
    }

    /// The state of breaker `scope` now; one never seen is closed.
    pub fn state(&self, scope: &str) -> CircuitState {
        self.states.get(scope).map_or(CircuitState::Closed, |(s, _)| *s)
    }

    /// Applies `e`, returning what it changed.
    pub fn observe(&mut self, e: &TraceEvent) -> Option<Change> {
        match &e.kind {
            Kind::Breaker { breaker, from, to, .. } => {
                let scope = self.scopes.breaker(e, breaker);
                self.states.insert(scope.clone(), (*to, e.t_us));
                Some(Change::Moved {
                    scope,
                    from: *from,
                    to: *to,
                })
            }
            Kind::Fault { fault } if matches!(**fault, Fault::CacheUp { .. }) && self.scopes.shared => {
                for v in self.states.values_mut() {
                    *v = (CircuitState::Closed, e.t_us);
                }
                Some(Change::Forgotten)
            }
            _ => None,
        }
    }

    /// Every breaker seen: its scope, state, and since when (simulated µs).
    pub fn iter(&self) -> impl Iterator<Item = (&str, CircuitState, u64)> {
        self.states.iter().map(|(k, (s, t))| (k.as_str(), *s, *t))
    }

    /// How many breakers are in `state` now.
    pub fn count(&self, state: CircuitState) -> usize {
        self.states.values().filter(|(s, _)| *s == state).count()
    }
}

/// Every limiter admission, per (limiter scope, tenant), in trace order.
pub fn admissions(scopes: Scopes, events: &[TraceEvent]) -> BTreeMap<(&str, TenantId), Vec<&TraceEvent>> {
    let mut out: BTreeMap<(&str, TenantId), Vec<&TraceEvent>> = BTreeMap::new();
    for e in events {
        if let Kind::Admitted { tenant, .. } = &e.kind {
            out.entry((scopes.limiter(e), *tenant)).or_default().push(e);
        }
    }
    out
}
