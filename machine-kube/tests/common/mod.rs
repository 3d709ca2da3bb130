//! A stand-in for the Kubernetes API server, for the calls the controller makes. No
//! kube-apiserver can be installed on these machines (not in Debian, PyPI or npm); this
//! answers those calls as the API server does, and `tests/stand_in.rs` checks each
//! behaviour below against what the Kubernetes documentation and RFCs say.
//!
//! Served:
//! - `Machine` objects (`/apis/machine-provisioning.dev/v1alpha1/[namespaces/NS/]machines`):
//!   get, list, watch, create, replace, delete; JSON patch (RFC 6902) and JSON merge
//!   patch (RFC 7386) of the object, merge patch of the `status` subresource;
//! - `MachineSet` objects (`.../machinesets`): the same, and the `scale` subresource
//!   (get, replace, merge or JSON patch of an `autoscaling/v1` Scale);
//! - `Lease` objects (`/apis/coordination.k8s.io/v1/namespaces/NS/leases`): get,
//!   create, replace;
//! - `Event` objects (`/apis/events.k8s.io/v1/namespaces/NS/events`): create, merge
//!   patch (kube's `Recorder` sends both).
//!
//! Behaviours modelled, as the API server has them:
//! - one resourceVersion counter for every object (etcd's revision), a new value on
//!   every write; a list carries the current one, and a watch from a resourceVersion
//!   sends every change after it (ADDED, MODIFIED, DELETED), newline-delimited; the
//!   last `HISTORY` changes are kept, and a watch from an older version is
//!   `410 Gone` (etcd compacted it), after which a client lists again;
//! - optimistic concurrency: a replace, or a patch whose result carries another
//!   resourceVersion than the stored object (a patch that sets
//!   `metadata.resourceVersion`), is `409 Conflict`; a replace without one is refused
//!   for custom resources (422) and unconditional for Leases;
//! - a create of an existing name is `409 AlreadyExists`; a missing object is `404`;
//! - a failed JSON-patch `test` is `422`; a `test` of `null` passes on an absent path
//!   (the API server's JSON patch does, and kube's finalizer helper relies on it);
//! - the status subresource: writes to the object leave `status` as it was, writes to
//!   `/status` change `status` only; `metadata.generation` starts at 1 and grows when
//!   `spec` changes, never for metadata or status;
//! - names: every object's name is a DNS subdomain (RFC 1123, at most 253 characters);
//!   a `Machine` or `MachineSet` also obeys its CRD's `metadata.name` schema
//!   (`machine_kube::crd()`, `machine_kube::machine_set_crd()`), which the API server
//!   applies to custom resources at admission (422 Invalid);
//! - the scale subresource, as the apiextensions API server serves it for a CRD whose
//!   scale paths are `.spec.replicas`, `.status.replicas` and `.status.selector`
//!   (`ScaleREST`, `scaleFromCustomResource`): a GET answers an `autoscaling/v1` Scale
//!   with the object's name, namespace, uid, resourceVersion and creationTimestamp,
//!   `spec.replicas`, `status.replicas` (0 when absent) and `status.selector` (empty
//!   when absent), and is a 500 when `spec.replicas` is absent; a PUT or patch of the
//!   Scale sets the object's `spec.replicas` only (the generation grows), under the
//!   Scale's resourceVersion when it carries one (409 when stale), and answers the new
//!   Scale. Every write of a `MachineSet` runs `ValidateScaleSpec` (`.spec.replicas`
//!   from 0 to 2^31 - 1, else 422 naming `.spec.replicas`) and `ValidateScaleStatus`
//!   (`.status.replicas` likewise, `.status.selector` a string); a status write runs
//!   the second only;
//! - label selectors of a list (`labelSelector`, `labels.Parse`): `k=v`, `k==v`,
//!   `k!=v`, `k in (..)`, `k notin (..)`, `k`, `!k`, joined by commas (400 when it
//!   does not parse);
//! - the garbage collector in background propagation, at once (the real one lags):
//!   when an object goes, each object all of whose `ownerReferences` are gone is
//!   deleted as a DELETE does (finalizers hold it);
//! - deletion: an object with finalizers gets `deletionTimestamp` and stays; no
//!   finalizer may be added to it then (422); it goes (DELETED) once its last finalizer
//!   is removed, or at once when it has none;
//! - Lease validation: `leaseDurationSeconds` greater than 0 and `leaseTransitions` not
//!   negative when set (422).
//!
//! Not modelled: authentication, admission webhooks, field managers and managedFields,
//! server-side apply, pruning of unknown fields and defaulting (a `MachineSet` without
//! `spec.replicas` keeps none, where the API server would store the schema's default
//! 1), the rest of the OpenAPI validation (the CRD test runs `kubernetes-validate` on
//! the CRDs themselves), field selectors and label selectors of a watch, pagination (a
//! list answers everything at once, which the API server may also do), watch bookmarks
//! (optional for a server), foreground and orphan deletion (`blockOwnerDeletion` has
//! no effect here), history compaction (410 Gone).
//!
//! Each `start()` serves a listener of its own, as a replica of the controller would
//! reach the server: `cut(listener)` answers 503 to all its requests from then on, as
//! a partition between that replica and the API server.

#![allow(dead_code)] // each test binary uses a part

use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::broadcast;

type Body = BoxBody<Bytes, Infallible>;

/// How many changes a watch can start behind (the API server keeps a window too).
const HISTORY: usize = 4_096;

