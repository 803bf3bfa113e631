//! A scenario run for real: real `llama-server` processes, the simulator's
//! own workers over real HTTP (through a link that carries the scenario's
//! network latency where a fault names it, and to the shared cache), the
//! faults applied to the processes and links, in real time, recording the
//! same trace a simulation records.
//!
//! Whether a simulated figure would happen in reality can only be answered
//! by running the same scenario both ways and judging both traces alike.
//! So nothing here re-implements a worker: the workers are
//! [`run_worker`]'s, planned by [`worker_plan`] exactly as the simulator
//! plans them, on a real tokio runtime whose clock is real time
//! ([`RealTime`]); only the network and the servers are real. A server's
//! `served` events are recorded from the answers its clients read (on
//! loopback, the same answers at the same instants, less a loopback hop),
//! and its `loaded` event when its `/health` first answers 200 after a
//! restart.
//!
//! What it runs: servers of kind `llama_cpp` (each a `llama-server` with the
//! spec's slots and context) and `llama_swap` (the same behind
//! [`super::swap`]'s emulated llama-swap front, which records its own
//! loads), faults `crash` (SIGKILL), `restart` (a new process on the same
//! port, which loads; behind llama-swap, on its first request), `behave`
//! as a hang (SIGSTOP) or its end (SIGCONT) of a llama.cpp server,
//! `partition`, `heal` and `latency` on a worker's link to a server or to
//! the shared cache ([`super::links`]), `cache_down` and `cache_up`, and
//! `burst`; both cache layouts, each worker's own in-process store or a
//! real redis-server shared by all ([`super::redis`]). Anything else is
//! refused up front, naming the field.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use redstring::MemoryCache;
use redstring::cache::redis::RedisCache;
use redstring::provider::{
    BoxFuture, HttpRequest, HttpResponse, HttpTransport, ReqwestTransport, TransportError, TransportErrorKind,
};
use serde_json::Value;

use super::calibrate::{CalibrateError, Calibration};
use super::links::Link;
use super::llama::{LabError, LlamaServer, LlamaSpec, Tools};
use super::swap::{SwapFront, SwapSettings};
use crate::evidence::Evidence;
use crate::evidence::outcome::Answer;
use crate::evidence::trace::{DRIVER, HostTrace, Kind, Trace};
use crate::hosts::CALL_HEADER;
use crate::hosts::clock::{RealTime, sim_elapsed};
use crate::hosts::worker::{Net, RealTransports, run_worker};
use crate::judgement::sweep::nearest_rank;
use crate::scenario::kinds::{DEFAULT_CONTEXT_TOKENS, LinearStep, ServerKind};
use crate::scenario::{Behaviour, CACHE_HOST, CacheKind, ClockSpec, Fault, Mode, Scenario, fault};
use crate::world::{DEFAULT_CACHE_TIMEOUT_MS, run_length, worker_plan};

/// The most workers a laboratory run takes: each is a task of this process
/// making real requests.
pub const MAX_LAB_WORKERS: usize = 64;

/// The longest scenario a laboratory run takes, seconds: it runs in real
/// time.
pub const MAX_LAB_SECONDS: f64 = 3600.0;

/// Why `scenario` cannot be run for real, naming the field; `None` when it
/// can.
pub fn unsupported(scenario: &Scenario) -> Option<(String, String)> {
    for (i, s) in scenario.servers.iter().enumerate() {
        let at = |field: &str| format!("servers[{i}].{field}");
        if !matches!(s.kind, ServerKind::LlamaCpp | ServerKind::LlamaSwap) {
            return Some((
                at("kind"),
                format!(
                    "is {:?}; the laboratory runs real llama.cpp servers (kind = \"llama_cpp\"), \
                     alone or behind its emulation of llama-swap (kind = \"llama_swap\")",
                    s.kind
                ),
            ));
        }
        if s.keep_alive_s.is_some() {
            return Some((
                at("keep_alive_s"),
                "the laboratory's llama-swap never unloads an idle model; remove it".into(),
            ));
        }
        if s.behaviour != Behaviour::default() {
            return Some((
                at("behaviour"),
                "a real server cannot be told to misbehave; remove it".into(),
            ));
        }
        if s.cold_start {
            return Some((
                at("cold_start"),
                "the laboratory starts its servers loaded; remove it".into(),
            ));
        }
    }
    for (i, f) in scenario.faults.iter().enumerate() {
        if let Fault::Behave { behaviour, server, .. } = f {
            let swap = scenario
                .servers
                .iter()
                .any(|s| &s.name == server && s.kind == ServerKind::LlamaSwap);
            if swap {
                return Some((
                    format!("faults[{i}].server"),
                    "is a llama_swap server; the laboratory hangs llama.cpp servers only".into(),
                ));
            }
            if signal_for(behaviour).is_none() {
                return Some((
                    format!("faults[{i}].behaviour"),
                    "the laboratory applies a hang of every request (mode \"hang\", probability 1), \
                     by stopping the process, and the normal behaviour, by continuing it"
                        .into(),
                ));
            }
            continue;
        }
        if let Fault::Partition { a, b, .. } | Fault::Heal { a, b, .. } | Fault::Latency { a, b, .. } = f {
            let shared = scenario.cache.kind == CacheKind::Shared;
            let is_far = |h: &String| scenario.servers.iter().any(|s| &s.name == h) || (shared && h == CACHE_HOST);
            let is_worker = |h: &String| scenario.fleet().iter().any(|m| &m.name == h);
            if !((is_worker(a) && is_far(b)) || (is_far(a) && is_worker(b))) {
                return Some((
                    format!("faults[{i}]"),
                    format!(
                        "names the link {a} / {b}; the laboratory cuts and slows the links from a worker to a server or to the shared cache only"
                    ),
                ));
            }
            continue;
        }
        if !matches!(
            f,
            Fault::Crash { .. }
                | Fault::Restart { .. }
                | Fault::Burst { .. }
                | Fault::CacheDown { .. }
                | Fault::CacheUp { .. }
        ) {
            return Some((
                format!("faults[{i}].kind"),
                format!(
                    "is {}; the laboratory applies crash, restart, burst, behave (a hang), partition, heal, latency, cache_down and cache_up only",
                    f.kind().name()
                ),
            ));
        }
    }
    for (i, w) in scenario.workers.iter().enumerate() {
        for (j, t) in w.tenants.iter().enumerate() {
            if t.prompt_tokens.is_some() || t.output_tokens.is_some() || t.replay.is_some() {
                return Some((
                    format!("workers[{i}].tenants[{j}]"),
                    "brings its own token counts, which a real server does not read; remove them".into(),
                ));
            }
        }
    }
    if scenario.cache.kind == CacheKind::Shared && scenario.cache.clock != ClockSpec::default() {
        return Some((
            "cache.clock".into(),
            "skews the shared cache's clock; the laboratory's is a real redis-server on this machine's clock; remove it".into(),
        ));
    }
    let workers = scenario.fleet().len();
    if workers > MAX_LAB_WORKERS {
        return Some((
            "workers".into(),
            format!("make {workers} workers; the laboratory runs at most {MAX_LAB_WORKERS}"),
        ));
    }
    if scenario.duration_s > MAX_LAB_SECONDS {
        return Some((
            "duration_s".into(),
            format!(
                "is {} s of real time; the laboratory runs at most {MAX_LAB_SECONDS} s",
                scenario.duration_s
            ),
        ));
    }
    None
}

