//! A retry budget: retries may be at most a ratio of first attempts, plus a
//! small floor per second, counted fleet-wide in the shared cache.
//!
//! A per-call retry limit bounds each call, not the fleet: when a model server
//! falls over, every call in flight retries, and the server that is trying to
//! come back gets `1 + max_retries` times the load it fell over under. A
//! budget bounds the sum instead, as Envoy's retry budgets, gRPC's retry
//! throttling and Finagle's `RetryBudget` do (Google's SRE book, "Handling
//! Overload", calls it client-side throttling).
//!
//! # The bucket
//!
//! The budget is a token bucket of retries, kept as one small value in a
//! [`BudgetStore`]:
//!
//! - each call's first attempt **deposits** `ratio` of a retry;
//! - the bucket refills by itself at `min_retries_per_sec` (the floor, so a
//!   quiet client can still retry);
//! - a retry **withdraws** one whole retry, or is denied when the bucket
//!   holds less;
//! - the bucket never holds more than `max_balance` retries, and an empty or
//!   expired one starts at zero.
//!
//! So over **any** interval of length `T`, the retries granted are at most
//!
//! ```text
//! max_balance + ratio × first attempts in the interval + min_retries_per_sec × T
//! ```
//!
//! ([`BudgetParams::bound`]); a server's requests in that interval (first
//! attempts plus granted retries) are at most `(1 + ratio)` times its first
//! attempts plus that floor. The simulator checks this bound on every run
//! that configures a budget.
//!
//! Amounts are integers in millionths of a retry ([`MICROS_PER_RETRY`]), and
//! the floor refills exactly `min_retries_per_sec` of them per microsecond, so
//! the arithmetic is exact in Rust and in a Redis script alike — no rounding
//! drifts an adapter away from [`step`], the one definition every adapter
//! runs. An expired bucket restarts empty, which never grants more than a
//! continuing one would have: the bound holds whatever the TTL.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::cache::{BudgetStore, MemoryCache, StoreSlot};
use crate::clock::{Clock, SystemClock};
use crate::error::{CacheError, ConfigError};
use crate::limiter::{DecidedBy, OnCacheUnavailable};
use crate::observe::{Event, Observer, TracingObserver};
use crate::provider::BoxFuture;
use crate::time::{Timestamp, stored_number};

/// Millionths of a retry per retry: the unit a bucket's balance is kept in.
pub const MICROS_PER_RETRY: u64 = 1_000_000;

/// The default ratio: a fifth of first attempts may be retried (Envoy's
/// `budget_percent` default, Finagle's `percentCanRetry`).
pub const DEFAULT_RATIO: f64 = 0.2;

/// The default floor: ten retries a second whatever the traffic (Finagle's
/// `minRetriesPerSec` default), so a quiet client is never starved.
pub const DEFAULT_MIN_RETRIES_PER_SEC: u32 = 10;

/// The default most retries a bucket holds: ten, a burst of retries after a
/// quiet spell.
pub const DEFAULT_MAX_BALANCE: u32 = 10;

/// The default key a budget is kept at.
pub const DEFAULT_KEY: &str = "kg:retrybudget";

/// The largest ratio accepted: ten retries per first attempt is already no budget.
pub const MAX_RATIO: f64 = 10.0;

/// The largest floor accepted, in retries per second.
pub const MAX_MIN_RETRIES_PER_SEC: u32 = 1_000;

/// The largest bucket accepted, in retries (so every amount stays below 2⁵³
/// in a Redis script's doubles).
pub const MAX_MAX_BALANCE: u32 = 1_000_000;

/// How a budget's bucket behaves: the validated numbers [`step`] runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BudgetParams {
    /// What one first attempt deposits, in millionths of a retry.
    pub deposit: u64,
    /// The floor: retries per second the bucket refills by itself, which is
    /// also millionths of a retry per microsecond.
    pub refill_per_sec: u32,
    /// The most the bucket holds, in millionths of a retry.
    pub max_balance: u64,
    /// How long an untouched bucket is kept (any TTL is safe: an expired
    /// bucket restarts empty).
    pub ttl: Duration,
    /// Under [`TimeSource::Caller`](crate::TimeSource::Caller), how far ahead
    /// of the store's clock a caller's `now` is taken as it is; further ahead
    /// it is clamped, so one fast clock cannot refill the bucket early by more
    /// than this.
    pub max_ahead: Duration,
}

