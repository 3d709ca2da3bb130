//! The infrastructure half: [`MachineProvisioner`] knows one infrastructure and nothing
//! about the software that will run on its machines.

use async_trait::async_trait;

use crate::capabilities::{Capabilities, PowerOp};
use crate::error::{Error, Result};
use crate::machine::{Labels, Machine, ProviderId};
use crate::name::MachineName;
use crate::spec::MachineSpec;
use crate::user_data::UserData;

/// The owner a provider uses when its configuration names none. Controllers sharing
/// an infrastructure should each set their own.
pub const DEFAULT_OWNER: &str = "machine-provisioning";

/// Creates, finds and deletes machines on one infrastructure.
///
/// The contract, which [`crate::conformance`] checks for any implementation:
/// - **Identity**: a machine is named by the caller. `create` with a name that already
///   exists returns the existing machine (adoption) and never makes a second one.
///   Implementations tag what they create with the name and an owner so that a new
///   process, after a crash, finds it again with [`MachineProvisioner::find`]. The
///   provider, not a local file, is the source of truth.
/// - **Non-blocking**: `create` and `delete` start the work and return; callers observe
///   progress with [`MachineProvisioner::get`]. No method waits for a machine to boot.
/// - **Idempotent delete**: deleting a machine that is gone succeeds.
/// - **Errors** carry an [`crate::ErrorKind`]; only transient and throttled ones are
///   worth retrying. Implementations do not retry on their own beyond what their wire
///   client does for a single request; retrying is [`crate::decorators::Retrying`]'s job.
/// - **A machine being deleted** still has its name: `find` returns it (phase
///   `Deleting`) and `create` of that name returns it too rather than make a second
///   one; the composer waits until it is gone and then creates anew. Once it is
///   `Deleted` (or not found), `find` and `list` no longer return it.
/// - **Owners**: every method sees only this instance's owner's machines. Another
///   owner's machine is not found by `get`, `find` or `list`, and `delete` of its ID
///   leaves it alone: it succeeds quietly or fails with a conflict error.
/// - **Access**: by the time a machine is reported running (phase `Provisioned` or
///   later), its [`crate::Access::ssh`] endpoint is filled in where the provider knows
///   one, and [`crate::Access::host_keys`] holds the host keys where
///   [`Capabilities::host_key_discovery`] says the provider can see them.
/// - **Specs**: `create` validates the spec itself ([`MachineSpec::validate`] and its own
///   provider settings) before any API call, since callers need not go through the
///   composer, and admits its user data with [`crate::user_data::admit`] against its
///   own [`Capabilities::user_data`].
/// - **Default owner**: a provider whose configuration names no owner uses
///   [`DEFAULT_OWNER`], so that providers of one infrastructure agree.
/// - **Failed means failed**: report `Failed` only for a machine that will not recover
///   (the backend says so). A momentary misread (a timeout, a half-written record) is a
///   retryable error instead: the composer gives up on the first `Failed`.
/// - **Ordering**: `list` returns machines in name order.
/// - **Power**: a machine that is powered off, or stopping, is [`crate::Phase::Stopped`]
///   (never `Provisioning`, never `Failed`); after a start it goes back through
///   `Provisioning` to running.
///
/// Implement it with `#[async_trait]` (re-exported by this crate's dependencies as the
/// `async_trait` crate), as the simulator in [`crate::sim`] does; read that first, it
/// is the smallest complete provider. [`crate::conformance`] turns this list into tests.
#[async_trait]
pub trait MachineProvisioner: Send + Sync + std::fmt::Display {
    /// What this provider can do; cheap, and constant for the provider's life.
    fn capabilities(&self) -> &Capabilities;

    /// Creates a machine for `spec` with `user_data`, or returns the existing machine
    /// of that name. The user data has already been checked against
    /// [`Capabilities::user_data`] by the caller; implementations check it again and refuse
    /// data over their limit before any API call.
    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine>;

    /// The machine with `id` as it is now; a not-found error when there is none.
    /// A machine that is gone may be reported in phase `Deleted` for a while.
    async fn get(&self, id: &ProviderId) -> Result<Machine>;

    /// The machine named `name` owned by this provider instance's owner, unless it is
    /// deleted. This is how a restarted process adopts what an earlier one made.
    async fn find(&self, name: &MachineName) -> Result<Option<Machine>>;

    /// Every machine of this owner whose labels include all of `selector`, deleted ones
    /// excluded, in name order.
    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>>;

    /// Starts deleting the machine with `id`. Succeeds when it is already gone.
    async fn delete(&self, id: &ProviderId) -> Result<()>;

    /// The user data the machine was created with, where the provider can show it
    /// (`Ok(None)` where it cannot).
    async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>>;

    /// Runs a power operation; a permanent error when [`Capabilities::power`] lacks it.
    /// [`PowerOp`] is `#[non_exhaustive]`: refuse the operations you do not map with
    /// [`unsupported_power_op`].
    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()>;

    /// The machine's console output, where [`Capabilities::console_output`] says so.
    async fn console_output(&self, id: &ProviderId) -> Result<Option<String>>;

    /// The composer saw `machine`'s software in place and is about to report it Ready:
    /// withdraw what only its bootstrap needed. vSphere empties `guestinfo.userdata`,
    /// whose secrets anyone who may read the VM's configuration could otherwise read;
    /// a Redfish pool takes its seed image off the network.
    ///
    /// Called only once the composer has observed the bootstrap end (a completion check
    /// passed, or the decoupled layers ran), never for a machine whose coupled layers it
    /// cannot see finish, since cloud-init may not have read its user data yet. It may be
    /// called again for the same machine (after a controller restart, or a retry), so it
    /// must be idempotent. An error keeps the machine from Ready and is retried by its
    /// kind. The default does nothing.
    async fn bootstrap_finished(&self, machine: &Machine) -> Result<()> {
        let _ = machine;
        Ok(())
    }
}

/// The error a provider returns for a power operation it does not support.
pub fn unsupported_power_op(provider: &dyn std::fmt::Display, op: PowerOp) -> Error {
    Error::permanent(format!(
        "{provider} does not support power operation {op:?}"
    ))
}

/// A shared provider is a provider, so `Arc<dyn MachineProvisioner>` can be wrapped by
/// decorators and handed to several composers.
#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: MachineProvisioner + ?Sized> MachineProvisioner for std::sync::Arc<P> {
    fn capabilities(&self) -> &Capabilities {
        (**self).capabilities()
    }

    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        (**self).create(spec, user_data).await
    }

    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        (**self).get(id).await
    }

    async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
        (**self).find(name).await
    }

    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
        (**self).list(selector).await
    }

    async fn delete(&self, id: &ProviderId) -> Result<()> {
        (**self).delete(id).await
    }

    async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>> {
        (**self).user_data(id).await
    }

    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        (**self).power(id, op).await
    }

    async fn console_output(&self, id: &ProviderId) -> Result<Option<String>> {
        (**self).console_output(id).await
    }

    async fn bootstrap_finished(&self, machine: &Machine) -> Result<()> {
        (**self).bootstrap_finished(machine).await
    }
}
