//! `machine-kube`: the library inside a [kube-rs](https://kube.rs) controller.
//!
//! A `Machine` custom resource ([`MachineObject`], CRD from [`crd`]) names a provider
//! and software layers registered with the controller ([`Registry`]) and carries
//! machine-core's machine spec. [`reconcile`] takes one
//! [`machine_core::Composer::reconcile`] step per call and:
//! - writes the status only when it changed, as a merge patch of the difference (fields
//!   gone are cleared) under the resourceVersion it read;
//! - reports in Kubernetes conditions ([`conditions`]): `Ready` (for
//!   `kubectl wait --for=condition=Ready`), `SpecApplied`, `Synced`, and the machine's
//!   own; and records Kubernetes Events for its decisions;
//! - applies a spec change to the running machine when it only adds decoupled layers,
//!   and otherwise says in `SpecApplied` why it needs a new machine; `observedGeneration`
//!   moves once a generation is applied or refused;
//! - puts its [`FINALIZER`] only on objects it can clean up, deletes the machine behind
//!   it before the object goes, and says in `Synced` why a cleanup cannot go on;
//! - lets the error's kind decide the requeue ([`error_policy`]).
//!
//! A settled machine is looked at again every [`DEFAULT_RESYNC`], so a machine deleted
//! behind the controller's back is noticed. Several replicas elect a leader through a
//! Lease ([`LeaderElection`]); only the leader reconciles.
//!
//! A `MachineSet` ([`MachineSetObject`], CRD from [`machine_set_crd`]) keeps
//! `replicas` machines of a template (a `Machine` spec and the labels of its objects).
//! [`reconcile_set`] takes one [`machine_core::fleet::FleetReconciler`] step per call:
//! scale, a rollout (a decoupled layer's change applied in place, anything coupled
//! replacing machines within `maxSurge`/`maxUnavailable`), remediation of unhealthy
//! machines within `maxUnhealthy`; an event per decision, the status (a Deployment's
//! counts, `observedRevision`, conditions) written only when it changed. Its scale
//! subresource serves `kubectl scale` and autoscalers. Each machine of a set is shown
//! as a `Machine` object of its name that the set controls (owner reference with
//! `controller` and `blockOwnerDeletion`): a view the set's controller writes from the
//! fleet's listing, which [`reconcile`] leaves alone. Deleting a set scales it to zero
//! behind its finalizer first. [`run_all`] runs both controllers under one election.
//!
//! ```no_run
//! use std::sync::Arc;
//! use kube::{Api, Client};
//! use machine_core::Composer;
//! use machine_core::sim::{SimCloud, SimConfig, SimProvider};
//! use machine_kube::{Context, MachineObject, Registry};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let sim = Arc::new(SimProvider::new(SimCloud::new(), SimConfig::default())?);
//! let registry = Registry::new(move |provider, layers| {
//!     if provider != "sim" {
//!         return Err(machine_core::Error::invalid_spec("spec.provider", "only sim is registered"));
//!     }
//!     if !layers.is_empty() {
//!         return Err(machine_core::Error::invalid_spec("spec.layers", "no layers are registered"));
//!     }
//!     Composer::builder(sim.clone()).build()
//! });
//! let client = Client::try_default().await?;
//! let ctx = Arc::new(Context::new(client.clone(), registry));
//! machine_kube::run(Api::<MachineObject>::all(client), ctx).await;
//! # Ok(())
//! # }
//! ```

pub mod conditions;
mod leader;
mod reconciler;
mod registry;
mod resource;
mod set_reconciler;
mod set_resource;

pub use conditions::{Condition, ConditionStatus};
pub use leader::LeaderElection;
pub use reconciler::{
    Context, DEFAULT_RESYNC, FIELD_MANAGER, ReconcileError, error_policy, reconcile, run, run_all,
    run_all_until, run_until,
};
pub use registry::{ComposerFactory, Registry};
pub use resource::{
    AppliedSpec, FINALIZER, GROUP, MachineAccess, MachineObject, MachineObjectSpec,
    MachineObjectStatus, NAME_PATTERN, ObservedMachine, PROVIDER_ANNOTATION, crd,
};
pub use set_reconciler::{error_policy_set, reconcile_set};
pub use set_resource::{
    IntOrString, LabelSelector, LabelSelectorRequirement, MachineSetObject, MachineSetObjectSpec,
    MachineSetObjectStatus, MachineTemplate, SET_NAME_LABEL, SetDeletePolicy, SetHealthCheck,
    SetProbe, SetStrategy, TemplateMetadata, machine_set_crd,
};
