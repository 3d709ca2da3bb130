//! Package repositories and their signing keys for the RPM families (dnf/yum, zypper)
//! and Alpine (apk); the apt one is [`crate::AptRepository`].
//!
//! cloud-init's own `yum_repos` and `zypper` modules are not used: the first stamps the
//! date into every file it writes (two machines' files would differ), both run only on
//! images whose distro class is RHEL or SUSE, and neither places or trusts a key. Every
//! repository here is plain files written before packages are installed, plus for zypper
//! and apk one command, run the same way on both paths.

use std::fmt;

use machine_core::{Error, Result};

use crate::check;
use crate::plan::{Plan, PlannedFile};
use crate::shell::q;

/// Where [`DnfRepository`] and [`ZypperRepository`] put signing keys (the directory
/// RHEL and Fedora keep theirs in).
pub const RPM_KEYS: &str = "/etc/pki/rpm-gpg";

/// Where apk reads trusted keys from (apk-keys(5)).
pub const APK_KEYS: &str = "/etc/apk/keys";

/// The list of repositories apk reads (apk-repositories(5)).
pub const APK_REPOSITORIES: &str = "/etc/apk/repositories";

/// A dnf/yum repository and the key its packages are signed with.
///
/// - Files: the armored key at `/etc/pki/rpm-gpg/RPM-GPG-KEY-<id>` (0644) and
///   `/etc/yum.repos.d/<id>.repo` (0644) holding `[<id>]`, `name`, `baseurl`,
///   `enabled=1`, `gpgcheck=1` and `gpgkey=file://` that key, so only packages signed by
///   it install from this repository. `dnf -y`/`yum -y` (as the [`crate::Packages`]
///   recipe and cloud-init run them) import the key into rpm at the first install from
///   the repository.
/// - Both files are written before packages are installed: cloud-init's init-stage
///   `write_files` coupled, the first steps decoupled.
/// - Rerun: the files are written again only when they changed.
/// - Refuses: an id that is not a plain file name, a name on several lines, a base URL
///   that is not http(s) or holds spaces, a key that is not an armored OpenPGP public
///   key block.
#[derive(Clone, PartialEq, Eq)]
pub struct DnfRepository {
    /// The repository id (`[id]`), also the stem of its files.
    pub id: String,
    /// The human-readable name (`name=`).
    pub name: String,
    /// The base URL; dnf's `$releasever` and `$basearch` are allowed.
    pub baseurl: String,
    /// The ASCII-armored public key (`-----BEGIN PGP PUBLIC KEY BLOCK-----`).
    pub key: String,
}

/// A zypper repository and the key its metadata and packages are signed with.
///
/// - Files: `/etc/zypp/repos.d/<id>.repo` (0644) with `[<id>]`, `name`, `enabled=1`,
///   `autorefresh=1`, `baseurl`, `type=rpm-md`, `gpgcheck=1` and `gpgkey=file://` the
///   key, and the armored key at `/etc/pki/rpm-gpg/RPM-GPG-KEY-<id>` (0644).
/// - The key is imported with `rpm --import` before packages are installed: zypper run
///   non-interactively (as cloud-init runs it) refuses a repository signed by a key rpm
///   does not trust. One command writes the key and imports it; coupled it is a
///   `bootcmd` entry run once per instance (bootcmd runs before `write_files`, hence
///   the key written by the command itself), decoupled the first steps.
/// - Rerun: the repository file is written again only when it changed; the key command
///   runs again only when the key changed (importing a key rpm has is a no-op).
/// - Refuses: as [`DnfRepository`].
#[derive(Clone, PartialEq, Eq)]
pub struct ZypperRepository {
    /// The repository alias (`[id]`), also the stem of its files.
    pub id: String,
    /// The human-readable name (`name=`).
    pub name: String,
    /// The base URL; zypper's `$releasever` and `$basearch` are allowed.
    pub baseurl: String,
    /// The ASCII-armored public key (`-----BEGIN PGP PUBLIC KEY BLOCK-----`).
    pub key: String,
}

