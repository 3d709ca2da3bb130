//! The `machines` binary end to end on the simulator: plan's exit codes, apply to
//! convergence, a decoupled change updated in place and a coupled one replaced (with the
//! reasons), status as JSON, destroy leaving nothing, Ctrl-C in the middle of an apply
//! and a rerun, bad files refused with field and line, secrets never printed.
//!
//! Every run is a new process on the simulator's state file, as an operator's would be.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::Value;

/// One fleet file in a folder of its own.
struct Dir {
    dir: tempfile::TempDir,
}

/// What a run printed and how it ended.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", self.stdout, self.stderr))
    }

    fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// The knobs of the test fleet.
#[derive(Clone)]
struct Fleet {
    replicas: u32,
    image: &'static str,
    motd: &'static str,
    app_version: u32,
    boot_latency: &'static str,
    max_surge: u32,
    extra_provider: &'static str,
}

impl Default for Fleet {
    fn default() -> Self {
        Fleet {
            replicas: 3,
            image: "debian-12",
            motd: "Provisioned by machine-core.",
            app_version: 1,
            boot_latency: "100ms",
            max_surge: 1,
            extra_provider: "",
        }
    }
}

impl Fleet {
    fn yaml(&self) -> String {
        format!(
            r#"provider:
  kind: sim
  bootLatency: {boot}
  bootJitter: 0s
  deleteLatency: 50ms
  transportLatency: 1ms
{extra}settings:
  pollInterval: 50ms
layers:
  - name: base
    mode: coupled
    cloudConfig:
      users: [{{name: ops, groups: [sudo]}}]
      write_files:
        - path: /etc/motd
          content: "{motd}\n"
  - name: app
    mode: decoupled
    steps:
      - writeFile:
          path: /opt/app/config.toml
          content: "version = {app}\n"
          mode: "0644"
      - run: systemctl restart app
set:
  name: web
  replicas: {replicas}
  template:
    name: web
    image: {image}
  rollout:
    maxSurge: {surge}
    maxUnavailable: 0
"#,
            boot = self.boot_latency,
            extra = self.extra_provider,
            motd = self.motd,
            app = self.app_version,
            replicas = self.replicas,
            image = self.image,
            surge = self.max_surge,
        )
    }
}

impl Dir {
    fn new() -> Self {
        Dir {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join("fleet.yaml")
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("fleet.sim-state.json")
    }

    fn write(&self, yaml: &str) {
        std::fs::write(self.file(), yaml).unwrap();
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_machines"));
        c.arg("--file")
            .arg(self.file())
            .arg("--no-progress")
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("MACHINES_FILE");
        c
    }

    fn run(&self, args: &[&str]) -> Run {
        let out = self.command(args).output().unwrap();
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs and checks the exit code.
    fn expect(&self, args: &[&str], code: i32) -> Run {
        let r = self.run(args);
        assert_eq!(
            r.code, code,
            "machines {args:?} exited {}:\n{}\n{}",
            r.code, r.stdout, r.stderr
        );
        r
    }

    /// The content of `path` on each machine, from the simulator's state file.
    fn files(&self, path: &str) -> Vec<(String, String)> {
        let doc: Value = serde_json::from_slice(&std::fs::read(self.state()).unwrap()).unwrap();
        let mut out = Vec::new();
        for m in doc["cloud"]["machines"].as_array().unwrap() {
            if m.get("deleteAt").is_some() {
                continue;
            }
            let content = m["files"][path]["content"]
                .as_str()
                .map(|b| {
                    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b).unwrap())
                        .unwrap()
                })
                .unwrap_or_default();
            out.push((m["name"].as_str().unwrap().to_owned(), content));
        }
        out.sort();
        out
    }
}

/// Names and provider IDs of the set's machines, from `status --output json`.
fn machines(status: &Value) -> Vec<(String, String)> {
    status["machines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_owned(),
                m["providerId"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The plan's changes as (machine, action, reasons joined).
fn changes(plan: &Value) -> Vec<(String, String, String)> {
    let mut out: Vec<_> = plan["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["machine"].as_str().unwrap_or_default().to_owned(),
                c["action"].as_str().unwrap().to_owned(),
                c["reasons"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r.as_str().unwrap())
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        })
        .collect();
    out.sort();
    out
}

fn line_with<'a>(text: &'a str, words: &[&str]) -> &'a str {
    text.lines()
        .find(|l| words.iter().all(|w| l.contains(w)))
        .unwrap_or_else(|| panic!("no line with {words:?} in:\n{text}"))
}

