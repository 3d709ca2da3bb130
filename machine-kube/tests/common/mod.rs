//! A stand-in for the Kubernetes API server, for the calls the reconciler makes: get an
//! object, patch it with a JSON patch (the finalizer), merge-patch its status. No API
//! server can be installed on these machines; this answers as one does for those calls
//! (a failed JSON-patch `test` is 422, a `test` of null passes on an absent path, a missing object 404, a removed last finalizer on
//! a deleted object removes it) and counts every write.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

const PREFIX: &str = "/apis/machine-provisioning.dev/v1alpha1/namespaces/";

/// The fake API server: objects by namespace and name, and counts of writes.
#[derive(Clone, Default)]
pub struct FakeApi {
    objects: Arc<Mutex<HashMap<(String, String), Value>>>,
    /// Every PATCH of an object or its status.
    pub writes: Arc<AtomicUsize>,
    /// PATCHes of status only.
    pub status_writes: Arc<AtomicUsize>,
}

impl FakeApi {
    /// Serves on a free loopback port of the current runtime; returns a client for it.
    pub async fn start(&self) -> kube::Client {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(self.clone().serve(listener));
        client(addr)
    }

    /// Serves on a thread of its own (its own runtime), so that a benchmark can tell
    /// the server's work from the client's; returns the address.
    #[allow(dead_code)] // the benchmark's, not the tests'
    pub fn start_on_own_thread(&self) -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let me = self.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                me.serve(listener).await;
            });
        });
        addr
    }

    async fn serve(self, listener: tokio::net::TcpListener) {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let me = self.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let me = me.clone();
                    async move { Ok::<_, Infallible>(me.answer(req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }

    /// Stores `object` (a `Machine` object as JSON) as the server would after a create.
    pub fn insert(&self, object: Value) {
        let key = key_of(&object);
        let mut object = object;
        object["metadata"]["generation"] = json!(1);
        object["metadata"]["resourceVersion"] = json!("1");
        object["metadata"]["uid"] = json!(format!("uid-{}", key.1));
        self.objects.lock().unwrap().insert(key, object);
    }

    /// The stored object, if any.
    pub fn get(&self, ns: &str, name: &str) -> Option<Value> {
        self.objects
            .lock()
            .unwrap()
            .get(&(ns.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Marks the object deleted, as a DELETE of an object with finalizers does.
    pub fn mark_deleted(&self, ns: &str, name: &str) {
        let mut objects = self.objects.lock().unwrap();
        let o = objects.get_mut(&(ns.to_owned(), name.to_owned())).unwrap();
        o["metadata"]["deletionTimestamp"] = json!("2026-12-03T00:00:00Z");
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let content_type = req
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let Some(rest) = path.strip_prefix(PREFIX) else {
            return status(StatusCode::NOT_FOUND, "no such path");
        };
        let parts: Vec<&str> = rest.split('/').collect();
        let (ns, name, sub) = match parts.as_slice() {
            [ns, "machines", name] => (*ns, *name, None),
            [ns, "machines", name, sub] => (*ns, *name, Some(*sub)),
            _ => return status(StatusCode::NOT_FOUND, "no such path"),
        };
        let key = (ns.to_owned(), name.to_owned());
        let mut objects = self.objects.lock().unwrap();
        let Some(object) = objects.get_mut(&key) else {
            return status(StatusCode::NOT_FOUND, "not found");
        };
        match (method, sub) {
            (Method::GET, None) => json_response(object),
            (Method::PATCH, sub) => {
                let patch: Value = serde_json::from_slice(&body).unwrap();
                let mut updated = object.clone();
                match (content_type.as_str(), sub) {
                    ("application/json-patch+json", None) => {
                        let mut ops: json_patch::Patch = serde_json::from_value(patch).unwrap();
                        // As the API server's JSON patch does: `test` of null passes on
                        // a path that is absent (kube's finalizer helper relies on it).
                        ops.0.retain(|op| match op {
                            json_patch::PatchOperation::Test(t) if t.value.is_null() => {
                                updated.pointer(t.path.as_str()).is_some()
                            }
                            _ => true,
                        });
                        if let Err(e) = json_patch::patch(&mut updated, &ops) {
                            return status(StatusCode::UNPROCESSABLE_ENTITY, &e.to_string());
                        }
                    }
                    ("application/merge-patch+json", Some("status")) => {
                        // The status subresource changes the status only.
                        let only = json!({ "status": patch.get("status").cloned().unwrap_or(Value::Null) });
                        json_patch::merge(&mut updated, &only);
                    }
                    (other, sub) => {
                        return status(
                            StatusCode::UNSUPPORTED_MEDIA_TYPE,
                            &format!("{other} on {sub:?} is not served by the fake"),
                        );
                    }
                }
                self.writes.fetch_add(1, Ordering::SeqCst);
                if sub == Some("status") {
                    self.status_writes.fetch_add(1, Ordering::SeqCst);
                }
                let version: u64 = updated["metadata"]["resourceVersion"]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                updated["metadata"]["resourceVersion"] = json!((version + 1).to_string());
                let gone = updated["metadata"]["deletionTimestamp"].is_string()
                    && updated["metadata"]["finalizers"]
                        .as_array()
                        .is_none_or(|f| f.is_empty());
                let answer = json_response(&updated);
                if gone {
                    objects.remove(&key);
                } else {
                    *object = updated;
                }
                answer
            }
            (m, sub) => status(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("{m} on {sub:?} is not served by the fake"),
            ),
        }
    }
}

/// A kube client for the server at `addr`.
pub fn client(addr: std::net::SocketAddr) -> kube::Client {
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

fn key_of(object: &Value) -> (String, String) {
    (
        object["metadata"]["namespace"].as_str().unwrap().to_owned(),
        object["metadata"]["name"].as_str().unwrap().to_owned(),
    )
}

fn json_response(v: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(v).unwrap())))
        .unwrap()
}

/// A `Status` object, as the API server answers errors.
fn status(code: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": message, "reason": code.canonical_reason(), "code": code.as_u16()
    });
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(&body).unwrap())))
        .unwrap()
}
