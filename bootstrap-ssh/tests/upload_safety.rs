//! Uploads as root into directories another (unprivileged, real) user can write: a
//! sticky /tmp-like directory and a directory the other user owns. That user plants
//! symlinks to a root-only victim file at every name the upload uses or used to use;
//! the victim must stay byte-identical with its mode.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use bootstrap_ssh::SshClient;
use machine_core::{FileUpload, Transport};
use sha2::{Digest, Sha256};
use support::{Sshd, TempUser};

/// A root-only directory holding a root-only file, and what it must stay.
struct Victim {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Victim {
    fn new() -> Victim {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), PermissionsExt::from_mode(0o711)).unwrap();
        let path = dir.path().join("shadow-like");
        std::fs::write(&path, "root only\n").unwrap();
        std::fs::set_permissions(&path, PermissionsExt::from_mode(0o600)).unwrap();
        Victim { _dir: dir, path }
    }

    fn assert_untouched(&self, when: &str) {
        let meta = std::fs::symlink_metadata(&self.path).unwrap();
        assert!(meta.is_file(), "{when}: victim replaced");
        assert_eq!(meta.mode() & 0o7777, 0o600, "{when}: victim mode changed");
        assert_eq!(
            (meta.uid(), meta.gid()),
            (0, 0),
            "{when}: victim owner changed"
        );
        assert_eq!(
            std::fs::read(&self.path).unwrap(),
            b"root only\n",
            "{when}: victim content changed"
        );
    }
}

/// Plants, as `user`, symlinks to the victim at the final name and at every temporary
/// name the upload used to derive from the client's PID, a counter and the checksum.
fn plant(user: &TempUser, dir: &Path, base: &str, content: &[u8], victim: &Path) {
    let sha = format!("{:x}", Sha256::digest(content));
    let mut script = format!(
        "cd {d} && ln -sfn {v} {base}",
        d = dir.display(),
        v = victim.display()
    );
    for seq in 0..64 {
        script.push_str(&format!(
            " && ln -sfn {v} .{base}.upload-{pid}-{seq}-{sha8}",
            v = victim.display(),
            pid = std::process::id(),
            sha8 = &sha[..8]
        ));
    }
    user.sh(&script);
}

