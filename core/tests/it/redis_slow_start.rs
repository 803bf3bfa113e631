//! Slow start on a real Redis: two workers, each on its own connection
//! with its own breakers, probe a recovered primary at once. The breaker
//! script closes the circuit once and stores the server's instant, and
//! every draw either worker makes ramps from it.

use std::sync::Arc;
use std::time::Duration;

use crate::slow_start::{race_and_ramp, worker};
use crate::support::redis::{LiveRedis, bounded, wait};
use redstring::{Env, ManualClock, SystemClock};
use testkit::redis::RedisServer;
use tokio::sync::Barrier;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_on_redis_ramp_from_the_one_close_the_script_stored() {
    let Some(server) = RedisServer::start() else { return };
    let clock = Arc::new(ManualClock::new(redstring::Clock::now(&SystemClock)));
    let env = Env::default().with_clock(clock.clone());
    let recovery = Duration::from_millis(200);
    let gate = Arc::new(Barrier::new(2));
    // An hour's window: every draw of the test falls at its floor.
    let window = Duration::from_secs(3600);
    let fleet = [
        worker(Arc::new(server.cache()), env.clone(), 1, &gate, recovery, window),
        worker(Arc::new(server.cache()), env.clone(), 2, &gate, recovery, window),
    ];
    bounded(fleet[0].breaker.record_failure()).await.unwrap();
    // The probe is due on whichever clock stamps the steps.
    clock.advance(recovery);
    wait(recovery + Duration::from_millis(100)).await;
    let (took, passed) = bounded(race_and_ramp(&fleet, 30)).await;
    assert!(took > 0 && passed > took, "took {took}, passed {passed}");
}
