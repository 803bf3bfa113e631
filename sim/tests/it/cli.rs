//! The `redstring-sim` binary: exit codes distinguish a bad scenario file from
//! an invariant failure, and errors name the file and the line.

use crate::support::{ERRORS_TO_THE_END, ONE_WORKER, SMALL, bin, llama_tools_or_skip, outage, temp_file};

#[test]
fn a_broken_scenario_exits_2_naming_file_and_line() {
    let path = temp_file(
        "broken.toml",
        &SMALL.replace("duration_s = 20", "duration_s = 20\nduraton_s = 1"),
    );
    let out = bin().arg("run").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("broken.toml") && err.contains("line 4") && err.contains("duraton_s"),
        "{err}"
    );
}

#[test]
fn a_healthy_run_exits_0_and_prints_its_replay_command() {
    let path = temp_file("small.toml", SMALL);
    let out = bin()
        .args(["run", path.to_str().unwrap(), "--seed", "4"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!("replay: redstring-sim run {} --seed 4", path.display())),
        "{text}"
    );
    assert!(text.contains("accounting             held"), "{text}");
}

#[test]
fn an_invariant_failure_exits_1() {
    // A server that answers 500 from 10 s to the end: no breaker closes
    // again after the last fault, and liveness fails.
    let crashed = format!("{ONE_WORKER}{ERRORS_TO_THE_END}");
    let path = temp_file("crashed.toml", &crashed);
    let out = bin().arg("run").arg(&path).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("liveness               VIOLATED"), "{text}");
    assert!(text.contains("rpm_per_window         held"), "{text}");
}

#[test]
fn a_skewed_caller_stamped_fleet_holds_its_bounds_and_prints_them() {
    // Callers stamping with clocks seconds apart on one caller-stamped shared
    // cache: a refused tenant's wait may grow and admissions may pass rpm,
    // each within the bound the report prints beside the measurement.
    let skewed = r#"
name = "skewed"
duration_s = 60
[hardening]
rpm = 10
window_s = 10
limiter_waits = 0
[cache]
kind = "shared"
time_source = "caller"
[[servers]]
name = "gpu"
slots = 8
[[workers]]
name = "behind"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 240 }]
clock = { offset_ms = -4000 }
[[workers]]
name = "ahead"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 240 }]
clock = { offset_ms = 4000 }
"#;
    let path = temp_file("skewed.toml", skewed);
    let out = bin().arg("run").arg(&path).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("rpm_per_window         held")
            && text.contains("bound 20: rpm 10 × 2 for a clock spread of 5.0 s"),
        "{text}"
    );
    assert!(
        text.contains("retry_after_monotone   held")
            && text.contains("15000 ms at most (a window plus the clocks' spread)"),
        "{text}"
    );
}

#[test]
fn json_trace_and_svg_outputs_are_written() {
    let path = temp_file("outputs.toml", SMALL);
    let dir = path.parent().unwrap();
    let (json, trace, svg) = (dir.join("r.json"), dir.join("t.jsonl"), dir.join("t.svg"));
    let out = bin()
        .arg("run")
        .arg(&path)
        .arg("--json")
        .arg(&json)
        .arg("--trace")
        .arg(&trace)
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["scenario"], "small");
    let lines = std::fs::read_to_string(&trace).unwrap();
    assert!(
        lines
            .lines()
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok())
    );
    assert!(lines.contains("\"ev\":\"call_end\""));
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
}