fn check_landed(path: &Path, content: &[u8], mode: u32) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    assert!(
        meta.is_file(),
        "{} is a regular file, not a link",
        path.display()
    );
    assert_eq!(meta.mode() & 0o7777, mode);
    assert_eq!(meta.uid(), 0);
    assert_eq!(std::fs::read(path).unwrap(), content);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_symlinks_in_a_sticky_directory_are_never_written_through() {
    let user = TempUser::new("unused-password");
    let victim = Victim::new();
    let sshd = Sshd::start();
    let c = SshClient::connect(&sshd.config(), &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), PermissionsExt::from_mode(0o1777)).unwrap();
    let content = b"uploaded by root\n".to_vec();
    plant(&user, shared.path(), "app.conf", &content, &victim.path);
    let target = shared.path().join("app.conf");
    c.upload(&FileUpload::new(target.to_str().unwrap(), content.clone()).mode(0o644))
        .await
        .unwrap();
    victim.assert_untouched("sticky directory");
    check_landed(&target, &content, 0o644);
    // Nothing of root's is left behind beside it.
    for e in std::fs::read_dir(shared.path()).unwrap() {
        let e = e.unwrap();
        let meta = std::fs::symlink_metadata(e.path()).unwrap();
        assert!(
            e.file_name() == "app.conf" || meta.uid() != 0,
            "left behind: {:?}",
            e.file_name()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_owning_the_directory_cannot_redirect_root_uploads() {
    let user = TempUser::new("unused-password");
    let victim = Victim::new();
    let sshd = Sshd::start();
    let c = SshClient::connect(&sshd.config(), &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    let theirs = tempfile::tempdir().unwrap();
    std::fs::set_permissions(theirs.path(), PermissionsExt::from_mode(0o755)).unwrap();
    support::run("chown", &[&user.name, theirs.path().to_str().unwrap()]);
    let content = b"uploaded by root\n".to_vec();
    plant(&user, theirs.path(), "app.conf", &content, &victim.path);
    let target = theirs.path().join("app.conf");
    // Placed beforehand at every name: the upload replaces the link at the final name.
    c.upload(&FileUpload::new(target.to_str().unwrap(), content.clone()).mode(0o4755))
        .await
        .unwrap();
    victim.assert_untouched("planted beforehand");
    check_landed(&target, &content, 0o4755);

    // Now racing: the user swaps every upload entry that appears for a link to the
    // victim's directory or to the victim, as fast as it can. Uploads may fail; the
    // victim must not change.
    let racer = user.spawn(&format!(
        "cd {d}; while :; do for e in .app.conf.*; do [ -e \"$e\" ] || continue; mv -f \"$e\" \"x$e\" 2>/dev/null; ln -sfn {vd} \"$e\" 2>/dev/null; done; ln -sfn {v} app.conf 2>/dev/null; done",
        d = theirs.path().display(),
        vd = victim.path.parent().unwrap().display(),
        v = victim.path.display()
    ));

    let mut failed = 0;
    for i in 0..20 {
        // Big enough that the upload's private directory lives a while.
        let body = format!("round {i}\n").repeat(256 * 1024);
        if c.upload(&FileUpload::new(target.to_str().unwrap(), body).mode(0o644))
            .await
            .is_err()
        {
            failed += 1;
        }
        victim.assert_untouched(&format!("race round {i}"));
    }
    drop(racer);
    let swapped = std::fs::read_dir(theirs.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("x.")
        })
        .count();
    eprintln!("{failed} of 20 racing uploads refused; {swapped} entries swapped by the racer");
    // The race really ran: the racer moved upload directories away mid-upload (an upload
    // already inside its directory finishes there; one not yet inside is refused).
    assert!(swapped > 0, "the racer never caught an upload");
    victim.assert_untouched("after the race");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_directory_link_on_the_path_cannot_redirect_a_root_upload() {
    let user = TempUser::new("unused-password");
    let victim = Victim::new();
    let victim_dir = victim.path.parent().unwrap().to_path_buf();
    let sshd = Sshd::start();
    let c = SshClient::connect(&sshd.config(), &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    let theirs = tempfile::tempdir().unwrap();
    std::fs::set_permissions(theirs.path(), PermissionsExt::from_mode(0o755)).unwrap();
    support::run("chown", &[&user.name, theirs.path().to_str().unwrap()]);
    // `<dir>/app -> <root-only directory>`, planted by the user who owns <dir>.
    user.sh(&format!(
        "ln -s {} {}/app",
        victim_dir.display(),
        theirs.path().display()
    ));
    let target = theirs.path().join("app/payload.bin");
    let e = c
        .upload(&FileUpload::new(target.to_str().unwrap(), b"root's\n".to_vec()).mode(0o600))
        .await
        .unwrap_err();
    let msg = e.to_string();
    let link = theirs.path().join("app");
    assert!(
        msg.contains(&format!(
            "{} is a symbolic link owned by {}",
            link.display(),
            user.name
        )),
        "names the link and its owner: {msg}"
    );
    assert!(
        !victim_dir.join("payload.bin").exists(),
        "the upload landed in the link's target"
    );
    victim.assert_untouched("link on the path");
    // Deeper on the path, and through a link made mid-path: refused the same way.
    std::fs::create_dir(theirs.path().join("real")).unwrap();
    support::run(
        "chown",
        &[&user.name, theirs.path().join("real").to_str().unwrap()],
    );
    user.sh(&format!(
        "ln -s {} {}/real/deeper",
        victim_dir.display(),
        theirs.path().display()
    ));
    let e = c
        .upload(&FileUpload::new(
            theirs
                .path()
                .join("real/deeper/x/payload.bin")
                .to_str()
                .unwrap(),
            b"root's\n".to_vec(),
        ))
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("real/deeper is a symbolic link owned by"),
        "{e}"
    );
    assert!(!victim_dir.join("x").exists());
    // A link that root owns is followed (/var/run -> /run on most systems).
    let ok_dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(ok_dir.path(), theirs.path().join("by-root")).unwrap();
    std::os::unix::fs::lchown(theirs.path().join("by-root"), Some(0), Some(0)).unwrap();
    c.upload(&FileUpload::new(
        theirs.path().join("by-root/payload.bin").to_str().unwrap(),
        b"fine\n".to_vec(),
    ))
    .await
    .unwrap();
    check_landed(&ok_dir.path().join("payload.bin"), b"fine\n", 0o644);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_login_users_own_links_are_followed_for_its_uploads() {
    let user = TempUser::new("unused-password");
    let sshd = Sshd::start();
    let target = bootstrap_ssh::SshTarget::new("127.0.0.1", sshd.port, user.name.clone()).unwrap();
    let c = SshClient::connect(&sshd.config(), &target, &sshd.pins())
        .await
        .unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::set_permissions(home.path(), PermissionsExt::from_mode(0o755)).unwrap();
    support::run("chown", &[&user.name, home.path().to_str().unwrap()]);
    user.sh(&format!(
        "mkdir {h}/real && ln -s {h}/real {h}/link",
        h = home.path().display()
    ));
    c.upload(&FileUpload::new(
        home.path().join("link/f").to_str().unwrap(),
        b"mine\n".to_vec(),
    ))
    .await
    .unwrap();
    assert_eq!(
        std::fs::read(home.path().join("real/f")).unwrap(),
        b"mine\n"
    );
}
