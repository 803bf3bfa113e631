//! `OpenAiCompatible`: the adapter for every server that speaks OpenAI's chat
//! completions — llama.cpp, llama-swap, vLLM, Ollama's `/v1`, OpenAI itself.
//!
//! It asks for structured output under the caller's strict schema, always
//! validates the answer locally (only OpenAI's strict mode guarantees the
//! schema; the others mostly honour it), and turns every outcome into the
//! [`ProviderError`] vocabulary through [`wire`]. The API key
//! is sent as a bearer token and shown nowhere else: not by `Debug`, not in
//! an error, not in an event.
//!
//! Each answer's provenance is the model the response names in its `model`
//! field (falling back to the configured id when it names none); when that
//! is not the model requested, the adapter reports
//! [`Event::ServedModelDiffers`] to its observer.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::error::{ExtractError, ProviderError};
use super::transport::{BoxFuture, HttpRequest, HttpTransport};
use super::wire::{self, ResponseContext};
use super::{ExtractRequest, Extracted, LlmProvider};
use crate::clock::Clock;
use crate::env::Env;
use crate::error::ConfigError;
use crate::observe::{Event, Observer};
use crate::time::secs;

/// The key sent when none is configured: local servers ignore it, and some
/// clients and proxies refuse a request without one.
pub const DEFAULT_API_KEY: &str = "not-needed";
/// The default request timeout. Generous: a local server may hold a request
/// while it swaps models (llama-swap waits up to 120 s by default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// The default limit on a response body: 8 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;

/// An [`LlmProvider`] over an OpenAI-compatible `/v1` endpoint.
pub struct OpenAiCompatible<T> {
    transport: T,
    url: String,
    base_url: String,
    model_id: String,
    provenance: String,
    api_key: String,
    timeout: Duration,
    max_tokens: Option<u32>,
    max_response_bytes: usize,
    clock: Arc<dyn Clock>,
    observer: Arc<dyn Observer>,
}

impl<T> fmt::Debug for OpenAiCompatible<T> {
    /// Shows the configuration; the API key appears as `[redacted]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiCompatible")
            .field("base_url", &self.base_url)
            .field("model", &self.model_id)
            .field("api_key", &"[redacted]")
            .field("timeout", &self.timeout)
            .field("max_tokens", &self.max_tokens)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish_non_exhaustive()
    }
}

/// Configures an [`OpenAiCompatible`]; `build` validates.
pub struct OpenAiCompatibleBuilder {
    base_url: String,
    model: String,
    api_key: Option<String>,
    timeout: Duration,
    max_tokens: Option<u32>,
    max_response_bytes: usize,
    env: Option<Env>,
}

impl fmt::Debug for OpenAiCompatibleBuilder {
    /// Like the adapter's: the API key is not shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiCompatibleBuilder")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("timeout", &self.timeout)
            .field("max_tokens", &self.max_tokens)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish_non_exhaustive()
    }
}

impl OpenAiCompatible<()> {
    /// Starts configuring an adapter for the server at `base_url` (the `/v1`
    /// root, such as `http://127.0.0.1:8080/v1`) and its model id `model`.
    pub fn builder(base_url: impl Into<String>, model: impl Into<String>) -> OpenAiCompatibleBuilder {
        OpenAiCompatibleBuilder {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            timeout: DEFAULT_TIMEOUT,
            max_tokens: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            env: None,
        }
    }
}

impl OpenAiCompatibleBuilder {
    /// The API key, sent as `Authorization: Bearer …` (default
    /// [`DEFAULT_API_KEY`]).
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// How long one request may take, connection included (default
    /// [`DEFAULT_TIMEOUT`]). Enforced by the transport; a caller's shorter
    /// bound (a hardened provider's deadline) wins.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The output budget sent as `max_tokens` (default: the server's).
    pub fn max_tokens(mut self, n: u32) -> Self {
        self.max_tokens = Some(n);
        self
    }

    /// The most response-body bytes read (default
    /// [`DEFAULT_MAX_RESPONSE_BYTES`]); a longer body is
    /// [`ProviderError::ResponseTooLarge`].
    pub fn max_response_bytes(mut self, n: usize) -> Self {
        self.max_response_bytes = n;
        self
    }

    /// The clock `Retry-After` dates are measured against and the observer
    /// [`Event::ServedModelDiffers`] is reported to (default
    /// [`Env::system`]; its observer logs a warning).
    pub fn env(mut self, env: Env) -> Self {
        self.env = Some(env);
        self
    }

    /// Builds over reqwest (rustls with ring), following no redirects.
    #[cfg(feature = "openai")]
    pub fn build(self) -> Result<OpenAiCompatible<super::ReqwestTransport>, ConfigError> {
        let transport = super::ReqwestTransport::new().map_err(|e| ConfigError::new("http_client", "buildable", e))?;
        self.build_with(transport)
    }

