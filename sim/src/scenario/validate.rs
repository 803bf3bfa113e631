//! Everything serde cannot check about a scenario: positive numbers, known
//! names, sane ranges — one function per section, each error naming the
//! field (and, through [`locate`], its line).
//!
//! The ranges are in [`limits`](super::limits): each bounds a number that
//! would otherwise make a run panic, overflow, or grow without bound.

use std::collections::{BTreeMap, BTreeSet};

use super::limits::{
    MAX_BURST_CALLS, MAX_BURST_CALLS_PER_WORKER, MAX_CALLS_PER_MIN, MAX_CLIENTS, MAX_CLOCK_MS, MAX_DRIFT_PPM,
    MAX_FAULTS, MAX_FLEET, MAX_FLEET_CALLS_PER_MIN, MAX_FLEET_CLIENTS, MAX_LATENCY_MS, MAX_LIMITER_WAITS, MAX_RETRIES,
    MAX_SECONDS, MAX_SERVERS, MAX_SERVICE_TIME_S, MAX_TENANTS, MAX_TOKENS_PER_S, MAX_TRACE_TOKENS, MIN_SECONDS,
    MIN_TOKENS_PER_S,
};
use super::settings::HedgeAfterMs;
use super::{Behaviour, CACHE_HOST, CacheKind, Fault, Scenario, ScenarioError};

/// The longest scenario name: it heads every report.
const MAX_NAME_CHARS: usize = 200;

/// The largest `objectives.amplification_max`: a call the limiter
/// admitted sends at most its first attempt and [`MAX_RETRIES`] retries.
const MAX_AMPLIFICATION: f64 = (MAX_RETRIES + 1) as f64;

/// Builds the errors of one file.
struct Errors<'f> {
    file: &'f str,
}

impl Errors<'_> {
    fn bad(&self, field: &str, message: String) -> ScenarioError {
        ScenarioError::Invalid {
            file: self.file.to_owned(),
            line: None,
            field: field.to_owned(),
            message,
        }
    }

    fn positive(&self, field: &str, v: f64) -> Result<(), ScenarioError> {
        if v.is_finite() && v > 0.0 {
            Ok(())
        } else {
            Err(self.bad(field, format!("must be positive, got {v}")))
        }
    }

    /// A span of time in seconds: positive, at least [`MIN_SECONDS`] (so it
    /// does not round to nothing) and at most [`MAX_SECONDS`].
    fn seconds(&self, field: &str, v: f64) -> Result<(), ScenarioError> {
        self.positive(field, v)?;
        self.within(field, v, MIN_SECONDS, MAX_SECONDS, " s")
    }

    fn within(&self, field: &str, v: f64, min: f64, max: f64, unit: &str) -> Result<(), ScenarioError> {
        if v.is_finite() && (min..=max).contains(&v) {
            Ok(())
        } else {
            Err(self.bad(
                field,
                format!("must be between {min}{unit} and {max}{unit}, got {v}{unit}"),
            ))
        }
    }

    fn at_most(&self, field: &str, v: u64, max: u64, what: &str) -> Result<(), ScenarioError> {
        if v <= max {
            Ok(())
        } else {
            Err(self.bad(field, format!("must be at most {max} ({what}), got {v}")))
        }
    }
}

impl Scenario {
    /// Checks everything serde cannot: positive numbers, known names, sane ranges.
    pub fn validate(&self, file: &str) -> Result<(), ScenarioError> {
        let errors = Errors { file };
        self.validate_run(&errors)?;
        self.validate_hardening(&errors)?;
        let mut hosts = self.validate_servers(&errors)?;
        self.validate_with_core(&errors)?;
        let workers = self.validate_workers(&errors, &mut hosts)?;
        // The cache is a host only when it is shared: in a per-worker layout
        // there is no `cache` on the network to cut or slow down.
        if self.cache.kind == CacheKind::Shared {
            hosts.insert(CACHE_HOST.into());
        }
        self.validate_faults(&errors, &hosts, &workers)?;
        self.validate_objectives(&errors)
    }

    /// Objectives: finite, non-negative, within what a run can measure.
    fn validate_objectives(&self, e: &Errors) -> Result<(), ScenarioError> {
        let o = &self.objectives;
        let field = |name: &str| format!("objectives.{name}");
        let checks = [
            ("goodput_recovery_s", o.goodput_recovery_s, MAX_SECONDS, " s"),
            ("failed_fraction_max", o.failed_fraction_max, 1.0, ""),
            ("high_failed_fraction_max", o.high_failed_fraction_max, 1.0, ""),
            ("p99_latency_s", o.p99_latency_s, MAX_SECONDS, " s"),
            ("amplification_max", o.amplification_max, MAX_AMPLIFICATION, "×"),
        ];
        for (name, value, max, unit) in checks {
            if let Some(v) = value {
                e.within(&field(name), v, 0.0, max, unit)?;
            }
        }
        Ok(())
    }

