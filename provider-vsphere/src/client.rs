//! The vim25 SOAP calls the provider makes, typed, over one HTTP client: a session
//! (cookie `vmware_soap_session`) logged in on first use and again, once, when the
//! server answers NotAuthenticated (an expired or dropped session).
//!
//! One session serves every provider of a process that reaches the same vCenter as the
//! same user with the same TLS settings ([`Client::shared`]): one login, one connection
//! pool. While it is idle, a keep-alive call (`CurrentTime`) every
//! [`crate::VsphereConfigBuilder::keep_alive`] keeps vCenter from ending it; when the
//! last provider using it is dropped, it logs out (best effort, on the tokio runtime it
//! is dropped on).
//!
//! Request bodies are written by hand, in the element order the vim25 schema fixes
//! (vCenter rejects other orders); answers are read with [`crate::xml`].

use std::fmt;
use std::fmt::Write as _;
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use machine_core::{Error, ExposeSecret, Result, SecretString};
use tokio::sync::{Mutex, OnceCell, RwLock};
use tokio::time::Instant;

use crate::errors::{self, Fault};
use crate::xml::{self, Element, escape};

/// The API version asked for: every vCenter since 6.5 (and vcsim) speaks it.
const SOAP_ACTION: &str = "\"urn:vim25/6.5\"";
/// The session cookie vCenter sets at Login.
const SESSION_COOKIE: &str = "vmware_soap_session";
/// Answers larger than this are refused rather than read into memory.
const MAX_ANSWER: usize = 64 * 1024 * 1024;
/// How long a long poll's answer may take beyond the wait it asked for.
const CALL_MARGIN: Duration = Duration::from_secs(30);

/// A managed object reference (`vm-57` of type `VirtualMachine`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Moref {
    /// The managed object type.
    pub kind: String,
    /// The id within its type.
    pub value: String,
}

impl Moref {
    /// A reference of `kind` to `value`.
    pub fn new(kind: &str, value: &str) -> Moref {
        Moref {
            kind: kind.to_owned(),
            value: value.to_owned(),
        }
    }

    /// The reference as the element `tag` of a request.
    pub fn xml(&self, tag: &str) -> String {
        format!(
            "<{tag} type=\"{}\">{}</{tag}>",
            escape(&self.kind),
            escape(&self.value)
        )
    }

    /// A reference read from an answer's element (`<x type="T">v</x>`).
    pub fn from_element(e: &Element) -> Option<Moref> {
        let kind = e.attr("type")?;
        let value = e.text.trim();
        (!value.is_empty()).then(|| Moref::new(kind, value))
    }

    /// The numeric part of the id (`vm-57` is 57): vCenter hands ids out in increasing
    /// order, so it orders objects by creation.
    pub fn serial(&self) -> u64 {
        self.value
            .rsplit('-')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(u64::MAX)
    }
}

impl fmt::Display for Moref {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.value)
    }
}

/// The service's well-known objects.
#[derive(Debug, Clone)]
pub(crate) struct ServiceContent {
    pub property_collector: Moref,
    pub search_index: Moref,
    pub session_manager: Moref,
    pub view_manager: Moref,
}

/// One object of a property retrieval: its reference and the properties asked for.
#[derive(Debug, Clone)]
pub(crate) struct ObjectContent {
    pub obj: Moref,
    /// (property path, `val` element).
    pub props: Vec<(String, Element)>,
}

impl ObjectContent {
    /// The value element of property `path`.
    pub fn prop(&self, path: &str) -> Option<&Element> {
        self.props.iter().find(|(p, _)| p == path).map(|(_, v)| v)
    }

    /// The text of property `path`.
    pub fn text(&self, path: &str) -> Option<&str> {
        self.prop(path).map(|v| v.text.as_str())
    }
}

/// Builds the HTTP client (the workspace's shared one: verified TLS by default).
pub(crate) fn http_client(
    tls: &provider_http::TlsConfig,
    connect_timeout: Duration,
    timeout: Duration,
) -> Result<provider_http::HttpClient> {
    provider_http::HttpClient::new(
        &provider_http::HttpSettings::new()
            .with_tls(tls.clone())
            .with_connect_timeout(connect_timeout)
            .with_timeout(timeout),
    )
}

