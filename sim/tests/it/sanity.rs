//! Sanity before the run: each warning for what a valid scenario most likely
//! got wrong, with its field and line; the up-front load figure; `--strict`.

use std::path::Path;

use redstring_sim::campaign::simulate;
use redstring_sim::evidence::outcome::Answer;
use redstring_sim::evidence::trace::Kind;
use redstring_sim::scenario::sanity::{self, LOAD_WARNING};
use redstring_sim::scenario::{FaultKind, Mode, Oddity, Scenario, Warning};

use crate::support::{bin, temp_file};

const BASE: &str = r#"
name = "sane"
duration_s = 60
[[servers]]
name = "gpu"
[[workers]]
name = "worker"
count = 2
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 6 }]
"#;

fn warnings(text: &str) -> Vec<Warning> {
    Scenario::parse_checked("sane.toml", text).unwrap().1
}

/// The single warning of `text`, expected on the line written as `line`.
fn only_warning(text: &str, line: &str) -> Warning {
    let mut w = warnings(text);
    assert_eq!(w.len(), 1, "{w:#?}");
    let w = w.remove(0);
    let expected = text.lines().position(|l| l.trim() == line).map(|i| i + 1);
    assert!(expected.is_some(), "{line:?} not in the text");
    assert_eq!(w.line, expected, "{w}");
    w
}

#[test]
fn a_plain_scenario_has_no_warnings() {
    assert_eq!(warnings(BASE), []);
}

#[test]
fn a_burst_for_a_tenant_no_worker_has() {
    let text = format!("{BASE}\n[[faults]]\nkind = \"burst\"\nat_s = 10\ncalls = 5\ntenant = 2\n");
    let w = only_warning(&text, "tenant = 2");
    assert_eq!(w.field, "faults[0].tenant");
    assert_eq!(
        w.odd,
        Oddity::BurstForUnknownTenant {
            tenant: 2,
            known: vec![1]
        }
    );
    assert!(w.to_string().contains("the fleet's tenants are 1"), "{w}");
}

#[test]
fn a_restart_with_no_earlier_crash() {
    let restart = "\n[[faults]]\nkind = \"restart\"\nat_s = 10\nserver = \"gpu\"\n";
    let w = only_warning(&format!("{BASE}{restart}"), "server = \"gpu\"");
    assert_eq!(w.field, "faults[0].server");
    assert_eq!(w.odd, Oddity::RestartWithoutCrash { server: "gpu".into() });
    // After a crash it is what it should be, whichever is written first; a
    // second restart has nothing left to restart.
    let crash = "\n[[faults]]\nkind = \"crash\"\nat_s = 5\nserver = \"gpu\"\n";
    assert_eq!(warnings(&format!("{BASE}{restart}{crash}")), []);
    let w = warnings(&format!("{BASE}{crash}{restart}{}", restart.replace("10", "20")));
    assert_eq!(w.len(), 1, "{w:#?}");
    assert_eq!(w[0].field, "faults[2].server");
}

#[test]
fn a_group_without_tenants() {
    let text = BASE.replace("tenants = [{ id = 1, calls_per_min = 6 }]", "tenants = []");
    let w = only_warning(&text, "tenants = []");
    assert_eq!(w.field, "workers[0].tenants");
    assert_eq!(w.odd, Oddity::NoTenants { group: "worker".into() });
}

#[test]
fn a_request_timeout_in_milliseconds() {
    let text = format!("{BASE}\n[hardening]\nrequest_timeout_s = 30000\n");
    let w = only_warning(&text, "request_timeout_s = 30000");
    assert_eq!(w.field, "hardening.request_timeout_s");
    assert_eq!(w.odd, Oddity::SecondsLookLikeMilliseconds { value: 30000.0 });
    assert!(w.to_string().contains("is it milliseconds (30 s)?"), "{w}");
    // Ten minutes is a long timeout, not a unit mistake.
    assert_eq!(warnings(&format!("{BASE}\n[hardening]\nrequest_timeout_s = 600\n")), []);
}

