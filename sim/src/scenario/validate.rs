//! Everything serde cannot check about a scenario: positive numbers, known
//! names, sane ranges — one function per section, each error naming the
//! field (and, through [`locate`], its line).

use std::collections::BTreeSet;

use super::{Behaviour, CACHE_HOST, CacheKind, Fault, Scenario, ScenarioError};

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
}

impl Scenario {
    /// Checks everything serde cannot: positive numbers, known names, sane ranges.
    pub fn validate(&self, file: &str) -> Result<(), ScenarioError> {
        let errors = Errors { file };
        self.validate_run(&errors)?;
        self.validate_hardening(&errors)?;
        let mut hosts = self.validate_servers(&errors)?;
        let workers = self.validate_workers(&errors, &mut hosts)?;
        hosts.insert(CACHE_HOST.into());
        self.validate_faults(&errors, &hosts, &workers)
    }

    fn validate_run(&self, e: &Errors) -> Result<(), ScenarioError> {
        if self.name.trim().is_empty() {
            return Err(e.bad("name", "must not be empty".into()));
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
        if self.network.min_latency_ms > self.network.max_latency_ms {
            return Err(e.bad("network.min_latency_ms", "must not exceed max_latency_ms".into()));
        }
        Ok(())
    }

    fn validate_hardening(&self, e: &Errors) -> Result<(), ScenarioError> {
        let h = &self.hardening;
        for (field, v) in [
            ("hardening.rpm", f64::from(h.rpm)),
            ("hardening.window_s", h.window_s),
            ("hardening.failure_threshold", f64::from(h.failure_threshold)),
            ("hardening.recovery_timeout_s", h.recovery_timeout_s),
            ("hardening.half_open_max_calls", f64::from(h.half_open_max_calls)),
            ("hardening.initial_delay_s", h.initial_delay_s),
            ("hardening.max_delay_s", h.max_delay_s),
            ("hardening.request_timeout_s", h.request_timeout_s),
            ("hardening.max_tokens", f64::from(h.max_tokens)),
        ] {
            e.positive(field, v)?;
        }
        if let Some(d) = h.deadline_s {
            e.positive("hardening.deadline_s", d)?;
        }
        if !(h.multiplier.is_finite() && h.multiplier >= 1.0) {
            return Err(e.bad(
                "hardening.multiplier",
                format!("must be at least 1.0, got {}", h.multiplier),
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
        Ok(())
    }

    /// Checks the servers; returns their host names.
    fn validate_servers(&self, e: &Errors) -> Result<BTreeSet<String>, ScenarioError> {
        if self.servers.is_empty() {
            return Err(e.bad("servers", "at least one server is needed".into()));
        }
        let mut hosts = BTreeSet::new();
        for (i, s) in self.servers.iter().enumerate() {
            let at = |f: &str| format!("servers[{i}].{f}");
            if !valid_host(&s.name) || !hosts.insert(s.name.clone()) {
                return Err(e.bad(&at("name"), format!("must be a unique host name, got {:?}", s.name)));
            }
            if s.slots == 0 {
                return Err(e.bad(&at("slots"), "must be positive, got 0".into()));
            }
            e.positive(&at("prefill_tokens_per_s"), s.prefill_tokens_per_s)?;
            e.positive(&at("decode_tokens_per_s"), s.decode_tokens_per_s)?;
            if !(s.reload_s.is_finite() && s.reload_s >= 0.0) {
                return Err(e.bad(&at("reload_s"), format!("must not be negative, got {}", s.reload_s)));
            }
            check_behaviour(&s.behaviour).map_err(|m| e.bad(&at("behaviour"), m))?;
            crate::hosts::server::kinds::validate(s).map_err(|(f, m)| e.bad(&at(&f), m))?;
        }
        Ok(hosts)
    }

    /// Checks the worker groups and the fleet they expand to; adds the
    /// workers' host names to `hosts` and returns them.
    fn validate_workers(&self, e: &Errors, hosts: &mut BTreeSet<String>) -> Result<BTreeSet<String>, ScenarioError> {
        if self.workers.is_empty() {
            return Err(e.bad("workers", "at least one worker is needed".into()));
        }
        for (i, w) in self.workers.iter().enumerate() {
            let at = |f: &str| format!("workers[{i}].{f}");
            if w.count == 0 || w.count > 500 {
                return Err(e.bad(&at("count"), format!("must be between 1 and 500, got {}", w.count)));
            }
            if w.servers.is_empty() {
                return Err(e.bad(&at("servers"), "must name at least one server".into()));
            }
            if let Some(s) = w.servers.iter().find(|s| self.server(s).is_none()) {
                return Err(e.bad(&at("servers"), format!("no server named {s:?}")));
            }
            for (j, t) in w.tenants.iter().enumerate() {
                if !(t.calls_per_min.is_finite() && t.calls_per_min >= 0.0) {
                    return Err(e.bad(
                        &format!("workers[{i}].tenants[{j}].calls_per_min"),
                        format!("must not be negative, got {}", t.calls_per_min),
                    ));
                }
            }
        }
        let mut workers = BTreeSet::new();
        for member in self.fleet() {
            let w = member.name;
            if !valid_host(&w) || !hosts.insert(w.clone()) {
                return Err(e.bad("workers", format!("host name {w:?} is invalid or used twice")));
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
                    check_behaviour(behaviour).map_err(|m| e.bad(&at("behaviour"), m))?;
                }
                Fault::Partition { a, b, .. } | Fault::Heal { a, b, .. } | Fault::Latency { a, b, .. } => {
                    if let Some(h) = [a, b].into_iter().find(|h| !hosts.contains(*h)) {
                        return Err(e.bad(&at("a/b"), format!("no host named {h:?}")));
                    }
                }
                Fault::ClockStep { host, .. } => {
                    if host != CACHE_HOST && !workers.contains(host) {
                        return Err(e.bad(&at("host"), format!("no worker or cache named {host:?}")));
                    }
                }
                Fault::Burst { .. } | Fault::CacheDown { .. } | Fault::CacheUp { .. } => {}
            }
        }
        Ok(())
    }
}

/// The 1-based line where the dotted `field` (`servers[1].slots`,
/// `hardening.rpm`) is written in `text`, or the line of its nearest written
/// parent (its table header, or the inline table holding it).
pub(super) fn locate(text: &str, field: &str) -> Option<usize> {
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
    for (n, segment) in segments.iter().enumerate() {
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
                (from..lines.len()).find(|&i| lines[i] == header)
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

fn check_behaviour(b: &Behaviour) -> Result<(), String> {
    if !(0.0..=1.0).contains(&b.probability) {
        return Err(format!("probability must be between 0 and 1, got {}", b.probability));
    }
    if !(b.retry_after_s.is_finite() && b.retry_after_s >= 0.0) {
        return Err(format!("retry_after_s must not be negative, got {}", b.retry_after_s));
    }
    Ok(())
}

fn valid_host(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && name != CACHE_HOST
}
