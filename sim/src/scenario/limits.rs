//! The ranges a scenario's numbers must fall in, and why.
//!
//! Serde accepts any `u32`, `i64` or `f64`; the simulation does not. Each
//! limit here bounds a number that, past it, made a run panic, overflow into
//! nonsense (a clock in 1970, an instant answer from an infinitely slow
//! server) or grow without bound (arrival gaps rounding to zero, a burst of
//! four billion calls). They are generous: every one is far beyond a
//! deployment worth simulating, so a scenario that trips one is a typo or a
//! unit mistake. Validation ([`Scenario::validate`](super::Scenario::validate))
//! fails with the field and its line when one is exceeded; the simulation's
//! own work budget ([`crate::world::Budget`]) bounds what is left — how much
//! a valid scenario may ask for in all.
//!
//! | field | range |
//! |---|---|
//! | every `*_s` duration of `hardening` (`window_s`, `recovery_timeout_s`, `max_recovery_timeout_s`, `probe_lease_s`, `initial_delay_s`, `max_delay_s`, `request_timeout_s`, `deadline_s`) | [`MIN_SECONDS`] ..= [`MAX_SECONDS`] |
//! | `duration_s` | one tick ..= one day |
//! | `servers[].reload_s`, `behaviour.retry_after_s` | 0 ..= [`MAX_SECONDS`] |
//! | `network.*_latency_ms`, `cache.timeout_ms`, a `latency` fault's `ms` | ..= [`MAX_LATENCY_MS`] |
//! | `servers` | ..= [`MAX_SERVERS`] |
//! | `servers[].prefill_tokens_per_s`, `decode_tokens_per_s` | [`MIN_TOKENS_PER_S`] ..= [`MAX_TOKENS_PER_S`] |
//! | one request's service time (tokens over speeds) | ..= [`MAX_SERVICE_TIME_S`] |
//! | workers in all groups together | ..= [`MAX_FLEET`] (and as many in one group) |
//! | `workers[].tenants` | ..= [`MAX_TENANTS`] per group |
//! | `tenants[].calls_per_min` | ..= [`MAX_CALLS_PER_MIN`]; the whole fleet ..= [`MAX_FLEET_CALLS_PER_MIN`] |
//! | `tenants[].replay` | at most [`replay::MAX_REQUESTS`](super::replay::MAX_REQUESTS) requests inside the run, each ..= [`MAX_TRACE_TOKENS`] tokens either way; `speedup` 0.001 ..= 10⁶ |
//! | `servers[].prompt_tokens`, `output_tokens`, `hardening.max_tokens` | ..= [`MAX_TRACE_TOKENS`] |
//! | `tenants[].prompt_tokens`, `output_tokens` (distributions) | mean ..= [`MAX_TRACE_TOKENS`], each draw capped at it; `low` ≤ `high`, `sigma` 0 ..= 3, nothing negative |
//! | `tenants[].clients` | ..= [`MAX_CLIENTS`], the whole fleet ..= [`MAX_FLEET_CLIENTS`]; with `think_s` ([`MIN_SECONDS`] ..), at most [`MAX_CALLS_PER_MIN`] starts a minute, counted in the fleet's total |
//! | a `burst` fault's `calls` | ..= [`MAX_BURST_CALLS_PER_WORKER`]; times the workers with its tenant ..= [`MAX_BURST_CALLS`] |
//! | `faults` | ..= [`MAX_FAULTS`] |
//! | `hardening.max_retries` | ..= [`MAX_RETRIES`] |
//! | `hardening.limiter_waits` | ..= [`MAX_LIMITER_WAITS`] |
//! | `hardening.slow_start_s` | [`MIN_SECONDS`] ..= 86 400 (the core's longest ramp) |
//! | `hardening.adaptive_concurrency` | `min` ≥ 1, `initial` in `[min, max]`, `max` ≤ 10 000, `backoff` in [0.001, 0.999] (the core's limits) |
//! | `hardening.slow_call_ms` | 1 .. `request_timeout_s` and `deadline_s` (in ms, below both) |
//! | `hardening.hedge_after_ms` (or `hedge_floor_ms` under `"p95"`) | 1 .. `request_timeout_s` and `deadline_s` (in ms, below both) |
//! | `hardening.max_hedges`, `hardening.hedge_window` | 1 ..= 4, 20 ..= 10000 (the core's limits) |
//! | `hardening.multiplier` | 1 ..= 1000 |
//! | `hardening.retry_budget`: `ratio`, `min_retries_per_sec`, `max_balance` | 0 ..= 10, ..= 1000, 1 ..= 10⁶ (the core's limits) |
//! | `clock.offset_ms`, and a host's offset plus its `clock_step`s | ..= [`MAX_CLOCK_MS`] either way |
//! | `clock.drift_ppm` | ..= [`MAX_DRIFT_PPM`] either way |

