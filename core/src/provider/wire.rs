//! The OpenAI chat-completions wire format: the request we send and what every
//! possible answer means.
//!
//! Pure functions over bytes and headers, with no I/O and no HTTP client, so
//! the production transport and the simulator's run exactly the same parsing
//! and classification. Response types are lenient — unknown fields are
//! ignored, an error `code` may be a string or a number, reasoning text may be
//! under `reasoning` or `reasoning_content` — because llama.cpp, vLLM, Ollama,
//! llama-swap and OpenAI agree on the fields that matter and on little else.
//!
//! # Which failures are the server answering
//!
//! A 5xx is transient — the server may answer differently next time — except
//! when its body says the server *did* generate an answer and then could not
//! use it. That is [`ProviderError::UnusableOutput`]: not retried (the same
//! request costs the same generation) and not a breaker failure (the server
//! is up). Recognised, case-insensitively, in the error message of a 5xx:
//!
//! - `The model produced output that does not match the expected <format>
//!   format` — llama.cpp's chat parser rejecting the finished output
//!   (`peg-native`, `peg-gemma4`, `Content-only`…), which Ollama and LM Studio
//!   surface too. A plain `500 internal server error` or a proxy's `502`
//!   stays transient.
//!
//! A 400 whose message reads `model '…' not found` (llama-server in router
//! mode) is [`ProviderError::UnknownModel`], like a 404. A 3xx is
//! [`ProviderError::Redirected`]: the base URL is wrong, and a POST is never
//! re-sent elsewhere.
//!
//! # Quota signals
//!
//! A response may say the deployment has no capacity left for a while
//! ([`QuotaSignal`], read by [`quota_signal`]): a 429 or 503 with
//! `retry-after-ms` / `retry-after` (the error's `retry_after`), or — on any
//! response, a success included — `x-ratelimit-remaining-requests` or
//! `x-ratelimit-remaining-tokens` at `0` with the matching
//! `x-ratelimit-reset-requests` / `-tokens`, a Go-style duration (`1s`,
//! `6m0s`, `20ms`, `4m12.172s`; [`parse_reset`]). A 429 or 503 without
//! `Retry-After` takes the exhausted limit's reset as its `retry_after`, so
//! the call's own retry waits as long as the fleet's cooldown. Negative,
//! unparsable and overflowing values are no signal.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::ProviderError;
use super::schema::OutputSchema;
use super::transport::{HttpResponse, TransportError};
use crate::time::Timestamp;

/// Longest server message kept in an error, in characters.
const MAX_MESSAGE_CHARS: usize = 500;

/// What replaces the API key wherever a server echoes it.
const REDACTED: &str = "[redacted]";

/// Messages of a 5xx meaning the server generated output and could not use
/// it (lowercase; matched as a substring of the lowercased message).
const UNUSABLE_OUTPUT_MESSAGES: &[&str] = &["the model produced output that does not match the expected"];

/// The JSON body of a structured-output chat completion request.
///
/// The system prompt, when given, is sent exactly as given as the first
/// message; nothing is added to it and no default is supplied. `max_tokens`
/// is omitted when `None`, leaving the server's default.
pub(crate) fn request_body(
    model: &str,
    text: &str,
    system_prompt: Option<&str>,
    schema: &OutputSchema,
    max_tokens: Option<u32>,
) -> Vec<u8> {
    let system = system_prompt.map(|content| SentMessage {
        role: "system",
        content,
    });
    let user = SentMessage {
        role: "user",
        content: text,
    };
    let body = RequestBody {
        model,
        messages: system.into_iter().chain([user]).collect(),
        response_format: ResponseFormat {
            kind: "json_schema",
            json_schema: JsonSchemaFormat {
                name: schema.name(),
                strict: true,
                schema: schema.schema(),
            },
        },
        max_tokens,
    };
    // Serializing borrowed strings and a borrowed `Value` cannot fail.
    serde_json::to_vec(&body).unwrap_or_default()
}

/// A chat completion request as sent, borrowing everything it names.
#[derive(Serialize)]
struct RequestBody<'a> {
    model: &'a str,
    messages: Vec<SentMessage<'a>>,
    response_format: ResponseFormat<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
}

/// One chat message of a request.
#[derive(Serialize)]
struct SentMessage<'a> {
    role: &'static str,
    content: &'a str,
}

/// `response_format`: structured output under a JSON schema.
#[derive(Serialize)]
struct ResponseFormat<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    json_schema: JsonSchemaFormat<'a>,
}

/// `response_format.json_schema`: the schema's name, strictness and body.
#[derive(Serialize)]
struct JsonSchemaFormat<'a> {
    name: &'a str,
    strict: bool,
    schema: &'a Value,
}

/// What the adapter knows when it reads a response.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ResponseContext<'a> {
    /// The model id the request named (for 404 messages).
    pub model: &'a str,
    /// The schema the content must validate against.
    pub schema: &'a OutputSchema,
    /// The API key, removed from anything quoted from the server.
    pub api_key: &'a str,
    /// The time now, for `Retry-After` given as an HTTP date.
    pub now: Timestamp,
}

