//! [`Recipe`]: one of the standard recipes, as a value.

use machine_core::Result;

use crate::account::{Account, Group};
use crate::containerd::Containerd;
use crate::files::{Directory, File, LineInFile};
use crate::packages::{AptRepository, Packages};
use crate::plan::Plan;
use crate::repositories::{ApkRepository, DnfRepository, ZypperRepository};
use crate::system::{Hostname, KernelModules, SwapOff, Sysctl, Timezone};
use crate::systemd::SystemdUnit;

/// One standard recipe. Each kind documents what it renders to on each path, what a
/// rerun does and what it refuses; [`crate::RecipeLayer::new`] checks them all before
/// anything is rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Recipe {
    /// A group.
    Group(Group),
    /// An account.
    Account(Account),
    /// A file.
    File(File),
    /// A directory.
    Directory(Directory),
    /// A line in a file.
    LineInFile(LineInFile),
    /// Packages.
    Packages(Packages),
    /// An apt repository and its signing key.
    AptRepository(AptRepository),
    /// A dnf/yum repository and its signing key.
    DnfRepository(DnfRepository),
    /// A zypper repository and its signing key.
    ZypperRepository(ZypperRepository),
    /// An apk repository and its signing key.
    ApkRepository(ApkRepository),
    /// A systemd unit and its drop-ins.
    SystemdUnit(SystemdUnit),
    /// The host name.
    Hostname(Hostname),
    /// The time zone.
    Timezone(Timezone),
    /// Kernel parameters.
    Sysctl(Sysctl),
    /// Kernel modules.
    KernelModules(KernelModules),
    /// Swap off.
    SwapOff(SwapOff),
    /// containerd with the systemd cgroup driver.
    Containerd(Containerd),
}

impl Recipe {
    /// Checks the recipe alone; the error's field is relative to the recipe (`mode`,
    /// `packages[2].name`).
    pub fn check(&self) -> Result<()> {
        match self {
            Recipe::Group(r) => r.check(),
            Recipe::Account(r) => r.check(),
            Recipe::File(r) => r.check(),
            Recipe::Directory(r) => r.check(),
            Recipe::LineInFile(r) => r.check(),
            Recipe::Packages(r) => r.check(),
            Recipe::AptRepository(r) => r.check(),
            Recipe::DnfRepository(r) => r.check(),
            Recipe::ZypperRepository(r) => r.check(),
            Recipe::ApkRepository(r) => r.check(),
            Recipe::SystemdUnit(r) => r.check(),
            Recipe::Hostname(r) => r.check(),
            Recipe::Timezone(r) => r.check(),
            Recipe::Sysctl(r) => r.check(),
            Recipe::KernelModules(r) => r.check(),
            Recipe::SwapOff(_) => Ok(()),
            Recipe::Containerd(r) => r.check(),
        }
    }

    /// Adds the recipe to `plan`; `field` is the recipe's path in the layer.
    pub(crate) fn plan(&self, plan: &mut Plan, field: &str) -> Result<()> {
        match self {
            Recipe::Group(r) => r.plan(plan),
            Recipe::Account(r) => r.plan(plan, field)?,
            Recipe::File(r) => r.plan(plan, field)?,
            Recipe::Directory(r) => r.plan(plan),
            Recipe::LineInFile(r) => r.plan(plan),
            Recipe::Packages(r) => r.plan(plan, field)?,
            Recipe::AptRepository(r) => r.plan(plan, field)?,
            Recipe::DnfRepository(r) => r.plan(plan, field)?,
            Recipe::ZypperRepository(r) => r.plan(plan, field)?,
            Recipe::ApkRepository(r) => r.plan(plan, field)?,
            Recipe::SystemdUnit(r) => r.plan(plan, field)?,
            Recipe::Hostname(r) => Plan::set_once(
                &mut plan.hostname,
                &r.name,
                &format!("{field}.name"),
                "host name",
            )?,
            Recipe::Timezone(r) => Plan::set_once(
                &mut plan.timezone,
                &r.name,
                &format!("{field}.name"),
                "time zone",
            )?,
            Recipe::Sysctl(r) => r.plan(plan, field)?,
            Recipe::KernelModules(r) => r.plan(plan, field)?,
            Recipe::SwapOff(r) => r.plan(plan),
            Recipe::Containerd(r) => r.plan(plan, field)?,
        }
        Ok(())
    }
}

macro_rules! from_kind {
    ($($kind:ident),*) => {$(
        impl From<$kind> for Recipe {
            fn from(value: $kind) -> Self {
                Recipe::$kind(value)
            }
        }
    )*};
}

from_kind!(
    Group,
    Account,
    File,
    Directory,
    LineInFile,
    Packages,
    AptRepository,
    DnfRepository,
    ZypperRepository,
    ApkRepository,
    SystemdUnit,
    Hostname,
    Timezone,
    Sysctl,
    KernelModules,
    SwapOff,
    Containerd
);
