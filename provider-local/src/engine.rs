//! The seam between the provider and what actually runs machines. The provider keeps
//! names, addresses, state and phases; an [`Engine`] makes the network, boots,
//! halts and removes. [`crate::NamespaceEngine`] is the one engine here; a container
//! engine (Docker or podman, where they run) would be another.

use std::fmt;
use std::path::Path;

use machine_core::Result;

use crate::state::{MachineRecord, ProcessRef};

/// The bridge and subnet the machines of one provider share.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Network {
    /// The bridge's name.
    pub bridge: String,
    /// The bridge's own address.
    pub gateway: std::net::Ipv4Addr,
    /// The subnet's prefix length.
    pub prefix: u8,
}

impl Network {
    /// A network description.
    pub fn new(bridge: impl Into<String>, gateway: std::net::Ipv4Addr, prefix: u8) -> Self {
        Network {
            bridge: bridge.into(),
            gateway,
            prefix,
        }
    }
}

/// Runs machines. Every method is blocking (the provider calls them off the async
/// runtime) and idempotent: calling it again after a crash half-way finishes the job.
/// `dir` is the machine's own directory, which the engine may use as it likes beside
/// the provider's `state.json` and `user-data`.
pub trait Engine: Send + Sync + fmt::Debug {
    /// Checks that this host can run machines (privileges, tools, the root file
    /// system); the error says what is missing and how to get it.
    fn preflight(&self) -> Result<()>;

    /// Makes the network if it is not there.
    fn ensure_network(&self, network: &Network) -> Result<()>;

    /// Removes the network; machines still attached lose it.
    fn remove_network(&self, network: &Network) -> Result<()>;

    /// Writes a file into the machine's file system before it boots.
    fn write_file(&self, dir: &Path, path: &str, bytes: &[u8], mode: u32) -> Result<()>;

    /// Reads a file of the machine's file system; `Ok(None)` when it does not exist.
    fn read_file(&self, dir: &Path, path: &str) -> Result<Option<Vec<u8>>>;

    /// Attaches the machine to the network and boots it: cloud-init's stages, then
    /// sshd on the machine's address. Returns the process that holds the machine. The
    /// provider halts the machine first, so nothing of it runs when this is called.
    fn boot(&self, dir: &Path, record: &MachineRecord) -> Result<ProcessRef>;

    /// Whether the machine's boot process is alive.
    fn is_running(&self, record: &MachineRecord) -> bool;

    /// Stops every process of the machine and waits until they are gone; its file
    /// system and network attachment stay, so it can boot again.
    fn halt(&self, record: &MachineRecord) -> Result<()>;

    /// Halts the machine and removes its network attachment; the provider removes
    /// the directory afterwards.
    fn remove(&self, record: &MachineRecord) -> Result<()>;
}
