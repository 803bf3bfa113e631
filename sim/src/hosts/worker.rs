//! Workers: one fleet member, its tenants' load, and the real hardened
//! provider between them and a model server, on a turmoil host it may share
//! with other workers (`world::layout`) — or, in the laboratory
//! (`lab::run`), on a real runtime over real HTTP ([`Net::Real`]), the same
//! code on real time.
//!
//! Each worker builds exactly what a production process would — a limiter, a
//! breaker, the OpenAI-compatible adapter and the hardened provider composing
//! them — from the scenario's configuration, on its own skewed clock, with the
//! simulated network underneath. Load is open loop — each tenant's calls
//! arrive as a Poisson process (seeded), whether or not earlier calls have
//! finished, which is what makes an outage pile up — or closed loop: a fixed
//! number of clients, each waiting for its call to end and thinking before
//! the next, whose load falls as latency grows.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp};
use redstring::cache::{BreakerStore, BudgetStore, InFlightStore, TokenStore};
use redstring::provider::{
    BoxFuture, Deployment, ExtractRequest, HardenedProvider, HedgeAfter, HttpRequest, HttpResponse, HttpTransport,
    LlmProvider, OpenAiCompatible, OutputSchema, TransportError,
};
use redstring::{CircuitBreaker, Env, RateLimiter, SeededRandom, TenantId};
use tokio::task::JoinHandle;

use crate::evidence::observe::{DEPLOYMENT_LIMIT_PREFIX, HostObserver};
use crate::evidence::outcome::CallOutcome;
use crate::evidence::trace::{self, CallEnded, HostTrace, Kind, Trace};
use crate::hosts::RequestTokens;
use crate::hosts::clock::{SimClock, sim_elapsed};
use crate::hosts::transport::{Addresses, ConnectionLimit, SimTransport};
use crate::scenario::limits::MAX_TRACE_TOKENS;
use crate::scenario::{Burst, Hardening, HedgeAfterMs, Routing, Spread, TenantLoad};
use crate::world::seeds;

/// The record every simulated extraction asks for.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[allow(dead_code)] // the fields are what the schema is made of
pub struct Extraction {
    /// The entity's name.
    pub name: String,
    /// How sure the model is.
    pub confidence: f64,
}

/// The text every simulated extraction sends.
pub const REQUEST_TEXT: &str = "Ada Lovelace wrote the first program.";

/// The system prompt every simulated extraction sends.
pub const REQUEST_SYSTEM_PROMPT: &str = "Extract the person named.";

tokio::task_local! {
    /// Requests the current call has sent, counted by [`CountingTransport`].
    static ATTEMPTS: Cell<u32>;
    /// How long the current call's last request took to be answered on the
    /// worker's clock, when [`CountingTransport`] times them.
    static ANSWERED: Cell<Option<Duration>>;
    /// The current call's own token counts: a replayed trace's request's,
    /// or a draw from its tenant's distributions.
    static TOKENS: Option<RequestTokens>;
}

/// A call's token estimate: its own prompt tokens (a replayed request's, or
/// its tenant's draw) plus `max_tokens`, as a client that counts its prompt
/// would reserve; the core's default estimate from the text when the call
/// has none of its own.
fn call_estimate(request: &redstring::provider::ExtractRequest<'_>, max_tokens: u32) -> u64 {
    match TOKENS.try_with(|t| t.and_then(|t| t.prompt)) {
        Ok(Some(prompt)) => prompt.saturating_add(u64::from(max_tokens)),
        _ => redstring::provider::default_token_estimate(request, Some(max_tokens)),
    }
}

/// Counts each request against the call whose task sends it, and tells the
/// server the call's own token counts; with a clock (under a slow-call
/// threshold), times each request from its send to its answer on it.
struct CountingTransport(Box<dyn HttpTransport>, String, Option<Arc<dyn redstring::Clock>>);

