//! The continuous-batching service model: one GPU decoding every running
//! sequence together, step by step.
//!
//! A fixed service time makes timeouts come only from queueing; a real
//! server's latency grows with its batch, its KV cache and its prompts. This
//! module is that model as a pure state machine — no clock, no channel, no
//! randomness of its own — so it can be unit-tested and checked against its
//! analytic expectation. The async shell in [`super`] feeds it arrivals and
//! sleeps until its steps end.
//!
//! # The step
//!
//! The engine runs one forward pass (a *step*) after another while it has
//! work, the way vLLM's scheduler does (`vllm/v1/core/sched/scheduler.py`
//! `schedule()`), and as NVIDIA Dynamo's mocker simulates it
//! (`ai-dynamo/dynamo lib/mocker`):
//!
//! 1. **Room for the next token.** Each running sequence needs one more KV
//!    token. When the cache cannot hold them and the engine preempts (vLLM), the
//!    last admitted running sequence is preempted — its KV is freed and it goes
//!    back to the *front* of the waiting queue, to be recomputed from scratch
//!    (prompt and the tokens it had generated) when readmitted. A step that
//!    preempted admits nothing.
//! 2. **Admission.** Waiting sequences that had arrived by the step's start are
//!    admitted first come, first served while the batch has fewer than
//!    `max_seqs` sequences, the cache has room for the sequence and its next
//!    token, and the step's prefill budget (`max_batched_tokens`, at least one
//!    sequence per step) lasts. A sequence too long for the context
//!    (`reject_prompts_from`) is rejected when it would be admitted, as
//!    llama.cpp does when a task gets its slot.
//! 3. **Time.** The step's [`StepCost`] times the caller's variance factor.
//!    By default it is `prefill_ms(T) + decode_ms(u)` milliseconds, times
//!    `time_scale`: `T` is the prompt (and recomputed) tokens admitted this
//!    step, `u` the fraction of the KV cache in use. The coefficients are the
//!    Dynamo mocker's polynomial model
//!    (`ai-dynamo/dynamo@f80944a4 lib/mocker/src/common/perf_model.rs`):
//!    `prefill_ms(T) = 4.209989e-7·T² + 0.01518344·T + 16.50142` (0 when
//!    `T = 0`) and `decode_ms(u) = −25.74·u² + 54.01·u + 5.74`, floored at
//!    1 ms, with `u` clamped to `[0, 1]`. A measured server's cost is
//!    instead linear in `T` and in the batch ([`LinearStep`], as
//!    `redstring-sim calibrate` fits it).
//! 4. **Tokens.** At the step's end every running sequence has one more output
//!    token (a newly admitted one gets its first: its time to first token);
//!    a sequence that reached its output length finishes and frees its KV.
//!
//! An engine without preemption (llama.cpp's slots) never evicts: its cache
//! may be over-full, and `u` is then 1.

use std::collections::VecDeque;
use std::time::Duration;

pub use crate::scenario::kinds::LinearStep;

/// Dynamo mocker prefill polynomial, milliseconds for `tokens` new prompt
/// tokens in one forward pass (0 for none).
pub fn prefill_ms(tokens: u64) -> f64 {
    if tokens == 0 {
        return 0.0;
    }
    let t = tokens as f64;
    (4.209989e-07 * t * t + 1.518344e-02 * t + 1.650142e+01).max(0.0)
}

/// Dynamo mocker decode polynomial, milliseconds for one decode step at KV
/// utilisation `u` (clamped to `[0, 1]`), floored at 1 ms.
pub fn decode_ms(u: f64) -> f64 {
    let u = if u.is_finite() { u.clamp(0.0, 1.0) } else { 1.0 };
    (-25.74 * u * u + 54.01 * u + 5.74).max(1.0)
}

/// The engine's fixed settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineParams {
    /// Sequences decoded together at most (vLLM `--max-num-seqs`, llama.cpp
    /// `-np` slots, `OLLAMA_NUM_PARALLEL`).
    pub max_seqs: u32,
    /// KV cache capacity in tokens.
    pub kv_tokens: u64,
    /// Prompt tokens one step may prefill (at least one sequence is admitted
    /// whatever its length).
    pub max_batched_tokens: u64,
    /// What a step costs.
    pub cost: StepCost,
    /// Whether a full cache preempts running sequences (vLLM) rather than
    /// letting them run over it (llama.cpp).
    pub preempt: bool,
    /// Prompts of this many tokens or more are rejected at admission
    /// (llama.cpp's `n_ctx` check); `None` accepts any.
    pub reject_prompts_from: Option<u64>,
    /// Prompt tokens of every request that a warm slot already holds
    /// (llama.cpp's prompt cache): a sequence admitted while a slot that has
    /// served since the engine started is free prefills only the rest, and
    /// at least one token. 0 caches nothing.
    pub cached_prefix: u64,
}

