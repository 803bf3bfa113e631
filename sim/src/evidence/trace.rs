//! The run's trace: every decision and observation, in the order it happened.
//!
//! All hosts run on one thread, so one shared [`Trace`] receives events in a
//! single, deterministic order. Each [`TraceEvent`] carries true simulated
//! time, the host that saw it, and what happened as typed data: a fault
//! carries the [`Fault`] itself, a call's end its [`CallOutcome`], a server's
//! answer its [`Answer`], and every tenant is the core's [`TenantId`]. The
//! invariant checkers and the report are computed from this stream alone;
//! written out as JSON lines it is the artefact two runs are compared by,
//! byte for byte.

use std::sync::{Arc, Mutex};

use redstring::decide::budget::BudgetCommand;
use redstring::{CircuitState, Priority, TenantId};
use serde::{Serialize, Serializer};

use crate::evidence::episodes::ReadyBasis;
use crate::evidence::metrics::MetricLog;
use crate::evidence::outcome::{Answer, CallOutcome};
use crate::hosts::clock::sim_elapsed;
use crate::scenario::Fault;

/// The host name the fault schedule records under.
pub const DRIVER: &str = "driver";

/// One entry of the trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceEvent {
    /// True simulated time, microseconds since the start.
    pub t_us: u64,
    /// The host that recorded it ([`DRIVER`] for the fault schedule),
    /// shared by the events recorded through one [`HostTrace`] (each worker
    /// and each server holds one).
    pub host: Arc<str>,
    /// The worker-local number of the call whose task recorded it (see
    /// [`within_call`]); `None` outside any call.
    #[serde(rename = "in_call", skip_serializing_if = "Option::is_none")]
    pub call: Option<u64>,
    /// What happened.
    #[serde(flatten)]
    pub kind: Kind,
}

tokio::task_local! {
    /// The worker-local number of the call the current task is making.
    static CALL: u64;
}

/// The worker-local number of the call the current task is making, if any.
pub fn current_call() -> Option<u64> {
    CALL.try_with(|c| *c).ok()
}

/// Runs `work` as call number `call`: every event recorded from within it
/// (the limiter's and the breaker's decisions, retries, requests) carries
/// the call's number, so a checker can hold each call to its own layers.
pub async fn within_call<F: std::future::Future>(call: u64, work: F) -> F::Output {
    CALL.scope(call, work).await
}

/// Which limiter made a decision: the configured cache, or the fallback a
/// worker took while its shared cache could not be reached (the limiter's
/// `OnCacheUnavailable` policy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decider {
    /// The configured cache: a worker's own, or the shared one.
    #[default]
    Cache,
    /// The worker's private fallback limiter (`local_limit`).
    Local,
    /// Nobody: the call was admitted without a limit (`admit`).
    Unlimited,
}

impl Decider {
    /// Whether the configured cache decided (the case traces leave unwritten).
    pub fn is_cache(&self) -> bool {
        *self == Decider::Cache
    }
}