/// The kinds served: (API group path, plural).
const MACHINES: (&str, &str) = ("/apis/machine-provisioning.dev/v1alpha1", "machines");
const MACHINE_SETS: (&str, &str) = ("/apis/machine-provisioning.dev/v1alpha1", "machinesets");
const LEASES: (&str, &str) = ("/apis/coordination.k8s.io/v1", "leases");
const EVENTS: (&str, &str) = ("/apis/events.k8s.io/v1", "events");
const KINDS: [(&str, &str); 4] = [MACHINES, MACHINE_SETS, LEASES, EVENTS];

/// The custom resources served: status subresource, generation, CRD name rules.
fn is_custom(plural: &str) -> bool {
    plural == MACHINES.1 || plural == MACHINE_SETS.1
}

/// One change, as a watch sends it.
#[derive(Clone, Debug)]
struct Change {
    revision: u64,
    plural: &'static str,
    namespace: String,
    kind: &'static str,
    object: Value,
}

#[derive(Default)]
struct State {
    /// Objects by (plural, namespace, name).
    objects: BTreeMap<(String, String, String), Value>,
    revision: u64,
    history: Vec<Change>,
    uids: u64,
}

/// The stand-in API server.
#[derive(Clone)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    changes: broadcast::Sender<Change>,
    cut: Arc<Mutex<HashSet<usize>>>,
    listeners: Arc<AtomicUsize>,
    /// Every write (create, replace, patch, delete) of a `Machine` object or its status.
    pub writes: Arc<AtomicUsize>,
    /// Writes of a `Machine`'s status only.
    pub status_writes: Arc<AtomicUsize>,
    /// Every write of a `MachineSet` object, its status or its scale.
    pub set_writes: Arc<AtomicUsize>,
    /// Writes of a `MachineSet`'s status only.
    pub set_status_writes: Arc<AtomicUsize>,
    /// (listener, method, path) of every request, in order.
    pub requests: Arc<Mutex<Vec<(usize, String, String)>>>,
    /// Each custom resource's rule for `metadata.name` (its CRD's), by plural.
    name_rules: Arc<BTreeMap<&'static str, (usize, regex_lite::Regex)>>,
}

