//! `RedisCache`: the cache port on a real Redis, so a fleet of workers shares
//! one allowance per tenant and one breaker per model server.
//!
//! Enabled by the `redis` cargo feature. Every capability of the port
//! ([`Cache`], [`KeyValue`], [`HitWindow`], [`LimiterStore`], [`BreakerStore`])
//! is implemented, with the same answers as [`MemoryCache`](crate::MemoryCache)
//! — the compliance suite in [`crate::testing`] runs unchanged against both.
//!
//! # One round trip per operation
//!
//! Each operation is exactly one command on the wire: a plain `GET`, `SET` or
//! `DEL` for the simple value operations, and one Lua script (`EVALSHA`) for
//! everything that reads before it writes. Redis runs a script atomically, so
//! the limiter's count → compare → record and each breaker transition are one
//! indivisible step even across a fleet; the spec's three-call limiter and
//! read-then-write breaker could over-admit. The scripts live in `.lua` files
//! beside this module and are sent by hash; after a server restart (or `SCRIPT
//! FLUSH`) the first call of each script gets `NOSCRIPT`, loads it and retries,
//! once.
//!
//! | operation | command |
//! |---|---|
//! | `get` / `set` / `delete` | `GET` / `SET [PX]` / `DEL key window(key)` |
//! | `increment` | `increment.lua` (TTL on creation only, atomic) |
//! | `record_hit`, `count_since`, `oldest_since` | one script each |
//! | `acquire_slot` | `acquire_slot.lua`: count, decide, record, `PEXPIRE` |
//! | `breaker_step` | `breaker_step.lua`: read five keys, decide, write |
//! | `breaker_read` | `breaker_read.lua`: `MGET` of the five keys (+ `TIME`) |
//!
//! The scripts need Redis 6.0 or later (`SET … KEEPTTL`); the tests run
//! against 7.0.
//!
//! The breaker script is [`machine::step`] written in Lua. So that the two can
//! never silently drift apart, the script also returns the raw values it read;
//! the adapter re-runs [`machine::step`] on them in Rust and reports
//! [`CacheError::Protocol`] if the script's decision or writes differ. The
//! [`BreakerStep`] returned is always the one `machine::step` computed.
//!
//! # Key mapping
//!
//! In the port a value and a hit window may share a key; in Redis a key has one
//! type. Values live at the key itself (strings, so `redis-cli GET` shows them,
//! and the breaker's keys are the spec's `{prefix}:state` etc.). The hit window
//! of key `k` lives in a sorted set at a derived key:
//!
//! - if `k` already contains a Redis Cluster hash tag (`{…}` with something
//!   inside), the window is `k:hits` — same tag, same slot;
//! - otherwise, if `k` contains no `}`, the window is `{k}:hits`, whose tag is
//!   `k` itself, so it hashes to `k`'s slot (the limiter's tenant key
//!   `kg:ratelimit:<tenant>` becomes `{kg:ratelimit:<tenant>}:hits`);
//! - otherwise (a `}` with no valid tag) the window is `k:hits`, which may sit
//!   in another slot; only `delete` touches both keys.
//!
//! Don't store values at keys of the form `…:hits` that collide with a window.
//!
//! Every script touches one limiter tenant's single key, or one breaker's five
//! keys (which share the `{prefix}` tag: `state`, `failures`, `opened_at`,
//! `probes` and `cooldown_until`), so each script is Cluster-safe.
//!
//! Hit members are `"<µs>:<n>"`, where `n` counts the hits already at that exact
//! instant: two hits at one instant are two members, from any process, with no
//! client nonce or entropy. Instants are integer microseconds
//! ([`Timestamp::as_micros`]), exact as sorted-set scores; `opened_at` is
//! stored in [`Timestamp`]'s `Display` form (`1700000000.250000`),
//! `cooldown_until` as decimal microseconds with a TTL that ends with the
//! cooldown. Instants and
//! durations above 2^53 µs (year 2255) are refused rather than rounded. TTLs
//! are rounded up to whole milliseconds.
//!
//! # Keys a foreign writer damaged
//!
//! The scripts check a key's type before reading it, so a value of the wrong
//! type is never an error that lasts:
//!
//! - a breaker key that is not a string (someone `HSET` the state key) reads
//!   as the text `WRONGTYPE: a <type>, not a string`, which
//!   [`BreakerSnapshot::decode`] takes as unreadable — the state as
//!   [`StoredState::Unreadable`](machine::StoredState::Unreadable) (closed,
//!   reported as [`Event::BreakerStateUnreadable`](crate::Event::BreakerStateUnreadable)),
//!   the other keys as absent — on both sides of the cross-check; the adapter
//!   logs a warning, and the next write to the key replaces it (`SET`
//!   overwrites any type);
//! - a hit window that is not a sorted set reads as empty, and the next
//!   `record_hit` or `acquire_slot` deletes it first and logs a warning;
//! - scores beyond 2^53 µs (a `ZADD key +inf x`), which the adapter never
//!   writes, are not hits: reads ignore them and the next write removes them;
//! - a window always has a TTL: every recorded hit extends it, and a refused
//!   `acquire_slot` gives one to a window left without.
//!
//! # Time source
//!
//! With [`TimeSource::Store`] (the default) the scripts read the server's
//! `TIME` inside the script, so workers with skewed clocks still agree on one
//! clock. With [`TimeSource::Caller`] (the spec's behaviour, and the
//! skew-sensitive choice) they stamp hits and breaker transitions with the
//! caller's `now`, a limiter decision's stamp clamped into
//! `[TIME − window, TIME + max_ahead]` as
//! [`clamp_stamp`](crate::decide::window::clamp_stamp) says. Either way TTLs run on
//! the server's clock and hit windows are pruned by `TIME`, never by the
//! newest stamp, so one fast clock cannot delete the fleet's hits.
//!
//! # When Redis is unavailable
//!
//! Construction never touches the network: the connection is made on the
//! first operation, and remade in the background after a failure (the redis
//! crate's `ConnectionManager`), so the adapter recovers by itself when the
//! server returns. Every operation finishes within
//! [`RedisCacheBuilder::operation_timeout`] (`connect_timeout` +
//! `response_timeout`): a refused connection, a timeout or a server killed
//! mid-call is [`CacheError::Unavailable`], never a hang.
//!
//! A server that answers may still be unable to serve. These error codes are
//! [`CacheError::Unavailable`] too (the reason names the code), so the
//! components' policies below apply to them, with an event each time:
//!
//! | code | what the server is saying |
//! |---|---|
//! | `OOM` | at `maxmemory` under `noeviction`: no write fits |
//! | `LOADING` | loading its dataset after a restart |
//! | `BUSY` | a script has run past `busy-reply-threshold` |
//! | `READONLY` | a replica, e.g. the old master after a failover |
//! | `MASTERDOWN` | a replica whose master link is down (`replica-serve-stale-data no`) |
//! | `CLUSTERDOWN`, `TRYAGAIN` | a cluster that is down or moving slots |
//!
//! A command failing inside a script reaches the client as a script error;
//! the adapter classifies it by the code of the inner error, which Redis 7
//! keeps as the reply's code and older servers quote in the text (`ERR Error
//! running script … -OOM …`). Reads still work at `OOM`, and every script's
//! first write is its real one, so a full server refuses exactly what would
//! grow it.
//!
//! A refused password — wrong, missing (`NOAUTH`), or sent to a server that
//! has none — is a misconfiguration, not an outage: every operation fails at
//! once with [`CacheError::Authentication`] ("authentication failed: wrong or
//! missing password for `<target>`", the target redacted), which is not
//! transient and is never routed to a cache-unavailable policy. Other
//! server-side and reply-shape errors are [`CacheError::Protocol`];
//! incrementing a non-integer is [`CacheError::NotAnInteger`].
//!
//! What the components do meanwhile is theirs to decide, and configurable:
//! the rate limiter's
//! [`OnCacheUnavailable`](crate::limiter::OnCacheUnavailable) (default: a
//! per-process local limit, so the fleet overshoots by at most `rpm` per
//! worker per window), and the breaker's
//! [`OnCacheError`](crate::OnCacheError) (default: admit — a damaged cache fails
//! toward calling the model).
//!
//! A password in the URL never appears in an error, a log line or `Debug`
//! output: the adapter describes its server by a redacted URL and scrubs the
//! password from any text the redis crate produces.
//!
//! # TLS
//!
//! With the `redis-tls` feature, `rediss://` URLs connect over TLS (rustls,
//! ring), verifying the server's certificate and name against the platform's
//! root certificates. For a server a private CA signed,
//! [`tls_ca_file`](RedisCacheBuilder::tls_ca_file) trusts that CA's PEM file
//! instead; for a server that requires client certificates (mutual TLS),
//! [`tls_client_cert`](RedisCacheBuilder::tls_client_cert) presents a PEM
//! certificate and key. The files are read and checked when the cache is
//! built: an unreadable file, or one without a certificate or key, is a
//! [`ConfigError`] naming the builder option and the file, and so are TLS
//! files with a plain `redis://` URL and a `#insecure` URL (verification is
//! never skipped). Without the feature a `rediss://` URL is a `ConfigError`
//! saying which feature it needs. If no rustls crypto provider is installed
//! for the process, building a `rediss://` cache installs ring's.
//!
//! A failed handshake is [`CacheError::Unavailable`] on the operation that
//! tried to connect, with rustls's reason (`invalid peer certificate:
//! UnknownIssuer`, `received fatal alert: CertificateRequired`); a plain
//! `redis://` client pointed at a TLS port fails the same way (the server
//! resets the connection), within the operation timeout. Only file paths are
//! kept and printed, never what the files hold.
//!
//! # Cluster, Sentinel, failover
//!
//! [`build_from_url`](RedisCacheBuilder::build_from_url) talks to one server.
//! With the `redis-cluster` feature,
//! [`build_cluster`](RedisCacheBuilder::build_cluster) takes the URLs of
//! some of a Redis Cluster's nodes and uses the redis crate's async cluster
//! client: each command goes to the primary serving its keys' slot, `MOVED`
//! and `ASK` redirects are followed, the slot map is refreshed after a
//! failover or a resharding, and `TRYAGAIN`, `CLUSTERDOWN` and lost
//! connections are retried with a short backoff, all within the operation
//! timeout. Every script keeps its keys in one slot (see the key mapping
//! above), so the one-round-trip atomicity holds on a cluster; a breaker whose
//! [`BreakerKeys`] do not share a hash tag is refused with
//! [`CacheError::Protocol`] before anything is sent. A primary that does not
//! know a script answers `NOSCRIPT`; the script is then loaded on every
//! primary and the call retried, once.
//!
//! With the `redis-sentinel` feature,
//! [`build_sentinel`](RedisCacheBuilder::build_sentinel) takes a master name
//! and the URLs of its Sentinels. The first operation asks the Sentinels for
//! the primary (checking that it answers `ROLE` as a master); an operation
//! that finds it unavailable — a lost connection, a timeout, `READONLY` from a
//! demoted primary, `MASTERDOWN` — makes the next one ask again, so calls
//! reach the promoted replica once the Sentinels have switched.
//!
//! During a failover's gap every operation is [`CacheError::Unavailable`]
//! (never a panic, never a hang past the operation timeout), so the
//! components' cache-unavailable policies decide: `core/tests/it/redis_sentinel.rs`
//! kills the primary while 50 tasks acquire and checks that only the policy's
//! fallback admits during the gap (the local limit at most `rpm` per worker,
//! `Refuse` nothing) and that the store decides again right after the
//! promotion. Writes the replica had not received when the primary died are
//! lost with it (Redis replication is asynchronous): the limiter may then
//! admit those hits again.
//!
//! # Ownership
//!
//! [`RedisCache::from_url`] owns its connection; [`close`](Cache::close)
//! releases it. [`RedisCache::from_connection`] uses a caller's
//! `ConnectionManager` without owning it: `close` marks this handle closed and
//! drops its clone, and the caller's connection stays open. Either way, `close`
//! is idempotent and later operations fail with [`CacheError::Closed`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use redstring::cache::redis::RedisCache;
//! use redstring::{RateLimiter, TenantId, TimeSource};
//!
//! let cache = RedisCache::builder()
//!     .response_timeout(Duration::from_millis(200))
//!     .time_source(TimeSource::Store)
//!     .build_from_url("redis://:secret@127.0.0.1:6379/0")?;
//! let limiter = RateLimiter::builder(60).cache(Arc::new(cache)).build()?;
//! limiter.acquire(TenantId::from_u128(7)).await?;
//! # Ok(())
//! # }
//! ```

