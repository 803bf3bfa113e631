//! Judgement: what the evidence of a run says.
//!
//! [`invariants`] decides whether the library kept its promises (one registry,
//! one checker per invariant, grouped by subject); [`figures`] measures how the
//! configuration served its callers, [`episode_figures`] the same per fault
//! episode, and [`objectives`] judges those figures
//! against the scenario's targets; [`report`] turns a run and its verdicts
//! into figures and text; [`sweep`] summarises many seeds; [`compare`] sets
//! variants side by side over the same seeds; [`shard`] says which part of
//! those a machine runs; [`plots`] draws the SVG timeline and a comparison's
//! distributions. [`judge`] turns a run's evidence into a [`Run`] with its
//! verdicts.

pub mod compare;
pub mod episode_figures;
pub mod figures;
pub mod invariants;
pub mod objectives;
pub mod plots;
pub mod report;
pub mod shard;
pub mod sweep;

/// A finished run: its evidence and the invariants' verdicts on it.
#[derive(Clone, Debug)]
pub struct Run {
    /// The seed it ran with.
    pub seed: u64,
    /// Simulated time covered.
    pub simulated: std::time::Duration,
    /// Every event, in order.
    pub events: Vec<crate::evidence::trace::TraceEvent>,
    /// Every invariant's verdict, in [`invariants::Invariant::ALL`] order.
    pub checks: Vec<invariants::Check>,
}

impl Run {
    /// The invariants that failed (violated and not declared `may_violate`).
    pub fn failed(&self) -> Vec<invariants::Invariant> {
        self.checks.iter().filter(|c| c.failed()).map(|c| c.name).collect()
    }
}

/// Judges what a run of `scenario` left behind: every invariant's verdict.
pub fn judge(scenario: &crate::scenario::Scenario, evidence: crate::evidence::Evidence) -> Run {
    Run {
        seed: evidence.seed,
        simulated: evidence.simulated,
        checks: invariants::check_all(scenario, &evidence.events),
        events: evidence.events,
    }
}

/// `word` as one POSIX shell word, for a command printed to be pasted: as
/// it is when every character is safe, in single quotes when it has none
/// that a terminal acts on, else in bash's `$'…'` with every control
/// character and bidirectional control ([`crate::terminal::is_unsafe`])
/// escaped — a file named `a b;touch PWNED;.toml`, or one with an ANSI
/// escape or a right-to-left override, is neither run nor drawn.
pub fn shell_word(word: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        return word.to_owned();
    }
    if !crate::terminal::has_unsafe(word) {
        return format!("'{}'", word.replace('\'', r"'\''"));
    }
    let mut out = String::from("$'");
    for c in word.chars() {
        match c {
            '\'' => out.push_str(r"\'"),
            '\\' => out.push_str(r"\\"),
            c if crate::terminal::is_unsafe(c) => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// A tenant as a report names it: `tenant 7` for a scenario's numbered
/// tenant (`scenario::tenant(7)`, an id that fits in 64 bits), its UUID
/// otherwise.
pub fn tenant_label(t: redstring::TenantId) -> String {
    match u64::try_from(t.as_uuid().as_u128()) {
        Ok(n) => format!("tenant {n}"),
        Err(_) => t.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_printed_path_is_one_shell_word_that_runs_nothing() {
        assert_eq!(shell_word("scenarios/a-b_c.toml"), "scenarios/a-b_c.toml");
        assert_eq!(shell_word("a b;touch PWNED;.toml"), "'a b;touch PWNED;.toml'");
        assert_eq!(shell_word("it's.toml"), r"'it'\''s.toml'");
        assert_eq!(shell_word("\u{1b}[31mred.toml"), r"$'\u001b[31mred.toml'");
        assert_eq!(shell_word("a\u{202e}lmot.toml"), r"$'a\u202elmot.toml'");
        assert_eq!(shell_word(""), "''");
    }

    #[test]
    fn numbered_tenants_read_as_their_number() {
        assert_eq!(tenant_label(crate::scenario::tenant(7)), "tenant 7");
        let big = redstring::TenantId::from_u128(u128::MAX);
        assert_eq!(tenant_label(big), "ffffffff-ffff-ffff-ffff-ffffffffffff");
    }
}
