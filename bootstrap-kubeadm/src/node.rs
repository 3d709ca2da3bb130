//! [`KubeadmNode`]: what a Kubernetes node needs, as a value, and its checks.

use std::collections::BTreeMap;
use std::fmt;

use machine_core::{Error, ExposeSecret, ProviderId, Result, SecretString};
use recipes::{Containerd, PackageFamily};

use crate::checks;
use crate::config::{
    Arg, BootstrapToken, BootstrapTokenDiscovery, ClusterConfiguration, Discovery, ExtraArgs,
    Hidden, InitConfiguration, JoinConfiguration, JoinControlPlane, KubeadmConfig,
    NodeRegistration, Taint,
};
use crate::layer::KubeadmLayer;
use crate::version::{KubeVersion, KubeadmApi};

/// containerd's CRI socket, which the kubelet is pointed at.
pub const CRI_SOCKET: &str = "unix:///var/run/containerd/containerd.sock";

/// What the node does with kubeadm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `kubeadm init`: the first control-plane node, which creates the cluster.
    ControlPlaneInit,
    /// `kubeadm join` with `controlPlane`: another control-plane node.
    ControlPlaneJoin,
    /// `kubeadm join`: a worker.
    WorkerJoin,
}

impl Role {
    /// The kubeadm subcommand.
    pub fn subcommand(self) -> &'static str {
        match self {
            Role::ControlPlaneInit => "init",
            Role::ControlPlaneJoin | Role::WorkerJoin => "join",
        }
    }
}

/// A Kubernetes node as one software layer's value: a version, a role, where the
/// cluster is and the secrets to join it, the node's labels and taints.
///
/// Nothing is checked until [`KubeadmNode::layer`], which checks every field and
/// returns an invalid-spec error naming the first bad one (`kubeadm.version`,
/// `kubeadm.token`, `kubeadm.labels["x"]`...) before anything is rendered or run.
/// The token and certificate key are [`SecretString`]s: Debug shows neither, nor does
/// any error. Upgrading a node's Kubernetes is a new value with another version (and
/// a new layer), not another machine type.
///
/// ```
/// use bootstrap_kubeadm::KubeadmNode;
/// use machine_core::{ProviderId, SecretString};
///
/// let node = KubeadmNode::worker(
///     "1.31.4",
///     "10.0.0.10:6443",
///     SecretString::from("abcdef.0123456789abcdef"),
///     format!("sha256:{}", "0".repeat(64)),
/// )
/// .with_family(recipes::PackageFamily::Dnf)
/// // pkgs.k8s.io's repository key, checked by the machine (shortened here).
/// .with_rpm_key("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZXhhbXBsZQ==\n-----END PGP PUBLIC KEY BLOCK-----\n")
/// .with_label("pool", "general")
/// .layer("kubernetes")?;
/// let config = node.config(&ProviderId::new("sim:///w-1")?)?;
/// assert!(config.render()?.contains("kubeadm.k8s.io/v1beta4"));
/// assert!(!format!("{node:?}").contains("0123456789abcdef"));
///
/// let bad = KubeadmNode::worker("1.31", "10.0.0.10:6443", SecretString::from("x"), "sha256:0");
/// assert_eq!(bad.layer("kubernetes").unwrap_err().field(), Some("kubeadm.version"));
/// # Ok::<(), machine_core::Error>(())
/// ```
#[derive(Clone)]
pub struct KubeadmNode {
    pub(crate) version: String,
    pub(crate) role: Role,
    pub(crate) endpoint: String,
    pub(crate) token: SecretString,
    pub(crate) ca_cert_hash: Option<String>,
    pub(crate) certificate_key: Option<SecretString>,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) taints: Option<Vec<Taint>>,
    pub(crate) kubelet_args: Vec<(String, String)>,
    pub(crate) family: PackageFamily,
    pub(crate) apt_key: Option<String>,
    pub(crate) rpm_key: Option<String>,
    pub(crate) package_revision: Option<String>,
    pub(crate) containerd: Option<Containerd>,
}

impl fmt::Debug for KubeadmNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Token and certificate key are SecretStrings, whose Debug is redacted.
        f.debug_struct("KubeadmNode")
            .field("version", &self.version)
            .field("role", &self.role)
            .field("endpoint", &self.endpoint)
            .field("token", &self.token)
            .field("ca_cert_hash", &self.ca_cert_hash)
            .field("certificate_key", &self.certificate_key)
            .field("labels", &self.labels)
            .field("taints", &self.taints)
            .field("kubelet_args", &self.kubelet_args)
            .field("family", &self.family)
            .finish_non_exhaustive()
    }
}

impl KubeadmNode {
    fn new(role: Role, version: &str, endpoint: &str, token: SecretString) -> Self {
        KubeadmNode {
            version: version.to_owned(),
            role,
            endpoint: endpoint.to_owned(),
            token,
            ca_cert_hash: None,
            certificate_key: None,
            labels: BTreeMap::new(),
            taints: None,
            kubelet_args: Vec::new(),
            family: PackageFamily::Apt,
            apt_key: None,
            rpm_key: None,
            package_revision: None,
            containerd: None,
        }
    }