    fn validate_run(&self, e: &Errors) -> Result<(), ScenarioError> {
        if self.name.trim().is_empty() {
            return Err(e.bad("name", "must not be empty".into()));
        }
        // Printed at the head of every report: a control character (an
        // ANSI escape, a newline) would forge report lines, a bidirectional
        // control reorder them.
        if crate::terminal::has_unsafe(&self.name) || self.name.chars().count() > MAX_NAME_CHARS {
            return Err(e.bad(
                "name",
                format!("must be at most {MAX_NAME_CHARS} characters with no control characters (escapes, newlines) or bidirectional controls (U+202A–U+202E, U+2066–U+2069, U+200E, U+200F, U+061C), got {:?}", self.name.chars().take(40).collect::<String>()),
            ));
        }
        e.positive("duration_s", self.duration_s)?;
        if self.duration_s > 24.0 * 3600.0 {
            return Err(e.bad(
                "duration_s",
                format!("must be at most one day, got {}", self.duration_s),
            ));
        }
        if self.tick_ms == 0 || self.tick_ms > 1000 {
            return Err(e.bad("tick_ms", format!("must be between 1 and 1000, got {}", self.tick_ms)));
        }
        // tick_ms is at most 1000, so this is exact.
        let tick_s = self.tick_ms as f64 / 1000.0;
        if self.duration_s < tick_s {
            return Err(e.bad(
                "duration_s",
                format!("must be at least one tick ({tick_s} s), got {}", self.duration_s),
            ));
        }
        e.at_most(
            "network.max_latency_ms",
            self.network.max_latency_ms,
            MAX_LATENCY_MS,
            "one minute",
        )?;
        if self.network.min_latency_ms > self.network.max_latency_ms {
            return Err(e.bad("network.min_latency_ms", "must not exceed max_latency_ms".into()));
        }
        if let Some(ms) = self.cache.timeout_ms {
            if ms == 0 {
                return Err(e.bad("cache.timeout_ms", "must be positive, got 0".into()));
            }
            e.at_most("cache.timeout_ms", ms, MAX_LATENCY_MS, "one minute")?;
        }
        check_clock(e, "cache.clock", &self.cache.clock)?;
        Ok(())
    }

    /// `hardening.hedge_after_ms` and the settings beside it, as the
    /// provider's `hedge` refuses them, and what the simulator can judge.
    fn validate_hedging(&self, e: &Errors, after: HedgeAfterMs) -> Result<(), ScenarioError> {
        let h = &self.hardening;
        let (field, ms) = match after {
            HedgeAfterMs::Ms(ms) => ("hardening.hedge_after_ms", ms),
            HedgeAfterMs::P95 => ("hardening.hedge_floor_ms", h.hedge_floor_ms),
        };
        if ms == 0 {
            return Err(e.bad(field, "must be positive, got 0".into()));
        }
        // Every attempt ends by the request timeout and the deadline: a
        // hedge no sooner could never be sent.
        let slowest = h.deadline_s.map_or(h.request_timeout_s, |d| d.min(h.request_timeout_s));
        if ms as f64 >= slowest * 1000.0 {
            return Err(e.bad(
                field,
                format!("must be below request_timeout_s and deadline_s ({slowest} s), got {ms} ms"),
            ));
        }
        if !(1..=redstring::provider::MAX_HEDGES).contains(&h.max_hedges) {
            return Err(e.bad(
                "hardening.max_hedges",
                format!(
                    "must be between 1 and {}, got {}",
                    redstring::provider::MAX_HEDGES,
                    h.max_hedges
                ),
            ));
        }
        let windows = redstring::provider::MIN_HEDGE_WINDOW..=redstring::provider::MAX_HEDGE_WINDOW;
        if after == HedgeAfterMs::P95 && !windows.contains(&h.hedge_window) {
            return Err(e.bad(
                "hardening.hedge_window",
                format!(
                    "must be between {} and {}, got {}",
                    windows.start(),
                    windows.end(),
                    h.hedge_window
                ),
            ));
        }
        if h.routing.is_none() {
            return Err(e.bad(
                "hardening.hedge_after_ms",
                "needs hardening.routing: a hedge goes to another server of the worker's group".into(),
            ));
        }
        if h.slow_call_ms.is_some() {
            // The slow-call judgement reads one answering request per call.
            return Err(e.bad(
                "hardening.hedge_after_ms",
                "cannot be judged beside slow_call_ms: set one of them".into(),
            ));
        }
        Ok(())
    }

