//! Pre-generated SSH host keys: the private half goes into the user data's `ssh_keys`,
//! the public half into the machine's access info, so the SSH step pins the key and
//! never trusts on first use.

use std::fmt;

use machine_core::{
    Access, CoupledSoftware, Error, MachineName, MachineSpec, Result, Software, UserDataFormat,
    UserDataPart,
};
use sha2::{Digest, Sha256};
use ssh_key::private::{Ed25519Keypair, KeypairData};
use ssh_key::{HashAlg, LineEnding, PrivateKey};

use crate::model::SshHostKeys;
use crate::secret::Secret;

/// An ed25519 host key pair made on this machine from the operating system's random
/// source. Debug shows only the public key's fingerprint.
#[derive(Clone)]
pub struct HostKey {
    private: Secret,
    public: String,
    fingerprint: String,
}

impl HostKey {
    /// Generates a key pair; `comment` ends the public key line (the host name is a
    /// good choice).
    pub fn generate_ed25519(comment: &str) -> Result<Self> {
        let mut seed = zeroize::Zeroizing::new([0u8; 32]);
        getrandom::fill(seed.as_mut_slice())
            .map_err(|e| Error::permanent(format!("no OS randomness for a host key: {e}")))?;
        Self::from_seed(&seed, comment)
    }

    fn from_seed(seed: &[u8; 32], comment: &str) -> Result<Self> {
        let pair = Ed25519Keypair::from_seed(seed);
        let key = PrivateKey::new(KeypairData::Ed25519(pair), comment)
            .map_err(|e| Error::permanent(format!("cannot build host key: {e}")))?;
        let private = key
            .to_openssh(LineEnding::LF)
            .map_err(|e| Error::permanent(format!("cannot encode host key: {e}")))?;
        let public = key
            .public_key()
            .to_openssh()
            .map_err(|e| Error::permanent(format!("cannot encode host key: {e}")))?;
        Ok(HostKey {
            private: Secret::new(private.as_str()),
            public,
            fingerprint: key.public_key().fingerprint(HashAlg::Sha256).to_string(),
        })
    }

    /// The public key line (`ssh-ed25519 AAAA... comment`).
    pub fn public(&self) -> &str {
        &self.public
    }

    /// The SHA-256 fingerprint as `ssh-keygen -l` prints it (`SHA256:...`).
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The `ssh_keys` entry for a cloud-config (cloud-init then installs this key
    /// instead of generating any).
    pub fn ssh_keys(&self) -> SshHostKeys {
        SshHostKeys {
            ed25519_private: Some(self.private.clone()),
            ed25519_public: Some(self.public.clone()),
            ..SshHostKeys::default()
        }
    }

    /// Adds the public key to `access.host_keys`, for the SSH step to pin.
    pub fn pin(&self, access: &mut Access) {
        if !access.host_keys.contains(&self.public) {
            access.host_keys.push(self.public.clone());
        }
    }
}

impl fmt::Debug for HostKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostKey")
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

/// Host keys derived per machine from one master secret: the same secret and machine
/// name always give the same key, so every replica of a controller, and a process
/// restarted after a crash, pins the key the machine was created with. Nothing is
/// stored. Keep the master secret like any credential.
///
/// Add it as a coupled layer: it contributes the machine's `ssh_keys`, and names the
/// public key ([`CoupledSoftware, Software::host_keys`]) so the composer puts it in the
/// machine's access info and the SSH step pins it:
///
/// ```
/// use std::sync::Arc;
/// use bootstrap_cloudinit::{DerivedHostKeys, Secret};
/// use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
/// use machine_core::Composer;
/// # fn main() -> machine_core::Result<()> {
/// let keys = DerivedHostKeys::new(Secret::new("a master secret of at least 32 bytes!"))?;
/// let cloud = SimCloud::new();
/// let provider = Arc::new(SimProvider::new(cloud.clone(), SimConfig::default())?);
/// let composer = Composer::builder(provider)
///     .coupled(Arc::new(keys.clone()))
///     .connector(Arc::new(SimConnector::new(cloud)))
///     .build()?;
/// # let _ = composer;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct DerivedHostKeys {
    master: Secret,
}

