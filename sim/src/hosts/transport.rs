//! The simulator's HTTP transport: redstring's adapter over turmoil TCP.
//!
//! The OpenAI-compatible adapter talks to model servers through the one-method
//! [`HttpTransport`] seam. In production that is reqwest, which cannot use a
//! simulated socket; [`SimTransport`] is the same seam over a
//! `turmoil::net::TcpStream` with a hyper HTTP/1.1 client, so the adapter's
//! request building, parsing and classification — and everything the hardened
//! provider stacks on them — run unchanged against the simulated servers.
//!
//! Connections are kept alive and reused, as reqwest's pool (hyper-util's
//! legacy client) does: a request takes the most recently used idle
//! connection to its host and port, or opens a new one; a connection whose
//! response was read to the end goes back to the pool; one idle for
//! [`IDLE_TIMEOUT`] (reqwest's default `pool_idle_timeout`) is closed when
//! next looked at. A request that finds its idle connection closed before it
//! was sent (the server went away meanwhile) goes out on another, as
//! hyper-util retries a request its connection never took. The whole
//! exchange is bounded by the request's `timeout` on virtual time, and giving
//! up (or a response over the limit) closes the connection, so the server
//! sees its client leave. Failures map to the adapter's kinds: no connection
//! (refused, crashed host) is [`TransportErrorKind::Connect`]; a connection
//! closed or reset before the response was complete is
//! [`TransportErrorKind::Reset`]; no complete response in time is
//! [`TransportErrorKind::Timeout`]; a URL this transport cannot reach (not
//! `http://`) or an unparsable response is [`TransportErrorKind::Other`].
//!
//! A transport holds at most [`MAX_OPEN_CONNECTIONS`] connections, counting
//! those it closed itself within [`TIME_WAIT`] (a connection the server closed
//! leaves the `TIME_WAIT` on the server's side, and frees its port at once);
//! a request needing a new connection beyond that fails at once as
//! [`TransportErrorKind::Connect`], as on a real host out of ports, rather
//! than exhausting or reusing turmoil's ephemeral ports (which panics the
//! whole simulation). Workers that share one turmoil host also share its
//! ports: every client on the host takes its permits within the host's own
//! limit of [`HOST_PORTS`] as well ([`ConnectionLimit::within`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use redstring::provider::{BoxFuture, HttpRequest, HttpResponse, HttpTransport, TransportError, TransportErrorKind};
use turmoil::net::TcpStream;

use crate::evidence::trace::{HostTrace, Kind, Trace};
use crate::hosts::clock::sim_elapsed;

/// An [`HttpTransport`] over the simulated network, for the worker host it
/// runs on.
///
/// Every request attempt is recorded in the trace as [`Kind::Request`] under
/// the worker's name, with the URL's host as the server, before it connects.
/// Only usable from inside a turmoil host. Clones share the pool of idle
/// connections and the limit of [`MAX_OPEN_CONNECTIONS`].
#[derive(Clone, Debug)]
pub struct SimTransport {
    trace: HostTrace,
    open: Arc<ConnectionLimit>,
    pool: Arc<Mutex<Pool>>,
    addresses: Arc<Addresses>,
}

impl SimTransport {
    /// A transport for worker `host`, recording into `trace`, on a turmoil
    /// host of its own, reaching every server at the host and port its URL
    /// names.
    pub fn new(host: &str, trace: Trace) -> Self {
        SimTransport::on(trace.host(host), ConnectionLimit::host(TIME_WAIT), Arc::default())
    }

    /// A transport for the worker `trace` records for, on a turmoil host
    /// whose ports `ports` counts ([`ConnectionLimit::host`]), reaching a
    /// server `addresses` knows where it says the server listens.
    pub fn on(trace: HostTrace, ports: Arc<ConnectionLimit>, addresses: Arc<Addresses>) -> Self {
        SimTransport {
            trace,
            open: Arc::new(ConnectionLimit::within(ports)),
            pool: Arc::default(),
            addresses,
        }
    }

