//! A simulated cloud as plain data, so that one process can hand it to the next: the
//! `machines` CLI keeps one in a state file, and its `plan`, `apply`, `status` and
//! `destroy` runs see the same machines.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::host::{HostCell, SimFile, SimHost};
use super::{SimCloud, SimMachine, State};
use crate::error::{Error, Result};
use crate::machine::{Labels, ProviderId};
use crate::name::MachineName;
use crate::user_data::{ContentEncoding, UserData, UserDataFormat};

/// The format of [`SimSnapshot`]; a snapshot of another version is refused.
const VERSION: u32 = 1;

/// Everything a [`SimCloud`] holds, as plain data (serde): each machine's name, owner,
/// ID, labels, size, user data, files and commands, and where it stands in its boot or
/// deletion. Made by [`SimCloud::snapshot`], turned back into a cloud by
/// [`SimCloud::restore`].
///
/// Times are wall-clock (Unix milliseconds): a machine still booting when the snapshot
/// was taken has booted when it is restored later, as a real machine would have. The
/// test hooks ([`SimCloud::on_exec`] answers, injected faults) are not kept.
///
/// User data and files may hold secrets, as a real cloud's would: Debug shows only
/// counts, and whoever stores a snapshot keeps it private.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimSnapshot {
    version: u32,
    seq: u64,
    api_calls: u64,
    machines: Vec<SavedMachine>,
}

impl fmt::Debug for SimSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimSnapshot")
            .field("machines", &self.machines.len())
            .field("api_calls", &self.api_calls)
            .finish_non_exhaustive()
    }
}

