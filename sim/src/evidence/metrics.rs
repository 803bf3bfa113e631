//! A run's metrics, under the names the hardening exports in production.
//!
//! An operator who watches a real outage on a dashboard should be able to
//! put a simulated one beside it. A [`MetricLog`] hands every event the
//! workers' limiters, breakers and hardened providers report to the core's
//! own `redstring::metrics::MetricsObserver` — so the series, their names
//! and their labels are the production ones by construction, not a second
//! spelling — through a recorder that keeps each change with the simulated
//! instant it happened at and the worker it happened on.
//! [`MetricLog::to_openmetrics`] writes them as OpenMetrics text
//! (<https://prometheus.io/docs/specs/om/open_metrics_spec/>), one sample
//! per series per simulated second, timestamped, which
//! `promtool tsdb create-blocks-from openmetrics` backfills into a
//! Prometheus (<https://prometheus.io/docs/prometheus/latest/storage/#backfilling-from-openmetrics-format>).
//!
//! Names and labels are sanitised as `metrics-exporter-prometheus` does
//! (`gen_ai.client.operation.duration` → `gen_ai_client_operation_duration`),
//! so a query over the live `/metrics` reads the backfilled series too.
//! That exporter writes the Prometheus text format, where a counter keeps
//! its name (`redstring_calls`); OpenMetrics would rename a `counter`'s
//! samples `redstring_calls_total`, so counters are typed `unknown` here,
//! which keeps the name. Histograms are written as that exporter writes
//! them by default, summaries, with their `_count` and `_sum` (no
//! quantiles: they are windowed in the exporter). Each series also carries
//! the labels a scrape adds, `job="redstring-sim"` and `instance` (the
//! worker), so simulated series never mix with live ones.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, SharedString, Unit};
use redstring::metrics::MetricsObserver;
use redstring::{Event, Observer};

use crate::hosts::clock::sim_elapsed;

/// The `job` label every simulated series carries.
pub const JOB: &str = "redstring-sim";

/// Most samples one series gets: a longer run samples less often than once
/// a simulated second.
pub const MAX_SAMPLES: u64 = 10_000;

/// How a series' value moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Type {
    Counter,
    Gauge,
    Summary,
}

/// One series: its name and labels as the facade gave them, and its worker.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct SeriesKey {
    name: String,
    labels: Vec<(String, String)>,
    instance: String,
}

/// One change to a series.
#[derive(Clone, Copy, Debug)]
enum Change {
    Add(f64),
    Set(f64),
    Observe(f64),
}

/// A series' changes in simulated order, each at its microsecond.
type Changes = Vec<(u64, Change)>;

#[derive(Debug, Default)]
struct Log {
    /// Each series' type and its changes.
    series: BTreeMap<SeriesKey, (Type, Changes)>,
    /// Set when the run has ended: what its teardown reports (calls still
    /// in flight, dropped with their hosts) happened after it.
    sealed: bool,
}

/// The series sharing one sanitised name, written under one `# TYPE`.
struct Family<'a> {
    kind: Type,
    series: Vec<(&'a SeriesKey, &'a Changes)>,
}

/// The metrics of one run, shared by every worker's observer.
#[derive(Clone, Debug, Default)]
pub struct MetricLog {
    log: Arc<Mutex<Log>>,
}

impl MetricLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `event`, reported on worker `host`, as the core's metrics
    /// observer records it.
    pub fn observe(&self, host: &str, event: &Event) {
        let recorder = HostRecorder { log: self, host };
        metrics::with_local_recorder(&recorder, || MetricsObserver::new().on_event(event));
    }

    /// Ends the run's metrics: nothing recorded from now on is kept.
    pub fn seal(&self) {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).sealed = true;
    }

    fn push(&self, key: &SeriesKey, kind: Type, change: Change) {
        let at = u64::try_from(sim_elapsed().as_micros()).unwrap_or(u64::MAX);
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        if log.sealed {
            return;
        }
        log.series
            .entry(key.clone())
            .or_insert_with(|| (kind, Vec::new()))
            .1
            .push((at, change));
    }

    /// The series names recorded, sanitised, each once.
    pub fn families(&self) -> Vec<String> {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let mut names: Vec<String> = log.series.keys().map(|k| metric_name(&k.name)).collect();
        names.dedup();
        names
    }

    /// The run as OpenMetrics text: every series sampled at each step of a
    /// simulated second (or of `until / MAX_SAMPLES`, when longer) from its
    /// first change to `until`, stamped `start_unix_s` plus the simulated
    /// time, ending `# EOF`.
    pub fn to_openmetrics(&self, until: Duration, start_unix_s: u64) -> String {
        let step_us = until.as_micros().div_ceil(u128::from(MAX_SAMPLES)).max(1_000_000);
        let step_us = u64::try_from(step_us).unwrap_or(u64::MAX);
        let until_us = u64::try_from(until.as_micros()).unwrap_or(u64::MAX);
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let mut families: BTreeMap<String, Family<'_>> = BTreeMap::new();
        for (key, (kind, changes)) in &log.series {
            families
                .entry(metric_name(&key.name))
                .or_insert_with(|| Family {
                    kind: *kind,
                    series: Vec::new(),
                })
                .series
                .push((key, changes));
        }
        let mut out = String::new();
        for (family, Family { kind, series }) in &families {
            let typed = match kind {
                Type::Counter => "unknown",
                Type::Gauge => "gauge",
                Type::Summary => "summary",
            };
            let _ = writeln!(out, "# TYPE {family} {typed}");
            for (key, changes) in series {
                let labels = label_set(key);
                let Some(&(first, _)) = changes.first() else { continue };
                let mut state = State::default();
                let mut next = 0;
                let mut t = first.div_ceil(step_us).saturating_mul(step_us);
                while t <= until_us {
                    while let Some(&(_, change)) = changes.get(next).filter(|(at, _)| *at <= t) {
                        state.apply(change);
                        next += 1;
                    }
                    let stamp = stamp(start_unix_s, t);
                    match kind {
                        Type::Counter | Type::Gauge => {
                            let _ = writeln!(out, "{family}{labels} {} {stamp}", state.value);
                        }
                        Type::Summary => {
                            let _ = writeln!(out, "{family}_count{labels} {} {stamp}", state.count);
                            let _ = writeln!(out, "{family}_sum{labels} {} {stamp}", state.sum);
                        }
                    }
                    t = match t.checked_add(step_us) {
                        Some(t) => t,
                        None => break,
                    };
                }
            }
        }
        out.push_str("# EOF\n");
        out
    }
}

