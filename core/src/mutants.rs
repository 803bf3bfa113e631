//! Known-bad hardening, for proving that the simulator's checkers can fail.
//!
//! A checker that never fails proves nothing: every shipped scenario passing
//! is also what a harness whose invariants could never fail would report.
//! Each [`Mutant`] injects one defect that a real resilience library shipped
//! (or that this one had before it was fixed) into the real components — the
//! limiter, the breaker's state machine and its in-process store, the retry
//! schedule, the hardened provider — so that `redstring-sim mutants` can show
//! that some invariant catches it, and which.
//!
//! The switch is per thread ([`inject`] returns a guard that turns it off
//! again), because the simulator runs a whole world on one thread and may run
//! several worlds at once on others. It exists only with the `mutants` cargo
//! feature, which nothing in a production build enables (the simulator
//! turns it on); without the feature every injection site is a constant
//! `false` the compiler removes, and with it and nothing injected each site
//! reads a thread-local and behaves as without. Only the in-process stores
//! honour the store-side defects: the Redis scripts have none.

#![cfg_attr(not(feature = "mutants"), allow(dead_code))]

/// One known defect of resilience code, injectable into the real components.
///
/// Each variant's documentation says what it changes and which real failure
/// it mirrors; [`Mutant::mirrors`] gives the same as one line with a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(not(feature = "mutants"), allow(dead_code))]
pub enum Mutant {
    /// The limiter counts, finds the oldest hit and records as three separate
    /// cache calls (the spec's original limiter), so racing workers on a
    /// shared cache all see room and all record.
    ThreeCallLimiter,
    /// A refusal is recorded as a hit, so a client retrying on refusals keeps
    /// its own window full and its wait grows without bound.
    RefusalsRecorded,
    /// Every failure refreshes the failure counter's TTL, so under steady load
    /// failures never decay and sparse failures eventually open the circuit.
    FailureTtlRefreshed,
    /// Half-open admits every caller as a probe: no `half_open_max_calls`.
    UnlimitedProbes,
    /// The call that moves an open circuit to half-open is not counted as a
    /// probe, so an episode admits `half_open_max_calls + 1`.
    TransitionNotProbe,
    /// The breaker reads the stored state, decides locally, then writes: two
    /// workers that read the same state both act on it.
    ReadThenWriteBreaker,
    /// A shared cache stamps with each worker's own clock (the caller time
    /// source, clamp and all) while the fleet believes the store stamps: a
    /// skewed fleet over-admits. (Injected by the simulator's world, which
    /// builds the cache; no core code reads it.)
    CallerStampedTime,
    /// Every retry attempt takes its own limiter slot, instead of one slot per
    /// call.
    RetryOutsideLimiter,
    /// Every retry attempt asks the breaker again and reports to it, instead
    /// of one admission and one report per call.
    RetryOutsideBreaker,
    /// A fixed-window counter (one key per clock-aligned window) instead of a
    /// sliding window: up to twice the limit across a window boundary.
    FixedWindowLimiter,
    /// Retry delays ignore the configured jitter: every caller that failed
    /// together retries together.
    NoJitter,
    /// A probe that fails never reports, and probe leases never end: one lost
    /// probe wedges the circuit half-open for good.
    ProbeNeverReports,
    /// A success report never clears a closed circuit's failure count (the
    /// store ignores the clear the state machine asks for).
    SuccessKeepsFailures,
    /// Each worker keeps its limiter and breaker state in its own process
    /// while the fleet is configured to share one store: every replica
    /// admits a full window, so a fleet of `N` admits `N × rpm`. (Injected
    /// by the simulator's world, which builds the stores; no core code
    /// reads it.)
    PerReplicaLimits,
    /// The token budget checks a call's estimate against the window but
    /// reserves nothing: tokens are charged only when the call settles to
    /// the server's `usage`, so every call in flight passes the check at once.
    TokensChargedAfterCall,
    /// A cooldown already stored is kept when a later quota signal asks for
    /// a longer one: the first, shorter deadline wins, and calls resume
    /// while the server still asks to be left alone.
    CooldownNotExtended,
    /// Every deployment a call falls over to retries it on its own
    /// schedule: a call over `D` deployments may send `D × (max_retries + 1)`
    /// requests instead of `max_retries + 1`.
    FallbackRetriesAnew,
    /// Backoff is jittered but a server's `Retry-After` is waited exactly,
    /// so every caller told the same wait comes back at the same instant.
    ExactRetryAfter,
    /// A deployment known to refuse is routed past with no event: calls
    /// skip it, and nobody can see that they do, nor why.
    SkipsUnreported,
    /// A call every deployment refuses ends with no wait: the caller (and
    /// a gateway's own caller) is not told when any deployment admits again.
    RetryAfterWithheld,
    /// A spent quota is taken for a per-minute rate limit: a reset hours
    /// away cools the deployment for `max_server_delay` only, and
    /// `insufficient_quota` not at all, so routing keeps coming back to a
    /// deployment that answers 429 to every request.
    HardQuotaAsRateLimit,
    /// Every opening of the circuit lasts `recovery_timeout`, however many
    /// times in a row its probe failed: escalation is configured but
    /// ignored, so a server that stays down is probed at the base rate.
    EscalationForgotten,
    /// A spent account quota cools only the key that answered: the
    /// account's other keys (deployments of one quota group) are tried
    /// next, and each answers that the quota is spent.
    QuotaGroupIgnored,
    /// A success slower than the slow-call threshold is reported to its
    /// breaker as a success, like any other: the breaker counts only
    /// errors, so a server that answers ever more slowly is never shed.
    SlowCallsIgnored,
    /// A hedge is sent without asking the retry budget: a fleet whose
    /// servers are all slow hedges every call, and the extra requests land
    /// on servers already behind.
    HedgesSkipBudget,
    /// Slow start is configured but ignored: a deployment whose circuit
    /// just closed takes its full share of calls at once, nothing drawn.
    SlowStartIgnored,
    /// A limit's reserve for the high class is configured but ignored: a
    /// low-priority caller may take the whole limit.
    PriorityIgnored,
    /// Adaptive concurrency is configured but its refusals are ignored:
    /// an attempt at a deployment already at its limit is sent anyway, so
    /// a burst lands on a server whose slots are full.
    ConcurrencyLimitIgnored,
    /// An adaptive concurrency limit's reserve for the high class is
    /// configured but ignored: low-priority calls may fill every slot the
    /// limit allows, and a high-priority call finds none.
    ConcurrencyReserveIgnored,
}

