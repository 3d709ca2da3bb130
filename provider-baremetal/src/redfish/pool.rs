//! The claim directory every controller of a pool shares: who holds which server, how far
//! its create got, who is creating which name right now, and when each server was last
//! released.
//!
//! - `<server>.json`: the claim on a server, linked into place (`link` fails when the
//!   name exists, atomically like `O_EXCL`) so that of two controllers racing for one
//!   server exactly one wins; replaced atomically (write, then rename) as the machine
//!   moves on. It records the machine (owner, name, labels), the claim's random id
//!   (which the machine's provider ID and cloud-init instance-id carry, so that nothing
//!   of a released machine names the next one on the server) and its progress: whether
//!   its create got as far as the power-on, when power-on was asked, where the seed is,
//!   whether its bootstrap finished, whether it is being deleted.
//! - `<name>@<owner>.lease`: the create lease of a name, linked into place the same way
//!   before any server is claimed for it, so that one controller at a time claims a
//!   server for a name: replicas creating one name all get the one server its holder
//!   claimed. Its holder touches it every [`HEARTBEAT`]; a lease untouched for
//!   [`LEASE_TTL`] belongs to a dead process (kill -9) and is taken over. A holder whose
//!   create future is dropped removes it at once. Staleness is the file's modification
//!   time against this host's clock: controllers sharing the directory need clocks
//!   within a few seconds of each other (NTP).
//! - `.<server>.released`: touched when a server is released. Free servers are offered
//!   least recently released first, so a name deleted and created again lands on
//!   another server (another provider ID) while the pool has one, and a server just
//!   forced off gets time to settle.
//!
//! Every file operation is synchronous: on a multi-threaded runtime it runs in
//! [`tokio::task::block_in_place`] (the worker hands its other tasks on, so a slow or
//! network-mounted directory never stalls them), else inline. None is an await point, so
//! none can land after the future that started it was dropped: a dropped create leaves
//! exactly what a killed process would.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use machine_core::{Error, ErrorKind, Labels, MachineName, Result};
use serde::{Deserialize, Serialize};

/// How long a create lease lives without a heartbeat.
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(10);
/// How often the holder of a lease touches it.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(2);

/// The claim format's version: 1 since a machine's provider ID names its claim. Claims
/// without one (0) were written before; their machines keep the IDs they were given,
/// which name only the server.
pub(crate) const CLAIM_VERSION: u32 = 1;

/// What a claim file records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Claim {
    /// The format's version ([`CLAIM_VERSION`]; 0 in claims written before it existed).
    #[serde(default)]
    pub version: u32,
    /// The claiming provider's owner.
    pub owner: String,
    /// The machine the server is.
    pub name: MachineName,
    /// The machine's labels.
    #[serde(default)]
    pub labels: Labels,
    /// Whether the machine should be powered on (set by create and start, cleared by
    /// stop): tells a server still booting (`Provisioning`) from one stopped on purpose.
    #[serde(default)]
    pub powered: bool,
    /// A random id of this claim, to tell it from a later claim of the same server; part
    /// of the machine's provider ID and of its cloud-init instance-id (from version 1).
    #[serde(default)]
    pub id: String,
    /// The SSH user the spec named, for `access.ssh`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_user: Option<String>,
    /// The create that made the claim has not reached the power-on yet: the claim is
    /// finished by the next create of the name (or released when abandoned).
    #[serde(default)]
    pub creating: bool,
    /// When power-on (or a restart) was last asked, in Unix seconds; recorded before the
    /// request is sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_on_asked: Option<u64>,
    /// How often power-on was asked since the machine was last seen on.
    #[serde(default)]
    pub power_on_asks: u32,
    /// The BMC showed the system on since power-on was last asked.
    #[serde(default)]
    pub power_on_seen: bool,
    /// The resource path of the virtual CD holding the seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cd: Option<String>,
    /// The composer said the machine's bootstrap finished: its seed is withdrawn and
    /// never published again.
    #[serde(default)]
    pub bootstrap_finished: bool,
    /// A delete started: the machine only goes from here.
    #[serde(default)]
    pub deleting: bool,
}

