//! A shared cache host on the simulated network, and the client that reaches it.
//!
//! A fleet that shares its limiter and breaker state depends on a cache that
//! is itself a network peer: it can be partitioned away, crash and come back
//! empty, or answer late. [`cache_host`] runs redstring's own
//! [`MemoryCache`] behind a small wire protocol on
//! turmoil TCP port [`PORT`], on the cache host's own [`SimClock`] (so skew and
//! [`TimeSource::Store`] behave as with Redis `TIME`). [`RemoteCache`]
//! implements every capability of the cache port — `KeyValue`, `HitWindow`,
//! `LimiterStore::acquire_slot`, `BreakerStore::{breaker_step, breaker_read}` —
//! by calling it, so the core's components run unchanged against a cache that
//! fails like a real one.
//!
//! # Protocol
//!
//! Length-prefixed frames: the client writes one [`WireRequest`], the host
//! answers one [`WireReply`], each a frame — its length in four bytes, big
//! end first, then the value in [postcard](https://docs.rs/postcard)'s
//! encoding; a connection carries any number of such exchanges, one at a
//! time. The breaker's and the limiter's own types travel as they are,
//! through the core's `serde` feature, so a change to them needs no edit
//! here. Key/value and hit-window instants and durations travel as whole
//! microseconds. A frame longer than [`MAX_FRAME`] bytes ends the
//! connection; one that does not decode is answered with a protocol error.
//! The wire is compact rather than readable: a fleet sends a few of these
//! per call.
//!
//! # Failures
//!
//! [`RemoteCache`] keeps its connections open between operations, as a
//! Redis client's pool does: an operation takes the most recently used idle
//! one, unless the host has closed it meanwhile (it crashed, or closed it
//! after [`HOST_IDLE_TIMEOUT`]) or it idled past [`IDLE_TIMEOUT`], else opens
//! a new one; an operation whose reused connection turns out closed before
//! the host read its request goes out once more on a new one. Each operation
//! is bounded by the client's `timeout` on virtual time, and a connection
//! that failed or timed out is closed, never reused. A refused or reset
//! connection, a reply that does not arrive in time (a partition, a hang)
//! and a connection closed before the reply all become
//! [`CacheError::Unavailable`] naming the port operation; the host's own
//! errors come back as the matching [`CacheError`] variant (`NotAnInteger`,
//! `Protocol`). `close` closes the client only: the host serves the rest of
//! the fleet. A client holds at most
//! [`MAX_OPEN_CONNECTIONS`](crate::hosts::transport::MAX_OPEN_CONNECTIONS)
//! connections, counting those it closed within `TIME_WAIT`, and its
//! turmoil host's share; an operation beyond that is `Unavailable` at once,
//! as on a host out of ports, rather than exhausting or reusing turmoil's
//! ephemeral ports.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redstring::cache::{
    BreakerStore, BudgetStore, HitWindow, InFlightStore, KeyValue, LimiterStore, SlotRequest, TokenStore,
};
use redstring::decide::breaker::{BreakerCommand, BreakerKeys, BreakerParams, BreakerSnapshot, BreakerStep};
use redstring::decide::budget::{BudgetCommand, BudgetParams, BudgetStep};
use redstring::decide::concurrency::{ConcurrencyCommand, ConcurrencyParams, ConcurrencyStep};
use redstring::decide::pick::{Pick, PickRequest};
use redstring::decide::tokens::{ReservationId, TokenAsk, TokenOutcome};
use redstring::decide::window::SlotOutcome;
use redstring::{Cache, CacheError, MemoryCache, TimeSource, Timestamp};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use turmoil::net::TcpStream;

use crate::hosts::clock::SimClock;
use crate::hosts::clock::sim_elapsed;
use crate::hosts::transport::{ConnectionLimit, ConnectionPermit, IDLE_TIMEOUT, TIME_WAIT};

/// The port the cache host listens on.
pub const PORT: u16 = 6379;

/// How long the cache host keeps a connection no request arrives on, as
/// Redis's `timeout` setting does: longer than a client keeps one idle
/// ([`IDLE_TIMEOUT`]), so it only ends connections whose client left
/// unheard.
pub const HOST_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The longest frame accepted, in bytes (requests and replies).
pub const MAX_FRAME: usize = 1 << 20;

