//! The cache port: where the limiter and the breaker keep their state.
//!
//! A fleet sharing one cache stays exact only if every decision is one
//! indivisible step. So the port is one trait per atomic step, each applying
//! a pure function of [`crate::decide`]; an adapter supplies only the
//! atomicity — one critical section in memory, one script on Redis — and the
//! compliance suite in [`crate::testing`] holds every adapter to the same
//! answers:
//!
//! - [`LimiterStore::acquire_slot`]: count, compare, record
//!   ([`window::decide`](crate::decide::window::decide)), where the spec's
//!   limiter made three calls a fleet could interleave and over-admit;
//! - [`TokenStore`]: the slot and a token reservation together
//!   ([`tokens::decide_tokens`](crate::decide::tokens::decide_tokens));
//! - [`BreakerStore::breaker_step`]: one breaker transition
//!   ([`breaker::step`](crate::decide::breaker::step)), where the spec read
//!   then wrote;
//! - [`BudgetStore::budget_step`]: a fleet's retry budget
//!   ([`budget::step`](crate::decide::budget::step));
//! - [`InFlightStore::pick_least_loaded`]: a router's least-loaded pick
//!   ([`pick::least_loaded`](crate::decide::pick::least_loaded));
//! - [`InFlightStore::concurrency_step`]: a deployment's adaptive limit on
//!   calls in flight, admitted or ended against its leases
//!   ([`concurrency::step`](crate::decide::concurrency::step)).
//!
//! Beside them, the spec's `Cache` as two capabilities: [`KeyValue`]
//! (string values with TTLs, and counters whose TTL is applied on creation
//! only) and [`HitWindow`] (a key's hit instants, counted from an inclusive
//! instant: the series the limiter's step records into, and what
//! [`RateLimiter::remaining`](crate::RateLimiter::remaining) reads).
//! [`Cache`] is the lifecycle they all share.
//!
//! Every method is async and fallible: a shared cache is a network peer.

mod keybuf;
mod memory;
#[cfg(feature = "redis")]
pub mod redis;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub(crate) use keybuf::{KeyBuf, MAX_PREFIX_LEN};
pub use memory::MemoryCache;

use crate::clock::Clock;
use crate::decide::breaker::{BreakerCommand, BreakerKeys, BreakerParams, BreakerSnapshot, BreakerStep};
use crate::decide::budget::{BudgetCommand, BudgetParams, BudgetStep};
use crate::decide::concurrency::{ConcurrencyCommand, ConcurrencyParams, ConcurrencyStep};
use crate::decide::pick::{Pick, PickRequest};
use crate::decide::tokens::{ReservationId, TokenAsk, TokenOutcome};
use crate::decide::window::SlotOutcome;
use crate::error::CacheError;
use crate::time::Timestamp;

/// Whose clock stamps hits and breaker timestamps in an atomic operation.
///
/// A shared store stamps with its own clock by default, so a fleet agrees on
/// one clock whatever its members' clocks say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeSource {
    /// The caller's clock (the spec's behaviour): each worker stamps with its
    /// own `now`. The skew-sensitive choice: a limiter decision's stamp is
    /// clamped into `[store − window, store + max_clock_ahead]`
    /// ([`crate::decide::window::clamp_stamp`], reported as
    /// [`Event::StampClamped`](crate::Event::StampClamped)), and a tenant can
    /// get up to [`crate::decide::window::skew_bound`] admissions per window — twice
    /// `rpm` while the clocks stay within a window of each other, three times
    /// at worst — when the fleet's clocks disagree.
    Caller,
    /// The cache's own clock (Redis `TIME`, the cache host's clock), the
    /// default: one clock for the whole fleet, so skewed workers still agree
    /// and the limit is exact.
    #[default]
    Store,
}

/// Lifecycle shared by every cache capability.
pub trait Cache: Send + Sync + 'static {
    /// Releases the cache's resources. Idempotent: a second call succeeds and
    /// does nothing. Operations after `close` fail with [`CacheError::Closed`].
    fn close(&self) -> impl Future<Output = Result<(), CacheError>> + Send;

    /// Whether every atomic operation ([`LimiterStore::acquire_slot`],
    /// [`BreakerStore::breaker_step`], [`BreakerStore::breaker_read`]) stamps
    /// with the cache's own clock and ignores the caller's `now` — true of a
    /// store under [`TimeSource::Store`] that knows it. A component then skips
    /// reading its own clock for the request: one clock read per decision
    /// instead of two. The default, `false`, is always correct.
    fn stamps_with_own_clock(&self) -> bool {
        false
    }
}

/// String values with TTLs, and counters.
pub trait KeyValue: Cache {
    /// The live value at `key`, if any. A counter reads back as its decimal string.
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<String>, CacheError>> + Send;

