//! The differential property test's body: random operation sequences driven
//! into `MemoryCache` (on a manual clock) and a `RedisCache` (on a real
//! server, cluster or TLS endpoint) must get identical answers, operation by
//! operation.
//!
//! Both caches stamp with the caller's instants, which the test chooses, so
//! windows, pruning and breaker timeouts are compared exactly. TTLs are long
//! enough that nothing expires on the real server during a case; expiry itself
//! is pinned by the compliance suite.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use redstring::cache::{
    BreakerStore, BudgetStore, HitWindow, InFlightStore, KeyValue, LimiterStore, SlotRequest, TokenStore,
};
use redstring::decide::breaker::{BreakerCommand, BreakerKeys, BreakerParams, Origin, ProbeId};
use redstring::decide::budget::{BudgetCommand, BudgetParams, MICROS_PER_RETRY};
use redstring::decide::pick::PickRequest;
use redstring::decide::tokens::{ReservationId, TokenAsk};
use redstring::{CacheError, Clock, ManualClock, MemoryCache, SystemClock, Timestamp};

/// Keys for values and windows; the fourth is also the breaker's state key,
/// and the last's hit window hashes to another cluster slot than the key.
const KEYS: &[&str] = &["a", "b", "{t}:x", "{br}:state", "x}y"];
/// Increment stays off the breaker's keys: MemoryCache keeps a counter as an
/// integer, which its breaker decoding reads differently from a string.
const COUNTER_KEYS: &[&str] = &["a", "b", "{t}:x"];
const VALUES: &[&str] = &[
    "1",
    "41",
    "x",
    "",
    "-3",
    "+7",
    "007",
    "-0",
    "9223372036854775807",
    "99999999999999999999",
    "open",
    "half_open",
    "closed",
    "1700000050.5",
    "1700000000.",
    "0 1 1:9007199254740992",
    "0 1 1:9007199254740993",
    "1 2 3:4 5:6",
    "1 2  3:4",
    "2500000:1700000000000000",
    "9007199254740992:1",
    "9007199254740993:1",
    "1:2:3",
    "9007199254740992",
];

/// Who reports, with a probe named by its episode's offset and its number.
#[derive(Clone, Copy, Debug)]
enum From {
    Untracked,
    Call,
    Probe(u64, u32),
}

/// A breaker command, with instants as offsets from the case's start.
#[derive(Clone, Copy, Debug)]
enum Command {
    Allow,
    Success(From),
    Failure(From),
    Release(u64, u32),
    Reset,
    /// A cooldown of this many seconds.
    CoolDown(u64),
}