    fn pool(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most recently used idle connection to `authority` that is still
    /// open and has not idled past [`IDLE_TIMEOUT`]; the others it passes
    /// over are closed (those the server closed already are just dropped).
    fn checkout(&self, authority: &str) -> Option<Connection> {
        let now = sim_elapsed();
        let mut pool = self.pool();
        let idle = pool.idle.get_mut(authority)?;
        while let Some((conn, since)) = idle.pop() {
            if !conn.sender.is_closed() && now.saturating_sub(since) < IDLE_TIMEOUT {
                return Some(conn);
            }
        }
        None
    }

    /// Puts a connection whose exchange completed back in the pool.
    fn checkin(&self, authority: &str, conn: Connection) {
        if conn.sender.is_closed() {
            return;
        }
        self.pool()
            .idle
            .entry(authority.to_owned())
            .or_default()
            .push((conn, sim_elapsed()));
    }
}

/// Where model servers listen on the simulated network, by the name a
/// URL reaches each by: servers share a turmoil host, each on a port of
/// its own ([`crate::world::layout`]), while a request names its server
/// (in its `Host` header, its trace event and its pool of connections).
/// A name it does not know is a host of that name, at the URL's port.
#[derive(Clone, Debug, Default)]
pub struct Addresses(BTreeMap<String, (String, u16)>);

impl Addresses {
    /// The addresses of the named servers: a server's name, then its
    /// turmoil host and port.
    pub fn new(servers: impl IntoIterator<Item = (String, (String, u16))>) -> Self {
        Addresses(servers.into_iter().collect())
    }

    /// The turmoil host and port to connect to for `host:port` in a URL.
    pub fn of<'a>(&'a self, host: &'a str, port: u16) -> (&'a str, u16) {
        match self.0.get(host) {
            Some((on, port)) => (on.as_str(), *port),
            None => (host, port),
        }
    }
}

/// How long a connection may sit idle in the pool before it is closed:
/// reqwest's default `pool_idle_timeout`.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Bytes a worker's connection to a model server reads at a time. hyper
/// keeps a read buffer per connection, 8 KiB and growing with what it
/// reads; a fleet of thousands of workers keeps tens of thousands of
/// connections, and an answer is a few KiB, read in more than one piece
/// when longer. hyper also takes it as the most a response's status line
/// and headers may fill: the simulated servers' take a few hundred bytes.
const READ_BUFFER: usize = 2048;

/// Idle connections by `host:port`, least recently used first.
#[derive(Debug, Default)]
struct Pool {
    idle: BTreeMap<String, Vec<(Connection, Duration)>>,
}

