//! The retry budget's decision as a pure function: one step of a bucket of
//! retries.
//!
//! A fleet's retry budget ([`RetryBudget`](crate::retry::RetryBudget)) lives
//! in a shared store, and every store — a critical section in memory, a
//! script on Redis — must refill, grant and deny alike, or the budget a fleet
//! gets would depend on where it keeps it. [`step`] is that one definition:
//! the bucket as read, a command and `now` in, the bucket to write and the
//! answer out. It reads no clock and touches no store, so the stores, the
//! property tests and the simulator's bound all reason about the same
//! function.
//!
//! # The bucket
//!
//! The budget is a token bucket of retries, kept as one small value in a
//! [`BudgetStore`](crate::cache::BudgetStore):
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
//! attempts plus that floor — so about `1 + ratio` per call only when first
//! attempts arrive well above `min_retries_per_sec / ratio` a second; below
//! that the floor dominates and nearly every call may retry. The simulator checks this bound on every run
//! that configures a budget.
//!
//! Amounts are integers in millionths of a retry ([`MICROS_PER_RETRY`]), and
//! the floor refills exactly `min_retries_per_sec` of them per microsecond, so
//! the arithmetic is exact in Rust and in a Redis script alike — no rounding
//! drifts an adapter away from [`step`], the one definition every adapter
//! runs. An expired bucket restarts empty, which never grants more than a
//! continuing one would have: the bound holds whatever the TTL.

use std::time::Duration;

use crate::time::{Timestamp, stored_number};

/// Millionths of a retry per retry: the unit a bucket's balance is kept in.
pub const MICROS_PER_RETRY: u64 = 1_000_000;

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
}
