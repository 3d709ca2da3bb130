//! OpenSSH's known_hosts format, as sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT" describes it:
//! an optional `@cert-authority` or `@revoked` marker, a comma-separated host pattern list
//! (`*` and `?` wildcards, `!` negation, `[host]:port`) or one hashed `|1|salt|hash` name,
//! then the key; fields are separated by any run of spaces and tabs.
//!
//! Written here because no maintained crate both parses and matches the format fully
//! (russh's reader splits on single spaces and ignores markers; ssh-key parses but does
//! not match). Its answers are checked against `ssh-keygen -F` on a corpus of files.

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use russh::keys::PublicKey;
use sha1::Sha1;

/// What a marker says about the key of its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marker {
    /// `@cert-authority`: the key is a CA that signs host certificates.
    CertAuthority,
    /// `@revoked`: the key must never be accepted.
    Revoked,
}

/// The host field of a line.
#[derive(Debug, Clone)]
enum Hosts {
    /// A comma-separated pattern list.
    Patterns(String),
    /// `|1|salt|hash`: HMAC-SHA1 of the lookup name, keyed with the salt.
    Hashed { salt: Vec<u8>, hash: Vec<u8> },
    /// A `|`-field that is not a valid hashed name: matches nothing, as in OpenSSH.
    Never,
}

/// One line that names hosts and a key.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// The line number in the file, from 1, counting comment and blank lines.
    pub(crate) line: usize,
    pub(crate) marker: Option<Marker>,
    hosts: Hosts,
    /// The key, or why it could not be read (such a line still matches its hosts, as
    /// `ssh-keygen -F` shows, but never vouches for a key).
    pub(crate) key: Result<PublicKey, String>,
}

/// A parsed known_hosts file.
#[derive(Debug, Clone, Default)]
pub(crate) struct KnownHosts {
    entries: Vec<Entry>,
}

/// The name a host is recorded under: `host` for port 22, else `[host]:port`, in lower case
/// (as ssh(1) looks it up).
pub(crate) fn lookup_name(host: &str, port: u16) -> String {
    let host = host.to_ascii_lowercase();
    if port == 22 {
        host
    } else {
        format!("[{host}]:{port}")
    }
}

fn is_blank(c: char) -> bool {
    c == ' ' || c == '\t'
}

/// Splits off the first field: the text up to the next space or tab, and the rest
/// after any run of them.
fn field(s: &str) -> (&str, &str) {
    match s.find(is_blank) {
        Some(i) => (&s[..i], s[i..].trim_start_matches(is_blank)),
        None => (s, ""),
    }
}

impl KnownHosts {
    /// Parses the text of a file. Never fails: a line OpenSSH would skip (an unknown
    /// marker, no key field) is skipped too.
    pub(crate) fn parse(text: &str) -> Self {
        let mut entries = Vec::new();
        for (i, raw) in text.split('\n').enumerate() {
            let line = raw.strip_suffix('\r').unwrap_or(raw);
            let line = line.trim_start_matches(is_blank);
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (marker, line) = match marker(line) {
                Ok(m) => m,
                Err(()) => continue,
            };
            let (hosts, rest) = field(line);
            if hosts.is_empty() || rest.is_empty() {
                continue;
            }
            let (kind, rest) = field(rest);
            let (blob, _comment) = field(rest);
            let key = PublicKey::from_openssh(&format!("{kind} {blob}"))
                .map_err(|e| format!("{kind} key not readable: {e}"));
            entries.push(Entry {
                line: i + 1,
                marker,
                hosts: parse_hosts(hosts),
                key,
            });
        }
        KnownHosts { entries }
    }

    /// The entries whose host field matches `name` (from [`lookup_name`]), in file order.
    pub(crate) fn matching<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Entry> + 'a {
        self.entries.iter().filter(move |e| e.hosts.matches(name))
    }
}

/// The marker at the start of a line, and the rest. As OpenSSH's `check_markers`: the
/// marker ends at the line's first space (a tab only when there is no space), so
/// `@revoked<TAB>host<TAB>ssh-ed25519 AAAA` is not a marker line but an unreadable one;
/// a second marker is an error too.
fn marker(line: &str) -> Result<(Option<Marker>, &str), ()> {
    if !line.starts_with('@') {
        return Ok((None, line));
    }
    let end = line.find(' ').or_else(|| line.find('\t')).ok_or(())?;
    let m = match &line[..end] {
        "@cert-authority" => Marker::CertAuthority,
        "@revoked" => Marker::Revoked,
        _ => return Err(()),
    };
    let rest = line[end..].trim_start_matches(is_blank);
    if rest.starts_with('@') {
        return Err(());
    }
    Ok((Some(m), rest))
}