impl SimSnapshot {
    /// How many machines it holds, in any phase.
    pub fn machine_count(&self) -> usize {
        self.machines.len()
    }
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SavedMachine {
    name: MachineName,
    owner: String,
    id: ProviderId,
    labels: Labels,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    size: Option<String>,
    ssh_user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    user_data: Option<SavedUserData>,
    /// When it boots (or booted), Unix milliseconds.
    boot_at: u64,
    boot_fails: bool,
    booted: bool,
    stopped: bool,
    /// When its deletion started, Unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delete_at: Option<u64>,
    reachable: bool,
    seq: u64,
    bootstrap_finished: usize,
    files: BTreeMap<String, SavedFile>,
    commands: Vec<String>,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SavedUserData {
    format: UserDataFormat,
    encoding: ContentEncoding,
    /// Base64.
    bytes: String,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SavedFile {
    /// Base64.
    content: String,
    mode: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(field: &str, text: &str) -> Result<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| Error::invalid_spec(field, format!("is not base64: {e}")))
}

/// Converts between tokio's clock, which the simulator runs on, and the wall clock.
struct Clocks {
    instant: Instant,
    wall: SystemTime,
}

impl Clocks {
    fn now() -> Self {
        Clocks {
            instant: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    fn to_wall(&self, at: Instant) -> u64 {
        let wall = if at >= self.instant {
            self.wall.checked_add(at - self.instant)
        } else {
            self.wall.checked_sub(self.instant - at)
        };
        wall.and_then(|w| w.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    /// A time before this process's clock could count is taken as now: it has passed.
    fn to_instant(&self, ms: u64) -> Instant {
        let wall = UNIX_EPOCH + Duration::from_millis(ms);
        match wall.duration_since(self.wall) {
            Ok(ahead) => self.instant.checked_add(ahead).unwrap_or(self.instant),
            Err(behind) => self
                .instant
                .checked_sub(behind.duration())
                .unwrap_or(self.instant),
        }
    }
}

impl SimCloud {
    /// Everything this cloud holds, as plain data; see [`SimSnapshot`].
    pub fn snapshot(&self) -> SimSnapshot {
        let clocks = Clocks::now();
        let st = self.lock();
        let mut machines: Vec<SavedMachine> = st
            .machines
            .values()
            .map(|m| {
                let host = m.cell.lock();
                SavedMachine {
                    name: m.name.clone(),
                    owner: m.owner.clone(),
                    id: m.id.clone(),
                    labels: m.labels.clone(),
                    size: m.size.clone(),
                    ssh_user: m.ssh_user.clone(),
                    user_data: m.user_data.as_ref().map(|ud| SavedUserData {
                        format: ud.format,
                        encoding: ud.encoding,
                        bytes: b64(&ud.bytes),
                    }),
                    boot_at: clocks.to_wall(m.boot_at),
                    boot_fails: m.boot_fails,
                    booted: m.booted,
                    stopped: m.stopped,
                    delete_at: m.delete_at.map(|at| clocks.to_wall(at)),
                    reachable: m.cell.reachable.load(Ordering::SeqCst),
                    seq: m.seq,
                    bootstrap_finished: m.bootstrap_finished,
                    files: host
                        .files
                        .iter()
                        .map(|(path, f)| {
                            (
                                path.clone(),
                                SavedFile {
                                    content: b64(&f.content),
                                    mode: f.mode,
                                    owner: f.owner.clone(),
                                },
                            )
                        })
                        .collect(),
                    commands: host.commands.clone(),
                }
            })
            .collect();
        // The same cloud gives the same document.
        machines.sort_by_key(|m| m.seq);
        SimSnapshot {
            version: VERSION,
            seq: st.seq,
            api_calls: st.api_calls,
            machines,
        }
    }

    /// A cloud holding what `snapshot` held. Refuses a snapshot of another format
    /// version, two machines with one ID, and undecodable contents, naming the field.
    pub fn restore(snapshot: SimSnapshot) -> Result<SimCloud> {
        if snapshot.version != VERSION {
            return Err(Error::invalid_spec(
                "version",
                format!(
                    "simulator snapshot version {} is not the supported {VERSION}",
                    snapshot.version
                ),
            ));
        }
        let clocks = Clocks::now();
        let mut state = State {
            seq: snapshot.seq,
            api_calls: snapshot.api_calls,
            machines: HashMap::with_capacity(snapshot.machines.len()),
            by_name: HashMap::with_capacity(snapshot.machines.len()),
            ..State::default()
        };
        for (i, saved) in snapshot.machines.into_iter().enumerate() {
            let field = |f: &str| format!("machines[{i}].{f}");
            let user_data = match saved.user_data {
                None => None,
                Some(ud) => Some(UserData {
                    format: ud.format,
                    encoding: ud.encoding,
                    bytes: unb64(&field("userData.bytes"), &ud.bytes)?,
                }),
            };
            let mut files = BTreeMap::new();
            for (path, f) in saved.files {
                let content = unb64(&field("files.content"), &f.content)?;
                files.insert(
                    path,
                    SimFile {
                        content,
                        mode: f.mode,
                        owner: f.owner,
                    },
                );
            }
            let cell = Arc::new(HostCell {
                host: std::sync::Mutex::new(SimHost {
                    files,
                    commands: saved.commands,
                }),
                reachable: std::sync::atomic::AtomicBool::new(saved.reachable),
            });
            let deleting = saved.delete_at.is_some();
            let m = SimMachine {
                name: saved.name,
                owner: saved.owner,
                id: saved.id,
                labels: saved.labels,
                size: saved.size,
                ssh_user: saved.ssh_user,
                user_data,
                boot_at: clocks.to_instant(saved.boot_at),
                boot_fails: saved.boot_fails,
                booted: saved.booted,
                stopped: saved.stopped,
                delete_at: saved.delete_at.map(|ms| clocks.to_instant(ms)),
                cell,
                seq: saved.seq,
                bootstrap_finished: saved.bootstrap_finished,
            };
            // The name leads to the machine holding it; a deleted one only when no
            // other machine holds the name (its successor wins).
            let key = (m.owner.clone(), m.name.clone());
            let replaces = match state.by_name.get(&key) {
                None => true,
                Some(other) => !deleting && state.machines[other].delete_at.is_some(),
            };
            if replaces {
                state.by_name.insert(key, m.id.clone());
            }
            if state.machines.insert(m.id.clone(), m).is_some() {
                return Err(Error::invalid_spec(
                    field("id"),
                    "two machines of the snapshot have this ID",
                ));
            }
        }
        state.seq = state
            .seq
            .max(state.machines.values().map(|m| m.seq).max().unwrap_or(0));
        Ok(SimCloud {
            state: Arc::new(std::sync::Mutex::new(state)),
        })
    }

    /// Forgets machines whose deletion started more than `older_than` ago (gone for a
    /// provider whose delete latency is at most that), so that a cloud saved again and
    /// again does not keep every machine it ever had. Returns how many it forgot.
    pub fn forget_deleted(&self, older_than: Duration) -> usize {
        let now = Instant::now();
        let mut st = self.lock();
        let gone: Vec<ProviderId> = st
            .machines
            .values()
            .filter(|m| {
                m.delete_at
                    .is_some_and(|at| now.saturating_duration_since(at) > older_than)
            })
            .map(|m| m.id.clone())
            .collect();
        for id in &gone {
            if let Some(m) = st.machines.remove(id) {
                let key = (m.owner.clone(), m.name.clone());
                if st.by_name.get(&key) == Some(id) {
                    st.by_name.remove(&key);
                }
            }
        }
        gone.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MachineProvisioner;
    use crate::machine::Phase;
    use crate::sim::{SimConfig, SimConnector, SimProvider};
    use crate::spec::MachineSpec;
    use crate::transport::{Connector, FileUpload};

    fn spec(name: &str) -> MachineSpec {
        MachineSpec::new(MachineName::new(name).unwrap()).with_label("team", "a")
    }

    #[tokio::test]
    async fn a_restored_cloud_has_the_same_machines_files_and_phases() {
        let cloud = SimCloud::new();
        let config = SimConfig::default().with_delete_latency(Duration::from_secs(3600));
        let p = SimProvider::new(cloud.clone(), config.clone()).unwrap();
        let ud = UserData::new(UserDataFormat::CloudConfig, "#cloud-config\n{}\n");
        let a = p.create(&spec("a"), Some(&ud)).await.unwrap();
        let b = p.create(&spec("b"), None).await.unwrap();
        let t = SimConnector::new(cloud.clone())
            .connect(&p.get(&a.provider_id).await.unwrap())
            .await
            .unwrap();
        t.upload(&FileUpload::new("/etc/app", b"\x00\xffbinary".to_vec()).mode(0o600))
            .await
            .unwrap();
        p.delete(&b.provider_id).await.unwrap();

        let json = serde_json::to_string(&cloud.snapshot()).unwrap();
        assert!(!json.contains("binary"), "contents are base64: {json}");
        let restored = SimCloud::restore(serde_json::from_str(&json).unwrap()).unwrap();
        // The same document again, but for times read off two clocks (a millisecond).
        let parse = |json: &str| serde_json::from_str::<serde_json::Value>(json).unwrap();
        let again = parse(&serde_json::to_string(&restored.snapshot()).unwrap());
        let mut before = parse(&json);
        let mut after = again.clone();
        for (v, w) in [(&mut before, &again), (&mut after, &again)] {
            for (i, m) in v["machines"].as_array_mut().unwrap().iter_mut().enumerate() {
                for t in ["bootAt", "deleteAt"] {
                    let Some(ms) = m.as_object_mut().unwrap().remove(t) else {
                        continue;
                    };
                    let skew = ms
                        .as_u64()
                        .unwrap()
                        .abs_diff(w["machines"][i][t].as_u64().unwrap());
                    assert!(skew <= 5, "machine {i}'s {t} moved by {skew} ms");
                }
            }
        }
        assert_eq!(after, before, "a restored cloud saves the same document");
        let q = SimProvider::new(restored.clone(), config).unwrap();
        let got = q.get(&a.provider_id).await.unwrap();
        assert_eq!(got.phase, Phase::Provisioned);
        assert_eq!(got.labels, a.labels);
        assert_eq!(q.user_data(&a.provider_id).await.unwrap(), Some(ud));
        assert_eq!(
            restored.host(&a.provider_id).unwrap().files["/etc/app"].content,
            b"\x00\xffbinary"
        );
        assert_eq!(
            q.get(&b.provider_id).await.unwrap().phase,
            Phase::Deleting,
            "a deletion in progress goes on"
        );
        // New machines get new IDs, and a name held by a live machine is adopted.
        let c = q.create(&spec("c"), None).await.unwrap();
        assert!(c.provider_id != a.provider_id && c.provider_id != b.provider_id);
        assert_eq!(
            q.create(&spec("a"), None).await.unwrap().provider_id,
            a.provider_id
        );
        assert_eq!(restored.forget_deleted(Duration::ZERO), 1);
        assert!(q.get(&b.provider_id).await.is_err());
    }

    #[tokio::test]
    async fn a_machine_booting_when_saved_has_booted_when_restored_later() {
        let cloud = SimCloud::new();
        let config = SimConfig::default().with_boot_latency(Duration::from_millis(30));
        let p = SimProvider::new(cloud.clone(), config.clone()).unwrap();
        let m = p.create(&spec("a"), None).await.unwrap();
        assert_eq!(m.phase, Phase::Provisioning);
        let snapshot = cloud.snapshot();
        tokio::time::sleep(Duration::from_millis(60)).await;
        let q = SimProvider::new(SimCloud::restore(snapshot).unwrap(), config).unwrap();
        assert_eq!(
            q.get(&m.provider_id).await.unwrap().phase,
            Phase::Provisioned
        );
    }

    #[test]
    fn snapshots_of_another_version_are_refused_and_debug_shows_no_content() {
        let cloud = SimCloud::new();
        let mut s = cloud.snapshot();
        assert_eq!(
            format!("{s:?}"),
            "SimSnapshot { machines: 0, api_calls: 0, .. }"
        );
        s.version = 99;
        let e = SimCloud::restore(s).unwrap_err();
        assert_eq!(e.field(), Some("version"));
    }
}
