//! A fault-injecting HTTP proxy between the SDK and moto, for the faults moto cannot
//! make: throttling (503 `RequestLimitExceeded`), 500s, dropped connections before or
//! after moto answered (a lost response), slow answers, and scripted EC2 errors for
//! one action (`InvalidInstanceID.NotFound` right after a create, as eventually
//! consistent EC2 answers). Everything else is forwarded to the real moto untouched.
//!
//! With [`FaultProxy::set_throttling`] it throttles as EC2 does, with token buckets
//! (see [`Throttling`]), answering 503 `RequestLimitExceeded` when a bucket is empty.
//!
//! It also gives RunInstances real EC2's `ClientToken` semantics, which moto lacks: the
//! first request with a token is forwarded and binds the token to its parameters and
//! answer; a later one with the same token and parameters gets that answer again (with
//! the instance's state updated once the proxy has seen it terminated), one with other
//! parameters gets `IdempotentParameterMismatch`. A token stays bound after the instance
//! is terminated, as EC2 keeps it for at least 24 hours. Requests with one token are
//! handled one at a time, so two racing launches cannot both reach moto.

use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

/// Shares of requests (0.0 to 1.0 each, drawn in this order) that get a fault.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Answered 503 `RequestLimitExceeded` without reaching moto.
    pub throttle: f64,
    /// Answered 500 `InternalError` without reaching moto.
    pub server_error: f64,
    /// Connection closed without an answer, before reaching moto.
    pub drop_before: f64,
    /// Forwarded to moto, then the connection is closed instead of answering: the
    /// request took effect but the client never learns it.
    pub drop_after: f64,
    /// Delayed by [`Faults::delay_for`] before being forwarded.
    pub delay: f64,
    /// How long a delayed request waits.
    pub delay_for: Duration,
    /// How long a filtered DescribeInstances answer is held after moto gave it: EC2's
    /// eventual consistency, where a listing shows the state of some time before its
    /// answer arrives (the provider assumes at most `token::VISIBILITY_LAG`, 5 s).
    pub listing_lag: Duration,
}

/// EC2's API throttling as documented in "Request throttling for the Amazon EC2 API"
/// (<https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html>, tables
/// "Request token bucket sizes and refill rates" and "Resource token bucket sizes and
/// refill rates"): a token bucket per API, sized and refilled by the API's category
/// (or its own row among the uncategorized actions), and for the actions that launch,
/// start, stop or terminate instances a second bucket counting instances. A request
/// that finds a bucket short is refused with 503 `RequestLimitExceeded` and takes no
/// token. The figures (maximum capacity, refill per second):
///
/// | bucket (one per API) | size | refill |
/// |---|---|---|
/// | non-mutating (`Describe*`, `Get*`, `List*`, `Search*`) | 100 | 20 |
/// | unfiltered and unpaginated non-mutating (`DescribeInstances`, `DescribeVolumes` and five more, with neither a filter nor `MaxResults`) | 50 | 10 |
/// | mutating (`StopInstances`, `RebootInstances`, ...) | 50 | 5 |
/// | `RunInstances` (uncategorized) | 5 | 2 |
/// | `StartInstances` (uncategorized) | 5 | 2 |
/// | `TerminateInstances` (uncategorized) | 100 | 5 |
/// | `CreateTags`, `DeleteTags` (uncategorized) | 100 | 10 |
/// | resource: `RunInstances`, `StartInstances` (instances) | 1000 | 2 |
/// | resource: `TerminateInstances`, `StopInstances` (instances) | 1000 | 20 |
///
/// The page does not say whether instance ids count as a filter; a lookup by ids is
/// taken from the standard bucket here, as ids narrow the answer as a filter does.
///
/// Sizes are EC2's; `speed` multiplies every refill rate, so that a test runs in
/// seconds what takes minutes on EC2 (at `speed` 10, RunInstances refills 20 a second)
/// while every burst stays what EC2 allows.
#[derive(Debug, Clone, Copy)]
pub struct Throttling {
    /// Factor on every refill rate (1.0: EC2's).
    pub speed: f64,
}

impl Throttling {
    /// EC2's buckets with refills `speed` times faster.
    pub fn ec2(speed: f64) -> Throttling {
        Throttling { speed }
    }
}

