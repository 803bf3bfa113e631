//! Adaptive concurrency: how many calls a deployment may have in flight,
//! learnt from what its server answers, as one pure step.
//!
//! A model server's capacity is a number of slots (llama.cpp's `--parallel`,
//! vLLM's batch and KV cache), and it changes: a reload halves it, a longer
//! prompt mix shrinks it. A fixed limit on calls in flight is either too low
//! (the server idles) or too high (calls queue, time out and are retried into
//! the queue). So the limit adapts, by AIMD — additive increase,
//! multiplicative decrease, TCP's congestion rule as Netflix's
//! `concurrency-limits` (`AIMDLimit`), failsafe-go's adaptive limiter and
//! Envoy's adaptive-concurrency filter apply it to requests:
//!
//! - a call that ends in an **overload signal** (a 429, a 503, a timeout)
//!   multiplies the limit by the backoff ratio (default 0.9);
//! - a **success** adds `1 / limit`, so the limit grows by one per `limit`
//!   successes — but only while the deployment is busy, with at least half
//!   the limit in flight (Netflix's rule: an idle deployment's successes say
//!   nothing about its capacity, and a limit grown while idle would let a
//!   burst through unthrottled);
//! - any other end (a malformed answer, a cancelled call) leaves it alone;
//! - the limit stays within `[min, max]`.
//!
//! A call is admitted when the calls in flight are fewer than the whole part
//! of the limit. A [`reserve`](AdaptiveConcurrency::reserve) keeps a share
//! of it for [`Priority::High`] calls, as a rate limiter's reserve keeps a
//! share of its window: a [`Priority::Low`] call is admitted only while
//! fewer than `whole − ⌈whole × share⌉` calls are in flight, whoever's
//! they are, so however many low calls arrive the reserved calls stay free
//! for high ones. The latency-gradient limits (Netflix's `Gradient2`, Vegas)
//! are not built: the overload signals a model server sends are enough to
//! find its slots, and a gradient needs a quiet baseline a batching server
//! rarely gives.
//!
//! The limit is kept in fixed point, millionths of a call ([`UNIT`]), and
//! the backoff in thousandths, so every step is integer arithmetic a Redis
//! script's doubles do exactly (every product stays below 2^53): the store
//! decides as [`step`] decides, and a fleet sharing one store shares one
//! limit. The calls in flight are leases, as the least-loaded pick's are: a
//! call whose worker dies stops counting when its lease ends.

use std::time::Duration;

use crate::error::ConfigError;
use crate::tenant::{Priority, reserved_ppm, share_ppm};

/// One call of a limit, in fixed point: a limit is kept in millionths.
pub const UNIT: u64 = 1_000_000;

/// The largest limit accepted: ten thousand calls in flight at one
/// deployment.
pub const MAX_LIMIT: u32 = 10_000;

/// The thousandths a backoff ratio is kept in.
pub const BACKOFF_SCALE: u64 = 1_000;

/// The backoff ratio unless told otherwise: Netflix `AIMDLimit`'s 0.9.
pub const DEFAULT_BACKOFF: f64 = 0.9;

/// How long an attempt counts in flight if it never reports, unless told
/// otherwise.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// How long a deployment's learnt limit is kept without a call: an hour.
/// After that it starts again at its initial value.
pub const DEFAULT_TTL: Duration = Duration::from_secs(60 * 60);

/// A validated adaptive concurrency limit: where it starts, its bounds, its
/// backoff and its calls' lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveConcurrency {
    initial: u32,
    min: u32,
    max: u32,
    backoff: u32,
    lease: Duration,
    /// Parts per million of the limit kept for the high class; 0 for none.
    reserve: u32,
}

impl AdaptiveConcurrency {
    /// A limit starting at `initial` calls in flight, kept within
    /// `[min, max]`, backing off by [`DEFAULT_BACKOFF`].
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field: `min` below 1, `max` below `min`
    /// or above [`MAX_LIMIT`], `initial` outside `[min, max]`.
    pub fn new(initial: u32, min: u32, max: u32) -> Result<Self, ConfigError> {
        if min == 0 {
            return Err(ConfigError::new("adaptive_concurrency.min", "at least 1", min));
        }
        if max < min || max > MAX_LIMIT {
            return Err(ConfigError::new(
                "adaptive_concurrency.max",
                "at least min and at most 10000",
                max,
            ));
        }
        if initial < min || initial > max {
            return Err(ConfigError::new(
                "adaptive_concurrency.initial",
                "within [min, max]",
                initial,
            ));
        }
        Ok(AdaptiveConcurrency {
            initial,
            min,
            max,
            backoff: 900,
            lease: DEFAULT_LEASE,
            reserve: 0,
        })
    }

