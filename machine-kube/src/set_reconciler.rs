//! The `MachineSet` reconciler: one [`FleetReconciler::reconcile`] step per call, the
//! set's machines shown as `Machine` objects it owns, events for the fleet's decisions,
//! the status written only when it changed, and a finalizer that scales the set to
//! zero before the object goes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, Shared};
use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use machine_core::fleet::{
    ChangeKind, FleetReconciled, FleetReconciler, FleetStatus, MAX_SET_NAME_LEN, MachineSet,
    PlannedChange, SET_LABEL, conditions as FC,
};
use machine_core::{Error, ErrorKind, Labels, Machine, MachineName, MachineSpec, Phase};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::conditions::{self as K, ConditionStatus, Conditions};
use crate::reconciler::{
    Context, FIELD_MANAGER, ReconcileError, annotated_provider, has_finalizer, is_conflict,
    merge_diff, modes, publish, put_finalizer, ready_condition, take_finalizer, to_observed,
};
use crate::resource::{AppliedSpec, MachineObject, MachineObjectSpec, MachineObjectStatus};
use crate::set_resource::{MachineSetObject, MachineSetObjectStatus, SET_NAME_LABEL, kube_field};

/// The most decision events one step records; the rest are counted in one more.
const MAX_DECISION_EVENTS: usize = 20;

/// How many `Machine` objects are written at once.
const MIRROR_CONCURRENCY: usize = 16;

/// Each set's fleet reconciler, by the object's uid.
pub(crate) type Fleets = Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Fleet>>>>>;

/// A set's fleet reconciler, what it was built from, and when it last took a step.
pub(crate) struct Fleet {
    from: Value,
    reconciler: FleetReconciler,
    last_step: Option<Instant>,
}

impl Fleet {
    fn new(from: Value, reconciler: FleetReconciler) -> Self {
        Fleet {
            from,
            reconciler,
            last_step: None,
        }
    }

    /// How long until the next step may be taken, if the last was less than the
    /// composer's poll interval ago. Each step lists the set's machines at the provider,
    /// and each status it writes brings a watch event back: without this, a set that
    /// is converging would be stepped as fast as the API server answers.
    fn too_soon(&self) -> Option<Duration> {
        let poll = self.reconciler.composer().settings().poll_interval;
        let elapsed = self.last_step?.elapsed();
        (elapsed < poll).then(|| poll - elapsed)
    }

    /// One step, noted.
    async fn step(&mut self) -> machine_core::Result<FleetReconciled> {
        self.last_step = Some(Instant::now());
        self.reconciler.reconcile().await
    }
}

impl Context {
    fn fleet(&self, uid: &str) -> Arc<tokio::sync::Mutex<Option<Fleet>>> {
        let mut fleets = self.fleets.lock().unwrap_or_else(|p| p.into_inner());
        fleets.entry(uid.to_owned()).or_default().clone()
    }

    fn forget_fleet(&self, uid: &str) {
        let mut fleets = self.fleets.lock().unwrap_or_else(|p| p.into_inner());
        fleets.remove(uid);
    }
}

/// The requeue for a failed reconcile of a set, as [`crate::error_policy`] decides it
/// for a machine.
pub fn error_policy_set(
    _obj: Arc<MachineSetObject>,
    e: &ReconcileError,
    ctx: Arc<Context>,
) -> Action {
    crate::reconciler::policy(e, &ctx)
}

pub(crate) async fn controller(
    api: Api<MachineSetObject>,
    ctx: Arc<Context>,
    shutdown: Shared<BoxFuture<'static, ()>>,
) {
    Controller::new(api, watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(reconcile_set, error_policy_set, ctx)
        .for_each(|outcome| async move {
            match outcome {
                Ok((obj, action)) => tracing::debug!(set = %obj.name, ?action, "reconciled"),
                Err(e) => tracing::warn!(error = %e, "reconcile of a set failed"),
            }
        })
        .await;
}

/// Reconciles one `MachineSet`: once it is being deleted, one fleet step toward zero
/// machines and then the finalizer off; else, if the spec can be used, the finalizer on,
/// then one fleet step toward the spec, its decisions recorded as events, the machines'
/// `Machine` objects brought in line with what the step saw, and the status written if
/// it changed. Requeued as the fleet asks (at most [`Context::with_resync`] later).
pub async fn reconcile_set(
    obj: Arc<MachineSetObject>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let ns = obj.namespace().unwrap_or_default();
    let mut w = SetWriter {
        api: Api::namespaced(ctx.client.clone(), &ns),
        machines: Api::namespaced(ctx.client.clone(), &ns),
        ctx: &ctx,
        obj: (*obj).clone(),
    };
    if obj.meta().deletion_timestamp.is_some() {
        cleanup(&mut w).await
    } else {
        apply(&mut w).await
    }
}

/// Writes the status of one set, keeping the object as the server last answered.
struct SetWriter<'a> {
    api: Api<MachineSetObject>,
    machines: Api<MachineObject>,
    ctx: &'a Context,
    obj: MachineSetObject,
}