/// The CRD's own rule for metadata.name, as the API server reads it.
fn name_rule(
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> (usize, regex_lite::Regex) {
    let crd = serde_json::to_value(crd).unwrap();
    let rule = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["metadata"]["properties"]
        ["name"];
    let max = rule["maxLength"].as_u64().unwrap_or(253) as usize;
    let pattern = rule["pattern"].as_str().unwrap_or(".*");
    (max, regex_lite::Regex::new(pattern).unwrap())
}

impl Default for FakeApi {
    fn default() -> Self {
        let (changes, _) = broadcast::channel(4096);
        let name_rules = BTreeMap::from([
            (MACHINES.1, name_rule(machine_kube::crd())),
            (MACHINE_SETS.1, name_rule(machine_kube::machine_set_crd())),
        ]);
        FakeApi {
            state: Arc::default(),
            changes,
            cut: Arc::default(),
            listeners: Arc::default(),
            writes: Arc::default(),
            status_writes: Arc::default(),
            set_writes: Arc::default(),
            set_status_writes: Arc::default(),
            requests: Arc::default(),
            name_rules: Arc::new(name_rules),
        }
    }
}

impl FakeApi {
    /// Serves a new listener on a free loopback port of the current runtime; returns a
    /// client for it.
    pub async fn start(&self) -> kube::Client {
        self.start_listener().await.1
    }

    /// Like `start`, and the listener's number (for `cut`).
    pub async fn start_listener(&self) -> (usize, kube::Client) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let id = self.listeners.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(self.clone().serve(listener, id));
        (id, client(addr))
    }

    /// Serves on a thread of its own (its own runtime), so that a benchmark can tell
    /// the server's work from the client's; returns the address.
    pub fn start_on_own_thread(&self) -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let me = self.clone();
        let id = self.listeners.fetch_add(1, Ordering::SeqCst);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                me.serve(listener, id).await;
            });
        });
        addr
    }

    /// From now on, every request on `listener` is answered 503.
    pub fn cut(&self, listener: usize) {
        self.cut.lock().unwrap().insert(listener);
    }

    async fn serve(self, listener: tokio::net::TcpListener, id: usize) {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let me = self.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let me = me.clone();
                    async move { Ok::<_, Infallible>(me.answer(req, id).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }

    /// Stores `object` (a `Machine` object as JSON) as a create does.
    pub fn insert(&self, object: Value) {
        let ns = object["metadata"]["namespace"].as_str().unwrap().to_owned();
        if let Err((code, message)) = self.create(MACHINES.1, &ns, object) {
            panic!("create refused: {code} {message}");
        }
    }

    /// Stores `object` without the admission checks of its name, as an object made
    /// before the CRD narrowed names is still stored.
    pub fn insert_unadmitted(&self, object: Value) {
        let ns = object["metadata"]["namespace"].as_str().unwrap().to_owned();
        self.create_checked(MACHINES.1, &ns, object, false).unwrap();
    }

    /// Sets the `Machine`'s status to exactly `status` (a value a merge patch could not
    /// write, such as a member that is null), as a write of the status would store it.
    pub fn set_status_raw(&self, ns: &str, name: &str, status: Value) {
        let mut state = self.state.lock().unwrap();
        let key = (MACHINES.1.to_owned(), ns.to_owned(), name.to_owned());
        let mut o = state.objects.get(&key).cloned().expect("object");
        o["status"] = status;
        self.commit(&mut state, MACHINES.1, ns, name, Some(o), "MODIFIED");
    }

    /// The stored `Machine` object, if any.
    pub fn get(&self, ns: &str, name: &str) -> Option<Value> {
        self.object(MACHINES.1, ns, name)
    }

    /// Any stored object.
    pub fn object(&self, plural: &str, ns: &str, name: &str) -> Option<Value> {
        let key = (plural.to_owned(), ns.to_owned(), name.to_owned());
        self.state.lock().unwrap().objects.get(&key).cloned()
    }

    /// The events recorded in `ns`, in order of creation.
    pub fn events(&self, ns: &str) -> Vec<Value> {
        let state = self.state.lock().unwrap();
        let mut events: Vec<Value> = state
            .objects
            .iter()
            .filter(|((p, n, _), _)| p == EVENTS.1 && n == ns)
            .map(|(_, v)| v.clone())
            .collect();
        events.sort_by_key(|e| e["metadata"]["uid"].as_str().unwrap_or("").to_owned());
        events
    }

    /// Deletes the `Machine` object as a DELETE does.
    pub fn delete(&self, ns: &str, name: &str) {
        self.delete_object(MACHINES.1, ns, name).unwrap();
    }

    /// Changes the `Machine`'s spec as a merge patch of `{"spec": spec}` does.
    pub fn patch_spec(&self, ns: &str, name: &str, spec: Value) {
        self.patch(
            MACHINES.1,
            ns,
            name,
            None,
            "application/merge-patch+json",
            json!({ "spec": spec }),
        )
        .unwrap();
    }

    /// Stores `object` (a `MachineSet` object as JSON) as a create does; the refusal's
    /// code and message if the server would refuse it.
    pub fn create_set(&self, object: Value) -> Result<Value, (u16, String)> {
        let ns = object["metadata"]["namespace"].as_str().unwrap().to_owned();
        self.create(MACHINE_SETS.1, &ns, object)
            .map_err(|(code, message)| (code.as_u16(), message))
    }

    /// Stores `object` (a `MachineSet`) as a create does, or panics.
    pub fn insert_set(&self, object: Value) {
        if let Err((code, message)) = self.create_set(object) {
            panic!("create refused: {code} {message}");
        }
    }

    /// Stores a `MachineSet` without any admission check (its name, its replicas), as
    /// an object written before the CRD said so would be stored.
    pub fn insert_set_unadmitted(&self, object: Value) {
        let ns = object["metadata"]["namespace"].as_str().unwrap().to_owned();
        self.create_checked(MACHINE_SETS.1, &ns, object, false)
            .unwrap();
    }

    /// The stored `MachineSet`, if any.
    pub fn set(&self, ns: &str, name: &str) -> Option<Value> {
        self.object(MACHINE_SETS.1, ns, name)
    }

    /// Deletes the `MachineSet` as a DELETE does.
    pub fn delete_set(&self, ns: &str, name: &str) {
        self.delete_object(MACHINE_SETS.1, ns, name).unwrap();
    }

    /// Changes the `MachineSet`'s spec as a merge patch of `{"spec": spec}` does.
    pub fn patch_set_spec(&self, ns: &str, name: &str, spec: Value) {
        self.patch(
            MACHINE_SETS.1,
            ns,
            name,
            None,
            "application/merge-patch+json",
            json!({ "spec": spec }),
        )
        .unwrap();
    }

    /// The stored `Machine` objects of `ns`, by name.
    pub fn machines(&self, ns: &str) -> BTreeMap<String, Value> {
        let state = self.state.lock().unwrap();
        state
            .objects
            .iter()
            .filter(|((p, n, _), _)| p == MACHINES.1 && n == ns)
            .map(|((_, _, name), v)| (name.clone(), v.clone()))
            .collect()
    }

    async fn answer(&self, req: Request<Incoming>, listener: usize) -> Response<Body> {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let query = req.uri().query().unwrap_or("").to_owned();
        self.requests
            .lock()
            .unwrap()
            .push((listener, method.to_string(), path.clone()));
        if self.cut.lock().unwrap().contains(&listener) {
            return status(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "cut off",
            );
        }
        let content_type = req
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let Some(route) = route(&path) else {
            return status(StatusCode::NOT_FOUND, "NotFound", "no such path");
        };
        let params: BTreeMap<String, String> = query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (percent_decode(k), percent_decode(v)))
            .collect();
        let parsed = || serde_json::from_slice::<Value>(&body);
        let result = match (&method, &route) {
            (
                _,
                Route {
                    name: Some(name),
                    namespace: Some(ns),
                    sub: Some(sub),
                    ..
                },
            ) if sub == "scale" && route.plural == MACHINE_SETS.1 => match &method {
                &Method::GET => self.get_scale(ns, name).map(|o| (StatusCode::OK, o)),
                &Method::PUT => match parsed() {
                    Ok(scale) => self
                        .update_scale(ns, name, None, scale)
                        .map(|o| (StatusCode::OK, o)),
                    Err(e) => Err((StatusCode::BAD_REQUEST, e.to_string())),
                },
                &Method::PATCH => match parsed() {
                    Ok(p) => self
                        .update_scale(ns, name, Some(&content_type), p)
                        .map(|o| (StatusCode::OK, o)),
                    Err(e) => Err((StatusCode::BAD_REQUEST, e.to_string())),
                },
                m => Err((
                    StatusCode::METHOD_NOT_ALLOWED,
                    format!("{m} {path} is not served"),
                )),
            },
            (&Method::GET, Route { name: None, .. })
                if params.get("watch").map(String::as_str) == Some("true") =>
            {
                return self.watch(&route, &params);
            }
            (&Method::GET, Route { name: None, .. }) => self
                .list(&route, params.get("labelSelector").map(String::as_str))
                .map(|l| (StatusCode::OK, l)),
            (
                &Method::GET,
                Route {
                    name: Some(name),
                    sub: None,
                    ..
                },
            ) => match self.object(route.plural, route.namespace.as_deref().unwrap_or(""), name) {
                Some(o) => Ok((StatusCode::OK, o)),
                None => Err(not_found(route.plural, name)),
            },
            (
                &Method::POST,
                Route {
                    name: None,
                    namespace: Some(ns),
                    ..
                },
            ) => match parsed() {
                Ok(mut o) => {
                    if o["metadata"]["namespace"].is_null() {
                        o["metadata"]["namespace"] = json!(ns);
                    }
                    self.create(route.plural, ns, o)
                        .map(|o| (StatusCode::CREATED, o))
                }
                Err(e) => Err((StatusCode::BAD_REQUEST, e.to_string())),
            },
            (
                &Method::PUT,
                Route {
                    name: Some(name),
                    namespace: Some(ns),
                    sub: None,
                    ..
                },
            ) => match parsed() {
                Ok(o) => self
                    .replace(route.plural, ns, name, o)
                    .map(|o| (StatusCode::OK, o)),
                Err(e) => Err((StatusCode::BAD_REQUEST, e.to_string())),
            },
            (
                &Method::PATCH,
                Route {
                    name: Some(name),
                    namespace: Some(ns),
                    sub,
                    ..
                },
            ) => match parsed() {
                Ok(p) => self
                    .patch(route.plural, ns, name, sub.as_deref(), &content_type, p)
                    .map(|o| (StatusCode::OK, o)),
                Err(e) => Err((StatusCode::BAD_REQUEST, e.to_string())),
            },
            (
                &Method::DELETE,
                Route {
                    name: Some(name),
                    namespace: Some(ns),
                    sub: None,
                    ..
                },
            ) => self
                .delete_object(route.plural, ns, name)
                .map(|o| (StatusCode::OK, o)),
            (m, _) => Err((
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{m} {path} is not served by the stand-in"),
            )),
        };
        match result {
            Ok((code, v)) => json_response(code, &v),
            Err((code, message)) => {
                let reason = match code {
                    StatusCode::CONFLICT if message.contains("already exists") => "AlreadyExists",
                    StatusCode::CONFLICT => "Conflict",
                    StatusCode::NOT_FOUND => "NotFound",
                    StatusCode::UNPROCESSABLE_ENTITY => "Invalid",
                    StatusCode::UNSUPPORTED_MEDIA_TYPE => "UnsupportedMediaType",
                    StatusCode::INTERNAL_SERVER_ERROR => "InternalError",
                    _ => "BadRequest",
                };
                status(code, reason, &message)
            }
        }
    }

    fn list(&self, route: &Route, selector: Option<&str>) -> Result<Value, (StatusCode, String)> {
        let requirements = match selector {
            Some(s) => parse_selector(s).map_err(|e| (StatusCode::BAD_REQUEST, e))?,
            None => Vec::new(),
        };
        let state = self.state.lock().unwrap();
        let items: Vec<Value> = state
            .objects
            .iter()
            .filter(|((p, n, _), _)| {
                p == route.plural && route.namespace.as_ref().is_none_or(|ns| ns == n)
            })
            .filter(|(_, o)| {
                requirements
                    .iter()
                    .all(|r| r.holds(&o["metadata"]["labels"]))
            })
            .map(|(_, v)| v.clone())
            .collect();
        Ok(json!({
            "apiVersion": route.api_version(),
            "kind": format!("{}List", route.kind()),
            "metadata": { "resourceVersion": state.revision.to_string() },
            "items": items,
        }))
    }

    /// The `autoscaling/v1` Scale of a `MachineSet`, as the API server builds it from
    /// the CRD's scale paths (`.spec.replicas`, `.status.replicas`, `.status.selector`).
    fn get_scale(&self, ns: &str, name: &str) -> Result<Value, (StatusCode, String)> {
        let o = self
            .object(MACHINE_SETS.1, ns, name)
            .ok_or_else(|| not_found(MACHINE_SETS.1, name))?;
        if o["spec"]["replicas"].is_null() {
            return Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                "the spec replicas field \".spec.replicas\" does not exist".into(),
            ));
        }
        Ok(scale_of(&o))
    }

    /// A write of the Scale (a PUT of one, or a patch of the current one): its
    /// `spec.replicas` becomes the set's, under its resourceVersion if it carries one;
    /// the set is validated as any write of it is.
    fn update_scale(
        &self,
        ns: &str,
        name: &str,
        patch_type: Option<&str>,
        body: Value,
    ) -> Result<Value, (StatusCode, String)> {
        let mut state = self.state.lock().unwrap();
        let key = (MACHINE_SETS.1.to_owned(), ns.to_owned(), name.to_owned());
        let Some(current) = state.objects.get(&key).cloned() else {
            return Err(not_found(MACHINE_SETS.1, name));
        };
        let old = scale_of(&current);
        let scale = match patch_type {
            None => body,
            Some("application/merge-patch+json") => {
                let mut s = old.clone();
                json_patch::merge(&mut s, &body);
                s
            }
            Some("application/json-patch+json") => {
                let mut s = old.clone();
                let ops: json_patch::Patch = serde_json::from_value(body)
                    .map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))?;
                json_patch::patch(&mut s, &ops)
                    .map_err(|e| (StatusCode::UNPROCESSABLE_ENTITY, e.to_string()))?;
                s
            }
            Some(other) => {
                return Err((
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    format!("{other} is not served by the stand-in"),
                ));
            }
        };
        // A resourceVersion in the Scale is the update's precondition.
        if let Some(v) = scale["metadata"]["resourceVersion"].as_str()
            && !v.is_empty()
            && Some(v) != current["metadata"]["resourceVersion"].as_str()
        {
            return Err(conflict(MACHINE_SETS.1, name));
        }
        let replicas = match &scale["spec"]["replicas"] {
            Value::Null => 0,
            v => v
                .as_i64()
                .filter(|n| i32::try_from(*n).is_ok())
                .ok_or_else(|| {
                    (
                        StatusCode::BAD_REQUEST,
                        format!("Scale.spec.replicas: {v} is not an int32"),
                    )
                })?,
        };
        let mut updated = current.clone();
        updated["spec"]["replicas"] = json!(replicas);
        check_scale(name, &updated, true)?;
        if updated["spec"] != current["spec"] {
            updated["metadata"]["generation"] =
                json!(current["metadata"]["generation"].as_i64().unwrap_or(1) + 1);
        }
        self.set_writes.fetch_add(1, Ordering::SeqCst);
        let stored = self.commit(
            &mut state,
            MACHINE_SETS.1,
            ns,
            name,
            Some(updated),
            "MODIFIED",
        );
        Ok(scale_of(&stored))
    }

    /// A watch: every change after `resourceVersion`, then each change as it happens,
    /// until `timeoutSeconds`.
    fn watch(&self, route: &Route, params: &BTreeMap<String, String>) -> Response<Body> {
        let from: u64 = params
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let timeout = params
            .get("timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(290u64);
        // Subscribed before the history is read, so no change falls between the two.
        let rx = self.changes.subscribe();
        let backlog: Vec<Change> = {
            let state = self.state.lock().unwrap();
            let oldest = state.history.first().map_or(0, |c| c.revision);
            if from != 0 && from + 1 < oldest {
                return status(
                    StatusCode::GONE,
                    "Expired",
                    &format!("too old resource version: {from} ({oldest})"),
                );
            }
            if from == 0 {
                // From "now": a watch without a version starts with the current objects.
                state
                    .objects
                    .iter()
                    .filter(|((p, _, _), _)| p == route.plural)
                    .map(|((_, ns, _), o)| Change {
                        revision: state.revision,
                        plural: route.plural,
                        namespace: ns.clone(),
                        kind: "ADDED",
                        object: o.clone(),
                    })
                    .collect()
            } else {
                state
                    .history
                    .iter()
                    .filter(|c| c.revision > from)
                    .cloned()
                    .collect()
            }
        };
        let last = backlog.last().map_or(from, |c| c.revision);
        let plural = route.plural;
        let namespace = route.namespace.clone();
        let wanted = move |c: &Change| {
            c.plural == plural && namespace.as_ref().is_none_or(|ns| *ns == c.namespace)
        };
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(timeout);
        let backlog = futures_util::stream::iter(
            backlog
                .into_iter()
                .filter(wanted.clone())
                .collect::<Vec<_>>(),
        );
        let live = futures_util::stream::unfold((rx, last), move |(mut rx, last)| async move {
            loop {
                let next = tokio::time::timeout_at(deadline, rx.recv()).await;
                match next {
                    Ok(Ok(c)) if c.revision > last => return Some((c.clone(), (rx, c.revision))),
                    Ok(Ok(_)) => continue,
                    // Lagged or closed, or the timeout: the client watches again.
                    _ => return None,
                }
            }
        })
        .filter(move |c| std::future::ready(wanted(c)));
        let frames = backlog.chain(live).map(|c| {
            let mut line =
                serde_json::to_vec(&json!({ "type": c.kind, "object": c.object })).unwrap();
            line.push(b'\n');
            Ok::<_, Infallible>(Frame::data(Bytes::from(line)))
        });
        Response::builder()
            .header("content-type", "application/json")
            .body(BodyExt::boxed(StreamBody::new(frames)))
            .unwrap()
    }

    fn create(&self, plural: &str, ns: &str, o: Value) -> Result<Value, (StatusCode, String)> {
        self.create_checked(plural, ns, o, true)
    }

    fn create_checked(
        &self,
        plural: &str,
        ns: &str,
        mut o: Value,
        admit: bool,
    ) -> Result<Value, (StatusCode, String)> {
        let name = o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if admit {
            self.check_name(plural, &name)?;
        }
        if plural == LEASES.1 {
            check_lease(&o)?;
        }
        if admit && plural == MACHINE_SETS.1 {
            check_scale(&name, &o, true)?;
        }
        let mut state = self.state.lock().unwrap();
        let key = (plural.to_owned(), ns.to_owned(), name.clone());
        if state.objects.contains_key(&key) {
            return Err((
                StatusCode::CONFLICT,
                format!("{plural} {name:?} already exists"),
            ));
        }
        state.uids += 1;
        o["metadata"]["uid"] = json!(format!("uid-{:08}", state.uids));
        o["metadata"]["creationTimestamp"] = json!(now());
        clean_metadata(&mut o);
        if is_custom(plural) {
            o["metadata"]["generation"] = json!(1);
            // The status subresource: a create leaves the status out.
            if let Some(fields) = o.as_object_mut() {
                fields.remove("status");
            }
            self.count_write(plural, false);
        }
        Ok(self.commit(&mut state, plural, ns, &name, Some(o), "ADDED"))
    }

    fn replace(
        &self,
        plural: &str,
        ns: &str,
        name: &str,
        mut o: Value,
    ) -> Result<Value, (StatusCode, String)> {
        if plural == LEASES.1 {
            check_lease(&o)?;
        }
        let mut state = self.state.lock().unwrap();
        let key = (plural.to_owned(), ns.to_owned(), name.to_owned());
        let Some(current) = state.objects.get(&key).cloned() else {
            return Err(not_found(plural, name));
        };
        match o["metadata"]["resourceVersion"].as_str() {
            Some(v) if Some(v) != current["metadata"]["resourceVersion"].as_str() => {
                return Err(conflict(plural, name));
            }
            None if is_custom(plural) => {
                return Err((
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
                        .into(),
                ));
            }
            _ => {}
        }
        for kept in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "generation",
        ] {
            o["metadata"][kept] = current["metadata"][kept].clone();
        }
        if is_custom(plural) {
            o["status"] = current["status"].clone();
            if o["spec"] != current["spec"] {
                o["metadata"]["generation"] =
                    json!(current["metadata"]["generation"].as_i64().unwrap_or(1) + 1);
            }
            if plural == MACHINE_SETS.1 {
                check_scale(name, &o, true)?;
            }
            self.count_write(plural, false);
        }
        clean_metadata(&mut o);
        check_finalizers(&current, &o)?;
        Ok(self.commit(&mut state, plural, ns, name, Some(o), "MODIFIED"))
    }

    fn patch(
        &self,
        plural: &str,
        ns: &str,
        name: &str,
        sub: Option<&str>,
        content_type: &str,
        patch: Value,
    ) -> Result<Value, (StatusCode, String)> {
        let mut state = self.state.lock().unwrap();
        let key = (plural.to_owned(), ns.to_owned(), name.to_owned());
        let Some(current) = state.objects.get(&key).cloned() else {
            return Err(not_found(plural, name));
        };
        let mut updated = current.clone();
        match content_type {
            "application/json-patch+json" => {
                let mut ops: json_patch::Patch = serde_json::from_value(patch)
                    .map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))?;
                ops.0.retain(|op| match op {
                    json_patch::PatchOperation::Test(t) if t.value.is_null() => {
                        updated.pointer(t.path.as_str()).is_some()
                    }
                    _ => true,
                });
                json_patch::patch(&mut updated, &ops)
                    .map_err(|e| (StatusCode::UNPROCESSABLE_ENTITY, e.to_string()))?;
            }
            "application/merge-patch+json" => json_patch::merge(&mut updated, &patch),
            other => {
                return Err((
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    format!("{other} is not served by the stand-in"),
                ));
            }
        }
        // The patched object's resourceVersion is the update's precondition.
        if updated["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
            return Err(conflict(plural, name));
        }
        for kept in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "generation",
            "name",
            "namespace",
        ] {
            updated["metadata"][kept] = current["metadata"][kept].clone();
        }
        if is_custom(plural) {
            match sub {
                Some("status") => {
                    let status = updated["status"].clone();
                    updated = current.clone();
                    updated["status"] = status;
                    self.count_write(plural, true);
                }
                None => {
                    updated["status"] = current["status"].clone();
                    if updated["spec"] != current["spec"] {
                        updated["metadata"]["generation"] =
                            json!(current["metadata"]["generation"].as_i64().unwrap_or(1) + 1);
                    }
                }
                Some(other) => {
                    return Err((StatusCode::NOT_FOUND, format!("no subresource {other}")));
                }
            }
            if plural == MACHINE_SETS.1 {
                check_scale(name, &updated, sub.is_none())?;
            }
            self.count_write(plural, false);
        }
        clean_metadata(&mut updated);
        check_finalizers(&current, &updated)?;
        if plural == LEASES.1 {
            check_lease(&updated)?;
        }
        Ok(self.commit(&mut state, plural, ns, name, Some(updated), "MODIFIED"))
    }

    fn delete_object(
        &self,
        plural: &str,
        ns: &str,
        name: &str,
    ) -> Result<Value, (StatusCode, String)> {
        let mut state = self.state.lock().unwrap();
        let key = (plural.to_owned(), ns.to_owned(), name.to_owned());
        let Some(mut current) = state.objects.get(&key).cloned() else {
            return Err(not_found(plural, name));
        };
        if is_custom(plural) {
            self.count_write(plural, false);
        }
        let has_finalizers = current["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if !has_finalizers {
            return Ok(self.commit(&mut state, plural, ns, name, None, "DELETED"));
        }
        if current["metadata"]["deletionTimestamp"].is_null() {
            current["metadata"]["deletionTimestamp"] = json!(now());
            current["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            return Ok(self.commit(&mut state, plural, ns, name, Some(current), "MODIFIED"));
        }
        Ok(current)
    }

    /// Stores (or, with `None` or a deleted object without finalizers, removes) the
    /// object under a new revision, and tells the watches.
    fn commit(
        &self,
        state: &mut State,
        plural: &str,
        ns: &str,
        name: &str,
        object: Option<Value>,
        kind: &'static str,
    ) -> Value {
        state.revision += 1;
        let key = (plural.to_owned(), ns.to_owned(), name.to_owned());
        let (mut object, kind) = match object {
            Some(o) => {
                let gone = !o["metadata"]["deletionTimestamp"].is_null()
                    && o["metadata"]["finalizers"]
                        .as_array()
                        .is_none_or(|f| f.is_empty());
                if gone { (o, "DELETED") } else { (o, kind) }
            }
            None => (
                state.objects.get(&key).cloned().unwrap_or(Value::Null),
                "DELETED",
            ),
        };
        object["metadata"]["resourceVersion"] = json!(state.revision.to_string());
        if kind == "DELETED" {
            state.objects.remove(&key);
        } else {
            state.objects.insert(key, object.clone());
        }
        let plural = KINDS
            .into_iter()
            .map(|(_, p)| p)
            .find(|p| *p == plural)
            .unwrap_or("other");
        let change = Change {
            revision: state.revision,
            plural,
            namespace: ns.to_owned(),
            kind,
            object: object.clone(),
        };
        state.history.push(change.clone());
        if state.history.len() > HISTORY {
            let extra = state.history.len() - HISTORY;
            state.history.drain(..extra);
        }
        let _ = self.changes.send(change);
        if kind == "DELETED"
            && let Some(uid) = object["metadata"]["uid"].as_str()
        {
            self.collect_garbage(state, uid);
        }
        object
    }

    /// Counts a write of a custom resource (`status`: of its status only).
    fn count_write(&self, plural: &str, status: bool) {
        let (all, only_status) = if plural == MACHINES.1 {
            (&self.writes, &self.status_writes)
        } else {
            (&self.set_writes, &self.set_status_writes)
        };
        all.fetch_add(1, Ordering::SeqCst);
        if status {
            only_status.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The garbage collector, in background propagation: once an object is gone, each
    /// object all of whose owners are gone is deleted as a DELETE does (one with
    /// finalizers gets its deletionTimestamp and stays until they are removed).
    fn collect_garbage(&self, state: &mut State, gone_uid: &str) {
        let live: HashSet<String> = state
            .objects
            .values()
            .filter_map(|o| o["metadata"]["uid"].as_str().map(str::to_owned))
            .collect();
        let orphans: Vec<(String, String, String)> = state
            .objects
            .iter()
            .filter(|(_, o)| {
                let owners = o["metadata"]["ownerReferences"].as_array();
                owners.is_some_and(|refs| {
                    !refs.is_empty()
                        && refs.iter().any(|r| r["uid"] == gone_uid)
                        && refs
                            .iter()
                            .all(|r| !live.contains(r["uid"].as_str().unwrap_or_default()))
                })
            })
            .map(|(k, _)| k.clone())
            .collect();
        for (plural, ns, name) in orphans {
            let key = (plural.clone(), ns.clone(), name.clone());
            let Some(mut o) = state.objects.get(&key).cloned() else {
                continue;
            };
            let has_finalizers = o["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty());
            if !has_finalizers {
                self.commit(state, &plural, &ns, &name, None, "DELETED");
            } else if o["metadata"]["deletionTimestamp"].is_null() {
                o["metadata"]["deletionTimestamp"] = json!(now());
                self.commit(state, &plural, &ns, &name, Some(o), "MODIFIED");
            }
        }
    }

    fn check_name(&self, plural: &str, name: &str) -> Result<(), (StatusCode, String)> {
        let subdomain = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            });
        if !subdomain {
            return Err((
                StatusCode::UNPROCESSABLE_ENTITY,
                format!(
                    "metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"
                ),
            ));
        }
        if let Some((max, pattern)) = self.name_rules.get(plural)
            && (name.len() > *max || !pattern.is_match(name))
        {
            return Err((
                StatusCode::UNPROCESSABLE_ENTITY,
                format!(
                    "metadata.name: Invalid value: {name:?}: metadata.name in body should match '{}' and be at most {max} characters",
                    pattern.as_str()
                ),
            ));
        }
        Ok(())
    }
}

/// A request path, split.
struct Route {
    group: &'static str,
    plural: &'static str,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

impl Route {
    fn api_version(&self) -> &'static str {
        self.group.trim_start_matches("/apis/")
    }

    fn kind(&self) -> &'static str {
        match self.plural {
            "machines" => "Machine",
            "machinesets" => "MachineSet",
            "leases" => "Lease",
            _ => "Event",
        }
    }
}

