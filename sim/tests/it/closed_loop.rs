//! Closed-loop load: a tenant's clients each keep at most one call in flight,
//! think between calls, and send less as latency grows; their settings are
//! validated by name.

use std::collections::BTreeMap;

use redstring_sim::campaign::simulate;
use redstring_sim::evidence::trace::{Kind, TraceEvent};
use redstring_sim::scenario::Scenario;

/// One worker whose tenant 1 has `clients` closed-loop clients thinking
/// `think_s`, against a server whose decode speed sets the latency.
fn scenario(clients: u32, think_s: f64, decode_tokens_per_s: f64) -> Scenario {
    let text = format!(
        r#"
name = "closed"
duration_s = 120
[hardening]
rpm = 10000
window_s = 60
request_timeout_s = 60
[[servers]]
name = "gpu"
slots = 64
queue = 64
decode_tokens_per_s = {decode_tokens_per_s}
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{{ id = 1, clients = {clients}, think_s = {think_s} }}]
"#
    );
    Scenario::parse("closed.toml", &text).unwrap()
}

/// The most calls in flight at once, and how many arrived.
fn concurrency(events: &[TraceEvent]) -> (usize, usize) {
    let (mut open, mut most, mut arrived) = (BTreeMap::new(), 0, 0);
    for e in events {
        match &e.kind {
            Kind::Arrival { call, .. } => {
                arrived += 1;
                open.insert(*call, ());
                most = most.max(open.len());
            }
            Kind::CallEnd(end) => {
                open.remove(&end.call);
            }
            _ => {}
        }
    }
    (most, arrived)
}

#[test]
fn each_client_keeps_at_most_one_call_in_flight() {
    let run = simulate(&scenario(5, 0.5, 40.0), 7).unwrap();
    let (most, arrived) = concurrency(&run.events);
    assert_eq!(most, 5, "five clients, at most five calls at once");
    assert!(arrived > 5, "{arrived}");
    assert!(run.failed().is_empty(), "{:?}", run.failed());
}

#[test]
fn a_slower_server_gets_fewer_calls_from_the_same_clients() {
    // Service time is 400/2000 + 60/decode s: 1.7 s at 40 tok/s, 6.2 s at
    // 10. Each client sends one call per think + latency: about
    // 120 / (1 + 1.7) ≈ 44 and 120 / (1 + 6.2) ≈ 17 calls per client.
    let (_, fast) = concurrency(&simulate(&scenario(4, 1.0, 40.0), 3).unwrap().events);
    let (_, slow) = concurrency(&simulate(&scenario(4, 1.0, 10.0), 3).unwrap().events);
    assert!((150..=200).contains(&fast), "fast: {fast}");
    assert!((55..=85).contains(&slow), "slow: {slow}");
}

#[test]
fn closed_loop_runs_replay_exactly() {
    let s = scenario(3, 0.3, 40.0);
    assert_eq!(simulate(&s, 11).unwrap().events, simulate(&s, 11).unwrap().events);
}

#[test]
fn closed_loop_settings_are_validated_by_name() {
    let bad = |tenants: &str| {
        let text = format!(
            "name = \"x\"\nduration_s = 10\n[[servers]]\nname = \"gpu\"\n[[workers]]\nname = \"w\"\nservers = [\"gpu\"]\ntenants = [{tenants}]\n"
        );
        Scenario::parse("x.toml", &text).unwrap_err().to_string()
    };
    let e = bad("{ id = 1, clients = 2, think_s = 0 }");
    assert!(e.contains("workers[0].tenants[0].think_s"), "{e}");
    let e = bad("{ id = 1, clients = 20000 }");
    assert!(e.contains("workers[0].tenants[0].clients"), "{e}");
    // 5000 clients thinking 1 ms could start 300 million calls a minute.
    let e = bad("{ id = 1, clients = 5000, think_s = 0.001 }");
    assert!(e.contains("think_s") && e.contains("calls a minute"), "{e}");
    let e = bad("{ id = 1, clients = 2, think_s = 1, calls = 3 }");
    assert!(e.contains("calls"), "{e}");
}