impl SetWriter<'_> {
    fn status(&self) -> MachineSetObjectStatus {
        self.obj.status.clone().unwrap_or_default()
    }

    fn name(&self) -> String {
        self.obj.name_any()
    }

    fn uid(&self) -> String {
        self.obj.uid().unwrap_or_default()
    }

    /// Writes `status` if it differs from the stored one (see [`write_status`]), and
    /// records an event for each condition that turned bad or good again.
    async fn write(&mut self, status: MachineSetObjectStatus) -> Result<(), ReconcileError> {
        let before = self.status();
        if let Some(updated) = write_status(&self.api, &self.obj, &status).await? {
            self.obj = updated;
            self.events(&before, &status).await;
        }
        Ok(())
    }

    async fn events(&self, before: &MachineSetObjectStatus, after: &MachineSetObjectStatus) {
        for c in &after.conditions {
            let bad = |status: ConditionStatus, type_: &str| match type_ {
                FC::ROLLOUT_PAUSED | FC::REMEDIATION_PAUSED => status == ConditionStatus::True,
                FC::AVAILABLE | K::SPEC_APPLIED | K::SYNCED => status == ConditionStatus::False,
                _ => false,
            };
            let was = K::find(&before.conditions, &c.type_);
            let changed = was.is_none_or(|w| w.status != c.status || w.reason != c.reason);
            if !changed {
                continue;
            }
            let was_bad = was.is_some_and(|w| bad(w.status, &w.type_));
            if was.is_none() && c.type_ == FC::AVAILABLE {
                // A new set starts below its minimum: no news.
                continue;
            }
            let kind = if bad(c.status, &c.type_) {
                EventType::Warning
            } else if was_bad {
                EventType::Normal
            } else {
                continue;
            };
            self.event(kind, &c.reason, &c.type_, c.message.clone())
                .await;
        }
    }

    async fn event(&self, kind: EventType, reason: &str, action: &str, note: String) {
        publish(
            self.ctx,
            &self.obj.object_ref(&()),
            kind,
            reason,
            action,
            note,
        )
        .await;
    }

    /// An event for each of the fleet's decisions, at most [`MAX_DECISION_EVENTS`].
    async fn decisions(&self, decisions: &[String]) {
        for d in decisions.iter().take(MAX_DECISION_EVENTS) {
            let (kind, reason, action) = decision_event(d);
            self.event(kind, reason, action, d.clone()).await;
        }
        if decisions.len() > MAX_DECISION_EVENTS {
            let more = decisions.len() - MAX_DECISION_EVENTS;
            self.event(
                EventType::Normal,
                "MoreDecisions",
                "Reconcile",
                format!(
                    "and {more} more decisions in the same step (the controller's log has each)"
                ),
            )
            .await;
        }
    }
}

/// The event type, reason and action of one of the fleet's decision lines (`create
/// web-3-0: scale up to 5`, `delete web-0-1: replaced by web-0-2`, `update web-1-0 in
/// place: ...`, `probe of web-2-0 failed`, or a machine's error).
fn decision_event(line: &str) -> (EventType, &'static str, &'static str) {
    if line.starts_with("delete ") && line.contains(" failed: ") {
        (EventType::Warning, "DeleteFailed", "Delete")
    } else if line.starts_with("create ") {
        (EventType::Normal, "CreatingMachine", "Create")
    } else if line.starts_with("delete ") {
        (EventType::Normal, "DeletingMachine", "Delete")
    } else if line.starts_with("update ") {
        (EventType::Normal, "UpdatingInPlace", "Update")
    } else if line.starts_with("probe of ") {
        (EventType::Warning, "ProbeFailed", "Probe")
    } else {
        (EventType::Warning, "MachineError", "Reconcile")
    }
}

