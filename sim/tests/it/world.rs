//! The world's fault schedule: faults at one instant apply in a defined,
//! documented order (see `redstring_sim::scenario::Fault`).

use redstring_sim::campaign::simulate;
use redstring_sim::evidence::outcome::Answer;
use redstring_sim::evidence::trace::Kind;
use redstring_sim::scenario::Scenario;
use redstring_sim::world::layout;

const BASE: &str = r#"
name = "same-instant"
duration_s = 40
[[servers]]
name = "gpu"
reload_s = 5
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 120 }]
"#;

const CRASH: &str = "[[faults]]\nkind = \"crash\"\nat_s = 10\nserver = \"gpu\"\n";
const RESTART: &str = "[[faults]]\nkind = \"restart\"\nat_s = 10\nserver = \"gpu\"\n";

/// How the server answered after the faults: (loading, ok) answers.
fn answers_after(faults: &str) -> (usize, usize) {
    let s = Scenario::parse("same-instant.toml", &format!("{BASE}{faults}")).unwrap();
    let run = simulate(&s, 1).unwrap();
    let count = |answer: Answer| {
        run.events
            .iter()
            .filter(|e| e.t_us >= 10_000_000 && matches!(e.kind, Kind::Served { outcome, .. } if outcome == answer))
            .count()
    };
    (count(Answer::Loading), count(Answer::Ok))
}

#[test]
fn a_crash_and_a_restart_at_one_instant_are_a_crash_followed_by_a_restart() {
    for (order, faults) in [
        ("crash first", format!("{CRASH}{RESTART}")),
        ("restart first", format!("{RESTART}{CRASH}")),
    ] {
        let (loading, ok) = answers_after(&faults);
        assert!(loading > 0, "{order}: the restart reloads the model");
        assert!(ok > 0, "{order}: and the server serves again after its reload");
    }
}

#[test]
fn every_request_and_what_served_it_name_the_call() {
    let s = Scenario::parse("calls.toml", BASE).unwrap();
    let run = simulate(&s, 1).unwrap();
    let mut requests = std::collections::BTreeSet::new();
    for e in &run.events {
        if let Kind::Request { .. } = e.kind {
            let call = e.call.expect("a request is sent from within its call");
            requests.insert(format!("{}/{call}", e.host));
        }
    }
    assert!(requests.len() > 10, "{} calls sent requests", requests.len());
    let mut served = 0;
    for e in &run.events {
        if let Kind::Served { caller, outcome, .. } = &e.kind {
            let caller = caller.as_ref().unwrap_or_else(|| panic!("{outcome:?} names no call"));
            assert!(requests.contains(caller), "{caller} served but never requested");
            served += 1;
        }
    }
    assert!(served > 10);
}

#[test]
fn a_generic_server_cuts_an_answer_at_the_request_s_max_tokens() {
    let served = |max_tokens: u32| {
        let text = format!(
            "name = \"cut\"\nduration_s = 20\n[hardening]\nmax_tokens = {max_tokens}\nmax_retries = 0\n\
             [[servers]]\nname = \"gpu\"\noutput_tokens = 100\n\
             [[workers]]\nname = \"w\"\nservers = [\"gpu\"]\ntenants = [{{ id = 1, calls_per_min = 60 }}]\n"
        );
        let s = Scenario::parse("cut.toml", &text).unwrap();
        let run = simulate(&s, 1).unwrap();
        let mut outcomes = std::collections::BTreeMap::new();
        for e in &run.events {
            if let Kind::Served { outcome, .. } = e.kind {
                *outcomes.entry(outcome.name()).or_insert(0) += 1;
            }
        }
        outcomes
    };
    let cut = served(20);
    assert!(cut.get("truncated").copied().unwrap_or(0) > 5, "{cut:?}");
    assert!(!cut.contains_key("ok"), "{cut:?}");
    let whole = served(256);
    assert!(whole.get("ok").copied().unwrap_or(0) > 5, "{whole:?}");
    assert!(!whole.contains_key("truncated"), "{whole:?}");
}

