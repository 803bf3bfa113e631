//! The laboratory's measuring code against the simulator's own server,
//! whose numbers are known, and against a real llama-server.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redstring::provider::{TransportError, TransportErrorKind};

use super::calibrate::{self, Endpoint as _, Plan};
use super::llama::{LlamaServer, LlamaSpec, Tools};
use super::{HttpEndpoint, SimEndpoint};
use crate::evidence::outcome::Answer;
use crate::evidence::trace::{Kind, Trace};
use crate::hosts::server::{PORT, ServerHandle, server_host};
use crate::hosts::transport::SimTransport;
use crate::scenario::kinds::{LinearStep, ServerKind, Spread};
use crate::scenario::{Behaviour, Mode, Network, Scenario, ServerSpec};
use crate::world::sim_builder;

/// Measures a llama.cpp-kind server of `step` with `plan`, on a 1 ms tick;
/// its warm slots hold `cached` tokens of every prompt.
fn measure_simulated(step: LinearStep, slots: u32, cached: Option<u64>, plan: Plan) -> calibrate::Measurement {
    let mut sim = sim_builder(
        7,
        Duration::from_millis(1),
        &Network::default(),
        Duration::from_secs(3600),
    )
    .build();
    let spec = ServerSpec {
        kind: ServerKind::LlamaCpp,
        slots,
        reload_s: 0.0,
        step_sigma: Some(0.02),
        step_ms: Some(step),
        cached_prompt_tokens: cached,
        prompt_tokens_dist: Some(Spread::Uniform { low: 20.0, high: 400.0 }),
        output_tokens_dist: Some(Spread::Uniform { low: 4.0, high: 60.0 }),
        ..ServerSpec::named("gpu")
    };
    let trace = Trace::new();
    sim.host("gpu", server_host(spec, ServerHandle::default(), trace.clone(), 11));
    let out = Arc::new(Mutex::new(None));
    let result = out.clone();
    sim.client("lab", async move {
        let endpoint = Arc::new(SimEndpoint::new(
            &format!("http://gpu:{PORT}"),
            SimTransport::new("lab", trace),
        ));
        *result.lock().unwrap() = Some(calibrate::measure(endpoint, &plan).await);
        Ok(())
    });
    sim.run().unwrap();
    let measured = out.lock().unwrap().take().unwrap();
    measured.unwrap()
}

#[test]
fn calibrate_recovers_the_step_of_the_simulated_server_it_measures() {
    let step = LinearStep {
        prefill_base_ms: 15.0,
        prefill_per_token_ms: 0.2,
        decode_base_ms: 4.0,
        decode_per_sequence_ms: 6.0,
        decode_per_context_token_ms: 0.01,
    };
    let plan = Plan {
        requests_per_client: 12,
        ..Plan::default()
    };
    let measured = measure_simulated(step, 3, None, plan.clone());
    assert_eq!(measured.props.slots, Some(3), "read from /props");
    assert_eq!(measured.props.slot_context, Some(16_384 / 3));
    assert_eq!(measured.failed, 0);
    assert_eq!(measured.samples.len(), 12 * (1 + 2 + 3), "levels 1 to the slots");
    let fitted = calibrate::fit(&measured).unwrap();
    let close = |got: f64, want: f64, within: f64| (got - want).abs() <= within * want;
    let s = fitted.step;
    assert!(close(s.prefill_per_token_ms, 0.2, 0.1), "{s:?}");
    assert!(close(s.decode_per_sequence_ms, 6.0, 0.1), "{s:?}");
    assert!(close(s.decode_per_context_token_ms, 0.01, 0.2), "{s:?}");
    // The bases are the smaller terms; the prefill's also takes in the
    // network's round trips (1–5 ms links).
    assert!(close(s.prefill_base_ms, 15.0, 0.35), "{s:?}");
    assert!(close(s.decode_base_ms, 4.0, 0.35), "{s:?}");
    assert!(fitted.mean_error < 0.05, "{fitted:?}");
}