/// The request bucket of `action` (its key, size and refill per second) as the EC2
/// page above lists it; `unfiltered` for a listing with neither filter nor pagination.
fn request_bucket(action: &str, unfiltered: bool) -> (String, f64, f64) {
    let non_mutating = ["Describe", "Get", "List", "Search"]
        .iter()
        .any(|p| action.starts_with(p));
    let (size, refill) = match action {
        "RunInstances" | "StartInstances" => (5.0, 2.0),
        "TerminateInstances" => (100.0, 5.0),
        "CreateTags" | "DeleteTags" => (100.0, 10.0),
        "DescribeInstances"
        | "DescribeInstanceStatus"
        | "DescribeNetworkInterfaces"
        | "DescribeSecurityGroups"
        | "DescribeSnapshots"
        | "DescribeSpotInstanceRequests"
        | "DescribeVolumes"
            if unfiltered =>
        {
            return (format!("{action}/unfiltered"), 50.0, 10.0);
        }
        _ if non_mutating => (100.0, 20.0),
        _ => (50.0, 5.0),
    };
    (action.to_owned(), size, refill)
}

/// The resource bucket of `action` (instances), if it has one.
fn resource_bucket(action: &str) -> Option<(f64, f64)> {
    match action {
        "RunInstances" | "StartInstances" => Some((1000.0, 2.0)),
        "TerminateInstances" | "StopInstances" => Some((1000.0, 20.0)),
        _ => None,
    }
}

/// One token bucket.
struct Bucket {
    size: f64,
    refill: f64,
    tokens: f64,
    at: std::time::Instant,
}

impl Bucket {
    fn new(size: f64, refill: f64) -> Bucket {
        Bucket {
            size,
            refill,
            tokens: size,
            at: std::time::Instant::now(),
        }
    }

    fn refill(&mut self) {
        let now = std::time::Instant::now();
        self.tokens =
            (self.tokens + self.refill * now.duration_since(self.at).as_secs_f64()).min(self.size);
        self.at = now;
    }
}

/// The buckets EC2 keeps for one account and region.
struct Buckets {
    rules: Throttling,
    buckets: HashMap<String, Bucket>,
}

