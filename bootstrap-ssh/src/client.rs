//! One authenticated SSH connection: connect (with retries, through a jump host),
//! verify the host key, authenticate, keep alive. [`SshClient`] implements
//! machine-core's [`Transport`]; every command and file of a machine goes over the one
//! connection, each as its own channel.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use machine_core::{Error, ErrorKind, ExecOutput, ExecRequest, FileUpload, Result, Transport};
use russh::client::{Config, Handle, Handler};
use russh::keys::PublicKeyOrCertificate;

use crate::auth::authenticate;
use crate::config::{SshConfig, SshTarget};
use crate::errors::{io_error, ssh_error};
use crate::hostkeys::{HostKeyPin, HostKeyPolicy, preferred, verify_presented};
use crate::supervisor::{Pool, Supervision};

/// The russh callback object: checks the server's key against the policy and keeps the
/// reason for a refusal, which russh itself reduces to "unknown key".
pub(crate) struct ClientHandler {
    policy: HostKeyPolicy,
    pins: Vec<HostKeyPin>,
    host: String,
    port: u16,
    refused: Arc<Mutex<Option<Error>>>,
}

impl Handler for ClientHandler {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        key: &PublicKeyOrCertificate,
    ) -> Result<bool, russh::Error> {
        match verify_presented(&self.policy, &self.pins, &self.host, self.port, key) {
            Ok(()) => Ok(true),
            Err(e) => {
                self.refuse(e);
                Ok(false)
            }
        }
    }
}

impl ClientHandler {
    fn refuse(&self, e: Error) {
        if let Ok(mut slot) = self.refused.lock() {
            *slot = Some(e);
        }
    }
}

/// An open, authenticated SSH connection to one machine.
///
/// Cheap to share (`Arc`); commands run concurrently over it as separate channels. When
/// the connection drops (keepalive unanswered, link cut), calls fail with a transient
/// error and [`SshClient::is_closed`] turns true: connect again.
pub struct SshClient {
    handle: Handle<ClientHandler>,
    target: SshTarget,
    peer: String,
    command_timeout: Option<Duration>,
    sudo: bool,
    run_dir: Option<String>,
    /// Idle supervisors on their channels, for the next requests.
    pool: Pool,
    // Keeps the tunnel's carrier connection open as long as this one.
    _jump: Option<Arc<SshClient>>,
}

impl std::fmt::Debug for SshClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshClient")
            .field("target", &self.target.to_string())
            .field("via", &self._jump.as_ref().map(|j| j.target.to_string()))
            .finish()
    }
}

