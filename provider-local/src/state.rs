//! What the provider keeps about a machine, kept with the machine: `state.json` in the
//! machine's own directory, and one lease file per address. A new provider instance
//! reads the same files, which is how it adopts what an earlier one made.

use std::fs;
use std::io::Write;
use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use machine_core::{ContentEncoding, Error, Labels, MachineName, Result, UserData, UserDataFormat};
use serde::{Deserialize, Serialize};

use crate::config::Subnet;
use crate::errors;

/// The state file's name inside a machine's directory.
pub(crate) const STATE_FILE: &str = "state.json";
/// The user data as given, beside the state (mode 0600: it may hold secrets).
pub(crate) const USER_DATA_FILE: &str = "user-data";

/// A process of this host, named by PID and start time so that a reused PID is never
/// mistaken for the machine's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessRef {
    /// The process ID in the host's PID namespace.
    pub pid: i32,
    /// Its start time in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
    pub start_ticks: u64,
}

/// Everything the provider records about one machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct MachineRecord {
    /// The caller's name, also the machine's hostname.
    pub name: MachineName,
    /// The owner that made it.
    pub owner: String,
    /// The spec's labels.
    #[serde(default)]
    pub labels: Labels,
    /// cloud-init's instance ID: new for every machine, even one of a reused name.
    pub instance_id: String,
    /// The bridge the machine is attached to.
    pub bridge: String,
    /// The machine's slot in the subnet: its address's offset, which also names its
    /// network namespace and host-side interface.
    pub slot: u32,
    /// The machine's address on the bridge.
    pub address: Ipv4Addr,
    /// The subnet's prefix length.
    pub prefix: u8,
    /// The bridge's address, the machine's default route.
    pub gateway: Ipv4Addr,
    /// The user SSH logs in as.
    pub ssh_user: String,
    /// Format and encoding of the user data in the machine's `user-data` file, when there is any.
    #[serde(default)]
    pub user_data: Option<(UserDataFormat, ContentEncoding)>,
    /// Whether the machine should be running (false after a power stop).
    pub powered: bool,
    /// Set when deletion has begun.
    #[serde(default)]
    pub deleting: bool,
    /// The process that boots and then holds the machine, once started.
    #[serde(default)]
    pub boot: Option<ProcessRef>,
    /// When the machine was created.
    #[serde(with = "humantime_serde")]
    pub created: SystemTime,
}

impl MachineRecord {
    /// Which machine of its name this is: the last part of its instance ID (which is
    /// `<name>-<8 hex digits>`, drawn anew for every machine made).
    pub fn generation(&self) -> &str {
        self.instance_id.rsplit('-').next().unwrap_or_default()
    }

    /// The machine's network namespace, `<bridge>-<slot>` (in /run/netns).
    pub fn netns(&self) -> String {
        format!("{}-{}", self.bridge, self.slot)
    }

    /// The host side of the machine's veth pair, `<bridge>h<slot>`.
    pub fn host_veth(&self) -> String {
        format!("{}h{}", self.bridge, self.slot)
    }
}

/// Reads the record in `dir`; `Ok(None)` when the machine has none (gone, or its
/// directory is still being made).
pub(crate) fn read(dir: &Path) -> Result<Option<MachineRecord>> {
    let path = dir.join(STATE_FILE);
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| errors::corrupt_state(&path, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(errors::io("reading", &path, e)),
    }
}

/// Writes the record atomically (a temporary file renamed over the old one), so a
/// reader never sees half a record.
pub(crate) fn write(dir: &Path, record: &MachineRecord) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(record)
        .map_err(|e| Error::permanent(format!("cannot encode machine state: {e}")))?;
    write_atomic(&dir.join(STATE_FILE), &bytes, 0o644)
}

/// Writes `bytes` to `path` atomically with `mode`.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp{}", fastrand::u32(..)));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|e| errors::io("creating", &tmp, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| errors::io("writing", &tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| errors::io("renaming", &tmp, e))
}

/// Stores the user data beside the record.
pub(crate) fn write_user_data(dir: &Path, ud: &UserData) -> Result<()> {
    write_atomic(&dir.join(USER_DATA_FILE), &ud.bytes, 0o600)
}

/// The user data the machine was created with.
pub(crate) fn read_user_data(dir: &Path, record: &MachineRecord) -> Result<Option<UserData>> {
    let Some((format, encoding)) = record.user_data else {
        return Ok(None);
    };
    let path = dir.join(USER_DATA_FILE);
    let bytes = fs::read(&path).map_err(|e| errors::io("reading", &path, e))?;
    Ok(Some(UserData {
        format,
        encoding,
        bytes,
    }))
}

/// How long an operation waits for another one on the same machine to finish: far
/// longer than any step holds the lock (a halt gives up after 10 s).
const LOCK_WAIT: Duration = Duration::from_secs(60);

