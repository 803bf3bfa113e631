//! Fuzzing whole scenarios: generated outages within the default bounds never
//! break an invariant their configuration claims; a failing case shrinks to
//! the fewest faults and is written as a scenario that replays it.
//!
//! The default run is a few dozen cases from a fixed seed, so CI is
//! repeatable. The deep search: `REDSTRING_FUZZ_CASES=2000
//! REDSTRING_FUZZ_SEED=random cargo test -p redstring-suite --test it fuzz::`
//! (or `redstring-sim fuzz scenarios/bounds/default.toml --cases 2000`).
//! Failing inputs are kept in `tests/proptest-regressions/fuzz.txt` (where
//! proptest keeps a test file's cases) and rerun first.

use std::path::Path;

use proptest::test_runner::{Config, FileFailurePersistence, RngSeed, TestCaseError, TestError, TestRunner};
use redstring_sim::campaign::simulate;
use redstring_sim::evidence::trace::{Kind, Trace};
use redstring_sim::scenario::{Fault, FaultKind, Scenario};
use redstring_sim::search::fuzz::{self, Bounds};

fn seed() -> u64 {
    match std::env::var("REDSTRING_FUZZ_SEED").as_deref() {
        Ok("random") => std::process::id().into(),
        Ok(s) => s.parse().expect("REDSTRING_FUZZ_SEED must be an integer or \"random\""),
        Err(_) => 2026,
    }
}

fn cases(default: u32) -> u32 {
    std::env::var("REDSTRING_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn bounds() -> Bounds {
    Bounds::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/bounds/default.toml")).unwrap()
}

#[test]
fn no_generated_outage_breaks_a_claimed_invariant() {
    let seed = seed();
    eprintln!("REDSTRING_FUZZ_SEED={seed}");
    let mut runner = TestRunner::new(Config {
        cases: cases(24),
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/proptest-regressions/fuzz.txt",
        ))),
        ..Config::default()
    });
    let result = runner.run(&fuzz::scenarios(&bounds()), |s| {
        fuzz::check_case(&s).map_err(TestCaseError::fail)
    });
    if let Err(TestError::Fail(reason, minimal)) = result {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/regressions");
        let path = fuzz::write_regression(&dir, &minimal).unwrap();
        panic!(
            "{reason}\nsmallest failing case written to {}\nreplay: redstring-sim run {}",
            path.display(),
            path.display()
        );
    } else if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn generated_scenarios_are_valid_and_round_trip_through_toml() {
    let mut runner = TestRunner::new(Config {
        cases: 200,
        rng_seed: RngSeed::Fixed(seed()),
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&fuzz::scenarios(&bounds()), |s| {
            s.validate("generated")
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let back =
                Scenario::parse("generated.toml", &s.to_toml()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            if back != s {
                return Err(TestCaseError::fail("TOML round trip changed the scenario"));
            }
            Ok(())
        })
        .unwrap();
}

/// A deliberately false property — "no circuit ever opens" — over crash-only
/// outages: the search must find a counterexample, shrink it to a single
/// crash, and write a file that replays the same run.
#[test]
fn a_failing_case_shrinks_to_one_fault_and_replays_from_its_file() {
    let mut b = bounds();
    b.fault_kinds = vec![FaultKind::Crash];
    b.duration_s = [40.0, 90.0];
    b.workers = [1, 2];
    b.servers = [1, 1];
    b.failure_threshold = [1, 2];
    b.max_retries = [0, 1];
    b.calls_per_min = [20.0, 40.0];
    b.max_faults = 4;
    let mut runner = TestRunner::new(Config {
        cases: 64,
        rng_seed: RngSeed::Fixed(7),
        failure_persistence: None,
        ..Config::default()
    });
    let never_opens = |s: Scenario| {
        let run = simulate(&s, s.seed).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let opened = run
            .events
            .iter()
            .any(|e| matches!(&e.kind, Kind::Breaker { to, .. } if *to == redstring::CircuitState::Open));
        if opened {
            Err(TestCaseError::fail("a circuit opened"))
        } else {
            Ok(())
        }
    };
    let Err(TestError::Fail(_, minimal)) = runner.run(&fuzz::scenarios(&b), never_opens) else {
        panic!("the search found no crash that opens a circuit");
    };
    let crashes = minimal
        .faults
        .iter()
        .filter(|f| matches!(f, Fault::Crash { .. }))
        .count();
    assert_eq!(crashes, 1, "shrunk to one crash: {:#?}", minimal.faults);
    assert_eq!(
        minimal.faults.len(),
        2,
        "the crash and its restart: {:#?}",
        minimal.faults
    );

    let dir = std::env::temp_dir().join(format!("redstring-fuzz-{}", std::process::id()));
    let path = fuzz::write_regression(&dir, &minimal).unwrap();
    let replayed = Scenario::load(&path).unwrap();
    let (a, b) = (
        simulate(&minimal, minimal.seed).unwrap(),
        simulate(&replayed, replayed.seed).unwrap(),
    );
    assert_eq!(
        Trace::to_json_lines(&a.events),
        Trace::to_json_lines(&b.events),
        "the file replays the case exactly"
    );
}

/// A runner of `cases` cases from the fixed seed, keeping no failures.
fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        rng_seed: RngSeed::Fixed(seed()),
        failure_persistence: None,
        ..Config::default()
    })
}