#[test]
fn a_retry_after_the_mode_ignores() {
    let text = BASE.replace(
        "name = \"gpu\"",
        "name = \"gpu\"\nbehaviour = { mode = \"error\", retry_after_s = 5 }",
    );
    let w = only_warning(&text, "behaviour = { mode = \"error\", retry_after_s = 5 }");
    assert_eq!(w.field, "servers[0].behaviour.retry_after_s");
    assert_eq!(w.odd, Oddity::IgnoredByMode { mode: Mode::Error });
    assert!(w.to_string().contains("mode \"error\" ignores it"), "{w}");
    // In a fault, even at the default value, as long as it is written.
    let fault = "\n[[faults]]\nkind = \"behave\"\nat_s = 5\nserver = \"gpu\"\nbehaviour = { mode = \"error\", retry_after_s = 1 }\n";
    let w = only_warning(
        &format!("{BASE}{fault}"),
        "behaviour = { mode = \"error\", retry_after_s = 1 }",
    );
    assert_eq!(w.field, "faults[0].behaviour.retry_after_s");
    // With the mode that sends it, or not written, nothing to say.
    assert_eq!(warnings(&format!("{BASE}{}", fault.replace("error", "rate_limit"))), []);
    assert_eq!(
        warnings(&format!("{BASE}{}", fault.replace(", retry_after_s = 1", ""))),
        []
    );
}

#[test]
fn a_collapse_the_queue_never_lets_load_reach() {
    let text = BASE.replace(
        "name = \"gpu\"",
        "name = \"gpu\"\nslots = 2\nqueue = 8\ncollapse_at = 11",
    );
    let w = only_warning(&text, "collapse_at = 11");
    assert_eq!(w.field, "servers[0].collapse_at");
    assert_eq!(
        w.odd,
        Oddity::CollapseUnreachable {
            collapse_at: 11,
            most_in_flight: 10
        }
    );
    assert_eq!(warnings(&text.replace("collapse_at = 11", "collapse_at = 10")), []);
}

#[test]
fn a_fault_at_the_very_end() {
    let text = format!("{BASE}\n[[faults]]\nkind = \"crash\"\nat_s = 60\nserver = \"gpu\"\n");
    let w = only_warning(&text, "at_s = 60");
    assert_eq!(w.field, "faults[0].at_s");
    assert_eq!(w.odd, Oddity::FaultAtEnd { kind: FaultKind::Crash });
    assert_eq!(warnings(&text.replace("at_s = 60", "at_s = 59.9")), []);
}

#[test]
fn the_load_figure_is_arrivals_as_the_limiters_admit_them_against_capacity() {
    // Default server: 4 slots, 400 / 2000 + 60 / 40 = 1.7 s a request.
    let capacity = 4.0 / 1.7;
    let text = BASE.replace("calls_per_min = 6", "calls_per_min = 120");
    let s = Scenario::parse("load.toml", &text).unwrap();
    let load = &sanity::loads(&s)[0];
    // Per-worker limiters: each worker admits its tenant 60 a minute.
    assert_eq!(load.arriving_per_s, 4.0);
    assert_eq!(load.offered_per_s, 2.0);
    assert!((load.capacity_per_s - capacity).abs() < 1e-9);
    assert!((load.utilisation() - 2.0 / capacity).abs() < 1e-9);
    assert!(load.utilisation() > LOAD_WARNING);
    let w = only_warning(&text, "name = \"gpu\"");
    assert_eq!(w.field, "servers[0].name");
    assert!(w.to_string().contains("gpu is offered 85 % of its capacity"), "{w}");
    // A shared cache limits the tenant fleet-wide: 60 a minute in all.
    let shared = format!("{text}\n[cache]\nkind = \"shared\"\n");
    let s = Scenario::parse("load.toml", &shared).unwrap();
    assert_eq!(sanity::loads(&s)[0].offered_per_s, 1.0);
    assert_eq!(warnings(&shared), []);
    // Bursts are shown as capacity-seconds, not warned about.
    let burst = format!("{BASE}\n[[faults]]\nkind = \"burst\"\nat_s = 10\ncalls = 40\ntenant = 1\n");
    let s = Scenario::parse("load.toml", &burst).unwrap();
    let load = &sanity::loads(&s)[0];
    assert_eq!(load.burst_calls, 80);
    assert!(
        load.to_string().contains("bursts add 80 calls, 34.0 s of its capacity"),
        "{load}"
    );
    assert_eq!(warnings(&burst), []);
}

