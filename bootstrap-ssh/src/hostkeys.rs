//! Host-key policy: which server keys are trusted, and what happens with a new one.
//!
//! Verified by default. Keys pinned for a machine (from [`machine_core::Access::host_keys`]:
//! keys pre-generated into cloud-init, or fingerprints a provider reports) are checked
//! first; without pins, a known_hosts file decides. A key that differs from the one
//! expected is refused with both fingerprints in the error.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use machine_core::{Error, Result};
use russh::keys::ssh_key::Fingerprint;
use russh::keys::{HashAlg, PublicKey};

/// What to trust when a server presents its host key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostKeyPolicy {
    /// Trust only pinned keys or, without pins, keys in `known_hosts` (by default
    /// `~/.ssh/known_hosts`). An unknown host is refused. The default.
    Verify {
        /// The known_hosts file; `None` for `~/.ssh/known_hosts`.
        known_hosts: Option<PathBuf>,
    },
    /// Like [`HostKeyPolicy::Verify`], but the key of a host that has no entry at all in
    /// `known_hosts` (and no pins) is trusted and appended to that file (trust on first
    /// use, as OpenSSH's `StrictHostKeyChecking=accept-new`). A changed key is refused.
    AcceptNew {
        /// The file where new keys are recorded, and later checked.
        known_hosts: PathBuf,
    },
    /// Trust any key. Every connection logs a warning: this is open to a man in the
    /// middle, and only meant for throwaway test hosts.
    Insecure,
}

impl Default for HostKeyPolicy {
    fn default() -> Self {
        HostKeyPolicy::Verify { known_hosts: None }
    }
}

/// One trusted host key: either the public key itself or its SHA-256 fingerprint.
#[derive(Clone, PartialEq, Eq)]
pub enum HostKeyPin {
    /// A public key, parsed from OpenSSH format (`ssh-ed25519 AAAA... [comment]`).
    Key(Box<PublicKey>),
    /// A fingerprint as `ssh-keygen -l` prints it (`SHA256:base64`).
    Fingerprint(Fingerprint),
}

impl HostKeyPin {
    /// Parses an OpenSSH public key line or a `SHA256:` fingerprint. `field` names the
    /// input in the error (such as `access.hostKeys[0]`).
    pub fn parse(field: &str, text: &str) -> Result<Self> {
        let text = text.trim();
        if text.is_empty() {
            return Err(Error::invalid_spec(
                field,
                "is empty; expected an OpenSSH public key or a SHA256: fingerprint",
            ));
        }
        if let Some(rest) = text.strip_prefix("SHA256:") {
            return Fingerprint::from_str(text)
                .ok()
                .filter(|_| !rest.is_empty())
                .map(HostKeyPin::Fingerprint)
                .ok_or_else(|| {
                    Error::invalid_spec(
                        field,
                        format!("{text:?} is not a SHA256 fingerprint (SHA256: then 43 characters of unpadded base64)"),
                    )
                });
        }
        PublicKey::from_openssh(text)
            .map(|k| HostKeyPin::Key(Box::new(k)))
            .map_err(|e| {
                Error::invalid_spec(
                    field,
                    format!("not an OpenSSH public key (\"ssh-ed25519 AAAA...\") or SHA256: fingerprint: {e}"),
                )
            })
    }

    /// Parses each entry of `keys`, naming `field[i]` in errors.
    pub fn parse_all(field: &str, keys: &[String]) -> Result<Vec<Self>> {
        keys.iter()
            .enumerate()
            .map(|(i, k)| HostKeyPin::parse(&format!("{field}[{i}]"), k))
            .collect()
    }

    /// The SHA-256 fingerprint, as `ssh-keygen -l` prints it.
    pub fn fingerprint(&self) -> String {
        self.fp().to_string()
    }

    fn fp(&self) -> Fingerprint {
        match self {
            HostKeyPin::Key(k) => k.fingerprint(HashAlg::Sha256),
            HostKeyPin::Fingerprint(f) => *f,
        }
    }

    fn matches(&self, key: &PublicKey) -> bool {
        match self {
            HostKeyPin::Key(k) => k.key_data() == key.key_data(),
            HostKeyPin::Fingerprint(f) => *f == key.fingerprint(HashAlg::Sha256),
        }
    }
}

impl fmt::Debug for HostKeyPin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostKeyPin({})", self.fp())
    }
}

