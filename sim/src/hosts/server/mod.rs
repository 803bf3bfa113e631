//! A simulated GPU model server speaking OpenAI chat completions.
//!
//! The hardening under test only ever sees a model server through HTTP, so
//! the simulator needs one that fails the way real ones do: a llama.cpp-style
//! reload period after every (re)start, a fixed number of decode slots with a
//! bounded FIFO queue in front of them, overload collapse, and the misbehaviour
//! modes of [`Behaviour`] (empty answers, malformed JSON, refusals, 429s, 500s,
//! hangs, dropped connections). Everything runs on turmoil's virtual time and
//! seeded RNGs, so the same scenario and seed serve the same answers.
//!
//! A server's [`ServerKind`] picks what it behaves like. This page
//! describes the `generic` kind, the default; the others (`llama_cpp`,
//! `llama_swap`, `vllm`, `ollama`, `openai`) serve through the
//! continuous-batching engine of [`batching`] behind the gates of their kind
//! (`front.rs`, [`quota`]), documented on [`ServerKind`] and in
//! `docs/server-kinds.md`. Their draws beyond the behaviour draw (load times,
//! token counts, step times) come from their own ChaCha streams of the
//! server's seed, so a generic server draws exactly what it always drew.
//!
//! # What a request goes through
//!
//! `POST /v1/chat/completions` on the server's port ([`PORT`] on a host of
//! its own, the next ones on a shared host) is handled in this order (any
//! other path is `404`, a body that is not JSON is `400`):
//!
//! 1. **Reload.** For `reload_s` (or a draw of `reload`) after each restart of the process (every
//!    `Sim::bounce`, every [`ServerHandle::restart`]; the first start too when
//!    the spec says `cold_start`), the answer
//!    is `503` with llama.cpp's
//!    `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`
//!    (outcome `loading`). When the load completes the server records
//!    `Loaded` in the trace (every kind, at the instant its load ends), which
//!    is when fault episodes and the heal count the server ready.
//! 2. **Collapsed.** A collapsed server answers nothing (outcome `collapsed`,
//!    see below).
//! 3. **Behaviour.** One draw from the server's ChaCha RNG decides whether the
//!    current [`Behaviour`]'s mode applies (probability `probability`);
//!    otherwise the request is served normally. `rate_limit` (`429` with
//!    `Retry-After` in whole seconds, rounded up, and `retry-after-ms`),
//!    `error` (`500`), `loading` (`503 Loading model`), `hang` (never answered)
//!    and `drop` (connection closed without a response) are immediate and take
//!    no capacity: they model a proxy or the network in front of the GPU.
//!    (On a `llama_cpp` server a hang of every request is its process
//!    stopped: each request is held, and served once the behaviour changes,
//!    whether or not its client is still there, until its handler looks
//!    and finds the client gone; what it was generating waits as long as
//!    the stop — `docs/server-kinds.md`.)
//! 4. **Capacity.** With `slots + queue` requests already in flight the answer
//!    is `503` `{"error":{"code":503,"message":"server busy","type":"unavailable_error"}}`
//!    (outcome `queue_full`). Otherwise the request waits (FIFO) for one of
//!    `slots` slots and holds it for `prompt_tokens / prefill_tokens_per_s +
//!    output_tokens / decode_tokens_per_s` seconds of virtual time (each
//!    count the request carries in [`crate::hosts::TOKENS_HEADER`] — a
//!    replayed request's, or its tenant's draw — in place of the spec's).
//! 5. **Answer.** `200` with a `chat.completion` body. `normal` content is a
//!    JSON object satisfying the request's
//!    `response_format.json_schema.schema` (see [`content_for_schema`]);
//!    `empty` is `""` with `finish_reason: "length"` and `reasoning_content`
//!    set; `malformed` is prose that is not JSON; `refuse` has a null content
//!    and `message.refusal` set.
//!
//! # Collapse
//!
//! *In flight* counts the requests admitted at step 4 that are not yet
//! answered: running, queued, and hung by a collapse. A request leaves it when
//! it is answered or when its client closes the connection (hyper notices the
//! EOF and drops the handler). The server **collapses** the moment in flight
//! reaches `collapse_at` (a value of 0 is taken as 1; one above `slots + queue`
//! can never be reached). While collapsed, every request in flight stops where
//! it is and every request that arrives hangs; none is ever answered, and each
//! stays in flight until its client gives up. The server **recovers** the
//! moment in flight falls below `slots` (or below `collapse_at`, if that is
//! smaller): requests arriving afterwards are served normally, while the ones
//! hung earlier stay unanswered. So a server only recovers once its clients
//! back off — which is what the breaker is for. A fleet that does not back
//! off keeps it collapsed for good: each hung request holds its place until
//! its client's timeout, so a few workers retrying hung requests (a half-open
//! probe retrying past its breaker's probe lease, whose verdict is then lost
//! while fresh probes follow) never let in flight fall below `slots`.
//!
//! # Crashes
//!
//! Two ways to stop a server, which clients see differently. turmoil's
//! `Sim::crash` takes the whole host off the network: packets to it are held
//! until it is bounced, so a connection attempt is never answered and the
//! client times out. [`ServerHandle::kill`] kills only the process: the
//! machine stays up, every connection is reset, and new connections are
//! refused at once until [`ServerHandle::restart`] (what `Fault::Crash` and
//! `Fault::Restart` describe).
//!
//! # Trace
//!
//! Every request records one [`Kind::Served`] under the server's name when its
//! outcome is known: `ok`, `loading`, `queue_full`, `collapsed`, `not_found`,
//! `bad_request`, the mode applied (`empty`, `malformed`, `refuse`,
//! `rate_limit`, `error`, `hang`, `drop`), or `abandoned` for a request whose
//! client left (or whose server crashed) while it was queued or running, or
//! `truncated` for an answer cut at the request's `max_tokens` (or, on the
//! llama.cpp family, the context). The batching kinds add `context_exceeded`
//! (llama.cpp's 400), `throttled` (a 429 from llama-swap's
//! concurrency limit or a quota bucket), `quota_exhausted` and `load_failed`
//! (llama-swap's health check timed out).
//! `impaired` is false only for `ok`, `not_found`, `bad_request`, `context_exceeded`
//! and `truncated`.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinSet;

use crate::evidence::outcome::Answer;
use crate::evidence::trace::{HostTrace, Kind, Trace};
use crate::hosts::clock::sim_elapsed;
use crate::scenario::{Behaviour, Mode, ServerSpec};

mod answer;
pub mod batching;
mod front;
mod http_pool;
pub mod kinds;
pub mod quota;

use crate::scenario::ServerKind;
pub use answer::content_for_schema;
use answer::{ChatRequest, Contents, Usage, completion};
use front::{Batching, EngineOutcome, ExtraRng, LoadError};
use http_pool::{HttpPool, Start as PoolStart, Thread};
use kinds::Preset;
use quota::{Credit, Decision, Limit, go_duration};

