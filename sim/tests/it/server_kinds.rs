//! The server kinds, each against the behaviour it claims: llama.cpp's
//! loading 503 and context 400, llama-swap's hold while loading and its 429,
//! vLLM's batching, preemption and refused connections while it loads,
//! Ollama's load on demand and its full queue, and a hosted endpoint's quota
//! buckets and headers. Driven over turmoil TCP with a plain hyper client.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use redstring_sim::evidence::outcome::Answer;
use redstring_sim::evidence::trace::{Kind, Trace};
use redstring_sim::hosts::server::{ServerHandle, server_host};
use redstring_sim::scenario::{Behaviour, Cpu, Quota, ServerKind, ServerSpec, Spread};
use serde_json::{Value, json};

use crate::support::sim;

/// What a client saw.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Answer {
        status: u16,
        headers: BTreeMap<String, String>,
        body: Value,
        /// Simulated time the answer arrived.
        at: Duration,
    },
    Failed(String),
    TimedOut,
}

impl Seen {
    fn status(&self) -> Option<u16> {
        match self {
            Seen::Answer { status, .. } => Some(*status),
            _ => None,
        }
    }

    fn body(&self) -> &Value {
        match self {
            Seen::Answer { body, .. } => body,
            _ => &Value::Null,
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        match self {
            Seen::Answer { headers, .. } => headers.get(name).map(String::as_str),
            _ => None,
        }
    }

    fn at(&self) -> Duration {
        match self {
            Seen::Answer { at, .. } => *at,
            _ => Duration::MAX,
        }
    }
}

fn chat_request(max_tokens: u64) -> Value {
    json!({
        "model": "qwen3-8b",
        "messages": [{"role": "user", "content": "Name the person."}],
        "max_tokens": max_tokens,
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "strict": true, "schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
            "additionalProperties": false,
        }}},
    })
}

/// One request with `max_tokens` on a fresh connection, bounded by `timeout`.
async fn post(max_tokens: u64, timeout: Duration) -> Seen {
    let exchange = async {
        let stream = turmoil::net::TcpStream::connect(("gpu", 8080))
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        let request = Request::post("/v1/chat/completions")
            .header("host", "gpu")
            .header("authorization", "Bearer sk-test")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(chat_request(max_tokens).to_string())))
            .map_err(|e| e.to_string())?;
        let send = async {
            let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let headers = response
                .headers()
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
                .collect();
            let body = response.into_body().collect().await.map_err(|e| e.to_string())?;
            let body = serde_json::from_slice(&body.to_bytes()).map_err(|e| e.to_string())?;
            Ok::<_, String>(Seen::Answer {
                status,
                headers,
                body,
                at: turmoil::sim_elapsed().unwrap(),
            })
        };
        tokio::pin!(conn);
        tokio::select! {
            seen = send => seen,
            done = &mut conn => Err(format!("connection ended: {done:?}")),
        }
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(seen)) => seen,
        Ok(Err(e)) => Seen::Failed(e),
        Err(_) => Seen::TimedOut,
    }
}

/// When the server recorded each request it answered `outcome`.
fn served_at(trace: &Trace, outcome: Answer) -> Vec<Duration> {
    trace
        .events()
        .iter()
        .filter(|e| matches!(e.kind, Kind::Served { outcome: o, .. } if o == outcome))
        .map(|e| Duration::from_micros(e.t_us))
        .collect()
}

fn served(trace: &Trace) -> Vec<String> {
    trace
        .events()
        .into_iter()
        .filter_map(|e| match e.kind {
            Kind::Served { outcome, .. } => Some(outcome.name().to_owned()),
            _ => None,
        })
        .collect()
}

fn spec(kind: ServerKind) -> ServerSpec {
    ServerSpec {
        kind,
        reload_s: 0.0,
        step_sigma: Some(0.0),
        ..ServerSpec::named("gpu")
    }
}

type Log = Rc<RefCell<Vec<(usize, Seen)>>>;

/// Runs `clients` clients against a server of `spec`; client `i` waits
/// `start(i)` and then sends one request with `max_tokens`, giving up after
/// `timeout`. Returns what each saw, in client order, and the trace.
fn run(
    spec: ServerSpec,
    clients: usize,
    start: impl Fn(usize) -> Duration,
    max_tokens: u64,
    timeout: Duration,
    secs: u64,
) -> (Vec<Seen>, Trace, ServerHandle) {
    let mut sim = sim(1, secs);
    let trace = Trace::new();
    let handle = ServerHandle::new(spec.behaviour);
    sim.host("gpu", server_host(spec, handle.clone(), trace.clone(), 7));
    let schedule = (0..clients).map(|i| (start(i), timeout)).collect();
    (send_all(sim, schedule, max_tokens), trace, handle)
}

/// Client `i` of `schedule` waits its `.0`, sends one request with
/// `max_tokens` to the server `sim` hosts and gives up after its `.1`.
/// Runs `sim`; returns what each saw, in client order.
fn send_all(mut sim: turmoil::Sim<'_>, schedule: Vec<(Duration, Duration)>, max_tokens: u64) -> Vec<Seen> {
    let log: Log = Rc::default();
    for (i, (wait, timeout)) in schedule.into_iter().enumerate() {
        let log = log.clone();
        sim.client(format!("client-{i}"), async move {
            tokio::time::sleep(wait).await;
            let seen = post(max_tokens, timeout).await;
            log.borrow_mut().push((i, seen));
            Ok(())
        });
    }
    sim.run().unwrap();
    let mut log = log.borrow().clone();
    log.sort_by_key(|(i, _)| *i);
    log.into_iter().map(|(_, s)| s).collect()
}

#[test]
fn vllm_latency_grows_with_the_batch() {
    let latency = |batch: usize| {
        let server = ServerSpec {
            kv_tokens: Some(20_000),
            ..spec(ServerKind::Vllm)
        };
        let (seen, _, _) = run(server, batch, |_| Duration::ZERO, 256, Duration::from_secs(60), 120);
        assert!(seen.iter().all(|s| s.status() == Some(200)), "{seen:?}");
        seen.iter().map(Seen::at).max().unwrap()
    };
    let (one, sixteen) = (latency(1), latency(16));
    // 400 prompt + 60 output: one alone is a prefill and 60 decode steps at
    // u ≈ 0.02 — about 0.4 s; sixteen share their steps at u ≈ 0.35 and
    // prefill 6400 tokens first.
    assert!(
        one > Duration::from_millis(350) && one < Duration::from_millis(500),
        "{one:?}"
    );
    assert!(sixteen > one + Duration::from_millis(400), "{one:?} vs {sixteen:?}");
    assert!(sixteen < one * 16, "batched, not one at a time: {sixteen:?}");
}