#[test]
fn a_token_budget_holds_the_offered_load_back_as_the_rpm_does() {
    // Each call settles 400 prompt + 60 output tokens; 13 800 tokens a
    // minute let 30 calls a minute through, a quarter of the 120 arriving.
    let text = format!(
        "{}\n[hardening]\nrpm = 1000\ntokens_per_window = 13800\n",
        BASE.replace("calls_per_min = 6", "calls_per_min = 120")
    );
    let s = Scenario::parse("load.toml", &text).unwrap();
    let load = &sanity::loads(&s)[0];
    assert_eq!(load.arriving_per_s, 4.0);
    // Per worker: 0.5 a second each, two workers.
    assert!((load.offered_per_s - 1.0).abs() < 1e-9, "{load}");
    // Shared: one budget for the tenant, fleet-wide.
    let shared = format!("{text}\n[cache]\nkind = \"shared\"\n");
    let s = Scenario::parse("load.toml", &shared).unwrap();
    assert!((sanity::loads(&s)[0].offered_per_s - 0.5).abs() < 1e-9);
    // The tighter of the two limits binds: rpm 12 is 0.2 a second a worker.
    let rpm = text.replace("rpm = 1000", "rpm = 12");
    let s = Scenario::parse("load.toml", &rpm).unwrap();
    assert!((sanity::loads(&s)[0].offered_per_s - 0.4).abs() < 1e-9);
}

/// A worker routing over a primary and a spare of the same size.
const SPARE: &str = r#"
name = "spare"
duration_s = 60
[hardening]
rpm = 1000
routing = "ordered"
[[servers]]
name = "gpu"
[[servers]]
name = "spare"
[[workers]]
name = "worker"
servers = ["gpu", "spare"]
tenants = [{ id = 1, calls_per_min = 60 }]
"#;

#[test]
fn a_spare_shows_the_load_it_takes_while_its_primary_is_down() {
    let s = Scenario::parse("spare.toml", SPARE).unwrap();
    let [gpu, spare] = &sanity::loads(&s)[..] else { panic!() };
    // Ordered: the spare takes nothing while the primary is up, and all of
    // it while the primary is down.
    assert_eq!((gpu.offered_per_s, spare.offered_per_s), (1.0, 0.0));
    let over = spare.failover.as_ref().expect("the spare backs the primary up");
    assert_eq!((over.down.as_str(), over.offered_per_s), ("gpu", 1.0));
    assert!(
        spare.to_string().contains("; while gpu is down 1.00 calls/s, 42 %"),
        "{spare}"
    );
    // The primary takes no more while the spare is down.
    assert_eq!(gpu.failover, None);
    // Weighted over equal slots: half each, all of it on either alone.
    let weighted = SPARE.replace("\"ordered\"", "\"weighted\"");
    let s = Scenario::parse("spare.toml", &weighted).unwrap();
    for load in sanity::loads(&s) {
        assert_eq!(load.offered_per_s, 0.5, "{load}");
        assert_eq!(load.failover.map(|f| f.offered_per_s), Some(1.0));
    }
    // Without routing nothing moves: a call to a server that is down fails.
    let alone = SPARE
        .replace("routing = \"ordered\"\n", "")
        .replace("[\"gpu\", \"spare\"]", "[\"gpu\"]");
    let s = Scenario::parse("spare.toml", &alone).unwrap();
    assert!(sanity::loads(&s).iter().all(|l| l.failover.is_none()));
}

/// A hosted endpoint whose tokens-per-minute bucket is what binds: requests
/// of the default 400 prompt tokens asking for `max_tokens = 1024`, offered
/// three times faster than the quota lets through, by a worker that neither
/// retries nor opens its breaker on the 429s (so every token the bucket
/// refills is spent).
const QUOTA: &str = r#"
name = "quota"
duration_s = 300
[hardening]
rpm = 1000
max_tokens = 1024
max_retries = 0
failure_threshold = 100000
[[servers]]
name = "api"
kind = "openai"
quota = { rpm = 10000, tpm = 60000 }
[[workers]]
name = "worker"
servers = ["api"]
tenants = [{ id = 1, calls_per_min = 180 }]
"#;