#[test]
fn probe_lease_s_reaches_the_breaker() {
    let longest_half_open_wait = |lease: &str| {
        let text = format!(
            "name = \"lease\"\nduration_s = 120\n[hardening]\nfailure_threshold = 2\nrecovery_timeout_s = 3\n\
             request_timeout_s = 8\nmax_retries = 0\n{lease}\n\
             [[servers]]\nname = \"gpu\"\nslots = 8\n\
             [[workers]]\nname = \"w\"\nservers = [\"gpu\"]\ntenants = [{{ id = 1, calls_per_min = 120 }}]\n\
             [[faults]]\nkind = \"behave\"\nat_s = 5\nserver = \"gpu\"\nbehaviour = {{ mode = \"hang\" }}\n\
             [[faults]]\nkind = \"behave\"\nat_s = 40\nserver = \"gpu\"\nbehaviour = {{ mode = \"normal\" }}\n"
        );
        let s = Scenario::parse("lease.toml", &text).unwrap();
        let run = simulate(&s, 1).unwrap();
        assert!(run.failed().is_empty(), "{:?}", run.failed());
        run.events
            .iter()
            .filter_map(|e| match e.kind {
                Kind::Rejected {
                    state: redstring::CircuitState::HalfOpen,
                    retry_after_us,
                    ..
                } => Some(retry_after_us),
                _ => None,
            })
            .max()
            .expect("half-open refusals while the probe hangs")
    };
    // A hung probe holds its lease: half-open refusals wait for it to end.
    assert!(longest_half_open_wait("") <= 3_000_000);
    let long = longest_half_open_wait("probe_lease_s = 7");
    assert!(long > 3_000_000 && long <= 7_000_000, "{long}");
}

/// A fleet of three workers calling one server, with `cache` and `faults`.
fn fleet(cache: &str, faults: &str) -> Scenario {
    let text = format!(
        "name = \"one-worker-faults\"\nduration_s = 30\n[cache]\nkind = \"{cache}\"\n[[servers]]\nname = \"gpu\"\n\
         [[workers]]\nname = \"w\"\ncount = 3\nservers = [\"gpu\"]\ntenants = [{{ id = 1, calls_per_min = 120 }}]\n{faults}"
    );
    Scenario::parse("one-worker-faults.toml", &text).unwrap()
}

#[test]
fn a_clock_step_naming_one_worker_of_a_shared_host_moves_that_worker_s_clock_alone() {
    let s = fleet(
        "per_worker",
        "[[faults]]\nkind = \"clock_step\"\nat_s = 10\nhost = \"w-1\"\nby_ms = 600000\n",
    );
    let hosts = layout::worker_hosts(&s);
    assert_eq!(hosts.len(), 1, "the three workers share one host");
    let run = simulate(&s, 1).unwrap();
    // Each worker's own cache stamps its admissions with the worker's clock:
    // the stamp less the true instant is that clock's offset.
    let offsets = |host: &str, after: bool| -> Vec<i64> {
        run.events
            .iter()
            .filter(|e| &*e.host == host && (e.t_us >= 10_000_000) == after)
            .filter_map(|e| match e.kind {
                Kind::Admitted { at_us, .. } => Some(at_us as i64 - e.t_us as i64),
                _ => None,
            })
            .collect()
    };
    let before = offsets("w-0", false)[0];
    for (host, after, want) in [
        ("w-0", false, 0),
        ("w-0", true, 0),
        ("w-1", false, 0),
        ("w-1", true, 600_000_000),
        ("w-2", false, 0),
        ("w-2", true, 0),
    ] {
        let seen = offsets(host, after);
        assert!(!seen.is_empty(), "{host} admitted calls (after the step: {after})");
        assert!(
            seen.iter().all(|o| *o - before == want),
            "{host} after the step {after}: offsets {seen:?}, want {want} µs beyond {before}"
        );
    }
}

