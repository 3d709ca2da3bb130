//! The stand-in API server (`common`) checked against what the documents say the real
//! one does, for every behaviour the controller's tests rely on, through kube's own
//! client:
//! - RFC 7386 (JSON Merge Patch), Appendix A: every example, applied to a status;
//! - Kubernetes API concepts, "Resource versions" and "Conflicts": a write carrying a
//!   resourceVersion other than the stored one is `409 Conflict`; a create of an
//!   existing name `409 AlreadyExists`; a missing object `404 NotFound`;
//! - custom resources with the status subresource ("Subresources" of the CRD docs): a
//!   write of the object ignores `status`, a write of `/status` everything else;
//!   `metadata.generation` grows with `spec` only; an update of a custom resource must
//!   carry a resourceVersion;
//! - finalizers ("Finalizers", "Garbage collection"): a DELETE of an object with
//!   finalizers sets `deletionTimestamp`, no finalizer can be added then, the object
//!   goes with its last finalizer;
//! - JSON patch (RFC 6902): a failed `test` is refused (422);
//! - Lease (`coordination.k8s.io/v1`, LeaseSpec): `holderIdentity` (string),
//!   `leaseDurationSeconds` and `leaseTransitions` (int32), `acquireTime` and
//!   `renewTime` (MicroTime: RFC 3339 with microseconds); a duration of 0 and negative
//!   transitions refused (422);
//! - watch ("Efficient detection of changes"): from a list's resourceVersion, every
//!   later change in order, as ADDED, MODIFIED, DELETED; from a version the server no
//!   longer holds, `410 Gone` ("Resource versions": the client lists again);
//! - the scale subresource of a custom resource (CRD docs, "Scale subresource", and the
//!   apiextensions API server's `ScaleREST` and `ValidateScaleSpec`): the Scale's
//!   fields, writes of `spec.replicas` under the Scale's resourceVersion, negative counts
//!   refused (422) on every write;
//! - label selectors of a list ("Labels and Selectors"), equality- and set-based;
//! - garbage collection of dependents once their owners are gone ("Garbage
//!   collection", background propagation).

mod common;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use machine_kube::{MachineObject, MachineSetObject};
use serde_json::{Value, json};

use common::FakeApi;

const NS: &str = "default";

fn machine(name: &str) -> Value {
    json!({
        "apiVersion": "machine-provisioning.dev/v1alpha1",
        "kind": "Machine",
        "metadata": { "name": name, "namespace": NS },
        "spec": { "provider": "sim", "machine": {} }
    })
}

fn api_error(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason),
        other => panic!("not an API error: {other}"),
    }
}

async fn setup() -> (FakeApi, Api<MachineObject>, kube::Client) {
    let api = FakeApi::default();
    let client = api.start().await;
    (api, Api::namespaced(client.clone(), NS), client)
}

