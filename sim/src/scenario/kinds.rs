//! What a server *is*, in a scenario's words: its kind, the distributions
//! its quantities are drawn from, a hosted endpoint's quota, and the
//! defaults and checks of each kind's fields. How each kind *behaves* is the
//! server host's ([`crate::hosts::server`]); this is the vocabulary the
//! scenario file, the validation and the reports share.

use rand::Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use crate::scenario::ServerSpec;

/// Which real server a simulated one behaves like.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerKind {
    /// The original model: `slots` parallel slots, a `queue` bounded FIFO
    /// (`503 server busy` beyond it), a fixed service time, a reload answered
    /// `503 Loading model`, and `collapse_at`.
    #[default]
    Generic,
    /// llama.cpp's `llama-server`: `slots` (`-np`) sequences batched
    /// together, an unbounded queue (no 429 or 503 for load), `503 Loading
    /// model` from every endpoint while the model loads, and `400
    /// exceed_context_size_error` when a prompt reaches the context
    /// (`context_tokens`, `-c`), checked when the request gets its slot.
    /// Generation that reaches the context stops with `finish_reason:
    /// "length"`.
    LlamaCpp,
    /// llama-swap in front of llama.cpp: while the upstream loads (after a
    /// restart, or on the first request after its `keep_alive_s` TTL
    /// unloaded it) requests are *held*, not refused; the health check polls
    /// 250 ms after the start and then every second, and if the upstream is
    /// not healthy within `health_check_timeout_s` (default 120, at least 15)
    /// every waiter gets `500 unspecific error: health check timed out after
    /// …` and the next request starts a new load. More than
    /// `concurrency_limit` (default 10) requests in flight — waiting for a
    /// load included — get `429` with `Retry-After: 1`.
    LlamaSwap,
    /// vLLM: continuous batching of up to `max_seqs` (256) sequences, an
    /// unbounded waiting queue (or `503` once `max_queue` requests are
    /// unfinished, waiting and running together, as vLLM's opt-in
    /// `--max-num-queued-reqs` counts them in `AsyncLLM.check_admission`),
    /// recompute preemption when the KV cache is full, and connections
    /// refused until the model has loaded.
    Vllm,
    /// Ollama: `max_seqs` (`OLLAMA_NUM_PARALLEL`, default 1) in parallel;
    /// the model loads on the first request after `keep_alive_s` (default
    /// 300) of idleness, the request blocking meanwhile; requests waiting for
    /// a load beyond `max_queue` (`OLLAMA_MAX_QUEUE`, default 512) get `503
    /// server busy, please try again.  maximum pending requests exceeded`.
    Ollama,
    /// A hosted OpenAI-style endpoint: requests-per-minute and
    /// tokens-per-minute buckets per API key (`quota`), `429` with
    /// `retry-after`, `retry-after-ms` and `x-ratelimit-*` headers computed
    /// from the buckets, and `429 insufficient_quota` once the credit
    /// (`quota.credit_tokens`) is spent.
    #[serde(rename = "openai")]
    OpenAi,
}

impl ServerKind {
    /// Whether this kind serves through the batching engine.
    pub fn batches(self) -> bool {
        self != ServerKind::Generic
    }

    /// Whether its engine serves a llama.cpp upstream (context check and
    /// llama.cpp's KV model).
    pub(crate) fn llama_family(self) -> bool {
        matches!(self, ServerKind::LlamaCpp | ServerKind::LlamaSwap | ServerKind::Ollama)
    }
}

/// Default KV cache of the vLLM-style kinds: the Dynamo mocker's default of
/// 16 384 blocks of 64 tokens.
pub const DEFAULT_VLLM_KV_TOKENS: u64 = 16_384 * 64;

/// Default context (`-c`) of the llama.cpp-style kinds, a simulator default
/// (llama.cpp takes it from the model): set `context_tokens` to yours.
pub const DEFAULT_CONTEXT_TOKENS: u64 = 16_384;

