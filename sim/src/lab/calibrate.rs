//! Measuring a running model server and fitting the simulator's step model
//! to it.
//!
//! A simulated figure is only as good as the server model under it, and a
//! server's speed is a fact of its hardware, model and settings that no
//! default can know. `calibrate` asks the server itself: it sends the
//! requests a worker sends (a chat completion with a JSON schema), from one
//! client and then from several at once, with prompts and output caps of
//! several sizes, times each answer and reads its token counts; then it fits
//! the five numbers of a [`LinearStep`] by least squares (non-negative, so
//! every term keeps its meaning) and says how well they predict the latencies
//! it measured. The result is a `[[servers]]` section to paste into a
//! scenario.
//!
//! The measuring half ([`measure`]) speaks to the server through
//! [`Endpoint`], so the same code runs against a real server over real HTTP
//! and, in the tests, against the simulator's own server model inside turmoil
//! — where the numbers to recover are known.
//!
//! # The fit
//!
//! The step model is the simulator's own engine ([`Engine`]) with a
//! [`LinearStep`]. Given the requests in the order and at the instants they
//! were sent, with their token counts, the engine says when each would have
//! finished; the fit is the step that makes those latencies closest to the
//! measured ones (least squared relative error) and, where the server says
//! what it spent on a request sent alone ([`Timings`]), its first step and
//! its later ones closest to those, so a scenario given it replays the
//! server's dynamics — its batching, its queueing past its slots — and not
//! only its speed alone. The search (Nelder–Mead, restarted
//! where it stops) starts from least squares over the one-client requests,
//! which cost exactly `prefill_base + P·prefill_per_token + O·(decode_base +
//! decode_per_sequence) + (O·N + O·(O − 1)/2)·decode_per_context_token`
//! for `P` prompt tokens prefilled of `N` in all and `O` output tokens
//! (the context of the `k`-th decode step is `N + k`). One client cannot
//! tell the two decode terms apart, so the search starts from each end of
//! their sum and from its middle, and keeps the best it finds; only the
//! requests sent together split it.

use std::sync::Arc;
use std::time::Duration;

use rand::{RngCore, SeedableRng};
use redstring::provider::{BoxFuture, HttpResponse, TransportError};
use serde_json::{Value, json};

use crate::hosts::server::batching::{Engine, EngineEvent, EngineParams, StepCost};
use crate::scenario::kinds::{LinearStep, MAX_STEP_MS};

/// Where a calibration sends its requests: a server's base URL, over some
/// HTTP client.
pub trait Endpoint: Send + Sync + 'static {
    /// `GET` of `path` (like `/props`).
    fn get<'a>(&'a self, path: &'a str, timeout: Duration) -> BoxFuture<'a, Result<HttpResponse, TransportError>>;
    /// `POST` of the JSON `body` to `path`.
    fn post<'a>(
        &'a self,
        path: &'a str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<HttpResponse, TransportError>>;
}

/// What to send.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The `model` of each request.
    pub model: String,
    /// The most clients at once (the levels are 1, 2, … up to this and the
    /// server's slots).
    pub max_concurrency: u32,
    /// Requests each client sends at each level.
    pub requests_per_client: u32,
    /// Prompt sizes, in words of filler text.
    pub prompt_words: Vec<u32>,
    /// `max_tokens` of the requests, cycled beside the prompt sizes: the
    /// `k`th fresh prompt has `prompt_words[k % len]` words and asks for
    /// `max_tokens[k % len]` tokens.
    pub max_tokens: Vec<u32>,
    /// How long one request may take.
    pub timeout: Duration,
}

impl Default for Plan {
    fn default() -> Self {
        Plan {
            model: "default".into(),
            max_concurrency: 4,
            requests_per_client: 10,
            // A short prompt with a long answer, a long prompt with a short
            // one: decode and prefill each dominate some request.
            prompt_words: vec![4, 40, 160],
            max_tokens: vec![256, 24, 8],
            timeout: Duration::from_secs(120),
        }
    }
}

/// The most clients, requests per client and prompt words a plan may ask
/// for: a calibration stays a few hundred requests.
pub const MAX_CONCURRENCY: u32 = 64;
/// See [`MAX_CONCURRENCY`].
pub const MAX_REQUESTS_PER_CLIENT: u32 = 1000;
/// See [`MAX_CONCURRENCY`].
pub const MAX_PROMPT_WORDS: u32 = 100_000;

/// One timed answer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Clients busy when it was sent.
    pub concurrency: u32,
    /// Its prompt tokens, as the server counted them.
    pub prompt_tokens: u64,
    /// Of those, the tokens the server's prompt cache held
    /// (`usage.prompt_tokens_details.cached_tokens`; 0 when it says none).
    pub cached_tokens: u64,
    /// Its output tokens, as the server counted them.
    pub completion_tokens: u64,
    /// The `max_tokens` it asked for.
    pub max_tokens: u32,
    /// Seconds from the start of the measurement to sending it.
    pub sent_at_s: f64,
    /// Seconds from sending to the whole answer.
    pub latency_s: f64,
    /// What the server says it spent on it, when it says (llama.cpp).
    pub timings: Option<Timings>,
}

/// The longest `timings` a sample keeps (an hour); a longer one, or one
/// not a number, is left out.
const MOST_TIMING_MS: f64 = 3_600_000.0;

/// What llama.cpp says it spent on a request (its answer's `timings`):
/// processing the prompt, up to the first token, and generating the rest.
/// A request alone on the server splits its latency by them, which the
/// latency alone cannot: a step's fixed cost from its cost per token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timings {
    /// `timings.prompt_ms`: the prompt, up to the first token.
    pub prompt_ms: f64,
    /// `timings.predicted_ms`: from the first token to the last.
    pub predicted_ms: f64,
}

/// The `timings.{field}` of llama.cpp's answer `v`, in milliseconds, if it
/// is there, a number and at most [`MOST_TIMING_MS`].
pub(crate) fn timing_ms(v: &Value, field: &str) -> Option<f64> {
    v.pointer(&format!("/timings/{field}"))
        .and_then(Value::as_f64)
        .filter(|t| t.is_finite() && (0.0..=MOST_TIMING_MS).contains(t))
}

impl Sample {
    /// The prompt tokens the server prefilled: those its cache did not hold.
    pub fn prefilled(&self) -> u64 {
        self.prompt_tokens.saturating_sub(self.cached_tokens).max(1)
    }
}

/// What the server says of itself (llama.cpp's `/props`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Props {
    /// Decode slots (`total_slots`).
    pub slots: Option<u32>,
    /// Context per slot (`default_generation_settings.n_ctx`).
    pub slot_context: Option<u64>,
}

/// Everything measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Measurement {
    /// What the server said of itself.
    pub props: Props,
    /// Every answered request.
    pub samples: Vec<Sample>,
    /// Requests that got no `200` with token counts.
    pub failed: u32,
}

