//! The fleet reconciler: one pass from what the provider lists toward the set's desired
//! state, with bounded work per pass.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;

use super::names::{self, CREATED_LABEL, SET_LABEL, SLOT_LABEL};
use super::{DeletePolicy, FleetStatus, MachineSet, conditions as FC};
use crate::composer::{Action, Composer};
use crate::error::{ErrorKind, Result};
use crate::machine::{Labels, Machine, Phase, ProviderId};
use crate::name::MachineName;
use crate::revision;
use crate::spec::MachineSpec;
use crate::transport::ExecRequest;

/// How long a steady fleet waits before its next look when no probe asks sooner: a
/// resync, as kube-runtime controllers do, since waiting for a change can miss one.
const RESYNC: Duration = Duration::from_secs(300);

/// What one [`FleetReconciler::reconcile`] step saw and what to do next.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FleetReconciled {
    /// The fleet as observed at the start of the step.
    pub status: FleetStatus,
    /// When to look again.
    pub action: Action,
    /// What the step started, one line per decision with its reason (`create web-3-1:
    /// scale up to 5`, `delete web-0-1: replaced by web-0-2`), for logs and events.
    pub decisions: Vec<String>,
    /// Every change the set still needs, whether or not this step started it (a
    /// rollout's budget starts a few at a time): what a plan shows.
    pub changes: Vec<PlannedChange>,
    /// The set's machines as the step leaves them, for a view of each (a controller's
    /// per-machine objects): the provider's listing, each machine as the composer last
    /// stepped it where this process did (so a machine whose software is in place reads
    /// `Ready`), those the step deleted as `Deleting`, and those it created. A plan
    /// shows them as listed.
    pub machines: Vec<Machine>,
}

/// One change a set needs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlannedChange {
    /// What happens.
    pub kind: ChangeKind,
    /// The machine it happens to (`None` for one not made yet).
    pub machine: Option<MachineName>,
    /// Why: the revision or layers that differ, the health check that failed, the scale.
    pub reason: String,
}

/// What happens to a machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[non_exhaustive]
pub enum ChangeKind {
    /// A machine is made for a new slot.
    Create,
    /// A machine is deleted and its slot given up.
    Delete,
    /// A machine is replaced by a new one (something coupled changed, or it is unhealthy).
    Replace,
    /// A machine's changed decoupled layers are applied again, in place.
    UpdateInPlace,
}

/// Drives a [`MachineSet`] toward its desired state through a [`Composer`] (the
/// provider and the layers of the set's template), one non-blocking step at a time.
/// See the [module docs](super) for what it does and why it is crash-safe.
///
/// One reconciler per set at a time is the intended use (a controller's leader); two at
/// once compute the same names and do no harm beyond repeated calls.
pub struct FleetReconciler {
    composer: Composer,
    set: MachineSet,
    concurrency: usize,
    memo: Mutex<Memo>,
}

impl std::fmt::Debug for FleetReconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetReconciler")
            .field("set", &self.set.name)
            .field("replicas", &self.set.replicas)
            .field("composer", &self.composer)
            .finish_non_exhaustive()
    }
}

/// What the reconciler remembers between steps; a saving, but for a paused rollout: a
/// new process starts empty and verifies each machine once, and takes a pause from the
/// last status it is given ([`FleetReconciler::resume`]).
#[derive(Default)]
struct Memo {
    machines: HashMap<MachineName, Seen>,
    /// Each name's expected coupled revision, for the current template.
    expected: HashMap<MachineName, String>,
    /// The template revision a rollout paused at, and why.
    paused: Option<(String, String)>,
    last_remediation: Option<Instant>,
    /// Member names another's machine already has (a standalone one, or one of another
    /// set): the slot takes its next generation instead. A new process finds each again
    /// with one refused step.
    taken: HashSet<MachineName>,
}

/// One machine as the reconciler last saw it.
struct Seen {
    provider_id: ProviderId,
    /// The composer's last status of it.
    last: Option<Machine>,
    /// The decoupled layers' digests it had when last seen Ready (`None`: not known).
    applied: Option<Vec<Option<String>>>,
    /// An in-place update was started and has not ended.
    updating: bool,
    probe_failing_since: Option<Instant>,
    next_probe: Option<Instant>,
    /// Its recorded layer digests were read and none differed: step it as usual.
    verified: bool,
}

impl Seen {
    fn new(provider_id: ProviderId) -> Self {
        Seen {
            provider_id,
            last: None,
            applied: None,
            verified: false,
            updating: false,
            probe_failing_since: None,
            next_probe: None,
        }
    }
}

/// Where a machine's decoupled layers stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layers {
    /// As the template's are now.
    Current,
    /// A layer changed since it was applied: an in-place update is due.
    Changed,
    /// Not known (not Ready yet, or not seen Ready by this process).
    Unknown,
}

/// A member of the set as classified by one step.
struct Member {
    m: Machine,
    slot: u32,
    generation: u32,
    deleting: bool,
    expected_layers: Vec<Option<String>>,
    coupled_current: bool,
    ready: bool,
    layers: Layers,
    /// The decoupled layers whose applied digest differs from the template's.
    changed_layers: Vec<String>,
    unhealthy: Option<String>,
    /// Its probe fails, not yet for long enough to make it unhealthy.
    probe_failing: bool,
    /// Running, and not looked at by this process yet.
    unseen_running: bool,
    updating: bool,
    created: Option<SystemTime>,
}

