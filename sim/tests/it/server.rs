//! The simulated model server, driven over turmoil TCP with a plain hyper client.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use redstring_sim::evidence::trace::{Kind, Trace};
use redstring_sim::hosts::server::{ServerHandle, server_host};
use redstring_sim::scenario::{Behaviour, Mode};
use serde_json::{Value, json};

use crate::support::{sim, spec};

fn with_mode(mode: Mode) -> Behaviour {
    Behaviour {
        mode,
        probability: 1.0,
        retry_after_s: 2.5,
    }
}

/// What a client saw.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Answer {
        status: u16,
        retry_after: Option<String>,
        body: Value,
    },
    /// The connection failed or closed without an answer.
    Failed(String),
    /// No answer within the client's timeout.
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

    /// The parsed JSON of `choices[0].message.content`.
    fn content(&self) -> Value {
        let text = self.body()["choices"][0]["message"]["content"].as_str().unwrap_or("");
        serde_json::from_str(text).unwrap_or(Value::Null)
    }
}

fn chat_request() -> Value {
    json!({
        "model": "qwen3-8b",
        "messages": [{"role": "user", "content": "Review this."}],
        "max_tokens": 256,
        "response_format": {"type": "json_schema", "json_schema": {"name": "review", "strict": true, "schema": {
            "type": "object",
            "properties": {
                "verdict": {"type": "string", "enum": ["approve", "reject"]},
                "score": {"type": "integer"},
                "confidence": {"type": "number"},
                "notes": {"type": "array", "items": {"type": "string"}},
                "urgent": {"type": "boolean"},
                "author": {"type": "object", "properties": {"name": {"type": "string"}},
                           "required": ["name"], "additionalProperties": false},
            },
            "required": ["verdict", "score", "confidence", "notes", "urgent", "author"],
            "additionalProperties": false,
        }}},
    })
}

