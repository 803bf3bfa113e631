//! Slow start across a fleet: two workers, each with its own breakers over
//! a cache they share, race to close a recovered deployment's circuit. One
//! atomic step closes it and stores the instant; both then ramp from that
//! same instant, each call's draw deciding where it goes. Run here on one
//! `MemoryCache`, and on a real Redis in `redis_slow_start`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redstring::cache::BreakerStore;
use redstring::provider::{
    BoxFuture, Deployment, ExtractError, ExtractRequest, Extracted, HardenedProvider, LlmProvider, LlmProviderExt,
    SlowStart,
};
use redstring::{
    CircuitBreaker, CircuitState, Clock, Env, Event, ManualClock, MemoryCache, RateLimiter, RecordingObserver,
    RetryPolicy, SeededRandom, TenantId, Timestamp,
};
use serde_json::Value;
use tokio::sync::Barrier;

/// A server that answers every call, counting them; its first answer
/// waits at `gate` when it has one, so two workers' probes are both in
/// flight before either reports.
pub struct Counting {
    model: &'static str,
    calls: AtomicU32,
    gate: std::sync::Mutex<Option<Arc<Barrier>>>,
}

impl Counting {
    pub fn new(model: &'static str, gate: Option<Arc<Barrier>>) -> Arc<Counting> {
        Arc::new(Counting {
            model,
            calls: AtomicU32::new(0),
            gate: std::sync::Mutex::new(gate),
        })
    }

    pub fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

impl LlmProvider for Counting {
    fn model(&self) -> &str {
        self.model
    }
    fn extract_answer<'a>(
        &'a self,
        _: ExtractRequest<'a>,
        _: Option<Duration>,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let model = self.model.to_owned();
        let gate = self.gate.lock().unwrap_or_else(|p| p.into_inner()).take();
        Box::pin(async move {
            if let Some(gate) = gate {
                gate.wait().await;
            }
            Ok(Extracted {
                value: Value::from("Ann"),
                model,
                usage: None,
                quota: None,
            })
        })
    }
}

/// One worker: its providers (the recovering primary and the spare), the
/// primary's breaker, and what it observed.
pub struct Worker<C: BreakerStore + redstring::cache::TokenStore> {
    pub primary: Arc<Counting>,
    pub spare: Arc<Counting>,
    pub breaker: Arc<CircuitBreaker<C>>,
    pub provider: HardenedProvider<Arc<Counting>, C, C>,
    pub events: Arc<RecordingObserver>,
}

/// Worker `n` over `cache`: the primary behind `kg:circuit:ss-primary`
/// (opens on one failure, probes after `recovery`, two probes at once;
/// its first answer waits at `gate`), the spare behind its own breaker, in
/// that order, slow start over `window`, no retries.
pub fn worker<C>(
    cache: Arc<C>,
    env: Env,
    n: u64,
    gate: &Arc<Barrier>,
    recovery: Duration,
    window: Duration,
) -> Worker<C>
where
    C: BreakerStore + redstring::cache::TokenStore + redstring::cache::LimiterStore + 'static,
{
    let events = Arc::new(RecordingObserver::new());
    let env = env
        .with_rng(Arc::new(SeededRandom::from_seed(n)))
        .with_observer(events.clone());
    let breaker = |name: &str| {
        Arc::new(
            CircuitBreaker::builder()
                .key_prefix(name)
                .failure_threshold(1)
                .recovery_timeout(recovery)
                .half_open_max_calls(2)
                .env(env.clone())
                .cache(cache.clone())
                .build()
                .unwrap(),
        )
    };
    let (primary, spare) = (
        Counting::new("primary/m", Some(gate.clone())),
        Counting::new("spare/m", None),
    );
    let primary_breaker = breaker("kg:circuit:ss-primary");
    let limiter = Arc::new(
        RateLimiter::builder(100_000)
            .env(env.clone())
            .cache(cache.clone())
            .build()
            .unwrap(),
    );
    let provider = HardenedProvider::over(
        Deployment::new(primary.clone(), primary_breaker.clone()),
        TenantId::from_u128(u128::from(n)),
        limiter,
    )
    .deployment(Deployment::new(spare.clone(), breaker("kg:circuit:ss-spare")))
    .retry_policy(RetryPolicy::builder().max_retries(0).build().unwrap())
    .slow_start(SlowStart::new(window).unwrap())
    .env(env)
    .build();
    Worker {
        primary,
        spare,
        breaker: primary_breaker,
        provider,
        events,
    }
}

