//! The deployment: model servers (their capacity and how they misbehave),
//! and the fleet of workers with their tenants' load.

use serde::{Deserialize, Serialize};

use super::ClockSpec;
use crate::hosts::server::kinds::Preset;
pub use crate::scenario::kinds::{Cpu, LinearStep, Quota, ServerKind, Spread};

/// One GPU model server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSpec {
    /// Host name, referenced by workers and faults.
    pub name: String,
    /// The model id it serves.
    #[serde(default = "defaults::model")]
    pub model: String,
    /// Parallel decode slots.
    #[serde(default = "defaults::slots")]
    pub slots: u32,
    /// Requests that may wait for a slot; more are answered 503.
    #[serde(default = "defaults::queue")]
    pub queue: u32,
    /// In-flight requests (running + queued) at which the server collapses:
    /// every request hangs until load falls back below `slots`.
    #[serde(default)]
    pub collapse_at: Option<u32>,
    /// Prompt tokens per request.
    #[serde(default = "defaults::prompt_tokens")]
    pub prompt_tokens: u32,
    /// Output tokens per request.
    #[serde(default = "defaults::output_tokens")]
    pub output_tokens: u32,
    /// Prefill speed per slot.
    #[serde(default = "defaults::prefill_tps")]
    pub prefill_tokens_per_s: f64,
    /// Decode speed per slot.
    #[serde(default = "defaults::decode_tps")]
    pub decode_tokens_per_s: f64,
    /// Seconds after a restart during which it answers 503 "Loading model".
    #[serde(default = "defaults::reload_s")]
    pub reload_s: f64,
    /// Whether the run's first start loads the model too (by default the
    /// run begins with the model already loaded).
    #[serde(default)]
    pub cold_start: bool,
    /// How it answers at the start.
    #[serde(default)]
    pub behaviour: Behaviour,
    /// Which real server it behaves like (default `generic`: the fields
    /// above, nothing else). See [`ServerKind`] and `docs/server-kinds.md`.
    #[serde(default, skip_serializing_if = "is_generic")]
    pub kind: ServerKind,
    /// Load time after each start, drawn per load; replaces `reload_s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reload: Option<Spread>,
    /// Prompt tokens per request, drawn per request; replaces `prompt_tokens`
    /// (batching kinds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_dist: Option<Spread>,
    /// Output tokens a request would generate, drawn per request (capped by
    /// its `max_tokens`); replaces `output_tokens` (batching kinds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens_dist: Option<Spread>,
    /// Sequences batched together (vLLM `--max-num-seqs`, default 256;
    /// Ollama `OLLAMA_NUM_PARALLEL`, default 1; llama.cpp: `slots`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_seqs: Option<u32>,
    /// KV cache capacity in tokens (vLLM default 1 048 576; llama.cpp:
    /// `context_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_tokens: Option<u64>,
    /// Prompt tokens one step may prefill (default 8192).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_batched_tokens: Option<u64>,
    /// llama.cpp's context `-c` in tokens (default 16 384, unified across slots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_tokens: Option<u64>,
    /// Prompt tokens of every request that a slot which has served since the
    /// load already holds, so only the rest is prefilled (llama.cpp's prompt
    /// cache, on by default there): a system prompt every request shares,
    /// or all but one token when every request sends the same prompt
    /// (kinds llama_cpp, llama_swap and ollama; default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_prompt_tokens: Option<u64>,
    /// Multiplies every step's time: 2 is a GPU half as fast (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_scale: Option<f64>,
    /// A measured step-time model in place of Dynamo's polynomials (as
    /// `redstring-sim calibrate` writes it); excludes `time_scale`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_ms: Option<LinearStep>,
    /// Sigma of each step's lognormal time factor (mean 1; default 0.05).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_sigma: Option<f64>,
    /// llama-swap's `concurrencyLimit` (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_limit: Option<u32>,
    /// llama-swap's `healthCheckTimeout` in seconds (default 120, at least 15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check_timeout_s: Option<f64>,
    /// Ollama's `OLLAMA_MAX_QUEUE` (default 512); vLLM's opt-in
    /// `--max-num-queued-reqs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queue: Option<u32>,
    /// Idle seconds before the model unloads (Ollama's keep-alive, default
    /// 300; llama-swap's `ttl`, default never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_alive_s: Option<f64>,
    /// A `llama_cpp` server computing on the CPU: its machine's cores and
    /// its compute threads, which decide whether its HTTP threads wait for
    /// a core while it computes (default: a GPU server, whose HTTP threads
    /// never wait).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    /// The hosted endpoint's quotas (kind `openai`, required there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<Quota>,
    /// The provider account this server's key belongs to (hosted kinds):
    /// servers of one group share the account's credit
    /// (`quota.credit_tokens`, which must then agree), each keeping its own
    /// per-minute and daily limits, and every worker's deployment of one is
    /// told so (`Deployment::quota_group`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_group: Option<String>,
}