/// A server whose warm slots hold most of every prompt: the fit must charge
/// each request only the tokens its answer says were not cached, or it
/// puts the prompt's cost where none was paid.
#[test]
fn calibrate_charges_each_request_only_the_prompt_its_server_did_not_cache() {
    let step = LinearStep {
        prefill_base_ms: 40.0,
        prefill_per_token_ms: 0.5,
        decode_base_ms: 4.0,
        decode_per_sequence_ms: 6.0,
        decode_per_context_token_ms: 0.0,
    };
    let measured = measure_simulated(step, 2, Some(300), Plan::default());
    let cached = measured.samples.iter().filter(|s| s.cached_tokens > 0).count();
    assert!(cached * 2 > measured.samples.len(), "most found a warm slot: {cached}");
    let fitted = calibrate::fit(&measured).unwrap();
    let close = |got: f64, want: f64, within: f64| (got - want).abs() <= within * want;
    let s = fitted.step;
    assert!(close(s.prefill_per_token_ms, 0.5, 0.1), "{s:?}");
    assert!(close(s.prefill_base_ms, 40.0, 0.2), "{s:?}");
    assert!(fitted.mean_error < 0.05, "{fitted:?}");
}

/// The laboratory's tools, or `None` after saying why when they are not
/// installed — unless `REDSTRING_REQUIRE_LLAMA=1`, which makes their
/// absence a failure (as CI sets it).
fn tools_or_skip() -> Option<Tools> {
    match Tools::find() {
        Ok(tools) => Some(tools),
        Err(e) if std::env::var("REDSTRING_REQUIRE_LLAMA").as_deref() == Ok("1") => {
            panic!("REDSTRING_REQUIRE_LLAMA=1 but {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED (set REDSTRING_REQUIRE_LLAMA=1 to fail instead): {e}");
            None
        }
    }
}

#[test]
fn calibrate_measures_a_real_llama_server_and_writes_a_server_a_scenario_accepts() {
    let Some(tools) = tools_or_skip() else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (measured, section) = runtime.block_on(async {
        let spec = LlamaSpec::lab(&tools, 2, 4096);
        let mut server = LlamaServer::start(&tools, &spec).unwrap();
        server.ready(Duration::from_secs(120)).await.unwrap();
        let endpoint = Arc::new(HttpEndpoint::new(&server.base_url(), None).unwrap());
        let plan = Plan {
            requests_per_client: 6,
            ..Plan::default()
        };
        let measured = calibrate::measure(endpoint, &plan).await.unwrap();
        let fitted = calibrate::fit(&measured).unwrap();
        (measured, fitted.server_section("cpu", &server.base_url()))
    });
    assert_eq!(measured.props.slots, Some(2), "from /props");
    assert_eq!(measured.props.slot_context, Some(2048), "-c 4096 over 2 slots");
    assert_eq!(measured.failed, 0);
    assert_eq!(measured.samples.len(), 6 * (1 + 2));
    assert!(
        measured
            .samples
            .iter()
            .all(|s| s.completion_tokens > 0 && s.prompt_tokens > 0),
        "{measured:?}"
    );
    let text = format!(
        "name = \"calibrated\"\nseed = 1\nduration_s = 10\n{section}\n[[workers]]\nname = \"w\"\nservers = [\"cpu\"]\ntenants = [{{ id = 1, calls_per_min = 15 }}]\n"
    );
    let scenario = Scenario::parse("calibrated.toml", &text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let server = scenario.server("cpu").unwrap();
    assert_eq!(server.kind, ServerKind::LlamaCpp);
    assert_eq!((server.slots, server.context_tokens), (2, Some(4096)));
    assert!(
        server
            .step_ms
            .is_some_and(|s| s.decode_base_ms + s.decode_per_sequence_ms > 0.0)
    );
}

/// What one chat completion got: a status and body, or the transport's
/// failure.
async fn ask(endpoint: &HttpEndpoint, timeout: Duration) -> Result<(u16, serde_json::Value), TransportError> {
    let (body, _) = Plan::default().body(0, 1, 0, 0);
    let r = endpoint.post("/v1/chat/completions", body, timeout).await?;
    Ok((r.status, serde_json::from_slice(&r.body).unwrap_or_default()))
}

#[test]
fn a_real_llama_server_loads_crashes_restarts_and_hangs_as_the_llama_cpp_kind_claims() {
    let Some(tools) = tools_or_skip() else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        // A large context makes a load of seconds: the KV cache is
        // allocated and cleared before the server is ready.
        let spec = LlamaSpec::lab(&tools, 1, 65_536);
        let mut server = LlamaServer::start(&tools, &spec).unwrap();
        let endpoint = HttpEndpoint::new(&server.base_url(), None).unwrap();
        // While it loads: the kind's 503, body for body.
        let loading = loop {
            match ask(&endpoint, Duration::from_secs(5)).await {
                Ok((503, body)) => break body,
                Ok((status, body)) => panic!("answered {status} {body} before any 503"),
                // Not listening yet.
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        };
        assert_eq!(loading, crate::hosts::server::loading_body());
        server.ready(Duration::from_secs(120)).await.unwrap();
        assert_eq!(ask(&endpoint, Duration::from_secs(60)).await.unwrap().0, 200);

        // A crash: connections refused, as the kind's killed process. The
        // client's pooled connection from the answer before may not have
        // heard the kill yet (a busy machine): a request on it is reset,
        // and the next one is refused.
        server.kill();
        let mut refused = ask(&endpoint, Duration::from_secs(5)).await.unwrap_err();
        if matches!(
            refused,
            TransportError::Failed {
                kind: TransportErrorKind::Reset,
                ..
            }
        ) {
            refused = ask(&endpoint, Duration::from_secs(5)).await.unwrap_err();
        }
        assert!(
            matches!(
                refused,
                TransportError::Failed {
                    kind: TransportErrorKind::Connect,
                    ..
                }
            ),
            "{refused:?}"
        );
        // A restart loads again, on the same port.
        server.restart().unwrap();
        server.ready(Duration::from_secs(120)).await.unwrap();
        assert_eq!(ask(&endpoint, Duration::from_secs(60)).await.unwrap().0, 200);

        // A hang, as the laboratory applies a scenario's: nothing answers
        // within the timeout; back to normal, it answers.
        let hang = Behaviour {
            mode: Mode::Hang,
            ..Behaviour::default()
        };
        super::run::behave(&server, &hang).unwrap();
        let hung = ask(&endpoint, Duration::from_millis(500)).await.unwrap_err();
        assert!(
            matches!(
                hung,
                TransportError::Failed {
                    kind: TransportErrorKind::Timeout,
                    ..
                }
            ),
            "{hung:?}"
        );
        super::run::behave(&server, &Behaviour::default()).unwrap();
        assert_eq!(ask(&endpoint, Duration::from_secs(60)).await.unwrap().0, 200);
        assert!(server.is_running());
    });
}

