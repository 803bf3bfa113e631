//! The Cache compliance suite against `MemoryCache` on a manual clock.

use std::sync::Arc;
use std::time::Duration;

use redstring::testing::{Harness, run_all};
use redstring::{Clock, ManualClock, MemoryCache, TimeSource, Timestamp};

struct Memory {
    clock: ManualClock,
}

impl Harness for Memory {
    type Cache = MemoryCache;

    async fn cache(&self) -> Arc<MemoryCache> {
        Arc::new(MemoryCache::with_time_source(
            Arc::new(self.clock.clone()),
            TimeSource::Caller,
        ))
    }

    async fn advance(&self, d: Duration) {
        self.clock.advance(d);
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_cache_passes_the_compliance_suite() {
    run_all(&Memory {
        clock: ManualClock::at_fixed_epoch(),
    })
    .await;
}
