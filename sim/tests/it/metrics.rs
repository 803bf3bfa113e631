//! `run --metrics`: a simulated outage as OpenMetrics text under the names
//! and labels production's Prometheus exporter serves, so the two can share
//! a dashboard.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use redstring::decide::budget::BudgetCommand;
use redstring::metrics::MetricsObserver;
use redstring::{CircuitState, DecidedBy, Event, Observer, TenantId, Timestamp};
use redstring_sim::evidence::metrics::{MetricLog, metric_name};

use crate::support::{bin, temp_file};

/// One worker calling one server that crashes at 5 s and restarts at 20 s.
const OUTAGE: &str = r#"
name = "metered"
duration_s = 40
[hardening]
failure_threshold = 3
recovery_timeout_s = 5
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 60 }]
[[faults]]
kind = "crash"
at_s = 5
server = "gpu"
[[faults]]
kind = "restart"
at_s = 20
server = "gpu"
"#;

/// One sample line: the series (name and labels as written), its value
/// and its timestamp.
fn samples(text: &str) -> Vec<(&str, f64, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let mut parts = l.rsplitn(3, ' ');
            let stamp = parts.next().unwrap().parse().unwrap();
            let value = parts.next().unwrap().parse().unwrap();
            (parts.next().unwrap(), value, stamp)
        })
        .collect()
}

/// Every `# TYPE` family with its type.
fn families(text: &str) -> BTreeMap<&str, &str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split_once(' ').unwrap())
        .collect()
}

#[test]
fn a_simulated_outage_is_written_as_timestamped_openmetrics() {
    let path = temp_file("metered.toml", OUTAGE);
    let (out_path, json) = (path.with_file_name("metered.om"), path.with_file_name("metered.json"));
    let out = bin()
        .arg("run")
        .arg(&path)
        .arg("--metrics")
        .arg(&out_path)
        .args(["--metrics-at", "1800000000"])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&out_path).unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    let types = families(&text);
    assert_eq!(types.get("redstring_calls"), Some(&"unknown"), "{types:?}");
    assert_eq!(types.get("redstring_breaker_state"), Some(&"gauge"));
    assert_eq!(types.get("gen_ai_client_operation_duration"), Some(&"summary"));

    let samples = samples(&text);
    // Stamped from --metrics-at, a second apart, within the run (40 s and its 5 s grace), and
    // increasing within each series.
    let mut last: BTreeMap<&str, f64> = BTreeMap::new();
    for &(series, _, stamp) in &samples {
        assert!(
            (1_800_000_000.0..=1_800_000_045.0).contains(&stamp),
            "{series} at {stamp}"
        );
        if let Some(before) = last.insert(series, stamp) {
            assert_eq!(stamp - before, 1.0, "{series}");
        }
    }
    // The breaker opened during the crash (2) and closed again (0).
    let state: Vec<f64> = samples
        .iter()
        .filter(|(s, _, _)| s.starts_with("redstring_breaker_state{"))
        .map(|&(_, v, _)| v)
        .collect();
    let opened = state.iter().position(|&v| v == 2.0).expect("the breaker opened");
    assert_eq!(state.last(), Some(&0.0), "{state:?}");
    assert!(opened < state.len() - 1);
    // Calls by outcome at the end are the report's, under the production
    // labels and the scrape's.
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let outcomes = report["outcomes"].as_object().unwrap();
    assert!(outcomes.len() >= 3, "{outcomes:?}");
    for (outcome, calls) in outcomes {
        let series = format!(
            r#"redstring_calls{{gen_ai_provider_name="openai-compatible",gen_ai_request_model="qwen3-8b",outcome="{outcome}",job="redstring-sim",instance="w"}}"#
        );
        let end = samples.iter().rfind(|(s, _, _)| *s == series).map(|&(_, v, _)| v);
        assert_eq!(end, calls.as_f64(), "{series}");
    }
    // The calls in flight at the end are the report's: none is counted
    // ended by the teardown that drops them after the run.
    let in_flight = samples
        .iter()
        .rfind(|(s, _, _)| s.starts_with("redstring_calls_in_flight{"))
        .map(|&(_, v, _)| v);
    assert_eq!(in_flight, report["in_flight"].as_f64());
    assert!(!text.contains("outcome=\"cancelled\""), "{text}");
}

