//! The condition types and reasons the composer sets on a [`crate::Machine`], as
//! constants, so controllers and dashboards match on names that cannot drift.

/// The provider reports the machine running. Reason: [`RUNNING`].
pub const INFRASTRUCTURE_READY: &str = "InfrastructureReady";
/// A transport reached the machine. Reasons: [`CONNECTED`], [`UNREACHABLE`],
/// [`CONNECTION_LOST`].
pub const REACHABLE: &str = "Reachable";
/// The coupled software (user data) finished. Reasons: [`COMPLETE`], [`WAITING`],
/// [`FAILED`].
pub const BOOTSTRAP_COMPLETE: &str = "BootstrapComplete";
/// The prefix of one decoupled layer's condition: `LayerApplied/<layer name>`.
/// Reasons: [`APPLIED`], [`APPLY_FAILED`].
pub const LAYER_APPLIED_PREFIX: &str = "LayerApplied/";

/// Set by a provider: more than one live resource (instance, VM) carries the machine's
/// name, made by a race or from outside; deleting the machine deletes them all.
/// Reasons: [`DUPLICATES_FOUND`] (status true), [`UNIQUE`] (false again).
pub const DUPLICATES: &str = "Duplicates";

/// Whether the machine was made from what its spec and coupled layers give now (its
/// stamped coupled revision, [`crate::revision`]). Reasons: [`CURRENT`] (true),
/// [`COUPLED_CHANGED`] (false: only a new machine can take the change). Not set on a
/// machine made without a revision.
pub const UP_TO_DATE: &str = "UpToDate";

/// The condition type of the decoupled layer named `layer`.
pub fn layer_applied(layer: &str) -> String {
    format!("{LAYER_APPLIED_PREFIX}{layer}")
}

/// Reason: the provider reports the machine running.
pub const RUNNING: &str = "Running";
/// Reason: the provider reports the machine stopped (powered off).
pub const STOPPED: &str = "Stopped";
/// Reason: a transport is connected.
pub const CONNECTED: &str = "Connected";
/// Reason: connecting failed with a retryable error.
pub const UNREACHABLE: &str = "Unreachable";
/// Reason: an established connection failed.
pub const CONNECTION_LOST: &str = "ConnectionLost";
/// Reason: the completion check says the coupled software finished.
pub const COMPLETE: &str = "Complete";
/// Reason: the coupled software is still running.
pub const WAITING: &str = "Waiting";
/// Reason: the coupled software failed.
pub const FAILED: &str = "Failed";
/// Reason: more than one live resource carries the name.
pub const DUPLICATES_FOUND: &str = "DuplicatesFound";
/// Reason: one live resource carries the name again.
pub const UNIQUE: &str = "Unique";
/// Reason: the machine's coupled revision is the spec's.
pub const CURRENT: &str = "Current";
/// Reason: the spec or a coupled layer changed since the machine was made.
pub const COUPLED_CHANGED: &str = "CoupledChanged";
/// Reason: the layer is applied.
pub const APPLIED: &str = "Applied";
/// Reason: applying the layer failed.
pub const APPLY_FAILED: &str = "ApplyFailed";

/// The [`crate::Failure::reason`] of a machine whose coupled software failed.
pub const BOOTSTRAP_FAILED: &str = "BootstrapFailed";
