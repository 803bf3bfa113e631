//! Sanity before the run: what a valid scenario most likely got wrong, and
//! the load it puts on each server.
//!
//! Validation ([`Scenario::validate`]) rejects what cannot run. Some files
//! run but do not model what their author meant — a burst for a tenant no
//! worker has fires nothing; a restart of a server that never crashed only
//! reloads it; a `collapse_at` the queue never lets load reach never
//! collapses. [`warnings`] lists those, each naming the field and (when the
//! file's text is at hand) its line; `run`, `check` and `sweep` print them
//! before running and `--strict` refuses to run with any.
//!
//! [`loads`] is the up-front load figure: each server's offered load — the
//! calls per second its workers' tenants send it, as their limiters let them
//! through (requests and, when set, tokens per window) — against the calls
//! per second it can serve at the token mix its tenants send, each request
//! asking for `hardening.max_tokens`
//! ([`ServerSpec::throughput_at`](super::ServerSpec::throughput_at)), with the
//! most it takes while a server it backs up is down, and the bursts beside
//! it as the seconds of capacity they take. A steady load above
//! [`LOAD_WARNING`] of capacity is a warning too: queues grow and the outage
//! under test is hidden behind plain overload. (A burst above capacity is
//! what a burst scenario is for, so it is shown, not warned about.)

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::{CacheKind, Fault, FaultKind, Mode, Scenario, ScenarioError, fault, validate};

/// The fraction of a server's capacity above which its steady offered load
/// is a warning.
pub const LOAD_WARNING: f64 = 0.8;

/// A seconds field at or above this many seconds most likely holds
/// milliseconds.
pub const IMPLAUSIBLE_SECONDS: f64 = 1000.0;

/// One thing a scenario most likely got wrong: the field, its line, and what
/// is odd about it.
#[derive(Clone, Debug, PartialEq)]
pub struct Warning {
    /// The dotted path of the field (`faults[2].tenant`, `servers[0].collapse_at`).
    pub field: String,
    /// The line it is written on, when the file's text was given.
    pub line: Option<usize>,
    /// What is odd.
    pub odd: Oddity,
}

/// What a [`Warning`] found.
#[derive(Clone, Debug, PartialEq)]
pub enum Oddity {
    /// A server's steady offered load is above [`LOAD_WARNING`] of its capacity.
    Overloaded(ServerLoad),
    /// A burst for a tenant no worker has: it fires no calls.
    BurstForUnknownTenant {
        /// The burst's tenant.
        tenant: u64,
        /// The tenants the fleet has.
        known: Vec<u64>,
    },
    /// A restart of a server that is not down at that moment (no earlier
    /// crash, or already restarted): a restart only starts a crashed
    /// server, so it does nothing.
    RestartWithoutCrash {
        /// The server.
        server: String,
    },
    /// A worker group with `tenants = []`: its workers make no calls.
    NoTenants {
        /// The group's name.
        group: String,
    },
    /// A seconds field so large it is most likely milliseconds.
    SecondsLookLikeMilliseconds {
        /// Its value, in seconds as written.
        value: f64,
    },
    /// A field the behaviour's mode ignores (`retry_after_s` is only sent
    /// with `mode = "rate_limit"`).
    IgnoredByMode {
        /// The mode.
        mode: Mode,
    },
    /// `collapse_at` above `slots + queue`: the queue answers 503 before
    /// in-flight requests ever reach it, so the server never collapses.
    CollapseUnreachable {
        /// `collapse_at`.
        collapse_at: u32,
        /// `slots + queue`, the most requests a server holds.
        most_in_flight: u64,
    },
    /// A fault at the very end of the run, when arrivals have stopped: it
    /// changes nothing the invariants see.
    FaultAtEnd {
        /// The fault's kind.
        kind: FaultKind,
    },
    /// A setting under which no call (to a server, or at all) can succeed,
    /// whatever the faults do: the run would only measure the setting.
    NoCallCanSucceed {
        /// Why, in words.
        why: String,
    },
    /// A tenant id listed twice in one worker group: its workers run both
    /// loads as one tenant, under one limiter and one token budget.
    DuplicateTenant {
        /// The group's name.
        group: String,
        /// The tenant id.
        tenant: u64,
    },
    /// A burst of `calls = 0`: it fires nothing.
    EmptyBurst,
    /// A `partition`, `heal` or `latency` of a host with itself: there is
    /// no link between a host and itself, so it does nothing.
    LinkToItself {
        /// The fault's kind.
        kind: FaultKind,
        /// The host.
        host: String,
    },
    /// A `heal` of a link no earlier `partition` cut (or one already
    /// healed): it does nothing.
    HealWithoutPartition {
        /// One end of the link.
        a: String,
        /// The other.
        b: String,
    },
    /// A tenant that starts no call in the run: no clients, no request of
    /// its replay inside the run, no burst, and open-loop arrivals expected
    /// fewer than once over the run on all of its group's workers.
    NoCalls {
        /// The tenant id.
        tenant: u64,
        /// Its open-loop calls expected over the run, all workers together.
        expected: f64,
    },
    /// A setting the cache layout ignores: a per-worker cache is in the
    /// worker's own process, never unreachable and never waited for.
    IgnoredByCache,
    /// A server setting its kind ignores.
    IgnoredByKind {
        /// The server's kind.
        kind: super::ServerKind,
        /// What the kind uses instead, in words.
        instead: &'static str,
    },
    /// `think_s` on a tenant without `clients`: only closed-loop clients
    /// think.
    ThinkWithoutClients,
    /// A value the server kind raises to its minimum, as the real server
    /// does, so the run uses another value than the one written.
    RaisedTo {
        /// The value written.
        value: f64,
        /// What the server uses.
        to: f64,
    },
    /// A `cache_up` while the shared cache is up (no earlier `cache_down`
    /// still in effect): it restarts the cache at once, losing its state,
    /// with no outage before it.
    CacheUpWhileUp,
}

