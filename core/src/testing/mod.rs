//! The Cache compliance suite: one set of checks every adapter must pass.
//!
//! An adapter author implements [`Harness`] — how to get a fresh cache and how
//! to let time pass on the cache's own clock — and calls [`run_all`] from a
//! test. This crate runs it against [`MemoryCache`](crate::MemoryCache) on a
//! manual clock; the Redis adapter runs the same suite, unchanged, against a
//! real server. The checks pin the port's documented semantics (TTL on
//! creation only, inclusive window boundary, same-instant hits, delete
//! clearing windows, idempotent close, a breaker's shared cooldown that is
//! never shortened and expires with its TTL) and the atomic operations'
//! exactness under racing tasks.
//!
//! Enabled by the `testing` feature. The checks panic on the first violation,
//! naming the check.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::cache::{
    BreakerStore, BudgetStore, Cache, HitWindow, InFlightStore, KeyValue, LimiterStore, SlotRequest, TokenStore,
};
use crate::decide::breaker::{
    BreakerCommand, BreakerKeys, BreakerParams, BreakerSnapshot, BreakerStep, CircuitState, Origin, Permit, ProbeId,
    Refusal, Write,
};
use crate::decide::budget::{BudgetCommand, BudgetParams, BudgetState, MICROS_PER_RETRY};
use crate::decide::concurrency::{AdaptiveConcurrency, CallEnd, ConcurrencyCommand, ConcurrencyParams, UNIT};
use crate::decide::pick::PickRequest;
use crate::decide::tokens::{RefusedBy, ReservationId, TokenAsk, TokenOutcome};
use crate::decide::window::SlotOutcome;
use crate::error::CacheError;
use crate::time::Timestamp;

/// How the suite reaches an adapter.
pub trait Harness: Send + Sync + 'static {
    /// The adapter under test.
    type Cache: KeyValue + HitWindow + LimiterStore + BreakerStore + BudgetStore + TokenStore + InFlightStore;

    /// A fresh, empty, open cache stamping with the caller's time
    /// ([`TimeSource::Caller`](crate::TimeSource::Caller)).
    fn cache(&self) -> impl Future<Output = Arc<Self::Cache>> + Send;

    /// Lets `d` pass on the cache's clock, the one its TTLs run on (a manual
    /// clock advances; a real server is waited for).
    fn advance(&self, d: Duration) -> impl Future<Output = ()> + Send;

    /// The caller's current time, on the same timeline as the cache's clock.
    fn now(&self) -> Timestamp;

    /// A TTL long enough that no check's own work outlives it, and short enough
    /// to wait out: the suite advances by 1.5× this to expire things.
    fn short_ttl(&self) -> Duration {
        Duration::from_millis(400)
    }
}

macro_rules! checks {
    ($($name:ident),* $(,)?) => {
        /// Every check's name, in the order [`run_all`] runs them.
        pub const CHECKS: &[&str] = &[$(stringify!($name)),*];

        /// Runs every check against `harness`, printing each name to stderr
        /// before it runs so a failure is easy to place.
        pub async fn run_all<H: Harness>(harness: &H) {
            $(
                eprintln!("cache compliance: {}", stringify!($name));
                $name(harness).await;
            )*
        }
    };
}

checks!(
    get_of_a_missing_key_is_none,
    set_then_get_returns_the_value,
    set_replaces_value_and_ttl,
    set_with_ttl_expires,
    increment_creates_at_one_and_reads_back_as_decimal,
    increment_applies_ttl_on_creation_only,
    increment_after_expiry_starts_again_at_one,
    increment_of_a_non_integer_is_an_error,
    delete_removes_a_value_and_deleting_nothing_is_fine,
    delete_clears_the_keys_window_too,
    a_value_and_a_window_may_share_a_key,
    count_since_is_inclusive,
    two_hits_at_one_instant_are_two_hits,
    oldest_since_is_the_earliest_hit_at_or_after,
    hits_out_of_order_are_counted_by_instant,
    a_window_expires_ttl_after_its_last_hit,
    hits_older_than_ttl_before_the_caches_clock_are_discarded,
    a_first_hit_older_than_ttl_is_never_held,
    a_far_future_hit_prunes_nobody_elses,
    acquire_slot_clamps_a_caller_far_ahead_and_keeps_everyones_hits,
    acquire_slot_admits_to_the_limit_then_refuses_with_the_exact_wait,
    acquire_slot_refusals_record_nothing,
    acquire_slot_frees_slots_one_at_a_time,
    racing_acquire_slot_admits_exactly_the_limit,
    acquire_slot_under_a_lower_limit_waits_for_the_hit_that_leaves_room,
    racing_acquire_slot_keeps_the_reserve_for_the_higher_limit,
    breaker_step_opens_at_the_threshold_and_stores_readable_keys,
    breaker_failures_decay_from_the_first_without_refresh,
    breaker_half_open_admits_exactly_the_probe_limit,
    racing_breaker_probes_admit_exactly_the_limit,
    breaker_success_from_half_open_clears_everything,
    breaker_unreadable_state_reads_as_closed,
    breaker_a_large_unreadable_state_is_reported_by_excerpt,
    breaker_read_changes_nothing,
    breaker_probe_leases_expire_and_late_reports_change_nothing,
    breaker_release_frees_exactly_its_own_probe,
    breaker_failed_probes_escalate_the_open_period_until_a_close,
    racing_failed_probes_escalate_once_per_episode,
    racing_probes_close_once_at_one_stored_instant,
    breaker_cooldown_refuses_until_it_ends_and_is_never_shortened,
    breaker_cooldown_opens_nothing_and_holds_back_the_probe,
    breaker_cooldown_expires_with_its_ttl,
    breaker_reset_clears_the_cooldown,
    budget_deposits_earn_retries_and_an_empty_bucket_denies,
    budget_floor_refills_on_the_callers_clock_up_to_the_cap,
    budget_clamps_a_caller_far_ahead,
    budget_a_foreign_value_reads_as_empty_and_is_replaced,
    budget_an_expired_bucket_restarts_empty,
    racing_budget_withdrawals_grant_exactly_the_balance,
    tokens_reserve_to_the_limit_then_refuse_with_the_exact_wait,
    tokens_settle_refunds_and_charges_and_unknown_reservations_are_reported,
    tokens_an_unsettled_lease_stops_counting_when_it_ends,
    tokens_a_refusal_by_either_limit_records_nothing,
    tokens_an_estimate_over_the_limit_never_fits,
    racing_token_reservations_admit_exactly_what_fits,
    in_flight_picks_the_least_loaded_and_ties_go_to_the_first,
    in_flight_picks_by_weight,
    in_flight_leases_end_when_ended_or_run_out,
    in_flight_refuses_a_pick_with_no_candidate,
    in_flight_clamps_a_caller_far_ahead,
    racing_in_flight_picks_spread_exactly_evenly,
    concurrency_admits_to_the_limit_and_an_end_frees_a_call,
    concurrency_backs_off_on_overload_and_grows_by_one_per_limit_successes,
    concurrency_an_ended_lease_stops_counting_and_its_late_end_changes_nothing,
    concurrency_a_damaged_limit_heals_to_initial,
    racing_concurrency_admits_exactly_the_limit,
    concurrency_a_low_call_leaves_the_reserve_to_high_ones,
    racing_concurrency_keeps_the_reserve_for_high_calls,
    close_is_idempotent_and_later_calls_fail_closed,
);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

async fn get_of_a_missing_key_is_none<H: Harness>(h: &H) {
    let c = h.cache().await;
    assert_eq!(c.get("absent").await.unwrap(), None);
}

async fn set_then_get_returns_the_value<H: Harness>(h: &H) {
    let c = h.cache().await;
    c.set("k", "v", None).await.unwrap();
    assert_eq!(c.get("k").await.unwrap().as_deref(), Some("v"));
}

async fn set_replaces_value_and_ttl<H: Harness>(h: &H) {
    let c = h.cache().await;
    c.set("k", "first", Some(h.short_ttl())).await.unwrap();
    c.set("k", "second", None).await.unwrap();
    h.advance(h.short_ttl().mul_f64(1.5)).await;
    assert_eq!(
        c.get("k").await.unwrap().as_deref(),
        Some("second"),
        "a set without TTL must clear the earlier TTL"
    );
}

async fn set_with_ttl_expires<H: Harness>(h: &H) {
    let c = h.cache().await;
    c.set("k", "v", Some(h.short_ttl())).await.unwrap();
    assert_eq!(c.get("k").await.unwrap().as_deref(), Some("v"));
    h.advance(h.short_ttl().mul_f64(1.5)).await;
    assert_eq!(c.get("k").await.unwrap(), None);
}

async fn increment_creates_at_one_and_reads_back_as_decimal<H: Harness>(h: &H) {
    let c = h.cache().await;
    assert_eq!(c.increment("n", None).await.unwrap(), 1);
    assert_eq!(c.increment("n", None).await.unwrap(), 2);
    assert_eq!(c.get("n").await.unwrap().as_deref(), Some("2"));
    c.set("m", "41", None).await.unwrap();
    assert_eq!(c.increment("m", None).await.unwrap(), 42);
}

async fn increment_applies_ttl_on_creation_only<H: Harness>(h: &H) {
    let c = h.cache().await;
    let ttl = h.short_ttl();
    c.increment("n", Some(ttl)).await.unwrap();
    h.advance(ttl.mul_f64(0.6)).await;
    assert_eq!(c.increment("n", Some(ttl)).await.unwrap(), 2);
    h.advance(ttl.mul_f64(0.6)).await;
    assert_eq!(
        c.get("n").await.unwrap(),
        None,
        "the second increment must not refresh the TTL set at creation"
    );
}

