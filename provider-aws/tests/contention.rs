//! One name, one instance, under real EC2's ClientToken semantics (the proxy adds them
//! to moto): controllers that disagree on the spec get a conflict, not a second
//! instance; a name is recreated after delete with one launch each time, however often;
//! and deleting a machine terminates every live instance of its name.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_ec2::types::{InstanceType, ResourceType, Tag, TagSpecification};
use machine_core::conditions as C;
use machine_core::{
    CancellationToken, Composer, ComposerSettings, ErrorKind, Labels, MachineProvisioner, Phase,
};
use provider_aws::AwsProvider;
use provider_aws::tags::{MANAGED_TAG, OWNER_TAG};

use common::Moto;
use common::proxy::{FaultProxy, Faults};

/// The (name, instance id) of `p`'s owner's instances that are not terminated or
/// shutting down.
async fn live(p: &AwsProvider) -> Vec<(String, String)> {
    p.owned_instances()
        .await
        .unwrap()
        .iter()
        .filter(|m| !matches!(m.phase, Phase::Deleting | Phase::Deleted))
        .map(|m| (m.name.to_string(), m.provider_id.resource_id().to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_controllers_with_different_specs_make_one_instance_per_name() {
    let moto = Moto::start();
    // Listings answer with the state of 1.5 s before (EC2's eventual consistency), so
    // the two controllers' first lookups, made at once, both show the names free and
    // both launch: the race the token must settle, not left to the scheduler.
    let faults = Faults {
        listing_lag: Duration::from_millis(1500),
        ..Faults::default()
    };
    let proxy = FaultProxy::start(moto.addr, faults, 11).await;
    let owner = common::owner("disagree");
    // Two versions of a controller during a rolling upgrade: same owner, other size.
    let old = Arc::new(common::provider_via_proxy(&proxy.endpoint, &owner).await);
    let new = Arc::new(common::provider_via_proxy(&proxy.endpoint, &owner).await);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..50 {
        for (p, size) in [(old.clone(), "t3.micro"), (new.clone(), "t3.small")] {
            tasks.spawn(async move {
                let spec = common::spec(&format!("both-{i:02}")).with_size(size);
                let r = p.create(&spec, None).await;
                (spec.name.to_string(), r)
            });
        }
    }
    let mut told: HashMap<String, HashSet<String>> = HashMap::new();
    let mut conflicts = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let (name, r) = r.unwrap();
        match r {
            Ok(m) => {
                told.entry(name)
                    .or_default()
                    .insert(m.provider_id.resource_id().to_owned());
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Conflict, "{name}: {e}");
                conflicts.push(e.to_string());
            }
        }
    }
    let direct = common::provider(&moto.endpoint, &owner).await;
    let standing = live(&direct).await;
    let names: HashSet<&str> = standing.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), 50, "names without a machine");
    assert_eq!(standing.len(), 50, "duplicates left running: {standing:?}");
    eprintln!(
        "{} conflicts reported, {} launches refused",
        conflicts.len(),
        proxy.mismatched()
    );
    assert!(
        !conflicts.is_empty(),
        "no controller was told about the other's spec; {} launches were refused",
        proxy.mismatched()
    );
    // The conflict names both sides.
    assert!(
        conflicts
            .iter()
            .all(|c| c.contains("t3.micro") && c.contains("t3.small")),
        "{conflicts:?}"
    );
    // Whoever was told a machine was told the one that stands.
    for (name, ids) in &told {
        let standing_id = standing.iter().find(|(n, _)| n == name).map(|(_, i)| i);
        assert_eq!(ids.len(), 1, "{name}: told {ids:?}");
        assert_eq!(ids.iter().next(), standing_id, "{name}");
    }
}

