//! Every shipped scenario: its invariants hold (or are violated only where the
//! scenario says they may be), the objectives it sets are met, its report and
//! compact trace match the reviewed snapshot, the same seed replays byte for
//! byte, and another seed differs.
//!
//! Review a changed snapshot with `cargo insta review` (or rerun with
//! `INSTA_UPDATE=always` and read the diff) before committing it.

use std::path::{Path, PathBuf};

use redstring_sim::campaign::simulate;
use redstring_sim::evidence::trace::Trace;
use redstring_sim::judgement::report::Report;
use redstring_sim::scenario::Scenario;

fn scenarios() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    files
}

fn check(path: &Path) {
    let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
    let scenario = Scenario::load(path).unwrap();
    let shown = format!("scenarios/{name}.toml");
    let first = simulate(&scenario, scenario.seed).unwrap();
    let report = Report::new(&scenario, &shown, &first);
    let failed = first.failed();
    assert!(
        failed.is_empty(),
        "{name}: invariants failed: {failed:?}\n{}",
        report.render(None)
    );
    assert!(!report.missed(), "{name}: objectives missed\n{}", report.render(None));

    let again = simulate(&scenario, scenario.seed).unwrap();
    let (a, b) = (Trace::to_json_lines(&first.events), Trace::to_json_lines(&again.events));
    assert!(a == b, "{name}: the same seed gave a different trace");
    let other = simulate(&scenario, scenario.seed + 1).unwrap();
    assert_ne!(
        a,
        Trace::to_json_lines(&other.events),
        "{name}: another seed gave the same trace"
    );

    let snapshot = format!("{}\n{}", report.render(None), Report::compact_trace(&first.events));
    insta::assert_snapshot!(name, snapshot);
}

macro_rules! scenario_tests {
    ($($test:ident => $file:literal),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                check(&Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join($file));
            }
        )*

        #[test]
        fn every_scenario_file_has_a_test() {
            let tested = [$($file),*];
            for path in scenarios() {
                let file = path.file_name().unwrap().to_str().unwrap();
                assert!(tested.contains(&file), "{file} has no test in tests/it/scenarios.rs");
            }
        }
    };
}

scenario_tests! {
    adaptive_concurrency => "adaptive-concurrency.toml",
    cache_partition => "cache-partition.toml",
    concurrency_reserve => "concurrency-reserve.toml",
    container_restart => "container-restart.toml",
    container_restart_objectives => "container-restart-objectives.toml",
    escalating_breaker => "escalating-breaker.toml",
    flaky_network => "flaky-network.toml",
    hedged_tail => "hedged-tail.toml",
    hosted_quota => "hosted-quota.toml",
    hosted_quota_cooldown => "hosted-quota-cooldown.toml",
    hosted_quota_tokens => "hosted-quota-tokens.toml",
    llama_cpp_reload => "llama-cpp-reload.toml",
    llama_swap_hold => "llama-swap-hold.toml",
    llama_swap_tune => "llama-swap-tune.toml",
    mixed_tenants_tokens => "mixed-tenants-tokens.toml",
    node_replacement => "node-replacement.toml",
    noisy_tenant => "noisy-tenant.toml",
    ollama_queue_full => "ollama-queue-full.toml",
    overload_burst => "overload-burst.toml",
    reasoning_empty => "reasoning-empty.toml",
    reference_fleet => "reference-fleet.toml",
    replayed_trace => "replayed-trace.toml",
    retry_storm_budget => "retry-storm-budget.toml",
    skew_bypass => "skew-bypass.toml",
    skewed_fleet_caller => "skewed-fleet-caller.toml",
    skewed_fleet_store => "skewed-fleet-store.toml",
    slow_server_shed => "slow-server-shed.toml",
    slow_start_reload => "slow-start-reload.toml",
    priority_classes => "priority-classes.toml",
    two_deployment_fallback => "two-deployment-fallback.toml",
    vllm_overload => "vllm-overload.toml",
}
