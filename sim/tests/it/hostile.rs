//! Hostile values: numbers and names that once passed validation and then
//! panicked, overflowed or ran without bound. Each is now refused naming the
//! field and its line (exit 2), ends with a typed budget error (exit 3), or
//! runs to its end without a panic.

use crate::support::{bin, temp_file};

use redstring_sim::campaign::{simulate, simulate_within};
use redstring_sim::scenario::{Scenario, ScenarioError};
use redstring_sim::search::fuzz::Bounds;
use redstring_sim::world::{Budget, Resource, SimError};

const BASE: &str = r#"
name = "hostile"
duration_s = 20
[[servers]]
name = "gpu"
[[workers]]
name = "worker"
count = 2
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 30 }]
"#;

/// The line of `text` that is exactly `line`, 1-based.
fn line_of(text: &str, line: &str) -> usize {
    text.lines()
        .position(|l| l.trim() == line)
        .unwrap_or_else(|| panic!("{line:?} not in {text}"))
        + 1
}

/// Parses `text`, expecting a validation error for `field` on the line
/// written as `line`, whose message contains `message`.
fn refused(text: &str, field: &str, line: &str, message: &str) {
    match Scenario::parse("hostile.toml", text) {
        Err(ScenarioError::Invalid {
            field: f,
            line: l,
            message: m,
            ..
        }) => {
            assert_eq!(f, field, "{m}");
            assert_eq!(l, Some(line_of(text, line)), "{field}: {m}");
            assert!(m.contains(message), "{field}: {m:?} should contain {message:?}");
        }
        other => panic!("{field}: expected a validation error, got {other:?}"),
    }
}

#[test]
fn link_faults_naming_cache_in_a_per_worker_layout_are_refused() {
    for (kind, extra) in [("partition", ""), ("heal", ""), ("latency", "ms = 100\n")] {
        let text = format!("{BASE}\n[[faults]]\nkind = \"{kind}\"\nat_s = 5\na = \"worker-0\"\nb = \"cache\"\n{extra}");
        refused(&text, "faults[0].b", "b = \"cache\"", "there is no cache host");
    }
    // Stepping a cache clock that does not exist would change nothing.
    let text = format!("{BASE}\n[[faults]]\nkind = \"clock_step\"\nat_s = 5\nhost = \"cache\"\nby_ms = 100\n");
    refused(&text, "faults[0].host", "host = \"cache\"", "there is no cache host");
}

#[test]
fn link_faults_naming_a_worker_group_say_which_workers_exist() {
    let text = format!("{BASE}\n[[faults]]\nkind = \"partition\"\nat_s = 5\na = \"worker\"\nb = \"gpu\"\n");
    refused(
        &text,
        "faults[0].a",
        "a = \"worker\"",
        "\"worker\" is a group of 2 workers, not a host; name one of them: worker-0 … worker-1",
    );
    let text = format!("{BASE}\n[[faults]]\nkind = \"latency\"\nat_s = 5\na = \"worker-0\"\nb = \"gpu9\"\nms = 5\n");
    refused(
        &text,
        "faults[0].b",
        "b = \"gpu9\"",
        "no host named \"gpu9\"; hosts are: gpu, worker-0, worker-1",
    );
}

#[test]
fn arrival_rates_whose_gaps_round_to_zero_are_refused() {
    let text = BASE.replace("calls_per_min = 30", "calls_per_min = 1e11");
    refused(
        &text,
        "workers[0].tenants[0].calls_per_min",
        "tenants = [{ id = 1, calls_per_min = 1e11 }]",
        "must be between 0 calls/min and 60000 calls/min",
    );
}

