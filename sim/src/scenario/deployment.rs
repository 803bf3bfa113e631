//! The deployment: model servers (their capacity and how they misbehave),
//! and the fleet of workers with their tenants' load.

use serde::{Deserialize, Serialize};

use super::ClockSpec;

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
        }
    }

    /// Seconds one request holds a slot: prefill plus decode.
    pub fn service_time_s(&self) -> f64 {
        f64::from(self.prompt_tokens) / self.prefill_tokens_per_s
            + f64::from(self.output_tokens) / self.decode_tokens_per_s
    }

    /// Requests per second its slots can serve.
    pub fn throughput(&self) -> f64 {
        f64::from(self.slots) / self.service_time_s()
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
    /// The `Retry-After` a `rate_limit` answer carries.
    pub retry_after_s: f64,
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
    /// The servers it calls; worker `i` uses `servers[i % len]`.
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
    /// The model server it calls.
    pub server: String,
    /// Its tenants and their load.
    pub tenants: Vec<TenantLoad>,
    /// Its clock.
    pub clock: ClockSpec,
}

/// One tenant's open-loop load on one worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLoad {
    /// The tenant id (as the low bits of a UUID; see [`TenantLoad::tenant`]).
    pub id: u64,
    /// Mean arrivals per minute (Poisson).
    pub calls_per_min: f64,
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
}

impl TenantLoad {
    /// The tenant, as the core and the trace know it.
    pub fn tenant(&self) -> redstring::TenantId {
        tenant(self.id)
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
