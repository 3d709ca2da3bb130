//! The fleet reconciler on the simulator: scale, rollouts in place and by replacement,
//! health remediation and its bound, bad input, and a controller killed at random points
//! of its steps.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use machine_core::decorators::{FaultConfig, FaultInjecting};
use machine_core::fleet::{
    DeletePolicy, FleetReconciler, HealthCheck, IntOrPercent, MachineSet, Probe, Rollout,
    SET_LABEL, conditions,
};
use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
use machine_core::steps::{Step, StepLayer};
use machine_core::user_data::UserDataPart;
use machine_core::{
    Completion, CompletionCheck, Composer, ComposerSettings, ErrorKind, ExecOutput, FailurePolicy,
    Labels, Machine, MachineName, MachineProvisioner, MachineSpec, Phase, Result, SentinelFile,
    Transport,
};

fn template() -> MachineSpec {
    MachineSpec::new(MachineName::new("web").unwrap()).with_image("debian-12")
}

fn layer(name: &str, content: &str) -> Arc<StepLayer> {
    Arc::new(
        StepLayer::new(
            name,
            vec![Step::write_file(format!("/etc/{name}"), content)],
        )
        .unwrap(),
    )
}

struct Fleet {
    cloud: SimCloud,
    provider: Arc<dyn MachineProvisioner>,
    /// How many times a composer of this fleet asked for the coupled software's verdict.
    completion_checks: Arc<AtomicUsize>,
}

/// The sentinel check, counted.
struct Counted(SentinelFile, Arc<AtomicUsize>);

#[async_trait::async_trait]
impl CompletionCheck for Counted {
    fn user_data_parts(&self, spec: &MachineSpec) -> Vec<UserDataPart> {
        self.0.user_data_parts(spec)
    }
    async fn check(&self, machine: &Machine, transport: &dyn Transport) -> Result<Completion> {
        self.1.fetch_add(1, Ordering::SeqCst);
        self.0.check(machine, transport).await
    }
}

impl Fleet {
    fn new() -> Self {
        Self::with_config(SimConfig::default())
    }

    fn with_config(config: SimConfig) -> Self {
        let cloud = SimCloud::new();
        let provider = Arc::new(SimProvider::new(cloud.clone(), config).unwrap());
        Fleet {
            cloud,
            provider,
            completion_checks: Arc::default(),
        }
    }

    fn composer(&self, base: &str, app: &str) -> Composer {
        self.composer_of(base, vec![layer("app", app)])
    }

    /// A composer of the coupled layer `base` and the decoupled `layers`.
    fn composer_of(&self, base: &str, layers: Vec<Arc<StepLayer>>) -> Composer {
        let mut builder = Composer::builder(self.provider.clone()).coupled(layer("base", base));
        for l in layers {
            builder = builder.decoupled(l);
        }
        builder
            .connector(Arc::new(SimConnector::new(self.cloud.clone())))
            .completion(Arc::new(Counted(
                SentinelFile::default(),
                self.completion_checks.clone(),
            )))
            .settings(ComposerSettings::default().with_poll_interval(Duration::from_millis(1)))
            .build()
            .unwrap()
    }

    /// The names of the set's machines at the provider.
    async fn names(&self) -> BTreeSet<String> {
        self.machines()
            .await
            .iter()
            .map(|m| m.name.to_string())
            .collect()
    }

    /// A reconciler of [`one_at_a_time`] with layers `b1` and `a1`, its fleet converged.
    async fn converged(&self) -> FleetReconciler {
        let r = FleetReconciler::new(self.composer("b1", "a1"), one_at_a_time()).unwrap();
        converge(&r, 20, |_| {}).await;
        r
    }

    /// Asserts that every machine of the set has `path` with `content`.
    async fn all_have(&self, path: &str, content: &str) {
        for m in self.machines().await {
            let host = self.cloud.host(&m.provider_id).unwrap();
            assert_eq!(host.file_text(path).as_deref(), Some(content), "{}", m.name);
        }
    }