/// An apk repository and the key its index is signed with.
///
/// - The key goes to `/etc/apk/keys/<key_name>` (0644): apk finds the key of a
///   signature by that file name, so it must be the name the repository signs with
///   (such as `alpine-devel@lists.alpinelinux.org-6165ee59.rsa.pub`). Written before
///   packages: init-stage `write_files` coupled, a first step decoupled.
/// - The URL is one line of `/etc/apk/repositories`, appended when missing (the file
///   is shared with the image's own repositories, so it is never rewritten). Coupled,
///   a `bootcmd` entry run once per instance; decoupled, a first step; the same guarded
///   command on both paths.
/// - Rerun: the key is written again only when it changed; the line is never added
///   twice. Removing the recipe removes neither.
/// - Refuses: a key name that is not a plain file name ending in `.pub`, a URL that is
///   not http(s) or holds spaces, a key that is not a PEM public key.
#[derive(Clone, PartialEq, Eq)]
pub struct ApkRepository {
    /// The repository URL, such as `https://dl-cdn.alpinelinux.org/alpine/v3.20/community`.
    pub url: String,
    /// The key's file name in `/etc/apk/keys`.
    pub key_name: String,
    /// The PEM public key (`-----BEGIN PUBLIC KEY-----`).
    pub key: String,
}

// Keys are public but long: their size is enough to tell them apart in logs.
impl fmt::Debug for DnfRepository {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DnfRepository")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("baseurl", &self.baseurl)
            .field("key", &format_args!("{} bytes", self.key.len()))
            .finish()
    }
}

impl fmt::Debug for ZypperRepository {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZypperRepository")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("baseurl", &self.baseurl)
            .field("key", &format_args!("{} bytes", self.key.len()))
            .finish()
    }
}

impl fmt::Debug for ApkRepository {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApkRepository")
            .field("url", &self.url)
            .field("key_name", &self.key_name)
            .field("key", &format_args!("{} bytes", self.key.len()))
            .finish()
    }
}

/// The path of the key of the RPM repository `id`.
fn rpm_key_path(id: &str) -> String {
    format!("{RPM_KEYS}/RPM-GPG-KEY-{id}")
}

/// `s` ending with one newline.
fn with_newline(s: &str) -> String {
    let mut s = s.to_owned();
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s
}

/// The checks shared by both RPM repositories.
fn check_rpm(id: &str, name: &str, baseurl: &str, key: &str) -> Result<()> {
    check::plain_name("id", id)?;
    check::one_line("name", name, "a repository name")?;
    check::repository_url("baseurl", baseurl, true)?;
    check::pgp_public_key("key", key)
}

impl DnfRepository {
    /// The repository `id` at `baseurl`, signed by `key`; its name is its id.
    pub fn new(id: impl Into<String>, baseurl: impl Into<String>, key: impl Into<String>) -> Self {
        let id = id.into();
        DnfRepository {
            name: id.clone(),
            id,
            baseurl: baseurl.into(),
            key: key.into(),
        }
    }

    /// Sets the human-readable name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The path of the key.
    pub fn key_path(&self) -> String {
        rpm_key_path(&self.id)
    }

    /// The path of the repository file.
    pub fn repo_path(&self) -> String {
        format!("/etc/yum.repos.d/{}.repo", self.id)
    }

    /// The repository file.
    pub fn repo_file(&self) -> String {
        format!(
            "[{}]\nname={}\nbaseurl={}\nenabled=1\ngpgcheck=1\ngpgkey=file://{}\n",
            self.id,
            self.name,
            self.baseurl,
            self.key_path()
        )
    }

    pub(crate) fn check(&self) -> Result<()> {
        check_rpm(&self.id, &self.name, &self.baseurl, &self.key)
    }

    pub(crate) fn plan(&self, plan: &mut Plan, field: &str) -> Result<()> {
        let field = format!("{field}.id");
        plan.add_early_file(root_file(self.key_path(), with_newline(&self.key)), &field)?;
        plan.add_early_file(root_file(self.repo_path(), self.repo_file()), &field)
    }
}

impl ZypperRepository {
    /// The repository `id` at `baseurl`, signed by `key`; its name is its id.
    pub fn new(id: impl Into<String>, baseurl: impl Into<String>, key: impl Into<String>) -> Self {
        let id = id.into();
        ZypperRepository {
            name: id.clone(),
            id,
            baseurl: baseurl.into(),
            key: key.into(),
        }
    }

    /// Sets the human-readable name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The path of the key.
    pub fn key_path(&self) -> String {
        rpm_key_path(&self.id)
    }

