//! `RateLimiter`: a per-tenant sliding-window allowance.
//!
//! The limiter protects the model server from its callers and each tenant from
//! the others: at most `rpm` calls per tenant in any window of
//! `window_seconds`, measured from now (a sliding window, never clock-minute
//! buckets, which let twice the limit through across a boundary).
//!
//! [`RateLimiter::acquire`] is the only thing that grants a slot. A refusal
//! records nothing and says exactly when a slot frees; successive refusals
//! never report a longer wait while no hit is added. The count, the comparison
//! and the record are one atomic [`LimiterStore::acquire_slot`], so racing
//! tasks — or a fleet on one shared cache — never exceed `rpm`.
//!
//! Callers of one allowance can carry a [`Priority`]: with a
//! [`reserve`](RateLimiterBuilder::reserve), part of the limit is kept for
//! [`Priority::High`] — a [`Priority::Low`] caller is admitted only while the
//! window holds fewer hits than the rest, and a high one may use whatever the
//! low ones leave. It is the same atomic step with a lower limit, so it is
//! exact fleet-wide as the limit is: in any window the low class holds at
//! most its share, and a high caller refused found at least the reserve taken
//! by its own class.
//!
//! A shared cache can be unreachable. What `acquire` does then is the
//! [`OnCacheUnavailable`] policy: fall back to a per-process limit (the
//! default), admit, or refuse. Only [`CacheError::Unavailable`] triggers it; a
//! closed cache or a protocol error is still an error.

mod error;

use std::sync::Arc;
use std::time::Duration;

pub use error::{AcquireError, RateLimitExceeded, TokenAcquireError, TokenLimitExceeded};

use crate::cache::{
    Cache, HitWindow, KeyBuf, LimiterStore, MAX_PREFIX_LEN, MemoryCache, SlotRequest, StoreSlot, TokenStore,
};
use crate::clock::Clock;
use crate::decide::DecidedBy;
use crate::decide::tokens;
use crate::decide::window::SlotOutcome;
use crate::env::Env;
use crate::error::{CacheError, ConfigError};
use crate::observe::{Event, Listener};
pub use crate::tenant::Priority;
use crate::tenant::TenantId;
use crate::time::Timestamp;

/// The default window: one minute.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);
/// The default key prefix.
pub const DEFAULT_KEY_PREFIX: &str = "kg:ratelimit";
/// How far ahead of a shared store's clock a caller-stamped decision is taken
/// as it is, by default (see [`RateLimiterBuilder::max_clock_ahead`]), for
/// windows of at least this length.
pub const DEFAULT_MAX_CLOCK_AHEAD: Duration = Duration::from_secs(1);

/// The most tokens per window a limiter accepts: 2⁵³, what a Redis script's
/// doubles hold exactly.
pub const MAX_TOKENS_PER_WINDOW: u64 = 1 << 53;

/// The lead a limiter with `window` takes when none is set:
/// [`DEFAULT_MAX_CLOCK_AHEAD`], or the window if shorter.
pub fn default_max_clock_ahead(window: Duration) -> Duration {
    DEFAULT_MAX_CLOCK_AHEAD.min(window)
}

/// What [`RateLimiter::acquire`] does when the shared cache is unavailable
/// ([`CacheError::Unavailable`]: unreachable, timed out). Every use emits
/// [`Event::CacheUnavailable`] naming the fallback taken. The read-only
/// [`RateLimiter::remaining`] has no fallback: it reports the cache error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnCacheUnavailable {
    /// Limit locally (the default): each process counts its own hits in a
    /// private [`MemoryCache`] with the same `rpm` and window until the shared
    /// cache answers again. The tenant keeps making progress and the model
    /// server stays protected; a fleet of `n` workers admits at most `rpm × n`
    /// per window during the outage (plus what the shared cache admitted in the
    /// window before it failed), instead of `rpm`.
    #[default]
    LocalLimit,
    /// Admit the call (fail open): the outage costs nothing in throughput, but
    /// the limit is gone until the cache returns. The admission reports
    /// `remaining: 0`, since nothing is known, and is reported as any other
    /// ([`Event::RateLimitAdmitted`], after the `CacheUnavailable` event that
    /// names this fallback).
    Admit,
    /// Refuse the call with [`AcquireError::Cache`] (fail closed): the limit is
    /// never exceeded, and a cache outage stops all model calls.
    Refuse,
}

impl OnCacheUnavailable {
    /// The name reported in [`Event::CacheUnavailable`]'s `fallback`.
    pub const fn as_str(self) -> &'static str {
        match self {
            OnCacheUnavailable::LocalLimit => "local limit",
            OnCacheUnavailable::Admit => "allowed",
            OnCacheUnavailable::Refuse => "refused",
        }
    }
}

