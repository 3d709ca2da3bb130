//! What a provider can do, stated honestly so the composer can check before it calls.

use serde::{Deserialize, Serialize};

use crate::user_data::UserDataFormat;

/// What a provider can do. The composer reads it before any API call: user data that
/// cannot fit is refused up front, not rejected by the provider later.
///
/// New capabilities are added in minor releases, so the struct is `#[non_exhaustive]`:
/// build it from [`Capabilities::default`] (nothing supported) and the `with_*` methods,
/// and a capability added later defaults to "not supported" in your provider.
///
/// ```
/// use machine_core::{Capabilities, PowerOperations, SizeBasis, UserDataDelivery, UserDataFormat};
///
/// let caps = Capabilities::default()
///     .with_user_data(
///         UserDataDelivery::new(16 * 1024, SizeBasis::Raw, vec![UserDataFormat::CloudConfig])
///             .with_gzip(true),
///     )
///     .with_power(PowerOperations::all())
///     .with_console_output(true);
/// assert!(caps.power.stop && !caps.host_key_discovery);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Capabilities {
    /// How the provider delivers user data at creation; `None` when it cannot, in which
    /// case only decoupled software can be applied.
    pub user_data: Option<UserDataDelivery>,
    /// Power operations the provider supports.
    pub power: PowerOperations,
    /// Whether the provider can return the machine's console output.
    pub console_output: bool,
    /// Whether the provider can report the machine's SSH host keys
    /// (into [`crate::Access::host_keys`]).
    pub host_key_discovery: bool,
    /// Whether [`crate::MachineProvisioner::bootstrap_finished`] withdraws the machine's
    /// user data, so that its secrets can no longer be read at the provider: afterwards
    /// [`crate::MachineProvisioner::user_data`] reads `None` (vSphere empties
    /// `guestinfo.userdata`; a Redfish pool takes its seed image off the network).
    pub withdraws_user_data: bool,
}

impl Capabilities {
    /// Sets how user data is delivered at creation.
    pub fn with_user_data(mut self, delivery: UserDataDelivery) -> Self {
        self.user_data = Some(delivery);
        self
    }

    /// Sets the supported power operations.
    pub fn with_power(mut self, power: PowerOperations) -> Self {
        self.power = power;
        self
    }

    /// Sets whether console output can be read.
    pub fn with_console_output(mut self, yes: bool) -> Self {
        self.console_output = yes;
        self
    }

    /// Sets whether SSH host keys are reported.
    pub fn with_host_key_discovery(mut self, yes: bool) -> Self {
        self.host_key_discovery = yes;
        self
    }

    /// Sets whether user data is withdrawn once the bootstrap finished.
    pub fn with_withdrawn_user_data(mut self, yes: bool) -> Self {
        self.withdraws_user_data = yes;
        self
    }
}

/// How user data reaches a machine at creation. `#[non_exhaustive]`: build it with
/// [`UserDataDelivery::new`] and the `with_*` methods.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct UserDataDelivery {
    /// The largest user data accepted, in bytes, measured as [`UserDataDelivery::size_basis`] says.
    pub max_bytes: usize,
    /// Which bytes the limit counts.
    pub size_basis: SizeBasis,
    /// Whether gzip-compressed user data is accepted (cloud-init unpacks it).
    pub gzip: bool,
    /// The formats the provider and its images accept.
    pub formats: Vec<UserDataFormat>,
}

impl UserDataDelivery {
    /// Up to `max_bytes` (counted as `size_basis` says) of the given `formats`, not
    /// gzip-compressed.
    pub fn new(max_bytes: usize, size_basis: SizeBasis, formats: Vec<UserDataFormat>) -> Self {
        UserDataDelivery {
            max_bytes,
            size_basis,
            gzip: false,
            formats,
        }
    }

    /// Sets whether gzip-compressed user data is accepted.
    pub fn with_gzip(mut self, yes: bool) -> Self {
        self.gzip = yes;
        self
    }
}

/// Which bytes a user-data limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum SizeBasis {
    /// The bytes as given, before any transfer encoding (EC2's 16 KiB limit).
    Raw,
    /// The base64 text sent on the wire (4/3 of the raw size, rounded up to 4).
    Base64,
}

impl SizeBasis {
    /// The size counted against the limit for `raw_len` bytes of user data.
    pub fn counted(self, raw_len: usize) -> usize {
        match self {
            SizeBasis::Raw => raw_len,
            SizeBasis::Base64 => raw_len.div_ceil(3) * 4,
        }
    }
}

/// Power operations a provider supports. `#[non_exhaustive]`: start from
/// [`PowerOperations::none`] (the default) or [`PowerOperations::all`] and adjust with
/// [`PowerOperations::with`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PowerOperations {
    /// Power on a stopped machine.
    pub start: bool,
    /// Power off a running machine.
    pub stop: bool,
    /// Restart a running machine.
    pub reboot: bool,
    /// Whether stop and reboot go through the guest operating system first (a clean
    /// shutdown or restart it is asked for, such as VMware Tools' ShutdownGuest and
    /// RebootGuest or an ACPI power button), and are forced (power off, reset) only when
    /// it has not happened within the provider's timeout. `false`: they are forced at
    /// once, and the guest may lose unwritten data.
    #[serde(default)]
    pub graceful: bool,
}

/// A power operation. `#[non_exhaustive]`: a provider matches the ones it supports and
/// refuses the rest with [`crate::unsupported_power_op`], so an operation added later is
/// refused, not misapplied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum PowerOp {
    /// Power on.
    Start,
    /// Power off.
    Stop,
    /// Restart.
    Reboot,
}

impl PowerOperations {
    /// No power operation.
    pub fn none() -> Self {
        PowerOperations::default()
    }

    /// Start, stop and reboot.
    pub fn all() -> Self {
        PowerOperations {
            start: true,
            stop: true,
            reboot: true,
            graceful: false,
        }
    }

    /// Sets whether stop and reboot ask the guest operating system first (see
    /// [`PowerOperations::graceful`]).
    pub fn with_graceful(mut self, yes: bool) -> Self {
        self.graceful = yes;
        self
    }

    /// Sets whether `op` is supported.
    pub fn with(mut self, op: PowerOp, supported: bool) -> Self {
        match op {
            PowerOp::Start => self.start = supported,
            PowerOp::Stop => self.stop = supported,
            PowerOp::Reboot => self.reboot = supported,
        }
        self
    }

    /// Whether `op` is supported.
    pub fn supports(&self, op: PowerOp) -> bool {
        match op {
            PowerOp::Start => self.start,
            PowerOp::Stop => self.stop,
            PowerOp::Reboot => self.reboot,
        }
    }
}
