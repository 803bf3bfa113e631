//! Where a [`RedisCache`](super::RedisCache)'s commands go: one server (the
//! redis crate's auto-reconnecting `ConnectionManager`), a Redis Cluster
//! (feature `redis-cluster`: the crate's async cluster client, which follows
//! `MOVED`/`ASK` redirects and refreshes its slot map itself), or the primary
//! a Sentinel names (feature `redis-sentinel`: asked of the Sentinels on the
//! first operation and again after any operation that found that primary
//! unavailable, so calls follow a failover to the promoted replica).
//!
//! The adapter's operations are written once, against [`Conn`], whichever the
//! topology.

#[cfg(feature = "redis-sentinel")]
use std::sync::Arc;

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

#[cfg(feature = "redis-cluster")]
pub(super) use ::redis::cluster_async::ClusterConnection;

/// One connection to send commands on.
#[derive(Clone)]
pub(super) enum Conn {
    /// One server (or the primary a Sentinel named).
    Single(ConnectionManager),
    /// A Redis Cluster: each command goes to the primary serving its keys' slot.
    #[cfg(feature = "redis-cluster")]
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// A cache's topology and its live connection(s). Cheap to clone.
#[derive(Clone)]
pub(super) enum Backend {
    /// One server.
    Single(ConnectionManager),
    /// A Redis Cluster.
    #[cfg(feature = "redis-cluster")]
    Cluster(ClusterConnection),
    /// The primary a set of Sentinels names.
    #[cfg(feature = "redis-sentinel")]
    Sentinel(Arc<sentinel::SentinelPrimary>),
}

/// Which connection an operation used, so that a failure can retire exactly
/// that one (a Sentinel-found primary) and no later one.
#[derive(Clone, Copy, Debug)]
pub(super) struct Lease(#[cfg_attr(not(feature = "redis-sentinel"), allow(dead_code))] u64);

impl Backend {
    /// A connection to run one operation on. For a Sentinel-found primary this
    /// may first ask the Sentinels where the primary is.
    pub(super) async fn connection(&self) -> RedisResult<(Conn, Lease)> {
        match self {
            Backend::Single(c) => Ok((Conn::Single(c.clone()), Lease(0))),
            #[cfg(feature = "redis-cluster")]
            Backend::Cluster(c) => Ok((Conn::Cluster(c.clone()), Lease(0))),
            #[cfg(feature = "redis-sentinel")]
            Backend::Sentinel(s) => s
                .connection()
                .await
                .map(|(c, generation)| (Conn::Single(c), Lease(generation))),
        }
    }

    /// The operation on `lease` found the server unavailable: a Sentinel-found
    /// primary is asked for again by the next operation (it may have been
    /// demoted, or died and been replaced). The other topologies recover by
    /// themselves.
    pub(super) fn unavailable(&self, lease: Lease) {
        #[cfg(feature = "redis-sentinel")]
        if let Backend::Sentinel(s) = self {
            s.retire(lease.0);
        }
        let _ = lease;
    }

    /// Whether commands are routed by hash slot (a multi-key script must keep
    /// its keys in one slot).
    #[cfg(feature = "redis-cluster")]
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Backend::Cluster(_))
    }
}

#[cfg(feature = "redis-sentinel")]
pub(super) mod sentinel {
    //! The primary a set of Sentinels names, found again after a failure.

    use std::sync::Mutex;

    use ::redis::RedisResult;
    use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
    use ::redis::sentinel::SentinelClient;

    /// The Sentinels to ask and the primary they last named.
    pub(in super::super) struct SentinelPrimary {
        /// Asks the Sentinels (one question at a time: concurrent operations
        /// that find no primary wait for one answer rather than each asking).
        client: tokio::sync::Mutex<SentinelClient>,
        /// The connection to the primary last named, with its generation.
        current: Mutex<Option<(u64, ConnectionManager)>>,
        /// The generation the next connection gets.
        next: Mutex<u64>,
        /// How connections to the primary are made.
        config: ConnectionManagerConfig,
    }

    impl SentinelPrimary {
        pub(in super::super) fn new(client: SentinelClient, config: ConnectionManagerConfig) -> Self {
            SentinelPrimary {
                client: tokio::sync::Mutex::new(client),
                current: Mutex::new(None),
                next: Mutex::new(1),
                config,
            }
        }

        fn current(&self) -> Option<(u64, ConnectionManager)> {
            // The guarded value is a handle, never left half-updated.
            self.current.lock().unwrap_or_else(|p| p.into_inner()).clone()
        }

        /// The connection to the primary, asking the Sentinels first if there
        /// is none.
        pub(in super::super) async fn connection(&self) -> RedisResult<(ConnectionManager, u64)> {
            if let Some((generation, c)) = self.current() {
                return Ok((c, generation));
            }
            let mut client = self.client.lock().await;
            // Another operation may have found it while this one waited.
            if let Some((generation, c)) = self.current() {
                return Ok((c, generation));
            }
            // The redis crate asks each Sentinel in turn and checks that the
            // server named answers `ROLE` as a master.
            let primary = client.async_get_client().await?;
            let manager = ConnectionManager::new_lazy_with_config(primary, self.config.clone())?;
            let generation = {
                let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
                let g = *next;
                *next = next.wrapping_add(1);
                g
            };
            *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some((generation, manager.clone()));
            tracing::info!(generation, "redis sentinel named a primary");
            Ok((manager, generation))
        }

        /// Forgets the connection of `generation`, if it is still the current one.
        pub(in super::super) fn retire(&self, generation: u64) {
            let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
            if current.as_ref().is_some_and(|(g, _)| *g == generation) {
                *current = None;
            }
        }
    }
}