/// Each slow-start draw a worker reported: (closed_at, at, share, draw).
pub fn draws(events: &RecordingObserver) -> Vec<(Timestamp, Timestamp, u32, u32)> {
    events
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::SlowStartDraw {
                closed_at,
                at,
                share,
                draw,
                ..
            } => Some((closed_at, at, share, draw)),
            _ => None,
        })
        .collect()
}

/// The instants the primary's circuit closed from half-open, as reported.
pub fn closes(events: &RecordingObserver) -> Vec<Timestamp> {
    events
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::BreakerTransition {
                breaker,
                from: CircuitState::HalfOpen,
                to: CircuitState::Closed,
                at,
            } if &*breaker == "kg:circuit:ss-primary" => Some(at),
            _ => None,
        })
        .collect()
}

/// Both workers probe the recovered primary at once (both hold probes),
/// then each makes `calls` calls; checks that one close was written, that
/// every draw of both workers ramps from it, and that each call went where
/// its draw sent it. Returns the draws that took and those passed on.
pub async fn race_and_ramp<C>(fleet: &[Worker<C>; 2], calls: u32) -> (usize, usize)
where
    C: BreakerStore + redstring::cache::TokenStore + redstring::cache::LimiterStore + 'static,
{
    let (a, b) = tokio::join!(
        fleet[0].provider.extract::<String>("t", None),
        fleet[1].provider.extract::<String>("t", None)
    );
    assert_eq!((a.unwrap(), b.unwrap()), ("Ann".to_owned(), "Ann".to_owned()));
    for w in fleet {
        assert_eq!(w.primary.calls(), 1, "each worker's probe went to the primary");
        assert_eq!(w.breaker.state().await.unwrap(), CircuitState::Closed);
    }
    let mut all_closes: Vec<Timestamp> = fleet.iter().flat_map(|w| closes(&w.events)).collect();
    assert_eq!(all_closes.len(), 1, "one of the racing probes closed the circuit");
    let closed_at = all_closes.remove(0);
    for _ in 0..calls {
        for w in fleet {
            assert_eq!(w.provider.extract::<String>("t", None).await.unwrap(), "Ann");
        }
    }
    let (mut took, mut passed) = (0, 0);
    for (n, w) in fleet.iter().enumerate() {
        let drawn = draws(&w.events);
        assert_eq!(drawn.len(), calls as usize, "worker {n} drew once per call");
        for (from, _, share, draw) in &drawn {
            assert_eq!(*from, closed_at, "worker {n} ramps from the one stored close");
            assert!(*share >= 100_000 && *share <= 1_000_000, "{share}");
            let _ = draw;
        }
        let takes = drawn.iter().filter(|(_, _, share, draw)| draw < share).count();
        assert_eq!(
            w.primary.calls() as usize,
            1 + takes,
            "worker {n}: each take went to the primary"
        );
        assert_eq!(
            w.spare.calls() as usize,
            drawn.len() - takes,
            "worker {n}: each pass went to the spare"
        );
        took += takes;
        passed += drawn.len() - takes;
    }
    (took, passed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_over_one_memory_cache_ramp_from_the_one_close() {
    let clock = Arc::new(ManualClock::new(Timestamp::from_secs(1_000_000)));
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let env = Env::default().with_clock(clock.clone());
    let recovery = Duration::from_secs(30);
    let gate = Arc::new(Barrier::new(2));
    let fleet = [
        worker(cache.clone(), env.clone(), 1, &gate, recovery, Duration::from_secs(60)),
        worker(cache.clone(), env.clone(), 2, &gate, recovery, Duration::from_secs(60)),
    ];
    fleet[0].breaker.record_failure().await.unwrap();
    clock.advance(recovery);
    let closed_at = clock.now();
    let (took, passed) = race_and_ramp(&fleet, 40).await;
    // At the close the share is the floor, 10 %: most calls went to the spare.
    assert!(took > 0 && passed > took, "took {took}, passed {passed}");
    // Halfway through the window both take half; after it, no draw.
    clock.advance(Duration::from_secs(30));
    let before = draws(&fleet[0].events).len();
    fleet[0].provider.extract::<String>("t", None).await.unwrap();
    let drawn = draws(&fleet[0].events);
    assert_eq!(drawn[before].2, 500_000);
    assert_eq!(drawn[before].0, closed_at);
    clock.advance(Duration::from_secs(30));
    let primary = fleet[1].primary.calls();
    fleet[1].provider.extract::<String>("t", None).await.unwrap();
    assert_eq!(draws(&fleet[1].events).len(), 40, "no draw once the window is over");
    assert_eq!(fleet[1].primary.calls(), primary + 1);
}

/// One worker over its own cache whose primary has just closed at the
/// clock's instant (opened, probed, the probe answered).
async fn recovered(window: Duration) -> (Arc<ManualClock>, Worker<MemoryCache>) {
    let clock = Arc::new(ManualClock::new(Timestamp::from_secs(1_000_000)));
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let env = Env::default().with_clock(clock.clone());
    let recovery = Duration::from_secs(30);
    let w = worker(cache, env, 7, &Arc::new(Barrier::new(1)), recovery, window);
    w.breaker.record_failure().await.unwrap();
    clock.advance(recovery);
    w.provider.extract::<String>("t", None).await.unwrap();
    assert_eq!(w.breaker.state().await.unwrap(), CircuitState::Closed);
    (clock, w)
}

#[tokio::test]
async fn a_call_passed_on_that_no_other_deployment_admits_goes_to_the_ramping_one() {
    let (_clock, w) = recovered(Duration::from_secs(60)).await;
    // The spare's circuit is open: it refuses every call passed to it.
    let spare = w.provider.deployments()[1].breaker().clone();
    spare.record_failure().await.unwrap();
    for _ in 0..30 {
        assert_eq!(w.provider.extract::<String>("t", None).await.unwrap(), "Ann");
    }
    let drawn = draws(&w.events);
    assert_eq!(drawn.len(), 30);
    assert!(
        drawn.iter().any(|(_, _, share, draw)| draw >= share),
        "some were passed on"
    );
    assert_eq!(w.primary.calls(), 31, "every call came back to the primary");
    assert_eq!(w.spare.calls(), 0);
}

#[tokio::test]
async fn a_ramp_draws_nothing_before_a_close_or_with_one_deployment() {
    // A primary that never opened has no close to ramp from.
    let clock = Arc::new(ManualClock::new(Timestamp::from_secs(1_000_000)));
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let env = Env::default().with_clock(clock.clone());
    let w = worker(
        cache,
        env.clone(),
        3,
        &Arc::new(Barrier::new(1)),
        Duration::from_secs(30),
        Duration::from_secs(60),
    );
    for _ in 0..5 {
        w.provider.extract::<String>("t", None).await.unwrap();
    }
    assert!(draws(&w.events).is_empty());
    assert_eq!((w.primary.calls(), w.spare.calls()), (5, 0));

    // One deployment: nowhere else to send a call, so nothing is drawn.
    let events = Arc::new(RecordingObserver::new());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let env = env.with_observer(events.clone());
    let breaker = Arc::new(
        CircuitBreaker::builder()
            .key_prefix("kg:circuit:alone")
            .failure_threshold(1)
            .recovery_timeout(Duration::from_secs(30))
            .env(env.clone())
            .cache(cache.clone())
            .build()
            .unwrap(),
    );
    let limiter = Arc::new(
        RateLimiter::builder(1000)
            .env(env.clone())
            .cache(cache)
            .build()
            .unwrap(),
    );
    let alone = Counting::new("alone/m", None);
    let provider = HardenedProvider::builder(alone.clone(), TenantId::from_u128(1), limiter, breaker.clone())
        .slow_start(SlowStart::new(Duration::from_secs(60)).unwrap())
        .env(env)
        .build();
    breaker.record_failure().await.unwrap();
    clock.advance(Duration::from_secs(30));
    for _ in 0..5 {
        provider.extract::<String>("t", None).await.unwrap();
    }
    assert_eq!(breaker.state().await.unwrap(), CircuitState::Closed);
    assert!(draws(&events).is_empty());
    assert_eq!(alone.calls(), 5);
}

#[tokio::test]
async fn the_share_follows_the_curve_from_the_close_on_the_clock() {
    let (clock, w) = recovered(Duration::from_secs(100)).await;
    let closed_at = clock.now();
    let mut expected = Vec::new();
    for (after_s, share) in [(0, 100_000), (5, 100_000), (25, 250_000), (80, 800_000), (99, 990_000)] {
        clock.set(closed_at.saturating_add(Duration::from_secs(after_s)));
        w.provider.extract::<String>("t", None).await.unwrap();
        expected.push((closed_at, clock.now(), share));
    }
    let drawn: Vec<_> = draws(&w.events).into_iter().map(|(c, at, s, _)| (c, at, s)).collect();
    assert_eq!(drawn, expected);
    clock.set(closed_at.saturating_add(Duration::from_secs(100)));
    w.provider.extract::<String>("t", None).await.unwrap();
    assert_eq!(draws(&w.events).len(), 5, "the ramp ends with its window");
}

/// Answers every call with a transient error, counting them.
struct Failing(AtomicU32);

impl LlmProvider for Failing {
    fn model(&self) -> &str {
        "failing/m"
    }
    fn extract_answer<'a>(
        &'a self,
        _: ExtractRequest<'a>,
        _: Option<Duration>,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async {
            Err(ExtractError::Provider(redstring::provider::ProviderError::Transport {
                kind: redstring::provider::TransportErrorKind::Connect,
                detail: "refused".into(),
            }))
        })
    }
}

