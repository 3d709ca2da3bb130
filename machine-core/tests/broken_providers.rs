//! The conformance suite catches broken providers: a small in-memory provider, correct
//! by default, with one switch per promise; each broken variant must fail the suite with
//! a message naming the promise it breaks, and the correct one (also one that declares
//! only shell-script user data) must pass.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use machine_core::conformance::{self, BackendFault, Clients, FaultHook, Fixture};
use machine_core::{
    Address, AddressKind, Capabilities, Connector, Error, ErrorKind, ExecOutput, ExecRequest,
    FileUpload, Labels, Machine, MachineName, MachineProvisioner, MachineSpec, Phase, PowerOp,
    PowerOperations, ProviderId, Result, SizeBasis, SshEndpoint, Transport, UserData,
    UserDataDelivery, UserDataFormat,
};

/// One promise broken on purpose.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
enum Broken {
    #[default]
    Nothing,
    /// Machines stay Pending forever.
    NeverBoots,
    /// Machines reach Provisioning and stay there.
    StuckProvisioning,
    /// Create checks for the name, then yields before storing: two racing creates both
    /// make a machine.
    RacyCreate,
    /// find returns machines of every owner.
    FindIgnoresOwner,
    /// list returns machines in reverse name order.
    ReverseList,
    /// power answers Ok whatever the capabilities say.
    PowerAlwaysOk,
    /// get drops the labels.
    GetDropsLabels,
    /// create checks only the size of user data, not its format.
    AcceptsAnyFormat,
    /// A stopped machine is reported Provisioning, as EC2's stopped instances were.
    StoppedIsProvisioning,
    /// Running machines have no addresses.
    NoAddresses,
    /// Host-key discovery is declared, but no key is ever reported.
    NoHostKeys,
    /// Label values are stored lowercased, as a case-folding backend would.
    LowercasesLabels,
    /// The spec's size is taken and silently dropped.
    DropsSize,
    /// find matches a machine whose name the asked name starts with (a tag filter with a
    /// trailing wildcard): find("web-10") returns "web-1".
    PrefixFind,
    /// Names are compared on their first 60 characters only.
    TruncatedNames,
    /// After a delete, get reports the machine running for a few more looks.
    DeleteLags,
    /// A stop changes the phase only: the machine still answers over its transport.
    StopChangesOnlyThePhase,
    /// A quota answer from the backend is reported as a transient error.
    QuotaIsTransient,
    /// Create records the machine, then (at an await point) starts its boot; a create
    /// adopting a record whose boot never started returns it as it is: Provisioning
    /// for ever, as the Redfish pool's claims were.
    AdoptsUnbootedRecords,
    /// Delete marks the machine releasing, then (at an await point) deletes it; a delete
    /// of a releasing machine returns at once: Deleting for ever.
    TrustsReleasingMarks,
    /// Creates in flight count against the backend's room, so replicas racing for names
    /// are refused with quota while machines are free.
    InFlightFillsThePool,
}

#[derive(Clone)]
struct Stored {
    name: MachineName,
    owner: String,
    labels: Labels,
    size: Option<String>,
    user_data: Option<UserData>,
    /// The boot was started (a crash between record and boot leaves `false`).
    booting: bool,
    releasing: bool,
    deleted: bool,
    stopped: bool,
    polls: u32,
    /// Looks at the machine since its delete, for `DeleteLags`.
    since_delete: u32,
}

/// Machines shared by every client of one backend, and the backend's switches.
#[derive(Clone, Default)]
struct Backend {
    machines: Arc<Mutex<BTreeMap<u64, Stored>>>,
    next: Arc<AtomicU64>,
    fault: Arc<Mutex<Option<BackendFault>>>,
    answered: Arc<AtomicU64>,
    in_flight: Arc<AtomicU64>,
}

/// How many machines the backend holds at once.
const CAPACITY: usize = 4;

struct Memory {
    backend: Backend,
    owner: String,
    broken: Broken,
    caps: Capabilities,
}

impl fmt::Display for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "memory(owner={})", self.owner)
    }
}

