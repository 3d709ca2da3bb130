//! Files over the exec channel: an upload streams the content to `cat` on the machine,
//! into a file in a private temporary directory beside the target, checks its SHA-256
//! there, sets owner and mode, then renames it over the target: a reader never sees half
//! a file, a corrupted one never replaces a good one, and links planted by other users
//! of the directory are never written through (see [`upload_script`]).
//!
//! Why not SFTP: one channel and one round trip per file instead of an SFTP session,
//! and it goes through `sudo` like every command, which an SFTP server running as the
//! login user cannot do for root-owned paths.

use machine_core::{Error, ExecRequest, FileUpload, Result};
use sha2::{Digest, Sha256};

use crate::client::SshClient;
use crate::exec::Stdin;

/// Exit status of the upload script when the checksum on the machine differs.
const CHECKSUM_MISMATCH: i32 = 97;
/// Exit status of the read script when the file does not exist.
const NOT_FOUND: i32 = 96;
/// Exit status of the read script when the file is larger than the bound.
const TOO_LARGE: i32 = 95;

fn quote(field: &str, s: &str) -> Result<String> {
    shlex::try_quote(s)
        .map(|q| q.into_owned())
        .map_err(|_| Error::invalid_spec(field, "holds a NUL byte"))
}

fn check_path(path: &str) -> Result<()> {
    if !path.starts_with('/') || path.ends_with('/') || path.contains('\0') {
        return Err(Error::invalid_spec(
            "path",
            format!("{path:?} is not an absolute file path"),
        ));
    }
    Ok(())
}

