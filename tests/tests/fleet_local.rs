//! The fleet reconciler on real machines (issue 26's proof): a set of five provider-local
//! machines (namespaces over a Debian root, real cloud-init and sshd) with a coupled base
//! layer and a decoupled app layer, driven by [`FleetReconciler`] alone.
//!
//! One test, in order, since every phase starts from the fleet the last one left (a
//! fleet boots once):
//! 1. a new app layer is applied in place: no machine replaced (provider IDs kept), the
//!    new file read back over SSH from each, each machine's history showing both
//!    versions applied on it;
//! 2. a new app layer that fails pauses the rollout after the first machine, with a
//!    `RolloutPaused` condition naming it and the step's error; the other four keep
//!    their machine and their app version; a working layer resumes the rollout;
//! 3. a new base layer (coupled) replaces every machine, and a sampler independent of
//!    the reconciler (the provider's listing and each machine's own files, ten times a
//!    second) never sees fewer than `replicas - maxUnavailable` machines serving;
//! 4. one machine's link is cut: its probe fails, and it is replaced once the probe has
//!    failed for `unhealthyAfter`, not before, the others untouched.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, CloudInitStatus, WriteFile};
use machine_core::fleet::{
    FleetReconciled, FleetReconciler, HealthCheck, IntOrPercent, MachineSet, Probe, Rollout,
    SET_LABEL, conditions,
};
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    Composer, ComposerSettings, Labels, Machine, MachineName, MachineProvisioner, MachineSpec,
    ProviderId, revision,
};
use provider_local::LocalProvider;
use tests::{ClientKey, Lab};

const REPLICAS: u32 = 5;
const MAX_SURGE: u32 = 1;
const MAX_UNAVAILABLE: u32 = 1;
/// Time between two reconcile steps (the composer's poll interval, shortened).
const POLL: Duration = Duration::from_millis(300);
/// A phase that has not converged after this long has failed (each takes well under a
/// minute here: ten times that).
const PHASE_LIMIT: Duration = Duration::from_secs(600);

struct Fleet {
    lab: Lab,
    provider: Arc<LocalProvider>,
    key: ClientKey,
}

/// The app layer of `version`: its file, and a line in the machine's history of applies
/// (so that a machine updated in place shows every version it got); `broken` makes its
/// last step fail.
fn app(version: &str, broken: bool) -> Arc<StepLayer> {
    let mut record = format!("echo {version} >> /var/lib/app.history");
    if broken {
        record.push_str(&format!("; echo app-{version}-broke >&2; exit 9"));
    }
    Arc::new(
        StepLayer::new(
            "app",
            vec![
                Step::write_file("/etc/app.conf", format!("app {version}\n")),
                Step::run(record),
            ],
        )
        .unwrap(),
    )
}

impl Fleet {
    fn new() -> Self {
        let lab = Lab::new();
        let provider = lab.provider("fleet");
        Fleet {
            lab,
            provider,
            key: ClientKey::new(),
        }
    }

    fn composer(&self, base: &str, app: Arc<StepLayer>) -> Composer {
        let base = CloudConfigLayer::new(
            "base",
            CloudConfig::new().with_file(WriteFile::new("/etc/base.conf", format!("{base}\n"))),
        )
        .unwrap();
        Composer::builder(self.provider.clone())
            .coupled(Arc::new(base))
            .decoupled(app)
            .connector(self.key.connector())
            .completion(Arc::new(CloudInitStatus::new()))
            .settings(ComposerSettings::default().with_poll_interval(POLL))
            .build()
            .unwrap()
    }

    fn set(&self) -> MachineSet {
        let mut template = MachineSpec::new(MachineName::new("web").unwrap());
        template.ssh = Some(self.key.access("root"));
        MachineSet::new("web", REPLICAS, template).with_rollout(
            Rollout::default()
                .with_max_surge(IntOrPercent::Int(MAX_SURGE))
                .with_max_unavailable(IntOrPercent::Int(MAX_UNAVAILABLE)),
        )
    }

    /// The set's machines that are not being deleted, by name.
    async fn live(&self) -> BTreeMap<MachineName, Machine> {
        live(&self.provider).await
    }

    /// Runs `command` on every live machine; name to output.
    async fn read_all(&self, command: &str) -> BTreeMap<MachineName, String> {
        let mut out = BTreeMap::new();
        for (name, m) in self.live().await {
            out.insert(name, self.key.run(&m, command).await);
        }
        out
    }
}