impl Member {
    /// Serving: Ready, healthy and not being updated, whatever its revision (an
    /// outdated machine serves until its replacement does).
    fn available(&self) -> bool {
        self.ready && self.unhealthy.is_none() && !self.updating
    }
}

/// The end of a composer step on one machine.
struct Stepped {
    name: MachineName,
    in_place: bool,
    expected_layers: Vec<Option<String>>,
    result: Result<Option<Machine>>,
}

/// How much of what a step decides it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Execute {
    /// Everything: a reconcile.
    All,
    /// Only the read-only verifications: a plan's first look.
    Verifications,
    /// Nothing: a plan.
    Nothing,
}

/// What a step decided so far: machines to delete (once each), work, and why.
struct Plan {
    deleted: Vec<bool>,
    work: Vec<Work>,
    decisions: Vec<String>,
    changes: Vec<PlannedChange>,
}

impl Plan {
    fn delete(&mut self, members: &[Member], i: usize, why: String) {
        if !self.deleted[i] {
            self.deleted[i] = true;
            self.decisions
                .push(format!("delete {}: {why}", members[i].m.name));
            self.work.push(Work::Delete(members[i].m.clone(), why));
        }
    }
}

/// Work a step starts; each ends in an [`Outcome`].
enum Work {
    Delete(Machine, String),
    /// Create (or take one step on) a machine of `spec`: the first reconcile creates it.
    Step {
        spec: MachineSpec,
        previous: Option<Machine>,
        in_place: bool,
    },
    /// Read the machine's recorded layer digests, to tell a changed layer from one
    /// never applied, before any step applies it.
    Verify(Machine, Vec<Option<String>>),
    Probe(Machine),
}

enum Outcome {
    Deleted(MachineName, Result<()>),
    Stepped(Box<Stepped>),
    /// A machine, its expected layer digests, and the recorded ones with the last set
    /// it finished.
    Verified(
        Box<Machine>,
        Vec<Option<String>>,
        Result<(Vec<Option<String>>, Option<String>)>,
    ),
    Probed(MachineName, bool),
}

impl FleetReconciler {
    /// A reconciler for `set` through `composer`, whose provider makes the machines and
    /// whose layers are the template's software. Refuses an invalid set, naming the
    /// field. At most 32 machines are worked on at once in a step.
    pub fn new(composer: Composer, set: MachineSet) -> Result<Self> {
        set.validate()?;
        Ok(FleetReconciler {
            composer,
            set,
            concurrency: 32,
            memo: Mutex::new(Memo::default()),
        })
    }

    /// Sets how many machines a step works on at once (at least one).
    pub fn with_concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// A new desired state (replicas, template, layers): what the reconciler remembers of
    /// each machine is kept, the expected revisions are computed again.
    pub fn update(&mut self, composer: Composer, set: MachineSet) -> Result<()> {
        set.validate()?;
        self.composer = composer;
        self.set = set;
        self.lock().expected.clear();
        Ok(())
    }

    /// Carries over, from this set's last status as an earlier process returned it (the
    /// caller keeps it: machine-kube in the object's status), what the listing cannot
    /// show: a rollout paused at the template this reconciler has stays paused, where a
    /// new process would otherwise try the failing template on the next machine (the
    /// failed one may be gone or repaired). A new template resumes it as usual. Counts
    /// and every other decision still come from the listing.
    pub fn resume(&self, last: &FleetStatus) {
        if let Some(c) = last
            .condition(FC::ROLLOUT_PAUSED)
            .filter(|c| c.status && !last.observed_revision.is_empty())
        {
            self.lock().paused = Some((last.observed_revision.clone(), c.message.clone()));
        }
    }

    /// The desired state.
    pub fn set(&self) -> &MachineSet {
        &self.set
    }

    /// The composer machines are made through.
    pub fn composer(&self) -> &Composer {
        &self.composer
    }

    /// The composer's last status of `m` in this process, if it is still that machine.
    fn last_status(&self, m: &Machine) -> Option<Machine> {
        self.lock()
            .machines
            .get(&m.name)
            .filter(|s| s.provider_id == m.provider_id)
            .and_then(|s| s.last.clone())
    }

    fn lock(&self) -> MutexGuard<'_, Memo> {
        self.memo.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn selector(&self) -> Labels {
        Labels::from([(SET_LABEL.to_owned(), self.set.name.clone())])
    }

    /// The spec of the machine in `slot` of generation `generation`.
    fn spec_for(&self, slot: u32, generation: u32, created: String) -> MachineSpec {
        let mut spec = self.set.template.clone();
        spec.name = names::machine_name(&self.set.name, slot, generation);
        spec.labels.insert(SET_LABEL.into(), self.set.name.clone());
        spec.labels.insert(SLOT_LABEL.into(), slot.to_string());
        spec.labels.insert(CREATED_LABEL.into(), created);
        spec
    }