#[test]
fn a_burst_of_u32_max_calls_is_refused() {
    let text = format!("{BASE}\n[[faults]]\nkind = \"burst\"\nat_s = 5\ncalls = 4294967295\ntenant = 1\n");
    refused(&text, "faults[0].calls", "calls = 4294967295", "must be at most 10000");
    // Under the per-worker cap, but too many across the fleet.
    let text = BASE.replace("count = 2", "count = 20")
        + "\n[[faults]]\nkind = \"burst\"\nat_s = 5\ncalls = 10000\ntenant = 1\n";
    refused(
        &text,
        "faults[0].calls",
        "calls = 10000",
        "200000 calls at once; at most 100000",
    );
}

#[test]
fn two_hundred_groups_of_500_workers_are_refused() {
    let mut text = BASE.replace("count = 2", "count = 500");
    for g in 1..200 {
        text.push_str(&format!(
            "\n[[workers]]\nname = \"g{g}\"\ncount = 500\nservers = [\"gpu\"]\ntenants = []\n"
        ));
    }
    match Scenario::parse("hostile.toml", &text) {
        Err(ScenarioError::Invalid {
            field, line, message, ..
        }) => {
            assert_eq!(field, "workers[20].count");
            assert!(line.is_some());
            assert!(message.contains("at most 10000 in all groups"), "{message}");
        }
        other => panic!("expected a validation error, got {other:?}"),
    }
}

#[test]
fn u32_max_retries_and_limiter_waits_are_refused() {
    let text = format!("{BASE}\n[hardening]\nmax_retries = 4294967295\n");
    refused(
        &text,
        "hardening.max_retries",
        "max_retries = 4294967295",
        "must be at most 100",
    );
    let text = format!("{BASE}\n[hardening]\nlimiter_waits = 4294967295\n");
    refused(
        &text,
        "hardening.limiter_waits",
        "limiter_waits = 4294967295",
        "must be at most 1000",
    );
}

#[test]
fn token_speeds_that_overflow_the_service_time_are_refused() {
    let text = BASE.replace("name = \"gpu\"", "name = \"gpu\"\ndecode_tokens_per_s = 1e-300");
    refused(
        &text,
        "servers[0].decode_tokens_per_s",
        "decode_tokens_per_s = 1e-300",
        "must be between 0.01 tokens/s and 1000000000 tokens/s",
    );
    // Each speed in range, the service time of a request over a day.
    let text = BASE.replace(
        "name = \"gpu\"",
        "name = \"gpu\"\ndecode_tokens_per_s = 0.01\noutput_tokens = 4000",
    );
    refused(
        &text,
        "servers[0].output_tokens",
        "output_tokens = 4000",
        "at most 86400 s",
    );
}

#[test]
fn clock_offsets_near_the_i64_limits_are_refused() {
    let text = BASE.replace(
        "tenants = [{ id = 1, calls_per_min = 30 }]",
        "tenants = [{ id = 1, calls_per_min = 30 }]\nclock = { offset_ms = -9223372036854775808 }",
    );
    refused(
        &text,
        "workers[0].clock.offset_ms",
        "clock = { offset_ms = -9223372036854775808 }",
        "must be at most 31536000000",
    );
    let text = BASE.replace(
        "tenants = [{ id = 1, calls_per_min = 30 }]",
        "tenants = [{ id = 1, calls_per_min = 30 }]\nclock = { drift_ppm = 9223372036854775807 }",
    );
    refused(
        &text,
        "workers[0].clock.drift_ppm",
        "clock = { drift_ppm = 9223372036854775807 }",
        "must be at most 100000",
    );
    // Steps that each stay within a year but add up to more.
    let step = |by: i64| format!("\n[[faults]]\nkind = \"clock_step\"\nat_s = 5\nhost = \"worker-0\"\nby_ms = {by}\n");
    let text = format!("{BASE}{}{}", step(-20_000_000_000), step(-20_000_000_001));
    refused(
        &text,
        "faults[1].by_ms",
        "by_ms = -20000000001",
        "would add up to 40000000001 ms",
    );
}

