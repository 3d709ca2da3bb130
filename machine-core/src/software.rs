//! The software half: a [`Software`] layer knows what to put on a machine and
//! nothing about where the machine came from.

use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::machine::Machine;
use crate::spec::MachineSpec;
use crate::transport::Transport;
use crate::user_data::{CompletionWaiter, UserDataPart};

/// How a layer of software reaches a machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Mode {
    /// Rendered into user data and injected when the machine is created.
    Coupled,
    /// Applied over a [`Transport`] once the machine is running and reachable.
    Decoupled,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A layer of software: users, files, packages, an agent. This trait only names it; what
/// the layer can do is said by the role traits it implements:
///
/// - [`CoupledSoftware`]: it renders itself into user data, injected when the machine is
///   created;
/// - [`DecoupledSoftware`]: it applies itself over a [`Transport`] once the machine runs,
///   and can tell whether it already has been, so that a rerun after a crash skips it.
///
/// A layer that can do both implements both (as [`crate::steps::StepLayer`] does). The
/// composer takes each layer by role ([`crate::ComposerBuilder::coupled`],
/// [`crate::ComposerBuilder::decoupled`]), so a layer given a mode it lacks does not
/// compile.
pub trait Software: Send + Sync {
    /// A short name for logs, conditions and progress (a DNS label is a good choice).
    fn name(&self) -> &str;
}

/// A layer delivered in user data at creation ([`Mode::Coupled`]).
pub trait CoupledSoftware: Software {
    /// The user-data parts for the machine `spec`, in order. Called before the machine
    /// is created; must not do I/O.
    fn user_data_parts(&self, spec: &MachineSpec) -> Result<Vec<UserDataPart>>;

    /// SSH host public keys (OpenSSH format) this layer's user data puts on `spec`'s
    /// machine, such as pre-generated host keys. The composer adds them to the
    /// machine's [`crate::Access::host_keys`] before connecting, so the transport pins
    /// them and never trusts on first use. They must be the same on every call for the
    /// same spec, in any process (derive them, do not draw them at random per call).
    /// The default is none.
    fn host_keys(&self, spec: &MachineSpec) -> Result<Vec<String>> {
        let _ = spec;
        Ok(Vec::new())
    }
}

/// A layer applied over a [`Transport`] to a running machine ([`Mode::Decoupled`]).
#[async_trait]
pub trait DecoupledSoftware: Software {
    /// Whether the layer is already fully applied on `machine`.
    async fn is_applied(&self, machine: &Machine, transport: &dyn Transport) -> Result<bool>;

    /// Applies the layer. Must be safe to call again after a partial run.
    async fn apply(&self, machine: &Machine, transport: &dyn Transport) -> Result<()>;

    /// A digest of what this layer puts on `machine` (for instance
    /// [`crate::revision::digest`] of what it renders), the same in every process for
    /// the same content; `None` (the default) when the layer keeps no such record.
    ///
    /// With one, the composer records the digest on the machine after each apply
    /// ([`crate::revision::LAYER_DIGEST_DIR`]) and, next time, reads that one file
    /// instead of calling [`DecoupledSoftware::is_applied`]: the same digest is applied,
    /// another is a changed layer, applied again in place. A machine without a record
    /// (made before) is asked `is_applied`, and the record written when it says yes.
    fn digest(&self, machine: &Machine) -> Option<String> {
        let _ = machine;
        None
    }
}

/// The outcome of checking whether coupled software has finished on a machine.
///
/// `#[non_exhaustive]`: outcomes may be added in minor releases.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Completion {
    /// Still running (or not started).
    Pending,
    /// Finished successfully.
    Done,
    /// Finished with an error; the message is the machine's own account of it.
    Failed(String),
}

/// Tells when coupled software (user data) has finished on a running machine.
///
/// A check may add user-data parts of its own (a waiter that reports cloud-init's
/// verdict, see [`CompletionWaiter`]), which the composer appends after every layer's
/// parts.
#[async_trait]
pub trait CompletionCheck: Send + Sync {
    /// Parts to append to `spec`'s user data so that the machine signals completion
    /// (the spec lets a check name the machine, say in a callback URL).
    fn user_data_parts(&self, spec: &MachineSpec) -> Vec<UserDataPart>;

    /// Looks at the machine once; never waits.
    async fn check(&self, machine: &Machine, transport: &dyn Transport) -> Result<Completion>;
}

/// The sentinel file Cluster API's bootstrap providers write when bootstrap succeeded.
pub const CAPI_SENTINEL: &str = "/run/cluster-api/bootstrap-success.complete";

/// Completion by a sentinel file, written only when every part of every layer has
/// succeeded and finished.
///
/// Its user-data part is a [`CompletionWaiter`]: a script that starts a detached waiter
/// for cloud-init's own record of the boot ([`crate::user_data::VERDICT_RESULT_PATH`],
/// written after cloud-init's final stage, with the errors of every stage). With no
/// error the waiter writes `success` to the sentinel; otherwise it writes cloud-init's
/// error lines to the failure file beside it ([`SentinelFile::failure_path`], the
/// sentinel's path plus `.failed`). So the sentinel never appears after a failed script,
/// `runcmd` or module, nor before any part has run, whatever the layers are named.
///
/// [`CompletionCheck::check`] reads the failure file first (giving
/// [`Completion::Failed`] with cloud-init's lines), then the sentinel
/// ([`Completion::Done`]); neither is [`Completion::Pending`]. A layer must not write the
/// sentinel itself. Cluster API's bootstrap contract uses [`CAPI_SENTINEL`].
#[derive(Debug, Clone)]
pub struct SentinelFile {
    path: String,
}

impl SentinelFile {
    /// A check for the file at `path` (absolute).
    pub fn new(path: impl Into<String>) -> Self {
        SentinelFile { path: path.into() }
    }

    /// The file's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Where the waiter writes cloud-init's errors when a part failed.
    pub fn failure_path(&self) -> String {
        format!("{}.failed", self.path)
    }
}

impl Default for SentinelFile {
    fn default() -> Self {
        SentinelFile::new(CAPI_SENTINEL)
    }
}

/// The most of a failure file the check reads (cloud-init's error lines are short).
const MAX_FAILURE_BYTES: usize = 64 * 1024;

#[async_trait]
impl CompletionCheck for SentinelFile {
    fn user_data_parts(&self, _spec: &MachineSpec) -> Vec<UserDataPart> {
        vec![CompletionWaiter::files(self.path.clone(), self.failure_path()).part()]
    }

    async fn check(&self, _machine: &Machine, transport: &dyn Transport) -> Result<Completion> {
        if let Some(errors) = transport
            .read_file(&self.failure_path(), MAX_FAILURE_BYTES)
            .await?
        {
            let errors = String::from_utf8_lossy(&errors);
            let lines: Vec<&str> = errors.lines().filter(|l| !l.trim().is_empty()).collect();
            return Ok(Completion::Failed(format!(
                "cloud-init failed: {}",
                lines.join("; ")
            )));
        }
        Ok(match transport.read_file(&self.path, 4096).await? {
            Some(_) => Completion::Done,
            None => Completion::Pending,
        })
    }
}
