//! End to end on real local machines: layers of several teams, coupled and decoupled,
//! all land on the machine before it is Ready; host keys are pinned, never trusted on
//! first use; a fleet boots in parallel.

use std::num::NonZeroUsize;
use std::sync::Arc;

use bootstrap_cloudinit::{
    Bootstrap, CloudConfig, CloudConfigLayer, CloudInitStatus, DerivedHostKeys, Secret, User,
    WriteFile,
};
use machine_core::steps::{Step, StepLayer};
use machine_core::{CancellationToken, Composer, MachineName, MachineSpec, Phase, SentinelFile};
use tests::{ClientKey, Lab};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coupled_layers_of_three_teams_and_derived_host_keys_all_land_and_ssh_pins_the_derived_key()
{
    let lab = Lab::new();
    let provider = lab.provider("coupled");
    let key = ClientKey::new();
    let team_a = CloudConfigLayer::new(
        "team-a",
        CloudConfig::new()
            .with_user(User::new("alice"))
            .with_file(WriteFile::new("/etc/team-a.conf", "a\n"))
            .with_runcmd("touch /var/lib/team-a-ran"),
    )
    .unwrap();
    let team_b = Bootstrap::new(
        "team-b",
        vec![
            CloudConfigLayer::new(
                "b-base",
                CloudConfig::new()
                    .with_user(User::new("bob"))
                    .with_file(WriteFile::new("/etc/team-b.conf", "b\n")),
            )
            .unwrap(),
            CloudConfigLayer::new(
                "b-app",
                CloudConfig::new().with_runcmd("touch /var/lib/team-b-ran"),
            )
            .unwrap(),
        ],
    )
    // The default merged output: the composer gives its part cloud-init's additive
    // Merge-Type, so team-a's users, files and commands survive beside it.
    .unwrap();
    let team_c = StepLayer::new(
        "team-c",
        vec![
            Step::write_file("/etc/team-c.conf", "c\n"),
            Step::run("touch /var/lib/team-c-ran"),
        ],
    )
    .unwrap();
    let host_keys =
        DerivedHostKeys::new(Secret::new("an end-to-end master secret, 32 bytes or more")).unwrap();
    let composer = Composer::builder(provider.clone())
        .coupled(Arc::new(team_a))
        .coupled(Arc::new(team_b))
        .coupled(Arc::new(team_c))
        .coupled(Arc::new(host_keys.clone()))
        .connector(key.connector())
        .completion(Arc::new(CloudInitStatus::new()))
        .build()
        .unwrap();
    let name = MachineName::new("teams-1").unwrap();
    let mut spec = MachineSpec::new(name.clone());
    spec.ssh = Some(key.access("root"));
    let done = composer
        .provision(&spec, &CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("provision failed: {e}"));
    assert_eq!(done.machine.phase, Phase::Ready);

    let out = key
        .run(
            &done.machine,
            "cat /etc/team-a.conf /etc/team-b.conf /etc/team-c.conf; \
             ls /var/lib/team-a-ran /var/lib/team-b-ran /var/lib/team-c-ran; \
             getent passwd alice bob | cut -d: -f1; cut -d' ' -f1,2 /etc/ssh/ssh_host_ed25519_key.pub",
        )
        .await;
    let derived = host_keys.for_machine(&name).unwrap();
    let derived_public: String = derived
        .public()
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(
        out,
        format!(
            "a\nb\nc\n/var/lib/team-a-ran\n/var/lib/team-b-ran\n/var/lib/team-c-ran\nalice\nbob\n{derived_public}\n"
        ),
        "every team's users, files and commands, and the derived host key, on the machine"
    );
    // The connection above trusted only pins (known_hosts is empty): the derived key is
    // among them.
    assert!(
        done.machine
            .access
            .host_keys
            .iter()
            .any(|k| k.starts_with(&derived_public))
    );
    composer
        .deprovision(&name, &CancellationToken::new())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_whose_name_sorts_last_finishes_before_ready() {
    let lab = Lab::new();
    let provider = lab.provider("order");
    let key = ClientKey::new();
    // Coupled: the last layer is slow; the sentinel is written after every layer.
    let first = StepLayer::new("aaa-first", vec![Step::run("touch /var/lib/aaa")]).unwrap();
    let last = StepLayer::new(
        "zzz-last",
        vec![Step::run("sleep 2 && date +%s%N > /var/lib/zzz-coupled")],
    )
    .unwrap();
    // Decoupled: also a last-sorting layer, applied over SSH.
    let late = StepLayer::new(
        "zzz-late",
        vec![Step::run("date +%s%N > /var/lib/zzz-decoupled")],
    )
    .unwrap();
    let composer = Composer::builder(provider.clone())
        .coupled(Arc::new(first))
        .coupled(Arc::new(last))
        .decoupled(Arc::new(late))
        .connector(key.connector())
        .completion(Arc::new(SentinelFile::default()))
        .build()
        .unwrap();
    let mut spec = MachineSpec::new(MachineName::new("order-1").unwrap());
    spec.ssh = Some(key.access("root"));
    let done = composer
        .provision(&spec, &CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("provision failed: {e}"));
    assert_eq!(done.machine.phase, Phase::Ready);
    let out = key
        .run(
            &done.machine,
            "ls /var/lib/aaa && cat /var/lib/zzz-coupled /var/lib/zzz-decoupled",
        )
        .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "a layer was not done at Ready: {out}");
    let (coupled, decoupled): (u128, u128) = (lines[1].parse().unwrap(), lines[2].parse().unwrap());
    assert!(
        coupled < decoupled,
        "the decoupled layer ran before the coupled one ended"
    );
    composer
        .deprovision(&spec.name, &CancellationToken::new())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_ten_mixed_machines_boots_in_parallel_each_with_its_own_software() {
    let lab = Lab::new();
    let provider = lab.provider("fleet");
    let key = ClientKey::new();
    let base = CloudConfigLayer::new(
        "base",
        CloudConfig::new().with_file(WriteFile::new("/etc/base.conf", "base\n")),
    )
    .unwrap();
    let app = StepLayer::new("app", vec![Step::run("hostname > /etc/app-host")]).unwrap();
    let composer = Composer::builder(provider.clone())
        .coupled(Arc::new(base))
        .decoupled(Arc::new(app))
        .connector(key.connector())
        .completion(Arc::new(CloudInitStatus::new()))
        .build()
        .unwrap();
    let specs: Vec<MachineSpec> = (0..10)
        .map(|i| {
            let mut s = MachineSpec::new(MachineName::new(format!("fleet-{i}")).unwrap());
            s.ssh = Some(key.access("root"));
            s
        })
        .collect();
    let results = composer
        .provision_fleet(
            &specs,
            NonZeroUsize::new(10).unwrap(),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    let mut names = Vec::new();
    for r in results {
        let p = r.outcome.unwrap_or_else(|e| panic!("{}: {e}", r.name));
        assert_eq!(p.machine.phase, Phase::Ready);
        let out = key
            .run(&p.machine, "cat /etc/base.conf /etc/app-host")
            .await;
        assert_eq!(out, format!("base\n{}\n", r.name), "machine {}", r.name);
        names.push(r.name);
    }
    assert_eq!(names.len(), 10);
    for (name, r) in composer
        .deprovision_fleet(
            &names,
            NonZeroUsize::new(10).unwrap(),
            &CancellationToken::new(),
        )
        .await
    {
        r.unwrap_or_else(|e| panic!("deleting {name}: {e}"));
    }
}