impl Mutant {
    /// Every variant, in catalogue order.
    pub const ALL: [Mutant; 29] = [
        Mutant::ThreeCallLimiter,
        Mutant::RefusalsRecorded,
        Mutant::FailureTtlRefreshed,
        Mutant::UnlimitedProbes,
        Mutant::TransitionNotProbe,
        Mutant::ReadThenWriteBreaker,
        Mutant::CallerStampedTime,
        Mutant::RetryOutsideLimiter,
        Mutant::RetryOutsideBreaker,
        Mutant::FixedWindowLimiter,
        Mutant::NoJitter,
        Mutant::ProbeNeverReports,
        Mutant::SuccessKeepsFailures,
        Mutant::PerReplicaLimits,
        Mutant::TokensChargedAfterCall,
        Mutant::CooldownNotExtended,
        Mutant::FallbackRetriesAnew,
        Mutant::ExactRetryAfter,
        Mutant::SkipsUnreported,
        Mutant::RetryAfterWithheld,
        Mutant::HardQuotaAsRateLimit,
        Mutant::EscalationForgotten,
        Mutant::QuotaGroupIgnored,
        Mutant::SlowCallsIgnored,
        Mutant::HedgesSkipBudget,
        Mutant::SlowStartIgnored,
        Mutant::PriorityIgnored,
        Mutant::ConcurrencyLimitIgnored,
        Mutant::ConcurrencyReserveIgnored,
    ];

