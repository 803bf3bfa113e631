//! Predicted against measured: the simulator's figures for a scenario over
//! many seeds beside the same figures from repetitions run for real.
//!
//! A prediction is trusted as far as it has been checked. This module puts
//! one figure's simulated distribution next to its measured mean and says
//! whether they agree, by the rule the laboratory holds the simulator to:
//! the measured mean within 20 % of the simulated median (a count below 10
//! within ±2), or inside the simulated 10th–90th percentile.
//!
//! Repetition `k` runs the arrivals of seed `k`, so each figure is also set
//! beside the simulation of the same seeds: the measured mean's error
//! against theirs says how far the model is off once the luck of the
//! arrivals is taken out, which a spread over other seeds cannot say.
//!
//! A machine's speed drifts by tens of percent within an hour, so the
//! laboratory calibrates its servers afresh before each repetition, and
//! [`calibration_of`] says which of those calibrations each simulated seed
//! runs under: seed `k` under repetition `k`'s, the others spread evenly.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::judgement::sweep::{SeedRecord, nearest_rank};

/// The relative error within which a figure agrees.
pub const WITHIN: f64 = 0.2;

/// How one figure's prediction fared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Within 20 % of the simulated median (a small count within ±2).
    Within,
    /// Not within, but inside the simulated 10th–90th percentile.
    Inside,
    /// Neither: the model misses here.
    Miss,
}

/// One figure, predicted and measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// The figure (an episode's is prefixed by the episode's name).
    pub figure: String,
    /// Its 10th percentile over the simulated seeds (nearest rank).
    pub p10: f64,
    /// Its median over the simulated seeds.
    pub median: f64,
    /// Its 90th percentile over the simulated seeds.
    pub p90: f64,
    /// Seeds that measured it.
    pub seeds: usize,
    /// Its mean over the repetitions run for real.
    pub measured: f64,
    /// Each repetition's number (its seed) and value, in the order they
    /// ran.
    pub per_repetition: Vec<(u64, f64)>,
    /// Whether every value on both sides is a whole number: a count, held
    /// to ±2 where its median is below 10.
    pub count: bool,
    /// `(measured − median) / median`; `None` when the median is 0.
    pub error: Option<f64>,
    /// The measured mean's relative error against the mean of the
    /// simulations of the repetitions' own seeds (repetition `k` runs seed
    /// `k`'s arrivals); `None` when no seed was simulated for a repetition
    /// or their mean is 0.
    pub same_seeds: Option<f64>,
    /// How it fared.
    pub verdict: Verdict,
}

/// Every figure both sides measured, whole-run first, then each episode's:
/// one row each.
pub fn compare(simulated: &[SeedRecord], measured: &[SeedRecord]) -> Vec<Row> {
    // Each figure's values, with the seed each came from.
    let gather = |records: &[SeedRecord]| {
        let mut by: BTreeMap<(u8, String), Vec<(u64, f64)>> = BTreeMap::new();
        for r in records.iter().filter(|r| r.error.is_none()) {
            for (name, v) in &r.figures {
                by.entry((0, name.clone())).or_default().push((r.seed, *v));
            }
            for ep in &r.episodes {
                for (name, v) in &ep.figures {
                    by.entry((1, format!("{}: {name}", ep.episode)))
                        .or_default()
                        .push((r.seed, *v));
                }
            }
        }
        by
    };
    let (sim, real) = (gather(simulated), gather(measured));
    let mut rows = Vec::new();
    for (key, by_seed) in sim {
        let Some(seen_by_seed) = real.get(&key) else { continue };
        let same_seeds = same_seeds(&by_seed, seen_by_seed);
        let mut values: Vec<f64> = by_seed.iter().map(|(_, v)| *v).collect();
        let seen: Vec<f64> = seen_by_seed.iter().map(|(_, v)| *v).collect();
        let seen = seen.as_slice();
        values.sort_by(f64::total_cmp);
        let (p10, median, p90) = (
            nearest_rank(&values, 10),
            nearest_rank(&values, 50),
            nearest_rank(&values, 90),
        );
        let mean = seen.iter().sum::<f64>() / seen.len() as f64;
        let error = (median != 0.0).then(|| (mean - median) / median);
        let count = values.iter().chain(seen).all(|v| v.fract() == 0.0);
        let verdict = if agrees(mean, median, count) {
            Verdict::Within
        } else if (p10..=p90).contains(&mean) {
            Verdict::Inside
        } else {
            Verdict::Miss
        };
        rows.push(Row {
            figure: key.1,
            p10,
            median,
            p90,
            seeds: values.len(),
            measured: mean,
            per_repetition: seen_by_seed.clone(),
            count,
            error,
            same_seeds,
            verdict,
        });
    }
    rows
}

