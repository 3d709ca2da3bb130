//! Packages of the Debian family (apt), optionally pinned to a version.

use machine_core::{Error, Result};

use crate::check;
use crate::plan::Plan;
use crate::shell::q;

/// The package manager family a [`Packages`] recipe is for. The coupled path hands the
/// list to cloud-init, which runs the image's package manager; the family says how a
/// pinned version is written and which commands the decoupled path runs (the same ones
/// cloud-init 22.4's distro class for that family runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PackageFamily {
    /// Debian and Ubuntu: `apt-get`, pinned as `name=version`, installed state from
    /// `dpkg-query`.
    Apt,
    /// Fedora, RHEL and derivatives: `dnf` (or `yum -t` where dnf is missing), pinned as
    /// `name-version`, installed state from `rpm -q`.
    Dnf,
    /// openSUSE and SLES: `zypper --non-interactive`, pinned as `name=version`,
    /// installed state from `rpm -q`.
    Zypper,
    /// Alpine: `apk --quiet`, pinned as `name=version`, installed state from `apk info`.
    Apk,
}

impl PackageFamily {
    /// The lower-case name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            PackageFamily::Apt => "apt",
            PackageFamily::Dnf => "dnf",
            PackageFamily::Zypper => "zypper",
            PackageFamily::Apk => "apk",
        }
    }

    /// The family of an operating system from its os-release `ID` and `ID_LIKE` (as
    /// bootstrap-ssh's `os_release` reads them over the transport), so a decoupled
    /// layer can pick its packages' family per machine. `None` for an OS none of the
    /// families serves.
    pub fn for_os(id: &str, id_like: &[String]) -> Option<Self> {
        std::iter::once(id)
            .chain(id_like.iter().map(String::as_str))
            .find_map(|name| match name {
                "debian" | "ubuntu" => Some(PackageFamily::Apt),
                "fedora" | "rhel" | "centos" | "rocky" | "almalinux" | "amzn" => {
                    Some(PackageFamily::Dnf)
                }
                "suse" | "opensuse" | "sles" | "opensuse-leap" | "opensuse-tumbleweed" => {
                    Some(PackageFamily::Zypper)
                }
                "alpine" => Some(PackageFamily::Apk),
                _ => None,
            })
    }

    /// `package` as this family's package manager takes it.
    pub fn spec(self, package: &Package) -> String {
        match (&package.version, self) {
            (None, _) => package.name.clone(),
            (Some(v), PackageFamily::Dnf) => format!("{}-{v}", package.name),
            (Some(v), _) => format!("{}={v}", package.name),
        }
    }

    fn check_name(self, field: &str, name: &str) -> Result<()> {
        match self {
            PackageFamily::Apt => check::deb_package(field, name),
            PackageFamily::Dnf | PackageFamily::Zypper => check::rpm_package(field, name),
            PackageFamily::Apk => check::apk_package(field, name),
        }
    }

    fn check_version(self, field: &str, version: &str) -> Result<()> {
        match self {
            PackageFamily::Apt => check::deb_version(field, version),
            PackageFamily::Dnf | PackageFamily::Zypper => check::rpm_version(field, version),
            PackageFamily::Apk => check::apk_version(field, version),
        }
    }
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
}

