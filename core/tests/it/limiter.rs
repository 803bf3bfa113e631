//! The rate limiter's documented behaviours, on a manual clock.

use std::sync::Arc;
use std::time::Duration;

use redstring::cache::{HitWindow, KeyValue};
use redstring::{
    AcquireError, Clock, Env, Event, ManualClock, MemoryCache, RateLimitExceeded, RateLimiter, RecordingObserver,
    TenantId, Timestamp,
};

const A: TenantId = TenantId::from_u128(0xA);
const B: TenantId = TenantId::from_u128(0xB);
/// The timestamp resolution: a refusal's wait runs until one tick after the
/// oldest hit is exactly one window old.
const TICK: Duration = Duration::from_micros(1);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn limiter(rpm: u32, clock: &Arc<ManualClock>) -> RateLimiter {
    RateLimiter::builder(rpm)
        .env(Env::default().with_clock(clock.clone()))
        .build()
        .unwrap()
}

fn refused(result: Result<redstring::Admission, AcquireError>) -> RateLimitExceeded {
    match result {
        Err(AcquireError::Limited(e)) => e,
        other => panic!("expected a rate-limit refusal, got {other:?}"),
    }
}

#[test]
fn rpm_zero_is_rejected_at_construction() {
    let err = RateLimiter::builder(0).build().unwrap_err();
    assert_eq!(err.to_string(), "rpm must be positive, got 0");
    assert_eq!(err.field, "rpm");
}

#[test]
fn zero_window_is_rejected_at_construction() {
    let err = RateLimiter::builder(60).window(Duration::ZERO).build().unwrap_err();
    assert_eq!(err.to_string(), "window_seconds must be positive, got 0");
}

#[test]
fn empty_or_overlong_prefix_is_rejected() {
    assert_eq!(
        RateLimiter::builder(1).key_prefix("").build().unwrap_err().field,
        "key_prefix"
    );
    assert_eq!(
        RateLimiter::builder(1)
            .key_prefix("x".repeat(92))
            .build()
            .unwrap_err()
            .field,
        "key_prefix"
    );
    assert!(RateLimiter::builder(1).key_prefix("x".repeat(91)).build().is_ok());
}

#[test]
fn defaults_are_a_sixty_second_window_and_the_kg_ratelimit_prefix() {
    let l = RateLimiter::builder(60).build().unwrap();
    assert_eq!(l.window(), secs(60));
    assert_eq!(l.key_prefix(), "kg:ratelimit");
    assert_eq!(l.rpm(), 60);
}

#[tokio::test]
async fn admits_rpm_calls_then_refuses_with_the_exact_wait_and_message() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let l = limiter(3, &clock);
    for expected in [2, 1, 0] {
        assert_eq!(l.acquire(A).await.unwrap().remaining, expected);
        clock.advance(secs(10));
    }
    // Hits at 0, 10, 20; now is 30: the first ages out at 60.
    let e = refused(l.acquire(A).await);
    assert_eq!(e.retry_after, secs(30) + TICK);
    assert_eq!(e.used, 3);
    assert_eq!(e.tenant, A);
    assert_eq!(
        e.to_string(),
        "tenant 00000000-0000-0000-0000-00000000000a has used 3 calls in 60s; retry in 30.00s"
    );
}

#[tokio::test]
async fn message_shows_fractional_waits_to_two_places() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let l = limiter(1, &clock);
    l.acquire(A).await.unwrap();
    clock.advance(Duration::from_millis(59_580));
    assert_eq!(
        refused(l.acquire(A).await).to_string(),
        "tenant 00000000-0000-0000-0000-00000000000a has used 1 calls in 60s; retry in 0.42s"
    );
}

#[tokio::test]
async fn sleeping_for_retry_after_then_acquiring_succeeds() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let l = limiter(2, &clock);
    l.acquire(A).await.unwrap();
    clock.advance(secs(5));
    l.acquire(A).await.unwrap();
    let wait = refused(l.acquire(A).await).retry_after;
    clock.sleep(wait - TICK).await;
    assert_eq!(
        refused(l.acquire(A).await).retry_after,
        TICK,
        "one tick short, the oldest hit is still inside the inclusive window"
    );
    clock.advance(TICK);
    assert!(
        l.acquire(A).await.is_ok(),
        "sleeping exactly retry_after frees the slot"
    );
}