/// The laboratory's llama-swap front over a real llama-server: it passes
/// answers on; after a restart it holds the first request while it starts
/// the upstream and polls its health on llama-swap's schedule, then
/// answers it and records the load; past its concurrency limit it answers
/// 429; a load that misses its health check fails every request that
/// waited for it with llama-swap's 500.
#[test]
fn the_llama_swap_front_holds_requests_while_its_real_upstream_loads() {
    let Some(tools) = tools_or_skip() else { return };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let spec = LlamaSpec::lab(&tools, 1, 65_536);
        let trace = Trace::new();
        let settings = |limit, timeout_s| super::swap::SwapSettings {
            name: "gpu".into(),
            concurrency_limit: limit,
            health_check_timeout_s: timeout_s,
        };
        let front = super::swap::SwapFront::start(&tools, &spec, settings(1, 120.0), trace.clone())
            .await
            .unwrap();
        let endpoint = HttpEndpoint::new(&front.base_url(), None).unwrap();
        assert_eq!(ask(&endpoint, Duration::from_secs(60)).await.unwrap().0, 200);

        // One request in flight takes the whole limit of 1: a second is 429.
        // The upstream is stopped so the first stays in flight however fast
        // this machine answers it.
        front.hold_upstream(true).unwrap();
        let held = tokio::task::spawn_local({
            let endpoint = HttpEndpoint::new(&front.base_url(), None).unwrap();
            async move { ask(&endpoint, Duration::from_secs(60)).await }
        });
        for _ in 0..2_000 {
            if front.in_flight() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(front.in_flight(), 1, "the first request reached the front");
        assert_eq!(ask(&endpoint, Duration::from_secs(60)).await.unwrap().0, 429);
        front.hold_upstream(false).unwrap();
        assert_eq!(held.await.unwrap().unwrap().0, 200);

        // Crashed, it refuses; restarted, it holds the request through the
        // upstream's load (seconds, with this context) and answers it.
        front.crash();
        assert!(ask(&endpoint, Duration::from_secs(5)).await.is_err());
        front.restart().await.unwrap();
        let sent = tokio::time::Instant::now();
        assert_eq!(ask(&endpoint, Duration::from_secs(120)).await.unwrap().0, 200);
        assert!(
            sent.elapsed() >= Duration::from_millis(250),
            "held for the first poll at least"
        );
        let loads = trace.events().iter().filter(|e| matches!(e.kind, Kind::Loaded)).count();
        assert_eq!(loads, 1, "the load its request started");
        drop(front);

        // A health check that cannot pass: the waiter gets llama-swap's 500.
        let front = super::swap::SwapFront::start(&tools, &spec, settings(10, 0.0), trace.clone())
            .await
            .unwrap();
        front.restart().await.unwrap();
        let endpoint = HttpEndpoint::new(&front.base_url(), None).unwrap();
        let (status, body) = ask(&endpoint, Duration::from_secs(60)).await.unwrap();
        assert_eq!(status, 500, "{body}");
        assert_eq!(body["src"], "llama-swap", "{body}");
    });
}

