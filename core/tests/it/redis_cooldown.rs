//! Shared cooldowns on a real Redis: two workers on two connections share
//! a quota signal, and many tasks admitting while one writes a cooldown see
//! exactly what `machine::step` says — after the write lands (by the
//! store's clock) no admission succeeds until the cooldown ends.

use std::sync::Arc;
use std::time::Duration;

use crate::support;
use crate::support::cooldown::{rate_limited, worker};
use crate::support::redis::{LiveRedis, bounded};
use redstring::cache::BreakerStore;
use redstring::cache::redis::RedisCache;
use redstring::decide::breaker::{BreakerCommand, BreakerKeys, BreakerParams, Write};
use redstring::provider::LlmProviderExt;
use redstring::{Clock, Env, ManualClock, Permit, RecordingObserver, Refusal, SystemClock, TimeSource, Timestamp};
use testkit::redis::RedisServer;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn store_stamped(server: &RedisServer) -> RedisCache {
    RedisCache::builder()
        .time_source(TimeSource::Store)
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .build_from_url(&server.url())
        .expect("valid url")
}

/// Before shared cooldowns, worker B (its own process, its own connection)
/// called the server worker A had just been told to leave alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_seen_by_one_worker_stops_another_workers_next_call_through_redis() {
    let Some(server) = RedisServer::start() else { return };
    // Caller-stamped on a manual clock at the present, so the test moves time.
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let observer = Arc::new(RecordingObserver::new());
    let a = worker(Arc::new(server.cache()), &clock, &observer, 1, 0);
    let b = worker(Arc::new(server.cache()), &clock, &observer, 2, 0);
    a.server.push(rate_limited(&[("retry-after", "20")]));
    bounded(a.provider.extract::<String>("t", None)).await.unwrap_err();

    clock.advance(secs(5));
    let e = bounded(b.provider.extract::<String>("t", None)).await.unwrap_err();
    assert_eq!((e.kind(), e.retry_after()), ("cooldown", Some(secs(15))));
    assert_eq!(b.server.calls(), 0, "refused at admission");
    clock.advance(secs(15));
    assert_eq!(bounded(b.provider.extract::<String>("t", None)).await.unwrap(), "Ann");
    assert_eq!(b.server.calls(), 1);
}

/// A daily quota spent (langwatch/langwatch#7027: routing stayed on such a
/// provider for over four hours): its reset, hours away, cools the
/// deployment down on Redis for the whole fleet — not for
/// `max_server_delay`, after which every worker would come back to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_daily_quota_keeps_the_whole_fleet_away_until_its_reset_through_redis() {
    let Some(server) = RedisServer::start() else { return };
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let observer = Arc::new(RecordingObserver::new());
    let a = worker(Arc::new(server.cache()), &clock, &observer, 1, 0);
    let b = worker(Arc::new(server.cache()), &clock, &observer, 2, 0);
    a.server.push(rate_limited(&[("retry-after", "18000")]));
    let e = bounded(a.provider.extract::<String>("t", None)).await.unwrap_err();
    assert_eq!((e.kind(), e.retry_after()), ("quota_exhausted", Some(secs(18_000))));

    // Past max_server_delay (120 s), and four hours on.
    clock.advance(secs(121));
    let e = bounded(b.provider.extract::<String>("t", None)).await.unwrap_err();
    assert_eq!((e.kind(), e.retry_after()), ("cooldown", Some(secs(18_000 - 121))));
    clock.advance(secs(4 * 3_600 - 121));
    let e = bounded(b.provider.extract::<String>("t", None)).await.unwrap_err();
    assert_eq!((e.kind(), e.retry_after()), ("cooldown", Some(secs(3_600))));
    assert_eq!(b.server.calls(), 0, "refused at admission, every time");
    clock.advance(secs(3_600));
    assert_eq!(bounded(b.provider.extract::<String>("t", None)).await.unwrap(), "Ann");
}

