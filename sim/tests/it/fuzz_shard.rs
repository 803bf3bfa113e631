//! `fuzz --shard i/n` and `merge`: a fuzz search run in shards and merged
//! prints, writes and exits as the search on one machine does — including
//! when the first failing case is in one shard and another shard fails
//! only later.

use std::path::{Path, PathBuf};

use crate::support::{bin, temp_file};

/// A tiny space: one server, one or two workers, short runs, crashes and
/// misbehaviour, so that a case simulates in a blink.
const TINY: &str = r#"
duration_s = [20, 40]
workers = [1, 2]
servers = [1, 1]
tenants = [1, 1]
calls_per_min = [5, 30]
max_retries = [0, 2]
fault_kinds = ["crash", "behave"]
max_faults = 2
"#;

/// What one invocation gave: its exit code, stdout, and the `--json` it wrote.
struct Ran {
    code: Option<i32>,
    text: String,
    json: Vec<u8>,
}

fn run(args: &[String], json: &Path) -> Ran {
    let out = bin().args(args).arg("--json").arg(json).output().unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ran {
        code: out.status.code(),
        text: String::from_utf8_lossy(&out.stdout).into_owned(),
        json: std::fs::read(json).unwrap(),
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

/// `fuzz` over the tiny space with `extra` arguments, whole and in `n`
/// shards merged: the same exit code, text and JSON, and the same failing
/// case written. Returns the whole run's text and each shard's.
fn whole_equals_merged(tag: &str, extra: &[&str], n: u64) -> (String, Vec<String>) {
    let bounds = temp_file(&format!("{tag}/tiny.toml"), TINY);
    let dir: PathBuf = bounds.parent().unwrap().to_path_buf();
    let out = dir.join("found");
    let mut args = strings(&["fuzz", bounds.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    args.extend(strings(extra));
    let whole = run(&args, &dir.join("whole.json"));
    let found: Vec<PathBuf> = std::fs::read_dir(&out)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    let written = found.first().map(|p| std::fs::read(p).unwrap());
    let _ = std::fs::remove_dir_all(&out);
    let mut shard_files = Vec::new();
    let mut shard_texts = Vec::new();
    for i in 1..=n {
        let mut a = args.clone();
        // Each shard writes its own failing case elsewhere.
        a[3] = dir.join(format!("shard-{i}")).display().to_string();
        a.extend(strings(&["--shard", &format!("{i}/{n}")]));
        let json = dir.join(format!("shard-{i}.json"));
        let ran = run(&a, &json);
        assert_ne!(ran.text, whole.text, "shard {i}/{n} printed the whole result");
        shard_texts.push(ran.text);
        shard_files.push(json);
    }
    // Given in reverse order, and writing where the whole run wrote.
    let mut merge = strings(&["merge"]);
    merge.extend(shard_files.iter().rev().map(|p| p.display().to_string()));
    merge.extend(strings(&["--out", out.to_str().unwrap()]));
    let merged = run(&merge, &dir.join("merged.json"));
    assert_eq!(merged.code, whole.code, "exit code");
    assert_eq!(merged.text, whole.text, "the merged text differs from the whole run's");
    assert!(
        merged.json == whole.json,
        "the merged JSON differs from the whole run's"
    );
    let found_again: Vec<PathBuf> = std::fs::read_dir(&out)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    assert_eq!(
        found_again, found,
        "the merge wrote the failing case as the whole run did"
    );
    assert_eq!(found_again.first().map(|p| std::fs::read(p).unwrap()), written);
    (whole.text, shard_texts)
}

#[test]
fn a_passing_search_in_shards_merges_into_the_whole_search() {
    let (whole, _) = whole_equals_merged("pass", &["--cases", "5", "--seed", "2"], 2);
    assert!(
        whole.contains("no case broke a claimed invariant in 5 cases"),
        "{whole}"
    );
    assert!(
        whole.starts_with("fuzz ") && whole.contains(": 5 simulations, seed 2\n"),
        "{whole}"
    );
}

/// With a known-bad hardening the search must fail: seed 1 first fails at
/// case 6 (shard 2 of 2), and shard 1 fails too, later, at case 7 — which
/// the merge must drop, as the whole search never ran it.
#[cfg(feature = "mutants")]
#[test]
fn the_merge_reports_the_first_failing_case_shrunk_as_one_machine_shrinks_it() {
    let (whole, shards) = whole_equals_merged(
        "fail",
        &["--cases", "8", "--seed", "1", "--shrink", "8", "--mutant", "no_jitter"],
        2,
    );
    assert!(
        whole.contains("FAILED (case 6 of 8): invariants failed: retry_jitter"),
        "{whole}"
    );
    assert!(whole.contains("smallest failing case: "), "{whole}");
    assert!(shards[0].contains("FAILED (case 7 of 8)"), "{}", shards[0]);
    assert!(shards[1].contains("FAILED (case 6 of 8)"), "{}", shards[1]);
}

#[test]
fn merge_refuses_a_fuzz_shard_of_another_search() {
    let bounds = temp_file("other/tiny.toml", TINY);
    let dir = bounds.parent().unwrap().to_path_buf();
    let p = bounds.to_str().unwrap();
    let a = dir.join("a.json");
    let b = dir.join("b.json");
    run(
        &strings(&["fuzz", p, "--cases", "2", "--seed", "1", "--shard", "1/2"]),
        &a,
    );
    run(
        &strings(&["fuzz", p, "--cases", "2", "--seed", "2", "--shard", "2/2"]),
        &b,
    );
    let out = bin().arg("merge").arg(&a).arg(&b).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("seed 2") && err.contains("b.json"), "{err}");
}
