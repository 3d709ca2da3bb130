//! The reconciler through kube's real client against a stand-in API server (see
//! `common`), with the simulator provider: create to Ready with a providerID and
//! Kubernetes conditions; an unchanged object is not written; deletion runs deprovision
//! behind the finalizer, then the finalizer goes; a spec error clears once fixed; spec
//! changes are applied in place or refused with a reason; objects the controller cannot
//! clean up never get a finalizer; errors and decisions reach the status and events.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::Api;
use kube::api::PostParams;
use kube::runtime::controller::Action;
use machine_core::decorators::{FaultConfig, FaultInjecting};
use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
use machine_core::steps::{Step, StepLayer};
use machine_core::{Composer, Error, MachineProvisioner, Phase, ProviderId};
use machine_kube::{
    Context, FINALIZER, MachineObject, PROVIDER_ANNOTATION, ReconcileError, Registry, error_policy,
    reconcile,
};
use serde_json::{Value, json};

use common::FakeApi;

const NS: &str = "default";

fn object(name: &str, layers: &[&str], machine: Value) -> Value {
    json!({
        "apiVersion": "machine-provisioning.dev/v1alpha1",
        "kind": "Machine",
        "metadata": { "name": name, "namespace": NS },
        "spec": { "provider": "sim", "layers": layers, "machine": machine }
    })
}

fn quick_sim(cloud: &SimCloud) -> Arc<SimProvider> {
    let config = SimConfig::default()
        .with_boot_latency(Duration::from_millis(20))
        .with_boot_jitter(Duration::ZERO)
        .with_delete_latency(Duration::from_millis(20));
    Arc::new(SimProvider::new(cloud.clone(), config).unwrap())
}

/// Provider `sim`; layers `a` and `b` decoupled (each writes /etc/<name>), `base`
/// coupled.
fn registry(provider: Arc<dyn MachineProvisioner>, cloud: &SimCloud) -> Registry {
    let connector = Arc::new(SimConnector::new(cloud.clone()));
    Registry::new(move |name, layers| {
        if name != "sim" {
            return Err(Error::invalid_spec(
                "spec.provider",
                format!("{name:?} is not registered"),
            ));
        }
        let mut builder = Composer::builder(provider.clone()).connector(connector.clone());
        for (i, layer) in layers.iter().enumerate() {
            let steps = vec![Step::write_file(format!("/etc/{layer}"), "here\n")];
            let made = Arc::new(StepLayer::new(layer.as_str(), steps)?);
            builder = match layer.as_str() {
                "a" | "b" => builder.decoupled(made),
                "base" => builder.coupled(made),
                other => {
                    return Err(Error::invalid_spec(
                        format!("spec.layers[{i}]"),
                        format!("{other:?} is not registered"),
                    ));
                }
            };
        }
        builder.build()
    })
}

fn context(api_client: kube::Client, cloud: &SimCloud) -> Arc<Context> {
    Arc::new(Context::new(api_client, registry(quick_sim(cloud), cloud)))
}

/// Reconciles the stored object once, as the controller would on a watch event.
async fn step(api: &FakeApi, name: &str, ctx: &Arc<Context>) -> Result<Action, ReconcileError> {
    let stored = api.get(NS, name).expect("object");
    let obj: MachineObject = serde_json::from_value(stored).unwrap();
    reconcile(Arc::new(obj), ctx.clone()).await
}