/// Packages to install, for one package manager family.
///
/// - Apt (others below) coupled: cloud-init's `packages` module, which runs (once per instance, as root,
///   with `DEBIAN_FRONTEND=noninteractive`, through `eatmydata` when installed)
///   `apt-get --option=Dpkg::Options::=--force-confold
///   --option=Dpkg::options::=--force-unsafe-io --assume-yes --quiet update`, then the
///   same with `install <name[=version]>...`. Decoupled: exactly those two commands, so
///   the package manager sees the same invocations. All package recipes of a layer are
///   installed by one `install`, as cloud-init merges them into one list.
/// - Dnf: `dnf -y makecache`, then `dnf -y install <name[-version]>...` (`yum -t -y`
///   where dnf is missing); Zypper: `zypper --non-interactive refresh`, then
///   `zypper --non-interactive install --auto-agree-with-licenses <name[=version]>...`;
///   Apk: `apk --quiet update`, then `apk --quiet add <name[=version]>...`. Each is the
///   command line cloud-init 22.4's distro class runs (a test asks cloud-init's own code).
///   A layer holds packages of one family only, as one machine has one package manager.
/// - Rerun (decoupled): nothing is run when every package is installed (`dpkg-query`
///   status `ii`) at its pinned version; otherwise both commands run again. Never
///   removes or downgrades anything else.
/// - Refuses: a name that is not a Debian package name (shell metacharacters never
///   reach a command line), a version that is not a Debian version, a package listed
///   twice in a layer, a second family in a layer. On a machine without the family's
///   package manager, the decoupled step fails saying so.
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

    /// Fedora/RHEL-family packages (dnf or yum).
    pub fn dnf(packages: impl IntoIterator<Item = Package>) -> Self {
        Packages {
            family: PackageFamily::Dnf,
            packages: packages.into_iter().collect(),
        }
    }

    /// openSUSE/SLES packages (zypper).
    pub fn zypper(packages: impl IntoIterator<Item = Package>) -> Self {
        Packages {
            family: PackageFamily::Zypper,
            packages: packages.into_iter().collect(),
        }
    }

    /// Alpine packages (apk).
    pub fn apk(packages: impl IntoIterator<Item = Package>) -> Self {
        Packages {
            family: PackageFamily::Apk,
            packages: packages.into_iter().collect(),
        }
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.packages.is_empty() {
            return Err(Error::invalid_spec("packages", "lists no package"));
        }
        for (i, p) in self.packages.iter().enumerate() {
            self.family
                .check_name(&format!("packages[{i}].name"), &p.name)?;
            if let Some(v) = &p.version {
                self.family
                    .check_version(&format!("packages[{i}].version"), v)?;
            }
        }
        Ok(())
    }

    pub(crate) fn plan(&self, plan: &mut Plan, field: &str) -> Result<()> {
        match plan.package_family {
            Some(f) if f != self.family => {
                return Err(Error::invalid_spec(
                    format!("{field}.family"),
                    format!(
                        "the layer already installs {} packages; one machine has one package manager",
                        f.name()
                    ),
                ));
            }
            _ => plan.package_family = Some(self.family),
        }
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

/// The decoupled step installing `packages` (all of a layer's, in order) with `family`.
pub(crate) fn install_script(family: PackageFamily, packages: &[Package]) -> String {
    let specs: Vec<String> = packages.iter().map(|p| q(&family.spec(p))).collect();
    let specs = specs.join(" ");
    let checks: Vec<String> = packages
        .iter()
        .map(|p| installed_check(family, p))
        .collect();
    let checks = checks.join(" && ");
    let (tool, body) = match family {
        PackageFamily::Apt => (
            "apt-get",
            format!(
                "  export DEBIAN_FRONTEND=noninteractive\n  w=; if command -v eatmydata >/dev/null; then w=eatmydata; fi\n  $w {APT_GET} update\n  $w {APT_GET} install {specs}\n"
            ),
        ),
        PackageFamily::Dnf => (
            "rpm",
            format!(
                "  if command -v dnf >/dev/null; then pm=dnf; elif command -v yum >/dev/null; then pm='yum -t'; else echo 'neither dnf nor yum found' >&2; exit 1; fi\n  $pm -y makecache\n  $pm -y install {specs}\n"
            ),
        ),
        PackageFamily::Zypper => (
            "zypper",
            format!(
                "  zypper --non-interactive refresh\n  zypper --non-interactive install --auto-agree-with-licenses {specs}\n"
            ),
        ),
        PackageFamily::Apk => (
            "apk",
            format!("  apk --quiet update\n  apk --quiet add {specs}\n"),
        ),
    };
    format!(
        "command -v {tool} >/dev/null || {{ echo '{tool} not found: these packages are for the {family} family' >&2; exit 1; }}\nif ! {{ {checks}; }}; then\n{body}fi\n",
        family = family.name()
    )
}

/// A shell test that succeeds when `p` is installed (at its pinned version).
fn installed_check(family: PackageFamily, p: &Package) -> String {
    match family {
        PackageFamily::Apt => {
            let want = match &p.version {
                Some(v) => format!("grep -qxF {}", q(&format!("ii {v}"))),
                None => "grep -q '^ii'".to_owned(),
            };
            format!(
                "dpkg-query -W -f='${{db:Status-Abbrev}}${{Version}}\\n' {} 2>/dev/null | {want}",
                q(&p.name)
            )
        }
        // rpm -q takes name or name-version[-release].
        PackageFamily::Dnf | PackageFamily::Zypper => {
            let what = match &p.version {
                Some(v) => format!("{}-{v}", p.name),
                None => p.name.clone(),
            };
            format!("rpm -q --quiet {}", q(&what))
        }
        // `apk info -e -v name` prints name-version when installed.
        PackageFamily::Apk => match &p.version {
            Some(v) => format!(
                "apk info -e -v {} 2>/dev/null | grep -qxF {}",
                q(&p.name),
                q(&format!("{}-{v}", p.name))
            ),
            None => format!("apk info -e {} >/dev/null 2>&1", q(&p.name)),
        },
    }
}

/// Where [`AptRepository`] puts signing keys.
pub const APT_KEYRINGS: &str = "/etc/apt/keyrings";

/// An apt repository and the key its packages are signed with, as Debian 12 and
/// Ubuntu 22.04 recommend: the ASCII-armored key in `/etc/apt/keyrings/<name>.asc` and a
/// one-line source `/etc/apt/sources.list.d/<name>.list` with `signed-by=` that key, so
/// the key is trusted for this repository only. No `gpg` is needed on the machine.
///
/// - Both files are written before packages are installed: cloud-init's init-stage
///   `write_files` coupled (root, 0644), the first steps decoupled. The next `apt-get
///   update` of a [`Packages`] recipe reads them.
/// - Rerun: the files are written again only when they changed.
/// - Refuses: a name that is not a plain file name, a URI that is not http(s) or has
///   spaces, a suite or component with spaces or shell characters, a key that is not an
///   armored OpenPGP public key block.
#[derive(Clone, PartialEq, Eq)]
pub struct AptRepository {
    /// The file stem for the source and the key, such as `docker`.
    pub name: String,
    /// The archive URI, such as `https://download.docker.com/linux/debian`.
    pub uri: String,
    /// The suite (`bookworm`), or an exact path ending in `/` for a flat repository.
    pub suite: String,
    /// Components (`stable`); empty for a flat repository.
    pub components: Vec<String>,
    /// The ASCII-armored public key (`-----BEGIN PGP PUBLIC KEY BLOCK-----`).
    pub key: String,
}

impl std::fmt::Debug for AptRepository {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is public but long: its size is enough to tell keys apart in logs.
        f.debug_struct("AptRepository")
            .field("name", &self.name)
            .field("uri", &self.uri)
            .field("suite", &self.suite)
            .field("components", &self.components)
            .field("key", &format_args!("{} bytes", self.key.len()))
            .finish()
    }
}

