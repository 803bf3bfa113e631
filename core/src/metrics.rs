//! Metrics through the [`metrics`] facade, named as OpenTelemetry's GenAI
//! conventions name them where one applies.
//!
//! Operators watch hardening through metrics: how many calls succeed, how
//! long they take, how often the limiter, the breaker, a quota cooldown or
//! the retry budget says no, what state each breaker is in. [`MetricsObserver`]
//! is an [`Observer`] that turns the crate's [`Event`]s into those series,
//! through whatever recorder the application installed (a Prometheus
//! exporter, OpenTelemetry's, a test's). Series that the OpenTelemetry
//! semantic conventions for generative-AI clients define keep their names
//! and attributes (`gen_ai.client.operation.duration`,
//! `gen_ai.client.token.usage`, `gen_ai.provider.name`,
//! `gen_ai.request.model`, `error.type`); the rest live under `redstring.`.
//! Labels are bounded: models, breakers, limiters and outcomes are few; a
//! tenant is a label only when asked ([`MetricsObserver::with_tenant_label`]).
//!
//! | series | kind | labels | meaning |
//! |---|---|---|---|
//! | `gen_ai.client.operation.duration` | histogram, s | `gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model`, `error.type` (failed calls) | a hardened call from start to end, waits and retries included |
//! | `gen_ai.client.token.usage` | histogram, tokens | as above, and `gen_ai.token.type` (`input`, `output`) | tokens an answer reported |
//! | `redstring.calls` | counter | `gen_ai.provider.name`, `gen_ai.request.model`, `outcome` | calls ended, by outcome (`ok`, the error kind, or `cancelled`: dropped by the caller) |
//! | `redstring.calls.in_flight` | gauge | `gen_ai.provider.name`, `gen_ai.request.model` | calls started and not yet ended |
//! | `redstring.attempts` | counter | `gen_ai.provider.name`, `gen_ai.request.model` | requests sent to model servers |
//! | `redstring.retries` | counter | `operation` | retries scheduled |
//! | `redstring.refusals` | counter | `by` (`limiter`, `tokens`, `breaker`, `cooldown`, `budget`, `concurrency`), `component` | refusals, by what refused |
//! | `redstring.admission.wait` | histogram, s | `wait` (`limiter`, `cooldown`) | time a call slept for admission |
//! | `redstring.breaker.state` | gauge | `breaker` | 0 closed, 1 half-open, 2 open, on each transition |
//! | `redstring.breaker.transitions` | counter | `breaker`, `to` | state changes |
//! | `redstring.slow_calls` | counter | `breaker` | answers slower than the slow-call threshold, each a breaker failure |
//! | `redstring.hedges` | counter | `breaker` | hedged attempts, by the deployment each went to |
//! | `redstring.slow_start.draws` | counter | `breaker`, `took` (`true`, `false`) | calls a deployment in its slow start was drawn for, by whether the draw fell within its share |
//! | `redstring.concurrency.limit` | gauge, calls | `breaker` | a deployment's adaptive concurrency limit, each time its whole number of calls moves |
//! | `redstring.quota_exhausted` | counter | `breaker` | spent quotas heard (`insufficient_quota`, a reset past `max_server_delay`), each cooling its deployment until the reset |
//! | `redstring.retry_budget.balance` | gauge, retries | `budget` | the budget's balance after each step |
//! | `redstring.cache.unavailable` | counter | `component`, `operation` | store operations that failed |
//!
//! A model is named as providers name it (`openai-compatible/qwen3`): the
//! part before the first `/` is `gen_ai.provider.name`, the rest
//! `gen_ai.request.model`. A hardened call's `tracing` spans carry the same
//! attributes ([`HardenedProvider`](crate::HardenedProvider), "Traces"), and
//! `redstring-sim run --metrics` writes a simulated run under these names;
//! the repository's `docs/metrics.md` has all three, and a test holds this
//! table to the series the Prometheus exporter serves.

use std::time::Duration;

use metrics::{counter, gauge, histogram};

use crate::decide::breaker::CircuitState;
use crate::decide::budget::MICROS_PER_RETRY;
use crate::decide::concurrency::whole;
use crate::observe::{Event, Observer};

/// An [`Observer`] that records the crate's events as metrics (see the
/// module's table), through the installed [`metrics`] recorder.
#[derive(Clone, Copy, Debug, Default)]
pub struct MetricsObserver {
    tenant_label: bool,
}

impl MetricsObserver {
    /// An observer with bounded labels: no tenant.
    pub fn new() -> Self {
        MetricsObserver::default()
    }

    /// Also labels the call series with `tenant` — one series per tenant,
    /// so only for a bounded number of tenants.
    pub fn with_tenant_label(mut self) -> Self {
        self.tenant_label = true;
        self
    }
}

