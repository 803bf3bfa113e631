//! Private `redis-server` processes for tests, each in its own temp dir with
//! a unix socket for the test's own administration (readiness, `FLUSHALL`):
//!
//! - [`RedisServer`]: one server on a unix socket only, killed on drop,
//!   restartable on the same socket, pausable (SIGSTOP).
//! - [`TlsServer`]: a TLS-only server on a loopback port, with a CA and
//!   certificates made by the `openssl` CLI ([`Pki`]).
//! - [`Cluster`]: three primaries joined by `redis-cli --cluster create`,
//!   plain or TLS, one per test binary.
//! - [`SentinelGroup`]: a primary, a replica and a Sentinel watching them.
//!
//! Every server starts from [`base_command`]. When `redis-server` (or, for
//! TLS, `openssl`) is not on PATH the launchers say so loudly and return
//! `None`, so the test skips — unless `REDSTRING_REQUIRE_REDIS=1` (as
//! `.ci/run` sets), when they panic.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub mod cluster;
pub mod nodes;
pub mod sentinel;
pub mod tls;

pub use cluster::Cluster;
pub use nodes::wait_until;
pub use sentinel::SentinelGroup;
pub use tls::{ClientAuth, Pki, TlsServer, pki_only};

/// Where a server listens for clients, besides its administration socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listen {
    /// Nowhere else (`--port 0`).
    SocketOnly,
    /// Plain TCP on this loopback port.
    Tcp(u16),
    /// TLS on this loopback port, and no plain TCP.
    Tls(u16),
}

/// `redis-server` with the arguments every server here shares: `config`
/// first (redis-server reads a config file only as its first argument; a
/// Sentinel needs one it can rewrite), the client port `listen` says on
/// 127.0.0.1, no persistence, the administration `socket` (mode 700), the
/// working directory `dir`, and output discarded. Callers add the rest
/// (TLS files, cluster or replica settings, a password).
pub fn base_command(config: Option<&Path>, listen: Listen, socket: &Path, dir: &Path) -> Command {
    let mut cmd = Command::new("redis-server");
    cmd.args(config);
    match listen {
        Listen::SocketOnly => cmd.args(["--port", "0"]),
        Listen::Tcp(port) => cmd.arg("--port").arg(port.to_string()),
        Listen::Tls(port) => cmd.args(["--port", "0", "--tls-port"]).arg(port.to_string()),
    };
    cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--unixsocket")
        .arg(socket)
        .args(["--unixsocketperm", "700", "--dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

/// A free loopback port: free when chosen, so it may be taken by the time a
/// server binds it (the launchers then try another).
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

/// A running (or stopped, between `kill` and `restart`) redis-server on a
/// unix socket in its own temp dir.
pub struct RedisServer {
    dir: tempfile::TempDir,
    password: Option<String>,
    child: Option<Child>,
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
        let mut cmd = base_command(None, Listen::SocketOnly, &self.socket(), self.dir.path());
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

/// Sends one command to the server listening on the unix `socket`, over a
/// fresh connection (authenticating with `password` first, if any), and
/// returns the raw reply; `None` if the server is not reachable.
pub fn command_over(socket: &Path, password: Option<&str>, args: &[&str]) -> Option<String> {
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