/// The bounds file `name` under `scenarios/bounds/`.
fn bounds_file(name: &str) -> Bounds {
    Bounds::load(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("scenarios/bounds")
            .join(name),
    )
    .unwrap()
}

/// Fails unless `s` reads back from its TOML unchanged.
fn round_trips(s: &Scenario) -> Result<(), TestCaseError> {
    let back = Scenario::parse("generated.toml", &s.to_toml()).map_err(|e| TestCaseError::fail(e.to_string()))?;
    if &back == s {
        Ok(())
    } else {
        Err(TestCaseError::fail("TOML round trip changed the scenario"))
    }
}

/// Runs `s` as the fuzzer does (`fuzz::check_case`: valid, simulated, every
/// claimed invariant held) and hands back its trace's events, simulated
/// once.
fn checked(s: &Scenario) -> Result<Vec<redstring_sim::evidence::trace::TraceEvent>, TestCaseError> {
    s.validate("fuzz case")
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let run = simulate(s, s.seed).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let failed = run.failed();
    if failed.is_empty() {
        Ok(run.events)
    } else {
        Err(TestCaseError::fail(format!("invariants failed: {failed:?}")))
    }
}

/// The default space draws none of what the other bounds files opt into —
/// budgets, routing, a slow-call threshold, escalation, hedging, a slow start — so the cases it
/// draws for a seed stay as they were.
#[test]
fn the_default_space_draws_no_opt_in_setting() {
    let b = bounds();
    assert!(
        !b.budgets
            && !b.routing
            && !b.escalation
            && b.slow_call_ms.is_none()
            && b.hedge_after_ms.is_none()
            && b.slow_start_s.is_none()
    );
    runner(64)
        .run(&fuzz::scenarios(&b), |s| {
            let h = &s.hardening;
            let drew = [
                ("a retry budget", h.retry_budget.is_some()),
                ("a token budget", h.tokens_per_window.is_some()),
                ("a routing policy", h.routing.is_some()),
                ("a slow-call threshold", h.slow_call_ms.is_some()),
                ("hedging", h.hedge_after_ms.is_some()),
                ("a slow start", h.slow_start_s.is_some()),
                ("escalation", h.max_recovery_timeout_s.is_some()),
            ];
            match drew.iter().find(|(_, drawn)| *drawn) {
                Some((what, _)) => Err(TestCaseError::fail(format!("the default space drew {what}"))),
                None => Ok(()),
            }
        })
        .unwrap();
}

/// `budgets = true` draws retry and token budgets on some cases, the cases
/// round-trip through TOML with them, and the budgets' invariants hold on
/// what is drawn.
#[test]
fn a_space_with_budgets_draws_them_and_their_invariants_hold() {
    let with = bounds_file("budgets.toml");
    assert!(with.budgets);
    let drawn = std::cell::Cell::new((0u32, 0u32));
    runner(cases(16))
        .run(&fuzz::scenarios(&with), |s| {
            let (b, t) = drawn.get();
            drawn.set((
                b + u32::from(s.hardening.retry_budget.is_some()),
                t + u32::from(s.hardening.tokens_per_window.is_some()),
            ));
            round_trips(&s)?;
            fuzz::check_case(&s).map_err(TestCaseError::fail)
        })
        .unwrap();
    let (budgets, tokens) = drawn.get();
    assert!(
        budgets > 0 && tokens > 0,
        "drawn: {budgets} retry budgets, {tokens} token budgets"
    );
}