#[test]
fn a_partition_naming_one_worker_cuts_that_worker_alone_from_the_cache() {
    let s = fleet(
        "shared",
        "[[faults]]\nkind = \"partition\"\nat_s = 5\na = \"w-1\"\nb = \"cache\"\n\
         [[faults]]\nkind = \"heal\"\nat_s = 15\na = \"w-1\"\nb = \"cache\"\n",
    );
    let hosts: Vec<String> = layout::worker_hosts(&s).into_iter().map(|h| h.name).collect();
    assert_eq!(
        hosts,
        ["w-1", "workers#0"],
        "the partitioned worker runs on a host of its own"
    );
    let run = simulate(&s, 1).unwrap();
    let unavailable: std::collections::BTreeSet<(&str, bool)> = run
        .events
        .iter()
        .filter(|e| matches!(e.kind, Kind::CacheUnavailable { .. }))
        .map(|e| (e.host.as_ref(), (5_000_000..16_000_000).contains(&e.t_us)))
        .collect();
    assert_eq!(
        unavailable,
        [("w-1", true)].into_iter().collect(),
        "only w-1 loses the cache, and only while partitioned"
    );
    let admitted = |host: &str| {
        run.events
            .iter()
            .filter(|e| &*e.host == host && (6_000_000..15_000_000).contains(&e.t_us))
            .filter(|e| matches!(e.kind, Kind::Admitted { .. }))
            .count()
    };
    assert!(
        admitted("w-0") > 0 && admitted("w-2") > 0,
        "the others keep being admitted by the cache"
    );
}

#[test]
fn a_watch_that_stops_a_run_ends_it_with_what_was_simulated() {
    let s = Scenario::parse("watched.toml", BASE).unwrap();
    let mut seen = Vec::new();
    let mut watch = |t: std::time::Duration| {
        seen.push(t);
        if t >= std::time::Duration::from_secs(20) {
            std::ops::ControlFlow::Break("enough".to_owned())
        } else {
            std::ops::ControlFlow::Continue(())
        }
    };
    match redstring_sim::campaign::simulate_watched(&s, 1, &mut watch) {
        Err(
            e @ redstring_sim::world::SimError::Stopped {
                at_s, arrived, ended, ..
            },
        ) => {
            assert!((20.0..21.0).contains(&at_s), "stopped at {at_s}");
            // 2 calls a second for 20 s.
            assert!(
                (20..70).contains(&arrived) && ended <= arrived,
                "{arrived} arrived, {ended} ended"
            );
            assert!(e.to_string().contains("enough"), "{e}");
        }
        other => panic!("expected the watch to stop the run, got {other:?}"),
    }
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "the watch sees time go forward");
}

#[test]
fn the_wall_estimate_grows_with_steps_hosts_and_calls() {
    use redstring_sim::world::Work;
    let base = Scenario::parse("base.toml", BASE).unwrap();
    let work = Work::of(&base);
    // 45 s of 10 ms steps over one server and one worker host.
    assert_eq!((work.steps, work.hosts, work.host_steps), (4500, 2, 9000));
    let longer = Scenario::parse("longer.toml", &BASE.replace("duration_s = 40", "duration_s = 400")).unwrap();
    let finer = Scenario::parse("finer.toml", &format!("tick_ms = 1\n{BASE}")).unwrap();
    let busier = Scenario::parse(
        "busier.toml",
        &BASE.replace("calls_per_min = 120", "calls_per_min = 2400"),
    )
    .unwrap();
    for (what, other) in [("longer", &longer), ("finer", &finer), ("busier", &busier)] {
        assert!(
            Work::of(other).wall_estimate() > work.wall_estimate() * 5,
            "{what}: {:?} against {:?}",
            Work::of(other).wall_estimate(),
            work.wall_estimate()
        );
    }
}

