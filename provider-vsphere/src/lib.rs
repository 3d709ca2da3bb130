//! # provider-vsphere
//!
//! vCenter virtual machines as machines: [`VsphereProvider`] implements
//! [`machine_core::MachineProvisioner`] over the SOAP vim25 API (what every vCenter
//! and vcsim speak), cloning a template by inventory path.
//!
//! ```no_run
//! use machine_core::{MachineName, MachineProvisioner, MachineSpec};
//! use provider_vsphere::{VsphereConfig, VsphereProvider};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> machine_core::Result<()> {
//! let config = VsphereConfig::from_env()      // VSPHERE_URL, VSPHERE_USERNAME, ...
//!     .owner("ci-cluster")
//!     .build()?;
//! let provider = VsphereProvider::new(config)?;
//! let spec = MachineSpec::new(MachineName::new("web-1")?)
//!     .with_image("DC0/vm/templates/ubuntu-24.04")
//!     .with_size("2x4096")
//!     .with_provider(serde_json::json!({"resourcePool": "DC0/host/cluster1/Resources"}));
//! let machine = provider.create(&spec, None).await?;
//! println!("{} is {}", machine.provider_id, machine.phase);
//! # Ok(())
//! # }
//! ```
//!
//! ## Rooms
//! [`config`] (how to reach vCenter, per-machine [`VmSettings`]), `client` (the SOAP
//! calls and the session), `xml` (a namespace-resolved reader), `errors` (faults to
//! [`machine_core::ErrorKind`]), [`guestinfo`] (user data as cloud-init's VMware
//! datasource reads it), [`vm`] (a VM as a machine, and its tags), [`provider`].
//!
//! ## Identity and idempotency
//! vCenter allows two VMs with one name (vcsim even in one folder), so names prove
//! nothing. Every VM is cloned with extraConfig keys for owner, name and labels (in
//! the clone spec itself, so no VM is ever untagged) and found by them. `create`
//! adopts the owner's VM of that name when there is one. Two creators that both clone
//! settle it after the clone: the oldest VM of the name (lowest managed object id) is
//! the machine; a creator whose clone is younger destroys it, still powered off, and
//! returns the oldest. Provider IDs are `vsphere://<bios-uuid>`. A VM is marked
//! started once first powered on: a create that stopped between clone and power-on
//! leaves a VM without the mark, which the next create finishes (hardware, power-on)
//! instead of cloning again; a machine stopped on purpose stays stopped.
//!
//! ## Hardware
//! CPU and memory (`size: <cpus>x<MiB>` or `provider.numCPUs` / `memoryMiB`), the
//! first disk's size (`provider.diskGiB`, grow only) and the first NIC's standard port
//! group (`provider.network`) are set in one reconfigure before power-on.
//!
//! ## TLS and the session
//! HTTP goes through `provider-http`: verified against the system roots by default, a
//! CA file, or a pinned SHA-256 certificate fingerprint; `insecure` only when asked.
//! The session cookie comes from Login; a call answered NotAuthenticated logs in again
//! once and is repeated.
//!
//! ## User data
//! `guestinfo.userdata` and `guestinfo.metadata` with their `.encoding`
//! (`gzip+base64`), up to [`USER_DATA_LIMIT`] bytes of base64.
//! It is emptied when the composer has seen the bootstrap end
//! ([`MachineProvisioner::bootstrap_finished`](machine_core::MachineProvisioner::bootstrap_finished)),
//! so its secrets do not stay readable to everyone who may read the VM's configuration.

pub mod config;
pub mod guestinfo;
pub mod provider;
pub mod vm;

mod client;
mod errors;
mod xml;

pub use config::{VmSettings, VsphereConfig, VsphereConfigBuilder};
pub use provider::{USER_DATA_LIMIT, VsphereProvider};
pub use provider_http::{CertFingerprint, TlsConfig};
