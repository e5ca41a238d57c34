//! Mutual TLS between coordinators and workers, the option beside the shared secret.
//!
//! Every process of a deployment, coordinator or worker, takes the same three files: the
//! CA that signs the deployment's certificates, and its own certificate and key. A worker
//! serves TLS with its certificate and accepts only callers presenting a certificate that
//! chains to the CA; a caller (a coordinator, or a worker reading the stages below its own)
//! trusts only workers whose certificate chains to that CA and names the host it dialled,
//! and presents its own. With TLS, worker URLs are `https://` and a plain `http://` one is
//! refused, never dialled in clear; without it, `https://` is refused.
//!
//! A caller checks the name a worker's certificate carries against the host it dialled, or
//! against one name for all workers (`--worker-tls-server-name`) when workers are listed by
//! address. The files are read and checked once at start (a certificate that does not fit its key, an
//! empty CA file), so a bad deployment stops before it listens or plans. The key's bytes are
//! never printed: `Debug` and every error name only paths.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use super::auth::CONNECT_TIMEOUT;
use super::DistributedError;
use crate::pem::problem;

/// The environment variables (and `--worker-tls-*` flags) naming the three files.
pub const TLS_CA_ENV: &str = "PULPITUM_WORKER_TLS_CA";
/// See [`TLS_CA_ENV`].
pub const TLS_CERT_ENV: &str = "PULPITUM_WORKER_TLS_CERT";
/// See [`TLS_CA_ENV`].
pub const TLS_KEY_ENV: &str = "PULPITUM_WORKER_TLS_KEY";

/// A deployment's TLS material, checked.
#[derive(Clone)]
pub struct WorkerTls {
    ca: Arc<Vec<u8>>,
    cert: Arc<Vec<u8>>,
    key: Arc<Vec<u8>>,
    cert_path: PathBuf,
    server_name: Option<String>,
}

impl fmt::Debug for WorkerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerTls")
            .field("cert", &self.cert_path)
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

fn bad(setting: &str, path: &Path, what: impl fmt::Display) -> DistributedError {
    DistributedError::Tls(format!("{setting} {}: {what}", path.display()))
}

/// The certificates of a PEM file, each parsed (a file of PEM-shaped garbage is refused
/// here, not at the first handshake). Errors name the kind of problem, never the bytes.
fn certificates(
    setting: &str,
    path: &Path,
) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), DistributedError> {
    let bytes = std::fs::read(path).map_err(|e| bad(setting, path, e))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| bad(setting, path, problem(&e)))?;
    if certs.is_empty() {
        return Err(bad(setting, path, "holds no PEM certificate"));
    }
    let mut roots = rustls::RootCertStore::empty();
    for (i, c) in certs.iter().enumerate() {
        roots.add(c.clone()).map_err(|e| {
            bad(
                setting,
                path,
                format!(
                    "certificate {} is not a usable X.509 certificate ({e})",
                    i + 1
                ),
            )
        })?;
    }
    Ok((bytes, certs))
}