/// Whether `value` agrees with the simulated `median`: within 20 % of it,
/// or, for a `count` whose median is below 10, within ±2.
fn agrees(value: f64, median: f64, count: bool) -> bool {
    if count && median.abs() < 10.0 {
        (value - median).abs() <= 2.0
    } else if median == 0.0 {
        value == 0.0
    } else {
        ((value - median) / median).abs() <= WITHIN
    }
}

/// Which of `calibrations` calibrations (`0..calibrations`, the one taken
/// before repetition `k` being `k − 1`) seed `seed` is simulated under:
/// seed `k` under the one its repetition ran with, the seeds past the last
/// repetition round again from the first, so every calibration predicts
/// for as many seeds as another, give or take one.
///
/// Seeds count from 1; no calibration at all counts as one.
pub fn calibration_of(seed: u64, calibrations: usize) -> usize {
    let n = u64::try_from(calibrations.max(1)).unwrap_or(u64::MAX);
    // Below `calibrations`, so it fits in a usize.
    usize::try_from(seed.saturating_sub(1) % n).unwrap_or(0)
}

/// The mean of `measured` against the mean of the `simulated` values of
/// the same seeds, as a relative error: `None` unless every measured seed
/// was simulated and their mean is not 0.
fn same_seeds(simulated: &[(u64, f64)], measured: &[(u64, f64)]) -> Option<f64> {
    let paired: Option<Vec<f64>> = measured
        .iter()
        .map(|(seed, _)| simulated.iter().find(|(s, _)| s == seed).map(|(_, v)| *v))
        .collect();
    let paired = paired.filter(|p| !p.is_empty())?;
    let n = paired.len() as f64;
    let (sim, real) = (
        paired.iter().sum::<f64>() / n,
        measured.iter().map(|(_, v)| v).sum::<f64>() / n,
    );
    (sim != 0.0).then(|| (real - sim) / sim)
}

/// The rows as a table, with a last line counting the verdicts. Under a
/// missed figure measured more than once, a line gives each repetition's
/// value and which of them agree with the simulated median by the same
/// rule: a mean one repetition pulled away reads apart from a model that
/// is off in every one.
pub fn render(rows: &[Row]) -> String {
    let mut out = format!(
        "{:<52} {:>9} {:>9} {:>9} {:>10} {:>8}  {:<13}  same seeds\n",
        "figure", "sim p10", "median", "p90", "measured", "error", "verdict"
    );
    let percent = |e: Option<f64>| e.map_or_else(|| "-".to_owned(), |e| format!("{:+.0} %", e * 100.0));
    let g = |v: f64| format!("{v:.3}");
    for r in rows {
        let error = percent(r.error);
        let verdict = match r.verdict {
            Verdict::Within => "within",
            Verdict::Inside => "inside spread",
            Verdict::Miss => "MISS",
        };
        out.push_str(&format!(
            "{:<52} {:>9} {:>9} {:>9} {:>10} {:>8}  {verdict:<13}  {:>10}\n",
            r.figure,
            g(r.p10),
            g(r.median),
            g(r.p90),
            g(r.measured),
            error,
            percent(r.same_seeds)
        ));
        if r.verdict == Verdict::Miss && r.per_repetition.len() > 1 {
            out.push_str(&repetitions_line(r));
        }
    }
    let count = |v: Verdict| rows.iter().filter(|r| r.verdict == v).count();
    out.push_str(&format!(
        "{} figures: {} within 20 % (small counts ±2), {} inside the simulated 10th–90th percentile, {} missed\n",
        rows.len(),
        count(Verdict::Within),
        count(Verdict::Inside),
        count(Verdict::Miss)
    ));
    out
}

