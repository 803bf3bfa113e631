//! `tune --shard i/n` and `merge`, rung by rung: a tune whose rungs ran in
//! shards, merged after each, prints and writes byte for byte what the tune
//! on one machine does.

use std::path::{Path, PathBuf};

use crate::support::{OUTAGE_OBJECTIVES, bin, outage, temp_file};

const NAME: &str = "tune-shard-outage";

/// Runs the binary; its exit code, stdout and stderr.
fn sim(args: &[String]) -> (Option<i32>, String, String) {
    let out = bin().args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

fn at(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// `tune` with `args` whole, then in `n` shards with a merge after every
/// rung: the same exit code, text and JSON. Returns the rounds it took.
fn whole_equals_sharded(tag: &str, args: &[&str], n: u64) -> usize {
    let path: PathBuf = temp_file(&format!("{tag}/outage.toml"), &outage(NAME, OUTAGE_OBJECTIVES));
    let dir = path.parent().unwrap().to_path_buf();
    let mut tune = strings(&["tune", path.to_str().unwrap()]);
    tune.extend(strings(args));
    let mut whole_args = tune.clone();
    whole_args.extend(["--json".into(), at(&dir, "whole.json")]);
    let whole = sim(&whole_args);
    assert!(matches!(whole.0, Some(0 | 5)), "{}{}", whole.1, whole.2);
    let whole_json = std::fs::read(dir.join("whole.json")).unwrap();
    let mut state: Option<String> = None;
    for round in 1..=8 {
        let mut parts = Vec::new();
        for i in 1..=n {
            let part = at(&dir, &format!("round-{round}-{i}.json"));
            let mut a = tune.clone();
            a.extend(["--shard".into(), format!("{i}/{n}"), "--json".into(), part.clone()]);
            if let Some(s) = &state {
                a.extend(["--resume".into(), s.clone()]);
            }
            let (code, text, err) = sim(&a);
            assert_eq!(code, Some(0), "{text}{err}");
            assert!(
                text.contains(&format!("shard {i}/{n}: ran ")),
                "round {round} shard {i}: {text}"
            );
            parts.push(part);
        }
        let merged_json = at(&dir, &format!("merged-{round}.json"));
        let mut m = strings(&["merge"]);
        // Given in reverse order.
        m.extend(parts.iter().rev().cloned());
        m.extend(["--json".into(), merged_json.clone()]);
        let merged = sim(&m);
        if merged.1.contains("is next") {
            assert_eq!(merged.0, Some(0), "{}{}", merged.1, merged.2);
            state = Some(merged_json);
            continue;
        }
        assert_eq!(merged.0, whole.0, "exit code");
        assert_eq!(merged.1, whole.1, "the merged text differs from the whole tune's");
        assert!(
            std::fs::read(&merged_json).unwrap() == whole_json,
            "the merged JSON differs from the whole tune's"
        );
        return round;
    }
    panic!("the sharded tune never finished");
}

#[test]
fn a_drawn_design_sharded_rung_by_rung_merges_into_the_whole_tune() {
    // 6 drawn candidates on 2 then 4 seeds: two rungs, two rounds.
    let rounds = whole_equals_sharded(
        "drawn",
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
            "3",
            "--jobs",
            "1",
        ],
        2,
    );
    assert_eq!(rounds, 2);
}

#[test]
fn a_grid_is_one_round_in_three_shards() {
    let rounds = whole_equals_sharded(
        "grid",
        &[
            "--vary",
            "hardening.failure_threshold=1,3",
            "--seeds",
            "2",
            "--jobs",
            "1",
        ],
        3,
    );
    assert_eq!(rounds, 1);
}

#[test]
fn a_round_missing_a_shard_or_resumed_into_another_tune_is_refused() {
    let path = temp_file("refused/outage.toml", &outage(NAME, OUTAGE_OBJECTIVES));
    let dir = path.parent().unwrap().to_path_buf();
    let p = path.to_str().unwrap();
    let args = |extra: &[&str]| {
        let mut a = strings(&[
            "tune",
            p,
            "--vary",
            "hardening.failure_threshold=1..8",
            "--vary",
            "hardening.recovery_timeout_s=1.0..15.0",
            "--budget",
            "6",
            "--seeds",
            "4",
            "--jobs",
            "1",
        ]);
        a.extend(strings(extra));
        a
    };
    // --shard needs --json.
    let (code, _, err) = sim(&args(&["--shard", "1/2"]));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--json"), "{err}");
    let one = at(&dir, "one.json");
    let two = at(&dir, "two.json");
    assert_eq!(sim(&args(&["--shard", "1/2", "--json", &one])).0, Some(0));
    assert_eq!(sim(&args(&["--shard", "2/2", "--json", &two])).0, Some(0));
    // One shard of the round alone.
    let (code, _, err) = sim(&strings(&["merge", &one]));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("shards missing: 2/2"), "{err}");
    // The state, resumed by a tune with another budget.
    let state = at(&dir, "state.json");
    let (code, text, err) = sim(&strings(&["merge", &one, &two, "--json", &state]));
    assert_eq!(code, Some(0), "{text}{err}");
    assert!(text.contains("rung 2 is next"), "{text}");
    let previous = at(&dir, "x.json");
    std::fs::write(&previous, "{\"previous\": \"round\"}").unwrap();
    let state_text = std::fs::read(&state).unwrap();
    let mut other = args(&["--shard", "1/2", "--json", &previous, "--resume", &state]);
    let budget = other.iter().position(|a| a == "6").unwrap();
    other[budget] = "7".into();
    let (code, _, err) = sim(&other);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--resume") && err.contains("--budget 7"), "{err}");
    // The refused round leaves its output and the state as they were.
    assert_eq!(std::fs::read_to_string(&previous).unwrap(), "{\"previous\": \"round\"}");
    assert_eq!(std::fs::read(&state).unwrap(), state_text);
    // A rung's state merged again without its round: incomplete.
    let (code, _, err) = sim(&strings(&["merge", &state]));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("of rung 2 of 2"), "{err}");
}
