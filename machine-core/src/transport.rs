//! Connections to running machines: the [`Transport`] a decoupled layer is written
//! against, and the [`Connector`] that opens one for a machine.
//!
//! SSH implements these for real hosts, the simulator in memory; the same layer runs on
//! both, the way Ansible's connection plugins work.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use secrecy::{ExposeSecret, SecretString};

use crate::error::{Error, ErrorKind, Result};
use crate::machine::Machine;

/// The default bound on captured stdout and stderr, each: 1 MiB.
pub const DEFAULT_MAX_OUTPUT: usize = 1 << 20;

/// A command to run on a machine.
///
/// The command line is logged and shown in errors, so it must not hold secrets: pass
/// them in [`ExecRequest::env`], whose values are [`SecretString`]s and never shown.
/// `#[non_exhaustive]`: build it with [`ExecRequest::new`] and the builder methods.
#[derive(Clone)]
#[non_exhaustive]
pub struct ExecRequest {
    /// The command line, run by the machine's shell (`sh -c`).
    pub command: String,
    /// Environment variables for the command; values are secret.
    pub env: Vec<(String, SecretString)>,
    /// Run as root through `sudo -n`.
    pub sudo: bool,
    /// Give up after this long; `None` for no limit beyond the transport's own.
    pub timeout: Option<Duration>,
    /// Keep at most this many bytes of stdout and of stderr (the tail is kept).
    pub max_output: usize,
    /// A stable identity of a resumable step, set with [`ExecRequest::step`].
    pub step: Option<String>,
}

impl ExecRequest {
    /// A command with no environment, no sudo, no timeout and the default output bound.
    pub fn new(command: impl Into<String>) -> Self {
        ExecRequest {
            command: command.into(),
            env: Vec::new(),
            sudo: false,
            timeout: None,
            max_output: DEFAULT_MAX_OUTPUT,
            step: None,
        }
    }

    /// Adds an environment variable whose value is kept secret.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<SecretString>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Runs the command through `sudo -n`.
    pub fn sudo(mut self) -> Self {
        self.sudo = true;
        self
    }

    /// Sets a timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Keeps at most `bytes` of stdout and of stderr (the tail).
    pub fn max_output(mut self, bytes: usize) -> Self {
        self.max_output = bytes;
        self
    }

    /// Names this request as a resumable step: a stable identity (e.g. a layer's name and
    /// the step's index) that a controller re-running after a crash gives again. A
    /// transport that can supervise remote runs lets a later request with the same step
    /// key (same target and user) adopt the run still going, or its outcome not yet
    /// collected, instead of starting the command again: right for idempotent steps only.
    /// Without a key every request is a run of its own (a transport may still resume it
    /// within the same call after a cut connection); plain reads and probes stay unkeyed,
    /// so they never get an earlier call's answer.
    pub fn step(mut self, key: impl Into<String>) -> Self {
        self.step = Some(key.into());
        self
    }

    /// How to run this request through a remote POSIX shell without exposing its
    /// secrets: the command line to send, and bytes to write to the command's stdin
    /// first.
    ///
    /// Environment values never appear on the command line, where `ps` on the machine
    /// would show them for as long as the command runs: a wrapper shell reads exactly
    /// their length from stdin with `head -c`, evaluates the `export` lines and execs
    /// the command, which then reads the rest of stdin untouched. `sudo -n` wraps the
    /// whole when asked. Refuses variable names that are not shell names
    /// (`env[i].name`) and NUL bytes (`env[i].value`, `command`).
    pub fn remote_shell(&self) -> Result<RemoteShell> {
        let quote = |field: &str, s: &str| {
            shlex::try_quote(s)
                .map(|q| q.into_owned())
                .map_err(|_| Error::invalid_spec(field, "holds a NUL byte"))
        };
        let sudo = if self.sudo { "sudo -n " } else { "" };
        if self.env.is_empty() {
            return Ok(RemoteShell {
                line: format!("{sudo}sh -c {}", quote("command", &self.command)?),
                stdin_prefix: Vec::new(),
            });
        }
        let mut script = String::new();
        for (i, (name, value)) in self.env.iter().enumerate() {
            let ok = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok {
                return Err(Error::invalid_spec(
                    format!("env[{i}].name"),
                    format!("{name:?} is not a shell variable name"),
                ));
            }
            let value = quote(&format!("env[{i}].value"), value.expose_secret())?;
            script.push_str(&format!("export {name}={value}\n"));
        }
        let wrapper = format!("eval \"$(head -c {})\" && exec sh -c \"$0\"", script.len());
        Ok(RemoteShell {
            line: format!(
                "{sudo}sh -c {} {}",
                quote("command", &wrapper)?,
                quote("command", &self.command)?
            ),
            stdin_prefix: script.into_bytes(),
        })
    }
}

/// What [`ExecRequest::mask_output`] writes in place of a secret value.
pub const MASK: &str = "***";

/// Secret values shorter than this are not masked: masking every `a` of an output for a
/// one-letter "secret" would destroy it and protect nothing.
pub const MIN_MASKED_LEN: usize = 4;

