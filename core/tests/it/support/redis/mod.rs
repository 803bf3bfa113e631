//! A private `redis-server` per test: started on a unix socket in a temp dir,
//! polled until it answers `PING`, killed on drop, restartable on the same
//! socket. When `redis-server` is not on PATH the tests say so loudly and skip,
//! unless `REDSTRING_REQUIRE_REDIS=1` (as `.ci/run` sets), when they fail.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use redstring::Env;
use redstring::cache::redis::RedisCache;

#[cfg(feature = "redis-cluster")]
pub mod cluster;
pub mod differential;
#[cfg(any(feature = "redis-cluster", feature = "redis-sentinel"))]
pub mod nodes;
#[cfg(feature = "redis-sentinel")]
pub mod sentinel;
#[cfg(feature = "redis-tls")]
pub mod tls;

/// A running (or stopped, between `kill` and `restart`) redis-server.
pub struct RedisServer {
    dir: tempfile::TempDir,
    password: Option<String>,
    child: Option<Child>,
}

/// A free loopback port: free when chosen, so it may be taken by the time a
/// server binds it (`nodes::Group::spawn` and `tls::TlsServer::start` then
/// try another).
#[cfg(any(feature = "redis-cluster", feature = "redis-sentinel", feature = "redis-tls"))]
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a probe port");
    listener.local_addr().expect("probe address").port()
}

/// Whether `redis-server` is on PATH.
fn redis_available() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `true` when `redis-server` is on PATH; otherwise `false` after a loud
/// message, or a panic when `REDSTRING_REQUIRE_REDIS=1`.
pub fn available_or_skip() -> bool {
    if redis_available() {
        return true;
    }
    if std::env::var("REDSTRING_REQUIRE_REDIS").as_deref() == Ok("1") {
        panic!("REDSTRING_REQUIRE_REDIS=1 but redis-server is not on PATH");
    }
    eprintln!();
    eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
    eprintln!("!!! SKIPPING: redis-server is not on PATH; the Redis adapter is UNTESTED.");
    eprintln!("!!! Install it (apt-get install redis-server) or set REDSTRING_REQUIRE_REDIS=1.");
    eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
    false
}

impl RedisServer {
    /// A fresh server, or `None` (after a loud message) when there is no
    /// `redis-server` and it is not required.
    pub fn start() -> Option<Self> {
        Self::start_with(None)
    }

    /// A fresh server requiring `password`.
    pub fn start_with_password(password: &str) -> Option<Self> {
        Self::start_with(Some(password.to_owned()))
    }

    fn start_with(password: Option<String>) -> Option<Self> {
        if !available_or_skip() {
            return None;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let mut server = RedisServer {
            dir,
            password,
            child: None,
        };
        server.restart();
        Some(server)
    }

    /// The socket the server listens on.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    /// A URL for the server, with its password if it has one.
    pub fn url(&self) -> String {
        match &self.password {
            Some(p) => format!("unix://{}?pass={p}", self.socket().display()),
            None => format!("unix://{}", self.socket().display()),
        }
    }

    /// A new cache owning its own connection, with short timeouts, stamping
    /// with the caller's clock (what the compliance suite and the
    /// differential test judge at).
    pub fn cache(&self) -> RedisCache {
        RedisCache::builder()
            .time_source(redstring::TimeSource::Caller)
            .connect_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_millis(500))
            .build_from_url(&self.url())
            .expect("valid url")
    }

    /// Stops the server (SIGKILL), leaving nothing listening on the socket.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(self.socket());
    }

    /// Freezes the server (SIGSTOP): connections stay open but nothing answers,
    /// like a host that stopped responding.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("server running").id();
        let status = Command::new("kill")
            .arg(signal)
            .arg(pid.to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// Starts the server again on the same socket (empty: nothing is persisted)
    /// and waits until it answers `PING`.
    pub fn restart(&mut self) {
        self.kill();
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg("0")
            .arg("--unixsocket")
            .arg(self.socket())
            .arg("--unixsocketperm")
            .arg("700")
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(p) = &self.password {
            cmd.arg("--requirepass").arg(p);
        }
        self.child = Some(cmd.spawn().expect("spawn redis-server"));
        for _ in 0..500 {
            if self.command(&["PING"]).is_some_and(|r| r.starts_with("+PONG")) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server did not answer PING");
    }

    /// Sends one command over a fresh socket (authenticating first if needed)
    /// and returns the raw reply; `None` if the server is not reachable.
    pub fn command(&self, args: &[&str]) -> Option<String> {
        command_over(&self.socket(), self.password.as_deref(), args)
    }

    /// Empties the server.
    pub fn flush(&self) {
        let reply = self.command(&["FLUSHALL"]).expect("server reachable");
        assert!(reply.starts_with("+OK"), "FLUSHALL: {reply}");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A paused server would not die of SIGKILL any less, but resume it
            // so nothing is left stopped should kill fail.
            let pid = self.child.as_ref().map(|c| c.id().to_string()).unwrap_or_default();
            let _ = Command::new("kill").arg("-CONT").arg(pid).status();
        }
        self.kill();
    }
}

/// Waits `d` of real time without blocking the runtime's worker.
pub async fn wait(d: Duration) {
    tokio::task::spawn_blocking(move || std::thread::sleep(d))
        .await
        .expect("sleeping task");
}