impl BudgetParams {
    /// The most retries the bucket can grant over an interval of length
    /// `interval` in which `first_attempts` calls deposited:
    /// `max_balance + ratio × first_attempts + min_retries_per_sec × interval`,
    /// rounded down to whole retries.
    pub fn bound(&self, first_attempts: u64, interval: Duration) -> u64 {
        let micros = u128::from(self.max_balance)
            + u128::from(self.deposit) * u128::from(first_attempts)
            + u128::from(self.refill_per_sec) * interval.as_micros();
        u64::try_from(micros / u128::from(MICROS_PER_RETRY)).unwrap_or(u64::MAX)
    }
}

/// What a bucket holds: its balance and the instant it was last brought up
/// to date.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BudgetState {
    /// Millionths of a retry in the bucket.
    pub balance: u64,
    /// The instant the floor's refill was last counted up to.
    pub stamp: Timestamp,
}

impl BudgetState {
    /// The stored form, `"{balance}:{stamp µs}"`, as every adapter writes it.
    pub fn encode(&self) -> String {
        format!("{}:{}", self.balance, self.stamp.as_micros())
    }

    /// Reads a stored value; `None` for anything [`encode`](Self::encode)
    /// would not have written — two decimal numbers of at most 2⁵³ (which a
    /// Redis script's doubles hold exactly) joined by `:`. A foreign writer's
    /// value is treated as an empty bucket, which never grants more than the
    /// real one would.
    pub fn decode(stored: &str) -> Option<Self> {
        let (balance, stamp) = stored.split_once(':')?;
        Some(BudgetState {
            balance: stored_number(balance)?,
            stamp: Timestamp::from_micros(stored_number(stamp)?),
        })
    }
}

/// What a budget step is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum BudgetCommand {
    /// A call's first attempt: add `deposit` (up to the cap). Always granted.
    Deposit,
    /// A retry: take one whole retry, or deny it.
    Withdraw,
}

impl BudgetCommand {
    /// The command's name in events and on the wire (`deposit`, `withdraw`).
    pub const fn as_str(self) -> &'static str {
        match self {
            BudgetCommand::Deposit => "deposit",
            BudgetCommand::Withdraw => "withdraw",
        }
    }
}

/// The result of one budget step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BudgetStep {
    /// Whether the command was granted (a deposit always is).
    pub granted: bool,
    /// The bucket after the step, as it is stored.
    pub state: BudgetState,
    /// The instant the step was judged at (the caller's, clamped, or the
    /// store's clock).
    pub at: Timestamp,
    /// Whether a stored value that was not a bucket was replaced.
    pub healed: bool,
}

/// The budget's decision: the one definition every adapter runs (a Redis
/// script line for line). `stored` is the bucket as read (`None` when absent,
/// expired or unreadable), `now` the instant to judge at.
///
/// The floor refills `refill_per_sec × elapsed µs` millionths, up to the cap;
/// a clock that went back refills nothing and leaves the stamp where it was.
pub fn step(stored: Option<BudgetState>, command: BudgetCommand, params: &BudgetParams, now: Timestamp) -> BudgetStep {
    let cap = params.max_balance;
    let (balance, stamp) = match stored {
        Some(s) => (s.balance.min(cap), s.stamp),
        None => (0, now),
    };
    let room = cap - balance;
    // Clamped to `room` before multiplying: the product stays below
    // room × 1000 ≤ 2⁵³, as it must in the script's doubles.
    let elapsed = now.as_micros().saturating_sub(stamp.as_micros()).min(room);
    let refill = elapsed.saturating_mul(u64::from(params.refill_per_sec)).min(room);
    let mut balance = balance + refill;
    let stamp = if now > stamp { now } else { stamp };
    let granted = match command {
        BudgetCommand::Deposit => {
            balance = balance.saturating_add(params.deposit).min(cap);
            true
        }
        BudgetCommand::Withdraw if balance >= MICROS_PER_RETRY => {
            balance -= MICROS_PER_RETRY;
            true
        }
        BudgetCommand::Withdraw => false,
    };
    BudgetStep {
        granted,
        state: BudgetState { balance, stamp },
        at: now,
        healed: false,
    }
}