impl HttpTransport for CountingTransport {
    fn post(&self, mut request: HttpRequest) -> BoxFuture<'_, Result<HttpResponse, TransportError>> {
        let _ = ATTEMPTS.try_with(|n| n.set(n.get() + 1));
        if let Ok(Some(tokens)) = TOKENS.try_with(|t| *t)
            && !tokens.is_empty()
        {
            request
                .headers
                .push((crate::hosts::TOKENS_HEADER.to_owned(), tokens.header_value()));
        }
        if let Some(call) = trace::current_call() {
            request
                .headers
                .push((crate::hosts::CALL_HEADER.to_owned(), format!("{}/{call}", self.1)));
        }
        let Some(clock) = &self.2 else {
            return self.0.post(request);
        };
        let sent = clock.now();
        let answer = self.0.post(request);
        Box::pin(async move {
            let answer = answer.await;
            let took = clock.now().saturating_duration_since(sent);
            let _ = ANSWERED.try_with(|t| t.set(Some(took)));
            answer
        })
    }
}

/// Everything a worker needs, resolved from the scenario.
#[derive(Clone, Debug)]
pub struct WorkerPlan {
    /// Host name.
    pub name: String,
    /// Index in the fleet (seeds its arrival streams).
    pub index: u64,
    /// The model servers it calls, the primary first: one, unless it routes.
    pub deployments: Vec<Target>,
    /// Its tenants.
    pub tenants: Vec<TenantLoad>,
    /// Its clock (shared with the driver, which may step it).
    pub clock: SimClock,
    /// The hardening under test.
    pub hardening: Hardening,
    /// The run's seed.
    pub seed: u64,
    /// When arrivals stop.
    pub until: Duration,
    /// Synchronised bursts this worker fires with the rest of the fleet.
    pub bursts: Vec<Burst>,
    /// The network it reaches its servers over.
    pub net: Net,
}

/// The network between a worker and its servers.
#[derive(Clone)]
pub enum Net {
    /// turmoil's: the ports of the host it runs on, which it may share
    /// with other workers, and where each server listens.
    Sim {
        /// The ports of the worker's host ([`ConnectionLimit::host`]).
        ports: Arc<ConnectionLimit>,
        /// Where each server listens.
        addresses: Arc<Addresses>,
    },
    /// A real one (the laboratory): each server's transport made by the
    /// factory.
    Real(Arc<dyn RealTransports>),
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Net::Sim { ports, addresses } => f
                .debug_struct("Sim")
                .field("ports", ports)
                .field("addresses", addresses)
                .finish(),
            Net::Real(_) => f.write_str("Real"),
        }
    }
}

/// Makes the transport a worker on a real network reaches a server with.
pub trait RealTransports: Send + Sync {
    /// The transport worker `host` uses for `server`.
    fn transport(&self, host: &str, server: &str) -> Box<dyn HttpTransport>;
}

/// One model server a worker may call.
#[derive(Clone, Debug)]
pub struct Target {
    /// Its host name.
    pub server: String,
    /// Its OpenAI-compatible base URL (`http://gpu:8080/v1`).
    pub url: String,
    /// The model id it serves.
    pub model: String,
    /// Its weight under routing: its slots.
    pub weight: u32,
    /// The provider account its key belongs to, if it shares one.
    pub quota_group: Option<String>,
}

/// The key prefix of the breaker guarding `server`, on every worker.
pub fn breaker_prefix(server: &str) -> String {
    format!("kg:circuit:{server}")
}

/// The longest a call can last without a deadline: every limiter wait a
/// whole window, every attempt timing out and every backoff at its cap
/// (jitter included) — how long a least-loaded lease counts a call whose
/// future was dropped.
fn longest_call_s(h: &Hardening) -> f64 {
    let attempts = f64::from(h.max_retries) + 1.0;
    let call = f64::from(h.limiter_waits) * h.window_s
        + attempts * h.request_timeout_s
        + f64::from(h.max_retries) * h.max_delay_s * (1.0 + h.jitter);
    h.deadline_s.map_or(call, |d| d.min(call))
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
}

/// One tenant's hardened provider over this worker's stores `S`.
type Provider<S> = Arc<HardenedProvider<Arc<OpenAiCompatible<CountingTransport>>, S, S>>;

/// One server's adapter and breaker, shared by the worker's tenants.
type Shared<S> = (Arc<OpenAiCompatible<CountingTransport>>, Arc<CircuitBreaker<S>>);

