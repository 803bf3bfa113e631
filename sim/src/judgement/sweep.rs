//! A sweep's summary: how the figures spread across seeds, and how often each
//! invariant held and each objective was met.
//!
//! One seed's report says what happened once; a configuration is judged by
//! what happens across many. [`SweepSummary`] gathers the reports of the
//! seeds that ran and gives, for every figure of [`Figures`] and every
//! figure of every fault episode ([`EpisodeFigures`]), its distribution
//! (min / median / p95 / max), and for every invariant and objective its
//! pass rate. The summary is made from one [`SeedRecord`] per
//! seed, which `--json` carries along, so that the shards of a sweep run on
//! several machines can be merged into the summary one machine would give.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::evidence::outcome::Answer;
use crate::judgement::episode_figures::{EpisodeFigures, Latencies};
use crate::judgement::figures::Figures;
use crate::judgement::report::Report;
use crate::judgement::shard::Shard;

/// The summary names of the whole-run figures, in [`named_figures`] order.
pub const FIGURE_NAMES: [&str; 9] = [
    "latency_p50_s",
    "latency_p95_s",
    "latency_p99_s",
    "failed_fraction",
    "impaired_requests",
    "retry_amplification",
    "goodput_recovery_s",
    "calls_deferred",
    "throttled_requests",
];

/// The figures kept per model server, by summary name: its share of every
/// request the servers received, the 429s it answered (a rate limit or
/// quota: throttled, rate_limit, quota_exhausted), and the requests it
/// received while impaired.
pub const SERVER_FIGURE_NAMES: [&str; 3] = ["share", "throttled", "impaired_requests"];

/// The figures kept per priority class, by summary name: its calls that a
/// limit of the caller's own deferred, and the failed fraction of the rest
/// ([`ClassFigures`](crate::judgement::figures::ClassFigures)).
pub const CLASS_FIGURE_NAMES: [&str; 2] = ["deferred", "failed_fraction"];

/// Each priority class's figures in `report`, by [`CLASS_FIGURE_NAMES`].
fn class_figures(report: &Report) -> BTreeMap<String, BTreeMap<String, f64>> {
    report
        .figures
        .classes
        .iter()
        .map(|(class, f)| {
            let figures = [
                ("deferred", Some(f.deferred as f64)),
                ("failed_fraction", f.failed_fraction),
            ];
            let kept = figures
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v)))
                .collect();
            (class.clone(), kept)
        })
        .collect()
}

/// Each server's figures in `report`, by [`SERVER_FIGURE_NAMES`].
fn server_figures(report: &Report) -> BTreeMap<String, BTreeMap<String, f64>> {
    let total: u64 = report.servers.values().map(|s| s.received).sum();
    report
        .servers
        .iter()
        .map(|(name, load)| {
            let throttled: u64 = Answer::TOO_MANY_REQUESTS
                .iter()
                .filter_map(|a| load.by_outcome.get(a.name()))
                .sum();
            let share = if total == 0 {
                0.0
            } else {
                load.received as f64 / total as f64
            };
            let figures = [
                ("share", share),
                ("throttled", throttled as f64),
                ("impaired_requests", load.while_impaired as f64),
            ];
            (
                name.clone(),
                figures.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            )
        })
        .collect()
}