    /// The name the simulator's command line and reports use.
    pub const fn name(self) -> &'static str {
        match self {
            Mutant::ThreeCallLimiter => "three_call_limiter",
            Mutant::RefusalsRecorded => "refusals_recorded",
            Mutant::FailureTtlRefreshed => "failure_ttl_refreshed",
            Mutant::UnlimitedProbes => "unlimited_probes",
            Mutant::TransitionNotProbe => "transition_not_probe",
            Mutant::ReadThenWriteBreaker => "read_then_write_breaker",
            Mutant::CallerStampedTime => "caller_stamped_time",
            Mutant::RetryOutsideLimiter => "retry_outside_limiter",
            Mutant::RetryOutsideBreaker => "retry_outside_breaker",
            Mutant::FixedWindowLimiter => "fixed_window_limiter",
            Mutant::NoJitter => "no_jitter",
            Mutant::ProbeNeverReports => "probe_never_reports",
            Mutant::SuccessKeepsFailures => "success_keeps_failures",
            Mutant::PerReplicaLimits => "per_replica_limits",
            Mutant::TokensChargedAfterCall => "tokens_charged_after_call",
            Mutant::CooldownNotExtended => "cooldown_not_extended",
            Mutant::FallbackRetriesAnew => "fallback_retries_anew",
            Mutant::ExactRetryAfter => "exact_retry_after",
            Mutant::SkipsUnreported => "skips_unreported",
            Mutant::RetryAfterWithheld => "retry_after_withheld",
            Mutant::HardQuotaAsRateLimit => "hard_quota_as_rate_limit",
            Mutant::EscalationForgotten => "escalation_forgotten",
            Mutant::QuotaGroupIgnored => "quota_group_ignored",
            Mutant::SlowCallsIgnored => "slow_calls_ignored",
            Mutant::HedgesSkipBudget => "hedges_skip_budget",
            Mutant::SlowStartIgnored => "slow_start_ignored",
            Mutant::PriorityIgnored => "priority_ignored",
            Mutant::ConcurrencyLimitIgnored => "concurrency_limit_ignored",
            Mutant::ConcurrencyReserveIgnored => "concurrency_reserve_ignored",
        }
    }

    /// The variant named `name` (as [`Mutant::name`] spells it).
    pub fn parse(name: &str) -> Option<Mutant> {
        Mutant::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The real failure this variant mirrors, in one line, with where it
    /// was reported (`docs/mutants.md` has every source).
    pub const fn mirrors(self) -> &'static str {
        match self {
            Mutant::ThreeCallLimiter => {
                "sliding-window logs as separate ZCOUNT/ZADD calls: 60 of 60 concurrent requests admitted against 30 (andymai/gridfinity-layout-tool#3022; redis-developer/redis-ratelimiting-js#2)"
            }
            Mutant::RefusalsRecorded => {
                "blocked actions still added to the set, so a client retrying faster than the rate stays blocked (peterkhayes/rolling-rate-limiter, README and #9; rcarmo/piclaw#105)"
            }
            Mutant::FailureTtlRefreshed => {
                "a counter whose expiry every increment resets never decays under steady traffic (OpenSIPS/opensips#160)"
            }
            Mutant::UnlimitedProbes => {
                "half-open admits every caller (failsafe-rs v1.3.0 and recloser 1.4.0 `HalfOpen => true`; Polly#216; opossum#119)"
            }
            Mutant::TransitionNotProbe => {
                "the call that moves open to half-open takes no half-open permit (resilience4j/resilience4j#1432)"
            }
            Mutant::ReadThenWriteBreaker => {
                "a shared breaker state read, computed and written back without atomicity (sony/gobreaker's first DistributedCircuitBreaker, PR #73)"
            }
            Mutant::CallerStampedTime => {
                "rate-limit scripts fed the caller's time: a node a second behind over-issues tokens (spring-cloud/spring-cloud-gateway#2412, #1688)"
            }
            Mutant::RetryOutsideLimiter => {
                "retry wrapped around the rate limiter, so each attempt takes a permit (resilience4j's default aspect order)"
            }
            Mutant::RetryOutsideBreaker => {
                "retry wrapped around the breaker, so each attempt is admitted and counted (gojek/heimdall#75; Polly's PolicyWrap guidance)"
            }
            Mutant::FixedWindowLimiter => {
                "fixed-window counters let through twice the limit across a window boundary (Figma, \"An alternative approach to rate limiting\", 2017)"
            }
            Mutant::NoJitter => {
                "exponential backoff without jitter leaves clusters of synchronised retries (AWS Architecture Blog, \"Exponential Backoff And Jitter\", 2015)"
            }
            Mutant::ProbeNeverReports => {
                "a probe that never completes leaves the circuit half-open for good (alibaba/Sentinel#1638; getnora-io/nora#585)"
            }
            Mutant::SuccessKeepsFailures => {
                "the failure count reset only in half-open, not by a closed circuit's success (App-vNext/Polly#131)"
            }
            Mutant::PerReplicaLimits => {
                "in-memory limits per worker: \"100 requests per minute across 4 workers really lets through 400\" (BerriAI/litellm#27736 and LiteLLM's own docs)"
            }
            Mutant::TokensChargedAfterCall => {
                "tokens counted from usage after the response, so concurrent calls overspend a TPM limit 6x (BerriAI/litellm#18730)"
            }
            Mutant::CooldownNotExtended => {
                "re-cooling a deployment keeps \"the first, shorter cooldown deadline\" (BerriAI/litellm#40130)"
            }
            Mutant::FallbackRetriesAnew => {
                "each fallback retries on its own, so a call's attempts multiply and \"repeat indefinitely\" (BerriAI/litellm#19985, #35303)"
            }
            Mutant::ExactRetryAfter => {
                "capped Retry-After waits taken exactly: 19 of 20 retries waited exactly 600.0 s (NousResearch/hermes-agent PR #109234)"
            }
            Mutant::SkipsUnreported => {
                "calls routed past a failing target with nothing to show it: \"what is the current state of the circuit breaker\" (Portkey-AI/gateway#1289)"
            }
            Mutant::RetryAfterWithheld => {
                "every deployment cooling down and the request failed with no word of when one returns (BerriAI/litellm#3646, #27823)"
            }
            Mutant::HardQuotaAsRateLimit => {
                "a hard quota taken for a per-minute limit: routing stayed on a provider answering 429 to every request for over 4 hours (langwatch/langwatch#7027)"
            }
            Mutant::EscalationForgotten => {
                "every cooldown after a failure the same fixed length, however often it recurs (LiteLLM's one `cooldown_time`, BerriAI/litellm#871), where Envoy's outlier detection multiplies the ejection time by the ejections in a row"
            }
            Mutant::QuotaGroupIgnored => {
                "a spent account quota taken for one key's: each of the account's keys tried in turn, each answering 429 `insufficient_quota`, a quota counted per organisation and project, not per key (OpenAI's rate-limit and error-code guides)"
            }
            Mutant::SlowCallsIgnored => {
                "a breaker that counts only errors never sheds a server that answers slowly: \"Many circuit breaker (ex. resilience4j, sentinel) handle slow call. But failsafe-go doesn't\" (failsafe-go/failsafe-go#53; resilience4j's slowCallDurationThreshold)"
            }
            Mutant::HedgesSkipBudget => {
                "hedges outside the retry throttle add load where servers are already slow; gRPC's retry design (gRFC A6) makes hedged RPCs draw on the same throttling as retries, and Finagle bounds backup requests by a budget (maxExtraLoad)"
            }
            Mutant::SlowStartIgnored => {
                "a server back from an outage handed its full share at once: \"with no slow start enabled Envoy would send a proportional amount of traffic to new upstream endpoints\", which \"could result in request timeouts\" (Envoy's slow-start mode docs)"
            }
            Mutant::PriorityIgnored => {
                "one allowance for every class, so batch traffic takes the whole limit and interactive calls queue behind it (LiteLLM#31830, priority lanes; Envoy's priority routing keeps separate circuit-breaker limits per priority)"
            }
            Mutant::ConcurrencyLimitIgnored => {
                "calls sent past a server's capacity queue there until they time out and are retried into the same queue, what Netflix's concurrency-limits and Envoy's adaptive concurrency filter shed load to prevent (their docs)"
            }
            Mutant::ConcurrencyReserveIgnored => {
                "one concurrency limit for every class, so batch calls fill a server's slots and an interactive call finds none, what Netflix concurrency-limits' AbstractPartitionedLimiter prevents by giving each partition a percentage of the limit (its PartitionedExample)"
            }
        }
    }
}

