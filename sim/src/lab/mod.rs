//! The laboratory: real model servers, measured.
//!
//! Everything else in this crate runs on simulated time against a model of a
//! server. This module is where that model meets the real thing: it measures
//! a running OpenAI-compatible server ([`calibrate`]) so a scenario's server
//! can be given the speed the real one has. Its requests go through an
//! [`Endpoint`](calibrate::Endpoint): [`HttpEndpoint`] over real HTTP
//! (reqwest), or [`SimEndpoint`] over the simulated network, so the same
//! measuring code is tested against the simulator's own server, whose numbers
//! are known.

pub mod calibrate;
pub mod fidelity;
pub mod links;
pub mod llama;
pub mod redis;
pub mod run;
pub mod swap;

use std::time::Duration;

use redstring::provider::{
    BoxFuture, HttpRequest, HttpResponse, HttpTransport, ReqwestTransport, TransportError, TransportErrorKind,
};

use crate::hosts::transport::SimTransport;

/// The largest response body an endpoint reads.
const BODY_LIMIT: usize = 1 << 20;

/// A reqwest client that follows no redirects, with rustls's crypto
/// provider installed (as the core's production transport installs it).
fn http_client() -> Result<reqwest::Client, TransportError> {
    ReqwestTransport::new()?;
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| TransportError::failed(TransportErrorKind::Other, e.to_string()))
}

/// A server at a base URL (`http://127.0.0.1:8080`), over real HTTP.
pub struct HttpEndpoint {
    base: String,
    client: reqwest::Client,
    posts: ReqwestTransport,
    api_key: Option<String>,
}

impl HttpEndpoint {
    /// An endpoint for the server at `base_url` (its trailing `/` and a
    /// trailing `/v1` are dropped), sending `api_key` as a bearer token when
    /// given.
    pub fn new(base_url: &str, api_key: Option<String>) -> Result<Self, TransportError> {
        let client = http_client()?;
        let base = base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base).to_owned();
        Ok(HttpEndpoint {
            base,
            posts: ReqwestTransport::with_client(client.clone()),
            client,
            api_key,
        })
    }

    fn headers(&self) -> Vec<(String, String)> {
        let mut headers = vec![("content-type".to_owned(), "application/json".to_owned())];
        if let Some(key) = &self.api_key {
            headers.push(("authorization".to_owned(), format!("Bearer {key}")));
        }
        headers
    }
}

impl calibrate::Endpoint for HttpEndpoint {
    fn get<'a>(&'a self, path: &'a str, timeout: Duration) -> BoxFuture<'a, Result<HttpResponse, TransportError>> {
        Box::pin(async move {
            let failed = |e: reqwest::Error| TransportError::failed(TransportErrorKind::Other, e.to_string());
            let mut request = self.client.get(format!("{}{path}", self.base)).timeout(timeout);
            if let Some(key) = &self.api_key {
                request = request.bearer_auth(key);
            }
            let mut response = request.send().await.map_err(failed)?;
            let status = response.status().as_u16();
            let mut body = Vec::new();
            while let Some(chunk) = response.chunk().await.map_err(failed)? {
                if body.len().saturating_add(chunk.len()) > BODY_LIMIT {
                    return Err(TransportError::BodyTooLarge { limit: BODY_LIMIT });
                }
                body.extend_from_slice(&chunk);
            }
            Ok(HttpResponse {
                status,
                headers: Vec::new(),
                body,
            })
        })
    }

    fn post<'a>(
        &'a self,
        path: &'a str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<HttpResponse, TransportError>> {
        self.posts.post(HttpRequest {
            url: format!("{}{path}", self.base),
            headers: self.headers(),
            body,
            body_limit: BODY_LIMIT,
            timeout,
        })
    }
}

/// A server at a base URL on the simulated network.
pub struct SimEndpoint {
    base: String,
    transport: SimTransport,
}

impl SimEndpoint {
    /// An endpoint for the simulated server at `base_url`, reached through
    /// `transport`.
    pub fn new(base_url: &str, transport: SimTransport) -> Self {
        SimEndpoint {
            base: base_url.trim_end_matches('/').to_owned(),
            transport,
        }
    }
}

impl calibrate::Endpoint for SimEndpoint {
    fn get<'a>(&'a self, path: &'a str, timeout: Duration) -> BoxFuture<'a, Result<HttpResponse, TransportError>> {
        Box::pin(
            self.transport
                .get_owned(format!("{}{path}", self.base), timeout, BODY_LIMIT),
        )
    }

    fn post<'a>(
        &'a self,
        path: &'a str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<HttpResponse, TransportError>> {
        self.transport.post(HttpRequest {
            url: format!("{}{path}", self.base),
            headers: vec![("content-type".to_owned(), "application/json".to_owned())],
            body,
            body_limit: BODY_LIMIT,
            timeout,
        })
    }
}

#[cfg(test)]
mod tests;