/// Every whole-run figure of `f` by its summary name (`None`: not measured).
pub fn named_figures(f: &Figures) -> [(&'static str, Option<f64>); 9] {
    let values = [
        f.latency_p50_s,
        f.latency_p95_s,
        f.latency_p99_s,
        f.failed_fraction,
        Some(f.impaired_requests as f64),
        f.retry_amplification,
        f.goodput_recovery.seconds(),
        Some(f.calls_deferred as f64),
        Some(f.throttled_requests as f64),
    ];
    let mut i = 0;
    values.map(|v| {
        i += 1;
        (FIGURE_NAMES[i - 1], v)
    })
}

/// The summary names of the per-episode figures, in
/// [`named_episode_figures`] order.
pub const EPISODE_FIGURE_NAMES: [&str; 15] = [
    "requests_reached",
    "amplification",
    "time_to_open_s",
    "goodput_recovery_s",
    "calls_failed",
    "calls_deferred",
    "latency_before_p50_s",
    "latency_before_p95_s",
    "latency_before_p99_s",
    "latency_during_p50_s",
    "latency_during_p95_s",
    "latency_during_p99_s",
    "latency_after_p50_s",
    "latency_after_p95_s",
    "latency_after_p99_s",
];

/// Every figure of one fault episode by its summary name (`None`: not
/// measured).
pub fn named_episode_figures(ep: &EpisodeFigures) -> [(&'static str, Option<f64>); 15] {
    let lat = |l: &Latencies| [l.p50_s, l.p95_s, l.p99_s];
    let [b50, b95, b99] = lat(&ep.latency_before);
    let [d50, d95, d99] = lat(&ep.latency_during);
    let [a50, a95, a99] = lat(&ep.latency_after);
    let values = [
        Some(ep.requests_reached as f64),
        ep.amplification,
        ep.time_to_open_s,
        ep.goodput_recovery.seconds(),
        Some(ep.calls_failed as f64),
        Some(ep.calls_deferred as f64),
        b50,
        b95,
        b99,
        d50,
        d95,
        d99,
        a50,
        a95,
        a99,
    ];
    let mut i = 0;
    values.map(|v| {
        i += 1;
        (EPISODE_FIGURE_NAMES[i - 1], v)
    })
}

/// The stable name of the `index`th (from 1) fault episode of a run, as the
/// single-run report names it: `#1 gpu crash at 10.0 s`. Seeds of one
/// scenario share their fault schedule, so the same name is the same
/// episode on every seed.
pub fn episode_name(index: usize, ep: &EpisodeFigures) -> String {
    format!("#{index} {} {} at {:.1} s", ep.server, ep.kind, ep.start_s)
}

/// One fault episode's figures on one seed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EpisodeRecord {
    /// Its place among the run's episodes (from 1, by start then server).
    pub index: u64,
    /// Its name ([`episode_name`]): what seeds and variants are joined by.
    pub episode: String,
    /// The figures it measured, by summary name ([`EPISODE_FIGURE_NAMES`]).
    #[serde(default)]
    pub figures: BTreeMap<String, f64>,
}

impl EpisodeRecord {
    /// The record of the `index`th (from 1) episode of a run.
    pub fn of(index: usize, ep: &EpisodeFigures) -> EpisodeRecord {
        EpisodeRecord {
            index: index as u64,
            episode: episode_name(index, ep),
            figures: named_episode_figures(ep)
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v)))
                .collect(),
        }
    }
}

/// One invariant's or objective's result on one seed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pass {
    /// The invariant or objective.
    pub name: String,
    /// Whether it passed (an invariant did not fail, an objective was not
    /// missed).
    pub passed: bool,
}

/// What a summary needs of one seed: its figures and which invariants and
/// objectives passed, or why its simulation failed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SeedRecord {
    /// The seed.
    pub seed: u64,
    /// Why the simulation failed (nothing else is set then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The whole-run figures it measured, by summary name.
    #[serde(default)]
    pub figures: BTreeMap<String, f64>,
    /// Per invariant, in the registry's order.
    #[serde(default)]
    pub invariants: Vec<Pass>,
    /// Per objective the scenario sets.
    #[serde(default)]
    pub objectives: Vec<Pass>,
    /// Per fault episode, in the run's order, its figures (absent from
    /// files written before episodes were recorded: read as none).
    #[serde(default)]
    pub episodes: Vec<EpisodeRecord>,
    /// Per model server, its figures ([`SERVER_FIGURE_NAMES`]): where the
    /// traffic went.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub servers: BTreeMap<String, BTreeMap<String, f64>>,
    /// Per priority class, its figures ([`CLASS_FIGURE_NAMES`]), when the
    /// scenario's tenants are of both classes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub classes: BTreeMap<String, BTreeMap<String, f64>>,
}

