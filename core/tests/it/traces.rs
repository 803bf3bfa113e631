//! A hardened call's `tracing` spans, as a capturing subscriber sees them:
//! one span per call with one child per attempt, each with the attributes
//! OpenTelemetry's GenAI conventions name and the `redstring.*` ones the
//! provider documents, over a real local HTTP server.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::Subscriber;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use redstring::provider::{HardenedProvider, LlmProviderExt, OpenAiCompatible};
use redstring::{CircuitBreaker, Env, ManualClock, RateLimiter, RetryPolicy, SeededRandom, TenantId};
use testkit::http::{Reply, TestServer};

const LOADING: &str = r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#;

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct Person {
    #[allow(dead_code)]
    name: String,
}

/// One span as the subscriber saw it.
#[derive(Clone, Debug)]
struct Seen {
    name: &'static str,
    /// The index in the capture of its parent span.
    parent: Option<usize>,
    /// Every field given a value, at creation or later, as text.
    fields: BTreeMap<String, String>,
    /// When it closed, as a position in the capture's order of closes.
    closed: Option<usize>,
}

impl Seen {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

#[derive(Default)]
struct Captured {
    spans: Vec<Seen>,
    /// Live span ids to their index (an id is reused once its span closes).
    live: HashMap<u64, usize>,
    closes: usize,
}

/// A layer that keeps every span it sees, with its parent and its fields.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Captured>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let parent = ctx
            .span(id)
            .and_then(|span| span.parent())
            .map(|parent| parent.id().into_u64());
        let mut captured = self.0.lock().unwrap();
        let parent = parent.and_then(|p| captured.live.get(&p).copied());
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        captured.spans.push(Seen {
            name: attrs.metadata().name(),
            parent,
            fields,
            closed: None,
        });
        let index = captured.spans.len() - 1;
        captured.live.insert(id.into_u64(), index);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut captured = self.0.lock().unwrap();
        if let Some(&index) = captured.live.get(&id.into_u64()) {
            values.record(&mut Fields(&mut captured.spans[index].fields));
        }
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        let mut captured = self.0.lock().unwrap();
        if let Some(index) = captured.live.remove(&id.into_u64()) {
            let order = captured.closes;
            captured.closes += 1;
            captured.spans[index].closed = Some(order);
        }
    }
}

/// The spans named `chat` or `redstring.attempt` that `calls` leaves, each
/// call made on one provider over `replies` (breaker threshold 1, one
/// retry without jitter, a manual clock) and, with `give_up`, dropped by
/// its caller after that much real time.
fn spans_of(replies: Vec<Reply>, calls: usize, give_up: Option<Duration>) -> (Vec<Seen>, String) {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tenant = TenantId::from_u128(42);
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let server = TestServer::start().await;
            for reply in replies {
                server.push(reply);
            }
            let env = Env::default()
                .with_clock(Arc::new(ManualClock::at_fixed_epoch()))
                .with_rng(Arc::new(SeededRandom::from_seed(7)));
            let breaker = CircuitBreaker::builder()
                .failure_threshold(1)
                .recovery_timeout(Duration::from_secs(30))
                .env(env.clone())
                .build()
                .unwrap();
            let limiter = RateLimiter::builder(100).env(env.clone()).build().unwrap();
            let adapter = OpenAiCompatible::builder(server.base_url(), "qwen3")
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap();
            let provider = HardenedProvider::builder(adapter, tenant, Arc::new(limiter), Arc::new(breaker))
                .retry_policy(RetryPolicy::builder().max_retries(1).jitter(0.0).build().unwrap())
                .env(env)
                .build();
            for _ in 0..calls {
                let call = provider.extract::<Person>("Ann.", None);
                match give_up {
                    Some(after) => drop(tokio::time::timeout(after, call).await),
                    None => drop(call.await),
                }
            }
        });
    });
    let captured = capture.0.lock().unwrap();
    let spans = captured
        .spans
        .iter()
        .filter(|s| s.name == "chat" || s.name == "redstring.attempt")
        .cloned()
        .collect();
    (spans, tenant.to_string())
}