/// What a limiter does instead when its store cannot answer.
enum Fallback<'a> {
    /// Decide in the process's private store.
    Local(&'a MemoryCache),
    /// Admit without a limit.
    Admit,
    /// Refuse with the store's error.
    Refuse,
}

/// A granted slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admission {
    /// Slots left for this tenant in the window after this one.
    pub remaining: u32,
}

/// A granted slot with its token reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenAdmission {
    /// Slots left for this tenant in the window after this one.
    pub remaining: u32,
    /// Tokens left in the window after this reservation.
    pub tokens_left: u64,
    /// The reservation to [`settle`](RateLimiter::settle) with the tokens the
    /// call used, or [`release`](RateLimiter::release) when it failed before
    /// the server used any. `None` when the limiter has no token limit.
    pub reservation: Option<Reservation>,
}

/// One call's token reservation: where it was decided, and its id there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// The reservation in its ledger.
    pub id: tokens::ReservationId,
    /// The tokens reserved.
    pub estimate: u64,
    /// Which ledger holds it: the store's, or the local fallback's.
    pub decided_by: DecidedBy,
}

/// A per-tenant sliding-window rate limiter over a [`LimiterStore`].
///
/// ```
/// # tokio_test_block_on(async {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use redstring::{Env, ManualClock, RateLimiter, TenantId};
///
/// let clock = Arc::new(ManualClock::at_fixed_epoch());
/// let env = Env::default().with_clock(clock.clone());
/// let limiter = RateLimiter::builder(2).env(env).build().unwrap();
/// let tenant = TenantId::from_u128(1);
/// limiter.acquire(tenant).await.unwrap();
/// clock.advance(Duration::from_secs(10));
/// limiter.acquire(tenant).await.unwrap();
/// let refused = limiter.acquire(tenant).await.unwrap_err();
/// // The first hit ages out 50 s from now (and one microsecond: the window
/// // is inclusive), so sleeping exactly that long and asking again succeeds.
/// assert_eq!(refused.retry_after(), Some(Duration::from_micros(50_000_001)));
/// assert_eq!(refused.to_string(), "tenant 00000000-0000-0000-0000-000000000001 has used 2 calls in 60s; retry in 50.00s");
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
pub struct RateLimiter<S = MemoryCache> {
    store: Arc<S>,
    owns_store: bool,
    /// The key prefix: every tenant's key is `{prefix}:{tenant}`, and every
    /// event names it.
    prefix: Arc<str>,
    clock: Arc<dyn Clock>,
    observer: Listener,
    on_cache_unavailable: OnCacheUnavailable,
    /// Tokens per window, if limited.
    tokens: Option<u64>,
    /// How long an unsettled reservation counts.
    token_lease: Duration,
    /// The per-process fallback under [`OnCacheUnavailable::LocalLimit`].
    local: Option<MemoryCache>,
    /// Every store request's fields but `now`, computed once
    /// ([`slot_template`]): the limit (`rpm`), the window, the series' TTL
    /// and the clock allowance (`max_ahead`) are read from here.
    slot: SlotRequest,
    /// Requests and tokens per window kept for [`Priority::High`] (zero
    /// without a reserve).
    reserved: Reserved,
}

/// What a [`reserve`](RateLimiterBuilder::reserve) keeps for the high class,
/// in requests and tokens per window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Reserved {
    requests: u32,
    tokens: u64,
}

/// What a [`reserve`](RateLimiterBuilder::reserve) of `share` keeps of
/// `limit`: `⌈limit × share⌉`, rounded up so the high class gets at least
/// its share, with `share` taken in whole parts per million — so a share
/// such as 0.07 of 100, whose product in binary floating point is a hair
/// above 7, keeps 7. `share` must be in (0, 1) (a builder refuses
/// anything else); `limit` at most 2⁵³.
pub fn reserve_of(limit: u64, share: f64) -> u64 {
    crate::tenant::reserved_ppm(limit, crate::tenant::share_ppm(share))
}

/// A limiter's store request but for its `now`. A clamped caller's window
/// reaches at most two windows behind the store's clock, and its hits sit
/// at most `max_ahead` ahead: the series outlives both, by one tick.
fn slot_template(rpm: u32, window: Duration, max_ahead: Duration) -> SlotRequest {
    SlotRequest {
        now: Timestamp::EPOCH,
        window,
        limit: rpm,
        ttl: window
            .saturating_mul(2)
            .saturating_add(max_ahead)
            .saturating_add(Duration::from_micros(1)),
        max_ahead,
    }
}

