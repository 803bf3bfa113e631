//! The Cache compliance suite, unchanged, against `RedisCache` on a real
//! redis-server (real TTLs: the harness waits them out).

#![cfg(feature = "redis")]

mod redis_support;

use std::sync::Arc;
use std::time::Duration;

use redis_support::{RedisServer, wait};
use redstring::cache::redis::RedisCache;
use redstring::testing::{Harness, run_all};
use redstring::{Clock, SystemClock, Timestamp};

struct Redis {
    server: RedisServer,
}

impl Harness for Redis {
    type Cache = RedisCache;

    async fn cache(&self) -> Arc<RedisCache> {
        self.server.flush();
        Arc::new(self.server.cache())
    }

    async fn advance(&self, d: Duration) {
        wait(d).await;
    }

    fn now(&self) -> Timestamp {
        SystemClock.now()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cache_passes_the_compliance_suite() {
    let Some(server) = RedisServer::start() else { return };
    run_all(&Redis { server }).await;
}