    /// The first control-plane node of a cluster of Kubernetes `version`, reached by
    /// every node at `endpoint` (`host:port`, the `controlPlaneEndpoint`), creating the
    /// bootstrap `token` that the other nodes join with.
    pub fn init(version: &str, endpoint: &str, token: SecretString) -> Self {
        Self::new(Role::ControlPlaneInit, version, endpoint, token)
    }

    /// A control-plane node joining at `endpoint` with `token`, trusting the CA whose
    /// public key hashes to `ca_cert_hash`, and fetching the control-plane certificates
    /// uploaded by the first one with `certificate_key`.
    pub fn control_plane_join(
        version: &str,
        endpoint: &str,
        token: SecretString,
        ca_cert_hash: impl Into<String>,
        certificate_key: SecretString,
    ) -> Self {
        let mut n = Self::new(Role::ControlPlaneJoin, version, endpoint, token);
        n.ca_cert_hash = Some(ca_cert_hash.into());
        n.certificate_key = Some(certificate_key);
        n
    }

    /// A worker joining at `endpoint` with `token`, trusting the CA whose public key
    /// hashes to `ca_cert_hash`.
    pub fn worker(
        version: &str,
        endpoint: &str,
        token: SecretString,
        ca_cert_hash: impl Into<String>,
    ) -> Self {
        let mut n = Self::new(Role::WorkerJoin, version, endpoint, token);
        n.ca_cert_hash = Some(ca_cert_hash.into());
        n
    }

    /// On an init node: upload the control-plane certificates encrypted with `key`
    /// (`kubeadm init --upload-certs`), for control-plane joins to fetch.
    pub fn with_certificate_key(mut self, key: SecretString) -> Self {
        self.certificate_key = Some(key);
        self
    }

    /// Adds a node label (set by the kubelet when it registers).
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Adds a taint; the first one replaces kubeadm's default taints (the
    /// control-plane taint on control-plane nodes).
    pub fn with_taint(
        mut self,
        key: impl Into<String>,
        value: Option<&str>,
        effect: impl Into<String>,
    ) -> Self {
        self.taints.get_or_insert_with(Vec::new).push(Taint {
            key: key.into(),
            value: value.map(str::to_owned),
            effect: effect.into(),
        });
        self
    }

    /// No taints at all, not even kubeadm's default control-plane taint.
    pub fn without_taints(mut self) -> Self {
        self.taints = Some(Vec::new());
        self
    }

    /// Adds a kubelet flag (without dashes), such as `max-pods`, `110`.
    pub fn with_kubelet_arg(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.kubelet_args.push((name.into(), value.into()));
        self
    }

    /// The machines' package family (apt by default): apt and dnf are served, from
    /// pkgs.k8s.io's repository of the version's minor release.
    pub fn with_family(mut self, family: PackageFamily) -> Self {
        self.family = family;
        self
    }

    /// The ASCII-armored key pkgs.k8s.io signs the apt repository with (its
    /// `Release.key`), needed on the apt family: the layer fetches nothing itself.
    pub fn with_apt_key(mut self, key: impl Into<String>) -> Self {
        self.apt_key = Some(key.into());
        self
    }

    /// The ASCII-armored key pkgs.k8s.io signs the dnf repository with (its
    /// `repodata/repomd.xml.key`), needed on the dnf family: placed on the machine and
    /// named by the repository's `gpgkey`, so nothing is fetched to decide what to trust.
    pub fn with_rpm_key(mut self, key: impl Into<String>) -> Self {
        self.rpm_key = Some(key.into());
        self
    }

    /// The apt package revision after the version (`1.1` by default, as pkgs.k8s.io
    /// publishes `1.31.4-1.1`).
    pub fn with_package_revision(mut self, revision: impl Into<String>) -> Self {
        self.package_revision = Some(revision.into());
        self
    }

    /// Another containerd recipe (a pinned package, `containerd.io`, a pause image)
    /// instead of the family's `containerd`.
    pub fn with_containerd(mut self, containerd: Containerd) -> Self {
        self.containerd = Some(containerd);
        self
    }

    /// The role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Checks every field and gives the layer named `name` (a DNS label).
    pub fn layer(self, name: impl Into<String>) -> Result<KubeadmLayer> {
        let version = self.check()?;
        KubeadmLayer::new(name.into(), self, version)
    }