/// On Redis as in memory: a later, shorter signal leaves the longer
/// cooldown in place (reported, not written), and a longer one extends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_signal_never_shortens_a_cooldown_on_redis_and_a_longer_one_extends_it() {
    let Some(server) = RedisServer::start() else { return };
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let observer = Arc::new(RecordingObserver::new());
    let breaker = redstring::CircuitBreaker::builder()
        .key_prefix("kg:circuit:cooldown-grows")
        .env(Env::default().with_clock(clock.clone()).with_observer(observer.clone()))
        .cache(Arc::new(server.cache()))
        .build()
        .unwrap();
    let at = clock.now();
    assert_eq!(
        bounded(breaker.cool_down(secs(30))).await.unwrap(),
        Some(at.saturating_add(secs(30)))
    );
    clock.advance(secs(1));
    assert_eq!(bounded(breaker.cool_down(secs(5))).await.unwrap(), None);
    assert!(matches!(
        observer.events().last(),
        Some(redstring::Event::BreakerCooldown { extended: false, until, .. }) if *until == at.saturating_add(secs(6))
    ));
    clock.advance(secs(10));
    match bounded(breaker.admit()).await {
        Permit::Refused {
            retry_after, reason, ..
        } => assert_eq!((retry_after, reason), (secs(19), Refusal::Cooldown)),
        other => panic!("{other:?}"),
    }
    let later = clock.now();
    assert_eq!(
        bounded(breaker.cool_down(secs(40))).await.unwrap(),
        Some(later.saturating_add(secs(40)))
    );
    assert!(matches!(
        observer.events().last(),
        Some(redstring::Event::BreakerCooldown { extended: true, .. })
    ));
}

/// 32 tasks admit in a loop while one writes a cooldown. Judged by the
/// store's clock, which stamped every step: every admission stamped after
/// the write is refused with exactly the rest of the cooldown until it ends,
/// every one before it or from its end on is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_admissions_never_pass_a_cooldown_once_it_is_written() {
    let Some(server) = RedisServer::start() else { return };
    let cache = Arc::new(store_stamped(&server));
    let keys = Arc::new(BreakerKeys::new("race-cooldown"));
    let params = BreakerParams {
        failure_threshold: 3,
        recovery_timeout: secs(30),
        max_recovery_timeout: secs(30),
        half_open_max_calls: 1,
        probe_lease: secs(30),
    };
    let cooldown = Duration::from_millis(150);
    let written = Arc::new(std::sync::OnceLock::<(Timestamp, Timestamp)>::new());
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (cache, keys, written) = (cache.clone(), keys.clone(), written.clone());
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            // Until this task has been admitted after the cooldown's end
            // (bounded, so a broken store cannot loop for ever).
            for _ in 0..20_000 {
                let step = bounded(cache.breaker_step(&keys, BreakerCommand::Allow, params, Timestamp::EPOCH))
                    .await
                    .unwrap();
                let permit = step.permit.expect("Allow answers");
                seen.push((step.at, permit));
                if let Some((_, until)) = written.get()
                    && step.at >= *until
                    && permit == Permit::Call
                {
                    break;
                }
                tokio::task::yield_now().await;
            }
            seen
        }));
    }
    // Let the admissions get going, then write the cooldown.
    support::redis::wait(Duration::from_millis(20)).await;
    let step = bounded(cache.breaker_step(
        &keys,
        BreakerCommand::CoolDown { duration: cooldown },
        params,
        Timestamp::EPOCH,
    ))
    .await
    .unwrap();
    let Write::Set(until) = step.writes.cooldown_until else {
        panic!("the first cooldown is written: {step:?}")
    };
    written.set((step.at, until)).unwrap();
    let (at, until) = (step.at, until);
    assert_eq!(until, at.saturating_add(cooldown));

    let (mut before, mut refused, mut after) = (0, 0, 0);
    for task in tasks {
        for (stamp, permit) in task.await.unwrap() {
            if stamp > at && stamp < until {
                assert_eq!(
                    permit,
                    Permit::Refused {
                        state: redstring::CircuitState::Closed,
                        retry_after: until.saturating_duration_since(stamp),
                        reason: Refusal::Cooldown,
                    },
                    "an admission at {stamp} inside the cooldown [{at}, {until})"
                );
                refused += 1;
            } else if stamp < at {
                assert_eq!(permit, Permit::Call, "before the write at {at}");
                before += 1;
            } else if stamp >= until {
                assert_eq!(permit, Permit::Call, "after the end at {until}");
                after += 1;
            }
        }
    }
    assert!(
        before > 0 && refused > 0 && after > 0,
        "the race covered all three phases: {before} before, {refused} refused, {after} after"
    );
}
