//! One property collector per provider, kept current by `WaitForUpdatesEx`: what the
//! provider knows of its VMs (a mirror of every VM under its folder), and the tasks and
//! VM states that its operations wait for, pushed by vCenter instead of polled per VM.
//!
//! On the server, at first use: a collector of its own (`CreatePropertyCollector`), a
//! `ContainerView` of the VMs under the provider's folder, a `ListView` of the tasks
//! being waited for, and one filter over both reading [`PATHS`] of each VM and the
//! `info` of each task. One background task (the loop) then asks for updates with the
//! version of the last answer, for every waiter at once:
//!
//! - a **barrier** ([`Collector::barrier`]) makes the mirror as current as the
//!   server: the caller waits for an answer to a request sent after it asked, so a
//!   read after a barrier sees every change made before it (another process's clone, a
//!   destroy). Barriers asked for together share one call.
//! - a **task** ([`Collector::wait_task`]) is added to the list view (tasks started
//!   together are added in one `ModifyListView`, finished ones removed in the same
//!   call) and its outcome comes with the next update: no call per task beyond the one
//!   that started it.
//! - a **VM state** ([`Collector::wait_vm`]): a condition on a VM's record, such as
//!   powered off after a guest shutdown, checked at every update.
//!
//! With nobody waiting, the loop makes no call at all; while someone waits for a task or
//! a state it long-polls (an answer as soon as something changed). A task started
//! during a long poll is added to the list view beside it (the poll reports it as it
//! enters the filter); a barrier during a long poll that does not end by itself within
//! [`GRACE`] cancels it (`CancelWaitForUpdates`): the version keeps what was not yet
//! read.
//!
//! An answer that is lost (a cut connection, the session ended) leaves the mirror
//! unknown: the loop destroys its collector and makes a new one, whose first answer is
//! every VM afresh, and adds again the tasks still waited for. The mirror is a cache of
//! the server, never a record of progress: a new process builds its own.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use machine_core::{Error, ErrorKind, Result};
use tokio::sync::{Notify, watch};

use crate::client::{CallError, Client, Moref, ObjectContent, TaskOutcome, plain, task_outcome};
use crate::errors::Fault;
use crate::vm::{PATHS, Vm};
use crate::xml::{Element, escape};

/// How long a barrier lets a long poll end by itself before cancelling it: ending it
/// costs one call, waiting costs the barrier's caller up to the poll's answer (vCenter
/// answers on change, vcsim at its next 20 ms tick).
pub(crate) const GRACE: Duration = Duration::from_millis(5);

/// Failures of the loop in a row after which task and state waiters give up.
const GIVE_UP: u32 = 3;

/// The task properties watched.
const TASK_PATHS: &[&str] = &["info.state", "info.error", "info.result"];

/// One VM as the mirror holds it: its watched properties, and what they say.
#[derive(Debug, Clone)]
struct Record {
    props: HashMap<String, Element>,
    vm: Vm,
}

impl Record {
    /// Whether the record says what the provider needs of every VM. vcsim reports a VM
    /// that enters while it is being made with the properties it has then, and does not
    /// publish the ones set after (its UUID, its power state): such a record is read
    /// again (see [`repair`]).
    fn complete(&self) -> bool {
        self.vm.uuid.is_some() && !self.vm.power.is_empty() && self.props.contains_key("name")
    }

    fn new(obj: &Moref) -> Record {
        Record {
            props: HashMap::new(),
            vm: Vm::from_content(&ObjectContent {
                obj: obj.clone(),
                props: Vec::new(),
            }),
        }
    }