impl SshClient {
    /// Connects to `target`, trusting `pins` (or the config's known_hosts policy), and
    /// retries transient failures (refused, reset, timed out) with the config's backoff
    /// until its deadline. A host-key refusal or failed authentication fails at once.
    pub async fn connect(
        config: &SshConfig,
        target: &SshTarget,
        pins: &[HostKeyPin],
    ) -> Result<Self> {
        config.check()?;
        let attempt = || Self::connect_once(config, target, pins);
        let what = format!("ssh connect {target}");
        let retried = config.retry.retry(&what, attempt);
        match tokio::time::timeout(config.connect_deadline, retried).await {
            Ok(res) => res,
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "{target}: not reachable within {}",
                    humantime_secs(config.connect_deadline)
                ),
            )),
        }
    }

    /// One attempt, no retry, bounded by the config's connect timeout.
    pub async fn connect_once(
        config: &SshConfig,
        target: &SshTarget,
        pins: &[HostKeyPin],
    ) -> Result<Self> {
        config.check()?;
        let fut = async {
            let jump = match &config.jump {
                Some(j) => {
                    let direct = SshConfig {
                        jump: None,
                        ..config.clone()
                    };
                    Some(Arc::new(
                        Box::pin(Self::connect_once(&direct, &j.target, &j.pins)).await?,
                    ))
                }
                None => None,
            };
            Self::handshake(config, target, pins, jump).await
        };
        match tokio::time::timeout(config.connect_timeout, fut).await {
            Ok(res) => res,
            Err(_) => Err(Error::transient(format!(
                "{target}: connection attempt timed out after {}",
                humantime_secs(config.connect_timeout)
            ))),
        }
    }

    async fn handshake(
        config: &SshConfig,
        target: &SshTarget,
        pins: &[HostKeyPin],
        jump: Option<Arc<SshClient>>,
    ) -> Result<Self> {
        let peer = target.address();
        let refused = Arc::new(Mutex::new(None));
        let handler = ClientHandler {
            policy: config.host_keys.clone(),
            pins: pins.to_vec(),
            host: target.host.clone(),
            port: target.port,
            refused: refused.clone(),
        };
        let preferred = preferred(
            &config.host_keys,
            pins,
            &target.host,
            target.port,
            config.ssh_rsa_sha1,
        )?;
        if config.ssh_rsa_sha1 {
            sha1_notice(&peer);
        }
        let ssh_config = Arc::new(Config {
            preferred,
            keepalive_interval: Some(config.keepalive_interval),
            keepalive_max: config.keepalive_max,
            nodelay: true,
            ..Config::default()
        });
        let connected = match &jump {
            None => {
                let stream = tokio::net::TcpStream::connect((target.host.as_str(), target.port))
                    .await
                    .map_err(|e| io_error(&peer, e))?;
                stream.set_nodelay(true).map_err(|e| io_error(&peer, e))?;
                // Data the peer never acknowledges (a cut link) fails the socket within
                // the keepalive budget: russh's keepalive cannot fire while it is blocked
                // writing into a full send buffer.
                #[cfg(any(target_os = "linux", target_os = "android"))]
                socket2::SockRef::from(&stream)
                    .set_tcp_user_timeout(Some(keepalive_budget(config)))
                    .map_err(|e| io_error(&peer, e))?;
                russh::client::connect_stream(ssh_config, stream, handler).await
            }
            Some(j) => {
                let channel = j
                    .handle
                    .channel_open_direct_tcpip(
                        target.host.clone(),
                        u32::from(target.port),
                        "127.0.0.1",
                        0,
                    )
                    .await
                    .map_err(|e| {
                        // The jump host could not reach the target: as transient as a refused connection.
                        let mut err =
                            ssh_error(&peer, e).context(format_args!("via jump host {}", j.target));
                        if err.kind() == ErrorKind::Permanent {
                            err = Error::transient(err.message().to_owned());
                        }
                        err
                    })?;
                russh::client::connect_stream(ssh_config, channel.into_stream(), handler).await
            }
        };
        let mut handle = match connected {
            Ok(h) => h,
            Err(e) => {
                if let Some(refusal) = refused.lock().ok().and_then(|mut s| s.take()) {
                    return Err(refusal);
                }
                return Err(ssh_error(&peer, e));
            }
        };
        authenticate(
            &mut handle,
            &peer,
            &target.user,
            &config.auth,
            config.ssh_rsa_sha1,
        )
        .await?;
        tracing::debug!(target = %target, via = ?jump.as_ref().map(|j| j.target.to_string()), "ssh connected");
        Ok(SshClient {
            handle,
            target: target.clone(),
            peer,
            command_timeout: config.command_timeout,
            sudo: config.sudo,
            run_dir: config.run_dir.clone(),
            pool: Pool::default(),
            _jump: jump,
        })
    }

    /// Runs `request` and turns a non-zero exit into an error carrying the command, the
    /// status and the tail of stderr, its control characters escaped (see
    /// [`ExecOutput::check`]).
    pub async fn run(&self, request: &ExecRequest) -> Result<ExecOutput> {
        self.supervised(request)
            .await?
            .check(&request.command)
            .map_err(|e| e.context(&self.target))
    }

    /// Runs `request` under the supervisor (see the crate's `supervisor` module).
    async fn supervised(&self, request: &ExecRequest) -> Result<ExecOutput> {
        let req = self.prepare(request);
        let sup = Supervision::new(&self.peer, &self.target.user, self.run_dir.as_deref(), &req);
        crate::supervisor::run(&self.handle, &self.pool, &self.peer, &sup, &req).await
    }

    /// The target this client is connected to.
    pub fn target(&self) -> &SshTarget {
        &self.target
    }

    /// Whether every command goes through sudo (the config's `with_sudo`).
    pub(crate) fn sudo_always(&self) -> bool {
        self.sudo
    }

    /// Whether the connection has dropped.
    pub fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }

    /// Closes the connection politely: the idle supervisors are told to end (their
    /// stdin ends) and waited for, briefly, so that sshd reaps them before the
    /// connection goes.
    pub async fn close(&self) {
        self.pool.shut().await;
        let _ = self
            .handle
            .disconnect(russh::Disconnect::ByApplication, "bye", "en")
            .await;
    }

    fn prepare(&self, request: &ExecRequest) -> ExecRequest {
        let mut req = request.clone();
        req.sudo |= self.sudo;
        if req.timeout.is_none() {
            req.timeout = self.command_timeout;
        }
        req
    }

    /// Sends a `put` or `get` request to a supervisor (see `supervisor::transfer`),
    /// as root when the config says so, bounded by the config's command timeout.
    pub(crate) async fn transfer(
        &self,
        what: &str,
        head: (&str, &str),
        assignments: &[(&str, &str)],
        content: Option<&[u8]>,
        room: usize,
    ) -> Result<crate::supervisor::Reply> {
        let dir = crate::supervisor::run_dir(&self.target.user, self.run_dir.as_deref(), self.sudo);
        crate::supervisor::transfer(
            &self.handle,
            &self.pool,
            &self.peer,
            (&dir, self.sudo),
            what,
            head,
            assignments,
            content,
            room,
            self.command_timeout,
        )
        .await
    }
}