#[tokio::test]
async fn refusals_are_not_recorded() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let l = limiter(1, &clock);
    l.acquire(A).await.unwrap();
    for _ in 0..20 {
        clock.advance(secs(1));
        let _ = refused(l.acquire(A).await);
    }
    let since = clock.now().saturating_sub(secs(60));
    let key = format!("kg:ratelimit:{A}");
    assert_eq!(l.cache().count_since(&key, since).await.unwrap(), 1);
    // And the retry loop is not locked out: 60 s after the only hit, a slot frees.
    clock.advance(secs(40) + TICK);
    assert!(l.acquire(A).await.is_ok());
}

#[tokio::test]
async fn retry_after_never_grows_across_refusals() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let l = limiter(2, &clock);
    l.acquire(A).await.unwrap();
    clock.advance(secs(7));
    l.acquire(A).await.unwrap();
    let mut last = Duration::MAX;
    for step_ms in [0, 1, 500, 2_000, 10_000, 0, 30_000] {
        clock.advance(Duration::from_millis(step_ms));
        let wait = refused(l.acquire(A).await).retry_after;
        assert!(wait <= last, "{wait:?} grew past {last:?}");
        last = wait;
    }
}

#[tokio::test]
async fn the_window_slides_rather_than_resetting_on_a_boundary() {
    // Sixty calls at 11:59:59.9 and the next at 12:00:00.1: a bucket counter
    // would admit it; a sliding window refuses until the first sixty age out.
    let clock = Arc::new(ManualClock::new(Timestamp::from_micros(1_700_006_399_900_000)));
    let l = limiter(60, &clock);
    for _ in 0..60 {
        l.acquire(A).await.unwrap();
    }
    clock.advance(Duration::from_millis(200));
    let e = refused(l.acquire(A).await);
    assert_eq!(e.retry_after, Duration::from_millis(59_800) + TICK);
}

#[tokio::test]
async fn slots_free_one_at_a_time_as_hits_age_out() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let l = limiter(3, &clock);
    for _ in 0..3 {
        l.acquire(A).await.unwrap();
        clock.advance(secs(10));
    }
    clock.advance(secs(31)); // t = 61: only the first hit (t = 0) has aged out
    assert_eq!(l.remaining(A).await.unwrap(), 1);
    l.acquire(A).await.unwrap();
    assert!(l.acquire(A).await.is_err());
}

#[tokio::test]
async fn allowances_are_per_tenant() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let l = limiter(5, &clock);
    for _ in 0..5 {
        l.acquire(A).await.unwrap();
    }
    assert!(l.acquire(A).await.is_err());
    assert_eq!(l.remaining(B).await.unwrap(), 5);
    assert_eq!(l.acquire(B).await.unwrap().remaining, 4);
}

#[tokio::test]
async fn remaining_counts_without_taking_a_slot() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let l = limiter(5, &clock);
    assert_eq!(
        l.remaining(A).await.unwrap(),
        5,
        "a fresh tenant has the whole allowance"
    );
    l.acquire(A).await.unwrap();
    l.acquire(A).await.unwrap();
    for _ in 0..10 {
        assert_eq!(l.remaining(A).await.unwrap(), 3);
    }
}

#[tokio::test]
async fn remaining_is_never_negative_even_when_a_fleet_overshot() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let l = RateLimiter::builder(2)
        .env(Env::default().with_clock(clock.clone()))
        .cache(cache.clone())
        .build()
        .unwrap();
    let key = format!("kg:ratelimit:{A}");
    for _ in 0..7 {
        cache.record_hit(&key, clock.now(), secs(120)).await.unwrap();
    }
    assert_eq!(l.remaining(A).await.unwrap(), 0);
}

#[tokio::test]
async fn rpm_means_per_window() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let l = RateLimiter::builder(10)
        .window(secs(1))
        .env(Env::default().with_clock(clock.clone()))
        .build()
        .unwrap();
    for _ in 0..10 {
        l.acquire(A).await.unwrap();
    }
    let e = refused(l.acquire(A).await);
    assert_eq!(e.retry_after, secs(1) + TICK);
    assert_eq!(
        e.to_string(),
        "tenant 00000000-0000-0000-0000-00000000000a has used 10 calls in 1s; retry in 1.00s"
    );
    clock.advance(Duration::from_millis(1_001));
    assert_eq!(l.remaining(A).await.unwrap(), 10);
}

