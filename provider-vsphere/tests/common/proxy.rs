//! A fault-injecting HTTP proxy in front of vcsim, for the refusals vcsim never gives:
//! every request is forwarded to the real vcsim untouched, except a SOAP method the
//! test picked, which is answered the way vCenter answers it when it refuses:
//!
//! - a SOAP fault on the call itself (HTTP 500, `soapenv:Fault` with the fault's
//!   detail), as vCenter answers a missing privilege (`NoPermission`) before any task
//!   is made;
//! - a task that fails: the call is answered with a task of the proxy's, whose `info`
//!   then reads `state` error with the fault, as vCenter reports admission control or
//!   placement refusing a VM (`InsufficientMemoryResourcesFault`) from CloneVM_Task or
//!   PowerOnVM_Task;
//! - forwarded, then answered with a SOAP fault: the call took effect, but its caller
//!   is told otherwise (`DuplicateName` after a racing clone took the name; an update
//!   set lost on the way);
//! - answered as done without being forwarded: a request the guest ignores
//!   (`ShutdownGuest` or `RebootGuest` to a hung guest whose VMware Tools took it).
//!
//! It also serves [`machine_core::conformance::FaultHook`] for the conformance suite.
//! The provider talks plain HTTP to it (`insecure`); it talks TLS to vcsim, pinned.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use machine_core::conformance::{BackendFault, FaultHook};
use provider_http::{HttpClient, HttpSettings, TlsConfig};
use provider_vsphere::{VsphereConfigBuilder, VsphereProvider};

use super::Vcsim;

/// How a picked method is answered.
#[derive(Debug, Clone)]
pub enum Answer {
    /// A SOAP fault on the call: the fault type (`NoPermission`), its detail's inner
    /// XML and the server's words.
    Fault {
        kind: String,
        detail: String,
        message: String,
    },
    /// A task of the proxy's, whose `info` reads this fault as its error.
    FailedTask {
        kind: String,
        detail: String,
        message: String,
    },
    /// Forwarded to vcsim, then the caller gets this SOAP fault instead of the answer.
    ForwardThenFault {
        kind: String,
        detail: String,
        message: String,
    },
    /// Answered as done (an empty response), not forwarded.
    Ignored,
}

impl Answer {
    /// vCenter's answer to a clone its caller may not make.
    pub fn no_permission() -> Answer {
        Answer::Fault {
            kind: "NoPermission".into(),
            detail: "<object type=\"Folder\">group-v3</object><privilegeId>VirtualMachine.Inventory.CreateFromExisting</privilegeId>".into(),
            message: "Permission to perform this operation was denied.".into(),
        }
    }

    /// vCenter's task error when the resource pool cannot hold the VM's memory.
    pub fn insufficient_memory() -> Answer {
        Answer::FailedTask {
            kind: "InsufficientMemoryResourcesFault".into(),
            detail: "<unreserved>0</unreserved><requested>67108864</requested>".into(),
            message: "The available Memory resources in the parent resource pool are insufficient for the operation.".into(),
        }
    }

    /// vCenter's answer to a second VM of one name in a folder.
    pub fn duplicate_name_after_forwarding(name: &str) -> Answer {
        Answer::ForwardThenFault {
            kind: "DuplicateName".into(),
            detail: format!("<name>{name}</name><object type=\"Folder\">group-v3</object>"),
            message: format!("The name '{name}' already exists."),
        }
    }
}

/// What the proxy does now.
#[derive(Default)]
struct Rule {
    /// The method answered, and how.
    picked: Option<(String, Answer)>,
    /// Tasks of the proxy's that failed, with their fault.
    tasks: Vec<(String, Answer)>,
    serial: u64,
}

struct State {
    upstream: String,
    http: HttpClient,
    rule: Mutex<Rule>,
    answered: AtomicU64,
    forwarded: AtomicU64,
    /// Every request seen: its method and body.
    seen: Mutex<Vec<(String, String)>>,
}