/// Runs one worker until `plan.until` over `store` (its own cache, or the
/// shared cache host's client).
pub async fn run_worker<S: TokenStore + BreakerStore + BudgetStore + InFlightStore>(
    plan: WorkerPlan,
    store: Arc<S>,
    trace: Trace,
) -> Result<(), Box<dyn std::error::Error>> {
    // One copy of the worker's name, shared by every event it records.
    let trace = trace.host(&plan.name);
    let providers = providers(&plan, store, &trace)?;
    let calls = Calls {
        trace,
        schema: Arc::new(OutputSchema::for_type::<Extraction>()),
        next: Rc::new(Cell::new(0)),
    };
    let mut load = arrivals(&plan, &providers, &calls);
    load.extend(clients(&plan, &providers, &calls));
    load.extend(replays(&plan, &providers, &calls));
    load.extend(bursts(&plan, &providers, &calls));
    tokio::time::sleep(plan.until.saturating_sub(sim_elapsed())).await;
    for task in load {
        task.abort();
    }
    Ok(())
}

/// The production stack for each of the worker's tenants: one limiter, one
/// breaker and one adapter shared by all of them.
fn providers<S: TokenStore + BreakerStore + BudgetStore + InFlightStore>(
    plan: &WorkerPlan,
    store: Arc<S>,
    trace: &HostTrace,
) -> Result<Vec<Provider<S>>, Box<dyn std::error::Error>> {
    let h = &plan.hardening;
    let env = Env::default()
        .with_clock(Arc::new(plan.clock.clone()))
        .with_observer(Arc::new(HostObserver::new(trace.clone())));
    let mut limiter = RateLimiter::builder(h.rpm)
        .window(secs(h.window_s))
        .env(env.clone())
        .on_cache_unavailable(h.on_cache_unavailable);
    if let Some(tokens) = h.tokens_per_window {
        limiter = limiter.tokens_per_window(tokens);
    }
    let limiter = Arc::new(limiter.cache(store.clone()).build()?);
    let Some(primary) = plan.deployments.first().map(|d| d.server.as_str()) else {
        return Err("a worker with no server to call".into());
    };
    let budget = match h.retry_budget {
        Some(b) => Some(Arc::new(
            redstring::RetryBudget::builder()
                .ratio(b.ratio)
                .min_retries_per_sec(b.min_retries_per_sec)
                .max_balance(b.max_balance)
                .key(format!("kg:retrybudget:{primary}"))
                .on_cache_unavailable(h.on_cache_unavailable)
                .env(env.clone())
                .cache(store.clone())
                .build()?,
        )),
        None => None,
    };
    let policy = h.retry_policy()?;
    let mut deployments: Vec<Shared<S>> = Vec::new();
    for target in &plan.deployments {
        deployments.push(deployment(plan, target, &store, &env, trace)?);
    }
    // Each server's own limit, shared by the worker's tenants (and, over a
    // shared cache, the fleet's).
    let mut limits: Vec<Option<Arc<RateLimiter<S>>>> = Vec::new();
    for target in &plan.deployments {
        limits.push(match h.deployment_rpm {
            Some(rpm) => {
                let mut limit = RateLimiter::builder(rpm)
                    .window(secs(h.window_s))
                    .key_prefix(format!("{DEPLOYMENT_LIMIT_PREFIX}{}", target.server))
                    .env(env.clone())
                    .on_cache_unavailable(h.on_cache_unavailable);
                if let Some(share) = h.reserve {
                    limit = limit.reserve(share);
                }
                Some(Arc::new(limit.cache(store.clone()).build()?))
            }
            None => None,
        });
    }
    let mut providers = Vec::new();
    for (i, t) in plan.tenants.iter().enumerate() {
        let jitter = SeededRandom::from_seed(seeds::retry_jitter(plan.seed, plan.index, i));
        let mut builder = HardenedProvider::over(
            route_to(&deployments[0], &plan.deployments[0], &limits[0]),
            t.tenant(),
            limiter.clone(),
        )
        .priority(t.priority);
        for ((d, target), limit) in deployments.iter().zip(&plan.deployments).zip(&limits).skip(1) {
            builder = builder.deployment(route_to(d, target, limit));
        }
        builder = match h.routing {
            None | Some(Routing::Ordered) => builder,
            Some(Routing::Weighted) => builder.weighted(),
            Some(Routing::LeastLoaded) => builder.least_loaded(secs(longest_call_s(h))),
        };
        builder = builder
            .retry_policy(policy)
            .env(env.clone().with_rng(Arc::new(jitter)))
            .limiter_waits(h.limiter_waits);
        if let Some(d) = h.deadline_s {
            builder = builder.deadline(secs(d));
        }
        if let Some(ms) = h.slow_call_ms {
            builder = builder.slow_call_threshold(Duration::from_millis(ms))?;
        }
        if let Some(after) = h.hedge_after_ms {
            let after = match after {
                HedgeAfterMs::Ms(ms) => HedgeAfter::Fixed(Duration::from_millis(ms)),
                HedgeAfterMs::P95 => HedgeAfter::ObservedP95 {
                    window: h.hedge_window,
                    floor: Duration::from_millis(h.hedge_floor_ms),
                },
            };
            builder = builder.hedge(after, h.max_hedges)?;
        }
        if let Some(ramp) = h.slow_start_s {
            builder = builder.slow_start(redstring::provider::SlowStart::new(secs(ramp))?);
        }
        if let Some(adaptive) = &h.adaptive_concurrency {
            builder = builder.adaptive_concurrency(adaptive.settings(h.concurrency_lease(), h.reserve)?);
        }
        if let Some(budget) = &budget {
            builder = builder.retry_budget(budget.clone());
        }
        if h.tokens_per_window.is_some() {
            let max_tokens = h.max_tokens;
            builder = builder.token_estimate(move |request| call_estimate(request, max_tokens));
        }
        providers.push(Arc::new(builder.build()));
    }
    Ok(providers)
}