impl fmt::Display for Oddity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Oddity::Overloaded(load) => write!(
                f,
                "{} is offered {:.0} % of its capacity ({:.2} of {:.2} calls/s), above {:.0} %: queues grow, or a quota refuses the excess, whatever the faults do",
                load.server,
                load.utilisation() * 100.0,
                load.offered_per_s,
                load.capacity_per_s,
                LOAD_WARNING * 100.0
            ),
            Oddity::BurstForUnknownTenant { tenant, known } => write!(
                f,
                "a burst for tenant {tenant}, which no worker has, fires no calls; the fleet's tenants are {}",
                list(known)
            ),
            Oddity::RestartWithoutCrash { server } => write!(
                f,
                "restarts {server:?}, which has not crashed before it (no earlier `crash` still in effect): a restart only starts a crashed server, so this one does nothing"
            ),
            Oddity::NoTenants { group } => {
                write!(
                    f,
                    "worker group {group:?} has `tenants = []`: its workers make no calls"
                )
            }
            Oddity::SecondsLookLikeMilliseconds { value } => write!(
                f,
                "{value} s is {:.1} hours — is it milliseconds ({} s)?",
                value / 3600.0,
                value / 1000.0
            ),
            Oddity::IgnoredByMode { mode } => write!(
                f,
                "only `mode = \"rate_limit\"` sends a Retry-After; mode {:?} ignores it",
                mode_name(*mode)
            ),
            Oddity::CollapseUnreachable {
                collapse_at,
                most_in_flight,
            } => write!(
                f,
                "{collapse_at} is above slots + queue = {most_in_flight}: the queue answers 503 first, so the server never collapses"
            ),
            Oddity::FaultAtEnd { kind } => write!(
                f,
                "a {kind} at the end of the run, when arrivals have stopped, changes nothing the invariants see"
            ),
            Oddity::NoCallCanSucceed { why } => write!(f, "{why}"),
            Oddity::DuplicateTenant { group, tenant } => write!(
                f,
                "tenant {tenant} is listed twice in worker group {group:?}: its workers run both loads as one tenant, under one limiter; add the rates into one entry or give each its own id"
            ),
            Oddity::EmptyBurst => write!(f, "a burst of 0 calls fires nothing"),
            Oddity::LinkToItself { kind, host } => write!(
                f,
                "a {kind} between {host:?} and itself does nothing: a fault acts on the link between two different hosts"
            ),
            Oddity::HealWithoutPartition { a, b } => write!(
                f,
                "heals {a:?}–{b:?}, which no earlier `partition` still in effect cut: a heal only repairs a partitioned link, so this one does nothing"
            ),
            Oddity::NoCalls { tenant, expected } => write!(
                f,
                "tenant {tenant} starts no call in the run: no clients, no replayed request inside it, no burst, and {expected:.2} open-loop calls expected over the whole run"
            ),
            Oddity::IgnoredByCache => write!(
                f,
                "applies to a shared cache only (cache.kind = \"shared\"): a per-worker cache is in the worker's own process, never unreachable, so this setting has no effect"
            ),
            Oddity::IgnoredByKind { kind, instead } => write!(
                f,
                "kind {:?} ignores it; {instead}",
                serde_json::to_value(kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_else(|| format!("{kind:?}"))
            ),
            Oddity::ThinkWithoutClients => write!(
                f,
                "only closed-loop clients think between calls, and this tenant has none (set `clients`), so think_s has no effect"
            ),
            Oddity::RaisedTo { value, to } => write!(
                f,
                "{value} s is below the {to} s llama-swap allows, and it raises it to {to} s, as the run does; write {to} or more"
            ),
            Oddity::CacheUpWhileUp => write!(
                f,
                "the shared cache is up here (no earlier `cache_down` still in effect): `cache_up` restarts it at once, losing every limiter count and breaker state, with no outage before it; put a `cache_down` before it for an outage"
            ),
        }
    }
}

