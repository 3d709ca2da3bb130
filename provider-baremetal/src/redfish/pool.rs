//! Claims on the pool's servers: one JSON file per claimed server in the claim
//! directory, created with `O_EXCL` so that of two controllers racing for one server
//! exactly one wins, and replaced atomically (write, then rename) when it changes.
//!
//! The file system calls (with an fsync per write) run on tokio's blocking pool, so a
//! slow or network-mounted claim directory never stalls the runtime's workers.

use std::io::Write;
use std::path::{Path, PathBuf};

use machine_core::{Error, Labels, MachineName, Result};
use serde::{Deserialize, Serialize};

/// What a claim file records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Claim {
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
}

/// The claim directory.
#[derive(Debug, Clone)]
pub(crate) struct Claims {
    dir: PathBuf,
}

fn io(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::transient(format!("{what} {}: {e}", path.display()))
}

impl Claims {
    pub fn new(dir: PathBuf) -> Self {
        Claims { dir }
    }

    fn path(&self, server: &str) -> PathBuf {
        self.dir.join(format!("{server}.json"))
    }

    /// Runs `f` with a copy of the claims on the blocking pool.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(Claims) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let claims = self.clone();
        tokio::task::spawn_blocking(move || f(claims))
            .await
            .map_err(|e| Error::permanent(format!("a claim file task failed: {e}")))?
    }

    /// The claim on `server`, if any.
    pub async fn read(&self, server: &str) -> Result<Option<Claim>> {
        let server = server.to_owned();
        self.blocking(move |c| c.read_now(&server)).await
    }

    /// The claims on `servers`, in their order, read in one trip to the blocking pool.
    pub async fn read_many(&self, servers: Vec<String>) -> Result<Vec<Option<Claim>>> {
        self.blocking(move |c| servers.iter().map(|s| c.read_now(s)).collect())
            .await
    }

    /// Claims `server` unless it is claimed already; `true` when this call claimed it.
    pub async fn try_claim(&self, server: &str, claim: &Claim) -> Result<bool> {
        let (server, claim) = (server.to_owned(), claim.clone());
        self.blocking(move |c| c.try_claim_now(&server, &claim))
            .await
    }

    /// Replaces `server`'s claim (after checking it is still `claim.owner`'s).
    pub async fn update(&self, server: &str, claim: &Claim) -> Result<()> {
        let (server, claim) = (server.to_owned(), claim.clone());
        self.blocking(move |c| c.update_now(&server, &claim)).await
    }

    /// Removes `server`'s claim; nothing when there is none.
    pub async fn release(&self, server: &str) -> Result<()> {
        let server = server.to_owned();
        self.blocking(move |c| c.release_now(&server)).await
    }

    fn read_now(&self, server: &str) -> Result<Option<Claim>> {
        let path = self.path(server);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                Error::permanent(format!("the claim {} is not readable: {e}", path.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("reading the claim", &path, e)),
        }
    }

    fn try_claim_now(&self, server: &str, claim: &Claim) -> Result<bool> {
        std::fs::create_dir_all(&self.dir).map_err(|e| io("creating", &self.dir, e))?;
        let path = self.path(server);
        let body = serde_json::to_vec(claim)
            .map_err(|e| Error::permanent(format!("encoding a claim: {e}")))?;
        // Written complete under a temporary name, then linked into place: link fails
        // when the name exists (atomic like O_EXCL), and no reader sees half a file.
        let tmp = self.temp_file(server, &body)?;
        let linked = std::fs::hard_link(&tmp, &path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(io("claiming", &path, e)),
        }
    }

    fn update_now(&self, server: &str, claim: &Claim) -> Result<()> {
        let path = self.path(server);
        let body = serde_json::to_vec(claim)
            .map_err(|e| Error::permanent(format!("encoding a claim: {e}")))?;
        let tmp = self.temp_file(server, &body)?;
        std::fs::rename(&tmp, &path).map_err(|e| io("updating the claim", &path, e))
    }

    fn release_now(&self, server: &str) -> Result<()> {
        let path = self.path(server);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("releasing the claim", &path, e)),
        }
    }

    fn temp_file(&self, server: &str, body: &[u8]) -> Result<PathBuf> {
        let tmp = self.dir.join(format!(
            ".{server}.{}.{:08x}.tmp",
            std::process::id(),
            fastrand::u32(..)
        ));
        let mut f = std::fs::File::create_new(&tmp).map_err(|e| io("writing", &tmp, e))?;
        f.write_all(body)
            .and_then(|()| f.sync_all())
            .map_err(|e| io("writing", &tmp, e))?;
        Ok(tmp)
    }
}