#[tokio::test]
async fn a_tenants_series_lives_two_windows_and_the_clock_lead_after_its_last_hit() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let l = limiter(5, &clock);
    assert_eq!(l.max_clock_ahead(), secs(1));
    l.acquire(A).await.unwrap();
    clock.advance(secs(121));
    assert_eq!(l.cache().len().1, 1, "kept through 2 × window + max_clock_ahead");
    clock.advance(TICK);
    assert_eq!(l.cache().len().1, 0, "gone one tick later");
}

#[tokio::test]
async fn idle_tenants_are_swept_so_memory_stays_bounded() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let l = limiter(5, &clock);
    for n in 0..1_000u128 {
        l.acquire(TenantId::from_u128(n)).await.unwrap();
    }
    assert_eq!(l.cache().stored_hits(), 1_000);
    clock.advance(secs(122));
    for _ in 0..1_100 {
        let _ = l.remaining(A).await.unwrap();
    }
    assert_eq!(l.cache().stored_hits(), 0, "expired series are swept, not just hidden");
}

#[tokio::test]
async fn a_busy_tenant_keeps_at_most_two_windows_of_hits() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let l = limiter(10, &clock);
    for _ in 0..1_000 {
        let _ = l.acquire(A).await;
        clock.advance(Duration::from_millis(500));
    }
    // Two windows of hits (10 each, and one more at the lifetime's edge)...
    let key = format!("kg:ratelimit:{A}");
    let live = l.cache().count_since(&key, Timestamp::EPOCH).await.unwrap();
    assert!(live <= 20 + 1, "{live} hits unpruned");
    // ...and pruned ones only while the buffer has room: at most twice that
    // in memory, where every hit admitted over the run (90) is held if none
    // leaves.
    assert!(
        l.cache().stored_hits() <= 2 * (20 + 1),
        "{} hits held",
        l.cache().stored_hits()
    );
}

#[tokio::test]
async fn limiters_sharing_a_cache_and_prefix_share_an_allowance() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let env = Env::default().with_clock(clock);
    let one = RateLimiter::builder(2)
        .env(env.clone())
        .cache(cache.clone())
        .build()
        .unwrap();
    let two = RateLimiter::builder(2)
        .env(env.clone())
        .cache(cache.clone())
        .build()
        .unwrap();
    let other = RateLimiter::builder(2)
        .key_prefix("kg:embed")
        .env(env)
        .cache(cache.clone())
        .build()
        .unwrap();
    one.acquire(A).await.unwrap();
    two.acquire(A).await.unwrap();
    assert!(one.acquire(A).await.is_err());
    assert!(two.acquire(A).await.is_err());
    assert!(
        other.acquire(A).await.is_ok(),
        "a different prefix is a separate allowance"
    );
}

/// A clock that moves one millisecond every time it is read.
struct TickingClock(ManualClock);

impl Clock for TickingClock {
    fn now(&self) -> Timestamp {
        let t = self.0.now();
        self.0.advance(Duration::from_millis(1));
        t
    }
    fn sleep(&self, d: Duration) -> redstring::Sleep {
        self.0.sleep(d)
    }
}

#[tokio::test]
async fn one_clock_read_per_acquire_stamps_count_oldest_and_hit_alike() {
    let manual = ManualClock::at_fixed_epoch();
    let observer = Arc::new(RecordingObserver::new());
    // The cache keeps TTL time on the plain clock, so only the limiter's own
    // reads move time.
    let cache = Arc::new(MemoryCache::with_time_source(
        Arc::new(manual.clone()),
        redstring::TimeSource::Caller,
    ));
    let l = RateLimiter::builder(1)
        .cache(cache)
        .env(
            Env::default()
                .with_clock(Arc::new(TickingClock(manual.clone())))
                .with_observer(observer.clone()),
        )
        .build()
        .unwrap();
    let start = manual.now();
    l.acquire(A).await.unwrap();
    let e = refused(l.acquire(A).await);
    let events = observer.events();
    let admitted_at = match &events[0] {
        Event::RateLimitAdmitted { at, .. } => *at,
        other => panic!("{other:?}"),
    };
    let refused_at = match &events[1] {
        Event::RateLimitRefused { at, .. } => *at,
        other => panic!("{other:?}"),
    };
    assert_eq!(admitted_at, start, "the hit carries the single reading");
    assert_eq!(
        e.retry_after,
        admitted_at
            .saturating_add(secs(60) + TICK)
            .saturating_duration_since(refused_at),
        "the wait is computed against the instant the count used"
    );
    assert_eq!(
        manual.now(),
        start.saturating_add(Duration::from_millis(2)),
        "one read per acquire"
    );
}

