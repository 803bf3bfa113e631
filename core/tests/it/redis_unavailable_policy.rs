//! The limiter's `OnCacheUnavailable` policy against a stand-in shared cache
//! that can be switched off, so the policy is pinned even where no
//! redis-server is installed (`redis_faults.rs` repeats it on a real one).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redstring::DecidedBy;
use redstring::cache::{LimiterStore, SlotRequest, TokenStore};
use redstring::decide::tokens::{ReservationId, TokenAsk, TokenOutcome};
use redstring::decide::window::SlotOutcome;
use redstring::{
    AcquireError, Cache, CacheError, Env, Event, ManualClock, MemoryCache, OnCacheUnavailable, RateLimiter,
    RecordingObserver, TenantId,
};

/// A MemoryCache that answers `Unavailable` while `down` is set, or
/// `Protocol` while `broken` is set.
struct Flaky {
    inner: MemoryCache,
    down: AtomicBool,
    broken: AtomicBool,
}

impl Flaky {
    fn check(&self, operation: &'static str) -> Result<(), CacheError> {
        if self.broken.load(Ordering::SeqCst) {
            return Err(CacheError::Protocol {
                operation,
                detail: "garbled".into(),
            });
        }
        if self.down.load(Ordering::SeqCst) {
            return Err(CacheError::Unavailable {
                operation,
                reason: "switched off".into(),
            });
        }
        Ok(())
    }
}

impl Cache for Flaky {
    async fn close(&self) -> Result<(), CacheError> {
        self.inner.close().await
    }
}

impl LimiterStore for Flaky {
    async fn acquire_slot(&self, key: &str, request: SlotRequest) -> Result<SlotOutcome, CacheError> {
        self.check("acquire_slot")?;
        self.inner.acquire_slot(key, request).await
    }
}

impl TokenStore for Flaky {
    async fn acquire_with_tokens(
        &self,
        key: &str,
        request: SlotRequest,
        ask: TokenAsk,
    ) -> Result<TokenOutcome, CacheError> {
        self.check("acquire_with_tokens")?;
        self.inner.acquire_with_tokens(key, request, ask).await
    }
    async fn settle_tokens(&self, key: &str, id: ReservationId, actual: u64) -> Result<bool, CacheError> {
        self.check("settle_tokens")?;
        self.inner.settle_tokens(key, id, actual).await
    }
}

fn setup(policy: Option<OnCacheUnavailable>) -> (Arc<Flaky>, RateLimiter<Flaky>, Arc<RecordingObserver>) {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let store = Arc::new(Flaky {
        inner: MemoryCache::new(clock.clone()),
        down: AtomicBool::new(false),
        broken: AtomicBool::new(false),
    });
    let observer = Arc::new(RecordingObserver::new());
    let mut builder = RateLimiter::builder(2)
        .cache(store.clone())
        .env(Env::default().with_clock(clock).with_observer(observer.clone()));
    if let Some(policy) = policy {
        builder = builder.on_cache_unavailable(policy);
    }
    (store, builder.build().unwrap(), observer)
}

fn fallbacks(observer: &RecordingObserver) -> Vec<&'static str> {
    observer
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::CacheUnavailable { fallback, .. } => Some(*fallback),
            _ => None,
        })
        .collect()
}

const TENANT: TenantId = TenantId::from_u128(5);

#[tokio::test]
async fn the_default_is_a_local_limit() {
    assert_eq!(OnCacheUnavailable::default(), OnCacheUnavailable::LocalLimit);
    let (store, limiter, observer) = setup(None);
    store.down.store(true, Ordering::SeqCst);
    assert_eq!(limiter.acquire(TENANT).await.unwrap().remaining, 1);
    assert_eq!(limiter.acquire(TENANT).await.unwrap().remaining, 0);
    assert!(matches!(limiter.acquire(TENANT).await, Err(AcquireError::Limited(_))));
    assert_eq!(fallbacks(&observer), ["local limit"; 3]);
    // The shared cache saw none of it, and is used again once it answers.
    store.down.store(false, Ordering::SeqCst);
    assert_eq!(limiter.acquire(TENANT).await.unwrap().remaining, 1);
    assert_eq!(fallbacks(&observer).len(), 3);
    // Each decision names the limiter that made it.
    assert_eq!(
        deciders(&observer),
        [DecidedBy::Local, DecidedBy::Local, DecidedBy::Local, DecidedBy::Store]
    );
}

