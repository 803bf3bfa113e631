//! `redstring-sim tune`: refuses what it cannot tune, names a bad `--vary`,
//! prints the front, the recommendation and its TOML, and gives the same
//! result whatever the number of threads.

use crate::support::{OUTAGE_OBJECTIVES, bin, outage, temp_file};

const NAME: &str = "tune-outage";

fn tune(path: &std::path::Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = bin().arg("tune").arg(path).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_scenario_without_objectives_is_refused() {
    let path = temp_file("no-objectives.toml", &outage(NAME, ""));
    let (code, _, err) = tune(&path, &["--vary", "hardening.failure_threshold=1..3"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("no [objectives]") && err.contains("no-objectives.toml"),
        "{err}"
    );
}

#[test]
fn a_bad_vary_is_refused_naming_it() {
    let path = temp_file("bad-vary.toml", &outage(NAME, OUTAGE_OBJECTIVES));
    // A key the scenario does not have.
    let (code, _, err) = tune(&path, &["--vary", "hardening.failure_treshold=1..3"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--vary hardening.failure_treshold") && err.contains("unknown field"),
        "{err}"
    );
    // A range whose end validation refuses.
    let (code, _, err) = tune(&path, &["--vary", "hardening.rpm=0..5"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--vary hardening.rpm: 0 is refused") && err.contains("hardening.rpm"),
        "{err}"
    );
    // Not a spec at all.
    let (code, _, err) = tune(&path, &["--vary", "hardening.rpm=5..1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("lo is above hi"), "{err}");
    let (code, _, err) = tune(&path, &["--vary", "hardening.rpm=5..10", "--vary", "hardening.rpm=1,2"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("varied twice"), "{err}");
    // Numbers from outside that would exhaust memory or overflow.
    let (code, _, err) = tune(&path, &["--vary", "hardening.rpm=5..10", "--budget", "1000000000"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--budget 1000000000 is above"), "{err}");
    let (code, _, err) = tune(
        &path,
        &["--vary", "hardening.rpm=5..10", "--seed", "18446744073709551615"],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("the last seed is beyond 2^64"), "{err}");
}

#[test]
fn a_small_grid_is_searched_whole_and_the_recommendation_pasted() {
    let path = temp_file("grid.toml", &outage(NAME, OUTAGE_OBJECTIVES));
    let toml = path.with_file_name("grid-hardening.toml");
    let svg = path.with_file_name("grid-front.svg");
    let (code, text, err) = tune(
        &path,
        &[
            "--vary",
            "hardening.failure_threshold=1,3",
            "--vary",
            "hardening.recovery_timeout_s=2.0..4.0:2",
            "--seeds",
            "3",
            "--out",
            toml.to_str().unwrap(),
            "--svg",
            svg.to_str().unwrap(),
        ],
    );
    assert!(code == Some(0) || code == Some(5), "{text}{err}");
    assert!(text.contains("the full grid of 4 candidates"), "{text}");
    assert!(text.contains("rung 1: 4 candidates × 3 seeds"), "{text}");
    assert!(text.contains("Pareto front"), "{text}");
    assert!(
        text.contains("recommended settings, ready to paste:\n[hardening]"),
        "{text}"
    );
    // The written TOML is the printed one and parses, with a varied value
    // set and the scenario's other hardening kept.
    let written = std::fs::read_to_string(&toml).unwrap();
    assert!(text.contains(&written), "{written}");
    let table: toml::Table = toml::from_str(&written).unwrap();
    let threshold = table["hardening"]["failure_threshold"].as_integer().unwrap();
    assert!([1, 3].contains(&threshold), "{written}");
    let timeout = table["hardening"]["recovery_timeout_s"].as_float().unwrap();
    assert!([2.0, 4.0].contains(&timeout), "{written}");
    // The picture: both objectives' axes with units, the front and the
    // recommendation marked.
    let svg = std::fs::read_to_string(&svg).unwrap();
    for label in [
        "goodput_recovery_s: worst seed, seconds",
        "impaired_requests_max: worst seed, requests",
        "Pareto front",
        "recommended #",
        "4 candidates over 3 seeds",
    ] {
        assert!(svg.contains(label), "{label} not in the SVG");
    }
}

#[test]
fn threads_do_not_change_the_result_and_the_seed_fixes_it() {
    let path = temp_file("jobs.toml", &outage(NAME, OUTAGE_OBJECTIVES));
    let run = |jobs: &str, seed: &str, name: &str| {
        let json = path.with_file_name(name);
        let (code, text, err) = tune(
            &path,
            &[
                "--vary",
                "hardening.failure_threshold=1..8",
                "--vary",
                "hardening.recovery_timeout_s=1.0..15.0",
                "--budget",
                "6",
                "--seeds",
                "4",
                "--seed",
                seed,
                "--jobs",
                jobs,
                "--json",
                json.to_str().unwrap(),
            ],
        );
        assert!(code == Some(0) || code == Some(5), "{text}{err}");
        (text, std::fs::read(json).unwrap())
    };
    let one = run("1", "3", "jobs-1.json");
    let two = run("2", "3", "jobs-2.json");
    assert!(one.0.contains("a Latin hypercube of 6 candidates"), "{}", one.0);
    // Of the 4 the rank keeps (the floor), one is outclassed on the first
    // 2 seeds and stops; it is not replaced from the worse half.
    assert!(
        one.0.contains(
            "rung 1: 6 candidates × 2 seeds (12 simulations), 0 disqualified, 1 stopped as dominated, 3 kept"
        ),
        "{}",
        one.0
    );
    assert!(
        one.0.contains("rung 2: 3 candidates × 4 seeds (6 simulations)"),
        "{}",
        one.0
    );
    assert!(one.0.contains("18 simulations in all"), "{}", one.0);
    assert_eq!(one.0, two.0, "the text differs between --jobs 1 and --jobs 2");
    assert_eq!(one.1, two.1, "the JSON differs between --jobs 1 and --jobs 2");
    let v: serde_json::Value = serde_json::from_slice(&one.1).unwrap();
    assert_eq!(v["design"], "latin_hypercube");
    assert_eq!(v["candidates"].as_array().unwrap().len(), 6);
    assert!(v["recommended"].as_u64().is_some(), "{v}");
    // The simulations counted, and the recommendation explained.
    assert_eq!(v["simulations"], 18);
    assert_eq!(v["rungs"][0]["dominated"], 1);
    let why = &v["explanation"];
    assert!(why["binding"]["objective"].is_string(), "{why}");
    assert!(why["runner_up"]["id"].as_u64().is_some(), "{why}");
    assert_eq!(why["effects"]["seeds"], serde_json::json!([3, 5]));
    let settings = why["effects"]["settings"].as_array().unwrap();
    assert_eq!(settings.len(), 2);
    assert_eq!(settings[0]["key"], "hardening.failure_threshold");
    assert_eq!(settings[0]["step"], 1.0);
    assert!(one.0.contains("binding objective: "), "{}", one.0);
    assert!(one.0.contains("runner-up: #"), "{}", one.0);
    assert!(
        one.0.contains("  failure_threshold: +1 → goodput_recovery_s "),
        "{}",
        one.0
    );
    // Another seed draws another design.
    let other = run("2", "4", "jobs-seed-4.json");
    assert_ne!(one.1, other.1);
}
