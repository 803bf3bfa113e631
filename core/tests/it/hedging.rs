//! Hedged requests paid from a retry budget two workers share: each
//! worker's calls race on their own breakers and budget handle over one
//! store, every call's attempt lags past the hedge delay, and the budget
//! holds exactly five retries with nothing added — so exactly five hedges
//! are sent between them, however their withdrawals interleave, on a
//! `MemoryCache` and on a real Redis.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use redstring::cache::{BreakerStore, BudgetStore, KeyValue};
use redstring::decide::budget::{BudgetCommand, BudgetState, MICROS_PER_RETRY};
use redstring::provider::{
    BoxFuture, Deployment, ExtractError, ExtractRequest, Extracted, HardenedProvider, HedgeAfter, LlmProvider,
    LlmProviderExt,
};
use redstring::{
    CircuitBreaker, Env, Event, ManualClock, MemoryCache, RateLimiter, RecordingObserver, RetryBudget, RetryPolicy,
    TenantId, Timestamp,
};
use serde_json::Value;

/// The budget both workers withdraw from.
const BUDGET: &str = "kg:retrybudget:hedging";
/// The retries it holds when the race starts.
const HELD: u64 = 5;
/// Calls per worker.
const CALLS: u32 = 10;

/// A server answering each call on its `polls`-th poll (a reply on its
/// way), counting calls and replies dropped before they came.
struct Lagging {
    model: &'static str,
    polls: u32,
    calls: AtomicU32,
    cancelled: Arc<AtomicU32>,
}

impl Lagging {
    fn new(model: &'static str, polls: u32) -> Arc<Lagging> {
        Arc::new(Lagging {
            model,
            polls,
            calls: AtomicU32::new(0),
            cancelled: Arc::new(AtomicU32::new(0)),
        })
    }
}

struct Reply {
    model: &'static str,
    polls: u32,
    done: bool,
    cancelled: Arc<AtomicU32>,
}

impl Future for Reply {
    type Output = Result<Extracted<Value>, ExtractError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.polls == 0 {
            self.done = true;
            return Poll::Ready(Ok(Extracted {
                value: Value::from("Ann"),
                model: self.model.to_owned(),
                usage: None,
                quota: None,
            }));
        }
        self.polls -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if !self.done {
            self.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl LlmProvider for Lagging {
    fn model(&self) -> &str {
        self.model
    }
    fn extract_answer<'a>(
        &'a self,
        _: ExtractRequest<'a>,
        _: Option<Duration>,
    ) -> BoxFuture<'a, Result<Extracted<Value>, ExtractError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(Reply {
            model: self.model,
            polls: self.polls,
            done: false,
            cancelled: self.cancelled.clone(),
        })
    }
}

/// Two workers, each over its own store handle from `caches`, race
/// [`CALLS`] calls each with a 100 ms hedge; the tail answers on its
/// tenth poll, after the delay (a manual sleep is done on its second), so
/// every call asks for a hedge and only the budget decides.
async fn two_workers_hedge_exactly_what_the_budget_holds<S>(caches: [Arc<S>; 2], clock: Arc<ManualClock>)
where
    S: BreakerStore + BudgetStore + KeyValue + 'static,
{
    let held = BudgetState {
        balance: HELD * MICROS_PER_RETRY,
        stamp: Timestamp::EPOCH,
    };
    caches[0].set(BUDGET, &held.encode(), None).await.unwrap();
    let (tail, spare) = (Lagging::new("tail/m", 10), Lagging::new("spare/m", 0));
    let events = Arc::new(RecordingObserver::new());
    let env = Env::default().with_clock(clock.clone()).with_observer(events.clone());
    let mut workers = Vec::new();
    for (worker, cache) in caches.into_iter().enumerate() {
        let breaker = |name: &str| {
            Arc::new(
                CircuitBreaker::builder()
                    .key_prefix(format!("kg:circuit:{name}"))
                    .failure_threshold(5)
                    .env(env.clone())
                    .cache(cache.clone())
                    .build()
                    .unwrap(),
            )
        };
        // Nothing refills it: no deposit, no floor.
        let budget = Arc::new(
            RetryBudget::builder()
                .key(BUDGET)
                .ratio(0.0)
                .min_retries_per_sec(0)
                .max_balance(u32::try_from(HELD).unwrap())
                .env(env.clone())
                .cache(cache.clone())
                .build()
                .unwrap(),
        );
        let limiter = Arc::new(
            RateLimiter::builder(100_000)
                .env(env.clone())
                .cache(Arc::new(MemoryCache::new(clock.clone())))
                .build()
                .unwrap(),
        );
        let provider = HardenedProvider::over(
            Deployment::new(tail.clone(), breaker("tail")),
            TenantId::from_u128(worker as u128),
            limiter,
        )
        .deployment(Deployment::new(spare.clone(), breaker("spare")))
        .retry_policy(RetryPolicy::builder().max_retries(0).build().unwrap())
        .retry_budget(budget)
        .env(env.clone())
        .hedge(HedgeAfter::Fixed(Duration::from_millis(100)), 1)
        .unwrap()
        .build();
        workers.push(tokio::spawn(async move {
            let mut models = Vec::new();
            for _ in 0..CALLS {
                models.push(provider.extract_with_model::<String>("t", None).await.unwrap().model);
            }
            models
        }));
    }
    let mut models = Vec::new();
    for worker in workers {
        models.extend(
            tokio::time::timeout(Duration::from_secs(60), worker)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let hedged = u32::try_from(HELD).unwrap();
    let by_spare = models.iter().filter(|m| *m == "spare/m").count();
    assert_eq!(by_spare, HELD as usize, "{models:?}");
    assert_eq!(
        spare.calls.load(Ordering::SeqCst),
        hedged,
        "a hedge for each retry held, no more"
    );
    assert_eq!(tail.calls.load(Ordering::SeqCst), 2 * CALLS);
    assert_eq!(
        tail.cancelled.load(Ordering::SeqCst),
        hedged,
        "each won hedge cancels the tail"
    );
    let withdrawals = |granted: bool| {
        events
            .events()
            .into_iter()
            .filter(|e| {
                matches!(e, Event::RetryBudgetStep { command: BudgetCommand::Withdraw, granted: g, .. } if *g == granted)
            })
            .count()
    };
    let (granted, denied) = (withdrawals(true), withdrawals(false));
    assert_eq!((granted, denied), (HELD as usize, 2 * CALLS as usize - HELD as usize));
    let hedges = events
        .events()
        .into_iter()
        .filter(|e| matches!(e, Event::Hedged { .. }))
        .count();
    assert_eq!(hedges, HELD as usize);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_over_one_memory_cache_hedge_exactly_what_their_budget_holds() {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    two_workers_hedge_exactly_what_the_budget_holds([cache.clone(), cache], clock).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_over_one_redis_hedge_exactly_what_their_budget_holds() {
    use crate::support::redis::LiveRedis;
    let Some(server) = testkit::redis::RedisServer::start() else {
        return;
    };
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    // Each worker its own connection, as processes have.
    two_workers_hedge_exactly_what_the_budget_holds([Arc::new(server.cache()), Arc::new(server.cache())], clock).await;
}
