//! Fuzzing whole scenarios: "is there any outage, within these bounds, that
//! breaks my configuration?"
//!
//! [`scenarios`] is a proptest strategy over complete [`Scenario`]s — the
//! hardening settings, the cache layout and time source, the fleet and its
//! clocks, and the fault schedule as explicit data — drawn from user-given
//! [`Bounds`]. Each case switches fault kinds on and off at random (swarm
//! testing), so one run explores schedules with only crashes as well as
//! schedules with everything at once. Faults are generated as self-contained
//! episodes (a crash with its restart, a partition with its heal), so when a
//! case fails proptest's shrinking removes whole episodes, shortens them and
//! lowers the numbers, ending at the fewest, shortest faults that still break
//! an invariant. [`write_regression`] turns that case into a scenario file that
//! `redstring-sim run` replays exactly.
//!
//! A case passes when every invariant its configuration *claims* holds
//! ([`claimed_exceptions`] names the ones it cannot claim: only liveness, for
//! a fleet that overloads a healthy server). Conditions that loosen an
//! invariant — skew, clock steps, a cache cut off or restarted — are claimed
//! at the bound the checker computes for them, so a case that exceeds it
//! fails and shrinks like any other.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use redstring::{OnCacheError, OnCacheUnavailable, TimeSource};
use serde::{Deserialize, Serialize};

use crate::campaign::simulate;
use crate::judgement::invariants::Invariant;
use crate::judgement::report::Report;
use crate::scenario::{
    AdaptiveConcurrencySpec, Behaviour, CACHE_HOST, CacheKind, CacheLayout, ClockSpec, Expectations, Fault, FaultKind,
    Hardening, HedgeAfterMs, Mode, Network, RetryBudgetSpec, Routing, Scenario, ScenarioError, ServerSpec, TenantLoad,
    WorkerGroup, limits,
};
use crate::search::coverage::Coverage;

/// The directory under `scenarios/` that holds bounds files, which are not
/// scenarios (`check` skips it).
pub const BOUNDS_DIR: &str = "bounds";

/// The fault kinds a fuzz run may draw: those that start an episode (a
/// restart, a heal and a cache coming back are drawn as the end of theirs).
pub fn episode_kinds() -> Vec<FaultKind> {
    FaultKind::ALL.into_iter().filter(|k| k.episode() == *k).collect()
}

/// The space a fuzz run searches, read from a TOML file. Ranges are `[min, max]`, inclusive.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Bounds {
    /// Simulated seconds per case.
    pub duration_s: [f64; 2],
    /// Simulation step (fixed per run; 20 ms keeps cases fast).
    pub tick_ms: u64,
    /// Workers in the fleet.
    pub workers: [u32; 2],
    /// Model servers.
    pub servers: [u32; 2],
    /// Tenants per worker.
    pub tenants: [u32; 2],
    /// Each tenant's arrivals per minute per worker.
    pub calls_per_min: [f64; 2],
    /// `hardening.rpm`.
    pub rpm: [u32; 2],
    /// `hardening.window_s`.
    pub window_s: [f64; 2],
    /// `hardening.failure_threshold`.
    pub failure_threshold: [u32; 2],
    /// `hardening.recovery_timeout_s`.
    pub recovery_timeout_s: [f64; 2],
    /// `hardening.half_open_max_calls`.
    pub half_open_max_calls: [u32; 2],
    /// `hardening.max_retries`.
    pub max_retries: [u32; 2],
    /// `hardening.initial_delay_s`.
    pub initial_delay_s: [f64; 2],
    /// `hardening.jitter`.
    pub jitter: [f64; 2],
    /// `hardening.request_timeout_s`.
    pub request_timeout_s: [f64; 2],
    /// Cache layouts to try.
    pub cache: Vec<CacheKind>,
    /// Time sources to try for a shared cache.
    pub time_sources: Vec<TimeSource>,
    /// Limiter policies to try while the shared cache cannot be reached.
    pub on_cache_unavailable: Vec<OnCacheUnavailable>,
    /// Breaker policies to try while the shared cache cannot be reached.
    pub on_cache_error: Vec<OnCacheError>,
    /// Largest clock offset, either way.
    pub max_clock_offset_ms: i64,
    /// Largest clock drift, either way.
    pub max_drift_ppm: i64,
    /// Fault kinds to draw from (see [`episode_kinds`]).
    pub fault_kinds: Vec<FaultKind>,
    /// Most fault episodes per case (at most [`MAX_FAULTS`]).
    pub max_faults: usize,
    /// Whether cases may set a retry budget and a token budget (each on
    /// about half the cases, with their numbers drawn), so the fuzzer
    /// searches their invariants too. Off by default: the default space,
    /// and every case it draws for a seed, stay as they were.
    pub budgets: bool,
    /// Whether cases may route (`hardening.routing`: ordered, weighted or
    /// least-loaded, drawn with "none" on a quarter of the cases each), every
    /// worker then calling all the servers, starting from its own. Off by
    /// default, like `budgets`.
    pub routing: bool,
    /// Whether cases may escalate their breakers
    /// (`hardening.max_recovery_timeout_s`: the recovery timeout times 1, 2,
    /// 4, 8 or 16, drawn alike), so the fuzzer also searches the
    /// `escalation` invariant. Off by default, like `budgets`.
    pub escalation: bool,
    /// A range of `hardening.slow_call_ms` to draw on about half the cases
    /// (each kept below the case's `request_timeout_s`), so the fuzzer
    /// searches `slow_calls_counted` too. None by default, like `budgets`.
    pub slow_call_ms: Option<[u64; 2]>,
    /// A range of `hardening.hedge_after_ms` to draw on about half the
    /// cases that route and set no slow-call threshold (each kept below the
    /// case's `request_timeout_s`, with `max_hedges` drawn from 1 to 4), so
    /// the fuzzer searches `hedging` too. None by default, like `budgets`.
    pub hedge_after_ms: Option<[u64; 2]>,
    /// A range of `hardening.slow_start_s`, whole seconds, to draw on
    /// about half the cases, so the fuzzer searches `slow_start` too. None
    /// by default, like `budgets`.
    pub slow_start_s: Option<[u64; 2]>,
    /// A range of `hardening.deployment_rpm` to draw on about half the
    /// cases, each with a `hardening.reserve` of 0.1, 0.2, 0.3 or 0.5 and
    /// every second tenant `priority = "low"`, so the fuzzer searches
    /// `priority_share` too. None by default, like `budgets`.
    pub deployment_rpm: Option<[u32; 2]>,
    /// A range of `hardening.adaptive_concurrency.max`, whole calls in
    /// flight, to draw on about half the cases (with `initial` drawn from
    /// 1 to that max, `min` 1 and `backoff` 0.5, 0.75 or 0.9), so the
    /// fuzzer searches `concurrency_limit` too; where the max is 2 or
    /// more, about half of those keep a `hardening.reserve` of 0.25 or 0.5
    /// of the limit (with `min` 2, so the low class always has a call) and
    /// make every second tenant `priority = "low"`. None by default, like
    /// `budgets`.
    pub adaptive_concurrency: Option<[u32; 2]>,
}

