//! What stands in front of the batching engine for each server kind, and the
//! task that drives the engine on simulated time.
//!
//! A request to a batching kind passes the kind's *gate* — llama.cpp's
//! loading 503, llama-swap's concurrency limit and its hold while the
//! upstream loads, Ollama's load on demand and its pending-load queue, a
//! hosted endpoint's quota buckets — then the server's misbehaviour draw, and
//! then waits in the [`Engine`] until its last token. The engine is pure; the
//! driver here runs its steps as simulated time reaches them and hands each
//! request its outcome at the instant the step that finished it ends.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use tokio::sync::{Notify, oneshot, watch};

use super::batching::{Engine, EngineEvent};
use super::kinds::Preset;
use super::quota::{Credit, Quotas};
use crate::hosts::clock::sim_elapsed;
use crate::scenario::{ServerKind, Spread};

/// The random streams a server draws beyond its behaviour draws, kept across
/// its starts. Each is its own ChaCha stream of the server's seed, so a
/// scenario that uses none of them draws exactly what it drew before they
/// existed.
#[derive(Debug)]
pub(super) struct ExtraRng {
    /// Load times.
    pub reload: ChaCha8Rng,
    /// Token counts per request.
    pub tokens: ChaCha8Rng,
    /// Each engine step's time factor.
    pub steps: ChaCha8Rng,
}

impl ExtraRng {
    pub(super) fn new(seed: u64) -> Self {
        let stream = |n: u64| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            rng.set_stream(n);
            rng
        };
        ExtraRng {
            reload: stream(1),
            tokens: stream(2),
            steps: stream(3),
        }
    }

    /// One load time: a draw of `reload`, or `fixed`.
    pub(super) fn load_time(&mut self, reload: Option<Spread>, fixed: f64) -> f64 {
        reload.map_or(fixed, |d| d.sample(&mut self.reload))
    }
}

/// Whether the model is in memory.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Model {
    /// Loaded and serving.
    Ready,
    /// Not loaded; the next request starts a load.
    Unloaded,
    /// Load number `load` ends at `until`, ready or (`fails`) failed.
    Loading { until: Duration, fails: bool, load: u64 },
}

/// How a request left the engine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum EngineOutcome {
    /// It generated `generated` tokens, its slot holding `cached` of its
    /// prompt's.
    Finished { generated: u64, cached: u64 },
    /// Its prompt did not fit the context.
    Rejected,
}

/// Why a request could not wait for the model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum LoadError {
    /// The load it waited for failed (llama-swap's health check timed out
    /// after this many seconds).
    Failed { timeout_s: f64 },
    /// Too many requests already wait for a load (Ollama).
    QueueFull,
}

struct State {
    engine: Engine,
    waiters: BTreeMap<u64, oneshot::Sender<EngineOutcome>>,
    /// Outcomes computed but not yet due, in time order.
    due: VecDeque<(Duration, u64, EngineOutcome)>,
    next_id: u64,
    model: Model,
    loads: u64,
    last_failed: Option<u64>,
    /// Requests past the gate and not yet answered.
    in_flight: u32,
    /// Requests waiting for a load.
    waiting_for_load: u32,
    /// When the last request was answered (for keep-alive and TTL).
    last_done: Duration,
    quotas: Option<Quotas>,
    preemptions: u64,
    /// When the process was stopped (SIGSTOP), while it is: it neither
    /// steps nor answers.
    stopped_since: Option<Duration>,
    /// A stop that has ended, from and to, for the driver to delay the
    /// engine by.
    continued: Option<(Duration, Duration)>,
}

/// One start's batching server: the engine, the model's load state and the
/// kind's counters.
pub(super) struct Batching {
    pub(super) preset: Preset,
    state: Mutex<State>,
    wake: Notify,
    /// Results handed to waiting requests so far: llama.cpp's handlers
    /// wake at every result, and look at their clients only after a
    /// second without one ([`Batching::serve_until_looked`]).
    results: watch::Sender<u64>,
}

impl std::fmt::Debug for Batching {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batching")
            .field("kind", &self.preset.kind)
            .finish_non_exhaustive()
    }
}