/// Why a call failed: a SOAP fault (looked at for NotAuthenticated) or anything else.
pub(crate) enum CallError {
    Fault(Fault),
    Other(Error),
}

/// What makes two providers' sessions one: the same endpoint, login and TLS trust, and
/// the same timeouts for the HTTP client they share.
#[derive(Clone)]
pub(crate) struct SessionKey {
    pub sdk_url: String,
    pub user: String,
    pub password: SecretString,
    pub tls: provider_http::TlsConfig,
    pub connect_timeout: Duration,
    pub call_timeout: Duration,
    pub keep_alive: Duration,
}

impl PartialEq for SessionKey {
    fn eq(&self, other: &Self) -> bool {
        self.sdk_url == other.sdk_url
            && self.user == other.user
            && self.password.expose_secret() == other.password.expose_secret()
            && self.tls == other.tls
            && self.connect_timeout == other.connect_timeout
            && self.call_timeout == other.call_timeout
            && self.keep_alive == other.keep_alive
    }
}

/// The process's sessions, by what they were made for; a session lives as long as a
/// provider holds it.
static SESSIONS: LazyLock<std::sync::Mutex<Sessions>> =
    LazyLock::new(|| std::sync::Mutex::new(Vec::new()));

/// What [`SESSIONS`] holds.
type Sessions = Vec<(SessionKey, Weak<Client>)>;

/// A vim25 SOAP client with one session.
pub(crate) struct Client {
    http: provider_http::HttpClient,
    sdk_url: String,
    user: String,
    password: SecretString,
    content: OnceCell<ServiceContent>,
    /// The session cookie (`name=value`), once logged in.
    session: RwLock<Option<String>>,
    /// One login at a time: callers that find the session gone wait for one new one.
    login: Mutex<()>,
    /// When a call last went out in the session, for the keep-alive.
    last_used: std::sync::Mutex<Instant>,
    /// How long the session may idle before a keep-alive call.
    keep_alive: Duration,
    /// The keep-alive task, once logged in.
    keeper: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// This client, for the keep-alive task (which must not keep it alive).
    me: Weak<Client>,
    /// HTTP timeout of one call, which a long poll's wait is added to.
    call_timeout: Duration,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("sdk_url", &self.sdk_url)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// The session of this process for `key`: the one another provider made for the
    /// same key, or a new one (no call is made).
    pub fn shared(key: &SessionKey) -> Result<Arc<Client>> {
        let mut sessions = SESSIONS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        sessions.retain(|(_, s)| s.strong_count() > 0);
        if let Some(client) = sessions
            .iter()
            .filter(|(k, _)| k == key)
            .find_map(|(_, s)| s.upgrade())
        {
            return Ok(client);
        }
        let http = http_client(&key.tls, key.connect_timeout, key.call_timeout)?;
        let client = Arc::new_cyclic(|me| Client {
            http,
            sdk_url: key.sdk_url.clone(),
            user: key.user.clone(),
            password: key.password.clone(),
            content: OnceCell::new(),
            session: RwLock::new(None),
            login: Mutex::new(()),
            last_used: std::sync::Mutex::new(Instant::now()),
            keep_alive: key.keep_alive,
            keeper: std::sync::Mutex::new(None),
            me: me.clone(),
            call_timeout: key.call_timeout,
        });
        sessions.push((key.clone(), Arc::downgrade(&client)));
        Ok(client)
    }

    /// The HTTP timeout of one call.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// Sends one request; the answer's `<method>Response` element, or why not.
    async fn post(
        &self,
        method: &str,
        body: &str,
        cookie: Option<&str>,
        wait: Option<Duration>,
    ) -> std::result::Result<(Element, Option<String>), CallError> {
        if cookie.is_some() {
            *self
                .last_used
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
        }
        post(&self.http, &self.sdk_url, method, body, cookie, wait).await
    }

