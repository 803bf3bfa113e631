//! Two workers sharing one deployment and one cache: each a
//! `HardenedProvider` over the real `OpenAiCompatible` adapter, whose
//! transport answers from a script and counts what reached the "server".
//! `shared_cooldown.rs` runs them over a `MemoryCache`, `redis_cooldown.rs`
//! over Redis.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redstring::cache::{BreakerStore, TokenStore};
use redstring::provider::{
    BoxFuture, HardenedProvider, HttpRequest, HttpResponse, HttpTransport, OpenAiCompatible, TransportError,
};
use redstring::{
    CircuitBreaker, Env, ManualClock, RateLimiter, RecordingObserver, RetryPolicy, SeededRandom, TenantId,
};

/// The breaker prefix both workers share: one deployment.
pub const PREFIX: &str = "kg:circuit:qwen3";

/// A transport answering from a queue (a completion once it is empty),
/// counting the requests that reached it.
#[derive(Clone, Default)]
pub struct Scripted {
    replies: Arc<Mutex<VecDeque<HttpResponse>>>,
    calls: Arc<AtomicUsize>,
}

impl Scripted {
    /// Queues one reply.
    pub fn push(&self, reply: HttpResponse) -> &Self {
        self.replies.lock().unwrap().push_back(reply);
        self
    }

    /// Requests that reached the server so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl HttpTransport for Scripted {
    fn post(&self, _: HttpRequest) -> BoxFuture<'_, Result<HttpResponse, TransportError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let reply = self.replies.lock().unwrap().pop_front().unwrap_or_else(|| ok(&[]));
        Box::pin(async move { Ok(reply) })
    }
}

/// A completion answering `"Ann"`, with `headers`.
pub fn ok(headers: &[(&str, &str)]) -> HttpResponse {
    let body = serde_json::json!({
        "model": "qwen3",
        "choices": [{"message": {"role": "assistant", "content": "\"Ann\""}, "finish_reason": "stop"}],
    });
    respond(200, headers, &body.to_string())
}

/// OpenAI's 429 for a spent rate limit, with `headers`.
pub fn rate_limited(headers: &[(&str, &str)]) -> HttpResponse {
    let body =
        r#"{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}"#;
    respond(429, headers, body)
}

pub fn respond(status: u16, headers: &[(&str, &str)], body: &str) -> HttpResponse {
    HttpResponse {
        status,
        headers: headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect(),
        body: body.as_bytes().to_vec(),
    }
}

/// One worker: its own limiter (its own tenant), its own breaker handle on
/// the shared cache and prefix, its own connection to the deployment.
pub struct Worker<C> {
    pub provider: HardenedProvider<OpenAiCompatible<Scripted>, C, C>,
    pub breaker: Arc<CircuitBreaker<C>>,
    pub server: Scripted,
}

/// Builds a worker over `cache` with no retries, jitter off, and at most
/// `cooldown_waits` cooldown refusals slept off.
pub fn worker<C: BreakerStore + TokenStore>(
    cache: Arc<C>,
    clock: &Arc<ManualClock>,
    observer: &Arc<RecordingObserver>,
    tenant: u128,
    cooldown_waits: u32,
) -> Worker<C> {
    let env = Env::default().with_clock(clock.clone()).with_observer(observer.clone());
    let limiter = Arc::new(
        RateLimiter::builder(100)
            .env(env.clone())
            .cache(cache.clone())
            .build()
            .unwrap(),
    );
    let breaker = Arc::new(
        CircuitBreaker::builder()
            .failure_threshold(2)
            .key_prefix(PREFIX)
            .env(env.clone())
            .cache(cache)
            .build()
            .unwrap(),
    );
    let server = Scripted::default();
    let adapter = OpenAiCompatible::builder("http://deployment.test/v1", "qwen3")
        .env(Env::default().with_clock(clock.clone()))
        .build_with(server.clone())
        .unwrap();
    let provider = HardenedProvider::builder(adapter, TenantId::from_u128(tenant), limiter, breaker.clone())
        .retry_policy(RetryPolicy::builder().max_retries(0).jitter(0.0).build().unwrap())
        .env(env.with_rng(Arc::new(SeededRandom::from_seed(tenant as u64))))
        .cooldown_waits(cooldown_waits)
        .deadline(Duration::from_secs(60))
        .build();
    Worker {
        provider,
        breaker,
        server,
    }
}