/// One open client connection: its request half, and the task that drives
/// it and owns its socket and its [`ConnectionPermit`].
#[derive(Debug)]
struct Connection {
    sender: SendRequest<Full<Bytes>>,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for Connection {
    /// Closing from this side: the socket goes with the driver, and the port
    /// stays in `TIME_WAIT` (the permit's drop).
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// The most connections one transport (or one cache client) holds at once,
/// counting those it closed within the last [`TIME_WAIT`].
///
/// turmoil hands a host's ephemeral ports out in turn ([`EPHEMERAL_PORTS`])
/// and panics when they run out — or when it hands a port out again while the
/// peer still holds the socket of its last connection (its end closes only
/// when the client's FIN arrives, up to a link's latency later). A worker has
/// one transport and one cache client, 16,000 such connections together, and
/// every client on one turmoil host counts within the host's [`HOST_PORTS`]
/// too: for a port to come round again every other port would have to be
/// open or closed within [`TIME_WAIT`], which these bounds rule out. A client
/// over either fails to connect, as a real host out of ports (or full of
/// `TIME_WAIT` sockets) does.
pub const MAX_OPEN_CONNECTIONS: usize = 8000;

/// The ephemeral ports every turmoil host hands out: all above the
/// privileged range (servers and the cache host listen below it).
pub const EPHEMERAL_PORTS: std::ops::RangeInclusive<u16> = 1024..=u16::MAX;

/// The most connections all clients on one turmoil host hold at once,
/// counting those closed within [`TIME_WAIT`]: fewer than the host's
/// [`EPHEMERAL_PORTS`], so a port never comes round while its last
/// connection may still be open at the peer.
pub const HOST_PORTS: usize = 64_000;

/// How long a connection a client closed still counts against its limits
/// on a host of its own: twice the longest one-way latency any scenario may
/// set ([`MAX_LATENCY_MS`](crate::scenario::limits::MAX_LATENCY_MS)), as
/// TCP's `TIME_WAIT` is twice a segment's lifetime. A run uses its own
/// scenario's ([`time_wait`]). Only the side that closes first waits it out.
pub const TIME_WAIT: Duration = Duration::from_millis(2 * crate::scenario::limits::MAX_LATENCY_MS);

/// `TIME_WAIT` on a network whose segments take at most `longest_latency`
/// one way and arrive at a step of `tick`: twice a segment's lifetime, so
/// the peer has seen a connection's end before its port can come round.
pub fn time_wait(longest_latency: Duration, tick: Duration) -> Duration {
    longest_latency.saturating_add(tick).saturating_mul(2)
}

/// Connections of one client, or of every client on one turmoil host: open
/// now, and closed within [`TIME_WAIT`], at most its capacity.
#[derive(Debug)]
pub struct ConnectionLimit {
    capacity: usize,
    /// How long a connection closed from this side still counts.
    time_wait: Duration,
    /// The host's limit a client's permits are also taken from.
    host: Option<Arc<ConnectionLimit>>,
    state: Mutex<LimitState>,
}

#[derive(Debug, Default)]
struct LimitState {
    open: usize,
    /// When each recently closed connection stops counting, oldest first
    /// (simulated time only moves forward).
    closing: VecDeque<Duration>,
}

impl ConnectionLimit {
    /// The ports of one turmoil host: [`HOST_PORTS`], shared by every client
    /// on it, each closed connection counting for `time_wait` more.
    pub fn host(time_wait: Duration) -> Arc<ConnectionLimit> {
        Arc::new(ConnectionLimit {
            capacity: HOST_PORTS,
            time_wait,
            host: None,
            state: Mutex::default(),
        })
    }

    /// One client's [`MAX_OPEN_CONNECTIONS`], on the host whose ports `host`
    /// counts, with its `TIME_WAIT`.
    pub fn within(host: Arc<ConnectionLimit>) -> ConnectionLimit {
        ConnectionLimit {
            capacity: MAX_OPEN_CONNECTIONS,
            time_wait: host.time_wait,
            host: Some(host),
            state: Mutex::default(),
        }
    }

    /// Counts one more connection if there is room for it.
    fn reserve(&self, now: Duration) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while state.closing.front().is_some_and(|t| *t <= now) {
            state.closing.pop_front();
        }
        if state.open + state.closing.len() >= self.capacity {
            return false;
        }
        state.open += 1;
        true
    }

    /// Counts a connection gone, in `TIME_WAIT` or not.
    fn release(&self, time_wait: bool) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.open = state.open.saturating_sub(1);
        if time_wait {
            state.closing.push_back(sim_elapsed().saturating_add(self.time_wait));
        }
    }

    /// A permit for one more connection, or which limit it would pass: the
    /// client's [`MAX_OPEN_CONNECTIONS`] or its host's [`HOST_PORTS`].
    pub fn take(self: &Arc<Self>) -> Result<ConnectionPermit, Exhausted> {
        let now = sim_elapsed();
        if !self.reserve(now) {
            return Err(Exhausted::Client);
        }
        if let Some(host) = &self.host
            && !host.reserve(now)
        {
            self.release(false);
            return Err(Exhausted::Host);
        }
        Ok(ConnectionPermit {
            limit: self.clone(),
            time_wait: true,
        })
    }
}

/// Which limit refused a connection ([`ConnectionLimit::take`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Exhausted {
    /// The client holds [`MAX_OPEN_CONNECTIONS`].
    #[error(
        "holds {MAX_OPEN_CONNECTIONS} connections (open, or closed within TIME_WAIT), the most a simulated host holds"
    )]
    Client,
    /// The workers sharing its turmoil host hold [`HOST_PORTS`] together.
    #[error(
        "shares a simulated host whose workers hold {HOST_PORTS} connections (open, or closed within TIME_WAIT) together, all its ports"
    )]
    Host,
}

/// One of a client's [`MAX_OPEN_CONNECTIONS`]; dropped with its connection,
/// it counts for [`TIME_WAIT`] more — unless the peer closed the connection
/// first ([`ConnectionPermit::closed_by_peer`]).
#[derive(Debug)]
pub struct ConnectionPermit {
    limit: Arc<ConnectionLimit>,
    time_wait: bool,
}

impl ConnectionPermit {
    /// Gives the permit back for a connection the peer closed first: the
    /// peer's side holds the `TIME_WAIT`, and the port is free at once.
    pub fn closed_by_peer(mut self) {
        self.time_wait = false;
    }
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        self.limit.release(self.time_wait);
        if let Some(host) = &self.limit.host {
            host.release(self.time_wait);
        }
    }
}

