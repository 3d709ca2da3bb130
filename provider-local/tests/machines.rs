//! One real machine through its life: boot by cloud-init, SSH with the host keys it
//! made, console output, power stop and start, delete leaving nothing behind; and a
//! machine whose user data cloud-init rejects.

mod support;

use std::time::Duration;

use machine_core::{
    MachineName, MachineProvisioner, MachineSpec, Phase, PowerOp, UserData, UserDataFormat,
};
use support::{ClientKey, Lab, leftovers, ssh, wait_phase};

const BOOT: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_boots_by_cloud_init_answers_ssh_with_its_own_host_keys_stops_starts_and_leaves_nothing()
 {
    let lab = Lab::new();
    let p = lab.provider("life");
    let key = ClientKey::new();
    let mut spec = MachineSpec::new(MachineName::new("life-1").unwrap());
    spec.ssh = Some(key.access("root"));
    let ud = UserData::new(
        UserDataFormat::CloudConfig,
        "#cloud-config\nwrite_files:\n  - path: /etc/marker\n    content: from-user-data\nruncmd:\n  - [sh, -c, 'echo ran > /var/ran']\n",
    );
    let m = p.create(&spec, Some(&ud)).await.unwrap();
    assert_eq!(
        m.phase,
        Phase::Provisioning,
        "cloud-init cannot be done yet"
    );
    let m = wait_phase(p.as_ref(), &m.provider_id, BOOT, |ph| {
        ph != Phase::Provisioning
    })
    .await;
    assert_eq!(m.phase, Phase::Provisioned, "{:?}", m.failure);
    let dir = p.machine_dir(&m.name);

    // The host keys reported are the ones the machine generated at its first boot.
    assert!(!m.access.host_keys.is_empty(), "no host keys reported");
    let on_disk =
        std::fs::read_to_string(dir.join("upper/etc/ssh/ssh_host_ed25519_key.pub")).unwrap();
    assert!(
        on_disk.starts_with(&m.access.host_keys[0]),
        "{on_disk} vs {:?}",
        m.access.host_keys
    );
    let ip = m
        .address(machine_core::AddressKind::InternalIP)
        .unwrap()
        .to_owned();
    assert_eq!(m.access.ssh.as_ref().unwrap().host, ip);

    // sshd may start a moment after cloud-init reports done.
    let out = retry_ssh(
        &key,
        &m,
        "hostname; cat /etc/marker; echo; cat /var/ran; ip -4 -o addr show eth0; id -u",
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "life-1", "{out}");
    assert_eq!(lines[1], "from-user-data", "{out}");
    assert_eq!(lines[2], "ran", "{out}");
    assert!(lines[3].contains(&format!("inet {ip}/")), "{out}");
    assert_eq!(lines[4], "0", "{out}");
    // Its PID namespace is its own: the boot shell is PID 1 there, and PID 1's
    // environment is one cloud-init can read (its status command parses it).
    let pid1 = ssh(
        &key,
        &m,
        "cat /proc/1/comm; tr '\\0' '\\n' < /proc/1/environ | grep '^container='",
    )
    .await;
    assert_eq!(pid1, "sh\ncontainer=provider-local\n");

    let console = p.console_output(&m.provider_id).await.unwrap().unwrap();
    assert!(
        console.contains("Cloud-init v.") && console.contains("finished"),
        "{console}"
    );

    let ud_back = p.user_data(&m.provider_id).await.unwrap().unwrap();
    assert_eq!(ud_back, ud);

    // Stop: every process of the machine goes; start: it boots again with the same keys.
    p.power(&m.provider_id, PowerOp::Stop).await.unwrap();
    let stopped = p.get(&m.provider_id).await.unwrap();
    assert_eq!(stopped.phase, Phase::Stopped);
    assert!(
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .all(|pid| std::fs::read_link(format!("/proc/{pid}/root"))
                .map_or(true, |r| !r.starts_with(&dir))),
        "a process of the stopped machine still runs"
    );
    p.power(&m.provider_id, PowerOp::Start).await.unwrap();
    let again = wait_phase(p.as_ref(), &m.provider_id, BOOT, |ph| {
        ph != Phase::Provisioning
    })
    .await;
    assert_eq!(again.phase, Phase::Provisioned, "{:?}", again.failure);
    assert_eq!(
        again.access.host_keys, m.access.host_keys,
        "host keys changed on restart"
    );
    assert_eq!(
        retry_ssh(&key, &again, "cat /etc/marker").await,
        "from-user-data"
    );

    // Delete: no namespace, interface, process or directory is left.
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("state.json")).unwrap()).unwrap();
    let slot = record["slot"].as_u64().unwrap();
    p.delete(&m.provider_id).await.unwrap();
    let left = leftovers(
        &format!("{}-{slot}", lab.bridge),
        &format!("{}h{slot}", lab.bridge),
    );
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(!dir.exists(), "{} is left", dir.display());
    assert!(
        !std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .contains(&lab.bridge),
        "a mount of the machine is left"
    );
    let e = p.get(&m.provider_id).await.unwrap_err();
    assert_eq!(e.kind(), machine_core::ErrorKind::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_of_the_user_data_that_fails_makes_the_machine_failed_with_cloud_inits_message() {
    let lab = Lab::new();
    let p = lab.provider("fail");
    let spec = MachineSpec::new(MachineName::new("fail-1").unwrap());
    let ud = UserData::new(
        UserDataFormat::CloudConfig,
        "#cloud-config\nruncmd:\n  - [sh, -c, 'echo boom >&2; exit 3']\n",
    );
    let m = p.create(&spec, Some(&ud)).await.unwrap();
    let m = wait_phase(p.as_ref(), &m.provider_id, BOOT, |ph| {
        ph != Phase::Provisioning
    })
    .await;
    assert_eq!(m.phase, Phase::Failed);
    let failure = m.failure.unwrap();
    assert_eq!(failure.reason, "BootFailed");
    // cloud-init's own words: the module that failed and its runparts summary.
    assert!(
        failure.message.contains("scripts_user") || failure.message.contains("scripts-user"),
        "{}",
        failure.message
    );
    assert!(
        failure.message.contains("Runparts: 1 failures"),
        "{}",
        failure.message
    );
    p.delete(&m.provider_id).await.unwrap();
}

/// SSH until sshd answers (it starts right after cloud-init's last stage).
async fn retry_ssh(key: &ClientKey, m: &machine_core::Machine, command: &str) -> String {
    let connector = bootstrap_ssh::SshConnector::new(key.ssh_config());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match machine_core::Connector::connect(&connector, m).await {
            Ok(_) => return ssh(key, m, command).await.trim().to_owned(),
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("waiting for sshd of {}: {e}", m.name);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("sshd of {} never answered: {e}", m.name),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_data_cloud_init_cannot_read_makes_the_machine_failed_with_cloud_inits_message() {
    let lab = Lab::new();
    let p = lab.provider("reject");
    let spec = MachineSpec::new(MachineName::new("reject-1").unwrap());
    let ud = UserData::new(
        UserDataFormat::CloudConfig,
        "#cloud-config\nwrite_files: [\n  - path: /etc/x\n",
    );
    let m = p.create(&spec, Some(&ud)).await.unwrap();
    let m = wait_phase(p.as_ref(), &m.provider_id, BOOT, |ph| {
        ph != Phase::Provisioning
    })
    .await;
    assert_eq!(
        m.phase,
        Phase::Failed,
        "cloud-init reports done, but the machine got no config"
    );
    let failure = m.failure.unwrap();
    assert!(
        failure.message.contains("Failed loading yaml blob"),
        "{}",
        failure.message
    );
    p.delete(&m.provider_id).await.unwrap();
}

#[test]
fn a_test_that_panics_with_a_running_machine_leaves_nothing_behind() {
    let (bridge, run_dir) = std::thread::spawn(|| {
        let lab = Lab::new();
        let ids = (lab.bridge.clone(), lab.run_dir.clone());
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let p = lab.provider("panics");
                p.create(&MachineSpec::new(MachineName::new("doomed").unwrap()), None)
                    .await
                    .unwrap();
                assert!(
                    std::path::Path::new("/run/netns")
                        .join(format!("{}-1", lab.bridge))
                        .exists()
                );
                panic!("the test fails with its machine running");
            })
        }));
        assert!(caught.is_err());
        ids
        // The lab drops here, as it would while a failed test unwinds.
    })
    .join()
    .unwrap();
    let left = leftovers(&format!("{bridge}-1"), &format!("{bridge}h1"));
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(
        !std::path::Path::new("/sys/class/net")
            .join(&bridge)
            .exists(),
        "bridge {bridge} left"
    );
    assert!(!run_dir.exists(), "{} left", run_dir.display());
    let strays: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                String::from_utf8_lossy(&env).contains(&*run_dir.to_string_lossy())
            })
        })
        .collect();
    assert!(
        strays.is_empty(),
        "processes of the machine survive: {strays:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_whose_63_char_names_differ_only_in_the_last_char_are_two_machines_named_exactly()
{
    let lab = Lab::new();
    let p = lab.provider("long");
    let stem = "l".repeat(62);
    let names: Vec<MachineName> = ["a", "b"]
        .iter()
        .map(|last| MachineName::new(format!("{stem}{last}")).unwrap())
        .collect();
    let mut made = Vec::new();
    for name in &names {
        made.push(
            p.create(&MachineSpec::new(name.clone()), None)
                .await
                .unwrap(),
        );
    }
    assert_ne!(made[0].provider_id, made[1].provider_id);
    assert_ne!(made[0].addresses, made[1].addresses);
    for (name, m) in names.iter().zip(&made) {
        let m = wait_phase(p.as_ref(), &m.provider_id, BOOT, |ph| {
            ph != Phase::Provisioning
        })
        .await;
        assert_eq!(m.phase, Phase::Provisioned, "{name}: {:?}", m.failure);
        assert_eq!(&m.name, name);
        // The machine's hostname, as cloud-init set it from the meta-data: the whole name.
        let hostname =
            std::fs::read_to_string(p.machine_dir(name).join("upper/etc/hostname")).unwrap();
        assert_eq!(hostname.trim(), name.as_str());
        assert_eq!(
            p.find(name).await.unwrap().map(|f| f.provider_id),
            Some(m.provider_id.clone())
        );
    }
    for m in &made {
        p.delete(&m.provider_id).await.unwrap();
    }
    assert!(p.list(&Default::default()).await.unwrap().is_empty());
}