#[test]
fn sweep_lists_failing_seeds_with_their_replay_command() {
    let path = temp_file("sweep.toml", SMALL);
    let out = bin()
        .args(["sweep", path.to_str().unwrap(), "--seeds", "1..3"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("0 of 2 seeds failed"), "{text}");
    let bad = bin()
        .args(["sweep", path.to_str().unwrap(), "--seeds", "5..5"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn check_finds_scenarios_in_subdirectories_and_skips_bounds() {
    let dir = std::env::temp_dir().join(format!("redstring-sim-check-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("regressions")).unwrap();
    std::fs::create_dir_all(dir.join("bounds")).unwrap();
    std::fs::write(dir.join("regressions").join("small.toml"), SMALL).unwrap();
    std::fs::write(dir.join("bounds").join("default.toml"), "max_faults = 1\n").unwrap();
    let out = bin().arg("check").arg(&dir).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("ok    ") && text.contains("small.toml"), "{text}");
    assert!(!text.contains("default.toml"), "{text}");
}

#[test]
fn check_of_a_directory_without_scenarios_is_an_error() {
    let dir = std::env::temp_dir().join(format!("redstring-sim-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = bin().arg("check").arg(&dir).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no scenario files"), "{err}");
}

#[test]
fn fuzz_given_a_scenario_says_it_needs_a_bounds_file() {
    let path = temp_file("not-bounds.toml", SMALL);
    let out = bin().arg("fuzz").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not-bounds.toml") && err.contains("is a scenario") && err.contains("bounds file"),
        "{err}"
    );
}

#[test]
fn an_unwritable_output_is_an_io_error_before_the_run() {
    let path = temp_file("unwritable.toml", SMALL);
    for flag in ["--json", "--trace", "--svg"] {
        let out = bin()
            .arg("run")
            .arg(&path)
            .arg(flag)
            .arg("/nonexistent-dir/out")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(4), "{flag}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("cannot write /nonexistent-dir/out"), "{flag}: {err}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains("replay:"), "{flag}: checked before the run: {text}");
    }
}

#[test]
fn a_scenario_that_cannot_recover_is_not_applicable_for_liveness_and_exits_0() {
    // The server crashes and is never restarted: no configuration can bring
    // the calls back, so liveness says so instead of failing the run.
    let crashed = format!("{ONE_WORKER}[[faults]]\nkind = \"crash\"\nat_s = 10\nserver = \"gpu\"\n");
    let path = temp_file("never-restarted.toml", &crashed);
    let out = bin().arg("run").arg(&path).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(
            "liveness               not applicable (the scenario cannot recover: gpu crashed and is never restarted)"
        ),
        "{text}"
    );
    assert!(
        text.contains("gpu crash at 10.0 s, not ready again within the run"),
        "{text}"
    );
}

#[test]
fn compare_sets_variants_side_by_side_and_writes_json() {
    let path = temp_file("compare.toml", &outage("small", ""));
    let json = path.with_extension("json");
    let svg = path.with_extension("svg");
    let out = bin()
        .args(["compare", path.to_str().unwrap(), "--seeds", "1..4", "--jobs", "1"])
        .args([
            "--set",
            "hardening.failure_threshold=1,5",
            "--json",
            json.to_str().unwrap(),
            "--svg",
            svg.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("[1] hardening.failure_threshold=1"), "{text}");
    assert!(text.contains("[2] hardening.failure_threshold=5"), "{text}");
    assert!(text.contains("  latency_p50_s "), "{text}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["seeds"], serde_json::json!([1, 4]));
    assert_eq!(v["variants"].as_array().unwrap().len(), 2);
    assert_eq!(v["variants"][0][1]["seeds"], 3);
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(
        svg.contains("[2] hardening.failure_threshold=5") && svg.contains("latency_p99_s"),
        "{svg}"
    );
    // Every difference is of the second variant against the first, over at
    // most the three seeds.
    for d in v["differences"].as_array().unwrap() {
        assert_eq!(d["variant"], "hardening.failure_threshold=5");
        let n = d["higher"].as_u64().unwrap() + d["lower"].as_u64().unwrap() + d["ties"].as_u64().unwrap();
        assert!(n <= 3, "{d}");
    }
}

#[test]
fn compare_tests_each_priority_classs_figures_and_a_reserve_spares_the_high_class() {
    let json = temp_file("classes.toml", "").with_extension("json");
    let scenario = crate::support::scenarios_dir().join("priority-classes.toml");
    let out = bin()
        .args(["compare", scenario.to_str().unwrap(), "--seeds", "1..7", "--jobs", "1"])
        .args(["--set", "hardening.reserve=none,0.3", "--json", json.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("per priority class (how its calls fared):"), "{text}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let test = |class: &str, figure: &str| {
        v["differences"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["class"] == class && d["figure"] == figure)
            .unwrap_or_else(|| panic!("no {class} {figure} in {v}"))
            .clone()
    };
    // Every seed defers fewer high-priority calls with the reserve, and
    // more low-priority ones.
    let high = test("high", "deferred");
    assert_eq!(
        (high["lower"].as_u64(), high["holds"].as_bool()),
        (Some(6), Some(true)),
        "{high}"
    );
    let low = test("low", "deferred");
    assert_eq!(
        (low["higher"].as_u64(), low["holds"].as_bool()),
        (Some(6), Some(true)),
        "{low}"
    );
    assert!(high["server"].is_null() && high["episode"].is_null(), "{high}");
}

#[test]
fn compare_of_two_files_names_each() {
    let a = temp_file("a.toml", &outage("small", ""));
    let b = temp_file(
        "b.toml",
        &outage("small", "").replace("failure_threshold = 3", "failure_threshold = 1"),
    );
    let out = bin()
        .args(["compare", a.to_str().unwrap(), b.to_str().unwrap(), "--seeds", "1..3"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains(&format!("[1] {}", a.display())), "{text}");
    assert!(text.contains(&format!("[2] {}", b.display())), "{text}");
}

#[test]
fn a_bad_set_is_refused_naming_the_key() {
    let path = temp_file("set.toml", &outage("small", ""));
    let run = |set: &str| {
        let out = bin()
            .args(["compare", path.to_str().unwrap(), "--seeds", "1..2", "--set", set])
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run("hardening.failure_treshold=1,2");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--set hardening.failure_treshold=1") && err.contains("failure_treshold"),
        "{err}"
    );
    let (code, err) = run("name.first=1");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--set name.first: \"first\" is not a table"), "{err}");
    let (code, err) = run("hardening.rpm");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("expected key=value"), "{err}");
    // A value validation refuses names the field, as for a file.
    let (code, err) = run("hardening.rpm=0");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("hardening.rpm"), "{err}");
}

/// The `--json` (written to `json`) of `compare FILE --seeds 1..3 --jobs 1`
/// with `sets` as `--set` flags, and its text.
fn compare_json(file: &std::path::Path, sets: &[&str], json: &std::path::Path) -> (serde_json::Value, String) {
    let mut cmd = bin();
    cmd.args(["compare", file.to_str().unwrap(), "--seeds", "1..3", "--jobs", "1"]);
    for set in sets {
        cmd.args(["--set", set]);
    }
    let out = cmd.args(["--json", json.to_str().unwrap()]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    (v, text)
}

#[test]
fn a_factorial_compare_runs_each_combination_as_one_axis_compares_do() {
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/flaky-network.toml");
    let text = std::fs::read_to_string(&shipped).unwrap();
    let (thresholds, timeouts) = (["1", "3"], ["10", "30"]);
    let dir = temp_file("factorial/empty", "").parent().unwrap().to_path_buf();
    let (both, out) = compare_json(
        &shipped,
        &["hardening.failure_threshold=1,3", "hardening.recovery_timeout_s=10,30"],
        &dir.join("both.json"),
    );
    // Every combination, the first --set varying slowest, in one table.
    let names: Vec<&str> = both["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v[0].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "hardening.failure_threshold=1 hardening.recovery_timeout_s=10",
            "hardening.failure_threshold=1 hardening.recovery_timeout_s=30",
            "hardening.failure_threshold=3 hardening.recovery_timeout_s=10",
            "hardening.failure_threshold=3 hardening.recovery_timeout_s=30",
        ]
    );
    for (i, name) in names.iter().enumerate() {
        assert!(out.contains(&format!("  [{}] {name}\n", i + 1)), "{out}");
        // Each combination's load line.
        assert!(out.contains(&format!("{name}:\n   rpm ")), "{out}");
    }
    // Every later combination is compared with the first.
    for d in both["differences"].as_array().unwrap() {
        assert_ne!(d["variant"], names[0], "{d}");
    }
    // Each combination's seeds are those of the one-axis compare over the
    // second key of the file with the first key set to that value.
    for (a, threshold) in thresholds.iter().enumerate() {
        let fixed =
            redstring_sim::judgement::compare::set_field(&text, "hardening.failure_threshold", threshold).unwrap();
        let file = temp_file(&format!("factorial/threshold-{threshold}.toml"), &fixed);
        let (one, _) = compare_json(
            &file,
            &["hardening.recovery_timeout_s=10,30"],
            &dir.join(format!("threshold-{threshold}.json")),
        );
        for (b, timeout) in timeouts.iter().enumerate() {
            let single = &one["variants"][b][1]["per_seed"];
            let combined = &both["variants"][a * 2 + b][1]["per_seed"];
            assert_eq!(single.as_array().unwrap().len(), 2, "{single}");
            assert_eq!(
                single, combined,
                "failure_threshold={threshold} recovery_timeout_s={timeout}"
            );
        }
    }
}

#[test]
fn a_factorial_compare_refuses_a_repeated_key_too_many_variants_or_several_files() {
    let path = temp_file("refuse/set.toml", &outage("small", ""));
    let other = temp_file("refuse/other.toml", &outage("small", ""));
    let run = |files: &[&std::path::Path], sets: &[&str]| {
        let mut cmd = bin();
        cmd.arg("compare").args(files).args(["--seeds", "1..2"]);
        for set in sets {
            cmd.args(["--set", set]);
        }
        let out = cmd.output().unwrap();
        assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run(
        &[&path],
        &[
            "hardening.failure_threshold=1,2",
            "hardening.rpm=30",
            "hardening.failure_threshold=3",
        ],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--set hardening.failure_threshold is given twice"),
        "{err}"
    );
    let many = |key: &str| format!("{key}={}", (1..=9).map(|i| i.to_string()).collect::<Vec<_>>().join(","));
    let (code, err) = run(
        &[&path],
        &[
            &many("hardening.failure_threshold"),
            &many("hardening.recovery_timeout_s"),
        ],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("9 × 9 values make 81 variants, more than the 64 one compare runs"),
        "{err}"
    );
    let (code, err) = run(
        &[&path, &other],
        &["hardening.failure_threshold=1,2", "hardening.rpm=30,60"],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--set varies one scenario; 2 were given"), "{err}");
    // A combination validation refuses is named whole.
    let (code, err) = run(&[&path], &["hardening.failure_threshold=1,2", "hardening.rpm=60,0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("with --set hardening.failure_threshold=1 --set hardening.rpm=0:")
            && err.contains("hardening.rpm"),
        "{err}"
    );
}

/// A failing seed of a `--set` variant is replayed by a command to paste:
/// `run` does not take `--set`, so the compare of that one variant over
/// that one seed, which fails the same way.
#[test]
fn a_failing_seed_of_a_set_variant_prints_a_replay_that_runs() {
    let crashed = format!("{ONE_WORKER}{ERRORS_TO_THE_END}");
    let path = temp_file("replay/crashed.toml", &crashed);
    let file = path.to_str().unwrap();
    let out = bin()
        .args(["compare", file, "--seeds", "1", "--jobs", "1"])
        .args(["--set", "hardening.failure_threshold=2,3", "--set", "hardening.rpm=60"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let replay = format!(
        "redstring-sim compare {file} --set hardening.failure_threshold=3 --set hardening.rpm=60 --seeds 1..=1"
    );
    assert!(
        err.contains(&format!(
            "hardening.failure_threshold=3 hardening.rpm=60 seed 1: liveness\n    replay: {replay}\n"
        )),
        "{err}"
    );
    let words: Vec<&str> = replay.split(' ').collect();
    assert_eq!(words[0], "redstring-sim");
    let again = bin().args(&words[1..]).output().unwrap();
    let text = String::from_utf8_lossy(&again.stdout);
    assert_eq!(again.status.code(), Some(1), "{text}");
    assert!(
        text.contains("[1] hardening.failure_threshold=3 hardening.rpm=60\n"),
        "{text}"
    );
    // A file's failing seed is replayed by `run`.
    let out = bin().args(["compare", file, "--seeds", "1"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "seed 1: liveness\n    replay: redstring-sim run {file} --seed 1\n"
        )),
        "{err}"
    );
}

#[test]
fn jobs_do_not_change_the_results() {
    let path = temp_file("jobs.toml", &outage("small", ""));
    let json = |cmd: &[&str], jobs: &str, name: &str| {
        let out_file = path.with_file_name(name);
        let out = bin()
            .args(cmd)
            .arg(&path)
            .args(["--seeds", "1..5", "--jobs", jobs, "--json", out_file.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        std::fs::read(out_file).unwrap()
    };
    let one = json(&["sweep"], "1", "sweep-1.json");
    let three = json(&["sweep"], "3", "sweep-3.json");
    assert!(!one.is_empty());
    assert_eq!(one, three, "sweep --jobs 3 differs from --jobs 1");
    let set = ["compare", "--set", "hardening.failure_threshold=1,3"];
    let one = json(&set, "1", "compare-1.json");
    let three = json(&set, "3", "compare-3.json");
    assert_eq!(one, three, "compare --jobs 3 differs from --jobs 1");
}

#[test]
fn a_run_estimated_past_max_wall_is_refused_with_the_estimate_and_the_flag() {
    // A day of 1 ms steps: 86 million steps over two hosts.
    let day = SMALL.replace("duration_s = 20", "duration_s = 86400\ntick_ms = 1");
    let path = temp_file("day-of-1ms.toml", &day);
    let json = path.with_extension("json");
    let out = bin()
        .args(["run", path.to_str().unwrap(), "--json", json.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("would take about")
            && err.contains("more than --max-wall 60 s")
            && err.contains("pass --max-wall"),
        "{err}"
    );
    assert!(!json.exists(), "a refused run writes nothing");
    let out = bin()
        .args(["run", path.to_str().unwrap(), "--max-wall", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "no run may take no time at all");
}

#[test]
fn calibrate_against_nothing_listening_says_every_request_failed_and_writes_nothing() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out_file = temp_file("calibrated.toml", "kept\n");
    let out = bin()
        .args(["calibrate", "--base-url", &format!("http://127.0.0.1:{port}/v1")])
        .args(["--max-concurrency", "1", "--requests-per-client", "2", "--out"])
        .arg(&out_file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("2 of 2 requests failed"), "{err}");
    assert!(err.contains("nothing to fit"), "{err}");
    assert_eq!(std::fs::read_to_string(&out_file).unwrap(), "kept\n");
}

#[test]
fn calibrate_refuses_a_plan_out_of_range_naming_its_flag() {
    let out = bin()
        .args([
            "calibrate",
            "--base-url",
            "http://127.0.0.1:9",
            "--requests-per-client",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--requests-per-client must be 2 to 1000, got 1"), "{err}");
}

#[test]
fn lab_refuses_a_scenario_it_cannot_run_for_real_naming_the_field() {
    // A generic server is the simulator's model, not a real server.
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/container-restart.toml");
    let out = bin().arg("lab").arg(shipped).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("field `servers[0].kind`"), "{err}");
    assert!(err.contains("llama_cpp"), "{err}");
}

/// `calibrate --samples` writes each request it timed beside the latency
/// the fitted step predicts for it.
#[test]
fn calibrate_writes_each_timed_request_beside_its_prediction() {
    use redstring_sim::lab::llama::{LlamaServer, LlamaSpec};
    let Some(tools) = llama_tools_or_skip() else { return };
    let spec = LlamaSpec::lab(&tools, 2, 4096);
    let mut server = LlamaServer::start(&tools, &spec).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime
        .block_on(server.ready(std::time::Duration::from_secs(120)))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (csv, section) = (dir.path().join("samples.csv"), dir.path().join("gpu.toml"));
    let out = bin()
        .args([
            "calibrate",
            "--base-url",
            &server.base_url(),
            "--requests-per-client",
            "4",
        ])
        .arg("--samples")
        .arg(&csv)
        .arg("--out")
        .arg(&section)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    assert!(
        lines.next().unwrap().starts_with("concurrency,prompt_tokens,"),
        "{text}"
    );
    let rows: Vec<Vec<f64>> = lines
        .map(|l| l.split(',').map(|v| v.parse().unwrap()).collect())
        .collect();
    // Four requests alone, then four from each of two clients (2 slots).
    assert_eq!(rows.len(), 4 * (1 + 2), "{text}");
    assert!(rows.iter().all(|r| r[6] > 0.0 && r[7] > 0.0), "{text}");
    // llama.cpp says what it spent on each: its prompt, and the rest.
    assert!(
        rows.iter()
            .all(|r| r.len() == 11 && r[9] > 0.0 && r[10] >= 0.0 && r[9] + r[10] < r[6] * 1000.0),
        "{text}"
    );
    assert!(std::fs::read_to_string(&section).unwrap().contains("step_ms"));
}

/// A repetition run for real writes the trace a simulation writes, and
/// the calibration before it the scenario `run` reads.
#[test]
fn lab_writes_each_repetition_s_trace_and_calibrated_scenario() {
    if llama_tools_or_skip().is_none() {
        return;
    }
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/lab/crash-restart.toml");
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .arg("lab")
        .arg(&shipped)
        .args(["--seeds", "1", "--trace"])
        .arg(dir.path().join("real.jsonl"))
        .arg("--calibrated")
        .arg(dir.path().join("calibrated.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(dir.path().join("real-1.jsonl")).unwrap();
    let events: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let count = |ev: &str| events.iter().filter(|e| e["ev"] == ev).count();
    assert!(count("arrival") >= 20, "about 40 calls arrive");
    assert_eq!(count("fault"), 2);
    assert_eq!(count("arrival"), count("call_end"), "every call ends in the trace");
    assert!(!dir.path().join("real.jsonl").exists());
    let path = dir.path().join("calibrated-1.toml");
    let calibrated = redstring_sim::scenario::Scenario::load(&path).unwrap();
    let gpu = &calibrated.servers[0];
    assert!(gpu.step_ms.is_some() && gpu.cached_prompt_tokens.is_some(), "{gpu:?}");
    assert!(!dir.path().join("calibrated.toml").exists());
}

#[test]
fn lab_refuses_to_write_calibrations_it_would_not_take() {
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/lab/crash-restart.toml");
    let out = bin()
        .arg("lab")
        .arg(shipped)
        .args(["--no-calibrate", "--calibrated", "c.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--calibrated") && err.contains("--no-calibrate"), "{err}");
}