/// The most fault episodes a bounds file may ask for per case: proptest
/// sizes each case's schedule up to it, so it must stay small.
pub const MAX_FAULTS: usize = 64;

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            duration_s: [60.0, 240.0],
            tick_ms: 20,
            workers: [1, 4],
            servers: [1, 2],
            tenants: [1, 2],
            calls_per_min: [5.0, 40.0],
            rpm: [5, 60],
            window_s: [5.0, 60.0],
            failure_threshold: [1, 6],
            recovery_timeout_s: [5.0, 60.0],
            half_open_max_calls: [1, 3],
            max_retries: [0, 4],
            initial_delay_s: [0.2, 2.0],
            jitter: [0.0, 0.3],
            request_timeout_s: [2.0, 15.0],
            cache: vec![CacheKind::PerWorker, CacheKind::Shared],
            time_sources: vec![TimeSource::Caller, TimeSource::Store],
            on_cache_unavailable: vec![
                OnCacheUnavailable::LocalLimit,
                OnCacheUnavailable::Admit,
                OnCacheUnavailable::Refuse,
            ],
            on_cache_error: vec![OnCacheError::Allow, OnCacheError::Refuse],
            max_clock_offset_ms: 5000,
            max_drift_ppm: 500,
            fault_kinds: episode_kinds(),
            max_faults: 4,
            budgets: false,
            routing: false,
            escalation: false,
            slow_call_ms: None,
            hedge_after_ms: None,
            slow_start_s: None,
            deployment_rpm: None,
            adaptive_concurrency: None,
        }
    }
}

impl Bounds {
    /// Reads and checks a bounds file; errors name the file and the field.
    pub fn load(path: &Path) -> Result<Bounds, ScenarioError> {
        let file = path.display().to_string();
        let text = crate::scenario::input::read_text(path).map_err(|source| ScenarioError::Io {
            file: file.clone(),
            source,
        })?;
        let bounds: Bounds = toml::from_str(&text).map_err(|e| {
            if toml::from_str::<Scenario>(&text).is_ok() {
                ScenarioError::NotBounds { file: file.clone() }
            } else {
                ScenarioError::Parse {
                    file: file.clone(),
                    message: e.to_string().trim_end().to_owned(),
                }
            }
        })?;
        bounds.validate(&file).map_err(|e| match e {
            ScenarioError::Invalid {
                file, field, message, ..
            } => ScenarioError::Invalid {
                line: crate::scenario::locate(&text, &field),
                file,
                field,
                message,
            },
            other => other,
        })?;
        Ok(bounds)
    }