/// The read buffer of each end of a connection, in bytes: a frame is tens
/// to a few hundred, and a fleet keeps thousands of connections open, each
/// of which would hold the 8 KiB a buffered reader takes by default (a
/// longer frame is read in more than one go).
const READ_BUFFER: usize = 1024;

/// The factory type [`cache_host`] returns, as `Sim::host` takes it.
pub type HostFuture = Pin<Box<dyn Future<Output = turmoil::Result> + 'static>>;

/// A turmoil host serving the cache port from a `MemoryCache` whose TTLs (and,
/// under [`TimeSource::Store`], whose stamps) run on `clock`.
///
/// Pass the result to `Sim::host("cache", ...)`. Each start begins with an
/// empty store: a restart after a crash loses everything, as a restarted
/// in-memory store does.
pub fn cache_host(clock: SimClock, time_source: TimeSource) -> impl Fn() -> HostFuture {
    move || {
        let clock = clock.clone();
        Box::pin(async move {
            let store = Arc::new(Mutex::new(MemoryCache::with_time_source(
                Arc::new(clock.clone()),
                time_source,
            )));
            let listener = turmoil::net::TcpListener::bind((IpAddr::from(Ipv4Addr::UNSPECIFIED), PORT)).await?;
            loop {
                let (stream, _) = listener.accept().await?;
                let (store, clock) = (store.clone(), clock.clone());
                tokio::spawn(async move {
                    // A connection's end — a client done, gone or partitioned — is
                    // not the host's failure.
                    let _ = serve_connection(stream, &store, &clock, time_source).await;
                });
            }
        })
    }
}

async fn serve_connection(
    stream: TcpStream,
    store: &Mutex<MemoryCache>,
    clock: &SimClock,
    time_source: TimeSource,
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::with_capacity(READ_BUFFER, read);
    loop {
        let Ok(frame) = tokio::time::timeout(HOST_IDLE_TIMEOUT, read_frame(&mut reader)).await else {
            // Idle too long: a client that went away unheard (its goodbye
            // lost in a partition) leaves no connection open for ever.
            return Ok(());
        };
        let Ok(Some(frame)) = frame else {
            // End of stream, or a frame cut short or too long to be ours.
            return Ok(());
        };
        let reply = match postcard::from_bytes::<WireRequest>(&frame) {
            Ok(request) => {
                // The store is cloned out so no lock is held across an await.
                let cache = store.lock().unwrap_or_else(|p| p.into_inner()).clone();
                match request {
                    WireRequest::FlushAll => {
                        *store.lock().unwrap_or_else(|p| p.into_inner()) =
                            MemoryCache::with_time_source(Arc::new(clock.clone()), time_source);
                        WireReply::Done
                    }
                    request => execute(&cache, request).await.unwrap_or_else(WireReply::from),
                }
            }
            Err(e) => WireReply::Error(WireError::Protocol {
                operation: "decode".into(),
                detail: e.to_string(),
            }),
        };
        let out = encode(&reply).map_err(std::io::Error::other)?;
        write.write_all(&out).await?;
    }
}

/// `value` as one frame: its length, then its encoding.
fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, String> {
    let mut frame = postcard::to_extend(value, vec![0; 4]).map_err(|e| e.to_string())?;
    let len = frame_len(frame.len() - 4)?;
    frame[..4].copy_from_slice(&len.to_be_bytes());
    Ok(frame)
}

/// `len` as a frame's length, if a frame may be that long.
fn frame_len(len: usize) -> Result<u32, String> {
    u32::try_from(len)
        .ok()
        .filter(|_| len <= MAX_FRAME)
        .ok_or_else(|| format!("a frame of {len} bytes, over {MAX_FRAME}"))
}

/// Why a frame could not be read.
#[derive(Debug)]
enum FrameError {
    /// Reading failed before the frame's first byte.
    Unread(std::io::Error),
    /// The stream failed or ended inside the frame, or its length is over
    /// [`MAX_FRAME`].
    Partial(String),
}

/// Reads one frame's value: `None` when the stream ends before its first
/// byte.
async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Option<Vec<u8>>, FrameError> {
    let mut header = [0u8; 4];
    let mut got = 0;
    while got < header.len() {
        match reader.read(&mut header[got..]).await {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(FrameError::Partial("the stream ended inside a frame's length".into())),
            Ok(n) => got += n,
            Err(e) if got == 0 => return Err(FrameError::Unread(e)),
            Err(e) => return Err(FrameError::Partial(e.to_string())),
        }
    }
    let len = u32::from_be_bytes(header) as usize;
    frame_len(len).map_err(FrameError::Partial)?;
    let mut value = vec![0; len];
    reader
        .read_exact(&mut value)
        .await
        .map_err(|e| FrameError::Partial(e.to_string()))?;
    Ok(Some(value))
}

