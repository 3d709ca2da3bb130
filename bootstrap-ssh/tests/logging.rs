//! What reaches the logs: output line by line up to a bound then a summary, the
//! insecure-policy warning, and never a secret. One subscriber for the whole binary, so this file holds one test.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use bootstrap_ssh::{HostKeyPolicy, SshClient};
use machine_core::{ExecRequest, SecretString, Transport};
use support::Sshd;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_logged_line_by_line_boundedly_secrets_never_and_insecure_always_warns() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_env_filter("bootstrap_ssh=debug")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    let sshd = Sshd::start();
    let c = SshClient::connect(&sshd.config(), &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    let req =
        ExecRequest::new("printf 'first line\\nsecond line\\nno newline'; echo \"err $TOKEN\" >&2")
            .env("TOKEN", SecretString::from("hunter2-secret"));
    let out = c.exec(&req).await.unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("hunter2-secret"),
        "the command got it"
    );
    for _ in 0..2 {
        let insecure = sshd
            .config()
            .with_host_keys(HostKeyPolicy::insecure_accept_any());
        SshClient::connect(&insecure, &sshd.target(), &[])
            .await
            .unwrap();
    }
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("stream=\"stdout\""))
        .collect();
    assert_eq!(lines.len(), 3, "{logs}");
    assert!(
        lines[0].contains("exec: first line")
            && lines[1].contains("exec: second line")
            && lines[2].contains("exec: no newline"),
        "{logs}"
    );
    assert!(
        logs.lines()
            .any(|l| l.contains("stream=\"stderr\"") && l.contains("err ")),
        "{logs}"
    );
    // The secret is in the command's own output (which the caller asked for), so only
    // the exec line itself is checked: it names the command, not the environment.
    let exec_lines: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("exec") && l.contains("command="))
        .collect();
    assert!(!exec_lines.is_empty(), "{logs}");
    assert!(exec_lines.iter().all(|l| !l.contains("hunter2")), "{logs}");
    assert_eq!(
        logs.matches("NOT verified").count(),
        2,
        "a warning on every insecure connection: {logs}"
    );

    // Control characters from the machine (ESC, BEL, CR) are escaped in errors and in
    // the log, as OpenSSH shows them: a terminal would act on them.
    let e = c
        .run(&ExecRequest::new(
            r"printf 'bad\033[31mred\a\rover\tok\n' >&2; printf 'out\033]0;title\a\n'; exit 2",
        ))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("bad\\x1b[31mred\\x07\\x0dover\tok"),
        "escaped: {e:?}"
    );
    assert!(!e.contains(['\x1b', '\x07', '\r']), "{e:?}");
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("out\\x1b]0;title\\x07"), "{logs}");
    assert!(
        !logs.contains(['\x1b', '\x07', '\r']),
        "raw control characters in the log"
    );

    // 100 MB of short lines: the log gets a bounded share and a summary, not 100 MB.
    let before = captured.0.lock().unwrap().len();
    let mut flood = ExecRequest::new("yes 0123456789abcdef | head -c 100000000");
    flood.max_output = 1 << 20;
    let out = c.exec(&flood).await.unwrap();
    assert!(out.truncated && out.stdout.len() == 1 << 20);
    let grown = captured.0.lock().unwrap().len() - before;
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(grown < 64 * 1024, "{grown} bytes of log for one command");
    // The machine's log keeps the last max_output bytes: only they cross the link.
    assert!(
        logs[before..].contains(" bytes) not logged") && logs.contains("stdout_bytes=1048576"),
        "a summary of the rest: {}",
        &logs[before..]
    );
}
