//! The settings under test and the environment they run in: the hardening
//! configuration, where its state lives, the network and each host's clock.

use serde::{Deserialize, Serialize};

/// The hardening configuration every worker builds its provider from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Hardening {
    /// Calls per tenant per window.
    pub rpm: u32,
    /// The limiter's window.
    pub window_s: f64,
    /// Failed calls that open a breaker.
    pub failure_threshold: u32,
    /// Breaker open time, and the failure count's lifetime.
    pub recovery_timeout_s: f64,
    /// Escalation: the longest a circuit stays open (the breaker's
    /// `max_recovery_timeout`). Each probe that fails re-opens the circuit
    /// for twice as long as before, up to this; a close starts again at
    /// `recovery_timeout_s`. Unset: no escalation.
    pub max_recovery_timeout_s: Option<f64>,
    /// Probes per half-open episode.
    pub half_open_max_calls: u32,
    /// How long a half-open probe counts without reporting (the breaker's
    /// `probe_lease`); the recovery timeout when unset. A probe whose call
    /// outlasts it — retries, a slow server — reports too late to decide.
    pub probe_lease_s: Option<f64>,
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// First backoff.
    pub initial_delay_s: f64,
    /// Backoff cap.
    pub max_delay_s: f64,
    /// Backoff growth.
    pub multiplier: f64,
    /// Backoff jitter fraction.
    pub jitter: f64,
    /// Per-request HTTP timeout.
    pub request_timeout_s: f64,
    /// Limiter refusals a call waits out before giving up.
    pub limiter_waits: u32,
    /// Per-call deadline, if any.
    pub deadline_s: Option<f64>,
    /// A success slower than this, in ms on the worker's clock, is reported
    /// to its server's breaker as a failure (the provider's
    /// `slow_call_threshold`; default: none). Below `request_timeout_s`
    /// and `deadline_s`. `"none"` is no threshold, as leaving the key out
    /// is, so that `compare --set hardening.slow_call_ms=none,4000` can
    /// switch it off.
    #[serde(deserialize_with = "ms_or_none")]
    pub slow_call_ms: Option<u64>,
    /// When a call's attempt that has not answered is hedged to the next
    /// server of the worker's group (the provider's `hedge`; default:
    /// none): after this many ms on the worker's clock, or `"p95"` — the
    /// observed p95 of the last `hedge_window` answers from that server,
    /// at least `hedge_floor_ms`. Needs `routing` (a worker holding its
    /// group's servers); below `request_timeout_s` and `deadline_s`.
    /// `"none"` is no hedging, as leaving the key out is, so that `compare
    /// --set hardening.hedge_after_ms=none,800` can switch it off.
    #[serde(deserialize_with = "hedge_or_none")]
    pub hedge_after_ms: Option<HedgeAfterMs>,
    /// The most hedges one call sends (1 ..= 4). Written out only when it
    /// is not the default, as are the two below, so a scenario without
    /// hedging does not set them.
    #[serde(skip_serializing_if = "is_default_max_hedges")]
    pub max_hedges: u32,
    /// Under `hedge_after_ms = "p95"`: how many recent answers per server
    /// the p95 is read from (20 ..= 10000).
    #[serde(skip_serializing_if = "is_default_hedge_window")]
    pub hedge_window: u32,
    /// Under `hedge_after_ms = "p95"`: the shortest hedge delay, ms.
    #[serde(skip_serializing_if = "is_default_hedge_floor")]
    pub hedge_floor_ms: u64,
    /// After a server's circuit closes, its share of the calls its breaker
    /// admits ramps up over this many seconds, linearly from 10 % (the
    /// provider's `slow_start`; default: none). `"none"` is no ramp, as
    /// leaving the key out is, so that `compare --set
    /// hardening.slow_start_s=none,60` can switch it off.
    #[serde(deserialize_with = "secs_or_none")]
    pub slow_start_s: Option<f64>,
    /// Each worker limits the calls in flight at each server to a number
    /// learnt from what the server answers (the provider's
    /// `adaptive_concurrency`, AIMD; default: none): `{ initial, min, max,
    /// backoff }`, each optional (4, 1, 64 and 0.9). Over a shared cache
    /// the fleet shares each server's limit. `"none"` is no limit, as
    /// leaving the key out is, so that `compare --set
    /// hardening.adaptive_concurrency=none,{}` can switch it off.
    #[serde(deserialize_with = "adaptive_or_none")]
    pub adaptive_concurrency: Option<AdaptiveConcurrencySpec>,
    /// Output token budget per request.
    pub max_tokens: u32,
    /// What a limiter does while the shared cache cannot be reached
    /// (`local_limit`, `admit` or `refuse`).
    pub on_cache_unavailable: redstring::OnCacheUnavailable,
    /// What a breaker answers while the shared cache cannot be reached
    /// (`allow` or `refuse`).
    pub on_cache_error: redstring::OnCacheError,
    /// A retry budget per model server, in each worker's cache — fleet-wide
    /// with a shared cache, per worker otherwise (default: none).
    pub retry_budget: Option<RetryBudgetSpec>,
    /// Tokens per tenant per window beside `rpm` (default: none). Each call
    /// reserves its prompt tokens plus `max_tokens` with its slot and settles
    /// to the server's `usage`.
    pub tokens_per_window: Option<u64>,
    /// Each server's own limit, in calls per `window_s` shared by every
    /// tenant's attempts there (the provider's `Deployment::limit`;
    /// default: none): fleet-wide over a shared cache, per worker
    /// otherwise. An attempt it refuses goes to the next server of the
    /// worker's group that admits it, and is never sent. `"none"` is no
    /// limit, as leaving the key out is.
    #[serde(deserialize_with = "count_or_none", skip_serializing_if = "Option::is_none")]
    pub deployment_rpm: Option<u32>,
    /// The share of each server's own limits (`deployment_rpm` and
    /// `adaptive_concurrency`) kept for high-priority tenants (the core's
    /// `reserve` on each; default: none): a `priority = "low"` tenant's
    /// attempt there is refused once a window holds the rest, or once the
    /// rest of the concurrency limit is in flight. Between 0 and 1,
    /// exclusive, and it must leave the low class a call at
    /// `adaptive_concurrency.min`. The tenants' own `rpm`
    /// keeps none: each tenant has its own window and one class, so a
    /// reserve there would only cut a low tenant's rate. `"none"` is no reserve, as leaving the key out is, so
    /// that `compare --set hardening.reserve=none,0.3` sets the two side by
    /// side.
    #[serde(deserialize_with = "secs_or_none", skip_serializing_if = "Option::is_none")]
    pub reserve: Option<f64>,
    /// How each worker routes over its group's servers (default: none —
    /// worker `i` of a group calls only its `servers[i % len]`). With a
    /// policy every worker's provider holds every server of its group, in
    /// the order listed, each behind its own breaker. `"none"` is no
    /// policy, as leaving the key out is, so that `compare --set
    /// hardening.routing=none,ordered` can switch routing off.
    #[serde(deserialize_with = "routing_or_none")]
    pub routing: Option<Routing>,
}