/// Clamps a caller's `now` to at most `max_ahead` past the store's clock (a
/// clock behind refills nothing, so there is no lower clamp).
pub fn clamp_budget_stamp(caller: Timestamp, store: Timestamp, max_ahead: Duration) -> Timestamp {
    caller.min(store.saturating_add(max_ahead))
}

/// A fleet-wide retry budget over a [`BudgetStore`].
///
/// Give it to [`Retry::budget`](crate::Retry::budget) (or a hardened
/// provider's [`retry_budget`](crate::provider::HardenedProviderBuilder::retry_budget)):
/// each run deposits once and withdraws before each retry; a denied retry ends
/// the run with its last error ([`RetryError::Budget`](crate::RetryError)).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use std::sync::Arc;
/// use redstring::{ManualClock, retry::RetryBudget};
///
/// let clock = Arc::new(ManualClock::at_fixed_epoch());
/// let budget = RetryBudget::builder().ratio(0.5).min_retries_per_sec(0).clock(clock).build().unwrap();
/// budget.deposit().await; // two first attempts earn one retry
/// budget.deposit().await;
/// assert!(budget.try_withdraw().await);
/// assert!(!budget.try_withdraw().await);
/// # });
/// ```
pub struct RetryBudget<S = MemoryCache> {
    store: Arc<S>,
    owns_store: bool,
    key: Arc<str>,
    params: BudgetParams,
    ratio: f64,
    clock: Arc<dyn Clock>,
    observer: Arc<dyn Observer>,
    on_cache_unavailable: OnCacheUnavailable,
    local: Option<MemoryCache>,
}

impl<S> fmt::Debug for RetryBudget<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("key", &self.key)
            .field("ratio", &self.ratio)
            .field("min_retries_per_sec", &self.params.refill_per_sec)
            .field("max_balance", &(self.params.max_balance / MICROS_PER_RETRY))
            .field("owns_cache", &self.owns_store)
            .field("on_cache_unavailable", &self.on_cache_unavailable)
            .finish_non_exhaustive()
    }
}

/// Configures a [`RetryBudget`]; [`build`](RetryBudgetBuilder::build) validates.
pub struct RetryBudgetBuilder<S> {
    ratio: f64,
    min_per_sec: u32,
    max_balance: u32,
    key: String,
    store: StoreSlot<S>,
    clock: Option<Arc<dyn Clock>>,
    observer: Option<Arc<dyn Observer>>,
    on_cache_unavailable: OnCacheUnavailable,
    max_ahead: Duration,
}

impl RetryBudget<MemoryCache> {
    /// Starts configuring a budget with the defaults ([`DEFAULT_RATIO`],
    /// [`DEFAULT_MIN_RETRIES_PER_SEC`], [`DEFAULT_MAX_BALANCE`]) in a
    /// private [`MemoryCache`]: a per-process budget until given a shared cache.
    pub fn builder() -> RetryBudgetBuilder<MemoryCache> {
        RetryBudgetBuilder {
            ratio: DEFAULT_RATIO,
            min_per_sec: DEFAULT_MIN_RETRIES_PER_SEC,
            max_balance: DEFAULT_MAX_BALANCE,
            key: DEFAULT_KEY.to_owned(),
            store: StoreSlot::Own(MemoryCache::new),
            clock: None,
            observer: None,
            on_cache_unavailable: OnCacheUnavailable::default(),
            max_ahead: Duration::from_secs(1),
        }
    }
}

impl<S: BudgetStore> RetryBudgetBuilder<S> {
    /// Retries per first attempt (default [`DEFAULT_RATIO`]; 0 to
    /// [`MAX_RATIO`]).
    pub fn ratio(mut self, ratio: f64) -> Self {
        self.ratio = ratio;
        self
    }

    /// Retries per second allowed whatever the traffic (default
    /// [`DEFAULT_MIN_RETRIES_PER_SEC`]; at most [`MAX_MIN_RETRIES_PER_SEC`]).
    pub fn min_retries_per_sec(mut self, n: u32) -> Self {
        self.min_per_sec = n;
        self
    }

