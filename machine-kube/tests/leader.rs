//! Two controller replicas behind a `coordination.k8s.io` Lease, each a whole
//! controller (`machine_kube::run_until`: watch, reconcile, status) on its own
//! connection to the stand-in API server, over one simulated cloud. Every provider
//! call of each replica is logged: the replicas' calls never overlap in time, whether
//! the leader dies (its task aborted, as a killed process: no release) or is cut off
//! from the API server while it keeps running.

mod common;

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use machine_core::sim::{SimCloud, SimConfig, SimProvider};
use machine_core::{
    Capabilities, Composer, Error, Labels, Machine, MachineName, MachineProvisioner, MachineSpec,
    PowerOp, ProviderId, UserData,
};
use machine_kube::{Context, LeaderElection, MachineObject, Registry, run_until};
use serde_json::{Value, json};

use common::FakeApi;

const NS: &str = "default";
const LEASE: &str = "machine-kube";
const LEASE_DURATION: Duration = Duration::from_secs(2);
const RENEW_DEADLINE: Duration = Duration::from_secs(1);
const RETRY: Duration = Duration::from_millis(200);

/// (replica, start, end) of every provider call; a call still running has no end.
type Calls = Arc<Mutex<Vec<(&'static str, Instant, Option<Instant>)>>>;

/// A provider that logs each call of its replica.
struct Logged {
    replica: &'static str,
    inner: Arc<dyn MachineProvisioner>,
    calls: Calls,
}

/// Ends the logged call when dropped, also when the call's future is dropped midway.
struct CallGuard(Calls, usize);

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0.lock().unwrap()[self.1].2 = Some(Instant::now());
    }
}

impl Logged {
    fn call(&self) -> CallGuard {
        let mut calls = self.calls.lock().unwrap();
        calls.push((self.replica, Instant::now(), None));
        CallGuard(self.calls.clone(), calls.len() - 1)
    }
}

impl fmt::Display for Logged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (replica {})", self.inner, self.replica)
    }
}

#[async_trait]
impl MachineProvisioner for Logged {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    async fn create(
        &self,
        spec: &MachineSpec,
        user_data: Option<&UserData>,
    ) -> machine_core::Result<Machine> {
        let _g = self.call();
        self.inner.create(spec, user_data).await
    }
    async fn get(&self, id: &ProviderId) -> machine_core::Result<Machine> {
        let _g = self.call();
        self.inner.get(id).await
    }
    async fn find(&self, name: &MachineName) -> machine_core::Result<Option<Machine>> {
        let _g = self.call();
        self.inner.find(name).await
    }
    async fn list(&self, selector: &Labels) -> machine_core::Result<Vec<Machine>> {
        let _g = self.call();
        self.inner.list(selector).await
    }
    async fn delete(&self, id: &ProviderId) -> machine_core::Result<()> {
        let _g = self.call();
        self.inner.delete(id).await
    }
    async fn user_data(&self, id: &ProviderId) -> machine_core::Result<Option<UserData>> {
        let _g = self.call();
        self.inner.user_data(id).await
    }
    async fn power(&self, id: &ProviderId, op: PowerOp) -> machine_core::Result<()> {
        let _g = self.call();
        self.inner.power(id, op).await
    }
    async fn console_output(&self, id: &ProviderId) -> machine_core::Result<Option<String>> {
        let _g = self.call();
        self.inner.console_output(id).await
    }
    async fn bootstrap_finished(&self, machine: &Machine) -> machine_core::Result<()> {
        let _g = self.call();
        self.inner.bootstrap_finished(machine).await
    }
}

/// One replica: its own connection (listener) to the API server, its own provider
/// instance over the shared cloud, its own identity.
async fn replica(
    api: &FakeApi,
    cloud: &SimCloud,
    calls: &Calls,
    name: &'static str,
) -> (usize, tokio::task::JoinHandle<()>) {
    let (listener, client) = api.start_listener().await;
    let config = SimConfig::default()
        .with_boot_latency(Duration::from_millis(20))
        .with_boot_jitter(Duration::ZERO);
    let provider: Arc<dyn MachineProvisioner> = Arc::new(Logged {
        replica: name,
        inner: Arc::new(SimProvider::new(cloud.clone(), config).unwrap()),
        calls: calls.clone(),
    });
    let registry = Registry::new(move |p, _| {
        if p != "sim" {
            return Err(Error::invalid_spec("spec.provider", "only sim"));
        }
        Composer::builder(provider.clone()).build()
    });
    let election = LeaderElection::new(NS, LEASE, name)
        .with_timing(LEASE_DURATION, RENEW_DEADLINE, RETRY)
        .unwrap();
    // A short resync, so that a leader keeps calling its provider while it leads.
    let ctx = Context::new(client.clone(), registry)
        .with_resync(Duration::from_millis(100))
        .with_leader_election(election);
    let machines = kube::Api::<MachineObject>::all(client);
    let task = tokio::spawn(run_until(machines, Arc::new(ctx), std::future::pending()));
    (listener, task)
}

