//! Pre-generated SSH host keys: the private half goes into the user data's `ssh_keys`,
//! the public half into the machine's access info, so the SSH step pins the key and
//! never trusts on first use.

use std::fmt;

use machine_core::{Access, Error, Result};
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
        let pair = Ed25519Keypair::from_seed(&seed);
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
}