/// How a unit of work ended: the payload of [`Kind::CallEnd`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CallEnded {
    /// Worker-local call number.
    pub call: u64,
    /// The tenant.
    pub tenant: TenantId,
    /// How it ended.
    pub outcome: CallOutcome,
    /// Requests it sent to a model server.
    pub attempts: u32,
    /// Simulated milliseconds from arrival to end.
    pub latency_ms: u64,
    /// For a call every breaker refused (outcome `circuit_open` or
    /// `cooldown`), the wait its error handed back to the caller
    /// ([`ExtractError::retry_after`](redstring::provider::ExtractError::retry_after)),
    /// microseconds; absent for every other outcome.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_us: Option<u64>,
    /// For a call that succeeded under a slow-call threshold
    /// (`hardening.slow_call_ms`), how long its answering attempt took
    /// on the worker's clock, from the request's send to its answer,
    /// microseconds — as the worker's transport timed it, apart from
    /// the provider; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_us: Option<u64>,
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Kind {
    /// The fault schedule applied a fault (written as its description;
    /// boxed, as the rarest and one of the largest payloads).
    Fault {
        /// The fault.
        #[serde(rename = "what", serialize_with = "described")]
        fault: Box<Fault>,
    },
    /// A unit of work arrived at a worker.
    Arrival {
        /// Worker-local call number.
        call: u64,
        /// The tenant.
        tenant: TenantId,
    },
    /// A unit of work ended (boxed: one of these per call, and the largest
    /// payload, it would otherwise set the size of every event).
    CallEnd(Box<CallEnded>),
    /// The limiter granted a slot, stamped `at_us` by the clock that decided.
    /// Every call past the limiter is one of these, so they are also the
    /// calls that reached the retry layer.
    Admitted {
        /// The tenant.
        tenant: TenantId,
        /// Slots left.
        remaining: u32,
        /// The stamp, epoch microseconds.
        at_us: u64,
        /// Who decided (written only when it was not the configured cache).
        #[serde(skip_serializing_if = "Decider::is_cache")]
        decided_by: Decider,
    },
    /// The limiter refused.
    Limited {
        /// The tenant.
        tenant: TenantId,
        /// The wait it reported, microseconds.
        retry_after_us: u64,
        /// The decision's stamp, epoch microseconds.
        at_us: u64,
        /// Who decided (written only when it was not the configured cache).
        #[serde(skip_serializing_if = "Decider::is_cache")]
        decided_by: Decider,
    },
    /// A breaker changed state.
    Breaker {
        /// The breaker's key prefix (one per model server).
        breaker: Arc<str>,
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
        breaker: Arc<str>,
        /// The state it admitted in (closed, or half-open for a probe).
        state: CircuitState,
        /// For a probe, its number in the half-open episode.
        probe: Option<u32>,
        /// The decision's stamp, epoch microseconds.
        at_us: u64,
    },
    /// A half-open probe was handed back unused; its lease ended.
    ProbeReleased {
        /// The breaker's key prefix.
        breaker: Arc<str>,
        /// The probe's number in its episode.
        seq: u32,
    },
    /// A breaker refused a call.
    Rejected {
        /// The breaker's key prefix.
        breaker: Arc<str>,
        /// The state that refused.
        state: CircuitState,
        /// How long it said until a probe may be admitted, microseconds.
        retry_after_us: u64,
    },
    /// A quota signal asked for a shared cooldown: the store refuses every
    /// admission stamped before `until_us` — the one it wrote, or a longer
    /// one it already held.
    Cooldown {
        /// The breaker's key prefix.
        breaker: Arc<str>,
        /// When the cooldown this signal asked for ends, on the deciding
        /// clock, epoch microseconds.
        until_us: u64,
        /// The step's stamp, epoch microseconds.
        at_us: u64,
        /// Whether the step wrote it (written only when it did not: a
        /// cooldown ending no earlier was already stored).
        #[serde(skip_serializing_if = "is_true")]
        extended: bool,
    },
    /// A server said its quota is spent (`insufficient_quota`, or a reset
    /// further away than the worker's `max_server_delay`): the provider
    /// cools that deployment down until `until_us`, on its own clock.
    QuotaSpent {
        /// The deployment's breaker key prefix.
        breaker: Arc<str>,
        /// When the spent quota's cooldown ends, epoch microseconds.
        until_us: u64,
        /// When the provider heard it, epoch microseconds.
        at_us: u64,
    },
    /// A breaker refused a call because a shared cooldown was in force.
    CooldownRefused {
        /// The breaker's key prefix.
        breaker: Arc<str>,
        /// The circuit's state (a cooldown refuses in any).
        state: CircuitState,
        /// How long until the cooldown ends, microseconds.
        retry_after_us: u64,
        /// The decision's stamp, epoch microseconds.
        at_us: u64,
    },
    /// A call over several deployments asks this one last: it is known to
    /// refuse (`state`: `open`, `cooldown`, `limited` or `unusable`) until
    /// `until_us` on the worker's clock.
    Deferred {
        /// The deployment's breaker key prefix.
        breaker: Arc<str>,
        /// Why it is known to refuse.
        state: &'static str,
        /// Until when, epoch microseconds.
        until_us: u64,
    },
    /// A breaker was told a call failed.
    FailureRecorded {
        /// The breaker's key prefix.
        breaker: Arc<str>,
        /// The stamp, epoch microseconds.
        at_us: u64,
    },
    /// A provider counted a successful attempt as slow: longer than its
    /// slow-call threshold, so its breaker hears a failure.
    SlowCall {
        /// The deployment's breaker key prefix.
        breaker: Arc<str>,
        /// How long the attempt took on the worker's clock, microseconds.
        took_us: u64,
    },
    /// A provider hedged its call's attempt that had not answered: another
    /// request goes to the server behind `to`.
    Hedged {
        /// The breaker key prefix of the deployment whose attempt is hedged.
        from: Arc<str>,
        /// The breaker key prefix of the deployment the hedge goes to.
        to: Arc<str>,
        /// How long the call waited before hedging, microseconds.
        after_us: u64,
    },
    /// A server's adaptive concurrency limit admitted a request, leasing it.
    ConcurrencyAdmitted {
        /// The server's breaker key prefix.
        breaker: Arc<str>,
        /// The class the call asked as.
        priority: Priority,
        /// The request's lease.
        id: u64,
        /// Requests in flight there before it (the limit's scope's).
        in_flight: u64,
        /// The limit in force, whole requests.
        limit: u64,
    },
    /// A server's adaptive concurrency limit refused a request: as many
    /// were in flight as it allows.
    ConcurrencyRefused {
        /// The server's breaker key prefix.
        breaker: Arc<str>,
        /// The class the call asked as.
        priority: Priority,
        /// Requests in flight there.
        in_flight: u64,
        /// The limit in force, whole requests.
        limit: u64,
    },
    /// A request admitted under an adaptive concurrency limit ended.
    ConcurrencyEnded {
        /// The server's breaker key prefix.
        breaker: Arc<str>,
        /// The request's lease.
        id: u64,
        /// How it ended, for the limit.
        end: redstring::decide::concurrency::CallEnd,
        /// Whether its lease was still live, so its end counted.
        counted: bool,
        /// The limit before, millionths of a request.
        from: u64,
        /// The limit after, millionths of a request.
        to: u64,
    },
    /// A call admitted by a server's breaker in its slow start was drawn
    /// against the ramp's share: it went there when `draw < share`, and was
    /// otherwise offered to the next server that admitted it.
    SlowStart {
        /// The ramping server's breaker key prefix.
        breaker: Arc<str>,
        /// When its circuit closed (the ramp's start), the store's stamp,
        /// epoch microseconds.
        closed_at_us: u64,
        /// When the admission was judged, the store's stamp, epoch
        /// microseconds.
        at_us: u64,
        /// The ramp's share then, parts per million.
        share: u32,
        /// The draw, parts per million.
        draw: u32,
    },
    /// A server's own limit (`hardening.deployment_rpm`) granted an
    /// attempt a slot there.
    DeploymentAdmitted {
        /// The server.
        server: Arc<str>,
        /// The class the call asked as.
        priority: Priority,
        /// The stamp, epoch microseconds.
        at_us: u64,
        /// Who decided (written only when it was not the configured cache).
        #[serde(skip_serializing_if = "Decider::is_cache")]
        decided_by: Decider,
    },
    /// A server's own limit refused an attempt: it was not sent there.
    DeploymentLimited {
        /// The server.
        server: Arc<str>,
        /// The class the call asked as.
        priority: Priority,
        /// The wait it reported, microseconds.
        retry_after_us: u64,
        /// The decision's stamp, epoch microseconds.
        at_us: u64,
        /// Who decided (written only when it was not the configured cache).
        #[serde(skip_serializing_if = "Decider::is_cache")]
        decided_by: Decider,
    },
    /// A success report cleared a closed breaker's failure count.
    FailuresCleared {
        /// The breaker's key prefix.
        breaker: Arc<str>,
        /// The stamp, epoch microseconds.
        at_us: u64,
    },
    /// Half-open probes whose lease ended without a report stopped counting.
    ProbesExpired {
        /// The breaker's key prefix.
        breaker: Arc<str>,
        /// How many leases ended.
        expired: u32,
        /// The stamp, epoch microseconds.
        at_us: u64,
    },
    /// A shared store clamped a caller's clock as a limiter decision's stamp.
    StampClamped {
        /// The tenant.
        tenant: TenantId,
        /// The caller's now, epoch microseconds.
        asked_us: u64,
        /// The stamp the store used, epoch microseconds.
        used_us: u64,
    },
    /// A retry was scheduled.
    Retry {
        /// Calls made so far.
        attempt: u32,
        /// The wait, microseconds.
        delay_us: u64,
        /// The shortest wait the failure asked for (a server's
        /// `Retry-After`), microseconds; written only when there was one.
        #[serde(skip_serializing_if = "is_zero")]
        floor_us: u64,
    },
    /// The limiter reserved a call's tokens with its slot.
    Reserved {
        /// The tenant charged.
        tenant: TenantId,
        /// The tokens reserved.
        estimate: u64,
        /// The stamp of the reservation (and its slot), epoch microseconds.
        at_us: u64,
        /// Which ledger holds it.
        decided_by: Decider,
    },
    /// The limiter refused a call over its tokens per window.
    TokensRefused {
        /// The tenant refused.
        tenant: TenantId,
        /// The tokens asked for.
        estimate: u64,
        /// Tokens counted in the window.
        used: u64,
        /// The wait until the estimate fits, microseconds.
        retry_after_us: u64,
        /// Which ledger refused.
        decided_by: Decider,
    },
    /// A call's reservation was settled to what the server used.
    Settled {
        /// The tenant charged.
        tenant: TenantId,
        /// The tokens reserved.
        estimate: u64,
        /// The tokens used (zero: released).
        actual: u64,
        /// Whether the ledger still held the reservation.
        found: bool,
    },
    /// A retry budget's step: a call's deposit, or a retry asked for.
    Budget {
        /// The budget's key (one per model server).
        budget: Arc<str>,
        /// `deposit` or `withdraw`.
        #[serde(serialize_with = "budget_command")]
        command: BudgetCommand,
        /// Whether it was granted (a deposit always is).
        granted: bool,
        /// The bucket after the step, in millionths of a retry.
        balance: u64,
        /// The stamp it was judged at, epoch microseconds.
        at_us: u64,
        /// Which bucket decided.
        decided_by: Decider,
    },
    /// The cache could not be reached; a fallback was applied.
    CacheUnavailable {
        /// The port operation, as the core names it.
        operation: &'static str,
        /// What the component did instead, as the core names it.
        fallback: &'static str,
        /// Whether that fallback let a call past its breaker (decided where
        /// the core's event is read: [`crate::evidence::observe`]).
        #[serde(skip)]
        admitted_call: bool,
    },
    /// A stored breaker state was unreadable.
    Unreadable,
    /// A worker sent a request to a model server.
    Request {
        /// The server.
        server: Arc<str>,
    },
    /// A model server finished loading its model, at the instant this run
    /// drew for the load: after a start that loads (a restart, a cold
    /// start), or, for the kinds that load on demand, when a load a request
    /// started completed. Recorded by the server; a load cut short by a
    /// crash, or one that failed, records nothing.
    Loaded,
    /// A model server is ready to serve again after a fault episode — derived
    /// from the schedule and the trace ([`crate::evidence::episodes`]), not
    /// recorded by the server; only in traces written out.
    Ready {
        /// How the instant was established.
        basis: ReadyBasis,
    },
    /// A model server received a request and answered (or did not).
    Served {
        /// How it was answered.
        outcome: Answer,
        /// Whether the server was impaired: always `outcome.impaired()`.
        impaired: bool,
        /// The call it served, as `worker/call` (the worker's host name and
        /// its worker-local call number), when the request said.
        #[serde(skip_serializing_if = "Option::is_none")]
        caller: Option<String>,
    },
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_true(b: &bool) -> bool {
    *b
}

fn budget_command<S: Serializer>(command: &BudgetCommand, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(command.as_str())
}

fn described<S: Serializer>(fault: &impl std::fmt::Display, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(fault)
}

impl Kind {
    /// A server's answer, with whether it was impaired.
    pub fn served(outcome: Answer) -> Kind {
        Kind::served_for(outcome, None)
    }

    /// A server's answer to the call `caller` names (`worker/call`).
    pub fn served_for(outcome: Answer, caller: Option<String>) -> Kind {
        Kind::Served {
            outcome,
            impaired: outcome.impaired(),
            caller,
        }
    }

    /// Whether this event let a call past its breaker: an admission, or the
    /// breaker's fallback admitting it when its cache could not be reached.
    pub fn admits_call(&self) -> bool {
        match self {
            Kind::Allowed { .. } => true,
            Kind::CacheUnavailable { admitted_call, .. } => *admitted_call,
            _ => false,
        }
    }

    /// Whether this event let a call past the limiter, and so into the retry
    /// layer (the base of retry amplification).
    pub fn reaches_retry(&self) -> bool {
        matches!(self, Kind::Admitted { .. })
    }
}

/// The shared, append-only trace.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    events: Arc<Mutex<Vec<TraceEvent>>>,
    /// Where the workers' events also go as metrics, when asked for.
    metrics: Option<MetricLog>,
}