/// What one forward pass costs: Dynamo's polynomials scaled, or a measured
/// linear model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StepCost {
    /// [`prefill_ms`] + [`decode_ms`], times `time_scale` (above 1 a slower
    /// GPU, below 1 a faster one).
    Polynomial {
        /// The multiplier.
        time_scale: f64,
    },
    /// A measured server's cost, linear in prompt tokens, batch and context.
    Linear(LinearStep),
}

impl StepCost {
    /// Milliseconds of a step that prefills `tokens` and decodes `batch`
    /// sequences holding `kv` tokens of a cache of `capacity`, before
    /// variance.
    pub fn step_ms(&self, tokens: u64, batch: usize, kv: u64, capacity: u64) -> f64 {
        match self {
            StepCost::Polynomial { time_scale } => {
                (prefill_ms(tokens) + decode_ms(kv as f64 / capacity.max(1) as f64)) * time_scale
            }
            StepCost::Linear(l) => l.step_ms(tokens, batch, kv as f64),
        }
    }

    /// Milliseconds a request's prefill adds to its step.
    fn prefill_ms(&self, tokens: u64) -> f64 {
        self.step_ms(tokens, 0, 0, 1) - self.step_ms(0, 0, 0, 1)
    }

    /// Milliseconds of a decode step of `batch` sequences holding `kv`
    /// tokens (a mean: fractional) of a cache of `capacity`.
    fn decode_ms(&self, batch: f64, kv: f64, capacity: u64) -> f64 {
        match self {
            StepCost::Polynomial { time_scale } => decode_ms(kv / capacity.max(1) as f64) * time_scale,
            StepCost::Linear(l) => l.decode_ms(batch, kv),
        }
    }

    /// The prefill's `a·T² + b·T + c` coefficients (scaled).
    fn prefill_coefficients(&self) -> (f64, f64, f64) {
        match self {
            StepCost::Polynomial { time_scale } => (
                4.209989e-07 * time_scale,
                1.518344e-02 * time_scale,
                1.650142e+01 * time_scale,
            ),
            StepCost::Linear(l) => (0.0, l.prefill_per_token_ms, l.prefill_base_ms),
        }
    }
}

impl EngineParams {
    /// The mean KV tokens a sequence of `prompt` + `output` tokens holds
    /// while it runs.
    fn mean_footprint(prompt: u64, output: u64) -> f64 {
        prompt as f64 + output as f64 / 2.0
    }

    /// Prompt tokens a request of `prompt` prefills on a warm slot.
    fn prefilled(&self, prompt: u64) -> u64 {
        prompt - self.cached_prefix.min(prompt.saturating_sub(1))
    }

    /// Seconds one request of `prompt` and `output` tokens takes on an idle
    /// engine whose slots are warm: its prefill step and `output` decode
    /// steps, each of a batch of one.
    pub fn unloaded_latency_s(&self, prompt: u64, output: u64) -> f64 {
        let kv = Self::mean_footprint(prompt, output);
        (self.cost.prefill_ms(self.prefilled(prompt))
            + output.max(1) as f64 * self.cost.decode_ms(1.0, kv, self.kv_tokens))
            / 1000.0
    }

    /// The largest batch the engine holds in steady state: `max_seqs`, or
    /// fewer when the cache cannot hold that many mean footprints.
    pub fn steady_batch(&self, prompt: u64, output: u64) -> f64 {
        let by_kv = self.kv_tokens as f64 / Self::mean_footprint(prompt, output).max(1.0);
        f64::from(self.max_seqs).min(by_kv).max(1.0)
    }

    /// Requests per second the engine completes in steady state at its
    /// largest batch `B`: each request needs its own prefill step and `output`
    /// decode steps shared by `B`, so `1 / (prefill + output·decode(u, B) / B)`,
    /// the prefill of what a warm slot's cache does not hold.
    /// An estimate: it ignores that prefills batch together.
    pub fn capacity_per_s(&self, prompt: u64, output: u64) -> f64 {
        let batch = self.steady_batch(prompt, output);
        let kv = batch * Self::mean_footprint(prompt, output);
        let per_request_ms = self.cost.prefill_ms(self.prefilled(prompt))
            + output.max(1) as f64 * self.cost.decode_ms(batch, kv, self.kv_tokens) / batch;
        1000.0 / per_request_ms
    }
}

/// One request in the engine.
#[derive(Clone, Debug, PartialEq)]
struct Sequence {
    id: u64,
    prompt: u64,
    /// Output tokens it will generate before finishing.
    output: u64,
    generated: u64,
    arrived: Duration,
    /// Whether it has been admitted before (to count recomputations).
    started: bool,
    preemptions: u32,
    /// Prompt tokens a warm slot held for it at its admission.
    cached: u64,
    /// Prompt tokens it is known to find cached, whatever slot it gets.
    known_cached: Option<u64>,
}