/// Fails the test instead of hanging if `f` never finishes; the adapter's own
/// bounds are far inside this guard.
pub async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("a cache call hung past its timeout")
}

/// A two-thread runtime for a plain `#[test]` that drives a real server
/// through a property test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A proptest runner for `default_cases` cases (`PROPTEST_CASES` overrides),
/// persisting nothing: a failure prints its minimal input.
pub fn runner(default_cases: u32) -> proptest::test_runner::TestRunner {
    proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: super::proptest_cases(default_cases),
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    })
}

/// Sends one command to the server listening on the unix `socket`, over a
/// fresh connection (authenticating with `password` first, if any), and
/// returns the raw reply; `None` if the server is not reachable.
pub fn command_over(socket: &std::path::Path, password: Option<&str>, args: &[&str]) -> Option<String> {
    let mut stream = UnixStream::connect(socket).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut send = |args: &[&str]| -> Option<String> {
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        stream.write_all(req.as_bytes()).ok()?;
        let mut buf = vec![0u8; 1 << 16];
        let n = stream.read(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    if let Some(p) = password {
        send(&["AUTH", p])?;
    }
    send(args)
}

/// Races `tasks` acquires of one tenant (42) over `connections` limiters at
/// `rpm`, each on its own cache from `cache`, spread round-robin; returns
/// the admitted and limited counts and the limiters (for follow-up reads).
/// Any other error fails the test.
pub async fn race_one_tenant(
    cache: impl Fn() -> redstring::cache::redis::RedisCache,
    connections: usize,
    tasks: usize,
    rpm: u32,
) -> (
    u32,
    u32,
    Vec<std::sync::Arc<redstring::RateLimiter<redstring::cache::redis::RedisCache>>>,
) {
    use std::sync::Arc;
    let limiters: Vec<_> = (0..connections)
        .map(|_| {
            Arc::new(
                redstring::RateLimiter::builder(rpm)
                    .cache(Arc::new(cache()))
                    .env(Env::default().with_observer(Arc::new(redstring::NoopObserver)))
                    .build()
                    .unwrap(),
            )
        })
        .collect();
    let tenant = redstring::TenantId::from_u128(42);
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let limiter = limiters[i % limiters.len()].clone();
            tokio::spawn(async move { limiter.acquire(tenant).await })
        })
        .collect();
    let (mut admitted, mut limited) = (0, 0);
    for handle in handles {
        match handle.await.unwrap() {
            Ok(_) => admitted += 1,
            Err(redstring::AcquireError::Limited(_)) => limited += 1,
            Err(other) => panic!("unexpected error: {other:?}"),
        }
    }
    (admitted, limited, limiters)
}

/// A running Redis topology the tests talk to: a fresh `RedisCache` on it,
/// and a way to empty it.
pub trait LiveRedis: Send + Sync + 'static {
    /// A new cache connected to it.
    fn cache(&self) -> RedisCache;
    /// Removes every key.
    fn flush(&self);
}

impl LiveRedis for RedisServer {
    fn cache(&self) -> RedisCache {
        RedisServer::cache(self)
    }
    fn flush(&self) {
        RedisServer::flush(self)
    }
}

impl<T: LiveRedis> LiveRedis for &'static T {
    fn cache(&self) -> RedisCache {
        (**self).cache()
    }
    fn flush(&self) {
        (**self).flush()
    }
}

/// The compliance suite's harness over any live topology: each cache starts
/// from an empty server, and time is real (TTLs are waited out).
pub struct OnLive<T>(pub T);

impl<T: LiveRedis> redstring::testing::Harness for OnLive<T> {
    type Cache = RedisCache;

    async fn cache(&self) -> std::sync::Arc<RedisCache> {
        self.0.flush();
        std::sync::Arc::new(self.0.cache())
    }

    async fn advance(&self, d: Duration) {
        wait(d).await;
    }

    fn now(&self) -> redstring::Timestamp {
        use redstring::Clock as _;
        redstring::SystemClock.now()
    }
}

/// Four breakers sharing one circuit through caches `make` builds (the
/// probe-race fleet): threshold 2, a 30 s recovery, 3 probes per episode,
/// all on `clock`.
pub fn probe_fleet(
    make: impl Fn() -> RedisCache,
    clock: &std::sync::Arc<redstring::ManualClock>,
) -> Vec<std::sync::Arc<redstring::CircuitBreaker<RedisCache>>> {
    (0..4)
        .map(|_| {
            std::sync::Arc::new(
                redstring::CircuitBreaker::builder()
                    .failure_threshold(2)
                    .recovery_timeout(Duration::from_secs(30))
                    .half_open_max_calls(3)
                    .cache(std::sync::Arc::new(make()))
                    .env(
                        Env::default()
                            .with_clock(clock.clone())
                            .with_observer(std::sync::Arc::new(redstring::NoopObserver)),
                    )
                    .build()
                    .expect("a valid breaker"),
            )
        })
        .collect()
}

/// 40 tasks over `fleet` ask at once whether to call; how many were let
/// through.
pub async fn race_for_probes(fleet: &[std::sync::Arc<redstring::CircuitBreaker<RedisCache>>]) -> usize {
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let b = fleet[i % fleet.len()].clone();
            tokio::spawn(async move { b.allow_request().await })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await.expect("the task ran"));
    }
    admitted
}
