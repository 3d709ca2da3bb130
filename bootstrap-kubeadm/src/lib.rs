//! # bootstrap-kubeadm
//!
//! A Kubernetes node as one software layer. A [`KubeadmNode`] value says the version
//! (`1.31.4`), the role (first control plane, another control plane, worker), where
//! the cluster is and the secrets to join it, the node's labels and taints;
//! [`KubeadmNode::layer`] checks it all and gives a [`KubeadmLayer`] that:
//!
//! - installs containerd (systemd cgroups) and kubelet, kubeadm and kubectl pinned to
//!   the version from pkgs.k8s.io, for the apt or dnf family, with the `recipes` crate;
//! - writes a typed kubeadm configuration ([`config`]: `kubeadm.k8s.io/v1beta4` from
//!   1.31, `v1beta3` before) whose kubelet `provider-id` is the machine's provider ID,
//!   which is how a machine is later linked to its node (`machine_core::link_nodes`);
//! - runs `kubeadm init` or `kubeadm join` once: never again when the node has joined.
//!
//! The same value renders coupled ([`KubeadmLayer::coupled`], a cloud-config) or is
//! applied decoupled (its [`machine_core::DecoupledSoftware`] impl, over SSH).
//! Bad input is an invalid-spec error naming the field before anything runs; the
//! token and certificate key never appear in Debug output or errors.

pub mod config;

mod checks;
mod layer;
mod node;
mod version;

pub use layer::{KUBEADM_CONFIG, KUBELET_CONF, KubeadmLayer, YUM_REPO};
pub use node::{CRI_SOCKET, KubeadmNode, Role};
pub use version::{KubeVersion, KubeadmApi};
