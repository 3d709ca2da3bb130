//! The transport against real sshd processes on loopback ports.

mod support;

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bootstrap_ssh::{Auth, HostKeyPin, HostKeyPolicy, SshClient, SshConnector, SshTarget, os};
use machine_core::{Connector, ErrorKind, ExecRequest, FileUpload, SecretString, Transport};
use sha2::{Digest, Sha256};
use support::{Counter, Sshd, SshdOptions, fast, keygen};

async fn connect(sshd: &Sshd) -> SshClient {
    SshClient::connect(&sshd.config(), &sshd.target(), &sshd.pins())
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_reports_status_output_and_secret_env() {
    let sshd = Sshd::start();
    let c = connect(&sshd).await;
    let out = c
        .exec(
            &ExecRequest::new(
                "printf 'a\\nb\\n'; echo \"token=$TOKEN\" >&2; printf %s \"$TOKEN\" | sha256sum >&2",
            )
            .env("TOKEN", SecretString::from("s3 cr'et")),
        )
        .await
        .unwrap();
    assert_eq!(out.status, Some(0));
    assert_eq!(out.stdout, b"a\nb\n");
    // The command got the value exactly (its digest); what it echoed of it is masked.
    let digest = hex(&Sha256::digest(b"s3 cr'et"));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("token=***\n{digest}  -\n")
    );
    assert!(!out.truncated);
    // The secret is not on any command line on the machine while the command runs.
    let seen = sshd.dir.path().join("ps");
    let req = ExecRequest::new(format!("ps -eo args > {}; echo \"$TOKEN\"", seen.display()))
        .env("TOKEN", SecretString::from("hunter2-zz"));
    assert_eq!(c.exec(&req).await.unwrap().stdout, b"***\n");
    let ps = std::fs::read_to_string(&seen).unwrap();
    assert!(
        ps.contains("ps -eo args") && !ps.contains("hunter2"),
        "{ps}"
    );
    // One connection serves many commands, also concurrently.
    let reqs: Vec<ExecRequest> = (0..20)
        .map(|i| ExecRequest::new(format!("echo {i}")))
        .collect();
    let many = futures_util::future::join_all(reqs.iter().map(|r| c.exec(r))).await;
    for (i, out) in many.into_iter().enumerate() {
        assert_eq!(out.unwrap().stdout, format!("{i}\n").into_bytes());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_zero_exit_carries_command_status_and_stderr_tail() {
    let sshd = Sshd::start();
    let c = connect(&sshd).await;
    let cmd = "echo working; echo 'E: unable to locate package nope' >&2; exit 3";
    let out = c.exec(&ExecRequest::new(cmd)).await.unwrap();
    assert_eq!(out.status, Some(3));
    let e = out.check(cmd).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("status 3")
            && msg.contains("unable to locate package nope")
            && msg.contains("exit 3"),
        "{msg}"
    );
    assert_eq!(e.kind(), ErrorKind::Permanent);
    let e = c.run(&ExecRequest::new(cmd)).await.unwrap_err();
    assert!(
        e.to_string().contains(&sshd.target().to_string()) && e.to_string().contains("status 3"),
        "{e}"
    );
    assert_eq!(
        c.run(&ExecRequest::new("echo fine")).await.unwrap().stdout,
        b"fine\n"
    );
    // The supervisor reports a command killed by a signal as a shell does: 128 + n.
    let out = c.exec(&ExecRequest::new("kill -9 $$")).await.unwrap();
    assert_eq!(out.status, Some(137), "killed by SIGKILL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_10_mib_upload_is_atomic_checksummed_with_mode_and_owner() {
    let sshd = Sshd::start();
    let c = connect(&sshd).await;
    let mut content = vec![0u8; 10 << 20];
    let mut x: u64 = 0x9e3779b97f4a7c15;
    for b in content.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let path = sshd.dir.path().join("deep/er/big.bin");
    let mut file = FileUpload::new(path.to_str().unwrap(), content.clone()).mode(0o640);
    file.owner = Some("nobody:nogroup".into());
    c.upload(&file).await.unwrap();
    let written = std::fs::read(&path).unwrap();
    assert_eq!(Sha256::digest(&written), Sha256::digest(&content));
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o640);
    assert_eq!(meta.uid(), 65534, "owned by nobody");
    // Directories it had to create get the usual mode, not the upload's private one.
    let created = std::fs::metadata(path.parent().unwrap()).unwrap();
    assert_eq!(created.mode() & 0o777, 0o755, "deep/er is 0755");
    let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "no temporary file left: {leftovers:?}");
    // Replacing keeps the path whole, and read_file returns it.
    c.upload(&FileUpload::new(path.to_str().unwrap(), "small\n"))
        .await
        .unwrap();
    let back = c.read_file(path.to_str().unwrap(), 1024).await.unwrap();
    assert_eq!(back.as_deref(), Some(&b"small\n"[..]));
    assert_eq!(c.read_file("/nonexistent/file", 1024).await.unwrap(), None);
    let e = c.read_file(path.to_str().unwrap(), 3).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
    let e = c
        .upload(&FileUpload::new("relative/path", "x"))
        .await
        .unwrap_err();
    assert_eq!(e.field(), Some("path"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_printing_100_mb_keeps_only_the_bounded_tail() {
    let sshd = Sshd::start();
    let c = connect(&sshd).await;
    let mut req = ExecRequest::new(
        "head -c 100000000 /dev/zero | tr '\\0' x; echo; echo END; head -c 3000000 /dev/zero >&2",
    );
    req.max_output = 1 << 20;
    let out = c.exec(&req).await.unwrap();
    assert_eq!(out.status, Some(0));
    assert!(out.truncated);
    assert_eq!(out.stdout.len(), 1 << 20, "stdout kept to the bound");
    assert!(out.stdout.ends_with(b"x\nEND\n"), "the tail is kept");
    assert_eq!(out.stderr.len(), 1 << 20, "stderr kept to the bound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_past_its_timeout_is_a_timeout_error() {
    let sshd = Sshd::start();
    let c = connect(&sshd).await;
    let e = c
        .exec(&ExecRequest::new("sleep 30").timeout(Duration::from_millis(500)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.to_string().contains("sleep 30"), "{e}");
    // The connection is still usable.
    assert!(c.exec(&ExecRequest::new("true")).await.unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sudo_runs_commands_as_root() {
    support::need("sudo", "sudo");
    let sshd = Sshd::start();
    let c = SshClient::connect(&sshd.config().with_sudo(true), &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    let out = c
        .exec(&ExecRequest::new("id -u; echo $SUDO_USER"))
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0\nroot\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_host_key_is_refused_with_both_fingerprints_and_nothing_runs() {
    let sshd = Sshd::start();
    let (_, other) = bootstrap_ssh::generate_ed25519().unwrap();
    let marker = sshd.dir.path().join("ran");
    let counter = Counter::start(sshd.port);
    let mut m = sshd.machine("web-1");
    m.access.host_keys = vec![other.clone()];
    m.access.ssh.as_mut().unwrap().port = counter.port;
    let connector = Arc::new(SshConnector::new(sshd.config()));
    let layer = machine_core::steps::StepLayer::new(
        "touch",
        vec![machine_core::steps::Step::run(format!(
            "touch {}",
            marker.display()
        ))],
    )
    .unwrap()
    .with_state_dir(sshd.dir.path().join("state").to_str().unwrap())
    .unwrap();
    let report = bootstrap_ssh::LayerRunner::new(connector)
        .layer(Arc::new(layer))
        .run_one(&m)
        .await;
    let e = report.result.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
    let msg = e.to_string();
    let offered = HostKeyPin::parse("k", &sshd.host_key_pub).unwrap();
    let expected = HostKeyPin::parse("k", &other).unwrap();
    assert!(
        msg.contains("MISMATCH")
            && msg.contains(&offered.fingerprint())
            && msg.contains(&expected.fingerprint()),
        "{msg}"
    );
    // Counted, not timed: one attempt, not retried (by the connect or the runner).
    assert_eq!(counter.count(), 1, "not retried");
    assert_eq!(report.connections, 0);
    assert!(!marker.exists(), "nothing ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_hosts_accept_new_and_insecure_policies() {
    let sshd = Sshd::start();
    let kh = sshd.dir.path().join("known_hosts");
    let verify = || {
        sshd.config().with_host_keys(HostKeyPolicy::Verify {
            known_hosts: Some(kh.clone()),
        })
    };
    // No known_hosts file yet: refused by default, saying the file is missing.
    let e = SshClient::connect(&verify(), &sshd.target(), &[])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    assert!(!e.is_retryable());
    // Accept-new trusts and records it ...
    let accept = sshd.config().with_host_keys(HostKeyPolicy::AcceptNew {
        known_hosts: kh.clone(),
    });
    SshClient::connect(&accept, &sshd.target(), &[])
        .await
        .unwrap();
    let text = std::fs::read_to_string(&kh).unwrap();
    assert!(
        text.contains(&format!("[127.0.0.1]:{}", sshd.port)),
        "{text}"
    );
    // ... after which verification against the file passes.
    SshClient::connect(&verify(), &sshd.target(), &[])
        .await
        .unwrap();
    // A known_hosts entry with another key of the same type is a mismatch, even for accept-new.
    let (_, other) = bootstrap_ssh::generate_ed25519().unwrap();
    std::fs::write(&kh, format!("[127.0.0.1]:{} {other}\n", sshd.port)).unwrap();
    let e = SshClient::connect(&accept, &sshd.target(), &[])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("MISMATCH"), "{e}");
    // Insecure connects to anything.
    let insecure = sshd
        .config()
        .with_host_keys(HostKeyPolicy::insecure_accept_any());
    let c = SshClient::connect(&insecure, &sshd.target(), &[])
        .await
        .unwrap();
    assert!(c.exec(&ExecRequest::new("true")).await.unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_failure_is_permanent_and_not_retried() {
    let sshd = Sshd::start();
    let stranger = keygen(sshd.dir.path(), "stranger", "ed25519", "");
    let config = fast(bootstrap_ssh::SshConfig::new(vec![
        Auth::key_file(&stranger, None).unwrap(),
    ]));
    let counter = Counter::start(sshd.port);
    let target = SshTarget::new("127.0.0.1", counter.port, "root").unwrap();
    let e = SshClient::connect(&config, &target, &sshd.pins())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
    assert!(!e.is_retryable());
    assert!(e.to_string().contains("authentication failed"), "{e}");
    // Counted, not timed: one connection, not retried to the 20 s deadline.
    assert_eq!(counter.count(), 1, "failed at once, not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rsa_ecdsa_passphrase_and_in_memory_keys_authenticate() {
    let dir = tempfile::tempdir().unwrap();
    let rsa = keygen(dir.path(), "rsa", "rsa", "");
    let ecdsa = keygen(dir.path(), "ecdsa", "ecdsa", "correct horse");
    let sshd = Sshd::with(SshdOptions {
        authorized: vec![rsa.with_extension("pub"), ecdsa.with_extension("pub")],
        ..SshdOptions::default()
    });
    let pass = || Some(SecretString::from("correct horse"));
    let text = SecretString::from(std::fs::read_to_string(&sshd.client_key).unwrap());
    for auth in [
        Auth::key_file(&rsa, None).unwrap(),
        Auth::key_file(&ecdsa, pass()).unwrap(),
        Auth::key_text(&text, None).unwrap(),
    ] {
        let c = SshClient::connect(
            &fast(bootstrap_ssh::SshConfig::new(vec![auth.clone()])),
            &sshd.target(),
            &sshd.pins(),
        )
        .await
        .unwrap_or_else(|e| panic!("{auth:?}: {e}"));
        assert!(c.exec(&ExecRequest::new("true")).await.unwrap().success());
    }
    // A failing method is followed by the next.
    let stranger = keygen(dir.path(), "stranger", "ed25519", "");
    let config = fast(bootstrap_ssh::SshConfig::new(vec![
        Auth::key_file(&stranger, None).unwrap(),
        sshd.auth(),
    ]));
    SshClient::connect(&config, &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    // Bad keys are clear errors before any connection.
    let e = Auth::key_file(&ecdsa, None).unwrap_err();
    assert!(
        e.field() == Some("auth.key") && e.to_string().contains("passphrase"),
        "{e}"
    );
    let e = Auth::key_file(&ecdsa, Some(SecretString::from("wrong"))).unwrap_err();
    assert_eq!(e.field(), Some("auth.key"), "{e}");
    let e = Auth::key_file(dir.path().join("missing"), None).unwrap_err();
    assert!(
        e.field() == Some("auth.key") && e.to_string().contains("cannot be read"),
        "{e}"
    );
    std::fs::write(
        dir.path().join("junk"),
        "-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n",
    )
    .unwrap();
    let e = Auth::key_file(dir.path().join("junk"), None).unwrap_err();
    assert_eq!(e.field(), Some("auth.key"), "{e}");
    let e = Auth::key_text(&SecretString::from("hello"), None).unwrap_err();
    assert!(
        !e.to_string().contains("hello"),
        "the key text is not echoed: {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_sshd_starts_late_is_retried_until_reachable() {
    let sshd = Sshd::with(SshdOptions {
        delay: Some(Duration::from_millis(1500)),
        wait: false,
        ..SshdOptions::default()
    });
    let start = Instant::now();
    let c = SshClient::connect(&sshd.config(), &sshd.target(), &sshd.pins())
        .await
        .expect("retried until up");
    assert!(
        start.elapsed() >= Duration::from_millis(1400),
        "it really was down at first"
    );
    assert!(c.exec(&ExecRequest::new("true")).await.unwrap().success());
    // With no retries left the same refusal is transient, and past the deadline a timeout.
    let port = support::free_port();
    let target = SshTarget::new("127.0.0.1", port, "root").unwrap();
    let e = SshClient::connect_once(&sshd.config(), &target, &[])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
    assert!(e.to_string().contains("refused"), "{e}");
    let short = sshd.config().with_retry(
        machine_core::RetryPolicy::default(),
        Duration::from_millis(700),
    );
    let e = SshClient::connect(&short, &target, &[]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connector_reuses_one_connection_and_checks_access() {
    let sshd = Sshd::start();
    let connector = SshConnector::new(sshd.config());
    let m = sshd.machine("db-1");
    let a = connector.connect_client(&m).await.unwrap();
    let b = connector.connect_client(&m).await.unwrap();
    assert!(Arc::ptr_eq(&a, &b), "one connection per machine");
    let t: Arc<dyn Transport> = connector.connect(&m).await.unwrap();
    assert!(t.exec(&ExecRequest::new("true")).await.unwrap().success());
    // The same endpoint with other pins is not handed the verified connection.
    let mut repinned = m.clone();
    repinned.access.host_keys = vec![bootstrap_ssh::generate_ed25519().unwrap().1];
    let e = connector.connect(&repinned).await.err().unwrap();
    assert!(e.to_string().contains("MISMATCH"), "{e}");
    drop((a, b, t));
    let c = connector.connect_client(&m).await.unwrap();
    assert!(!c.is_closed());
    // Bad access is named.
    let mut bad = m.clone();
    bad.access.host_keys = vec!["SHA256:tooshort".into()];
    assert_eq!(
        connector.connect(&bad).await.err().unwrap().field(),
        Some("access.hostKeys[0]")
    );
    let mut bad = m.clone();
    bad.access.ssh.as_mut().unwrap().host = String::new();
    assert_eq!(
        connector.connect(&bad).await.err().unwrap().field(),
        Some("access.ssh.host")
    );
    let mut bad = m.clone();
    bad.access.ssh.as_mut().unwrap().port = 0;
    assert_eq!(
        connector.connect(&bad).await.err().unwrap().field(),
        Some("access.ssh.port")
    );
    let mut bad = m.clone();
    bad.access.ssh = None;
    assert_eq!(
        connector.connect(&bad).await.err().unwrap().field(),
        Some("access.ssh")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn os_release_is_detected_over_ssh() {
    let sshd = Sshd::start();
    let c = connect(&sshd).await;
    let os = os::detect(&c).await.unwrap();
    let local = std::fs::read_to_string("/etc/os-release").unwrap();
    assert!(local.contains(&format!("ID={}", os.id)), "{os:?}");
    if os.id == "debian" {
        assert_eq!(os.package_manager(), Some(os::PackageManager::Apt));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_waits_for_completion_then_applies_and_skips_on_rerun() {
    use machine_core::steps::{Step, StepLayer};
    let sshd = Sshd::start();
    let d = sshd.dir.path();
    let sentinel = d.join("bootstrap-success.complete");
    let layer = StepLayer::new(
        "app",
        vec![
            Step::write_file(d.join("app.conf").to_str().unwrap(), "port=80\n"),
            Step::run(format!("echo once >> {}", d.join("count").display())),
        ],
    )
    .unwrap()
    .with_state_dir(d.join("state").to_str().unwrap())
    .unwrap();
    let runner = bootstrap_ssh::LayerRunner::new(Arc::new(SshConnector::new(sshd.config())))
        .layer(Arc::new(layer))
        .wait_for(
            Arc::new(machine_core::SentinelFile::new(sentinel.to_str().unwrap())),
            Duration::from_millis(100),
            Duration::from_secs(20),
        );
    let m = sshd.machine("app-1");
    let s = sentinel.clone();
    let writer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        std::fs::write(s, "success\n").unwrap();
    });
    let report = runner.run_one(&m).await;
    writer.await.unwrap();
    report.result.as_ref().unwrap();
    let marks: Vec<&str> = report.events.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(
        marks,
        [
            "connected",
            "coupled software complete",
            "layer app applied",
            "ready"
        ],
        "{report}"
    );
    assert!(
        report.timeline.complete.unwrap() >= Duration::from_millis(600),
        "waited for the sentinel: {report}"
    );
    let again = runner.run_one(&m).await;
    again.result.as_ref().unwrap();
    assert!(
        again
            .events
            .iter()
            .any(|e| e.message == "layer app already applied"),
        "{again}"
    );
    assert_eq!(std::fs::read_to_string(d.join("count")).unwrap(), "once\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ssh_agent_authenticates_when_asked() {
    support::need("ssh-agent", "openssh-client");
    let sshd = Sshd::start();
    let sock = sshd.dir.path().join("agent.sock");
    let mut agent = std::process::Command::new("ssh-agent")
        .arg("-D")
        .arg("-a")
        .arg(&sock)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !sock.exists() {
        assert!(Instant::now() < deadline, "ssh-agent did not start");
        if let Ok(Some(status)) = agent.try_wait() {
            panic!("ssh-agent exited: {status}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _agent = Kill(agent);
    // An empty agent cannot log in.
    let config = |auth| fast(bootstrap_ssh::SshConfig::new(vec![auth]));
    let e = SshClient::connect(&config(Auth::agent_at(&sock)), &sshd.target(), &sshd.pins())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
    support::run_env(
        "ssh-add",
        &["-q", sshd.client_key.to_str().unwrap()],
        &[("SSH_AUTH_SOCK", sock.to_str().unwrap())],
    );
    let c = SshClient::connect(&config(Auth::agent_at(&sock)), &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    assert!(c.exec(&ExecRequest::new("true")).await.unwrap().success());
    let e = SshClient::connect(
        &config(Auth::agent_at(sshd.dir.path().join("nope"))),
        &sshd.target(),
        &sshd.pins(),
    )
    .await
    .unwrap_err();
    assert_eq!(e.field(), Some("auth.agent"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_durations_are_refused_naming_the_field_never_a_panic() {
    let sshd = Sshd::start();
    let huge = Duration::from_secs(u64::MAX);
    // Connection timeouts, retry deadline, keepalive or command timeout no timer can
    // hold: refused before connecting, naming the field.
    let base = sshd.config();
    for (config, field) in [
        (base.clone().with_connect_timeout(huge), "connect_timeout"),
        (base.clone().with_keepalive(huge, 3), "keepalive_interval"),
        (
            base.clone().with_keepalive(Duration::ZERO, 3),
            "keepalive_interval",
        ),
        (base.clone().with_command_timeout(huge), "command_timeout"),
        (
            base.clone()
                .with_retry(machine_core::RetryPolicy::default(), huge),
            "connect_deadline",
        ),
    ] {
        let e = SshClient::connect(&config, &sshd.target(), &sshd.pins())
            .await
            .unwrap_err();
        assert_eq!(e.field(), Some(field), "{e}");
        assert_eq!(e.kind(), ErrorKind::InvalidSpec);
    }
    // A command's own huge timeout is harmless.
    let c = SshClient::connect(&base, &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    let mut req = ExecRequest::new("echo fine");
    req.timeout = Some(huge);
    assert_eq!(c.exec(&req).await.unwrap().stdout, b"fine\n");
    // A completion wait with a deadline or poll no clock can hold: refused, naming it.
    let m = sshd.machine("absurd");
    let check = machine_core::SentinelFile::new(sshd.dir.path().join("never").to_str().unwrap());
    for (poll, deadline, field) in [
        (Duration::from_millis(10), huge, "deadline"),
        (huge, Duration::from_secs(1), "poll"),
        (Duration::ZERO, Duration::from_secs(1), "poll"),
    ] {
        let e = bootstrap_ssh::wait_completion(&m, &c, Arc::new(check.clone()), poll, deadline)
            .await
            .unwrap_err();
        assert_eq!(e.field(), Some(field), "{e}");
        assert_eq!(e.kind(), ErrorKind::InvalidSpec);
    }
    // The same through the runner.
    let runner = bootstrap_ssh::LayerRunner::new(Arc::new(SshConnector::new(sshd.config())))
        .wait_for(Arc::new(check), Duration::from_millis(10), huge);
    let report = runner.run_one(&m).await;
    assert_eq!(report.result.unwrap_err().field(), Some("deadline"));
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