impl<S> std::fmt::Debug for RateLimiter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("rpm", &self.slot.limit)
            .field("window", &self.slot.window)
            .field("key_prefix", &self.prefix)
            .field("owns_cache", &self.owns_store)
            .field("on_cache_unavailable", &self.on_cache_unavailable)
            .field("reserved", &self.reserved.requests)
            .finish_non_exhaustive()
    }
}

impl RateLimiter<MemoryCache> {
    /// Starts configuring a limiter allowing `rpm` calls per tenant per window.
    /// `rpm` is required: there is no number a library could guess for you.
    pub fn builder(rpm: u32) -> RateLimiterBuilder<MemoryCache> {
        RateLimiterBuilder {
            rpm,
            window: DEFAULT_WINDOW,
            prefix: DEFAULT_KEY_PREFIX.to_owned(),
            store: StoreSlot::Own(MemoryCache::new),
            env: None,
            on_cache_unavailable: OnCacheUnavailable::default(),
            max_ahead: None,
            tokens: None,
            token_lease: None,
            reserve: None,
        }
    }
}

/// Configures a [`RateLimiter`]; [`build`](RateLimiterBuilder::build) validates.
pub struct RateLimiterBuilder<S> {
    rpm: u32,
    window: Duration,
    prefix: String,
    store: StoreSlot<S>,
    env: Option<Env>,
    on_cache_unavailable: OnCacheUnavailable,
    max_ahead: Option<Duration>,
    tokens: Option<u64>,
    token_lease: Option<Duration>,
    reserve: Option<f64>,
}

impl<S: LimiterStore> RateLimiterBuilder<S> {
    /// The window `rpm` is counted over (default 60 s). `rpm` keeps its name
    /// and means "per window".
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// The key prefix (default `kg:ratelimit`); keys are `{prefix}:{tenant}`.
    /// Two limiters on one cache with one prefix share one allowance.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// A shared cache. The limiter does not own it: [`RateLimiter::close`]
    /// leaves it open. Without one, the limiter builds (and owns) a
    /// [`MemoryCache`] on its clock.
    pub fn cache<T: LimiterStore>(self, cache: Arc<T>) -> RateLimiterBuilder<T> {
        RateLimiterBuilder {
            rpm: self.rpm,
            window: self.window,
            prefix: self.prefix,
            store: StoreSlot::Shared(cache),
            env: self.env,
            on_cache_unavailable: self.on_cache_unavailable,
            max_ahead: self.max_ahead,
            tokens: self.tokens,
            token_lease: self.token_lease,
            reserve: self.reserve,
        }
    }

    /// Under a caller-stamped shared cache ([`TimeSource::Caller`]), how far
    /// ahead of the store's clock a worker's clock is believed (default
    /// [`DEFAULT_MAX_CLOCK_AHEAD`], or the window if shorter; at most the
    /// window). A decision stamped
    /// further ahead is taken at this lead and reported as
    /// [`Event::StampClamped`]; see [`clamp_stamp`](crate::decide::window::clamp_stamp) and
    /// [`skew_bound`](crate::decide::window::skew_bound) for
    /// what a skewed fleet can then admit. Series live
    /// `2 × window + max_clock_ahead`.
    ///
    /// [`TimeSource::Caller`]: crate::TimeSource::Caller
    pub fn max_clock_ahead(mut self, d: Duration) -> Self {
        self.max_ahead = Some(d);
        self
    }

    /// Tokens allowed per tenant per window, beside `rpm` (default: no token
    /// limit). [`RateLimiter::acquire_tokens`] reserves each call's estimate
    /// in the same atomic step as its slot. At most 2⁵³.
    pub fn tokens_per_window(mut self, limit: u64) -> Self {
        self.tokens = Some(limit);
        self
    }

    /// How long an unsettled token reservation counts (default: the window,
    /// so a reservation leaves with its slot). A call that neither settles
    /// nor releases — a dropped future — holds its tokens no longer than
    /// this. At most the window.
    pub fn token_lease(mut self, lease: Duration) -> Self {
        self.token_lease = Some(lease);
        self
    }

    /// The share of the limit kept for [`Priority::High`] callers (default:
    /// none; both classes see the whole limit). A [`Priority::Low`] caller
    /// is refused once the window holds `rpm − ⌈rpm × share⌉` hits of any
    /// class (and, with
    /// [`tokens_per_window`](Self::tokens_per_window), once its estimate
    /// would take the window past the tokens less their share); a high
    /// caller may use the whole limit. Between 0 and 1, exclusive, and
    /// leaving the low class at least one request (and one token) per
    /// window.
    pub fn reserve(mut self, share: f64) -> Self {
        self.reserve = Some(share);
        self
    }