mod connection;
mod scripts;
#[cfg(feature = "redis-tls")]
mod tls;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::redis::aio::ConnectionManagerConfig;
use ::redis::{Client, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError, ServerErrorKind};

use super::{
    BreakerStore, BudgetStore, Cache, HitWindow, InFlightStore, KeyValue, LimiterStore, SlotRequest, TimeSource,
    TokenStore,
};
use crate::decide::breaker::{
    self as machine, BreakerCommand, BreakerKeys, BreakerParams, BreakerSnapshot, BreakerStep, CircuitState,
    FailuresWrite, Origin, Permit, ProbeId, Write, Writes,
};
use crate::decide::budget::{BudgetCommand, BudgetParams, BudgetState, BudgetStep};
use crate::decide::pick::{Pick, PickRequest, check_pick};
use crate::decide::tokens::{RefusedBy, ReservationId, TokenAsk, TokenOutcome};
use crate::decide::window::SlotOutcome;
use crate::error::{CacheError, ConfigError};
use crate::time::Timestamp;
use connection::{Backend, Conn};
use scripts::SCRIPTS;

/// The redis crate's auto-reconnecting connection, which
/// [`RedisCache::from_connection`] accepts.
pub use ::redis::aio::ConnectionManager;

/// The default bound on establishing a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The default bound on waiting for a reply.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);
/// The default number of reconnection attempts per outage episode.
pub const DEFAULT_RECONNECT_RETRIES: usize = 2;

/// How the scripts spell a key holding another type than a string
/// (`common.lua`'s `read_string`), followed by the type.
const WRONG_TYPE_MARKER: &str = "WRONGTYPE: ";