/// What one repetition measured: its trace, and how fast each server
/// generated the answers it gave.
#[derive(Debug)]
pub struct Ran {
    /// The trace, as a simulation records it.
    pub evidence: Evidence,
    /// By server name, the milliseconds a token after the first that
    /// llama.cpp's own `timings` gave each 200 answer to a request that
    /// was alone at the server from its sending to its answer, in the
    /// order the answers came: set beside the pace its calibration
    /// measured alone, it says whether the machine ran as fast as it was
    /// calibrated.
    pub generation_ms_per_token: BTreeMap<String, Vec<f64>>,
}

/// Runs `scenario` for real once, as repetition `repetition` (which seeds
/// the workers' arrivals as a simulation's seed does), and returns what it
/// measured. Blocks for the scenario's duration plus the servers' loads.
pub fn run(scenario: &Scenario, tools: &Tools, repetition: u64) -> Result<Ran, LabError> {
    if let Some((field, problem)) = unsupported(scenario) {
        return Err(LabError::Unsupported { field, problem });
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| LabError::Spawn {
            binary: "a tokio runtime".into(),
            source: e,
        })?;
    let local = tokio::task::LocalSet::new();
    runtime.block_on(local.run_until(until_interrupted(run_here(scenario, tools, repetition))))
}

/// `work`, or [`LabError::Interrupted`] at Ctrl-C, which drops it: every
/// server it started is killed on the way out, never left running.
async fn until_interrupted<T>(work: impl Future<Output = Result<T, LabError>>) -> Result<T, LabError> {
    tokio::select! {
        result = work => result,
        _ = tokio::signal::ctrl_c() => Err(LabError::Interrupted),
    }
}

/// The mean error within which a calibration's fit predicts the latencies
/// it was fitted to when the machine was quiet (5 to 14 % in fifteen
/// calibrations of `lab-512x8.gguf` on this project's 2-core machine); a
/// fit worse than this was disturbed, and the server is measured again.
pub const GOOD_FIT: f64 = 0.2;

/// The most times one server is measured while its fit is worse than
/// [`GOOD_FIT`].
pub const MOST_MEASUREMENTS: u32 = 3;

/// Times calibration restarts a server to time its load.
pub const RESTARTS: usize = 5;

/// What calibrating one server found.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibrated {
    /// The server.
    pub server: String,
    /// The fit of its step: the best of [`Calibrated::measurements`].
    pub fit: Calibration,
    /// Times the server was measured: again while the fit predicted its
    /// own latencies worse than [`GOOD_FIT`], at most
    /// [`MOST_MEASUREMENTS`].
    pub measurements: u32,
    /// Seconds from a restart to `/health` answering 200: the median of
    /// [`RESTARTS`] restarts.
    pub reload_s: f64,
    /// The shortest and longest of those restarts: a simulated load is
    /// drawn between them, since a figure can turn on which side of a
    /// timeout a load ends.
    pub reload_range: (f64, f64),
    /// Prompt and output tokens of the request every worker sends, as the
    /// server counted them.
    pub tokens: (u64, u64),
    /// Of its prompt tokens, those the server's prompt cache held when the
    /// request was sent again (llama.cpp's `cached_tokens`).
    pub cached_tokens: u64,
    /// Milliseconds the request every worker sends took a token after its
    /// first, sent alone on a warm slot (llama.cpp's `timings`), if the
    /// server said.
    pub generation_ms_per_token: Option<f64>,
    /// The step the prediction runs: the fit's with its cost per sequence
    /// set so that request alone generates at that pace, or the fit's
    /// where the server gave no timings.
    pub step: LinearStep,
}

