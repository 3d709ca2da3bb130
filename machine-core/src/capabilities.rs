//! What a provider can do, stated honestly so the composer can check before it calls.

use serde::{Deserialize, Serialize};

use crate::user_data::UserDataFormat;

/// What a provider can do. The composer reads it before any API call: user data that
/// cannot fit is refused up front, not rejected by the provider later.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
}

/// How user data reaches a machine at creation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// Which bytes a user-data limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

/// Power operations a provider supports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PowerOperations {
    /// Power on a stopped machine.
    pub start: bool,
    /// Power off a running machine.
    pub stop: bool,
    /// Restart a running machine.
    pub reboot: bool,
}

/// A power operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PowerOp {
    /// Power on.
    Start,
    /// Power off.
    Stop,
    /// Restart.
    Reboot,
}

impl PowerOperations {
    /// Whether `op` is supported.
    pub fn supports(&self, op: PowerOp) -> bool {
        match op {
            PowerOp::Start => self.start,
            PowerOp::Stop => self.stop,
            PowerOp::Reboot => self.reboot,
        }
    }
}