    fn validate_hardening(&self, e: &Errors) -> Result<(), ScenarioError> {
        let h = &self.hardening;
        for (field, v) in [
            ("hardening.rpm", f64::from(h.rpm)),
            ("hardening.failure_threshold", f64::from(h.failure_threshold)),
            ("hardening.half_open_max_calls", f64::from(h.half_open_max_calls)),
            ("hardening.max_tokens", f64::from(h.max_tokens)),
        ] {
            e.positive(field, v)?;
        }
        e.at_most(
            "hardening.max_tokens",
            u64::from(h.max_tokens),
            MAX_TRACE_TOKENS,
            "output tokens per request",
        )?;
        for (field, v) in [
            ("hardening.window_s", h.window_s),
            ("hardening.recovery_timeout_s", h.recovery_timeout_s),
            ("hardening.initial_delay_s", h.initial_delay_s),
            ("hardening.max_delay_s", h.max_delay_s),
            ("hardening.request_timeout_s", h.request_timeout_s),
        ] {
            e.seconds(field, v)?;
        }
        if let Some(d) = h.deadline_s {
            e.seconds("hardening.deadline_s", d)?;
        }
        if let Some(lease) = h.probe_lease_s {
            e.seconds("hardening.probe_lease_s", lease)?;
        }
        if let Some(max) = h.max_recovery_timeout_s {
            e.seconds("hardening.max_recovery_timeout_s", max)?;
        }
        if let Some(ramp) = h.slow_start_s {
            e.seconds("hardening.slow_start_s", ramp)?;
        }
        if let Some(ms) = h.slow_call_ms {
            if ms == 0 {
                return Err(e.bad("hardening.slow_call_ms", "must be positive, got 0".into()));
            }
            // Every attempt ends by the request timeout and the deadline: a
            // threshold at either could never be exceeded.
            let slowest = h.deadline_s.map_or(h.request_timeout_s, |d| d.min(h.request_timeout_s));
            if ms as f64 >= slowest * 1000.0 {
                return Err(e.bad(
                    "hardening.slow_call_ms",
                    format!("must be below request_timeout_s and deadline_s ({slowest} s), got {ms} ms"),
                ));
            }
        }
        if let Some(after) = h.hedge_after_ms {
            self.validate_hedging(e, after)?;
        }
        e.at_most(
            "hardening.max_retries",
            u64::from(h.max_retries),
            u64::from(MAX_RETRIES),
            "retries after the first attempt",
        )?;
        e.at_most(
            "hardening.limiter_waits",
            u64::from(h.limiter_waits),
            u64::from(MAX_LIMITER_WAITS),
            "refusals waited out per call",
        )?;
        if !(h.multiplier.is_finite() && (1.0..=1000.0).contains(&h.multiplier)) {
            return Err(e.bad(
                "hardening.multiplier",
                format!("must be between 1.0 and 1000.0, got {}", h.multiplier),
            ));
        }
        if !(0.0..=1.0).contains(&h.jitter) {
            return Err(e.bad(
                "hardening.jitter",
                format!("must be between 0.0 and 1.0, got {}", h.jitter),
            ));
        }
        if h.max_delay_s < h.initial_delay_s {
            return Err(e.bad("hardening.max_delay_s", "must be at least initial_delay_s".into()));
        }
        if let Some(tokens) = h.tokens_per_window {
            e.positive("hardening.tokens_per_window", tokens as f64)?;
            e.at_most(
                "hardening.tokens_per_window",
                tokens,
                redstring::limiter::MAX_TOKENS_PER_WINDOW,
                "tokens per window",
            )?;
        }
        if let Some(b) = h.retry_budget {
            // The core's own validation, reported by the field's dotted name.
            let built = redstring::RetryBudget::builder()
                .ratio(b.ratio)
                .min_retries_per_sec(b.min_retries_per_sec)
                .max_balance(b.max_balance)
                .build();
            if let Err(bad) = built {
                return Err(e.bad(
                    match bad.field {
                        "ratio" => "hardening.retry_budget.ratio",
                        "min_retries_per_sec" => "hardening.retry_budget.min_retries_per_sec",
                        _ => "hardening.retry_budget.max_balance",
                    },
                    format!("must be {}, got {}", bad.expected, bad.value),
                ));
            }
        }
        Ok(())
    }

