//! The skew property on a real Redis: callers with random clock offsets race
//! for one tenant's slots on a caller-stamped `RedisCache`; the admitted
//! stamps never hold more than the limit in any window, and admissions in any
//! window of real time stay within `decide::window::skew_bound`. Real time passes
//! for real here, so the window is short and the cases few.

use std::time::Duration;

use crate::support;
use crate::support::redis::{LiveRedis, wait};
use redstring::{Clock, SystemClock};
use testkit::redis::RedisServer;

const WINDOW: Duration = Duration::from_millis(300);
const MAX_AHEAD: Duration = Duration::from_millis(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_callers_stay_within_the_skew_bound_on_redis() {
    let Some(server) = RedisServer::start() else { return };
    let cache = server.cache();
    let mut runner = support::redis::runner(6);
    let handle = tokio::runtime::Handle::current();
    let result = runner.run(&support::skew::cases(WINDOW, 25), |case| {
        server.flush();
        let admitted = tokio::task::block_in_place(|| {
            handle.block_on(support::skew::run(&cache, "k", &case, WINDOW, MAX_AHEAD, async |gap| {
                wait(gap).await;
                SystemClock.now()
            }))
        });
        // The script reads TIME a little after the caller read its clock.
        support::skew::check(&case, &admitted, WINDOW, MAX_AHEAD, Duration::from_millis(5));
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
