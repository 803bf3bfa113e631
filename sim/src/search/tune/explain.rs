//! Why the recommendation: the objective that binds it, how the runner-up
//! differs, and how each varied setting moves the figures.
//!
//! A recommendation and its margin say what to set, not why, nor what a
//! change would cost. Three answers come from the results the tune already
//! has, without another simulation: which objective sets the margin (the
//! one to watch), what the next candidate by rank gives up or gains, and,
//! per varied key, a least-squares estimate of how each objective's figure
//! moves per step of it — an estimate from the runs, and said to be one.

use super::*;
use render::round;

/// Why the recommendation is what it is.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Explanation {
    /// The objective that sets the recommendation's margin (null: none
    /// was measured).
    pub binding: Option<Binding>,
    /// The next candidate by rank (null: no other candidate qualified).
    pub runner_up: Option<RunnerUp>,
    /// Each varied setting's estimated effect on each objective.
    pub effects: Effects,
}

/// The recommended candidate's objective with the smallest normalised
/// slack: the one that sets its margin.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Binding {
    /// The objective, as the scenario names it.
    pub objective: String,
    /// The recommendation's worst figure on it.
    pub worst: Worst,
    /// Its target.
    pub target: f64,
    /// Its normalised slack (null: never measured, below every number).
    pub slack: Option<f64>,
}

/// A varied setting on which the runner-up differs from the recommendation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SettingDiff {
    /// The dotted key.
    pub key: String,
    /// The recommendation's value.
    pub recommended: String,
    /// The runner-up's value.
    pub runner_up: String,
}

/// One objective's worst figure for the runner-up and the recommendation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Gap {
    /// The objective.
    pub objective: String,
    /// The runner-up's worst figure.
    pub runner_up: Worst,
    /// The recommendation's worst figure.
    pub recommended: Worst,
}

/// The next candidate by rank and how it differs from the recommendation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunnerUp {
    /// Its id.
    pub id: usize,
    /// Seeds it ran (fewer than the recommendation's when it stopped
    /// before the last rung).
    pub seeds: u64,
    /// The varied settings where it differs, in the order given.
    pub differs: Vec<SettingDiff>,
    /// Its margin (null: an objective never measured).
    pub margin: Option<f64>,
    /// The first of [`Candidate::rank`]'s keys on which it falls behind.
    pub decided_by: Option<RankKey>,
    /// Its (objective, seed) pairs met and measured.
    pub pairs_met: [u64; 2],
    /// The recommendation's (objective, seed) pairs met and measured.
    pub recommended_pairs_met: [u64; 2],
    /// Objectives whose worst figure is worse than the recommendation's.
    pub behind: Vec<Gap>,
    /// Objectives whose worst figure is better than the recommendation's.
    pub ahead: Vec<Gap>,
}

/// Each varied setting's effect, estimated from the runs already made.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Effects {
    /// The seeds the estimate rests on, `[from, to)`: those every
    /// candidate ran, so each comparison is between runs of the same seeds.
    pub seeds: [u64; 2],
    /// Per varied key, in the order given.
    pub settings: Vec<Effect>,
}

/// One varied setting's estimated effect on each objective.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Effect {
    /// The dotted key.
    pub key: String,
    /// The step the effect is given per (null: the values are not numbers).
    pub step: Option<f64>,
    /// Per objective, in the scenario's order.
    pub objectives: Vec<ObjectiveEffect>,
}

/// How one objective's figure moves per step of one setting.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ObjectiveEffect {
    /// The objective.
    pub name: String,
    /// The change in its figure per step (null: not enough runs to tell).
    pub per_step: Option<f64>,
    /// One standard error of that change (null with it).
    pub stderr: Option<f64>,
    /// Candidates the estimate rests on: those measured on every seed.
    pub candidates: usize,
}