    /// Builds what each worker builds from these settings — its limiter,
    /// breaker, retry policy and each server's adapter — with the core's own
    /// builders, so that a value the core refuses (`half_open_max_calls`
    /// over 1 000, a backoff over a day, an empty `model`) is refused here
    /// by its field, not by a run that fails at 0 s.
    fn validate_with_core(&self, e: &Errors) -> Result<(), ScenarioError> {
        let h = &self.hardening;
        let refused = |field: String, bad: redstring::ConfigError| {
            e.bad(&field, format!("must be {}, got {}", bad.expected, bad.value))
        };
        let hardening = |core: &str| {
            let ours = match core {
                "window_seconds" => "window_s",
                "recovery_timeout" => "recovery_timeout_s",
                "max_recovery_timeout" => "max_recovery_timeout_s",
                "probe_lease" => "probe_lease_s",
                "initial_delay" => "initial_delay_s",
                "max_delay" => "max_delay_s",
                "timeout" => "request_timeout_s",
                "slow_start_window" => "slow_start_s",
                "adaptive_concurrency.reserve" => "reserve",
                other => other,
            };
            format!("hardening.{ours}")
        };
        // A manual clock: checking never calibrates the production one.
        let env = redstring::Env::default().with_clock(std::sync::Arc::new(redstring::ManualClock::at_fixed_epoch()));
        let mut limiter = redstring::RateLimiter::builder(h.rpm)
            .window(seconds(h.window_s))
            .env(env.clone());
        if let Some(tokens) = h.tokens_per_window {
            limiter = limiter.tokens_per_window(tokens);
        }
        limiter.build().map_err(|bad| refused(hardening(bad.field), bad))?;
        if let Some(rpm) = h.deployment_rpm {
            let mut limit = redstring::RateLimiter::builder(rpm)
                .window(seconds(h.window_s))
                .env(env.clone());
            if let Some(share) = h.reserve {
                limit = limit.reserve(share);
            }
            limit.build().map_err(|bad| {
                let field = match bad.field {
                    "rpm" => "hardening.deployment_rpm".to_owned(),
                    other => hardening(other),
                };
                refused(field, bad)
            })?;
        } else if h.reserve.is_some() && h.adaptive_concurrency.is_none() {
            return Err(e.bad(
                "hardening.reserve",
                "keeps a share of each server's own limits: set hardening.deployment_rpm or hardening.adaptive_concurrency too".into(),
            ));
        }
        // A tenant has one class: its calls are judged and counted by it.
        let mut classes = std::collections::BTreeMap::new();
        for t in self.workers.iter().flat_map(|g| &g.tenants) {
            if let Some(other) = classes.insert(t.id, t.priority)
                && other != t.priority
            {
                return Err(e.bad(
                    "workers.tenants.priority",
                    format!(
                        "must be one class per tenant, got tenant {} as {} in one group and {} in another",
                        t.id,
                        other.as_str(),
                        t.priority.as_str()
                    ),
                ));
            }
        }
        let mut breaker = redstring::CircuitBreaker::builder()
            .failure_threshold(h.failure_threshold)
            .recovery_timeout(seconds(h.recovery_timeout_s))
            .half_open_max_calls(h.half_open_max_calls)
            .env(env.clone());
        if let Some(lease) = h.probe_lease_s {
            breaker = breaker.probe_lease(seconds(lease));
        }
        if let Some(max) = h.max_recovery_timeout_s {
            breaker = breaker.max_recovery_timeout(seconds(max));
        }
        breaker.build().map_err(|bad| refused(hardening(bad.field), bad))?;
        if let Some(ramp) = h.slow_start_s {
            redstring::provider::SlowStart::new(seconds(ramp)).map_err(|bad| refused(hardening(bad.field), bad))?;
        }
        if let Some(adaptive) = &h.adaptive_concurrency {
            adaptive
                .settings(h.concurrency_lease(), h.reserve)
                .map_err(|bad| refused(hardening(bad.field), bad))?;
        }
        h.retry_policy().map_err(|bad| refused(hardening(bad.field), bad))?;
        for (i, s) in self.servers.iter().enumerate() {
            redstring::provider::OpenAiCompatible::builder(format!("http://{}:8080/v1", s.name), s.model.clone())
                .timeout(seconds(h.request_timeout_s))
                .max_tokens(h.max_tokens)
                .env(env.clone())
                .build_with(NoTransport)
                .map_err(|bad| match bad.field {
                    "model" => refused(format!("servers[{i}].model"), bad),
                    "base_url" => refused(format!("servers[{i}].name"), bad),
                    other => refused(hardening(other), bad),
                })?;
        }
        Ok(())
    }