fn route(path: &str) -> Option<Route> {
    for (group, plural) in KINDS {
        let Some(rest) = path.strip_prefix(group) else {
            continue;
        };
        let parts: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
        let owned = |s: &str| Some(s.to_owned());
        let found = match parts.as_slice() {
            [p] if *p == plural => Some(Route {
                group,
                plural,
                namespace: None,
                name: None,
                sub: None,
            }),
            ["namespaces", ns, p] if *p == plural => Some(Route {
                group,
                plural,
                namespace: owned(ns),
                name: None,
                sub: None,
            }),
            ["namespaces", ns, p, name] if *p == plural => Some(Route {
                group,
                plural,
                namespace: owned(ns),
                name: owned(name),
                sub: None,
            }),
            ["namespaces", ns, p, name, sub] if *p == plural => Some(Route {
                group,
                plural,
                namespace: owned(ns),
                name: owned(name),
                sub: owned(sub),
            }),
            _ => None,
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

/// The `autoscaling/v1` Scale of a stored `MachineSet` (`scaleFromCustomResource`):
/// the object's name, namespace, uid, resourceVersion and creation time; `spec.replicas`
/// from `.spec.replicas`, `status.replicas` from `.status.replicas` (0 when absent),
/// `status.selector` from `.status.selector` (empty when absent).
fn scale_of(o: &Value) -> Value {
    let meta = &o["metadata"];
    json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"],
            "creationTimestamp": meta["creationTimestamp"],
        },
        "spec": { "replicas": o["spec"]["replicas"].as_i64().unwrap_or(0) },
        "status": {
            "replicas": o["status"]["replicas"].as_i64().unwrap_or(0),
            "selector": o["status"]["selector"].as_str().unwrap_or(""),
        },
    })
}