impl Trace {
    /// An empty trace.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty trace whose workers also record their events as metrics
    /// into `metrics`.
    pub fn metered(metrics: MetricLog) -> Self {
        Trace {
            metrics: Some(metrics),
            ..Self::default()
        }
    }

    /// The metrics the workers record into, if the run keeps any.
    pub fn metrics(&self) -> Option<&MetricLog> {
        self.metrics.as_ref()
    }

    /// The trace as host `name` writes it.
    pub fn host(&self, name: &str) -> HostTrace {
        HostTrace {
            trace: self.clone(),
            host: name.into(),
        }
    }

    fn push(&self, t: std::time::Duration, host: &Arc<str>, kind: Kind) {
        let event = TraceEvent {
            t_us: u64::try_from(t.as_micros()).unwrap_or(u64::MAX),
            host: host.clone(),
            call: current_call(),
            kind,
        };
        self.events.lock().unwrap_or_else(|p| p.into_inner()).push(event);
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<TraceEvent> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How many events so far are of a kind `is` accepts, without copying
    /// the trace.
    pub fn count(&self, is: impl Fn(&Kind) -> bool) -> usize {
        let log = self.events.lock().unwrap_or_else(|p| p.into_inner());
        log.iter().filter(|e| is(&e.kind)).count()
    }

    /// Every event so far, leaving the trace empty: a run's end hands its
    /// events on without a copy.
    pub fn take(&self) -> Vec<TraceEvent> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|p| p.into_inner()))
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