impl fmt::Debug for DerivedHostKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DerivedHostKeys([REDACTED])")
    }
}

impl DerivedHostKeys {
    /// Keys derived from `master`, which must hold at least 32 bytes.
    pub fn new(master: Secret) -> Result<Self> {
        if master.expose().len() < 32 {
            return Err(Error::invalid_spec(
                "hostKeys.master",
                "the master secret must hold at least 32 bytes",
            ));
        }
        Ok(DerivedHostKeys { master })
    }

    /// The host key of the machine named `name`.
    pub fn for_machine(&self, name: &MachineName) -> Result<HostKey> {
        // Domain-separated SHA-256 of the secret and the name: a distinct 32-byte seed
        // per machine, not recoverable from the public key.
        let mut h = Sha256::new();
        h.update(b"bootstrap-cloudinit host key v1\0");
        h.update(self.master.expose().as_bytes());
        h.update(b"\0");
        h.update(name.as_str().as_bytes());
        let seed = zeroize::Zeroizing::new(<[u8; 32]>::from(h.finalize()));
        HostKey::from_seed(&seed, name.as_str())
    }
}

impl Software for DerivedHostKeys {
    fn name(&self) -> &str {
        "host-keys"
    }
}

/// Coupled only: the keys are written by cloud-init at first boot.
impl CoupledSoftware for DerivedHostKeys {
    fn user_data_parts(&self, spec: &MachineSpec) -> Result<Vec<UserDataPart>> {
        let key = self.for_machine(&spec.name)?;
        let config = crate::model::CloudConfig {
            ssh_keys: Some(key.ssh_keys()),
            ..Default::default()
        };
        Ok(vec![
            UserDataPart::new(
                UserDataFormat::CloudConfig,
                "host-keys.cloud-config.yaml",
                crate::render::render(&config)?,
            )
            .with_header("Merge-Type", crate::merge::MERGE_TYPE),
        ])
    }

    fn host_keys(&self, spec: &MachineSpec) -> Result<Vec<String>> {
        Ok(vec![self.for_machine(&spec.name)?.public().to_owned()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_and_debug_shows_only_the_fingerprint() {
        let a = HostKey::generate_ed25519("web-1").unwrap();
        let b = HostKey::generate_ed25519("web-1").unwrap();
        assert_ne!(a.public(), b.public());
        assert!(a.public().starts_with("ssh-ed25519 "), "{}", a.public());
        assert!(a.public().ends_with(" web-1"));
        let shown = format!("{a:?}");
        assert!(shown.contains("SHA256:"), "{shown}");
        assert!(!shown.contains("PRIVATE"), "{shown}");
        let keys = a.ssh_keys();
        assert!(
            keys.ed25519_private
                .unwrap()
                .expose()
                .starts_with("-----BEGIN OPENSSH PRIVATE KEY-----")
        );
        let mut access = Access::default();
        a.pin(&mut access);
        a.pin(&mut access);
        assert_eq!(access.host_keys, [a.public().to_owned()]);
    }

    #[test]
    fn derived_keys_are_stable_per_name_and_distinct_across_names() {
        let k = DerivedHostKeys::new(Secret::new("0123456789abcdef0123456789abcdef")).unwrap();
        let a = MachineName::new("web-1").unwrap();
        let b = MachineName::new("web-2").unwrap();
        assert_eq!(
            k.for_machine(&a).unwrap().public(),
            k.for_machine(&a).unwrap().public()
        );
        assert_ne!(
            k.for_machine(&a).unwrap().public(),
            k.for_machine(&b).unwrap().public()
        );
        let other =
            DerivedHostKeys::new(Secret::new("another secret, also 32 bytes long")).unwrap();
        assert_ne!(
            k.for_machine(&a).unwrap().public(),
            other.for_machine(&a).unwrap().public()
        );
        assert!(DerivedHostKeys::new(Secret::new("short")).is_err());
        assert!(!format!("{k:?}").contains("0123"));
    }
}