#[test]
fn durations_that_round_to_nothing_are_refused_with_their_line() {
    for (field, key) in [
        ("hardening.window_s", "window_s"),
        ("hardening.recovery_timeout_s", "recovery_timeout_s"),
        ("hardening.initial_delay_s", "initial_delay_s"),
        ("hardening.request_timeout_s", "request_timeout_s"),
        ("hardening.deadline_s", "deadline_s"),
    ] {
        let line = format!("{key} = 1e-12");
        let text = format!("{BASE}\n[hardening]\n{line}\n");
        refused(&text, field, &line, "must be between 0.001 s and 31536000 s");
    }
    let text = BASE.replace("duration_s = 20", "duration_s = 0.001");
    refused(
        &text,
        "duration_s",
        "duration_s = 0.001",
        "must be at least one tick (0.01 s)",
    );
}

#[test]
fn a_bounds_file_asking_for_billions_of_faults_is_refused() {
    let path = temp_file("bounds.toml", "# bounds\nmax_faults = 4294967295\n");
    match Bounds::load(&path) {
        Err(ScenarioError::Invalid {
            field, line, message, ..
        }) => {
            assert_eq!(field, "max_faults");
            assert_eq!(line, Some(2));
            assert!(message.contains("must be at most 64"), "{message}");
        }
        other => panic!("expected a validation error, got {other:?}"),
    }
    let out = bin()
        .args(["fuzz", path.to_str().unwrap(), "--cases", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 2: field `max_faults`"));
}

#[test]
fn a_run_over_its_work_budget_ends_with_what_ran_out() {
    let s = Scenario::parse("hostile.toml", BASE).unwrap();
    let tight = |host_steps, calls, attempts| Budget {
        host_steps,
        calls,
        attempts,
    };
    // 2 workers on one host + 1 server over 25 s of 10 ms steps.
    match simulate_within(&s, 1, tight(1000, u64::MAX, u64::MAX)) {
        Err(SimError::OverBudget {
            resource: Resource::HostSteps,
            needed,
            budget: 1000,
        }) => assert_eq!(needed, 2 * 2500),
        other => panic!("expected the host-step budget to run out, got {other:?}"),
    }
    // 2 workers × 30 calls a minute × 20 s = 20 calls, each with up to 3
    // retries and 1 limiter wait after its first attempt.
    match simulate_within(&s, 1, tight(u64::MAX, 19, u64::MAX)) {
        Err(SimError::OverBudget {
            resource: Resource::Calls,
            needed: 20,
            ..
        }) => {}
        other => panic!("expected the call budget to run out, got {other:?}"),
    }
    match simulate_within(&s, 1, tight(u64::MAX, u64::MAX, 99)) {
        Err(
            e @ SimError::OverBudget {
                resource: Resource::Attempts,
                needed: 100,
                ..
            },
        ) => assert!(e.to_string().contains("max_retries + limiter_waits"), "{e}"),
        other => panic!("expected the attempt budget to run out, got {other:?}"),
    }
    assert!(simulate_within(&s, 1, tight(7500, 20, 100)).is_ok());
}

#[test]
fn a_valid_scenario_asking_for_too_much_work_exits_3_naming_it() {
    // Valid (a fleet of 100 at 6000 calls a minute each), but an hour of it
    // is 36 million calls: refused before the run starts.
    let text = BASE
        .replace("duration_s = 20", "duration_s = 3600")
        .replace("count = 2", "count = 100")
        .replace("calls_per_min = 30", "calls_per_min = 6000");
    let file = temp_file("too-much/too-much.toml", &text);
    let (path, dir) = (file.to_str().unwrap(), file.parent().unwrap().to_str().unwrap());
    for args in [
        vec!["run", path],
        vec!["sweep", path, "--seeds", "1..3"],
        vec!["check", dir],
    ] {
        let out = bin().args(&args).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(3), "{args:?}: {text}");
        assert!(text.contains("over its work budget: calls"), "{args:?}: {text}");
    }
}

#[test]
fn a_shared_cache_under_a_heavy_burst_does_not_panic() {
    // 2 × 10,000 calls at one instant each open a cache connection: more
    // than turmoil's default backlog on the cache host, and with a hanging
    // server every admitted call also holds a server connection.
    let text = r#"
name = "heavy"
duration_s = 4
[hardening]
rpm = 100000
max_retries = 0
request_timeout_s = 2
[cache]
kind = "shared"
[[servers]]
name = "gpu"
queue = 100000
behaviour = { mode = "hang" }
[[workers]]
name = "worker"
count = 2
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 0 }]
[[faults]]
kind = "burst"
at_s = 1
calls = 10000
tenant = 1
"#;
    let s = Scenario::parse("heavy.toml", text).unwrap();
    let run = simulate(&s, 1).expect("the run completes");
    assert!(run.events.len() > 20_000);
}