    async fn machines(&self) -> Vec<Machine> {
        self.provider
            .list(&Labels::from([(SET_LABEL.to_owned(), "web".to_owned())]))
            .await
            .unwrap()
    }
}

/// Steps until nothing is left to do (at most `max` steps); every step's status is
/// passed to `each`.
async fn converge(
    r: &FleetReconciler,
    max: usize,
    mut each: impl FnMut(&machine_core::fleet::FleetStatus),
) -> usize {
    for step in 1..=max {
        let done = r.reconcile().await.unwrap();
        if std::env::var("FLEET_DEBUG").is_ok() {
            eprintln!(
                "step {step}: {:?} {:?}",
                done.decisions,
                (
                    done.status.replicas,
                    done.status.available,
                    done.status.updated
                )
            );
        }
        each(&done.status);
        let progressing = done.status.condition(conditions::PROGRESSING).unwrap();
        if !progressing.status {
            return step;
        }
        // Steps are cheap; machines that take a while to boot need wall time between them.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the fleet did not converge in {max} steps");
}

fn set(replicas: u32) -> MachineSet {
    MachineSet::new("web", replicas, template())
}

#[tokio::test]
async fn a_set_scales_up_and_down_with_stable_names() {
    let f = Fleet::new();
    let r = FleetReconciler::new(f.composer("b1", "a1"), set(5)).unwrap();
    // The machines a step creates are in its view.
    assert_eq!(r.reconcile().await.unwrap().machines.len(), 5);
    converge(&r, 20, |_| {}).await;
    let names = f.names().await;
    assert_eq!(
        names,
        (0..5)
            .map(|s| format!("web-{s}-0"))
            .collect::<BTreeSet<_>>()
    );
    let done = r.reconcile().await.unwrap();
    assert_eq!(done.status.available, 5);
    assert_eq!(done.status.updated, 5);
    assert!(done.decisions.is_empty(), "{:?}", done.decisions);
    // The step's view of each machine: Ready once its software is in place.
    let seen: BTreeSet<String> = done
        .machines
        .iter()
        .inspect(|m| assert_eq!(m.phase, Phase::Ready, "{}", m.name))
        .map(|m| m.name.to_string())
        .collect();
    assert_eq!(seen, names);

    let mut r = r;
    r.update(
        f.composer("b1", "a1"),
        set(2).with_delete_policy(DeletePolicy::Newest),
    )
    .unwrap();
    let first = r.reconcile().await.unwrap();
    // The machines the step deletes read Deleting in its view.
    let deleting = first
        .machines
        .iter()
        .filter(|m| m.phase.is_deleting())
        .count();
    assert_eq!(deleting, 3, "{:?}", first.decisions);
    converge(&r, 20, |_| {}).await;
    let left: Vec<Machine> = f
        .machines()
        .await
        .into_iter()
        .filter(|m| !m.phase.is_deleting())
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
}

#[tokio::test]
async fn a_coupled_change_replaces_every_machine_never_below_the_floor() {
    let f = Fleet::new();
    let rollout = Rollout::default()
        .with_max_surge(IntOrPercent::Int(1))
        .with_max_unavailable(IntOrPercent::Int(0));
    let mut r = FleetReconciler::new(f.composer("b1", "a1"), set(4).with_rollout(rollout)).unwrap();
    converge(&r, 20, |_| {}).await;
    let before: BTreeSet<_> = f
        .machines()
        .await
        .into_iter()
        .map(|m| m.provider_id)
        .collect();

    r.update(f.composer("b2", "a1"), set(4).with_rollout(rollout))
        .unwrap();
    let mut lowest = u32::MAX;
    let mut most = 0;
    let steps = converge(&r, 200, |s| {
        lowest = lowest.min(s.available);
        most = most.max(s.replicas);
    })
    .await;
    assert!(steps > 4, "converged in {steps} steps");
    assert_eq!(
        lowest, 4,
        "availability went below replicas - maxUnavailable"
    );
    assert!(most <= 5, "more than replicas + maxSurge machines: {most}");
    let after: Vec<Machine> = f
        .machines()
        .await
        .into_iter()
        .filter(|m| !m.phase.is_deleting())
        .collect();
    assert_eq!(after.len(), 4);
    for m in &after {
        assert!(
            !before.contains(&m.provider_id),
            "{} was not replaced",
            m.name
        );
        assert!(
            m.name.as_str().ends_with("-1"),
            "a new generation: {}",
            m.name
        );
    }
}

#[tokio::test]
async fn a_decoupled_change_is_applied_in_place_one_machine_at_a_time() {
    let f = Fleet::new();
    let mut r = f.converged().await;
    let before: BTreeMap<_, _> = f
        .machines()
        .await
        .into_iter()
        .map(|m| (m.name.clone(), m.provider_id))
        .collect();

    r.update(f.composer("b1", "a2"), one_at_a_time()).unwrap();
    let checks = f.completion_checks.load(Ordering::SeqCst);
    let mut updates = 0;
    for _ in 0..50 {
        let done = r.reconcile().await.unwrap();
        let now = in_place(&done.decisions);
        assert!(
            now <= 1,
            "more than one machine updated at once: {:?}",
            done.decisions
        );
        assert!(
            !done
                .decisions
                .iter()
                .any(|d| d.starts_with("create") || d.starts_with("delete")),
            "a decoupled change replaced machines: {:?}",
            done.decisions
        );
        updates += now;
        if !done
            .status
            .condition(conditions::PROGRESSING)
            .unwrap()
            .status
        {
            break;
        }
    }
    assert_eq!(updates, 3, "each machine updated in place once");
    assert_eq!(
        f.completion_checks.load(Ordering::SeqCst),
        checks,
        "the coupled software's verdict, seen before, is not asked again"
    );
    let after = f.machines().await;
    assert_eq!(after.len(), 3);
    for m in &after {
        assert_eq!(
            before.get(&m.name),
            Some(&m.provider_id),
            "{} was replaced",
            m.name
        );
        let host = f.cloud.host(&m.provider_id).unwrap();
        assert_eq!(
            host.file_text("/etc/app").as_deref(),
            Some("a2"),
            "{}",
            m.name
        );
    }
}

/// Three machines, updated one at a time (`maxUnavailable` 0).
fn one_at_a_time() -> MachineSet {
    set(3).with_rollout(Rollout::default().with_max_unavailable(IntOrPercent::Int(0)))
}

/// The number of in-place updates a step decided.
fn in_place(decisions: &[String]) -> usize {
    decisions
        .iter()
        .filter(|d| d.starts_with("update") && d.contains("in place"))
        .count()
}

#[tokio::test]
async fn a_layer_added_while_no_process_ran_is_rolled_out_one_machine_at_a_time() {
    let f = Fleet::new();
    drop(f.converged().await);
    // A new process, whose template has one more decoupled layer: to the machines'
    // records it looks like a bootstrap cut short after the app layer, but each
    // finished its set of layers, so the new one is a change, rolled out at its pace.
    let r = FleetReconciler::new(
        f.composer_of("b1", vec![layer("app", "a1"), layer("extra", "x1")]),
        one_at_a_time(),
    )
    .unwrap();
    let mut updates = 0;
    for _ in 0..50 {
        let done = r.reconcile().await.unwrap();
        updates += in_place(&done.decisions);
        let with = f
            .machines()
            .await
            .iter()
            .filter(|m| {
                f.cloud
                    .host(&m.provider_id)
                    .unwrap()
                    .file_text("/etc/extra")
                    .is_some()
            })
            .count();
        assert!(
            with <= updates,
            "{with} machines got the layer, {updates} updates decided: {:?}",
            done.decisions
        );
        if !done
            .status
            .condition(conditions::PROGRESSING)
            .unwrap()
            .status
        {
            break;
        }
    }
    assert_eq!(updates, 3, "each machine updated in place once");
    f.all_have("/etc/extra", "x1").await;
}

#[tokio::test]
async fn a_paused_rollout_stays_paused_in_a_new_process_given_the_last_status() {
    let f = Fleet::new();
    let mut r = f.converged().await;
    // An app layer whose command fails on every machine.
    f.cloud.on_exec(
        "start-app-v2",
        ExecOutput::new(Some(3), Vec::new(), b"app v2 broke".to_vec()),
    );
    let broken = || {
        f.composer_of(
            "b1",
            vec![Arc::new(
                StepLayer::new(
                    "app",
                    vec![
                        Step::write_file("/etc/app", "a2"),
                        Step::run("start-app-v2"),
                    ],
                )
                .unwrap(),
            )],
        )
    };
    r.update(broken(), one_at_a_time()).unwrap();
    let mut updated = 0;
    let mut last = None;
    for _ in 0..50 {
        let done = r.reconcile().await.unwrap();
        updated += in_place(&done.decisions);
        if done
            .status
            .condition(conditions::ROLLOUT_PAUSED)
            .unwrap()
            .status
        {
            last = Some(done.status);
            break;
        }
    }
    let last = last.expect("the rollout never paused");
    assert_eq!(updated, 1, "the rollout paused at its first machine");
    let why = &last.condition(conditions::ROLLOUT_PAUSED).unwrap().message;
    assert!(why.contains("app v2 broke"), "{why}");
    drop(r);

    // A new process given the last status: still paused, nothing else tried.
    let again = FleetReconciler::new(broken(), one_at_a_time()).unwrap();
    again.resume(&last);
    for _ in 0..5 {
        let done = again.reconcile().await.unwrap();
        assert_eq!(
            in_place(&done.decisions),
            0,
            "the rollout went on: {:?}",
            done.decisions
        );
        let paused = done.status.condition(conditions::ROLLOUT_PAUSED).unwrap();
        assert!(paused.status && paused.message == *why, "{paused:?}");
    }
    // Without it, a new process tries the failing template on the next machine.
    let forgetful = FleetReconciler::new(broken(), one_at_a_time()).unwrap();
    let mut tried = 0;
    for _ in 0..5 {
        tried += in_place(&forgetful.reconcile().await.unwrap().decisions);
    }
    assert!(
        tried > 0,
        "the forgetful process did not go on: the test proves nothing"
    );
    // A new template resumes a resumed pause as it does a remembered one.
    let mut fixed = FleetReconciler::new(broken(), one_at_a_time()).unwrap();
    fixed.resume(&last);
    fixed
        .update(f.composer("b1", "a3"), one_at_a_time())
        .unwrap();
    converge(&fixed, 50, |_| {}).await;
    f.all_have("/etc/app", "a3").await;
}

#[tokio::test]
async fn a_failed_machine_is_replaced_and_a_storm_is_not_remediated() {
    let f = Fleet::new();
    let health = HealthCheck::default()
        .with_max_unhealthy(IntOrPercent::Int(1))
        .with_remediation_interval(Duration::ZERO)
        .with_probe(
            Probe::reachable()
                .with_interval(Duration::from_millis(1))
                .with_unhealthy_after(Duration::from_millis(1)),
        );
    let r = FleetReconciler::new(f.composer("b1", "a1"), set(4).with_health(health)).unwrap();
    converge(&r, 20, |_| {}).await;
    let machines = f.machines().await;

    // One machine stops answering: replaced, once its probe has failed long enough.
    f.cloud
        .set_reachable(&machines[0].provider_id, false)
        .unwrap();
    let mut replaced = false;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let done = r.reconcile().await.unwrap();
        let now = f.machines().await;
        if now.iter().all(|m| m.provider_id != machines[0].provider_id)
            && done.status.available == 4
        {
            replaced = true;
            break;
        }
    }
    assert!(replaced, "the unreachable machine was not replaced");
    let now = f.machines().await;
    assert_eq!(now.iter().filter(|m| !m.phase.is_deleting()).count(), 4);

    // Three at once, over maxUnhealthy 1: nothing is deleted, the status says why.
    let now: Vec<Machine> = now.into_iter().filter(|m| !m.phase.is_deleting()).collect();
    for m in &now[..3] {
        f.cloud.set_reachable(&m.provider_id, false).unwrap();
    }
    let mut paused = false;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let done = r.reconcile().await.unwrap();
        paused |= done
            .status
            .condition(conditions::REMEDIATION_PAUSED)
            .unwrap()
            .status;
        assert!(
            !done.decisions.iter().any(|d| d.starts_with("delete")),
            "remediation went on in a storm: {:?}",
            done.decisions
        );
    }
    assert!(paused, "the status did not say remediation stopped");
}