impl Sequence {
    /// KV tokens it holds while running: its prompt and what it generated.
    fn len(&self) -> u64 {
        self.prompt.saturating_add(self.generated)
    }
}

/// Something the engine did, stamped with when it took effect.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// A sequence produced its first output token.
    FirstToken {
        /// The sequence.
        id: u64,
        /// When.
        at: Duration,
    },
    /// A sequence generated its whole output and left the engine.
    Finished {
        /// The sequence.
        id: u64,
        /// When.
        at: Duration,
        /// Output tokens generated.
        generated: u64,
        /// How many times it was preempted.
        preemptions: u32,
        /// Prompt tokens it found cached in its slot.
        cached: u64,
    },
    /// A running sequence lost its KV and went back to wait (vLLM recompute).
    Preempted {
        /// The sequence.
        id: u64,
        /// When (the start of the step that preempted it).
        at: Duration,
    },
    /// A sequence whose prompt does not fit the context, refused when it
    /// would have been admitted.
    Rejected {
        /// The sequence.
        id: u64,
        /// When.
        at: Duration,
    },
}

/// The engine's state: a waiting queue, a running batch and its KV cache.
#[derive(Clone, Debug)]
pub struct Engine {
    params: EngineParams,
    /// When the engine is next free: the end of its last step.
    now: Duration,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    kv_used: u64,
    steps: u64,
    preemptions: u64,
    /// Slots that have prefilled a prompt since the engine started (and so
    /// hold [`EngineParams::cached_prefix`]); every running sequence is in
    /// one of them.
    warm: u64,
}

impl Engine {
    /// An idle engine with `params`, free from time zero.
    pub fn new(params: EngineParams) -> Self {
        Engine {
            params,
            now: Duration::ZERO,
            waiting: VecDeque::new(),
            running: Vec::new(),
            kv_used: 0,
            steps: 0,
            preemptions: 0,
            warm: 0,
        }
    }

    /// Its settings.
    pub fn params(&self) -> &EngineParams {
        &self.params
    }

    /// Queues request `id` of `prompt` tokens that will generate `output`
    /// tokens (at least one), arriving at `at`. Arrivals must be submitted in
    /// time order, and before [`Engine::run_until`] passes their instant.
    pub fn submit(&mut self, id: u64, prompt: u64, output: u64, at: Duration) {
        self.waiting.push_back(Sequence {
            id,
            prompt,
            output: output.max(1),
            generated: 0,
            arrived: at,
            started: false,
            preemptions: 0,
            cached: 0,
            known_cached: None,
        });
    }

    /// Submits a request of which the server is known to have held
    /// `cached` prompt tokens (a measured answer said so), whatever slot it
    /// gets: it prefills the rest, and its context is the whole prompt.
    pub fn submit_cached(&mut self, id: u64, prompt: u64, cached: u64, output: u64, at: Duration) {
        self.submit(id, prompt, output, at);
        if let Some(s) = self.waiting.back_mut() {
            s.known_cached = Some(cached.min(prompt.saturating_sub(1)));
        }
    }