/// The lock of one machine name, held by whatever changes the machine (create, delete,
/// power) from its first look at the record to its last write: an `flock` on
/// `<owner dir>/.locks/<name>`. The kernel drops it when its holder dies, so a killed
/// controller never leaves a machine locked, and whoever takes it next knows no one
/// else is half-way through that machine: what it finds is what a dead operation left,
/// to be finished.
#[derive(Debug)]
pub(crate) struct NameLock {
    file: fs::File,
    path: PathBuf,
}

impl NameLock {
    /// Takes the lock at `path`, waiting for its holder up to [`LOCK_WAIT`] (then a
    /// transient error: the machine is busy).
    pub(crate) fn acquire(path: &Path) -> Result<NameLock> {
        use std::os::unix::fs::OpenOptionsExt;
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| errors::io("creating", parent, e))?;
        }
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            let file = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(path)
                .map_err(|e| errors::io("opening", path, e))?;
            loop {
                match file.try_lock() {
                    Ok(()) => break,
                    Err(fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(fs::TryLockError::WouldBlock) => {
                        return Err(Error::transient(format!(
                            "machine lock {} is held by another operation for over {LOCK_WAIT:?}",
                            path.display()
                        )));
                    }
                    Err(fs::TryLockError::Error(e)) => {
                        return Err(errors::io("locking", path, e));
                    }
                }
            }
            // A delete that finished while this waited removed the file it locked: the
            // lock of the name is then a new file, to be taken afresh.
            let held = file
                .metadata()
                .map_err(|e| errors::io("reading", path, e))?;
            match fs::metadata(path) {
                Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => {
                    return Ok(NameLock {
                        file,
                        path: path.to_owned(),
                    });
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(errors::io("reading", path, e)),
            }
        }
    }

    /// Removes the lock file, still holding it: for the end of a delete, so no file is
    /// left per name ever used. Anyone waiting on it takes the name's next lock file.
    pub(crate) fn remove(&self) -> Result<()> {
        gone_or_missing(&self.path, fs::remove_file(&self.path))
    }
}

impl Drop for NameLock {
    fn drop(&mut self) {
        // Closing the file would drop the lock too; saying it keeps the intent plain.
        let _ = self.file.unlock();
    }
}

/// Removes a machine's directory, its record last: a delete killed half-way leaves a
/// record that says `deleting`, never a directory that looks like no machine while
/// parts of one remain.
pub(crate) fn remove_machine_dir(dir: &Path) -> Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(errors::io("listing", dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| errors::io("listing", dir, e))?;
        if entry.file_name() == STATE_FILE {
            continue;
        }
        let path = entry.path();
        let gone = if entry.file_type().is_ok_and(|t| t.is_dir()) {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        gone_or_missing(&path, gone)?;
    }
    gone_or_missing(&dir.join(STATE_FILE), fs::remove_file(dir.join(STATE_FILE)))?;
    gone_or_missing(dir, fs::remove_dir(dir))
}

/// A removal's outcome, where "already gone" is success.
fn gone_or_missing(path: &Path, outcome: std::io::Result<()>) -> Result<()> {
    match outcome {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(errors::io("removing", path, e)),
    }
}

/// Address leases: one file per address in `<run dir>/leases`, made with
/// `O_EXCL` so two provider instances never hand out one address twice.
#[derive(Debug, Clone)]
pub(crate) struct Leases {
    dir: PathBuf,
}

impl Leases {
    pub(crate) fn new(run_dir: &Path) -> Self {
        Leases {
            dir: run_dir.join("leases"),
        }
    }

    /// Takes the first free slot of `subnet` for `holder`; `None` when all are taken.
    pub(crate) fn take(&self, subnet: &Subnet, holder: &str) -> Result<Option<u32>> {
        fs::create_dir_all(&self.dir).map_err(|e| errors::io("creating", &self.dir, e))?;
        for slot in 1..=subnet.slots() {
            let Some(addr) = subnet.machine_address(slot) else {
                break;
            };
            let path = self.dir.join(addr.to_string());
            match fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    f.write_all(holder.as_bytes())
                        .map_err(|e| errors::io("writing", &path, e))?;
                    return Ok(Some(slot));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(errors::io("creating", &path, e)),
            }
        }
        Ok(None)
    }

    /// Gives back every address `holder` holds: for a create that died between taking
    /// its lease and recording it.
    pub(crate) fn release_all_of(&self, holder: &str) -> Result<()> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return Ok(());
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if fs::read_to_string(&path).is_ok_and(|h| h == holder) {
                fs::remove_file(&path).map_err(|e| errors::io("removing", &path, e))?;
            }
        }
        Ok(())
    }

    /// Gives `address` back, if `holder` holds it.
    pub(crate) fn release(&self, address: Ipv4Addr, holder: &str) -> Result<()> {
        let path = self.dir.join(address.to_string());
        match fs::read_to_string(&path) {
            Ok(h) if h == holder => {
                fs::remove_file(&path).map_err(|e| errors::io("removing", &path, e))
            }
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(errors::io("reading", &path, e)),
        }
    }
}