async fn increment_after_expiry_starts_again_at_one<H: Harness>(h: &H) {
    let c = h.cache().await;
    c.increment("n", Some(h.short_ttl())).await.unwrap();
    c.increment("n", Some(h.short_ttl())).await.unwrap();
    h.advance(h.short_ttl().mul_f64(1.5)).await;
    assert_eq!(c.increment("n", Some(h.short_ttl())).await.unwrap(), 1);
}

async fn increment_of_a_non_integer_is_an_error<H: Harness>(h: &H) {
    let c = h.cache().await;
    c.set("k", "not a number", None).await.unwrap();
    match c.increment("k", None).await {
        Err(CacheError::NotAnInteger { key }) => assert_eq!(key, "k"),
        other => panic!("expected NotAnInteger, got {other:?}"),
    }
    assert_eq!(
        c.get("k").await.unwrap().as_deref(),
        Some("not a number"),
        "a failed increment changes nothing"
    );
}

async fn delete_removes_a_value_and_deleting_nothing_is_fine<H: Harness>(h: &H) {
    let c = h.cache().await;
    c.set("k", "v", None).await.unwrap();
    c.delete("k").await.unwrap();
    assert_eq!(c.get("k").await.unwrap(), None);
    c.delete("never-there").await.unwrap();
}

async fn delete_clears_the_keys_window_too<H: Harness>(h: &H) {
    let c = h.cache().await;
    let now = h.now();
    c.record_hit("w", now, secs(60)).await.unwrap();
    c.delete("w").await.unwrap();
    assert_eq!(c.count_since("w", now.saturating_sub(secs(60))).await.unwrap(), 0);
}

async fn a_value_and_a_window_may_share_a_key<H: Harness>(h: &H) {
    let c = h.cache().await;
    let now = h.now();
    c.set("both", "v", None).await.unwrap();
    c.record_hit("both", now, secs(60)).await.unwrap();
    assert_eq!(c.get("both").await.unwrap().as_deref(), Some("v"));
    assert_eq!(c.count_since("both", now).await.unwrap(), 1);
}

async fn count_since_is_inclusive<H: Harness>(h: &H) {
    let c = h.cache().await;
    let t = h.now();
    let t1 = t.saturating_add(secs(1));
    c.record_hit("w", t, secs(60)).await.unwrap();
    c.record_hit("w", t1, secs(60)).await.unwrap();
    assert_eq!(
        c.count_since("w", t).await.unwrap(),
        2,
        "a hit exactly at `since` counts"
    );
    assert_eq!(c.count_since("w", t1).await.unwrap(), 1);
    assert_eq!(
        c.count_since("w", t1.saturating_add(Duration::from_micros(1)))
            .await
            .unwrap(),
        0
    );
}

async fn two_hits_at_one_instant_are_two_hits<H: Harness>(h: &H) {
    let c = h.cache().await;
    let t = h.now();
    c.record_hit("w", t, secs(60)).await.unwrap();
    c.record_hit("w", t, secs(60)).await.unwrap();
    c.record_hit("w", t, secs(60)).await.unwrap();
    assert_eq!(c.count_since("w", t).await.unwrap(), 3);
}

async fn oldest_since_is_the_earliest_hit_at_or_after<H: Harness>(h: &H) {
    let c = h.cache().await;
    let t = h.now();
    assert_eq!(c.oldest_since("w", t).await.unwrap(), None);
    for s in [0, 2, 4] {
        c.record_hit("w", t.saturating_add(secs(s)), secs(60)).await.unwrap();
    }
    assert_eq!(c.oldest_since("w", t).await.unwrap(), Some(t));
    assert_eq!(
        c.oldest_since("w", t.saturating_add(secs(1))).await.unwrap(),
        Some(t.saturating_add(secs(2)))
    );
    assert_eq!(
        c.oldest_since("w", t.saturating_add(secs(2))).await.unwrap(),
        Some(t.saturating_add(secs(2)))
    );
    assert_eq!(c.oldest_since("w", t.saturating_add(secs(5))).await.unwrap(), None);
}

async fn hits_out_of_order_are_counted_by_instant<H: Harness>(h: &H) {
    let c = h.cache().await;
    let t = h.now();
    c.record_hit("w", t.saturating_add(secs(5)), secs(60)).await.unwrap();
    c.record_hit("w", t, secs(60)).await.unwrap();
    assert_eq!(c.count_since("w", t.saturating_add(secs(1))).await.unwrap(), 1);
    assert_eq!(c.oldest_since("w", t).await.unwrap(), Some(t));
}

async fn a_window_expires_ttl_after_its_last_hit<H: Harness>(h: &H) {
    let c = h.cache().await;
    let ttl = h.short_ttl();
    let t = h.now();
    c.record_hit("w", t, ttl).await.unwrap();
    h.advance(ttl.mul_f64(0.6)).await;
    c.record_hit("w", h.now(), ttl).await.unwrap();
    h.advance(ttl.mul_f64(0.6)).await;
    assert_eq!(
        c.count_since("w", t).await.unwrap(),
        2,
        "the second hit extends the series' life"
    );
    h.advance(ttl.mul_f64(0.6)).await;
    assert_eq!(c.count_since("w", t).await.unwrap(), 0, "an idle series expires");
}

async fn hits_older_than_ttl_before_the_caches_clock_are_discarded<H: Harness>(h: &H) {
    let c = h.cache().await;
    let t = h.now();
    c.record_hit("w", t.saturating_sub(secs(11)), secs(10)).await.unwrap();
    c.record_hit("w", t.saturating_sub(secs(9)), secs(10)).await.unwrap();
    assert_eq!(
        c.count_since("w", t.saturating_sub(secs(60))).await.unwrap(),
        1,
        "a hit more than ttl older than the cache's clock is gone, one within it kept"
    );
}

async fn a_first_hit_older_than_ttl_is_never_held<H: Harness>(h: &H) {
    let c = h.cache().await;
    let t = h.now();
    c.record_hit("w", t.saturating_sub(secs(11)), secs(10)).await.unwrap();
    assert_eq!(
        c.count_since("w", t.saturating_sub(secs(60))).await.unwrap(),
        0,
        "a series' first hit is pruned as every later one is"
    );
}

async fn a_far_future_hit_prunes_nobody_elses<H: Harness>(h: &H) {
    let c = h.cache().await;
    let t = h.now();
    c.record_hit("w", t, secs(10)).await.unwrap();
    c.record_hit("w", t.saturating_add(secs(3600)), secs(10)).await.unwrap();
    assert_eq!(
        c.count_since("w", t).await.unwrap(),
        2,
        "pruning runs on the cache's clock, not on the newest stamp"
    );
}

async fn acquire_slot_clamps_a_caller_far_ahead_and_keeps_everyones_hits<H: Harness>(h: &H) {
    let c = h.cache().await;
    let t = h.now();
    let near = SlotRequest {
        max_ahead: secs(1),
        ..request(t, 3)
    };
    assert!(!c.acquire_slot("t", near).await.unwrap().clamped());
    let far = SlotRequest {
        now: t.saturating_add(secs(3600)),
        ..near
    };
    let outcome = c.acquire_slot("t", far).await.unwrap();
    assert!(outcome.clamped(), "an hour ahead is clamped: {outcome:?}");
    assert!(
        outcome.at() <= t.saturating_add(secs(2)),
        "to at most max_ahead past the cache's clock: {outcome:?}"
    );
    assert!(matches!(
        c.acquire_slot("t", near).await.unwrap(),
        SlotOutcome::Admitted { remaining: 0, .. }
    ));
    assert!(
        matches!(
            c.acquire_slot("t", near).await.unwrap(),
            SlotOutcome::Refused { used: 3, .. }
        ),
        "the fast caller's hit neither pruned the others nor escaped the count"
    );
}

/// A request for a 60 s window whose caller may run up to 120 s ahead of the
/// store unclamped: the checks judge at instants ahead of a real server's
/// clock without waiting for it.
fn request(now: Timestamp, limit: u32) -> SlotRequest {
    SlotRequest {
        now,
        window: secs(60),
        limit,
        ttl: secs(241),
        max_ahead: secs(120),
    }
}

async fn acquire_slot_admits_to_the_limit_then_refuses_with_the_exact_wait<H: Harness>(h: &H) {
    let c = h.cache().await;
    let t = h.now();
    for (i, remaining) in [2u32, 1, 0].into_iter().enumerate() {
        let at = t.saturating_add(secs(i as u64 * 10));
        assert_eq!(
            c.acquire_slot("t", request(at, 3)).await.unwrap(),
            SlotOutcome::Admitted {
                remaining,
                at,
                clamped: false
            }
        );
    }
    let now = t.saturating_add(secs(25));
    assert_eq!(
        c.acquire_slot("t", request(now, 3)).await.unwrap(),
        SlotOutcome::Refused {
            used: 3,
            retry_after: secs(35) + Duration::from_micros(1),
            at: now,
            clamped: false
        }
    );
}

async fn acquire_slot_refusals_record_nothing<H: Harness>(h: &H) {
    let c = h.cache().await;
    let t = h.now();
    c.acquire_slot("t", request(t, 1)).await.unwrap();
    for s in 1..5 {
        let outcome = c
            .acquire_slot("t", request(t.saturating_add(secs(s)), 1))
            .await
            .unwrap();
        assert!(matches!(outcome, SlotOutcome::Refused { used: 1, .. }));
    }
    assert_eq!(c.count_since("t", t).await.unwrap(), 1);
}

