//! What reaches the logs: output line by line up to a bound then a summary, the
//! insecure-policy warning, and never a secret. One subscriber for the whole binary
//! (installed by the first test to ask), so each test looks at the lines of its own sshd.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use bootstrap_ssh::{HostKeyPolicy, LayerRunner, SshClient, SshConnector};
use machine_core::{
    DecoupledSoftware, ExecRequest, Machine, Result, SecretString, Software, Transport,
};
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

/// The log of the whole binary, at debug level for this crate.
fn capture() -> Captured {
    static LOG: OnceLock<Captured> = OnceLock::new();
    LOG.get_or_init(|| {
        let captured = Captured::default();
        let writer = captured.clone();
        tracing_subscriber::fmt()
            .with_env_filter("bootstrap_ssh=debug")
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
        captured
    })
    .clone()
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_logged_line_by_line_boundedly_secrets_never_and_insecure_always_warns() {
    let captured = capture();
    let sshd = Sshd::start();
    let peer = format!("peer=\"127.0.0.1:{}\"", sshd.port);
    let c = SshClient::connect(&sshd.config(), &sshd.target(), &sshd.pins())
        .await
        .unwrap();
    let req =
        ExecRequest::new("printf 'first line\\nsecond line\\nno newline'; echo \"err $TOKEN\" >&2")
            .env("TOKEN", SecretString::from("hunter2-secret"));
    let out = c.exec(&req).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "err ***\n",
        "the command got it, and what it echoed is masked"
    );
    for _ in 0..2 {
        let insecure = sshd
            .config()
            .with_host_keys(HostKeyPolicy::insecure_accept_any());
        SshClient::connect(&insecure, &sshd.target(), &[])
            .await
            .unwrap();
    }
    let logs = captured.text();
    let lines: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("stream=\"stdout\"") && l.contains(&peer))
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
            .any(|l| l.contains("stream=\"stderr\"") && l.contains("err ***")),
        "{logs}"
    );
    assert!(!logs.contains("hunter2"), "{logs}");
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
    let logs = captured.text();
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
    let logs = captured.text();
    assert!(grown < 64 * 1024, "{grown} bytes of log for one command");
    // The machine's log keeps the last max_output bytes: only they cross the link.
    assert!(
        logs[before..].contains(" bytes) not logged") && logs.contains("stdout_bytes=1048576"),
        "a summary of the rest: {}",
        &logs[before..]
    );
}

const TOKEN: &str = "tok-5f3a9c1e-d00d-secret";
const KEY_LINES: [&str; 2] = ["QUFBQWxpbmUtb25lLXNlY3JldA", "QkJCQmxpbmUtdHdvLXNlY3JldA"];

/// The command of the secrets test: echoes its token to both streams, its key to stderr
/// and one line of the key to stdout, then fails.
fn echoing() -> ExecRequest {
    let key = format!(
        "-----BEGIN TEST KEY-----\n{}\n{}\n-----END TEST KEY-----",
        KEY_LINES[0], KEY_LINES[1]
    );
    ExecRequest::new(
        r#"echo "out $TOKEN"; echo "err $TOKEN" >&2; printf '%s\n' "$KEY" >&2; echo "$KEY" | sed -n 2p; exit 3"#,
    )
    .env("TOKEN", SecretString::from(TOKEN))
    .env("KEY", SecretString::from(key))
}

/// What must never be shown: the token, each line of the key, and any 8 bytes of them
/// (a secret cut in two by a bound is still a secret).
fn leaks(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for secret in [TOKEN, KEY_LINES[0], KEY_LINES[1]] {
        for i in 0..=secret.len() - 8 {
            let part = &secret[i..i + 8];
            if text.contains(part) {
                found.push(part.to_owned());
            }
        }
    }
    found
}

/// A layer that runs the echoing command and fails with its output, as a layer does.
struct Echoing;

impl Software for Echoing {
    fn name(&self) -> &str {
        "echoing"
    }
}

#[async_trait]
impl DecoupledSoftware for Echoing {
    async fn is_applied(&self, _: &Machine, _: &dyn Transport) -> Result<bool> {
        Ok(false)
    }

    async fn apply(&self, _: &Machine, transport: &dyn Transport) -> Result<()> {
        let req = echoing();
        transport.exec(&req).await?.check(&req.command).map(drop)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_the_machine_echoes_are_masked_in_output_errors_and_the_log() {
    let captured = capture();
    let sshd = Sshd::start();
    let c = SshClient::connect(&sshd.config(), &sshd.target(), &sshd.pins())
        .await
        .unwrap();

    // The output: the command got both values (it printed something in their place).
    let out = c.exec(&echoing()).await.unwrap();
    assert_eq!(out.status, Some(3));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "out ***\n***\n",
        "a line of the key alone"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "err ***\n***\n",
        "the key whole"
    );

    // A bound that cuts a secret in two (the raw last 10 bytes are the end of a line
    // of the key): the secret is masked whole, not shown in part.
    let out = c.exec(&echoing().max_output(10)).await.unwrap();
    assert!(out.truncated);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "***\n");
    assert!(leaks(&String::from_utf8_lossy(&out.stderr)).is_empty());

    // The exec error, shown and debugged.
    let e = c.run(&echoing()).await.unwrap_err();
    assert!(e.to_string().contains("err ***"), "{e}");
    let shown = format!("{e} {e:?}");
    assert!(leaks(&shown).is_empty(), "{:?} in {shown}", leaks(&shown));

    // A layer's error, through the runner, shown and debugged.
    let runner =
        LayerRunner::new(Arc::new(SshConnector::new(sshd.config()))).layer(Arc::new(Echoing));
    let report = runner.run_one(&sshd.machine("echo-1")).await;
    let e = report.result.as_ref().unwrap_err();
    assert!(e.to_string().contains("exited with status 3"), "{e}");
    let shown = format!("{e} {e:?} {report} {report:?}");
    assert!(leaks(&shown).is_empty(), "{:?} in {shown}", leaks(&shown));

    // The debug log of all of it: the lines are there, masked.
    let logs = captured.text();
    assert!(
        logs.lines()
            .any(|l| l.contains("stream=\"stdout\"") && l.contains("out ***")),
        "{logs}"
    );
    assert!(leaks(&logs).is_empty(), "{:?} in {logs}", leaks(&logs));
}
