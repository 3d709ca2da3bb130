//! The HTTP client every HTTP-speaking provider shares (vCenter's SOAP API, Redfish BMCs).
//!
//! It holds what each of them would otherwise write again, and get subtly different:
//!
//! - [`TlsConfig`]: certificates are verified by default. A server with a private CA is
//!   trusted by giving that CA ([`TlsConfig::with_ca_file`]); a server with a self-signed
//!   certificate by pinning its SHA-256 fingerprint ([`TlsConfig::with_pinned_sha256`]), the
//!   way vSphere shows thumbprints. Turning verification off ([`TlsConfig::insecure`]) is
//!   possible, and logs a warning on every TLS handshake so it is never forgotten.
//! - [`HttpClient::send`]: transport failures (refused connections, resets, timeouts, an
//!   untrusted certificate) become [`machine_core::Error`]s of the right kind, with the
//!   URL's host but never its path, query or user info (where tokens hide).
//! - [`status_error`] and [`retry_after`]: an HTTP status and its `Retry-After` header as an
//!   error kind the retry machinery understands.
//!
//! Retrying is not done here: providers are wrapped in `machine_core::Retrying`, which
//! retries whole operations by the error's kind.
//!
//! ```
//! use provider_http::{HttpClient, HttpSettings, TlsConfig};
//!
//! // A BMC with a self-signed certificate, trusted by its pinned fingerprint.
//! let pin = "9f:86:d0:81:88:4c:7d:65:9a:2f:ea:a0:c5:5a:d0:15:a3:bf:4f:1b:2b:0b:82:2c:d1:5d:6c:15:b0:f0:0a:08"
//!     .parse()?;
//! let client = HttpClient::new(&HttpSettings::new().with_tls(TlsConfig::new().with_pinned_sha256(pin)))?;
//! # let _ = client;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod client;
mod fingerprint;
mod status;
mod tls;

pub use client::{HttpClient, HttpSettings};
pub use fingerprint::CertFingerprint;
pub use status::{retry_after, status_error};
pub use tls::TlsConfig;