/// The shortest span a seconds field may hold: 1 ms. Shorter spans round to
/// nothing in the core's `Duration`s and fail later without a line.
pub const MIN_SECONDS: f64 = 0.001;

/// The longest span a seconds field may hold: one year.
pub const MAX_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// The longest link latency or cache timeout, in ms: one minute. (The
/// connections a client closes count against its limit for twice this,
/// see [`TIME_WAIT`](crate::hosts::transport::TIME_WAIT).)
pub const MAX_LATENCY_MS: u64 = 60_000;

/// The most model servers.
pub const MAX_SERVERS: u64 = 100;

/// The slowest prefill or decode speed per slot (tokens per second).
pub const MIN_TOKENS_PER_S: f64 = 0.01;

/// The fastest prefill or decode speed per slot (tokens per second).
pub const MAX_TOKENS_PER_S: f64 = 1e9;

/// The longest one request may hold a slot: one day.
pub const MAX_SERVICE_TIME_S: f64 = 24.0 * 3600.0;

/// The most workers, all groups together: ten times a fleet of the size
/// the simulator is measured at (BENCHMARKS.md).
pub const MAX_FLEET: u64 = 10_000;

/// The most tenants one worker group may carry.
pub const MAX_TENANTS: u64 = 100;

/// The most arrivals per minute of one tenant on one worker (1000 a second).
/// Far more makes the Poisson gaps round to zero simulated time.
pub const MAX_CALLS_PER_MIN: f64 = 60_000.0;

/// The most tokens either way in one replayed trace request (the simulated
/// servers' token header carries no more).
pub const MAX_TRACE_TOKENS: u64 = crate::hosts::MAX_HEADER_TOKENS;

/// The most closed-loop clients of one tenant on one worker.
pub const MAX_CLIENTS: u64 = 10_000;

/// The most closed-loop clients of every tenant on every worker together
/// (each is a task with its own random stream).
pub const MAX_FLEET_CLIENTS: u64 = 100_000;

/// The most arrivals per minute of every tenant on every worker together
/// (10,000 a second).
pub const MAX_FLEET_CALLS_PER_MIN: f64 = 600_000.0;

/// The most faults in one schedule.
pub const MAX_FAULTS: u64 = 10_000;

/// The most calls one burst fires on one worker.
pub const MAX_BURST_CALLS_PER_WORKER: u32 = 10_000;

/// The most calls one burst fires across the fleet.
pub const MAX_BURST_CALLS: u64 = 100_000;

/// The most retries after a call's first attempt.
pub const MAX_RETRIES: u32 = 100;

/// The most limiter refusals one call may wait out.
pub const MAX_LIMITER_WAITS: u32 = 1000;

/// The largest clock offset, and offset plus steps, of one host, in ms: one
/// year either way (the simulation starts in November 2023, so a clock never
/// reads before 1970).
pub const MAX_CLOCK_MS: u64 = 365 * 24 * 3600 * 1000;

/// The largest clock drift, in parts per million: 10 % either way.
pub const MAX_DRIFT_PPM: u64 = 100_000;