#[test]
fn a_retried_call_is_one_call_span_over_two_attempt_spans_with_the_genai_attributes() {
    let (spans, tenant) = spans_of(
        vec![Reply::status(503, LOADING), Reply::answered_by("qwen3-q4", 31)],
        1,
        None,
    );
    let names: Vec<_> = spans.iter().map(|s| s.name).collect();
    assert_eq!(names, ["chat", "redstring.attempt", "redstring.attempt"]);
    let (call, first, second) = (&spans[0], &spans[1], &spans[2]);

    // The call: OpenTelemetry's inference span, covering both attempts.
    assert_eq!(call.parent, None);
    for (field, value) in [
        ("otel.name", "chat qwen3"),
        ("otel.kind", "client"),
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.provider.name", "openai-compatible"),
        ("gen_ai.request.model", "qwen3"),
        ("gen_ai.response.model", "qwen3-q4"),
        ("gen_ai.usage.input_tokens", "15"),
        ("gen_ai.usage.output_tokens", "16"),
        ("redstring.outcome", "ok"),
        ("redstring.attempts", "2"),
        ("redstring.tenant", tenant.as_str()),
    ] {
        assert_eq!(call.field(field), Some(value), "call field {field}");
    }
    assert_eq!(call.field("error.type"), None);
    assert_eq!(call.field("otel.status_code"), None);

    // The attempts: children of the call, one after the other.
    let call_index = Some(0);
    assert_eq!((first.parent, second.parent), (call_index, call_index));
    assert!(first.closed < second.closed && second.closed < call.closed);
    for (attempt, number) in [(first, "1"), (second, "2")] {
        assert_eq!(attempt.field("redstring.attempt"), Some(number));
        assert_eq!(attempt.field("gen_ai.operation.name"), Some("chat"));
        assert_eq!(attempt.field("gen_ai.provider.name"), Some("openai-compatible"));
        assert_eq!(attempt.field("gen_ai.request.model"), Some("qwen3"));
    }
    assert_eq!(first.field("error.type"), Some("unavailable"));
    assert_eq!(first.field("otel.status_code"), Some("error"));
    assert_eq!(first.field("redstring.outcome"), Some("unavailable"));
    assert_eq!(first.field("gen_ai.response.model"), None);
    assert_eq!(second.field("error.type"), None);
    assert_eq!(second.field("redstring.outcome"), Some("ok"));
    assert_eq!(second.field("gen_ai.response.model"), Some("qwen3-q4"));
    assert_eq!(second.field("gen_ai.usage.output_tokens"), Some("16"));
}

#[test]
fn a_call_the_open_circuit_refuses_is_a_failed_call_span_without_attempts() {
    // Two 503s spend the first call's retry and open the circuit; the
    // second call is refused unsent.
    let (spans, _) = spans_of(vec![Reply::status(503, LOADING), Reply::status(503, LOADING)], 2, None);
    let names: Vec<_> = spans.iter().map(|s| s.name).collect();
    assert_eq!(names, ["chat", "redstring.attempt", "redstring.attempt", "chat"]);
    let (failed, refused) = (&spans[0], &spans[3]);
    assert_eq!(failed.field("error.type"), Some("retry_exhausted"));
    assert_eq!(failed.field("otel.status_code"), Some("error"));
    assert_eq!(failed.field("redstring.attempts"), Some("2"));
    assert_eq!(refused.parent, None);
    assert_eq!(refused.field("error.type"), Some("circuit_open"));
    assert_eq!(refused.field("redstring.outcome"), Some("circuit_open"));
    assert_eq!(refused.field("otel.status_code"), Some("error"));
    assert_eq!(refused.field("redstring.attempts"), Some("0"));
    assert_eq!(refused.field("gen_ai.request.model"), Some("qwen3"));
}

#[test]
fn a_call_its_caller_drops_ends_its_span_cancelled() {
    // The server never answers; the caller gives up after 200 ms.
    let (spans, _) = spans_of(vec![Reply::Hang], 1, Some(Duration::from_millis(200)));
    let names: Vec<_> = spans.iter().map(|s| s.name).collect();
    assert_eq!(names, ["chat", "redstring.attempt"]);
    let call = &spans[0];
    assert_eq!(call.field("redstring.outcome"), Some("cancelled"));
    assert_eq!(call.field("error.type"), Some("cancelled"));
    assert_eq!(call.field("otel.status_code"), Some("error"));
    assert_eq!(call.field("redstring.attempts"), Some("1"));
    assert!(call.closed.is_some() && spans[1].closed.is_some());
}
