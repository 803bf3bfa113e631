//! Acquire throughput on a Redis Cluster beside a single node: 32 tasks on one
//! `RedisCache`, each on its own tenant, acquiring as fast as the servers
//! answer — once over a single redis-server, once over a 3-primary cluster
//! (`--cluster-enabled yes` ×3 joined by `redis-cli --cluster create`), all
//! started by this bench on loopback TCP without persistence.
//!
//! A criterion iteration is one acquire per task, so the throughput criterion
//! reports is acquires per second. Without `redis-server` and `redis-cli` on
//! PATH it says so and measures nothing.
//!
//! Then, on the same single node in the same run, `redis-benchmark` sends the
//! very `EVALSHA` an acquire sends (captured with `MONITOR`) from 32 clients
//! over 32 tenant keys, and the bench prints its requests per second: the
//! server's own ceiling for that script, beside the library's figure.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use redstring::cache::LimiterStore;
use redstring::cache::redis::RedisCache;
use redstring::{Clock, SystemClock};
use support::{acquire_race, request};
use testkit::redis::nodes::Group;
use testkit::redis::{Cluster, Listen, available_or_skip};

const TASKS: u64 = 32;

/// One redis-server on loopback TCP, killed when the group drops; its port.
fn single_node() -> Option<(Group, u16)> {
    if !available_or_skip() {
        return None;
    }
    let mut group = Group::new();
    let node = group.spawn("single", &[], Listen::Tcp);
    let port = group.nodes[node].port;
    Some((group, port))
}

fn bench(c: &mut Criterion) {
    let (Some((_single, port)), Some(cluster)) = (single_node(), Cluster::shared()) else {
        eprintln!("!!! redis_cluster bench SKIPPED: could not start redis-server / redis-cli (are they on PATH?)");
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let caches = rt.block_on(async {
        let single = RedisCache::from_url(&format!("redis://127.0.0.1:{port}")).unwrap();
        let cluster = RedisCache::builder().build_cluster(cluster.urls()).unwrap();
        [
            ("single_node", Arc::new(single)),
            ("cluster_3_primaries", Arc::new(cluster)),
        ]
    });
    let t0 = SystemClock.now();
    // Load the scripts (on every primary) and the cluster's slot map.
    rt.block_on(async {
        for (_, cache) in &caches {
            for t in 0..TASKS {
                cache.acquire_slot(&format!("tp-{t}"), request(t0)).await.unwrap();
            }
        }
    });
    let mut g = c.benchmark_group("redis_acquire_32_tasks");
    g.throughput(Throughput::Elements(TASKS));
    for (name, cache) in &caches {
        g.bench_with_input(BenchmarkId::from_parameter(name), cache, |b, cache| {
            b.iter_custom(|iters| acquire_race(&rt, cache, TASKS, iters, t0))
        });
    }
    g.finish();
    match redis_benchmark(&rt, &caches[0].1, port) {
        Some(line) => eprintln!("{line}"),
        None => eprintln!("!!! redis-benchmark row SKIPPED: could not capture the EVALSHA or run redis-benchmark"),
    }
}

/// The arguments of the first `EVALSHA` a `MONITOR` line shows.
fn evalsha_args(line: &str) -> Option<Vec<String>> {
    let start = line.find("\"EVALSHA\"").or_else(|| line.find("\"evalsha\""))?;
    let args: Vec<String> = line[start..]
        .split('"')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, a)| a.to_owned())
        .collect();
    (args.len() >= 3).then_some(args)
}

/// Captures the `EVALSHA` one acquire sends to the node at `port`, replays
/// it with `redis-benchmark` from 32 clients over 32 tenant keys, and says
/// how many requests per second the server answered.
fn redis_benchmark(rt: &tokio::runtime::Runtime, cache: &Arc<RedisCache>, port: u16) -> Option<String> {
    let port = port.to_string();
    let mut monitor = Command::new("redis-cli")
        .args(["-p", &port, "MONITOR"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut lines = BufReader::new(monitor.stdout.take()?).lines();
    // MONITOR answers OK once it is listening.
    lines.next()?.ok()?;
    rt.block_on(cache.acquire_slot("tp-0", request(SystemClock.now())))
        .ok()?;
    let args = lines.find_map(|line| evalsha_args(&line.ok()?));
    let _ = monitor.kill();
    let _ = monitor.wait();
    let mut args = args?;
    // EVALSHA sha numkeys key…: the key becomes one of 32 tenants' keys.
    args[3] = "tp-__rand_int__".to_owned();
    let out = Command::new("redis-benchmark")
        .args(["-p", &port, "-c", "32", "-n", "200000", "-r", "32", "-q"])
        .args(&args)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rps = text
        .split(['\r', '\n'])
        .rfind(|l| l.contains("requests per second"))?
        .split(':')
        .nth(1)?
        .split_whitespace()
        .next()?
        .to_owned();
    Some(format!(
        "redis-benchmark, the same script on the same single node (EVALSHA {}… {}): 32 clients, {rps} requests/s",
        args[1].get(..8).unwrap_or(&args[1]),
        args[2..].join(" "),
    ))
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
