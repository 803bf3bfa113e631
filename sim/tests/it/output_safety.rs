//! The CLI never destroys a user's file: an output that is an input (after
//! symlinks), or that two flags name, is refused before anything is written;
//! a command that fails leaves every existing file as it was; a seed range is
//! bounded and refused with the fix, never a panic or an allocation sized by
//! the flag; `check` does not follow a symlink loop.

use std::path::Path;
use std::process::Output;

use crate::support::{SMALL, bin, run, s, temp_file};

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts the command exits `code`, says `what`, and left `file` holding `before`.
fn refused(out: &Output, code: i32, what: &str, file: &Path, before: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert!(err.contains(what), "{err}");
    assert_eq!(
        std::fs::read_to_string(file).unwrap(),
        before,
        "{} was changed",
        file.display()
    );
}

#[test]
fn an_output_naming_the_scenario_is_refused_and_the_scenario_kept() {
    let path = temp_file("keep/base.toml", SMALL);
    for flag in ["--json", "--trace", "--svg", "--metrics"] {
        let out = run(&["run", s(&path), flag, s(&path)]);
        refused(&out, 4, "an input of this command", &path, SMALL);
    }
    let out = run(&["sweep", s(&path), "--seeds", "2", "--json", s(&path)]);
    refused(&out, 4, "an input of this command", &path, SMALL);
    for flag in ["--json", "--svg"] {
        let out = run(&["compare", s(&path), "--seeds", "2", flag, s(&path)]);
        refused(&out, 4, "an input of this command", &path, SMALL);
    }
    for flag in ["--out", "--json", "--svg"] {
        let out = run(&["tune", s(&path), "--vary", "hardening.rpm=5,10", flag, s(&path)]);
        refused(&out, 4, "an input of this command", &path, SMALL);
    }
    // Through a hard link to it: another name for the same file.
    #[cfg(unix)]
    {
        let hard = path.with_file_name("hard.json");
        let _ = std::fs::remove_file(&hard);
        std::fs::hard_link(&path, &hard).unwrap();
        let out = run(&["run", s(&path), "--json", s(&hard)]);
        refused(&out, 4, "an input of this command", &path, SMALL);
    }
    // Through a symlink to it.
    #[cfg(unix)]
    {
        let link = path.with_file_name("link.json");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let out = run(&["run", s(&path), "--json", s(&link)]);
        refused(&out, 4, "an input of this command", &path, SMALL);
    }
}

#[test]
fn an_output_naming_a_tenants_replay_file_is_refused() {
    let csv = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,m,10,10,20,Conversation log\n";
    let trace = temp_file("replay/calls.csv", csv);
    let scenario = temp_file(
        "replay/replay.toml",
        &SMALL.replace(
            "tenants = [{ id = 1, calls_per_min = 30 }]",
            "tenants = [{ id = 1, replay = { file = \"calls.csv\" } }]",
        ),
    );
    let out = run(&["run", s(&scenario), "--trace", s(&trace)]);
    refused(&out, 4, "an input of this command", &trace, csv);
}

#[test]
fn merge_and_fuzz_refuse_to_write_over_what_they_read() {
    let shard = temp_file("merge/shard.json", "{\"not\": \"a shard\"}");
    let out = run(&["merge", s(&shard), "--json", s(&shard)]);
    refused(&out, 4, "an input of this command", &shard, "{\"not\": \"a shard\"}");
    let bounds_text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/bounds/default.toml"))
            .unwrap();
    let bounds = temp_file("fuzz/bounds.toml", &bounds_text);
    let out = run(&["fuzz", s(&bounds), "--cases", "1", "--json", s(&bounds)]);
    refused(&out, 4, "an input of this command", &bounds, &bounds_text);
}

