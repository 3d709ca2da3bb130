//! How the client decides to trust a server's certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use machine_core::{Error, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::{CertificateError, DigitallySignedStruct, OtherError, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::CertFingerprint;

/// Which certificates the client trusts. The default verifies the server's chain and name
/// against the operating system's roots.
///
/// Set at most one of [`with_ca_file`](Self::with_ca_file) /
/// [`with_ca_pem`](Self::with_ca_pem), [`with_pinned_sha256`](Self::with_pinned_sha256) and
/// [`insecure`](Self::insecure); the last one set wins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsConfig {
    trust: Trust,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum Trust {
    #[default]
    SystemRoots,
    CaFile(PathBuf),
    CaPem(Vec<u8>),
    Pinned(CertFingerprint),
    Insecure,
}

impl TlsConfig {
    /// Verify against the operating system's roots (the default).
    pub fn new() -> Self {
        Self::default()
    }

    /// Trust only the CA certificates (PEM) in this file, read when the client is built:
    /// the server's chain and host name are verified against them. For a vCenter or BMC
    /// whose certificate a private CA issued.
    pub fn with_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.trust = Trust::CaFile(path.into());
        self
    }

    /// Trust only these CA certificates (PEM, one or more), as [`with_ca_file`](Self::with_ca_file).
    pub fn with_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.trust = Trust::CaPem(pem.into());
        self
    }

    /// Trust exactly the server certificate with this SHA-256 fingerprint, whatever signed
    /// it and whatever names it holds: what vSphere's thumbprints and most BMCs' self-signed
    /// certificates call for. The handshake's signatures are still verified, so only the
    /// holder of that certificate's key can answer.
    pub fn with_pinned_sha256(mut self, fingerprint: CertFingerprint) -> Self {
        self.trust = Trust::Pinned(fingerprint);
        self
    }

    /// Trust any certificate. Anyone on the path can then read and change the traffic,
    /// credentials included: a warning is logged on every TLS handshake. Only for labs.
    pub fn insecure(mut self) -> Self {
        self.trust = Trust::Insecure;
        self
    }

    /// Whether certificate verification is off.
    pub fn is_insecure(&self) -> bool {
        self.trust == Trust::Insecure
    }

    /// Applies this trust to a reqwest client builder.
    pub(crate) fn apply(&self, builder: reqwest::ClientBuilder) -> Result<reqwest::ClientBuilder> {
        match &self.trust {
            Trust::SystemRoots => Ok(builder),
            Trust::CaFile(path) => {
                // A regular file of bounded size: `/dev/zero` or a huge file would be
                // read until memory runs out.
                let pem = machine_core::read_user_file(
                    "tls.caFile",
                    path,
                    machine_core::MAX_USER_FILE_BYTES,
                )?;
                with_cas(builder, &pem, Some(path))
            }
            Trust::CaPem(pem) => with_cas(builder, pem, None),
            Trust::Pinned(fingerprint) => Ok(builder.tls_backend_preconfigured(custom_config(
                Arc::new(CustomVerifier {
                    check: Check::Pinned(*fingerprint),
                    algorithms: algorithms(),
                }),
            )?)),
            Trust::Insecure => {
                tracing::warn!(
                    "TLS certificate verification is OFF for this client: anyone on the network path can read and change its traffic, credentials included"
                );
                let mut config = custom_config(Arc::new(CustomVerifier {
                    check: Check::Insecure,
                    algorithms: algorithms(),
                }))?;
                // A resumed session skips certificate verification, and with it the warning
                // each connection must log.
                config.resumption = rustls::client::Resumption::disabled();
                Ok(builder.tls_backend_preconfigured(config))
            }
        }
    }
}