#[tokio::test]
async fn status_merge_patches_follow_rfc_7386_appendix_a() {
    let (api, machines, _) = setup().await;
    // RFC 7386, Appendix A: (original, patch, result), each as the value of status.v.
    let cases = [
        (json!({"a":"b"}), json!({"a":"c"}), json!({"a":"c"})),
        (json!({"a":"b"}), json!({"b":"c"}), json!({"a":"b","b":"c"})),
        (json!({"a":"b"}), json!({"a":null}), json!({})),
        (
            json!({"a":"b","b":"c"}),
            json!({"a":null}),
            json!({"b":"c"}),
        ),
        (json!({"a":["b"]}), json!({"a":"c"}), json!({"a":"c"})),
        (json!({"a":"c"}), json!({"a":["b"]}), json!({"a":["b"]})),
        (
            json!({"a":{"b":"c"}}),
            json!({"a":{"b":"d","c":null}}),
            json!({"a":{"b":"d"}}),
        ),
        (json!({"a":[{"b":"c"}]}), json!({"a":[1]}), json!({"a":[1]})),
        (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
        (json!({"a":"b"}), json!(["c"]), json!(["c"])),
        (json!({"a":"foo"}), Value::Null, Value::Null),
        (json!({"a":"foo"}), json!("bar"), json!("bar")),
        (json!({"e":null}), json!({"a":1}), json!({"e":null,"a":1})),
        (json!([1, 2]), json!({"a":"b","c":null}), json!({"a":"b"})),
        (
            json!({}),
            json!({"a":{"bb":{"ccc":null}}}),
            json!({"a":{"bb":{}}}),
        ),
    ];
    let params = PatchParams::default();
    for (i, (original, patch, result)) in cases.into_iter().enumerate() {
        let name = format!("rfc-{i}");
        api.insert(machine(&name));
        api.set_status_raw(NS, &name, json!({ "v": original }));
        machines
            .patch_status(
                &name,
                &params,
                &Patch::Merge(json!({ "status": { "v": patch } })),
            )
            .await
            .unwrap();
        let stored = api.get(NS, &name).unwrap();
        // A null result is the member removed.
        let got = stored["status"].get("v").cloned().unwrap_or(Value::Null);
        assert_eq!(got, result, "case {i}: {original} + {patch}");
    }
}

#[tokio::test]
async fn a_stale_resource_version_is_a_409_conflict() {
    let (api, machines, client) = setup().await;
    api.insert(machine("rv-1"));
    let read = machines.get("rv-1").await.unwrap();
    let rv = read.metadata.resource_version.clone().unwrap();
    let params = PatchParams::default();
    let with = |rv: &str, v: i32| json!({"metadata": {"resourceVersion": rv}, "status": {"v": v}});
    let written = machines
        .patch_status("rv-1", &params, &Patch::Merge(with(&rv, 1)))
        .await
        .unwrap();
    let newer = written.metadata.resource_version.unwrap();
    assert_ne!(newer, rv, "a write kept the resourceVersion");
    let e = machines
        .patch_status("rv-1", &params, &Patch::Merge(with(&rv, 2)))
        .await
        .unwrap_err();
    assert_eq!(api_error(e), (409, "Conflict".into()));
    assert_eq!(api.get(NS, "rv-1").unwrap()["status"]["v"], 1);

    // A replace of a custom resource carries its resourceVersion, or is refused.
    let mut stale = read.clone();
    stale.spec.layers = vec!["x".into()];
    let e = machines
        .replace("rv-1", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(api_error(e).0, 409);
    stale.metadata.resource_version = None;
    let e = machines
        .replace("rv-1", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(api_error(e).0, 422);

    // Create of an existing name; a missing object.
    let again: MachineObject = serde_json::from_value(machine("rv-1")).unwrap();
    let e = machines
        .create(&PostParams::default(), &again)
        .await
        .unwrap_err();
    assert_eq!(api_error(e), (409, "AlreadyExists".into()));
    let e = machines.get("nobody").await.unwrap_err();
    assert_eq!(api_error(e), (404, "NotFound".into()));

    // Leases too: a replace from a stale read loses.
    let leases: Api<Lease> = Api::namespaced(client, NS);
    let lease = leases
        .create(&PostParams::default(), &lease("l-1", 15))
        .await
        .unwrap();
    leases
        .replace("l-1", &PostParams::default(), &lease)
        .await
        .unwrap();
    let e = leases
        .replace("l-1", &PostParams::default(), &lease)
        .await
        .unwrap_err();
    assert_eq!(api_error(e).0, 409);
}

#[tokio::test]
async fn the_status_subresource_and_the_generation_behave_as_for_custom_resources() {
    let (api, machines, _) = setup().await;
    api.insert(machine("gen-1"));
    let generation =
        |api: &FakeApi| api.get(NS, "gen-1").unwrap()["metadata"]["generation"].clone();
    assert_eq!(generation(&api), 1);
    let params = PatchParams::default();
    // A status write changes the status only, and not the generation.
    machines
        .patch_status(
            "gen-1",
            &params,
            &Patch::Merge(json!({"status": {"v": 1}, "spec": {"provider": "x"}})),
        )
        .await
        .unwrap();
    let stored = api.get(NS, "gen-1").unwrap();
    assert_eq!(stored["spec"]["provider"], "sim");
    assert_eq!(stored["status"]["v"], 1);
    assert_eq!(generation(&api), 1);
    // A write of the object ignores its status; metadata does not move the generation.
    machines
        .patch(
            "gen-1",
            &params,
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}, "status": {"v": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(api.get(NS, "gen-1").unwrap()["status"]["v"], 1);
    assert_eq!(generation(&api), 1);
    // The spec does.
    machines
        .patch(
            "gen-1",
            &params,
            &Patch::Merge(json!({"spec": {"layers": ["a"]}})),
        )
        .await
        .unwrap();
    assert_eq!(generation(&api), 2);
}

#[tokio::test]
async fn deletion_waits_for_the_last_finalizer_and_refuses_new_ones() {
    let (api, machines, _) = setup().await;
    api.insert(machine("fin-1"));
    let params = PatchParams::default();
    let json_patch =
        |ops: Value| -> Patch<()> { Patch::Json(serde_json::from_value(ops).unwrap()) };
    // A `test` of null passes on an absent path; a failed `test` is refused.
    machines
        .patch(
            "fin-1",
            &params,
            &json_patch(json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": ["a/x"]},
            ])),
        )
        .await
        .unwrap();
    let e = machines
        .patch(
            "fin-1",
            &params,
            &json_patch(json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "b/y"}])),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(e).0, 422);
    machines
        .delete("fin-1", &DeleteParams::default())
        .await
        .unwrap();
    let stored = api
        .get(NS, "fin-1")
        .expect("an object with a finalizer stays");
    assert!(
        stored["metadata"]["deletionTimestamp"].is_string(),
        "{stored}"
    );
    let e = machines
        .patch(
            "fin-1",
            &params,
            &json_patch(json!([{"op": "add", "path": "/metadata/finalizers/-", "value": "b/y"}])),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(e).0, 422);
    machines
        .patch(
            "fin-1",
            &params,
            &json_patch(json!([{"op": "remove", "path": "/metadata/finalizers/0"}])),
        )
        .await
        .unwrap();
    assert!(
        api.get(NS, "fin-1").is_none(),
        "the object outlived its last finalizer"
    );
    // Without finalizers, at once.
    api.insert(machine("fin-2"));
    machines
        .delete("fin-2", &DeleteParams::default())
        .await
        .unwrap();
    assert!(api.get(NS, "fin-2").is_none());
}