async fn execute(cache: &MemoryCache, request: WireRequest) -> Result<WireReply, CacheError> {
    Ok(match request {
        WireRequest::Get { key } => WireReply::Value(cache.get(&key).await?),
        WireRequest::Set { key, value, ttl_us } => {
            cache.set(&key, &value, ttl_us.map(Duration::from_micros)).await?;
            WireReply::Done
        }
        WireRequest::Increment { key, ttl_us } => {
            WireReply::Int(cache.increment(&key, ttl_us.map(Duration::from_micros)).await?)
        }
        WireRequest::Delete { key } => {
            cache.delete(&key).await?;
            WireReply::Done
        }
        WireRequest::RecordHit { key, at_us, ttl_us } => {
            cache
                .record_hit(&key, Timestamp::from_micros(at_us), Duration::from_micros(ttl_us))
                .await?;
            WireReply::Done
        }
        WireRequest::CountSince { key, since_us } => {
            WireReply::Count(cache.count_since(&key, Timestamp::from_micros(since_us)).await?)
        }
        WireRequest::OldestSince { key, since_us } => WireReply::Instant(
            cache
                .oldest_since(&key, Timestamp::from_micros(since_us))
                .await?
                .map(Timestamp::as_micros),
        ),
        WireRequest::AcquireSlot { key, request } => WireReply::Slot(cache.acquire_slot(&key, request).await?),
        WireRequest::BreakerStep {
            keys,
            command,
            params,
            now,
        } => WireReply::Step(cache.breaker_step(&keys, command, params, now).await?),
        WireRequest::BreakerRead { keys, now } => {
            let (snapshot, at) = cache.breaker_read(&keys, now).await?;
            WireReply::Snapshot { snapshot, at }
        }
        WireRequest::BudgetStep {
            key,
            command,
            params,
            now,
        } => WireReply::Budget(cache.budget_step(&key, command, params, now).await?),
        WireRequest::AcquireWithTokens { key, request, ask } => {
            WireReply::Tokens(cache.acquire_with_tokens(&key, request, ask).await?)
        }
        WireRequest::SettleTokens { key, id, actual } => {
            WireReply::Settled(cache.settle_tokens(&key, id, actual).await?)
        }
        WireRequest::PickLeastLoaded { keys, weights, request } => {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            WireReply::Picked(cache.pick_least_loaded(&keys, &weights, request).await?)
        }
        WireRequest::EndInFlight { key, id } => {
            cache.end_in_flight(&key, id).await?;
            WireReply::Done
        }
        WireRequest::ConcurrencyStep {
            key,
            command,
            params,
            request,
        } => WireReply::Concurrency(cache.concurrency_step(&key, command, params, request).await?),
        WireRequest::FlushAll => WireReply::Done,
    })
}

/// The client side: the whole cache port, over the network, each operation
/// bounded by `timeout` of virtual time, on connections kept open between
/// operations as a Redis client's pool keeps them.
///
/// Only usable from inside a turmoil host. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct RemoteCache {
    host: String,
    timeout: Duration,
    closed: AtomicBool,
    open: Arc<ConnectionLimit>,
    /// Open connections no operation is using, the most recently used last.
    idle: Mutex<Vec<Connection>>,
}

/// One open connection to the cache host, the port it holds and when it
/// was last used.
#[derive(Debug)]
struct Connection {
    stream: BufReader<TcpStream>,
    permit: ConnectionPermit,
    since: Duration,
}

impl RemoteCache {
    /// A client for the cache host named `host`, giving up on an operation
    /// (as [`CacheError::Unavailable`]) after `timeout`, on a turmoil host of
    /// its own.
    pub fn new(host: impl Into<String>, timeout: Duration) -> Self {
        RemoteCache::on(host, timeout, ConnectionLimit::host(TIME_WAIT))
    }