#[test]
fn vllm_preempts_when_its_cache_is_full_and_still_answers() {
    // Two sequences of 400 + 60 tokens need up to 920 KV tokens; 880 fit
    // both prompts but not both outputs.
    let server = ServerSpec {
        kv_tokens: Some(880),
        ..spec(ServerKind::Vllm)
    };
    let mut sim = sim(1, 60);
    let trace = Trace::new();
    let handle = ServerHandle::default();
    sim.host("gpu", server_host(server, handle.clone(), trace.clone(), 7));
    let log: Log = Rc::default();
    for i in 0..2 {
        let log = log.clone();
        sim.client(format!("client-{i}"), async move {
            tokio::time::sleep(Duration::from_millis(10 * i as u64)).await;
            let seen = post(256, Duration::from_secs(60)).await;
            log.borrow_mut().push((i, seen));
            Ok(())
        });
    }
    let mut preempted = 0;
    while !sim.step().unwrap() {
        preempted = preempted.max(handle.stats().preemptions);
    }
    assert!(preempted >= 1, "the later sequence was preempted");
    let log = log.borrow();
    assert!(log.iter().all(|(_, s)| s.status() == Some(200)), "{log:?}");
    let first = log.iter().find(|(i, _)| *i == 0).unwrap().1.at();
    let second = log.iter().find(|(i, _)| *i == 1).unwrap().1.at();
    assert!(
        second > first,
        "the preempted one is recomputed after: {first:?} {second:?}"
    );
    assert_eq!(served(&trace), ["ok", "ok"]);
}

#[test]
fn vllm_refuses_connections_until_loaded() {
    let server = ServerSpec {
        cold_start: true,
        reload_s: 5.0,
        ..spec(ServerKind::Vllm)
    };
    let (seen, trace, _) = run(
        server,
        2,
        |i| Duration::from_secs(if i == 0 { 1 } else { 6 }),
        256,
        Duration::from_secs(10),
        30,
    );
    assert!(matches!(&seen[0], Seen::Failed(_)), "{seen:?}");
    assert_eq!(seen[1].status(), Some(200), "{seen:?}");
    assert_eq!(served(&trace), ["ok"], "a refused connection never reaches the server");
}

#[test]
fn llama_cpp_answers_loading_while_it_loads_and_rejects_a_prompt_over_its_context_after_queueing() {
    let server = ServerSpec {
        cold_start: true,
        reload_s: 2.0,
        ..spec(ServerKind::LlamaCpp)
    };
    let (seen, _, _) = run(
        server,
        2,
        |i| Duration::from_secs(i as u64 * 3),
        256,
        Duration::from_secs(10),
        30,
    );
    assert_eq!(seen[0].status(), Some(503));
    assert_eq!(
        seen[0].body(),
        &json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
    );
    assert_eq!(seen[1].status(), Some(200));

    // One slot, a context of 300: the 400-token prompt waits for the slot,
    // then gets the 400.
    let server = ServerSpec {
        slots: 1,
        context_tokens: Some(300),
        prompt_tokens_dist: Some(Spread::Fixed { value: 400.0 }),
        ..spec(ServerKind::LlamaCpp)
    };
    let (seen, trace, _) = run(server, 1, |_| Duration::ZERO, 256, Duration::from_secs(10), 30);
    assert_eq!(seen[0].status(), Some(400), "{seen:?}");
    assert_eq!(seen[0].body()["error"]["type"], "exceed_context_size_error");
    assert_eq!(seen[0].body()["error"]["n_prompt_tokens"], 400);
    assert_eq!(seen[0].body()["error"]["n_ctx"], 300);
    assert_eq!(
        seen[0].body()["error"]["message"],
        "request (400 tokens) exceeds the available context size (300 tokens), try increasing it"
    );
    assert_eq!(served(&trace), ["context_exceeded"]);
}