/// Creates `spec` in round `round` of a recreate test: a new instance, never one of
/// the earlier rounds' `seen`.
async fn create_anew(
    p: &AwsProvider,
    spec: &machine_core::MachineSpec,
    round: usize,
    seen: &mut HashSet<machine_core::ProviderId>,
) -> machine_core::Machine {
    let m = p
        .create(spec, None)
        .await
        .unwrap_or_else(|e| panic!("create {round}: {e}"));
    assert!(
        seen.insert(m.provider_id.clone()),
        "create {round} answered with an earlier instance {}",
        m.provider_id
    );
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_is_recreated_twenty_times_with_one_launch_each() {
    let moto = Moto::start();
    let proxy = FaultProxy::start(moto.addr, Faults::default(), 12).await;
    let p = common::provider_via_proxy(&proxy.endpoint, &common::owner("recreate")).await;
    let spec = common::spec("again");
    let mut seen = HashSet::new();
    let mut previous: Option<machine_core::ProviderId> = None;
    for round in 0..20 {
        // Every other round with another spec: a recreate may change the machine.
        let spec = if round % 2 == 0 {
            spec.clone()
        } else {
            spec.clone().with_size("t3.small")
        };
        let m = create_anew(&p, &spec, round, &mut seen).await;
        assert!(
            !matches!(m.phase, Phase::Deleting | Phase::Deleted),
            "create {round}: {:?}",
            m.phase
        );
        // A late delete of the previous generation's ID leaves this one alone.
        if let Some(old) = previous.replace(m.provider_id.clone()) {
            p.delete(&old).await.unwrap();
            let now = p.get(&m.provider_id).await.unwrap();
            assert!(
                !matches!(now.phase, Phase::Deleting | Phase::Deleted),
                "round {round}: deleting the old ID deleted the new machine"
            );
        }
        p.delete(&m.provider_id).await.unwrap();
    }
    assert_eq!(
        proxy.seen("RunInstances"),
        20,
        "recreating cost more than one RunInstances each"
    );
    assert_eq!(proxy.replayed() + proxy.mismatched(), 0);
    assert!(live(&p).await.is_empty());
}

/// Name lookups leave terminated instances out, and with them the client tokens they
/// hold: a provider recreating a name that other replicas of its controller recreated
/// since its own last launch finds its next token bound, and must continue after the
/// newest generation with one look at the name's terminated instances, not step
/// through every generation it missed with a RunInstances each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_taking_turns_recreating_a_name_pay_at_most_one_replay_each() {
    let moto = Moto::start();
    let proxy = FaultProxy::start(moto.addr, Faults::default(), 13).await;
    let owner = common::owner("turns");
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(common::provider_via_proxy(&proxy.endpoint, &owner).await);
    }
    let spec = common::spec("turns");
    let rounds = 9;
    let mut seen = HashSet::new();
    for round in 0..rounds {
        let p = &replicas[round % replicas.len()];
        let m = create_anew(p, &spec, round, &mut seen).await;
        p.delete(&m.provider_id).await.unwrap();
    }
    let launches = proxy.seen("RunInstances") as usize;
    let replays = proxy.replayed() as usize;
    eprintln!("{rounds} creates: {launches} RunInstances, {replays} replayed");
    assert_eq!(
        launches,
        rounds + replays,
        "every other RunInstances launched"
    );
    // The first replica's first create replays nothing; each later create at most once
    // (one more where a ten-minute token epoch ended mid-test would only lower it).
    assert!(
        replays < rounds,
        "{replays} replays in {rounds} creates: generations were stepped one call each"
    );
    assert_eq!(proxy.mismatched(), 0);
    assert!(live(&replicas[0]).await.is_empty());
    // What moto itself holds, not what the providers report: one instance per create,
    // every one terminated.
    let held = common::moto_instances(&moto.endpoint, &owner).await;
    assert_eq!(held.len(), rounds, "{held:?}");
    assert!(
        held.iter()
            .all(|(name, state)| name == "turns" && state == "terminated"),
        "{held:?}"
    );
}

/// Launches an instance of `owner`'s machine `name` from outside the provider (an
/// older controller, a console click, a process that died before its race check),
/// with the library's tags and label `set=dup`; its id.
async fn launch_from_outside(endpoint: &str, owner: &str, name: &str) -> String {
    let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build();
    let out = common::sdk(endpoint)
        .await
        .run_instances()
        .image_id(common::AMI)
        .instance_type(InstanceType::T3Micro)
        .min_count(1)
        .max_count(1)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::Instance)
                .tags(tag("Name", name))
                .tags(tag(MANAGED_TAG, "true"))
                .tags(tag(OWNER_TAG, owner))
                .tags(tag("machine-provisioning/label/set", "dup"))
                .build(),
        )
        .send()
        .await
        .unwrap();
    out.instances()[0].instance_id().unwrap().to_owned()
}