async fn acquire_slot_frees_slots_one_at_a_time<H: Harness>(h: &H) {
    let c = h.cache().await;
    let t = h.now();
    c.acquire_slot("t", request(t, 2)).await.unwrap();
    c.acquire_slot("t", request(t.saturating_add(secs(30)), 2))
        .await
        .unwrap();
    let at_60 = c
        .acquire_slot("t", request(t.saturating_add(secs(60)), 2))
        .await
        .unwrap();
    assert!(
        matches!(at_60, SlotOutcome::Refused { .. }),
        "a hit exactly one window old is still inside the inclusive window"
    );
    let later = t.saturating_add(secs(60)).saturating_add(Duration::from_micros(1));
    assert!(matches!(
        c.acquire_slot("t", request(later, 2)).await.unwrap(),
        SlotOutcome::Admitted { remaining: 0, .. }
    ));
}

async fn racing_acquire_slot_admits_exactly_the_limit<H: Harness>(h: &H) {
    let c = h.cache().await;
    let now = h.now();
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { c.acquire_slot("race", request(now, 10)).await })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        if let SlotOutcome::Admitted { .. } = task.await.expect("task panicked").unwrap() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 10);
    assert_eq!(c.count_since("race", now).await.unwrap(), 10);
}

/// A window holding more hits than a caller's limit (a low class's share,
/// [`crate::Priority::Low`]) frees a slot for it only when the hit at
/// [`freeing_rank`](crate::decide::window::freeing_rank) ages out — not the
/// oldest — in the slot step and in the slot-and-tokens step alike.
async fn acquire_slot_under_a_lower_limit_waits_for_the_hit_that_leaves_room<H: Harness>(h: &H) {
    let c = h.cache().await;
    let t = h.now();
    for i in 0..5u64 {
        let admitted = c
            .acquire_slot("shared", request(t.saturating_add(secs(i * 10)), 5))
            .await
            .unwrap();
        assert!(matches!(admitted, SlotOutcome::Admitted { .. }));
    }
    let now = t.saturating_add(secs(45));
    let wait = |outcome: SlotOutcome| match outcome {
        SlotOutcome::Refused {
            used: 5, retry_after, ..
        } => retry_after,
        other => panic!("expected a refusal with 5 hits used, got {other:?}"),
    };
    let tick = Duration::from_micros(1);
    // Under the whole limit the oldest (t) frees a slot at t + 60 s.
    assert_eq!(
        wait(c.acquire_slot("shared", request(now, 5)).await.unwrap()),
        secs(15) + tick
    );
    // Under a limit of 3, three hits must go: the third oldest (t + 20 s).
    assert_eq!(
        wait(c.acquire_slot("shared", request(now, 3)).await.unwrap()),
        secs(35) + tick
    );
    let with_tokens = c
        .acquire_with_tokens("shared", request(now, 3), token_ask(1, 1_000, secs(60)))
        .await
        .unwrap();
    assert!(
        matches!(
            with_tokens,
            TokenOutcome::Refused {
                by: RefusedBy::Requests,
                retry_after,
                ..
            } if retry_after == secs(35) + tick
        ),
        "{with_tokens:?}"
    );
    // Sleeping that wait is enough: the low caller is admitted.
    let later = now.saturating_add(secs(35) + tick);
    assert!(matches!(
        c.acquire_slot("shared", request(later, 3)).await.unwrap(),
        SlotOutcome::Admitted { remaining: 0, .. }
    ));
}

/// Callers with the whole limit (10) and callers with a lower one (7, a low
/// class under a reserve of 3) racing on one key: exactly the limit is
/// admitted, the lower callers take at most their 7, so the higher ones get
/// at least the 3 reserved.
async fn racing_acquire_slot_keeps_the_reserve_for_the_higher_limit<H: Harness>(h: &H) {
    let c = h.cache().await;
    let now = h.now();
    let tasks: Vec<_> = (0..60)
        .map(|i| {
            let c = c.clone();
            let limit = if i % 2 == 0 { 7 } else { 10 };
            tokio::spawn(async move { (limit, c.acquire_slot("classes", request(now, limit)).await) })
        })
        .collect();
    let (mut low, mut high) = (0, 0);
    for task in tasks {
        let (limit, outcome) = task.await.expect("task panicked");
        if let SlotOutcome::Admitted { .. } = outcome.unwrap() {
            if limit == 7 { low += 1 } else { high += 1 }
        }
    }
    assert_eq!(low + high, 10, "{low} low and {high} high admitted");
    assert!(low <= 7 && high >= 3, "{low} low and {high} high admitted");
}

fn params(threshold: u32, timeout: Duration, probes: u32) -> BreakerParams {
    BreakerParams {
        failure_threshold: threshold,
        recovery_timeout: timeout,
        max_recovery_timeout: timeout,
        half_open_max_calls: probes,
        probe_lease: timeout,
    }
}

const FAILURE: BreakerCommand = BreakerCommand::RecordFailure(Origin::Untracked);
const SUCCESS: BreakerCommand = BreakerCommand::RecordSuccess(Origin::Untracked);

fn probe(step: &BreakerStep) -> ProbeId {
    match step.permit {
        Some(Permit::Probe(id)) => id,
        other => panic!("expected a probe, got {other:?}"),
    }
}

async fn breaker_step_opens_at_the_threshold_and_stores_readable_keys<H: Harness>(h: &H) {
    let c = h.cache().await;
    let keys = BreakerKeys::new("compliance");
    let p = params(3, secs(60), 1);
    let now = h.now();
    for _ in 0..2 {
        let s = c.breaker_step(&keys, FAILURE, p, now).await.unwrap();
        assert_eq!(s.after, CircuitState::Closed);
    }
    assert_eq!(c.get(&keys.failures).await.unwrap().as_deref(), Some("2"));
    let s = c.breaker_step(&keys, FAILURE, p, now).await.unwrap();
    assert_eq!((s.before, s.after), (CircuitState::Closed, CircuitState::Open));
    assert_eq!(c.get(&keys.state).await.unwrap().as_deref(), Some("open"));
    let opened = c.get(&keys.opened_at).await.unwrap().expect("opened_at stored");
    assert_eq!(Timestamp::parse_secs(&opened), Some(now));
    assert!(
        !c.breaker_step(&keys, BreakerCommand::Allow, p, now.saturating_add(secs(59)))
            .await
            .unwrap()
            .allowed()
    );
}

async fn breaker_failures_decay_from_the_first_without_refresh<H: Harness>(h: &H) {
    let c = h.cache().await;
    let keys = BreakerKeys::new("compliance");
    let ttl = h.short_ttl();
    let p = params(3, ttl, 1);
    c.breaker_step(&keys, FAILURE, p, h.now()).await.unwrap();
    h.advance(ttl.mul_f64(0.6)).await;
    c.breaker_step(&keys, FAILURE, p, h.now()).await.unwrap();
    h.advance(ttl.mul_f64(0.6)).await;
    // The count expired recovery_timeout after the first failure, so this is
    // failure one of a new window, not the third.
    let s = c.breaker_step(&keys, FAILURE, p, h.now()).await.unwrap();
    assert_eq!(s.after, CircuitState::Closed);
    assert_eq!(c.get(&keys.failures).await.unwrap().as_deref(), Some("1"));
}

async fn open_circuit<C: BreakerStore>(c: &C, keys: &BreakerKeys, p: BreakerParams, at: Timestamp) {
    for _ in 0..p.failure_threshold {
        c.breaker_step(keys, FAILURE, p, at).await.unwrap();
    }
}

async fn breaker_half_open_admits_exactly_the_probe_limit<H: Harness>(h: &H) {
    let c = h.cache().await;
    let keys = BreakerKeys::new("compliance");
    let p = params(1, secs(30), 2);
    let t = h.now();
    open_circuit(&*c, &keys, p, t).await;
    let due = t.saturating_add(secs(30));
    let first = c.breaker_step(&keys, BreakerCommand::Allow, p, due).await.unwrap();
    assert!(first.allowed());
    assert_eq!(
        (first.before, first.after),
        (CircuitState::Open, CircuitState::HalfOpen)
    );
    assert!(
        c.breaker_step(&keys, BreakerCommand::Allow, p, due)
            .await
            .unwrap()
            .allowed()
    );
    assert!(
        !c.breaker_step(&keys, BreakerCommand::Allow, p, due)
            .await
            .unwrap()
            .allowed(),
        "half_open_max_calls = 2 holds two live probes, the transitioning call included"
    );
    let reopened = c.breaker_step(&keys, FAILURE, p, due).await.unwrap();
    assert_eq!(reopened.after, CircuitState::Open);
    let opened = c
        .get(&keys.opened_at)
        .await
        .unwrap()
        .and_then(|s| Timestamp::parse_secs(&s));
    assert_eq!(opened, Some(due), "a failed probe restarts the timeout");
}