#[test]
fn output_stops_at_max_tokens_with_finish_reason_length() {
    let server = ServerSpec {
        output_tokens: 80,
        ..spec(ServerKind::LlamaCpp)
    };
    let (seen, trace, _) = run(server.clone(), 1, |_| Duration::ZERO, 32, Duration::from_secs(10), 30);
    let choice = &seen[0].body()["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    let content = choice["message"]["content"].as_str().unwrap();
    assert!(serde_json::from_str::<Value>(content).is_err(), "cut off: {content}");
    assert_eq!(seen[0].body()["usage"]["completion_tokens"], 32);
    assert_eq!(served(&trace), ["truncated"]);

    let (seen, trace, _) = run(server, 1, |_| Duration::ZERO, 256, Duration::from_secs(10), 30);
    assert_eq!(seen[0].body()["choices"][0]["finish_reason"], "stop");
    assert_eq!(seen[0].body()["usage"]["completion_tokens"], 80);
    assert_eq!(served(&trace), ["ok"]);
}

#[test]
fn llama_swap_holds_a_request_while_the_upstream_loads_and_answers_after() {
    let server = ServerSpec {
        cold_start: true,
        reload_s: 6.6,
        ..spec(ServerKind::LlamaSwap)
    };
    let (seen, trace, _) = run(
        server,
        3,
        |i| Duration::from_secs(1 + i as u64),
        256,
        Duration::from_secs(30),
        60,
    );
    // The load starts with the first request at 1 s; health polls at 1.25 s
    // and then every second: healthy at the poll 7.25 s after the start.
    for s in &seen {
        assert_eq!(s.status(), Some(200), "held, not refused: {seen:?}");
        assert!(s.at() >= Duration::from_millis(8250), "{seen:?}");
        assert!(s.at() < Duration::from_millis(9500), "{seen:?}");
    }
    assert_eq!(served(&trace), ["ok", "ok", "ok"]);
}

#[test]
fn llama_swap_times_out_a_load_with_500_for_every_waiter_and_the_next_request_loads_again() {
    let server = ServerSpec {
        cold_start: true,
        reload: Some(Spread::Fixed { value: 20.0 }),
        health_check_timeout_s: Some(15.0),
        ..spec(ServerKind::LlamaSwap)
    };
    let (seen, trace, _) = run(
        server,
        3,
        |i| Duration::from_secs([0, 1, 30][i]),
        256,
        Duration::from_secs(60),
        120,
    );
    for s in &seen[..2] {
        assert_eq!(s.status(), Some(500), "{seen:?}");
        assert_eq!(
            s.body(),
            &json!({"src": "llama-swap", "error": "unspecific error: health check timed out after 15s"})
        );
        assert_eq!(
            s.at().as_secs(),
            16,
            "first poll after 15 s past the deadline: {seen:?}"
        );
    }
    assert_eq!(seen[2].status(), Some(500), "a new load, as slow: {seen:?}");
    assert_eq!(served(&trace), ["load_failed", "load_failed", "load_failed"]);
}

#[test]
fn llama_swap_answers_429_past_its_concurrency_limit_waiting_requests_included() {
    let server = ServerSpec {
        cold_start: true,
        reload_s: 3.0,
        concurrency_limit: Some(2),
        ..spec(ServerKind::LlamaSwap)
    };
    let (seen, trace, _) = run(
        server,
        3,
        |i| Duration::from_millis(100 * i as u64),
        256,
        Duration::from_secs(30),
        60,
    );
    assert_eq!(seen[0].status(), Some(200));
    assert_eq!(seen[1].status(), Some(200));
    assert_eq!(seen[2].status(), Some(429), "{seen:?}");
    assert_eq!(seen[2].header("retry-after"), Some("1"));
    assert_eq!(seen[2].body(), &json!({"error": "Too many requests"}));
    assert_eq!(served(&trace), ["throttled", "ok", "ok"]);
}

#[test]
fn ollama_loads_on_demand_and_answers_503_when_its_queue_is_full() {
    let server = ServerSpec {
        cold_start: true,
        reload_s: 4.0,
        max_queue: Some(2),
        ..spec(ServerKind::Ollama)
    };
    let (seen, trace, _) = run(
        server,
        3,
        |i| Duration::from_millis(100 * i as u64),
        256,
        Duration::from_secs(60),
        60,
    );
    assert_eq!(seen[0].status(), Some(200));
    assert!(
        seen[0].at() >= Duration::from_secs(4),
        "it waited for the load: {seen:?}"
    );
    assert_eq!(seen[1].status(), Some(200));
    assert_eq!(seen[2].status(), Some(503), "{seen:?}");
    assert_eq!(
        seen[2].body()["error"]["message"],
        "server busy, please try again.  maximum pending requests exceeded"
    );
    assert_eq!(served(&trace)[0], "queue_full");

    // Loaded, idle past its keep-alive: the next request loads it again.
    let server = ServerSpec {
        reload_s: 4.0,
        keep_alive_s: Some(10.0),
        ..spec(ServerKind::Ollama)
    };
    let (seen, _, _) = run(
        server,
        2,
        |i| Duration::from_secs([0, 20][i]),
        256,
        Duration::from_secs(60),
        60,
    );
    assert!(seen[0].at() < Duration::from_secs(2), "loaded at the start: {seen:?}");
    assert!(
        seen[1].at() >= Duration::from_secs(24),
        "unloaded after 10 s idle: {seen:?}"
    );
}

#[test]
fn openai_quota_answers_429_whose_headers_match_the_bucket() {
    let server = ServerSpec {
        quota: Some(Quota {
            rpm: 3,
            tpm: 100_000,
            credit_tokens: None,
            rpd: None,
        }),
        ..spec(ServerKind::OpenAi)
    };
    let (seen, trace, _) = run(
        server,
        4,
        |i| Duration::from_millis(100 * i as u64),
        256,
        Duration::from_secs(30),
        60,
    );
    for (i, s) in seen[..3].iter().enumerate() {
        assert_eq!(s.status(), Some(200), "{seen:?}");
        assert_eq!(s.header("x-ratelimit-limit-requests"), Some("3"));
        assert_eq!(
            s.header("x-ratelimit-remaining-requests"),
            Some(["2", "1", "0"][i]),
            "{s:?}"
        );
    }
    let limited = &seen[3];
    assert_eq!(limited.status(), Some(429));
    assert_eq!(limited.body()["error"]["code"], "rate_limit_exceeded");
    assert_eq!(limited.body()["error"]["type"], "requests");
    assert_eq!(limited.header("x-ratelimit-remaining-requests"), Some("0"));
    // 3 per minute refills one every 20 s; three were taken 0.0–0.2 s and the
    // fourth asks at 0.3 s: the bucket holds 0.3/20 of one, so ~19.7 s.
    let ms: u64 = limited.header("retry-after-ms").unwrap().parse().unwrap();
    assert!((19_600..=19_800).contains(&ms), "{ms}");
    assert_eq!(limited.header("retry-after"), Some("20"));
    let reset = limited.header("x-ratelimit-reset-requests").unwrap();
    assert!(reset.starts_with("59."), "almost a minute to full: {reset}");
    // Three charges of max(256, 400) tokens, refilling at 100 000 a minute
    // (about 167 per 0.1 s): about 99 300 left.
    let tokens: u64 = limited.header("x-ratelimit-remaining-tokens").unwrap().parse().unwrap();
    assert!((99_200..=99_400).contains(&tokens), "{tokens}");
    assert_eq!(
        served(&trace),
        ["throttled", "ok", "ok", "ok"],
        "refused at once, served later"
    );
}

#[test]
fn openai_answers_insufficient_quota_once_the_credit_is_spent() {
    let server = ServerSpec {
        quota: Some(Quota {
            rpm: 100,
            tpm: 100_000,
            credit_tokens: Some(400),
            rpd: None,
        }),
        ..spec(ServerKind::OpenAi)
    };
    let (seen, trace, _) = run(
        server,
        2,
        |i| Duration::from_secs(i as u64 * 2),
        256,
        Duration::from_secs(30),
        60,
    );
    assert_eq!(seen[0].status(), Some(200));
    assert_eq!(seen[1].status(), Some(429));
    assert_eq!(seen[1].body()["error"]["code"], "insufficient_quota");
    assert_eq!(served(&trace), ["ok", "quota_exhausted"]);
}

/// The credit is the account's, not the process's: a restart does not
/// refill it.
#[test]
fn a_spent_credit_stays_spent_across_a_restart() {
    let server = ServerSpec {
        reload_s: 0.5,
        quota: Some(Quota {
            rpm: 100,
            tpm: 100_000,
            credit_tokens: Some(400),
            rpd: None,
        }),
        ..spec(ServerKind::OpenAi)
    };
    let mut sim = sim(1, 30);
    let trace = Trace::new();
    let handle = ServerHandle::new(server.behaviour);
    sim.host("gpu", server_host(server, handle.clone(), trace.clone(), 7));
    sim.client("client", async move {
        // One call spends the credit; the process restarts at 5 s; 10 s.
        for at in [2, 10] {
            tokio::time::sleep(Duration::from_secs(at).saturating_sub(turmoil::sim_elapsed().unwrap())).await;
            post(256, Duration::from_secs(5)).await;
        }
        Ok(())
    });
    let mut restarted = false;
    while !sim.step().unwrap() {
        if !restarted && sim.elapsed() >= Duration::from_secs(5) {
            handle.kill();
            handle.restart();
            restarted = true;
        }
    }
    assert_eq!(handle.stats().starts, 2);
    assert_eq!(served(&trace), ["ok", "quota_exhausted"]);
}

#[test]
fn a_reload_distribution_is_drawn_per_start_from_the_seed() {
    let reload = |seed: u64| {
        let server = ServerSpec {
            cold_start: true,
            reload: Some(Spread::Uniform { low: 2.0, high: 8.0 }),
            ..spec(ServerKind::LlamaCpp)
        };
        let mut sim = sim(1, 30);
        let handle = ServerHandle::default();
        sim.host("gpu", server_host(server, handle, Trace::new(), seed));
        let first_ok: Rc<RefCell<Option<Duration>>> = Rc::default();
        let out = first_ok.clone();
        sim.client("client", async move {
            loop {
                let seen = post(256, Duration::from_secs(5)).await;
                if seen.status() == Some(200) {
                    *out.borrow_mut() = Some(seen.at());
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        sim.run().unwrap();
        first_ok.borrow().unwrap()
    };
    let (a, b) = (reload(7), reload(7));
    assert_eq!(a, b, "same seed, same draw");
    assert!(a >= Duration::from_secs(2) && a < Duration::from_secs(9), "{a:?}");
    let others: Vec<_> = (1..6).map(reload).collect();
    assert!(
        others.iter().any(|o| o.abs_diff(a) > Duration::from_millis(300)),
        "{a:?} {others:?}"
    );
}

#[test]
fn the_shipped_vllm_overload_server_preempts_under_its_burst() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/vllm-overload.toml");
    let scenario = redstring_sim::scenario::Scenario::load(&path).unwrap();
    let server = ServerSpec {
        name: "gpu".into(),
        ..scenario.servers[0].clone()
    };
    let mut sim = sim(1, 120);
    let handle = ServerHandle::default();
    sim.host("gpu", server_host(server, handle.clone(), Trace::new(), 7));
    let log: Log = Rc::default();
    // The burst: six workers' fifteen calls at once.
    for i in 0..90 {
        let log = log.clone();
        sim.client(format!("client-{i}"), async move {
            let seen = post(1024, Duration::from_secs(60)).await;
            log.borrow_mut().push((i, seen));
            Ok(())
        });
    }
    let mut peak_running = 0;
    while !sim.step().unwrap() {
        peak_running = peak_running.max(handle.stats().running);
    }
    let stats = handle.stats();
    assert!(stats.preemptions > 0, "{stats:?}");
    assert!(
        peak_running < 64,
        "the cache, not max_seqs, bounds the batch: {peak_running}"
    );
    assert!(
        log.borrow().iter().all(|(_, s)| s.status() == Some(200)),
        "slow, never refused"
    );
}

/// A scenario of one server whose fields are `server` (TOML lines), with
/// one worker sending to it.
fn parse_server(server: &str) -> Result<redstring_sim::scenario::Scenario, redstring_sim::scenario::ScenarioError> {
    redstring_sim::scenario::Scenario::parse(
        "k.toml",
        &format!(
            "name = \"k\"\nduration_s = 10\n\n[[servers]]\nname = \"gpu\"\n{server}\n\n[[workers]]\nname = \"w\"\nservers = [\"gpu\"]\ntenants = [{{ id = 1, calls_per_min = 6 }}]\n"
        ),
    )
}

#[test]
fn a_scenario_file_names_a_kind_and_its_bad_field() {
    let ok = parse_server("kind = \"vllm\"\nkv_tokens = 4000").unwrap();
    assert_eq!(ok.servers[0].kind, ServerKind::Vllm);
    let err = parse_server("kv_tokens = 4000").unwrap_err().to_string();
    assert!(err.contains("servers[0].kv_tokens") && err.contains("kind"), "{err}");
    let err = parse_server("kind = \"openai\"\nquota = { rpm = 0, tpm = 10 }")
        .unwrap_err()
        .to_string();
    assert!(err.contains("servers[0].quota.rpm"), "{err}");
    let err = parse_server("kind = \"tgi\"").unwrap_err().to_string();
    assert!(err.contains("kind"), "{err}");
    // A step written before its context term existed means what it meant.
    let four = "kind = \"llama_cpp\"\nstep_ms = { prefill_base_ms = 1, prefill_per_token_ms = 0.5, decode_base_ms = 2, decode_per_sequence_ms = 3 }";
    let step = parse_server(four).unwrap().servers[0].step_ms.unwrap();
    assert_eq!(
        (step.decode_per_sequence_ms, step.decode_per_context_token_ms),
        (3.0, 0.0)
    );
}

/// llama.cpp's prompt cache: a request that finds a warm slot prefills
/// only what the slot does not hold, and its answer says how much it held.
#[test]
fn a_llama_cpp_slot_that_has_served_prefills_only_the_uncached_prompt() {
    let server = ServerSpec {
        slots: 1,
        prompt_tokens: 1000,
        output_tokens: 1,
        cached_prompt_tokens: Some(900),
        ..spec(ServerKind::LlamaCpp)
    };
    let (seen, _, _) = run(
        server,
        2,
        |i| Duration::from_secs(5 * i as u64),
        256,
        Duration::from_secs(10),
        20,
    );
    let cached = |s: &Seen| s.body().pointer("/usage/prompt_tokens_details/cached_tokens").cloned();
    assert_eq!(cached(&seen[0]), None, "a cold slot holds nothing: {seen:?}");
    assert_eq!(cached(&seen[1]), Some(Value::from(900)), "{seen:?}");
    let first = seen[0].at();
    let second = seen[1].at() - Duration::from_secs(5);
    assert!(
        second < first,
        "a tenth of the prefill is quicker: {first:?} against {second:?}"
    );
}

#[test]
fn a_prompt_cache_is_a_llama_family_field_and_bounded() {
    assert!(parse_server("kind = \"ollama\"\ncached_prompt_tokens = 100").is_ok());
    let err = parse_server("kind = \"vllm\"\ncached_prompt_tokens = 100")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("servers[0].cached_prompt_tokens") && err.contains("llama_cpp"),
        "{err}"
    );
    let err = parse_server("kind = \"llama_cpp\"\ncached_prompt_tokens = 100000000000")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("servers[0].cached_prompt_tokens") && err.contains("at most"),
        "{err}"
    );
}

#[test]
fn vllm_answers_503_past_its_opt_in_queue_limit() {
    let server = ServerSpec {
        max_queue: Some(2),
        ..spec(ServerKind::Vllm)
    };
    let (seen, trace, _) = run(
        server,
        3,
        |i| Duration::from_millis(20 * i as u64),
        256,
        Duration::from_secs(10),
        30,
    );
    assert_eq!(seen[0].status(), Some(200));
    assert_eq!(seen[1].status(), Some(200));
    assert_eq!(seen[2].status(), Some(503), "waiting and running count: {seen:?}");
    assert_eq!(served(&trace), ["queue_full", "ok", "ok"]);
}

#[test]
fn llama_swap_unloads_after_its_ttl_and_the_next_request_waits_for_the_load() {
    let server = ServerSpec {
        reload_s: 3.0,
        keep_alive_s: Some(10.0),
        ..spec(ServerKind::LlamaSwap)
    };
    let (seen, _, _) = run(
        server,
        2,
        |i| Duration::from_secs([0, 20][i]),
        256,
        Duration::from_secs(30),
        60,
    );
    assert!(seen[0].at() < Duration::from_secs(1), "loaded at the start: {seen:?}");
    // 20 s + the 250 ms wait + three one-second polls.
    assert_eq!(seen[1].status(), Some(200), "{seen:?}");
    assert!(seen[1].at() >= Duration::from_millis(23_250), "{seen:?}");
    assert!(seen[1].at() < Duration::from_secs(25), "{seen:?}");
}

#[test]
fn a_quota_group_needs_a_hosted_quota_and_one_credit_for_its_keys() {
    let text = |a: &str, b: &str| {
        format!(
            "name = \"k\"\nduration_s = 10\n\n[[servers]]\nname = \"key-a\"\n{a}\n\n[[servers]]\nname = \"key-b\"\n{b}\n\n[[workers]]\nname = \"w\"\nservers = [\"key-a\"]\ntenants = [{{ id = 1, calls_per_min = 6 }}]\n"
        )
    };
    let parse = |a: &str, b: &str| redstring_sim::scenario::Scenario::parse("k.toml", &text(a, b));
    let key = |credit: u64| {
        format!(
            "kind = \"openai\"\nquota = {{ rpm = 60, tpm = 10000, credit_tokens = {credit} }}\nquota_group = \"org\""
        )
    };
    let ok = parse(&key(500), &key(500)).unwrap();
    assert_eq!(ok.servers[1].quota_group.as_deref(), Some("org"));
    let err = parse(&key(500), &key(900)).unwrap_err().to_string();
    assert!(
        err.contains("servers[1].quota.credit_tokens") && err.contains("key-a"),
        "{err}"
    );
    let err = parse("quota_group = \"org\"", "").unwrap_err().to_string();
    assert!(err.contains("servers[0].quota_group") && err.contains("quota"), "{err}");
    let err = parse(&key(500).replace("\"org\"", "\"\""), "").unwrap_err().to_string();
    assert!(err.contains("servers[0].quota_group"), "{err}");
}

/// Clients of a server whose behaviour is `hang` with `probability` until
/// 6 s, then normal: four send at 0–1.5 s and give up after a second,
/// one sends at 5.5 s and waits, and one sends at 6.2 s and waits. What
/// each saw, and the trace.
fn hung_until_six(probability: f64) -> (Vec<Seen>, Trace) {
    use redstring_sim::scenario::{Behaviour, Mode};
    let server = ServerSpec {
        slots: 1,
        behaviour: Behaviour {
            mode: Mode::Hang,
            probability,
            ..Behaviour::default()
        },
        ..spec(ServerKind::LlamaCpp)
    };
    let mut sim = sim(1, 60);
    let trace = Trace::new();
    let handle = ServerHandle::new(server.behaviour);
    sim.host("gpu", server_host(server, handle.clone(), trace.clone(), 7));
    sim.client("operator", async move {
        tokio::time::sleep(Duration::from_secs(6)).await;
        handle.set_behaviour(Behaviour::default());
        Ok(())
    });
    let schedule = [(0.0, 1.0), (0.5, 1.0), (1.0, 1.0), (1.5, 1.0), (5.5, 30.0), (6.2, 30.0)]
        .into_iter()
        .map(|(at, timeout)| (Duration::from_secs_f64(at), Duration::from_secs_f64(timeout)))
        .collect();
    (send_all(sim, schedule, 256), trace)
}

#[test]
fn a_stopped_llama_cpp_process_works_through_what_it_held_once_continued() {
    let one_slot = ServerSpec {
        slots: 1,
        ..spec(ServerKind::LlamaCpp)
    };
    let alone = run(one_slot, 1, |_| Duration::ZERO, 256, Duration::from_secs(30), 30);
    let service = alone.0[0].at();
    // Stopped whole (every request hangs): the four early requests time
    // out, but their work waits in the process. Continued at 6 s, it serves
    // them and the one still waiting before the request sent at 6.2 s.
    let (seen, trace) = hung_until_six(1.0);
    for s in &seen[..4] {
        assert!(matches!(s, Seen::TimedOut), "{seen:?}");
    }
    assert_eq!(
        seen[4].status(),
        Some(200),
        "held through the stop, then answered: {seen:?}"
    );
    assert!(seen[4].at() >= Duration::from_secs(6), "{seen:?}");
    assert_eq!(seen[5].status(), Some(200));
    let waited = seen[5].at() - Duration::from_secs_f64(6.2);
    assert!(
        waited > service * 4,
        "the backlog delays the request sent after it: waited {waited:?}, alone {service:?}"
    );
    let served = served(&trace);
    assert_eq!(served.iter().filter(|o| *o == "hang").count(), 4, "{served:?}");
    assert_eq!(served.iter().filter(|o| *o == "ok").count(), 2, "{served:?}");

    // A hang of only some requests drops what it held: the request sent at
    // 6.2 s is served as if alone.
    let (seen, _) = hung_until_six(0.999_999);
    assert_eq!(seen[5].status(), Some(200));
    let waited = seen[5].at() - Duration::from_secs_f64(6.2);
    assert!(
        waited < service * 2,
        "nothing held: waited {waited:?}, alone {service:?}"
    );
}

/// What llama.cpp was generating when its process was stopped (SIGSTOP)
/// waits with it: the answer comes the stop's length later, not during
/// the stop.
#[test]
fn a_request_running_when_llama_cpp_is_stopped_is_answered_the_stop_later() {
    use redstring_sim::scenario::{Behaviour, Mode};
    let one_slot = ServerSpec {
        slots: 1,
        ..spec(ServerKind::LlamaCpp)
    };
    let alone = run(
        one_slot.clone(),
        1,
        |_| Duration::ZERO,
        256,
        Duration::from_secs(30),
        30,
    );
    let service = alone.0[0].at();
    let (stop, resume) = (Duration::from_secs(6), Duration::from_secs(9));
    let sent = stop - service / 2;
    let mut sim = sim(1, 60);
    let trace = Trace::new();
    let handle = ServerHandle::new(one_slot.behaviour);
    sim.host("gpu", server_host(one_slot, handle.clone(), trace.clone(), 7));
    sim.client("operator", async move {
        tokio::time::sleep(stop).await;
        handle.set_behaviour(Behaviour {
            mode: Mode::Hang,
            probability: 1.0,
            ..Behaviour::default()
        });
        tokio::time::sleep(resume - stop).await;
        handle.set_behaviour(Behaviour::default());
        Ok(())
    });
    let seen = send_all(sim, vec![(sent, Duration::from_secs(30))], 256);
    assert_eq!(seen[0].status(), Some(200), "{seen:?}");
    let answered = seen[0].at();
    assert!(
        answered > resume && answered < resume + service,
        "sent at {sent:?}, half done at the stop, answered at {answered:?} (one request takes {service:?}, the stop is {stop:?} to {resume:?})"
    );
    assert_eq!(served(&trace), ["ok"]);
}

/// A llama.cpp server of `slots` whose every step takes 10 ms, whatever
/// its batch or prompt: a request of `n` output tokens holds its slot for
/// `n` × 10 ms.
fn flat_llama(slots: u32) -> ServerSpec {
    ServerSpec {
        slots,
        output_tokens: 1_000,
        step_ms: Some(redstring_sim::scenario::kinds::LinearStep {
            prefill_base_ms: 0.0,
            prefill_per_token_ms: 0.0,
            decode_base_ms: 10.0,
            decode_per_sequence_ms: 0.0,
            decode_per_context_token_ms: 0.0,
        }),
        ..spec(ServerKind::LlamaCpp)
    }
}

/// Clients of `spec`, each `(sent at ms, max_tokens, gives up after ms)`:
/// what each saw, in client order, and the trace.
fn clients(spec: ServerSpec, clients: &[(u64, u64, u64)]) -> (Vec<Seen>, Trace) {
    let mut sim = sim(1, 60);
    let trace = Trace::new();
    sim.host(
        "gpu",
        server_host(spec.clone(), ServerHandle::new(spec.behaviour), trace.clone(), 7),
    );
    let log: Log = Rc::default();
    for (i, &(at, max_tokens, give_up)) in clients.iter().enumerate() {
        let log = log.clone();
        sim.client(format!("client-{i}"), async move {
            tokio::time::sleep(Duration::from_millis(at)).await;
            let seen = post(max_tokens, Duration::from_millis(give_up)).await;
            log.borrow_mut().push((i, seen));
            Ok(())
        });
    }
    sim.run().unwrap();
    let mut log = log.borrow().clone();
    log.sort_by_key(|(i, _)| *i);
    (log.into_iter().map(|(_, s)| s).collect(), trace)
}

/// Asserts `seen` was answered within the 60 ms after `ms` (a step, the
/// network's ticks).
fn answered_at(seen: &Seen, ms: u64, what: &str) {
    let at = seen.at();
    let from = Duration::from_millis(ms);
    assert!(
        at >= from && at < from + Duration::from_millis(60),
        "{what}: answered at {at:?}, expected at {from:?} ({seen:?})"
    );
}

/// llama.cpp's handler waits for its request's result a second at a time
/// and looks at its client only when a second passes without a result;
/// a request whose client left runs until then, waiting or running.
#[test]
fn llama_cpp_cancels_a_request_whose_client_left_at_its_next_look() {
    // Running: the first (3 s of work) is left at 1.3 s; the look at 1 s
    // found its client there, the one at 2 s cancels it, and the second
    // runs from then. Stopped at once, the second would end at 1.5 s.
    let (seen, trace) = clients(flat_llama(1), &[(0, 300, 1_300), (100, 20, 30_000)]);
    assert!(matches!(seen[0], Seen::TimedOut), "{seen:?}");
    answered_at(&seen[1], 2_200, "the request behind the cancelled one");
    // Recorded when its client left, not when the look cancelled it.
    let abandoned = served_at(&trace, Answer::Abandoned);
    assert_eq!(abandoned.len(), 1, "{:?}", served(&trace));
    assert!(
        (Duration::from_millis(1_300)..Duration::from_millis(1_350)).contains(&abandoned[0]),
        "{abandoned:?}"
    );

    // Waiting: the second is left at 0.6 s while queued behind the first;
    // its look at 1.1 s cancels it, and the third gets the slot when the
    // first ends at 3 s. Left in the queue it would run first, to 6 s.
    let (seen, _) = clients(flat_llama(1), &[(0, 300, 30_000), (100, 300, 500), (200, 20, 30_000)]);
    assert!(matches!(seen[1], Seen::TimedOut), "{seen:?}");
    answered_at(&seen[0], 3_000, "the first");
    answered_at(&seen[2], 3_200, "the third, the second cancelled while it waited");
}

/// A result handed to any request wakes every waiting handler, and its
/// second starts again: a request whose client left runs on while the
/// server keeps answering others.
#[test]
fn llama_cpp_looks_only_after_a_second_without_any_result() {
    // Two slots. The first (3 s) is left at 0.3 s; the second ends at
    // 0.6 s, so the first's handler looks at 1.6 s, not at 1 s. The third
    // takes the second's slot at 0.7 s; the fourth waits for the first's.
    let (seen, _) = clients(
        flat_llama(2),
        &[(0, 300, 300), (0, 60, 30_000), (700, 300, 30_000), (800, 20, 30_000)],
    );
    assert!(matches!(seen[0], Seen::TimedOut), "{seen:?}");
    answered_at(&seen[1], 600, "the second");
    answered_at(&seen[3], 1_800, "the fourth, in the slot the look freed");
}

/// When a connection ended, seen from its client.
#[derive(Debug, Default)]
struct Ended {
    /// Each response's `keep-alive` and `connection` headers, and when it
    /// arrived.
    responses: Vec<(Option<String>, Option<String>, Duration)>,
    /// When the server closed the connection, if it did.
    closed_at: Option<Duration>,
}

/// One connection to the server `gpu`: `requests` requests one after
/// another, then idle until the server closes it or `idle` passes.
async fn one_connection(requests: usize, idle: Duration) -> Ended {
    let stream = turmoil::net::TcpStream::connect(("gpu", 8080)).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let closed = tokio::spawn(async move {
        let _ = conn.await;
        turmoil::sim_elapsed().unwrap()
    });
    let mut ended = Ended::default();
    for _ in 0..requests {
        let request = Request::post("/v1/chat/completions")
            .header("host", "gpu")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(chat_request(1).to_string())))
            .unwrap();
        let Ok(response) = sender.send_request(request).await else {
            break;
        };
        let header = |name: &str| response.headers().get(name).map(|v| v.to_str().unwrap().to_owned());
        let seen = (
            header("keep-alive"),
            header("connection"),
            turmoil::sim_elapsed().unwrap(),
        );
        response.into_body().collect().await.unwrap();
        ended.responses.push(seen);
    }
    ended.closed_at = tokio::time::timeout(idle, closed).await.ok().map(Result::unwrap);
    ended
}

