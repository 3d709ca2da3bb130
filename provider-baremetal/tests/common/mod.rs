//! Test peers for provider-baremetal's Redfish half: a sushy-tools emulator per test.
// Each test binary uses a different part of this module.
#![allow(dead_code)]

pub mod flaky;
pub mod sushy;

pub use sushy::Sushy;

use std::path::Path;
use std::sync::Arc;

use provider_baremetal::redfish::{RedfishPoolConfig, RedfishProvider};
use provider_http::HttpSettings;

/// A pool YAML of every fake system of `sushy` (plain HTTP, so `insecure`), claims in
/// `claim_dir`, under `owner`; servers named `s0`, `s1`, ... labelled `idx: <i>`.
pub fn pool_yaml(sushy: &Sushy, claim_dir: &Path, owner: &str) -> String {
    pool_yaml_at(sushy, &sushy.endpoint, claim_dir, owner)
}

/// [`pool_yaml`] with the BMC reached at `endpoint` (a proxy in front of sushy).
pub fn pool_yaml_at(sushy: &Sushy, endpoint: &str, claim_dir: &Path, owner: &str) -> String {
    let mut y = format!(
        "owner: {owner}\nclaimDir: {}\nservers:\n",
        claim_dir.display()
    );
    for (i, s) in sushy.systems.iter().enumerate() {
        y.push_str(&format!(
            "  - name: s{i}\n    bmc: {}\n    systemId: {}\n    insecure: true\n    \
             credentials: {{username: admin, password: bmc-pw-{i}}}\n    labels: {{idx: \"{i}\"}}\n",
            endpoint, s.id
        ));
    }
    y
}

/// A provider over every fake system of `sushy`.
pub async fn provider(sushy: &Sushy, claim_dir: &Path, owner: &str) -> Arc<RedfishProvider> {
    let config =
        RedfishPoolConfig::from_yaml(&pool_yaml(sushy, claim_dir, owner)).expect("test pool");
    Arc::new(
        RedfishProvider::new(config, &HttpSettings::default())
            .await
            .expect("provider"),
    )
}