impl ExecRequest {
    /// Masks the request's secret environment values (and each of their lines, for a
    /// multi-line value such as a key) wherever they appear in `output`'s stdout and
    /// stderr, the way CI systems mask secrets in logs: a command that echoes its token
    /// must not put it in an error, a verdict or a debug log. Every [`Transport`]
    /// applies it to what it returns, before anything is logged.
    pub fn mask_output(&self, output: &mut ExecOutput) {
        let mut secrets: Vec<&[u8]> = Vec::new();
        for (_, value) in &self.env {
            let value = value.expose_secret();
            secrets.push(value.as_bytes());
            if value.contains('\n') {
                secrets.extend(value.lines().map(str::as_bytes));
            }
        }
        secrets.retain(|s| s.len() >= MIN_MASKED_LEN);
        // Longest first, so that a value containing another is masked whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        if secrets.is_empty() {
            return;
        }
        for stream in [&mut output.stdout, &mut output.stderr] {
            for secret in &secrets {
                *stream = replace_all(stream, secret, MASK.as_bytes());
            }
        }
    }
}

/// `haystack` with every occurrence of `needle` replaced by `with`.
fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut rest = haystack;
    while let Some(at) = rest.windows(needle.len()).position(|w| w == needle) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(with);
        rest = &rest[at + needle.len()..];
    }
    out.extend_from_slice(rest);
    out
}

impl fmt::Debug for ExecRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.env.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("ExecRequest")
            .field("command", &self.command)
            .field("env", &names)
            .field("sudo", &self.sudo)
            .field("timeout", &self.timeout)
            .field("max_output", &self.max_output)
            .field("step", &self.step)
            .finish()
    }
}

/// A request ready for a remote shell, from [`ExecRequest::remote_shell`].
#[non_exhaustive]
pub struct RemoteShell {
    /// The command line to send; it holds no secret.
    pub line: String,
    /// Bytes to write to the command's stdin before anything else (the secret
    /// environment); empty when there is none.
    pub stdin_prefix: Vec<u8>,
}

impl fmt::Debug for RemoteShell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteShell")
            .field("line", &self.line)
            .field(
                "stdin_prefix",
                &format_args!("[{} bytes redacted]", self.stdin_prefix.len()),
            )
            .finish()
    }
}

/// What a command did. `#[non_exhaustive]`: a transport builds it with
/// [`ExecOutput::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExecOutput {
    /// The exit status; `None` when the command was killed by a signal.
    pub status: Option<i32>,
    /// The tail of stdout, at most the request's `max_output` bytes.
    pub stdout: Vec<u8>,
    /// The tail of stderr, at most the request's `max_output` bytes.
    pub stderr: Vec<u8>,
    /// Whether stdout or stderr was cut to the bound.
    pub truncated: bool,
}

impl ExecOutput {
    /// The outcome of a command that exited with `status` (`None`: killed by a signal),
    /// with the tails of its output, not truncated.
    pub fn new(
        status: Option<i32>,
        stdout: impl Into<Vec<u8>>,
        stderr: impl Into<Vec<u8>>,
    ) -> Self {
        ExecOutput {
            status,
            stdout: stdout.into(),
            stderr: stderr.into(),
            truncated: false,
        }
    }

    /// Sets whether stdout or stderr was cut to the bound.
    pub fn with_truncated(mut self, truncated: bool) -> Self {
        self.truncated = truncated;
        self
    }

    /// Whether the command exited with status 0.
    pub fn success(&self) -> bool {
        self.status == Some(0)
    }

    /// `Ok(self)` on success; otherwise a permanent error carrying the command, the
    /// status and the last lines of stderr, its control characters but newline and tab
    /// escaped (`\x1b`): they came from the machine, and a terminal would act on them.
    pub fn check(self, command: &str) -> Result<Self> {
        if self.success() {
            return Ok(self);
        }
        let stderr: String = String::from_utf8_lossy(&self.stderr)
            .chars()
            .map(|c| match c {
                '\n' | '\t' => c.to_string(),
                c if c.is_control() && u32::from(c) <= 0xff => format!("\\x{:02x}", u32::from(c)),
                c if c.is_control() => format!("\\u{{{:x}}}", u32::from(c)),
                c => c.to_string(),
            })
            .collect();
        let tail: Vec<&str> = stderr.lines().rev().take(10).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        let status = self.status.map_or_else(
            || "killed by a signal".to_owned(),
            |s| format!("exited with status {s}"),
        );
        Err(Error::new(
            ErrorKind::Permanent,
            format!("command {command:?} {status}; stderr: {}", tail.join("\n")),
        ))
    }
}

/// A file to put on a machine. `#[non_exhaustive]`: build it with [`FileUpload::new`]
/// and the builder methods.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileUpload {
    /// Absolute path on the machine.
    pub path: String,
    /// The content.
    pub content: Vec<u8>,
    /// Unix permission bits, such as `0o644`.
    pub mode: u32,
    /// `user` or `user:group` to own the file, when not the connecting user.
    pub owner: Option<String>,
}

