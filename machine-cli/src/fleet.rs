//! A fleet file made live: its provider (the simulator loaded from its state file), its
//! composer, the fleet reconciler over them, and a read-only look at each machine.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use futures_util::StreamExt;
use machine_core::fleet::{
    CREATED_LABEL, ChangeKind, FleetReconciled, FleetReconciler, MachineSet, SET_LABEL,
};
use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
use machine_core::{
    Completion, CompletionCheck, Composer, Connector, EventSink, Labels, Machine,
    MachineProvisioner, MachineSpec, Result, at_document_line, revision,
};
use serde::Serialize;

use crate::file::{FleetFile, LABEL_PREFIX, LayerMode, ProviderSettings};
use crate::state::SimState;

/// A fleet file with its provider, composer and reconciler.
pub struct Fleet {
    /// The file.
    pub file: FleetFile,
    /// The provider machines are made through.
    pub provider: Arc<dyn MachineProvisioner>,
    /// How running machines are reached.
    pub connector: Option<Arc<dyn Connector>>,
    /// The completion check, when there are coupled layers.
    pub completion: Option<Arc<dyn CompletionCheck>>,
    /// The composer's progress events.
    pub events: EventSink,
    /// The reconciler of the file's set.
    pub reconciler: FleetReconciler,
    /// The labels this CLI stamps on every machine: what it is made from, field by field.
    pub stamps: Labels,
    sim: Option<SimState>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("file", &self.file)
            .field("sim", &self.sim)
            .finish_non_exhaustive()
    }
}

impl Fleet {
    /// Opens the provider (locking and loading the simulator's state) and builds the
    /// composer and reconciler of `file`; errors name the field and line. `replicas`
    /// overrides the set's (`destroy` asks for zero).
    pub fn open(mut file: FleetFile, replicas: Option<u32>) -> Result<Fleet> {
        let yaml = std::mem::take(&mut file.text);
        let yaml = yaml.as_str();
        let has_coupled = file.layers.iter().any(|l| l.mode == LayerMode::Coupled);
        let completion = file.completion.check().filter(|_| has_coupled);
        // Checked on a throwaway cloud first: a file the composer refuses touches nothing
        // (no state file, no lock).
        {
            let cloud = SimCloud::new();
            let provider = Arc::new(SimProvider::new(cloud.clone(), SimConfig::default())?);
            compose(
                &file,
                provider,
                Arc::new(SimConnector::new(cloud)),
                completion.clone(),
                EventSink::default(),
            )
            .map_err(|e| at_document_line(cli_advice(e), yaml))?;
        }
        let (provider, connector, sim): (Arc<dyn MachineProvisioner>, Arc<dyn Connector>, _) =
            match &file.provider {
                ProviderSettings::Sim(s) => {
                    let state = SimState::open(&s.state, s.delete_latency)?;
                    let config = SimConfig::default()
                        .with_owner(s.owner.clone())
                        .with_boot_latency(s.boot_latency)
                        .with_boot_jitter(s.boot_jitter)
                        .with_delete_latency(s.delete_latency)
                        .with_boot_failure_rate(s.boot_failure_rate);
                    let provider = Arc::new(
                        SimProvider::new(state.cloud().clone(), config)
                            .map_err(|e| e.within("provider"))?,
                    );
                    let connector = Arc::new(
                        SimConnector::new(state.cloud().clone()).with_latency(s.transport_latency),
                    );
                    (provider, connector, Some(state))
                }
            };
        let events = EventSink::default();
        let composer = compose(
            &file,
            provider.clone(),
            connector.clone(),
            completion.clone(),
            events.clone(),
        )
        .map_err(|e| at_document_line(cli_advice(e), yaml))?;
        let stamps = stamps(&file, completion.as_deref())?;
        for (k, v) in &stamps {
            file.set.template.labels.insert(k.clone(), v.clone());
        }
        let mut set: MachineSet = file.set.clone();
        if let Some(n) = replicas {
            set = set.with_replicas(n);
        }
        let reconciler = FleetReconciler::new(composer, set)
            .map_err(|e| at_document_line(e.within("set"), yaml))?;
        Ok(Fleet {
            file,
            provider,
            connector: Some(connector),
            completion,
            events,
            reconciler,
            stamps,
            sim,
        })
    }

