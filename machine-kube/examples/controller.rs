//! A controller for `Machine` and `MachineSet` objects in the cluster of your
//! kubeconfig, with the built-in simulator as its provider (`sim`) and one layer
//! (`hello`, a file written by user data).
//!
//! ```text
//! cargo run -p machine-kube --example controller -- --crd | kubectl apply -f -
//! cargo run -p machine-kube --example controller
//! kubectl apply -f - <<'YAML'
//! apiVersion: machine-provisioning.dev/v1alpha1
//! kind: Machine
//! metadata: { name: web-1 }
//! spec: { provider: sim, layers: [hello], machine: { labels: { team: web } } }
//! YAML
//! kubectl get machines   # Ready True, Phase Ready, a sim:// providerID
//! kubectl wait --for=condition=Ready machine/web-1
//! kubectl apply -f - <<'YAML'
//! apiVersion: machine-provisioning.dev/v1alpha1
//! kind: MachineSet
//! metadata: { name: app }
//! spec:
//!   replicas: 3
//!   strategy: { maxSurge: 1, maxUnavailable: 0 }
//!   template: { spec: { provider: sim, layers: [hello], machine: { image: debian-12 } } }
//! YAML
//! kubectl get machinesets              # Desired 3, Ready 3, Updated 3, Available 3
//! kubectl get machines -l machine-provisioning.dev/set-name=app
//! kubectl scale machineset/app --replicas=5
//! kubectl wait --for=condition=Available machineset/app
//! ```
//!
//! With `--leader-election`, several copies of it (one per pod) elect a leader through
//! the Lease `machine-kube` in the namespace `POD_NAMESPACE` (default `default`), each
//! named by `POD_NAME` (default: the host name); only the leader reconciles.

use std::sync::Arc;

use kube::{Api, Client};
use machine_core::sim::{SimCloud, SimConfig, SimProvider};
use machine_core::steps::{Step, StepLayer};
use machine_core::{Composer, Error};
use machine_kube::{Context, LeaderElection, MachineObject, MachineSetObject, Registry};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::args().any(|a| a == "--crd") {
        print!("{}", serde_saphyr::to_string(&machine_kube::crd())?);
        println!("---");
        print!(
            "{}",
            serde_saphyr::to_string(&machine_kube::machine_set_crd())?
        );
        return Ok(());
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,machine_kube=debug".into()),
        )
        .init();
    let sim = Arc::new(SimProvider::new(SimCloud::new(), SimConfig::default())?);
    let hello = Arc::new(StepLayer::new(
        "hello",
        vec![Step::write_file("/etc/hello", "hello from machine-kube\n")],
    )?);
    let registry = Registry::new(move |provider, layers| {
        if provider != "sim" {
            return Err(Error::invalid_spec(
                "spec.provider",
                format!("{provider:?} is not registered (this example has: sim)"),
            ));
        }
        let mut builder = Composer::builder(sim.clone());
        for (i, layer) in layers.iter().enumerate() {
            match layer.as_str() {
                "hello" => builder = builder.coupled(hello.clone()),
                other => {
                    return Err(Error::invalid_spec(
                        format!("spec.layers[{i}]"),
                        format!("{other:?} is not registered (this example has: hello)"),
                    ));
                }
            }
        }
        builder.build()
    });
    let client = Client::try_default().await?;
    let mut ctx = Context::new(client.clone(), registry);
    if std::env::args().any(|a| a == "--leader-election") {
        let namespace = std::env::var("POD_NAMESPACE").unwrap_or_else(|_| "default".into());
        let identity = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| format!("machine-kube-{}", std::process::id()));
        ctx = ctx.with_leader_election(LeaderElection::new(namespace, "machine-kube", identity));
    }
    let ctx = Arc::new(ctx);
    println!("reconciling Machine and MachineSet objects in every namespace; Ctrl-C stops");
    machine_kube::run_all(
        Api::<MachineObject>::all(client.clone()),
        Api::<MachineSetObject>::all(client),
        ctx,
    )
    .await;
    Ok(())
}
