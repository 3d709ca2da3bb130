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
use machine_core::conformance::{self, Clients, Fixture};
use machine_core::{
    Capabilities, Error, Labels, Machine, MachineName, MachineProvisioner, MachineSpec, Phase,
    PowerOp, PowerOperations, ProviderId, Result, SizeBasis, UserData, UserDataDelivery,
    UserDataFormat,
};

/// One promise broken on purpose.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
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
}

struct Stored {
    name: MachineName,
    owner: String,
    labels: Labels,
    user_data: Option<UserData>,
    deleted: bool,
    stopped: bool,
    polls: u32,
}

/// Machines shared by every client of one backend.
#[derive(Clone, Default)]
struct Backend {
    machines: Arc<Mutex<BTreeMap<u64, Stored>>>,
    next: Arc<AtomicU64>,
}

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
}

impl Memory {
    fn id(n: u64) -> ProviderId {
        ProviderId::new(format!("mem:///{n}")).unwrap()
    }

    fn number(id: &ProviderId) -> Option<u64> {
        id.as_str().strip_prefix("mem:///")?.parse().ok()
    }

    fn view(&self, n: u64, s: &mut Stored) -> Machine {
        s.polls += 1;
        let phase = match self.broken {
            _ if s.deleted => Phase::Deleted,
            Broken::StoppedIsProvisioning if s.stopped => Phase::Provisioning,
            _ if s.stopped => Phase::Stopped,
            Broken::NeverBoots => Phase::Pending,
            Broken::StuckProvisioning => Phase::Provisioning,
            _ if s.polls > 2 => Phase::Provisioned,
            _ => Phase::Provisioning,
        };
        let mut m = Machine::new(s.name.clone(), Memory::id(n), phase);
        m.labels = s.labels.clone();
        m
    }

    fn mine(&self, s: &Stored) -> bool {
        s.owner == self.owner
    }
}

#[async_trait]
impl MachineProvisioner for Memory {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        if let Some(ud) = user_data {
            let delivery = self.caps.user_data.as_ref().unwrap();
            let undeclared =
                !delivery.formats.contains(&ud.format) && self.broken != Broken::AcceptsAnyFormat;
            if ud.bytes.len() > delivery.max_bytes || undeclared {
                return Err(Error::invalid_spec("userData", "does not fit"));
            }
        }
        if let Some(m) = self.find(&spec.name).await? {
            return Ok(m);
        }
        if self.broken == Broken::RacyCreate {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut all = self.backend.machines.lock().unwrap();
        if self.broken != Broken::RacyCreate {
            // The check and the insert under one lock: what a real backend's
            // idempotency token or a conditional write gives.
            if let Some((n, s)) = all
                .iter_mut()
                .find(|(_, s)| !s.deleted && s.owner == self.owner && s.name == spec.name)
            {
                return Ok(self.view(*n, s));
            }
        }
        let n = self.backend.next.fetch_add(1, Ordering::SeqCst);
        let mut stored = Stored {
            name: spec.name.clone(),
            owner: self.owner.clone(),
            labels: spec.labels.clone(),
            user_data: user_data.cloned(),
            deleted: false,
            stopped: false,
            polls: 0,
        };
        let m = self.view(n, &mut stored);
        all.insert(n, stored);
        Ok(m)
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
            .find(|(_, s)| !s.deleted && &s.name == name && (ignore_owner || s.owner == self.owner))
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
        let mut all = self.backend.machines.lock().unwrap();
        if let Some(s) = Memory::number(id).and_then(|n| all.get_mut(&n))
            && s.owner == self.owner
        {
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
}

fn clients_with(broken: Broken, formats: Vec<UserDataFormat>) -> Clients {
    clients_with_power(broken, formats, PowerOperations::none())
}

fn clients_with_power(
    broken: Broken,
    formats: Vec<UserDataFormat>,
    power: PowerOperations,
) -> Clients {
    let backend = Backend::default();
    let make = |owner: &str| -> Arc<dyn MachineProvisioner> {
        Arc::new(Memory {
            backend: backend.clone(),
            owner: owner.into(),
            broken,
            caps: capabilities(formats.clone(), power),
        })
    };
    Clients::new(make("me"), make("me"), make("them"))
}

fn clients(broken: Broken) -> Clients {
    clients_with(
        broken,
        vec![UserDataFormat::CloudConfig, UserDataFormat::ShellScript],
    )
}

fn fixture() -> Fixture {
    let mut fx = Fixture::new("mem:///999999", |name| MachineSpec::new(name.clone()));
    fx.boot_timeout = Duration::from_millis(500);
    fx.timeout = Duration::from_millis(500);
    fx.poll = Duration::from_millis(5);
    fx
}

#[tokio::test]
async fn a_correct_provider_passes() {
    conformance::run_all(&clients(Broken::Nothing), &fixture()).await;
}

#[tokio::test]
async fn a_correct_provider_with_power_operations_passes() {
    let c = clients_with_power(
        Broken::Nothing,
        vec![UserDataFormat::CloudConfig],
        PowerOperations::all(),
    );
    conformance::run_all(&c, &fixture()).await;
}

#[tokio::test]
#[should_panic(expected = "was not Stopped after a stop within 500ms: still Provisioning")]
async fn a_stopped_machine_reported_as_provisioning_fails() {
    let c = clients_with_power(
        Broken::StoppedIsProvisioning,
        vec![UserDataFormat::CloudConfig],
        PowerOperations::all(),
    );
    conformance::run_all(&c, &fixture()).await;
}

#[tokio::test]
async fn a_provider_declaring_only_shell_scripts_passes() {
    let c = clients_with(Broken::Nothing, vec![UserDataFormat::ShellScript]);
    conformance::run_all(&c, &fixture()).await;
}

#[tokio::test]
#[should_panic(expected = "machine never reached running")]
async fn machines_that_never_boot_fail() {
    conformance::machines_reach_running(&clients(Broken::NeverBoots), &fixture()).await;
}

#[tokio::test]
#[should_panic(expected = "machine never reached running within 500ms: still Provisioning")]
async fn a_phase_stuck_at_provisioning_fails() {
    conformance::run_all(&clients(Broken::StuckProvisioning), &fixture()).await;
}

#[tokio::test]
#[should_panic(expected = "two concurrent creates of one name made 2 machines")]
async fn racing_creates_that_make_two_machines_fail() {
    conformance::run_all(&clients(Broken::RacyCreate), &fixture()).await;
}

#[tokio::test]
#[should_panic(expected = "find returns another owner's machine")]
async fn find_returning_another_owners_machines_fails() {
    conformance::run_all(&clients(Broken::FindIgnoresOwner), &fixture()).await;
}

#[tokio::test]
#[should_panic(expected = "list is not in name order")]
async fn a_reversed_list_fails() {
    conformance::run_all(&clients(Broken::ReverseList), &fixture()).await;
}

#[tokio::test]
#[should_panic(expected = "power Start succeeded though capabilities deny it")]
async fn power_operations_answered_ok_against_the_capabilities_fail() {
    conformance::run_all(&clients(Broken::PowerAlwaysOk), &fixture()).await;
}

#[tokio::test]
#[should_panic(expected = "labels do not round-trip: get lost label")]
async fn get_dropping_labels_fails() {
    conformance::run_all(&clients(Broken::GetDropsLabels), &fixture()).await;
}

#[tokio::test]
#[should_panic(expected = "user data of undeclared format")]
async fn accepting_undeclared_user_data_fails() {
    conformance::run_all(&clients(Broken::AcceptsAnyFormat), &fixture()).await;
}
