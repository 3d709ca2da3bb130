//! Files through the connection's supervisor (`put` and `get` of `agent.sh`): an upload
//! streams the content into a temporary file beside the target, proves it arrived
//! whole, sets owner and mode, then renames it over the target: a reader never sees
//! half a file, a cut one never replaces a good one, and links planted by other users
//! of the directory are never written through (see [`put_request`]).
//!
//! Why not SFTP: one request on a supervisor the connection already has instead of an
//! SFTP session, and it goes through `sudo` like every command, which an SFTP server
//! running as the login user cannot do for root-owned paths.
//!
//! Why on the supervisor, although an upload needs none of its reattach records (it is
//! idempotent and atomic: after a cut the file is either the old one or the new one,
//! and the caller uploads again): the supervisor's channel, session and shells are
//! already paid for the connection's commands, so a `put` costs one subshell there,
//! where a channel of its own would cost a session, the login shell and `sh` again.

use machine_core::{Error, FileUpload, Result};

use crate::client::SshClient;

/// Exit status of an upload whose content did not arrive whole (its input ended).
const CUT_SHORT: i32 = 97;
/// Exit status of a read when the file does not exist.
const NOT_FOUND: i32 = 96;
/// Exit status of a read when the file is larger than the bound.
const TOO_LARGE: i32 = 95;

fn check_path(path: &str) -> Result<()> {
    if !path.starts_with('/') || path.ends_with('/') || path.contains('\0') {
        return Err(Error::invalid_spec(
            "path",
            format!("{path:?} is not an absolute file path"),
        ));
    }
    Ok(())
}

