//! `--shard i/n` and `merge`: a sweep or comparison run in shards — separate
//! processes running at once — and merged prints and writes byte for byte
//! what the run on one machine does.

use std::path::{Path, PathBuf};

use crate::support::{bin, outage, temp_file};

/// `support::outage` with an objective that some seeds miss, so that
/// figures, pass rates and missed objectives all vary by seed.
fn scenario() -> String {
    outage("shard-outage", "[objectives]\ngoodput_recovery_s = 4\n")
}

/// Runs the binary; its exit code, stdout and the `--json` it wrote.
fn run(args: &[&str], json: &Path) -> (Option<i32>, String, Vec<u8>) {
    let out = bin().args(args).arg("--json").arg(json).output().unwrap();
    assert!(
        out.status.code().is_some_and(|c| c == 0 || c == 5),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        std::fs::read(json).unwrap(),
    )
}

fn file(dir: &Path, name: &str) -> PathBuf {
    dir.with_file_name(name)
}

/// `cmd` whole, then in `n` shards merged: the same exit code, text and JSON.
fn whole_equals_merged(cmd: &[&str], n: u64, tag: &str) {
    let path = temp_file(&format!("{tag}.toml"), &scenario());
    let p = path.to_str().unwrap();
    let mut args: Vec<&str> = cmd.to_vec();
    args.insert(1, p);
    let whole = run(&args, &file(&path, &format!("{tag}-whole.json")));
    // Every shard a process of its own, all running at once, as on a
    // cluster or under `xargs -P`.
    let running: Vec<(String, PathBuf, std::process::Child)> = (1..=n)
        .map(|i| {
            let spec = format!("{i}/{n}");
            let json = file(&path, &format!("{tag}-{i}.json"));
            let child = bin()
                .args(&args)
                .args(["--shard", spec.as_str(), "--json"])
                .arg(&json)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            (spec, json, child)
        })
        .collect();
    let mut shards = Vec::new();
    for (spec, json, child) in running {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.code().is_some_and(|c| c == 0 || c == 5),
            "shard {spec}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_ne!(
            String::from_utf8_lossy(&out.stdout),
            whole.1,
            "shard {spec} printed the whole result"
        );
        shards.push(json);
    }
    // Given in reverse order: merge puts the seeds back in order.
    let mut merge: Vec<String> = vec!["merge".into()];
    merge.extend(shards.iter().rev().map(|p| p.display().to_string()));
    let merge: Vec<&str> = merge.iter().map(String::as_str).collect();
    let merged = run(&merge, &file(&path, &format!("{tag}-merged.json")));
    assert_eq!(merged.0, whole.0, "exit code");
    assert_eq!(merged.1, whole.1, "the merged text differs from the whole run's");
    // The equality covers the crash's episode figures too.
    assert!(whole.1.contains("episode #1 gpu crash at 5.0 s"), "{}", whole.1);
    assert!(merged.2 == whole.2, "the merged JSON differs from the whole run's");
}

#[test]
fn a_sweep_in_shards_merges_into_the_whole_sweep() {
    whole_equals_merged(&["sweep", "--seeds", "1..8", "--jobs", "1"], 2, "sweep");
    whole_equals_merged(&["sweep", "--seeds", "3..8", "--jobs", "2"], 3, "sweep3");
}

#[test]
fn a_comparison_in_shards_merges_into_the_whole_comparison() {
    whole_equals_merged(
        &[
            "compare",
            "--seeds",
            "1..8",
            "--set",
            "hardening.failure_threshold=1,3",
            "--jobs",
            "1",
        ],
        2,
        "compare",
    );
}

#[test]
fn merge_refuses_an_incomplete_set_of_shards() {
    let path = temp_file("partial.toml", &scenario());
    let json = file(&path, "partial-1.json");
    let p = path.to_str().unwrap();
    run(&["sweep", p, "--seeds", "1..4", "--shard", "1/2"], &json);
    let out = bin().arg("merge").arg(&json).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("shards missing: 2/2"), "{err}");
    let out = bin().args(["sweep", p, "--shard", "3/2"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected i/n"));
}

#[test]
fn merge_refuses_shards_of_a_scenario_edited_between_them() {
    // The same file, its threshold changed between the two shards: the
    // load lines are the same, the settings are not.
    let path = temp_file("edited.toml", &scenario());
    let p = path.to_str().unwrap();
    let (one, two) = (file(&path, "edited-1.json"), file(&path, "edited-2.json"));
    run(&["sweep", p, "--seeds", "1..5", "--shard", "1/2"], &one);
    std::fs::write(
        &path,
        scenario().replace("failure_threshold = 3", "failure_threshold = 30"),
    )
    .unwrap();
    run(&["sweep", p, "--seeds", "1..5", "--shard", "2/2"], &two);
    let out = bin().arg("merge").arg(&one).arg(&two).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("was the scenario edited between shards?"), "{err}");
    // A comparison's shards likewise.
    std::fs::write(&path, scenario()).unwrap();
    let set = ["compare", p, "--seeds", "1..5", "--set", "hardening.max_retries=1,2"];
    run(&[&set[..], &["--shard", "1/2"]].concat(), &one);
    std::fs::write(
        &path,
        scenario().replace("recovery_timeout_s = 5", "recovery_timeout_s = 6"),
    )
    .unwrap();
    run(&[&set[..], &["--shard", "2/2"]].concat(), &two);
    let out = bin().arg("merge").arg(&one).arg(&two).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("was the scenario edited between shards?"), "{err}");
}
