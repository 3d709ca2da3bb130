//! Decorators that wrap any [`MachineProvisioner`](crate::MachineProvisioner) and are one
//! themselves, like object_store's `ThrottledStore`: retrying, rate limiting and fault
//! injection. They stack: `Retrying::new(RateLimited::new(provider, 10), policy)`.
//!
//! Each implementation denies `clippy::missing_trait_methods`, so a method added to the
//! trait can never be silently defaulted in a wrapper.

mod fault;
mod rate_limit;
mod retrying;

pub use fault::{FaultConfig, FaultInjecting};
pub use rate_limit::RateLimited;
pub use retrying::Retrying;