/// The port a model server listens on on a host of its own, and the first
/// of the ports servers sharing a host listen on
/// ([`crate::world::layout::server_hosts`]). Workers always address a
/// server at this port by its name ([`crate::hosts::transport::Addresses`]).
pub const PORT: u16 = 8080;

/// The only path served.
pub const PATH: &str = "/v1/chat/completions";

/// The path of llama.cpp's server properties (`GET`), which say its slots.
pub const PROPS_PATH: &str = "/props";

/// The largest request body read; a larger one is answered `400`.
const MAX_BODY: usize = 1 << 20;

/// The driver's side of a server: change its behaviour, read its counters.
///
/// Cheap to clone; clones share one server. The behaviour survives restarts
/// (it is part of the fault schedule, not of the process); the load counters
/// start from zero at each start.
#[derive(Clone, Debug)]
pub struct ServerHandle {
    shared: Arc<Mutex<Shared>>,
    /// The account whose credit its quota spends, kept across starts: one
    /// it shares with other servers (see [`ServerHandle::on_account`]), or
    /// else its own, opened with the spec's `credit_tokens` at its first
    /// start.
    account: Arc<OnceLock<Credit>>,
    /// Whether the process is up, and which life it is in (see
    /// [`ServerHandle::kill`]).
    process: Arc<watch::Sender<Process>>,
    /// Woken at every change of behaviour: a stopped llama.cpp process's
    /// held requests wait on it to be continued.
    behaviour_changed: Arc<Notify>,
}

/// A snapshot of a server's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// How many times the host has started (1 after the first start).
    pub starts: u32,
    /// Requests received, over every start.
    pub received: u64,
    /// Requests by how they were answered (as recorded in the trace), over every start.
    pub outcomes: BTreeMap<Answer, u64>,
    /// Requests in flight now (running, queued, or hung by a collapse).
    pub in_flight: u32,
    /// Requests holding a slot now.
    pub running: u32,
    /// Whether the server is collapsed now.
    pub collapsed: bool,
    /// How many times it has collapsed, over every start.
    pub collapses: u32,
    /// Batching kinds: running sequences preempted (vLLM recompute) in this start.
    pub preemptions: u64,
}

#[derive(Debug)]
struct Shared {
    behaviour: Behaviour,
    /// Which start the load counters belong to.
    generation: u64,
    stats: ServerStats,
    /// Responses sent, for unique completion ids.
    answered: u64,
    /// The current start's batching engine (batching kinds).
    batching: Option<Arc<Batching>>,
}

impl ServerHandle {
    /// A handle for a server that starts out answering with `behaviour`
    /// (usually the spec's `behaviour`).
    pub fn new(behaviour: Behaviour) -> Self {
        ServerHandle {
            shared: Arc::new(Mutex::new(Shared {
                behaviour,
                generation: 0,
                stats: ServerStats::default(),
                answered: 0,
                batching: None,
            })),
            process: Arc::new(watch::Sender::new(Process { up: true, life: 0 })),
            behaviour_changed: Arc::new(Notify::new()),
            account: Arc::new(OnceLock::new()),
        }
    }

    /// This server's quota spends `credit`, an account it shares with the
    /// other servers of its quota group, across every start. Call it before
    /// the first start.
    pub fn on_account(self, credit: Credit) -> Self {
        let _ = self.account.set(credit);
        self
    }

    /// Changes how the server answers from now on (requests already admitted
    /// keep the mode they drew).
    pub fn set_behaviour(&self, behaviour: Behaviour) {
        let mut shared = self.lock();
        let before = std::mem::replace(&mut shared.behaviour, behaviour);
        // A llama.cpp process stopped whole freezes what it was working on.
        if let Some(b) = &shared.batching {
            let kind = b.preset.kind;
            match (stopped_whole(kind, before), stopped_whole(kind, behaviour)) {
                (false, true) => b.stop(),
                (true, false) => b.resume(),
                _ => {}
            }
        }
        drop(shared);
        self.behaviour_changed.notify_waiters();
    }

    /// Kills the server process but not its machine: the listener closes,
    /// every connection is reset and every request in flight is lost, and
    /// connections are refused until [`ServerHandle::restart`]. (turmoil's
    /// `Sim::crash` takes the whole host off the network instead: packets to
    /// it are held, so connections to it time out rather than being refused.)
    pub fn kill(&self) {
        self.process.send_modify(|p| p.up = false);
    }

    /// Starts a killed process again, with a fresh reload period. Does nothing
    /// if it is running. A kill and a restart in the same instant are a
    /// process that dies and starts again: the server sees the new life even
    /// if it never saw the process down.
    pub fn restart(&self) {
        self.process.send_if_modified(|p| {
            let restarts = !p.up;
            if restarts {
                *p = Process {
                    up: true,
                    life: p.life + 1,
                };
            }
            restarts
        });
    }

    /// Whether the process is up (not killed through this handle).
    pub fn is_up(&self) -> bool {
        self.process.borrow().up
    }

    /// The current behaviour.
    pub fn behaviour(&self) -> Behaviour {
        self.lock().behaviour
    }

