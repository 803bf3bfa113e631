//! An observer that wants no events is never called: the limiter and the
//! breaker build no event for it and decide exactly as they do for one that
//! records everything. `TracingObserver` wants events only while a
//! `tracing` subscriber listens. An observer whose interest is fixed is
//! asked once, when the component is built, and never per decision.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use redstring::{
    CircuitBreaker, CircuitState, Env, Event, Interest, ManualClock, Observer, Permit, RateLimiter, RecordingObserver,
    TenantId, TracingObserver,
};

/// Counts the events it is handed, and says it wants none.
#[derive(Default)]
struct Deaf(AtomicUsize);

impl Observer for Deaf {
    fn on_event(&self, _: &Event) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    fn enabled(&self) -> bool {
        false
    }
}

/// Admissions and refusals by a limiter of 2 a minute and a breaker of
/// threshold 1, as `(admitted by the limiter, state after each step)`.
async fn decisions(observer: Arc<dyn Observer>) -> (Vec<bool>, Vec<CircuitState>) {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let env = Env::default().with_clock(clock.clone()).with_observer(observer);
    let limiter = RateLimiter::builder(2).env(env.clone()).build().unwrap();
    let breaker = CircuitBreaker::builder()
        .failure_threshold(1)
        .recovery_timeout(Duration::from_secs(5))
        .env(env)
        .build()
        .unwrap();
    let mut admitted = Vec::new();
    for _ in 0..3 {
        admitted.push(limiter.acquire(TenantId::from_u128(1)).await.is_ok());
    }
    let mut states = Vec::new();
    assert!(breaker.allow_request().await);
    breaker.record_failure().await.unwrap();
    states.push(breaker.state().await.unwrap());
    assert!(!breaker.allow_request().await);
    clock.advance(Duration::from_secs(5));
    assert!(breaker.allow_request().await);
    breaker.record_success().await.unwrap();
    states.push(breaker.state().await.unwrap());
    (admitted, states)
}

#[tokio::test]
async fn an_observer_that_wants_nothing_is_never_called_and_changes_no_decision() {
    let deaf = Arc::new(Deaf::default());
    let recording = Arc::new(RecordingObserver::new());
    let quiet = decisions(deaf.clone()).await;
    let heard = decisions(recording.clone()).await;
    assert_eq!(quiet, heard);
    assert_eq!(
        quiet,
        (vec![true, true, false], vec![CircuitState::Open, CircuitState::Closed])
    );
    assert_eq!(deaf.0.load(Ordering::SeqCst), 0, "no event built or handed over");
    assert!(recording.events().len() >= 8, "the same decisions, each an event");
}

/// Declares an interest, counts how often it is asked `enabled` and how
/// many events it is handed, and answers `enabled` with `listening`.
struct Declared {
    interest: Interest,
    listening: AtomicBool,
    asked: AtomicUsize,
    heard: AtomicUsize,
}

impl Declared {
    fn new(interest: Interest, listening: bool) -> Arc<Self> {
        Arc::new(Declared {
            interest,
            listening: AtomicBool::new(listening),
            asked: AtomicUsize::new(0),
            heard: AtomicUsize::new(0),
        })
    }
}

impl Observer for Declared {
    fn on_event(&self, _: &Event) {
        self.heard.fetch_add(1, Ordering::SeqCst);
    }

    fn enabled(&self) -> bool {
        self.asked.fetch_add(1, Ordering::SeqCst);
        self.listening.load(Ordering::SeqCst)
    }

    fn interest(&self) -> Interest {
        self.interest
    }
}

#[tokio::test]
async fn an_observer_whose_interest_is_fixed_is_never_asked_per_decision() {
    let recording = Arc::new(RecordingObserver::new());
    let expected = decisions(recording.clone()).await;
    let every_event = recording.events().len();

    let never = Declared::new(Interest::Never, false);
    assert_eq!(decisions(never.clone()).await, expected);
    assert_eq!(
        never.asked.load(Ordering::SeqCst),
        0,
        "a fixed `Never` is not asked again"
    );
    assert_eq!(never.heard.load(Ordering::SeqCst), 0);

    let always = Declared::new(Interest::Always, true);
    assert_eq!(decisions(always.clone()).await, expected);
    assert_eq!(
        always.asked.load(Ordering::SeqCst),
        0,
        "a fixed `Always` is not asked again"
    );
    assert_eq!(
        always.heard.load(Ordering::SeqCst),
        every_event,
        "every event, as the recorder got"
    );

    // Wrapped in another `Arc`, the interest is the inner observer's.
    let wrapped: Arc<Arc<Declared>> = Arc::new(Declared::new(Interest::Never, false));
    assert_eq!(wrapped.interest(), Interest::Never);
    assert_eq!(redstring::NoopObserver.interest(), Interest::Never);
    assert_eq!(recording.interest(), Interest::Always);
    assert_eq!(TracingObserver.interest(), Interest::Sometimes);
}