/// llama-server (cpp-httplib) closes a connection idle for 5 s, and one
/// after its 100th response, which says `Connection: close`; the others
/// say `Keep-Alive: timeout=5, max=100` (measured on a real llama-server:
/// closed after 5.00 s idle, and after the 100th of 101 requests). A
/// generic server keeps both.
#[test]
fn llama_cpp_closes_a_connection_idle_for_5_s_or_after_100_requests() {
    for (kind, closes) in [(ServerKind::LlamaCpp, true), (ServerKind::Generic, false)] {
        let mut sim = sim(1, 120);
        let handle = ServerHandle::new(spec(kind).behaviour);
        sim.host("gpu", server_host(spec(kind), handle, Trace::new(), 7));
        let log: Rc<RefCell<Vec<Ended>>> = Rc::default();
        let seen = log.clone();
        sim.client("client", async move {
            let idle = one_connection(1, Duration::from_secs(20)).await;
            let many = one_connection(101, Duration::from_secs(20)).await;
            seen.borrow_mut().extend([idle, many]);
            Ok(())
        });
        sim.run().unwrap();
        let log = log.borrow();
        let (idle, many) = (&log[0], &log[1]);
        assert_eq!(idle.responses.len(), 1, "{kind:?}: {idle:?}");
        if closes {
            let answered = idle.responses[0].2;
            let closed = idle.closed_at.expect("the server closes an idle connection");
            let after = closed - answered;
            assert!(
                after >= Duration::from_secs(5) && after <= Duration::from_millis(5100),
                "closed {after:?} after the answer"
            );
            assert_eq!(idle.responses[0].0.as_deref(), Some("timeout=5, max=100"));
            assert_eq!(many.responses.len(), 100, "the 101st request has no connection");
            assert_eq!(many.responses[98].1, None);
            assert_eq!(many.responses[99].1.as_deref(), Some("close"));
            let last = many.responses[99].2;
            assert!(
                many.closed_at.is_some_and(|c| c - last < Duration::from_millis(100)),
                "{many:?}"
            );
        } else {
            assert_eq!(idle.closed_at, None, "a generic server keeps the connection");
            assert_eq!(many.responses.len(), 101);
            assert!(many.responses.iter().all(|r| r.0.is_none() && r.1.is_none()));
            assert_eq!(many.closed_at, None);
        }
    }
}

