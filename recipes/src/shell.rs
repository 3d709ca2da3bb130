//! Shell quoting and content digests for the commands recipes render.

use sha2::{Digest, Sha256};

/// `s` as one shell word. Every value was checked for NUL, the only byte `try_quote`
/// refuses.
pub(crate) fn q(s: &str) -> String {
    shlex::try_quote(s).map_or_else(|_| "''".into(), |q| q.into_owned())
}

/// The first 16 hex digits of the SHA-256 of `parts`, each length-prefixed: put in a
/// command's comment, it makes the step's hash (and so its rerun) follow the content.
pub(crate) fn digest(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
