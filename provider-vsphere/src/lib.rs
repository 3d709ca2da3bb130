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
//! vCenter allows two VMs with one name in different folders (vcsim even in one
//! folder), so names prove nothing. Every VM is cloned with extraConfig keys for
//! owner, name and labels (in the clone spec itself, so no VM is ever untagged) and
//! found by them. `create` adopts the owner's VM of that name when the mirror of the
//! provider's folder (see `collector`: one property collector, kept current by pushed
//! updates) holds one, checked against the server first. Two creators that both clone,
//! or a creator whose mirror missed a VM made since, settle it after the clone: the
//! oldest VM of the name (lowest managed object id) is the machine; a creator whose
//! clone is younger destroys it, still powered off, and adopts the oldest (started if a
//! crashed create left it off). The mirror is as current as the clone's end, so it
//! holds every older VM of the name. A clone vCenter refuses as a `DuplicateName` (a
//! second VM of one name in a folder) adopts the owner's VM of that name. Provider IDs are
//! `vsphere://<bios-uuid>`, a random UUID set in the clone spec. A VM is marked
//! started once first powered on: a create that stopped between clone and power-on
//! leaves a VM without the mark, which the next create finishes (hardware, power-on)
//! instead of cloning again; a machine stopped on purpose stays stopped. A clone whose
//! hardware or first power-on is refused (no capacity, no permission) is destroyed, so
//! a refused create leaves no machine.
//!
//! Inventory paths (template, folder, pool, datastore, network) are looked up once per
//! provider and forgotten when a call naming them meets ManagedObjectNotFound.
//!
//! ## Phases and access
//! A powered-on VM is `Provisioned` once its guest has reported an address (VMware
//! Tools); before that it is `Provisioning`, since nothing could reach it. Its SSH
//! endpoint is that address, port 22, as the spec's `ssh.user` or `provider.sshUser`
//! (kept in extraConfig); without a user, no endpoint. [`machine_core::Machine::size`]
//! is the VM's hardware now, `<cpus>x<memory MiB>`.
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
//! It is removed when the composer has seen the bootstrap end
//! ([`MachineProvisioner::bootstrap_finished`](machine_core::MachineProvisioner::bootstrap_finished)),
//! so its secrets do not stay readable to everyone who may read the VM's configuration:
//! the keys are set to "" (vim25's removal), and the raw extraConfig is read back. A
//! server that kept the value beside the empty one (vcsim before 0.31 appends every
//! entry) makes that a permanent error, never showing the value. The capabilities say
//! so (`withdraws_user_data`); [`MachineProvisioner::user_data`](machine_core::MachineProvisioner::user_data)
//! reads `None` after.
//!
//! ## Faults
//! The `InsufficientResourcesFault` family (a host, pool or datastore that cannot hold
//! the VM) is [`machine_core::ErrorKind::InsufficientCapacity`]; `NoPermission`
//! unauthorized; `NotEnoughLicenses` the one quota vCenter has. vCenter's SOAP API has
//! no throttling answer; an HTTP 503 of its reverse proxy is transient.

pub mod config;
pub mod guestinfo;
pub mod provider;
pub mod vm;

mod client;
mod collector;
mod errors;
mod xml;

pub use config::{VmSettings, VsphereConfig, VsphereConfigBuilder};
pub use provider::{USER_DATA_LIMIT, VsphereProvider};
pub use provider_http::{CertFingerprint, TlsConfig};
