//! The `tracing` spans of a hardened call and of each of its attempts.
//!
//! Metrics say how often calls fail; a trace says why this one took nine
//! seconds: two attempts, the backoff between them, the server that
//! answered. A [`HardenedProvider`](super::HardenedProvider) opens one span
//! per call and, inside it, one per attempt sent to a model server, with the
//! attributes its metrics carry ([`crate::observe`]'s events, as
//! `redstring::metrics` records them), named as OpenTelemetry's semantic
//! conventions for GenAI client spans name them
//! (<https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/>): an
//! OpenTelemetry layer over `tracing` (`tracing-opentelemetry`, whose
//! `otel.name`, `otel.kind` and `otel.status_code` fields set the span's
//! name, kind and status —
//! <https://docs.rs/tracing-opentelemetry/latest/tracing_opentelemetry/#special-fields>)
//! exports them as those conventions' spans, unchanged. The table is in
//! [`HardenedProvider`](super::HardenedProvider)'s documentation.
//!
//! A span's fields are computed only when a subscriber enables it, so a
//! process without one pays a disabled-callsite check per call and attempt.

use serde_json::Value;
use tracing::Span;
use tracing::field::Empty;

use super::{ExtractError, Extracted};
use crate::observe::provider_and_model;
use crate::tenant::TenantId;

/// `gen_ai.operation.name`: an extraction is a chat completion.
pub(crate) const OPERATION_NAME: &str = "chat";

/// The span of one hardened call to `model` (a provenance,
/// `openai-compatible/qwen3`) for `tenant`: OpenTelemetry's inference span,
/// which covers the logical operation with all its retries.
pub(crate) fn call_span(model: &str, tenant: TenantId) -> Span {
    let (provider, model) = provider_and_model(model);
    tracing::info_span!(
        "chat",
        otel.name = format!("{OPERATION_NAME} {model}"),
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.operation.name = OPERATION_NAME,
        gen_ai.provider.name = provider,
        gen_ai.request.model = model,
        gen_ai.response.model = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        "error.type" = Empty,
        redstring.tenant = %tenant,
        redstring.outcome = Empty,
        redstring.attempts = Empty,
    )
}

/// The span of attempt `attempt` (from 1) of a call, sent to `model`.
pub(crate) fn attempt_span(model: &str, attempt: u32) -> Span {
    let (provider, model) = provider_and_model(model);
    tracing::info_span!(
        "redstring.attempt",
        otel.status_code = Empty,
        gen_ai.operation.name = OPERATION_NAME,
        gen_ai.provider.name = provider,
        gen_ai.request.model = model,
        gen_ai.response.model = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        "error.type" = Empty,
        redstring.attempt = attempt,
        redstring.outcome = Empty,
    )
}

/// Records how a call or an attempt ended on its span: the answering model
/// and its token usage, or the error's kind (`error.type`, the metrics'
/// `outcome`) and an error status.
pub(crate) fn record_result(span: &Span, result: &Result<Extracted<Value>, ExtractError>) {
    if span.is_disabled() {
        return;
    }
    match result {
        Ok(answer) => {
            span.record("gen_ai.response.model", provider_and_model(&answer.model).1);
            if let Some(usage) = answer.usage {
                span.record("gen_ai.usage.input_tokens", usage.prompt_tokens);
                span.record("gen_ai.usage.output_tokens", usage.completion_tokens);
            }
            span.record("redstring.outcome", "ok");
        }
        Err(error) => {
            span.record("error.type", error.kind());
            span.record("otel.status_code", "error");
            span.record("redstring.outcome", error.kind());
        }
    }
}

/// Records on a call's span that its caller dropped it after `attempts`
/// attempts: `outcome` as its `error.type` and `redstring.outcome`.
pub(crate) fn record_cancelled(span: &Span, outcome: &str, attempts: u32) {
    if span.is_disabled() {
        return;
    }
    span.record("error.type", outcome);
    span.record("otel.status_code", "error");
    span.record("redstring.outcome", outcome);
    span.record("redstring.attempts", attempts);
}