/// `scenario` with each server measured for real, as the laboratory
/// predicts with it: the step `calibrate` fits, the load a restart takes,
/// and the token counts of the request every worker sends (the real server
/// counts them; the simulated one is told) with how much of its prompt the
/// server's cache holds when it comes again, each server started alone
/// with the laboratory's settings.
pub fn calibrated(scenario: &Scenario, tools: &Tools) -> Result<(Scenario, Vec<Calibrated>), LabError> {
    if let Some((field, problem)) = unsupported(scenario) {
        return Err(LabError::Unsupported { field, problem });
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| LabError::Spawn {
            binary: "a tokio runtime".into(),
            source: e,
        })?;
    let mut out = scenario.clone();
    let mut found = Vec::new();
    for spec in &mut out.servers {
        let c = runtime.block_on(until_interrupted(calibrate_one(spec, tools, scenario)))?;
        spec.step_ms = Some(c.step);
        spec.time_scale = None;
        spec.reload_s = c.reload_s;
        let (low, high) = c.reload_range;
        spec.reload = (high > low).then_some(crate::scenario::kinds::Spread::Uniform { low, high });
        spec.prompt_tokens = u32::try_from(c.tokens.0).unwrap_or(u32::MAX);
        spec.output_tokens = u32::try_from(c.tokens.1).unwrap_or(u32::MAX);
        spec.prompt_tokens_dist = None;
        spec.output_tokens_dist = None;
        spec.cached_prompt_tokens = Some(c.cached_tokens);
        // The laboratory's llama-server computes on this machine's CPU.
        if spec.kind == crate::scenario::ServerKind::LlamaCpp {
            spec.cpu = Some(crate::scenario::kinds::Cpu {
                cores: std::thread::available_parallelism()
                    .map_or(1, |n| {
                        u32::try_from(n.get()).unwrap_or(crate::scenario::kinds::MAX_CORES)
                    })
                    .min(crate::scenario::kinds::MAX_CORES),
                threads: Some(llama_spec(spec, tools).threads),
            });
        }
        found.push(c);
    }
    Ok((out, found))
}

/// The laboratory's settings for `spec`'s server.
fn llama_spec(spec: &crate::scenario::ServerSpec, tools: &Tools) -> LlamaSpec {
    LlamaSpec::lab(
        tools,
        spec.max_seqs.unwrap_or(spec.slots).max(1),
        spec.context_tokens.unwrap_or(DEFAULT_CONTEXT_TOKENS),
    )
}

async fn calibrate_one(
    spec: &crate::scenario::ServerSpec,
    tools: &Tools,
    scenario: &Scenario,
) -> Result<Calibrated, LabError> {
    use redstring::provider::{ExtractRequest, LlmProvider, OpenAiCompatible, OutputSchema};

    use crate::hosts::worker::{Extraction, REQUEST_SYSTEM_PROMPT, REQUEST_TEXT};

    let failed = |problem: String| LabError::Unsupported {
        field: format!("servers.{}", spec.name),
        problem,
    };
    let mut server = LlamaServer::start(tools, &llama_spec(spec, tools))?;
    server.ready(Duration::from_secs(300)).await?;
    let base = server.base_url();
    // The worker's request, through the worker's adapter; the bodies it
    // reads say how much of the prompt the server had cached, and how long
    // the server took to generate the answer.
    let transport = WorkerAnswers {
        http: ReqwestTransport::new().map_err(|e| failed(format!("cannot be reached: {e}")))?,
        read: Arc::default(),
    };
    let read = transport.read.clone();
    let adapter = OpenAiCompatible::builder(format!("{base}/v1"), spec.model.clone())
        .max_tokens(scenario.hardening.max_tokens)
        .build_with(transport)
        .map_err(|e| failed(format!("cannot be called: {e}")))?;
    let schema = OutputSchema::for_type::<Extraction>();
    let (mut prompt, mut output, mut n) = (0u64, 0u64, 0u64);
    for _ in 0..3 {
        let request = ExtractRequest {
            text: REQUEST_TEXT,
            system_prompt: Some(REQUEST_SYSTEM_PROMPT),
            schema: &schema,
        };
        let answer = adapter
            .extract_answer(request, Some(Duration::from_secs(120)))
            .await
            .map_err(|e| failed(format!("did not answer the workers' request: {e}")))?;
        if let Some(u) = answer.usage {
            prompt += u.prompt_tokens;
            output += u.completion_tokens;
            n += 1;
        }
    }
    if n == 0 {
        return Err(failed("answers without usage counts".into()));
    }
    let plan = super::calibrate::Plan {
        model: spec.model.clone(),
        max_concurrency: llama_spec(spec, tools).slots.min(super::calibrate::MAX_CONCURRENCY),
        requests_per_client: 6,
        ..super::calibrate::Plan::default()
    };
    let endpoint = Arc::new(super::HttpEndpoint::new(&base, None).map_err(|e| failed(e.to_string()))?);
    let (fit, measurements) = best_fit(|| async {
        let measured = super::calibrate::measure(endpoint.clone(), &plan).await?;
        super::calibrate::fit(&measured)
    })
    .await
    .map_err(|e| failed(e.to_string()))?;
    let mut reloads = Vec::new();
    for _ in 0..RESTARTS {
        server.restart()?;
        reloads.push(server.ready(Duration::from_secs(300)).await?.as_secs_f64());
    }
    reloads.sort_by(f64::total_cmp);
    // The first request found the slots cold; the later ones, what a warm
    // slot holds.
    let warm = read.lock().unwrap_or_else(|p| p.into_inner()).split_off(1);
    let tokens = (prompt.div_ceil(n), output.div_ceil(n));
    let (generated, later) = warm
        .iter()
        .filter_map(|a| a.generation)
        .fold((0.0, 0u64), |(ms, steps), (t, n)| (ms + t, steps + n.saturating_sub(1)));
    let generation_ms_per_token = (later > 0).then(|| generated / later as f64);
    let step = generation_ms_per_token
        .and_then(|pace| super::calibrate::paced(fit.step, pace, tokens.0, tokens.1))
        .unwrap_or(fit.step);
    Ok(Calibrated {
        server: spec.name.clone(),
        fit,
        measurements,
        reload_s: nearest_rank(&reloads, 50),
        reload_range: (reloads[0], reloads[reloads.len() - 1]),
        tokens,
        cached_tokens: warm.iter().map(|a| a.cached).sum::<u64>() / (warm.len().max(1) as u64),
        generation_ms_per_token,
        step,
    })
}

