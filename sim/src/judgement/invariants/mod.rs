//! The invariant checkers: each reads the finished trace and returns a verdict.
//!
//! Checkers are kept apart from the fault injectors: they know nothing about
//! how the world was driven, only what the trace says happened. Each returns
//! held, violated (with the first violating event), or not applicable (with
//! why), plus a figure worth reporting either way. Conditions that loosen a
//! promise (clock skew, steps back, a cache cut off or restarted) turn it
//! into a bounded claim, checked against the bound and printed beside it
//! ([`rpm_bound`], [`wait_growth_bound`]). A scenario may still declare that
//! it expects an invariant to be violated (`expect.may_violate`, as the
//! fuzzer does for liveness under a load no server can carry); the violation
//! is then reported, not failed.
//!
//! [`Invariant`] is the registry: the scenario's `expect.may_violate`, the
//! fuzzer's claims, the report and [`check_all`] all name invariants by it,
//! and `Invariant::check` is the one match that maps each to its checker,
//! grouped by subject in private modules: `limiter` (invariants 1–2),
//! `breaker` (3–5, 10–11, 17), `liveness` (6), `accounting` (7), `calls`
//! (8–9), `cooldown` (12), `budget` (13), `tokens` (14), `routing` (15–16),
//! `slow` (18), `hedging` (19), `ramp` (20), `priority` (21) and
//! `concurrency` (22).
//!
//! Scope: with per-worker caches every worker has its own limiter and breaker,
//! so the checks run per worker; with a shared cache they run fleet-wide (see
//! [`Scopes`]).

mod accounting;
mod breaker;
mod budget;
mod calls;
mod concurrency;
mod cooldown;
mod hedging;
mod limiter;
mod liveness;
mod priority;
mod ramp;
mod routing;
mod slow;
mod tokens;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::evidence::timeline::Scopes;
use crate::evidence::trace::TraceEvent;
use crate::scenario::Scenario;

pub use limiter::{RpmBound, rpm_bound, wait_growth_bound};
pub use liveness::{Heal, heal, unrecoverable};

/// A promise the library makes, checked on every run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Invariant {
    /// No tenant gets more than `rpm` admissions in any window — or the bound
    /// [`rpm_bound`] states where the scenario allows more (a caller-stamped
    /// shared cache under skew, cache restarts, workers limiting locally).
    RpmPerWindow,
    /// Successive refusals never report a growing wait while no hit is added —
    /// or one growing by at most [`wait_growth_bound`] (clock steps back, a
    /// caller-stamped skewed fleet).
    RetryAfterMonotone,
    /// A half-open episode admits at most `half_open_max_calls` probes.
    HalfOpenProbes,
    /// Failures spaced wider than `recovery_timeout` never open a circuit.
    SparseFailures,
    /// Nothing is admitted while its breaker is open and not yet due.
    NoCallWhileOpen,
    /// After the last fault, every breaker closes within a bound and calls
    /// succeed again.
    Liveness,
    /// Every unit of work ends once, classified; requests ≤ (max_retries + 1)
    /// × calls that reached the retry layer.
    Accounting,
    /// A call takes at most one limiter slot and one breaker admission,
    /// however many attempts it makes.
    OncePerCall,
    /// Retries are spread by the configured jitter.
    RetryJitter,
    /// No refusal waits longer than the longest open period (the recovery
    /// timeout, or its escalation's cap) when open, or one probe lease when
    /// half-open: nothing wedges a circuit.
    NoWedgedCircuit,
    /// A circuit opens only on `failure_threshold` failures counted since it
    /// last closed or a success cleared the count.
    OpensAtThreshold,
    /// Nothing is admitted while a quota signal's shared cooldown, recorded
    /// in the breaker's store, is in force.
    NoCallInCooldown,
    /// With a retry budget, no bucket grants more retries over any interval
    /// than `max_balance + ratio × first attempts + floor × interval`, and no
    /// call retries without a grant.
    RetryBudget,
    /// With a token budget, no window of a tenant's ledger charges more than
    /// `tokens_per_window` plus what its calls used beyond their estimates.
    TokensPerWindow,
    /// Under ordered routing, a call that goes past a deployment ahead of
    /// the one it is sent to leaves an event naming that deployment and
    /// why: its breaker's refusal (with the state), or its deferral.
    SkipsVisible,
    /// A call every breaker refused ends with a wait to come back after,
    /// never zero and never past the soonest a refusal said a breaker
    /// would admit again.
    RetryAfterReturned,
    /// With escalation, the `n`-th opening of a circuit in a row lets no
    /// probe through before `min(recovery_timeout × 2^(n−1),
    /// max_recovery_timeout)`: no escalated period is cut short.
    Escalation,
    /// Under a slow-call threshold, every success slower than it was
    /// reported to its breaker as a failure, and no faster one was.
    SlowCallsCounted,
    /// Under hedging, every hedge waits its delay, is paid from the retry
    /// budget, and no call hedges more than `max_hedges` times; a hedged
    /// call's losing request is cancelled.
    Hedging,
    /// Under a slow start, every draw ramps from its breaker's close with
    /// the curve's share, each call goes where its draw sent it, and no
    /// call a ramping breaker admits goes undrawn (judged up to each
    /// call's first request; a hedge's draw is the core's to test).
    SlowStart,
    /// Under a reserve on servers' own limits, no window holds more
    /// low-priority admissions at a limit than the low class's share, and
    /// every high-priority refusal found at least the reserve used by the
    /// high class in its window.
    PriorityShare,
    /// Under adaptive concurrency, no request is admitted at a server with
    /// as many in flight as the limit in force then, and every limit stays
    /// within its bounds.
    ConcurrencyLimit,
}