#[test]
fn bad_sets_are_refused_naming_the_field() {
    let cases: &[(&str, &str)] = &[
        (
            "name: web\nreplicas: -1\ntemplate: {name: web}\n",
            "replicas",
        ),
        (
            "name: web\nreplicas: 3\ntemplate: {name: web}\nrollout: {maxSurge: 0, maxUnavailable: 0}\n",
            "rollout",
        ),
        (
            "name: web\nreplicas: 3\ntemplate: {name: web}\nrollout: {maxSurge: 150%}\n",
            "rollout.maxSurge",
        ),
        ("name: Web_1\nreplicas: 3\ntemplate: {name: web}\n", "name"),
        (
            "name: web\nreplicas: 3\ntemplate: {name: web, labels: {machine-core/set: x}}\n",
            "template.labels.machine-core/set",
        ),
        (
            "name: web\nreplicas: 3\ntemplate: {name: web}\nhealth: {probe: {command: ''}}\n",
            "health.probe.command",
        ),
    ];
    for (yaml, field) in cases {
        let e = MachineSet::from_yaml(yaml).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{yaml}: {e}");
        assert_eq!(e.field(), Some(*field), "{yaml}: {e}");
    }
    let ok = MachineSet::from_yaml(
        "name: web\nreplicas: 3\ntemplate: {name: web}\nrollout: {maxSurge: 10%, maxUnavailable: 1}\n",
    )
    .unwrap();
    assert_eq!(ok.rollout.max_surge, IntOrPercent::Percent(10));
}