/// `target`'s adapter and its breaker (`kg:circuit:{server}`) over `store`.
fn deployment<S: BreakerStore>(
    plan: &WorkerPlan,
    target: &Target,
    store: &Arc<S>,
    env: &Env,
    trace: &HostTrace,
) -> Result<Shared<S>, Box<dyn std::error::Error>> {
    let h = &plan.hardening;
    let mut breaker = CircuitBreaker::builder()
        .failure_threshold(h.failure_threshold)
        .recovery_timeout(secs(h.recovery_timeout_s))
        .half_open_max_calls(h.half_open_max_calls)
        .key_prefix(breaker_prefix(&target.server))
        .env(env.clone())
        .on_cache_error(h.on_cache_error);
    if let Some(lease) = h.probe_lease_s {
        breaker = breaker.probe_lease(secs(lease));
    }
    if let Some(max) = h.max_recovery_timeout_s {
        breaker = breaker.max_recovery_timeout(secs(max));
    }
    let breaker = Arc::new(breaker.cache(store.clone()).build()?);
    let inner: Box<dyn HttpTransport> = match &plan.net {
        Net::Sim { ports, addresses } => Box::new(SimTransport::on(trace.clone(), ports.clone(), addresses.clone())),
        Net::Real(factory) => factory.transport(&plan.name, &target.server),
    };
    let timed = h.slow_call_ms.map(|_| env.clock().clone());
    let transport = CountingTransport(inner, plan.name.clone(), timed);
    let adapter = Arc::new(
        OpenAiCompatible::builder(target.url.clone(), target.model.clone())
            .timeout(secs(h.request_timeout_s))
            .max_tokens(h.max_tokens)
            .env(Env::default().with_clock(env.clock().clone()))
            .build_with(transport)?,
    );
    Ok((adapter, breaker))
}

/// A tenant's handle on a shared adapter and breaker, at `target`'s weight,
/// behind the server's own limit if it has one.
fn route_to<S: TokenStore>(
    (adapter, breaker): &Shared<S>,
    target: &Target,
    limit: &Option<Arc<RateLimiter<S>>>,
) -> Deployment<Arc<OpenAiCompatible<CountingTransport>>, S> {
    let mut deployment = Deployment::new(adapter.clone(), breaker.clone()).weight(target.weight);
    if let Some(limit) = limit {
        deployment = deployment.limit(limit.clone());
    }
    match &target.quota_group {
        Some(group) => deployment.quota_group(group.as_str()),
        None => deployment,
    }
}

/// Starts units of work and records their arrival and end.
#[derive(Clone)]
struct Calls {
    trace: HostTrace,
    schema: Arc<OutputSchema>,
    /// The next worker-local call number.
    next: Rc<Cell<u64>>,
}

impl Calls {
    /// One unit of work for `tenant` through `provider`, on its own task.
    fn start<S: TokenStore + BreakerStore + BudgetStore>(
        &self,
        provider: Provider<S>,
        tenant: TenantId,
        tokens: Option<RequestTokens>,
    ) {
        tokio::task::spawn_local(self.call(provider, tenant, tokens));
    }