#[tokio::test]
async fn close_releases_only_a_cache_the_limiter_built() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let shared = Arc::new(MemoryCache::new(clock.clone()));
    let given = RateLimiter::builder(1)
        .env(Env::default().with_clock(clock.clone()))
        .cache(shared.clone())
        .build()
        .unwrap();
    given.close().await.unwrap();
    assert!(shared.get("k").await.is_ok(), "a cache passed in stays open");

    let owned = limiter(1, &clock);
    owned.close().await.unwrap();
    owned.close().await.unwrap();
    assert!(matches!(
        owned.acquire(A).await,
        Err(AcquireError::Cache(redstring::CacheError::Closed))
    ));
}

#[test]
fn a_clock_lead_longer_than_the_window_is_rejected() {
    let err = RateLimiter::builder(5)
        .window(secs(10))
        .max_clock_ahead(secs(11))
        .build()
        .unwrap_err();
    assert_eq!(err.field, "max_clock_ahead");
    let short = RateLimiter::builder(5)
        .window(Duration::from_millis(200))
        .build()
        .unwrap();
    assert_eq!(
        short.max_clock_ahead(),
        Duration::from_millis(200),
        "the default lead never exceeds the window"
    );
}

/// Issue: one worker whose clock ran an hour ahead recorded a far-future hit,
/// and pruning from the newest stamp then deleted every other hit: a correct
/// limiter at rpm 3 on the same caller-stamped cache was admitted 20 of 20.
#[tokio::test]
async fn one_fast_clock_cannot_lift_a_shared_limit() {
    let store_clock = Arc::new(ManualClock::at_fixed_epoch());
    let shared = Arc::new(MemoryCache::with_time_source(
        store_clock.clone(),
        redstring::TimeSource::Caller,
    ));
    let events = Arc::new(RecordingObserver::new());
    let fast = RateLimiter::builder(3)
        .cache(shared.clone())
        .env(
            Env::default()
                .with_clock(Arc::new(ManualClock::new(store_clock.now().saturating_add(secs(3600)))))
                .with_observer(events.clone()),
        )
        .build()
        .unwrap();
    fast.acquire(A).await.unwrap();
    assert!(
        events.events().iter().any(|e| matches!(
            e,
            Event::StampClamped { asked, used, .. } if *used == store_clock.now().saturating_add(secs(1)) && *asked > *used
        )),
        "the far-future stamp is clamped to the tolerated lead, and reported"
    );
    let sane = RateLimiter::builder(3)
        .cache(shared)
        .env(Env::default().with_clock(store_clock.clone()))
        .build()
        .unwrap();
    let mut admitted = 0;
    for _ in 0..20 {
        if sane.acquire(A).await.is_ok() {
            admitted += 1;
        }
        store_clock.advance(Duration::from_millis(100));
    }
    assert_eq!(admitted, 2, "the fast worker's hit counts and nobody's is pruned");
}

/// A `MemoryCache` stamps with its own clock unless told otherwise: a caller
/// whose `now` is an hour off is decided at the cache's instant.
#[tokio::test]
async fn a_memory_cache_stamps_with_its_own_clock_by_default() {
    use redstring::cache::{LimiterStore, SlotRequest};
    use redstring::decide::window::SlotOutcome;
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = MemoryCache::new(clock.clone());
    let request = SlotRequest {
        now: clock.now().saturating_add(secs(3600)),
        window: secs(60),
        limit: 5,
        ttl: secs(121),
        max_ahead: Duration::ZERO,
    };
    assert_eq!(
        cache.acquire_slot("k", request).await.unwrap(),
        SlotOutcome::Admitted {
            remaining: 4,
            at: clock.now(),
            clamped: false
        }
    );
}

mod tokens {
    use redstring::decide::tokens::RefusedBy;
    use redstring::limiter::{TokenAcquireError, TokenLimitExceeded};

    use super::*;

    fn token_limiter(clock: &Arc<ManualClock>, lease: Option<Duration>) -> RateLimiter {
        let mut b = RateLimiter::builder(100)
            .tokens_per_window(1000)
            .env(Env::default().with_clock(clock.clone()));
        if let Some(lease) = lease {
            b = b.token_lease(lease);
        }
        b.build().unwrap()
    }