    /// The coupled revision a machine named `name` is made from now (cached per name).
    fn expected_revision(&self, m: &Machine, slot: u32, generation: u32) -> Result<String> {
        if let Some(r) = self.lock().expected.get(&m.name) {
            return Ok(r.clone());
        }
        let spec = self.spec_for(slot, generation, String::new());
        let ud = self.composer.user_data(&spec)?;
        let r = revision::coupled_revision(&spec, ud.as_ref());
        self.lock().expected.insert(m.name.clone(), r.clone());
        Ok(r)
    }

    fn expected_layers(&self, m: &Machine) -> Vec<Option<String>> {
        self.composer
            .bootstrapper()
            .layers()
            .iter()
            .map(|l| l.digest(m))
            .collect()
    }

    /// The template's revision, for the status.
    fn template_revision(&self) -> Result<String> {
        let spec = self.spec_for(0, 0, String::new());
        let ud = self.composer.user_data(&spec)?;
        let coupled = revision::coupled_revision(&spec, ud.as_ref());
        let stand_in = Machine::new(
            spec.name.clone(),
            ProviderId::new("fleet:///template")?,
            Phase::Pending,
        );
        let layers: Vec<String> = self
            .expected_layers(&stand_in)
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect();
        Ok(revision::digest(
            format!("{coupled}\n{}", layers.join("\n")).as_bytes(),
        ))
    }

    /// Takes one step toward the set's desired state and says when to look again.
    ///
    /// One `list` of the set's machines, then at most [`FleetReconciler::with_concurrency`]
    /// machines worked on at once: each create, delete, composer step, verification or
    /// probe is one non-blocking action, as in [`Composer::reconcile`]. Errors of one
    /// machine do not fail the step (they go to the status and the decisions); an error
    /// of the listing does, and decides the requeue by its kind.
    pub async fn reconcile(&self) -> Result<FleetReconciled> {
        let (done, only_verified) = self.step(Execute::All).await?;
        if only_verified {
            // A new process's first look read the machines' records; act on them now
            // rather than a poll interval later.
            return Ok(self.step(Execute::All).await?.0);
        }
        Ok(done)
    }

    /// What the next [`FleetReconciler::reconcile`] would start, without starting it: the
    /// decisions (creates, deletes, in-place updates, each with its reason) and the status.
    /// Read-only: the provider's listing and, for running machines this process has not
    /// seen Ready, a read of their recorded layer digests (so that a changed decoupled
    /// layer shows as an in-place update), nothing else.
    pub async fn plan(&self) -> Result<FleetReconciled> {
        self.step(Execute::Verifications).await?;
        Ok(self.step(Execute::Nothing).await?.0)
    }

    /// One step; with it, whether all it did was read machines' records.
    async fn step(&self, execute: Execute) -> Result<(FleetReconciled, bool)> {
        let set = &self.set;
        let provider = self.composer.provider().clone();
        let listed = provider.list(&self.selector()).await?;
        let template_revision = self.template_revision()?;
        let now = Instant::now();
        let wall = SystemTime::now();
        let replicas = set.replicas;
        let max_surge = set.rollout.max_surge.resolve(replicas, true);
        let max_unavailable = set.rollout.max_unavailable.resolve(replicas, false);

        let mut members: Vec<Member> = Vec::new();
        let mut work: Vec<Work> = Vec::new();
        let mut decisions: Vec<String> = Vec::new();
        {
            let mut memo = self.lock();
            if memo
                .paused
                .as_ref()
                .is_some_and(|(at, _)| *at != template_revision)
            {
                // A new template resumes a paused rollout.
                memo.paused = None;
            }
            let names: std::collections::HashSet<&MachineName> =
                listed.iter().map(|m| &m.name).collect();
            memo.machines.retain(|n, _| names.contains(n));
        }
        for m in listed {
            let Some((slot, generation)) = names::parse(&set.name, &m.name) else {
                // The set's label on a name not of its scheme: not ours to keep.
                if !m.phase.is_deleting() {
                    decisions.push(format!(
                        "delete {}: not named as a member of {}",
                        m.name, set.name
                    ));
                    work.push(Work::Delete(m, "not a member's name".into()));
                }
                continue;
            };
            let deleting = m.phase.is_deleting();
            let expected_layers = self.expected_layers(&m);
            let coupled_current = if deleting {
                false
            } else {
                let expected = self.expected_revision(&m, slot, generation)?;
                m.revision() == Some(expected.as_str())
            };
            let created = names::created(&m);
            let memo = self.lock();
            let seen = memo
                .machines
                .get(&m.name)
                .filter(|s| s.provider_id == m.provider_id);
            let last_phase = seen.and_then(|s| s.last.as_ref()).map(|l| l.phase);
            let ready = m.phase.is_running() && last_phase == Some(Phase::Ready);
            // Running, and not looked at by this process yet (a new process, a new
            // leader): whether it serves is not known, so it is neither taken for
            // unhealthy nor replaced as if it did not serve.
            let unseen_running = m.phase.is_running() && last_phase.is_none();
            let layers = match seen.and_then(|s| s.applied.as_ref()) {
                Some(applied) if ready && *applied == expected_layers => Layers::Current,
                Some(_) if ready => Layers::Changed,
                _ => Layers::Unknown,
            };
            let changed_layers: Vec<String> = match seen.and_then(|s| s.applied.as_ref()) {
                Some(applied) if layers == Layers::Changed => self
                    .composer
                    .bootstrapper()
                    .layers()
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| applied.get(*i) != expected_layers.get(*i))
                    .map(|(_, l)| l.name().to_owned())
                    .collect(),
                _ => Vec::new(),
            };
            let failed = m.phase == Phase::Failed || last_phase == Some(Phase::Failed);
            let age = created.and_then(|c| wall.duration_since(c).ok());
            let unhealthy = if deleting {
                None
            } else if failed {
                Some(format!(
                    "failed: {}",
                    m.failure
                        .as_ref()
                        .or_else(|| seen.and_then(|s| s.last.as_ref()?.failure.as_ref()))
                        .map_or_else(|| "no reason given".to_owned(), |f| f.message.clone())
                ))
            } else if !ready
                && !unseen_running
                && age.is_some_and(|a| a > set.health.startup_timeout)
            {
                Some(format!(
                    "not Ready {} after it was created",
                    humantime::format_duration(set.health.startup_timeout)
                ))
            } else if let (Some(since), Some(p)) = (
                seen.and_then(|s| s.probe_failing_since),
                set.health.probe.as_ref(),
            ) && now.duration_since(since) > p.unhealthy_after
            {
                Some(format!(
                    "its probe has failed for {}",
                    humantime::format_duration(p.unhealthy_after)
                ))
            } else {
                None
            };
            let updating = seen.is_some_and(|s| s.updating);
            let probe_failing = seen.is_some_and(|s| s.probe_failing_since.is_some());
            drop(memo);
            members.push(Member {
                m,
                slot,
                generation,
                deleting,
                expected_layers,
                coupled_current,
                ready,
                layers,
                changed_layers,
                unhealthy,
                probe_failing,
                unseen_running,
                updating,
                created,
            });
        }