#[test]
fn plan_apply_in_place_replace_scale_and_destroy_across_runs() {
    let d = Dir::new();
    let mut f = Fleet::default();
    d.write(&f.yaml());

    // Nothing yet: three to create, exit 2.
    let plan = d.expect(&["plan"], 2);
    for s in 0..3 {
        line_with(
            &plan.stdout,
            &[&format!("web-{s}-0"), "create", "scale up to 3"],
        );
    }
    let json = d.expect(&["plan", "--output", "json"], 2).json();
    assert_eq!(json["summary"]["create"], 3, "{json}");

    let apply = d.expect(&["apply"], 0);
    assert!(apply.stdout.contains("Apply complete"), "{}", apply.stdout);
    let plan = d.expect(&["plan"], 0);
    assert!(plan.stdout.contains("No changes"), "{}", plan.stdout);
    let json = d.expect(&["plan", "-o", "json"], 0).json();
    assert_eq!(json["changes"], Value::Array(vec![]), "{json}");
    let status = d.expect(&["status", "-o", "json"], 0).json();
    assert_eq!(status["converged"], true, "{status}");
    assert_eq!(status["counts"]["ready"], 3, "{status}");
    let first = machines(&status);
    assert_eq!(
        first.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["web-0-0", "web-1-0", "web-2-0"]
    );
    assert!(
        status["machines"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["state"] == "ready"),
        "{status}"
    );
    let text = d.expect(&["status"], 0);
    line_with(&text.stdout, &["web-1-0", "ready", "10."]);

    // A decoupled change and one more machine: three updated in place, one created.
    f.app_version = 2;
    f.replicas = 4;
    d.write(&f.yaml());
    let plan = d.expect(&["plan", "-o", "json"], 2).json();
    assert_eq!(
        changes(&plan),
        [
            (
                "web-0-0".into(),
                "updateInPlace".into(),
                "decoupled layers changed: app".into()
            ),
            (
                "web-1-0".into(),
                "updateInPlace".into(),
                "decoupled layers changed: app".into()
            ),
            (
                "web-2-0".into(),
                "updateInPlace".into(),
                "decoupled layers changed: app".into()
            ),
            ("web-3-0".into(), "create".into(), "scale up to 4".into()),
        ]
    );
    let text = d.expect(&["plan"], 2);
    line_with(&text.stdout, &["~", "web-0-0", "update in place", "app"]);
    line_with(
        &text.stdout,
        &["Plan: 1 to create, 0 to replace, 3 to update in place, 0 to delete."],
    );
    let apply = d.expect(&["apply"], 0);
    assert!(
        !apply
            .stdout
            .lines()
            .any(|l| l.trim_start().starts_with("delete")),
        "a decoupled change deleted machines:\n{}",
        apply.stdout
    );
    let status = d.expect(&["status", "-o", "json"], 0).json();
    let second = machines(&status);
    assert_eq!(&second[..3], &first[..], "updated in place, not replaced");
    assert_eq!(second.len(), 4);
    assert_eq!(
        d.files("/opt/app/config.toml"),
        (0..4)
            .map(|s| (format!("web-{s}-0"), "version = 2\n".to_owned()))
            .collect::<Vec<_>>()
    );
    d.expect(&["plan"], 0);

    // A coupled change and a new image: every machine replaced, never below the floor.
    f.motd = "Provisioned by the platform team.";
    f.image = "debian-13";
    d.write(&f.yaml());
    let plan = d.expect(&["plan", "-o", "json"], 2).json();
    let want = "coupled layer base changed; spec.image changed (now \"debian-13\")";
    assert_eq!(
        changes(&plan),
        (0..4)
            .map(|s| (format!("web-{s}-0"), "replace".to_owned(), want.to_owned()))
            .collect::<Vec<_>>()
    );
    let text = d.expect(&["plan"], 2);
    line_with(&text.stdout, &["-/+", "web-2-0", "replace", want]);
    let apply = d.expect(&["apply"], 0);
    assert!(
        !apply.stdout.contains("not available"),
        "replaced machines that were serving at no cost:\n{}",
        apply.stdout
    );
    let status = d.expect(&["status", "-o", "json"], 0).json();
    let third = machines(&status);
    assert_eq!(
        third.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["web-0-1", "web-1-1", "web-2-1", "web-3-1"]
    );
    assert!(
        third
            .iter()
            .all(|(_, id)| !second.iter().any(|(_, old)| old == id))
    );
    assert_eq!(
        d.files("/opt/app/config.toml")
            .into_iter()
            .map(|(_, c)| c)
            .collect::<Vec<_>>(),
        vec!["version = 2\n".to_owned(); 4]
    );

    // Scale down: two deleted, by the delete policy.
    f.replicas = 2;
    d.write(&f.yaml());
    let plan = d.expect(&["plan", "-o", "json"], 2).json();
    let deletes: Vec<_> = changes(&plan)
        .into_iter()
        .filter(|(_, a, r)| a == "delete" && r == "scale down to 2")
        .collect();
    assert_eq!(deletes.len(), 2, "{plan}");
    let apply = d.expect(&["apply", "-o", "json"], 0).json();
    assert_eq!(apply["outcome"], "converged", "{apply}");
    let decided: Vec<&str> = apply["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert_eq!(
        decided
            .iter()
            .filter(|d| d.starts_with("delete web-") && d.ends_with(": scale down to 2"))
            .count(),
        2,
        "{apply}"
    );
    assert_eq!(apply["status"]["available"], 2, "{apply}");
    d.expect(&["plan"], 0);

    // Destroy: nothing left, not even the state file.
    let destroy = d.expect(&["destroy"], 0);
    assert!(
        destroy.stdout.contains("Destroy complete"),
        "{}",
        destroy.stdout
    );
    assert!(!d.state().exists(), "the state file is left");
    let status = d.expect(&["status", "-o", "json"], 0).json();
    assert_eq!(status["machines"], Value::Array(vec![]), "{status}");
    d.expect(&["destroy"], 0);
    d.expect(&["plan"], 2);
}