/// `ValidateScaleSpec` and `ValidateScaleStatus`, which the API server runs on writes
/// of a custom resource with a scale subresource (a write of `/status` runs the second
/// only): `.spec.replicas` and `.status.replicas`, where present, integers from 0 to
/// 2^31 - 1; `.status.selector` a string.
fn check_scale(name: &str, o: &Value, spec: bool) -> Result<(), (StatusCode, String)> {
    let invalid = |path: &str, v: &Value, why: &str| {
        Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "MachineSet.machine-provisioning.dev {name:?} is invalid: {path}: Invalid value: {v}: {why}"
            ),
        ))
    };
    let checked = [
        (".spec.replicas", &o["spec"]["replicas"]),
        (".status.replicas", &o["status"]["replicas"]),
    ];
    for (path, v) in checked.into_iter().skip(usize::from(!spec)) {
        match v {
            Value::Null => {}
            Value::Number(n) => match n.as_i64() {
                Some(n) if n < 0 => return invalid(path, v, "should be a non-negative integer"),
                Some(n) if n > i64::from(i32::MAX) => {
                    return invalid(path, v, "should be less than or equal to 2147483647");
                }
                Some(_) => {}
                None => return invalid(path, v, "is not an integer"),
            },
            _ => return invalid(path, v, "is not an integer"),
        }
    }
    let selector = &o["status"]["selector"];
    if !selector.is_null() && !selector.is_string() {
        return invalid(".status.selector", selector, "is not a string");
    }
    Ok(())
}

