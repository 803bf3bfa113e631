//! llama-swap's front, emulated in front of a real llama-server.
//!
//! llama-swap is a Go proxy that starts its upstream llama-server on demand
//! and holds every request while the upstream loads; the simulator's
//! `llama_swap` kind models that hold (`docs/server-kinds.md`). llama-swap
//! itself is not available here, so the laboratory runs a small front of
//! its own that does what the kind claims, and nothing more: the upstream
//! is a **real** llama-server process (its load, its speed, its answers);
//! the **emulated** parts are the hold, the health polling on llama-swap's
//! schedule (250 ms after the start, then every second, failing after
//! `health_check_timeout_s`), its concurrency limit (429 with
//! `Retry-After: 1`), and the bodies it answers with, which are the
//! simulated kind's own. A crash kills the front and its upstream; a
//! restart starts the front again with the upstream not running, so the
//! first request starts it, as after llama-swap's own restart.

use std::cell::{Cell, RefCell};
use std::convert::Infallible;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::llama::{LabError, LlamaServer, LlamaSpec, Tools};
use crate::evidence::trace::{Kind, Trace};

/// What the front does, from the scenario's server.
#[derive(Clone, Debug, PartialEq)]
pub struct SwapSettings {
    /// The server's name, under which its loads are recorded.
    pub name: String,
    /// Requests in flight before a 429 (`concurrency_limit`).
    pub concurrency_limit: u32,
    /// Seconds from the first health poll until a load fails.
    pub health_check_timeout_s: f64,
}

/// The upstream as the front sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Upstream {
    /// Not running: the next request starts it.
    Stopped,
    /// Load number `n` is under way.
    Loading(u64),
    /// Healthy and serving.
    Ready,
}

/// What the front's tasks share.
struct Front {
    tools: Tools,
    spec: LlamaSpec,
    settings: SwapSettings,
    trace: Trace,
    client: reqwest::Client,
    upstream: RefCell<Option<LlamaServer>>,
    state: Cell<Upstream>,
    loads: Cell<u64>,
    /// The last load that failed its health check.
    failed: Cell<Option<u64>>,
    changed: Notify,
    in_flight: Cell<u32>,
    loader: RefCell<Option<JoinHandle<()>>>,
}

/// llama-swap's front on a loopback port, over a real llama-server; every
/// task it runs is local to the laboratory's thread, and dropping it kills
/// the upstream.
pub struct SwapFront {
    port: u16,
    front: Rc<Front>,
    serving: RefCell<Option<JoinHandle<()>>>,
}