impl Invariant {
    /// Every invariant, in the order they are checked and reported.
    pub const ALL: [Invariant; 22] = [
        Invariant::RpmPerWindow,
        Invariant::RetryAfterMonotone,
        Invariant::HalfOpenProbes,
        Invariant::SparseFailures,
        Invariant::NoCallWhileOpen,
        Invariant::Liveness,
        Invariant::Accounting,
        Invariant::OncePerCall,
        Invariant::RetryJitter,
        Invariant::NoWedgedCircuit,
        Invariant::OpensAtThreshold,
        Invariant::NoCallInCooldown,
        Invariant::RetryBudget,
        Invariant::TokensPerWindow,
        Invariant::SkipsVisible,
        Invariant::RetryAfterReturned,
        Invariant::Escalation,
        Invariant::SlowCallsCounted,
        Invariant::Hedging,
        Invariant::SlowStart,
        Invariant::PriorityShare,
        Invariant::ConcurrencyLimit,
    ];

    /// This invariant's place in [`Invariant::ALL`]; a new variant fails to
    /// compile here until it is given one (and a test checks `ALL` agrees).
    pub const fn position(self) -> usize {
        match self {
            Invariant::RpmPerWindow => 0,
            Invariant::RetryAfterMonotone => 1,
            Invariant::HalfOpenProbes => 2,
            Invariant::SparseFailures => 3,
            Invariant::NoCallWhileOpen => 4,
            Invariant::Liveness => 5,
            Invariant::Accounting => 6,
            Invariant::OncePerCall => 7,
            Invariant::RetryJitter => 8,
            Invariant::NoWedgedCircuit => 9,
            Invariant::OpensAtThreshold => 10,
            Invariant::NoCallInCooldown => 11,
            Invariant::RetryBudget => 12,
            Invariant::TokensPerWindow => 13,
            Invariant::SkipsVisible => 14,
            Invariant::RetryAfterReturned => 15,
            Invariant::Escalation => 16,
            Invariant::SlowCallsCounted => 17,
            Invariant::Hedging => 18,
            Invariant::SlowStart => 19,
            Invariant::PriorityShare => 20,
            Invariant::ConcurrencyLimit => 21,
        }
    }