impl AptRepository {
    /// A repository `name` at `uri` for `suite` and `components`, signed by `key`.
    pub fn new(
        name: impl Into<String>,
        uri: impl Into<String>,
        suite: impl Into<String>,
        components: impl IntoIterator<Item = impl Into<String>>,
        key: impl Into<String>,
    ) -> Self {
        AptRepository {
            name: name.into(),
            uri: uri.into(),
            suite: suite.into(),
            components: components.into_iter().map(Into::into).collect(),
            key: key.into(),
        }
    }

    /// The path of the key.
    pub fn key_path(&self) -> String {
        format!("{APT_KEYRINGS}/{}.asc", self.name)
    }

    /// The source line.
    pub fn source_line(&self) -> String {
        let mut line = format!(
            "deb [signed-by={}] {} {}",
            self.key_path(),
            self.uri,
            self.suite
        );
        for c in &self.components {
            line.push(' ');
            line.push_str(c);
        }
        line.push('\n');
        line
    }

    pub(crate) fn check(&self) -> Result<()> {
        check::plain_name("name", &self.name)?;
        let word = |c: char| c.is_ascii_alphanumeric() || "-._~/:%+@".contains(c);
        if !(self.uri.starts_with("http://") || self.uri.starts_with("https://"))
            || !self.uri.chars().all(word)
        {
            return Err(Error::invalid_spec(
                "uri",
                format!("{:?} is not an http(s) URI without spaces", self.uri),
            ));
        }
        if self.suite.is_empty() || !self.suite.chars().all(word) {
            return Err(Error::invalid_spec(
                "suite",
                format!("{:?} is not a suite name", self.suite),
            ));
        }
        for (i, c) in self.components.iter().enumerate() {
            if c.is_empty() || !c.chars().all(word) {
                return Err(Error::invalid_spec(
                    format!("components[{i}]"),
                    format!("{c:?} is not a component name"),
                ));
            }
        }
        if !self
            .key
            .trim_start()
            .starts_with("-----BEGIN PGP PUBLIC KEY BLOCK-----")
            || !self.key.contains("-----END PGP PUBLIC KEY BLOCK-----")
        {
            return Err(Error::invalid_spec(
                "key",
                "is not an ASCII-armored OpenPGP public key block",
            ));
        }
        Ok(())
    }

    pub(crate) fn plan(&self, plan: &mut Plan, field: &str) -> Result<()> {
        let mut key = self.key.clone();
        if !key.ends_with('\n') {
            key.push('\n');
        }
        plan.add_early_file(
            crate::plan::PlannedFile {
                path: self.key_path(),
                content: key.into_bytes(),
                mode: 0o644,
                owner: None,
            },
            &format!("{field}.name"),
        )?;
        plan.add_early_file(
            crate::plan::PlannedFile {
                path: format!("/etc/apt/sources.list.d/{}.list", self.name),
                content: self.source_line().into_bytes(),
                mode: 0o644,
                owner: None,
            },
            &format!("{field}.name"),
        )
    }
}
