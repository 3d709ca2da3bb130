//! [`KubeVersion`]: a Kubernetes release `x.y.z`, and what depends on it.

use std::fmt;

use machine_core::{Error, Result, shown};

/// A Kubernetes release such as `1.31.4` (a leading `v` is accepted and dropped).
///
/// It picks the package repository (pkgs.k8s.io has one per minor version), the pinned
/// package versions and the kubeadm configuration API: `kubeadm.k8s.io/v1beta4` from
/// 1.31 on, `v1beta3` before (kubeadm 1.31 still reads v1beta3, but 1.22 to 1.30 do not
/// read v1beta4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubeVersion {
    /// The major version (1).
    pub major: u32,
    /// The minor version, which names the package repository.
    pub minor: u32,
    /// The patch release.
    pub patch: u32,
}

/// The kubeadm configuration API a version reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeadmApi {
    /// `kubeadm.k8s.io/v1beta3` (Kubernetes 1.22 to 1.30).
    V1Beta3,
    /// `kubeadm.k8s.io/v1beta4` (Kubernetes 1.31 on): extra arguments are lists of
    /// `{name, value}` instead of maps.
    V1Beta4,
}

impl KubeadmApi {
    /// The `apiVersion` of the documents.
    pub fn api_version(self) -> &'static str {
        match self {
            KubeadmApi::V1Beta3 => "kubeadm.k8s.io/v1beta3",
            KubeadmApi::V1Beta4 => "kubeadm.k8s.io/v1beta4",
        }
    }
}

/// The oldest release whose packages pkgs.k8s.io carries and that reads v1beta3.
const OLDEST_MINOR: u32 = 24;

impl KubeVersion {
    /// Parses `x.y.z` (or `vx.y.z`); `field` names the value in the error. Only 1.x
    /// releases from 1.24 on are accepted: older ones have no pkgs.k8s.io repository.
    pub fn parse(field: &str, text: &str) -> Result<Self> {
        let bad = || {
            Error::invalid_spec(
                field,
                format!(
                    "{} is not a Kubernetes version like 1.31.4 (major.minor.patch, digits only)",
                    shown(text)
                ),
            )
        };
        let body = text.strip_prefix('v').unwrap_or(text);
        let parts: Vec<&str> = body.split('.').collect();
        if parts.len() != 3 {
            return Err(bad());
        }
        let mut n = [0u32; 3];
        for (slot, part) in n.iter_mut().zip(&parts) {
            let digits_only = !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
            let no_leading_zero = *part == "0" || !part.starts_with('0');
            if !digits_only || !no_leading_zero || part.len() > 4 {
                return Err(bad());
            }
            *slot = part.parse().map_err(|_| bad())?;
        }
        let v = KubeVersion {
            major: n[0],
            minor: n[1],
            patch: n[2],
        };
        if v.major != 1 || v.minor < OLDEST_MINOR {
            return Err(Error::invalid_spec(
                field,
                format!(
                    "{v} is not supported: Kubernetes 1.{OLDEST_MINOR}.0 or later is needed (pkgs.k8s.io has no older packages)"
                ),
            ));
        }
        Ok(v)
    }

    /// The kubeadm configuration API this version's kubeadm is given.
    pub fn kubeadm_api(self) -> KubeadmApi {
        if (self.major, self.minor) >= (1, 31) {
            KubeadmApi::V1Beta4
        } else {
            KubeadmApi::V1Beta3
        }
    }

    /// `v1.31`, as pkgs.k8s.io names the repository of a minor version.
    pub fn minor_channel(self) -> String {
        format!("v{}.{}", self.major, self.minor)
    }
}

/// `1.31.4`, without the `v` (the packages' form; kubeadm's `kubernetesVersion` adds it).
impl fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_pick_the_api() {
        let v = KubeVersion::parse("version", "1.31.4").unwrap();
        assert_eq!(v.to_string(), "1.31.4");
        assert_eq!(v.kubeadm_api(), KubeadmApi::V1Beta4);
        assert_eq!(v.minor_channel(), "v1.31");
        let v = KubeVersion::parse("version", "v1.30.8").unwrap();
        assert_eq!(v.kubeadm_api(), KubeadmApi::V1Beta3);
        for bad in [
            "1.31",
            "1.31.4.1",
            "1.31.x",
            "",
            "1.031.4",
            " 1.31.4",
            "1.31.4-rc.0",
            "2.0.0",
            "1.20.1",
        ] {
            let e = KubeVersion::parse("kubeadm.version", bad).unwrap_err();
            assert_eq!(e.field(), Some("kubeadm.version"), "{bad:?}");
        }
    }
}
