//! Running one command on a channel: exit status, bounded output (the tail is kept),
//! each line streamed into tracing, a timeout, and optional stdin. Uploads and reads
//! run here directly; commands run under the supervisor (`supervisor.rs`), which uses
//! the same bounded buffers and log.

use std::collections::VecDeque;
use std::time::Duration;

use machine_core::{Error, ExecOutput, ExecRequest, Result};
use russh::ChannelMsg;
use russh::client::Handle;

use crate::client::{ClientHandler, humantime_secs};
use crate::errors::{connection_lost, ssh_error};
use crate::text::shown;

/// What to feed the command on standard input.
#[derive(Clone, Copy)]
pub(crate) enum Stdin<'a> {
    /// Nothing: stdin is closed at once.
    None,
    /// These bytes, then end of file.
    Bytes(&'a [u8]),
}

/// Lines longer than this are logged cut, so one huge line cannot grow the log buffer.
const MAX_LOG_LINE: usize = 4096;

/// The last `max` bytes of a stream.
pub(crate) struct Tail {
    buf: VecDeque<u8>,
    max: usize,
    pub(crate) cut: bool,
}

impl Tail {
    pub(crate) fn new(max: usize) -> Self {
        Tail {
            buf: VecDeque::with_capacity(max.min(64 * 1024)),
            max,
            cut: false,
        }
    }

    pub(crate) fn push(&mut self, data: &[u8]) {
        let data = if data.len() > self.max {
            self.cut = true;
            self.buf.clear();
            &data[data.len() - self.max..]
        } else {
            data
        };
        let over = (self.buf.len() + data.len()).saturating_sub(self.max);
        if over > 0 {
            self.cut = true;
            self.buf.drain(..over);
        }
        self.buf.extend(data);
    }

    /// Whether the kept bytes end with `suffix`.
    pub(crate) fn ends_with(&self, suffix: &[u8]) -> bool {
        self.buf.len() >= suffix.len()
            && self
                .buf
                .range(self.buf.len() - suffix.len()..)
                .eq(suffix.iter())
    }

    /// Whether the kept bytes hold `needle`.
    pub(crate) fn contains(&self, needle: &[u8]) -> bool {
        let (a, b) = self.buf.as_slices();
        let mut all = Vec::with_capacity(a.len() + b.len());
        all.extend_from_slice(a);
        all.extend_from_slice(b);
        all.windows(needle.len().max(1)).any(|w| w == needle)
    }

    pub(crate) fn into_vec(self) -> Vec<u8> {
        self.buf.into()
    }
}

/// Lines logged per stream and command; the rest is counted in one summary line, so
/// the log stays bounded whatever the command prints (the kept tail is in the output).
const MAX_LOG_LINES: usize = 100;

/// Splits a stream into lines for tracing, holding at most one partial line, and logs at
/// most [`MAX_LOG_LINES`] of them, then a summary of what was left out. Control
/// characters are shown escaped.
pub(crate) struct LineLog {
    partial: Vec<u8>,
    /// Lines starting with this are not logged (the supervisor's status line).
    hide: Option<String>,
    stream: &'static str,
    on: bool,
    logged: usize,
    skipped_lines: u64,
    skipped_bytes: u64,
}

impl LineLog {
    pub(crate) fn new(stream: &'static str, hide: Option<String>) -> Self {
        LineLog {
            partial: Vec::new(),
            hide,
            stream,
            on: tracing::enabled!(tracing::Level::DEBUG),
            logged: 0,
            skipped_lines: 0,
            skipped_bytes: 0,
        }
    }

    pub(crate) fn push(&mut self, peer: &str, data: &[u8]) {
        if !self.on {
            return;
        }
        if self.logged >= MAX_LOG_LINES {
            self.skipped_bytes += data.len() as u64;
            self.skipped_lines += data.iter().filter(|b| **b == b'\n').count() as u64;
            return;
        }
        let mut rest = data;
        while let Some(i) = rest.iter().position(|b| *b == b'\n') {
            self.take(&rest[..i]);
            self.emit(peer);
            rest = &rest[i + 1..];
            if self.logged >= MAX_LOG_LINES {
                self.skipped_bytes += rest.len() as u64;
                self.skipped_lines += rest.iter().filter(|b| **b == b'\n').count() as u64;
                return;
            }
        }
        self.take(rest);
    }