    fn validate(&self, file: &str) -> Result<(), ScenarioError> {
        let bad = |field: &str, message: String| ScenarioError::Invalid {
            file: file.to_owned(),
            line: None,
            field: field.to_owned(),
            message,
        };
        let range = |field: &str, [a, b]: [f64; 2], min: f64| {
            if a.is_finite() && b.is_finite() && a >= min && a <= b {
                Ok(())
            } else {
                Err(bad(
                    field,
                    format!("must be [min, max] with {min} <= min <= max, got [{a}, {b}]"),
                ))
            }
        };
        range("duration_s", self.duration_s, 1.0)?;
        range("calls_per_min", self.calls_per_min, 0.0)?;
        range("window_s", self.window_s, 0.001)?;
        range("recovery_timeout_s", self.recovery_timeout_s, 0.001)?;
        range("initial_delay_s", self.initial_delay_s, 0.001)?;
        range("request_timeout_s", self.request_timeout_s, 0.001)?;
        range("jitter", self.jitter, 0.0)?;
        // The largest values a scenario may hold (see `scenario::limits`).
        for (field, [_, b], max) in [
            ("duration_s", self.duration_s, 24.0 * 3600.0),
            ("calls_per_min", self.calls_per_min, limits::MAX_CALLS_PER_MIN),
            ("window_s", self.window_s, limits::MAX_SECONDS),
            ("recovery_timeout_s", self.recovery_timeout_s, limits::MAX_SECONDS),
            // The generator sets max_delay_s to eight times the first delay,
            // and the core's retry policy allows a day at most.
            (
                "initial_delay_s",
                self.initial_delay_s,
                redstring::retry::MAX_DELAY_LIMIT.as_secs_f64() / 8.0,
            ),
            ("request_timeout_s", self.request_timeout_s, limits::MAX_SECONDS),
        ] {
            if b > max {
                return Err(bad(field, format!("max must be at most {max}, got {b}")));
            }
        }
        for (field, range) in [
            ("slow_call_ms", self.slow_call_ms),
            ("hedge_after_ms", self.hedge_after_ms),
        ] {
            let Some([a, b]) = range else { continue };
            // Every threshold or delay a scenario may hold is below its
            // request timeout, at most `MAX_SECONDS`.
            let most = (limits::MAX_SECONDS * 1000.0) as u64;
            if a < 1 || a > b || b > most {
                return Err(bad(
                    field,
                    format!("must be [min, max] with 1 <= min <= max <= {most}, got [{a}, {b}]"),
                ));
            }
        }
        if let Some([a, b]) = self.slow_start_s {
            // The core's longest ramp is a day.
            let most = 86_400;
            if a < 1 || a > b || b > most {
                return Err(bad(
                    "slow_start_s",
                    format!("must be [min, max] with 1 <= min <= max <= {most}, got [{a}, {b}]"),
                ));
            }
        }
        if let Some([a, b]) = self.deployment_rpm {
            // Two leaves the low class a call under the largest reserve drawn.
            if a < 2 || a > b {
                return Err(bad(
                    "deployment_rpm",
                    format!("must be [min, max] with 2 <= min <= max, got [{a}, {b}]"),
                ));
            }
        }
        if let Some([a, b]) = self.adaptive_concurrency {
            let most = redstring::decide::concurrency::MAX_LIMIT;
            if a < 1 || a > b || b > most {
                return Err(bad(
                    "adaptive_concurrency",
                    format!("must be [min, max] with 1 <= min <= max <= {most}, got [{a}, {b}]"),
                ));
            }
        }
        if self.max_faults > MAX_FAULTS {
            return Err(bad(
                "max_faults",
                format!("must be at most {MAX_FAULTS}, got {}", self.max_faults),
            ));
        }
        if self.max_retries[1] > limits::MAX_RETRIES {
            return Err(bad(
                "max_retries",
                format!(
                    "max must be at most {}, got {}",
                    limits::MAX_RETRIES,
                    self.max_retries[1]
                ),
            ));
        }
        if self.max_clock_offset_ms.unsigned_abs() > limits::MAX_CLOCK_MS / 2 {
            return Err(bad(
                "max_clock_offset_ms",
                format!("must be at most {} (half a year)", limits::MAX_CLOCK_MS / 2),
            ));
        }
        if self.max_drift_ppm.unsigned_abs() > limits::MAX_DRIFT_PPM {
            return Err(bad(
                "max_drift_ppm",
                format!("must be at most {}", limits::MAX_DRIFT_PPM),
            ));
        }
        if self.jitter[1] > 1.0 {
            return Err(bad("jitter", "must not exceed 1.0".into()));
        }
        for (field, [a, b], min) in [
            ("workers", self.workers, 1),
            ("servers", self.servers, 1),
            ("tenants", self.tenants, 1),
            ("rpm", self.rpm, 1),
            ("failure_threshold", self.failure_threshold, 1),
            ("half_open_max_calls", self.half_open_max_calls, 1),
            ("max_retries", self.max_retries, 0),
        ] {
            if a < min || a > b {
                return Err(bad(
                    field,
                    format!("must be [min, max] with {min} <= min <= max, got [{a}, {b}]"),
                ));
            }
        }
        for (field, [_, most], limit) in [
            ("workers", self.workers, 50),
            ("servers", self.servers, 8),
            ("tenants", self.tenants, 8),
            // The core's breaker admits at most this many probes.
            (
                "half_open_max_calls",
                self.half_open_max_calls,
                redstring::decide::breaker::MAX_HALF_OPEN_CALLS,
            ),
        ] {
            if most > limit {
                return Err(bad(field, format!("max must be at most {limit}, got {most}")));
            }
        }
        // A case may draw the most of each: every worker has every tenant.
        let fleet_calls = f64::from(self.workers[1]) * f64::from(self.tenants[1]) * self.calls_per_min[1];
        if fleet_calls > limits::MAX_FLEET_CALLS_PER_MIN {
            return Err(bad(
                "calls_per_min",
                format!(
                    "max {} on each of up to {} tenants on each of up to {} workers draws fleets calling {fleet_calls} times a minute, above the {} a scenario may; lower one of the three",
                    self.calls_per_min[1],
                    self.tenants[1],
                    self.workers[1],
                    limits::MAX_FLEET_CALLS_PER_MIN
                ),
            ));
        }
        if self.tick_ms == 0 || self.tick_ms > 1000 {
            return Err(bad(
                "tick_ms",
                format!("must be between 1 and 1000, got {}", self.tick_ms),
            ));
        }
        if self.cache.is_empty() {
            return Err(bad("cache", "name at least one layout".into()));
        }
        if self.time_sources.is_empty() {
            return Err(bad("time_sources", "name at least one time source".into()));
        }
        if self.on_cache_unavailable.is_empty() {
            return Err(bad("on_cache_unavailable", "name at least one policy".into()));
        }
        if self.on_cache_error.is_empty() {
            return Err(bad("on_cache_error", "name at least one policy".into()));
        }
        for (field, v) in [
            ("max_clock_offset_ms", self.max_clock_offset_ms),
            ("max_drift_ppm", self.max_drift_ppm),
        ] {
            if v < 0 {
                return Err(bad(field, format!("must not be negative, got {v}")));
            }
        }
        if let Some(kind) = self.fault_kinds.iter().find(|k| k.episode() != **k) {
            let known: Vec<&str> = episode_kinds().into_iter().map(FaultKind::name).collect();
            return Err(bad(
                "fault_kinds",
                format!(
                    "{kind} ends a {} episode and is drawn with it; name one of {}",
                    kind.episode(),
                    known.join(", ")
                ),
            ));
        }
        Ok(())
    }
}

