//! # bootstrap-cloudinit
//!
//! The coupled half of machine provisioning: software rendered into user data that
//! cloud-init (or Ignition) applies when the machine first boots.
//!
//! - [`CloudConfig`]: a typed cloud-config covering what bootstraps use, with an escape
//!   hatch for the rest; [`render`] writes a `#cloud-config` document no value can break,
//!   [`parse`] reads one back, refusing keys it does not model.
//! - [`CloudConfigLayer`]: one team's cloud-config plus scripts, a coupled
//!   [`machine_core::CoupledSoftware`]; [`Bootstrap`] combines layers merged or as a
//!   MIME multipart with cloud-init's merge headers, fits them to the provider's budget
//!   and reports sizes per layer.
//!
//! - [`to_ignition`]: Ignition v3 JSON from the same model where features map.
//! - [`HostKey`], [`CloudInitStatus`], [`PhoneHomeListener`]: pinned host keys and completion signals.
//! - [`Templates`]: Jinja templates with strict undefined and YAML-safe escaping.
//!
//! Every document the tests render is checked by the real `cloud-init schema`.

mod bootstrap;
mod check_view;
mod completion;
mod hostkeys;
mod ignition;
mod layer;
mod merge;
mod model;
mod phone_home;
mod render;
mod secret;
mod template;
mod validate;
mod yaml_fill;

pub use bootstrap::{Bootstrap, Built, Output, SizeReport};
pub use completion::{CloudInitState, CloudInitStatus, STATUS_COMMAND, parse_status};
pub use hostkeys::{DerivedHostKeys, HostKey};
pub use ignition::{IGNITION_VERSION, ignition_user_data, to_ignition};
pub use layer::{CloudConfigLayer, LayerPart};
pub use merge::{MERGE_TYPE, merge};
pub use model::{
    CaCerts, CloudConfig, Command, Content, MAX_DECODED_CONTENT, MODELED_KEYS, ManageEtcHosts, Ntp,
    PHONE_HOME_FIELDS, PhoneHome, PhoneHomePost, SshHostKeys, User, UserEntry, WriteFile,
};
pub use phone_home::{PhoneHomeCheck, PhoneHomeListener, PhoneHomeReport};
pub use render::{HEADER, parse, render};
pub use secret::Secret;
pub use template::{SecretVars, TEMPLATE_FUEL, Templates};
pub use validate::{SYSTEM_GROUPS, SYSTEM_USERS, validate_with};

/// The checks cloud-config validation runs on names and keys, for crates that render
/// cloud-config of their own (each an invalid-spec error naming `field`).
pub mod checks {
    pub use crate::validate::{account_name, host_label, public_key};
}