#[test]
fn a_heavy_tenant_on_a_hanging_server_does_not_exhaust_a_workers_ports() {
    // Hundreds of calls a second (the arrivals' gaps round up to the tick),
    // each holding its connection for 30 s: more than the 16,384 ephemeral
    // ports turmoil gives a host. Past its connection
    // limit a worker fails to connect, as a real host out of ports does.
    let text = r#"
name = "ports"
duration_s = 30
[hardening]
rpm = 100000
max_retries = 0
failure_threshold = 100000
request_timeout_s = 30
[[servers]]
name = "gpu"
queue = 100000
behaviour = { mode = "hang" }
[[workers]]
name = "worker"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 60000 }]
"#;
    let s = Scenario::parse("ports.toml", text).unwrap();
    let run = simulate(&s, 1).expect("the run completes");
    let requests = run
        .events
        .iter()
        .filter(|e| matches!(e.kind, redstring_sim::evidence::trace::Kind::Request { .. }))
        .count();
    assert!(requests > 16_384, "{requests} requests");
}

#[test]
fn link_latencies_and_schedules_past_their_limits_are_refused() {
    let text =
        format!("{BASE}\n[[faults]]\nkind = \"latency\"\nat_s = 5\na = \"worker-0\"\nb = \"gpu\"\nms = 3600000\n");
    refused(
        &text,
        "faults[0].ms",
        "ms = 3600000",
        "must be at most 60000 (one minute)",
    );
    let text = format!("{BASE}\n[network]\nmax_latency_ms = 18446744073709551615\n");
    refused(
        &text,
        "network.max_latency_ms",
        "max_latency_ms = 18446744073709551615",
        "must be at most 60000",
    );
    let crash = "\n[[faults]]\nkind = \"crash\"\nat_s = 5\nserver = \"gpu\"\n";
    let text = format!("{BASE}{}", crash.repeat(10_001));
    match Scenario::parse("hostile.toml", &text) {
        Err(ScenarioError::Invalid { field, message, .. }) => {
            assert_eq!(field, "faults");
            assert!(message.contains("must be at most 10000"), "{message}");
        }
        other => panic!("expected a validation error, got {other:?}"),
    }
}

#[test]
fn an_ollama_with_no_keep_alive_and_no_load_time_serves_instead_of_spinning() {
    // keep_alive_s = 0 unloads the model once idle; the request that loaded
    // it must still be served. With reload_s = 0 the server used to unload
    // the model the moment its load ended and start another, forever, at one
    // instant: the simulation never advanced.
    let text = r#"
name = "ollama-zero"
duration_s = 30
[[servers]]
name = "gpu"
kind = "ollama"
keep_alive_s = 0
reload_s = 0
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 6 }]
"#;
    let s = Scenario::parse("ollama.toml", text).unwrap();
    let run = redstring_sim::campaign::simulate(&s, 1).unwrap();
    let ok = run
        .events
        .iter()
        .filter(|e| {
            matches!(
                &e.kind,
                redstring_sim::evidence::trace::Kind::CallEnd(end)
                    if end.outcome == redstring_sim::evidence::outcome::CallOutcome::Ok
            )
        })
        .count();
    assert!(ok > 0, "no call was served");
}

