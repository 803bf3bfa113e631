//! The probe-lease property, shared by the memory and Redis adapters' tests:
//! any interleaving of admissions, reports, releases, dropped permits and
//! clock steps, run through one store's atomic `breaker_step`, never holds more
//! than `half_open_max_calls` live probes, never refuses in half-open for
//! longer than one lease, and decides an episode only on a live probe's word.

use std::time::Duration;

use proptest::prelude::*;
use redstring::CircuitState;
use redstring::Timestamp;
use redstring::cache::BreakerStore;
use redstring::decide::breaker::{BreakerCommand, BreakerKeys, BreakerParams, Origin, Permit};

/// One thing a caller does.
#[derive(Clone, Copy, Debug)]
pub enum Action {
    /// Ask for a permit and keep it.
    Allow,
    /// Report the held permit at this index (modulo the count), then forget it.
    Report(usize, bool),
    /// Release the held permit at this index, then forget it.
    Release(usize),
    /// Forget the held permit at this index: its caller vanished.
    Drop(usize),
    /// Let this much time pass.
    Advance(Duration),
}

/// Interleavings for a breaker whose recovery timeout and lease are `unit`
/// multiples of 1 s.
pub fn actions(max_len: usize) -> impl Strategy<Value = Vec<Action>> {
    prop::collection::vec(
        prop_oneof![
            4 => Just(Action::Allow),
            2 => (0usize..8, any::<bool>()).prop_map(|(i, ok)| Action::Report(i, ok)),
            1 => (0usize..8).prop_map(Action::Release),
            1 => (0usize..8).prop_map(Action::Drop),
            3 => (0u64..40).prop_map(|s| Action::Advance(Duration::from_millis(s * 500))),
        ],
        1..max_len,
    )
}

/// Parameters for a case: a threshold, up to three probes, a 10 s recovery
/// and a lease of `lease_s`.
pub fn params(threshold: u32, probes: u32, lease_s: u64) -> BreakerParams {
    BreakerParams {
        failure_threshold: threshold,
        recovery_timeout: Duration::from_secs(10),
        max_recovery_timeout: Duration::from_secs(10),
        half_open_max_calls: probes,
        probe_lease: Duration::from_secs(lease_s),
    }
}

/// Runs `actions` from `start` on `store` (which stamps with the caller's
/// time) and checks the property after every step.
pub async fn run<S: BreakerStore>(
    store: &S,
    keys: &BreakerKeys,
    p: BreakerParams,
    start: Timestamp,
    actions: &[Action],
) {
    let mut now = start;
    let mut held: Vec<Permit> = Vec::new();
    for action in actions {
        let take = |held: &mut Vec<Permit>, i: usize| (!held.is_empty()).then(|| held.remove(i % held.len()));
        let command = match *action {
            Action::Advance(d) => {
                now = now.saturating_add(d);
                None
            }
            Action::Allow => Some(BreakerCommand::Allow),
            Action::Report(i, ok) => take(&mut held, i).and_then(|permit| {
                permit.origin().map(|o| {
                    if ok {
                        BreakerCommand::RecordSuccess(o)
                    } else {
                        BreakerCommand::RecordFailure(o)
                    }
                })
            }),
            Action::Release(i) => take(&mut held, i).and_then(|permit| match permit {
                Permit::Probe(id) => Some(BreakerCommand::Release(id)),
                _ => None,
            }),
            Action::Drop(i) => {
                take(&mut held, i);
                None
            }
        };
        let Some(command) = command else { continue };
        let (before, _) = store.breaker_read(keys, now).await.unwrap();
        let step = store.breaker_step(keys, command, p, now).await.unwrap();
        match step.permit {
            Some(Permit::Refused {
                state: CircuitState::HalfOpen,
                retry_after,
                ..
            }) => {
                assert!(
                    !retry_after.is_zero() && retry_after <= p.probe_lease,
                    "a half-open refusal waits for a live lease, never longer than one: {retry_after:?}"
                );
            }
            Some(permit @ (Permit::Call | Permit::Probe(_))) => held.push(permit),
            _ => {}
        }
        if let BreakerCommand::RecordSuccess(Origin::Probe(id)) | BreakerCommand::RecordFailure(Origin::Probe(id)) =
            command
        {
            let live = before.effective_state() == CircuitState::HalfOpen
                && before.probes.as_ref().is_some_and(|l| l.holds(id, now));
            assert_eq!(
                step.before != step.after,
                live,
                "only a live probe decides the episode: {command:?} on {before:?}"
            );
        }
        let (after, _) = store.breaker_read(keys, now).await.unwrap();
        assert!(
            after.live_probes(now) <= p.half_open_max_calls as usize,
            "{} live probes, limit {}",
            after.live_probes(now),
            p.half_open_max_calls
        );
        if after.effective_state() == CircuitState::HalfOpen
            && let Some(leases) = &after.probes
        {
            assert!(
                leases
                    .live
                    .iter()
                    .all(|l| l.expires <= now.saturating_add(p.probe_lease)),
                "no lease outlives one lease from now: {leases:?}"
            );
        }
    }
}