fn capabilities(formats: Vec<UserDataFormat>, power: PowerOperations) -> Capabilities {
    Capabilities::default()
        .with_user_data(UserDataDelivery::new(4096, SizeBasis::Raw, formats))
        .with_power(power)
        .with_host_key_discovery(true)
}

const HOST_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl memory";

impl Memory {
    fn id(n: u64) -> ProviderId {
        ProviderId::new(format!("mem:///{n}")).unwrap()
    }

    fn number(id: &ProviderId) -> Option<u64> {
        id.as_str().strip_prefix("mem:///")?.parse().ok()
    }

    fn view(&self, n: u64, s: &mut Stored) -> Machine {
        s.polls += 1;
        if s.deleted || s.releasing {
            s.since_delete += 1;
        }
        let lagging = self.broken == Broken::DeleteLags && s.since_delete <= 2;
        let phase = match self.broken {
            _ if lagging && s.deleted => Phase::Provisioned,
            _ if s.deleted => Phase::Deleted,
            _ if s.releasing => Phase::Deleting,
            Broken::StoppedIsProvisioning if s.stopped => Phase::Provisioning,
            _ if s.stopped => Phase::Stopped,
            Broken::NeverBoots => Phase::Pending,
            Broken::StuckProvisioning => Phase::Provisioning,
            _ if !s.booting => Phase::Provisioning,
            _ if s.polls > 2 => Phase::Provisioned,
            _ => Phase::Provisioning,
        };
        let mut m = Machine::new(s.name.clone(), Memory::id(n), phase);
        m.labels = s.labels.clone();
        m.size = s.size.clone();
        if phase.is_running() {
            if self.broken != Broken::NoAddresses {
                m.addresses = vec![Address::new(AddressKind::InternalIP, format!("10.0.0.{n}"))];
            }
            m.access.ssh = Some(SshEndpoint::new(format!("10.0.0.{n}"), 22, "root"));
            if self.broken != Broken::NoHostKeys {
                m.access.host_keys = vec![HOST_KEY.to_owned()];
            }
        }
        m
    }

    fn mine(&self, s: &Stored) -> bool {
        s.owner == self.owner
    }

    fn same_name(&self, stored: &MachineName, asked: &MachineName) -> bool {
        match self.broken {
            Broken::PrefixFind => asked.as_str().starts_with(stored.as_str()),
            Broken::TruncatedNames => {
                let cut = |n: &MachineName| n.as_str().chars().take(60).collect::<String>();
                cut(stored) == cut(asked)
            }
            _ => stored == asked,
        }
    }

    /// The backend's answer to a launch while a fault is injected.
    fn refusal(&self) -> Option<Error> {
        let fault = (*self.backend.fault.lock().unwrap())?;
        self.backend.answered.fetch_add(1, Ordering::SeqCst);
        Some(match fault {
            BackendFault::Quota if self.broken == Broken::QuotaIsTransient => {
                Error::transient("instance limit exceeded")
            }
            BackendFault::Quota => Error::quota_exceeded("instance limit exceeded"),
            BackendFault::Capacity => Error::insufficient_capacity("no room in the zone"),
            BackendFault::Permission => Error::new(ErrorKind::Unauthorized, "not allowed"),
            _ => Error::throttled("slow down", Some(Duration::from_millis(1))),
        })
    }
}