        // Slots: each replica's place, its current machine the newest generation alive.
        let mut slots: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        let mut max_generation: BTreeMap<u32, u32> = BTreeMap::new();
        for (i, mb) in members.iter().enumerate() {
            let g = max_generation.entry(mb.slot).or_default();
            *g = (*g).max(mb.generation);
            if !mb.deleting {
                slots.entry(mb.slot).or_default().push(i);
            }
        }
        // A slot's next generation: after its newest, past names another's machine has.
        let taken = self.lock().taken.clone();
        let next_generation = |slot: u32| {
            let mut g = max_generation.get(&slot).map_or(0, |g| g + 1);
            while taken.contains(&names::machine_name(&set.name, slot, g)) {
                g += 1;
            }
            g
        };
        let current_of = |ids: &Vec<usize>| {
            ids.iter()
                .copied()
                .max_by_key(|&i| members[i].generation)
                .expect("a slot lists at least one member")
        };
        let mut plan = Plan {
            deleted: vec![false; members.len()],
            work,
            decisions,
            changes: Vec::new(),
        };

        let live = members.iter().filter(|m| !m.deleting).count() as u32;
        let available = members
            .iter()
            .filter(|m| !m.deleting && m.available())
            .count() as u32;
        let mut status = FleetStatus {
            replicas: live,
            ready: members.iter().filter(|m| !m.deleting && m.ready).count() as u32,
            updated: members
                .iter()
                .filter(|m| !m.deleting && m.coupled_current && m.layers == Layers::Current)
                .count() as u32,
            available,
            unavailable: replicas.saturating_sub(available),
            unhealthy: members
                .iter()
                .filter(|m| !m.deleting && m.unhealthy.is_some())
                .count() as u32,
            observed_revision: template_revision.clone(),
            conditions: Vec::new(),
        };

        // 1. Machines a newer generation of their slot replaced, once it serves (or at
        // once when they are unhealthy themselves).
        for ids in slots.values() {
            let current = current_of(ids);
            for &i in ids.iter().filter(|&&i| i != current) {
                if members[current].available() || members[i].unhealthy.is_some() {
                    let why = format!("replaced by {}", members[current].m.name);
                    plan.delete(&members, i, why);
                }
            }
        }

        // 2. Remediation of unhealthy current machines, bounded.
        let currents: Vec<usize> = slots.values().map(current_of).collect();
        let unhealthy: Vec<usize> = currents
            .iter()
            .copied()
            .filter(|&i| members[i].unhealthy.is_some())
            .collect();
        let max_unhealthy = set
            .health
            .max_unhealthy
            .resolve(replicas.max(currents.len() as u32), false);
        let mut remediation_paused = None;
        if unhealthy.len() as u32 > max_unhealthy {
            remediation_paused = Some(format!(
                "{} machines are unhealthy, more than maxUnhealthy {} ({}): remediation stopped",
                unhealthy.len(),
                max_unhealthy,
                set.health.max_unhealthy
            ));
        } else if let Some(&i) = unhealthy.first() {
            let mut memo = self.lock();
            let due = memo
                .last_remediation
                .is_none_or(|t| now.duration_since(t) >= set.health.remediation_interval);
            if due {
                if execute == Execute::All {
                    memo.last_remediation = Some(now);
                }
                drop(memo);
                let why = format!(
                    "unhealthy, {}",
                    members[i].unhealthy.clone().unwrap_or_default()
                );
                plan.delete(&members, i, why);
            }
        }

