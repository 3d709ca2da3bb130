//! # provider-baremetal
//!
//! Machines no cloud API creates. This crate holds the **static hosts** provider:
//! hosts that exist already (bare metal racked by hand, VMs made by someone else, a
//! laptop), listed in an inventory. "Creating" a machine claims a free host; "deleting"
//! it releases the claim. Software reaches such machines the decoupled way, over SSH,
//! through the composer's decoupled layers.
//!
//! The claim is a small file written atomically on the host itself, so the host, not a
//! local file, is the source of truth: every controller with the same inventory and
//! owner sees the same machines, two controllers never claim one host, and a restarted
//! controller adopts what an earlier one claimed.
//!
//! ```no_run
//! use std::sync::Arc;
//! use bootstrap_ssh::{Auth, SshConfig, SshConnector};
//! use machine_core::steps::{Step, StepLayer};
//! use machine_core::{CancellationToken, Composer, MachineName, MachineSpec};
//! use provider_baremetal::{StaticHostsConfig, StaticHostsProvider};
//!
//! # async fn demo() -> machine_core::Result<()> {
//! let inventory = StaticHostsConfig::from_yaml(
//!     "owner: team-a\nhosts:\n  - {name: rack1-a, address: 10.0.0.5}\n",
//! )?;
//! // Host keys are verified against ~/.ssh/known_hosts unless the inventory pins them.
//! let ssh = Arc::new(SshConnector::new(SshConfig::new(vec![Auth::agent()])));
//! let provider = Arc::new(StaticHostsProvider::new(inventory, ssh.clone())?);
//! let composer = Composer::builder(provider)
//!     .decoupled(Arc::new(StepLayer::new("app", vec![Step::run("uptime")])?))
//!     .connector(ssh)
//!     .build()?;
//! let spec = MachineSpec::new(MachineName::new("web-1")?);
//! let done = composer.provision(&spec, &CancellationToken::new()).await?;
//! println!("{} is host {}", done.machine.name, done.machine.provider_id);
//! # Ok(())
//! # }
//! ```
//!
//! The [`redfish`] module holds the other half: servers behind Redfish BMCs, claimed
//! from a pool ([`RedfishPoolConfig`]), given a NoCloud seed by virtual media, powered
//! and booted through the BMC ([`RedfishProvider`]).

pub mod redfish;
pub mod static_hosts;

pub use redfish::{RedfishPoolConfig, RedfishProvider};
pub use static_hosts::{HostEntry, StaticHostSettings, StaticHostsConfig, StaticHostsProvider};
