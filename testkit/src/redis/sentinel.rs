//! A primary, one replica and one Sentinel watching them (quorum 1, the
//! primary judged down after 500 ms), started by the test that asks for one;
//! killed when dropped, or by the watchdog when the test binary exits (see
//! [`super::nodes`]).

use super::Listen;
use super::nodes::{Group, Node, wait_until};

/// The name the Sentinel monitors the primary under.
pub const MASTER_NAME: &str = "redstring";

/// Indexes into the group's nodes.
const PRIMARY: usize = 0;
const REPLICA: usize = 1;
const SENTINEL: usize = 2;

/// A running primary, replica and Sentinel.
pub struct SentinelGroup {
    group: Group,
}

impl SentinelGroup {
    /// A fresh group, or `None` (after a loud message) when there is no
    /// `redis-server` and it is not required. Returns once the replica is in
    /// sync and the Sentinel knows it.
    pub fn start() -> Option<SentinelGroup> {
        if !super::available_or_skip() {
            return None;
        }
        let mut group = Group::new();
        group.spawn("primary", &[], Listen::Tcp);
        let primary_port = group.nodes[PRIMARY].port.to_string();
        group.spawn(
            "replica",
            &["--replicaof".to_owned(), "127.0.0.1".to_owned(), primary_port.clone()],
            Listen::Tcp,
        );
        let config = format!(
            "sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 1\n\
             sentinel down-after-milliseconds {MASTER_NAME} 500\n\
             sentinel failover-timeout {MASTER_NAME} 5000\n"
        );
        group.spawn_with_config("sentinel", Some(&config), &["--sentinel".to_owned()], Listen::Tcp);
        let sentinel = SentinelGroup { group };
        wait_until("the replica is in sync", || {
            sentinel
                .node(REPLICA)
                .command(&["INFO", "replication"])
                .is_some_and(|r| r.contains("master_link_status:up"))
        });
        wait_until("the Sentinel knows the replica", || {
            sentinel
                .node(SENTINEL)
                .command(&["SENTINEL", "REPLICAS", MASTER_NAME])
                .is_some_and(|r| r.contains(&sentinel.node(REPLICA).port.to_string()))
        });
        Some(sentinel)
    }

    fn node(&self, i: usize) -> &Node {
        &self.group.nodes[i]
    }

    /// The Sentinel's URL.
    pub fn sentinel_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.node(SENTINEL).port)
    }

    /// Empties the primary (the replica follows).
    pub fn flush(&self) {
        let reply = self.node(PRIMARY).command(&["FLUSHALL"]).expect("primary reachable");
        assert!(reply.starts_with("+OK"), "FLUSHALL: {reply}");
    }

    /// Waits until the replica has processed every write the primary has
    /// taken so far: its replication offset reaches the primary's. (`WAIT`
    /// would not do from here: it waits only for the writes of its own
    /// connection — none, on a fresh one — and so returns at once, while a
    /// busy replica may still be applying the test's writes.)
    pub fn sync_replica(&self) {
        let offset = |node: usize, field: &str| -> Option<u64> {
            let info = self.node(node).command(&["INFO", "replication"])?;
            info.lines().find_map(|l| l.strip_prefix(field)?.trim().parse().ok())
        };
        let target = offset(PRIMARY, "master_repl_offset:").expect("primary reachable");
        wait_until("the replica has applied the primary's writes", || {
            offset(REPLICA, "slave_repl_offset:").is_some_and(|done| done >= target)
        });
    }

    /// Kills the primary (SIGKILL), as a crash would.
    pub fn kill_primary(&mut self) {
        self.group.nodes[PRIMARY].kill();
    }

    /// Whether the Sentinel names the replica as the primary now (the
    /// failover is complete).
    pub fn replica_promoted(&self) -> bool {
        let replica = self.node(REPLICA).port.to_string();
        self.node(SENTINEL)
            .command(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME])
            .is_some_and(|r| r.contains(&format!("${}\r\n{replica}\r\n", replica.len())))
            && self
                .node(REPLICA)
                .command(&["ROLE"])
                .is_some_and(|r| r.contains("master"))
    }

    /// Sends one command to the replica.
    pub fn replica_command(&self, args: &[&str]) -> Option<String> {
        self.node(REPLICA).command(args)
    }
}