#[derive(Deserialize)]
struct Completion {
    #[serde(default)]
    choices: Vec<Choice>,
    /// The model that produced the answer, as the server names it. Any JSON,
    /// so that an odd value never makes a good answer unreadable.
    #[serde(default)]
    model: Option<Value>,
    /// What the call used, as the server counts it. Any JSON, for the same
    /// reason.
    #[serde(default)]
    usage: Option<Value>,
}

/// A chat completion read successfully.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Completed {
    /// The content, parsed and checked against the schema.
    pub value: Value,
    /// The response's `model` field, when it was a non-empty string (cleaned
    /// like any server text).
    pub model: Option<String>,
    /// The response's `usage`, when it held both counts as whole numbers.
    pub usage: Option<super::Usage>,
    /// The quota signal the response's headers carried, if any.
    pub quota: Option<QuotaSignal>,
}

/// Reads a `usage` object: `prompt_tokens` and `completion_tokens`, both
/// non-negative integers; anything else is no usage (never an error: a
/// server's accounting must not make a good answer unreadable).
fn read_usage(usage: Option<&Value>) -> Option<super::Usage> {
    let usage = usage?;
    Some(super::Usage {
        prompt_tokens: usage.get("prompt_tokens")?.as_u64()?,
        completion_tokens: usage.get("completion_tokens")?.as_u64()?,
    })
}

/// A server's word that a deployment has no capacity left for a while: how
/// long, and which signal said so.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuotaSignal {
    /// How long from the response until the deployment has capacity again.
    pub wait: Duration,
    /// What said so.
    pub source: QuotaSource,
}

/// Which header a [`QuotaSignal`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuotaSource {
    /// A 429 or 503 with `retry-after-ms` / `retry-after`.
    RetryAfter,
    /// `x-ratelimit-remaining-requests: 0` with `x-ratelimit-reset-requests`.
    Requests,
    /// `x-ratelimit-remaining-tokens: 0` with `x-ratelimit-reset-tokens`.
    Tokens,
}

/// The quota signal a response carries: for a 429 or 503, its non-zero
/// `Retry-After` ([`retry_after`]); otherwise, on any response, the longest
/// reset of a limit whose remaining count is `0` ([`exhausted_limit`]).
pub(crate) fn quota_signal(response: &HttpResponse, now: Timestamp) -> Option<QuotaSignal> {
    if matches!(response.status, 429 | 503)
        && let Some(wait) = retry_after(response, now).filter(|d| !d.is_zero())
    {
        return Some(QuotaSignal {
            wait,
            source: QuotaSource::RetryAfter,
        });
    }
    exhausted_limit(response)
}

/// The longest reset among the `x-ratelimit-*` limits whose remaining count
/// is exactly `0` and whose reset parses (and is non-zero); `None` otherwise.
pub(crate) fn exhausted_limit(response: &HttpResponse) -> Option<QuotaSignal> {
    [("requests", QuotaSource::Requests), ("tokens", QuotaSource::Tokens)]
        .into_iter()
        .filter_map(|(limit, source)| {
            let remaining = response.header(&format!("x-ratelimit-remaining-{limit}"))?;
            if remaining.trim().parse::<u64>().ok()? != 0 {
                return None;
            }
            let wait = parse_reset(response.header(&format!("x-ratelimit-reset-{limit}"))?)?;
            (!wait.is_zero()).then_some(QuotaSignal { wait, source })
        })
        .max_by_key(|signal| signal.wait)
}

/// Parses a Go-style duration as OpenAI's `x-ratelimit-reset-*` headers
/// send it: one or more `<decimal><unit>` parts, units `h`, `m`, `s`, `ms`,
/// `us` / `µs`, `ns` (`6m0s`, `1.5s`, `20ms`, `23h18m29.144s`), or a bare
/// `0`. No sign, no spaces; anything else, or a total beyond `u64` seconds,
/// is `None`.
pub(crate) fn parse_reset(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text == "0" {
        return Some(Duration::ZERO);
    }
    if text.is_empty() {
        return None;
    }
    let mut rest = text;
    let mut total_ns: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let unit_ns: u128 = match unit {
            "h" => 3_600_000_000_000,
            "m" => 60_000_000_000,
            "s" => 1_000_000_000,
            "ms" => 1_000_000,
            "us" | "µs" | "μs" => 1_000,
            "ns" => 1,
            _ => return None,
        };
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && frac.is_empty()) || frac.contains('.') || whole.len() > 20 {
            return None;
        }
        let whole: u128 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
        let mut part = whole.checked_mul(unit_ns)?;
        // The fraction, to the nanosecond (further digits are dropped).
        let mut scale = unit_ns;
        for digit in frac.bytes().take(30) {
            scale /= 10;
            part = part.checked_add(u128::from(digit - b'0').checked_mul(scale)?)?;
        }
        total_ns = total_ns.checked_add(part)?;
        rest = next;
    }
    let secs = u64::try_from(total_ns / 1_000_000_000).ok()?;
    let nanos = u32::try_from(total_ns % 1_000_000_000).ok()?;
    Some(Duration::new(secs, nanos))
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    message: Option<Message>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
}