impl Claim {
    /// Whether this claim was written before provider IDs named claims (its machine's
    /// ID names only the server, its instance-id is the machine's name).
    pub fn is_legacy(&self) -> bool {
        self.version == 0
    }

    /// A new claim of `owner` for machine `name`, its create not yet at the power-on.
    pub fn new(owner: &str, name: MachineName, labels: Labels) -> Self {
        Claim {
            version: CLAIM_VERSION,
            owner: owner.to_owned(),
            name,
            labels,
            powered: true,
            id: format!("{:016x}", fastrand::u64(..)),
            ssh_user: None,
            creating: true,
            power_on_asked: None,
            power_on_asks: 0,
            power_on_seen: false,
            cd: None,
            bootstrap_finished: false,
            deleting: false,
        }
    }
}

/// Now, in Unix seconds.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Runs file-system work without an await point, off the runtime's workers where it
/// can (see the module's doc).
fn sync<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

fn io(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::transient(format!("{what} {}: {e}", path.display()))
}

/// The claim directory.
#[derive(Debug, Clone)]
pub(crate) struct Claims {
    dir: PathBuf,
}

impl Claims {
    pub fn new(dir: PathBuf) -> Self {
        Claims { dir }
    }

    fn path(&self, server: &str) -> PathBuf {
        self.dir.join(format!("{server}.json"))
    }

    fn marker(&self, server: &str) -> PathBuf {
        self.dir.join(format!(".{server}.released"))
    }

    fn lease_path(&self, name: &MachineName, owner: &str) -> PathBuf {
        // '@' is in neither a DNS label nor an owner: the file names cannot collide.
        self.dir.join(format!("{name}@{owner}.lease"))
    }

    /// The claim on `server`, if any.
    pub fn read(&self, server: &str) -> Result<Option<Claim>> {
        sync(|| self.read_now(server))
    }

    /// The claims on `servers`, in their order: one directory listing, then a read of
    /// each claimed server's file only.
    pub fn scan(&self, servers: &[String]) -> Result<Vec<Option<Claim>>> {
        sync(|| {
            let names: HashSet<String> = match std::fs::read_dir(&self.dir) {
                Ok(entries) => entries
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashSet::new(),
                Err(e) => return Err(io("listing the claims in", &self.dir, e)),
            };
            servers
                .iter()
                .map(|s| {
                    if names.contains(&format!("{s}.json")) {
                        self.read_now(s)
                    } else {
                        Ok(None)
                    }
                })
                .collect()
        })
    }

    /// Claims `server` unless it is claimed already; `true` when this call claimed it.
    pub fn try_claim(&self, server: &str, claim: &Claim) -> Result<bool> {
        sync(|| {
            std::fs::create_dir_all(&self.dir).map_err(|e| io("creating", &self.dir, e))?;
            let tmp = self.temp_file(server, &encode(claim)?, true)?;
            link_into_place(&tmp, &self.path(server))
        })
    }

    /// Replaces `server`'s claim with `claim`, when the file there is still the same
    /// claim (same id); a conflict error when it is not.
    pub fn update(&self, server: &str, claim: &Claim) -> Result<()> {
        sync(|| {
            let path = self.path(server);
            match self.read_now(server)? {
                Some(c) if c.id == claim.id => {}
                _ => {
                    return Err(Error::new(
                        ErrorKind::Conflict,
                        format!(
                            "the claim on server {server} changed under machine {}",
                            claim.name
                        ),
                    ));
                }
            }
            let tmp = self.temp_file(server, &encode(claim)?, true)?;
            std::fs::rename(&tmp, &path).map_err(|e| io("updating the claim", &path, e))
        })
    }