#[test]
fn metrics_at_without_metrics_is_refused() {
    let path = temp_file("unmetered.toml", OUTAGE);
    let out = bin()
        .arg("run")
        .arg(&path)
        .args(["--metrics-at", "1800000000"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--metrics"));
}

/// One event of every kind the metrics observer records.
fn every_recorded_event() -> Vec<Event> {
    let model: Arc<str> = Arc::from("openai-compatible/qwen3");
    let tenant = TenantId::from_u128(1);
    let at = Timestamp::from_secs(1);
    let name = |n: &str| -> Arc<str> { Arc::from(n) };
    vec![
        Event::CallStarted {
            model: model.clone(),
            tenant,
        },
        Event::CallFinished {
            model: model.clone(),
            tenant,
            outcome: "retry_exhausted",
            attempts: 2,
            duration: Duration::from_secs(3),
            input_tokens: Some(10),
            output_tokens: Some(5),
        },
        Event::RetryScheduled {
            operation: name("extract"),
            attempt: 1,
            delay: Duration::from_secs(1),
            floor: Duration::ZERO,
            error: "503".into(),
        },
        Event::RateLimitRefused {
            limiter: name("kg:ratelimit"),
            tenant,
            priority: redstring::Priority::High,
            retry_after: Duration::from_secs(1),
            at,
            decided_by: DecidedBy::Store,
        },
        Event::TokensRefused {
            limiter: name("kg:ratelimit"),
            tenant,
            priority: redstring::Priority::High,
            estimate: 10,
            used: 10,
            retry_after: Duration::from_secs(1),
            at,
            decided_by: DecidedBy::Store,
        },
        Event::BreakerRejected {
            breaker: name("kg:circuit"),
            state: CircuitState::Open,
            retry_after: Duration::from_secs(1),
        },
        Event::BreakerCooldownRefused {
            breaker: name("kg:circuit"),
            state: CircuitState::Closed,
            retry_after: Duration::from_secs(1),
            at,
        },
        Event::RetryBudgetStep {
            budget: name("kg:retrybudget"),
            command: BudgetCommand::Withdraw,
            granted: false,
            balance: 0,
            at,
            decided_by: DecidedBy::Store,
        },
        Event::RateLimitWait {
            model: model.clone(),
            tenant,
            wait: Duration::from_secs(1),
            waits: 1,
        },
        Event::CooldownWait {
            model,
            tenant,
            wait: Duration::from_secs(1),
            waits: 1,
        },
        Event::BreakerTransition {
            breaker: name("kg:circuit"),
            from: CircuitState::Closed,
            to: CircuitState::Open,
            at,
        },
        Event::CacheUnavailable {
            component: name("kg:circuit"),
            operation: "breaker_step",
            fallback: "allowed",
            error: "down".into(),
        },
        Event::SlowCall {
            breaker: name("kg:circuit"),
            tenant,
            duration: Duration::from_secs(3),
            threshold: Duration::from_secs(2),
            at,
        },
        Event::Hedged {
            tenant,
            from: name("kg:circuit"),
            to: name("kg:circuit:spare"),
            after: Duration::from_millis(800),
        },
        Event::SlowStartDraw {
            breaker: name("kg:circuit"),
            tenant,
            closed_at: at,
            at,
            share: 250_000,
            draw: 400_000,
        },
        Event::ConcurrencyRefused {
            breaker: name("kg:circuit"),
            tenant,
            priority: redstring::Priority::Low,
            in_flight: 4,
            limit: 4,
        },
        Event::ConcurrencyEnded {
            breaker: name("kg:circuit"),
            tenant,
            id: 1,
            end: redstring::decide::concurrency::CallEnd::Overload,
            counted: true,
            from: 4_000_000,
            to: 3_600_000,
        },
        Event::QuotaExhausted {
            breaker: name("kg:circuit"),
            tenant,
            wait: Duration::from_secs(3600),
            until: at.saturating_add(Duration::from_secs(3600)),
            at,
            reset_given: false,
        },
    ]
}

/// Each family's label names, without those only one side adds (the
/// exporter's summary `quantile`, the simulator's `job` and `instance`).
fn label_names(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let kinds = families(text);
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (series, labels) = line.split_once('{').unwrap();
        let family = ["_count", "_sum"]
            .iter()
            .find_map(|s| series.strip_suffix(s).filter(|f| kinds.get(f) == Some(&"summary")))
            .unwrap_or(series);
        let labels = labels.rsplit_once('}').unwrap().0;
        let names = labels
            .split(',')
            .map(|kv| kv.split_once('=').unwrap().0.to_owned())
            .filter(|k| !["quantile", "job", "instance"].contains(&k.as_str()));
        out.entry(family.to_owned()).or_default().extend(names);
    }
    out
}

#[test]
fn the_export_names_every_series_and_label_as_the_prometheus_exporter_does() {
    let events = every_recorded_event();
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        for event in &events {
            MetricsObserver::new().on_event(event);
        }
    });
    let live = handle.render();
    let log = MetricLog::new();
    for event in &events {
        log.observe("w", event);
    }
    let simulated = log.to_openmetrics(Duration::from_secs(1), 1_700_000_000);

    let (live_types, simulated_types) = (families(&live), families(&simulated));
    let live_names: BTreeSet<_> = live_types.keys().collect();
    let simulated_names: BTreeSet<_> = simulated_types.keys().collect();
    assert_eq!(live_names, simulated_names, "{live}\n{simulated}");
    // Every series the metrics module documents, so none went missing on
    // both sides at once.
    assert_eq!(live_names.len(), 17, "{live_names:?}");
    for (family, kind) in &live_types {
        let expected = if *kind == "counter" { "unknown" } else { kind };
        assert_eq!(simulated_types[family], expected, "{family}");
    }
    assert_eq!(label_names(&live), label_names(&simulated), "{live}\n{simulated}");
}

/// The series a table lists: the name in backticks opening each row
/// that starts `prefix` (which ends in the opening backtick), as the
/// exporter writes it.
fn listed(table: &str, prefix: &str) -> BTreeSet<String> {
    table
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|row| row.split('`').next())
        .map(metric_name)
        .collect()
}

#[test]
fn the_docs_list_every_series_the_exporter_serves() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        for event in &every_recorded_event() {
            MetricsObserver::new().on_event(event);
        }
    });
    let live = handle.render();
    let served: BTreeSet<String> = families(&live).keys().map(|f| (*f).to_owned()).collect();
    let guide = include_str!("../../../docs/metrics.md");
    let metrics_section = &guide[guide.find("## Metrics").unwrap()..guide.find("## Traces").unwrap()];
    assert_eq!(listed(metrics_section, "| `"), served, "docs/metrics.md");
    let module = include_str!("../../../core/src/metrics.rs");
    assert_eq!(listed(module, "//! | `"), served, "core/src/metrics.rs");
}