/// Reads a response into the validated JSON value and the model the server
/// says produced it, or the error it means.
pub(crate) fn parse_response(response: &HttpResponse, cx: &ResponseContext<'_>) -> Result<Completed, ProviderError> {
    if response.status == 200 {
        let mut completed = parse_completion(&response.body, cx)?;
        completed.quota = quota_signal(response, cx.now);
        return Ok(completed);
    }
    Err(classify_status(response, cx))
}

fn parse_completion(body: &[u8], cx: &ResponseContext<'_>) -> Result<Completed, ProviderError> {
    let completion: Completion = serde_json::from_slice(body).map_err(|e| ProviderError::InvalidResponse {
        detail: format!("{e}; body starts {}", quote(body, cx.api_key)),
    })?;
    let model = match &completion.model {
        Some(Value::String(m)) if !m.trim().is_empty() => Some(clean(m.trim(), cx.api_key)),
        _ => None,
    };
    let usage = read_usage(completion.usage.as_ref());
    let Some(choice) = completion.choices.into_iter().next() else {
        return Err(ProviderError::Empty {
            finish_reason: None,
            reasoning: false,
        });
    };
    let finish_reason = choice.finish_reason;
    let message = choice.message.unwrap_or(Message {
        content: None,
        refusal: None,
        reasoning: None,
        reasoning_content: None,
    });
    if let Some(refusal) = message.refusal.filter(|r| !r.trim().is_empty()) {
        return Err(ProviderError::Refused {
            reason: clean(&refusal, cx.api_key),
        });
    }
    if finish_reason.as_deref() == Some("content_filter") {
        return Err(ProviderError::Refused {
            reason: "content_filter".to_owned(),
        });
    }
    let content = match message.content.as_ref().map(content_text).transpose() {
        Ok(text) => text.flatten().unwrap_or_default(),
        Err(what) => {
            return Err(ProviderError::InvalidResponse {
                detail: format!("message.content is {what}, not text"),
            });
        }
    };
    if content.trim().is_empty() {
        let has_text = |s: &Option<String>| s.as_deref().is_some_and(|t| !t.trim().is_empty());
        return Err(ProviderError::Empty {
            finish_reason,
            reasoning: has_text(&message.reasoning) || has_text(&message.reasoning_content),
        });
    }
    let malformed = |source| ProviderError::Malformed {
        schema: cx.schema.name().to_owned(),
        source,
    };
    let value: Value = match serde_json::from_str(&content) {
        Ok(value) => value,
        Err(_) if content.trim_start().starts_with("```") => {
            return Err(ProviderError::StructuredOutputIgnored {
                schema: cx.schema.name().to_owned(),
            });
        }
        Err(source) if finish_reason.as_deref() == Some("length") => {
            return Err(ProviderError::Truncated {
                schema: cx.schema.name().to_owned(),
                source,
            });
        }
        Err(source) => return Err(malformed(source)),
    };
    cx.schema.check(&value).map_err(malformed)?;
    Ok(Completed {
        value,
        model,
        usage,
        quota: None,
    })
}

/// A message's `content`: a string, or the text parts of an array of parts;
/// `null` is no content. Anything else is described for the error
/// (`a number (42)`).
fn content_text(content: &Value) -> Result<Option<String>, String> {
    match content {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        Value::Array(parts) => Ok(Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect(),
        )),
        Value::Bool(b) => Err(format!("a boolean ({b})")),
        Value::Number(n) => Err(format!("a number ({n})")),
        Value::Object(_) => Err("an object".to_owned()),
    }
}

/// The `error` envelope servers send with a failure status, as far as it can be read.
struct ErrorBody {
    message: String,
    code: Option<String>,
    kind: Option<String>,
}