impl Batching {
    /// A start of a batching server whose model is loaded (`ready`) or not.
    /// Its quota spends `account`'s credit, which outlives the start.
    pub(super) fn new(preset: Preset, ready: bool, account: Credit) -> Self {
        let quotas = preset.quota.map(|q| Quotas::on(q, account));
        Batching {
            state: Mutex::new(State {
                engine: Engine::new(preset.engine),
                waiters: BTreeMap::new(),
                due: VecDeque::new(),
                next_id: 0,
                model: if ready { Model::Ready } else { Model::Unloaded },
                loads: 0,
                last_failed: None,
                in_flight: 0,
                waiting_for_load: 0,
                last_done: sim_elapsed(),
                quotas,
                preemptions: 0,
                stopped_since: None,
                continued: None,
            }),
            preset,
            wake: Notify::new(),
            results: watch::Sender::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the engine is at work: requests past the gate and not yet
    /// answered, the process not stopped.
    pub(super) fn computing(&self) -> bool {
        let st = self.lock();
        st.in_flight > 0 && st.stopped_since.is_none()
    }

    /// The process is stopped (SIGSTOP) from now: what it is working on
    /// waits with it.
    pub(super) fn stop(&self) {
        let mut st = self.lock();
        if st.stopped_since.is_none() {
            st.stopped_since = Some(sim_elapsed());
        }
        drop(st);
        self.wake.notify_one();
    }

    /// The stopped process is continued (SIGCONT): what it was working on
    /// ends as much later as it was stopped.
    pub(super) fn resume(&self) {
        let mut st = self.lock();
        if let Some(since) = st.stopped_since.take() {
            let now = sim_elapsed();
            // Two stops the driver has not seen yet count as one as long.
            st.continued = Some(match st.continued {
                Some((from, to)) => (from, to.saturating_add(now.saturating_sub(since))),
                None => (since, now),
            });
        }
        drop(st);
        self.wake.notify_one();
    }

    /// Runs the engine until `t`, queuing the outcomes it computed.
    fn run_engine(st: &mut State, t: Duration, rng: &Mutex<ExtraRng>, sigma: f64) {
        let mut events = Vec::new();
        let mut rng = rng.lock().unwrap_or_else(|p| p.into_inner());
        st.engine
            .run_until(t, || step_factor(&mut rng.steps, sigma), &mut events);
        drop(rng);
        for event in events {
            match event {
                EngineEvent::Finished {
                    id,
                    at,
                    generated,
                    cached,
                    ..
                } => {
                    st.due
                        .push_back((at, id, EngineOutcome::Finished { generated, cached }));
                }
                EngineEvent::Rejected { id, at } => st.due.push_back((at, id, EngineOutcome::Rejected)),
                EngineEvent::Preempted { .. } => st.preemptions += 1,
                EngineEvent::FirstToken { .. } => {}
            }
        }
    }

    /// Runs the engine on simulated time for as long as the start lives.
    pub(super) async fn drive(self: Arc<Self>, rng: Arc<Mutex<ExtraRng>>) {
        let sigma = self.preset.step_sigma;
        loop {
            let now = sim_elapsed();
            let stopped = {
                let mut st = self.lock();
                if let Some((from, to)) = st.continued.take() {
                    // Everything under way at the stop ends the stop later.
                    Self::run_engine(&mut st, from, &rng, sigma);
                    st.engine.stopped(from, to);
                    let frozen = to.saturating_sub(from);
                    for (at, ..) in st.due.iter_mut().filter(|(at, ..)| *at > from) {
                        *at = at.saturating_add(frozen);
                    }
                }
                let stopped = st.stopped_since;
                if let Some(since) = stopped {
                    // Stopped: the step under way is frozen, nothing is answered.
                    Self::run_engine(&mut st, since.min(now), &rng, sigma);
                }
                stopped
            };
            if stopped.is_some() {
                self.wake.notified().await;
                continue;
            }
            let next = {
                let mut st = self.lock();
                Self::run_engine(&mut st, now, &rng, sigma);
                while let Some(&(at, id, outcome)) = st.due.front() {
                    if at > now {
                        break;
                    }
                    st.due.pop_front();
                    if let Some(tx) = st.waiters.remove(&id) {
                        let _ = tx.send(outcome);
                        self.results.send_modify(|n| *n = n.wrapping_add(1));
                    }
                }
                let due = st.due.front().map(|(at, ..)| *at);
                match (due, st.engine.next_step_at()) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            };
            match next {
                Some(at) => {
                    tokio::select! {
                        biased;
                        () = self.wake.notified() => {}
                        () = tokio::time::sleep(at.saturating_sub(now)) => {}
                    }
                }
                None => self.wake.notified().await,
            }
        }
    }

    /// Queues a request of `prompt` tokens that will generate `output`;
    /// resolves when it leaves the engine. Dropping the future takes it out.
    pub(super) async fn serve(self: &Arc<Self>, prompt: u64, output: u64) -> Option<EngineOutcome> {
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut st = self.lock();
            let id = st.next_id;
            st.next_id += 1;
            st.engine.submit(id, prompt, output, sim_elapsed());
            st.waiters.insert(id, tx);
            id
        };
        self.wake.notify_one();
        let _queued = Queued { batching: self, id };
        rx.await.ok()
    }

    /// [`Batching::serve`] as llama.cpp's handler waits for it: it wakes at
    /// every result the server hands any request, and when a second passes
    /// without one it looks at its client; once `left` says the client is
    /// gone, that look cancels the request, waiting or running
    /// (`server_response_reader::next` and `server_response::recv_with_timeout`
    /// in `tools/server/server-queue.cpp`, `HTTP_POLLING_SECONDS` in
    /// `server-context.cpp`, llama.cpp 0c1e570). So a request whose client
    /// left runs on while the server keeps answering, and one shorter than
    /// the second runs whole. (Through a stop of the process the handler
    /// still looks, where llama.cpp's looks once continued; either way the
    /// request is gone before the engine's next step.) `Err(ClientGone)`
    /// when a look cancelled it.
    pub(super) async fn serve_until_looked(
        self: &Arc<Self>,
        prompt: u64,
        output: u64,
        left: &watch::Sender<bool>,
    ) -> Result<Option<EngineOutcome>, ClientGone> {
        let mut results = self.results.subscribe();
        let mut left = left.subscribe();
        let serve = self.serve(prompt, output);
        tokio::pin!(serve);
        let mut waiting_since = sim_elapsed();
        loop {
            let look = tokio::time::sleep(waiting_since.saturating_add(LOOK_AFTER).saturating_sub(sim_elapsed()));
            tokio::select! {
                biased;
                outcome = &mut serve => return Ok(outcome),
                changed = results.changed() => {
                    if changed.is_err() {
                        // The start is gone; its engine answers nothing more.
                        return Ok(None);
                    }
                    waiting_since = sim_elapsed();
                }
                () = look => {
                    if *left.borrow_and_update() {
                        return Err(ClientGone);
                    }
                    waiting_since = sim_elapsed();
                }
            }
        }
    }

    /// Counts a request past the gate; `None` when llama-swap's concurrency
    /// limit is reached (for the other kinds there is no limit here).
    pub(super) fn enter(self: &Arc<Self>) -> Option<InFlight> {
        let mut st = self.lock();
        if self.preset.kind == ServerKind::LlamaSwap && st.in_flight >= self.preset.concurrency_limit {
            return None;
        }
        if self.preset.kind == ServerKind::Vllm
            && let Some(max) = self.preset.max_queue
            && st.in_flight >= max
        {
            return None;
        }
        st.in_flight += 1;
        Some(InFlight { batching: self.clone() })
    }

    /// Waits until the model is loaded, starting a load if there is none
    /// (llama-swap, Ollama); `load_time` draws one load's duration.
    /// `Ok(true)` for the one waiter that saw a load complete, which the
    /// server records as [`crate::evidence::trace::Kind::Loaded`].
    pub(super) async fn ready(&self, mut load_time: impl FnMut() -> f64) -> Result<bool, LoadError> {
        let mut waiting_on: Option<u64> = None;
        let mut counted = false;
        let result = loop {
            let now = sim_elapsed();
            let sleep_until = {
                let mut st = self.lock();
                self.expire_idle(&mut st, now);
                match st.model {
                    Model::Ready => break Ok(false),
                    Model::Unloaded => {
                        if let Some(load) = waiting_on
                            && st.last_failed == Some(load)
                        {
                            break Err(LoadError::Failed {
                                timeout_s: self.preset.health_check_timeout_s,
                            });
                        }
                        if !counted {
                            if let Some(max) = self.preset.max_queue.filter(|_| self.preset.kind == ServerKind::Ollama)
                                && st.waiting_for_load >= max
                            {
                                break Err(LoadError::QueueFull);
                            }
                            st.waiting_for_load += 1;
                            counted = true;
                        }
                        st.loads += 1;
                        let load = st.loads;
                        let (until, fails) = self.load_ends(now, load_time());
                        st.model = Model::Loading { until, fails, load };
                        waiting_on = Some(load);
                        until
                    }
                    Model::Loading { until, fails, load } => {
                        if !counted {
                            if let Some(max) = self.preset.max_queue.filter(|_| self.preset.kind == ServerKind::Ollama)
                                && st.waiting_for_load >= max
                            {
                                break Err(LoadError::QueueFull);
                            }
                            st.waiting_for_load += 1;
                            counted = true;
                        }
                        waiting_on = Some(load);
                        if now >= until {
                            if fails {
                                st.model = Model::Unloaded;
                                st.last_failed = Some(load);
                                continue;
                            }
                            st.model = Model::Ready;
                            // Freshly loaded: its idle time starts now, and
                            // the requests that waited for it are served —
                            // not unloaded again by a keep-alive of zero.
                            st.last_done = now;
                            break Ok(true);
                        }
                        until
                    }
                }
            };
            tokio::time::sleep(sleep_until.saturating_sub(now)).await;
        };
        if counted {
            let mut st = self.lock();
            st.waiting_for_load = st.waiting_for_load.saturating_sub(1);
        }
        result
    }

    /// When a load of `load_s` seconds started `now` ends, and whether it
    /// fails. llama-swap polls the upstream's health 250 ms after the start
    /// and then every second until it answers or `healthCheckTimeout` has
    /// passed since the first poll (`internal/process/process_command.go`
    /// `doStart`); Ollama's handler simply waits for the load.
    fn load_ends(&self, now: Duration, load_s: f64) -> (Duration, bool) {
        let secs = |s: f64| Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX);
        if self.preset.kind != ServerKind::LlamaSwap {
            return (now.saturating_add(secs(load_s)), false);
        }
        let polls_after = (load_s - 0.25).max(0.0).ceil();
        let timeout = self.preset.health_check_timeout_s;
        if polls_after <= timeout {
            (now.saturating_add(secs(0.25 + polls_after)), false)
        } else {
            (now.saturating_add(secs(0.25 + timeout.floor() + 1.0)), true)
        }
    }