    /// The name scenario files and reports use.
    pub fn name(self) -> &'static str {
        match self {
            Invariant::RpmPerWindow => "rpm_per_window",
            Invariant::RetryAfterMonotone => "retry_after_monotone",
            Invariant::HalfOpenProbes => "half_open_probes",
            Invariant::SparseFailures => "sparse_failures",
            Invariant::NoCallWhileOpen => "no_call_while_open",
            Invariant::Liveness => "liveness",
            Invariant::Accounting => "accounting",
            Invariant::OncePerCall => "once_per_call",
            Invariant::RetryJitter => "retry_jitter",
            Invariant::NoWedgedCircuit => "no_wedged_circuit",
            Invariant::OpensAtThreshold => "opens_at_threshold",
            Invariant::NoCallInCooldown => "no_call_in_cooldown",
            Invariant::RetryBudget => "retry_budget",
            Invariant::TokensPerWindow => "tokens_per_window",
            Invariant::SkipsVisible => "skips_visible",
            Invariant::RetryAfterReturned => "retry_after_returned",
            Invariant::Escalation => "escalation",
            Invariant::SlowCallsCounted => "slow_calls_counted",
            Invariant::Hedging => "hedging",
            Invariant::SlowStart => "slow_start",
            Invariant::PriorityShare => "priority_share",
            Invariant::ConcurrencyLimit => "concurrency_limit",
        }
    }

    /// Runs this invariant's checker.
    fn check(self, ctx: &Ctx, events: &[TraceEvent]) -> Finding {
        match self {
            Invariant::RpmPerWindow => limiter::rpm_per_window(ctx, events),
            Invariant::RetryAfterMonotone => limiter::retry_after_monotone(ctx, events),
            Invariant::HalfOpenProbes => breaker::half_open_probes(ctx, events),
            Invariant::SparseFailures => breaker::sparse_failures(ctx, events),
            Invariant::NoCallWhileOpen => breaker::no_call_while_open(ctx, events),
            Invariant::Liveness => liveness::liveness(ctx, events),
            Invariant::Accounting => accounting::accounting(ctx, events),
            Invariant::OncePerCall => calls::once_per_call(ctx, events),
            Invariant::RetryJitter => calls::retry_jitter(ctx, events),
            Invariant::NoWedgedCircuit => breaker::no_wedged_circuit(ctx, events),
            Invariant::OpensAtThreshold => breaker::opens_at_threshold(ctx, events),
            Invariant::NoCallInCooldown => cooldown::no_call_in_cooldown(ctx, events),
            Invariant::RetryBudget => budget::retry_budget(ctx, events),
            Invariant::TokensPerWindow => tokens::tokens_per_window(ctx, events),
            Invariant::SkipsVisible => routing::skips_visible(ctx, events),
            Invariant::RetryAfterReturned => routing::retry_after_returned(ctx, events),
            Invariant::Escalation => breaker::escalation(ctx, events),
            Invariant::SlowCallsCounted => slow::slow_calls_counted(ctx, events),
            Invariant::Hedging => hedging::hedging(ctx, events),
            Invariant::SlowStart => ramp::slow_start(ctx, events),
            Invariant::PriorityShare => priority::priority_share(ctx, events),
            Invariant::ConcurrencyLimit => concurrency::concurrency_limit(ctx, events),
        }
    }
}

/// Pads like a string, so reports can align names.
impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// One invariant's outcome.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// It held over the whole run.
    Held,
    /// It did not; the first violation.
    Violated {
        /// Simulated time of the violating event, microseconds.
        t_us: u64,
        /// The host that recorded it.
        host: String,
        /// What was wrong.
        detail: String,
    },
    /// The run gives it nothing to check.
    NotApplicable {
        /// Why.
        why: String,
    },
}

/// An invariant's verdict, with what the scenario expected and a figure.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Check {
    /// The invariant.
    pub name: Invariant,
    /// The verdict.
    #[serde(flatten)]
    pub verdict: Verdict,
    /// The scenario declared it may be violated.
    pub may_violate: bool,
    /// A measurement that goes with it (the excess, the worst case seen).
    pub figure: String,
}

impl Check {
    /// Whether this check fails the run: violated and not expected to be.
    pub fn failed(&self) -> bool {
        matches!(self.verdict, Verdict::Violated { .. }) && !self.may_violate
    }
}

/// Runs every checker over `events`, in [`Invariant::ALL`] order.
pub fn check_all(scenario: &Scenario, events: &[TraceEvent]) -> Vec<Check> {
    let ctx = Ctx::new(scenario);
    Invariant::ALL
        .into_iter()
        .map(|name| {
            let (verdict, figure) = name.check(&ctx, events);
            Check {
                name,
                verdict,
                may_violate: scenario.expect.may_violate.contains(&name),
                figure,
            }
        })
        .collect()
}

/// A checker's verdict and its figure.
type Finding = (Verdict, String);

/// What every checker needs to know about the scenario.
struct Ctx<'a> {
    scenario: &'a Scenario,
    scopes: Scopes,
    /// One clock stamps everything a scope decides (per-worker, or a shared
    /// cache stamping with its own time).
    single_clock: bool,
    window_us: u64,
    recovery_us: u64,
    /// The longest a circuit stays open: `max_recovery_timeout_s` with
    /// escalation, else the recovery timeout.
    longest_open_us: u64,
    /// How long a half-open probe counts without reporting.
    lease_us: u64,
    /// The longest a request and its reply can spend on the network.
    round_trip_us: u64,
}