async fn racing_breaker_probes_admit_exactly_the_limit<H: Harness>(h: &H) {
    let c = h.cache().await;
    let keys = Arc::new(BreakerKeys::new("compliance-race"));
    let p = params(1, secs(10), 3);
    let t = h.now();
    open_circuit(&*c, &keys, p, t).await;
    let due = t.saturating_add(secs(10));
    let tasks: Vec<_> = (0..40)
        .map(|_| {
            let (c, keys) = (c.clone(), keys.clone());
            tokio::spawn(async move { c.breaker_step(&keys, BreakerCommand::Allow, p, due).await })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        if task.await.expect("task panicked").unwrap().allowed() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 3);
}

async fn breaker_success_from_half_open_clears_everything<H: Harness>(h: &H) {
    let c = h.cache().await;
    let keys = BreakerKeys::new("compliance");
    let p = params(1, secs(10), 1);
    let t = h.now();
    open_circuit(&*c, &keys, p, t).await;
    let due = t.saturating_add(secs(10));
    c.breaker_step(&keys, BreakerCommand::Allow, p, due).await.unwrap();
    let s = c.breaker_step(&keys, SUCCESS, p, due).await.unwrap();
    assert_eq!((s.before, s.after), (CircuitState::HalfOpen, CircuitState::Closed));
    for key in [&keys.state, &keys.failures, &keys.opened_at, &keys.probes] {
        let stored = c.get(key).await.unwrap();
        assert!(
            stored.is_none() || stored.as_deref() == Some("closed"),
            "{key} left as {stored:?}"
        );
    }
}

async fn breaker_unreadable_state_reads_as_closed<H: Harness>(h: &H) {
    let c = h.cache().await;
    let keys = BreakerKeys::new("compliance");
    c.set(&keys.state, "garbage", None).await.unwrap();
    let s = c
        .breaker_step(&keys, BreakerCommand::Allow, params(5, secs(60), 1), h.now())
        .await
        .unwrap();
    assert!(s.allowed());
    assert_eq!(s.before, CircuitState::Closed);
    assert_eq!(s.unreadable.as_deref(), Some("garbage"));
}

async fn breaker_a_large_unreadable_state_is_reported_by_excerpt<H: Harness>(h: &H) {
    let c = h.cache().await;
    let keys = BreakerKeys::new("compliance");
    // Large enough that carrying it whole would matter, small enough for any
    // adapter's request line (the simulator's cache host takes up to 1 MiB).
    let big = "y".repeat(64 * 1024);
    c.set(&keys.state, &big, None).await.unwrap();
    let s = c
        .breaker_step(&keys, BreakerCommand::Allow, params(5, secs(60), 1), h.now())
        .await
        .unwrap();
    assert!(s.allowed());
    assert_eq!(s.unreadable, Some(crate::decide::breaker::excerpt(&big)));
    let shown = s.unreadable.unwrap_or_default();
    assert!(shown.len() < 128, "the report carried {} bytes", shown.len());
    assert!(shown.contains("65536 bytes"), "{shown}");
    c.delete(&keys.state).await.unwrap();
}

async fn breaker_read_changes_nothing<H: Harness>(h: &H) {
    let c = h.cache().await;
    let keys = BreakerKeys::new("compliance");
    let p = params(1, secs(10), 1);
    let t = h.now();
    open_circuit(&*c, &keys, p, t).await;
    let due = t.saturating_add(secs(20));
    for _ in 0..3 {
        let (snapshot, at) = c.breaker_read(&keys, due).await.unwrap();
        assert_eq!(
            snapshot.effective_state(),
            CircuitState::Open,
            "reading never moves open to half-open"
        );
        assert_eq!(at, due);
    }
    assert!(
        c.breaker_step(&keys, BreakerCommand::Allow, p, due)
            .await
            .unwrap()
            .allowed()
    );
}

async fn breaker_probe_leases_expire_and_late_reports_change_nothing<H: Harness>(h: &H) {
    let c = h.cache().await;
    let keys = BreakerKeys::new("compliance-lease");
    let p = BreakerParams {
        probe_lease: secs(5),
        ..params(1, secs(10), 1)
    };
    let t = h.now();
    open_circuit(&*c, &keys, p, t).await;
    let due = t.saturating_add(secs(10));
    let first = probe(&c.breaker_step(&keys, BreakerCommand::Allow, p, due).await.unwrap());
    let refused = c
        .breaker_step(&keys, BreakerCommand::Allow, p, due.saturating_add(secs(2)))
        .await
        .unwrap();
    assert_eq!(
        refused.permit,
        Some(Permit::Refused {
            state: CircuitState::HalfOpen,
            retry_after: secs(3),
            reason: Refusal::Circuit,
        }),
        "refused while the lease is live, with when it ends"
    );
    let later = due.saturating_add(secs(5));
    let fresh = c.breaker_step(&keys, BreakerCommand::Allow, p, later).await.unwrap();
    assert_eq!(fresh.expired_probes, 1);
    let second = probe(&fresh);
    assert_eq!((second.episode, second.seq), (first.episode, 2));
    let late = c
        .breaker_step(&keys, BreakerCommand::RecordFailure(Origin::Probe(first)), p, later)
        .await
        .unwrap();
    assert!(late.writes.is_empty(), "a late probe's report changes nothing");
    assert_eq!(late.after, CircuitState::HalfOpen);
    let closed = c
        .breaker_step(&keys, BreakerCommand::RecordSuccess(Origin::Probe(second)), p, later)
        .await
        .unwrap();
    assert_eq!(closed.after, CircuitState::Closed);
}

/// Escalation: each failed probe re-opens for twice as long, up to the cap;
/// the count is stored and readable; a close starts again at the base.
async fn breaker_failed_probes_escalate_the_open_period_until_a_close<H: Harness>(h: &H) {
    let c = h.cache().await;
    let keys = BreakerKeys::new("compliance-escalation");
    let p = BreakerParams {
        max_recovery_timeout: secs(50),
        ..params(1, secs(10), 1)
    };
    let mut at = h.now();
    open_circuit(&*c, &keys, p, at).await;
    for (n, period) in [(1, 10), (2, 20), (3, 40), (4, 50)] {
        assert_eq!(
            c.get(&keys.openings).await.unwrap().as_deref(),
            Some(n.to_string().as_str()),
            "opening {n} is counted"
        );
        let early = c
            .breaker_step(&keys, BreakerCommand::Allow, p, at.saturating_add(secs(period - 1)))
            .await
            .unwrap();
        assert_eq!(
            early.permit,
            Some(Permit::Refused {
                state: CircuitState::Open,
                retry_after: secs(1),
                reason: Refusal::Circuit,
            }),
            "opening {n} lasts {period} s"
        );
        at = at.saturating_add(secs(period));
        let id = probe(&c.breaker_step(&keys, BreakerCommand::Allow, p, at).await.unwrap());
        let failed = c
            .breaker_step(&keys, BreakerCommand::RecordFailure(Origin::Probe(id)), p, at)
            .await
            .unwrap();
        assert_eq!(failed.after, CircuitState::Open);
    }
    // The fifth opening is capped at 50 s too; a probe then succeeds.
    at = at.saturating_add(secs(50));
    let id = probe(&c.breaker_step(&keys, BreakerCommand::Allow, p, at).await.unwrap());
    let closed = c
        .breaker_step(&keys, BreakerCommand::RecordSuccess(Origin::Probe(id)), p, at)
        .await
        .unwrap();
    assert_eq!(closed.after, CircuitState::Closed);
    assert_eq!(c.get(&keys.openings).await.unwrap(), None, "a close clears the count");
    c.breaker_step(&keys, FAILURE, p, at).await.unwrap();
    let (snapshot, _) = c.breaker_read(&keys, at).await.unwrap();
    assert_eq!(snapshot.openings, Some(1));
    let step = c
        .breaker_step(&keys, BreakerCommand::Allow, p, at.saturating_add(secs(10)))
        .await
        .unwrap();
    assert!(step.allowed(), "the first opening after a close lasts the base period");
}

/// Eight probes of one episode fail at once: the first report re-opens the
/// circuit and counts one opening; the others arrive at an open circuit and
/// change nothing, so the period doubles once, not eight times.
async fn racing_failed_probes_escalate_once_per_episode<H: Harness>(h: &H) {
    let c = h.cache().await;
    let keys = Arc::new(BreakerKeys::new("compliance-escalation-race"));
    let p = BreakerParams {
        max_recovery_timeout: secs(10_000),
        ..params(1, secs(10), 8)
    };
    let t = h.now();
    open_circuit(&*c, &keys, p, t).await;
    let due = t.saturating_add(secs(10));
    let mut probes = Vec::new();
    for _ in 0..8 {
        probes.push(probe(
            &c.breaker_step(&keys, BreakerCommand::Allow, p, due).await.unwrap(),
        ));
    }
    let tasks: Vec<_> = probes
        .into_iter()
        .map(|id| {
            let (c, keys) = (c.clone(), keys.clone());
            let fail = BreakerCommand::RecordFailure(Origin::Probe(id));
            tokio::spawn(async move { c.breaker_step(&keys, fail, p, due).await })
        })
        .collect();
    let mut reopened = 0;
    for task in tasks {
        if task.await.expect("task panicked").unwrap().before == CircuitState::HalfOpen {
            reopened += 1;
        }
    }
    assert_eq!(reopened, 1, "one report decides the episode");
    let (snapshot, _) = c.breaker_read(&keys, due).await.unwrap();
    assert_eq!(snapshot.openings, Some(2));
    assert_eq!(
        crate::decide::breaker::retry_after(&snapshot, &p, due),
        secs(20),
        "the second opening lasts twice the first, once"
    );
}

/// Slow start's instant: eight probes of one episode succeed at once, each
/// at its own instant; one report closes the circuit and stores its
/// instant, the others find it closed and write nothing. Every closed
/// admission after hands back that instant; an opening keeps it, a reset
/// clears it.
async fn racing_probes_close_once_at_one_stored_instant<H: Harness>(h: &H) {
    let c = h.cache().await;
    let keys = Arc::new(BreakerKeys::new("compliance-closed-at"));
    let p = params(1, secs(10), 8);
    let t = h.now();
    open_circuit(&*c, &keys, p, t).await;
    let due = t.saturating_add(secs(10));
    let mut probes = Vec::new();
    for _ in 0..8 {
        probes.push(probe(
            &c.breaker_step(&keys, BreakerCommand::Allow, p, due).await.unwrap(),
        ));
    }
    let tasks: Vec<_> = (0u64..)
        .zip(probes)
        .map(|(n, id)| {
            let (c, keys) = (c.clone(), keys.clone());
            let at = due.saturating_add(Duration::from_millis(n));
            let succeed = BreakerCommand::RecordSuccess(Origin::Probe(id));
            tokio::spawn(async move { c.breaker_step(&keys, succeed, p, at).await })
        })
        .collect();
    let mut closes = Vec::new();
    for task in tasks {
        let step = task.await.expect("task panicked").unwrap();
        if step.before == CircuitState::HalfOpen {
            closes.push(step.at);
        } else {
            assert!(step.writes.is_empty(), "a report after the close writes nothing");
        }
    }
    assert_eq!(closes.len(), 1, "one report decides the episode");
    let closed_at = closes[0];
    let later = due.saturating_add(secs(5));
    let (snapshot, _) = c.breaker_read(&keys, later).await.unwrap();
    assert_eq!(snapshot.closed_at, Some(closed_at));
    let admitted = c.breaker_step(&keys, BreakerCommand::Allow, p, later).await.unwrap();
    assert_eq!(
        (admitted.permit, admitted.closed_at),
        (Some(Permit::Call), Some(closed_at)),
        "a closed admission carries the close"
    );
    c.breaker_step(&keys, FAILURE, p, later).await.unwrap();
    let (snapshot, _) = c.breaker_read(&keys, later).await.unwrap();
    assert_eq!(
        (snapshot.effective_state(), snapshot.closed_at),
        (CircuitState::Open, Some(closed_at)),
        "an opening keeps the last close"
    );
    c.breaker_step(&keys, BreakerCommand::Reset, p, later).await.unwrap();
    assert_eq!(c.get(&keys.closed_at).await.unwrap(), None, "a reset clears it");
}

async fn breaker_release_frees_exactly_its_own_probe<H: Harness>(h: &H) {
    let c = h.cache().await;
    let keys = BreakerKeys::new("compliance-release");
    let p = params(1, secs(10), 2);
    let t = h.now();
    open_circuit(&*c, &keys, p, t).await;
    let due = t.saturating_add(secs(10));
    let first = probe(&c.breaker_step(&keys, BreakerCommand::Allow, p, due).await.unwrap());
    let second = probe(&c.breaker_step(&keys, BreakerCommand::Allow, p, due).await.unwrap());
    assert!(
        !c.breaker_step(&keys, BreakerCommand::Allow, p, due)
            .await
            .unwrap()
            .allowed()
    );
    c.breaker_step(&keys, BreakerCommand::Release(first), p, due)
        .await
        .unwrap();
    let (snapshot, _) = c.breaker_read(&keys, due).await.unwrap();
    let live: Vec<u32> = snapshot
        .probes
        .iter()
        .flat_map(|l| l.live.iter().map(|l| l.seq))
        .collect();
    assert_eq!(live, [second.seq], "the other probe's lease is untouched");
    let third = probe(&c.breaker_step(&keys, BreakerCommand::Allow, p, due).await.unwrap());
    assert_eq!(third.seq, 3);
}

fn budget(deposit_retries: f64, refill_per_sec: u32, max_balance: u64, ttl: Duration) -> BudgetParams {
    BudgetParams {
        deposit: (deposit_retries * MICROS_PER_RETRY as f64) as u64,
        refill_per_sec,
        max_balance: max_balance * MICROS_PER_RETRY,
        ttl,
        max_ahead: Duration::from_secs(3600),
    }
}

async fn budget_deposits_earn_retries_and_an_empty_bucket_denies<H: Harness>(h: &H) {
    let c = h.cache().await;
    let p = budget(0.5, 0, 10, secs(60));
    let now = h.now();
    let step = |command| c.budget_step("budget", command, p, now);
    assert!(!step(BudgetCommand::Withdraw).await.unwrap().granted, "an empty bucket");
    assert!(step(BudgetCommand::Deposit).await.unwrap().granted);
    assert!(!step(BudgetCommand::Withdraw).await.unwrap().granted, "half a retry");
    let second = step(BudgetCommand::Deposit).await.unwrap();
    assert_eq!(second.state.balance, MICROS_PER_RETRY);
    let taken = step(BudgetCommand::Withdraw).await.unwrap();
    assert!(taken.granted);
    assert_eq!(taken.state.balance, 0);
    assert_eq!(taken.at, now, "a caller-stamped step is judged at the caller's now");
    let stored = c.get("budget").await.unwrap().expect("the bucket is stored");
    assert_eq!(BudgetState::decode(&stored), Some(taken.state));
}

async fn budget_floor_refills_on_the_callers_clock_up_to_the_cap<H: Harness>(h: &H) {
    let c = h.cache().await;
    let p = budget(0.0, 2, 3, secs(60));
    let t0 = h.now();
    let at = |us: u64| t0.saturating_add(Duration::from_micros(us));
    let withdraw = |t| c.budget_step("floor", BudgetCommand::Withdraw, p, t);
    assert!(!withdraw(at(0)).await.unwrap().granted);
    // Two retries a second: one takes 500 000 µs to earn, exactly.
    assert!(!withdraw(at(499_999)).await.unwrap().granted);
    assert!(withdraw(at(500_000)).await.unwrap().granted);
    // Ten seconds later the bucket holds its cap, three.
    let later = at(10_500_000);
    for n in 0..3 {
        assert!(withdraw(later).await.unwrap().granted, "retry {n} of the cap");
    }
    assert!(!withdraw(later).await.unwrap().granted, "beyond the cap");
    // A caller whose clock is behind the bucket's stamp refills nothing.
    let behind = withdraw(at(1)).await.unwrap();
    assert!(!behind.granted, "a clock behind the bucket's stamp refills nothing");
    assert_eq!(behind.state.stamp, later, "and leaves the stamp where it was");
}

async fn budget_clamps_a_caller_far_ahead<H: Harness>(h: &H) {
    let c = h.cache().await;
    let p = BudgetParams {
        max_ahead: Duration::from_secs(1),
        ..budget(0.0, 1, 1000, secs(60))
    };
    let now = h.now();
    c.budget_step("ahead", BudgetCommand::Deposit, p, now).await.unwrap();
    let far = now.saturating_add(secs(3600));
    let step = c.budget_step("ahead", BudgetCommand::Withdraw, p, far).await.unwrap();
    assert!(
        step.at < far,
        "a caller an hour ahead is clamped, judged at {}",
        step.at
    );
    assert!(
        step.state.balance < 30 * MICROS_PER_RETRY,
        "an hour ahead refilled only about a second: {}",
        step.state.balance
    );
}

async fn budget_a_foreign_value_reads_as_empty_and_is_replaced<H: Harness>(h: &H) {
    let c = h.cache().await;
    let p = budget(1.0, 0, 10, secs(60));
    for foreign in ["999:1:2", "lots", "9007199254740993:1", ""] {
        c.set("foreign", foreign, None).await.unwrap();
        let step = c
            .budget_step("foreign", BudgetCommand::Withdraw, p, h.now())
            .await
            .unwrap();
        assert!(step.healed, "{foreign:?} is no bucket");
        assert!(!step.granted, "{foreign:?} reads as an empty bucket");
        let stored = c.get("foreign").await.unwrap().expect("replaced");
        assert_eq!(BudgetState::decode(&stored), Some(step.state));
    }
    let step = c
        .budget_step("foreign", BudgetCommand::Deposit, p, h.now())
        .await
        .unwrap();
    assert!(!step.healed, "its own bucket is sound");
}

async fn budget_an_expired_bucket_restarts_empty<H: Harness>(h: &H) {
    let c = h.cache().await;
    let p = budget(2.0, 0, 10, h.short_ttl());
    let now = h.now();
    c.budget_step("ttl", BudgetCommand::Deposit, p, now).await.unwrap();
    h.advance(h.short_ttl().mul_f64(1.5)).await;
    assert_eq!(c.get("ttl").await.unwrap(), None, "the bucket lives its TTL");
    let step = c.budget_step("ttl", BudgetCommand::Withdraw, p, h.now()).await.unwrap();
    assert!(!step.granted, "an expired bucket is empty");
}

async fn racing_budget_withdrawals_grant_exactly_the_balance<H: Harness>(h: &H) {
    let c = h.cache().await;
    let p = budget(1.0, 0, 100, secs(60));
    let now = h.now();
    for _ in 0..7 {
        c.budget_step("race", BudgetCommand::Deposit, p, now).await.unwrap();
    }
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { c.budget_step("race", BudgetCommand::Withdraw, p, now).await })
        })
        .collect();
    let mut granted = 0;
    for task in tasks {
        if task.await.expect("task panicked").unwrap().granted {
            granted += 1;
        }
    }
    assert_eq!(granted, 7);
}

