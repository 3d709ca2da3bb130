//! The supervisor of every command (`supervise.sh`) and its killer (`kill.sh`), and
//! the client's side of both; the crate documentation ("Commands on the machine")
//! says what they promise.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use machine_core::{Error, ExecOutput, ExecRequest, Result};
use russh::ChannelMsg;
use russh::client::Handle;
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

static SUPERVISE: LazyLock<String> = LazyLock::new(|| strip(include_str!("supervise.sh")));
static KILL: LazyLock<String> = LazyLock::new(|| strip(include_str!("kill.sh")));

/// Room for the status line at the end of stderr.
const TRAILER_ROOM: usize = 1024;

/// The most output the machine is asked to keep per stream (`tail -c` takes it whole).
const MAX_KEPT: usize = 1 << 40;

/// How long a finished run's records may take to go before the client returns anyway
/// (they go on their own; only a rerun started at once could still find them).
const CLEANUP_WAIT: Duration = Duration::from_secs(5);

/// Where and under which name one command runs on the machine.
pub(crate) struct Supervision {
    /// The run directory.
    pub(crate) dir: String,
    /// The run key.
    pub(crate) key: String,
}

impl Supervision {
    /// The run of `req` on `target` (`host:port`) as `user` (root when through sudo).
    pub(crate) fn new(target: &str, user: &str, dir: Option<&str>, req: &ExecRequest) -> Self {
        let root = req.sudo || user == "root";
        let dir = match dir {
            Some(d) => d.to_owned(),
            None if root => "/run/bootstrap-ssh".to_owned(),
            None => format!("/tmp/bootstrap-ssh-{user}"),
        };
        let mut h = Sha256::new();
        for part in [target, if root { "root" } else { user }, &req.command] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        for (name, _) in &req.env {
            h.update(name.as_bytes());
            h.update([0]);
        }
        let key = crate::upload::hex(&h.finalize()[..16]);
        Supervision { dir, key }
    }
}

