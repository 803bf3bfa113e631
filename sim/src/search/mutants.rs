//! Proving the checkers can fail: every known-bad variant of the hardening,
//! hunted until an invariant catches it.
//!
//! A harness whose invariants could never fail would also report every
//! scenario passing. [`CATALOGUE`] pairs each [`Mutant`] — one real defect of
//! the field, injected into the real components (see [`redstring::mutants`])
//! — with the invariant that names its defect and a scenario written to
//! expose it. [`hunt`] runs that scenario with the mutant injected and, if
//! nothing fails, the fuzzer, case after case, until some claimed invariant
//! fails; proptest then shrinks the case to the fewest, shortest faults that
//! still fail. The correct hardening runs the same budget ([`hunt`] with no
//! mutant) and must pass it: a catch that the correct code would also
//! "make" is a false alarm, not a catch.

use std::path::{Path, PathBuf};
use std::time::Duration;

use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};
pub use redstring::mutants::Mutant;

use crate::campaign::simulate;
use crate::judgement::Run;
use crate::judgement::invariants::Invariant;
use crate::scenario::Scenario;
use crate::search::coverage::Coverage;
use crate::search::fuzz::{self, Bounds};
use crate::world::SimError;

/// The directory, under the scenarios directory, that holds the scenarios
/// written to expose each variant of the library's own defects (the
/// correct hardening passes them all, and `check` runs them like any
/// other).
pub const SCENARIO_DIR: &str = "mutants";

/// The directory, under the scenarios directory, of the conformance suite:
/// one scenario per failure users report in LLM gateways, each the
/// targeted scenario of the variant that behaves as the gateway did
/// (`docs/conformance.md`).
pub const CONFORMANCE_DIR: &str = "conformance";

/// One variant of the catalogue: the defect, the invariant that names it,
/// and the scenario written to expose it.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    /// The injected defect.
    pub mutant: Mutant,
    /// The invariant whose failure names this defect.
    pub named_by: Invariant,
    /// The targeted scenario's path under the scenarios directory: in
    /// [`SCENARIO_DIR`], in [`CONFORMANCE_DIR`] for a gateway's reported
    /// failure, or a shipped scenario that shows the setting the variant
    /// breaks.
    pub scenario: &'static str,
}

impl Variant {
    /// Whether this variant is a gateway's reported failure, hunted by its
    /// conformance scenario (the fuzzer's bounds do not draw the fleets,
    /// budgets or routing those scenarios need, so no committed fuzz catch
    /// is kept for it).
    pub fn is_conformance(&self) -> bool {
        self.scenario
            .strip_prefix(CONFORMANCE_DIR)
            .is_some_and(|rest| rest.starts_with('/'))
    }
}