/// The settings under which no call can succeed, each with its field: a
/// deadline below a server's unloaded service time, a token budget below
/// the least a call reserves (`max_tokens`), a llama.cpp context or a vLLM
/// KV cache no mean prompt fits, a server that collapses at its first
/// request in flight.
fn hopeless(s: &Scenario) -> Vec<(String, String)> {
    let h = &s.hardening;
    let mut out = Vec::new();
    if let Some(budget) = h.tokens_per_window.filter(|b| *b < u64::from(h.max_tokens)) {
        out.push((
            "hardening.tokens_per_window".to_owned(),
            format!(
                "{budget} tokens per window is below max_tokens = {}, the least a call reserves: no call is ever admitted",
                h.max_tokens
            ),
        ));
    }
    for (i, spec) in s.servers.iter().enumerate() {
        let name = &spec.name;
        if let Some(deadline) = h.deadline_s {
            let service = spec.service_time_s();
            if deadline < service {
                out.push((
                    "hardening.deadline_s".to_owned(),
                    format!("deadline_s {deadline} is below {name}'s service time of {service:.3} s: no call to it can succeed"),
                ));
            }
        }
        if spec.collapse_at.is_some_and(|c| c <= 1) {
            out.push((
                format!("servers[{i}].collapse_at"),
                format!("{name} collapses as soon as one request is in flight: no call to it can succeed"),
            ));
        }
        let (prompt, _) = spec.mean_tokens();
        match spec.kind {
            crate::scenario::ServerKind::LlamaCpp
            | crate::scenario::ServerKind::LlamaSwap
            | crate::scenario::ServerKind::Ollama => {
                if let Some(context) = spec.context_tokens.filter(|c| *c <= prompt) {
                    out.push((
                        format!("servers[{i}].context_tokens"),
                        format!("{name}'s context of {context} tokens does not hold the mean prompt of {prompt}: most requests are refused (400 exceed_context_size_error)"),
                    ));
                }
            }
            crate::scenario::ServerKind::Vllm => {
                if let Some(kv) = spec.kv_tokens.filter(|kv| *kv <= prompt) {
                    out.push((
                        format!("servers[{i}].kv_tokens"),
                        format!("{name}'s KV cache of {kv} tokens does not hold the mean prompt of {prompt}: most requests never run"),
                    ));
                }
            }
            crate::scenario::ServerKind::Generic | crate::scenario::ServerKind::OpenAi => {}
        }
    }
    out
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(line) = self.line {
            write!(f, "line {line}: ")?;
        }
        write!(f, "field `{}`: {}", self.field, self.odd)
    }
}