impl SeedRecord {
    /// The record of a seed's report.
    pub fn of(report: &Report) -> SeedRecord {
        SeedRecord {
            seed: report.seed,
            error: None,
            figures: named_figures(&report.figures)
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v)))
                .collect(),
            invariants: report
                .checks
                .iter()
                .map(|c| Pass {
                    name: c.name.to_string(),
                    passed: !c.failed(),
                })
                .collect(),
            objectives: report
                .objectives
                .iter()
                .map(|o| Pass {
                    name: o.name.to_owned(),
                    passed: !o.missed(),
                })
                .collect(),
            episodes: report
                .figures
                .episodes
                .iter()
                .enumerate()
                .map(|(i, ep)| EpisodeRecord::of(i + 1, ep))
                .collect(),
            servers: server_figures(report),
            classes: class_figures(report),
        }
    }

    /// The record of a seed whose simulation failed.
    pub fn failed(seed: u64, why: String) -> SeedRecord {
        SeedRecord {
            seed,
            error: Some(why),
            ..SeedRecord::default()
        }
    }

    /// The invariants that failed, by name (empty for a failed simulation).
    pub fn failed_invariants(&self) -> Vec<&str> {
        self.invariants
            .iter()
            .filter(|p| !p.passed)
            .map(|p| p.name.as_str())
            .collect()
    }

    /// The objectives missed, by name.
    pub fn missed_objectives(&self) -> Vec<&str> {
        self.objectives
            .iter()
            .filter(|p| !p.passed)
            .map(|p| p.name.as_str())
            .collect()
    }

    /// Checks a record read back from a file (a shard's `--json`) against
    /// what a run can write: known figures, each finite, not negative, a
    /// fraction at most 1; every invariant of the registry once, in order
    /// (none for a failed simulation); objectives named once each.
    pub fn check(&self) -> Result<(), String> {
        let seed = self.seed;
        // Everything here is printed: no control character may come in
        // from a file (an escape would drive the terminal, a newline forge
        // a line).
        let texts = self
            .error
            .iter()
            .map(String::as_str)
            .chain(self.objectives.iter().map(|p| p.name.as_str()))
            .chain(self.episodes.iter().map(|e| e.episode.as_str()))
            .chain(self.servers.keys().map(String::as_str));
        for text in texts {
            if crate::terminal::has_unsafe(text) {
                return Err(format!(
                    "seed {seed}: a name or message holds a control character or a bidirectional control"
                ));
            }
        }
        let figure = |name: &str, v: f64, known: &[&str]| -> Result<(), String> {
            if !known.contains(&name) {
                return Err(format!("seed {seed}: no figure is named {name:?}"));
            }
            let top = if name == "failed_fraction" { 1.0 } else { f64::MAX };
            if !(v.is_finite() && (0.0..=top).contains(&v)) {
                return Err(format!("seed {seed}: {name} = {v} is not a value a run measures"));
            }
            Ok(())
        };
        for (name, v) in &self.figures {
            figure(name, *v, &FIGURE_NAMES)?;
        }
        for ep in &self.episodes {
            for (name, v) in &ep.figures {
                figure(name, *v, &EPISODE_FIGURE_NAMES)?;
            }
        }
        for server in self.servers.values() {
            for (name, v) in server {
                figure(name, *v, &SERVER_FIGURE_NAMES)?;
                if name == "share" && *v > 1.0 {
                    return Err(format!("seed {seed}: a server's share of {v} is above 1"));
                }
            }
        }
        let names: Vec<&str> = self.invariants.iter().map(|p| p.name.as_str()).collect();
        let registry: Vec<String> = crate::judgement::invariants::Invariant::ALL
            .iter()
            .map(ToString::to_string)
            .collect();
        let expected: Vec<&str> = if self.error.is_some() {
            Vec::new()
        } else {
            registry.iter().map(String::as_str).collect()
        };
        if names != expected {
            return Err(format!(
                "seed {seed}: its invariants are not the registry's ({} listed, {} expected)",
                names.len(),
                expected.len()
            ));
        }
        let mut objectives: Vec<&str> = self.objectives.iter().map(|p| p.name.as_str()).collect();
        objectives.sort_unstable();
        if objectives.windows(2).any(|w| w[0] == w[1]) {
            return Err(format!("seed {seed}: an objective is listed twice"));
        }
        Ok(())
    }

    /// Whether the seed failed: an invariant failed or the simulation did.
    pub fn is_failure(&self) -> bool {
        self.error.is_some() || !self.failed_invariants().is_empty()
    }
}

/// How one figure spread across the seeds that measured it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Distribution {
    /// Seeds that measured it (a seed with no fault has no recovery time).
    pub seeds: u64,
    /// The smallest value.
    pub min: f64,
    /// The median, by nearest rank.
    pub median: f64,
    /// The 95th percentile, by nearest rank.
    pub p95: f64,
    /// The largest value.
    pub max: f64,
}

