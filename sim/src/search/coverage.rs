//! What a search exercised: the paths through the hardening its cases
//! reached, and the ones they never did.
//!
//! A search that never opened a circuit cannot have tested the half-open
//! promises, however many cases passed. [`Coverage`] tallies, over every run
//! a search makes, the breaker's transitions, the limiter's paths (admitted
//! and refused by the cache, decided by the local fallback, admitted without
//! a limit, the cache unreachable), the retry layer's outcomes and the fault
//! kinds applied — and names each one no case reached, the domain's version
//! of an Antithesis "sometimes" assertion: each of these should happen at
//! least once in a search worth trusting.

use std::collections::BTreeMap;
use std::fmt;

use redstring::CircuitState;

use crate::evidence::outcome::CallOutcome;
use crate::evidence::trace::{Decider, Kind, TraceEvent};
use crate::scenario::FaultKind;

/// Where a path belongs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Area {
    /// The circuit breaker's transitions and leases.
    Breaker,
    /// The rate limiter's decisions and fallbacks.
    Limiter,
    /// The retry layer and how calls ended.
    Retry,
    /// The faults applied.
    Fault,
}

impl Area {
    /// The area named `name` (as [`Area::name`] gives it).
    fn parse(name: &str) -> Option<Area> {
        [Area::Breaker, Area::Limiter, Area::Retry, Area::Fault]
            .into_iter()
            .find(|a| a.name() == name)
    }

    fn name(self) -> &'static str {
        match self {
            Area::Breaker => "breaker",
            Area::Limiter => "limiter",
            Area::Retry => "retry",
            Area::Fault => "faults",
        }
    }
}

/// The paths a search should reach, in report order.
fn expected() -> Vec<(Area, String)> {
    let mut out: Vec<(Area, String)> = [
        "closed → open",
        "open → half_open",
        "half_open → closed",
        "half_open → open",
        "probe lease expired",
        "probe released",
    ]
    .iter()
    .map(|p| (Area::Breaker, (*p).to_owned()))
    .collect();
    out.extend(
        [
            "admitted",
            "refused",
            "admitted by the local limit",
            "refused by the local limit",
            "admitted without a limit",
            "cache unavailable",
        ]
        .iter()
        .map(|p| (Area::Limiter, (*p).to_owned())),
    );
    out.extend(
        [
            "retry scheduled",
            "retry on a server's Retry-After",
            "call ok",
            "call refused by the breaker",
            "call rate-limited",
            "call failed",
        ]
        .iter()
        .map(|p| (Area::Retry, (*p).to_owned())),
    );
    out.extend(FaultKind::ALL.iter().map(|k| (Area::Fault, k.name().to_owned())));
    out
}

/// How often each path was reached over the runs observed.
#[derive(Clone, Debug, Default)]
pub struct Coverage {
    runs: u64,
    hits: BTreeMap<(Area, String), u64>,
}

impl Coverage {
    /// Nothing observed yet.
    pub fn new() -> Coverage {
        Coverage::default()
    }

    /// Tallies one run's trace.
    pub fn observe(&mut self, events: &[TraceEvent]) {
        self.runs += 1;
        for e in events {
            if let Some((area, path)) = path_of(&e.kind) {
                *self.hits.entry((area, path)).or_default() += 1;
            }
        }
    }

    /// Runs observed.
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// How often `path` in `area` was reached.
    pub fn hits(&self, area: Area, path: &str) -> u64 {
        self.hits.get(&(area, path.to_owned())).copied().unwrap_or(0)
    }

    /// Every path reached, as `area: path` → how often: what a fuzz run's
    /// `--json` carries per case, so that shards' tallies can be added up.
    pub fn tally(&self) -> BTreeMap<String, u64> {
        self.hits
            .iter()
            .map(|((area, path), n)| (format!("{}: {path}", area.name()), *n))
            .collect()
    }

    /// Adds `runs` runs whose paths were reached as `tally` says (as
    /// [`Coverage::tally`] gives it); an entry that names no area is an
    /// error naming it, and nothing is added then.
    pub fn add_tally(&mut self, runs: u64, tally: &BTreeMap<String, u64>) -> Result<(), String> {
        let mut parsed = Vec::with_capacity(tally.len());
        for (key, n) in tally {
            let area = key
                .split_once(": ")
                .and_then(|(area, path)| Some((Area::parse(area)?, path)))
                .ok_or_else(|| format!("{key:?} is not `area: path` with a known area"))?;
            parsed.push((area, *n));
        }
        self.runs = self.runs.saturating_add(runs);
        for ((area, path), n) in parsed {
            let hits = self.hits.entry((area, path.to_owned())).or_default();
            *hits = hits.saturating_add(n);
        }
        Ok(())
    }

    /// The expected paths no run reached, as `area: path`.
    pub fn never(&self) -> Vec<String> {
        expected()
            .into_iter()
            .filter(|key| !self.hits.contains_key(key))
            .map(|(area, path)| format!("{}: {path}", area.name()))
            .collect()
    }
}