    /// Releases `server` when its claim is still `claim_id` (nothing when it is not, or
    /// there is none), after touching its release marker.
    ///
    /// The file is renamed aside before it is checked, so that a claim someone made
    /// between the check and the removal is never removed: it would be put back.
    pub fn release(&self, server: &str, claim_id: &str) -> Result<()> {
        sync(|| {
            let path = self.path(server);
            let aside = self.dir.join(format!(
                ".{server}.{}.{:08x}.released-claim",
                std::process::id(),
                fastrand::u32(..)
            ));
            match std::fs::rename(&path, &aside) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(io("releasing the claim", &path, e)),
            }
            let ours = std::fs::read(&aside)
                .ok()
                .and_then(|b| serde_json::from_slice::<Claim>(&b).ok())
                .is_some_and(|c| c.id == claim_id);
            if ours {
                touch(&self.marker(server), true);
            } else {
                // Someone else's newer claim: back where it was.
                if let Err(e) = std::fs::hard_link(&aside, &path) {
                    tracing::error!(server, error = %e, "could not put back a claim released by mistake");
                }
            }
            let _ = std::fs::remove_file(&aside);
            Ok(())
        })
    }

    /// When `server` was last released (never: `None`).
    pub fn released_at(&self, server: &str) -> Option<SystemTime> {
        std::fs::metadata(self.marker(server))
            .and_then(|m| m.modified())
            .ok()
    }

    /// `servers` (an index and a name each) ordered least recently released first,
    /// those never released first of all, in their given order.
    pub fn by_release(&self, servers: &[(usize, &str)]) -> Vec<usize> {
        sync(|| {
            let mut keyed: Vec<_> = servers
                .iter()
                .map(|&(i, s)| (self.released_at(s), i))
                .collect();
            keyed.sort();
            keyed.into_iter().map(|(_, i)| i).collect()
        })
    }

    /// Takes the create lease of `name` (of `owner`) unless a live holder has it; a
    /// lease untouched for [`LEASE_TTL`] is taken over.
    pub fn try_lease(&self, name: &MachineName, owner: &str) -> Result<Option<Lease>> {
        let path = self.lease_path(name, owner);
        let holder = format!("{:016x}", fastrand::u64(..));
        let taken = sync(|| -> Result<bool> {
            std::fs::create_dir_all(&self.dir).map_err(|e| io("creating", &self.dir, e))?;
            for _ in 0..2 {
                let tmp = self.temp_file("lease", holder.as_bytes(), false)?;
                if link_into_place(&tmp, &path)? {
                    return Ok(true);
                }
                if !stale(&path) {
                    return Ok(false);
                }
                // Its holder is gone: take the lease over, unless it was renewed (or
                // taken over by someone else) between the look and the rename.
                let aside = self.dir.join(format!(
                    ".{name}@{owner}.{:08x}.stale-lease",
                    fastrand::u32(..)
                ));
                if std::fs::rename(&path, &aside).is_err() {
                    continue;
                }
                if !stale(&aside) {
                    let _ = std::fs::hard_link(&aside, &path);
                    let _ = std::fs::remove_file(&aside);
                    return Ok(false);
                }
                tracing::warn!(machine = %name, owner, "taking over the create lease of a controller that stopped");
                let _ = std::fs::remove_file(&aside);
            }
            Ok(false)
        })?;
        if !taken {
            return Ok(None);
        }
        let heartbeat = {
            let (path, holder) = (path.clone(), holder.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(HEARTBEAT).await;
                    if !holds(&path, &holder) {
                        return;
                    }
                    touch(&path, false);
                }
            })
        };
        Ok(Some(Lease {
            path,
            holder,
            heartbeat,
        }))
    }

    /// Whether a live controller holds `name`'s create lease.
    pub fn lease_live(&self, name: &MachineName, owner: &str) -> bool {
        let path = self.lease_path(name, owner);
        sync(|| path.exists() && !stale(&path))
    }

    fn read_now(&self, server: &str) -> Result<Option<Claim>> {
        let path = self.path(server);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                // A claim written by this crate is never half-written (rename), so an
                // unreadable one is someone else's doing.
                Error::permanent(format!("the claim {} is not readable: {e}", path.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("reading the claim", &path, e)),
        }
    }

    /// A complete file under a temporary name, synced when `durable`.
    fn temp_file(&self, stem: &str, body: &[u8], durable: bool) -> Result<PathBuf> {
        let tmp = self.dir.join(format!(
            ".{stem}.{}.{:08x}.tmp",
            std::process::id(),
            fastrand::u32(..)
        ));
        let mut f = std::fs::File::create_new(&tmp).map_err(|e| io("writing", &tmp, e))?;
        f.write_all(body)
            .and_then(|()| if durable { f.sync_all() } else { Ok(()) })
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                io("writing", &tmp, e)
            })?;
        Ok(tmp)
    }
}

