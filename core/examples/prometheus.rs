//! The hardening's metrics served for Prometheus to scrape: a breaker and a
//! limiter report through `MetricsObserver`, a Prometheus recorder keeps the
//! series, and `/metrics` serves them as text.
//!
//! ```text
//! cargo run -p redstring --features metrics --example prometheus -- 127.0.0.1:9464
//! curl http://127.0.0.1:9464/metrics
//! ```
//!
//! A short outage is played first on a manual clock (a server that fails
//! three times opens the breaker; a tenant over its rpm is refused), so the
//! page has something to show; then the example serves until stopped.

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use redstring::metrics::MetricsObserver;
use redstring::{CircuitBreaker, Env, ManualClock, RateLimiter, TenantId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let address = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:9464".into());
    let handle = PrometheusBuilder::new().install_recorder()?;

    let env = Env::default()
        .with_clock(Arc::new(ManualClock::at_fixed_epoch()))
        .with_observer(Arc::new(MetricsObserver::new()));
    let breaker = CircuitBreaker::builder()
        .failure_threshold(3)
        .recovery_timeout(Duration::from_secs(30))
        .key_prefix("kg:circuit:gpu")
        .env(env.clone())
        .build()?;
    for _ in 0..4 {
        let permit = breaker.admit().await;
        if permit.is_admitted() {
            breaker.record_failure_for(&permit).await?;
        }
    }
    let limiter = RateLimiter::builder(2).env(env).build()?;
    for _ in 0..3 {
        let _ = limiter.acquire(TenantId::from_u128(7)).await;
    }

    let listener = tokio::net::TcpListener::bind(&address).await?;
    println!("serving http://{address}/metrics");
    loop {
        let (mut socket, _) = listener.accept().await?;
        let mut request = [0u8; 1024];
        let n = socket.read(&mut request).await.unwrap_or(0);
        let found = request[..n].starts_with(b"GET /metrics ");
        let (status, body) = if found {
            ("200 OK", handle.render())
        } else {
            ("404 Not Found", "try /metrics\n".to_owned())
        };
        let response = format!(
            "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = socket.write_all(response.as_bytes()).await;
    }
}