/// One fault episode: a disruption and, where it has one, its end.
#[derive(Clone, Debug)]
enum Episode {
    Crash {
        server: usize,
        at: f64,
        length: f64,
    },
    Behave {
        server: usize,
        mode: Mode,
        probability: f64,
        at: f64,
        length: f64,
    },
    Partition {
        worker: usize,
        from_cache: bool,
        server: usize,
        at: f64,
        length: f64,
    },
    Latency {
        worker: usize,
        server: usize,
        ms: u64,
        at: f64,
        length: f64,
    },
    ClockStep {
        worker: usize,
        at: f64,
        by_ms: i64,
    },
    Burst {
        at: f64,
        calls: u32,
        tenant: u64,
    },
    CacheDown {
        at: f64,
        length: f64,
    },
}

fn uniform(lo: f64, hi: f64) -> BoxedStrategy<f64> {
    if hi > lo {
        (lo..=hi).prop_map(|x| (x * 1000.0).round() / 1000.0).boxed()
    } else {
        Just(lo).boxed()
    }
}

fn episode(
    kind: FaultKind,
    duration: f64,
    workers: usize,
    servers: usize,
    tenants: u64,
    shared: bool,
) -> BoxedStrategy<Episode> {
    let at = uniform(1.0, (duration * 0.6).max(1.0));
    let length = uniform(1.0, (duration * 0.3).max(1.0));
    match kind {
        FaultKind::Crash | FaultKind::Restart => (0..servers, at, length)
            .prop_map(|(server, at, length)| Episode::Crash { server, at, length })
            .boxed(),
        FaultKind::Behave => (
            0..servers,
            prop::sample::select(Mode::ALL.into_iter().filter(|m| *m != Mode::Normal).collect::<Vec<_>>()),
            uniform(0.1, 1.0),
            at,
            length,
        )
            .prop_map(|(server, mode, probability, at, length)| Episode::Behave {
                server,
                mode,
                probability,
                at,
                length,
            })
            .boxed(),
        FaultKind::Partition | FaultKind::Heal => (0..workers, any::<bool>(), 0..servers, at, length)
            .prop_map(move |(worker, from_cache, server, at, length)| Episode::Partition {
                worker,
                from_cache: from_cache && shared,
                server,
                at,
                length,
            })
            .boxed(),
        FaultKind::Latency => (0..workers, 0..servers, 50u64..3000, at, length)
            .prop_map(|(worker, server, ms, at, length)| Episode::Latency {
                worker,
                server,
                ms,
                at,
                length,
            })
            .boxed(),
        FaultKind::ClockStep => (0..workers, at, -5000i64..5000)
            .prop_map(|(worker, at, by_ms)| Episode::ClockStep { worker, at, by_ms })
            .boxed(),
        FaultKind::Burst => (at, 1u32..10, 1..=tenants)
            .prop_map(|(at, calls, tenant)| Episode::Burst { at, calls, tenant })
            .boxed(),
        FaultKind::CacheDown | FaultKind::CacheUp => (at, length)
            .prop_map(|(at, length)| Episode::CacheDown { at, length })
            .boxed(),
    }
}

#[derive(Clone, Debug)]
struct Shape {
    seed: u64,
    duration: f64,
    workers: usize,
    servers: usize,
    tenants: u64,
    cache: CacheKind,
    time_source: TimeSource,
    kinds: Vec<FaultKind>,
}

