//! phone_home: cloud-init POSTs form data (instance id, host names, host public keys)
//! to a URL when it has finished. [`PhoneHomeListener`] is the small HTTP endpoint the
//! caller runs to receive it; [`PhoneHomeCheck`] turns what arrived into a
//! [`Completion`] for the composer.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use machine_core::{
    Completion, CompletionCheck, Error, Machine, Result, Transport, UserDataFormat, UserDataPart,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::merge::MERGE_TYPE;
use crate::model::{CloudConfig, PhoneHome, PhoneHomePost};
use crate::render::render;

/// The largest request accepted, head and body (cloud-init posts a few public keys: a
/// few KiB); a larger announced `Content-Length` is answered 413 before reading the body.
const MAX_REQUEST: usize = 64 * 1024;

/// How long one request may take to arrive.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// What one machine posted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhoneHomeReport {
    /// The path segment after `/phone-home/` (cloud-init's `$INSTANCE_ID`).
    pub path_id: String,
    /// The form fields (`instance_id`, `hostname`, `fqdn`, `pub_key_ed25519`, ...).
    /// Public data only: cloud-init posts no secrets.
    pub fields: BTreeMap<String, String>,
}

type Reports = Arc<Mutex<HashMap<String, PhoneHomeReport>>>;

/// An HTTP endpoint on a TCP listener that records phone_home posts, keyed by the
/// instance id in the URL. It runs on a tokio task until dropped.
pub struct PhoneHomeListener {
    addr: SocketAddr,
    reports: Reports,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for PhoneHomeListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhoneHomeListener")
            .field("addr", &self.addr)
            .finish()
    }
}

impl PhoneHomeListener {
    /// Listens on `addr` (port 0 for any free port) and serves until dropped.
    pub async fn bind(addr: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| Error::permanent(format!("cannot listen on {addr}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::permanent(format!("no local address: {e}")))?;
        let reports: Reports = Arc::default();
        let shared = reports.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, peer)) = listener.accept().await else {
                    continue;
                };
                let shared = shared.clone();
                tokio::spawn(async move {
                    // A client that stalls mid-request is dropped rather than held.
                    match tokio::time::timeout(REQUEST_TIMEOUT, serve(stream, &shared)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "phone_home request refused")
                        }
                        Err(_) => tracing::debug!(%peer, "phone_home request timed out"),
                    }
                });
            }
        });
        Ok(PhoneHomeListener {
            addr,
            reports,
            task,
        })
    }

    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL machines post to, with `host` as they reach this listener (an address
    /// or name; the listener's own port is added), and cloud-init's `$INSTANCE_ID`.
    pub fn url(&self, host: &str) -> String {
        format!("http://{host}:{}/phone-home/$INSTANCE_ID", self.addr.port())
    }

    /// The report posted under `instance_id`, if one arrived.
    pub fn report(&self, instance_id: &str) -> Option<PhoneHomeReport> {
        self.reports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(instance_id)
            .cloned()
    }

    /// Every report that arrived whose `hostname` field is `hostname`.
    pub fn report_by_hostname(&self, hostname: &str) -> Option<PhoneHomeReport> {
        self.reports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .find(|r| r.fields.get("hostname").is_some_and(|h| h == hostname))
            .cloned()
    }
}

