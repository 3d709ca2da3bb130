//! Packages of the Debian family (apt), optionally pinned to a version.

use machine_core::{Error, Result};

use crate::check;
use crate::plan::Plan;
use crate::shell::q;

/// The package manager family a [`Packages`] recipe is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PackageFamily {
    /// Debian and Ubuntu: `apt-get`, versions as `name=version`.
    Apt,
}

/// One package, pinned to a version when `version` is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    /// The package name (`name` or `name:arch`).
    pub name: String,
    /// The exact version to install.
    pub version: Option<String>,
}

impl Package {
    /// The package `name`, any version.
    pub fn new(name: impl Into<String>) -> Self {
        Package {
            name: name.into(),
            version: None,
        }
    }

    /// The package `name` at exactly `version`.
    pub fn pinned(name: impl Into<String>, version: impl Into<String>) -> Self {
        Package {
            name: name.into(),
            version: Some(version.into()),
        }
    }

    /// `name` or `name=version`, as cloud-init and apt-get take it.
    pub fn spec(&self) -> String {
        match &self.version {
            Some(v) => format!("{}={v}", self.name),
            None => self.name.clone(),
        }
    }
}

/// Packages to install.
///
/// - Coupled: cloud-init's `packages` module, which runs (once per instance, as root,
///   with `DEBIAN_FRONTEND=noninteractive`, through `eatmydata` when installed)
///   `apt-get --option=Dpkg::Options::=--force-confold
///   --option=Dpkg::options::=--force-unsafe-io --assume-yes --quiet update`, then the
///   same with `install <name[=version]>...`. Decoupled: exactly those two commands, so
///   the package manager sees the same invocations. All package recipes of a layer are
///   installed by one `install`, as cloud-init merges them into one list.
/// - Rerun (decoupled): nothing is run when every package is installed (`dpkg-query`
///   status `ii`) at its pinned version; otherwise both commands run again. Never
///   removes or downgrades anything else.
/// - Refuses: a name that is not a Debian package name (shell metacharacters never
///   reach a command line), a version that is not a Debian version, a package listed
///   twice in a layer. On a machine without `apt-get`, the decoupled step fails with
///   that message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packages {
    /// The package manager family.
    pub family: PackageFamily,
    /// The packages.
    pub packages: Vec<Package>,
}

/// The command cloud-init 22.4's Debian distro runs apt-get with.
pub const APT_GET: &str = "apt-get --option=Dpkg::Options::=--force-confold --option=Dpkg::options::=--force-unsafe-io --assume-yes --quiet";

impl Packages {
    /// Debian-family packages.
    pub fn apt(packages: impl IntoIterator<Item = Package>) -> Self {
        Packages {
            family: PackageFamily::Apt,
            packages: packages.into_iter().collect(),
        }
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.packages.is_empty() {
            return Err(Error::invalid_spec("packages", "lists no package"));
        }
        for (i, p) in self.packages.iter().enumerate() {
            check::deb_package(&format!("packages[{i}].name"), &p.name)?;
            if let Some(v) = &p.version {
                check::deb_version(&format!("packages[{i}].version"), v)?;
            }
        }
        Ok(())
    }

    pub(crate) fn plan(&self, plan: &mut Plan, field: &str) -> Result<()> {
        for (i, p) in self.packages.iter().enumerate() {
            if plan.packages.iter().any(|o| o.name == p.name) {
                return Err(Error::invalid_spec(
                    format!("{field}.packages[{i}].name"),
                    format!("package {:?} is listed twice in the layer", p.name),
                ));
            }
            plan.packages.push(p.clone());
        }
        Ok(())
    }
}

/// The decoupled apt step for `packages` (all of a layer's, in order).
pub(crate) fn apt_script(packages: &[Package]) -> String {
    let checks: Vec<String> = packages
        .iter()
        .map(|p| {
            let want = match &p.version {
                Some(v) => format!("grep -qxF {}", q(&format!("ii {v}"))),
                None => "grep -q '^ii'".to_owned(),
            };
            format!(
                "dpkg-query -W -f='${{db:Status-Abbrev}}${{Version}}\\n' {} 2>/dev/null | {want}",
                q(&p.name)
            )
        })
        .collect();
    let specs: Vec<String> = packages.iter().map(|p| q(&p.spec())).collect();
    format!(
        "command -v apt-get >/dev/null || {{ echo 'apt-get not found: these packages are for the Debian family' >&2; exit 1; }}\n\
         if ! {{ {checks}; }}; then\n\
         \x20 export DEBIAN_FRONTEND=noninteractive\n\
         \x20 w=; if command -v eatmydata >/dev/null; then w=eatmydata; fi\n\
         \x20 $w {APT_GET} update\n\
         \x20 $w {APT_GET} install {specs}\n\
         fi\n",
        checks = checks.join(" && "),
        specs = specs.join(" ")
    )
}