    /// What `acquire` does while the cache is unavailable (default
    /// [`OnCacheUnavailable::LocalLimit`]).
    pub fn on_cache_unavailable(mut self, policy: OnCacheUnavailable) -> Self {
        self.on_cache_unavailable = policy;
        self
    }

    /// The clock the limiter reads and the observer its events go to
    /// (default [`Env::system`]).
    pub fn env(mut self, env: Env) -> Self {
        self.env = Some(env);
        self
    }
}

impl<S: LimiterStore> RateLimiterBuilder<S> {
    /// Validates and builds. `rpm` and `window_seconds` must be positive; the
    /// key prefix must be non-empty and at most 91 bytes.
    pub fn build(self) -> Result<RateLimiter<S>, ConfigError> {
        if self.rpm == 0 {
            return Err(ConfigError::new("rpm", "positive", self.rpm));
        }
        if self.window.is_zero() {
            return Err(ConfigError::new(
                "window_seconds",
                "positive",
                crate::time::secs(self.window),
            ));
        }
        if self.prefix.is_empty() || self.prefix.len() > MAX_PREFIX_LEN {
            return Err(ConfigError::new(
                "key_prefix",
                "non-empty and at most 91 bytes",
                format!("{:?}", self.prefix),
            ));
        }
        let max_ahead = match self.max_ahead {
            None => default_max_clock_ahead(self.window),
            Some(d) if d <= self.window => d,
            Some(d) => {
                return Err(ConfigError::new(
                    "max_clock_ahead",
                    "at most window_seconds",
                    crate::time::secs(d),
                ));
            }
        };
        if let Some(limit) = self.tokens
            && !(1..=MAX_TOKENS_PER_WINDOW).contains(&limit)
        {
            return Err(ConfigError::new("tokens_per_window", "between 1 and 2^53", limit));
        }
        let token_lease = self.token_lease.unwrap_or(self.window);
        if token_lease.is_zero() || token_lease > self.window {
            return Err(ConfigError::new(
                "token_lease",
                "positive and at most window_seconds",
                crate::time::secs(token_lease),
            ));
        }
        let reserved = match self.reserve {
            None => Reserved::default(),
            Some(share) if share.is_finite() && share > 0.0 && share < 1.0 => {
                let requests = reserve_of(u64::from(self.rpm), share);
                let tokens = self.tokens.map_or(0, |limit| reserve_of(limit, share));
                if requests >= u64::from(self.rpm) || self.tokens.is_some_and(|limit| tokens >= limit) {
                    return Err(ConfigError::new(
                        "reserve",
                        "small enough to leave the low class a request and a token per window",
                        share,
                    ));
                }
                Reserved {
                    requests: u32::try_from(requests).unwrap_or(u32::MAX),
                    tokens,
                }
            }
            Some(share) => return Err(ConfigError::new("reserve", "between 0 and 1, exclusive", share)),
        };
        let env = self.env.unwrap_or_default();
        let clock = env.clock().clone();
        let (store, owns_store) = self.store.resolve(&clock);
        let local =
            (self.on_cache_unavailable == OnCacheUnavailable::LocalLimit).then(|| MemoryCache::new(clock.clone()));
        Ok(RateLimiter {
            prefix: Arc::from(self.prefix),
            store,
            owns_store,
            clock,
            observer: Listener::new(env.observer().clone()),
            on_cache_unavailable: self.on_cache_unavailable,
            tokens: self.tokens,
            token_lease,
            local,
            slot: slot_template(self.rpm, self.window, max_ahead),
            reserved,
        })
    }
}

impl<S: LimiterStore> RateLimiter<S> {
    /// Calls allowed per tenant per window.
    pub fn rpm(&self) -> u32 {
        self.slot.limit
    }

    /// Calls per window a caller of `priority` may take: `rpm`, less the
    /// [`reserve`](RateLimiterBuilder::reserve) for a low one.
    pub fn rpm_for(&self, priority: Priority) -> u32 {
        self.slot.limit - self.held_back(priority).requests
    }

    /// What a caller of `priority` may not use: the reserve for a low one
    /// (nothing under the [`Mutant`](crate::mutants::Mutant) that ignores it).
    fn held_back(&self, priority: Priority) -> Reserved {
        match priority {
            Priority::Low if !crate::mutants::active(crate::mutants::Mutant::PriorityIgnored) => self.reserved,
            Priority::High | Priority::Low => Reserved::default(),
        }
    }

    /// The window width.
    pub fn window(&self) -> Duration {
        self.slot.window
    }

    /// The key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// How far ahead of a caller-stamped store's clock this limiter's clock is
    /// taken as it is (see [`RateLimiterBuilder::max_clock_ahead`]).
    pub fn max_clock_ahead(&self) -> Duration {
        self.slot.max_ahead
    }

