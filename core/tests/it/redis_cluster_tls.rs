//! The differential test against a 3-primary Redis Cluster whose nodes (and
//! cluster bus) speak only TLS, through `rediss://` node URLs and a private CA.

use crate::support;
use crate::support::redis::LiveRedis;
use testkit::redis::Cluster;

#[test]
fn memory_and_a_tls_cluster_give_identical_answers() {
    let Some(cluster) = Cluster::shared_tls() else { return };
    let _held = cluster.exclusive_blocking();
    support::redis::differential::memory_and_redis_agree(|| cluster.cache(), || cluster.flush(), 48);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_rejects_a_plain_client_and_an_untrusting_one() {
    use redstring::CacheError;
    use redstring::cache::KeyValue;
    use std::time::Duration;
    let Some(cluster) = Cluster::shared_tls() else { return };
    let plain: Vec<String> = cluster
        .urls()
        .iter()
        .map(|u| u.replacen("rediss://", "redis://", 1))
        .collect();
    let quick = || {
        redstring::cache::redis::RedisCache::builder()
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(300))
    };
    let cache = quick().build_cluster(&plain).unwrap();
    let e = support::redis::bounded(cache.get("k")).await.unwrap_err();
    assert!(matches!(e, CacheError::Unavailable { .. }), "{e:?}");
    // Without the CA, the platform's roots do not trust the test CA.
    let cache = quick().build_cluster(cluster.urls()).unwrap();
    let e = support::redis::bounded(cache.get("k")).await.unwrap_err();
    assert!(matches!(e, CacheError::Unavailable { .. }), "{e:?}");
}