#[async_trait]
impl MachineProvisioner for Memory {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        spec.validate()?;
        if let Some(ud) = user_data {
            let delivery = self.caps.user_data.as_ref().unwrap();
            let undeclared =
                !delivery.formats.contains(&ud.format) && self.broken != Broken::AcceptsAnyFormat;
            if ud.bytes.len() > delivery.max_bytes || undeclared {
                return Err(Error::invalid_spec("userData", "does not fit"));
            }
        }
        if let Some(e) = self.refusal() {
            return Err(e);
        }
        if self.broken == Broken::InFlightFillsThePool {
            self.backend.in_flight.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(2)).await;
            let in_flight = self.backend.in_flight.fetch_sub(1, Ordering::SeqCst) as usize;
            let held = self
                .backend
                .machines
                .lock()
                .unwrap()
                .values()
                .filter(|s| !s.deleted)
                .count();
            if held + in_flight > CAPACITY {
                return Err(Error::quota_exceeded("the pool is full"));
            }
        }
        if self.broken == Broken::RacyCreate {
            if let Some(m) = self.find(&spec.name).await? {
                return Ok(m);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let n = {
            let mut all = self.backend.machines.lock().unwrap();
            if self.broken != Broken::RacyCreate {
                // The check and the insert under one lock: what a real backend's
                // idempotency token or a conditional write gives.
                if let Some((n, s)) = all.iter_mut().find(|(_, s)| {
                    !s.deleted && s.owner == self.owner && self.same_name(&s.name, &spec.name)
                }) {
                    let n = *n;
                    // Adopting finishes what a crashed create left: its boot.
                    if self.broken != Broken::AdoptsUnbootedRecords {
                        s.booting = true;
                    }
                    return Ok(self.view(n, s));
                }
            }
            let n = self.backend.next.fetch_add(1, Ordering::SeqCst);
            let labels = if self.broken == Broken::LowercasesLabels {
                spec.labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_lowercase()))
                    .collect()
            } else {
                spec.labels.clone()
            };
            all.insert(
                n,
                Stored {
                    name: spec.name.clone(),
                    owner: self.owner.clone(),
                    labels,
                    size: spec
                        .size
                        .clone()
                        .filter(|_| self.broken != Broken::DropsSize),
                    user_data: user_data.cloned(),
                    booting: false,
                    releasing: false,
                    deleted: false,
                    stopped: false,
                    polls: 0,
                    since_delete: 0,
                },
            );
            n
        };
        // The record is written; starting the boot is a second step, as on a real
        // backend (claim, then power on). A crash here leaves an unbooted record.
        tokio::task::yield_now().await;
        let mut all = self.backend.machines.lock().unwrap();
        let s = all.get_mut(&n).expect("just stored");
        s.booting = true;
        Ok(self.view(n, s))
    }

    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        let mut all = self.backend.machines.lock().unwrap();
        let n = Memory::number(id).ok_or_else(|| Error::not_found(format!("{id}")))?;
        match all.get_mut(&n) {
            Some(s) if self.mine(s) => {
                let mut m = self.view(n, s);
                if self.broken == Broken::GetDropsLabels {
                    m.labels.clear();
                }
                Ok(m)
            }
            _ => Err(Error::not_found(format!("no machine {id}"))),
        }
    }

    async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
        let mut all = self.backend.machines.lock().unwrap();
        let ignore_owner = self.broken == Broken::FindIgnoresOwner;
        Ok(all
            .iter_mut()
            .find(|(_, s)| {
                !s.deleted
                    && self.same_name(&s.name, name)
                    && (ignore_owner || s.owner == self.owner)
            })
            .map(|(n, s)| self.view(*n, s)))
    }

    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
        let mut all = self.backend.machines.lock().unwrap();
        let mut out: Vec<_> = all
            .iter_mut()
            .filter(|(_, s)| {
                !s.deleted
                    && s.owner == self.owner
                    && selector.iter().all(|(k, v)| s.labels.get(k) == Some(v))
            })
            .map(|(n, s)| self.view(*n, s))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        if self.broken == Broken::ReverseList {
            out.reverse();
        }
        Ok(out)
    }

    async fn delete(&self, id: &ProviderId) -> Result<()> {
        let Some(n) = Memory::number(id) else {
            return Ok(());
        };
        {
            let mut all = self.backend.machines.lock().unwrap();
            match all.get_mut(&n) {
                Some(s) if self.mine(s) && !s.deleted => {
                    if s.releasing && self.broken == Broken::TrustsReleasingMarks {
                        return Ok(());
                    }
                    s.releasing = true;
                }
                _ => return Ok(()),
            }
        }
        // Releasing is marked; the removal is a second step. A crash here leaves the
        // mark, which the next delete must finish.
        tokio::task::yield_now().await;
        if let Some(s) = self.backend.machines.lock().unwrap().get_mut(&n) {
            s.deleted = true;
        }
        Ok(())
    }

    async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>> {
        let all = self.backend.machines.lock().unwrap();
        match Memory::number(id).and_then(|n| all.get(&n)) {
            Some(s) if self.mine(s) => Ok(s.user_data.clone()),
            _ => Err(Error::not_found(format!("no machine {id}"))),
        }
    }

    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        if self.broken != Broken::PowerAlwaysOk && !self.caps.power.supports(op) {
            return Err(machine_core::unsupported_power_op(self, op));
        }
        let mut all = self.backend.machines.lock().unwrap();
        if let Some(s) = Memory::number(id).and_then(|n| all.get_mut(&n))
            && self.mine(s)
        {
            match op {
                PowerOp::Stop => s.stopped = true,
                _ => {
                    // Boots again: running after the same polls as a new machine.
                    s.stopped = false;
                    s.polls = 0;
                }
            }
        }
        Ok(())
    }

    async fn console_output(&self, _id: &ProviderId) -> Result<Option<String>> {
        Ok(None)
    }

    async fn bootstrap_finished(&self, machine: &Machine) -> Result<()> {
        if self.caps.withdraws_user_data {
            let mut all = self.backend.machines.lock().unwrap();
            if let Some(s) = Memory::number(&machine.provider_id).and_then(|n| all.get_mut(&n)) {
                s.user_data = None;
            }
        }
        Ok(())
    }
}

