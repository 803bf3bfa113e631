//! The production [`HttpTransport`]: reqwest over rustls with the ring
//! provider.
//!
//! Kept to the mechanics — send, map reqwest's error flags to a
//! [`TransportErrorKind`], read the body up to its limit — so everything that
//! decides what a response means stays in [`wire`](super::wire), where the
//! simulator's transport reaches it too.

use std::error::Error as StdError;

use super::error::TransportErrorKind;
use super::transport::{BoxFuture, HttpRequest, HttpResponse, HttpTransport, TransportError};

/// An [`HttpTransport`] over a shared `reqwest::Client`.
#[derive(Clone, Debug)]
pub struct ReqwestTransport {
    client: reqwest::Client,
}

impl ReqwestTransport {
    /// A transport with its own client, which follows no redirects (a 3xx
    /// comes back as it is, and the adapter reports it). Installs rustls's
    /// ring crypto provider as the process default if no provider is
    /// installed yet.
    pub fn new() -> Result<Self, TransportError> {
        // An error here means a provider is already installed, which is all we need.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| TransportError::failed(TransportErrorKind::Other, describe(&e)))?;
        Ok(ReqwestTransport { client })
    }

    /// A transport over an existing client (connection pool, proxy settings,
    /// TLS configuration and redirect policy are the client's; a client that
    /// follows redirects turns a loop into a permanent
    /// [`TransportErrorKind::Redirect`]).
    pub fn with_client(client: reqwest::Client) -> Self {
        ReqwestTransport { client }
    }
}

impl HttpTransport for ReqwestTransport {
    fn post(&self, request: HttpRequest) -> BoxFuture<'_, Result<HttpResponse, TransportError>> {
        Box::pin(async move {
            let mut builder = self.client.post(&request.url).timeout(request.timeout);
            for (name, value) in &request.headers {
                builder = builder.header(name.as_str(), value.as_str());
            }
            let mut response = builder.body(request.body).send().await.map_err(|e| classify(&e))?;
            let limit = request.body_limit;
            if response
                .content_length()
                .is_some_and(|n| usize::try_from(n).map_or(true, |n| n > limit))
            {
                return Err(TransportError::BodyTooLarge { limit });
            }
            let status = response.status().as_u16();
            let headers = response
                .headers()
                .iter()
                .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
                .collect();
            let mut body = Vec::new();
            while let Some(chunk) = response.chunk().await.map_err(|e| classify(&e))? {
                if body.len().saturating_add(chunk.len()) > limit {
                    return Err(TransportError::BodyTooLarge { limit });
                }
                body.extend_from_slice(&chunk);
            }
            Ok(HttpResponse { status, headers, body })
        })
    }
}

/// reqwest's flags, verified against 0.13: refused is `is_connect`, a reset
/// after sending is `is_request` (or `is_body` mid-response), a hang is
/// `is_timeout`, a redirect loop `is_redirect`, an unusable URL `is_builder`.
/// A reply that is not HTTP is also `is_request`; hyper's parse error under
/// it tells the two apart.
fn classify(error: &reqwest::Error) -> TransportError {
    let kind = if error.is_timeout() {
        TransportErrorKind::Timeout
    } else if error.is_redirect() {
        TransportErrorKind::Redirect
    } else if error.is_builder() {
        TransportErrorKind::Invalid
    } else if is_not_http(error) {
        TransportErrorKind::Protocol
    } else if error.is_connect() {
        TransportErrorKind::Connect
    } else if error.is_request() || error.is_body() || error.is_decode() {
        TransportErrorKind::Reset
    } else {
        TransportErrorKind::Other
    };
    TransportError::failed(kind, describe(error))
}

/// Whether a cause of `error` is hyper failing to parse the reply as HTTP
/// (a bad status line or version, headers too large, an invalid header).
fn is_not_http(error: &(dyn StdError + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(c) = cause {
        if c.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_parse) {
            return true;
        }
        cause = c.source();
    }
    false
}

/// The error and its causes, one line.
fn describe(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}
