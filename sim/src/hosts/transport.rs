//! The simulator's HTTP transport: redstring's adapter over turmoil TCP.
//!
//! The OpenAI-compatible adapter talks to model servers through the one-method
//! [`HttpTransport`] seam. In production that is reqwest, which cannot use a
//! simulated socket; [`SimTransport`] is the same seam over a
//! `turmoil::net::TcpStream` with a hyper HTTP/1.1 client, so the adapter's
//! request building, parsing and classification — and everything the hardened
//! provider stacks on them — run unchanged against the simulated servers.
//!
//! Each [`HttpTransport::post`] is one connection: connect, handshake, one
//! request, the response read up to the request's `body_limit`, close. The
//! whole exchange is bounded by the request's `timeout` on virtual time, and
//! giving up drops the connection, so the server sees its client leave.
//! Failures map to the adapter's kinds: no connection (refused, crashed host)
//! is [`TransportErrorKind::Connect`]; a connection closed or reset before the
//! response was complete is [`TransportErrorKind::Reset`]; no complete
//! response in time is [`TransportErrorKind::Timeout`]; a URL this transport
//! cannot reach (not `http://`) or an unparsable response is
//! [`TransportErrorKind::Other`].
//!
//! A transport holds at most [`MAX_OPEN_CONNECTIONS`] connections, counting
//! those closed within [`TIME_WAIT`]; a request beyond that fails at once as
//! [`TransportErrorKind::Connect`], as on a real host out of ports, rather
//! than exhausting or reusing turmoil's ephemeral ports (which panics the
//! whole simulation).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use redstring::provider::wire::failed;
use redstring::provider::{BoxFuture, HttpRequest, HttpResponse, HttpTransport, TransportError, TransportErrorKind};
use turmoil::net::TcpStream;

use crate::evidence::trace::{Kind, Trace};
use crate::hosts::clock::sim_elapsed;

/// An [`HttpTransport`] over the simulated network, for the worker host it
/// runs on.
///
/// Every request attempt is recorded in the trace as [`Kind::Request`] under
/// the worker's name, with the URL's host as the server, before it connects.
/// Only usable from inside a turmoil host. Clones share the limit of
/// [`MAX_OPEN_CONNECTIONS`].
#[derive(Clone, Debug)]
pub struct SimTransport {
    host: String,
    trace: Trace,
    open: Arc<ConnectionLimit>,
}

impl SimTransport {
    /// A transport for worker `host`, recording into `trace`.
    pub fn new(host: impl Into<String>, trace: Trace) -> Self {
        SimTransport {
            host: host.into(),
            trace,
            open: Arc::default(),
        }
    }
}

/// The most connections one transport (or one cache client) holds at once,
/// counting those closed within the last [`TIME_WAIT`].
///
/// turmoil gives a host 16,384 ephemeral ports, handed out in turn, and
/// panics when they run out — or when it hands a port out again while the
/// peer still holds the socket of its last connection (its end closes only
/// when the client's FIN arrives, up to a link's latency later). A worker has
/// one transport and one cache client, 16,000 such connections together: for
/// a port to come round again every other port would have to be open or
/// closed within [`TIME_WAIT`], which this bound rules out. A client over it
/// fails to connect, as a real host out of ports (or full of `TIME_WAIT`
/// sockets) does.
pub const MAX_OPEN_CONNECTIONS: usize = 8000;

/// How long a closed connection still counts against
/// [`MAX_OPEN_CONNECTIONS`]: twice the longest one-way latency a scenario may
/// set ([`MAX_LATENCY_MS`](crate::scenario::limits::MAX_LATENCY_MS)), as TCP's
/// `TIME_WAIT` is twice a segment's lifetime.
pub const TIME_WAIT: Duration = Duration::from_millis(2 * crate::scenario::limits::MAX_LATENCY_MS);

