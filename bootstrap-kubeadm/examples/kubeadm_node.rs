//! Prints the cloud-config of a Kubernetes 1.31.4 worker node: the layer's coupled
//! output, ready to be a machine's user data.
//!
//! ```text
//! cargo run -p bootstrap-kubeadm --example kubeadm_node KEY-FILE [dnf]
//! ```
//!
//! KEY-FILE holds pkgs.k8s.io's ASCII-armored signing key: the apt repository's
//! `Release.key`, or with `dnf` the dnf repository's `repodata/repomd.xml.key` (the
//! node is then of the dnf family). The layer fetches nothing itself.
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
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        anyhow::bail!("usage: kubeadm_node KEY-FILE [dnf]");
    };
    let key = std::fs::read_to_string(path)?;
    let node = match args.next().as_deref() {
        Some("dnf") => node.with_family(PackageFamily::Dnf).with_rpm_key(key),
        _ => node.with_apt_key(key),
    };
    let layer = node.layer("kubernetes")?;
    // A provider that names machines before creating them knows the provider ID;
    // otherwise see KubeadmLayer::coupled_from_instance_data.
    let coupled = layer.coupled(&ProviderId::new("redfish://bmc-1/Systems/1")?)?;
    print!("{}", coupled.render()?);
    Ok(())
}
