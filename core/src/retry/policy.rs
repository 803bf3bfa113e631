//! The backoff schedule: how long to wait before each retry.

use std::time::Duration;

use crate::error::ConfigError;
use crate::mutants::{self, Mutant};
use crate::random::RandomSource;
use crate::time::secs;

/// Retries after the first attempt when none is configured: four calls in all.
pub const DEFAULT_MAX_RETRIES: u32 = 3;
/// The default wait before the first retry.
pub const DEFAULT_INITIAL_DELAY: Duration = Duration::from_secs(1);
/// The default cap on the (unjittered) wait.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(60);
/// The default growth factor between retries.
pub const DEFAULT_MULTIPLIER: f64 = 2.0;
/// The default jitter: ±10 %.
pub const DEFAULT_JITTER: f64 = 0.1;
/// The longest `initial_delay` or `max_delay` a policy accepts: one day. A
/// wait longer than that outlasts any outage retrying can ride out (a node
/// replacement takes minutes) and any caller still waiting for the answer;
/// bounding it keeps every computation on the schedule exact and finite.
pub const MAX_DELAY_LIMIT: Duration = Duration::from_secs(86_400);

/// A validated retry schedule.
///
/// The wait before retry `n` (0-indexed) is
///
/// ```text
/// base  = min(initial_delay × multiplier^n, max_delay)
/// delay = max(0, base + uniform(−base × jitter, base × jitter))
/// ```
///
/// so the defaults give about 1 s, 2 s, 4 s, each ±10 %. `max_delay` caps the
/// base, not the jittered result: a fleet pinned at the cap still spreads out.
///
/// ```
/// use std::time::Duration;
/// use redstring::RetryPolicy;
///
/// let policy = RetryPolicy::builder()
///     .max_retries(5)
///     .initial_delay(Duration::from_secs(2))
///     .max_delay(Duration::from_secs(30))
///     .build()
///     .unwrap();
/// let schedule: Vec<u64> = (0..5).map(|n| policy.base_delay(n).as_secs()).collect();
/// assert_eq!(schedule, [2, 4, 8, 16, 30]); // 60 s of waiting in the worst case
/// ```
///
/// # Sizing it for a model reload
///
/// A server reloading its model answers `503 Loading model` until it is
/// ready, and llama-server sends no `Retry-After` with it, so the schedule
/// alone decides how long a call rides it out: the sum of the waits
/// ([`worst_case_wait`](RetryPolicy::worst_case_wait) bounds it). The default
/// (1 + 2 + 4 s) covers about 7 s of reload — a llama-swap model swap takes
/// seconds, within it; a container restart takes tens of seconds and a node
/// replacement minutes, far beyond it. For those, either retry longer, or
/// let the call fail fast and the circuit breaker hold traffic off
/// (its `recovery_timeout` matched to the recovery time):
///
/// ```
/// use std::time::Duration;
/// use redstring::RetryPolicy;
///
/// // A container restart: 2 + 4 + 8 + 16 + 16 = 46 s of waiting.
/// let restart = RetryPolicy::builder()
///     .max_retries(5)
///     .initial_delay(Duration::from_secs(2))
///     .max_delay(Duration::from_secs(16))
///     .jitter(0.0)
///     .build()
///     .unwrap();
/// assert_eq!(restart.worst_case_wait(), Duration::from_secs(46));
/// ```
///
/// A hardened provider's `deadline` caps the whole call whatever the
/// schedule; give it room for the waits plus the attempts themselves.
/// (llama-swap holds a request while it loads instead of answering 503, so
/// there the request timeout, not the schedule, must outlast the load.)
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    max_retries: u32,
    initial_delay: Duration,
    max_delay: Duration,
    multiplier: f64,
    jitter: f64,
}

impl Default for RetryPolicy {
    /// Three retries, 1 s initial delay, 60 s cap, ×2, ±10 %.
    fn default() -> Self {
        RetryPolicy {
            max_retries: DEFAULT_MAX_RETRIES,
            initial_delay: DEFAULT_INITIAL_DELAY,
            max_delay: DEFAULT_MAX_DELAY,
            multiplier: DEFAULT_MULTIPLIER,
            jitter: DEFAULT_JITTER,
        }
    }
}

