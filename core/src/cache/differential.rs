//! The simple store against the sharded one: random sequences of every
//! operation of the port, over keys of every kind and a clock that moves,
//! answered identically by both. (The store's clock never steps back here:
//! an entry a sweep dropped would then have come back to life in a store
//! that had not swept it yet — when each store sweeps is its own.)

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::memory::MemoryCache as Old;
use super::simple::MemoryCache as New;
use super::{
    BreakerStore, BudgetStore, ImmediateStore, InFlightStore, KeyBuf, KeyValue, LimiterStore, SlotRequest,
    TenantPrefix, TimeSource, TokenStore,
};
use crate::clock::{Clock, ManualClock};
use crate::decide::breaker::{BreakerCommand, BreakerKeys, BreakerParams, BreakerSnapshot, Origin, ProbeId};
use crate::decide::budget::{BudgetCommand, BudgetParams};
use crate::decide::pick::PickRequest;
use crate::decide::tokens::{ReservationId, TokenAsk, TokenOutcome};
use crate::tenant::TenantId;
use crate::time::Timestamp;

fn ready<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("MemoryCache operations never suspend"),
    }
}

const PREFIXES: [&str; 3] = [
    "kg:ratelimit",
    "{tagged}",
    "a prefix far longer than any limiter accepts, so that its keys are cut where the buffer ends, .....",
];

/// The keys every kind of operation is asked about: plain, tagged (the
/// breaker's shard), limiters' tenants, and the breakers' own.
fn keys() -> Vec<String> {
    let mut keys: Vec<String> = ["a", "b", "{t}:x", "s", "f"].map(String::from).into();
    for prefix in PREFIXES {
        for tenant in [1, 2] {
            keys.push(KeyBuf::tenant(prefix, &TenantId::from_u128(tenant)).as_str().to_owned());
        }
    }
    keys.extend(breaker_keys()[0].all().map(String::from));
    keys
}

/// A breaker's tagged keys, and a hand-made set over several shards (two
/// of them also plain keys of [`keys`]).
fn breaker_keys() -> [BreakerKeys; 2] {
    [
        BreakerKeys::new("kg:circuit"),
        BreakerKeys {
            state: "s".to_owned(),
            failures: "f".to_owned(),
            opened_at: "o".to_owned(),
            probes: "p".to_owned(),
            cooldown_until: "c".to_owned(),
        },
    ]
}

/// An instant relative to the clock, in milliseconds.
type Offset = i64;

fn at(now: Timestamp, offset: Offset) -> Timestamp {
    let by = Duration::from_millis(offset.unsigned_abs());
    if offset < 0 {
        now.saturating_sub(by)
    } else {
        now.saturating_add(by)
    }
}

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Get(usize),
    Set(usize, &'static str, Option<u64>),
    Increment(usize, Option<u64>),
    Delete(usize),
    RecordHit(usize, Offset, u64),
    CountSince(usize, Offset),
    OldestSince(usize, Offset),
    AcquireSlot(usize, Slot),
    /// Prefix, tenant, whose resolution (0 this store's, 1 the other's, 2
    /// none), and whether through the synchronous twin.
    AcquireTenant(usize, u128, usize, bool, Slot),
    AcquireTokens(usize, Slot, (u64, u64, u64)),
    /// Which reservation made so far, at its key (or a made-up one at this
    /// key), tokens used.
    Settle(usize, Option<prop::sample::Index>, u64),
    /// Keys and their weights (one more or fewer, now and then), offset,
    /// id, lease, max_ahead.
    Pick(Vec<(usize, u32)>, i8, Offset, u64, u64, u64),
    EndInFlight(usize, u64),
    BreakerStep(usize, Command, (u32, u64, u32, u64), Offset, bool),
    BreakerRead(usize, Offset),
    Budget(usize, bool, (u64, u32, u64, u64, u64), Offset),
    Close,
}

/// A limiter request: offset of its `now`, window (s), limit, ttl (ms
/// beyond two windows), max_ahead (ms).
type Slot = (Offset, u64, u32, u64, u64);

#[derive(Clone, Copy, Debug)]
enum Command {
    Allow,
    Success(u8, Offset, u32),
    Failure(u8, Offset, u32),
    Release(Offset, u32),
    Reset,
    CoolDown(u64),
}

