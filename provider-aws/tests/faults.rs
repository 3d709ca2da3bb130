//! Faults moto cannot make, from the fault-injecting proxy in front of it: a fleet of
//! 50 converges through throttling, 5xx, dropped connections and slow answers with no
//! duplicate and no leak; EC2 error codes reach callers with the right kind through the
//! real SDK; retries never multiply; eventual consistency right after create is retried.

mod common;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use machine_core::decorators::Retrying;
use machine_core::{
    CancellationToken, Composer, ComposerSettings, Deadlines, ErrorKind, Labels,
    MachineProvisioner, Phase, RetryPolicy,
};

use common::Moto;
use common::proxy::{FaultProxy, Faults};

fn quick_retries(max_retries: usize) -> RetryPolicy {
    RetryPolicy::default()
        .with_max_retries(max_retries)
        .with_initial_delay(Duration::from_millis(20))
        .with_max_delay(Duration::from_millis(500))
        .with_factor(2.0)
        .with_jitter(true)
        .with_max_elapsed(None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_of_50_converges_through_faults_without_duplicates_or_leaks() {
    let moto = Moto::start();
    let faults = Faults {
        throttle: 0.08,
        server_error: 0.05,
        drop_before: 0.04,
        drop_after: 0.04,
        delay: 0.02,
        delay_for: Duration::from_secs(2),
        ..Faults::default()
    };
    let proxy = FaultProxy::start(moto.addr, faults, 5).await;
    let owner = common::owner("fleet");
    let provider = Retrying::new(
        common::provider_via_proxy(&proxy.endpoint, &owner).await,
        quick_retries(8),
    );
    let settings = ComposerSettings::default()
        .with_poll_interval(Duration::from_millis(200))
        .with_deadlines(
            Deadlines::default()
                .with_create(Duration::from_secs(120))
                .with_boot(Duration::from_secs(120))
                .with_bootstrap(Duration::from_secs(60))
                .with_delete(Duration::from_secs(120)),
        );
    let composer = Composer::builder(Arc::new(provider))
        .settings(settings)
        .build()
        .unwrap();
    let specs: Vec<_> = (0..50)
        .map(|i| common::spec(&format!("fleet-{i:02}")).with_label("fleet", "f50"))
        .collect();
    let cancel = CancellationToken::new();
    let results = composer
        .provision_fleet(&specs, NonZeroUsize::new(16).unwrap(), &cancel)
        .await
        .unwrap();
    for r in &results {
        let done = r
            .outcome
            .as_ref()
            .unwrap_or_else(|e| panic!("{}: {e}", r.name));
        assert_eq!(done.machine.phase, Phase::Ready);
    }
    assert!(
        proxy.injected() >= 10,
        "only {} faults injected",
        proxy.injected()
    );

    // Judge by moto itself, past the proxy: every instance this owner ever launched.
    let direct = common::provider(&moto.endpoint, &owner).await;
    let launched = direct.owned_instances().await.unwrap();
    let mut names: Vec<String> = launched.iter().map(|m| m.name.to_string()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 50, "machines missing");
    assert_eq!(
        launched.len(),
        50,
        "{} instances launched for 50 machines: duplicates",
        launched.len()
    );

    let all: Vec<_> = specs.iter().map(|s| s.name.clone()).collect();
    for (name, r) in composer
        .deprovision_fleet(&all, NonZeroUsize::new(16).unwrap(), &cancel)
        .await
    {
        r.unwrap_or_else(|e| panic!("deprovision {name}: {e}"));
    }
    assert!(
        direct.list(&Labels::new()).await.unwrap().is_empty(),
        "machines leaked"
    );
    let states: Vec<_> = direct
        .owned_instances()
        .await
        .unwrap()
        .iter()
        .map(|m| m.phase)
        .collect();
    assert!(
        states.iter().all(|p| *p == Phase::Deleted),
        "not all terminated: {states:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_error_codes_reach_callers_with_their_kinds() {
    let moto = Moto::start();
    let proxy = FaultProxy::start(moto.addr, Faults::default(), 1).await;
    let p = common::provider_via_proxy(&proxy.endpoint, &common::owner("codes")).await;
    let spec = common::spec("codes-1");
    for (status, code, kind, field) in [
        (503, "RequestLimitExceeded", ErrorKind::Throttled, None),
        (400, "Throttling", ErrorKind::Throttled, None),
        (
            500,
            "InsufficientInstanceCapacity",
            ErrorKind::InsufficientCapacity,
            None,
        ),
        (
            400,
            "InsufficientFreeAddressesInSubnet",
            ErrorKind::InsufficientCapacity,
            None,
        ),
        (500, "InternalError", ErrorKind::Transient, None),
        (503, "Unavailable", ErrorKind::Transient, None),
        (401, "AuthFailure", ErrorKind::Unauthorized, None),
        (403, "UnauthorizedOperation", ErrorKind::Unauthorized, None),
        (400, "InstanceLimitExceeded", ErrorKind::QuotaExceeded, None),
        (400, "VcpuLimitExceeded", ErrorKind::QuotaExceeded, None),
        (
            400,
            "InvalidAMIID.NotFound",
            ErrorKind::InvalidSpec,
            Some("image"),
        ),
        (
            400,
            "InvalidInstanceType",
            ErrorKind::InvalidSpec,
            Some("size"),
        ),
        (
            400,
            "InvalidSubnetID.NotFound",
            ErrorKind::InvalidSpec,
            Some("provider.subnetId"),
        ),
        (
            400,
            "InvalidParameterValue",
            ErrorKind::InvalidSpec,
            Some("provider"),
        ),
        // IdempotentParameterMismatch is not passed through: create looks for the
        // instance holding the token (tests/contention.rs).
    ] {
        proxy.script("RunInstances", status, code, 1);
        let e = p.create(&spec, None).await.unwrap_err();
        assert_eq!(e.kind(), kind, "{code}: {e}");
        if field.is_some() {
            assert_eq!(e.field(), field, "{code}: {e}");
        }
        assert!(e.to_string().contains(code), "{e}");
    }
    assert!(p.owned_instances().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_and_slow_answers_are_transient() {
    let moto = Moto::start();
    let proxy = FaultProxy::start(
        moto.addr,
        Faults {
            drop_before: 1.0,
            ..Faults::default()
        },
        2,
    )
    .await;
    let p = common::provider_via_proxy(&proxy.endpoint, &common::owner("resets")).await;
    let e = p.find(&common::spec("r").name).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transient, "{e}");

    proxy.set_faults(Faults {
        delay: 1.0,
        delay_for: Duration::from_secs(2),
        ..Faults::default()
    });
    let impatient = provider_aws::AwsProvider::new(
        common::config_via_proxy(&proxy.endpoint, "slow")
            .attempt_timeout(Duration::from_millis(500))
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    let e = impatient.find(&common::spec("r").name).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
    assert!(e.to_string().contains("timed out"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_do_not_multiply() {
    let moto = Moto::start();
    let proxy = FaultProxy::start(moto.addr, Faults::default(), 3).await;
    let p = Retrying::new(
        common::provider_via_proxy(&proxy.endpoint, &common::owner("multiply")).await,
        quick_retries(3),
    );
    proxy.script("RunInstances", 503, "RequestLimitExceeded", 100);
    let e = p.create(&common::spec("m-1"), None).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Throttled);
    // One SDK attempt per decorator attempt: 1 + 3 retries, never 4 x the SDK's 3.
    assert_eq!(proxy.seen("RunInstances"), 4);
    // And each retried create looked the name up first.
    assert_eq!(proxy.seen("DescribeInstances"), 4);

    // Nor is a capacity answer: the same launch meets it again for minutes, and the
    // caller may choose another type or zone.
    proxy.clear_scripts();
    proxy.script("RunInstances", 500, "InsufficientInstanceCapacity", 100);
    let before = proxy.seen("RunInstances");
    let e = p.create(&common::spec("m-3"), None).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InsufficientCapacity, "{e}");
    assert_eq!(proxy.seen("RunInstances"), before + 1);

    // A permanent error is not retried at all.
    proxy.clear_scripts();
    proxy.script("RunInstances", 400, "InvalidAMIID.NotFound", 1);
    let before = proxy.seen("RunInstances");
    let e = p.create(&common::spec("m-2"), None).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSpec);
    assert_eq!(proxy.seen("RunInstances"), before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_right_after_create_is_retried_and_later_is_not_found() {
    let moto = Moto::start();
    let proxy = FaultProxy::start(moto.addr, Faults::default(), 4).await;
    let owner = common::owner("consistency");
    let creator = Retrying::new(
        common::provider_via_proxy(&proxy.endpoint, &owner).await,
        quick_retries(5),
    );
    let m = creator.create(&common::spec("c-1"), None).await.unwrap();

    // EC2 does not know the new id yet for two calls: the creator retries through it.
    proxy.script("DescribeInstances", 400, "InvalidInstanceID.NotFound", 2);
    let seen = proxy.seen("DescribeInstances");
    let got = creator.get(&m.provider_id).await.unwrap();
    assert_eq!(got.provider_id, m.provider_id);
    assert_eq!(proxy.seen("DescribeInstances"), seen + 3);

    // Deleting must not take the not-found for "already gone": that would leak it.
    proxy.script("DescribeInstances", 400, "InvalidInstanceID.NotFound", 1);
    proxy.script("TerminateInstances", 400, "InvalidInstanceID.NotFound", 1);
    creator.delete(&m.provider_id).await.unwrap();
    assert_eq!(proxy.forwarded("TerminateInstances"), 1);
    assert_eq!(
        creator.get(&m.provider_id).await.unwrap().phase,
        Phase::Deleted
    );

    // A process that did not create it takes the answer at its word.
    let other = common::provider_via_proxy(&proxy.endpoint, &owner).await;
    proxy.script("DescribeInstances", 400, "InvalidInstanceID.NotFound", 1);
    let e = other.get(&m.provider_id).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");

    // So does the creator once its consistency window has passed.
    let short = provider_aws::AwsProvider::new(
        common::config_via_proxy(&proxy.endpoint, &owner)
            .consistency_window(Duration::from_secs(2))
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    let m2 = short.create(&common::spec("c-2"), None).await.unwrap();
    proxy.script("DescribeInstances", 400, "InvalidInstanceID.NotFound", 1);
    assert_eq!(
        short.get(&m2.provider_id).await.unwrap_err().kind(),
        ErrorKind::Transient
    );
    tokio::time::sleep(Duration::from_millis(2100)).await;
    proxy.script("DescribeInstances", 400, "InvalidInstanceID.NotFound", 1);
    assert_eq!(
        short.get(&m2.provider_id).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    short.delete(&m2.provider_id).await.unwrap();
}

/// An answer cut short (its XML document never closes: a proxy or a load balancer lost
/// the rest) is transient for every call, never taken for a shorter answer (fewer
/// instances, no tags, no user data) nor for a permanent failure; through `Retrying`
/// each call then succeeds, and a create whose lookup or launch answer was cut makes
/// exactly one instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_answers_are_transient_everywhere() {
    let moto = Moto::start();
    let proxy = FaultProxy::start(moto.addr, Faults::default(), 6).await;
    let owner = common::owner("cut");
    let p = common::provider_via_proxy(&proxy.endpoint, &owner).await;
    let ud = machine_core::UserData::new(
        machine_core::UserDataFormat::CloudConfig,
        "#cloud-config\nruncmd:\n  - echo cut\n",
    );
    let m = p.create(&common::spec("cut-0"), Some(&ud)).await.unwrap();
    let name = m.name.clone();
    let id = m.provider_id.clone();

    // Bare: each call's error is transient.
    let transient = |what: &str, r: machine_core::Result<()>| match r {
        Err(e) => assert_eq!(e.kind(), ErrorKind::Transient, "{what}: {e}"),
        Ok(()) => panic!("{what}: a cut answer was taken for a whole one"),
    };
    proxy.truncate("DescribeInstances", 1);
    let r = p.create(&common::spec("cut-1"), None).await;
    transient("create, its lookup cut", r.map(drop));
    proxy.truncate("RunInstances", 1);
    let r = p.create(&common::spec("cut-2"), None).await;
    transient("create, its launch cut", r.map(drop));
    proxy.truncate("DescribeInstances", 1);
    transient("get", p.get(&id).await.map(drop));
    proxy.truncate("DescribeInstances", 1);
    transient("find", p.find(&name).await.map(drop));
    proxy.truncate("DescribeInstances", 1);
    transient("list", p.list(&Labels::new()).await.map(drop));
    proxy.truncate("DescribeInstanceAttribute", 1);
    transient("user_data", p.user_data(&id).await.map(drop));
    proxy.truncate("GetConsoleOutput", 1);
    transient("console_output", p.console_output(&id).await.map(drop));

    // Through Retrying: every call succeeds with the whole answer.
    let r = Retrying::new(p, quick_retries(3));
    proxy.truncate("DescribeInstances", 1);
    assert_eq!(r.find(&name).await.unwrap().unwrap().provider_id, id);
    proxy.truncate("DescribeInstances", 1);
    assert_eq!(r.get(&id).await.unwrap().provider_id, id);
    proxy.truncate("DescribeInstanceAttribute", 1);
    let back = r.user_data(&id).await.unwrap().expect("user data");
    assert_eq!(back.decoded().unwrap(), ud.bytes);
    for (action, n) in [("DescribeInstances", 3), ("RunInstances", 4)] {
        let spec = common::spec(&format!("cut-{n}"));
        proxy.truncate(action, 1);
        r.create(&spec, None)
            .await
            .unwrap_or_else(|e| panic!("create with a cut {action}: {e}"));
    }
    proxy.truncate("TerminateInstances", 1);
    r.delete(&id).await.unwrap();
    assert!(matches!(
        r.get(&id).await.unwrap().phase,
        Phase::Deleting | Phase::Deleted
    ));
    // One instance per name ever launched, cut answers or not: cut-2's launch took
    // effect though its answer was cut.
    let mut held = common::moto_instances(&moto.endpoint, &owner).await;
    held.sort();
    let names: Vec<&str> = held.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["cut-0", "cut-2", "cut-3", "cut-4"], "{held:?}");
}