/// Whole scenarios within `bounds`.
pub fn scenarios(bounds: &Bounds) -> BoxedStrategy<Scenario> {
    let b = bounds.clone();
    let kinds = b.fault_kinds.clone();
    let shape = (
        any::<u64>(),
        uniform(b.duration_s[0], b.duration_s[1]),
        b.workers[0]..=b.workers[1],
        b.servers[0]..=b.servers[1],
        b.tenants[0]..=b.tenants[1],
        prop::sample::select(b.cache.clone()),
        prop::sample::select(b.time_sources.clone()),
        // Swarm: each case switches every fault kind on or off.
        prop::collection::vec(any::<bool>(), kinds.len()),
    )
        .prop_map(
            move |(seed, duration, workers, servers, tenants, cache, time_source, on)| {
                let kinds = kinds
                    .iter()
                    .zip(on)
                    .filter(|(k, on)| *on && (!k.needs_shared_cache() || cache == CacheKind::Shared))
                    .map(|(k, _)| *k)
                    .collect();
                Shape {
                    seed,
                    duration,
                    workers: workers as usize,
                    servers: servers as usize,
                    tenants: u64::from(tenants),
                    cache,
                    time_source,
                    kinds,
                }
            },
        );
    shape
        .prop_flat_map(move |shape| {
            let b = b.clone();
            let hardening = (
                b.rpm[0]..=b.rpm[1],
                uniform(b.window_s[0], b.window_s[1]),
                b.failure_threshold[0]..=b.failure_threshold[1],
                uniform(b.recovery_timeout_s[0], b.recovery_timeout_s[1]),
                b.half_open_max_calls[0]..=b.half_open_max_calls[1],
                b.max_retries[0]..=b.max_retries[1],
                uniform(b.initial_delay_s[0], b.initial_delay_s[1]),
                uniform(b.jitter[0], b.jitter[1]),
                uniform(b.request_timeout_s[0], b.request_timeout_s[1]),
                prop::sample::select(b.on_cache_unavailable.clone()),
                prop::sample::select(b.on_cache_error.clone()),
            )
                .prop_map(
                    |(
                        rpm,
                        window_s,
                        failure_threshold,
                        recovery,
                        probes,
                        max_retries,
                        initial,
                        jitter,
                        timeout,
                        on_cache_unavailable,
                        on_cache_error,
                    )| {
                        Hardening {
                            rpm,
                            window_s,
                            failure_threshold,
                            recovery_timeout_s: recovery,
                            half_open_max_calls: probes,
                            max_retries,
                            initial_delay_s: initial,
                            max_delay_s: (initial * 8.0).max(initial),
                            jitter,
                            request_timeout_s: timeout,
                            on_cache_unavailable,
                            on_cache_error,
                            ..Hardening::default()
                        }
                    },
                );
            // Drawn only when asked for: `Just` draws nothing, so the default
            // space's cases are unchanged.
            let budgets = if b.budgets {
                (
                    prop::option::of(
                        (uniform(0.0, 1.0), 0u32..=3, 1u32..=10).prop_map(|(ratio, floor, cap)| RetryBudgetSpec {
                            ratio: (ratio * 100.0).round() / 100.0,
                            min_retries_per_sec: floor,
                            max_balance: cap,
                        }),
                    ),
                    prop::option::of(500u64..=20_000),
                )
                    .boxed()
            } else {
                Just((None, None)).boxed()
            };
            let routing = if b.routing {
                prop::sample::select(vec![
                    None,
                    Some(Routing::Ordered),
                    Some(Routing::Weighted),
                    Some(Routing::LeastLoaded),
                ])
                .boxed()
            } else {
                Just(None).boxed()
            };
            let escalation = if b.escalation {
                prop::sample::select(vec![1.0, 2.0, 4.0, 8.0, 16.0])
                    .prop_map(Some)
                    .boxed()
            } else {
                Just(None).boxed()
            };
            let slow = match b.slow_call_ms {
                Some([low, high]) => prop::option::of(low..=high).boxed(),
                None => Just(None).boxed(),
            };
            let hedge = match b.hedge_after_ms {
                Some([low, high]) => prop::option::of((low..=high, 1u32..=redstring::provider::MAX_HEDGES)).boxed(),
                None => Just(None).boxed(),
            };
            let ramp = match b.slow_start_s {
                Some([low, high]) => prop::option::of(low..=high).boxed(),
                None => Just(None).boxed(),
            };
            let classes = match b.deployment_rpm {
                Some([low, high]) => {
                    prop::option::of((low..=high, prop::sample::select(vec![0.1, 0.2, 0.3, 0.5]))).boxed()
                }
                None => Just(None).boxed(),
            };
            let adaptive = match b.adaptive_concurrency {
                Some([low, high]) => prop::option::of(
                    (
                        low..=high,
                        0.0f64..1.0,
                        prop::sample::select(vec![0.5, 0.75, 0.9]),
                        prop::option::of(prop::sample::select(vec![0.25, 0.5])),
                    )
                        .prop_map(|(max, at, backoff, reserve)| {
                            let spec = AdaptiveConcurrencySpec {
                                // In [1, max]: `at` is below 1.
                                initial: 1 + (f64::from(max - 1) * at) as u32,
                                min: 1,
                                max,
                                backoff,
                            };
                            (spec, reserve.filter(|_| max >= 2))
                        }),
                )
                .boxed(),
                None => Just(None).boxed(),
            };
            let hardening = (
                hardening,
                budgets,
                routing,
                escalation,
                slow,
                (hedge, ramp, classes, adaptive),
            )
                .prop_map(
                    |(
                        h,
                        (retry_budget, tokens_per_window),
                        routing,
                        escalation,
                        slow,
                        (hedge, ramp, classes, adaptive),
                    )| {
                        let slow_call_ms = below_timeout(slow, h.request_timeout_s);
                        // A hedge needs another server to go to, and is not
                        // judged beside a slow-call threshold.
                        let hedge = hedge.filter(|_| routing.is_some() && slow_call_ms.is_none());
                        let (adaptive, reserve) = with_reserve(adaptive, classes.map(|(_, share)| share));
                        Hardening {
                            retry_budget,
                            tokens_per_window,
                            routing,
                            max_recovery_timeout_s: escalation
                                .map(|times: f64| (h.recovery_timeout_s * times).min(limits::MAX_SECONDS)),
                            slow_call_ms,
                            hedge_after_ms: below_timeout(hedge.map(|(ms, _)| ms), h.request_timeout_s)
                                .map(HedgeAfterMs::Ms),
                            max_hedges: hedge.map_or(h.max_hedges, |(_, n)| n),
                            slow_start_s: ramp.map(|s| s as f64),
                            deployment_rpm: classes.map(|(rpm, _)| rpm),
                            reserve,
                            adaptive_concurrency: adaptive,
                            ..h
                        }
                    },
                );
            let clocks = prop::collection::vec(
                (
                    -b.max_clock_offset_ms..=b.max_clock_offset_ms,
                    -b.max_drift_ppm..=b.max_drift_ppm,
                ),
                shape.workers,
            );
            let loads = prop::collection::vec(uniform(b.calls_per_min[0], b.calls_per_min[1]), shape.tenants as usize);
            let episodes = if shape.kinds.is_empty() {
                Just(Vec::new()).boxed()
            } else {
                let shared = shape.cache == CacheKind::Shared;
                let (d, w, s, t) = (shape.duration, shape.workers, shape.servers, shape.tenants);
                let one = prop::sample::select(shape.kinds.clone())
                    .prop_flat_map(move |kind| episode(kind, d, w, s, t, shared));
                prop::collection::vec(one, 0..=b.max_faults).boxed()
            };
            (Just(shape), hardening, clocks, loads, episodes, Just(b.tick_ms))
        })
        .prop_map(|(shape, hardening, clocks, loads, episodes, tick_ms)| {
            build(shape, hardening, clocks, loads, episodes, tick_ms)
        })
        .boxed()
}

