//! The reconciler: one [`Composer::reconcile`] step per call, the status written only
//! when it changed (as a merge patch that clears what is gone), spec changes applied or
//! refused with a reason, deletion behind a finalizer that is only put where the
//! controller can take it off again, events for what it decided.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{BoxFuture, Shared};
use futures_util::{FutureExt, StreamExt};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use machine_core::{Composer, ErrorKind, Machine, MachineName, MachineSpec, Mode, Phase};
use serde_json::{Value, json};

use crate::conditions::{self as K, ConditionStatus, Conditions};
use crate::leader::{Elector, LeaderElection};
use crate::registry::Registry;
use crate::resource::{
    AppliedSpec, FINALIZER, MachineAccess, MachineObject, MachineObjectStatus, ObservedMachine,
    PROVIDER_ANNOTATION, machine_spec,
};

/// The field manager the controller writes as, and its name in events.
pub const FIELD_MANAGER: &str = "machine-kube";

/// The label every machine this controller makes carries: the uid of the `Machine`
/// object it was made for. A machine of the same name made for another object (in
/// another namespace: names are per provider, not per namespace) or by a `MachineSet`
/// is neither adopted nor deleted.
pub const OBJECT_LABEL: &str = "machine-kube/object";

/// Whether `m` was made for another object than the one of `uid` (or by a fleet).
fn foreign(m: &Machine, uid: &str) -> Option<String> {
    if let Some(set) = m.labels.get(machine_core::fleet::SET_LABEL) {
        return Some(format!("it belongs to the machine set {set:?}"));
    }
    match m.labels.get(OBJECT_LABEL) {
        Some(other) if other != uid => Some(format!(
            "it was made for another Machine object (uid {other}), in another namespace or before this one was made"
        )),
        _ => None,
    }
}

/// How often a Ready machine is looked at again without any change of its object, so
/// that a machine deleted or broken behind the controller's back is noticed.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(300);

/// What every reconcile shares.
pub struct Context {
    pub(crate) client: Client,
    pub(crate) registry: Registry,
    pub(crate) resync: Duration,
    reporter: Reporter,
    pub(crate) leader: Option<LeaderElection>,
    /// Each `MachineSet`'s fleet reconciler, by the object's uid: what it remembers
    /// between steps (machines seen Ready, a paused rollout) only saves calls, so a
    /// restarted controller starts empty.
    pub(crate) fleets: crate::set_reconciler::Fleets,
}

impl Context {
    /// A context reconciling with `client` and the composers of `registry`, resyncing
    /// settled machines every [`DEFAULT_RESYNC`], recording events as `machine-kube`
    /// on this host, without leader election (one replica).
    pub fn new(client: Client, registry: Registry) -> Self {
        Context {
            client,
            registry,
            resync: DEFAULT_RESYNC,
            reporter: Reporter::from(FIELD_MANAGER),
            leader: None,
            fleets: Default::default(),
        }
    }

    /// Sets how often a settled (Ready or Failed) machine is looked at again.
    pub fn with_resync(mut self, resync: Duration) -> Self {
        self.resync = resync;
        self
    }

    /// Runs [`run`] behind `election`: only the replica holding its Lease reconciles,
    /// and the events name this replica's identity.
    pub fn with_leader_election(mut self, election: LeaderElection) -> Self {
        self.reporter = Reporter {
            controller: FIELD_MANAGER.to_owned(),
            instance: Some(election.identity().to_owned()),
        };
        self.leader = Some(election);
        self
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("registry", &self.registry)
            .field("resync", &self.resync)
            .field("leader", &self.leader)
            .finish_non_exhaustive()
    }
}

/// Why a reconcile did not finish; [`error_policy`] turns it into a requeue.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The composer or provider failed; its kind decides the requeue.
    #[error(transparent)]
    Machine(#[from] machine_core::Error),
    /// The Kubernetes API failed (a 409 Conflict when the object changed since it was
    /// read: the next reconcile reads it again).
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The machine is being deleted; the finalizer stays until it is gone.
    #[error("machine {name} is still being deleted")]
    StillDeleting {
        /// The machine.
        name: String,
        /// When to look again.
        after: Duration,
    },
}

/// The requeue for a failed reconcile: the machine error's own policy
/// ([`machine_core::Action::for_error`]), the deletion's poll, a quick look again after
/// a conflict (the object changed under the reconcile), or a short retry for the API.
pub fn error_policy(_obj: Arc<MachineObject>, e: &ReconcileError, ctx: Arc<Context>) -> Action {
    policy(e, &ctx)
}

/// The requeue for `e`, whatever the object.
pub(crate) fn policy(e: &ReconcileError, ctx: &Context) -> Action {
    let poll = Duration::from_secs(5).min(ctx.resync);
    match e {
        ReconcileError::Machine(e) => to_kube(machine_core::Action::for_error(e, poll), ctx.resync),
        ReconcileError::StillDeleting { after, .. } => Action::requeue(*after),
        ReconcileError::Kube(e) if is_conflict(e) => Action::requeue(Duration::from_millis(200)),
        ReconcileError::Kube(_) => Action::requeue(poll),
    }
}

