//! Several hosts in network namespaces: a fleet at once, a link cut mid-step (the step
//! goes on under its supervisor and the rerun waits for it), a jump host.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bootstrap_ssh::{JumpHost, LayerRunner, SshClient, SshConnector, SshTarget};
use machine_core::steps::{Step, StepLayer};
use machine_core::{DecoupledSoftware, ErrorKind, ExecRequest, Transport};
use support::{Netns, Sshd, SshdOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_is_applied_to_three_hosts_at_once() {
    let net = Netns::new(3);
    let shared = tempfile::tempdir().unwrap();
    let state = std::env::temp_dir().join(format!("bssh-state-{}", support::unique()));
    // Each host gets its own (private) copy of the state directory: they share a filesystem.
    let hosts: Vec<Sshd> = (0..3)
        .map(|i| {
            net.sshd_with(
                i,
                SshdOptions {
                    private_dir: Some(state.clone()),
                    ..SshdOptions::default()
                },
            )
        })
        .collect();
    let seen = shared.path().join("seen");
    let layer = StepLayer::new(
        "fleet",
        vec![
            Step::write_file(state.join("motd").to_str().unwrap(), "managed\n"),
            Step::run(format!(
                "ip -4 -o addr show dev eth0 | awk '{{print $4}}' >> {}",
                seen.display()
            )),
        ],
    )
    .unwrap()
    .with_state_dir(state.to_str().unwrap())
    .unwrap();
    // One config serves all hosts: pins come from each machine's access.
    let connector = Arc::new(SshConnector::new(hosts[0].config().with_user("root")));
    let machines: Vec<_> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let mut m = h.machine(&format!("node-{i}"));
            // Every host trusts every host's client key: the config holds host 0's.
            std::fs::copy(
                hosts[0].client_key.with_extension("pub"),
                h.dir.path().join("authorized_keys"),
            )
            .unwrap();
            m.access.ssh.as_mut().unwrap().host = net.addrs[i].clone();
            m
        })
        .collect();
    let runner = LayerRunner::new(connector)
        .layer(Arc::new(layer))
        .concurrency(3);
    let reports = runner.run(&machines).await;
    for r in &reports {
        assert!(r.result.is_ok(), "{r}");
        assert_eq!(r.connections, 1);
    }
    let mut got: Vec<String> = std::fs::read_to_string(&seen)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    got.sort();
    let mut want: Vec<String> = net.addrs.iter().map(|a| format!("{a}/24")).collect();
    want.sort();
    assert_eq!(got, want, "each host ran the step once");
    // A rerun finds every host done.
    for r in runner.run(&machines).await {
        assert!(
            r.events
                .iter()
                .any(|e| e.message == "layer fleet already applied"),
            "{r}"
        );
    }
    assert_eq!(std::fs::read_to_string(&seen).unwrap().lines().count(), 3);
    drop(hosts);
    let _ = std::fs::remove_dir_all(&state);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_cut_mid_step_resumes_without_redoing_finished_steps() {
    let net = Netns::new(1);
    let sshd = net.sshd(0);
    let d = tempfile::tempdir().unwrap();
    let p = |name: &str| d.path().join(name).display().to_string();
    let layer = StepLayer::new(
        "resume",
        vec![
            Step::run(format!("echo done >> {}", p("s1"))),
            Step::run(format!(
                "echo done >> {s2}; touch {started}; while [ ! -e {release} ]; do sleep 0.1; done",
                s2 = p("s2"),
                started = p("started"),
                release = p("release")
            )),
            Step::run(format!("echo done >> {}", p("s3"))),
        ],
    )
    .unwrap()
    .with_state_dir(p("state"))
    .unwrap();
    let mut m = sshd.machine("cut-1");
    m.access.ssh.as_mut().unwrap().host = net.addrs[0].clone();
    let target = SshTarget::new(net.addrs[0].clone(), 22, "root").unwrap();
    let config = sshd.config();
    let client = SshClient::connect(&config, &target, &sshd.pins())
        .await
        .unwrap();

    let (layer2, m2) = (layer.clone(), m.clone());
    let first = tokio::spawn(async move { layer2.apply(&m2, &client).await });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !d.path().join("started").exists() {
        assert!(Instant::now() < deadline, "step 2 never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    net.link(0, false);
    // Keepalive drops the link after about 3 s; ten times that is the bound.
    let e = tokio::time::timeout(Duration::from_secs(30), first)
        .await
        .expect("the cut is noticed by keepalive")
        .unwrap()
        .unwrap_err();
    assert!(e.is_retryable(), "a dropped link is transient: {e}");
    std::fs::write(d.path().join("release"), "").unwrap();
    net.link(0, true);

    let client = SshClient::connect(&config, &target, &sshd.pins())
        .await
        .unwrap();
    assert!(!layer.is_applied(&m, &client).await.unwrap());
    layer.apply(&m, &client).await.unwrap();
    assert!(layer.is_applied(&m, &client).await.unwrap());
    let count = |n: &str| {
        std::fs::read_to_string(d.path().join(n))
            .unwrap_or_default()
            .lines()
            .count()
    };
    assert_eq!(count("s1"), 1, "finished step 1 not redone");
    // The cut did not stop step 2: it went on under its supervisor, and the rerun
    // waited for it instead of starting it again.
    assert_eq!(count("s2"), 1, "interrupted step 2 ran once");
    assert_eq!(count("s3"), 1, "step 3 run once");
    assert_eq!(count("state/resume.done"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_reconnects_after_a_cut_link() {
    let net = Arc::new(Netns::new(1));
    let sshd = net.sshd(0);
    let d = tempfile::tempdir().unwrap();
    let p = |name: &str| d.path().join(name).display().to_string();
    let layer = StepLayer::new(
        "again",
        vec![
            Step::run(format!("echo done >> {}", p("s1"))),
            Step::run(format!(
                "echo done >> {}; while [ ! -e {} ]; do sleep 0.1; done",
                p("s2"),
                p("release")
            )),
        ],
    )
    .unwrap()
    .with_state_dir(p("state"))
    .unwrap();
    let mut m = sshd.machine("cut-2");
    m.access.ssh.as_mut().unwrap().host = net.addrs[0].clone();
    let runner = LayerRunner::new(Arc::new(SshConnector::new(sshd.config())))
        .layer(Arc::new(layer))
        .attempts(3);
    let (s2, release) = (d.path().join("s2"), d.path().join("release"));
    // Cut the link while step 2 waits, keep it down past the keepalive, then restore it.
    let cutter = {
        let net = net.clone();
        tokio::spawn(async move {
            while !s2.exists() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            net.link(0, false);
            tokio::time::sleep(Duration::from_secs(5)).await;
            std::fs::write(release, "").unwrap();
            net.link(0, true);
        })
    };
    let report = runner.run_one(&m).await;
    cutter.await.unwrap();
    assert!(report.result.is_ok(), "{report}");
    assert_eq!(report.connections, 2, "reconnected once: {report}");
    assert!(
        report
            .events
            .iter()
            .any(|e| e.message.starts_with("attempt 1 interrupted")),
        "{report}"
    );
    let count = |n: &str| {
        std::fs::read_to_string(d.path().join(n))
            .unwrap_or_default()
            .lines()
            .count()
    };
    assert_eq!(count("s1"), 1, "{report}");
    assert_eq!(
        count("s2"),
        1,
        "step 2 ran once, the retry waited for it: {report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_reachable_only_through_a_jump_host() {
    let net = Netns::new(1);
    let jump = net.sshd(0);
    let hidden_port = support::free_port();
    // The target listens on the namespace's own loopback: unreachable from here.
    let target_sshd = net.sshd_with(
        0,
        SshdOptions {
            listen: Some(("127.0.0.1".into(), hidden_port)),
            authorized: vec![jump.client_key.with_extension("pub")],
            ..SshdOptions::default()
        },
    );
    let target = SshTarget::new("127.0.0.1", hidden_port, "root").unwrap();
    let direct = SshClient::connect_once(&jump.config(), &target, &target_sshd.pins())
        .await
        .unwrap_err();
    assert_eq!(
        direct.kind(),
        ErrorKind::Transient,
        "not reachable directly: {direct}"
    );
    let config = jump.config().with_jump_host(JumpHost {
        target: SshTarget::new(net.addrs[0].clone(), 22, "root").unwrap(),
        pins: jump.pins(),
    });
    let c = SshClient::connect(&config, &target, &target_sshd.pins())
        .await
        .unwrap();
    let out = c
        .exec(&ExecRequest::new("ip -4 -o addr show dev eth0"))
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&net.addrs[0]),
        "ran inside the namespace"
    );
    c.upload(&machine_core::FileUpload::new(
        target_sshd.dir.path().join("via-jump").to_str().unwrap(),
        "hi",
    ))
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(target_sshd.dir.path().join("via-jump")).unwrap(),
        "hi"
    );
    // The jump host's key is verified too.
    let (_, other) = bootstrap_ssh::generate_ed25519().unwrap();
    let bad = jump.config().with_jump_host(JumpHost {
        target: SshTarget::new(net.addrs[0].clone(), 22, "root").unwrap(),
        pins: vec![bootstrap_ssh::HostKeyPin::parse("pin", &other).unwrap()],
    });
    let e = SshClient::connect(&bad, &target, &target_sshd.pins())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("MISMATCH"), "{e}");
}

/// Content big enough to be caught mid-upload.
fn big_content() -> Vec<u8> {
    let mut content = vec![0u8; 64 << 20];
    let mut x: u64 = 0x2545f4914f6cdd1d;
    for b in content.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    content
}

/// Waits until an upload of `base` into `dir` has begun (its temporary file exists).
async fn upload_started(dir: &std::path::Path, base: &str) {
    // Generous: a debug build on a busy machine.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let begun = std::fs::read_dir(dir).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(&format!(".{base}.bssh-"))
        });
        if begun {
            return;
        }
        assert!(Instant::now() < deadline, "the upload never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// After a retry, only the target itself is left in `dir`.
fn only_target_left(dir: &std::path::Path, base: &str) {
    let names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec![base.to_owned()], "no temporary file left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_killed_mid_upload_fails_at_once_and_the_retry_cleans_up() {
    let net = Netns::new(1);
    let sshd = net.sshd(0);
    let target = SshTarget::new(net.addrs[0].clone(), 22, "root").unwrap();
    let config = sshd.config();
    let client = SshClient::connect(&config, &target, &sshd.pins())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.bin");
    let file = machine_core::FileUpload::new(path.to_str().unwrap(), big_content());
    let upload = {
        let file = file.clone();
        tokio::spawn(async move { client.upload(&file).await })
    };
    upload_started(dir.path(), "big.bin").await;
    // SIGKILL every session process of this sshd and everything under it (the upload's
    // shell too, so no trap of its own can clean up), by PID.
    fn descendants(pid: u32, out: &mut Vec<u32>) {
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        for c in children.split_whitespace() {
            let c: u32 = c.parse().unwrap();
            out.push(c);
            descendants(c, out);
        }
    }
    fn signal(sig: &str, pids: &[u32]) {
        let mut kill = std::process::Command::new("kill");
        kill.arg(sig).args(pids.iter().map(u32::to_string));
        let _ = kill.status();
    }
    // Freeze the whole tree first: killed one by one, the session would die before the
    // shell, whose `cat` then sees end of input and whose trap cleans up, which is not
    // the case under test. Stopped processes neither run nor fork, so rescan until no
    // new one appears, then kill them all.
    let mut doomed = Vec::new();
    loop {
        let mut now = Vec::new();
        descendants(sshd.pid(), &mut now);
        let fresh: Vec<u32> = now.into_iter().filter(|p| !doomed.contains(p)).collect();
        if fresh.is_empty() {
            break;
        }
        signal("-STOP", &fresh);
        doomed.extend(fresh);
    }
    assert!(
        doomed.len() >= 2,
        "a session and its shell exist: {doomed:?}"
    );
    signal("-KILL", &doomed);
    let cut = Instant::now();
    let e = tokio::time::timeout(Duration::from_secs(30), upload)
        .await
        .expect("the dead session is noticed at once")
        .unwrap()
        .unwrap_err();
    assert!(e.is_retryable(), "transient: {e}");
    eprintln!("noticed after {:?}: {e}", cut.elapsed());
    let partial: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(
        partial.len(),
        1,
        "the killed upload left its partial file behind"
    );
    let client = SshClient::connect(&config, &target, &sshd.pins())
        .await
        .unwrap();
    client.upload(&file).await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap().len(), file.content.len());
    only_target_left(dir.path(), "big.bin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_cut_mid_upload_fails_within_the_keepalive_budget_and_the_retry_cleans_up() {
    let net = Netns::new(1);
    let sshd = net.sshd(0);
    let target = SshTarget::new(net.addrs[0].clone(), 22, "root").unwrap();
    // Keepalive every 1 s, dropped after 2 unanswered: a budget of about 3 s.
    let config = sshd.config();
    let client = SshClient::connect(&config, &target, &sshd.pins())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.bin");
    std::fs::write(&path, "old\n").unwrap();
    let file = machine_core::FileUpload::new(path.to_str().unwrap(), big_content());
    let upload = {
        let file = file.clone();
        tokio::spawn(async move { client.upload(&file).await })
    };
    upload_started(dir.path(), "big.bin").await;
    net.link(0, false);
    let cut = Instant::now();
    // A budget of about 3 s; ten times that is the bound (a hang is what it catches).
    let e = tokio::time::timeout(Duration::from_secs(30), upload)
        .await
        .expect("the cut is noticed within the keepalive budget")
        .unwrap()
        .unwrap_err();
    assert!(e.is_retryable(), "transient: {e}");
    eprintln!("noticed after {:?}: {e}", cut.elapsed());
    assert_eq!(
        std::fs::read(&path).unwrap(),
        b"old\n",
        "the target kept its old content"
    );
    net.link(0, true);
    let client = SshClient::connect(&config, &target, &sshd.pins())
        .await
        .unwrap();
    client.upload(&file).await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap().len(), file.content.len());
    only_target_left(dir.path(), "big.bin");
}
