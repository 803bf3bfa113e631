//! The HTTP transport seam under the OpenAI-compatible adapter.
//!
//! The adapter's request building, response parsing and classification are the
//! part worth testing and simulating, and none of them needs a socket. So the
//! adapter speaks to a one-method [`HttpTransport`]: post a JSON body, get a
//! status, headers and at most `body_limit` bytes back. Production uses reqwest
//! ([`ReqwestTransport`](super::ReqwestTransport), feature `openai`); the
//! simulator supplies one over its own simulated network.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::error::TransportErrorKind;

/// A boxed, sendable future, as object-safe async methods in this module return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One POST of a JSON body.
#[derive(Clone)]
pub struct HttpRequest {
    /// The full URL (`http://host:8080/v1/chat/completions`).
    pub url: String,
    /// Header names and values; the names are lowercase.
    pub headers: Vec<(String, String)>,
    /// The JSON body.
    pub body: Vec<u8>,
    /// The most response-body bytes to read. A longer body is
    /// [`TransportError::BodyTooLarge`], never a larger allocation.
    pub body_limit: usize,
    /// How long the whole exchange may take.
    pub timeout: Duration,
}

impl fmt::Debug for HttpRequest {
    /// Header values are not shown: one of them carries the API key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("HttpRequest")
            .field("url", &self.url)
            .field("header_names", &names)
            .field("body_bytes", &self.body.len())
            .field("body_limit", &self.body_limit)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// A response, whatever its status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpResponse {
    /// The HTTP status code.
    pub status: u16,
    /// Header names (lowercase) and values that are valid text.
    pub headers: Vec<(String, String)>,
    /// The body, at most the request's `body_limit` bytes.
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// The first value of header `name` (matched case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The exchange did not produce a complete response.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The wire failed.
    #[error("{detail}")]
    Failed {
        /// How.
        kind: TransportErrorKind,
        /// The transport's description, without credentials.
        detail: String,
    },
    /// The body (or its declared length) exceeded the request's `body_limit`.
    #[error("response body exceeds {limit} bytes")]
    BodyTooLarge {
        /// The limit that was exceeded.
        limit: usize,
    },
}

impl TransportError {
    /// A failure of `kind` described by `detail` (without credentials): the
    /// error a transport returns when the wire failed.
    pub fn failed(kind: TransportErrorKind, detail: impl Into<String>) -> Self {
        TransportError::Failed {
            kind,
            detail: detail.into(),
        }
    }
}

/// Posts JSON and returns what came back. Implementations must return `Ok` for
/// every HTTP status — classifying 4xx and 5xx is the adapter's job — and must
/// stop reading at `body_limit`.
pub trait HttpTransport: Send + Sync + 'static {
    /// Sends `request` and waits for the response or its timeout.
    fn post(&self, request: HttpRequest) -> BoxFuture<'_, Result<HttpResponse, TransportError>>;
}

impl<T: HttpTransport + ?Sized> HttpTransport for std::sync::Arc<T> {
    fn post(&self, request: HttpRequest) -> BoxFuture<'_, Result<HttpResponse, TransportError>> {
        (**self).post(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_header_values() {
        let r = HttpRequest {
            url: "http://x/v1/chat/completions".into(),
            headers: vec![("authorization".into(), "Bearer sk-secret".into())],
            body: b"{}".to_vec(),
            body_limit: 10,
            timeout: Duration::from_secs(1),
        };
        let shown = format!("{r:?}");
        assert!(!shown.contains("sk-secret"), "{shown}");
        assert!(shown.contains("authorization"));
    }

    #[test]
    fn header_lookup_ignores_case() {
        let r = HttpResponse {
            status: 429,
            headers: vec![("Retry-After".into(), "2".into())],
            body: Vec::new(),
        };
        assert_eq!(r.header("retry-after"), Some("2"));
        assert_eq!(r.header("retry-after-ms"), None);
    }
}