/// `routing = true` draws every policy (and none) on some cases, a routed
/// case's workers list every server, the cases round-trip through TOML, and
/// every claimed invariant holds on what is drawn.
#[test]
fn a_space_with_routing_draws_each_policy_and_the_invariants_hold() {
    let with = bounds_file("routing.toml");
    assert!(with.routing);
    let drawn = std::cell::RefCell::new(std::collections::BTreeSet::new());
    runner(cases(16))
        .run(&fuzz::scenarios(&with), |s| {
            drawn.borrow_mut().insert(s.hardening.routing.map(|r| r.name()));
            if s.hardening.routing.is_some() && s.workers.iter().any(|w| w.servers.len() != s.servers.len()) {
                return Err(TestCaseError::fail("a routed worker does not list every server"));
            }
            round_trips(&s)?;
            fuzz::check_case(&s).map_err(TestCaseError::fail)
        })
        .unwrap();
    let drawn = drawn.into_inner();
    assert!(drawn.len() >= 3, "policies drawn: {drawn:?}");
}

/// `slow_call_ms = [min, max]` draws a slow-call threshold on some cases,
/// always below the case's request timeout; the cases round-trip through
/// TOML, some of them count an answer slow, and every claimed invariant —
/// `slow_calls_counted` among them — holds on what is drawn.
#[test]
fn a_space_with_slow_calls_draws_thresholds_and_the_invariants_hold() {
    let with = bounds_file("slow-calls.toml");
    assert!(with.slow_call_ms.is_some());
    let drawn = std::cell::Cell::new((0u32, 0usize));
    runner(cases(16))
        .run(&fuzz::scenarios(&with), |s| {
            let Some(ms) = s.hardening.slow_call_ms else {
                return fuzz::check_case(&s).map_err(TestCaseError::fail);
            };
            if ms as f64 >= s.hardening.request_timeout_s * 1000.0 {
                return Err(TestCaseError::fail("a threshold at or over the request timeout"));
            }
            round_trips(&s)?;
            let slow = checked(&s)?
                .iter()
                .filter(|e| matches!(e.kind, Kind::SlowCall { .. }))
                .count();
            let (n, counted) = drawn.get();
            drawn.set((n + 1, counted + slow));
            Ok(())
        })
        .unwrap();
    let (thresholds, slow) = drawn.get();
    assert!(
        thresholds > 0 && slow > 0,
        "drawn: {thresholds} thresholds, {slow} answers counted slow"
    );
}

/// `hedge_after_ms = [min, max]` draws a hedge delay on some routed cases,
/// always below the case's request timeout and never beside a slow-call
/// threshold; the cases round-trip through TOML, some of them hedge, and
/// every claimed invariant — `hedging` among them — holds on what is drawn.
#[test]
fn a_space_with_hedging_draws_delays_and_the_invariants_hold() {
    let with = bounds_file("hedging.toml");
    assert!(with.hedge_after_ms.is_some());
    let drawn = std::cell::Cell::new((0u32, 0usize));
    runner(cases(16))
        .run(&fuzz::scenarios(&with), |s| {
            let h = &s.hardening;
            let Some(after) = h.hedge_after_ms else {
                return fuzz::check_case(&s).map_err(TestCaseError::fail);
            };
            if h.routing.is_none() || h.slow_call_ms.is_some() {
                return Err(TestCaseError::fail(
                    "hedging without routing, or beside a slow-call threshold",
                ));
            }
            if after.least_ms(h.hedge_floor_ms) as f64 >= h.request_timeout_s * 1000.0 {
                return Err(TestCaseError::fail("a hedge delay at or over the request timeout"));
            }
            round_trips(&s)?;
            let hedges = checked(&s)?
                .iter()
                .filter(|e| matches!(e.kind, Kind::Hedged { .. }))
                .count();
            let (n, sent) = drawn.get();
            drawn.set((n + 1, sent + hedges));
            Ok(())
        })
        .unwrap();
    let (delays, hedges) = drawn.get();
    assert!(delays > 0 && hedges > 0, "drawn: {delays} delays, {hedges} hedges sent");
}