impl SwapFront {
    /// Starts the front and its upstream, loaded (as the laboratory starts
    /// every server); call it on a `LocalSet`.
    pub async fn start(
        tools: &Tools,
        spec: &LlamaSpec,
        settings: SwapSettings,
        trace: Trace,
    ) -> Result<Self, LabError> {
        let spawn_error = |source| LabError::Spawn {
            binary: "llama-swap's front".into(),
            source,
        };
        let mut upstream = LlamaServer::start(tools, spec)?;
        upstream.ready(Duration::from_secs(300)).await?;
        let client = super::http_client().map_err(|e| spawn_error(std::io::Error::other(e.to_string())))?;
        let front = Rc::new(Front {
            tools: tools.clone(),
            spec: spec.clone(),
            settings,
            trace,
            client,
            upstream: RefCell::new(Some(upstream)),
            state: Cell::new(Upstream::Ready),
            loads: Cell::new(0),
            failed: Cell::new(None),
            changed: Notify::new(),
            in_flight: Cell::new(0),
            loader: RefCell::new(None),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(spawn_error)?;
        let port = listener.local_addr().map_err(spawn_error)?.port();
        let serving = RefCell::new(Some(tokio::task::spawn_local(serve(listener, front.clone()))));
        Ok(SwapFront { port, front, serving })
    }

    /// Where clients reach it.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The loopback port it listens on, the same across its restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the front and its upstream: connections to its port are
    /// refused, and every request it held is cut.
    pub fn crash(&self) {
        if let Some(serving) = self.serving.borrow_mut().take() {
            serving.abort();
        }
        if let Some(loader) = self.front.loader.borrow_mut().take() {
            loader.abort();
        }
        if let Some(mut upstream) = self.front.upstream.borrow_mut().take() {
            upstream.kill();
        }
        self.front.state.set(Upstream::Stopped);
        self.front.changed.notify_waiters();
    }

    /// Stops (`true`) or continues (`false`) the upstream process, so a
    /// test can hold a request in flight for as long as it needs.
    #[cfg(test)]
    pub(crate) fn hold_upstream(&self, hold: bool) -> Result<(), LabError> {
        match self.front.upstream.borrow().as_ref() {
            Some(upstream) if hold => upstream.hang(),
            Some(upstream) => upstream.resume(),
            None => Ok(()),
        }
    }

    /// Requests it holds or passes on now.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> u32 {
        self.front.in_flight.get()
    }

    /// Starts the front again on its port, the upstream not running: the
    /// first request starts it and is held with every other until it is
    /// healthy.
    pub async fn restart(&self) -> Result<(), LabError> {
        self.crash();
        // The aborted task closes its listener when it is next scheduled.
        let mut tries = 0;
        let listener = loop {
            tokio::task::yield_now().await;
            match tokio::net::TcpListener::bind(("127.0.0.1", self.port)).await {
                Ok(listener) => break listener,
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tries < 100 => tries += 1,
                Err(source) => {
                    return Err(LabError::Spawn {
                        binary: "llama-swap's front".into(),
                        source,
                    });
                }
            }
        };
        *self.serving.borrow_mut() = Some(tokio::task::spawn_local(serve(listener, self.front.clone())));
        Ok(())
    }
}

impl Drop for SwapFront {
    fn drop(&mut self) {
        self.crash();
    }
}

/// Accepts connections until aborted; aborting it drops every connection.
async fn serve(listener: tokio::net::TcpListener, front: Rc<Front>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let front = front.clone();
                connections.spawn_local(async move {
                    let service = hyper::service::service_fn(move |request| handle(front.clone(), request));
                    // A client that gives up ends its connection in an error;
                    // that is not the front's failure.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
}

/// One request in flight at the front, counted until it is answered or
/// its client leaves.
struct InFlight(Rc<Front>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.set(self.0.in_flight.get().saturating_sub(1));
    }
}

/// One request: refused past the concurrency limit, held until the
/// upstream is healthy (starting it if it is not running), then passed on.
async fn handle(front: Rc<Front>, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    if front.in_flight.get() >= front.settings.concurrency_limit {
        return Ok(crate::hosts::server::too_many_requests());
    }
    front.in_flight.set(front.in_flight.get() + 1);
    let _counted = InFlight(front.clone());
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let content_type = request.headers().get(hyper::header::CONTENT_TYPE).cloned();
    let Ok(body) = request.into_body().collect().await.map(|b| b.to_bytes()) else {
        return Ok(status_only(StatusCode::BAD_REQUEST));
    };
    let mut waiting_on = None;
    loop {
        let changed = front.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        match front.state.get() {
            Upstream::Ready => break,
            Upstream::Stopped => {
                if let Some(n) = waiting_on
                    && front.failed.get() == Some(n)
                {
                    return Ok(crate::hosts::server::load_failed(front.settings.health_check_timeout_s));
                }
                waiting_on = Some(start_load(&front));
            }
            Upstream::Loading(n) => {
                waiting_on = Some(n);
                changed.await;
            }
        }
    }
    let Some(base) = front.upstream.borrow().as_ref().map(LlamaServer::base_url) else {
        return Ok(status_only(StatusCode::BAD_GATEWAY));
    };
    let mut call = front.client.post(format!("{base}{path}")).body(body);
    if let Some(t) = content_type {
        call = call.header(hyper::header::CONTENT_TYPE, t);
    }
    let Ok(answer) = call.send().await else {
        return Ok(status_only(StatusCode::BAD_GATEWAY));
    };
    let status = answer.status().as_u16();
    let content_type = answer.headers().get(reqwest::header::CONTENT_TYPE).cloned();
    let Ok(bytes) = answer.bytes().await else {
        return Ok(status_only(StatusCode::BAD_GATEWAY));
    };
    let mut response = Response::new(Full::new(bytes));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    if let Some(t) = content_type.and_then(|t| hyper::header::HeaderValue::from_bytes(t.as_bytes()).ok()) {
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, t);
    }
    Ok(response)
}

/// A response with `status` and no body.
fn status_only(status: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

/// Starts the upstream and the task that polls its health on llama-swap's
/// schedule; returns the load's number.
fn start_load(front: &Rc<Front>) -> u64 {
    let n = front.loads.get() + 1;
    front.loads.set(n);
    front.state.set(Upstream::Loading(n));
    let task = tokio::task::spawn_local(load(front.clone(), n));
    if let Some(old) = front.loader.borrow_mut().replace(task) {
        old.abort();
    }
    n
}

/// Load `n`: the upstream process started, its `/health` polled 250 ms
/// later and then every second; healthy, the front serves and records
/// the load; past the timeout since the first poll, the upstream is killed
/// and the load fails for every request that waited for it.
async fn load(front: Rc<Front>, n: u64) {
    const FIRST_POLL: Duration = Duration::from_millis(250);
    const POLL: Duration = Duration::from_secs(1);
    let fail = |front: &Front| {
        if let Some(mut upstream) = front.upstream.borrow_mut().take() {
            upstream.kill();
        }
        front.failed.set(Some(n));
        front.state.set(Upstream::Stopped);
        front.changed.notify_waiters();
    };
    let started = LlamaServer::start(&front.tools, &front.spec);
    let Ok(upstream) = started else {
        fail(&front);
        return;
    };
    let health = format!("{}/health", upstream.base_url());
    *front.upstream.borrow_mut() = Some(upstream);
    tokio::time::sleep(FIRST_POLL).await;
    let first = tokio::time::Instant::now();
    let timeout = Duration::try_from_secs_f64(front.settings.health_check_timeout_s).unwrap_or(Duration::MAX);
    loop {
        if super::llama::healthy(&front.client, &health).await {
            front.state.set(Upstream::Ready);
            front.trace.host(&front.settings.name).record(Kind::Loaded);
            front.changed.notify_waiters();
            return;
        }
        if first.elapsed() >= timeout {
            fail(&front);
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}