fn is_generic(kind: &ServerKind) -> bool {
    *kind == ServerKind::Generic
}

impl ServerSpec {
    /// A server called `name` with every other field at the scenario file's
    /// default.
    pub fn named(name: impl Into<String>) -> Self {
        ServerSpec {
            name: name.into(),
            model: defaults::model(),
            slots: defaults::slots(),
            queue: defaults::queue(),
            collapse_at: None,
            prompt_tokens: defaults::prompt_tokens(),
            output_tokens: defaults::output_tokens(),
            prefill_tokens_per_s: defaults::prefill_tps(),
            decode_tokens_per_s: defaults::decode_tps(),
            reload_s: defaults::reload_s(),
            cold_start: false,
            behaviour: Behaviour::default(),
            kind: ServerKind::Generic,
            reload: None,
            prompt_tokens_dist: None,
            output_tokens_dist: None,
            max_seqs: None,
            kv_tokens: None,
            max_batched_tokens: None,
            context_tokens: None,
            cached_prompt_tokens: None,
            time_scale: None,
            step_ms: None,
            step_sigma: None,
            concurrency_limit: None,
            health_check_timeout_s: None,
            max_queue: None,
            keep_alive_s: None,
            cpu: None,
            quota: None,
            quota_group: None,
        }
    }

    /// Seconds one request is served on an idle server. Generic: it holds a
    /// slot for prefill plus decode at the spec's speeds. Batching kinds: the
    /// engine's prefill step and one decode step per output token, at the
    /// mean token counts.
    pub fn service_time_s(&self) -> f64 {
        match Preset::of(self) {
            Some(preset) => {
                let (prompt, output) = Preset::mean_tokens(self);
                preset.engine.unloaded_latency_s(prompt, output)
            }
            None => self.slot_time_s(u64::from(self.prompt_tokens), u64::from(self.output_tokens)),
        }
    }

    /// Seconds a generic server's slot takes for `prompt` and `output`
    /// tokens: prefill plus decode at the spec's speeds.
    pub fn slot_time_s(&self, prompt: u64, output: u64) -> f64 {
        prompt as f64 / self.prefill_tokens_per_s + output as f64 / self.decode_tokens_per_s
    }

    /// Requests per second it can serve at its own mean token counts, each
    /// request asking for the default `hardening.max_tokens`
    /// ([`ServerSpec::throughput_with`] for another).
    pub fn throughput(&self) -> f64 {
        self.throughput_with(super::Hardening::default().max_tokens)
    }

    /// Requests per second it can serve at its own mean token counts, each
    /// request asking for at most `max_tokens` output tokens (the
    /// hardening's `max_tokens`, which every request carries); see
    /// [`ServerSpec::throughput_at`].
    pub fn throughput_with(&self, max_tokens: u32) -> f64 {
        let (prompt, output) = self.mean_tokens();
        self.throughput_at(prompt, output, max_tokens)
    }

    /// The prompt and output tokens of a request that carries no counts of
    /// its own: the fixed counts (generic kind), or the means of the
    /// `*_tokens_dist` distributions (batching kinds).
    pub fn mean_tokens(&self) -> (u64, u64) {
        match Preset::of(self) {
            Some(_) => Preset::mean_tokens(self),
            None => (u64::from(self.prompt_tokens), u64::from(self.output_tokens)),
        }
    }

