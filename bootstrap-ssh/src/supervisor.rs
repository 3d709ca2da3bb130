//! The supervisor of a connection's work on the machine (`agent.sh`), its killer
//! (`kill.sh`), and the client's side of both; the crate documentation ("Commands on
//! the machine") says what they promise.
//!
//! A supervisor runs on a channel of its own for as long as the connection lives and
//! serves requests one at a time over its stdin: a command (`run`), an upload (`put`),
//! a file read (`get`). The session, the login shell and the supervisor's shell are
//! paid once per channel instead of once per command. A connection keeps a few idle
//! supervisors ([`Pool`]); concurrent requests each take one, or start another.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use machine_core::{Error, ExecOutput, ExecRequest, Result};
use russh::client::{Handle, Msg};
use russh::{ChannelMsg, ChannelReadHalf, ChannelWriteHalf};
use sha2::{Digest, Sha256};

use crate::client::{ClientHandler, humantime_secs};
use crate::errors::{connection_lost, ssh_error};
use crate::exec::{Masker, Tail, label, log_output, masked_tails};
use crate::text::{escape_controls, shown};

/// Scripts without their comment lines: they go on the command line every time.
fn strip(script: &str) -> String {
    script
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect()
}

pub(crate) static AGENT: LazyLock<String> = LazyLock::new(|| strip(include_str!("agent.sh")));
static KILL: LazyLock<String> = LazyLock::new(|| strip(include_str!("kill.sh")));

/// Room for the status line at the end of stderr.
const TRAILER_ROOM: usize = 1024;

/// The most output the machine is asked to keep per stream (`tail -c` takes it whole).
const MAX_KEPT: usize = 1 << 40;

/// How long a finished run's records may take to go before the client returns anyway
/// (they go on their own; only a rerun started at once could still find them).
const CLEANUP_WAIT: Duration = Duration::from_secs(5);

/// Idle supervisors a connection keeps of each kind (plain and sudo): enough for a
/// layer's steps one after another, few enough to leave sshd's sessions (`MaxSessions`,
/// 10 by default) to concurrent work and to the killer.
const MAX_IDLE: usize = 2;

/// How long ending a supervisor waits for its channel to close.
const SHUT_WAIT: Duration = Duration::from_secs(2);

/// The run directory of the supervisors of `user` (root when through sudo).
pub(crate) fn run_dir(user: &str, dir: Option<&str>, sudo: bool) -> String {
    match dir {
        Some(d) => d.to_owned(),
        None if sudo || user == "root" => "/run/bootstrap-ssh".to_owned(),
        None => format!("/tmp/bootstrap-ssh-{user}"),
    }
}

/// Where and under which name one command runs on the machine.
pub(crate) struct Supervision {
    /// The run directory.
    pub(crate) dir: String,
    /// The run key.
    pub(crate) key: String,
}

impl Supervision {
    /// The run of `req` on `target` (`host:port`) as `user` (root when through sudo).
    ///
    /// A request with a step key ([`ExecRequest::step`]) is named by the target, the
    /// user, the key, the command and its environment's names: a later request of the
    /// same step adopts the run still going or its uncollected outcome. Without a key
    /// the run's name is new for every call, so two identical commands (two clients
    /// reading the same file at once, a read run again later) never share a run or
    /// take another call's outcome.
    pub(crate) fn new(target: &str, user: &str, dir: Option<&str>, req: &ExecRequest) -> Self {
        let root = req.sudo || user == "root";
        let dir = run_dir(user, dir, req.sudo);
        // The two kinds of name apart, whatever a step key holds.
        let identity = match &req.step {
            Some(step) => format!("step\0{step}"),
            None => format!("call\0{}", token(&req.command)),
        };
        let mut h = Sha256::new();
        for part in [
            target,
            if root { "root" } else { user },
            &identity,
            &req.command,
        ] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        for (name, _) in &req.env {
            h.update(name.as_bytes());
            h.update([0]);
        }
        let digest = h.finalize();
        // A run without a step key is marked `u` (never a hex digit): nobody runs its
        // key again, so its supervisor removes a run it could not deliver.
        let key = match req.step {
            Some(_) => crate::upload::hex(&digest[..16]),
            None => format!("u{}", &crate::upload::hex(&digest[..16])[1..]),
        };
        Supervision { dir, key }
    }
}