impl WorkerTls {
    /// Reads and checks the CA bundle, this process's certificate chain and its private key
    /// (PKCS#8, PKCS#1 or SEC1), all PEM.
    pub fn load(ca: &Path, cert: &Path, key: &Path) -> Result<Self, DistributedError> {
        let (ca_pem, _) = certificates("--worker-tls-ca", ca)?;
        let (cert_pem, chain) = certificates("--worker-tls-cert", cert)?;
        let key_pem = std::fs::read(key).map_err(|e| bad("--worker-tls-key", key, e))?;
        // The key's bytes never reach a message, only its path and the kind of problem.
        let parsed = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            bad(
                "--worker-tls-key",
                key,
                format!("no usable private key ({})", problem(&e)),
            )
        })?;
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| DistributedError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, parsed)
        .map_err(|e| {
            bad(
                "--worker-tls-cert",
                cert,
                format!("does not fit the key in {} ({e})", key.display()),
            )
        })?;
        Ok(Self {
            ca: Arc::new(ca_pem),
            cert: Arc::new(cert_pem),
            key: Arc::new(key_pem),
            cert_path: cert.to_path_buf(),
            server_name: None,
        })
    }

    /// Checks every worker's certificate against `name` instead of the host dialled: for
    /// worker lists by address (`dns+https://`, whose resolved URLs are IP addresses), every
    /// worker's certificate then names one DNS name, such as its Service's.
    pub fn with_server_name(mut self, name: &str) -> Result<Self, DistributedError> {
        rustls::pki_types::ServerName::try_from(name.to_string()).map_err(|_| {
            DistributedError::Tls(format!(
                "--worker-tls-server-name {name:?} is not a DNS name or an IP address"
            ))
        })?;
        self.server_name = Some(name.to_string());
        Ok(self)
    }

    /// The material the three settings name: all three or none (`None`: no TLS). One or two
    /// of them is refused, naming what is missing, rather than half a TLS setup.
    pub fn from_settings(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Option<Self>, DistributedError> {
        match (ca, cert, key) {
            (None, None, None) => Ok(None),
            (Some(ca), Some(cert), Some(key)) => Self::load(ca, cert, key).map(Some),
            _ => {
                let missing: Vec<&str> = [
                    ("--worker-tls-ca", ca.is_none()),
                    ("--worker-tls-cert", cert.is_none()),
                    ("--worker-tls-key", key.is_none()),
                ]
                .into_iter()
                .filter_map(|(name, absent)| absent.then_some(name))
                .collect();
                Err(DistributedError::Tls(format!(
                    "mutual TLS needs the CA, a certificate and its key; missing {} ({}, {}, {})",
                    missing.join(" and "),
                    TLS_CA_ENV,
                    TLS_CERT_ENV,
                    TLS_KEY_ENV
                )))
            }
        }
    }

    fn identity(&self) -> Identity {
        Identity::from_pem(self.cert.as_slice(), self.key.as_slice())
    }

    /// A caller's side: trust only the deployment's CA, present this process's certificate.
    pub(crate) fn client(&self) -> ClientTlsConfig {
        let config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(self.ca.as_slice()))
            .identity(self.identity())
            .timeout(CONNECT_TIMEOUT);
        match &self.server_name {
            Some(name) => config.domain_name(name.clone()),
            None => config,
        }
    }

    /// A worker's side: serve this certificate, require a client certificate from the CA.
    /// The handshake has a deadline, so a connection that never finishes one does not hold
    /// its slot.
    pub(crate) fn server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(self.identity())
            .client_ca_root(Certificate::from_pem(self.ca.as_slice()))
            .client_auth_optional(false)
            .timeout(CONNECT_TIMEOUT)
    }
}