/// Reads `hardening.routing`: a policy's name, or `"none"`.
fn routing_or_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Routing>, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum Named {
        None,
        Ordered,
        Weighted,
        LeastLoaded,
    }
    Ok(match Named::deserialize(d)? {
        Named::None => None,
        Named::Ordered => Some(Routing::Ordered),
        Named::Weighted => Some(Routing::Weighted),
        Named::LeastLoaded => Some(Routing::LeastLoaded),
    })
}

/// Reads a count, or `"none"`.
fn count_or_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum CountOrNone {
        Count(u32),
        Named(String),
    }
    match CountOrNone::deserialize(d)? {
        CountOrNone::Count(n) => Ok(Some(n)),
        CountOrNone::Named(none) if none == "none" => Ok(None),
        CountOrNone::Named(other) => Err(serde::de::Error::custom(format!(
            "expected a count or \"none\", got {other:?}"
        ))),
    }
}

/// A worker's adaptive concurrency limit per server, as a scenario writes it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdaptiveConcurrencySpec {
    /// The limit a server starts at, in calls in flight.
    pub initial: u32,
    /// The least it backs off to.
    pub min: u32,
    /// The most it grows to.
    pub max: u32,
    /// What an overload signal (a 429, a 503, a timeout) multiplies it by.
    pub backoff: f64,
}