/// A series' value at one instant.
#[derive(Default)]
struct State {
    value: f64,
    count: u64,
    sum: f64,
}

impl State {
    fn apply(&mut self, change: Change) {
        match change {
            Change::Add(v) => self.value += v,
            Change::Set(v) => self.value = v,
            Change::Observe(v) => {
                self.count += 1;
                self.sum += v;
            }
        }
    }
}

/// `start_unix_s` plus `t_us` microseconds, in seconds to the millisecond.
fn stamp(start_unix_s: u64, t_us: u64) -> String {
    let ms = t_us / 1000;
    format!("{}.{:03}", start_unix_s.saturating_add(ms / 1000), ms % 1000)
}

/// `{a="x",…,job="redstring-sim",instance="worker-1"}`.
fn label_set(key: &SeriesKey) -> String {
    let mut out = String::from("{");
    let job = [
        ("job".to_owned(), JOB.to_owned()),
        ("instance".to_owned(), key.instance.clone()),
    ];
    for (i, (name, value)) in key.labels.iter().chain(job.iter()).enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{}=\"{}\"", label_name(name), escape(value));
    }
    out.push('}');
    out
}

/// A metric name as the Prometheus exporter writes it: `[a-zA-Z_:]` first,
/// `[a-zA-Z0-9_:]` after, anything else `_`.
pub fn metric_name(name: &str) -> String {
    name.chars()
        .enumerate()
        .map(|(i, c)| {
            if c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit()) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A label name as the Prometheus exporter writes it: `[a-zA-Z_]` first,
/// `[a-zA-Z0-9_]` after, anything else `_`.
pub fn label_name(name: &str) -> String {
    name.chars()
        .enumerate()
        .map(|(i, c)| {
            if c.is_ascii_alphabetic() || c == '_' || (i > 0 && c.is_ascii_digit()) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A label value with `\`, `"` and line feeds escaped.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// The recorder one event is recorded through: every series it registers
/// is the log's, on worker `host`.
struct HostRecorder<'a> {
    log: &'a MetricLog,
    host: &'a str,
}

impl HostRecorder<'_> {
    fn handle(&self, key: &Key, kind: Type) -> Arc<Handle> {
        Arc::new(Handle {
            log: self.log.clone(),
            kind,
            key: SeriesKey {
                name: key.name().to_owned(),
                labels: key
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect(),
                instance: self.host.to_owned(),
            },
        })
    }
}

impl metrics::Recorder for HostRecorder<'_> {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.handle(key, Type::Counter))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.handle(key, Type::Gauge))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.handle(key, Type::Summary))
    }
}

/// One registered series: each update is a change in the log, now.
struct Handle {
    log: MetricLog,
    kind: Type,
    key: SeriesKey,
}

impl CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.log.push(&self.key, self.kind, Change::Add(value as f64));
    }

    fn absolute(&self, value: u64) {
        self.log.push(&self.key, self.kind, Change::Set(value as f64));
    }
}

impl GaugeFn for Handle {
    fn increment(&self, value: f64) {
        self.log.push(&self.key, self.kind, Change::Add(value));
    }

    fn decrement(&self, value: f64) {
        self.log.push(&self.key, self.kind, Change::Add(-value));
    }

    fn set(&self, value: f64) {
        self.log.push(&self.key, self.kind, Change::Set(value));
    }
}

impl HistogramFn for Handle {
    fn record(&self, value: f64) {
        self.log.push(&self.key, self.kind, Change::Observe(value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels_are_sanitised_as_the_prometheus_exporter_does() {
        assert_eq!(
            metric_name("gen_ai.client.operation.duration"),
            "gen_ai_client_operation_duration"
        );
        assert_eq!(metric_name("9lives"), "_lives");
        assert_eq!(label_name("error.type"), "error_type");
        assert_eq!(label_name("a:b"), "a_b");
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn stamps_are_seconds_to_the_millisecond_from_the_start() {
        assert_eq!(stamp(1_700_000_000, 0), "1700000000.000");
        assert_eq!(stamp(1_700_000_000, 2_345_678), "1700000002.345");
    }
}