/// An adaptive limit and a reserve drawn apart, made to fit together: a
/// reserve (the servers' limits' or the limit's own draw) needs a `min` of
/// 2 to leave the low class a call under every share drawn (at most a
/// half), so the limit's `min` and `initial` rise to 2; a limit whose `max`
/// is 1 cannot keep one, and the case keeps no reserve.
fn with_reserve(
    adaptive: Option<(AdaptiveConcurrencySpec, Option<f64>)>,
    servers: Option<f64>,
) -> (Option<AdaptiveConcurrencySpec>, Option<f64>) {
    match adaptive {
        None => (None, servers),
        Some((spec, own)) => match servers.or(own) {
            Some(share) if spec.max >= 2 => (
                Some(AdaptiveConcurrencySpec {
                    min: 2,
                    initial: spec.initial.max(2),
                    ..spec
                }),
                Some(share),
            ),
            _ => (Some(spec), None),
        },
    }
}

/// A drawn slow-call threshold or hedge delay kept below a request timeout
/// of `timeout_s` (no attempt lasts longer): none when no whole
/// millisecond is.
fn below_timeout(ms: Option<u64>, timeout_s: f64) -> Option<u64> {
    // `timeout_s` is finite and at most `MAX_SECONDS`: the cast is exact.
    let below = ((timeout_s * 1000.0).ceil() as u64).saturating_sub(1);
    ms.map(|ms| ms.min(below)).filter(|ms| *ms > 0)
}

fn server_name(i: usize) -> String {
    format!("gpu-{i}")
}

fn worker_name(i: usize) -> String {
    format!("worker-{i}")
}

impl Episode {
    /// The faults that make up this episode: its start and, if it has one,
    /// its end (no later than `duration`).
    fn faults(&self, duration: f64, tenants: u64) -> Vec<Fault> {
        let end = |at: f64, length: f64| (at + length).min(duration);
        match self {
            Episode::Crash { server, at, length } => vec![
                Fault::Crash {
                    at_s: *at,
                    server: server_name(*server),
                },
                Fault::Restart {
                    at_s: end(*at, *length),
                    server: server_name(*server),
                },
            ],
            Episode::Behave {
                server,
                mode,
                probability,
                at,
                length,
            } => {
                let behaviour = Behaviour {
                    mode: *mode,
                    probability: *probability,
                    retry_after_s: 1.0,
                };
                vec![
                    Fault::Behave {
                        at_s: *at,
                        server: server_name(*server),
                        behaviour,
                    },
                    Fault::Behave {
                        at_s: end(*at, *length),
                        server: server_name(*server),
                        behaviour: Behaviour::default(),
                    },
                ]
            }
            Episode::Partition {
                worker,
                from_cache,
                server,
                at,
                length,
            } => {
                let a = worker_name(*worker);
                let b = if *from_cache {
                    CACHE_HOST.to_owned()
                } else {
                    server_name(*server)
                };
                vec![
                    Fault::Partition {
                        at_s: *at,
                        a: a.clone(),
                        b: b.clone(),
                    },
                    Fault::Heal {
                        at_s: end(*at, *length),
                        a,
                        b,
                    },
                ]
            }
            Episode::Latency {
                worker,
                server,
                ms,
                at,
                length,
            } => {
                let (a, b) = (worker_name(*worker), server_name(*server));
                vec![
                    Fault::Latency {
                        at_s: *at,
                        a: a.clone(),
                        b: b.clone(),
                        ms: *ms,
                    },
                    Fault::Latency {
                        at_s: end(*at, *length),
                        a,
                        b,
                        ms: Network::default().max_latency_ms,
                    },
                ]
            }
            Episode::ClockStep { worker, at, by_ms } => vec![Fault::ClockStep {
                at_s: *at,
                host: worker_name(*worker),
                by_ms: *by_ms,
            }],
            Episode::Burst { at, calls, tenant } => vec![Fault::Burst {
                at_s: *at,
                calls: *calls,
                tenant: (*tenant).min(tenants),
            }],
            Episode::CacheDown { at, length } => vec![
                Fault::CacheDown { at_s: *at },
                Fault::CacheUp {
                    at_s: end(*at, *length),
                },
            ],
        }
    }
}

/// The fleet: one worker per clock, each with every tenant, spread over the
/// servers — or, when it routes, listing every server from its own on.
fn fleet(shape: &Shape, clocks: &[(i64, i64)], tenants: &[TenantLoad], routed: bool) -> Vec<WorkerGroup> {
    clocks
        .iter()
        .enumerate()
        .map(|(i, (offset_ms, drift_ppm))| WorkerGroup {
            name: worker_name(i),
            count: 1,
            servers: match routed {
                false => vec![server_name(i % shape.servers)],
                true => (0..shape.servers)
                    .map(|k| server_name((i + k) % shape.servers))
                    .collect(),
            },
            tenants: tenants.to_vec(),
            clock: ClockSpec {
                offset_ms: *offset_ms,
                drift_ppm: *drift_ppm,
            },
        })
        .collect()
}

