//! Server kinds: presets that behave like the servers users run.
//!
//! A scenario names one with `kind = "llama_cpp" | "llama_swap" | "vllm" |
//! "ollama" | "openai"`; without one a server is the `generic` model (slots,
//! a bounded queue and a fixed service time), exactly as before kinds
//! existed. Every kind other than `generic` serves through the
//! continuous-batching engine of [`super::batching`]; what differs is what
//! stands in front of it. The behaviour each kind claims, and its source, is
//! documented on [`ServerKind`]'s variants and in `docs/server-kinds.md`.
//! The misbehaviour modes of `Behaviour` apply on every kind, after the
//! kind's own gate and before the engine.

use super::batching::{EngineParams, StepCost};
use crate::scenario::ServerSpec;
use crate::scenario::kinds::*;

/// Everything a kind needs, resolved from its spec with the kind's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Preset {
    /// The kind.
    pub kind: ServerKind,
    /// The engine's settings.
    pub engine: EngineParams,
    /// The context a prompt and its output must fit (llama.cpp family).
    pub context_tokens: Option<u64>,
    /// Sigma of each step's lognormal time factor.
    pub step_sigma: f64,
    /// llama-swap's concurrency limit.
    pub concurrency_limit: u32,
    /// llama-swap's health-check timeout, seconds (at least 15).
    pub health_check_timeout_s: f64,
    /// Requests refused with 503 beyond this many waiting (Ollama: waiting
    /// for a load; vLLM: waiting and running).
    pub max_queue: Option<u32>,
    /// Idle seconds after which the model unloads (Ollama's keep-alive,
    /// llama-swap's TTL); `None` never.
    pub keep_alive_s: Option<f64>,
    /// The hosted endpoint's quotas.
    pub quota: Option<Quota>,
}

impl Preset {
    /// The preset `spec` describes, or `None` for the generic kind.
    pub fn of(spec: &ServerSpec) -> Option<Preset> {
        let kind = spec.kind;
        if !kind.batches() {
            return None;
        }
        let context = kind
            .llama_family()
            .then(|| spec.context_tokens.unwrap_or(DEFAULT_CONTEXT_TOKENS));
        let kv_tokens = spec.kv_tokens.or(context).unwrap_or(DEFAULT_VLLM_KV_TOKENS).max(1);
        let max_seqs = spec.max_seqs.unwrap_or(match kind {
            ServerKind::LlamaCpp | ServerKind::LlamaSwap | ServerKind::Generic => spec.slots,
            ServerKind::Ollama => 1,
            ServerKind::Vllm | ServerKind::OpenAi => DEFAULT_VLLM_MAX_SEQS,
        });
        Some(Preset {
            kind,
            engine: EngineParams {
                max_seqs: max_seqs.max(1),
                kv_tokens,
                max_batched_tokens: spec.max_batched_tokens.unwrap_or(DEFAULT_MAX_BATCHED_TOKENS),
                cost: match spec.step_ms {
                    Some(linear) => StepCost::Linear(linear),
                    None => StepCost::Polynomial {
                        time_scale: spec.time_scale.unwrap_or(1.0),
                    },
                },
                preempt: matches!(kind, ServerKind::Vllm | ServerKind::OpenAi),
                reject_prompts_from: context,
                cached_prefix: spec.cached_prompt_tokens.unwrap_or(0),
            },
            context_tokens: context,
            step_sigma: spec.step_sigma.unwrap_or(DEFAULT_STEP_SIGMA),
            concurrency_limit: spec.concurrency_limit.unwrap_or(DEFAULT_CONCURRENCY_LIMIT).max(1),
            health_check_timeout_s: spec
                .health_check_timeout_s
                .unwrap_or(DEFAULT_HEALTH_CHECK_TIMEOUT_S)
                .max(MIN_HEALTH_CHECK_TIMEOUT_S),
            max_queue: match kind {
                ServerKind::Ollama => Some(spec.max_queue.unwrap_or(DEFAULT_OLLAMA_MAX_QUEUE)),
                _ => spec.max_queue,
            },
            keep_alive_s: match kind {
                ServerKind::Ollama => Some(spec.keep_alive_s.unwrap_or(DEFAULT_OLLAMA_KEEP_ALIVE_S)),
                _ => spec.keep_alive_s,
            },
            quota: spec.quota,
        })
    }

    /// Mean prompt and output tokens per request.
    pub fn mean_tokens(spec: &ServerSpec) -> (u64, u64) {
        let mean = |dist: Option<Spread>, fixed: u32| dist.map_or(f64::from(fixed), |d| d.mean()).round() as u64;
        (
            mean(spec.prompt_tokens_dist, spec.prompt_tokens),
            mean(spec.output_tokens_dist, spec.output_tokens),
        )
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    use super::*;

    #[test]
    fn spreads_draw_within_their_support_and_repeat_by_seed() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let uniform = Spread::Uniform { low: 5.0, high: 9.0 };
        let lognormal = Spread::Lognormal {
            median: 20.0,
            sigma: 0.5,
        };
        let draws: Vec<f64> = (0..200).map(|_| uniform.sample(&mut rng)).collect();
        assert!(draws.iter().all(|x| (5.0..=9.0).contains(x)));
        assert!(draws.iter().any(|x| *x < 6.0) && draws.iter().any(|x| *x > 8.0));
        let logs: Vec<f64> = (0..2000).map(|_| lognormal.sample(&mut rng)).collect();
        let below = logs.iter().filter(|x| **x < 20.0).count();
        assert!((800..1200).contains(&below), "median 20: {below} of 2000 below");
        let again: Vec<f64> = {
            let mut rng = ChaCha8Rng::seed_from_u64(3);
            (0..200).map(|_| uniform.sample(&mut rng)).collect()
        };
        assert_eq!(draws, again);
        assert_eq!(Spread::Fixed { value: 4.0 }.sample(&mut rng), 4.0);
    }