/// One requirement of a label selector.
enum Requirement {
    Equal(String, String),
    NotEqual(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn holds(&self, labels: &Value) -> bool {
        let get = |k: &str| labels[k].as_str();
        match self {
            Requirement::Equal(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEqual(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::DoesNotExist(k) => get(k).is_none(),
        }
    }
}

/// A label selector in its string form (`labels.Parse`): requirements joined by
/// commas, each `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` or `!k`.
fn parse_selector(s: &str) -> Result<Vec<Requirement>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    let values = |list: &str| -> Result<Vec<String>, String> {
        let inner = list
            .trim()
            .strip_prefix('(')
            .and_then(|l| l.strip_suffix(')'))
            .ok_or_else(|| format!("unable to parse requirement: {list:?}"))?;
        Ok(inner.split(',').map(|v| v.trim().to_owned()).collect())
    };
    let mut out = Vec::new();
    for part in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
        let r = if let Some(k) = part.strip_prefix('!') {
            Requirement::DoesNotExist(k.trim().to_owned())
        } else if let Some((k, v)) = part.split_once(" notin ") {
            Requirement::NotIn(k.trim().to_owned(), values(v)?)
        } else if let Some((k, v)) = part.split_once(" in ") {
            Requirement::In(k.trim().to_owned(), values(v)?)
        } else if let Some((k, v)) = part.split_once("!=") {
            Requirement::NotEqual(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some((k, v)) = part.split_once("==") {
            Requirement::Equal(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some((k, v)) = part.split_once('=') {
            Requirement::Equal(k.trim().to_owned(), v.trim().to_owned())
        } else if part.contains([' ', '(', ')']) {
            return Err(format!("unable to parse requirement: {part:?}"));
        } else {
            Requirement::Exists(part.to_owned())
        };
        out.push(r);
    }
    Ok(out)
}

/// `s` with its `%XX` escapes (and `+` for a space) decoded, as a query string is read.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// No new finalizer on an object being deleted.
fn check_finalizers(before: &Value, after: &Value) -> Result<(), (StatusCode, String)> {
    if before["metadata"]["deletionTimestamp"].is_null() {
        return Ok(());
    }
    let had: Vec<&Value> = before["metadata"]["finalizers"]
        .as_array()
        .map(|f| f.iter().collect())
        .unwrap_or_default();
    let added = after["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| !had.contains(&x)));
    if added {
        return Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted".into(),
        ));
    }
    Ok(())
}

/// `ValidateLeaseSpec`: a positive duration, no negative transitions.
fn check_lease(o: &Value) -> Result<(), (StatusCode, String)> {
    let spec = &o["spec"];
    if let Some(d) = spec["leaseDurationSeconds"].as_i64()
        && d <= 0
    {
        return Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            "spec.leaseDurationSeconds: Invalid value: must be greater than 0".into(),
        ));
    }
    if let Some(t) = spec["leaseTransitions"].as_i64()
        && t < 0
    {
        return Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            "spec.leaseTransitions: Invalid value: must be greater than or equal to 0".into(),
        ));
    }
    Ok(())
}