pub(crate) fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Runs the controller for every `Machine` object `api` sees until the process gets
/// SIGINT or SIGTERM, logging each reconcile's outcome; behind the context's leader
/// election if it has one.
pub async fn run(api: Api<MachineObject>, ctx: Arc<Context>) {
    run_until(api, ctx, shutdown_signal()).await;
}

/// [`run`] until `shutdown` completes, when reconciles in flight finish and a leader
/// gives its Lease up, so that another replica takes over at once.
///
/// With leader election, a replica waits until it holds the Lease, then runs the
/// controller while it keeps renewing it; once a renewal has not gone through within
/// the renew deadline it stops the controller at once, reconciles in flight included,
/// and waits to lead again.
pub async fn run_until(
    api: Api<MachineObject>,
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let shutdown = shutdown.boxed().shared();
    let c = ctx.clone();
    elected(&ctx, shutdown, move |stop| {
        controller(api.clone(), c.clone(), stop)
    })
    .await;
}

/// Runs the `Machine` and the `MachineSet` controllers (one process, one leader
/// election for both) until the process gets SIGINT or SIGTERM.
pub async fn run_all(
    machines: Api<MachineObject>,
    sets: Api<crate::MachineSetObject>,
    ctx: Arc<Context>,
) {
    run_all_until(machines, sets, ctx, shutdown_signal()).await;
}

/// [`run_all`] until `shutdown` completes, as [`run_until`] does for one controller.
pub async fn run_all_until(
    machines: Api<MachineObject>,
    sets: Api<crate::MachineSetObject>,
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let shutdown = shutdown.boxed().shared();
    let c = ctx.clone();
    elected(&ctx, shutdown, move |stop| {
        let machines = controller(machines.clone(), c.clone(), stop.clone());
        let sets = crate::set_reconciler::controller(sets.clone(), c.clone(), stop);
        async move {
            futures_util::future::join(machines, sets).await;
        }
    })
    .await;
}

/// Runs `controllers` until `shutdown`; with leader election, only while this replica
/// leads.
async fn elected<F, Fut>(
    ctx: &Arc<Context>,
    shutdown: Shared<BoxFuture<'static, ()>>,
    controllers: F,
) where
    F: Fn(Shared<BoxFuture<'static, ()>>) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(election) = ctx.leader.clone() else {
        controllers(shutdown).await;
        return;
    };
    let mut elector = Elector::new(ctx.client.clone(), election);
    loop {
        let acquired_at = tokio::select! {
            at = elector.acquire() => at,
            () = shutdown.clone() => return,
        };
        tokio::select! {
            () = controllers(shutdown.clone()) => {
                elector.release().await;
                return;
            }
            // Lost: the controllers are dropped here, with every reconcile in flight.
            () = elector.keep(acquired_at) => {}
        }
    }
}

async fn controller(
    api: Api<MachineObject>,
    ctx: Arc<Context>,
    shutdown: Shared<BoxFuture<'static, ()>>,
) {
    Controller::new(api, watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|outcome| async move {
            match outcome {
                Ok((obj, action)) => tracing::debug!(object = %obj.name, ?action, "reconciled"),
                Err(e) => tracing::warn!(error = %e, "reconcile failed"),
            }
        })
        .await;
}

pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

/// Reconciles one object: once it is being deleted, one step toward its machine being
/// gone and then the finalizer off; else, if the spec can be used, the finalizer on,
/// then one composer step toward what the spec asks, and the status written if it
/// changed.
pub async fn reconcile(
    obj: Arc<MachineObject>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    if controlled_by_set(&obj) {
        // A view the MachineSet controller writes from its fleet; its machine is the
        // fleet's to drive.
        return Ok(Action::await_change());
    }
    let ns = obj.namespace().unwrap_or_default();
    let mut w = Writer {
        api: Api::namespaced(ctx.client.clone(), &ns),
        ctx: &ctx,
        obj: (*obj).clone(),
    };
    if obj.meta().deletion_timestamp.is_some() {
        cleanup(&mut w).await
    } else {
        apply(&mut w).await
    }
}

/// Whether a `MachineSet` controls the object (its controller owner reference names
/// one of this group).
pub(crate) fn controlled_by_set(obj: &MachineObject) -> bool {
    obj.owner_references().iter().any(|r| {
        r.controller == Some(true)
            && r.kind == "MachineSet"
            && r.api_version.starts_with(&format!("{}/", crate::GROUP))
    })
}

/// Writes the status of one object, keeping the object as the server last answered.
struct Writer<'a> {
    api: Api<MachineObject>,
    ctx: &'a Context,
    obj: MachineObject,
}