/// A duplicate of a machine, however it came (here launched from outside), is
/// reported by `list` and terminated by the next `find` or `create` of the name,
/// which keep the machine every replica keeps (the oldest); a teardown leaves nothing.
// ComposerSettings is becoming #[non_exhaustive]: a struct literal would not
// compile outside machine-core, so fields are set on the default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_and_create_terminate_the_duplicates_of_a_name() {
    let moto = Moto::start();
    let owner = common::owner("dup");
    let p = Arc::new(common::provider(&moto.endpoint, &owner).await);
    let settings = ComposerSettings::default().with_poll_interval(Duration::from_millis(200));
    let composer = Composer::builder(p.clone())
        .settings(settings)
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let spec = common::spec("dup-1").with_label("set", "dup");
    let made = composer.provision(&spec, &cancel).await.unwrap();
    let kept = made.machine.provider_id.resource_id().to_owned();
    // A launch in a later second than the machine's: the machine is the older.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let dup = launch_from_outside(&moto.endpoint, &owner, "dup-1").await;
    assert_eq!(live(&p).await.len(), 2);
    // list reports it, and leaves it to find, create and delete.
    let listed = p
        .list(&Labels::from([("set".into(), "dup".into())]))
        .await
        .unwrap();
    assert_eq!(listed.len(), 2);
    assert!(
        listed
            .iter()
            .all(|m| m.condition(C::DUPLICATES).is_some_and(|c| c.status))
    );
    // find keeps the oldest and terminates the other, saying so.
    let found = p.find(&spec.name).await.unwrap().unwrap();
    assert_eq!(found.provider_id.resource_id(), kept, "not the oldest");
    let said = found
        .condition(C::DUPLICATES)
        .expect("Duplicates condition");
    assert!(!said.status, "{said:?}");
    assert_eq!(said.reason, C::UNIQUE);
    assert!(said.message.contains(&dup), "{said:?}");
    assert_eq!(
        live(&p).await,
        vec![("dup-1".to_owned(), kept.clone())],
        "find left the duplicate running"
    );

    // A new process's create adopts the machine and terminates a duplicate too.
    let dup = launch_from_outside(&moto.endpoint, &owner, "dup-1").await;
    let fresh = common::provider(&moto.endpoint, &owner).await;
    let adopted = fresh.create(&spec, None).await.unwrap();
    assert_eq!(adopted.provider_id.resource_id(), kept);
    assert_eq!(
        live(&p).await,
        vec![("dup-1".to_owned(), kept.clone())],
        "create left the duplicate {dup} running"
    );

    // And a teardown meeting one leaves nothing of the name.
    launch_from_outside(&moto.endpoint, &owner, "dup-1").await;
    composer.deprovision(&spec.name, &cancel).await.unwrap();
    assert_eq!(live(&p).await, Vec::new(), "an instance of the name leaked");
}

// ComposerSettings is becoming #[non_exhaustive]: a struct literal would not
// compile outside machine-core, so fields are set on the default.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_shares_its_name_lookups() {
    let moto = Moto::start();
    let proxy = FaultProxy::start(moto.addr, Faults::default(), 13).await;
    let owner = common::owner("shared");
    let p = Arc::new(common::provider_via_proxy(&proxy.endpoint, &owner).await);
    let settings = ComposerSettings::default().with_poll_interval(Duration::from_millis(200));
    let composer = Composer::builder(p.clone())
        .settings(settings)
        .build()
        .unwrap();
    let count = 48;
    let specs: Vec<_> = (0..count)
        .map(|i| common::spec(&format!("shared-{i:02}")))
        .collect();
    let cancel = CancellationToken::new();
    let width = std::num::NonZeroUsize::new(16).unwrap();
    for r in composer
        .provision_fleet(&specs, width, &cancel)
        .await
        .unwrap()
    {
        r.outcome.unwrap_or_else(|e| panic!("{}: {e}", r.name));
    }
    let names: Vec<_> = specs.iter().map(|s| s.name.clone()).collect();
    for (name, r) in composer.deprovision_fleet(&names, width, &cancel).await {
        r.unwrap_or_else(|e| panic!("deprovision {name}: {e}"));
    }
    assert!(live(&p).await.is_empty());
    // Each machine looks its name up five times (find and create, the race check,
    // find and delete at teardown): one listing serves all that ask meanwhile.
    let per_machine = proxy.filtered_describes() as f64 / count as f64;
    eprintln!(
        "per machine: {per_machine:.2} tag-filtered DescribeInstances, {:.2} by id, \
         {:.2} GetConsoleOutput, {:.2} TerminateInstances",
        (proxy.seen("DescribeInstances") as f64 - proxy.filtered_describes() as f64) / count as f64,
        proxy.seen("GetConsoleOutput") as f64 / count as f64,
        proxy.seen("TerminateInstances") as f64 / count as f64,
    );
    assert!(
        per_machine <= 2.0,
        "{per_machine:.2} tag-filtered DescribeInstances per machine"
    );
    assert_eq!(proxy.seen("RunInstances"), count);
    assert_eq!(proxy.seen("TerminateInstances"), count);
}

