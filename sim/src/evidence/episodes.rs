//! Fault episodes: when each model server was impaired by the fault schedule,
//! and when it was ready to serve again.
//!
//! A figure about "the outage" needs the outage's edges. The start is the
//! fault that impaired the server; the end is not the fault that ends it but
//! the moment the server can serve again — after a restart, only once its
//! model has loaded, at the instant *this run* drew for the load (a drawn
//! `reload` differs from seed to seed). The server records that instant as
//! [`Kind::Loaded`]; this module reads the schedule and those records in
//! time order, so a restarted server still loading is impaired like a
//! crashed one:
//!
//! - a restart leaves the server impaired until the first `Loaded` it
//!   records after that restart ([`ReadyBasis::Loaded`]); a crash before
//!   then keeps the episode open through the next restart;
//! - the kinds that load on demand (`llama_swap`, `ollama`) accept requests
//!   from the restart and load on the first one, so their restart ends the
//!   impairment at once ([`ReadyBasis::Restarted`]): the load is then part
//!   of the recovery the figures measure, not of the outage, whatever the
//!   hardening lets through;
//! - a heal, or a `behave` back to `normal`, ends it at once
//!   ([`ReadyBasis::Ended`]).
//!
//! An episode is ready when nothing impairs the server any more; a restart
//! of a server that is running does nothing, and counts for nothing.
//!
//! [`with_ready_marks`] adds a [`Kind::Ready`] event for each episode to a
//! trace, which is how the written trace and the timeline mark readiness.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::evidence::trace::{Kind, TraceEvent};
use crate::scenario::fault::in_order;
use crate::scenario::{Fault, FaultKind, Mode, Scenario, ServerKind};

/// How a server's readiness was established: what ended the last
/// impairment of its episode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadyBasis {
    /// The fault that impaired it ended, and nothing needed reloading.
    Ended,
    /// It restarted, and its model loaded (the server's own record).
    Loaded,
    /// It restarted, and it loads its model on the first request.
    Restarted,
}

impl ReadyBasis {
    /// The basis in plain words.
    pub fn describe(self) -> &'static str {
        match self {
            ReadyBasis::Ended => "the fault ended",
            ReadyBasis::Loaded => "the model loaded after the restart",
            ReadyBasis::Restarted => "restarted; it loads on the first request",
        }
    }
}

/// One stretch during which a server was impaired by the fault schedule.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Episode {
    /// The server.
    pub server: String,
    /// The kind of the fault that began it (`crash`, `behave`, `partition`).
    pub kind: FaultKind,
    /// When it began, microseconds since the start.
    pub start_us: u64,
    /// When the server was ready again, microseconds since the start
    /// (`None`: not within the run).
    pub ready_us: Option<u64>,
    /// How `ready_us` was established (`None` with it).
    pub basis: Option<ReadyBasis>,
}

impl Episode {
    /// The end of the outage: ready, or the end of the run.
    pub fn outage_end_us(&self, end_us: u64) -> u64 {
        self.ready_us.unwrap_or(end_us).max(self.start_us)
    }
}

fn micros(s: f64) -> u64 {
    // Validation bounds every `at_s`; a negative or NaN one is taken as 0.
    let us = (s * 1e6).round();
    if us.is_finite() && us > 0.0 { us as u64 } else { 0 }
}

/// What impairs one server right now.
#[derive(Default)]
struct Health {
    crashed: bool,
    misbehaving: bool,
    cuts: BTreeSet<(String, String)>,
    /// Restarted, and its model not yet loaded.
    loading: bool,
    /// The open episode: its kind and start.
    open: Option<(FaultKind, u64)>,
}

impl Health {
    fn impaired(&self) -> bool {
        self.crashed || self.misbehaving || self.loading || !self.cuts.is_empty()
    }
}

/// What changes a server's health, in time order: a fault of the schedule,
/// or the server's record that its model loaded.
enum Change<'a> {
    Fault(&'a Fault),
    Loaded,
}

fn pair(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_owned(), b.to_owned())
    } else {
        (b.to_owned(), a.to_owned())
    }
}