fn build(
    shape: Shape,
    hardening: Hardening,
    clocks: Vec<(i64, i64)>,
    loads: Vec<f64>,
    episodes: Vec<Episode>,
    tick_ms: u64,
) -> Scenario {
    let servers = (0..shape.servers)
        .map(|i| ServerSpec {
            reload_s: 5.0,
            ..ServerSpec::named(server_name(i))
        })
        .collect();
    let tenants: Vec<TenantLoad> = loads
        .iter()
        .enumerate()
        .map(|(i, calls_per_min)| TenantLoad {
            // Under a reserve every second tenant is of the low class.
            priority: if hardening.reserve.is_some() && i % 2 == 1 {
                redstring::Priority::Low
            } else {
                redstring::Priority::High
            },
            ..TenantLoad::open(i as u64 + 1, *calls_per_min)
        })
        .collect();
    let faults = episodes
        .iter()
        .flat_map(|e| e.faults(shape.duration, tenants.len() as u64))
        .collect();
    let routed = hardening.routing.is_some();
    let mut scenario = Scenario {
        name: "fuzz-case".into(),
        description: "generated by redstring-sim fuzz".into(),
        seed: shape.seed,
        duration_s: shape.duration,
        tick_ms,
        hardening,
        cache: CacheLayout {
            kind: shape.cache,
            time_source: shape.time_source,
            ..CacheLayout::default()
        },
        network: Network::default(),
        servers,
        workers: fleet(&shape, &clocks, &tenants, routed),
        faults,
        expect: Expectations::default(),
        objectives: Default::default(),
    };
    scenario.expect.may_violate = claimed_exceptions(&scenario);
    scenario
}

/// The invariants a configuration cannot claim, and why they may fail: only
/// `liveness`, for a fleet that overloads a healthy server and so never
/// recovers, fault or not (see [`carries_its_load`]). Every other condition
/// that once dropped an invariant — a skewed caller-stamped fleet, clocks
/// stepped back, workers cut off from the shared cache, a cache that goes
/// down or restarts — now bounds it instead ([`crate::judgement::invariants::rpm_bound`],
/// [`crate::judgement::invariants::wait_growth_bound`]), and the claim is
/// checked against the bound.
pub fn claimed_exceptions(s: &Scenario) -> BTreeSet<Invariant> {
    let mut out = BTreeSet::new();
    if !carries_its_load(s) {
        out.insert(Invariant::Liveness);
    }
    out
}

/// Whether every server can serve the load sent to it once the faults are
/// over — what liveness presumes. A fleet that overloads a healthy server
/// (offered load above 80 % of its slots' throughput), or a request timeout
/// shorter than twice the service time, keeps failing with no fault at all;
/// a slow-call threshold shorter than that counts a healthy server's
/// answers slow and keeps opening its circuit, and a hedge delay shorter
/// than that hedges every call, adding up to `max_hedges` requests each.
pub fn carries_its_load(s: &Scenario) -> bool {
    let mut offered = std::collections::BTreeMap::<String, f64>::new();
    for member in s.fleet() {
        let load: f64 = member.tenants.iter().map(|t| t.calls_per_min / 60.0).sum();
        for server in &member.servers {
            *offered.entry(server.clone()).or_default() += load * s.share(&member, server);
        }
    }
    s.servers.iter().all(|server| {
        let load = offered.get(&server.name).copied().unwrap_or(0.0);
        let twice = 2.0 * server.service_time_s();
        load <= 0.8 * server.throughput_with(s.hardening.max_tokens)
            && s.hardening.request_timeout_s >= twice
            && s.hardening.slow_call_ms.is_none_or(|ms| ms as f64 / 1000.0 >= twice)
            && s.hardening
                .hedge_after_ms
                .is_none_or(|after| after.least_ms(s.hardening.hedge_floor_ms) as f64 / 1000.0 >= twice)
    })
}

/// Runs one case: `Ok` when every claimed invariant held, otherwise the
/// failed invariants and the report.
pub fn check_case(scenario: &Scenario) -> Result<(), String> {
    check_case_covered(scenario, &mut Coverage::new())
}

/// [`check_case`], tallying what the run exercised into `coverage`.
pub fn check_case_covered(scenario: &Scenario, coverage: &mut Coverage) -> Result<(), String> {
    scenario
        .validate("fuzz case")
        .map_err(|e| format!("generated an invalid scenario: {e}"))?;
    let run = simulate(scenario, scenario.seed).map_err(|e| format!("simulation failed: {e}"))?;
    coverage.observe(&run.events);
    let failed = run.failed();
    if failed.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = failed.iter().map(|i| i.name()).collect();
    let report = Report::new(scenario, "fuzz case", &run);
    Err(format!(
        "invariants failed: {}\n{}",
        names.join(", "),
        report.render(None)
    ))
}

/// A failing case ready to be written as a scenario file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Regression {
    /// The file's name, a digest of its content.
    pub file_name: String,
    /// The scenario file's text.
    pub toml: String,
}

/// The scenario file a failing case is written as: named after a digest of
/// its content, described as a fuzzer's find.
pub fn regression(scenario: &Scenario) -> Regression {
    let mut s = scenario.clone();
    let body = s.to_toml();
    let mut hash = crate::scenario::Fnv1a::default();
    hash.write(body.as_bytes());
    let digest = hash.0;
    s.name = format!("regression-{digest:016x}");
    s.description = "A minimal failing case found by the fuzzer; replay it with redstring-sim run.".into();
    Regression {
        file_name: format!("{}.toml", s.name),
        toml: s.to_toml(),
    }
}