impl Writer<'_> {
    fn status(&self) -> MachineObjectStatus {
        self.obj.status.clone().unwrap_or_default()
    }

    fn name(&self) -> String {
        self.obj.name_any()
    }

    /// Writes `status` if it differs from the stored one: a JSON merge patch (RFC 7386)
    /// of the difference, with `null` for every field that is gone (a merge patch keeps
    /// what it does not mention), and the resourceVersion read, so that a status
    /// computed from an object that changed since is refused (409) instead of
    /// clearing or keeping the wrong fields. Nothing is sent when nothing changed: an
    /// unchanged status written back would trigger another reconcile, for ever.
    async fn write(&mut self, status: MachineObjectStatus) -> Result<(), ReconcileError> {
        let before = match &self.obj.status {
            Some(s) => serde_json::to_value(s).unwrap_or(Value::Null),
            None => Value::Null,
        };
        let after = serde_json::to_value(&status).unwrap_or(Value::Null);
        let Some(diff) = merge_diff(&before, &after) else {
            return Ok(());
        };
        let patch = json!({
            "metadata": { "resourceVersion": self.obj.resource_version() },
            "status": diff,
        });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let updated = self
            .api
            .patch_status(&self.name(), &params, &Patch::Merge(&patch))
            .await?;
        let previous = std::mem::replace(&mut self.obj, updated);
        self.events(&previous.status.unwrap_or_default(), &status)
            .await;
        Ok(())
    }

    /// Records an event for each decision the new status shows: the machine created,
    /// and each change of reason of the controller's conditions (and duplicates found).
    async fn events(&self, before: &MachineObjectStatus, after: &MachineObjectStatus) {
        if before.machine.is_none()
            && let Some(m) = &after.machine
        {
            self.event(
                EventType::Normal,
                "Created",
                "Create",
                format!("created machine {}", m.provider_id),
            )
            .await;
        }
        for c in &after.conditions {
            let was = K::find(&before.conditions, &c.type_);
            let changed = was.is_none_or(|w| w.status != c.status || w.reason != c.reason);
            let controllers = matches!(c.type_.as_str(), K::READY | K::SPEC_APPLIED | K::SYNCED);
            if !changed || !(controllers || c.type_ == machine_core::conditions::DUPLICATES) {
                continue;
            }
            let warning = match (c.type_.as_str(), c.status) {
                (K::SYNCED, ConditionStatus::False) => true,
                (K::SPEC_APPLIED, ConditionStatus::False) => c.reason != K::REASON_APPLYING,
                (K::READY, ConditionStatus::False) => c.reason == "Failed",
                (t, ConditionStatus::True) => t == machine_core::conditions::DUPLICATES,
                _ => false,
            };
            // SpecApplied and Synced first set true say nothing an event would add; a
            // machine Ready at its first look is news.
            let first_and_good = was.is_none()
                && c.status == ConditionStatus::True
                && matches!(c.type_.as_str(), K::SPEC_APPLIED | K::SYNCED);
            if first_and_good || c.status == ConditionStatus::Unknown {
                continue;
            }
            let kind = if warning {
                EventType::Warning
            } else {
                EventType::Normal
            };
            self.event(kind, &c.reason, &c.type_, c.message.clone())
                .await;
        }
    }

    /// Publishes one event; a failure is logged, never the reconcile's.
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
}

/// Publishes one event about `object`; a failure is logged, never the reconcile's.
pub(crate) async fn publish(
    ctx: &Context,
    object: &k8s_openapi::api::core::v1::ObjectReference,
    kind: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = Event {
        type_: kind,
        reason: K::truncate(reason.to_owned(), 128),
        note: Some(K::truncate(note, 1024)),
        action: K::truncate(action.to_owned(), 128),
        secondary: None,
    };
    // A recorder per event: kube's Recorder walks its whole cache of recent events on
    // every publish, which with thousands of objects cost more than the reconcile
    // itself; events here mark transitions and decisions, so a series is seldom due.
    let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
    if let Err(e) = recorder.publish(&event, object).await {
        let name = object.name.as_deref().unwrap_or_default();
        tracing::warn!(object = %name, error = %e, "recording an event failed");
    }
}

/// The RFC 7386 merge patch that turns `from` into `to`, or `None` when they are equal:
/// members of `to` that changed, `null` for members of `from` that `to` lacks.
pub(crate) fn merge_diff(from: &Value, to: &Value) -> Option<Value> {
    if from == to {
        return None;
    }
    match (from, to) {
        (Value::Object(a), Value::Object(b)) => {
            let mut patch = serde_json::Map::new();
            for (k, va) in a {
                match b.get(k) {
                    None => {
                        patch.insert(k.clone(), Value::Null);
                    }
                    Some(vb) => {
                        if let Some(d) = merge_diff(va, vb) {
                            patch.insert(k.clone(), d);
                        }
                    }
                }
            }
            for (k, vb) in b {
                if !a.contains_key(k) {
                    patch.insert(k.clone(), vb.clone());
                }
            }
            Some(Value::Object(patch))
        }
        _ => Some(to.clone()),
    }
}

/// What the object's spec asks for, checked: the name, the machine spec, the composer.
struct Wanted {
    spec: MachineSpec,
    composer: Arc<Composer>,
    provider: String,
    layers: Vec<String>,
    coupled: Vec<String>,
    decoupled: Vec<String>,
    machine: Value,
}