        // 3. Scale down: whole slots, unhealthy first, then not Ready, then by policy.
        let mut occupied: Vec<u32> = slots
            .iter()
            .filter(|(_, ids)| !plan.deleted[current_of(ids)])
            .map(|(s, _)| *s)
            .collect();
        if occupied.len() as u32 > replicas {
            let mut ranked: Vec<(u32, usize)> = occupied
                .iter()
                .map(|s| (*s, current_of(&slots[s])))
                .collect();
            let key = |i: usize| {
                let m = &members[i];
                let age = m.created.unwrap_or(SystemTime::UNIX_EPOCH);
                (m.unhealthy.is_none(), m.ready, age)
            };
            match set.delete_policy {
                DeletePolicy::Oldest => ranked.sort_by_key(|&(_, i)| key(i)),
                DeletePolicy::Newest => ranked.sort_by_key(|&(_, i)| {
                    let (healthy, ready, age) = key(i);
                    (healthy, ready, std::cmp::Reverse(age))
                }),
                DeletePolicy::Random => {
                    fastrand::shuffle(&mut ranked);
                    ranked.sort_by_key(|&(_, i)| {
                        let (healthy, ready, _) = key(i);
                        (healthy, ready)
                    });
                }
            }
            let excess = occupied.len() - replicas as usize;
            for &(slot, _) in ranked.iter().take(excess) {
                for &i in &slots[&slot] {
                    plan.delete(&members, i, format!("scale down to {replicas}"));
                    if i == current_of(&slots[&slot]) {
                        plan.changes.push(PlannedChange {
                            kind: ChangeKind::Delete,
                            machine: Some(members[i].m.name.clone()),
                            reason: format!("scale down to {replicas}"),
                        });
                    }
                }
                occupied.retain(|s| *s != slot);
            }
        }

        // 4. Rollout of coupled changes: replace, within maxSurge and maxUnavailable.
        let paused = self.lock().paused.clone();
        let mut creates: Vec<(u32, u32, String)> = Vec::new();
        let deleted_available = |deleted: &[bool]| {
            members
                .iter()
                .enumerate()
                .filter(|(i, m)| deleted[*i] && m.available())
                .count() as u32
        };
        if paused.is_none() {
            let live_after = |deleted: &[bool], creates: usize| {
                members
                    .iter()
                    .enumerate()
                    .filter(|(i, m)| !m.deleting && !deleted[*i])
                    .count() as u32
                    + creates as u32
            };
            let outdated: Vec<u32> = occupied
                .iter()
                .copied()
                .filter(|s| {
                    let i = current_of(&slots[s]);
                    !members[i].coupled_current && !plan.deleted[i]
                })
                .collect();
            for slot in outdated {
                let i = current_of(&slots[&slot]);
                let next = next_generation(slot);
                let name = names::machine_name(&set.name, slot, next);
                if !members[i].available() && !members[i].unseen_running {
                    // Not serving: replacing it costs no availability. (One this
                    // process has not looked at yet may serve: it waits for the budget.)
                    creates.push((
                        slot,
                        next,
                        format!("replaces {} (outdated, not available)", members[i].m.name),
                    ));
                    plan.delete(&members, i, format!("outdated, replaced by {name}"));
                } else if live_after(&plan.deleted, creates.len()) < replicas + max_surge {
                    creates.push((
                        slot,
                        next,
                        format!("surge: replaces {} (outdated)", members[i].m.name),
                    ));
                } else if available - deleted_available(&plan.deleted)
                    > replicas.saturating_sub(max_unavailable)
                {
                    creates.push((
                        slot,
                        next,
                        format!("replaces {} (outdated)", members[i].m.name),
                    ));
                    plan.delete(&members, i, format!("outdated, replaced by {name}"));
                } else {
                    break;
                }
            }
        }

        // 5. Scale up: fill free slots, the lowest first, each with its next generation.
        let filled = occupied.len()
            + creates
                .iter()
                .filter(|(s, _, _)| !occupied.contains(s))
                .count();
        let mut needed = (replicas as usize).saturating_sub(filled);
        let mut slot = 0u32;
        while needed > 0 {
            let taken = occupied.contains(&slot) || creates.iter().any(|(s, _, _)| *s == slot);
            if !taken {
                let next = next_generation(slot);
                creates.push((slot, next, format!("scale up to {replicas}")));
                plan.changes.push(PlannedChange {
                    kind: ChangeKind::Create,
                    machine: Some(names::machine_name(&set.name, slot, next)),
                    reason: format!("scale up to {replicas}"),
                });
                needed -= 1;
            }
            slot += 1;
        }
        for (slot, generation, why) in &creates {
            let spec = self.spec_for(*slot, *generation, names::created_now());
            plan.decisions.push(format!("create {}: {why}", spec.name));
            plan.work.push(Work::Step {
                spec,
                previous: None,
                in_place: false,
            });
        }

        // The whole picture of what the set still needs, started in this step or not.
        for ids in slots.values() {
            let mb = &members[current_of(ids)];
            let scaled_away = plan
                .changes
                .iter()
                .any(|c| c.kind == ChangeKind::Delete && c.machine.as_ref() == Some(&mb.m.name));
            let change = if scaled_away {
                None
            } else if let Some(why) = &mb.unhealthy {
                Some((ChangeKind::Replace, format!("unhealthy: {why}")))
            } else if !mb.coupled_current {
                Some((
                    ChangeKind::Replace,
                    format!(
                        "made from revision {}; a coupled layer or the spec changed since",
                        mb.m.revision().unwrap_or("none")
                    ),
                ))
            } else if mb.layers == Layers::Changed {
                Some((
                    ChangeKind::UpdateInPlace,
                    format!("decoupled layers changed: {}", mb.changed_layers.join(", ")),
                ))
            } else {
                None
            };
            if let Some((kind, reason)) = change {
                plan.changes.push(PlannedChange {
                    kind,
                    machine: Some(mb.m.name.clone()),
                    reason,
                });
            }
        }