    /// Stores `value` at `key`, replacing any value (and its TTL). With `ttl`,
    /// the value expires that long after now on the cache's clock.
    fn set(&self, key: &str, value: &str, ttl: Option<Duration>)
    -> impl Future<Output = Result<(), CacheError>> + Send;

    /// Adds one to the integer at `key` and returns the new value. A missing or
    /// expired key starts from zero and is created with `ttl`; a live key keeps
    /// its existing deadline — `ttl` is applied on creation only. A value that is
    /// not a decimal integer is [`CacheError::NotAnInteger`].
    fn increment(&self, key: &str, ttl: Option<Duration>) -> impl Future<Output = Result<i64, CacheError>> + Send;

    /// Removes `key`'s value and its hit window, if any. Deleting nothing is fine.
    fn delete(&self, key: &str) -> impl Future<Output = Result<(), CacheError>> + Send;
}

/// A series of hit instants per key.
///
/// A key's window is independent of any value stored at the same key with
/// [`KeyValue::set`]; [`KeyValue::delete`] clears both.
pub trait HitWindow: Cache {
    /// Records one hit at the caller-given instant `at`. Two hits at the same
    /// instant are two hits. The series expires `ttl` after this call on the
    /// cache's clock, and hits older than `ttl` before the cache's clock are
    /// discarded, so a series never holds more than one `ttl` of history —
    /// and a far-future `at` cannot prune anyone else's hits.
    fn record_hit(
        &self,
        key: &str,
        at: Timestamp,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), CacheError>> + Send;

    /// How many hits were recorded at or after `since` (inclusive).
    fn count_since(&self, key: &str, since: Timestamp) -> impl Future<Output = Result<u64, CacheError>> + Send;

    /// The earliest hit at or after `since`, if any.
    fn oldest_since(
        &self,
        key: &str,
        since: Timestamp,
    ) -> impl Future<Output = Result<Option<Timestamp>, CacheError>> + Send;
}

/// What [`LimiterStore::acquire_slot`] is asked to decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SlotRequest {
    /// The caller's `now` (ignored under [`TimeSource::Store`]; clamped by
    /// [`crate::decide::window::clamp_stamp`] under [`TimeSource::Caller`]).
    pub now: Timestamp,
    /// The sliding window's width.
    pub window: Duration,
    /// Hits allowed per window.
    pub limit: u32,
    /// The series' lifetime after a recorded hit, and how far behind the
    /// store's clock hits are pruned (the limiter passes
    /// `2 × window + max_ahead + 1 µs`).
    pub ttl: Duration,
    /// Under [`TimeSource::Caller`], how far ahead of the store's clock a
    /// caller's `now` is taken as it is; further ahead it is clamped (see
    /// [`crate::decide::window::clamp_stamp`]).
    pub max_ahead: Duration,
}

/// The limiter's check-and-record as one atomic step.
///
/// The only method a store needs for [`RateLimiter::acquire`](crate::RateLimiter::acquire);
/// [`HitWindow`] is a separate capability, needed only by
/// [`RateLimiter::remaining`](crate::RateLimiter::remaining).
pub trait LimiterStore: Cache {
    /// Atomically: count the hits at `key` in `[now − window, now]`; if fewer
    /// than `limit`, record a hit at `now` (as [`HitWindow::record_hit`] with
    /// `ttl`) and report what remains; otherwise record nothing and report when
    /// the hit at [`freeing_rank`](crate::decide::window::freeing_rank) —
    /// the oldest at the limit, a later one when the window holds more, as
    /// under a caller's lowered limit — ages out. The decision is
    /// [`crate::decide::window::decide`]; `now` is the caller's or the store's per its
    /// [`TimeSource`].
    fn acquire_slot(
        &self,
        key: &str,
        request: SlotRequest,
    ) -> impl Future<Output = Result<SlotOutcome, CacheError>> + Send;

    /// This store's [`HitWindow`], if it has one: what the limiter's
    /// known-bad variants that split the step into separate calls run on
    /// ([`crate::mutants`]). A store without one runs them as the real step.
    #[cfg(feature = "mutants")]
    #[doc(hidden)]
    fn hit_window(&self) -> Option<&impl HitWindow> {
        None::<&MemoryCache>
    }
}

/// Tokens per window beside requests per window, in the same atomic step.
pub trait TokenStore: LimiterStore {
    /// Atomically: decide the request slot at `key` as
    /// [`LimiterStore::acquire_slot`] does, and a reservation of `ask.tokens`
    /// on `key`'s token ledger by [`crate::decide::tokens::decide_tokens`];
    /// when both fit, record the hit and the reservation (leased until
    /// `now + ask.lease`) at the same stamp, otherwise record nothing. The
    /// ledger keeps reservations `request.ttl` before the store's clock, as
    /// the hit window keeps hits.
    fn acquire_with_tokens(
        &self,
        key: &str,
        request: SlotRequest,
        ask: TokenAsk,
    ) -> impl Future<Output = Result<TokenOutcome, CacheError>> + Send;

