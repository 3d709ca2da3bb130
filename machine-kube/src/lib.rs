//! `machine-kube`: the library inside a [kube-rs](https://kube.rs) controller.
//!
//! A `Machine` custom resource ([`MachineObject`]) names a provider and software
//! layers registered with the controller ([`Registry`]) and carries machine-core's
//! machine spec. [`reconcile`] takes one [`machine_core::Composer::reconcile`] step per
//! call, writes the status only when it changed (a write of an unchanged status would
//! retrigger the controller for ever), deletes the machine behind a [`FINALIZER`] before
//! the object goes, and lets the error's kind decide the requeue ([`error_policy`]).
//! A settled machine is looked at again every [`DEFAULT_RESYNC`], so a machine deleted
//! behind the controller's back is noticed.
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

pub use conditions::{Condition, ConditionStatus};
pub use leader::LeaderElection;
pub use reconciler::{
    Context, DEFAULT_RESYNC, FIELD_MANAGER, ReconcileError, error_policy, reconcile, run, run_until,
};
pub use registry::{ComposerFactory, Registry};
pub use resource::{
    AppliedSpec, FINALIZER, GROUP, MachineAccess, MachineObject, MachineObjectSpec,
    MachineObjectStatus, NAME_PATTERN, ObservedMachine, PROVIDER_ANNOTATION, crd,
};