    /// Like [`RemoteCache::new`], on a turmoil host whose ports `ports`
    /// counts ([`ConnectionLimit::host`]).
    pub fn on(host: impl Into<String>, timeout: Duration, ports: Arc<ConnectionLimit>) -> Self {
        RemoteCache {
            host: host.into(),
            timeout,
            closed: AtomicBool::new(false),
            open: Arc::new(ConnectionLimit::within(ports)),
            idle: Mutex::default(),
        }
    }

    /// The cache host's name.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The per-operation timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Empties the cache host for every client, like Redis `FLUSHALL` (for
    /// tests that need a fresh store without restarting the host).
    pub async fn flush_all(&self) -> Result<(), CacheError> {
        match self.call("flush_all", WireRequest::FlushAll).await? {
            WireReply::Done => Ok(()),
            other => Err(unexpected("flush_all", &other)),
        }
    }

    /// The most recently used idle connection still open at both ends and
    /// idle for less than [`IDLE_TIMEOUT`]; those it passes over are closed.
    fn checkout(&self) -> Option<Connection> {
        let now = sim_elapsed();
        loop {
            let mut conn = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
            if now.saturating_sub(conn.since) >= IDLE_TIMEOUT {
                continue;
            }
            if peer_closed(conn.stream.get_mut()) {
                conn.permit.closed_by_peer();
                continue;
            }
            return Some(conn);
        }
    }

    /// A new connection to the cache host, within the client's and its
    /// host's limits.
    async fn connect(&self) -> Result<Connection, String> {
        let permit = self
            .open
            .take()
            .map_err(|exhausted| format!("its client to {} {exhausted}", self.host))?;
        let stream = TcpStream::connect((self.host.as_str(), PORT))
            .await
            .map_err(|e| format!("connecting to {}: {e}", self.host))?;
        Ok(Connection {
            stream: BufReader::with_capacity(READ_BUFFER, stream),
            permit,
            since: sim_elapsed(),
        })
    }

    async fn call(&self, operation: &'static str, request: WireRequest) -> Result<WireReply, CacheError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(CacheError::Closed);
        }
        let unavailable = |reason: String| CacheError::Unavailable { operation, reason };
        let frame = encode(&request).map_err(|detail| CacheError::Protocol { operation, detail })?;
        let exchange = async {
            if let Some(mut conn) = self.checkout() {
                match exchange(&mut conn, &frame).await {
                    Ok(reply) => return Ok((conn, reply)),
                    // The host closed or lost this connection before it read
                    // the request (it crashed, or closed it as idle): the
                    // operation never ran, so it goes out on a new one, as a
                    // pooled client retries a request its connection never
                    // took.
                    Err(Failure::Unread(_) | Failure::Broken(_)) => conn.permit.closed_by_peer(),
                    Err(Failure::Partial(reason)) => return Err(reason),
                }
            }
            let mut conn = self.connect().await?;
            match exchange(&mut conn, &frame).await {
                Ok(reply) => Ok((conn, reply)),
                Err(Failure::Unread(reason) | Failure::Broken(reason) | Failure::Partial(reason)) => Err(reason),
            }
        };
        let reply = match tokio::time::timeout(self.timeout, exchange).await {
            Ok(Ok((mut conn, reply))) => {
                conn.since = sim_elapsed();
                self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(conn);
                reply
            }
            Ok(Err(reason)) => return Err(unavailable(reason)),
            Err(_) => return Err(unavailable(format!("no reply within {:?}", self.timeout))),
        };
        match postcard::from_bytes::<WireReply>(&reply) {
            Ok(WireReply::Error(e)) => Err(e.into_cache_error(operation)),
            Ok(reply) => Ok(reply),
            Err(e) => Err(CacheError::Protocol {
                operation,
                detail: e.to_string(),
            }),
        }
    }
}

/// Why an exchange on one connection failed.
enum Failure {
    /// The connection was closed or reset with no byte of a reply: the
    /// request was never read.
    Unread(String),
    /// Sending failed: nothing reached the host.
    Broken(String),
    /// The reply began but did not end as a frame.
    Partial(String),
}

/// Sends the frame `request` on `conn` and reads one reply frame.
async fn exchange(conn: &mut Connection, request: &[u8]) -> Result<Vec<u8>, Failure> {
    conn.stream
        .get_mut()
        .write_all(request)
        .await
        .map_err(|e| Failure::Broken(format!("sending: {e}")))?;
    match read_frame(&mut conn.stream).await {
        Ok(Some(reply)) => Ok(reply),
        Ok(None) => Err(Failure::Unread("connection closed before the reply".to_owned())),
        Err(FrameError::Unread(e)) => Err(Failure::Unread(format!("reading the reply: {e}"))),
        Err(FrameError::Partial(e)) => Err(Failure::Partial(format!("reading the reply: {e}"))),
    }
}