/// Four controllers create one name at once, five names in turn, through the proxy
/// (EC2's token semantics) with the default `clientTokens: honoured`: one instance per
/// name, each controller told that one, and no lookup after the launch. Each create's
/// only tag-filtered DescribeInstances is its adoption lookup; settling the race would
/// add a second per create.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creators_with_honoured_tokens_share_one_instance_without_settling() {
    common::away_from_an_epoch_end().await;
    let moto = Moto::start();
    let proxy = FaultProxy::start(moto.addr, Faults::default(), 14).await;
    let owner = common::owner("honoured");
    let mut controllers = Vec::new();
    for _ in 0..4 {
        controllers.push(Arc::new(
            common::provider_via_proxy(&proxy.endpoint, &owner).await,
        ));
    }
    let names = 5;
    for i in 0..names {
        let mut tasks = tokio::task::JoinSet::new();
        for p in &controllers {
            let p = p.clone();
            tasks.spawn(async move {
                let spec = common::spec(&format!("same-{i}"));
                p.create(&spec, None).await.unwrap()
            });
        }
        let told: HashSet<String> = tasks
            .join_all()
            .await
            .iter()
            .map(|m| m.provider_id.resource_id().to_owned())
            .collect();
        assert_eq!(told.len(), 1, "same-{i}: controllers told {told:?}");
    }
    let direct = common::provider(&moto.endpoint, &owner).await;
    let standing = live(&direct).await;
    assert_eq!(standing.len(), names, "{standing:?}");
    assert_eq!(
        proxy.filtered_describes(),
        (names * controllers.len()) as u64,
        "a create looked the name up again after its launch"
    );
}

/// Two controllers create the same names at once on an endpoint that ignores client
/// tokens (both launch, and each settles by the oldest launch after its race window);
/// one of them is killed (its create future and its provider dropped) after its
/// launch and before its race check, at a point spread over that window. The
/// survivor's create alone must leave one instance per name standing: when the
/// survivor's own launch is the older, it must terminate the dead controller's too,
/// since nobody else will. Then a new process's `find` sees one, and no duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_controller_killed_inside_its_race_window_leaves_no_duplicate() {
    let moto = Moto::start();
    // Both controllers' first listings answer with the state of 1.5 s before, so both
    // show the names free and both launch: the race, not left to the scheduler.
    let lagging = || Faults {
        listing_lag: Duration::from_millis(1500),
        ..Faults::default()
    };
    let owner = common::owner("killed");
    let survivor_proxy = FaultProxy::start(moto.addr, lagging(), 21).await;
    survivor_proxy.ignore_client_tokens();
    // Kill points from right after the launch was carried out to the end of the
    // 1.5 s window that follows it, one name each.
    let names = 10;
    let mut races = tokio::task::JoinSet::new();
    let mut doomed_proxies = Vec::new();
    for i in 0..names {
        let spec = common::spec(&format!("killed-{i:02}"));
        let kill_after = Duration::from_millis(150 * i as u64);
        // A proxy per doomed controller, so that its launch is seen to be carried out.
        let proxy = Arc::new(FaultProxy::start(moto.addr, lagging(), 30 + i as u64).await);
        proxy.ignore_client_tokens();
        doomed_proxies.push(proxy.clone());
        let doomed = common::provider(&proxy.endpoint, &owner).await;
        // A controller per name on each side, so that no name waits for another's
        // lookup (a provider batches its lookups) and sees the doomed launch.
        let survivor = common::provider(&survivor_proxy.endpoint, &owner).await;
        races.spawn(async move {
            let survivor_create = {
                let spec = spec.clone();
                tokio::spawn(async move { survivor.create(&spec, None).await })
            };
            let mut create = Box::pin(doomed.create(&spec, None));
            let kill_point = async {
                while proxy.forwarded("RunInstances") == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                tokio::time::sleep(kill_after).await;
            };
            tokio::select! {
                r = &mut create => panic!("{}: the doomed create ended before its kill point: {r:?}", spec.name),
                () = kill_point => {}
            }
            // The process dies: its future and its provider go, nothing else.
            drop(create);
            drop(doomed);
            let kept = survivor_create
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("{}: the survivor's create: {e}", spec.name));
            (spec.name.to_string(), kept.provider_id.resource_id().to_owned())
        });
    }
    let told: HashMap<String, String> = races.join_all().await.into_iter().collect();
    for p in &doomed_proxies {
        assert_eq!(
            p.forwarded("RunInstances"),
            1,
            "every doomed controller launched"
        );
    }
    // Both lookups of a name are made at once and both answers lag, so the survivor
    // launches too; a scheduler stalling one side past the other's launch makes it
    // adopt instead, which only takes that name out of the race.
    let raced = survivor_proxy.forwarded("RunInstances");
    assert!(
        raced * 2 >= names,
        "only {raced} of {names} names raced: the test proves nothing"
    );
    // What moto holds once the survivor is done, before anyone looks again.
    let direct = common::provider(&moto.endpoint, &owner).await;
    let standing = live(&direct).await;
    let mut per_name: HashMap<&str, Vec<&str>> = HashMap::new();
    for (name, id) in &standing {
        per_name.entry(name).or_default().push(id);
    }
    let duplicated: Vec<_> = per_name.iter().filter(|(_, ids)| ids.len() > 1).collect();
    assert!(
        duplicated.is_empty(),
        "duplicates left running after the survivor finished: {duplicated:?}"
    );
    assert_eq!(
        per_name.len(),
        names,
        "names without a machine: {standing:?}"
    );
    for (name, id) in &told {
        assert_eq!(
            per_name.get(name.as_str()),
            Some(&vec![id.as_str()]),
            "{name}: the survivor was told another instance than the one standing"
        );
        let found = direct
            .find(&machine_core::MachineName::new(name.as_str()).unwrap())
            .await
            .unwrap()
            .expect("found");
        assert_eq!(found.provider_id.resource_id(), id, "{name}");
    }
}