    /// Checks the servers; returns their host names.
    fn validate_servers(&self, e: &Errors) -> Result<BTreeSet<String>, ScenarioError> {
        if self.servers.is_empty() {
            return Err(e.bad("servers", "at least one server is needed".into()));
        }
        e.at_most("servers", self.servers.len() as u64, MAX_SERVERS, "servers")?;
        let mut hosts = BTreeSet::new();
        for (i, s) in self.servers.iter().enumerate() {
            let at = |f: &str| format!("servers[{i}].{f}");
            if !valid_host(&s.name) || !hosts.insert(s.name.clone()) {
                return Err(e.bad(&at("name"), format!("must be a unique host name, got {:?}", s.name)));
            }
            if s.slots == 0 {
                return Err(e.bad(&at("slots"), "must be positive, got 0".into()));
            }
            for (field, v) in [
                ("prefill_tokens_per_s", s.prefill_tokens_per_s),
                ("decode_tokens_per_s", s.decode_tokens_per_s),
            ] {
                e.positive(&at(field), v)?;
                e.within(&at(field), v, MIN_TOKENS_PER_S, MAX_TOKENS_PER_S, " tokens/s")?;
            }
            for (field, v) in [("prompt_tokens", s.prompt_tokens), ("output_tokens", s.output_tokens)] {
                e.at_most(&at(field), u64::from(v), MAX_TRACE_TOKENS, "tokens per request")?;
            }
            // The kind's own fields first: the service time below is
            // computed from them (a `time_scale` of NaN is that field's
            // error, not the token counts').
            crate::scenario::kinds::validate(s).map_err(|(f, m)| e.bad(&at(&f), m))?;
            if let Some(group) = &s.quota_group {
                if group.is_empty() {
                    return Err(e.bad(&at("quota_group"), "must be a non-empty name".into()));
                }
                let Some(quota) = s.quota else {
                    return Err(e.bad(
                        &at("quota_group"),
                        "needs a hosted server's `quota` (kind = \"openai\"): a group shares an account's quota".into(),
                    ));
                };
                let first = self.servers[..i].iter().find(|o| o.quota_group.as_ref() == Some(group));
                if let Some(first) = first
                    && first.quota.and_then(|q| q.credit_tokens) != quota.credit_tokens
                {
                    return Err(e.bad(
                        &at("quota.credit_tokens"),
                        format!(
                            "must equal {:?} of {:?}, the first server of quota group {group:?}: the group's keys spend one account's credit",
                            first.quota.and_then(|q| q.credit_tokens),
                            first.name
                        ),
                    ));
                }
            }
            let service = s.service_time_s();
            if !(service.is_finite() && service <= MAX_SERVICE_TIME_S) {
                return Err(e.bad(
                    &at(slow_field(s)),
                    format!(
                        "one request would hold a slot for {service} s (prompt_tokens / prefill_tokens_per_s + output_tokens / decode_tokens_per_s); at most {MAX_SERVICE_TIME_S} s"
                    ),
                ));
            }
            if !(s.reload_s.is_finite() && s.reload_s >= 0.0) {
                return Err(e.bad(&at("reload_s"), format!("must not be negative, got {}", s.reload_s)));
            }
            e.within(&at("reload_s"), s.reload_s, 0.0, MAX_SECONDS, " s")?;
            check_behaviour(&s.behaviour).map_err(|(f, m)| e.bad(&at(&format!("behaviour.{f}")), m))?;
        }
        Ok(hosts)
    }