/// The proxy, listening on a loopback port until dropped.
pub struct FaultProxy {
    /// `http://127.0.0.1:<port>/sdk`.
    pub url: String,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy in front of `vcsim`, on the current tokio runtime.
    pub async fn start(vcsim: &Vcsim) -> FaultProxy {
        let http = HttpClient::new(
            &HttpSettings::new().with_tls(TlsConfig::new().with_pinned_sha256(vcsim.fingerprint)),
        )
        .expect("http client");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let url = format!(
            "http://{}/sdk",
            listener.local_addr().expect("local address")
        );
        let state = Arc::new(State {
            upstream: vcsim.url.clone(),
            http,
            rule: Mutex::new(Rule::default()),
            answered: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            seen: Mutex::new(Vec::new()),
        });
        let serving = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = serving.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(handle(&state, req).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FaultProxy { url, state, task }
    }

    /// From now on, `method` is answered with `answer`; resets [`FaultProxy::answered`].
    pub fn pick(&self, method: &str, answer: Answer) {
        self.state.rule.lock().unwrap().picked = Some((method.to_owned(), answer));
        self.state.answered.store(0, Ordering::SeqCst);
    }

    /// Forwards everything again (tasks already failed keep reading failed).
    pub fn clear(&self) {
        self.state.rule.lock().unwrap().picked = None;
    }

    /// Requests of the picked method answered with its fault since the last pick.
    pub fn answered(&self) -> u64 {
        self.state.answered.load(Ordering::SeqCst)
    }

    /// Requests forwarded to vcsim so far.
    pub fn forwarded(&self) -> u64 {
        self.state.forwarded.load(Ordering::SeqCst)
    }

    /// Every request seen so far (method, body), oldest first.
    pub fn seen(&self) -> Vec<(String, String)> {
        self.state.seen.lock().unwrap().clone()
    }

    /// How many requests of `method` were seen so far.
    pub fn calls(&self, method: &str) -> usize {
        self.state
            .seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, _)| m == method)
            .count()
    }

    /// A provider built from `config`, talking to vcsim through this proxy: plain HTTP
    /// to the proxy (`insecure`), which speaks TLS to vcsim.
    pub fn provider(&self, config: VsphereConfigBuilder) -> VsphereProvider {
        VsphereProvider::new(
            config
                .url(&self.url)
                .insecure(true)
                .build()
                .expect("test config"),
        )
        .expect("provider")
    }

    /// The conformance suite's hook on this proxy.
    pub fn hook(self: &Arc<Self>) -> Arc<dyn FaultHook> {
        Arc::new(Hook(self.clone()))
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The conformance hook: vCenter's refusals of CloneVM_Task.
struct Hook(Arc<FaultProxy>);

#[async_trait]
impl FaultHook for Hook {
    /// vCenter refuses a clone for permission (NoPermission) and for capacity (the
    /// InsufficientResourcesFault family); it has no per-account machine quota and its
    /// SOAP API has no throttling answer (see the provider's errors module).
    fn supports(&self, fault: BackendFault) -> bool {
        matches!(fault, BackendFault::Permission | BackendFault::Capacity)
    }

    async fn inject(&self, fault: BackendFault) {
        let answer = match fault {
            BackendFault::Permission => Answer::no_permission(),
            BackendFault::Capacity => Answer::insufficient_memory(),
            other => panic!("the vCenter hook was asked for {other}, which it does not support"),
        };
        self.0.pick("CloneVM_Task", answer);
    }

    async fn clear(&self) {
        self.0.clear();
    }

    fn answered(&self) -> u64 {
        self.0.answered()
    }
}

/// The SOAP method of a request body: the first element inside `soapenv:Body`.
fn method_of(body: &str) -> Option<&str> {
    let rest = &body[body.find(":Body>")? + ":Body>".len()..];
    let rest = rest.trim_start().strip_prefix('<')?;
    let end = rest.find(|c: char| c.is_whitespace() || c == '>' || c == '/')?;
    Some(&rest[..end])
}

fn envelope(inner: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><soapenv:Envelope xmlns:soapenc=\"http://schemas.xmlsoap.org/soap/encoding/\" xmlns:soapenv=\"http://schemas.xmlsoap.org/soap/envelope/\" xmlns:xsd=\"http://www.w3.org/2001/XMLSchema\" xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\"><soapenv:Body>{inner}</soapenv:Body></soapenv:Envelope>"
    )
}