    /// Unloads an idle model whose keep-alive (Ollama) or TTL (llama-swap) ran out.
    fn expire_idle(&self, st: &mut State, now: Duration) {
        if let Some(keep) = self.preset.keep_alive_s
            && st.model == Model::Ready
            && st.in_flight <= 1
            && now.saturating_sub(st.last_done).as_secs_f64() >= keep
        {
            st.model = Model::Unloaded;
            st.engine.cool();
        }
    }

    /// Whether the model is loaded now (after unloading it if it has been
    /// idle past its keep-alive; call it once counted in flight).
    pub(super) fn is_ready(&self) -> bool {
        let mut st = self.lock();
        self.expire_idle(&mut st, sim_elapsed());
        st.model == Model::Ready
    }

    /// Runs `f` on the quota buckets (hosted endpoints only).
    pub(super) fn quotas<T>(&self, f: impl FnOnce(&mut Quotas) -> T) -> Option<T> {
        self.lock().quotas.as_mut().map(f)
    }

    /// Requests running in the engine, requests past the gate, preemptions so far.
    pub(super) fn counts(&self) -> (u32, u32, u64) {
        let st = self.lock();
        let running = u32::try_from(st.engine.running()).unwrap_or(u32::MAX);
        (running, st.in_flight, st.preemptions)
    }
}

