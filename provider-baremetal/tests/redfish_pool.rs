//! The pool as several controllers share it: replicas creating the same names on a pool
//! with exactly as many servers, a pool truly full, size classes, and the BMC calls a
//! machine's life costs.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use hyper::Method;
use machine_core::{ErrorKind, Labels, MachineName, MachineProvisioner, MachineSpec};

use common::flaky::Flaky;
use common::{PoolShape, Sushy};

fn spec(name: &str) -> MachineSpec {
    MachineSpec::new(MachineName::new(name).unwrap())
}

/// The servers of the claim files in `dir` and the names they hold.
fn claimed(dir: &std::path::Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let file = e.unwrap().file_name().into_string().unwrap();
            let server = file.strip_suffix(".json")?.to_owned();
            let claim: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.join(&file)).unwrap()).unwrap();
            Some((server, claim["name"].as_str().unwrap().to_owned()))
        })
        .collect()
}

/// Three replicas (separate provider instances) create the same four names at once on
/// a pool of exactly four servers, three rounds: every create succeeds, all creators of
/// a name are told one server, and each name holds one server. (Before names were
/// leased, replicas each claimed a server for a name, so duplicate claims filled the
/// pool and a create failed as if it were full, or two servers were kept for one name.)
/// A fifth name then finds the pool truly full: InsufficientCapacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_an_exact_pool_get_one_server_per_name() {
    const NAMES: usize = 4;
    let sushy = Sushy::start(NAMES);
    let claims = tempfile::tempdir().unwrap();
    let yaml = common::pool_yaml(&sushy, claims.path(), "team");
    for round in 0..3 {
        let mut replicas = Vec::new();
        for _ in 0..3 {
            replicas.push(common::provider_of(&yaml).await);
        }
        let mut tasks = Vec::new();
        for r in &replicas {
            for n in 0..NAMES {
                let (r, spec) = (r.clone(), spec(&format!("r{round}-m{n}")));
                tasks.push(tokio::spawn(async move {
                    (spec.name.clone(), r.create(&spec, None).await)
                }));
            }
        }
        let mut told: BTreeMap<MachineName, Vec<String>> = BTreeMap::new();
        for t in tasks {
            let (name, made) = t.await.unwrap();
            let m = made.unwrap_or_else(|e| panic!("round {round}: create of {name}: {e}"));
            told.entry(name)
                .or_default()
                .push(m.provider_id.to_string());
        }
        for (name, ids) in &told {
            assert!(
                ids.windows(2).all(|w| w[0] == w[1]),
                "round {round}: replicas creating {name} were told {ids:?}"
            );
        }
        let held = claimed(claims.path());
        assert_eq!(held.len(), NAMES, "round {round}: {held:?}");
        let mut names: Vec<_> = held.values().cloned().collect();
        names.sort();
        names.dedup();
        assert_eq!(
            names.len(),
            NAMES,
            "round {round}: a name holds two servers: {held:?}"
        );

        if round == 0 {
            let e = replicas[0]
                .create(&spec("one-too-many"), None)
                .await
                .expect_err("the pool is full");
            assert_eq!(e.kind(), ErrorKind::InsufficientCapacity, "{e}");
            assert!(e.to_string().contains("no free server"), "{e}");
        }
        let p = replicas[0].clone();
        let deletes: Vec<_> = p
            .list(&Labels::new())
            .await
            .unwrap()
            .into_iter()
            .map(|m| {
                let p = p.clone();
                tokio::spawn(async move { p.delete(&m.provider_id).await })
            })
            .collect();
        for d in deletes {
            d.await.unwrap().expect("delete");
        }
        assert!(claimed(claims.path()).is_empty());
    }
}