    /// One unit of work for `tenant` through `provider`: it arrives now, and
    /// the future ends when the call does. `tokens` are the call's own prompt
    /// and output tokens (a replayed request's, or its tenant's draw), sent
    /// to the server with each attempt.
    fn call<S: TokenStore + BreakerStore + BudgetStore>(
        &self,
        provider: Provider<S>,
        tenant: TenantId,
        tokens: Option<RequestTokens>,
    ) -> impl std::future::Future<Output = ()> + 'static {
        let call = self.next.get();
        self.next.set(call + 1);
        self.trace.record(Kind::Arrival { call, tenant });
        let this = self.clone();
        async move {
            let started = sim_elapsed();
            let work = async {
                let request = ExtractRequest {
                    text: REQUEST_TEXT,
                    system_prompt: Some(REQUEST_SYSTEM_PROMPT),
                    schema: &this.schema,
                };
                let result = provider.extract_value(request).await;
                (result, ATTEMPTS.with(Cell::get), ANSWERED.with(Cell::get))
            };
            let (result, attempts, answered) = trace::within_call(
                call,
                TOKENS.scope(
                    tokens,
                    ATTEMPTS.scope(Cell::new(0), ANSWERED.scope(Cell::new(None), work)),
                ),
            )
            .await;
            let latency_ms = u64::try_from((sim_elapsed().saturating_sub(started)).as_millis()).unwrap_or(0);
            let end = Kind::CallEnd(Box::new(CallEnded {
                call,
                tenant,
                outcome: CallOutcome::of(&result),
                attempts,
                latency_ms,
                retry_after_us: match &result {
                    Err(redstring::provider::ExtractError::CircuitOpen(open)) => {
                        Some(u64::try_from(open.retry_after.as_micros()).unwrap_or(u64::MAX))
                    }
                    _ => None,
                },
                // Timed only under a slow-call threshold; a success's last
                // request is the one that answered.
                answer_us: answered
                    .filter(|_| result.is_ok())
                    .map(|took| u64::try_from(took.as_micros()).unwrap_or(u64::MAX)),
            }));
            this.trace.record(end);
        }
    }
}

/// A tenant's token-count distributions and the seeded stream they draw
/// from ([`seeds::tokens`]), shared by every source of the tenant's calls on
/// this worker.
struct TokenDraws {
    prompt: Option<Spread>,
    output: Option<Spread>,
    rng: RefCell<ChaCha8Rng>,
}

impl TokenDraws {
    /// The draws of the `i`-th tenant of `plan`, or `None` when it sets
    /// neither distribution (its calls then carry no counts, and the server
    /// uses its own).
    fn of(plan: &WorkerPlan, i: usize) -> Option<Rc<Self>> {
        let t = plan.tenants.get(i)?;
        if t.prompt_tokens.is_none() && t.output_tokens.is_none() {
            return None;
        }
        Some(Rc::new(TokenDraws {
            prompt: t.prompt_tokens,
            output: t.output_tokens,
            rng: RefCell::new(ChaCha8Rng::seed_from_u64(seeds::tokens(plan.seed, plan.index, i))),
        }))
    }

    /// One call's counts: the prompt side drawn first, then the output side,
    /// each rounded and capped at [`MAX_TRACE_TOKENS`] (what the token header
    /// carries); `None` without draws.
    fn draw(draws: Option<&Rc<Self>>) -> Option<RequestTokens> {
        let d = draws?;
        let mut rng = d.rng.borrow_mut();
        let mut side = |dist: Option<Spread>| {
            dist.map(|dist| {
                let n = dist.sample(&mut *rng).round();
                // `sample` is finite and not negative; the cast saturates.
                (n as u64).min(MAX_TRACE_TOKENS)
            })
        };
        let prompt = side(d.prompt);
        let output = side(d.output);
        Some(RequestTokens { prompt, output })
    }
}

