//! Existing hosts as machines: an inventory ([`StaticHostsConfig`]), claims kept on the
//! hosts themselves, and [`StaticHostsProvider`].

mod claim;
mod config;
mod provider;

pub use config::{DEFAULT_CLAIM_DIR, DEFAULT_PROBE_TIMEOUT, HostEntry, StaticHostsConfig};
pub use provider::{SCHEME, StaticHostSettings, StaticHostsProvider};