impl Wanted {
    fn of(obj: &MachineObject, registry: &Registry) -> machine_core::Result<Wanted> {
        let spec = obj.spec.machine_spec(&obj.name_any())?;
        let composer = registry.composer(&obj.spec.provider, &obj.spec.layers)?;
        let (coupled, decoupled) = modes(&obj.spec.layers, &composer);
        Ok(Wanted {
            spec,
            composer,
            provider: obj.spec.provider.clone(),
            layers: obj.spec.layers.clone(),
            coupled,
            decoupled,
            machine: obj.spec.machine.clone(),
        })
    }

    fn applied(&self, generation: i64) -> AppliedSpec {
        AppliedSpec {
            generation,
            provider: self.provider.clone(),
            layers: self.layers.clone(),
            coupled_layers: self.coupled.clone(),
            machine: self.machine.clone(),
        }
    }
}

/// The spec's layer names split by the mode of the composer's layer at the same place.
/// A factory that does not build one layer per name leaves no way to tell: every layer
/// counts as coupled then, so that any change of them asks for a new machine.
pub(crate) fn modes(names: &[String], composer: &Composer) -> (Vec<String>, Vec<String>) {
    let layers = composer.layers();
    if layers.len() != names.len() {
        return (names.to_vec(), Vec::new());
    }
    let (coupled, decoupled): (Vec<_>, Vec<_>) = names
        .iter()
        .zip(layers)
        .partition(|(_, l)| l.mode() == Mode::Coupled);
    (
        coupled.into_iter().map(|(n, _)| n.clone()).collect(),
        decoupled.into_iter().map(|(n, _)| n.clone()).collect(),
    )
}

/// How the spec differs from what the machine was made from.
enum Change {
    /// Nothing the machine would show.
    None,
    /// Decoupled layers added: applied to the running machine.
    InPlace(Vec<String>),
    /// A change a machine that exists cannot take; why.
    NeedsNewMachine(String),
}

fn classify(a: &AppliedSpec, w: &Wanted) -> Change {
    let needs = |why: String| {
        Change::NeedsNewMachine(format!(
            "{why}; the machine keeps what it was made from: delete and re-create the object for a machine with this spec"
        ))
    };
    if a.provider != w.provider {
        return needs(format!(
            "spec.provider changed from {:?} to {:?}",
            a.provider, w.provider
        ));
    }
    if a.machine != w.machine {
        let empty = serde_json::Map::new();
        let (old, new) = (
            a.machine.as_object().unwrap_or(&empty),
            w.machine.as_object().unwrap_or(&empty),
        );
        let mut fields: Vec<&String> = old
            .keys()
            .chain(new.keys())
            .filter(|k| old.get(*k) != new.get(*k))
            .collect();
        fields.sort();
        fields.dedup();
        let named: Vec<String> = fields.iter().map(|f| format!("spec.machine.{f}")).collect();
        return needs(format!("{} changed", named.join(", ")));
    }
    if a.coupled_layers != w.coupled {
        return needs(format!(
            "the coupled layers changed from {:?} to {:?} (they went into the machine's user data when it was created)",
            a.coupled_layers, w.coupled
        ));
    }
    let had: Vec<&String> = a
        .layers
        .iter()
        .filter(|l| !a.coupled_layers.contains(l))
        .collect();
    if let Some(gone) = had.iter().find(|l| !w.decoupled.contains(l)) {
        return needs(format!(
            "layer {gone:?} was taken out of spec.layers, and machine-kube does not take software off a machine"
        ));
    }
    let added: Vec<String> = w
        .decoupled
        .iter()
        .filter(|l| !had.contains(l))
        .cloned()
        .collect();
    if added.is_empty() {
        Change::None
    } else {
        Change::InPlace(added)
    }
}

