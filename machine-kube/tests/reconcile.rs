//! The reconciler through kube's real client against a stand-in API server (see
//! `common`), with the simulator provider: create to Ready with a providerID; an
//! unchanged Ready machine is not written; deletion runs deprovision behind the
//! finalizer, then the finalizer goes; provider errors requeue after their retry-after;
//! a bad spec is reported once in the status and not retried.

mod common;

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use machine_core::decorators::{FaultConfig, FaultInjecting};
use machine_core::sim::{SimCloud, SimConfig, SimProvider};
use machine_core::{Composer, Error, MachineProvisioner, Phase};
use machine_kube::{
    Context, FINALIZER, MachineObject, ReconcileError, Registry, error_policy, reconcile,
};
use serde_json::{Value, json};

use common::FakeApi;

const NS: &str = "default";

fn object(name: &str, machine: Value) -> Value {
    json!({
        "apiVersion": "machine-provisioning.dev/v1alpha1",
        "kind": "Machine",
        "metadata": { "name": name, "namespace": NS },
        "spec": { "provider": "sim", "layers": [], "machine": machine }
    })
}

fn quick_sim(cloud: &SimCloud) -> Arc<SimProvider> {
    let config = SimConfig::default()
        .with_boot_latency(Duration::from_millis(20))
        .with_boot_jitter(Duration::ZERO)
        .with_delete_latency(Duration::from_millis(20));
    Arc::new(SimProvider::new(cloud.clone(), config).unwrap())
}

fn registry(provider: Arc<dyn MachineProvisioner>) -> Registry {
    Registry::new(move |name, layers| {
        if name != "sim" {
            return Err(Error::invalid_spec(
                "spec.provider",
                format!("{name:?} is not registered"),
            ));
        }
        if !layers.is_empty() {
            return Err(Error::invalid_spec("spec.layers", "none are registered"));
        }
        Composer::builder(provider.clone()).build()
    })
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

#[tokio::test]
async fn a_machine_object_goes_ready_is_not_rewritten_and_is_deprovisioned_behind_its_finalizer() {
    let api = FakeApi::default();
    let client = api.start().await;
    let cloud = SimCloud::new();
    let sim = quick_sim(&cloud);
    let ctx = Arc::new(Context::new(client, registry(sim.clone())));
    api.insert(object("web-1", json!({ "labels": { "team": "a" } })));

    // The first reconcile only adds the finalizer.
    assert_eq!(
        step(&api, "web-1", &ctx).await.unwrap(),
        Action::await_change()
    );
    let stored = api.get(NS, "web-1").unwrap();
    assert_eq!(stored["metadata"]["finalizers"], json!([FINALIZER]));

    until(&api, "web-1", &ctx, |o| {
        phase(o).as_deref() == Some("Ready")
    })
    .await;
    let stored = api.get(NS, "web-1").unwrap();
    let provider_id = stored["status"]["machine"]["providerID"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(provider_id.starts_with("sim://"), "{stored}");
    assert_eq!(stored["status"]["observedGeneration"], json!(1));
    let machine = sim
        .find(&"web-1".parse().unwrap())
        .await
        .unwrap()
        .expect("the machine exists at the provider");
    assert_eq!(machine.provider_id.to_string(), provider_id);
    assert_eq!(machine.labels.get("team").map(String::as_str), Some("a"));

    // Unchanged and Ready: nothing is written, and the machine is looked at again later.
    let writes = api.writes.load(std::sync::atomic::Ordering::SeqCst);
    for _ in 0..3 {
        let action = step(&api, "web-1", &ctx).await.unwrap();
        assert_eq!(action, Action::requeue(machine_kube::DEFAULT_RESYNC));
    }
    assert_eq!(
        api.writes.load(std::sync::atomic::Ordering::SeqCst),
        writes,
        "an unchanged Ready machine was written"
    );

    // Deleting the object deletes the machine first, then lets the object go.
    api.mark_deleted(NS, "web-1");
    until(&api, "web-1", &ctx, |o| o.is_none()).await;
    let left = sim.find(&"web-1".parse().unwrap()).await.unwrap();
    assert!(
        left.as_ref().is_none_or(|m| m.phase == Phase::Deleted),
        "the machine outlived its object: {left:?}"
    );
}

#[tokio::test]
async fn a_spec_that_does_not_parse_is_reported_once_and_not_retried() {
    let api = FakeApi::default();
    let client = api.start().await;
    let cloud = SimCloud::new();
    let ctx = Arc::new(Context::new(client, registry(quick_sim(&cloud))));
    api.insert(object("bad-1", json!({ "labels": { "team": 5 } })));
    step(&api, "bad-1", &ctx).await.unwrap(); // the finalizer
    let action = step(&api, "bad-1", &ctx).await.unwrap();
    assert_eq!(action, Action::await_change());
    let stored = api.get(NS, "bad-1").unwrap();
    let said = stored["status"]["specError"].as_str().unwrap_or_default();
    assert!(said.contains("spec.machine.labels"), "{stored}");
    assert_eq!(
        cloud.machine_count(),
        0,
        "a machine was made from a bad spec"
    );
    let writes = api.status_writes.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        step(&api, "bad-1", &ctx).await.unwrap(),
        Action::await_change()
    );
    assert_eq!(
        api.status_writes.load(std::sync::atomic::Ordering::SeqCst),
        writes,
        "the same spec error was written again"
    );

    // An unknown provider is a spec error too, naming the field.
    api.insert(json!({
        "apiVersion": "machine-provisioning.dev/v1alpha1",
        "kind": "Machine",
        "metadata": { "name": "bad-2", "namespace": NS },
        "spec": { "provider": "nimbus", "machine": {} }
    }));
    step(&api, "bad-2", &ctx).await.unwrap();
    step(&api, "bad-2", &ctx).await.unwrap();
    let said = api.get(NS, "bad-2").unwrap()["status"]["specError"].clone();
    assert!(
        said.as_str().unwrap_or_default().contains("spec.provider"),
        "{said}"
    );
}

#[tokio::test]
async fn a_throttled_provider_requeues_after_its_retry_after() {
    let api = FakeApi::default();
    let client = api.start().await;
    let cloud = SimCloud::new();
    let faults = FaultConfig::default()
        .with_throttle_rate(1.0)
        .with_retry_after(Some(Duration::from_secs(7)));
    let throttled = Arc::new(FaultInjecting::new(quick_sim(&cloud), faults).unwrap());
    let ctx = Arc::new(Context::new(client, registry(throttled)));
    api.insert(object("slow-1", json!({})));
    step(&api, "slow-1", &ctx).await.unwrap(); // the finalizer
    let stored: MachineObject = serde_json::from_value(api.get(NS, "slow-1").unwrap()).unwrap();
    let e = step(&api, "slow-1", &ctx).await.expect_err("throttled");
    assert!(matches!(e, ReconcileError::Machine(_)), "{e}");
    assert_eq!(
        error_policy(Arc::new(stored), &e, ctx.clone()),
        Action::requeue(Duration::from_secs(7))
    );
}