/// Where a URL points.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    /// Shared with the request's trace event.
    host: Arc<str>,
    port: u16,
    /// `host` or `host:port`, as written (the `Host` header).
    authority: String,
    /// The path and query, at least `/`.
    path: String,
}

/// Parses `http://host[:port][/path]`; the port defaults to 80.
fn parse_url(url: &str) -> Result<Target, TransportError> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        TransportError::failed(
            TransportErrorKind::Other,
            format!("{url}: only http:// URLs are simulated"),
        )
    })?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) => {
            let port = port
                .parse()
                .map_err(|_| TransportError::failed(TransportErrorKind::Other, format!("{url}: bad port {port:?}")))?;
            (host, port)
        }
        None => (authority, 80),
    };
    if host.is_empty() {
        return Err(TransportError::failed(
            TransportErrorKind::Other,
            format!("{url}: no host"),
        ));
    }
    Ok(Target {
        host: host.into(),
        port,
        authority: authority.to_owned(),
        path: path.to_owned(),
    })
}

impl HttpTransport for SimTransport {
    fn post(&self, request: HttpRequest) -> BoxFuture<'_, Result<HttpResponse, TransportError>> {
        Box::pin(async move {
            let target = parse_url(&request.url)?;
            self.trace.record(Kind::Request {
                server: target.host.clone(),
            });
            self.send(&target, Method::POST, request).await
        })
    }
}

impl SimTransport {
    /// A `GET` of `url` (a server's `/props`, say) on the same pooled
    /// connections as the adapter's posts.
    pub async fn get_owned(
        &self,
        url: String,
        timeout: Duration,
        body_limit: usize,
    ) -> Result<HttpResponse, TransportError> {
        let target = parse_url(&url)?;
        let request = HttpRequest {
            url,
            headers: Vec::new(),
            body: Vec::new(),
            body_limit,
            timeout,
        };
        self.send(&target, Method::GET, request).await
    }

    /// `request` with `method`, given up after its timeout.
    async fn send(
        &self,
        target: &Target,
        method: Method,
        request: HttpRequest,
    ) -> Result<HttpResponse, TransportError> {
        let timeout = request.timeout;
        // Giving up drops the exchange, and the connection with it.
        match tokio::time::timeout(timeout, self.exchange(target, method, request)).await {
            Ok(result) => result,
            Err(_) => Err(TransportError::failed(
                TransportErrorKind::Timeout,
                format!("no response from {} within {timeout:?}", target.authority),
            )),
        }
    }

    /// One request and its response on a pooled or a new connection; the
    /// connection goes back to the pool only if the response was read to
    /// its end.
    async fn exchange(
        &self,
        target: &Target,
        method: Method,
        request: HttpRequest,
    ) -> Result<HttpResponse, TransportError> {
        let mut http_request = build(target, method, &request)?;
        let (mut conn, response) = loop {
            let (mut conn, pooled) = match self.checkout(&target.authority) {
                Some(conn) => (conn, true),
                None => (self.connect(target).await?, false),
            };
            if pooled && conn.sender.ready().await.is_err() {
                // Closed while it sat idle: try the next one.
                continue;
            }
            match conn.sender.try_send_request(http_request).await {
                Ok(response) => break (conn, response),
                Err(mut e) => match e.take_message() {
                    // Never sent: the connection went away under it.
                    Some(unsent) if pooled => http_request = unsent,
                    _ => return Err(hyper_failure(e.error())),
                },
            }
        };
        let status = response.status().as_u16();
        let headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect();
        let limit = request.body_limit;
        let declared = response
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| usize::try_from(n).map_or(true, |n| n > limit)) {
            return Err(TransportError::BodyTooLarge { limit });
        }
        let mut body_stream = response.into_body();
        let mut body = Vec::new();
        while let Some(frame) = body_stream.frame().await {
            let frame = frame.map_err(|e| hyper_failure(&e))?;
            if let Ok(data) = frame.into_data() {
                if body.len().saturating_add(data.len()) > limit {
                    return Err(TransportError::BodyTooLarge { limit });
                }
                body.extend_from_slice(&data);
            }
        }
        // Read to its end: the connection can carry the next request (one
        // the server closed meanwhile is just dropped).
        if conn.sender.ready().await.is_ok() {
            self.checkin(&target.authority, conn);
        }
        Ok(HttpResponse { status, headers, body })
    }

    /// A new connection to `target`, its driver running on its own task.
    async fn connect(&self, target: &Target) -> Result<Connection, TransportError> {
        let permit = match self.open.take() {
            Ok(permit) => permit,
            Err(exhausted) => {
                return Err(TransportError::failed(
                    TransportErrorKind::Connect,
                    format!("{} {exhausted}", self.trace.name()),
                ));
            }
        };
        let stream = TcpStream::connect(self.addresses.of(&target.host, target.port))
            .await
            .map_err(|e| {
                TransportError::failed(
                    TransportErrorKind::Connect,
                    format!("connecting to {}: {e}", target.authority),
                )
            })?;
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .read_buf_exact_size(Some(READ_BUFFER))
            .handshake::<_, Full<Bytes>>(TokioIo::new(stream))
            .await
            .map_err(|e| {
                TransportError::failed(
                    TransportErrorKind::Connect,
                    format!("handshake with {}: {e}", target.authority),
                )
            })?;
        let driver = tokio::task::spawn(async move {
            // Ends by itself only when the server closed or reset the
            // connection; closing it from this side aborts this task.
            let _ = conn.await;
            permit.closed_by_peer();
        });
        Ok(Connection { sender, driver })
    }
}