/// Every variant, in [`Mutant::ALL`] order.
pub const CATALOGUE: [Variant; 29] = [
    Variant {
        mutant: Mutant::ThreeCallLimiter,
        named_by: Invariant::RpmPerWindow,
        scenario: "mutants/limiter-race.toml",
    },
    Variant {
        mutant: Mutant::RefusalsRecorded,
        named_by: Invariant::RetryAfterMonotone,
        scenario: "mutants/limiter-waits.toml",
    },
    Variant {
        mutant: Mutant::FailureTtlRefreshed,
        named_by: Invariant::SparseFailures,
        scenario: "mutants/sparse-errors.toml",
    },
    Variant {
        mutant: Mutant::UnlimitedProbes,
        named_by: Invariant::HalfOpenProbes,
        scenario: "mutants/hung-server.toml",
    },
    Variant {
        mutant: Mutant::TransitionNotProbe,
        named_by: Invariant::HalfOpenProbes,
        scenario: "mutants/hung-server.toml",
    },
    Variant {
        mutant: Mutant::ReadThenWriteBreaker,
        named_by: Invariant::HalfOpenProbes,
        scenario: "mutants/hung-server-fleet.toml",
    },
    Variant {
        mutant: Mutant::CallerStampedTime,
        named_by: Invariant::RpmPerWindow,
        scenario: "mutants/skewed-store.toml",
    },
    Variant {
        mutant: Mutant::RetryOutsideLimiter,
        named_by: Invariant::OncePerCall,
        scenario: "mutants/retries-under-errors.toml",
    },
    Variant {
        mutant: Mutant::RetryOutsideBreaker,
        named_by: Invariant::OncePerCall,
        scenario: "mutants/retries-under-errors.toml",
    },
    Variant {
        mutant: Mutant::FixedWindowLimiter,
        named_by: Invariant::RpmPerWindow,
        scenario: "mutants/window-boundary.toml",
    },
    Variant {
        mutant: Mutant::NoJitter,
        named_by: Invariant::RetryJitter,
        scenario: "mutants/retries-under-errors.toml",
    },
    Variant {
        mutant: Mutant::ProbeNeverReports,
        named_by: Invariant::NoWedgedCircuit,
        scenario: "mutants/hung-server.toml",
    },
    Variant {
        mutant: Mutant::SuccessKeepsFailures,
        named_by: Invariant::OpensAtThreshold,
        scenario: "mutants/interleaved-failures.toml",
    },
    Variant {
        mutant: Mutant::PerReplicaLimits,
        named_by: Invariant::RpmPerWindow,
        scenario: "conformance/replicas-multiply-a-limit.toml",
    },
    Variant {
        mutant: Mutant::TokensChargedAfterCall,
        named_by: Invariant::TokensPerWindow,
        scenario: "conformance/concurrent-token-overspend.toml",
    },
    Variant {
        mutant: Mutant::CooldownNotExtended,
        named_by: Invariant::NoCallInCooldown,
        scenario: "conformance/cooldown-never-shortened.toml",
    },
    Variant {
        mutant: Mutant::FallbackRetriesAnew,
        named_by: Invariant::Accounting,
        scenario: "conformance/bounded-fallback.toml",
    },
    Variant {
        mutant: Mutant::ExactRetryAfter,
        named_by: Invariant::RetryJitter,
        scenario: "conformance/synchronised-retry-waits.toml",
    },
    Variant {
        mutant: Mutant::SkipsUnreported,
        named_by: Invariant::SkipsVisible,
        scenario: "conformance/breaker-skips-visible.toml",
    },
    Variant {
        mutant: Mutant::RetryAfterWithheld,
        named_by: Invariant::RetryAfterReturned,
        scenario: "conformance/every-deployment-cooling.toml",
    },
    Variant {
        mutant: Mutant::HardQuotaAsRateLimit,
        named_by: Invariant::NoCallInCooldown,
        scenario: "conformance/hard-quota-mistaken.toml",
    },
    Variant {
        mutant: Mutant::EscalationForgotten,
        named_by: Invariant::Escalation,
        scenario: "escalating-breaker.toml",
    },
    Variant {
        mutant: Mutant::QuotaGroupIgnored,
        named_by: Invariant::NoCallInCooldown,
        scenario: "conformance/account-quota-shared-by-keys.toml",
    },
    Variant {
        mutant: Mutant::SlowCallsIgnored,
        named_by: Invariant::SlowCallsCounted,
        scenario: "slow-server-shed.toml",
    },
    Variant {
        mutant: Mutant::HedgesSkipBudget,
        named_by: Invariant::Hedging,
        scenario: "hedged-tail.toml",
    },
    Variant {
        mutant: Mutant::SlowStartIgnored,
        named_by: Invariant::SlowStart,
        scenario: "slow-start-reload.toml",
    },
    Variant {
        mutant: Mutant::PriorityIgnored,
        named_by: Invariant::PriorityShare,
        scenario: "priority-classes.toml",
    },
    Variant {
        mutant: Mutant::ConcurrencyLimitIgnored,
        named_by: Invariant::ConcurrencyLimit,
        scenario: "adaptive-concurrency.toml",
    },
    Variant {
        mutant: Mutant::ConcurrencyReserveIgnored,
        named_by: Invariant::ConcurrencyLimit,
        scenario: "concurrency-reserve.toml",
    },
];

/// The catalogue's entry for `mutant`.
pub fn variant(mutant: Mutant) -> Variant {
    CATALOGUE
        .into_iter()
        .find(|v| v.mutant == mutant)
        .unwrap_or(CATALOGUE[0])
}

/// Runs `scenario` with `seed` with `mutant` (or, with `None`, the correct
/// hardening) injected into every component of the world.
pub fn simulate_with(mutant: Option<Mutant>, scenario: &Scenario, seed: u64) -> Result<Run, SimError> {
    let _injected = redstring::mutants::inject(mutant);
    simulate(scenario, seed)
}

/// Where in the hunt a failure was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The variant's targeted scenario.
    Targeted,
    /// The fuzzer's case with this number (1-based), before shrinking.
    Fuzzed(u32),
}

/// What a hunt found.
#[derive(Clone, Debug)]
pub struct Hunt {
    /// The variant hunted (`None`: the correct hardening).
    pub mutant: Option<Mutant>,
    /// The claimed invariants that failed on the case that caught it, in
    /// [`Invariant::ALL`] order; empty when nothing caught it within the
    /// budget.
    pub failed: Vec<Invariant>,
    /// Where the failing case was found; `None` when nothing failed.
    pub stage: Option<Stage>,
    /// Simulations run until the failure was found (or in all), shrinking
    /// not included.
    pub simulations: u32,
    /// Simulated time those simulations covered.
    pub simulated: Duration,
    /// The failing case, shrunk when the fuzzer found it.
    pub case: Option<Scenario>,
}

impl Hunt {
    /// Whether the variant was caught by the invariant that names it.
    pub fn caught_by_name(&self, named_by: Invariant) -> bool {
        self.failed.contains(&named_by)
    }
}

/// How much searching one hunt may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Fuzz cases to try after the targeted scenario passed.
    pub cases: u32,
    /// The search's seed: the same seed tries the same cases.
    pub seed: u64,
    /// The most simulations shrinking a failing case may take.
    pub shrink: u32,
}

