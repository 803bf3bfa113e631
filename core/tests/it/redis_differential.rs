//! Differential property test: random operation sequences driven into
//! `MemoryCache` (on a manual clock) and `RedisCache` on one real server must
//! get identical answers, operation by operation (the body is
//! `support::redis::differential`, which the cluster tests run too).

use crate::support;
use crate::support::redis::LiveRedis;
use testkit::redis::RedisServer;

#[test]
fn memory_and_redis_give_identical_answers() {
    let Some(server) = RedisServer::start() else { return };
    support::redis::differential::memory_and_redis_agree(|| server.cache(), || server.flush(), 48);
}
