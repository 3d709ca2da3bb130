//! # provider-local
//!
//! Real Linux machines on this host, cheap enough to make by the dozen in a test: what
//! Cluster API's Docker provider is to Kubernetes, for this library. Each machine is
//!
//! - its own **network namespace** with one address on a bridge the provider owns (a
//!   private subnet that exists only on this host);
//! - its own **mount, PID, UTS and IPC namespaces**, chrooted into an **overlay** over a
//!   cached Debian 12 root (cloud-init, openssh-server, sudo, python3; built once by
//!   `scripts/peers/40-local-root.sh`), so every machine starts from the same image and
//!   its changes stay in its own directory;
//! - booted by **real cloud-init** from a NoCloud seed holding its user data and
//!   meta-data (instance-id, local-hostname): `init --local`, `init`, `modules:config`,
//!   `modules:final`, in order; then **sshd** listens on its address with host keys the
//!   machine generated, which the provider reports in `access.hostKeys` so the SSH
//!   transport pins them.
//!
//! Phases come from what the machine is doing: cloud-init still running is
//! `Provisioning`, finished is `Provisioned`, finished with errors is `Failed` with
//! cloud-init's own message. Console output is cloud-init's output log. State lives with
//! the machine, in `<runDir>/<owner>/<name>/state.json`, so a new provider instance adopts
//! what an old one made. Delete kills every process of the machine by PID, removes its
//! namespace and its directory; nothing was ever mounted outside the machine's own
//! mount namespace.
//!
//! Crash safety: create, delete and power hold the machine's lock (an `flock`, which the
//! kernel drops when its holder dies) and go in steps, each idempotent, each recorded
//! before the next: files, then the record, then the boot; a delete marks the record,
//! removes the machine from the host, then its directory with the record last. A
//! controller killed between any two steps leaves a state the next create (or delete)
//! of the name, from any process, finishes: a recorded machine with no recorded boot is
//! booted by whoever adopts it, after halting anything an unrecorded boot left running.
//!
//! Needs root. The engine sits behind the small [`Engine`] seam; [`NamespaceEngine`] is
//! the only implementation (systemd-nspawn and podman do not run on this kind of host).
//!
//! ```no_run
//! use std::sync::Arc;
//! use machine_core::{MachineName, MachineProvisioner, MachineSpec};
//! use provider_local::{LocalConfig, LocalProvider};
//!
//! # async fn demo() -> machine_core::Result<()> {
//! let config = LocalConfig::from_yaml("owner: team-a\nbridge: mplab\nsubnet: 10.213.9.0/24\n")?;
//! let provider = Arc::new(LocalProvider::new(config)?);
//! let m = provider.create(&MachineSpec::new(MachineName::new("web-1")?), None).await?;
//! println!("{} is at {:?}", m.name, m.access.ssh);
//! # Ok(())
//! # }
//! ```

mod config;
mod engine;
mod errors;
mod netns;
mod provider;
mod state;
mod status;

pub use config::{
    DEFAULT_BRIDGE, DEFAULT_RUN_DIR, DEFAULT_SUBNET, LocalConfig, MAX_BRIDGE_LEN, Subnet,
    default_root,
};
pub use engine::{Engine, Network};
pub use netns::{BOOT_LOG, NamespaceEngine};
pub use provider::{LocalProvider, MAX_USER_DATA, SCHEME};
pub use state::{MachineRecord, ProcessRef};