/// Why a calibration could not be made.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CalibrateError {
    /// The plan asks for nothing or for too much.
    #[error("the plan's {field} {problem}")]
    Plan {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// Too few requests were answered to fit anything.
    #[error("{failed} of {sent} requests failed (last: {last}); nothing to fit")]
    Unanswered {
        /// Requests that failed.
        failed: u32,
        /// Requests sent.
        sent: u32,
        /// What the last failure was.
        last: String,
    },
    /// The answers do not vary enough to tell the step's terms apart.
    #[error("the answers cannot be fitted: {0}")]
    Degenerate(String),
}

impl Plan {
    /// The plan's numbers in range.
    pub fn check(&self) -> Result<(), CalibrateError> {
        let bad = |field, problem: String| Err(CalibrateError::Plan { field, problem });
        if !(1..=MAX_CONCURRENCY).contains(&self.max_concurrency) {
            return bad(
                "max_concurrency",
                format!("must be 1 to {MAX_CONCURRENCY}, got {}", self.max_concurrency),
            );
        }
        if !(2..=MAX_REQUESTS_PER_CLIENT).contains(&self.requests_per_client) {
            return bad(
                "requests_per_client",
                format!(
                    "must be 2 to {MAX_REQUESTS_PER_CLIENT}, got {}",
                    self.requests_per_client
                ),
            );
        }
        if self.prompt_words.is_empty() || self.prompt_words.iter().any(|w| !(1..=MAX_PROMPT_WORDS).contains(w)) {
            return bad(
                "prompt_words",
                format!(
                    "must be 1 to {MAX_PROMPT_WORDS} words each, got {:?}",
                    self.prompt_words
                ),
            );
        }
        if self.max_tokens.is_empty() || self.max_tokens.contains(&0) {
            return bad("max_tokens", format!("must be positive, got {:?}", self.max_tokens));
        }
        if self.timeout.is_zero() {
            return bad("timeout", "must be positive".into());
        }
        Ok(())
    }

    /// The request body of client `client`'s `n`th request at a level: a
    /// prompt that starts with the measurement's `salt` and its own numbers
    /// (so no server reuses a cached prefix of another request, or of an
    /// earlier measurement's) and a JSON-schema answer, as workers ask.
    /// Each odd request sends its client's previous prompt again, so a
    /// server with a prompt cache prefills almost none of it: those
    /// requests measure what a request costs beyond its prompt tokens.
    /// Every client of a level sends the same sizes in the same turn, so
    /// their requests run side by side from start to end: what a step of
    /// several sequences costs is then measured, not inferred.
    pub(crate) fn body(&self, salt: u32, level: u32, client: u32, n: u32) -> (Vec<u8>, u32) {
        let n = n - n % 2;
        let turn = (n / 2) as usize;
        let words = self.prompt_words[turn % self.prompt_words.len()];
        let max_tokens = self.max_tokens[turn % self.max_tokens.len()];
        let mut text = format!("Request {salt:08x}.{level}.{client}.{n}. Extract the entity from:");
        for i in 0..words {
            text.push(' ');
            text.push_str(FILLER[(i as usize + n as usize) % FILLER.len()]);
        }
        let body = json!({
            "model": self.model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "Extraction",
                "schema": {"type": "object", "properties": {
                    "name": {"type": "string"}, "confidence": {"type": "number"}
                }, "required": ["name", "confidence"]}
            }}
        });
        (body.to_string().into_bytes(), max_tokens)
    }
}

const FILLER: [&str; 12] = [
    "Ada", "Lovelace", "wrote", "the", "first", "program", "for", "an", "engine", "that", "was", "never",
];

/// Reads `/props` (when the server has one), then sends the plan's requests
/// at each level of concurrency, one level after another.
pub async fn measure(endpoint: Arc<dyn Endpoint>, plan: &Plan) -> Result<Measurement, CalibrateError> {
    plan.check()?;
    let props = props(endpoint.as_ref(), plan.timeout).await;
    let top = props
        .slots
        .map_or(plan.max_concurrency, |s| s.clamp(1, plan.max_concurrency));
    let mut samples = Vec::new();
    let (mut failed, mut sent, mut last) = (0u32, 0u32, String::new());
    // A server keeps the prompts it has seen (llama.cpp in its slots and
    // in host memory), so a measurement that repeated an earlier one's
    // prompts would find them all cached and measure no prefill.
    let salt = rand_chacha::ChaCha8Rng::from_os_rng().next_u32();
    let origin = tokio::time::Instant::now();
    for level in 1..=top {
        // Each answer is kept as it comes, so a client that dies takes
        // only its request in flight with it.
        let answers = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut clients = tokio::task::JoinSet::new();
        for client in 0..level {
            let (endpoint, plan, answers) = (endpoint.clone(), plan.clone(), answers.clone());
            clients.spawn(async move {
                for n in 0..plan.requests_per_client {
                    let answer = one(endpoint.as_ref(), &plan, origin, (salt, level, client, n)).await;
                    answers.lock().unwrap_or_else(|p| p.into_inner()).push(answer);
                }
            });
        }
        while let Some(joined) = clients.join_next().await {
            if let Err(e) = joined {
                sent += 1;
                failed += 1;
                last = format!("a client stopped: {e}");
            }
        }
        for result in std::mem::take(&mut *answers.lock().unwrap_or_else(|p| p.into_inner())) {
            sent += 1;
            match result {
                Ok(sample) => samples.push(sample),
                Err(e) => {
                    failed += 1;
                    last = e;
                }
            }
        }
    }
    if samples.len() < 8 {
        return Err(CalibrateError::Unanswered { failed, sent, last });
    }
    Ok(Measurement { props, samples, failed })
}

/// The server's `/props`, or nothing when it has none or says no more.
async fn props(endpoint: &dyn Endpoint, timeout: Duration) -> Props {
    let Ok(response) = endpoint.get("/props", timeout).await else {
        return Props::default();
    };
    let Ok(v) = serde_json::from_slice::<Value>(&response.body) else {
        return Props::default();
    };
    if response.status != 200 {
        return Props::default();
    }
    Props {
        slots: v
            .get("total_slots")
            .and_then(Value::as_u64)
            .and_then(|s| u32::try_from(s).ok())
            .filter(|s| *s > 0),
        slot_context: v
            .pointer("/default_generation_settings/n_ctx")
            .and_then(Value::as_u64)
            .filter(|n| *n > 0),
    }
}