    /// What the limit is multiplied by on an overload signal (default
    /// [`DEFAULT_BACKOFF`]), kept to a thousandth.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for `adaptive_concurrency.backoff` unless it is in
    /// `[0.001, 0.999]` (1 would never back off; 0 would drop to `min` at once).
    pub fn backoff(mut self, ratio: f64) -> Result<Self, ConfigError> {
        let thousandths = (ratio * BACKOFF_SCALE as f64).round();
        if !(thousandths.is_finite() && (1.0..=999.0).contains(&thousandths)) {
            return Err(ConfigError::new(
                "adaptive_concurrency.backoff",
                "in [0.001, 0.999]",
                ratio,
            ));
        }
        // Within [1, 999] by the check above.
        self.backoff = thousandths as u32;
        Ok(self)
    }

    /// How long an attempt counts in flight if it never reports (default
    /// [`DEFAULT_LEASE`]): choose one longer than the slowest attempt (the
    /// request timeout), or an attempt still running stops counting.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for `adaptive_concurrency.lease` when it is zero or
    /// longer than a day.
    pub fn lease(mut self, lease: Duration) -> Result<Self, ConfigError> {
        if lease.is_zero() || lease > Duration::from_secs(24 * 60 * 60) {
            return Err(ConfigError::new(
                "adaptive_concurrency.lease",
                "positive and at most 86400 s",
                crate::time::secs(lease),
            ));
        }
        self.lease = lease;
        Ok(self)
    }

    /// Keeps `share` of the limit for [`Priority::High`] calls: a
    /// [`Priority::Low`] call is refused once `whole − ⌈whole × share⌉`
    /// calls are in flight, whoever's they are — the rate limiter's
    /// [`reserve`](crate::RateLimiterBuilder::reserve), applied to calls
    /// in flight. The share is taken in whole parts per million.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for `adaptive_concurrency.reserve` unless `share`
    /// is in (0, 1) and leaves the low class a call at `min` (the fewest
    /// the limit leaves it, since what it leaves grows with the limit).
    pub fn reserve(mut self, share: f64) -> Result<Self, ConfigError> {
        if !(share.is_finite() && share > 0.0 && share < 1.0) {
            return Err(ConfigError::new(
                "adaptive_concurrency.reserve",
                "between 0 and 1, exclusive",
                share,
            ));
        }
        let ppm = share_ppm(share);
        if allowance(u64::from(self.min), ppm) == 0 {
            return Err(ConfigError::new(
                "adaptive_concurrency.reserve",
                "small enough to leave the low class a call at the limit's min",
                share,
            ));
        }
        self.reserve = ppm;
        Ok(self)
    }

    /// The share of the limit kept for high-priority calls, in parts per
    /// million (0 without a [`reserve`](Self::reserve)).
    pub fn reserve_ppm(&self) -> u32 {
        self.reserve
    }

    /// The limit a deployment starts at.
    pub fn initial(&self) -> u32 {
        self.initial
    }

    /// The least the limit goes down to.
    pub fn min(&self) -> u32 {
        self.min
    }

    /// The most the limit grows to.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// The backoff ratio, in thousandths.
    pub fn backoff_thousandths(&self) -> u32 {
        self.backoff
    }

    /// How long a call counts in flight if it never reports.
    pub fn call_lease(&self) -> Duration {
        self.lease
    }

    /// The numbers a store's step runs on for a call of `priority`: a low
    /// one's carry the reserve it may not take (nothing under the
    /// [`Mutant`](crate::mutants::Mutant) that ignores it).
    pub fn params(&self, priority: Priority) -> ConcurrencyParams {
        let reserve = match priority {
            Priority::Low if !crate::mutants::active(crate::mutants::Mutant::ConcurrencyReserveIgnored) => self.reserve,
            Priority::High | Priority::Low => 0,
        };
        ConcurrencyParams {
            initial: u64::from(self.initial) * UNIT,
            min: u64::from(self.min) * UNIT,
            max: u64::from(self.max) * UNIT,
            backoff: u64::from(self.backoff),
            ttl: DEFAULT_TTL,
            reserve,
        }
    }
}

