//! Mapping russh and socket errors onto machine-core's [`ErrorKind`]s.
//!
//! The rule: anything that may pass by itself (refused, reset, timed out, a dropped
//! connection) is transient; a protocol the peer cannot speak is permanent. Host-key
//! and authentication failures are classified where they are detected.

use std::io;

use machine_core::{Error, ErrorKind};

use crate::text::escape_controls;

/// Classifies a socket error met while talking to `peer`.
pub(crate) fn io_error(peer: &str, e: io::Error) -> Error {
    use io::ErrorKind as K;
    let kind = match e.kind() {
        K::PermissionDenied | K::InvalidInput | K::Unsupported => ErrorKind::Permanent,
        _ => ErrorKind::Transient,
    };
    let what = match e.kind() {
        K::ConnectionRefused => "connection refused",
        K::ConnectionReset => "connection reset",
        K::TimedOut => "connection timed out",
        K::UnexpectedEof | K::ConnectionAborted | K::BrokenPipe => "connection dropped",
        _ => "socket error",
    };
    Error::new(kind, format!("{peer}: {what}: {e}")).with_source(e)
}

/// Classifies an error of the SSH protocol layer met while talking to `peer`.
pub(crate) fn ssh_error(peer: &str, e: russh::Error) -> Error {
    use russh::Error as R;
    let kind = match &e {
        R::IO(_) => return io_error(peer, into_io(e)),
        R::Disconnect
        | R::HUP
        | R::ConnectionTimeout
        | R::KeepaliveTimeout
        | R::InactivityTimeout
        | R::SendError
        | R::RecvError
        | R::Elapsed(_)
        | R::Join(_)
        | R::Pending
        | R::Kex
        | R::KexInit => ErrorKind::Transient,
        R::NotAuthenticated | R::NoAuthMethod | R::UnsupportedAuthMethod => ErrorKind::Unauthorized,
        R::NoCommonAlgo { kind, ours, theirs } => {
            let theirs = theirs
                .iter()
                .map(|t| escape_controls(t))
                .collect::<Vec<_>>();
            let hint = if matches!(kind, russh::AlgorithmKind::Key)
                && theirs.iter().any(|t| t == "ssh-rsa")
            {
                "; ssh-rsa (RSA with SHA-1) is refused, as OpenSSH 8.8 and later refuse it: upgrade the server, give it an ed25519 key, or opt in with SshConfig::with_ssh_rsa_sha1(true)"
            } else {
                ""
            };
            return Error::permanent(format!(
                "{peer}: no {kind:?} algorithm in common: the server offers {}, this client accepts {}{hint}",
                theirs.join(","),
                ours.join(",")
            ))
            .with_source(e);
        }
        _ => ErrorKind::Permanent,
    };
    Error::new(kind, format!("{peer}: ssh: {e}")).with_source(e)
}

fn into_io(e: russh::Error) -> io::Error {
    match e {
        russh::Error::IO(io) => io,
        other => io::Error::other(other),
    }
}

/// The connection dropped while a request was in flight.
pub(crate) fn connection_lost(peer: &str, doing: &str) -> Error {
    Error::transient(format!("{peer}: connection lost while {doing}"))
}