/// What a `rediss://` URL is told without the `redis-tls` feature.
#[cfg_attr(feature = "redis-tls", allow(dead_code))]
const NO_TLS: &str = "a redis:// or unix:// URL (rediss:// needs the `redis-tls` feature)";

/// The largest instant or duration, in µs, a Lua number holds exactly (2^53).
const MAX_EXACT_MICROS: u64 = 1 << 53;

/// Configures a [`RedisCache`]: timeouts, reconnection, the time source and
/// (feature `redis-tls`) the TLS files. Its `Debug` shows file paths, never
/// their contents.
#[derive(Clone, Debug)]
pub struct RedisCacheBuilder {
    connect_timeout: Duration,
    response_timeout: Duration,
    reconnect_retries: usize,
    time_source: TimeSource,
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
    /// keeps its keys in one slot (see the module docs); a breaker whose keys
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

/// The [`Cache`] port on Redis. Cheap to clone; clones share one connection
/// and one open/closed state.
#[derive(Clone)]
pub struct RedisCache {
    inner: Arc<Inner>,
}

struct Inner {
    /// `None` once closed.
    connection: Mutex<Option<Backend>>,
    owned: bool,
    config: RedisCacheBuilder,
    /// The server, with any password replaced by `***`.
    target: String,
    /// The password, to scrub from any text the redis crate produces.
    secret: Option<String>,
}

impl std::fmt::Debug for RedisCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCache")
            .field("target", &self.inner.target)
            .field("owns_connection", &self.inner.owned)
            .field("time_source", &self.inner.config.time_source)
            .field("operation_timeout", &self.inner.config.operation_timeout())
            .field("closed", &self.lock().is_none())
            .finish()
    }
}

impl RedisCache {
    /// Starts configuring a cache.
    pub fn builder() -> RedisCacheBuilder {
        RedisCacheBuilder::default()
    }

    /// A cache with the default configuration that owns a new connection to
    /// `url`; see [`RedisCacheBuilder::build_from_url`].
    pub fn from_url(url: &str) -> Result<Self, ConfigError> {
        Self::builder().build_from_url(url)
    }

    /// A cache with the default configuration over the caller's connection;
    /// see [`RedisCacheBuilder::build_with_connection`].
    pub fn from_connection(connection: ConnectionManager) -> Self {
        Self::builder().build_with_connection(connection)
    }

    fn assemble(
        config: RedisCacheBuilder,
        backend: Backend,
        owned: bool,
        target: String,
        secret: Option<String>,
    ) -> Self {
        RedisCache {
            inner: Arc::new(Inner {
                connection: Mutex::new(Some(backend)),
                owned,
                config,
                target,
                secret,
            }),
        }
    }

    /// The server, as safe to print: a URL with any password replaced by `***`.
    pub fn target(&self) -> &str {
        &self.inner.target
    }

    /// Whose clock stamps hits and breaker transitions.
    pub fn time_source(&self) -> TimeSource {
        self.inner.config.time_source
    }

    /// Whether [`close`](Cache::close) releases the connection (it was made by
    /// [`from_url`](Self::from_url)) or leaves it to the caller.
    pub fn owns_connection(&self) -> bool {
        self.inner.owned
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Backend>> {
        // The guarded value is a handle, never left half-updated.
        self.inner.connection.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn connection(&self) -> Result<Backend, CacheError> {
        self.lock().clone().ok_or(CacheError::Closed)
    }

    /// The caller's `now` as a script argument, or `""` for the server's `TIME`.
    fn now_arg(&self, operation: &'static str, now: Timestamp) -> Result<String, CacheError> {
        match self.inner.config.time_source {
            TimeSource::Caller => Ok(exact(operation, now.as_micros())?.to_string()),
            TimeSource::Store => Ok(String::new()),
        }
    }

    /// On a cluster, refuses a script whose keys hash to different slots
    /// (Redis would answer `CROSSSLOT`, a bug in the keys, not an outage).
    fn one_slot(&self, operation: &'static str, keys: &BreakerKeys) -> Result<(), CacheError> {
        #[cfg(feature = "redis-cluster")]
        if self.connection()?.is_cluster()
            && let Some((a, b)) = cross_slot(&keys.all())
        {
            return Err(CacheError::Protocol {
                operation,
                detail: format!(
                    "keys {a:?} and {b:?} hash to different cluster slots; one script's keys must share a hash tag such as `{{prefix}}`"
                ),
            });
        }
        let _ = (operation, keys);
        Ok(())
    }

    /// Reports a hit window a script found holding a foreign value (another
    /// type, or scores beyond any the adapter writes) and replaced.
    fn report_healed_window(&self, key: &str, healed: bool) {
        if healed {
            tracing::warn!(
                server = %self.inner.target,
                key,
                window = %window_key(key),
                "a foreign value at a hit window was removed before recording"
            );
        }
    }

    /// Reports breaker keys a foreign writer gave another type than a string
    /// (the scripts read them as [`WRONG_TYPE_MARKER`] text); the state key's
    /// is also reported by the breaker as an unreadable state.
    fn report_wrong_types(&self, keys: &BreakerKeys, raw: [&Option<String>; 5]) {
        let names = keys.all();
        for (key, value) in names.into_iter().zip(raw) {
            if let Some(value) = value.as_deref().filter(|v| v.starts_with(WRONG_TYPE_MARKER)) {
                tracing::warn!(
                    server = %self.inner.target,
                    key = %key,
                    found = value,
                    "a breaker key holds another type; read as unreadable until the next write replaces it"
                );
            }
        }
    }

    /// Runs one round trip on the connection, bounded by the operation
    /// timeout, with its error mapped onto the port's vocabulary.
    async fn run<T, F, Fut>(&self, operation: &'static str, call: F) -> Result<T, CacheError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let backend = self.connection()?;
        let limit = self.inner.config.operation_timeout();
        let lease = std::sync::Mutex::new(None);
        let attempt = async {
            let (connection, leased) = backend.connection().await?;
            *lease.lock().unwrap_or_else(|p| p.into_inner()) = Some(leased);
            call(connection).await
        };
        let error = match tokio::time::timeout(limit, attempt).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(error)) => self.map_error(operation, &error),
            Err(_) => CacheError::Unavailable {
                operation,
                reason: format!("{} did not answer within {limit:?}", self.inner.target),
            },
        };
        if matches!(error, CacheError::Unavailable { .. })
            && let Some(leased) = *lease.lock().unwrap_or_else(|p| p.into_inner())
        {
            backend.unavailable(leased);
        }
        tracing::debug!(server = %self.inner.target, operation, %error, "redis operation failed");
        Err(error)
    }

    fn map_error(&self, operation: &'static str, error: &RedisError) -> CacheError {
        let text = scrub(&error.to_string(), self.inner.secret.as_deref());
        match classify(error) {
            Class::Authentication => CacheError::Authentication {
                operation,
                target: self.inner.target.clone(),
            },
            Class::Unavailable(None) => CacheError::Unavailable {
                operation,
                reason: format!("{}: {text}", self.inner.target),
            },
            Class::Unavailable(Some(code)) => CacheError::Unavailable {
                operation,
                reason: format!("{} answered {code}: {text}", self.inner.target),
            },
            Class::Protocol => CacheError::Protocol {
                operation,
                detail: text,
            },
        }
    }
}