/// The shipped laboratory scenario: two workers calling one llama.cpp
/// server that crashes at 6 s and restarts at 8 s; about 25 s for real.
const CRASH_RESTART: &str = include_str!("../../../scenarios/lab/crash-restart.toml");

#[test]
fn a_scenario_run_for_real_records_the_trace_a_simulation_records_and_is_judged_alike() {
    let Some(tools) = tools_or_skip() else { return };
    let scenario = Scenario::parse("lab-crash-restart.toml", CRASH_RESTART).unwrap();
    let ran = super::run::run(&scenario, &tools, 1).unwrap();
    let evidence = ran.evidence.clone();
    let count = |f: &dyn Fn(&Kind) -> bool| evidence.events.iter().filter(|e| f(&e.kind)).count();
    assert!(
        evidence.simulated >= Duration::from_secs(25),
        "{:?}",
        evidence.simulated
    );
    assert!(
        count(&|k| matches!(k, Kind::Arrival { .. })) >= 20,
        "about 40 calls arrive"
    );
    assert_eq!(count(&|k| matches!(k, Kind::Fault { .. })), 2);
    assert_eq!(count(&|k| matches!(k, Kind::Loaded)), 1, "the restart's load");
    let ok = count(&|k| {
        matches!(
            k,
            Kind::Served {
                outcome: Answer::Ok,
                ..
            }
        )
    });
    assert!(ok >= 10, "{ok} answered");
    // The answers to requests alone said how fast they generated.
    let paces = &ran.generation_ms_per_token["gpu"];
    assert!(!paces.is_empty() && paces.len() <= ok, "{} of {ok}", paces.len());
    assert!(paces.iter().all(|ms| *ms > 0.0 && *ms < 1_000.0), "{paces:?}");
    // The crash: requests the dead server refused were sent but never served.
    assert!(count(&|k| matches!(k, Kind::Request { .. })) > ok);
    let loaded = evidence.events.iter().find(|e| matches!(e.kind, Kind::Loaded)).unwrap();
    assert!(
        loaded.t_us > 8_000_000,
        "loaded after the restart at 8 s: {}",
        loaded.t_us
    );
    let run = crate::judgement::judge(&scenario, evidence);
    let report = crate::judgement::report::Report::new(&scenario, "lab-crash-restart.toml", &run);
    let text = report.render(None);
    assert!(text.contains("gpu"), "{text}");
    assert!(!report.failed(), "every invariant holds for real too:\n{text}");
}

/// What `lab` predicts with: the shipped crash-restart scenario with its
/// server measured for real.
#[test]
fn calibrating_a_scenario_gives_its_server_the_real_server_s_numbers() {
    use crate::scenario::kinds::Spread;
    let Some(tools) = tools_or_skip() else { return };
    let scenario = Scenario::parse("lab-crash-restart.toml", CRASH_RESTART).unwrap();
    let (predicted, found) = super::run::calibrated(&scenario, &tools).unwrap();
    let (server, c) = (&predicted.servers[0], &found[0]);
    assert_eq!(c.server, "gpu");
    assert!((1..=super::run::MOST_MEASUREMENTS).contains(&c.measurements), "{c:?}");
    // The fit's step, paced to the workers' own request: llama-server
    // times every answer, so the prediction runs the pace it said.
    assert_eq!(server.step_ms, Some(c.step));
    let pace = c
        .generation_ms_per_token
        .expect("llama-server timed the workers' request");
    assert!(pace > 0.0 && pace < 1_000.0, "{c:?}");
    let later = c.tokens.1.saturating_sub(1) as f64;
    let context = c.tokens.0 as f64 + (later + 1.0) / 2.0;
    let paced = c.step.decode_ms(1.0, context);
    assert!(
        (paced - pace).abs() < 1e-6 * pace,
        "{paced} ms a token against {pace}: {c:?}"
    );
    assert_eq!(
        crate::scenario::kinds::LinearStep {
            decode_per_sequence_ms: c.fit.step.decode_per_sequence_ms,
            ..c.step
        },
        c.fit.step,
        "only the cost per sequence moves"
    );
    // The workers' own request, as the real server counted it.
    assert_eq!(u64::from(server.prompt_tokens), c.tokens.0);
    assert!(c.tokens.0 > 50 && c.tokens.1 > 0, "{c:?}");
    assert!(
        server.cached_prompt_tokens.is_some_and(|t| t < c.tokens.0),
        "{server:?}"
    );
    // The load: the median of its restarts, drawn between the shortest and
    // the longest.
    let (low, high) = c.reload_range;
    assert!(
        0.0 < low && low <= c.reload_s && c.reload_s <= high && high < 60.0,
        "{c:?}"
    );
    assert_eq!(server.reload_s, c.reload_s);
    if high > low {
        assert_eq!(server.reload, Some(Spread::Uniform { low, high }));
    } else {
        assert_eq!(server.reload, None);
    }
    // Its llama-server computes on this machine's cores with one thread.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    assert_eq!(
        server.cpu,
        Some(crate::scenario::kinds::Cpu {
            cores,
            threads: Some(1)
        })
    );
    // The calibrated copy is a scenario the simulator runs.
    let run = crate::campaign::simulate(&predicted, 1).unwrap();
    assert!(!run.events.is_empty());
}