/// A token no command output holds by chance: marks the status line.
fn token(key: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = Sha256::new();
    h.update(key.as_bytes());
    h.update(nanos.to_le_bytes());
    h.update(std::process::id().to_le_bytes());
    h.update(N.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    format!("bssh-{}", crate::upload::hex(&h.finalize()[..12]))
}

fn quote(field: &str, s: &str) -> Result<String> {
    shlex::try_quote(s)
        .map(|q| q.into_owned())
        .map_err(|_| Error::invalid_spec(field, "holds a NUL byte"))
}

/// The export lines of the secret environment, refused as machine-core refuses them.
fn env_script(req: &ExecRequest) -> Result<Option<Vec<u8>>> {
    if req.env.is_empty() {
        return Ok(None);
    }
    // machine-core's own check of names and values, then the same export lines.
    let shell = req.remote_shell()?;
    Ok(Some(shell.stdin_prefix))
}

/// How a run ended, from the status line.
enum Trailer {
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

/// Runs `req` (already adjusted for sudo and the default timeout) under the supervisor.
pub(crate) async fn run(
    handle: &Handle<ClientHandler>,
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
    let sudo = if req.sudo { "sudo -n " } else { "" };
    let mut line = format!(
        "{sudo}sh -c {} bssh {} {} {keep} {token} {now} {}",
        quote("command", &SUPERVISE)?,
        quote("run_dir", &sup.dir)?,
        sup.key,
        quote("command", &req.command)?,
    );
    if env.is_some() {
        line.push_str(" env");
    }
    let channel = handle.channel_open_session().await.map_err(|e| {
        if handle.is_closed() {
            connection_lost(peer, "opening a channel")
        } else {
            ssh_error(peer, e)
        }
    })?;
    let (mut reader, writer) = channel.split();
    tracing::debug!(peer, command = %req.command, sudo = req.sudo, run = %sup.key, "exec");
    writer
        .exec(true, line)
        .await
        .map_err(|_| connection_lost(peer, "starting a command"))?;
    if let Some(env) = &env {
        let mut input = env.clone();
        input.extend_from_slice(token.as_bytes());
        input.push(b'\n');
        writer
            .data(input.as_slice())
            .await
            .map_err(|_| connection_lost(peer, "sending the environment"))?;
    }

    let collect = async {
        let room = keep.saturating_add(TRAILER_ROOM);
        let mut out = Tail::new(room);
        let mut err = Tail::new(room);
        let mut window = Tail::new(TRAILER_ROOM);
        let mut out_window = Tail::new(TRAILER_ROOM);
        let out_mark = format!("\n{token} out\n");
        let mut exit = None;
        let mut eof = false;
        let (mut out_done, mut err_done) = (false, false);
        while let Some(msg) = reader.wait().await {
            match msg {
                ChannelMsg::Data { data } => {
                    out.push(&data);
                    out_window.push(&data);
                    out_done = out_window.ends_with(out_mark.as_bytes());
                }
                ChannelMsg::ExtendedData { data, ext: 1 } => {
                    err.push(&data);
                    window.push(&data);
                    err_done = window.ends_with(b"\n") && window.contains(token.as_bytes());
                }
                ChannelMsg::Eof => {
                    eof = true;
                    break;
                }
                ChannelMsg::ExitStatus { exit_status } => exit = Some(exit_status),
                ChannelMsg::Failure => {
                    return Err(Error::permanent(format!(
                        "{peer}: the server refused to run {}",
                        label(&req.command)
                    )));
                }
                ChannelMsg::Close => break,
                _ => {}
            }
            // Both streams have said their last line: everything is here.
            if out_done && err_done {
                break;
            }
        }
        let window = window.into_vec();
        let Some((how, len)) = trailer(&window, &token) else {
            if eof || exit.is_some() {
                // Its last words, masked: the supervisor may have replayed the output.
                let stderr = mask.tail(err.into_vec(), TRAILER_ROOM);
                return Err(Error::permanent(format!(
                    "{peer}: the supervisor of {} did not start (exit status {}): {}",
                    label(&req.command),
                    exit.map_or("none".to_owned(), |s| s.to_string()),
                    shown(&stderr).trim()
                )));
            }
            return Err(Error::transient(format!(
                "{peer}: connection lost while running {}; the command goes on on the machine (run {} in {}): running the same command again waits for it and returns its outcome",
                label(&req.command),
                sup.key,
                sup.dir
            )));
        };
        match how {
            Trailer::Error(why) => Err(supervisor_error(peer, req, sup, &why)),
            Trailer::Exit { status, how } => {
                // The client has it all: the records may go. The supervisor ends once
                // they are gone; waiting for that keeps the same command run again
                // right after from taking this run's outcome as its own.
                let _ = writer.data(&b"ok\n"[..]).await;
                let _ = writer.eof().await;
                let _ = tokio::time::timeout(CLEANUP_WAIT, async {
                    while let Some(msg) = reader.wait().await {
                        if matches!(msg, ChannelMsg::ExitStatus { .. } | ChannelMsg::Close) {
                            break;
                        }
                    }
                })
                .await;
                let mut out = out.into_vec();
                let mut err = err.into_vec();
                err.truncate(err.len().saturating_sub(len));
                if out.ends_with(out_mark.as_bytes()) {
                    out.truncate(out.len() - out_mark.len());
                }
                let output = masked_tails(&mask, Some(status), out, err, req.max_output);
                log_output(peer, &output);
                tracing::debug!(peer, command = %label(&req.command), status, how = %escape_controls(&how), stdout_bytes = output.stdout.len(), stderr_bytes = output.stderr.len(), "exec finished");
                if how.contains("log-incomplete") {
                    tracing::warn!(peer, command = %label(&req.command), dir = %sup.dir, "the output log could not be written in full (is the run directory's filesystem full?)");
                }
                if let Some(why) = how.strip_prefix("rerun:") {
                    tracing::warn!(peer, command = %label(&req.command), "a previous run ended without an outcome ({}); it ran again", escape_controls(why.split(',').next().unwrap_or(why)));
                }
                Ok(output)
            }
        }
    };
    match req.timeout {
        None => collect.await,
        Some(limit) => match tokio::time::timeout(limit, collect).await {
            Ok(res) => res,
            Err(_) => {
                let what = kill(handle, peer, sup, req.sudo, &mask).await;
                let _ = writer.close().await;
                Err(Error::timeout(format!(
                    "{peer}: command {} did not finish within {}; {what}",
                    label(&req.command),
                    humantime_secs(limit)
                )))
            }
        },
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
    fn runs_are_named_by_target_user_command_and_env_names() {
        let a = Supervision::new("h:22", "root", None, &ExecRequest::new("true"));
        let b = Supervision::new("h:23", "root", None, &ExecRequest::new("true"));
        let c = Supervision::new("h:22", "ops", None, &ExecRequest::new("true"));
        let d = Supervision::new("h:22", "ops", None, &ExecRequest::new("true").sudo());
        assert_ne!(a.key, b.key);
        assert_ne!(a.key, c.key);
        assert_eq!(a.key, d.key, "sudo runs as root");
        assert_eq!(a.dir, "/run/bootstrap-ssh");
        assert_eq!(c.dir, "/tmp/bootstrap-ssh-ops");
        assert_eq!(d.dir, "/run/bootstrap-ssh");
        assert_eq!(a.key.len(), 32);
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