    /// Derives [`Record::vm`] again from the properties.
    fn refresh(&mut self, obj: &Moref) {
        let content = ObjectContent {
            obj: obj.clone(),
            props: self
                .props
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        self.vm = Vm::from_content(&content);
    }
}

/// A task being waited for.
#[derive(Debug, Default)]
struct TaskSlot {
    /// In the server's list view (so its updates come).
    listed: bool,
    /// How it ended, once it did.
    outcome: Option<TaskOutcome>,
    /// Its `info` properties seen so far.
    props: HashMap<String, Element>,
    /// Callers waiting for it.
    waiters: usize,
}

/// What the loop and the callers share.
#[derive(Default)]
struct State {
    /// The mirror: every VM under the folder, by managed object.
    vms: HashMap<Moref, Record>,
    /// VMs by BIOS UUID.
    by_uuid: HashMap<String, Moref>,
    /// Barriers asked for (a sequence number) and answered (the highest one answered).
    requested: u64,
    covered: u64,
    /// The last failure, and the highest barrier it failed.
    failure: Option<(u64, ErrorKind, String)>,
    /// Failures since the last answer: waiters for tasks and states give up at
    /// [`GIVE_UP`] of them (the server cannot be reached), rather than wait their time.
    failures: u32,
    tasks: HashMap<Moref, TaskSlot>,
    /// Tasks to take out of the list view.
    unlist: Vec<Moref>,
    /// Callers waiting for a VM's state.
    vm_waiters: usize,
    /// The folder watched.
    root: Option<Moref>,
    /// Whether the mirror holds the VMs of `root` as read from the server (since
    /// then it may be behind it).
    read: bool,
    /// Whether the loop runs.
    running: bool,
}

impl State {
    /// Whether the loop has something to do.
    fn busy(&self) -> bool {
        self.covered < self.requested
            || self.vm_waiters > 0
            || self.tasks.values().any(|t| t.outcome.is_none())
    }

    /// The tasks to add to the list view (marked listed now, so that no other call
    /// adds them again) and, with them, the finished ones to take out.
    fn take_unlisted(&mut self) -> (Vec<Moref>, Vec<Moref>) {
        let mut add = Vec::new();
        for (m, t) in &mut self.tasks {
            if !t.listed && t.outcome.is_none() {
                t.listed = true;
                add.push(m.clone());
            }
        }
        let remove = if add.is_empty() {
            Vec::new()
        } else {
            std::mem::take(&mut self.unlist)
        };
        (add, remove)
    }

    fn remember(&mut self, obj: &Moref, record: Record) {
        if let Some(old) = self.vms.get(obj).and_then(|r| r.vm.uuid.clone())
            && record.vm.uuid.as_deref() != Some(old.as_str())
        {
            self.by_uuid.remove(&old);
        }
        if let Some(uuid) = &record.vm.uuid {
            self.by_uuid.insert(uuid.clone(), obj.clone());
        }
        self.vms.insert(obj.clone(), record);
    }

    fn forget(&mut self, obj: &Moref) {
        if let Some(uuid) = self.vms.remove(obj).and_then(|r| r.vm.uuid) {
            self.by_uuid.remove(&uuid);
        }
    }
}

/// The server-side objects of one collector.
#[derive(Debug, Clone)]
struct Server {
    collector: Moref,
    view: Moref,
    list: Moref,
    version: String,
}

struct Inner {
    client: Arc<Client>,
    state: Mutex<State>,
    /// Work for a parked loop.
    wake: Notify,
    /// Work that should end a long poll.
    urgent: Notify,
    /// Bumped after every answer applied (or failure), for waiters.
    epoch: watch::Sender<u64>,
    /// How long a long poll waits on the server.
    long_poll: Duration,
    closed: AtomicBool,
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn bump(&self) {
        self.epoch.send_modify(|e| *e += 1);
    }

    /// Starts the loop unless it runs, and tells it there is work.
    fn kick(self: &Arc<Self>, urgent: bool) {
        let start = {
            let mut st = self.state();
            !std::mem::replace(&mut st.running, true)
        };
        if start {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(run(self.clone()));
                }
                Err(_) => self.state().running = false,
            }
        }
        self.wake.notify_one();
        if urgent {
            self.urgent.notify_one();
        }
    }
}

/// The provider's collector (see the module documentation). Dropping it ends the loop
/// and destroys the collector and views on the server (best effort).
pub(crate) struct Collector {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector").finish_non_exhaustive()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.wake.notify_one();
        self.inner.urgent.notify_one();
    }
}

/// A caller's interest in something the loop watches, given up when dropped (a caller
/// whose future was dropped stops counting).
struct Interest<'a> {
    inner: &'a Inner,
    task: Option<Moref>,
}