impl Distribution {
    /// The distribution of `values`; `None` when there are none. NaNs sort
    /// last (no figure is ever NaN).
    pub fn of(mut values: Vec<f64>) -> Option<Distribution> {
        values.sort_by(f64::total_cmp);
        let n = values.len();
        (n > 0).then(|| Distribution {
            seeds: n as u64,
            min: values[0],
            median: nearest_rank(&values, 50),
            p95: nearest_rank(&values, 95),
            max: values[n - 1],
        })
    }
}

/// The `p`th percentile of `sorted` (ascending, not empty) by nearest rank:
/// the smallest value with at least `p` % of the values at or below it.
pub fn nearest_rank(sorted: &[f64], p: usize) -> f64 {
    sorted[(sorted.len() * p).div_ceil(100).max(1) - 1]
}

/// How often one invariant or objective passed.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PassRate {
    /// The invariant or objective.
    pub name: String,
    /// Seeds where it passed: an invariant did not fail (held, not
    /// applicable, or violated where the scenario allows it); an objective
    /// was not missed (met, or not applicable).
    pub passed: u64,
    /// Seeds where it was judged (every seed that ran).
    pub seeds: u64,
}

/// How one fault episode's figures spread across the seeds that had it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EpisodeSummary {
    /// Its place among the run's episodes (from 1).
    pub index: u64,
    /// Its name ([`episode_name`]).
    pub episode: String,
    /// Seeds that ran and had this episode (every seed that ran, unless
    /// the fault schedule differed between seeds).
    pub seeds: u64,
    /// Per figure ([`EPISODE_FIGURE_NAMES`]), its distribution over the
    /// seeds that measured it; figures no seed measured are left out.
    pub figures: BTreeMap<&'static str, Distribution>,
}

/// The per-episode distributions of `records` (failed simulations left
/// out), ordered by episode index then name.
fn episode_summaries(records: &[SeedRecord]) -> Vec<EpisodeSummary> {
    type Values = BTreeMap<&'static str, Vec<f64>>;
    let mut by_episode: BTreeMap<(u64, &str), (u64, Values)> = BTreeMap::new();
    for r in records.iter().filter(|r| r.error.is_none()) {
        for ep in &r.episodes {
            let (seeds, values) = by_episode.entry((ep.index, ep.episode.as_str())).or_default();
            *seeds += 1;
            for (name, v) in &ep.figures {
                if let Some(name) = EPISODE_FIGURE_NAMES.iter().find(|n| *n == name) {
                    values.entry(name).or_default().push(*v);
                }
            }
        }
    }
    by_episode
        .into_iter()
        .map(|((index, episode), (seeds, values))| EpisodeSummary {
            index,
            episode: episode.to_owned(),
            seeds,
            figures: distributions(values),
        })
        .collect()
}

/// Each figure's distribution over its values; a figure no value measured
/// is left out.
/// Per group (a server, a priority class), the distributions of its figures
/// named in `names`, over the records that ran.
fn grouped(
    records: &[SeedRecord],
    groups: impl Fn(&SeedRecord) -> &BTreeMap<String, BTreeMap<String, f64>>,
    names: &[&'static str],
) -> BTreeMap<String, BTreeMap<&'static str, Distribution>> {
    let mut values: BTreeMap<String, BTreeMap<&'static str, Vec<f64>>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.error.is_none()) {
        for (group, figures) in groups(r) {
            for (name, v) in figures {
                if let Some(name) = names.iter().find(|n| *n == name) {
                    values
                        .entry(group.clone())
                        .or_default()
                        .entry(name)
                        .or_default()
                        .push(*v);
                }
            }
        }
    }
    values.into_iter().map(|(group, v)| (group, distributions(v))).collect()
}

fn distributions<K: Ord>(values: BTreeMap<K, Vec<f64>>) -> BTreeMap<K, Distribution> {
    values
        .into_iter()
        .filter_map(|(k, v)| Distribution::of(v).map(|d| (k, d)))
        .collect()
}

/// One distribution as a summary line, `min / median / p95 / max`, saying
/// how many of `of` seeds measured it when not all did.
fn range_line(out: &mut String, label: &str, d: &Distribution, of: u64) {
    let partial = if d.seeds < of {
        format!("  ({} of {of} seeds)", d.seeds)
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "  {label:<22} {} / {} / {} / {}{partial}",
        round(d.min),
        round(d.median),
        round(d.p95),
        round(d.max)
    );
}