/// Writes `after` as `obj`'s status if it differs from the stored one: a JSON merge
/// patch of the difference (`null` for what is gone) under the resourceVersion read, so
/// that a status computed from an object that changed since is refused (409). Returns
/// the object as written, or `None` when nothing changed (an unchanged status written
/// back would trigger another reconcile, for ever).
pub(crate) async fn write_status<K, S>(api: &Api<K>, obj: &K, after: &S) -> kube::Result<Option<K>>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
    S: Serialize,
{
    let stored = serde_json::to_value(obj).unwrap_or(Value::Null);
    let before = stored.get("status").cloned().unwrap_or(Value::Null);
    let after = serde_json::to_value(after).unwrap_or(Value::Null);
    let Some(diff) = merge_diff(&before, &after) else {
        return Ok(None);
    };
    let patch = json!({
        "metadata": { "resourceVersion": obj.meta().resource_version },
        "status": diff,
    });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    api.patch_status(&obj.name_any(), &params, &Patch::Merge(&patch))
        .await
        .map(Some)
}

/// What the set's machines' `Machine` objects show of the template.
struct View {
    spec: MachineObjectSpec,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    coupled: Vec<String>,
}

impl View {
    fn applied(&self, generation: i64) -> AppliedSpec {
        AppliedSpec {
            generation,
            provider: self.spec.provider.clone(),
            layers: self.spec.layers.clone(),
            coupled_layers: self.coupled.clone(),
            machine: self.spec.machine.clone(),
        }
    }
}