pub(crate) fn has_finalizer(obj: &impl Resource) -> bool {
    obj.meta()
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

pub(crate) fn annotated_provider(obj: &impl Resource) -> Option<String> {
    obj.meta()
        .annotations
        .as_ref()?
        .get(PROVIDER_ANNOTATION)
        .cloned()
}

/// Puts the finalizer on and the provider annotation, in one write: a machine is made
/// only once both are there.
async fn add_finalizer(w: &mut Writer<'_>, provider: &str) -> Result<(), ReconcileError> {
    w.obj = put_finalizer(&w.api, &w.obj, provider).await?;
    Ok(())
}

/// Puts [`FINALIZER`] on `obj` (tested against the list read, so a concurrent change
/// is refused) and sets [`PROVIDER_ANNOTATION`] to `provider`, in one JSON patch.
pub(crate) async fn put_finalizer<K>(api: &Api<K>, obj: &K, provider: &str) -> kube::Result<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let key = PROVIDER_ANNOTATION.replace('~', "~0").replace('/', "~1");
    let meta = obj.meta();
    let mut ops = Vec::new();
    if !has_finalizer(obj) {
        match &meta.finalizers {
            None => ops.extend([
                json!({"op": "test", "path": "/metadata/finalizers", "value": null}),
                json!({"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}),
            ]),
            Some(list) => ops.extend([
                json!({"op": "test", "path": "/metadata/finalizers", "value": list}),
                json!({"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}),
            ]),
        }
    }
    match &meta.annotations {
        None => ops.push(json!({"op": "add", "path": "/metadata/annotations",
                                 "value": { PROVIDER_ANNOTATION: provider }})),
        Some(_) => ops.push(
            json!({"op": "add", "path": format!("/metadata/annotations/{key}"), "value": provider}),
        ),
    }
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(ops)).expect("the finalizer patch is a JSON patch");
    api.patch(
        &obj.name_any(),
        &PatchParams::default(),
        &Patch::Json::<()>(patch),
    )
    .await
}

/// Takes the finalizer off (tested at its place, so a concurrent change is a 409).
async fn remove_finalizer(w: &mut Writer<'_>) -> Result<(), ReconcileError> {
    take_finalizer(&w.api, &w.obj).await?;
    Ok(())
}

/// Takes [`FINALIZER`] off `obj`, tested at its place.
pub(crate) async fn take_finalizer<K>(api: &Api<K>, obj: &K) -> kube::Result<()>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let Some(i) = obj
        .meta()
        .finalizers
        .as_ref()
        .and_then(|f| f.iter().position(|f| f == FINALIZER))
    else {
        return Ok(());
    };
    let path = format!("/metadata/finalizers/{i}");
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": path, "value": FINALIZER},
        {"op": "remove", "path": path},
    ]))
    .expect("the finalizer patch is a JSON patch");
    api.patch(
        &obj.name_any(),
        &PatchParams::default(),
        &Patch::Json::<()>(patch),
    )
    .await?;
    Ok(())
}

async fn apply(w: &mut Writer<'_>) -> Result<Action, ReconcileError> {
    let generation = w.obj.metadata.generation.unwrap_or(0);
    let previous = w.status();
    let wanted = match Wanted::of(&w.obj, &w.ctx.registry) {
        Ok(wanted) => wanted,
        Err(e) if e.kind() == ErrorKind::InvalidSpec => return refuse(w, e).await,
        Err(e) => return fail(w, e.into()).await,
    };
    let annotated = annotated_provider(&w.obj);
    if !has_finalizer(&w.obj)
        || (previous.applied.is_none() && annotated.as_deref() != Some(wanted.provider.as_str()))
    {
        if previous.applied.is_none()
            && let Some(other) = annotated.filter(|p| *p != wanted.provider)
            && let Some(found) = machine_at(w, &other).await?
        {
            // A machine was made at the provider named before, and its status never
            // written: it stays what it is.
            let why = format!(
                "spec.provider changed from {other:?} to {:?}, but machine {} was made at {other:?} already; delete and re-create the object for a machine at {:?}",
                wanted.provider, found.provider_id, wanted.provider
            );
            return not_applicable(w, why).await;
        }
        // The watch sees this write and reconciles again.
        add_finalizer(w, &wanted.provider).await?;
        return Ok(Action::await_change());
    }

    let name = w.name();
    // What to drive the machine toward: the spec, or what it was made from when the
    // spec asks for what the machine cannot become.
    let toward_spec = |applied: Option<AppliedSpec>, reverify, applying| Plan {
        composer: wanted.composer.clone(),
        spec: wanted.spec.clone(),
        applied,
        reverify,
        applying,
        record: Some(wanted.applied(generation)),
    };
    let plan = match &previous.applied {
        None => toward_spec(None, false, Ok(None)),
        Some(a) => match classify(a, &wanted) {
            Change::None => toward_spec(Some(a.clone()), false, Ok(None)),
            Change::InPlace(added) => toward_spec(Some(a.clone()), true, Ok(Some(added))),
            Change::NeedsNewMachine(why) => {
                if previous.machine.is_none() && machine_at(w, &a.provider).await?.is_none() {
                    // Nothing was made from it: the new spec replaces it.
                    toward_spec(None, false, Ok(None))
                } else {
                    let built = w
                        .ctx
                        .registry
                        .composer(&a.provider, &a.layers)
                        .and_then(|c| Ok((c, machine_spec(&a.machine, &name)?)));
                    match built {
                        Ok((composer, spec)) => Plan {
                            composer,
                            spec,
                            applied: Some(a.clone()),
                            reverify: false,
                            applying: Err(why),
                            record: None,
                        },
                        Err(e) => {
                            // The machine cannot even be watched by what made it.
                            let why = format!(
                                "{why} (and what it was made from can no longer be built: {e})"
                            );
                            return not_applicable(w, why).await;
                        }
                    }
                }
            }
        },
    };
    drive(w, plan, generation).await
}

/// The machine of this object's name at `provider`, if the registry knows it.
async fn machine_at(w: &Writer<'_>, provider: &str) -> Result<Option<Machine>, ReconcileError> {
    let Ok(composer) = w.ctx.registry.composer(provider, &[]) else {
        return Ok(None);
    };
    let Ok(name) = MachineName::new(w.name()) else {
        return Ok(None);
    };
    Ok(composer.provider().find(&name).await?)
}