    /// The path of the repository file.
    pub fn repo_path(&self) -> String {
        format!("/etc/zypp/repos.d/{}.repo", self.id)
    }

    /// The repository file.
    pub fn repo_file(&self) -> String {
        format!(
            "[{}]\nname={}\nenabled=1\nautorefresh=1\nbaseurl={}\ntype=rpm-md\ngpgcheck=1\ngpgkey=file://{}\n",
            self.id,
            self.name,
            self.baseurl,
            self.key_path()
        )
    }

    pub(crate) fn check(&self) -> Result<()> {
        check_rpm(&self.id, &self.name, &self.baseurl, &self.key)
    }

    pub(crate) fn plan(&self, plan: &mut Plan, field: &str) -> Result<()> {
        let field = format!("{field}.id");
        // The key path is claimed like a file, so two recipes cannot write it.
        plan.claim_path(&self.key_path(), &field)?;
        plan.add_early_file(root_file(self.repo_path(), self.repo_file()), &field)?;
        let key = q(&self.key_path());
        let tmp = q(&format!("{}.recipes-tmp", self.key_path()));
        plan.add_early_command(&format!(
            "command -v rpm >/dev/null || {{ echo 'rpm not found: repository {id} is for the zypper family' >&2; exit 1; }}\n\
             mkdir -p {RPM_KEYS}\n\
             printf '%s' {content} > {tmp}\n\
             chmod 0644 {tmp}\n\
             mv -f {tmp} {key}\n\
             rpm --import {key}\n",
            id = self.id,
            content = q(&with_newline(&self.key)),
        ));
        Ok(())
    }
}

impl ApkRepository {
    /// The repository at `url`, its index signed by the key `key_name` (`key`).
    pub fn new(
        url: impl Into<String>,
        key_name: impl Into<String>,
        key: impl Into<String>,
    ) -> Self {
        ApkRepository {
            url: url.into(),
            key_name: key_name.into(),
            key: key.into(),
        }
    }

    /// The path of the key.
    pub fn key_path(&self) -> String {
        format!("{APK_KEYS}/{}", self.key_name)
    }

    pub(crate) fn check(&self) -> Result<()> {
        check::repository_url("url", &self.url, false)?;
        check::plain_name("key_name", &self.key_name)?;
        if !self.key_name.ends_with(".pub") {
            return Err(Error::invalid_spec(
                "key_name",
                format!(
                    "{:?} does not end in .pub: apk looks keys up by the name the repository signs with, such as name-5d5f2a7e.rsa.pub",
                    self.key_name
                ),
            ));
        }
        let key = self.key.trim();
        if !key.starts_with("-----BEGIN PUBLIC KEY-----")
            || !key.ends_with("-----END PUBLIC KEY-----")
        {
            return Err(Error::invalid_spec(
                "key",
                "is not a PEM public key (-----BEGIN PUBLIC KEY----- ... -----END PUBLIC KEY-----)",
            ));
        }
        Ok(())
    }

    pub(crate) fn plan(&self, plan: &mut Plan, field: &str) -> Result<()> {
        plan.add_early_file(
            root_file(self.key_path(), with_newline(&self.key)),
            &format!("{field}.key_name"),
        )?;
        if plan.apk_urls.contains(&self.url) {
            return Err(Error::invalid_spec(
                format!("{field}.url"),
                format!("{} is added by two recipes of the layer", self.url),
            ));
        }
        plan.apk_urls.push(self.url.clone());
        // A missing final newline would glue the line to the last one.
        plan.add_early_command(&format!(
            "f={APK_REPOSITORIES}\nl={}\nmkdir -p /etc/apk\n[ -e \"$f\" ] || : > \"$f\"\nif ! grep -qxF -- \"$l\" \"$f\"; then\n  if [ -s \"$f\" ] && [ -n \"$(tail -c 1 \"$f\")\" ]; then echo >> \"$f\"; fi\n  printf '%s\\n' \"$l\" >> \"$f\"\nfi\n",
            q(&self.url)
        ));
        Ok(())
    }
}

/// A root-owned 0644 file.
fn root_file(path: String, content: String) -> PlannedFile {
    PlannedFile {
        path,
        content: content.into_bytes(),
        mode: 0o644,
        owner: None,
    }
}
