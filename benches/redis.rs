//! The Redis path: limiter acquire and breaker operations over `RedisCache`
//! against a redis-server this bench starts on loopback TCP, beside a
//! reimplementation of the spec's three-call limiter (count → oldest → record)
//! over the same adapter.
//!
//! Besides criterion's latencies it prints, before measuring:
//! - round trips per operation, from the server's `INFO commandstats`: the
//!   commands clients sent (`EVALSHA`, `EVAL`, `SCRIPT`, and the plain
//!   `GET`/`SET`/`DEL` of the non-script operations) per operation, with the
//!   commands the scripts ran inside the server shown separately;
//! - how many of 50 racing tasks (rpm = 10) each limiter admits.
//!
//! Without `redis-server` on PATH it says so and measures nothing.

mod support;

use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use redstring::cache::redis::RedisCache;
use redstring::cache::{BreakerStore, HitWindow, KeyValue, LimiterStore, SlotRequest};
use redstring::decide::breaker::{BreakerCommand, BreakerKeys, BreakerParams, Origin};
use redstring::decide::window::SlotOutcome;
use redstring::{CircuitBreaker, Clock, Env, ManualClock, NoopObserver, RateLimiter, SystemClock, TenantId, Timestamp};
use support::{RPM, STEP, WINDOW, acquire_race, request, stamp};
use testkit::redis::nodes::Group;
use testkit::redis::{Listen, available_or_skip};

/// A redis-server on loopback TCP (testkit's launcher), killed on drop.
struct Server {
    _group: Group,
    port: u16,
}

impl Server {
    fn start() -> Option<Server> {
        if !available_or_skip() {
            return None;
        }
        let mut group = Group::new();
        let node = group.spawn("bench", &[], Listen::Tcp);
        let port = group.nodes[node].port;
        Some(Server { _group: group, port })
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// `INFO <section>` over a fresh blocking connection.
    fn info(&self, section: &str) -> Option<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        write!(s, "*2\r\n$4\r\nINFO\r\n${}\r\n{section}\r\n", section.len()).ok()?;
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        // The reply is `$<len>\r\n<body>\r\n`; read until the body is complete.
        loop {
            let n = s.read(&mut buf).ok()?;
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&out);
            if let Some((head, body)) = text.split_once("\r\n") {
                let len: usize = head.trim_start_matches('$').parse().ok()?;
                if body.len() >= len {
                    return Some(body[..len].to_owned());
                }
            }
        }
        None
    }

    /// Calls per command name.
    fn command_calls(&self) -> Vec<(String, u64)> {
        let info = self.info("commandstats").unwrap_or_default();
        info.lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
                Some((name.to_owned(), calls.parse().ok()?))
            })
            .collect()
    }
}

/// The spec's limiter: three calls, with a window in which another worker can
/// slip in between the count and the record.
async fn three_call_acquire(cache: &RedisCache, key: &str, now: Timestamp, limit: u32) -> bool {
    let since = now.saturating_sub(WINDOW);
    let count = cache.count_since(key, since).await.unwrap();
    if count >= u64::from(limit) {
        let _oldest = cache.oldest_since(key, since).await.unwrap();
        return false;
    }
    // The spec asks for the oldest hit on every call (for its wait estimate).
    let _oldest = cache.oldest_since(key, since).await.unwrap();
    cache.record_hit(key, now, WINDOW * 2).await.unwrap();
    true
}

/// Client commands and in-script commands per operation, over `n` runs of `op`.
fn round_trips<F>(server: &Server, rt: &tokio::runtime::Runtime, name: &str, n: u64, mut op: F)
where
    F: AsyncFnMut(u64),
{
    const CLIENT: &[&str] = &["evalsha", "eval", "script", "get", "set", "del", "mget"];
    let before = server.command_calls();
    rt.block_on(async {
        for i in 0..n {
            op(i).await;
        }
    });
    let after = server.command_calls();
    let delta = |name: &str| {
        let get = |v: &[(String, u64)]| v.iter().find(|(k, _)| k == name).map_or(0, |(_, c)| *c);
        get(&after) - get(&before)
    };
    let names: Vec<String> = after.iter().map(|(k, _)| k.clone()).filter(|k| k != "info").collect();
    let scripted = names.iter().any(|k| k == "evalsha" && delta(k) > 0);
    let (mut client, mut inner) = (0, 0);
    for k in &names {
        let d = delta(k);
        // With a script in play, GET/SET/DEL are the script's own calls.
        let from_client = if scripted {
            matches!(k.as_str(), "evalsha" | "eval" | "script")
        } else {
            CLIENT.contains(&k.as_str())
        };
        if from_client {
            client += d;
        } else {
            inner += d;
        }
    }
    println!(
        "round trips  {name:<34} {:>5.2} per op   ({:>5.2} commands inside scripts)",
        client as f64 / n as f64,
        inner as f64 / n as f64
    );
}