/// Default prefill budget per step: the Dynamo mocker's and vLLM's (on large
/// GPUs) `--max-num-batched-tokens` of 8192.
pub const DEFAULT_MAX_BATCHED_TOKENS: u64 = 8192;

/// The most `cached_prompt_tokens` a server may name: as many as a request
/// may carry ([`crate::hosts::MAX_HEADER_TOKENS`]).
pub const MAX_CACHED_PROMPT_TOKENS: u64 = crate::hosts::MAX_HEADER_TOKENS;

/// Default sequences in vLLM's batch (`--max-num-seqs`).
pub const DEFAULT_VLLM_MAX_SEQS: u32 = 256;

/// Default spread of each step's time: a lognormal factor with this sigma
/// (and mean 1), a simulator default.
pub const DEFAULT_STEP_SIGMA: f64 = 0.05;

/// llama-swap's default `concurrencyLimit` per model.
pub const DEFAULT_CONCURRENCY_LIMIT: u32 = 10;

/// llama-swap's default `healthCheckTimeout`, seconds.
pub const DEFAULT_HEALTH_CHECK_TIMEOUT_S: f64 = 120.0;

/// llama-swap raises a smaller `healthCheckTimeout` to this.
pub const MIN_HEALTH_CHECK_TIMEOUT_S: f64 = 15.0;

/// `OLLAMA_MAX_QUEUE`'s default.
pub const DEFAULT_OLLAMA_MAX_QUEUE: u32 = 512;

/// `OLLAMA_KEEP_ALIVE`'s default, seconds.
pub const DEFAULT_OLLAMA_KEEP_ALIVE_S: f64 = 300.0;

/// The longest mean load time a `reload` distribution may have: a day.
const MAX_RELOAD_S: f64 = 86_400.0;

/// The largest mean token count a distribution may have.
const MAX_TOKENS: f64 = 10_000_000.0;

/// A distribution of a positive quantity (a reload time, a token count),
/// drawn from the server's seeded RNG.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "dist", rename_all = "snake_case", deny_unknown_fields)]
pub enum Spread {
    /// Always `value`.
    Fixed {
        /// The value.
        value: f64,
    },
    /// Uniform on `[low, high]`.
    Uniform {
        /// Smallest value.
        low: f64,
        /// Largest value.
        high: f64,
    },
    /// Lognormal with this `median` and `sigma` (of the underlying normal).
    Lognormal {
        /// The median.
        median: f64,
        /// The spread of the logarithm.
        sigma: f64,
    },
}

impl Spread {
    /// One draw (never negative).
    pub fn sample(&self, rng: &mut impl Rng) -> f64 {
        let x = match *self {
            Spread::Fixed { value } => value,
            Spread::Uniform { low, high } => {
                if high > low {
                    rng.random_range(low..=high)
                } else {
                    low
                }
            }
            Spread::Lognormal { median, sigma } => {
                let z: f64 = StandardNormal.sample(rng);
                median * (sigma * z).exp()
            }
        };
        if x.is_finite() { x.max(0.0) } else { 0.0 }
    }

    /// Its mean.
    pub fn mean(&self) -> f64 {
        match *self {
            Spread::Fixed { value } => value,
            Spread::Uniform { low, high } => (low + high) / 2.0,
            Spread::Lognormal { median, sigma } => median * (sigma * sigma / 2.0).exp(),
        }
    }

    /// Checks its parameters: finite, not negative, a range in order, a
    /// lognormal's sigma at most 3; the error says what was wrong.
    pub(crate) fn check(&self) -> Result<(), String> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        match *self {
            Spread::Fixed { value } if !ok(value) => Err(format!("value must not be negative, got {value}")),
            Spread::Uniform { low, high } if !(ok(low) && ok(high) && low <= high) => Err(format!(
                "low and high must not be negative and low must not exceed high, got {low}..{high}"
            )),
            Spread::Lognormal { median, sigma } if !(ok(median) && ok(sigma) && sigma <= 3.0) => Err(format!(
                "median must not be negative and sigma must be between 0 and 3, got {median} and {sigma}"
            )),
            _ => Ok(()),
        }
    }
}

