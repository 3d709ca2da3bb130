//! Bare-metal servers behind Redfish BMCs: a typed client for the few calls a
//! provisioner needs ([`RedfishClient`]) and the mapping of Redfish errors.

mod client;
mod errors;

pub use client::{
    BmcCredentials, Boot, HttpOptions, PowerState, RedfishClient, System, VirtualMedia,
};

/// The shared HTTP client for BMC clients made with `options`.
pub fn http_client(options: &HttpOptions) -> machine_core::Result<reqwest::Client> {
    client::http_client(options)
}