    /// Removes request `id` wherever it is (its client left); `true` if it
    /// was there.
    pub fn cancel(&mut self, id: u64) -> bool {
        if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            self.waiting.remove(i);
            return true;
        }
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            let s = self.running.remove(i);
            self.kv_used = self.kv_used.saturating_sub(s.len());
            return true;
        }
        false
    }

    /// When the next step starts, if there is work: the end of the last step,
    /// or the next arrival's instant when nothing is running.
    pub fn next_step_at(&self) -> Option<Duration> {
        if !self.running.is_empty() {
            return Some(self.now);
        }
        self.waiting.front().map(|s| s.arrived.max(self.now))
    }

    /// The process was stopped (SIGSTOP) at `from` and continued at `to`:
    /// the step under way at `from` ends that much later, and no step starts
    /// before `to`. Run the engine until `from` first; the events it gave
    /// for instants after `from` are the caller's to delay alike.
    pub fn stopped(&mut self, from: Duration, to: Duration) {
        let frozen = to.saturating_sub(from);
        self.now = if self.now > from {
            self.now.saturating_add(frozen)
        } else {
            self.now.max(to)
        };
    }

    /// Runs every step that starts at or before `t`, appending what happened
    /// to `events`; `factor` gives each step's variance multiplier (1.0 for
    /// none).
    pub fn run_until(&mut self, t: Duration, mut factor: impl FnMut() -> f64, events: &mut Vec<EngineEvent>) {
        while let Some(start) = self.next_step_at() {
            if start > t {
                return;
            }
            self.now = start;
            self.step(factor(), events);
        }
    }

    /// One step from `self.now`.
    fn step(&mut self, factor: f64, events: &mut Vec<EngineEvent>) {
        let start = self.now;
        let p = self.params;
        let mut preempted = false;
        if p.preempt {
            while !self.running.is_empty()
                && self.kv_used.saturating_add(self.running.len() as u64) > p.kv_tokens
                && self.running.len() > 1
            {
                if let Some(mut victim) = self.running.pop() {
                    self.kv_used = self.kv_used.saturating_sub(victim.len());
                    victim.preemptions += 1;
                    self.preemptions += 1;
                    events.push(EngineEvent::Preempted {
                        id: victim.id,
                        at: start,
                    });
                    self.waiting.push_front(victim);
                    preempted = true;
                }
            }
        }
        let mut new_tokens: u64 = 0;
        while !preempted && (self.running.len() as u64) < u64::from(p.max_seqs) {
            let Some(front) = self.waiting.front() else { break };
            if front.arrived > start {
                break;
            }
            if let Some(limit) = p.reject_prompts_from
                && front.prompt >= limit
            {
                let id = front.id;
                self.waiting.pop_front();
                events.push(EngineEvent::Rejected { id, at: start });
                continue;
            }
            let need = front.len();
            let fits = self.kv_used.saturating_add(need).saturating_add(1) <= p.kv_tokens;
            // An empty engine always takes the front sequence, so nothing
            // waits forever on a cache it could never fit.
            if !fits && !self.running.is_empty() {
                break;
            }
            if new_tokens > 0 && new_tokens.saturating_add(need) > p.max_batched_tokens {
                break;
            }
            let Some(mut s) = self.waiting.pop_front() else { break };
            s.started = true;
            // A free warm slot holds the cached prefix (llama.cpp picks the
            // slot whose cache is most like the prompt); otherwise a cold
            // slot takes it, and is warm from then on.
            s.cached = if let Some(known) = s.known_cached {
                known
            } else if self.warm > self.running.len() as u64 {
                p.cached_prefix.min(s.prompt.saturating_sub(1))
            } else {
                self.warm = self.warm.saturating_add(1);
                0
            };
            new_tokens = new_tokens.saturating_add(need.saturating_sub(s.cached));
            self.kv_used = self.kv_used.saturating_add(need);
            self.running.push(s);
        }
        if self.running.is_empty() {
            // Everything admissible was rejected: no forward pass.
            return;
        }
        let ms = p
            .cost
            .step_ms(new_tokens, self.running.len(), self.kv_used, p.kv_tokens)
            * sanitize(factor);
        // A step too long to represent never ends: an infinitely slow GPU, not
        // an infinitely fast one.
        // And no step takes no time: a run of steps always moves the clock.
        let step = Duration::try_from_secs_f64(ms / 1000.0).unwrap_or(Duration::MAX);
        let end = start.saturating_add(step.max(Duration::from_micros(1)));
        self.now = end;
        self.steps += 1;
        let mut still = Vec::with_capacity(self.running.len());
        for mut s in std::mem::take(&mut self.running) {
            s.generated += 1;
            self.kv_used = self.kv_used.saturating_add(1);
            if s.generated == 1 {
                events.push(EngineEvent::FirstToken { id: s.id, at: end });
            }
            if s.generated >= s.output {
                self.kv_used = self.kv_used.saturating_sub(s.len());
                events.push(EngineEvent::Finished {
                    id: s.id,
                    at: end,
                    generated: s.generated,
                    preemptions: s.preemptions,
                    cached: s.cached,
                });
            } else {
                still.push(s);
            }
        }
        self.running = still;
    }

    /// Sequences running now.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Sequences waiting now (new and preempted).
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// KV tokens in use now.
    pub fn kv_used(&self) -> u64 {
        self.kv_used
    }

    /// Steps run so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Preemptions so far.
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Forgets every slot's cached prompt (the model was unloaded).
    pub fn cool(&mut self) {
        self.warm = self.running.len() as u64;
    }
}

/// What the model predicts for one server under Poisson load: a mean-value
/// fixed point, not a simulation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Expectation {
    /// Mean request latency, arrival to last token, seconds.
    pub latency_s: f64,
    /// Mean time to first token, seconds.
    pub ttft_s: f64,
    /// Mean sequences running.
    pub batch: f64,
    /// Mean step time, milliseconds.
    pub step_ms: f64,
}

