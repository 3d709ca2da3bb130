//! [`KubeadmLayer`]: a checked [`KubeadmNode`] rendered to either path.

use std::fmt;

use async_trait::async_trait;
use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, Content, Secret, WriteFile};
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    DecoupledSoftware, Error, Machine, ProviderId, Result, Software, Transport, check_dns_label,
};
use recipes::{
    AptRepository, Containerd, DnfRepository, Package, PackageFamily, Packages, Recipe,
    RecipeLayer, SwapOff,
};

use crate::config::KubeadmConfig;
use crate::node::{KubeadmNode, Role};
use crate::version::KubeVersion;

/// Where the layer writes the kubeadm configuration (0600: it holds the token).
pub const KUBEADM_CONFIG: &str = "/etc/kubernetes/machine-kubeadm.yaml";

/// The file `kubeadm init` and `kubeadm join` leave when they succeeded: the kubelet's
/// credentials. The layer runs kubeadm only while it is missing.
pub const KUBELET_CONF: &str = "/etc/kubernetes/kubelet.conf";

/// Where the dnf family's repository is described (a [`DnfRepository`] with id
/// `kubernetes`).
pub const YUM_REPO: &str = "/etc/yum.repos.d/kubernetes.repo";

const PACKAGES: [&str; 3] = ["kubelet", "kubeadm", "kubectl"];

/// A Kubernetes node layer, checked; one value serves many machines.
///
/// What it does, in order, on both paths:
///
/// 1. the package repository of the version's minor release at pkgs.k8s.io: for apt,
///    an [`AptRepository`] (`/etc/apt/keyrings/kubernetes.asc` and a flat source
///    `https://pkgs.k8s.io/core:/stable:/v1.31/deb/ /`); for dnf, a [`DnfRepository`]
///    ([`YUM_REPO`] and the key given, `/etc/pki/rpm-gpg/RPM-GPG-KEY-kubernetes`, which
///    its `gpgkey` names). Both are written before any package is installed;
/// 2. the recipes: [`Containerd`] (package, `overlay`/`br_netfilter`, bridge sysctls,
///    systemd cgroups), [`SwapOff`], and `kubelet`, `kubeadm`, `kubectl` pinned to the
///    version (`=1.31.4-1.1` on apt, `-1.31.4` on dnf), installed by the same package
///    command as containerd;
/// 3. `apt-mark hold` of the three (apt), `systemctl enable kubelet`;
/// 4. the kubeadm configuration in [`KUBEADM_CONFIG`] (0600), its kubelet
///    `provider-id` the machine's provider ID;
/// 5. `kubeadm init --config` (with `--upload-certs` when a certificate key is given)
///    or `kubeadm join --config`, **only when [`KUBELET_CONF`] does not exist**.
///
/// Coupled ([`KubeadmLayer::coupled`]): a cloud-config; a machine's user data is
/// rendered before the machine exists, so the provider ID is passed in (known ahead
/// for bare metal and for providers that name machines before creating them), or
/// [`KubeadmLayer::coupled_from_instance_data`] has cloud-init fill it in on the
/// machine from a template over its instance data (a cloud's instance ID and zone).
/// Completion is the composer's usual check (cloud-init's status or the sentinel):
/// a failed kubeadm fails `runcmd`, which cloud-init reports.
///
/// Decoupled (the [`DecoupledSoftware`] impl): the same steps over the transport, with
/// the provider ID of the [`Machine`] given, each step recorded on the machine when
/// done (a [`StepLayer`] per machine). A rerun after a cut link skips what is recorded;
/// a kubeadm step that ran but was not recorded (the link went down in between) is
/// guarded by [`KUBELET_CONF`], so `kubeadm join` never runs twice on a node.
///
/// A new version is a new layer value: applied decoupled to a node that has the old
/// one, its package pins differ, so the packages are released from `apt-mark hold`,
/// installed at the new version and held again; kubeadm is not run again on a node
/// that already joined (`kubeadm upgrade` is left to the operator).
#[derive(Clone)]
pub struct KubeadmLayer {
    name: String,
    node: KubeadmNode,
    version: KubeVersion,
    recipes: RecipeLayer,
}