/// A measured step-time model: what one forward pass costs, linear in the
/// prompt tokens it prefills, the sequences it decodes and the context they
/// attend to.
///
/// Dynamo's polynomials (the default) describe a GPU, whose decode step
/// barely grows with the batch; a server on CPUs computes each sequence's
/// token in turn, so its step grows with the batch, and each token attends
/// to every token of its context, so it grows with the context too (a
/// llama.cpp server on two cores measured 4.5 ms a token at 62 tokens of
/// context and 34 ms at 4 000). `redstring-sim calibrate` fits these five
/// numbers to a running server's latencies; a step takes `decode_base_ms +
/// decode_per_sequence_ms × B + decode_per_context_token_ms × C`, plus
/// `prefill_base_ms + prefill_per_token_ms × T` when it prefills `T > 0`
/// prompt tokens, for `B` sequences in the batch holding `C` tokens of
/// context (prompts and what they generated) between them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinearStep {
    /// Milliseconds a step that prefills takes beyond its decode (a
    /// request's fixed cost: parsing, tokenising, the grammar's setup).
    pub prefill_base_ms: f64,
    /// Milliseconds per prompt token prefilled.
    pub prefill_per_token_ms: f64,
    /// Milliseconds of every step, whatever its batch.
    pub decode_base_ms: f64,
    /// Milliseconds per sequence in the batch.
    pub decode_per_sequence_ms: f64,
    /// Milliseconds per token of context the batch holds (0 unless given:
    /// steps that do not grow with their context).
    #[serde(default)]
    pub decode_per_context_token_ms: f64,
}

/// The most milliseconds any term of a [`LinearStep`] may take.
pub const MAX_STEP_MS: f64 = 60_000.0;

impl LinearStep {
    /// Milliseconds of a step that prefills `tokens` prompt tokens and
    /// decodes `batch` sequences holding `context` tokens between them.
    pub fn step_ms(&self, tokens: u64, batch: usize, context: f64) -> f64 {
        let prefill = if tokens == 0 {
            0.0
        } else {
            self.prefill_base_ms + self.prefill_per_token_ms * tokens as f64
        };
        prefill + self.decode_ms(batch as f64, context)
    }

    /// Milliseconds of a decode step of `batch` sequences holding `context`
    /// tokens between them.
    pub fn decode_ms(&self, batch: f64, context: f64) -> f64 {
        self.decode_base_ms + self.decode_per_sequence_ms * batch + self.decode_per_context_token_ms * context
    }

    /// Each term finite, not negative and at most [`MAX_STEP_MS`], and a
    /// decode step that takes some time; the error names the term.
    pub(crate) fn check(&self) -> Result<(), (String, String)> {
        for (field, v) in [
            ("prefill_base_ms", self.prefill_base_ms),
            ("prefill_per_token_ms", self.prefill_per_token_ms),
            ("decode_base_ms", self.decode_base_ms),
            ("decode_per_sequence_ms", self.decode_per_sequence_ms),
            ("decode_per_context_token_ms", self.decode_per_context_token_ms),
        ] {
            if !(v.is_finite() && (0.0..=MAX_STEP_MS).contains(&v)) {
                return Err((field.into(), format!("must be between 0 and {MAX_STEP_MS} ms, got {v}")));
            }
        }
        if self.decode_base_ms + self.decode_per_sequence_ms + self.decode_per_context_token_ms < 0.001 {
            return Err((
                "decode_per_sequence_ms".into(),
                "a decode step must take at least 0.001 ms with its base and context terms".into(),
            ));
        }
        Ok(())
    }
}

