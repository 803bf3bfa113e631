//! A fleet of two services, each its own stack of tower layers over its own
//! connection to one real Redis: they share one circuit and one per-tenant
//! limit, and a probe one of them drops goes back to the whole fleet at
//! once.

use std::sync::Arc;
use std::time::Duration;

use tower_test::mock::{self, Spawn};

use crate::support::redis::{LiveRedis, bounded, wait};
use crate::tower::{Inner, Reply, Req, ready, refused, secs, tenant_of, through};
use redstring::cache::redis::RedisCache;
use redstring::tower::{
    BoxError, CircuitBreakerLayer, CircuitBreakerService, ErrIsFailure, RateLimitLayer, RateLimitService,
};
use redstring::{
    CircuitBreaker, CircuitOpen, CircuitState, Clock, Env, ManualClock, RateLimitExceeded, RateLimiter, SystemClock,
};
use testkit::redis::RedisServer;

type Member = CircuitBreakerService<
    RateLimitService<mock::Mock<Req, &'static str>, fn(&Req) -> redstring::TenantId, RedisCache>,
    ErrIsFailure,
    RedisCache,
>;

/// One member of the fleet: the breaker over the limiter over its own model
/// client, both keeping their state in `server` through a connection of its
/// own, on the fleet's `clock`.
fn member(
    server: &RedisServer,
    clock: &Arc<ManualClock>,
    threshold: u32,
    rpm: u32,
) -> (Spawn<Member>, Inner, Arc<CircuitBreaker<RedisCache>>) {
    let cache = Arc::new(server.cache());
    let breaker = CircuitBreaker::builder()
        .failure_threshold(threshold)
        .recovery_timeout(secs(30))
        .key_prefix("fleet:circuit:gpu")
        .cache(cache.clone())
        .env(Env::default().with_clock(clock.clone()))
        .build()
        .unwrap();
    let breaker = Arc::new(breaker);
    let limiter = RateLimiter::builder(rpm)
        .key_prefix("fleet:rpm")
        .cache(cache)
        .env(Env::default().with_clock(clock.clone()))
        .build()
        .unwrap();
    let tenant: fn(&Req) -> redstring::TenantId = tenant_of;
    let layers = tower::ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(breaker.clone(), ErrIsFailure))
        .layer(RateLimitLayer::new(Arc::new(limiter), tenant));
    let (svc, inner) = mock::spawn_layer(layers);
    (svc, inner, breaker)
}

/// Caller-stamped on a manual clock at the present, so the test moves time.
fn fleet_clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(SystemClock.now()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_services_share_one_limit_and_one_circuit_through_redis() {
    let Some(server) = RedisServer::start() else { return };
    let clock = fleet_clock();
    let (mut a, mut a_inner, a_breaker) = member(&server, &clock, 2, 3);
    let (mut b, mut b_inner, b_breaker) = member(&server, &clock, 2, 3);

    // One limit: tenant 1 has three calls a minute, whichever member makes
    // them; the fourth is refused on either, another tenant is not.
    bounded(through(&mut a, &mut a_inner, (1, "q"), Reply::Ok("ok")))
        .await
        .unwrap();
    bounded(through(&mut b, &mut b_inner, (1, "q"), Reply::Ok("ok")))
        .await
        .unwrap();
    bounded(through(&mut a, &mut a_inner, (1, "q"), Reply::Ok("ok")))
        .await
        .unwrap();
    for error in [
        bounded(refused(&mut b, &mut b_inner, (1, "q"))).await,
        bounded(refused(&mut a, &mut a_inner, (1, "q"))).await,
    ] {
        assert!(error.is::<RateLimitExceeded>(), "{error}");
    }

    // One circuit: a failure on each member is the fleet's two (threshold
    // 2), and it is open for both.
    bounded(through(&mut a, &mut a_inner, (2, "q"), Reply::Err("boom")))
        .await
        .unwrap_err();
    assert_eq!(b_breaker.state().await.unwrap(), CircuitState::Closed);
    bounded(through(&mut b, &mut b_inner, (3, "q"), Reply::Err("boom")))
        .await
        .unwrap_err();
    assert_eq!(a_breaker.state().await.unwrap(), CircuitState::Open);
    let error = bounded(refused(&mut a, &mut a_inner, (4, "q"))).await;
    assert!(error.is::<CircuitOpen>(), "{error}");

    // After the recovery timeout one probe goes through for the fleet: while
    // b's is in flight, a is refused; b's success closes the circuit for a.
    clock.advance(secs(30));
    ready(&mut b);
    let probe = tokio::spawn(b.call((4, "probe")));
    let (_, respond) = bounded(b_inner.next_request()).await.unwrap();
    let error = bounded(refused(&mut a, &mut a_inner, (5, "q"))).await;
    assert!(error.is::<CircuitOpen>(), "{error}");
    respond.send_response("ok");
    assert_eq!(bounded(probe).await.unwrap().unwrap(), "ok");
    assert_eq!(a_breaker.state().await.unwrap(), CircuitState::Closed);
    bounded(through(&mut a, &mut a_inner, (5, "q"), Reply::Ok("ok")))
        .await
        .unwrap();
}

/// Calls `svc` until the layers let a call reach the inner service, for at
/// most two seconds of real time (the manual clock stands still): the
/// inner service's request, answered `ok`, and the refusals before it.
async fn first_admitted(svc: &mut Spawn<Member>, inner: &mut Inner, req: Req) -> Result<usize, BoxError> {
    let mut refusals = 0;
    loop {
        ready(svc);
        let mut call = tokio::spawn(svc.call(req));
        tokio::select! {
            request = inner.next_request() => {
                let (_, respond) = request.expect("the inner service is called");
                respond.send_response("ok");
                call.await.unwrap()?;
                return Ok(refusals);
            }
            ended = &mut call => {
                let error = ended.unwrap().unwrap_err();
                if !error.is::<CircuitOpen>() || refusals >= 200 {
                    return Err(error);
                }
                refusals += 1;
                wait(Duration::from_millis(10)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_one_service_drops_is_the_next_services_at_once_through_redis() {
    let Some(server) = RedisServer::start() else { return };
    let clock = fleet_clock();
    let (mut a, mut a_inner, a_breaker) = member(&server, &clock, 1, 100);
    let (mut b, mut b_inner, _) = member(&server, &clock, 1, 100);
    bounded(through(&mut a, &mut a_inner, (1, "q"), Reply::Err("boom")))
        .await
        .unwrap_err();
    clock.advance(secs(30));

    // a's probe is admitted and in flight; while it is, b is refused.
    ready(&mut a);
    let probe = tokio::spawn(a.call((1, "probe")));
    let (_, unanswered) = bounded(a_inner.next_request()).await.unwrap();
    assert_eq!(a_breaker.state().await.unwrap(), CircuitState::HalfOpen);
    let error = bounded(refused(&mut b, &mut b_inner, (2, "q"))).await;
    assert!(error.is::<CircuitOpen>(), "{error}");

    // a's caller gives up. The store does not answer within the drop, so
    // the release runs on the runtime: b probes as soon as it lands, with
    // the clock still — the probe's 30 s lease has not run out.
    probe.abort();
    assert!(probe.await.unwrap_err().is_cancelled());
    drop(unanswered);
    bounded(first_admitted(&mut b, &mut b_inner, (2, "q")))
        .await
        .expect("b probes without the lease running out");
    assert_eq!(a_breaker.state().await.unwrap(), CircuitState::Closed);
}
