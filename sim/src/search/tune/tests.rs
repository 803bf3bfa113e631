//! The tune's unit tests: specs, design, judging, ranking and rendering.

use super::*;

#[test]
fn specs_parse_as_integers_decimals_steps_and_lists() {
    let d = Dim::parse("hardening.failure_threshold=1..10").unwrap();
    assert_eq!((d.key.as_str(), d.levels()), ("hardening.failure_threshold", Some(10)));
    assert_eq!(d.level(0), "1");
    assert_eq!(d.level(9), "10");
    let d = Dim::parse("hardening.jitter=0.1..0.3:0.1").unwrap();
    assert_eq!(d.levels(), Some(3));
    assert_eq!((d.level(0), d.level(2)), ("0.1".into(), "0.3".into()));
    let d = Dim::parse("hardening.recovery_timeout_s=5..10:2.5").unwrap();
    assert_eq!(d.levels(), Some(3));
    assert_eq!(d.level(1), "7.5");
    let d = Dim::parse("hardening.multiplier=1.5..3").unwrap();
    assert_eq!(d.levels(), None);
    assert_eq!(d.at(0.0), "1.5");
    assert_eq!(d.at(0.5), "2.25");
    // A whole-number step over integers is a float range.
    let d = Dim::parse("hardening.recovery_timeout_s=5..20:5").unwrap();
    assert_eq!(d.level(3), "20.0");
    let d = Dim::parse("cache.kind=per_worker,shared").unwrap();
    assert_eq!(d.levels(), Some(2));
    assert_eq!(d.at(0.99), "shared");
}

#[test]
fn bad_specs_are_refused_naming_the_argument() {
    for arg in [
        "no-equals",
        "=1..2",
        "a..b=1..2",
        "k=5..1",
        "k=1.5..0.5",
        "k=1..x",
        "k=0..1:0",
        "k=0..1:-1",
        "k=1,,2",
        "k=0..1e9:1e-9",
        "k=nan..1.0",
    ] {
        match Dim::parse(arg) {
            Err(TuneError::Syntax { arg: got, .. }) => assert_eq!(got, arg),
            other => panic!("{arg}: {other:?}"),
        }
    }
}

#[test]
fn a_small_grid_is_the_design_in_order() {
    let dims = [Dim::parse("a=1..2").unwrap(), Dim::parse("b=x,y,z").unwrap()];
    let d = design(&dims, 6, 1);
    assert_eq!(d.kind, DesignKind::Grid);
    assert_eq!(d.grid_size, Some(6));
    let got: Vec<String> = d.candidates.iter().map(|c| c.join(",")).collect();
    assert_eq!(got, ["1,x", "1,y", "1,z", "2,x", "2,y", "2,z"]);
}

#[test]
fn a_large_space_is_a_latin_hypercube_one_per_stratum() {
    let dims = [Dim::parse("a=0..99").unwrap(), Dim::parse("b=0.0..1.0").unwrap()];
    let d = design(&dims, 10, 7);
    assert_eq!(d.kind, DesignKind::LatinHypercube);
    assert_eq!(d.grid_size, None);
    assert_eq!(d.candidates.len(), 10);
    // Each tenth of each range holds exactly one candidate.
    let mut a: Vec<u64> = d.candidates.iter().map(|c| c[0].parse::<u64>().unwrap() / 10).collect();
    let mut b: Vec<u64> = d
        .candidates
        .iter()
        .map(|c| (c[1].parse::<f64>().unwrap() * 10.0) as u64)
        .collect();
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, (0..10).collect::<Vec<_>>());
    assert_eq!(b, (0..10).collect::<Vec<_>>());
    // The same seed draws the same design; another seed another.
    assert_eq!(design(&dims, 10, 7), d);
    assert_ne!(design(&dims, 10, 8).candidates, d.candidates);
}

#[test]
fn rungs_double_the_seeds_up_to_the_count() {
    assert_eq!(rung_seeds(16, false), [2, 4, 8, 16]);
    assert_eq!(rung_seeds(10, false), [2, 4, 8, 10]);
    assert_eq!(rung_seeds(1, false), [1]);
    assert_eq!(rung_seeds(16, true), [16]);
}

fn figure(name: &'static str, target: f64, worst: Worst, passed: u64) -> ObjectiveFigure {
    let scale = if target > 0.0 { target } else { 1.0 };
    ObjectiveFigure {
        name: name.to_owned(),
        target,
        worst,
        passed,
        seeds: 4,
        measured: if worst == Worst::NotApplicable { 0 } else { 4 },
        slack: match worst {
            Worst::Measured { value } => Some((target - value) / scale),
            _ => None,
        },
    }
}