/// Two processes settling a name's duplicate at the same moment both terminate it, and
/// the second may be refused (moto answers `InvalidAttachment.NotFound` when the first
/// just detached the volume; EC2 `IncorrectInstanceState`): a refusal for an instance
/// that is going already is success, not a failed `find`. A refusal for one that still
/// runs is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_terminated_meanwhile_by_another_process_is_settled() {
    let moto = Moto::start();
    let owner = common::owner("settled");
    let p = common::provider(&moto.endpoint, &owner).await;
    let spec = common::spec("settled-1").with_label("set", "dup");
    let kept = p.create(&spec, None).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The find's lookup answers with the state of 1.5 s before it arrives.
    let proxy = FaultProxy::start(
        moto.addr,
        Faults {
            listing_lag: Duration::from_millis(1500),
            ..Faults::default()
        },
        23,
    )
    .await;
    proxy.ignore_client_tokens();
    let finder = common::provider(&proxy.endpoint, &owner).await;

    for (other_process_terminates, code) in [
        (true, "InvalidAttachment.NotFound"),
        (true, "IncorrectInstanceState"),
        (false, "InvalidAttachment.NotFound"),
    ] {
        let dup = launch_from_outside(&moto.endpoint, &owner, "settled-1").await;
        proxy.script("TerminateInstances", 400, code, 1);
        let find = finder.find(&spec.name);
        let other = async {
            // Once the find's lookup has seen the duplicate live.
            tokio::time::sleep(Duration::from_millis(500)).await;
            if other_process_terminates {
                common::sdk(&moto.endpoint)
                    .await
                    .terminate_instances()
                    .instance_ids(&dup)
                    .send()
                    .await
                    .unwrap();
            }
        };
        let (found, ()) = tokio::join!(find, other);
        if other_process_terminates {
            let found = found
                .unwrap_or_else(|e| panic!("{code}: {e}"))
                .expect("found");
            assert_eq!(found.provider_id, kept.provider_id, "{code}");
        } else {
            let e = found.expect_err("a refused termination of a running duplicate");
            assert!(e.to_string().contains(code), "{e}");
            // The next find settles it.
            finder.find(&spec.name).await.unwrap();
        }
        assert_eq!(
            live(&p).await,
            vec![(
                "settled-1".to_owned(),
                kept.provider_id.resource_id().to_owned()
            )],
            "{code}"
        );
    }
}