#[tokio::test]
async fn a_retry_that_comes_back_to_a_deployment_a_ramp_passed_over_is_not_admitted_again() {
    let clock = Arc::new(ManualClock::new(Timestamp::from_secs(1_000_000)));
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let events = Arc::new(RecordingObserver::new());
    let env = Env::default()
        .with_clock(clock.clone())
        .with_rng(Arc::new(SeededRandom::from_seed(11)))
        .with_observer(events.clone());
    let breaker = |name: &str, threshold: u32| {
        Arc::new(
            CircuitBreaker::builder()
                .key_prefix(name)
                .failure_threshold(threshold)
                .recovery_timeout(Duration::from_secs(30))
                .env(env.clone())
                .cache(cache.clone())
                .build()
                .unwrap(),
        )
    };
    let primary_breaker = breaker("kg:circuit:ss-primary", 1);
    let (primary, failing) = (Counting::new("primary/m", None), Arc::new(Failing(AtomicU32::new(0))));
    let limiter = Arc::new(
        RateLimiter::builder(100_000)
            .env(env.clone())
            .cache(cache.clone())
            .build()
            .unwrap(),
    );
    let provider = HardenedProvider::over(
        Deployment::new(primary.clone() as Arc<dyn LlmProvider>, primary_breaker.clone()),
        TenantId::from_u128(1),
        limiter,
    )
    .deployment(Deployment::new(
        failing.clone() as Arc<dyn LlmProvider>,
        breaker("kg:circuit:ss-failing", 1000),
    ))
    .retry_policy(RetryPolicy::builder().max_retries(1).build().unwrap())
    .slow_start(SlowStart::new(Duration::from_secs(600)).unwrap())
    .env(env)
    .build();
    // Close the primary's circuit through a probe.
    primary_breaker.record_failure().await.unwrap();
    clock.advance(Duration::from_secs(30));
    provider.extract::<String>("t", None).await.unwrap();
    events.take();
    for _ in 0..20 {
        let _ = provider.extract::<String>("t", None).await;
        let call = events.take();
        let admissions = call
            .iter()
            .filter(|e| matches!(e, Event::BreakerAllowed { breaker, .. } if &**breaker == "kg:circuit:ss-primary"))
            .count();
        assert_eq!(admissions, 1, "one admission at the primary per call: {call:?}");
    }
    assert!(
        failing.0.load(Ordering::SeqCst) > 0,
        "some calls were passed to the failing spare"
    );
    assert!(primary.calls() > 10, "and their retries came back to the primary");
}
