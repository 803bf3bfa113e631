//! The retry loop's documented behaviours, on a manual clock: nothing really sleeps.

use std::error::Error as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use redstring::{
    Clock, Env, Event, ManualClock, RecordingObserver, Retry, RetryError, RetryPolicy, Retryable, SeededRandom,
    Timestamp,
};

#[derive(Debug, PartialEq, thiserror::Error)]
enum Failure {
    #[error("connection reset")]
    Reset,
    #[error("schema rejected the answer")]
    Malformed,
}

fn transient(e: &Failure) -> Retryable {
    (*e == Failure::Reset).into()
}

fn exact(max_retries: u32) -> RetryPolicy {
    RetryPolicy::builder()
        .max_retries(max_retries)
        .jitter(0.0)
        .build()
        .unwrap()
}

fn rig(policy: RetryPolicy) -> (Retry, Arc<ManualClock>, Arc<RecordingObserver>) {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let observer = Arc::new(RecordingObserver::new());
    let retry = Retry::new(policy).env(
        Env::default()
            .with_clock(clock.clone())
            .with_rng(Arc::new(SeededRandom::from_seed(7)))
            .with_observer(observer.clone()),
    );
    (retry, clock, observer)
}

/// An operation that fails with `Reset` `failures` times, then succeeds.
fn flaky(failures: u32, calls: &AtomicU32) -> impl FnMut() -> std::future::Ready<Result<&'static str, Failure>> + '_ {
    move || {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(if n < failures { Err(Failure::Reset) } else { Ok("done") })
    }
}

#[tokio::test]
async fn default_policy_makes_four_calls_sleeping_one_two_four() {
    let (retry, clock, _) = rig(exact(3));
    let calls = AtomicU32::new(0);
    let err = retry
        .run("extract", transient, flaky(u32::MAX, &calls))
        .await
        .unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    assert_eq!(clock.sleeps(), [1, 2, 4].map(Duration::from_secs));
    match err {
        RetryError::Exhausted(x) => {
            assert_eq!((x.attempts, x.max_retries), (4, 3));
            assert_eq!(x.to_string(), "Exhausted 3 retries for extract");
            assert_eq!(
                x.source().unwrap().to_string(),
                "connection reset",
                "the real error is the source"
            );
            assert_eq!(x.last, Failure::Reset);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_success_after_failures_returns_the_value() {
    let (retry, clock, observer) = rig(exact(3));
    let calls = AtomicU32::new(0);
    assert_eq!(retry.run("extract", transient, flaky(2, &calls)).await.unwrap(), "done");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(clock.slept(), Duration::from_secs(3));
    let scheduled: Vec<u32> = observer
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::RetryScheduled { attempt, .. } => Some(*attempt),
            _ => None,
        })
        .collect();
    assert_eq!(scheduled, [1, 2]);
}

#[tokio::test]
async fn a_permanent_error_comes_back_unwrapped_on_the_first_attempt_without_sleeping() {
    let (retry, clock, observer) = rig(exact(3));
    let calls = AtomicU32::new(0);
    let err = retry
        .run("extract", transient, || {
            calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Err::<(), _>(Failure::Malformed))
        })
        .await
        .unwrap_err();
    assert!(matches!(err, RetryError::Permanent(Failure::Malformed)));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(clock.sleeps().is_empty());
    assert!(observer.events().is_empty());
}

#[tokio::test]
async fn zero_retries_is_one_attempt_and_still_exhaustion() {
    let (retry, clock, _) = rig(exact(0));
    let calls = AtomicU32::new(0);
    let err = retry
        .run("call_the_model", transient, flaky(u32::MAX, &calls))
        .await
        .unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(clock.sleeps().is_empty());
    match err {
        RetryError::Exhausted(x) => {
            assert_eq!(x.attempts, 1);
            assert_eq!(x.to_string(), "Exhausted 0 retries for call_the_model");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_servers_retry_after_is_the_floor_of_the_wait() {
    let (retry, clock, _) = rig(exact(2));
    let calls = AtomicU32::new(0);
    let _ = retry
        .run(
            "extract",
            |_: &Failure| Retryable::After(Duration::from_millis(1_500)),
            flaky(u32::MAX, &calls),
        )
        .await;
    // Backoff says 1 s then 2 s; the server asked for 1.5 s: the larger wins.
    assert_eq!(clock.sleeps(), [Duration::from_millis(1_500), Duration::from_secs(2)]);
}

#[tokio::test]
async fn a_wait_that_would_overrun_the_deadline_is_not_slept() {
    let (retry, clock, _) = rig(exact(5));
    let calls = AtomicU32::new(0);
    let deadline = clock.now().saturating_add(Duration::from_millis(3_500));
    let err = retry
        .run_until(Some(deadline), "extract", transient, flaky(u32::MAX, &calls))
        .await
        .unwrap_err();
    // Sleeps 1 s and 2 s (3 s in all); the next 4 s would end at 7 s > 3.5 s.
    assert_eq!(clock.sleeps(), [1, 2].map(Duration::from_secs));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    match err {
        RetryError::Deadline(d) => {
            assert_eq!(d.attempts, 3);
            assert_eq!(d.needed, Duration::from_secs(4));
            assert_eq!(d.remaining, Duration::from_millis(500));
            assert_eq!(
                d.to_string(),
                "deadline for extract leaves 0.5s but the next retry needs 4s (after 3 attempts)"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn jittered_delays_are_reproducible_from_the_seed() {
    let schedule = |seed| async move {
        let clock = Arc::new(ManualClock::at_fixed_epoch());
        let retry = Retry::new(RetryPolicy::default()).env(
            Env::default()
                .with_clock(clock.clone())
                .with_rng(Arc::new(SeededRandom::from_seed(seed))),
        );
        let calls = AtomicU32::new(0);
        let _ = retry.run("x", transient, flaky(u32::MAX, &calls)).await;
        clock.sleeps()
    };
    let a = schedule(1).await;
    assert_eq!(a, schedule(1).await);
    assert_ne!(a, schedule(2).await);
    for (n, d) in a.iter().enumerate() {
        let base = RetryPolicy::default().base_delay(n as u32).as_secs_f64();
        assert!((d.as_secs_f64() - base).abs() <= base * 0.1 + 1e-9, "{d:?} vs {base}");
    }
}

#[tokio::test]
async fn exhaustion_is_reported_to_the_observer() {
    let (retry, _, observer) = rig(exact(1));
    let calls = AtomicU32::new(0);
    let _ = retry.run("extract", transient, flaky(u32::MAX, &calls)).await;
    assert_eq!(
        observer.events().last(),
        Some(&Event::RetryExhausted {
            operation: "extract".into(),
            attempts: 2,
            error: "connection reset".into()
        })
    );
}

/// A clock whose sleeps never finish, to catch the loop mid-sleep.
struct StuckClock;

impl Clock for StuckClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_secs(1)
    }
    fn sleep(&self, _: Duration) -> redstring::Sleep {
        Box::pin(std::future::pending())
    }
}

#[test]
fn dropping_the_future_mid_sleep_stops_the_loop() {
    let retry = Retry::new(exact(3)).env(Env::default().with_clock(Arc::new(StuckClock)));
    let calls = AtomicU32::new(0);
    let mut fut = Box::pin(retry.run("extract", transient, flaky(u32::MAX, &calls)));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    assert!(matches!(fut.as_mut().poll(&mut cx), Poll::Pending));
    drop(fut);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "cancelled while sleeping before the first retry"
    );
}