/// One request, timed.
async fn one(
    endpoint: &dyn Endpoint,
    plan: &Plan,
    origin: tokio::time::Instant,
    (salt, level, client, n): (u32, u32, u32, u32),
) -> Result<Sample, String> {
    let (body, max_tokens) = plan.body(salt, level, client, n);
    let start = tokio::time::Instant::now();
    let sent_at_s = start.duration_since(origin).as_secs_f64();
    let response = endpoint
        .post("/v1/chat/completions", body, plan.timeout)
        .await
        .map_err(|e| e.to_string())?;
    let latency_s = start.elapsed().as_secs_f64();
    if response.status != 200 {
        return Err(format!("HTTP {}", response.status));
    }
    let v: Value = serde_json::from_slice(&response.body).map_err(|e| format!("a body that is not JSON: {e}"))?;
    let count = |field: &str| v.pointer(&format!("/usage/{field}")).and_then(Value::as_u64);
    let timings = timing_ms(&v, "prompt_ms")
        .zip(timing_ms(&v, "predicted_ms"))
        .map(|(prompt_ms, predicted_ms)| Timings {
            prompt_ms,
            predicted_ms,
        });
    match (count("prompt_tokens"), count("completion_tokens")) {
        // A server may say anything; a request never gets more tokens than
        // it asked for, and the fit replays one step a token.
        (Some(prompt_tokens), Some(completion_tokens)) => Ok(Sample {
            concurrency: level,
            prompt_tokens,
            cached_tokens: count("prompt_tokens_details/cached_tokens")
                .unwrap_or(0)
                .min(prompt_tokens.saturating_sub(1)),
            completion_tokens: completion_tokens.min(u64::from(max_tokens)),
            max_tokens,
            sent_at_s,
            latency_s,
            timings,
        }),
        _ => Err("an answer without usage.prompt_tokens and usage.completion_tokens".into()),
    }
}

/// The fitted model and how well it predicts what was measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    /// What the server said of itself.
    pub props: Props,
    /// The fitted step model.
    pub step: LinearStep,
    /// Requests the fit rests on.
    pub samples: usize,
    /// Requests that failed while measuring.
    pub failed: u32,
    /// The most clients at once.
    pub max_concurrency: u32,
    /// Mean absolute error of the predicted latencies, relative to the
    /// measured ones.
    pub mean_error: f64,
    /// The largest such error.
    pub worst_error: f64,
    /// Mean output tokens of the answers that were not cut off by their
    /// `max_tokens` (the model's own length), if any.
    pub output_tokens: Option<f64>,
    /// Mean prompt tokens.
    pub prompt_tokens: f64,
}

/// Fits a [`LinearStep`] to `measurement`: the step whose engine, given
/// the requests as they were sent, finishes each when it was measured to
/// finish (least squared relative error, by Nelder–Mead restarted where
/// it stops, from three splits of the decode cost that least squares
/// finds in the one-client requests).
pub fn fit(measurement: &Measurement) -> Result<Calibration, CalibrateError> {
    let samples = &measurement.samples;
    let slots = slots_of(measurement);
    // One client: latency = prefill_base + P·per_token + O·(decode_base +
    // decode_per_sequence) + (O·N + O·(O − 1)/2)·per_context_token.
    let alone: Vec<([f64; TERMS], f64)> = samples
        .iter()
        .filter(|s| s.concurrency == 1)
        .map(|s| {
            let o = s.completion_tokens.max(1) as f64;
            let context = o * s.prompt_tokens as f64 + o * (o - 1.0) / 2.0;
            ([1.0, s.prefilled() as f64, o, 0.0, context], s.latency_s * 1000.0)
        })
        .collect();
    let alone = nonnegative_least_squares(&alone)?;
    // One client sees only the sum of the two decode terms; where it
    // splits is for the search to find, from each end and the middle.
    let split = |base: f64| [alone[0], alone[1], alone[2] * base, alone[2] * (1.0 - base), alone[4]];
    let starts = [split(0.5), split(0.0), split(1.0)];
    let best = minimise(&starts, |x| misfit(samples, slots, &step_of(x)));
    let step = step_of(&best);
    let errors: Vec<f64> = replay(samples, slots, &step)
        .iter()
        .zip(samples)
        .map(|(p, s)| relative_error(*p, s).abs())
        .collect();
    let uncapped: Vec<f64> = samples
        .iter()
        .filter(|s| s.completion_tokens < u64::from(s.max_tokens))
        .map(|s| s.completion_tokens as f64)
        .collect();
    Ok(Calibration {
        props: measurement.props,
        step,
        samples: samples.len(),
        failed: measurement.failed,
        max_concurrency: samples.iter().map(|s| s.concurrency).max().unwrap_or(1),
        mean_error: errors.iter().sum::<f64>() / errors.len().max(1) as f64,
        worst_error: errors.iter().copied().fold(0.0, f64::max),
        output_tokens: (!uncapped.is_empty()).then(|| uncapped.iter().sum::<f64>() / uncapped.len() as f64),
        prompt_tokens: samples.iter().map(|s| s.prompt_tokens as f64).sum::<f64>() / samples.len().max(1) as f64,
    })
}

/// The server's slots as `/props` said them, or else the most requests
/// measured at once.
fn slots_of(measurement: &Measurement) -> u32 {
    measurement
        .props
        .slots
        .unwrap_or_else(|| measurement.samples.iter().map(|s| s.concurrency).max().unwrap_or(1))
}

/// Each measured request beside the latency `calibration`'s step gives it,
/// as CSV with a header: what a reader checks a fit by, request by request
/// (which sizes or levels of concurrency it misses).
pub fn samples_csv(measurement: &Measurement, calibration: &Calibration) -> String {
    let predicted = replay(&measurement.samples, slots_of(measurement), &calibration.step);
    let mut out = String::from(
        "concurrency,prompt_tokens,cached_tokens,completion_tokens,max_tokens,sent_at_s,latency_s,predicted_s,error,prompt_ms,predicted_ms\n",
    );
    for (s, p) in measurement.samples.iter().zip(predicted) {
        let error = relative_error(p, s);
        let (prompt_ms, predicted_ms) = s.timings.map_or((String::new(), String::new()), |t| {
            (format!("{:.3}", t.prompt_ms), format!("{:.3}", t.predicted_ms))
        });
        out.push_str(&format!(
            "{},{},{},{},{},{:.6},{:.6},{:.6},{:.4},{prompt_ms},{predicted_ms}\n",
            s.concurrency,
            s.prompt_tokens,
            s.cached_tokens,
            s.completion_tokens,
            s.max_tokens,
            s.sent_at_s,
            s.latency_s,
            p,
            error,
        ));
    }
    out
}

/// How far a predicted latency of `predicted` seconds is from `sample`'s,
/// relative to it.
fn relative_error(predicted: f64, sample: &Sample) -> f64 {
    (predicted - sample.latency_s) / sample.latency_s.max(1e-6)
}

/// What the fit minimises: the sum of the squared relative errors of the
/// latencies `step`'s engine gives `samples` on `slots` slots, and of the
/// prompt and generation times it gives each request sent alone against
/// the server's own [`Timings`].
fn misfit(samples: &[Sample], slots: u32, step: &LinearStep) -> f64 {
    let latencies: f64 = replay(samples, slots, step)
        .iter()
        .zip(samples)
        .map(|(p, s)| relative_error(*p, s).powi(2))
        .sum();
    let timings: f64 = samples
        .iter()
        .filter_map(|s| timing_errors(s, step))
        .map(|(prompt, generation)| prompt.powi(2) + generation.powi(2))
        .sum();
    latencies + timings
}