    #[test]
    fn kinds_fill_their_defaults() {
        let mut spec = ServerSpec::named("gpu");
        assert_eq!(Preset::of(&spec), None);
        spec.kind = ServerKind::Vllm;
        let vllm = Preset::of(&spec).unwrap();
        assert_eq!(vllm.engine.max_seqs, 256);
        assert_eq!(vllm.engine.kv_tokens, DEFAULT_VLLM_KV_TOKENS);
        assert!(vllm.engine.preempt);
        spec.kind = ServerKind::LlamaCpp;
        let llama = Preset::of(&spec).unwrap();
        assert_eq!((llama.engine.max_seqs, llama.engine.preempt), (spec.slots, false));
        assert_eq!(llama.engine.reject_prompts_from, Some(DEFAULT_CONTEXT_TOKENS));
        spec.kind = ServerKind::Ollama;
        let ollama = Preset::of(&spec).unwrap();
        assert_eq!((ollama.engine.max_seqs, ollama.max_queue), (1, Some(512)));
        assert_eq!(ollama.keep_alive_s, Some(300.0));
        spec.kind = ServerKind::LlamaSwap;
        spec.health_check_timeout_s = Some(5.0);
        let swap = Preset::of(&spec).unwrap();
        assert_eq!((swap.concurrency_limit, swap.health_check_timeout_s), (10, 15.0));
    }

    #[test]
    fn a_measured_step_model_is_checked_term_by_term_and_excludes_time_scale() {
        let linear = LinearStep {
            prefill_base_ms: 10.0,
            prefill_per_token_ms: 0.05,
            decode_base_ms: 2.0,
            decode_per_sequence_ms: 1.5,
            decode_per_context_token_ms: 0.001,
        };
        let mut spec = ServerSpec::named("cpu");
        spec.step_ms = Some(linear);
        assert_eq!(validate(&spec).unwrap_err().0, "step_ms", "generic has no steps");
        spec.kind = ServerKind::LlamaCpp;
        assert_eq!(validate(&spec), Ok(()));
        assert_eq!(Preset::of(&spec).unwrap().engine.cost, StepCost::Linear(linear));
        spec.time_scale = Some(2.0);
        assert_eq!(validate(&spec).unwrap_err().0, "step_ms");
        spec.time_scale = None;
        for (bad, field) in [
            (f64::NAN, "step_ms.prefill_base_ms"),
            (-1.0, "step_ms.prefill_base_ms"),
            (1e9, "step_ms.prefill_base_ms"),
        ] {
            spec.step_ms = Some(LinearStep {
                decode_per_context_token_ms: bad,
                ..linear
            });
            assert_eq!(validate(&spec).unwrap_err().0, "step_ms.decode_per_context_token_ms");
            spec.step_ms = Some(LinearStep {
                prefill_base_ms: bad,
                ..linear
            });
            let (name, message) = validate(&spec).unwrap_err();
            assert_eq!(name, field);
            assert!(message.contains("between 0 and"), "{message}");
        }
        spec.step_ms = Some(LinearStep {
            decode_base_ms: 0.0,
            decode_per_sequence_ms: 0.0,
            decode_per_context_token_ms: 0.0,
            ..linear
        });
        assert_eq!(validate(&spec).unwrap_err().0, "step_ms.decode_per_sequence_ms");
        // A step whose cost is all in its context still takes time: a fit
        // may find no base and no per-sequence cost.
        spec.step_ms = Some(LinearStep {
            decode_base_ms: 0.0,
            decode_per_sequence_ms: 0.0,
            decode_per_context_token_ms: 0.008,
            ..linear
        });
        assert_eq!(validate(&spec), Ok(()));
    }

    #[test]
    fn fields_of_another_kind_are_named() {
        let mut spec = ServerSpec::named("gpu");
        spec.kv_tokens = Some(100);
        assert_eq!(validate(&spec).unwrap_err().0, "kv_tokens");
        spec.kind = ServerKind::Vllm;
        assert_eq!(validate(&spec), Ok(()));
        spec.concurrency_limit = Some(3);
        assert_eq!(validate(&spec).unwrap_err().0, "concurrency_limit");
        spec.concurrency_limit = None;
        spec.time_scale = Some(0.0);
        assert_eq!(validate(&spec).unwrap_err().0, "time_scale");
        spec.time_scale = None;
        spec.reload = Some(Spread::Uniform { low: 3.0, high: 1.0 });
        assert_eq!(validate(&spec).unwrap_err().0, "reload");
        spec.reload = None;
        spec.collapse_at = Some(4);
        assert_eq!(validate(&spec).unwrap_err().0, "collapse_at");
        spec.collapse_at = None;
        spec.kind = ServerKind::OpenAi;
        assert_eq!(validate(&spec).unwrap_err().0, "quota");
    }
}
