//! The metrics observer over a hardened provider and a real local HTTP
//! server, scraped as Prometheus text after a scripted outage: each series
//! the docs name, with the values the outage must give.

use std::sync::Arc;
use std::time::Duration;

use redstring::metrics::MetricsObserver;
use redstring::provider::{HardenedProvider, LlmProviderExt, OpenAiCompatible};
use redstring::{CircuitBreaker, Env, ManualClock, RateLimiter, RetryPolicy, SeededRandom, TenantId};
use testkit::http::{Reply, TestServer};

const LOADING: &str = r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#;

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct Person {
    name: String,
}

/// The value of the Prometheus sample whose line starts with `series`
/// (name and labels as rendered), if there is one.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn a_scripted_outage_scrapes_as_the_documented_series() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let server = TestServer::start().await;
            // One success, then the server reloads: two 503s spend the
            // call's one retry and open the breaker (threshold 1: a call that
            // failed is one failure), and the next call is refused unsent.
            server.push(Reply::completion(r#"{"name":"Ann"}"#));
            server.push(Reply::status(503, LOADING));
            server.push(Reply::status(503, LOADING));
            let env = Env::default()
                .with_clock(Arc::new(ManualClock::at_fixed_epoch()))
                .with_rng(Arc::new(SeededRandom::from_seed(7)))
                .with_observer(Arc::new(MetricsObserver::new()));
            let breaker = CircuitBreaker::builder()
                .failure_threshold(1)
                .recovery_timeout(Duration::from_secs(30))
                .key_prefix("kg:circuit:gpu")
                .env(env.clone())
                .build()
                .unwrap();
            let limiter = RateLimiter::builder(100).env(env.clone()).build().unwrap();
            let adapter = OpenAiCompatible::builder(server.base_url(), "qwen3")
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap();
            let provider =
                HardenedProvider::builder(adapter, TenantId::from_u128(1), Arc::new(limiter), Arc::new(breaker))
                    .retry_policy(RetryPolicy::builder().max_retries(1).jitter(0.0).build().unwrap())
                    .env(env)
                    .build();
            let ann = provider.extract::<Person>("Ann.", None).await.unwrap();
            assert_eq!(ann.name, "Ann");
            provider.extract::<Person>("Bob.", None).await.unwrap_err();
            provider.extract::<Person>("Cy.", None).await.unwrap_err();
            assert_eq!(server.count(), 3);
        });
    });
    let text = handle.render();
    let model = r#"gen_ai_provider_name="openai-compatible",gen_ai_request_model="qwen3""#;
    let calls = |outcome: &str| sample(&text, &format!(r#"redstring_calls{{{model},outcome="{outcome}"}}"#));
    assert_eq!(calls("ok"), Some(1.0), "{text}");
    assert_eq!(calls("retry_exhausted"), Some(1.0), "{text}");
    assert_eq!(calls("circuit_open"), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, &format!("redstring_attempts{{{model}}}")),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, &format!("redstring_calls_in_flight{{{model}}}")),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"redstring_retries{operation="extract"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"redstring_refusals{by="breaker",component="kg:circuit:gpu"}"#),
        Some(1.0),
        "{text}"
    );
    // Open: 2.
    assert_eq!(
        sample(&text, r#"redstring_breaker_state{breaker="kg:circuit:gpu"}"#),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"redstring_breaker_transitions{breaker="kg:circuit:gpu",to="open"}"#
        ),
        Some(1.0),
        "{text}"
    );
    // Three calls timed; the failed ones carry their error type.
    let duration = "gen_ai_client_operation_duration_count";
    let ok = sample(&text, &format!(r#"{duration}{{{model},gen_ai_operation_name="chat"}}"#));
    assert_eq!(ok, Some(1.0), "{text}");
    let failed = format!(r#"{duration}{{{model},gen_ai_operation_name="chat",error_type="retry_exhausted"}}"#);
    assert_eq!(sample(&text, &failed), Some(1.0), "{text}");
    // The success's usage: 10 prompt tokens, 5 generated.
    let usage = "gen_ai_client_token_usage_sum";
    let tokens = |kind: &str| {
        sample(
            &text,
            &format!(r#"{usage}{{{model},gen_ai_operation_name="chat",gen_ai_token_type="{kind}"}}"#),
        )
    };
    assert_eq!((tokens("input"), tokens("output")), (Some(10.0), Some(5.0)), "{text}");
}

#[test]
fn a_call_its_caller_drops_is_counted_cancelled_and_not_left_in_flight() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let server = TestServer::start().await;
            server.push(Reply::Hang);
            let env = Env::default().with_clock(Arc::new(ManualClock::at_fixed_epoch()));
            let breaker = CircuitBreaker::builder().env(env.clone()).build().unwrap();
            let limiter = RateLimiter::builder(100).env(env.clone()).build().unwrap();
            let adapter = OpenAiCompatible::builder(server.base_url(), "qwen3").build().unwrap();
            let provider =
                HardenedProvider::builder(adapter, TenantId::from_u128(1), Arc::new(limiter), Arc::new(breaker))
                    .env(env.with_observer(Arc::new(MetricsObserver::new())))
                    .build();
            // The caller gives up on a server that never answers.
            let call = provider.extract::<Person>("Ann.", None);
            tokio::time::timeout(Duration::from_millis(200), call)
                .await
                .unwrap_err();
        });
    });
    let text = handle.render();
    let model = r#"gen_ai_provider_name="openai-compatible",gen_ai_request_model="qwen3""#;
    assert_eq!(
        sample(&text, &format!("redstring_calls_in_flight{{{model}}}")),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, &format!(r#"redstring_calls{{{model},outcome="cancelled"}}"#)),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, &format!("redstring_attempts{{{model}}}")),
        Some(1.0),
        "{text}"
    );
}

#[test]
fn adaptive_concurrency_refusals_and_limit_moves_scrape_as_documented() {
    use redstring::decide::concurrency::{CallEnd, UNIT};
    use redstring::{Event, Observer};
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let breaker: Arc<str> = Arc::from("kg:circuit:gpu");
    let ended = |from: u64, to: u64| Event::ConcurrencyEnded {
        breaker: breaker.clone(),
        tenant: TenantId::from_u128(1),
        id: 1,
        end: CallEnd::Overload,
        counted: true,
        from,
        to,
    };
    metrics::with_local_recorder(&recorder, || {
        let observer = MetricsObserver::new();
        for _ in 0..2 {
            observer.on_event(&Event::ConcurrencyRefused {
                breaker: breaker.clone(),
                tenant: TenantId::from_u128(1),
                priority: redstring::Priority::Low,
                in_flight: 4,
                limit: 4,
            });
        }
        observer.on_event(&ended(4 * UNIT, 3 * UNIT + UNIT / 2));
        // A change within one whole call moves no gauge.
        observer.on_event(&ended(5 * UNIT + UNIT / 5, 5 * UNIT + UNIT * 9 / 10));
    });
    let text = handle.render();
    assert_eq!(
        sample(
            &text,
            r#"redstring_refusals{by="concurrency",component="kg:circuit:gpu"}"#
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"redstring_concurrency_limit{breaker="kg:circuit:gpu"}"#),
        Some(3.0),
        "{text}"
    );
}