    /// The counters now.
    pub fn stats(&self) -> ServerStats {
        let shared = self.lock();
        let mut stats = shared.stats.clone();
        if let Some(b) = &shared.batching {
            let (running, in_flight, preemptions) = b.counts();
            stats.running = running;
            stats.in_flight = in_flight;
            stats.preemptions = preemptions;
        }
        stats
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        // Counters cannot be left inconsistent by a panic elsewhere.
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Default for ServerHandle {
    /// A handle for a server answering normally.
    fn default() -> Self {
        ServerHandle::new(Behaviour::default())
    }
}

/// The factory type [`server_host`] returns, as `Sim::host` takes it.
pub type HostFuture = Pin<Box<dyn Future<Output = turmoil::Result> + 'static>>;

/// A turmoil host running the model server described by `spec`, recording into
/// `trace` under `spec.name` and drawing its behaviour from a ChaCha RNG seeded
/// with `seed`.
///
/// Pass the result to `Sim::host(spec.name, ...)`. Each start of the process —
/// the first, every `Sim::bounce`, and every [`ServerHandle::restart`] after a
/// [`ServerHandle::kill`] — begins a fresh reload period with empty slots and
/// queue; the RNG continues across restarts.
pub fn server_host(spec: ServerSpec, handle: ServerHandle, trace: Trace, seed: u64) -> impl Fn() -> HostFuture {
    server_on(spec, handle, trace, seed, PORT)
}

/// Like [`server_host`], the server listening on `port`: one of several
/// on a host ([`servers_host`]).
pub fn server_on(
    spec: ServerSpec,
    handle: ServerHandle,
    trace: Trace,
    seed: u64,
    port: u16,
) -> impl Fn() -> HostFuture {
    let rng = Arc::new(Mutex::new(ChaCha8Rng::seed_from_u64(seed)));
    let extra = Arc::new(Mutex::new(ExtraRng::new(seed)));
    let trace = trace.host(&spec.name);
    move || {
        let server = Server {
            port,
            spec: spec.clone(),
            handle: handle.clone(),
            trace: trace.clone(),
            rng: rng.clone(),
            extra: extra.clone(),
        };
        Box::pin(server.run())
    }
}

/// A turmoil host running every server of `servers` ([`server_on`], each on
/// a port of its own) at once, each its own task. The host fails with the
/// first of them that fails.
pub fn servers_host(servers: Vec<Box<dyn Fn() -> HostFuture>>) -> impl Fn() -> HostFuture {
    move || {
        let lives: Vec<HostFuture> = servers.iter().map(|server| server()).collect();
        Box::pin(async move {
            let tasks: Vec<_> = lives.into_iter().map(tokio::task::spawn_local).collect();
            for task in tasks {
                task.await.map_err(|e| e.to_string())??;
            }
            Ok(())
        })
    }
}

/// Everything a server host needs across its starts.
struct Server {
    /// The port it listens on.
    port: u16,
    spec: ServerSpec,
    handle: ServerHandle,
    trace: HostTrace,
    rng: Arc<Mutex<ChaCha8Rng>>,
    /// Load times, token counts and step times (see [`ExtraRng`]).
    extra: Arc<Mutex<ExtraRng>>,
}

/// One start of a server: what a crash throws away.
struct Start {
    spec: ServerSpec,
    handle: ServerHandle,
    trace: HostTrace,
    rng: Arc<Mutex<ChaCha8Rng>>,
    extra: Arc<Mutex<ExtraRng>>,
    generation: u64,
    started_at: Duration,
    /// Whether this start loads the model, and for how long.
    loads: bool,
    reload_s: f64,
    slots: Semaphore,
    collapsed: watch::Sender<bool>,
    /// The engine and gate state of a batching kind.
    batching: Option<Arc<Batching>>,
    /// The content of a `normal` answer to the schema last asked for.
    contents: Contents,
}

impl Server {
    async fn run(self) -> turmoil::Result {
        let mut process = self.handle.process.subscribe();
        loop {
            // Down (killed through the handle) until restarted through it.
            if process.wait_for(|p| p.up).await.is_err() {
                return Ok(());
            }
            self.serve(&mut process).await?;
        }
    }

    /// One life of the process: from a start (or restart) until it is killed.
    async fn serve(&self, process: &mut watch::Receiver<Process>) -> turmoil::Result {
        let life = process.borrow().life;
        let generation = {
            let mut shared = self.handle.lock();
            shared.generation += 1;
            shared.stats.starts += 1;
            shared.stats.in_flight = 0;
            shared.stats.running = 0;
            shared.stats.collapsed = false;
            shared.generation
        };
        let loads = generation > 1 || self.spec.cold_start;
        // Drawn only when a distribution is given, so fixed reloads draw nothing.
        let reload_s = if loads {
            self.extra
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .load_time(self.spec.reload, self.spec.reload_s)
        } else {
            0.0
        };
        let preset = Preset::of(&self.spec);
        let batching = preset.map(|preset| {
            // llama-swap and Ollama load on demand: a start that loads begins
            // with the model out of memory, and its first request loads it.
            let on_demand = matches!(preset.kind, ServerKind::LlamaSwap | ServerKind::Ollama);
            let account = self
                .handle
                .account
                .get_or_init(|| Credit::new(self.spec.quota.and_then(|q| q.credit_tokens)));
            Arc::new(Batching::new(preset, !(on_demand && loads), account.clone()))
        });
        self.handle.lock().batching = batching.clone();
        let start = Arc::new(Start {
            slots: Semaphore::new(usize::try_from(self.spec.slots).unwrap_or(usize::MAX)),
            spec: self.spec.clone(),
            handle: self.handle.clone(),
            trace: self.trace.clone(),
            rng: self.rng.clone(),
            extra: self.extra.clone(),
            generation,
            started_at: sim_elapsed(),
            loads,
            reload_s,
            collapsed: watch::Sender::new(false),
            batching: batching.clone(),
            contents: Contents::default(),
        });
        // vLLM serves nothing, not even a connection, until its engine is up.
        if self.spec.kind == ServerKind::Vllm && loads {
            let wait = Duration::try_from_secs_f64(reload_s).unwrap_or(Duration::MAX);
            tokio::select! {
                biased;
                down = process.wait_for(|p| !p.up || p.life != life) => {
                    if down.is_err() {
                        std::future::pending::<()>().await;
                    }
                    return Ok(());
                }
                () = tokio::time::sleep(wait) => {}
            }
        }
        let listener = turmoil::net::TcpListener::bind((IpAddr::from(Ipv4Addr::UNSPECIFIED), self.port)).await?;
        // Dropping the set at a kill aborts every connection with the process.
        let mut connections = JoinSet::new();
        if loads {
            match self.spec.kind {
                // Loaded once the loading window (503 `Loading model`) is over.
                ServerKind::Generic | ServerKind::LlamaCpp => {
                    let trace = self.trace.clone();
                    let wait = Duration::try_from_secs_f64(reload_s).unwrap_or(Duration::MAX);
                    connections.spawn(async move {
                        tokio::time::sleep(wait).await;
                        trace.record(Kind::Loaded);
                    });
                }
                // vLLM loaded before it listened; a hosted endpoint has
                // nothing to load.
                ServerKind::Vllm | ServerKind::OpenAi => self.trace.record(Kind::Loaded),
                // They load on demand: the load a request starts records it.
                ServerKind::LlamaSwap | ServerKind::Ollama => {}
            }
        }
        if let Some(b) = batching {
            let extra = self.extra.clone();
            connections.spawn(async move {
                b.drive(extra).await;
            });
        }
        let keep_alive = KeepAlive::of(self.spec.kind);
        // llama-server serves connections on a pool of threads.
        let pool = (self.spec.kind == ServerKind::LlamaCpp).then(|| {
            let cpu = self.spec.cpu;
            Arc::new(HttpPool::new(
                self.spec.max_seqs.unwrap_or(self.spec.slots),
                cpu.map(|c| c.cores),
                cpu.is_some_and(|c| c.crowded()),
            ))
        });
        loop {
            tokio::select! {
                biased;
                down = process.wait_for(|p| !p.up || p.life != life) => {
                    if down.is_err() {
                        std::future::pending::<()>().await;
                    }
                    return Ok(());
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                accepted = listener.accept() => {
                    let (stream, _) = accepted?;
                    let serving = Serving {
                        start: start.clone(),
                        keep_alive: keep_alive.clone(),
                    };
                    let Some(pool) = &pool else {
                        connections.spawn(async move { serving.serve(stream).await });
                        continue;
                    };
                    let computing = start.batching.as_ref().is_some_and(|b| b.computing());
                    let pool = pool.clone();
                    match pool.accept(stream, computing, sim_elapsed()) {
                        None => {}
                        Some(PoolStart::Serve(thread, stream)) => {
                            connections.spawn(serving.on_thread(pool, thread, Some(stream)));
                        }
                        Some(PoolStart::Woken(thread)) => {
                            connections.spawn(async move {
                                tokio::time::sleep(http_pool::WOKEN_AFTER).await;
                                let job = pool.woke(thread, sim_elapsed());
                                serving.on_thread(pool, thread, job).await;
                            });
                        }
                    }
                }
            }
        }
    }
}

/// A connection queued in llama-server's HTTP pool.
type PoolJob = turmoil::net::TcpStream;

/// What serves one accepted connection: the start's handler, under the
/// kind's keep-alive.
struct Serving {
    start: Arc<Start>,
    keep_alive: Option<KeepAlive>,
}

impl Serving {
    /// Serves `stream` until either end closes it.
    ///
    /// A request's handler runs inside hyper's connection, which drops it
    /// when its client leaves; on a `llama_cpp` server it is a task of its
    /// own instead, as llama-server's handler runs on its HTTP thread
    /// whatever its client does: the client's leaving is recorded then, and
    /// the handler runs on until it looks ([`Batching::serve_until_looked`]),
    /// keeping the connection's thread until it ends. A request read from
    /// a connection whose client had already left runs too.
    async fn serve(&self, stream: turmoil::net::TcpStream) {
        let (start, keep_alive) = (self.start.clone(), self.keep_alive.clone());
        let detached = start.spec.kind == ServerKind::LlamaCpp;
        // Each detached handler holds a sender; the receiver ends when
        // the connection and every handler it started have.
        let (handlers, mut handlers_done) = tokio::sync::mpsc::channel::<()>(1);
        // Requests this connection has carried.
        let carried = std::sync::atomic::AtomicU32::new(0);
        let idle = keep_alive.as_ref().map(|k| k.idle);
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let start = start.clone();
            let caller = request
                .headers()
                .get(crate::hosts::CALL_HEADER)
                .and_then(|v| v.to_str().ok())
                .filter(|v| v.len() <= MAX_CALLER_LEN)
                .map(str::to_owned);
            let nth = carried
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                .saturating_add(1);
            let keep_alive = keep_alive.clone();
            let exchange = Arc::new(Exchange::new(caller));
            let handler = EXCHANGE.scope(exchange.clone(), start.clone().handle(request));
            let reply: Pin<Box<dyn Future<Output = Reply> + Send>> = if detached {
                // Started now, so it runs even if hyper never polls what
                // it awaits (it reads the client's end with the request).
                let answered = start.clone().detach(handler, handlers.clone());
                let mut left = ClientLeft {
                    exchange: Some(exchange),
                    start,
                };
                Box::pin(async move {
                    let reply = answered.await.unwrap_or(Err(DropConnection));
                    left.answered();
                    reply
                })
            } else {
                Box::pin(handler)
            };
            async move {
                let mut reply = reply.await;
                if let (Some(keep_alive), Ok(response)) = (&keep_alive, &mut reply) {
                    keep_alive.announce(response, nth);
                }
                reply
            }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        if let Some(idle) = idle {
            // hyper arms this timer whenever it waits for a request's
            // head, idle time included.
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(idle);
        }
        // A connection ends in an error whenever a client gives up or a
        // `drop` closes it; neither is the server's failure.
        let _ = builder.serve_connection(TokioIo::new(stream), service).await;
        handlers_done.recv().await;
    }

    /// A thread of llama-server's HTTP pool: serves `job` (a connection),
    /// then each connection the pool hands it as the last one closes,
    /// until it waits.
    async fn on_thread(self, pool: Arc<HttpPool<PoolJob>>, thread: Thread, mut job: Option<PoolJob>) {
        while let Some(stream) = job {
            self.serve(stream).await;
            job = pool.finished(thread, sim_elapsed());
        }
    }
}

/// One request, as its handler and the connection it came on share it:
/// the call it belongs to, its one record in the trace, and whether its
/// client has left.
struct Exchange {
    caller: Option<String>,
    record: Mutex<Record>,
    /// Whether the client has left, for a handler that looks.
    left: watch::Sender<bool>,
}

/// Whether a request's record is written, and what it is if its client
/// leaves before it is answered.
#[derive(Default)]
struct Record {
    written: bool,
    if_left: Option<Answer>,
}

impl Exchange {
    fn new(caller: Option<String>) -> Self {
        Exchange {
            caller,
            record: Mutex::default(),
            left: watch::Sender::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `answer` to the request's call, unless it already has its
    /// record.
    fn record(&self, start: &Start, answer: Answer) {
        let mut record = self.lock();
        if record.written {
            return;
        }
        record.written = true;
        drop(record);
        start.record_for(answer, self.caller.clone());
    }

    /// What to record if the client leaves before the answer.
    fn if_left(&self, answer: Answer) {
        self.lock().if_left = Some(answer);
    }

    /// Its handler ended unanswered, or its client left: records what
    /// [`Exchange::if_left`] says, if anything.
    fn unanswered(&self, start: &Start) {
        let if_left = self.lock().if_left;
        if let Some(answer) = if_left {
            self.record(start, answer);
        }
    }
}

tokio::task_local! {
    /// The request being handled.
    static EXCHANGE: Arc<Exchange>;
}

/// A request never answered: the reply, once its client has left, of a
/// handler detached from it, which would otherwise hold its connection's
/// thread for good; hyper drops any other handler then.
async fn unanswered() -> Reply {
    if let Some(e) = exchange() {
        let _ = e.left.subscribe().wait_for(|left| *left).await;
        return Err(DropConnection);
    }
    std::future::pending().await
}

/// The request the current task handles, if any.
fn exchange() -> Option<Arc<Exchange>> {
    EXCHANGE.try_with(Arc::clone).ok()
}

/// A detached handler's client side: dropped before the answer, the
/// client left (or the process died with the connection), and the
/// request is recorded then, as its client saw it: `abandoned` once the
/// server has taken it, `hang` before that or while a stopped process
/// holds it (the laboratory records a call that timed out so).
struct ClientLeft {
    exchange: Option<Arc<Exchange>>,
    start: Arc<Start>,
}

impl ClientLeft {
    /// The handler answered while the client was there.
    fn answered(&mut self) {
        self.exchange = None;
    }
}

impl Drop for ClientLeft {
    fn drop(&mut self) {
        if let Some(exchange) = self.exchange.take()
            && turmoil::sim_elapsed().is_some()
        {
            exchange.left.send_replace(true);
            if exchange.lock().if_left.is_none() {
                exchange.if_left(Answer::Hang);
            }
            exchange.unanswered(&self.start);
        }
    }
}

/// How long a server keeps a connection open between requests, and how
/// many requests one connection may carry.
///
/// llama-server's HTTP layer (cpp-httplib) closes a keep-alive connection
/// idle for 5 s, and closes one after its 100th response, which says
/// `Connection: close`; each response says `Keep-Alive: timeout=5,
/// max=100`. Measured on llama-server of llama-cpp-python 0.3.36: closed
/// after 5.00 s idle, whether or not it had carried a request, and after
/// the 100th of 101 requests. A client that keeps connections longer
/// (reqwest keeps an idle one 90 s) opens a new one after such a close,
/// and a request sent on a connection as the server closes it is reset.
/// The other kinds keep a connection until their client closes it.
/// (A stopped llama.cpp process closes nothing until continued; the
/// simulated one still closes idle connections during a stop.)
#[derive(Clone, Debug, PartialEq, Eq)]
struct KeepAlive {
    /// Idle time after which the server closes a connection.
    idle: Duration,
    /// Requests after which it closes one.
    max: u32,
    /// The `Keep-Alive` header saying both, made once and shared.
    header: hyper::header::HeaderValue,
}

impl KeepAlive {
    /// What a server of `kind` does, or `None` when it keeps connections.
    fn of(kind: ServerKind) -> Option<KeepAlive> {
        match kind {
            ServerKind::LlamaCpp => Some(KeepAlive {
                idle: Duration::from_secs(5),
                max: 100,
                header: hyper::header::HeaderValue::from_static("timeout=5, max=100"),
            }),
            ServerKind::Generic
            | ServerKind::LlamaSwap
            | ServerKind::Vllm
            | ServerKind::Ollama
            | ServerKind::OpenAi => None,
        }
    }

    /// Marks the response to a connection's `nth` request as the server
    /// would: the last one it carries says `Connection: close` (and hyper
    /// closes the connection once it is written), the others the limits.
    fn announce(&self, response: &mut Response<Full<Bytes>>, nth: u32) {
        let headers = response.headers_mut();
        if nth >= self.max {
            headers.insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("close"),
            );
        } else {
            headers.insert("keep-alive", self.header.clone());
        }
    }
}

/// Whether `behaviour` on a server of `kind` is its process stopped whole
/// (SIGSTOP): a llama.cpp server whose every request hangs. A hang of only
/// some requests, or of another kind, is a request the server never answers.
fn stopped_whole(kind: ServerKind, behaviour: Behaviour) -> bool {
    kind == ServerKind::LlamaCpp && behaviour.mode == Mode::Hang && behaviour.probability >= 1.0
}

/// The process's state as the driver sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Process {
    /// Whether it is running.
    up: bool,
    /// How many times it has been restarted through the handle.
    life: u64,
}

/// Returned by the service to make hyper close the connection unanswered.
#[derive(Debug, thiserror::Error)]
#[error("connection dropped by the server's behaviour")]
struct DropConnection;

type Reply = Result<Response<Full<Bytes>>, DropConnection>;

/// How a misbehaviour mode answers before any capacity is used.
enum Early {
    /// With this reply.
    Reply(Reply),
    /// Never.
    Hang,
}

/// A request of a batching kind the server has taken: if its handler ends
/// before it is answered (its client left, a look found it gone, or its
/// start ended), it is recorded as its exchange's `if_left` says:
/// `abandoned`, or `hang` for a request a stopped process holds.
struct Pending {
    start: Arc<Start>,
    exchange: Option<Arc<Exchange>>,
}

impl Pending {
    fn new(start: Arc<Start>) -> Self {
        let exchange = exchange();
        if let Some(e) = &exchange {
            e.if_left(Answer::Abandoned);
        }
        Pending { start, exchange }
    }

    /// What is recorded if its client leaves first.
    fn if_left(&self, answer: Answer) {
        if let Some(e) = &self.exchange {
            e.if_left(answer);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(e) = &self.exchange
            && turmoil::sim_elapsed().is_some()
        {
            e.unanswered(&self.start);
        }
    }
}

/// The longest caller name a request may carry; a longer one is ignored.
const MAX_CALLER_LEN: usize = 128;

impl Start {
    /// Records `answer` as the current request's one record.
    fn record(&self, answer: Answer) {
        match exchange() {
            Some(e) => e.record(self, answer),
            None => self.record_for(answer, None),
        }
    }

    /// Runs `handler` as a task of its own until it ends or the process
    /// dies, holding `handlers` meanwhile; resolves with its reply.
    fn detach(
        self: Arc<Self>,
        handler: impl Future<Output = Reply> + Send + 'static,
        handlers: tokio::sync::mpsc::Sender<()>,
    ) -> tokio::sync::oneshot::Receiver<Reply> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut process = self.handle.process.subscribe();
        let life = process.borrow().life;
        tokio::spawn(async move {
            let _handlers = handlers;
            tokio::select! {
                biased;
                _ = process.wait_for(|p| !p.up || p.life != life) => {}
                reply = handler => {
                    let _ = tx.send(reply);
                }
            }
        });
        rx
    }

    /// Records `answer` to the call `caller` names.
    fn record_for(&self, answer: Answer, caller: Option<String>) {
        *self.handle.lock().stats.outcomes.entry(answer).or_default() += 1;
        self.trace.record(Kind::served_for(answer, caller));
    }

    async fn handle(self: Arc<Self>, request: Request<Incoming>) -> Reply {
        if request.method() == Method::GET && request.uri().path() == PROPS_PATH {
            return Ok(self.props());
        }
        self.handle.lock().stats.received += 1;
        if request.method() != Method::POST || request.uri().path() != PATH {
            self.record(Answer::NotFound);
            return Ok(error_response(StatusCode::NOT_FOUND, "not found", "not_found_error"));
        }
        let key = request
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let tokens = crate::hosts::token_sides_of(
            request
                .headers()
                .get(crate::hosts::TOKENS_HEADER)
                .and_then(|v| v.to_str().ok()),
        );
        let body = match Limited::new(request.into_body(), MAX_BODY).collect().await {
            Ok(body) => body.to_bytes(),
            Err(_) => {
                self.record(Answer::BadRequest);
                return Ok(error_response(
                    StatusCode::BAD_REQUEST,
                    "unreadable body",
                    "invalid_request_error",
                ));
            }
        };
        let Some(body) = ChatRequest::read(&body) else {
            self.record(Answer::BadRequest);
            return Ok(error_response(
                StatusCode::BAD_REQUEST,
                "body is not JSON",
                "invalid_request_error",
            ));
        };

        if let Some(batching) = self.batching.clone() {
            return self.handle_batching(batching, body, &key, tokens).await;
        }
        if self.loading_now() {
            self.record(Answer::Loading);
            return Ok(loading());
        }
        if *self.collapsed.borrow() {
            // Counted in flight until its client gives up, like any other.
            let _hung = self.admit_hung();
            self.record(Answer::Collapsed);
            return std::future::pending().await;
        }
        let mode = self.draw_mode();
        match self.misbehave(mode) {
            Some(Early::Reply(reply)) => return reply,
            Some(Early::Hang) => return std::future::pending().await,
            None => {}
        }

        let Some(mut guard) = self.admit() else {
            self.record(Answer::QueueFull);
            return Ok(error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "server busy",
                "unavailable_error",
            ));
        };
        let (prompt, wanted) = (
            tokens
                .and_then(|t| t.prompt)
                .unwrap_or(u64::from(self.spec.prompt_tokens)),
            tokens
                .and_then(|t| t.output)
                .unwrap_or(u64::from(self.spec.output_tokens)),
        );
        // The answer stops at the request's max_tokens, cut off.
        let max_tokens = body.max_tokens;
        let (output, cut) = front::output_tokens(wanted, max_tokens, prompt, None);
        let truncated = cut && mode == Mode::Normal;
        let service = if tokens.is_some() || cut {
            let s = self.spec.slot_time_s(prompt, output);
            // No longer than validation allows any request to take.
            let most = crate::scenario::limits::MAX_SERVICE_TIME_S;
            Duration::try_from_secs_f64(s.min(most)).unwrap_or(Duration::from_secs_f64(most))
        } else {
            self.service_time()
        };
        if !guard.served(service).await {
            guard.outcome_recorded = true;
            self.record(Answer::Collapsed);
            return std::future::pending().await;
        }
        guard.outcome_recorded = true;
        self.record(if truncated {
            Answer::Truncated
        } else {
            Answer::of_mode(mode)
        });
        let id = self.next_answer_id();
        let usage = Usage {
            prompt,
            cached: 0,
            completion: output,
            truncated,
        };
        Ok(completion(&self.spec, &self.contents, id, mode, &body, usage))
    }

    fn next_answer_id(&self) -> u64 {
        let mut shared = self.handle.lock();
        shared.answered += 1;
        shared.answered
    }

    /// Whether this start is still loading its model (answered `503 Loading
    /// model` by the generic and llama.cpp kinds).
    /// llama.cpp's `GET /props`, with the two fields `calibrate` reads: the
    /// slots, and the context each slot has (`-c` over the slots, as
    /// llama.cpp 0c1e570 reports it with its KV cache not unified). `503
    /// Loading model` during a load, as every endpoint but `/health` answers
    /// then; `404` on the other kinds, which have no such endpoint. Not a
    /// request of the trace: nothing is recorded.
    fn props(&self) -> Response<Full<Bytes>> {
        match self.batching.as_ref().map(|b| &b.preset) {
            Some(p) if p.kind == ServerKind::LlamaCpp => {
                if self.loading_now() {
                    return loading();
                }
                let slots = p.engine.max_seqs.max(1);
                let n_ctx = p.context_tokens.unwrap_or(p.engine.kv_tokens) / u64::from(slots);
                json_response(
                    StatusCode::OK,
                    &json!({"total_slots": slots, "default_generation_settings": {"n_ctx": n_ctx}}),
                )
            }
            _ => error_response(StatusCode::NOT_FOUND, "not found", "not_found_error"),
        }
    }

    fn loading_now(&self) -> bool {
        self.loads && sim_elapsed().saturating_sub(self.started_at).as_secs_f64() < self.reload_s
    }

    /// One draw of the server's behaviour: its mode, or `normal`.
    fn draw_mode(&self) -> Mode {
        let behaviour = self.handle.behaviour();
        let draw: f64 = self.rng.lock().unwrap_or_else(|p| p.into_inner()).random();
        if draw < behaviour.probability {
            behaviour.mode
        } else {
            Mode::Normal
        }
    }

    /// The answer of a mode that answers before any capacity is used (and
    /// records it), or `None` for the modes that are served.
    fn misbehave(&self, mode: Mode) -> Option<Early> {
        match mode {
            Mode::RateLimit => {
                self.record(Answer::RateLimit);
                Some(Early::Reply(Ok(rate_limited(self.handle.behaviour().retry_after_s))))
            }
            Mode::Error => {
                self.record(Answer::Error);
                Some(Early::Reply(Ok(error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal server error",
                    "server_error",
                ))))
            }
            Mode::Loading => {
                self.record(Answer::Loading);
                Some(Early::Reply(Ok(loading())))
            }
            Mode::Hang => {
                self.record(Answer::Hang);
                Some(Early::Hang)
            }
            Mode::Drop => {
                self.record(Answer::Drop);
                Some(Early::Reply(Err(DropConnection)))
            }
            Mode::Normal | Mode::Empty | Mode::Malformed | Mode::Refuse => None,
        }
    }

    /// A request to a batching kind: the kind's gate, the behaviour draw,
    /// then the engine.
    /// `tokens` are the request's own counts ([`crate::hosts::TOKENS_HEADER`]),
    /// used in place of a draw.
    async fn handle_batching(
        self: Arc<Self>,
        b: Arc<Batching>,
        body: ChatRequest,
        key: &str,
        tokens: Option<crate::hosts::RequestTokens>,
    ) -> Reply {
        let kind = b.preset.kind;
        if kind == ServerKind::LlamaCpp && self.loading_now() {
            self.record(Answer::Loading);
            return Ok(loading());
        }
        let (prompt, wanted) = self.draw_tokens(tokens.unwrap_or_default());
        let max_tokens = body.max_tokens;
        let mut quota_headers = Vec::new();
        if kind == ServerKind::OpenAi {
            let now = sim_elapsed();
            // Charged at admission: the larger of max_tokens and the prompt.
            let charge = max_tokens.unwrap_or(0).max(prompt);
            let decided = b.quotas(|q| (q.admit(key, charge, now), q.headers(key, now)));
            if let Some((decision, headers)) = decided {
                quota_headers = headers;
                if let Some(reply) = self.refused_by_quota(decision, &quota_headers) {
                    return reply;
                }
            }
        }
        let Some(in_flight) = b.enter() else {
            if kind == ServerKind::LlamaSwap {
                self.record(Answer::Throttled);
                return Ok(too_many_requests());
            }
            self.record(Answer::QueueFull);
            return Ok(error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "server busy: the waiting queue is full",
                "unavailable_error",
            ));
        };
        // From here the request is the server's: a client that leaves while it
        // is held for a load or waits in the engine is recorded `abandoned`.
        let pending = Pending::new(self.clone());
        if matches!(kind, ServerKind::LlamaSwap | ServerKind::Ollama) && !b.is_ready() {
            let extra = self.extra.clone();
            let (reload, fixed) = (self.spec.reload, self.spec.reload_s);
            let load_time = move || extra.lock().unwrap_or_else(|p| p.into_inner()).load_time(reload, fixed);
            match b.ready(load_time).await {
                Ok(loaded_now) => {
                    if loaded_now {
                        self.trace.record(Kind::Loaded);
                    }
                }
                Err(LoadError::Failed { timeout_s }) => {
                    self.record(Answer::LoadFailed);
                    return Ok(load_failed(timeout_s));
                }
                Err(LoadError::QueueFull) => {
                    self.record(Answer::QueueFull);
                    return Ok(ollama_busy());
                }
            }
        }
        let mode = self.draw_mode();
        // A llama.cpp process stopped whole holds the request and answers
        // it normally once continued.
        let stopped = mode == Mode::Hang && stopped_whole(kind, self.handle.behaviour());
        let mode = if stopped { Mode::Normal } else { mode };
        match self.misbehave(mode) {
            Some(Early::Reply(reply)) => return reply,
            Some(Early::Hang) => return unanswered().await,
            None => {}
        }
        let (output, truncated) = front::output_tokens(wanted, max_tokens, prompt, b.preset.context_tokens);
        if stopped {
            // Its client, gone by then, hears nothing: a hang.
            pending.if_left(Answer::Hang);
            self.continued().await;
        }
        let served = match pending.exchange.as_ref().filter(|_| kind == ServerKind::LlamaCpp) {
            Some(exchange) => match b.serve_until_looked(prompt, output, &exchange.left).await {
                Ok(served) => served,
                // Its client is gone: nothing to answer.
                Err(front::ClientGone) => return Err(DropConnection),
            },
            None => b.serve(prompt, output).await,
        };
        drop(in_flight);
        match served {
            Some(EngineOutcome::Finished { generated, cached }) => {
                let truncated = truncated && mode == Mode::Normal;
                self.record(if truncated {
                    Answer::Truncated
                } else {
                    Answer::of_mode(mode)
                });
                if let Some(q) = &self.spec.quota
                    && q.credit_tokens.is_some()
                {
                    b.quotas(|quotas| quotas.spend(prompt.saturating_add(generated)));
                }
                let id = self.next_answer_id();
                let usage = Usage {
                    prompt,
                    cached,
                    completion: generated,
                    truncated,
                };
                let mut response = completion(&self.spec, &self.contents, id, mode, &body, usage);
                add_headers(&mut response, &quota_headers);
                Ok(response)
            }
            Some(EngineOutcome::Rejected) => {
                self.record(Answer::ContextExceeded);
                Ok(context_exceeded(prompt, b.preset.context_tokens.unwrap_or(0)))
            }
            // The engine is gone with its start: nothing will answer.
            None => std::future::pending().await,
        }
    }