    fn check(&self) -> Result<KubeVersion> {
        let version = KubeVersion::parse("kubeadm.version", &self.version)?;
        checks::endpoint("kubeadm.endpoint", &self.endpoint)?;
        checks::token("kubeadm.token", self.token.expose_secret())?;
        match (&self.ca_cert_hash, self.role) {
            (Some(h), _) => checks::ca_hash("kubeadm.caCertHash", h)?,
            (None, Role::ControlPlaneInit) => {}
            (None, _) => {
                return Err(Error::invalid_spec(
                    "kubeadm.caCertHash",
                    "a join needs the cluster CA's public key hash",
                ));
            }
        }
        match (&self.certificate_key, self.role) {
            (Some(k), Role::ControlPlaneJoin | Role::ControlPlaneInit) => {
                checks::certificate_key("kubeadm.certificateKey", k.expose_secret())?;
            }
            (None, Role::ControlPlaneJoin) => {
                return Err(Error::invalid_spec(
                    "kubeadm.certificateKey",
                    "a control-plane join needs the certificate key the first control plane uploaded its certificates with",
                ));
            }
            (Some(_), Role::WorkerJoin) => {
                return Err(Error::invalid_spec(
                    "kubeadm.certificateKey",
                    "a worker does not take a certificate key",
                ));
            }
            (None, _) => {}
        }
        for (k, v) in &self.labels {
            let field = format!("kubeadm.labels[{k:?}]");
            checks::qualified_name(&field, k, true)?;
            checks::label_value(&field, v)?;
        }
        for (i, t) in self.taints.iter().flatten().enumerate() {
            let field = format!("kubeadm.taints[{i}]");
            checks::qualified_name(&format!("{field}.key"), &t.key, false)?;
            checks::label_value(&format!("{field}.value"), t.value.as_deref().unwrap_or(""))?;
            if !matches!(
                t.effect.as_str(),
                "NoSchedule" | "PreferNoSchedule" | "NoExecute"
            ) {
                return Err(Error::invalid_spec(
                    format!("{field}.effect"),
                    format!(
                        "{} is not NoSchedule, PreferNoSchedule or NoExecute",
                        machine_core::shown(&t.effect)
                    ),
                ));
            }
        }
        for (i, (n, v)) in self.kubelet_args.iter().enumerate() {
            checks::kubelet_arg(&format!("kubeadm.kubeletExtraArgs[{i}]"), n, v)?;
        }
        match self.family {
            PackageFamily::Apt => {
                if self.apt_key.is_none() {
                    return Err(Error::invalid_spec(
                        "kubeadm.aptKey",
                        "the apt family needs pkgs.k8s.io's signing key (with_apt_key)",
                    ));
                }
            }
            PackageFamily::Dnf => {
                if self.rpm_key.is_none() {
                    return Err(Error::invalid_spec(
                        "kubeadm.rpmKey",
                        "the dnf family needs pkgs.k8s.io's signing key (with_rpm_key)",
                    ));
                }
            }
            other => {
                return Err(Error::invalid_spec(
                    "kubeadm.family",
                    format!(
                        "pkgs.k8s.io has no {} packages: apt and dnf are served",
                        other.name()
                    ),
                ));
            }
        }
        Ok(version)
    }

    /// The kubeadm configuration for the machine `provider_id` (version already checked).
    pub(crate) fn config(&self, version: KubeVersion, provider_id: &ProviderId) -> KubeadmConfig {
        let api = version.kubeadm_api();
        let mut args = vec![("provider-id".to_owned(), provider_id.to_string())];
        if !self.labels.is_empty() {
            let labels: Vec<String> = self
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            args.push(("node-labels".to_owned(), labels.join(",")));
        }
        args.extend(self.kubelet_args.iter().cloned());
        let kubelet_extra_args = match api {
            KubeadmApi::V1Beta4 => ExtraArgs::List(
                args.into_iter()
                    .map(|(name, value)| Arg { name, value })
                    .collect(),
            ),
            KubeadmApi::V1Beta3 => ExtraArgs::Map(args.into_iter().collect()),
        };
        let node_registration = NodeRegistration {
            cri_socket: CRI_SOCKET.to_owned(),
            kubelet_extra_args,
            taints: self.taints.clone(),
        };
        let api_version = api.api_version().to_owned();
        let token = Hidden(self.token.expose_secret().to_owned());
        let certificate_key = self
            .certificate_key
            .as_ref()
            .map(|k| Hidden(k.expose_secret().to_owned()));
        match self.role {
            Role::ControlPlaneInit => KubeadmConfig::Init(
                InitConfiguration {
                    api_version: api_version.clone(),
                    kind: "InitConfiguration".into(),
                    bootstrap_tokens: vec![BootstrapToken {
                        token,
                        usages: vec!["signing".into(), "authentication".into()],
                        groups: vec!["system:bootstrappers:kubeadm:default-node-token".into()],
                    }],
                    node_registration,
                    certificate_key,
                },
                ClusterConfiguration {
                    api_version,
                    kind: "ClusterConfiguration".into(),
                    kubernetes_version: format!("v{version}"),
                    control_plane_endpoint: self.endpoint.clone(),
                },
            ),
            Role::ControlPlaneJoin | Role::WorkerJoin => KubeadmConfig::Join(JoinConfiguration {
                api_version,
                kind: "JoinConfiguration".into(),
                discovery: Discovery {
                    bootstrap_token: BootstrapTokenDiscovery {
                        api_server_endpoint: self.endpoint.clone(),
                        token,
                        ca_cert_hashes: self.ca_cert_hash.iter().cloned().collect(),
                    },
                },
                node_registration,
                control_plane: certificate_key
                    .map(|certificate_key| JoinControlPlane { certificate_key }),
            }),
        }
    }
}