fn lease(name: &str, duration: i32) -> Lease {
    let now = MicroTime(Timestamp::now());
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("replica-a".into()),
            lease_duration_seconds: Some(duration),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    }
}

#[tokio::test]
async fn lease_fields_are_those_of_the_coordination_api() {
    let (api, _, client) = setup().await;
    let leases: Api<Lease> = Api::namespaced(client, NS);
    let made = leases
        .create(&PostParams::default(), &lease("l-1", 15))
        .await
        .unwrap();
    let read = leases.get("l-1").await.unwrap();
    assert_eq!(read.spec, made.spec);
    let raw = api.object("leases", NS, "l-1").unwrap();
    let spec = &raw["spec"];
    assert_eq!(spec["holderIdentity"], "replica-a");
    assert_eq!(spec["leaseDurationSeconds"], 15);
    assert_eq!(spec["leaseTransitions"], 0);
    let micro = regex_lite::Regex::new(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$").unwrap();
    for field in ["acquireTime", "renewTime"] {
        let t = spec[field].as_str().unwrap_or_default();
        assert!(micro.is_match(t), "{field} is not a MicroTime: {t:?}");
    }
    let e = leases
        .create(&PostParams::default(), &lease("l-2", 0))
        .await
        .unwrap_err();
    assert_eq!(api_error(e).0, 422);
    let mut negative = lease("l-3", 15);
    negative.spec.as_mut().unwrap().lease_transitions = Some(-1);
    let e = leases
        .create(&PostParams::default(), &negative)
        .await
        .unwrap_err();
    assert_eq!(api_error(e).0, 422);
}

#[tokio::test]
async fn a_watch_sends_every_change_after_the_lists_resource_version() {
    let (api, machines, _) = setup().await;
    api.insert(machine("w-0"));
    let list = machines.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let rv = list.metadata.resource_version.unwrap();
    api.insert(machine("w-1"));
    api.set_status_raw(NS, "w-1", json!({"v": 1}));
    machines
        .delete("w-0", &DeleteParams::default())
        .await
        .unwrap();
    let events: Vec<(String, String)> = machines
        .watch(&WatchParams::default().timeout(1), &rv)
        .await
        .unwrap()
        .map_ok(|e| match e {
            WatchEvent::Added(o) => ("ADDED".to_owned(), o.metadata.name.unwrap()),
            WatchEvent::Modified(o) => ("MODIFIED".to_owned(), o.metadata.name.unwrap()),
            WatchEvent::Deleted(o) => ("DELETED".to_owned(), o.metadata.name.unwrap()),
            other => (format!("{other:?}"), String::new()),
        })
        .take(3)
        .try_collect()
        .await
        .unwrap();
    let expected: Vec<(String, String)> =
        [("ADDED", "w-1"), ("MODIFIED", "w-1"), ("DELETED", "w-0")]
            .iter()
            .map(|(k, n)| ((*k).to_owned(), (*n).to_owned()))
            .collect();
    assert_eq!(events, expected);
}

#[tokio::test]
async fn a_watch_from_a_version_the_server_no_longer_holds_is_410_gone() {
    let (api, machines, _) = setup().await;
    for i in 0..4_100 {
        api.insert(machine(&format!("g-{i}")));
    }
    let e = match machines
        .watch(&WatchParams::default().timeout(1), "1")
        .await
    {
        Ok(stream) => {
            let first = stream.boxed().next().await.expect("an answer");
            match first {
                Ok(WatchEvent::Error(e)) => panic!("an error event, not a status: {e:?}"),
                Ok(other) => panic!("a watch from a compacted version went on: {other:?}"),
                Err(e) => e,
            }
        }
        Err(e) => e,
    };
    assert_eq!(api_error(e).0, 410);
}

fn machine_set(name: &str, replicas: Option<i64>) -> Value {
    let mut spec = json!({ "template": { "spec": { "provider": "sim", "machine": {} } } });
    if let Some(n) = replicas {
        spec["replicas"] = json!(n);
    }
    json!({
        "apiVersion": "machine-provisioning.dev/v1alpha1",
        "kind": "MachineSet",
        "metadata": { "name": name, "namespace": NS },
        "spec": spec,
    })
}

/// The scale subresource of a custom resource (the CRD documentation's "Scale
/// subresource", and `ScaleREST` / `ValidateScaleSpec` of the apiextensions API
/// server): an `autoscaling/v1` Scale built from the paths the CRD names (status
/// replicas 0 and selector "" when absent; an error when spec replicas are absent);
/// writes set `spec.replicas` only, under the Scale's resourceVersion when it carries
/// one, moving the generation; a negative count is refused on every write of the
/// object, the scale's included.
#[tokio::test]
async fn the_scale_subresource_answers_as_for_a_custom_resource() {
    let (api, _, client) = setup().await;
    let sets: Api<MachineSetObject> = Api::namespaced(client, NS);
    api.insert_set(machine_set("s-1", Some(2)));
    let stored = api.set(NS, "s-1").unwrap();
    let scale = sets.get_scale("s-1").await.unwrap();
    let raw = serde_json::to_value(&scale).unwrap();
    assert_eq!(raw["apiVersion"], "autoscaling/v1", "{raw}");
    assert_eq!(raw["kind"], "Scale");
    for field in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        assert_eq!(raw["metadata"][field], stored["metadata"][field], "{field}");
    }
    assert_eq!(raw["spec"]["replicas"], 2);
    assert_eq!(raw["status"]["replicas"], 0, "no status yet: 0");
    assert_eq!(raw["status"]["selector"], "", "no status yet: empty");

    // The status paths, once written.
    sets.patch_status(
        "s-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"replicas": 2, "selector": "a=b"}})),
    )
    .await
    .unwrap();
    let status = sets.get_scale("s-1").await.unwrap().status.unwrap();
    assert_eq!(
        (status.replicas, status.selector.as_deref()),
        (2, Some("a=b"))
    );

    // A merge patch of the Scale (what `kubectl scale` sends) moves spec.replicas and
    // the generation, and nothing else.
    let scaled = sets
        .patch_scale(
            "s-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(scaled.spec.unwrap().replicas, Some(5));
    let after = api.set(NS, "s-1").unwrap();
    assert_eq!(after["spec"]["replicas"], 5);
    assert_eq!(after["metadata"]["generation"], 2);
    assert_eq!(after["status"], json!({"replicas": 2, "selector": "a=b"}));
    assert_eq!(
        scaled.metadata.resource_version.as_ref(),
        after["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_owned)
            .as_ref(),
        "the Scale answered carries the new resourceVersion"
    );

    // A PUT carries its resourceVersion as a precondition; without one it is
    // unconditional.
    let read = sets.get_scale("s-1").await.unwrap();
    let mut to_three = read.clone();
    to_three.spec.as_mut().unwrap().replicas = Some(3);
    sets.replace_scale("s-1", &PostParams::default(), &to_three)
        .await
        .unwrap();
    let e = sets
        .replace_scale("s-1", &PostParams::default(), &to_three)
        .await
        .unwrap_err();
    assert_eq!(api_error(e), (409, "Conflict".into()));
    to_three.metadata.resource_version = None;
    to_three.spec.as_mut().unwrap().replicas = Some(4);
    sets.replace_scale("s-1", &PostParams::default(), &to_three)
        .await
        .unwrap();
    assert_eq!(api.set(NS, "s-1").unwrap()["spec"]["replicas"], 4);

    // A negative count is refused, naming the path, on the scale and on the object.
    let e = sets
        .patch_scale(
            "s-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": -1}})),
        )
        .await
        .unwrap_err();
    let kube::Error::Api(s) = e else {
        panic!("not an API error")
    };
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert!(
        s.message.contains(".spec.replicas: Invalid value: -1"),
        "{}",
        s.message
    );
    let e = sets
        .patch(
            "s-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": -2}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(e).0, 422);
    let e = sets
        .patch_status(
            "s-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": -1}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(e).0, 422);
    assert_eq!(
        api.create_set(machine_set("s-neg", Some(-1)))
            .unwrap_err()
            .0,
        422
    );
    assert_eq!(api.set(NS, "s-1").unwrap()["spec"]["replicas"], 4);

    // Without spec.replicas, a GET of the scale is an error; a missing object is 404.
    api.insert_set(machine_set("s-none", None));
    let e = sets.get_scale("s-none").await.unwrap_err();
    assert_eq!(api_error(e).0, 500);
    let e = sets.get_scale("nobody").await.unwrap_err();
    assert_eq!(api_error(e), (404, "NotFound".into()));
}