/// A controller killed at random points of its steps (its step future dropped where it
/// stands, its memory lost) over 50 rounds of a rollout of 1,000 machines (issue 26's proof): every round a new
/// reconciler picks up from what the provider shows. No name ever holds two machines, no
/// machine outside the set's names is left, and the fleet converges to the new revision.
#[tokio::test]
async fn a_controller_killed_at_random_points_of_a_rollout_converges_without_duplicates_or_leaks() {
    let cloud = SimCloud::new();
    // Latency jitter gives every call an await point at which a step can be dropped.
    let faults = FaultConfig::default()
        .with_latency_jitter(Duration::from_micros(300))
        .with_seed(Some(7));
    let provider: Arc<dyn MachineProvisioner> = Arc::new(
        FaultInjecting::new(
            Arc::new(SimProvider::new(cloud.clone(), SimConfig::default()).unwrap()),
            faults,
        )
        .unwrap(),
    );
    let composer = |base: &str| {
        Composer::builder(provider.clone())
            .coupled(layer("base", base))
            .build()
            .unwrap()
    };
    const N: usize = 1000;
    let rollout = Rollout::default().with_max_surge(IntOrPercent::Percent(10));
    let make = |base: &str| {
        FleetReconciler::new(composer(base), set(N as u32).with_rollout(rollout))
            .unwrap()
            .with_concurrency(8)
    };
    converge(&make("b1"), 100, |_| {}).await;

    let mut abandoned = 0;
    for round in 0..50 {
        let r = make("b2");
        // A step has a few dozen await points at most: its calls run in waves.
        let pendings = fastrand::usize(0..24);
        let mut step = Box::pin(r.reconcile());
        let mut seen = 0;
        let finished = std::future::poll_fn(|cx| match step.as_mut().poll(cx) {
            std::task::Poll::Ready(v) => std::task::Poll::Ready(Some(v)),
            std::task::Poll::Pending if seen >= pendings => std::task::Poll::Ready(None),
            std::task::Poll::Pending => {
                seen += 1;
                std::task::Poll::Pending
            }
        })
        .await;
        drop(step);
        if finished.is_none() {
            abandoned += 1;
        }
        let listed = provider
            .list(&Labels::from([(SET_LABEL.to_owned(), "web".to_owned())]))
            .await
            .unwrap();
        let live: Vec<&Machine> = listed.iter().filter(|m| !m.phase.is_deleting()).collect();
        assert!(
            live.len() <= N + N / 10,
            "round {round}: {} machines, more than replicas + maxSurge",
            live.len()
        );
    }
    assert!(
        abandoned >= 25,
        "only {abandoned} of 50 steps were killed mid-way"
    );
    let r = make("b2");
    converge(&r, 400, |_| {}).await;
    let listed = provider
        .list(&Labels::from([(SET_LABEL.to_owned(), "web".to_owned())]))
        .await
        .unwrap();
    let live: Vec<&Machine> = listed.iter().filter(|m| !m.phase.is_deleting()).collect();
    assert_eq!(live.len(), N, "converged to the replicas");
    // Each machine was replaced once: N made first, N replacements, none more (a
    // name may come back once its machine is gone, never a second replacement).
    assert_eq!(cloud.machine_count(), 2 * N, "machines made in all");
    let expected = r.reconcile().await.unwrap().status;
    assert_eq!(expected.updated, N as u32);
    assert_eq!(expected.available, N as u32);
    // Every machine of the cloud is a set member: nothing leaked.
    let all = provider.list(&Labels::new()).await.unwrap();
    assert!(
        all.iter()
            .all(|m| m.labels.get(SET_LABEL).map(String::as_str) == Some("web")),
        "a machine outside the set was left"
    );
    assert!(
        live.iter()
            .all(|m| m.phase == Phase::Provisioned || m.phase.is_running())
    );
}

