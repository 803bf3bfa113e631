//! The shared cooldown's promise: once a quota signal's cooldown is recorded
//! in a breaker's store, no call to that server is admitted until it ends.
//!
//! Kept apart from `breaker.rs`: a cooldown is the server's word about its
//! quota, not the circuit's state, and is judged on its own records.

use std::collections::BTreeMap;

use super::{Ctx, Finding, Verdict, not_applicable, violated};
use crate::evidence::timeline::{Breakers, Change};
use crate::evidence::trace::{Kind, TraceEvent};
use crate::hosts::worker::breaker_prefix;

/// One cooldown as the trace recorded its write.
#[derive(Clone, Copy, Debug)]
struct Written {
    /// When the write reached the trace, true simulated µs.
    traced_us: u64,
    /// The write's stamp.
    at_us: u64,
    /// The cooldown's end, on the same clock as the stamp.
    until_us: u64,
    /// Stamped by the worker's own clock, not the deciding store's: judged
    /// in true time, whatever the cache.
    workers_clock: bool,
    /// Network round trips the write may take to land after it was traced:
    /// one, or one per key of a quota group (each key's cooldown is its own
    /// write, in turn).
    trips: u64,
}

/// The breakers a spent quota heard at a server's breaker by a worker
/// cools: every breaker of the server's quota group
/// (`servers[].quota_group`) among the servers that worker routes to — its
/// provider knows no others — keyed by (worker, breaker prefix); a server
/// in no group is absent (it cools only itself).
fn quota_groups(ctx: &Ctx) -> BTreeMap<(String, String), Vec<String>> {
    let servers = &ctx.scenario.servers;
    let mut out = BTreeMap::new();
    for member in ctx.scenario.fleet() {
        for name in &member.servers {
            let Some(group) = servers
                .iter()
                .find(|s| &s.name == name)
                .and_then(|s| s.quota_group.as_ref())
            else {
                continue;
            };
            let members = member
                .servers
                .iter()
                .filter(|o| {
                    servers
                        .iter()
                        .any(|s| &s.name == *o && s.quota_group.as_ref() == Some(group))
                })
                .map(|o| breaker_prefix(o))
                .collect();
            out.insert((member.name.clone(), breaker_prefix(name)), members);
        }
    }
    out
}