/// The backend's fault switch, as the suite's hook.
struct MemoryFaults(Backend);

#[async_trait]
impl FaultHook for MemoryFaults {
    fn supports(&self, _fault: BackendFault) -> bool {
        true
    }
    async fn inject(&self, fault: BackendFault) {
        *self.0.fault.lock().unwrap() = Some(fault);
        self.0.answered.store(0, Ordering::SeqCst);
    }
    async fn clear(&self) {
        *self.0.fault.lock().unwrap() = None;
    }
    fn answered(&self) -> u64 {
        self.0.answered.load(Ordering::SeqCst)
    }
}

/// Reaches a machine while it is powered in the backend; `StopChangesOnlyThePhase`
/// leaves it reachable after a stop.
struct MemoryConnector {
    backend: Backend,
    broken: Broken,
}

struct MemoryTransport;

#[async_trait]
impl Transport for MemoryTransport {
    async fn exec(&self, _request: &ExecRequest) -> Result<ExecOutput> {
        Ok(ExecOutput::new(Some(0), Vec::new(), Vec::new()))
    }
    async fn upload(&self, _file: &FileUpload) -> Result<()> {
        Ok(())
    }
    async fn read_file(&self, _path: &str, _max_bytes: usize) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }
}

#[async_trait]
impl Connector for MemoryConnector {
    async fn connect(&self, machine: &Machine) -> Result<Arc<dyn Transport>> {
        let all = self.backend.machines.lock().unwrap();
        let up = Memory::number(&machine.provider_id)
            .and_then(|n| all.get(&n))
            .is_some_and(|s| {
                !s.deleted && (!s.stopped || self.broken == Broken::StopChangesOnlyThePhase)
            });
        if up {
            Ok(Arc::new(MemoryTransport))
        } else {
            Err(Error::transient(format!(
                "{} does not answer",
                machine.name
            )))
        }
    }
}

/// A wrapper that forgets to forward `bootstrap_finished`: the trait's default does
/// nothing, so the provider inside never withdraws its user data.
struct Forgetful(Arc<dyn MachineProvisioner>);

impl fmt::Display for Forgetful {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Forgetful({})", self.0)
    }
}

#[async_trait]
impl MachineProvisioner for Forgetful {
    fn capabilities(&self) -> &Capabilities {
        self.0.capabilities()
    }
    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        self.0.create(spec, user_data).await
    }
    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        self.0.get(id).await
    }
    async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
        self.0.find(name).await
    }
    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
        self.0.list(selector).await
    }
    async fn delete(&self, id: &ProviderId) -> Result<()> {
        self.0.delete(id).await
    }
    async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>> {
        self.0.user_data(id).await
    }
    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        self.0.power(id, op).await
    }
    async fn console_output(&self, id: &ProviderId) -> Result<Option<String>> {
        self.0.console_output(id).await
    }
}

