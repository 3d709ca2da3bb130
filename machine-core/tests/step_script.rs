//! The coupled rendering of a step layer, run by a real `/bin/sh`: files land with their
//! modes, commands run, and a second run does nothing again.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use machine_core::steps::{Step, StepLayer};

#[test]
fn rendered_script_runs_under_sh_and_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let log = format!("{root}/log");
    let tricky = "it's \"quoted\" $(not run) `nor this`\n\\ and a backslash\n";
    let layer = StepLayer::new(
        "base",
        vec![
            Step::write_file(format!("{root}/etc/motd"), tricky),
            Step::write_file_mode(
                format!("{root}/opt/app/run.sh"),
                "#!/bin/sh\necho app\n",
                0o750,
            ),
            Step::run(format!("echo ran >> '{log}'")),
        ],
    )
    .unwrap()
    .with_state_dir(format!("{root}/state"))
    .unwrap();
    let script = format!("{root}/user-data.sh");
    std::fs::write(&script, layer.render_script()).unwrap();

    for _ in 0..2 {
        let out = Command::new("/bin/sh").arg(&script).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        std::fs::read_to_string(format!("{root}/etc/motd")).unwrap(),
        tricky
    );
    let mode = std::fs::metadata(format!("{root}/opt/app/run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o750);
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "ran\n",
        "the second run must skip done steps"
    );
    let state = std::fs::read_to_string(layer.state_path()).unwrap();
    assert_eq!(state.lines().count(), 3);
}

#[test]
fn a_failing_command_stops_the_script_before_later_steps() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let layer = StepLayer::new(
        "failing",
        vec![
            Step::run("exit 3"),
            Step::write_file(format!("{root}/after"), "x"),
        ],
    )
    .unwrap()
    .with_state_dir(format!("{root}/state"))
    .unwrap();
    let script = format!("{root}/user-data.sh");
    std::fs::write(&script, layer.render_script()).unwrap();
    let out = Command::new("/bin/sh").arg(&script).output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(!std::path::Path::new(&format!("{root}/after")).exists());
}
