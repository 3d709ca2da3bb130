//! User data by reference: the composed user data waits in a [`BootstrapDataStore`] and
//! the machine is created with only a small stub that fetches it, checks its digest and
//! hands it to cloud-init (or Ignition) as if it had been the user data.
//!
//! Why: user data can be read by anyone who may describe the instance (EC2's
//! `DescribeInstanceAttribute`, vSphere's VM configuration) and, from inside the machine,
//! by any process through the instance metadata service, long after the boot needed it.
//! It routinely holds secrets (join tokens, private keys). By reference, the provider
//! holds only the stub, whose own secrets are short-lived: a one-time token that a
//! served-once store refuses after the first fetch, and a document the composer withdraws
//! once the machine's bootstrap finished ([`crate::MachineProvisioner::bootstrap_finished`]
//! time) and when the machine is deleted.
//!
//! # How the composer uses it
//! With [`crate::ComposerBuilder::by_reference`], the composer, where it would create a
//! machine:
//! 1. composes the user data as inline (every coupled layer, conflicts refused), without
//!    the provider's size limit (the store has its own, [`BootstrapDataStore::max_bytes`]);
//! 2. [`BootstrapDataStore::put`]s the document for the machine's name **before** the
//!    create: a create abandoned after the put leaves a document the next create of the
//!    name replaces (a put of the same bytes keeps its location, so a stub already given
//!    to a provider stays valid), and that [`crate::Composer::sweep_bootstrap_data`]
//!    withdraws once no machine of that name exists;
//! 3. creates the machine with the stub ([`cloud_init_stub`] or [`ignition_stub`]), fitted
//!    to the provider's budget;
//! 4. withdraws the document when the completion check saw the bootstrap end (before the
//!    provider's own `bootstrap_finished`) and when the machine is deleted.
//!
//! The machine's coupled revision ([`crate::revision`]) is still that of the real user
//! data, the same as inline: switching delivery replaces no machine.
//!
//! # The cloud-init stub: how the data reaches cloud-init
//! The stub is a MIME multipart of a cloud-init **part handler** (`text/part-handler`, a
//! user-data format every cloud-init release has had, run in cloud-init's own process)
//! and the completion check's parts. cloud-init imports the handler while it walks the
//! user data in its `init` stage; at the end of that walk, once its own handlers have
//! written their output, the handler fetches the document, refuses it unless its SHA-256
//! is the one in the stub, and walks it with cloud-init's own default part handlers, in
//! the same stage, with the same frequency. So cloud-config parts are merged (with their
//! `Merge-Type`) into `cloud-config.txt` exactly as inline, scripts land in the same
//! scripts directory, boothooks and Jinja templates run, `#include` and gzip are
//! resolved by cloud-init's own processor; the init, config and final modules then run
//! on that, unchanged. The document is kept root-only (mode 0600) in the instance
//! directory beside `user-data.txt`, as inline user data is, so that later boots consume
//! it again without fetching: per-boot modules (`bootcmd`, boothooks,
//! `scripts-per-boot`) behave as inline on every boot.
//!
//! What differs from inline: `cloud-init query userdata` and `user-data.txt` show the
//! stub; cloud-init's launch-index filter (EC2 launches of several instances with
//! `Launch-Index` headers) does not apply to the document; the stub needs Python 3's
//! `ssl` (cloud-init's own interpreter) and cloud-init 17.1 or later (the handler uses
//! `stages.Init`'s handler walk, which the stub checks: an older one fails the boot
//! naming `unsupported-cloud-init`).
//!
//! Why not the other ways: `#include` (and `text/x-include-url`) fetches with the system's
//! CA store and checks no digest, so neither a pinned certificate nor a tampered document
//! could be refused, and it is resolved before any script of the user data runs; a
//! boothook runs in a separate process after cloud-init has processed the user data, so
//! what it fetches is not consumed in that boot unless cloud-init is restarted (Cluster
//! API's AWS provider writes the data to a file named by an include part and restarts
//! the `cloud-init` unit, which needs systemd and runs the init stage twice).
//!
//! # When the fetch fails
//! A fetch that is refused (HTTP 410: already fetched or withdrawn; 404: unknown
//! token; 403: not an allowed client), a document whose digest differs, a certificate
//! other than the pinned one, or a store that stays unreachable for the fetch window
//! ([`ByReference::with_fetch_window`]) applies **nothing** of the document: the handler
//! writes a script named [`FAILED_SCRIPT_PREFIX`]`<reason>` that prints the reason and
//! fails, so cloud-init's verdict (`result.json`, `cloud-init status`) names the reason,
//! and every completion check (whose parts travel in the stub, so they run whatever
//! happens) reports the machine Failed with it. It never boots half-configured and
//! silent.
//!
//! # The Ignition stub
//! Ignition's own remote config: `ignition.config.replace` with the document's URL and
//! `verification.hash` (SHA-512), and the store's certificate as the only certificate
//! authority (`ignition.security.tls.certificateAuthorities`). Ignition refuses a
//! document whose hash differs and fails the boot. Only an HTTPS location can be used
//! (Ignition has no Secrets Manager fetcher).

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use base64::Engine;
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256, Sha512};