/// Checks the key a server presented against the policy and pins; the error says why
/// it was refused. `host` and `port` are the names the key is recorded under.
pub(crate) fn verify(
    policy: &HostKeyPolicy,
    pins: &[HostKeyPin],
    host: &str,
    port: u16,
    key: &PublicKey,
) -> Result<()> {
    let offered = describe(key);
    let peer = format!("{host}:{port}");
    if let HostKeyPolicy::Insecure = policy {
        tracing::warn!(peer, key = %offered, "host key NOT verified (insecure policy): open to a man in the middle");
        return Ok(());
    }
    if !pins.is_empty() {
        if pins.iter().any(|p| p.matches(key)) {
            return Ok(());
        }
        let expected: Vec<String> = pins.iter().map(|p| p.fingerprint()).collect();
        return Err(mismatch(
            &peer,
            &offered,
            &expected.join(", "),
            "the pinned keys",
        ));
    }
    let path = match policy {
        HostKeyPolicy::Verify {
            known_hosts: Some(p),
        }
        | HostKeyPolicy::AcceptNew { known_hosts: p } => p.clone(),
        HostKeyPolicy::Verify { known_hosts: None } => default_known_hosts()?,
        // Returned above; kept here so the match stays exhaustive.
        HostKeyPolicy::Insecure => return Ok(()),
    };
    let known = russh::keys::known_hosts::known_host_keys_path(host, port, &path).map_err(|e| {
        Error::permanent(format!("reading known_hosts {}: {e}", path.display()))
            .with_field("known_hosts")
    })?;
    if known.iter().any(|(_, k)| k.key_data() == key.key_data()) {
        return Ok(());
    }
    if !known.is_empty() {
        let expected: Vec<String> = known
            .iter()
            .map(|(line, k)| format!("{} (line {line})", describe(k)))
            .collect();
        return Err(mismatch(
            &peer,
            &offered,
            &expected.join(", "),
            &path.display().to_string(),
        ));
    }
    match policy {
        HostKeyPolicy::AcceptNew { known_hosts } => {
            russh::keys::known_hosts::learn_known_hosts_path(host, port, key, known_hosts)
                .map_err(|e| {
                    Error::permanent(format!(
                        "recording the new host key of {peer} in {}: {e}",
                        known_hosts.display()
                    ))
                })?;
            tracing::info!(peer, key = %offered, file = %known_hosts.display(), "new host key accepted and recorded (accept-new)");
            Ok(())
        }
        _ => Err(Error::permanent(format!(
            "host key of {peer} is unknown: {offered}; pin it in the machine's access.hostKeys, add it to {}, or opt in to accept-new",
            path.display()
        ))),
    }
}

fn mismatch(peer: &str, offered: &str, expected: &str, source: &str) -> Error {
    Error::permanent(format!(
        "HOST KEY MISMATCH for {peer}: the server offered {offered}, but {source} expect {expected}; nothing was run (a reinstalled host, or a man in the middle)"
    ))
}

fn describe(key: &PublicKey) -> String {
    format!("{} {}", key.algorithm(), key.fingerprint(HashAlg::Sha256))
}

fn default_known_hosts() -> Result<PathBuf> {
    std::env::var_os("HOME")
        .map(|h| Path::new(&h).join(".ssh/known_hosts"))
        .ok_or_else(|| {
            Error::invalid_spec("known_hosts", "HOME is not set; give a known_hosts path")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJdD7y3aLq454yWBdwLWbieU1ebz9/cu7/QEXn9OIeZJ test";

    #[test]
    fn pins_parse_keys_and_fingerprints() {
        let k = HostKeyPin::parse("pin", KEY).unwrap();
        let fp = k.fingerprint();
        let f = HostKeyPin::parse("pin", &fp).unwrap();
        assert_eq!(f.fingerprint(), k.fingerprint());
    }

    #[test]
    fn bad_pins_name_the_field() {
        for bad in [
            "",
            "SHA256:",
            "SHA256:not*base64",
            "SHA256:AAAA",
            "ssh-ed25519 AAAA",
            "hello",
        ] {
            let e = HostKeyPin::parse_all(
                "access.hostKeys",
                &[
                    "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU".into(),
                    bad.into(),
                ],
            )
            .unwrap_err();
            assert_eq!(e.field(), Some("access.hostKeys[1]"), "{bad:?}: {e}");
            assert_eq!(e.kind(), machine_core::ErrorKind::InvalidSpec);
        }
    }

    #[test]
    fn pinned_mismatch_shows_both_fingerprints() {
        let pin =
            HostKeyPin::parse("pin", "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU").unwrap();
        let key = PublicKey::from_openssh(KEY).unwrap();
        let e = verify(&HostKeyPolicy::default(), &[pin], "h", 22, &key).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU"),
            "{msg}"
        );
        assert!(
            msg.contains(&key.fingerprint(HashAlg::Sha256).to_string()),
            "{msg}"
        );
        assert!(!e.is_retryable());
    }

    #[test]
    fn accept_new_records_then_refuses_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kh");
        let policy = HostKeyPolicy::AcceptNew {
            known_hosts: file.clone(),
        };
        let key = PublicKey::from_openssh(KEY).unwrap();
        verify(&policy, &[], "10.0.0.1", 2222, &key).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains("[10.0.0.1]:2222"), "{text}");
        verify(
            &HostKeyPolicy::Verify {
                known_hosts: Some(file.clone()),
            },
            &[],
            "10.0.0.1",
            2222,
            &key,
        )
        .unwrap();
        let other = russh::keys::PrivateKey::random(
            &mut russh::keys::key::safe_rng(),
            russh::keys::Algorithm::Ed25519,
        )
        .unwrap();
        let e = verify(&policy, &[], "10.0.0.1", 2222, other.public_key()).unwrap_err();
        assert!(e.to_string().contains("MISMATCH"), "{e}");
        let e = verify(
            &HostKeyPolicy::Verify {
                known_hosts: Some(file),
            },
            &[],
            "10.0.0.9",
            22,
            &key,
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown"), "{e}");
    }
}