/// One request on a fresh connection, bounded by `timeout`.
async fn post_to(host: &str, path: &str, timeout: Duration) -> Seen {
    let exchange = async {
        let stream = turmoil::net::TcpStream::connect((host, 8080))
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        let request = Request::post(path)
            .header("host", host)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(chat_request().to_string())))
            .map_err(|e| e.to_string())?;
        let send = async {
            let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            let body = response.into_body().collect().await.map_err(|e| e.to_string())?;
            let body = serde_json::from_slice(&body.to_bytes()).map_err(|e| e.to_string())?;
            Ok::<_, String>(Seen::Answer {
                status,
                retry_after,
                body,
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

async fn post(timeout: Duration) -> Seen {
    post_to("gpu", "/v1/chat/completions", timeout).await
}

fn served(trace: &Trace) -> Vec<(String, bool)> {
    trace
        .events()
        .into_iter()
        .filter_map(|e| match e.kind {
            Kind::Served { outcome, impaired, .. } => Some((outcome.name().to_owned(), impaired)),
            _ => None,
        })
        .collect()
}

type Log = Rc<RefCell<Vec<Seen>>>;

#[test]
fn each_mode_answers_with_its_documented_status_and_body() {
    let cases = Mode::ALL;
    let mut sim = sim(1, 120);
    let trace = Trace::new();
    let handle = ServerHandle::default();
    sim.host("gpu", server_host(spec(), handle.clone(), trace.clone(), 7));
    let log: Log = Rc::default();
    let (client_log, client_handle) = (log.clone(), handle.clone());
    sim.client("client", async move {
        for mode in cases {
            client_handle.set_behaviour(with_mode(mode));
            let seen = post(Duration::from_secs(5)).await;
            client_log.borrow_mut().push(seen);
        }
        Ok(())
    });
    sim.run().unwrap();

    let log = log.borrow();
    let [
        normal,
        empty,
        malformed,
        refuse,
        rate_limit,
        error,
        loading,
        hang,
        dropped,
    ] = &log[..]
    else {
        panic!("{log:?}")
    };

    assert_eq!(normal.status(), Some(200));
    let body = normal.body();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "qwen3-8b");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["usage"]["prompt_tokens"], 400);
    assert_eq!(body["usage"]["completion_tokens"], 60);
    assert_eq!(
        normal.content(),
        json!({"verdict": "approve", "score": 1, "confidence": 1.0, "notes": [], "urgent": true,
               "author": {"name": "x"}})
    );

    assert_eq!(empty.status(), Some(200));
    let message = &empty.body()["choices"][0]["message"];
    assert_eq!(message["content"], "");
    assert!(message["reasoning_content"].as_str().is_some_and(|r| !r.is_empty()));
    assert_eq!(empty.body()["choices"][0]["finish_reason"], "length");

    assert_eq!(malformed.status(), Some(200));
    let text = malformed.body()["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(serde_json::from_str::<Value>(text).is_err(), "{text}");

    assert_eq!(refuse.status(), Some(200));
    let message = &refuse.body()["choices"][0]["message"];
    assert!(message["refusal"].as_str().is_some_and(|r| !r.is_empty()));
    assert!(message["content"].is_null());

    assert_eq!(rate_limit.status(), Some(429));
    let Seen::Answer { retry_after, .. } = rate_limit else {
        unreachable!()
    };
    assert_eq!(retry_after.as_deref(), Some("3"), "2.5 s rounds up to whole seconds");

    assert_eq!(error.status(), Some(500));
    assert_eq!(error.body()["error"]["code"], 500);

    assert_eq!(loading.status(), Some(503));
    assert_eq!(
        loading.body(),
        &json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
    );

    assert_eq!(hang, &Seen::TimedOut);
    assert!(matches!(dropped, Seen::Failed(_)), "{dropped:?}");

    let outcomes = served(&trace);
    let expected = [
        ("ok", false),
        ("empty", true),
        ("malformed", true),
        ("refuse", true),
        ("rate_limit", true),
        ("error", true),
        ("loading", true),
        ("hang", true),
        ("drop", true),
    ];
    assert_eq!(
        outcomes,
        expected.map(|(o, i)| (o.to_owned(), i)).to_vec(),
        "one Served event per request"
    );
    assert_eq!(handle.stats().received, 9);
}

#[test]
fn unknown_paths_are_not_found() {
    let mut sim = sim(1, 30);
    let trace = Trace::new();
    sim.host("gpu", server_host(spec(), ServerHandle::default(), trace.clone(), 7));
    let log: Log = Rc::default();
    let client_log = log.clone();
    sim.client("client", async move {
        let seen = post_to("gpu", "/v1/completions", Duration::from_secs(5)).await;
        client_log.borrow_mut().push(seen);
        Ok(())
    });
    sim.run().unwrap();
    assert_eq!(log.borrow()[0].status(), Some(404));
    assert_eq!(served(&trace), [("not_found".to_owned(), false)]);
}

#[test]
fn a_partial_probability_mixes_modes_and_is_deterministic() {
    fn run(seed: u64) -> (String, Vec<Seen>) {
        let mut sim = sim(3, 120);
        let trace = Trace::new();
        let mut server = spec();
        server.behaviour = Behaviour {
            mode: Mode::Error,
            probability: 0.5,
            retry_after_s: 1.0,
        };
        let handle = ServerHandle::new(server.behaviour);
        sim.host("gpu", server_host(server, handle, trace.clone(), seed));
        let log: Log = Rc::default();
        for c in 0..3 {
            let client_log = log.clone();
            sim.client(format!("client-{c}"), async move {
                for _ in 0..8 {
                    let seen = post(Duration::from_secs(10)).await;
                    client_log.borrow_mut().push(seen);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Ok(())
            });
        }
        sim.run().unwrap();
        let log = log.borrow().clone();
        (Trace::to_json_lines(&trace.events()), log)
    }
    let (first, seen) = run(11);
    let (second, _) = run(11);
    assert_eq!(first, second, "same seed, same trace, byte for byte");
    let errors = seen.iter().filter(|s| s.status() == Some(500)).count();
    let oks = seen.iter().filter(|s| s.status() == Some(200)).count();
    assert_eq!(errors + oks, 24);
    assert!(errors > 0 && oks > 0, "{errors} errors, {oks} ok");
    let (other, _) = run(12);
    assert_ne!(first, other, "another server seed draws other modes");
}

#[test]
fn loads_the_model_after_each_start() {
    let mut sim = sim(1, 120);
    let trace = Trace::new();
    let mut server = spec();
    server.reload_s = 5.0;
    server.cold_start = true;
    let handle = ServerHandle::default();
    sim.host("gpu", server_host(server, handle.clone(), trace.clone(), 7));
    type Statuses = Rc<RefCell<Vec<(u64, Option<u16>)>>>;
    let log: Statuses = Rc::default();
    let client_log = log.clone();
    sim.client("client", async move {
        // One request a second for 30 s; the server is bounced at 12 s.
        for _ in 0..30 {
            let at = turmoil::sim_elapsed().unwrap().as_secs();
            let seen = post(Duration::from_secs(5)).await;
            client_log.borrow_mut().push((at, seen.status()));
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        Ok(())
    });
    let mut bounced = false;
    while !sim.step().unwrap() {
        if !bounced && sim.elapsed() >= Duration::from_secs(12) {
            sim.bounce("gpu");
            bounced = true;
        }
    }
    let log = log.borrow();
    // Requests take about 1.7 s of service, so the client's clock advances
    // unevenly; judge each answer by when it was sent.
    for (at, status) in log.iter() {
        // The request in service at the bounce dies with the process.
        let loading = *at < 5 || (13..=16).contains(at);
        let ok = (5..=9).contains(at) || *at >= 18;
        if loading {
            assert_eq!(*status, Some(503), "sent at {at}s: {log:?}");
        }
        if ok {
            assert_eq!(*status, Some(200), "sent at {at}s: {log:?}");
        }
    }
    assert!(log.iter().any(|(at, _)| (13..=16).contains(at)), "{log:?}");
    assert!(log.iter().any(|(at, _)| (5..=9).contains(at)), "{log:?}");
    assert_eq!(handle.stats().starts, 2);
}

#[test]
fn a_full_queue_answers_server_busy() {
    let mut sim = sim(1, 60);
    let trace = Trace::new();
    let mut server = spec();
    server.slots = 1;
    server.queue = 1;
    let handle = ServerHandle::default();
    sim.host("gpu", server_host(server, handle.clone(), trace.clone(), 7));
    let log: Log = Rc::default();
    for c in 0..3 {
        let client_log = log.clone();
        sim.client(format!("client-{c}"), async move {
            // Staggered so the arrival order is fixed.
            tokio::time::sleep(Duration::from_millis(100 * c)).await;
            let seen = post(Duration::from_secs(20)).await;
            client_log.borrow_mut().push(seen);
            Ok(())
        });
    }
    let probe = handle.clone();
    let mut peak = 0;
    while !sim.step().unwrap() {
        peak = peak.max(probe.stats().in_flight);
    }
    assert_eq!(peak, 2);
    let log = log.borrow();
    let busy: Vec<_> = log.iter().filter(|s| s.status() == Some(503)).collect();
    assert_eq!(busy.len(), 1, "{log:?}");
    assert_eq!(
        busy[0].body(),
        &json!({"error": {"code": 503, "message": "server busy", "type": "unavailable_error"}})
    );
    assert_eq!(log.iter().filter(|s| s.status() == Some(200)).count(), 2);
    let outcomes: Vec<_> = served(&trace).into_iter().map(|(o, _)| o).collect();
    assert_eq!(outcomes, ["queue_full", "ok", "ok"]);
}

#[test]
fn service_time_is_prefill_plus_decode_one_slot_at_a_time() {
    let mut sim = sim(1, 60);
    let mut server = spec();
    server.slots = 1;
    // 400 / 2000 + 60 / 40 = 1.7 s each.
    sim.host("gpu", server_host(server, ServerHandle::default(), Trace::new(), 7));
    let done: Rc<RefCell<Vec<Duration>>> = Rc::default();
    for c in 0..2 {
        let done = done.clone();
        sim.client(format!("client-{c}"), async move {
            tokio::time::sleep(Duration::from_millis(100 * c)).await;
            assert_eq!(post(Duration::from_secs(20)).await.status(), Some(200));
            done.borrow_mut().push(turmoil::sim_elapsed().unwrap());
            Ok(())
        });
    }
    sim.run().unwrap();
    let done = done.borrow();
    assert!(
        done[0] >= Duration::from_millis(1700) && done[0] < Duration::from_millis(1800),
        "{done:?}"
    );
    assert!(
        done[1] >= Duration::from_millis(3400) && done[1] < Duration::from_millis(3500),
        "the second waits for the slot: {done:?}"
    );
}

#[test]
fn collapses_at_its_limit_and_recovers_once_clients_give_up() {
    let mut sim = sim(1, 120);
    let trace = Trace::new();
    let mut server = spec();
    server.slots = 2;
    server.queue = 10;
    server.collapse_at = Some(4);
    let handle = ServerHandle::default();
    sim.host("gpu", server_host(server, handle.clone(), trace.clone(), 7));
    let log: Log = Rc::default();
    for c in 0..4u64 {
        let client_log = log.clone();
        sim.client(format!("burst-{c}"), async move {
            tokio::time::sleep(Duration::from_millis(50 * c)).await;
            let seen = post(Duration::from_secs(10)).await;
            client_log.borrow_mut().push(seen);
            Ok(())
        });
    }
    let late: Log = Rc::default();
    let late_log = late.clone();
    sim.client("late", async move {
        // While collapsed: hangs, even though nothing is being served.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let seen = post(Duration::from_secs(4)).await;
        late_log.borrow_mut().push(seen);
        // Every burst client has given up by 10.2 s and this one by 7 s: recovered.
        tokio::time::sleep(Duration::from_secs(8)).await;
        let seen = post(Duration::from_secs(10)).await;
        late_log.borrow_mut().push(seen);
        Ok(())
    });
    let probe = handle.clone();
    let mut collapsed_at_5s = None;
    while !sim.step().unwrap() {
        if collapsed_at_5s.is_none() && sim.elapsed() >= Duration::from_secs(5) {
            collapsed_at_5s = Some(probe.stats());
        }
    }
    let during = collapsed_at_5s.unwrap();
    assert!(during.collapsed);
    assert_eq!(during.in_flight, 5, "four from the burst and the late one");
    assert_eq!(
        *log.borrow(),
        vec![Seen::TimedOut; 4],
        "nothing in flight is answered, not even the two that were running"
    );
    assert_eq!(late.borrow()[0], Seen::TimedOut);
    assert_eq!(late.borrow()[1].status(), Some(200), "{:?}", late.borrow());
    let after = handle.stats();
    assert!(!after.collapsed);
    assert_eq!((after.collapses, after.in_flight, after.running), (1, 0, 0));
    let outcomes: Vec<_> = served(&trace).into_iter().map(|(o, _)| o).collect();
    assert_eq!(
        outcomes,
        ["collapsed", "collapsed", "collapsed", "collapsed", "collapsed", "ok"]
    );
}

#[test]
fn a_client_that_gives_up_while_queued_is_abandoned() {
    let mut sim = sim(1, 60);
    let trace = Trace::new();
    let mut server = spec();
    server.slots = 1;
    let handle = ServerHandle::default();
    sim.host("gpu", server_host(server, handle.clone(), trace.clone(), 7));
    sim.client("patient", async {
        assert_eq!(post(Duration::from_secs(20)).await.status(), Some(200));
        Ok(())
    });
    sim.client("impatient", async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(post(Duration::from_millis(500)).await, Seen::TimedOut);
        Ok(())
    });
    sim.run().unwrap();
    assert_eq!(
        served(&trace),
        [("abandoned".to_owned(), true), ("ok".to_owned(), false)]
    );
    assert_eq!(handle.stats().in_flight, 0);
}

#[test]
fn a_killed_process_resets_its_connections_refuses_new_ones_and_reloads_on_restart() {
    let mut sim = sim(1, 60);
    let trace = Trace::new();
    let mut server = spec();
    server.reload_s = 2.0;
    let handle = ServerHandle::default();
    sim.host("gpu", server_host(server, handle.clone(), trace.clone(), 7));
    type Timed = Rc<RefCell<Vec<(Duration, Seen)>>>;
    let log: Timed = Rc::default();
    let client_log = log.clone();
    sim.client("client", async move {
        // 3 s: running (killed at 3.5 s); 4 s: down; 6 s: loading (restarted
        // at 5 s); 8 s: serving.
        for at in [3, 4, 6, 8] {
            tokio::time::sleep(Duration::from_secs(at).saturating_sub(turmoil::sim_elapsed().unwrap())).await;
            let started = turmoil::sim_elapsed().unwrap();
            let seen = post(Duration::from_secs(10)).await;
            client_log
                .borrow_mut()
                .push((turmoil::sim_elapsed().unwrap() - started, seen));
        }
        Ok(())
    });
    let (mut killed, mut restarted) = (false, false);
    while !sim.step().unwrap() {
        if !killed && sim.elapsed() >= Duration::from_millis(3500) {
            handle.kill();
            killed = true;
        }
        if !restarted && sim.elapsed() >= Duration::from_secs(5) {
            assert!(!handle.is_up());
            handle.restart();
            restarted = true;
        }
    }
    let log = log.borrow();
    assert!(matches!(log[0].1, Seen::Failed(_)), "reset mid-request: {log:?}");
    assert!(log[0].0 < Duration::from_millis(600), "{log:?}");
    assert!(matches!(log[1].1, Seen::Failed(_)), "{log:?}");
    assert!(log[1].0 < Duration::from_millis(50), "refused at once: {log:?}");
    assert_eq!(log[2].1.body()["error"]["message"], "Loading model", "{log:?}");
    assert_eq!(log[3].1.status(), Some(200), "{log:?}");
    assert_eq!(handle.stats().starts, 2);
    let outcomes: Vec<_> = served(&trace).into_iter().map(|(o, _)| o).collect();
    assert_eq!(outcomes, ["abandoned", "loading", "ok"]);
}