async fn apply(w: &mut SetWriter<'_>) -> Result<Action, ReconcileError> {
    let generation = w.obj.metadata.generation.unwrap_or(0);
    let name = w.name();
    let spec = match w.obj.spec.read(&name) {
        Ok(spec) => spec,
        Err(e) if e.kind() == ErrorKind::InvalidSpec => return refuse(w, e).await,
        Err(e) => return fail(w, e.into()).await,
    };
    let template = w.obj.spec.template.spec.clone();
    let composer = match w
        .ctx
        .registry
        .composer(&template.provider, &template.layers)
    {
        Ok(c) => c,
        Err(e) if e.kind() == ErrorKind::InvalidSpec => {
            return refuse(w, e.within("spec.template")).await;
        }
        Err(e) => return fail(w, e.into()).await,
    };
    if spec.set.health.probe.is_some() && composer.connector().is_none() {
        let e = Error::invalid_spec(
            "spec.healthCheck.probe",
            format!(
                "provider {:?} with layers {:?} has no transport to run a probe over: take the probe out, or register the provider with a connector",
                template.provider, template.layers
            ),
        );
        return refuse(w, e).await;
    }

    let annotated = annotated_provider(&w.obj);
    if !has_finalizer(&w.obj) || annotated.as_deref() != Some(template.provider.as_str()) {
        if let Some(old) = annotated.filter(|p| *p != template.provider) {
            let running = members_at(w, &old).await?;
            if running > 0 {
                let e = Error::invalid_spec(
                    "spec.template.spec.provider",
                    format!(
                        "changed from {old:?} to {:?}, but the set's {running} machine(s) run at {old:?}: a set does not move between providers; change it back, or delete the set (its machines go with it) and create it anew",
                        template.provider
                    ),
                );
                return refuse(w, e).await;
            }
        }
        // The watch sees this write and reconciles again.
        w.obj = put_finalizer(&w.api, &w.obj, &template.provider).await?;
        return Ok(Action::await_change());
    }

    let from = json!({ "spec": w.obj.spec, "provider": template.provider });
    let slot = w.ctx.fleet(&w.uid());
    let mut fleet = slot.lock().await;
    if let Some(wait) = fleet
        .as_ref()
        .filter(|f| f.from == from)
        .and_then(Fleet::too_soon)
    {
        // A watch event right after the last step (most often of its own status
        // write): the next step comes at the fleet's pace. A spec change goes at once.
        return Ok(Action::requeue(wait));
    }
    let build = || {
        let composer = w
            .ctx
            .registry
            .build(&template.provider, &template.layers)
            .map_err(|e| e.within("spec.template"))?;
        Ok::<_, Error>((composer, spec.set.clone()))
    };
    // The set was checked by `read`; a refusal here still names the object's field.
    let in_spec = |e: Error| match e.field() {
        Some(f) if e.kind() == ErrorKind::InvalidSpec && !f.starts_with("spec.") => {
            Error::invalid_spec(kube_field(f), e.message())
        }
        _ => e,
    };
    let built = match fleet.as_mut() {
        Some(f) if f.from == from => Ok(()),
        Some(f) => build().and_then(|(c, set)| {
            f.reconciler.update(c, set).map_err(in_spec)?;
            f.from = from;
            Ok(())
        }),
        None => build().and_then(|(c, set)| {
            let reconciler = FleetReconciler::new(c, set).map_err(in_spec)?;
            // New to this process (a restart, another replica taking over): a rollout
            // the last one paused stays paused.
            reconciler.resume(&last_fleet_status(w.obj.status.as_ref()));
            *fleet = Some(Fleet::new(from, reconciler));
            Ok(())
        }),
    };
    let step = match built {
        Ok(()) => {
            let f = fleet.as_mut().expect("the fleet was just built");
            let poll = f.reconciler.composer().settings().poll_interval;
            if f.last_step.is_none() {
                // A new process (a restart, a new leader) has not looked at the set's
                // machines: its first step looks at them, and reports them as not yet
                // seen Ready. A second step reports what it saw, so that a restart does
                // not show the set unavailable for a moment.
                match f.step().await {
                    Ok(first) => f.step().await.map(|mut second| {
                        let mut decisions = first.decisions;
                        decisions.append(&mut second.decisions);
                        second.decisions = decisions;
                        (second, poll)
                    }),
                    Err(e) => Err(e),
                }
            } else {
                f.step().await.map(|step| (step, poll))
            }
        }
        Err(e) => Err(e),
    };
    drop(fleet);
    let (step, poll) = match step {
        Ok(step) => step,
        Err(e) if e.kind() == ErrorKind::InvalidSpec => return refuse(w, e).await,
        Err(e) => return fail(w, e.into()).await,
    };

    w.decisions(&step.decisions).await;
    let previous = w.status();
    let mut c = Conditions::new(&previous.conditions, Some(generation));
    fleet_conditions(&mut c, &step.status);
    c.set(
        K::SPEC_APPLIED,
        ConditionStatus::True,
        K::REASON_APPLIED,
        format!("the fleet works toward generation {generation} of the spec"),
        None,
    );
    c.set(
        K::SYNCED,
        ConditionStatus::True,
        K::REASON_RECONCILED,
        "the last reconcile went through",
        None,
    );
    let status = counts(
        MachineSetObjectStatus {
            observed_generation: Some(generation),
            selector: Some(spec.selector.clone()),
            conditions: c.list,
            ..MachineSetObjectStatus::default()
        },
        &step.status,
    );
    w.write(status).await?;
    let view = View {
        coupled: modes(&template.layers, &composer).0,
        labels: w.obj.spec.template.metadata.labels.clone(),
        annotations: w.obj.spec.template.metadata.annotations.clone(),
        spec: template,
    };
    mirror(w, Some(&view), &step).await?;
    let mut after = step
        .action
        .requeue_after()
        .unwrap_or(w.ctx.resync)
        .min(w.ctx.resync);
    if step.machines.iter().any(|m| m.phase == Phase::Deleting) {
        // The fleet is steady once the machines it keeps serve; the objects of those
        // still going are taken away once they are gone, at the provider's pace.
        after = after.min(poll);
    }
    Ok(Action::requeue(after))
}

/// What [`FleetReconciler::resume`] reads of the fleet's last status, from the object's.
fn last_fleet_status(status: Option<&MachineSetObjectStatus>) -> FleetStatus {
    let mut last = FleetStatus::default();
    if let Some(s) = status {
        last.observed_revision = s.observed_revision.clone().unwrap_or_default();
        last.conditions = s
            .conditions
            .iter()
            .filter(|c| c.type_ == FC::ROLLOUT_PAUSED)
            .map(|c| {
                machine_core::Condition::now(
                    &c.type_,
                    c.status == ConditionStatus::True,
                    &c.reason,
                    c.message.clone(),
                )
            })
            .collect();
    }
    last
}

