//! TLS for `rediss://` URLs: the CA and client certificate the builder was given, checked when
//! the manager is built, applied to every connection it opens, and the crypto provider rustls
//! uses.
//!
//! redis-rs makes its rustls configuration with `rustls::ClientConfig::builder()`, which takes
//! the process-wide default provider and panics when none can be chosen ("Could not
//! automatically determine the process-level CryptoProvider"). So a manager that speaks TLS
//! installs ring as that default first, unless the application installed one already, which
//! then stays in use.

use std::sync::Arc;

use redis::{ClientTlsConfig, ConnectionAddr, ConnectionInfo, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::LockError;

/// The certificates a builder was given for TLS connections.
#[derive(Clone, Default)]
pub(crate) struct Tls {
    /// Every CA given with `tls_ca_pem`, one PEM bundle after the other.
    ca_pem: Vec<u8>,
    /// The client certificate chain and key for mutual TLS.
    client: Option<ClientTlsConfig>,
}

impl Tls {
    pub(crate) fn add_ca(&mut self, pem: Vec<u8>) {
        self.ca_pem.extend_from_slice(&pem);
        // Bundles given one after the other must not run into each other's lines.
        if !self.ca_pem.ends_with(b"\n") {
            self.ca_pem.push(b'\n');
        }
    }

    pub(crate) fn set_client(&mut self, cert_chain: Vec<u8>, key: Vec<u8>) {
        self.client = Some(ClientTlsConfig {
            client_cert: cert_chain,
            client_key: key,
        });
    }

    /// Whether certificates were given at all.
    pub(crate) fn is_set(&self) -> bool {
        !self.ca_pem.is_empty() || self.client.is_some()
    }

    /// Checks the certificates by building a rustls client configuration from them (with ring,
    /// without touching the process default), so bad PEM is an error of `build`, not of the
    /// first connection.
    pub(crate) fn check(&self) -> Result<(), LockError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        if !self.ca_pem.is_empty() {
            for cert in certificates(&self.ca_pem, "tls_ca_pem")? {
                roots.add(cert).map_err(|e| {
                    invalid(
                        "tls_ca_pem",
                        format!("a CERTIFICATE block is not a usable X.509 certificate: {e}"),
                    )
                })?;
            }
        }
        let Some(client) = &self.client else {
            return Ok(());
        };
        let chain = certificates(&client.client_cert, "tls_client_cert_pem")?;
        // The key's own parse error can quote a line of it: never shown.
        let key = PrivateKeyDer::from_pem_slice(&client.client_key).map_err(|_| {
            invalid(
                "tls_client_cert_pem",
                "the key holds no PEM private key (-----BEGIN PRIVATE KEY-----, \
                 RSA PRIVATE KEY or EC PRIVATE KEY)",
            )
        })?;
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|config| {
                config
                    .with_root_certificates(roots)
                    .with_client_auth_cert(chain, key)
            })
            .map_err(|e| {
                invalid(
                    "tls_client_cert_pem",
                    format!(
                        "the certificate and key cannot be used together ({e}); give the \
                         certificate chain (leaf first) and the private key that belongs to it"
                    ),
                )
            })?;
        Ok(())
    }

    /// `info` with these certificates when it is a TLS address (`rediss://`); unchanged
    /// otherwise. Installs the crypto provider for a TLS address.
    pub(crate) fn apply(&self, info: ConnectionInfo) -> Result<ConnectionInfo, LockError> {
        match info.addr() {
            ConnectionAddr::TcpTls { insecure: true, .. } => {
                return Err(LockError::InvalidUrl {
                    reason: "`#insecure` would turn the server's certificate check off, which \
                             distlock does not do; trust the CA that signed it with \
                             LockManagerBuilder::tls_ca_pem instead"
                        .to_owned(),
                })
            }
            ConnectionAddr::TcpTls { .. } => {}
            _ => return Ok(info),
        }
        install_provider();
        // None given: the system's roots are trusted, and no client certificate is sent.
        if !self.is_set() {
            return Ok(info);
        }
        let certificates = TlsCertificates {
            client_tls: self.client.clone(),
            root_cert: (!self.ca_pem.is_empty()).then(|| self.ca_pem.clone()),
        };
        redis::Client::build_with_tls(info, certificates)
            .map(|client| client.get_connection_info().clone())
            .map_err(|e| invalid("tls", e.to_string()))
    }
}

/// Whether `url` asks for TLS (`rediss://`, `valkeys://`).
pub(crate) fn is_tls_url(url: &str) -> bool {
    url::Url::parse(url).is_ok_and(|url| matches!(url.scheme(), "rediss" | "valkeys"))
}

/// The address of `host:port`, reached the way `like` is: over TLS with the same settings
/// (certificates, verification), or over plain TCP.
pub(crate) fn address_like(like: &ConnectionAddr, host: String, port: u16) -> ConnectionAddr {
    match like {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host, port),
    }
}

/// Makes ring the process-wide default rustls provider, unless one is installed already.
pub(crate) fn install_provider() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Fails only when another thread installed one meanwhile: that one is used.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}

/// The certificates in `pem`: at least one.
fn certificates(pem: &[u8], what: &'static str) -> Result<Vec<CertificateDer<'static>>, LockError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(what, format!("not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(
            what,
            "no certificate found: expected PEM text with -----BEGIN CERTIFICATE----- blocks",
        ));
    }
    Ok(certs)
}

fn invalid(what: &'static str, reason: impl Into<String>) -> LockError {
    let reason = reason.into();
    LockError::InvalidConfig { what, reason }
}