/// The objective that binds `c`: the smallest normalised slack among
/// those measured (never measured counts as the smallest), the first in
/// the scenario's order on a tie.
pub fn binding(c: &Candidate) -> Option<Binding> {
    c.objectives
        .iter()
        .filter(|o| o.worst != Worst::NotApplicable)
        .min_by(|a, b| slack_key(a.slack).total_cmp(&slack_key(b.slack)))
        .map(|o| Binding {
            objective: o.name.clone(),
            worst: o.worst,
            target: o.target,
            slack: o.slack,
        })
}

/// The candidate after `recommended`: of the qualified others, the one
/// that ran the most seeds, best by [`Candidate::rank`] among those.
pub fn runner_up(candidates: &[Candidate], recommended: &Candidate, dims: &[Dim]) -> Option<RunnerUp> {
    let r = candidates
        .iter()
        .filter(|c| c.disqualified.is_none() && c.id != recommended.id && c.seeds > 0)
        .min_by(|a, b| b.seeds.cmp(&a.seeds).then_with(|| Candidate::rank(a, b)))?;
    let differs = dims
        .iter()
        .filter_map(|d| {
            let (mine, theirs) = (recommended.values.get(&d.key)?, r.values.get(&d.key)?);
            (mine != theirs).then(|| SettingDiff {
                key: d.key.clone(),
                recommended: mine.clone(),
                runner_up: theirs.clone(),
            })
        })
        .collect();
    let (mut behind, mut ahead) = (Vec::new(), Vec::new());
    for o in &r.objectives {
        let Some(mine) = recommended.objectives.iter().find(|m| m.name == o.name) else {
            continue;
        };
        let gap = Gap {
            objective: o.name.clone(),
            runner_up: o.worst,
            recommended: mine.worst,
        };
        match o.worst.key().total_cmp(&mine.worst.key()) {
            std::cmp::Ordering::Greater => behind.push(gap),
            std::cmp::Ordering::Less => ahead.push(gap),
            std::cmp::Ordering::Equal => {}
        }
    }
    let pairs = |c: &Candidate| {
        let (met, all) = c.pairs_met();
        [met, all]
    };
    Some(RunnerUp {
        id: r.id,
        seeds: r.seeds,
        differs,
        margin: r.margin,
        decided_by: Candidate::decided_by(recommended, r),
        pairs_met: pairs(r),
        recommended_pairs_met: pairs(recommended),
        behind,
        ahead,
    })
}

/// The step a setting's effect is given per: 1 for integers, the step of
/// a stepped range, a tenth of a continuous one, the smallest gap between
/// a list's numbers (null: not numbers, or a single value).
pub(super) fn step_of(d: &Dim) -> Option<f64> {
    let step = match &d.spec {
        Spec::Ints { .. } => 1.0,
        Spec::Steps { step, .. } => *step,
        Spec::Reals { lo, hi } => round((hi - lo) / 10.0),
        Spec::List(values) => {
            let mut v: Vec<f64> = values
                .iter()
                .map(|s| s.trim().parse::<f64>().ok().filter(|x| x.is_finite()))
                .collect::<Option<_>>()?;
            v.sort_by(f64::total_cmp);
            v.windows(2)
                .map(|w| w[1] - w[0])
                .filter(|g| *g > 0.0)
                .reduce(f64::min)?
        }
    };
    (step.is_finite() && step > 0.0).then_some(step)
}

/// Per column of a fit, its slope and one standard error.
pub(super) type Slopes = Vec<(f64, f64)>;