fn with_cas(
    builder: reqwest::ClientBuilder,
    pem: &[u8],
    path: Option<&Path>,
) -> Result<reqwest::ClientBuilder> {
    let from = path
        .map(|p| format!(" in {}", p.display()))
        .unwrap_or_default();
    let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| {
        Error::invalid_spec(
            "tls.caFile",
            format!("the CA certificates{from} are not valid PEM: {e}"),
        )
    })?;
    if certs.is_empty() {
        return Err(Error::invalid_spec(
            "tls.caFile",
            format!("no PEM certificate found{from}"),
        ));
    }
    Ok(builder.tls_certs_only(certs))
}

fn algorithms() -> WebPkiSupportedAlgorithms {
    rustls::crypto::aws_lc_rs::default_provider().signature_verification_algorithms
}

fn custom_config(verifier: Arc<dyn ServerCertVerifier>) -> Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::permanent(format!("TLS setup failed: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(config)
}

/// Why a pinned server was refused; found again by [`crate::HttpClient::send`] to explain it.
#[derive(Debug)]
pub(crate) struct PinMismatch {
    pub(crate) expected: CertFingerprint,
    pub(crate) presented: CertFingerprint,
}

impl std::fmt::Display for PinMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the server's certificate has SHA-256 fingerprint {}, not the pinned {}",
            self.presented, self.expected
        )
    }
}

impl std::error::Error for PinMismatch {}

/// The two verifiers that are not webpki's: a pinned fingerprint, or none at all.
#[derive(Debug)]
enum Check {
    Pinned(CertFingerprint),
    Insecure,
}

#[derive(Debug)]
struct CustomVerifier {
    check: Check,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for CustomVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let presented = CertFingerprint::of_der(end_entity);
        match self.check {
            Check::Pinned(expected) if presented == expected => Ok(ServerCertVerified::assertion()),
            Check::Pinned(expected) => Err(rustls::Error::InvalidCertificate(
                CertificateError::Other(OtherError(Arc::new(PinMismatch {
                    expected,
                    presented,
                }))),
            )),
            Check::Insecure => {
                // On every handshake, not once per client: a long-running controller must
                // keep saying it.
                tracing::warn!(
                    server = ?server_name,
                    fingerprint = %presented,
                    "accepting a TLS certificate WITHOUT verification (TlsConfig::insecure); pin this fingerprint instead"
                );
                Ok(ServerCertVerified::assertion())
            }
        }
    }

    // The handshake's signatures are verified in both modes: the peer must hold the key
    // of the certificate it presented.
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use machine_core::ErrorKind;

    #[test]
    fn the_default_verifies_against_system_roots() {
        assert_eq!(TlsConfig::default().trust, Trust::SystemRoots);
        assert!(!TlsConfig::default().is_insecure());
        assert!(TlsConfig::new().insecure().is_insecure());
    }

    #[test]
    fn a_missing_ca_file_names_the_field_and_the_path() {
        let err = TlsConfig::new()
            .with_ca_file("/nonexistent/ca.pem")
            .apply(reqwest::Client::builder())
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidSpec);
        assert_eq!(err.field(), Some("tls.caFile"));
        assert!(err.message().contains("/nonexistent/ca.pem"), "{err}");
    }

    #[test]
    fn a_ca_file_that_is_a_device_or_too_big_is_refused_without_reading_it_all() {
        for path in ["/dev/zero", "/dev/urandom", "/"] {
            let err = TlsConfig::new()
                .with_ca_file(path)
                .apply(reqwest::Client::builder())
                .unwrap_err();
            assert_eq!(err.field(), Some("tls.caFile"), "{path}: {err}");
            assert!(err.to_string().contains("not a regular file"), "{err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("ca.pem");
        std::fs::write(&big, vec![b'A'; 2 * 1024 * 1024]).unwrap();
        let err = TlsConfig::new()
            .with_ca_file(&big)
            .apply(reqwest::Client::builder())
            .unwrap_err();
        assert!(err.to_string().contains("byte bound"), "{err}");
    }

    #[test]
    fn ca_text_without_a_certificate_is_refused() {
        let err = TlsConfig::new()
            .with_ca_pem("not a certificate")
            .apply(reqwest::Client::builder())
            .unwrap_err();
        assert_eq!(err.field(), Some("tls.caFile"));
    }
}