/// Configures a [`RetryPolicy`]; unset fields take the defaults.
#[derive(Clone, Copy, Debug, Default)]
pub struct RetryPolicyBuilder {
    max_retries: Option<u32>,
    initial_delay: Option<Duration>,
    max_delay: Option<Duration>,
    multiplier: Option<f64>,
    jitter: Option<f64>,
}

impl RetryPolicyBuilder {
    /// Retries after the first attempt. `0` means exactly one attempt (and
    /// still an exhaustion error on failure).
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = Some(n);
        self
    }

    /// Retries after the first attempt, `None` meaning [`DEFAULT_MAX_RETRIES`].
    pub fn max_retries_or_default(mut self, n: Option<u32>) -> Self {
        self.max_retries = n;
        self
    }

    /// The wait before the first retry. Must be positive and at most
    /// [`MAX_DELAY_LIMIT`].
    pub fn initial_delay(mut self, d: Duration) -> Self {
        self.initial_delay = Some(d);
        self
    }

    /// The cap on the unjittered wait. Must be at least `initial_delay` and at
    /// most [`MAX_DELAY_LIMIT`].
    pub fn max_delay(mut self, d: Duration) -> Self {
        self.max_delay = Some(d);
        self
    }

    /// Growth per retry. At least 1.0; 1.0 means a constant delay.
    pub fn multiplier(mut self, m: f64) -> Self {
        self.multiplier = Some(m);
        self
    }

    /// The jitter fraction, in `[0, 1]`. `0.0` gives exact delays (for tests).
    pub fn jitter(mut self, j: f64) -> Self {
        self.jitter = Some(j);
        self
    }

    /// Validates and builds, naming the first field that is wrong.
    pub fn build(self) -> Result<RetryPolicy, ConfigError> {
        let d = RetryPolicy::default();
        let policy = RetryPolicy {
            max_retries: self.max_retries.unwrap_or(d.max_retries),
            initial_delay: self.initial_delay.unwrap_or(d.initial_delay),
            max_delay: self.max_delay.unwrap_or(d.max_delay),
            multiplier: self.multiplier.unwrap_or(d.multiplier),
            jitter: self.jitter.unwrap_or(d.jitter),
        };
        if policy.initial_delay.is_zero() {
            return Err(ConfigError::new(
                "initial_delay",
                "positive",
                secs(policy.initial_delay),
            ));
        }
        if policy.initial_delay > MAX_DELAY_LIMIT {
            return Err(ConfigError::new(
                "initial_delay",
                "at most 86400 s (one day)",
                secs(policy.initial_delay),
            ));
        }
        if policy.max_delay < policy.initial_delay {
            return Err(ConfigError::new(
                "max_delay",
                "at least initial_delay",
                secs(policy.max_delay),
            ));
        }
        if policy.max_delay > MAX_DELAY_LIMIT {
            return Err(ConfigError::new(
                "max_delay",
                "at most 86400 s (one day)",
                secs(policy.max_delay),
            ));
        }
        if !(policy.multiplier.is_finite() && policy.multiplier >= 1.0) {
            return Err(ConfigError::new("multiplier", "at least 1.0", policy.multiplier));
        }
        if !(0.0..=1.0).contains(&policy.jitter) {
            return Err(ConfigError::new("jitter", "between 0.0 and 1.0", policy.jitter));
        }
        Ok(policy)
    }
}

impl RetryPolicy {
    /// Starts from the defaults.
    pub fn builder() -> RetryPolicyBuilder {
        RetryPolicyBuilder::default()
    }

    /// Retries after the first attempt.
    pub fn max_retries(&self) -> u32 {
        self.max_retries
    }

    /// The wait before the first retry.
    pub fn initial_delay(&self) -> Duration {
        self.initial_delay
    }

    /// The cap on the unjittered wait.
    pub fn max_delay(&self) -> Duration {
        self.max_delay
    }

    /// Growth per retry.
    pub fn multiplier(&self) -> f64 {
        self.multiplier
    }

    /// The jitter fraction.
    pub fn jitter(&self) -> f64 {
        self.jitter
    }

