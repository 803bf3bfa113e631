//! Replaying an arrival trace: each request arrives at its instant with its
//! own token counts, which reach the server; a missing or malformed trace is
//! a scenario error naming the tenant's field.

use std::path::PathBuf;

use redstring_sim::campaign::simulate;
use redstring_sim::evidence::trace::Kind;
use redstring_sim::hosts::tokens_of;
use redstring_sim::scenario::Scenario;

/// A directory holding `trace.csv` with `rows`, and the scenario text
/// replaying it against one generic server (prefill 2000, decode 40 tok/s).
fn setup(name: &str, rows: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("redstring-sim-replay-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("trace.csv"),
        format!("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n{rows}"),
    )
    .unwrap();
    let scenario = r#"
name = "replay"
duration_s = 60
[hardening]
request_timeout_s = 50
# Above every replayed output, so no answer is cut off.
max_tokens = 1000
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, replay = { file = "trace.csv" } }]
"#;
    let path = dir.join("replay.toml");
    std::fs::write(&path, scenario).unwrap();
    path
}

#[test]
fn requests_arrive_at_their_instants_with_their_own_token_counts() {
    // 2000 prompt tokens and 400 output tokens: 1 s of prefill and 10 s of
    // decode, against the server's own 0.2 + 1.5 s; a failed row is skipped.
    let path = setup(
        "tokens",
        "5,ChatGPT,2000,400,2400,API log\n7,ChatGPT,10,0,10,API log\n20,ChatGPT,400,60,460,API log\n",
    );
    let scenario = Scenario::load(&path).unwrap();
    let run = simulate(&scenario, 1).unwrap();
    let arrivals: Vec<u64> = run
        .events
        .iter()
        .filter(|e| matches!(e.kind, Kind::Arrival { .. }))
        .map(|e| e.t_us / 1000)
        .collect();
    assert_eq!(arrivals, [5000, 20000]);
    let latencies: Vec<u64> = run
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            Kind::CallEnd(end) => Some(end.latency_ms),
            _ => None,
        })
        .collect();
    assert_eq!(latencies.len(), 2);
    assert!((11_000..11_100).contains(&latencies[0]), "{latencies:?}");
    assert!((1_700..1_800).contains(&latencies[1]), "{latencies:?}");
}

#[test]
fn a_missing_or_malformed_trace_names_the_tenant_field() {
    let path = setup("malformed", "5,ChatGPT,many,400,2400,API log\n");
    let e = Scenario::load(&path).unwrap_err().to_string();
    assert!(
        e.contains("workers[0].tenants[0].replay") && e.contains("line 2") && e.contains("Request tokens"),
        "{e}"
    );
    std::fs::remove_file(path.with_file_name("trace.csv")).unwrap();
    let e = Scenario::load(&path).unwrap_err().to_string();
    assert!(
        e.contains("workers[0].tenants[0].replay") && e.contains("cannot read"),
        "{e}"
    );
}

#[test]
fn the_token_header_is_read_strictly() {
    assert_eq!(tokens_of(Some("12, 34")), Some((12, 34)));
    assert_eq!(tokens_of(Some("12")), None);
    assert_eq!(tokens_of(Some("-1,3")), None);
    assert_eq!(tokens_of(Some("99999999999,3")), None);
    assert_eq!(tokens_of(None), None);
}

#[test]
fn the_shipped_trace_is_what_its_script_writes() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios/traces");
    let Ok(out) = std::process::Command::new("python3")
        .arg(dir.join("generate.py"))
        .output()
    else {
        eprintln!("skipped: python3 is not on PATH");
        return;
    };
    assert!(out.status.success());
    let shipped = std::fs::read(dir.join("bursty-day.csv")).unwrap();
    assert_eq!(out.stdout, shipped, "run generate.py again and commit its output");
}
