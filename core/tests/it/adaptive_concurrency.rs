//! Adaptive concurrency through the hardened provider: a deployment at its
//! limit is skipped for the next one (or the call ends unsent with a typed
//! error), an overload backs the limit off and busy answers grow it, and
//! two providers over one store share one limit, and a reserve keeps part
//! of it from low-priority calls — on a `MemoryCache` on a manual clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redstring::decide::concurrency::{AdaptiveConcurrency, CallEnd, UNIT};
use redstring::provider::{
    BoxFuture, Deployment, ExtractError, ExtractRequest, Extracted, HardenedProvider, LlmProvider, LlmProviderExt,
    ProviderError,
};
use redstring::{
    CircuitBreaker, Env, Event, ManualClock, MemoryCache, Priority, RateLimiter, RecordingObserver, RetryPolicy,
    TenantId,
};
use serde_json::Value;
use tokio::sync::Semaphore;

/// What a server does with each call.
#[derive(Clone, Copy)]
enum Behaviour {
    /// Answers once the gate lets it.
    Gated,
    /// Answers 503 at once.
    Overloaded,
    /// Answers at once.
    Answers,
}

struct Server {
    model: &'static str,
    behaviour: Behaviour,
    gate: Arc<Semaphore>,
    calls: AtomicU32,
}

impl Server {
    fn new(model: &'static str, behaviour: Behaviour) -> Arc<Server> {
        Arc::new(Server {
            model,
            behaviour,
            gate: Arc::new(Semaphore::new(0)),
            calls: AtomicU32::new(0),
        })
    }
}

impl LlmProvider for Server {
    fn model(&self) -> &str {
        self.model
    }
    fn extract_answer<'a>(
        &'a self,
        _: ExtractRequest<'a>,
        _: Option<Duration>,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            match self.behaviour {
                Behaviour::Gated => self.gate.acquire().await.expect("open").forget(),
                Behaviour::Overloaded => {
                    return Err(ExtractError::Provider(ProviderError::Unavailable {
                        retry_after: None,
                        message: "busy".into(),
                    }));
                }
                Behaviour::Answers => {}
            }
            Ok(Extracted {
                value: Value::from("Ann"),
                model: self.model.to_owned(),
                usage: None,
                quota: None,
            })
        })
    }
}

struct World {
    clock: Arc<ManualClock>,
    cache: Arc<MemoryCache>,
    events: Arc<RecordingObserver>,
}

impl World {
    fn new() -> World {
        let clock = Arc::new(ManualClock::new(redstring::Timestamp::from_secs(1_000)));
        World {
            cache: Arc::new(MemoryCache::new(clock.clone())),
            clock,
            events: Arc::new(RecordingObserver::new()),
        }
    }

    fn env(&self) -> Env {
        Env::default()
            .with_clock(self.clock.clone())
            .with_observer(self.events.clone())
    }

    fn deployment(&self, server: &Arc<Server>) -> Deployment<Arc<Server>> {
        let breaker = CircuitBreaker::builder()
            .key_prefix(format!("kg:circuit:{}", server.model))
            .env(self.env())
            .cache(self.cache.clone())
            .build()
            .unwrap();
        Deployment::new(server.clone(), Arc::new(breaker))
    }

    /// A provider over `servers` (the first the primary), no retries.
    fn provider(&self, servers: &[&Arc<Server>], settings: AdaptiveConcurrency) -> HardenedProvider<Arc<Server>> {
        self.provider_as(servers, settings, Priority::High)
    }

    /// A provider over `servers` asking as `priority`, no retries.
    fn provider_as(
        &self,
        servers: &[&Arc<Server>],
        settings: AdaptiveConcurrency,
        priority: Priority,
    ) -> HardenedProvider<Arc<Server>> {
        let limiter = Arc::new(RateLimiter::builder(100_000).env(self.env()).build().unwrap());
        let mut builder = HardenedProvider::over(self.deployment(servers[0]), TenantId::from_u128(7), limiter);
        for server in &servers[1..] {
            builder = builder.deployment(self.deployment(server));
        }
        builder
            .retry_policy(RetryPolicy::builder().max_retries(0).build().unwrap())
            .env(self.env())
            .adaptive_concurrency(settings)
            .priority(priority)
            .build()
    }
}

async fn until_calls(server: &Server, n: u32) {
    while server.calls.load(Ordering::SeqCst) < n {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_deployment_at_its_limit_is_skipped_for_the_next_one() {
    let world = World::new();
    let (gpu, spare) = (
        Server::new("gpu/m", Behaviour::Gated),
        Server::new("spare/m", Behaviour::Answers),
    );
    let provider = Arc::new(world.provider(&[&gpu, &spare], AdaptiveConcurrency::new(1, 1, 4).unwrap()));
    let first = tokio::spawn({
        let provider = provider.clone();
        async move { provider.extract_with_model::<String>("t", None).await }
    });
    until_calls(&gpu, 1).await;
    let second = provider.extract_with_model::<String>("t", None).await.unwrap();
    assert_eq!(second.model, "spare/m", "the primary had its one call in flight");
    assert_eq!(gpu.calls.load(Ordering::SeqCst), 1, "nothing more was sent there");
    gpu.gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap().model, "gpu/m");
    let refused: Vec<_> = world
        .events
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::ConcurrencyRefused {
                breaker,
                in_flight,
                limit,
                ..
            } => Some((breaker.to_string(), in_flight, limit)),
            _ => None,
        })
        .collect();
    assert_eq!(refused, [("kg:circuit:gpu/m".to_owned(), 1, 1)]);
}