    /// Requests per second it can serve when requests have `prompt` and
    /// `output` tokens (means) and ask for at most `max_tokens` output tokens.
    /// Generic: its slots over the slot time (a generic server ignores
    /// `max_tokens`). Batching kinds: the engine's steady-state capacity
    /// estimate (`EngineParams::capacity_per_s`) with the output capped at
    /// `max_tokens`, as the server caps it — not `slots / service_time_s()`:
    /// a batch shares its decode steps. A hosted endpoint's quota caps it
    /// further: `rpm / 60` requests, and `tpm / 60` tokens charged per
    /// request as its bucket charges them at admission, the larger of
    /// `max_tokens` and the prompt.
    pub fn throughput_at(&self, prompt: u64, output: u64, max_tokens: u32) -> f64 {
        let max_tokens = u64::from(max_tokens).max(1);
        match Preset::of(self) {
            Some(preset) => {
                let capacity = preset.engine.capacity_per_s(prompt, output.min(max_tokens));
                match preset.quota {
                    Some(q) => {
                        let charge = max_tokens.max(prompt) as f64;
                        capacity.min(f64::from(q.rpm) / 60.0).min(q.tpm as f64 / 60.0 / charge)
                    }
                    None => capacity,
                }
            }
            None => f64::from(self.slots) / self.slot_time_s(prompt, output),
        }
    }
}

/// What a server does with a request, beyond its capacity model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Answers correctly.
    #[default]
    Normal,
    /// 200 with empty content, `finish_reason: length`, reasoning text present.
    Empty,
    /// 200 with content that is not the requested JSON.
    Malformed,
    /// 200 with a refusal.
    Refuse,
    /// 429 with `Retry-After`.
    RateLimit,
    /// 500.
    Error,
    /// 503 "Loading model".
    Loading,
    /// Accepts and never answers.
    Hang,
    /// Closes the connection without answering.
    Drop,
}

impl Mode {
    /// Every mode, in declaration order.
    pub const ALL: [Mode; 9] = [
        Mode::Normal,
        Mode::Empty,
        Mode::Malformed,
        Mode::Refuse,
        Mode::RateLimit,
        Mode::Error,
        Mode::Loading,
        Mode::Hang,
        Mode::Drop,
    ];

    /// This mode's place in [`Mode::ALL`]; a new variant fails to compile
    /// here until it is given one (and a test checks `ALL` agrees).
    pub const fn position(self) -> usize {
        match self {
            Mode::Normal => 0,
            Mode::Empty => 1,
            Mode::Malformed => 2,
            Mode::Refuse => 3,
            Mode::RateLimit => 4,
            Mode::Error => 5,
            Mode::Loading => 6,
            Mode::Hang => 7,
            Mode::Drop => 8,
        }
    }
}

/// A server behaviour: a mode applied to a fraction of requests.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Behaviour {
    /// What the affected requests get.
    pub mode: Mode,
    /// Fraction of requests affected; the rest are answered normally.
    pub probability: f64,
    /// The `Retry-After` a `rate_limit` answer carries. Written out only
    /// when it is not the default, so a generated scenario does not set a
    /// field its mode ignores.
    #[serde(skip_serializing_if = "is_default_retry_after")]
    pub retry_after_s: f64,
}

fn is_default_retry_after(s: &f64) -> bool {
    *s == Behaviour::default().retry_after_s
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            mode: Mode::Normal,
            probability: 1.0,
            retry_after_s: 1.0,
        }
    }
}

/// A group of identical workers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerGroup {
    /// Host name, or the prefix `{name}-{i}` when `count` > 1.
    pub name: String,
    /// How many.
    #[serde(default = "defaults::count")]
    pub count: u32,
    /// The servers it calls: worker `i` uses `servers[i % len]`, or under
    /// `hardening.routing` every one, in this order.
    pub servers: Vec<String>,
    /// Its tenants and their load.
    pub tenants: Vec<TenantLoad>,
    /// Its clock.
    #[serde(default)]
    pub clock: ClockSpec,
}

/// One worker of the fleet, its group expanded (see [`Scenario::fleet`](super::Scenario::fleet)).
#[derive(Clone, Debug, PartialEq)]
pub struct FleetMember {
    /// Host name: the group's name, or `{group}-{i}` when the group has more than one.
    pub name: String,
    /// Its place in the whole fleet, from 0 (seeds its random streams).
    pub index: u64,
    /// The model server it calls first (the primary, when it routes).
    pub server: String,
    /// Every server it may call, the primary first: `[server]` unless
    /// `hardening.routing` is set.
    pub servers: Vec<String>,
    /// Its tenants and their load.
    pub tenants: Vec<TenantLoad>,
    /// Its clock.
    pub clock: ClockSpec,
}