/// The shell script that receives the content on stdin, run as `me` (the login user,
/// or root through sudo).
///
/// The directory is resolved one component at a time from `/` (`cd -P`, creating what
/// is missing): a symbolic link is followed only when root or `me` owns it (systemd's
/// `CHASE_SAFE` rule), anything else is refused naming the link and its owner; a
/// component that turned into a link between the look and the `cd` is caught by the
/// physical path. So a user who can write a directory on the way cannot point a root
/// upload elsewhere (`<dir>/app -> /etc`).
///
/// Safe against other users of the target directory too (a sticky /tmp, or a directory
/// they own): the content goes into a private directory (`mkdir -m 700` of a name
/// holding a random token: made new or not at all, and nobody else can plant
/// anything inside), entered by `cd` and checked to be ours and to sit in the target
/// directory; owner and mode are set there (a mode without execute or special bits is
/// the creation mode, through the umask, so no `chmod`), and the file is renamed over
/// the final name (`mv -T`: a symlink there is replaced, never written through).
/// Private directories left by uploads whose shell died (a dropped connection) are
/// removed by the next upload of the same file; a shell that is a zombie counts as
/// dead. Programs: mkdir, cat, sha256sum, mv, rmdir (chmod, chown when needed; ls for
/// a link on the way): coreutils or busybox.
fn upload_script(file: &FileUpload, sha256: &str, me: &str, token: &str) -> Result<String> {
    check_path(&file.path)?;
    if file.mode > 0o7777 {
        return Err(Error::invalid_spec(
            "mode",
            format!("{:#o} is not a permission mode", file.mode),
        ));
    }
    let chown = match &file.owner {
        Some(owner) => {
            if owner.is_empty() || owner.starts_with('-') || owner.chars().any(char::is_whitespace)
            {
                return Err(Error::invalid_spec(
                    "owner",
                    format!("{owner:?} is not user or user:group"),
                ));
            }
            format!("chown -- {} data\n", quote("owner", owner)?)
        }
        None => String::new(),
    };
    // Created with the mode when it has no execute or special bit; chmod otherwise.
    let (umask, chmod) = if file.mode & 0o7111 == 0 {
        (0o777 & !file.mode, String::new())
    } else {
        (0o077, format!("chmod {:o} data\n", file.mode))
    };
    let (dir, base) = file.path.rsplit_once('/').unwrap_or(("", &file.path));
    if dir.split('/').any(|c| c == "..") {
        return Err(Error::invalid_spec(
            "path",
            format!("{:?} holds a .. component", file.path),
        ));
    }
    Ok(format!(
        r#"set -e
p={dir}
b={base}
me={me}
fail() {{ printf '%s\n' "$*" >&2; exit 1; }}
enter() {{
  cd -P -- "$1" 2>/dev/null && return 0
  [ -x "$1" ] || fail "cannot enter $D/$1: Permission denied"
  fail "cannot enter $D/$1"
}}
cd /
D=
r=${{p#/}}
while [ -n "$r" ]; do
  c=${{r%%/*}}
  case $r in */*) r=${{r#*/}} ;; *) r= ;; esac
  case $c in ''|.) continue ;; esac
  if [ -L "$c" ]; then
    set -- $(ls -ld -- "$c")
    [ "$3" = root ] || [ "$3" = "$me" ] || fail "refused: $D/$c is a symbolic link owned by $3, not by root or $me: it could point the upload anywhere"
    enter "$c"
  else
    o=
    [ -e "$c" ] || o=$(mkdir -- "$c" 2>&1) || [ -d "$c" ] || fail "cannot make the directory $D/$c: $o"
    [ -d "$c" ] || fail "$D/$c is not a directory"
    enter "$c"
    [ "$PWD" = "$D/$c" ] || fail "refused: $D/$c turned into a link to $PWD while the path was resolved"
  fi
  D=$PWD
done
[ -n "$D" ] || D=/
alive() {{
  kill -0 "$1" 2>/dev/null || return 1
  s=; read -r s 2>/dev/null < "/proc/$1/stat" || return 0
  s=${{s##*) }}
  [ "${{s%% *}}" != Z ]
}}
for x in ."$b".bssh-*; do
  [ -d "$x" ] && [ ! -L "$x" ] && [ -O "$x" ] || continue
  o=${{x#."$b".bssh-}}; o=${{o%%.*}}
  alive "$o" || rm -rf -- "$x" 2>/dev/null || true
done
umask 077
t=".$b.bssh-$$.{token}"
mkdir -m 700 -- "$t" || fail "cannot make the private upload directory $D/$t"
f=
trap 'cd / && {{ [ -z "$f" ] || rm -f -- "$D/$t/$f"; rmdir -- "$D/$t" 2>/dev/null || true; }}' EXIT
trap 'exit 1' HUP INT TERM PIPE
cd -P -- "$t"
[ "$PWD" = "${{D%/}}/$t" ] && [ -O . ] || fail "the private upload directory $D/$t was replaced by another user"
f=data
umask {umask:03o}
set -C
cat > data
set +C
s=$(sha256sum < data)
s=${{s%% *}}
if [ "$s" != {sha256} ]; then echo "checksum mismatch: the machine has $s, {sha256} was sent" >&2; exit {CHECKSUM_MISMATCH}; fi
{chown}{chmod}mv -fT -- data "../$b"
f=
"#,
        dir = quote("path", if dir.is_empty() { "/" } else { dir })?,
        base = quote("path", base)?,
        me = quote("user", me)?,
    ))
}

pub(crate) async fn upload(client: &SshClient, file: &FileUpload) -> Result<()> {
    let sha256 = hex(&Sha256::digest(&file.content));
    let me = if client.sudo_always() || client.target().user == "root" {
        "root"
    } else {
        client.target().user.as_str()
    };
    let token = hex(&Sha256::digest(
        format!(
            "{sha256}{:?}{}",
            std::time::SystemTime::now(),
            std::process::id()
        )
        .as_bytes(),
    ))[..16]
        .to_owned();
    let script = upload_script(file, &sha256, me, &token)?;
    let mut req = ExecRequest::new(script);
    req.max_output = 64 * 1024;
    let out = client
        .exec_with_stdin(&req, Stdin::Bytes(&file.content))
        .await?;
    match out.status {
        Some(0) => {
            tracing::debug!(target = %client.target(), path = %file.path, bytes = file.content.len(), %sha256, "uploaded");
            Ok(())
        }
        Some(CHECKSUM_MISMATCH) => Err(Error::transient(format!(
            "upload of {} to {}: {}",
            file.path,
            client.target(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
        _ => out
            .check(&format!("upload {}", file.path))
            .map(drop)
            .map_err(|e| e.context(client.target())),
    }
}

pub(crate) async fn read_file(
    client: &SshClient,
    path: &str,
    max_bytes: usize,
) -> Result<Option<Vec<u8>>> {
    check_path(path)?;
    let p = quote("path", path)?;
    let script = format!(
        "p={p}\n[ -e \"$p\" ] || exit {NOT_FOUND}\nn=$(wc -c < \"$p\") || exit 1\nif [ \"$n\" -gt {max_bytes} ]; then echo \"$n bytes\" >&2; exit {TOO_LARGE}; fi\nexec cat \"$p\"\n"
    );
    let mut req = ExecRequest::new(script);
    req.max_output = max_bytes.max(1);
    let out = client.exec_with_stdin(&req, Stdin::None).await?;
    match out.status {
        Some(0) => Ok(Some(out.stdout)),
        Some(NOT_FOUND) => Ok(None),
        Some(TOO_LARGE) => Err(Error::permanent(format!(
            "{}: {path} holds {} , more than the {max_bytes} bytes allowed",
            client.target(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
        _ => out
            .check(&format!("read {path}"))
            .map(|_| None)
            .map_err(|e| e.context(client.target())),
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_uploads_name_the_field() {
        let e = upload_script(&FileUpload::new("etc/x", "a"), "00", "root", "t").unwrap_err();
        assert_eq!(e.field(), Some("path"));
        let e = upload_script(
            &FileUpload::new("/etc/x", "a").mode(0o17777),
            "00",
            "root",
            "t",
        )
        .unwrap_err();
        assert_eq!(e.field(), Some("mode"));
        let mut f = FileUpload::new("/etc/x", "a");
        f.owner = Some("-R root".into());
        assert_eq!(
            upload_script(&f, "00", "root", "t").unwrap_err().field(),
            Some("owner")
        );
    }

    #[test]
    fn script_quotes_the_path() {
        let path = "/tmp/it's $(here) `x`";
        let s = upload_script(&FileUpload::new(path, "a"), "abcdef0123", "root", "t").unwrap();
        let d = s.lines().nth(1).unwrap();
        let b = s.lines().nth(2).unwrap();
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("{d}; {b}; printf '%s/%s' \"$p\" \"$b\"")])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), path, "{d} {b}");
    }
}