        // 6. In-place updates of changed decoupled layers, machine by machine.
        let in_flight = members.iter().filter(|m| !m.deleting && m.updating).count() as u32;
        let mut room = max_unavailable.max(1).saturating_sub(in_flight);
        let mut stepped = vec![false; members.len()];
        for &slot in &occupied {
            let i = current_of(&slots[&slot]);
            let mb = &members[i];
            if plan.deleted[i] || !mb.coupled_current || mb.unhealthy.is_some() {
                continue;
            }
            if mb.layers == Layers::Changed && !mb.updating {
                if paused.is_some() || room == 0 {
                    continue;
                }
                room -= 1;
                stepped[i] = true;
                plan.decisions.push(format!(
                    "update {} in place: a decoupled layer changed",
                    mb.m.name
                ));
                // Its last status, as bootstrapping again: the composer applies the
                // changed layers without asking the coupled software's verdict again.
                let previous = self.last_status(&mb.m).map(|mut m| {
                    m.phase = Phase::Bootstrapping;
                    m
                });
                plan.work.push(Work::Step {
                    spec: self.spec_for(mb.slot, mb.generation, String::new()),
                    previous,
                    in_place: true,
                });
            }
        }

        // 7. Every other live machine not yet available: one composer step (or, for a
        // running machine this process has not seen Ready, a look at its recorded
        // digests first), and probes of the available ones.
        let probe = set.health.probe.clone();
        for (i, mb) in members.iter().enumerate() {
            if mb.deleting || plan.deleted[i] || stepped[i] {
                continue;
            }
            if mb.available() {
                let due = probe.is_some() && {
                    let memo = self.lock();
                    memo.machines
                        .get(&mb.m.name)
                        .and_then(|s| s.next_probe)
                        .is_none_or(|t| t <= now)
                };
                if due {
                    plan.work.push(Work::Probe(mb.m.clone()));
                }
                continue;
            }
            if mb.layers == Layers::Changed {
                continue; // waits for room in step 6
            }
            let previous = self.last_status(&mb.m);
            let verified = self
                .lock()
                .machines
                .get(&mb.m.name)
                .is_some_and(|s| s.verified);
            if previous.is_none()
                && !verified
                && mb.m.phase.is_running()
                && mb.expected_layers.iter().any(Option::is_some)
            {
                plan.work
                    .push(Work::Verify(mb.m.clone(), mb.expected_layers.clone()));
                continue;
            }
            plan.work.push(Work::Step {
                spec: self.spec_for(mb.slot, mb.generation, String::new()),
                previous,
                in_place: mb.updating,
            });
        }

        let Plan {
            work,
            mut decisions,
            changes,
            deleted,
        } = plan;
        // Probes are looking, not changing: a fleet that only probes is steady.
        let busy = work.iter().any(|w| !matches!(w, Work::Probe(_)));
        let only_verified = !work.is_empty() && work.iter().all(|w| matches!(w, Work::Verify(..)));
        let work: Vec<Work> = match execute {
            Execute::All => work,
            Execute::Verifications => work
                .into_iter()
                .filter(|w| matches!(w, Work::Verify(..)))
                .collect(),
            Execute::Nothing => Vec::new(),
        };
        let errors = self.run(work, &members, &template_revision).await;
        decisions.extend(errors);
        let created: Vec<MachineName> = creates
            .iter()
            .map(|(slot, generation, _)| names::machine_name(&set.name, *slot, *generation))
            .collect();
        let machines = if execute == Execute::All {
            self.observed(&members, &deleted, &created)
        } else {
            self.observed(&members, &vec![false; members.len()], &[])
        };
        if execute == Execute::All {
            for d in &decisions {
                tracing::info!(set = %set.name, "{d}");
            }
        }

        // Conditions.
        let mut set_condition = |kind: &str, ok: bool, reason: &str, message: String| {
            status
                .conditions
                .push(crate::machine::Condition::now(kind, ok, reason, message));
        };
        let floor = replicas.saturating_sub(max_unavailable);
        set_condition(
            FC::AVAILABLE,
            available >= floor,
            if available >= floor {
                "MinimumAvailable"
            } else {
                "BelowMinimum"
            },
            format!("{available} of {replicas} available; at least {floor} wanted"),
        );
        // A failing probe is watched closely until it passes or the machine is replaced.
        let watching = members.iter().any(|m| !m.deleting && m.probe_failing);
        let steady = !busy && !watching && available == replicas && live == replicas;
        set_condition(
            FC::PROGRESSING,
            !steady,
            if steady { "Steady" } else { "Converging" },
            format!("{} decisions this step", decisions.len()),
        );
        match self.lock().paused.clone() {
            Some((_, why)) => set_condition(FC::ROLLOUT_PAUSED, true, "UpdateFailed", why),
            None => set_condition(FC::ROLLOUT_PAUSED, false, "Rolling", "not paused".into()),
        }
        match remediation_paused {
            Some(why) => set_condition(FC::REMEDIATION_PAUSED, true, "TooManyUnhealthy", why),
            None => set_condition(
                FC::REMEDIATION_PAUSED,
                false,
                "WithinBound",
                format!("at most {max_unhealthy} unhealthy are remediated"),
            ),
        }

