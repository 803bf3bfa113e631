//! Worker hosts: one fleet member, its tenants' load, and the real hardened
//! provider between them and a model server.
//!
//! Each worker builds exactly what a production process would — a limiter, a
//! breaker, the OpenAI-compatible adapter and the hardened provider composing
//! them — from the scenario's configuration, on its own skewed clock, with the
//! simulated network underneath. Load is open-loop: each tenant's calls arrive
//! as a Poisson process (seeded), whether or not earlier calls have finished,
//! which is what makes an outage pile up.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp};
use redstring::cache::{BreakerStore, LimiterStore};
use redstring::provider::{
    BoxFuture, ExtractRequest, HardenedProvider, HttpRequest, HttpResponse, HttpTransport, LlmProvider,
    OpenAiCompatible, OutputSchema, TransportError,
};
use redstring::{CircuitBreaker, Clock, RateLimiter, SeededRandom, TenantId};

use crate::hosts::clock::{SimClock, sim_elapsed};
use crate::scenario::{Hardening, TenantLoad};
use crate::evidence::trace::{HostObserver, Kind, Trace};
use crate::hosts::transport::SimTransport;

/// The record every simulated extraction asks for.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[allow(dead_code)] // the fields are what the schema is made of
pub struct Extraction {
    /// The entity's name.
    pub name: String,
    /// How sure the model is.
    pub confidence: f64,
}

tokio::task_local! {
    /// Requests the current call has sent, counted by [`CountingTransport`].
    static ATTEMPTS: Cell<u32>;
}

/// Counts each request against the call whose task sends it.
struct CountingTransport(SimTransport);

impl HttpTransport for CountingTransport {
    fn post(&self, request: HttpRequest) -> BoxFuture<'_, Result<HttpResponse, TransportError>> {
        let _ = ATTEMPTS.try_with(|n| n.set(n.get() + 1));
        self.0.post(request)
    }
}

/// Everything a worker needs, resolved from the scenario.
#[derive(Clone, Debug)]
pub struct WorkerPlan {
    /// Host name.
    pub name: String,
    /// Index in the fleet (seeds its arrival streams).
    pub index: u64,
    /// The model server it calls.
    pub server: String,
    /// The model id that server serves.
    pub model: String,
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
    /// Synchronised bursts: (when, tenant, calls).
    pub bursts: Vec<(Duration, u64, u32)>,
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
}

