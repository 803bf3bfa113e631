//! Objectives end to end: `[objectives]` is parsed and validated with
//! errors naming the field, each set objective gets a verdict in the report
//! and its JSON, `run` exits 5 when one is missed (1 still wins when an
//! invariant fails), and `sweep` prints each figure's distribution and each
//! pass rate.

use crate::support::{ERRORS_TO_THE_END, ONE_WORKER, SMALL, bin, temp_file};

use redstring_sim::scenario::{Scenario, ScenarioError};

/// `SMALL` with `[objectives]` holding `lines`.
fn with_objectives(lines: &str) -> String {
    format!("{SMALL}[objectives]\n{lines}\n")
}

fn invalid_field(text: &str) -> String {
    match Scenario::parse("o.toml", text) {
        Err(ScenarioError::Invalid { field, .. }) => field,
        other => panic!("expected an invalid field, got {other:?}"),
    }
}

#[test]
fn objectives_parse_and_round_trip() {
    let s = Scenario::parse(
        "o.toml",
        &with_objectives("p99_latency_s = 2.5\nimpaired_requests_max = 3"),
    )
    .unwrap();
    assert_eq!(s.objectives.p99_latency_s, Some(2.5));
    assert_eq!(s.objectives.impaired_requests_max, Some(3));
    assert_eq!(s.objectives.failed_fraction_max, None);
    assert_eq!(Scenario::parse("again.toml", &s.to_toml()).unwrap(), s);
    // No objectives: nothing written back.
    let plain = Scenario::parse("o.toml", SMALL).unwrap();
    assert!(!plain.to_toml().contains("objectives"));
}

#[test]
fn bad_objectives_are_refused_naming_the_field() {
    assert_eq!(
        invalid_field(&with_objectives("failed_fraction_max = 1.5")),
        "objectives.failed_fraction_max"
    );
    assert_eq!(
        invalid_field(&with_objectives("p99_latency_s = -1")),
        "objectives.p99_latency_s"
    );
    assert_eq!(
        invalid_field(&with_objectives("goodput_recovery_s = nan")),
        "objectives.goodput_recovery_s"
    );
    assert_eq!(
        invalid_field(&with_objectives("amplification_max = inf")),
        "objectives.amplification_max"
    );
    // Unknown and mistyped fields are parse errors naming the field.
    for (text, field) in [
        ("p99_latency = 1", "p99_latency"),
        ("impaired_requests_max = -1", "impaired_requests_max"),
    ] {
        match Scenario::parse("o.toml", &with_objectives(text)) {
            Err(ScenarioError::Parse { message, .. }) => assert!(message.contains(field), "{message}"),
            other => panic!("expected a parse error for {text}, got {other:?}"),
        }
    }
}

#[test]
fn a_bad_objective_exits_2_through_the_cli_naming_field_and_line() {
    let path = temp_file(
        "bad.toml",
        &with_objectives("p99_latency_s = 1\nfailed_fraction_max = 2"),
    );
    let out = bin().arg("run").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    // SMALL takes 9 lines (the first empty); the header is line 10.
    assert!(err.contains("line 12: field `objectives.failed_fraction_max`"), "{err}");
}