/// One open-loop Poisson arrival stream per tenant, until `plan.until`.
fn arrivals<S: TokenStore + BreakerStore + BudgetStore>(
    plan: &WorkerPlan,
    providers: &[Provider<S>],
    calls: &Calls,
) -> Vec<JoinHandle<()>> {
    let mut streams = Vec::new();
    for (i, (t, provider)) in plan.tenants.iter().zip(providers).enumerate() {
        if t.calls_per_min <= 0.0 {
            continue;
        }
        let Ok(exp) = Exp::new(t.calls_per_min / 60.0) else {
            continue;
        };
        let mut rng = ChaCha8Rng::seed_from_u64(seeds::arrivals(plan.seed, plan.index, i));
        let (provider, calls, until, tenant) = (provider.clone(), calls.clone(), plan.until, t.tenant());
        let draws = TokenDraws::of(plan, i);
        streams.push(tokio::task::spawn_local(async move {
            loop {
                let gap = Duration::try_from_secs_f64(exp.sample(&mut rng)).unwrap_or(Duration::MAX);
                if sim_elapsed().saturating_add(gap) >= until {
                    break;
                }
                tokio::time::sleep(gap).await;
                calls.start(provider.clone(), tenant, TokenDraws::draw(draws.as_ref()));
            }
        }));
    }
    streams
}

/// Each tenant's closed-loop clients, until `plan.until`: a client sends a
/// call, waits for it to end, thinks for an exponentially distributed time
/// (mean `think_s`, its own seeded stream) and sends the next. Clients start
/// after one think time each, so they do not all send at the first instant.
fn clients<S: TokenStore + BreakerStore + BudgetStore>(
    plan: &WorkerPlan,
    providers: &[Provider<S>],
    calls: &Calls,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for (i, (t, provider)) in plan.tenants.iter().zip(providers).enumerate() {
        let Ok(exp) = Exp::new(1.0 / t.think_s) else {
            continue;
        };
        // One token stream for all of the tenant's clients, drawn in the
        // order their calls start.
        let draws = TokenDraws::of(plan, i);
        for client in 0..t.clients {
            let mut rng = ChaCha8Rng::seed_from_u64(seeds::think(plan.seed, plan.index, i, client));
            let (provider, calls, until, tenant) = (provider.clone(), calls.clone(), plan.until, t.tenant());
            let draws = draws.clone();
            tasks.push(tokio::task::spawn_local(async move {
                loop {
                    let think = Duration::try_from_secs_f64(exp.sample(&mut rng)).unwrap_or(Duration::MAX);
                    if sim_elapsed().saturating_add(think) >= until {
                        break;
                    }
                    tokio::time::sleep(think).await;
                    // On its own task, so a call in flight when arrivals
                    // stop runs to its end like an open-loop one.
                    let tokens = TokenDraws::draw(draws.as_ref());
                    let _ = tokio::task::spawn_local(calls.call(provider.clone(), tenant, tokens)).await;
                }
            }));
        }
    }
    tasks
}

/// Each tenant's replayed trace: every request at its instant, with its
/// token counts, until `plan.until`.
fn replays<S: TokenStore + BreakerStore + BudgetStore>(
    plan: &WorkerPlan,
    providers: &[Provider<S>],
    calls: &Calls,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for (t, provider) in plan.tenants.iter().zip(providers) {
        let Some(replay) = &t.replay else {
            continue;
        };
        let (requests, provider, calls, until, tenant) = (
            replay.requests.clone(),
            provider.clone(),
            calls.clone(),
            plan.until,
            t.tenant(),
        );
        tasks.push(tokio::task::spawn_local(async move {
            for r in requests.iter().take_while(|r| r.at < until) {
                tokio::time::sleep(r.at.saturating_sub(sim_elapsed())).await;
                let tokens = Some(RequestTokens {
                    prompt: Some(r.prompt_tokens),
                    output: Some(r.output_tokens),
                });
                tokio::task::spawn_local(calls.call(provider.clone(), tenant, tokens));
            }
        }));
    }
    tasks
}

/// The fleet's synchronised bursts, each fired at its exact instant.
fn bursts<S: TokenStore + BreakerStore + BudgetStore>(
    plan: &WorkerPlan,
    providers: &[Provider<S>],
    calls: &Calls,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for burst in &plan.bursts {
        let Some(i) = plan.tenants.iter().position(|t| t.id == burst.tenant) else {
            continue;
        };
        let (provider, calls, burst, tenant) = (providers[i].clone(), calls.clone(), *burst, plan.tenants[i].tenant());
        let draws = TokenDraws::of(plan, i);
        tasks.push(tokio::task::spawn_local(async move {
            tokio::time::sleep(burst.at.saturating_sub(sim_elapsed())).await;
            for _ in 0..burst.calls {
                calls.start(provider.clone(), tenant, TokenDraws::draw(draws.as_ref()));
            }
        }));
    }
    tasks
}