/// A request counted past the gate; leaving marks the model used.
pub(super) struct InFlight {
    batching: Arc<Batching>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut st = self.batching.lock();
        st.in_flight = st.in_flight.saturating_sub(1);
        if turmoil::sim_elapsed().is_some() {
            st.last_done = sim_elapsed();
        }
    }
}

/// A request in the engine; dropped before its outcome (its client left,
/// or llama.cpp looked and found it gone), it is taken out wherever it is,
/// as llama.cpp and vLLM abort a disconnected request.
struct Queued<'a> {
    batching: &'a Arc<Batching>,
    id: u64,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let mut st = self.batching.lock();
        if st.waiters.remove(&self.id).is_some() {
            st.engine.cancel(self.id);
        }
    }
}

/// How long llama.cpp's handler waits without a result before it looks at
/// its client (`HTTP_POLLING_SECONDS`).
pub(super) const LOOK_AFTER: Duration = Duration::from_secs(1);

/// A request llama.cpp cancelled when it looked and found its client gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ClientGone;

/// One step's time factor: lognormal with mean 1 and log-sigma `sigma`.
fn step_factor(rng: &mut ChaCha8Rng, sigma: f64) -> f64 {
    if sigma <= 0.0 {
        return 1.0;
    }
    let z: f64 = StandardNormal.sample(rng);
    (sigma * z - sigma * sigma / 2.0).exp()
}

/// Output tokens a request gets, and whether it was cut off: the `wanted`
/// length, capped by the request's `max_tokens` and by what the context
/// leaves after the prompt.
pub(super) fn output_tokens(wanted: u64, max_tokens: Option<u64>, prompt: u64, context: Option<u64>) -> (u64, bool) {
    let wanted = wanted.max(1);
    let mut cap = max_tokens.unwrap_or(u64::MAX).max(1);
    if let Some(ctx) = context
        && prompt < ctx
    {
        cap = cap.min(ctx - prompt);
    }
    (wanted.min(cap), wanted > cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_capped_by_max_tokens_and_context() {
        assert_eq!(output_tokens(60, Some(256), 400, None), (60, false));
        assert_eq!(output_tokens(300, Some(256), 400, None), (256, true));
        assert_eq!(output_tokens(300, None, 400, Some(500)), (100, true));
        assert_eq!(output_tokens(0, None, 10, None), (1, false));
    }

    #[test]
    fn step_factors_average_one() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let n = 20_000;
        let mean: f64 = (0..n).map(|_| step_factor(&mut rng, 0.2)).sum::<f64>() / f64::from(n);
        assert!((mean - 1.0).abs() < 0.01, "{mean}");
        assert_eq!(step_factor(&mut rng, 0.0), 1.0);
    }
}