/// The counts of `fleet` in `status`.
fn counts(mut status: MachineSetObjectStatus, fleet: &FleetStatus) -> MachineSetObjectStatus {
    let n = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
    status.replicas = n(fleet.replicas);
    status.ready_replicas = n(fleet.ready);
    status.updated_replicas = n(fleet.updated);
    status.available_replicas = n(fleet.available);
    status.unavailable_replicas = n(fleet.unavailable);
    status.unhealthy_replicas = n(fleet.unhealthy);
    status.observed_revision = Some(fleet.observed_revision.clone());
    status
}

/// The fleet's conditions (`Available`, `Progressing`, `RolloutPaused`,
/// `RemediationPaused`) as Kubernetes conditions.
fn fleet_conditions(c: &mut Conditions<'_>, fleet: &FleetStatus) {
    for f in &fleet.conditions {
        c.set(&f.kind, f.status.into(), &f.reason, f.message.clone(), None);
    }
}

/// How many machines of the set the provider `provider` runs (0 if the registry does
/// not know it: nothing can be seen there).
async fn members_at(w: &SetWriter<'_>, provider: &str) -> Result<usize, ReconcileError> {
    let Ok(composer) = w.ctx.registry.composer(provider, &[]) else {
        return Ok(0);
    };
    let selector = Labels::from([(SET_LABEL.to_owned(), w.name())]);
    let listed = composer.provider().list(&selector).await?;
    Ok(listed.iter().filter(|m| !m.phase.is_deleting()).count())
}

/// The spec cannot be used: say why, naming the field, and wait for it to change.
/// Nothing is made from it (a set refused before its first step has no finalizer).
async fn refuse(w: &mut SetWriter<'_>, e: Error) -> Result<Action, ReconcileError> {
    let previous = w.status();
    let generation = w.obj.metadata.generation;
    let mut c = Conditions::new(&previous.conditions, generation);
    c.set(
        K::SPEC_APPLIED,
        ConditionStatus::False,
        K::REASON_INVALID_SPEC,
        e.to_string(),
        None,
    );
    c.set(
        K::SYNCED,
        ConditionStatus::True,
        K::REASON_RECONCILED,
        "the last reconcile went through",
        None,
    );
    for p in &previous.conditions {
        c.keep(&p.type_);
    }
    let status = MachineSetObjectStatus {
        observed_generation: generation,
        conditions: c.list,
        spec_error: Some(e.to_string()),
        ..previous
    };
    w.write(status).await?;
    Ok(Action::await_change())
}

/// A reconcile failed for another reason than the spec: say so in `Synced` (an API
/// failure is not written: the next reconcile reads the object again).
async fn fail(w: &mut SetWriter<'_>, e: ReconcileError) -> Result<Action, ReconcileError> {
    let reason = match &e {
        ReconcileError::Machine(m) => format!("{:?}", m.kind()),
        _ => return Err(e),
    };
    let previous = w.status();
    let mut c = Conditions::new(&previous.conditions, w.obj.metadata.generation);
    c.set(
        K::SYNCED,
        ConditionStatus::False,
        &reason,
        e.to_string(),
        None,
    );
    for p in &previous.conditions {
        c.keep(&p.type_);
    }
    let status = MachineSetObjectStatus {
        conditions: c.list,
        ..previous
    };
    if let Err(write) = w.write(status).await {
        tracing::warn!(set = %w.name(), error = %write, "writing the error to the status failed");
    }
    Err(e)
}

