//! Connection settings: who to log in as, how, which host keys to trust, and how long to
//! wait for what.

use std::fmt;
use std::time::Duration;

use machine_core::{Error, Result, RetryPolicy};

use crate::auth::Auth;
use crate::hostkeys::{HostKeyPin, HostKeyPolicy};

/// Where to connect: host, port and user.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SshTarget {
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// User to log in as.
    pub user: String,
}

impl SshTarget {
    /// A target; an empty host or user, one holding whitespace, a control character
    /// (NUL), '/' or a leading '-', or port 0, is an invalid-spec error naming the field.
    pub fn new(host: impl Into<String>, port: u16, user: impl Into<String>) -> Result<Self> {
        let t = SshTarget {
            host: host.into(),
            port,
            user: user.into(),
        };
        // Whitespace, control characters (NUL), '/' and a leading '-' are in no host name
        // or address, and would mean something else to a shell or a path.
        if t.host.trim().is_empty()
            || t.host.starts_with('-')
            || t.host
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '/' | '\\' | '@'))
        {
            return Err(Error::invalid_spec(
                "host",
                format!("{:?} is not a host name or address", t.host),
            ));
        }
        if t.port == 0 {
            return Err(Error::invalid_spec("port", "0 is not a TCP port (1-65535)"));
        }
        if t.user.is_empty()
            || t.user.starts_with('-')
            || t.user
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '@' | '/'))
        {
            return Err(Error::invalid_spec(
                "user",
                format!("{:?} is not a user name", t.user),
            ));
        }
        Ok(t)
    }

    /// Parses `[user@]host[:port]` (IPv6 as `[addr]:port`), with `default_user` and port
    /// 22 when not given.
    pub fn parse(text: &str, default_user: &str) -> Result<Self> {
        let (user, rest) = match text.rsplit_once('@') {
            Some((u, r)) => (u, r),
            None => (default_user, text),
        };
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| Error::invalid_spec("host", format!("{text:?}: unclosed '['")))?;
            match after.strip_prefix(':') {
                Some(p) => (h, Some(p)),
                None if after.is_empty() => (h, None),
                None => {
                    return Err(Error::invalid_spec(
                        "host",
                        format!("{text:?}: junk after ']'"),
                    ));
                }
            }
        } else if rest.matches(':').count() == 1 {
            let (h, p) = rest.split_once(':').unwrap_or((rest, ""));
            (h, Some(p))
        } else {
            (rest, None)
        };
        let port = match port {
            None => 22,
            Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                Error::invalid_spec(
                    "port",
                    format!("{p:?} in {text:?} is not a TCP port (1-65535)"),
                )
            })?,
        };
        SshTarget::new(host, port, user)
    }

    /// `host:port`, with an IPv6 host in brackets.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for SshTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.user, self.address())
    }
}

/// A host to go through (OpenSSH's `ProxyJump`): the connection to the machine is tunnelled
/// through a `direct-tcpip` channel of a connection to this host.
#[derive(Debug, Clone)]
pub struct JumpHost {
    /// The jump host.
    pub target: SshTarget,
    /// Host keys pinned for the jump host (checked like a machine's pins); empty to use
    /// the config's known_hosts policy.
    pub pins: Vec<HostKeyPin>,
}

/// How to connect: authentication, host-key policy, timeouts, retries, keepalive, jump
/// host and privilege. Built with the `with_*` setters from [`SshConfig::new`].
#[derive(Debug, Clone)]
pub struct SshConfig {
    pub(crate) auth: Vec<Auth>,
    pub(crate) host_keys: HostKeyPolicy,
    pub(crate) user: Option<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) connect_deadline: Duration,
    pub(crate) retry: RetryPolicy,
    pub(crate) keepalive_interval: Duration,
    pub(crate) keepalive_max: usize,
    pub(crate) command_timeout: Option<Duration>,
    pub(crate) jump: Option<JumpHost>,
    pub(crate) sudo: bool,
    pub(crate) run_dir: Option<String>,
    pub(crate) ssh_rsa_sha1: bool,
}

impl SshConfig {
    /// A config that authenticates with `auth` (tried in order) and verifies host keys
    /// against pins or `~/.ssh/known_hosts`. Defaults: 10 s per connection attempt, retries
    /// for up to 5 minutes (from 500 ms, doubling, capped at 10 s, with jitter), a
    /// keepalive every 15 s (the connection is dropped after 3 unanswered), no command
    /// timeout, no jump host, no sudo.
    pub fn new(auth: Vec<Auth>) -> Self {
        SshConfig {
            auth,
            host_keys: HostKeyPolicy::default(),
            user: None,
            connect_timeout: Duration::from_secs(10),
            connect_deadline: Duration::from_secs(300),
            retry: RetryPolicy::default()
                .with_max_retries(usize::MAX)
                .with_initial_delay(Duration::from_millis(500))
                .with_max_delay(Duration::from_secs(10))
                .with_factor(2.0)
                .with_jitter(true)
                // connect_deadline bounds the retries in time.
                .with_max_elapsed(None),
            keepalive_interval: Duration::from_secs(15),
            keepalive_max: 3,
            command_timeout: None,
            jump: None,
            sudo: false,
            run_dir: None,
            ssh_rsa_sha1: false,
        }
    }