impl Drop for PhoneHomeListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut stream: TcpStream, reports: &Reports) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let (status, report) = loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_REQUEST {
            break ("413 Content Too Large", None);
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        let head_len = match req.parse(&buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => continue,
            Err(_) => break ("400 Bad Request", None),
        };
        let len = match content_length(req.headers) {
            Ok(len) if len <= MAX_REQUEST - head_len.min(MAX_REQUEST) => len,
            Ok(_) => break ("413 Content Too Large", None),
            Err(status) => break (status, None),
        };
        if buf.len() < head_len + len {
            continue;
        }
        let path = req.path.unwrap_or_default();
        let Some(id) = path
            .strip_prefix("/phone-home/")
            .map(|s| s.trim_end_matches('/'))
            .filter(|s| !s.is_empty() && !s.contains('/'))
        else {
            break ("404 Not Found", None);
        };
        if req.method != Some("POST") {
            break ("405 Method Not Allowed", None);
        }
        let body = &buf[head_len..head_len + len];
        let fields = form_urlencoded::parse(body).into_owned().collect();
        break (
            "200 OK",
            Some(PhoneHomeReport {
                path_id: id.to_owned(),
                fields,
            }),
        );
    };
    if let Some(r) = report {
        tracing::info!(instance = %r.path_id, "phone_home received");
        reports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(r.path_id.clone(), r);
    }
    let response = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// The body length a request announces, read strictly (RFC 9110 8.6): digits only, and
/// several `Content-Length` headers must agree. A number too large for `usize` is
/// `usize::MAX`, so the caller refuses it as too large rather than overflowing.
fn content_length(headers: &[httparse::Header<'_>]) -> std::result::Result<usize, &'static str> {
    let mut found: Option<usize> = None;
    for h in headers {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // cloud-init sends a length; chunked bodies are not read here.
            return Err("411 Length Required");
        }
        if !h.name.eq_ignore_ascii_case("content-length") {
            continue;
        }
        let v = h.value.trim_ascii();
        if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
            return Err("400 Bad Request");
        }
        // Digits only, so the text is ASCII and the one failure left is overflow.
        let n = std::str::from_utf8(v)
            .ok()
            .and_then(|t| t.parse::<usize>().ok())
            .unwrap_or(usize::MAX);
        if found.is_some_and(|f| f != n) {
            return Err("400 Bad Request");
        }
        found = Some(n);
    }
    Ok(found.unwrap_or(0))
}

/// Completion by phone_home: adds a cloud-config part that makes cloud-init post to
/// the listener, and reports Done once a post for the machine arrived (matched by
/// instance id = the provider id's last segment, or by host name = machine name).
#[derive(Debug, Clone)]
pub struct PhoneHomeCheck {
    listener: Arc<PhoneHomeListener>,
    host: String,
}

impl PhoneHomeCheck {
    /// A check on `listener`, which machines reach at `host`.
    pub fn new(listener: Arc<PhoneHomeListener>, host: impl Into<String>) -> Self {
        PhoneHomeCheck {
            listener,
            host: host.into(),
        }
    }

    /// The `phone_home` entry for a cloud-config.
    pub fn phone_home(&self) -> PhoneHome {
        PhoneHome {
            url: self.listener.url(&self.host),
            post: PhoneHomePost::Fields(
                ["instance_id", "hostname", "fqdn", "pub_key_ed25519"]
                    .map(String::from)
                    .to_vec(),
            ),
            tries: Some(10),
        }
    }
}

#[async_trait]
impl CompletionCheck for PhoneHomeCheck {
    fn user_data_parts(&self, _spec: &machine_core::MachineSpec) -> Vec<UserDataPart> {
        let config = CloudConfig {
            phone_home: Some(self.phone_home()),
            ..CloudConfig::default()
        };
        match render(&config) {
            Ok(doc) => vec![
                UserDataPart::new(UserDataFormat::CloudConfig, "zz-phone-home.yaml", doc)
                    .with_header("Merge-Type", MERGE_TYPE),
            ],
            Err(e) => {
                tracing::error!(error = %e, "phone_home part not rendered");
                Vec::new()
            }
        }
    }

    async fn check(&self, machine: &Machine, _transport: &dyn Transport) -> Result<Completion> {
        let found = self
            .listener
            .report(machine.provider_id.resource_id())
            .or_else(|| self.listener.report_by_hostname(machine.name.as_str()));
        Ok(if found.is_some() {
            Completion::Done
        } else {
            Completion::Pending
        })
    }
}