impl FileUpload {
    /// A file with mode 0644 owned by the connecting user.
    pub fn new(path: impl Into<String>, content: impl Into<Vec<u8>>) -> Self {
        FileUpload {
            path: path.into(),
            content: content.into(),
            mode: 0o644,
            owner: None,
        }
    }

    /// Sets the mode.
    pub fn mode(mut self, mode: u32) -> Self {
        self.mode = mode;
        self
    }

    /// Sets the owner (`user` or `user:group`).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }
}

impl fmt::Debug for FileUpload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileUpload")
            .field("path", &self.path)
            .field("len", &self.content.len())
            .field("mode", &format_args!("{:#o}", self.mode))
            .field("owner", &self.owner)
            .finish()
    }
}

/// An open connection to one running machine.
#[async_trait]
pub trait Transport: Send + Sync {
    /// Runs a command and reports its status and bounded output, with the request's
    /// secret values masked ([`ExecRequest::mask_output`]). A non-zero exit is not an
    /// error here (see [`ExecOutput::check`]); a lost connection is transient.
    async fn exec(&self, request: &ExecRequest) -> Result<ExecOutput>;

    /// Writes a file with its mode (and owner), replacing any file at that path.
    async fn upload(&self, file: &FileUpload) -> Result<()>;

    /// Reads a file, `Ok(None)` when it does not exist; a permanent error when it is
    /// larger than `max_bytes`.
    async fn read_file(&self, path: &str, max_bytes: usize) -> Result<Option<Vec<u8>>>;
}

/// Opens transports to machines.
#[async_trait]
pub trait Connector: Send + Sync {
    /// Opens a transport to `machine`, using its [`crate::Access`]. An unreachable
    /// machine is a transient error (it may still be booting); a host-key mismatch or an
    /// authentication failure is permanent.
    async fn connect(&self, machine: &Machine) -> Result<Arc<dyn Transport>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_shell_sends_secrets_over_stdin_and_runs_under_sh() {
        let req = ExecRequest::new("printf '%s|%s' \"$TOKEN\" \"$(cat)\"")
            .env("TOKEN", SecretString::from("s3cr3t 'x' $(no)"));
        let shell = req.remote_shell().unwrap();
        assert!(!shell.line.contains("s3cr3t"), "{}", shell.line);
        assert!(!format!("{req:?}{shell:?}").contains("s3cr3t"));
        let out = std::process::Command::new("sh")
            .args(["-c", &shell.line])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                let mut stdin = c.stdin.take().unwrap();
                stdin.write_all(&shell.stdin_prefix)?;
                stdin.write_all(b"rest of stdin")?;
                drop(stdin);
                c.wait_with_output()
            })
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "s3cr3t 'x' $(no)|rest of stdin"
        );
        let bad = ExecRequest::new("true").env("A-B", SecretString::from("v"));
        assert_eq!(bad.remote_shell().unwrap_err().field(), Some("env[0].name"));
        let plain = ExecRequest::new("echo hi").sudo().remote_shell().unwrap();
        assert_eq!(plain.line, "sudo -n sh -c 'echo hi'");
        assert!(plain.stdin_prefix.is_empty());
    }

    #[test]
    fn a_step_key_is_kept_and_shown() {
        assert_eq!(ExecRequest::new("x").step, None);
        let req = ExecRequest::new("x").step("layer/3");
        assert_eq!(req.step.as_deref(), Some("layer/3"));
        assert!(format!("{req:?}").contains("step: Some(\"layer/3\")"));
    }

    #[test]
    fn secret_values_echoed_by_a_command_are_masked() {
        let req = ExecRequest::new("x")
            .env("TOKEN", SecretString::from("abcdef.0123456789abcdef"))
            .env(
                "KEY",
                SecretString::from("-----BEGIN KEY-----\nAAAAsecretline\n-----END KEY-----"),
            )
            .env("SHORT", SecretString::from("ab"));
        let mut out = ExecOutput::new(
            Some(1),
            b"token abcdef.0123456789abcdef ok".to_vec(),
            b"bad key line AAAAsecretline; ab stays\n".to_vec(),
        );
        req.mask_output(&mut out);
        assert_eq!(out.stdout, b"token *** ok");
        assert_eq!(out.stderr, b"bad key line ***; ab stays\n");
        let e = out.check("x").unwrap_err().to_string();
        assert!(!e.contains("secretline"), "{e}");
    }

    #[test]
    fn check_carries_command_status_and_stderr_tail() {
        let out = ExecOutput {
            status: Some(3),
            stdout: vec![],
            stderr: b"one\ntwo\nE: no such package\n".to_vec(),
            truncated: false,
        };
        let e = out.check("apt-get install nope").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("apt-get install nope"), "{msg}");
        assert!(msg.contains("status 3"), "{msg}");
        assert!(msg.contains("E: no such package"), "{msg}");
        let out = ExecOutput::new(Some(1), vec![], b"\x1b[2Jwiped\x07\r\tok\n".to_vec());
        let msg = out.check("x").unwrap_err().to_string();
        assert!(msg.contains("\\x1b[2Jwiped\\x07\\x0d\tok"), "{msg}");
        assert!(!msg.contains(['\x1b', '\x07', '\r']), "{msg}");
    }
}