/// The numbers [`step`] runs on, limits in fixed point ([`UNIT`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ConcurrencyParams {
    /// The limit a deployment with no stored limit starts at.
    pub initial: u64,
    /// The least the limit goes down to.
    pub min: u64,
    /// The most the limit grows to.
    pub max: u64,
    /// The backoff ratio, in thousandths ([`BACKOFF_SCALE`]).
    pub backoff: u64,
    /// How long a limit is kept with no step on it.
    pub ttl: Duration,
    /// Parts per million of the whole limit an admission may not take:
    /// the share kept for a class above the caller's (0 for the highest).
    pub reserve: u32,
}

/// How a call at a deployment ended, for its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum CallEnd {
    /// The server answered: the limit may grow.
    Success,
    /// The server said it is overloaded (a 429, a 503) or did not answer in
    /// time: the limit backs off.
    Overload,
    /// Anything else (an unusable answer, a cancelled call): the call only
    /// stops counting.
    Neither,
}

impl CallEnd {
    /// The spelling events and scripts use.
    pub const fn as_str(self) -> &'static str {
        match self {
            CallEnd::Success => "success",
            CallEnd::Overload => "overload",
            CallEnd::Neither => "neither",
        }
    }
}

/// What a store's step is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum ConcurrencyCommand {
    /// Admit a call if fewer than the limit are in flight, leasing it.
    Admit,
    /// End a call's lease, its end adjusting the limit when the lease was
    /// still live (a late report changes nothing).
    Complete(CallEnd),
}

impl ConcurrencyCommand {
    /// The spelling scripts use: `admit`, or the end's.
    pub const fn as_str(self) -> &'static str {
        match self {
            ConcurrencyCommand::Admit => "admit",
            ConcurrencyCommand::Complete(end) => end.as_str(),
        }
    }
}

/// What a step decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ConcurrencyStep {
    /// Admit: whether the call was admitted (and leased). Complete: whether
    /// its lease was still live, so its end counted.
    pub admitted: bool,
    /// Live calls in flight before the step (the completing one included).
    pub in_flight: u64,
    /// The limit in force before the step, in fixed point.
    pub limit: u64,
    /// The limit after it, in fixed point.
    pub next: u64,
    /// Whether the stored limit was unreadable and started again at
    /// `initial`.
    pub healed: bool,
}

impl ConcurrencyStep {
    /// Whether the step changed the limit's whole number of calls.
    pub fn changed(&self) -> bool {
        whole(self.limit) != whole(self.next)
    }
}

/// A fixed-point limit's whole calls, never below one.
pub fn whole(limit: u64) -> u64 {
    (limit / UNIT).max(1)
}

/// The calls in flight an admission kept from `reserve` parts per million
/// of a `whole` limit may find and still be admitted under: `whole −
/// ⌈whole × reserve / 10⁶⌉`. It never falls as `whole` grows.
pub fn allowance(whole: u64, reserve: u32) -> u64 {
    whole - reserved_ppm(whole, reserve)
}

/// The limit in force given what a store held: the initial one when it held
/// nothing readable, else the stored one within `[min, max]` (another
/// worker's settings, or a foreign writer's value, cannot push it out).
pub fn limit_in_force(stored: Option<u64>, params: &ConcurrencyParams) -> u64 {
    stored.unwrap_or(params.initial).clamp(params.min, params.max)
}