/// What a test varies: the broken promise, the formats and power declared, whether
/// user data is withdrawn, and a wrapper around every client.
#[derive(Clone)]
struct Setup {
    broken: Broken,
    formats: Vec<UserDataFormat>,
    power: PowerOperations,
    withdraws: bool,
    wrap: fn(Arc<dyn MachineProvisioner>) -> Arc<dyn MachineProvisioner>,
}

impl Setup {
    fn new(broken: Broken) -> Self {
        Setup {
            broken,
            formats: vec![UserDataFormat::CloudConfig, UserDataFormat::ShellScript],
            power: PowerOperations::none(),
            withdraws: false,
            wrap: |p| p,
        }
    }

    fn formats(mut self, formats: Vec<UserDataFormat>) -> Self {
        self.formats = formats;
        self
    }

    fn power(mut self) -> Self {
        self.power = PowerOperations::all();
        self
    }

    fn withdrawing(mut self) -> Self {
        self.withdraws = true;
        self
    }

    /// The clients and a fixture that knows the backend (connector, faults, sizes).
    fn build(self) -> (Clients, Fixture) {
        let backend = Backend::default();
        let make = {
            let (backend, this) = (backend.clone(), self.clone());
            move |owner: &str| -> Arc<dyn MachineProvisioner> {
                (this.wrap)(Arc::new(Memory {
                    backend: backend.clone(),
                    owner: owner.into(),
                    broken: this.broken,
                    caps: capabilities(this.formats.clone(), this.power)
                        .with_withdrawn_user_data(this.withdraws),
                }))
            }
        };
        let fresh = make.clone();
        let clients = Clients::new(make("me"), make("me"), make("them")).with_fresh(move || {
            let p = fresh("me");
            Box::pin(async move { p })
        });
        let mut fx = Fixture::new("mem:///999999", |name| MachineSpec::new(name.clone()));
        fx.boot_timeout = Duration::from_millis(500);
        fx.timeout = Duration::from_millis(500);
        fx.poll = Duration::from_millis(5);
        fx.sizes = vec!["small".into(), "Big-2x4096".into()];
        fx.connector = Some(Arc::new(MemoryConnector {
            backend: backend.clone(),
            broken: self.broken,
        }));
        fx.faults = Some(Arc::new(MemoryFaults(backend)));
        fx.capacity = Some(CAPACITY);
        (clients, fx)
    }
}

fn setup(broken: Broken) -> (Clients, Fixture) {
    Setup::new(broken).build()
}

#[tokio::test]
async fn a_correct_provider_passes() {
    let (c, fx) = setup(Broken::Nothing);
    conformance::run_all(&c, &fx).await;
}

#[tokio::test]
async fn a_correct_provider_with_power_operations_and_withdrawn_user_data_passes() {
    let (c, fx) = Setup::new(Broken::Nothing)
        .formats(vec![UserDataFormat::CloudConfig])
        .power()
        .withdrawing()
        .build();
    conformance::run_all(&c, &fx).await;
}

#[tokio::test]
async fn a_correct_provider_without_sizes_refuses_them_and_passes() {
    let (c, mut fx) = setup(Broken::Nothing);
    fx.sizes.clear();
    // Memory takes any size; wrapped so that it refuses one, as a provider without
    // sizes must.
    struct NoSizes(Arc<dyn MachineProvisioner>);
    impl fmt::Display for NoSizes {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "NoSizes({})", self.0)
        }
    }
    #[async_trait]
    impl MachineProvisioner for NoSizes {
        fn capabilities(&self) -> &Capabilities {
            self.0.capabilities()
        }
        async fn create(&self, spec: &MachineSpec, ud: Option<&UserData>) -> Result<Machine> {
            if spec.size.is_some() {
                return Err(Error::invalid_spec("size", "this provider takes no size"));
            }
            self.0.create(spec, ud).await
        }
        async fn get(&self, id: &ProviderId) -> Result<Machine> {
            self.0.get(id).await
        }
        async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
            self.0.find(name).await
        }
        async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
            self.0.list(selector).await
        }
        async fn delete(&self, id: &ProviderId) -> Result<()> {
            self.0.delete(id).await
        }
        async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>> {
            self.0.user_data(id).await
        }
        async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
            self.0.power(id, op).await
        }
        async fn console_output(&self, id: &ProviderId) -> Result<Option<String>> {
            self.0.console_output(id).await
        }
    }
    let c = Clients::new(
        Arc::new(NoSizes(c.provider.clone())),
        c.replica.clone(),
        c.other_owner.clone(),
    );
    conformance::the_spec_is_honoured(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "was not Stopped after a stop within 500ms: still Provisioning")]