fn verdict(name: &'static str, target: f64, judged: Judged) -> ObjectiveVerdict {
    ObjectiveVerdict { name, target, judged }
}

fn seed_objectives(v: &[ObjectiveVerdict]) -> Vec<SeedObjective> {
    v.iter().map(SeedObjective::of).collect()
}

#[test]
fn an_objective_is_judged_by_its_worst_seed_and_not_applicable_seeds_do_not_count() {
    let v = [
        verdict("p99_latency_s", 10.0, Judged::Met { measured: 4.0 }),
        verdict("p99_latency_s", 10.0, Judged::NotApplicable { why: "x".into() }),
        verdict("p99_latency_s", 10.0, Judged::Met { measured: 8.0 }),
    ];
    let f = objective_figure(&seed_objectives(&v).iter().collect::<Vec<_>>()).unwrap();
    assert_eq!(f.worst, Worst::Measured { value: 8.0 });
    assert_eq!((f.passed, f.seeds, f.met()), (3, 3, true));
    assert!((f.slack.unwrap() - 0.2).abs() < 1e-12);
    let never = [
        verdict("goodput_recovery_s", 30.0, Judged::Met { measured: 4.0 }),
        verdict(
            "goodput_recovery_s",
            30.0,
            Judged::Missed {
                measured: None,
                why: None,
            },
        ),
    ];
    let f = objective_figure(&seed_objectives(&never).iter().collect::<Vec<_>>()).unwrap();
    assert_eq!((f.worst, f.slack, f.met()), (Worst::Never, None, false));
    // A target of 0 divides by 1.
    let zero = [verdict(
        "impaired_requests_max",
        0.0,
        Judged::Missed {
            measured: Some(3.0),
            why: None,
        },
    )];
    assert_eq!(
        objective_figure(&seed_objectives(&zero).iter().collect::<Vec<_>>())
            .unwrap()
            .slack,
        Some(-3.0)
    );
}

fn candidate(id: usize, objectives: Vec<ObjectiveFigure>) -> Candidate {
    let margin = if objectives.iter().any(|o| o.slack.is_none()) {
        None
    } else {
        objectives.iter().filter_map(|o| o.slack).reduce(f64::min)
    };
    Candidate {
        id,
        values: BTreeMap::new(),
        seeds: 4,
        summary: SweepSummary::default(),
        meets_all: objectives.iter().all(ObjectiveFigure::met)
            && objectives.iter().any(|o| o.worst != Worst::NotApplicable),
        objectives,
        margin,
        disqualified: None,
    }
}

#[test]
fn a_candidate_meeting_more_objective_seed_pairs_outranks_a_larger_margin() {
    let m = |v| Worst::Measured { value: v };
    // Misses the impossible objective by less, but misses goodput too on
    // every seed: 4 of 12 pairs met (the failed fraction's).
    let worse = candidate(
        1,
        vec![
            figure("impaired_requests_max", 1.0, m(5.0), 0),
            figure("goodput_recovery_s", 10.0, m(18.0), 0),
            figure("failed_fraction_max", 0.1, m(0.05), 4),
        ],
    );
    // Misses only the impossible objective, by more: 8 of 12 met.
    let better = candidate(
        2,
        vec![
            figure("impaired_requests_max", 1.0, m(7.0), 0),
            figure("goodput_recovery_s", 10.0, m(4.0), 4),
            figure("failed_fraction_max", 0.1, m(0.05), 4),
        ],
    );
    assert!(worse.margin > better.margin, "the old ranking's key favours the worse");
    assert_eq!((worse.pairs_met(), better.pairs_met()), ((4, 12), (8, 12)));
    let mut all = [worse, better];
    all.sort_by(Candidate::rank);
    assert_eq!(all.map(|c| c.id), [2, 1]);
}

#[test]
fn the_closest_candidate_is_named_with_its_pairs_and_each_objective_none_meets() {
    let m = |v| Worst::Measured { value: v };
    let a = candidate(
        1,
        vec![
            figure("impaired_requests_max", 1.0, m(7.0), 0),
            figure("goodput_recovery_s", 10.0, m(4.0), 4),
        ],
    );
    let b = candidate(
        2,
        vec![
            figure("impaired_requests_max", 1.0, m(5.0), 0),
            figure("goodput_recovery_s", 10.0, m(18.0), 1),
        ],
    );
    let tuning = Tuning {
        scenario: "s.toml".into(),
        keys: Vec::new(),
        design: DesignKind::Grid,
        grid_size: Some(2),
        seeds: [1, 5],
        rungs: vec![Rung {
            seeds: 4,
            candidates: 2,
            disqualified: 0,
            kept: 2,
        }],
        candidates: vec![a, b],
        front: vec![1, 2],
        recommended: Some(1),
        hardening_toml: None,
    };
    let text = tuning.render(&[]);
    assert!(
        text.contains("the closest: #1 , meets 4 of 8 (objective, seed) pairs"),
        "{text}"
    );
    assert!(
        text.contains("no candidate meets impaired_requests_max ≤ 1 on every seed; the best worst figure is 5 (#2)\n  what bounds it:"),
        "{text}"
    );
    assert!(text.contains("request_timeout_s"), "{text}");
    // goodput_recovery_s is met by #1 on every seed: not listed.
    assert!(!text.contains("no candidate meets goodput_recovery_s"), "{text}");
}