fn parse_hosts(field: &str) -> Hosts {
    let Some(hashed) = field.strip_prefix('|') else {
        return Hosts::Patterns(field.to_owned());
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut parts = hashed.split('|');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("1"), Some(salt), Some(hash), None) => match (b64.decode(salt), b64.decode(hash)) {
            (Ok(salt), Ok(hash)) => Hosts::Hashed { salt, hash },
            _ => Hosts::Never,
        },
        _ => Hosts::Never,
    }
}

impl Hosts {
    fn matches(&self, name: &str) -> bool {
        match self {
            Hosts::Patterns(list) => match_list(name, list),
            Hosts::Hashed { salt, hash } => Hmac::<Sha1>::new_from_slice(salt)
                .map(|m| m.chain_update(name.as_bytes()).verify_slice(hash).is_ok())
                .unwrap_or(false),
            Hosts::Never => false,
        }
    }
}

/// OpenSSH's `match_hostname`: true when some pattern matches and no negated one does.
fn match_list(name: &str, list: &str) -> bool {
    let name = name.to_ascii_lowercase();
    let mut hit = false;
    for pattern in list.split(',') {
        let (negated, pattern) = match pattern.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, pattern),
        };
        if glob(name.as_bytes(), pattern.to_ascii_lowercase().as_bytes()) {
            if negated {
                return false;
            }
            hit = true;
        }
    }
    hit
}