    /// The cache the limiter keeps its hits in.
    pub fn cache(&self) -> &Arc<S> {
        &self.store
    }

    /// Takes a slot for `tenant`, or says when one frees.
    ///
    /// Call it immediately before the model call. On refusal nothing is
    /// recorded, so asking again costs nothing — but asking again before
    /// [`RateLimitExceeded::retry_after`] has passed is refused again. The
    /// clock is read once and the same instant is used for the count, the
    /// hit that frees a slot and the new hit.
    pub async fn acquire(&self, tenant: TenantId) -> Result<Admission, AcquireError> {
        self.acquire_as(tenant, Priority::High).await
    }

    /// [`acquire`](Self::acquire) for a caller of `priority`: a
    /// [`Priority::Low`] caller is refused once the window holds the limit
    /// less the [`reserve`](RateLimiterBuilder::reserve), and told when
    /// enough hits have aged out for it.
    pub async fn acquire_as(&self, tenant: TenantId, priority: Priority) -> Result<Admission, AcquireError> {
        let request = self.slot_request(priority);
        // On the stack: no allocation per call.
        let key = KeyBuf::tenant(&self.prefix, &tenant);
        #[cfg(feature = "mutants")]
        let decided = match self.mutated_slot(key.as_str(), request).await {
            Some(decided) => decided,
            None => self.store.acquire_slot(key.as_str(), request).await,
        };
        #[cfg(not(feature = "mutants"))]
        let decided = self.store.acquire_slot(key.as_str(), request).await;
        match decided {
            Ok(outcome) => self.conclude(tenant, priority, request.now, outcome, DecidedBy::Store),
            Err(error) => self.answer_error(tenant, priority, key.as_str(), &request, error).await,
        }
    }

    /// `acquire`'s answer when the store could not answer: the
    /// [`OnCacheUnavailable`] fallback's for a transient error, the error
    /// for any other.
    async fn answer_error(
        &self,
        tenant: TenantId,
        priority: Priority,
        key: &str,
        request: &SlotRequest,
        error: CacheError,
    ) -> Result<Admission, AcquireError> {
        if !error.is_transient() {
            return Err(AcquireError::Cache(error));
        }
        match self.fall_back("acquire_slot", &error, tenant, priority, request.now) {
            Fallback::Local(local) => match local.acquire_slot(key, *request).await {
                Ok(outcome) => self.conclude(tenant, priority, request.now, outcome, DecidedBy::Local),
                Err(_) => Err(AcquireError::Cache(error)),
            },
            Fallback::Admit => Ok(Admission { remaining: 0 }),
            Fallback::Refuse => Err(AcquireError::Cache(error)),
        }
    }

    /// The store's step with the limiter's [`Mutant`](crate::mutants::Mutant)
    /// injected, if one is (`None`: none is, and the real step runs). Only
    /// the step changes: the answer is reported, and an unavailable store
    /// falls back, as any other. The variants that split the step into
    /// separate calls need the store's [`HitWindow`]; on a store without
    /// one (see [`LimiterStore::hit_window`]) the real step runs.
    #[cfg(feature = "mutants")]
    async fn mutated_slot(&self, key: &str, request: SlotRequest) -> Option<Result<SlotOutcome, CacheError>> {
        use crate::decide::window::decide;
        use crate::mutants::{Mutant, injected};
        let mutant = injected()?;
        Some(match mutant {
            // The spec's original limiter: count, then the oldest hit, then
            // record — three calls a racing worker can interleave with, all
            // stamped by this worker's clock, as that limiter stamped them.
            // It knew only the oldest hit, so a caller over a lowered limit
            // (a low class) is told too short a wait, as that limiter would.
            Mutant::ThreeCallLimiter => {
                let hits = self.store.hit_window()?;
                let now = self.clock.now();
                let since = now.saturating_sub(self.slot.window);
                let used = match hits.count_since(key, since).await {
                    Ok(used) => used,
                    Err(e) => return Some(Err(e)),
                };
                let oldest = if used < u64::from(request.limit) {
                    None
                } else {
                    match hits.oldest_since(key, since).await {
                        Ok(oldest) => oldest,
                        Err(e) => return Some(Err(e)),
                    }
                };
                let outcome = decide(used, oldest, request.limit, now, self.slot.window);
                if matches!(outcome, SlotOutcome::Admitted { .. })
                    && let Err(e) = hits.record_hit(key, now, request.ttl).await
                {
                    return Some(Err(e));
                }
                Ok(outcome)
            }
            // The atomic step, but a refusal is recorded as a hit too.
            Mutant::RefusalsRecorded => {
                let hits = self.store.hit_window()?;
                match self.store.acquire_slot(key, request).await {
                    Ok(refused @ SlotOutcome::Refused { at, .. }) => {
                        hits.record_hit(key, at, request.ttl).await.map(|()| refused)
                    }
                    other => other,
                }
            }
            // A counter per clock-aligned window: the atomic step, counting
            // only the hits since the current window began on this worker's
            // clock.
            Mutant::FixedWindowLimiter => {
                let now = self.clock.now();
                let width = self.slot.window.as_micros().max(1);
                let into = Duration::from_micros(u64::try_from(u128::from(now.as_micros()) % width).unwrap_or(0));
                let fixed = SlotRequest {
                    now,
                    window: into,
                    ..request
                };
                self.store.acquire_slot(key, fixed).await
            }
            _ => return None,
        })
    }