/// Reconciles until `done` holds of the stored object, at most 200 times.
async fn until(
    api: &FakeApi,
    name: &str,
    ctx: &Arc<Context>,
    done: impl Fn(Option<&Value>) -> bool,
) {
    for _ in 0..200 {
        if done(api.get(NS, name).as_ref()) {
            return;
        }
        if let Err(e) = step(api, name, ctx).await {
            assert!(
                matches!(e, ReconcileError::StillDeleting { .. }),
                "reconcile failed: {e}"
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{name} never got there: {:?}", api.get(NS, name));
}

fn phase(o: Option<&Value>) -> Option<String> {
    o?["status"]["machine"]["phase"].as_str().map(str::to_owned)
}

/// The condition of `type_` in the stored object's status.
fn condition(o: &Value, type_: &str) -> Value {
    o["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .cloned()
        .unwrap_or(Value::Null)
}

fn ready(o: Option<&Value>) -> bool {
    o.is_some_and(|o| condition(o, "Ready")["status"] == "True")
}

fn event_reasons(api: &FakeApi) -> Vec<String> {
    api.events(NS)
        .iter()
        .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn a_machine_object_goes_ready_is_not_rewritten_and_is_deprovisioned_behind_its_finalizer() {
    let api = FakeApi::default();
    let client = api.start().await;
    let cloud = SimCloud::new();
    let sim = quick_sim(&cloud);
    let ctx = Arc::new(Context::new(client, registry(sim.clone(), &cloud)));
    api.insert(object("web-1", &[], json!({ "labels": { "team": "a" } })));

    // The first reconcile only adds the finalizer, and names the provider with it.
    assert_eq!(
        step(&api, "web-1", &ctx).await.unwrap(),
        Action::await_change()
    );
    let stored = api.get(NS, "web-1").unwrap();
    assert_eq!(stored["metadata"]["finalizers"], json!([FINALIZER]));
    assert_eq!(
        stored["metadata"]["annotations"][PROVIDER_ANNOTATION],
        json!("sim")
    );

    until(&api, "web-1", &ctx, ready).await;
    let stored = api.get(NS, "web-1").unwrap();
    assert_eq!(phase(Some(&stored)).as_deref(), Some("Ready"));
    let provider_id = stored["status"]["machine"]["providerID"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(provider_id.starts_with("sim://"), "{stored}");
    assert_eq!(stored["status"]["observedGeneration"], json!(1));
    assert_eq!(stored["status"]["applied"]["provider"], json!("sim"));
    let machine = sim
        .find(&"web-1".parse().unwrap())
        .await
        .unwrap()
        .expect("the machine exists at the provider");
    assert_eq!(machine.provider_id.to_string(), provider_id);
    assert_eq!(machine.labels.get("team").map(String::as_str), Some("a"));

    // Unchanged and Ready: nothing is written, and the machine is looked at again later.
    let writes = api.writes.load(Ordering::SeqCst);
    for _ in 0..3 {
        let action = step(&api, "web-1", &ctx).await.unwrap();
        assert_eq!(action, Action::requeue(machine_kube::DEFAULT_RESYNC));
    }
    assert_eq!(
        api.writes.load(Ordering::SeqCst),
        writes,
        "an unchanged Ready machine was written"
    );

    // Deleting the object deletes the machine first, then lets the object go.
    api.delete(NS, "web-1");
    until(&api, "web-1", &ctx, |o| o.is_none()).await;
    let left = sim.find(&"web-1".parse().unwrap()).await.unwrap();
    assert!(
        left.as_ref().is_none_or(|m| m.phase == Phase::Deleted),
        "the machine outlived its object: {left:?}"
    );
    let reasons = event_reasons(&api);
    for wanted in ["Created", "Ready", "Deleting", "Deleted"] {
        assert!(
            reasons.iter().any(|r| r == wanted),
            "no {wanted} event: {reasons:?}"
        );
    }
}

#[tokio::test]
async fn conditions_have_the_kubernetes_shape_kubectl_wait_reads() {
    let api = FakeApi::default();
    let client = api.start().await;
    let cloud = SimCloud::new();
    let ctx = context(client, &cloud);
    api.insert(object("shape-1", &["a"], json!({})));
    until(&api, "shape-1", &ctx, ready).await;
    let stored = api.get(NS, "shape-1").unwrap();
    let time = regex_lite::Regex::new(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$").unwrap();
    let conditions = stored["status"]["conditions"].as_array().unwrap();
    let types: Vec<&str> = conditions
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    for wanted in [
        "Ready",
        "SpecApplied",
        "Synced",
        "InfrastructureReady",
        "Reachable",
        "LayerApplied.a",
    ] {
        assert!(types.contains(&wanted), "no {wanted}: {types:?}");
    }
    for c in conditions {
        // metav1.Condition: these five required, status a string, the time RFC 3339.
        for field in ["type", "status", "reason", "message", "lastTransitionTime"] {
            assert!(c[field].is_string(), "{field} of {c}");
        }
        assert!(
            ["True", "False", "Unknown"].contains(&c["status"].as_str().unwrap()),
            "{c}"
        );
        assert!(
            time.is_match(c["lastTransitionTime"].as_str().unwrap()),
            "{c}"
        );
        assert_eq!(c["observedGeneration"], json!(1), "{c}");
        let type_ok =
            regex_lite::Regex::new(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$").unwrap();
        assert!(type_ok.is_match(c["type"].as_str().unwrap()), "{c}");
    }
    assert_eq!(condition(&stored, "Ready")["reason"], "Ready");
    // The machine's own conditions are no longer kept in another shape beside them.
    assert!(
        stored["status"]["machine"]["conditions"].is_null(),
        "{stored}"
    );
}

#[tokio::test]
async fn a_spec_that_does_not_parse_is_reported_once_and_cleared_once_fixed() {
    let api = FakeApi::default();
    let client = api.start().await;
    let cloud = SimCloud::new();
    let ctx = context(client, &cloud);
    api.insert(object("bad-1", &[], json!({ "labels": { "team": 5 } })));
    let action = step(&api, "bad-1", &ctx).await.unwrap();
    assert_eq!(action, Action::await_change());
    let stored = api.get(NS, "bad-1").unwrap();
    let said = stored["status"]["specError"].as_str().unwrap_or_default();
    assert!(said.contains("spec.machine.labels"), "{stored}");
    assert_eq!(condition(&stored, "SpecApplied")["reason"], "InvalidSpec");
    assert_eq!(condition(&stored, "Ready")["reason"], "NoMachine");
    assert!(
        stored["metadata"]["finalizers"].is_null(),
        "a finalizer on an object whose spec cannot be used: {stored}"
    );
    assert_eq!(
        cloud.machine_count(),
        0,
        "a machine was made from a bad spec"
    );
    let writes = api.status_writes.load(Ordering::SeqCst);
    assert_eq!(
        step(&api, "bad-1", &ctx).await.unwrap(),
        Action::await_change()
    );
    assert_eq!(
        api.status_writes.load(Ordering::SeqCst),
        writes,
        "the same spec error was written again"
    );
    assert!(event_reasons(&api).contains(&"InvalidSpec".to_owned()));

    // Fixed: the error goes from the status (a merge patch keeps what it does not
    // mention, so it must be cleared by name), and the machine is made.
    api.patch_spec(
        NS,
        "bad-1",
        json!({ "machine": { "labels": { "team": "five" } } }),
    );
    until(&api, "bad-1", &ctx, ready).await;
    let stored = api.get(NS, "bad-1").unwrap();
    assert!(
        stored["status"].get("specError").is_none(),
        "the spec error outlived the fix: {stored}"
    );
    assert_eq!(condition(&stored, "SpecApplied")["status"], "True");
    assert_eq!(stored["status"]["observedGeneration"], json!(2));
    let writes = api.status_writes.load(Ordering::SeqCst);
    for _ in 0..3 {
        step(&api, "bad-1", &ctx).await.unwrap();
    }
    assert_eq!(
        api.status_writes.load(Ordering::SeqCst),
        writes,
        "an unchanged status was sent again"
    );
}

#[tokio::test]
async fn a_decoupled_layer_added_to_a_ready_machine_is_applied_in_place() {
    let api = FakeApi::default();
    let client = api.start().await;
    let cloud = SimCloud::new();
    let ctx = context(client, &cloud);
    api.insert(object("grow-1", &["a"], json!({})));
    until(&api, "grow-1", &ctx, ready).await;
    let id: ProviderId = serde_json::from_value(
        api.get(NS, "grow-1").unwrap()["status"]["machine"]["providerID"].clone(),
    )
    .unwrap();
    assert!(cloud.host(&id).unwrap().file_text("/etc/b").is_none());

    api.patch_spec(NS, "grow-1", json!({ "layers": ["a", "b"] }));
    // The first look after the change applies the layer (or is on its way): the
    // generation is observed only once it is in place.
    until(&api, "grow-1", &ctx, |o| {
        o.is_some_and(|o| o["status"]["observedGeneration"] == json!(2))
    })
    .await;
    let stored = api.get(NS, "grow-1").unwrap();
    assert_eq!(
        cloud.host(&id).unwrap().file_text("/etc/b").as_deref(),
        Some("here\n"),
        "the layer added to the spec is not on the machine, yet generation 2 is observed"
    );
    assert!(ready(Some(&stored)), "{stored}");
    assert_eq!(condition(&stored, "SpecApplied")["status"], "True");
    assert_eq!(stored["status"]["applied"]["layers"], json!(["a", "b"]));
    assert_eq!(
        stored["status"]["machine"]["providerID"],
        json!(id.to_string()),
        "a new machine was made"
    );
    assert_eq!(condition(&stored, "LayerApplied.b")["status"], "True");
}

#[tokio::test]
async fn a_change_a_machine_cannot_take_is_reported_not_applied() {
    let api = FakeApi::default();
    let client = api.start().await;
    let cloud = SimCloud::new();
    let ctx = context(client, &cloud);
    api.insert(object("fixed-1", &[], json!({ "labels": { "team": "a" } })));
    until(&api, "fixed-1", &ctx, ready).await;
    let before = api.get(NS, "fixed-1").unwrap();

    // A coupled layer went into the user data at creation: it needs a new machine.
    api.patch_spec(NS, "fixed-1", json!({ "layers": ["base"] }));
    step(&api, "fixed-1", &ctx).await.unwrap();
    let stored = api.get(NS, "fixed-1").unwrap();
    let applied = condition(&stored, "SpecApplied");
    assert_eq!(applied["status"], "False", "{stored}");
    assert_eq!(applied["reason"], "NeedsNewMachine");
    assert_eq!(applied["observedGeneration"], json!(2));
    assert!(
        applied["message"].as_str().unwrap().contains("coupled"),
        "{applied}"
    );
    // Reported, so observed; the machine is the one it was, and still Ready.
    assert_eq!(stored["status"]["observedGeneration"], json!(2));
    assert!(ready(Some(&stored)));
    assert_eq!(
        stored["status"]["machine"]["providerID"],
        before["status"]["machine"]["providerID"]
    );
    assert_eq!(stored["status"]["applied"]["generation"], json!(1));

    // So does a change of the machine's own spec, naming the field.
    api.patch_spec(
        NS,
        "fixed-1",
        json!({ "layers": [], "machine": { "labels": { "team": "b" } } }),
    );
    step(&api, "fixed-1", &ctx).await.unwrap();
    let stored = api.get(NS, "fixed-1").unwrap();
    let applied = condition(&stored, "SpecApplied");
    assert_eq!(applied["reason"], "NeedsNewMachine");
    assert!(
        applied["message"]
            .as_str()
            .unwrap()
            .contains("spec.machine.labels"),
        "{applied}"
    );
    assert!(event_reasons(&api).contains(&"NeedsNewMachine".to_owned()));

    // Back to what it was made from: applied again.
    api.patch_spec(
        NS,
        "fixed-1",
        json!({ "machine": { "labels": { "team": "a" } } }),
    );
    step(&api, "fixed-1", &ctx).await.unwrap();
    let stored = api.get(NS, "fixed-1").unwrap();
    assert_eq!(
        condition(&stored, "SpecApplied")["status"],
        "True",
        "{stored}"
    );
    assert_eq!(stored["status"]["observedGeneration"], json!(4));
}

#[tokio::test]
async fn objects_the_controller_cannot_clean_up_get_no_finalizer_and_delete_at_once() {
    let api = FakeApi::default();
    let (_, client) = api.start_listener().await;
    let cloud = SimCloud::new();
    let ctx = context(client.clone(), &cloud);

    // The CRD refuses a name that is a DNS subdomain but not a machine name.
    let machines: Api<MachineObject> = Api::namespaced(client, NS);
    let dotted: MachineObject = serde_json::from_value(object("web.1", &[], json!({}))).unwrap();
    let refused = machines
        .create(&PostParams::default(), &dotted)
        .await
        .expect_err("web.1 admitted");
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 422),
        "{refused}"
    );

    // An unknown provider: refused in the status, no finalizer, gone at delete.
    let mut nimbus = object("nimbus-1", &[], json!({}));
    nimbus["spec"]["provider"] = json!("nimbus");
    api.insert(nimbus);
    step(&api, "nimbus-1", &ctx).await.unwrap();
    let stored = api.get(NS, "nimbus-1").unwrap();
    assert!(stored["metadata"]["finalizers"].is_null(), "{stored}");
    assert!(
        stored["status"]["specError"]
            .as_str()
            .unwrap()
            .contains("spec.provider"),
        "{stored}"
    );
    api.delete(NS, "nimbus-1");
    assert!(api.get(NS, "nimbus-1").is_none(), "the object stayed");
}

#[tokio::test]
async fn a_finalizer_left_by_an_earlier_controller_on_a_name_no_machine_has_comes_off() {
    // An object from before the CRD narrowed names, with the finalizer an earlier
    // controller put on it: the stand-in admits it as an update of the CRD would have
    // left it (the name check is only at admission).
    let api = FakeApi::default();
    let client = api.start().await;
    let cloud = SimCloud::new();
    let ctx = context(client, &cloud);
    let mut legacy = object("web.1", &[], json!({}));
    legacy["metadata"]["finalizers"] = json!([FINALIZER]);
    api.insert_unadmitted(legacy);
    step(&api, "web.1", &ctx).await.unwrap();
    let said = api.get(NS, "web.1").unwrap()["status"]["specError"].clone();
    assert!(
        said.as_str().unwrap_or("").contains("metadata.name: "),
        "{said}"
    );
    assert!(
        !said.as_str().unwrap_or("").contains("metadata.name.name"),
        "{said}"
    );
    api.delete(NS, "web.1");
    until(&api, "web.1", &ctx, |o| o.is_none()).await;
    assert_eq!(cloud.machine_count(), 0);
}

#[tokio::test]
async fn a_cleanup_that_cannot_go_on_says_why_in_the_status() {
    let api = FakeApi::default();
    let client = api.start().await;
    let cloud = SimCloud::new();
    let ctx = context(client.clone(), &cloud);
    api.insert(object("orphan-1", &[], json!({})));
    until(&api, "orphan-1", &ctx, ready).await;

    // The controller restarts without the provider that made the machine.
    let forgetful = Arc::new(Context::new(
        client,
        Registry::new(|name, _| {
            Err(Error::invalid_spec(
                "spec.provider",
                format!("{name:?} is not registered"),
            ))
        }),
    ));
    api.delete(NS, "orphan-1");
    let action = step(&api, "orphan-1", &forgetful).await.unwrap();
    assert_eq!(action, Action::requeue(machine_kube::DEFAULT_RESYNC));
    let stored = api.get(NS, "orphan-1").expect("the machine still stands");
    let synced = condition(&stored, "Synced");
    assert_eq!(synced["status"], "False", "{stored}");
    assert_eq!(synced["reason"], "CleanupBlocked");
    let message = synced["message"].as_str().unwrap();
    assert!(
        message.contains("\"sim\"") && message.contains(FINALIZER),
        "{message}"
    );
    assert_eq!(condition(&stored, "Ready")["reason"], "Deleting");
    assert_eq!(cloud.machine_count(), 1);
    assert!(event_reasons(&api).contains(&"CleanupBlocked".to_owned()));

    // With the provider back, the deletion finishes.
    until(&api, "orphan-1", &ctx, |o| o.is_none()).await;
}

#[tokio::test]
async fn a_throttled_provider_requeues_after_its_retry_after_and_says_so_in_the_status() {
    let api = FakeApi::default();
    let client = api.start().await;
    let cloud = SimCloud::new();
    let faults = FaultConfig::default()
        .with_throttle_rate(1.0)
        .with_retry_after(Some(Duration::from_secs(7)));
    let throttled = Arc::new(FaultInjecting::new(quick_sim(&cloud), faults).unwrap());
    let ctx = Arc::new(Context::new(client, registry(throttled, &cloud)));
    api.insert(object("slow-1", &[], json!({})));
    step(&api, "slow-1", &ctx).await.unwrap(); // the finalizer
    let stored: MachineObject = serde_json::from_value(api.get(NS, "slow-1").unwrap()).unwrap();
    let e = step(&api, "slow-1", &ctx).await.expect_err("throttled");
    assert!(matches!(e, ReconcileError::Machine(_)), "{e}");
    assert_eq!(
        error_policy(Arc::new(stored), &e, ctx.clone()),
        Action::requeue(Duration::from_secs(7))
    );
    let stored = api.get(NS, "slow-1").unwrap();
    let synced = condition(&stored, "Synced");
    assert_eq!(synced["status"], "False", "{stored}");
    assert_eq!(synced["reason"], "Throttled");
    let warning = api
        .events(NS)
        .into_iter()
        .find(|e| e["reason"] == "Throttled")
        .expect("no Throttled event");
    assert_eq!(warning["type"], "Warning");
    assert_eq!(warning["regarding"]["name"], "slow-1");
}

#[tokio::test]
async fn a_machine_ready_at_its_first_look_still_gets_its_ready_event() {
    let api = FakeApi::default();
    let client = api.start().await;
    let cloud = SimCloud::new();
    let instant = SimConfig::default()
        .with_boot_latency(Duration::ZERO)
        .with_boot_jitter(Duration::ZERO);
    let sim = Arc::new(SimProvider::new(cloud.clone(), instant).unwrap());
    let ctx = Arc::new(Context::new(client, registry(sim, &cloud)));
    api.insert(object("fast-1", &[], json!({})));
    step(&api, "fast-1", &ctx).await.unwrap(); // the finalizer
    step(&api, "fast-1", &ctx).await.unwrap();
    assert!(
        ready(api.get(NS, "fast-1").as_ref()),
        "not Ready in one step"
    );
    let reasons = event_reasons(&api);
    assert_eq!(reasons, ["Created", "Ready"], "{reasons:?}");
}

/// Machine names are per provider, not per namespace: an object of the same name in
/// another namespace neither adopts the first object's machine nor deletes it.
#[tokio::test]
async fn a_same_named_object_in_another_namespace_neither_adopts_nor_deletes_the_machine() {
    let api = FakeApi::default();
    let client = api.start().await;
    let cloud = SimCloud::new();
    let ctx = context(client, &cloud);
    api.insert(object("web-1", &[], json!({})));
    until(&api, "web-1", &ctx, |o| {
        o.and_then(|o| o["status"]["machine"]["phase"].as_str()) == Some("Ready")
    })
    .await;
    let first = api.get(NS, "web-1").unwrap()["status"]["machine"]["providerID"].clone();

    let mut twin = object("web-1", &[], json!({}));
    twin["metadata"]["namespace"] = json!("other");
    api.insert(twin);
    let twin_step = |api: &FakeApi| {
        let obj: MachineObject =
            serde_json::from_value(api.get("other", "web-1").unwrap()).unwrap();
        reconcile(Arc::new(obj), ctx.clone())
    };
    // The first steps put the finalizer on; then the machine is looked for.
    for _ in 0..5 {
        let _ = twin_step(&api).await;
        if !api.get("other", "web-1").unwrap()["status"]["specError"].is_null() {
            break;
        }
    }
    let said = api.get("other", "web-1").unwrap()["status"].clone();
    assert!(
        said["specError"]
            .as_str()
            .unwrap_or("")
            .contains("not this object's"),
        "{said}"
    );
    assert!(
        said["machine"].is_null(),
        "the twin adopted the machine: {said}"
    );
    assert_eq!(cloud.machine_count(), 1);

    api.delete("other", "web-1");
    for _ in 0..20 {
        if api.get("other", "web-1").is_none() {
            break;
        }
        let _ = twin_step(&api).await;
    }
    assert!(
        api.get("other", "web-1").is_none(),
        "the twin's deletion did not finish"
    );
    let still = api.get(NS, "web-1").unwrap()["status"]["machine"]["providerID"].clone();
    assert_eq!(still, first);
    let m = SimProvider::new(cloud.clone(), SimConfig::default())
        .unwrap()
        .get(&machine_core::ProviderId::new(first.as_str().unwrap()).unwrap())
        .await
        .unwrap();
    assert!(
        !m.phase.is_deleting(),
        "the twin's deletion deleted the machine"
    );
}
