//! # machine-core
//!
//! Machines apart from their software. A [`MachineProvisioner`] knows one infrastructure
//! (EC2, vSphere, a Redfish BMC, the in-memory [`sim`]) and nothing about what runs on
//! its machines; a [`Software`] layer knows what to put on a machine and nothing
//! about where it came from. A [`Composer`] chains them:
//!
//! - **coupled**: the software is rendered into user data and injected when the machine
//!   is created (cloud-init, a shell script);
//! - **decoupled**: the machine boots bare and the software is applied over a
//!   [`Transport`] (SSH) once it is reachable;
//! - **mixed**: some layers one way, some the other, on one machine.
//!
//! ```
//! use std::sync::Arc;
//! use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
//! use machine_core::steps::{Step, StepLayer};
//! use machine_core::{CancellationToken, Composer, MachineName, MachineSpec, Phase, SentinelFile};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> machine_core::Result<()> {
//! let cloud = SimCloud::new();
//! let provider = Arc::new(SimProvider::new(cloud.clone(), SimConfig::default())?);
//! let base = StepLayer::new("base", vec![Step::write_file("/etc/motd", "hello\n")])?;
//! let app = StepLayer::new("app", vec![Step::run("systemctl restart app")])?;
//! let composer = Composer::builder(provider)
//!     .coupled(Arc::new(base))   // in user data at creation
//!     .decoupled(Arc::new(app))  // over the transport after boot
//!     .completion(Arc::new(SentinelFile::default())) // app waits for the user data
//!     .connector(Arc::new(SimConnector::new(cloud.clone())))
//!     .build()?;
//! let spec = MachineSpec::new(MachineName::new("web-1")?);
//! let done = composer.provision(&spec, &CancellationToken::new()).await?;
//! assert_eq!(done.machine.phase, Phase::Ready);
//! let host = cloud.host(&done.machine.provider_id).unwrap();
//! assert_eq!(host.commands.last().unwrap(), "systemctl restart app");
//! # Ok(())
//! # }
//! ```
//!
//! Providers prove themselves with the [`conformance`] suite; [`decorators`] add
//! retries, rate limits and injected faults to any provider.

pub mod bootstrap_data;
mod capabilities;
mod composer;
pub mod conditions;
pub mod conformance;
pub mod decorators;
mod error;
mod files;
pub mod fleet;
mod locate;
mod machine;
mod name;
mod nodes;
mod observe;
mod provisioner;
pub mod retry;
pub mod revision;
#[cfg(feature = "schemars")]
mod schema;
pub mod sim;
mod software;
mod spec;
pub mod steps;
mod transport;
mod url;
pub mod user_data;

pub use capabilities::{Capabilities, PowerOp, PowerOperations, SizeBasis, UserDataDelivery};
pub use composer::{
    Action, BootstrapState, BootstrapStep, Bootstrapper, Composer, ComposerBuilder,
    ComposerSettings, Deadlines, FailurePolicy, FleetResult, Layer, MAX_DURATION,
    MAX_POLL_INTERVAL, Provisioned, Reconciled,
};
pub use error::{Error, ErrorKind, MAX_SHOWN_VALUE_CHARS, Result, Shown, shown, shown_key};
pub use files::{MAX_USER_FILE_BYTES, read_user_file};
pub use locate::{at_document_line, field_in_document};
pub use machine::{
    Access, Address, AddressKind, Condition, Failure, Labels, Machine, NodeRef, Phase, ProviderId,
    SshEndpoint,
};
pub use name::{MachineName, check_dns_label};
pub use nodes::link_nodes;
pub use observe::{EventSink, ProgressEvent, Timeline};
pub use provisioner::{DEFAULT_OWNER, MachineProvisioner, unsupported_power_op};
pub use retry::RetryPolicy;
pub use software::{
    CAPI_SENTINEL, Completion, CompletionCheck, CoupledSoftware, DecoupledSoftware, Mode,
    SentinelFile, Software,
};
pub use spec::{
    FleetSpec, MAX_DOCUMENT_BYTES, MAX_LABEL_VALUE_LEN, MAX_LABELS, MAX_SSH_PUBLIC_KEY_LEN,
    MAX_TIMEOUT, MAX_YAML_ALIAS_EVENTS, MAX_YAML_NODES, MachineSpec, SshAccess, check_duration,
    check_ssh_public_key, check_unique_names, from_json, from_json_redacting, from_yaml,
    from_yaml_redacting,
};
pub use transport::{
    Connector, DEFAULT_MAX_OUTPUT, ExecOutput, ExecRequest, FileUpload, MASK, MIN_MASKED_LEN,
    RemoteShell, Transport,
};
pub use url::{UrlSetting, redact_url};
pub use user_data::{ContentEncoding, UserData, UserDataFormat, UserDataPart};

/// Secrets: values that Debug, Display and tracing never show. Re-exported from
/// `secrecy` so every crate of the project uses the same type.
pub use secrecy::{ExposeSecret, SecretString};
/// Cancellation for [`Composer::provision`] and friends, re-exported from `tokio-util`.
pub use tokio_util::sync::CancellationToken;