/// Whether the peer has closed or reset `stream`, as far as this side has
/// heard: a read would end at once.
fn peer_closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    let mut buf = tokio::io::ReadBuf::new(&mut byte);
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    // Nothing is ever sent unasked, so any readable byte or end means the
    // connection is no longer one to send a request on.
    !matches!(stream.poll_peek(&mut cx, &mut buf), std::task::Poll::Pending)
}

fn unexpected(operation: &'static str, reply: &WireReply) -> CacheError {
    CacheError::Protocol {
        operation,
        detail: format!("unexpected reply {reply:?}"),
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Cache for RemoteCache {
    async fn close(&self) -> Result<(), CacheError> {
        self.closed.store(true, Ordering::SeqCst);
        Ok(())
    }
}

impl KeyValue for RemoteCache {
    async fn get(&self, key: &str) -> Result<Option<String>, CacheError> {
        match self.call("get", WireRequest::Get { key: key.to_owned() }).await? {
            WireReply::Value(v) => Ok(v),
            other => Err(unexpected("get", &other)),
        }
    }

    async fn set(&self, key: &str, value: &str, ttl: Option<Duration>) -> Result<(), CacheError> {
        let request = WireRequest::Set {
            key: key.to_owned(),
            value: value.to_owned(),
            ttl_us: ttl.map(micros),
        };
        match self.call("set", request).await? {
            WireReply::Done => Ok(()),
            other => Err(unexpected("set", &other)),
        }
    }

    async fn increment(&self, key: &str, ttl: Option<Duration>) -> Result<i64, CacheError> {
        let request = WireRequest::Increment {
            key: key.to_owned(),
            ttl_us: ttl.map(micros),
        };
        match self.call("increment", request).await? {
            WireReply::Int(n) => Ok(n),
            other => Err(unexpected("increment", &other)),
        }
    }

    async fn delete(&self, key: &str) -> Result<(), CacheError> {
        match self.call("delete", WireRequest::Delete { key: key.to_owned() }).await? {
            WireReply::Done => Ok(()),
            other => Err(unexpected("delete", &other)),
        }
    }
}

impl HitWindow for RemoteCache {
    async fn record_hit(&self, key: &str, at: Timestamp, ttl: Duration) -> Result<(), CacheError> {
        let request = WireRequest::RecordHit {
            key: key.to_owned(),
            at_us: at.as_micros(),
            ttl_us: micros(ttl),
        };
        match self.call("record_hit", request).await? {
            WireReply::Done => Ok(()),
            other => Err(unexpected("record_hit", &other)),
        }
    }

    async fn count_since(&self, key: &str, since: Timestamp) -> Result<u64, CacheError> {
        let request = WireRequest::CountSince {
            key: key.to_owned(),
            since_us: since.as_micros(),
        };
        match self.call("count_since", request).await? {
            WireReply::Count(n) => Ok(n),
            other => Err(unexpected("count_since", &other)),
        }
    }

    async fn oldest_since(&self, key: &str, since: Timestamp) -> Result<Option<Timestamp>, CacheError> {
        let request = WireRequest::OldestSince {
            key: key.to_owned(),
            since_us: since.as_micros(),
        };
        match self.call("oldest_since", request).await? {
            WireReply::Instant(at) => Ok(at.map(Timestamp::from_micros)),
            other => Err(unexpected("oldest_since", &other)),
        }
    }
}

impl LimiterStore for RemoteCache {
    async fn acquire_slot(&self, key: &str, request: SlotRequest) -> Result<SlotOutcome, CacheError> {
        let request = WireRequest::AcquireSlot {
            key: key.to_owned(),
            request,
        };
        match self.call("acquire_slot", request).await? {
            WireReply::Slot(outcome) => Ok(outcome),
            other => Err(unexpected("acquire_slot", &other)),
        }
    }

    #[cfg(feature = "mutants")]
    fn hit_window(&self) -> Option<&impl HitWindow> {
        Some(self)
    }
}

impl BreakerStore for RemoteCache {
    async fn breaker_step(
        &self,
        keys: &BreakerKeys,
        command: BreakerCommand,
        params: BreakerParams,
        now: Timestamp,
    ) -> Result<BreakerStep, CacheError> {
        let request = WireRequest::BreakerStep {
            keys: keys.clone(),
            command,
            params,
            now,
        };
        match self.call("breaker_step", request).await? {
            WireReply::Step(step) => Ok(step),
            other => Err(unexpected("breaker_step", &other)),
        }
    }

    async fn breaker_read(
        &self,
        keys: &BreakerKeys,
        now: Timestamp,
    ) -> Result<(BreakerSnapshot, Timestamp), CacheError> {
        let request = WireRequest::BreakerRead {
            keys: keys.clone(),
            now,
        };
        match self.call("breaker_read", request).await? {
            WireReply::Snapshot { snapshot, at } => Ok((snapshot, at)),
            other => Err(unexpected("breaker_read", &other)),
        }
    }
}

impl InFlightStore for RemoteCache {
    async fn pick_least_loaded(
        &self,
        keys: &[&str],
        weights: &[u32],
        request: PickRequest,
    ) -> Result<Pick, CacheError> {
        let request = WireRequest::PickLeastLoaded {
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            weights: weights.to_vec(),
            request,
        };
        match self.call("pick_least_loaded", request).await? {
            WireReply::Picked(pick) => Ok(pick),
            other => Err(unexpected("pick_least_loaded", &other)),
        }
    }

    async fn end_in_flight(&self, key: &str, id: u64) -> Result<(), CacheError> {
        let request = WireRequest::EndInFlight {
            key: key.to_owned(),
            id,
        };
        match self.call("end_in_flight", request).await? {
            WireReply::Done => Ok(()),
            other => Err(unexpected("end_in_flight", &other)),
        }
    }

    async fn concurrency_step(
        &self,
        key: &str,
        command: ConcurrencyCommand,
        params: ConcurrencyParams,
        request: PickRequest,
    ) -> Result<ConcurrencyStep, CacheError> {
        let request = WireRequest::ConcurrencyStep {
            key: key.to_owned(),
            command,
            params,
            request,
        };
        match self.call("concurrency_step", request).await? {
            WireReply::Concurrency(step) => Ok(step),
            other => Err(unexpected("concurrency_step", &other)),
        }
    }
}

impl TokenStore for RemoteCache {
    async fn acquire_with_tokens(
        &self,
        key: &str,
        request: SlotRequest,
        ask: TokenAsk,
    ) -> Result<TokenOutcome, CacheError> {
        let request = WireRequest::AcquireWithTokens {
            key: key.to_owned(),
            request,
            ask,
        };
        match self.call("acquire_with_tokens", request).await? {
            WireReply::Tokens(outcome) => Ok(outcome),
            other => Err(unexpected("acquire_with_tokens", &other)),
        }
    }

    async fn settle_tokens(&self, key: &str, id: ReservationId, actual: u64) -> Result<bool, CacheError> {
        let request = WireRequest::SettleTokens {
            key: key.to_owned(),
            id,
            actual,
        };
        match self.call("settle_tokens", request).await? {
            WireReply::Settled(found) => Ok(found),
            other => Err(unexpected("settle_tokens", &other)),
        }
    }
}

impl BudgetStore for RemoteCache {
    async fn budget_step(
        &self,
        key: &str,
        command: BudgetCommand,
        params: BudgetParams,
        now: Timestamp,
    ) -> Result<BudgetStep, CacheError> {
        let request = WireRequest::BudgetStep {
            key: key.to_owned(),
            command,
            params,
            now,
        };
        match self.call("budget_step", request).await? {
            WireReply::Budget(step) => Ok(step),
            other => Err(unexpected("budget_step", &other)),
        }
    }
}

/// One request frame: a port operation and its arguments.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum WireRequest {
    /// `KeyValue::get`.
    Get {
        /// The key.
        key: String,
    },
    /// `KeyValue::set`.
    Set {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// The TTL, microseconds.
        ttl_us: Option<u64>,
    },
    /// `KeyValue::increment`.
    Increment {
        /// The key.
        key: String,
        /// The TTL on creation, microseconds.
        ttl_us: Option<u64>,
    },
    /// `KeyValue::delete`.
    Delete {
        /// The key.
        key: String,
    },
    /// `HitWindow::record_hit`.
    RecordHit {
        /// The key.
        key: String,
        /// The hit, epoch microseconds.
        at_us: u64,
        /// The series' lifetime, microseconds.
        ttl_us: u64,
    },
    /// `HitWindow::count_since`.
    CountSince {
        /// The key.
        key: String,
        /// The inclusive start, epoch microseconds.
        since_us: u64,
    },
    /// `HitWindow::oldest_since`.
    OldestSince {
        /// The key.
        key: String,
        /// The inclusive start, epoch microseconds.
        since_us: u64,
    },
    /// `LimiterStore::acquire_slot`.
    AcquireSlot {
        /// The key.
        key: String,
        /// What to decide.
        request: SlotRequest,
    },
    /// `BreakerStore::breaker_step`.
    BreakerStep {
        /// The breaker's keys.
        keys: BreakerKeys,
        /// The command.
        command: BreakerCommand,
        /// The breaker's parameters.
        params: BreakerParams,
        /// The caller's now.
        now: Timestamp,
    },
    /// `BreakerStore::breaker_read`.
    BreakerRead {
        /// The breaker's keys.
        keys: BreakerKeys,
        /// The caller's now.
        now: Timestamp,
    },
    /// `BudgetStore::budget_step`.
    BudgetStep {
        /// The bucket's key.
        key: String,
        /// Deposit or withdraw.
        command: BudgetCommand,
        /// The bucket's numbers.
        params: BudgetParams,
        /// The caller's now.
        now: Timestamp,
    },
    /// `TokenStore::acquire_with_tokens`.
    AcquireWithTokens {
        /// The key.
        key: String,
        /// The slot to decide.
        request: SlotRequest,
        /// The tokens to reserve.
        ask: TokenAsk,
    },
    /// `TokenStore::settle_tokens`.
    SettleTokens {
        /// The key.
        key: String,
        /// The reservation.
        id: ReservationId,
        /// The tokens used.
        actual: u64,
    },
    /// `InFlightStore::pick_least_loaded`.
    PickLeastLoaded {
        /// The deployments' keys.
        keys: Vec<String>,
        /// One weight per key.
        weights: Vec<u32>,
        /// The call and its lease.
        request: PickRequest,
    },
    /// `InFlightStore::end_in_flight`.
    EndInFlight {
        /// The key.
        key: String,
        /// The call's id.
        id: u64,
    },
    /// `InFlightStore::concurrency_step`.
    ConcurrencyStep {
        /// The deployment's key.
        key: String,
        /// Admit, or end a call.
        command: ConcurrencyCommand,
        /// The limit's settings.
        params: ConcurrencyParams,
        /// The call and its lease.
        request: PickRequest,
    },
    /// Empty the store (Redis `FLUSHALL`).
    FlushAll,
}

/// One reply frame.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum WireReply {
    /// Done, nothing to return.
    Done,
    /// A value, or none.
    Value(Option<String>),
    /// A counter's new value.
    Int(i64),
    /// A number of hits.
    Count(u64),
    /// An instant, epoch microseconds, or none.
    Instant(Option<u64>),
    /// A limiter decision.
    Slot(SlotOutcome),
    /// A breaker step.
    Step(BreakerStep),
    /// A retry budget's step.
    Budget(BudgetStep),
    /// A slot and token decision.
    Tokens(TokenOutcome),
    /// Whether a settled reservation was found.
    Settled(bool),
    /// A router's pick.
    Picked(Pick),
    /// An adaptive concurrency step.
    Concurrency(ConcurrencyStep),
    /// A breaker read.
    Snapshot {
        /// What is stored.
        snapshot: BreakerSnapshot,
        /// The instant to judge it at.
        at: Timestamp,
    },
    /// The operation failed on the host.
    Error(WireError),
}