/// Sends one request on a new connection at `at`, and keeps the connection
/// `hold` after the answer, as a client's pool keeps an idle one; returns
/// when the answer came, if it came within 30 s.
async fn held_post(at: Duration, hold: Duration) -> Option<Duration> {
    held_post_within(at, Duration::from_secs(30), hold).await
}

/// [`held_post`], giving up after `give_up` (and closing the connection).
async fn held_post_within(at: Duration, give_up: Duration, hold: Duration) -> Option<Duration> {
    tokio::time::sleep(at).await;
    let stream = turmoil::net::TcpStream::connect(("gpu", 8080)).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let request = Request::post("/v1/chat/completions")
        .header("host", "gpu")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat_request(8).to_string())))
        .unwrap();
    let answer = tokio::time::timeout(give_up, async {
        let response = sender.send_request(request).await.ok()?;
        response.into_body().collect().await.ok()?;
        Some(turmoil::sim_elapsed().unwrap())
    })
    .await
    .ok()
    .flatten();
    if answer.is_some() {
        tokio::time::sleep(hold).await;
    }
    drop(sender);
    conn.abort();
    answer
}

/// llama-server serves each connection on a thread of its pool, and a
/// thread told of a connection counts as idle until it runs: on a CPU
/// server whose compute thread and accept loop fill both cores, a burst of
/// twenty new connections while it computes gets the five idle threads
/// (six, less the one a connection already holds), and the other fifteen
/// wait until a thread comes free — here when a served connection idles
/// 5 s. Observed on a real llama-server (2 cores, 1 thread, 2 slots): of
/// twenty calls sent at once it answered five, and nothing more of the
/// burst. With a core to spare, or an engine at rest when the burst comes,
/// every connection gets a thread at once.
#[test]
fn llama_cpp_on_a_crowded_cpu_serves_a_burst_only_on_its_idle_threads() {
    let crowded = Some(Cpu {
        cores: 2,
        threads: Some(1),
    });
    let spare = Some(Cpu {
        cores: 8,
        threads: Some(2),
    });
    // (cpu, whether a held connection makes the engine compute at the burst)
    for (cpu, computing, waiting) in [
        (crowded, true, 15),
        (crowded, false, 0),
        (spare, true, 0),
        (None, true, 0),
    ] {
        let spec = ServerSpec {
            slots: 2,
            cpu,
            ..spec(ServerKind::LlamaCpp)
        };
        let mut sim = sim(1, 60);
        let handle = ServerHandle::new(spec.behaviour);
        sim.host("gpu", server_host(spec, handle, Trace::new(), 7));
        let answers: Rc<RefCell<Vec<Option<Duration>>>> = Rc::default();
        // The engine is at work from 0 s to past the burst when asked.
        let burst_at = Duration::from_millis(if computing { 20 } else { 2_000 });
        let seen = answers.clone();
        sim.client("first", async move {
            let answered = held_post(Duration::ZERO, Duration::from_secs(30)).await;
            assert!(answered.is_some_and(|a| a > Duration::from_millis(20)), "{answered:?}");
            assert!(
                answered.is_some_and(|a| a < Duration::from_millis(2_000)),
                "{answered:?}"
            );
            drop(seen);
            Ok(())
        });
        for i in 0..20 {
            let seen = answers.clone();
            sim.client(format!("burst-{i}"), async move {
                let answered = held_post(burst_at, Duration::from_secs(20)).await;
                seen.borrow_mut().push(answered);
                Ok(())
            });
        }
        sim.run().unwrap();
        let answers = answers.borrow();
        let first_answers: Vec<Duration> = answers.iter().flatten().copied().collect();
        assert_eq!(
            first_answers.len(),
            20,
            "every call is answered in the end: {answers:?}"
        );
        let early = first_answers.iter().min().copied().unwrap();
        // A served connection's thread comes free 5 s after its answer.
        let late = first_answers
            .iter()
            .filter(|a| **a >= early + Duration::from_secs(5))
            .count();
        assert_eq!(late, waiting, "{cpu:?}, computing {computing}: {first_answers:?}");
    }
}

