//! The `MachineSet` reconciler through kube's real client against the stand-in API
//! server (see `common`), with the simulator provider: a set goes Ready with its
//! machines shown as `Machine` objects it owns; `kubectl scale` through the scale
//! subresource; a coupled change replaces machines within `maxSurge`, a decoupled one
//! is applied in place; deleting the set deletes its machines first; bad input is
//! refused naming the field, with nothing made; the whole controller (watch, requeue)
//! converges on its own.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::autoscaling::v1::{Scale, ScaleSpec};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use machine_core::fleet::SET_LABEL;
use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    Composer, ComposerSettings, Error, ExecOutput, Labels, Machine, MachineProvisioner,
    SentinelFile,
};
use machine_kube::{
    Context, FINALIZER, MachineObject, MachineSetObject, PROVIDER_ANNOTATION, Registry,
    SET_NAME_LABEL, reconcile, reconcile_set,
};
use serde_json::{Value, json};

use common::FakeApi;

const NS: &str = "default";

/// A set of `replicas` machines of `template` (a `Machine` spec) with `extra` merged into
/// its spec.
fn set_object(name: &str, replicas: i64, template: Value, extra: Value) -> Value {
    let mut spec = json!({
        "replicas": replicas,
        "template": {
            "metadata": { "labels": { "app": "web" } },
            "spec": template,
        },
    });
    json_patch::merge(&mut spec, &extra);
    json!({
        "apiVersion": "machine-provisioning.dev/v1alpha1",
        "kind": "MachineSet",
        "metadata": { "name": name, "namespace": NS },
        "spec": spec,
    })
}

fn template(layers: &[&str], machine: Value) -> Value {
    json!({ "provider": "sim", "layers": layers, "machine": machine })
}

struct World {
    api: FakeApi,
    client: kube::Client,
    cloud: SimCloud,
    sim: Arc<SimProvider>,
    ctx: Arc<Context>,
}

impl World {
    async fn new() -> Self {
        let api = FakeApi::default();
        let client = api.start().await;
        let cloud = SimCloud::new();
        let config = SimConfig::default()
            .with_boot_latency(Duration::from_millis(20))
            .with_boot_jitter(Duration::ZERO)
            .with_delete_latency(Duration::from_millis(20));
        let sim = Arc::new(SimProvider::new(cloud.clone(), config).unwrap());
        let ctx = Arc::new(
            Context::new(client.clone(), registry(sim.clone(), &cloud))
                .with_resync(Duration::from_secs(60)),
        );
        World {
            api,
            client,
            cloud,
            sim,
            ctx,
        }
    }

    /// One reconcile of the stored set, as the controller makes on a watch event.
    async fn step(&self, name: &str) -> Result<Action, machine_kube::ReconcileError> {
        let stored = self.api.set(NS, name).expect("set");
        let obj: MachineSetObject = serde_json::from_value(stored).unwrap();
        reconcile_set(Arc::new(obj), self.ctx.clone()).await
    }

