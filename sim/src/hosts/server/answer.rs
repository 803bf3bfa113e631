//! What a simulated server reads of a chat-completions request, and the
//! `chat.completion` body it answers with.
//!
//! Every request of every worker passes through here, so reading and
//! writing are typed and the answer's content is built once per schema:
//! a request is read for the three things a server uses (the model, the
//! output limit and the schema) with the schema kept as written, and the
//! content satisfying it is made from the schema once and reused while
//! requests keep naming the same one. A body that is JSON but not of the
//! expected shape is read field by field from its value, as a lenient
//! server would; only a body that is not JSON at all is refused. The fields
//! a server does not use are skipped, not checked: a lone surrogate or an
//! out-of-range number there is not noticed (the simulator's own workers
//! send every request, so none has one), and a `response_format` that does
//! not parse asks for no schema.

use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::hosts::clock::{EPOCH, sim_elapsed};
use crate::scenario::{Mode, ServerSpec};

/// What a server reads of a chat-completions request body.
#[derive(Debug, Default)]
pub(super) struct ChatRequest {
    /// `model`, when it is a string.
    model: Option<String>,
    /// `max_tokens` when present, else `max_completion_tokens`, when that
    /// is a whole number.
    pub max_tokens: Option<u64>,
    /// `response_format` as the client wrote it.
    format: Option<Box<RawValue>>,
}

/// The fields of a request body, each kept as whatever JSON it is.
#[derive(Deserialize)]
struct Fields {
    #[serde(default, deserialize_with = "present")]
    model: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    max_tokens: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    max_completion_tokens: Option<Value>,
    #[serde(default)]
    response_format: Option<Box<RawValue>>,
}

/// A field that is present, `null` included.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

impl ChatRequest {
    /// Reads a request body; `None` when it is not JSON.
    pub(super) fn read(body: &[u8]) -> Option<Self> {
        // A derived struct would also read a JSON array, by position.
        let object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
        let fields = match object.then(|| serde_json::from_slice::<Fields>(body).ok()).flatten() {
            Some(fields) => fields,
            // JSON of another shape (not an object, a field twice): read
            // from its value, as a lenient server does.
            None => {
                let value = serde_json::from_slice::<Value>(body).ok()?;
                let field = |name: &str| value.get(name).cloned();
                Fields {
                    model: field("model"),
                    max_tokens: field("max_tokens"),
                    max_completion_tokens: field("max_completion_tokens"),
                    response_format: value
                        .get("response_format")
                        .and_then(|f| serde_json::value::to_raw_value(f).ok()),
                }
            }
        };
        Some(Self {
            model: fields.model.as_ref().and_then(Value::as_str).map(str::to_owned),
            max_tokens: fields
                .max_tokens
                .or(fields.max_completion_tokens)
                .as_ref()
                .and_then(Value::as_u64),
            format: fields.response_format,
        })
    }
}

/// The content of a `normal` answer to the last schema asked for, kept so
/// that a fleet asking the same schema of a server builds it once.
#[derive(Debug, Default)]
pub(super) struct Contents {
    /// The `response_format` text it was built for, and the content.
    last: Mutex<Option<(Box<str>, Arc<str>)>>,
}

impl Contents {
    /// The content (JSON text) satisfying the schema `request` names:
    /// `{}` without one.
    fn for_request(&self, request: &ChatRequest) -> Arc<str> {
        let Some(format) = &request.format else {
            return "{}".into();
        };
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((text, content)) = last.as_ref()
            && **text == *format.get()
        {
            return content.clone();
        }
        let content: Arc<str> = serde_json::from_str::<Value>(format.get())
            .ok()
            .as_ref()
            .and_then(|f| f.pointer("/json_schema/schema"))
            .map_or_else(|| Value::Object(serde_json::Map::new()), content_for_schema)
            .to_string()
            .into();
        *last = Some((format.get().into(), content.clone()));
        content
    }
}

/// The tokens a completion reports, and whether it was cut off.
#[derive(Clone, Copy, Debug)]
pub(super) struct Usage {
    pub prompt: u64,
    /// Of the prompt, the tokens the slot's prompt cache held.
    pub cached: u64,
    pub completion: u64,
    pub truncated: bool,
}

/// A `chat.completion` body, in the order servers write its fields.
#[derive(Serialize)]
struct CompletionBody<'a> {
    id: String,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [Choice<'a>; 1],
    usage: UsageBody,
}

/// The one choice of an answer.
#[derive(Serialize)]
struct Choice<'a> {
    index: u32,
    message: AnswerMessage<'a>,
    finish_reason: &'static str,
}

