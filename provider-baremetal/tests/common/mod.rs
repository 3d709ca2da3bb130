//! Test peers for provider-baremetal's Redfish half: a sushy-tools emulator per test.
// Each test binary uses a different part of this module.
#![allow(dead_code)]

pub mod sushy;

pub use sushy::Sushy;