/// One step on a deployment's limit: `stored` the limit a store held (`None`
/// when absent or unreadable), `in_flight` its live leases, `held` whether
/// the completing call's lease is among them. The caller adds the lease when
/// an admission is `admitted`, removes the completing one whatever the step
/// says, and writes `next` back.
pub fn step(
    stored: Option<u64>,
    in_flight: u64,
    held: bool,
    command: ConcurrencyCommand,
    params: &ConcurrencyParams,
) -> ConcurrencyStep {
    let limit = limit_in_force(stored, params);
    let (admitted, next) = match command {
        ConcurrencyCommand::Admit => (in_flight < allowance(whole(limit), params.reserve), limit),
        ConcurrencyCommand::Complete(_) if !held => (false, limit),
        ConcurrencyCommand::Complete(CallEnd::Overload) => {
            // limit ≤ 10^10 and backoff < 10^3: the product is exact in a double.
            (true, (limit * params.backoff / BACKOFF_SCALE).max(params.min))
        }
        ConcurrencyCommand::Complete(CallEnd::Success) if in_flight * 2 >= whole(limit) => {
            (true, (limit + UNIT / whole(limit)).min(params.max))
        }
        ConcurrencyCommand::Complete(_) => (true, limit),
    };
    ConcurrencyStep {
        admitted,
        in_flight,
        limit,
        next,
        healed: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(initial: u32, min: u32, max: u32) -> ConcurrencyParams {
        AdaptiveConcurrency::new(initial, min, max)
            .unwrap()
            .params(Priority::High)
    }

    #[test]
    fn a_call_is_admitted_below_the_whole_limit_only() {
        let p = params(4, 1, 10);
        assert!(step(None, 3, false, ConcurrencyCommand::Admit, &p).admitted);
        assert!(!step(None, 4, false, ConcurrencyCommand::Admit, &p).admitted);
        // 4.9 calls admit four.
        assert!(!step(Some(4 * UNIT + 900_000), 4, false, ConcurrencyCommand::Admit, &p).admitted);
        let admit = step(None, 0, false, ConcurrencyCommand::Admit, &p);
        assert_eq!(
            (admit.limit, admit.next),
            (4 * UNIT, 4 * UNIT),
            "admission changes no limit"
        );
    }

    #[test]
    fn an_overload_multiplies_the_limit_by_the_backoff_down_to_min() {
        let p = params(10, 2, 20);
        let s = step(None, 5, true, ConcurrencyCommand::Complete(CallEnd::Overload), &p);
        assert_eq!(s.next, 9 * UNIT);
        assert!(s.changed());
        let half = AdaptiveConcurrency::new(10, 2, 20)
            .unwrap()
            .backoff(0.5)
            .unwrap()
            .params(Priority::High);
        let s = step(
            Some(3 * UNIT),
            1,
            true,
            ConcurrencyCommand::Complete(CallEnd::Overload),
            &half,
        );
        assert_eq!(s.next, 2 * UNIT, "1.5 is under min");
    }

    #[test]
    fn a_success_adds_one_over_the_limit_while_busy_up_to_max() {
        let p = params(4, 1, 5);
        let s = step(None, 2, true, ConcurrencyCommand::Complete(CallEnd::Success), &p);
        assert_eq!(s.next, 4 * UNIT + UNIT / 4);
        assert!(!s.changed(), "a quarter of a call");
        let idle = step(None, 1, true, ConcurrencyCommand::Complete(CallEnd::Success), &p);
        assert_eq!(idle.next, 4 * UNIT, "under half the limit in flight, nothing is learnt");
        let top = step(
            Some(5 * UNIT),
            5,
            true,
            ConcurrencyCommand::Complete(CallEnd::Success),
            &p,
        );
        assert_eq!(top.next, 5 * UNIT, "max");
        // Four successes at a limit of four add one whole call.
        let mut limit = 4 * UNIT;
        for _ in 0..4 {
            limit = step(Some(limit), 4, true, ConcurrencyCommand::Complete(CallEnd::Success), &p).next;
        }
        assert_eq!(limit, 5 * UNIT);
    }

    #[test]
    fn a_late_or_neutral_end_changes_nothing() {
        let p = params(4, 1, 10);
        for end in [CallEnd::Success, CallEnd::Overload, CallEnd::Neither] {
            let late = step(None, 4, false, ConcurrencyCommand::Complete(end), &p);
            assert_eq!((late.admitted, late.next), (false, 4 * UNIT), "{end:?}");
        }
        let neither = step(None, 4, true, ConcurrencyCommand::Complete(CallEnd::Neither), &p);
        assert_eq!((neither.admitted, neither.next), (true, 4 * UNIT));
    }

    #[test]
    fn a_low_call_is_refused_once_the_unreserved_part_is_in_flight() {
        let settings = AdaptiveConcurrency::new(10, 4, 20).unwrap().reserve(0.25).unwrap();
        let (high, low) = (settings.params(Priority::High), settings.params(Priority::Low));
        assert_eq!((high.reserve, low.reserve), (0, 250_000));
        // A limit of 10 keeps ⌈2.5⌉ = 3 for the high class: low gets 7.
        assert!(step(None, 6, false, ConcurrencyCommand::Admit, &low).admitted);
        assert!(!step(None, 7, false, ConcurrencyCommand::Admit, &low).admitted);
        assert!(step(None, 9, false, ConcurrencyCommand::Admit, &high).admitted);
        assert!(!step(None, 10, false, ConcurrencyCommand::Admit, &high).admitted);
        // The reserve follows the limit: at 4 it keeps 1.
        assert!(step(Some(4 * UNIT), 2, false, ConcurrencyCommand::Admit, &low).admitted);
        assert!(!step(Some(4 * UNIT), 3, false, ConcurrencyCommand::Admit, &low).admitted);
        // Ends move the limit alike whoever's call it was.
        let end = ConcurrencyCommand::Complete(CallEnd::Overload);
        assert_eq!(
            step(None, 5, true, end, &low).next,
            step(None, 5, true, end, &high).next
        );
    }

    #[test]
    fn what_a_reserve_leaves_never_falls_as_the_limit_grows() {
        for ppm in [1, 70_000, 250_000, 333_333, 500_000, 999_999] {
            let mut last = 0;
            for whole in 1..=2_000 {
                let left = allowance(whole, ppm);
                assert!(
                    left >= last,
                    "{ppm} ppm: {whole} leaves {left}, {} left {last}",
                    whole - 1
                );
                assert!(whole - left >= 1, "{ppm} ppm keeps at least one call of {whole}");
                last = left;
            }
        }
        assert_eq!(allowance(100, 70_000), 93, "0.07 of 100 keeps 7, not 8");
    }

    #[test]
    fn a_reserve_is_checked_against_the_limits_min() {
        let settings = AdaptiveConcurrency::new(4, 2, 8).unwrap();
        for bad in [0.0, 1.0, -0.1, f64::NAN, f64::INFINITY] {
            assert_eq!(
                settings.reserve(bad).unwrap_err().field,
                "adaptive_concurrency.reserve",
                "{bad}"
            );
        }
        // At a min of 2, a half keeps 1 and leaves 1; anything more leaves none.
        assert_eq!(settings.reserve(0.5).unwrap().reserve_ppm(), 500_000);
        let none_left = settings.reserve(0.51).unwrap_err();
        assert!(none_left.to_string().contains("min"), "{none_left}");
        assert_eq!(settings.reserve_ppm(), 0, "no reserve unless asked");
    }

    #[test]
    fn a_stored_limit_out_of_bounds_is_clamped() {
        let p = params(4, 2, 8);
        assert_eq!(limit_in_force(Some(0), &p), 2 * UNIT);
        assert_eq!(limit_in_force(Some(u64::from(u32::MAX) * UNIT), &p), 8 * UNIT);
        assert_eq!(limit_in_force(None, &p), 4 * UNIT);
    }

    #[test]
    fn settings_are_checked_naming_the_field() {
        let field = |r: Result<AdaptiveConcurrency, ConfigError>| r.unwrap_err().field;
        assert_eq!(field(AdaptiveConcurrency::new(1, 0, 4)), "adaptive_concurrency.min");
        assert_eq!(field(AdaptiveConcurrency::new(3, 4, 2)), "adaptive_concurrency.max");
        assert_eq!(
            field(AdaptiveConcurrency::new(1, 1, 10_001)),
            "adaptive_concurrency.max"
        );
        assert_eq!(field(AdaptiveConcurrency::new(5, 1, 4)), "adaptive_concurrency.initial");
        let ok = AdaptiveConcurrency::new(2, 1, 4).unwrap();
        for bad in [1.0, 0.0, -0.5, f64::NAN, 0.0004] {
            assert_eq!(field(ok.backoff(bad)), "adaptive_concurrency.backoff", "{bad}");
        }
        assert_eq!(ok.backoff(0.75).unwrap().backoff_thousandths(), 750);
        assert_eq!(field(ok.lease(Duration::ZERO)), "adaptive_concurrency.lease");
    }

    #[test]
    fn the_largest_products_stay_exact_in_a_double() {
        let p = params(MAX_LIMIT, 1, MAX_LIMIT);
        assert!(p.max * 999 < 1 << 53);
    }
}