/// `*` matches any run of bytes, `?` one byte, anything else itself.
fn glob(text: &[u8], pattern: &[u8]) -> bool {
    // Iterative with one backtrack point: linear in practice, no recursion to blow up.
    let (mut t, mut p) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                t += 1;
                p += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|c| *c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn globs() {
        assert!(glob(b"10.0.0.5", b"10.0.0.*"));
        assert!(glob(b"a.example.net", b"*.example.net"));
        assert!(!glob(b"example.net", b"*.example.net"));
        assert!(glob(b"ax", b"?x"));
        assert!(!glob(b"abx", b"?x"));
        assert!(glob(b"", b"*"));
        assert!(glob(b"abc", b"a*b*c*"));
        assert!(!glob(b"abcd", b"a*c"));
        assert!(match_list(
            "a.example.net",
            "*.example.net,!bad.example.net"
        ));
        assert!(!match_list(
            "bad.example.net",
            "*.example.net,!bad.example.net"
        ));
        assert!(!match_list("bad.example.net", "!bad.example.net"));
    }

    fn keygen(dir: &std::path::Path, name: &str, kind: &str) -> String {
        let path = dir.join(name);
        let out = Command::new("ssh-keygen")
            .args(["-q", "-t", kind, "-N", "", "-C", name, "-f"])
            .arg(&path)
            .output()
            .expect("ssh-keygen is missing: run scripts/peers/10-openssh.sh (or apt-get install -y openssh-client)");
        assert!(out.status.success(), "{out:?}");
        let text = std::fs::read_to_string(path.with_extension("pub")).unwrap();
        let mut parts = text.split_whitespace();
        format!("{} {}", parts.next().unwrap(), parts.next().unwrap())
    }

    /// `ssh-keygen -F name -f file`'s answer: the matching line numbers and markers.
    fn ssh_keygen_finds(file: &std::path::Path, name: &str) -> Vec<(usize, Option<Marker>)> {
        let out = Command::new("ssh-keygen")
            .args(["-F", name, "-f"])
            .arg(file)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let rest = l.split_once(" found: line ")?.1;
                let (n, tag) = rest.split_once(' ').unwrap_or((rest, ""));
                let marker = match tag.trim() {
                    "CA" => Some(Marker::CertAuthority),
                    "REVOKED" => Some(Marker::Revoked),
                    _ => None,
                };
                Some((n.parse().unwrap(), marker))
            })
            .collect()
    }

    fn ours(text: &str, name: &str) -> Vec<(usize, Option<Marker>)> {
        KnownHosts::parse(text)
            .matching(name)
            .map(|e| (e.line, e.marker))
            .collect()
    }

    #[test]
    fn answers_as_ssh_keygen_does_on_a_corpus() {
        let dir = tempfile::tempdir().unwrap();
        let ed = keygen(dir.path(), "ed", "ed25519");
        let ec = keygen(dir.path(), "ec", "ecdsa");
        let rsa = keygen(dir.path(), "rsa", "rsa");
        let files = [
            format!(
                "# comment first\n\n10.0.0.*  {ed}\n  *.example.net,!bad.example.net\t{ec} a comment\n[h1]:2222 {ed}\n"
            ),
            format!(
                "@revoked h2 {ed}\n@cert-authority *.ca.net {ec}\n@bogus h3 {ed}\nh4 ssh-ed25519 AAAAbroken\nH5 {rsa}\nh6,h6b {ec}\n"
            ),
            format!(
                "#\n#\n   # indented comment\n\t\n*   {ed}\n?x {ed}\nh9 {ed} extra words here\n[h9]:22 {ec}\n[10.1.*.*]:* {rsa}\n"
            ),
            format!(
                "@revoked\t*\t{rsa}\n@cert-authority\t\t[h1]:2222,h1 {ed}\nh1\n@revoked\nnothing-else-here\nh1,,h2 {ec}\n!h1,h* {ed}\n"
            ),
            format!("|1|abc|def {ed}\n|2|x|y {ed}\nh7 {ed}\r\n [a]:1,[b]:2 {ec}\n*.*.*.* {rsa}\n"),
            format!(
                "# hashable\nh1,h2  {ed}\n\n[h1]:2222\t{ec}\n10.0.0.5,hx {rsa} c\n@revoked h6 {ed}\n"
            ),
            format!("zz {ed}\n[10.1.2.3]:2200 {ec}\nH9 {rsa}\nfd00::1,[fd00::2]:2222 {ed}\n"),
            format!("fd00::*,!fd00::9 {ec}\n[fd00::*]:22?? {rsa}\n"),
            format!(
                "@revoked @cert-authority h1 {ed}\n@revoked\th1 {ed}\n@cert-authority  h1,zz\t{ec}\n@CA h1 {ed}\n@ h1 {ed}\n"
            ),
        ];
        let names = [
            "10.0.0.5",
            "10.0.0.50",
            "10.0.1.5",
            "a.example.net",
            "bad.example.net",
            "example.net",
            "[h1]:2222",
            "h1",
            "h2",
            "x.ca.net",
            "h3",
            "h4",
            "h5",
            "h6b",
            "h6",
            "ax",
            "zz",
            "h9",
            "[h9]:22",
            "[10.1.2.3]:2200",
            "h7",
            "[a]:1",
            "[b]:1",
            "[b]:2",
            "1.2.3.4",
            "hx",
        ];
        let mut compared = 0;
        let mut hashed_files = 0;
        for (i, text) in files.iter().enumerate() {
            let plain = dir.path().join(format!("kh{i}"));
            std::fs::write(&plain, text).unwrap();
            let mut variants = vec![plain];
            // The same file with every plain host name hashed by ssh-keygen itself (it
            // refuses files holding lines it cannot read).
            let hashed = dir.path().join(format!("kh{i}.hashed"));
            std::fs::write(&hashed, text).unwrap();
            let out = Command::new("ssh-keygen")
                .arg("-H")
                .arg("-f")
                .arg(&hashed)
                .output()
                .unwrap();
            if out.status.success() {
                hashed_files += 1;
                variants.push(hashed);
            }
            for file in &variants {
                let content = std::fs::read_to_string(file).unwrap();
                for name in names {
                    let want = ssh_keygen_finds(file, name);
                    assert_eq!(
                        ours(&content, name),
                        want,
                        "{name} in {}:\n{content}",
                        file.display()
                    );
                    compared += 1;
                }
            }
        }
        assert!(
            hashed_files >= 2,
            "hashed variants compared: {hashed_files}"
        );
        assert_eq!(compared, (files.len() + hashed_files) * names.len());
    }

    #[test]
    fn keys_markers_and_line_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let ed = keygen(dir.path(), "ed", "ed25519");
        let kh = KnownHosts::parse(&format!(
            "# c\n\n@revoked h {ed}\nh  {ed}\nh ssh-ed25519 AAAA\n"
        ));
        let got: Vec<_> = kh.matching("h").collect();
        assert_eq!(got.len(), 3);
        assert_eq!((got[0].line, got[0].marker), (3, Some(Marker::Revoked)));
        assert_eq!((got[1].line, got[1].marker), (4, None));
        assert!(got[1].key.is_ok());
        assert_eq!(got[2].line, 5);
        assert!(got[2].key.is_err());
        assert_eq!(lookup_name("Web-1", 22), "web-1");
        assert_eq!(lookup_name("fd00::1", 2222), "[fd00::1]:2222");
    }
}
