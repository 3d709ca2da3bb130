//! # bootstrap-store
//!
//! Bootstrap data stores for user data by reference (see
//! [`machine_core::bootstrap_data`]): where the composed user data waits for its
//! machine, so that the infrastructure holds only a stub.
//!
//! [`HttpsStore`] is for infrastructures with no secret store of their own (local
//! machines, vSphere, Redfish): an HTTPS server embedded in the controller, serving each
//! machine's document once, at an unguessable URL, under a self-signed certificate the
//! stub pins. The AWS Secrets Manager store lives in `provider-aws`, beside the SDK.
//!
//! ```no_run
//! use std::sync::Arc;
//! use bootstrap_store::{HttpsStore, HttpsStoreConfig, Network};
//! use machine_core::bootstrap_data::ByReference;
//!
//! # async fn f(composer: machine_core::ComposerBuilder) -> machine_core::Result<()> {
//! let config = HttpsStoreConfig::new("10.0.0.1:8443".parse().unwrap())
//!     .allow(Network::parse("10.0.0.0/24")?);
//! let store = Arc::new(HttpsStore::start(config).await?);
//! let composer = composer.by_reference(ByReference::new(store)).build()?;
//! # Ok(()) }
//! ```

mod https;
mod network;

pub use https::{DocumentState, HttpsStore, HttpsStoreConfig, Stats};
pub use network::Network;