impl<'a> Ctx<'a> {
    fn new(scenario: &'a Scenario) -> Self {
        let scopes = Scopes::of(scenario);
        Ctx {
            scenario,
            scopes,
            single_clock: !scopes.shared() || scenario.cache.time_source == redstring::TimeSource::Store,
            window_us: secs_us(scenario.hardening.window_s),
            recovery_us: secs_us(scenario.hardening.recovery_timeout_s),
            longest_open_us: secs_us(scenario.hardening.longest_open_s().0),
            lease_us: secs_us(
                scenario
                    .hardening
                    .probe_lease_s
                    .unwrap_or(scenario.hardening.recovery_timeout_s),
            ),
            round_trip_us: 2 * (scenario.network.max_latency_ms + scenario.tick_ms) * 1000,
        }
    }

    /// The instant the checks compare: the deciding clock's stamp when one
    /// clock decides everything in a scope, otherwise true simulated time.
    fn instant(&self, e: &TraceEvent, stamp_us: u64) -> u64 {
        if self.single_clock { stamp_us } else { e.t_us }
    }
}

/// A trace event for the checkers' tests: at `t_us` on `host`, recorded
/// from within call `call` if any.
#[cfg(test)]
fn event(t_us: u64, host: &str, call: Option<u64>, kind: crate::evidence::trace::Kind) -> TraceEvent {
    TraceEvent {
        t_us,
        host: host.into(),
        call,
        kind,
    }
}

fn secs_us(s: f64) -> u64 {
    (s * 1e6).round().max(0.0) as u64
}

fn not_applicable(why: impl Into<String>) -> Finding {
    (Verdict::NotApplicable { why: why.into() }, String::new())
}

fn violated(e: &TraceEvent, detail: String) -> Verdict {
    Verdict::Violated {
        t_us: e.t_us,
        host: e.host.to_string(),
        detail,
    }
}
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use redstring::CircuitState;

    use super::*;
    use crate::evidence::outcome::CallOutcome;
    use crate::evidence::trace::{CallEnded, Decider, Kind};
    use crate::scenario::tenant;

    const MINIMAL: &str = r#"