    /// Checks the worker groups and the fleet they expand to; adds the
    /// workers' host names to `hosts` and returns them.
    fn validate_workers(&self, e: &Errors, hosts: &mut BTreeSet<String>) -> Result<BTreeSet<String>, ScenarioError> {
        if self.workers.is_empty() {
            return Err(e.bad("workers", "at least one worker is needed".into()));
        }
        let mut fleet: u64 = 0;
        let mut fleet_calls_per_min = 0.0;
        let mut fleet_clients: u64 = 0;
        for (i, w) in self.workers.iter().enumerate() {
            let at = |f: &str| format!("workers[{i}].{f}");
            if w.count == 0 || u64::from(w.count) > MAX_FLEET {
                return Err(e.bad(
                    &at("count"),
                    format!("must be between 1 and {MAX_FLEET}, got {}", w.count),
                ));
            }
            fleet = fleet.saturating_add(u64::from(w.count));
            if fleet > MAX_FLEET {
                return Err(e.bad(
                    &at("count"),
                    format!("the fleet would have {fleet} workers or more; at most {MAX_FLEET} in all groups together"),
                ));
            }
            e.at_most(
                &at("tenants"),
                w.tenants.len() as u64,
                MAX_TENANTS,
                "tenants per worker",
            )?;
            check_clock(e, &at("clock"), &w.clock)?;
            if w.servers.is_empty() {
                return Err(e.bad(&at("servers"), "must name at least one server".into()));
            }
            if let Some(s) = w.servers.iter().find(|s| self.server(s).is_none()) {
                return Err(e.bad(&at("servers"), format!("no server named {s:?}")));
            }
            if let Some(routing) = self.hardening.routing {
                // Each listed server is a deployment with its own breaker.
                e.at_most(
                    &at("servers"),
                    w.servers.len() as u64,
                    redstring::decide::pick::MAX_DEPLOYMENTS as u64,
                    "servers a routed worker calls",
                )?;
                if let Some((k, s)) = w.servers.iter().enumerate().find(|(k, s)| w.servers[..*k].contains(s)) {
                    return Err(e.bad(
                        &format!("workers[{i}].servers[{k}]"),
                        format!(
                            "{s:?} is listed twice; under hardening.routing = {:?} each server is one deployment",
                            routing.name()
                        ),
                    ));
                }
            }
            for (j, t) in w.tenants.iter().enumerate() {
                let field = format!("workers[{i}].tenants[{j}].calls_per_min");
                if !(t.calls_per_min.is_finite() && t.calls_per_min >= 0.0) {
                    return Err(e.bad(&field, format!("must not be negative, got {}", t.calls_per_min)));
                }
                e.within(&field, t.calls_per_min, 0.0, MAX_CALLS_PER_MIN, " calls/min")?;
                for (name, dist) in [("prompt_tokens", t.prompt_tokens), ("output_tokens", t.output_tokens)] {
                    if let Some(d) = dist {
                        let field = format!("workers[{i}].tenants[{j}].{name}");
                        d.check().map_err(|m| e.bad(&field, m))?;
                        if d.mean() > MAX_TRACE_TOKENS as f64 {
                            return Err(e.bad(
                                &field,
                                format!(
                                    "must have a mean of at most {MAX_TRACE_TOKENS} tokens per request, got {}",
                                    d.mean()
                                ),
                            ));
                        }
                    }
                }
                if t.clients > 0 {
                    let think = format!("workers[{i}].tenants[{j}].think_s");
                    e.within(&think, t.think_s, MIN_SECONDS, MAX_SECONDS, " s")?;
                    e.at_most(
                        &format!("workers[{i}].tenants[{j}].clients"),
                        u64::from(t.clients),
                        MAX_CLIENTS,
                        "closed-loop clients per tenant",
                    )?;
                    // Each client starts at most one call per think time.
                    let peak = t.peak_calls_per_min();
                    if peak > MAX_CALLS_PER_MIN {
                        return Err(e.bad(
                            &think,
                            format!(
                                "{} clients thinking {} s could start {peak:.0} calls a minute; at most {MAX_CALLS_PER_MIN} per tenant",
                                t.clients, t.think_s
                            ),
                        ));
                    }
                }
                fleet_clients = fleet_clients.saturating_add(u64::from(t.clients).saturating_mul(u64::from(w.count)));
                if fleet_clients > MAX_FLEET_CLIENTS {
                    return Err(e.bad(
                        &format!("workers[{i}].tenants[{j}].clients"),
                        format!(
                            "the whole fleet would run {fleet_clients} closed-loop clients or more; at most {MAX_FLEET_CLIENTS} in all"
                        ),
                    ));
                }
                fleet_calls_per_min += t.peak_calls_per_min() * f64::from(w.count);
                if fleet_calls_per_min > MAX_FLEET_CALLS_PER_MIN {
                    return Err(e.bad(
                        &field,
                        format!(
                            "the whole fleet's tenants would call {fleet_calls_per_min} times a minute or more; at most {MAX_FLEET_CALLS_PER_MIN}"
                        ),
                    ));
                }
            }
        }
        let mut workers = BTreeSet::new();
        // The fleet lists each group's workers in turn: the group of each.
        let groups = self
            .workers
            .iter()
            .enumerate()
            .flat_map(|(i, w)| std::iter::repeat_n(i, w.count as usize));
        for (member, i) in self.fleet().into_iter().zip(groups) {
            let w = member.name;
            if !valid_host(&w) || !hosts.insert(w.clone()) {
                return Err(e.bad(
                    &format!("workers[{i}].name"),
                    format!("host name {w:?} is invalid or used twice"),
                ));
            }
            workers.insert(w);
        }
        Ok(workers)
    }

