//! The network between the laboratory's workers and its servers: one TCP
//! proxy per link, so a scenario's link latency, partitions and latency
//! faults act on real connections as the simulated network applies them.
//!
//! On loopback a request takes microseconds where the simulated network
//! takes the scenario's `[network]` latency on every message, and a
//! partition or a latency fault names a link the real network has no way
//! to cut or slow. A [`Link`] sits on that link: it forwards each chunk it
//! reads in either direction after a one-way latency drawn from the
//! scenario's range as the simulated network draws it ([`Network`]: most
//! near its fastest; from the repetition's own stream, so a run is
//! repeatable), or the fault's fixed latency once one is set; cut, it
//! forwards nothing: a chunk that would cross while it is cut is lost, and
//! its connection with it (as a simulated request whose message was lost
//! waits for its timeout), and a connection opened while it is cut is
//! accepted and answered by nothing. A connection that was idle through
//! the cut works again once it is healed.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use rand::SeedableRng as _;
use rand_chacha::ChaCha8Rng;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::scenario::Network;

/// What a link does to what crosses it.
struct State {
    /// The server's address.
    upstream: SocketAddr,
    /// The one-way latency range each chunk draws from, milliseconds.
    range: Cell<(u64, u64)>,
    /// Whether the link is cut.
    cut: Cell<bool>,
    rng: std::cell::RefCell<ChaCha8Rng>,
}

impl State {
    fn delay(&self) -> Duration {
        let (low, high) = self.range.get();
        Duration::from_millis(Network::draw_ms(low, high, &mut *self.rng.borrow_mut()))
    }
}

/// One worker-to-server link, listening on a loopback port of its own; its
/// tasks are local to the laboratory's thread and end when it is dropped.
pub struct Link {
    port: u16,
    state: Rc<State>,
    accepting: JoinHandle<()>,
}

impl Link {
    /// A link to `upstream` whose chunks each take a latency drawn from
    /// `min_ms..=max_ms` (seeded by `seed`); call it on a `LocalSet`.
    pub async fn open(upstream: SocketAddr, (min_ms, max_ms): (u64, u64), seed: u64) -> std::io::Result<Link> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let state = Rc::new(State {
            upstream,
            range: Cell::new((min_ms, max_ms.max(min_ms))),
            cut: Cell::new(false),
            rng: std::cell::RefCell::new(ChaCha8Rng::seed_from_u64(seed)),
        });
        let accepting = tokio::task::spawn_local(accept(listener, state.clone()));
        Ok(Link { port, state, accepting })
    }

    /// The address clients use in place of the server's.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Cuts the link (a partition): nothing crosses it until [`Link::heal`].
    pub fn cut(&self) {
        self.state.cut.set(true);
    }

    /// Restores a cut link for new connections.
    pub fn heal(&self) {
        self.state.cut.set(false);
    }

    /// Sets the link's one-way latency (a latency fault).
    pub fn set_latency(&self, ms: u64) {
        self.state.range.set((ms, ms));
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Accepts connections until aborted; each is forwarded, or held unanswered
/// while the link is cut. Aborting it ends every connection.
async fn accept(listener: TcpListener, state: Rc<State>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                let _ = client.set_nodelay(true);
                connections.spawn_local(forward(client, state.clone()));
            }
        }
    }
}

/// One connection across the link, both directions, until either side
/// closes or a cut ends it.
async fn forward(client: TcpStream, state: Rc<State>) {
    if state.cut.get() {
        // Accepted, and answered by nothing: the client waits for its timeout.
        let mut client = client;
        let _ = tokio::io::copy(&mut client, &mut tokio::io::sink()).await;
        return;
    }
    let Ok(server) = TcpStream::connect(state.upstream).await else {
        return;
    };
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        () = pump(client_read, server_write, &state) => {}
        () = pump(server_read, client_write, &state) => {}
    }
}