    /// The most retries the bucket holds (default [`DEFAULT_MAX_BALANCE`];
    /// 1 to [`MAX_MAX_BALANCE`]).
    pub fn max_balance(mut self, n: u32) -> Self {
        self.max_balance = n;
        self
    }

    /// The key the bucket lives at (default [`DEFAULT_KEY`]). One key, one
    /// budget: give each model server its own to budget them apart.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }

    /// A shared cache: the budget is then fleet-wide. The budget does not own it.
    pub fn cache<T: BudgetStore>(self, cache: Arc<T>) -> RetryBudgetBuilder<T> {
        RetryBudgetBuilder {
            ratio: self.ratio,
            min_per_sec: self.min_per_sec,
            max_balance: self.max_balance,
            key: self.key,
            store: StoreSlot::Shared(cache),
            clock: self.clock,
            observer: self.observer,
            on_cache_unavailable: self.on_cache_unavailable,
            max_ahead: self.max_ahead,
        }
    }

    /// What a step does while the cache is unavailable (default
    /// [`OnCacheUnavailable::LocalLimit`]: a per-process bucket with the same
    /// numbers; `Admit` grants every retry, `Refuse` denies them).
    pub fn on_cache_unavailable(mut self, policy: OnCacheUnavailable) -> Self {
        self.on_cache_unavailable = policy;
        self
    }

    /// Under a caller-stamped cache, how far ahead of the store's clock a
    /// worker's clock is taken as it is (default 1 s).
    pub fn max_clock_ahead(mut self, d: Duration) -> Self {
        self.max_ahead = d;
        self
    }

    /// The clock (default [`SystemClock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Where events go (default [`TracingObserver`]).
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Validates and builds.
    pub fn build(self) -> Result<RetryBudget<S>, ConfigError> {
        if !self.ratio.is_finite() || !(0.0..=MAX_RATIO).contains(&self.ratio) {
            return Err(ConfigError::new("ratio", "between 0 and 10", self.ratio));
        }
        if self.min_per_sec > MAX_MIN_RETRIES_PER_SEC {
            return Err(ConfigError::new(
                "min_retries_per_sec",
                "at most 1000",
                self.min_per_sec,
            ));
        }
        if self.max_balance == 0 || self.max_balance > MAX_MAX_BALANCE {
            return Err(ConfigError::new(
                "max_balance",
                "between 1 and 1000000",
                self.max_balance,
            ));
        }
        if self.key.is_empty() || self.key.len() > crate::cache::MAX_PREFIX_LEN {
            return Err(ConfigError::new(
                "key",
                "non-empty and at most 91 bytes",
                format!("{:?}", self.key),
            ));
        }
        if self.max_ahead > Duration::from_secs(3600) {
            return Err(ConfigError::new(
                "max_clock_ahead",
                "at most 3600 s",
                crate::time::secs(self.max_ahead),
            ));
        }
        let max_balance = u64::from(self.max_balance) * MICROS_PER_RETRY;
        // The time an empty bucket takes to fill by the floor alone, at least
        // a minute, at most an hour.
        let fill = max_balance.checked_div(u64::from(self.min_per_sec)).unwrap_or(u64::MAX);
        let ttl = Duration::from_micros(fill.clamp(60_000_000, 3_600_000_000));
        let params = BudgetParams {
            deposit: (self.ratio * MICROS_PER_RETRY as f64).round() as u64,
            refill_per_sec: self.min_per_sec,
            max_balance,
            ttl,
            max_ahead: self.max_ahead,
        };
        let clock = self.clock.unwrap_or_else(|| Arc::new(SystemClock));
        let (store, owns_store) = self.store.resolve(&clock);
        let local =
            (self.on_cache_unavailable == OnCacheUnavailable::LocalLimit).then(|| MemoryCache::new(clock.clone()));
        Ok(RetryBudget {
            store,
            owns_store,
            key: Arc::from(self.key),
            params,
            ratio: self.ratio,
            clock,
            observer: self.observer.unwrap_or_else(|| Arc::new(TracingObserver)),
            on_cache_unavailable: self.on_cache_unavailable,
            local,
        })
    }
}