    fn tokens_refused(result: Result<redstring::limiter::TokenAdmission, TokenAcquireError>) -> TokenLimitExceeded {
        match result {
            Err(TokenAcquireError::Tokens(e)) => e,
            other => panic!("expected a token refusal, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_reservation_settled_below_its_estimate_refunds_the_difference() {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let limiter = token_limiter(&clock, None);
        let first = limiter.acquire_tokens(A, 600).await.unwrap();
        assert_eq!(first.tokens_left, 400);
        let refusal = tokens_refused(limiter.acquire_tokens(A, 600).await);
        assert_eq!((refusal.by, refusal.used, refusal.asked), (RefusedBy::Tokens, 600, 600));
        assert_eq!(
            refusal.retry_after,
            secs(60) + TICK,
            "the reservation leaves with the window"
        );
        assert_eq!(
            refusal.to_string(),
            format!("tenant {A} asked for 600 tokens with 600 of 1000 used in 60s; retry in 60.00s")
        );
        // The server said it used 150: 850 are free again.
        assert!(limiter.settle(A, &first.reservation.unwrap(), 150).await.unwrap());
        let second = limiter.acquire_tokens(A, 600).await.unwrap();
        assert_eq!(second.tokens_left, 250);
        // Another tenant's budget is its own.
        assert_eq!(limiter.acquire_tokens(B, 1000).await.unwrap().tokens_left, 0);
    }

    #[tokio::test]
    async fn a_released_reservation_frees_everything_and_a_dropped_one_frees_at_its_lease() {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let limiter = token_limiter(&clock, Some(secs(10)));
        let failed = limiter.acquire_tokens(A, 900).await.unwrap();
        limiter.release(A, &failed.reservation.unwrap()).await.unwrap();
        // This one is never settled: its caller went away.
        limiter.acquire_tokens(A, 900).await.unwrap();
        let held = tokens_refused(limiter.acquire_tokens(A, 200).await);
        assert_eq!(
            held.retry_after,
            secs(10) + TICK,
            "until the lease's last microsecond has passed"
        );
        clock.advance(held.retry_after);
        limiter.acquire_tokens(A, 200).await.unwrap();
    }

    #[tokio::test]
    async fn an_estimate_over_the_limit_is_refused_for_good_and_requests_still_count() {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let limiter = RateLimiter::builder(1)
            .tokens_per_window(1000)
            .env(Env::default().with_clock(clock.clone()))
            .build()
            .unwrap();
        let huge = tokens_refused(limiter.acquire_tokens(A, 1001).await);
        assert_eq!(huge.by, RefusedBy::TooLarge);
        assert_eq!(
            TokenAcquireError::Tokens(huge.clone()).retry_after(),
            None,
            "no wait ends it"
        );
        assert!(
            huge.to_string().ends_with("the estimate alone is over the limit"),
            "{huge}"
        );
        limiter.acquire_tokens(A, 10).await.unwrap();
        match limiter.acquire_tokens(A, 10).await {
            Err(TokenAcquireError::Limited(e)) => assert_eq!(e.used, 1),
            other => panic!("the second call is over rpm 1: {other:?}"),
        }
    }

    #[tokio::test]
    async fn without_a_token_limit_acquire_tokens_is_acquire() {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let limiter = limiter(1, &clock);
        let a = limiter.acquire_tokens(A, u64::MAX).await.unwrap();
        assert_eq!((a.remaining, a.reservation), (0, None));
    }

    #[test]
    fn absurd_token_settings_are_refused_by_name() {
        let e = |b: redstring::RateLimiterBuilder<MemoryCache>| b.build().unwrap_err().field;
        assert_eq!(e(RateLimiter::builder(1).tokens_per_window(0)), "tokens_per_window");
        assert_eq!(
            e(RateLimiter::builder(1).tokens_per_window((1 << 53) + 1)),
            "tokens_per_window"
        );
        assert_eq!(e(RateLimiter::builder(1).token_lease(Duration::ZERO)), "token_lease");
        assert_eq!(e(RateLimiter::builder(1).token_lease(secs(61))), "token_lease");
    }
}

/// A store with only the limiter's one atomic step: no hit series, no
/// key/value. It decides by `decide::window::decide` over its own list, under
/// one lock, so it is exact.
struct OneStepStore(std::sync::Mutex<Vec<Timestamp>>);

impl redstring::cache::Cache for OneStepStore {
    async fn close(&self) -> Result<(), redstring::CacheError> {
        Ok(())
    }
}

impl redstring::cache::LimiterStore for OneStepStore {
    async fn acquire_slot(
        &self,
        _key: &str,
        request: redstring::cache::SlotRequest,
    ) -> Result<redstring::decide::window::SlotOutcome, redstring::CacheError> {
        use redstring::decide::window::{SlotOutcome, decide};
        let mut hits = self.0.lock().unwrap();
        let since = request.now.saturating_sub(request.window);
        hits.retain(|&at| at >= since);
        let outcome = decide(
            hits.len() as u64,
            hits.first().copied(),
            request.limit,
            request.now,
            request.window,
        );
        if matches!(outcome, SlotOutcome::Admitted { .. }) {
            hits.push(request.now);
        }
        Ok(outcome)
    }
}

/// Two calls a window over a [`OneStepStore`]: both admitted, the third
/// refused until the first ages out, then admitted.
async fn two_a_window_over_one_step() {
    let clock = Arc::new(ManualClock::new(Timestamp::from_secs(1_000)));
    let l = RateLimiter::builder(2)
        .env(Env::default().with_clock(clock.clone()))
        .cache(Arc::new(OneStepStore(std::sync::Mutex::new(Vec::new()))))
        .build()
        .unwrap();
    assert_eq!(l.acquire(A).await.unwrap().remaining, 1);
    assert_eq!(l.acquire(A).await.unwrap().remaining, 0);
    let wait = refused(l.acquire(A).await).retry_after;
    assert_eq!(wait, secs(60) + TICK);
    clock.advance(wait);
    assert!(l.acquire(A).await.is_ok());
}

#[tokio::test]
async fn a_store_with_only_the_atomic_step_serves_a_limiter() {
    two_a_window_over_one_step().await;
}

/// The known-bad variants that split the step into separate calls need a
/// hit series; over a store without one the real step runs, exactly.
#[cfg(feature = "mutants")]
#[tokio::test]
async fn a_store_without_a_hit_series_runs_the_split_variants_as_the_real_step() {
    use redstring::mutants::{Mutant, inject};
    for mutant in [Mutant::ThreeCallLimiter, Mutant::RefusalsRecorded] {
        let _injected = inject(Some(mutant));
        two_a_window_over_one_step().await;
    }
}

/// Priority classes: a reserve kept for the high class of one allowance.
mod priority {
    use super::*;
    use redstring::Priority;

    fn reserved(rpm: u32, share: f64, clock: &Arc<ManualClock>) -> RateLimiter {
        RateLimiter::builder(rpm)
            .reserve(share)
            .env(Env::default().with_clock(clock.clone()))
            .build()
            .unwrap()
    }

    #[test]
    fn a_reserve_must_be_a_share_that_leaves_the_low_class_something() {
        let field = |b: redstring::RateLimiterBuilder<MemoryCache>| b.build().unwrap_err().field;
        for share in [0.0, 1.0, -0.1, 1.5, f64::NAN, f64::INFINITY] {
            assert_eq!(field(RateLimiter::builder(10).reserve(share)), "reserve", "{share}");
        }
        // ⌈10 × 0.95⌉ = 10 leaves the low class no request.
        let err = RateLimiter::builder(10).reserve(0.95).build().unwrap_err();
        assert_eq!(err.field, "reserve");
        assert!(err.to_string().contains("leave the low class"), "{err}");
        // Nor may it leave no token.
        assert_eq!(
            field(RateLimiter::builder(100).tokens_per_window(1).reserve(0.3)),
            "reserve"
        );
        let limiter = RateLimiter::builder(10).reserve(0.25).build().unwrap();
        // ⌈2.5⌉ = 3 reserved: the high class is never given less than its share.
        assert_eq!(
            (limiter.rpm_for(Priority::High), limiter.rpm_for(Priority::Low)),
            (10, 7)
        );
        // 0.07 × 100 is a hair above 7 in binary floating point: still 7.
        assert_eq!(redstring::limiter::reserve_of(100, 0.07), 7);
        let limiter = RateLimiter::builder(100).reserve(0.07).build().unwrap();
        assert_eq!(limiter.rpm_for(Priority::Low), 93);
    }

    #[tokio::test]
    async fn without_a_reserve_a_low_caller_sees_the_whole_limit_and_no_share_is_named() {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let limiter = limiter(2, &clock);
        limiter.acquire_as(A, Priority::Low).await.unwrap();
        limiter.acquire_as(A, Priority::Low).await.unwrap();
        let refusal = refused(limiter.acquire_as(A, Priority::Low).await);
        assert_eq!((refusal.limit, refusal.reserved), (2, 0));
        assert!(!refusal.to_string().contains("share"), "{refusal}");
    }

    #[tokio::test]
    async fn the_low_class_stops_at_its_share_and_waits_for_the_hit_that_makes_room() {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let limiter = reserved(10, 0.3, &clock);
        // Three high calls at 0, 1, 2 s and four low at 3..6 s: 7 hits, the
        // low class's share.
        for i in 0..7 {
            let class = if i < 3 { Priority::High } else { Priority::Low };
            limiter.acquire_as(A, class).await.unwrap();
            clock.advance(secs(1));
        }
        let low = refused(limiter.acquire_as(A, Priority::Low).await);
        assert_eq!((low.used, low.limit, low.priority), (7, 7, Priority::Low));
        // The oldest hit (0 s) ages out at 60 s.
        assert_eq!(low.retry_after, secs(53) + TICK);
        assert!(low.to_string().contains("low priority's share is 7"), "{low}");
        // High takes the reserve: three more at 7, 8, 9 s.
        for _ in 0..3 {
            limiter.acquire_as(A, Priority::High).await.unwrap();
            clock.advance(secs(1));
        }
        let high = refused(limiter.acquire(A).await);
        assert_eq!((high.used, high.limit, high.priority), (10, 10, Priority::High));
        assert_eq!(
            high.retry_after,
            secs(50) + TICK,
            "the oldest (0 s) frees the high class"
        );
        assert!(!high.to_string().contains("share"), "{high}");
        // Ten hits: the low class needs four to go, the fourth oldest being 3 s.
        let low = refused(limiter.acquire_as(A, Priority::Low).await);
        assert_eq!(low.retry_after, secs(53) + TICK);
        clock.advance(low.retry_after - TICK);
        assert!(limiter.acquire_as(A, Priority::Low).await.is_err(), "one tick early");
        clock.advance(TICK);
        limiter.acquire_as(A, Priority::Low).await.unwrap();
    }

    #[tokio::test]
    async fn decisions_are_reported_with_the_class_asked_as() {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let observer = Arc::new(RecordingObserver::default());
        let limiter = RateLimiter::builder(2)
            .reserve(0.5)
            .env(Env::default().with_clock(clock.clone()).with_observer(observer.clone()))
            .build()
            .unwrap();
        limiter.acquire_as(A, Priority::Low).await.unwrap();
        refused(limiter.acquire_as(A, Priority::Low).await);
        limiter.acquire(A).await.unwrap();
        let classes: Vec<_> = observer
            .events()
            .iter()
            .filter_map(|e| match e {
                Event::RateLimitAdmitted { priority, .. } => Some(("admitted", *priority)),
                Event::RateLimitRefused { priority, .. } => Some(("refused", *priority)),
                _ => None,
            })
            .collect();
        assert_eq!(
            classes,
            [
                ("admitted", Priority::Low),
                ("refused", Priority::Low),
                ("admitted", Priority::High)
            ]
        );
    }

    #[tokio::test]
    async fn the_low_class_reserves_tokens_up_to_its_share_only() {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let events = Arc::new(RecordingObserver::new());
        let limiter = RateLimiter::builder(100)
            .tokens_per_window(1_000)
            .reserve(0.3)
            .env(Env::default().with_clock(clock.clone()).with_observer(events.clone()))
            .build()
            .unwrap();
        limiter.acquire_tokens_as(A, 600, Priority::Low).await.unwrap();
        let refusal = limiter.acquire_tokens_as(A, 101, Priority::Low).await.unwrap_err();
        match refusal {
            redstring::limiter::TokenAcquireError::Tokens(e) => assert_eq!((e.used, e.limit), (600, 700)),
            other => panic!("expected a token refusal, got {other:?}"),
        }
        let refused: Vec<_> = events
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Event::TokensRefused { priority, estimate, .. } => Some((priority, estimate)),
                _ => None,
            })
            .collect();
        assert_eq!(refused, [(Priority::Low, 101)], "the refusal names the class");
        limiter.acquire_tokens_as(A, 100, Priority::Low).await.unwrap();
        // The high class may use what the low left and the reserve.
        limiter.acquire_tokens_as(A, 300, Priority::High).await.unwrap();
    }
}
