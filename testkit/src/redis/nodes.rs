//! Groups of local redis-server processes on loopback TCP — the nodes of a
//! Redis Cluster, or a primary, its replica and a Sentinel — each with a unix
//! socket in the group's temp dir for the test's own administration.
//!
//! A group can be shared by every test of a binary (a `LazyLock` started by
//! the first test that asks), and statics are never dropped, so each group
//! also starts a watchdog: a `sh` that waits for its stdin to close — which
//! happens when the test process exits, however it exits — then kills the
//! group's servers and removes its temp dir.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use super::{Listen, base_command, command_over, free_port};

/// One redis-server of a group.
pub struct Node {
    /// The client port (plain TCP, or TLS when the group uses TLS).
    pub port: u16,
    /// The administration socket.
    pub socket: PathBuf,
    child: Option<Child>,
}

impl Node {
    /// Sends one command over the administration socket; `None` if the node
    /// is not reachable.
    pub fn command(&self, args: &[&str]) -> Option<String> {
        command_over(&self.socket, None, args)
    }

    /// Kills the node (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A group of servers sharing a temp dir and a watchdog.
pub struct Group {
    /// The group's directory (each node has a subdirectory).
    pub dir: PathBuf,
    /// The servers, in the order they were spawned.
    pub nodes: Vec<Node>,
    watchdog: Mutex<ChildStdin>,
    _watchdog_child: Child,
}

impl Group {
    /// An empty group in a fresh temp dir (kept until the watchdog removes it).
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir").keep();
        let mut child = Command::new("sh")
            .arg("-c")
            // Each line read is a pid to kill at the end; EOF is the end.
            .arg("pids=; while read -r pid; do pids=\"$pids $pid\"; done; kill -9 $pids 2>/dev/null; rm -rf \"$0\"")
            .arg(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the watchdog shell");
        let stdin = child.stdin.take().expect("watchdog stdin");
        Group {
            dir,
            nodes: Vec::new(),
            watchdog: Mutex::new(stdin),
            _watchdog_child: child,
        }
    }

    /// Starts a redis-server with `args` (beyond [`base_command`]'s), its
    /// client port chosen free and given to `listen` (`Listen::Tcp` or
    /// `Listen::Tls`), waits until it answers `PING` and returns its index.
    /// A port taken between choosing and binding makes the server exit; then
    /// another is tried.
    pub fn spawn(&mut self, name: &str, args: &[String], listen: fn(u16) -> Listen) -> usize {
        self.spawn_with_config(name, None, args, listen)
    }

    /// [`spawn`](Self::spawn) with a config file (a Sentinel needs one it can
    /// rewrite).
    pub fn spawn_with_config(
        &mut self,
        name: &str,
        config: Option<&str>,
        args: &[String],
        listen: fn(u16) -> Listen,
    ) -> usize {
        let dir = self.dir.join(name);
        std::fs::create_dir_all(&dir).expect("node dir");
        let socket = dir.join("redis.sock");
        let config_file = config.map(|text| {
            let path = dir.join("redis.conf");
            std::fs::write(&path, text).expect("write the config file");
            path
        });
        for _ in 0..5 {
            let port = free_port();
            let mut child = base_command(config_file.as_deref(), listen(port), &socket, &dir)
                .args(args)
                .spawn()
                .expect("spawn redis-server");
            self.register(child.id());
            let mut node = Node {
                port,
                socket: socket.clone(),
                child: None,
            };
            for _ in 0..500 {
                if child.try_wait().ok().flatten().is_some() {
                    break;
                }
                if node.command(&["PING"]).is_some_and(|r| r.starts_with("+PONG")) {
                    node.child = Some(child);
                    self.nodes.push(node);
                    return self.nodes.len() - 1;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("redis-server {name} did not start on any of five ports");
    }

    fn register(&self, pid: u32) {
        let mut w = self.watchdog.lock().unwrap_or_else(|p| p.into_inner());
        writeln!(w, "{pid}").expect("tell the watchdog");
        w.flush().expect("tell the watchdog");
    }
}

impl Default for Group {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }
}

/// Polls `check` every 50 ms until it is true; panics with `what` after 30 s.
pub fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..600 {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting until {what}");
}

/// Runs `redis-cli` with `args`; panics with its output if it fails or
/// takes over a minute.
pub fn redis_cli(cwd: &Path, args: &[String]) -> String {
    let out = Command::new("timeout")
        .arg("60")
        .arg("redis-cli")
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "redis-cli {args:?}: {text}");
    text
}
