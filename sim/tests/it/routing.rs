//! Workers that route over several servers (`hardening.routing`): the shipped
//! two-deployment scenario falls back to its spare during the primary's
//! outage and only then, a scenario without a policy keeps each worker on
//! its one server, a spare no call asks again after recovery does not fail
//! liveness, and a server listed twice under routing is refused.

use std::path::Path;

use redstring_sim::campaign::simulate;
use redstring_sim::evidence::outcome::CallOutcome;
use redstring_sim::evidence::trace::Kind;
use redstring_sim::judgement::invariants::{Invariant, Verdict};
use redstring_sim::scenario::Scenario;

fn shipped() -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/two-deployment-fallback.toml");
    Scenario::load(&path).unwrap()
}

/// Requests each server received before, during and after the primary's
/// outage (60 s to 105 s), and the calls that failed.
fn tally(s: &Scenario) -> ([u64; 3], [u64; 3], usize) {
    let run = simulate(s, 3).unwrap();
    assert!(run.failed().is_empty(), "{:?}", run.failed());
    let (mut gpu, mut spare) = ([0u64; 3], [0u64; 3]);
    let mut failed = 0;
    for e in &run.events {
        let phase = match e.t_us {
            t if t < 60_000_000 => 0,
            t if t < 105_000_000 => 1,
            _ => 2,
        };
        match &e.kind {
            Kind::Request { server } if &**server == "gpu" => gpu[phase] += 1,
            Kind::Request { server } if &**server == "spare" => spare[phase] += 1,
            Kind::CallEnd(end) if end.outcome != CallOutcome::Ok => failed += 1,
            _ => {}
        }
    }
    (gpu, spare, failed)
}

#[test]
fn ordered_routing_falls_back_to_the_spare_only_while_the_primary_is_out() {
    let (gpu, spare, failed) = tally(&shipped());
    assert!(
        gpu[0] > 50 && spare[0] == 0,
        "before: all on the primary ({gpu:?}, {spare:?})"
    );
    assert!(spare[1] > 30, "during: the spare takes the load ({spare:?})");
    assert!(gpu[1] < 10, "during: the open circuit is skipped, not called ({gpu:?})");
    assert!(gpu[2] > 50, "after: back on the primary ({gpu:?})");
    assert_eq!(failed, 0, "no call failed: every one found a deployment");
}

#[test]
fn without_a_policy_each_worker_calls_only_its_own_server() {
    let mut s = shipped();
    s.hardening.routing = None;
    let (gpu, spare, failed) = tally(&s);
    // Six workers over ["gpu", "spare"]: i % 2 puts three on each.
    assert!(gpu.iter().sum::<u64>() > 0 && spare.iter().sum::<u64>() > 0);
    assert!(spare[1] < gpu[0], "the spare gets no extra load during the outage");
    assert!(failed > 0, "the primary's workers fail during its outage");
}

#[test]
fn least_loaded_routing_spreads_calls_over_both_servers_by_their_slots() {
    let mut s = shipped();
    s.hardening.routing = Some(redstring_sim::scenario::Routing::LeastLoaded);
    let (gpu, spare, failed) = tally(&s);
    assert!(
        spare[0] > 10 && gpu[0] > spare[0],
        "before: both, the 4-slot more ({gpu:?}, {spare:?})"
    );
    assert_eq!(failed, 0);
}

/// The primary crashes (calls go to the spare), then the spare crashes while
/// the primary is still down; both restart at 100 s. The primary's probe
/// closes it before the spare's is due, and under ordered routing every later
/// call goes to the primary: nothing asks the spare's breaker again.
const SCENARIO: &str = r#"
name = "both-out"
seed = 7
duration_s = 400
[hardening]
rpm = 600
failure_threshold = 1
recovery_timeout_s = 20
request_timeout_s = 2
max_delay_s = 4
max_retries = 1
routing = "ordered"
[cache]
kind = "shared"
[[servers]]
name = "gpu"
slots = 4
reload_s = 0
[[servers]]
name = "spare"
slots = 4
reload_s = 0
[[workers]]
name = "worker"
count = 1
servers = ["gpu", "spare"]
tenants = [{ id = 1, calls_per_min = 0, clients = 1, think_s = 2 }]
[[faults]]
kind = "crash"
at_s = 60
server = "gpu"
[[faults]]
kind = "crash"
at_s = 95
server = "spare"
[[faults]]
kind = "restart"
at_s = 100
server = "gpu"
[[faults]]
kind = "restart"
at_s = 100
server = "spare"
"#;