/// Every fault episode of `scenario`'s servers, by start then server, with
/// readiness read from the `Loaded` records in `events`.
pub fn episodes(scenario: &Scenario, events: &[TraceEvent]) -> Vec<Episode> {
    let mut out = Vec::new();
    for spec in &scenario.servers {
        let s = spec.name.as_str();
        let on_demand = matches!(spec.kind, ServerKind::LlamaSwap | ServerKind::Ollama);
        // Faults before the records of the same instant: a restart and the
        // load it completes at once are one step apart.
        let mut changes: Vec<(u64, u8, Change<'_>)> = in_order(&scenario.faults)
            .into_iter()
            .map(|f| (micros(f.at_s()), 0, Change::Fault(f)))
            .collect();
        changes.extend(
            events
                .iter()
                .filter(|e| *e.host == *s && matches!(e.kind, Kind::Loaded))
                .map(|e| (e.t_us, 1, Change::Loaded)),
        );
        changes.sort_by_key(|(t, order, _)| (*t, *order));
        let mut h = Health::default();
        for (t, _, change) in changes {
            let (kind, basis) = match change {
                Change::Loaded if h.loading && !h.crashed => {
                    h.loading = false;
                    (None, ReadyBasis::Loaded)
                }
                Change::Loaded => continue,
                Change::Fault(f) => {
                    let basis = match f {
                        Fault::Crash { server, .. } if server == s => {
                            h.crashed = true;
                            h.loading = false;
                            ReadyBasis::Ended
                        }
                        Fault::Restart { server, .. } if server == s && h.crashed => {
                            h.crashed = false;
                            h.loading = !on_demand;
                            ReadyBasis::Restarted
                        }
                        Fault::Behave { server, behaviour, .. } if server == s => {
                            h.misbehaving = behaviour.mode != Mode::Normal && behaviour.probability > 0.0;
                            ReadyBasis::Ended
                        }
                        Fault::Partition { a, b, .. } if a == s || b == s => {
                            h.cuts.insert(pair(a, b));
                            ReadyBasis::Ended
                        }
                        Fault::Heal { a, b, .. } if a == s || b == s => {
                            h.cuts.remove(&pair(a, b));
                            ReadyBasis::Ended
                        }
                        _ => continue,
                    };
                    (Some(f.kind()), basis)
                }
            };
            match (h.open, h.impaired()) {
                (None, true) => h.open = kind.map(|k| (k, t)),
                (Some((began, start)), false) => {
                    out.push(Episode {
                        server: s.to_owned(),
                        kind: began,
                        start_us: start,
                        ready_us: Some(t),
                        basis: Some(basis),
                    });
                    h.open = None;
                }
                _ => {}
            }
        }
        if let Some((kind, start)) = h.open {
            out.push(Episode {
                server: s.to_owned(),
                kind,
                start_us: start,
                ready_us: None,
                basis: None,
            });
        }
    }
    out.sort_by(|a, b| a.start_us.cmp(&b.start_us).then_with(|| a.server.cmp(&b.server)));
    out
}

/// `events` with a [`Kind::Ready`] event for every episode whose server was
/// ready within the run, each placed after every event at or before its
/// instant (the trace stays in time order).
pub fn with_ready_marks(scenario: &Scenario, events: &[TraceEvent]) -> Vec<TraceEvent> {
    let mut marks: Vec<TraceEvent> = episodes(scenario, events)
        .into_iter()
        .filter_map(|ep| {
            Some(TraceEvent {
                t_us: ep.ready_us?,
                host: ep.server.into(),
                call: None,
                kind: Kind::Ready { basis: ep.basis? },
            })
        })
        .collect();
    marks.sort_by_key(|m| m.t_us);
    let mut out = Vec::with_capacity(events.len() + marks.len());
    let mut marks = marks.into_iter().peekable();
    for e in events {
        while let Some(m) = marks.next_if(|m| m.t_us < e.t_us) {
            out.push(m);
        }
        out.push(e.clone());
    }
    out.extend(marks);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::outcome::Answer;

    const BASE: &str = r#"
name = "episodes"
duration_s = 100
[[servers]]
name = "gpu"
reload_s = 15
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 60 }]
"#;

    fn scenario(extra: &str) -> Scenario {
        Scenario::parse("episodes.toml", &format!("{BASE}{extra}")).unwrap()
    }

    fn served(t_s: u64, answer: Answer) -> TraceEvent {
        TraceEvent {
            t_us: t_s * 1_000_000,
            host: "gpu".into(),
            call: None,
            kind: Kind::served(answer),
        }
    }

    const CRASH_RESTART: &str = r#"