/// One client's connections: open now, and closed within [`TIME_WAIT`].
#[derive(Debug, Default)]
pub struct ConnectionLimit {
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
    /// A permit for one more connection, or `None` when the client already
    /// holds [`MAX_OPEN_CONNECTIONS`].
    pub fn take(self: &Arc<Self>) -> Option<ConnectionPermit> {
        let now = sim_elapsed();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while state.closing.front().is_some_and(|t| *t <= now) {
            state.closing.pop_front();
        }
        if state.open + state.closing.len() >= MAX_OPEN_CONNECTIONS {
            return None;
        }
        state.open += 1;
        Some(ConnectionPermit(self.clone()))
    }
}

/// One of a client's [`MAX_OPEN_CONNECTIONS`]; dropped with its connection,
/// it counts for [`TIME_WAIT`] more.
#[derive(Debug)]
pub struct ConnectionPermit(Arc<ConnectionLimit>);

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
        state.open = state.open.saturating_sub(1);
        state.closing.push_back(sim_elapsed().saturating_add(TIME_WAIT));
    }
}

/// Where a URL points.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    host: String,
    port: u16,
    /// `host` or `host:port`, as written (the `Host` header).
    authority: String,
    /// The path and query, at least `/`.
    path: String,
}

/// Parses `http://host[:port][/path]`; the port defaults to 80.
fn parse_url(url: &str) -> Result<Target, TransportError> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        failed(
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
                .map_err(|_| failed(TransportErrorKind::Other, format!("{url}: bad port {port:?}")))?;
            (host, port)
        }
        None => (authority, 80),
    };
    if host.is_empty() {
        return Err(failed(TransportErrorKind::Other, format!("{url}: no host")));
    }
    Ok(Target {
        host: host.to_owned(),
        port,
        authority: authority.to_owned(),
        path: path.to_owned(),
    })
}

impl HttpTransport for SimTransport {
    fn post(&self, request: HttpRequest) -> BoxFuture<'_, Result<HttpResponse, TransportError>> {
        Box::pin(async move {
            let target = parse_url(&request.url)?;
            self.trace.record(
                &self.host,
                Kind::Request {
                    server: target.host.clone(),
                },
            );
            let Some(_permit) = self.open.take() else {
                return Err(failed(
                    TransportErrorKind::Connect,
                    format!(
                        "{} has opened {MAX_OPEN_CONNECTIONS} connections within {TIME_WAIT:?}, the most a simulated host holds",
                        self.host
                    ),
                ));
            };
            let timeout = request.timeout;
            match tokio::time::timeout(timeout, exchange(&target, request)).await {
                Ok(result) => result,
                Err(_) => Err(failed(
                    TransportErrorKind::Timeout,
                    format!("no response from {} within {timeout:?}", target.authority),
                )),
            }
        })
    }
}

async fn exchange(target: &Target, request: HttpRequest) -> Result<HttpResponse, TransportError> {
    let stream = TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|e| {
            failed(
                TransportErrorKind::Connect,
                format!("connecting to {}: {e}", target.authority),
            )
        })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream))
        .await
        .map_err(|e| {
            failed(
                TransportErrorKind::Connect,
                format!("handshake with {}: {e}", target.authority),
            )
        })?;
    let mut builder = Request::post(target.path.as_str()).header(hyper::header::HOST, target.authority.as_str());
    for (name, value) in &request.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    let http_request = builder
        .body(Full::new(Bytes::from(request.body)))
        .map_err(|e| failed(TransportErrorKind::Other, format!("building the request: {e}")))?;
    let limit = request.body_limit;
    let work = async move {
        let response = sender.send_request(http_request).await.map_err(|e| hyper_failure(&e))?;
        let status = response.status().as_u16();
        let headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect();
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
        Ok(HttpResponse { status, headers, body })
    };
    // The connection is driven here, beside the request, rather than spawned:
    // when the caller gives up, dropping this future closes the socket.
    tokio::pin!(conn);
    tokio::pin!(work);
    tokio::select! {
        biased;
        result = &mut work => result,
        // The connection ended first (the server closed it, or it failed): the
        // request side now completes with whatever hyper made of it.
        _ = &mut conn => work.await,
    }
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
    failed(kind, detail)
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
}
