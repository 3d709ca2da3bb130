//! # bootstrap-ssh
//!
//! The decoupled path of machine-core: software applied over SSH to machines that are
//! already running. [`SshClient`] implements machine-core's [`machine_core::Transport`]
//! (exec with bounded output, atomic checksummed uploads, file reads) and
//! [`SshConnector`] its [`machine_core::Connector`], so every decoupled layer runs over
//! SSH unchanged; [`LayerRunner`] applies layers to fleets through machine-core's
//! [`machine_core::Bootstrapper`], the composer's own software steps.
//!
//! Safe by default: host keys are verified (pinned keys from the machine's access info,
//! or a known_hosts file); trust on first use and no verification at all are explicit
//! opt-ins. Connects are retried while the machine may still be booting (refused, reset,
//! timed out) and fail at once on a host-key mismatch or failed authentication.
//!
//! The SSH protocol is russh's (pure Rust, aws-lc-rs crypto), kept behind this crate's
//! own types.
//!
//! ```no_run
//! use std::sync::Arc;
//! use bootstrap_ssh::{Auth, HostKeyPolicy, LayerRunner, SshConfig, SshConnector};
//! use machine_core::steps::{Step, StepLayer};
//! # async fn run(machines: Vec<machine_core::Machine>) -> machine_core::Result<()> {
//! let config = SshConfig::new(vec![Auth::key_file("/root/.ssh/id_ed25519", None)?])
//!     .with_host_keys(HostKeyPolicy::Verify { known_hosts: None });
//! let layer = StepLayer::new("motd", vec![Step::write_file("/etc/motd", "managed\n")])?;
//! let runner = LayerRunner::new(Arc::new(SshConnector::new(config)))
//!     .layer(Arc::new(layer))
//!     .concurrency(20);
//! for report in runner.run(&machines).await {
//!     println!("{report}");
//! }
//! # Ok(())
//! # }
//! ```

mod auth;
mod client;
mod config;
mod connector;
mod errors;
mod exec;
mod hostkeys;
mod known_hosts;
pub mod os;
mod runner;
mod supervisor;
mod text;
mod upload;

pub use auth::Auth;
pub use client::SshClient;
pub use config::{JumpHost, SshConfig, SshTarget};
pub use connector::SshConnector;
pub use hostkeys::{HostKeyPin, HostKeyPolicy};
pub use runner::{HostReport, LayerRunner, wait_completion};

/// Generates a fresh ed25519 key pair, for tests and for pre-generating host keys to
/// pin: returns the private key in OpenSSH format and the public key line.
pub fn generate_ed25519() -> machine_core::Result<(machine_core::SecretString, String)> {
    let key = russh::keys::PrivateKey::random(
        &mut russh::keys::key::safe_rng(),
        russh::keys::Algorithm::Ed25519,
    )
    .map_err(|e| machine_core::Error::permanent(format!("generating a key: {e}")))?;
    let private = key
        .to_openssh(russh::keys::ssh_key::LineEnding::LF)
        .map_err(|e| machine_core::Error::permanent(format!("encoding a key: {e}")))?;
    let public = key
        .public_key()
        .to_openssh()
        .map_err(|e| machine_core::Error::permanent(format!("encoding a key: {e}")))?;
    Ok((
        machine_core::SecretString::from(private.to_string()),
        public,
    ))
}