    /// The service's well-known objects, asked once.
    pub async fn content(&self) -> Result<&ServiceContent> {
        self.content
            .get_or_try_init(|| async {
                let body = Moref::new("ServiceInstance", "ServiceInstance").xml("_this");
                let (r, _) = self
                    .post("RetrieveServiceContent", &body, None, None)
                    .await
                    .map_err(|e| plain(e, "RetrieveServiceContent"))?;
                let rv = r.child("returnval").ok_or_else(|| {
                    Error::transient("RetrieveServiceContent: no returnval in the answer")
                })?;
                let get = |name: &str| {
                    rv.child(name).and_then(Moref::from_element).ok_or_else(|| {
                        Error::permanent(format!("RetrieveServiceContent: no {name}"))
                    })
                };
                Ok(ServiceContent {
                    property_collector: get("propertyCollector")?,
                    search_index: get("searchIndex")?,
                    session_manager: get("sessionManager")?,
                    view_manager: get("viewManager")?,
                })
            })
            .await
    }

    /// Logs in, unless another caller already replaced the session `stale`.
    async fn login(&self, stale: Option<&str>) -> Result<String> {
        let _one = self.login.lock().await;
        if let Some(current) = self.session.read().await.clone()
            && Some(current.as_str()) != stale
        {
            return Ok(current);
        }
        let sm = self.content().await?.session_manager.clone();
        let body = format!(
            "{}<userName>{}</userName><password>{}</password>",
            sm.xml("_this"),
            escape(&self.user),
            escape(self.password.expose_secret())
        );
        let (_, cookie) = self
            .post("Login", &body, None, None)
            .await
            .map_err(|e| plain(e, "Login"))?;
        let cookie = cookie.ok_or_else(|| {
            Error::permanent(format!("Login: the answer set no {SESSION_COOKIE} cookie"))
        })?;
        tracing::debug!(user = %self.user, "logged in to vSphere");
        *self.session.write().await = Some(cookie.clone());
        self.keep_session_alive();
        Ok(cookie)
    }

