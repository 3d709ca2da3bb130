//! # recipes
//!
//! The software every machine needs (accounts, files, packages, systemd units, system
//! settings) written once as typed values and applied either way:
//!
//! - **coupled**: [`RecipeLayer::coupled`] renders a
//!   [`bootstrap_cloudinit::CloudConfigLayer`] using cloud-init's own modules where they
//!   exist (`users`, `groups`, `packages`, `write_files`, `hostname`, `timezone`),
//!   `bootcmd` (once per instance) for what must precede packages and `runcmd` for the
//!   rest;
//! - **decoupled**: [`RecipeLayer::decoupled`] gives a [`machine_core::steps::StepLayer`]
//!   that runs the same commands cloud-init would (`useradd`, `apt-get ... install`) over
//!   a transport, each step guarded so that a rerun changes nothing.
//!
//! Both are ordinary software layers for the composer, so one team's recipes can be
//! coupled and another's decoupled on one machine. Every recipe is checked when its
//! layer is built: a package name with shell characters, a unit name systemd would
//! refuse, a sysctl key with `/`, a mode cloud-init cannot apply or an account name
//! useradd refuses is an invalid-spec error naming the field, before anything runs.
//!
//! Each recipe's documentation says what it renders to on each path, what a rerun does
//! and what it refuses. What only the machine can judge is checked there before it takes
//! effect: a sudo rule goes through `visudo` before it lands in `/etc/sudoers.d`.

mod account;
mod check;
mod containerd;
mod files;
mod layer;
mod packages;
mod plan;
mod recipe;
mod repositories;
mod shell;
mod system;
mod systemd;

pub use account::{Account, Group, SUDO_ALL_NOPASSWD};
pub use containerd::{CONTAINERD_CONFIG, Containerd};
pub use files::{Directory, File, LineInFile};
pub use layer::RecipeLayer;
pub use packages::{APT_GET, APT_KEYRINGS, AptRepository, Package, PackageFamily, Packages};
pub use recipe::Recipe;
pub use repositories::{
    APK_KEYS, APK_REPOSITORIES, ApkRepository, DnfRepository, RPM_KEYS, ZypperRepository,
};
pub use system::{Hostname, KernelModules, SwapOff, Sysctl, Timezone};
pub use systemd::{DropIn, SystemdUnit, UNIT_DIR};