/// Who decided each admission and refusal `observer` saw, in order.
fn deciders(observer: &RecordingObserver) -> Vec<DecidedBy> {
    observer
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::RateLimitAdmitted { decided_by, .. } | Event::RateLimitRefused { decided_by, .. } => {
                Some(*decided_by)
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn admit_fails_open() {
    let (store, limiter, observer) = setup(Some(OnCacheUnavailable::Admit));
    store.down.store(true, Ordering::SeqCst);
    for _ in 0..5 {
        assert_eq!(limiter.acquire(TENANT).await.unwrap().remaining, 0);
    }
    assert_eq!(fallbacks(&observer), ["allowed"; 5]);
    // Each admission is reported as one, right after the fallback that made it.
    let admitted = observer
        .events()
        .iter()
        .filter(|e| matches!(e, Event::RateLimitAdmitted { remaining: 0, tenant, .. } if *tenant == TENANT))
        .count();
    assert_eq!(admitted, 5);
    assert!(matches!(
        observer.events().last(),
        Some(Event::RateLimitAdmitted { .. })
    ));
    assert_eq!(deciders(&observer), [DecidedBy::Unlimited; 5]);
}

#[tokio::test]
async fn refuse_fails_closed() {
    let (store, limiter, observer) = setup(Some(OnCacheUnavailable::Refuse));
    store.down.store(true, Ordering::SeqCst);
    match limiter.acquire(TENANT).await {
        Err(AcquireError::Cache(CacheError::Unavailable { operation, .. })) => assert_eq!(operation, "acquire_slot"),
        other => panic!("expected the cache error, got {other:?}"),
    }
    assert_eq!(fallbacks(&observer), ["refused"]);
}

#[tokio::test]
async fn only_unavailability_triggers_the_policy() {
    for policy in [OnCacheUnavailable::LocalLimit, OnCacheUnavailable::Admit] {
        let (store, limiter, observer) = setup(Some(policy));
        store.broken.store(true, Ordering::SeqCst);
        assert!(matches!(
            limiter.acquire(TENANT).await,
            Err(AcquireError::Cache(CacheError::Protocol { .. }))
        ));
        assert!(fallbacks(&observer).is_empty(), "{policy:?}");
    }
}

/// A token reservation follows the same policy: decided and settled in the
/// local store under `local_limit`, admitted without a reservation under
/// `admit`, refused under `refuse`.
#[tokio::test]
async fn token_reservations_follow_the_policy_while_the_cache_is_down() {
    let token_limiter = |policy| {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let store = Arc::new(Flaky {
            inner: MemoryCache::new(clock.clone()),
            down: AtomicBool::new(true),
            broken: AtomicBool::new(false),
        });
        let observer = Arc::new(RecordingObserver::new());
        let limiter = RateLimiter::builder(10)
            .tokens_per_window(1000)
            .on_cache_unavailable(policy)
            .cache(store.clone())
            .env(Env::default().with_clock(clock).with_observer(observer.clone()))
            .build()
            .unwrap();
        (store, limiter, observer)
    };

    let (store, limiter, observer) = token_limiter(OnCacheUnavailable::LocalLimit);
    let first = limiter.acquire_tokens(TENANT, 600).await.unwrap();
    let reservation = first.reservation.expect("reserved locally");
    assert_eq!(reservation.decided_by, DecidedBy::Local);
    assert!(matches!(
        limiter.acquire_tokens(TENANT, 600).await,
        Err(redstring::limiter::TokenAcquireError::Tokens(_))
    ));
    // Settled in the local ledger it was made in, even with the cache back.
    store.down.store(false, Ordering::SeqCst);
    assert!(limiter.settle(TENANT, &reservation, 100).await.unwrap());
    assert_eq!(fallbacks(&observer), ["local limit"; 2]);

    let (_, limiter, observer) = token_limiter(OnCacheUnavailable::Admit);
    let admitted = limiter.acquire_tokens(TENANT, 5000).await;
    assert!(
        matches!(admitted, Err(redstring::limiter::TokenAcquireError::Tokens(_))),
        "an estimate over the limit is refused before any store is asked"
    );
    let admitted = limiter.acquire_tokens(TENANT, 900).await.unwrap();
    assert_eq!(admitted.reservation, None);
    assert_eq!(deciders(&observer), [DecidedBy::Unlimited]);

    let (_, limiter, _) = token_limiter(OnCacheUnavailable::Refuse);
    assert!(matches!(
        limiter.acquire_tokens(TENANT, 100).await,
        Err(redstring::limiter::TokenAcquireError::Cache(
            CacheError::Unavailable { .. }
        ))
    ));
}