/// Empty metadata maps read back absent, as the API server stores them.
fn clean_metadata(o: &mut Value) {
    if let Some(meta) = o["metadata"].as_object_mut() {
        meta.retain(|_, v| !v.is_null());
        for list in ["finalizers", "annotations", "labels"] {
            let empty = match meta.get(list) {
                Some(Value::Array(a)) => a.is_empty(),
                Some(Value::Object(m)) => m.is_empty(),
                _ => false,
            };
            if empty {
                meta.remove(list);
            }
        }
    }
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn not_found(plural: &str, name: &str) -> (StatusCode, String) {
    (
        StatusCode::NOT_FOUND,
        format!("{plural} {name:?} not found"),
    )
}

fn conflict(plural: &str, name: &str) -> (StatusCode, String) {
    (
        StatusCode::CONFLICT,
        format!(
            "Operation cannot be fulfilled on {plural} {name:?}: the object has been modified; please apply your changes to the latest version and try again"
        ),
    )
}

/// A kube client for the server at `addr`.
pub fn client(addr: std::net::SocketAddr) -> kube::Client {
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

fn json_response(code: StatusCode, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(Full::new(Bytes::from(
            serde_json::to_vec(v).unwrap(),
        ))))
        .unwrap()
}

/// A `Status` object, as the API server answers errors.
fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16()
    });
    json_response(code, &body)
}
