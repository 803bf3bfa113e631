//! The Cache compliance suite, unchanged, against `RedisCache` on a real
//! redis-server (real TTLs: the harness waits them out).

use crate::support::redis::OnLive;
use redstring::testing::run_all;
use testkit::redis::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cache_passes_the_compliance_suite() {
    let Some(server) = RedisServer::start() else { return };
    run_all(&OnLive(server)).await;
}
