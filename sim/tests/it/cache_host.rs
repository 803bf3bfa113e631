//! The cache host and `RemoteCache` over turmoil: the port's compliance suite,
//! partitions, crashes and the store's own clock.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use redstring::cache::{KeyValue, LimiterStore, SlotRequest};
use redstring::decide::window::SlotOutcome;
use redstring::testing::{Harness, run_all};
use redstring::{CacheError, Clock, TimeSource, Timestamp};
use redstring_sim::hosts::cache_host::{RemoteCache, cache_host};
use redstring_sim::hosts::clock::{EPOCH, SimClock, sim_elapsed};
use redstring_sim::scenario::ClockSpec;

use crate::support::sim;

const TIMEOUT: Duration = Duration::from_millis(250);

/// A cache host on the default clock whose entries its callers stamp.
fn caller_stamped() -> impl Fn() -> redstring_sim::hosts::cache_host::HostFuture {
    cache_host(SimClock::new(ClockSpec::default()), TimeSource::Caller)
}

/// The suite's view of a remote cache: every check gets an emptied host, and
/// time passes by sleeping on turmoil's virtual clock.
struct Remote;

impl Harness for Remote {
    type Cache = RemoteCache;

    async fn cache(&self) -> Arc<RemoteCache> {
        let cache = RemoteCache::new("cache", TIMEOUT);
        cache.flush_all().await.expect("flush the cache host");
        Arc::new(cache)
    }