    /// Starts the keep-alive task unless one runs (it ends when the session is logged
    /// out or the client dropped, and with the runtime it was started on).
    fn keep_session_alive(&self) {
        let mut keeper = self
            .keeper
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if keeper.as_ref().is_some_and(|k| !k.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        *keeper = Some(runtime.spawn(keep_alive(self.me.clone(), self.keep_alive)));
    }

    /// Calls `method` with `body` in the session, logging in first if needed and once
    /// more when the session has expired.
    pub async fn call(&self, method: &str, body: &str) -> Result<Element> {
        self.call_raw(method, body, None)
            .await
            .map_err(|e| plain(e, method))
    }

    /// [`Client::call`] that keeps a fault as the fault, and lets an answer take `wait`
    /// longer than a call may (a long poll).
    pub async fn call_raw(
        &self,
        method: &str,
        body: &str,
        wait: Option<Duration>,
    ) -> std::result::Result<Element, CallError> {
        let current = self.session.read().await.clone();
        let cookie = match current {
            Some(c) => c,
            None => self.login(None).await.map_err(CallError::Other)?,
        };
        match self.post(method, body, Some(&cookie), wait).await {
            Ok((r, _)) => Ok(r),
            Err(CallError::Fault(f)) if f.kind == "NotAuthenticated" => {
                tracing::debug!(method, "vSphere session expired; logging in again");
                let cookie = self.login(Some(&cookie)).await.map_err(CallError::Other)?;
                self.post(method, body, Some(&cookie), wait)
                    .await
                    .map(|(r, _)| r)
            }
            Err(e) => Err(e),
        }
    }

    /// Ends the session, if there is one; another call logs in again.
    pub async fn logout(&self) -> Result<()> {
        let Some(cookie) = self.session.write().await.take() else {
            return Ok(());
        };
        let sm = self.content().await?.session_manager.clone();
        match self
            .post("Logout", &sm.xml("_this"), Some(&cookie), None)
            .await
        {
            Ok(_) => Ok(()),
            Err(CallError::Fault(f)) if f.kind == "NotAuthenticated" => Ok(()),
            Err(e) => Err(plain(e, "Logout")),
        }
    }

    /// The object at an inventory path (`DC0/vm/templates/ubuntu`), if any.
    pub async fn find_by_inventory_path(&self, path: &str) -> Result<Option<Moref>> {
        let si = self.content().await?.search_index.clone();
        let body = format!(
            "{}<inventoryPath>{}</inventoryPath>",
            si.xml("_this"),
            escape(path)
        );
        let r = self.call("FindByInventoryPath", &body).await?;
        Ok(r.child("returnval").and_then(Moref::from_element))
    }

    /// Properties `paths` of objects of `kind` selected by `object_spec` (an
    /// `<objectSet>` element), following every page.
    pub async fn retrieve(
        &self,
        kind: &str,
        paths: &[&str],
        object_spec: &str,
    ) -> Result<Vec<ObjectContent>> {
        let pc = self.content().await?.property_collector.clone();
        let mut prop = format!("<propSet><type>{kind}</type><all>false</all>");
        for p in paths {
            let _ = write!(prop, "<pathSet>{}</pathSet>", escape(p));
        }
        prop.push_str("</propSet>");
        let body = format!(
            "{}<specSet>{prop}{object_spec}</specSet><options><maxObjects>500</maxObjects></options>",
            pc.xml("_this")
        );
        let mut out = Vec::new();
        let mut answer = self.call("RetrievePropertiesEx", &body).await?;
        loop {
            let Some(rv) = answer.child("returnval") else {
                return Ok(out);
            };
            for o in rv.children_named("objects") {
                let Some(obj) = o.child("obj").and_then(Moref::from_element) else {
                    continue;
                };
                let props = o
                    .children_named("propSet")
                    .filter_map(|p| {
                        Some((p.child_text("name")?.to_owned(), p.child("val")?.clone()))
                    })
                    .collect();
                out.push(ObjectContent { obj, props });
            }
            let Some(token) = rv.child_text("token").map(str::to_owned) else {
                return Ok(out);
            };
            let body = format!("{}<token>{}</token>", pc.xml("_this"), escape(&token));
            answer = self.call("ContinueRetrievePropertiesEx", &body).await?;
        }
    }

    /// Properties `paths` of several objects of `kind` in one call; objects that are
    /// gone are left out (`reportMissingObjectsInResults`).
    pub async fn properties_of(
        &self,
        kind: &str,
        objs: &[Moref],
        paths: &[&str],
    ) -> Result<Vec<ObjectContent>> {
        if objs.is_empty() {
            return Ok(Vec::new());
        }
        let mut spec = String::new();
        for o in objs {
            let _ = write!(
                spec,
                "<objectSet>{}<skip>false</skip></objectSet>",
                o.xml("obj")
            );
        }
        spec.push_str("<reportMissingObjectsInResults>true</reportMissingObjectsInResults>");
        self.retrieve(kind, paths, &spec).await
    }

    /// Properties of one object; `None` when it does not exist (any more).
    pub async fn properties(&self, obj: &Moref, paths: &[&str]) -> Result<Option<ObjectContent>> {
        let spec = format!(
            "<objectSet>{}<skip>false</skip></objectSet>",
            obj.xml("obj")
        );
        match self.retrieve(&obj.kind, paths, &spec).await {
            Ok(mut v) => Ok(v.pop()),
            Err(e) if e.kind() == machine_core::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Calls a method that returns a task; the task (not waited for).
    pub async fn start_task(&self, method: &str, body: &str) -> Result<Moref> {
        let r = self.call(method, body).await?;
        r.child("returnval")
            .and_then(Moref::from_element)
            .ok_or_else(|| Error::transient(format!("{method}: no task in the answer")))
    }

    /// A task's outcome read directly: `None` while it runs, its result when it
    /// succeeded, its fault when it failed.
    pub async fn task_outcome(&self, task: &Moref) -> Result<Option<TaskOutcome>> {
        let info = self
            .properties(task, &["info"])
            .await?
            .and_then(|o| o.prop("info").cloned())
            .ok_or_else(|| Error::not_found(format!("task {task} vanished")))?;
        Ok(task_outcome(
            info.child_text("state"),
            info.child("result"),
            info.child("error"),
        ))
    }
}

/// How a task ended: its result, or its fault.
pub(crate) type TaskOutcome = std::result::Result<Option<Element>, Fault>;

/// The outcome of a task in `state` with this `result` and `error`, if it ended.
pub(crate) fn task_outcome(
    state: Option<&str>,
    result: Option<&Element>,
    error: Option<&Element>,
) -> Option<TaskOutcome> {
    match state {
        Some("success") => Some(Ok(result.cloned())),
        Some("error") => Some(Err(error.map(read_method_fault).unwrap_or_else(|| Fault {
            kind: String::new(),
            message: "the task failed without a fault".into(),
            property: None,
        }))),
        _ => None,
    }
}

impl Drop for Client {
    /// Logs the session out (best effort: on the tokio runtime this is dropped on, if
    /// any), so that vCenter does not keep it until it expires.
    fn drop(&mut self) {
        if let Some(k) = self
            .keeper
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            k.abort();
        }
        let (Some(cookie), Some(content)) = (self.session.get_mut().take(), self.content.get())
        else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (http, url) = (self.http.clone(), self.sdk_url.clone());
        let this = content.session_manager.xml("_this");
        runtime.spawn(async move {
            let _ = post(&http, &url, "Logout", &this, Some(&cookie), None).await;
        });
    }
}

/// Keeps the session of `client` alive: a `CurrentTime` call whenever it has been idle
/// for `every`. Ends when the client is gone or logged out.
async fn keep_alive(client: Weak<Client>, every: Duration) {
    loop {
        let pause = {
            let Some(c) = client.upgrade() else { return };
            if c.session.read().await.is_none() {
                return;
            }
            let idle = c
                .last_used
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .elapsed();
            every.saturating_sub(idle)
        };
        if pause.is_zero() {
            let Some(c) = client.upgrade() else { return };
            let this = Moref::new("ServiceInstance", "ServiceInstance").xml("_this");
            if let Err(e) = c.call("CurrentTime", &this).await {
                tracing::debug!(error = %e, "vSphere keep-alive call failed");
            }
            // A failed call still counts as use: it is tried again after `every`.
            *c.last_used
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
            continue;
        }
        tokio::time::sleep(pause).await;
    }
}

/// Sends one request to `url`; the answer's `<method>Response` element (and the session
/// cookie it set), or why not. `wait` is how much longer than a call the answer may take.
async fn post(
    http: &provider_http::HttpClient,
    url: &str,
    method: &str,
    body: &str,
    cookie: Option<&str>,
    wait: Option<Duration>,
) -> std::result::Result<(Element, Option<String>), CallError> {
    let envelope = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
         <soapenv:Envelope xmlns:soapenv=\"http://schemas.xmlsoap.org/soap/envelope/\" \
         xmlns:xsd=\"http://www.w3.org/2001/XMLSchema\" \
         xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\">\
         <soapenv:Body><{method} xmlns=\"urn:vim25\">{body}</{method}></soapenv:Body>\
         </soapenv:Envelope>"
    );
    let mut request = http
        .inner()
        .post(url)
        .header("Content-Type", "text/xml; charset=utf-8")
        .header("SOAPAction", SOAP_ACTION)
        .body(envelope);
    if let Some(cookie) = cookie {
        request = request.header("Cookie", cookie);
    }
    if let Some(wait) = wait {
        request = request.timeout(wait + CALL_MARGIN);
    }
    let answer = http
        .send(request)
        .await
        .map_err(|e| CallError::Other(e.context(method)))?;
    let status = answer.status();
    let set_cookie = answer
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(session_cookie);
    if answer
        .content_length()
        .is_some_and(|n| n > MAX_ANSWER as u64)
    {
        return Err(CallError::Other(Error::permanent(format!(
            "{method}: the answer is over {MAX_ANSWER} bytes"
        ))));
    }
    let bytes = answer
        .bytes()
        .await
        .map_err(|e| CallError::Other(errors::transport(method, &e)))?;
    let root = match xml::parse(&bytes) {
        Ok(root) => root,
        Err(why) if status.is_success() => {
            return Err(CallError::Other(Error::transient(format!(
                "{method}: the answer is not XML ({why})"
            ))));
        }
        Err(_) => return Err(CallError::Other(errors::status(method, status))),
    };
    let Some(body) = root.child("Body") else {
        return Err(CallError::Other(Error::transient(format!(
            "{method}: the answer is no SOAP envelope (HTTP {status})"
        ))));
    };
    if let Some(fault) = body.child("Fault") {
        return Err(CallError::Fault(read_soap_fault(fault)));
    }
    let response = format!("{method}Response");
    match body.children.iter().find(|c| c.name == response) {
        Some(r) => Ok((r.clone(), set_cookie)),
        None => Err(CallError::Other(Error::transient(format!(
            "{method}: the answer has no {response} (HTTP {status})"
        )))),
    }
}

/// A call error as the library's error.
pub(crate) fn plain(e: CallError, method: &str) -> Error {
    match e {
        CallError::Fault(f) => f.to_error(method),
        CallError::Other(e) => e,
    }
}

/// The `name=value` of the session cookie in one Set-Cookie header.
fn session_cookie(header: &str) -> Option<String> {
    let pair = header.split(';').next()?.trim();
    let (name, value) = pair.split_once('=')?;
    (name == SESSION_COOKIE && !value.is_empty()).then(|| pair.to_owned())
}

/// A `soapenv:Fault`: the type from the detail's element, the words from `faultstring`.
fn read_soap_fault(fault: &Element) -> Fault {
    let message = fault
        .child_text("faultstring")
        .unwrap_or("")
        .trim()
        .to_owned();
    let detail = fault.child("detail").and_then(|d| d.children.first());
    let kind = detail
        .map(|d| {
            d.xsi_type()
                .map(str::to_owned)
                .unwrap_or_else(|| d.name.strip_suffix("Fault").unwrap_or(&d.name).to_owned())
        })
        .unwrap_or_default();
    let property = detail
        .and_then(|d| d.child_text("invalidProperty"))
        .map(str::to_owned);
    Fault {
        kind,
        message,
        property,
    }
}

/// A task's `LocalizedMethodFault`: `fault` (typed) and `localizedMessage`.
pub(crate) fn read_method_fault(error: &Element) -> Fault {
    let fault = error.child("fault");
    Fault {
        kind: fault
            .and_then(|f| f.xsi_type())
            .unwrap_or_default()
            .to_owned(),
        message: error
            .child_text("localizedMessage")
            .unwrap_or("")
            .trim()
            .to_owned(),
        property: fault
            .and_then(|f| f.child_text("invalidProperty"))
            .map(str::to_owned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_cookie_is_taken_from_set_cookie() {
        assert_eq!(
            session_cookie("vmware_soap_session=\"abc\"; Path=/; HttpOnly; Secure"),
            Some("vmware_soap_session=\"abc\"".to_owned())
        );
        assert_eq!(session_cookie("other=1; Path=/"), None);
    }

    #[test]
    fn soap_fault_detail_gives_type_and_property() {
        let doc = br#"<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" xmlns:XMLSchema-instance="http://www.w3.org/2001/XMLSchema-instance"><soapenv:Body><soapenv:Fault><faultcode>ServerFaultCode</faultcode><faultstring>bad</faultstring><detail><InvalidArgumentFault xmlns="urn:vim25" XMLSchema-instance:type="InvalidArgument"><invalidProperty>spec.location.pool</invalidProperty></InvalidArgumentFault></detail></soapenv:Fault></soapenv:Body></soapenv:Envelope>"#;
        let root = xml::parse(doc).unwrap();
        let f = read_soap_fault(root.path(&["Body", "Fault"]).unwrap());
        assert_eq!(f.kind, "InvalidArgument");
        assert_eq!(f.property.as_deref(), Some("spec.location.pool"));
        assert_eq!(f.message, "bad");
    }
}
