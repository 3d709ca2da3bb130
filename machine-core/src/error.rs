//! The one error type of the library, classified by [`ErrorKind`].
//!
//! Providers map their wire errors onto these kinds; the retry machinery
//! ([`crate::retry`]) and the composer decide what to do from the kind alone.

use std::fmt;
use std::time::Duration;

/// What went wrong, in the terms a caller acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A passing fault (a reset connection, a 5xx, an unreachable host): retried.
    Transient,
    /// The remote asked us to slow down; [`Error::retry_after`] may say for how long: retried.
    Throttled,
    /// A fault that will not go away by itself: never retried.
    Permanent,
    /// The request is wrong; [`Error::field`] names the offending field: never retried.
    InvalidSpec,
    /// The object does not exist (or no longer does).
    NotFound,
    /// The object exists in a state that conflicts with the request.
    Conflict,
    /// Credentials are missing, wrong or lack a permission.
    Unauthorized,
    /// An account limit stops the request (instances, vCPUs, addresses).
    QuotaExceeded,
    /// The infrastructure has no capacity for what was asked (EC2's
    /// `InsufficientInstanceCapacity`, a pool with no free server of the size): not the
    /// account's limit but the place's. Not retried unchanged: a caller may choose
    /// another size or zone, or try again in minutes rather than seconds.
    InsufficientCapacity,
    /// A deadline passed before the work finished.
    Timeout,
    /// The caller cancelled the work.
    Cancelled,
}

impl ErrorKind {
    /// Whether an error of this kind may succeed when tried again unchanged.
    ///
    /// Only [`ErrorKind::Transient`] and [`ErrorKind::Throttled`] are.
    pub fn is_retryable(self) -> bool {
        matches!(self, ErrorKind::Transient | ErrorKind::Throttled)
    }

    fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Transient => "transient",
            ErrorKind::Throttled => "throttled",
            ErrorKind::Permanent => "permanent",
            ErrorKind::InvalidSpec => "invalid spec",
            ErrorKind::NotFound => "not found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::QuotaExceeded => "quota exceeded",
            ErrorKind::InsufficientCapacity => "insufficient capacity",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error of the library: a kind, a message, and where relevant the field at fault,
/// a retry hint and the underlying cause.
///
/// Display shows `kind: message` and, for invalid specs, the field path
/// (`invalid spec: spec.name: must be a DNS label`). Messages never carry secrets:
/// constructors take what callers give them, and every secret in this library is a
/// [`crate::SecretString`] that cannot be formatted.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    field: Option<String>,
    retry_after: Option<Duration>,
    source: Option<Source>,
}

/// The result type of the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            field: None,
            retry_after: None,
            source: None,
        }
    }

    /// A passing fault, worth retrying.
    pub fn transient(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Transient, message)
    }

    /// A throttling answer; `retry_after` is the delay the remote asked for, if it said.
    pub fn throttled(message: impl Into<String>, retry_after: Option<Duration>) -> Self {
        let mut e = Self::new(ErrorKind::Throttled, message);
        e.retry_after = retry_after;
        e
    }

    /// A fault that retrying will not cure.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Permanent, message)
    }

    /// A request that is wrong at `field` (a dotted path such as `spec.labels.team`).
    pub fn invalid_spec(field: impl Into<String>, message: impl Into<String>) -> Self {
        let mut e = Self::new(ErrorKind::InvalidSpec, message);
        e.field = Some(field.into());
        e
    }

    /// An account limit stops the request.
    pub fn quota_exceeded(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::QuotaExceeded, message)
    }

    /// The infrastructure has no capacity for the request (see
    /// [`ErrorKind::InsufficientCapacity`]).
    pub fn insufficient_capacity(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InsufficientCapacity, message)
    }

    /// The named object does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// A deadline passed.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Timeout, message)
    }

    /// The caller cancelled.
    pub fn cancelled(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Cancelled, message)
    }

    /// Attaches the underlying cause, kept for [`std::error::Error::source`].
    pub fn with_source(mut self, source: impl Into<Source>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Sets the field path (for kinds other than invalid spec too, such as a quota on a field).
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// Prefixes the field path with `parent`, so that a nested validator's `name`
    /// becomes `machines[3].name`.
    pub fn within(mut self, parent: &str) -> Self {
        self.field = Some(match self.field.take() {
            Some(f) if f.starts_with('[') => format!("{parent}{f}"),
            Some(f) => format!("{parent}.{f}"),
            None => parent.to_owned(),
        });
        self
    }

    /// Prefixes the message with context, keeping kind, field and source.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }

    /// Appends `suffix` to the message (a location such as ` (line 3, column 5)`).
    pub(crate) fn with_message_suffix(mut self, suffix: &str) -> Self {
        self.message.push_str(suffix);
        self
    }

    /// The kind of the error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without kind or field.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The field path at fault, for invalid specs and some quota errors.
    pub fn field(&self) -> Option<&str> {
        self.field.as_deref()
    }

    /// The delay the remote asked for before a retry, for throttled errors.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Shorthand for `self.kind().is_retryable()`.
    pub fn is_retryable(&self) -> bool {
        self.kind.is_retryable()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.kind)?;
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        f.write_str(&self.message)?;
        if let Some(after) = self.retry_after {
            write!(f, " (retry after {})", humantime::format_duration(after))?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// The most characters of a caller's value an error message shows; longer values are cut
/// with an ellipsis and their full length, so a 10 KB value never fills a log line.
pub const MAX_SHOWN_VALUE_CHARS: usize = 64;

/// A caller's value as error messages show it: quoted and escaped like `{:?}`, cut to
/// [`MAX_SHOWN_VALUE_CHARS`] characters with `…` and the full length in bytes when longer
/// (`"aaaa…" (10000 bytes)`). Every message of the library that echoes a value uses it.
///
/// ```
/// use machine_core::shown;
///
/// assert_eq!(shown("web-1").to_string(), "\"web-1\"");
/// let long = shown(&"x".repeat(10_000)).to_string();
/// assert!(long.len() < 100 && long.ends_with("…\" (10000 bytes)"), "{long}");
/// ```
pub fn shown(value: &str) -> Shown<'_> {
    Shown(value)
}

/// A value bounded for an error message; see [`shown`].
#[derive(Clone, Copy)]
pub struct Shown<'a>(&'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.char_indices().nth(MAX_SHOWN_VALUE_CHARS) {
            None => write!(f, "{:?}", self.0),
            Some((cut, _)) => {
                let quoted = format!("{:?}", &self.0[..cut]);
                let open = &quoted[..quoted.len() - 1];
                write!(f, "{open}…\" ({} bytes)", self.0.len())
            }
        }
    }
}