/// A token no output holds by chance: marks the end of an answer.
pub(crate) fn token(seed: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // Per process, from the OS's randomness (std seeds its hash keys so): processes on
    // other hosts with the same pid, clock and count still make other tokens.
    static PROCESS: LazyLock<u64> = LazyLock::new(|| {
        use std::hash::{BuildHasher, Hasher};
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    });
    let mut h = Sha256::new();
    h.update(seed.as_bytes());
    h.update(PROCESS.to_le_bytes());
    h.update(nanos.to_le_bytes());
    h.update(std::process::id().to_le_bytes());
    h.update(N.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    format!("bssh-{}", crate::upload::hex(&h.finalize()[..12]))
}

pub(crate) fn quote(field: &str, s: &str) -> Result<String> {
    shlex::try_quote(s)
        .map(|q| q.into_owned())
        .map_err(|_| Error::invalid_spec(field, "holds a NUL byte"))
}

/// The export lines of the secret environment, refused as machine-core refuses them.
fn env_script(req: &ExecRequest) -> Result<String> {
    if req.env.is_empty() {
        return Ok(String::new());
    }
    // machine-core's own check of names and values, then the same export lines.
    let shell = req.remote_shell()?;
    Ok(String::from_utf8_lossy(&shell.stdin_prefix).into_owned())
}

/// How an answer ended, from the status line.
#[derive(Debug)]
pub(crate) enum Trailer {
    Exit { status: i32, how: String },
    Error(String),
}

/// Finds the status line at the end of `window` (the last bytes of stderr) and
/// returns it with the number of bytes it takes there.
fn trailer(window: &[u8], token: &str) -> Option<(Trailer, usize)> {
    let mark = format!("\n{token} ");
    let at = window
        .windows(mark.len())
        .rposition(|w| w == mark.as_bytes())?;
    let line = std::str::from_utf8(&window[at + mark.len()..]).ok()?;
    let line = line.strip_suffix('\n').unwrap_or(line);
    let t = if let Some(rest) = line.strip_prefix("exit ") {
        let (status, how) = rest.split_once(' ').unwrap_or((rest, ""));
        Trailer::Exit {
            status: status.parse().ok()?,
            how: how.to_owned(),
        }
    } else {
        Trailer::Error(line.strip_prefix("error ").unwrap_or(line).to_owned())
    };
    Some((t, window.len() - at))
}

/// One supervisor on a channel of its own, serving one request at a time.
pub(crate) struct Agent {
    reader: ChannelReadHalf,
    writer: ChannelWriteHalf<Msg>,
    sudo: bool,
    /// Whether it has answered a request: an agent that ends before its first answer
    /// did not start.
    served: bool,
}

impl Agent {
    /// Starts a supervisor on a new channel, as root through `sudo -n` when `sudo`.
    async fn start(
        handle: &Handle<ClientHandler>,
        peer: &str,
        dir: &str,
        sudo: bool,
    ) -> Result<Agent> {
        let line = format!(
            "{}sh -c {} bssh {}",
            if sudo { "sudo -n " } else { "" },
            quote("command", &AGENT)?,
            quote("run_dir", dir)?,
        );
        let channel = handle.channel_open_session().await.map_err(|e| {
            if handle.is_closed() {
                connection_lost(peer, "opening a channel")
            } else {
                ssh_error(peer, e)
            }
        })?;
        let (reader, writer) = channel.split();
        writer
            .exec(true, line)
            .await
            .map_err(|_| connection_lost(peer, "starting the supervisor"))?;
        Ok(Agent {
            reader,
            writer,
            sudo,
            served: false,
        })
    }

    /// Sends `bytes` to the supervisor's stdin.
    async fn send(&self, peer: &str, bytes: &[u8]) -> Result<()> {
        self.writer
            .data(bytes)
            .await
            .map_err(|_| connection_lost(peer, "sending a request"))
    }

    /// Closes its channel (its stdin ends: whatever it does stops).
    async fn close(self) {
        let _ = self.writer.close().await;
    }

    /// Ends it politely: end of input (it removes the runs it collected, then exits),
    /// then its channel's end, waited for at most [`SHUT_WAIT`].
    async fn end(mut self) {
        let _ = self.writer.eof().await;
        let _ = tokio::time::timeout(SHUT_WAIT, async {
            while let Some(msg) = self.reader.wait().await {
                if matches!(msg, ChannelMsg::Close) {
                    break;
                }
            }
        })
        .await;
    }
}

/// The idle supervisors of a connection.
#[derive(Default)]
pub(crate) struct Pool {
    idle: Mutex<Vec<Agent>>,
}

impl Pool {
    /// An idle supervisor of this kind, or a new one.
    pub(crate) async fn take(
        &self,
        handle: &Handle<ClientHandler>,
        peer: &str,
        dir: &str,
        sudo: bool,
    ) -> Result<Agent> {
        let idle = self.idle.lock().ok().and_then(|mut idle| {
            let at = idle.iter().rposition(|a| a.sudo == sudo)?;
            Some(idle.swap_remove(at))
        });
        match idle {
            Some(agent) => Ok(agent),
            None => Agent::start(handle, peer, dir, sudo).await,
        }
    }

    /// Ends every idle supervisor (see [`Agent::end`]), all at once.
    pub(crate) async fn shut(&self) {
        let agents: Vec<Agent> = self
            .idle
            .lock()
            .map(|mut idle| idle.drain(..).collect())
            .unwrap_or_default();
        let ends = agents.into_iter().map(Agent::end);
        futures_util::future::join_all(ends).await;
    }

    /// Keeps `agent` for the next request, unless enough of its kind are idle: then
    /// it is ended (and waited for, briefly), so that its session does not count
    /// against sshd's `MaxSessions` until the connection ends.
    pub(crate) async fn give(&self, agent: Agent) {
        let extra = match self.idle.lock() {
            Ok(mut idle) if idle.iter().filter(|a| a.sudo == agent.sudo).count() < MAX_IDLE => {
                idle.push(agent);
                None
            }
            _ => Some(agent),
        };
        if let Some(agent) = extra {
            agent.end().await;
        }
    }
}

/// The request's shell assignments, one per line, and the header line announcing them.
pub(crate) fn request(head: &str, assignments: &[(&str, &str)]) -> Result<Vec<u8>> {
    let mut lines = String::new();
    for (name, value) in assignments {
        lines.push_str(&format!("{name}={}\n", quote(name, value)?));
    }
    let n = lines.matches('\n').count();
    Ok(format!("{head} {n}\n{lines}").into_bytes())
}

/// An answer: both streams' kept tails, without the marks, and how it ended.
struct Answer {
    out: Vec<u8>,
    err: Vec<u8>,
    end: Trailer,
}

/// Why no answer came.
enum NoAnswer {
    /// The supervisor's channel ended (its exit status, its last stderr).
    Ended(Option<u32>, Vec<u8>),
    /// The connection was lost.
    Lost,
    /// The server refused to start the supervisor.
    Refused,
}

/// Reads the answer to the request marked `token`, keeping the last `room` bytes of
/// each stream; `feed` is written meanwhile (an upload's content: the supervisor may
/// answer before it has read it all). When the supervisor asks for more (a line
/// `<token> more` on stdout, once it has read the whole content), the token goes back
/// as one line: it proves the content was not cut short by the end of its input.
async fn answer(
    agent: &mut Agent,
    token: &str,
    room: usize,
    feed: Option<&[u8]>,
) -> std::result::Result<Answer, NoAnswer> {
    let Agent { reader, writer, .. } = agent;
    let writer: &ChannelWriteHalf<Msg> = writer;
    let collect = async {
        let mut out = Tail::new(room.saturating_add(TRAILER_ROOM));
        let mut err = Tail::new(room.saturating_add(TRAILER_ROOM));
        let mut window = Tail::new(TRAILER_ROOM);
        let mut out_window = Tail::new(TRAILER_ROOM);
        let out_mark = format!("\n{token} out\n");
        let more_mark = format!("\n{token} more\n");
        let (mut out_done, mut err_done) = (false, false);
        let mut exit = None;
        let mut ended = false;
        while let Some(msg) = reader.wait().await {
            match msg {
                ChannelMsg::Data { data } => {
                    out.push(&data);
                    out_window.push(&data);
                    out_done = out_window.ends_with(out_mark.as_bytes());
                    if feed.is_some() && out_window.ends_with(more_mark.as_bytes()) {
                        // It has read all the content, so all of it went out before
                        // this line does.
                        let proof = format!("{token}\n");
                        if writer.data(proof.as_bytes()).await.is_err() {
                            return Err(NoAnswer::Lost);
                        }
                    }
                }
                ChannelMsg::ExtendedData { data, ext: 1 } => {
                    err.push(&data);
                    window.push(&data);
                    err_done = window.ends_with(b"\n") && window.contains(token.as_bytes());
                }
                ChannelMsg::Eof | ChannelMsg::Close => {
                    ended = true;
                    break;
                }
                ChannelMsg::ExitStatus { exit_status } => exit = Some(exit_status),
                ChannelMsg::Failure => return Err(NoAnswer::Refused),
                _ => {}
            }
            // Both streams have said their last line: everything is here.
            if out_done && err_done {
                break;
            }
        }
        let window = window.into_vec();
        let Some((end, len)) = trailer(&window, token) else {
            return Err(if ended || exit.is_some() {
                NoAnswer::Ended(exit, err.into_vec())
            } else {
                NoAnswer::Lost
            });
        };
        let mut out = out.into_vec();
        let mut err = err.into_vec();
        err.truncate(err.len().saturating_sub(len));
        if out.ends_with(out_mark.as_bytes()) {
            out.truncate(out.len() - out_mark.len());
        }
        if feed.is_some()
            && let Some(at) = out
                .windows(more_mark.len())
                .position(|w| w == more_mark.as_bytes())
        {
            out.drain(at..at + more_mark.len());
        }
        Ok(Answer { out, err, end })
    };
    let Some(feed) = feed else {
        return collect.await;
    };
    // Feed and collect together: the supervisor may answer (an error) before it has
    // read all its input. The answer ends both.
    let feed = writer.data(feed);
    tokio::pin!(feed);
    tokio::pin!(collect);
    let mut fed = false;
    loop {
        tokio::select! {
            _ = &mut feed, if !fed => fed = true,
            answered = &mut collect => break answered,
        }
    }
}

/// Waits for `"\n<token> done\n"` on stdout: the supervisor has removed the run's
/// records and waits for the next request. False when the channel ended instead.
async fn done(agent: &mut Agent, token: &str) -> bool {
    let mark = format!("\n{token} done\n");
    let mut window = Tail::new(mark.len());
    while let Some(msg) = agent.reader.wait().await {
        match msg {
            ChannelMsg::Data { data } => {
                window.push(&data);
                if window.ends_with(mark.as_bytes()) {
                    return true;
                }
            }
            ChannelMsg::Eof | ChannelMsg::Close => return false,
            _ => {}
        }
    }
    false
}

/// The error for a request that got no answer.
fn no_answer(peer: &str, what: &str, why: NoAnswer, first: bool, mask: &Masker) -> Error {
    match why {
        NoAnswer::Refused => Error::permanent(format!("{peer}: the server refused to run {what}")),
        NoAnswer::Lost => connection_lost(peer, &format!("running {what}")),
        NoAnswer::Ended(exit, stderr) => {
            // Its last words, masked: the supervisor may have replayed the output.
            let stderr = mask.tail(stderr, TRAILER_ROOM);
            let status = exit.map_or("none".to_owned(), |s| s.to_string());
            if first {
                Error::permanent(format!(
                    "{peer}: the supervisor of {what} did not start (exit status {status}): {}",
                    shown(&stderr).trim()
                ))
            } else {
                Error::transient(format!(
                    "{peer}: the supervisor of {what} ended before it answered (exit status {status}): {}",
                    shown(&stderr).trim()
                ))
            }
        }
    }
}

/// Runs `req` (already adjusted for sudo and the default timeout) under a supervisor
/// from `pool`.
pub(crate) async fn run(
    handle: &Handle<ClientHandler>,
    pool: &Pool,
    peer: &str,
    sup: &Supervision,
    req: &ExecRequest,
) -> Result<ExecOutput> {
    let env = env_script(req)?;
    let token = token(&sup.key);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mask = Masker::new(req);
    // One byte over the bound tells a cut; the secrets' length more keeps a secret that
    // crosses the cut whole until it is masked.
    let keep = req
        .max_output
        .saturating_add(mask.slack)
        .saturating_add(1)
        .min(MAX_KEPT);
    let message = request(
        &format!("run {token} {} {keep} {now}", sup.key),
        &[("c", &req.command), ("e", &env)],
    )?;
    let mut agent = pool.take(handle, peer, &sup.dir, req.sudo).await?;
    tracing::debug!(peer, command = %req.command, sudo = req.sudo, run = %sup.key, "exec");
    let first = !agent.served;
    let what = label(&req.command);
    let exchange = async {
        agent.send(peer, &message).await?;
        let answer = answer(&mut agent, &token, keep, None)
            .await
            .map_err(|why| match why {
                NoAnswer::Lost => Error::transient(match &req.step {
                    Some(_) => format!(
                        "{peer}: connection lost while running {what}; the command goes on on the machine (run {} in {}): the same step run again waits for it and returns its outcome",
                        sup.key, sup.dir
                    ),
                    None => format!(
                        "{peer}: connection lost while running {what}; the command goes on on the machine (run {} in {}); it has no step key, so running it again starts another run",
                        sup.key, sup.dir
                    ),
                }),
                why => no_answer(peer, &what, why, first, &mask),
            })?;
        agent.served = true;
        match answer.end {
            Trailer::Error(why) => Ok((Err(supervisor_error(peer, req, sup, &why)), true)),
            Trailer::Exit { status, how } => {
                // The client has it all: the records may go. Waiting for that keeps
                // the same command run again right after from taking this run's
                // outcome as its own.
                let acked = agent.send(peer, b"ok\n").await.is_ok();
                let clean = acked
                    && tokio::time::timeout(CLEANUP_WAIT, done(&mut agent, &token))
                        .await
                        .unwrap_or(false);
                let output =
                    masked_tails(&mask, Some(status), answer.out, answer.err, req.max_output);
                log_output(peer, &output);
                tracing::debug!(peer, command = %what, status, how = %escape_controls(&how), stdout_bytes = output.stdout.len(), stderr_bytes = output.stderr.len(), "exec finished");
                if how.contains("log-incomplete") {
                    tracing::warn!(peer, command = %what, dir = %sup.dir, "the output log could not be written in full (is the run directory's filesystem full?)");
                }
                if let Some(why) = how.strip_prefix("rerun:") {
                    tracing::warn!(peer, command = %what, "a previous run ended without an outcome ({}); it ran again", escape_controls(why.split(',').next().unwrap_or(why)));
                }
                Ok((Ok(output), clean))
            }
        }
    };
    let outcome = match req.timeout {
        None => exchange.await,
        Some(limit) => match tokio::time::timeout(limit, exchange).await {
            Ok(res) => res,
            Err(_) => {
                let what = kill(handle, peer, sup, req.sudo, &mask).await;
                agent.close().await;
                return Err(Error::timeout(format!(
                    "{peer}: command {} did not finish within {}; {what}",
                    label(&req.command),
                    humantime_secs(limit)
                )));
            }
        },
    };
    match outcome {
        Ok((result, reusable)) => {
            if reusable {
                pool.give(agent).await;
            } else {
                agent.close().await;
            }
            result
        }
        Err(e) => {
            agent.close().await;
            Err(e)
        }
    }
}

/// What a `put` or `get` request answered: its status and stderr, and its stdout.
pub(crate) struct Reply {
    pub(crate) status: i32,
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
}

/// Sends a `put` or `get` request (`kind`, its header `args`, its `assignments`, then
/// `content`) to a supervisor of `pool` and returns its reply, keeping `room` bytes of
/// stdout. A timeout closes the supervisor's channel: its stdin ends, so an upload
/// stops and leaves nothing behind.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn transfer(
    handle: &Handle<ClientHandler>,
    pool: &Pool,
    peer: &str,
    (dir, sudo): (&str, bool),
    what: &str,
    (kind, args): (&str, &str),
    assignments: &[(&str, &str)],
    content: Option<&[u8]>,
    room: usize,
    timeout: Option<Duration>,
) -> Result<Reply> {
    let token = token(what);
    let message = request(&format!("{kind} {token} {args}"), assignments)?;
    let mut agent = pool.take(handle, peer, dir, sudo).await?;
    tracing::debug!(peer, what, sudo, "exec");
    let first = !agent.served;
    let none = Masker::new(&ExecRequest::new(""));
    let exchange = async {
        agent.send(peer, &message).await?;
        let answer = answer(&mut agent, &token, room, content)
            .await
            .map_err(|why| no_answer(peer, what, why, first, &none))?;
        agent.served = true;
        match answer.end {
            Trailer::Exit { status, .. } => Ok(Reply {
                status,
                stdout: answer.out,
                stderr: answer.err,
            }),
            Trailer::Error(why) => Err(Error::permanent(format!(
                "{peer}: {what}: {}",
                escape_controls(&why)
            ))),
        }
    };
    let outcome = match timeout {
        None => exchange.await,
        Some(limit) => match tokio::time::timeout(limit, exchange).await {
            Ok(res) => res,
            Err(_) => {
                agent.close().await;
                return Err(Error::timeout(format!(
                    "{peer}: {what} did not finish within {}; its channel was closed (its input ends, so the upload or read stops and leaves nothing behind)",
                    humantime_secs(limit)
                )));
            }
        },
    };
    match outcome {
        // A failed upload's supervisor ends (the rest of its content would be read
        // as requests); any other answer leaves it ready for the next.
        Ok(reply) if reply.status == 0 || kind == "get" => {
            pool.give(agent).await;
            Ok(reply)
        }
        Ok(reply) => {
            agent.close().await;
            Ok(reply)
        }
        Err(e) => {
            agent.close().await;
            Err(e)
        }
    }
}

