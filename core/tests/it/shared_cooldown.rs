//! Quota signals shared by the fleet, on one `MemoryCache` and a manual
//! clock: a 429 with `Retry-After`, or an exhausted `x-ratelimit-*` limit,
//! seen by one worker's call stops every other worker's next call at
//! admission, with no request to the server, until the reset.

use std::sync::Arc;
use std::time::Duration;

use crate::support::cooldown::{PREFIX, Worker, ok, rate_limited, worker};
use redstring::cache::KeyValue;
use redstring::decide::breaker::BreakerKeys;
use redstring::provider::{ExtractError, LlmProviderExt};
use redstring::{CircuitState, Event, ManualClock, MemoryCache, RecordingObserver, Refusal};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

struct Fleet {
    clock: Arc<ManualClock>,
    observer: Arc<RecordingObserver>,
    cache: Arc<MemoryCache>,
    a: Worker<MemoryCache>,
    b: Worker<MemoryCache>,
}

fn fleet(b_cooldown_waits: u32) -> Fleet {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let observer = Arc::new(RecordingObserver::new());
    let cache = Arc::new(MemoryCache::new(clock.clone()));
    let a = worker(cache.clone(), &clock, &observer, 1, 1);
    let b = worker(cache.clone(), &clock, &observer, 2, b_cooldown_waits);
    Fleet {
        clock,
        observer,
        cache,
        a,
        b,
    }
}

fn cooldowns(observer: &RecordingObserver) -> Vec<Duration> {
    observer
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::BreakerCooldown { duration, .. } => Some(*duration),
            _ => None,
        })
        .collect()
}

/// Before shared cooldowns, worker B's next call went to the server A had
/// just been told to leave alone for 20 s.
#[tokio::test]
async fn a_429_with_retry_after_seen_by_one_worker_stops_the_next_call_of_another() {
    let f = fleet(0);
    f.a.server.push(rate_limited(&[("retry-after", "20")]));
    let e = f.a.provider.extract::<String>("t", None).await.unwrap_err();
    assert_eq!(e.kind(), "retry_exhausted", "A's own call fails as before");
    assert_eq!(cooldowns(&f.observer), [secs(20)]);

    f.clock.advance(secs(5));
    let e = f.b.provider.extract::<String>("t", None).await.unwrap_err();
    assert_eq!(e.kind(), "cooldown");
    let ExtractError::CircuitOpen(refusal) = &e else {
        panic!("{e:?}")
    };
    assert_eq!((refusal.reason, refusal.retry_after), (Refusal::Cooldown, secs(15)));
    assert_eq!(
        e.to_string(),
        "openai-compatible/qwen3 is cooling down after a quota signal; calls resume in 15.00s"
    );
    assert_eq!(
        f.b.server.calls(),
        0,
        "refused at admission: nothing reached the server"
    );
    assert!(
        f.observer.events().iter().any(|e| matches!(
            e,
            Event::BreakerCooldownRefused { retry_after, state: CircuitState::Closed, .. } if *retry_after == secs(15)
        )),
        "the refusal is reported as a cooldown's"
    );

    f.clock.advance(secs(15));
    assert_eq!(f.b.provider.extract::<String>("t", None).await.unwrap(), "Ann");
    assert_eq!(f.b.server.calls(), 1, "admitted from the reset on");
}

#[tokio::test]
async fn a_refused_call_waits_the_cooldown_out_when_it_fits_its_deadline() {
    let f = fleet(1);
    f.a.server.push(rate_limited(&[("retry-after-ms", "7500")]));
    f.a.provider.extract::<String>("t", None).await.unwrap_err();
    assert_eq!(f.b.provider.extract::<String>("t", None).await.unwrap(), "Ann");
    assert_eq!(
        f.clock.sleeps(),
        [Duration::from_millis(7500)],
        "slept exactly the rest"
    );
    assert!(
        f.observer
            .events()
            .iter()
            .any(|e| matches!(e, Event::CooldownWait { wait, waits: 1, .. } if *wait == Duration::from_millis(7500)))
    );
    assert_eq!(f.b.server.calls(), 1);
}

#[tokio::test]
async fn an_exhausted_limit_on_a_success_resetting_past_the_cap_cools_down_until_its_reset() {
    let f = fleet(1);
    f.a.server.push(ok(&[
        ("x-ratelimit-remaining-requests", "0"),
        ("x-ratelimit-reset-requests", "6m0s"),
        ("x-ratelimit-remaining-tokens", "149984"),
        ("x-ratelimit-reset-tokens", "20ms"),
    ]));
    let answer = f.a.provider.extract_with_model::<String>("t", None).await.unwrap();
    assert_eq!(answer.value, "Ann", "the answer itself is kept");
    assert_eq!(
        answer.quota.map(|q| q.wait),
        Some(secs(360)),
        "the signal travels with it"
    );
    // Past max_server_delay (120 s) the quota is spent until its reset.
    assert_eq!(cooldowns(&f.observer), [secs(360)], "the whole reset");

    // Longer than any wait a call sleeps: refused at once, without sleeping.
    let e = f.b.provider.extract::<String>("t", None).await.unwrap_err();
    assert_eq!((e.kind(), e.retry_after()), ("cooldown", Some(secs(360))));
    assert!(f.clock.sleeps().is_empty());
    assert_eq!(f.b.server.calls(), 0);
}

#[tokio::test]
async fn a_cooldown_neither_opens_the_circuit_nor_counts_as_a_failure() {
    let f = fleet(0);
    let keys = BreakerKeys::new(PREFIX);
    f.a.server.push(rate_limited(&[("retry-after", "30")]));
    f.a.provider.extract::<String>("t", None).await.unwrap_err();
    assert_eq!(
        f.cache.get(&keys.failures).await.unwrap().as_deref(),
        Some("1"),
        "A's failed call counts once, as before"
    );
    for _ in 0..5 {
        f.b.provider.extract::<String>("t", None).await.unwrap_err();
    }
    assert_eq!(f.cache.get(&keys.failures).await.unwrap().as_deref(), Some("1"));
    assert_eq!(f.b.breaker.state().await.unwrap(), CircuitState::Closed);
    assert!(
        !f.observer
            .events()
            .iter()
            .any(|e| matches!(e, Event::BreakerRejected { .. }))
    );
}

#[tokio::test]
async fn a_shorter_signal_never_shortens_the_fleets_cooldown() {
    let f = fleet(0);
    f.a.server.push(rate_limited(&[("retry-after", "30")]));
    f.a.provider.extract::<String>("t", None).await.unwrap_err();
    f.clock.advance(secs(30));
    f.a.server.push(rate_limited(&[("retry-after", "40")]));
    f.a.provider.extract::<String>("t", None).await.unwrap_err();
    assert_eq!(
        f.b.breaker.cool_down(secs(5)).await.unwrap(),
        None,
        "40 s already in force"
    );
    f.clock.advance(secs(39));
    let e = f.b.provider.extract::<String>("t", None).await.unwrap_err();
    assert_eq!(e.retry_after(), Some(secs(1)));
}