/// Invariant 12: no call is admitted by a breaker whose store holds a
/// cooldown in force — per worker, or fleet-wide with a shared cache — and
/// no cooldown ends before a signal asked: every quota signal is traced
/// with the end it asked for, whether the step wrote it or kept a longer
/// one, so a store that kept a shorter one (or let a later, shorter signal
/// overwrite a longer one) admits inside a traced end. A spent quota (a
/// daily cap, `insufficient_quota`) is traced with the end the provider
/// heard — its reset, at most `max_quota_cooldown` — so a cooldown cut
/// short to `max_server_delay` admits inside it too. The store compares
/// the admission's stamp with the recorded end, so that is the claim: an
/// admission stamped before `until` of a cooldown asked before it is a
/// violation. Every call reaches a server only through an
/// admission, so none of its requests reach the server in a cooldown it was
/// admitted after; retries of a call admitted before the write are that
/// call's own (the server's delay is their floor) and are not judged.
///
/// A spent quota is the account's, not the key's: heard at a server of a
/// quota group (`servers[].quota_group`), its end holds for every server
/// of the group, so a call admitted at the account's other key inside it
/// is a violation too.
///
/// "Written before" is judged as `no_call_while_open` judges staleness: in
/// trace order for a worker's own breaker (its events reach the trace in the
/// order it decided); on a shared cache stamping with its own clock, by
/// stamp too (a store's answer reaches the trace a network trip late). On a
/// caller-stamped shared cache the stamps come from several clocks, so
/// true time decides: the admission must reach the trace more than a round
/// trip after the write did (its step then ran after the write), and less
/// than the cooldown's length less a round trip after it (the key, whose
/// TTL runs on the store's clock, was still there).
pub(super) fn no_call_in_cooldown(ctx: &Ctx, events: &[TraceEvent]) -> Finding {
    let mut breakers = Breakers::new(ctx.scopes);
    let mut recorded: BTreeMap<String, Vec<Written>> = BTreeMap::new();
    let (mut written, mut kept, mut refused, mut admitted_within) = (0u64, 0u64, 0u64, 0u64);
    let mut spent = 0u64;
    let mut verdict = Verdict::Held;
    let shared = ctx.scopes.shared();
    let trip = ctx.round_trip_us;
    let groups = quota_groups(ctx);
    for e in events {
        match &e.kind {
            Kind::Cooldown {
                breaker,
                until_us,
                at_us,
                extended,
            } => {
                if *extended {
                    written += 1;
                } else {
                    kept += 1;
                }
                recorded
                    .entry(ctx.scopes.breaker(e, breaker))
                    .or_default()
                    .push(Written {
                        traced_us: e.t_us,
                        at_us: *at_us,
                        until_us: *until_us,
                        workers_clock: false,
                        trips: 1,
                    });
            }
            Kind::QuotaSpent {
                breaker,
                until_us,
                at_us,
            } => {
                // The end the server's spent quota asked for, whatever the
                // store then kept: a cooldown cut short admits inside it —
                // at every key of the account.
                spent += 1;
                let own = [breaker.to_string()];
                let members = groups
                    .get(&(e.host.to_string(), breaker.to_string()))
                    .map_or(&own[..], Vec::as_slice);
                let trips = u64::try_from(members.len()).unwrap_or(u64::MAX);
                for member in members {
                    recorded
                        .entry(ctx.scopes.breaker(e, member))
                        .or_default()
                        .push(Written {
                            traced_us: e.t_us,
                            at_us: *at_us,
                            until_us: *until_us,
                            workers_clock: true,
                            trips,
                        });
                }
            }
            Kind::CooldownRefused { .. } => refused += 1,
            Kind::Allowed { breaker, at_us, .. } => {
                // Judged in true time: the admission reached the trace more
                // than a round trip after the write did (its step ran
                // after it), and less than the cooldown's length less a
                // round trip after it.
                let in_true_time = |w: &Written| {
                    let lasts = w.until_us.saturating_sub(w.at_us);
                    e.t_us > w.traced_us.saturating_add(trip.saturating_mul(w.trips))
                        && e.t_us.saturating_add(trip) < w.traced_us.saturating_add(lasts)
                };
                let in_force = |w: &&Written| {
                    if w.workers_clock {
                        return in_true_time(w);
                    }
                    if *at_us >= w.until_us {
                        return false;
                    }
                    match (shared, ctx.single_clock) {
                        (false, _) => true,
                        (true, true) => w.at_us < *at_us,
                        (true, false) => in_true_time(w),
                    }
                };
                let scope = ctx.scopes.breaker(e, breaker);
                if let Some(w) = recorded.get(&scope).and_then(|list| list.iter().find(in_force)) {
                    admitted_within += 1;
                    if verdict == Verdict::Held {
                        verdict = violated(
                            e,
                            format!(
                                "admitted at stamp {at_us} µs within the cooldown written at {} µs until {} µs ({} ms left)",
                                w.at_us,
                                w.until_us,
                                (w.until_us - at_us) / 1000
                            ),
                        );
                    }
                }
            }
            _ => {}
        }
        // A restarted shared cache forgets its cooldowns with everything else.
        if let Some(Change::Forgotten) = breakers.observe(e) {
            recorded.clear();
        }
    }
    if written + kept + spent == 0 {
        return not_applicable("no quota signal wrote a cooldown");
    }
    let kept = if kept == 0 {
        String::new()
    } else {
        format!(" ({kept} more signals under a longer one)")
    };
    let spent = if spent == 0 {
        String::new()
    } else {
        format!(", {spent} of them a spent quota's")
    };
    (
        verdict,
        format!(
            "{written} cooldowns written{kept}{spent}; {refused} calls refused by one; {admitted_within} admitted within one"
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use redstring::CircuitState;

    use super::super::{Invariant, check_all, event};
    use super::*;
    use crate::scenario::Scenario;

    const PER_WORKER: &str = r#"
name = "synthetic"
duration_s = 100
[hardening]
rpm = 100
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 1 }]
"#;

    fn verdict(scenario: &Scenario, events: &[TraceEvent]) -> Verdict {
        check_all(scenario, events)
            .into_iter()
            .find(|c| c.name == Invariant::NoCallInCooldown)
            .map(|c| c.verdict)
            .unwrap()
    }

    const S: u64 = 1_000_000;

    fn cooldown(t: u64, until: u64) -> TraceEvent {
        event(
            t,
            "w",
            Some(1),
            Kind::Cooldown {
                breaker: "kg:circuit:gpu".into(),
                until_us: until,
                at_us: t,
                extended: true,
            },
        )
    }

    fn allowed(t: u64, call: u64) -> TraceEvent {
        event(
            t,
            "w",
            Some(call),
            Kind::Allowed {
                breaker: "kg:circuit:gpu".into(),
                state: CircuitState::Closed,
                probe: None,
                at_us: t,
            },
        )
    }

    #[test]
    fn an_admission_inside_a_recorded_cooldown_is_caught_and_one_after_it_is_not() {
        let s = Scenario::parse("synthetic.toml", PER_WORKER).unwrap();
        assert!(matches!(verdict(&s, &[allowed(S, 1)]), Verdict::NotApplicable { .. }));
        let held = [allowed(S, 1), cooldown(2 * S, 22 * S), allowed(22 * S, 2)];
        assert_eq!(verdict(&s, &held), Verdict::Held);
        let broken = [allowed(S, 1), cooldown(2 * S, 22 * S), allowed(10 * S, 2)];
        match verdict(&s, &broken) {
            Verdict::Violated { t_us, detail, .. } => {
                assert_eq!(t_us, 10 * S);
                assert!(detail.contains("12000 ms left"), "{detail}");
            }
            other => panic!("{other:?}"),
        }
    }

    /// Two keys of one account and a server of another, on a shared cache.
    const GROUPED: &str = r#"
name = "synthetic"
duration_s = 100
[hardening]
rpm = 100
routing = "ordered"
[cache]
kind = "shared"
[[servers]]
name = "key-a"
kind = "openai"
quota = { rpm = 60, tpm = 100000, credit_tokens = 1000 }
quota_group = "org"
[[servers]]
name = "key-b"
kind = "openai"
quota = { rpm = 60, tpm = 100000, credit_tokens = 1000 }
quota_group = "org"
[[servers]]
name = "other"
kind = "openai"
quota = { rpm = 60, tpm = 100000 }
[[workers]]
name = "w"
servers = ["key-a", "key-b", "other"]
tenants = [{ id = 1, calls_per_min = 1 }]
"#;

    fn at_server(t: u64, call: u64, server: &str, kind: impl Fn(Arc<str>) -> Kind) -> TraceEvent {
        event(t, "w", Some(call), kind(format!("kg:circuit:{server}").into()))
    }

    fn admitted(t: u64, call: u64, server: &str) -> TraceEvent {
        at_server(t, call, server, |breaker| Kind::Allowed {
            breaker,
            state: CircuitState::Closed,
            probe: None,
            at_us: t,
        })
    }

    #[test]
    fn a_spent_quota_holds_for_every_key_of_its_account_and_no_other_server() {
        let s = Scenario::parse("synthetic.toml", GROUPED).unwrap();
        let spent = at_server(2 * S, 1, "key-a", |breaker| Kind::QuotaSpent {
            breaker,
            until_us: 3_602 * S,
            at_us: 2 * S,
        });
        let held = [
            spent.clone(),
            admitted(10 * S, 2, "other"),
            admitted(3_603 * S, 3, "key-b"),
        ];
        assert_eq!(verdict(&s, &held), Verdict::Held);
        let broken = [spent, admitted(10 * S, 2, "key-b")];
        match verdict(&s, &broken) {
            Verdict::Violated { t_us, detail, .. } => {
                assert_eq!(t_us, 10 * S);
                assert!(detail.contains("3592000 ms left"), "{detail}");
            }
            other => panic!("{other:?}"),
        }
        // Without the group, the other key's admission is its own business.
        let ungrouped = Scenario::parse("synthetic.toml", &GROUPED.replace("quota_group = \"org\"\n", "")).unwrap();
        let spent = at_server(2 * S, 1, "key-a", |breaker| Kind::QuotaSpent {
            breaker,
            until_us: 3_602 * S,
            at_us: 2 * S,
        });
        assert_eq!(
            verdict(&ungrouped, &[spent, admitted(10 * S, 2, "key-b")]),
            Verdict::Held
        );
        // A worker that does not route to key-b cannot cool it: another
        // worker's admission there is no violation.
        let split = GROUPED.replace(
            "servers = [\"key-a\", \"key-b\", \"other\"]\n",
            "servers = [\"key-a\", \"other\"]\n",
        ) + "[[workers]]\nname = \"v\"\nservers = [\"key-b\", \"other\"]\ntenants = [{ id = 2, calls_per_min = 1 }]\n";
        let split = Scenario::parse("synthetic.toml", &split).unwrap();
        let spent = at_server(2 * S, 1, "key-a", |breaker| Kind::QuotaSpent {
            breaker,
            until_us: 3_602 * S,
            at_us: 2 * S,
        });
        let elsewhere = event(
            10 * S,
            "v",
            Some(2),
            Kind::Allowed {
                breaker: "kg:circuit:key-b".into(),
                state: CircuitState::Closed,
                probe: None,
                at_us: 10 * S,
            },
        );
        assert_eq!(verdict(&split, &[spent, elsewhere]), Verdict::Held);
    }

    #[test]
    fn an_admission_before_the_end_a_kept_signal_asked_is_caught() {
        let s = Scenario::parse("synthetic.toml", PER_WORKER).unwrap();
        // A short cooldown written, then a longer signal the store did not
        // write (as a store keeping the first, shorter deadline would not).
        let kept = event(
            3 * S,
            "w",
            Some(2),
            Kind::Cooldown {
                breaker: "kg:circuit:gpu".into(),
                until_us: 30 * S,
                at_us: 3 * S,
                extended: false,
            },
        );
        let held = [cooldown(2 * S, 5 * S), kept.clone(), allowed(30 * S, 3)];
        assert_eq!(verdict(&s, &held), Verdict::Held);
        let broken = [cooldown(2 * S, 5 * S), kept, allowed(6 * S, 3)];
        match verdict(&s, &broken) {
            Verdict::Violated { t_us, detail, .. } => {
                assert_eq!(t_us, 6 * S);
                assert!(detail.contains("24000 ms left"), "{detail}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn on_a_store_stamped_shared_cache_an_admission_the_store_made_first_is_no_violation() {
        let text = PER_WORKER.replace("[hardening]", "[cache]\nkind = \"shared\"\n[hardening]");
        let s = Scenario::parse("synthetic.toml", &text).unwrap();
        // Traced after the write (a slower reply), stamped before it.
        let late = event(
            3 * S,
            "w",
            Some(2),
            Kind::Allowed {
                breaker: "kg:circuit:gpu".into(),
                state: CircuitState::Closed,
                probe: None,
                at_us: 2 * S - 1,
            },
        );
        assert_eq!(verdict(&s, &[cooldown(2 * S, 22 * S), late]), Verdict::Held);
        assert!(matches!(
            verdict(&s, &[cooldown(2 * S, 22 * S), allowed(3 * S, 3)]),
            Verdict::Violated { .. }
        ));
    }
}