/// For a request sent alone, with the server's [`Timings`]: the relative
/// errors of the time `step` gives its prompt (its first step: the
/// prefill, and the decode of its first token) and its generation (one
/// decode step for each later token, the context growing by one a token).
/// A generation of one token has no time to compare (0).
fn timing_errors(sample: &Sample, step: &LinearStep) -> Option<(f64, f64)> {
    let t = sample.timings.filter(|_| sample.concurrency == 1)?;
    let prompt = sample.prompt_tokens as f64;
    let first = step.step_ms(sample.prefilled(), 1, prompt);
    // Steps 1 to O − 1, the k-th holding P + k tokens: in closed form.
    let later = sample.completion_tokens.saturating_sub(1) as f64;
    let rest = later * step.decode_ms(1.0, prompt) + step.decode_per_context_token_ms * later * (later + 1.0) / 2.0;
    let relative = |predicted: f64, measured: f64| {
        if measured > 0.01 {
            (predicted - measured) / measured
        } else {
            0.0
        }
    };
    Some((relative(first, t.prompt_ms), relative(rest, t.predicted_ms)))
}

/// `step` with its cost per sequence set so that a request of `prompt`
/// tokens generating `output` alone takes `ms_per_token` (llama.cpp's
/// `timings.predicted_ms` of it over its tokens after the first) for each
/// token after its first, as [`timing_errors`] counts them; the other
/// terms as they were. A fit balances every request it measured, at every
/// concurrency, and can miss one request by more than its mean error: on a
/// 2-core EPYC VM five fits within 8–12 % of their own requests were off
/// the workers' request, alone, by −27 % to +29 % a token against
/// llama.cpp's timings of it. A prediction is about that request, so it
/// runs at that request's pace; the difference goes to the per-sequence
/// term, where llama.cpp's timings put nearly all of a step's cost (two
/// sequences decoding together take twice one's time). `None` when
/// `output` leaves no later token to time, the pace is not a positive
/// number, or the step would no longer be one ([`LinearStep::check`]).
pub(crate) fn paced(step: LinearStep, ms_per_token: f64, prompt: u64, output: u64) -> Option<LinearStep> {
    let later = output.checked_sub(1).filter(|n| *n > 0)? as f64;
    if !ms_per_token.is_finite() || ms_per_token <= 0.0 {
        return None;
    }
    // The mean context of those steps: P + k for k = 1 … O − 1.
    let context = prompt as f64 + (later + 1.0) / 2.0;
    let others = step.decode_base_ms + step.decode_per_context_token_ms * context;
    let paced = LinearStep {
        decode_per_sequence_ms: (ms_per_token - others).clamp(0.0, MAX_STEP_MS),
        ..step
    };
    paced.check().ok().map(|()| paced)
}

/// The terms of a [`LinearStep`] the fit finds.
const TERMS: usize = 5;

/// The step whose terms are `x` (a negative term, which the search may
/// try, is taken as 0).
fn step_of(x: &[f64; TERMS]) -> LinearStep {
    LinearStep {
        prefill_base_ms: x[0].max(0.0),
        prefill_per_token_ms: x[1].max(0.0),
        decode_base_ms: x[2].max(0.0),
        decode_per_sequence_ms: x[3].max(0.0),
        decode_per_context_token_ms: x[4].max(0.0),
    }
}

/// The latency, in seconds, the engine with `step` and `slots` gives each
/// sample, sent when it was sent.
fn replay(samples: &[Sample], slots: u32, step: &LinearStep) -> Vec<f64> {
    let mut engine = Engine::new(EngineParams {
        max_seqs: slots.max(1),
        kv_tokens: u64::MAX / 4,
        max_batched_tokens: u64::MAX / 4,
        cost: StepCost::Linear(*step),
        preempt: false,
        reject_prompts_from: None,
        cached_prefix: 0,
    });
    let mut order: Vec<usize> = (0..samples.len()).collect();
    order.sort_by(|a, b| samples[*a].sent_at_s.total_cmp(&samples[*b].sent_at_s));
    let at = |s: &Sample| Duration::try_from_secs_f64(s.sent_at_s).unwrap_or_default();
    for i in order {
        let s = &samples[i];
        engine.submit_cached(
            i as u64,
            s.prompt_tokens.max(1),
            s.prompt_tokens.max(1) - s.prefilled(),
            s.completion_tokens,
            at(s),
        );
    }
    let mut events = Vec::new();
    engine.run_until(Duration::MAX, || 1.0, &mut events);
    let mut latency = vec![f64::INFINITY; samples.len()];
    for event in events {
        if let EngineEvent::Finished { id, at: end, .. } = event
            && let Some(s) = samples.get(id as usize)
        {
            latency[id as usize] = end.saturating_sub(at(s)).as_secs_f64();
        }
    }
    latency
}

/// The lowest minimum of `f` the Nelder–Mead search finds from `starts`,
/// each search restarted from where it stopped until a restart no longer
/// improves it by one part in a million (at most [`RESTARTS`] times).
///
/// The objective replays an engine, whose schedule changes in jumps as the
/// step changes, so it is piecewise smooth and a simplex can collapse on a
/// ridge short of the minimum: on latencies measured from llama-server
/// (two slots, one thread) one search stopped at a decode cost of 0.92 ms
/// a step plus 2.2 ms a sequence, an objective of 1.18, where the
/// restarted one reaches 0.48 at none a step and 3.4 ms a sequence — what
/// pairs of requests measured, a step of two costing twice a step of one.
fn minimise(starts: &[[f64; TERMS]], f: impl Fn(&[f64; TERMS]) -> f64) -> [f64; TERMS] {
    let mut best: Option<([f64; TERMS], f64)> = None;
    for &start in starts {
        let (mut x, mut fx) = (start, f(&start));
        for _ in 0..RESTARTS {
            let next = nelder_mead(x, &f);
            let fnext = f(&next);
            let improved = fnext < fx * (1.0 - 1e-6);
            if fnext < fx {
                (x, fx) = (next, fnext);
            }
            if !improved {
                break;
            }
        }
        if best.is_none_or(|(_, fb)| fx < fb) {
            best = Some((x, fx));
        }
    }
    best.map_or(starts[0], |(x, _)| x)
}

/// See [`minimise`].
const RESTARTS: usize = 8;