/// The summary of a sweep.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SweepSummary {
    /// Seeds whose simulation ran to the end.
    pub seeds: u64,
    /// Per figure (named as in [`Figures`]), its distribution; figures no
    /// seed measured are left out.
    pub figures: BTreeMap<&'static str, Distribution>,
    /// Per invariant, in the registry's order.
    pub invariants: Vec<PassRate>,
    /// Per objective the scenario sets, in [`Objectives`](crate::scenario::Objectives) order.
    pub objectives: Vec<PassRate>,
    /// Per fault episode, its figures' distributions, by episode index.
    pub episodes: Vec<EpisodeSummary>,
    /// Per model server, its figures' distributions ([`SERVER_FIGURE_NAMES`]).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub servers: BTreeMap<String, BTreeMap<&'static str, Distribution>>,
    /// Per priority class, its figures' distributions ([`CLASS_FIGURE_NAMES`]).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub classes: BTreeMap<String, BTreeMap<&'static str, Distribution>>,
    /// Per seed, in seed order, failed simulations included: what the
    /// summary was made from, so that shards can be merged.
    pub per_seed: Vec<SeedRecord>,
}

impl SweepSummary {
    /// The summary of `reports`, one per seed that ran.
    pub fn new(reports: &[Report]) -> SweepSummary {
        SweepSummary::of_records(reports.iter().map(SeedRecord::of).collect())
    }

    /// The summary of `records`, one per seed in seed order (a failed
    /// simulation's record counts in no figure or rate).
    pub fn of_records(records: Vec<SeedRecord>) -> SweepSummary {
        let mut values: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
        let mut summary = SweepSummary::default();
        for r in records.iter().filter(|r| r.error.is_none()) {
            summary.seeds += 1;
            for (name, v) in &r.figures {
                if let Some(name) = FIGURE_NAMES.iter().find(|n| *n == name) {
                    values.entry(name).or_default().push(*v);
                }
            }
            let passes = r.invariants.iter().map(|p| (p.name.clone(), p.passed)).collect();
            tally(&mut summary.invariants, passes);
            let passes = r.objectives.iter().map(|p| (p.name.clone(), p.passed)).collect();
            tally(&mut summary.objectives, passes);
        }
        summary.episodes = episode_summaries(&records);
        summary.servers = grouped(&records, |r| &r.servers, &SERVER_FIGURE_NAMES);
        summary.classes = grouped(&records, |r| &r.classes, &CLASS_FIGURE_NAMES);
        summary.per_seed = records;
        summary.figures = distributions(values);
        summary
    }

    /// The summary as text, as `sweep` prints it.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\ndistribution over {} seeds (min / median / p95 / max):",
            self.seeds
        );
        for (name, d) in &self.figures {
            range_line(&mut out, name, d, self.seeds);
        }
        for ep in &self.episodes {
            let partial = if ep.seeds < self.seeds {
                format!("  ({} of {} seeds had it)", ep.seeds, self.seeds)
            } else {
                String::new()
            };
            let _ = writeln!(out, "episode {}{partial}:", ep.episode);
            let figures = EPISODE_FIGURE_NAMES
                .iter()
                .filter_map(|name| ep.figures.get(name).map(|d| (name, d)));
            for (name, d) in figures {
                range_line(&mut out, name, d, ep.seeds);
            }
        }
        if !self.servers.is_empty() {
            let _ = writeln!(out, "per server (where the requests went):");
        }
        for (server, figures) in &self.servers {
            for name in SERVER_FIGURE_NAMES {
                let Some(d) = figures.get(name) else { continue };
                range_line(&mut out, &format!("{server} {name}"), d, self.seeds);
            }
        }
        if !self.classes.is_empty() {
            let _ = writeln!(out, "per priority class (how its calls fared):");
        }
        for (class, figures) in &self.classes {
            for name in CLASS_FIGURE_NAMES {
                let Some(d) = figures.get(name) else { continue };
                range_line(&mut out, &format!("{class} {name}"), d, self.seeds);
            }
        }
        let _ = writeln!(out, "pass rate:");
        for (what, rates) in [("invariant", &self.invariants), ("objective", &self.objectives)] {
            for r in rates {
                let _ = writeln!(out, "  {what} {:<22} {}/{}", r.name, r.passed, r.seeds);
            }
        }
        out
    }
}