/// Refuses a worker URL whose scheme does not match the TLS setting: `https://` without
/// TLS material would fail at the handshake, and `http://` with it would send plans and
/// rows in clear past a deployment that asked for encryption.
pub(crate) fn check_scheme(url: &url::Url, tls: bool) -> Result<(), DistributedError> {
    match (url.scheme(), tls) {
        ("https", true) | ("http", false) => Ok(()),
        ("http", true) => Err(DistributedError::WorkerList(format!(
            "{url} is plain http://, but mutual TLS is configured ({TLS_CA_ENV}); write \
             https://"
        ))),
        ("https", false) => Err(DistributedError::WorkerList(format!(
            "{url} is https://, but no TLS is configured: set {TLS_CA_ENV}, {TLS_CERT_ENV} \
             and {TLS_KEY_ENV} (or --worker-tls-ca/-cert/-key), or write http://"
        ))),
        (other, _) => Err(DistributedError::WorkerList(format!(
            "{url} has scheme {other:?}; a worker is reached over http:// or https://"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CA and a certificate it signs for 127.0.0.1 and localhost, made by the openssl
    /// command (as the wire server's tests do).
    fn make_pki(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
        let ca_key = dir.join(format!("{name}-ca.key"));
        let ca = dir.join(format!("{name}-ca.pem"));
        let key = dir.join(format!("{name}.key"));
        let csr = dir.join(format!("{name}.csr"));
        let cert = dir.join(format!("{name}.pem"));
        let ext = dir.join(format!("{name}.ext"));
        std::fs::write(&ext, "subjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
        let run = |args: &[&str]| {
            let ok = std::process::Command::new("openssl")
                .args(args)
                .stderr(std::process::Stdio::null())
                .status()
                .expect("openssl runs")
                .success();
            assert!(ok, "openssl {args:?}");
        };
        let p = |p: &PathBuf| p.to_str().unwrap().to_string();
        run(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=test-ca",
            "-keyout",
            &p(&ca_key),
            "-out",
            &p(&ca),
        ]);
        run(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            &p(&key),
            "-out",
            &p(&csr),
        ]);
        run(&[
            "x509",
            "-req",
            "-in",
            &p(&csr),
            "-CA",
            &p(&ca),
            "-CAkey",
            &p(&ca_key),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &p(&ext),
            "-out",
            &p(&cert),
        ]);
        (ca, cert, key)
    }

    #[test]
    fn tls_settings_are_all_three_or_none_and_checked_without_printing_the_key() {
        let dir = std::env::temp_dir().join(format!("pulpitum-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (ca, cert, key) = make_pki(&dir, "a");
        let (_, other_cert, _) = make_pki(&dir, "b");

        assert!(WorkerTls::from_settings(None, None, None)
            .unwrap()
            .is_none());
        let tls = WorkerTls::from_settings(Some(&ca), Some(&cert), Some(&key))
            .unwrap()
            .unwrap();
        let key_text = std::fs::read_to_string(&key).unwrap();
        let body = key_text.lines().nth(1).unwrap();
        assert!(!format!("{tls:?}").contains(body), "{tls:?}");

        let e = WorkerTls::from_settings(Some(&ca), None, Some(&key))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing --worker-tls-cert"), "{e}");
        let e = WorkerTls::from_settings(Some(&ca), None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--worker-tls-cert and --worker-tls-key"), "{e}");
        // A certificate with another key.
        let e = WorkerTls::load(&ca, &other_cert, &key)
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not fit the key"), "{e}");
        assert!(!e.contains(body), "{e}");
        // A key file as the CA, a missing file, a certificate as the key.
        let e = WorkerTls::load(&key, &cert, &key).unwrap_err().to_string();
        assert!(
            e.contains("--worker-tls-ca") && e.contains("no PEM certificate"),
            "{e}"
        );
        assert!(!e.contains(body), "{e}");
        let e = WorkerTls::load(&dir.join("absent.pem"), &cert, &key)
            .unwrap_err()
            .to_string();
        assert!(e.contains("absent.pem"), "{e}");
        let e = WorkerTls::load(&ca, &cert, &cert).unwrap_err().to_string();
        assert!(e.contains("no usable private key"), "{e}");
        // A key whose line breaks were lost (as in a one-line environment value), given as
        // the key, the certificate or the CA (break-it finding: rustls's error quoted the
        // whole key as bytes): refused, and no byte of it printed.
        for (i, mangled) in [key_text.replace('\n', "\\n"), key_text.replace('\n', " ")]
            .into_iter()
            .enumerate()
        {
            let m = dir.join(format!("mangled{i}.key"));
            std::fs::write(&m, &mangled).unwrap();
            for e in [
                WorkerTls::load(&ca, &cert, &m),
                WorkerTls::load(&ca, &m, &key),
                WorkerTls::load(&m, &cert, &key),
            ] {
                let e = e.unwrap_err().to_string();
                assert!(e.contains("mangled"), "{e}");
                assert!(!e.contains(body) && !e.contains("45, 45"), "{e}");
            }
        }
        // PEM-shaped garbage as the CA is refused at load, not at the first handshake.
        let garbage = dir.join("garbage-ca.pem");
        std::fs::write(
            &garbage,
            "-----BEGIN CERTIFICATE-----\nAAECAwQFBgcICQoLDA0ODxAREhM=\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = WorkerTls::load(&garbage, &cert, &key)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a usable X.509 certificate"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_worker_url_scheme_must_match_the_tls_setting() {
        let http = url::Url::parse("http://10.0.0.1:7600").unwrap();
        let https = url::Url::parse("https://10.0.0.1:7600").unwrap();
        assert!(check_scheme(&http, false).is_ok());
        assert!(check_scheme(&https, true).is_ok());
        let e = check_scheme(&http, true).unwrap_err().to_string();
        assert!(e.contains("write https://"), "{e}");
        let e = check_scheme(&https, false).unwrap_err().to_string();
        assert!(e.contains(TLS_CA_ENV), "{e}");
    }
}
