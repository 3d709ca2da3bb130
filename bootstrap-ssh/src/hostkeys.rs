//! Host-key policy: which server keys are trusted, and what happens with a new one.
//!
//! Verified by default. Keys pinned for a machine (from [`machine_core::Access::host_keys`]:
//! keys pre-generated into cloud-init, or fingerprints a provider reports) are checked
//! first; without pins, a known_hosts file decides. A key that differs from the one
//! expected is refused with both fingerprints in the error.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use std::sync::atomic::{AtomicBool, Ordering};

use machine_core::{Error, Result};
use russh::Preferred;
use russh::keys::ssh_key::Fingerprint;
use russh::keys::ssh_key::certificate::CertType;
use russh::keys::{Algorithm, Certificate, HashAlg, PublicKey, PublicKeyOrCertificate};

use crate::known_hosts::{Entry, KnownHosts, Marker, lookup_name};

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
    /// Trust any key: open to a man in the middle, only for throwaway test hosts. Made
    /// only by [`HostKeyPolicy::insecure_accept_any`], so the opt-out reads as one; the
    /// first such connection of a process says so on stderr (whatever the log level),
    /// and every one logs a warning.
    #[non_exhaustive]
    Insecure,
}

impl HostKeyPolicy {
    /// Trusts any host key, verifying nothing (see [`HostKeyPolicy::Insecure`]).
    pub fn insecure_accept_any() -> Self {
        HostKeyPolicy::Insecure
    }
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

/// Checks what a server presented (a plain key or a host certificate) against the
/// policy and pins; the error says why it was refused. `host` and `port` are the names
/// the key is recorded under.
pub(crate) fn verify_presented(
    policy: &HostKeyPolicy,
    pins: &[HostKeyPin],
    host: &str,
    port: u16,
    presented: &PublicKeyOrCertificate,
) -> Result<()> {
    match presented {
        PublicKeyOrCertificate::PublicKey { key, .. } => verify(policy, pins, host, port, key),
        PublicKeyOrCertificate::Certificate(cert) => verify_cert(policy, pins, host, port, cert),
    }
}

/// Checks a plain host key against the policy and pins.
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
        insecure_notice(&peer, &offered);
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
    let path = known_hosts_path(policy)?;
    let file = load(&path)?;
    let name = lookup_name(host, port);
    let entries: Vec<&Entry> = file.matching(&name).collect();
    let same = |e: &&&Entry| e.key.as_ref().is_ok_and(|k| k.key_data() == key.key_data());
    if let Some(revoked) = entries
        .iter()
        .filter(|e| e.marker == Some(Marker::Revoked))
        .find(same)
    {
        return Err(revoked_error(&peer, &offered, &path, revoked.line));
    }
    let plain: Vec<&&Entry> = entries
        .iter()
        .filter(|e| e.marker.is_none() && e.key.is_ok())
        .collect();
    if plain.iter().any(same) {
        return Ok(());
    }
    if !plain.is_empty() {
        let expected: Vec<String> = plain
            .iter()
            .filter_map(|e| {
                Some(format!(
                    "{} (line {})",
                    describe(e.key.as_ref().ok()?),
                    e.line
                ))
            })
            .collect();
        return Err(mismatch(
            &peer,
            &offered,
            &expected.join(", "),
            &path.display().to_string(),
        ));
    }
    if let HostKeyPolicy::AcceptNew { known_hosts } = policy {
        russh::keys::known_hosts::learn_known_hosts_path(host, port, key, known_hosts).map_err(
            |e| {
                Error::permanent(format!(
                    "recording the new host key of {peer} in {}: {e}",
                    known_hosts.display()
                ))
            },
        )?;
        tracing::info!(peer, key = %offered, file = %known_hosts.display(), "new host key accepted and recorded (accept-new)");
        return Ok(());
    }
    let mut notes = String::new();
    for e in &entries {
        match (&e.key, e.marker) {
            (Err(why), _) => notes.push_str(&format!("; line {} names this host but its {why}", e.line)),
            (Ok(_), Some(Marker::CertAuthority)) => notes.push_str(&format!(
                "; line {} trusts host certificates signed by a CA, but the server presented a plain key",
                e.line
            )),
            _ => {}
        }
    }
    if !path.exists() {
        return Err(Error::permanent(format!(
            "host key of {peer} cannot be checked: the known_hosts file {} does not exist (the server offered {offered}); create it with the host's key, pin the key in the machine's access.hostKeys, or opt in to accept-new",
            path.display()
        )));
    }
    Err(Error::permanent(format!(
        "host key of {peer} is unknown: {offered}; pin it in the machine's access.hostKeys, add it to {}, or opt in to accept-new{notes}",
        path.display()
    )))
}