fn object(name: &str) -> Value {
    json!({
        "apiVersion": "machine-provisioning.dev/v1alpha1",
        "kind": "Machine",
        "metadata": { "name": name, "namespace": NS },
        "spec": { "provider": "sim", "machine": {} }
    })
}

fn holder(api: &FakeApi) -> Option<String> {
    api.object("leases", NS, LEASE)?["spec"]["holderIdentity"]
        .as_str()
        .map(str::to_owned)
}

/// Waits (generously: 30 s) for `done`.
async fn wait_for(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(30), "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn is_ready(api: &FakeApi, name: &str) -> bool {
    api.get(NS, name).is_some_and(|o| {
        o["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
    })
}

/// No call of one replica overlaps a call of the other; every call of `first` ends
/// before any of `second` starts.
fn assert_one_at_a_time(calls: &Calls, first: &str, second: &str) {
    let calls = calls.lock().unwrap();
    let last_of_first = calls
        .iter()
        .filter(|c| c.0 == first)
        .map(|c| c.2.expect("a call of the old leader never ended"))
        .max()
        .expect("the first leader called its provider");
    let first_of_second = calls
        .iter()
        .filter(|c| c.0 == second)
        .map(|c| c.1)
        .min()
        .expect("the new leader called its provider");
    assert!(
        last_of_first <= first_of_second,
        "{first} still called its provider {:?} after {second} began",
        last_of_first - first_of_second
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_other_replica_takes_over_within_the_lease_time_when_the_leader_dies() {
    let api = FakeApi::default();
    let cloud = SimCloud::new();
    let calls: Calls = Arc::default();
    let (_, a) = replica(&api, &cloud, &calls, "a").await;
    wait_for("a leads", || holder(&api).as_deref() == Some("a")).await;
    let (_, b) = replica(&api, &cloud, &calls, "b").await;
    api.insert(object("m-1"));
    wait_for("m-1 Ready", || is_ready(&api, "m-1")).await;
    assert_eq!(holder(&api).as_deref(), Some("a"), "b took a held lease");

    // Killed: no release; b waits until the lease is expired on its own clock.
    a.abort();
    let killed = Instant::now();
    api.insert(object("m-2"));
    wait_for("b leads", || holder(&api).as_deref() == Some("b")).await;
    let took = killed.elapsed();
    assert!(
        took >= LEASE_DURATION - RETRY * 2,
        "b took the lease after {took:?}, before it could have expired"
    );
    // Within the lease time of the last renewal, give or take b's tries (bounded
    // generously for a loaded machine).
    assert!(took <= LEASE_DURATION + Duration::from_secs(10), "{took:?}");
    wait_for("m-2 Ready under b", || is_ready(&api, "m-2")).await;
    let lease = api.object("leases", NS, LEASE).unwrap();
    assert_eq!(lease["spec"]["leaseTransitions"], 1, "{lease}");
    b.abort();
    assert_one_at_a_time(&calls, "a", "b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_server_stops_before_the_other_takes_over() {
    let api = FakeApi::default();
    let cloud = SimCloud::new();
    let calls: Calls = Arc::default();
    let (a_listener, a) = replica(&api, &cloud, &calls, "a").await;
    wait_for("a leads", || holder(&api).as_deref() == Some("a")).await;
    let (_, b) = replica(&api, &cloud, &calls, "b").await;
    api.insert(object("m-1"));
    wait_for("m-1 Ready", || is_ready(&api, "m-1")).await;

    // a keeps running, and keeps its machine in view every 100 ms, but can no longer
    // renew: it must stop before b's lease-duration wait is over.
    api.cut(a_listener);
    wait_for("b leads", || holder(&api).as_deref() == Some("b")).await;
    api.insert(object("m-2"));
    wait_for("m-2 Ready under b", || is_ready(&api, "m-2")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.abort();
    b.abort();
    assert_one_at_a_time(&calls, "a", "b");
}