    /// Where the machines are, for people: `sim (state ./fleet.sim-state.json)`.
    pub fn place(&self) -> String {
        match (&self.file.provider, &self.sim) {
            (ProviderSettings::Sim(_), Some(s)) => format!("sim (state {})", s.path().display()),
            (p, _) => p.kind().to_owned(),
        }
    }

    /// Saves what must outlive this process (the simulator's state).
    pub fn save(&self) -> Result<()> {
        match &self.sim {
            Some(s) => s.save(),
            None => Ok(()),
        }
    }

    /// After a destroy: removes the simulator's state file when its cloud holds no
    /// machine at all (of any set or owner), so nothing is left behind.
    pub fn forget_if_empty(&self) -> Result<bool> {
        let Some(s) = &self.sim else {
            return Ok(false);
        };
        s.save()?;
        if s.cloud().machine_count() > 0 {
            return Ok(false);
        }
        match std::fs::remove_file(s.path()) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
            Err(e) => Err(machine_core::Error::new(
                machine_core::ErrorKind::Permanent,
                format!("removing {}: {e}", s.path().display()),
            )),
        }
    }

    /// The set's machines as the provider lists them (those being deleted included).
    pub async fn machines(&self) -> Result<Vec<Machine>> {
        let selector = Labels::from([(SET_LABEL.to_owned(), self.reconciler.set().name.clone())]);
        self.provider.list(&selector).await
    }

    /// What the reconciler would do and where every machine stands: read-only (the
    /// provider's listing, and for running machines their completion and layer records).
    pub async fn inspect(&self) -> Result<Inspection> {
        let planned = self.reconciler.plan().await?;
        let machines = self.machines().await?;
        let looks = futures_util::stream::iter(machines.iter().map(|m| self.look(m)))
            .buffered(16)
            .collect::<Vec<_>>()
            .await;
        let set = &self.reconciler.set().name;
        let mut newest: BTreeMap<u32, u32> = BTreeMap::new();
        for m in machines.iter().filter(|m| !m.phase.is_deleting()) {
            if let Some((slot, generation)) = slot_of(set, m) {
                let g = newest.entry(slot).or_default();
                *g = (*g).max(generation);
            }
        }
        let mut rows = Vec::with_capacity(machines.len());
        for (m, look) in machines.iter().zip(looks) {
            let change = planned
                .changes
                .iter()
                .find(|c| c.machine.as_ref() == Some(&m.name))
                .map(|c| Change::of(c.kind, c.machine.as_ref(), self.reasons(c, m)));
            let superseded = slot_of(set, m).and_then(|(slot, generation)| {
                (generation < newest[&slot] && !m.phase.is_deleting())
                    .then(|| format!("{set}-{slot}-{}", newest[&slot]))
            });
            let state = if m.phase.is_deleting() {
                State::Deleting
            } else if let Some(by) = superseded {
                State::Superseded(by)
            } else {
                look
            };
            rows.push(Row {
                machine: m.clone(),
                state,
                change,
            });
        }
        let creates = planned
            .changes
            .iter()
            .filter(|c| {
                c.machine
                    .as_ref()
                    .is_none_or(|n| !machines.iter().any(|m| &m.name == n))
            })
            .map(|c| Change::of(c.kind, c.machine.as_ref(), vec![c.reason.clone()]))
            .collect();
        Ok(Inspection {
            planned,
            rows,
            creates,
        })
    }

    /// Where one machine stands, as far as reading it tells (never changing it).
    async fn look(&self, m: &Machine) -> State {
        use machine_core::Phase;
        match m.phase {
            Phase::Failed => {
                return State::Failed(
                    m.failure
                        .as_ref()
                        .map_or_else(|| "no reason given".to_owned(), |f| f.message.clone()),
                );
            }
            Phase::Stopped => return State::Stopped,
            p if p.is_deleting() => return State::Deleting,
            p if !p.is_running() => return State::Booting,
            _ => {}
        }
        let Some(connector) = &self.connector else {
            return State::Ready;
        };
        let transport = match connector.connect(m).await {
            Ok(t) => t,
            Err(e) => return State::Unreachable(e.to_string()),
        };
        if let Some(check) = &self.completion {
            match check.check(m, transport.as_ref()).await {
                Ok(Completion::Done) => {}
                Ok(Completion::Pending) => {
                    return State::Bootstrapping("user data still running".into());
                }
                Ok(Completion::Failed(why)) => {
                    return State::Failed(format!("user data failed: {why}"));
                }
                Ok(_) => return State::Bootstrapping("user data in an unknown state".into()),
                Err(e) => return State::Unreachable(e.to_string()),
            }
        }
        for layer in self.reconciler.composer().bootstrapper().layers() {
            let path = revision::layer_digest_path(layer.name());
            match transport.read_file(&path, 1024).await {
                Ok(Some(_)) => {}
                Ok(None) if layer.digest(m).is_none() => {}
                Ok(None) => {
                    return State::Bootstrapping(format!("layer {} not applied yet", layer.name()));
                }
                Err(e) => return State::Unreachable(e.to_string()),
            }
        }
        State::Ready
    }

    /// Why a change is needed, at its most precise: for a replacement, the coupled
    /// layers and spec fields whose stamps differ from the template's.
    fn reasons(&self, c: &machine_core::fleet::PlannedChange, m: &Machine) -> Vec<String> {
        if c.kind == ChangeKind::Replace && !c.reason.starts_with("unhealthy") {
            let found = differences(&m.labels, &self.stamps, &self.reconciler.set().template);
            if !found.is_empty() {
                return found;
            }
        }
        vec![c.reason.clone()]
    }
}

