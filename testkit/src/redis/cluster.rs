//! A 3-primary Redis Cluster (`redis-server --cluster-enabled yes` ×3, joined
//! by `redis-cli --cluster create … --cluster-yes`), plain or over TLS,
//! started once per test binary by the first test that asks and torn down
//! when the binary exits (see [`super::nodes`]). Tests sharing it take
//! [`Cluster::exclusive`] so that one test's `FLUSHALL` never lands in
//! another's middle.

use std::path::PathBuf;
use std::sync::LazyLock;

use super::Listen;
use super::nodes::{Group, redis_cli, wait_until};
use super::tls::{Pki, pki_only};

/// A running cluster.
pub struct Cluster {
    group: Group,
    pki: Option<(tempfile::TempDir, Pki)>,
    lock: tokio::sync::Mutex<()>,
}

static PLAIN: LazyLock<Option<Cluster>> = LazyLock::new(|| Cluster::start(false));
static TLS: LazyLock<Option<Cluster>> = LazyLock::new(|| Cluster::start(true));

impl Cluster {
    /// The binary's plain-TCP cluster, or `None` (after a loud message) when
    /// there is no `redis-server` and it is not required.
    pub fn shared() -> Option<&'static Cluster> {
        PLAIN.as_ref()
    }

    /// The binary's TLS cluster (nodes and the cluster bus over TLS; clients
    /// need not present a certificate), or `None` as [`shared`](Self::shared).
    pub fn shared_tls() -> Option<&'static Cluster> {
        TLS.as_ref()
    }

    fn start(tls: bool) -> Option<Cluster> {
        if !super::available_or_skip() {
            return None;
        }
        let pki = if tls { Some(pki_only()?) } else { None };
        let mut group = Group::new();
        for i in 0..3 {
            let mut args: Vec<String> = [
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                "2000",
                "--cluster-config-file",
            ]
            .map(str::to_owned)
            .to_vec();
            args.push(group.dir.join(format!("nodes-{i}.conf")).display().to_string());
            args.push("--cluster-port".to_owned());
            args.push(super::free_port().to_string());
            if let Some((_, pki)) = &pki {
                for (flag, value) in [
                    ("--tls-cert-file", pki.server_cert()),
                    ("--tls-key-file", pki.server_key()),
                    ("--tls-ca-cert-file", pki.ca()),
                    // The cluster bus authenticates nodes to each other:
                    // a node dials out with a client certificate.
                    ("--tls-client-cert-file", pki.client_cert()),
                    ("--tls-client-key-file", pki.client_key()),
                ] {
                    args.push(flag.to_owned());
                    args.push(value.display().to_string());
                }
                args.extend(["--tls-auth-clients", "no", "--tls-cluster", "yes"].map(str::to_owned));
            }
            group.spawn(&format!("node-{i}"), &args, if tls { Listen::Tls } else { Listen::Tcp });
        }
        let mut create: Vec<String> = vec!["--cluster".to_owned(), "create".to_owned()];
        create.extend(group.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        create.push("--cluster-yes".to_owned());
        if let Some((_, pki)) = &pki {
            create.push("--tls".to_owned());
            create.push("--cacert".to_owned());
            create.push(pki.ca().display().to_string());
        }
        redis_cli(&group.dir, &create);
        for node in &group.nodes {
            wait_until("every node sees the cluster ok", || {
                node.command(&["CLUSTER", "INFO"])
                    .is_some_and(|r| r.contains("cluster_state:ok"))
            });
        }
        Some(Cluster {
            group,
            pki,
            lock: tokio::sync::Mutex::new(()),
        })
    }

    /// Holds the cluster for one async test; released on drop. (A test that
    /// failed while holding it leaves nothing the next test's flush does
    /// not clear.)
    pub async fn exclusive(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.lock.lock().await
    }

    /// [`exclusive`](Self::exclusive) for a test outside any runtime.
    pub fn exclusive_blocking(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.lock.blocking_lock()
    }

    /// The nodes' URLs (`rediss://` when the cluster uses TLS).
    pub fn urls(&self) -> Vec<String> {
        let scheme = if self.pki.is_some() { "rediss" } else { "redis" };
        self.group
            .nodes
            .iter()
            .map(|n| format!("{scheme}://127.0.0.1:{}", n.port))
            .collect()
    }

    /// The CA clients must trust, when the cluster uses TLS.
    pub fn ca(&self) -> Option<PathBuf> {
        self.pki.as_ref().map(|(_, pki)| pki.ca())
    }

    /// Empties every primary.
    pub fn flush(&self) {
        for node in &self.group.nodes {
            let reply = node.command(&["FLUSHALL"]).expect("node reachable");
            assert!(reply.starts_with("+OK"), "FLUSHALL: {reply}");
        }
    }

    /// Sends one command to every node; the replies, in node order.
    pub fn command_all(&self, args: &[&str]) -> Vec<String> {
        self.group
            .nodes
            .iter()
            .map(|n| n.command(args).expect("node reachable"))
            .collect()
    }
}
