//! The run's trace: every decision and observation, in the order it happened.
//!
//! All hosts run on one thread, so one shared [`Trace`] receives events in a
//! single, deterministic order. Each [`TraceEvent`] carries true simulated
//! time, the host that saw it, and what happened. The invariant checkers and
//! the report are computed from this stream alone; written out as JSON lines
//! it is the artefact two runs are compared by, byte for byte.

use std::sync::{Arc, Mutex};

use redstring::{CircuitState, Event, Observer};
use serde::{Deserialize, Serialize};

use crate::hosts::clock::sim_elapsed;

/// One entry of the trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// True simulated time, microseconds since the start.
    pub t_us: u64,
    /// The host that recorded it (`driver` for the fault schedule).
    pub host: String,
    /// What happened.
    #[serde(flatten)]
    pub kind: Kind,
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Kind {
    /// The fault schedule did something.
    Fault {
        /// What, in words.
        what: String,
    },
    /// A unit of work arrived at a worker.
    Arrival {
        /// Worker-local call number.
        call: u64,
        /// The tenant.
        tenant: u64,
    },
    /// A unit of work ended.
    CallEnd {
        /// Worker-local call number.
        call: u64,
        /// The tenant.
        tenant: u64,
        /// `ok`, or the error kind that ended it.
        outcome: String,
        /// Requests it sent to a model server.
        attempts: u32,
        /// Simulated milliseconds from arrival to end.
        latency_ms: u64,
    },
    /// The limiter granted a slot, stamped `at_us` by the clock that decided.
    Admitted {
        /// The tenant.
        tenant: String,
        /// Slots left.
        remaining: u32,
        /// The stamp, epoch microseconds.
        at_us: u64,
    },
    /// The limiter refused.
    Limited {
        /// The tenant.
        tenant: String,
        /// The wait it reported, microseconds.
        retry_after_us: u64,
        /// The decision's stamp, epoch microseconds.
        at_us: u64,
    },
    /// A breaker changed state.
    Breaker {
        /// The breaker's key prefix (one per model server).
        breaker: String,
        /// Before.
        from: CircuitState,
        /// After.
        to: CircuitState,
        /// The decision's stamp, epoch microseconds.
        at_us: u64,
    },
    /// A breaker admitted a call.
    Allowed {
        /// The breaker's key prefix.
        breaker: String,
        /// The state it admitted in (closed, or half-open for a probe).
        state: CircuitState,
        /// The decision's stamp, epoch microseconds.
        at_us: u64,
    },
    /// A breaker refused a call.
    Rejected {
        /// The breaker's key prefix.
        breaker: String,
        /// The state that refused.
        state: CircuitState,
    },
    /// A breaker was told a call failed.
    FailureRecorded {
        /// The breaker's key prefix.
        breaker: String,
        /// The stamp, epoch microseconds.
        at_us: u64,
    },
    /// A call's success was reported to a breaker (which clears a closed
    /// breaker's failure count).
    SuccessRecorded {
        /// The breaker's key prefix.
        breaker: String,
    },
    /// A retry was scheduled.
    Retry {
        /// Calls made so far.
        attempt: u32,
        /// The wait, microseconds.
        delay_us: u64,
    },
    /// The cache could not be reached; a fallback was applied.
    CacheUnavailable {
        /// The port operation.
        operation: String,
        /// What the component did instead.
        fallback: String,
    },
    /// A stored breaker state was unreadable.
    Unreadable,
    /// A worker sent a request to a model server.
    Request {
        /// The server.
        server: String,
    },
    /// A model server received a request and answered (or did not).
    Served {
        /// How it was answered: `ok`, `loading`, `queue_full`, `collapsed`,
        /// or the behaviour applied (`empty`, `malformed`, `hang`, ...).
        outcome: String,
        /// Whether the server was impaired (loading, collapsed or misbehaving).
        impaired: bool,
    },
}

impl Kind {
    /// Whether this event let a call past its breaker: an admission, or the
    /// breaker's fallback admitting it when its cache could not be reached.
    pub fn admits_call(&self) -> bool {
        match self {
            Kind::Allowed { .. } => true,
            Kind::CacheUnavailable { operation, fallback } => operation == "breaker_step" && fallback == "allowed",
            _ => false,
        }
    }
}

/// The shared, append-only trace.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    events: Arc<Mutex<Vec<TraceEvent>>>,
}

impl Trace {
    /// An empty trace.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends an event at the current simulated time (inside a host).
    pub fn record(&self, host: &str, kind: Kind) {
        self.record_at(sim_elapsed(), host, kind);
    }

    /// Appends an event at simulated time `t` (for the driver, outside hosts).
    pub fn record_at(&self, t: std::time::Duration, host: &str, kind: Kind) {
        let t_us = u64::try_from(t.as_micros()).unwrap_or(u64::MAX);
        self.events.lock().unwrap_or_else(|p| p.into_inner()).push(TraceEvent {
            t_us,
            host: host.to_owned(),
            kind,
        });
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<TraceEvent> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The trace as JSON lines.
    pub fn to_json_lines(events: &[TraceEvent]) -> String {
        let mut out = String::new();
        for e in events {
            out.push_str(&serde_json::to_string(e).unwrap_or_default());
            out.push('\n');
        }
        out
    }
}

/// The observer a worker hands its components: redstring's events, into the trace.
#[derive(Clone, Debug)]
pub struct HostObserver {
    host: String,
    trace: Trace,
}

impl HostObserver {
    /// An observer recording as `host`.
    pub fn new(host: &str, trace: Trace) -> Self {
        HostObserver {
            host: host.to_owned(),
            trace,
        }
    }
}

impl Observer for HostObserver {
    fn on_event(&self, event: &Event) {
        let kind = match event {
            Event::BreakerTransition { breaker, from, to, at } => Kind::Breaker {
                breaker: breaker.to_string(),
                from: *from,
                to: *to,
                at_us: at.as_micros(),
            },
            Event::BreakerRejected { breaker, state } => Kind::Rejected {
                breaker: breaker.to_string(),
                state: *state,
            },
            Event::BreakerAllowed { breaker, state, at } => Kind::Allowed {
                breaker: breaker.to_string(),
                state: *state,
                at_us: at.as_micros(),
            },
            Event::BreakerFailureRecorded { breaker, at } => Kind::FailureRecorded {
                breaker: breaker.to_string(),
                at_us: at.as_micros(),
            },
            Event::BreakerStateUnreadable { .. } => Kind::Unreadable,
            Event::CacheUnavailable {
                operation, fallback, ..
            } => Kind::CacheUnavailable {
                operation: (*operation).to_owned(),
                fallback: (*fallback).to_owned(),
            },
            Event::RateLimitAdmitted {
                tenant, remaining, at, ..
            } => Kind::Admitted {
                tenant: tenant.to_string(),
                remaining: *remaining,
                at_us: at.as_micros(),
            },
            Event::RateLimitRefused {
                tenant,
                retry_after,
                at,
                ..
            } => Kind::Limited {
                tenant: tenant.to_string(),
                retry_after_us: u64::try_from(retry_after.as_micros()).unwrap_or(u64::MAX),
                at_us: at.as_micros(),
            },
            Event::BreakerReported {
                breaker,
                failure: false,
                ..
            } => Kind::SuccessRecorded {
                breaker: breaker.to_string(),
            },
            Event::RetryScheduled { attempt, delay, .. } => Kind::Retry {
                attempt: *attempt,
                delay_us: u64::try_from(delay.as_micros()).unwrap_or(u64::MAX),
            },
            _ => return,
        };
        self.trace.record(&self.host, kind);
    }
}