impl<S: BudgetStore> RetryBudget<S> {
    /// The numbers the bucket runs on.
    pub fn params(&self) -> &BudgetParams {
        &self.params
    }

    /// Retries per first attempt, as configured.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// The key the bucket lives at.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The cache the bucket is kept in.
    pub fn cache(&self) -> &Arc<S> {
        &self.store
    }

    /// Records a call's first attempt. A cache that cannot be reached is
    /// reported ([`Event::CacheUnavailable`]) and, under
    /// [`OnCacheUnavailable::LocalLimit`], deposited in the local bucket.
    pub async fn deposit(&self) {
        self.run(BudgetCommand::Deposit).await;
    }

    /// Asks for one retry: `true` when granted. A denial is reported as
    /// [`Event::RetryBudgetStep`] with `granted: false`; a cache that cannot be
    /// answered falls back per [`OnCacheUnavailable`] (a closed cache or a
    /// protocol error denies).
    pub async fn try_withdraw(&self) -> bool {
        self.run(BudgetCommand::Withdraw).await
    }

    /// Closes the cache if the budget built it; a shared one stays open.
    pub async fn close(&self) -> Result<(), CacheError> {
        if self.owns_store {
            self.store.close().await
        } else {
            Ok(())
        }
    }

    async fn run(&self, command: BudgetCommand) -> bool {
        let now = if self.store.stamps_with_own_clock() {
            Timestamp::EPOCH
        } else {
            self.clock.now()
        };
        match self.store.budget_step(&self.key, command, self.params, now).await {
            Ok(step) => self.conclude(command, step, DecidedBy::Store),
            Err(error) => {
                let fallback = if error.is_transient() {
                    self.on_cache_unavailable
                } else {
                    OnCacheUnavailable::Refuse
                };
                self.observer.on_event(&Event::CacheUnavailable {
                    component: self.key.clone(),
                    operation: "budget_step",
                    fallback: fallback.as_str(),
                    error: error.to_string(),
                });
                match (fallback, &self.local) {
                    (OnCacheUnavailable::LocalLimit, Some(local)) => {
                        match local
                            .budget_step(&self.key, command, self.params, self.clock.now())
                            .await
                        {
                            Ok(step) => self.conclude(command, step, DecidedBy::Local),
                            Err(_) => command == BudgetCommand::Deposit,
                        }
                    }
                    (OnCacheUnavailable::Admit, _) => {
                        // Granted without a bucket: reported, so the retry
                        // it allows is accounted for.
                        self.observer.on_event(&Event::RetryBudgetStep {
                            budget: self.key.clone(),
                            command,
                            granted: true,
                            balance: 0,
                            at: self.clock.now(),
                            decided_by: DecidedBy::Unlimited,
                        });
                        true
                    }
                    _ => command == BudgetCommand::Deposit,
                }
            }
        }
    }

    fn conclude(&self, command: BudgetCommand, step: BudgetStep, decided_by: DecidedBy) -> bool {
        self.observer.on_event(&Event::RetryBudgetStep {
            budget: self.key.clone(),
            command,
            granted: step.granted,
            balance: step.state.balance,
            at: step.at,
            decided_by,
        });
        step.granted
    }
}

/// The budget as the retry loop sees it: object-safe, so a [`Retry`](crate::Retry)
/// holds any store's budget.
pub(crate) trait Gate: Send + Sync {
    fn deposit(&self) -> BoxFuture<'_, ()>;
    fn try_withdraw(&self) -> BoxFuture<'_, bool>;
}