/// The analytic expectation of the model for requests of `prompt` and
/// `output` tokens arriving as a Poisson stream of `rate_per_s`, or `None`
/// when the batch would outgrow `max_seqs` or the cache (the queue then grows
/// without bound).
///
/// With `m = λ·s` arrivals per step of mean length `s`, a step is a decode
/// step plus the expected prefill of those arrivals:
/// `s = decode_ms(u) + c·(1 − e^−m) + b·P·m + a·P²·(m + m²)` for the prefill
/// polynomial `a·T² + b·T + c`; a request waits the rest of a busy step (half
/// of one, when the engine is busy, `1 − e^−B`), is admitted with the others
/// that arrived meanwhile (TTFT: that wait plus `decode_ms(u) +
/// prefill_ms(P·(1 + m))`), and then takes `O − 1` more steps; the batch is
/// `B = λ·latency` (Little) and `u = B·(P + O/2) / kv_tokens`. Solved by damped
/// iteration.
pub fn expectation(params: &EngineParams, prompt: u64, output: u64, rate_per_s: f64) -> Option<Expectation> {
    let (p, o) = (prompt as f64, output.max(1) as f64);
    let lambda = rate_per_s / 1000.0;
    let footprint = EngineParams::mean_footprint(prompt, output);
    let cost = params.cost;
    let (a, b, c) = cost.prefill_coefficients();
    let kv = params.kv_tokens;
    let mut s = cost.decode_ms(1.0, 0.0, kv) + cost.prefill_ms(prompt);
    let mut result = None;
    for _ in 0..500 {
        let m = lambda * s;
        // Latency and batch from the current step length.
        let busy_wait = |batch: f64| (1.0 - (-batch).exp()) * s / 2.0;
        let mut batch = lambda * o * s;
        let mut held = batch * footprint;
        let ttft = busy_wait(batch)
            + cost.decode_ms(batch.max(1.0), held, kv)
            + cost.prefill_ms((p * (1.0 + m)).round() as u64);
        let latency = ttft + (o - 1.0) * s;
        batch = lambda * latency;
        held = batch * footprint;
        if batch > f64::from(params.max_seqs) || held > kv as f64 || !latency.is_finite() {
            return None;
        }
        let next =
            cost.decode_ms(batch.max(1.0), held, kv) + c * (1.0 - (-m).exp()) + b * p * m + a * p * p * (m + m * m);
        result = Some(Expectation {
            latency_s: latency / 1000.0,
            ttft_s: ttft / 1000.0,
            batch,
            step_ms: s,
        });
        if (next - s).abs() < 1e-9 {
            break;
        }
        s = 0.5 * s + 0.5 * next;
    }
    result
}

/// What [`measure`] saw: means over the requests that finished.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measured {
    /// Mean latency, seconds.
    pub latency_s: f64,
    /// Mean time to first token, seconds.
    pub ttft_s: f64,
    /// Requests finished.
    pub finished: u64,
    /// Preemptions.
    pub preemptions: u64,
}

/// Runs the engine alone on `requests` Poisson arrivals of `rate_per_s`
/// (seeded by `seed`, each step's factor lognormal with `sigma`) and measures
/// the mean latency and time to first token, skipping the first tenth as
/// warm-up.
pub fn measure(
    params: &EngineParams,
    prompt: u64,
    output: u64,
    rate_per_s: f64,
    requests: u64,
    sigma: f64,
    seed: u64,
) -> Measured {
    use rand::SeedableRng;
    use rand_distr::{Distribution, Exp, StandardNormal};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut engine = Engine::new(*params);
    let gaps = Exp::new(rate_per_s.max(1e-9)).ok();
    let mut arrived = Vec::with_capacity(usize::try_from(requests).unwrap_or(0));
    let mut at = Duration::ZERO;
    for id in 0..requests {
        let gap = gaps.map_or(0.0, |g| g.sample(&mut rng));
        at += Duration::try_from_secs_f64(gap).unwrap_or(Duration::ZERO);
        engine.submit(id, prompt, output, at);
        arrived.push(at);
    }
    let mut steps = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    let mut factor = || {
        if sigma <= 0.0 {
            return 1.0;
        }
        let z: f64 = StandardNormal.sample(&mut steps);
        (sigma * z - sigma * sigma / 2.0).exp()
    };
    let mut events = Vec::new();
    engine.run_until(Duration::MAX, &mut factor, &mut events);
    let skip = requests / 10;
    let (mut latency, mut ttft, mut n, mut m) = (0.0, 0.0, 0u64, 0u64);
    for e in &events {
        match *e {
            EngineEvent::Finished { id, at, .. } if id >= skip => {
                latency += (at - arrived[id as usize]).as_secs_f64();
                n += 1;
            }
            EngineEvent::FirstToken { id, at } if id >= skip => {
                ttft += (at - arrived[id as usize]).as_secs_f64();
                m += 1;
            }
            _ => {}
        }
    }
    Measured {
        latency_s: latency / n.max(1) as f64,
        ttft_s: ttft / m.max(1) as f64,
        finished: n,
        preemptions: engine.preemptions(),
    }
}