/// Writes a (minimal) failing case as a scenario file in `dir`, named after a
/// digest of its content ([`regression`]), and returns its path.
pub fn write_regression(dir: &Path, scenario: &Scenario) -> std::io::Result<PathBuf> {
    write(dir, &regression(scenario))
}

/// Writes `case` in `dir` under its own name and returns its path.
pub fn write(dir: &Path, case: &Regression) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(&case.file_name);
    std::fs::write(&path, &case.toml)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use proptest::strategy::ValueTree as _;
    use proptest::test_runner::TestRunner;

    use super::*;

    /// `n` cases drawn from `bounds`, without running them.
    fn draws(bounds: &Bounds, n: usize) -> Vec<Scenario> {
        let strategy = scenarios(bounds);
        let mut runner = TestRunner::deterministic();
        (0..n)
            .map(|_| strategy.new_tree(&mut runner).unwrap().current())
            .collect()
    }

    #[test]
    fn bounds_that_load_draw_only_valid_scenarios_even_at_their_limits() {
        let most = Bounds {
            duration_s: [24.0 * 3600.0; 2],
            tick_ms: 1000,
            workers: [50, 50],
            servers: [8, 8],
            tenants: [8, 8],
            calls_per_min: [1500.0; 2],
            rpm: [u32::MAX; 2],
            window_s: [limits::MAX_SECONDS; 2],
            failure_threshold: [u32::MAX; 2],
            recovery_timeout_s: [limits::MAX_SECONDS; 2],
            half_open_max_calls: [redstring::decide::breaker::MAX_HALF_OPEN_CALLS; 2],
            max_retries: [limits::MAX_RETRIES; 2],
            initial_delay_s: [redstring::retry::MAX_DELAY_LIMIT.as_secs_f64() / 8.0; 2],
            jitter: [1.0; 2],
            request_timeout_s: [limits::MAX_SECONDS; 2],
            max_clock_offset_ms: (limits::MAX_CLOCK_MS / 2) as i64,
            max_drift_ppm: limits::MAX_DRIFT_PPM as i64,
            max_faults: MAX_FAULTS,
            budgets: true,
            routing: true,
            escalation: true,
            slow_call_ms: Some([(limits::MAX_SECONDS * 1000.0) as u64; 2]),
            hedge_after_ms: Some([(limits::MAX_SECONDS * 1000.0) as u64; 2]),
            slow_start_s: Some([86_400; 2]),
            adaptive_concurrency: Some([redstring::decide::concurrency::MAX_LIMIT; 2]),
            deployment_rpm: Some([u32::MAX; 2]),
            ..Bounds::default()
        };
        let least = Bounds {
            duration_s: [1.0; 2],
            tick_ms: 1000,
            workers: [1, 1],
            servers: [1, 1],
            tenants: [1, 1],
            calls_per_min: [0.0; 2],
            rpm: [1, 1],
            window_s: [0.001; 2],
            failure_threshold: [1, 1],
            recovery_timeout_s: [0.001; 2],
            half_open_max_calls: [1, 1],
            max_retries: [0, 0],
            initial_delay_s: [0.001; 2],
            jitter: [0.0; 2],
            request_timeout_s: [0.001; 2],
            max_clock_offset_ms: 0,
            max_drift_ppm: 0,
            max_faults: MAX_FAULTS,
            budgets: true,
            routing: true,
            escalation: true,
            slow_call_ms: Some([1, 1]),
            hedge_after_ms: Some([1, 1]),
            slow_start_s: Some([1, 1]),
            adaptive_concurrency: Some([1, 1]),
            deployment_rpm: Some([2, 2]),
            ..Bounds::default()
        };
        for (name, bounds) in [("most", most), ("least", least), ("default", Bounds::default())] {
            bounds.validate(name).unwrap();
            for s in draws(&bounds, 24) {
                s.validate(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        }
    }

    #[test]
    fn adaptive_limits_drawn_with_a_reserve_leave_the_low_class_a_call() {
        for deployment_rpm in [None, Some([2, 30])] {
            let bounds = Bounds {
                adaptive_concurrency: Some([1, 8]),
                deployment_rpm,
                ..Bounds::default()
            };
            let (mut reserved, mut unreserved) = (0, 0);
            for s in draws(&bounds, 64) {
                s.validate("adaptive").unwrap_or_else(|e| panic!("{e}"));
                let Some(spec) = s.hardening.adaptive_concurrency else {
                    continue;
                };
                match s.hardening.reserve {
                    Some(_) => {
                        reserved += 1;
                        assert!(spec.min >= 2 && spec.initial >= 2, "{spec:?}");
                        let low = s.workers[0]
                            .tenants
                            .iter()
                            .any(|t| t.priority == redstring::Priority::Low);
                        assert_eq!(low, s.workers[0].tenants.len() > 1, "every second tenant is low");
                    }
                    None => unreserved += 1,
                }
            }
            assert!(
                reserved > 0 && unreserved > 0,
                "{deployment_rpm:?}: {reserved} with a reserve, {unreserved} without"
            );
        }
    }

    #[test]
    fn bounds_whose_fleets_would_call_too_often_are_refused_naming_the_rate() {
        let bounds = Bounds {
            workers: [1, 50],
            tenants: [1, 8],
            calls_per_min: [1.0, 1501.0],
            ..Bounds::default()
        };
        match bounds.validate("b.toml") {
            Err(ScenarioError::Invalid { field, message, .. }) => {
                assert_eq!(field, "calls_per_min");
                assert!(message.contains("600000"), "{message}");
            }
            other => panic!("expected the rate refused, got {other:?}"),
        }
    }
}