/// A plan says what the set needs, machine by machine and why, and changes nothing; a
/// reconciler started afresh in the middle of an in-place rollout (its memory lost)
/// reads each machine's recorded digests and still updates one machine at a time.
#[tokio::test]
async fn a_plan_changes_nothing_and_a_fresh_reconciler_keeps_updating_one_at_a_time() {
    use machine_core::fleet::ChangeKind;
    let f = Fleet::new();
    let rollout = Rollout::default().with_max_unavailable(IntOrPercent::Int(0));
    let r = FleetReconciler::new(f.composer("b1", "a1"), set(3).with_rollout(rollout)).unwrap();
    converge(&r, 20, |_| {}).await;
    let calls = f.cloud.api_calls();

    // Fresh processes from here on: nothing remembered.
    let fresh = |base: &str, app: &str, replicas: u32| {
        FleetReconciler::new(f.composer(base, app), set(replicas).with_rollout(rollout)).unwrap()
    };
    let plan = fresh("b1", "a2", 4).plan().await.unwrap();
    if std::env::var("FLEET_DEBUG").is_ok() {
        eprintln!("plan: {:?} {:?}", plan.decisions, plan.changes);
    }
    let kinds = |k: ChangeKind| plan.changes.iter().filter(|c| c.kind == k).count();
    assert_eq!(kinds(ChangeKind::UpdateInPlace), 3, "{:?}", plan.changes);
    assert_eq!(kinds(ChangeKind::Create), 1, "{:?}", plan.changes);
    assert!(
        plan.changes
            .iter()
            .filter(|c| c.kind == ChangeKind::UpdateInPlace)
            .all(|c| c.reason.contains("app")),
        "{:?}",
        plan.changes
    );
    assert_eq!(
        f.cloud.api_calls(),
        calls + 2,
        "a plan lists twice and calls nothing else"
    );
    assert_eq!(f.machines().await.len(), 3, "a plan made a machine");
    let plan = fresh("b2", "a1", 3).plan().await.unwrap();
    assert_eq!(
        plan.changes
            .iter()
            .filter(|c| c.kind == ChangeKind::Replace)
            .count(),
        3,
        "{:?}",
        plan.changes
    );

    // A new reconciler each step: still one in-place update at a time.
    let mut updates = 0;
    for _ in 0..30 {
        let done = fresh("b1", "a2", 3).reconcile().await.unwrap();
        let now = done
            .decisions
            .iter()
            .filter(|d| d.contains("in place"))
            .count();
        assert!(now <= 1, "{:?}", done.decisions);
        updates += now;
        if !done
            .status
            .condition(conditions::PROGRESSING)
            .unwrap()
            .status
            && updates == 3
        {
            break;
        }
    }
    assert_eq!(updates, 3);
    f.all_have("/etc/app", "a2").await;
}

