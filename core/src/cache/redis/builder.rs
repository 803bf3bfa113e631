//! `RedisCacheBuilder`: the options a `RedisCache` is built with, and the
//! three ways to reach Redis — one server, a Cluster (feature
//! `redis-cluster`) or the primary a set of Sentinels names (feature
//! `redis-sentinel`). Building checks the URLs and the TLS files and never
//! touches the network, so a bad configuration fails at startup and a server
//! that is down fails only the operations that need it.

#[cfg(feature = "redis-sentinel")]
use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::ConnectionManagerConfig;
use ::redis::{Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

#[cfg(feature = "redis-sentinel")]
use super::connection;
use super::connection::Backend;
use super::error::{describe, redact_raw, scrub};
#[cfg(feature = "redis-tls")]
use super::tls;
use super::{ConnectionManager, RedisCache};
use crate::cache::TimeSource;
#[cfg(doc)]
use crate::error::CacheError;
use crate::error::ConfigError;

/// The default bound on establishing a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The default bound on waiting for a reply.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);
/// The default number of reconnection attempts per outage episode.
pub const DEFAULT_RECONNECT_RETRIES: usize = 2;

/// What a `rediss://` URL is told without the `redis-tls` feature.
#[cfg_attr(feature = "redis-tls", allow(dead_code))]
const NO_TLS: &str = "a redis:// or unix:// URL (rediss:// needs the `redis-tls` feature)";

/// Configures a [`RedisCache`]: timeouts, reconnection, the time source and
/// (feature `redis-tls`) the TLS files. Its `Debug` shows file paths, never
/// their contents.
#[derive(Clone, Debug)]
pub struct RedisCacheBuilder {
    connect_timeout: Duration,
    response_timeout: Duration,
    reconnect_retries: usize,
    pub(super) time_source: TimeSource,
    #[cfg(feature = "redis-tls")]
    tls: tls::TlsFiles,
    #[cfg(feature = "redis-sentinel")]
    sentinel_master_password: Option<Secret>,
}

/// A password a builder holds: its `Debug` is `***`.
#[cfg(feature = "redis-sentinel")]
#[derive(Clone)]
struct Secret(String);

#[cfg(feature = "redis-sentinel")]
impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl Default for RedisCacheBuilder {
    fn default() -> Self {
        RedisCacheBuilder {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            reconnect_retries: DEFAULT_RECONNECT_RETRIES,
            time_source: TimeSource::default(),
            #[cfg(feature = "redis-tls")]
            tls: tls::TlsFiles::default(),
            #[cfg(feature = "redis-sentinel")]
            sentinel_master_password: None,
        }
    }
}

impl RedisCacheBuilder {
    /// How long establishing a connection may take (default 1 s).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// How long waiting for one reply may take (default 500 ms).
    pub fn response_timeout(mut self, d: Duration) -> Self {
        self.response_timeout = d;
        self
    }

    /// How many times the background reconnection retries before giving up
    /// until the next operation (default 2). Only for connections this builder
    /// makes to one server or to a Sentinel-found primary; a cluster's client
    /// retries within the operation timeout instead.
    pub fn reconnect_retries(mut self, n: usize) -> Self {
        self.reconnect_retries = n;
        self
    }

    /// Whose clock stamps hits and breaker transitions (default
    /// [`TimeSource::Store`]: the server's `TIME`).
    pub fn time_source(mut self, time_source: TimeSource) -> Self {
        self.time_source = time_source;
        self
    }

    /// Trusts the CA certificates in the PEM file at `path` instead of the
    /// platform's roots, for a server whose certificate a private CA signed
    /// (feature `redis-tls`; needs a `rediss://` URL). The file is read when
    /// the cache is built; an unreadable file, or one without a certificate,
    /// is a [`ConfigError`] for `tls_ca_file` naming it.
    #[cfg(feature = "redis-tls")]
    pub fn tls_ca_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tls.ca_file = Some(path.into());
        self
    }

    /// Presents the PEM certificate chain at `cert` and the PEM private key at
    /// `key` to a server that requires client certificates (mutual TLS;
    /// feature `redis-tls`; needs a `rediss://` URL). Read when the cache is
    /// built; a bad file is a [`ConfigError`] for `tls_client_cert` or
    /// `tls_client_key` naming it, never showing what it holds.
    #[cfg(feature = "redis-tls")]
    pub fn tls_client_cert(mut self, cert: impl Into<std::path::PathBuf>, key: impl Into<std::path::PathBuf>) -> Self {
        self.tls.client = Some((cert.into(), key.into()));
        self
    }

    /// The bound on any one operation: `connect_timeout + response_timeout`
    /// (a first operation may have to connect before it can ask).
    pub fn operation_timeout(&self) -> Duration {
        self.connect_timeout.saturating_add(self.response_timeout)
    }

    /// A cache that owns a new connection to `url` (`redis://[user][:password@]host[:port][/db]`,
    /// `unix:///path?pass=…`, and with feature `redis-tls`
    /// `rediss://[user][:password@]host[:port][/db]`). Returns at once; the
    /// connection is made by the first operation. Must be called from within a
    /// Tokio runtime, and the cache used on one with its timer enabled (every
    /// operation is bounded by `tokio::time::timeout`). The error never
    /// contains the password.
    pub fn build_from_url(self, url: &str) -> Result<RedisCache, ConfigError> {
        let info = url.into_connection_info().map_err(|_| {
            let tls_scheme = url.starts_with("rediss:") || url.starts_with("valkeys:");
            let expected = if tls_scheme && cfg!(not(feature = "redis-tls")) {
                NO_TLS
            } else {
                "a valid Redis URL"
            };
            ConfigError::new("url", expected, redact_raw(url))
        })?;
        let client = self.client(info)?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ConfigError::new(
                "url",
                "opened from within a Tokio runtime",
                describe(client.get_connection_info()),
            ));
        }
        let info = client.get_connection_info();
        let target = describe(info);
        let secret = info
            .redis_settings()
            .password()
            .filter(|p| !p.is_empty())
            .map(str::to_owned);
        let manager = ConnectionManager::new_lazy_with_config(client, self.manager_config()).map_err(|e| {
            ConfigError::new(
                "url",
                "a usable Redis configuration",
                scrub(&e.to_string(), secret.as_deref()),
            )
        })?;
        Ok(RedisCache::assemble(
            self,
            Backend::Single(manager),
            true,
            target,
            secret,
        ))
    }

    /// How this builder's connections to one server are made and remade.
    fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(self.reconnect_retries)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(self.connect_timeout)
    }

    /// A cache over a Redis Cluster (feature `redis-cluster`), found through
    /// any of `nodes` (`redis://[user][:password@]host:port`, and with feature
    /// `redis-tls` `rediss://…`, using this builder's TLS files). Every node
    /// must share the scheme and the credentials; unix sockets cannot be used
    /// (a cluster names its nodes by IP and port). Returns at once: the slot
    /// map is fetched by the first operation. Must be called from within a
    /// Tokio runtime.
    ///
    /// The redis crate's async cluster client sends each command to the
    /// primary serving its keys' slot, follows `MOVED` and `ASK` redirects,
    /// refreshes its slot map after a failover or a resharding, and retries
    /// `TRYAGAIN`, `CLUSTERDOWN` and lost connections with a short backoff —
    /// all within this builder's [`operation_timeout`](Self::operation_timeout),
    /// past which the operation is [`CacheError::Unavailable`]. Every script
    /// keeps its keys in one slot (see `docs/redis.md`); a breaker whose keys
    /// would span slots is refused with [`CacheError::Protocol`] before
    /// anything is sent. Scripts are sent by hash; a node that does not know
    /// one answers `NOSCRIPT`, and the script is loaded on every primary and
    /// the call retried, once.
    #[cfg(feature = "redis-cluster")]
    pub fn build_cluster<I>(self, nodes: I) -> Result<RedisCache, ConfigError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        use ::redis::cluster::{ClusterClient, ClusterConfig};
        let mut infos = Vec::new();
        for node in nodes {
            let url = node.as_ref();
            let info = url
                .into_connection_info()
                .map_err(|_| ConfigError::new("nodes", "valid Redis URLs", redact_raw(url)))?;
            match info.addr() {
                ConnectionAddr::Unix(_) => {
                    return Err(ConfigError::new(
                        "nodes",
                        "TCP addresses (a cluster names its nodes by IP and port, not unix sockets)",
                        describe(&info),
                    ));
                }
                ConnectionAddr::TcpTls { insecure: true, .. } => {
                    return Err(ConfigError::new(
                        "nodes",
                        "rediss:// URLs that verify the server (`#insecure` is not supported)",
                        describe(&info),
                    ));
                }
                ConnectionAddr::TcpTls { .. } if cfg!(not(feature = "redis-tls")) => {
                    return Err(ConfigError::new("nodes", NO_TLS, describe(&info)));
                }
                _ => {}
            }
            infos.push(info);
        }
        let Some(first) = infos.first() else {
            return Err(ConfigError::new("nodes", "at least one cluster node URL", "none"));
        };
        let target = format!("cluster {}", infos.iter().map(describe).collect::<Vec<_>>().join(","));
        let secret = first
            .redis_settings()
            .password()
            .filter(|p| !p.is_empty())
            .map(str::to_owned);
        let tls = matches!(first.addr(), ConnectionAddr::TcpTls { .. });
        #[cfg(feature = "redis-tls")]
        let certificates = if tls {
            tls::ensure_crypto_provider();
            Some(self.tls.load()?)
        } else if !self.tls.is_empty() {
            return Err(ConfigError::new(
                "nodes",
                "rediss:// URLs when a TLS CA file or client certificate is set",
                &target,
            ));
        } else {
            None
        };
        #[cfg(not(feature = "redis-tls"))]
        let _ = tls;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ConfigError::new("nodes", "opened from within a Tokio runtime", &target));
        }
        let builder = ClusterClient::builder(infos)
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.response_timeout)
            // Retries, reconnections and redirections are bounded by the
            // operation timeout instead.
            .overall_response_timeout(None)
            .min_retry_wait(10)
            .max_retry_wait(200);
        #[cfg(feature = "redis-tls")]
        let builder = match certificates {
            Some(certificates) if !self.tls.is_empty() => builder.certs(certificates),
            _ => builder,
        };
        let client = builder.build().map_err(|e| {
            ConfigError::new(
                "nodes",
                "cluster nodes sharing one scheme and one set of credentials",
                format!("{target} ({})", scrub(&e.to_string(), secret.as_deref())),
            )
        })?;
        let config = ClusterConfig::new()
            .set_connection_timeout(self.connect_timeout)
            .set_response_timeout(self.response_timeout);
        let connection = client.get_pending_async_connection_with_config(config);
        Ok(RedisCache::assemble(
            self,
            Backend::Cluster(connection),
            true,
            target,
            secret,
        ))
    }

    /// A cache over the primary that the Sentinels at `sentinels`
    /// (`redis://[user][:password@]host:port`, each a Sentinel, not a data
    /// node) name for `master_name` (feature `redis-sentinel`). Returns at
    /// once. The first operation asks the Sentinels, in order, for the
    /// primary and checks that it answers `ROLE` as a master; an operation
    /// that then finds the primary unavailable (a lost connection, a timeout,
    /// `READONLY` from a demoted primary, `MASTERDOWN`, …) is
    /// [`CacheError::Unavailable`] and makes the next operation ask the
    /// Sentinels again, so calls follow a failover to the promoted replica.
    /// The primary's password, if it has one, is
    /// [`sentinel_master_password`](Self::sentinel_master_password). Sentinels
    /// over TLS are not supported: a `rediss://` Sentinel URL is a
    /// [`ConfigError`]. Must be called from within a Tokio runtime.
    #[cfg(feature = "redis-sentinel")]
    pub fn build_sentinel<I>(self, master_name: &str, sentinels: I) -> Result<RedisCache, ConfigError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        use ::redis::RedisConnectionInfo;
        use ::redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
        if master_name.is_empty() {
            return Err(ConfigError::new(
                "master_name",
                "the name the Sentinels monitor",
                "\"\"",
            ));
        }
        let mut infos = Vec::new();
        for url in sentinels {
            let url = url.as_ref();
            let info = url
                .into_connection_info()
                .map_err(|_| ConfigError::new("sentinels", "valid Redis URLs", redact_raw(url)))?;
            if !matches!(info.addr(), ConnectionAddr::Tcp(..)) {
                return Err(ConfigError::new(
                    "sentinels",
                    "redis://host:port URLs of Sentinels (TLS and unix sockets are not supported)",
                    describe(&info),
                ));
            }
            infos.push(info);
        }
        if infos.is_empty() {
            return Err(ConfigError::new("sentinels", "at least one Sentinel URL", "none"));
        }
        let target = format!(
            "sentinel master {master_name} via {}",
            infos.iter().map(describe).collect::<Vec<_>>().join(",")
        );
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ConfigError::new(
                "sentinels",
                "opened from within a Tokio runtime",
                &target,
            ));
        }
        let mut node = RedisConnectionInfo::default();
        if let Some(Secret(p)) = &self.sentinel_master_password {
            node = node.set_password(p);
        }
        let node = SentinelNodeConnectionInfo::default().set_redis_connection_info(node);
        let secret = self
            .sentinel_master_password
            .as_ref()
            .map(|Secret(p)| p.clone())
            .filter(|p| !p.is_empty());
        let client = SentinelClient::build(infos, String::from(master_name), Some(node), SentinelServerType::Master)
            .map_err(|e| {
                ConfigError::new(
                    "sentinels",
                    "a usable Sentinel configuration",
                    format!("{target} ({})", scrub(&e.to_string(), secret.as_deref())),
                )
            })?;
        let primary = connection::sentinel::SentinelPrimary::new(client, self.manager_config());
        Ok(RedisCache::assemble(
            self,
            Backend::Sentinel(Arc::new(primary)),
            true,
            target,
            secret,
        ))
    }

    /// The password of the primary (and replicas) that
    /// [`build_sentinel`](Self::build_sentinel) connects to, when they
    /// require one (feature `redis-sentinel`). A Sentinel's own password goes
    /// in its URL. Never printed.
    #[cfg(feature = "redis-sentinel")]
    pub fn sentinel_master_password(mut self, password: impl Into<String>) -> Self {
        self.sentinel_master_password = Some(Secret(password.into()));
        self
    }

    /// The client for `info`, with this builder's TLS files when it has any.
    #[cfg(feature = "redis-tls")]
    fn client(&self, info: ConnectionInfo) -> Result<Client, ConfigError> {
        let invalid = |info: &ConnectionInfo| ConfigError::new("url", "a valid Redis URL", describe(info));
        let insecure = match info.addr() {
            ConnectionAddr::TcpTls { insecure, .. } => *insecure,
            _ if self.tls.is_empty() => return Client::open(info.clone()).map_err(|_| invalid(&info)),
            _ => {
                return Err(ConfigError::new(
                    "url",
                    "a rediss:// URL when a TLS CA file or client certificate is set",
                    describe(&info),
                ));
            }
        };
        if insecure {
            return Err(ConfigError::new(
                "url",
                "a rediss:// URL that verifies the server (`#insecure` is not supported)",
                describe(&info),
            ));
        }
        tls::ensure_crypto_provider();
        if self.tls.is_empty() {
            return Client::open(info.clone()).map_err(|_| invalid(&info));
        }
        let certificates = self.tls.load()?;
        Client::build_with_tls(info.clone(), certificates)
            .map_err(|_| ConfigError::new("url", "a usable TLS configuration", describe(&info)))
    }

    /// The client for `info` (`rediss://` needs feature `redis-tls`).
    #[cfg(not(feature = "redis-tls"))]
    fn client(&self, info: ConnectionInfo) -> Result<Client, ConfigError> {
        if matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
            return Err(ConfigError::new("url", NO_TLS, describe(&info)));
        }
        Client::open(info.clone()).map_err(|_| ConfigError::new("url", "a valid Redis URL", describe(&info)))
    }

    /// A cache over the caller's connection, which it does not own: `close`
    /// leaves it open. The connection's own timeouts still apply; this
    /// builder's [`operation_timeout`](Self::operation_timeout) bounds every
    /// operation on top of them.
    pub fn build_with_connection(self, connection: ConnectionManager) -> RedisCache {
        RedisCache::assemble(
            self,
            Backend::Single(connection),
            false,
            "a caller's connection".to_owned(),
            None,
        )
    }
}

#[cfg(all(test, not(feature = "redis-tls")))]
mod tests {
    use super::*;

    #[test]
    fn a_tls_url_without_the_feature_says_which_feature() {
        let e = RedisCache::from_url("rediss://:hunter2@127.0.0.1:6380").unwrap_err();
        assert_eq!((e.field, e.expected), ("url", NO_TLS));
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
}