#[test]
fn a_time_scale_that_makes_steps_take_no_time_is_refused() {
    let text = r#"
name = "scale"
duration_s = 30
[[servers]]
name = "gpu"
kind = "vllm"
time_scale = 1e-12
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 6 }]
"#;
    refused(
        text,
        "servers[0].time_scale",
        "time_scale = 1e-12",
        "between 0.01 and 1000",
    );
}

#[test]
fn token_counts_beyond_ten_million_are_refused() {
    let text = BASE.replace(
        "[[servers]]\nname = \"gpu\"",
        "[[servers]]\nname = \"gpu\"\noutput_tokens = 4000000000",
    );
    refused(
        &text,
        "servers[0].output_tokens",
        "output_tokens = 4000000000",
        "at most 10000000",
    );
    let text = format!("{BASE}\n[hardening]\nmax_tokens = 4000000000\n");
    refused(
        &text,
        "hardening.max_tokens",
        "max_tokens = 4000000000",
        "at most 10000000",
    );
}

#[test]
fn a_fleet_of_a_billion_closed_loop_clients_is_refused() {
    // Each group's tenants are within the per-tenant limits; together they
    // would be a billion tasks before the first instant.
    let tenants: Vec<String> = (1..=20)
        .map(|i| format!("{{ id = {i}, clients = 10000, think_s = 31536000 }}"))
        .collect();
    let text = format!(
        "name = \"clients\"\nduration_s = 60\n[[servers]]\nname = \"gpu\"\n[[workers]]\nname = \"w\"\ncount = 500\nservers = [\"gpu\"]\ntenants = [{}]\n",
        tenants.join(", ")
    );
    match Scenario::parse("clients.toml", &text) {
        Err(ScenarioError::Invalid { field, message, .. }) => {
            assert_eq!(field, "workers[0].tenants[0].clients", "{message}");
            assert!(message.contains("at most 100000"), "{message}");
        }
        other => panic!("expected a validation error, got {other:?}"),
    }
}

#[test]
fn an_absurd_retry_budget_is_refused_by_its_field() {
    for (field, value) in [
        ("ratio", "-1.0"),
        ("ratio", "nan"),
        ("min_retries_per_sec", "5000"),
        ("max_balance", "0"),
    ] {
        let text = format!(
            "name = \"b\"\nduration_s = 10\n[hardening.retry_budget]\n{field} = {value}\n[[servers]]\nname = \"gpu\"\n[[workers]]\nname = \"w\"\nservers = [\"gpu\"]\ntenants = [{{ id = 1, calls_per_min = 1 }}]\n"
        );
        let e = redstring_sim::scenario::Scenario::parse("b.toml", &text)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("hardening.retry_budget.{field}")),
            "{field} = {value}: {e}"
        );
    }
}

/// Runs `args` under an address-space limit of `bytes` (`prlimit --as`);
/// `None` when `prlimit` is not installed (the caller skips, saying so).
fn limited(bytes: u64, args: &[&str]) -> Option<std::process::Output> {
    let probe = std::process::Command::new("prlimit").arg("--version").output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIPPED: prlimit (util-linux) is not installed; the memory cases are untested");
        return None;
    }
    Some(
        std::process::Command::new("prlimit")
            .arg(format!("--as={bytes}"))
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_redstring-sim"))
            .args(args)
            .output()
            .unwrap(),
    )
}

/// Asserts a clear refusal with exit `code` saying `says`: no signal (an
/// abort from a failed allocation), no panic.
fn refused_within(out: &std::process::Output, code: i32, says: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(code),
        "killed or wrong code ({:?}): {err}",
        out.status
    );
    assert!(!err.contains("panicked") && !err.contains("memory allocation"), "{err}");
    assert!(err.contains(says), "expected {says:?} in: {err}");
}