fn token_ask(tokens: u64, limit: u64, lease: Duration) -> TokenAsk {
    TokenAsk { tokens, limit, lease }
}

fn reservation(outcome: &TokenOutcome) -> ReservationId {
    match outcome {
        TokenOutcome::Admitted { reservation, .. } => *reservation,
        other => panic!("expected an admission, got {other:?}"),
    }
}

async fn tokens_reserve_to_the_limit_then_refuse_with_the_exact_wait<H: Harness>(h: &H) {
    let c = h.cache().await;
    let t0 = h.now();
    // Leases longer than the window: reservations leave with the window.
    let ask = token_ask(400, 1000, secs(120));
    let first = c.acquire_with_tokens("tok", request(t0, 10), ask).await.unwrap();
    assert!(
        matches!(
            first,
            TokenOutcome::Admitted {
                tokens_used: 0,
                remaining: 9,
                ..
            }
        ),
        "{first:?}"
    );
    assert_eq!(reservation(&first), ReservationId { at: t0, seq: 0 });
    let t1 = t0.saturating_add(secs(10));
    let second = c.acquire_with_tokens("tok", request(t1, 10), ask).await.unwrap();
    assert!(
        matches!(second, TokenOutcome::Admitted { tokens_used: 400, .. }),
        "{second:?}"
    );
    let t2 = t0.saturating_add(secs(20));
    let third = c.acquire_with_tokens("tok", request(t2, 10), ask).await.unwrap();
    // 800 of 1000 used: the first reservation must leave the window (60 s
    // and one µs after it) before 400 more fit.
    assert_eq!(
        third,
        TokenOutcome::Refused {
            by: RefusedBy::Tokens,
            requests_used: 2,
            tokens_used: 800,
            retry_after: secs(40) + Duration::from_micros(1),
            at: t2,
            clamped: false,
        }
    );
    let later = t0.saturating_add(secs(60) + Duration::from_micros(1));
    let fourth = c.acquire_with_tokens("tok", request(later, 10), ask).await.unwrap();
    assert!(
        matches!(fourth, TokenOutcome::Admitted { tokens_used: 400, .. }),
        "{fourth:?}"
    );
}