fn races(rt: &tokio::runtime::Runtime, server: &Server) {
    for round in 0..3 {
        let (ours, spec) = rt.block_on(async {
            let caches: Vec<Arc<RedisCache>> = (0..5)
                .map(|_| Arc::new(RedisCache::from_url(&server.url()).unwrap()))
                .collect();
            let now = SystemClock.now();
            let ours_key = format!("race-ours-{round}");
            let spec_key = format!("race-spec-{round}");
            let ours: Vec<_> = (0..50)
                .map(|i| {
                    let (c, key) = (caches[i % 5].clone(), ours_key.clone());
                    tokio::spawn(async move {
                        let r = SlotRequest {
                            limit: 10,
                            ..request(now)
                        };
                        matches!(c.acquire_slot(&key, r).await.unwrap(), SlotOutcome::Admitted { .. })
                    })
                })
                .collect();
            let spec: Vec<_> = (0..50)
                .map(|i| {
                    let (c, key) = (caches[i % 5].clone(), spec_key.clone());
                    tokio::spawn(async move { three_call_acquire(&c, &key, now, 10).await })
                })
                .collect();
            let (mut a, mut b) = (0, 0);
            for t in ours {
                a += usize::from(t.await.unwrap());
            }
            for t in spec {
                b += usize::from(t.await.unwrap());
            }
            (a, b)
        });
        println!(
            "race         50 tasks, 5 connections, rpm 10 -> acquire_slot admitted {ours}, three-call admitted {spec}"
        );
    }
}

fn bench(c: &mut Criterion) {
    let Some(server) = Server::start() else {
        eprintln!("!!! redis bench SKIPPED: could not start redis-server (is it on PATH?)");
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cache = rt.block_on(async { Arc::new(RedisCache::from_url(&server.url()).unwrap()) });
    let keys = BreakerKeys::new("bench");
    let params = BreakerParams {
        failure_threshold: 5,
        recovery_timeout: Duration::from_secs(60),
        max_recovery_timeout: Duration::from_secs(60),
        half_open_max_calls: 1,
        probe_lease: Duration::from_secs(60),
    };
    let t0 = SystemClock.now();
    let at = move |i: u64| stamp(t0, i);

    // Warm the script cache so the counts below are the steady state.
    rt.block_on(async {
        cache.acquire_slot("warm", request(t0)).await.unwrap();
        three_call_acquire(&cache, "warm", t0, RPM).await;
        cache
            .breaker_step(&keys, BreakerCommand::Allow, params, t0)
            .await
            .unwrap();
        cache.breaker_read(&keys, t0).await.unwrap();
        cache.increment("warm-n", None).await.unwrap();
    });
    let c2 = cache.clone();
    round_trips(&server, &rt, "acquire_slot (one script)", 1000, async |i| {
        c2.acquire_slot("rt-ours", request(at(i))).await.unwrap();
    });
    round_trips(&server, &rt, "spec three-call acquire", 1000, async |i| {
        three_call_acquire(&c2, "rt-spec", at(i), RPM).await;
    });
    round_trips(&server, &rt, "breaker_step Allow (closed)", 1000, async |i| {
        c2.breaker_step(&keys, BreakerCommand::Allow, params, at(i))
            .await
            .unwrap();
    });
    round_trips(&server, &rt, "breaker_step RecordSuccess", 1000, async |i| {
        c2.breaker_step(&keys, BreakerCommand::RecordSuccess(Origin::Untracked), params, at(i))
            .await
            .unwrap();
    });
    round_trips(&server, &rt, "breaker_read (state)", 1000, async |i| {
        c2.breaker_read(&keys, at(i)).await.unwrap();
    });
    round_trips(&server, &rt, "increment (TTL on creation)", 1000, async |_| {
        c2.increment("rt-n", Some(Duration::from_secs(60))).await.unwrap();
    });
    round_trips(&server, &rt, "get", 1000, async |_| {
        c2.get("rt-n").await.unwrap();
    });
    races(&rt, &server);

    let tenant = TenantId::from_u128(42);
    let clock = Arc::new(ManualClock::new(t0));
    let quiet = Env::default().with_observer(Arc::new(NoopObserver));
    let limiter = RateLimiter::builder(RPM)
        .window(WINDOW)
        .cache(cache.clone())
        .env(quiet.clone().with_clock(clock.clone()))
        .build()
        .unwrap();
    let mut g = c.benchmark_group("redis_acquire");
    g.bench_function("redstring_one_script", |b| {
        b.to_async(&rt).iter(|| {
            clock.advance(STEP);
            limiter.acquire(tenant)
        })
    });
    let spec_clock = ManualClock::new(t0);
    g.bench_function("spec_three_calls", |b| {
        b.to_async(&rt).iter(|| {
            spec_clock.advance(STEP);
            let now = spec_clock.now();
            let cache = &cache;
            async move { three_call_acquire(cache, "bench-spec", now, RPM).await }
        })
    });
    g.finish();

    let breaker = CircuitBreaker::builder()
        .cache(cache.clone())
        .env(quiet)
        .build()
        .unwrap();
    let mut g = c.benchmark_group("redis_breaker");
    g.bench_function("allow_request", |b| b.to_async(&rt).iter(|| breaker.allow_request()));
    g.bench_function("record_success", |b| b.to_async(&rt).iter(|| breaker.record_success()));
    g.bench_function("state", |b| b.to_async(&rt).iter(|| breaker.state()));
    g.finish();

    // Throughput: n tasks on one cache (one multiplexed connection), each on
    // its own tenant, acquiring as fast as the server answers.
    let mut g = c.benchmark_group("redis_acquire_concurrent");
    for tasks in [1u64, 8, 32] {
        g.throughput(Throughput::Elements(tasks));
        g.bench_with_input(BenchmarkId::from_parameter(tasks), &tasks, |b, &tasks| {
            b.iter_custom(|iters| acquire_race(&rt, &cache, tasks, iters, t0))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