    async fn advance(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    fn now(&self) -> Timestamp {
        SimClock::new(ClockSpec::default()).now()
    }
}

#[test]
fn remote_cache_passes_the_compliance_suite() {
    let mut sim = sim(5, 600);
    sim.host("cache", caller_stamped());
    sim.client("suite", async {
        run_all(&Remote).await;
        Ok(())
    });
    sim.run().unwrap();
}

type Log = Rc<RefCell<Vec<(Duration, Result<Option<String>, String>)>>>;

fn unavailable(r: &Result<Option<String>, String>) -> bool {
    r.as_ref().is_err_and(|e| e.starts_with("cache unavailable during get"))
}

#[test]
fn a_partitioned_cache_is_unavailable_within_the_timeout_and_back_after_repair() {
    let mut sim = sim(5, 60);
    sim.host("cache", caller_stamped());
    let log: Log = Rc::default();
    let client_log = log.clone();
    sim.client("worker", async move {
        let cache = RemoteCache::new("cache", TIMEOUT);
        cache.set("k", "v", None).await.unwrap();
        // The partition holds from 2 s to 4 s.
        for at in [1, 3, 5] {
            tokio::time::sleep(Duration::from_secs(at).saturating_sub(sim_elapsed())).await;
            let started = sim_elapsed();
            let got = cache.get("k").await.map_err(|e| e.to_string());
            client_log.borrow_mut().push((sim_elapsed() - started, got));
        }
        Ok(())
    });
    let (mut cut, mut healed) = (false, false);
    while !sim.step().unwrap() {
        if !cut && sim.elapsed() >= Duration::from_secs(2) {
            sim.partition("worker", "cache");
            cut = true;
        }
        if !healed && sim.elapsed() >= Duration::from_secs(4) {
            sim.repair("worker", "cache");
            healed = true;
        }
    }
    let log = log.borrow();
    assert_eq!(log[0].1, Ok(Some("v".into())));
    assert!(unavailable(&log[1].1), "{log:?}");
    assert!(
        log[1].0 <= TIMEOUT + Duration::from_millis(10),
        "gave up within the timeout (one tick of slack): {log:?}"
    );
    assert_eq!(log[2].1, Ok(Some("v".into())), "the partition lost nothing");
}

#[test]
fn a_crashed_cache_is_unavailable_and_comes_back_empty() {
    let mut sim = sim(5, 60);
    sim.host("cache", caller_stamped());
    let log: Log = Rc::default();
    let client_log = log.clone();
    sim.client("worker", async move {
        let cache = RemoteCache::new("cache", TIMEOUT);
        cache.set("k", "v", None).await.unwrap();
        assert_eq!(cache.increment("n", None).await.unwrap(), 1);
        // Down from 2 s to 4 s.
        for at in [1, 3, 5] {
            tokio::time::sleep(Duration::from_secs(at).saturating_sub(sim_elapsed())).await;
            let started = sim_elapsed();
            let got = cache.get("k").await.map_err(|e| e.to_string());
            client_log.borrow_mut().push((sim_elapsed() - started, got));
        }
        assert_eq!(cache.increment("n", None).await.unwrap(), 1, "the counter started over");
        Ok(())
    });
    let (mut down, mut up) = (false, false);
    while !sim.step().unwrap() {
        if !down && sim.elapsed() >= Duration::from_secs(2) {
            sim.crash("cache");
            down = true;
        }
        if !up && sim.elapsed() >= Duration::from_secs(4) {
            sim.bounce("cache");
            up = true;
        }
    }
    let log = log.borrow();
    assert_eq!(log[0].1, Ok(Some("v".into())));
    assert!(unavailable(&log[1].1), "{log:?}");
    assert!(log[1].0 <= TIMEOUT + Duration::from_millis(10), "{log:?}");
    assert_eq!(log[2].1, Ok(None), "a restarted in-memory store is empty");
}

#[test]
fn host_errors_come_back_as_their_variant_and_a_closed_client_is_closed() {
    let mut sim = sim(5, 30);
    sim.host("cache", caller_stamped());
    sim.client("worker", async {
        let cache = RemoteCache::new("cache", TIMEOUT);
        cache.set("k", "text", None).await.unwrap();
        match cache.increment("k", None).await {
            Err(CacheError::NotAnInteger { key }) => assert_eq!(key, "k"),
            other => panic!("expected NotAnInteger, got {other:?}"),
        }
        let other = RemoteCache::new("cache", TIMEOUT);
        redstring::Cache::close(&cache).await.unwrap();
        assert!(matches!(cache.get("k").await, Err(CacheError::Closed)));
        assert_eq!(
            other.get("k").await.unwrap().as_deref(),
            Some("text"),
            "closing one client leaves the host serving the others"
        );
        let nowhere = RemoteCache::new("no-such-host", TIMEOUT);
        assert!(matches!(
            nowhere.get("k").await,
            Err(CacheError::Unavailable { operation: "get", .. })
        ));
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn a_store_stamped_cache_uses_the_hosts_own_clock() {
    let mut sim = sim(5, 30);
    let cache_clock = SimClock::new(ClockSpec {
        offset_ms: 5_000,
        drift_ppm: 0,
    });
    sim.host("cache", cache_host(cache_clock.clone(), TimeSource::Store));
    sim.client("worker", async move {
        let cache = RemoteCache::new("cache", TIMEOUT);
        // The caller stamps the start of the run; the cache runs 5 s ahead.
        let caller_now = EPOCH;
        let request = SlotRequest {
            now: caller_now,
            window: Duration::from_secs(60),
            limit: 1,
            ttl: Duration::from_secs(120),
            max_ahead: Duration::ZERO,
        };
        let sent = cache_clock.now();
        let SlotOutcome::Admitted { remaining: 0, at, .. } = cache.acquire_slot("t", request).await.unwrap() else {
            panic!("first acquire admits")
        };
        assert!(
            at >= sent && at <= cache_clock.now(),
            "stamped by the cache host's clock ({at:?}), not the caller's"
        );
        assert!(matches!(
            cache.acquire_slot("t", request).await.unwrap(),
            SlotOutcome::Refused { used: 1, .. }
        ));
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn a_remote_cache_keeps_its_connection_open_between_operations() {
    // Every segment takes 20 ms, at 1 ms steps: a new connection costs its
    // SYN's 20 ms before the request's own round trip of 40 ms.
    let latency = redstring_sim::scenario::Network {
        min_latency_ms: 20,
        max_latency_ms: 20,
    };
    let mut sim =
        redstring_sim::world::sim_builder(5, Duration::from_millis(1), &latency, Duration::from_secs(60)).build();
    sim.host("cache", caller_stamped());
    let took: Rc<RefCell<Vec<Duration>>> = Rc::default();
    let client_took = took.clone();
    sim.client("worker", async move {
        let cache = RemoteCache::new("cache", Duration::from_secs(1));
        for _ in 0..3 {
            let started = sim_elapsed();
            cache.set("k", "v", None).await.unwrap();
            client_took.borrow_mut().push(sim_elapsed() - started);
        }
        Ok(())
    });
    sim.run().unwrap();
    let took = took.borrow();
    let ms = |d: Duration| d.as_millis();
    assert!(
        ms(took[0]) >= 60 && ms(took[1]) <= 41 && ms(took[2]) <= 41,
        "one connect, then one round trip each: {took:?}"
    );
}

#[test]
fn a_pooled_connection_the_restarted_host_no_longer_knows_is_retried_on_a_new_one() {
    let mut sim = sim(5, 60);
    sim.host("cache", caller_stamped());
    let log: Log = Rc::default();
    let client_log = log.clone();
    sim.client("worker", async move {
        let cache = RemoteCache::new("cache", TIMEOUT);
        cache.set("k", "v", None).await.unwrap();
        // Cut off from 2 s to 4 s, so the crash's goodbye never arrives: the
        // idle connection looks open here, and the restarted host resets it.
        tokio::time::sleep(Duration::from_secs(5).saturating_sub(sim_elapsed())).await;
        let started = sim_elapsed();
        let got = cache.get("k").await.map_err(|e| e.to_string());
        client_log.borrow_mut().push((sim_elapsed() - started, got));
        Ok(())
    });
    let mut done = [false; 4];
    while !sim.step().unwrap() {
        let t = sim.elapsed();
        for (i, at) in [2000, 2500, 3000, 4000].into_iter().enumerate() {
            if !done[i] && t >= Duration::from_millis(at) {
                match i {
                    0 => sim.partition("worker", "cache"),
                    1 => sim.crash("cache"),
                    2 => sim.bounce("cache"),
                    _ => sim.repair("worker", "cache"),
                }
                done[i] = true;
            }
        }
    }
    let log = log.borrow();
    assert_eq!(log[0].1, Ok(None), "the operation ran on a new connection: {log:?}");
    assert!(log[0].0 < TIMEOUT, "without waiting out the timeout: {log:?}");
}

#[test]
fn the_cache_host_closes_a_connection_no_request_arrives_on() {
    use redstring_sim::hosts::cache_host::{HOST_IDLE_TIMEOUT, PORT};
    use tokio::io::AsyncReadExt;
    let mut sim = sim(5, 400);
    sim.host("cache", caller_stamped());
    let closed_after: Rc<RefCell<Option<Duration>>> = Rc::default();
    let client_closed = closed_after.clone();
    sim.client("gone-quiet", async move {
        let mut stream = turmoil::net::TcpStream::connect(("cache", PORT)).await?;
        let opened = sim_elapsed();
        let mut byte = [0u8; 1];
        let n = stream.read(&mut byte).await?;
        assert_eq!(n, 0, "the host ends the connection without a word");
        *client_closed.borrow_mut() = Some(sim_elapsed() - opened);
        Ok(())
    });
    sim.run().unwrap();
    let after = closed_after.borrow().expect("the host closed the connection");
    assert!(
        after >= HOST_IDLE_TIMEOUT && after < HOST_IDLE_TIMEOUT + Duration::from_secs(1),
        "closed after {after:?}"
    );
}

#[test]
fn the_cache_host_answers_a_frame_it_cannot_decode_and_ends_one_too_long() {
    use redstring_sim::hosts::cache_host::{MAX_FRAME, PORT, WireError, WireReply, WireRequest};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    /// Sends `value` as a frame: its length, then its bytes.
    async fn send(stream: &mut turmoil::net::TcpStream, value: &[u8]) -> turmoil::Result {
        stream.write_all(&u32::try_from(value.len())?.to_be_bytes()).await?;
        stream.write_all(value).await?;
        Ok(())
    }
    /// Reads one reply frame.
    async fn reply(stream: &mut turmoil::net::TcpStream) -> turmoil::Result<WireReply> {
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).await?;
        let mut reply = vec![0; u32::from_be_bytes(len) as usize];
        stream.read_exact(&mut reply).await?;
        Ok(postcard::from_bytes(&reply)?)
    }
    let mut sim = sim(5, 60);
    sim.host("cache", caller_stamped());
    sim.client("hostile", async move {
        let mut stream = turmoil::net::TcpStream::connect(("cache", PORT)).await?;
        // One byte no request begins with: an operation numbered past the last.
        send(&mut stream, &[0x7f]).await?;
        match reply(&mut stream).await? {
            WireReply::Error(WireError::Protocol { operation, .. }) => assert_eq!(operation, "decode"),
            other => panic!("answered {other:?}"),
        }
        // The connection still serves.
        send(
            &mut stream,
            &postcard::to_stdvec(&WireRequest::Get { key: "k".into() })?,
        )
        .await?;
        assert_eq!(reply(&mut stream).await?, WireReply::Value(None));
        // A frame that claims more than the host reads ends it, before
        // anything more is read.
        let too_long = u32::try_from(MAX_FRAME + 1)?.to_be_bytes();
        stream.write_all(&too_long).await?;
        let mut byte = [0u8; 1];
        assert_eq!(stream.read(&mut byte).await?, 0, "the host ends the connection");
        Ok(())
    });
    sim.run().unwrap();
}
