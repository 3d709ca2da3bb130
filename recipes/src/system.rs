//! Machine-wide settings: host name, time zone, sysctl, kernel modules, swap.

use machine_core::{Error, Result};

use crate::check;
use crate::plan::{Plan, PlannedFile};
use crate::shell::{digest, q};

/// The host name.
///
/// - Coupled: cloud-init's `hostname` key (it writes `/etc/hostname` and runs
///   `hostname`); decoupled: the same two effects.
/// - Rerun: nothing changes when both already hold the name.
/// - Refuses: a name that is not one DNS label; a second host name in a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hostname {
    /// The short host name.
    pub name: String,
}

impl Hostname {
    /// The host name `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Hostname { name: name.into() }
    }

    pub(crate) fn check(&self) -> Result<()> {
        check::host_label("name", &self.name)
    }

    pub(crate) fn script(name: &str) -> String {
        let n = q(name);
        format!(
            "[ \"$(cat /etc/hostname 2>/dev/null)\" = {n} ] || printf '%s\\n' {n} > /etc/hostname\n[ \"$(hostname)\" = {n} ] || hostname {n}\n"
        )
    }
}

/// The time zone.
///
/// - Coupled: cloud-init's `timezone` key; decoupled: what its Debian distro does:
///   `/etc/timezone` holds the name, `/etc/localtime` links to the zoneinfo file (or is
///   a copy of it when it was a regular file).
/// - Rerun: nothing is written when the name and the link (or copy) are in place.
/// - Refuses: a name that is not a zoneinfo path (no `..`, no leading `/`); a second
///   time zone in a layer. A zone missing from the machine's tzdata fails the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timezone {
    /// A zoneinfo name such as `Europe/Paris`.
    pub name: String,
}

impl Timezone {
    /// The time zone `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Timezone { name: name.into() }
    }

    pub(crate) fn check(&self) -> Result<()> {
        check::timezone("name", &self.name)
    }

    pub(crate) fn script(name: &str) -> String {
        let z = q(&format!("/usr/share/zoneinfo/{name}"));
        format!(
            "[ -f {z} ] || {{ echo {missing} >&2; exit 1; }}\n[ \"$(cat /etc/timezone 2>/dev/null)\" = {n} ] || printf '%s\\n' {n} > /etc/timezone\nif [ -L /etc/localtime ] || [ ! -e /etc/localtime ]; then [ \"$(readlink /etc/localtime)\" = {z} ] || ln -sfn {z} /etc/localtime; else cmp -s {z} /etc/localtime || cp {z} /etc/localtime; fi\n",
            missing = q(&format!("no time zone {name} in /usr/share/zoneinfo")),
            n = q(name)
        )
    }
}

/// Kernel parameters: `/etc/sysctl.d/<name>.conf`, applied now with `sysctl -p`.
///
/// - The file goes through `write_files` coupled and an upload decoupled; `sysctl -q -p
///   <file>` runs on both paths (a `runcmd` entry coupled) when `apply_now` is set; the
///   command carries a digest of the file, so a rerun applies it again only after a change.
/// - Refuses: a key with `/`, `..` or an empty component; a value on several lines; a
///   file name that is not plain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sysctl {
    /// The file's stem under `/etc/sysctl.d`, such as `90-kubernetes`.
    pub name: String,
    /// `key = value` pairs, in order.
    pub settings: Vec<(String, String)>,
    /// Apply the file now (not only at the next boot).
    pub apply_now: bool,
}

impl Sysctl {
    /// Settings in `/etc/sysctl.d/<name>.conf`, applied now.
    pub fn new(
        name: impl Into<String>,
        settings: impl IntoIterator<Item = (impl Into<String>, impl Into<String>)>,
    ) -> Self {
        Sysctl {
            name: name.into(),
            settings: settings
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            apply_now: true,
        }
    }

    /// Whether to apply the file now.
    pub fn applied_now(mut self, apply_now: bool) -> Self {
        self.apply_now = apply_now;
        self
    }

    pub(crate) fn check(&self) -> Result<()> {
        check::plain_name("name", &self.name)?;
        if self.settings.is_empty() {
            return Err(Error::invalid_spec("settings", "lists no setting"));
        }
        for (i, (k, v)) in self.settings.iter().enumerate() {
            check::sysctl_key(&format!("settings[{i}].key"), k)?;
            check::one_line(&format!("settings[{i}].value"), v, "a value")?;
        }
        Ok(())
    }