#[tokio::test]
async fn an_observer_whose_interest_may_change_is_asked_every_decision_and_heard_once_it_listens() {
    let sometimes = Declared::new(Interest::Sometimes, false);
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let limiter = RateLimiter::builder(10)
        .env(Env::default().with_clock(clock).with_observer(sometimes.clone()))
        .build()
        .unwrap();
    let tenant = TenantId::from_u128(1);
    limiter.acquire(tenant).await.unwrap();
    limiter.acquire(tenant).await.unwrap();
    assert_eq!(sometimes.asked.load(Ordering::SeqCst), 2, "asked once per decision");
    assert_eq!(
        sometimes.heard.load(Ordering::SeqCst),
        0,
        "not listening: nothing handed over"
    );

    sometimes.listening.store(true, Ordering::SeqCst);
    limiter.acquire(tenant).await.unwrap();
    limiter.acquire(tenant).await.unwrap();
    assert_eq!(sometimes.asked.load(Ordering::SeqCst), 4);
    assert_eq!(
        sometimes.heard.load(Ordering::SeqCst),
        2,
        "listening now: each decision's event"
    );
}

/// A subscriber that takes everything and keeps nothing.
struct Listening;

impl tracing::Subscriber for Listening {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn the_tracing_observer_wants_events_only_while_a_subscriber_listens() {
    assert!(!TracingObserver.enabled(), "no subscriber: nothing to build events for");
    tracing::subscriber::with_default(Listening, || assert!(TracingObserver.enabled()));
}

/// A breaker with default settings on a manual clock, observed by `observer`.
fn breaker_heard_by(observer: &Arc<Declared>) -> CircuitBreaker {
    CircuitBreaker::builder()
        .env(
            Env::default()
                .with_clock(Arc::new(ManualClock::at_fixed_epoch()))
                .with_observer(observer.clone()),
        )
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_breaker_asks_an_observer_whose_interest_may_change_at_each_step_and_is_heard_once_it_listens() {
    let sometimes = Declared::new(Interest::Sometimes, false);
    let breaker = breaker_heard_by(&sometimes);
    for step in 1..=2 {
        assert!(breaker.allow_request().await);
        breaker.record_success().await.unwrap();
        let permit = breaker.admit().await;
        assert_eq!(permit, Permit::Call);
        breaker.record_success_for(&permit).await.unwrap();
        assert!(
            sometimes.asked.load(Ordering::SeqCst) >= 4 * step,
            "asked at every step"
        );
    }
    assert_eq!(
        sometimes.heard.load(Ordering::SeqCst),
        0,
        "not listening: nothing handed over"
    );

    sometimes.listening.store(true, Ordering::SeqCst);
    assert!(breaker.allow_request().await);
    let after_allow = sometimes.heard.load(Ordering::SeqCst);
    assert!(after_allow >= 1, "listening now: the admission's event");
    assert_eq!(breaker.admit().await, Permit::Call);
    assert!(
        sometimes.heard.load(Ordering::SeqCst) > after_allow,
        "and the next admission's"
    );
}

#[tokio::test]
async fn an_observer_that_never_listens_still_hears_that_the_store_could_not_answer() {
    let never = Declared::new(Interest::Never, false);
    let breaker = breaker_heard_by(&never);
    assert!(breaker.allow_request().await);
    assert_eq!(
        never.heard.load(Ordering::SeqCst),
        0,
        "a decision's events are not built"
    );
    redstring::Cache::close(breaker.cache().as_ref()).await.unwrap();
    // The default `OnCacheError::Allow` admits, and says why.
    assert!(breaker.allow_request().await);
    assert_eq!(
        never.heard.load(Ordering::SeqCst),
        1,
        "the store's failure is reported whatever the interest"
    );
    assert_eq!(never.asked.load(Ordering::SeqCst), 0);
}