    /// Builds over `transport`. The base URL must be a valid `http://` or
    /// `https://` URL with a host (and a port, if any, in range) and no query
    /// or fragment, since `/chat/completions` is appended to its path; the
    /// model non-empty; the timeout, `max_tokens` and `max_response_bytes`
    /// positive.
    pub fn build_with<T: HttpTransport>(self, transport: T) -> Result<OpenAiCompatible<T>, ConfigError> {
        let base_url = validate_base_url(&self.base_url)?;
        if self.model.trim().is_empty() {
            return Err(ConfigError::new("model", "non-empty", format!("{:?}", self.model)));
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::new("timeout", "positive", secs(self.timeout)));
        }
        if self.max_tokens == Some(0) {
            return Err(ConfigError::new("max_tokens", "positive", 0));
        }
        if self.max_response_bytes == 0 {
            return Err(ConfigError::new("max_response_bytes", "positive", 0));
        }
        let env = self.env.unwrap_or_default();
        Ok(OpenAiCompatible {
            transport,
            url: format!("{base_url}/chat/completions"),
            provenance: format!("openai-compatible/{}", self.model),
            base_url,
            model_id: self.model,
            api_key: self.api_key.unwrap_or_else(|| DEFAULT_API_KEY.to_owned()),
            timeout: self.timeout,
            max_tokens: self.max_tokens,
            max_response_bytes: self.max_response_bytes,
            clock: env.clock().clone(),
            observer: env.observer().clone(),
        })
    }
}