/// The best of the fits `measure` makes, measuring again while the best
/// so far is worse than [`GOOD_FIT`], at most [`MOST_MEASUREMENTS`] times
/// in all; with how many were made. A measurement disturbed by the machine
/// fits its own latencies poorly, and one taken again usually does not.
pub(crate) async fn best_fit<F, M>(mut measure: M) -> Result<(Calibration, u32), CalibrateError>
where
    M: FnMut() -> F,
    F: Future<Output = Result<Calibration, CalibrateError>>,
{
    let mut best = measure().await?;
    let mut measurements = 1;
    while measurements < MOST_MEASUREMENTS && best.mean_error > GOOD_FIT {
        let next = measure().await?;
        measurements += 1;
        if next.mean_error < best.mean_error {
            best = next;
        }
    }
    Ok((best, measurements))
}

/// A transport that notes, for each answer it reads, how many prompt
/// tokens the server said its cache held (0 when it says nothing), and how
/// long it said the generation took.
struct WorkerAnswers {
    http: ReqwestTransport,
    read: Arc<std::sync::Mutex<Vec<WorkerAnswer>>>,
}

/// What the server said of one answer to the workers' request.
#[derive(Clone, Copy, Debug)]
struct WorkerAnswer {
    /// `usage.prompt_tokens_details.cached_tokens`.
    cached: u64,
    /// `timings.predicted_ms` and `usage.completion_tokens`, when both are
    /// there and sane.
    generation: Option<(f64, u64)>,
}

impl HttpTransport for WorkerAnswers {
    fn post(&self, request: HttpRequest) -> BoxFuture<'_, Result<HttpResponse, TransportError>> {
        Box::pin(async move {
            let response = self.http.post(request).await?;
            let v = serde_json::from_slice::<Value>(&response.body).unwrap_or_default();
            let cached = v
                .pointer("/usage/prompt_tokens_details/cached_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            self.read.lock().unwrap_or_else(|p| p.into_inner()).push(WorkerAnswer {
                cached,
                generation: generation(&v),
            });
            Ok(response)
        })
    }
}

/// One server of the run: its process, and which of its starts is current
/// (a load cut short by a crash records nothing).
struct Server {
    process: RefCell<Process>,
    generation: Cell<u64>,
}

/// A real llama-server alone, or behind the emulated llama-swap front
/// (which records its own loads).
enum Process {
    Llama(LlamaServer),
    Swap(Rc<SwapFront>),
}

impl Process {
    /// The loopback port it serves on, the same across its restarts.
    fn port(&self) -> u16 {
        match self {
            Process::Llama(p) => p.port(),
            Process::Swap(f) => f.port(),
        }
    }
}

