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
#[derive(Clone)]
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

    /// The full shell command line with environment assignments and sudo applied, for
    /// transports that run one string on the remote shell. It holds the secret values:
    /// send it, never log it.
    pub fn shell_line(&self) -> String {
        let mut line = String::new();
        if self.sudo {
            line.push_str("sudo -n ");
        }
        if !self.env.is_empty() {
            line.push_str("env ");
            for (k, v) in &self.env {
                line.push_str(k);
                line.push('=');
                line.push_str(
                    &shlex::try_quote(v.expose_secret())
                        .map_or_else(|_| "''".into(), |q| q.into_owned()),
                );
                line.push(' ');
            }
        }
        line.push_str("sh -c ");
        line.push_str(
            &shlex::try_quote(&self.command).map_or_else(|_| "''".into(), |q| q.into_owned()),
        );
        line
    }
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
            .finish()
    }
}

/// What a command did.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// Whether the command exited with status 0.
    pub fn success(&self) -> bool {
        self.status == Some(0)
    }

    /// `Ok(self)` on success; otherwise a permanent error carrying the command, the
    /// status and the last lines of stderr.
    pub fn check(self, command: &str) -> Result<Self> {
        if self.success() {
            return Ok(self);
        }
        let stderr = String::from_utf8_lossy(&self.stderr);
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

/// A file to put on a machine.
#[derive(Clone, PartialEq, Eq)]
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
    /// Runs a command and reports its status and bounded output. A non-zero exit is not
    /// an error here (see [`ExecOutput::check`]); a lost connection is transient.
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
    fn shell_line_quotes_and_debug_hides_secrets() {
        let req = ExecRequest::new("echo \"$TOKEN\" > /tmp/t")
            .env("TOKEN", SecretString::from("s3cr3t 'x'"))
            .sudo();
        let line = req.shell_line();
        assert!(line.starts_with("sudo -n env TOKEN="), "{line}");
        assert!(line.contains("s3cr3t"), "{line}");
        assert!(!format!("{req:?}").contains("s3cr3t"));
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
    }
}