#[tokio::test]
async fn a_lone_deployment_at_its_limit_ends_the_attempt_unsent_with_a_typed_error() {
    let world = World::new();
    let gpu = Server::new("gpu/m", Behaviour::Gated);
    let provider = Arc::new(world.provider(&[&gpu], AdaptiveConcurrency::new(2, 1, 4).unwrap()));
    let held: Vec<_> = (0..2)
        .map(|_| {
            let provider = provider.clone();
            tokio::spawn(async move { provider.extract_with_model::<String>("t", None).await })
        })
        .collect();
    until_calls(&gpu, 2).await;
    let refused = provider.extract_with_model::<String>("t", None).await.unwrap_err();
    // Retryable, but no retries are configured: the schedule ran out on it.
    let ExtractError::RetryExhausted(exhausted) = &refused else {
        panic!("expected RetryExhausted, got {refused:?}");
    };
    match exhausted.last.as_ref() {
        ExtractError::ConcurrencyLimited(e) => {
            assert_eq!((e.model.as_str(), e.in_flight, e.limit), ("gpu/m", 2, 2));
            assert_eq!(exhausted.last.kind(), "concurrency_limited");
        }
        other => panic!("expected ConcurrencyLimited, got {other:?}"),
    }
    assert_eq!(gpu.calls.load(Ordering::SeqCst), 2, "the refused call sent nothing");
    gpu.gate.add_permits(2);
    for call in held {
        call.await.unwrap().unwrap();
    }
    // Both ended: a call is admitted again.
    let provider_calls = gpu.calls.load(Ordering::SeqCst);
    gpu.gate.add_permits(1);
    provider.extract_with_model::<String>("t", None).await.unwrap();
    assert_eq!(gpu.calls.load(Ordering::SeqCst), provider_calls + 1);
}

#[tokio::test]
async fn an_overload_backs_off_the_limit_every_provider_over_the_store_shares() {
    let world = World::new();
    let settings = AdaptiveConcurrency::new(8, 1, 16).unwrap().backoff(0.5).unwrap();
    let busy = Server::new("gpu/m", Behaviour::Overloaded);
    let one = world.provider(&[&busy], settings);
    let e = one.extract_with_model::<String>("t", None).await.unwrap_err();
    assert!(
        matches!(e.provider_error(), Some(ProviderError::Unavailable { .. })),
        "{e:?}"
    );
    // Another worker's provider, over the same store, at the same server.
    let fine = Server::new("gpu/m", Behaviour::Answers);
    let other = world.provider(&[&fine], settings);
    other.extract_with_model::<String>("t", None).await.unwrap();
    let steps: Vec<_> = world
        .events
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::ConcurrencyAdmitted { limit, in_flight, .. } => Some(format!("admitted {in_flight}/{limit}")),
            Event::ConcurrencyEnded {
                end, counted, from, to, ..
            } => Some(format!("{end:?} {counted} {from}->{to}")),
            _ => None,
        })
        .collect();
    let (eight, four) = (8 * UNIT, 4 * UNIT);
    let grown = 4 * UNIT + UNIT / 4;
    assert_eq!(
        steps,
        [
            "admitted 0/8".to_owned(),
            format!("{:?} true {eight}->{four}", CallEnd::Overload),
            "admitted 0/4".to_owned(),
            format!("{:?} true {four}->{four}", CallEnd::Success),
        ],
        "the 503 halved the shared limit; a success with 1 of 4 in flight is not busy ({grown} would be)"
    );
}

#[tokio::test]
async fn low_priority_calls_leave_the_reserved_calls_to_high_priority_ones() {
    let world = World::new();
    let gpu = Server::new("gpu/m", Behaviour::Gated);
    // A limit of 4 keeping a quarter, one call, for the high class.
    let settings = AdaptiveConcurrency::new(4, 2, 8).unwrap().reserve(0.25).unwrap();
    let batch = Arc::new(world.provider_as(&[&gpu], settings, Priority::Low));
    let interactive = Arc::new(world.provider_as(&[&gpu], settings, Priority::High));
    let call = |p: &Arc<HardenedProvider<Arc<Server>>>| {
        let p = p.clone();
        tokio::spawn(async move { p.extract_with_model::<String>("t", None).await })
    };
    let held: Vec<_> = (0..3).map(|_| call(&batch)).collect();
    until_calls(&gpu, 3).await;
    let refused = batch.extract_with_model::<String>("t", None).await.unwrap_err();
    let ExtractError::RetryExhausted(exhausted) = &refused else {
        panic!("expected RetryExhausted, got {refused:?}");
    };
    let ExtractError::ConcurrencyLimited(e) = exhausted.last.as_ref() else {
        panic!("expected ConcurrencyLimited, got {:?}", exhausted.last);
    };
    assert_eq!((e.priority, e.in_flight, e.limit, e.reserved), (Priority::Low, 3, 4, 1));
    assert_eq!(
        e.to_string(),
        "deployment gpu/m has 3 calls in flight, at its adaptive limit of 4 less 1 kept for high priority"
    );
    assert_eq!(gpu.calls.load(Ordering::SeqCst), 3, "the refused low call sent nothing");
    // The reserved call is there for an interactive one.
    let urgent = call(&interactive);
    until_calls(&gpu, 4).await;
    gpu.gate.add_permits(4);
    urgent.await.unwrap().unwrap();
    for c in held {
        c.await.unwrap().unwrap();
    }
    let classes: Vec<_> = world
        .events
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::ConcurrencyAdmitted {
                priority, in_flight, ..
            } => Some(format!("admitted {priority:?} {in_flight}")),
            Event::ConcurrencyRefused {
                priority, in_flight, ..
            } => Some(format!("refused {priority:?} {in_flight}")),
            _ => None,
        })
        .collect();
    assert_eq!(
        classes,
        [
            "admitted Low 0",
            "admitted Low 1",
            "admitted Low 2",
            "refused Low 3",
            "admitted High 3"
        ]
    );
}