/// Server error codes meaning "the server cannot serve this now", which the
/// components' cache-unavailable policies cover: out of memory under
/// `noeviction`, loading its dataset, busy with a long script, a replica
/// refusing writes after a failover, a replica whose master is down, a
/// cluster that is down or resharding.
const UNAVAILABLE_CODES: [&str; 7] = [
    "OOM",
    "LOADING",
    "BUSY",
    "READONLY",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "TRYAGAIN",
];

/// Server error codes meaning the credentials were refused.
const AUTHENTICATION_CODES: [&str; 2] = ["NOAUTH", "WRONGPASS"];

/// What an error from the redis crate means for the port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// A wrong or missing password: a misconfiguration.
    Authentication,
    /// The server could not answer now (transient); with the server's error
    /// code when it said so itself.
    Unavailable(Option<&'static str>),
    /// A bug or a foreign writer.
    Protocol,
}

fn classify(error: &RedisError) -> Class {
    let text = error.to_string();
    if matches!(error.kind(), ErrorKind::AuthenticationFailed)
        || error_codes(error, &text).any(|code| AUTHENTICATION_CODES.contains(&code))
        || text.contains("called without any password configured")
    {
        return Class::Authentication;
    }
    if let Some(code) = error_codes(error, &text).find_map(|c| UNAVAILABLE_CODES.iter().find(|&&u| u == c)) {
        return Class::Unavailable(Some(code));
    }
    if error.is_io_error()
        || error.is_timeout()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || matches!(
            error.kind(),
            ErrorKind::Io
                | ErrorKind::ClusterConnectionNotFound
                | ErrorKind::MasterNameNotFoundBySentinel
                | ErrorKind::NoValidReplicasFoundBySentinel
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                )
        )
    {
        return Class::Unavailable(None);
    }
    Class::Protocol
}

/// The error codes an error carries: the reply's own code, and any code
/// quoted in its text. A `redis.call` failing inside a script reaches the
/// client with the inner error's code (Redis 7: `-OOM … script: …`) or, on
/// older servers, wrapped in an `ERR Error running script … -OOM …` whose
/// text still names it; either way the code is an upper-case word of the
/// text.
fn error_codes<'a>(error: &'a RedisError, text: &'a str) -> impl Iterator<Item = &'a str> {
    let words = text
        .split(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
        .filter(|w| w.len() >= 2);
    error.code().into_iter().chain(words)
}

/// The first two of `keys` that Redis Cluster hashes to different slots.
#[cfg(feature = "redis-cluster")]
fn cross_slot<'a>(keys: &[&'a str]) -> Option<(&'a str, &'a str)> {
    use ::redis::cluster_routing::Slot;
    let (&first, rest) = keys.split_first()?;
    let slot = Slot::for_key(first);
    rest.iter()
        .find(|k| Slot::for_key(k) != slot)
        .map(|&other| (first, other))
}

/// A µs value as a script argument, refusing what a Lua number would round.
fn exact(operation: &'static str, micros: u64) -> Result<u64, CacheError> {
    if micros > MAX_EXACT_MICROS {
        return Err(CacheError::Protocol {
            operation,
            detail: format!("{micros} µs is beyond the 2^53 µs a Redis script holds exactly"),
        });
    }
    Ok(micros)
}

/// A duration in whole µs, capped where a Lua number stays exact.
fn duration_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).min(MAX_EXACT_MICROS)
}

/// A TTL in whole milliseconds, rounded up so it never expires early.
fn ttl_ms(d: Duration) -> u64 {
    duration_us(d).div_ceil(1000)
}

/// The sorted set holding the calls in flight at `key` (a router's
/// deployment).
pub fn in_flight_key(key: &str) -> String {
    if has_hash_tag(key) || key.contains('}') {
        format!("{key}:inflight")
    } else {
        format!("{{{key}}}:inflight")
    }
}

/// The sorted set holding `key`'s token ledger: in the same hash slot as its
/// hit window, so one script can decide both on a cluster.
pub fn tokens_key(key: &str) -> String {
    if has_hash_tag(key) || key.contains('}') {
        format!("{key}:tokens")
    } else {
        format!("{{{key}}}:tokens")
    }
}

/// The sorted set holding `key`'s hit window (see the module docs).
pub fn window_key(key: &str) -> String {
    if has_hash_tag(key) || key.contains('}') {
        format!("{key}:hits")
    } else {
        format!("{{{key}}}:hits")
    }
}

/// Whether Redis Cluster hashes `key` by a tag: a `{` followed later by a `}`
/// with at least one byte between them.
fn has_hash_tag(key: &str) -> bool {
    key.find('{')
        .and_then(|open| key[open + 1..].find('}'))
        .is_some_and(|len| len > 0)
}

/// A printable form of the server: scheme, user, host and db, password `***`.
fn describe(info: &ConnectionInfo) -> String {
    let settings = info.redis_settings();
    let user = settings.username().unwrap_or("");
    let password = if settings.password().is_some() { ":***" } else { "" };
    let auth = if user.is_empty() && password.is_empty() {
        String::new()
    } else {
        format!("{user}{password}@")
    };
    match info.addr() {
        ConnectionAddr::Tcp(host, port) => format!("redis://{auth}{host}:{port}/{}", settings.db()),
        ConnectionAddr::TcpTls { host, port, .. } => format!("rediss://{auth}{host}:{port}/{}", settings.db()),
        ConnectionAddr::Unix(path) => {
            let pass = if settings.password().is_some() { "&pass=***" } else { "" };
            format!("unix://{}?db={}{pass}", path.display(), settings.db())
        }
        other => format!("{other}"),
    }
}

/// A URL that did not parse, with anything that may be a password hidden:
/// the userinfo before `@`, and any query string.
fn redact_raw(url: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((head, _)) => (head, "?***"),
        None => (url, ""),
    };
    let shown = match (head.find("://"), head.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***@{}", &head[..scheme_end], &head[at + 1..])
        }
        (_, Some(at)) => format!("***@{}", &head[at + 1..]),
        (_, None) => head.to_owned(),
    };
    format!("{shown}{query}")
}

/// `text` with every occurrence of `secret` replaced by `***`.
fn scrub(text: &str, secret: Option<&str>) -> String {
    match secret {
        Some(secret) if !secret.is_empty() => text.replace(secret, "***"),
        _ => text.to_owned(),
    }
}

impl Cache for RedisCache {
    async fn close(&self) -> Result<(), CacheError> {
        // Dropping the last handle of an owned connection closes it; a caller's
        // connection lives on in the caller's handles.
        let released = self.lock().take();
        drop(released);
        Ok(())
    }
}

impl KeyValue for RedisCache {
    async fn get(&self, key: &str) -> Result<Option<String>, CacheError> {
        self.run("get", |mut c| async move {
            ::redis::cmd("GET").arg(key).query_async(&mut c).await
        })
        .await
    }