/// A new process (a restarted controller, a new leader) does not know which machines
/// serve until it has looked at them: it neither takes them for unhealthy (not Ready
/// within the startup timeout) nor replaces them as if they did not serve. A rollout met
/// only by new processes, each looking once and then acting, never has fewer than
/// `replicas - maxUnavailable` machines with their software in place.
#[tokio::test]
async fn a_new_process_does_not_take_machines_it_has_not_looked_at_for_broken() {
    // Machines take a while to boot, so that one replaced too early leaves a gap.
    let f = Fleet::with_config(
        SimConfig::default()
            .with_boot_latency(Duration::from_millis(30))
            .with_boot_jitter(Duration::ZERO),
    );
    let rollout = Rollout::default()
        .with_max_surge(IntOrPercent::Int(1))
        .with_max_unavailable(IntOrPercent::Int(0));
    let r = FleetReconciler::new(f.composer("b1", "a1"), set(3).with_rollout(rollout)).unwrap();
    converge(&r, 20, |_| {}).await;
    // Older than a startup timeout of 1 s ("created" is kept in whole seconds).
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let quick = HealthCheck::default().with_startup_timeout(Duration::from_secs(1));
    let fresh = FleetReconciler::new(
        f.composer("b1", "a1"),
        set(3).with_rollout(rollout).with_health(quick),
    )
    .unwrap();
    let done = fresh.reconcile().await.unwrap();
    assert!(
        !done.decisions.iter().any(|d| d.starts_with("delete")),
        "a new process deleted machines it had not looked at: {:?}",
        done.decisions
    );
    assert_eq!(done.status.unhealthy, 0);

    // Every machine with its app layer applied has served (the app layer comes last).
    let serving = |machines: &[Machine]| {
        machines
            .iter()
            .filter(|m| !m.phase.is_deleting())
            .filter(|m| {
                f.cloud
                    .host(&m.provider_id)
                    .is_some_and(|h| h.file_text("/etc/app").is_some())
            })
            .count()
    };
    let mut converged = false;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let r = FleetReconciler::new(f.composer("b2", "a1"), set(3).with_rollout(rollout)).unwrap();
        let mut steady = false;
        for _ in 0..2 {
            let done = r.reconcile().await.unwrap();
            steady = !done
                .status
                .condition(conditions::PROGRESSING)
                .unwrap()
                .status;
            let machines = f.machines().await;
            assert!(
                serving(&machines) >= 3,
                "fewer than replicas - maxUnavailable serve: {:?}",
                done.decisions
            );
            let live = machines.iter().filter(|m| !m.phase.is_deleting()).count();
            assert!(live <= 4, "more than replicas + maxSurge: {live}");
        }
        let live: Vec<Machine> = f
            .machines()
            .await
            .into_iter()
            .filter(|m| !m.phase.is_deleting())
            .collect();
        if steady && live.len() == 3 && live.iter().all(|m| m.name.as_str().ends_with("-1")) {
            converged = true;
            break;
        }
    }
    assert!(converged, "{:?}", f.machines().await);
}

