//! The vim25 SOAP calls the provider makes, typed, over one HTTP client: a session
//! (cookie `vmware_soap_session`) logged in on first use and again, once, when the
//! server answers NotAuthenticated (an expired or dropped session).
//!
//! Request bodies are written by hand, in the element order the vim25 schema fixes
//! (vCenter rejects other orders); answers are read with [`crate::xml`].

use std::fmt;
use std::fmt::Write as _;
use std::time::Duration;

use machine_core::{Error, ExposeSecret, Result, SecretString};
use tokio::sync::{Mutex, OnceCell, RwLock};

use crate::errors::{self, Fault};
use crate::xml::{self, Element, escape};

/// The API version asked for: every vCenter since 6.5 (and vcsim) speaks it.
const SOAP_ACTION: &str = "\"urn:vim25/6.5\"";
/// The session cookie vCenter sets at Login.
const SESSION_COOKIE: &str = "vmware_soap_session";
/// Answers larger than this are refused rather than read into memory.
const MAX_ANSWER: usize = 32 * 1024 * 1024;

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
enum CallError {
    Fault(Fault),
    Other(Error),
}

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
    /// How long a task may run before waiting for it gives up.
    task_timeout: Duration,
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
    /// A client for the SDK endpoint `sdk_url` (`https://vc/sdk`); no call is made.
    pub fn new(
        http: provider_http::HttpClient,
        sdk_url: String,
        user: String,
        password: SecretString,
        task_timeout: Duration,
    ) -> Client {
        Client {
            http,
            sdk_url,
            user,
            password,
            content: OnceCell::new(),
            session: RwLock::new(None),
            login: Mutex::new(()),
            task_timeout,
        }
    }

    /// Sends one request; the answer's `<method>Response` element, or why not.
    async fn post(
        &self,
        method: &str,
        body: &str,
        cookie: Option<&str>,
    ) -> std::result::Result<(Element, Option<String>), CallError> {
        let envelope = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
             <soapenv:Envelope xmlns:soapenv=\"http://schemas.xmlsoap.org/soap/envelope/\" \
             xmlns:xsd=\"http://www.w3.org/2001/XMLSchema\" \
             xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\">\
             <soapenv:Body><{method} xmlns=\"urn:vim25\">{body}</{method}></soapenv:Body>\
             </soapenv:Envelope>"
        );
        let mut request = self
            .http
            .inner()
            .post(&self.sdk_url)
            .header("Content-Type", "text/xml; charset=utf-8")
            .header("SOAPAction", SOAP_ACTION)
            .body(envelope);
        if let Some(cookie) = cookie {
            request = request.header("Cookie", cookie);
        }
        let answer = self
            .http
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

    /// The service's well-known objects, asked once.
    pub async fn content(&self) -> Result<&ServiceContent> {
        self.content
            .get_or_try_init(|| async {
                let body = Moref::new("ServiceInstance", "ServiceInstance").xml("_this");
                let (r, _) = self
                    .post("RetrieveServiceContent", &body, None)
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
            .post("Login", &body, None)
            .await
            .map_err(|e| plain(e, "Login"))?;
        let cookie = cookie.ok_or_else(|| {
            Error::permanent(format!("Login: the answer set no {SESSION_COOKIE} cookie"))
        })?;
        tracing::debug!(user = %self.user, "logged in to vSphere");
        *self.session.write().await = Some(cookie.clone());
        Ok(cookie)
    }

    /// Calls `method` with `body` in the session, logging in first if needed and once
    /// more when the session has expired.
    pub async fn call(&self, method: &str, body: &str) -> Result<Element> {
        let current = self.session.read().await.clone();
        let cookie = match current {
            Some(c) => c,
            None => self.login(None).await?,
        };
        match self.post(method, body, Some(&cookie)).await {
            Ok((r, _)) => Ok(r),
            Err(CallError::Fault(f)) if f.kind == "NotAuthenticated" => {
                tracing::debug!(method, "vSphere session expired; logging in again");
                let cookie = self.login(Some(&cookie)).await?;
                self.post(method, body, Some(&cookie))
                    .await
                    .map(|(r, _)| r)
                    .map_err(|e| plain(e, method))
            }
            Err(e) => Err(plain(e, method)),
        }
    }

    /// Ends the session, if there is one.
    pub async fn logout(&self) -> Result<()> {
        let Some(cookie) = self.session.write().await.take() else {
            return Ok(());
        };
        let sm = self.content().await?.session_manager.clone();
        match self.post("Logout", &sm.xml("_this"), Some(&cookie)).await {
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

    /// The virtual machine with BIOS UUID `uuid`, if any.
    pub async fn find_by_uuid(&self, uuid: &str) -> Result<Option<Moref>> {
        let si = self.content().await?.search_index.clone();
        let body = format!(
            "{}<uuid>{}</uuid><vmSearch>true</vmSearch><instanceUuid>false</instanceUuid>",
            si.xml("_this"),
            escape(uuid)
        );
        let r = self.call("FindByUuid", &body).await?;
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

    /// Properties `paths` of several objects of `kind` in one call; objects that are
    /// gone are left out.
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
        match self.retrieve(kind, paths, &spec).await {
            // One of them went meanwhile: ask for each alone, which tells the gone apart.
            Err(e) if e.kind() == machine_core::ErrorKind::NotFound && objs.len() > 1 => {
                let mut out = Vec::new();
                for o in objs {
                    out.extend(self.properties(o, paths).await?);
                }
                Ok(out)
            }
            Err(e) if e.kind() == machine_core::ErrorKind::NotFound => Ok(Vec::new()),
            other => other,
        }
    }

    /// Properties `paths` of every VM under the folder `folder`, in its subfolders and
    /// vApps too, in one call: a traversal the property collector follows when it
    /// answers, so the listing is as current as the inventory and leaves nothing on
    /// the server (a container view would have to be made, kept current and destroyed;
    /// vcsim 0.24.2 keeps views current racily, losing or keeping VMs under load).
    pub async fn vms_under(&self, folder: &Moref, paths: &[&str]) -> Result<Vec<ObjectContent>> {
        let spec = format!(
            "<objectSet>{}<skip>true</skip>\
             <selectSet xsi:type=\"TraversalSpec\"><name>folder</name><type>Folder</type>\
             <path>childEntity</path><skip>false</skip>\
             <selectSet><name>folder</name></selectSet><selectSet><name>vapp</name></selectSet>\
             </selectSet>\
             <selectSet xsi:type=\"TraversalSpec\"><name>vapp</name><type>VirtualApp</type>\
             <path>vm</path><skip>false</skip></selectSet></objectSet>",
            folder.xml("obj")
        );
        self.retrieve("VirtualMachine", paths, &spec).await
    }

    /// Calls a method that returns a task, and waits for the task.
    pub async fn task(&self, method: &str, body: &str) -> Result<Option<Element>> {
        let r = self.call(method, body).await?;
        let task = r
            .child("returnval")
            .and_then(Moref::from_element)
            .ok_or_else(|| Error::transient(format!("{method}: no task in the answer")))?;
        self.wait_task(method, &task).await
    }

    /// Polls a task's `info` with backoff until it ends; its result, or its fault as
    /// an error.
    pub async fn wait_task(&self, what: &str, task: &Moref) -> Result<Option<Element>> {
        let deadline = tokio::time::Instant::now() + self.task_timeout;
        let mut pause = Duration::from_millis(20);
        loop {
            let info = self
                .properties(task, &["info"])
                .await?
                .and_then(|o| o.prop("info").cloned())
                .ok_or_else(|| Error::transient(format!("{what}: task {task} vanished")))?;
            match info.child_text("state") {
                Some("success") => return Ok(info.child("result").cloned()),
                Some("error") => {
                    let fault = info
                        .child("error")
                        .map(read_method_fault)
                        .unwrap_or_else(|| Fault {
                            kind: String::new(),
                            message: "the task failed without a fault".into(),
                            property: None,
                        });
                    return Err(fault.to_error(what));
                }
                _ => {}
            }
            if tokio::time::Instant::now() + pause > deadline {
                return Err(Error::timeout(format!(
                    "{what}: task {task} still running after {:?}",
                    self.task_timeout
                )));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }
}

/// A call error as the library's error.
fn plain(e: CallError, method: &str) -> Error {
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
fn read_method_fault(error: &Element) -> Fault {
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
