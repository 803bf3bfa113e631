//! The `LlmProvider` port, the OpenAI-compatible adapter, and the hardened
//! provider that wraps one.
//!
//! A pipeline asks a provider for one thing: a value of its own type,
//! extracted from a text, checked against that type's schema. [`LlmProvider`]
//! is that port, kept object-safe — it works on an [`OutputSchema`] and JSON —
//! so a user can hold an `Arc<dyn LlmProvider>`; [`LlmProviderExt::extract`]
//! is the typed call on top, for any provider, boxed or not.
//!
//! - [`OpenAiCompatible`] speaks the chat-completions wire format that
//!   llama.cpp, llama-swap, vLLM, Ollama and OpenAI share, over a small
//!   [`HttpTransport`] seam ([`ReqwestTransport`] in production, feature
//!   `openai`, on by default). Parsing and classification live in a module of
//!   their own, independent of any HTTP client.
//! - [`HardenedProvider`] composes the crate's three layers around any
//!   provider — breaker outermost, limiter next, retry innermost — and is an
//!   `LlmProvider` itself.
//!
//! Provenance is the model that produced the answer, not the one asked for:
//! [`LlmProvider::extract_answer`] (and the typed
//! [`LlmProviderExt::extract_with_model`]) return the value with it, read
//! from the server's response. [`LlmProvider::model`] stays the configured
//! identity.
//!
//! ```no_run
//! # #[cfg(feature = "openai")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use redstring::provider::{LlmProvider, LlmProviderExt, OpenAiCompatible};
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Person {
//!     name: String,
//!     age: Option<u32>,
//! }
//!
//! let provider: Arc<dyn LlmProvider> =
//!     Arc::new(OpenAiCompatible::builder("http://127.0.0.1:8080/v1", "qwen3").build()?);
//! let person: Person = provider.extract("Ann is thirty.", None).await?;
//! # Ok(()) }
//! ```

mod error;
mod hardened;
mod openai;
#[cfg(feature = "openai")]
mod reqwest_transport;
mod route;
mod schema;
mod spans;
mod transport;
mod wire;

use std::future::Future;
use std::time::Duration;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use crate::decide::concurrency::AdaptiveConcurrency;
pub use crate::decide::ramp::SlowStart;
pub use error::{
    ConcurrencyLimited, DeadlineExceeded, DeadlineWait, DeploymentLimited, ExtractError, ProviderError,
    TransportErrorKind,
};
pub use hardened::{
    DEFAULT_COOLDOWN_WAITS, DEFAULT_LIMITER_WAITS, DEFAULT_MAX_QUOTA_COOLDOWN, DEFAULT_MAX_SERVER_DELAY,
    DEFAULT_OUTPUT_ESTIMATE, DEFAULT_QUOTA_COOLDOWN, HardenedProvider, HardenedProviderBuilder, HedgeAfter,
    MAX_HEDGE_DELAY, MAX_HEDGE_WINDOW, MAX_HEDGES, MIN_HEDGE_WINDOW, default_token_estimate,
};
pub use openai::{
    DEFAULT_API_KEY, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_TIMEOUT, OpenAiCompatible, OpenAiCompatibleBuilder,
};
#[cfg(feature = "openai")]
pub use reqwest_transport::ReqwestTransport;
pub use route::{DEPLOYMENT_LIMIT_TENANT, Deployment, IN_FLIGHT_PREFIX};
pub use schema::{OutputSchema, make_strict};
pub use transport::{BoxFuture, HttpRequest, HttpResponse, HttpTransport, TransportError};
pub use wire::{QuotaSignal, QuotaSource};

/// What one call used, as the server counted it (the response's `usage`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
}

impl Usage {
    /// Both together: what a token budget is charged.
    pub fn total(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }
}

/// A value and the model that produced it.
#[derive(Clone, Debug, PartialEq)]
pub struct Extracted<T> {
    /// The extracted value.
    pub value: T,
    /// Provenance of this answer, in [`LlmProvider::model`]'s form
    /// (`openai-compatible/qwen3`): the model the server says answered, which
    /// can differ from the one requested (a single-model server ignores the
    /// request's `model`; an alias resolves to a snapshot).
    pub model: String,
    /// What the call used, when the server said (`usage`); a hardened
    /// provider settles its token reservation with it.
    pub usage: Option<Usage>,
    /// The quota signal the answer's response carried (`x-ratelimit-*` at
    /// zero with its reset), if any: a caller sharing the deployment should
    /// not call it again before `wait` has passed.
    pub quota: Option<QuotaSignal>,
}

/// One extraction, in the object-safe form providers implement.
#[derive(Clone, Copy, Debug)]
pub struct ExtractRequest<'a> {
    /// The text to extract from. Must not be blank.
    pub text: &'a str,
    /// The system prompt, passed to the model exactly as given. Providers add
    /// no prompt of their own.
    pub system_prompt: Option<&'a str>,
    /// The caller's type, as a strict schema with its serde check.
    pub schema: &'a OutputSchema,
}

