//! The claim a host carries while it is some owner's machine: a small JSON file in the
//! claim directory, written atomically (hard link of a finished temporary file, which
//! fails when a claim exists) so two controllers racing for one host cannot both win.

use std::time::SystemTime;

use machine_core::{Error, ExecRequest, Labels, MachineName, Result, Transport};
use serde::{Deserialize, Serialize};

/// The claim format's version, so a future format can be told apart.
const CLAIM_VERSION: u32 = 1;

/// The exit status the claim script uses for "another claim is already there".
const TAKEN: i32 = 3;

/// The longest claim file read back; a real one is a few hundred bytes.
const MAX_CLAIM_BYTES: usize = 64 * 1024;

/// What a claimed host records about the machine it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Claim {
    pub version: u32,
    /// Drawn anew for every claim, so the provider ID of a released claim never names
    /// a later claim of the same host (a stale delete cannot release it). Empty in
    /// claims written before it existed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    pub owner: String,
    pub name: MachineName,
    #[serde(default)]
    pub labels: Labels,
    #[serde(with = "humantime_serde")]
    pub claimed_at: SystemTime,
}

impl Claim {
    pub fn new(owner: &str, name: &MachineName, labels: &Labels) -> Self {
        Claim {
            version: CLAIM_VERSION,
            id: format!("{:016x}", fastrand::u64(..)),
            owner: owner.to_owned(),
            name: name.clone(),
            labels: labels.clone(),
            claimed_at: SystemTime::now(),
        }
    }

    /// Whether this claim is `owner`'s machine `name`.
    pub fn is(&self, owner: &str, name: &MachineName) -> bool {
        self.owner == owner && &self.name == name
    }
}

/// Where on a host the claim lives and how to run commands there.
pub(crate) struct ClaimFile<'a> {
    pub dir: &'a str,
    pub path: &'a str,
    pub sudo: bool,
}

impl ClaimFile<'_> {
    fn request(&self, script: String) -> ExecRequest {
        let r = ExecRequest::new(script);
        if self.sudo { r.sudo() } else { r }
    }

    /// The host's claim, `None` when it is free.
    pub async fn read(&self, t: &dyn Transport, host: &str) -> Result<Option<Claim>> {
        let path = quote(self.path)?;
        // Exit 4 says "no claim" apart from a failing cat.
        let out = t
            .exec(&self.request(format!(
                "if [ -e {path} ]; then cat {path}; else exit 4; fi"
            )))
            .await?;
        if out.status == Some(4) {
            return Ok(None);
        }
        let out = out.check("read claim")?;
        if out.stdout.len() > MAX_CLAIM_BYTES {
            return Err(Error::permanent(format!(
                "host {host}: claim file {} is larger than {MAX_CLAIM_BYTES} bytes",
                self.path
            )));
        }
        serde_json::from_slice(&out.stdout).map(Some).map_err(|e| {
            Error::permanent(format!(
                "host {host}: claim file {} is not a claim ({e}); remove it by hand if the host is free",
                self.path
            ))
        })
    }

    /// Claims the host; `false` when another claim got there first.
    pub async fn write(&self, t: &dyn Transport, claim: &Claim) -> Result<bool> {
        let json = serde_json::to_string(claim)
            .map_err(|e| Error::permanent(format!("encoding a claim: {e}")))?;
        let (dir, path, json) = (quote(self.dir)?, quote(self.path)?, quote(&json)?);
        // ln refuses to replace an existing file, which makes the claim atomic; the
        // temporary file is complete before it becomes visible under the claim's name.
        let script = format!(
            "set -e; umask 022; mkdir -p {dir}; tmp={dir}/.claim.$$; printf '%s\\n' {json} > \"$tmp\"; \
             if ln \"$tmp\" {path} 2>/dev/null; then rm -f \"$tmp\"; else rm -f \"$tmp\"; exit {TAKEN}; fi"
        );
        let out = t.exec(&self.request(script)).await?;
        if out.status == Some(TAKEN) {
            return Ok(false);
        }
        out.check("write claim")?;
        Ok(true)
    }

    /// Removes the host's claim.
    pub async fn remove(&self, t: &dyn Transport) -> Result<()> {
        let path = quote(self.path)?;
        t.exec(&self.request(format!("rm -f {path}")))
            .await?
            .check("release claim")?;
        Ok(())
    }
}

fn quote(s: &str) -> Result<String> {
    shlex::try_quote(s)
        .map(|q| q.into_owned())
        .map_err(|_| Error::invalid_spec("claim", format!("{s:?} cannot be quoted for sh")))
}