fn slot() -> impl Strategy<Value = Slot> {
    (
        -3_000i64..3_000,
        prop::sample::select(vec![1u64, 10, 60]),
        0u32..5,
        0u64..3_000,
        prop::sample::select(vec![0u64, 1_000, 5_000]),
    )
}

fn offset() -> impl Strategy<Value = Offset> {
    // Now and then days away: hits that span more than a word of microseconds.
    prop_oneof![4 => -5_000i64..5_000, 4 => -200_000i64..200_000, 1 => -300_000_000i64..300_000_000]
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        3 => Just(Command::Allow),
        2 => (0u8..3, -60_000i64..1_000, 1u32..4).prop_map(|(o, e, s)| Command::Success(o, e, s)),
        3 => (0u8..3, -60_000i64..1_000, 1u32..4).prop_map(|(o, e, s)| Command::Failure(o, e, s)),
        1 => (-60_000i64..1_000, 1u32..4).prop_map(|(e, s)| Command::Release(e, s)),
        1 => Just(Command::Reset),
        1 => (0u64..20_000).prop_map(Command::CoolDown),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..keys().len();
    let ttl = prop::option::of(0u64..20_000);
    let texts = prop::sample::select(vec![
        "1",
        "x",
        "9223372036854775807",
        "closed",
        "open",
        "half_open",
        "-3",
    ]);
    prop_oneof![
        6 => prop_oneof![0u64..2_000, 0u64..130_000].prop_map(Op::Advance),
        2 => key.clone().prop_map(Op::Get),
        2 => (key.clone(), texts, ttl.clone()).prop_map(|(k, v, t)| Op::Set(k, v, t)),
        2 => (key.clone(), ttl).prop_map(|(k, t)| Op::Increment(k, t)),
        1 => key.clone().prop_map(Op::Delete),
        3 => (key.clone(), offset(), prop_oneof![0u64..200_000, 0u64..400_000_000])
            .prop_map(|(k, o, t)| Op::RecordHit(k, o, t)),
        2 => (key.clone(), offset()).prop_map(|(k, o)| Op::CountSince(k, o)),
        2 => (key.clone(), offset()).prop_map(|(k, o)| Op::OldestSince(k, o)),
        4 => (key.clone(), slot()).prop_map(|(k, s)| Op::AcquireSlot(k, s)),
        6 => (0..PREFIXES.len(), 1u128..3, 0usize..3, any::<bool>(), slot())
            .prop_map(|(p, t, r, now, s)| Op::AcquireTenant(p, t, r, now, s)),
        4 => (key.clone(), slot(), (0u64..20, 0u64..40, prop::sample::select(vec![500u64, 5_000, 60_000])))
            .prop_map(|(k, s, a)| Op::AcquireTokens(k, s, a)),
        3 => (key.clone(), prop::option::weighted(0.9, any::<prop::sample::Index>()), 0u64..30)
            .prop_map(|(k, r, a)| Op::Settle(k, r, a)),
        3 => (
            prop::collection::vec((key.clone(), 0u32..3), 0..5),
            prop::sample::select(vec![0i8, 0, 0, 0, 0, 0, 1, -1]),
            -5_000i64..5_000,
            0u64..4,
            prop::sample::select(vec![0u64, 1_000, 30_000]),
            prop::sample::select(vec![0u64, 1_000]),
        )
            .prop_map(|(k, w, o, id, lease, ahead)| Op::Pick(k, w, o, id, lease, ahead)),
        1 => (key.clone(), 0u64..4).prop_map(|(k, id)| Op::EndInFlight(k, id)),
        8 => (
            0usize..2,
            command(),
            (1u32..4, prop::sample::select(vec![1_000u64, 5_000, 30_000]), 1u32..3, prop::sample::select(vec![1_000u64, 10_000])),
            -3_000i64..3_000,
            any::<bool>(),
        )
            .prop_map(|(b, c, p, o, now)| Op::BreakerStep(b, c, p, o, now)),
        2 => (0usize..2, -3_000i64..3_000).prop_map(|(b, o)| Op::BreakerRead(b, o)),
        3 => (
            key,
            any::<bool>(),
            (0u64..3_000_000, 0u32..3, 0u64..5_000_000, prop::sample::select(vec![1_000u64, 60_000]), prop::sample::select(vec![0u64, 1_000])),
            -5_000i64..5_000,
        )
            .prop_map(|(k, w, p, o)| Op::Budget(k, w, p, o)),
    ]
}