/// The `put` request for `file` (header arguments: length and umask; assignments),
/// done on the machine as `me` (the login user, or root through sudo).
///
/// The directory is resolved one component at a time from `/` (`cd -P`, creating what
/// is missing): a symbolic link is followed only when root or `me` owns it (systemd's
/// `CHASE_SAFE` rule), anything else is refused naming the link and its owner; a
/// component that turned into a link between the look and the `cd` is caught by the
/// physical path. So a user who can write a directory on the way cannot point a root
/// upload elsewhere (`<dir>/app -> /etc`).
///
/// Safe against other users of the target directory too (a sticky /tmp, or a directory
/// they own). The content goes into a temporary file whose name holds a random token
/// from the client (`.<name>.bssh-<pid>.<token>`: nobody can know it before it
/// exists), made new by the shell's noclobber (`O_EXCL`, so a link planted there is
/// never opened; the name is checked to be free first, since a shell opens an existing
/// non-regular file without `O_EXCL`) and written through the descriptor the shell
/// opened. When the upload sets an owner or a mode with execute or special bits,
/// `chown` and `chmod` work by name, so the file is made in a private directory
/// instead (`mkdir -m 700` of the same name: made new or not at all, and nobody else
/// can plant anything inside), entered by `cd` and checked to be ours and to sit in
/// the target directory. Otherwise the mode is the creation mode, through the umask,
/// and nothing is done by name between the write and the rename. The file is renamed
/// over the final name (`mv -T`: a link there is replaced, never written through; a
/// rename of a link another user swapped in moves that link, never its target).
///
/// The content is proved whole without reading it back: SSH's MAC guarantees the bytes
/// arrive as sent and in order, `head -c` stops early only at the end of its input
/// (the channel closed), and the supervisor then asks for one more line, which the
/// client sends only then: the request's token, which it can read only if the input
/// did not end (a checksum would cost a `sha256sum` process per upload).
/// Temporary files and directories left by uploads whose supervisor died (a dropped
/// connection) are removed by the next upload of the same file; a zombie counts as
/// dead. Programs: head, mv (mkdir, rmdir, chown, chmod when an owner or an executable
/// mode is set; ls for a link on the way): coreutils or busybox.
#[allow(clippy::type_complexity)]
fn put_request(
    file: &FileUpload,
    me: &str,
    token: &str,
) -> Result<(String, Vec<(&'static str, String)>)> {
    check_path(&file.path)?;
    if file.mode > 0o7777 {
        return Err(Error::invalid_spec(
            "mode",
            format!("{:#o} is not a permission mode", file.mode),
        ));
    }
    let owner = match &file.owner {
        Some(owner) => {
            if owner.is_empty() || owner.starts_with('-') || owner.chars().any(char::is_whitespace)
            {
                return Err(Error::invalid_spec(
                    "owner",
                    format!("{owner:?} is not user or user:group"),
                ));
            }
            owner.clone()
        }
        None => String::new(),
    };
    // Created with the mode when it has no execute or special bit; chmod otherwise.
    let (umask, chmod) = if file.mode & 0o7111 == 0 {
        (0o777 & !file.mode, String::new())
    } else {
        (0o077, format!("{:o}", file.mode))
    };
    let (dir, base) = file.path.rsplit_once('/').unwrap_or(("", &file.path));
    if dir.split('/').any(|c| c == "..") {
        return Err(Error::invalid_spec(
            "path",
            format!("{:?} holds a .. component", file.path),
        ));
    }
    Ok((
        format!("{} {umask:03o}", file.content.len()),
        vec![
            ("p", if dir.is_empty() { "/" } else { dir }.to_owned()),
            ("b", base.to_owned()),
            ("me_", me.to_owned()),
            ("tok", token.to_owned()),
            ("own", owner),
            ("mo", chmod),
        ],
    ))
}

/// The assignments as `transfer` takes them.
fn borrowed<'a>(assignments: &'a [(&'static str, String)]) -> Vec<(&'a str, &'a str)> {
    assignments.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

pub(crate) async fn upload(client: &SshClient, file: &FileUpload) -> Result<()> {
    let me = if client.sudo_always() || client.target().user == "root" {
        "root"
    } else {
        client.target().user.as_str()
    };
    // Random per call (the supervisor's tokens are seeded from the OS): the temporary
    // file's name cannot be known before it exists.
    let token = crate::supervisor::token(&file.path);
    let token = token.trim_start_matches("bssh-");
    let (args, assignments) = put_request(file, me, token)?;
    let what = format!("upload {}", file.path);
    let reply = client
        .transfer(
            &what,
            ("put", &args),
            &borrowed(&assignments),
            Some(&file.content),
            64 * 1024,
        )
        .await?;
    match reply.status {
        0 => {
            tracing::debug!(target = %client.target(), path = %file.path, bytes = file.content.len(), "uploaded");
            Ok(())
        }
        CUT_SHORT => Err(Error::transient(format!(
            "upload of {} to {}: {}",
            file.path,
            client.target(),
            crate::text::shown(&reply.stderr).trim()
        ))),
        status => machine_core::ExecOutput::new(Some(status), Vec::new(), reply.stderr)
            .check(&what)
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
    let what = format!("read {path}");
    let reply = client
        .transfer(
            &what,
            ("get", &max_bytes.to_string()),
            &[("p", path)],
            None,
            max_bytes.max(1),
        )
        .await?;
    match reply.status {
        0 if reply.stdout.len() <= max_bytes => Ok(Some(reply.stdout)),
        0 => Err(Error::permanent(format!(
            "{}: {path} grew over the {max_bytes} bytes allowed while it was read",
            client.target()
        ))),
        NOT_FOUND => Ok(None),
        TOO_LARGE => Err(Error::permanent(format!(
            "{}: {path} holds {}, more than the {max_bytes} bytes allowed",
            client.target(),
            crate::text::shown(&reply.stderr).trim()
        ))),
        status => machine_core::ExecOutput::new(Some(status), Vec::new(), reply.stderr)
            .check(&what)
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
        let e = put_request(&FileUpload::new("etc/x", "a"), "root", "t").unwrap_err();
        assert_eq!(e.field(), Some("path"));
        let e =
            put_request(&FileUpload::new("/etc/x", "a").mode(0o17777), "root", "t").unwrap_err();
        assert_eq!(e.field(), Some("mode"));
        let mut f = FileUpload::new("/etc/x", "a");
        f.owner = Some("-R root".into());
        assert_eq!(
            put_request(&f, "root", "t").unwrap_err().field(),
            Some("owner")
        );
        let e = put_request(&FileUpload::new("/a/../x", "a"), "root", "t").unwrap_err();
        assert_eq!(e.field(), Some("path"));
    }

    /// Runs the supervisor on this machine with `input` as its stdin; its stderr.
    fn supervise(input: &[u8]) -> String {
        use std::io::Write;
        let run = tempfile::tempdir().unwrap();
        let mut sh = std::process::Command::new("sh")
            .args(["-c", &crate::supervisor::AGENT, "bssh"])
            .arg(run.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        sh.stdin.take().unwrap().write_all(input).unwrap();
        let out = sh.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    #[test]
    fn a_content_cut_short_by_the_end_of_input_never_replaces_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f");
        for mode in [0o644, 0o755] {
            std::fs::write(&target, "old\n").unwrap();
            let file = FileUpload::new(target.to_str().unwrap(), "0123456789").mode(mode);
            let (args, assignments) = put_request(&file, "root", "t0").unwrap();
            let head =
                crate::supervisor::request(&format!("put bssh-t {args}"), &borrowed(&assignments))
                    .unwrap();
            // Half the content, then the end of input; all of it without the token the
            // client sends when asked; all of it and the token.
            for (tail, status, landed) in [
                (&b"01234"[..], 97, "old\n"),
                (b"0123456789", 97, "old\n"),
                (b"0123456789bssh-t\n", 0, "0123456789"),
            ] {
                let stderr = supervise(&[&head[..], tail].concat());
                assert!(
                    stderr.contains(&format!("\nbssh-t exit {status}\n")),
                    "{mode:o} {tail:?}: {stderr}"
                );
                assert_eq!(std::fs::read_to_string(&target).unwrap(), landed);
                let names: Vec<_> = std::fs::read_dir(dir.path())
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .collect();
                assert_eq!(names, ["f"], "nothing left beside it");
            }
        }
    }

    #[test]
    fn the_request_quotes_the_path() {
        let path = "/tmp/it's $(here) `x`\nnext line";
        let (args, assignments) =
            put_request(&FileUpload::new(path, "abc").mode(0o640), "root", "t").unwrap();
        assert_eq!(args, "3 137");
        let message = crate::supervisor::request("put x 3 137", &borrowed(&assignments)).unwrap();
        let message = String::from_utf8(message).unwrap();
        let (head, lines) = message.split_once('\n').unwrap();
        assert_eq!(
            head.rsplit(' ').next(),
            Some(lines.matches('\n').count().to_string().as_str())
        );
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("{lines}printf '%s/%s' \"$p\" \"$b\"")])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), path, "{lines}");
    }
}