/// A sweep's whole text after the load lines: the failing seeds with their
/// replay commands, the seeds that missed an objective, then the summary.
/// `shown` is the scenario as the replay command names it; `total` the
/// seeds asked for.
pub fn render_sweep(shown: &str, total: u64, summary: &SweepSummary) -> String {
    let mut out = String::new();
    let failing: Vec<(u64, String)> = summary
        .per_seed
        .iter()
        .filter(|r| r.is_failure())
        .map(|r| {
            (
                r.seed,
                r.error.clone().unwrap_or_else(|| r.failed_invariants().join(", ")),
            )
        })
        .collect();
    let missing: Vec<(u64, String)> = summary
        .per_seed
        .iter()
        .filter(|r| !r.missed_objectives().is_empty())
        .map(|r| (r.seed, r.missed_objectives().join(", ")))
        .collect();
    let _ = writeln!(out, "{} of {total} seeds failed", failing.len());
    for (seed, why) in &failing {
        let _ = writeln!(
            out,
            "  seed {seed}: {why}\n    replay: redstring-sim run {} --seed {seed}",
            super::shell_word(shown)
        );
    }
    if !missing.is_empty() {
        let _ = writeln!(out, "{} of {total} seeds missed an objective", missing.len());
        for (seed, which) in &missing {
            let _ = writeln!(
                out,
                "  seed {seed}: missed {which}\n    replay: redstring-sim run {} --seed {seed}",
                super::shell_word(shown)
            );
        }
    }
    out.push_str(&summary.render());
    out
}

/// Adds one seed's pass/fail per name to `rates`, keeping first-seen order.
fn tally(rates: &mut Vec<PassRate>, passes: Vec<(String, bool)>) {
    for (name, passed) in passes {
        let i = match rates.iter().position(|r| r.name == name) {
            Some(i) => i,
            None => {
                rates.push(PassRate {
                    name,
                    ..PassRate::default()
                });
                rates.len() - 1
            }
        };
        rates[i].seeds += 1;
        rates[i].passed += u64::from(passed);
    }
}

fn round(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// What `sweep --json` writes: the summary with what a merge needs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SweepRun {
    /// Always `"sweep"`: what `merge` reads this as.
    pub command: &'static str,
    /// The scenario file, as the replay commands name it.
    pub scenario: String,
    /// The seeds asked for, `[from, to)`.
    pub seed_range: [u64; 2],
    /// Which shard of the seeds this is (null: all of them).
    pub shard: Option<Shard>,
    /// The load lines printed before the run.
    pub preamble: String,
    /// The scenario's [`digest`](crate::scenario::Scenario::digest): shards
    /// of one sweep ran the same settings.
    pub digest: String,
    /// The summary, its per-seed records included.
    #[serde(flatten)]
    pub summary: SweepSummary,
}

impl SweepRun {
    /// The text `sweep` prints after the preamble.
    pub fn render(&self) -> String {
        let [from, to] = self.seed_range;
        let total = self.shard.map_or(to - from, |s| s.seeds(from, to).len() as u64);
        render_sweep(&self.scenario, total, &self.summary)
    }