    /// The unjittered wait before retry `n` (0-indexed):
    /// `min(initial_delay × multiplier^n, max_delay)`.
    pub fn base_delay(&self, n: u32) -> Duration {
        let exponent = i32::try_from(n).unwrap_or(i32::MAX);
        let grown = self.initial_delay.as_secs_f64() * self.multiplier.powi(exponent);
        let capped = grown.min(self.max_delay.as_secs_f64());
        Duration::try_from_secs_f64(capped).unwrap_or(self.max_delay)
    }

    /// The jittered wait before retry `n`, drawing from `rng` — the spec's
    /// `get_delay(n)`.
    pub fn delay(&self, n: u32, rng: &dyn RandomSource) -> Duration {
        let base = self.base_delay(n).as_secs_f64();
        if self.jitter == 0.0 || mutants::active(Mutant::NoJitter) {
            return self.base_delay(n);
        }
        let spread = base * self.jitter;
        let jittered = base + spread * (2.0 * rng.next_f64() - 1.0);
        Duration::try_from_secs_f64(jittered.max(0.0)).unwrap_or(Duration::MAX)
    }

    /// The wait before retry `n` when the server asked for at least `floor`
    /// (its `Retry-After`): the schedule's [`delay`](Self::delay) when that
    /// is longer; otherwise `floor` spread *upwards* by the jitter, to
    /// `floor × (1 + jitter × u)` for a uniform `u` in [0, 1) — never
    /// shorter than asked, and never the same instant for every caller the
    /// server told the same wait (a fleet told "600 s" would otherwise come
    /// back together, 600 s later).
    pub fn delay_at_least(&self, n: u32, floor: Duration, rng: &dyn RandomSource) -> Duration {
        let scheduled = self.delay(n, rng);
        if scheduled >= floor || floor.is_zero() {
            return scheduled;
        }
        if self.jitter == 0.0 || mutants::active(Mutant::NoJitter) || mutants::active(Mutant::ExactRetryAfter) {
            return floor;
        }
        let spread = floor.as_secs_f64() * self.jitter * rng.next_f64();
        floor.saturating_add(Duration::try_from_secs_f64(spread).unwrap_or(Duration::ZERO))
    }

    /// The longest the whole schedule can sleep: every base delay at its
    /// jittered maximum, summed. Closed form — a binary search for where the
    /// delays reach the cap, a geometric sum below it, a product above — so it
    /// costs the same for 3 retries as for `u32::MAX`, and saturates at
    /// `Duration::MAX` rather than overflowing.
    pub fn worst_case_wait(&self) -> Duration {
        let growing = self.growing_retries();
        let initial = self.initial_delay.as_secs_f64();
        let below_cap = if growing == 0 {
            0.0
        } else if self.multiplier == 1.0 {
            initial * f64::from(growing)
        } else {
            let exponent = i32::try_from(growing).unwrap_or(i32::MAX);
            initial * (self.multiplier.powi(exponent) - 1.0) / (self.multiplier - 1.0)
        };
        let at_cap = f64::from(self.max_retries - growing) * self.max_delay.as_secs_f64();
        let total = (below_cap + at_cap) * (1.0 + self.jitter);
        Duration::try_from_secs_f64(total).unwrap_or(Duration::MAX)
    }