fn request(now: Timestamp, (offset, window, limit, ttl, ahead): Slot) -> SlotRequest {
    let window = Duration::from_secs(window);
    let max_ahead = Duration::from_millis(ahead);
    SlotRequest {
        now: at(now, offset),
        window,
        limit,
        ttl: 2 * window + max_ahead + Duration::from_millis(ttl),
        max_ahead,
    }
}

fn breaker_command(now: Timestamp, command: Command) -> BreakerCommand {
    let origin = |o: u8, episode: Offset, seq: u32| match o {
        0 => Origin::Untracked,
        1 => Origin::Call,
        _ => Origin::Probe(ProbeId {
            episode: at(now, episode),
            seq,
        }),
    };
    match command {
        Command::Allow => BreakerCommand::Allow,
        Command::Success(o, e, s) => BreakerCommand::RecordSuccess(origin(o, e, s)),
        Command::Failure(o, e, s) => BreakerCommand::RecordFailure(origin(o, e, s)),
        Command::Release(e, seq) => BreakerCommand::Release(ProbeId {
            episode: at(now, e),
            seq,
        }),
        Command::Reset => BreakerCommand::Reset,
        Command::CoolDown(ms) => BreakerCommand::CoolDown {
            duration: Duration::from_millis(ms),
        },
    }
}

/// A store as the test drives it.
trait Store: ImmediateStore + TokenStore + InFlightStore + BudgetStore + KeyValue {}

impl Store for Old {}

impl Store for New {}

