//! `ExtractService`: a provider — a [`HardenedProvider`] above all — as a
//! tower [`Service`] of typed extractions.
//!
//! [`HardenedProvider`]: crate::HardenedProvider

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use tower_service::Service;

use crate::provider::{ExtractError, Extracted, LlmProvider, LlmProviderExt};

/// One extraction asked of an [`ExtractService`]: the text, the system
/// prompt, and (as its type parameter) the type to extract.
///
/// It owns its text, so a call can outlive the caller's borrow, as a
/// service's future must.
pub struct Extract<T> {
    /// The text to extract from. Blank text is refused before any call.
    pub text: String,
    /// The system prompt, passed to the model exactly as given.
    pub system_prompt: Option<String>,
    target: PhantomData<fn() -> T>,
}

impl<T> Extract<T> {
    /// A `T` to extract from `text`, with no system prompt.
    pub fn new(text: impl Into<String>) -> Self {
        Extract {
            text: text.into(),
            system_prompt: None,
            target: PhantomData,
        }
    }

    /// With `prompt` as the system prompt.
    pub fn system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = Some(prompt.into());
        self
    }
}

impl<T> Clone for Extract<T> {
    fn clone(&self) -> Self {
        Extract {
            text: self.text.clone(),
            system_prompt: self.system_prompt.clone(),
            target: PhantomData,
        }
    }
}

impl<T> fmt::Debug for Extract<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Extract")
            .field("target", &std::any::type_name::<T>())
            .field("text", &self.text)
            .field("system_prompt", &self.system_prompt)
            .finish()
    }
}

/// A provider as a [`Service`] of [`Extract`] requests, answering the
/// [`Extracted`] value and the model that produced it, or the provider's
/// [`ExtractError`].
///
/// Wrap a [`HardenedProvider`](crate::HardenedProvider) to use its whole
/// hardening (limiter, breakers, retries, routing) where a service is
/// expected — behind tower's own layers (a timeout, a concurrency limit,
/// load shedding) or an axum or tonic handler. The service is always
/// ready: admission is the provider's, decided in the call. Dropping the
/// response future cancels the call as dropping the provider's own future
/// does.
pub struct ExtractService<P> {
    provider: Arc<P>,
}

impl<P> ExtractService<P> {
    /// The service over `provider`.
    pub fn new(provider: Arc<P>) -> Self {
        ExtractService { provider }
    }

    /// The provider.
    pub fn provider(&self) -> &Arc<P> {
        &self.provider
    }
}

impl<P> Clone for ExtractService<P> {
    fn clone(&self) -> Self {
        ExtractService {
            provider: self.provider.clone(),
        }
    }
}

impl<P: LlmProvider> fmt::Debug for ExtractService<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtractService")
            .field("model", &self.provider.model())
            .finish_non_exhaustive()
    }
}

/// The future an [`ExtractService`] answers.
pub type ExtractFuture<T> = Pin<Box<dyn Future<Output = Result<Extracted<T>, ExtractError>> + Send>>;

impl<P, T> Service<Extract<T>> for ExtractService<P>
where
    P: LlmProvider + 'static,
    T: DeserializeOwned + JsonSchema + Send + 'static,
{
    type Response = Extracted<T>;
    type Error = ExtractError;
    type Future = ExtractFuture<T>;

    /// Always ready: the provider decides admission in the call.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ExtractError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Extract<T>) -> Self::Future {
        let provider = self.provider.clone();
        Box::pin(async move {
            provider
                .extract_with_model::<T>(&request.text, request.system_prompt.as_deref())
                .await
        })
    }
}