/// The base URL, checked as a whole and without a trailing slash.
fn validate_base_url(raw: &str) -> Result<String, ConfigError> {
    let bad = |expected| ConfigError::new("base_url", expected, format!("{raw:?}"));
    let url = url::Url::parse(raw.trim()).map_err(|_| bad("an http:// or https:// URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("an http:// or https:// URL"));
    }
    // The WHATWG parser reads `http:///v1` as host `v1`; a URL written
    // without a host is refused rather than guessed at.
    let written_host = raw.trim().split_once("://").map(|(_, rest)| rest);
    if url.host_str().is_none_or(str::is_empty) || written_host.is_none_or(|rest| rest.starts_with('/')) {
        return Err(bad("an http:// or https:// URL with a host"));
    }
    // `http://h:/v1` parses as the default port; a colon with no port is a
    // typo, not a choice.
    if written_host.is_some_and(|rest| rest.split(['/', '?', '#']).next().is_some_and(|a| a.ends_with(':'))) {
        return Err(bad("a URL whose port, if given, is a number"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad(
            "a URL without a query or fragment (the adapter appends /chat/completions)",
        ));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

/// Whether the model a server names as having answered is the one requested:
/// the same id, a dated snapshot of it (`gpt-4o` → `gpt-4o-2024-08-06`), or
/// its `:latest` tag (`qwen3` → `qwen3:latest`).
fn same_model(requested: &str, served: &str) -> bool {
    match served.strip_prefix(requested) {
        Some("") | Some(":latest") => true,
        Some(rest) => rest
            .strip_prefix('-')
            .is_some_and(|date| !date.is_empty() && date.chars().all(|c| c.is_ascii_digit() || c == '-')),
        None => false,
    }
}

impl<T: HttpTransport> OpenAiCompatible<T> {
    /// The `/v1` base URL, without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The server's model id, as sent in requests.
    pub fn model_id(&self) -> &str {
        &self.model_id
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    async fn call(
        &self,
        request: ExtractRequest<'_>,
        timeout: Option<Duration>,
    ) -> Result<Extracted<Value>, ProviderError> {
        if request.is_blank() {
            return Err(ProviderError::BlankText);
        }
        let body = wire::request_body(
            &self.model_id,
            request.text,
            request.system_prompt,
            request.schema,
            self.max_tokens,
        );
        let http = HttpRequest {
            url: self.url.clone(),
            headers: vec![
                ("content-type".to_owned(), "application/json".to_owned()),
                ("accept".to_owned(), "application/json".to_owned()),
                ("authorization".to_owned(), format!("Bearer {}", self.api_key)),
            ],
            body,
            body_limit: self.max_response_bytes,
            timeout: timeout.map_or(self.timeout, |t| t.min(self.timeout)),
        };
        let response = self
            .transport
            .post(http)
            .await
            .map_err(|e| wire::transport_error(e, &self.api_key))?;
        let cx = ResponseContext {
            model: &self.model_id,
            schema: request.schema,
            api_key: &self.api_key,
            now: self.clock.now(),
        };
        let completed = wire::parse_response(&response, &cx)?;
        let model = match completed.model {
            Some(served) if served != self.model_id => {
                let provenance = format!("openai-compatible/{served}");
                if !same_model(&self.model_id, &served) {
                    self.observer.on_event(&Event::ServedModelDiffers {
                        requested: Arc::from(self.provenance.as_str()),
                        served: Arc::from(provenance.as_str()),
                    });
                }
                provenance
            }
            _ => self.provenance.clone(),
        };
        Ok(Extracted {
            value: completed.value,
            model,
            usage: completed.usage,
            quota: completed.quota,
        })
    }
}

impl<T: HttpTransport> LlmProvider for OpenAiCompatible<T> {
    fn model(&self) -> &str {
        &self.provenance
    }

    fn max_tokens(&self) -> Option<u32> {
        self.max_tokens
    }

    fn extract_answer<'a>(
        &'a self,
        request: ExtractRequest<'a>,
        timeout: Option<Duration>,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>> {
        Box::pin(async move { self.call(request, timeout).await.map_err(ExtractError::from) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::transport::{HttpResponse, TransportError};

    struct Never;
    impl HttpTransport for Never {
        fn post(&self, _: HttpRequest) -> BoxFuture<'_, Result<HttpResponse, TransportError>> {
            Box::pin(async {
                Err(TransportError::failed(
                    super::super::TransportErrorKind::Connect,
                    "unreachable",
                ))
            })
        }
    }

    #[test]
    fn construction_validates_naming_the_field() {
        let b = |url: &str, model: &str| OpenAiCompatible::builder(url, model);
        let cases = [
            (
                b("localhost:8080/v1", "m"),
                "base_url must be an http:// or https:// URL, got \"localhost:8080/v1\"",
            ),
            (b("http://h/v1", " "), "model must be non-empty, got \" \""),
            (
                b("http://h/v1", "m").timeout(Duration::ZERO),
                "timeout must be positive, got 0",
            ),
            (
                b("http://h/v1", "m").max_tokens(0),
                "max_tokens must be positive, got 0",
            ),
            (
                b("http://h/v1", "m").max_response_bytes(0),
                "max_response_bytes must be positive, got 0",
            ),
        ];
        for (builder, message) in cases {
            assert_eq!(builder.build_with(Never).unwrap_err().to_string(), message);
        }
    }

    #[test]
    fn a_base_url_a_request_could_not_use_is_refused_at_construction() {
        for url in [
            "http://h:99999/v1",
            "http://my host/v1",
            "http://h/v1?key=1",
            "http://h/v1#frag",
            "http:///v1",
            "http://h:/v1",
            "ftp://h/v1",
        ] {
            let e = OpenAiCompatible::builder(url, "m")
                .build_with(Never)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("base_url must be"), "{url}: {e}");
            assert!(e.contains(&format!("{url:?}")), "{url}: {e}");
        }
        for (url, endpoint) in [
            ("http://h:8080/v1/", "http://h:8080/v1/chat/completions"),
            (
                "https://api.example.com/v1",
                "https://api.example.com/v1/chat/completions",
            ),
            ("http://[::1]:8080/v1", "http://[::1]:8080/v1/chat/completions"),
            ("http://server-0:8080/v1", "http://server-0:8080/v1/chat/completions"),
        ] {
            let p = OpenAiCompatible::builder(url, "m").build_with(Never).unwrap();
            assert_eq!(p.url, endpoint);
        }
    }

    #[test]
    fn provenance_and_url() {
        let p = OpenAiCompatible::builder("http://h:8080/v1/", "qwen3")
            .build_with(Never)
            .unwrap();
        assert_eq!(p.model(), "openai-compatible/qwen3");
        assert_eq!(p.url, "http://h:8080/v1/chat/completions");
        assert_eq!(p.base_url(), "http://h:8080/v1");
    }

    #[test]
    fn snapshots_and_tags_of_the_requested_model_are_the_same_model() {
        assert!(same_model("gpt-4o", "gpt-4o"));
        assert!(same_model("gpt-4o", "gpt-4o-2024-08-06"));
        assert!(same_model("qwen3", "qwen3:latest"));
        assert!(!same_model("gpt-4o", "gpt-4o-mini"));
        assert!(!same_model("gpt-4o", "gpt-4o-"));
        assert!(!same_model("no-such-model", "tiny"));
    }

    #[test]
    fn debug_never_shows_the_key() {
        let b = OpenAiCompatible::builder("http://h/v1", "m").api_key("sk-live-123");
        assert!(!format!("{b:?}").contains("sk-live-123"));
        let p = b.build_with(Never).unwrap();
        let shown = format!("{p:?}");
        assert!(!shown.contains("sk-live-123"), "{shown}");
        assert!(shown.contains("[redacted]"));
    }
}