fn reply(status: u16, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("Content-Type", "text/xml; charset=utf-8")
        .body(Full::new(Bytes::from(body)))
        .expect("a response")
}

/// A SOAP fault as vCenter sends it: HTTP 500, the type in the detail's `xsi:type`.
fn soap_fault(kind: &str, detail: &str, message: &str) -> Response<Full<Bytes>> {
    reply(
        500,
        envelope(&format!(
            "<soapenv:Fault><faultcode>ServerFaultCode</faultcode><faultstring>{message}</faultstring><detail><{kind}Fault xmlns=\"urn:vim25\" xsi:type=\"{kind}\">{detail}</{kind}Fault></detail></soapenv:Fault>"
        )),
    )
}

async fn handle(state: &State, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let headers = req.headers().clone();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return reply(400, String::new()),
    };
    let text = String::from_utf8_lossy(&body).into_owned();
    let method = method_of(&text).unwrap_or("").to_owned();
    state
        .seen
        .lock()
        .unwrap()
        .push((method.clone(), text.clone()));

    // A task of the proxy's, read by the caller waiting for it.
    let failed_task = {
        let rule = state.rule.lock().unwrap();
        rule.tasks
            .iter()
            .find(|(id, _)| method == "RetrievePropertiesEx" && text.contains(&format!(">{id}<")))
            .cloned()
    };
    if let Some((
        id,
        Answer::FailedTask {
            kind,
            detail,
            message,
        },
    )) = failed_task
    {
        return reply(
            200,
            envelope(&format!(
                "<RetrievePropertiesExResponse xmlns=\"urn:vim25\"><returnval><objects><obj type=\"Task\">{id}</obj><propSet><name>info</name><val xsi:type=\"TaskInfo\"><key>{id}</key><task type=\"Task\">{id}</task><state>error</state><cancelled>false</cancelled><cancelable>false</cancelable><error><fault xsi:type=\"{kind}\">{detail}</fault><localizedMessage>{message}</localizedMessage></error></val></propSet></objects></returnval></RetrievePropertiesExResponse>"
            )),
        );
    }

    let picked = {
        let mut rule = state.rule.lock().unwrap();
        match rule.picked.clone() {
            Some((m, answer)) if m == method => {
                state.answered.fetch_add(1, Ordering::SeqCst);
                if let Answer::FailedTask { .. } = answer {
                    rule.serial += 1;
                    let id = format!("task-proxy-{}", rule.serial);
                    rule.tasks.push((id.clone(), answer.clone()));
                    return reply(
                        200,
                        envelope(&format!(
                            "<{method}Response xmlns=\"urn:vim25\"><returnval type=\"Task\">{id}</returnval></{method}Response>"
                        )),
                    );
                }
                Some(answer)
            }
            _ => None,
        }
    };
    if let Some(Answer::Fault {
        kind,
        detail,
        message,
    }) = &picked
    {
        return soap_fault(kind, detail, message);
    }
    if let Some(Answer::Ignored) = &picked {
        return reply(
            200,
            envelope(&format!(
                "<{method}Response xmlns=\"urn:vim25\"></{method}Response>"
            )),
        );
    }

    let mut forward = state.http.inner().post(&state.upstream).body(body);
    for name in ["content-type", "soapaction", "cookie"] {
        if let Some(v) = headers.get(name) {
            forward = forward.header(name, v.as_bytes());
        }
    }
    state.forwarded.fetch_add(1, Ordering::SeqCst);
    let Ok(answer) = state.http.send(forward).await else {
        return reply(502, String::new());
    };
    if let Some(Answer::ForwardThenFault {
        kind,
        detail,
        message,
    }) = &picked
    {
        return soap_fault(kind, detail, message);
    }
    let status = answer.status().as_u16();
    let cookies: Vec<_> = answer
        .headers()
        .get_all("set-cookie")
        .iter()
        .cloned()
        .collect();
    let bytes = answer.bytes().await.unwrap_or_default();
    let mut out = Response::builder()
        .status(status)
        .header("Content-Type", "text/xml; charset=utf-8");
    for c in cookies {
        out = out.header("set-cookie", c);
    }
    out.body(Full::new(bytes)).expect("a response")
}