/// Copies `from` into `to`, each chunk after its latency, in order, until
/// `from` ends; a chunk due while the link is cut is lost, and nothing
/// more is forwarded: it ends when `from` does.
async fn pump(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, state: &State) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        tokio::time::sleep(state.delay()).await;
        if state.cut.get() {
            // Lost in the partition: swallow everything until this side
            // leaves, then close the other.
            let _ = tokio::io::copy(&mut from, &mut tokio::io::sink()).await;
            return;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `test` on a current-thread runtime's `LocalSet` with an echo
    /// server on loopback.
    fn with_echo(test: impl AsyncFnOnce(SocketAddr)) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        tokio::task::LocalSet::new().block_on(&runtime, async {
            let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let at = echo.local_addr().unwrap();
            tokio::task::spawn_local(async move {
                loop {
                    let (mut s, _) = echo.accept().await.unwrap();
                    tokio::task::spawn_local(async move {
                        let (mut r, mut w) = s.split();
                        let _ = tokio::io::copy(&mut r, &mut w).await;
                    });
                }
            });
            test(at).await;
        });
    }

    async fn round_trip(stream: &mut TcpStream, within: Duration) -> Option<Duration> {
        let start = tokio::time::Instant::now();
        stream.write_all(b"ping").await.ok()?;
        let mut answer = [0u8; 4];
        tokio::time::timeout(within, stream.read_exact(&mut answer))
            .await
            .ok()?
            .ok()?;
        assert_eq!(&answer, b"ping");
        Some(start.elapsed())
    }

    /// A link draws a message's latency as the simulated network does:
    /// between 1 and 5 ms, 1.4 ms on average (turmoil's `min + ⌊(max −
    /// min) · E⌋`, `E` exponential of rate 5: `Σₖ e^(−5k/4)` above the
    /// fastest), not 3 ms as a uniform draw would.
    #[test]
    fn a_link_draws_latency_as_the_simulated_network_does() {
        let state = State {
            upstream: SocketAddr::from(([127, 0, 0, 1], 1)),
            range: Cell::new((1, 5)),
            cut: Cell::new(false),
            rng: std::cell::RefCell::new(ChaCha8Rng::seed_from_u64(7)),
        };
        let draws: Vec<u128> = (0..20_000).map(|_| state.delay().as_millis()).collect();
        assert!(draws.iter().all(|ms| (1..=5).contains(ms)), "within the range");
        let mean = draws.iter().sum::<u128>() as f64 / draws.len() as f64;
        let expected = 1.0 + (1..=4).map(|k| (-5.0 * f64::from(k) / 4.0).exp()).sum::<f64>();
        assert!(
            (mean - expected).abs() < 0.03,
            "mean {mean:.3} ms, expected {expected:.3}"
        );
        assert!(draws.contains(&5), "the slowest is reached");
        state.range.set((3, 3));
        assert_eq!(state.delay(), Duration::from_millis(3));
    }

    #[test]
    fn a_link_delays_each_way_and_a_cut_loses_what_crosses_it() {
        with_echo(async |echo| {
            let link = Link::open(echo, (40, 40), 1).await.unwrap();
            let connect = || TcpStream::connect(("127.0.0.1", link.port()));
            let mut busy = connect().await.unwrap();
            let mut idle = connect().await.unwrap();
            let took = round_trip(&mut busy, Duration::from_secs(5)).await.unwrap();
            assert!(took >= Duration::from_millis(80), "40 ms each way: {took:?}");
            assert!(round_trip(&mut idle, Duration::from_secs(5)).await.is_some());

            link.cut();
            assert_eq!(round_trip(&mut busy, Duration::from_millis(300)).await, None, "lost");
            let mut opened_in_the_cut = connect().await.unwrap();
            assert_eq!(
                round_trip(&mut opened_in_the_cut, Duration::from_millis(300)).await,
                None
            );

            link.heal();
            assert!(
                round_trip(&mut idle, Duration::from_secs(5)).await.is_some(),
                "idle through the cut, it works again"
            );
            let mut fresh = connect().await.unwrap();
            assert!(round_trip(&mut fresh, Duration::from_secs(5)).await.is_some());
            assert_eq!(
                round_trip(&mut busy, Duration::from_millis(300)).await,
                None,
                "what was lost stays lost"
            );

            link.set_latency(200);
            let took = round_trip(&mut fresh, Duration::from_secs(5)).await.unwrap();
            assert!(
                took >= Duration::from_millis(400),
                "a latency fault replaces the range: {took:?}"
            );
        });
    }
}