/// Label selectors of a list, in their string form ("Labels and Selectors":
/// equality-based `=`, `==`, `!=`; set-based `in`, `notin`, `key`, `!key`; comma means
/// and).
#[tokio::test]
async fn lists_filter_by_label_selectors() {
    let (api, machines, _) = setup().await;
    for (name, labels) in [
        ("l-a", json!({"app": "web", "tier": "front"})),
        ("l-b", json!({"app": "web", "tier": "back"})),
        ("l-c", json!({"app": "db"})),
        ("l-d", json!({})),
    ] {
        let mut m = machine(name);
        m["metadata"]["labels"] = labels;
        api.insert(m);
    }
    let cases = [
        ("app=web", vec!["l-a", "l-b"]),
        ("app==web,tier=back", vec!["l-b"]),
        ("app!=web", vec!["l-c", "l-d"]),
        ("tier in (front, back)", vec!["l-a", "l-b"]),
        ("app notin (web)", vec!["l-c", "l-d"]),
        ("tier", vec!["l-a", "l-b"]),
        ("!tier", vec!["l-c", "l-d"]),
        ("app in (web,db),!tier", vec!["l-c"]),
    ];
    for (selector, want) in cases {
        let got: Vec<String> = machines
            .list(&ListParams::default().labels(selector))
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|o| o.metadata.name.unwrap())
            .collect();
        assert_eq!(got, want, "{selector}");
    }
    let e = machines
        .list(&ListParams::default().labels("tier in front"))
        .await
        .unwrap_err();
    assert_eq!(api_error(e).0, 400);
}

