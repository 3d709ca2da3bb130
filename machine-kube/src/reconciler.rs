//! The reconciler: one [`Composer::reconcile`] step per call, the status written only
//! when it changed, deletion behind a finalizer, errors deciding the requeue.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use machine_core::{ErrorKind, MachineName};

use crate::registry::Registry;
use crate::resource::{FINALIZER, MachineObject, MachineObjectStatus};

/// The field manager the controller writes status as.
pub const FIELD_MANAGER: &str = "machine-kube";

/// How often a Ready machine is looked at again without any change of its object, so
/// that a machine deleted or broken behind the controller's back is noticed.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(300);

/// What every reconcile shares.
pub struct Context {
    client: Client,
    registry: Registry,
    resync: Duration,
}

impl Context {
    /// A context reconciling with `client` and the composers of `registry`, resyncing
    /// settled machines every [`DEFAULT_RESYNC`].
    pub fn new(client: Client, registry: Registry) -> Self {
        Context {
            client,
            registry,
            resync: DEFAULT_RESYNC,
        }
    }

    /// Sets how often a settled (Ready or Failed) machine is looked at again.
    pub fn with_resync(mut self, resync: Duration) -> Self {
        self.resync = resync;
        self
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("registry", &self.registry)
            .field("resync", &self.resync)
            .finish_non_exhaustive()
    }
}

/// Why a reconcile did not finish; [`error_policy`] turns it into a requeue.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The composer or provider failed; its kind decides the requeue.
    #[error(transparent)]
    Machine(#[from] machine_core::Error),
    /// The Kubernetes API failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The machine is being deleted; the finalizer stays until it is gone.
    #[error("machine {name} is still being deleted")]
    StillDeleting {
        /// The machine.
        name: String,
        /// When to look again.
        after: Duration,
    },
    /// The finalizer machinery failed (adding or removing the finalizer).
    #[error("finalizer: {0}")]
    Finalizer(String),
}

/// Reconciles one object: adds the finalizer, then takes one composer step toward
/// Ready (or, once the object is being deleted, toward the machine being gone) and
/// writes the status if it changed.
pub async fn reconcile(
    obj: Arc<MachineObject>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let ns = obj.namespace().unwrap_or_default();
    let api: Api<MachineObject> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, FINALIZER, obj, |event| async {
        match event {
            Event::Apply(obj) => apply(&api, &obj, &ctx).await,
            Event::Cleanup(obj) => cleanup(&obj, &ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        kube::runtime::finalizer::Error::AddFinalizer(e)
        | kube::runtime::finalizer::Error::RemoveFinalizer(e) => ReconcileError::Kube(e),
        other => ReconcileError::Finalizer(other.to_string()),
    })
}

/// The requeue for a failed reconcile: the machine error's own policy
/// ([`machine_core::Action::for_error`]), the deletion's poll, or a short retry for the
/// API.
pub fn error_policy(_obj: Arc<MachineObject>, e: &ReconcileError, ctx: Arc<Context>) -> Action {
    let poll = Duration::from_secs(5).min(ctx.resync);
    match e {
        ReconcileError::Machine(e) => to_kube(machine_core::Action::for_error(e, poll), ctx.resync),
        ReconcileError::StillDeleting { after, .. } => Action::requeue(*after),
        ReconcileError::Kube(_) | ReconcileError::Finalizer(_) => Action::requeue(poll),
    }
}

/// Runs the controller for every `Machine` object `api` sees until the process is
/// signalled, logging each reconcile's outcome.
pub async fn run(api: Api<MachineObject>, ctx: Arc<Context>) {
    Controller::new(api, watcher::Config::default())
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|outcome| async move {
            match outcome {
                Ok((obj, action)) => tracing::debug!(object = %obj.name, ?action, "reconciled"),
                Err(e) => tracing::warn!(error = %e, "reconcile failed"),
            }
        })
        .await;
}

async fn apply(
    api: &Api<MachineObject>,
    obj: &MachineObject,
    ctx: &Context,
) -> Result<Action, ReconcileError> {
    let name = obj.name_any();
    let previous = obj.status.clone().unwrap_or_default();
    let prepared = obj.spec.machine_spec(&name).and_then(|spec| {
        Ok((
            spec,
            ctx.registry
                .composer(&obj.spec.provider, &obj.spec.layers)?,
        ))
    });
    let (spec, composer) = match prepared {
        Ok(ready) => ready,
        Err(e) if e.kind() == ErrorKind::InvalidSpec => {
            // Retrying cannot help: say why in the status and wait for the object to change.
            let status = MachineObjectStatus {
                observed_generation: obj.metadata.generation,
                machine: previous.machine.clone(),
                spec_error: Some(e.to_string()),
            };
            write_status(api, &name, &previous, &status).await?;
            return Ok(Action::await_change());
        }
        Err(e) => return Err(e.into()),
    };
    let step = composer.reconcile(&spec, previous.machine.as_ref()).await;
    let step = match step {
        Ok(step) => step,
        Err(e) if e.kind() == ErrorKind::InvalidSpec => {
            let status = MachineObjectStatus {
                spec_error: Some(e.to_string()),
                observed_generation: obj.metadata.generation,
                ..previous.clone()
            };
            write_status(api, &name, &previous, &status).await?;
            return Ok(Action::await_change());
        }
        Err(e) => return Err(e.into()),
    };
    let status = MachineObjectStatus {
        observed_generation: obj.metadata.generation,
        machine: step.machine,
        spec_error: None,
    };
    write_status(api, &name, &previous, &status).await?;
    Ok(to_kube(step.action, ctx.resync))
}

async fn cleanup(obj: &MachineObject, ctx: &Context) -> Result<Action, ReconcileError> {
    let name = MachineName::new(obj.name_any())?;
    let composer = ctx
        .registry
        .composer(&obj.spec.provider, &obj.spec.layers)?;
    let step = composer.reconcile_deletion(&name).await?;
    match (step.machine, step.action) {
        (None, _) => Ok(Action::await_change()),
        (Some(_), action) => Err(ReconcileError::StillDeleting {
            name: name.to_string(),
            after: action
                .requeue_after()
                .unwrap_or(composer.settings().poll_interval),
        }),
    }
}

/// Writes `status` unless it equals `previous`: an unchanged status written back would
/// change the object and trigger another reconcile, for ever.
async fn write_status(
    api: &Api<MachineObject>,
    name: &str,
    previous: &MachineObjectStatus,
    status: &MachineObjectStatus,
) -> Result<(), ReconcileError> {
    if previous == status {
        return Ok(());
    }
    let patch = serde_json::json!({ "status": status });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    api.patch_status(name, &params, &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// machine-core's action as kube-runtime's: a settled machine is looked at again after
/// `resync`, so a change behind the controller's back is noticed.
fn to_kube(action: machine_core::Action, resync: Duration) -> Action {
    Action::requeue(action.requeue_after().unwrap_or(resync))
}