/// One step toward none of the set's machines (the fleet scaled to zero, through a
/// composer of the provider the set's machines were made at), their objects with them,
/// then the finalizer off.
async fn cleanup(w: &mut SetWriter<'_>) -> Result<Action, ReconcileError> {
    if !has_finalizer(&w.obj) {
        return Ok(Action::await_change());
    }
    let name = w.name();
    let provider =
        annotated_provider(&w.obj).unwrap_or_else(|| w.obj.spec.template.spec.provider.clone());
    let machine_name = MachineName::new(name.as_str())
        .ok()
        .filter(|_| name.len() <= MAX_SET_NAME_LEN);
    let Some(machine_name) = machine_name else {
        // No machine is made for a set whose name is not a set name.
        take_finalizer(&w.api, &w.obj).await?;
        w.event(
            EventType::Normal,
            "Deleted",
            "Delete",
            format!("no machine can be made for a set named {name:?}: nothing to delete"),
        )
        .await;
        return Ok(Action::await_change());
    };
    let composer = match w.ctx.registry.build(&provider, &[]) {
        Ok(c) => c,
        Err(e) => {
            let why = format!(
                "the set's machines cannot be deleted: provider {provider:?} is not registered with this controller ({e}); register it again, or delete the machines labelled {SET_LABEL}={name} at the provider by hand and then remove the finalizer {}",
                crate::FINALIZER
            );
            let previous = w.status();
            let mut c = Conditions::new(&previous.conditions, w.obj.metadata.generation);
            c.set(
                K::SYNCED,
                ConditionStatus::False,
                K::REASON_CLEANUP_BLOCKED,
                why,
                None,
            );
            for p in &previous.conditions {
                c.keep(&p.type_);
            }
            let status = MachineSetObjectStatus {
                conditions: c.list,
                ..previous
            };
            w.write(status).await?;
            return Ok(Action::requeue(w.ctx.resync));
        }
    };
    let poll = composer.settings().poll_interval;
    let none = MachineSet::new(name.as_str(), 0, MachineSpec::new(machine_name));
    let slot = w.ctx.fleet(&w.uid());
    let mut fleet = slot.lock().await;
    if let Some(wait) = fleet
        .as_ref()
        .filter(|f| f.from.is_null())
        .and_then(Fleet::too_soon)
    {
        return Ok(Action::requeue(wait));
    }
    let built = match fleet.as_mut() {
        Some(f) if f.from.is_null() => Ok(()),
        Some(f) => f
            .reconciler
            .update(composer, none)
            .map(|()| f.from = Value::Null),
        None => FleetReconciler::new(composer, none)
            .map(|reconciler| *fleet = Some(Fleet::new(Value::Null, reconciler))),
    };
    let step = match built {
        Ok(()) => {
            fleet
                .as_mut()
                .expect("the fleet was just built")
                .step()
                .await
        }
        Err(e) => Err(e),
    };
    drop(fleet);
    let step = match step {
        Ok(step) => step,
        Err(e) => return fail(w, e.into()).await,
    };
    w.decisions(&step.decisions).await;
    mirror(w, None, &step).await?;
    if step.machines.iter().all(|m| m.phase == Phase::Deleted) {
        take_finalizer(&w.api, &w.obj).await?;
        w.ctx.forget_fleet(&w.uid());
        w.event(
            EventType::Normal,
            "Deleted",
            "Delete",
            format!("the machines of set {name} are gone"),
        )
        .await;
        return Ok(Action::await_change());
    }
    let previous = w.status();
    let mut c = Conditions::new(&previous.conditions, w.obj.metadata.generation);
    fleet_conditions(&mut c, &step.status);
    c.set(
        K::SYNCED,
        ConditionStatus::True,
        K::REASON_RECONCILED,
        format!(
            "the set is being deleted: {} machine(s) still going",
            step.machines.len()
        ),
        None,
    );
    for p in &previous.conditions {
        c.keep(&p.type_);
    }
    let status = counts(
        MachineSetObjectStatus {
            conditions: c.list,
            ..previous
        },
        &step.status,
    );
    w.write(status).await?;
    // A fleet whose machines are all going is steady for the reconciler; look again
    // at the provider's pace until they are gone.
    let after = step.action.requeue_after().unwrap_or(poll).min(poll);
    Ok(Action::requeue(after))
}

/// Whether `obj` is one of the set's `Machine` objects: its controller is the set of
/// `uid`.
fn owned_by(obj: &MachineObject, uid: &str) -> bool {
    obj.owner_references()
        .iter()
        .any(|r| r.controller == Some(true) && r.uid == uid)
}

