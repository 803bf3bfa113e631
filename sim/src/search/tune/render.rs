//! The result as text: the rungs, the front, the recommendation and why.

use super::*;

pub(super) fn round(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

pub(super) fn worst_text(w: Worst) -> String {
    match w {
        Worst::Measured { value } => round(value).to_string(),
        Worst::Never => "never".into(),
        Worst::NotApplicable => "n/a".into(),
    }
}

pub(super) fn margin_text(m: Option<f64>) -> String {
    m.map_or("-inf".into(), |m| format!("{:+.3}", round(m)))
}

impl Tuning {
    /// Whether a candidate broke an invariant (or its simulation failed):
    /// a bug, `tune`'s exit code 1.
    pub fn broke(&self) -> bool {
        self.candidates
            .iter()
            .any(|c| c.disqualified.as_ref().is_some_and(|d| d.seed.is_some()))
    }

    /// Whether the recommendation meets every objective (else exit 5).
    pub fn met(&self) -> bool {
        self.recommended
            .and_then(|id| self.candidate(id))
            .is_some_and(|c| c.meets_all)
    }

    /// The candidate with `id`.
    pub fn candidate(&self, id: usize) -> Option<&Candidate> {
        self.candidates.get(id.checked_sub(1)?)
    }

    /// One line per objective that no candidate of the last rung (of
    /// `seeds` seeds) met on every seed: its best worst figure and, where
    /// the tool can tell, what bounds it.
    pub(super) fn unmet(&self, seeds: u64) -> Vec<String> {
        let last: Vec<&Candidate> = self
            .candidates
            .iter()
            .filter(|c| c.seeds == seeds && c.disqualified.is_none())
            .collect();
        let Some(first) = last.first() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, o) in first.objectives.iter().enumerate() {
            let figures: Vec<(&Candidate, &ObjectiveFigure)> = last
                .iter()
                .filter_map(|c| c.objectives.get(i).map(|f| (*c, f)))
                .collect();
            if figures.iter().any(|(_, f)| f.met()) {
                continue;
            }
            let best = figures
                .iter()
                .min_by(|a, b| a.1.worst.key().total_cmp(&b.1.worst.key()).then(a.0.id.cmp(&b.0.id)));
            let mut line = format!("no candidate meets {} ≤ {} on every seed", o.name, round(o.target));
            if let Some((c, f)) = best {
                let _ = write!(line, "; the best worst figure is {} (#{})", worst_text(f.worst), c.id);
            }
            if let Some(bound) = bound_of(&o.name) {
                let _ = write!(line, "\n  {bound}");
            }
            out.push(line);
        }
        out
    }

    /// The result as text, as `tune` prints it.
    pub fn render(&self, dims: &[Dim]) -> String {
        let mut out = String::new();
        let [from, to] = self.seeds;
        let grid = self
            .grid_size
            .map_or("infinite: a continuous range".to_owned(), |g| g.to_string());
        let how = match self.design {
            DesignKind::Grid => format!("the full grid of {} candidates", self.candidates.len()),
            DesignKind::LatinHypercube => format!(
                "a Latin hypercube of {} candidates (grid size {grid}), refined by successive halving",
                self.candidates.len()
            ),
        };
        let _ = writeln!(out, "tune {}: {how}; seeds {from}..{to}", self.scenario);
        for (i, r) in self.rungs.iter().enumerate() {
            let _ = writeln!(
                out,
                "  rung {}: {} candidates × {} seeds ({} simulations), {} disqualified, {}{} kept",
                i + 1,
                r.candidates,
                r.seeds,
                r.simulations,
                r.disqualified,
                if r.dominated > 0 {
                    format!("{} stopped as dominated, ", r.dominated)
                } else {
                    String::new()
                },
                r.kept
            );
        }
        let _ = writeln!(
            out,
            "  {} simulations in all (a candidate moving up a rung runs only the seeds it lacks)",
            self.simulations
        );
        let bad: Vec<&Candidate> = self.candidates.iter().filter(|c| c.disqualified.is_some()).collect();
        for c in &bad {
            let Some(d) = &c.disqualified else { continue };
            match d.seed {
                Some(seed) => {
                    let _ = writeln!(
                        out,
                        "DISQUALIFIED #{} {}: {} at seed {seed} — a configuration that breaks an invariant is a bug; replay: set these values in {} and run `redstring-sim run {} --seed {seed}`",
                        c.id,
                        c.label(dims),
                        d.why,
                        self.scenario,
                        crate::judgement::shell_word(&self.scenario)
                    );
                }
                None => {
                    let _ = writeln!(out, "refused #{} {}: {}", c.id, c.label(dims), d.why);
                }
            }
        }
        let Some(last) = self.rungs.last() else {
            return out;
        };
        let names: Vec<&str> = self
            .recommended
            .and_then(|id| self.candidate(id))
            .map_or(Vec::new(), |c| c.objectives.iter().map(|o| o.name.as_str()).collect());
        let targets: Vec<String> = self
            .recommended
            .and_then(|id| self.candidate(id))
            .map_or(Vec::new(), |c| {
                c.objectives
                    .iter()
                    .map(|o| format!("{} ≤ {}", o.name, round(o.target)))
                    .collect()
            });
        let _ = writeln!(
            out,
            "\nPareto front over the worst seed's figures ({} of the {} candidates that ran all {} seeds; objectives: {}):",
            self.front.len(),
            last.kept,
            last.seeds,
            targets.join(", ")
        );
        let mut header = format!("  {:>4}", "id");
        for d in dims {
            let _ = write!(
                header,
                "  {:>w$}",
                d.key.rsplit('.').next().unwrap_or(&d.key),
                w = width(&d.key)
            );
        }
        for n in &names {
            let _ = write!(header, "  {n:>w$}", w = n.len());
        }
        let _ = write!(header, "  {:>7}  meets", "margin");
        let _ = writeln!(out, "{header}");
        for &id in &self.front {
            let Some(c) = self.candidate(id) else { continue };
            let mut line = format!("  {:>4}", format!("#{id}"));
            for d in dims {
                let _ = write!(
                    line,
                    "  {:>w$}",
                    c.values.get(&d.key).map_or("?", String::as_str),
                    w = width(&d.key)
                );
            }
            for (n, o) in names.iter().zip(&c.objectives) {
                let _ = write!(line, "  {:>w$}", worst_text(o.worst), w = n.len());
            }
            let meets = if c.meets_all { "all" } else { "no" };
            let _ = write!(line, "  {:>7}  {meets}", margin_text(c.margin));
            let _ = writeln!(out, "{line}");
        }
        match self.recommended.and_then(|id| self.candidate(id)) {
            None => {
                let _ = writeln!(out, "\nno recommendation: every candidate was disqualified");
            }
            Some(c) => {
                let tightest = c
                    .objectives
                    .iter()
                    .filter(|o| o.worst != Worst::NotApplicable)
                    .min_by(|a, b| slack_key(a.slack).total_cmp(&slack_key(b.slack)))
                    .map_or("-", |o| o.name.as_str());
                let measured = c.objectives.iter().any(|o| o.worst != Worst::NotApplicable);
                if !measured {
                    let _ = writeln!(
                        out,
                        "\nno recommendation: no objective was measured on any seed ({} not applicable on every seed, e.g. goodput recovery without a fault), so nothing tells the candidates apart; give the scenario the outage its objectives measure",
                        c.objectives
                            .iter()
                            .map(|o| o.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                    return out;
                }
                if c.meets_all {
                    let _ = writeln!(
                        out,
                        "\nrecommendation: #{} {} meets every objective on all {} seeds, margin {} (smallest normalised slack, on {tightest})",
                        c.id,
                        c.label(dims),
                        c.seeds,
                        margin_text(c.margin)
                    );
                } else {
                    let missed: Vec<String> = c
                        .objectives
                        .iter()
                        .filter(|o| !o.met())
                        .map(|o| format!("{} on {} of {} seeds", o.name, o.seeds - o.passed, o.seeds))
                        .collect();
                    let (met, all) = c.pairs_met();
                    let _ = writeln!(
                        out,
                        "\nno candidate meets every objective on every seed; the closest: #{} {}, meets {met} of {all} (objective, seed) pairs, margin {} (misses {})",
                        c.id,
                        c.label(dims),
                        margin_text(c.margin),
                        missed.join(", ")
                    );
                    for line in self.unmet(last.seeds) {
                        let _ = writeln!(out, "{line}");
                    }
                }
                if let Some(e) = &self.explanation {
                    out.push_str(&e.render(c));
                }
                let _ = write!(out, "its figures over {} seeds:{}", c.seeds, c.summary.render());
            }
        }
        if let Some(toml) = &self.hardening_toml {
            let _ = write!(out, "\nrecommended settings, ready to paste:\n{toml}");
        }
        out
    }
}

/// What bounds an objective from below whatever the breaker does, where
/// the tool knows it.
pub(super) fn bound_of(objective: &str) -> Option<&'static str> {
    match objective {
        "impaired_requests_max" => Some(
            "what bounds it: before any breaker can open, every call that arrives until failures are reported reaches the impaired server — a server that holds requests (hung, loading, slow) reports each only after hardening.request_timeout_s, so offered calls/s × request_timeout_s requests reach it first; request_timeout_s (and failure_threshold) move this floor, recovery_timeout_s does not",
        ),
        _ => None,
    }
}

pub(super) fn width(key: &str) -> usize {
    key.rsplit('.').next().unwrap_or(key).len().max(5)
}