/// The composer of `file`'s layers over `provider`.
fn compose(
    file: &FleetFile,
    provider: Arc<dyn MachineProvisioner>,
    connector: Arc<dyn Connector>,
    completion: Option<Arc<dyn CompletionCheck>>,
    events: EventSink,
) -> Result<Composer> {
    let mut b = Composer::builder(provider)
        .settings(file.settings.clone())
        .events(events)
        .connector(connector);
    for l in &file.layers {
        if let Some(c) = &l.coupled {
            b = b.coupled(c.clone());
        }
        if let Some(d) = &l.decoupled {
            b = b.decoupled(d.clone());
        }
    }
    if let Some(c) = completion {
        b = b.completion(c);
    }
    b.build()
}

/// The composer speaks to programmers (`add .completion(...)`); the file's reader
/// writes `completion:`.
fn cli_advice(e: machine_core::Error) -> machine_core::Error {
    if e.field() == Some("completion") && e.message().contains("need a completion check") {
        return machine_core::Error::invalid_spec(
            "completion",
            "coupled and decoupled layers together need a completion check, so that the decoupled layers start after the user data finished: set completion to sentinel (the default) or cloudInitStatus",
        );
    }
    e
}

/// The slot and generation of a member's name (`<set>-<slot>-<generation>`).
fn slot_of(set: &str, m: &Machine) -> Option<(u32, u32)> {
    let rest = m.name.as_str().strip_prefix(set)?.strip_prefix('-')?;
    let (slot, generation) = rest.split_once('-')?;
    Some((slot.parse().ok()?, generation.parse().ok()?))
}

/// What reading the provider and the machines showed.
#[derive(Debug)]
pub struct Inspection {
    /// The reconciler's plan.
    pub planned: FleetReconciled,
    /// Every machine of the set, with where it stands and the change it needs.
    pub rows: Vec<Row>,
    /// Machines to create (no machine yet).
    pub creates: Vec<Change>,
}

impl Inspection {
    /// Every change, creations first, then by machine.
    pub fn changes(&self) -> Vec<&Change> {
        self.creates
            .iter()
            .chain(self.rows.iter().filter_map(|r| r.change.as_ref()))
            .collect()
    }

    /// Machines an apply still has to finish (booting, bootstrapping, superseded, ...),
    /// without a change of their own.
    pub fn in_progress(&self) -> Vec<&Row> {
        self.rows
            .iter()
            .filter(|r| r.change.is_none() && r.state.in_progress())
            .collect()
    }