async fn live(provider: &LocalProvider) -> BTreeMap<MachineName, Machine> {
    provider
        .list(&Labels::from([(SET_LABEL.to_owned(), "web".to_owned())]))
        .await
        .expect("listing the set")
        .into_iter()
        .filter(|m| !m.phase.is_deleting())
        .map(|m| (m.name.clone(), m))
        .collect()
}

fn ids(machines: &BTreeMap<MachineName, Machine>) -> BTreeMap<MachineName, ProviderId> {
    machines
        .iter()
        .map(|(n, m)| (n.clone(), m.provider_id.clone()))
        .collect()
}

async fn step(r: &FleetReconciler) -> FleetReconciled {
    let done = r
        .reconcile()
        .await
        .unwrap_or_else(|e| panic!("a fleet step failed: {e}"));
    if std::env::var("FLEET_DEBUG").is_ok() {
        eprintln!(
            "step: {:?} replicas {} ready {} available {} updated {}",
            done.decisions,
            done.status.replicas,
            done.status.ready,
            done.status.available,
            done.status.updated
        );
    }
    done
}

fn progressing(done: &FleetReconciled) -> bool {
    done.status
        .condition(conditions::PROGRESSING)
        .expect("a Progressing condition")
        .status
}

/// Steps until the fleet is steady; every step's outcome goes to `each`. Returns the
/// decisions of all steps.
async fn converge(r: &FleetReconciler, mut each: impl FnMut(&FleetReconciled)) -> Vec<String> {
    let start = Instant::now();
    let mut decisions = Vec::new();
    loop {
        let done = step(r).await;
        each(&done);
        decisions.extend(done.decisions.iter().cloned());
        if !progressing(&done) {
            return decisions;
        }
        assert!(
            start.elapsed() < PHASE_LIMIT,
            "no convergence in {PHASE_LIMIT:?}: {decisions:#?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Takes `steps` steps of `r`, each of which must update nothing and say the rollout
/// is paused (`what` says otherwise).
async fn stays_paused(r: &FleetReconciler, steps: usize, what: &str) {
    for _ in 0..steps {
        let done = step(r).await;
        assert_eq!(
            count(&done.decisions, "update"),
            0,
            "{what}: {:?}",
            done.decisions
        );
        assert!(
            done.status
                .condition(conditions::ROLLOUT_PAUSED)
                .unwrap()
                .status
        );
        tokio::time::sleep(POLL).await;
    }
}

fn count(decisions: &[String], prefix: &str) -> usize {
    decisions.iter().filter(|d| d.starts_with(prefix)).count()
}

/// Samples, ten times a second until stopped, how many of the set's machines serve: not
/// being deleted, running, with the app layer's applied digest in their own file system.
/// Returns the fewest and the most machines (serving or not) seen.
fn sampler(
    provider: Arc<LocalProvider>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(usize, usize, usize)> {
    let digest = revision::layer_digest_path("app");
    let digest = digest.trim_start_matches('/').to_owned();
    tokio::spawn(async move {
        let (mut fewest, mut most, mut samples) = (usize::MAX, 0, 0);
        while !stop.load(Ordering::SeqCst) {
            let machines = live(&provider).await;
            let serving = machines
                .values()
                .filter(|m| m.phase.is_running())
                .filter(|m| {
                    provider
                        .machine_dir(&m.name)
                        .join("upper")
                        .join(&digest)
                        .exists()
                })
                .count();
            fewest = fewest.min(serving);
            most = most.max(machines.len());
            samples += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (fewest, most, samples)
    })
}

fn ip(args: &[&str]) {
    let ok = std::process::Command::new("ip")
        .args(args)
        .status()
        .expect("ip");
    assert!(ok.success(), "ip {args:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_real_machines_updates_in_place_replaces_for_coupled_changes_pauses_on_failure_and_remediates()
 {
    let f = Fleet::new();
    let started = Instant::now();
    let mut r = FleetReconciler::new(f.composer("base v1", app("v1", false)), f.set()).unwrap();
    let decisions = converge(&r, |_| {}).await;
    assert_eq!(
        count(&decisions, "create"),
        REPLICAS as usize,
        "{decisions:#?}"
    );
    let first = f.live().await;
    assert_eq!(first.len(), REPLICAS as usize);
    let booted = started.elapsed();

    // 1. A new app layer: in place, machine by machine (maxUnavailable 1).
    let t = Instant::now();
    r.update(f.composer("base v1", app("v2", false)), f.set())
        .unwrap();
    let decisions = converge(&r, |done| {
        let now = count(&done.decisions, "update");
        assert!(
            now <= MAX_UNAVAILABLE as usize,
            "more than maxUnavailable updated at once: {:?}",
            done.decisions
        );
    })
    .await;
    assert_eq!(
        count(&decisions, "update"),
        REPLICAS as usize,
        "each machine updated in place once: {decisions:#?}"
    );
    assert_eq!(count(&decisions, "create"), 0, "{decisions:#?}");
    assert_eq!(count(&decisions, "delete"), 0, "{decisions:#?}");
    assert_eq!(ids(&f.live().await), ids(&first), "a machine was replaced");
    for (name, out) in f
        .read_all("cat /etc/app.conf /etc/base.conf /var/lib/app.history")
        .await
    {
        assert_eq!(out, "app v2\nbase v1\nv1\nv2\n", "{name}");
    }
    let in_place = t.elapsed();

    // 2. A new app layer that fails: the rollout stops at its first machine.
    let t = Instant::now();
    r.update(f.composer("base v1", app("v3", true)), f.set())
        .unwrap();
    let mut updated = Vec::new();
    let mut paused = None;
    while paused.is_none() {
        let done = step(&r).await;
        updated.extend(
            done.decisions
                .iter()
                .filter(|d| d.starts_with("update"))
                .cloned(),
        );
        let c = done
            .status
            .condition(conditions::ROLLOUT_PAUSED)
            .expect("a RolloutPaused condition");
        if c.status {
            paused = Some((c.message.clone(), done.status.clone()));
        }
        assert!(t.elapsed() < PHASE_LIMIT, "never paused: {updated:?}");
        tokio::time::sleep(POLL).await;
    }
    let (paused, last_status) = paused.unwrap();
    assert_eq!(updated.len(), 1, "{updated:?}");
    let failed: MachineName = MachineName::new(
        updated[0]
            .strip_prefix("update ")
            .and_then(|d| d.split_whitespace().next())
            .expect("a machine named in the decision"),
    )
    .unwrap();
    assert!(
        paused.contains(failed.as_str()) && paused.contains("app-v3-broke"),
        "the condition names the machine and its error: {paused}"
    );
    // The rollout stays paused: more steps update no other machine.
    let others: BTreeMap<MachineName, ProviderId> = ids(&first)
        .into_iter()
        .filter(|(n, _)| *n != failed)
        .collect();
    stays_paused(&r, 10, "the rollout went on").await;
    // A controller restarted now (a new process, given the last status) keeps the
    // pause: it reads each machine's layer records over SSH and updates none.
    let again = FleetReconciler::new(f.composer("base v1", app("v3", true)), f.set()).unwrap();
    again.resume(&last_status);
    stays_paused(
        &again,
        5,
        "the restarted controller went on with the rollout",
    )
    .await;
    drop(again);
    let now = ids(&f.live().await);
    for (name, id) in &others {
        assert_eq!(now.get(name), Some(id), "{name} was replaced");
    }
    for (name, m) in f.live().await {
        if others.contains_key(&name) {
            let out = f
                .key
                .run(&m, "cat /etc/app.conf /var/lib/app.history")
                .await;
            assert_eq!(out, "app v2\nv1\nv2\n", "{name} was touched");
        }
    }
    // A working layer resumes the rollout; the failed machine's slot converges too.
    r.update(f.composer("base v1", app("v4", false)), f.set())
        .unwrap();
    converge(&r, |_| {}).await;
    let after = f.live().await;
    assert_eq!(after.len(), REPLICAS as usize);
    for (name, id) in &others {
        assert_eq!(after.get(name).map(|m| &m.provider_id), Some(id), "{name}");
    }
    for (name, out) in f.read_all("cat /etc/app.conf").await {
        assert_eq!(out, "app v4\n", "{name}");
    }
    let pause = t.elapsed();

    // 3. A new base layer: every machine replaced, never fewer than replicas -
    // maxUnavailable serving.
    let t = Instant::now();
    let before = ids(&f.live().await);
    let stop = Arc::new(AtomicBool::new(false));
    let sampling = sampler(f.provider.clone(), stop.clone());
    let fewest_available = Arc::new(AtomicUsize::new(usize::MAX));
    r.update(f.composer("base v2", app("v4", false)), f.set())
        .unwrap();
    let decisions = converge(&r, |done| {
        fewest_available.fetch_min(done.status.available as usize, Ordering::SeqCst);
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let (fewest, most, samples) = sampling.await.unwrap();
    let floor = (REPLICAS - MAX_UNAVAILABLE) as usize;
    assert!(samples > 10, "only {samples} samples");
    assert!(
        fewest >= floor,
        "a sample saw {fewest} machines serving, fewer than replicas - maxUnavailable = {floor}: {decisions:#?}"
    );
    assert!(
        fewest_available.load(Ordering::SeqCst) >= floor,
        "the reconciler's status said fewer than {floor} available"
    );
    assert!(
        most <= (REPLICAS + MAX_SURGE) as usize,
        "{most} machines, more than replicas + maxSurge"
    );
    let after = f.live().await;
    assert_eq!(after.len(), REPLICAS as usize);
    let before_ids: BTreeSet<&ProviderId> = before.values().collect();
    for (name, m) in &after {
        assert!(
            !before_ids.contains(&m.provider_id),
            "{name} was not replaced"
        );
    }
    for (name, out) in f
        .read_all("cat /etc/base.conf /etc/app.conf /var/lib/app.history")
        .await
    {
        assert_eq!(out, "base v2\napp v4\nv4\n", "{name}: a new machine");
    }
    let replaced = t.elapsed();

    // 4. A machine whose link is cut is replaced once its probe has failed for
    // unhealthyAfter.
    let unhealthy_after = Duration::from_secs(6);
    let probe = Probe::reachable()
        .with_interval(Duration::from_secs(1))
        .with_timeout(Duration::from_secs(3))
        .with_unhealthy_after(unhealthy_after);
    let health = HealthCheck::default()
        .with_probe(probe)
        .with_remediation_interval(Duration::ZERO);
    r.update(
        f.composer("base v2", app("v4", false)),
        f.set().with_health(health),
    )
    .unwrap();
    converge(&r, |_| {}).await;
    let before = f.live().await;
    let (victim, m) = before.iter().next().unwrap();
    let state: serde_json::Value = serde_json::from_slice(
        &std::fs::read(f.provider.machine_dir(victim).join("state.json")).unwrap(),
    )
    .unwrap();
    let veth = format!("{}h{}", f.lab.bridge, state["slot"]);
    let cut = Instant::now();
    ip(&["link", "set", &veth, "down"]);
    // The fleet looks steady until the probe has failed long enough, so step until the
    // victim's deletion is decided, then until the fleet is whole again.
    let mut decisions = Vec::new();
    let deleted_after = loop {
        let done = step(&r).await;
        decisions.extend(done.decisions.iter().cloned());
        let gone = done
            .decisions
            .iter()
            .any(|d| d.starts_with(&format!("delete {victim}:")) && d.contains("unhealthy"));
        if gone {
            break cut.elapsed();
        }
        assert!(
            cut.elapsed() < PHASE_LIMIT,
            "{victim} was never remediated: {decisions:#?}"
        );
        tokio::time::sleep(POLL).await;
    };
    decisions.extend(converge(&r, |_| {}).await);
    let remediated = cut.elapsed();
    assert!(
        deleted_after >= unhealthy_after,
        "{victim} was deleted {deleted_after:?} after the cut, before its probe failed for {unhealthy_after:?}"
    );
    // The probe's interval and timeout, and a step, on top of the threshold; ten times
    // that for a loaded machine.
    assert!(
        deleted_after <= unhealthy_after + Duration::from_secs(60),
        "{victim} was deleted only {deleted_after:?} after the cut"
    );
    let after = f.live().await;
    assert_eq!(after.len(), REPLICAS as usize);
    assert!(!after.contains_key(victim), "{victim} is still there");
    assert!(
        after.values().all(|n| n.provider_id != m.provider_id),
        "{victim}'s machine is still in the set"
    );
    for (name, m) in &before {
        if name != victim {
            assert_eq!(
                after.get(name).map(|a| &a.provider_id),
                Some(&m.provider_id),
                "{name} was replaced"
            );
        }
    }
    assert_eq!(count(&decisions, "create"), 1, "{decisions:#?}");
    for (name, out) in f.read_all("cat /etc/base.conf /etc/app.conf").await {
        assert_eq!(out, "base v2\napp v4\n", "{name}");
    }

    eprintln!(
        "fleet of {REPLICAS} real machines: booted in {booted:.1?}; app layer in place in {in_place:.1?}; \
         failing layer paused and resumed in {pause:.1?}; base layer replaced in {replaced:.1?}; \
         cut machine deleted {deleted_after:.1?} after the cut, fleet whole again after {remediated:.1?}; \
         {:.1?} in all",
        started.elapsed()
    );
}