    async fn set(&self, key: &str, value: &str, ttl: Option<Duration>) -> Result<(), CacheError> {
        let cmd = match ttl.map(ttl_ms) {
            None => {
                let mut cmd = ::redis::cmd("SET");
                cmd.arg(key).arg(value);
                cmd
            }
            // A zero TTL stores a value that is dead on arrival: the key ends up empty.
            Some(0) => {
                let mut cmd = ::redis::cmd("DEL");
                cmd.arg(key);
                cmd
            }
            Some(ms) => {
                let mut cmd = ::redis::cmd("SET");
                cmd.arg(key).arg(value).arg("PX").arg(ms);
                cmd
            }
        };
        self.run("set", |mut c| async move { cmd.query_async::<()>(&mut c).await })
            .await
    }

    async fn increment(&self, key: &str, ttl: Option<Duration>) -> Result<i64, CacheError> {
        let ttl = ttl.map(|d| ttl_ms(d).to_string()).unwrap_or_default();
        let reply: Vec<String> = self
            .run("increment", |mut c| async move {
                SCRIPTS.increment.key(key).arg(&ttl).invoke_async(&mut c).await
            })
            .await?;
        match reply.as_slice() {
            [status, value] if status == "ok" => value.parse().map_err(|_| CacheError::Protocol {
                operation: "increment",
                detail: format!("{key} incremented to a non-integer {value:?}"),
            }),
            [status] if status == "not_integer" => Err(CacheError::NotAnInteger { key: key.to_owned() }),
            [status] if status == "overflow" => Err(CacheError::Protocol {
                operation: "increment",
                detail: format!("{key} would overflow"),
            }),
            _ => Err(unexpected("increment", &reply)),
        }
    }

    async fn delete(&self, key: &str) -> Result<(), CacheError> {
        let window = window_key(key);
        let tokens = tokens_key(key);
        let in_flight = in_flight_key(key);
        self.run("delete", |mut c| async move {
            ::redis::cmd("DEL")
                .arg(key)
                .arg(&window)
                .arg(&tokens)
                .arg(&in_flight)
                .query_async::<()>(&mut c)
                .await
        })
        .await
    }
}

fn unexpected(operation: &'static str, reply: &impl std::fmt::Debug) -> CacheError {
    CacheError::Protocol {
        operation,
        detail: format!("unexpected script reply {reply:?}"),
    }
}