async fn run_here(scenario: &Scenario, tools: &Tools, repetition: u64) -> Result<Ran, LabError> {
    let trace = Trace::new();
    let mut servers: BTreeMap<String, Rc<Server>> = BTreeMap::new();
    for s in &scenario.servers {
        let process = if s.kind == ServerKind::LlamaSwap {
            let preset = crate::hosts::server::kinds::Preset::of(s);
            let settings = SwapSettings {
                name: s.name.clone(),
                concurrency_limit: preset.as_ref().map_or(1, |p| p.concurrency_limit),
                health_check_timeout_s: preset.as_ref().map_or(0.0, |p| p.health_check_timeout_s),
            };
            Process::Swap(Rc::new(
                SwapFront::start(tools, &llama_spec(s, tools), settings, trace.clone()).await?,
            ))
        } else {
            let mut process = LlamaServer::start(tools, &llama_spec(s, tools))?;
            process.ready(Duration::from_secs(300)).await?;
            Process::Llama(process)
        };
        servers.insert(
            s.name.clone(),
            Rc::new(Server {
                process: RefCell::new(process),
                generation: Cell::new(0),
            }),
        );
    }
    // The shared cache: a real redis-server.
    let mut cache = None;
    if scenario.cache.kind == CacheKind::Shared {
        let binary = super::redis::binary().ok_or_else(|| LabError::Missing {
            what: "redis-server (for the shared cache)",
            at: "PATH".into(),
            fix: "apt-get install redis-server",
        })?;
        cache = Some(super::redis::RedisServer::start(binary)?);
    }
    // A link to the shared cache for every worker, and to a server where a
    // fault names that worker's link to it, with the scenario's latency; a
    // worker reaches every other server directly, so a dead server refuses
    // its connections as the simulated one does (a link has accepted them
    // already, and could only reset them).
    let named = links_named(scenario);
    let mut links: BTreeMap<(String, String), Link> = BTreeMap::new();
    let range = (scenario.network.min_latency_ms, scenario.network.max_latency_ms);
    for member in scenario.fleet() {
        let cache_port = cache.as_ref().map(|c| (CACHE_HOST.to_owned(), c.port()));
        let ports = member
            .servers
            .iter()
            .filter(|server| named.contains(&(member.name.clone(), (*server).clone())))
            .filter_map(|server| servers.get(server).map(|s| (server.clone(), s.process.borrow().port())))
            .chain(cache_port);
        for (far, port) in ports.collect::<Vec<_>>() {
            let seed = repetition ^ member.index.rotate_left(32) ^ (links.len() as u64).rotate_left(48);
            let link = Link::open(std::net::SocketAddr::from(([127, 0, 0, 1], port)), range, seed)
                .await
                .map_err(|source| LabError::Spawn {
                    binary: "a link between a worker and a server".into(),
                    source,
                })?;
            links.insert((member.name.clone(), far), link);
        }
    }

    let _real_time = RealTime::begin();
    let duration = Duration::try_from_secs_f64(scenario.duration_s).unwrap_or(Duration::MAX);
    let paces = Arc::new(std::sync::Mutex::new(BTreeMap::new()));
    let transports: Arc<dyn RealTransports> = Arc::new(Observed {
        trace: trace.clone(),
        paces: paces.clone(),
        http: ReqwestTransport::new().map_err(|e| LabError::Spawn {
            binary: "an HTTP client".into(),
            source: std::io::Error::other(e.to_string()),
        })?,
    });
    let cache_timeout = Duration::from_millis(scenario.cache.timeout_ms.unwrap_or(DEFAULT_CACHE_TIMEOUT_MS));
    let mut workers = Vec::new();
    for member in scenario.fleet() {
        let name = member.name.clone();
        let plan = worker_plan(
            scenario,
            member,
            repetition,
            duration,
            Net::Real(transports.clone()),
            |server| {
                let port = links
                    .get(&(name.clone(), server.to_owned()))
                    .map(Link::port)
                    .or_else(|| servers.get(server).map(|s| s.process.borrow().port()));
                port.map(|p| format!("http://127.0.0.1:{p}/v1")).unwrap_or_default()
            },
        );
        let worker = match links.get(&(name.clone(), CACHE_HOST.to_owned())) {
            // Its own connection to the shared redis-server, through its link.
            Some(link) => {
                let store = RedisCache::builder()
                    .time_source(scenario.cache.time_source)
                    .connect_timeout(cache_timeout)
                    .response_timeout(cache_timeout)
                    .build_from_url(&format!("redis://127.0.0.1:{}", link.port()))
                    .map_err(|e| LabError::Spawn {
                        binary: "a Redis client".into(),
                        source: std::io::Error::other(e.to_string()),
                    })?;
                tokio::task::spawn_local(run_worker(plan, Arc::new(store), trace.clone()))
            }
            None => {
                let store = Arc::new(MemoryCache::new(Arc::new(plan.clock.clone())));
                tokio::task::spawn_local(run_worker(plan, store, trace.clone()))
            }
        };
        workers.push(worker);
    }

    for f in fault::in_order(&scenario.faults) {
        let at = Duration::try_from_secs_f64(f.at_s()).unwrap_or(Duration::MAX);
        tokio::time::sleep(at.saturating_sub(sim_elapsed())).await;
        apply(f, &servers, cache.as_mut(), &links, &trace).await?;
    }
    tokio::time::sleep(run_length(scenario).saturating_sub(sim_elapsed())).await;
    for w in workers {
        w.abort();
    }
    let simulated = sim_elapsed();
    drop(servers);
    let generation_ms_per_token = std::mem::take(&mut *paces.lock().unwrap_or_else(|p| p.into_inner()))
        .into_iter()
        .map(|(server, pace)| (server, pace.alone))
        .collect();
    Ok(Ran {
        evidence: Evidence {
            seed: repetition,
            simulated,
            events: trace.take(),
        },
        generation_ms_per_token,
    })
}

/// The links from a worker to a server that a partition, heal or latency
/// fault names, as (worker, server).
fn links_named(scenario: &Scenario) -> std::collections::BTreeSet<(String, String)> {
    let servers: std::collections::BTreeSet<&str> = scenario.servers.iter().map(|s| s.name.as_str()).collect();
    scenario
        .faults
        .iter()
        .filter_map(|f| match f {
            Fault::Partition { a, b, .. } | Fault::Heal { a, b, .. } | Fault::Latency { a, b, .. } => {
                if servers.contains(b.as_str()) {
                    Some((a.clone(), b.clone()))
                } else if servers.contains(a.as_str()) {
                    Some((b.clone(), a.clone()))
                } else {
                    None
                }
            }
            _ => None,
        })
        .collect()
}