async fn a_stopped_machine_reported_as_provisioning_fails() {
    let (c, fx) = Setup::new(Broken::StoppedIsProvisioning).power().build();
    conformance::run_all(&c, &fx).await;
}

#[tokio::test]
async fn a_provider_declaring_only_shell_scripts_passes() {
    let (c, fx) = Setup::new(Broken::Nothing)
        .formats(vec![UserDataFormat::ShellScript])
        .build();
    conformance::run_all(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "machine never reached running")]
async fn machines_that_never_boot_fail() {
    let (c, fx) = setup(Broken::NeverBoots);
    conformance::machines_reach_running(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "machine never reached running within 500ms: still Provisioning")]
async fn a_phase_stuck_at_provisioning_fails() {
    let (c, fx) = setup(Broken::StuckProvisioning);
    conformance::run_all(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "two concurrent creates of one name made 2 machines")]
async fn racing_creates_that_make_two_machines_fail() {
    let (c, fx) = setup(Broken::RacyCreate);
    conformance::run_all(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "find returns another owner's machine")]
async fn find_returning_another_owners_machines_fails() {
    let (c, fx) = setup(Broken::FindIgnoresOwner);
    conformance::run_all(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "list is not in name order")]
async fn a_reversed_list_fails() {
    let (c, fx) = setup(Broken::ReverseList);
    conformance::run_all(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "power Start succeeded though capabilities deny it")]
async fn power_operations_answered_ok_against_the_capabilities_fail() {
    let (c, fx) = setup(Broken::PowerAlwaysOk);
    conformance::run_all(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "labels do not round-trip: get lost label")]
async fn get_dropping_labels_fails() {
    let (c, fx) = setup(Broken::GetDropsLabels);
    conformance::run_all(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "user data of undeclared format")]
async fn accepting_undeclared_user_data_fails() {
    let (c, fx) = setup(Broken::AcceptsAnyFormat);
    conformance::run_all(&c, &fx).await;
}

// The cases of issue 22, each run alone so that the message must name its promise.

#[tokio::test]
#[should_panic(expected = "a running machine has no addresses")]
async fn running_machines_without_addresses_fail() {
    let (c, fx) = setup(Broken::NoAddresses);
    conformance::running_machines_say_how_to_reach_them(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "declares host_key_discovery but a running machine has no host_keys")]
async fn declared_host_key_discovery_without_keys_fails() {
    let (c, fx) = setup(Broken::NoHostKeys);
    conformance::running_machines_say_how_to_reach_them(&c, &fx).await;
}

#[tokio::test]
#[should_panic(
    expected = "the spec is not honoured: get reads label Mixed.Case/Key as Some(\"mixed-value_1.x\")"
)]
async fn case_folded_labels_fail() {
    let (c, fx) = setup(Broken::LowercasesLabels);
    conformance::the_spec_is_honoured(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "the spec is not honoured: get reads the size as None, not \"small\"")]
async fn a_dropped_size_fails() {
    let (c, fx) = setup(Broken::DropsSize);
    conformance::the_spec_is_honoured(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "a size was accepted by a provider whose fixture lists none")]
async fn a_silently_ignored_size_fails() {
    let (c, mut fx) = setup(Broken::DropsSize);
    fx.sizes.clear();
    conformance::the_spec_is_honoured(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "names are not exact: find(")]
async fn a_prefix_match_on_names_fails() {
    let (c, fx) = setup(Broken::PrefixFind);
    conformance::names_are_exact(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "names are not exact")]
