//! TLS for the wire server with rustls on ring, from PEM certificate and key files.
//!
//! A configuration that cannot be loaded stops the server before it listens: there is no
//! fallback to plaintext. With TLS configured, a client that does not negotiate it is
//! refused at startup (see `handlers::Startup`).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use super::ServerError;
use crate::pem::problem;

fn bad(reason: String) -> ServerError {
    ServerError::Config {
        setting: "--tls-cert / --tls-key",
        reason,
    }
}

/// Builds the acceptor from a certificate chain and a private key (PKCS#8, PKCS#1 or SEC1),
/// both PEM. Advertises ALPN `postgresql` so PostgreSQL 17's direct TLS works too.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, ServerError> {
    // PEM errors are described by kind only: rustls's own text quotes the file's bytes.
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| bad(format!("{}: {}", cert.display(), problem(&e))))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(format!("{}: {}", cert.display(), problem(&e))))?;
    if chain.is_empty() {
        return Err(bad(format!("{} holds no certificate", cert.display())));
    }
    // The key's bytes never reach a message, only its path.
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        bad(format!(
            "{}: no usable private key ({})",
            key.display(),
            problem(&e)
        ))
    })?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| bad(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .map_err(|e| bad(format!("certificate and key do not fit together: {e}")))?;
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