        let poll = self.composer.settings().poll_interval;
        // Machines still going are looked at again soon, so that whoever shows them (a
        // Machine object, a CLI's table) sees them gone without waiting for a resync.
        let going = members.iter().any(|m| m.deleting);
        let action = if !steady || going {
            Action::Requeue(poll)
        } else {
            Action::Requeue(probe.map_or(RESYNC, |p| p.interval.min(RESYNC)))
        };
        Ok((
            FleetReconciled {
                status,
                action,
                decisions,
                changes,
                machines,
            },
            only_verified,
        ))
    }

    /// The members as the step leaves them: the composer's last look at each where it
    /// is newer than the listing, `deleted` ones as Deleting, then the `created` ones.
    fn observed(
        &self,
        members: &[Member],
        deleted: &[bool],
        created: &[MachineName],
    ) -> Vec<Machine> {
        let memo = self.lock();
        let last = |name: &MachineName, id: Option<&ProviderId>| {
            memo.machines
                .get(name)
                .filter(|s| id.is_none_or(|id| s.provider_id == *id))
                .and_then(|s| s.last.clone())
        };
        let mut out: Vec<Machine> = members
            .iter()
            .zip(deleted)
            .map(|(mb, &deleted)| {
                if mb.deleting || deleted {
                    let mut m = mb.m.clone();
                    if !m.phase.is_deleting() {
                        m.phase = Phase::Deleting;
                    }
                    return m;
                }
                last(&mb.m.name, Some(&mb.m.provider_id)).unwrap_or_else(|| mb.m.clone())
            })
            .collect();
        for name in created {
            if !out.iter().any(|m| m.name == *name)
                && let Some(m) = last(name, None)
            {
                out.push(m);
            }
        }
        out
    }

    /// Runs the step's work, at most `concurrency` at once, and records the outcomes;
    /// returns a line per machine whose work failed.
    async fn run(&self, work: Vec<Work>, members: &[Member], template: &str) -> Vec<String> {
        let expected: HashMap<&MachineName, &Vec<Option<String>>> = members
            .iter()
            .map(|m| (&m.m.name, &m.expected_layers))
            .collect();
        let mut todo = work.into_iter();
        let mut running: FuturesUnordered<BoxFuture<'_, Outcome>> = FuturesUnordered::new();
        let mut errors = Vec::new();
        loop {
            while running.len() < self.concurrency {
                let Some(w) = todo.next() else { break };
                running.push(self.start(w, &expected));
            }
            let Some(outcome) = running.next().await else {
                break;
            };
            if let Some(e) = self.record(outcome, template) {
                errors.push(e);
            }
        }
        errors
    }

    fn start<'a>(
        &'a self,
        w: Work,
        expected: &HashMap<&MachineName, &Vec<Option<String>>>,
    ) -> BoxFuture<'a, Outcome> {
        match w {
            Work::Delete(m, why) => Box::pin(async move {
                self.composer
                    .events()
                    .emit(&m.name, Phase::Deleting, || why);
                let r = self.composer.provider().delete(&m.provider_id).await;
                Outcome::Deleted(m.name, r)
            }),
            Work::Step {
                spec,
                previous,
                in_place,
            } => {
                let expected_layers = expected.get(&spec.name).map(|v| (*v).clone());
                Box::pin(async move {
                    let r = self.composer.reconcile(&spec, previous.as_ref()).await;
                    let result = r.map(|done| done.machine);
                    let expected_layers = match (&result, expected_layers) {
                        (_, Some(e)) => e,
                        (Ok(Some(m)), None) => self.expected_layers(m),
                        _ => Vec::new(),
                    };
                    Outcome::Stepped(Box::new(Stepped {
                        name: spec.name,
                        in_place,
                        expected_layers,
                        result,
                    }))
                })
            }
            Work::Verify(m, expected_layers) => Box::pin(async move {
                let r = self.recorded_digests(&m).await;
                Outcome::Verified(Box::new(m), expected_layers, r)
            }),
            Work::Probe(m) => Box::pin(async move {
                let ok = self.probe(&m).await;
                Outcome::Probed(m.name, ok)
            }),
        }
    }

    /// The layer digests recorded on `m` (`None` where a layer has none), and the
    /// digest of the last set of layers it finished ([`revision::LAYER_SET_PATH`]), read
    /// over the composer's connector.
    async fn recorded_digests(&self, m: &Machine) -> Result<(Vec<Option<String>>, Option<String>)> {
        let layers = self.composer.bootstrapper().layers();
        let Some(connector) = self.composer.connector() else {
            return Ok((vec![None; layers.len()], None));
        };
        let transport = connector.connect(m).await?;
        let read = |path: String| {
            let transport = &transport;
            async move {
                let have = transport.read_file(&path, 1024).await?;
                Ok::<_, crate::Error>(have.map(|b| String::from_utf8_lossy(&b).trim().to_owned()))
            }
        };
        let mut recorded = Vec::with_capacity(layers.len());
        for layer in layers {
            recorded.push(read(revision::layer_digest_path(layer.name())).await?);
        }
        let set = read(revision::LAYER_SET_PATH.to_owned()).await?;
        Ok((recorded, set))
    }

    /// Whether `m` answers its probe: a connection, and the command's exit 0.
    async fn probe(&self, m: &Machine) -> bool {
        let (Some(p), Some(connector)) = (&self.set.health.probe, self.composer.connector()) else {
            return true;
        };
        let attempt = async {
            let t = connector.connect(m).await?;
            match &p.command {
                None => Ok(true),
                Some(c) => Ok(t
                    .exec(&ExecRequest::new(c.clone()).timeout(p.timeout))
                    .await?
                    .success()),
            }
        };
        matches!(
            tokio::time::timeout(p.timeout, attempt).await,
            Ok(Ok::<bool, crate::Error>(true))
        )
    }

    /// Notes an outcome in the memo; a line when it failed.
    fn record(&self, outcome: Outcome, template: &str) -> Option<String> {
        let now = Instant::now();
        let mut memo = self.lock();
        match outcome {
            Outcome::Deleted(name, r) => {
                memo.machines.remove(&name);
                r.err().map(|e| format!("delete {name} failed: {e}"))
            }
            Outcome::Stepped(stepped) => {
                let Stepped {
                    name,
                    in_place,
                    expected_layers,
                    result,
                } = *stepped;
                match result {
                    Ok(Some(m)) => {
                        let seen = memo
                            .machines
                            .entry(name.clone())
                            .or_insert_with(|| Seen::new(m.provider_id.clone()));
                        if seen.provider_id != m.provider_id {
                            *seen = Seen::new(m.provider_id.clone());
                        }
                        let failed = m.phase == Phase::Failed;
                        if m.phase == Phase::Ready {
                            seen.applied = Some(expected_layers);
                            seen.updating = false;
                        } else if in_place {
                            seen.updating = true;
                        }
                        let why = m.failure.as_ref().map(|f| f.message.clone());
                        seen.last = Some(m);
                        if failed && memo.paused.is_none() {
                            let why = format!(
                                "{name} failed: {}",
                                why.unwrap_or_else(|| "no reason given".into())
                            );
                            memo.paused = Some((template.to_owned(), why.clone()));
                            return Some(why);
                        }
                        None
                    }
                    Ok(None) => None,
                    Err(e) if crate::composer::name_taken(&e) => {
                        // Another's machine has the name: the next step takes the next one.
                        memo.taken.insert(name.clone());
                        Some(format!("{name}: {e}"))
                    }
                    Err(e) => {
                        let line = format!("{name}: {e}");
                        if !e.is_retryable()
                            && e.kind() != ErrorKind::Cancelled
                            && memo.paused.is_none()
                        {
                            // A layer that fails on a machine will fail on the next one too.
                            memo.paused = Some((template.to_owned(), line.clone()));
                            if let Some(seen) = memo.machines.get_mut(&name) {
                                seen.updating = false;
                                if let Some(last) = &mut seen.last {
                                    last.fail("UpdateFailed", e.to_string());
                                }
                            }
                        }
                        Some(line)
                    }
                }
            }
            Outcome::Verified(m, expected, r) => match r {
                Ok((recorded, set)) => {
                    let seen = memo
                        .machines
                        .entry(m.name.clone())
                        .or_insert_with(|| Seen::new(m.provider_id.clone()));
                    let changed = match set {
                        // It finished a set of layers: another set is a change, a layer
                        // added to the template included.
                        Some(set) => set != self.composer.bootstrapper().layer_set_digest(&m),
                        // On its way to its first set (or made before sets were
                        // recorded): only a layer recorded otherwise is a change.
                        None => recorded
                            .iter()
                            .zip(&expected)
                            .any(|(have, want)| have.is_some() && have != want),
                    };
                    if changed {
                        // Bootstrapped before (its layers left records) with a layer that
                        // changed since: Ready with what it has, so that its in-place
                        // update waits for its turn instead of running now.
                        let mut ready = *m;
                        ready.phase = Phase::Ready;
                        seen.last = Some(ready);
                        seen.applied = Some(recorded);
                    } else {
                        seen.verified = true;
                    }
                    None
                }
                Err(e) => Some(format!("verifying {}: {e}", m.name)),
            },
            Outcome::Probed(name, ok) => {
                let interval = self
                    .set
                    .health
                    .probe
                    .as_ref()
                    .map_or(RESYNC, |p| p.interval);
                if let Some(seen) = memo.machines.get_mut(&name) {
                    seen.next_probe = Some(now + interval);
                    if ok {
                        seen.probe_failing_since = None;
                    } else {
                        seen.probe_failing_since.get_or_insert(now);
                    }
                }
                (!ok).then(|| format!("probe of {name} failed"))
            }
        }
    }
}

/// A fleet reconciler is shared by the tasks of a controller.
impl FleetReconciler {
    /// The reconciler behind an `Arc`, for a controller's tasks.
    pub fn shared(self) -> Arc<Self> {
        Arc::new(self)
    }
}