/// `escalation = true` draws `max_recovery_timeout_s` on some cases, never
/// below `recovery_timeout_s`; the cases round-trip through TOML, some circuit re-opens on a failed
/// probe, and every claimed invariant — `escalation` among them — holds on
/// what is drawn.
#[test]
fn a_space_with_escalation_draws_it_and_the_invariants_hold() {
    let with = bounds_file("escalation.toml");
    assert!(with.escalation);
    let drawn = std::cell::Cell::new((0u32, 0usize));
    runner(cases(12))
        .run(&fuzz::scenarios(&with), |s| {
            let h = &s.hardening;
            let Some(max) = h.max_recovery_timeout_s else {
                return fuzz::check_case(&s).map_err(TestCaseError::fail);
            };
            if max < h.recovery_timeout_s {
                return Err(TestCaseError::fail("an escalation cap below the recovery timeout"));
            }
            round_trips(&s)?;
            let reopened = checked(&s)?
                .iter()
                .filter(|e| {
                    matches!(
                        e.kind,
                        Kind::Breaker {
                            from: redstring::CircuitState::HalfOpen,
                            to: redstring::CircuitState::Open,
                            ..
                        }
                    )
                })
                .count();
            let (n, count) = drawn.get();
            drawn.set((n + 1, count + reopened));
            Ok(())
        })
        .unwrap();
    let (caps, reopened) = drawn.get();
    assert!(
        caps > 0 && reopened > 0,
        "drawn: {caps} escalation caps, {reopened} re-openings on a failed probe"
    );
}

/// `slow_start_s = [min, max]` draws a slow start on some cases; the cases
/// round-trip through TOML, some of them draw calls in a ramp, and every
/// claimed invariant — `slow_start` among them — holds on what is drawn.
#[test]
fn a_space_with_slow_start_draws_ramps_and_the_invariants_hold() {
    let with = bounds_file("slow-start.toml");
    assert!(with.slow_start_s.is_some());
    let drawn = std::cell::Cell::new((0u32, 0usize));
    runner(cases(16))
        .run(&fuzz::scenarios(&with), |s| {
            if s.hardening.slow_start_s.is_none() {
                return fuzz::check_case(&s).map_err(TestCaseError::fail);
            }
            round_trips(&s)?;
            let draws = checked(&s)?
                .iter()
                .filter(|e| matches!(e.kind, Kind::SlowStart { .. }))
                .count();
            let (n, ramped) = drawn.get();
            drawn.set((n + 1, ramped + draws));
            Ok(())
        })
        .unwrap();
    let (ramps, draws) = drawn.get();
    assert!(
        ramps > 0 && draws > 0,
        "drawn: {ramps} slow starts, {draws} calls drawn in a ramp"
    );
}

/// `adaptive_concurrency = [min, max]` draws an adaptive limit on some
/// cases; the cases round-trip through TOML, some of them admit and refuse
/// requests under it, and every claimed invariant — `concurrency_limit`
/// among them — holds on what is drawn.
#[test]
fn a_space_with_adaptive_limits_admits_and_refuses_and_the_invariants_hold() {
    let with = bounds_file("adaptive-concurrency.toml");
    assert!(with.adaptive_concurrency.is_some());
    let drawn = std::cell::Cell::new((0u32, 0usize, 0usize));
    runner(cases(16))
        .run(&fuzz::scenarios(&with), |s| {
            if s.hardening.adaptive_concurrency.is_none() {
                return fuzz::check_case(&s).map_err(TestCaseError::fail);
            }
            round_trips(&s)?;
            let events = checked(&s)?;
            let count = |admitted: bool| {
                events
                    .iter()
                    .filter(|e| match e.kind {
                        Kind::ConcurrencyAdmitted { .. } => admitted,
                        Kind::ConcurrencyRefused { .. } => !admitted,
                        _ => false,
                    })
                    .count()
            };
            let (n, admitted, refused) = drawn.get();
            drawn.set((n + 1, admitted + count(true), refused + count(false)));
            Ok(())
        })
        .unwrap();
    let (limits, admitted, refused) = drawn.get();
    assert!(
        limits > 0 && admitted > 0 && refused > 0,
        "drawn: {limits} limits, {admitted} requests admitted, {refused} refused"
    );
}
