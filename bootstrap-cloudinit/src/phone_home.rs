//! Phone home: the machine POSTs form data (its verdict, instance id, host names, host
//! public keys) to a URL when cloud-init has finished. [`PhoneHomeListener`] is the small
//! HTTP endpoint the caller runs to receive it; [`PhoneHomeCheck`] turns what arrived
//! into a [`Completion`] for the composer.
//!
//! The post comes from machine-core's [`CompletionWaiter`], not from cloud-init's
//! `phone_home` module: that module posts from the final stage even after a script,
//! `runcmd` or module failed, and before any part that runs after it, so its post does not
//! mean success.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use machine_core::user_data::CompletionWaiter;
use machine_core::{Completion, CompletionCheck, Error, Machine, Result, Transport, UserDataPart};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::model::{PhoneHome, PhoneHomePost};

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
    /// The form fields (`result`, `errors`, `instance_id`, `hostname`, `fqdn`,
    /// `pub_key_ed25519`, ...). Public data only: no secrets are posted.
    pub fields: BTreeMap<String, String>,
}

impl PhoneHomeReport {
    /// The verdict the post carries: `result=done` is [`Completion::Done`],
    /// `result=error` is [`Completion::Failed`] with cloud-init's error lines (the
    /// `errors` field). `None` for a post without a verdict (cloud-init's own
    /// `phone_home` module sends one), which says nothing about success.
    pub fn verdict(&self) -> Option<Completion> {
        match self.fields.get("result").map(String::as_str) {
            Some("done") => Some(Completion::Done),
            Some(_) => {
                let errors = self.fields.get("errors").map_or("", String::as_str);
                let lines: Vec<&str> = errors.lines().filter(|l| !l.trim().is_empty()).collect();
                Some(Completion::Failed(format!(
                    "cloud-init failed: {}",
                    if lines.is_empty() {
                        "no error lines posted".to_owned()
                    } else {
                        lines.join("; ")
                    }
                )))
            }
            None => None,
        }
    }
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

    /// A report that arrived whose `hostname` field is `hostname`, one with a verdict
    /// when there is one.
    pub fn report_by_hostname(&self, hostname: &str) -> Option<PhoneHomeReport> {
        self.reports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|r| r.fields.get("hostname").is_some_and(|h| h == hostname))
            .max_by_key(|r| r.verdict().is_some())
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
        let mut reports = reports.lock().unwrap_or_else(|p| p.into_inner());
        // A post without a verdict never hides one that arrived.
        let hides_verdict = r.verdict().is_none()
            && reports
                .get(&r.path_id)
                .is_some_and(|old| old.verdict().is_some());
        if !hides_verdict {
            reports.insert(r.path_id.clone(), r);
        }
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

/// Completion by phone home, true to every part: its user-data part is a
/// [`CompletionWaiter`] that POSTs cloud-init's verdict to the listener once cloud-init's
/// final stage is over (see [`PhoneHomeReport::verdict`]). The check reports the verdict
/// of the post for the machine (matched by instance id = the provider id's last segment,
/// or by host name = machine name): Done only when cloud-init recorded no error in any
/// stage, Failed with cloud-init's error lines otherwise, Pending until a verdict arrives.
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

    /// A cloud-init `phone_home` entry posting to the same listener, for callers who
    /// want cloud-init's own post as well. The check does not rely on it: that post
    /// carries no verdict and comes even after a failed part.
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

/// How many times the waiter tries to post (as cloud-init's `phone_home` default).
const POST_TRIES: u32 = 10;

#[async_trait]
impl CompletionCheck for PhoneHomeCheck {
    fn user_data_parts(&self, _spec: &machine_core::MachineSpec) -> Vec<UserDataPart> {
        vec![CompletionWaiter::post(self.listener.url(&self.host), POST_TRIES).part()]
    }

    async fn check(&self, machine: &Machine, _transport: &dyn Transport) -> Result<Completion> {
        let verdict = [
            self.listener.report(machine.provider_id.resource_id()),
            self.listener.report_by_hostname(machine.name.as_str()),
        ]
        .into_iter()
        .flatten()
        .find_map(|r| r.verdict());
        Ok(verdict.unwrap_or(Completion::Pending))
    }
}