    /// Whether the fleet is as the file says: nothing to change, nothing in progress.
    pub fn converged(&self) -> bool {
        self.changes().is_empty() && self.in_progress().is_empty()
    }

    /// Machines the set keeps (not being deleted or superseded).
    pub fn current(&self) -> impl Iterator<Item = &Row> {
        self.rows
            .iter()
            .filter(|r| !matches!(r.state, State::Deleting | State::Superseded(_)))
    }
}

/// One machine and where it stands.
#[derive(Debug)]
pub struct Row {
    /// As the provider lists it.
    pub machine: Machine,
    /// Where it stands.
    pub state: State,
    /// The change it needs, if any.
    pub change: Option<Change>,
}

/// Where a machine stands, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Running, its user data done and every decoupled layer recorded.
    Ready,
    /// Not running yet.
    Booting,
    /// Running, its software not all there yet (why).
    Bootstrapping(String),
    /// Running but not reachable (why).
    Unreachable(String),
    /// Failed (why).
    Failed(String),
    /// Powered off.
    Stopped,
    /// Being deleted.
    Deleting,
    /// A newer machine of its slot replaces it (named); deleted once that one serves.
    Superseded(String),
}

impl State {
    /// A word for tables.
    pub fn word(&self) -> &'static str {
        match self {
            State::Ready => "ready",
            State::Booting => "booting",
            State::Bootstrapping(_) => "bootstrapping",
            State::Unreachable(_) => "unreachable",
            State::Failed(_) => "failed",
            State::Stopped => "stopped",
            State::Deleting => "deleting",
            State::Superseded(_) => "superseded",
        }
    }

    /// The details, if any.
    pub fn detail(&self) -> Option<String> {
        match self {
            State::Bootstrapping(why) | State::Unreachable(why) | State::Failed(why) => {
                Some(why.clone())
            }
            State::Superseded(by) => Some(format!("replaced by {by}, deleted once it serves")),
            _ => None,
        }
    }

    /// Whether an apply still has work to do on it (deleting ones finish on their own).
    fn in_progress(&self) -> bool {
        !matches!(self, State::Ready | State::Deleting)
    }
}

/// A change a plan shows.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    /// `create`, `delete`, `replace`, `updateInPlace`.
    pub action: &'static str,
    /// The machine (for a create, the name it will have).
    pub machine: Option<String>,
    /// Why: the layers or fields that differ, the health check that failed, the scale.
    pub reasons: Vec<String>,
}

impl Change {
    fn of(
        kind: ChangeKind,
        machine: Option<&machine_core::MachineName>,
        reasons: Vec<String>,
    ) -> Self {
        Change {
            action: action(kind),
            machine: machine.map(|m| m.to_string()),
            reasons,
        }
    }

    /// The sign terraform would show.
    pub fn sign(&self) -> &'static str {
        match self.action {
            "create" => "+",
            "delete" => "-",
            "replace" => "-/+",
            _ => "~",
        }
    }

    /// The action in words.
    pub fn words(&self) -> &'static str {
        match self.action {
            "create" => "create",
            "delete" => "delete",
            "replace" => "replace",
            _ => "update in place",
        }
    }
}

fn action(kind: ChangeKind) -> &'static str {
    match kind {
        ChangeKind::Create => "create",
        ChangeKind::Delete => "delete",
        ChangeKind::Replace => "replace",
        ChangeKind::UpdateInPlace => "updateInPlace",
        _ => "change",
    }
}

/// The longest label key, and the most labels, a spec may have (machine-core's bounds,
/// the tightest of the providers').
const MAX_LABEL_KEY_LEN: usize = 63;
const MAX_LABELS: usize = 64;

/// The spec fields whose stamps tell a replacement's reason.
const SPEC_FIELDS: [&str; 4] = ["image", "size", "ssh", "provider"];

fn short(bytes: &[u8]) -> String {
    revision::digest(bytes)[..12].to_owned()
}