    /// Tokens allowed per tenant per window, if limited.
    pub fn tokens_per_window(&self) -> Option<u64> {
        self.tokens
    }

    /// The slot request `acquire` and `acquire_tokens` send for a caller
    /// of `priority`: the template, with the class's limit.
    fn slot_request(&self, priority: Priority) -> SlotRequest {
        let request = self.stamped_request().unwrap_or(self.slot);
        SlotRequest {
            limit: self.rpm_for(priority),
            ..request
        }
    }

    /// The template stamped with our clock — or `None` for a store that
    /// stamps with its own and ignores ours: then the template, whose `now`
    /// is the epoch, is the request as it is (no clock read, no copy).
    fn stamped_request(&self) -> Option<SlotRequest> {
        (!self.store.stamps_with_own_clock()).then(|| SlotRequest {
            now: self.clock.now(),
            ..self.slot
        })
    }

    /// Tells the observer `event`, built only when it is
    /// [`enabled`](Observer::enabled) (asked only where its
    /// [`interest`](Observer::interest) may change).
    #[inline]
    fn emit(&self, event: impl FnOnce() -> Event) {
        if self.observer.enabled() {
            self.observer.on_event(&event());
        }
    }

    /// Reports a store that could not answer `operation` and says what the
    /// [`OnCacheUnavailable`] policy does instead: decide locally, admit
    /// without a limit (reported as an admission decided by nobody), or
    /// refuse.
    fn fall_back(
        &self,
        operation: &'static str,
        error: &CacheError,
        tenant: TenantId,
        priority: Priority,
        at: Timestamp,
    ) -> Fallback<'_> {
        self.emit(|| Event::CacheUnavailable {
            component: self.prefix.clone(),
            operation,
            fallback: self.on_cache_unavailable.as_str(),
            error: error.to_string(),
        });
        match (self.on_cache_unavailable, &self.local) {
            (OnCacheUnavailable::LocalLimit, Some(local)) => Fallback::Local(local),
            (OnCacheUnavailable::Admit, _) => {
                self.emit(|| Event::RateLimitAdmitted {
                    limiter: self.prefix.clone(),
                    tenant,
                    priority,
                    remaining: 0,
                    at,
                    decided_by: DecidedBy::Unlimited,
                });
                Fallback::Admit
            }
            _ => Fallback::Refuse,
        }
    }

    /// Reports a store's answer (`decided_by` says which store) and turns it
    /// into `acquire`'s.
    // Inlined into every decision: as a call it cost each acquire 27
    // instructions (callgrind, `examples/hot_loop.rs`).
    #[inline(always)]
    fn conclude(
        &self,
        tenant: TenantId,
        priority: Priority,
        asked: Timestamp,
        outcome: SlotOutcome,
        decided_by: DecidedBy,
    ) -> Result<Admission, AcquireError> {
        if outcome.clamped() {
            self.emit(|| Event::StampClamped {
                limiter: self.prefix.clone(),
                tenant,
                asked,
                used: outcome.at(),
            });
        }
        match outcome {
            SlotOutcome::Admitted { remaining, at, .. } => {
                self.emit(|| Event::RateLimitAdmitted {
                    limiter: self.prefix.clone(),
                    tenant,
                    priority,
                    remaining,
                    at,
                    decided_by,
                });
                Ok(Admission { remaining })
            }
            SlotOutcome::Refused {
                used, retry_after, at, ..
            } => {
                self.emit(|| Event::RateLimitRefused {
                    limiter: self.prefix.clone(),
                    tenant,
                    priority,
                    retry_after,
                    at,
                    decided_by,
                });
                Err(AcquireError::Limited(RateLimitExceeded {
                    tenant,
                    priority,
                    limit: self.rpm_for(priority),
                    reserved: self.held_back(priority).requests,
                    used,
                    window: self.slot.window,
                    retry_after,
                }))
            }
        }
    }

    /// How many calls `tenant` may still make in the current window:
    /// `max(0, rpm − hits in the window)`. Never negative; takes no slot and
    /// records nothing. A snapshot, not a reservation — only
    /// [`acquire`](Self::acquire) grants.
    ///
    /// It reads the store's hit series, so it needs a store with the
    /// [`HitWindow`] capability (both stores this crate ships have it).
    pub async fn remaining(&self, tenant: TenantId) -> Result<u32, CacheError>
    where
        S: HitWindow,
    {
        let key = KeyBuf::tenant(&self.prefix, &tenant);
        let since = self.clock.now().saturating_sub(self.slot.window);
        let used = self.store.count_since(key.as_str(), since).await?;
        Ok(u32::try_from(u64::from(self.slot.limit).saturating_sub(used)).unwrap_or(0))
    }

    /// Takes a slot for `tenant` and reserves `estimate` tokens (the prompt's
    /// estimate plus `max_tokens`) in the same atomic step: both or neither.
    /// Without [`tokens_per_window`](RateLimiterBuilder::tokens_per_window)
    /// this is [`acquire`](Self::acquire) and reserves nothing.
    ///
    /// Settle the reservation with what the server's `usage` says once the
    /// call ends ([`settle`](Self::settle)), or [`release`](Self::release) it
    /// when the call failed before the server used anything; a reservation
    /// neither settled nor released counts until its
    /// [`token_lease`](RateLimiterBuilder::token_lease) ends.
    pub async fn acquire_tokens(&self, tenant: TenantId, estimate: u64) -> Result<TokenAdmission, TokenAcquireError>
    where
        S: TokenStore,
    {
        self.acquire_tokens_as(tenant, estimate, Priority::High).await
    }

    /// [`acquire_tokens`](Self::acquire_tokens) for a caller of `priority`:
    /// a [`Priority::Low`] caller sees the requests and the tokens per window
    /// less their [`reserve`](RateLimiterBuilder::reserve).
    pub async fn acquire_tokens_as(
        &self,
        tenant: TenantId,
        estimate: u64,
        priority: Priority,
    ) -> Result<TokenAdmission, TokenAcquireError>
    where
        S: TokenStore,
    {
        let Some(limit) = self.tokens else {
            return match self.acquire_as(tenant, priority).await {
                Ok(a) => Ok(TokenAdmission {
                    remaining: a.remaining,
                    tokens_left: u64::MAX,
                    reservation: None,
                }),
                Err(AcquireError::Limited(e)) => Err(TokenAcquireError::Limited(e)),
                Err(AcquireError::Cache(e)) => Err(TokenAcquireError::Cache(e)),
            };
        };
        let limit = limit - self.held_back(priority).tokens;
        let ask = tokens::TokenAsk {
            tokens: estimate,
            limit,
            lease: self.token_lease,
        };
        if estimate > limit {
            // Never fits, whatever the store holds: refused without asking it
            // (an estimate beyond 2⁵³ is not one a Redis script can take).
            let request = SlotRequest {
                now: self.clock.now(),
                ..self.slot_request(priority)
            };
            let refusal = tokens::TokenOutcome::Refused {
                by: tokens::RefusedBy::TooLarge,
                requests_used: 0,
                tokens_used: 0,
                retry_after: self.slot.window,
                at: request.now,
                clamped: false,
            };
            return self.conclude_tokens(tenant, priority, request.now, ask, refusal, DecidedBy::Local);
        }
        let request = self.slot_request(priority);
        let key = KeyBuf::tenant(&self.prefix, &tenant);
        match self.store.acquire_with_tokens(key.as_str(), request, ask).await {
            Ok(outcome) => self.conclude_tokens(tenant, priority, request.now, ask, outcome, DecidedBy::Store),
            Err(error) if error.is_transient() => {
                match self.fall_back("acquire_with_tokens", &error, tenant, priority, request.now) {
                    Fallback::Local(local) => {
                        let request = SlotRequest {
                            now: self.clock.now(),
                            ..request
                        };
                        match local.acquire_with_tokens(key.as_str(), request, ask).await {
                            Ok(outcome) => {
                                self.conclude_tokens(tenant, priority, request.now, ask, outcome, DecidedBy::Local)
                            }
                            Err(_) => Err(TokenAcquireError::Cache(error)),
                        }
                    }
                    Fallback::Admit => Ok(TokenAdmission {
                        remaining: 0,
                        tokens_left: 0,
                        reservation: None,
                    }),
                    Fallback::Refuse => Err(TokenAcquireError::Cache(error)),
                }
            }
            Err(error) => Err(TokenAcquireError::Cache(error)),
        }
    }

    /// Settles `reservation` to the `actual` tokens the call used (the
    /// response's `usage`): a refund when it used less than its estimate, a
    /// charge when more (at most [`MAX_TOKENS_PER_WINDOW`]). `Ok(false)`
    /// when the ledger no longer holds it (it left the window, or the store
    /// restarted).
    pub async fn settle(&self, tenant: TenantId, reservation: &Reservation, actual: u64) -> Result<bool, CacheError>
    where
        S: TokenStore,
    {
        // A server's usage is outside input: held to what a window can count.
        let actual = actual.min(MAX_TOKENS_PER_WINDOW);
        let key = KeyBuf::tenant(&self.prefix, &tenant);
        let found = match (reservation.decided_by, &self.local) {
            (DecidedBy::Local, Some(local)) => local.settle_tokens(key.as_str(), reservation.id, actual).await?,
            (DecidedBy::Local | DecidedBy::Unlimited, _) => false,
            (DecidedBy::Store, _) => self.store.settle_tokens(key.as_str(), reservation.id, actual).await?,
        };
        self.emit(|| Event::TokensSettled {
            limiter: self.prefix.clone(),
            tenant,
            estimate: reservation.estimate,
            actual,
            found,
        });
        Ok(found)
    }

    /// Releases `reservation`: settles it to zero, for a call that failed
    /// before the server used anything.
    pub async fn release(&self, tenant: TenantId, reservation: &Reservation) -> Result<bool, CacheError>
    where
        S: TokenStore,
    {
        self.settle(tenant, reservation, 0).await
    }

    /// Reports a combined answer and turns it into `acquire_tokens`'.
    fn conclude_tokens(
        &self,
        tenant: TenantId,
        priority: Priority,
        asked: Timestamp,
        ask: tokens::TokenAsk,
        outcome: tokens::TokenOutcome,
        decided_by: DecidedBy,
    ) -> Result<TokenAdmission, TokenAcquireError> {
        use tokens::{RefusedBy, TokenOutcome};
        let clamped = match outcome {
            TokenOutcome::Admitted { clamped, .. } | TokenOutcome::Refused { clamped, .. } => clamped,
        };
        if clamped {
            self.emit(|| Event::StampClamped {
                limiter: self.prefix.clone(),
                tenant,
                asked,
                used: outcome.at(),
            });
        }
        match outcome {
            TokenOutcome::Admitted {
                remaining,
                tokens_used,
                reservation,
                ..
            } => {
                self.emit(|| Event::RateLimitAdmitted {
                    limiter: self.prefix.clone(),
                    tenant,
                    priority,
                    remaining,
                    at: reservation.at,
                    decided_by,
                });
                self.emit(|| Event::TokensReserved {
                    limiter: self.prefix.clone(),
                    tenant,
                    estimate: ask.tokens,
                    used_before: tokens_used,
                    at: reservation.at,
                    decided_by,
                });
                Ok(TokenAdmission {
                    remaining,
                    tokens_left: ask.limit.saturating_sub(tokens_used).saturating_sub(ask.tokens),
                    reservation: Some(Reservation {
                        id: reservation,
                        estimate: ask.tokens,
                        decided_by,
                    }),
                })
            }
            TokenOutcome::Refused {
                by: RefusedBy::Requests,
                requests_used,
                retry_after,
                at,
                ..
            } => {
                self.emit(|| Event::RateLimitRefused {
                    limiter: self.prefix.clone(),
                    tenant,
                    priority,
                    retry_after,
                    at,
                    decided_by,
                });
                Err(TokenAcquireError::Limited(RateLimitExceeded {
                    tenant,
                    priority,
                    limit: self.rpm_for(priority),
                    reserved: self.held_back(priority).requests,
                    used: requests_used,
                    window: self.slot.window,
                    retry_after,
                }))
            }
            TokenOutcome::Refused {
                by,
                tokens_used,
                retry_after,
                at,
                ..
            } => {
                self.emit(|| Event::TokensRefused {
                    limiter: self.prefix.clone(),
                    tenant,
                    priority,
                    estimate: ask.tokens,
                    used: tokens_used,
                    retry_after,
                    at,
                    decided_by,
                });
                Err(TokenAcquireError::Tokens(TokenLimitExceeded {
                    tenant,
                    by,
                    asked: ask.tokens,
                    used: tokens_used,
                    limit: ask.limit,
                    window: self.slot.window,
                    retry_after,
                }))
            }
        }
    }

    /// Releases the cache if the limiter built it; a cache passed in is the
    /// caller's and stays open.
    pub async fn close(&self) -> Result<(), CacheError> {
        if let Some(local) = &self.local {
            local.close().await?;
        }
        if self.owns_store {
            self.store.close().await
        } else {
            Ok(())
        }
    }
}