/// Applies `fault` to the real servers now and records it.
async fn apply(
    fault: &Fault,
    servers: &BTreeMap<String, Rc<Server>>,
    cache: Option<&mut super::redis::RedisServer>,
    links: &BTreeMap<(String, String), Link>,
    trace: &Trace,
) -> Result<(), LabError> {
    let link = |a: &String, b: &String| {
        links
            .get(&(a.clone(), b.clone()))
            .or_else(|| links.get(&(b.clone(), a.clone())))
    };
    match fault {
        Fault::Crash { server, .. } => {
            if let Some(s) = servers.get(server) {
                s.generation.set(s.generation.get() + 1);
                match &mut *s.process.borrow_mut() {
                    Process::Llama(p) => p.kill(),
                    Process::Swap(f) => f.crash(),
                }
            }
        }
        Fault::Restart { server, .. } => {
            if let Some(s) = servers.get(server) {
                let generation = s.generation.get() + 1;
                s.generation.set(generation);
                let swap = match &mut *s.process.borrow_mut() {
                    Process::Llama(p) => {
                        p.restart()?;
                        tokio::task::spawn_local(loaded_when_healthy(
                            format!("{}/health", p.base_url()),
                            server.clone(),
                            s.clone(),
                            generation,
                            trace.clone(),
                        ));
                        None
                    }
                    Process::Swap(f) => Some(f.clone()),
                };
                // Its first request starts the upstream; the front records
                // the load.
                if let Some(front) = swap {
                    front.restart().await?;
                }
            }
        }
        Fault::Behave { server, behaviour, .. } => {
            if let Some(s) = servers.get(server)
                && let Process::Llama(p) = &*s.process.borrow()
            {
                behave(p, behaviour)?;
            }
        }
        Fault::CacheDown { .. } => {
            if let Some(cache) = cache {
                cache.kill();
            }
        }
        Fault::CacheUp { .. } => {
            if let Some(cache) = cache {
                cache.up()?;
            }
        }
        Fault::Partition { a, b, .. } => link(a, b).into_iter().for_each(Link::cut),
        Fault::Heal { a, b, .. } => link(a, b).into_iter().for_each(Link::heal),
        Fault::Latency { a, b, ms, .. } => {
            if let Some(l) = link(a, b) {
                l.set_latency(*ms);
            }
        }
        // Load: each worker fires it on its own timer.
        _ => {}
    }
    trace.host(DRIVER).record(Kind::Fault {
        fault: Box::new(fault.clone()),
    });
    Ok(())
}

/// What a `behave` fault does to a real process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Signal {
    /// SIGSTOP: every request hangs, the ones it was serving too.
    Stop,
    /// SIGCONT: it answers again.
    Continue,
}

/// The signal that gives a real llama-server `behaviour`, if one does: a
/// hang of every request is a stopped process, the normal behaviour a
/// running one. A stopped process also freezes the requests it was
/// serving, where the simulated hang takes only the requests that arrive
/// after it.
fn signal_for(behaviour: &Behaviour) -> Option<Signal> {
    match behaviour.mode {
        Mode::Hang if behaviour.probability >= 1.0 => Some(Signal::Stop),
        Mode::Normal => Some(Signal::Continue),
        _ => None,
    }
}

/// Gives the real server `behaviour` (one [`unsupported`] accepts): stops
/// it for a hang of every request, continues it for the normal behaviour.
pub(super) fn behave(process: &LlamaServer, behaviour: &Behaviour) -> Result<(), LabError> {
    match signal_for(behaviour) {
        Some(Signal::Stop) => process.hang(),
        Some(Signal::Continue) => process.resume(),
        None => Ok(()),
    }
}

/// Records `Loaded` for `name` when `health` first answers 200, unless the
/// server was crashed or restarted again meanwhile.
async fn loaded_when_healthy(health: String, name: String, server: Rc<Server>, generation: u64, trace: Trace) {
    let Ok(client) = super::http_client() else { return };
    while server.generation.get() == generation {
        if super::llama::healthy(&client, &health).await {
            if server.generation.get() == generation {
                trace.host(&name).record(Kind::Loaded);
            }
            return;
        }
        tokio::time::sleep(super::llama::HEALTH_POLL).await;
    }
}

/// The real network's transports: reqwest, with each request and each
/// answer recorded as the simulated network and servers record them.
struct Observed {
    trace: Trace,
    /// [`Ran::generation_ms_per_token`], as the answers come.
    paces: Paces,
    http: ReqwestTransport,
}

/// Each server's [`Pace`], by name.
type Paces = Arc<std::sync::Mutex<BTreeMap<String, Pace>>>;

/// A request to one server, counted in flight until it ends or is dropped.
struct InFlight<'a> {
    paces: &'a Paces,
    server: &'a str,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut paces = self.paces.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pace) = paces.get_mut(self.server) {
            pace.in_flight = pace.in_flight.saturating_sub(1);
        }
    }
}

/// What the workers have sent one server, to tell a request alone there.
#[derive(Debug, Default)]
struct Pace {
    /// Requests sent and not yet answered (or failed).
    in_flight: u32,
    /// Requests sent so far.
    sent: u64,
    /// [`Ran::generation_ms_per_token`].
    alone: Vec<f64>,
}

