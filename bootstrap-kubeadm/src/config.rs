//! The kubeadm configuration documents, typed: what the layer writes to the machine and
//! what tests parse back. Only the fields the layer sets are modelled; kubeadm defaults
//! the rest.

use std::collections::BTreeMap;
use std::fmt;

use machine_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// A secret string inside a kubeadm document (a bootstrap token, a certificate key):
/// serialized as the plain value, since kubeadm needs it, but Debug never shows it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Hidden(pub String);

impl fmt::Debug for Hidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The kubelet's extra command-line arguments, in either API's shape: a map in v1beta3,
/// a list of `{name, value}` in v1beta4 (which allows repeating a flag).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ExtraArgs {
    /// v1beta4.
    List(Vec<Arg>),
    /// v1beta3.
    Map(BTreeMap<String, String>),
}

impl ExtraArgs {
    /// The arguments as `(name, value)` pairs, in document order.
    pub fn pairs(&self) -> Vec<(String, String)> {
        match self {
            ExtraArgs::List(l) => l
                .iter()
                .map(|a| (a.name.clone(), a.value.clone()))
                .collect(),
            ExtraArgs::Map(m) => m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        }
    }
}

/// One v1beta4 argument.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Arg {
    /// The flag without dashes (`provider-id`).
    pub name: String,
    /// Its value.
    pub value: String,
}

/// A node taint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Taint {
    /// The key (a qualified name).
    pub key: String,
    /// The value, may be empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// `nodeRegistration`, shared by init and join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRegistration {
    /// The CRI socket (containerd's).
    pub cri_socket: String,
    /// The kubelet's extra flags: `provider-id`, `node-labels` and the caller's.
    pub kubelet_extra_args: ExtraArgs,
    /// The node's taints; absent means kubeadm's default (the control-plane taint on
    /// control-plane nodes, none on workers), empty means none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taints: Option<Vec<Taint>>,
}

/// One bootstrap token an `InitConfiguration` creates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootstrapToken {
    /// `[a-z0-9]{6}.[a-z0-9]{16}`.
    pub token: Hidden,
    /// What the token may be used for.
    pub usages: Vec<String>,
    /// The groups it authenticates as.
    pub groups: Vec<String>,
}

/// `kind: InitConfiguration`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitConfiguration {
    /// `kubeadm.k8s.io/v1beta3` or `/v1beta4`.
    pub api_version: String,
    /// `InitConfiguration`.
    pub kind: String,
    /// The token joining nodes will use.
    pub bootstrap_tokens: Vec<BootstrapToken>,
    /// The node.
    pub node_registration: NodeRegistration,
    /// Encrypts the uploaded control-plane certificates (with `--upload-certs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_key: Option<Hidden>,
}

/// `kind: ClusterConfiguration`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterConfiguration {
    /// `kubeadm.k8s.io/v1beta3` or `/v1beta4`.
    pub api_version: String,
    /// `ClusterConfiguration`.
    pub kind: String,
    /// `v1.31.4`.
    pub kubernetes_version: String,
    /// The endpoint every node reaches the API servers at (`host:port`).
    pub control_plane_endpoint: String,
}

/// `discovery.bootstrapToken` of a join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapTokenDiscovery {
    /// `host:port` of the API server.
    pub api_server_endpoint: String,
    /// The bootstrap token.
    pub token: Hidden,
    /// Pins of the cluster CA's public key (`sha256:<hex>`).
    pub ca_cert_hashes: Vec<String>,
}

/// `discovery` of a join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Discovery {
    /// Token discovery, the only kind the layer uses.
    pub bootstrap_token: BootstrapTokenDiscovery,
}

/// `controlPlane` of a control-plane join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinControlPlane {
    /// Decrypts the certificates the first control plane uploaded.
    pub certificate_key: Hidden,
}

/// `kind: JoinConfiguration`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinConfiguration {
    /// `kubeadm.k8s.io/v1beta3` or `/v1beta4`.
    pub api_version: String,
    /// `JoinConfiguration`.
    pub kind: String,
    /// How to find and trust the cluster.
    pub discovery: Discovery,
    /// The node.
    pub node_registration: NodeRegistration,
    /// Present on a control-plane join.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<JoinControlPlane>,
}

/// The whole configuration file `kubeadm --config` reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeadmConfig {
    /// `kubeadm init`: both documents.
    Init(InitConfiguration, ClusterConfiguration),
    /// `kubeadm join`.
    Join(JoinConfiguration),
}

impl KubeadmConfig {
    /// The YAML file, documents separated by `---`.
    pub fn render(&self) -> Result<String> {
        let yaml = |v: &dyn erased::Ser| v.to_yaml();
        Ok(match self {
            KubeadmConfig::Init(init, cluster) => {
                format!("{}---\n{}", yaml(init)?, yaml(cluster)?)
            }
            KubeadmConfig::Join(join) => yaml(join)?,
        })
    }

    /// Reads a file [`KubeadmConfig::render`] wrote (or an equivalent one) back.
    pub fn parse(text: &str) -> Result<Self> {
        let docs: Vec<&str> = text
            .split("\n---\n")
            .flat_map(|d| d.strip_prefix("---\n").or(Some(d)))
            .filter(|d| !d.trim().is_empty())
            .collect();
        // The documents hold the bootstrap token and the certificate key: an error
        // names the line and the field, never the source text or a value.
        fn read<T: serde::de::DeserializeOwned>(doc: &str) -> Result<T> {
            machine_core::from_yaml_redacting(doc, |_| true)
                .map_err(|e| Error::invalid_spec("kubeadm config", format!("does not parse: {e}")))
        }
        match docs.as_slice() {
            [one] => Ok(KubeadmConfig::Join(read(one)?)),
            [a, b] => Ok(KubeadmConfig::Init(read(a)?, read(b)?)),
            _ => Err(Error::invalid_spec(
                "kubeadm config",
                format!("has {} documents, not 1 (join) or 2 (init)", docs.len()),
            )),
        }
    }

    /// The node registration of either kind.
    pub fn node_registration(&self) -> &NodeRegistration {
        match self {
            KubeadmConfig::Init(i, _) => &i.node_registration,
            KubeadmConfig::Join(j) => &j.node_registration,
        }
    }
}

mod erased {
    //! One YAML writer for the three document types.
    use machine_core::{Error, Result};

    pub trait Ser {
        fn to_yaml(&self) -> Result<String>;
    }

    impl<T: serde::Serialize> Ser for T {
        fn to_yaml(&self) -> Result<String> {
            serde_saphyr::to_string(self)
                .map_err(|e| Error::permanent(format!("kubeadm config does not serialize: {e}")))
        }
    }
}
