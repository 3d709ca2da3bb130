//! Running one command on a channel: exit status, bounded output (the tail is kept),
//! each line streamed into tracing, a timeout, and optional stdin.

use std::collections::VecDeque;
use std::time::Duration;

use machine_core::{Error, ExecOutput, ExecRequest, ExposeSecret, Result};
use russh::client::Handle;
use russh::{ChannelMsg, Sig};

use crate::client::{ClientHandler, humantime_secs};
use crate::errors::{connection_lost, ssh_error};

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
struct Tail {
    buf: VecDeque<u8>,
    max: usize,
    cut: bool,
}

impl Tail {
    fn new(max: usize) -> Self {
        Tail {
            buf: VecDeque::with_capacity(max.min(64 * 1024)),
            max,
            cut: false,
        }
    }

    fn push(&mut self, data: &[u8]) {
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

    fn into_vec(self) -> Vec<u8> {
        self.buf.into()
    }
}

/// Splits a stream into lines for tracing, holding at most one partial line.
struct LineLog {
    partial: Vec<u8>,
    stream: &'static str,
    on: bool,
}

impl LineLog {
    fn new(stream: &'static str) -> Self {
        LineLog {
            partial: Vec::new(),
            stream,
            on: tracing::enabled!(tracing::Level::DEBUG),
        }
    }

    fn push(&mut self, peer: &str, data: &[u8]) {
        if !self.on {
            return;
        }
        let mut rest = data;
        while let Some(i) = rest.iter().position(|b| *b == b'\n') {
            self.take(&rest[..i]);
            self.emit(peer);
            rest = &rest[i + 1..];
        }
        self.take(rest);
    }

    fn take(&mut self, bytes: &[u8]) {
        let room = MAX_LOG_LINE.saturating_sub(self.partial.len());
        self.partial
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn emit(&mut self, peer: &str) {
        let line = String::from_utf8_lossy(&self.partial);
        tracing::debug!(peer, stream = self.stream, "{line}");
        self.partial.clear();
    }

    fn finish(&mut self, peer: &str) {
        if self.on && !self.partial.is_empty() {
            self.emit(peer);
        }
    }
}

/// Runs `req` (already adjusted for sudo and the default timeout) on a new channel.
pub(crate) async fn run(
    handle: &Handle<ClientHandler>,
    peer: &str,
    req: &ExecRequest,
    stdin: Stdin<'_>,
) -> Result<ExecOutput> {
    let (line, env_input) = command_line(req)?;
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
        let mut out_log = LineLog::new("stdout");
        let mut err_log = LineLog::new("stderr");
        let mut status = None;
        let mut finished = false;
        while let Some(msg) = reader.wait().await {
            match msg {
                ChannelMsg::Data { data } => {
                    out_log.push(peer, &data);
                    out.push(&data);
                }
                ChannelMsg::ExtendedData { data, ext: 1 } => {
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
                        "{peer}: the server refused to run {:?}",
                        req.command
                    )));
                }
                ChannelMsg::Close => break,
                _ => {}
            }
        }
        out_log.finish(peer);
        err_log.finish(peer);
        if !finished {
            return Err(connection_lost(peer, &format!("running {:?}", req.command)));
        }
        let truncated = out.cut || err.cut;
        Ok(ExecOutput {
            status,
            stdout: out.into_vec(),
            stderr: err.into_vec(),
            truncated,
        })
    };
    let both = async {
        // Feed and collect together: a command may write before it has read all its input.
        let (fed, collected) = tokio::join!(feed, collect);
        let out = collected?;
        if fed.is_err() && out.status.is_none() {
            return Err(connection_lost(peer, "sending input"));
        }
        Ok(out)
    };
    match req.timeout {
        None => both.await,
        Some(limit) => match tokio::time::timeout(limit, both).await {
            Ok(res) => res,
            Err(_) => {
                let _ = writer.signal(Sig::KILL).await;
                let _ = writer.close().await;
                Err(timed_out(peer, &req.command, limit))
            }
        },
    }
}

/// The command line to send, and what to feed before the command's own input.
///
/// Environment values are secrets: on the command line they would show in `ps` on the
/// machine for as long as the command runs. So they go over stdin instead: a wrapper
/// shell reads exactly their length with `head -c`, evaluates the `export` lines, and
/// execs the command with the rest of stdin untouched.
fn command_line(req: &ExecRequest) -> Result<(String, Option<Vec<u8>>)> {
    if req.env.is_empty() {
        return Ok((req.shell_line(), None));
    }
    let mut script = String::new();
    for (i, (name, value)) in req.env.iter().enumerate() {
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
        let quoted = shlex::try_quote(value.expose_secret())
            .map_err(|_| Error::invalid_spec(format!("env[{i}].value"), "holds a NUL byte"))?;
        script.push_str(&format!("export {name}={quoted}\n"));
    }
    let quote = |s: &str| {
        shlex::try_quote(s)
            .map(|q| q.into_owned())
            .map_err(|_| Error::invalid_spec("command", "holds a NUL byte"))
    };
    let wrapper = format!("eval \"$(head -c {})\" && exec sh -c \"$0\"", script.len());
    let sudo = if req.sudo { "sudo -n " } else { "" };
    let line = format!("{sudo}sh -c {} {}", quote(&wrapper)?, quote(&req.command)?);
    Ok((line, Some(script.into_bytes())))
}

fn timed_out(peer: &str, command: &str, limit: Duration) -> Error {
    Error::timeout(format!(
        "{peer}: command {command:?} did not finish within {}; it was sent SIGKILL",
        humantime_secs(limit)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_goes_over_stdin_not_the_command_line() {
        let req = ExecRequest::new("echo \"$A\"")
            .env("A", machine_core::SecretString::from("s3cret 'x'"));
        let (line, input) = command_line(&req).unwrap();
        assert!(!line.contains("s3cret"), "{line}");
        let out = std::process::Command::new("sh")
            .args(["-c", &line])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().unwrap().write_all(&input.unwrap())?;
                c.wait_with_output()
            })
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "s3cret 'x'\n");
        let bad = ExecRequest::new("true").env("A-B", machine_core::SecretString::from("v"));
        assert_eq!(command_line(&bad).unwrap_err().field(), Some("env[0].name"));
    }

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