fn encode(claim: &Claim) -> Result<Vec<u8>> {
    serde_json::to_vec(claim).map_err(|e| Error::permanent(format!("encoding a claim: {e}")))
}

/// Links the complete file `tmp` to `path` unless `path` exists, then removes `tmp`:
/// no reader ever sees half a file. `true` when linked.
fn link_into_place(tmp: &Path, path: &Path) -> Result<bool> {
    let linked = std::fs::hard_link(tmp, path);
    let _ = std::fs::remove_file(tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(io("claiming", path, e)),
    }
}

/// Whether the file at `path` was last touched more than [`LEASE_TTL`] ago (a missing
/// file is not stale: there is nothing to take over).
fn stale(path: &Path) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|age| age > LEASE_TTL)
}

/// Sets `path`'s modification time to now, creating the file when `create`.
fn touch(path: &Path, create: bool) {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(create)
        .truncate(false)
        .open(path);
    if let Ok(f) = file {
        let _ = f.set_modified(SystemTime::now());
    }
}

fn holds(path: &Path, holder: &str) -> bool {
    std::fs::read(path).is_ok_and(|b| b == holder.as_bytes())
}

/// A held create lease; dropping it (the create finished, failed, or its future was
/// dropped) stops the heartbeat and removes the lease if it is still this holder's.
#[derive(Debug)]
pub(crate) struct Lease {
    path: PathBuf,
    holder: String,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.heartbeat.abort();
        if holds(&self.path, &self.holder) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str) -> Claim {
        Claim::new("o", MachineName::new(name).unwrap(), Labels::new())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_is_claimed_once_and_released_only_by_its_claim() {
        let dir = tempfile::tempdir().unwrap();
        let c = Claims::new(dir.path().join("claims"));
        let (a, b) = (claim("a"), claim("b"));
        assert!(c.try_claim("s0", &a).unwrap());
        assert!(!c.try_claim("s0", &b).unwrap());
        // A release by an older claim's id leaves the new claim alone.
        c.release("s0", &b.id).unwrap();
        assert_eq!(c.read("s0").unwrap().unwrap().id, a.id);
        assert!(c.released_at("s0").is_none());
        let mut moved = a.clone();
        moved.creating = false;
        c.update("s0", &moved).unwrap();
        assert_eq!(c.update("s0", &b).unwrap_err().kind(), ErrorKind::Conflict);
        let scanned = c.scan(&["s0".into(), "s1".into()]).unwrap();
        assert_eq!(scanned, vec![Some(moved), None]);
        c.release("s0", &a.id).unwrap();
        assert_eq!(c.read("s0").unwrap(), None);
        assert!(c.released_at("s0").is_some());
        // No temporary or aside file is left behind.
        let left: Vec<_> = std::fs::read_dir(dir.path().join("claims"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, vec![".s0.released".to_owned()]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_has_one_holder_until_dropped_or_stale() {
        let dir = tempfile::tempdir().unwrap();
        let c = Claims::new(dir.path().to_owned());
        let name = MachineName::new("m").unwrap();
        let lease = c.try_lease(&name, "o").unwrap().expect("free");
        assert!(c.lease_live(&name, "o"));
        assert!(c.try_lease(&name, "o").unwrap().is_none());
        // Another owner's lease of the same name is another lease.
        assert!(c.try_lease(&name, "p").unwrap().is_some());
        drop(lease);
        assert!(!c.lease_live(&name, "o"));
        let lease = c.try_lease(&name, "o").unwrap().expect("free again");
        // A holder that stopped touching it (killed) loses it once stale.
        lease.heartbeat.abort();
        let path = c.lease_path(&name, "o");
        let old = SystemTime::now() - LEASE_TTL - Duration::from_secs(1);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert!(!c.lease_live(&name, "o"));
        let taken = c.try_lease(&name, "o").unwrap().expect("taken over");
        // The old holder's drop leaves the new holder's lease alone.
        drop(lease);
        assert!(c.lease_live(&name, "o"));
        drop(taken);
        assert!(!path.exists());
    }
}