#[test]
fn every_shipped_lab_scenario_is_one_the_laboratory_runs() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/lab");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let scenario = Scenario::parse(&path.display().to_string(), &text).unwrap();
        assert_eq!(super::run::unsupported(&scenario), None, "{}", path.display());
        names.push(path.file_name().unwrap().to_string_lossy().into_owned());
    }
    names.sort();
    assert_eq!(
        names,
        [
            "crash-restart.toml",
            "hang.toml",
            "overload-burst.toml",
            "swap-slow-reload.toml"
        ]
    );
}

/// What keeps a `kill -9` of the laboratory from leaving servers behind:
/// a process started through `owned` is killed when the thread that
/// started it ends, as the laboratory's own end would end it.
#[test]
fn a_process_the_laboratory_owns_dies_with_the_thread_that_started_it() {
    use std::os::unix::process::ExitStatusExt as _;
    if !super::llama::owned(std::path::Path::new("sleep"))
        .get_program()
        .to_string_lossy()
        .ends_with("setpriv")
    {
        eprintln!("SKIPPED: setpriv (util-linux) is not installed");
        return;
    }
    let mut child = std::thread::spawn(|| {
        let child = super::llama::owned(std::path::Path::new("/bin/sleep"))
            .arg("30")
            .spawn()
            .unwrap();
        // The thread ends only once `setpriv` has set the signal and
        // become `sleep`.
        let comm = format!("/proc/{}/comm", child.id());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&comm).unwrap_or_default().trim() != "sleep" {
            assert!(std::time::Instant::now() < deadline, "setpriv never ran sleep");
            std::thread::sleep(Duration::from_millis(5));
        }
        child
    })
    .join()
    .unwrap();
    // The starting thread is gone: its child was sent SIGKILL.
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "{status:?}");
}

/// The keep-alive the simulated `llama_cpp` server copies
/// (`hosts::server::KeepAlive`): every response says `Keep-Alive:
/// timeout=5, max=100`, the 100th on a connection says `Connection: close`,
/// and the server then closes it.
#[test]
fn llama_server_announces_its_keep_alive_and_closes_after_100_requests() {
    use std::io::{BufRead, BufReader, Read, Write};
    let Some(tools) = tools_or_skip() else { return };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let spec = LlamaSpec::lab(&tools, 2, 4096);
    let mut server = LlamaServer::start(&tools, &spec).unwrap();
    runtime.block_on(server.ready(Duration::from_secs(120))).unwrap();
    let address = server.base_url().trim_start_matches("http://").to_owned();
    let stream = std::net::TcpStream::connect(&address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let mut last = Vec::new();
    for nth in 1..=100 {
        write!(writer, "GET /health HTTP/1.1\r\nHost: {address}\r\n\r\n").unwrap();
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let line = line.trim_end().to_ascii_lowercase();
            if line.is_empty() {
                break;
            }
            headers.push(line);
        }
        let length: usize = headers
            .iter()
            .find_map(|h| h.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
            .unwrap();
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        if nth < 100 {
            assert!(
                headers.contains(&"keep-alive: timeout=5, max=100".to_owned()),
                "{nth}: {headers:?}"
            );
        }
        last = headers;
    }
    assert!(last.contains(&"connection: close".to_owned()), "{last:?}");
    let mut rest = Vec::new();
    assert_eq!(reader.read_to_end(&mut rest).unwrap(), 0, "closed after the 100th");
}
