//! The shared client: settings, construction, and transport failures as error kinds.

use std::time::Duration;

use machine_core::{Error, ErrorKind, Result};

use crate::TlsConfig;
use crate::tls::PinMismatch;

/// How an [`HttpClient`] connects.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HttpSettings {
    /// Which certificates are trusted.
    pub tls: TlsConfig,
    /// The longest a whole request may take, from connecting to the last byte of the body.
    /// Default 60 s: a vCenter task poll or a BMC's virtual media answer can be slow.
    pub timeout: Duration,
    /// The longest a TCP connection and TLS handshake may take. Default 10 s.
    pub connect_timeout: Duration,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            tls: TlsConfig::default(),
            timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

impl HttpSettings {
    /// The defaults: verified TLS, 60 s per request, 10 s to connect.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets which certificates are trusted.
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = tls;
        self
    }

    /// Sets the whole-request timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the connect (TCP and TLS handshake) timeout.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }
}

/// A reqwest client built from [`HttpSettings`], cheap to clone (one connection pool).
#[derive(Debug, Clone)]
pub struct HttpClient {
    inner: reqwest::Client,
}

impl HttpClient {
    /// Builds the client. Fails as [`ErrorKind::InvalidSpec`] naming `tls.caFile` when the
    /// CA file cannot be read or holds no certificate.
    pub fn new(settings: &HttpSettings) -> Result<Self> {
        let builder = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.connect_timeout)
            // Redirects would resend credentials to wherever a server points.
            .redirect(reqwest::redirect::Policy::none());
        let inner = settings.tls.apply(builder)?.build().map_err(|e| {
            Error::permanent(format!("cannot build the HTTP client: {}", e.without_url()))
        })?;
        Ok(HttpClient { inner })
    }

    /// The reqwest client, to build requests with.
    pub fn inner(&self) -> &reqwest::Client {
        &self.inner
    }

    /// Sends a request. Any HTTP status is a success here (see [`crate::status_error`]);
    /// a failure to get one is an error of the kind a caller acts on:
    ///
    /// - an untrusted or mismatched certificate: [`ErrorKind::Permanent`], saying what to
    ///   configure (retrying cannot fix trust);
    /// - a URL that cannot be sent to: [`ErrorKind::InvalidSpec`] on field `endpoint`;
    /// - a refused or reset connection, a timeout, a cut body: [`ErrorKind::Transient`].
    ///
    /// Messages name the scheme, host and port only: paths and queries can carry tokens.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response> {
        request.send().await.map_err(transport_error)
    }
}

fn transport_error(error: reqwest::Error) -> Error {
    let server = error
        .url()
        .map(|url| {
            format!("{}://{}", url.scheme(), url.host_str().unwrap_or("?"))
                + &url.port().map(|p| format!(":{p}")).unwrap_or_default()
        })
        .unwrap_or_else(|| "the server".to_string());
    if let Some(refusal) = certificate_refusal(&error) {
        return Error::permanent(format!("TLS: {server} was not trusted: {refusal}"));
    }
    let error = error.without_url();
    if error.is_builder() {
        return Error::invalid_spec("endpoint", format!("cannot send to {server}: {error}"));
    }
    let what = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "could not connect"
    } else {
        "failed"
    };
    Error::new(
        ErrorKind::Transient,
        format!("request to {server} {what}: {}", chain(&error)),
    )
    .with_source(error)
}

/// The certificate problem in a send error's causes, explained, if there is one.
fn certificate_refusal(error: &reqwest::Error) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if let Some(rustls::Error::InvalidCertificate(problem)) = rustls_error(e) {
            if let rustls::CertificateError::Other(other) = problem
                && let Some(mismatch) = other.0.downcast_ref::<PinMismatch>()
            {
                return Some(format!(
                    "{mismatch}; if the server's certificate was replaced on purpose, pin the new fingerprint"
                ));
            }
            return Some(format!(
                "{problem:?}; give its CA (TlsConfig::with_ca_file) or pin its certificate's SHA-256 fingerprint (TlsConfig::with_pinned_sha256)"
            ));
        }
        cause = e.source();
    }
    None
}

/// The rustls error in `error`, looking inside io::Errors (hyper nests them two deep, and
/// an io::Error's `source` skips the error it wraps).
fn rustls_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = error.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    let inner = error.downcast_ref::<std::io::Error>()?.get_ref()?;
    rustls_error(inner)
}

/// An error and its causes on one line: reqwest's own message hides the reason.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = e.source();
    }
    text
}
