//! `SimTransport` against the simulated model server: statuses, limits,
//! timeouts and the transport error kinds, and the adapter on top of it.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use redstring::provider::{
    ExtractError, HttpRequest, HttpResponse, HttpTransport, LlmProviderExt, OpenAiCompatible, ProviderError,
    TransportError, TransportErrorKind,
};
use redstring_sim::evidence::trace::{Kind, Trace};
use redstring_sim::hosts::clock::sim_elapsed;
use redstring_sim::hosts::server::{ServerHandle, server_host};
use redstring_sim::hosts::transport::SimTransport;
use redstring_sim::scenario::{Behaviour, Mode};
use serde_json::{Value, json};
use turmoil::Builder;

use crate::support::{sim, spec};

fn request(server: &str, body_limit: usize, timeout: Duration) -> HttpRequest {
    let body = json!({
        "model": "qwen3-8b",
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "strict": true,
            "schema": {"type": "object", "properties": {"answer": {"type": "string"}},
                       "required": ["answer"], "additionalProperties": false}}},
    });
    HttpRequest {
        url: format!("http://{server}:8080/v1/chat/completions"),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("authorization".into(), "Bearer not-needed".into()),
        ],
        body: body.to_string().into_bytes(),
        body_limit,
        timeout,
    }
}

type Outcome = (Duration, Result<HttpResponse, TransportError>);

fn kind(outcome: &Outcome) -> Option<TransportErrorKind> {
    match &outcome.1 {
        Err(TransportError::Failed { kind, .. }) => Some(*kind),
        _ => None,
    }
}

/// Sends one request per `(mode, body_limit, timeout)` from a worker, in order.
fn run(modes: &[(Mode, usize, Duration)]) -> (Vec<Outcome>, Trace) {
    let mut sim = sim(9, 120);
    let trace = Trace::new();
    let handle = ServerHandle::default();
    sim.host("gpu", server_host(spec(), handle.clone(), trace.clone(), 1));
    let log: Rc<RefCell<Vec<Outcome>>> = Rc::default();
    let (client_log, client_trace) = (log.clone(), trace.clone());
    let modes = modes.to_vec();
    sim.client("worker", async move {
        let transport = SimTransport::new("worker", client_trace);
        for (mode, limit, timeout) in modes {
            handle.set_behaviour(Behaviour {
                mode,
                probability: 1.0,
                retry_after_s: 2.0,
            });
            let started = sim_elapsed();
            let result = transport.post(request("gpu", limit, timeout)).await;
            client_log.borrow_mut().push((sim_elapsed() - started, result));
        }
        Ok(())
    });
    sim.run().unwrap();
    let log = log.borrow_mut().drain(..).collect();
    (log, trace)
}

const LONG: Duration = Duration::from_secs(10);