async fn tokens_settle_refunds_and_charges_and_unknown_reservations_are_reported<H: Harness>(h: &H) {
    let c = h.cache().await;
    let t0 = h.now();
    let ask = token_ask(600, 1000, secs(60));
    let first = reservation(&c.acquire_with_tokens("settle", request(t0, 10), ask).await.unwrap());
    let refused = c.acquire_with_tokens("settle", request(t0, 10), ask).await.unwrap();
    assert!(
        matches!(
            refused,
            TokenOutcome::Refused {
                by: RefusedBy::Tokens,
                ..
            }
        ),
        "{refused:?}"
    );
    // A refund: the call used 100, so 600 more fit.
    assert!(c.settle_tokens("settle", first, 100).await.unwrap());
    let second = c.acquire_with_tokens("settle", request(t0, 10), ask).await.unwrap();
    assert_eq!(
        reservation(&second),
        ReservationId { at: t0, seq: 1 },
        "the second at one stamp"
    );
    // A charge: the first call turned out to use 500, so nothing more fits.
    assert!(c.settle_tokens("settle", first, 500).await.unwrap());
    let small = token_ask(1, 1000, secs(60));
    let over = c.acquire_with_tokens("settle", request(t0, 10), small).await.unwrap();
    assert!(
        matches!(over, TokenOutcome::Refused { tokens_used: 1100, .. }),
        "settling above the estimate charges it: {over:?}"
    );
    let unknown = ReservationId { at: t0, seq: 7 };
    assert!(!c.settle_tokens("settle", unknown, 1).await.unwrap());
    assert!(!c.settle_tokens("nobody", first, 1).await.unwrap());
}

async fn tokens_an_unsettled_lease_stops_counting_when_it_ends<H: Harness>(h: &H) {
    let c = h.cache().await;
    let t0 = h.now();
    let leased = token_ask(900, 1000, secs(5));
    c.acquire_with_tokens("lease", request(t0, 10), leased).await.unwrap();
    let ask = token_ask(400, 1000, secs(5));
    let early = c
        .acquire_with_tokens("lease", request(t0.saturating_add(secs(1)), 10), ask)
        .await
        .unwrap();
    assert!(
        matches!(early, TokenOutcome::Refused { by: RefusedBy::Tokens, retry_after, .. }
            if retry_after == secs(4) + Duration::from_micros(1)),
        "the lease ends 5 s after the reservation, inclusive: {early:?}"
    );
    let last = c
        .acquire_with_tokens("lease", request(t0.saturating_add(secs(5)), 10), ask)
        .await
        .unwrap();
    assert!(
        matches!(last, TokenOutcome::Refused { .. }),
        "its last µs still counts: {last:?}"
    );
    let after = t0.saturating_add(secs(5) + Duration::from_micros(1));
    let after = c.acquire_with_tokens("lease", request(after, 10), ask).await.unwrap();
    assert!(
        matches!(after, TokenOutcome::Admitted { tokens_used: 0, .. }),
        "{after:?}"
    );
}

async fn tokens_a_refusal_by_either_limit_records_nothing<H: Harness>(h: &H) {
    let c = h.cache().await;
    let t0 = h.now();
    let ask = token_ask(100, 1000, secs(60));
    c.acquire_with_tokens("either", request(t0, 1), ask).await.unwrap();
    let by_requests = c.acquire_with_tokens("either", request(t0, 1), ask).await.unwrap();
    assert!(
        matches!(
            by_requests,
            TokenOutcome::Refused {
                by: RefusedBy::Requests,
                requests_used: 1,
                tokens_used: 100,
                ..
            }
        ),
        "{by_requests:?}"
    );
    let big = token_ask(950, 1000, secs(60));
    let by_tokens = c.acquire_with_tokens("either", request(t0, 5), big).await.unwrap();
    assert!(
        matches!(
            by_tokens,
            TokenOutcome::Refused {
                by: RefusedBy::Tokens,
                ..
            }
        ),
        "{by_tokens:?}"
    );
    let both = c.acquire_with_tokens("either", request(t0, 1), big).await.unwrap();
    assert!(
        matches!(
            both,
            TokenOutcome::Refused {
                by: RefusedBy::Both,
                ..
            }
        ),
        "{both:?}"
    );
    assert_eq!(
        c.count_since("either", t0).await.unwrap(),
        1,
        "one hit, from the one admission"
    );
    let fits = c
        .acquire_with_tokens("either", request(t0, 5), token_ask(900, 1000, secs(60)))
        .await
        .unwrap();
    assert!(
        matches!(fits, TokenOutcome::Admitted { tokens_used: 100, .. }),
        "no refusal reserved anything: {fits:?}"
    );
}

async fn tokens_an_estimate_over_the_limit_never_fits<H: Harness>(h: &H) {
    let c = h.cache().await;
    let outcome = c
        .acquire_with_tokens("large", request(h.now(), 10), token_ask(1001, 1000, secs(60)))
        .await
        .unwrap();
    assert!(
        matches!(
            outcome,
            TokenOutcome::Refused {
                by: RefusedBy::TooLarge,
                ..
            }
        ),
        "{outcome:?}"
    );
}

async fn racing_token_reservations_admit_exactly_what_fits<H: Harness>(h: &H) {
    let c = h.cache().await;
    let now = h.now();
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move {
                c.acquire_with_tokens("race:tokens", request(now, 100), token_ask(100, 1000, secs(60)))
                    .await
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        if let TokenOutcome::Admitted { .. } = task.await.expect("task panicked").unwrap() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 10, "1000 tokens hold ten reservations of 100");
    assert_eq!(c.count_since("race:tokens", now).await.unwrap(), 10, "and ten hits");
}

const ROUTES: [&str; 3] = ["{route}:a", "{route}:b", "{route}:c"];

fn pick_at(now: Timestamp, id: u64) -> PickRequest {
    PickRequest {
        now,
        id,
        lease: secs(10),
        max_ahead: secs(3600),
    }
}

async fn in_flight_picks_the_least_loaded_and_ties_go_to_the_first<H: Harness>(h: &H) {
    let c = h.cache().await;
    let now = h.now();
    let mut picked = Vec::new();
    for id in 0..5 {
        let pick = c
            .pick_least_loaded(&ROUTES, &[1, 1, 1], pick_at(now, id))
            .await
            .unwrap();
        picked.push(pick.index);
        if id == 4 {
            assert_eq!(pick.counts, [2, 1, 1], "the counts before the fifth");
        }
    }
    assert_eq!(picked, [0, 1, 2, 0, 1]);
}

async fn in_flight_picks_by_weight<H: Harness>(h: &H) {
    let c = h.cache().await;
    let now = h.now();
    let mut picked = Vec::new();
    for id in 0..5 {
        picked.push(
            c.pick_least_loaded(&ROUTES[..2], &[1, 3], pick_at(now, id))
                .await
                .unwrap()
                .index,
        );
    }
    // Calls per unit of weight: b takes three for every one on a.
    assert_eq!(picked, [0, 1, 1, 1, 0]);
    let zero = c
        .pick_least_loaded(&ROUTES[..2], &[0, 1], pick_at(now, 9))
        .await
        .unwrap();
    assert_eq!(zero.index, 1, "a zero weight is never picked, however idle");
}

async fn in_flight_leases_end_when_ended_or_run_out<H: Harness>(h: &H) {
    let c = h.cache().await;
    let t0 = h.now();
    let keys = &ROUTES[..2];
    assert_eq!(
        c.pick_least_loaded(keys, &[1, 1], pick_at(t0, 1)).await.unwrap().index,
        0
    );
    c.end_in_flight(ROUTES[0], 1).await.unwrap();
    c.end_in_flight(ROUTES[0], 1).await.unwrap();
    assert_eq!(
        c.pick_least_loaded(keys, &[1, 1], pick_at(t0, 2)).await.unwrap().index,
        0,
        "ended"
    );
    // Lease 2 on a runs out 10 s later, inclusive.
    let last = t0.saturating_add(secs(10));
    let at_last = c.pick_least_loaded(keys, &[1, 1], pick_at(last, 3)).await.unwrap();
    assert_eq!(
        (at_last.index, at_last.counts),
        (1, vec![1, 0]),
        "a lease counts through its end"
    );
    let after = last.saturating_add(Duration::from_micros(1));
    let pick = c.pick_least_loaded(keys, &[1, 1], pick_at(after, 4)).await.unwrap();
    assert_eq!((pick.index, pick.counts), (0, vec![0, 1]), "then it stops counting");
}