fn supervisor_error(peer: &str, req: &ExecRequest, sup: &Supervision, why: &str) -> Error {
    let why = escape_controls(why);
    if let Some(lost) = why.strip_prefix("lost ") {
        return Error::transient(format!(
            "{peer}: {}: {lost}; its outcome is unknown",
            label(&req.command)
        ));
    }
    Error::permanent(format!(
        "{peer}: {} was not run: {why} (run {})",
        label(&req.command),
        sup.key
    ))
}

/// How long the killer may take, from opening its channel to its report.
const KILL_BUDGET: Duration = Duration::from_secs(20);

/// Kills the run's process group from a new channel; says what happened, for the
/// timeout error.
async fn kill(
    handle: &Handle<ClientHandler>,
    peer: &str,
    sup: &Supervision,
    sudo: bool,
    mask: &Masker,
) -> String {
    let attempt = async {
        let sudo = if sudo { "sudo -n " } else { "" };
        let line = format!(
            "{sudo}sh -c {} bssh {} {}",
            quote("command", &KILL).ok()?,
            quote("run_dir", &sup.dir).ok()?,
            sup.key
        );
        let channel = handle.channel_open_session().await.ok()?;
        let (mut reader, writer) = channel.split();
        writer.exec(true, line).await.ok()?;
        let _ = writer.eof().await;
        let mut out = Vec::new();
        let mut err = Vec::new();
        while let Some(msg) = reader.wait().await {
            match msg {
                ChannelMsg::Data { data } => out.extend_from_slice(&data),
                ChannelMsg::ExtendedData { data, .. } => err.extend_from_slice(&data),
                ChannelMsg::Close => break,
                _ => {}
            }
        }
        // Process names are the machine's to choose: masked like output.
        Some((shown(&mask.bytes(out)), shown(&mask.bytes(err))))
    };
    let report = match tokio::time::timeout(KILL_BUDGET, attempt).await {
        Ok(Some((out, err))) => describe_kill(out.trim(), err.trim()),
        _ => "the connection failed before its process group could be killed: the command may still run on the machine".to_owned(),
    };
    tracing::warn!(peer, run = %sup.key, "{report}");
    report
}