/// The garbage collector ("Garbage collection", background cascading deletion): once
/// an owner is gone, each dependent whose owners are all gone is deleted (one with
/// finalizers is marked for deletion and waits for them); a dependent with an owner
/// left stays.
#[tokio::test]
async fn dependents_go_once_all_their_owners_are_gone() {
    let (api, machines, client) = setup().await;
    let sets: Api<MachineSetObject> = Api::namespaced(client, NS);
    api.insert_set(machine_set("owner", Some(1)));
    api.insert_set(machine_set("other-owner", Some(1)));
    let uid = |name: &str| api.set(NS, name).unwrap()["metadata"]["uid"].clone();
    let owner_ref = |name: &str| {
        json!({"apiVersion": "machine-provisioning.dev/v1alpha1", "kind": "MachineSet",
               "name": name, "uid": uid(name), "controller": true, "blockOwnerDeletion": true})
    };
    let dependent = |name: &str, owners: Vec<Value>, finalizers: Vec<&str>| {
        let mut m = machine(name);
        m["metadata"]["ownerReferences"] = json!(owners);
        m["metadata"]["finalizers"] = json!(finalizers);
        m
    };
    api.insert(dependent("d-plain", vec![owner_ref("owner")], vec![]));
    api.insert(dependent("d-final", vec![owner_ref("owner")], vec!["x/y"]));
    api.insert(dependent(
        "d-shared",
        vec![owner_ref("owner"), owner_ref("other-owner")],
        vec![],
    ));
    api.insert(machine("d-free"));

    sets.delete("owner", &Default::default()).await.unwrap();
    assert!(api.set(NS, "owner").is_none());
    assert!(
        api.get(NS, "d-plain").is_none(),
        "a dependent outlived its owner"
    );
    let marked = api.get(NS, "d-final").expect("held by its finalizer");
    assert!(
        marked["metadata"]["deletionTimestamp"].is_string(),
        "{marked}"
    );
    assert!(api.get(NS, "d-shared").is_some(), "an owner is left");
    assert!(api.get(NS, "d-free").is_some());
    // Its finalizer off, it goes.
    machines
        .patch(
            "d-final",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert!(api.get(NS, "d-final").is_none());
    sets.delete("other-owner", &Default::default())
        .await
        .unwrap();
    assert!(api.get(NS, "d-shared").is_none(), "its last owner went");
}