/// `openai-compatible/qwen3` as (`openai-compatible`, `qwen3`), owned for labels.
fn provider_and_model(model: &str) -> (String, String) {
    let (provider, model) = crate::observe::provider_and_model(model);
    (provider.to_owned(), model.to_owned())
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

impl Observer for MetricsObserver {
    fn on_event(&self, event: &Event) {
        match event {
            Event::CallStarted { model, .. } => {
                let (provider, model) = provider_and_model(model);
                gauge!("redstring.calls.in_flight", "gen_ai.provider.name" => provider, "gen_ai.request.model" => model)
                    .increment(1.0);
            }
            Event::CallFinished {
                model,
                tenant,
                outcome,
                attempts,
                duration,
                input_tokens,
                output_tokens,
                ..
            } => {
                let (provider, model) = provider_and_model(model);
                let mut labels = vec![
                    ("gen_ai.provider.name", provider.clone()),
                    ("gen_ai.request.model", model.clone()),
                ];
                if self.tenant_label {
                    labels.push(("tenant", tenant.to_string()));
                }
                gauge!("redstring.calls.in_flight", "gen_ai.provider.name" => provider, "gen_ai.request.model" => model)
                    .decrement(1.0);
                counter!("redstring.attempts", &labels).increment(u64::from(*attempts));
                let mut calls = labels.clone();
                calls.push(("outcome", (*outcome).to_owned()));
                counter!("redstring.calls", &calls).increment(1);
                let mut op = labels;
                op.push(("gen_ai.operation.name", "chat".to_owned()));
                if *outcome != "ok" {
                    op.push(("error.type", (*outcome).to_owned()));
                }
                histogram!("gen_ai.client.operation.duration", &op).record(seconds(*duration));
                for (kind, tokens) in [("input", input_tokens), ("output", output_tokens)] {
                    if let Some(tokens) = tokens {
                        let mut usage = op.clone();
                        usage.push(("gen_ai.token.type", kind.to_owned()));
                        histogram!("gen_ai.client.token.usage", &usage).record(*tokens as f64);
                    }
                }
            }
            Event::RetryScheduled { operation, .. } => {
                counter!("redstring.retries", "operation" => operation.to_string()).increment(1);
            }
            Event::RateLimitRefused { limiter, .. } => refused("limiter", limiter),
            Event::TokensRefused { limiter, .. } => refused("tokens", limiter),
            Event::BreakerRejected { breaker, .. } => refused("breaker", breaker),
            Event::BreakerCooldownRefused { breaker, .. } => refused("cooldown", breaker),
            Event::RetryBudgetStep {
                budget,
                granted,
                balance,
                ..
            } => {
                if !granted {
                    refused("budget", budget);
                }
                gauge!("redstring.retry_budget.balance", "budget" => budget.to_string())
                    .set(*balance as f64 / MICROS_PER_RETRY as f64);
            }
            Event::RateLimitWait { wait, .. } => {
                histogram!("redstring.admission.wait", "wait" => "limiter").record(seconds(*wait));
            }
            Event::CooldownWait { wait, .. } => {
                histogram!("redstring.admission.wait", "wait" => "cooldown").record(seconds(*wait));
            }
            Event::BreakerTransition { breaker, to, .. } => {
                let state = match to {
                    CircuitState::Closed => 0.0,
                    CircuitState::HalfOpen => 1.0,
                    CircuitState::Open => 2.0,
                };
                gauge!("redstring.breaker.state", "breaker" => breaker.to_string()).set(state);
                let to = match to {
                    CircuitState::Closed => "closed",
                    CircuitState::HalfOpen => "half_open",
                    CircuitState::Open => "open",
                };
                counter!("redstring.breaker.transitions", "breaker" => breaker.to_string(), "to" => to).increment(1);
            }
            Event::Hedged { to, .. } => {
                counter!("redstring.hedges", "breaker" => to.to_string()).increment(1);
            }
            Event::SlowCall { breaker, .. } => {
                counter!("redstring.slow_calls", "breaker" => breaker.to_string()).increment(1);
            }
            Event::SlowStartDraw {
                breaker, share, draw, ..
            } => {
                let took = if draw < share { "true" } else { "false" };
                counter!("redstring.slow_start.draws", "breaker" => breaker.to_string(), "took" => took).increment(1);
            }
            Event::ConcurrencyRefused { breaker, .. } => refused("concurrency", breaker),
            Event::ConcurrencyEnded { breaker, from, to, .. } if whole(*from) != whole(*to) => {
                // At most MAX_LIMIT: exact as an f64.
                gauge!("redstring.concurrency.limit", "breaker" => breaker.to_string()).set(whole(*to) as f64);
            }
            Event::QuotaExhausted { breaker, .. } => {
                counter!("redstring.quota_exhausted", "breaker" => breaker.to_string()).increment(1);
            }
            Event::CacheUnavailable {
                component, operation, ..
            } => {
                counter!("redstring.cache.unavailable", "component" => component.to_string(), "operation" => *operation)
                    .increment(1);
            }
            _ => {}
        }
    }
}

/// Counts one refusal by `by`, from `component`.
fn refused(by: &'static str, component: &str) {
    counter!("redstring.refusals", "by" => by, "component" => component.to_owned()).increment(1);
}