/// The minimum of `f` near `start`, by the Nelder–Mead simplex (reflection
/// 1, expansion 2, contraction ½, shrink ½), from a simplex that steps each
/// coordinate by half its start (or 1 where it is 0), for at most 600
/// evaluations.
fn nelder_mead(start: [f64; TERMS], f: &impl Fn(&[f64; TERMS]) -> f64) -> [f64; TERMS] {
    const N: usize = TERMS;
    let mut simplex: Vec<([f64; N], f64)> = vec![(start, f(&start))];
    for i in 0..N {
        let mut x = start;
        x[i] += if x[i].abs() > 1e-9 { x[i] / 2.0 } else { 1.0 };
        simplex.push((x, f(&x)));
    }
    let mut evaluations = N + 1;
    let along = |a: &[f64; N], b: &[f64; N], t: f64| -> [f64; N] { std::array::from_fn(|i| a[i] + t * (b[i] - a[i])) };
    while evaluations < 150 * N {
        simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (best, worst) = (simplex[0].1, simplex[N].1);
        if (worst - best).abs() <= 1e-10 * best.abs().max(1e-12) {
            break;
        }
        let centroid: [f64; N] =
            std::array::from_fn(|i| simplex[..N].iter().map(|(x, _)| x[i]).sum::<f64>() / N as f64);
        let reflected = along(&centroid, &simplex[N].0, -1.0);
        let fr = f(&reflected);
        evaluations += 1;
        if fr < simplex[0].1 {
            let expanded = along(&centroid, &simplex[N].0, -2.0);
            let fe = f(&expanded);
            evaluations += 1;
            simplex[N] = if fe < fr { (expanded, fe) } else { (reflected, fr) };
        } else if fr < simplex[N - 1].1 {
            simplex[N] = (reflected, fr);
        } else {
            let contracted = along(&centroid, &simplex[N].0, 0.5);
            let fc = f(&contracted);
            evaluations += 1;
            if fc < simplex[N].1 {
                simplex[N] = (contracted, fc);
            } else {
                let best = simplex[0].0;
                for point in simplex.iter_mut().skip(1) {
                    point.0 = along(&best, &point.0, 0.5);
                    point.1 = f(&point.0);
                }
                evaluations += N;
            }
        }
    }
    simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
    simplex[0].0
}

/// Least squares with every coefficient at least 0: the unconstrained
/// solution over each subset of the terms (the others held at 0), the best
/// of those that are all non-negative. Five terms make 32 subsets.
fn nonnegative_least_squares(rows: &[([f64; TERMS], f64)]) -> Result<[f64; TERMS], CalibrateError> {
    let mut best: Option<([f64; TERMS], f64)> = None;
    for mask in 1u32..(1 << TERMS) {
        let terms: Vec<usize> = (0..TERMS).filter(|i| mask & (1 << i) != 0).collect();
        let Some(solution) = solve_subset(rows, &terms) else {
            continue;
        };
        if solution.iter().any(|b| *b < 0.0) {
            continue;
        }
        let residual: f64 = rows
            .iter()
            .map(|(x, y)| {
                let predicted: f64 = x.iter().zip(solution).map(|(x, b)| x * b).sum();
                (predicted - y).powi(2)
            })
            .sum();
        if best.is_none_or(|(_, r)| residual < r) {
            best = Some((solution, residual));
        }
    }
    best.map(|(b, _)| b).ok_or_else(|| {
        CalibrateError::Degenerate("no combination of the terms has a non-negative least-squares fit".into())
    })
}

/// The least-squares coefficients of `terms` (the rest 0), by the normal
/// equations; `None` when they are singular.
fn solve_subset(rows: &[([f64; TERMS], f64)], terms: &[usize]) -> Option<[f64; TERMS]> {
    let k = terms.len();
    let mut a = vec![vec![0.0; k + 1]; k];
    for (x, y) in rows {
        for (i, &ti) in terms.iter().enumerate() {
            for (j, &tj) in terms.iter().enumerate() {
                a[i][j] += x[ti] * x[tj];
            }
            a[i][k] += x[ti] * y;
        }
    }
    // Gaussian elimination with partial pivoting.
    for col in 0..k {
        let pivot = (col..k).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        let scale = a.iter().map(|r| r[col].abs()).fold(0.0, f64::max);
        if a[pivot][col].abs() <= 1e-12 * scale.max(1e-300) {
            return None;
        }
        a.swap(col, pivot);
        let pivot_row = a[col].clone();
        for (row, r) in a.iter_mut().enumerate() {
            if row != col {
                let f = r[col] / pivot_row[col];
                for (x, p) in r.iter_mut().zip(&pivot_row).skip(col) {
                    *x -= f * p;
                }
            }
        }
    }
    let mut out = [0.0; TERMS];
    for (i, &t) in terms.iter().enumerate() {
        out[t] = a[i][k] / a[i][i];
        if !out[t].is_finite() {
            return None;
        }
    }
    Some(out)
}

