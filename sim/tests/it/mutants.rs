//! The checkers can fail: each known-bad variant of the hardening is caught,
//! by the invariant that names its defect, on its targeted scenario — and the
//! correct hardening passes every one of those scenarios.

use std::path::Path;

use redstring_sim::judgement::invariants::Invariant;
use redstring_sim::search::fuzz::Bounds;
use redstring_sim::search::mutants::{self, Budget, CATALOGUE, Mutant, Stage};

use crate::support::scenarios_dir;

fn bounds() -> Bounds {
    Bounds::load(&scenarios_dir().join("bounds/default.toml")).unwrap()
}

/// Hunts `mutant` on its targeted scenario alone and asserts what caught it.
fn caught(mutant: Mutant) {
    let v = mutants::variant(mutant);
    assert_eq!(v.mutant, mutant, "every mutant has a catalogue entry");
    let targeted = mutants::targeted(&scenarios_dir(), &v).unwrap();
    let hunt = mutants::hunt(Some(mutant), Some(&targeted), &bounds(), Budget::new(0, 1), None).unwrap();
    assert_eq!(
        hunt.stage,
        Some(Stage::Targeted),
        "{mutant}: not caught on {}",
        v.scenario
    );
    assert!(
        hunt.caught_by_name(v.named_by),
        "{mutant} was caught by {:?}, not by {}, the invariant that names it",
        hunt.failed,
        v.named_by
    );
}

macro_rules! caught {
    ($($test:ident => $mutant:ident,)*) => {
        $(
            #[test]
            fn $test() {
                caught(Mutant::$mutant);
            }
        )*

        #[test]
        fn every_variant_has_a_test() {
            let tested = [$(Mutant::$mutant),*];
            for m in Mutant::ALL {
                assert!(tested.contains(&m), "{m} has no test");
            }
        }
    };
}

caught! {
    three_call_limiter_is_caught_by_rpm_per_window => ThreeCallLimiter,
    refusals_recorded_is_caught_by_retry_after_monotone => RefusalsRecorded,
    failure_ttl_refreshed_is_caught_by_sparse_failures => FailureTtlRefreshed,
    unlimited_probes_is_caught_by_half_open_probes => UnlimitedProbes,
    transition_not_probe_is_caught_by_half_open_probes => TransitionNotProbe,
    read_then_write_breaker_is_caught_by_half_open_probes => ReadThenWriteBreaker,
    caller_stamped_time_is_caught_by_rpm_per_window => CallerStampedTime,
    retry_outside_limiter_is_caught_by_once_per_call => RetryOutsideLimiter,
    retry_outside_breaker_is_caught_by_once_per_call => RetryOutsideBreaker,
    fixed_window_limiter_is_caught_by_rpm_per_window => FixedWindowLimiter,
    no_jitter_is_caught_by_retry_jitter => NoJitter,
    probe_never_reports_is_caught_by_no_wedged_circuit => ProbeNeverReports,
    success_keeps_failures_is_caught_by_opens_at_threshold => SuccessKeepsFailures,
    per_replica_limits_is_caught_by_rpm_per_window => PerReplicaLimits,
    tokens_charged_after_call_is_caught_by_tokens_per_window => TokensChargedAfterCall,
    cooldown_not_extended_is_caught_by_no_call_in_cooldown => CooldownNotExtended,
    fallback_retries_anew_is_caught_by_accounting => FallbackRetriesAnew,
    exact_retry_after_is_caught_by_retry_jitter => ExactRetryAfter,
    skips_unreported_is_caught_by_skips_visible => SkipsUnreported,
    retry_after_withheld_is_caught_by_retry_after_returned => RetryAfterWithheld,
    hard_quota_as_rate_limit_is_caught_by_no_call_in_cooldown => HardQuotaAsRateLimit,
    escalation_forgotten_is_caught_by_escalation => EscalationForgotten,
    quota_group_ignored_is_caught_by_no_call_in_cooldown => QuotaGroupIgnored,
    slow_calls_ignored_is_caught_by_slow_calls_counted => SlowCallsIgnored,
    hedges_skip_budget_is_caught_by_hedging => HedgesSkipBudget,
    slow_start_ignored_is_caught_by_slow_start => SlowStartIgnored,
    priority_ignored_is_caught_by_priority_share => PriorityIgnored,
    concurrency_limit_ignored_is_caught_by_concurrency_limit => ConcurrencyLimitIgnored,
    concurrency_reserve_ignored_is_caught_by_concurrency_limit => ConcurrencyReserveIgnored,
}

#[test]
fn the_correct_hardening_passes_every_targeted_scenario() {
    let mut seen = std::collections::BTreeSet::new();
    for v in CATALOGUE {
        if !seen.insert(v.scenario) {
            continue;
        }
        let targeted = mutants::targeted(&scenarios_dir(), &v).unwrap();
        let hunt = mutants::hunt(None, Some(&targeted), &bounds(), Budget::new(0, 1), None).unwrap();
        assert!(hunt.failed.is_empty(), "{}: {:?}", v.scenario, hunt.failed);
    }
}