fn read_error_body(body: &[u8], api_key: &str) -> ErrorBody {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let error = parsed.as_ref().and_then(|v| v.get("error"));
    let text = |v: Option<&Value>| match v {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let message = match error {
        Some(Value::String(s)) => Some(s.clone()),
        Some(e) => text(e.get("message")),
        None => parsed
            .as_ref()
            .and_then(|v| text(v.get("message")).or_else(|| text(v.get("detail")))),
    };
    ErrorBody {
        message: match message {
            Some(m) => clean(&m, api_key),
            None => quote(body, api_key),
        },
        code: error.and_then(|e| text(e.get("code"))),
        kind: error.and_then(|e| text(e.get("type"))),
    }
}

fn classify_status(response: &HttpResponse, cx: &ResponseContext<'_>) -> ProviderError {
    let error = read_error_body(&response.body, cx.api_key);
    let status = response.status;
    match status {
        429 => {
            let quota = [error.code.as_deref(), error.kind.as_deref()].contains(&Some("insufficient_quota"));
            let retry_after = retry_after(response, cx.now).or_else(|| exhausted_limit(response).map(|q| q.wait));
            if quota {
                ProviderError::QuotaExhausted {
                    retry_after,
                    message: error.message,
                }
            } else {
                ProviderError::RateLimited {
                    retry_after,
                    message: error.message,
                }
            }
        }
        503 => ProviderError::Unavailable {
            retry_after: retry_after(response, cx.now).or_else(|| exhausted_limit(response).map(|q| q.wait)),
            message: error.message,
        },
        401 | 403 => ProviderError::Authentication {
            status,
            message: error.message,
        },
        404 => ProviderError::UnknownModel {
            model: cx.model.to_owned(),
            message: error.message,
        },
        400 if names_an_unknown_model(&error.message) => ProviderError::UnknownModel {
            model: cx.model.to_owned(),
            message: error.message,
        },
        300..=399 => ProviderError::Redirected {
            status,
            location: response.header("location").map(|l| clean(l, cx.api_key)),
        },
        500..=599 if says_output_unusable(&error.message) => ProviderError::UnusableOutput {
            status,
            message: error.message,
        },
        408 | 500..=599 => ProviderError::Server {
            status,
            message: error.message,
        },
        _ => ProviderError::BadRequest {
            status,
            message: error.message,
        },
    }
}

/// Whether a 400's message is llama-server's router naming an unknown model
/// (`model 'x' not found`).
fn names_an_unknown_model(message: &str) -> bool {
    let message = message.trim().to_ascii_lowercase();
    message.starts_with("model ") && message.ends_with(" not found")
}

/// Whether a 5xx's message is one of [`UNUSABLE_OUTPUT_MESSAGES`].
fn says_output_unusable(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    UNUSABLE_OUTPUT_MESSAGES.iter().any(|m| message.contains(m))
}

/// The server's requested wait: `retry-after-ms` (milliseconds), else
/// `retry-after` as seconds or as an HTTP date (measured from `now`). Negative,
/// non-finite and unparsable values are ignored.
pub(crate) fn retry_after(response: &HttpResponse, now: Timestamp) -> Option<Duration> {
    let seconds = |v: &str, scale: f64| {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .and_then(|x| Duration::try_from_secs_f64(x / scale).ok())
    };
    if let Some(d) = response.header("retry-after-ms").and_then(|v| seconds(v, 1000.0)) {
        return Some(d);
    }
    let value = response.header("retry-after")?;
    seconds(value, 1.0).or_else(|| parse_http_date(value).map(|at| at.saturating_duration_since(now)))
}

/// Parses an HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`, and the obsolete
/// RFC 850 and asctime forms HTTP recipients must accept) with the `httpdate`
/// crate, which checks every field's range (years 1970–9999, a weekday that
/// matches the date). Anything else — a year past any calendar included — is
/// `None`, never an overflow.
pub(crate) fn parse_http_date(text: &str) -> Option<Timestamp> {
    let at = httpdate::parse_http_date(text).ok()?;
    let since_epoch = at.duration_since(std::time::UNIX_EPOCH).ok()?;
    u64::try_from(since_epoch.as_micros()).ok().map(Timestamp::from_micros)
}

/// The error a transport failure means.
pub(crate) fn transport_error(error: TransportError, api_key: &str) -> ProviderError {
    match error {
        TransportError::BodyTooLarge { limit } => ProviderError::ResponseTooLarge { limit },
        TransportError::Failed { kind, detail } => ProviderError::Transport {
            kind,
            detail: clean(&detail, api_key),
        },
    }
}

/// Server text made safe to show: the key removed, at most
/// [`MAX_MESSAGE_CHARS`] characters.
fn clean(text: &str, api_key: &str) -> String {
    let redacted = if api_key.is_empty() {
        text.to_owned()
    } else {
        text.replace(api_key, REDACTED)
    };
    let mut chars = redacted.chars();
    let mut out: String = chars.by_ref().take(MAX_MESSAGE_CHARS).collect();
    if chars.next().is_some() {
        out.push('…');
    }
    out
}

/// A body quoted as (lossy) text, cleaned.
fn quote(body: &[u8], api_key: &str) -> String {
    let head = &body[..body.len().min(MAX_MESSAGE_CHARS * 4)];
    let text = String::from_utf8_lossy(head);
    format!("{:?}", clean(text.trim(), api_key))
}

#[cfg(test)]
mod header_properties;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Debug, serde::Deserialize, schemars::JsonSchema, PartialEq)]
    struct Person {
        name: String,
        age: u8,
    }

    fn cx(schema: &OutputSchema) -> ResponseContext<'_> {
        ResponseContext {
            model: "qwen3",
            schema,
            api_key: "sk-secret-key",
            now: Timestamp::from_secs(1_700_000_000),
        }
    }

    fn response(status: u16, headers: &[(&str, &str)], body: &str) -> HttpResponse {
        HttpResponse {
            status,
            headers: headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
            body: body.as_bytes().to_vec(),
        }
    }

    fn completion(message: Value, finish_reason: &str) -> String {
        json!({"id": "x", "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}], "usage": {}})
            .to_string()
    }

    #[test]
    fn request_shape_is_strict_structured_output() {
        let schema = OutputSchema::for_type::<Person>();
        let body: Value =
            serde_json::from_slice(&request_body("m", "Ann is 30", Some("  be terse\n"), &schema, Some(64))).unwrap();
        assert_eq!(body["model"], "m");
        assert_eq!(body["max_tokens"], 64);
        assert_eq!(
            body["messages"],
            json!([{"role": "system", "content": "  be terse\n"}, {"role": "user", "content": "Ann is 30"}])
        );
        assert_eq!(body["response_format"]["type"], "json_schema");
        assert_eq!(body["response_format"]["json_schema"]["name"], "Person");
        assert_eq!(body["response_format"]["json_schema"]["strict"], true);
        assert_eq!(body["response_format"]["json_schema"]["schema"], *schema.schema());
        let bare: Value = serde_json::from_slice(&request_body("m", "t", None, &schema, None)).unwrap();
        assert_eq!(bare["messages"].as_array().map(Vec::len), Some(1));
        assert!(bare.get("max_tokens").is_none());
    }

    #[test]
    fn valid_content_comes_back_and_unknown_fields_are_ignored() {
        let schema = OutputSchema::for_type::<Person>();
        let body = completion(
            json!({"role": "assistant", "content": "{\"name\":\"Ann\",\"age\":30}", "extra": 1}),
            "stop",
        );
        let v = parse_response(&response(200, &[], &body), &cx(&schema)).unwrap();
        assert_eq!(v.value, json!({"name": "Ann", "age": 30}));
        assert_eq!(v.model, None, "the completion named no model");
        let named = json!({"model": "tiny", "choices": [{"message": {"content": "{\"name\":\"A\",\"age\":1}"}}]});
        let v = parse_response(&response(200, &[], &named.to_string()), &cx(&schema)).unwrap();
        assert_eq!(v.model.as_deref(), Some("tiny"));
        let odd = json!({"model": 7, "choices": [{"message": {"content": "{\"name\":\"A\",\"age\":1}"}}]});
        let v = parse_response(&response(200, &[], &odd.to_string()), &cx(&schema)).unwrap();
        assert_eq!(v.model, None, "an odd model field never spoils a good answer");
    }

    #[test]
    fn content_that_does_not_validate_is_malformed_naming_the_schema() {
        let schema = OutputSchema::for_type::<Person>();
        for content in ["{\"name\":\"Ann\"}", "not json", "{\"name\":\"Ann\",\"age\":300}"] {
            let body = completion(json!({"content": content}), "stop");
            match parse_response(&response(200, &[], &body), &cx(&schema)) {
                Err(ProviderError::Malformed { schema, .. }) => assert_eq!(schema, "Person"),
                other => panic!("{content}: {other:?}"),
            }
        }
    }

    #[test]
    fn empty_content_carries_finish_reason_and_notes_reasoning() {
        let schema = OutputSchema::for_type::<Person>();
        let cases = [
            (
                json!({"content": null, "reasoning_content": "thinking…"}),
                "length",
                true,
            ),
            (json!({"content": "", "reasoning": "hmm"}), "stop", true),
            (json!({"content": "  "}), "stop", false),
        ];
        for (message, finish, reasoning_expected) in cases {
            let body = completion(message, finish);
            match parse_response(&response(200, &[], &body), &cx(&schema)) {
                Err(ProviderError::Empty {
                    finish_reason,
                    reasoning,
                }) => {
                    assert_eq!(finish_reason.as_deref(), Some(finish));
                    assert_eq!(reasoning, reasoning_expected);
                }
                other => panic!("{other:?}"),
            }
        }
        let no_choices = parse_response(&response(200, &[], "{\"choices\":[]}"), &cx(&schema));
        assert!(matches!(
            no_choices,
            Err(ProviderError::Empty {
                finish_reason: None,
                ..
            })
        ));
    }

    #[test]
    fn refusals_are_recognised_both_ways() {
        let schema = OutputSchema::for_type::<Person>();
        let body = completion(json!({"content": null, "refusal": "I can't help with that."}), "stop");
        assert!(matches!(
            parse_response(&response(200, &[], &body), &cx(&schema)),
            Err(ProviderError::Refused { reason }) if reason == "I can't help with that."
        ));
        let body = completion(json!({"content": "{\"name\":\"A\",\"age\":1}"}), "content_filter");
        assert!(matches!(
            parse_response(&response(200, &[], &body), &cx(&schema)),
            Err(ProviderError::Refused { reason }) if reason == "content_filter"
        ));
    }

    #[test]
    fn statuses_classify_per_the_wire_table() {
        let schema = OutputSchema::for_type::<Person>();
        let cx = cx(&schema);
        let limited = parse_response(
            &response(
                429,
                &[("retry-after-ms", "1500"), ("retry-after", "9")],
                r#"{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}"#,
            ),
            &cx,
        );
        assert!(
            matches!(limited, Err(ProviderError::RateLimited { retry_after: Some(d), ref message })
            if d == Duration::from_millis(1500) && message == "slow down")
        );
        let quota = parse_response(
            &response(
                429,
                &[],
                r#"{"error":{"message":"no credit","type":"insufficient_quota","code":"insufficient_quota"}}"#,
            ),
            &cx,
        );
        assert!(matches!(quota, Err(ProviderError::QuotaExhausted { .. })));
        let loading = parse_response(
            &response(
                503,
                &[],
                r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#,
            ),
            &cx,
        );
        assert!(
            matches!(loading, Err(ProviderError::Unavailable { retry_after: None, ref message }) if message == "Loading model")
        );
        let ollama_404 = parse_response(
            &response(
                404,
                &[],
                r#"{"error":"model \"qwen3\" not found, try pulling it first"}"#,
            ),
            &cx,
        );
        assert!(
            matches!(ollama_404, Err(ProviderError::UnknownModel { ref model, ref message })
            if model == "qwen3" && message.contains("try pulling"))
        );
        let proxy = parse_response(&response(502, &[], "<html>Bad Gateway</html>"), &cx);
        assert!(
            matches!(proxy, Err(ProviderError::Server { status: 502, ref message }) if message.contains("Bad Gateway"))
        );
        let auth = parse_response(
            &response(
                401,
                &[],
                r#"{"error":{"message":"Incorrect API key provided: sk-secret-key","code":401}}"#,
            ),
            &cx,
        );
        match auth {
            Err(e @ ProviderError::Authentication { status: 401, .. }) => {
                assert!(!e.to_string().contains("sk-secret-key"), "{e}");
                assert!(e.to_string().contains("[redacted]"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        let context = parse_response(
            &response(
                400,
                &[],
                r#"{"error":{"message":"exceeds context","type":"exceed_context_size_error","n_ctx":8}}"#,
            ),
            &cx,
        );
        assert!(matches!(context, Err(ProviderError::BadRequest { status: 400, .. })));
    }

    #[test]
    fn a_200_that_is_not_a_completion_is_invalid() {
        let schema = OutputSchema::for_type::<Person>();
        let r = parse_response(&response(200, &[], "<html>login</html>"), &cx(&schema));
        assert!(matches!(r, Err(ProviderError::InvalidResponse { .. })));
    }

    #[test]
    fn retry_after_forms() {
        let now = Timestamp::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        let r = |h: &[(&str, &str)]| retry_after(&response(429, h, ""), now);
        assert_eq!(r(&[("Retry-After", "2")]), Some(Duration::from_secs(2)));
        assert_eq!(r(&[("retry-after", "0.5")]), Some(Duration::from_millis(500)));
        assert_eq!(r(&[("retry-after-ms", "250")]), Some(Duration::from_millis(250)));
        assert_eq!(
            r(&[("retry-after", "Sun, 06 Nov 1994 08:49:47 GMT")]),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            r(&[("retry-after", "Sun, 06 Nov 1994 08:49:00 GMT")]),
            Some(Duration::ZERO)
        );
        assert_eq!(r(&[("retry-after", "-1")]), None);
        assert_eq!(r(&[("retry-after", "soon")]), None);
        assert_eq!(r(&[("retry-after", "NaN")]), None);
        assert_eq!(r(&[]), None);
    }

    #[test]
    fn resets_parse_as_go_durations() {
        let ms = Duration::from_millis;
        assert_eq!(parse_reset("1s"), Some(ms(1000)));
        assert_eq!(parse_reset("6m0s"), Some(ms(360_000)));
        assert_eq!(parse_reset("20ms"), Some(ms(20)));
        assert_eq!(parse_reset("1.5s"), Some(ms(1500)));
        assert_eq!(parse_reset("4m12.172s"), Some(ms(252_172)));
        assert_eq!(parse_reset("23h18m29.144s"), Some(ms(83_909_144)));
        assert_eq!(parse_reset("250us"), Some(Duration::from_micros(250)));
        assert_eq!(parse_reset("0"), Some(Duration::ZERO));
        assert_eq!(parse_reset(".5s"), Some(ms(500)));
        for bad in [
            "",
            "1",
            "-1s",
            "1x",
            "s",
            "1.2.3s",
            ".s",
            "1 s",
            "99999999999999999999999h",
            "NaN",
        ] {
            assert_eq!(parse_reset(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn quota_signals_come_from_retry_after_or_an_exhausted_limit() {
        let now = Timestamp::from_secs(1_700_000_000);
        let q = |status, h: &[(&str, &str)]| quota_signal(&response(status, h, ""), now);
        let signal = |secs: u64, source| {
            Some(QuotaSignal {
                wait: Duration::from_secs(secs),
                source,
            })
        };
        assert_eq!(q(429, &[("retry-after", "20")]), signal(20, QuotaSource::RetryAfter));
        assert_eq!(q(503, &[("retry-after", "3")]), signal(3, QuotaSource::RetryAfter));
        assert_eq!(q(500, &[("retry-after", "3")]), None, "only a 429 or 503's Retry-After");
        assert_eq!(q(429, &[("retry-after", "0")]), None, "a zero wait is no cooldown");
        let spent = [
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ];
        assert_eq!(q(200, &spent), signal(360, QuotaSource::Tokens), "the longest reset");
        assert_eq!(q(200, &spent[..2]), signal(1, QuotaSource::Requests));
        assert_eq!(
            q(429, &[("retry-after", "2"), spent[2], spent[3]]),
            signal(2, QuotaSource::RetryAfter),
            "the server's explicit wait first"
        );
        assert_eq!(q(429, &spent[2..]), signal(360, QuotaSource::Tokens));
        for remaining in ["1", "-1", "x", ""] {
            let h = [
                ("x-ratelimit-remaining-requests", remaining),
                ("x-ratelimit-reset-requests", "1s"),
            ];
            assert_eq!(q(200, &h), None, "remaining {remaining:?}");
        }
        assert_eq!(
            q(
                200,
                &[
                    ("x-ratelimit-remaining-requests", "0"),
                    ("x-ratelimit-reset-requests", "soon")
                ]
            ),
            None
        );
        assert_eq!(
            q(200, &[("x-ratelimit-remaining-requests", "0")]),
            None,
            "no reset, no signal"
        );
    }

    #[test]
    fn a_429_without_retry_after_waits_for_its_exhausted_limit() {
        let schema = OutputSchema::for_type::<String>();
        let limited = parse_response(
            &response(
                429,
                &[
                    ("x-ratelimit-remaining-requests", "0"),
                    ("x-ratelimit-reset-requests", "12s"),
                ],
                r#"{"error":{"message":"Rate limit reached","code":"rate_limit_exceeded"}}"#,
            ),
            &cx(&schema),
        );
        assert!(
            matches!(limited, Err(ProviderError::RateLimited { retry_after: Some(d), .. }) if d == Duration::from_secs(12)),
            "{limited:?}"
        );
        let body = completion(json!({"content": "\"x\""}), "stop");
        let ok = parse_response(
            &response(
                200,
                &[
                    ("x-ratelimit-remaining-tokens", "0"),
                    ("x-ratelimit-reset-tokens", "20ms"),
                ],
                &body,
            ),
            &cx(&schema),
        )
        .unwrap();
        assert_eq!(ok.quota.map(|q| q.wait), Some(Duration::from_millis(20)));
    }

    #[test]
    fn http_dates_parse_exactly() {
        assert_eq!(parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(Timestamp::EPOCH));
        assert_eq!(
            parse_http_date("Tue, 14 Nov 2023 22:13:20 GMT"),
            Some(Timestamp::from_secs(1_700_000_000))
        );
        assert_eq!(parse_http_date("Tue, 14 Foo 2023 22:13:20 GMT"), None);
        assert_eq!(parse_http_date("Tue, 14 Nov 2023 22:13 GMT"), None);
        assert_eq!(parse_http_date("Tue, 14 Nov 2023 22:13:20 PST"), None);
    }

    #[test]
    fn a_far_future_date_is_unparsable_not_an_overflow() {
        // Once a panic in `days_from_civil` (debug) or a wrapped value (release).
        assert_eq!(parse_http_date("Sun, 06 Nov 9223372036854775807 08:49:37 GMT"), None);
        assert_eq!(parse_http_date("Sun, 06 Nov -9223372036854775808 08:49:37 GMT"), None);
        let r = response(
            429,
            &[("retry-after", "Sun, 06 Nov 9223372036854775807 08:49:37 GMT")],
            "",
        );
        assert_eq!(retry_after(&r, Timestamp::from_secs(1_700_000_000)), None);
    }

    #[test]
    fn a_500_saying_the_server_could_not_parse_the_models_output_is_an_answer() {
        let schema = OutputSchema::for_type::<Person>();
        for body in [
            r#"{"error":{"code":500,"message":"The model produced output that does not match the expected peg-native format","type":"server_error"}}"#,
            r#"{"error":{"code":500,"message":"The model produced output that does not match the expected peg-gemma4 format","type":"server_error"}}"#,
        ] {
            let e = parse_response(&response(500, &[], body), &cx(&schema)).unwrap_err();
            assert_eq!(e.kind(), "unusable_output", "{e}");
            assert!(!e.is_transient(), "{e}");
            assert!(e.server_answered(), "{e}");
            assert!(e.to_string().contains("peg-"), "{e}");
        }
        for (status, body) in [
            (
                500,
                r#"{"error":{"code":500,"message":"internal server error","type":"server_error"}}"#,
            ),
            (502, "<html>Bad Gateway</html>"),
        ] {
            let e = parse_response(&response(status, &[], body), &cx(&schema)).unwrap_err();
            assert_eq!(e.kind(), "server_error", "{e}");
            assert!(e.is_transient(), "{e}");
        }
    }

    #[test]
    fn the_llama_server_routers_400_for_an_unknown_model_is_an_unknown_model() {
        let schema = OutputSchema::for_type::<Person>();
        let body =
            r#"{"error":{"code":400,"message":"model 'no-such-model' not found","type":"invalid_request_error"}}"#;
        let e = parse_response(&response(400, &[], body), &cx(&schema)).unwrap_err();
        assert!(
            matches!(e, ProviderError::UnknownModel { ref model, .. } if model == "qwen3"),
            "{e:?}"
        );
        let other = r#"{"error":{"code":400,"message":"model is not loaded","type":"invalid_request_error"}}"#;
        let e = parse_response(&response(400, &[], other), &cx(&schema)).unwrap_err();
        assert_eq!(e.kind(), "bad_request");
    }

    #[test]
    fn a_redirect_is_a_permanent_answer_naming_where_it_pointed() {
        let schema = OutputSchema::for_type::<Person>();
        let r = response(307, &[("location", "https://elsewhere/v1/chat/completions")], "");
        let e = parse_response(&r, &cx(&schema)).unwrap_err();
        assert_eq!(e.kind(), "redirected");
        assert!(!e.is_transient());
        assert!(e.to_string().contains("https://elsewhere/v1/chat/completions"), "{e}");
    }

    #[test]
    fn answers_that_went_wrong_in_a_known_way_say_how() {
        let schema = OutputSchema::for_type::<Person>();
        let cut = completion(json!({"content": "{\"name\":\"Ann\",\"ag"}), "length");
        let e = parse_response(&response(200, &[], &cut), &cx(&schema)).unwrap_err();
        assert_eq!(e.kind(), "truncated");
        assert!(e.to_string().contains("max_tokens"), "{e}");
        let fenced = completion(json!({"content": "```json\n{\"name\":\"Ann\",\"age\":3}\n```"}), "stop");
        let e = parse_response(&response(200, &[], &fenced), &cx(&schema)).unwrap_err();
        assert_eq!(e.kind(), "structured_output_ignored");
        assert!(e.to_string().contains("strict"), "{e}");
        let number = completion(json!({"content": 42}), "stop");
        let e = parse_response(&response(200, &[], &number), &cx(&schema)).unwrap_err();
        assert_eq!(e.kind(), "invalid_response");
        assert!(e.to_string().contains("42"), "{e}");
        // A complete answer that fails the schema is still malformed.
        let wrong = completion(json!({"content": "{\"name\":\"Ann\"}"}), "length");
        let e = parse_response(&response(200, &[], &wrong), &cx(&schema)).unwrap_err();
        assert_eq!(e.kind(), "malformed");
    }

    #[test]
    fn transport_errors_keep_their_kind_and_lose_the_key() {
        let e = transport_error(
            TransportError::failed(
                crate::provider::TransportErrorKind::Timeout,
                "timed out with sk-secret-key",
            ),
            "sk-secret-key",
        );
        assert_eq!(e.kind(), "transport_timeout");
        assert!(!e.to_string().contains("sk-secret-key"));
        let e = transport_error(TransportError::BodyTooLarge { limit: 10 }, "k");
        assert!(matches!(e, ProviderError::ResponseTooLarge { limit: 10 }));
    }

    #[test]
    fn long_messages_are_truncated_at_a_char_boundary() {
        let long = "é".repeat(2000);
        let c = clean(&long, "");
        assert_eq!(c.chars().count(), MAX_MESSAGE_CHARS + 1);
    }

    #[test]
    fn usage_is_read_when_both_counts_are_whole_numbers_and_ignored_otherwise() {
        let usage = |v: Value| read_usage(Some(&v));
        assert_eq!(
            usage(json!({"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42})),
            Some(super::super::Usage {
                prompt_tokens: 12,
                completion_tokens: 30
            })
        );
        for odd in [
            json!({}),
            json!({"prompt_tokens": 12}),
            json!({"prompt_tokens": -1, "completion_tokens": 3}),
            json!({"prompt_tokens": 1.5, "completion_tokens": 3}),
            json!({"prompt_tokens": "12", "completion_tokens": 3}),
            json!(null),
            json!([1, 2]),
        ] {
            assert_eq!(usage(odd.clone()), None, "{odd}");
        }
        assert_eq!(read_usage(None), None);
    }
}