#[test]
fn a_failed_command_leaves_the_previous_report_as_it_was() {
    let old = temp_file("failed/old.json", "{\"previous\": \"report\"}");
    let bad = temp_file("failed/bad.toml", &SMALL.replace("duration_s = 20", "duration_s = -1"));
    let out = run(&["run", s(&bad), "--json", s(&old)]);
    refused(&out, 2, "duration_s", &old, "{\"previous\": \"report\"}");
    let out = run(&["run", s(&bad), "--metrics", s(&old)]);
    refused(&out, 2, "duration_s", &old, "{\"previous\": \"report\"}");
    let good = temp_file("failed/good.toml", SMALL);
    let out = run(&["compare", s(&good), "--seeds", "5..2", "--json", s(&old)]);
    refused(&out, 2, "the range is empty", &old, "{\"previous\": \"report\"}");
    let out = run(&[
        "tune",
        s(&good),
        "--vary",
        "hardening.rpm=5,10",
        "--resume",
        s(&old),
        "--json",
        s(&good),
    ]);
    refused(&out, 4, "an input of this command", &good, SMALL);
    // The likely slip: writing the next state over the one resumed from.
    let out = run(&[
        "tune",
        s(&good),
        "--vary",
        "hardening.rpm=5,10",
        "--resume",
        s(&old),
        "--json",
        s(&old),
    ]);
    refused(&out, 4, "an input of this command", &old, "{\"previous\": \"report\"}");
    let out = run(&["merge", s(&old), "--json", s(&old.with_file_name("joined.json"))]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(!old.with_file_name("joined.json").exists());
    // No temporary file is left beside the target either.
    let dir = std::fs::read_dir(old.parent().unwrap()).unwrap();
    let names: Vec<String> = dir
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".part")), "{names:?}");
}

#[test]
fn two_flags_naming_one_file_are_refused() {
    let path = temp_file("twice/s.toml", SMALL);
    let out_file = path.with_file_name("out.json");
    std::fs::write(&out_file, "old").unwrap();
    let out = run(&["run", s(&path), "--json", s(&out_file), "--trace", s(&out_file)]);
    refused(&out, 4, "name one file", &out_file, "old");
    let out = run(&["run", s(&path), "--trace", s(&out_file), "--metrics", s(&out_file)]);
    refused(&out, 4, "name one file", &out_file, "old");
    // tune would splice its pasteable TOML into its JSON.
    let out = run(&[
        "tune",
        s(&path),
        "--vary",
        "hardening.rpm=5,10",
        "--json",
        s(&out_file),
        "--out",
        s(&out_file),
    ]);
    refused(&out, 4, "name one file", &out_file, "old");
}

