//! The OpenAI-compatible adapter against a real HTTP server on localhost:
//! what it sends, and how it classifies every kind of answer.

use std::sync::Arc;
use std::time::Duration;

use redstring::Env;
use redstring::provider::{
    ExtractError, LlmProvider, LlmProviderExt, OpenAiCompatible, ProviderError, ReqwestTransport, TransportErrorKind,
};
use serde_json::json;
use testkit::http::{PEG_NATIVE_500, RawServer, Reply, TestServer, refused_base_url};

const KEY: &str = "sk-test-5ecret-key";

#[derive(Debug, PartialEq, serde::Deserialize, schemars::JsonSchema)]
struct Person {
    name: String,
    age: Option<u32>,
}

fn adapter(base_url: &str) -> OpenAiCompatible<ReqwestTransport> {
    OpenAiCompatible::builder(base_url, "qwen3")
        .api_key(KEY)
        .timeout(Duration::from_secs(5))
        .max_tokens(256)
        .build()
        .expect("valid configuration")
}

async fn extract_from(server: &TestServer) -> Result<Person, ExtractError> {
    adapter(&server.base_url()).extract::<Person>("Ann is 30.", None).await
}

fn provider_error(result: Result<Person, ExtractError>) -> ProviderError {
    match result {
        Err(ExtractError::Provider(e)) => {
            let shown = format!("{e} {e:?}");
            assert!(!shown.contains(KEY), "the key leaked: {shown}");
            e
        }
        other => panic!("expected a provider error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_valid_answer_comes_back_typed_and_the_request_is_strict_structured_output() {
    let server = TestServer::start().await;
    server.push(Reply::completion(r#"{"name":"Ann","age":30}"#));
    let system = "  Extract people.\nReturn JSON only.  ";
    let person: Person = adapter(&server.base_url())
        .extract("Ann is 30.", Some(system))
        .await
        .unwrap();
    assert_eq!(
        person,
        Person {
            name: "Ann".into(),
            age: Some(30)
        }
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(r.path, "/v1/chat/completions");
    assert_eq!(r.header("authorization"), Some(format!("Bearer {KEY}").as_str()));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.body["model"], "qwen3");
    assert_eq!(r.body["max_tokens"], 256);
    assert_eq!(
        r.body["messages"],
        json!([
            {"role": "system", "content": system},
            {"role": "user", "content": "Ann is 30."}
        ])
    );
    let format = &r.body["response_format"];
    assert_eq!(format["type"], "json_schema");
    assert_eq!(format["json_schema"]["name"], "Person");
    assert_eq!(format["json_schema"]["strict"], true);
    let schema = &format["json_schema"]["schema"];
    assert_eq!(schema["type"], "object");
    assert_eq!(schema["required"], json!(["name", "age"]));
    assert_eq!(schema["additionalProperties"], false);
    assert_eq!(schema["properties"]["age"]["type"], json!(["integer", "null"]));
}

#[tokio::test]
async fn no_system_prompt_sends_only_the_user_message() {
    let server = TestServer::start().await;
    server.push(Reply::completion(r#"{"name":"Ann","age":null}"#));
    let person = extract_from(&server).await.unwrap();
    assert_eq!(person.age, None);
    assert_eq!(
        server.requests()[0].body["messages"],
        json!([{"role": "user", "content": "Ann is 30."}])
    );
}

#[tokio::test]
async fn blank_text_is_a_caller_error_and_makes_no_request() {
    let server = TestServer::start().await;
    let provider = adapter(&server.base_url());
    for text in ["", "   ", "\n\t"] {
        let e = provider.extract::<Person>(text, Some("prompt")).await;
        assert!(matches!(provider_error(e), ProviderError::BlankText));
    }
    assert_eq!(server.count(), 0);
}

#[tokio::test]
async fn works_behind_a_trait_object_and_reports_provenance() {
    let server = TestServer::start().await;
    server.push(Reply::completion(r#"{"name":"Bo","age":4}"#));
    let provider: Arc<dyn LlmProvider> = Arc::new(adapter(&server.base_url()));
    assert_eq!(provider.model(), "openai-compatible/qwen3");
    // The typed call's future is Send, so it can run on another task.
    let task = tokio::spawn(async move { provider.extract::<Person>("Bo is 4.", None).await });
    let person = task.await.unwrap().unwrap();
    assert_eq!(person.name, "Bo");
}

#[tokio::test]
async fn content_that_does_not_validate_is_malformed_with_the_serde_error() {
    let server = TestServer::start().await;
    server.push(Reply::completion(r#"{"name":"Ann","age":"thirty"}"#));
    match provider_error(extract_from(&server).await) {
        e @ ProviderError::Malformed { .. } => {
            let ProviderError::Malformed { schema, .. } = &e else {
                unreachable!()
            };
            assert_eq!(schema, "Person");
            let source = std::error::Error::source(&e)
                .map(ToString::to_string)
                .unwrap_or_default();
            assert!(source.contains("invalid type"), "{source}");
        }
        other => panic!("{other:?}"),
    }
    server.push(Reply::completion("Sure! Here is the JSON you asked for"));
    assert!(matches!(
        provider_error(extract_from(&server).await),
        ProviderError::Malformed { .. }
    ));
}

#[tokio::test]
async fn empty_content_carries_finish_reason_and_notes_reasoning() {
    let server = TestServer::start().await;
    server.push(Reply::completion_message(
        json!({"role": "assistant", "content": null, "reasoning_content": "Let me think about Ann..."}),
        "length",
    ));
    match provider_error(extract_from(&server).await) {
        ProviderError::Empty {
            finish_reason,
            reasoning,
        } => {
            assert_eq!(finish_reason.as_deref(), Some("length"));
            assert!(reasoning);
        }
        other => panic!("{other:?}"),
    }
    server.push(Reply::completion_message(
        json!({"role": "assistant", "content": "", "reasoning": "hmm"}),
        "stop",
    ));
    assert!(matches!(
        provider_error(extract_from(&server).await),
        ProviderError::Empty { reasoning: true, .. }
    ));
}

#[tokio::test]
async fn refusals_are_refused() {
    let server = TestServer::start().await;
    server.push(Reply::completion_message(
        json!({"role": "assistant", "content": null, "refusal": "I can't help with that."}),
        "stop",
    ));
    server.push(Reply::completion_message(
        json!({"role": "assistant", "content": ""}),
        "content_filter",
    ));
    for expected in ["I can't help with that.", "content_filter"] {
        match provider_error(extract_from(&server).await) {
            ProviderError::Refused { reason } => assert_eq!(reason, expected),
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn http_failures_classify_per_the_wire_table() {
    let server = TestServer::start().await;
    server
        .push(
            Reply::status(
                429,
                r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
            )
            .header("retry-after-ms", "1500")
            .header("retry-after", "2"),
        )
        .push(Reply::status(429, "{}").header("Retry-After", "7"))
        .push(Reply::status(
            429,
            r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
        ))
        .push(Reply::status(
            503,
            r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#,
        ))
        .push(Reply::status(500, r#"{"src":"llama-swap","error":{"message":"unspecific error: exited"}}"#))
        .push(Reply::status(502, "<html>Bad Gateway</html>"))
        .push(Reply::status(
            401,
            format!(r#"{{"error":{{"message":"Incorrect API key provided: {KEY}","code":"invalid_api_key"}}}}"#),
        ))
        .push(Reply::status(403, r#"{"error":"forbidden"}"#))
        .push(Reply::status(404, r#"{"error":{"message":"The model `qwen3` does not exist.","type":"NotFoundError"}}"#))
        .push(Reply::status(
            400,
            r#"{"error":{"code":400,"message":"request exceeds the available context size","type":"exceed_context_size_error","n_prompt_tokens":9000,"n_ctx":8192}}"#,
        ));

    let e = provider_error(extract_from(&server).await);
    assert!(
        matches!(&e, ProviderError::RateLimited { retry_after: Some(d), message }
        if *d == Duration::from_millis(1500) && message == "Rate limit reached"),
        "{e:?}"
    );
    assert!(e.is_transient());
    let e = provider_error(extract_from(&server).await);
    assert_eq!(e.retry_after(), Some(Duration::from_secs(7)), "{e:?}");
    let e = provider_error(extract_from(&server).await);
    assert!(
        matches!(e, ProviderError::QuotaExhausted { .. }) && !e.is_transient(),
        "{e:?}"
    );
    let e = provider_error(extract_from(&server).await);
    assert!(matches!(&e, ProviderError::Unavailable { message, .. } if message == "Loading model") && e.is_transient());
    let e = provider_error(extract_from(&server).await);
    assert!(
        matches!(e, ProviderError::Server { status: 500, .. }) && e.is_transient(),
        "{e:?}"
    );
    let e = provider_error(extract_from(&server).await);
    assert!(
        matches!(e, ProviderError::Server { status: 502, .. }) && e.is_transient(),
        "{e:?}"
    );
    let e = provider_error(extract_from(&server).await);
    assert!(
        matches!(e, ProviderError::Authentication { status: 401, .. }) && !e.is_transient(),
        "{e:?}"
    );
    let e = provider_error(extract_from(&server).await);
    assert!(matches!(e, ProviderError::Authentication { status: 403, .. }), "{e:?}");
    let e = provider_error(extract_from(&server).await);
    assert!(matches!(&e, ProviderError::UnknownModel { model, .. } if model == "qwen3") && !e.is_transient());
    assert!(e.to_string().contains("`qwen3`"), "{e}");
    let e = provider_error(extract_from(&server).await);
    assert!(
        matches!(e, ProviderError::BadRequest { status: 400, .. }) && !e.is_transient(),
        "{e:?}"
    );
    assert_eq!(server.count(), 10);
}

#[tokio::test]
async fn connection_refused_is_a_transient_connect_error() {
    let base = refused_base_url().await;
    let e = provider_error(adapter(&base).extract::<Person>("Ann", None).await);
    assert!(
        matches!(
            e,
            ProviderError::Transport {
                kind: TransportErrorKind::Connect,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.is_transient());
}

#[tokio::test]
async fn a_dropped_connection_is_a_transient_reset() {
    let server = TestServer::start().await;
    server.push(Reply::Drop);
    let e = provider_error(extract_from(&server).await);
    assert!(
        matches!(
            e,
            ProviderError::Transport {
                kind: TransportErrorKind::Reset,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.is_transient());
}

#[tokio::test]
async fn a_hung_server_is_a_transient_timeout() {
    let server = TestServer::start().await;
    server.push(Reply::Hang);
    let provider = OpenAiCompatible::builder(server.base_url(), "qwen3")
        .api_key(KEY)
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let e = provider_error(provider.extract::<Person>("Ann", None).await);
    assert!(
        matches!(
            e,
            ProviderError::Transport {
                kind: TransportErrorKind::Timeout,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.is_transient());
}

#[tokio::test]
async fn a_body_over_the_limit_is_an_error_not_an_allocation() {
    let server = TestServer::start().await;
    let padding = "x".repeat(4096);
    server.push(Reply::completion(&format!(r#"{{"name":"{padding}","age":1}}"#)));
    let provider = OpenAiCompatible::builder(server.base_url(), "qwen3")
        .max_response_bytes(1024)
        .build()
        .unwrap();
    match provider.extract::<Person>("Ann", None).await {
        Err(ExtractError::Provider(ProviderError::ResponseTooLarge { limit })) => assert_eq!(limit, 1024),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_streamed_body_over_the_limit_is_cut_off_while_reading() {
    let server = TestServer::start().await;
    // 64 KiB a chunk, 16 MiB in all, with no content-length to refuse up front.
    server.push(Reply::Chunked {
        chunk: vec![b' '; 64 * 1024],
        count: 256,
    });
    let provider = OpenAiCompatible::builder(server.base_url(), "qwen3")
        .max_response_bytes(256 * 1024)
        .build()
        .unwrap();
    match provider.extract::<Person>("Ann", None).await {
        Err(ExtractError::Provider(ProviderError::ResponseTooLarge { limit })) => assert_eq!(limit, 256 * 1024),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_body_within_the_limit_is_read_in_full() {
    let server = TestServer::start().await;
    let json = r#"{"choices":[{"message":{"content":"{\"name\":\"Di\",\"age\":null}"},"finish_reason":"stop"}]}"#;
    server.push(Reply::Chunked {
        chunk: json.as_bytes().to_vec(),
        count: 1,
    });
    let provider = OpenAiCompatible::builder(server.base_url(), "qwen3")
        .max_response_bytes(json.len())
        .build()
        .unwrap();
    assert_eq!(provider.extract::<Person>("Di", None).await.unwrap().name, "Di");
}

#[tokio::test]
async fn unknown_response_fields_are_ignored() {
    let server = TestServer::start().await;
    server.push(Reply::status(
        200,
        json!({
            "choices": [{
                "message": {"role": "assistant", "content": r#"{"name":"Cy","age":2}"#, "tool_calls": [], "annotations": []},
                "finish_reason": "stop",
                "stop_reason": null,
                "future_field": {"nested": true}
            }],
            "timings": {"predicted_ms": 12.5},
            "service_tier": "default"
        })
        .to_string(),
    ));
    assert_eq!(extract_from(&server).await.unwrap().name, "Cy");
}

#[tokio::test]
async fn the_key_never_appears_in_debug_output() {
    let provider = adapter("http://127.0.0.1:9/v1");
    let shown = format!("{provider:?}");
    assert!(!shown.contains(KEY), "{shown}");
}

#[tokio::test]
async fn a_retry_after_date_past_any_calendar_is_ignored_not_an_overflow() {
    let server = TestServer::start().await;
    server.push(
        Reply::status(429, r#"{"error":{"message":"slow down"}}"#)
            .header("retry-after", "Sun, 06 Nov 9223372036854775807 08:49:37 GMT"),
    );
    let e = provider_error(extract_from(&server).await);
    assert!(
        matches!(e, ProviderError::RateLimited { retry_after: None, .. }),
        "{e:?}"
    );
}

#[tokio::test]
async fn llama_cpp_rejecting_its_own_output_is_an_answer_and_a_plain_500_is_not() {
    let server = TestServer::start().await;
    server.push(Reply::status(500, PEG_NATIVE_500)).push(Reply::status(
        500,
        r#"{"error":{"code":500,"message":"internal server error","type":"server_error"}}"#,
    ));
    let e = provider_error(extract_from(&server).await);
    assert_eq!(e.kind(), "unusable_output", "{e}");
    assert!(!e.is_transient() && e.server_answered(), "{e}");
    assert!(e.to_string().contains("peg-native"), "{e}");
    let e = provider_error(extract_from(&server).await);
    assert!(
        matches!(e, ProviderError::Server { status: 500, .. }) && e.is_transient(),
        "{e:?}"
    );
}

#[tokio::test]
async fn the_llama_server_routers_400_for_an_unknown_model_is_an_unknown_model() {
    let server = TestServer::start().await;
    server.push(Reply::status(
        400,
        r#"{"error":{"code":400,"message":"model 'qwen3' not found","type":"invalid_request_error"}}"#,
    ));
    let e = provider_error(extract_from(&server).await);
    assert!(
        matches!(&e, ProviderError::UnknownModel { model, .. } if model == "qwen3"),
        "{e:?}"
    );
    assert!(!e.is_transient());
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_ends_the_call() {
    let server = TestServer::start().await;
    server.otherwise(Reply::status(307, "").header("location", "/v1/chat/completions"));
    let e = provider_error(extract_from(&server).await);
    assert_eq!(e.kind(), "redirected", "{e}");
    assert!(!e.is_transient());
    assert!(e.to_string().contains("/v1/chat/completions"), "{e}");
    assert_eq!(server.count(), 1, "a POST is never re-sent to where a redirect points");
}

#[tokio::test]
async fn a_reply_that_is_not_http_is_a_permanent_protocol_error() {
    let server = RawServer::start(b"SSH-2.0-OpenSSH_9.6\r\n").await;
    let e = provider_error(adapter(&server.base_url()).extract::<Person>("Ann", None).await);
    assert_eq!(e.kind(), "transport_protocol", "{e}");
    assert!(!e.is_transient(), "{e}");
}

#[tokio::test]
async fn answers_that_went_wrong_in_a_known_way_say_how() {
    let server = TestServer::start().await;
    server
        .push(Reply::completion_message(
            json!({"role": "assistant", "content": "{\"name\":\"Ann\",\"ag"}),
            "length",
        ))
        .push(Reply::completion("```json\n{\"name\":\"Ann\",\"age\":30}\n```"))
        .push(Reply::completion_message(
            json!({"role": "assistant", "content": 42}),
            "stop",
        ));
    let e = provider_error(extract_from(&server).await);
    assert_eq!(e.kind(), "truncated");
    assert!(e.to_string().contains("max_tokens"), "{e}");
    let e = provider_error(extract_from(&server).await);
    assert_eq!(e.kind(), "structured_output_ignored");
    assert!(e.to_string().contains("strict"), "{e}");
    let e = provider_error(extract_from(&server).await);
    assert_eq!(e.kind(), "invalid_response");
    assert!(e.to_string().contains("42"), "{e}");
}

#[tokio::test]
async fn provenance_is_the_model_that_answered_and_a_stranger_is_reported() {
    let server = TestServer::start().await;
    let answer = |model: &str| {
        let body = json!({
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": r#"{"name":"Ann","age":30}"#}, "finish_reason": "stop"}],
        });
        Reply::status(200, body.to_string())
    };
    server
        .push(answer("tiny"))
        .push(answer("qwen3"))
        .push(answer("qwen3-2025-04-29"))
        .push(Reply::completion_message(
            json!({"content": r#"{"name":"Ann","age":30}"#}),
            "stop",
        ));
    let observer = Arc::new(redstring::RecordingObserver::new());
    let provider = OpenAiCompatible::builder(server.base_url(), "qwen3")
        .env(Env::default().with_observer(observer.clone()))
        .build()
        .unwrap();

    let tiny = provider.extract_with_model::<Person>("Ann is 30.", None).await.unwrap();
    assert_eq!(tiny.model, "openai-compatible/tiny");
    assert_eq!(tiny.value.name, "Ann");
    assert_eq!(
        observer.take(),
        [redstring::Event::ServedModelDiffers {
            requested: Arc::from("openai-compatible/qwen3"),
            served: Arc::from("openai-compatible/tiny"),
        }]
    );
    assert_eq!(
        provider.model(),
        "openai-compatible/qwen3",
        "the configured identity is unchanged"
    );

    let same = provider.extract_with_model::<Person>("Ann is 30.", None).await.unwrap();
    assert_eq!(same.model, "openai-compatible/qwen3");
    let snapshot = provider.extract_with_model::<Person>("Ann is 30.", None).await.unwrap();
    assert_eq!(snapshot.model, "openai-compatible/qwen3-2025-04-29");
    assert!(
        observer.take().is_empty(),
        "the same model, or a dated snapshot of it, is no news"
    );

    // `extract_value` and `extract` keep working on top of it.
    let _: Person = provider.extract("Ann is 30.", None).await.unwrap();
}