impl Warning {
    /// The warning as the error `--strict` makes of it, for `file`.
    pub fn into_error(self, file: &str) -> ScenarioError {
        ScenarioError::Invalid {
            file: file.to_owned(),
            line: self.line,
            message: self.odd.to_string(),
            field: self.field,
        }
    }
}

fn list<T: fmt::Display>(items: &[T]) -> String {
    if items.is_empty() {
        return "none".into();
    }
    items.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

fn mode_name(mode: Mode) -> String {
    serde_json::to_value(mode)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{mode:?}"))
}

/// One server's offered load against its capacity, before the run.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerLoad {
    /// The server.
    pub server: String,
    /// Calls per second its workers' tenants send, before their limiters.
    pub arriving_per_s: f64,
    /// Calls per second that reach it steadily while every server is up:
    /// the arrivals as the limiters admit them ([`admitted_per_s`]).
    pub offered_per_s: f64,
    /// The most it is offered while another server it backs up is down
    /// (routing sends that server's calls on); `None` when it backs up
    /// no server.
    pub failover: Option<Failover>,
    /// Calls all bursts fire at it in the run.
    pub burst_calls: u64,
    /// Calls per second it serves at its tenants' token mix
    /// ([`ServerSpec::throughput_at`](super::ServerSpec::throughput_at)).
    pub capacity_per_s: f64,
}

/// The load a server takes while another is down.
#[derive(Clone, Debug, PartialEq)]
pub struct Failover {
    /// The server that is down.
    pub down: String,
    /// Calls per second the backing server is then offered.
    pub offered_per_s: f64,
}

impl ServerLoad {
    /// Offered load as a fraction of capacity (0 for a server without a
    /// finite positive capacity figure to compare against).
    pub fn utilisation(&self) -> f64 {
        self.of_capacity(self.offered_per_s)
    }

    /// `per_s` as a fraction of capacity (0 without a finite positive
    /// capacity).
    fn of_capacity(&self, per_s: f64) -> f64 {
        if self.capacity_per_s.is_finite() && self.capacity_per_s > 0.0 {
            per_s / self.capacity_per_s
        } else {
            0.0
        }
    }
}

impl fmt::Display for ServerLoad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: offered {:.2} calls/s ({:.2} arriving before the limiter",
            self.server, self.offered_per_s, self.arriving_per_s
        )?;
        write!(
            f,
            ") against a capacity of {:.2} calls/s: {:.0} %",
            self.capacity_per_s,
            self.utilisation() * 100.0
        )?;
        if let Some(over) = &self.failover {
            write!(
                f,
                "; while {} is down {:.2} calls/s, {:.0} %",
                over.down,
                over.offered_per_s,
                self.of_capacity(over.offered_per_s) * 100.0
            )?;
        }
        if self.burst_calls > 0 {
            write!(
                f,
                "; bursts add {} calls, {:.1} s of its capacity",
                self.burst_calls,
                self.burst_calls as f64 / self.capacity_per_s
            )?;
        }
        Ok(())
    }
}

/// The tokens one call of tenant `t` on `member` charges its tenant's token
/// budget once settled: its mean prompt plus its mean output capped at
/// `max_tokens` (the tenant's own distributions, or its primary server's
/// counts).
fn settled_tokens(scenario: &Scenario, member: &super::FleetMember, t: &super::TenantLoad) -> f64 {
    let (own_prompt, own_output) = scenario.server(&member.server).map_or((0, 0), |s| s.mean_tokens());
    let mean = |d: Option<super::Spread>, own: u64| d.map_or(own as f64, |d| d.mean());
    let output = mean(t.output_tokens, own_output).min(f64::from(scenario.hardening.max_tokens));
    mean(t.prompt_tokens, own_prompt) + output
}

