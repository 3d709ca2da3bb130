//! Decorators that wrap any [`MachineProvisioner`](crate::MachineProvisioner) and are one
//! themselves, like object_store's `ThrottledStore`: retrying, rate limiting and fault
//! injection. They stack:
//!
//! ```
//! # use std::num::NonZeroU32;
//! # use machine_core::decorators::{RateLimited, Retrying};
//! # use machine_core::sim::{SimCloud, SimConfig, SimProvider};
//! # use machine_core::RetryPolicy;
//! let provider = SimProvider::new(SimCloud::new(), SimConfig::default()).unwrap();
//! let limited = RateLimited::new(provider, NonZeroU32::new(10).unwrap());
//! let p = Retrying::new(limited, RetryPolicy::default());
//! assert_eq!(p.to_string(), "Retrying(RateLimited(sim(owner=machine-provisioning), 10/s))");
//! ```
//!
//! Each implementation denies `clippy::missing_trait_methods`, so a method added to the
//! trait can never be silently defaulted in a wrapper.

mod fault;
mod rate_limit;
mod retrying;

pub use fault::{FaultConfig, FaultInjecting};
pub use rate_limit::RateLimited;
pub use retrying::Retrying;
