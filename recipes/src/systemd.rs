//! systemd units and drop-ins.

use machine_core::{Error, Result};

use crate::check;
use crate::plan::{Plan, PlannedFile};
use crate::shell::{digest, q};

/// Where units and drop-ins are written.
pub const UNIT_DIR: &str = "/etc/systemd/system";

/// A drop-in of a unit: `/etc/systemd/system/<unit>.d/<name>.conf`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropIn {
    /// The file name; `.conf` is added when missing.
    pub name: String,
    /// The content.
    pub content: String,
}

impl DropIn {
    /// A drop-in named `name`.
    pub fn new(name: impl Into<String>, content: impl Into<String>) -> Self {
        DropIn {
            name: name.into(),
            content: content.into(),
        }
    }

    fn file_name(&self) -> String {
        if self.name.ends_with(".conf") {
            self.name.clone()
        } else {
            format!("{}.conf", self.name)
        }
    }
}

/// A systemd unit: its file (or a unit a package ships, when `content` is `None`), its
/// drop-ins, enabled, and started or restarted when any of its files change.
///
/// - Files: `write_files` coupled, uploads decoupled (mode 0644, root).
/// - Enabled: the symlinks `systemctl enable` makes for the `WantedBy=` and
///   `RequiredBy=` of the unit's `[Install]` section
///   (`/etc/systemd/system/<target>.wants/<unit>`), made with `ln -sfn` on both paths,
///   so that it works on an image whose systemd is not running (cloud-init's first
///   boot, a chroot). A unit without `content` is enabled with `systemctl enable`.
/// - Started: when systemd runs (`/run/systemd/system` exists), `systemctl
///   daemon-reload` and `systemctl restart <unit>` after its files are written; the
///   command carries a digest of every file, so a rerun restarts only after a change.
///   Without a running systemd (a container, an image build) nothing is started.
/// - Refuses: a name that is not a systemd unit name; a drop-in name that is not a plain
///   file name; `enabled` with content whose `[Install]` section names no target, or on
///   a template unit (`name@.service`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemdUnit {
    /// The unit name, such as `app.service`.
    pub name: String,
    /// The unit file; `None` for a unit that a package installs.
    pub content: Option<String>,
    /// Drop-ins.
    pub drop_ins: Vec<DropIn>,
    /// Enable the unit.
    pub enabled: bool,
    /// Start or restart it when its files change and systemd runs.
    pub restart: bool,
}

impl SystemdUnit {
    /// A unit with `content`, enabled and (re)started.
    pub fn new(name: impl Into<String>, content: impl Into<String>) -> Self {
        SystemdUnit {
            name: name.into(),
            content: Some(content.into()),
            drop_ins: Vec::new(),
            enabled: true,
            restart: true,
        }
    }

    /// An existing unit (installed by a package) changed only by drop-ins; restarted
    /// when they change, not enabled.
    pub fn existing(name: impl Into<String>) -> Self {
        SystemdUnit {
            name: name.into(),
            content: None,
            drop_ins: Vec::new(),
            enabled: false,
            restart: true,
        }
    }

    /// Adds a drop-in.
    pub fn with_drop_in(mut self, drop_in: DropIn) -> Self {
        self.drop_ins.push(drop_in);
        self
    }

    /// Sets whether the unit is enabled.
    pub fn enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// Sets whether the unit is (re)started.
    pub fn restarted(mut self, restart: bool) -> Self {
        self.restart = restart;
        self
    }

    /// The targets of `WantedBy=` (as `.wants`) and `RequiredBy=` (as `.requires`) in
    /// the `[Install]` section of `content`.
    fn install_links(content: &str) -> Vec<(String, &'static str)> {
        let mut section = "";
        let mut out = Vec::new();
        for line in content.lines() {
            let line = line.trim();
            if line.starts_with('[') {
                section = line;
                continue;
            }
            if section != "[Install]" {
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let dir = match key.trim() {
                "WantedBy" => "wants",
                "RequiredBy" => "requires",
                _ => continue,
            };
            out.extend(value.split_whitespace().map(|t| (t.to_owned(), dir)));
        }
        out
    }

    pub(crate) fn check(&self) -> Result<()> {
        check::unit_name("name", &self.name)?;
        // systemd stops reading a unit file at a NUL byte, and cloud-init cannot carry
        // one in a YAML string: what follows it would silently vanish.
        if self.content.as_ref().is_some_and(|c| c.contains('\0')) {
            return Err(Error::invalid_spec("content", "holds a NUL byte"));
        }
        for (i, d) in self.drop_ins.iter().enumerate() {
            check::plain_name(&format!("drop_ins[{i}].name"), &d.name)?;
            if d.content.contains('\0') {
                return Err(Error::invalid_spec(
                    format!("drop_ins[{i}].content"),
                    "holds a NUL byte",
                ));
            }
        }
        if self.enabled {
            if self.name.contains("@.") {
                return Err(Error::invalid_spec(
                    "enabled",
                    format!(
                        "{} is a template unit; enable an instance (name@instance.service)",
                        self.name
                    ),
                ));
            }
            if let Some(content) = &self.content {
                let links = Self::install_links(content);
                if links.is_empty() {
                    return Err(Error::invalid_spec(
                        "enabled",
                        "the unit's [Install] section names no WantedBy= or RequiredBy= target",
                    ));
                }
                for (t, _) in &links {
                    check::unit_name("content", t)?;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn plan(&self, plan: &mut Plan, field: &str) -> Result<()> {
        let unit_path = format!("{UNIT_DIR}/{}", self.name);
        let names: Vec<String> = self.drop_ins.iter().map(DropIn::file_name).collect();
        let mut digest_parts: Vec<&[u8]> = vec![self.name.as_bytes()];
        if let Some(content) = &self.content {
            plan.add_file(
                PlannedFile {
                    path: unit_path.clone(),
                    content: content.clone().into_bytes(),
                    mode: 0o644,
                    owner: None,
                },
                &format!("{field}.name"),
            )?;
            digest_parts.push(content.as_bytes());
        }
        for (i, (d, file_name)) in self.drop_ins.iter().zip(&names).enumerate() {
            plan.add_file(
                PlannedFile {
                    path: format!("{UNIT_DIR}/{}.d/{file_name}", self.name),
                    content: d.content.clone().into_bytes(),
                    mode: 0o644,
                    owner: None,
                },
                &format!("{field}.drop_ins[{i}].name"),
            )?;
            digest_parts.push(file_name.as_bytes());
            digest_parts.push(d.content.as_bytes());
        }
        let unit = q(&self.name);
        let mut s = String::new();
        if self.enabled {
            match &self.content {
                Some(content) => {
                    for (target, dir) in Self::install_links(content) {
                        let d = q(&format!("{UNIT_DIR}/{target}.{dir}"));
                        // ln -sfn makes a new link even when it is there already.
                        s.push_str(&format!(
                            "mkdir -p {d}\n[ \"$(readlink {d}/{unit})\" = {u} ] || ln -sfn {u} {d}/{unit}\n",
                            u = q(&unit_path)
                        ));
                    }
                }
                None => s.push_str(&format!(
                    "systemctl is-enabled --quiet {unit} 2>/dev/null || systemctl enable {unit}\n"
                )),
            }
        }
        if self.restart {
            s.push_str(&format!(
                "# files {}\nif [ -d /run/systemd/system ]; then systemctl daemon-reload; systemctl restart {unit}; fi\n",
                digest(&digest_parts)
            ));
        }
        if !s.is_empty() {
            plan.commands.push(s);
        }
        Ok(())
    }
}