impl ExtractRequest<'_> {
    /// Whether the text is empty or whitespace only — a caller error every
    /// provider returns before any network call.
    pub fn is_blank(&self) -> bool {
        self.text.trim().is_empty()
    }
}

/// A source of schema-checked extractions: the port a pipeline is written
/// against.
///
/// Object-safe, so `Arc<dyn LlmProvider>` works; use
/// [`LlmProviderExt::extract`] for the typed call.
pub trait LlmProvider: Send + Sync {
    /// Provenance: the identity of the model that answers
    /// (`openai-compatible/qwen3`). A wrapper returns its inner provider's,
    /// never a name of its own.
    fn model(&self) -> &str;

    /// The most tokens a call asks the model to generate (`max_tokens`), if
    /// this provider sets one: a token budget reserves it with the prompt's
    /// estimate. A wrapper returns its inner provider's.
    fn max_tokens(&self) -> Option<u32> {
        None
    }

    /// Extracts a JSON value that has passed `request.schema`'s check, with
    /// the model that produced it, or says why not. Blank text is
    /// [`ProviderError::BlankText`], before any network call.
    ///
    /// `timeout`, when given, bounds this call: a provider sends its request
    /// with the smaller of it and its own timeout (a hardened provider passes
    /// what its deadline leaves to each attempt).
    fn extract_answer<'a>(
        &'a self,
        request: ExtractRequest<'a>,
        timeout: Option<Duration>,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>>;

    /// [`extract_answer`](Self::extract_answer) without a time bound of its
    /// own, keeping only the value.
    fn extract_value<'a>(&'a self, request: ExtractRequest<'a>) -> BoxFuture<'a, Result<Value, ExtractError>> {
        let answer = self.extract_answer(request, None);
        Box::pin(async move { answer.await.map(|a| a.value) })
    }
}

impl<P: LlmProvider + ?Sized> LlmProvider for std::sync::Arc<P> {
    fn model(&self) -> &str {
        (**self).model()
    }
    fn max_tokens(&self) -> Option<u32> {
        (**self).max_tokens()
    }
    fn extract_answer<'a>(
        &'a self,
        request: ExtractRequest<'a>,
        timeout: Option<Duration>,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>> {
        (**self).extract_answer(request, timeout)
    }
    fn extract_value<'a>(&'a self, request: ExtractRequest<'a>) -> BoxFuture<'a, Result<Value, ExtractError>> {
        (**self).extract_value(request)
    }
}

impl<P: LlmProvider + ?Sized> LlmProvider for Box<P> {
    fn model(&self) -> &str {
        (**self).model()
    }
    fn max_tokens(&self) -> Option<u32> {
        (**self).max_tokens()
    }
    fn extract_answer<'a>(
        &'a self,
        request: ExtractRequest<'a>,
        timeout: Option<Duration>,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>> {
        (**self).extract_answer(request, timeout)
    }
    fn extract_value<'a>(&'a self, request: ExtractRequest<'a>) -> BoxFuture<'a, Result<Value, ExtractError>> {
        (**self).extract_value(request)
    }
}

/// The typed call, for every [`LlmProvider`] (including `dyn LlmProvider`).
pub trait LlmProviderExt: LlmProvider {
    /// Extracts a `T` from `text`, under `T`'s strict schema, with
    /// `system_prompt` passed through untouched.
    fn extract<'a, T>(
        &'a self,
        text: &'a str,
        system_prompt: Option<&'a str>,
    ) -> impl Future<Output = Result<T, ExtractError>> + Send + 'a
    where
        T: DeserializeOwned + JsonSchema + 'a,
    {
        let answer = self.extract_with_model::<T>(text, system_prompt);
        async move { answer.await.map(|a| a.value) }
    }

    /// [`extract`](Self::extract), with the model that produced the value
    /// (see [`Extracted::model`]).
    fn extract_with_model<'a, T>(
        &'a self,
        text: &'a str,
        system_prompt: Option<&'a str>,
    ) -> impl Future<Output = Result<Extracted<T>, ExtractError>> + Send + 'a
    where
        T: DeserializeOwned + JsonSchema + 'a,
    {
        async move {
            if text.trim().is_empty() {
                return Err(ProviderError::BlankText.into());
            }
            let schema = OutputSchema::for_type::<T>();
            let request = ExtractRequest {
                text,
                system_prompt,
                schema: &schema,
            };
            let answer = self.extract_answer(request, None).await?;
            let value = T::deserialize(answer.value).map_err(|source| ProviderError::Malformed {
                schema: schema.name().to_owned(),
                source,
            })?;
            Ok(Extracted {
                value,
                model: answer.model,
                usage: answer.usage,
                quota: answer.quota,
            })
        }
    }
}

impl<P: LlmProvider + ?Sized> LlmProviderExt for P {}

/// Compile-time proof that the port stays object-safe.
fn _object_safe(_: &dyn LlmProvider, _: &dyn HttpTransport) {}