impl std::fmt::Display for Mutant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

#[cfg(feature = "mutants")]
thread_local! {
    static ACTIVE: std::cell::Cell<Option<Mutant>> = const { std::cell::Cell::new(None) };
}

/// Keeps a [`Mutant`] injected on this thread; dropping it restores what was
/// injected before.
#[cfg(feature = "mutants")]
#[derive(Debug)]
#[must_use = "the mutant is removed when the guard is dropped"]
pub struct Injected {
    before: Option<Mutant>,
}

#[cfg(feature = "mutants")]
impl Drop for Injected {
    fn drop(&mut self) {
        ACTIVE.with(|a| a.set(self.before));
    }
}

/// Injects `mutant` (or, with `None`, nothing) into every component on this
/// thread until the guard is dropped.
#[cfg(feature = "mutants")]
pub fn inject(mutant: Option<Mutant>) -> Injected {
    Injected {
        before: ACTIVE.with(|a| a.replace(mutant)),
    }
}

/// The mutant injected on this thread, if any.
#[cfg(feature = "mutants")]
pub fn injected() -> Option<Mutant> {
    ACTIVE.with(|a| a.get())
}

/// Whether `mutant` is injected on this thread: always `false` without the
/// `mutants` feature.
#[cfg(feature = "mutants")]
#[inline]
pub(crate) fn active(mutant: Mutant) -> bool {
    injected() == Some(mutant)
}

/// Whether `mutant` is injected on this thread: always `false` without the
/// `mutants` feature.
#[cfg(not(feature = "mutants"))]
#[inline(always)]
pub(crate) const fn active(_mutant: Mutant) -> bool {
    false
}

#[cfg(all(test, feature = "mutants"))]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_distinct() {
        let mut names: Vec<_> = Mutant::ALL.iter().map(|m| m.name()).collect();
        for m in Mutant::ALL {
            assert_eq!(Mutant::parse(m.name()), Some(m));
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Mutant::ALL.len());
        assert_eq!(Mutant::parse("no_such"), None);
    }

    #[test]
    fn a_guard_scopes_the_switch_to_its_thread_and_restores_the_outer_one() {
        assert_eq!(injected(), None);
        let outer = inject(Some(Mutant::NoJitter));
        {
            let _inner = inject(Some(Mutant::UnlimitedProbes));
            assert!(active(Mutant::UnlimitedProbes));
            assert!(!active(Mutant::NoJitter));
            let other = std::thread::spawn(injected).join().unwrap();
            assert_eq!(other, None, "another thread sees nothing injected");
        }
        assert!(active(Mutant::NoJitter));
        drop(outer);
        assert_eq!(injected(), None);
    }
}