#[test]
fn a_cpu_is_a_llama_cpp_field_with_threads_within_its_cores() {
    let ok = parse_server("kind = \"llama_cpp\"\ncpu = { cores = 2, threads = 1 }").unwrap();
    let cpu = ok.servers[0].cpu.unwrap();
    assert!(cpu.crowded(), "one compute thread and the accept loop fill two cores");
    assert!(
        !Cpu {
            cores: 8,
            threads: Some(2)
        }
        .crowded()
    );
    assert!(
        Cpu {
            cores: 8,
            threads: None
        }
        .crowded(),
        "llama.cpp computes on every core"
    );
    for (server, field) in [
        ("kind = \"vllm\"\ncpu = { cores = 2 }", "servers[0].cpu"),
        ("cpu = { cores = 2 }", "servers[0].cpu"),
        ("kind = \"llama_cpp\"\ncpu = { cores = 0 }", "servers[0].cpu.cores"),
        ("kind = \"llama_cpp\"\ncpu = { cores = 5000 }", "servers[0].cpu.cores"),
        (
            "kind = \"llama_cpp\"\ncpu = { cores = 2, threads = 3 }",
            "servers[0].cpu.threads",
        ),
        (
            "kind = \"llama_cpp\"\ncpu = { cores = 2, threads = 0 }",
            "servers[0].cpu.threads",
        ),
        ("kind = \"llama_cpp\"\ncpu = { cores = 2, gpus = 1 }", "gpus"),
    ] {
        let err = parse_server(server).unwrap_err().to_string();
        assert!(err.contains(field), "{server}: {err}");
    }
}