impl HitWindow for RedisCache {
    async fn record_hit(&self, key: &str, at: Timestamp, ttl: Duration) -> Result<(), CacheError> {
        let window = window_key(key);
        let at = exact("record_hit", at.as_micros())?;
        let healed: i64 = self
            .run("record_hit", |mut c| async move {
                SCRIPTS
                    .record_hit
                    .key(&window)
                    .arg(at)
                    .arg(duration_us(ttl))
                    .arg(ttl_ms(ttl))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        self.report_healed_window(key, healed == 1);
        Ok(())
    }

    async fn count_since(&self, key: &str, since: Timestamp) -> Result<u64, CacheError> {
        let window = window_key(key);
        let since = exact("count_since", since.as_micros())?;
        self.run("count_since", |mut c| async move {
            SCRIPTS.count_since.key(&window).arg(since).invoke_async(&mut c).await
        })
        .await
    }

    async fn oldest_since(&self, key: &str, since: Timestamp) -> Result<Option<Timestamp>, CacheError> {
        let window = window_key(key);
        let since = exact("oldest_since", since.as_micros())?;
        let reply: Option<String> = self
            .run("oldest_since", |mut c| async move {
                SCRIPTS.oldest_since.key(&window).arg(since).invoke_async(&mut c).await
            })
            .await?;
        reply.map(|s| micros("oldest_since", &s)).transpose()
    }
}

fn micros(operation: &'static str, text: &str) -> Result<Timestamp, CacheError> {
    text.parse()
        .map(Timestamp::from_micros)
        .map_err(|_| CacheError::Protocol {
            operation,
            detail: format!("expected integer microseconds, got {text:?}"),
        })
}

impl LimiterStore for RedisCache {
    async fn acquire_slot(&self, key: &str, request: SlotRequest) -> Result<SlotOutcome, CacheError> {
        let window = window_key(key);
        let now = self.now_arg("acquire_slot", request.now)?;
        let reply: Vec<i64> = self
            .run("acquire_slot", |mut c| async move {
                SCRIPTS
                    .acquire_slot
                    .key(&window)
                    .arg(&now)
                    .arg(duration_us(request.window))
                    .arg(request.limit)
                    .arg(duration_us(request.ttl))
                    .arg(ttl_ms(request.ttl))
                    .arg(duration_us(request.max_ahead))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let stamp = |n: i64| u64::try_from(n).map(Timestamp::from_micros).ok();
        let outcome = match *reply.as_slice() {
            [1, remaining, at, clamped @ (0 | 1), healed @ (0 | 1)] => {
                self.report_healed_window(key, healed == 1);
                u32::try_from(remaining)
                    .ok()
                    .zip(stamp(at))
                    .map(|(remaining, at)| SlotOutcome::Admitted {
                        remaining,
                        at,
                        clamped: clamped == 1,
                    })
            }
            [0, used, retry, at, clamped @ (0 | 1), healed @ (0 | 1)] => {
                self.report_healed_window(key, healed == 1);
                u64::try_from(used)
                    .ok()
                    .zip(u64::try_from(retry).ok())
                    .zip(stamp(at))
                    .map(|((used, retry), at)| SlotOutcome::Refused {
                        used,
                        retry_after: Duration::from_micros(retry),
                        at,
                        clamped: clamped == 1,
                    })
            }
            _ => None,
        };
        outcome.ok_or_else(|| unexpected("acquire_slot", &reply))
    }
}

impl InFlightStore for RedisCache {
    async fn pick_least_loaded(
        &self,
        keys: &[&str],
        weights: &[u32],
        request: PickRequest,
    ) -> Result<Pick, CacheError> {
        check_pick(keys, weights)?;
        let sets: Vec<String> = keys.iter().map(|k| in_flight_key(k)).collect();
        #[cfg(feature = "redis-cluster")]
        if self.connection()?.is_cluster() {
            let names: Vec<&str> = sets.iter().map(String::as_str).collect();
            if let Some((a, b)) = cross_slot(&names) {
                return Err(CacheError::Protocol {
                    operation: "pick_least_loaded",
                    detail: format!(
                        "keys {a:?} and {b:?} hash to different cluster slots; a router's keys must share a hash tag such as `{{prefix}}`"
                    ),
                });
            }
        }
        let now = self.now_arg("pick_least_loaded", request.now)?;
        let reply: Vec<i64> = self
            .run("pick_least_loaded", |mut c| async move {
                let mut call = SCRIPTS.pick_least_loaded.prepare_invoke();
                for set in &sets {
                    call.key(set);
                }
                call.arg(&now)
                    .arg(request.id)
                    .arg(duration_us(request.lease))
                    .arg(ttl_ms(request.lease))
                    .arg(duration_us(request.max_ahead));
                for w in weights {
                    call.arg(*w);
                }
                call.invoke_async(&mut c).await
            })
            .await?;
        let pick = match reply.split_first() {
            Some((&index, counts)) if counts.len() == keys.len() => usize::try_from(index)
                .ok()
                .filter(|i| *i < keys.len())
                .zip(
                    counts
                        .iter()
                        .map(|c| u64::try_from(*c).ok())
                        .collect::<Option<Vec<u64>>>(),
                )
                .map(|(index, counts)| Pick { index, counts }),
            _ => None,
        };
        pick.ok_or_else(|| unexpected("pick_least_loaded", &reply))
    }

    async fn end_in_flight(&self, key: &str, id: u64) -> Result<(), CacheError> {
        let set = in_flight_key(key);
        self.run("end_in_flight", |mut c| async move {
            ::redis::cmd("ZREM").arg(&set).arg(id).query_async::<()>(&mut c).await
        })
        .await
    }
}

impl TokenStore for RedisCache {
    async fn acquire_with_tokens(
        &self,
        key: &str,
        request: SlotRequest,
        ask: TokenAsk,
    ) -> Result<TokenOutcome, CacheError> {
        let window = window_key(key);
        let ledger = tokens_key(key);
        #[cfg(feature = "redis-cluster")]
        if self.connection()?.is_cluster()
            && let Some((a, b)) = cross_slot(&[&window, &ledger])
        {
            return Err(CacheError::Protocol {
                operation: "acquire_with_tokens",
                detail: format!(
                    "keys {a:?} and {b:?} hash to different cluster slots; a key with a `}}` must carry a hash tag such as `{{prefix}}`"
                ),
            });
        }
        let now = self.now_arg("acquire_with_tokens", request.now)?;
        let tokens = exact("acquire_with_tokens", ask.tokens)?;
        let limit = exact("acquire_with_tokens", ask.limit)?;
        let reply: Vec<i64> = self
            .run("acquire_with_tokens", |mut c| async move {
                SCRIPTS
                    .acquire_with_tokens
                    .key(&window)
                    .key(&ledger)
                    .arg(&now)
                    .arg(duration_us(request.window))
                    .arg(request.limit)
                    .arg(duration_us(request.ttl))
                    .arg(ttl_ms(request.ttl))
                    .arg(duration_us(request.max_ahead))
                    .arg(tokens)
                    .arg(limit)
                    .arg(duration_us(ask.lease))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let n = |v: i64| u64::try_from(v).ok();
        let outcome = match *reply.as_slice() {
            [1, remaining, used, at, seq, clamped @ (0 | 1), healed @ (0 | 1)] => {
                self.report_healed_window(key, healed == 1);
                match (u32::try_from(remaining), n(used), n(at), u32::try_from(seq)) {
                    (Ok(remaining), Some(used), Some(at), Ok(seq)) => Some(TokenOutcome::Admitted {
                        remaining,
                        tokens_used: used,
                        reservation: ReservationId {
                            at: Timestamp::from_micros(at),
                            seq,
                        },
                        clamped: clamped == 1,
                    }),
                    _ => None,
                }
            }
            [0, by, requests, used, wait, at, clamped @ (0 | 1), healed @ (0 | 1)] => {
                self.report_healed_window(key, healed == 1);
                let by = match by {
                    1 => Some(RefusedBy::Requests),
                    2 => Some(RefusedBy::Tokens),
                    3 => Some(RefusedBy::Both),
                    4 => Some(RefusedBy::TooLarge),
                    _ => None,
                };
                match (by, n(requests), n(used), n(wait), n(at)) {
                    (Some(by), Some(requests), Some(used), Some(wait), Some(at)) => Some(TokenOutcome::Refused {
                        by,
                        requests_used: requests,
                        tokens_used: used,
                        retry_after: Duration::from_micros(wait),
                        at: Timestamp::from_micros(at),
                        clamped: clamped == 1,
                    }),
                    _ => None,
                }
            }
            _ => None,
        };
        outcome.ok_or_else(|| unexpected("acquire_with_tokens", &reply))
    }

    async fn settle_tokens(&self, key: &str, id: ReservationId, actual: u64) -> Result<bool, CacheError> {
        let ledger = tokens_key(key);
        let at = exact("settle_tokens", id.at.as_micros())?;
        let actual = exact("settle_tokens", actual)?;
        let found: i64 = self
            .run("settle_tokens", |mut c| async move {
                SCRIPTS
                    .settle_tokens
                    .key(&ledger)
                    .arg(at)
                    .arg(id.seq)
                    .arg(actual)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        match found {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(unexpected("settle_tokens", &other)),
        }
    }
}

impl BudgetStore for RedisCache {
    async fn budget_step(
        &self,
        key: &str,
        command: BudgetCommand,
        params: BudgetParams,
        now: Timestamp,
    ) -> Result<BudgetStep, CacheError> {
        let now = self.now_arg("budget_step", now)?;
        let reply: Vec<i64> = self
            .run("budget_step", |mut c| async move {
                SCRIPTS
                    .budget_step
                    .key(key)
                    .arg(&now)
                    .arg(command.as_str())
                    .arg(params.deposit)
                    .arg(params.refill_per_sec)
                    .arg(params.max_balance)
                    .arg(ttl_ms(params.ttl))
                    .arg(duration_us(params.max_ahead))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let step = match *reply.as_slice() {
            [granted @ (0 | 1), balance, stamp, at, healed @ (0 | 1)] => u64::try_from(balance)
                .ok()
                .zip(u64::try_from(stamp).ok())
                .zip(u64::try_from(at).ok())
                .map(|((balance, stamp), at)| BudgetStep {
                    granted: granted == 1,
                    state: BudgetState {
                        balance,
                        stamp: Timestamp::from_micros(stamp),
                    },
                    at: Timestamp::from_micros(at),
                    healed: healed == 1,
                }),
            _ => None,
        };
        let step = step.ok_or_else(|| unexpected("budget_step", &reply))?;
        if step.healed {
            tracing::warn!(server = %self.inner.target, key, "a foreign value at a retry budget was replaced");
        }
        Ok(step)
    }
}

/// The script's spelling of a command: the command, the report's origin, and
/// the probe it names (empty where none).
fn command_args(command: BreakerCommand) -> [String; 4] {
    let origin = |o: Origin| match o {
        Origin::Untracked => ["untracked".to_owned(), String::new(), String::new()],
        Origin::Call => ["call".to_owned(), String::new(), String::new()],
        Origin::Probe(id) => probe_args("probe", id),
    };
    let [name, rest @ ..] = match command {
        BreakerCommand::Allow => ["allow", "", "", ""].map(str::to_owned),
        BreakerCommand::Reset => ["reset", "", "", ""].map(str::to_owned),
        BreakerCommand::CoolDown { .. } => ["cooldown", "", "", ""].map(str::to_owned),
        BreakerCommand::RecordSuccess(o) => {
            let [a, b, c] = origin(o);
            ["success".to_owned(), a, b, c]
        }
        BreakerCommand::RecordFailure(o) => {
            let [a, b, c] = origin(o);
            ["failure".to_owned(), a, b, c]
        }
        BreakerCommand::Release(id) => {
            let [a, b, c] = probe_args("probe", id);
            ["release".to_owned(), a, b, c]
        }
    };
    let [a, b, c] = rest;
    [name, a, b, c]
}

fn probe_args(origin: &str, id: ProbeId) -> [String; 3] {
    [
        origin.to_owned(),
        id.episode.as_micros().to_string(),
        id.seq.to_string(),
    ]
}

/// The script's spelling of a step's permit.
fn permit_as_script(permit: Option<Permit>) -> String {
    match permit {
        None => "-".to_owned(),
        Some(Permit::Call) => "call".to_owned(),
        Some(Permit::Probe(id)) => format!("probe:{}:{}", id.episode.as_micros(), id.seq),
        Some(Permit::Refused {
            state,
            retry_after,
            reason,
        }) => {
            format!(
                "refused:{}:{}:{}",
                state.as_str(),
                duration_us(retry_after),
                reason.as_str()
            )
        }
    }
}

/// The script's spelling of the writes, to compare with `machine::step`'s.
fn writes_as_script(w: &Writes) -> [String; 5] {
    let plain = |w: Write<String>| match w {
        Write::Keep => "keep".to_owned(),
        Write::Delete => "delete".to_owned(),
        Write::Set(s) => s,
    };
    let state = match w.state {
        Write::Keep => Write::Keep,
        Write::Delete => Write::Delete,
        Write::Set(s) => Write::Set(s.as_str().to_owned()),
    };
    let opened = match w.opened_at {
        Write::Keep => Write::Keep,
        Write::Delete => Write::Delete,
        Write::Set(t) => Write::Set(t.as_micros().to_string()),
    };
    let probes = match &w.probes {
        Write::Keep => Write::Keep,
        Write::Delete => Write::Delete,
        Write::Set(leases) => Write::Set(leases.encode()),
    };
    let failures = match w.failures {
        FailuresWrite::Keep => "keep".to_owned(),
        FailuresWrite::Create => "create".to_owned(),
        FailuresWrite::Bump(n) => n.to_string(),
        FailuresWrite::Delete => "delete".to_owned(),
    };
    let cooldown = match w.cooldown_until {
        Write::Keep => Write::Keep,
        Write::Delete => Write::Delete,
        Write::Set(t) => Write::Set(t.as_micros().to_string()),
    };
    [plain(state), failures, plain(opened), plain(probes), plain(cooldown)]
}

/// The cooldown a command asks for, in µs (`0` for every other command).
fn cooldown_arg(command: BreakerCommand) -> u64 {
    match command {
        BreakerCommand::CoolDown { duration } => duration_us(duration),
        _ => 0,
    }
}

impl BreakerStore for RedisCache {
    async fn breaker_step(
        &self,
        keys: &BreakerKeys,
        command: BreakerCommand,
        params: BreakerParams,
        now: Timestamp,
    ) -> Result<BreakerStep, CacheError> {
        const OP: &str = "breaker_step";
        self.one_slot(OP, keys)?;
        let now = self.now_arg(OP, now)?;
        let [name, origin, episode, seq] = command_args(command);
        let reply: Vec<Option<String>> = self
            .run(OP, |mut c| async move {
                SCRIPTS
                    .breaker_step
                    .key(&keys.state)
                    .key(&keys.failures)
                    .key(&keys.opened_at)
                    .key(&keys.probes)
                    .key(&keys.cooldown_until)
                    .arg(&name)
                    .arg(&origin)
                    .arg(&episode)
                    .arg(&seq)
                    .arg(&now)
                    .arg(params.failure_threshold)
                    .arg(duration_us(params.recovery_timeout))
                    .arg(ttl_ms(params.recovery_timeout))
                    .arg(params.half_open_max_calls)
                    .arg(duration_us(params.probe_lease))
                    .arg(cooldown_arg(command))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let [
            Some(before),
            Some(after),
            Some(permit),
            Some(at),
            Some(expired),
            Some(w_state),
            Some(w_failures),
            Some(w_opened),
            Some(w_probes),
            Some(w_cooldown),
            raw_state,
            raw_failures,
            raw_opened,
            raw_probes,
            raw_cooldown,
        ] = <[Option<String>; 15]>::try_from(reply.clone()).map_err(|_| unexpected(OP, &reply))?
        else {
            return Err(unexpected(OP, &reply));
        };
        let at = micros(OP, &at)?;
        self.report_wrong_types(
            keys,
            [&raw_state, &raw_failures, &raw_opened, &raw_probes, &raw_cooldown],
        );
        let snapshot = BreakerSnapshot::decode(
            raw_state.as_deref(),
            raw_failures.as_deref(),
            raw_opened.as_deref(),
            raw_probes.as_deref(),
            raw_cooldown.as_deref(),
        );
        // The script is machine::step in Lua; machine::step stays the
        // definition. Re-run it on what the script read and insist they agree.
        let step = machine::step(&snapshot, command, &params, at);
        let script_says = (
            CircuitState::parse(&before),
            CircuitState::parse(&after),
            permit,
            expired,
            [w_state, w_failures, w_opened, w_probes, w_cooldown],
        );
        let machine_says = (
            Some(step.before),
            Some(step.after),
            permit_as_script(step.permit),
            step.expired_probes.to_string(),
            writes_as_script(&step.writes),
        );
        if script_says != machine_says {
            return Err(CacheError::Protocol {
                operation: OP,
                detail: format!(
                    "breaker script decided {script_says:?} but machine::step decides {machine_says:?} for {snapshot:?}"
                ),
            });
        }
        Ok(step)
    }

    async fn breaker_read(
        &self,
        keys: &BreakerKeys,
        now: Timestamp,
    ) -> Result<(BreakerSnapshot, Timestamp), CacheError> {
        const OP: &str = "breaker_read";
        self.one_slot(OP, keys)?;
        let now = self.now_arg(OP, now)?;
        let reply: Vec<Option<String>> = self
            .run(OP, |mut c| async move {
                SCRIPTS
                    .breaker_read
                    .key(&keys.state)
                    .key(&keys.failures)
                    .key(&keys.opened_at)
                    .key(&keys.probes)
                    .key(&keys.cooldown_until)
                    .arg(&now)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        match reply.as_slice() {
            [Some(at), state, failures, opened_at, probes, cooldown] => Ok({
                self.report_wrong_types(keys, [state, failures, opened_at, probes, cooldown]);
                (
                    BreakerSnapshot::decode(
                        state.as_deref(),
                        failures.as_deref(),
                        opened_at.as_deref(),
                        probes.as_deref(),
                        cooldown.as_deref(),
                    ),
                    micros(OP, at)?,
                )
            }),
            _ => Err(unexpected(OP, &reply)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_share_their_keys_slot() {
        assert_eq!(window_key("w"), "{w}:hits");
        assert_eq!(
            window_key("kg:ratelimit:00000000-0000-0000-0000-000000000001"),
            "{kg:ratelimit:00000000-0000-0000-0000-000000000001}:hits"
        );
        assert_eq!(window_key("{kg:circuit}:state"), "{kg:circuit}:state:hits");
        assert_eq!(window_key("a{b"), "{a{b}:hits");
        assert_eq!(window_key("a}b"), "a}b:hits");
        assert_eq!(window_key("{}x"), "{}x:hits");
    }

    #[cfg(not(feature = "redis-tls"))]
    #[test]
    fn a_tls_url_without_the_feature_says_which_feature() {
        let e = RedisCache::from_url("rediss://:hunter2@127.0.0.1:6380").unwrap_err();
        assert_eq!((e.field, e.expected), ("url", NO_TLS));
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[cfg(feature = "redis-cluster")]
    #[test]
    fn every_script_keeps_its_keys_in_one_cluster_slot() {
        use ::redis::cluster_routing::Slot;
        // A hit window hashes with its key, whatever the key.
        for key in [
            "w",
            "kg:ratelimit:00000000-0000-0000-0000-000000000001",
            "{kg:circuit}:state",
            "a{b",
            "x{y}z",
        ] {
            assert_eq!(Slot::for_key(key), Slot::for_key(window_key(key)), "{key}");
        }
        // The breaker's five keys share the `{prefix}` tag.
        let keys = BreakerKeys::new("kg:circuit:llama");
        assert_eq!(cross_slot(&keys.all()), None);
        // Keys without a common tag are caught (these two differ in slot).
        assert_eq!(cross_slot(&["a", "b"]), Some(("a", "b")));
        assert_eq!(cross_slot(&["{t}a", "{t}b", "c"]), Some(("{t}a", "c")));
    }

    #[test]
    fn hash_tags_need_content() {
        assert!(has_hash_tag("{a}b"));
        assert!(has_hash_tag("x{a}"));
        assert!(!has_hash_tag("{}a"));
        assert!(!has_hash_tag("a{b"));
        assert!(!has_hash_tag("plain"));
    }

    #[test]
    fn unparseable_urls_hide_their_userinfo_and_query() {
        assert_eq!(redact_raw("bogus://user:hunter2@host:1"), "bogus://***@host:1");
        assert_eq!(redact_raw("unix:///tmp/s?pass=hunter2"), "unix:///tmp/s?***");
        assert_eq!(redact_raw("nonsense"), "nonsense");
        assert_eq!(redact_raw("user:hunter2@host"), "***@host");
        assert_eq!(redact_raw("x://a@b?pass=hunter2"), "x://***@b?***");
    }

    /// The error the redis crate makes of a raw RESP error reply.
    fn server_error(reply: &str) -> RedisError {
        match ::redis::parse_redis_value(format!("{reply}\r\n").as_bytes()) {
            Ok(::redis::Value::ServerError(e)) => e.into(),
            other => panic!("{reply} parsed as {other:?}"),
        }
    }

    #[test]
    fn server_errors_that_mean_unavailable_are_classified_by_code() {
        for (reply, code) in [
            ("-OOM command not allowed when used memory > 'maxmemory'.", "OOM"),
            ("-LOADING Redis is loading the dataset in memory", "LOADING"),
            ("-BUSY Redis is busy running a script.", "BUSY"),
            ("-READONLY You can't write against a read only replica.", "READONLY"),
            ("-MASTERDOWN Link with MASTER is down", "MASTERDOWN"),
            ("-CLUSTERDOWN The cluster is down", "CLUSTERDOWN"),
            ("-TRYAGAIN Multiple keys request during rehashing of slot", "TRYAGAIN"),
            // Redis 7: a redis.call inside a script keeps its code.
            (
                "-OOM command not allowed when used memory > 'maxmemory'. script: 37df, on @user_script:1.",
                "OOM",
            ),
            // Older servers wrap it in ERR; the code is still in the text.
            (
                "-ERR Error running script (call to f_37df): @user_script:1: -OOM command not allowed",
                "OOM",
            ),
        ] {
            assert_eq!(
                classify(&server_error(reply)),
                Class::Unavailable(Some(code)),
                "{reply}"
            );
        }
    }

    #[test]
    fn credentials_refused_are_authentication_and_bugs_are_protocol() {
        for reply in [
            "-NOAUTH Authentication required.",
            "-WRONGPASS invalid username-password pair or user is disabled.",
            "-ERR AUTH <password> called without any password configured for the default user.",
        ] {
            assert_eq!(classify(&server_error(reply)), Class::Authentication, "{reply}");
        }
        for reply in [
            "-ERR unknown command 'FOO'",
            "-WRONGTYPE Operation against a key holding the wrong kind of value",
            "-ERR Error running script: @user_script:3: attempt to compare nil with number",
            "-NOPERM this user has no permissions to run the 'evalsha' command",
            // A cluster client follows redirects itself; one reaching the
            // adapter, or keys spanning slots, is a bug.
            "-MOVED 3999 127.0.0.1:6381",
            "-CROSSSLOT Keys in request don't hash to the same slot",
        ] {
            assert_eq!(classify(&server_error(reply)), Class::Protocol, "{reply}");
        }
    }

    #[test]
    fn a_sentinel_without_a_primary_to_name_is_unavailable() {
        for kind in [
            ErrorKind::MasterNameNotFoundBySentinel,
            ErrorKind::NoValidReplicasFoundBySentinel,
            ErrorKind::ClusterConnectionNotFound,
        ] {
            let error = RedisError::from((kind, "no primary now"));
            assert_eq!(classify(&error), Class::Unavailable(None), "{kind:?}");
        }
    }

    #[test]
    fn scrub_replaces_the_secret() {
        assert_eq!(scrub("auth hunter2 failed", Some("hunter2")), "auth *** failed");
        assert_eq!(scrub("nothing", None), "nothing");
        assert_eq!(scrub("nothing", Some("")), "nothing");
    }

    #[test]
    fn ttls_round_up_to_milliseconds() {
        assert_eq!(ttl_ms(Duration::from_micros(1)), 1);
        assert_eq!(ttl_ms(Duration::from_millis(400)), 400);
        assert_eq!(ttl_ms(Duration::ZERO), 0);
        assert_eq!(duration_us(Duration::MAX), MAX_EXACT_MICROS);
    }

    #[test]
    fn every_write_has_a_script_spelling() {
        let w = Writes {
            state: Write::Set(CircuitState::HalfOpen),
            failures: FailuresWrite::Bump(3),
            opened_at: Write::Set(Timestamp::from_micros(12)),
            probes: Write::Delete,
            cooldown_until: Write::Set(Timestamp::from_micros(40)),
        };
        assert_eq!(writes_as_script(&w), ["half_open", "3", "12", "delete", "40"]);
        let id = ProbeId {
            episode: Timestamp::from_micros(7),
            seq: 2,
        };
        assert_eq!(permit_as_script(Some(Permit::Probe(id))), "probe:7:2");
        assert_eq!(
            command_args(BreakerCommand::RecordFailure(Origin::Probe(id))),
            ["failure", "probe", "7", "2"]
        );
        assert_eq!(command_args(BreakerCommand::Allow), ["allow", "", "", ""]);
        assert_eq!(
            writes_as_script(&Writes::NONE),
            ["keep", "keep", "keep", "keep", "keep"]
        );
        let cool = BreakerCommand::CoolDown {
            duration: Duration::from_millis(1500),
        };
        assert_eq!(command_args(cool), ["cooldown", "", "", ""]);
        assert_eq!(cooldown_arg(cool), 1_500_000);
        assert_eq!(cooldown_arg(BreakerCommand::Allow), 0);
        let refused = Permit::Refused {
            state: CircuitState::Closed,
            retry_after: Duration::from_micros(5),
            reason: crate::decide::breaker::Refusal::Cooldown,
        };
        assert_eq!(permit_as_script(Some(refused)), "refused:closed:5:cooldown");
    }
}
