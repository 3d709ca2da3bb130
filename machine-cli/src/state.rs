//! The simulator's state file: the simulated cloud of a fleet file, kept between runs of
//! the CLI so that `plan`, `apply`, `status` and `destroy` see the same machines.
//!
//! - One process at a time: a lock on `<state>.lock` (advisory, `flock`) is held while
//!   a command runs; a second one is refused, naming the file. The lock goes with the
//!   process, however it ends.
//! - Written whole to a temporary file, flushed, then renamed over the old one: a
//!   process killed while saving leaves the previous state, never half a file.
//! - `apply` saves after every step, so a run killed with `kill -9` loses at most its
//!   last step, as if those calls had never reached the cloud; the fleet reconciler
//!   decides from what the cloud holds, so the next run carries on from there.
//! - Mode 0600: the simulated machines' user data and files are in it, secrets
//!   included, as a real cloud would hold them.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use machine_core::sim::{SimCloud, SimSnapshot};
use machine_core::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

/// The largest state file read: 512 MiB (ten thousand machines with their user data).
pub const MAX_STATE_BYTES: u64 = 512 * 1024 * 1024;

/// What the state file holds.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct StateDoc {
    /// Says what the file is, for someone who finds it.
    what: String,
    cloud: SimSnapshot,
}

const WHAT: &str = "the simulated cloud of the machines CLI; delete it to start over";

/// A simulated cloud loaded from its state file, locked for this process.
pub struct SimState {
    path: PathBuf,
    /// Held for the lock; released when dropped.
    _lock: File,
    cloud: SimCloud,
    delete_latency: Duration,
}

impl std::fmt::Debug for SimState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimState")
            .field("path", &self.path)
            .field("cloud", &self.cloud)
            .finish_non_exhaustive()
    }
}

impl SimState {
    /// Locks and loads the state at `path` (an empty cloud when there is no file yet;
    /// its folder is made). `delete_latency` is the provider's: machines deleted longer
    /// ago than that are gone and are not saved again.
    pub fn open(path: &Path, delete_latency: Duration) -> Result<SimState> {
        let io = |what: &str, e: std::io::Error| {
            Error::new(
                ErrorKind::Permanent,
                format!("{what} {}: {e}", path.display()),
            )
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| io("making the folder of", e))?;
        }
        let lock_path = lock_path(path);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io("opening the lock of", e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!(
                        "another machines command is using the simulator state {} (its lock {} is held); wait for it to end",
                        path.display(),
                        lock_path.display()
                    ),
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io("locking", e)),
        }
        let cloud = if path.exists() {
            let bytes = machine_core::read_user_file("provider.state", path, MAX_STATE_BYTES)?;
            let doc: StateDoc = serde_json::from_slice(&bytes).map_err(|e| {
                Error::invalid_spec(
                    "provider.state",
                    format!(
                        "{} is not a simulator state file ({e}); move it away to start over",
                        path.display()
                    ),
                )
            })?;
            SimCloud::restore(doc.cloud).map_err(|e| {
                Error::invalid_spec(
                    "provider.state",
                    format!("{}: {e}; move it away to start over", path.display()),
                )
            })?
        } else {
            SimCloud::new()
        };
        Ok(SimState {
            path: path.to_owned(),
            _lock: lock,
            cloud,
            delete_latency,
        })
    }

    /// The cloud.
    pub fn cloud(&self) -> &SimCloud {
        &self.cloud
    }

    /// The state file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the cloud to the state file: to a temporary file beside it, flushed to
    /// disk, then renamed over it.
    pub fn save(&self) -> Result<()> {
        self.cloud.forget_deleted(self.delete_latency);
        let doc = StateDoc {
            what: WHAT.to_owned(),
            cloud: self.cloud.snapshot(),
        };
        let bytes = serde_json::to_vec(&doc).map_err(|e| {
            Error::new(
                ErrorKind::Permanent,
                format!("serializing the simulator: {e}"),
            )
        })?;
        let tmp = self.path.with_extension("json.tmp");
        let io = |what: &str, e: std::io::Error| {
            Error::new(
                ErrorKind::Permanent,
                format!("{what} {}: {e}", self.path.display()),
            )
        };
        let mut options = OpenOptions::new();
        options.create(true).truncate(true).write(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let mut f = options
            .open(&tmp)
            .map_err(|e| io("writing the state beside", e))?;
        f.write_all(&bytes)
            .and_then(|()| f.sync_all())
            .map_err(|e| io("writing the state beside", e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| io("replacing", e))?;
        Ok(())
    }
}

fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_process_is_refused_while_the_first_holds_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s/fleet.sim-state.json");
        let first = SimState::open(&path, Duration::ZERO).unwrap();
        first.save().unwrap();
        let e = SimState::open(&path, Duration::ZERO).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Conflict);
        assert!(e.to_string().contains("another machines command"), "{e}");
        drop(first);
        let again = SimState::open(&path, Duration::ZERO).unwrap();
        assert_eq!(again.cloud().machine_count(), 0);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn a_file_that_is_not_a_state_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.json");
        std::fs::write(&path, "{\"what\": 1}").unwrap();
        let e = SimState::open(&path, Duration::ZERO).unwrap_err();
        assert_eq!(e.field(), Some("provider.state"));
        assert!(e.to_string().contains("x.json"), "{e}");
    }
}