impl Drop for Interest<'_> {
    fn drop(&mut self) {
        let mut st = self.inner.state();
        match &self.task {
            Some(task) => {
                let done = match st.tasks.get_mut(task) {
                    Some(slot) => {
                        slot.waiters = slot.waiters.saturating_sub(1);
                        slot.waiters == 0
                    }
                    None => false,
                };
                if done
                    && let Some(slot) = st.tasks.remove(task)
                    && slot.listed
                {
                    st.unlist.push(task.clone());
                }
            }
            None => st.vm_waiters = st.vm_waiters.saturating_sub(1),
        }
    }
}

impl Collector {
    /// A collector over `client`'s session; nothing is made on the server until first
    /// use. A long poll waits at most `long_poll` on the server.
    pub fn new(client: Arc<Client>, long_poll: Duration) -> Collector {
        Collector {
            inner: Arc::new(Inner {
                client,
                state: Mutex::new(State::default()),
                wake: Notify::new(),
                urgent: Notify::new(),
                epoch: watch::channel(0).0,
                long_poll,
                closed: AtomicBool::new(false),
            }),
        }
    }

    /// The folder whose VMs are mirrored: set before the first barrier. A different
    /// folder than before (the path now names another) makes the mirror anew.
    pub fn watch(&self, root: &Moref) {
        let changed = {
            let mut st = self.inner.state();
            let changed = st.root.as_ref() != Some(root);
            st.root = Some(root.clone());
            st.read &= !changed;
            changed
        };
        if changed {
            // The loop compares the root it built with; a barrier makes it look.
            self.inner.wake.notify_one();
        }
    }

    /// Waits until the mirror reflects every change the server made before this call
    /// (see the module documentation).
    pub async fn barrier(&self) -> Result<()> {
        let seq = {
            let mut st = self.inner.state();
            st.requested += 1;
            st.requested
        };
        let mut rx = self.inner.epoch.subscribe();
        self.inner.kick(true);
        let limit = self.inner.client.call_timeout() * 2 + self.inner.long_poll;
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            {
                let st = self.inner.state();
                if st.covered >= seq {
                    return Ok(());
                }
                if let Some((upto, kind, message)) = &st.failure
                    && *upto >= seq
                {
                    return Err(Error::new(*kind, message.clone()));
                }
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => {
                    return Err(Error::timeout(format!(
                        "no answer to WaitForUpdatesEx in {limit:?}"
                    )));
                }
            }
        }
    }

    /// Whether the mirror has read the watched folder's VMs from the server: until
    /// then it knows nothing, after that it may be behind (a barrier makes it current).
    pub fn mirrored(&self) -> bool {
        self.inner.state().read
    }

    /// The VMs of the mirror that `pick` selects, as known now.
    pub fn vms(&self, mut pick: impl FnMut(&Vm) -> bool) -> Vec<Vm> {
        self.inner
            .state()
            .vms
            .values()
            .map(|r| &r.vm)
            .filter(|v| pick(v))
            .cloned()
            .collect()
    }

    /// The mirror's VM with this BIOS UUID, if any.
    pub fn by_uuid(&self, uuid: &str) -> Option<Vm> {
        let st = self.inner.state();
        st.by_uuid
            .get(uuid)
            .and_then(|m| st.vms.get(m))
            .map(|r| r.vm.clone())
    }

    /// The mirror's record of `vm`, if any.
    pub fn vm(&self, vm: &Moref) -> Option<Vm> {
        self.inner.state().vms.get(vm).map(|r| r.vm.clone())
    }

    /// Waits for `task` (started by `what`): its result, or its fault as an error;
    /// a timeout after `limit`.
    pub async fn wait_task(
        &self,
        what: &str,
        task: &Moref,
        limit: Duration,
    ) -> Result<Option<Element>> {
        {
            let mut st = self.inner.state();
            st.unlist.retain(|t| t != task);
            st.tasks.entry(task.clone()).or_default().waiters += 1;
        }
        let _interest = Interest {
            inner: &self.inner,
            task: Some(task.clone()),
        };
        let mut rx = self.inner.epoch.subscribe();
        self.inner.kick(true);
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            {
                let st = self.inner.state();
                if let Some(outcome) = st.tasks.get(task).and_then(|t| t.outcome.clone()) {
                    return outcome.map_err(|f| f.to_error(what));
                }
                if let Some(e) = st.given_up() {
                    return Err(e.context(what));
                }
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return Err(Error::timeout(format!(
                    "{what}: task {task} still running after {limit:?}"
                )));
            }
        }
    }

    /// Waits until `done` holds for `vm`'s record (`None`: not in the mirror) or
    /// `limit` passed; whether it held.
    pub async fn wait_vm(
        &self,
        vm: &Moref,
        limit: Duration,
        done: impl Fn(Option<&Vm>) -> bool,
    ) -> Result<bool> {
        self.inner.state().vm_waiters += 1;
        let _interest = Interest {
            inner: &self.inner,
            task: None,
        };
        let mut rx = self.inner.epoch.subscribe();
        self.inner.kick(false);
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            {
                let st = self.inner.state();
                if done(st.vms.get(vm).map(|r| &r.vm)) {
                    return Ok(true);
                }
                if let Some(e) = st.given_up() {
                    return Err(e);
                }
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return Ok(false);
            }
        }
    }
}