#[async_trait]
impl Transport for SshClient {
    /// Runs the command under a supervisor on the machine that owns it: a timeout
    /// kills its whole process group, a cut connection leaves it running, and the same
    /// step again on the same machine (the same [`ExecRequest::step`] key) waits for it
    /// (or takes over its outcome) instead of starting another; a request without a
    /// key is a run of its own. See the crate documentation.
    async fn exec(&self, request: &ExecRequest) -> Result<ExecOutput> {
        self.supervised(request).await
    }

    async fn upload(&self, file: &FileUpload) -> Result<()> {
        crate::upload::upload(self, file).await
    }

    async fn read_file(&self, path: &str, max_bytes: usize) -> Result<Option<Vec<u8>>> {
        crate::upload::read_file(self, path, max_bytes).await
    }
}

/// Says once per process on stderr, whatever the log level, that SHA-1 RSA signatures
/// are accepted; every connection also logs a warning.
fn sha1_notice(peer: &str) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::SeqCst) {
        eprintln!(
            "WARNING: bootstrap-ssh: ssh-rsa signatures with SHA-1 are accepted (SshConfig::with_ssh_rsa_sha1): OpenSSH 8.8 and later refuse them as forgeable"
        );
    }
    tracing::warn!(
        peer,
        "ssh-rsa (SHA-1) signatures accepted for host keys and RSA user keys (with_ssh_rsa_sha1)"
    );
}

/// How long a dead link may go unnoticed: the keepalive interval times one more than
/// the unanswered keepalives allowed.
fn keepalive_budget(config: &SshConfig) -> Duration {
    let rounds = u32::try_from(config.keepalive_max)
        .unwrap_or(u32::MAX)
        .saturating_add(1);
    config.keepalive_interval.saturating_mul(rounds)
}

pub(crate) fn humantime_secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}