    /// How many retries wait less than `max_delay` (the base delay only grows
    /// with `n`, so they come first): the first `n` whose base delay reaches
    /// the cap, or `max_retries`.
    fn growing_retries(&self) -> u32 {
        let (mut low, mut high) = (0, self.max_retries);
        while low < high {
            let mid = low + (high - low) / 2;
            if self.base_delay(mid) >= self.max_delay {
                high = mid;
            } else {
                low = mid + 1;
            }
        }
        low
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::SeededRandom;

    #[test]
    fn defaults_are_the_specs() {
        let p = RetryPolicy::default();
        assert_eq!(p.max_retries(), 3);
        assert_eq!(p.initial_delay(), Duration::from_secs(1));
        assert_eq!(p.max_delay(), Duration::from_secs(60));
        assert_eq!(p.multiplier(), 2.0);
        assert_eq!(p.jitter(), 0.1);
        assert_eq!(RetryPolicy::builder().build().unwrap(), p);
        assert_eq!(
            RetryPolicy::builder()
                .max_retries_or_default(None)
                .build()
                .unwrap()
                .max_retries(),
            3
        );
    }

    #[test]
    fn a_servers_wait_is_spread_upwards_never_below_it() {
        let p = RetryPolicy::default(); // 1 s, jitter 0.1
        let rng = SeededRandom::from_seed(3);
        let asked = Duration::from_secs(600);
        let waits: Vec<Duration> = (0..200).map(|_| p.delay_at_least(0, asked, &rng)).collect();
        assert!(
            waits.iter().all(|w| *w >= asked && *w < asked.mul_f64(1.1)),
            "{waits:?}"
        );
        // Spread: a fleet told 600 s does not come back at one instant.
        let distinct: std::collections::BTreeSet<Duration> = waits.iter().copied().collect();
        assert!(distinct.len() > 190, "{} distinct waits of 200", distinct.len());
        assert!(waits.iter().any(|w| *w > asked.mul_f64(1.05)));
        // A schedule longer than the server's wait keeps its own delay.
        let short = Duration::from_millis(100);
        let w = p.delay_at_least(0, short, &rng);
        assert!(
            w >= Duration::from_millis(900) && w <= Duration::from_millis(1100),
            "{w:?}"
        );
        // Without jitter, exactly what was asked.
        let exact = RetryPolicy::builder().jitter(0.0).build().unwrap();
        assert_eq!(exact.delay_at_least(0, asked, &rng), asked);
    }

    #[test]
    fn default_schedule_is_one_two_four() {
        let p = RetryPolicy::default();
        let base: Vec<Duration> = (0..3).map(|n| p.base_delay(n)).collect();
        assert_eq!(base, [1, 2, 4].map(Duration::from_secs));
    }

    #[test]
    fn max_delay_caps_the_base_not_the_jittered_delay() {
        let p = RetryPolicy::builder()
            .max_delay(Duration::from_secs(4))
            .build()
            .unwrap();
        assert_eq!(p.base_delay(10), Duration::from_secs(4));
        let rng = SeededRandom::from_seed(3);
        let delays: Vec<f64> = (0..200).map(|_| p.delay(10, &rng).as_secs_f64()).collect();
        assert!(delays.iter().all(|d| (3.6..=4.4).contains(d)));
        assert!(delays.iter().any(|d| *d > 4.0), "jitter above the cap must be possible");
    }

    #[test]
    fn jitter_stays_within_its_fraction() {
        let p = RetryPolicy::default();
        let rng = SeededRandom::from_seed(9);
        for n in 0..3 {
            let base = p.base_delay(n).as_secs_f64();
            for _ in 0..100 {
                let d = p.delay(n, &rng).as_secs_f64();
                assert!(d >= base * 0.9 - 1e-9 && d <= base * 1.1 + 1e-9);
            }
        }
    }

    #[test]
    fn zero_jitter_is_exact() {
        let p = RetryPolicy::builder().jitter(0.0).build().unwrap();
        let rng = SeededRandom::from_seed(1);
        assert_eq!(p.delay(2, &rng), Duration::from_secs(4));
    }

    #[test]
    fn multiplier_one_is_constant_delay() {
        let p = RetryPolicy::builder()
            .multiplier(1.0)
            .initial_delay(Duration::from_millis(500))
            .build()
            .unwrap();
        assert!((0..6).all(|n| p.base_delay(n) == Duration::from_millis(500)));
    }

    #[test]
    fn huge_exponents_saturate_at_the_cap() {
        let p = RetryPolicy::builder().max_retries(u32::MAX).build().unwrap();
        assert_eq!(p.base_delay(u32::MAX), Duration::from_secs(60));
        let huge = RetryPolicy::builder()
            .max_delay(MAX_DELAY_LIMIT)
            .jitter(1.0)
            .build()
            .unwrap();
        assert!(huge.delay(10_000, &SeededRandom::from_seed(1)) <= MAX_DELAY_LIMIT * 2);
    }

    #[test]
    fn delays_no_wait_could_mean_are_refused_naming_the_field() {
        // `Duration::MAX` once built, and `worst_case_wait` then panicked
        // converting (MAX × 1.1) seconds back to a `Duration`.
        let e = RetryPolicy::builder().max_delay(Duration::MAX).build().unwrap_err();
        assert!(e.to_string().starts_with("max_delay must be at most 86400"), "{e}");
        let e = RetryPolicy::builder()
            .initial_delay(Duration::from_secs(86_401))
            .max_delay(Duration::from_secs(86_401))
            .build()
            .unwrap_err();
        assert!(e.to_string().starts_with("initial_delay must be at most 86400"), "{e}");
    }

    #[test]
    fn worst_case_wait_is_closed_form_for_any_number_of_retries() {
        // 1, 2, 4 … 65536 s (17 growing waits, 131071 s), then a day each.
        let p = RetryPolicy::builder()
            .max_retries(u32::MAX)
            .max_delay(MAX_DELAY_LIMIT)
            .jitter(0.0)
            .build()
            .unwrap();
        let expected = 131_071 + u64::from(u32::MAX - 17) * 86_400;
        assert_eq!(p.worst_case_wait(), Duration::from_secs(expected));
        let jittered = RetryPolicy::builder()
            .max_retries(u32::MAX)
            .max_delay(MAX_DELAY_LIMIT)
            .jitter(1.0)
            .build()
            .unwrap();
        assert_eq!(jittered.worst_case_wait(), Duration::from_secs(2 * expected));
        assert_eq!(
            RetryPolicy::builder().max_retries(0).build().unwrap().worst_case_wait(),
            Duration::ZERO
        );
    }

    #[test]
    fn worst_case_wait_matches_the_sum_of_the_schedule() {
        let shapes = [
            (1.0, 0.5, 7.0),
            (1.5, 0.25, 10.0),
            (2.0, 1.0, 3.0),
            (3.0, 0.1, 1000.0),
            (1.0, 2.0, 2.0),
        ];
        for (multiplier, initial, max) in shapes {
            for retries in [0, 1, 2, 5, 13, 40] {
                for jitter in [0.0, 0.1, 1.0] {
                    let p = RetryPolicy::builder()
                        .max_retries(retries)
                        .multiplier(multiplier)
                        .initial_delay(Duration::from_secs_f64(initial))
                        .max_delay(Duration::from_secs_f64(max))
                        .jitter(jitter)
                        .build()
                        .unwrap();
                    let summed: f64 = (0..retries)
                        .map(|n| p.base_delay(n).as_secs_f64() * (1.0 + jitter))
                        .sum();
                    let closed = p.worst_case_wait().as_secs_f64();
                    assert!(
                        (closed - summed).abs() <= 1e-6 * summed.max(1.0),
                        "{p:?}: {closed} vs {summed}"
                    );
                }
            }
        }
    }

    #[test]
    fn worst_case_of_the_specs_patient_policy_is_sixty_seconds_unjittered() {
        let p = RetryPolicy::builder()
            .max_retries(5)
            .initial_delay(Duration::from_secs(2))
            .max_delay(Duration::from_secs(30))
            .jitter(0.0)
            .build()
            .unwrap();
        assert_eq!(p.worst_case_wait(), Duration::from_secs(60));
    }

    #[test]
    fn construction_rejects_nonsense_naming_the_field() {
        let cases = [
            (
                RetryPolicy::builder().initial_delay(Duration::ZERO),
                "initial_delay must be positive, got 0",
            ),
            (
                RetryPolicy::builder()
                    .initial_delay(Duration::from_secs(10))
                    .max_delay(Duration::from_secs(5)),
                "max_delay must be at least initial_delay, got 5",
            ),
            (
                RetryPolicy::builder().multiplier(0.5),
                "multiplier must be at least 1.0, got 0.5",
            ),
            (
                RetryPolicy::builder().multiplier(f64::NAN),
                "multiplier must be at least 1.0, got NaN",
            ),
            (
                RetryPolicy::builder().jitter(-0.1),
                "jitter must be between 0.0 and 1.0, got -0.1",
            ),
            (
                RetryPolicy::builder().jitter(1.5),
                "jitter must be between 0.0 and 1.0, got 1.5",
            ),
        ];
        for (builder, message) in cases {
            assert_eq!(builder.build().unwrap_err().to_string(), message);
        }
    }
}