use crate::error::{Error, Result};
use crate::name::MachineName;
use crate::user_data::{UserData, UserDataFormat, UserDataPart};

/// Where composed user data waits for its machine when it goes by reference.
///
/// A store is scoped to one owner (as a provider is): [`BootstrapDataStore::list`] sees
/// only that owner's documents. Every method may be abandoned at any await point and
/// called again by a new process: `put` and `withdraw` are idempotent.
#[async_trait]
pub trait BootstrapDataStore: Send + Sync + fmt::Display {
    /// The largest document this store holds, in bytes. The composer gzips a larger
    /// document and refuses one that still does not fit, before any call.
    fn max_bytes(&self) -> usize;

    /// Stores `document` for the machine `name` and says where its stub fetches it.
    /// A document already stored for `name` is replaced; when it holds the same bytes,
    /// the location stays the same (a stub given out before stays valid).
    async fn put(&self, name: &MachineName, document: &[u8]) -> Result<Location>;

    /// Withdraws `name`'s document: nothing is served for it afterwards. Succeeds when
    /// there is none.
    async fn withdraw(&self, name: &MachineName) -> Result<()>;

    /// The documents this store holds for its owner, for sweeping the ones whose create
    /// was abandoned.
    async fn list(&self) -> Result<Vec<StoredDocument>>;

    /// The machine `name` was seen with `addresses` while it boots: a store that binds
    /// each document to its machine serves `name`'s only to a client at one of them (a
    /// token for another machine, or a client that is not the machine, is refused). The
    /// composer calls it on every look at a machine whose bootstrap has not finished
    /// and that reports addresses. The default does nothing.
    async fn expect_clients(&self, name: &MachineName, addresses: &[IpAddr]) -> Result<()> {
        let _ = (name, addresses);
        Ok(())
    }
}

/// A shared store is a store.
#[async_trait]
impl<S: BootstrapDataStore + ?Sized> BootstrapDataStore for Arc<S> {
    fn max_bytes(&self) -> usize {
        (**self).max_bytes()
    }

    async fn put(&self, name: &MachineName, document: &[u8]) -> Result<Location> {
        (**self).put(name, document).await
    }

    async fn withdraw(&self, name: &MachineName) -> Result<()> {
        (**self).withdraw(name).await
    }

    async fn list(&self) -> Result<Vec<StoredDocument>> {
        (**self).list().await
    }

    async fn expect_clients(&self, name: &MachineName, addresses: &[IpAddr]) -> Result<()> {
        (**self).expect_clients(name, addresses).await
    }
}

/// A document a store holds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredDocument {
    /// The machine it is for.
    pub name: MachineName,
    /// When it was stored (its last put).
    pub stored_at: SystemTime,
}

impl StoredDocument {
    /// A document of `name` stored at `stored_at`.
    pub fn new(name: MachineName, stored_at: SystemTime) -> Self {
        StoredDocument { name, stored_at }
    }
}

/// Where a stub fetches its document. Debug never shows the one-time URL.
#[derive(Clone)]
#[non_exhaustive]
pub enum Location {
    /// An HTTPS URL with a one-time token, served by a certificate the stub pins.
    Https(HttpsLocation),
    /// AWS Secrets Manager secrets the instance reads with its own role, joined in order.
    AwsSecretsManager(SecretsManagerLocation),
}

impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Https(h) => fmt::Debug::fmt(h, f),
            Location::AwsSecretsManager(s) => fmt::Debug::fmt(s, f),
        }
    }
}