    /// Waits until the process is continued, for a request that reached
    /// it stopped: the kernel accepted its connection and holds its bytes,
    /// and llama.cpp reads it once continued, whether or not its client is
    /// still there (its handler runs detached from its client), so
    /// requests held through a long stop are a backlog served before any
    /// that arrive later.
    async fn continued(&self) {
        loop {
            let changed = self.handle.behaviour_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !stopped_whole(ServerKind::LlamaCpp, self.handle.behaviour()) {
                return;
            }
            changed.await;
        }
    }

    /// Prompt tokens and the output length a request would generate: the
    /// counts the request carries, and for a side it does not carry a draw
    /// from the spec's distribution (or its fixed count, drawing nothing).
    fn draw_tokens(&self, given: crate::hosts::RequestTokens) -> (u64, u64) {
        let draw = |given: Option<u64>, dist: Option<crate::scenario::Spread>, fixed: u32| match (given, dist) {
            (Some(n), _) => n,
            (None, Some(d)) => d
                .sample(&mut self.extra.lock().unwrap_or_else(|p| p.into_inner()).tokens)
                .round() as u64,
            (None, None) => u64::from(fixed),
        };
        let prompt = draw(given.prompt, self.spec.prompt_tokens_dist, self.spec.prompt_tokens);
        let output = draw(given.output, self.spec.output_tokens_dist, self.spec.output_tokens);
        (prompt, output.max(1))
    }

