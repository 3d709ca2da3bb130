//! Host failures (file system, commands) mapped onto machine-core's error kinds.

use std::io;
use std::path::Path;
use std::process::Output;

use machine_core::{Error, ErrorKind};

/// A file-system error on `path` while doing `what`. Missing files are not-found,
/// refused access is unauthorized (the provider runs as root), the rest permanent.
pub(crate) fn io(what: &str, path: &Path, e: io::Error) -> Error {
    let kind = match e.kind() {
        io::ErrorKind::NotFound => ErrorKind::NotFound,
        io::ErrorKind::PermissionDenied => ErrorKind::Unauthorized,
        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock => ErrorKind::Transient,
        _ => ErrorKind::Permanent,
    };
    Error::new(kind, format!("{what} {}: {e}", path.display())).with_source(e)
}

/// A host command that could not be started (the tool is missing).
pub(crate) fn spawn(program: &str, e: io::Error) -> Error {
    let hint = match program {
        "ip" => " (apt-get install iproute2)",
        "nsenter" | "unshare" => " (apt-get install util-linux)",
        _ => "",
    };
    Error::permanent(format!("cannot run {program}{hint}: {e}")).with_source(e)
}

/// A host command that ran and failed; its stderr is the message.
pub(crate) fn command(what: &str, out: &Output) -> Error {
    let stderr = String::from_utf8_lossy(&out.stderr);
    Error::permanent(format!("{what} failed ({}): {}", out.status, stderr.trim()))
}

/// The state file of a machine does not parse: it was not written by this provider.
pub(crate) fn corrupt_state(path: &Path, e: serde_json::Error) -> Error {
    Error::permanent(format!(
        "machine state {} is corrupt: {e}; delete the machine's directory",
        path.display()
    ))
    .with_source(e)
}