[[faults]]
kind = "crash"
at_s = 10
server = "gpu"
[[faults]]
kind = "restart"
at_s = 30
server = "gpu"
"#;

    fn loaded(t_s: u64) -> TraceEvent {
        TraceEvent {
            t_us: t_s * 1_000_000,
            host: "gpu".into(),
            call: None,
            kind: Kind::Loaded,
        }
    }

    #[test]
    fn a_restart_is_ready_when_the_run_recorded_the_model_loaded() {
        // Whatever reload the scenario allows, the instant this run drew.
        let mut s = scenario(CRASH_RESTART);
        s.servers[0].reload = Some(crate::scenario::Spread::Uniform { low: 5.0, high: 40.0 });
        let events = [
            loaded(0),
            served(5, Answer::Ok),
            served(33, Answer::Loading),
            loaded(37),
            served(41, Answer::Ok),
        ];
        assert_eq!(
            episodes(&s, &events),
            [Episode {
                server: "gpu".into(),
                kind: FaultKind::Crash,
                start_us: 10_000_000,
                ready_us: Some(37_000_000),
                basis: Some(ReadyBasis::Loaded),
            }]
        );
        // Never loaded after the restart: not ready within the run.
        assert_eq!(episodes(&s, &events[..3])[0].ready_us, None);
    }

    #[test]
    fn a_restart_loaded_while_still_cut_off_is_ready_at_the_heal() {
        let cut = r#"
[[faults]]
kind = "partition"
at_s = 20
a = "w"
b = "gpu"
[[faults]]
kind = "heal"
at_s = 50
a = "gpu"
b = "w"
"#;
        let s = scenario(&format!("{CRASH_RESTART}{cut}"));
        let eps = episodes(&s, &[loaded(45)]);
        assert_eq!(
            (eps[0].ready_us, eps[0].basis),
            (Some(50_000_000), Some(ReadyBasis::Ended))
        );
    }

    #[test]
    fn a_crash_during_the_load_keeps_the_episode_open_until_the_next_load() {
        // Crash 10, restart 30 (loads until 60), crash 40, restart 45,
        // loaded 75: one episode, ready at 75; the first start never loaded.
        let again = "[[faults]]\nkind = \"crash\"\nat_s = 40\nserver = \"gpu\"\n[[faults]]\nkind = \"restart\"\nat_s = 45\nserver = \"gpu\"\n";
        let s = scenario(&format!("{CRASH_RESTART}{again}"));
        let eps = episodes(&s, &[loaded(0), loaded(75)]);
        assert_eq!(eps.len(), 1, "{eps:?}");
        assert_eq!((eps[0].start_us, eps[0].ready_us), (10_000_000, Some(75_000_000)));
    }

    #[test]
    fn a_partition_during_the_load_ends_when_both_are_over() {
        // Crash 10, restart 30, partition 32, heal 36, loaded 45: the server
        // answers 503 until 45, so the episode runs until then.
        let cut = "[[faults]]\nkind = \"partition\"\nat_s = 32\na = \"w\"\nb = \"gpu\"\n[[faults]]\nkind = \"heal\"\nat_s = 36\na = \"gpu\"\nb = \"w\"\n";
        let s = scenario(&format!("{CRASH_RESTART}{cut}"));
        let eps = episodes(&s, &[loaded(45)]);
        assert_eq!(eps.len(), 1, "{eps:?}");
        assert_eq!(
            (eps[0].ready_us, eps[0].basis),
            (Some(45_000_000), Some(ReadyBasis::Loaded))
        );
    }

    #[test]
    fn a_kind_that_loads_on_demand_is_ready_at_its_restart() {
        let mut s = scenario(CRASH_RESTART);
        s.servers[0].kind = ServerKind::LlamaSwap;
        // Whether or not a request made it load.
        for events in [vec![], vec![loaded(52)]] {
            let eps = episodes(&s, &events);
            assert_eq!(
                (eps[0].ready_us, eps[0].basis),
                (Some(30_000_000), Some(ReadyBasis::Restarted))
            );
        }
    }

    #[test]
    fn a_restart_of_a_running_server_opens_and_closes_nothing() {
        let restart = "[[faults]]\nkind = \"restart\"\nat_s = 30\nserver = \"gpu\"\n";
        assert!(episodes(&scenario(restart), &[loaded(0)]).is_empty());
    }

    #[test]
    fn a_crash_never_restarted_is_never_ready_and_a_heal_is_ready_at_once() {
        let crash = "[[faults]]\nkind = \"crash\"\nat_s = 10\nserver = \"gpu\"\n";
        let eps = episodes(&scenario(crash), &[]);
        assert_eq!((eps.len(), eps[0].ready_us, eps[0].basis), (1, None, None));
        let cut = r#"
[[faults]]
kind = "partition"
at_s = 20
a = "w"
b = "gpu"
[[faults]]
kind = "heal"
at_s = 25
a = "gpu"
b = "w"
"#;
        let eps = episodes(&scenario(cut), &[]);
        assert_eq!(eps.len(), 1);
        assert_eq!(
            (eps[0].kind, eps[0].start_us, eps[0].ready_us, eps[0].basis),
            (
                FaultKind::Partition,
                20_000_000,
                Some(25_000_000),
                Some(ReadyBasis::Ended)
            )
        );
    }

    #[test]
    fn ready_marks_are_inserted_in_time_order() {
        let s = scenario(CRASH_RESTART);
        let events = [
            served(5, Answer::Ok),
            loaded(45),
            served(45, Answer::Ok),
            served(50, Answer::Ok),
        ];
        let marked = with_ready_marks(&s, &events);
        let kinds: Vec<(u64, bool)> = marked
            .iter()
            .map(|e| (e.t_us / 1_000_000, matches!(e.kind, Kind::Ready { .. })))
            .collect();
        assert_eq!(kinds, [(5, false), (45, false), (45, false), (45, true), (50, false)]);
    }
}
