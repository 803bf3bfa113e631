//! What the CLI reads from a user's files is read as written or refused
//! naming what to fix — the file, the line, the field — with exit 2, never a
//! panic, and every input left byte for byte as it was: trace files quoted
//! as RFC 4180 writes them, not UTF-8, or of the wrong shape; names that
//! would drive the terminal; settings that quietly do nothing (warnings,
//! which `--strict` refuses); fuzz bounds that draw invalid scenarios; and
//! errors that once named the wrong field.

use std::path::{Path, PathBuf};

use crate::support::{run, s, temp_file};

/// A short run replaying `calls.csv` (or whatever `file` names).
const REPLAYED: &str = r#"
name = "replayed"
duration_s = 20
[hardening]
max_tokens = 1000
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, replay = { file = "FILE" } }]
"#;

/// Writes raw `bytes` beside `near` as `name` and returns its path.
fn write_bytes(near: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = near.with_file_name(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Runs `args`, expects exit `code` with every one of `says` on stderr, and
/// every file in `inputs` as it was before.
fn expect(args: &[&str], code: i32, says: &[&str], inputs: &[&Path]) -> String {
    let before: Vec<Vec<u8>> = inputs.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let out = run(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let text = format!("{}{err}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(out.status.code(), Some(code), "{args:?}: {text}");
    assert!(!err.contains("panicked"), "{text}");
    for what in says {
        assert!(err.contains(what), "{args:?}: expected {what:?} in: {err}");
    }
    for (p, b) in inputs.iter().zip(before) {
        assert_eq!(std::fs::read(p).unwrap(), b, "{} was changed", p.display());
    }
    text
}

/// A scenario replaying a trace file `name` holding `bytes`.
fn replaying(dir: &str, name: &str, bytes: &[u8]) -> (PathBuf, PathBuf) {
    let scenario = temp_file(&format!("{dir}/replay.toml"), &REPLAYED.replace("FILE", name));
    let trace = write_bytes(&scenario, name, bytes);
    (scenario, trace)
}

const HEADER: &str = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n";

#[test]
fn a_trace_with_quoted_fields_is_read_as_rfc_4180_writes_them() {
    let csv = format!("{HEADER}2,\"Chat, GPT\",20,30,50,\"a \"\"quoted\"\" log\"\n3,ChatGPT,\"21\",31,52,API log\n");
    let (scenario, trace) = replaying("quoted", "calls.csv", csv.as_bytes());
    let text = expect(&["run", s(&scenario)], 0, &[], &[&scenario, &trace]);
    assert!(text.contains("replay:"), "{text}");
}

#[test]
fn a_trace_field_spanning_lines_is_refused_with_its_line() {
    let csv = format!("{HEADER}2,ChatGPT,20,30,50,\"a log\nthat goes on\"\n");
    let (scenario, trace) = replaying("spanning", "calls.csv", csv.as_bytes());
    expect(
        &["run", s(&scenario)],
        2,
        &[
            "workers[0].tenants[0].replay",
            "calls.csv: line 2",
            "field 6",
            "spanning lines",
        ],
        &[&scenario, &trace],
    );
}

#[test]
fn a_trace_that_is_not_utf8_is_refused_with_its_line() {
    let mut csv = format!("{HEADER}2,ChatGPT,20,30,50,API log\n3,Chat").into_bytes();
    csv.extend_from_slice(b"\xff\xfeGPT,20,30,50,API log\n");
    let (scenario, trace) = replaying("latin1", "calls.csv", &csv);
    expect(
        &["run", s(&scenario)],
        2,
        &["workers[0].tenants[0].replay", "calls.csv: line 3", "not UTF-8"],
        &[&scenario, &trace],
    );
    let jsonl =
        b"{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n{\"timestamp\": 5, \"note\": \"\xe9\"}\n";
    let (scenario, trace) = replaying("latin1", "calls.jsonl", jsonl);
    expect(
        &["run", s(&scenario)],
        2,
        &["calls.jsonl: line 2", "not UTF-8"],
        &[&scenario, &trace],
    );
}

#[test]
fn a_mooncake_row_that_is_an_array_is_refused() {
    let jsonl = b"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2}\n[1000, 10, 2]\n";
    let (scenario, trace) = replaying("array", "calls.jsonl", jsonl);
    expect(
        &["run", s(&scenario)],
        2,
        &["workers[0].tenants[0].replay", "calls.jsonl: line 2", "JSON object"],
        &[&scenario, &trace],
    );
}

#[test]
fn a_name_with_a_bidirectional_control_is_refused() {
    for c in ['\u{202E}', '\u{2066}', '\u{200F}', '\u{061C}'] {
        let text = REPLAYED
            .replace("name = \"replayed\"", &format!("name = \"ok{c}deyalper\""))
            .replace(
                "{ id = 1, replay = { file = \"FILE\" } }",
                "{ id = 1, calls_per_min = 6 }",
            );
        let scenario = temp_file("bidi/name.toml", &text);
        expect(
            &["run", s(&scenario)],
            2,
            &["line 2: field `name`", "bidirectional"],
            &[&scenario],
        );
    }
}

/// A plain scenario for the warnings: one group of two workers calling one
/// generic server.
const PLAIN: &str = r#"
name = "plain"
duration_s = 20
[[servers]]
name = "gpu"
[[workers]]
name = "worker"
count = 2
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 6 }]
"#;

/// Runs `text` with `--strict`, expecting it refused on the line written as
/// `line` naming `field` and saying `says`; without `--strict`, the same is
/// a warning and the run goes ahead.
fn strict_refuses(dir: &str, text: &str, line: &str, field: &str, says: &str) {
    let path = temp_file(&format!("{dir}/odd.toml"), text);
    let n = text
        .lines()
        .position(|l| l.trim() == line)
        .unwrap_or_else(|| panic!("{line:?} not in {text}"))
        + 1;
    let at = format!("line {n}: field `{field}`");
    expect(&["run", s(&path), "--strict"], 2, &[&at, says], &[&path]);
    expect(
        &["run", s(&path)],
        0,
        &[&format!("warning: {}: {at}", path.display())],
        &[&path],
    );
}

#[test]
fn a_tenant_listed_twice_in_one_group_is_warned_about() {
    let text = PLAIN.replace(
        "tenants = [{ id = 1, calls_per_min = 6 }]",
        "tenants = [\n  { id = 1, calls_per_min = 6 },\n  { id = 1, calls_per_min = 3 },\n]",
    );
    strict_refuses(
        "dup",
        &text,
        // An inline array's entries are found by the line of the array.
        "tenants = [",
        "workers[0].tenants[1].id",
        "listed twice",
    );
}

#[test]
fn a_burst_of_no_calls_is_warned_about() {
    let text = format!("{PLAIN}\n[[faults]]\nkind = \"burst\"\nat_s = 5\ntenant = 1\ncalls = 0\n");
    strict_refuses("burst0", &text, "calls = 0", "faults[0].calls", "0 calls fires nothing");
}

#[test]
fn a_heal_with_no_partition_before_it_is_warned_about() {
    let heal = "\n[[faults]]\nkind = \"heal\"\nat_s = 5\na = \"worker-0\"\nb = \"gpu\"\n";
    strict_refuses(
        "heal",
        &format!("{PLAIN}{heal}"),
        "kind = \"heal\"",
        "faults[0].kind",
        "does nothing",
    );
    // After a partition of the same link, either way round, it heals it.
    let partition = "\n[[faults]]\nkind = \"partition\"\nat_s = 2\na = \"gpu\"\nb = \"worker-0\"\n";
    let path = temp_file("heal/ok.toml", &format!("{PLAIN}{heal}{partition}"));
    expect(&["run", s(&path), "--strict"], 0, &[], &[&path]);
}

#[test]
fn a_link_fault_between_a_host_and_itself_is_warned_about() {
    for (kind, extra) in [("partition", ""), ("heal", ""), ("latency", "ms = 100\n")] {
        let text = format!("{PLAIN}\n[[faults]]\nkind = \"{kind}\"\nat_s = 5\na = \"gpu\"\nb = \"gpu\"\n{extra}");
        strict_refuses("self", &text, "b = \"gpu\"", "faults[0].b", "and itself does nothing");
    }
}

#[test]
fn a_tenant_that_starts_no_call_is_warned_about() {
    // 0.5 a minute on two workers over 20 s: a third of a call expected.
    let text = PLAIN.replace("calls_per_min = 6", "calls_per_min = 0.5");
    strict_refuses(
        "nocalls",
        &text,
        "tenants = [{ id = 1, calls_per_min = 0.5 }]",
        "workers[0].tenants[0].calls_per_min",
        "starts no call",
    );
    // A burst for it is calls.
    let burst = format!("{text}\n[[faults]]\nkind = \"burst\"\nat_s = 5\ntenant = 1\ncalls = 3\n");
    let path = temp_file("nocalls/burst.toml", &burst);
    expect(&["run", s(&path), "--strict"], 0, &[], &[&path]);
    // A replay whose requests all fall after the run.
    let csv = format!("{HEADER}50,ChatGPT,20,30,50,API log\n");
    let text = PLAIN.replace("calls_per_min = 6", "replay = { file = \"late.csv\" }");
    let scenario = temp_file("nocalls/replay.toml", &text);
    let trace = write_bytes(&scenario, "late.csv", csv.as_bytes());
    let n = text.lines().position(|l| l.contains("late.csv")).unwrap() + 1;
    expect(
        &["run", s(&scenario), "--strict"],
        2,
        &[
            &format!("line {n}: field `workers[0].tenants[0].replay`"),
            "starts no call",
        ],
        &[&scenario, &trace],
    );
}

#[test]
fn settings_a_per_worker_cache_ignores_are_warned_about() {
    for (text, line, field) in [
        (
            format!("{PLAIN}\n[hardening]\non_cache_unavailable = \"refuse\"\n"),
            "on_cache_unavailable = \"refuse\"",
            "hardening.on_cache_unavailable",
        ),
        (
            format!("{PLAIN}\n[hardening]\non_cache_error = \"refuse\"\n"),
            "on_cache_error = \"refuse\"",
            "hardening.on_cache_error",
        ),
        (
            format!("{PLAIN}\n[cache]\ntimeout_ms = 100\n"),
            "timeout_ms = 100",
            "cache.timeout_ms",
        ),
    ] {
        strict_refuses("cache", &text, line, field, "shared cache only");
        // With a shared cache they are what they say.
        let shared = if text.contains("[cache]") {
            text.replace("[cache]", "[cache]\nkind = \"shared\"")
        } else {
            format!("{text}\n[cache]\nkind = \"shared\"\n")
        };
        let path = temp_file("cache/shared.toml", &shared);
        expect(&["run", s(&path), "--strict"], 0, &[], &[&path]);
    }
}

#[test]
fn a_queue_or_slots_the_server_kind_ignores_is_warned_about() {
    let vllm = PLAIN.replace("name = \"gpu\"", "name = \"gpu\"\nkind = \"vllm\"");
    strict_refuses(
        "kind",
        &vllm.replace("kind = \"vllm\"", "kind = \"vllm\"\nqueue = 8"),
        "queue = 8",
        "servers[0].queue",
        "kind \"vllm\" ignores it",
    );
    strict_refuses(
        "kind",
        &vllm.replace("kind = \"vllm\"", "kind = \"vllm\"\nslots = 8"),
        "slots = 8",
        "servers[0].slots",
        "max_seqs",
    );
    // A generic server uses both.
    let path = temp_file(
        "kind/generic.toml",
        &PLAIN.replace("name = \"gpu\"", "name = \"gpu\"\nslots = 8\nqueue = 8"),
    );
    expect(&["run", s(&path), "--strict"], 0, &[], &[&path]);
}

#[test]
fn think_time_without_clients_is_warned_about() {
    let text = PLAIN.replace("calls_per_min = 6 }", "calls_per_min = 6, think_s = 5 }");
    strict_refuses(
        "think",
        &text,
        "tenants = [{ id = 1, calls_per_min = 6, think_s = 5 }]",
        "workers[0].tenants[0].think_s",
        "clients",
    );
}

#[test]
fn fuzz_bounds_that_would_draw_invalid_scenarios_are_refused_by_the_bound() {
    // Each bound in range, but 50 workers × 8 tenants × 60 000 calls a
    // minute is beyond what a scenario may ask of its fleet.
    let text = "workers = [1, 50]\ntenants = [1, 8]\ncalls_per_min = [1.0, 60000.0]\n";
    let bounds = temp_file("fuzzbounds/bounds.toml", text);
    let out_dir = bounds.with_file_name("regressions");
    expect(
        &[
            "fuzz",
            s(&bounds),
            "--cases",
            "4",
            "--shrink",
            "1",
            "--out",
            s(&out_dir),
        ],
        2,
        &["line 3: field `calls_per_min`", "600000"],
        &[&bounds],
    );
    assert!(!out_dir.exists(), "no regression is written");
    // Bounds the scenario check once allowed and the core then refused in
    // every drawn case: more probes than a breaker admits, and a first
    // delay whose eightfold cap is more than a day.
    for (text, says) in [
        (
            "half_open_max_calls = [1, 5000]\n",
            "max must be at most 1000, got 5000",
        ),
        (
            "initial_delay_s = [1.0, 20000.0]\n",
            "max must be at most 10800, got 20000",
        ),
    ] {
        let bounds = temp_file("fuzzbounds/core.toml", text);
        let field = text.split(' ').next().unwrap();
        expect(
            &["fuzz", s(&bounds), "--cases", "2", "--out", s(&out_dir)],
            2,
            &[&format!("line 1: field `{field}`"), says],
            &[&bounds],
        );
        assert!(!out_dir.exists(), "no regression is written");
    }
}

#[test]
fn a_nan_time_scale_is_named_as_the_time_scale() {
    // The service time it makes is NaN too; the field to fix is the scale.
    let text = PLAIN.replace("name = \"gpu\"", "name = \"gpu\"\nkind = \"vllm\"\ntime_scale = nan");
    let path = temp_file("fields/scale.toml", &text);
    let n = text.lines().position(|l| l == "time_scale = nan").unwrap() + 1;
    expect(
        &["run", s(&path)],
        2,
        &[&format!("line {n}: field `servers[0].time_scale`"), "got NaN"],
        &[&path],
    );
}

#[test]
fn a_prompt_that_takes_a_day_to_prefill_is_named_as_the_prompt() {
    let text = PLAIN.replace(
        "name = \"gpu\"",
        "name = \"gpu\"\nprefill_tokens_per_s = 0.01\nprompt_tokens = 4000",
    );
    let path = temp_file("fields/prompt.toml", &text);
    let n = text.lines().position(|l| l == "prompt_tokens = 4000").unwrap() + 1;
    expect(
        &["run", s(&path)],
        2,
        &[
            &format!("line {n}: field `servers[0].prompt_tokens`"),
            "at most 86400 s",
        ],
        &[&path],
    );
}

#[test]
fn a_negative_drift_bound_is_named_as_the_drift() {
    let bounds = temp_file("fields/bounds.toml", "max_clock_offset_ms = 10\nmax_drift_ppm = -5\n");
    expect(
        &["fuzz", s(&bounds), "--cases", "1"],
        2,
        &["line 2: field `max_drift_ppm`", "must not be negative, got -5"],
        &[&bounds],
    );
}

#[test]
fn a_behaviour_out_of_range_is_named_by_its_own_field() {
    let text = PLAIN.replace(
        "name = \"gpu\"",
        "name = \"gpu\"\nbehaviour = { mode = \"error\", probability = 2.0 }",
    );
    let path = temp_file("fields/behaviour.toml", &text);
    let n = text.lines().position(|l| l.starts_with("behaviour = ")).unwrap() + 1;
    expect(
        &["run", s(&path)],
        2,
        &[
            &format!("line {n}: field `servers[0].behaviour.probability`"),
            "between 0 and 1",
        ],
        &[&path],
    );
}

#[test]
fn a_worker_named_like_a_server_is_named_by_its_group() {
    let text = format!("{PLAIN}\n[[workers]]\nname = \"gpu\"\nservers = [\"gpu\"]\ntenants = []\n");
    let path = temp_file("fields/worker.toml", &text);
    let lines: Vec<&str> = text.lines().collect();
    let n = lines.iter().rposition(|l| *l == "name = \"gpu\"").unwrap() + 1;
    expect(
        &["run", s(&path)],
        2,
        &[&format!("line {n}: field `workers[1].name`"), "used twice"],
        &[&path],
    );
}

#[test]
fn too_many_servers_in_fuzz_bounds_is_named_as_the_servers() {
    let bounds = temp_file("fields/servers.toml", "workers = [1, 2]\nservers = [1, 9]\n");
    expect(
        &["fuzz", s(&bounds), "--cases", "1"],
        2,
        &["line 2: field `servers`", "at most 8, got 9"],
        &[&bounds],
    );
}

/// Values the scenario check once let through and the core's builders then
/// refused, ending as "simulation failed at 0.000 s" with no field: each is
/// now refused before the run, by its field and line, from the file and
/// from `--set` alike.
#[test]
fn values_the_core_refuses_are_named_by_their_field_before_the_run() {
    let base = REPLAYED.replace(
        "tenants = [{ id = 1, replay = { file = \"FILE\" } }]",
        "tenants = [{ id = 1, calls_per_min = 30 }]",
    );
    for (edit, field, says) in [
        (
            "half_open_max_calls = 5000",
            "hardening.half_open_max_calls",
            "between 1 and 1000, got 5000",
        ),
        (
            "max_delay_s = 200000",
            "hardening.max_delay_s",
            "at most 86400 s (one day)",
        ),
        (
            "initial_delay_s = 100000\nmax_delay_s = 200000",
            "hardening.initial_delay_s",
            "at most 86400 s (one day)",
        ),
    ] {
        let text = base.replace("max_tokens = 1000", &format!("max_tokens = 1000\n{edit}"));
        let path = temp_file("core/s.toml", &text);
        let first = edit.lines().next().unwrap();
        let line = text.lines().position(|l| l == first).unwrap() + 1;
        let err = expect(
            &["run", s(&path)],
            2,
            &[&format!("line {line}: field `{field}`"), says],
            &[&path],
        );
        assert!(!err.contains("simulation failed"), "{err}");
    }
    let text = base.replace("name = \"gpu\"", "name = \"gpu\"\nmodel = \"\"");
    let path = temp_file("core/model.toml", &text);
    expect(
        &["run", s(&path)],
        2,
        &["line 8: field `servers[0].model`", "non-empty"],
        &[&path],
    );
    // Through --set: refused before any seed runs (exit 2, not a failed
    // seed's exit 1).
    let path = temp_file("core/set.toml", &base);
    expect(
        &[
            "compare",
            s(&path),
            "--seeds",
            "1",
            "--set",
            "hardening.half_open_max_calls=2,5000",
        ],
        2,
        &[
            "with --set hardening.half_open_max_calls=5000",
            "field `hardening.half_open_max_calls`",
        ],
        &[&path],
    );
}

/// `--set` and `--vary` once quoted lines of the scenario as re-serialised
/// with the value set (line 5 of a file whose line 5 is something else):
/// an error about the value set names the argument and no line; one about
/// what the user wrote names the user's line; a warning points at the
/// user's line too (for an inline array, the array's line).
#[test]
fn set_and_vary_errors_name_the_argument_or_the_users_own_line() {
    let base = REPLAYED.replace(
        "tenants = [{ id = 1, replay = { file = \"FILE\" } }]",
        "tenants = [{ id = 1, calls_per_min = 30 }]",
    );
    let path = temp_file("setline/s.toml", &base);
    for (set, says) in [
        ("hardening.rpm=-5", "with --set hardening.rpm=-5: "),
        ("servers.0.slots=abc", "with --set servers.0.slots=abc: "),
        ("duration_s=-1", "field `duration_s`: must be positive"),
    ] {
        let err = expect(
            &["compare", s(&path), "--seeds", "1", "--set", set],
            2,
            &[says],
            &[&path],
        );
        assert!(!err.contains("line "), "{set}: a line of the re-serialised text: {err}");
        assert!(
            !err.contains(" | "),
            "{set}: a quoted line of the re-serialised text: {err}"
        );
    }
    let with_objective = temp_file(
        "setline/tune.toml",
        &format!("{base}[objectives]\nfailed_fraction_max = 0.5\n"),
    );
    let err = expect(
        &[
            "tune",
            s(&with_objective),
            "--seeds",
            "1",
            "--vary",
            "hardening.failure_threshold=0..3",
        ],
        2,
        &[
            "--vary hardening.failure_threshold: 0 is refused",
            "field `hardening.failure_threshold`",
        ],
        &[&with_objective],
    );
    assert!(!err.contains("line "), "{err}");
    // What the user wrote wrong is theirs, at their line.
    let wrong = temp_file(
        "setline/wrong.toml",
        &base.replace("duration_s = 20", "duration_s = -3"),
    );
    expect(
        &["compare", s(&wrong), "--seeds", "1", "--set", "hardening.rpm=50,60"],
        2,
        &["line 3: field `duration_s`"],
        &[&wrong],
    );
    // A warning about the user's inline array points at the array's line
    // in the user's file (line 11), as a plain run's does.
    let dup = base.replace(
        "tenants = [{ id = 1, calls_per_min = 30 }]",
        "tenants = [\n  { id = 1, calls_per_min = 30 },\n  { id = 1, calls_per_min = 30 },\n]",
    );
    let path = temp_file("setline/dup.toml", &dup);
    let err = expect(
        &["run", s(&path)],
        0,
        &["line 11: field `workers[0].tenants[1].id`"],
        &[&path],
    );
    assert!(err.contains("listed twice"), "{err}");
    let err = expect(
        &["compare", s(&path), "--seeds", "1", "--set", "hardening.rpm=50,60"],
        0,
        &["hardening.rpm=50: line 11: field `workers[0].tenants[1].id`"],
        &[&path],
    );
    assert!(!err.contains("line 13"), "{err}");
}

#[test]
fn a_health_check_timeout_llama_swap_raises_is_warned_about() {
    let text = PLAIN.replace(
        "name = \"gpu\"\n",
        "name = \"gpu\"\nkind = \"llama_swap\"\nhealth_check_timeout_s = 0\n",
    );
    strict_refuses(
        "healthcheck",
        &text,
        "health_check_timeout_s = 0",
        "servers[0].health_check_timeout_s",
        "raises it to 15 s",
    );
    let path = temp_file(
        "healthcheck/ok.toml",
        &text.replace("health_check_timeout_s = 0", "health_check_timeout_s = 15"),
    );
    expect(&["run", s(&path), "--strict"], 0, &[], &[&path]);
}

#[test]
fn a_cache_up_with_no_cache_down_before_it_is_warned_about() {
    let shared = format!("{PLAIN}[cache]\nkind = \"shared\"\n");
    let up = "[[faults]]\nkind = \"cache_up\"\nat_s = 5\n";
    strict_refuses(
        "cacheup",
        &format!("{shared}{up}"),
        "kind = \"cache_up\"",
        "faults[0].kind",
        "restarts it at once, losing every limiter count",
    );
    // After a cache_down it ends the outage; a second cache_up does not.
    let down = "[[faults]]\nkind = \"cache_down\"\nat_s = 3\n";
    let path = temp_file("cacheup/ok.toml", &format!("{shared}{down}{up}"));
    expect(&["run", s(&path), "--strict"], 0, &[], &[&path]);
    let again = "[[faults]]\nkind = \"cache_up\"\nat_s = 8\n";
    let path = temp_file("cacheup/twice.toml", &format!("{shared}{down}{up}{again}"));
    expect(&["run", s(&path), "--strict"], 2, &["field `faults[2].kind`"], &[&path]);
}