    fn take(&mut self, bytes: &[u8]) {
        let room = MAX_LOG_LINE.saturating_sub(self.partial.len());
        self.partial
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn emit(&mut self, peer: &str) {
        let hidden = self
            .hide
            .as_ref()
            .is_some_and(|h| self.partial.starts_with(h.as_bytes()));
        if !hidden {
            let line = shown(&self.partial);
            tracing::debug!(peer, stream = self.stream, "{line}");
        }
        self.partial.clear();
        self.logged += 1;
    }

    pub(crate) fn finish(&mut self, peer: &str) {
        if !self.on {
            return;
        }
        if !self.partial.is_empty() {
            self.emit(peer);
        }
        if self.skipped_bytes > 0 {
            tracing::debug!(
                peer,
                stream = self.stream,
                "{} more lines ({} bytes) not logged",
                self.skipped_lines,
                self.skipped_bytes
            );
        }
    }
}

/// A command as errors name it: its first line, cut to 80 characters.
pub(crate) fn label(command: &str) -> String {
    let first = command.lines().next().unwrap_or("");
    let cut: String = first.chars().take(80).collect();
    if cut.len() < command.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}

/// Runs `req` (already adjusted for sudo and the default timeout) on a new channel.
pub(crate) async fn run(
    handle: &Handle<ClientHandler>,
    peer: &str,
    req: &ExecRequest,
    stdin: Stdin<'_>,
) -> Result<ExecOutput> {
    // Secret environment values go over stdin, never on the command line.
    let machine_core::RemoteShell {
        line, stdin_prefix, ..
    } = req.remote_shell()?;
    let env_input = (!stdin_prefix.is_empty()).then_some(stdin_prefix);
    let channel = handle.channel_open_session().await.map_err(|e| {
        if handle.is_closed() {
            connection_lost(peer, "opening a channel")
        } else {
            ssh_error(peer, e)
        }
    })?;
    let (mut reader, writer) = channel.split();
    tracing::debug!(peer, command = %req.command, sudo = req.sudo, "exec");
    writer
        .exec(true, line)
        .await
        .map_err(|_| connection_lost(peer, "starting a command"))?;

    let feed = async {
        if let Some(env) = &env_input {
            writer.data(env.as_slice()).await?;
        }
        if let Stdin::Bytes(bytes) = stdin {
            writer.data(bytes).await?;
        }
        writer.eof().await
    };
    let collect = async {
        let mut out = Tail::new(req.max_output);
        let mut err = Tail::new(req.max_output);
        let mut out_log = LineLog::new("stdout", None);
        let mut err_log = LineLog::new("stderr", None);
        let mut status = None;
        let mut finished = false;
        let (mut out_bytes, mut err_bytes) = (0u64, 0u64);
        while let Some(msg) = reader.wait().await {
            match msg {
                ChannelMsg::Data { data } => {
                    out_bytes += data.len() as u64;
                    out_log.push(peer, &data);
                    out.push(&data);
                }
                ChannelMsg::ExtendedData { data, ext: 1 } => {
                    err_bytes += data.len() as u64;
                    err_log.push(peer, &data);
                    err.push(&data);
                }
                ChannelMsg::ExitStatus { exit_status } => {
                    status = Some(exit_status as i32);
                    finished = true;
                }
                ChannelMsg::ExitSignal { signal_name, .. } => {
                    tracing::debug!(peer, command = %req.command, signal = ?signal_name, "killed by a signal");
                    finished = true;
                }
                ChannelMsg::Failure => {
                    return Err(Error::permanent(format!(
                        "{peer}: the server refused to run {}",
                        label(&req.command)
                    )));
                }
                ChannelMsg::Close => break,
                _ => {}
            }
        }
        out_log.finish(peer);
        err_log.finish(peer);
        tracing::debug!(peer, command = %label(&req.command), ?status, stdout_bytes = out_bytes, stderr_bytes = err_bytes, "exec finished");
        if !finished {
            return Err(connection_lost(
                peer,
                &format!("running {}", label(&req.command)),
            ));
        }
        let truncated = out.cut || err.cut;
        Ok(ExecOutput::new(status, out.into_vec(), err.into_vec()).with_truncated(truncated))
    };
    let both = async {
        // Feed and collect together: a command may write before it has read all its input.
        // The channel's end ends both: input still waiting for window space when the
        // session or connection died would otherwise wait forever.
        tokio::pin!(feed);
        tokio::pin!(collect);
        let mut fed_ok = None;
        let out = loop {
            tokio::select! {
                fed = &mut feed, if fed_ok.is_none() => fed_ok = Some(fed.is_ok()),
                collected = &mut collect => break collected?,
            }
        };
        if fed_ok == Some(false) && out.status.is_none() {
            return Err(connection_lost(peer, "sending input"));
        }
        Ok(out)
    };
    match req.timeout {
        None => both.await,
        Some(limit) => match tokio::time::timeout(limit, both).await {
            Ok(res) => res,
            Err(_) => {
                let _ = writer.close().await;
                Err(timed_out(peer, &req.command, limit))
            }
        },
    }
}

fn timed_out(peer: &str, command: &str, limit: Duration) -> Error {
    Error::timeout(format!(
        "{peer}: {} did not finish within {}; its channel was closed (its input ends, so the upload or read stops and leaves nothing behind)",
        label(command),
        humantime_secs(limit)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_bytes() {
        let mut t = Tail::new(5);
        t.push(b"abc");
        assert!(!t.cut);
        t.push(b"defg");
        t.push(b"");
        assert!(t.cut);
        assert_eq!(t.into_vec(), b"cdefg");
        let mut t = Tail::new(3);
        t.push(b"0123456789");
        assert_eq!(t.into_vec(), b"789");
        let mut t = Tail::new(0);
        t.push(b"x");
        assert!(t.into_vec().is_empty());
    }
}