/// Brings the set's `Machine` objects in line with the step's machines: one per
/// machine (created, its spec and template labels kept as the template's, its status
/// written if it changed), none for a machine that is gone. With `view` `None` (the set
/// is being deleted) no object is created and no spec changed.
async fn mirror(
    w: &SetWriter<'_>,
    view: Option<&View>,
    step: &FleetReconciled,
) -> Result<(), ReconcileError> {
    let uid = w.uid();
    let params = ListParams::default().labels(&format!("{SET_NAME_LABEL}={}", w.name()));
    let mut owned: HashMap<String, MachineObject> = w
        .machines
        .list(&params)
        .await?
        .items
        .into_iter()
        .filter(|o| owned_by(o, &uid))
        .map(|o| (o.name_any(), o))
        .collect();
    let changes: HashMap<&str, &PlannedChange> = step
        .changes
        .iter()
        .filter_map(|c| Some((c.machine.as_ref()?.as_str(), c)))
        .collect();
    let mut shown = Vec::new();
    for m in &step.machines {
        if m.phase == Phase::Deleted {
            continue;
        }
        let existing = owned.remove(m.name.as_str());
        if existing.is_none() && (view.is_none() || m.phase.is_deleting()) {
            continue;
        }
        shown.push((m, changes.get(m.name.as_str()).copied(), existing));
    }
    // Boxed first: a stream of closures over borrowed items trips the compiler's
    // higher-ranked lifetimes in a Send future.
    let shows: Vec<BoxFuture<'_, Result<(), ReconcileError>>> = shown
        .into_iter()
        .map(|(m, change, existing)| {
            Box::pin(show(w, view, m, change, existing)) as BoxFuture<'_, _>
        })
        .collect();
    futures_util::stream::iter(shows)
        .buffer_unordered(MIRROR_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    // What is left is the object of a machine that is gone.
    let deletes: Vec<BoxFuture<'_, Result<(), ReconcileError>>> = owned
        .into_values()
        .map(|o| {
            Box::pin(async move {
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: o.uid(),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                match w.machines.delete(&o.name_any(), &params).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
                    Err(e) => Err(ReconcileError::from(e)),
                }
            }) as BoxFuture<'_, _>
        })
        .collect();
    futures_util::stream::iter(deletes)
        .buffer_unordered(MIRROR_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// The `Machine` object of `m`: made if `existing` is `None`, its spec and labels set to
/// the template's, its status written if it changed.
async fn show(
    w: &SetWriter<'_>,
    view: Option<&View>,
    m: &Machine,
    change: Option<&PlannedChange>,
    existing: Option<MachineObject>,
) -> Result<(), ReconcileError> {
    let obj = match (existing, view) {
        (Some(o), Some(view)) => keep_in_line(w, o, view).await?,
        (Some(o), None) => o,
        (None, Some(view)) => {
            let mut labels = view.labels.clone();
            labels.insert(SET_NAME_LABEL.to_owned(), w.name());
            let object = MachineObject {
                metadata: ObjectMeta {
                    name: Some(m.name.to_string()),
                    namespace: w.obj.namespace(),
                    labels: Some(labels),
                    annotations: (!view.annotations.is_empty()).then(|| view.annotations.clone()),
                    // Garbage collection deletes the object once the set is gone; a
                    // foreground deletion of the set waits for it.
                    owner_references: w.obj.controller_owner_ref(&()).map(|r| {
                        vec![OwnerReference {
                            block_owner_deletion: Some(true),
                            ..r
                        }]
                    }),
                    ..ObjectMeta::default()
                },
                spec: view.spec.clone(),
                status: None,
            };
            match w.machines.create(&PostParams::default(), &object).await {
                Ok(o) => o,
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    // A Machine object of that name that is not the set's: left alone.
                    w.event(
                        EventType::Warning,
                        "NameTaken",
                        "Mirror",
                        format!(
                            "machine {} of the set cannot be shown: a Machine object of that name exists and is not the set's",
                            m.name
                        ),
                    )
                    .await;
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            }
        }
        (None, None) => return Ok(()),
    };
    let generation = obj.metadata.generation.unwrap_or(1);
    let status = machine_status(obj.status.as_ref(), generation, m, change, view);
    match write_status(&w.machines, &obj, &status).await {
        Ok(_) => Ok(()),
        // Changed under us (by hand, or another writer): the next step writes again.
        Err(e) if is_conflict(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// `obj` with the template's spec, labels and annotations (added or changed; labels put
/// on by hand stay).
async fn keep_in_line(
    w: &SetWriter<'_>,
    obj: MachineObject,
    view: &View,
) -> Result<MachineObject, ReconcileError> {
    let spec_diff = merge_diff(
        &serde_json::to_value(&obj.spec).unwrap_or(Value::Null),
        &serde_json::to_value(&view.spec).unwrap_or(Value::Null),
    );
    let missing = |want: &BTreeMap<String, String>, have: &BTreeMap<String, String>| {
        want.iter()
            .filter(|(k, v)| have.get(*k) != Some(v))
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect::<serde_json::Map<String, Value>>()
    };
    let labels = missing(&view.labels, obj.labels());
    let annotations = missing(&view.annotations, obj.annotations());
    if spec_diff.is_none() && labels.is_empty() && annotations.is_empty() {
        return Ok(obj);
    }
    let mut patch = json!({ "metadata": { "resourceVersion": obj.resource_version() } });
    if let Some(d) = spec_diff {
        patch["spec"] = d;
    }
    if !labels.is_empty() {
        patch["metadata"]["labels"] = Value::Object(labels);
    }
    if !annotations.is_empty() {
        patch["metadata"]["annotations"] = Value::Object(annotations);
    }
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    Ok(w.machines
        .patch(&obj.name_any(), &params, &Patch::Merge(&patch))
        .await?)
}

/// The status of a set's machine's object: the machine, `Ready`, `SpecApplied` (the
/// machine is what the template asks, or what the set does about it) and the machine's
/// own conditions; `applied` is the template once the machine is what it asks, else
/// what was recorded before.
fn machine_status(
    previous: Option<&MachineObjectStatus>,
    generation: i64,
    m: &Machine,
    change: Option<&PlannedChange>,
    view: Option<&View>,
) -> MachineObjectStatus {
    let before: &[K::Condition] = previous.map_or(&[], |p| &p.conditions);
    let mut c = Conditions::new(before, Some(generation));
    ready_condition(&mut c, m);
    let recorded = previous.and_then(|p| p.applied.clone());
    let mut applied = recorded.clone();
    match (view, change) {
        (None, _) => c.keep(K::SPEC_APPLIED),
        (Some(_), Some(ch)) => {
            let (reason, message) = match ch.kind {
                ChangeKind::Replace => (
                    K::REASON_NEEDS_NEW_MACHINE,
                    format!("the set replaces this machine: {}", ch.reason),
                ),
                ChangeKind::UpdateInPlace => (
                    K::REASON_APPLYING,
                    format!("the set updates this machine in place: {}", ch.reason),
                ),
                _ => (
                    "ScalingDown",
                    format!("the set deletes this machine: {}", ch.reason),
                ),
            };
            c.set(
                K::SPEC_APPLIED,
                ConditionStatus::False,
                reason,
                message,
                None,
            );
        }
        (Some(v), None) if m.phase == Phase::Ready => {
            c.set(
                K::SPEC_APPLIED,
                ConditionStatus::True,
                K::REASON_APPLIED,
                "the machine is what the set's template asks",
                None,
            );
            applied = Some(v.applied(generation));
        }
        (Some(v), None) => {
            if K::find(before, K::SPEC_APPLIED).is_some() {
                c.keep(K::SPEC_APPLIED);
            } else {
                c.set(
                    K::SPEC_APPLIED,
                    ConditionStatus::False,
                    K::REASON_APPLYING,
                    "the machine is being made from the set's template",
                    None,
                );
            }
            if recorded.is_none() && !m.phase.is_deleting() {
                applied = Some(v.applied(generation));
            }
        }
    }
    c.machine(m);
    MachineObjectStatus {
        observed_generation: Some(generation),
        conditions: c.list,
        machine: Some(to_observed(m)),
        applied,
        spec_error: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_lines_become_events_of_their_kind() {
        let kinds = [
            ("create web-3-0: scale up to 5", "CreatingMachine"),
            ("delete web-0-1: replaced by web-0-2", "DeletingMachine"),
            ("delete web-0-1 failed: permanent: no", "DeleteFailed"),
            (
                "update web-1-0 in place: a decoupled layer changed",
                "UpdatingInPlace",
            ),
            ("probe of web-2-0 failed", "ProbeFailed"),
            ("web-2-0: transient: reset", "MachineError"),
        ];
        for (line, reason) in kinds {
            assert_eq!(decision_event(line).1, reason, "{line}");
        }
    }
}