fn layer_key(name: &str) -> String {
    let key = format!("{LABEL_PREFIX}layer.{name}");
    if key.len() <= MAX_LABEL_KEY_LEN {
        return key;
    }
    // Cut, with a digest of the whole name so that two long names stay apart.
    let keep = MAX_LABEL_KEY_LEN - LABEL_PREFIX.len() - "layer.".len() - 9;
    format!(
        "{LABEL_PREFIX}layer.{}.{}",
        &name[..keep],
        &short(name.as_bytes())[..8]
    )
}

/// The labels stamped on every machine of `file`'s template: a short digest of each
/// shaping field of the spec, of each coupled layer's user-data parts and of the
/// completion check's. None when the template's labels leave no room for them.
fn stamps(file: &FleetFile, completion: Option<&dyn CompletionCheck>) -> Result<Labels> {
    let t = &file.set.template;
    let mut out = Labels::new();
    let json = |v: serde_json::Value| serde_json::to_vec(&v).unwrap_or_default();
    let fields = [
        json(serde_json::json!(t.image)),
        json(serde_json::json!(t.size)),
        json(serde_json::to_value(&t.ssh).unwrap_or_default()),
        json(t.provider.clone()),
    ];
    for (field, bytes) in SPEC_FIELDS.iter().zip(fields) {
        out.insert(format!("{LABEL_PREFIX}spec.{field}"), short(&bytes));
    }
    let parts_digest = |parts: Vec<machine_core::UserDataPart>| {
        let mut bytes = Vec::new();
        for p in parts {
            bytes.extend_from_slice(format!("{:?}\0{}\0", p.format, p.filename).as_bytes());
            bytes.extend_from_slice(&p.content);
            bytes.push(0);
        }
        short(&bytes)
    };
    for l in &file.layers {
        if let Some(c) = &l.coupled {
            out.insert(layer_key(&l.name), parts_digest(c.user_data_parts(t)?));
        }
    }
    if let Some(c) = completion {
        out.insert(
            format!("{LABEL_PREFIX}completion"),
            parts_digest(c.user_data_parts(t)),
        );
    }
    // The reconciler adds four labels of its own.
    if t.labels.len() + out.len() + 4 > MAX_LABELS {
        return Ok(Labels::new());
    }
    Ok(out)
}

/// What differs between a machine's stamps and the template's, in words: `coupled
/// layer base changed`, `spec.image changed (now debian-13)`. Empty when the machine
/// has no stamps or none differ.
pub fn differences(machine: &Labels, now: &Labels, template: &MachineSpec) -> Vec<String> {
    let ours = |l: &Labels| -> BTreeMap<String, String> {
        l.iter()
            .filter(|(k, _)| k.starts_with(LABEL_PREFIX))
            .map(|(k, v)| (k[LABEL_PREFIX.len()..].to_owned(), v.clone()))
            .collect()
    };
    let (was, is) = (ours(machine), ours(now));
    if was.is_empty() || is.is_empty() {
        return Vec::new();
    }
    let mut keys: Vec<&String> = was.keys().chain(is.keys()).collect();
    keys.sort_by_key(|k| (!k.starts_with("layer."), k.as_str()));
    keys.dedup();
    let mut out = Vec::new();
    for k in keys {
        let (a, b) = (was.get(k), is.get(k));
        if a == b {
            continue;
        }
        let what = if let Some(layer) = k.strip_prefix("layer.") {
            let verb = match (a, b) {
                (None, _) => "added",
                (_, None) => "removed",
                _ => "changed",
            };
            format!("coupled layer {layer} {verb}")
        } else if let Some(field) = k.strip_prefix("spec.") {
            let now = match field {
                "image" => template.image.clone(),
                "size" => template.size.clone(),
                _ => None,
            };
            match now {
                Some(v) => format!("spec.{field} changed (now {})", machine_core::shown(&v)),
                None => format!("spec.{field} changed"),
            }
        } else if k == "completion" {
            "the completion check changed".to_owned()
        } else {
            format!("{k} changed")
        };
        out.push(what);
    }
    out
}

/// Seconds since a machine was made, from its creation label.
pub fn age(m: &Machine) -> Option<std::time::Duration> {
    let secs: u64 = m.labels.get(CREATED_LABEL)?.parse().ok()?;
    let made = SystemTime::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(secs))?;
    SystemTime::now().duration_since(made).ok()
}