/// Calls per second each tenant of each fleet member gets past its limiter,
/// steadily, in fleet then tenant order: its arrivals, capped by the
/// tenant's allowance — `rpm` per `window_s`, and with `tokens_per_window`
/// also the calls whose settled tokens (`settled_tokens`) fit it — per
/// worker with per-worker caches; fleet-wide with a shared one, each
/// worker getting the share its arrivals are of the tenant's total.
pub fn admitted_per_s(scenario: &Scenario, fleet: &[super::FleetMember]) -> Vec<Vec<f64>> {
    let h = &scenario.hardening;
    let calls_allowed = f64::from(h.rpm) / h.window_s;
    let tokens_allowed = h.tokens_per_window.map(|t| t as f64 / h.window_s);
    let rate = |t: &super::TenantLoad| t.most_calls_per_min(scenario.duration_s) / 60.0;
    // The fraction of `calls` (and `tokens`) per second an allowance lets through.
    let fraction = |calls: f64, tokens: f64| {
        let by_calls = if calls > calls_allowed {
            calls_allowed / calls
        } else {
            1.0
        };
        let by_tokens = match tokens_allowed {
            Some(allowed) if tokens > allowed => allowed / tokens,
            _ => 1.0,
        };
        by_calls.min(by_tokens)
    };
    // Totals per tenant for a shared cache, summed once (fleets may be large).
    let mut totals: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for m in fleet {
        for t in &m.tenants {
            let total = totals.entry(t.id).or_default();
            total.0 += rate(t);
            total.1 += rate(t) * settled_tokens(scenario, m, t);
        }
    }
    fleet
        .iter()
        .map(|m| {
            m.tenants
                .iter()
                .map(|t| {
                    let r = rate(t);
                    r * match scenario.cache.kind {
                        CacheKind::PerWorker => fraction(r, r * settled_tokens(scenario, m, t)),
                        CacheKind::Shared => {
                            let (calls, tokens) = totals.get(&t.id).copied().unwrap_or_default();
                            fraction(calls, tokens)
                        }
                    }
                })
                .collect()
        })
        .collect()
}

/// Each server's offered load against its capacity, in `scenario.servers` order.
pub fn loads(scenario: &Scenario) -> Vec<ServerLoad> {
    let fleet = scenario.fleet();
    let h = &scenario.hardening;
    let admitted = admitted_per_s(scenario, &fleet);
    let rate = |t: &super::TenantLoad| t.most_calls_per_min(scenario.duration_s) / 60.0;
    let mut burst_per_tenant: BTreeMap<u64, u64> = BTreeMap::new();
    for b in scenario.bursts() {
        let calls = burst_per_tenant.entry(b.tenant).or_default();
        *calls = calls.saturating_add(u64::from(b.calls));
    }
    // The calls per second each server is offered while `down` (or none) is
    // down: a member offers only the servers it routes over.
    let offered_with = |down: Option<&str>| -> BTreeMap<&str, f64> {
        let mut out = BTreeMap::new();
        for (m, tenants) in fleet.iter().zip(&admitted) {
            let member: f64 = tenants.iter().sum();
            for name in &m.servers {
                let share = scenario.share_while_down(m, name, down);
                *out.entry(name.as_str()).or_default() += member * share;
            }
        }
        out
    };
    let healthy = offered_with(None);
    // Without routing no call moves when a server is down.
    let while_down: Vec<(&str, BTreeMap<&str, f64>)> = match scenario.hardening.routing {
        None => Vec::new(),
        Some(_) => scenario
            .servers
            .iter()
            .map(|down| (down.name.as_str(), offered_with(Some(&down.name))))
            .collect(),
    };
    scenario
        .servers
        .iter()
        .map(|spec| {
            let mut arriving = 0.0;
            let mut burst_calls: u64 = 0;
            // The token mix the server sees: each tenant's means (its own
            // distributions, or the server's counts), weighted by its calls.
            let (own_prompt, own_output) = spec.mean_tokens();
            let (mut prompt_sum, mut output_sum) = (0.0, 0.0);
            for m in &fleet {
                let share = scenario.share(m, &spec.name);
                if share == 0.0 {
                    continue;
                }
                let mut tenants = BTreeSet::new();
                for t in &m.tenants {
                    let rate = rate(t);
                    arriving += rate * share;
                    let mean = |d: Option<super::Spread>, own: u64| d.map_or(own as f64, |d| d.mean());
                    prompt_sum += rate * share * mean(t.prompt_tokens, own_prompt);
                    output_sum += rate * share * mean(t.output_tokens, own_output);
                    tenants.insert(t.id);
                }
                for id in tenants {
                    burst_calls = burst_calls.saturating_add(burst_per_tenant.get(&id).copied().unwrap_or(0));
                }
            }
            let (prompt, output) = if arriving > 0.0 {
                (
                    (prompt_sum / arriving).round() as u64,
                    (output_sum / arriving).round() as u64,
                )
            } else {
                (own_prompt, own_output)
            };
            let offered = healthy.get(spec.name.as_str()).copied().unwrap_or(0.0);
            // The other server whose outage sends this one the most, when
            // any sends it more than it has while all are up.
            let failover = while_down
                .iter()
                .filter(|(down, _)| *down != spec.name)
                .map(|(down, loads)| (*down, loads.get(spec.name.as_str()).copied().unwrap_or(0.0)))
                .filter(|(_, load)| *load > offered + 1e-9)
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(down, load)| Failover {
                    down: down.to_owned(),
                    offered_per_s: load,
                });
            ServerLoad {
                server: spec.name.clone(),
                arriving_per_s: arriving,
                offered_per_s: offered,
                failover,
                burst_calls,
                capacity_per_s: spec.throughput_at(prompt, output, h.max_tokens),
            }
        })
        .collect()
}