/// Checks a host certificate: it must be signed by a CA that an `@cert-authority` line
/// lists for this host, be a host certificate naming the host, be within its validity
/// period, and neither it nor its CA may be `@revoked`.
fn verify_cert(
    policy: &HostKeyPolicy,
    pins: &[HostKeyPin],
    host: &str,
    port: u16,
    cert: &Certificate,
) -> Result<()> {
    let peer = format!("{host}:{port}");
    let ca_fp = cert.signature_key().fingerprint(HashAlg::Sha256);
    let offered = format!(
        "a {} host certificate {:?} signed by CA {ca_fp}",
        cert.algorithm(),
        cert.key_id()
    );
    if let HostKeyPolicy::Insecure = policy {
        insecure_notice(&peer, &offered);
        return Ok(());
    }
    if !pins.is_empty() {
        return Err(Error::permanent(format!(
            "{peer}: the server presented {offered}, but this host's keys are pinned; certificates are checked only against @cert-authority lines of known_hosts"
        )));
    }
    let path = known_hosts_path(policy)?;
    let file = load(&path)?;
    let name = lookup_name(host, port);
    let entries: Vec<&Entry> = file.matching(&name).collect();
    for e in entries.iter().filter(|e| e.marker == Some(Marker::Revoked)) {
        if let Ok(k) = &e.key
            && (k.key_data() == cert.public_key() || k.key_data() == cert.signature_key())
        {
            return Err(revoked_error(&peer, &offered, &path, e.line));
        }
    }
    let Some(ca) = entries.iter().find(|e| {
        e.marker == Some(Marker::CertAuthority)
            && e.key
                .as_ref()
                .is_ok_and(|k| k.key_data() == cert.signature_key())
    }) else {
        return Err(Error::permanent(format!(
            "host certificate of {peer} refused: the server presented {offered}, but no @cert-authority line of {} lists that CA for {name}; nothing was run",
            path.display()
        )));
    };
    let refuse = |why: String| {
        Error::permanent(format!(
            "host certificate of {peer} refused: {offered} (CA trusted by {} line {}) {why}; nothing was run",
            path.display(),
            ca.line
        ))
    };
    cert.validate([&ca_fp])
        .map_err(|e| refuse(format!("does not verify: {e}")))?;
    if cert.cert_type() != CertType::Host {
        return Err(refuse(
            "is a user certificate, not a host certificate".into(),
        ));
    }
    let host_lc = host.to_ascii_lowercase();
    if !cert
        .valid_principals()
        .iter()
        .any(|p| p.to_ascii_lowercase() == host_lc)
    {
        return Err(refuse(format!(
            "is not valid for {host} (principals: {:?})",
            cert.valid_principals()
        )));
    }
    Ok(())
}

/// The algorithms to negotiate: russh's defaults (checked against OpenSSH 9's in the
/// crate documentation) without `ssh-rsa` host-key signatures (SHA-1), which OpenSSH
/// 8.8 and later refuse too, unless `ssh_rsa_sha1` opts in; host-key algorithms of
/// keys already known for this host first (so a server with several host keys
/// presents the one that can be checked, as OpenSSH does), and host certificates when
/// a CA is trusted for it.
pub(crate) fn preferred(
    policy: &HostKeyPolicy,
    pins: &[HostKeyPin],
    host: &str,
    port: u16,
    ssh_rsa_sha1: bool,
) -> Result<Preferred> {
    let mut preferred = Preferred::DEFAULT.clone();
    if !ssh_rsa_sha1 {
        let keys: Vec<Algorithm> = preferred
            .key
            .iter()
            .filter(|a| !matches!(a, Algorithm::Rsa { hash: None }))
            .cloned()
            .collect();
        preferred.key = keys.into();
    }
    let known: Vec<Algorithm> = match policy {
        HostKeyPolicy::Insecure => return Ok(preferred),
        _ if !pins.is_empty() => pins
            .iter()
            .filter_map(|p| match p {
                HostKeyPin::Key(k) => Some(k.algorithm()),
                HostKeyPin::Fingerprint(_) => None,
            })
            .collect(),
        _ => {
            let file = load(&known_hosts_path(policy)?)?;
            let name = lookup_name(host, port);
            let mut known = Vec::new();
            for e in file.matching(&name) {
                match (e.marker, &e.key) {
                    (None, Ok(k)) => known.push(k.algorithm()),
                    (Some(Marker::CertAuthority), Ok(_)) => {
                        preferred.host_key_certificates = preferred.key.clone();
                    }
                    _ => {}
                }
            }
            known
        }
    };
    let family = |a: &Algorithm, b: &Algorithm| match (a, b) {
        (Algorithm::Rsa { .. }, Algorithm::Rsa { .. }) => true,
        _ => a == b,
    };
    let (mut first, rest): (Vec<Algorithm>, Vec<Algorithm>) = preferred
        .key
        .iter()
        .cloned()
        .partition(|a| known.iter().any(|k| family(k, a)));
    first.extend(rest);
    preferred.key = first.into();
    Ok(preferred)
}

/// Says once per process on stderr, whatever the application's log level, that host
/// keys are not verified; every connection also logs a warning.
fn insecure_notice(peer: &str, offered: &str) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::SeqCst) {
        eprintln!(
            "WARNING: bootstrap-ssh: host keys are NOT verified (HostKeyPolicy::insecure_accept_any): every connection is open to a man in the middle"
        );
    }
    tracing::warn!(peer, key = %offered, "host key NOT verified (insecure policy): open to a man in the middle");
}

