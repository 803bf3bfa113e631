//! `RedisCache`: the cache port on a real Redis (feature `redis`), so a fleet
//! of workers shares one allowance per tenant and one breaker per model
//! server. Every capability of the port is implemented with the same answers
//! as `MemoryCache`, each operation one command or one Lua script on the wire.
//! How it works — the commands and scripts, the key layout, the time source,
//! what happens when Redis is unavailable or a key was damaged, TLS, Cluster
//! and Sentinel — is written up in `docs/redis.md`.

mod breaker;
mod budget;
mod builder;
mod concurrency;
mod connection;
mod error;
mod keys;
mod limiter;
mod scripts;
#[cfg(feature = "redis-tls")]
mod tls;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::redis::RedisError;

use super::{Cache, KeyValue, TimeSource};
use crate::error::{CacheError, ConfigError};
use crate::time::Timestamp;
use connection::{Backend, Conn};
use error::unexpected;
use scripts::SCRIPTS;

pub use builder::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_RECONNECT_RETRIES, DEFAULT_RESPONSE_TIMEOUT, RedisCacheBuilder};
pub use keys::{in_flight_key, tokens_key, window_key};

/// The redis crate's auto-reconnecting connection, which
/// [`RedisCache::from_connection`] accepts.
pub use ::redis::aio::ConnectionManager;

/// The largest instant or duration, in µs, a Lua number holds exactly (2^53).
const MAX_EXACT_MICROS: u64 = 1 << 53;

/// The [`Cache`] port on Redis. Cheap to clone; clones share one connection
/// and one open/closed state.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use redstring::cache::redis::RedisCache;
/// use redstring::{RateLimiter, TenantId, TimeSource};
///
/// let cache = RedisCache::builder()
///     .response_timeout(Duration::from_millis(200))
///     .time_source(TimeSource::Store)
///     .build_from_url("redis://:secret@127.0.0.1:6379/0")?;
/// let limiter = RateLimiter::builder(60).cache(Arc::new(cache)).build()?;
/// limiter.acquire(TenantId::from_u128(7)).await?;
/// # Ok(())
/// # }
/// ```
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

fn micros(operation: &'static str, text: &str) -> Result<Timestamp, CacheError> {
    text.parse()
        .map(Timestamp::from_micros)
        .map_err(|_| CacheError::Protocol {
            operation,
            detail: format!("expected integer microseconds, got {text:?}"),
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_milliseconds() {
        assert_eq!(ttl_ms(Duration::from_micros(1)), 1);
        assert_eq!(ttl_ms(Duration::from_millis(400)), 400);
        assert_eq!(ttl_ms(Duration::ZERO), 0);
        assert_eq!(duration_us(Duration::MAX), MAX_EXACT_MICROS);
    }
}