/// A hosted endpoint's quotas per API key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    /// Requests per minute.
    pub rpm: u32,
    /// Tokens per minute.
    pub tpm: u64,
    /// Tokens (prompt + completion) the account may spend in the whole run
    /// before every request gets `429 insufficient_quota`; `None` unlimited.
    #[serde(default)]
    pub credit_tokens: Option<u64>,
    /// Requests per day per key, counted from the run's start: once spent,
    /// every request gets a 429 whose `retry-after` is the day's end, hours
    /// away (a free tier's daily cap); `None` unlimited.
    #[serde(default)]
    pub rpd: Option<u32>,
}

impl Quota {
    pub(crate) fn check(&self) -> Result<(), (String, String)> {
        if self.rpm == 0 {
            return Err(("rpm".into(), "must be positive, got 0".into()));
        }
        if self.tpm == 0 {
            return Err(("tpm".into(), "must be positive, got 0".into()));
        }
        if self.rpd == Some(0) {
            return Err((
                "rpd".into(),
                "must be positive, got 0 (leave it out for no daily cap)".into(),
            ));
        }
        Ok(())
    }
}

/// A llama.cpp server computing on the CPU (`[servers.cpu]`).
///
/// llama-server serves each connection on a thread of its HTTP pool, and a
/// thread told of a new connection counts as idle until it gets a core: when
/// the compute threads and the accept loop fill the machine's cores, a burst
/// of connections that arrives while the server computes is served only by
/// the threads that were idle, and the rest wait for a thread to come free
/// (`docs/server-kinds.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cpu {
    /// The machine's cores (its hardware threads).
    pub cores: u32,
    /// llama.cpp's `--threads`, the threads it computes with (default: all
    /// of `cores`; llama.cpp's own default is its count of physical cores,
    /// so give it on a machine whose cores are hyperthreads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
}

/// The most cores a `[servers.cpu]` may name.
pub const MAX_CORES: u32 = 4096;

impl Cpu {
    /// Whether the compute threads and the accept loop leave no core free
    /// while the server computes.
    pub fn crowded(&self) -> bool {
        self.threads.unwrap_or(self.cores).saturating_add(1) >= self.cores
    }

    /// The numbers in range; the error names the field.
    pub fn check(&self) -> Result<(), (String, String)> {
        if !(1..=MAX_CORES).contains(&self.cores) {
            return Err(("cores".into(), format!("must be 1 to {MAX_CORES}, got {}", self.cores)));
        }
        if let Some(t) = self.threads
            && !(1..=self.cores).contains(&t)
        {
            return Err((
                "threads".into(),
                format!("must be 1 to the {} cores, got {t}", self.cores),
            ));
        }
        Ok(())
    }
}