/// What one reconcile drives the machine toward.
struct Plan {
    composer: Arc<Composer>,
    spec: MachineSpec,
    /// What the machine was made from, as recorded.
    applied: Option<AppliedSpec>,
    /// Look at the software again although the machine was Ready.
    reverify: bool,
    /// `Ok(None)`: the spec is what the machine is made from; `Ok(Some(added))`:
    /// decoupled layers being added in place; `Err(why)`: the spec cannot be applied,
    /// and the machine is driven by what it was made from.
    applying: Result<Option<Vec<String>>, String>,
    /// What to record as applied once the spec is in place.
    record: Option<AppliedSpec>,
}

/// One composer step for the plan, and the status it makes.
async fn drive(w: &mut Writer<'_>, plan: Plan, generation: i64) -> Result<Action, ReconcileError> {
    let Plan {
        composer,
        mut spec,
        applied,
        reverify,
        applying,
        record,
    } = plan;
    let previous = w.status();
    let uid = w.obj.uid().unwrap_or_default();
    spec.labels.insert(OBJECT_LABEL.into(), uid.clone());
    let found = if previous.machine.is_none() {
        match composer.provider().find(&spec.name).await {
            Ok(found) => found,
            Err(e) => return fail(w, e.into()).await,
        }
    } else {
        None
    };
    if let Some(why) = found.as_ref().and_then(|m| foreign(m, &uid)) {
        // First look: never adopt another object's machine of the same name.
        return refuse(
            w,
            machine_core::Error::invalid_spec(
                "metadata.name",
                format!(
                    "the machine {} at the provider is not this object's: {why}; give this object another name",
                    spec.name
                ),
            ),
        )
        .await;
    }
    let decoupled = decoupled_names(&composer);
    let mut before = previous
        .machine
        .as_ref()
        .map(|m| to_machine(&spec.name, m, &previous.conditions, &decoupled));
    if reverify && let Some(m) = before.as_mut().filter(|m| m.phase == Phase::Ready) {
        // Ready stays Ready without a look at the software: look again, so that the
        // layers added since are applied.
        m.phase = Phase::Bootstrapping;
    }
    let step = match composer.reconcile(&spec, before.as_ref()).await {
        Ok(step) => step,
        Err(e) if e.kind() == ErrorKind::InvalidSpec => return refuse(w, e).await,
        Err(e) => return fail(w, e.into()).await,
    };
    let Some(machine) = step.machine else {
        return Ok(to_kube(step.action, w.ctx.resync));
    };
    let ready = machine.phase == Phase::Ready;
    let in_place_done = matches!(applying, Ok(Some(_))) && ready;
    let spec_done = matches!(applying, Ok(None)) || in_place_done;
    let mut status = MachineObjectStatus {
        observed_generation: previous.observed_generation,
        conditions: Vec::new(),
        machine: Some(to_observed(&machine)),
        applied,
        spec_error: None,
    };
    if spec_done && let Some(record) = record {
        status.applied = Some(record);
    }
    let mut c = Conditions::new(&previous.conditions, Some(generation));
    ready_condition(&mut c, &machine);
    match &applying {
        Ok(Some(added)) if !in_place_done => c.set(
            K::SPEC_APPLIED,
            ConditionStatus::False,
            K::REASON_APPLYING,
            format!("applying layer(s) {added:?} to the running machine"),
            None,
        ),
        Ok(_) => c.set(
            K::SPEC_APPLIED,
            ConditionStatus::True,
            K::REASON_APPLIED,
            format!("the machine is what generation {generation} of the spec asks"),
            None,
        ),
        Err(why) => c.set(
            K::SPEC_APPLIED,
            ConditionStatus::False,
            K::REASON_NEEDS_NEW_MACHINE,
            why.clone(),
            None,
        ),
    }
    c.set(
        K::SYNCED,
        ConditionStatus::True,
        K::REASON_RECONCILED,
        "the last reconcile went through",
        None,
    );
    c.machine(&machine);
    status.conditions = c.list;
    // The generation is observed once its spec is applied or refused with a reason;
    // not while layers are still being applied.
    if spec_done || applying.is_err() {
        status.observed_generation = Some(generation);
    }
    w.write(status).await?;
    Ok(to_kube(step.action, w.ctx.resync))
}

pub(crate) fn ready_condition(c: &mut Conditions<'_>, m: &Machine) {
    if m.phase == Phase::Ready {
        c.set(
            K::READY,
            ConditionStatus::True,
            K::REASON_READY,
            "the machine runs with all its software",
            None,
        );
        return;
    }
    let message = match &m.failure {
        Some(f) => format!("{}: {}", f.reason, f.message),
        None => format!("the machine is {}", m.phase),
    };
    c.set(
        K::READY,
        ConditionStatus::False,
        &m.phase.to_string(),
        message,
        None,
    );
}

