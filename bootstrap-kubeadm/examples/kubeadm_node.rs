//! Prints the cloud-config of a Kubernetes 1.31.4 worker node: the layer's coupled
//! output, ready to be a machine's user data.
//!
//! ```text
//! cargo run -p bootstrap-kubeadm --example kubeadm_node [apt-key-file]
//! ```
//!
//! With pkgs.k8s.io's apt `Release.key` (ASCII-armored) saved in a file, the node is of
//! the apt family; without, of the dnf family (whose repository names its key by URL).
//! The token and CA hash are kubeadm's documentation examples: the printed document
//! holds the token in clear, as user data must.

use bootstrap_kubeadm::KubeadmNode;
use machine_core::{ProviderId, SecretString};
use recipes::PackageFamily;

fn main() -> anyhow::Result<()> {
    let node = KubeadmNode::worker(
        "1.31.4",
        "10.0.0.10:6443",
        SecretString::from("abcdef.0123456789abcdef"),
        format!("sha256:{}", "0".repeat(64)),
    )
    .with_label("pool", "general")
    .with_taint("dedicated", Some("batch"), "NoSchedule");
    let node = match std::env::args().nth(1) {
        Some(path) => node.with_apt_key(std::fs::read_to_string(path)?),
        None => node.with_family(PackageFamily::Dnf),
    };
    let layer = node.layer("kubernetes")?;
    // A provider that names machines before creating them knows the provider ID;
    // otherwise see KubeadmLayer::coupled_from_instance_data.
    let coupled = layer.coupled(&ProviderId::new("redfish://bmc-1/Systems/1")?)?;
    print!("{}", coupled.render()?);
    Ok(())
}