/// Runs one worker until `plan.until` over `store` (its own cache, or the
/// shared cache host's client).
pub async fn run_worker<S: LimiterStore + BreakerStore>(
    plan: WorkerPlan,
    store: Arc<S>,
    trace: Trace,
) -> Result<(), Box<dyn std::error::Error>> {
    let h = &plan.hardening;
    let clock: Arc<dyn Clock> = Arc::new(plan.clock.clone());
    let observer = Arc::new(HostObserver::new(&plan.name, trace.clone()));
    let limiter = Arc::new(
        RateLimiter::builder(h.rpm)
            .window(secs(h.window_s))
            .clock(clock.clone())
            .observer(observer.clone())
            .cache(store.clone())
            .build()?,
    );
    let breaker = Arc::new(
        CircuitBreaker::builder()
            .failure_threshold(h.failure_threshold)
            .recovery_timeout(secs(h.recovery_timeout_s))
            .half_open_max_calls(h.half_open_max_calls)
            .key_prefix(format!("kg:circuit:{}", plan.server))
            .clock(clock.clone())
            .observer(observer.clone())
            .cache(store)
            .build()?,
    );
    let policy = h.retry_policy()?;
    let transport = CountingTransport(SimTransport::new(&plan.name, trace.clone()));
    let adapter = Arc::new(
        OpenAiCompatible::builder(format!("http://{}:8080/v1", plan.server), plan.model.clone())
            .timeout(secs(h.request_timeout_s))
            .max_tokens(h.max_tokens)
            .clock(clock.clone())
            .build_with(transport)?,
    );
    let schema = Arc::new(OutputSchema::for_type::<Extraction>());
    let mut providers = Vec::new();
    for (i, t) in plan.tenants.iter().enumerate() {
        let mut builder = HardenedProvider::builder(
            adapter.clone(),
            TenantId::from_u128(u128::from(t.id)),
            limiter.clone(),
            breaker.clone(),
        )
        .retry_policy(policy)
        .clock(clock.clone())
        .rng(Arc::new(SeededRandom::from_seed(stream_seed(
            plan.seed,
            plan.index,
            1_000 + i as u64,
        ))))
        .observer(observer.clone())
        .limiter_waits(h.limiter_waits);
        if let Some(d) = h.deadline_s {
            builder = builder.deadline(secs(d));
        }
        providers.push(Arc::new(builder.build()));
    }

    let next_call = std::rc::Rc::new(Cell::new(0u64));
    let start_call = {
        let (trace, name, schema, next_call) = (trace.clone(), plan.name.clone(), schema.clone(), next_call.clone());
        move |provider: Arc<HardenedProvider<_, S, S>>, tenant: u64| {
            let call = next_call.get();
            next_call.set(call + 1);
            trace.record(&name, Kind::Arrival { call, tenant });
            let (trace, name, schema) = (trace.clone(), name.clone(), schema.clone());
            tokio::task::spawn_local(async move {
                let started = sim_elapsed();
                let work = async {
                    let request = ExtractRequest {
                        text: "Ada Lovelace wrote the first program.",
                        system_prompt: Some("Extract the person named."),
                        schema: &schema,
                    };
                    let result = provider.extract_value(request).await;
                    (result, ATTEMPTS.with(Cell::get))
                };
                let (result, attempts) = ATTEMPTS.scope(Cell::new(0), work).await;
                let outcome = match &result {
                    Ok(_) => "ok".to_owned(),
                    Err(e) => e.kind().to_owned(),
                };
                let latency_ms = u64::try_from((sim_elapsed().saturating_sub(started)).as_millis()).unwrap_or(0);
                trace.record(
                    &name,
                    Kind::CallEnd {
                        call,
                        tenant,
                        outcome,
                        attempts,
                        latency_ms,
                    },
                );
            });
        }
    };

    // One arrival stream per tenant, plus the bursts, all until `until`.
    let mut streams = Vec::new();
    for (i, t) in plan.tenants.iter().enumerate() {
        if t.calls_per_min <= 0.0 {
            continue;
        }
        let Ok(exp) = Exp::new(t.calls_per_min / 60.0) else {
            continue;
        };
        let mut rng = ChaCha8Rng::seed_from_u64(stream_seed(plan.seed, plan.index, i as u64));
        let (provider, start_call, until, tenant) = (providers[i].clone(), start_call.clone(), plan.until, t.id);
        streams.push(tokio::task::spawn_local(async move {
            loop {
                let gap = Duration::try_from_secs_f64(exp.sample(&mut rng)).unwrap_or(Duration::MAX);
                if sim_elapsed().saturating_add(gap) >= until {
                    break;
                }
                tokio::time::sleep(gap).await;
                start_call(provider.clone(), tenant);
            }
        }));
    }
    for (at, tenant, calls) in plan.bursts.clone() {
        let Some(i) = plan.tenants.iter().position(|t| t.id == tenant) else {
            continue;
        };
        let (provider, start_call) = (providers[i].clone(), start_call.clone());
        streams.push(tokio::task::spawn_local(async move {
            tokio::time::sleep(at.saturating_sub(sim_elapsed())).await;
            for _ in 0..calls {
                start_call(provider.clone(), tenant);
            }
        }));
    }
    tokio::time::sleep(plan.until.saturating_sub(sim_elapsed())).await;
    for s in streams {
        s.abort();
    }
    Ok(())
}

/// A seed for one random stream of one worker, derived from the run's seed.
pub fn stream_seed(seed: u64, worker: u64, stream: u64) -> u64 {
    // SplitMix64-style mixing keeps nearby inputs' streams unrelated.
    let mut z = seed ^ worker.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ stream.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