async fn names_compared_on_a_prefix_of_their_length_fail() {
    let (c, fx) = setup(Broken::TruncatedNames);
    conformance::names_are_exact(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "delete is not seen: get reports Provisioned after delete returned")]
async fn a_deleted_machine_reported_running_fails() {
    let (c, fx) = setup(Broken::DeleteLags);
    conformance::delete_is_seen(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "power has no effect: a machine reported Stopped still runs commands")]
async fn a_stop_that_changes_only_the_phase_fails() {
    let (c, fx) = Setup::new(Broken::StopChangesOnlyThePhase).power().build();
    conformance::power_has_effect(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "the backend's Quota answer came back (bare) as another kind")]
async fn quota_reported_as_transient_fails() {
    let (c, fx) = setup(Broken::QuotaIsTransient);
    conformance::backend_faults_come_back_with_their_kind(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "was not running after a crash at await point")]
async fn adopting_a_record_whose_boot_never_started_fails() {
    let (c, fx) = setup(Broken::AdoptsUnbootedRecords);
    conformance::create_survives_a_crash_at_any_point(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "was not gone 500ms after delete")]
async fn a_delete_trusting_a_crashed_deletes_mark_fails() {
    let (c, fx) = setup(Broken::TrustsReleasingMarks);
    conformance::delete_survives_a_crash_at_any_point(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "replicas creating")]
async fn racing_replicas_that_make_two_machines_fail() {
    let (c, fx) = setup(Broken::RacyCreate);
    conformance::replicas_creating_one_name_make_one_machine(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "with a limit or conflict while the backend had room")]
async fn replicas_refused_with_quota_while_the_pool_has_room_fail() {
    let (c, fx) = setup(Broken::InFlightFillsThePool);
    conformance::replicas_creating_one_name_make_one_machine(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "the user data is still readable after bootstrap_finished")]
async fn a_wrapper_that_does_not_forward_bootstrap_finished_fails() {
    let mut setup = Setup::new(Broken::Nothing).withdrawing();
    setup.wrap = |p| Arc::new(Forgetful(p)) as Arc<dyn MachineProvisioner>;
    let (c, fx) = setup.build();
    conformance::bootstrap_finished_withdraws_user_data(&c, &fx).await;
}

#[tokio::test]
#[should_panic(expected = "needs new provider instances: set Clients::with_fresh")]
async fn crash_cases_without_a_way_to_make_new_instances_fail_loudly() {
    let (c, fx) = setup(Broken::Nothing);
    let c = Clients::new(c.provider, c.replica, c.other_owner);
    conformance::create_survives_a_crash_at_any_point(&c, &fx).await;
}

/// A provider that declares only shell scripts takes a coupled layer: the composer sends
/// the layer's script as it is (a multipart of one would be refused), and the machine is
/// made with it.
#[tokio::test]
async fn a_provider_declaring_only_shell_scripts_takes_a_coupled_layer() {
    use machine_core::steps::{Step, StepLayer};
    use machine_core::{CancellationToken, Composer};
    let (c, fx) = Setup::new(Broken::Nothing)
        .formats(vec![UserDataFormat::ShellScript])
        .build();
    let layer = StepLayer::new("base", vec![Step::write_file("/etc/motd", "hi\n")]).unwrap();
    let composer = Composer::builder(c.provider.clone())
        .coupled(Arc::new(layer))
        .build()
        .unwrap();
    let spec = MachineSpec::new(MachineName::new(format!("{}-scripts", fx.prefix)).unwrap());
    let done = composer
        .provision(&spec, &CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("a shell-script-only provider refused a coupled layer: {e}"));
    let sent = c
        .provider
        .user_data(&done.machine.provider_id)
        .await
        .unwrap()
        .expect("the machine was made with user data");
    assert_eq!(sent.format, UserDataFormat::ShellScript);
    assert!(
        sent.bytes.starts_with(b"#!") && String::from_utf8_lossy(&sent.bytes).contains("/etc/motd"),
        "{}",
        String::from_utf8_lossy(&sent.bytes)
    );
}