name = "synthetic"
duration_s = 100
[hardening]
rpm = 2
window_s = 10
half_open_max_calls = 1
failure_threshold = 2
recovery_timeout_s = 5
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 1 }]
"#;

    fn scenario() -> Scenario {
        Scenario::parse("synthetic.toml", MINIMAL).unwrap()
    }

    fn ev(t_s: f64, kind: Kind) -> TraceEvent {
        event(secs_us(t_s), "w", None, kind)
    }

    fn admitted(t_s: f64) -> TraceEvent {
        ev(
            t_s,
            Kind::Admitted {
                tenant: tenant(1),
                remaining: 0,
                at_us: secs_us(t_s),
                decided_by: Decider::Cache,
            },
        )
    }

    fn breaker(t_s: f64, from: CircuitState, to: CircuitState) -> TraceEvent {
        ev(
            t_s,
            Kind::Breaker {
                breaker: "b".into(),
                from,
                to,
                at_us: secs_us(t_s),
            },
        )
    }

    fn verdict(name: Invariant, events: &[TraceEvent]) -> Verdict {
        check_all(&scenario(), events)
            .into_iter()
            .find(|c| c.name == name)
            .unwrap()
            .verdict
    }

    #[test]
    fn an_extra_admission_in_a_window_is_caught() {
        assert_eq!(
            verdict(Invariant::RpmPerWindow, &[admitted(0.0), admitted(5.0), admitted(11.0)]),
            Verdict::Held
        );
        let v = verdict(Invariant::RpmPerWindow, &[admitted(0.0), admitted(5.0), admitted(10.0)]);
        assert!(matches!(v, Verdict::Violated { t_us: 10_000_000, .. }), "{v:?}");
    }

    /// A caller-stamped shared cache whose workers run 3 s behind and 4 s
    /// ahead of the cache host, one of them stepped `step_ms` at 50 s.
    fn skewed(time_source: &str, step_ms: i64) -> Scenario {
        let toml = format!(
            r#"
name = "skewed"
duration_s = 100
[hardening]
rpm = 20
window_s = 10
[cache]
kind = "shared"
time_source = "{time_source}"
[[servers]]
name = "gpu"
[[workers]]
name = "slow"
servers = ["gpu"]
tenants = [{{ id = 1, calls_per_min = 1 }}]
clock = {{ offset_ms = -3000 }}
[[workers]]
name = "fast"
servers = ["gpu"]
tenants = [{{ id = 1, calls_per_min = 1 }}]
clock = {{ offset_ms = 4000 }}
[[faults]]
kind = "clock_step"
at_s = 50
host = "slow"
by_ms = {step_ms}
"#
        );
        Scenario::parse("skewed.toml", &toml).unwrap()
    }

    #[test]
    fn the_rpm_bound_follows_the_clamped_clock_spread() {
        // The fast worker is clamped to 1 s ahead; the slow one is 3 s behind:
        // a spread of 4 s in a 10 s window lets twice rpm through.
        let b = rpm_bound(&skewed("caller", 0));
        assert_eq!((b.limit(0), b.spread), (40, Duration::from_secs(4)));
        // Stepped 9 s further back, the slow one is clamped one window behind:
        // spread 11 s, three times rpm.
        let b = rpm_bound(&skewed("caller", -9000));
        assert_eq!((b.limit(0), b.spread), (60, Duration::from_secs(11)));
        // The cache's own clock stamps: exact.
        let b = rpm_bound(&skewed("store", -9000));
        assert_eq!((b.limit(0), b.spread), (20, Duration::ZERO));
    }

    #[test]
    fn admissions_beyond_the_skew_bound_are_caught_and_within_it_held() {
        let s = skewed("caller", 0);
        let burst = |n: usize| -> Vec<TraceEvent> { (0..n).map(|i| admitted(i as f64 * 0.1)).collect() };
        let check = |events: &[TraceEvent]| {
            let checks = check_all(&s, events);
            checks
                .into_iter()
                .find(|c| c.name == Invariant::RpmPerWindow)
                .unwrap()
                .verdict
        };
        assert_eq!(check(&burst(40)), Verdict::Held);
        assert!(matches!(check(&burst(41)), Verdict::Violated { .. }));
    }

    /// A shared, store-stamped cache for two workers `w` and `v`, rpm 2 per
    /// 10 s, with `faults` (TOML) appended.
    fn shared(faults: &str, hardening: &str) -> Scenario {
        let toml = format!(
            r#"
name = "shared"
duration_s = 100
[hardening]
rpm = 2
window_s = 10
{hardening}
[cache]
kind = "shared"
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{{ id = 1, calls_per_min = 1 }}]
[[workers]]
name = "v"
servers = ["gpu"]
tenants = [{{ id = 1, calls_per_min = 1 }}]
{faults}
"#
        );
        Scenario::parse("shared.toml", &toml).unwrap()
    }

    fn admitted_on(host: &str, t_s: f64, decided_by: Decider) -> TraceEvent {
        event(
            secs_us(t_s),
            host,
            None,
            Kind::Admitted {
                tenant: tenant(1),
                remaining: 0,
                at_us: secs_us(t_s),
                decided_by,
            },
        )
    }

    fn limited_on(host: &str, t_s: f64, wait_s: f64, decided_by: Decider) -> TraceEvent {
        event(
            secs_us(t_s),
            host,
            None,
            Kind::Limited {
                tenant: tenant(1),
                retry_after_us: secs_us(wait_s),
                at_us: secs_us(t_s),
                decided_by,
            },
        )
    }

    fn check_of(s: &Scenario, name: Invariant, events: &[TraceEvent]) -> Check {
        check_all(s, events).into_iter().find(|c| c.name == name).unwrap()
    }

    #[test]
    fn workers_that_limit_locally_add_rpm_each_to_the_bound() {
        use Decider::{Cache, Local, Unlimited};
        let s = shared("", "");
        // rpm 2 from the shared cache, and 2 more from w's local limiter: the
        // bound is rpm × (1 worker that fell back + 1) = 4.
        let mut events = vec![
            admitted_on("v", 1.0, Cache),
            admitted_on("v", 2.0, Cache),
            admitted_on("w", 3.0, Local),
            admitted_on("w", 4.0, Local),
        ];
        let c = check_of(&s, Invariant::RpmPerWindow, &events);
        assert_eq!(c.verdict, Verdict::Held, "{c:?}");
        assert!(
            c.figure.contains("bound 4: rpm 2 + 2 × 1 worker that limited locally"),
            "{}",
            c.figure
        );
        // A fifth in the window exceeds it.
        events.push(admitted_on("v", 5.0, Cache));
        let c = check_of(&s, Invariant::RpmPerWindow, &events);
        assert!(matches!(c.verdict, Verdict::Violated { t_us: 5_000_000, .. }), "{c:?}");
        // Without the local ones, three shared admissions already exceed rpm.
        let shared_only = [
            admitted_on("v", 1.0, Cache),
            admitted_on("v", 2.0, Cache),
            admitted_on("v", 5.0, Cache),
        ];
        assert!(matches!(
            check_of(&s, Invariant::RpmPerWindow, &shared_only).verdict,
            Verdict::Violated { .. }
        ));
        // Admissions nobody decided (the admit policy) are outside any bound,
        // and counted in the figure.
        let unlimited: Vec<TraceEvent> = (0..5)
            .map(|i| admitted_on("w", 1.0 + f64::from(i), Unlimited))
            .collect();
        let c = check_of(&s, Invariant::RpmPerWindow, &unlimited);
        assert_eq!(c.verdict, Verdict::Held);
        assert!(c.figure.contains("5 admitted without a limit"), "{}", c.figure);
    }

    #[test]
    fn each_cache_restart_in_a_window_lets_the_store_decide_rpm_again() {
        let s = shared(
            "[[faults]]\nkind = \"cache_down\"\nat_s = 4\n[[faults]]\nkind = \"cache_up\"\nat_s = 5\n[[faults]]\nkind = \"cache_down\"\nat_s = 50\n[[faults]]\nkind = \"cache_up\"\nat_s = 70\n",
            "",
        );
        let b = rpm_bound(&s);
        // The two restarts are 65 s apart: one per 10 s window.
        assert_eq!((b.restarts, b.limit(0)), (1, 4));
        let before_and_after = [admitted(1.0), admitted(2.0), admitted(6.0), admitted(7.0)];
        assert_eq!(
            check_of(&s, Invariant::RpmPerWindow, &before_and_after).verdict,
            Verdict::Held
        );
        let one_more = [before_and_after.as_slice(), &[admitted(8.0)]].concat();
        assert!(matches!(
            check_of(&s, Invariant::RpmPerWindow, &one_more).verdict,
            Verdict::Violated { .. }
        ));
        // Two restarts within one window: three times rpm.
        let close = shared(
            "[[faults]]\nkind = \"cache_up\"\nat_s = 4\n[[faults]]\nkind = \"cache_up\"\nat_s = 9\n",
            "",
        );
        assert_eq!(rpm_bound(&close).limit(0), 6);
    }

    #[test]
    fn a_wait_may_grow_only_in_the_aftermath_of_a_step_back_and_by_at_most_a_window_plus_the_step() {
        use Decider::Cache;
        // Per-worker caches (the worker's clock stamps), w stepped back 3 s at 20 s.
        let step = r#"
name = "stepped"
duration_s = 100
[hardening]
rpm = 2
window_s = 10
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 1 }]
[[faults]]
kind = "clock_step"
at_s = 20
host = "w"
by_ms = -3000
"#;
        let s = Scenario::parse("stepped.toml", step).unwrap();
        let second = Duration::from_secs(1).as_micros() as u64;
        // Before the step, and long after its aftermath (20 + 10 + 3 s): none.
        assert_eq!(
            wait_growth_bound(&s, &rpm_bound(&s), "w", Cache, (5 * second, 6 * second)),
            Duration::ZERO
        );
        assert_eq!(
            wait_growth_bound(&s, &rpm_bound(&s), "w", Cache, (40 * second, 41 * second)),
            Duration::ZERO
        );
        // Across it or within its aftermath: the window plus the step.
        assert_eq!(
            wait_growth_bound(&s, &rpm_bound(&s), "w", Cache, (19 * second, 21 * second)),
            Duration::from_secs(13)
        );
        assert_eq!(
            wait_growth_bound(&s, &rpm_bound(&s), "w", Cache, (30 * second, 32 * second)),
            Duration::from_secs(13)
        );
        // Another host's step does not loosen w's claim.
        assert_eq!(
            wait_growth_bound(&s, &rpm_bound(&s), "v", Cache, (19 * second, 21 * second)),
            Duration::ZERO
        );
        let grows = |t: f64, by: f64| {
            [
                limited_on("w", t, 2.0, Cache),
                limited_on("w", t + 1.0, 2.0 + by, Cache),
            ]
        };
        let verdict = |events: &[TraceEvent]| check_of(&s, Invariant::RetryAfterMonotone, events).verdict;
        assert_eq!(verdict(&grows(25.0, 12.0)), Verdict::Held);
        assert!(matches!(verdict(&grows(25.0, 14.0)), Verdict::Violated { .. }));
        assert!(matches!(verdict(&grows(50.0, 0.5)), Verdict::Violated { .. }));
    }

    #[test]
    fn waits_from_a_local_fallback_and_from_the_shared_cache_are_compared_apart() {
        use Decider::{Cache, Local};
        let s = shared("", "");
        // The local limiter knew only its own hits; the shared cache's wait is
        // another limiter's, and may be longer.
        let events = [
            limited_on("w", 10.0, 1.0, Local),
            limited_on("w", 10.5, 6.0, Cache),
            limited_on("w", 11.0, 5.0, Cache),
        ];
        assert_eq!(
            check_of(&s, Invariant::RetryAfterMonotone, &events).verdict,
            Verdict::Held
        );
        let grew = [events.as_slice(), &[limited_on("w", 11.5, 7.0, Cache)]].concat();
        assert!(matches!(
            check_of(&s, Invariant::RetryAfterMonotone, &grew).verdict,
            Verdict::Violated { .. }
        ));
    }

    #[test]
    fn a_caller_stamped_skewed_fleet_allows_a_window_plus_the_spread() {
        use Decider::Cache;
        let s = skewed("caller", 0);
        // Spread 4 s (see the_rpm_bound_follows_the_clamped_clock_spread).
        assert_eq!(
            wait_growth_bound(&s, &rpm_bound(&s), "slow", Cache, (0, 1_000_000)),
            Duration::from_secs(14)
        );
        assert_eq!(
            wait_growth_bound(
                &skewed("store", 0),
                &rpm_bound(&skewed("store", 0)),
                "slow",
                Cache,
                (0, 1_000_000)
            ),
            Duration::ZERO
        );
    }

    #[test]
    fn a_second_live_probe_in_one_episode_is_caught() {
        use CircuitState::*;
        let probe = |t, seq| {
            ev(
                t,
                Kind::Allowed {
                    breaker: "b".into(),
                    state: HalfOpen,
                    probe: Some(seq),
                    at_us: secs_us(t),
                },
            )
        };
        let episode = || [breaker(1.0, Closed, Open), breaker(6.0, Open, HalfOpen), probe(6.0, 1)];
        assert_eq!(verdict(Invariant::HalfOpenProbes, &episode()), Verdict::Held);
        let two = [episode().as_slice(), &[probe(6.5, 2)]].concat();
        assert!(matches!(
            verdict(Invariant::HalfOpenProbes, &two),
            Verdict::Violated { .. }
        ));
        // The lease is the recovery timeout, 5 s here: a probe after it, or
        // after the first was handed back, is the only live one.
        let expired = [episode().as_slice(), &[probe(11.0, 2)]].concat();
        assert_eq!(verdict(Invariant::HalfOpenProbes, &expired), Verdict::Held);
        let released = ev(
            6.2,
            Kind::ProbeReleased {
                breaker: "b".into(),
                seq: 1,
            },
        );
        let handed_back = [episode().as_slice(), &[released, probe(6.5, 2)]].concat();
        assert_eq!(verdict(Invariant::HalfOpenProbes, &handed_back), Verdict::Held);
    }

    #[test]
    fn an_admission_while_open_is_caught() {
        use CircuitState::*;
        let allowed = ev(
            2.0,
            Kind::Allowed {
                breaker: "b".into(),
                state: Closed,
                probe: None,
                at_us: secs_us(2.0),
            },
        );
        let v = verdict(Invariant::NoCallWhileOpen, &[breaker(1.0, Closed, Open), allowed]);
        assert!(matches!(v, Verdict::Violated { .. }), "{v:?}");
    }

    #[test]
    fn an_opening_on_sparse_failures_is_caught() {
        use CircuitState::*;
        let failure = |t| {
            ev(
                t,
                Kind::FailureRecorded {
                    breaker: "b".into(),
                    at_us: secs_us(t),
                },
            )
        };
        let dense = [failure(1.0), failure(3.0), breaker(3.0, Closed, Open)];
        assert_eq!(verdict(Invariant::SparseFailures, &dense), Verdict::Held);
        let sparse = [failure(1.0), failure(9.0), breaker(9.0, Closed, Open)];
        assert!(matches!(
            verdict(Invariant::SparseFailures, &sparse),
            Verdict::Violated { .. }
        ));
    }

    #[test]
    fn work_that_ends_twice_or_unannounced_is_caught() {
        let end = |call| {
            ev(
                3.0,
                Kind::CallEnd(Box::new(CallEnded {
                    call,
                    tenant: tenant(1),
                    outcome: CallOutcome::Ok,
                    attempts: 1,
                    latency_ms: 1,
                    retry_after_us: None,
                    answer_us: None,
                })),
            )
        };
        let arrive = ev(
            1.0,
            Kind::Arrival {
                call: 0,
                tenant: tenant(1),
            },
        );
        assert_eq!(verdict(Invariant::Accounting, &[arrive.clone(), end(0)]), Verdict::Held);
        assert!(matches!(
            verdict(Invariant::Accounting, &[arrive, end(0), end(0)]),
            Verdict::Violated { .. }
        ));
    }

    #[test]
    fn a_declared_violation_does_not_fail_the_run() {
        let mut s = scenario();
        s.expect.may_violate.insert(Invariant::RpmPerWindow);
        let checks = check_all(&s, &[admitted(0.0), admitted(1.0), admitted(2.0)]);
        let rpm = checks.iter().find(|c| c.name == Invariant::RpmPerWindow).unwrap();
        assert!(matches!(rpm.verdict, Verdict::Violated { .. }));
        assert!(!rpm.failed());
    }

    #[test]
    fn window_counting_is_inclusive_and_finds_the_first_excess() {
        assert_eq!(limiter::max_in_window([0, 10, 20].into_iter(), 20, 3), (3, None));
        assert_eq!(limiter::max_in_window([0, 10, 20, 20].into_iter(), 20, 3), (4, Some(3)));
        assert_eq!(limiter::max_in_window([0, 21, 42].into_iter(), 20, 1), (1, None));
    }

    #[test]
    fn all_lists_every_invariant_once_in_position_order() {
        for (i, invariant) in Invariant::ALL.iter().enumerate() {
            assert_eq!(invariant.position(), i, "{invariant}");
            let json = serde_json::to_value(invariant).unwrap();
            assert_eq!(json, invariant.name());
        }
    }

    #[test]
    fn calls_the_breaker_fallback_let_through_are_counted_beside_the_claim() {
        use CircuitState::*;
        let through = ev(
            2.0,
            Kind::CacheUnavailable {
                operation: "breaker_step",
                fallback: "allowed",
                admitted_call: true,
            },
        );
        let c = check_of(
            &scenario(),
            Invariant::NoCallWhileOpen,
            &[breaker(1.0, Closed, Open), through.clone(), through],
        );
        assert_eq!(c.verdict, Verdict::Held);
        assert!(
            c.figure.contains("2 calls let through by the breaker's fallback"),
            "{}",
            c.figure
        );
    }

    #[test]
    fn the_last_fault_ends_when_this_runs_restarted_server_loaded() {
        let text = format!(
            "{MINIMAL}[[faults]]\nkind = \"crash\"\nat_s = 20\nserver = \"gpu\"\n[[faults]]\nkind = \"restart\"\nat_s = 30\nserver = \"gpu\"\n"
        );
        let mut s = Scenario::parse("restart.toml", &text).unwrap();
        // A drawn reload: the instant this run drew, not the longest draw.
        s.servers[0].reload = Some(crate::scenario::Spread::Uniform { low: 5.0, high: 40.0 });
        let loaded = |t: f64| event(secs_us(t), "gpu", None, Kind::Loaded);
        let over = |s: &Scenario, events: &[TraceEvent]| heal(s, &crate::evidence::episodes::episodes(s, events));
        assert_eq!(over(&s, &[loaded(0.0), loaded(37.5)]), Heal::At(secs_us(37.5)));
        assert_eq!(over(&s, &[loaded(0.0)]), Heal::NotReady("gpu".into()));
        // A restart of a server that is running does nothing: over at once.
        s.faults.remove(0);
        assert_eq!(over(&s, &[loaded(0.0)]), Heal::At(secs_us(30.0)));
        s.faults.clear();
        assert_eq!(over(&s, &[]), Heal::NoFault);
    }

    #[test]
    fn a_restarted_shared_cache_forgets_open_breakers() {
        use CircuitState::*;
        let mut s = scenario();
        s.cache.kind = crate::scenario::CacheKind::Shared;
        let up = event(
            secs_us(2.0),
            crate::evidence::trace::DRIVER,
            None,
            Kind::Fault {
                fault: Box::new(crate::scenario::Fault::CacheUp { at_s: 2.0 }),
            },
        );
        let allowed = ev(
            3.0,
            Kind::Allowed {
                breaker: "b".into(),
                state: Closed,
                probe: None,
                at_us: secs_us(3.0),
            },
        );
        let checks = check_all(&s, &[breaker(1.0, Closed, Open), up, allowed]);
        let open = checks.iter().find(|c| c.name == Invariant::NoCallWhileOpen).unwrap();
        assert_eq!(open.verdict, Verdict::Held);
    }
}
