//! Acquire throughput on a Redis Cluster beside a single node: 32 tasks on one
//! `RedisCache`, each on its own tenant, acquiring as fast as the servers
//! answer — once over a single redis-server, once over a 3-primary cluster
//! (`--cluster-enabled yes` ×3 joined by `redis-cli --cluster create`), all
//! started by this bench on loopback TCP without persistence.
//!
//! A criterion iteration is one acquire per task, so the throughput criterion
//! reports is acquires per second. Without `redis-server` and `redis-cli` on
//! PATH it says so and measures nothing.

mod support;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use redstring::cache::LimiterStore;
use redstring::cache::redis::RedisCache;
use redstring::{Clock, SystemClock};
use support::{acquire_race, request};

const TASKS: u64 = 32;

/// Servers this bench started, killed on drop.
struct Servers {
    children: Vec<Child>,
    ports: Vec<u16>,
    _dir: tempfile::TempDir,
}

fn free_port() -> Option<u16> {
    Some(TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port())
}

fn answers_ping(port: u16) -> bool {
    Command::new("redis-cli")
        .args(["-p", &port.to_string(), "PING"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("PONG"))
}

impl Servers {
    fn start(n: usize, cluster: bool) -> Option<Servers> {
        let dir = tempfile::tempdir().ok()?;
        let mut servers = Servers {
            children: Vec::new(),
            ports: Vec::new(),
            _dir: dir,
        };
        for i in 0..n {
            let port = free_port()?;
            let node_dir = servers._dir.path().join(format!("node-{i}"));
            std::fs::create_dir_all(&node_dir).ok()?;
            let mut cmd = Command::new("redis-server");
            cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
                .args(["--appendonly", "no", "--dir"])
                .arg(&node_dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if cluster {
                cmd.args(["--cluster-enabled", "yes", "--cluster-port", &free_port()?.to_string()]);
            }
            servers.children.push(cmd.spawn().ok()?);
            servers.ports.push(port);
            (0..500).find(|_| {
                let up = answers_ping(port);
                if !up {
                    std::thread::sleep(Duration::from_millis(10));
                }
                up
            })?;
        }
        if cluster {
            let status = Command::new("redis-cli")
                .args(["--cluster", "create"])
                .args(servers.ports.iter().map(|p| format!("127.0.0.1:{p}")))
                .arg("--cluster-yes")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .ok()?;
            if !status.success() {
                return None;
            }
            for &port in &servers.ports {
                (0..600).find(|_| {
                    let ok = Command::new("redis-cli")
                        .args(["-p", &port.to_string(), "CLUSTER", "INFO"])
                        .output()
                        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"));
                    if !ok {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    ok
                })?;
            }
        }
        Some(servers)
    }

    fn urls(&self) -> Vec<String> {
        self.ports.iter().map(|p| format!("redis://127.0.0.1:{p}")).collect()
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn bench(c: &mut Criterion) {
    let (Some(single), Some(cluster)) = (Servers::start(1, false), Servers::start(3, true)) else {
        eprintln!("!!! redis_cluster bench SKIPPED: could not start redis-server / redis-cli (are they on PATH?)");
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let caches = rt.block_on(async {
        let single = RedisCache::from_url(&single.urls()[0]).unwrap();
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