/// What `store` answers to `op` at `now`, as text; `prefixes` are the
/// limiter prefixes as this store resolved them, `others` as the other did.
/// `reservations` are the token reservations made so far, and `made` (given
/// to one store) gets those this operation makes.
fn apply(
    store: &impl Store,
    prefixes: &[TenantPrefix],
    others: &[TenantPrefix],
    reservations: &[(usize, ReservationId)],
    made: Option<&mut Vec<(usize, ReservationId)>>,
    op: &Op,
    now: Timestamp,
) -> String {
    let keys = keys();
    let ms = Duration::from_millis;
    match op.clone() {
        Op::Advance(_) => String::new(),
        Op::Get(k) => format!("{:?}", ready(store.get(&keys[k]))),
        Op::Set(k, v, ttl) => format!("{:?}", ready(store.set(&keys[k], v, ttl.map(ms)))),
        Op::Increment(k, ttl) => format!("{:?}", ready(store.increment(&keys[k], ttl.map(ms)))),
        Op::Delete(k) => format!("{:?}", ready(store.delete(&keys[k]))),
        Op::RecordHit(k, o, ttl) => format!("{:?}", ready(store.record_hit(&keys[k], at(now, o), ms(ttl)))),
        Op::CountSince(k, o) => format!("{:?}", ready(store.count_since(&keys[k], at(now, o)))),
        Op::OldestSince(k, o) => format!("{:?}", ready(store.oldest_since(&keys[k], at(now, o)))),
        Op::AcquireSlot(k, s) => format!("{:?}", ready(store.acquire_slot(&keys[k], request(now, s)))),
        Op::AcquireTenant(p, t, resolved, immediate, s) => {
            let prefix = match resolved {
                0 => prefixes[p].clone(),
                1 => others[p].clone(),
                _ => TenantPrefix::new(PREFIXES[p]),
            };
            let tenant = TenantId::from_u128(t);
            let request = request(now, s);
            if immediate {
                format!("{:?}", store.acquire_tenant_slot_now(&prefix, tenant, &request))
            } else {
                format!("{:?}", ready(store.acquire_tenant_slot(&prefix, tenant, request)))
            }
        }
        Op::AcquireTokens(k, s, (tokens, limit, lease)) => {
            let ask = TokenAsk {
                tokens,
                limit,
                lease: ms(lease),
            };
            let outcome = ready(store.acquire_with_tokens(&keys[k], request(now, s), ask));
            if let (Ok(TokenOutcome::Admitted { reservation, .. }), Some(made)) = (&outcome, made) {
                made.push((k, *reservation));
            }
            format!("{outcome:?}")
        }
        Op::Settle(k, made, actual) => {
            let (k, id) = match made {
                Some(i) if !reservations.is_empty() => reservations[i.index(reservations.len())],
                _ => (k, ReservationId { at: now, seq: 0 }),
            };
            format!("{:?}", ready(store.settle_tokens(&keys[k], id, actual)))
        }
        Op::Pick(candidates, off, o, id, lease, ahead) => {
            let picked: Vec<&str> = candidates.iter().map(|(k, _)| keys[*k].as_str()).collect();
            let mut weights: Vec<u32> = candidates.iter().map(|(_, w)| *w).collect();
            match off {
                1 => weights.push(1),
                -1 => drop(weights.pop()),
                _ => {}
            }
            let request = PickRequest {
                now: at(now, o),
                id,
                lease: ms(lease),
                max_ahead: ms(ahead),
            };
            format!("{:?}", ready(store.pick_least_loaded(&picked, &weights, request)))
        }
        Op::EndInFlight(k, id) => format!("{:?}", ready(store.end_in_flight(&keys[k], id))),
        Op::BreakerStep(b, command, (threshold, recovery, probes, lease), o, immediate) => {
            let keys = &breaker_keys()[b];
            let params = BreakerParams {
                failure_threshold: threshold,
                recovery_timeout: ms(recovery),
                half_open_max_calls: probes,
                probe_lease: ms(lease),
            };
            let command = breaker_command(now, command);
            let now = at(now, o);
            if immediate {
                format!("{:?}", store.breaker_step_now(keys, command, params, now))
            } else {
                format!("{:?}", ready(store.breaker_step(keys, command, params, now)))
            }
        }
        Op::BreakerRead(b, o) => format!("{:?}", ready(store.breaker_read(&breaker_keys()[b], at(now, o)))),
        Op::Budget(k, withdraw, (deposit, refill_per_sec, max_balance, ttl, ahead), o) => {
            let params = BudgetParams {
                deposit,
                refill_per_sec,
                max_balance,
                ttl: ms(ttl),
                max_ahead: ms(ahead),
            };
            let command = if withdraw {
                BudgetCommand::Withdraw
            } else {
                BudgetCommand::Deposit
            };
            format!("{:?}", ready(store.budget_step(&keys[k], command, params, at(now, o))))
        }
        Op::Close => format!("{:?}", ready(super::Cache::close(store))),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every answer the new store gives is the old one's, and so is what
    /// each holds live; a quiet breaker store reads as empty.
    #[test]
    fn the_simple_store_answers_as_the_sharded_one(
        mut ops in prop::collection::vec(op(), 1..200),
        caller in any::<bool>(),
        close in prop::option::weighted(0.1, any::<prop::sample::Index>()),
    ) {
        if let Some(at) = close {
            ops.insert(at.index(ops.len() + 1), Op::Close);
        }
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let time_source = if caller { TimeSource::Caller } else { TimeSource::Store };
        let old = Old::with_time_source(clock.clone(), time_source);
        let new = New::with_time_source(clock.clone(), time_source);
        prop_assert_eq!(
            super::Cache::stamps_with_own_clock(&old),
            super::Cache::stamps_with_own_clock(&new)
        );
        let resolve = |store: &dyn Fn(Arc<str>) -> TenantPrefix| -> Vec<TenantPrefix> {
            PREFIXES.iter().map(|p| store(Arc::from(*p))).collect()
        };
        let old_prefixes = resolve(&|p| old.resolve_prefix(p));
        let new_prefixes = resolve(&|p| new.resolve_prefix(p));
        let mut reservations = Vec::new();
        for (n, op) in ops.iter().enumerate() {
            if let Op::Advance(by) = op {
                clock.advance(Duration::from_millis(*by));
            }
            let now = clock.now();
            let mut made = Vec::new();
            let expected = apply(&old, &old_prefixes, &new_prefixes, &reservations, Some(&mut made), op, now);
            let got = apply(&new, &new_prefixes, &old_prefixes, &reservations, None, op, now);
            reservations.extend(made);
            prop_assert_eq!(&got, &expected, "step {}: {:?}", n, op);
            prop_assert_eq!(new.len(), old.len(), "step {}: {:?}", n, op);
            for keys in &breaker_keys() {
                if new.breaker_quiet() && new.breaker_quiet_covers(keys) {
                    let (snapshot, _) = ready(new.breaker_read(keys, now)).unwrap();
                    prop_assert_eq!(snapshot, BreakerSnapshot::EMPTY, "step {}: quiet", n);
                }
            }
        }
    }
}