impl Default for AdaptiveConcurrencySpec {
    fn default() -> Self {
        AdaptiveConcurrencySpec {
            initial: 4,
            min: 1,
            max: 64,
            backoff: redstring::decide::concurrency::DEFAULT_BACKOFF,
        }
    }
}

impl AdaptiveConcurrencySpec {
    /// The core's settings, each call leased for `lease`, `reserve` of the
    /// limit kept for high-priority tenants (`hardening.reserve`).
    ///
    /// # Errors
    ///
    /// The core's [`redstring::ConfigError`] naming the field.
    pub fn settings(
        &self,
        lease: std::time::Duration,
        reserve: Option<f64>,
    ) -> Result<redstring::provider::AdaptiveConcurrency, redstring::ConfigError> {
        let settings = redstring::provider::AdaptiveConcurrency::new(self.initial, self.min, self.max)?
            .backoff(self.backoff)?
            .lease(lease)?;
        match reserve {
            Some(share) => settings.reserve(share),
            None => Ok(settings),
        }
    }
}

/// Reads `hardening.adaptive_concurrency`: a table, or `"none"`.
fn adaptive_or_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<AdaptiveConcurrencySpec>, D::Error> {
    match toml::Value::deserialize(d)? {
        toml::Value::String(none) if none == "none" => Ok(None),
        toml::Value::String(other) => Err(serde::de::Error::custom(format!(
            "expected a table or \"none\", got {other:?}"
        ))),
        table => AdaptiveConcurrencySpec::deserialize(table)
            .map(Some)
            .map_err(|e| serde::de::Error::custom(e.message())),
    }
}

/// Reads `hardening.slow_start_s` and `hardening.reserve`: a number, or
/// `"none"`.
fn secs_or_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum SecsOrNone {
        Secs(f64),
        Named(String),
    }
    match SecsOrNone::deserialize(d)? {
        SecsOrNone::Secs(s) => Ok(Some(s)),
        SecsOrNone::Named(none) if none == "none" => Ok(None),
        SecsOrNone::Named(other) => Err(serde::de::Error::custom(format!(
            "expected a number or \"none\", got {other:?}"
        ))),
    }
}

/// Reads `hardening.slow_call_ms`: milliseconds, or `"none"`.
fn ms_or_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum MsOrNone {
        Ms(u64),
        Named(String),
    }
    match MsOrNone::deserialize(d)? {
        MsOrNone::Ms(ms) => Ok(Some(ms)),
        MsOrNone::Named(none) if none == "none" => Ok(None),
        MsOrNone::Named(other) => Err(serde::de::Error::custom(format!(
            "expected milliseconds or \"none\", got {other:?}"
        ))),
    }
}

fn is_default_max_hedges(n: &u32) -> bool {
    *n == Hardening::default().max_hedges
}

fn is_default_hedge_window(n: &u32) -> bool {
    *n == Hardening::default().hedge_window
}

fn is_default_hedge_floor(ms: &u64) -> bool {
    *ms == Hardening::default().hedge_floor_ms
}

