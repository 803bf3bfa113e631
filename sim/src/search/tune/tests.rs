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
            dominated: 0,
            kept: 2,
            simulations: 8,
        }],
        simulations: 8,
        candidates: vec![a, b],
        front: vec![1, 2],
        recommended: Some(1),
        hardening_toml: None,
        explanation: None,
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

/// One generic server down from 5 s to 8 s, with objectives on recovery and
/// on requests reaching it: a tune small enough for a unit test.
const OUTAGE: &str = "name = \"t\"\nduration_s = 30\n[hardening]\nfailure_threshold = 3\nrecovery_timeout_s = 5\n[[servers]]\nname = \"gpu\"\n[[workers]]\nname = \"w\"\nservers = [\"gpu\"]\ntenants = [{ id = 1, calls_per_min = 30 }]\n[[faults]]\nkind = \"crash\"\nat_s = 5\nserver = \"gpu\"\n[[faults]]\nkind = \"restart\"\nat_s = 8\nserver = \"gpu\"\n[objectives]\ngoodput_recovery_s = 20\nimpaired_requests_max = 30\n";

/// Counts the simulations a tune runs.
struct Count(std::sync::atomic::AtomicU64);

impl Progress for Count {
    fn rung(&self, _: u64) {}
    fn one(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[test]
fn a_candidate_moving_up_a_rung_runs_only_the_seeds_it_lacks() {
    let scenario = Scenario::parse("t.toml", OUTAGE).unwrap();
    let base = Base {
        file: "t.toml",
        text: OUTAGE,
        scenario: &scenario,
    };
    let dims = [
        Dim::parse("hardening.failure_threshold=1..6").unwrap(),
        Dim::parse("hardening.recovery_timeout_s=2..10").unwrap(),
    ];
    let settings = Settings {
        seeds: 8,
        first_seed: 1,
        budget: 10,
        jobs: 2,
    };
    let plan = plan(&base, &dims, settings).unwrap();
    let mut known = BTreeMap::new();
    let count = Count(std::sync::atomic::AtomicU64::new(0));
    let mut rungs = 0;
    let tuning = loop {
        match step(&base, &dims, settings, &plan, &known) {
            Step::Done(t) => break *t,
            Step::Pending { work, .. } => {
                // A rung asks only for pairs not run before, each once.
                assert!(work.iter().all(|k| !known.contains_key(k)), "{work:?}");
                let mut unique = work.clone();
                unique.sort_unstable();
                unique.dedup();
                assert_eq!(unique.len(), work.len());
                let ran = run_work(&base, settings, &plan, &work, None, &mut known, &count);
                assert_eq!(ran, work.len());
                rungs += 1;
            }
        }
    };
    assert_eq!(tuning.rungs.len(), rungs);
    assert_eq!(tuning.rungs.iter().map(|r| r.seeds).collect::<Vec<_>>(), [2, 4, 8]);
    // Rung by rung: the candidates it ran, times the seeds added since the
    // rung before, and no more.
    let mut before = 0;
    for r in &tuning.rungs {
        assert_eq!(r.simulations, r.candidates as u64 * (r.seeds - before), "{r:?}");
        before = r.seeds;
    }
    let simulations = count.0.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(simulations, known.len() as u64);
    assert_eq!(tuning.simulations, simulations);
    assert!(
        tuning
            .render(&dims)
            .contains(&format!("{simulations} simulations in all"))
    );
    // The whole tune runs the same simulations.
    let whole = Count(std::sync::atomic::AtomicU64::new(0));
    assert_eq!(tune(&base, &dims, settings, &whole).unwrap(), tuning);
    assert_eq!(whole.0.load(std::sync::atomic::Ordering::Relaxed), simulations);
}

#[test]
fn halving_keeps_the_better_half_but_never_fewer_than_the_floor() {
    let m = |v| Worst::Measured { value: v };
    // Ranked by margin: #1 worst … #10 best; each trades one objective
    // against the other, so none outclasses another.
    let all: Vec<Candidate> = (1..=10)
        .map(|id| {
            let x = id as f64;
            candidate(
                id,
                vec![
                    figure("r", 10.0, m(10.0 - x * 0.5), 4),
                    figure("i", 10.0, m(x * 0.1), 4),
                ],
            )
        })
        .collect();
    assert!(all.iter().all(|a| all.iter().all(|b| !a.outclasses(b))));
    let kept = |alive: Vec<usize>, last| select(&all, alive, last).0;
    assert_eq!(kept((0..10).collect(), false), [9, 8, 7, 6, 5]);
    assert_eq!(kept(vec![0, 1, 2, 3, 4], false), [4, 3, 2, 1]);
    assert_eq!(kept(vec![0, 1], false), [1, 0]);
    // The last rung keeps every one.
    assert_eq!(kept((0..10).collect(), true).len(), 10);
}

#[test]
fn a_candidate_outclassed_on_the_seeds_so_far_stops_even_in_the_better_half() {
    let m = |v| Worst::Measured { value: v };
    let two = |id, r: f64, i: f64, passed_i| {
        candidate(id, vec![figure("r", 10.0, m(r), 4), figure("i", 10.0, m(i), passed_i)])
    };
    let all = vec![
        two(1, 5.0, 5.0, 4),  // meets both, margin 0.5
        two(2, 6.0, 6.0, 4),  // meets both, worse than #1 on both: outclassed
        two(3, 4.0, 7.0, 4),  // trades r against i with #1
        two(4, 7.0, 11.0, 3), // misses i: worse than #1 on both
        two(5, 5.0, 8.0, 4),  // ties #1 on r, worse than #3 on both
        two(6, 5.0, 5.0, 4),  // #1's figures exactly: a tie outclasses neither
    ];
    let by_id = |id: usize| &all[id - 1];
    assert!(by_id(1).outclasses(by_id(2)) && by_id(1).outclasses(by_id(4)));
    assert!(by_id(3).outclasses(by_id(5)) && !by_id(1).outclasses(by_id(5)));
    assert!(!by_id(1).outclasses(by_id(3)) && !by_id(3).outclasses(by_id(1)));
    assert!(!by_id(1).outclasses(by_id(6)) && !by_id(6).outclasses(by_id(1)));
    assert!(!by_id(1).outclasses(by_id(1)));
    // Missing an objective, #4 outclasses nothing, even what it beats.
    let worse = two(7, 8.0, 12.0, 3);
    assert!(!by_id(4).outclasses(&worse));
    // Only on the same seeds.
    let mut fewer = by_id(2).clone();
    fewer.seeds = 2;
    assert!(!by_id(1).outclasses(&fewer));
    // An objective not applicable on any seed for both is left out; one
    // measured for either is compared.
    let na = |id, r: f64, i| candidate(id, vec![figure("r", 10.0, m(r), 4), figure("i", 10.0, i, 4)]);
    assert!(na(8, 2.0, Worst::NotApplicable).outclasses(&na(9, 3.0, Worst::NotApplicable)));
    assert!(!na(8, 2.0, m(1.0)).outclasses(&na(9, 3.0, Worst::NotApplicable)));
    // Ranked #1, #6, #2, #3, #5, #4: the better half (the floor, 4) is #1,
    // #6, #2 and #3, and #2 stops there, outclassed by #1; #5 is not
    // brought back in its place.
    let (kept, dominated) = select(&all, (0..6).collect(), false);
    let ids: Vec<usize> = kept.iter().map(|&i| all[i].id).collect();
    assert_eq!((ids, dominated), (vec![1, 6, 3], 1));
    // The last rung keeps every candidate: nothing more to save.
    assert_eq!(select(&all, (0..6).collect(), true), (vec![0, 5, 1, 2, 4, 3], 0));
    // Whatever dominated, the best-ranked candidate is kept.
    for n in 1..=6 {
        let (kept, _) = select(&all, (0..n).collect(), false);
        assert_eq!(kept.first(), Some(&0));
    }
}

/// `c` with `values` set at keys `a` and `b`.
fn with_values(mut c: Candidate, a: &str, b: &str) -> Candidate {
    c.values = [("a".to_owned(), a.to_owned()), ("b".to_owned(), b.to_owned())].into();
    c
}

#[test]
fn the_binding_objective_is_the_one_with_the_least_slack() {
    let m = |v| Worst::Measured { value: v };
    // Slacks 0.1, 0.5 and none (not applicable, left out).
    let c = candidate(
        1,
        vec![
            figure("goodput_recovery_s", 10.0, m(9.0), 4),
            figure("impaired_requests_max", 10.0, m(5.0), 4),
            figure("p99_latency_s", 1.0, Worst::NotApplicable, 4),
        ],
    );
    let b = binding(&c).unwrap();
    assert_eq!(
        (b.objective.as_str(), b.worst, b.target),
        ("goodput_recovery_s", m(9.0), 10.0)
    );
    assert!((b.slack.unwrap() - 0.1).abs() < 1e-12);
    // Never measured binds whatever the others' slack.
    let c = candidate(
        1,
        vec![
            figure("impaired_requests_max", 10.0, m(50.0), 0),
            figure("goodput_recovery_s", 10.0, Worst::Never, 3),
        ],
    );
    assert_eq!(binding(&c).unwrap().objective, "goodput_recovery_s");
    // Nothing measured: nothing binds.
    let c = candidate(1, vec![figure("p99_latency_s", 1.0, Worst::NotApplicable, 4)]);
    assert_eq!(binding(&c), None);
}

#[test]
fn the_runner_up_is_the_next_by_rank_with_its_differences() {
    let m = |v| Worst::Measured { value: v };
    let dims = [Dim::parse("a=1..6").unwrap(), Dim::parse("b=5..30").unwrap()];
    // Meets both: margin min(0.2, 0.3) = 0.2.
    let best = with_values(
        candidate(1, vec![figure("r", 10.0, m(8.0), 4), figure("i", 10.0, m(7.0), 4)]),
        "3",
        "12",
    );
    // Misses r on one seed, better on i: 7 of 8 pairs.
    let second = with_values(
        candidate(2, vec![figure("r", 10.0, m(11.0), 3), figure("i", 10.0, m(3.0), 4)]),
        "1",
        "12",
    );
    // Misses r on every seed: 4 of 8.
    let third = with_values(
        candidate(3, vec![figure("r", 10.0, m(12.0), 0), figure("i", 10.0, m(2.0), 4)]),
        "1",
        "10",
    );
    // Better than all, but stopped on 2 seeds: after those on 4.
    let mut early = with_values(
        candidate(4, vec![figure("r", 10.0, m(1.0), 4), figure("i", 10.0, m(1.0), 4)]),
        "2",
        "20",
    );
    early.seeds = 2;
    let all = [best.clone(), second, third, early];
    let r = runner_up(&all, &best, &dims).unwrap();
    assert_eq!(r.id, 2);
    assert_eq!(r.seeds, 4);
    assert_eq!(
        r.differs,
        [SettingDiff {
            key: "a".into(),
            recommended: "3".into(),
            runner_up: "1".into()
        }]
    );
    assert_eq!(r.decided_by, Some(RankKey::MeetsAll));
    assert_eq!((r.pairs_met, r.recommended_pairs_met), ([7, 8], [8, 8]));
    let gap = |o: &str, ru, rec| Gap {
        objective: o.into(),
        runner_up: m(ru),
        recommended: m(rec),
    };
    assert_eq!(r.behind, [gap("r", 11.0, 8.0)]);
    assert_eq!(r.ahead, [gap("i", 3.0, 7.0)]);
    let text = Explanation {
        binding: binding(&best),
        runner_up: Some(r),
        effects: Effects {
            seeds: [1, 3],
            settings: Vec::new(),
        },
    }
    .render(&best);
    assert!(
        text.contains("binding objective: r, worst 8 against ≤ 10, slack +0.200 — the smallest, so it sets the margin"),
        "{text}"
    );
    assert!(
        text.contains("runner-up: #2 a=1 (not 3) ranks below: it misses an objective on some seed (7 of 8 (objective, seed) pairs met); worse on r 11 against 8; better on i 3 against 7"),
        "{text}"
    );
    // Both meeting everything: the margin decides, and is shown.
    let close = with_values(
        candidate(5, vec![figure("r", 10.0, m(9.0), 4), figure("i", 10.0, m(1.0), 4)]),
        "4",
        "30",
    );
    let r = runner_up(&[best.clone(), close], &best, &dims).unwrap();
    assert_eq!((r.id, r.decided_by, r.differs.len()), (5, Some(RankKey::Margin), 2));
    let text = Explanation {
        binding: None,
        runner_up: Some(r),
        effects: Effects {
            seeds: [1, 3],
            settings: Vec::new(),
        },
    }
    .render(&best);
    assert!(
        text.contains("#5 a=4 (not 3), b=30 (not 12) ranks below: its margin is smaller, +0.100 against +0.200"),
        "{text}"
    );
    // Alone: no runner-up.
    assert_eq!(runner_up(std::slice::from_ref(&best), &best, &dims), None);
}

#[test]
fn least_squares_gives_the_slope_and_its_standard_error() {
    // y = 2, 4, 5, 7 at x = 1..4: slope 8 / 5 = 1.6; residuals −0.1, 0.3,
    // −0.3, 0.1, so σ² = 0.2 / 2 and the slope's error √(0.1 / 5).
    let x: Vec<Vec<f64>> = (1..=4).map(|v| vec![f64::from(v)]).collect();
    let fit = least_squares(&x, &[2.0, 4.0, 5.0, 7.0]).unwrap();
    assert!((fit[0].0 - 1.6).abs() < 1e-12, "{fit:?}");
    assert!((fit[0].1 - 0.02f64.sqrt()).abs() < 1e-12, "{fit:?}");
    // Two settings fitted together: y = 1 + 2a − 3b exactly.
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for a in 0..3 {
        for b in 0..2 {
            let (a, b) = (f64::from(a), f64::from(b));
            x.push(vec![a, b]);
            y.push(1.0 + 2.0 * a - 3.0 * b);
        }
    }
    let fit = least_squares(&x, &y).unwrap();
    assert!(
        (fit[0].0 - 2.0).abs() < 1e-9 && (fit[1].0 + 3.0).abs() < 1e-9,
        "{fit:?}"
    );
    assert!(fit[0].1 < 1e-6 && fit[1].1 < 1e-6, "{fit:?}");
    // Not more runs than unknowns, a setting that never moves, or two that
    // move together: not enough to tell.
    assert_eq!(least_squares(&[vec![1.0], vec![2.0]], &[1.0, 2.0]), None);
    assert_eq!(
        least_squares(&[vec![1.0], vec![1.0], vec![1.0]], &[1.0, 2.0, 3.0]),
        None
    );
    let together: Vec<Vec<f64>> = (0..5).map(|v| vec![f64::from(v), 2.0 * f64::from(v)]).collect();
    assert_eq!(least_squares(&together, &[0.0, 1.0, 2.0, 3.0, 4.0]), None);
    assert_eq!(least_squares(&[], &[]), None);
}

/// The result of candidate `id` on `seed`: each objective's figure.
fn result(id: usize, seed: u64, figures: &[(&str, Worst)]) -> SeedResult {
    SeedResult {
        candidate: id,
        seed,
        record: SeedRecord {
            seed,
            ..SeedRecord::default()
        },
        objectives: figures
            .iter()
            .map(|(name, figure)| SeedObjective {
                name: (*name).to_owned(),
                target: 100.0,
                passed: true,
                figure: *figure,
            })
            .collect(),
    }
}

#[test]
fn each_settings_effect_is_estimated_from_the_runs_on_the_common_seeds() {
    let m = |v| Worst::Measured { value: v };
    let dims = [Dim::parse("a=1..3").unwrap(), Dim::parse("b=x,y").unwrap()];
    let objectives = || {
        vec![
            figure("goodput_recovery_s", 100.0, m(1.0), 4),
            figure("impaired_requests_max", 100.0, m(1.0), 4),
        ]
    };
    let mut candidates = Vec::new();
    let mut known = BTreeMap::new();
    // The grid a × b: recovery = 10 + 2a (+1 for b = y), ±0.5 by seed;
    // impaired = 40 − 5a, never measured for a = 3, b = y on seed 2.
    for (i, (a, b)) in [(1, "x"), (1, "y"), (2, "x"), (2, "y"), (3, "x"), (3, "y")]
        .into_iter()
        .enumerate()
    {
        let id = i + 1;
        candidates.push(with_values(candidate(id, objectives()), &a.to_string(), b));
        for (seed, noise) in [(1, 0.5), (2, -0.5)] {
            let recovery = 10.0 + 2.0 * f64::from(a) + if b == "y" { 1.0 } else { 0.0 } + noise;
            let impaired = if id == 6 && seed == 2 {
                Worst::Never
            } else {
                m(40.0 - 5.0 * f64::from(a))
            };
            known.insert(
                (id, seed),
                result(
                    id,
                    seed,
                    &[("goodput_recovery_s", m(recovery)), ("impaired_requests_max", impaired)],
                ),
            );
        }
    }
    // A later seed and a disqualified candidate are left out.
    known.insert((6, 3), result(6, 3, &[("goodput_recovery_s", m(1000.0))]));
    let mut broken = with_values(candidate(7, objectives()), "3", "x");
    broken.disqualified = Some(Disqualified {
        seed: Some(1),
        why: "x".into(),
    });
    candidates.push(broken);
    for seed in 1..3 {
        known.insert((7, seed), result(7, seed, &[("goodput_recovery_s", m(1000.0))]));
    }
    let e = effects(&dims, &candidates, &known, [1, 3]);
    assert_eq!(e.seeds, [1, 3]);
    let a = &e.settings[0];
    assert_eq!((a.key.as_str(), a.step), ("a", Some(1.0)));
    // Recovery: slope 2 (b balanced over a); residuals ±0.5 on 6 runs with
    // 2 unknowns: σ² = 1.5 / 4, Σ(a − ā)² = 4.
    let r = &a.objectives[0];
    assert_eq!((r.name.as_str(), r.candidates), ("goodput_recovery_s", 6));
    assert!((r.per_step.unwrap() - 2.0).abs() < 1e-9, "{r:?}");
    assert!((r.stderr.unwrap() - (1.5f64 / 4.0 / 4.0).sqrt()).abs() < 1e-9, "{r:?}");
    let i = &a.objectives[1];
    assert_eq!((i.name.as_str(), i.candidates), ("impaired_requests_max", 5));
    assert!((i.per_step.unwrap() + 5.0).abs() < 1e-9, "{i:?}");
    // b is not a number: not estimated.
    let b = &e.settings[1];
    assert_eq!((b.step, b.objectives[0].per_step), (None, None));
    let text = Explanation {
        binding: None,
        runner_up: None,
        effects: e,
    }
    .render(&candidates[0]);
    assert!(
        text.contains("an estimate from the runs already made (no further simulation)"),
        "{text}"
    );
    assert!(
        text.contains("  a: +1 → goodput_recovery_s +2.00 ±0.306 s, impaired_requests_max −5.00 ±0.000 requests (on 6 candidates for goodput_recovery_s, 5 for impaired_requests_max)"),
        "{text}"
    );
    assert!(text.contains("  b: not numbers, not estimated"), "{text}");
    // Two candidates cannot give a slope and its error.
    let e = effects(&dims, &candidates[..2], &known, [1, 3]);
    let text = Explanation {
        binding: None,
        runner_up: None,
        effects: e,
    }
    .render(&candidates[0]);
    assert!(
        text.contains("a: +1 → goodput_recovery_s not enough runs, impaired_requests_max not enough runs"),
        "{text}"
    );
}

/// A last-rung tuning of `candidates` on 4 seeds, every one on the front
/// but those in `off`, #1 recommended.
fn front_of(candidates: Vec<Candidate>, off: &[usize]) -> Tuning {
    let ids: Vec<usize> = candidates.iter().map(|c| c.id).filter(|id| !off.contains(id)).collect();
    Tuning {
        scenario: "s.toml".into(),
        keys: vec!["a".into(), "b".into()],
        design: DesignKind::Grid,
        grid_size: Some(4),
        seeds: [1, 5],
        rungs: vec![Rung {
            seeds: 4,
            candidates: candidates.len(),
            disqualified: 0,
            dominated: 0,
            kept: candidates.len(),
            simulations: 4 * candidates.len() as u64,
        }],
        simulations: 4 * candidates.len() as u64,
        candidates,
        front: ids,
        recommended: Some(1),
        hardening_toml: None,
        explanation: None,
    }
}

/// How many lines of `svg` are exactly `text` (plotters writes each text
/// element's content on a line of its own).
fn lines_equal(svg: &str, text: &str) -> usize {
    svg.lines().filter(|l| *l == text).count()
}

#[test]
fn the_front_with_two_objectives_is_one_scatter_with_every_point_labelled() {
    let m = |v| Worst::Measured { value: v };
    let c = |id, a: &str, b: &str, r, i| {
        with_values(
            candidate(
                id,
                vec![
                    figure("goodput_recovery_s", 15.0, m(r), 4),
                    figure("impaired_requests_max", 60.0, m(i), 4),
                ],
            ),
            a,
            b,
        )
    };
    let tuning = front_of(
        vec![
            c(1, "3", "12", 15.0, 43.0),
            c(2, "1", "10", 18.0, 32.0),
            c(3, "4", "15", 21.0, 49.0),
        ],
        &[3],
    );
    let svg = pareto(&tuning);
    assert!(svg.starts_with("<svg"), "{svg}");
    for label in ["#1: 3, 12", "#2: 1, 10", "#3: 4, 15"] {
        assert_eq!(lines_equal(&svg, label), 1, "{label}");
    }
    assert!(svg.contains("labels #id: a, b"));
    assert_eq!(lines_equal(&svg, "goodput_recovery_s: worst seed, seconds"), 1);
    assert_eq!(lines_equal(&svg, "impaired_requests_max: worst seed, requests"), 1);
}

#[test]
fn the_front_with_three_objectives_is_a_panel_per_pair_each_point_labelled_in_each() {
    let m = |v| Worst::Measured { value: v };
    let c = |id, a: &str, b: &str, r, i, f| {
        with_values(
            candidate(
                id,
                vec![
                    figure("goodput_recovery_s", 15.0, m(r), 4),
                    figure("impaired_requests_max", 60.0, m(i), 4),
                    figure("failed_fraction_max", 0.3, m(f), 4),
                ],
            ),
            a,
            b,
        )
    };
    let tuning = front_of(
        vec![
            c(1, "3", "12", 15.0, 43.0, 0.281),
            c(2, "1", "10", 18.0, 32.0, 0.298),
            c(3, "4", "8", 11.0, 67.0, 0.272),
        ],
        &[],
    );
    assert_eq!(panels(3), [(0, Some(1)), (0, Some(2)), (1, Some(2))]);
    let svg = pareto(&tuning);
    // Three panels, one per pair; each objective an axis in two of them.
    for pair in [
        "goodput_recovery_s against impaired_requests_max",
        "goodput_recovery_s against failed_fraction_max",
        "impaired_requests_max against failed_fraction_max",
    ] {
        assert_eq!(lines_equal(&svg, pair), 1, "{pair}");
    }
    for axis in [
        "goodput_recovery_s: worst seed, seconds",
        "impaired_requests_max: worst seed, requests",
        "failed_fraction_max: worst seed, fraction of calls",
    ] {
        assert_eq!(lines_equal(&svg, axis), 2, "{axis}");
    }
    // Every front candidate one labelled mark per panel.
    for label in ["#1: 3, 12", "#2: 1, 10", "#3: 4, 8"] {
        assert_eq!(lines_equal(&svg, label), 3, "{label}");
    }
    // Five objectives: ten panels.
    assert_eq!(panels(5).len(), 10);
    assert_eq!(panels(1), [(0, None)]);
}