/// A [`CacheError`] raised on the host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum WireError {
    /// [`CacheError::NotAnInteger`].
    NotAnInteger {
        /// The key.
        key: String,
    },
    /// [`CacheError::Closed`].
    Closed,
    /// [`CacheError::Unavailable`] (the host's own store could not answer).
    Unavailable {
        /// The operation, as the host named it.
        operation: String,
        /// Why.
        reason: String,
    },
    /// [`CacheError::Protocol`], or anything else.
    Protocol {
        /// The operation, as the host named it.
        operation: String,
        /// What was wrong.
        detail: String,
    },
}

impl From<CacheError> for WireReply {
    fn from(e: CacheError) -> Self {
        WireReply::Error(match e {
            CacheError::NotAnInteger { key } => WireError::NotAnInteger { key },
            CacheError::Closed => WireError::Closed,
            CacheError::Unavailable { operation, reason } => WireError::Unavailable {
                operation: operation.to_owned(),
                reason,
            },
            CacheError::Protocol { operation, detail } => WireError::Protocol {
                operation: operation.to_owned(),
                detail,
            },
            other => WireError::Protocol {
                operation: "unknown".into(),
                detail: other.to_string(),
            },
        })
    }
}

impl WireError {
    /// The client-side error, named by the client's `operation`.
    fn into_cache_error(self, operation: &'static str) -> CacheError {
        match self {
            WireError::NotAnInteger { key } => CacheError::NotAnInteger { key },
            WireError::Closed => CacheError::Closed,
            WireError::Unavailable { reason, .. } => CacheError::Unavailable { operation, reason },
            WireError::Protocol { detail, .. } => CacheError::Protocol { operation, detail },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `value` through a frame and back.
    async fn round_trip<T: Serialize + serde::de::DeserializeOwned>(value: &T) -> T {
        let frame = encode(value).unwrap();
        let mut read = frame.as_slice();
        let back = read_frame(&mut read).await.unwrap().unwrap();
        assert!(read.is_empty(), "one frame is read whole, and no more");
        postcard::from_bytes(&back).unwrap()
    }

    #[tokio::test]
    async fn a_breaker_snapshot_survives_the_wire() {
        let snapshot = BreakerSnapshot::decode([
            Some("half_open"),
            Some("2"),
            Some("1700000000.5"),
            None,
            Some("1700000000750000"),
            Some("3"),
            Some("1699999990000000"),
        ]);
        let reply = WireReply::Snapshot {
            snapshot: snapshot.clone(),
            at: Timestamp::from_micros(1_700_000_000_250_000),
        };
        assert_eq!(round_trip(&reply).await, reply);
    }

    #[tokio::test]
    async fn host_errors_survive_the_wire() {
        for error in [
            WireError::NotAnInteger { key: "n".into() },
            WireError::Closed,
            WireError::Unavailable {
                operation: "get".into(),
                reason: "down".into(),
            },
            WireError::Protocol {
                operation: "decode".into(),
                detail: "bad".into(),
            },
        ] {
            let reply = WireReply::Error(error);
            assert_eq!(round_trip(&reply).await, reply);
        }
        let request = WireRequest::Increment {
            key: "n".into(),
            ttl_us: Some(5),
        };
        assert_eq!(round_trip(&request).await, request);
    }

    #[test]
    fn a_frame_is_its_length_then_its_value() {
        let request = WireRequest::Get { key: "ab".into() };
        let frame = encode(&request).unwrap();
        let value = postcard::to_stdvec(&request).unwrap();
        assert_eq!(frame[..4], u32::try_from(value.len()).unwrap().to_be_bytes());
        assert_eq!(frame[4..], value);
    }

    #[tokio::test]
    async fn a_stream_that_ends_between_frames_ends_cleanly_and_inside_one_does_not() {
        let mut empty: &[u8] = &[];
        assert!(matches!(read_frame(&mut empty).await, Ok(None)));
        let frame = encode(&WireRequest::Get { key: "ab".into() }).unwrap();
        for cut in [2, 4, frame.len() - 1] {
            let mut short = &frame[..cut];
            assert!(
                matches!(read_frame(&mut short).await, Err(FrameError::Partial(_))),
                "cut at {cut} of {}",
                frame.len()
            );
        }
    }

    #[tokio::test]
    async fn a_frame_over_the_limit_is_refused_before_it_is_read() {
        let too_long = u32::try_from(MAX_FRAME + 1).unwrap().to_be_bytes();
        let mut read = too_long.as_slice();
        match read_frame(&mut read).await {
            Err(FrameError::Partial(why)) => assert!(why.contains("over"), "{why}"),
            other => panic!("read {other:?}"),
        }
        let at_limit = u32::try_from(MAX_FRAME).unwrap().to_be_bytes();
        let mut read = at_limit.as_slice();
        // The length is accepted; the value is then missing.
        match read_frame(&mut read).await {
            Err(FrameError::Partial(why)) => assert!(!why.contains("over"), "{why}"),
            other => panic!("read {other:?}"),
        }
    }
}
