//! `quickstart --local`: the three machines become real local machines (as root, after
//! scripts/peers/40-local-root.sh); each reports what it got, read back over SSH, and
//! nothing of the run is left on the host afterwards.

mod common;

use std::process::{Command, Stdio};

#[test]
fn quickstart_local_runs_the_three_machines_for_real_and_leaves_nothing() {
    let child = Command::new(common::quickstart())
        .arg("--local")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The quickstart names its bridge after its PID.
    let bridge = format!("mpq{:04x}", child.id() & 0xffff);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "quickstart --local failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (machine, motd) in [
        ("coupled-1", "(cloud-init)"),
        ("decoupled-1", "(over SSH)"),
        ("mixed-1", "(cloud-init)"),
    ] {
        let at = stdout
            .find(&format!("{machine} ("))
            .unwrap_or_else(|| panic!("{machine} not reported:\n{stdout}"));
        let block: Vec<&str> = stdout[at..].lines().take(6).collect();
        assert!(
            block[0].contains("host key pinned: ssh-ed25519"),
            "{block:?}"
        );
        assert_eq!(
            block[1].trim(),
            format!("Provisioned by machine-core {motd}.")
        );
        assert!(block[2].contains("(ops)"), "{block:?}");
        assert_eq!(block[3].trim(), "hello from the app layer");
        assert!(block[4].trim().starts_with("3."), "python3 ran: {block:?}");
        assert_eq!(block[5].trim(), "status: done");
        assert!(stdout.contains(&format!("{machine}: deleted")), "{stdout}");
    }
    assert!(
        !std::path::Path::new("/sys/class/net")
            .join(&bridge)
            .exists(),
        "bridge {bridge} left behind"
    );
}
