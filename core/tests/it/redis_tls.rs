//! `RedisCache` over TLS (`rediss://`) against a TLS-only redis-server with a
//! CA the test makes: the compliance suite and a fleet race over TLS, the
//! typed failures of a plain connection to the TLS port, of an untrusted
//! server and of a missing client certificate, mutual TLS, and that no
//! password or key material reaches an error or `Debug` output.

use std::time::Duration;

use crate::support;
use crate::support::redis::{LiveRedis, OnLive, bounded};
use redstring::cache::KeyValue;
use redstring::cache::redis::RedisCache;
use redstring::testing::run_all;
use redstring::{CacheError, TenantId};
use testkit::redis::{ClientAuth, TlsServer, pki_only};

const PASSWORD: &str = "tls-hunter2-secret";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cache_over_tls_passes_the_compliance_suite() {
    let Some(server) = TlsServer::start(ClientAuth::Optional, Some(PASSWORD)) else {
        return;
    };
    run_all(&OnLive(server)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_tasks_over_five_tls_connections_admit_exactly_rpm() {
    let Some(server) = TlsServer::start(ClientAuth::Optional, None) else {
        return;
    };
    let (admitted, limited, limiters) = support::redis::race_one_tenant(|| server.cache(), 5, 50, 10).await;
    let tenant = TenantId::from_u128(42);
    assert_eq!((admitted, limited), (10, 40));
    assert_eq!(limiters[0].remaining(tenant).await.unwrap(), 0);
}

/// Asserts `result` is `Unavailable` and returns its reason.
fn unavailable<T: std::fmt::Debug>(result: Result<T, CacheError>) -> String {
    match result {
        Err(CacheError::Unavailable { reason, .. }) => reason,
        other => panic!("expected CacheError::Unavailable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_tcp_to_the_tls_port_fails_unavailable_within_the_operation_timeout() {
    let Some(server) = TlsServer::start(ClientAuth::Optional, None) else {
        return;
    };
    let builder = RedisCache::builder()
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500));
    let limit = builder.operation_timeout();
    let cache = builder
        .build_from_url(&format!("redis://127.0.0.1:{}", server.port()))
        .unwrap();
    // Not a hang: the answer comes within the operation timeout (plus slack).
    let reason = unavailable(
        tokio::time::timeout(limit + Duration::from_millis(500), cache.get("k"))
            .await
            .expect("a plain connection to the TLS port hung past the operation timeout"),
    );
    assert!(
        reason.contains(&format!("redis://127.0.0.1:{}", server.port())),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_the_ca_file_does_not_vouch_for_is_refused() {
    let Some(server) = TlsServer::start(ClientAuth::Optional, None) else {
        return;
    };
    let cache = RedisCache::builder()
        .tls_ca_file(server.pki().other_ca())
        .build_from_url(&server.url())
        .unwrap();
    let reason = unavailable(bounded(cache.get("k")).await);
    assert!(reason.to_lowercase().contains("certificate"), "{reason}");
    // The platform's roots do not know the test's CA either.
    let cache = RedisCache::from_url(&server.url()).unwrap();
    let reason = unavailable(bounded(cache.get("k")).await);
    assert!(reason.to_lowercase().contains("certificate"), "{reason}");
    // Whereas the right CA file is trusted.
    let cache = server.cache();
    bounded(cache.set("k", "v", None)).await.unwrap();
    assert_eq!(bounded(cache.get("k")).await.unwrap().as_deref(), Some("v"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_admits_a_client_certificate_and_refuses_its_absence() {
    let Some(server) = TlsServer::start(ClientAuth::Required, None) else {
        return;
    };
    let without = RedisCache::builder()
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .tls_ca_file(server.pki().ca())
        .build_from_url(&server.url())
        .unwrap();
    let reason = unavailable(bounded(without.set("k", "v", None)).await);
    assert!(reason.to_lowercase().contains("certificate"), "{reason}");
    assert_eq!(server.command(&["EXISTS", "k"]).as_deref(), Some(":0\r\n"));

    let with = server.cache();
    bounded(with.set("k", "v", None)).await.unwrap();
    assert_eq!(bounded(with.get("k")).await.unwrap().as_deref(), Some("v"));
    assert_eq!(bounded(with.increment("n", None)).await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_password_or_key_material_appears_in_errors_or_debug() {
    let Some(server) = TlsServer::start(ClientAuth::Required, Some(PASSWORD)) else {
        return;
    };
    let wrong = "wrong-hunter3-secret";
    let builder = server.builder();
    let cache = builder.clone().build_from_url(&server.url_with(Some(wrong))).unwrap();
    let error = bounded(cache.get("k")).await.unwrap_err();
    assert!(matches!(error, CacheError::Authentication { .. }), "{error:?}");

    let key = std::fs::read_to_string(server.pki().client_key()).unwrap();
    let key_body = key.lines().nth(1).expect("a PEM body line");
    let cert = std::fs::read_to_string(server.pki().client_cert()).unwrap();
    let cert_body = cert.lines().nth(1).expect("a PEM body line");
    let good = builder.clone().build_from_url(&server.url()).unwrap();
    bounded(good.set("k", "v", None)).await.unwrap();
    for text in [
        format!("{builder:?}"),
        format!("{cache:?}"),
        format!("{good:?}"),
        format!("{error}"),
        format!("{error:?}"),
    ] {
        for secret in [wrong, PASSWORD, key_body, cert_body, "PRIVATE KEY"] {
            assert!(!text.contains(secret), "{secret:?} in {text}");
        }
    }
    // The builder shows where its files are, which is what a reader needs.
    assert!(format!("{builder:?}").contains("client.key"), "{builder:?}");
}

#[tokio::test]
async fn tls_files_that_cannot_be_used_are_config_errors_naming_the_file() {
    let Some((_dir, pki)) = pki_only() else { return };
    let url = "rediss://:pw-secret@127.0.0.1:6380";
    let missing = pki.ca().with_file_name("absent.crt");
    let cases = [
        (
            RedisCache::builder().tls_ca_file(&missing),
            "tls_ca_file",
            missing.clone(),
        ),
        // A key is not a certificate.
        (
            RedisCache::builder().tls_ca_file(pki.client_key()),
            "tls_ca_file",
            pki.client_key(),
        ),
        (
            RedisCache::builder().tls_client_cert(pki.client_key(), pki.client_key()),
            "tls_client_cert",
            pki.client_key(),
        ),
        (
            RedisCache::builder().tls_client_cert(pki.client_cert(), pki.ca()),
            "tls_client_key",
            pki.ca(),
        ),
        (
            RedisCache::builder().tls_client_cert(pki.client_cert(), &missing),
            "tls_client_key",
            missing.clone(),
        ),
    ];
    let key = std::fs::read_to_string(pki.client_key()).unwrap();
    let key_body = key.lines().nth(1).unwrap().to_owned();
    for (builder, field, file) in cases {
        let e = builder.build_from_url(url).unwrap_err();
        assert_eq!(e.field, field, "{e}");
        assert!(e.value.contains(&*file.display().to_string()), "{e}");
        assert!(
            !e.to_string().contains(&key_body) && !e.to_string().contains("pw-secret"),
            "{e}"
        );
    }
    // TLS files with a plain URL are a mistake, not silently ignored.
    let e = RedisCache::builder()
        .tls_ca_file(pki.ca())
        .build_from_url("redis://:pw-secret@127.0.0.1:6379")
        .unwrap_err();
    assert_eq!(e.field, "url");
    assert!(!e.to_string().contains("pw-secret"), "{e}");
    // Skipping verification is not offered.
    let e = RedisCache::from_url("rediss://127.0.0.1:6380/#insecure").unwrap_err();
    assert_eq!(e.field, "url");
    assert!(e.to_string().contains("#insecure"), "{e}");
    // And a good set of files builds (nothing connects until the first operation).
    RedisCache::builder()
        .tls_ca_file(pki.ca())
        .tls_client_cert(pki.client_cert(), pki.client_key())
        .build_from_url(url)
        .unwrap();
}
