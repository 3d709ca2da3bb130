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

/// The power-on grace of the tests' pools: more than sushy's longest reset delay (11 s),
/// so that a power-on sushy will apply is never asked again.
pub const GRACE: &str = "15s";

/// What a test pool looks like beyond its servers.
#[derive(Debug, Clone, Default)]
pub struct PoolShape<'a> {
    /// The BMC's endpoint when not sushy's own (a proxy in front of it).
    pub endpoint: Option<&'a str>,
    /// Size classes given to the servers in turn; none when empty.
    pub sizes: &'a [&'a str],
    /// The power-on grace; [`GRACE`] when `None`.
    pub grace: Option<&'a str>,
}

/// A pool YAML of every fake system of `sushy` (plain HTTP, so `insecure`), claims in
/// `claim_dir`, under `owner`; servers named `s0`, `s1`, ... labelled `idx: <i>`, each
/// at the address sushy gives its fake NIC.
pub fn pool_yaml(sushy: &Sushy, claim_dir: &Path, owner: &str) -> String {
    pool_yaml_shaped(sushy, claim_dir, owner, &PoolShape::default())
}

/// [`pool_yaml`] with the BMC reached at `endpoint` (a proxy in front of sushy).
pub fn pool_yaml_at(sushy: &Sushy, endpoint: &str, claim_dir: &Path, owner: &str) -> String {
    let shape = PoolShape {
        endpoint: Some(endpoint),
        ..PoolShape::default()
    };
    pool_yaml_shaped(sushy, claim_dir, owner, &shape)
}

/// [`pool_yaml`] shaped by `shape`.
pub fn pool_yaml_shaped(sushy: &Sushy, claim_dir: &Path, owner: &str, shape: &PoolShape) -> String {
    let mut y = format!(
        "owner: {owner}\nclaimDir: {}\npowerOnGrace: {}\nservers:\n",
        claim_dir.display(),
        shape.grace.unwrap_or(GRACE)
    );
    let endpoint = shape.endpoint.unwrap_or(&sushy.endpoint);
    for (i, s) in sushy.systems.iter().enumerate() {
        y.push_str(&format!(
            "  - name: s{i}\n    bmc: {endpoint}\n    systemId: {}\n    insecure: true\n    \
             credentials: {{username: admin, password: bmc-pw-{i}}}\n    labels: {{idx: \"{i}\"}}\n    \
             address: {}\n",
            s.id,
            sushy::fake_ip(i),
        ));
        if !shape.sizes.is_empty() {
            y.push_str(&format!(
                "    size: {}\n",
                shape.sizes[i % shape.sizes.len()]
            ));
        }
    }
    y
}

/// A provider over every fake system of `sushy`.
pub async fn provider(sushy: &Sushy, claim_dir: &Path, owner: &str) -> Arc<RedfishProvider> {
    provider_of(&pool_yaml(sushy, claim_dir, owner)).await
}

/// A provider over the pool `yaml`.
pub async fn provider_of(yaml: &str) -> Arc<RedfishProvider> {
    let config = RedfishPoolConfig::from_yaml(yaml).expect("test pool");
    Arc::new(
        RedfishProvider::new(config, &HttpSettings::default())
            .await
            .expect("provider"),
    )
}

/// A Redfish client straight to sushy, to look at what the provider did.
pub fn raw_client(sushy: &Sushy) -> provider_baremetal::redfish::RedfishClient {
    provider_baremetal::redfish::RedfishClient::new(
        provider_http::HttpClient::new(&HttpSettings::default()).unwrap(),
        sushy.endpoint.parse().unwrap(),
        provider_baremetal::redfish::BmcCredentials::new(
            "admin",
            machine_core::SecretString::from("pw"),
        ),
    )
}

/// The claim id a machine's provider ID carries (`redfish://<bmc>/<system>/<claim id>`).
pub fn claim_id_of(m: &machine_core::Machine) -> &str {
    let id = m.provider_id.as_str();
    let rest = id.strip_prefix("redfish://").expect("a redfish ID");
    let parts: Vec<&str> = rest.split('/').collect();
    assert_eq!(
        parts.len(),
        3,
        "{id} is not redfish://<bmc>/<system>/<claim id>"
    );
    parts[2]
}

/// The NoCloud seed the provider makes for machine `m` with `user_data`: its
/// instance-id is the name and the claim id, new for every claim.
pub fn seed_of(m: &machine_core::Machine, user_data: &[u8]) -> Vec<u8> {
    let meta = format!(
        "instance-id: {}-{}\nlocal-hostname: {}\n",
        m.name,
        claim_id_of(m),
        m.name
    );
    provider_baremetal::redfish::seed_iso::Seed {
        user_data,
        meta_data: meta.as_bytes(),
        network_config: None,
    }
    .to_iso()
    .unwrap()
}

/// Polls `id` on `p` until its phase is `want` (panicking on any other phase than
/// `passing`), within `within`.
pub async fn wait_phase(
    p: &dyn machine_core::MachineProvisioner,
    id: &machine_core::ProviderId,
    want: machine_core::Phase,
    passing: &[machine_core::Phase],
    within: std::time::Duration,
) -> machine_core::Machine {
    let deadline = std::time::Instant::now() + within;
    loop {
        let m = p.get(id).await.expect("get");
        if m.phase == want {
            return m;
        }
        assert!(
            passing.contains(&m.phase),
            "{id} is {} on its way to {want}: {:?}",
            m.phase,
            m.failure
        );
        assert!(
            std::time::Instant::now() < deadline,
            "{id} still {} after {within:?}, not {want}",
            m.phase
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}