    /// Whether a seed failed (an invariant, or its simulation), and whether
    /// one missed an objective.
    pub fn verdict(&self) -> (bool, bool) {
        let recs = &self.summary.per_seed;
        (
            recs.iter().any(SeedRecord::is_failure),
            recs.iter().any(|r| !r.missed_objectives().is_empty()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distribution_is_nearest_rank() {
        let d = Distribution::of((1..=20).rev().map(f64::from).collect()).unwrap();
        // 20 values 1..=20: median rank 10, p95 rank 19.
        assert_eq!((d.seeds, d.min, d.median, d.p95, d.max), (20, 1.0, 10.0, 19.0, 20.0));
        let one = Distribution::of(vec![3.5]).unwrap();
        assert_eq!((one.min, one.median, one.p95, one.max), (3.5, 3.5, 3.5, 3.5));
        assert_eq!(Distribution::of(Vec::new()), None);
    }

    /// A seed's record with episode `#1 gpu crash at 10.0 s` (if `first`)
    /// and `#2 gpu crash at 40.0 s`, each with `requests_reached = reached`
    /// and, on the second, a recovery time only when `recovered` is set.
    fn record(seed: u64, reached: f64, first: bool, recovered: Option<f64>) -> SeedRecord {
        let ep = |index: u64, at: &str, figures: Vec<(&str, f64)>| EpisodeRecord {
            index,
            episode: format!("#{index} gpu crash at {at} s"),
            figures: figures.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        };
        let mut second = vec![("requests_reached", reached * 10.0)];
        second.extend(recovered.map(|s| ("goodput_recovery_s", s)));
        let mut episodes = Vec::new();
        if first {
            episodes.push(ep(1, "10.0", vec![("requests_reached", reached)]));
        }
        episodes.push(ep(2, "40.0", second));
        SeedRecord {
            seed,
            episodes,
            ..SeedRecord::default()
        }
    }

    #[test]
    fn each_episode_figure_is_distributed_over_the_seeds() {
        let s = SweepSummary::of_records(vec![
            record(1, 3.0, true, Some(2.0)),
            record(2, 1.0, true, Some(6.0)),
            record(3, 2.0, true, None),
        ]);
        let names: Vec<(u64, &str, u64)> = s
            .episodes
            .iter()
            .map(|e| (e.index, e.episode.as_str(), e.seeds))
            .collect();
        assert_eq!(
            names,
            [(1, "#1 gpu crash at 10.0 s", 3), (2, "#2 gpu crash at 40.0 s", 3)]
        );
        let d = &s.episodes[0].figures["requests_reached"];
        assert_eq!((d.seeds, d.min, d.median, d.p95, d.max), (3, 1.0, 2.0, 3.0, 3.0));
        assert_eq!(s.episodes[1].figures["requests_reached"].max, 30.0);
        // Recovered on two seeds of three: over those two, and said so.
        let r = &s.episodes[1].figures["goodput_recovery_s"];
        assert_eq!((r.seeds, r.min, r.max), (2, 2.0, 6.0));
        let text = s.render();
        assert!(
            text.contains("episode #2 gpu crash at 40.0 s:\n  requests_reached       10 / 20 / 30 / 30\n  goodput_recovery_s     2 / 2 / 6 / 6  (2 of 3 seeds)\n"),
            "{text}"
        );
    }

    #[test]
    fn an_episode_missing_on_a_seed_is_distributed_over_the_seeds_that_had_it() {
        let mut failed = SeedRecord::failed(4, "boom".into());
        // A failed simulation's record counts nowhere, whatever it carries.
        failed.episodes = record(4, 100.0, true, None).episodes;
        let s = SweepSummary::of_records(vec![
            record(1, 3.0, true, None),
            record(2, 1.0, false, None),
            record(3, 2.0, true, None),
            failed,
        ]);
        assert_eq!(s.seeds, 3);
        let first = &s.episodes[0];
        assert_eq!((first.index, first.seeds), (1, 2));
        let d = &first.figures["requests_reached"];
        assert_eq!((d.seeds, d.min, d.max), (2, 2.0, 3.0));
        assert_eq!(s.episodes[1].seeds, 3);
        let text = s.render();
        assert!(
            text.contains(
                "episode #1 gpu crash at 10.0 s  (2 of 3 seeds had it):\n  requests_reached       2 / 2 / 3 / 3\n"
            ),
            "{text}"
        );
        assert!(text.contains("episode #2 gpu crash at 40.0 s:\n"), "{text}");
    }

    #[test]
    fn a_record_written_before_episodes_were_recorded_still_reads() {
        let old = r#"{"seed": 7, "figures": {"latency_p50_s": 0.5}, "invariants": [], "objectives": []}"#;
        let r: SeedRecord = serde_json::from_str(old).unwrap();
        assert_eq!((r.seed, r.episodes.len()), (7, 0));
        assert_eq!(r.figures["latency_p50_s"], 0.5);
        // And a new one reads back to itself.
        let new = record(1, 3.0, true, Some(2.0));
        let back: SeedRecord = serde_json::from_str(&serde_json::to_string(&new).unwrap()).unwrap();
        assert_eq!(back, new);
    }

    #[test]
    fn tally_counts_passes_per_name_in_first_seen_order() {
        let mut rates = Vec::new();
        tally(&mut rates, vec![("b".into(), true), ("a".into(), false)]);
        tally(&mut rates, vec![("b".into(), false), ("a".into(), false)]);
        let got: Vec<(&str, u64, u64)> = rates.iter().map(|r| (r.name.as_str(), r.passed, r.seeds)).collect();
        assert_eq!(got, [("b", 1, 2), ("a", 0, 2)]);
    }
}