#[test]
fn each_new_invariant_names_at_least_one_variant() {
    for named in [
        Invariant::OncePerCall,
        Invariant::RetryJitter,
        Invariant::NoWedgedCircuit,
        Invariant::OpensAtThreshold,
        Invariant::SkipsVisible,
        Invariant::SlowCallsCounted,
        Invariant::Hedging,
        Invariant::SlowStart,
        Invariant::ConcurrencyLimit,
    ] {
        assert!(
            CATALOGUE.iter().any(|v| v.named_by == named),
            "{named} names no variant"
        );
    }
}

#[test]
fn the_injection_ends_with_its_guard() {
    let targeted = mutants::targeted(&scenarios_dir(), &mutants::variant(Mutant::NoJitter)).unwrap();
    let mutated = mutants::simulate_with(Some(Mutant::NoJitter), &targeted, targeted.seed).unwrap();
    assert!(mutated.failed().contains(&Invariant::RetryJitter));
    let after = redstring_sim::campaign::simulate(&targeted, targeted.seed).unwrap();
    assert!(
        after.failed().is_empty(),
        "the mutant outlived its run: {:?}",
        after.failed()
    );
}

#[test]
fn the_command_prints_the_table_and_passes_the_correct_hardening() {
    let out = std::env::temp_dir().join(format!("redstring-mutants-{}", std::process::id()));
    let output = crate::support::bin()
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .args([
            "mutants",
            "--cases",
            "2",
            "--only",
            "no_jitter",
            "--only",
            "unlimited_probes",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("no_jitter") && stdout.contains("retry_jitter"),
        "{stdout}"
    );
    assert!(
        stdout.contains("unlimited_probes") && stdout.contains("half_open_probes"),
        "{stdout}"
    );
    assert!(stdout.contains("correct hardening: passed"), "{stdout}");
    // Two targeted scenarios with no crash in them: the tally says so.
    assert!(stdout.contains("exercised by the hunts"), "{stdout}");
    assert!(
        stdout.contains("NEVER EXERCISED") && stdout.contains("faults: crash"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn the_fuzzer_catches_a_variant_its_scenario_misses_and_shrinks_a_replayable_case() {
    // A scenario with no retries cannot show missing jitter: the fuzzer must.
    let calm = mutants::targeted(&scenarios_dir(), &mutants::variant(Mutant::FixedWindowLimiter)).unwrap();
    let hunt = mutants::hunt(
        Some(Mutant::NoJitter),
        Some(&calm),
        &bounds(),
        Budget {
            cases: 64,
            seed: 3,
            shrink: 16,
        },
        None,
    )
    .unwrap();
    assert!(
        matches!(hunt.stage, Some(Stage::Fuzzed(n)) if n >= 1),
        "{:?}",
        hunt.stage
    );
    assert!(hunt.caught_by_name(Invariant::RetryJitter), "{:?}", hunt.failed);
    assert!(hunt.simulations >= 2);
    let case = hunt.case.unwrap();
    let dir = std::env::temp_dir().join(format!("redstring-mutant-case-{}", std::process::id()));
    let path = mutants::write_case(&dir, Mutant::NoJitter, &case).unwrap();
    let replayed = redstring_sim::scenario::Scenario::load(&path).unwrap();
    let mutated = mutants::simulate_with(Some(Mutant::NoJitter), &replayed, replayed.seed).unwrap();
    assert!(
        mutated.failed().contains(&Invariant::RetryJitter),
        "the written case replays the catch"
    );
    let correct = redstring_sim::campaign::simulate(&replayed, replayed.seed).unwrap();
    assert!(
        correct.failed().is_empty(),
        "the correct hardening passes it: {:?}",
        correct.failed()
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_unknown_mutant_is_refused_naming_the_catalogue() {
    let output = crate::support::bin()
        .args(["run", "scenarios/mutants/hung-server.toml", "--mutant", "no_such"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no mutant named") && stderr.contains("three_call_limiter"),
        "{stderr}"
    );
}

#[test]
fn every_committed_catch_still_catches_its_mutant_and_passes_the_correct_hardening() {
    let dir = scenarios_dir().join("regressions/mutants");
    let mut replayed = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let name = stem.strip_prefix("caught-").unwrap().replace('-', "_");
        let mutant = Mutant::parse(&name).unwrap_or_else(|| panic!("{stem} names no mutant"));
        let case = redstring_sim::scenario::Scenario::load(&path).unwrap();
        let mutated = mutants::simulate_with(Some(mutant), &case, case.seed).unwrap();
        let named = mutants::variant(mutant).named_by;
        assert!(mutated.failed().contains(&named), "{stem}: {:?}", mutated.failed());
        let correct = redstring_sim::campaign::simulate(&case, case.seed).unwrap();
        assert!(
            correct.failed().is_empty(),
            "{stem}, correct hardening: {:?}",
            correct.failed()
        );
        replayed.push(mutant);
    }
    replayed.sort();
    // A gateway's reported failure is hunted by its conformance scenario:
    // the fuzzer's bounds do not draw what those scenarios need.
    let fuzzed: Vec<Mutant> = CATALOGUE
        .iter()
        .filter(|v| !v.is_conformance())
        .map(|v| v.mutant)
        .collect();
    assert_eq!(replayed, fuzzed, "one committed catch per variant the fuzzer hunts");
}