/// A variance factor that cannot make time run backwards or vanish.
fn sanitize(factor: f64) -> f64 {
    if factor.is_finite() && factor > 0.0 {
        factor
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> EngineParams {
        EngineParams {
            max_seqs: 8,
            kv_tokens: 10_000,
            max_batched_tokens: 8192,
            cost: StepCost::Polynomial { time_scale: 1.0 },
            preempt: true,
            reject_prompts_from: None,
            cached_prefix: 0,
        }
    }

    fn ms(d: Duration) -> f64 {
        d.as_secs_f64() * 1000.0
    }

    fn finished(events: &[EngineEvent]) -> Vec<(u64, Duration)> {
        events
            .iter()
            .filter_map(|e| match e {
                EngineEvent::Finished { id, at, .. } => Some((*id, *at)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_warm_slot_prefills_only_what_its_cache_does_not_hold() {
        let p = EngineParams {
            max_seqs: 2,
            cost: StepCost::Linear(LinearStep {
                prefill_base_ms: 10.0,
                prefill_per_token_ms: 1.0,
                decode_base_ms: 5.0,
                decode_per_sequence_ms: 0.0,
                decode_per_context_token_ms: 0.0,
            }),
            preempt: false,
            cached_prefix: 90,
            ..params()
        };
        let mut engine = Engine::new(p);
        let alone = |engine: &mut Engine, id: u64, prompt: u64, at_s: u64| {
            let at = Duration::from_secs(at_s);
            engine.submit(id, prompt, 1, at);
            let mut events = Vec::new();
            engine.run_until(at + Duration::from_secs(1), || 1.0, &mut events);
            match events.last() {
                Some(EngineEvent::Finished { at: end, cached, .. }) => (ms(*end - at), *cached),
                other => panic!("{other:?}"),
            }
        };
        // Two arrive at once: both slots are cold and prefill everything.
        engine.submit(1, 100, 1, Duration::ZERO);
        engine.submit(2, 100, 1, Duration::ZERO);
        let mut events = Vec::new();
        engine.run_until(Duration::from_secs(1), || 1.0, &mut events);
        assert!(
            events
                .iter()
                .all(|e| !matches!(e, EngineEvent::Finished { cached, .. } if *cached != 0)),
            "{events:?}"
        );
        // Then a warm slot holds 90 of 100 tokens: 10 + 10 + 5 ms.
        assert_eq!(alone(&mut engine, 3, 100, 2), (25.0, 90));
        // A prompt shorter than the cached prefix still prefills one token.
        assert_eq!(alone(&mut engine, 4, 50, 3), (16.0, 49));
        // Unloaded, every slot is cold again.
        engine.cool();
        assert_eq!(alone(&mut engine, 5, 100, 4), (115.0, 0));
        assert_eq!(alone(&mut engine, 6, 100, 5), (25.0, 90));
    }

    #[test]
    fn a_linear_step_grows_with_the_batch_it_decodes() {
        let linear = LinearStep {
            prefill_base_ms: 10.0,
            prefill_per_token_ms: 0.5,
            decode_base_ms: 2.0,
            decode_per_sequence_ms: 3.0,
            decode_per_context_token_ms: 0.0,
        };
        let p = EngineParams {
            cost: StepCost::Linear(linear),
            ..params()
        };
        let run = |requests: u64| {
            let mut engine = Engine::new(p);
            for id in 0..requests {
                engine.submit(id, 20, 4, Duration::ZERO);
            }
            let mut events = Vec::new();
            engine.run_until(Duration::from_secs(10), || 1.0, &mut events);
            ms(finished(&events)[0].1)
        };
        // Alone: one step prefilling 20 tokens and decoding 1 (10 + 10 + 5),
        // then three decode steps of one sequence (5 each).
        assert!((run(1) - 40.0).abs() < 1e-6, "{}", run(1));
        // Two together: the same prefill of 40 tokens, each step decoding 2.
        assert!((run(2) - (10.0 + 20.0 + 8.0 + 3.0 * 8.0)).abs() < 1e-6, "{}", run(2));
        assert!((p.unloaded_latency_s(20, 4) - 0.040).abs() < 1e-9);
        // Capacity at the steady batch of 8: per request 20 ms of prefill and
        // 4 × (2 + 3·8) / 8 ms of decode.
        let expected = 1000.0 / (20.0 + 4.0 * 26.0 / 8.0);
        assert!((p.capacity_per_s(20, 4) - expected).abs() < 1e-9);
    }

    #[test]
    fn the_polynomials_match_their_published_points() {
        assert_eq!(prefill_ms(0), 0.0);
        assert!((prefill_ms(1000) - 32.1).abs() < 0.1, "{}", prefill_ms(1000));
        assert!((prefill_ms(8192) - 169.1).abs() < 0.2, "{}", prefill_ms(8192));
        assert!((decode_ms(0.0) - 5.74).abs() < 1e-9);
        assert!((decode_ms(1.0) - 34.01).abs() < 1e-9);
        assert_eq!(decode_ms(7.0), decode_ms(1.0), "u is clamped to 1");
        assert!(decode_ms(0.5) > decode_ms(0.1));
    }

    #[test]
    fn a_stopped_engine_finishes_its_step_and_the_rest_the_stop_later() {
        let run = |stop: Option<(u64, u64)>| {
            let mut e = Engine::new(params());
            e.submit(0, 100, 20, Duration::ZERO);
            e.submit(1, 100, 20, Duration::from_millis(50));
            let mut events = Vec::new();
            if let Some((from, to)) = stop {
                let (from, to) = (Duration::from_millis(from), Duration::from_millis(to));
                e.run_until(from, || 1.0, &mut events);
                e.stopped(from, to);
                // What the step under way at the stop said is delayed too.
                for event in &mut events {
                    if let EngineEvent::Finished { at, .. } | EngineEvent::FirstToken { at, .. } = event
                        && *at > from
                    {
                        *at += to - from;
                    }
                }
            }
            e.run_until(Duration::MAX, || 1.0, &mut events);
            finished(&events)
        };
        let free = run(None);
        let stopped = run(Some((100, 3100)));
        assert_eq!(stopped.len(), 2);
        for ((id, free), (same, late)) in free.iter().zip(&stopped) {
            assert_eq!(id, same);
            let delay = ms(*late) - ms(*free);
            assert!((delay - 3000.0).abs() < 1e-6, "request {id} finished {delay} ms later");
        }
        // Stopped while idle, it starts nothing before it is continued.
        let mut e = Engine::new(params());
        e.stopped(Duration::ZERO, Duration::from_secs(2));
        e.submit(0, 100, 1, Duration::from_secs(1));
        assert_eq!(e.next_step_at(), Some(Duration::from_secs(2)));
    }

    #[test]
    fn a_lone_request_takes_one_prefill_and_one_step_per_token() {
        let mut engine = Engine::new(params());
        engine.submit(1, 400, 3, Duration::ZERO);
        let mut events = Vec::new();
        engine.run_until(Duration::from_secs(10), || 1.0, &mut events);
        let first = params().cost.step_ms(400, 1, 400, 10_000);
        let second = decode_ms(401.0 / 10_000.0);
        let third = decode_ms(402.0 / 10_000.0);
        let [(1, at)] = finished(&events)[..] else {
            panic!("{events:?}")
        };
        assert!((ms(at) - (first + second + third)).abs() < 0.01, "{at:?}");
        assert!(matches!(events[0], EngineEvent::FirstToken { id: 1, at } if (ms(at) - first).abs() < 0.01));
        assert_eq!((engine.running(), engine.kv_used(), engine.steps()), (0, 0, 3));
    }

    #[test]
    fn latency_grows_with_the_batch() {
        let latency = |batch: u64| {
            let mut engine = Engine::new(params());
            for id in 0..batch {
                engine.submit(id, 400, 50, Duration::ZERO);
            }
            let mut events = Vec::new();
            engine.run_until(Duration::from_secs(60), || 1.0, &mut events);
            finished(&events).iter().map(|(_, at)| *at).max().unwrap()
        };
        let (one, four, eight) = (latency(1), latency(4), latency(8));
        assert!(one < four && four < eight, "{one:?} {four:?} {eight:?}");
    }

    #[test]
    fn a_full_cache_preempts_the_last_admitted_and_recomputes_it() {
        let mut engine = Engine::new(EngineParams {
            kv_tokens: 250,
            ..params()
        });
        engine.submit(1, 100, 40, Duration::ZERO);
        engine.submit(2, 100, 40, Duration::ZERO);
        let mut events = Vec::new();
        engine.run_until(Duration::from_secs(60), || 1.0, &mut events);
        let preempted: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                EngineEvent::Preempted { id, .. } => Some(*id),
                _ => None,
            })
            .collect();
        assert_eq!(preempted.first(), Some(&2), "LIFO: the later one goes: {events:?}");
        assert!(engine.preemptions() >= 1);
        let done = finished(&events);
        assert_eq!(done.len(), 2, "both finish in the end: {events:?}");
        assert_eq!(done[0].0, 1, "the survivor finishes first");
        let recomputed = events
            .iter()
            .any(|e| matches!(e, EngineEvent::Finished { id: 2, preemptions, .. } if *preemptions >= 1));
        assert!(recomputed, "{events:?}");
        assert_eq!(engine.kv_used(), 0);
    }

    #[test]
    fn without_preemption_a_full_cache_only_slows_steps() {
        let mut engine = Engine::new(EngineParams {
            kv_tokens: 250,
            preempt: false,
            ..params()
        });
        engine.submit(1, 100, 40, Duration::ZERO);
        engine.submit(2, 100, 40, Duration::ZERO);
        let mut events = Vec::new();
        engine.run_until(Duration::from_secs(60), || 1.0, &mut events);
        assert!(!events.iter().any(|e| matches!(e, EngineEvent::Preempted { .. })));
        assert_eq!(finished(&events).len(), 2);
    }

    #[test]
    fn the_batch_is_bounded_and_later_arrivals_wait_for_a_step_boundary() {
        let mut engine = Engine::new(EngineParams {
            max_seqs: 1,
            ..params()
        });
        engine.submit(1, 100, 2, Duration::ZERO);
        engine.submit(2, 100, 2, Duration::from_millis(1));
        let mut events = Vec::new();
        engine.run_until(Duration::from_secs(10), || 1.0, &mut events);
        let done = finished(&events);
        assert_eq!(done.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [1, 2]);
        let first_done = done[0].1;
        let second_first_token = events
            .iter()
            .find_map(|e| match e {
                EngineEvent::FirstToken { id: 2, at } => Some(*at),
                _ => None,
            })
            .unwrap();
        assert!(second_first_token > first_done, "one slot: it waits");
    }

    #[test]
    fn a_prompt_over_the_context_is_rejected_at_admission() {
        let mut engine = Engine::new(EngineParams {
            reject_prompts_from: Some(500),
            ..params()
        });
        engine.submit(1, 600, 10, Duration::ZERO);
        engine.submit(2, 100, 1, Duration::ZERO);
        let mut events = Vec::new();
        engine.run_until(Duration::from_secs(10), || 1.0, &mut events);
        assert_eq!(
            events[0],
            EngineEvent::Rejected {
                id: 1,
                at: Duration::ZERO
            }
        );
        assert_eq!(finished(&events).len(), 1);
    }

    #[test]
    fn cancelling_frees_the_cache_and_runs_wait_for_their_instant() {
        let mut engine = Engine::new(params());
        engine.submit(1, 400, 100, Duration::ZERO);
        let mut events = Vec::new();
        engine.run_until(Duration::from_millis(50), || 1.0, &mut events);
        assert!(engine.kv_used() > 400);
        assert!(engine.next_step_at().unwrap() > Duration::from_millis(50));
        assert!(engine.cancel(1));
        assert_eq!((engine.kv_used(), engine.next_step_at()), (0, None));
        assert!(!engine.cancel(1));
    }

    #[test]
    fn cancelling_a_waiting_request_takes_it_out_of_the_queue() {
        let mut engine = Engine::new(EngineParams {
            max_seqs: 1,
            ..params()
        });
        engine.submit(1, 400, 100, Duration::ZERO);
        engine.submit(2, 400, 10, Duration::ZERO);
        let mut events = Vec::new();
        engine.run_until(Duration::from_millis(50), || 1.0, &mut events);
        assert_eq!((engine.running(), engine.waiting()), (1, 1));
        assert!(engine.cancel(2), "2 waits: it is taken out");
        assert_eq!((engine.running(), engine.waiting()), (1, 0));
        engine.run_until(Duration::from_secs(10), || 1.0, &mut events);
        assert_eq!(finished(&events).iter().map(|(id, _)| *id).collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn time_scale_and_variance_stretch_steps() {
        let end = |scale: f64, factor: f64| {
            let mut engine = Engine::new(EngineParams {
                cost: StepCost::Polynomial { time_scale: scale },
                ..params()
            });
            engine.submit(1, 400, 10, Duration::ZERO);
            let mut events = Vec::new();
            engine.run_until(Duration::from_secs(10), || factor, &mut events);
            ms(finished(&events)[0].1)
        };
        let base = end(1.0, 1.0);
        assert!((end(2.0, 1.0) - 2.0 * base).abs() < 0.01);
        assert!((end(1.0, 1.5) - 1.5 * base).abs() < 0.01);
    }

    #[test]
    fn capacity_is_the_steady_batch_over_its_step_time() {
        let p = params();
        // 8 sequences fit (8 × 425 < 10 000), so the batch is max_seqs.
        assert_eq!(p.steady_batch(400, 50), 8.0);
        let u = 8.0 * 425.0 / 10_000.0;
        let expected = 1000.0 / (prefill_ms(400) + 50.0 * decode_ms(u) / 8.0);
        assert!((p.capacity_per_s(400, 50) - expected).abs() < 1e-9);
        assert!(p.unloaded_latency_s(400, 50) > 0.0);
    }
}