/// The assistant's message: its content, or a refusal, and any reasoning.
#[derive(Serialize)]
struct AnswerMessage<'a> {
    role: &'static str,
    content: Option<&'a str>,
    refusal: Option<&'static str>,
    reasoning_content: Option<&'static str>,
}

/// The `usage` object: the counts, and how many prompt tokens the prompt
/// cache held when it held any (`prompt_tokens_details.cached_tokens`, as
/// llama.cpp and OpenAI write it).
#[derive(Serialize)]
struct UsageBody {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_tokens_details: Option<CachedTokens>,
}

/// `usage.prompt_tokens_details`.
#[derive(Serialize)]
struct CachedTokens {
    cached_tokens: u64,
}

/// A `chat.completion` answer for `mode` (one of the 200 modes). A `normal`
/// answer cut off (`usage.truncated`) carries the first part of its content
/// — no longer valid JSON — and `finish_reason: "length"`.
pub(super) fn completion(
    spec: &ServerSpec,
    contents: &Contents,
    id: u64,
    mode: Mode,
    request: &ChatRequest,
    usage: Usage,
) -> Response<Full<Bytes>> {
    let whole;
    let cut: String;
    let (content, refusal, reasoning, finish_reason) = match mode {
        Mode::Empty => (
            Some(""),
            None,
            Some("The user wants a JSON object. Let me think about which fields it needs, and then"),
            "length",
        ),
        Mode::Malformed => (
            Some("Sure! Here is the answer you asked for: {\"answer\": \"x\", "),
            None,
            None,
            "stop",
        ),
        Mode::Refuse => (
            None,
            Some("I'm sorry, but I can't help with that request."),
            None,
            "stop",
        ),
        // Only the 200 modes reach here; the others answered (or hung) before.
        Mode::Normal | Mode::RateLimit | Mode::Error | Mode::Loading | Mode::Hang | Mode::Drop => {
            whole = contents.for_request(request);
            if usage.truncated {
                let keep = whole.chars().count() / 2;
                cut = whole.chars().take(keep).collect();
                (Some(cut.as_str()), None, None, "length")
            } else {
                (Some(&*whole), None, None, "stop")
            }
        }
    };
    let created = EPOCH.saturating_add(sim_elapsed()).as_micros() / 1_000_000;
    let body = CompletionBody {
        id: format!("chatcmpl-{}-{id}", spec.name),
        object: "chat.completion",
        created,
        model: request.model.as_deref().unwrap_or(&spec.model),
        choices: [Choice {
            index: 0,
            message: AnswerMessage {
                role: "assistant",
                content,
                refusal,
                reasoning_content: reasoning,
            },
            finish_reason,
        }],
        usage: UsageBody {
            prompt_tokens: usage.prompt,
            completion_tokens: usage.completion,
            total_tokens: usage.prompt.saturating_add(usage.completion),
            prompt_tokens_details: (usage.cached > 0).then_some(CachedTokens {
                cached_tokens: usage.cached,
            }),
        },
    };
    // Strings and whole numbers always serialize.
    let bytes = serde_json::to_vec(&body).unwrap_or_default();
    super::json_bytes_response(StatusCode::OK, bytes)
}

/// A value satisfying a simple JSON schema, built from the schema alone.
///
/// `enum` and `const` give their first value; `anyOf`/`oneOf` follow their
/// first alternative; otherwise the (first non-null) `type` decides: string →
/// `"x"` (repeated to `minLength`), integer → `1`, number → `1.0`, boolean →
/// `true`, null → `null`, array → `minItems` copies of its `items` value
/// (none by default), object → every property in `properties`, recursively.
/// A schema without a type is treated as an object if it has `properties`,
/// and as the empty object otherwise.
pub fn content_for_schema(schema: &Value) -> Value {
    content_at_depth(schema, 0)
}