/// A request whose connection waited in llama-server's HTTP pool until its
/// client gave up is read only when a thread takes the connection: the
/// server records it `hang`, as its client saw it (the laboratory records a
/// call that timed out so), when a thread comes free and drains the queue
/// oldest first; and it runs, its handler looking at its client only a
/// second without results later, so a request behind them waits for them.
#[test]
fn a_request_llama_cpp_read_after_its_client_left_is_recorded_hang_and_runs() {
    let spec = ServerSpec {
        slots: 2,
        cpu: Some(Cpu {
            cores: 2,
            threads: Some(1),
        }),
        ..spec(ServerKind::LlamaCpp)
    };
    let mut sim = sim(1, 60);
    let trace = Trace::new();
    sim.host(
        "gpu",
        server_host(spec.clone(), ServerHandle::new(Behaviour::default()), trace.clone(), 7),
    );
    let answers: Rc<RefCell<Vec<Option<Duration>>>> = Rc::default();
    sim.client("first", async {
        held_post(Duration::ZERO, Duration::from_secs(30)).await.unwrap();
        Ok(())
    });
    for i in 0..20 {
        let seen = answers.clone();
        sim.client(format!("burst-{i}"), async move {
            let answered = held_post_within(
                Duration::from_millis(20),
                Duration::from_secs(3),
                Duration::from_secs(20),
            )
            .await;
            seen.borrow_mut().push(answered);
            Ok(())
        });
    }
    sim.client("later", async {
        let answered = held_post(Duration::from_secs(10), Duration::ZERO).await;
        assert!(answered.is_some(), "the queue has drained: a thread serves it");
        Ok(())
    });
    let behind: Rc<RefCell<Option<Duration>>> = Rc::default();
    let seen = behind.clone();
    sim.client("behind", async move {
        *seen.borrow_mut() = held_post(Duration::from_millis(5_100), Duration::ZERO).await;
        Ok(())
    });
    sim.run().unwrap();
    // Sent as the threads that came free at 5 s took the stale requests,
    // it waits while they run: several times one such request alone.
    let alone = run(spec, 1, |_| Duration::ZERO, 8, Duration::from_secs(30), 30).0[0].at();
    let waited = behind.borrow().expect("answered") - Duration::from_millis(5_100);
    assert!(
        waited > alone * 3,
        "the stale requests ran first: it waited {waited:?}, one alone takes {alone:?}"
    );
    let gave_up = answers.borrow().iter().filter(|a| a.is_none()).count();
    assert_eq!(gave_up, 15);
    let hung = served_at(&trace, Answer::Hang);
    assert_eq!(hung.len(), 15, "{hung:?}");
    // The first connection idles 5 s after its answer, and its thread
    // takes the queue's oldest, every one of them left at 3 s.
    assert!(
        hung.iter().all(|t| *t >= Duration::from_secs(5)),
        "read when a thread comes free: {hung:?}"
    );
    // The first, the five the idle threads took, the later one and the one
    // behind.
    let answered = served(&trace);
    assert_eq!(
        answered.iter().filter(|o| *o != "hang").count(),
        1 + 5 + 1 + 1,
        "{answered:?}"
    );
}