impl Budget {
    /// `cases` fuzz cases from `seed`, shrinking a failure for up to 256
    /// simulations.
    pub fn new(cases: u32, seed: u64) -> Budget {
        Budget {
            cases,
            seed,
            shrink: 256,
        }
    }
}

/// Hunts `mutant` (or, with `None`, runs the same budget on the correct
/// hardening): the targeted scenario first (unless `None`: the fuzzer
/// alone), then up to `budget.cases` fuzz cases from `bounds`, until the
/// invariant that names the mutant fails (for the correct hardening: any).
/// `coverage`, if given, observes every run until then.
pub fn hunt(
    mutant: Option<Mutant>,
    targeted: Option<&Scenario>,
    bounds: &Bounds,
    budget: Budget,
    mut coverage: Option<&mut Coverage>,
) -> Result<Hunt, String> {
    let Budget { cases, seed, shrink } = budget;
    // A mutant is hunted until the invariant that names it fails (another
    // failing first is reported, but the search goes on); the correct
    // hardening, until anything fails.
    let named_by = mutant.map(|m| variant(m).named_by);
    let catches = |failed: &[Invariant]| match named_by {
        Some(named) => failed.contains(&named),
        None => !failed.is_empty(),
    };
    let mut hunt = Hunt {
        mutant,
        failed: Vec::new(),
        stage: None,
        simulations: 0,
        simulated: Duration::ZERO,
        case: None,
    };
    if let Some(targeted) = targeted {
        let run = simulate_with(mutant, targeted, targeted.seed)
            .map_err(|e| format!("{}: simulation failed: {e}", targeted.name))?;
        if let Some(c) = coverage.as_deref_mut() {
            c.observe(&run.events);
        }
        hunt.failed = run.failed();
        hunt.simulations = 1;
        hunt.simulated = run.simulated;
        if catches(&hunt.failed) {
            hunt.stage = Some(Stage::Targeted);
            hunt.case = Some(targeted.clone());
            return Ok(hunt);
        }
    }
    if cases == 0 {
        hunt.failed.clear();
        return Ok(hunt);
    }
    let mut runner = TestRunner::new(Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: shrink,
        ..Config::default()
    });
    let progress = std::cell::Cell::new((0u32, Duration::ZERO, None::<u32>));
    let coverage = std::cell::RefCell::new(coverage);
    let result = runner.run(&fuzz::scenarios(bounds), |scenario| {
        // A case the simulator cannot run is no catch: set it aside (too
        // many of them end the search with an error).
        let run = simulate_with(mutant, &scenario, scenario.seed)
            .map_err(|e| TestCaseError::reject(format!("simulation failed: {e}")))?;
        let (n, simulated, found) = progress.get();
        if found.is_none() {
            if let Some(c) = coverage.borrow_mut().as_deref_mut() {
                c.observe(&run.events);
            }
            let found = catches(&run.failed()).then_some(n + 1);
            progress.set((n + 1, simulated + run.simulated, found));
        }
        if catches(&run.failed()) {
            Err(TestCaseError::fail(names(&run.failed())))
        } else {
            Ok(())
        }
    });
    let (n, simulated, found) = progress.get();
    hunt.simulations += n;
    hunt.simulated += simulated;
    match result {
        Ok(()) => {
            // Nothing caught: no case to report, and no invariant.
            hunt.failed.clear();
            Ok(hunt)
        }
        Err(TestError::Fail(_, minimal)) => {
            let run = simulate_with(mutant, &minimal, minimal.seed)
                .map_err(|e| format!("the shrunk case failed to simulate: {e}"))?;
            hunt.failed = run.failed();
            hunt.stage = found.map(Stage::Fuzzed);
            hunt.case = Some(minimal);
            Ok(hunt)
        }
        Err(TestError::Abort(reason)) => Err(format!("the search stopped: {reason}")),
    }
}

/// Loads the targeted scenario of `variant` from `scenarios_dir`.
pub fn targeted(scenarios_dir: &Path, variant: &Variant) -> Result<Scenario, String> {
    let path = scenarios_dir.join(variant.scenario);
    Scenario::load(&path).map_err(|e| e.to_string())
}

/// Writes a hunt's failing case as a scenario `run --mutant` replays, named
/// after the variant, and returns its path.
pub fn write_case(dir: &Path, mutant: Mutant, case: &Scenario) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let mut s = case.clone();
    s.name = format!("caught-{}", mutant.name().replace('_', "-"));
    s.description = format!(
        "The smallest case found that catches the {} mutant; replay it with redstring-sim run --mutant {}.",
        mutant.name(),
        mutant.name()
    );
    let path = dir.join(format!("{}.toml", s.name));
    std::fs::write(&path, s.to_toml())?;
    Ok(path)
}

fn names(failed: &[Invariant]) -> String {
    failed.iter().map(|i| i.name()).collect::<Vec<_>>().join(", ")
}