/// Checks a server's kind-specific fields; the error names the field (under
/// `at`, like `servers[0].`).
pub fn validate(spec: &ServerSpec) -> Result<(), (String, String)> {
    let bad = |field: &str, message: String| Err((field.to_owned(), message));
    let generic = spec.kind == ServerKind::Generic;
    let batching_only = [
        ("max_seqs", spec.max_seqs.is_some()),
        ("kv_tokens", spec.kv_tokens.is_some()),
        ("max_batched_tokens", spec.max_batched_tokens.is_some()),
        ("context_tokens", spec.context_tokens.is_some()),
        ("time_scale", spec.time_scale.is_some()),
        ("step_ms", spec.step_ms.is_some()),
        ("step_sigma", spec.step_sigma.is_some()),
        ("prompt_tokens_dist", spec.prompt_tokens_dist.is_some()),
        ("output_tokens_dist", spec.output_tokens_dist.is_some()),
        ("max_queue", spec.max_queue.is_some()),
        ("keep_alive_s", spec.keep_alive_s.is_some()),
    ];
    if generic && let Some((field, _)) = batching_only.iter().find(|(_, set)| *set) {
        return bad(field, "needs a `kind` other than generic".into());
    }
    if !generic && spec.collapse_at.is_some() {
        return bad("collapse_at", "applies to kind generic only".into());
    }
    if spec.concurrency_limit.is_some() && spec.kind != ServerKind::LlamaSwap {
        return bad("concurrency_limit", "applies to kind llama_swap only".into());
    }
    if spec.health_check_timeout_s.is_some() && spec.kind != ServerKind::LlamaSwap {
        return bad("health_check_timeout_s", "applies to kind llama_swap only".into());
    }
    if let Some(cpu) = &spec.cpu {
        if spec.kind != ServerKind::LlamaCpp {
            return bad("cpu", "applies to kind llama_cpp only".into());
        }
        cpu.check().map_err(|(f, m)| (format!("cpu.{f}"), m))?;
    }
    if spec.quota.is_some() != (spec.kind == ServerKind::OpenAi) {
        return bad("quota", "is required by kind openai and applies to it only".into());
    }
    if spec.max_queue.is_some() && !matches!(spec.kind, ServerKind::Ollama | ServerKind::Vllm) {
        return bad("max_queue", "applies to kinds ollama and vllm only".into());
    }
    if spec.keep_alive_s.is_some() && !matches!(spec.kind, ServerKind::Ollama | ServerKind::LlamaSwap) {
        return bad("keep_alive_s", "applies to kinds ollama and llama_swap only".into());
    }
    for (field, set) in [
        ("context_tokens", spec.context_tokens.is_some()),
        ("cached_prompt_tokens", spec.cached_prompt_tokens.is_some()),
    ] {
        if set && !spec.kind.llama_family() {
            return bad(field, "applies to kinds llama_cpp, llama_swap and ollama only".into());
        }
    }
    if let Some(cached) = spec.cached_prompt_tokens
        && cached > MAX_CACHED_PROMPT_TOKENS
    {
        return bad(
            "cached_prompt_tokens",
            format!("must be at most {MAX_CACHED_PROMPT_TOKENS}, got {cached}"),
        );
    }
    let positive = |v: Option<u64>| v.is_none_or(|v| v > 0);
    for (field, ok) in [
        ("max_seqs", positive(spec.max_seqs.map(u64::from))),
        ("kv_tokens", positive(spec.kv_tokens)),
        ("max_batched_tokens", positive(spec.max_batched_tokens)),
        ("context_tokens", positive(spec.context_tokens)),
        ("concurrency_limit", positive(spec.concurrency_limit.map(u64::from))),
    ] {
        if !ok {
            return bad(field, "must be positive, got 0".into());
        }
    }
    if let Some(t) = spec.time_scale
        && !(t.is_finite() && (0.01..=1000.0).contains(&t))
    {
        return bad("time_scale", format!("must be between 0.01 and 1000, got {t}"));
    }
    if let Some(step) = &spec.step_ms {
        if spec.time_scale.is_some() {
            return bad("step_ms", "replaces `time_scale`: give one or the other".into());
        }
        step.check().map_err(|(f, m)| (format!("step_ms.{f}"), m))?;
    }
    if let Some(s) = spec.step_sigma
        && !(s.is_finite() && (0.0..=1.0).contains(&s))
    {
        return bad("step_sigma", format!("must be between 0 and 1, got {s}"));
    }
    for (field, v) in [
        ("health_check_timeout_s", spec.health_check_timeout_s),
        ("keep_alive_s", spec.keep_alive_s),
    ] {
        if let Some(v) = v
            && !(v.is_finite() && v >= 0.0)
        {
            return bad(field, format!("must not be negative, got {v}"));
        }
    }
    for (field, dist, most) in [
        ("reload", spec.reload, MAX_RELOAD_S),
        ("prompt_tokens_dist", spec.prompt_tokens_dist, MAX_TOKENS),
        ("output_tokens_dist", spec.output_tokens_dist, MAX_TOKENS),
    ] {
        if let Some(d) = dist {
            d.check().map_err(|m| (field.to_owned(), m))?;
            if d.mean() > most {
                return bad(field, format!("must have a mean of at most {most}, got {}", d.mean()));
            }
        }
    }
    if let Some(q) = &spec.quota {
        q.check().map_err(|(f, m)| (format!("quota.{f}"), m))?;
    }
    Ok(())
}