/// The spec cannot be used: say why, naming the field, and wait for it to change.
async fn refuse(w: &mut Writer<'_>, e: machine_core::Error) -> Result<Action, ReconcileError> {
    let previous = w.status();
    let generation = w.obj.metadata.generation;
    let mut c = Conditions::new(&previous.conditions, generation);
    if previous.machine.is_none() {
        c.set(
            K::READY,
            ConditionStatus::False,
            K::REASON_NO_MACHINE,
            "no machine is made from a spec that cannot be used",
            None,
        );
    } else {
        c.keep(K::READY);
    }
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
    keep_others(&mut c, &previous);
    let status = MachineObjectStatus {
        observed_generation: generation,
        conditions: c.list,
        spec_error: Some(e.to_string()),
        ..previous
    };
    w.write(status).await?;
    Ok(Action::await_change())
}

/// The spec asks for what the machine cannot become, and the machine cannot be driven
/// by what it was made from either: say why and wait for a change.
async fn not_applicable(w: &mut Writer<'_>, why: String) -> Result<Action, ReconcileError> {
    let previous = w.status();
    let generation = w.obj.metadata.generation;
    let mut c = Conditions::new(&previous.conditions, generation);
    c.keep(K::READY);
    c.set(
        K::SPEC_APPLIED,
        ConditionStatus::False,
        K::REASON_NEEDS_NEW_MACHINE,
        why,
        None,
    );
    keep_others(&mut c, &previous);
    let status = MachineObjectStatus {
        observed_generation: generation,
        conditions: c.list,
        spec_error: None,
        ..previous
    };
    w.write(status).await?;
    Ok(Action::await_change())
}

/// A reconcile failed for another reason than the spec: say so in `Synced` (a 409 or
/// another API failure is not written: the next reconcile reads the object again).
async fn fail(w: &mut Writer<'_>, e: ReconcileError) -> Result<Action, ReconcileError> {
    let reason = match &e {
        ReconcileError::Machine(m) => format!("{:?}", m.kind()),
        _ => return Err(e),
    };
    let previous = w.status();
    let mut c = Conditions::new(&previous.conditions, w.obj.metadata.generation);
    if K::find(&previous.conditions, K::READY).is_none() {
        c.set(
            K::READY,
            ConditionStatus::Unknown,
            "Reconciling",
            "not seen yet",
            None,
        );
    }
    c.set(
        K::SYNCED,
        ConditionStatus::False,
        &reason,
        e.to_string(),
        None,
    );
    keep_others(&mut c, &previous);
    let status = MachineObjectStatus {
        conditions: c.list,
        ..previous
    };
    if let Err(write) = w.write(status).await {
        tracing::warn!(object = %w.name(), error = %write, "writing the error to the status failed");
    }
    Err(e)
}

/// Keeps every previous condition not set yet, in their order.
pub(crate) fn keep_others(c: &mut Conditions<'_>, previous: &MachineObjectStatus) {
    for p in &previous.conditions {
        c.keep(&p.type_);
    }
}

async fn cleanup(w: &mut Writer<'_>) -> Result<Action, ReconcileError> {
    if !has_finalizer(&w.obj) {
        return Ok(Action::await_change());
    }
    let previous = w.status();
    let provider = previous
        .applied
        .as_ref()
        .map(|a| a.provider.clone())
        .or_else(|| annotated_provider(&w.obj));
    let Ok(name) = MachineName::new(w.name()) else {
        // No machine is ever made under a name that is not a machine name.
        remove_finalizer(w).await?;
        w.event(
            EventType::Normal,
            "Deleted",
            "Delete",
            format!("no machine can be named {:?}: nothing to delete", w.name()),
        )
        .await;
        return Ok(Action::await_change());
    };
    let Some(provider) = provider else {
        remove_finalizer(w).await?;
        w.event(
            EventType::Normal,
            "Deleted",
            "Delete",
            "no machine was made for this object".into(),
        )
        .await;
        return Ok(Action::await_change());
    };
    let composer = match w.ctx.registry.composer(&provider, &[]) {
        Ok(c) => c,
        Err(e) if previous.applied.is_none() => {
            // Only the annotation names it, and this controller never made a machine
            // there: nothing to delete.
            remove_finalizer(w).await?;
            w.event(
                EventType::Normal,
                "Deleted",
                "Delete",
                format!("no machine was made for this object ({e})"),
            )
            .await;
            return Ok(Action::await_change());
        }
        Err(e) => {
            let why = format!(
                "machine {name} cannot be deleted: its provider {provider:?} is not registered with this controller ({e}); register it again, or delete the machine at the provider by hand and then remove the finalizer {FINALIZER}"
            );
            deleting_status(w, &previous, None, Some((K::REASON_CLEANUP_BLOCKED, why))).await?;
            return Ok(Action::requeue(w.ctx.resync));
        }
    };
    let uid = w.obj.uid().unwrap_or_default();
    if let Some(m) = composer.provider().find(&name).await?
        && let Some(why) = foreign(&m, &uid)
    {
        remove_finalizer(w).await?;
        w.event(
            EventType::Normal,
            "Deleted",
            "Delete",
            format!("machine {name} left alone: {why}"),
        )
        .await;
        return Ok(Action::await_change());
    }
    match composer.reconcile_deletion(&name).await {
        Ok(step) => match step.machine {
            None => {
                remove_finalizer(w).await?;
                w.event(
                    EventType::Normal,
                    "Deleted",
                    "Delete",
                    format!("machine {name} is gone"),
                )
                .await;
                Ok(Action::await_change())
            }
            Some(m) => {
                deleting_status(w, &previous, Some(&m), None).await?;
                Err(ReconcileError::StillDeleting {
                    name: name.to_string(),
                    after: step
                        .action
                        .requeue_after()
                        .unwrap_or(composer.settings().poll_interval),
                })
            }
        },
        Err(e) => {
            let reason = format!("{:?}", e.kind());
            let why = format!("deleting machine {name}: {e}");
            if let Err(write) = deleting_status(w, &previous, None, Some((&reason, why))).await {
                tracing::warn!(object = %w.name(), error = %write, "writing the status failed");
            }
            Err(e.into())
        }
    }
}