impl Calibration {
    /// The `[[servers]]` section for a scenario: `kind` (llama.cpp when the
    /// server answered `/props`, else vLLM's engine), its slots and context,
    /// its output length and the fitted step, with the fit's error in a
    /// comment above.
    pub fn server_section(&self, name: &str, source: &str) -> String {
        let round = |v: f64| (v * 1e4).round() / 1e4;
        let mut out = format!(
            "# calibrated against {source}: {} requests ({} failed), 1 to {} clients at once;\n\
             # the fitted step predicts their latencies within {:.1} % on average, {:.1} % at worst.\n\
             [[servers]]\nname = \"{name}\"\n",
            self.samples,
            self.failed,
            self.max_concurrency,
            self.mean_error * 100.0,
            self.worst_error * 100.0,
        );
        match self.props.slots {
            Some(slots) => {
                out.push_str(&format!("kind = \"llama_cpp\"\nslots = {slots}\n"));
                if let Some(n_ctx) = self.props.slot_context {
                    out.push_str(&format!(
                        "context_tokens = {}\n",
                        n_ctx.saturating_mul(u64::from(slots))
                    ));
                }
            }
            None => out.push_str(&format!("kind = \"vllm\"\nmax_seqs = {}\n", self.max_concurrency)),
        }
        out.push_str(&format!("prompt_tokens = {}\n", self.prompt_tokens.round() as u64));
        if let Some(o) = self.output_tokens {
            out.push_str(&format!("output_tokens = {}\n", o.round().max(1.0) as u64));
        }
        let s = self.step;
        out.push_str(&format!(
            "step_ms = {{ prefill_base_ms = {}, prefill_per_token_ms = {}, decode_base_ms = {}, decode_per_sequence_ms = {}, decode_per_context_token_ms = {} }}\n",
            round(s.prefill_base_ms),
            round(s.prefill_per_token_ms),
            round(s.decode_base_ms),
            round(s.decode_per_sequence_ms),
            (s.decode_per_context_token_ms * 1e7).round() / 1e7,
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests sent one at a time, then in pairs, then in threes, each
    /// with the latency `step`'s engine gives it; every odd round repeats
    /// the round before it, its prompt all cached but one token.
    fn engine_samples(step: &LinearStep, slots: u32) -> Vec<Sample> {
        let shapes = [(20, 5), (200, 30), (80, 60), (120, 10), (300, 20), (50, 40)];
        let mut samples = Vec::new();
        let mut at = 0.0;
        for level in 1..=3u32 {
            for round in 0..6usize {
                for k in 0..level as usize {
                    let (p, o) = shapes[(round - round % 2 + k) % shapes.len()];
                    samples.push(Sample {
                        concurrency: level,
                        prompt_tokens: p,
                        cached_tokens: if round % 2 == 1 { p - 1 } else { 0 },
                        completion_tokens: o,
                        max_tokens: 256,
                        sent_at_s: at,
                        latency_s: 0.0,
                        timings: None,
                    });
                }
                at += 10.0;
            }
        }
        // The engine prefills what the cache did not hold, and holds the
        // whole prompt as context.
        let latencies = replay(&samples, slots, step);
        for (s, l) in samples.iter_mut().zip(latencies) {
            s.latency_s = l;
        }
        samples
    }

    /// Half the requests repeat a prompt the server had cached, so a fit
    /// that charged them their whole prompt could not find the step.
    #[test]
    fn the_fit_recovers_the_step_that_made_the_latencies() {
        let step = LinearStep {
            prefill_base_ms: 12.0,
            prefill_per_token_ms: 0.4,
            decode_base_ms: 3.0,
            decode_per_sequence_ms: 7.0,
            decode_per_context_token_ms: 0.02,
        };
        let measurement = Measurement {
            props: Props {
                slots: Some(4),
                slot_context: Some(1024),
            },
            samples: engine_samples(&step, 4),
            failed: 0,
        };
        let fitted = fit(&measurement).unwrap();
        for (got, want) in [
            (fitted.step.prefill_base_ms, 12.0),
            (fitted.step.prefill_per_token_ms, 0.4),
            (fitted.step.decode_base_ms, 3.0),
            (fitted.step.decode_per_sequence_ms, 7.0),
            (fitted.step.decode_per_context_token_ms, 0.02),
        ] {
            assert!((got - want).abs() < 0.01 * want, "{:?}", fitted.step);
        }
        assert!(fitted.mean_error < 0.001, "{fitted:?}");
        let section = fitted.server_section("cpu", "test");
        assert!(
            section.contains("kind = \"llama_cpp\"\nslots = 4\ncontext_tokens = 4096\n"),
            "{section}"
        );
    }

    #[test]
    fn a_term_the_data_would_make_negative_is_held_at_zero() {
        // Latency that falls with the prompt: no non-negative fit uses it.
        let rows: Vec<([f64; TERMS], f64)> = (1..=12)
            .map(|i| ([1.0, 10.0 * f64::from(i), 20.0, 0.0, 0.0], 200.0 - f64::from(i)))
            .collect();
        let b = nonnegative_least_squares(&rows).unwrap();
        assert_eq!(b[1], 0.0);
        assert!(b.iter().all(|b| *b >= 0.0), "{b:?}");
        assert!((b[0] + 20.0 * b[2] - 193.5).abs() < 1e-6, "the mean is kept: {b:?}");
    }

    fn not_found() -> HttpResponse {
        HttpResponse {
            status: 404,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// Answers every post with token counts, has no `/props`, keeps the
    /// prompt of each request, and panics on its `panic_at`th post (0:
    /// never).
    #[derive(Default)]
    struct Flaky {
        posts: std::sync::atomic::AtomicU32,
        panic_at: u32,
        prompts: std::sync::Mutex<Vec<String>>,
    }

    impl Endpoint for Flaky {
        fn get<'a>(&'a self, _: &'a str, _: Duration) -> BoxFuture<'a, Result<HttpResponse, TransportError>> {
            Box::pin(async { Ok(not_found()) })
        }

        fn post<'a>(
            &'a self,
            _: &'a str,
            body: Vec<u8>,
            _: Duration,
        ) -> BoxFuture<'a, Result<HttpResponse, TransportError>> {
            Box::pin(async move {
                let n = self.posts.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                assert!(n != self.panic_at, "the endpoint fails as a bug would");
                let v: Value = serde_json::from_slice(&body).unwrap();
                let prompt = v.pointer("/messages/0/content").and_then(Value::as_str).unwrap();
                self.prompts.lock().unwrap().push(prompt.to_owned());
                Ok(HttpResponse {
                    status: 200,
                    headers: Vec::new(),
                    body: br#"{"usage":{"prompt_tokens":40,"completion_tokens":20}}"#.to_vec(),
                })
            })
        }
    }

    #[tokio::test]
    async fn a_client_that_dies_keeps_the_answers_it_had_and_counts_as_a_failure() {
        let endpoint = Arc::new(Flaky {
            panic_at: 5,
            ..Flaky::default()
        });
        let plan = Plan {
            max_concurrency: 2,
            ..Plan::default()
        };
        let measured = measure(endpoint, &plan).await.unwrap();
        // Level 1: four answers, then the fifth request's panic ends the
        // client; level 2: both clients' ten.
        assert_eq!(measured.samples.len(), 4 + 2 * 10);
        assert_eq!(measured.failed, 1);
        assert_eq!(measured.props, Props::default(), "no /props");
    }

    /// llama.cpp keeps the prompts it has seen: a calibration measured
    /// again on the same server with the same prompts found every one of
    /// them cached, and four of five such fits put no cost on a sequence.
    #[tokio::test]
    async fn a_measurement_taken_again_sends_none_of_the_prompts_of_the_first() {
        let plan = Plan {
            max_concurrency: 2,
            requests_per_client: 4,
            ..Plan::default()
        };
        let mut seen = Vec::new();
        for _ in 0..2 {
            let endpoint = Arc::new(Flaky::default());
            measure(endpoint.clone(), &plan).await.unwrap();
            let prompts = std::mem::take(&mut *endpoint.prompts.lock().unwrap());
            assert_eq!(prompts.len(), 4 + 2 * 4);
            seen.push(prompts.into_iter().collect::<std::collections::BTreeSet<_>>());
        }
        assert!(seen[0].is_disjoint(&seen[1]), "{:?}", seen[0].intersection(&seen[1]));
    }

    /// A step of two sequences is measured only where two requests decode
    /// together from start to end: the same prompt and answer sizes, sent
    /// at once.
    #[test]
    fn the_clients_of_a_level_send_the_same_sizes_in_each_turn() {
        let plan = Plan::default();
        let size = |client, n| {
            let (body, max_tokens) = plan.body(7, 3, client, n);
            let v: Value = serde_json::from_slice(&body).unwrap();
            let text = v
                .pointer("/messages/0/content")
                .and_then(Value::as_str)
                .unwrap()
                .to_owned();
            (text.split(' ').count(), max_tokens)
        };
        for n in 0..plan.requests_per_client {
            assert_eq!(size(0, n), size(1, n), "request {n}");
            assert_eq!(size(0, n), size(2, n), "request {n}");
        }
        // And the turns cover every size: a long answer to a short prompt,
        // a short answer to a long one.
        let sizes: std::collections::BTreeSet<_> = (0..6).map(|n| size(0, n).1).collect();
        assert_eq!(sizes, [8, 24, 256].into());
    }

    #[test]
    fn plans_out_of_range_name_their_field() {
        let field = |plan: Plan| match plan.check() {
            Err(CalibrateError::Plan { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            field(Plan {
                max_concurrency: 0,
                ..Plan::default()
            }),
            "max_concurrency"
        );
        assert_eq!(
            field(Plan {
                requests_per_client: 1,
                ..Plan::default()
            }),
            "requests_per_client"
        );
        assert_eq!(
            field(Plan {
                prompt_words: vec![],
                ..Plan::default()
            }),
            "prompt_words"
        );
        assert_eq!(
            field(Plan {
                max_tokens: vec![0],
                ..Plan::default()
            }),
            "max_tokens"
        );
    }

    /// What the plan's first two levels measured from a real llama-server
    /// (llama.cpp of llama-cpp-python 0.3.36, built by `lab/setup.sh`;
    /// `lab-512x8.gguf`, `--parallel 2 --threads 1`, on a 2-core machine):
    /// concurrency, prompt tokens, cached, output tokens, `max_tokens`,
    /// seconds sent after the start, latency in seconds.
    const LLAMA_SERVER: &[(u32, u64, u64, u64, u32, f64, f64)] = &[
        (1, 82, 0, 8, 8, 0.001, 0.111),
        (1, 82, 81, 8, 8, 0.112, 0.035),
        (1, 281, 0, 8, 8, 0.147, 0.207),
        (1, 281, 280, 8, 8, 0.355, 0.048),
        (1, 938, 20, 8, 8, 0.402, 0.705),
        (1, 938, 937, 8, 8, 1.107, 0.083),
        (1, 78, 20, 24, 24, 1.191, 0.153),
        (1, 78, 77, 24, 24, 1.344, 0.098),
        (1, 279, 20, 24, 24, 1.442, 0.29),
        (1, 279, 278, 24, 24, 1.732, 0.145),
        (2, 82, 16, 8, 8, 1.877, 0.291),
        (2, 280, 16, 8, 8, 1.878, 0.292),
        (2, 82, 81, 8, 8, 2.168, 0.085),
        (2, 280, 279, 8, 8, 2.17, 0.084),
        (2, 281, 20, 8, 8, 2.253, 0.886),
        (2, 941, 20, 8, 8, 2.254, 0.894),
        (2, 281, 280, 8, 8, 3.139, 0.153),
        (2, 941, 940, 8, 8, 3.148, 0.144),
        (2, 938, 20, 8, 8, 3.292, 0.767),
        (2, 938, 937, 8, 8, 4.059, 0.121),
        (2, 80, 20, 24, 24, 3.292, 0.987),
        (2, 78, 20, 24, 24, 4.18, 0.241),
        (2, 80, 79, 24, 24, 4.28, 0.194),
        (2, 78, 77, 24, 24, 4.421, 0.368),
        (2, 276, 20, 24, 24, 4.474, 0.537),
        (2, 279, 20, 24, 24, 4.79, 0.42),
        (2, 276, 275, 24, 24, 5.011, 0.274),
        (2, 279, 278, 24, 24, 5.21, 0.965),
        (2, 939, 20, 24, 24, 5.285, 0.965),
        (2, 939, 938, 24, 24, 6.25, 0.259),
    ];

    /// [`LLAMA_SERVER`] as the measurement `measure` would have made.
    fn llama_server_measurement() -> Measurement {
        let samples = LLAMA_SERVER
            .iter()
            .map(
                |&(concurrency, prompt_tokens, cached_tokens, completion_tokens, max_tokens, sent_at_s, latency_s)| {
                    Sample {
                        concurrency,
                        prompt_tokens,
                        cached_tokens,
                        completion_tokens,
                        max_tokens,
                        sent_at_s,
                        latency_s,
                        timings: None,
                    }
                },
            )
            .collect();
        Measurement {
            props: Props {
                slots: Some(2),
                ..Props::default()
            },
            samples,
            failed: 0,
        }
    }

    /// On that server two requests decoding together took 10.8 ms a token
    /// each, one alone 5.3 ms (its own `timings.predicted_per_token_ms`):
    /// a step of two costs twice a step of one, all of it per sequence. A
    /// single search from the middle of the decode sum stopped on these at
    /// 0.92 ms a step plus 2.2 ms a sequence; in the laboratory such a fit
    /// (2.1 + 1.1·B ms) made a pair's step 40 % too cheap, and the burst of
    /// `scenarios/lab/overload-burst.toml` drained in 1.7 s simulated
    /// against 2.6 s measured.
    #[test]
    fn the_fit_of_a_real_server_charges_its_decode_per_sequence() {
        let measurement = llama_server_measurement();
        let c = fit(&measurement).unwrap();
        let step = c.step;
        assert!(
            step.decode_per_sequence_ms > 4.0 * step.decode_base_ms,
            "a step of two should cost about twice a step of one: {step:?}"
        );
        assert!(c.mean_error < 0.12, "mean error {}: {step:?}", c.mean_error);
        // The fit is no worse than the step with its decode base moved
        // into the per-sequence cost, nor than with it moved out.
        let sum = step.decode_base_ms + step.decode_per_sequence_ms;
        for (base, per_sequence) in [(0.0, sum), (sum / 2.0, sum / 2.0)] {
            let other = LinearStep {
                decode_base_ms: base,
                decode_per_sequence_ms: per_sequence,
                ..step
            };
            assert!(
                misfit(&measurement.samples, 2, &step) <= misfit(&measurement.samples, 2, &other) + 1e-9,
                "{other:?} fits better than {step:?}"
            );
        }
    }

    /// A measured request, then llama.cpp's timings of it.
    type TimedRow = (u32, u64, u64, u64, u32, f64, f64, f64, f64);

    /// The plan of the lab (two levels, six requests a client, same sizes
    /// side by side) measured from the same real llama-server, with its
    /// `timings`: concurrency, prompt tokens, cached, output tokens,
    /// `max_tokens`, seconds sent after the start, latency in seconds,
    /// `prompt_ms`, `predicted_ms`.
    const LLAMA_SERVER_TIMED: &[TimedRow] = &[
        (1, 91, 16, 27, 256, 0.0001, 0.1856, 46.004, 127.176),
        (1, 91, 90, 27, 256, 0.1858, 0.1403, 5.192, 132.656),
        (1, 290, 16, 24, 24, 0.3261, 0.3114, 158.042, 149.538),
        (1, 290, 289, 24, 24, 0.6375, 0.1585, 6.524, 148.657),
        (1, 947, 29, 8, 8, 0.7960, 0.7103, 625.049, 79.439),
        (1, 947, 946, 8, 8, 1.5064, 0.0949, 14.968, 77.390),
        (2, 91, 25, 27, 256, 1.6015, 0.3296, 77.056, 240.138),
        (2, 91, 25, 27, 256, 1.6015, 0.3297, 77.004, 240.151),
        (2, 91, 90, 27, 256, 1.9313, 0.2600, 9.186, 246.716),
        (2, 91, 90, 27, 256, 1.9311, 0.2603, 9.152, 246.709),
        (2, 290, 29, 24, 24, 2.1915, 0.5879, 151.072, 430.825),
        (2, 290, 29, 24, 24, 2.1914, 0.5938, 161.420, 277.302),
        (2, 290, 289, 24, 24, 2.7794, 0.3078, 12.281, 285.014),
        (2, 290, 289, 24, 24, 2.7852, 0.3022, 12.293, 285.059),
        (2, 947, 29, 8, 8, 3.0874, 1.4225, 1265.186, 150.654),
        (2, 947, 29, 8, 8, 3.0873, 1.4228, 1265.274, 150.602),
        (2, 947, 946, 8, 8, 4.5101, 0.1841, 21.591, 149.267),
        (2, 947, 946, 8, 8, 4.5100, 0.1843, 21.531, 149.330),
    ];

    /// [`LLAMA_SERVER_TIMED`] as `measure` would have made it, with the
    /// server's timings or without.
    fn timed_measurement(with_timings: bool) -> Measurement {
        let samples = LLAMA_SERVER_TIMED
            .iter()
            .map(
                |&(
                    concurrency,
                    prompt_tokens,
                    cached_tokens,
                    completion_tokens,
                    max_tokens,
                    sent_at_s,
                    latency_s,
                    prompt_ms,
                    predicted_ms,
                )| Sample {
                    concurrency,
                    prompt_tokens,
                    cached_tokens,
                    completion_tokens,
                    max_tokens,
                    sent_at_s,
                    latency_s,
                    timings: with_timings.then_some(Timings {
                        prompt_ms,
                        predicted_ms,
                    }),
                },
            )
            .collect();
        Measurement {
            props: Props {
                slots: Some(2),
                ..Props::default()
            },
            samples,
            failed: 0,
        }
    }

    /// Latencies alone let a step's fixed cost stand in for part of every
    /// token's: on these, a fit from them alone charged a one-token prompt
    /// tens of milliseconds and a decode step too little, so two requests
    /// overlapping in part (the workers' calls) ran too fast. The server's
    /// own timings of the requests sent alone pin both.
    #[test]
    fn the_server_s_timings_split_a_request_into_its_prompt_and_its_tokens() {
        let timed = fit(&timed_measurement(true)).unwrap().step;
        let blind = fit(&timed_measurement(false)).unwrap().step;
        // The workers' request alone on a warm slot: 1 token prefilled
        // (llama.cpp: 5.2 ms to the first token), 26 more (132.7 ms).
        let first = |s: &LinearStep| s.step_ms(1, 1, 91.0);
        let rest = |s: &LinearStep| (1..27).map(|k| s.decode_ms(1.0, 91.0 + f64::from(k))).sum::<f64>();
        let near = |got: f64, want: f64, within: f64| (got - want).abs() / want <= within;
        assert!(near(first(&timed), 5.2, 0.3), "{timed:?}: {}", first(&timed));
        assert!(near(rest(&timed), 132.7, 0.1), "{timed:?}: {}", rest(&timed));
        // Two of them decoding side by side: 246.7 ms for their 26 steps.
        let pair = (1..27)
            .map(|k| timed.decode_ms(2.0, 2.0 * (91.0 + f64::from(k))))
            .sum::<f64>();
        assert!(near(pair, 246.7, 0.15), "{timed:?}: {pair}");
        // Without the timings the first token costs several times as much,
        // and the rest too little.
        assert!(first(&blind) > 2.0 * 5.2, "{blind:?}: {}", first(&blind));
        assert!(rest(&blind) < 0.85 * 132.7, "{blind:?}: {}", rest(&blind));
    }

    /// The CSV holds every request once, with the latency the fit's own
    /// replay gives it, and errors whose mean is the fit's mean error.
    #[test]
    fn the_samples_file_sets_each_request_beside_its_predicted_latency() {
        let measurement = llama_server_measurement();
        let fitted = fit(&measurement).unwrap();
        let csv = samples_csv(&measurement, &fitted);
        let mut lines = csv.lines();
        assert_eq!(
            lines.next(),
            Some(
                "concurrency,prompt_tokens,cached_tokens,completion_tokens,max_tokens,sent_at_s,latency_s,predicted_s,error,prompt_ms,predicted_ms"
            )
        );
        // The server's timings are empty where it gave none.
        let rows: Vec<Vec<f64>> = lines
            .map(|l| {
                assert!(l.ends_with(",,"), "{l}");
                l.trim_end_matches(',')
                    .split(',')
                    .map(|v| v.parse::<f64>().unwrap())
                    .collect()
            })
            .collect();
        assert_eq!(rows.len(), LLAMA_SERVER.len());
        let predicted = replay(&measurement.samples, 2, &fitted.step);
        for ((row, sample), p) in rows.iter().zip(&measurement.samples).zip(&predicted) {
            assert_eq!(row[0], f64::from(sample.concurrency));
            assert_eq!(row[1], sample.prompt_tokens as f64);
            assert!((row[6] - sample.latency_s).abs() < 1e-6);
            assert!((row[7] - p).abs() < 1e-6, "{row:?} against {p}");
        }
        let mean = rows.iter().map(|r| r[8].abs()).sum::<f64>() / rows.len() as f64;
        assert!(
            (mean - fitted.mean_error).abs() < 1e-3,
            "{mean} against {}",
            fitted.mean_error
        );
    }

    #[test]
    fn a_step_paced_to_the_workers_request_generates_it_as_the_server_timed_it() {
        let fit = LinearStep {
            prefill_base_ms: 0.0,
            prefill_per_token_ms: 0.6,
            decode_base_ms: 0.5,
            decode_per_sequence_ms: 3.5,
            decode_per_context_token_ms: 0.008,
        };
        // 91 prompt tokens, 27 generated: 26 later steps, llama.cpp said 150 ms.
        let sample = Sample {
            concurrency: 1,
            prompt_tokens: 91,
            cached_tokens: 90,
            completion_tokens: 27,
            max_tokens: 256,
            sent_at_s: 0.0,
            latency_s: 0.2,
            timings: Some(Timings {
                prompt_ms: 5.0,
                predicted_ms: 150.0,
            }),
        };
        let generation = |step: &LinearStep| timing_errors(&sample, step).unwrap().1;
        assert!(generation(&fit) < -0.1, "the fit is the faster: {}", generation(&fit));
        let paced = paced(fit, 150.0 / 26.0, 91, 27).unwrap();
        assert!(generation(&paced).abs() < 1e-9, "{}", generation(&paced));
        // Only the per-sequence cost moves.
        assert_eq!(
            LinearStep {
                decode_per_sequence_ms: fit.decode_per_sequence_ms,
                ..paced
            },
            fit
        );
        assert!(paced.decode_per_sequence_ms > fit.decode_per_sequence_ms);
        // Nothing to pace by: one token, or no time.
        assert_eq!(paced_or_none(fit, 150.0 / 26.0, 1), None);
        assert_eq!(paced_or_none(fit, f64::NAN, 27), None);
        assert_eq!(paced_or_none(fit, 0.0, 27), None);
        // A pace the other terms already pass leaves the sequence free.
        let fast = paced_or_none(fit, 1.0, 27).unwrap();
        assert_eq!(fast.decode_per_sequence_ms, 0.0);
    }

    fn paced_or_none(step: LinearStep, ms_per_token: f64, output: u64) -> Option<LinearStep> {
        paced(step, ms_per_token, 91, output)
    }
}
