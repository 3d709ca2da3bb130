//! Which operating system a machine runs, from `/etc/os-release`, so a layer can pick
//! its package manager.

use std::collections::BTreeMap;

use machine_core::{Error, Result, Transport};

/// The fields of `os-release(5)` a layer needs, and all the others.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OsRelease {
    /// `ID`, such as `debian`, `ubuntu`, `rhel`, `alpine`.
    pub id: String,
    /// `ID_LIKE`, split on spaces (`["rhel", "fedora"]` on Rocky Linux).
    pub id_like: Vec<String>,
    /// `VERSION_ID`, such as `12` or `22.04`.
    pub version_id: Option<String>,
    /// `PRETTY_NAME`.
    pub pretty_name: Option<String>,
    /// Every field as read.
    pub fields: BTreeMap<String, String>,
}

/// The package manager of a distribution family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackageManager {
    /// Debian, Ubuntu and derivatives.
    Apt,
    /// Fedora, RHEL 8+ and derivatives.
    Dnf,
    /// RHEL 7, CentOS 7, Amazon Linux 2.
    Yum,
    /// openSUSE and SLES.
    Zypper,
    /// Alpine.
    Apk,
    /// Arch.
    Pacman,
}

impl OsRelease {
    /// Parses the text of an os-release file (shell-style `KEY=value` lines, values
    /// possibly quoted). A line that is not an assignment is an error naming its number.
    pub fn parse(text: &str) -> Result<Self> {
        let mut fields = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = || {
                Error::invalid_spec(
                    format!("os-release line {}", n + 1),
                    format!("{line:?} is not KEY=value"),
                )
            };
            let (key, value) = line.split_once('=').ok_or_else(bad)?;
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(bad());
            }
            let value = if value.is_empty() {
                String::new()
            } else {
                shlex::split(value).ok_or_else(bad)?.join(" ")
            };
            fields.insert(key.to_owned(), value);
        }
        let id = fields
            .get("ID")
            .cloned()
            .unwrap_or_else(|| "linux".to_owned());
        Ok(OsRelease {
            id,
            id_like: fields
                .get("ID_LIKE")
                .map(|v| v.split_whitespace().map(str::to_owned).collect())
                .unwrap_or_default(),
            version_id: fields.get("VERSION_ID").cloned(),
            pretty_name: fields.get("PRETTY_NAME").cloned(),
            fields,
        })
    }

    /// The package manager for this distribution, by `ID` and then `ID_LIKE`.
    pub fn package_manager(&self) -> Option<PackageManager> {
        let old_rhel = self
            .version_id
            .as_deref()
            .is_some_and(|v| v.starts_with('7') || v == "2");
        std::iter::once(self.id.as_str())
            .chain(self.id_like.iter().map(String::as_str))
            .find_map(|id| {
                Some(match id {
                    "debian" | "ubuntu" => PackageManager::Apt,
                    "fedora" => PackageManager::Dnf,
                    "rhel" | "centos" | "rocky" | "almalinux" | "amzn" | "ol" => {
                        if old_rhel {
                            PackageManager::Yum
                        } else {
                            PackageManager::Dnf
                        }
                    }
                    "opensuse" | "suse" | "sles" | "opensuse-leap" | "opensuse-tumbleweed" => {
                        PackageManager::Zypper
                    }
                    "alpine" => PackageManager::Apk,
                    "arch" => PackageManager::Pacman,
                    _ => return None,
                })
            })
    }
}

/// Reads `/etc/os-release` (or `/usr/lib/os-release`) over `transport`.
pub async fn detect(transport: &dyn Transport) -> Result<OsRelease> {
    for path in ["/etc/os-release", "/usr/lib/os-release"] {
        if let Some(bytes) = transport.read_file(path, 64 * 1024).await? {
            return OsRelease::parse(&String::from_utf8_lossy(&bytes));
        }
    }
    Err(Error::not_found(
        "neither /etc/os-release nor /usr/lib/os-release exists",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_quoted_values_and_picks_package_managers() {
        let debian = OsRelease::parse("PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\nVERSION_ID=\"12\"\nID=debian\n").unwrap();
        assert_eq!(debian.id, "debian");
        assert_eq!(debian.version_id.as_deref(), Some("12"));
        assert_eq!(
            debian.pretty_name.as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(debian.package_manager(), Some(PackageManager::Apt));
        let rocky =
            OsRelease::parse("ID=\"rocky\"\nID_LIKE=\"rhel centos fedora\"\nVERSION_ID='9.3'\n")
                .unwrap();
        assert_eq!(rocky.package_manager(), Some(PackageManager::Dnf));
        let mint = OsRelease::parse("ID=linuxmint\nID_LIKE=\"ubuntu debian\"\n").unwrap();
        assert_eq!(mint.package_manager(), Some(PackageManager::Apt));
        assert_eq!(
            OsRelease::parse("ID=plan9\n").unwrap().package_manager(),
            None
        );
    }

    #[test]
    fn malformed_lines_are_named() {
        let e = OsRelease::parse("ID=debian\nthis is not it\n").unwrap_err();
        assert_eq!(e.field(), Some("os-release line 2"));
        let e = OsRelease::parse("ID=\"unterminated\n").unwrap_err();
        assert_eq!(e.field(), Some("os-release line 1"));
    }
}