    /// The 429 a hosted endpoint's quota answers with, recorded, or `None`
    /// when it admitted the request.
    fn refused_by_quota(&self, decision: Decision, headers: &[(&'static str, String)]) -> Option<Reply> {
        let model = &self.spec.model;
        let (body, retry_after, answer) = match decision {
            Decision::Admit => return None,
            Decision::Limited {
                limit,
                retry_after,
                requested,
                used,
            } => {
                let (what, kind, limit_value) = match limit {
                    Limit::Requests => (
                        "requests per min (RPM)",
                        "requests",
                        self.spec.quota.map_or(0, |q| u64::from(q.rpm)),
                    ),
                    Limit::Tokens => ("tokens per min (TPM)", "tokens", self.spec.quota.map_or(0, |q| q.tpm)),
                    Limit::RequestsPerDay => (
                        "requests per day (RPD)",
                        "requests",
                        self.spec.quota.and_then(|q| q.rpd).map_or(0, u64::from),
                    ),
                };
                let message = format!(
                    "Rate limit reached for {model} in organization org-sim on {what}: Limit {limit_value}, Used {used}, Requested {requested}. Please try again in {}. Visit https://platform.openai.com/account/rate-limits to learn more.",
                    go_duration(retry_after)
                );
                (
                    json!({"error": {"message": message, "type": kind, "param": null, "code": "rate_limit_exceeded"}}),
                    Some(retry_after),
                    Answer::Throttled,
                )
            }
            Decision::TooLarge { requested } => {
                let limit = self.spec.quota.map_or(0, |q| q.tpm);
                let message = format!(
                    "Request too large for {model} in organization org-sim on tokens per min (TPM): Limit {limit}, Requested {requested}."
                );
                (
                    json!({"error": {"message": message, "type": "tokens", "param": null, "code": "rate_limit_exceeded"}}),
                    None,
                    Answer::Throttled,
                )
            }
            Decision::Exhausted => (
                json!({"error": {
                    "message": "You exceeded your current quota, please check your plan and billing details.",
                    "type": "insufficient_quota",
                    "param": null,
                    "code": "insufficient_quota",
                }}),
                None,
                Answer::QuotaExhausted,
            ),
        };
        self.record(answer);
        let mut response = json_response(StatusCode::TOO_MANY_REQUESTS, &body);
        add_headers(&mut response, headers);
        if let Some(wait) = retry_after {
            let whole = |unit: u128| u64::try_from(wait.as_micros().div_ceil(unit)).unwrap_or(u64::MAX);
            let h = response.headers_mut();
            h.insert(hyper::header::RETRY_AFTER, whole(1_000_000).into());
            h.insert("retry-after-ms", whole(1000).into());
        }
        Some(Ok(response))
    }

    /// Admits a request to the capacity model, or `None` when the queue is full.
    fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let mut shared = self.handle.lock();
        if shared.generation != self.generation {
            return None;
        }
        let limit = self.spec.slots.saturating_add(self.spec.queue);
        if shared.stats.in_flight >= limit {
            return None;
        }
        shared.stats.in_flight += 1;
        if let Some(at) = self.spec.collapse_at
            && !shared.stats.collapsed
            && shared.stats.in_flight >= at.max(1)
        {
            shared.stats.collapsed = true;
            shared.stats.collapses += 1;
            self.collapsed.send_replace(true);
        }
        Some(Admitted {
            start: self.clone(),
            running: false,
            outcome_recorded: false,
        })
    }

    /// Counts a request that arrived at a collapsed server in flight, without
    /// the queue bound (a collapsed server answers nothing, not even "busy").
    fn admit_hung(self: &Arc<Self>) -> Admitted {
        let mut shared = self.handle.lock();
        if shared.generation == self.generation {
            shared.stats.in_flight += 1;
        }
        Admitted {
            start: self.clone(),
            running: false,
            outcome_recorded: true,
        }
    }

    fn service_time(&self) -> Duration {
        Duration::try_from_secs_f64(self.spec.service_time_s()).unwrap_or(Duration::ZERO)
    }
}

/// A request counted in flight; leaving (answered, hung up on, or crashed)
/// takes it out and may end a collapse.
struct Admitted {
    start: Arc<Start>,
    running: bool,
    outcome_recorded: bool,
}

impl Admitted {
    /// Waits for a slot and holds it for `service`. `false` if the server
    /// collapsed meanwhile (or already had).
    async fn served(&mut self, service: Duration) -> bool {
        let start = self.start.clone();
        let mut collapsed = start.collapsed.subscribe();
        let collapse = async move {
            // An error means the sender is gone with its start: never collapse.
            if collapsed.wait_for(|c| *c).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        tokio::pin!(collapse);
        let permit = tokio::select! {
            biased;
            () = &mut collapse => return false,
            permit = start.slots.acquire() => match permit {
                Ok(permit) => permit,
                Err(_) => return false,
            },
        };
        self.set_running(true);
        let done = tokio::select! {
            biased;
            () = &mut collapse => false,
            () = tokio::time::sleep(service) => true,
        };
        drop(permit);
        self.set_running(false);
        done
    }

    fn set_running(&mut self, running: bool) {
        let mut shared = self.start.handle.lock();
        if shared.generation == self.start.generation && self.running != running {
            if running {
                shared.stats.running += 1;
            } else {
                shared.stats.running = shared.stats.running.saturating_sub(1);
            }
        }
        self.running = running;
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.set_running(false);
        {
            let mut shared = self.start.handle.lock();
            if shared.generation == self.start.generation {
                shared.stats.in_flight = shared.stats.in_flight.saturating_sub(1);
                let recover_below = self
                    .start
                    .spec
                    .slots
                    .min(self.start.spec.collapse_at.unwrap_or(u32::MAX).max(1));
                if shared.stats.collapsed && shared.stats.in_flight < recover_below {
                    shared.stats.collapsed = false;
                    self.start.collapsed.send_replace(false);
                }
            }
        }
        // Outside a running simulation (the Sim itself being dropped) there is
        // no time to stamp the event with, and nobody left to read it.
        if !self.outcome_recorded && turmoil::sim_elapsed().is_some() {
            self.start.record(Answer::Abandoned);
        }
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    json_bytes_response(status, body.to_string().into_bytes())
}

/// A response of `status` with a JSON body already written.
fn json_bytes_response(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn error_response(status: StatusCode, message: &str, kind: &str) -> Response<Full<Bytes>> {
    json_response(
        status,
        &json!({"error": {"code": status.as_u16(), "message": message, "type": kind}}),
    )
}

fn add_headers(response: &mut Response<Full<Bytes>>, headers: &[(&'static str, String)]) {
    for (name, value) in headers {
        if let Ok(value) = hyper::header::HeaderValue::from_str(value) {
            response.headers_mut().insert(*name, value);
        }
    }
}

/// llama-swap's 429 past its concurrency limit, as released in v250
/// (`internal/swaputil/http.go`): `Retry-After: 1`, a JSON body.
pub(crate) fn too_many_requests() -> Response<Full<Bytes>> {
    let mut response = json_response(StatusCode::TOO_MANY_REQUESTS, &json!({"error": "Too many requests"}));
    response.headers_mut().insert(hyper::header::RETRY_AFTER, 1u64.into());
    response
}

/// llama-swap's answer to every request that waited for a load whose health
/// check timed out: `500 unspecific error: …` in v250's envelope.
pub(crate) fn load_failed(timeout_s: f64) -> Response<Full<Bytes>> {
    let timeout = go_duration(Duration::try_from_secs_f64(timeout_s).unwrap_or(Duration::ZERO));
    json_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        &json!({"src": "llama-swap", "error": format!("unspecific error: health check timed out after {timeout}")}),
    )
}

/// Ollama's 503 when its pending-request queue is full, as its OpenAI
/// middleware wraps it on `/v1` (`server/sched.go`, `middleware/openai.go`).
fn ollama_busy() -> Response<Full<Bytes>> {
    json_response(
        StatusCode::SERVICE_UNAVAILABLE,
        &json!({"error": {
            "message": "server busy, please try again.  maximum pending requests exceeded",
            "type": "api_error",
            "param": null,
            "code": null,
        }}),
    )
}

/// llama.cpp's 400 for a prompt that does not fit the context
/// (`server-context.cpp` `update_slots`).
fn context_exceeded(prompt: u64, n_ctx: u64) -> Response<Full<Bytes>> {
    json_response(
        StatusCode::BAD_REQUEST,
        &json!({"error": {
            "code": 400,
            "message": format!("request ({prompt} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it"),
            "type": "exceed_context_size_error",
            "n_prompt_tokens": prompt,
            "n_ctx": n_ctx,
        }}),
    )
}

fn loading() -> Response<Full<Bytes>> {
    json_response(StatusCode::SERVICE_UNAVAILABLE, &loading_body())
}

/// The body of llama.cpp's `503` while its model loads, which every kind
/// that loads answers (the laboratory checks it against a real server).
pub fn loading_body() -> Value {
    json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
}

fn rate_limited(retry_after_s: f64) -> Response<Full<Bytes>> {
    let mut response = json_response(
        StatusCode::TOO_MANY_REQUESTS,
        &json!({"error": {
            "code": "rate_limit_exceeded",
            "message": "Rate limit reached, please retry later",
            "type": "requests",
        }}),
    );
    let secs = if retry_after_s.is_finite() && retry_after_s > 0.0 {
        retry_after_s
    } else {
        0.0
    };
    let headers = response.headers_mut();
    headers.insert(hyper::header::RETRY_AFTER, (secs.ceil() as u64).into());
    headers.insert("retry-after-ms", ((secs * 1000.0).round() as u64).into());
    response
}