/// The loop: one per collector, while the provider lives and someone waits.
async fn run(inner: Arc<Inner>) {
    let mut server: Option<(Server, Moref)> = None;
    let mut backoff = Duration::from_millis(100);
    loop {
        if inner.closed.load(Ordering::SeqCst) {
            break;
        }
        let (busy, root) = {
            let st = inner.state();
            (st.busy(), st.root.clone())
        };
        if !busy {
            // Parked: no call while nobody waits.
            inner.wake.notified().await;
            continue;
        }
        let Some(root) = root else {
            fail(&inner, ErrorKind::Permanent, "no folder to watch".into());
            inner.wake.notified().await;
            continue;
        };
        if server.as_ref().is_some_and(|(_, r)| *r != root) {
            let (old, _) = server.take().expect("checked");
            destroy(&inner.client, &old).await;
        }
        let Some((srv, _)) = server.as_mut() else {
            let covering = inner.state().requested;
            match build(&inner, &root).await {
                Ok(made) => {
                    backoff = Duration::from_millis(100);
                    let mut st = inner.state();
                    st.failures = 0;
                    st.covered = st.covered.max(covering);
                    for slot in st.tasks.values_mut() {
                        slot.listed = false;
                    }
                    st.unlist.clear();
                    drop(st);
                    server = Some((made, root));
                }
                Err(e) => {
                    tracing::debug!(error = %e, "vSphere property collector could not be made");
                    fail_upto(&inner, covering, e.kind(), e.message().to_owned());
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
            inner.bump();
            continue;
        };
        // Tasks to add to the list view, and finished ones to take out.
        let (add, remove) = inner.state().take_unlisted();
        if !add.is_empty() {
            list_tasks(&inner, srv, &add, &remove).await;
        }
        let (covering, quick) = {
            let st = inner.state();
            (st.requested, st.covered < st.requested)
        };
        let wait = if quick {
            Duration::ZERO
        } else {
            inner.long_poll
        };
        let answer = {
            let call = wait_for_updates(&inner.client, srv, wait);
            tokio::pin!(call);
            loop {
                tokio::select! {
                    answer = &mut call => break answer,
                    () = inner.urgent.notified(), if !quick => {
                        let closed = inner.closed.load(Ordering::SeqCst);
                        if !closed && inner.state().requested <= covering {
                            // New tasks alone: listed now, beside the poll, which
                            // reports them (their state as they enter the filter) at
                            // once instead of after a turn of its own.
                            let (add, remove) = inner.state().take_unlisted();
                            if add.is_empty() {
                                continue;
                            }
                            let listing = list_tasks(&inner, srv, &add, &remove);
                            tokio::pin!(listing);
                            tokio::select! {
                                answer = &mut call => {
                                    listing.await;
                                    break answer;
                                }
                                () = &mut listing => continue,
                            }
                        }
                        match tokio::time::timeout(GRACE, &mut call).await {
                            Ok(answer) => break answer,
                            Err(_) => {
                                tracing::trace!(covering, "cancelling a long poll for newer work");
                                let this = srv.collector.xml("_this");
                                if let Err(e) = inner.client.call("CancelWaitForUpdates", &this).await {
                                    tracing::debug!(error = %e, "CancelWaitForUpdates failed");
                                }
                                break call.await;
                            }
                        }
                    }
                }
            }
        };
        match answer {
            Ok(update) => {
                let truncated = update
                    .as_ref()
                    .is_some_and(|u| u.child_text("truncated") == Some("true"));
                let mut incomplete = Vec::new();
                if let Some(update) = &update {
                    if let Some(v) = update.child_text("version") {
                        srv.version = v.to_owned();
                    }
                    incomplete = apply(&mut inner.state(), update);
                }
                if !incomplete.is_empty() {
                    repair(&inner, &incomplete).await;
                }
                let mut st = inner.state();
                st.failures = 0;
                if !truncated {
                    st.covered = st.covered.max(covering);
                }
                tracing::trace!(
                    changed = update.is_some(),
                    truncated,
                    version = %srv.version,
                    vms = st.vms.len(),
                    covered = st.covered,
                    requested = st.requested,
                    tasks_waited = st.tasks.values().filter(|t| t.outcome.is_none()).count(),
                    "WaitForUpdatesEx answered"
                );
                drop(st);
                inner.bump();
            }
            Err(CallError::Fault(f)) if f.kind == "RequestCanceled" => {}
            Err(e) => {
                let e = plain(e, "WaitForUpdatesEx");
                tracing::debug!(error = %e, "vSphere updates lost; making the collector again");
                let (old, _) = server.take().expect("in use");
                destroy(&inner.client, &old).await;
                fail_upto(&inner, covering, e.kind(), e.message().to_owned());
                inner.bump();
            }
        }
    }
    if let Some((srv, _)) = server {
        destroy(&inner.client, &srv).await;
    }
    inner.state().running = false;
}

/// Records a failure for every barrier asked for so far.
fn fail(inner: &Inner, kind: ErrorKind, message: String) {
    let upto = inner.state().requested;
    fail_upto(inner, upto, kind, message);
    inner.bump();
}

fn fail_upto(inner: &Inner, upto: u64, kind: ErrorKind, message: String) {
    let mut st = inner.state();
    st.failure = Some((upto, kind, message));
    st.failures += 1;
}

impl State {
    /// The error waiters give up with, once the loop failed [`GIVE_UP`] times in a row.
    fn given_up(&self) -> Option<Error> {
        match &self.failure {
            Some((_, kind, message)) if self.failures >= GIVE_UP => {
                let kind = if *kind == ErrorKind::NotFound {
                    ErrorKind::Transient
                } else {
                    *kind
                };
                Some(Error::new(
                    kind,
                    format!("no updates from vCenter: {message}"),
                ))
            }
            _ => None,
        }
    }
}

/// Makes the collector, views and filters, and reads every VM under `root`.
async fn build(inner: &Inner, root: &Moref) -> Result<Server> {
    let client = &inner.client;
    let content = client.content().await?;
    let moref = |r: Element, what: &str| {
        r.child("returnval")
            .and_then(Moref::from_element)
            .ok_or_else(|| Error::transient(format!("{what}: no object in the answer")))
    };
    let collector = moref(
        client
            .call(
                "CreatePropertyCollector",
                &content.property_collector.xml("_this"),
            )
            .await?,
        "CreatePropertyCollector",
    )?;
    let mut server = Server {
        collector: collector.clone(),
        view: Moref::new("ContainerView", ""),
        list: Moref::new("ListView", ""),
        version: String::new(),
    };
    let made = async {
        let vm_ = content.view_manager.xml("_this");
        server.view = moref(
            client
                .call(
                    "CreateContainerView",
                    &format!(
                        "{vm_}{}<type>VirtualMachine</type><recursive>true</recursive>",
                        root.xml("container")
                    ),
                )
                .await?,
            "CreateContainerView",
        )?;
        server.list = moref(client.call("CreateListView", &vm_).await?, "CreateListView")?;
        // One filter for both: vcsim does the work of a change once per filter (reading
        // every object of every filter each time, unless built with the batch fix of
        // scripts/peers/50-vcsim.sh), so two filters cost it twice what one does.
        client
            .call(
                "CreateFilter",
                &format!(
                    "{}<spec>{}{}{}{}</spec><partialUpdates>false</partialUpdates>",
                    collector.xml("_this"),
                    prop_set("VirtualMachine", PATHS),
                    prop_set("Task", TASK_PATHS),
                    view_set(&server.view, "ContainerView", "vmView"),
                    view_set(&server.list, "ListView", "taskView")
                ),
            )
            .await?;
        // The whole state at first, page by page.
        let mut st_vms: Vec<Element> = Vec::new();
        loop {
            let update = wait_for_updates(client, &server, Duration::ZERO)
                .await
                .map_err(|e| plain(e, "WaitForUpdatesEx"))?;
            let Some(update) = update else { break };
            if let Some(v) = update.child_text("version") {
                server.version = v.to_owned();
            }
            let more = update.child_text("truncated") == Some("true");
            st_vms.push(update);
            if !more {
                break;
            }
        }
        let mut incomplete = Vec::new();
        {
            let mut st = inner.state();
            st.vms.clear();
            st.by_uuid.clear();
            for update in &st_vms {
                incomplete.extend(apply(&mut st, update));
            }
            st.read = st.root.as_ref() == Some(root);
        }
        if !incomplete.is_empty() {
            repair(inner, &incomplete).await;
        }
        Ok::<_, Error>(())
    }
    .await;
    match made {
        Ok(()) => Ok(server),
        Err(e) => {
            destroy(client, &server).await;
            Err(e)
        }
    }
}

/// Destroys a collector and its views (best effort: the session ending does too).
async fn destroy(client: &Client, server: &Server) {
    let _ = client
        .call("DestroyPropertyCollector", &server.collector.xml("_this"))
        .await;
    for view in [&server.view, &server.list] {
        if !view.value.is_empty() {
            let _ = client.call("DestroyView", &view.xml("_this")).await;
        }
    }
}

/// A `<propSet>` reading `paths` of objects of `kind`.
fn prop_set(kind: &str, paths: &[&str]) -> String {
    let mut out = format!("<propSet><type>{kind}</type><all>false</all>");
    for p in paths {
        let _ = write!(out, "<pathSet>{}</pathSet>", escape(p));
    }
    out.push_str("</propSet>");
    out
}

/// An `<objectSet>` of the objects in `view` (of type `kind`), not the view itself,
/// through a traversal spec called `name` (unique in its filter spec).
fn view_set(view: &Moref, kind: &str, name: &str) -> String {
    format!(
        "<objectSet>{}<skip>true</skip><selectSet xsi:type=\"TraversalSpec\"><name>{name}</name>\
         <type>{kind}</type><path>view</path><skip>false</skip></selectSet></objectSet>",
        view.xml("obj")
    )
}

/// One `WaitForUpdatesEx` with the server's version, waiting at most `wait` there;
/// the update set, `None` when nothing changed.
async fn wait_for_updates(
    client: &Client,
    server: &Server,
    wait: Duration,
) -> std::result::Result<Option<Element>, CallError> {
    let body = format!(
        "{}<version>{}</version><options><maxWaitSeconds>{}</maxWaitSeconds></options>",
        server.collector.xml("_this"),
        escape(&server.version),
        wait.as_secs()
    );
    let r = client
        .call_raw("WaitForUpdatesEx", &body, (!wait.is_zero()).then_some(wait))
        .await?;
    Ok(r.child("returnval").cloned())
}

/// Adds `add` to the list view and takes `remove` out, in one call. Tasks the server
/// would not add (gone, or not a task it knows) are read one by one instead.
async fn list_tasks(inner: &Inner, server: &Server, add: &[Moref], remove: &[Moref]) {
    let mut body = server.list.xml("_this");
    for t in add {
        body.push_str(&t.xml("add"));
    }
    for t in remove {
        body.push_str(&t.xml("remove"));
    }
    let refused: Vec<Moref> = match inner.client.call("ModifyListView", &body).await {
        // vCenter answers the objects it could not add.
        Ok(r) => r
            .children_named("returnval")
            .filter_map(Moref::from_element)
            .collect(),
        Err(e) => {
            tracing::debug!(error = %e, "ModifyListView failed; reading the tasks one by one");
            add.to_vec()
        }
    };
    for t in refused {
        let outcome = match inner.client.task_outcome(&t).await {
            Ok(Some(o)) => Some(o),
            // Still running, and not in the list: looked at again at the next update.
            Ok(None) => None,
            Err(e) => Some(Err(Fault {
                kind: if e.kind() == ErrorKind::NotFound {
                    "ManagedObjectNotFound".into()
                } else {
                    String::new()
                },
                message: e.message().to_owned(),
                property: None,
            })),
        };
        let mut st = inner.state();
        if let Some(slot) = st.tasks.get_mut(&t) {
            match outcome {
                Some(o) => slot.outcome = Some(o),
                // Not listable: it is read again at the next turn.
                None => slot.listed = false,
            }
        }
    }
    tracing::trace!(
        added = add.len(),
        removed = remove.len(),
        "tasks added to and taken out of the list view"
    );
    inner.bump();
}

/// Reads the VMs whose records are `incomplete` (see [`Record::complete`]) directly, in
/// one call, and puts what it read in their records. A failure leaves them as they were.
async fn repair(inner: &Inner, incomplete: &[Moref]) {
    match inner
        .client
        .properties_of("VirtualMachine", incomplete, PATHS)
        .await
    {
        Ok(read) => {
            let mut st = inner.state();
            for o in read {
                let Some(mut record) = st.vms.get(&o.obj).cloned() else {
                    continue;
                };
                record.props.extend(o.props);
                record.refresh(&o.obj);
                st.remember(&o.obj, record);
            }
        }
        Err(e) => tracing::debug!(error = %e, "reading incomplete VM records"),
    }
}

/// Applies an update set to the mirror and the tasks; the VMs it touched whose
/// records are not complete.
fn apply(st: &mut State, update: &Element) -> Vec<Moref> {
    let mut incomplete = Vec::new();
    for filter in update.children_named("filterSet") {
        for object in filter.children_named("objectSet") {
            let Some(obj) = object.child("obj").and_then(Moref::from_element) else {
                continue;
            };
            let kind = object.child_text("kind").unwrap_or("");
            if obj.kind == "Task" {
                apply_task(st, &obj, kind, object);
                continue;
            }
            match kind {
                "leave" => st.forget(&obj),
                "enter" | "modify" => {
                    let mut record = match kind {
                        "modify" => st
                            .vms
                            .get(&obj)
                            .cloned()
                            .unwrap_or_else(|| Record::new(&obj)),
                        _ => Record::new(&obj),
                    };
                    apply_changes(&mut record.props, object);
                    record.refresh(&obj);
                    if !record.complete() && !incomplete.contains(&obj) {
                        incomplete.push(obj.clone());
                    }
                    st.remember(&obj, record);
                }
                _ => {}
            }
        }
    }
    incomplete
}

/// Applies an object update's changes to its properties.
fn apply_changes(props: &mut HashMap<String, Element>, object: &Element) {
    for change in object.children_named("changeSet") {
        let Some(name) = change.child_text("name") else {
            continue;
        };
        match (
            change.child_text("op").unwrap_or("assign"),
            change.child("val"),
        ) {
            ("remove" | "indirectRemove", _) | (_, None) => {
                props.remove(name);
            }
            (_, Some(val)) => {
                props.insert(name.to_owned(), val.clone());
            }
        }
    }
}

fn apply_task(st: &mut State, task: &Moref, kind: &str, object: &Element) {
    let Some(slot) = st.tasks.get_mut(task) else {
        return;
    };
    if kind == "leave" || slot.outcome.is_some() {
        return;
    }
    apply_changes(&mut slot.props, object);
    slot.outcome = task_outcome(
        slot.props.get("info.state").map(|e| e.text.as_str()),
        slot.props.get("info.result"),
        slot.props.get("info.error"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Element {
        crate::xml::parse(text.as_bytes()).unwrap()
    }

    #[test]
    fn updates_enter_modify_and_leave_the_mirror() {
        let mut st = State::default();
        let enter = parse(
            r#"<returnval xmlns="urn:vim25" xmlns:x="http://www.w3.org/2001/XMLSchema-instance"><version>1</version><filterSet><filter type="PropertyFilter">f</filter><objectSet><kind>enter</kind><obj type="VirtualMachine">vm-1</obj><changeSet><name>config.uuid</name><op>assign</op><val x:type="xsd:string">u-1</val></changeSet><changeSet><name>runtime.powerState</name><op>assign</op><val x:type="VirtualMachinePowerState">poweredOff</val></changeSet></objectSet></filterSet></returnval>"#,
        );
        apply(&mut st, &enter);
        let vm = Moref::new("VirtualMachine", "vm-1");
        assert_eq!(st.vms[&vm].vm.power, "poweredOff");
        assert_eq!(st.by_uuid["u-1"], vm);
        let modify = parse(
            r#"<returnval xmlns="urn:vim25"><filterSet><objectSet><kind>modify</kind><obj type="VirtualMachine">vm-1</obj><changeSet><name>runtime.powerState</name><op>assign</op><val>poweredOn</val></changeSet><changeSet><name>guest.ipAddress</name><op>assign</op><val>10.0.0.1</val></changeSet></objectSet></filterSet></returnval>"#,
        );
        apply(&mut st, &modify);
        assert_eq!(st.vms[&vm].vm.power, "poweredOn");
        assert_eq!(st.vms[&vm].vm.addresses, vec!["10.0.0.1".to_owned()]);
        let unset = parse(
            r#"<returnval xmlns="urn:vim25"><filterSet><objectSet><kind>modify</kind><obj type="VirtualMachine">vm-1</obj><changeSet><name>guest.ipAddress</name><op>remove</op></changeSet></objectSet></filterSet></returnval>"#,
        );
        apply(&mut st, &unset);
        assert!(st.vms[&vm].vm.addresses.is_empty());
        let leave = parse(
            r#"<returnval xmlns="urn:vim25"><filterSet><objectSet><kind>leave</kind><obj type="VirtualMachine">vm-1</obj></objectSet></filterSet></returnval>"#,
        );
        apply(&mut st, &leave);
        assert!(st.vms.is_empty() && st.by_uuid.is_empty());
    }

    #[test]
    fn task_updates_end_the_tasks_waited_for() {
        let mut st = State::default();
        let ok = Moref::new("Task", "task-1");
        let bad = Moref::new("Task", "task-2");
        st.tasks.insert(ok.clone(), TaskSlot::default());
        st.tasks.insert(bad.clone(), TaskSlot::default());
        let update = parse(
            r#"<returnval xmlns="urn:vim25" xmlns:x="http://www.w3.org/2001/XMLSchema-instance"><filterSet><objectSet><kind>enter</kind><obj type="Task">task-1</obj><changeSet><name>info.state</name><op>assign</op><val>success</val></changeSet><changeSet><name>info.result</name><op>assign</op><val x:type="ManagedObjectReference" type="VirtualMachine">vm-9</val></changeSet></objectSet><objectSet><kind>enter</kind><obj type="Task">task-2</obj><changeSet><name>info.state</name><op>assign</op><val>running</val></changeSet></objectSet><objectSet><kind>enter</kind><obj type="Task">task-3</obj><changeSet><name>info.state</name><op>assign</op><val>success</val></changeSet></objectSet></filterSet></returnval>"#,
        );
        apply(&mut st, &update);
        let result = st.tasks[&ok].outcome.clone().unwrap().unwrap().unwrap();
        assert_eq!(
            Moref::from_element(&result),
            Some(Moref::new("VirtualMachine", "vm-9"))
        );
        assert!(st.tasks[&bad].outcome.is_none());
        let failed = parse(
            r#"<returnval xmlns="urn:vim25" xmlns:x="http://www.w3.org/2001/XMLSchema-instance"><filterSet><objectSet><kind>modify</kind><obj type="Task">task-2</obj><changeSet><name>info.state</name><op>assign</op><val>error</val></changeSet><changeSet><name>info.error</name><op>assign</op><val><fault x:type="InsufficientMemoryResourcesFault"/><localizedMessage>full</localizedMessage></val></changeSet></objectSet></filterSet></returnval>"#,
        );
        apply(&mut st, &failed);
        let fault = st.tasks[&bad].outcome.clone().unwrap().unwrap_err();
        assert_eq!(fault.kind, "InsufficientMemoryResourcesFault");
        assert!(!st.tasks.contains_key(&Moref::new("Task", "task-3")));
    }
}