    pub(crate) fn plan(&self, plan: &mut Plan, field: &str) -> Result<()> {
        let path = format!("/etc/sysctl.d/{}.conf", self.name);
        let content: String = self
            .settings
            .iter()
            .map(|(k, v)| format!("{k} = {}\n", v.trim()))
            .collect();
        if self.apply_now {
            plan.commands.push(format!(
                "# content {}\nsysctl -q -p {}\n",
                digest(&[content.as_bytes()]),
                q(&path)
            ));
        }
        plan.add_file(
            PlannedFile {
                path,
                content: content.into_bytes(),
                mode: 0o644,
                owner: None,
            },
            &format!("{field}.name"),
        )
    }
}

/// Kernel modules loaded at boot (`/etc/modules-load.d/<name>.conf`) and now.
///
/// - The file as for [`Sysctl`]; now: `modprobe` of each module that `/sys/module` does
///   not list yet, on both paths, when `load_now` is set.
/// - Rerun: a loaded module is not loaded again.
/// - Refuses: a module name other than letters, digits, `_` and `-`; a file name that is
///   not plain; an empty list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelModules {
    /// The file's stem under `/etc/modules-load.d`.
    pub name: String,
    /// The modules, in load order.
    pub modules: Vec<String>,
    /// Load them now (not only at the next boot).
    pub load_now: bool,
}

impl KernelModules {
    /// `modules` in `/etc/modules-load.d/<name>.conf`, loaded now.
    pub fn new(
        name: impl Into<String>,
        modules: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        KernelModules {
            name: name.into(),
            modules: modules.into_iter().map(Into::into).collect(),
            load_now: true,
        }
    }

    /// Whether to load the modules now.
    pub fn loaded_now(mut self, load_now: bool) -> Self {
        self.load_now = load_now;
        self
    }

    pub(crate) fn check(&self) -> Result<()> {
        check::plain_name("name", &self.name)?;
        if self.modules.is_empty() {
            return Err(Error::invalid_spec("modules", "lists no module"));
        }
        for (i, m) in self.modules.iter().enumerate() {
            check::module_name(&format!("modules[{i}]"), m)?;
        }
        Ok(())
    }

    pub(crate) fn plan(&self, plan: &mut Plan, field: &str) -> Result<()> {
        let content: String = self.modules.iter().map(|m| format!("{m}\n")).collect();
        if self.load_now {
            let mut s = String::new();
            for m in &self.modules {
                // /sys/module names use '_' where modprobe accepts '-'.
                let sys = q(&format!("/sys/module/{}", m.replace('-', "_")));
                s.push_str(&format!("[ -d {sys} ] || modprobe {}\n", q(m)));
            }
            plan.commands.push(s);
        }
        plan.add_file(
            PlannedFile {
                path: format!("/etc/modules-load.d/{}.conf", self.name),
                content: content.into_bytes(),
                mode: 0o644,
                owner: None,
            },
            &format!("{field}.name"),
        )
    }
}

/// Swap turned off now and at boot, as Kubernetes requires.
///
/// - Both paths run the same commands: swap lines of `/etc/fstab` are commented out
///   (`#` prefixed), then `swapoff -a` when `/proc/swaps` lists a device. Careful on
///   machines that share the host kernel (containers run as root): `swapoff -a` acts on
///   the kernel, so it turns off the host's swap.
/// - Rerun: commented lines stay commented; nothing changes.
/// - Refuses nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SwapOff;

impl SwapOff {
    pub(crate) fn plan(self, plan: &mut Plan) {
        plan.commands.push(
            "if [ -f /etc/fstab ] && grep -qE '^[^#[:space:]][^[:space:]]*[[:space:]]+[^[:space:]]+[[:space:]]+swap[[:space:]]' /etc/fstab; then\n  sed -i -E 's/^([^#[:space:]][^[:space:]]*[[:space:]]+[^[:space:]]+[[:space:]]+swap[[:space:]].*)$/#\\1/' /etc/fstab\nfi\nif [ \"$(wc -l < /proc/swaps)\" -gt 1 ]; then swapoff -a; fi\n"
                .to_owned(),
        );
    }
}
