//! Differential property test: random operation sequences driven into
//! `MemoryCache` (on a manual clock) and `RedisCache` on one real server must
//! get identical answers, operation by operation (the body is
//! `redis_support::differential`, which the cluster tests run too).

#![cfg(feature = "redis")]

mod redis_support;

use redis_support::RedisServer;

#[test]
fn memory_and_redis_give_identical_answers() {
    let Some(server) = RedisServer::start() else { return };
    redis_support::differential::memory_and_redis_agree(|| server.cache(), || server.flush(), 48);
}