    /// Sets reservation `id` at `key` to the `actual` tokens used and ends
    /// its lease: `true` when the ledger still held it.
    fn settle_tokens(
        &self,
        key: &str,
        id: ReservationId,
        actual: u64,
    ) -> impl Future<Output = Result<bool, CacheError>> + Send;
}

/// Calls in flight per deployment, for a router's least-loaded pick.
pub trait InFlightStore: Cache {
    /// Atomically: drop the leases that ended before `now` (the caller's or
    /// the store's per its [`TimeSource`]) at each of `keys`, pick by
    /// [`crate::decide::pick::least_loaded`] over their live counts and
    /// `weights` (one per key), and add a lease named `request.id` at the
    /// key picked, lasting until `now + request.lease` (inclusive).
    ///
    /// On a Redis Cluster the keys must share a hash slot (a `{tag}`).
    /// No candidate (no keys, every weight zero, or more than
    /// [`MAX_DEPLOYMENTS`](crate::decide::pick::MAX_DEPLOYMENTS)) is a
    /// [`CacheError::Protocol`] naming the operation: a caller's bug.
    fn pick_least_loaded(
        &self,
        keys: &[&str],
        weights: &[u32],
        request: PickRequest,
    ) -> impl Future<Output = Result<Pick, CacheError>> + Send;

    /// Ends lease `id` at `key`; ending one that already ended is fine.
    fn end_in_flight(&self, key: &str, id: u64) -> impl Future<Output = Result<(), CacheError>> + Send;

    /// Atomically: drop the leases that ended before `now` (as
    /// [`pick_least_loaded`](Self::pick_least_loaded) judges it) in `key`'s
    /// in-flight set, read the limit stored at `key` itself (a decimal
    /// string of millionths; anything unreadable heals to `params.initial`,
    /// reported as `healed`), apply
    /// [`crate::decide::concurrency::step`] to `command`, and write what it
    /// says: an admitted call leased as `request.id` until `now +
    /// request.lease`, a completing call's lease `request.id` ended, and the
    /// limit, kept `params.ttl`.
    fn concurrency_step(
        &self,
        key: &str,
        command: ConcurrencyCommand,
        params: ConcurrencyParams,
        request: PickRequest,
    ) -> impl Future<Output = Result<ConcurrencyStep, CacheError>> + Send;
}

/// The breaker's transitions as atomic steps over its seven keys.
pub trait BreakerStore: Cache {
    /// Atomically: read the breaker's stored keys, apply
    /// [`crate::decide::breaker::step`] for `command` at `now` (the caller's or
    /// the store's, per its [`TimeSource`]), write what it says, and return it.
    fn breaker_step(
        &self,
        keys: &BreakerKeys,
        command: BreakerCommand,
        params: BreakerParams,
        now: Timestamp,
    ) -> impl Future<Output = Result<BreakerStep, CacheError>> + Send;

    /// Reads the breaker's stored keys without changing anything, returning
    /// them with the instant they should be judged at (`now`, or the store's
    /// clock under [`TimeSource::Store`]).
    fn breaker_read(
        &self,
        keys: &BreakerKeys,
        now: Timestamp,
    ) -> impl Future<Output = Result<(BreakerSnapshot, Timestamp), CacheError>> + Send;
}

/// A retry budget's bucket as one atomic step.
pub trait BudgetStore: Cache {
    /// Atomically: read the bucket at `key` (a value written by
    /// [`BudgetState::encode`](crate::decide::budget::BudgetState::encode); absent,
    /// expired or unreadable reads as empty, and `healed` says a foreign value
    /// was replaced), apply [`crate::decide::budget::step`] for `command` at
    /// `now` — the caller's, clamped to at most `params.max_ahead` past the
    /// store's clock ([`crate::decide::budget::clamp_budget_stamp`]), or the store's
    /// own per its [`TimeSource`] — write the bucket back with `params.ttl`,
    /// and return the step.
    fn budget_step(
        &self,
        key: &str,
        command: BudgetCommand,
        params: BudgetParams,
        now: Timestamp,
    ) -> impl Future<Output = Result<BudgetStep, CacheError>> + Send;
}

/// Which cache a component uses: one it builds (and owns, and closes), or one
/// it is given (and leaves open).
pub(crate) enum StoreSlot<S> {
    /// Build this store on the component's clock; the component owns it.
    Own(fn(Arc<dyn Clock>) -> S),
    /// Use the caller's store; the caller owns it.
    Shared(Arc<S>),
}

impl<S> StoreSlot<S> {
    /// The store, and whether the component owns it.
    pub(crate) fn resolve(self, clock: &Arc<dyn Clock>) -> (Arc<S>, bool) {
        match self {
            StoreSlot::Own(make) => (Arc::new(make(clock.clone())), true),
            StoreSlot::Shared(store) => (store, false),
        }
    }
}