    fn validate_faults(
        &self,
        e: &Errors,
        hosts: &BTreeSet<String>,
        workers: &BTreeSet<String>,
    ) -> Result<(), ScenarioError> {
        e.at_most("faults", self.faults.len() as u64, MAX_FAULTS, "faults")?;
        let fleet = self.fleet();
        // Each host's clock offset plus every step it is given, in ms.
        let mut clock_ms: BTreeMap<String, u64> = fleet
            .iter()
            .map(|m| (m.name.clone(), m.clock.offset_ms.unsigned_abs()))
            .collect();
        clock_ms.insert(CACHE_HOST.into(), self.cache.clock.offset_ms.unsigned_abs());
        for (i, f) in self.faults.iter().enumerate() {
            let at = |field: &str| format!("faults[{i}].{field}");
            let t = f.at_s();
            if !(t.is_finite() && t >= 0.0 && t <= self.duration_s) {
                return Err(e.bad(
                    &at("at_s"),
                    format!("must be within the run (0..={}), got {t}", self.duration_s),
                ));
            }
            if f.kind().needs_shared_cache() && self.cache.kind != CacheKind::Shared {
                return Err(e.bad(&at("kind"), "cache faults need cache.kind = \"shared\"".into()));
            }
            let known_server = |server: &str| match self.server(server) {
                Some(_) => Ok(()),
                None => Err(e.bad(&at("server"), format!("no server named {server:?}"))),
            };
            match f {
                Fault::Crash { server, .. } | Fault::Restart { server, .. } => known_server(server)?,
                Fault::Behave { server, behaviour, .. } => {
                    known_server(server)?;
                    check_behaviour(behaviour).map_err(|(f, m)| e.bad(&at(&format!("behaviour.{f}")), m))?;
                }
                Fault::Partition { a, b, .. } | Fault::Heal { a, b, .. } | Fault::Latency { a, b, .. } => {
                    for (side, h) in [("a", a), ("b", b)] {
                        if !hosts.contains(h) {
                            return Err(e.bad(&at(side), self.unknown_host(h, hosts)));
                        }
                    }
                    if let Fault::Latency { ms, .. } = f {
                        e.at_most(&at("ms"), *ms, MAX_LATENCY_MS, "one minute")?;
                    }
                }
                Fault::ClockStep { host, by_ms, .. } => {
                    if host != CACHE_HOST && !workers.contains(host) {
                        return Err(e.bad(&at("host"), format!("no worker or cache named {host:?}")));
                    }
                    if host == CACHE_HOST && !hosts.contains(host) {
                        return Err(e.bad(&at("host"), self.unknown_host(host, hosts)));
                    }
                    let total = clock_ms.entry(host.clone()).or_insert(0);
                    *total = total.saturating_add(by_ms.unsigned_abs());
                    if *total > MAX_CLOCK_MS {
                        return Err(e.bad(
                            &at("by_ms"),
                            format!(
                                "{host}'s clock offset and steps would add up to {total} ms; at most {MAX_CLOCK_MS} ms (one year) either way"
                            ),
                        ));
                    }
                }
                Fault::Burst { calls, tenant, .. } => {
                    e.at_most(
                        &at("calls"),
                        u64::from(*calls),
                        u64::from(MAX_BURST_CALLS_PER_WORKER),
                        "calls per worker",
                    )?;
                    let workers = fleet
                        .iter()
                        .filter(|m| m.tenants.iter().any(|t| t.id == *tenant))
                        .count() as u64;
                    let total = u64::from(*calls).saturating_mul(workers);
                    if total > MAX_BURST_CALLS {
                        return Err(e.bad(
                            &at("calls"),
                            format!(
                                "{calls} calls on each of the {workers} workers with tenant {tenant} are {total} calls at once; at most {MAX_BURST_CALLS}"
                            ),
                        ));
                    }
                }
                Fault::CacheDown { .. } | Fault::CacheUp { .. } => {}
            }
        }
        Ok(())
    }

    /// Why `name` is not a host a link fault can name, and which names are.
    fn unknown_host(&self, name: &str, hosts: &BTreeSet<String>) -> String {
        if let Some(group) = self.workers.iter().find(|w| w.name == name && w.count > 1) {
            let last = group.count - 1;
            return format!(
                "{name:?} is a group of {} workers, not a host; name one of them: {name}-0 … {name}-{last}",
                group.count
            );
        }
        if name == CACHE_HOST {
            return "there is no cache host: the cache is per worker (set cache.kind = \"shared\" for one the fleet shares)"
                .into();
        }
        let mut known: Vec<&str> = hosts.iter().map(String::as_str).take(12).collect();
        if hosts.len() > known.len() {
            known.push("…");
        }
        format!("no host named {name:?}; hosts are: {}", known.join(", "))
    }
}

