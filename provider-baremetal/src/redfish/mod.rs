//! Bare-metal servers behind Redfish BMCs: a typed client for the few calls a
//! provisioner needs ([`RedfishClient`]) and the mapping of Redfish errors.

mod client;
mod errors;
pub mod media_server;
pub mod seed_iso;

pub use client::{BmcCredentials, Boot, PowerState, RedfishClient, System, VirtualMedia};