/// Spawns `machines apply`, returns the child and its stdout lines as they come.
fn spawn_apply(d: &Dir) -> (std::process::Child, mpsc::Receiver<String>) {
    let mut child = d
        .command(&["apply"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Waits for a line starting with `prefix` (after spaces); all lines seen so far.
fn wait_for(rx: &mpsc::Receiver<String>, prefix: &str, seen: &mut Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
            let found = line.trim_start().starts_with(prefix);
            seen.push(line);
            if found {
                return;
            }
        }
    }
    panic!("no line starting with {prefix:?}: {seen:#?}");
}

fn interrupt(child: &std::process::Child) {
    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -INT {}", child.id());
}

/// Waits for the child (120 s at most) and returns its exit code and the rest of stdout.
fn finish(
    mut child: std::process::Child,
    rx: &mpsc::Receiver<String>,
    seen: &mut Vec<String>,
) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            // The reader ends with the pipe.
            while let Ok(line) = rx.recv_timeout(Duration::from_secs(5)) {
                seen.push(line);
            }
            return status.code().unwrap_or(-1);
        }
        assert!(Instant::now() < deadline, "apply did not stop: {seen:#?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ctrl_c_stops_an_apply_between_steps_and_a_rerun_carries_on() {
    let d = Dir::new();
    // Slow boots while an apply is to be interrupted, so that it is still running when
    // the signal comes on a loaded machine; fast ones for the reruns. The provider's
    // latencies are not part of what machines are made from: nothing is replaced.
    let mut f = Fleet {
        replicas: 4,
        boot_latency: "3s",
        ..Fleet::default()
    };
    let fast = |f: &Fleet| Fleet {
        boot_latency: "100ms",
        ..f.clone()
    };
    d.write(&f.yaml());

    // Scale up from nothing, interrupted after the first creates.
    let (child, rx) = spawn_apply(&d);
    let mut seen = Vec::new();
    wait_for(&rx, "create web-", &mut seen);
    // Another command meanwhile is refused: one process at a time on a state file.
    let busy = d.expect(&["status"], 1);
    assert!(
        busy.stderr.contains("another machines command"),
        "{}",
        busy.stderr
    );
    interrupt(&child);
    let code = finish(child, &rx, &mut seen);
    assert_eq!(code, 130, "{seen:#?}");
    assert!(
        seen.iter().any(|l| l.contains("Stopped between steps")),
        "{seen:#?}"
    );
    assert!(d.state().exists(), "the state was not saved");
    // Machines still booting are work an apply has to finish.
    d.expect(&["plan"], 2);
    d.write(&fast(&f).yaml());
    d.expect(&["apply"], 0);
    let status = d.expect(&["status", "-o", "json"], 0).json();
    assert_eq!(status["converged"], true, "{status}");
    let names: Vec<String> = machines(&status).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        ["web-0-0", "web-1-0", "web-2-0", "web-3-0"],
        "{status}"
    );

    // A coupled rollout, interrupted after its first replacement was started.
    f.motd = "Second base.";
    d.write(&f.yaml());
    d.expect(&["plan"], 2);
    let (child, rx) = spawn_apply(&d);
    let mut seen = Vec::new();
    wait_for(&rx, "create web-", &mut seen);
    interrupt(&child);
    assert_eq!(finish(child, &rx, &mut seen), 130, "{seen:#?}");
    let plan = d.expect(&["plan", "-o", "json"], 2).json();
    assert!(
        plan["summary"]["replace"].as_u64().unwrap() >= 1,
        "the rest of the rollout is still planned: {plan}"
    );
    d.write(&fast(&f).yaml());
    d.expect(&["apply"], 0);
    let status = d.expect(&["status", "-o", "json"], 0).json();
    let names: Vec<String> = machines(&status).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        ["web-0-1", "web-1-1", "web-2-1", "web-3-1"],
        "each machine replaced once: {status}"
    );
    d.expect(&["plan"], 0);
}

