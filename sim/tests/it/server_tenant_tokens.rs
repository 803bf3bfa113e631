//! Per-tenant token distributions: each tenant's calls carry prompt and
//! output counts drawn from its own distributions to the server, which serves
//! them in place of its own; a tenant without them gets the server's counts;
//! a broken distribution is a scenario error naming the tenant's field.

use std::collections::BTreeMap;

use redstring_sim::campaign::simulate;
use redstring_sim::evidence::outcome::CallOutcome;
use redstring_sim::evidence::trace::{Kind, TraceEvent};
use redstring_sim::scenario::{Scenario, tenant};

/// One generic server (4 slots, prefill 2000 and decode 40 tokens/s, 400
/// prompt and 60 output tokens of its own: 1.7 s a request) and one worker
/// with `tenants`.
fn scenario(tenants: &str) -> String {
    format!(
        r#"
name = "tenant-tokens"
duration_s = 120
[hardening]
request_timeout_s = 50
# Above every output here, so no answer is cut off.
max_tokens = 1000
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{tenants}]
"#
    )
}

/// Each tenant's call latencies in ms, by tenant number.
fn latencies(events: &[TraceEvent]) -> BTreeMap<u64, Vec<u64>> {
    let mut by_tenant: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for e in events {
        if let Kind::CallEnd(end) = &e.kind {
            let id = (1..=3).find(|&i| tenant(i) == end.tenant).expect("a known tenant");
            by_tenant.entry(id).or_default().push(end.latency_ms);
        }
    }
    by_tenant
}

#[test]
fn two_tenants_with_different_distributions_reach_the_server_with_different_counts() {
    // Tenant 1: 2000 prompt and 400 output tokens, 1 + 10 s a request on the
    // generic server; tenant 2: 100 and 20, 0.05 + 0.5 s; tenant 3 sets
    // nothing and gets the server's 400 and 60, 0.2 + 1.5 s.
    let text = scenario(
        r#"
  { id = 1, calls_per_min = 3, prompt_tokens = { dist = "fixed", value = 2000 }, output_tokens = { dist = "fixed", value = 400 } },
  { id = 2, calls_per_min = 3, prompt_tokens = { dist = "fixed", value = 100 }, output_tokens = { dist = "fixed", value = 20 } },
  { id = 3, calls_per_min = 3 },
"#,
    );
    let s = Scenario::parse("tenant-tokens.toml", &text).unwrap();
    let run = simulate(&s, 1).unwrap();
    let by_tenant = latencies(&run.events);
    let expect = [(1, 11_000..11_100), (2, 550..650), (3, 1_700..1_800)];
    for (id, range) in expect {
        let seen = &by_tenant[&id];
        assert!(seen.len() >= 2, "tenant {id}: {seen:?}");
        assert!(seen.iter().all(|ms| range.contains(ms)), "tenant {id}: {seen:?}");
    }
}

#[test]
fn one_side_set_leaves_the_other_to_the_server() {
    // Only the output: 400 prompt tokens of the server's own (0.2 s) and 200
    // output tokens (5 s).
    let text = scenario(r#"{ id = 1, calls_per_min = 3, output_tokens = { dist = "fixed", value = 200 } }"#);
    let run = simulate(&Scenario::parse("tenant-tokens.toml", &text).unwrap(), 1).unwrap();
    let seen = &latencies(&run.events)[&1];
    assert!(!seen.is_empty());
    assert!(seen.iter().all(|ms| (5_200..5_300).contains(ms)), "{seen:?}");
}

#[test]
fn a_lognormal_tenant_draws_per_call_from_its_own_seeded_stream() {
    let text =
        scenario(r#"{ id = 1, calls_per_min = 6, output_tokens = { dist = "lognormal", median = 100, sigma = 0.8 } }"#);
    let s = Scenario::parse("tenant-tokens.toml", &text).unwrap();
    let first = latencies(&simulate(&s, 1).unwrap().events)[&1].clone();
    let again = latencies(&simulate(&s, 1).unwrap().events)[&1].clone();
    assert_eq!(first, again, "the same seed draws the same counts");
    let distinct: std::collections::BTreeSet<u64> = first.iter().map(|ms| ms / 100).collect();
    assert!(distinct.len() > first.len() / 2, "counts vary per call: {first:?}");
    let other = latencies(&simulate(&s, 2).unwrap().events)[&1].clone();
    assert_ne!(first, other, "another seed draws other counts");
}

#[test]
fn a_heavy_prompt_tenant_hits_the_token_quota_before_a_light_one() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/mixed-tenants-tokens.toml");
    let s = Scenario::load(&path).unwrap();
    let run = simulate(&s, s.seed).unwrap();
    let throttled = |server_tenant: u64| {
        let mut calls = 0u64;
        let mut attempts = 0u64;
        let mut failed = 0u64;
        for e in &run.events {
            if let Kind::CallEnd(end) = &e.kind
                && end.tenant == tenant(server_tenant)
            {
                calls += 1;
                attempts += u64::from(end.attempts);
                failed += u64::from(end.outcome != CallOutcome::Ok);
            }
        }
        (calls, attempts, failed)
    };
    let (heavy_calls, heavy_attempts, heavy_failed) = throttled(1);
    let (light_calls, light_attempts, light_failed) = throttled(2);
    assert!(heavy_calls > 20 && light_calls > 20, "{heavy_calls} {light_calls}");
    // The heavy tenant's calls need retries the light one's mostly do not.
    let heavy = heavy_attempts as f64 / heavy_calls as f64;
    let light = light_attempts as f64 / light_calls as f64;
    assert!(
        heavy > 1.3 && heavy > light + 0.2,
        "attempts per call: heavy {heavy}, light {light}"
    );
    assert!(heavy_failed >= light_failed, "{heavy_failed} {light_failed}");
}

#[test]
fn a_broken_tenant_distribution_names_its_field() {
    let bad = [
        (
            r#"{ id = 1, calls_per_min = 3, prompt_tokens = { dist = "uniform", low = 9, high = 1 } }"#,
            "workers[0].tenants[0].prompt_tokens",
            "low must not exceed high",
        ),
        (
            r#"{ id = 1, calls_per_min = 3, output_tokens = { dist = "fixed", value = 20000000 } }"#,
            "workers[0].tenants[0].output_tokens",
            "at most 10000000",
        ),
        (
            r#"{ id = 1, calls_per_min = 3, output_tokens = { dist = "lognormal", median = 10, sigma = 9 } }"#,
            "workers[0].tenants[0].output_tokens",
            "sigma must be between 0 and 3",
        ),
        (
            r#"{ id = 1, calls_per_min = 3, output_tokens = { dist = "fixed", value = -1 } }"#,
            "workers[0].tenants[0].output_tokens",
            "must not be negative",
        ),
    ];
    for (tenants, field, says) in bad {
        let e = Scenario::parse("tenant-tokens.toml", &scenario(tenants))
            .unwrap_err()
            .to_string();
        assert!(e.contains(field) && e.contains(says), "{tenants}: {e}");
    }
}
