//! Shell quoting and content digests for the commands recipes render.

use sha2::{Digest, Sha256};

/// `s` as one POSIX shell word: as is when every byte is safe, else in single quotes
/// with each `'` written `'\''`. Written here rather than with shlex because the
/// snippets quoted whole are long and shlex's byte-by-byte quoter was the largest cost of
/// rendering a layer (15 % in the bench); the output is equally valid for `sh`.
pub(crate) fn q(s: &str) -> String {
    let safe = |b: u8| b.is_ascii_alphanumeric() || b"@%+=:,./-_".contains(&b);
    if !s.is_empty() && s.bytes().all(safe) {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len() + 2 + 3 * s.matches('\'').count());
    out.push('\'');
    for (i, part) in s.split('\'').enumerate() {
        if i > 0 {
            out.push_str("'\\''");
        }
        out.push_str(part);
    }
    out.push('\'');
    out
}

/// The first 16 hex digits of the SHA-256 of `parts`, each length-prefixed: put in a
/// command's comment, it makes the step's hash (and so its rerun) follow the content.
pub(crate) fn digest(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    hex::encode(&h.finalize()[..8])
}

#[cfg(test)]
mod tests {
    use super::q;

    #[test]
    fn quoted_words_reach_sh_unchanged() {
        for s in [
            "",
            "plain/path-1.2",
            "it's",
            "''",
            "a b\tc\nd",
            "$(rm -rf /) `id` ${x} \\ \" ; | & > < * ? ~ # !",
            "nginx=1.22",
        ] {
            let out = std::process::Command::new("/bin/sh")
                .arg("-c")
                .arg(format!("printf '%s' {}", q(s)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), s, "{}", q(s));
        }
    }
}