/// An HTTPS location: the URL (its path holds the one-time token) and the server's
/// certificate, which the stub trusts alone.
#[derive(Clone)]
#[non_exhaustive]
pub struct HttpsLocation {
    /// The document's URL; a secret, since anyone holding it may fetch the document once.
    pub url: SecretString,
    /// The server's certificate (DER); the stub trusts it alone and checks its SHA-256.
    pub certificate_der: Vec<u8>,
}

impl HttpsLocation {
    /// A location at `url` served with `certificate_der`.
    pub fn new(url: SecretString, certificate_der: Vec<u8>) -> Self {
        HttpsLocation {
            url,
            certificate_der,
        }
    }

    /// The certificate as PEM text.
    pub fn certificate_pem(&self) -> String {
        certificate_pem(&self.certificate_der)
    }

    /// The SHA-256 of the certificate, in lower-case hex (the pin).
    pub fn certificate_sha256(&self) -> String {
        hex::encode(Sha256::digest(&self.certificate_der))
    }
}

impl fmt::Debug for HttpsLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpsLocation")
            .field("url", &"[REDACTED]")
            .field("certificate_sha256", &self.certificate_sha256())
            .finish()
    }
}

/// An AWS Secrets Manager location: the secrets, in order, whose binary values joined
/// are the document. The instance reads them with its own role (its instance profile),
/// from the instance metadata service's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SecretsManagerLocation {
    /// The region of the secrets.
    pub region: String,
    /// The Secrets Manager endpoint, when not `https://secretsmanager.<region>.amazonaws.com`.
    pub endpoint: Option<String>,
    /// The instance metadata service, when not `http://169.254.169.254` (an IPv6-only
    /// instance uses `http://[fd00:ec2::254]`).
    pub metadata_endpoint: Option<String>,
    /// The secrets' names, whose values joined in this order are the document.
    pub secret_ids: Vec<String>,
}

impl SecretsManagerLocation {
    /// Secrets `secret_ids` in `region`, at the default endpoints.
    pub fn new(region: impl Into<String>, secret_ids: Vec<String>) -> Self {
        SecretsManagerLocation {
            region: region.into(),
            endpoint: None,
            metadata_endpoint: None,
            secret_ids,
        }
    }

    /// Sets the Secrets Manager endpoint.
    pub fn with_endpoint(mut self, endpoint: Option<String>) -> Self {
        self.endpoint = endpoint;
        self
    }

    /// Sets the instance metadata endpoint.
    pub fn with_metadata_endpoint(mut self, endpoint: Option<String>) -> Self {
        self.metadata_endpoint = endpoint;
        self
    }
}

/// The delivery by reference a composer uses: the store and how long a stub keeps
/// trying to reach it.
#[derive(Clone)]
pub struct ByReference {
    store: Arc<dyn BootstrapDataStore>,
    fetch_window: Duration,
}

impl fmt::Debug for ByReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ByReference")
            .field("store", &self.store.to_string())
            .field("fetch_window", &self.fetch_window)
            .finish()
    }
}

/// How long a stub keeps trying an unreachable store by default: 3 minutes.
pub const DEFAULT_FETCH_WINDOW: Duration = Duration::from_secs(180);

impl ByReference {
    /// Delivery through `store`, with the [`DEFAULT_FETCH_WINDOW`].
    pub fn new(store: Arc<dyn BootstrapDataStore>) -> Self {
        ByReference {
            store,
            fetch_window: DEFAULT_FETCH_WINDOW,
        }
    }

