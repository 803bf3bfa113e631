//! TLS for `rediss://` (feature `redis-tls`): the files a builder was given —
//! a private CA and a client certificate with its key — read and checked at
//! construction, so that a missing or malformed file is a [`ConfigError`]
//! naming the file, not a failure on the first operation.
//!
//! Only paths are kept and printed: no certificate or key bytes ever reach an
//! error, a log line or `Debug` output. The bytes live in the redis crate's
//! [`TlsCertificates`], whose own `Debug` redacts them.

use std::path::{Path, PathBuf};

use ::redis::{ClientTlsConfig, TlsCertificates};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::ConfigError;

/// The TLS files a [`RedisCacheBuilder`](super::RedisCacheBuilder) was given.
#[derive(Clone, Debug, Default)]
pub(super) struct TlsFiles {
    /// PEM CA certificates to trust instead of the platform's roots.
    pub(super) ca_file: Option<PathBuf>,
    /// A PEM client certificate chain and its PEM private key, for mutual TLS.
    pub(super) client: Option<(PathBuf, PathBuf)>,
}

impl TlsFiles {
    /// Whether no file was given: a `rediss://` URL then trusts the platform's
    /// roots and presents no client certificate.
    pub(super) fn is_empty(&self) -> bool {
        self.ca_file.is_none() && self.client.is_none()
    }

    /// Reads and checks every file, naming the first one that is unreadable
    /// or does not hold what it should.
    pub(super) fn load(&self) -> Result<TlsCertificates, ConfigError> {
        let root_cert = match &self.ca_file {
            Some(path) => {
                let pem = read("tls_ca_file", path)?;
                let certs = certificates("tls_ca_file", path, &pem)?;
                let mut store = RootCertStore::empty();
                for cert in certs {
                    store.add(cert).map_err(|_| {
                        ConfigError::new("tls_ca_file", "a PEM file of usable CA certificates", path.display())
                    })?;
                }
                Some(pem)
            }
            None => None,
        };
        let client_tls = match &self.client {
            Some((cert_path, key_path)) => {
                let client_cert = read("tls_client_cert", cert_path)?;
                certificates("tls_client_cert", cert_path, &client_cert)?;
                let client_key = read("tls_client_key", key_path)?;
                PrivateKeyDer::from_pem_slice(&client_key).map_err(|_| {
                    ConfigError::new("tls_client_key", "a PEM file holding a private key", key_path.display())
                })?;
                Some(ClientTlsConfig {
                    client_cert,
                    client_key,
                })
            }
            None => None,
        };
        Ok(TlsCertificates { client_tls, root_cert })
    }
}

/// The bytes of `path`; an error names the file and the reason (never its content).
fn read(field: &'static str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| ConfigError::new(field, "a readable PEM file", format!("{} ({e})", path.display())))
}

/// The certificates in `pem`: at least one, every block well formed.
fn certificates(field: &'static str, path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .ok()
        .filter(|c| !c.is_empty());
    certs.ok_or_else(|| ConfigError::new(field, "a PEM file holding at least one certificate", path.display()))
}

/// Makes rustls's ring provider the process default unless one is already
/// installed: the redis crate builds its TLS configuration from the default,
/// and with more than one provider compiled in (another crate may enable
/// aws-lc-rs) rustls cannot choose one by itself.
pub(super) fn ensure_crypto_provider() {
    // An error means a provider is already installed, which is all we need.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Path, name: &str, content: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        path
    }

    #[test]
    fn no_files_is_empty_and_loads_nothing() {
        let files = TlsFiles::default();
        assert!(files.is_empty());
        let certs = files.load().unwrap();
        assert!(certs.root_cert.is_none() && certs.client_tls.is_none());
    }

    #[test]
    fn a_missing_ca_file_is_named() {
        let files = TlsFiles {
            ca_file: Some(PathBuf::from("/nonexistent/redstring-ca.pem")),
            client: None,
        };
        let e = files.load().unwrap_err();
        assert_eq!(e.field, "tls_ca_file");
        assert!(e.value.contains("/nonexistent/redstring-ca.pem"), "{e}");
    }

    #[test]
    fn a_file_without_what_it_should_hold_is_named_and_its_content_never_shown() {
        let dir = std::env::temp_dir().join(format!("redstring-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = file(&dir, "junk.pem", "not pem at all SECRET-CONTENT");
        let key = file(
            &dir,
            "bad.key",
            "-----BEGIN PRIVATE KEY-----\nU0VDUkVULUtFWQ==\n-----END PRIVATE KEY-----\n",
        );
        let ca = TlsFiles {
            ca_file: Some(junk.clone()),
            client: None,
        }
        .load()
        .unwrap_err();
        assert_eq!(
            (ca.field, ca.value.as_str()),
            ("tls_ca_file", &*junk.display().to_string())
        );
        let cert = TlsFiles {
            ca_file: None,
            client: Some((junk.clone(), key.clone())),
        }
        .load()
        .unwrap_err();
        assert_eq!(cert.field, "tls_client_cert");
        for e in [&ca, &cert] {
            assert!(!e.to_string().contains("SECRET-CONTENT"), "{e}");
            assert!(!format!("{e:?}").contains("SECRET-CONTENT"), "{e:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
