//! Shell quoting and content digests for the commands recipes render.

use sha2::{Digest, Sha256};

/// `s` as one POSIX shell word: as is when every byte is safe, else in single quotes
/// with each `'` written `'\''`. Written here rather than with shlex because the
/// snippets quoted whole are long and shlex's byte-by-byte quoter was the largest cost of
/// rendering a layer (15 % in the bench); the output is equally valid for `sh`.
pub(crate) fn q(s: &str) -> String {
    let mut out = String::new();
    push_quoted(&mut out, s);
    out
}

/// Appends `s` quoted as [`q`] does to `out`, which saves a string per quoted snippet.
pub(crate) fn push_quoted(out: &mut String, s: &str) {
    let safe = |b: u8| b.is_ascii_alphanumeric() || b"@%+=:,./-_".contains(&b);
    if !s.is_empty() && s.bytes().all(safe) {
        out.push_str(s);
        return;
    }
    // One pass over the bytes: the snippets hold many quotes, and counting them first
    // and then splitting on them searched each snippet twice, quote by quote.
    out.reserve(s.len() + 16);
    out.push('\'');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        if b == b'\'' {
            out.push_str(&s[start..i]);
            out.push_str("'\\''");
            start = i + 1;
        }
    }
    out.push_str(&s[start..]);
    out.push('\'');
}

/// `chown owner path` unless `path` is owned so already (`owner` is `user` or
/// `user:group`): chown changes the change time even when it changes nothing. An
/// owner that does not exist makes the check say no, and chown fails naming it.
pub(crate) fn chown_unless_owned(owner: &str, path: &str) -> String {
    let (user, group) = owner.split_once(':').unwrap_or((owner, ""));
    let mut test = format!("-user {}", q(user));
    if !group.is_empty() {
        test.push_str(&format!(" -group {}", q(group)));
    }
    format!(
        "find {p} -maxdepth 0 {test} 2>/dev/null | grep -q . || chown {o} {p}",
        p = q(path),
        o = q(owner)
    )
}

/// `chmod mode path` unless `path` has that mode already (chmod changes the change time
/// even when it changes nothing).
pub(crate) fn chmod_unless_set(mode: u32, path: &str) -> String {
    let p = q(path);
    format!("[ \"$(stat -c %a {p})\" = {mode:o} ] || chmod {mode:04o} {p}")
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