/// Everything odd about `scenario` (which must have passed validation), in
/// file order within each kind of oddity; `text`, the file it was parsed
/// from, gives each warning its line and tells which fields are written
/// rather than defaulted.
pub fn warnings(scenario: &Scenario, text: Option<&str>) -> Vec<Warning> {
    let mut out = Vec::new();
    let mut warn = |field: String, odd: Oddity| {
        out.push(Warning {
            line: text.and_then(|t| validate::locate(t, &field)),
            field,
            odd,
        });
    };
    let written: Option<toml::Table> = text.and_then(|t| toml::from_str(t).ok());

    for (i, load) in loads(scenario).into_iter().enumerate() {
        if load.utilisation() > LOAD_WARNING {
            warn(format!("servers[{i}].name"), Oddity::Overloaded(load));
        }
    }
    for (i, s) in scenario.servers.iter().enumerate() {
        let most = u64::from(s.slots) + u64::from(s.queue);
        if let Some(c) = s.collapse_at.filter(|c| u64::from(*c) > most) {
            warn(
                format!("servers[{i}].collapse_at"),
                Oddity::CollapseUnreachable {
                    collapse_at: c,
                    most_in_flight: most,
                },
            );
        }
        let path = format!("servers[{i}].behaviour");
        if ignores_retry_after(
            s.behaviour.mode,
            s.behaviour.retry_after_s,
            written_at(&written, "servers", i),
        ) {
            warn(
                format!("{path}.retry_after_s"),
                Oddity::IgnoredByMode { mode: s.behaviour.mode },
            );
        }
    }
    for (field, why) in hopeless(scenario) {
        warn(field, Oddity::NoCallCanSucceed { why });
    }
    // Tenants some burst fires calls for.
    let burst_tenants: BTreeSet<u64> = scenario
        .faults
        .iter()
        .filter_map(|f| match f {
            Fault::Burst { tenant, calls, .. } if *calls > 0 => Some(*tenant),
            _ => None,
        })
        .collect();
    for (i, w) in scenario.workers.iter().enumerate() {
        if w.tenants.is_empty() {
            warn(
                format!("workers[{i}].tenants"),
                Oddity::NoTenants { group: w.name.clone() },
            );
        }
        let written_tenants = written_at(&written, "workers", i)
            .and_then(|g| g.get("tenants"))
            .and_then(toml::Value::as_array);
        for (j, t) in w.tenants.iter().enumerate() {
            let at = |f: &str| format!("workers[{i}].tenants[{j}].{f}");
            if w.tenants[..j].iter().any(|u| u.id == t.id) {
                warn(
                    at("id"),
                    Oddity::DuplicateTenant {
                        group: w.name.clone(),
                        tenant: t.id,
                    },
                );
            }
            let expected = t.calls_per_min * f64::from(w.count) * scenario.duration_s / 60.0;
            let replays = t.replay.as_ref().is_some_and(|r| !r.requests.is_empty());
            if t.clients == 0 && !replays && expected < 1.0 && !burst_tenants.contains(&t.id) {
                let field = if t.replay.is_some() && t.calls_per_min == 0.0 {
                    "replay"
                } else {
                    "calls_per_min"
                };
                warn(at(field), Oddity::NoCalls { tenant: t.id, expected });
            }
            let think_written = match written_tenants {
                Some(list) => list.get(j).and_then(|t| t.get("think_s")).is_some(),
                None => t.think_s != super::TenantLoad::open(t.id, 0.0).think_s,
            };
            if t.clients == 0 && think_written {
                warn(at("think_s"), Oddity::ThinkWithoutClients);
            }
        }
    }
    if scenario.cache.kind == CacheKind::PerWorker {
        let hardening = written.as_ref().and_then(|w| w.get("hardening"));
        let defaults = super::Hardening::default();
        let h = &scenario.hardening;
        for (key, differs) in [
            (
                "on_cache_unavailable",
                h.on_cache_unavailable != defaults.on_cache_unavailable,
            ),
            ("on_cache_error", h.on_cache_error != defaults.on_cache_error),
        ] {
            let set = match &written {
                Some(_) => hardening.and_then(|t| t.get(key)).is_some(),
                None => differs,
            };
            if set {
                warn(format!("hardening.{key}"), Oddity::IgnoredByCache);
            }
        }
        if scenario.cache.timeout_ms.is_some() {
            warn("cache.timeout_ms".into(), Oddity::IgnoredByCache);
        }
    }
    for (i, spec) in scenario.servers.iter().enumerate() {
        let table = written_at(&written, "servers", i);
        let set = |key: &str, differs: bool| match table {
            Some(t) => t.get(key).is_some(),
            None if written.is_some() => false,
            None => differs,
        };
        let defaults = super::ServerSpec::named("");
        if spec.kind.batches() && set("queue", spec.queue != defaults.queue) {
            warn(
                format!("servers[{i}].queue"),
                Oddity::IgnoredByKind {
                    kind: spec.kind,
                    instead: match spec.kind {
                        super::ServerKind::Vllm | super::ServerKind::Ollama => {
                            "its waiting queue is unbounded unless `max_queue` is set"
                        }
                        _ => "its waiting queue is unbounded",
                    },
                },
            );
        }
        // The slots are a routing weight, and llama.cpp's default `max_seqs`.
        let weighted = matches!(
            scenario.hardening.routing,
            Some(super::Routing::Weighted | super::Routing::LeastLoaded)
        );
        let slots_unused = match spec.kind {
            super::ServerKind::Generic => false,
            super::ServerKind::LlamaCpp | super::ServerKind::LlamaSwap => spec.max_seqs.is_some(),
            super::ServerKind::Vllm | super::ServerKind::OpenAi | super::ServerKind::Ollama => true,
        };
        if let Some(value) = spec
            .health_check_timeout_s
            .filter(|v| *v < super::kinds::MIN_HEALTH_CHECK_TIMEOUT_S)
        {
            warn(
                format!("servers[{i}].health_check_timeout_s"),
                Oddity::RaisedTo {
                    value,
                    to: super::kinds::MIN_HEALTH_CHECK_TIMEOUT_S,
                },
            );
        }
        if slots_unused && !weighted && set("slots", spec.slots != defaults.slots) {
            warn(
                format!("servers[{i}].slots"),
                Oddity::IgnoredByKind {
                    kind: spec.kind,
                    instead: "`max_seqs` sets the sequences it batches together (the slots only weigh it under weighted or least-loaded routing)",
                },
            );
        }
    }
    for (field, value) in [
        (
            "hardening.request_timeout_s",
            Some(scenario.hardening.request_timeout_s),
        ),
        ("hardening.deadline_s", scenario.hardening.deadline_s),
    ] {
        if let Some(value) = value.filter(|v| *v >= IMPLAUSIBLE_SECONDS) {
            warn(field.into(), Oddity::SecondsLookLikeMilliseconds { value });
        }
    }
    let tenants: BTreeSet<u64> = scenario
        .workers
        .iter()
        .flat_map(|w| w.tenants.iter().map(|t| t.id))
        .collect();
    for (i, f) in scenario.faults.iter().enumerate() {
        match f {
            Fault::Burst { tenant, .. } if !tenants.contains(tenant) => warn(
                format!("faults[{i}].tenant"),
                Oddity::BurstForUnknownTenant {
                    tenant: *tenant,
                    known: tenants.iter().copied().collect(),
                },
            ),
            Fault::Burst { calls: 0, .. } => warn(format!("faults[{i}].calls"), Oddity::EmptyBurst),
            Fault::Partition { a, b, .. } | Fault::Heal { a, b, .. } | Fault::Latency { a, b, .. } if a == b => warn(
                format!("faults[{i}].b"),
                Oddity::LinkToItself {
                    kind: f.kind(),
                    host: a.clone(),
                },
            ),
            Fault::Behave { behaviour, .. }
                if ignores_retry_after(
                    behaviour.mode,
                    behaviour.retry_after_s,
                    written_at(&written, "faults", i).and_then(|f| f.get("behaviour")),
                ) =>
            {
                warn(
                    format!("faults[{i}].behaviour.retry_after_s"),
                    Oddity::IgnoredByMode { mode: behaviour.mode },
                );
            }
            _ => {}
        }
        if f.at_s() >= scenario.duration_s {
            warn(format!("faults[{i}].at_s"), Oddity::FaultAtEnd { kind: f.kind() });
        }
    }
    // Restarts and heals, in the order the faults apply.
    let mut down = BTreeSet::new();
    let mut cut: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut cache_down = false;
    for f in fault::in_order(&scenario.faults) {
        match f {
            Fault::Partition { a, b, .. } => {
                cut.insert(pair(a, b));
            }
            // A heal of a link nothing cut (one of a host with itself is
            // warned about above).
            Fault::Heal { a, b, .. } if a != b && !cut.remove(&pair(a, b)) => {
                let i = scenario.faults.iter().position(|g| std::ptr::eq(g, f)).unwrap_or(0);
                warn(
                    format!("faults[{i}].kind"),
                    Oddity::HealWithoutPartition {
                        a: a.clone(),
                        b: b.clone(),
                    },
                );
            }
            Fault::Crash { server, .. } => {
                down.insert(server.as_str());
            }
            Fault::CacheDown { .. } => cache_down = true,
            Fault::CacheUp { .. } => {
                let was_down = std::mem::take(&mut cache_down);
                if !was_down {
                    let i = scenario.faults.iter().position(|g| std::ptr::eq(g, f)).unwrap_or(0);
                    warn(format!("faults[{i}].kind"), Oddity::CacheUpWhileUp);
                }
            }
            Fault::Restart { server, .. } => {
                let was_down = down.remove(server.as_str());
                if !was_down {
                    let i = scenario.faults.iter().position(|g| std::ptr::eq(g, f)).unwrap_or(0);
                    warn(
                        format!("faults[{i}].server"),
                        Oddity::RestartWithoutCrash { server: server.clone() },
                    );
                }
            }
            _ => {}
        }
    }
    out
}

/// A link's two ends in one order, whichever way the fault names them.
fn pair<'s>(a: &'s str, b: &'s str) -> (&'s str, &'s str) {
    if a <= b { (a, b) } else { (b, a) }
}

/// The `i`th table of the array `key` as the file wrote it.
fn written_at<'t>(written: &'t Option<toml::Table>, key: &str, i: usize) -> Option<&'t toml::Value> {
    written.as_ref()?.get(key)?.as_array()?.get(i)
}

/// Whether a behaviour sets a `retry_after_s` its mode ignores: written out in
/// `table` (the server, or the fault's behaviour) when the text is known, or
/// else different from the default.
fn ignores_retry_after(mode: Mode, retry_after_s: f64, table: Option<&toml::Value>) -> bool {
    if mode == Mode::RateLimit {
        return false;
    }
    match table {
        Some(t) => {
            // A server writes its behaviour as a table of its own.
            let behaviour = t.get("behaviour").unwrap_or(t);
            behaviour.get("retry_after_s").is_some()
        }
        None => retry_after_s != super::Behaviour::default().retry_after_s,
    }
}