#[test]
fn a_candidate_that_measured_nothing_ranks_below_one_that_measured_and_missed() {
    let m = |v| Worst::Measured { value: v };
    // Every objective not applicable on every seed: no pair measured.
    let nothing = candidate(
        1,
        vec![
            figure("failed_fraction_max", 0.1, Worst::NotApplicable, 4),
            figure("p99_latency_s", 10.0, Worst::NotApplicable, 4),
        ],
    );
    // Measured, and missed one objective on every seed.
    let missed = candidate(
        2,
        vec![
            figure("failed_fraction_max", 0.1, m(0.2), 0),
            figure("p99_latency_s", 10.0, m(3.0), 4),
        ],
    );
    assert_eq!((nothing.pairs_met(), missed.pairs_met()), ((0, 0), (4, 8)));
    let mut all = [nothing, missed];
    all.sort_by(Candidate::rank);
    assert_eq!(all.map(|c| c.id), [2, 1]);
}

#[test]
fn ranking_puts_meeting_all_first_then_the_larger_margin() {
    let m = |v| Worst::Measured { value: v };
    // Meets both, margin 0.1.
    let a = candidate(1, vec![figure("r", 10.0, m(9.0), 4), figure("i", 10.0, m(5.0), 4)]);
    // Meets both, margin 0.5.
    let b = candidate(2, vec![figure("r", 10.0, m(5.0), 4), figure("i", 10.0, m(4.0), 4)]);
    // Misses one, though its other slack is huge.
    let c = candidate(3, vec![figure("r", 10.0, m(0.0), 4), figure("i", 10.0, m(11.0), 3)]);
    // Never recovered.
    let d = candidate(
        4,
        vec![figure("r", 10.0, Worst::Never, 3), figure("i", 10.0, m(0.0), 4)],
    );
    let mut all = [d.clone(), c.clone(), a.clone(), b.clone()];
    all.sort_by(Candidate::rank);
    let ids: Vec<usize> = all.iter().map(|c| c.id).collect();
    assert_eq!(ids, [2, 1, 3, 4]);
    // Dominance: b beats a on both; c and b trade off; d is beaten by nobody on `i`.
    assert!(b.dominates(&a));
    assert!(!a.dominates(&b));
    assert!(!b.dominates(&c) && !c.dominates(&b));
    assert!(!b.dominates(&d));
    assert!(!a.dominates(&a));
}

#[test]
fn an_invariant_failure_or_a_failed_simulation_disqualifies_naming_the_seed() {
    let text = "name = \"t\"\nduration_s = 10\n[[servers]]\nname = \"gpu\"\n[[workers]]\nname = \"w\"\nservers = [\"gpu\"]\ntenants = [{ id = 1, calls_per_min = 30 }]\n[objectives]\np99_latency_s = 10\n";
    let scenario = Scenario::parse("t.toml", text).unwrap();
    let report = |seed| Report::new(&scenario, "t.toml", &simulate(&scenario, seed).unwrap());
    let dims = [Dim::parse("hardening.failure_threshold=1..2").unwrap()];
    let values = ["1".to_owned()];
    let clean = judge(1, &dims, &values, &[(1, Ok(report(1))), (2, Ok(report(2)))]);
    assert_eq!(clean.disqualified, None);
    assert!(clean.meets_all, "{clean:?}");
    let mut broken = report(2);
    broken.checks[0].verdict = crate::judgement::invariants::Verdict::Violated {
        t_us: 1,
        host: "w".into(),
        detail: "x".into(),
    };
    let name = broken.checks[0].name.to_string();
    let c = judge(1, &dims, &values, &[(1, Ok(report(1))), (2, Ok(broken))]);
    assert_eq!(
        c.disqualified,
        Some(Disqualified {
            seed: Some(2),
            why: format!("invariant failed: {name}"),
        })
    );
    assert!(!c.meets_all);
    let c = judge(
        1,
        &dims,
        &values,
        &[(1, Err("simulation failed: boom".into())), (2, Ok(report(2)))],
    );
    assert_eq!(c.disqualified.map(|d| d.seed), Some(Some(1)));
}