impl Buckets {
    /// Takes the tokens `action` needs, or none when a bucket is short.
    fn admit(&mut self, action: &str, body: &[u8]) -> bool {
        let text = std::str::from_utf8(body).unwrap_or("");
        let unfiltered = !text.contains("Filter.")
            && !text.contains("InstanceId.")
            && !text.contains("MaxResults=");
        let (key, size, refill) = request_bucket(action, unfiltered);
        let mut needs = vec![(key, size, refill, 1.0)];
        if let Some((size, refill)) = resource_bucket(action) {
            let count = if action == "RunInstances" {
                form_value(body, "MaxCount")
                    .and_then(|c| c.parse::<f64>().ok())
                    .unwrap_or(1.0)
            } else {
                text.matches("InstanceId.").count().max(1) as f64
            };
            needs.push((format!("{action}/instances"), size, refill, count));
        }
        let speed = self.rules.speed;
        for (key, size, refill, cost) in &needs {
            let b = self
                .buckets
                .entry(key.clone())
                .or_insert_with(|| Bucket::new(*size, refill * speed));
            b.refill();
            if b.tokens < *cost {
                return false;
            }
        }
        for (key, _, _, cost) in &needs {
            if let Some(b) = self.buckets.get_mut(key) {
                b.tokens -= cost;
            }
        }
        true
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Throttle,
    ServerError,
    DropBefore,
    DropAfter,
    Delay,
}

/// What a script answers instead of moto.
#[derive(Debug, Clone)]
enum Scripted {
    /// An EC2 error document with this HTTP status and code, without reaching moto.
    Error { status: u16, code: String },
    /// moto's answer cut short: the request takes effect, the client gets the first
    /// half of the body, framed as a whole answer (a proxy or load balancer that lost
    /// the rest). Unreadable XML to the client.
    Truncated,
}

struct Script {
    action: String,
    answer: Scripted,
    times: usize,
}

struct State {
    upstream: String,
    client: Client<HttpConnector, Full<Bytes>>,
    faults: Mutex<Faults>,
    rng: Mutex<fastrand::Rng>,
    scripts: Mutex<Vec<Script>>,
    seen: Mutex<HashMap<String, usize>>,
    forwarded: Mutex<HashMap<String, usize>>,
    injected: AtomicU64,
    /// Client token -> what it is bound to; the per-token lock orders racing launches.
    tokens: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Binding>>>>>,
    /// Instances the proxy has seen a TerminateInstances for.
    terminated: Mutex<HashSet<String>>,
    /// RunInstances answered from a token binding without reaching moto.
    replayed: AtomicU64,
    /// RunInstances refused with IdempotentParameterMismatch.
    mismatched: AtomicU64,
    /// DescribeInstances requests with filters (EC2's most expensive kind).
    filtered: AtomicU64,
    /// EC2's token buckets, when throttling is on.
    buckets: Mutex<Option<Buckets>>,
    /// Requests refused by a bucket, by action.
    throttled: Mutex<HashMap<String, usize>>,
    /// Whether RunInstances gets EC2's client-token semantics (else moto's: none).
    honour_tokens: std::sync::atomic::AtomicBool,
}

/// What a client token is bound to.
struct Binding {
    /// The request's parameters, the token left out.
    params: Vec<String>,
    /// moto's answer to the first request.
    answer: Bytes,
    instance_id: String,
}

/// The proxy; stops accepting when dropped.
pub struct FaultProxy {
    /// `http://127.0.0.1:<port>`: give this to the provider as its endpoint.
    pub endpoint: String,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` (`127.0.0.1:<port>`) with `faults`; needs a tokio
    /// runtime. `seed` makes the draws repeatable.
    pub async fn start(upstream: std::net::SocketAddr, faults: Faults, seed: u64) -> FaultProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port");
        let endpoint = format!("http://{}", listener.local_addr().expect("local addr"));
        let state = Arc::new(State {
            upstream: upstream.to_string(),
            client: Client::builder(TokioExecutor::new()).build_http(),
            faults: Mutex::new(faults),
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            scripts: Mutex::new(Vec::new()),
            seen: Mutex::new(HashMap::new()),
            forwarded: Mutex::new(HashMap::new()),
            injected: AtomicU64::new(0),
            tokens: Mutex::new(HashMap::new()),
            terminated: Mutex::new(HashSet::new()),
            replayed: AtomicU64::new(0),
            mismatched: AtomicU64::new(0),
            filtered: AtomicU64::new(0),
            buckets: Mutex::new(None),
            throttled: Mutex::new(HashMap::new()),
            honour_tokens: std::sync::atomic::AtomicBool::new(true),
        });
        let st = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let st = st.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(st.clone(), req));
                    // An injected drop ends the connection with an error: expected.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FaultProxy {
            endpoint,
            state,
            task,
        }
    }

    /// From now on passes RunInstances' client token to moto untouched, which ignores
    /// it: every launch launches, as on an endpoint declared `clientTokens: ignored`.
    pub fn ignore_client_tokens(&self) {
        self.state.honour_tokens.store(false, Ordering::SeqCst);
    }

    /// Replaces the fault rates (zero them to let everything through).
    pub fn set_faults(&self, faults: Faults) {
        *self.state.faults.lock().unwrap() = faults;
    }

    /// Answers the next `times` requests of `action` with HTTP `status` and EC2 error
    /// `code`, without reaching moto (an `InvalidInstanceID.*` code only requests that
    /// name instance ids). Scripts win over random faults.
    pub fn script(&self, action: &str, status: u16, code: &str, times: usize) {
        self.state.scripts.lock().unwrap().push(Script {
            action: action.to_owned(),
            answer: Scripted::Error {
                status,
                code: code.to_owned(),
            },
            times,
        });
    }

    /// Forwards the next `times` requests of `action` to moto and answers each with the
    /// first half of moto's answer, as a complete HTTP response: the request took
    /// effect, and its answer cannot be read. Scripts win over random faults.
    pub fn truncate(&self, action: &str, times: usize) {
        self.state.scripts.lock().unwrap().push(Script {
            action: action.to_owned(),
            answer: Scripted::Truncated,
            times,
        });
    }

    /// Throttles from now on as EC2 does (full buckets to start), or not at all.
    pub fn set_throttling(&self, throttling: Option<Throttling>) {
        *self.state.buckets.lock().unwrap() = throttling.map(|rules| Buckets {
            rules,
            buckets: HashMap::new(),
        });
    }

    /// Requests of `action` refused by a token bucket.
    pub fn throttled(&self, action: &str) -> usize {
        self.state
            .throttled
            .lock()
            .unwrap()
            .get(action)
            .copied()
            .unwrap_or(0)
    }

    /// Requests refused by a token bucket, all actions.
    pub fn total_throttled(&self) -> usize {
        self.state.throttled.lock().unwrap().values().sum()
    }

    /// Forgets every script, used up or not.
    pub fn clear_scripts(&self) {
        self.state.scripts.lock().unwrap().clear();
    }

    /// Requests of `action` received, whatever became of them.
    pub fn seen(&self, action: &str) -> usize {
        self.state
            .seen
            .lock()
            .unwrap()
            .get(action)
            .copied()
            .unwrap_or(0)
    }

    /// Requests of `action` that reached moto.
    pub fn forwarded(&self, action: &str) -> usize {
        self.state
            .forwarded
            .lock()
            .unwrap()
            .get(action)
            .copied()
            .unwrap_or(0)
    }

    /// Requests received in all.
    pub fn total_seen(&self) -> usize {
        self.state.seen.lock().unwrap().values().sum()
    }

    /// RunInstances answered from a bound client token (same parameters) without
    /// reaching moto.
    pub fn replayed(&self) -> u64 {
        self.state.replayed.load(Ordering::SeqCst)
    }

    /// DescribeInstances requests received that carry filters (tag lookups and
    /// listings, as against lookups by id).
    pub fn filtered_describes(&self) -> u64 {
        self.state.filtered.load(Ordering::SeqCst)
    }

    /// RunInstances refused with `IdempotentParameterMismatch`.
    pub fn mismatched(&self) -> u64 {
        self.state.mismatched.load(Ordering::SeqCst)
    }

    /// Faults injected so far (scripted ones included).
    pub fn injected(&self) -> u64 {
        self.state.injected.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl State {
    fn draw(&self) -> Fault {
        let f = self.faults.lock().unwrap().clone();
        let mut rng = self.rng.lock().unwrap();
        for (rate, fault) in [
            (f.throttle, Fault::Throttle),
            (f.server_error, Fault::ServerError),
            (f.drop_before, Fault::DropBefore),
            (f.drop_after, Fault::DropAfter),
            (f.delay, Fault::Delay),
        ] {
            if rng.f64() < rate {
                return fault;
            }
        }
        Fault::None
    }

    /// The scripted answer for this request, if any. EC2 answers
    /// `InvalidInstanceID.*` only to requests naming instance ids, never to a listing
    /// by filters, so such a script waits for a request that names one.
    fn scripted(&self, action: &str, body: &[u8]) -> Option<Scripted> {
        let names_ids = std::str::from_utf8(body).is_ok_and(|b| b.contains("InstanceId."));
        let mut scripts = self.scripts.lock().unwrap();
        let s = scripts.iter_mut().find(|s| {
            let by_id_only = matches!(&s.answer, Scripted::Error { code, .. } if code.starts_with("InvalidInstanceID"));
            s.action == action && s.times > 0 && (names_ids || !by_id_only)
        })?;
        s.times -= 1;
        Some(s.answer.clone())
    }
}

fn form_value<'a>(body: &'a [u8], key: &str) -> Option<&'a str> {
    std::str::from_utf8(body).ok()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then_some(v)
    })
}

/// The form's pairs other than `ClientToken`, sorted: what EC2 compares.
fn params_without_token(body: &[u8]) -> Vec<String> {
    let mut params: Vec<String> = std::str::from_utf8(body)
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.starts_with("ClientToken="))
        .map(str::to_owned)
        .collect();
    params.sort();
    params
}

/// The text between the first `<tag>` and `</tag>` in `xml`.
fn element<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let start = xml.find(&open)? + open.len();
    let len = xml[start..].find(&format!("</{tag}>"))?;
    Some(&xml[start..start + len])
}

fn ec2_error(status: u16, code: &str) -> Response<Full<Bytes>> {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code>\
         <Message>{code} (injected by the test proxy)</Message></Error></Errors>\
         <RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
    );
    Response::builder()
        .status(status)
        .header("content-type", "text/xml;charset=UTF-8")
        .body(Full::new(Bytes::from(body)))
        .expect("valid response")
}

async fn handle(
    st: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, io::Error> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(io::Error::other)?.to_bytes();
    let action = form_value(&body, "Action").unwrap_or("").to_owned();
    *st.seen.lock().unwrap().entry(action.clone()).or_default() += 1;
    let filtered_listing = action == "DescribeInstances"
        && std::str::from_utf8(&body).is_ok_and(|b| b.contains("Filter."));
    if filtered_listing {
        st.filtered.fetch_add(1, Ordering::SeqCst);
    }

    let admitted = st
        .buckets
        .lock()
        .unwrap()
        .as_mut()
        .is_none_or(|b| b.admit(&action, &body));
    if !admitted {
        *st.throttled.lock().unwrap().entry(action).or_default() += 1;
        return Ok(ec2_error(503, "RequestLimitExceeded"));
    }
    let scripted = st.scripted(&action, &body);
    if scripted.is_some() {
        st.injected.fetch_add(1, Ordering::SeqCst);
    }
    if let Some(Scripted::Error { status, code }) = &scripted {
        return Ok(ec2_error(*status, code));
    }
    let truncate = matches!(scripted, Some(Scripted::Truncated));
    let fault = if truncate { Fault::None } else { st.draw() };
    if fault != Fault::None {
        st.injected.fetch_add(1, Ordering::SeqCst);
    }
    match fault {
        Fault::Throttle => return Ok(ec2_error(503, "RequestLimitExceeded")),
        Fault::ServerError => return Ok(ec2_error(500, "InternalError")),
        Fault::DropBefore => return Err(io::Error::other("injected: connection dropped")),
        Fault::Delay => {
            let d = st.faults.lock().unwrap().delay_for;
            tokio::time::sleep(d).await;
        }
        Fault::None | Fault::DropAfter => {}
    }

    // What moto is sent is carried out whatever becomes of the client: a client that
    // goes away (a dropped future, a killed process) must not undo a launch's token
    // binding, as EC2 binds a token with the launch itself.
    tokio::spawn(forward(
        st,
        parts,
        body,
        action,
        fault,
        truncate,
        filtered_listing,
    ))
    .await
    .map_err(io::Error::other)?
}

/// The part of [`handle`] that reaches moto (or a token's binding) and answers.
async fn forward(
    st: Arc<State>,
    parts: hyper::http::request::Parts,
    body: Bytes,
    action: String,
    fault: Fault,
    truncate: bool,
    filtered_listing: bool,
) -> Result<Response<Full<Bytes>>, io::Error> {
    // Real EC2's ClientToken: the first launch with a token binds it; a repeat gets the
    // first answer or a mismatch, without reaching moto.
    let token = (action == "RunInstances" && st.honour_tokens.load(Ordering::SeqCst))
        .then(|| form_value(&body, "ClientToken").map(str::to_owned))
        .flatten();
    let slot = token.as_ref().map(|t| {
        st.tokens
            .lock()
            .unwrap()
            .entry(t.clone())
            .or_default()
            .clone()
    });
    let mut bound = match &slot {
        Some(slot) => Some(slot.clone().lock_owned().await),
        None => None,
    };
    if let Some(Some(binding)) = bound.as_deref() {
        if binding.params != params_without_token(&body) {
            st.mismatched.fetch_add(1, Ordering::SeqCst);
            return Ok(ec2_error(400, "IdempotentParameterMismatch"));
        }
        st.replayed.fetch_add(1, Ordering::SeqCst);
        let mut answer = String::from_utf8_lossy(&binding.answer).into_owned();
        if st.terminated.lock().unwrap().contains(&binding.instance_id) {
            answer = answer.replacen(
                "<instanceState><code>0</code><name>pending</name></instanceState>",
                "<instanceState><code>48</code><name>terminated</name></instanceState>",
                1,
            );
        }
        return Ok(Response::builder()
            .status(200)
            .header("content-type", "text/xml;charset=UTF-8")
            .body(Full::new(Bytes::from(answer)))
            .expect("valid response"));
    }
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut forward = Request::builder()
        .method(parts.method.clone())
        .uri(format!("http://{}{path}", st.upstream));
    for (k, v) in &parts.headers {
        forward = forward.header(k, v);
    }
    let forward = forward
        .body(Full::new(body.clone()))
        .map_err(io::Error::other)?;
    let answer = st.client.request(forward).await.map_err(io::Error::other)?;
    let (rparts, rbody) = answer.into_parts();
    let rbody = rbody.collect().await.map_err(io::Error::other)?.to_bytes();
    if action == "TerminateInstances" && rparts.status.is_success() {
        let text = String::from_utf8_lossy(&body).into_owned();
        let mut terminated = st.terminated.lock().unwrap();
        for pair in text.split('&') {
            if let Some((k, v)) = pair.split_once('=')
                && k.starts_with("InstanceId.")
            {
                terminated.insert(v.to_owned());
            }
        }
    }
    *st.forwarded.lock().unwrap().entry(action).or_default() += 1;
    if let Some(bound) = bound.as_deref_mut()
        && rparts.status.is_success()
    {
        let text = String::from_utf8_lossy(&rbody);
        *bound = Some(Binding {
            params: params_without_token(&body),
            answer: rbody.clone(),
            instance_id: element(&text, "instanceId").unwrap_or("").to_owned(),
        });
    }
    if fault == Fault::DropAfter {
        return Err(io::Error::other("injected: answer lost"));
    }
    if filtered_listing {
        let lag = st.faults.lock().unwrap().listing_lag;
        tokio::time::sleep(lag).await;
    }
    let rbody = if truncate {
        rbody.slice(..rbody.len() / 2)
    } else {
        rbody
    };
    let mut response = Response::from_parts(rparts, Full::new(rbody.clone()));
    // The length of what is sent, so that the answer is whole to HTTP and cut to XML.
    response.headers_mut().insert(
        hyper::header::CONTENT_LENGTH,
        hyper::header::HeaderValue::from(rbody.len()),
    );
    Ok(response)
}

/// The conformance suite's [`FaultHook`](machine_core::conformance::FaultHook) on a
/// proxy: while a fault is injected, every RunInstances is answered with EC2's own
/// error document for it (the code and HTTP status EC2 sends), without reaching moto.
pub struct Ec2Faults {
    proxy: Arc<FaultProxy>,
    /// The proxy's count of injected faults when the current fault was injected.
    since: AtomicU64,
}

impl Ec2Faults {
    /// A hook on `proxy`.
    pub fn new(proxy: Arc<FaultProxy>) -> Ec2Faults {
        Ec2Faults {
            proxy,
            since: AtomicU64::new(0),
        }
    }

    /// EC2's answer to a launch refused with `fault`: HTTP status and error code.
    fn answer(fault: machine_core::conformance::BackendFault) -> Option<(u16, &'static str)> {
        use machine_core::conformance::BackendFault as F;
        match fault {
            F::Quota => Some((400, "InstanceLimitExceeded")),
            F::Capacity => Some((500, "InsufficientInstanceCapacity")),
            F::Permission => Some((403, "UnauthorizedOperation")),
            F::Throttle => Some((503, "RequestLimitExceeded")),
            _ => None,
        }
    }
}

#[async_trait::async_trait]
impl machine_core::conformance::FaultHook for Ec2Faults {
    fn supports(&self, fault: machine_core::conformance::BackendFault) -> bool {
        Ec2Faults::answer(fault).is_some()
    }

    async fn inject(&self, fault: machine_core::conformance::BackendFault) {
        let (status, code) = Ec2Faults::answer(fault).expect("a supported fault");
        self.proxy.clear_scripts();
        self.since.store(self.proxy.injected(), Ordering::SeqCst);
        self.proxy.script("RunInstances", status, code, usize::MAX);
    }

    async fn clear(&self) {
        self.proxy.clear_scripts();
    }

    fn answered(&self) -> u64 {
        self.proxy.injected() - self.since.load(Ordering::SeqCst)
    }
}