/// The 1-based line where the dotted `field` (`servers[1].slots`,
/// `hardening.rpm`) is written in `text`, or the line of its nearest written
/// parent (its table header, or the inline table holding it).
pub(crate) fn locate(text: &str, field: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let is_header = |l: &str| l.starts_with('[');
    let key_line = |from: usize, key: &str| {
        (from..lines.len())
            .take_while(|&i| i == from || !is_header(lines[i]))
            .find(|&i| {
                lines[i]
                    .strip_prefix(key)
                    .is_some_and(|rest| rest.trim_start().starts_with('='))
            })
    };
    let mut at: Option<usize> = None;
    let segments: Vec<&str> = field.split('.').collect();
    // Segments already matched by a dotted table header (`[cache.clock]`).
    let mut skip = 0;
    for (n, segment) in segments.iter().enumerate() {
        if skip > 0 {
            skip -= 1;
            continue;
        }
        let (name, index) = match segment.split_once('[') {
            Some((name, rest)) => (name, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (*segment, None),
        };
        let from = at.map_or(0, |i| i + 1);
        let last = n + 1 == segments.len();
        let found = match index {
            Some(k) if !last => {
                let header = format!("[[{name}]]");
                (from..lines.len()).filter(|&i| lines[i] == header).nth(k)
            }
            _ if !last => {
                let header = format!("[{name}]");
                (from..lines.len()).find(|&i| lines[i] == header).or_else(|| {
                    // A dotted header naming this table and the ones below it.
                    let tables = &segments[n..segments.len() - 1];
                    let dotted = format!("[{}]", tables.join("."));
                    let found = (tables.len() > 1 && !dotted[1..].contains('['))
                        .then(|| (from..lines.len()).find(|&i| lines[i] == dotted))
                        .flatten();
                    if found.is_some() {
                        skip = tables.len() - 1;
                    }
                    found
                })
            }
            _ => None,
        };
        match found {
            Some(i) => at = Some(i),
            // The segment is a key (the last one, or an inline table): its line.
            None => return key_line(from.min(lines.len()), name).or(at).map(|i| i + 1),
        }
    }
    at.map(|i| i + 1)
}

/// The field that makes a server's request take too long: a batching
/// kind's `time_scale` when it slows every step, or its measured `step_ms`,
/// else the larger of the
/// prefill and decode terms' token counts.
fn slow_field(s: &super::ServerSpec) -> &'static str {
    if s.kind.batches() && s.time_scale.is_some_and(|t| t > 1.0) {
        return "time_scale";
    }
    if s.kind.batches() && s.step_ms.is_some() {
        return "step_ms";
    }
    let (prompt, output) = s.mean_tokens();
    let prefill = prompt as f64 / s.prefill_tokens_per_s;
    let decode = output as f64 / s.decode_tokens_per_s;
    match (prefill > decode, s.kind.batches()) {
        (true, true) if s.prompt_tokens_dist.is_some() => "prompt_tokens_dist",
        (false, true) if s.output_tokens_dist.is_some() => "output_tokens_dist",
        (true, _) => "prompt_tokens",
        (false, _) => "output_tokens",
    }
}

/// A behaviour's numbers in range; an error names its field (`probability`,
/// `retry_after_s`) and what is wrong.
fn check_behaviour(b: &Behaviour) -> Result<(), (&'static str, String)> {
    if !(0.0..=1.0).contains(&b.probability) {
        return Err((
            "probability",
            format!("probability must be between 0 and 1, got {}", b.probability),
        ));
    }
    if !(b.retry_after_s.is_finite() && b.retry_after_s >= 0.0) {
        return Err((
            "retry_after_s",
            format!("retry_after_s must not be negative, got {}", b.retry_after_s),
        ));
    }
    if b.retry_after_s > MAX_SECONDS {
        return Err((
            "retry_after_s",
            format!("retry_after_s must be at most {MAX_SECONDS} s, got {}", b.retry_after_s),
        ));
    }
    Ok(())
}

/// A clock's offset and drift within [`MAX_CLOCK_MS`] and [`MAX_DRIFT_PPM`].
fn check_clock(e: &Errors, field: &str, clock: &super::ClockSpec) -> Result<(), ScenarioError> {
    e.at_most(
        &format!("{field}.offset_ms"),
        clock.offset_ms.unsigned_abs(),
        MAX_CLOCK_MS,
        "one year either way",
    )?;
    e.at_most(
        &format!("{field}.drift_ppm"),
        clock.drift_ppm.unsigned_abs(),
        MAX_DRIFT_PPM,
        "10 % either way",
    )
}

fn valid_host(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && name != CACHE_HOST
}

/// Seconds as the workers pass them to the core: a value past what a
/// `Duration` holds is the largest one, for the core to refuse.
fn seconds(s: f64) -> std::time::Duration {
    std::time::Duration::try_from_secs_f64(s).unwrap_or(std::time::Duration::MAX)
}

/// The transport of an adapter built only to be checked: it sends nothing.
struct NoTransport;

impl redstring::provider::HttpTransport for NoTransport {
    fn post(
        &self,
        _: redstring::provider::HttpRequest,
    ) -> redstring::provider::BoxFuture<
        '_,
        Result<redstring::provider::HttpResponse, redstring::provider::TransportError>,
    > {
        Box::pin(std::future::pending())
    }
}