/// Least squares of `y` on the columns of `x` (one row per run) with an
/// intercept: per column its slope and one standard error. None when there
/// are not more runs than unknowns (no residual to judge the fit by), or
/// the columns do not vary independently of each other.
pub(super) fn least_squares(x: &[Vec<f64>], y: &[f64]) -> Option<Slopes> {
    let n = y.len();
    let k = x.first().map_or(0, Vec::len);
    if x.len() != n || x.iter().any(|row| row.len() != k) || n < k + 2 {
        return None;
    }
    let mean = |f: &dyn Fn(usize) -> f64| (0..n).map(f).sum::<f64>() / n as f64;
    let x_mean: Vec<f64> = (0..k).map(|j| mean(&|i| x[i][j])).collect();
    let y_mean = mean(&|i| y[i]);
    let xc = |i: usize, j: usize| x[i][j] - x_mean[j];
    // The normal equations, centred: (XᵀX) β = Xᵀy, inverted whole for the
    // standard errors.
    let mut a: Vec<Vec<f64>> = (0..k)
        .map(|j| (0..k).map(|l| (0..n).map(|i| xc(i, j) * xc(i, l)).sum()).collect())
        .collect();
    let b: Vec<f64> = (0..k)
        .map(|j| (0..n).map(|i| xc(i, j) * (y[i] - y_mean)).sum())
        .collect();
    let scale = (0..k).map(|j| a[j][j]).fold(0.0, f64::max);
    let mut inv: Vec<Vec<f64>> = (0..k)
        .map(|j| (0..k).map(|l| f64::from(u8::from(j == l))).collect())
        .collect();
    for col in 0..k {
        let pivot = (col..k).max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs()))?;
        let size = a[pivot][col].abs();
        if size.is_nan() || size <= 1e-9 * scale {
            return None;
        }
        a.swap(col, pivot);
        inv.swap(col, pivot);
        let p = a[col][col];
        for l in 0..k {
            a[col][l] /= p;
            inv[col][l] /= p;
        }
        for row in 0..k {
            if row != col {
                let f = a[row][col];
                for l in 0..k {
                    a[row][l] -= f * a[col][l];
                    inv[row][l] -= f * inv[col][l];
                }
            }
        }
    }
    let beta: Vec<f64> = (0..k).map(|j| (0..k).map(|l| inv[j][l] * b[l]).sum()).collect();
    let rss: f64 = (0..n)
        .map(|i| {
            let fit: f64 = (0..k).map(|j| beta[j] * xc(i, j)).sum();
            (y[i] - y_mean - fit).powi(2)
        })
        .sum();
    let sigma2 = rss / (n - k - 1) as f64;
    let out: Vec<(f64, f64)> = (0..k)
        .map(|j| (beta[j], (sigma2 * inv[j][j]).max(0.0).sqrt()))
        .collect();
    out.iter().all(|(b, s)| b.is_finite() && s.is_finite()).then_some(out)
}