async fn in_flight_clamps_a_caller_far_ahead<H: Harness>(h: &H) {
    let c = h.cache().await;
    let now = h.now();
    c.pick_least_loaded(&ROUTES[..2], &[1, 1], pick_at(now, 1))
        .await
        .unwrap();
    let far = PickRequest {
        max_ahead: secs(1),
        ..pick_at(now.saturating_add(secs(3600)), 2)
    };
    let pick = c.pick_least_loaded(&ROUTES[..2], &[1, 1], far).await.unwrap();
    assert_eq!(
        (pick.index, pick.counts),
        (1, vec![1, 0]),
        "a clock an hour ahead ends nobody's lease"
    );
}

async fn in_flight_refuses_a_pick_with_no_candidate<H: Harness>(h: &H) {
    let c = h.cache().await;
    let now = h.now();
    for (keys, weights) in [
        (&ROUTES[..0], &[][..]),
        (&ROUTES[..2], &[0, 0][..]),
        (&ROUTES[..2], &[1][..]),
    ] {
        let e = c.pick_least_loaded(keys, weights, pick_at(now, 1)).await.unwrap_err();
        assert!(
            matches!(
                e,
                CacheError::Protocol {
                    operation: "pick_least_loaded",
                    ..
                }
            ),
            "{keys:?} {weights:?}: {e:?}"
        );
    }
}

async fn racing_in_flight_picks_spread_exactly_evenly<H: Harness>(h: &H) {
    let c = h.cache().await;
    let now = h.now();
    let tasks: Vec<_> = (0..40)
        .map(|id| {
            let c = c.clone();
            tokio::spawn(async move { c.pick_least_loaded(&ROUTES[..2], &[1, 1], pick_at(now, id)).await })
        })
        .collect();
    for task in tasks {
        task.await.expect("task panicked").unwrap();
    }
    let last = c
        .pick_least_loaded(&ROUTES[..2], &[1, 1], pick_at(now, 99))
        .await
        .unwrap();
    assert_eq!(last.counts, [20, 20], "every pick saw every earlier one");
}

fn concurrency(initial: u32, min: u32, max: u32) -> ConcurrencyParams {
    AdaptiveConcurrency::new(initial, min, max)
        .and_then(|c| c.backoff(0.5))
        .expect("valid")
        .params(crate::tenant::Priority::High)
}

const ADMIT: ConcurrencyCommand = ConcurrencyCommand::Admit;
const ANSWERED: ConcurrencyCommand = ConcurrencyCommand::Complete(CallEnd::Success);
const OVERLOAD: ConcurrencyCommand = ConcurrencyCommand::Complete(CallEnd::Overload);

async fn concurrency_admits_to_the_limit_and_an_end_frees_a_call<H: Harness>(h: &H) {
    let c = h.cache().await;
    let now = h.now();
    let p = concurrency(3, 1, 10);
    let mut admitted = Vec::new();
    for id in 0..4 {
        let step = c.concurrency_step("{cc}:a", ADMIT, p, pick_at(now, id)).await.unwrap();
        assert_eq!(
            (step.in_flight, step.limit, step.next),
            (id, 3 * UNIT, 3 * UNIT),
            "call {id}"
        );
        admitted.push(step.admitted);
    }
    assert_eq!(
        admitted,
        [true, true, true, false],
        "three in flight, the fourth refused"
    );
    let neither = ConcurrencyCommand::Complete(CallEnd::Neither);
    let end = c.concurrency_step("{cc}:a", neither, p, pick_at(now, 1)).await.unwrap();
    assert!(end.admitted, "its lease was live");
    assert_eq!(
        (end.in_flight, end.next),
        (3, 3 * UNIT),
        "neither end changes the limit"
    );
    let again = c.concurrency_step("{cc}:a", ADMIT, p, pick_at(now, 9)).await.unwrap();
    assert_eq!(
        (again.admitted, again.in_flight),
        (true, 2),
        "the ended call no longer counts"
    );
    let other = c.concurrency_step("{cc}:b", ADMIT, p, pick_at(now, 1)).await.unwrap();
    assert_eq!((other.admitted, other.in_flight), (true, 0), "each key its own");
}

async fn concurrency_backs_off_on_overload_and_grows_by_one_per_limit_successes<H: Harness>(h: &H) {
    let c = h.cache().await;
    let now = h.now();
    let p = concurrency(4, 1, 10);
    for id in 0..4 {
        c.concurrency_step("{cc}:aimd", ADMIT, p, pick_at(now, id))
            .await
            .unwrap();
    }
    // Four busy successes at a limit of four: a quarter each.
    let mut limits = Vec::new();
    for id in 0..4 {
        let step = c
            .concurrency_step("{cc}:aimd", ANSWERED, p, pick_at(now, id))
            .await
            .unwrap();
        limits.push(step.next);
        c.concurrency_step("{cc}:aimd", ADMIT, p, pick_at(now, 10 + id))
            .await
            .unwrap();
    }
    assert_eq!(
        limits,
        [4_250_000, 4_500_000, 4_750_000, 5_000_000],
        "+1/limit while at least half the limit is in flight"
    );
    let down = c
        .concurrency_step("{cc}:aimd", OVERLOAD, p, pick_at(now, 10))
        .await
        .unwrap();
    assert_eq!((down.limit, down.next), (5 * UNIT, 2_500_000), "halved");
    let late = c
        .concurrency_step("{cc}:aimd", OVERLOAD, p, pick_at(now, 10))
        .await
        .unwrap();
    assert_eq!(
        (late.admitted, late.next),
        (false, 2_500_000),
        "a second end of one call counts nothing"
    );
    for id in 11..14 {
        c.concurrency_step("{cc}:aimd", OVERLOAD, p, pick_at(now, id))
            .await
            .unwrap();
    }
    let floor = c
        .concurrency_step("{cc}:aimd", ADMIT, p, pick_at(now, 20))
        .await
        .unwrap();
    assert_eq!(
        (floor.limit, floor.in_flight, floor.admitted),
        (UNIT, 0, true),
        "down to min"
    );
    let idle = c
        .concurrency_step("{cc}:aimd", ANSWERED, p, pick_at(now, 20))
        .await
        .unwrap();
    assert_eq!(idle.next, 2 * UNIT, "one in flight is the whole of a limit of one");
}

async fn concurrency_an_ended_lease_stops_counting_and_its_late_end_changes_nothing<H: Harness>(h: &H) {
    let c = h.cache().await;
    let t0 = h.now();
    let p = concurrency(1, 1, 4);
    assert!(
        c.concurrency_step("{cc}:lease", ADMIT, p, pick_at(t0, 1))
            .await
            .unwrap()
            .admitted
    );
    // The lease runs 10 s, inclusive.
    let last = t0.saturating_add(secs(10));
    let at_last = c
        .concurrency_step("{cc}:lease", ADMIT, p, pick_at(last, 2))
        .await
        .unwrap();
    assert_eq!(
        (at_last.admitted, at_last.in_flight),
        (false, 1),
        "a lease counts through its end"
    );
    let after = last.saturating_add(Duration::from_micros(1));
    let freed = c
        .concurrency_step("{cc}:lease", ADMIT, p, pick_at(after, 3))
        .await
        .unwrap();
    assert_eq!((freed.admitted, freed.in_flight), (true, 0), "then it stops counting");
    let late = c
        .concurrency_step("{cc}:lease", OVERLOAD, p, pick_at(after, 1))
        .await
        .unwrap();
    assert_eq!(
        (late.admitted, late.in_flight, late.next),
        (false, 1, UNIT),
        "too late to count"
    );
}

async fn concurrency_a_damaged_limit_heals_to_initial<H: Harness>(h: &H) {
    let c = h.cache().await;
    let now = h.now();
    let p = concurrency(3, 2, 8);
    for (id, junk) in ["junk", "-5", "99999999999999999", ""].into_iter().enumerate() {
        c.set("{cc}:damaged", junk, Some(secs(60))).await.unwrap();
        let step = c
            .concurrency_step("{cc}:damaged", ADMIT, p, pick_at(now, id as u64))
            .await
            .unwrap();
        assert_eq!(
            (step.healed, step.limit),
            (true, 3 * UNIT),
            "{junk:?} reads as the initial limit"
        );
    }
    let written = c.get("{cc}:damaged").await.unwrap();
    assert_eq!(written.as_deref(), Some("3000000"), "and is written back sound");
    c.set("{cc}:damaged", "1", Some(secs(60))).await.unwrap();
    let low = c
        .concurrency_step("{cc}:damaged", ADMIT, p, pick_at(now, 9))
        .await
        .unwrap();
    assert_eq!(
        (low.healed, low.limit),
        (false, 2 * UNIT),
        "a readable limit out of bounds is clamped"
    );
}

async fn racing_concurrency_admits_exactly_the_limit<H: Harness>(h: &H) {
    let c = h.cache().await;
    let now = h.now();
    let p = concurrency(7, 1, 10);
    let tasks: Vec<_> = (0..40)
        .map(|id| {
            let c = c.clone();
            tokio::spawn(async move { c.concurrency_step("{cc}:race", ADMIT, p, pick_at(now, id)).await })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await.expect("task panicked").unwrap().admitted);
    }
    assert_eq!(admitted, 7, "no two admissions saw the same count");
    let ends: Vec<_> = (0..40)
        .map(|id| {
            let c = c.clone();
            tokio::spawn(async move { c.concurrency_step("{cc}:race", ANSWERED, p, pick_at(now, id)).await })
        })
        .collect();
    let mut counted = 0;
    for task in ends {
        counted += usize::from(task.await.expect("task panicked").unwrap().admitted);
    }
    assert_eq!(counted, 7, "only the admitted calls' ends count");
    let last = c
        .concurrency_step("{cc}:race", ADMIT, p, pick_at(now, 99))
        .await
        .unwrap();
    // Seven successes at 7 in flight down to 1: those with at least half
    // the limit in flight (7..=4 of 7, then 3.. of 8) added 1/7 each, then 1/8.
    assert_eq!(last.in_flight, 0);
    assert_eq!(
        last.limit,
        expected_after_racing_successes(&p),
        "every end applied once, in some order"
    );
}