impl Command {
    fn at(self, base: Timestamp) -> BreakerCommand {
        let probe = |episode, seq| ProbeId {
            episode: at(base, episode),
            seq,
        };
        let origin = |from| match from {
            From::Untracked => Origin::Untracked,
            From::Call => Origin::Call,
            From::Probe(episode, seq) => Origin::Probe(probe(episode, seq)),
        };
        match self {
            Command::Allow => BreakerCommand::Allow,
            Command::Success(from) => BreakerCommand::RecordSuccess(origin(from)),
            Command::Failure(from) => BreakerCommand::RecordFailure(origin(from)),
            Command::Release(episode, seq) => BreakerCommand::Release(probe(episode, seq)),
            Command::Reset => BreakerCommand::Reset,
            Command::CoolDown(secs) => BreakerCommand::CoolDown {
                duration: Duration::from_secs(secs),
            },
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Set(usize, usize, bool),
    Get(usize),
    Increment(usize, bool),
    Delete(usize),
    RecordHit(usize, u64, Duration),
    CountSince(usize, u64),
    OldestSince(usize, u64),
    Acquire(usize, u64, Duration, u32),
    SetBreakerKey(usize, usize),
    GetBreakerKey(usize),
    Breaker(Command, u64, BreakerParams),
    BreakerRead(u64),
    Budget(usize, BudgetCommand, u64, BudgetParams),
    Tokens(usize, u64, Duration, u32, TokenAsk),
    Settle(usize, u64, u32, u64),
    Pick(usize, Vec<u32>, u64, u64, u64),
    EndInFlight(usize, u64),
}

/// Deployments' keys for the router's picks: tagged alike, so a cluster puts
/// them in one slot; the first is also a plain value's key.
const ROUTES: &[&str] = &["{r}:x", "{r}:y", "{r}:z"];

/// Instants cluster on a few whole seconds, with same-instant collisions.
fn instant() -> impl Strategy<Value = u64> {
    ((0u64..13), (0u64..2)).prop_map(|(s, us)| s * 10_000_000 + us)
}

fn long_ttl() -> impl Strategy<Value = Duration> {
    prop_oneof![Just(Duration::from_secs(60)), Just(Duration::from_secs(120))]
}

fn op() -> impl Strategy<Value = Op> {
    // Mostly one key, so that sequences pile up on it.
    let key = prop_oneof![5 => Just(0usize), 2 => Just(1), 1 => Just(2), 1 => Just(3), 1 => Just(4)];
    let value = 0..VALUES.len();
    // Probes are named on the same few instants episodes begin at, so reports
    // and releases sometimes hold a live lease and sometimes a stale one.
    let from = prop_oneof![
        2 => Just(From::Untracked),
        1 => Just(From::Call),
        2 => (instant(), 1u32..4).prop_map(|(e, s)| From::Probe(e, s)),
    ];
    let command = prop_oneof![
        3 => Just(Command::Allow),
        1 => from.clone().prop_map(Command::Success),
        3 => from.prop_map(Command::Failure),
        1 => (instant(), 1u32..4).prop_map(|(e, s)| Command::Release(e, s)),
        1 => Just(Command::Reset),
        2 => prop_oneof![Just(0u64), Just(5), Just(20), Just(40)].prop_map(Command::CoolDown),
    ];
    // An escalation of 1 is none; 8 lets the open period double three times.
    let params = (
        1u32..4,
        prop_oneof![Just(30u64), Just(60), Just(90)],
        1u32..4,
        prop_oneof![Just(1u64), Just(8)],
    )
        .prop_map(|(t, r, p, escalation)| BreakerParams {
            failure_threshold: t,
            recovery_timeout: Duration::from_secs(r),
            max_recovery_timeout: Duration::from_secs(r * escalation),
            half_open_max_calls: p,
            probe_lease: Duration::from_secs(r / 3),
        });
    prop_oneof![
        1 => (key.clone(), value.clone(), any::<bool>()).prop_map(|(k, v, t)| Op::Set(k, v, t)),
        1 => key.clone().prop_map(Op::Get),
        1 => (0..COUNTER_KEYS.len(), any::<bool>()).prop_map(|(k, t)| Op::Increment(k, t)),
        1 => key.clone().prop_map(Op::Delete),
        3 => (key.clone(), instant(), long_ttl()).prop_map(|(k, at, ttl)| Op::RecordHit(k, at, ttl)),
        2 => (key.clone(), instant()).prop_map(|(k, s)| Op::CountSince(k, s)),
        2 => (key.clone(), instant()).prop_map(|(k, s)| Op::OldestSince(k, s)),
        3 => (key, instant(), prop_oneof![Just(30u64), Just(60)], 0u32..4)
            .prop_map(|(k, now, w, limit)| Op::Acquire(k, now, Duration::from_secs(w), limit)),
        1 => (0usize..7, value).prop_map(|(k, v)| Op::SetBreakerKey(k, v)),
        1 => (0usize..7).prop_map(Op::GetBreakerKey),
        4 => (command, instant(), params).prop_map(|(c, now, p)| Op::Breaker(c, now, p)),
        1 => instant().prop_map(Op::BreakerRead),
        3 => (0usize..3, budget_command(), instant(), budget_params())
            .prop_map(|(k, c, now, p)| Op::Budget(k, c, now, p)),
        4 => (0usize..3, instant(), prop_oneof![Just(30u64), Just(60)], 0u32..5, token_ask())
            .prop_map(|(k, now, w, limit, ask)| Op::Tokens(k, now, Duration::from_secs(w), limit, ask)),
        2 => (0usize..3, instant(), 0u32..3, 0u64..600).prop_map(|(k, at, seq, actual)| Op::Settle(k, at, seq, actual)),
        3 => (1usize..4, prop::collection::vec(0u32..4, 3), instant(), 0u64..6, prop_oneof![Just(5u64), Just(15), Just(40)])
            .prop_map(|(n, w, now, id, lease)| Op::Pick(n, w, now, id, lease)),
        1 => (0usize..3, 0u64..6).prop_map(|(k, id)| Op::EndInFlight(k, id)),
    ]
}

/// Estimates around a limit a few of them fill, with leases shorter and
/// longer than the windows.
fn token_ask() -> impl Strategy<Value = TokenAsk> {
    (
        prop_oneof![Just(0u64), Just(100), Just(250), Just(400), Just(1200)],
        prop_oneof![Just(500u64), Just(1000)],
        prop_oneof![Just(15u64), Just(45), Just(90)],
    )
        .prop_map(|(tokens, limit, lease)| TokenAsk {
            tokens,
            limit,
            lease: Duration::from_secs(lease),
        })
}

fn budget_command() -> impl Strategy<Value = BudgetCommand> {
    prop_oneof![Just(BudgetCommand::Deposit), Just(BudgetCommand::Withdraw)]
}

/// Ratios of a fifth to two, floors of none to a few per second, small caps:
/// buckets fill, drain and hit their caps within a case.
fn budget_params() -> impl Strategy<Value = BudgetParams> {
    (
        prop_oneof![Just(200_000u64), Just(500_000), Just(2_000_000)],
        0u32..4,
        1u64..5,
    )
        .prop_map(|(deposit, refill_per_sec, cap)| BudgetParams {
            deposit,
            refill_per_sec,
            max_balance: cap * MICROS_PER_RETRY,
            ttl: Duration::from_secs(120),
            max_ahead: UNCLAMPED,
        })
}

/// What an operation answered, comparably: the value, or the error's kind
/// (details such as messages legitimately differ between adapters).
fn outcome<T: std::fmt::Debug>(result: Result<T, CacheError>) -> String {
    match result {
        Ok(value) => format!("ok {value:?}"),
        Err(CacheError::NotAnInteger { key }) => format!("not an integer: {key}"),
        Err(CacheError::Protocol { operation, .. }) => format!("protocol error in {operation}"),
        Err(other) => format!("error {other:?}"),
    }
}

/// A caller lead beyond every instant the operations use.
const UNCLAMPED: Duration = Duration::from_secs(100_000);

/// The instant `offset` µs after a case's start. Each case starts at the
/// server's present, so that the server's clock, which prunes and expires,
/// agrees with the memory cache's (which stands still at the start).
fn at(base: Timestamp, offset: u64) -> Timestamp {
    Timestamp::from_micros(base.as_micros() + offset)
}

fn breaker_key(keys: &BreakerKeys, i: usize) -> &str {
    keys.all()[i]
}

async fn apply<C>(c: &C, base: Timestamp, op: &Op) -> String
where
    C: KeyValue + HitWindow + LimiterStore + BreakerStore + BudgetStore + TokenStore + InFlightStore,
{
    let keys = BreakerKeys::new("br");
    let ttl = |on: bool| on.then_some(Duration::from_secs(300));
    match *op {
        Op::Set(k, v, t) => outcome(c.set(KEYS[k], VALUES[v], ttl(t)).await),
        Op::Get(k) => outcome(c.get(KEYS[k]).await),
        Op::Increment(k, t) => outcome(c.increment(COUNTER_KEYS[k], ttl(t)).await),
        Op::Delete(k) => outcome(c.delete(KEYS[k]).await),
        Op::RecordHit(k, t, ttl) => outcome(c.record_hit(KEYS[k], at(base, t), ttl).await),
        Op::CountSince(k, s) => outcome(c.count_since(KEYS[k], at(base, s)).await),
        Op::OldestSince(k, s) => outcome(c.oldest_since(KEYS[k], at(base, s)).await),
        Op::Acquire(k, now, window, limit) => outcome(
            c.acquire_slot(
                KEYS[k],
                SlotRequest {
                    now: at(base, now),
                    window,
                    limit,
                    // The memory cache's clock stands still and the server's
                    // runs: a lead no instant here reaches keeps both unclamped.
                    ttl: window * 2 + UNCLAMPED,
                    max_ahead: UNCLAMPED,
                },
            )
            .await,
        ),
        Op::SetBreakerKey(k, v) => outcome(c.set(breaker_key(&keys, k), VALUES[v], None).await),
        Op::GetBreakerKey(k) => outcome(c.get(breaker_key(&keys, k)).await),
        Op::Breaker(command, now, params) => {
            outcome(c.breaker_step(&keys, command.at(base), params, at(base, now)).await)
        }
        Op::BreakerRead(now) => outcome(c.breaker_read(&keys, at(base, now)).await),
        Op::Budget(k, command, now, params) => outcome(c.budget_step(KEYS[k], command, params, at(base, now)).await),
        Op::Tokens(k, now, window, limit, ask) => outcome(
            c.acquire_with_tokens(
                KEYS[k],
                SlotRequest {
                    now: at(base, now),
                    window,
                    limit,
                    ttl: window * 2 + UNCLAMPED,
                    max_ahead: UNCLAMPED,
                },
                ask,
            )
            .await,
        ),
        Op::Pick(n, ref weights, now, id, lease) => outcome(
            c.pick_least_loaded(
                &ROUTES[..n],
                &weights[..n],
                PickRequest {
                    now: at(base, now),
                    id,
                    lease: Duration::from_secs(lease),
                    max_ahead: UNCLAMPED,
                },
            )
            .await,
        ),
        Op::EndInFlight(k, id) => outcome(c.end_in_flight(ROUTES[k], id).await),
        Op::Settle(k, stamp, seq, actual) => outcome(
            c.settle_tokens(
                KEYS[k],
                ReservationId {
                    at: at(base, stamp),
                    seq,
                },
                actual,
            )
            .await,
        ),
    }
}

/// Runs `default_cases` random sequences against the cache `make` builds
/// (on the test's runtime), calling `flush` (which empties its server) before
/// each; panics with the first difference.
pub fn memory_and_redis_agree<C>(make: impl FnOnce() -> C, flush: impl Fn(), default_cases: u32)
where
    C: KeyValue + HitWindow + LimiterStore + BreakerStore + BudgetStore + TokenStore + InFlightStore,
{
    let rt = super::runtime();
    let redis = &rt.block_on(async { make() });
    let mut runner = super::runner(default_cases);
    let result = runner.run(&prop::collection::vec(op(), 10..60), |ops| {
        rt.block_on(async {
            flush();
            let base = SystemClock.now();
            let memory = MemoryCache::with_time_source(Arc::new(ManualClock::new(base)), redstring::TimeSource::Caller);
            for (i, op) in ops.iter().enumerate() {
                let expected = apply(&memory, base, op).await;
                let actual = apply(redis, base, op).await;
                if expected != actual {
                    return Err(TestCaseError::fail(format!(
                        "step {i} {op:?}: memory {expected}, redis {actual}"
                    )));
                }
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