/// The trace as one host writes it: every event it records carries the
/// host's name, held once and shared by them all.
#[derive(Clone, Debug)]
pub struct HostTrace {
    trace: Trace,
    host: Arc<str>,
}

impl HostTrace {
    /// Appends an event at the current simulated time (inside a host).
    pub fn record(&self, kind: Kind) {
        self.trace.push(sim_elapsed(), &self.host, kind);
    }

    /// Appends an event at simulated time `t` (for the driver, outside hosts).
    pub fn record_at(&self, t: std::time::Duration, kind: Kind) {
        self.trace.push(t, &self.host, kind);
    }

    /// The host's name, the copy its events share.
    pub fn name(&self) -> &Arc<str> {
        &self.host
    }

    /// The whole trace.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host's events share one copy of its name: a fleet's millions of
    /// events hold no name of their own.
    #[test]
    fn a_host_s_events_share_its_name() {
        let trace = Trace::new();
        let (worker, server) = (trace.host("worker-7"), trace.host("gpu"));
        let t = std::time::Duration::from_millis(1);
        worker.record_at(t, Kind::Loaded);
        server.record_at(t, Kind::Loaded);
        worker.record_at(t, Kind::Unreadable);
        let events = trace.take();
        assert_eq!(
            events.iter().map(|e| &*e.host).collect::<Vec<_>>(),
            ["worker-7", "gpu", "worker-7"]
        );
        assert!(Arc::ptr_eq(&events[0].host, &events[2].host));
        assert_eq!(&**worker.name(), "worker-7");
        assert!(
            Arc::ptr_eq(worker.name(), &events[0].host),
            "its name is the copy its events share"
        );
    }