/// One line per area, each path with its count, then what was never reached.
impl fmt::Display for Coverage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let expected = expected();
        for area in [Area::Breaker, Area::Limiter, Area::Retry, Area::Fault] {
            let parts: Vec<String> = expected
                .iter()
                .filter(|(a, _)| *a == area)
                .map(|(a, p)| format!("{p} {}", self.hits(*a, p)))
                .collect();
            writeln!(f, "  {:<8} {}", area.name(), parts.join(", "))?;
        }
        let never = self.never();
        if never.is_empty() {
            writeln!(f, "  every path was exercised at least once in {} runs", self.runs)
        } else {
            writeln!(
                f,
                "  NEVER EXERCISED in {} runs: {} — the search says nothing about them",
                self.runs,
                never.join("; ")
            )
        }
    }
}

fn state(s: CircuitState) -> &'static str {
    s.as_str()
}

/// The path an event shows, if it shows one.
fn path_of(kind: &Kind) -> Option<(Area, String)> {
    let (area, path) = match kind {
        Kind::Breaker { from, to, .. } => (Area::Breaker, format!("{} → {}", state(*from), state(*to))),
        Kind::ProbesExpired { .. } => (Area::Breaker, "probe lease expired".into()),
        Kind::ProbeReleased { .. } => (Area::Breaker, "probe released".into()),
        Kind::Admitted { decided_by, .. } => (
            Area::Limiter,
            match decided_by {
                Decider::Cache => "admitted",
                Decider::Local => "admitted by the local limit",
                Decider::Unlimited => "admitted without a limit",
            }
            .into(),
        ),
        Kind::Limited { decided_by, .. } => (
            Area::Limiter,
            match decided_by {
                Decider::Local => "refused by the local limit",
                Decider::Cache | Decider::Unlimited => "refused",
            }
            .into(),
        ),
        Kind::CacheUnavailable { .. } => (Area::Limiter, "cache unavailable".into()),
        Kind::Retry { floor_us, .. } => (
            Area::Retry,
            if *floor_us > 0 {
                "retry on a server's Retry-After"
            } else {
                "retry scheduled"
            }
            .into(),
        ),
        Kind::CallEnd(end) => (
            Area::Retry,
            match &end.outcome {
                CallOutcome::Ok => "call ok",
                CallOutcome::CircuitOpen => "call refused by the breaker",
                CallOutcome::Cooldown => "call refused by a quota cooldown",
                CallOutcome::Deferred(_) => "call deferred by a limit",
                CallOutcome::Failed(_) => "call failed",
            }
            .into(),
        ),
        Kind::Fault { fault } => (Area::Fault, fault.kind().name().into()),
        _ => return None,
    };
    Some((area, path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{Fault, tenant};

    fn ev(kind: Kind) -> TraceEvent {
        TraceEvent {
            t_us: 0,
            host: "w".into(),
            call: None,
            kind,
        }
    }

    #[test]
    fn a_trace_with_one_opening_names_every_path_it_never_reached() {
        let mut c = Coverage::new();
        c.observe(&[
            ev(Kind::Breaker {
                breaker: "b".into(),
                from: CircuitState::Closed,
                to: CircuitState::Open,
                at_us: 0,
            }),
            ev(Kind::Admitted {
                tenant: tenant(1),
                remaining: 0,
                at_us: 0,
                decided_by: Decider::Local,
            }),
            ev(Kind::Fault {
                fault: Box::new(Fault::Crash {
                    at_s: 1.0,
                    server: "gpu".into(),
                }),
            }),
        ]);
        assert_eq!(c.runs(), 1);
        assert_eq!(c.hits(Area::Breaker, "closed → open"), 1);
        assert_eq!(c.hits(Area::Limiter, "admitted by the local limit"), 1);
        let never = c.never();
        assert!(never.contains(&"breaker: half_open → closed".to_owned()), "{never:?}");
        assert!(!never.iter().any(|p| p.contains("closed → open")), "{never:?}");
        assert!(!never.iter().any(|p| p == "faults: crash"), "{never:?}");
        assert!(c.to_string().contains("NEVER EXERCISED"));
    }

    #[test]
    fn tallies_add_up_to_the_coverage_of_every_run() {
        let open = ev(Kind::Breaker {
            breaker: "b".into(),
            from: CircuitState::Closed,
            to: CircuitState::Open,
            at_us: 0,
        });
        let mut whole = Coverage::new();
        whole.observe(std::slice::from_ref(&open));
        whole.observe(&[open.clone(), open.clone()]);
        let (mut a, mut b) = (Coverage::new(), Coverage::new());
        a.observe(std::slice::from_ref(&open));
        b.observe(&[open.clone(), open]);
        let mut joined = Coverage::new();
        joined.add_tally(a.runs(), &a.tally()).unwrap();
        joined.add_tally(b.runs(), &b.tally()).unwrap();
        assert_eq!(joined.to_string(), whole.to_string());
        assert_eq!(joined.tally(), [("breaker: closed → open".to_owned(), 3)].into());
        // An unknown area is refused, and nothing is added.
        let bad = [("engine: warp".to_owned(), 1), ("breaker: closed → open".to_owned(), 1)].into();
        assert!(joined.add_tally(5, &bad).unwrap_err().contains("engine: warp"));
        assert_eq!(joined.runs(), 2);
    }
}