/// Each varied setting's effect on each objective, from the results in
/// `known` on `seeds` (those every candidate ran): per qualified candidate
/// and objective, its mean figure over those seeds (left out when the
/// objective was not measured on one of them), fitted by least squares
/// against the numeric settings together.
pub(super) fn effects(
    dims: &[Dim],
    candidates: &[Candidate],
    known: &BTreeMap<(usize, u64), SeedResult>,
    seeds: [u64; 2],
) -> Effects {
    let [from, to] = seeds;
    // The qualified candidates and their results on every one of the seeds.
    let runs: Vec<(&Candidate, Vec<&SeedResult>)> = candidates
        .iter()
        .filter(|c| c.disqualified.is_none())
        .filter_map(|c| {
            let results: Option<Vec<&SeedResult>> = (from..to).map(|s| known.get(&(c.id, s))).collect();
            results.filter(|r| !r.is_empty()).map(|r| (c, r))
        })
        .collect();
    let number = |c: &Candidate, key: &str| {
        c.values
            .get(key)
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|v| v.is_finite())
    };
    let numeric: Vec<usize> = (0..dims.len())
        .filter(|&j| step_of(&dims[j]).is_some() && runs.iter().all(|(c, _)| number(c, &dims[j].key).is_some()))
        .collect();
    let names: Vec<&str> = runs.first().map_or(Vec::new(), |(c, _)| {
        c.objectives.iter().map(|o| o.name.as_str()).collect()
    });
    // Per objective: the slopes (by numeric setting) and the runs they rest on.
    let fits: Vec<(Option<Slopes>, usize)> = names
        .iter()
        .map(|name| {
            let (mut x, mut y) = (Vec::new(), Vec::new());
            for (c, results) in &runs {
                let figures: Option<Vec<f64>> = results
                    .iter()
                    .map(|r| match r.objectives.iter().find(|o| o.name == *name)?.figure {
                        Worst::Measured { value } => Some(value),
                        Worst::Never | Worst::NotApplicable => None,
                    })
                    .collect();
                let row: Option<Vec<f64>> = numeric.iter().map(|&j| number(c, &dims[j].key)).collect();
                if let (Some(f), Some(row)) = (figures, row) {
                    y.push(f.iter().sum::<f64>() / f.len() as f64);
                    x.push(row);
                }
            }
            let fit = if numeric.is_empty() {
                None
            } else {
                least_squares(&x, &y)
            };
            (fit, y.len())
        })
        .collect();
    let settings = dims
        .iter()
        .enumerate()
        .map(|(j, d)| {
            let column = numeric.iter().position(|&n| n == j);
            let step = column.and_then(|_| step_of(d));
            let objectives = names
                .iter()
                .zip(&fits)
                .map(|(name, (fit, n))| {
                    let slope = column
                        .zip(step)
                        .and_then(|(c, step)| fit.as_ref().map(|f| (f[c].0 * step, f[c].1 * step)));
                    ObjectiveEffect {
                        name: (*name).to_owned(),
                        per_step: slope.map(|s| s.0),
                        stderr: slope.map(|s| s.1),
                        candidates: *n,
                    }
                })
                .collect();
            Effect {
                key: d.key.clone(),
                step,
                objectives,
            }
        })
        .collect();
    Effects { seeds, settings }
}

/// Why `recommended` was chosen among `candidates`, the effects estimated
/// from `known` on `seeds`.
pub(super) fn explain(
    dims: &[Dim],
    candidates: &[Candidate],
    recommended: &Candidate,
    known: &BTreeMap<(usize, u64), SeedResult>,
    seeds: [u64; 2],
) -> Explanation {
    Explanation {
        binding: binding(recommended),
        runner_up: runner_up(candidates, recommended, dims),
        effects: effects(dims, candidates, known, seeds),
    }
}

/// `v` with its sign (a true minus), to about three significant figures.
pub(super) fn signed(v: f64) -> String {
    // No "−0.000".
    let v = if v == 0.0 { 0.0 } else { v };
    let a = v.abs();
    let places = if a >= 100.0 {
        0
    } else if a >= 10.0 {
        1
    } else if a >= 1.0 {
        2
    } else {
        3
    };
    let s = format!("{v:+.places$}");
    s.replacen('-', "−", 1)
}

/// A change of an objective's figure by `v`, in its unit.
pub(super) fn change(name: &str, v: f64, error: Option<f64>) -> String {
    let (scale, unit) = match name {
        "failed_fraction_max" | "high_failed_fraction_max" => (100.0, " % of calls"),
        "impaired_requests_max" => (1.0, " requests"),
        n if n.ends_with("_s") => (1.0, " s"),
        _ => (1.0, ""),
    };
    let error = error.map_or(String::new(), |e| {
        format!(" ±{}", signed(e * scale).trim_start_matches('+'))
    });
    format!("{}{error}{unit}", signed(v * scale))
}

/// A setting's unit, from its key's suffix.
fn setting_unit(key: &str) -> &'static str {
    if key.ends_with("_ms") {
        " ms"
    } else if key.ends_with("_s") {
        " s"
    } else {
        ""
    }
}

fn short(key: &str) -> &str {
    key.rsplit('.').next().unwrap_or(key)
}