/// Flags and files that once sized an allocation, run under a 1 GB
/// address-space limit: huge seed ranges (`sweep`, `compare`, `tune`, and a
/// shard claiming one for `merge`), keys thousands of steps deep, a trace
/// whose requests all arrive at one instant, and a hundred tenants each
/// replaying it. Each ends in a clear error — never an abort.
#[test]
fn what_once_ran_out_of_memory_is_refused_under_an_address_space_limit() {
    const LIMIT: u64 = 1 << 30;
    let path = temp_file(
        "memory/s.toml",
        &format!("{BASE}[objectives]\nfailed_fraction_max = 0.5\n"),
    );
    let p = path.to_str().unwrap();
    let deep = format!("{}=1", vec!["t"; 5000].join("."));
    let cases: [(&[&str], &str); 6] = [
        (
            &["sweep", p, "--seeds", "0..18446744073709551615"],
            "above the most one command runs",
        ),
        (
            &["compare", p, "--seeds", "1..100000000"],
            "above the most one command runs",
        ),
        (
            &[
                "tune",
                p,
                "--vary",
                "hardening.rpm=5,10",
                "--seeds",
                "18446744073709551615",
            ],
            "beyond 2^64",
        ),
        (
            &["tune", p, "--vary", "hardening.rpm=5,10", "--seeds", "1..100000000"],
            "above the most one command runs",
        ),
        (&["compare", p, "--seeds", "1", "--set", &deep], "5000 dotted steps"),
        (&["tune", p, "--seeds", "1", "--vary", &deep], "dotted steps"),
    ];
    for (args, says) in cases {
        let Some(out) = limited(LIMIT, args) else { return };
        refused_within(&out, 2, says);
    }
    // A shard claiming every seed there is.
    let shard = path.with_file_name("huge.json");
    let out = bin()
        .args(["sweep", p, "--seeds", "1..3", "--shard", "1/1", "--json"])
        .arg(&shard)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&shard).unwrap()).unwrap();
    v["seed_range"] = serde_json::json!([0, u64::MAX]);
    std::fs::write(&shard, v.to_string()).unwrap();
    let Some(out) = limited(LIMIT, &["merge", shard.to_str().unwrap()]) else {
        return;
    };
    refused_within(&out, 2, "not a range a command runs");
    // 400 000 requests at one instant: a run would hold them all at once,
    // about 2.3 GB; refused up front with the figure.
    let mut csv = String::from("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n");
    csv.push_str(&"1,m,10,10,20,Conversation log\n".repeat(400_000));
    let trace = path.with_file_name("same-instant.csv");
    std::fs::write(&trace, &csv).unwrap();
    let one = BASE.replace("count = 2\n", "").replace(
        "{ id = 1, calls_per_min = 30 }",
        "{ id = 1, replay = { file = \"same-instant.csv\" } }",
    );
    let replayed = temp_file("memory/replayed.toml", &one);
    let r = replayed.to_str().unwrap();
    let Some(out) = limited(LIMIT, &["run", r, "--max-wall", "100000"]) else {
        return;
    };
    refused_within(&out, 3, "400000 calls");
    assert!(String::from_utf8_lossy(&out.stderr).contains("address-space limit of 1.0 GB"));
    let Some(out) = limited(LIMIT, &["sweep", r, "--seeds", "2", "--jobs", "1"]) else {
        return;
    };
    refused_within(&out, 3, "address-space limit");
    // A hundred tenants replaying it: the requests every replay keeps are
    // bounded together, not per tenant.
    let tenants: Vec<String> = (1..=100)
        .map(|i| format!("{{ id = {i}, replay = {{ file = \"same-instant.csv\" }} }}"))
        .collect();
    let many = temp_file(
        "memory/many.toml",
        &one.replace(
            "[{ id = 1, replay = { file = \"same-instant.csv\" } }]",
            &format!("[{}]", tenants.join(", ")),
        ),
    );
    let Some(out) = limited(LIMIT, &["run", many.to_str().unwrap()]) else {
        return;
    };
    refused_within(
        &out,
        2,
        "with the replays before it, more than 1000000 replayed requests",
    );
    assert_eq!(std::fs::read_to_string(&trace).unwrap(), csv);
}