#[test]
fn answers_come_back_whatever_their_status() {
    let (log, trace) = run(&[
        (Mode::Normal, 1 << 20, LONG),
        (Mode::RateLimit, 1 << 20, LONG),
        (Mode::Error, 1 << 20, LONG),
    ]);
    let ok = log[0].1.as_ref().unwrap();
    assert_eq!(ok.status, 200);
    let body: Value = serde_json::from_slice(&ok.body).unwrap();
    assert_eq!(body["object"], "chat.completion");
    let content: Value = serde_json::from_str(body["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert_eq!(content, json!({"answer": "x"}));
    assert_eq!(ok.header("content-type"), Some("application/json"));

    let limited = log[1].1.as_ref().unwrap();
    assert_eq!(limited.status, 429);
    assert_eq!(limited.header("retry-after"), Some("2"));
    assert!(limited.headers.iter().all(|(n, _)| n == &n.to_lowercase()));
    assert_eq!(log[2].1.as_ref().unwrap().status, 500);

    let requests: Vec<_> = trace
        .events()
        .into_iter()
        .filter_map(|e| match e.kind {
            Kind::Request { server } => Some((e.host.to_string(), server.to_string())),
            _ => None,
        })
        .collect();
    assert_eq!(requests, vec![("worker".to_owned(), "gpu".to_owned()); 3]);
}

#[test]
fn failures_map_to_transport_error_kinds() {
    let timeout = Duration::from_secs(2);
    let (log, _) = run(&[
        (Mode::Normal, 64, LONG),
        (Mode::Hang, 1 << 20, timeout),
        (Mode::Drop, 1 << 20, LONG),
    ]);
    assert!(
        matches!(log[0].1, Err(TransportError::BodyTooLarge { limit: 64 })),
        "{:?}",
        log[0]
    );
    assert_eq!(kind(&log[1]), Some(TransportErrorKind::Timeout), "{:?}", log[1]);
    assert!(
        log[1].0 >= timeout && log[1].0 <= timeout + Duration::from_millis(10),
        "gave up at the timeout: {:?}",
        log[1].0
    );
    assert_eq!(kind(&log[2]), Some(TransportErrorKind::Reset), "{:?}", log[2]);
}

#[test]
fn a_host_not_listening_refuses_and_a_crashed_one_times_out() {
    let mut sim = sim(9, 60);
    // A machine that is up with nothing on port 8080.
    sim.host("idle", || async { std::future::pending().await });
    sim.host("gpu", server_host(spec(), ServerHandle::default(), Trace::new(), 1));
    let log: Rc<RefCell<Vec<Outcome>>> = Rc::default();
    let client_log = log.clone();
    sim.client("worker", async move {
        let transport = SimTransport::new("worker", Trace::new());
        for server in ["idle", "gpu"] {
            // The gpu host is crashed at 1 s.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let started = sim_elapsed();
            let result = transport.post(request(server, 1 << 20, Duration::from_secs(3))).await;
            client_log.borrow_mut().push((sim_elapsed() - started, result));
        }
        Ok(())
    });
    let mut crashed = false;
    while !sim.step().unwrap() {
        if !crashed && sim.elapsed() >= Duration::from_secs(1) {
            sim.crash("gpu");
            crashed = true;
        }
    }
    let log = log.borrow();
    assert_eq!(kind(&log[0]), Some(TransportErrorKind::Connect), "{:?}", log[0]);
    assert!(log[0].0 < Duration::from_millis(100), "refused at once: {:?}", log[0]);
    // turmoil delivers nothing to a crashed host, so its SYN is never answered.
    assert_eq!(kind(&log[1]), Some(TransportErrorKind::Timeout), "{:?}", log[1]);
}

#[test]
fn a_timed_out_request_is_seen_by_the_server_as_abandoned() {
    let mut sim = sim(9, 60);
    let trace = Trace::new();
    let mut server = spec();
    server.slots = 1;
    let handle = ServerHandle::default();
    sim.host("gpu", server_host(server, handle.clone(), trace.clone(), 1));
    let client_trace = trace.clone();
    sim.client("worker", async move {
        let transport = SimTransport::new("worker", client_trace);
        // 1.7 s of service does not fit in 1 s.
        let result = transport.post(request("gpu", 1 << 20, Duration::from_secs(1))).await;
        assert!(matches!(
            result,
            Err(TransportError::Failed {
                kind: TransportErrorKind::Timeout,
                ..
            })
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(())
    });
    sim.run().unwrap();
    let served: Vec<_> = trace
        .events()
        .into_iter()
        .filter_map(|e| match e.kind {
            Kind::Served { outcome, .. } => Some(outcome.name()),
            _ => None,
        })
        .collect();
    assert_eq!(served, ["abandoned"]);
    assert_eq!(handle.stats().in_flight, 0);
}

/// What a test pipeline extracts.
#[derive(Debug, PartialEq, serde::Deserialize, schemars::JsonSchema)]
struct Review {
    verdict: Verdict,
    score: u32,
    confidence: f64,
    tags: Vec<String>,
    urgent: bool,
    reviewer: Reviewer,
    note: Option<String>,
}

#[derive(Debug, PartialEq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Verdict {
    Approve,
    Reject,
}

#[derive(Debug, PartialEq, serde::Deserialize, schemars::JsonSchema)]
struct Reviewer {
    name: String,
}

#[test]
fn the_openai_adapter_extracts_typed_values_through_the_simulated_network() {
    let mut sim = sim(9, 60);
    let handle = ServerHandle::default();
    sim.host("gpu", server_host(spec(), handle.clone(), Trace::new(), 1));
    let results: Rc<RefCell<Vec<Result<Review, String>>>> = Rc::default();
    let client_results = results.clone();
    sim.client("worker", async move {
        let provider = OpenAiCompatible::builder("http://gpu:8080/v1", "qwen3-8b")
            .timeout(Duration::from_secs(10))
            .build_with(SimTransport::new("worker", Trace::new()))
            .unwrap();
        for mode in [Mode::Normal, Mode::Empty, Mode::Refuse, Mode::Malformed] {
            handle.set_behaviour(Behaviour {
                mode,
                probability: 1.0,
                retry_after_s: 1.0,
            });
            let got = provider.extract::<Review>("Review this change.", None).await;
            let got = got.map_err(|e| match e {
                ExtractError::Provider(ProviderError::Empty { .. }) => "empty".to_owned(),
                ExtractError::Provider(ProviderError::Refused { .. }) => "refused".to_owned(),
                ExtractError::Provider(ProviderError::Malformed { .. }) => "malformed".to_owned(),
                other => other.to_string(),
            });
            client_results.borrow_mut().push(got);
        }
        Ok(())
    });
    sim.run().unwrap();
    let results = results.borrow();
    assert_eq!(
        results[0],
        Ok(Review {
            verdict: Verdict::Approve,
            score: 1,
            confidence: 1.0,
            tags: vec![],
            urgent: true,
            reviewer: Reviewer { name: "x".into() },
            note: Some("x".into()),
        }),
        "the generated content satisfies the adapter's strict schema"
    );
    assert_eq!(
        results[1..],
        [Err("empty".into()), Err("refused".into()), Err("malformed".into())]
    );
}

#[test]
fn a_fleet_over_the_transport_replays_byte_for_byte() {
    fn run(seed: u64) -> String {
        let mut sim = Builder::new()
            .rng_seed(seed)
            .epoch(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
            .tick_duration(Duration::from_millis(10))
            .min_message_latency(Duration::from_millis(1))
            .max_message_latency(Duration::from_millis(20))
            .simulation_duration(Duration::from_secs(120))
            .build();
        let trace = Trace::new();
        let mut server = spec();
        server.slots = 1;
        server.queue = 2;
        server.behaviour = Behaviour {
            mode: Mode::Drop,
            probability: 0.3,
            retry_after_s: 1.0,
        };
        sim.host(
            "gpu",
            server_host(server.clone(), ServerHandle::new(server.behaviour), trace.clone(), seed),
        );
        for w in 0..4 {
            let trace = trace.clone();
            sim.client(format!("worker-{w}"), async move {
                let transport = SimTransport::new(&format!("worker-{w}"), trace);
                for _ in 0..5 {
                    let _ = transport.post(request("gpu", 1 << 20, Duration::from_secs(3))).await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok(())
            });
        }
        sim.run().unwrap();
        Trace::to_json_lines(&trace.events())
    }
    let first = run(21);
    assert_eq!(first, run(21));
    for outcome in ["\"ok\"", "\"drop\"", "\"queue_full\"", "\"request\""] {
        assert!(first.contains(outcome), "{outcome} missing from\n{first}");
    }
    assert_ne!(first, run(22));
}