    /// The JSON lines two runs are compared by keep their form whatever
    /// the events' layout in memory: these are the lines of the tree
    /// before `CallEnd` and `Fault` were boxed and names shared.
    #[test]
    fn events_are_written_as_before() {
        let tenant = redstring::TenantId::from_u128(1);
        let kinds = [
            Kind::CallEnd(Box::new(CallEnded {
                call: 3,
                tenant,
                outcome: CallOutcome::Ok,
                attempts: 2,
                latency_ms: 7,
                retry_after_us: None,
                answer_us: Some(9),
            })),
            Kind::CallEnd(Box::new(CallEnded {
                call: 4,
                tenant,
                outcome: CallOutcome::CircuitOpen,
                attempts: 0,
                latency_ms: 0,
                retry_after_us: Some(5),
                answer_us: None,
            })),
            Kind::Fault {
                fault: Box::new(Fault::Crash {
                    at_s: 1.5,
                    server: "gpu".into(),
                }),
            },
            Kind::Budget {
                budget: "kg:budget:gpu".into(),
                command: BudgetCommand::Withdraw,
                granted: false,
                balance: 12,
                at_us: 99,
                decided_by: Decider::Local,
            },
            Kind::Request { server: "gpu".into() },
        ];
        let events: Vec<TraceEvent> = kinds
            .into_iter()
            .map(|kind| TraceEvent {
                t_us: 5,
                host: "w".into(),
                call: Some(3),
                kind,
            })
            .collect();
        let head = r#"{"t_us":5,"host":"w","in_call":3,"ev":"#;
        let expected = [
            r#""call_end","call":3,"tenant":"00000000-0000-0000-0000-000000000001","outcome":"ok","attempts":2,"latency_ms":7,"answer_us":9}"#,
            r#""call_end","call":4,"tenant":"00000000-0000-0000-0000-000000000001","outcome":"circuit_open","attempts":0,"latency_ms":0,"retry_after_us":5}"#,
            r#""fault","what":"crash gpu"}"#,
            r#""budget","budget":"kg:budget:gpu","command":"withdraw","granted":false,"balance":12,"at_us":99,"decided_by":"local"}"#,
            r#""request","server":"gpu"}"#,
        ];
        let lines: String = expected.iter().map(|tail| format!("{head}{tail}\n")).collect();
        assert_eq!(Trace::to_json_lines(&events), lines);
    }

    /// A fleet records millions of events and keeps them all until the
    /// report: every byte of an event is megabytes of a fleet's peak. The
    /// large, once-a-call or rarer payloads are boxed to keep it here.
    #[test]
    fn a_trace_event_takes_at_most_88_bytes() {
        assert!(size_of::<Kind>() <= 48, "Kind is {} bytes", size_of::<Kind>());
        assert!(
            size_of::<TraceEvent>() <= 88,
            "TraceEvent is {} bytes",
            size_of::<TraceEvent>()
        );
    }
}