fn known_hosts_path(policy: &HostKeyPolicy) -> Result<PathBuf> {
    match policy {
        HostKeyPolicy::Verify {
            known_hosts: Some(p),
        }
        | HostKeyPolicy::AcceptNew { known_hosts: p } => Ok(p.clone()),
        _ => default_known_hosts(),
    }
}

/// The largest known_hosts file read: far more than a fleet's (a line is 100 to 800
/// bytes), and a bound all the same (`/dev/zero` named as the file is refused).
const MAX_KNOWN_HOSTS_BYTES: u64 = 64 * 1024 * 1024;

/// Reads a known_hosts file; a missing one is empty, as for OpenSSH. Anything but a
/// regular file under [`MAX_KNOWN_HOSTS_BYTES`] (a FIFO, a device, a directory) is
/// refused on the field `known_hosts` (machine-core's [`machine_core::read_user_file`]).
fn load(path: &Path) -> Result<KnownHosts> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(KnownHosts::default()),
        _ => {}
    }
    let bytes = machine_core::read_user_file("known_hosts", path, MAX_KNOWN_HOSTS_BYTES)?;
    Ok(KnownHosts::parse(&String::from_utf8_lossy(&bytes)))
}

fn revoked_error(peer: &str, offered: &str, path: &Path, line: usize) -> Error {
    Error::permanent(format!(
        "REVOKED HOST KEY for {peer}: the server offered {offered}, which {} line {line} marks @revoked; nothing was run",
        path.display()
    ))
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

/// The differences from OpenSSH 9's client defaults (`ssh -G`), in the crate
/// documentation's words; a unit test compares against the installed `ssh`.
#[cfg(test)]
pub(crate) mod differences {
    /// Offered here, not by OpenSSH 9.2's defaults (ML-KEM is OpenSSH 9.9's first
    /// choice; groups 15 and 17 are RFC 8268's, sound, just not in OpenSSH's list).
    pub const EXTRA: &[&str] = &[
        "mlkem768x25519-sha256",
        "diffie-hellman-group17-sha512",
        "diffie-hellman-group15-sha512",
    ];
    /// OpenSSH's defaults not offered here: what russh lacks (sntrup761, the NIST ECDH
    /// curves, aes128-gcm, UMAC, security-key host keys), what is weaker (hmac-sha1),
    /// and host certificates, asked for only when a CA is trusted for the host.
    pub const MISSING_PREFIXES: &[&str] = &[
        "sntrup761x25519-sha512",
        "ecdh-sha2-nistp",
        "aes128-gcm@openssh.com",
        "umac-",
        "hmac-sha1",
        "sk-",
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithms_are_openssh_9s_defaults_but_the_documented_differences() {
        let out = std::process::Command::new("ssh")
            .args(["-G", "-F", "/dev/null", "example.invalid"])
            .output()
            .expect("ssh is missing: run scripts/peers/10-openssh.sh (or apt-get install -y openssh-client)");
        let text = String::from_utf8_lossy(&out.stdout);
        let theirs = |key: &str| -> Vec<String> {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{key} ")))
                .unwrap_or_else(|| panic!("no {key} in ssh -G"))
                .split(',')
                .map(str::to_owned)
                .collect()
        };
        let p = preferred(&HostKeyPolicy::Insecure, &[], "h", 22, false).unwrap();
        let ours: Vec<(&str, Vec<String>)> = vec![
            (
                "kexalgorithms",
                p.kex
                    .iter()
                    .map(|k| k.as_ref().to_owned())
                    .filter(|k| !k.starts_with("ext-info") && !k.starts_with("kex-strict"))
                    .collect(),
            ),
            (
                "ciphers",
                p.cipher.iter().map(|c| c.as_ref().to_owned()).collect(),
            ),
            (
                "macs",
                p.mac.iter().map(|m| m.as_ref().to_owned()).collect(),
            ),
            (
                "hostkeyalgorithms",
                p.key.iter().map(|k| k.to_string()).collect(),
            ),
        ];
        for (key, ours) in ours {
            let theirs = theirs(key);
            for a in &ours {
                assert!(
                    theirs.contains(a) || differences::EXTRA.contains(&a.as_str()),
                    "{key}: {a} is offered here, not by OpenSSH, and not documented"
                );
            }
            for a in &theirs {
                let documented = differences::MISSING_PREFIXES
                    .iter()
                    .any(|m| a.starts_with(m))
                    || (key == "hostkeyalgorithms" && a.contains("-cert-v01@openssh.com"));
                assert!(
                    ours.contains(a) || documented,
                    "{key}: OpenSSH offers {a}, this crate does not, and it is not documented"
                );
            }
        }
        let keys = |p: &Preferred| p.key.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        assert!(!keys(&p).contains(&"ssh-rsa".to_owned()));
        let opted = preferred(&HostKeyPolicy::Insecure, &[], "h", 22, true).unwrap();
        assert!(keys(&opted).contains(&"ssh-rsa".to_owned()));
    }

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