/// Reads `hardening.hedge_after_ms`: milliseconds, `"p95"`, or `"none"`.
fn hedge_or_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<HedgeAfterMs>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum MsOrNamed {
        Ms(u64),
        Named(String),
    }
    match MsOrNamed::deserialize(d)? {
        MsOrNamed::Ms(ms) => Ok(Some(HedgeAfterMs::Ms(ms))),
        MsOrNamed::Named(named) if named == "p95" => Ok(Some(HedgeAfterMs::P95)),
        MsOrNamed::Named(none) if none == "none" => Ok(None),
        MsOrNamed::Named(other) => Err(serde::de::Error::custom(format!(
            "expected milliseconds, \"p95\" or \"none\", got {other:?}"
        ))),
    }
}

/// `hardening.hedge_after_ms`: a fixed hedge delay, or the observed p95.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HedgeAfterMs {
    /// This many milliseconds.
    Ms(u64),
    /// The observed p95 of recent answers, at least `hedge_floor_ms`.
    P95,
}

impl Serialize for HedgeAfterMs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            HedgeAfterMs::Ms(ms) => s.serialize_u64(*ms),
            HedgeAfterMs::P95 => s.serialize_str("p95"),
        }
    }
}

impl HedgeAfterMs {
    /// The shortest delay a hedge waits under it: the fixed delay, or the
    /// floor under `"p95"`, in ms.
    pub fn least_ms(self, floor_ms: u64) -> u64 {
        match self {
            HedgeAfterMs::Ms(ms) => ms,
            HedgeAfterMs::P95 => floor_ms,
        }
    }
}

/// `hardening.routing`: the policy a worker's provider picks a call's first
/// server by (see `redstring::provider::HardenedProviderBuilder`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    /// The first server listed whose circuit admits the call: fallback.
    Ordered,
    /// A server drawn by weight: each server's `slots`, its capacity.
    Weighted,
    /// The server with the fewest calls in flight per slot, counted in the
    /// worker's cache (the fleet's, when shared).
    LeastLoaded,
}

impl Routing {
    /// Its name in a scenario file.
    pub fn name(self) -> &'static str {
        match self {
            Routing::Ordered => "ordered",
            Routing::Weighted => "weighted",
            Routing::LeastLoaded => "least_loaded",
        }
    }
}

/// `[hardening.retry_budget]`: the numbers of a
/// [`redstring::RetryBudget`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryBudgetSpec {
    /// Retries per first attempt.
    pub ratio: f64,
    /// Retries per second allowed whatever the traffic.
    pub min_retries_per_sec: u32,
    /// The most retries the bucket holds.
    pub max_balance: u32,
}

impl Default for RetryBudgetSpec {
    fn default() -> Self {
        RetryBudgetSpec {
            ratio: redstring::retry::DEFAULT_RATIO,
            min_retries_per_sec: redstring::retry::DEFAULT_MIN_RETRIES_PER_SEC,
            max_balance: redstring::retry::DEFAULT_MAX_BALANCE,
        }
    }
}

impl Default for Hardening {
    fn default() -> Self {
        Hardening {
            rpm: 60,
            window_s: 60.0,
            failure_threshold: 5,
            recovery_timeout_s: 60.0,
            max_recovery_timeout_s: None,
            half_open_max_calls: 1,
            probe_lease_s: None,
            max_retries: 3,
            initial_delay_s: 1.0,
            max_delay_s: 60.0,
            multiplier: 2.0,
            jitter: 0.1,
            request_timeout_s: 30.0,
            limiter_waits: 1,
            deadline_s: None,
            slow_call_ms: None,
            deployment_rpm: None,
            reserve: None,
            hedge_after_ms: None,
            max_hedges: 1,
            hedge_window: 50,
            hedge_floor_ms: 100,
            slow_start_s: None,
            adaptive_concurrency: None,
            max_tokens: 256,
            on_cache_unavailable: redstring::OnCacheUnavailable::default(),
            on_cache_error: redstring::OnCacheError::default(),
            retry_budget: None,
            tokens_per_window: None,
            routing: None,
        }
    }
}