/// One tenant's load on one worker: open loop, closed loop, a replayed
/// trace, or any mix of them.
///
/// Open loop (`calls_per_min`) is arrivals as a Poisson process, whether or
/// not earlier calls have ended — a pipeline fed from a queue, which is what
/// makes an outage pile up. Closed loop (`clients`, `think_s`) is a fixed
/// number of clients that each send a call, wait for it to end, think for an
/// exponentially distributed time, and send the next — interactive users or
/// a pool of N concurrent workers, whose load falls as latency grows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLoad {
    /// The tenant id (as the low bits of a UUID; see [`TenantLoad::tenant`]).
    pub id: u64,
    /// Mean open-loop arrivals per minute (Poisson).
    #[serde(default)]
    pub calls_per_min: f64,
    /// Closed-loop clients, each with at most one call in flight.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub clients: u32,
    /// A closed-loop client's mean think time between the end of one call and
    /// the start of the next, seconds.
    #[serde(default = "defaults::think_s", skip_serializing_if = "is_default_think")]
    pub think_s: f64,
    /// An arrival trace replayed as this tenant's calls (with each request's
    /// token counts), beside any open or closed loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<super::replay::Replay>,
    /// Prompt tokens of each of this tenant's calls, drawn per call from the
    /// tenant's own seeded stream and sent to the server with every attempt
    /// of the call; without it the server uses its own (`prompt_tokens`, or
    /// a draw of `prompt_tokens_dist`). A replayed request keeps its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<Spread>,
    /// Output tokens each of this tenant's calls would generate, drawn like
    /// `prompt_tokens`; the request's `max_tokens` still caps them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<Spread>,
    /// The class this tenant's calls carry at every limit they take a slot
    /// from (`high`, the default, or `low`): where `hardening.reserve`
    /// keeps part of a limit for the high class, a low tenant may use only
    /// the rest.
    #[serde(default, skip_serializing_if = "is_high")]
    pub priority: redstring::Priority,
}

fn is_high(p: &redstring::Priority) -> bool {
    *p == redstring::Priority::High
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_default_think(s: &f64) -> bool {
    *s == defaults::think_s()
}

pub(super) mod defaults {
    pub fn seed() -> u64 {
        1
    }
    pub fn tick_ms() -> u64 {
        10
    }
    pub fn model() -> String {
        "qwen3-8b".into()
    }
    pub fn slots() -> u32 {
        4
    }
    pub fn queue() -> u32 {
        32
    }
    pub fn prompt_tokens() -> u32 {
        400
    }
    pub fn output_tokens() -> u32 {
        60
    }
    pub fn prefill_tps() -> f64 {
        2000.0
    }
    pub fn decode_tps() -> f64 {
        40.0
    }
    pub fn reload_s() -> f64 {
        10.0
    }
    pub fn count() -> u32 {
        1
    }
    pub fn think_s() -> f64 {
        1.0
    }
}

impl TenantLoad {
    /// An open-loop tenant `id` arriving `calls_per_min` times a minute.
    pub fn open(id: u64, calls_per_min: f64) -> Self {
        TenantLoad {
            id,
            calls_per_min,
            clients: 0,
            think_s: defaults::think_s(),
            replay: None,
            prompt_tokens: None,
            output_tokens: None,
            priority: redstring::Priority::High,
        }
    }

    /// The tenant, as the core and the trace know it.
    pub fn tenant(&self) -> redstring::TenantId {
        tenant(self.id)
    }

    /// The most calls per minute this tenant starts over a run of
    /// `duration_s`: [`TenantLoad::peak_calls_per_min`] plus a replayed
    /// trace's requests spread over the run. What the load figure and the
    /// work budget count.
    pub fn most_calls_per_min(&self, duration_s: f64) -> f64 {
        let replayed = match &self.replay {
            Some(r) if duration_s > 0.0 => r.requests.len() as f64 * 60.0 / duration_s,
            _ => 0.0,
        };
        self.peak_calls_per_min() + replayed
    }

    /// The most calls per minute this tenant can start: its open-loop rate,
    /// plus each closed-loop client starting one call per think time (calls
    /// that end at once — refused, or a circuit open — leave only the think
    /// time between them). What validation and the work budget bound.
    pub fn peak_calls_per_min(&self) -> f64 {
        let closed = if self.clients == 0 {
            0.0
        } else {
            f64::from(self.clients) * 60.0 / self.think_s.max(f64::MIN_POSITIVE)
        };
        self.calls_per_min + closed
    }
}

/// The tenant a scenario file's tenant number stands for.
pub fn tenant(id: u64) -> redstring::TenantId {
    redstring::TenantId::from_u128(u128::from(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_mode_once_in_position_order() {
        for (i, mode) in Mode::ALL.iter().enumerate() {
            assert_eq!(mode.position(), i, "{mode:?}");
        }
    }
}