#[test]
fn a_healthy_spare_no_call_asks_again_does_not_fail_liveness() {
    let s = Scenario::parse("both-out.toml", SCENARIO).unwrap();
    let run = simulate(&s, 7).unwrap();
    let liveness = run.checks.iter().find(|c| c.name == Invariant::Liveness).unwrap();
    assert_eq!(liveness.verdict, Verdict::Held, "{}", liveness.figure);
}

#[test]
fn a_server_listed_twice_under_routing_is_refused_by_its_field() {
    let text = SCENARIO.replace(r#"servers = ["gpu", "spare"]"#, r#"servers = ["gpu", "gpu"]"#);
    let e = Scenario::parse("twice.toml", &text).unwrap_err().to_string();
    assert!(e.contains("workers[0].servers[1]") && e.contains("listed twice"), "{e}");
    // Without routing, worker `i` calls `servers[i % 2]`: a listing twice is allowed.
    let plain = text.replace("routing = \"ordered\"\n", "");
    Scenario::parse("twice.toml", &plain).unwrap();
}

/// The trust issue: where traffic went was shown by `run` only; `compare`
/// now gives each server's share of the requests, its 429s and its
/// requests while impaired, per variant, with the sign test.
#[test]
fn compare_shows_each_servers_share_of_the_requests_per_variant() {
    use redstring_sim::campaign::run_seeds;
    use redstring_sim::judgement::compare::{Comparison, Variant};

    let ordered = shipped();
    let mut weighted = shipped();
    weighted.hardening.routing = Some(redstring_sim::scenario::Routing::Weighted);
    let seeds = [1, 2, 3];
    let variants: Vec<Variant> = [("ordered", &ordered), ("weighted", &weighted)]
        .into_iter()
        .map(|(name, s)| Variant {
            name: name.into(),
            records: run_seeds(s, name, &seeds, 1, || {}),
        })
        .collect();
    for v in &variants {
        for r in &v.records {
            let total: f64 = r.servers.values().map(|f| f["share"]).sum();
            assert!((total - 1.0).abs() < 1e-9, "{}: shares sum to {total}", v.name);
        }
    }
    let c = Comparison::new(1, 4, None, String::new(), &variants);
    let spare = |i: usize| c.variants[i].1.servers["spare"]["share"].median;
    // Ordered sends the spare only what the primary's outage leaves it;
    // weighted spreads every call.
    assert!(spare(0) < 0.3 && spare(1) > 0.4, "{} {}", spare(0), spare(1));
    let text = c.render();
    assert!(text.contains("  per server (where the requests went):\n"), "{text}");
    assert!(text.contains("    spare share"), "{text}");
    assert!(text.contains("▲3/3"), "{text}");
    assert!(text.contains("    gpu throttled"), "{text}");
}

/// The trust issue: `--set hardening.routing=none` was refused ("unknown
/// variant none"), so routing could not be compared against no routing.
#[test]
fn routing_none_is_no_policy_as_leaving_the_key_out_is() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/two-deployment-fallback.toml"),
    )
    .unwrap();
    let none = redstring_sim::judgement::compare::set_field(&text, "hardening.routing", "none").unwrap();
    let s = Scenario::parse("none.toml", &none).unwrap();
    assert_eq!(s.hardening.routing, None);
    let weighted = redstring_sim::judgement::compare::set_field(&text, "hardening.routing", "weighted").unwrap();
    let s = Scenario::parse("weighted.toml", &weighted).unwrap();
    assert_eq!(s.hardening.routing, Some(redstring_sim::scenario::Routing::Weighted));
}

/// Routing switched off stays off in a combination of several `--set`.
#[test]
fn routing_none_holds_in_every_combination_of_a_factorial_compare() {
    use redstring_sim::judgement::compare::{apply, design};
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/two-deployment-fallback.toml"),
    )
    .unwrap();
    let settings = design(&["hardening.routing=none,weighted", "hardening.failure_threshold=2,4"]).unwrap();
    let got: Vec<_> = settings
        .iter()
        .map(|setting| {
            let s = Scenario::parse("varied.toml", &apply(&text, setting).unwrap()).unwrap();
            (s.hardening.routing, s.hardening.failure_threshold)
        })
        .collect();
    use redstring_sim::scenario::Routing::Weighted;
    assert_eq!(got, [(None, 2), (None, 4), (Some(Weighted), 2), (Some(Weighted), 4)]);
}
