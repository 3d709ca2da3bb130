//! Bare-metal servers behind Redfish BMCs: a pool ([`RedfishPoolConfig`]), claims,
//! NoCloud seeds served to the BMCs, and [`RedfishProvider`]; underneath, a typed client
//! for the few calls a provisioner needs ([`RedfishClient`]).

mod client;
mod config;
mod errors;
pub mod media_server;
mod pool;
mod provider;
pub mod seed_iso;

pub use client::{BmcCredentials, Boot, PowerState, RedfishClient, System, VirtualMedia};
pub use config::{MAX_SERVER_LABELS, MediaServerConfig, RedfishPoolConfig, ServerEntry};
pub use provider::{RedfishProvider, RedfishSettings, SCHEME};
