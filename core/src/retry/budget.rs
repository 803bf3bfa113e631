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
//! The bucket itself — what a first attempt deposits, how the floor refills,
//! what a retry takes, and the bound over any interval — is the pure
//! [`step`](crate::decide::budget::step) in [`crate::decide::budget`], which
//! every store runs.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::cache::{BudgetStore, MemoryCache, StoreSlot};
use crate::clock::Clock;
use crate::decide::DecidedBy;
use crate::decide::budget::{BudgetCommand, BudgetParams, BudgetStep, MICROS_PER_RETRY};
use crate::env::Env;
use crate::error::{CacheError, ConfigError};
use crate::limiter::OnCacheUnavailable;
use crate::observe::{Event, Observer};
use crate::time::Timestamp;

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
/// use redstring::{Env, ManualClock, retry::RetryBudget};
///
/// let clock = Arc::new(ManualClock::at_fixed_epoch());
/// let env = Env::default().with_clock(clock);
/// let budget = RetryBudget::builder().ratio(0.5).min_retries_per_sec(0).env(env).build().unwrap();
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
    env: Option<Env>,
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
            env: None,
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
            env: self.env,
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

    /// The clock the budget refills by and the observer its events go to
    /// (default [`Env::system`]).
    pub fn env(mut self, env: Env) -> Self {
        self.env = Some(env);
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
        let env = self.env.unwrap_or_default();
        let clock = env.clock().clone();
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
            observer: env.observer().clone(),
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

/// A boxed future, as [`Gate`]'s object-safe methods return it. Its own
/// alias, not the provider's `BoxFuture`: the retry loop sits below the
/// provider and names nothing of it.
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

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