/// The killer's answer as a sentence.
fn describe_kill(out: &str, err: &str) -> String {
    let mut words = out.split_whitespace();
    let processes = |rest: Vec<&str>| {
        rest.iter()
            .map(|p| p.split_once(':').map_or(*p, |(_, name)| name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match words.next() {
        Some("killed") => {
            let group = words.next().unwrap_or("?");
            let rest: Vec<&str> = words.collect();
            format!(
                "its process group {group} was killed with SIGKILL ({} process{}: {}); none is left",
                rest.len(),
                if rest.len() == 1 { "" } else { "es" },
                processes(rest.clone())
            )
        }
        Some("left") => {
            let group = words.next().unwrap_or("?");
            let rest: Vec<&str> = words.collect();
            format!(
                "SIGKILL was sent to its process group {group}, but these still run: {}",
                rest.join(" ")
            )
        }
        Some("finished") => "it finished as the timeout fired, so nothing was killed; running it again returns its outcome".to_owned(),
        Some("gone") | Some("dead") => {
            "its supervisor was already gone, so nothing was killed".to_owned()
        }
        _ => format!(
            "killing it failed, so it may still run on the machine: {}",
            if err.is_empty() { out } else { err }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_is_found_and_measured() {
        let w = b"some err\nbssh-x here\n\nbssh-x exit 3 ran\n";
        let (t, len) = trailer(w, "bssh-x").unwrap();
        assert!(matches!(t, Trailer::Exit { status: 3, ref how } if how == "ran"));
        assert_eq!(&w[w.len() - len..], b"\nbssh-x exit 3 ran\n");
        let (t, _) = trailer(b"\nbssh-x error cannot make it\n", "bssh-x").unwrap();
        assert!(matches!(t, Trailer::Error(ref m) if m == "cannot make it"));
        assert!(trailer(b"no line here\n", "bssh-x").is_none());
    }

    #[test]
    fn steps_are_named_by_target_user_key_command_and_env_names() {
        let step = |cmd: &str| ExecRequest::new(cmd).step("layer/1");
        let a = Supervision::new("h:22", "root", None, &step("true"));
        let b = Supervision::new("h:23", "root", None, &step("true"));
        let c = Supervision::new("h:22", "ops", None, &step("true"));
        let d = Supervision::new("h:22", "ops", None, &step("true").sudo());
        let e = Supervision::new("h:22", "root", None, &step("false"));
        let f = Supervision::new(
            "h:22",
            "root",
            None,
            &ExecRequest::new("true").step("layer/2"),
        );
        let g = Supervision::new("h:22", "root", None, &step("true").env("X", "v"));
        let again = Supervision::new("h:22", "root", None, &step("true"));
        assert_eq!(a.key, again.key, "a step again is the same run");
        for other in [&b, &c, &e, &f, &g] {
            assert_ne!(a.key, other.key);
        }
        assert_eq!(a.key, d.key, "sudo runs as root");
        assert_eq!(a.dir, "/run/bootstrap-ssh");
        assert_eq!(c.dir, "/tmp/bootstrap-ssh-ops");
        assert_eq!(d.dir, "/run/bootstrap-ssh");
        assert_eq!(a.key.len(), 32);
    }

    #[test]
    fn requests_without_a_step_key_are_runs_of_their_own() {
        let req = ExecRequest::new("cat /claim");
        let a = Supervision::new("h:22", "root", None, &req);
        let b = Supervision::new("h:22", "root", None, &req);
        let keyed = Supervision::new("h:22", "root", None, &req.clone().step(""));
        assert_ne!(a.key, b.key);
        assert_ne!(a.key, keyed.key);
        assert_eq!(a.key.len(), 32);
        assert!(a.key.starts_with('u') && !keyed.key.starts_with('u'));
    }

    #[test]
    fn kill_reports_read_as_sentences() {
        let s = describe_kill("killed 42 42:sh 43:sleep", "");
        assert!(
            s.contains("process group 42 was killed") && s.contains("sh, sleep"),
            "{s}"
        );
        let s = describe_kill("left 42 43:sleep", "");
        assert!(s.contains("still run: 43:sleep"), "{s}");
    }
}