    /// Reconciles until `done` holds of the stored set (at most 300 times), calling
    /// `each` after every step.
    async fn until(
        &self,
        name: &str,
        done: impl Fn(Option<&Value>) -> bool,
        mut each: impl FnMut(&World),
    ) {
        for _ in 0..300 {
            if done(self.api.set(NS, name).as_ref()) {
                return;
            }
            if let Err(e) = self.step(name).await {
                panic!("reconcile failed: {e}");
            }
            each(self);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{name} never got there: {:#?}", self.api.set(NS, name));
    }

    /// The set's machines at the provider that are not going.
    async fn live(&self, set: &str) -> Vec<Machine> {
        let selector = Labels::from([(SET_LABEL.to_owned(), set.to_owned())]);
        self.sim
            .list(&selector)
            .await
            .unwrap()
            .into_iter()
            .filter(|m| !m.phase.is_deleting())
            .collect()
    }

    fn event_reasons(&self) -> Vec<String> {
        self.api
            .events(NS)
            .iter()
            .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

/// Provider `sim` (with a connector), and `bare` (without one); layers `a` and `b`
/// decoupled (each writes /etc/<name>), `broken` decoupled (runs `start-broken`, which
/// fails where a test makes it), `base` coupled; a completion check when both kinds
/// meet. Polls every 10 ms, so that a fleet's requeue is quick.
fn registry(sim: Arc<SimProvider>, cloud: &SimCloud) -> Registry {
    registry_polling(sim, cloud, Duration::from_millis(10))
}

/// [`registry`] with composers polling every `poll`.
fn registry_polling(sim: Arc<SimProvider>, cloud: &SimCloud, poll: Duration) -> Registry {
    let connector = Arc::new(SimConnector::new(cloud.clone()));
    Registry::new(move |provider, layers| {
        let sim: Arc<dyn MachineProvisioner> = sim.clone();
        let mut builder = match provider {
            "sim" => Composer::builder(sim).connector(connector.clone()),
            "bare" => Composer::builder(sim),
            other => {
                return Err(Error::invalid_spec(
                    "spec.provider",
                    format!("{other:?} is not registered"),
                ));
            }
        };
        let (mut coupled, mut decoupled) = (false, false);
        for (i, layer) in layers.iter().enumerate() {
            let mut steps = vec![Step::write_file(format!("/etc/{layer}"), "here\n")];
            if layer == "broken" {
                steps.push(Step::run("start-broken"));
            }
            let made = Arc::new(StepLayer::new(layer.as_str(), steps)?);
            builder = match layer.as_str() {
                "a" | "b" | "broken" => {
                    decoupled = true;
                    builder.decoupled(made)
                }
                "base" => {
                    coupled = true;
                    builder.coupled(made)
                }
                other => {
                    return Err(Error::invalid_spec(
                        format!("spec.layers[{i}]"),
                        format!("{other:?} is not registered"),
                    ));
                }
            };
        }
        if coupled && decoupled {
            builder = builder.completion(Arc::new(SentinelFile::default()));
        }
        builder
            .settings(ComposerSettings::default().with_poll_interval(poll))
            .build()
    })
}

fn status(o: Option<&Value>) -> &Value {
    o.map_or(&Value::Null, |o| &o["status"])
}

fn condition(o: &Value, type_: &str) -> Value {
    o["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .cloned()
        .unwrap_or(Value::Null)
}

/// All `replicas` machines available and nothing left to do.
fn settled(replicas: i64) -> impl Fn(Option<&Value>) -> bool {
    move |o| {
        let s = status(o);
        s["availableReplicas"] == json!(replicas)
            && s["updatedReplicas"] == json!(replicas)
            && s["replicas"] == json!(replicas)
            && o.is_some_and(|o| condition(o, "Progressing")["status"] == "False")
            && o.is_some_and(|o| o["metadata"]["generation"] == s["observedGeneration"])
    }
}

/// The `Machine` objects the set `uid` controls, by name.
fn owned(api: &FakeApi, uid: &str) -> BTreeMap<String, Value> {
    api.machines(NS)
        .into_iter()
        .filter(|(_, o)| {
            o["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r["uid"] == uid))
        })
        .collect()
}

#[tokio::test]
async fn a_set_goes_ready_with_its_machines_shown_as_machine_objects_it_owns() {
    let w = World::new().await;
    w.api.insert_set(set_object(
        "web",
        3,
        template(&["a"], json!({ "image": "debian-12" })),
        json!({ "selector": { "matchLabels": { "app": "web" } } }),
    ));

    // The first reconcile only puts the finalizer on, naming the provider with it.
    assert_eq!(w.step("web").await.unwrap(), Action::await_change());
    let stored = w.api.set(NS, "web").unwrap();
    assert_eq!(stored["metadata"]["finalizers"], json!([FINALIZER]));
    assert_eq!(
        stored["metadata"]["annotations"][PROVIDER_ANNOTATION],
        json!("sim")
    );
    assert_eq!(w.cloud.machine_count(), 0, "a machine before the finalizer");

    w.until("web", settled(3), |_| {}).await;
    let stored = w.api.set(NS, "web").unwrap();
    let s = &stored["status"];
    assert_eq!(s["replicas"], 3);
    assert_eq!(s["readyReplicas"], 3);
    assert_eq!(s["updatedReplicas"], 3);
    assert_eq!(s["availableReplicas"], 3);
    assert_eq!(s["unavailableReplicas"], 0);
    assert_eq!(s["observedGeneration"], 1);
    assert!(
        s["observedRevision"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{s}"
    );
    assert_eq!(
        s["selector"],
        json!(format!("app=web,{SET_NAME_LABEL}=web")),
        "{s}"
    );
    assert!(s.get("specError").is_none(), "{s}");
    for (type_, want) in [
        ("Available", "True"),
        ("Progressing", "False"),
        ("RolloutPaused", "False"),
        ("RemediationPaused", "False"),
        ("SpecApplied", "True"),
        ("Synced", "True"),
    ] {
        let c = condition(&stored, type_);
        assert_eq!(c["status"], want, "{type_}: {c}");
        // metav1.Condition's shape.
        for field in ["reason", "message", "lastTransitionTime"] {
            assert!(c[field].is_string(), "{type_}.{field}: {c}");
        }
        assert_eq!(c["observedGeneration"], 1, "{c}");
    }

    // Each machine is a Machine object of its name, controlled by the set.
    let uid = stored["metadata"]["uid"].as_str().unwrap().to_owned();
    let objects = owned(&w.api, &uid);
    let names: BTreeSet<&str> = objects.keys().map(String::as_str).collect();
    assert_eq!(names, BTreeSet::from(["web-0-0", "web-1-0", "web-2-0"]));
    let live = w.live("web").await;
    assert_eq!(live.len(), 3);
    for m in &live {
        let o = &objects[m.name.as_str()];
        assert_eq!(
            o["metadata"]["ownerReferences"],
            json!([{
                "apiVersion": "machine-provisioning.dev/v1alpha1",
                "kind": "MachineSet",
                "name": "web",
                "uid": uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }]),
            "{o}"
        );
        assert_eq!(o["metadata"]["labels"][SET_NAME_LABEL], "web");
        assert_eq!(o["metadata"]["labels"]["app"], "web");
        assert_eq!(o["spec"], template(&["a"], json!({ "image": "debian-12" })));
        assert_eq!(
            o["status"]["machine"]["providerID"],
            json!(m.provider_id.to_string())
        );
        assert_eq!(o["status"]["machine"]["phase"], "Ready");
        assert_eq!(condition(o, "Ready")["status"], "True", "{o}");
        assert_eq!(condition(o, "SpecApplied")["status"], "True", "{o}");
        assert_eq!(o["status"]["applied"]["layers"], json!(["a"]));
        assert!(
            o["metadata"].get("finalizers").is_none(),
            "a set's machine object has a finalizer: {o}"
        );
    }

    // The Machine controller leaves the set's objects alone.
    let writes = w.api.writes.load(Ordering::SeqCst);
    let one: MachineObject = serde_json::from_value(objects["web-0-0"].clone()).unwrap();
    assert_eq!(
        reconcile(Arc::new(one), w.ctx.clone()).await.unwrap(),
        Action::await_change()
    );
    assert_eq!(w.api.writes.load(Ordering::SeqCst), writes);

    // Settled: nothing more is written, to the set or its machines' objects, and the
    // set is looked at again after the resync.
    let set_writes = w.api.set_writes.load(Ordering::SeqCst);
    for _ in 0..3 {
        // Past the fleet's poll interval (10 ms here), so that each is a step.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let action = w.step("web").await.unwrap();
        assert_eq!(action, Action::requeue(Duration::from_secs(60)));
    }
    assert_eq!(w.api.set_writes.load(Ordering::SeqCst), set_writes);
    assert_eq!(w.api.writes.load(Ordering::SeqCst), writes);
    // A reconcile right after a step (a watch event of its own write) calls nothing and
    // comes back at the fleet's pace. Seen by a controller (a new process) polling every
    // hour, so that "right after" holds on a machine however slow or busy.
    let hourly = Arc::new(
        Context::new(
            w.client.clone(),
            registry_polling(w.sim.clone(), &w.cloud, Duration::from_secs(3600)),
        )
        .with_resync(Duration::from_secs(60)),
    );
    let obj = || -> Arc<MachineSetObject> {
        Arc::new(serde_json::from_value(w.api.set(NS, "web").unwrap()).unwrap())
    };
    reconcile_set(obj(), hourly.clone()).await.unwrap();
    let calls = w.cloud.api_calls();
    let action = reconcile_set(obj(), hourly).await.unwrap();
    assert!(
        action != Action::requeue(Duration::from_secs(60)) && action != Action::await_change(),
        "{action:?}"
    );
    assert_eq!(w.cloud.api_calls(), calls, "a step right after a step");

    // A decision is an event.
    let creating = w
        .event_reasons()
        .iter()
        .filter(|r| *r == "CreatingMachine")
        .count();
    assert_eq!(creating, 3, "{:?}", w.event_reasons());

    // `kubectl get machines -l "$(status.selector)"` lists exactly the set's machines.
    let machines: Api<MachineObject> = Api::namespaced(w.client.clone(), NS);
    w.api.insert(json!({
        "apiVersion": "machine-provisioning.dev/v1alpha1",
        "kind": "Machine",
        "metadata": { "name": "other", "namespace": NS, "labels": { "app": "web" } },
        "spec": { "provider": "sim", "machine": {} }
    }));
    let selected: BTreeSet<String> = machines
        .list(&ListParams::default().labels(s["selector"].as_str().unwrap()))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| o.metadata.name.unwrap())
        .collect();
    assert_eq!(
        selected,
        names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>()
    );
}

#[tokio::test]
async fn kubectl_scale_goes_through_the_scale_subresource() {
    let w = World::new().await;
    w.api
        .insert_set(set_object("web", 2, template(&[], json!({})), json!({})));
    w.until("web", settled(2), |_| {}).await;
    let sets: Api<MachineSetObject> = Api::namespaced(w.client.clone(), NS);

    // What `kubectl scale` and an autoscaler read.
    let scale = sets.get_scale("web").await.unwrap();
    let stored = w.api.set(NS, "web").unwrap();
    assert_eq!(scale.spec.as_ref().unwrap().replicas, Some(2));
    let scale_status = scale.status.as_ref().unwrap();
    assert_eq!(scale_status.replicas, 2);
    assert_eq!(
        scale_status.selector.as_deref(),
        stored["status"]["selector"].as_str()
    );

    // `kubectl scale machineset/web --replicas=4` sends this merge patch.
    let scaled = sets
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": 4 } })),
        )
        .await
        .unwrap();
    assert_eq!(scaled.spec.unwrap().replicas, Some(4));
    let stored = w.api.set(NS, "web").unwrap();
    assert_eq!(stored["spec"]["replicas"], 4);
    assert_eq!(stored["metadata"]["generation"], 2);
    w.until("web", settled(4), |_| {}).await;
    let stored = w.api.set(NS, "web").unwrap();
    assert_eq!(stored["status"]["observedGeneration"], 2);
    let uid = stored["metadata"]["uid"].as_str().unwrap().to_owned();
    assert_eq!(owned(&w.api, &uid).len(), 4);
    assert_eq!(w.live("web").await.len(), 4);
    assert_eq!(
        sets.get_scale("web")
            .await
            .unwrap()
            .status
            .unwrap()
            .replicas,
        4
    );

    // An autoscaler's update under the resourceVersion it read, down to 1.
    let read = sets.get_scale("web").await.unwrap();
    let down = Scale {
        metadata: read.metadata.clone(),
        spec: Some(ScaleSpec { replicas: Some(1) }),
        status: None,
    };
    sets.replace_scale("web", &PostParams::default(), &down)
        .await
        .unwrap();
    // The same update again is stale now: 409, as the API server answers it.
    let stale = sets
        .replace_scale("web", &PostParams::default(), &down)
        .await
        .unwrap_err();
    assert!(
        matches!(stale, kube::Error::Api(ref s) if s.code == 409),
        "{stale}"
    );
    w.until("web", settled(1), |_| {}).await;
    // Settled counts the machines not going (as a ReplicaSet does not count terminating
    // pods); the objects of the ones still being deleted go once they are gone.
    for _ in 0..300 {
        if owned(&w.api, &uid).len() == 1 {
            break;
        }
        w.step("web").await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        owned(&w.api, &uid).len(),
        1,
        "{:?}",
        owned(&w.api, &uid).keys()
    );
    assert_eq!(w.live("web").await.len(), 1);

    // A negative scale is refused by the API server, naming the field; nothing changes.
    let refused = sets
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": -1 } })),
        )
        .await
        .unwrap_err();
    match refused {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 422, "{s:?}");
            assert!(s.message.contains(".spec.replicas"), "{}", s.message);
        }
        other => panic!("not refused by the API: {other}"),
    }
    assert_eq!(w.api.set(NS, "web").unwrap()["spec"]["replicas"], 1);
}

#[tokio::test]
async fn a_coupled_change_replaces_every_machine_within_max_surge() {
    let w = World::new().await;
    let strategy = json!({ "strategy": { "maxSurge": 1, "maxUnavailable": 0 } });
    w.api.insert_set(set_object(
        "web",
        3,
        template(&["base"], json!({ "image": "debian-12" })),
        strategy.clone(),
    ));
    w.until("web", settled(3), |_| {}).await;
    let uid = w.api.set(NS, "web").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let before: BTreeSet<String> = w
        .live("web")
        .await
        .into_iter()
        .map(|m| m.provider_id.to_string())
        .collect();
    let revision = w.api.set(NS, "web").unwrap()["status"]["observedRevision"].clone();

    w.api.patch_set_spec(
        NS,
        "web",
        json!({ "template": { "spec": { "machine": { "image": "debian-13" } } } }),
    );
    let mut most = 0;
    let mut least_available = i64::MAX;
    let mut told_replaced = false;
    w.until("web", settled(3), |w| {
        let s = &w.api.set(NS, "web").unwrap()["status"];
        least_available = least_available.min(s["availableReplicas"].as_i64().unwrap());
        most = most.max(s["replicas"].as_i64().unwrap());
        told_replaced |= owned(&w.api, &uid)
            .values()
            .any(|o| condition(o, "SpecApplied")["reason"] == "NeedsNewMachine");
    })
    .await;
    let live = w.live("web").await;
    assert!(
        least_available >= 3,
        "availability went below replicas - maxUnavailable: {least_available}"
    );
    assert!(most <= 4, "more machines than replicas + maxSurge: {most}");
    assert!(
        told_replaced,
        "no machine object said it was being replaced"
    );
    assert_eq!(live.len(), 3);
    for m in &live {
        assert!(
            !before.contains(&m.provider_id.to_string()),
            "{} was not replaced",
            m.name
        );
        assert!(
            m.name.as_str().ends_with("-1"),
            "a new generation: {}",
            m.name
        );
    }
    // The objects of the machines replaced go once those are gone.
    for _ in 0..100 {
        if owned(&w.api, &uid).len() == 3 {
            break;
        }
        w.step("web").await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stored = w.api.set(NS, "web").unwrap();
    assert_ne!(stored["status"]["observedRevision"], revision);
    assert_eq!(stored["status"]["observedGeneration"], 2);
    let objects = owned(&w.api, &uid);
    let names: BTreeSet<&str> = objects.keys().map(String::as_str).collect();
    assert_eq!(names, BTreeSet::from(["web-0-1", "web-1-1", "web-2-1"]));
    for o in objects.values() {
        assert_eq!(o["spec"]["machine"]["image"], "debian-13", "{o}");
        assert_eq!(condition(o, "SpecApplied")["status"], "True", "{o}");
    }
}

/// The controller's memory lost at every reconcile (a new process each time, as after a
/// kill -9 or a change of leader): a rollout still converges, each machine replaced
/// once, one object per machine, and the set never shows fewer available machines than
/// `replicas - maxUnavailable` (a new process looks at the machines before it reports).
#[tokio::test]
async fn a_controller_restarted_at_every_step_of_a_rollout_converges() {
    let w = World::new().await;
    w.api.insert_set(set_object(
        "re",
        3,
        template(&["base"], json!({ "image": "debian-12" })),
        json!({ "strategy": { "maxSurge": 1, "maxUnavailable": 0 } }),
    ));
    w.until("re", settled(3), |_| {}).await;
    let uid = w.api.set(NS, "re").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let events_before = w.api.events(NS).len();
    w.api.patch_set_spec(
        NS,
        "re",
        json!({ "template": { "spec": { "machine": { "image": "debian-13" } } } }),
    );
    let mut done = false;
    for _ in 0..300 {
        let stored = w.api.set(NS, "re").unwrap();
        let available = stored["status"]["availableReplicas"].as_i64().unwrap();
        assert!(available >= 3, "{available} available after a restart");
        if settled(3)(Some(&stored)) && owned(&w.api, &uid).len() == 3 {
            done = true;
            break;
        }
        let fresh = Arc::new(Context::new(
            w.client.clone(),
            registry(w.sim.clone(), &w.cloud),
        ));
        let obj: MachineSetObject = serde_json::from_value(stored).unwrap();
        reconcile_set(Arc::new(obj), fresh).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(done, "{:#?}", w.api.set(NS, "re"));
    assert_eq!(w.cloud.machine_count(), 6, "each machine replaced once");
    let names: BTreeSet<String> = owned(&w.api, &uid).into_keys().collect();
    let live: BTreeSet<String> = w
        .live("re")
        .await
        .into_iter()
        .map(|m| m.name.to_string())
        .collect();
    assert_eq!(names, live);
    assert!(names.iter().all(|n| n.ends_with("-1")), "{names:?}");
    let reasons = &w.event_reasons()[events_before..];
    assert!(
        !reasons.iter().any(|r| r == "BelowMinimum"),
        "the set was reported below its minimum: {reasons:?}"
    );
}

#[tokio::test]
async fn a_decoupled_change_is_applied_in_place_without_a_new_machine() {
    let w = World::new().await;
    w.api.insert_set(set_object(
        "app",
        3,
        template(&["a"], json!({})),
        json!({ "strategy": { "maxUnavailable": 1 } }),
    ));
    w.until("app", settled(3), |_| {}).await;
    let uid = w.api.set(NS, "app").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let before: BTreeMap<String, String> = w
        .live("app")
        .await
        .into_iter()
        .map(|m| (m.name.to_string(), m.provider_id.to_string()))
        .collect();
    let events_before = w.api.events(NS).len();

    w.api.patch_set_spec(
        NS,
        "app",
        json!({ "template": { "spec": { "layers": ["a", "b"] } } }),
    );
    let mut told_applying = false;
    w.until("app", settled(3), |w| {
        told_applying |= owned(&w.api, &uid)
            .values()
            .any(|o| condition(o, "SpecApplied")["reason"] == "Applying");
    })
    .await;
    let after: BTreeMap<String, String> = w
        .live("app")
        .await
        .into_iter()
        .map(|m| (m.name.to_string(), m.provider_id.to_string()))
        .collect();
    assert_eq!(after, before, "a machine was replaced");
    for m in w.live("app").await {
        let host = w.cloud.host(&m.provider_id).unwrap();
        assert_eq!(
            host.file_text("/etc/b").as_deref(),
            Some("here\n"),
            "{}",
            m.name
        );
    }
    assert!(told_applying, "no machine object said it was being updated");
    let reasons: Vec<String> = w.api.events(NS)[events_before..]
        .iter()
        .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        reasons.iter().filter(|r| *r == "UpdatingInPlace").count(),
        3,
        "{reasons:?}"
    );
    assert!(
        !reasons
            .iter()
            .any(|r| r == "CreatingMachine" || r == "DeletingMachine"),
        "{reasons:?}"
    );
    for o in owned(&w.api, &uid).values() {
        assert_eq!(o["spec"]["layers"], json!(["a", "b"]), "{o}");
        assert_eq!(o["status"]["applied"]["layers"], json!(["a", "b"]), "{o}");
        assert_eq!(condition(o, "SpecApplied")["status"], "True", "{o}");
    }
}

#[tokio::test]
async fn a_paused_rollout_stays_paused_when_the_controller_restarts() {
    let w = World::new().await;
    w.cloud.on_exec(
        "start-broken",
        ExecOutput::new(Some(3), Vec::new(), b"broken layer".to_vec()),
    );
    w.api.insert_set(set_object(
        "pz",
        3,
        template(&["a"], json!({})),
        json!({ "strategy": { "maxUnavailable": 1 } }),
    ));
    w.until("pz", settled(3), |_| {}).await;
    let events_before = w.api.events(NS).len();
    w.api.patch_set_spec(
        NS,
        "pz",
        json!({ "template": { "spec": { "layers": ["a", "broken"] } } }),
    );
    let paused =
        |o: Option<&Value>| o.is_some_and(|o| condition(o, "RolloutPaused")["status"] == "True");
    w.until("pz", paused, |_| {}).await;
    let updates = |w: &World| {
        w.api.events(NS)[events_before..]
            .iter()
            .filter(|e| e["reason"] == "UpdatingInPlace")
            .count()
    };
    assert_eq!(updates(&w), 1, "the rollout paused at its first machine");
    // Each step in a process of its own: the pause holds.
    for _ in 0..5 {
        let fresh = Arc::new(Context::new(
            w.client.clone(),
            registry(w.sim.clone(), &w.cloud),
        ));
        let obj: MachineSetObject = serde_json::from_value(w.api.set(NS, "pz").unwrap()).unwrap();
        reconcile_set(Arc::new(obj), fresh).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        updates(&w),
        1,
        "a restarted controller went on with the rollout"
    );
    let others: Vec<String> = w.api.events(NS)[events_before..]
        .iter()
        .map(|e| e["note"].as_str().unwrap_or_default().to_owned())
        .filter(|n| !n.contains("pz-0-0"))
        .collect();
    assert!(others.is_empty(), "other machines were touched: {others:?}");
    let stored = w.api.set(NS, "pz").unwrap();
    assert!(paused(Some(&stored)), "{stored:#}");
    assert!(
        condition(&stored, "RolloutPaused")["message"]
            .as_str()
            .is_some_and(|m| m.contains("broken layer")),
        "{stored:#}"
    );
}

#[tokio::test]
async fn deleting_the_set_deletes_its_machines_then_the_object() {
    let w = World::new().await;
    w.api
        .insert_set(set_object("gone", 2, template(&[], json!({})), json!({})));
    w.until("gone", settled(2), |_| {}).await;
    let uid = w.api.set(NS, "gone").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(owned(&w.api, &uid).len(), 2);

    w.api.delete_set(NS, "gone");
    // The finalizer holds the object while its machines go.
    assert!(w.api.set(NS, "gone").is_some());
    w.until("gone", |o| o.is_none(), |_| {}).await;
    assert!(
        w.live("gone").await.is_empty(),
        "{:?}",
        w.live("gone").await
    );
    assert!(owned(&w.api, &uid).is_empty(), "{:?}", owned(&w.api, &uid));
    let reasons = w.event_reasons();
    assert!(
        reasons.iter().any(|r| r == "DeletingMachine"),
        "{reasons:?}"
    );
    assert!(reasons.iter().any(|r| r == "Deleted"), "{reasons:?}");
}

/// Bad input: what the API server refuses at admission is refused by the stand-in as
/// it would be; what only the controller can tell (and anything stored before the CRD
/// said so) is refused by the controller, naming the field, with no finalizer, no
/// machine and no `Machine` object made.
#[tokio::test]
async fn bad_sets_are_refused_naming_the_field_and_nothing_is_made() {
    let w = World::new().await;
    let long = "a".repeat(50);

    // Admission: a negative replica count (the scale subresource's own check) and a
    // name too long for the fleet's machine names (the CRD's schema).
    let refused = w
        .api
        .create_set(set_object("neg", -1, template(&[], json!({})), json!({})))
        .unwrap_err();
    assert_eq!(refused.0, 422);
    assert!(refused.1.contains(".spec.replicas"), "{}", refused.1);
    let refused = w
        .api
        .create_set(set_object(&long, 1, template(&[], json!({})), json!({})))
        .unwrap_err();
    assert_eq!(refused.0, 422);
    assert!(refused.1.contains("metadata.name"), "{}", refused.1);

    let cases: Vec<(String, Value, &str)> = vec![
        (
            "neg".into(),
            set_object("neg", -1, template(&[], json!({})), json!({})),
            "spec.replicas",
        ),
        (
            long.clone(),
            set_object(&long, 1, template(&[], json!({})), json!({})),
            "metadata.name",
        ),
        (
            "zero".into(),
            set_object(
                "zero",
                3,
                template(&[], json!({})),
                json!({ "strategy": { "maxSurge": 0, "maxUnavailable": "0%" } }),
            ),
            "spec.strategy",
        ),
        (
            "surge".into(),
            set_object(
                "surge",
                3,
                template(&[], json!({})),
                json!({ "strategy": { "maxSurge": "150%" } }),
            ),
            "spec.strategy.maxSurge",
        ),
        (
            "unavail".into(),
            set_object(
                "unavail",
                3,
                template(&[], json!({})),
                json!({ "strategy": { "maxUnavailable": "101%" } }),
            ),
            "spec.strategy.maxUnavailable",
        ),
        (
            "unhealthy".into(),
            set_object(
                "unhealthy",
                3,
                template(&[], json!({})),
                json!({ "healthCheck": { "maxUnhealthy": "200%" } }),
            ),
            "spec.healthCheck.maxUnhealthy",
        ),
        (
            "probe".into(),
            set_object(
                "probe",
                3,
                json!({ "provider": "bare", "machine": {} }),
                json!({ "healthCheck": { "probe": { "command": "true" } } }),
            ),
            "spec.healthCheck.probe",
        ),
        (
            "startup".into(),
            set_object(
                "startup",
                3,
                template(&[], json!({})),
                json!({ "healthCheck": { "startupTimeout": "ten minutes" } }),
            ),
            "spec.healthCheck.startupTimeout",
        ),
        (
            "selector".into(),
            set_object(
                "selector",
                3,
                template(&[], json!({})),
                json!({ "selector": { "matchLabels": { "app": "db" } } }),
            ),
            "spec.selector",
        ),
        (
            "layer".into(),
            set_object("layer", 3, template(&["nope"], json!({})), json!({})),
            "spec.template.spec.layers[0]",
        ),
        (
            "machine".into(),
            set_object(
                "machine",
                3,
                template(&[], json!({ "labels": { "team": 5 } })),
                json!({}),
            ),
            "spec.template.spec.machine.labels.team",
        ),
    ];
    for (name, object, field) in &cases {
        w.api.insert_set_unadmitted(object.clone());
        for _ in 0..2 {
            assert_eq!(
                w.step(name).await.unwrap(),
                Action::await_change(),
                "{name}"
            );
        }
        let stored = w.api.set(NS, name).unwrap();
        let error = stored["status"]["specError"].as_str().unwrap_or_default();
        assert!(
            error.contains(&format!("{field}:")),
            "{name}: the error does not name {field}: {error:?}"
        );
        let c = condition(&stored, "SpecApplied");
        assert_eq!(c["status"], "False", "{name}: {c}");
        assert_eq!(c["reason"], "InvalidSpec", "{name}: {c}");
        assert!(
            stored["metadata"].get("finalizers").is_none(),
            "{name}: a refused set got a finalizer"
        );
    }
    assert_eq!(w.cloud.machine_count(), 0, "a refused set made a machine");
    assert!(
        w.api.machines(NS).is_empty(),
        "a refused set made a Machine object"
    );
    let invalid = w
        .event_reasons()
        .iter()
        .filter(|r| *r == "InvalidSpec")
        .count();
    assert_eq!(invalid, cases.len(), "{:?}", w.event_reasons());

    // Fixed, the error goes and the set is made.
    w.api
        .patch_set_spec(NS, "surge", json!({ "strategy": { "maxSurge": "50%" } }));
    w.until("surge", settled(3), |_| {}).await;
    let stored = w.api.set(NS, "surge").unwrap();
    assert!(stored["status"].get("specError").is_none(), "{stored}");
    assert_eq!(condition(&stored, "SpecApplied")["status"], "True");
}

/// The whole controller, both kinds under one `run_all_until`: the watch brings a new
/// set to its replicas, `kubectl scale` through the scale subresource is picked up, and
/// a deleted set goes with its machines, each on the requeues the fleet asks for.
#[tokio::test]
async fn the_controller_drives_a_set_from_its_watch() {
    let w = World::new().await;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let machines: Api<MachineObject> = Api::all(w.client.clone());
    let sets: Api<MachineSetObject> = Api::all(w.client.clone());
    let running = tokio::spawn(machine_kube::run_all_until(
        machines,
        sets.clone(),
        w.ctx.clone(),
        async move {
            let _ = stop_rx.await;
        },
    ));
    // A standalone Machine beside the set, for the Machine controller.
    w.api.insert(json!({
        "apiVersion": "machine-provisioning.dev/v1alpha1",
        "kind": "Machine",
        "metadata": { "name": "alone", "namespace": NS },
        "spec": { "provider": "sim", "machine": {} }
    }));
    w.api.insert_set(set_object(
        "live",
        2,
        template(&["a"], json!({})),
        json!({}),
    ));
    let wait = |what: &'static str, done: Box<dyn Fn(&World) -> bool + Send>| {
        let w = &w;
        async move {
            // Generous: 10x what it takes on a slow machine.
            for _ in 0..3000 {
                if done(w) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("{what} did not happen: {:#?}", w.api.set(NS, "live"));
        }
    };
    wait(
        "two machines",
        Box::new(|w| settled(2)(w.api.set(NS, "live").as_ref())),
    )
    .await;
    wait(
        "the standalone machine Ready",
        Box::new(|w| {
            w.api
                .get(NS, "alone")
                .is_some_and(|o| condition(&o, "Ready")["status"] == "True")
        }),
    )
    .await;

    let ns_sets: Api<MachineSetObject> = Api::namespaced(w.client.clone(), NS);
    ns_sets
        .patch_scale(
            "live",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": 3 } })),
        )
        .await
        .unwrap();
    wait(
        "three machines",
        Box::new(|w| settled(3)(w.api.set(NS, "live").as_ref())),
    )
    .await;
    let uid = w.api.set(NS, "live").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let objects = owned(&w.api, &uid);
    assert_eq!(objects.len(), 3);
    assert!(
        objects
            .values()
            .all(|o| condition(o, "Ready")["status"] == "True"),
        "{objects:#?}"
    );

    w.api.delete_set(NS, "live");
    wait(
        "the set gone",
        Box::new(|w| w.api.set(NS, "live").is_none()),
    )
    .await;
    assert!(w.live("live").await.is_empty());
    assert!(owned(&w.api, &uid).is_empty());
    // The standalone machine was not touched.
    assert!(w.api.get(NS, "alone").is_some());
    let _ = stop_tx.send(());
    running.await.unwrap();
}

/// A set does not move its machines between providers: the change is refused, naming
/// the field, and the machines stay; changed back, the set goes on.
#[tokio::test]
async fn a_set_does_not_move_between_providers() {
    let w = World::new().await;
    w.api
        .insert_set(set_object("mv", 1, template(&[], json!({})), json!({})));
    w.until("mv", settled(1), |_| {}).await;
    let before: Vec<String> = w
        .live("mv")
        .await
        .iter()
        .map(|m| m.provider_id.to_string())
        .collect();
    w.api.patch_set_spec(
        NS,
        "mv",
        json!({ "template": { "spec": { "provider": "bare" } } }),
    );
    assert_eq!(w.step("mv").await.unwrap(), Action::await_change());
    let stored = w.api.set(NS, "mv").unwrap();
    let error = stored["status"]["specError"].as_str().unwrap_or_default();
    assert!(error.contains("spec.template.spec.provider:"), "{error}");
    let after: Vec<String> = w
        .live("mv")
        .await
        .iter()
        .map(|m| m.provider_id.to_string())
        .collect();
    assert_eq!(after, before);
    w.api.patch_set_spec(
        NS,
        "mv",
        json!({ "template": { "spec": { "provider": "sim" } } }),
    );
    w.until("mv", settled(1), |_| {}).await;
    assert!(
        w.api.set(NS, "mv").unwrap()["status"]
            .get("specError")
            .is_none()
    );
}

/// A `Machine` object that is not the set's, under the name of one of its machines, is
/// left alone (a warning says so); the set still keeps its replicas.
#[tokio::test]
async fn an_object_of_a_machines_name_that_is_not_the_sets_is_left_alone() {
    let w = World::new().await;
    let theirs = json!({
        "apiVersion": "machine-provisioning.dev/v1alpha1",
        "kind": "Machine",
        "metadata": { "name": "web-0-0", "namespace": NS, "labels": { "team": "x" } },
        "spec": { "provider": "sim", "machine": {} }
    });
    w.api.insert(theirs);
    w.api
        .insert_set(set_object("web", 2, template(&[], json!({})), json!({})));
    w.until("web", settled(2), |_| {}).await;
    let stored = w.api.get(NS, "web-0-0").unwrap();
    assert!(
        stored["metadata"].get("ownerReferences").is_none(),
        "{stored}"
    );
    assert_eq!(stored["metadata"]["labels"], json!({ "team": "x" }));
    assert!(stored.get("status").is_none_or(Value::is_null), "{stored}");
    assert!(
        w.event_reasons().iter().any(|r| r == "NameTaken"),
        "{:?}",
        w.event_reasons()
    );
}