impl RealTransports for Observed {
    fn transport(&self, host: &str, server: &str) -> Box<dyn HttpTransport> {
        Box::new(ObservedTransport {
            worker: self.trace.host(host),
            server: self.trace.host(server),
            paces: self.paces.clone(),
            http: self.http.clone(),
        })
    }
}

/// One worker's transport to one real server.
struct ObservedTransport {
    /// The worker's requests.
    worker: HostTrace,
    /// The server's answers, as it would record them.
    server: HostTrace,
    paces: Paces,
    http: ReqwestTransport,
}

impl HttpTransport for ObservedTransport {
    fn post(&self, request: HttpRequest) -> BoxFuture<'_, Result<HttpResponse, TransportError>> {
        Box::pin(async move {
            let caller = request
                .headers
                .iter()
                .find(|(n, _)| n == CALL_HEADER)
                .map(|(_, v)| v.clone());
            self.worker.record(Kind::Request {
                server: self.server.name().clone(),
            });
            // Alone if none was in flight at its sending and none is sent
            // before its answer. Counted out when it ends, or is dropped
            // (a hedge's losing attempt).
            let sent = {
                let mut paces = self.paces.lock().unwrap_or_else(|p| p.into_inner());
                let pace = paces.entry(self.server.name().to_string()).or_default();
                pace.sent += 1;
                pace.in_flight += 1;
                (pace.in_flight == 1).then_some(pace.sent)
            };
            let _in_flight = InFlight {
                paces: &self.paces,
                server: self.server.name(),
            };
            let result = self.http.post(request).await;
            let answer = match &result {
                Ok(response) => Some(answer_of(response.status, &response.body)),
                Err(TransportError::Failed { kind, .. }) => match kind {
                    // It never reached the server.
                    TransportErrorKind::Connect => None,
                    TransportErrorKind::Timeout => Some(Answer::Hang),
                    _ => Some(Answer::Drop),
                },
                Err(_) => Some(Answer::Error),
            };
            if let Some(answer) = answer {
                self.server.record(Kind::served_for(answer, caller));
            }
            let mut paces = self.paces.lock().unwrap_or_else(|p| p.into_inner());
            let pace = paces.entry(self.server.name().to_string()).or_default();
            if let Ok(response) = &result
                && response.status == 200
                && sent == Some(pace.sent)
                && let Some(ms) = generation_ms_per_token(&response.body)
            {
                pace.alone.push(ms);
            }
            drop(paces);
            result
        })
    }
}

/// What llama.cpp's answer was, in the simulated servers' terms.
/// The milliseconds a token after the first of an answer, from
/// llama.cpp's `timings.predicted_ms` and `usage.completion_tokens`:
/// `None` for an answer that says neither, or generated one token.
fn generation_ms_per_token(body: &[u8]) -> Option<f64> {
    let (ms, tokens) = generation(&serde_json::from_slice::<Value>(body).ok()?)?;
    (tokens > 1).then(|| ms / (tokens - 1) as f64)
}

/// An answer's `timings.predicted_ms` and `usage.completion_tokens`, when
/// both are there and sane.
fn generation(v: &Value) -> Option<(f64, u64)> {
    let ms = super::calibrate::timing_ms(v, "predicted_ms")?;
    let tokens = v.pointer("/usage/completion_tokens").and_then(Value::as_u64)?;
    Some((ms, tokens))
}