#[test]
fn a_written_report_replaces_the_old_one_whole() {
    let path = temp_file("whole/s.toml", SMALL);
    let json = path.with_file_name("report.json");
    std::fs::write(&json, "x".repeat(100_000)).unwrap();
    let out = run(&["run", s(&path), "--json", s(&json)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let written = std::fs::read_to_string(&json).unwrap();
    let report: serde_json::Value = serde_json::from_str(&written).unwrap();
    assert_eq!(report["scenario"], "small");
}

#[test]
fn huge_or_malformed_seed_ranges_are_refused_without_a_panic() {
    let path = temp_file("seeds/s.toml", SMALL);
    for (cmd, seeds) in [
        ("sweep", "0..18446744073709551615"),
        ("compare", "1..100000000"),
        ("sweep", "1..=18446744073709551615"),
    ] {
        let out = run(&[cmd, s(&path), "--seeds", seeds]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{cmd} {seeds}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(err.contains("--seeds"), "{err}");
    }
    for (seeds, says) in [
        ("18446744073709551615", "the last seed is beyond 2^64"),
        ("1000000", "above the most one command runs"),
    ] {
        let out = run(&["tune", s(&path), "--vary", "hardening.rpm=5,10", "--seeds", seeds]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(says), "{err}");
    }
}

#[test]
fn a_count_from_a_seed_and_either_range_mean_the_same_seeds() {
    let path = temp_file("same/s.toml", SMALL);
    let count = run(&["sweep", s(&path), "--seeds", "3", "--seed", "4"]);
    let range = run(&["sweep", s(&path), "--seeds", "4..7"]);
    let inclusive = run(&["sweep", s(&path), "--seeds", "4..=6"]);
    let text = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(count.status.code(), Some(0), "{}", stderr(&count));
    assert_eq!(text(&count), text(&range));
    assert_eq!(text(&count), text(&inclusive));
    assert!(text(&count).contains("of 3 seeds"), "{}", text(&count));
}

#[cfg(unix)]
#[test]
fn check_does_not_follow_a_symlink_loop() {
    let path = temp_file("loop/s.toml", SMALL);
    let dir = path.parent().unwrap();
    let link = dir.join("again");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(".", &link).unwrap();
    let out = run(&["check", s(dir)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert_eq!(text.matches("ok    ").count(), 1, "{text}");
    // /proc/self/task once never ended: each task's directory leads back
    // into the process's. It ends, with nothing to check.
    let mut child = bin()
        .args(["check", "/proc/self/task"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            panic!("check /proc/self/task ran for a minute");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(2));
}

/// The trust issue's third defect: `--set cache.kind=per_worker,shared`
/// silently changed what `rpm` means (per worker → fleet-wide), so the
/// shared cache's deferred calls read as a win. Each variant now prints its
/// load line and limiter scope, and the change of meaning is a warning
/// naming both.
#[test]
fn a_compare_that_changes_what_rpm_means_says_so_naming_both() {
    let fleet = SMALL.replace("name = \"w\"\n", "name = \"w\"\ncount = 4\n");
    let path = temp_file("scope/s.toml", &fleet);
    let out = run(&[
        "compare",
        s(&path),
        "--seeds",
        "2",
        "--set",
        "cache.kind=per_worker,shared",
    ]);
    let (text, err) = (String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        text.contains("cache.kind=per_worker:\n   rpm ")
            && text.contains("per worker (each worker's in-process cache)"),
        "{text}"
    );
    assert!(
        text.contains("cache.kind=shared:\n   rpm ") && text.contains("fleet-wide (one shared cache"),
        "{text}"
    );
    assert!(text.matches("   load gpu: offered").count() >= 2, "{text}");
    assert!(
        err.contains("warning: cache.kind=shared changes what hardening.rpm means against cache.kind=per_worker"),
        "{err}"
    );
    // Variants that agree on the cache get no such warning.
    let out = run(&[
        "compare",
        s(&path),
        "--seeds",
        "2",
        "--set",
        "hardening.failure_threshold=2,3",
    ]);
    assert!(
        !stderr(&out).contains("changes what hardening.rpm means"),
        "{}",
        stderr(&out)
    );
}

/// Several `--set`: every combination gets its load line, and each whose
/// cache changes what `rpm` means against the first is warned about by its
/// whole name.
#[test]
fn a_factorial_compare_prints_each_combinations_load_line_and_scope_warning() {
    let fleet = SMALL.replace("name = \"w\"\n", "name = \"w\"\ncount = 4\n");
    let path = temp_file("scope/factorial.toml", &fleet);
    let out = run(&[
        "compare",
        s(&path),
        "--seeds",
        "1",
        "--set",
        "cache.kind=per_worker,shared",
        "--set",
        "hardening.failure_threshold=2,3",
    ]);
    let (text, err) = (String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{err}");
    for cache in ["per_worker", "shared"] {
        for threshold in [2, 3] {
            let name = format!("cache.kind={cache} hardening.failure_threshold={threshold}");
            assert!(text.contains(&format!("{name}:\n   rpm ")), "{text}");
            let warned = format!(
                "warning: {name} changes what hardening.rpm means against cache.kind=per_worker hardening.failure_threshold=2"
            );
            assert_eq!(err.contains(&warned), cache == "shared", "{err}");
        }
    }
    assert!(text.matches("   load gpu: offered").count() >= 4, "{text}");
}

#[cfg(unix)]
#[test]
fn a_device_or_an_oversized_input_is_refused_before_it_is_read() {
    for args in [
        vec!["run", "/dev/zero"],
        vec!["fuzz", "/dev/urandom"],
        vec!["merge", "/dev/zero"],
    ] {
        let out = run(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("not a regular file"), "{args:?}: {err}");
    }
    // A FIFO with no writer is refused, not waited on.
    let fifo = temp_file("device/placeholder", "").with_file_name("fifo.toml");
    let _ = std::fs::remove_file(&fifo);
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let out = run(&["run", s(&fifo)]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("not a regular file"), "{err}");
    // A replayed trace that is a device.
    let scenario = temp_file(
        "device/replay.toml",
        &SMALL.replace(
            "tenants = [{ id = 1, calls_per_min = 30 }]",
            "tenants = [{ id = 1, replay = { file = \"/dev/zero\", format = \"burstgpt\" } }]",
        ),
    );
    let out = run(&["run", s(&scenario)]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("not a regular file"), "{err}");
    // Over the limit: refused naming the flag that raises it.
    let big = temp_file("device/big.toml", &format!("{SMALL}{}", "#\n".repeat(600_000)));
    let out = run(&["run", s(&big), "--max-input-mb", "1"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("above the input limit") && err.contains("--max-input-mb"),
        "{err}"
    );
    let out = run(&["run", s(&big), "--max-input-mb", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn a_key_deeper_than_any_field_is_refused_without_recursing() {
    let path = temp_file(
        "deep/s.toml",
        &format!("{SMALL}[objectives]\nfailed_fraction_max = 0.5\n"),
    );
    let deep = format!("{}=1", vec!["t"; 5000].join("."));
    let out = run(&["compare", s(&path), "--seeds", "1", "--set", &deep]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("5000 dotted steps"), "{err}");
    let out = run(&["tune", s(&path), "--vary", &deep]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("dotted steps"), "{err}");
}

#[test]
fn tune_refuses_to_vary_an_objective_and_never_calls_nothing_measured_met() {
    let path = temp_file(
        "tuneobj/s.toml",
        &format!("{SMALL}[objectives]\ngoodput_recovery_s = 10\n"),
    );
    let out = run(&["tune", s(&path), "--vary", "objectives.goodput_recovery_s=5,50"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("objectives are what the tune must meet"), "{err}");
    // No fault: goodput recovery is not applicable on every seed, so nothing
    // was measured and nothing can be said to meet it.
    let out = run(&[
        "tune",
        s(&path),
        "--vary",
        "hardening.failure_threshold=2,3",
        "--seeds",
        "2",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(5), "{text}{}", stderr(&out));
    assert!(!text.contains("meets every objective on all"), "{text}");
    assert!(
        text.contains("no recommendation: no objective was measured on any seed"),
        "{text}"
    );
    assert!(!text.contains("ready to paste"), "{text}");
}

#[test]
fn printed_names_and_commands_cannot_forge_lines_or_run_anything() {
    // A name with an ANSI escape or a newline is refused, naming the field.
    for name in ["\\u001b[2Jheld", "ok\\nliveness               held"] {
        let path = temp_file(
            "term/escape.toml",
            &SMALL.replace("name = \"small\"", &format!("name = \"{name}\"")),
        );
        let out = run(&["run", s(&path)]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("name") && err.contains("control characters"), "{err}");
    }
    // The replay command quotes a path a shell would split or run.
    let path = temp_file("term/a b;touch PWNED;.toml", SMALL);
    let out = run(&["run", s(&path)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        text.contains(&format!("replay: redstring-sim run '{}' --seed", path.display())),
        "{text}"
    );
}

#[test]
fn a_file_that_is_not_a_trace_is_never_echoed() {
    let secret = "root:$6$secretsalt$hash:19000:0:99999:7:::";
    let trace = temp_file("echo/shadow", &format!("{secret}\n"));
    let scenario = temp_file(
        "echo/replay.toml",
        &SMALL.replace(
            "tenants = [{ id = 1, calls_per_min = 30 }]",
            "tenants = [{ id = 1, replay = { file = \"shadow\", format = \"burstgpt\" } }]",
        ),
    );
    let out = run(&["run", s(&scenario)]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no \"Timestamp\" column"), "{err}");
    assert!(!err.contains("secretsalt"), "{err}");
    let _ = trace;
}

#[test]
fn a_setting_under_which_no_call_can_succeed_is_warned_about_naming_it() {
    for (edit, field) in [
        ("[hardening]\ndeadline_s = 0.01\n", "hardening.deadline_s"),
        ("[hardening]\ntokens_per_window = 10\n", "hardening.tokens_per_window"),
    ] {
        let path = temp_file(
            "hopeless/s.toml",
            &SMALL.replace("[[servers]]", &format!("{edit}[[servers]]")),
        );
        let out = run(&["run", s(&path)]);
        let err = stderr(&out);
        assert!(
            err.contains(&format!("field `{field}`")) && err.contains("no call"),
            "{field}: {err}"
        );
        let strict = run(&["run", s(&path), "--strict"]);
        assert_eq!(strict.status.code(), Some(2), "{}", stderr(&strict));
    }
    for (server, field) in [
        (
            "kind = \"llama_cpp\"\ncontext_tokens = 1\n",
            "servers[0].context_tokens",
        ),
        ("kind = \"vllm\"\nkv_tokens = 1\n", "servers[0].kv_tokens"),
        ("collapse_at = 0\n", "servers[0].collapse_at"),
    ] {
        let path = temp_file(
            "hopeless/k.toml",
            &SMALL.replace("name = \"gpu\"\n", &format!("name = \"gpu\"\n{server}")),
        );
        let out = run(&["run", s(&path), "--strict"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(&format!("field `{field}`")), "{field}: {err}");
    }
}

#[test]
fn tune_refuses_a_value_under_which_no_call_can_succeed() {
    let path = temp_file(
        "tunehope/s.toml",
        &format!("{SMALL}[objectives]\nfailed_fraction_max = 0.5\n"),
    );
    let out = run(&[
        "tune",
        s(&path),
        "--vary",
        "hardening.tokens_per_window=10,100000",
        "--seeds",
        "1",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--vary hardening.tokens_per_window: 10 is refused") && err.contains("no call is ever admitted"),
        "{err}"
    );
}

/// An output that is a device is written into, never renamed over: as
/// root, a rename replaced `/dev/full` (or `/dev/null`) with a regular
/// file. A full device fails the command with the reason, and every other
/// output is left as it was. The devices are made beside the test's files
/// (`mknod`, which needs root), never the system's own.
#[cfg(unix)]
#[test]
fn a_device_output_is_written_into_and_a_full_one_fails_leaving_the_rest() {
    use std::os::unix::fs::FileTypeExt as _;
    let path = temp_file("devices/s.toml", SMALL);
    let dir = path.parent().unwrap();
    let (full, null) = (dir.join("full"), dir.join("null"));
    for (node, minor) in [(&full, "7"), (&null, "3")] {
        let _ = std::fs::remove_file(node);
        let made = std::process::Command::new("mknod")
            .arg(node)
            .args(["c", "1", minor])
            .status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("SKIPPED: mknod is not permitted here (not root); device outputs untested");
            return;
        }
    }
    let old = path.with_file_name("old.json");
    std::fs::write(&old, "{\"previous\": \"report\"}").unwrap();
    let out = run(&["run", s(&path), "--json", s(&old), "--trace", s(&full)]);
    refused(&out, 4, "No space left on device", &old, "{\"previous\": \"report\"}");
    assert!(
        stderr(&out).contains(&format!("cannot write {}", full.display())),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), SMALL);
    let out = run(&["run", s(&path), "--json", s(&null)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for node in [&full, &null] {
        let kind = std::fs::metadata(node).unwrap().file_type();
        assert!(kind.is_char_device(), "{} was replaced by a file", node.display());
    }
    let names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".part")), "{names:?}");
}

/// `merge` as a process: a shard whose figures were forged, whose seed
/// range is inverted, or that holds a seed it does not own is refused (exit
/// 2) naming what is wrong, writing nothing and changing no shard.
#[test]
fn merge_refuses_forged_shards_and_changes_none() {
    let path = temp_file("forged/s.toml", SMALL);
    let (one, two) = (path.with_file_name("one.json"), path.with_file_name("two.json"));
    for (i, json) in [(1, &one), (2, &two)] {
        let out = run(&[
            "sweep",
            s(&path),
            "--seeds",
            "1..5",
            "--shard",
            &format!("{i}/2"),
            "--json",
            s(json),
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let honest = std::fs::read_to_string(&one).unwrap();
    let shard: serde_json::Value = serde_json::from_str(&honest).unwrap();
    let records = shard["per_seed"].as_array().unwrap().len();
    assert!(records > 0 && honest.contains("\"failed_fraction\""), "{honest}");
    let forged = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = shard.clone();
        f(&mut v);
        serde_json::to_string(&v).unwrap()
    };
    let joined = path.with_file_name("joined.json");
    for (text, says) in [
        (
            forged(&|v| v["per_seed"][0]["figures"]["failed_fraction"] = (-5.0).into()),
            "failed_fraction = -5",
        ),
        // An infinite p99 in a seed's record (JSON has no infinity: the
        // number is out of range).
        (
            {
                let at = honest.find("\"per_seed\"").unwrap();
                let (head, tail) = honest.split_at(at);
                format!(
                    "{head}{}",
                    tail.replacen("\"latency_p99_s\": ", "\"latency_p99_s\": 1e999, \"was\": ", 1)
                )
            },
            "not the --json of a sweep",
        ),
        (
            forged(&|v| v["seed_range"] = serde_json::json!([5, 1])),
            "not a range a command runs",
        ),
        (
            forged(&|v| v["seed_range"] = serde_json::json!([0, u64::MAX])),
            "not a range a command runs",
        ),
        (
            forged(&|v| v["per_seed"][0]["seed"] = 2.into()),
            "seed 2 is not one this shard runs",
        ),
        (
            forged(&|v| {
                v["per_seed"][0]["invariants"].as_array_mut().unwrap().pop();
            }),
            "not the registry's",
        ),
        (
            forged(&|v| v["preamble"] = "   load gpu: forged\n".into()),
            "load lines differ",
        ),
    ] {
        std::fs::write(&one, &text).unwrap();
        let out = run(&["merge", s(&one), s(&two), "--json", s(&joined)]);
        refused(&out, 2, says, &one, &text);
        assert!(!joined.exists(), "{says}: merge wrote {}", joined.display());
    }
}