    /// Sets how long a stub keeps trying a store it cannot reach (no route, a reset, a
    /// 5xx or 429) before it fails the boot; a refusal (410, 404, 403, a wrong digest)
    /// fails it at once. At least a second.
    pub fn with_fetch_window(mut self, window: Duration) -> Self {
        self.fetch_window = window.max(Duration::from_secs(1));
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn BootstrapDataStore> {
        &self.store
    }

    /// The fetch window.
    pub fn fetch_window(&self) -> Duration {
        self.fetch_window
    }
}

/// The file name prefix of the failing script a cloud-init stub writes when it cannot
/// apply its document; the reason follows (`digest-mismatch`, `refused-410`,
/// `fetch-failed`, `certificate-mismatch`, ...), so cloud-init's verdict names it.
pub const FAILED_SCRIPT_PREFIX: &str = "machine-core-by-reference-failed-";

/// The file in cloud-init's instance directory (`/var/lib/cloud/instance/`) where a
/// cloud-init stub keeps the fetched document (mode 0600) for later boots.
pub const KEPT_DOCUMENT: &str = "user-data-by-reference.txt";

/// The SHA-256 of `document` in lower-case hex, as a cloud-init stub checks it.
pub fn document_sha256(document: &[u8]) -> String {
    hex::encode(Sha256::digest(document))
}

/// The cloud-init stub for `document` at `location`: a MIME multipart of the part
/// handler (see the [module docs](self)) and `completion_parts` (the completion check's,
/// which must run whatever becomes of the fetch). `max_bytes` bounds what the stub
/// reads; `fetch_window` is how long it keeps trying an unreachable store.
pub fn cloud_init_stub(
    location: &Location,
    document: &[u8],
    completion_parts: &[UserDataPart],
    fetch_window: Duration,
) -> Result<UserData> {
    let location = match location {
        Location::Https(h) => serde_json::json!({
            "kind": "https",
            "url": h.url.expose_secret(),
            "certificate": h.certificate_pem(),
            "certificate_sha256": h.certificate_sha256(),
        }),
        Location::AwsSecretsManager(s) => serde_json::json!({
            "kind": "aws-secretsmanager",
            "region": s.region,
            "endpoint": s.endpoint,
            "metadata": s.metadata_endpoint,
            "secret_ids": s.secret_ids,
        }),
    };
    let pointer = serde_json::json!({
        "location": location,
        "sha256": document_sha256(document),
        "max_bytes": document.len(),
        "fetch_for_s": fetch_window.as_secs().max(1),
    });
    let encoded = base64::engine::general_purpose::STANDARD.encode(pointer.to_string());
    // The pointer as a string literal split over short lines, so that the part needs no
    // transfer encoding (which would grow the stub by a third or more).
    let literal: Vec<String> = encoded
        .as_bytes()
        .chunks(72)
        .map(|c| format!("    \"{}\"\n", String::from_utf8_lossy(c)))
        .collect();
    let mut handler = String::new();
    for line in STUB_PY.lines() {
        // The comments are this module's documentation; the machine gets the code.
        if line.trim_start().starts_with('#') && !handler.is_empty() {
            continue;
        }
        if line.contains("@POINTER@") {
            handler.push_str("POINTER = json.loads(base64.b64decode(\n");
            handler.push_str(&literal.concat());
            handler.push_str(").decode(\"utf-8\"))\n");
        } else {
            handler.push_str(line);
            handler.push('\n');
        }
    }
    let mut hasher = Sha256::new();
    hasher.update(handler.as_bytes());
    let mut parts = vec![(
        "text/part-handler".to_owned(),
        "machine-core-by-reference.py".to_owned(),
        Vec::new(),
        handler.into_bytes(),
    )];
    for (i, part) in completion_parts.iter().enumerate() {
        part.check_headers()
            .map_err(|e| e.within(&format!("completion.parts[{i}]")))?;
        let Some(mime_type) = part.format.mime_type() else {
            return Err(Error::invalid_spec(
                format!("completion.parts[{i}]"),
                format!(
                    "part {:?} is {:?}, which cannot travel in a cloud-init stub",
                    part.filename, part.format
                ),
            ));
        };
        hasher.update(&part.content);
        parts.push((
            mime_type.to_owned(),
            format!("by-reference-{i:02}-{}", part.filename),
            part.headers.clone(),
            part.content.clone(),
        ));
    }
    let boundary = format!("==boundary-{}", hex::encode(&hasher.finalize()[..12]));
    let mut out =
        format!("Content-Type: multipart/mixed; boundary=\"{boundary}\"\nMIME-Version: 1.0\n\n");
    for (mime_type, filename, headers, content) in parts {
        out.push_str(&format!(
            "--{boundary}\nContent-Type: {mime_type}; charset=\"utf-8\"\nContent-Disposition: attachment; filename=\"{filename}\"\n"
        ));
        for (name, value) in headers {
            out.push_str(&format!("{name}: {value}\n"));
        }
        // Plain text goes as it is; anything else (bytes, very long lines) as base64.
        let plain = std::str::from_utf8(&content)
            .ok()
            .filter(|t| t.is_ascii() && t.lines().all(|l| l.len() <= 900 && !l.starts_with("--")));
        match plain {
            Some(text) => {
                out.push('\n');
                out.push_str(text);
                if !text.ends_with('\n') {
                    out.push('\n');
                }
            }
            None => {
                out.push_str("Content-Transfer-Encoding: base64\n\n");
                let b64 = base64::engine::general_purpose::STANDARD.encode(&content);
                for line in b64.as_bytes().chunks(76) {
                    out.push_str(&String::from_utf8_lossy(line));
                    out.push('\n');
                }
            }
        }
    }
    out.push_str(&format!("--{boundary}--\n"));
    Ok(UserData::new(UserDataFormat::Mime, out))
}

/// The Ignition stub for `document` at an HTTPS `location`: a config whose
/// `ignition.config.replace` fetches the document and verifies its SHA-512, trusting the
/// store's certificate alone. `fetch_window` bounds Ignition's HTTP retries
/// (`timeouts.httpTotal`). Any other kind of location is an invalid-spec error.
pub fn ignition_stub(
    location: &Location,
    document: &[u8],
    fetch_window: Duration,
) -> Result<UserData> {
    let Location::Https(h) = location else {
        return Err(Error::invalid_spec(
            "userData",
            "an Ignition stub fetches over HTTPS only: use an HTTPS bootstrap data store",
        ));
    };
    let ca = format!(
        "data:;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(h.certificate_pem())
    );
    let config = serde_json::json!({
        "ignition": {
            "version": "3.3.0",
            "config": {"replace": {
                "source": h.url.expose_secret(),
                "verification": {"hash": format!("sha512-{}", hex::encode(Sha512::digest(document)))},
            }},
            "security": {"tls": {"certificateAuthorities": [{"source": ca}]}},
            "timeouts": {"httpTotal": fetch_window.as_secs().clamp(1, i32::MAX as u64)},
        }
    });
    Ok(UserData::new(UserDataFormat::Ignition, config.to_string()))
}

/// `der` as a PEM certificate.
fn certificate_pem(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

/// The cloud-init part handler; `@POINTER@` is replaced by the base64 of its pointer.
const STUB_PY: &str = include_str!("bootstrap_data/stub.py");

#[cfg(test)]
mod tests {
    use super::*;

    fn https() -> Location {
        Location::Https(HttpsLocation::new(
            SecretString::from("https://10.0.0.1:8443/d/0123456789abcdef-token"),
            vec![1, 2, 3],
        ))
    }

    #[test]
    fn the_token_is_never_in_debug() {
        let shown = format!("{:?}", https());
        assert!(!shown.contains("token"), "{shown}");
        assert!(shown.contains(&document_sha256(&[1, 2, 3])), "{shown}");
    }

    #[test]
    fn the_cloud_init_stub_is_a_multipart_with_the_handler_first() {
        let waiter = crate::user_data::CompletionWaiter::files("/run/ok", "/run/ok.failed").part();
        let stub = cloud_init_stub(&https(), b"doc", &[waiter], Duration::from_secs(5)).unwrap();
        assert_eq!(stub.format, UserDataFormat::Mime);
        let text = String::from_utf8(stub.bytes.clone()).unwrap();
        let handler = text.find("text/part-handler").unwrap();
        let script = text.find("text/x-shellscript").unwrap();
        assert!(handler < script, "{text}");
        assert!(
            text.contains("by-reference-00-completion-waiter.sh"),
            "{text}"
        );
        assert!(!text.contains("@POINTER@"));
        // Deterministic: the same pointer and parts give the same bytes.
        let again = cloud_init_stub(
            &https(),
            b"doc",
            &[crate::user_data::CompletionWaiter::files("/run/ok", "/run/ok.failed").part()],
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(stub, again);
        assert!(!format!("{stub:?}").contains("token"));
    }

    #[test]
    fn the_ignition_stub_replaces_the_config_with_a_verified_one() {
        let stub = ignition_stub(&https(), b"{}", Duration::from_secs(60)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&stub.bytes).unwrap();
        let replace = &v["ignition"]["config"]["replace"];
        assert_eq!(
            replace["verification"]["hash"],
            format!("sha512-{}", hex::encode(Sha512::digest(b"{}")))
        );
        let sm = Location::AwsSecretsManager(SecretsManagerLocation::new("us-east-1", vec![]));
        let e = ignition_stub(&sm, b"{}", Duration::from_secs(60)).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidSpec);
    }
}