/// A limit of 8 keeping a quarter (2 calls) for the high class, as a low
/// and as a high caller ask.
fn reserved_concurrency() -> (ConcurrencyParams, ConcurrencyParams) {
    use crate::tenant::Priority;
    let settings = AdaptiveConcurrency::new(8, 4, 16)
        .and_then(|c| c.reserve(0.25))
        .expect("valid");
    (settings.params(Priority::Low), settings.params(Priority::High))
}

async fn concurrency_a_low_call_leaves_the_reserve_to_high_ones<H: Harness>(h: &H) {
    let c = h.cache().await;
    let now = h.now();
    let (low, high) = reserved_concurrency();
    let mut lows = Vec::new();
    for id in 0..8 {
        let step = c
            .concurrency_step("{cc}:reserve", ADMIT, low, pick_at(now, id))
            .await
            .unwrap();
        lows.push(step.admitted);
    }
    assert_eq!(
        lows,
        [true, true, true, true, true, true, false, false],
        "6 of 8 for low calls"
    );
    let mut highs = Vec::new();
    for id in 10..13 {
        let step = c
            .concurrency_step("{cc}:reserve", ADMIT, high, pick_at(now, id))
            .await
            .unwrap();
        highs.push((step.admitted, step.in_flight));
    }
    assert_eq!(
        highs,
        [(true, 6), (true, 7), (false, 8)],
        "the reserved 2 went to high calls"
    );
    // A high call's end frees a call, but not one a low call may take
    // while 7 are in flight.
    c.concurrency_step("{cc}:reserve", ANSWERED, high, pick_at(now, 10))
        .await
        .unwrap();
    let refused = c
        .concurrency_step("{cc}:reserve", ADMIT, low, pick_at(now, 20))
        .await
        .unwrap();
    assert_eq!((refused.admitted, refused.in_flight), (false, 7), "the reserve holds");
    let admitted = c
        .concurrency_step("{cc}:reserve", ADMIT, high, pick_at(now, 21))
        .await
        .unwrap();
    assert!(admitted.admitted, "a high call takes it");
}

async fn racing_concurrency_keeps_the_reserve_for_high_calls<H: Harness>(h: &H) {
    let c = h.cache().await;
    let now = h.now();
    let (low, high) = reserved_concurrency();
    let tasks: Vec<_> = (0..40u64)
        .map(|id| {
            let c = c.clone();
            let p = if id % 2 == 0 { low } else { high };
            tokio::spawn(async move {
                (
                    id % 2 == 0,
                    c.concurrency_step("{cc}:race-reserve", ADMIT, p, pick_at(now, id))
                        .await,
                )
            })
        })
        .collect();
    let (mut lows, mut highs) = (0, 0);
    for task in tasks {
        let (is_low, step) = task.await.expect("task panicked");
        if step.unwrap().admitted {
            *(if is_low { &mut lows } else { &mut highs }) += 1;
        }
    }
    assert!(lows <= 6, "low calls took {lows} of 8, more than the 6 not reserved");
    assert_eq!(
        lows + highs,
        8,
        "the high calls filled the rest ({lows} low, {highs} high)"
    );
}

/// The limit after seven successes ending 7, 6, … 1 calls in flight, from 7
/// (the order racing ends arrive in does not change the counts they see).
fn expected_after_racing_successes(p: &ConcurrencyParams) -> u64 {
    let mut limit = p.initial;
    for in_flight in (1..=7).rev() {
        limit = crate::decide::concurrency::step(Some(limit), in_flight, true, ANSWERED, p).next;
    }
    limit
}

fn cool_down(d: Duration) -> BreakerCommand {
    BreakerCommand::CoolDown { duration: d }
}

fn cooldown_refusal(state: CircuitState, wait: Duration) -> Option<Permit> {
    Some(Permit::Refused {
        state,
        retry_after: wait,
        reason: Refusal::Cooldown,
    })
}

async fn breaker_cooldown_refuses_until_it_ends_and_is_never_shortened<H: Harness>(h: &H) {
    let c = h.cache().await;
    let keys = BreakerKeys::new("compliance-cooldown");
    let p = params(2, secs(60), 1);
    let t = h.now();
    let until = t.saturating_add(secs(30));
    let wrote = c.breaker_step(&keys, cool_down(secs(30)), p, t).await.unwrap();
    assert_eq!(wrote.writes.cooldown_until, Write::Set(until));
    assert_eq!(
        (wrote.before, wrote.after, wrote.permit),
        (CircuitState::Closed, CircuitState::Closed, None)
    );
    assert_eq!(
        c.get(&keys.cooldown_until).await.unwrap(),
        Some(until.as_micros().to_string()),
        "stored as decimal microseconds"
    );
    assert_eq!(c.get(&keys.state).await.unwrap(), None, "the circuit is untouched");
    let during = c
        .breaker_step(&keys, BreakerCommand::Allow, p, t.saturating_add(secs(10)))
        .await
        .unwrap();
    assert_eq!(during.permit, cooldown_refusal(CircuitState::Closed, secs(20)));
    assert!(during.writes.is_empty(), "a refusal records nothing");
    let shorter = c
        .breaker_step(&keys, cool_down(secs(5)), p, t.saturating_add(secs(10)))
        .await
        .unwrap();
    assert!(
        shorter.writes.is_empty(),
        "a shorter signal never shortens the cooldown"
    );
    let (snapshot, _) = c.breaker_read(&keys, t.saturating_add(secs(10))).await.unwrap();
    assert_eq!(snapshot.cooldown_until, Some(until));
    let longer = c
        .breaker_step(&keys, cool_down(secs(40)), p, t.saturating_add(secs(10)))
        .await
        .unwrap();
    assert_eq!(longer.writes.cooldown_until, Write::Set(t.saturating_add(secs(50))));
    let ended = c
        .breaker_step(&keys, BreakerCommand::Allow, p, t.saturating_add(secs(50)))
        .await
        .unwrap();
    assert_eq!(ended.permit, Some(Permit::Call), "admitted from the cooldown's end");
}

async fn breaker_cooldown_opens_nothing_and_holds_back_the_probe<H: Harness>(h: &H) {
    let c = h.cache().await;
    let keys = BreakerKeys::new("compliance-cooldown-open");
    let p = params(2, secs(10), 1);
    let t = h.now();
    // A failure, then a cooldown: still one failure, still closed.
    c.breaker_step(&keys, FAILURE, p, t).await.unwrap();
    c.breaker_step(&keys, cool_down(secs(5)), p, t).await.unwrap();
    assert_eq!(c.get(&keys.failures).await.unwrap().as_deref(), Some("1"));
    assert_eq!(c.get(&keys.state).await.unwrap(), None);
    // The call's own failure still counts, and opens at the threshold.
    let opened = c.breaker_step(&keys, FAILURE, p, t).await.unwrap();
    assert_eq!(opened.after, CircuitState::Open);
    c.breaker_step(&keys, cool_down(secs(25)), p, t).await.unwrap();
    let due = t.saturating_add(secs(10));
    let held = c.breaker_step(&keys, BreakerCommand::Allow, p, due).await.unwrap();
    assert_eq!(held.permit, cooldown_refusal(CircuitState::Open, secs(15)));
    assert_eq!(held.after, CircuitState::Open, "no probe while cooling down");
    let (snapshot, _) = c.breaker_read(&keys, due).await.unwrap();
    assert_eq!(snapshot.effective_state(), CircuitState::Open);
    assert_eq!(snapshot.probes, None);
    let after = c
        .breaker_step(&keys, BreakerCommand::Allow, p, t.saturating_add(secs(25)))
        .await
        .unwrap();
    assert!(matches!(after.permit, Some(Permit::Probe(_))), "{after:?}");
}

async fn breaker_cooldown_expires_with_its_ttl<H: Harness>(h: &H) {
    let c = h.cache().await;
    let keys = BreakerKeys::new("compliance-cooldown-ttl");
    let p = params(2, secs(60), 1);
    let ttl = h.short_ttl();
    c.breaker_step(&keys, cool_down(ttl), p, h.now()).await.unwrap();
    assert!(c.get(&keys.cooldown_until).await.unwrap().is_some());
    h.advance(ttl.mul_f64(1.5)).await;
    assert_eq!(
        c.get(&keys.cooldown_until).await.unwrap(),
        None,
        "the key expires with the cooldown"
    );
    let s = c.breaker_step(&keys, BreakerCommand::Allow, p, h.now()).await.unwrap();
    assert_eq!(s.permit, Some(Permit::Call));
}

async fn breaker_reset_clears_the_cooldown<H: Harness>(h: &H) {
    let c = h.cache().await;
    let keys = BreakerKeys::new("compliance-cooldown-reset");
    let p = params(2, secs(60), 1);
    let t = h.now();
    c.breaker_step(&keys, cool_down(secs(30)), p, t).await.unwrap();
    c.breaker_step(&keys, BreakerCommand::Reset, p, t).await.unwrap();
    let (snapshot, _) = c.breaker_read(&keys, t).await.unwrap();
    assert_eq!(snapshot, BreakerSnapshot::EMPTY);
    assert_eq!(
        c.breaker_step(&keys, BreakerCommand::Allow, p, t).await.unwrap().permit,
        Some(Permit::Call)
    );
}

async fn close_is_idempotent_and_later_calls_fail_closed<H: Harness>(h: &H) {
    let c = h.cache().await;
    c.close().await.unwrap();
    c.close().await.unwrap();
    assert!(matches!(c.get("k").await, Err(CacheError::Closed)));
}