    /// Sets the host-key policy.
    pub fn with_host_keys(mut self, policy: HostKeyPolicy) -> Self {
        self.host_keys = policy;
        self
    }

    /// Logs in as `user` instead of the user in the machine's access info.
    pub fn with_user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// Gives up on one connection attempt (TCP, handshake and auth) after `timeout`.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Retries transient connection failures with `retry`, for at most `deadline` overall;
    /// then the last error is returned. Permanent failures (host key, auth) are never retried.
    pub fn with_retry(mut self, retry: RetryPolicy, deadline: Duration) -> Self {
        self.retry = retry;
        self.connect_deadline = deadline;
        self
    }

    /// Sends a keepalive after `interval` of silence and drops the connection after
    /// `max` unanswered ones, so a cut link is noticed within about `interval * (max + 1)`.
    pub fn with_keepalive(mut self, interval: Duration, max: usize) -> Self {
        self.keepalive_interval = interval;
        self.keepalive_max = max.max(1);
        self
    }

    /// A timeout for every command, file upload and read that sets none of its own.
    pub fn with_command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = Some(timeout);
        self
    }

    /// Reaches machines through `jump`.
    pub fn with_jump_host(mut self, jump: JumpHost) -> Self {
        self.jump = Some(jump);
        self
    }

    /// Refuses durations no timer can hold (a zero or over-a-year timeout, keepalive
    /// interval or deadline), naming the field; checked before every connection.
    pub fn check(&self) -> Result<()> {
        const LIMIT: Duration = Duration::from_secs(366 * 24 * 3600);
        let mut fields = vec![
            ("connect_timeout", self.connect_timeout),
            ("connect_deadline", self.connect_deadline),
            ("keepalive_interval", self.keepalive_interval),
        ];
        if let Some(t) = self.command_timeout {
            fields.push(("command_timeout", t));
        }
        if let Some(dir) = &self.run_dir
            && (!dir.starts_with('/') || dir.contains('\0') || dir.len() < 2)
        {
            return Err(Error::invalid_spec(
                "run_dir",
                format!("{dir:?} is not an absolute directory path"),
            ));
        }
        for (field, d) in fields {
            if d.is_zero() || d > LIMIT {
                return Err(Error::invalid_spec(
                    field,
                    format!(
                        "{:.3}s is out of range (more than 0, at most a year)",
                        d.as_secs_f64()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Accepts `ssh-rsa` signatures, RSA with SHA-1, for host keys and RSA user keys:
    /// only for old servers (OpenSSH before 7.2) that know nothing better. Off by
    /// default, as in OpenSSH 8.8 and later: a server offering only `ssh-rsa` is
    /// refused, saying so. SHA-1 signatures can be forged (chosen-prefix collisions);
    /// when on, the first connection of the process says so on stderr whatever the log
    /// level, and every connection logs a warning.
    pub fn with_ssh_rsa_sha1(mut self, allow: bool) -> Self {
        self.ssh_rsa_sha1 = allow;
        self
    }

    /// Keeps the records of supervised commands (pid, status, bounded output logs) in
    /// `dir` on the machine instead of `/run/bootstrap-ssh` (root, sudo) or
    /// `/tmp/bootstrap-ssh-<user>`. The supervisor makes it (mode 0700) and refuses it
    /// when it is a link or another user's. An absolute path.
    pub fn with_run_dir(mut self, dir: impl Into<String>) -> Self {
        self.run_dir = Some(dir.into());
        self
    }

    /// Runs every command, upload and read through `sudo -n`, for a login user that is
    /// not root (machine-core's step state lives under `/var/lib`).
    pub fn with_sudo(mut self, sudo: bool) -> Self {
        self.sudo = sudo;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_user_host_port() {
        let t = SshTarget::parse("ops@10.0.0.5:2222", "root").unwrap();
        assert_eq!(
            (t.user.as_str(), t.host.as_str(), t.port),
            ("ops", "10.0.0.5", 2222)
        );
        let t = SshTarget::parse("web-1", "root").unwrap();
        assert_eq!((t.user.as_str(), t.port), ("root", 22));
        let t = SshTarget::parse("[fd00::5]:23", "root").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("fd00::5", 23));
        assert_eq!(t.to_string(), "root@[fd00::5]:23");
    }

    #[test]
    fn bad_targets_name_the_field() {
        for (text, field) in [
            ("", "host"),
            ("ops@", "host"),
            (":22", "host"),
            ("h:70000", "port"),
            ("h:0", "port"),
            ("h:http", "port"),
            ("[fd00::1", "host"),
            ("@h", "user"),
            ("ho\0st", "host"),
            ("a/b", "host"),
            ("ops@../etc", "host"),
            ("-oProxyCommand=x", "host"),
            ("h\u{7f}", "host"),
            ("[fd00::1/64]:22", "host"),
            ("o\0ps@h", "user"),
            ("-x@h", "user"),
            ("a/b@h", "user"),
        ] {
            let e = SshTarget::parse(text, "root").unwrap_err();
            assert_eq!(e.field(), Some(field), "{text:?}: {e}");
            assert_eq!(e.kind(), machine_core::ErrorKind::InvalidSpec);
        }
    }
}