impl<S: BudgetStore> Gate for RetryBudget<S> {
    fn deposit(&self) -> BoxFuture<'_, ()> {
        Box::pin(RetryBudget::deposit(self))
    }
    fn try_withdraw(&self) -> BoxFuture<'_, bool> {
        Box::pin(RetryBudget::try_withdraw(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(ratio_micros: u64, floor: u32, cap_retries: u64) -> BudgetParams {
        BudgetParams {
            deposit: ratio_micros,
            refill_per_sec: floor,
            max_balance: cap_retries * MICROS_PER_RETRY,
            ttl: Duration::from_secs(60),
            max_ahead: Duration::from_secs(1),
        }
    }

    fn run(state: &mut Option<BudgetState>, command: BudgetCommand, p: &BudgetParams, at_us: u64) -> bool {
        let s = step(*state, command, p, Timestamp::from_micros(at_us));
        *state = Some(s.state);
        s.granted
    }

    #[test]
    fn an_empty_bucket_denies_and_five_deposits_of_a_fifth_earn_one_retry() {
        let p = params(200_000, 0, 10);
        let mut s = None;
        assert!(!run(&mut s, BudgetCommand::Withdraw, &p, 1));
        for _ in 0..4 {
            run(&mut s, BudgetCommand::Deposit, &p, 1);
        }
        assert!(!run(&mut s, BudgetCommand::Withdraw, &p, 1));
        run(&mut s, BudgetCommand::Deposit, &p, 1);
        assert!(run(&mut s, BudgetCommand::Withdraw, &p, 1));
        assert!(!run(&mut s, BudgetCommand::Withdraw, &p, 1));
    }

    #[test]
    fn the_floor_refills_exactly_per_microsecond_and_stops_at_the_cap() {
        let p = params(0, 3, 2);
        let mut s = None;
        assert!(!run(&mut s, BudgetCommand::Withdraw, &p, 1_000_000));
        // 3 retries a second: one retry takes 333 334 µs to earn.
        assert!(!run(&mut s, BudgetCommand::Withdraw, &p, 1_333_333));
        assert!(run(&mut s, BudgetCommand::Withdraw, &p, 1_333_334));
        // An hour later the bucket holds its cap, two, and no more.
        let later = 3_600_000_000;
        assert!(run(&mut s, BudgetCommand::Withdraw, &p, later));
        assert!(run(&mut s, BudgetCommand::Withdraw, &p, later));
        assert!(!run(&mut s, BudgetCommand::Withdraw, &p, later));
    }

    #[test]
    fn a_clock_that_goes_back_refills_nothing_and_keeps_the_stamp() {
        let p = params(0, 1, 5);
        let mut s = Some(BudgetState {
            balance: 0,
            stamp: Timestamp::from_micros(10_000_000),
        });
        assert!(!run(&mut s, BudgetCommand::Withdraw, &p, 5_000_000));
        assert_eq!(s.unwrap().stamp, Timestamp::from_micros(10_000_000));
        assert!(run(&mut s, BudgetCommand::Withdraw, &p, 11_000_000));
    }

    #[test]
    fn stored_forms_round_trip_and_foreign_values_read_as_absent() {
        let state = BudgetState {
            balance: 1_500_000,
            stamp: Timestamp::from_micros(1_700_000_000_000_000),
        };
        assert_eq!(BudgetState::decode(&state.encode()), Some(state));
        for bad in [
            "",
            "1",
            "a:1",
            "1:",
            ":1",
            "-1:2",
            "1:2:3",
            "99999999999999999:1",
            "9007199254740993:1",
            " 1:2",
        ] {
            assert_eq!(BudgetState::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_bound_counts_cap_deposits_and_floor() {
        let p = params(200_000, 10, 10);
        // 10 + 0.2 × 100 + 10 × 2 s = 50.
        assert_eq!(p.bound(100, Duration::from_secs(2)), 50);
        assert_eq!(p.bound(0, Duration::ZERO), 10);
    }

    #[test]
    fn out_of_range_numbers_are_refused_by_name() {
        let e = |b: RetryBudgetBuilder<MemoryCache>| b.build().unwrap_err().field;
        assert_eq!(e(RetryBudget::builder().ratio(-0.1)), "ratio");
        assert_eq!(e(RetryBudget::builder().ratio(f64::NAN)), "ratio");
        assert_eq!(e(RetryBudget::builder().ratio(11.0)), "ratio");
        assert_eq!(
            e(RetryBudget::builder().min_retries_per_sec(1001)),
            "min_retries_per_sec"
        );
        assert_eq!(e(RetryBudget::builder().max_balance(0)), "max_balance");
        assert_eq!(e(RetryBudget::builder().key("")), "key");
    }
}
