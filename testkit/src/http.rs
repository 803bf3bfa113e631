//! A scripted OpenAI-compatible HTTP server, for tests of the provider.
//!
//! Each test starts its own on a free localhost port, inside its tokio
//! runtime, queues the replies it wants (a status with headers and body, a
//! dropped connection, a hang), and reads back every request the server
//! received. Real HTTP over real sockets, so the production reqwest transport
//! is what gets exercised.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// What the server does with one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Answer with this status, headers and body.
    Respond {
        /// The HTTP status.
        status: u16,
        /// Header names and values, in order.
        headers: Vec<(String, String)>,
        /// The body, as sent.
        body: Vec<u8>,
    },
    /// A 200 whose body is `chunk` repeated `count` times, sent with chunked
    /// transfer encoding: no `content-length` to check up front.
    Chunked {
        /// One frame of the body.
        chunk: Vec<u8>,
        /// How many frames.
        count: usize,
    },
    /// Close the connection without answering.
    Drop,
    /// Never answer.
    Hang,
}

impl Reply {
    /// A status with a body and no extra headers.
    pub fn status(status: u16, body: impl Into<String>) -> Self {
        Reply::Respond {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.into().into_bytes(),
        }
    }

    /// A 200 chat completion whose message is `message` and whose
    /// `finish_reason` is `finish`.
    pub fn completion_message(message: Value, finish: &str) -> Self {
        let body = json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "served-model",
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": null}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            "system_fingerprint": "fp"
        });
        Reply::status(200, body.to_string())
    }

    /// A 200 chat completion of `{"name":"Ann"}` whose `model` field names
    /// `model` and whose `usage` totals `total` tokens.
    pub fn answered_by(model: &str, total: u64) -> Self {
        let body = json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": r#"{"name":"Ann"}"#},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": total / 2, "completion_tokens": total - total / 2, "total_tokens": total}
        });
        Reply::status(200, body.to_string())
    }

    /// A 200 chat completion with `content` and `finish_reason: stop`.
    pub fn completion(content: &str) -> Self {
        Reply::completion_message(json!({"role": "assistant", "content": content}), "stop")
    }

    /// The same reply with one more header.
    pub fn header(self, name: &str, value: &str) -> Self {
        match self {
            Reply::Respond {
                status,
                mut headers,
                body,
            } => {
                headers.push((name.into(), value.into()));
                Reply::Respond { status, headers, body }
            }
            other => other,
        }
    }
}

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Captured {
    /// The request path (`/v1/chat/completions`).
    pub path: String,
    /// Header names (lowercase) and values.
    pub headers: Vec<(String, String)>,
    /// The body, parsed as JSON (`Null` if it was not JSON).
    pub body: Value,
}

impl Captured {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct State {
    script: VecDeque<Reply>,
    otherwise: Option<Reply>,
    requests: Vec<Captured>,
}

/// The server. Dropping it leaves the accept task to end with the runtime.
pub struct TestServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl TestServer {
    /// Starts a server on a free port of 127.0.0.1.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| handle(request, state.clone()));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        TestServer { addr, state }
    }

    /// The `/v1` base URL.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Queues `reply` for the next unanswered request.
    pub fn push(&self, reply: Reply) -> &Self {
        self.lock().script.push_back(reply);
        self
    }

    /// What to answer once the queue is empty (default: a 500 saying so).
    pub fn otherwise(&self, reply: Reply) -> &Self {
        self.lock().otherwise = Some(reply);
        self
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Captured> {
        self.lock().requests.clone()
    }

    /// How many requests arrived.
    pub fn count(&self) -> usize {
        self.lock().requests.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("scripted connection drop")
    }
}

impl std::error::Error for Dropped {}

/// A body of `left` copies of `chunk`, one frame each, of unknown length.
struct Chunks {
    chunk: Bytes,
    left: usize,
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return std::task::Poll::Ready(None);
        }
        self.left -= 1;
        std::task::Poll::Ready(Some(Ok(Frame::data(self.chunk.clone()))))
    }
}

type ReplyBody = Either<Full<Bytes>, Chunks>;

async fn handle(request: Request<Incoming>, state: Arc<Mutex<State>>) -> Result<Response<ReplyBody>, Dropped> {
    let (parts, body) = request.into_parts();
    let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let reply = {
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        state.requests.push(Captured {
            path: parts.uri.path().to_owned(),
            headers: parts
                .headers
                .iter()
                .map(|(n, v)| {
                    (
                        n.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        });
        state
            .script
            .pop_front()
            .or_else(|| state.otherwise.clone())
            .unwrap_or_else(|| Reply::status(500, r#"{"error":{"message":"test script exhausted"}}"#))
    };
    match reply {
        Reply::Respond { status, headers, body } => {
            let mut response = Response::builder().status(status);
            for (name, value) in headers {
                response = response.header(name, value);
            }
            Ok(response
                .body(Either::Left(Full::new(Bytes::from(body))))
                .expect("valid scripted response"))
        }
        Reply::Chunked { chunk, count } => Ok(Response::builder()
            .status(200)
            .body(Either::Right(Chunks {
                chunk: Bytes::from(chunk),
                left: count,
            }))
            .expect("valid scripted response")),
        Reply::Drop => Err(Dropped),
        Reply::Hang => std::future::pending::<Result<_, Infallible>>()
            .await
            .map_err(|e| match e {}),
    }
}

/// A localhost URL on which nothing listens: a port that was just free.
pub async fn refused_base_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    drop(listener);
    format!("http://{addr}/v1")
}

/// A TCP server that answers every connection with fixed bytes that are not
/// HTTP (an SSH banner, say), then closes it, counting connections.
pub struct RawServer {
    addr: SocketAddr,
    connections: Arc<std::sync::atomic::AtomicUsize>,
}

impl RawServer {
    /// Starts one on a free port of 127.0.0.1, answering with `reply`.
    pub async fn start(reply: &'static [u8]) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut request = vec![0u8; 64 * 1024];
                    let _ = stream.read(&mut request).await;
                    let _ = stream.write_all(reply).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        RawServer { addr, connections }
    }

    /// The `/v1` base URL.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// llama.cpp's answer when its chat parser rejects the model's finished output.
pub const PEG_NATIVE_500: &str = r#"{"error":{"code":500,"message":"The model produced output that does not match the expected peg-native format","type":"server_error"}}"#;