/// A fleet's events hold no name of their own: all a worker records — its
/// arrivals, its limiter's and breaker's decisions, its requests — share
/// one copy of its name.
#[test]
fn a_worker_s_events_share_one_copy_of_its_name() {
    let s = Scenario::parse("names.toml", BASE).unwrap();
    let run = simulate(&s, 1).unwrap();
    let of = |is: fn(&Kind) -> bool| {
        run.events
            .iter()
            .find(|e| &*e.host == "w" && is(&e.kind))
            .unwrap_or_else(|| panic!("no such event of w"))
    };
    let arrival = of(|k| matches!(k, Kind::Arrival { .. }));
    let admitted = of(|k| matches!(k, Kind::Admitted { .. }));
    let allowed = of(|k| matches!(k, Kind::Allowed { .. }));
    let request = of(|k| matches!(k, Kind::Request { .. }));
    for other in [admitted, allowed, request] {
        assert!(std::sync::Arc::ptr_eq(&arrival.host, &other.host), "{:?}", other.kind);
    }
}

/// Three servers, each with a worker of its own calling it, and `faults`.
fn three_servers(faults: &str) -> Scenario {
    let mut text = String::from("name = \"shared-servers\"\nduration_s = 30\n");
    for server in ["a", "b", "c"] {
        text.push_str(&format!("[[servers]]\nname = \"{server}\"\n"));
    }
    for server in ["a", "b", "c"] {
        text.push_str(&format!(
            "[[workers]]\nname = \"w{server}\"\nservers = [\"{server}\"]\ntenants = [{{ id = 1, calls_per_min = 120 }}]\n"
        ));
    }
    text.push_str(faults);
    Scenario::parse("shared-servers.toml", &text).unwrap()
}

/// `server`'s answers (any outcome) within `from_s..to_s`.
fn served(run: &redstring_sim::judgement::Run, server: &str, from_s: u64, to_s: u64) -> usize {
    run.events
        .iter()
        .filter(|e| &*e.host == server && (from_s * 1_000_000..to_s * 1_000_000).contains(&e.t_us))
        .filter(|e| matches!(e.kind, Kind::Served { .. }))
        .count()
}

#[test]
fn servers_share_a_host_and_a_crash_of_one_leaves_the_others_serving() {
    let s = three_servers("[[faults]]\nkind = \"crash\"\nat_s = 10\nserver = \"b\"\n");
    let hosts = layout::server_hosts(&s);
    assert_eq!(hosts.len(), 1, "the three servers share one host: {hosts:?}");
    let run = simulate(&s, 1).unwrap();
    assert!(served(&run, "b", 0, 10) > 0, "b serves before its crash");
    assert_eq!(served(&run, "b", 11, 40), 0, "and nothing after it");
    for server in ["a", "c"] {
        assert!(served(&run, server, 10, 30) > 10, "{server} goes on serving");
    }
    let refused = run
        .events
        .iter()
        .filter(|e| e.t_us >= 10_100_000 && &*e.host == "wb")
        .any(|e| matches!(&e.kind, Kind::CallEnd(end) if !end.outcome.is_ok()));
    assert!(refused, "b's worker's calls fail once b is down");
}

#[test]
fn a_partition_naming_a_server_cuts_that_server_alone() {
    let s = three_servers(
        "[[faults]]\nkind = \"partition\"\nat_s = 10\na = \"b\"\nb = \"wb\"\n\
         [[faults]]\nkind = \"partition\"\nat_s = 10\na = \"wc\"\nb = \"a\"\n\
         [[faults]]\nkind = \"heal\"\nat_s = 20\na = \"wc\"\nb = \"a\"\n",
    );
    let hosts: Vec<String> = layout::server_hosts(&s).into_iter().map(|h| h.name).collect();
    assert_eq!(
        hosts,
        ["a", "b", layout::SERVERS_HOST],
        "a server a network fault names runs on a host of its own"
    );
    let run = simulate(&s, 1).unwrap();
    assert!(served(&run, "b", 0, 10) > 0, "b serves its worker before the partition");
    // What it was serving at the cut it finishes (its answers lost).
    assert_eq!(served(&run, "b", 15, 30), 0, "and nothing once cut from it");
    // Nobody calls `a` from `wc`'s side: the partition changes nothing for it.
    assert!(served(&run, "a", 11, 30) > 10, "a goes on serving its own worker");
    assert!(served(&run, "c", 11, 30) > 10, "c, on the shared host, too");
}
