//! A container runtime for Kubernetes nodes: containerd with the systemd cgroup driver.

use machine_core::Result;

use crate::check;
use crate::packages::{Package, PackageFamily, Packages};
use crate::plan::{Plan, PlannedFile};
use crate::shell::digest;
use crate::system::{KernelModules, Sysctl};

/// Where containerd reads its configuration.
pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";

/// containerd as the kubelet needs it: the package, the `overlay` and `br_netfilter`
/// modules, the bridge and forwarding sysctls, and a configuration (version 2, for
/// containerd 1.6 and 1.7) whose runc runtime uses the systemd cgroup driver.
///
/// - It expands to the recipes it is made of: a [`Packages`] of its family,
///   [`KernelModules`] `containerd` and [`Sysctl`] `99-kubernetes-cri` (loaded and
///   applied now), the configuration file (0644, root), then `systemctl restart
///   containerd` when systemd runs; the restart command carries a digest of the
///   configuration, so a rerun restarts only after it changed.
/// - Rerun: as its parts (nothing changes when all is in place).
/// - Refuses: what its parts refuse (a package name or version, a sandbox image with
///   quotes, spaces or line breaks); a second package recipe of another family in the layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Containerd {
    /// The package family of the machines.
    pub family: PackageFamily,
    /// The package (`containerd` by default; `containerd.io` from Docker's repositories).
    pub package: Package,
    /// The pause image the CRI plugin uses, such as `registry.k8s.io/pause:3.9`.
    pub sandbox_image: Option<String>,
}

impl Containerd {
    /// containerd from the family's own repositories.
    pub fn new(family: PackageFamily) -> Self {
        Containerd {
            family,
            package: Package::new("containerd"),
            sandbox_image: None,
        }
    }

    /// Installs `package` instead (a pinned version, `containerd.io`).
    pub fn with_package(mut self, package: Package) -> Self {
        self.package = package;
        self
    }

    /// Sets the pause image.
    pub fn with_sandbox_image(mut self, image: impl Into<String>) -> Self {
        self.sandbox_image = Some(image.into());
        self
    }

    fn packages(&self) -> Packages {
        Packages {
            family: self.family,
            packages: vec![self.package.clone()],
        }
    }

    fn modules() -> KernelModules {
        KernelModules::new("containerd", ["overlay", "br_netfilter"])
    }

    fn sysctl() -> Sysctl {
        Sysctl::new(
            "99-kubernetes-cri",
            [
                ("net.bridge.bridge-nf-call-iptables", "1"),
                ("net.bridge.bridge-nf-call-ip6tables", "1"),
                ("net.ipv4.ip_forward", "1"),
            ],
        )
    }

    /// The configuration file's content.
    pub fn config(&self) -> String {
        let mut s = String::from(
            "# Written by the containerd recipe: the kubelet's systemd cgroup driver needs\n# containerd's runc runtime to use systemd cgroups too.\nversion = 2\n\n",
        );
        if let Some(image) = &self.sandbox_image {
            s.push_str(&format!(
                "[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{image}\"\n\n"
            ));
        }
        s.push_str(
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n",
        );
        s
    }

    pub(crate) fn check(&self) -> Result<()> {
        self.packages().check()?;
        if let Some(image) = &self.sandbox_image {
            check::one_line("sandbox_image", image, "an image reference")?;
            if image.contains(['"', '\\', ' ', '\t']) {
                return Err(machine_core::Error::invalid_spec(
                    "sandbox_image",
                    format!("{image:?} is not an image reference"),
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn plan(&self, plan: &mut Plan, field: &str) -> Result<()> {
        self.packages().plan(plan, field)?;
        Self::modules().plan(plan, field)?;
        Self::sysctl().plan(plan, field)?;
        let config = self.config();
        plan.commands.push(format!(
            "# config {}\nif [ -d /run/systemd/system ]; then systemctl restart containerd; fi\n",
            digest(&[config.as_bytes()])
        ));
        plan.add_file(
            PlannedFile {
                path: CONTAINERD_CONFIG.to_owned(),
                content: config.into_bytes(),
                mode: 0o644,
                owner: None,
            },
            &format!("{field}.config"),
        )?;
        Ok(())
    }
}
