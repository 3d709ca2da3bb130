//! known_hosts as OpenSSH reads it, against real sshd: `@revoked`, `@cert-authority`
//! with real host certificates, wildcard, negated, hashed and oddly spaced entries,
//! line numbers in errors, the choice of host-key algorithm, and the insecure policy's
//! notice.

mod support;

use std::path::Path;

use bootstrap_ssh::{HostKeyPin, HostKeyPolicy, SshClient, SshConfig, SshTarget};
use machine_core::{ExecRequest, Transport};
use support::{Netns, Sshd, SshdOptions, keygen, run};

fn verify_with(sshd: &Sshd, kh: &Path) -> SshConfig {
    sshd.config().with_host_keys(HostKeyPolicy::Verify {
        known_hosts: Some(kh.to_path_buf()),
    })
}

/// The key type and base64 of a public key line, without its comment.
fn key_of(line: &str) -> String {
    line.split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

fn read_pub(path: &Path) -> String {
    key_of(&std::fs::read_to_string(path.with_extension("pub")).unwrap())
}

async fn runs(config: &SshConfig, target: &SshTarget) -> machine_core::Result<()> {
    let c = SshClient::connect(config, target, &[]).await?;
    let out = c.exec(&ExecRequest::new("echo ran")).await?;
    assert_eq!(out.stdout, b"ran\n");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_host_key_is_refused_naming_the_line() {
    let sshd = Sshd::start();
    let kh = sshd.dir.path().join("known_hosts");
    let name = format!("[127.0.0.1]:{}", sshd.port);
    let key = key_of(&sshd.host_key_pub);
    std::fs::write(
        &kh,
        format!("# managed\n{name} {key}\n\n@revoked {name} {key}\n"),
    )
    .unwrap();
    let e = runs(&verify_with(&sshd, &kh), &sshd.target())
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("REVOKED") && msg.contains("line 4"),
        "refused naming line 4: {msg}"
    );
    assert!(!e.is_retryable());
    // Revoked for every host (`*`) also counts.
    std::fs::write(&kh, format!("{name} {key}\n@revoked * {key}\n")).unwrap();
    let e = runs(&verify_with(&sshd, &kh), &sshd.target())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("line 2"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_certificates_are_checked_against_cert_authority_lines() {
    let cas = tempfile::tempdir().unwrap();
    let ca = keygen(cas.path(), "ca", "ed25519", "");
    let other_ca = keygen(cas.path(), "other_ca", "ed25519", "");
    let sshd = Sshd::with(SshdOptions {
        host_cert: Some((ca.clone(), "127.0.0.1".into())),
        ..SshdOptions::default()
    });
    let kh = sshd.dir.path().join("known_hosts");
    let name = format!("[127.0.0.1]:{}", sshd.port);
    let config = verify_with(&sshd, &kh);

    // The CA listed for the host (by a wildcard port pattern): the certificate is trusted.
    std::fs::write(
        &kh,
        format!("# CA\n@cert-authority [127.0.0.*]:* {}\n", read_pub(&ca)),
    )
    .unwrap();
    runs(&config, &sshd.target()).await.unwrap();

    // Another CA: refused, naming the CA.
    std::fs::write(
        &kh,
        format!("@cert-authority {name} {}\n", read_pub(&other_ca)),
    )
    .unwrap();
    let e = runs(&config, &sshd.target()).await.unwrap_err();
    assert!(e.to_string().contains("no @cert-authority line"), "{e}");

    // The right CA, revoked: refused, naming the line.
    std::fs::write(
        &kh,
        format!(
            "@cert-authority {name} {ca}\n@revoked * {ca}\n",
            ca = read_pub(&ca)
        ),
    )
    .unwrap();
    let e = runs(&config, &sshd.target()).await.unwrap_err();
    assert!(
        e.to_string().contains("REVOKED") && e.to_string().contains("line 2"),
        "{e}"
    );

    // A CA line is not a host key: the CA's key never passes as the host's plain key,
    // and a host with only a CA line that presents no certificate is unknown.
    let plain = Sshd::start();
    let kh2 = plain.dir.path().join("known_hosts");
    std::fs::write(
        &kh2,
        format!(
            "@cert-authority * {}\n@cert-authority * {}\n",
            read_pub(&ca),
            key_of(&plain.host_key_pub)
        ),
    )
    .unwrap();
    let e = runs(&verify_with(&plain, &kh2), &plain.target())
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("unknown") && e.to_string().contains("line 2"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_host_name_is_refused() {
    let cas = tempfile::tempdir().unwrap();
    let ca = keygen(cas.path(), "ca", "ed25519", "");
    let sshd = Sshd::with(SshdOptions {
        host_cert: Some((ca.clone(), "other.example.net".into())),
        ..SshdOptions::default()
    });
    let kh = sshd.dir.path().join("known_hosts");
    std::fs::write(&kh, format!("@cert-authority * {}\n", read_pub(&ca))).unwrap();
    let e = runs(&verify_with(&sshd, &kh), &sshd.target())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not valid for 127.0.0.1"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcard_negated_hashed_and_spaced_entries_work_as_in_openssh() {
    let net = Netns::new(1);
    let sshd = net.sshd(0);
    let addr = net.addrs[0].clone();
    let target = SshTarget::new(addr.clone(), 22, "root").unwrap();
    let key = key_of(&sshd.host_key_pub);
    let subnet = addr.rsplit_once('.').unwrap().0.to_owned();
    let kh = sshd.dir.path().join("known_hosts");
    let config = verify_with(&sshd, &kh);
    let check = |text: String| {
        std::fs::write(&kh, text).unwrap();
        runs(&config, &target)
    };
    // A wildcard, with two spaces before the key type.
    check(format!("{subnet}.*  {key}\n")).await.unwrap();
    // A tab, leading blanks, `?` and a negation that does not hit.
    check(format!("  {subnet}.?*,!{subnet}.250\t{key} comment\n"))
        .await
        .unwrap();
    // A negation that hits: this line does not apply, the host is unknown.
    let e = check(format!("{subnet}.*,!{addr} {key}\n"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("unknown"), "{e}");
    // Hashed by ssh-keygen -H.
    std::fs::write(&kh, format!("{addr} {key}\n")).unwrap();
    run("ssh-keygen", &["-q", "-H", "-f", kh.to_str().unwrap()]);
    let hashed = std::fs::read_to_string(&kh).unwrap();
    assert!(hashed.starts_with("|1|"), "{hashed}");
    runs(&config, &target).await.unwrap();
    // A wrong key after comment and blank lines: the error names the line it is on.
    let (_, other) = bootstrap_ssh::generate_ed25519().unwrap();
    let e = check(format!("# one\n\n# three\n{addr} {}\n", key_of(&other)))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("MISMATCH") && e.to_string().contains("(line 4)"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_algorithm_of_the_known_key_is_asked_for() {
    let sshd = Sshd::with(SshdOptions {
        more_host_keys: vec!["ecdsa", "rsa"],
        ..SshdOptions::default()
    });
    let kh = sshd.dir.path().join("known_hosts");
    let name = format!("[127.0.0.1]:{}", sshd.port);
    for known in &sshd.more_host_key_pubs {
        // Only the server's genuine ECDSA (then RSA) key is known: OpenSSH connects.
        std::fs::write(&kh, format!("{name} {}\n", key_of(known))).unwrap();
        runs(&verify_with(&sshd, &kh), &sshd.target())
            .await
            .unwrap_or_else(|e| panic!("{known}: {e}"));
        // The same key pinned.
        let pin = HostKeyPin::parse("pin", known).unwrap();
        SshClient::connect(&sshd.config(), &sshd.target(), &[pin])
            .await
            .unwrap_or_else(|e| panic!("pinned {known}: {e}"));
    }
}

/// Run by [`the_insecure_policy_says_so_once_on_stderr`] in a child process without
/// any tracing subscriber; on its own it checks that insecure connections work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_connections_connect_to_anything() {
    let sshd = Sshd::start();
    for _ in 0..2 {
        let insecure = sshd
            .config()
            .with_host_keys(HostKeyPolicy::insecure_accept_any());
        runs(&insecure, &sshd.target()).await.unwrap();
    }
}

#[test]
fn the_insecure_policy_says_so_once_on_stderr() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "insecure_connections_connect_to_anything",
            "--nocapture",
            "--test-threads=1",
        ])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stderr.matches("host keys are NOT verified").count(),
        1,
        "one notice for two connections: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_offering_only_ssh_rsa_sha1_is_refused_unless_opted_in() {
    // Its genuine RSA key is on record: only the SHA-1 signature is the problem, and
    // OpenSSH 8.8 and later refuse it ("no matching host key type found").
    let sshd = Sshd::with(SshdOptions {
        extra: "HostKeyAlgorithms ssh-rsa",
        more_host_keys: vec!["rsa"],
        ..SshdOptions::default()
    });
    let kh = sshd.dir.path().join("known_hosts");
    std::fs::write(
        &kh,
        format!(
            "[127.0.0.1]:{} {}\n",
            sshd.port,
            key_of(&sshd.more_host_key_pubs[0])
        ),
    )
    .unwrap();
    let e = runs(&verify_with(&sshd, &kh), &sshd.target())
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("ssh-rsa") && msg.contains("SHA-1") && msg.contains("with_ssh_rsa_sha1"),
        "{msg}"
    );
    assert!(!e.is_retryable(), "{e}");
    // The same key pinned: refused too.
    let pin = HostKeyPin::parse("pin", &sshd.more_host_key_pubs[0]).unwrap();
    let e = SshClient::connect(&sshd.config(), &sshd.target(), std::slice::from_ref(&pin))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("ssh-rsa"), "{e}");
    // Opted in, loudly: accepted.
    runs(
        &verify_with(&sshd, &kh).with_ssh_rsa_sha1(true),
        &sshd.target(),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_known_hosts_file_is_named_as_missing() {
    let sshd = Sshd::start();
    let kh = sshd.dir.path().join("no-such-known_hosts");
    let e = runs(&verify_with(&sshd, &kh), &sshd.target())
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("does not exist") && msg.contains(kh.to_str().unwrap()),
        "{msg}"
    );
    assert!(!msg.contains("is unknown"), "{msg}");
}

/// Runs `f` on a thread of its own and waits for it at most a minute (it takes
/// milliseconds): reading a FIFO waits for a writer for ever, and the test must fail
/// rather than hang.
fn on_a_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .expect("still blocked after a minute: the file was read as it is (a FIFO waits for a writer for ever)")
}

#[test]
fn known_hosts_and_key_files_must_be_regular_files_of_bounded_size() {
    let sshd = Sshd::start();
    let fifo = sshd.dir.path().join("fifo");
    run("mkfifo", &[fifo.to_str().unwrap()]);
    let big = sshd.dir.path().join("big");
    std::fs::write(&big, vec![b'#'; 1024 * 1024 + 1]).unwrap();
    for path in [Path::new("/dev/zero"), fifo.as_path()] {
        // known_hosts: refused naming the field and the file, before anything runs.
        let config = verify_with(&sshd, path);
        let target = sshd.target();
        let e = on_a_thread(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(runs(&config, &target)).unwrap_err()
        });
        assert_eq!(e.field(), Some("known_hosts"), "{path:?}: {e}");
        assert!(
            e.to_string().contains("not a regular file")
                && e.to_string().contains(path.to_str().unwrap()),
            "{e}"
        );
        // A private key file: refused on auth.key.
        let p = path.to_path_buf();
        let e = on_a_thread(move || bootstrap_ssh::Auth::key_file(p, None).unwrap_err());
        assert_eq!(e.field(), Some("auth.key"), "{path:?}: {e}");
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
    // Over the bound: a key file of more than 1 MiB is no key.
    let e = bootstrap_ssh::Auth::key_file(&big, None).unwrap_err();
    assert!(
        e.field() == Some("auth.key") && e.to_string().contains("bound"),
        "{e}"
    );
    // The same sshd with a real known_hosts file: the refusals were the files'.
    let kh = sshd.dir.path().join("known_hosts");
    std::fs::write(
        &kh,
        format!("[127.0.0.1]:{} {}\n", sshd.port, sshd.host_key_pub),
    )
    .unwrap();
    let config = verify_with(&sshd, &kh);
    let target = sshd.target();
    on_a_thread(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(runs(&config, &target))
    })
    .unwrap();
}