/// The line under a missed figure: each repetition's value, and the
/// repetitions (by number) that agree with the simulated median.
fn repetitions_line(r: &Row) -> String {
    let values: Vec<String> = r.per_repetition.iter().map(|(_, v)| format!("{v:.3}")).collect();
    let agreeing: Vec<String> = r
        .per_repetition
        .iter()
        .filter(|(_, v)| agrees(*v, r.median, r.count))
        .map(|(k, _)| format!("#{k}"))
        .collect();
    let agreeing = if agreeing.is_empty() {
        "none".to_owned()
    } else {
        agreeing.join(", ")
    };
    format!(
        "    each repetition: {}; agreeing with the median on their own: {agreeing} of {}\n",
        values.join(" "),
        r.per_repetition.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(figures: &[(&str, f64)]) -> SeedRecord {
        SeedRecord {
            figures: figures.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            ..SeedRecord::default()
        }
    }

    #[test]
    fn seed_k_runs_under_repetition_k_s_calibration_and_the_rest_round_again() {
        let under: Vec<usize> = (1..=7).map(|seed| calibration_of(seed, 3)).collect();
        assert_eq!(under, [0, 1, 2, 0, 1, 2, 0]);
        assert!((1..=16).all(|seed| calibration_of(seed, 1) == 0));
        // Fewer seeds than calibrations: each seed still its own repetition's.
        assert_eq!(calibration_of(2, 5), 1);
    }

    #[test]
    fn a_figure_is_within_inside_or_missed_by_the_laboratory_s_rule() {
        let simulated: Vec<SeedRecord> = (1..=10)
            .map(|i| record(&[("latency", f64::from(i) / 10.0 + 0.45), ("failed", f64::from(i % 3))]))
            .collect();
        // Simulated latency: 0.55 … 1.45, median 0.95, p10 0.55, p90 1.35.
        let rows =
            |latency: f64, failed: f64| compare(&simulated, &[record(&[("latency", latency), ("failed", failed)])]);
        let verdicts = |r: Vec<Row>| r.iter().map(|r| (r.figure.clone(), r.verdict)).collect::<Vec<_>>();
        assert_eq!(
            verdicts(rows(1.0, 3.0)),
            [("failed".into(), Verdict::Within), ("latency".into(), Verdict::Within)],
            "a count of 3 against a median of 1 is within ±2"
        );
        assert_eq!(verdicts(rows(1.3, 4.0))[1], ("latency".into(), Verdict::Inside));
        assert_eq!(
            verdicts(rows(2.0, 4.0)),
            [("failed".into(), Verdict::Miss), ("latency".into(), Verdict::Miss)]
        );
        let table = render(&rows(2.0, 4.0));
        assert!(table.contains("2 figures: 0 within 20 %"), "{table}");
    }

    #[test]
    fn a_figure_is_also_set_beside_the_simulation_of_the_repetitions_own_seeds() {
        let at = |seed: u64, latency: f64| SeedRecord {
            seed,
            ..record(&[("latency", latency)])
        };
        // Seed 2's arrivals are slow; the other seeds are fast.
        let simulated: Vec<SeedRecord> = (1..=9).map(|s| at(s, if s == 2 { 2.0 } else { 1.0 })).collect();
        let measured = [at(1, 1.1), at(2, 2.2)];
        let row = &compare(&simulated, &measured)[0];
        // Against the median of every seed the mean is 65 % high; against
        // seeds 1 and 2, 10 %.
        assert!((row.error.unwrap() - 0.65).abs() < 1e-9, "{row:?}");
        assert!((row.same_seeds.unwrap() - 0.1).abs() < 1e-9, "{row:?}");
        assert!(render(std::slice::from_ref(row)).contains("+10 %"));
        // A repetition whose seed was not simulated leaves it unsaid.
        let row = &compare(&simulated, &[at(1, 1.1), at(12, 1.0)])[0];
        assert_eq!(row.same_seeds, None);
    }

    /// One repetition far off pulls the mean into a miss; the line under
    /// it shows the others agree.
    #[test]
    fn a_missed_figure_shows_which_repetitions_agree() {
        let simulated: Vec<SeedRecord> = (1..=9).map(|_| record(&[("latency_p95_s", 2.2)])).collect();
        let rep = |k: u64, figures: &[(&str, f64)]| SeedRecord {
            seed: k,
            ..record(figures)
        };
        let measured: Vec<SeedRecord> = [2.4, 8.2, 2.4, 2.4, 2.6]
            .iter()
            .zip(1..)
            .map(|(v, k)| rep(k, &[("latency_p95_s", *v)]))
            .collect();
        let rows = compare(&simulated, &measured);
        assert_eq!(rows[0].verdict, Verdict::Miss);
        assert_eq!(
            rows[0].per_repetition,
            [(1, 2.4), (2, 8.2), (3, 2.4), (4, 2.4), (5, 2.6)]
        );
        let table = render(&rows);
        assert!(
            table.contains(
                "each repetition: 2.400 8.200 2.400 2.400 2.600; agreeing with the median on their own: #1, #3, #4, #5 of 5"
            ),
            "{table}"
        );
        // A figure that agrees has no such line.
        let rows = compare(&simulated, &measured[..1]);
        assert_eq!(rows[0].verdict, Verdict::Within);
        assert!(!render(&rows).contains("each repetition"));
        // Counts keep the ±2 rule: 0 and 1 impaired against a median of 0.
        let simulated: Vec<SeedRecord> = (1..=9).map(|_| record(&[("impaired", 0.0)])).collect();
        let measured: Vec<SeedRecord> = [0.0, 23.0, 0.0, 1.0, 0.0]
            .iter()
            .zip(1..)
            .map(|(v, k)| rep(k, &[("impaired", *v)]))
            .collect();
        let table = render(&compare(&simulated, &measured));
        assert!(
            table.contains("agreeing with the median on their own: #1, #3, #4, #5 of 5"),
            "{table}"
        );
    }
}
