//! A model server goes down and comes back; watch the breaker, limiter and
//! retry loop handle it, on a manual clock so the minutes pass instantly.
//!
//! ```text
//! cargo run -p redstring --example breaker_recovery
//! ```
//!
//! The "server" is a function that fails while the outage lasts. Each
//! extraction runs the documented sequence: breaker → limiter → retry → report,
//! with the breaker's answer kept as a `Permit` so the call reports exactly
//! its own admission — and hands it back if the limiter refuses, so a
//! half-open probe is never left hanging.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redstring::{
    CircuitBreaker, CircuitState, Clock, Env, Event, ManualClock, Observer, Permit, RateLimiter, Retry, RetryError,
    RetryPolicy, Retryable, SeededRandom, TenantId, Timestamp,
};

/// Prints each event with the simulated time since the start.
struct Printer {
    start: Timestamp,
}

impl Observer for Printer {
    fn on_event(&self, event: &Event) {
        let line = match event {
            Event::BreakerTransition { from, to, at, .. } => {
                format!(
                    "{:>7.1}s  breaker {from:?} -> {to:?}",
                    at.saturating_duration_since(self.start).as_secs_f64()
                )
            }
            Event::RetryScheduled {
                attempt, delay, error, ..
            } => {
                format!(
                    "          attempt {attempt} failed ({error}); retrying in {:.2}s",
                    delay.as_secs_f64()
                )
            }
            Event::RetryExhausted { attempts, .. } => format!("          gave up after {attempts} attempts"),
            _ => return,
        };
        println!("{line}");
    }
}

#[derive(Debug, thiserror::Error)]
#[error("connection refused")]
struct Refused;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let clock = Arc::new(ManualClock::at_fixed_epoch());
    let start = clock.now();
    let env = Env::default()
        .with_clock(clock.clone())
        .with_rng(Arc::new(SeededRandom::from_seed(1)))
        .with_observer(Arc::new(Printer { start }));
    let breaker = CircuitBreaker::builder()
        .failure_threshold(3)
        .recovery_timeout(Duration::from_secs(30))
        .env(env.clone())
        .build()?;
    let limiter = RateLimiter::builder(60).env(env.clone()).build()?;
    let retry = Retry::new(RetryPolicy::builder().max_retries(2).build()?).env(env);
    let tenant = TenantId::from_u128(1);

    // The server is down from t = 0 s until t = 45 s.
    let server_calls = AtomicU32::new(0);
    let server = || {
        server_calls.fetch_add(1, Ordering::SeqCst);
        let up = clock.now().saturating_duration_since(start) >= Duration::from_secs(45);
        std::future::ready(if up { Ok("extracted") } else { Err(Refused) })
    };

    let elapsed = || clock.now().saturating_duration_since(start).as_secs_f64();
    for n in 1..=12 {
        let permit = breaker.admit().await;
        if let Permit::Refused { retry_after, .. } = permit {
            println!(
                "{:>7.1}s  extraction {n}: circuit open, retry in {:.0}s",
                elapsed(),
                retry_after.as_secs_f64()
            );
        } else if let Err(refused) = limiter.acquire(tenant).await {
            breaker.release(&permit).await?;
            println!("{:>7.1}s  extraction {n}: {refused}", elapsed());
        } else {
            match retry.run("extract", |_: &Refused| Retryable::Yes, server).await {
                Ok(value) => {
                    breaker.record_success_for(&permit).await?;
                    println!("{:>7.1}s  extraction {n}: {value}", elapsed());
                }
                Err(RetryError::Exhausted(_)) => {
                    breaker.record_failure_for(&permit).await?;
                    println!("{:>7.1}s  extraction {n}: failed", elapsed());
                }
                Err(other) => return Err(other.into_last().into()),
            }
        }
        clock.advance(Duration::from_secs(5));
    }

    println!(
        "\nserver saw {} calls for 12 extractions; breaker ends {:?}",
        server_calls.load(Ordering::SeqCst),
        breaker.state().await?
    );
    assert_eq!(breaker.state().await?, CircuitState::Closed);
    Ok(())
}
