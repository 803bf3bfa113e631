//! Connections between a worker and a server are kept alive and reused, as
//! reqwest's pool does, so a worker calling a fast server hundreds of times a
//! second does not run out of ports.

use redstring_sim::campaign::simulate;
use redstring_sim::evidence::outcome::CallOutcome;
use redstring_sim::evidence::trace::Kind;
use redstring_sim::hosts::transport::{MAX_OPEN_CONNECTIONS, TIME_WAIT};
use redstring_sim::scenario::Scenario;

#[test]
fn a_worker_at_200_calls_a_second_to_a_fast_server_never_runs_out_of_connections() {
    // 60 s at 200 calls a second is 12 000 calls, more than the 8000
    // connections a client may hold within TIME_WAIT (120 s): one connection
    // per call ran out after 40 s. The server serves a call in under a
    // millisecond, so a handful of kept-alive connections carry them all.
    assert!(12_000 > MAX_OPEN_CONNECTIONS && TIME_WAIT.as_secs() >= 60);
    let text = r#"
name = "fast"
duration_s = 60
[hardening]
rpm = 100000
failure_threshold = 100000
[[servers]]
name = "gpu"
slots = 64
queue = 1000
prefill_tokens_per_s = 1000000
decode_tokens_per_s = 1000000
[[workers]]
name = "worker"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 12000 }]
"#;
    let s = Scenario::parse("fast.toml", text).unwrap();
    let run = simulate(&s, 1).unwrap();
    let mut ended = 0u64;
    let mut failed = Vec::new();
    for e in &run.events {
        if let Kind::CallEnd(end) = &e.kind {
            ended += 1;
            if end.outcome != CallOutcome::Ok || end.attempts != 1 {
                failed.push((e.t_us, end.outcome, end.attempts));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {ended} calls failed or retried, the first: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    // (Fewer than 12 000 end: arrival gaps shorter than the 10 ms tick
    // round up to it.)
    assert!(ended > 10_000, "{ended} calls ended");
}
