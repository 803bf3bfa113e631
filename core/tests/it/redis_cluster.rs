//! `RedisCache` over a 3-primary Redis Cluster (one per test binary, shared
//! by these tests in turn): the compliance suite, the fleet races and the
//! differential test, unchanged; scripts loaded on every primary that needs
//! them; breaker keys spanning slots refused before anything is sent.

use std::sync::Arc;
use std::time::Duration;

use crate::support;
use crate::support::redis::{LiveRedis, OnLive, probe_fleet, race_for_probes};
use redstring::cache::redis::RedisCache;
use redstring::cache::{BreakerStore, KeyValue};
use redstring::decide::breaker::{BreakerCommand, BreakerKeys, BreakerParams};
use redstring::testing::run_all;
use redstring::{CacheError, CircuitState, Clock, ManualClock, SystemClock, TenantId};
use testkit::redis::Cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_cache_passes_the_compliance_suite() {
    let Some(cluster) = Cluster::shared() else { return };
    let _held = cluster.exclusive().await;
    run_all(&OnLive(cluster)).await;
}

#[test]
fn memory_and_a_cluster_give_identical_answers() {
    let Some(cluster) = Cluster::shared() else { return };
    let _held = cluster.exclusive_blocking();
    support::redis::differential::memory_and_redis_agree(|| cluster.cache(), || cluster.flush(), 48);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_tasks_over_five_cluster_connections_admit_exactly_rpm() {
    let Some(cluster) = Cluster::shared() else { return };
    let _held = cluster.exclusive().await;
    cluster.flush();
    let (admitted, limited, limiters) = support::redis::race_one_tenant(|| cluster.cache(), 5, 50, 10).await;
    assert_eq!((admitted, limited), (10, 40));
    assert_eq!(limiters[0].remaining(TenantId::from_u128(42)).await.unwrap(), 0);
    assert_eq!(limiters[3].remaining(TenantId::from_u128(43)).await.unwrap(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_of_breakers_on_a_cluster_admits_exactly_the_probe_limit() {
    let Some(cluster) = Cluster::shared() else { return };
    let _held = cluster.exclusive().await;
    cluster.flush();
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let breakers = probe_fleet(|| cluster.cache(), &clock);
    breakers[0].record_failure().await.unwrap();
    breakers[1].record_failure().await.unwrap();
    assert_eq!(breakers[2].state().await.unwrap(), CircuitState::Open);
    clock.advance(Duration::from_secs(30));
    assert_eq!(race_for_probes(&breakers).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_increments_on_many_slots_all_count() {
    let Some(cluster) = Cluster::shared() else { return };
    let _held = cluster.exclusive().await;
    cluster.flush();
    let caches: Vec<Arc<RedisCache>> = (0..4).map(|_| Arc::new(cluster.cache())).collect();
    // Keys on every primary: each counter is raced by 25 tasks.
    let keys = ["n-a", "n-b", "n-c", "n-d"];
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let (c, key) = (caches[i % caches.len()].clone(), keys[i % keys.len()]);
            tokio::spawn(async move { (key, c.increment(key, Some(Duration::from_secs(60))).await.unwrap()) })
        })
        .collect();
    let mut seen: Vec<(&str, i64)> = Vec::new();
    for task in tasks {
        seen.push(task.await.unwrap());
    }
    for key in keys {
        let mut counts: Vec<i64> = seen.iter().filter(|(k, _)| *k == key).map(|(_, n)| *n).collect();
        counts.sort_unstable();
        assert_eq!(counts, (1..=25).collect::<Vec<i64>>(), "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scripts_are_loaded_on_each_primary_that_needs_them() {
    let Some(cluster) = Cluster::shared() else { return };
    let _held = cluster.exclusive().await;
    cluster.flush();
    // No node knows a script.
    cluster.command_all(&["SCRIPT", "FLUSH"]);
    let cache = cluster.cache();
    // Tenants on every primary, so every primary answers NOSCRIPT once.
    for n in 0..30 {
        let key = format!("w-{n}");
        cache.set(&key, "1", None).await.unwrap();
        assert_eq!(cache.increment(&key, None).await.unwrap(), 2);
    }
    let cached = cluster.command_all(&["INFO", "memory"]);
    for (node, info) in cached.iter().enumerate() {
        let scripts: u64 = info
            .lines()
            .find_map(|l| l.strip_prefix("number_of_cached_scripts:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("INFO memory lists cached scripts");
        assert!(scripts >= 1, "node {node} got the increment script");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn breaker_keys_spanning_slots_are_refused_before_sending() {
    let Some(cluster) = Cluster::shared() else { return };
    let _held = cluster.exclusive().await;
    cluster.flush();
    let cache = cluster.cache();
    let keys = BreakerKeys {
        state: "br-state".to_owned(),
        failures: "br-failures".to_owned(),
        opened_at: "br-opened".to_owned(),
        probes: "br-probes".to_owned(),
        cooldown_until: "br-cooldown".to_owned(),
        openings: "br-openings".to_owned(),
        closed_at: "br-closed".to_owned(),
    };
    let params = BreakerParams {
        failure_threshold: 1,
        recovery_timeout: Duration::from_secs(30),
        max_recovery_timeout: Duration::from_secs(30),
        half_open_max_calls: 1,
        probe_lease: Duration::from_secs(10),
    };
    let now = SystemClock.now();
    let step = cache.breaker_step(&keys, BreakerCommand::Reset, params, now).await;
    let read = cache.breaker_read(&keys, now).await;
    for (op, result) in [("breaker_step", step.map(|_| ())), ("breaker_read", read.map(|_| ()))] {
        match result {
            Err(CacheError::Protocol { operation, detail }) => {
                assert_eq!(operation, op);
                assert!(detail.contains("different cluster slots"), "{detail}");
            }
            other => panic!("{op}: {other:?}"),
        }
    }
    // Nothing was written.
    assert_eq!(cache.get("br-state").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_cluster_configurations_are_typed_errors() {
    let no_nodes: [&str; 0] = [];
    let e = RedisCache::builder().build_cluster(no_nodes).unwrap_err();
    assert_eq!(e.field, "nodes");
    let e = RedisCache::builder()
        .build_cluster(["unix:///tmp/redis.sock"])
        .unwrap_err();
    assert!(e.expected.contains("TCP"), "{e}");
    let e = RedisCache::builder()
        .build_cluster(["redis://:hunter2@127.0.0.1:1", "redis://:other@127.0.0.1:2"])
        .unwrap_err();
    assert_eq!(e.field, "nodes");
    assert!(!e.to_string().contains("hunter2"), "{e}");
    let e = RedisCache::builder().build_cluster(["bogus://:hunter2@x"]).unwrap_err();
    assert!(!e.to_string().contains("hunter2"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_is_unavailable_within_the_timeout() {
    let port = testkit::redis::free_port();
    let cache = RedisCache::builder()
        .connect_timeout(Duration::from_millis(200))
        .response_timeout(Duration::from_millis(200))
        .build_cluster([format!("redis://127.0.0.1:{port}")])
        .unwrap();
    let e = support::redis::bounded(cache.get("k")).await.unwrap_err();
    assert!(matches!(e, CacheError::Unavailable { .. }), "{e:?}");
}