fn content_at_depth(schema: &Value, depth: u32) -> Value {
    // Deep enough for any schema a test writes; a self-referencing one stops here.
    if depth > 32 {
        return Value::Null;
    }
    if let Some(first) = schema.get("enum").and_then(Value::as_array).and_then(|v| v.first()) {
        return first.clone();
    }
    if let Some(value) = schema.get("const") {
        return value.clone();
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(first) = schema.get(key).and_then(Value::as_array).and_then(|v| v.first()) {
            return content_at_depth(first, depth + 1);
        }
    }
    let kind = match schema.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null"),
        _ if schema.get("properties").is_some() => "object",
        _ => "object",
    };
    let min = |key: &str| {
        schema
            .get(key)
            .and_then(Value::as_u64)
            .map_or(0, |n| usize::try_from(n.min(64)).unwrap_or(0))
    };
    match kind {
        "string" => serde_json::json!("x".repeat(min("minLength").max(1))),
        "integer" => serde_json::json!(1),
        "number" => serde_json::json!(1.0),
        "boolean" => serde_json::json!(true),
        "null" => Value::Null,
        "array" => {
            let item = schema
                .get("items")
                .map_or(Value::Null, |items| content_at_depth(items, depth + 1));
            Value::Array(vec![item; min("minItems")])
        }
        _ => {
            let mut object = serde_json::Map::new();
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                for (name, property) in properties {
                    object.insert(name.clone(), content_at_depth(property, depth + 1));
                }
            }
            Value::Object(object)
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn read(body: &Value) -> ChatRequest {
        ChatRequest::read(body.to_string().as_bytes()).expect("JSON is read")
    }

    #[test]
    fn a_request_is_read_for_its_model_limit_and_schema() {
        let r = read(&json!({"model": "m", "max_tokens": 64, "messages": [],
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "integer"}}}}));
        assert_eq!((r.model.as_deref(), r.max_tokens), (Some("m"), Some(64)));
        assert_eq!(&*Contents::default().for_request(&r), "1");
        let newer = read(&json!({"max_completion_tokens": 9}));
        assert_eq!((newer.model, newer.max_tokens), (None, Some(9)));
    }

    #[test]
    fn odd_json_is_read_leniently_and_only_non_json_is_refused() {
        assert!(ChatRequest::read(b"{\"model\": ").is_none());
        // Not an object: nothing to read, but a request all the same.
        let list = read(&json!([1, 2]));
        assert_eq!((list.model, list.max_tokens, list.format.is_none()), (None, None, true));
        // A field twice: the last one counts, as in a JSON value.
        let twice = ChatRequest::read(br#"{"model": "a", "model": "b", "max_tokens": 3}"#).expect("JSON");
        assert_eq!((twice.model.as_deref(), twice.max_tokens), (Some("b"), Some(3)));
        // A model that is not a string is no model; a max_tokens that is
        // not a whole number is no limit, and max_completion_tokens is not
        // read in its place.
        let odd = read(&json!({"model": 7, "max_tokens": null, "max_completion_tokens": 5}));
        assert_eq!((odd.model, odd.max_tokens), (None, None));
        let negative = read(&json!({"max_tokens": -1}));
        assert_eq!(negative.max_tokens, None);
    }

    #[test]
    fn the_content_follows_the_schema_each_request_names() {
        let contents = Contents::default();
        let asking = |schema: Value| read(&json!({"response_format": {"json_schema": {"schema": schema}}}));
        let integer = asking(json!({"type": "integer"}));
        let boolean = asking(json!({"type": "boolean"}));
        assert_eq!(&*contents.for_request(&integer), "1");
        assert_eq!(&*contents.for_request(&integer), "1");
        assert_eq!(&*contents.for_request(&boolean), "true");
        assert_eq!(&*contents.for_request(&integer), "1");
        assert_eq!(&*contents.for_request(&read(&json!({}))), "{}");
        assert_eq!(&*contents.for_request(&read(&json!({"response_format": "text"}))), "{}");
    }

    #[test]
    fn schema_content_covers_every_type() {
        let schema = json!({
            "type": "object",
            "properties": {
                "s": {"type": "string"},
                "i": {"type": "integer"},
                "n": {"type": "number"},
                "b": {"type": "boolean"},
                "a": {"type": "array", "items": {"type": "string"}},
                "o": {"type": "object", "properties": {"inner": {"type": "integer"}}},
                "e": {"type": "string", "enum": ["good", "bad"]},
                "opt": {"type": ["null", "string"]},
                "m": {"type": "array", "items": {"type": "integer"}, "minItems": 2},
            },
            "required": ["s", "i", "n", "b", "a", "o", "e", "opt", "m"],
            "additionalProperties": false,
        });
        assert_eq!(
            content_for_schema(&schema),
            json!({"s": "x", "i": 1, "n": 1.0, "b": true, "a": [], "o": {"inner": 1},
                   "e": "good", "opt": "x", "m": [1, 1]})
        );
    }

    #[test]
    fn schema_content_of_a_bare_schema_is_an_object() {
        assert_eq!(content_for_schema(&json!({})), json!({}));
        assert_eq!(content_for_schema(&json!({"anyOf": [{"type": "integer"}]})), json!(1));
    }
}
