//! What comes back from a command: bounded tails of its output, its secrets masked,
//! logged line by line; the supervisor (`supervisor.rs`) uses these for every request.

use std::collections::VecDeque;

use machine_core::{ExecOutput, ExecRequest, ExposeSecret};

use crate::text::shown;

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

/// The request's secret environment values, for masking what the machine sends back
/// before anything is kept, logged or quoted in an error ([`ExecRequest::mask_output`]:
/// a command that echoes its token must not put it anywhere).
pub(crate) struct Masker {
    /// The request's environment alone (no command), `None` when it has none.
    secrets: Option<ExecRequest>,
    /// What `mask_output` masks: each value, and each line of a multi-line one.
    patterns: Vec<Vec<u8>>,
    /// The longest secret value: bytes kept beyond a bound so that a secret crossing the
    /// cut is still whole when masked, and only then cut.
    pub(crate) slack: usize,
}

impl Masker {
    pub(crate) fn new(req: &ExecRequest) -> Self {
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        for (_, value) in &req.env {
            let value = value.expose_secret();
            patterns.push(value.as_bytes().to_vec());
            patterns.extend(value.lines().map(|l| l.as_bytes().to_vec()));
        }
        patterns.retain(|p| p.len() >= machine_core::MIN_MASKED_LEN);
        let slack = patterns.iter().map(Vec::len).max().unwrap_or(0);
        let secrets = (!req.env.is_empty()).then(|| {
            let mut secrets = ExecRequest::new("");
            secrets.env = req.env.clone();
            secrets
        });
        Masker {
            secrets,
            patterns,
            slack,
        }
    }

    /// `bytes` with the secrets masked.
    pub(crate) fn bytes(&self, bytes: Vec<u8>) -> Vec<u8> {
        match &self.secrets {
            None => bytes,
            Some(s) => {
                let mut out = ExecOutput::new(None, bytes, Vec::new());
                s.mask_output(&mut out);
                out.stdout
            }
        }
    }

    /// The last `max` bytes of the stream whose tail is `window` (kept `slack` bytes
    /// longer than `max`), masked. The raw window's start may fall inside a secret (the
    /// machine or [`Tail`] cut there), so it is never shown: only what follows the
    /// window's last `max` bytes' start is masked and kept, that start moved back to
    /// the beginning of any secret crossing it, so that secret is masked whole.
    pub(crate) fn tail(&self, window: Vec<u8>, max: usize) -> Vec<u8> {
        let mut start = window.len().saturating_sub(max);
        if self.secrets.is_some() && start > 0 {
            loop {
                let crossing = self
                    .patterns
                    .iter()
                    .filter_map(|p| {
                        let from = (start + 1).saturating_sub(p.len());
                        window[from..(start + p.len()).min(window.len())]
                            .windows(p.len())
                            .position(|w| w == p.as_slice())
                            .map(|at| from + at)
                            .filter(|at| *at < start)
                    })
                    .min();
                match crossing {
                    Some(at) => start = at,
                    None => break,
                }
            }
        }
        let mut kept = self.bytes(window[start..].to_vec());
        kept.drain(..kept.len().saturating_sub(max));
        kept
    }
}

/// The outcome of a command whose streams' tails are `stdout` and `stderr` (each kept
/// up to [`Masker::slack`] bytes longer than `max`): the last `max` bytes of each, the
/// secrets masked whole even where the bound cut them; truncated when either was longer.
pub(crate) fn masked_tails(
    mask: &Masker,
    status: Option<i32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    max: usize,
) -> ExecOutput {
    let cut = stdout.len() > max || stderr.len() > max;
    ExecOutput::new(status, mask.tail(stdout, max), mask.tail(stderr, max)).with_truncated(cut)
}

/// Lines logged per stream and command; the rest is counted in one summary line, so
/// the log stays bounded whatever the command prints (the kept tail is in the output).
const MAX_LOG_LINES: usize = 100;

/// Logs what a command printed (already masked), line by line at debug level: at most
/// [`MAX_LOG_LINES`] lines of each stream, each cut to [`MAX_LOG_LINE`] bytes, then a
/// summary of what was left out. Control characters are shown escaped.
pub(crate) fn log_output(peer: &str, out: &ExecOutput) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    for (stream, bytes) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        let mut lines = bytes.split(|b| *b == b'\n');
        if bytes.ends_with(b"\n") {
            lines.next_back();
        }
        let (mut skipped_lines, mut skipped_bytes) = (0u64, 0u64);
        for (i, line) in lines.enumerate() {
            if i >= MAX_LOG_LINES {
                skipped_lines += 1;
                skipped_bytes += line.len() as u64 + 1;
                continue;
            }
            let line = shown(&line[..line.len().min(MAX_LOG_LINE)]);
            tracing::debug!(peer, stream, "{line}");
        }
        if skipped_lines > 0 {
            tracing::debug!(
                peer,
                stream,
                "{skipped_lines} more lines ({skipped_bytes} bytes) not logged"
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_the_bound_cuts_is_masked_whole_and_a_cut_start_never_shown() {
        let req = ExecRequest::new("x").env("T", machine_core::SecretString::from("SECRETVALUE"));
        let m = Masker::new(&req);
        assert_eq!(m.slack, 11);
        // The last 4 bytes fall inside the secret: it is masked whole instead.
        assert_eq!(m.tail(b"ab SECRETVALUE\n".to_vec(), 4), b"***\n");
        // A window the machine cut inside a secret: the part before the kept bytes'
        // start is never shown, even when the kept bytes shrink.
        assert_eq!(m.tail(b"VALUE SECRETVALUE!".to_vec(), 6), b"***!");
        assert_eq!(m.tail(b"ETVALUE and more".to_vec(), 8), b"and more");
        // No secrets: a plain tail.
        let none = Masker::new(&ExecRequest::new("x"));
        assert_eq!(none.tail(b"0123456789".to_vec(), 3), b"789");
        let out = masked_tails(&m, Some(1), b"SECRETVALUE".to_vec(), b"e".to_vec(), 20);
        assert_eq!((out.stdout.as_slice(), out.truncated), (&b"***"[..], false));
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