fn answer_of(status: u16, body: &[u8]) -> Answer {
    let v: Value = serde_json::from_slice(body).unwrap_or_default();
    let text = |pointer: &str| v.pointer(pointer).and_then(Value::as_str).unwrap_or("").to_owned();
    match status {
        200 if text("/choices/0/finish_reason") == "length" => Answer::Truncated,
        200 => Answer::Ok,
        503 if text("/error/message") == "Loading model" => Answer::Loading,
        503 => Answer::QueueFull,
        500 if text("/src") == "llama-swap" => Answer::LoadFailed,
        429 => Answer::Throttled,
        400 if text("/error/type") == "exceed_context_size_error" => Answer::ContextExceeded,
        400 => Answer::BadRequest,
        404 => Answer::NotFound,
        _ => Answer::Error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_answers_read_as_the_simulated_servers_record_them() {
        let body = |v: Value| v.to_string().into_bytes();
        assert_eq!(
            answer_of(503, &body(crate::hosts::server::loading_body())),
            Answer::Loading
        );
        assert_eq!(
            answer_of(200, &body(serde_json::json!({"choices": [{"finish_reason": "stop"}]}))),
            Answer::Ok
        );
        assert_eq!(
            answer_of(
                200,
                &body(serde_json::json!({"choices": [{"finish_reason": "length"}]}))
            ),
            Answer::Truncated
        );
        assert_eq!(
            answer_of(
                400,
                &body(serde_json::json!({"error": {"type": "exceed_context_size_error"}}))
            ),
            Answer::ContextExceeded
        );
        assert_eq!(answer_of(500, b"not json"), Answer::Error);
        // How fast an answer generated: its tokens after the first.
        let timed = |ms: f64, tokens: u64| {
            body(serde_json::json!({"timings": {"predicted_ms": ms}, "usage": {"completion_tokens": tokens}}))
        };
        assert_eq!(generation_ms_per_token(&timed(130.0, 27)), Some(5.0));
        assert_eq!(generation_ms_per_token(&timed(4.0, 1)), None, "one token: no pace");
        assert_eq!(generation_ms_per_token(&timed(f64::NAN, 27)), None);
        assert_eq!(generation_ms_per_token(b"not json"), None);
        // llama-swap's own failure, as the emulated front answers it.
        let failed = crate::hosts::server::load_failed(120.0).into_body();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let bytes = runtime
            .block_on(http_body_util::BodyExt::collect(failed))
            .unwrap()
            .to_bytes();
        assert_eq!(answer_of(500, &bytes), Answer::LoadFailed);
    }

    /// Fits that predicted their own latencies within `errors`, in the
    /// order they are measured: how many measurements `best_fit` makes and
    /// which error it keeps.
    fn best_of(errors: &[f64]) -> (f64, u32) {
        let made = std::cell::Cell::new(0);
        let measure = || {
            let error = errors[made.get()];
            made.set(made.get() + 1);
            async move {
                Ok(Calibration {
                    props: super::super::calibrate::Props::default(),
                    step: crate::scenario::kinds::LinearStep {
                        prefill_base_ms: 0.0,
                        prefill_per_token_ms: 0.5,
                        decode_base_ms: 3.0,
                        decode_per_sequence_ms: 0.0,
                        decode_per_context_token_ms: 0.0,
                    },
                    samples: 10,
                    failed: 0,
                    max_concurrency: 2,
                    mean_error: error,
                    worst_error: error,
                    output_tokens: None,
                    prompt_tokens: 10.0,
                })
            }
        };
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (fit, n) = runtime.block_on(best_fit(measure)).unwrap();
        assert_eq!(n as usize, made.get());
        (fit.mean_error, n)
    }

    #[test]
    fn a_poor_fit_is_measured_again_and_the_best_kept() {
        assert_eq!(best_of(&[0.07]), (0.07, 1), "a good fit is kept at once");
        assert_eq!(best_of(&[0.41, 0.09]), (0.09, 2));
        assert_eq!(best_of(&[0.41, 0.3, 0.35, 0.01]), (0.3, MOST_MEASUREMENTS));
        assert_eq!(best_of(&[GOOD_FIT, 0.01]), (GOOD_FIT, 1), "the bound is good enough");
    }

    #[test]
    fn a_measurement_that_fails_fails_the_calibration() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let error = runtime
            .block_on(best_fit(|| async { Err(CalibrateError::Degenerate("flat".into())) }))
            .unwrap_err();
        assert_eq!(error, CalibrateError::Degenerate("flat".into()));
    }

    #[test]
    fn what_cannot_be_run_for_real_is_named() {
        let text = |extra: &str| {
            format!(
                "name = \"t\"\nseed = 1\nduration_s = 10\n[[servers]]\nname = \"gpu\"\n{extra}\n[[workers]]\nname = \"w\"\nservers = [\"gpu\"]\ntenants = [{{ id = 1, calls_per_min = 15 }}]\n"
            )
        };
        let field = |extra: &str| {
            let s = Scenario::parse("t.toml", &text(extra)).unwrap();
            unsupported(&s).map(|(f, _)| f)
        };
        assert_eq!(field(""), Some("servers[0].kind".into()), "generic is a model");
        assert_eq!(field("kind = \"llama_cpp\""), None);
        assert_eq!(
            field("kind = \"llama_cpp\"\ncold_start = true"),
            Some("servers[0].cold_start".into())
        );
        assert_eq!(
            field("kind = \"llama_cpp\"\n[[faults]]\nkind = \"partition\"\nat_s = 1\na = \"w\"\nb = \"gpu\""),
            None,
            "a link the laboratory cuts"
        );
        let shared = "kind = \"llama_cpp\"\n[cache]\nkind = \"shared\"\n";
        assert_eq!(
            field(&format!(
                "{shared}[[faults]]\nkind = \"partition\"\nat_s = 1\na = \"w\"\nb = \"cache\""
            )),
            None,
            "a worker's link to the shared redis-server"
        );
        assert_eq!(
            field(&format!("{shared}[[faults]]\nkind = \"cache_down\"\nat_s = 1")),
            None,
            "the redis-server killed"
        );
        assert_eq!(
            field("kind = \"llama_cpp\"\n[[faults]]\nkind = \"partition\"\nat_s = 1\na = \"gpu\"\nb = \"gpu\""),
            Some("faults[0]".into()),
            "no link from a server to itself"
        );
        assert_eq!(
            field(&format!("{shared}clock = {{ offset_ms = 500 }}\n")),
            Some("cache.clock".into()),
            "a real redis-server keeps this machine's time"
        );
        let behave = |behaviour: &str| {
            field(&format!(
                "kind = \"llama_cpp\"\n[[faults]]\nkind = \"behave\"\nat_s = 1\nserver = \"gpu\"\nbehaviour = {behaviour}"
            ))
        };
        assert_eq!(behave("{ mode = \"hang\" }"), None, "a stopped process");
        assert_eq!(behave("{ mode = \"normal\" }"), None, "a continued one");
        assert_eq!(
            behave("{ mode = \"hang\", probability = 0.5 }"),
            Some("faults[0].behaviour".into()),
            "a process cannot hang half its requests"
        );
        assert_eq!(behave("{ mode = \"rate_limit\" }"), Some("faults[0].behaviour".into()));
    }
}