/// Servers carry a size class: a spec with a size gets a server of that class and
/// every read reports it; a size no server has is an invalid spec on `size`; when
/// every server of the size is taken the pool has no room for it; a spec without a
/// size takes any server and reports that server's class.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_choose_servers_and_read_back() {
    let sushy = Sushy::start(3);
    let claims = tempfile::tempdir().unwrap();
    let shape = PoolShape {
        sizes: &["small", "large"],
        ..PoolShape::default()
    };
    let p = common::provider_of(&common::pool_yaml_shaped(
        &sushy,
        claims.path(),
        "team",
        &shape,
    ))
    .await;
    let large = p
        .create(&spec("big").with_size("large"), None)
        .await
        .expect("create");
    assert!(
        large.provider_id.as_str().ends_with(&format!(
            "/{}/{}",
            sushy.systems[1].id,
            common::claim_id_of(&large)
        )),
        "{}",
        large.provider_id
    );
    let got = p.get(&large.provider_id).await.unwrap();
    let found = p.find(&large.name).await.unwrap().unwrap();
    let listed = p.list(&Labels::new()).await.unwrap();
    for m in [&large, &got, &found, &listed[0]] {
        assert_eq!(m.size.as_deref(), Some("large"), "{m:?}");
    }
    let e = p
        .create(&spec("big-2").with_size("large"), None)
        .await
        .expect_err("one large server");
    assert_eq!(e.kind(), ErrorKind::InsufficientCapacity, "{e}");
    let e = p
        .create(&spec("huge").with_size("huge"), None)
        .await
        .expect_err("no huge server");
    assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{e}");
    assert_eq!(e.field(), Some("size"), "{e}");
    assert!(e.to_string().contains("large, small"), "{e}");
    let e = p
        .create(
            &spec("pinned")
                .with_size("large")
                .with_provider(serde_json::json!({"server": "s0"})),
            None,
        )
        .await
        .expect_err("s0 is small");
    assert_eq!(e.field(), Some("size"), "{e}");
    let any = p.create(&spec("any"), None).await.expect("create");
    assert_eq!(any.size.as_deref(), Some("small"));
    assert_eq!(
        claimed(claims.path()).len(),
        2,
        "refused creates claimed nothing"
    );

    // A pool without sizes refuses a size rather than ignore it.
    let bare = common::provider_of(&common::pool_yaml(&sushy, claims.path(), "other")).await;
    let e = bare
        .create(&spec("sized").with_size("small"), None)
        .await
        .expect_err("no sizes in this pool");
    assert_eq!(e.field(), Some("size"), "{e}");
    assert!(e.to_string().contains("none"), "{e}");

    let (a, b) = tokio::join!(p.delete(&large.provider_id), p.delete(&any.provider_id));
    a.unwrap();
    b.unwrap();
}

/// A machine's create and delete cost the BMC calls a careful client makes, no more:
/// create reads the system and the virtual media up to the CD, inserts, sets the boot
/// override and powers on; delete polls the power state, forces the server off, and
/// ejects from the CD the claim names, without reading the virtual media again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_and_delete_make_the_fewest_bmc_calls() {
    let sushy = Sushy::start(1);
    let proxy = Flaky::forwarding(&sushy.endpoint).await;
    let claims = tempfile::tempdir().unwrap();
    let p: Arc<dyn MachineProvisioner> = common::provider_of(&common::pool_yaml_at(
        &sushy,
        &proxy.endpoint,
        claims.path(),
        "team",
    ))
    .await;
    let m = p.create(&spec("lean"), None).await.expect("create");
    let id = &sushy.systems[0].id;
    let created = proxy.log();
    assert_eq!(
        created,
        vec![
            format!("GET /redfish/v1/Systems/{id}"),
            format!("GET /redfish/v1/Systems/{id}/VirtualMedia"),
            format!("GET /redfish/v1/Systems/{id}/VirtualMedia/Cd"),
            format!(
                "POST /redfish/v1/Systems/{id}/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia"
            ),
            format!("PATCH /redfish/v1/Systems/{id}"),
            format!("POST /redfish/v1/Systems/{id}/Actions/ComputerSystem.Reset"),
        ]
    );
    p.delete(&m.provider_id).await.expect("delete");
    let deleted = &proxy.log()[created.len()..];
    let other: Vec<_> = deleted
        .iter()
        .filter(|c| **c != format!("GET /redfish/v1/Systems/{id}"))
        .collect();
    assert_eq!(
        other,
        vec![
            &format!("POST /redfish/v1/Systems/{id}/Actions/ComputerSystem.Reset"),
            &format!(
                "POST /redfish/v1/Systems/{id}/VirtualMedia/Cd/Actions/VirtualMedia.EjectMedia"
            ),
        ],
        "delete besides its power polls"
    );
    assert_eq!(
        proxy.seen(&Method::GET, "VirtualMedia", false),
        2,
        "only create's reads"
    );
}