impl fmt::Debug for KubeadmLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeadmLayer")
            .field("name", &self.name)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl KubeadmLayer {
    pub(crate) fn new(name: String, node: KubeadmNode, version: KubeVersion) -> Result<Self> {
        check_dns_label("layer.name", &name)?;
        let recipes = RecipeLayer::new(name.clone(), Self::recipes(&node, version))
            .map_err(|e| e.within("kubeadm"))?;
        Ok(KubeadmLayer {
            name,
            node,
            version,
            recipes,
        })
    }

    fn recipes(node: &KubeadmNode, version: KubeVersion) -> Vec<Recipe> {
        let family = node.family;
        let mut out: Vec<Recipe> = Vec::new();
        if let (PackageFamily::Dnf, Some(key)) = (family, &node.rpm_key) {
            out.push(
                DnfRepository::new(
                    "kubernetes",
                    format!(
                        "https://pkgs.k8s.io/core:/stable:/{}/rpm/",
                        version.minor_channel()
                    ),
                    key.clone(),
                )
                .with_name("Kubernetes")
                .into(),
            );
        }
        if let (PackageFamily::Apt, Some(key)) = (family, &node.apt_key) {
            out.push(
                AptRepository::new(
                    "kubernetes",
                    format!(
                        "https://pkgs.k8s.io/core:/stable:/{}/deb/",
                        version.minor_channel()
                    ),
                    "/",
                    Vec::<String>::new(),
                    key.clone(),
                )
                .into(),
            );
        }
        out.push(
            node.containerd
                .clone()
                .unwrap_or_else(|| Containerd::new(family))
                .into(),
        );
        out.push(SwapOff.into());
        let pin = match family {
            PackageFamily::Apt => format!(
                "{version}-{}",
                node.package_revision.as_deref().unwrap_or("1.1")
            ),
            _ => version.to_string(),
        };
        out.push(
            Packages {
                family,
                packages: PACKAGES
                    .iter()
                    .map(|p| Package::pinned(*p, pin.clone()))
                    .collect(),
            }
            .into(),
        );
        out
    }

    /// The layer's name.
    pub fn layer_name(&self) -> &str {
        &self.name
    }

    /// The version.
    pub fn version(&self) -> KubeVersion {
        self.version
    }

    /// The role.
    pub fn role(&self) -> Role {
        self.node.role
    }

    /// The kubeadm configuration for the machine `provider_id`.
    pub fn config(&self, provider_id: &ProviderId) -> Result<KubeadmConfig> {
        Ok(self.node.config(self.version, provider_id))
    }

    /// The kubeadm command line (run only while [`KUBELET_CONF`] is missing).
    pub fn kubeadm_command(&self) -> String {
        let upload = match (self.node.role, &self.node.certificate_key) {
            (Role::ControlPlaneInit, Some(_)) => " --upload-certs",
            _ => "",
        };
        format!(
            "kubeadm {} --config {KUBEADM_CONFIG}{upload}",
            self.node.role.subcommand()
        )
    }

    /// Commands after the packages, before kubeadm. `versioned` (the decoupled path)
    /// adds the version in a comment, so that the step record does not skip them
    /// after an upgrade.
    fn after_packages(&self, versioned: bool) -> Vec<String> {
        let mut c = Vec::new();
        if self.node.family == PackageFamily::Apt {
            let mut hold = format!("apt-mark hold {}", PACKAGES.join(" "));
            if versioned {
                hold.push_str(&format!(" # after installing {}", self.version));
            }
            c.push(hold);
        }
        c.push("systemctl enable kubelet".to_owned());
        c
    }

    fn guarded_kubeadm(&self) -> String {
        format!("[ -f {KUBELET_CONF} ] || {}", self.kubeadm_command())
    }

    /// The coupled path: a cloud-config layer for the machine that will have
    /// `provider_id`.
    pub fn coupled(&self, provider_id: &ProviderId) -> Result<CloudConfigLayer> {
        let config = self.config(provider_id)?.render()?;
        let mut cc = self.recipes.cloud_config();
        let mut early = Vec::new();
        // init-stage write_files: before the final stage installs packages and runs
        // runcmd; the config holds the token, so it is secret content, 0600.
        early.push(
            WriteFile::new(KUBEADM_CONFIG, Content::Secret(Secret::new(config)))
                .permissions("0600"),
        );
        early.append(&mut cc.write_files);
        cc.write_files = early;
        // runcmd is one script run without -e: each command stops it on failure, so
        // cloud-init reports the layer failed (and kubeadm never runs half-installed).
        for command in self
            .after_packages(false)
            .into_iter()
            .chain([self.guarded_kubeadm()])
        {
            cc = cc.with_runcmd(format!("{command} || exit 1"));
        }
        CloudConfigLayer::new(self.name.clone(), cc)
    }

    /// The coupled path when the provider ID is only known on the machine: a
    /// cloud-init Jinja part (`## template: jinja`) whose kubelet `provider-id` is
    /// `template` rendered by cloud-init with the instance data, such as
    /// `aws:///{{ v1.availability_zone }}/{{ v1.instance_id }}`. The rest of the
    /// document is the same as [`KubeadmLayer::coupled`]'s.
    ///
    /// Refuses (field `kubeadm.providerIdTemplate`) a template without a `{{ }}`
    /// expression, with quotes, line breaks or Jinja statements, or that is not a
    /// provider ID URI once its expressions are filled; and a layer whose own content
    /// holds Jinja delimiters, which cloud-init would try to render.
    pub fn coupled_from_instance_data(&self, template: &str) -> Result<CloudConfigLayer> {
        const FIELD: &str = "kubeadm.providerIdTemplate";
        let bad = |why: &str| {
            Error::invalid_spec(FIELD, format!("{} {why}", machine_core::shown(template)))
        };
        if !template.contains("{{")
            || template.contains(['\'', '"', '\\', '\n', '\r'])
            || template.contains("{%")
            || template.contains("{#")
        {
            return Err(bad(
                "is not a provider ID template: one line, no quotes, {{ }} expressions only",
            ));
        }
        // Filled with a word, it must be a provider ID URI.
        let mut filled = String::new();
        let mut rest = template;
        while let Some(start) = rest.find("{{") {
            let end = rest[start..]
                .find("}}")
                .ok_or_else(|| bad("has an unclosed {{"))?;
            filled.push_str(&rest[..start]);
            filled.push('x');
            rest = &rest[start + end + 2..];
        }
        filled.push_str(rest);
        ProviderId::new(filled).map_err(|_| bad("is not a provider ID URI like aws:///{{ v1.availability_zone }}/{{ v1.instance_id }}"))?;

        let placeholder = ProviderId::new("kubeadm-placeholder:///provider-id")?;
        let doc = self.coupled(&placeholder)?.render()?;
        if !doc.contains(placeholder.as_str()) {
            return Err(Error::permanent(
                "the rendered cloud-config lost the provider ID placeholder",
            ));
        }
        if ["{{", "{%", "{#"].iter().any(|d| doc.contains(d)) {
            return Err(Error::invalid_spec(
                FIELD,
                "the layer's content holds Jinja delimiters ({{, {% or {#), which cloud-init would render: use coupled() with a known provider ID",
            ));
        }
        let template_doc = format!(
            "## template: jinja\n{}",
            doc.replace(placeholder.as_str(), template)
        );
        CloudConfigLayer::new(self.name.clone(), CloudConfig::default())?
            .with_jinja2("kubeadm.yaml", template_doc)
    }

    /// The decoupled path's steps for the machine `provider_id`. Not public: a step
    /// holds the configuration with the token, and [`Step`]'s Debug shows content.
    fn steps(&self, provider_id: &ProviderId) -> Result<Vec<Step>> {
        let mut steps = Vec::new();
        if self.node.family == PackageFamily::Apt {
            // A new version on a node that has the held packages: apt-get refuses to
            // change held packages, so release them first (nothing to release on a
            // fresh machine, where apt-mark's complaint is of no matter).
            // The version in a comment: a decoupled step already done is skipped, and
            // this one must run again for each new version.
            steps.push(Step::run(format!(
                "apt-mark unhold {} >/dev/null 2>&1 || true # before installing {}",
                PACKAGES.join(" "),
                self.version
            )));
        }
        steps.extend(self.recipes.steps());
        steps.extend(self.after_packages(true).into_iter().map(Step::run));
        let config = self.config(provider_id)?.render()?;
        steps.push(Step::write_file_mode(KUBEADM_CONFIG, config, 0o600));
        steps.push(Step::run(self.guarded_kubeadm()));
        Ok(steps)
    }

    /// Where the decoupled path records its done steps on a machine (named after the
    /// layer, in [`machine_core::steps::DEFAULT_STATE_DIR`]).
    pub fn state_path(&self) -> Result<String> {
        Ok(StepLayer::new(self.name.clone(), Vec::new())?.state_path())
    }

    /// The decoupled path for the machine `provider_id`, as a step layer.
    fn decoupled_for(&self, provider_id: &ProviderId) -> Result<StepLayer> {
        StepLayer::new(self.name.clone(), self.steps(provider_id)?)
    }
}

impl Software for KubeadmLayer {
    fn name(&self) -> &str {
        &self.name
    }
}

/// Decoupled: the steps for the machine's own provider ID, resumable and guarded.
#[async_trait]
impl DecoupledSoftware for KubeadmLayer {
    async fn is_applied(&self, machine: &Machine, transport: &dyn Transport) -> Result<bool> {
        self.decoupled_for(&machine.provider_id)?
            .is_applied(machine, transport)
            .await
    }

    async fn apply(&self, machine: &Machine, transport: &dyn Transport) -> Result<()> {
        self.decoupled_for(&machine.provider_id)?
            .apply(machine, transport)
            .await
    }
}