#[test]
fn a_quota_s_capacity_charges_what_its_bucket_charges() {
    let s = Scenario::parse("quota.toml", QUOTA).unwrap();
    let capacity = sanity::loads(&s)[0].capacity_per_s;
    // The bucket charges each request the larger of max_tokens and the
    // prompt at admission: 1024 tokens, so 60 000 / 60 / 1024 a second.
    assert!((capacity - 60_000.0 / 60.0 / 1024.0).abs() < 1e-9, "{capacity}");
    // And that is what the server serves once its first full bucket is
    // spent: count its answers over the last four minutes.
    let run = simulate(&s, 1).unwrap();
    let served = run
        .events
        .iter()
        .filter(|e| e.t_us >= 60_000_000 && &*e.host == "api")
        .filter(|e| {
            matches!(
                e.kind,
                Kind::Served {
                    outcome: Answer::Ok,
                    ..
                }
            )
        })
        .count() as f64;
    let rate = served / 240.0;
    assert!(
        (rate - capacity).abs() < 0.05 * capacity,
        "served {rate:.3}/s against a capacity figure of {capacity:.3}/s"
    );
}

#[test]
fn the_shipped_scenarios_warn_only_where_they_are_odd() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
    let mut odd = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|x| x == "toml") {
            let (_, warnings) = Scenario::load_checked(&path).unwrap();
            for w in warnings {
                odd.push(format!("{}: {}", path.file_name().unwrap().to_string_lossy(), w.field));
            }
        }
    }
    // hosted-quota (and its cooldown variant) and mixed-tenants-tokens offer
    // more than their quota on purpose (to draw 429s); hosted-quota-tokens
    // offers the same, and its token budget holds it to 86 % of the quota;
    // concurrency-reserve overloads its server so the classes contend.
    odd.sort();
    assert_eq!(
        odd,
        [
            "concurrency-reserve.toml: servers[0].name",
            "hosted-quota-cooldown.toml: servers[0].name",
            "hosted-quota-tokens.toml: servers[0].name",
            "hosted-quota.toml: servers[0].name",
            "mixed-tenants-tokens.toml: servers[0].name"
        ]
    );
}

#[test]
fn the_cli_prints_the_load_and_warnings_and_strict_refuses_them() {
    let text = format!("{BASE}\n[[faults]]\nkind = \"burst\"\nat_s = 2\ncalls = 5\ntenant = 2\n")
        .replace("duration_s = 60", "duration_s = 5");
    let path = temp_file("odd.toml", &text);

    let out = bin().args(["run", path.to_str().unwrap()]).output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("load gpu: offered 0.20 calls/s (0.20 arriving before the limiter)"),
        "{stdout}"
    );
    let line = text.lines().position(|l| l == "tenant = 2").unwrap() + 1;
    assert!(
        stderr.contains(&format!(
            "warning: {}: line {line}: field `faults[0].tenant`",
            path.display()
        )),
        "{stderr}"
    );

    for args in [
        vec!["run", path.to_str().unwrap(), "--strict"],
        vec!["sweep", path.to_str().unwrap(), "--seeds", "1..2", "--strict"],
    ] {
        let out = bin().args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!("line {line}: field `faults[0].tenant`")),
            "{stderr}"
        );
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("replay:"),
            "strict does not run"
        );
    }

    let dir = path.parent().unwrap();
    let out = bin()
        .args(["check", dir.to_str().unwrap(), "--strict"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}");
    assert!(
        stdout.contains("BAD") && stdout.contains("faults[0].tenant"),
        "{stdout}"
    );
    let out = bin().args(["check", dir.to_str().unwrap()]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("WARN") && stdout.contains("ok "), "{stdout}");
}

#[test]
fn without_the_text_a_setting_counts_as_written_when_it_is_not_the_default() {
    let mut s = Scenario::parse("sane.toml", BASE).unwrap();
    assert_eq!(sanity::warnings(&s, None), []);
    s.hardening.on_cache_error = redstring::OnCacheError::Refuse;
    s.servers[0].kind = redstring_sim::scenario::ServerKind::Vllm;
    s.servers[0].queue = 8;
    s.workers[0].tenants[0].think_s = 5.0;
    let fields: Vec<String> = sanity::warnings(&s, None).into_iter().map(|w| w.field).collect();
    assert_eq!(
        fields,
        [
            "workers[0].tenants[0].think_s",
            "hardening.on_cache_error",
            "servers[0].queue"
        ]
    );
    assert!(sanity::warnings(&s, None).iter().all(|w| w.line.is_none()));
}