#[test]
fn met_objectives_exit_0_and_print_their_verdicts_after_the_invariants() {
    // No fault: nothing reaches an impaired server, and there is no
    // recovery to time.
    let path = temp_file(
        "met.toml",
        &with_objectives("impaired_requests_max = 0\ngoodput_recovery_s = 5"),
    );
    let json = path.with_extension("json");
    let out = bin()
        .args(["run", path.to_str().unwrap(), "--json", json.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let (invariants, objectives) = (text.find("invariants:").unwrap(), text.find("objectives:").unwrap());
    assert!(invariants < objectives, "{text}");
    assert!(text.contains("impaired_requests_max  met — 0 (target ≤ 0)"), "{text}");
    assert!(
        text.contains("goodput_recovery_s     n/a (no fault, so nothing to recover from)"),
        "{text}"
    );
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let o = &report["objectives"];
    assert_eq!(o[0]["name"], "goodput_recovery_s");
    assert_eq!(o[0]["verdict"], "not_applicable");
    assert_eq!(o[1]["name"], "impaired_requests_max");
    assert_eq!(o[1]["verdict"], "met");
    assert_eq!(o[1]["measured"], 0.0);
    assert_eq!(report["figures"]["impaired_requests"], 0);
    assert_eq!(report["figures"]["goodput_recovery"]["state"], "no_fault");
}

#[test]
fn without_objectives_the_report_has_no_objectives_block() {
    let path = temp_file("plain.toml", SMALL);
    let json = path.with_extension("json");
    let out = bin()
        .args(["run", path.to_str().unwrap(), "--json", json.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!text.contains("objectives:"), "{text}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(report.get("objectives").is_none());
    assert!(report["figures"]["latency_p99_s"].is_number());
}

#[test]
fn a_missed_objective_exits_5() {
    // Every call takes at least one tick: a 1 ms p99 cannot be met.
    let path = temp_file("missed.toml", &with_objectives("p99_latency_s = 0.001"));
    let out = bin().arg("run").arg(&path).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(5), "{text}");
    assert!(text.contains("p99_latency_s          MISSED — "), "{text}");
    assert!(text.contains("accounting             held"), "{text}");
}

#[test]
fn a_failed_invariant_wins_over_a_missed_objective() {
    // A server that answers 500 from 10 s to the end: liveness fails, and
    // goodput never recovers either.
    let crashed = format!("{ONE_WORKER}{ERRORS_TO_THE_END}[objectives]\ngoodput_recovery_s = 60\n");
    let path = temp_file("crashed.toml", &crashed);
    let out = bin().arg("run").arg(&path).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("liveness               VIOLATED"), "{text}");
    assert!(text.contains("goodput_recovery_s     MISSED — no 5 s window"), "{text}");
}

#[test]
fn sweep_prints_distributions_and_pass_rates_and_exits_5_on_a_missed_objective() {
    let path = temp_file(
        "sweep.toml",
        &with_objectives("p99_latency_s = 0.001\nimpaired_requests_max = 0"),
    );
    let json = path.with_extension("json");
    let out = bin()
        .args([
            "sweep",
            path.to_str().unwrap(),
            "--seeds",
            "1..4",
            "--json",
            json.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(5), "{text}");
    assert!(text.contains("0 of 3 seeds failed"), "{text}");
    assert!(text.contains("3 of 3 seeds missed an objective"), "{text}");
    assert!(
        text.contains("distribution over 3 seeds (min / median / p95 / max):"),
        "{text}"
    );
    assert!(text.contains("  impaired_requests      0 / 0 / 0 / 0\n"), "{text}");
    assert!(text.contains("  latency_p99_s          "), "{text}");
    // No fault in any seed: no recovery time to spread.
    assert!(!text.contains("goodput_recovery_s"), "{text}");
    assert!(text.contains("  invariant accounting             3/3\n"), "{text}");
    assert!(text.contains("  objective p99_latency_s          0/3\n"), "{text}");
    assert!(text.contains("  objective impaired_requests_max  3/3\n"), "{text}");
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(summary["seeds"], 3);
    assert_eq!(summary["figures"]["impaired_requests"]["max"], 0.0);
    // In `Objectives` field order: impaired requests, then p99 latency.
    assert_eq!(summary["objectives"][1]["name"], "p99_latency_s");
    assert_eq!(summary["objectives"][1]["passed"], 0);
    assert_eq!(summary["objectives"][1]["seeds"], 3);
}

#[test]
fn a_sweep_that_meets_every_objective_exits_0() {
    let path = temp_file("sweep-ok.toml", &with_objectives("impaired_requests_max = 0"));
    let out = bin()
        .args(["sweep", path.to_str().unwrap(), "--seeds", "1..3"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!text.contains("missed an objective"), "{text}");
    assert!(text.contains("  objective impaired_requests_max  2/2\n"), "{text}");
}

/// The trust issue's first defect: with a drawn reload, goodput recovery
/// was counted from the longest load a draw may take (61 + 30·e^(4·0.45) ≈
/// 242 s) rather than from when this run's server was ready, so the
/// objective read "met — 0 s" beside an episode back 19 s after ready.
#[test]
fn goodput_recovery_counts_from_the_instant_this_runs_server_loaded() {
    use redstring_sim::evidence::trace::Kind;
    use redstring_sim::judgement::report::Report;

    let text = r#"
name = "drawn-reload"
seed = 3
duration_s = 300
[hardening]
rpm = 600
failure_threshold = 3
recovery_timeout_s = 10
request_timeout_s = 5
[[servers]]
name = "gpu"
slots = 8
reload = { dist = "lognormal", median = 30, sigma = 0.45 }
[[workers]]
name = "w"
count = 4
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 60 }]
[[faults]]
kind = "crash"
at_s = 60
server = "gpu"
[[faults]]
kind = "restart"
at_s = 61
server = "gpu"
[objectives]
goodput_recovery_s = 60
"#;
    let scenario = Scenario::parse("drawn-reload.toml", text).unwrap();
    let run = redstring_sim::campaign::simulate(&scenario, scenario.seed).unwrap();
    let loaded: Vec<u64> = run
        .events
        .iter()
        .filter(|e| &*e.host == "gpu" && matches!(e.kind, Kind::Loaded) && e.t_us >= 61_000_000)
        .map(|e| e.t_us)
        .collect();
    let [loaded] = loaded[..] else {
        panic!("one load after the restart, got {loaded:?}")
    };
    // Well before the longest draw, so the old instant was far off.
    assert!(loaded < 150_000_000, "loaded at {loaded} µs");
    let report = Report::new(&scenario, "drawn-reload.toml", &run);
    let episode = &report.figures.episodes[0];
    assert_eq!(episode.ready_s, Some(loaded as f64 / 1e6));
    // The run's figure and the episode's count from the same instant.
    let overall = report.figures.goodput_recovery.seconds();
    assert!(overall.is_some(), "{:?}", report.figures.goodput_recovery);
    assert_eq!(overall, episode.goodput_recovery.seconds());
    let verdict = &report.objectives[0];
    assert_eq!(verdict.name, "goodput_recovery_s");
    assert!(!verdict.missed(), "{verdict:?}");
}