impl fmt::Debug for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A map key as a field path shows it (`labels.<key>`): cut like [`shown`] values, with
/// `…`, so that a 10 KB key does not make a 10 KB field path.
pub fn shown_key(key: &str) -> std::borrow::Cow<'_, str> {
    match key.char_indices().nth(MAX_SHOWN_VALUE_CHARS) {
        None => key.into(),
        Some((cut, _)) => format!("{}…", &key[..cut]).into(),
    }
}

/// Shortens every quoted run (`"..."` or `` `...` ``) longer than [`MAX_SHOWN_VALUE_CHARS`]
/// in a message written by someone else (serde, a parser), as [`shown`] does for ours.
pub(crate) fn shorten_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(1024));
    let mut rest = message;
    while let Some(open) = rest.find(['"', '`']) {
        let quote = rest[open..].chars().next().unwrap_or('"');
        out.push_str(&rest[..=open]);
        let body = &rest[open + 1..];
        // The closing quote: the next unescaped one, or the end of the message.
        let mut end = body.len();
        let mut escaped = false;
        for (i, c) in body.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                c if c == quote && !escaped => {
                    end = i;
                    break;
                }
                _ => escaped = false,
            }
        }
        let inner = &body[..end];
        match inner.char_indices().nth(MAX_SHOWN_VALUE_CHARS) {
            Some((cut, _)) => {
                out.push_str(&inner[..cut]);
                out.push('…');
                out.push(quote);
                out.push_str(&format!(" ({} bytes)", inner.len()));
            }
            None => {
                out.push_str(inner);
                if end < body.len() {
                    out.push(quote);
                }
            }
        }
        rest = body.get(end + 1..).unwrap_or("");
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transient_and_throttled_are_retryable() {
        let retryable: Vec<_> = [
            ErrorKind::Transient,
            ErrorKind::Throttled,
            ErrorKind::Permanent,
            ErrorKind::InvalidSpec,
            ErrorKind::NotFound,
            ErrorKind::Conflict,
            ErrorKind::Unauthorized,
            ErrorKind::QuotaExceeded,
            ErrorKind::InsufficientCapacity,
            ErrorKind::Timeout,
            ErrorKind::Cancelled,
        ]
        .into_iter()
        .filter(|k| k.is_retryable())
        .collect();
        assert_eq!(retryable, [ErrorKind::Transient, ErrorKind::Throttled]);
    }

    #[test]
    fn shown_values_are_cut_with_their_length() {
        assert_eq!(shown("a\"b").to_string(), r#""a\"b""#);
        let exact = "y".repeat(MAX_SHOWN_VALUE_CHARS);
        assert_eq!(shown(&exact).to_string(), format!("{exact:?}"));
        let long = "é".repeat(10_000);
        let s = shown(&long).to_string();
        assert_eq!(s, format!("\"{}…\" (20000 bytes)", "é".repeat(64)));
    }

    #[test]
    fn quoted_runs_in_foreign_messages_are_cut() {
        let msg = format!(
            "invalid type: string \"{}\", expected u32 at line 3",
            "z".repeat(10_000)
        );
        let s = shorten_quoted(&msg);
        assert!(s.len() < 200, "{s}");
        assert!(
            s.contains("…\" (10000 bytes), expected u32 at line 3"),
            "{s}"
        );
        assert_eq!(
            shorten_quoted("unknown field `a`, expected `b`"),
            "unknown field `a`, expected `b`"
        );
        assert_eq!(shorten_quoted("open \"quote"), "open \"quote");
    }

    #[test]
    fn display_names_kind_field_and_retry_hint() {
        let e = Error::invalid_spec("name", "must be a DNS label").within("machines[2]");
        assert_eq!(
            e.to_string(),
            "invalid spec: machines[2].name: must be a DNS label"
        );
        let t = Error::throttled("slow down", Some(Duration::from_secs(2)));
        assert_eq!(t.to_string(), "throttled: slow down (retry after 2s)");
    }
}