/// The hyper request for `request` to `target`.
fn build(target: &Target, method: Method, request: &HttpRequest) -> Result<Request<Full<Bytes>>, TransportError> {
    let mut builder = Request::builder()
        .method(method)
        .uri(target.path.as_str())
        .header(hyper::header::HOST, target.authority.as_str());
    for (name, value) in &request.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    builder
        .body(Full::new(Bytes::from(request.body.clone())))
        .map_err(|e| TransportError::failed(TransportErrorKind::Other, format!("building the request: {e}")))
}

/// A hyper client error as the adapter's kinds: anything that cut the
/// exchange short is a reset; a response hyper could not parse is `Other`.
fn hyper_failure(e: &hyper::Error) -> TransportError {
    let kind = if e.is_parse() || e.is_user() {
        TransportErrorKind::Other
    } else {
        TransportErrorKind::Reset
    };
    let mut detail = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        detail.push_str(": ");
        detail.push_str(&c.to_string());
        cause = c.source();
    }
    TransportError::failed(kind, detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_host_port_and_path() {
        assert_eq!(
            parse_url("http://gpu-1:8080/v1/chat/completions").unwrap(),
            Target {
                host: "gpu-1".into(),
                port: 8080,
                authority: "gpu-1:8080".into(),
                path: "/v1/chat/completions".into(),
            }
        );
        let bare = parse_url("http://gpu").unwrap();
        assert_eq!((bare.port, bare.path.as_str()), (80, "/"));
        for bad in ["https://gpu/v1", "http://:80/x", "http://gpu:http/x", "gpu:8080"] {
            assert!(
                matches!(
                    parse_url(bad),
                    Err(TransportError::Failed {
                        kind: TransportErrorKind::Other,
                        ..
                    })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn clients_on_one_host_share_its_ports_and_each_keeps_its_own_limit() {
        let host = ConnectionLimit::host(Duration::from_secs(1));
        let clients: Vec<Arc<ConnectionLimit>> = (0..HOST_PORTS / MAX_OPEN_CONNECTIONS + 1)
            .map(|_| Arc::new(ConnectionLimit::within(host.clone())))
            .collect();
        let mut held = Vec::new();
        for c in &clients[..clients.len() - 1] {
            held.extend((0..MAX_OPEN_CONNECTIONS).map(|_| c.take().unwrap()));
            assert_eq!(
                c.take().unwrap_err(),
                Exhausted::Client,
                "a client holds at most its own limit"
            );
        }
        let last = clients.last().unwrap();
        assert_eq!(
            last.take().unwrap_err(),
            Exhausted::Host,
            "the host's ports are all held"
        );
        held.pop().unwrap().closed_by_peer();
        let permit = last.take().expect("a port the peer closed is free at once");
        drop(permit);
        assert_eq!(
            last.take().unwrap_err(),
            Exhausted::Host,
            "a port this side closed stays in TIME_WAIT, for the host as for the client"
        );
    }
}
