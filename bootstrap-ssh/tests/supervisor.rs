//! The supervisor that owns every command on the machine, against real sshd: a timeout
//! kills the whole process group (as root, where sshd refuses signal requests, and as
//! another user), a cut connection leaves the command running and the rerun of the step
//! takes its outcome, a second client of the same step waits for the first run, the same
//! command without a step key is a run of its own every time, and the
//! supervisor's own failure modes: a full disk, a noexec /tmp, a restarted machine
//! (boot id changed) and a reused pid.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use bootstrap_ssh::{SshClient, SshTarget};
use machine_core::{ErrorKind, ExecRequest, Transport};
use support::{Netns, Sshd, SshdOptions, TempUser, processes_with};

/// Waits until no process with `marker` in its command line is left, for at most 60 s
/// (the killer waits for them; generous for a slow, busy machine).
fn assert_all_gone(marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = processes_with(marker);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still running after the timeout: {left:?} ({marker})"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A command whose group holds a background child and a foreground one, both marked.
fn two_sleepers(marker: &str) -> String {
    format!("sh -c 'sleep 318 & sleep 317; :' {marker}-a & sh -c 'sleep 317; :' {marker}-b; wait")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_as_root_kills_the_whole_process_group() {
    let sshd = Sshd::start();
    let c = SshClient::connect(&sshd.config(), &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    let marker = format!("bssh-root-{}", support::unique());
    let e = c
        .exec(&ExecRequest::new(two_sleepers(&marker)).timeout(Duration::from_secs(3)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("was killed with SIGKILL") && msg.contains("none is left"),
        "{msg}"
    );
    assert!(msg.contains("sleep"), "names what it killed: {msg}");
    assert_all_gone(&marker);
    // The connection is still good, and the same command runs anew.
    let out = c
        .exec(&ExecRequest::new(format!("echo {marker}")))
        .await
        .unwrap();
    assert_eq!(out.stdout, format!("{marker}\n").into_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_as_another_user_kills_the_whole_process_group() {
    let user = TempUser::new("unused-password");
    let sshd = Sshd::start();
    let target = SshTarget::new("127.0.0.1", sshd.port, user.name.clone()).unwrap();
    let c = SshClient::connect(&sshd.config(), &target, &sshd.pins())
        .await
        .unwrap();
    let marker = format!("bssh-user-{}", support::unique());
    let e = c
        .exec(&ExecRequest::new(two_sleepers(&marker)).timeout(Duration::from_secs(3)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.to_string().contains("none is left"), "{e}");
    assert_all_gone(&marker);
    let dir = format!("/tmp/bootstrap-ssh-{}", user.name);
    let meta = std::fs::symlink_metadata(&dir).unwrap();
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    assert_eq!(meta.permissions().mode() & 0o777, 0o700, "{dir}");
    assert_ne!(meta.uid(), 0, "{dir} is the user's");
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_leaves_the_command_running_and_the_rerun_takes_its_outcome() {
    let net = Netns::new(1);
    let sshd = net.sshd(0);
    let d = tempfile::tempdir().unwrap();
    let count = d.path().join("count");
    let started = d.path().join("started");
    let cmd = format!(
        "echo start; touch {s}; sleep 4; echo ran >> {n}; echo finished",
        s = started.display(),
        n = count.display()
    );
    let target = SshTarget::new(net.addrs[0].clone(), 22, "root").unwrap();
    let config = sshd.config();
    let c = SshClient::connect(&config, &target, &sshd.pins())
        .await
        .unwrap();
    let first = {
        let cmd = cmd.clone();
        tokio::spawn(async move { c.exec(&ExecRequest::new(cmd).step("cut")).await })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !started.exists() {
        assert!(Instant::now() < deadline, "never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    net.link(0, false);
    // Keepalive drops the link after about 3 s; ten times that is the bound.
    let e = tokio::time::timeout(Duration::from_secs(30), first)
        .await
        .expect("the cut is noticed by keepalive")
        .unwrap()
        .unwrap_err();
    assert!(e.is_retryable(), "a cut is transient: {e}");
    assert!(e.to_string().contains("goes on on the machine"), "{e}");
    net.link(0, true);
    let c = SshClient::connect(&config, &target, &sshd.pins())
        .await
        .unwrap();
    let out = c
        .exec(&ExecRequest::new(cmd.clone()).step("cut"))
        .await
        .unwrap();
    assert_eq!(out.status, Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "start\nfinished\n");
    assert_eq!(
        std::fs::read_to_string(&count).unwrap(),
        "ran\n",
        "ran once"
    );
    // Collected: the next run of the step is a new run.
    c.exec(&ExecRequest::new(cmd).step("cut")).await.unwrap();
    assert_eq!(std::fs::read_to_string(&count).unwrap(), "ran\nran\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_client_of_a_running_command_waits_for_it() {
    let sshd = Sshd::start();
    let d = tempfile::tempdir().unwrap();
    let count = d.path().join("count");
    let cmd = format!(
        "sleep 2; echo ran >> {n}; echo out; echo err >&2; exit 4",
        n = count.display()
    );
    let a = SshClient::connect(&sshd.config(), &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    let b = SshClient::connect(&sshd.config(), &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    let req = ExecRequest::new(cmd).step("wait");
    let first = a.exec(&req);
    let second = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        b.exec(&req).await
    };
    let (x, y) = tokio::join!(first, second);
    let (x, y) = (x.unwrap(), y.unwrap());
    for out in [&x, &y] {
        assert_eq!(out.status, Some(4));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
    }
    assert_eq!(std::fs::read_to_string(&count).unwrap(), "ran\n", "one run");
}

/// Runs `req` (which takes a while) and returns its run key: the name of its record
/// while it runs in `dir`.
async fn key_of(c: &SshClient, dir: &Path, req: &ExecRequest) -> String {
    let run = c.exec(req);
    let look = async {
        loop {
            let found = std::fs::read_dir(dir).ok().and_then(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .find(|n| n.ends_with(".run"))
            });
            if let Some(n) = found {
                return n.trim_end_matches(".run").to_owned();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let (out, key) = tokio::join!(run, look);
    out.unwrap();
    // Collected: marked so before the client has its outcome (the records go when the
    // supervisor ends, or with the next run of the key).
    assert!(dir.join(format!("{key}.ok")).exists(), "{key} collected");
    key
}

/// Leaves only the record of run `key` in `dir`: a run in progress, as a supervisor that
/// died (or a machine that restarted) leaves it.
fn in_progress(dir: &Path, key: &str) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(key) && name != format!("{key}.run") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_a_restarted_machine_or_a_reused_pid_do_not_hold_a_rerun() {
    let sshd = Sshd::start();
    let runs = tempfile::tempdir().unwrap();
    let dir = runs.path().join("runs");
    let config = sshd.config().with_run_dir(dir.to_str().unwrap());
    let c = SshClient::connect(&config, &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    let d = tempfile::tempdir().unwrap();
    let count = d.path().join("count");
    let cmd = format!("sleep 1; echo ran >> {}; echo out", count.display());
    let req = ExecRequest::new(&cmd).step("restart");
    let key = key_of(&c, &dir, &req).await;
    assert_eq!(std::fs::read_to_string(&count).unwrap(), "ran\n");
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let mut live = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", live.id())).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    let start = fields[19];
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let record = dir.join(format!("{key}.run"));
    // A reused pid: the recorded supervisor's pid now belongs to another process
    // (another start time). The rerun must not wait for that process.
    in_progress(&dir, &key);
    std::fs::write(
        &record,
        format!("{} 1 {} {} {now}\n", live.id(), boot.trim(), live.id()),
    )
    .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), c.exec(&req))
        .await
        .expect("a rerun does not wait for a reused pid")
        .unwrap();
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(std::fs::read_to_string(&count).unwrap(), "ran\nran\n");
    // A restarted machine: the record's process is alive with its start time, but the
    // boot id differs (a pid of the previous boot).
    in_progress(&dir, &key);
    std::fs::write(
        &record,
        format!(
            "{} {start} 00000000-0000-0000-0000-000000000000 {} {now}\n",
            live.id(),
            live.id()
        ),
    )
    .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), c.exec(&req))
        .await
        .expect("a rerun does not wait for a run of another boot")
        .unwrap();
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(std::fs::read_to_string(&count).unwrap(), "ran\nran\nran\n");
    // The run directory gone (a restart emptied /run): made again, the command runs.
    std::fs::remove_dir_all(&dir).unwrap();
    c.exec(&req).await.unwrap();
    assert_eq!(count_lines(&count), 4);
    let _ = live.kill();
    let _ = live.wait();
}

fn count_lines(p: &Path) -> usize {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_to_start_and_never_fails_the_commands_writes() {
    let tiny = std::env::temp_dir().join(format!("bssh-tiny-{}", support::unique()));
    let sshd = Sshd::with(SshdOptions {
        private_dir: Some(tiny.clone()),
        private_dir_options: "size=64k",
        ..SshdOptions::default()
    });
    let plain = SshClient::connect(&sshd.config(), &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    let runs = tiny.join("runs");
    let config = sshd.config().with_run_dir(runs.to_str().unwrap());
    let c = SshClient::connect(&config, &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    let d = tempfile::tempdir().unwrap();
    let marker = d.path().join("ran");

    // Room for the records, not for the output: the log is cut, the command's own
    // writes never fail, and its status comes back.
    let out = c
        .exec(&ExecRequest::new(format!(
            "i=0; while [ $i -lt 2000 ]; do echo 0123456789012345678901234567890123456789012345678901234567890123456789 || exit 9; i=$((i+1)); done; touch {}",
            marker.display()
        )))
        .await
        .unwrap();
    assert_eq!(
        out.status,
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(marker.exists(), "the command ran to its end");

    // The disk full before the start: refused, saying why, and the command not run.
    plain
        .exec(&ExecRequest::new(format!(
            "head -c 1000000 /dev/zero > {}/fill; true",
            tiny.display()
        )))
        .await
        .unwrap();
    std::fs::remove_file(&marker).unwrap();
    let e = c
        .exec(&ExecRequest::new(format!("touch {}", marker.display())))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
    assert!(
        e.to_string().contains("cannot record the run")
            && e.to_string().contains(runs.to_str().unwrap()),
        "{e}"
    );
    assert!(!marker.exists(), "not run without its records");
    plain
        .exec(&ExecRequest::new(format!("rm {}/fill", tiny.display())))
        .await
        .unwrap();
    c.exec(&ExecRequest::new(format!("touch {}", marker.display())))
        .await
        .unwrap();
    assert!(marker.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noexec_tmp_is_fine_for_another_user() {
    let user = TempUser::new("unused-password");
    let noexec = std::env::temp_dir().join(format!("bssh-noexec-{}", support::unique()));
    let sshd = Sshd::with(SshdOptions {
        private_dir: Some(noexec.clone()),
        private_dir_options: "mode=1777,noexec",
        ..SshdOptions::default()
    });
    let target = SshTarget::new("127.0.0.1", sshd.port, user.name.clone()).unwrap();
    let config = sshd
        .config()
        .with_run_dir(noexec.join("runs").to_str().unwrap());
    let c = SshClient::connect(&config, &target, &sshd.pins())
        .await
        .unwrap();
    let out = c.exec(&ExecRequest::new("id -un")).await.unwrap();
    assert_eq!(out.stdout, format!("{}\n", user.name).into_bytes());
    // It is noexec indeed: a script there cannot be run.
    let out = c
        .exec(&ExecRequest::new(format!(
            "printf '#!/bin/sh\\necho x\\n' > {d}/s; chmod +x {d}/s; {d}/s",
            d = noexec.display()
        )))
        .await
        .unwrap();
    assert_ne!(out.status, Some(0), "the mount is noexec");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_supervisor_runs_on_busybox_sh_and_applets() {
    support::need("busybox", "busybox");
    let applets = tempfile::tempdir().unwrap();
    support::run(
        "busybox",
        &["--install", "-s", applets.path().to_str().unwrap()],
    );
    // Nothing but busybox on the session's PATH: sh, tail, cat, rm, mkdir, sleep.
    let extra = format!("SetEnv PATH={} SHLVL=1", applets.path().display());
    let sshd = Sshd::with(SshdOptions {
        extra: &extra,
        ..SshdOptions::default()
    });
    let c = SshClient::connect(&sshd.config(), &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    let out = c
        .exec(
            &ExecRequest::new(
                "readlink -f \"$(command -v sh)\"; [ \"$TOKEN\" = \"s3 'cr' \\$(et)\" ] && echo got it; echo \"$TOKEN\"; echo oops >&2; exit 5",
            )
            .env("TOKEN", machine_core::SecretString::from("s3 'cr' $(et)")),
        )
        .await
        .unwrap();
    assert_eq!(out.status, Some(5));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "/usr/bin/busybox\ngot it\n***\n",
        "the command got the value; what it printed of it is masked"
    );
    assert_eq!(out.stderr, b"oops\n");
    let out = c
        .exec(
            &ExecRequest::new("i=0; while [ $i -lt 5000 ]; do echo line-$i; i=$((i+1)); done")
                .max_output(12),
        )
        .await
        .unwrap();
    let full: String = (0..5000).map(|i| format!("line-{i}\n")).collect();
    assert_eq!(out.stdout, full.as_bytes()[full.len() - 12..]);
    assert!(out.truncated);
    // Uploads too, on busybox's head (it reads ahead of what it writes: nothing may
    // follow the content until the supervisor asks), chown, chmod and mv -T; then a
    // command on the same supervisor, so it read no more input than the content.
    let up = sshd.dir.path().join("bb/up.bin");
    let body: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    for file in [
        machine_core::FileUpload::new(up.to_str().unwrap(), body.clone()).mode(0o600),
        machine_core::FileUpload::new(up.to_str().unwrap(), body.clone()).mode(0o750),
    ] {
        c.upload(&file).await.unwrap();
        assert_eq!(std::fs::read(&up).unwrap(), body);
    }
    let out = c.exec(&ExecRequest::new("echo after")).await.unwrap();
    assert_eq!(out.stdout, b"after\n");
    let marker = format!("bssh-bb-{}", support::unique());
    let e = c
        .exec(&ExecRequest::new(two_sleepers(&marker)).timeout(Duration::from_secs(2)))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("none is left"), "{e}");
    assert_all_gone(&marker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_command_run_again_at_once_runs_again() {
    // A machine slow to remove files (an `rm` that takes 0.3 s first in the PATH): the
    // records of a collected run are still there when the client has its outcome.
    let slow = tempfile::tempdir().unwrap();
    let rm = slow.path().join("rm");
    std::fs::write(&rm, "#!/bin/sh\nsleep 0.3\nexec /bin/rm \"$@\"\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&rm, std::fs::Permissions::from_mode(0o755)).unwrap();
    let extra = format!(
        "SetEnv SHLVL=1 PATH={}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        slow.path().display()
    );
    let sshd = Sshd::with(SshdOptions {
        extra: &extra,
        ..SshdOptions::default()
    });
    let c = SshClient::connect(&sshd.config(), &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    let d = tempfile::tempdir().unwrap();
    let count = d.path().join("count");
    let req =
        ExecRequest::new(format!("echo ran >> {0}; wc -l < {0}", count.display())).step("again");
    // Each run is collected before the next starts: none may take the previous run's
    // outcome (its records being removed) as its own.
    for i in 1..=5 {
        let out = c.exec(&req).await.unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            i.to_string(),
            "run {i}"
        );
    }
}

/// The session (process group leader's session) a command runs in, from its shell's
/// `/proc/$$/stat`.
const SESSION: &str = "read -r s < /proc/$$/stat; set -- ${s##*) }; echo $4";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_keeps_its_supervisors_and_a_timeout_kills_only_its_own() {
    let sshd = Sshd::start();
    let runs = tempfile::tempdir().unwrap();
    let dir = runs.path().join(format!("runs-{}", support::unique()));
    let config = sshd.config().with_run_dir(dir.to_str().unwrap());
    let c = SshClient::connect(&config, &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    // One after another: the same supervisor, so the same session, serves them all.
    let mut sessions = std::collections::BTreeSet::new();
    for i in 0..5 {
        let out = c
            .exec(&ExecRequest::new(format!("{SESSION}; : {i}")))
            .await
            .unwrap();
        sessions.insert(String::from_utf8(out.stdout).unwrap());
    }
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    // At once: each its own supervisor. A timeout kills its own process group, never
    // the other command's, which finishes.
    let marker = format!("bssh-own-{}", support::unique());
    let long = ExecRequest::new(format!("sleep 2; echo survived {marker}"));
    let doomed = ExecRequest::new(two_sleepers(&marker)).timeout(Duration::from_secs(1));
    let (long, doomed) = tokio::join!(c.exec(&long), c.exec(&doomed));
    assert_eq!(doomed.unwrap_err().kind(), ErrorKind::Timeout);
    assert_eq!(
        String::from_utf8_lossy(&long.unwrap().stdout),
        format!("survived {marker}\n")
    );
    // The connection goes on: a supervisor is started again where one was killed.
    let out = c.exec(&ExecRequest::new("echo again")).await.unwrap();
    assert_eq!(out.stdout, b"again\n");
    // Closing ends every supervisor: none is left running on the machine.
    let marker = dir.to_str().unwrap().to_owned();
    assert!(!processes_with(&marker).is_empty(), "supervisors run");
    c.close().await;
    drop(c);
    assert_all_gone(&marker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_and_uploads_keep_the_login_umask() {
    let sshd = Sshd::start();
    let c = SshClient::connect(&sshd.config(), &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    // sshd, started by this test, passes this process's umask to its sessions.
    let mine = std::process::Command::new("sh")
        .args(["-c", "umask"])
        .output()
        .unwrap()
        .stdout;
    let d = tempfile::tempdir().unwrap();
    let out = c
        .exec(&ExecRequest::new(format!(
            "umask; mkdir {0}/made; touch {0}/made/file",
            d.path().display()
        )))
        .await
        .unwrap();
    assert_eq!(out.stdout, mine, "the command's umask is the login's");
    let umask = u32::from_str_radix(String::from_utf8_lossy(&mine).trim(), 8).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&d.path().join("made")), 0o777 & !umask);
    assert_eq!(mode(&d.path().join("made/file")), 0o666 & !umask);
    // Directories an upload makes on the way too.
    let path = d.path().join("up/deep/file");
    c.upload(&machine_core::FileUpload::new(path.to_str().unwrap(), "x"))
        .await
        .unwrap();
    assert_eq!(mode(&d.path().join("up")), 0o777 & !umask);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collected_runs_go_with_their_supervisor_and_a_rerun_runs_once() {
    let sshd = Sshd::start();
    let runs = tempfile::tempdir().unwrap();
    let dir = runs.path().join("runs");
    let config = sshd.config().with_run_dir(dir.to_str().unwrap());
    let (target, pins) = (sshd.target(), sshd.pins());
    let connect = || SshClient::connect(&config, &target, &pins);
    let d = tempfile::tempdir().unwrap();
    let count = d.path().join("count");
    let cmd = format!("sleep 1; echo ran >> {0}; wc -l < {0}", count.display());
    let req = ExecRequest::new(&cmd).step("collected");
    let keeper = connect().await.unwrap();
    let key = key_of(&keeper, &dir, &req).await;
    // Collected, its records kept while its supervisor lives: two clients running the
    // command again at once run it once, and both get that run's outcome.
    let (a, b) = (connect().await.unwrap(), connect().await.unwrap());
    let (x, y) = tokio::join!(a.exec(&req), b.exec(&req));
    let (x, y) = (x.unwrap(), y.unwrap());
    assert_eq!(x.stdout, b"2\n");
    assert_eq!(y.stdout, b"2\n");
    assert_eq!(count_lines(&count), 2, "one run for both");
    // Every supervisor ends with its connection and takes the records it collected
    // along: nothing of the key is left.
    for c in [keeper, a, b] {
        c.close().await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&key))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "left: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_collected_by_a_killed_supervisor_go_with_the_next_one() {
    let sshd = Sshd::start();
    let runs = tempfile::tempdir().unwrap();
    let dir = runs.path().join("runs");
    let config = sshd.config().with_run_dir(dir.to_str().unwrap());
    let c = SshClient::connect(&config, &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    let key = key_of(
        &c,
        &dir,
        &ExecRequest::new("sleep 1; echo one").step("orphan"),
    )
    .await;
    // The supervisor that collected it is killed with a command of its own that
    // times out (its process group goes): it cannot remove what it collected.
    let marker = format!("bssh-orphan-{}", support::unique());
    let e = c
        .exec(&ExecRequest::new(two_sleepers(&marker)).timeout(Duration::from_secs(1)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(dir.join(format!("{key}.ok")).exists(), "left collected");
    // The next supervisor removes runs whose collector is dead.
    let other = SshClient::connect(&config, &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    other.exec(&ExecRequest::new("true")).await.unwrap();
    assert!(
        !dir.join(format!("{key}.run")).exists() && !dir.join(format!("{key}.ok")).exists(),
        "removed by the next supervisor"
    );
}

/// The parent PID of process `pid`.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_killed_by_someone_else_says_so_and_the_rerun_runs_again() {
    let sshd = Sshd::start();
    let runs = tempfile::tempdir().unwrap();
    let dir = runs.path().join(format!("runs-{}", support::unique()));
    let config = sshd.config().with_run_dir(dir.to_str().unwrap());
    let c = SshClient::connect(&config, &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    let d = tempfile::tempdir().unwrap();
    let count = d.path().join("count");
    let started = d.path().join("started");
    let cmd = format!(
        "echo ran >> {n}; touch {s}; sleep 2",
        n = count.display(),
        s = started.display()
    );
    let req = ExecRequest::new(&cmd).step("killed");
    let run = c.exec(&req);
    let kill = async {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !started.exists() {
            assert!(Instant::now() < deadline, "never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The run's own shell: a supervisor's child that is a supervisor too.
        let marker = dir.to_str().unwrap();
        let shells = processes_with(marker);
        let run = shells
            .iter()
            .find(|p| parent_of(**p).is_some_and(|pp| shells.contains(&pp)))
            .copied()
            .expect("the run's shell");
        support::run("kill", &["-KILL", &run.to_string()]);
    };
    let (out, ()) = tokio::join!(run, kill);
    let e = out.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains("killed"), "{e}");
    // The connection's supervisor goes on; the run without an outcome is run again.
    c.exec(&req).await.unwrap();
    assert_eq!(count_lines(&count), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_leave_only_a_few_supervisors_within_sshds_session_limit() {
    // sshd's default limit of sessions per connection.
    let sshd = Sshd::with(SshdOptions {
        extra: "MaxSessions 10",
        ..SshdOptions::default()
    });
    let c = SshClient::connect(&sshd.config(), &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    // Bursts of 8 at once: the supervisors beyond the few kept idle end with their
    // request, so each burst finds room again.
    for round in 0..4 {
        let reqs: Vec<ExecRequest> = (0..8)
            .map(|i| ExecRequest::new(format!("sleep 0.3; echo {round}-{i}")))
            .collect();
        let outs = futures_util::future::join_all(reqs.iter().map(|r| c.exec(r))).await;
        for (i, out) in outs.into_iter().enumerate() {
            let out = out.unwrap_or_else(|e| panic!("round {round}, {i}: {e}"));
            assert_eq!(out.stdout, format!("{round}-{i}\n").into_bytes());
        }
    }
}

/// Appends a line to `count`, then waits (30 s at most) until `count` holds two lines:
/// two runs of it finish only together, so two clients' runs overlap.
fn meet(count: &Path) -> String {
    format!(
        "echo ran >> {n}; i=0; while [ \"$(wc -l < {n})\" -lt 2 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; echo \"$$\"",
        n = count.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_commands_without_a_step_key_from_two_clients_both_run() {
    let sshd = Sshd::start();
    let (config, target, pins) = (sshd.config(), sshd.target(), sshd.pins());
    let connect = || SshClient::connect(&config, &target, &pins);
    let (a, b) = (connect().await.unwrap(), connect().await.unwrap());
    let d = tempfile::tempdir().unwrap();
    let count = d.path().join("count");
    // The same read from two replicas at once (a claim file, say): each its own run,
    // each its own output. Sharing a run, the second waited for the first, which waited
    // for the second's line.
    let req = ExecRequest::new(meet(&count));
    let (x, y) = tokio::join!(a.exec(&req), b.exec(&req));
    let (x, y) = (x.unwrap(), y.unwrap());
    assert_eq!((x.status, y.status), (Some(0), Some(0)));
    assert_eq!(count_lines(&count), 2, "both ran");
    assert_ne!(x.stdout, y.stdout, "each got its own run's output");
    // From one client at once too.
    std::fs::remove_file(&count).unwrap();
    let (x, y) = tokio::join!(a.exec(&req), a.exec(&req));
    assert_ne!(x.unwrap().stdout, y.unwrap().stdout);
    assert_eq!(count_lines(&count), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_client_is_killed_its_step_is_adopted_and_a_command_without_a_key_runs_again() {
    let sshd = Sshd::start();
    let runs = tempfile::tempdir().unwrap();
    let dir = runs.path().join("runs");
    let config = sshd.config().with_run_dir(dir.to_str().unwrap());
    let (target, pins) = (sshd.target(), sshd.pins());
    let connect = || SshClient::connect(&config, &target, &pins);
    let d = tempfile::tempdir().unwrap();
    let cmd = |name: &str| {
        let p = d.path();
        format!(
            "echo ran >> {p}/{name}; touch {p}/{name}-started; sleep 2; echo done >> {p}/{name}-end; wc -l < {p}/{name}",
            p = p.display()
        )
    };
    let step = ExecRequest::new(cmd("step")).step("layer/1");
    let read = ExecRequest::new(cmd("read"));
    // Two controllers, killed while their commands run: their futures and clients
    // dropped, their connections gone.
    let mut killed = Vec::new();
    for req in [step.clone(), read.clone()] {
        let c = connect().await.unwrap();
        killed.push(tokio::spawn(async move { c.exec(&req).await }));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(d.path().join("step-started").exists() && d.path().join("read-started").exists()) {
        assert!(Instant::now() < deadline, "never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for task in &killed {
        task.abort();
    }
    // Both finish on the machine, uncollected.
    while !(d.path().join("step-end").exists() && d.path().join("read-end").exists()) {
        assert!(Instant::now() < deadline, "never finished");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = connect().await.unwrap();
    // The step run again by a new controller takes over the outcome: run once.
    let out = c.exec(&step).await.unwrap();
    assert_eq!(out.stdout, b"1\n");
    assert_eq!(count_lines(&d.path().join("step")), 1, "the step ran once");
    // The command without a key is not given the earlier call's answer: it runs.
    let out = c.exec(&read).await.unwrap();
    assert_eq!(out.stdout, b"2\n", "a new run, a new answer");
    assert_eq!(count_lines(&d.path().join("read")), 2);
    c.close().await;
    // Nobody would collect the killed controller's run without a key: its supervisor,
    // which could not deliver it, removes its records.
    loop {
        let left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('u'))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "left: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