impl Explanation {
    /// The explanation as text, for `recommended`, as `tune` prints it.
    pub(super) fn render(&self, recommended: &Candidate) -> String {
        let mut out = String::new();
        if let Some(b) = &self.binding {
            let _ = writeln!(
                out,
                "binding objective: {}, worst {} against ≤ {}, slack {} — the smallest, so it sets the margin",
                b.objective,
                render::worst_text(b.worst),
                round(b.target),
                render::margin_text(b.slack)
            );
        }
        match &self.runner_up {
            None => {
                let _ = writeln!(out, "runner-up: none (no other candidate qualified)");
            }
            Some(r) => {
                let settings = if r.differs.is_empty() {
                    "the same settings".to_owned()
                } else {
                    r.differs
                        .iter()
                        .map(|d| format!("{}={} (not {})", short(&d.key), d.runner_up, d.recommended))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let seeds = if r.seeds < recommended.seeds {
                    format!(" (on {} seeds: it stopped before the last rung)", r.seeds)
                } else {
                    String::new()
                };
                let [met, all] = r.pairs_met;
                let [rmet, rall] = r.recommended_pairs_met;
                let why = match r.decided_by {
                    Some(RankKey::MeetsAll) => {
                        format!("it misses an objective on some seed ({met} of {all} (objective, seed) pairs met)")
                    }
                    Some(RankKey::Measured) => "it measured no objective".to_owned(),
                    Some(RankKey::PairsMet) => {
                        format!("it meets fewer (objective, seed) pairs, {met} of {all} against {rmet} of {rall}")
                    }
                    Some(RankKey::Margin) => format!(
                        "its margin is smaller, {} against {}",
                        render::margin_text(r.margin),
                        render::margin_text(recommended.margin)
                    ),
                    Some(RankKey::MeanSlack) => "the same margin but a smaller mean slack".to_owned(),
                    Some(RankKey::Id) | None => "the same figures; the lower id comes first".to_owned(),
                };
                let gaps = |gaps: &[Gap]| {
                    gaps.iter()
                        .map(|g| {
                            format!(
                                "{} {} against {}",
                                g.objective,
                                render::worst_text(g.runner_up),
                                render::worst_text(g.recommended)
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let _ = write!(out, "runner-up: #{} {settings}{seeds} ranks below: {why}", r.id);
                if !r.behind.is_empty() {
                    let _ = write!(out, "; worse on {}", gaps(&r.behind));
                }
                if !r.ahead.is_empty() {
                    let _ = write!(out, "; better on {}", gaps(&r.ahead));
                }
                let _ = writeln!(out);
            }
        }
        let [from, to] = self.effects.seeds;
        let _ = writeln!(
            out,
            "each setting's effect, an estimate from the runs already made (no further simulation): least squares over each candidate's mean figure on seeds {from}..{to}, the settings fitted together, ± one standard error:"
        );
        for e in &self.effects.settings {
            let Some(step) = e.step else {
                let _ = writeln!(out, "  {}: not numbers, not estimated", short(&e.key));
                continue;
            };
            let parts: Vec<String> = e
                .objectives
                .iter()
                .map(|o| match (o.per_step, o.stderr) {
                    (Some(v), err) => format!("{} {}", o.name, change(&o.name, v, err)),
                    (None, _) => format!("{} not enough runs", o.name),
                })
                .collect();
            let counts: Vec<usize> = e.objectives.iter().map(|o| o.candidates).collect();
            let on = if counts.windows(2).all(|w| w[0] == w[1]) {
                format!(" (on {} candidates)", counts.first().copied().unwrap_or(0))
            } else {
                let each: Vec<String> = e
                    .objectives
                    .iter()
                    .enumerate()
                    .map(|(i, o)| {
                        let what = if i == 0 { " candidates" } else { "" };
                        format!("{}{what} for {}", o.candidates, o.name)
                    })
                    .collect();
                format!(" (on {})", each.join(", "))
            };
            let _ = writeln!(
                out,
                "  {}: +{}{} → {}{on}",
                short(&e.key),
                round(step),
                setting_unit(&e.key),
                parts.join(", ")
            );
        }
        out
    }
}