/// The status of an object being deleted: `Ready` false (`Deleting`), the machine as the
/// deletion sees it, and `Synced` saying why a deletion does not go on.
async fn deleting_status(
    w: &mut Writer<'_>,
    previous: &MachineObjectStatus,
    machine: Option<&Machine>,
    blocked: Option<(&str, String)>,
) -> Result<(), ReconcileError> {
    let mut c = Conditions::new(&previous.conditions, w.obj.metadata.generation);
    c.set(
        K::READY,
        ConditionStatus::False,
        "Deleting",
        "the object is being deleted, and its machine with it",
        None,
    );
    match blocked {
        Some((reason, why)) => c.set(K::SYNCED, ConditionStatus::False, reason, why, None),
        None => c.set(
            K::SYNCED,
            ConditionStatus::True,
            K::REASON_RECONCILED,
            "the last reconcile went through",
            None,
        ),
    }
    keep_others(&mut c, previous);
    let mut status = MachineObjectStatus {
        conditions: c.list,
        ..previous.clone()
    };
    if let Some(m) = machine {
        status.machine = Some(to_observed(m));
    }
    w.write(status).await
}

fn decoupled_names(composer: &Composer) -> Vec<String> {
    composer
        .layers()
        .iter()
        .filter(|l| l.mode() == Mode::Decoupled)
        .map(|l| l.name().to_owned())
        .collect()
}

/// The status's view of a machine.
pub(crate) fn to_observed(m: &Machine) -> ObservedMachine {
    ObservedMachine {
        provider_id: m.provider_id.clone(),
        phase: m.phase,
        addresses: m.addresses.clone(),
        access: MachineAccess {
            ssh: m.access.ssh.clone(),
            host_keys: m.access.host_keys.clone(),
        },
        labels: m.labels.clone(),
        size: m.size.clone(),
        failure: m.failure.clone(),
        node: m.node.clone(),
    }
}

/// The machine a status shows, as the composer's previous step returned it: its
/// conditions (with their transition times) read back from the Kubernetes ones.
fn to_machine(
    name: &MachineName,
    m: &ObservedMachine,
    conditions: &[K::Condition],
    decoupled: &[String],
) -> Machine {
    let mut machine = Machine::new(name.clone(), m.provider_id.clone(), m.phase);
    machine.addresses = m.addresses.clone();
    machine.access.ssh = m.access.ssh.clone();
    machine.access.host_keys = m.access.host_keys.clone();
    machine.labels = m.labels.clone();
    machine.size = m.size.clone();
    machine.failure = m.failure.clone();
    machine.node = m.node.clone();
    for c in conditions {
        let Some(kind) = K::core_type(&c.type_, decoupled) else {
            continue;
        };
        if c.status == ConditionStatus::Unknown {
            continue;
        }
        machine.set_condition(
            &kind,
            c.status == ConditionStatus::True,
            &c.reason,
            c.message.clone(),
        );
        if let (Some(t), Some(set)) = (
            K::parse_time(&c.last_transition_time),
            machine.conditions.last_mut(),
        ) {
            set.last_transition = t;
        }
    }
    machine
}

/// machine-core's action as kube-runtime's: a settled machine is looked at again after
/// `resync`, so a change behind the controller's back is noticed.
pub(crate) fn to_kube(action: machine_core::Action, resync: Duration) -> Action {
    Action::requeue(action.requeue_after().unwrap_or(resync))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_merge_diff_nulls_what_is_gone_and_is_none_when_equal() {
        let from = json!({"a": 1, "b": {"c": 2, "d": 3}, "e": [1, 2]});
        let to = json!({"a": 1, "b": {"c": 2}, "e": [1], "f": "x"});
        let diff = merge_diff(&from, &to).unwrap();
        assert_eq!(diff, json!({"b": {"d": null}, "e": [1], "f": "x"}));
        let mut patched = from.clone();
        json_patch::merge(&mut patched, &diff);
        assert_eq!(patched, to);
        assert_eq!(merge_diff(&to, &to), None);
    }
}