#[test]
fn a_machine_that_fails_pauses_the_rollout_and_apply_says_which() {
    let d = Dir::new();
    let f = Fleet {
        replicas: 2,
        extra_provider: "  bootFailureRate: 1.0\n",
        ..Fleet::default()
    };
    d.write(&f.yaml());
    let apply = d.expect(&["apply", "--timeout", "2m"], 3);
    let said = line_with(&apply.stdout, &["Stopped:", "RolloutPaused"]);
    assert!(said.contains("web-"), "{said}");
    let status = d.expect(&["status", "-o", "json"], 0).json();
    assert!(
        status["machines"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["state"] == "failed"),
        "{status}"
    );
    d.expect(&["destroy"], 0);
}

#[test]
fn bad_files_are_refused_naming_the_field_and_line_and_nothing_is_made() {
    let good = Fleet::default().yaml();
    // Lines as in Fleet::yaml.
    let cases: Vec<(String, &str, u32)> = vec![
        (
            good.replace("replicas: 3", "replicas: -1"),
            "set.replicas",
            27,
        ),
        (
            good.replace("maxSurge: 1", "maxSurge: 0"),
            "set.rollout",
            32,
        ),
        (
            good.replace("maxSurge: 1", "maxSurge: 120%"),
            "set.rollout.maxSurge",
            32,
        ),
        (good.replace("kind: sim", "kind: gcp"), "provider.kind", 2),
        (
            good.replace("kind: sim", "kind: vsphere"),
            "provider.kind",
            2,
        ),
        (
            good.replace("bootJitter: 0s", "bootJiter: 0s"),
            "provider.bootJiter",
            4,
        ),
        (
            good.replace("name: web\n  replicas", "name: Web\n  replicas"),
            "set.name",
            26,
        ),
        (
            good.replace("path: /opt/app/config.toml", "path: opt/app"),
            "layers[1].steps[0].writeFile.path",
            21,
        ),
        (
            good.replace("mode: \"0644\"", "mode: \"0999\""),
            "layers[1].steps[0].writeFile.mode",
            23,
        ),
        (
            good.replace("mode: decoupled", "mode: sideways"),
            "layers[1].mode",
            18,
        ),
        (
            good.replace("users:", "userz:"),
            "layers[0].cloudConfig.userz",
            13,
        ),
        (good.replace("- name: app", "- name: base"), "layers[1]", 17),
        (format!("{good}colour: blue\n"), "colour", 34),
    ];
    for (yaml, field, line) in cases {
        let d = Dir::new();
        d.write(&yaml);
        for command in ["plan", "apply", "status", "destroy"] {
            let r = d.expect(&[command], 1);
            assert!(
                r.stderr.contains(&format!("{field}:"))
                    && r.stderr.contains(&format!("line {line}")),
                "{command}: expected {field} at line {line}, got: {}",
                r.stderr
            );
            assert!(r.stderr.contains("fleet.yaml"), "{}", r.stderr);
        }
        let left: Vec<_> = std::fs::read_dir(d.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["fleet.yaml"], "a refused file made something");
    }
    // Not there at all, and a usage error (exit 1, never plan's 2).
    let d = Dir::new();
    let r = d.expect(&["plan"], 1);
    assert!(r.stderr.contains("cannot be read"), "{}", r.stderr);
    let r = d.expect(&["plan", "--no-such-flag"], 1);
    assert!(r.stderr.contains("--no-such-flag"), "{}", r.stderr);
}