/// A fleet whose machines take `boot` to boot.
fn slow_fleet(boot: Duration) -> Fleet {
    Fleet::with_config(SimConfig::default().with_boot_latency(boot))
}

/// Running machines of the set that are not being deleted: what can serve.
async fn serving(f: &Fleet) -> usize {
    f.machines()
        .await
        .iter()
        .filter(|m| m.phase.is_running())
        .count()
}

#[tokio::test]
async fn a_new_process_replaces_within_the_budget_machines_it_has_not_looked_at_yet() {
    // Every run of a CLI is a new process: machines it has not stepped yet are running
    // and may be serving; replacing them all at once "at no cost" would empty the fleet.
    let f = slow_fleet(Duration::from_millis(50));
    let rollout = Rollout::default()
        .with_max_surge(IntOrPercent::Int(1))
        .with_max_unavailable(IntOrPercent::Int(0));
    let first = FleetReconciler::new(f.composer("b1", "a1"), set(4).with_rollout(rollout)).unwrap();
    converge(&first, 200, |_| {}).await;
    drop(first);
    assert_eq!(serving(&f).await, 4);

    let fresh = FleetReconciler::new(f.composer("b2", "a1"), set(4).with_rollout(rollout)).unwrap();
    for _ in 0..400 {
        let done = fresh.reconcile().await.unwrap();
        let now = serving(&f).await;
        assert!(
            now >= 4,
            "{now} machines serving, below replicas - maxUnavailable: {:?}",
            done.decisions
        );
        if !done
            .status
            .condition(conditions::PROGRESSING)
            .unwrap()
            .status
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let after = f.machines().await;
    assert!(
        after.iter().all(|m| m.name.as_str().ends_with("-1")),
        "every machine replaced: {:?}",
        after.iter().map(|m| m.name.as_str()).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_new_process_does_not_take_running_machines_older_than_the_startup_timeout_for_unhealthy()
{
    let f = Fleet::new();
    let health = HealthCheck::default().with_startup_timeout(Duration::from_millis(100));
    let first =
        FleetReconciler::new(f.composer("b1", "a1"), set(3).with_health(health.clone())).unwrap();
    converge(&first, 20, |_| {}).await;
    drop(first);
    // Older than the startup timeout (creation times are in whole seconds).
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let fresh = FleetReconciler::new(f.composer("b1", "a1"), set(3).with_health(health)).unwrap();
    for _ in 0..5 {
        let done = fresh.reconcile().await.unwrap();
        assert!(
            done.decisions.is_empty(),
            "a steady fleet changed: {:?}",
            done.decisions
        );
        assert_eq!(done.status.unhealthy, 0);
    }
}

#[tokio::test]
async fn a_name_another_machine_has_is_passed_over_and_that_machine_left_alone() {
    let f = Fleet::new();
    let named =
        |name: &str| MachineSpec::new(MachineName::new(name).unwrap()).with_image("debian-12");
    // A standalone machine named as the set's first member would be.
    let standalone = f.composer("b1", "a1");
    let cancel = machine_core::CancellationToken::new();
    let lone = standalone
        .provision(&named("web-0-0"), &cancel)
        .await
        .unwrap()
        .machine;

    let mut r = FleetReconciler::new(f.composer("b1", "a1"), set(2)).unwrap();
    converge(&r, 20, |_| {}).await;
    let names = f.names().await;
    assert_eq!(names, BTreeSet::from(["web-0-1".into(), "web-1-0".into()]));
    let still = f.provider.get(&lone.provider_id).await.unwrap();
    assert!(
        !still.phase.is_deleting(),
        "the standalone machine is left alone"
    );
    assert_eq!(still.labels.get(SET_LABEL), None);

    // A standalone spec named as a member is refused, naming the set; nothing changes,
    // even under a policy that deletes what failed.
    let deleting = Composer::builder(f.provider.clone())
        .settings(ComposerSettings::default().with_on_failure(FailurePolicy::DeleteOnFailure))
        .build()
        .unwrap();
    let e = deleting
        .provision(&named("web-1-0"), &cancel)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    assert_eq!(e.field(), Some("name"), "{e}");
    assert!(e.to_string().contains("belongs to set web"), "{e}");
    let member = f
        .provider
        .find(&MachineName::new("web-1-0").unwrap())
        .await
        .unwrap();
    assert!(
        member.is_some_and(|m| !m.phase.is_deleting()),
        "the member is left alone"
    );

    // Scaling the set to nothing leaves the standalone machine.
    r.update(f.composer("b1", "a1"), set(0)).unwrap();
    converge(&r, 20, |_| {}).await;
    let still = f.provider.get(&lone.provider_id).await.unwrap();
    assert!(!still.phase.is_deleting());
    assert!(f.machines().await.iter().all(|m| m.phase.is_deleting()));
}