impl Hardening {
    /// The longest a circuit stays open, with the name of the setting that
    /// says so: `max_recovery_timeout_s` with escalation, else
    /// `recovery_timeout_s`.
    pub fn longest_open_s(&self) -> (f64, &'static str) {
        match self.max_recovery_timeout_s {
            Some(max) if max > self.recovery_timeout_s => (max, "max_recovery_timeout_s"),
            _ => (self.recovery_timeout_s, "recovery_timeout_s"),
        }
    }

    /// How long a call counts in flight under adaptive concurrency if it
    /// never reports: at least a minute, and four request timeouts — twice
    /// the longest an attempt runs, so the judgement may stop counting a
    /// call at half its lease and still never count one the store forgot.
    pub fn concurrency_lease(&self) -> std::time::Duration {
        let timeout =
            std::time::Duration::try_from_secs_f64(self.request_timeout_s).unwrap_or(std::time::Duration::MAX);
        timeout.saturating_mul(4).clamp(
            std::time::Duration::from_secs(60),
            std::time::Duration::from_secs(24 * 60 * 60),
        )
    }

    /// The retry schedule these settings describe.
    pub fn retry_policy(&self) -> Result<redstring::RetryPolicy, redstring::ConfigError> {
        let secs = |s: f64| std::time::Duration::try_from_secs_f64(s).unwrap_or(std::time::Duration::MAX);
        redstring::RetryPolicy::builder()
            .max_retries(self.max_retries)
            .initial_delay(secs(self.initial_delay_s))
            .max_delay(secs(self.max_delay_s))
            .multiplier(self.multiplier)
            .jitter(self.jitter)
            .build()
    }
}

/// Where the limiter's hits and the breaker's state live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheKind {
    /// Each worker keeps its own in-process `MemoryCache` (the default).
    #[default]
    PerWorker,
    /// One cache host shared by the fleet over the simulated network.
    Shared,
}

/// The cache layout.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheLayout {
    /// Per worker or shared.
    pub kind: CacheKind,
    /// Whose clock stamps hits in the shared cache (default `store`, the
    /// cache host's own clock, as in the core).
    pub time_source: redstring::TimeSource,
    /// The cache host's own clock.
    pub clock: ClockSpec,
    /// How long a worker waits for the cache host before calling it unavailable (default 250 ms).
    pub timeout_ms: Option<u64>,
}

/// Link latency: each message takes `min + ⌊(max − min) · E⌋` ms one way,
/// `E` exponential of rate 5, and at most `max` (turmoil
/// 0.7's `Link::delay`, `src/top.rs`, with its default curve): most
/// messages come near the fastest — between 1 and 5 ms, 1.4 ms on average.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Network {
    /// Fastest delivery.
    pub min_latency_ms: u64,
    /// Slowest delivery.
    pub max_latency_ms: u64,
}

/// The rate of the exponential a message's latency is drawn with
/// ([`Network`]; turmoil 0.7's default `Exp(5)`).
const LATENCY_RATE: f64 = 5.0;

impl Network {
    /// One message's one-way latency in `min_ms..=max_ms`, milliseconds,
    /// drawn as the simulated network draws it ([`Network`]): what the
    /// laboratory's links delay a real message by.
    pub fn draw_ms(min_ms: u64, max_ms: u64, rng: &mut impl rand::Rng) -> u64 {
        let Ok(exp) = rand_distr::Exp::new(LATENCY_RATE) else {
            return min_ms;
        };
        let e: f64 = rand_distr::Distribution::sample(&exp, rng);
        let extra = (max_ms.saturating_sub(min_ms) as f64 * e) as u64;
        min_ms.saturating_add(extra).min(max_ms.max(min_ms))
    }
}

impl Default for Network {
    fn default() -> Self {
        Network {
            min_latency_ms: 1,
            max_latency_ms: 5,
        }
    }
}

/// A host's clock relative to true simulated time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClockSpec {
    /// Constant offset (positive: the host's clock runs ahead).
    pub offset_ms: i64,
    /// Rate error in parts per million (positive: runs fast).
    pub drift_ppm: i64,
}
