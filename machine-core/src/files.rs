//! Reading a file the user names (a CA bundle, a key, a known_hosts file): a regular file
//! only, and never more than a bound, so that `/dev/zero`, a FIFO or a multi-gigabyte
//! file is an error naming the field instead of a hang or an exhausted memory.

use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// The most bytes [`read_user_file`] reads unless told otherwise: 1 MiB holds any CA
/// bundle, key or known_hosts file with room to spare.
pub const MAX_USER_FILE_BYTES: u64 = 1024 * 1024;

/// Reads `path`, named by the setting `field`: refused (invalid spec on `field`, naming
/// the path) when it is missing, not a regular file (a directory, a device such as
/// `/dev/zero`, a FIFO) or larger than `max` bytes. The size is checked on the open file
/// and the read is bounded too, so a file that grows while it is read cannot get past.
pub fn read_user_file(field: &str, path: &Path, max: u64) -> Result<Vec<u8>> {
    let bad = |why: String| Error::invalid_spec(field, format!("{}: {why}", path.display()));
    // Looked at before it is opened: opening a FIFO waits for a writer, for ever.
    let before = std::fs::metadata(path).map_err(|e| bad(format!("cannot be read: {e}")))?;
    if !before.is_file() {
        return Err(bad("is not a regular file".to_owned()));
    }
    let file = std::fs::File::open(path).map_err(|e| bad(format!("cannot be read: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| bad(format!("cannot be read: {e}")))?;
    if !meta.is_file() {
        return Err(bad("is not a regular file".to_owned()));
    }
    if meta.len() > max {
        return Err(bad(format!(
            "is {} bytes, over the {max}-byte bound",
            meta.len()
        )));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| bad(format!("cannot be read: {e}")))?;
    if bytes.len() as u64 > max {
        return Err(bad(format!("grew over the {max}-byte bound while read")));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_directories_fifos_and_big_files_are_refused_naming_the_field() {
        for path in ["/dev/zero", "/tmp", "/nonexistent/ca.pem"] {
            let e = read_user_file("tls.caFile", Path::new(path), MAX_USER_FILE_BYTES).unwrap_err();
            assert_eq!(e.field(), Some("tls.caFile"), "{path}: {e}");
            assert!(e.to_string().contains(path), "{e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'x'; 2048]).unwrap();
        let e = read_user_file("f", &big, 1024).unwrap_err();
        assert!(e.to_string().contains("over the 1024-byte bound"), "{e}");
        assert_eq!(read_user_file("f", &big, 4096).unwrap().len(), 2048);
        let fifo = dir.path().join("fifo");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let e = read_user_file("f", &fifo, 1024);
        assert!(e.is_err(), "a FIFO was read");
    }
}