const SECRET: &str = "hunter2-the-fleet-secret";

#[test]
fn secrets_are_never_printed() {
    let d = Dir::new();
    let yaml = Fleet::default()
        .yaml()
        .replace(
            "users: [{name: ops, groups: [sudo]}]",
            &format!("users: [{{name: ops, hashed_passwd: \"$6$x${SECRET}\"}}]"),
        )
        .replace(
            "      - run: systemctl restart app\n",
            &format!(
                "      - run: systemctl restart app\n      - writeFile: {{path: /etc/app/token, content: \"{SECRET}\", mode: \"0600\"}}\n"
            ),
        );
    assert!(yaml.contains(SECRET));
    d.write(&yaml);
    let mut printed = String::new();
    for (args, code) in [
        (vec!["plan"], 2),
        (vec!["plan", "-o", "json"], 2),
        (vec!["apply", "--verbose"], 0),
        (vec!["status"], 0),
        (vec!["status", "-o", "json", "-v"], 0),
    ] {
        printed.push_str(&d.expect(&args, code).all());
    }
    // The secret did reach the machines (so the test could have failed) ...
    let tokens = d.files("/etc/app/token");
    assert_eq!(tokens.len(), 3);
    assert!(tokens.iter().all(|(_, c)| c == SECRET), "{tokens:?}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(d.state()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the state file holds secrets");
    }
    // ... a change of it is planned and applied ...
    d.write(&yaml.replace(SECRET, &format!("{SECRET}-rotated")));
    printed.push_str(&d.expect(&["plan"], 2).all());
    printed.push_str(&d.expect(&["apply", "-v"], 0).all());
    printed.push_str(&d.expect(&["destroy", "-v"], 0).all());
    // ... and a value of the wrong form in a secret field is not quoted either.
    d.write(&yaml.replace(
        &format!("content: \"{SECRET}\""),
        &format!("content: [\"{SECRET}\"]"),
    ));
    let refused = d.expect(&["plan"], 1);
    assert!(refused.stderr.contains("line "), "{}", refused.stderr);
    printed.push_str(&refused.all());
    assert!(
        !printed.contains(SECRET),
        "a secret was printed:\n{printed}"
    );
    assert!(
        !printed.contains("hunter2"),
        "a secret was printed:\n{printed}"
    );
}

#[test]
fn the_example_fleet_file_plans() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("fleets/web.yaml");
    let d = Dir::new();
    d.write(&std::fs::read_to_string(example).unwrap());
    let plan = d.expect(&["plan"], 2);
    line_with(&plan.stdout, &["Plan: 3 to create"]);
}

#[test]
fn an_apply_killed_outright_is_carried_on_by_the_next() {
    let d = Dir::new();
    let f = Fleet {
        replicas: 3,
        boot_latency: "3s",
        ..Fleet::default()
    };
    d.write(&f.yaml());
    let (mut child, rx) = spawn_apply(&d);
    let mut seen = Vec::new();
    wait_for(&rx, "create web-", &mut seen);
    child.kill().unwrap(); // SIGKILL: no handler runs, the lock goes with the process
    child.wait().unwrap();
    d.write(
        &Fleet {
            boot_latency: "100ms",
            ..f
        }
        .yaml(),
    );
    d.expect(&["apply"], 0);
    let status = d.expect(&["status", "-o", "json"], 0).json();
    let names: Vec<String> = machines(&status).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["web-0-0", "web-1-0", "web-2-0"], "{status}");
    assert_eq!(status["converged"], true, "{status}");
}
