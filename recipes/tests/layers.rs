//! Recipe layers: bad input refused before anything runs, naming the field; the coupled
//! document accepted by the real `cloud-init schema`; the decoupled steps in
//! cloud-init's order.

use std::io::Write;

use recipes::{
    Account, AptRepository, Containerd, Directory, DropIn, File, Group, Hostname, KernelModules,
    LineInFile, Package, PackageFamily, Packages, Recipe, RecipeLayer, SwapOff, Sysctl,
    SystemdUnit, Timezone,
};

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBm9yXk2nL3sWq0cJ8pHh6YfTzQe1nM5bVrX2aD4uKgE ops@laptop";

const UNIT: &str = "[Unit]\nDescription=app\n[Service]\nExecStart=/usr/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n";

fn full() -> Vec<Recipe> {
    vec![
        Hostname::new("web-1").into(),
        Timezone::new("Europe/Paris").into(),
        Group::new("deploy").into(),
        Account::admin("ops", [KEY]).with_group("deploy").into(),
        Packages::apt([Package::pinned("nginx", "1.22.1-9"), Package::new("curl")]).into(),
        File::new("/etc/app/app.conf", "port = 8080\n")
            .with_mode(0o640)
            .with_owner("ops:deploy")
            .into(),
        Directory::new("/srv/app")
            .with_owner("ops")
            .with_mode(0o750)
            .into(),
        LineInFile::new("/etc/app/app.conf", "log = info").into(),
        SystemdUnit::new("app.service", UNIT)
            .with_drop_in(DropIn::new("limits", "[Service]\nLimitNOFILE=65536\n"))
            .into(),
        Sysctl::new("90-app", [("net.ipv4.ip_forward", "1")]).into(),
        KernelModules::new("app", ["overlay", "br_netfilter"]).into(),
        SwapOff.into(),
        Containerd::new(PackageFamily::Apt)
            .with_sandbox_image("registry.k8s.io/pause:3.9")
            .into(),
    ]
}

fn field_of(recipe: Recipe) -> String {
    RecipeLayer::new("l", vec![recipe])
        .expect_err("must be refused")
        .field()
        .expect("a field")
        .to_owned()
}

#[test]
fn bad_input_is_refused_at_construction_naming_the_field() {
    assert_eq!(
        field_of(Packages::apt([Package::new("curl"), Package::new("vim; rm -rf /")]).into()),
        "layer l.recipes[0].packages[1].name"
    );
    assert_eq!(
        field_of(Packages::apt([Package::pinned("curl", "$(id)")]).into()),
        "layer l.recipes[0].packages[0].version"
    );
    assert_eq!(
        field_of(SystemdUnit::new("nginx", UNIT).into()),
        "layer l.recipes[0].name"
    );
    assert_eq!(
        field_of(SystemdUnit::new("../../x.service", UNIT).into()),
        "layer l.recipes[0].name"
    );
    assert_eq!(
        field_of(SystemdUnit::new("a.service", "[Service]\nExecStart=/bin/true\n").into()),
        "layer l.recipes[0].enabled"
    );
    assert_eq!(
        field_of(SystemdUnit::new("a.service", format!("{UNIT}\0ExecStartPost=/bin/x\n")).into()),
        "layer l.recipes[0].content"
    );
    for key in ["net/ipv4/ip_forward", "net..ipv4", "../../proc/x"] {
        assert_eq!(
            field_of(Sysctl::new("s", [("net.ipv4.ip_forward", "1"), (key, "1")]).into()),
            "layer l.recipes[0].settings[1].key",
            "{key}"
        );
    }
    for mode in [0, 0o4755, 0o2750] {
        assert_eq!(
            field_of(File::new("/etc/x", "x").with_mode(mode).into()),
            "layer l.recipes[0].mode",
            "{mode:o}"
        );
    }
    for name in [
        "Root",
        "1abc",
        "a b",
        "-x",
        "averyveryveryverylongaccountname1",
    ] {
        assert_eq!(
            field_of(Account::new(name).into()),
            "layer l.recipes[0].name",
            "{name}"
        );
    }
    assert_eq!(
        field_of(Account::new("ops").with_group("wheel!").into()),
        "layer l.recipes[0].groups[0]"
    );
    assert_eq!(
        field_of(Account::new("ops").with_uid(0).into()),
        "layer l.recipes[0].uid"
    );
    assert_eq!(
        field_of(Group::new("ops").with_gid(0).into()),
        "layer l.recipes[0].gid"
    );
    assert_eq!(
        field_of(File::new("/etc/x", "x").with_owner("ops:Bad Group").into()),
        "layer l.recipes[0].owner"
    );
    assert_eq!(
        field_of(File::new("etc/x", "x").into()),
        "layer l.recipes[0].path"
    );
    assert_eq!(
        field_of(File::new("/etc/../root/x", "x").into()),
        "layer l.recipes[0].path"
    );
    assert_eq!(
        field_of(Timezone::new("../../etc/shadow").into()),
        "layer l.recipes[0].name"
    );
    assert_eq!(
        field_of(KernelModules::new("m", ["ok", "x;y"]).into()),
        "layer l.recipes[0].modules[1]"
    );
    assert_eq!(
        field_of(
            Account::new("ops")
                .with_key("from=\"*\" ssh-ed25519 AAAA")
                .into()
        ),
        "layer l.recipes[0].ssh_authorized_keys[0]"
    );
    let e = RecipeLayer::new("l", full())
        .map(|_| ())
        .and_then(|()| RecipeLayer::new("Bad Name", vec![]));
    assert_eq!(e.unwrap_err().field(), Some("layer.name"));
}

#[test]
fn two_recipes_claiming_one_thing_are_refused_naming_the_second() {
    let e = RecipeLayer::new(
        "l",
        vec![Hostname::new("a").into(), Hostname::new("b").into()],
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("layer l.recipes[1].name"));
    let e = RecipeLayer::new(
        "l",
        vec![
            File::new("/etc/systemd/system/app.service", "x").into(),
            SystemdUnit::new("app.service", UNIT).into(),
        ],
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("layer l.recipes[1].name"));
    let e = RecipeLayer::new(
        "l",
        vec![
            Packages::apt([Package::new("curl")]).into(),
            Packages::apt([Package::pinned("curl", "7.88.1-10")]).into(),
        ],
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("layer l.recipes[1].packages[0].name"));
    let e = RecipeLayer::new(
        "l",
        vec![Account::new("a").into(), Account::new("a").into()],
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("layer l.recipes[1].name"));
}

#[test]
fn the_coupled_document_passes_the_real_cloud_init_schema() {
    let layer = RecipeLayer::new("base", full()).unwrap();
    let doc = layer.coupled().unwrap().render().unwrap();
    assert!(
        std::path::Path::new("/usr/bin/cloud-init").exists(),
        "/usr/bin/cloud-init is missing: run scripts/peers/20-cloud-init.sh"
    );
    let mut file = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
    file.write_all(doc.as_bytes()).unwrap();
    let out = std::process::Command::new("/usr/bin/cloud-init")
        .args(["schema", "-c"])
        .arg(file.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("Valid cloud-config"),
        "cloud-init schema refused it: {stdout}{}\n{doc}",
        String::from_utf8_lossy(&out.stderr)
    );
    // cloud-init's own modules where they exist.
    let c = layer.cloud_config();
    assert_eq!(c.hostname.as_deref(), Some("web-1"));
    assert_eq!(c.timezone.as_deref(), Some("Europe/Paris"));
    assert_eq!(c.packages, ["nginx=1.22.1-9", "curl", "containerd"]);
    assert_eq!(c.users.len(), 2);
    assert_eq!(
        c.users[0],
        bootstrap_cloudinit::UserEntry::Default,
        "the image's default user is kept, as on a decoupled machine"
    );
    assert_eq!(c.extra["groups"], serde_json::json!(["deploy"]));
    let paths: Vec<&str> = c.write_files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/etc/app/app.conf",
            "/etc/systemd/system/app.service",
            "/etc/systemd/system/app.service.d/limits.conf",
            "/etc/sysctl.d/90-app.conf",
            "/etc/modules-load.d/app.conf",
            "/etc/modules-load.d/containerd.conf",
            "/etc/sysctl.d/99-kubernetes-cri.conf",
            "/etc/containerd/config.toml",
        ]
    );
    assert!(
        c.write_files.iter().all(|f| f.defer),
        "files land after accounts"
    );
    let conf = &c.write_files[0];
    assert_eq!(
        (conf.permissions.as_deref(), conf.owner.as_deref()),
        (Some("0640"), Some("ops:deploy"))
    );
}

#[test]
fn decoupled_steps_follow_cloud_inits_order_and_share_its_commands() {
    let layer = RecipeLayer::new("base", full()).unwrap();
    let steps = layer.steps();
    let text: Vec<String> = steps
        .iter()
        .map(|s| match s {
            machine_core::steps::Step::WriteFile { path, .. } => format!("write {path}"),
            // Commands run as `sh -ec <snippet>`: compare the snippet.
            machine_core::steps::Step::Run { command } => match shlex::split(command) {
                Some(words) if words.len() == 3 && words[..2] == ["sh", "-ec"] => words[2].clone(),
                _ => command.clone(),
            },
        })
        .collect();
    let pos = |needle: &str| {
        text.iter()
            .position(|t| t.contains(needle))
            .unwrap_or_else(|| panic!("no step with {needle}: {text:#?}"))
    };
    assert!(pos("/etc/hostname") < pos("/etc/timezone"));
    assert!(pos("groupadd deploy") < pos("useradd ops"));
    assert!(pos("useradd ops") < pos("apt-get"));
    assert!(pos("apt-get") < pos("write /etc/app/app.conf"));
    assert!(pos("write /etc/app/app.conf") < pos("chown ops:deploy /etc/app/app.conf"));
    assert!(pos("write /etc/modules-load.d/app.conf") < pos("mkdir -p /srv/app"));
    // The same install command cloud-init's Debian distro runs.
    let apt = &text[pos("apt-get")];
    let install = apt
        .lines()
        .find(|l| l.contains(" install "))
        .expect("an install line");
    let words = shlex::split(install).unwrap();
    let expected: Vec<String> = ["$w"]
        .into_iter()
        .chain(recipes::APT_GET.split(' '))
        .chain(["install", "nginx=1.22.1-9", "curl", "containerd"])
        .map(String::from)
        .collect();
    assert_eq!(words, expected);
    // Every runcmd entry is one of the decoupled commands.
    let cloud = layer.cloud_config();
    for c in &cloud.runcmd {
        let bootstrap_cloudinit::Command::Shell(line) = c else {
            panic!("{c:?}")
        };
        let body = line.strip_suffix(" || exit 1").expect("stops on failure");
        let words = shlex::split(body).expect("a shell line");
        assert!(text.iter().any(|t| *t == words[2]), "{body} is not a step");
    }
    layer.decoupled().unwrap();
}

#[test]
fn a_changed_unit_changes_only_its_restart_steps_hash() {
    let a = RecipeLayer::new("l", vec![SystemdUnit::new("app.service", UNIT).into()]).unwrap();
    let b = RecipeLayer::new(
        "l",
        vec![SystemdUnit::new("app.service", UNIT.replace("infinity", "1000")).into()],
    )
    .unwrap();
    let (sa, sb) = (a.steps(), b.steps());
    assert_eq!(sa.len(), sb.len());
    let last = sa.len() - 1;
    assert_ne!(
        sa[last], sb[last],
        "the restart command follows the unit's content"
    );
}

#[test]
fn a_file_from_a_template_is_rendered_once_and_an_undefined_variable_is_refused() {
    let mut templates = bootstrap_cloudinit::Templates::new();
    templates
        .add("app.conf", "listen = {{ port }}\nname = {{ name }}\n")
        .unwrap();
    let ctx = serde_json::json!({ "port": 8080, "name": "web" });
    let file = File::from_template("/etc/app.conf", &templates, "app.conf", &ctx).unwrap();
    assert_eq!(file.content, b"listen = 8080\nname = web\n");
    let e = File::from_template(
        "/etc/app.conf",
        &templates,
        "app.conf",
        &serde_json::json!({ "port": 8080 }),
    )
    .expect_err("an undefined variable was rendered");
    let shown = e.to_string();
    assert!(
        shown.contains("name") && shown.contains("app.conf"),
        "{shown}"
    );
}

#[test]
fn debug_never_shows_file_content() {
    let layer = RecipeLayer::new(
        "l",
        vec![
            File::new("/etc/token", "s3cr3t-token")
                .with_mode(0o600)
                .into(),
        ],
    )
    .unwrap();
    let shown = format!("{layer:?}");
    assert!(!shown.contains("s3cr3t"), "{shown}");
    assert!(shown.contains("/etc/token"), "{shown}");
}

#[test]
fn containerd_uses_the_systemd_cgroup_driver_and_restarts_only_when_its_config_changes() {
    let layer = |image: &str| {
        RecipeLayer::new(
            "cri",
            vec![
                Containerd::new(PackageFamily::Apt)
                    .with_sandbox_image(image)
                    .into(),
            ],
        )
        .unwrap()
    };
    let a = layer("registry.k8s.io/pause:3.9");
    let c = a.cloud_config();
    assert_eq!(c.packages, ["containerd"]);
    let file = |path: &str| {
        let f = c.write_files.iter().find(|f| f.path == path).expect(path);
        String::from_utf8(f.content.bytes().to_vec()).unwrap()
    };
    let config = file("/etc/containerd/config.toml");
    assert!(config.contains("version = 2"), "{config}");
    assert!(
        config.contains(
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  SystemdCgroup = true"
        ),
        "{config}"
    );
    assert!(config.contains("sandbox_image = \"registry.k8s.io/pause:3.9\""));
    assert_eq!(
        file("/etc/modules-load.d/containerd.conf"),
        "overlay\nbr_netfilter\n"
    );
    assert!(
        file("/etc/sysctl.d/99-kubernetes-cri.conf")
            .contains("net.bridge.bridge-nf-call-iptables = 1")
    );
    // Modules are loaded before the bridge sysctls (which need br_netfilter), and the
    // restart comes last.
    let cmds: Vec<String> = c.runcmd.iter().map(|c| format!("{c:?}")).collect();
    assert_eq!(cmds.len(), 3, "{cmds:?}");
    assert!(
        cmds[0].contains("modprobe")
            && cmds[1].contains("sysctl")
            && cmds[2].contains("restart containerd")
    );
    // Another config: only the config upload and the restart differ.
    let b = layer("registry.k8s.io/pause:3.10");
    let (sa, sb) = (a.steps(), b.steps());
    let differ: Vec<usize> = (0..sa.len()).filter(|&i| sa[i] != sb[i]).collect();
    assert_eq!(differ.len(), 2, "{differ:?}");
    assert!(
        matches!(&sb[differ[1]], machine_core::steps::Step::Run { command } if command.contains("restart containerd"))
    );
    let e = RecipeLayer::new(
        "cri",
        vec![
            Containerd::new(PackageFamily::Apt)
                .with_sandbox_image("x\" evil")
                .into(),
        ],
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("layer cri.recipes[0].sandbox_image"));
}

const PGP: &str = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZXhhbXBsZQ==\n-----END PGP PUBLIC KEY BLOCK-----\n";

#[test]
fn an_apt_repository_is_in_place_before_packages_on_both_paths() {
    let layer = RecipeLayer::new(
        "repo",
        vec![
            Packages::apt([Package::new("docker-ce")]).into(),
            Account::new("ops").into(),
            AptRepository::new(
                "docker",
                "https://download.docker.com/linux/debian",
                "bookworm",
                ["stable"],
                PGP,
            )
            .into(),
        ],
    )
    .unwrap();
    let c = layer.cloud_config();
    let first: Vec<(&str, bool)> = c
        .write_files
        .iter()
        .map(|f| (f.path.as_str(), f.defer))
        .collect();
    // Not deferred: written in cloud-init's init stage, before the packages module.
    assert_eq!(
        first,
        [
            ("/etc/apt/keyrings/docker.asc", false),
            ("/etc/apt/sources.list.d/docker.list", false)
        ]
    );
    assert_eq!(
        String::from_utf8(c.write_files[1].content.bytes().to_vec()).unwrap(),
        "deb [signed-by=/etc/apt/keyrings/docker.asc] https://download.docker.com/linux/debian bookworm stable\n"
    );
    let steps = layer.steps();
    assert!(
        matches!(&steps[0], machine_core::steps::Step::WriteFile { path, .. } if path == "/etc/apt/keyrings/docker.asc")
    );
    assert!(
        matches!(&steps[1], machine_core::steps::Step::WriteFile { path, .. } if path == "/etc/apt/sources.list.d/docker.list")
    );
    for (repo, field) in [
        (
            AptRepository::new("d", "ftp://x", "bookworm", ["main"], PGP),
            "uri",
        ),
        (
            AptRepository::new("d", "https://x y", "bookworm", ["main"], PGP),
            "uri",
        ),
        (
            AptRepository::new("d", "https://x", "book worm", ["main"], PGP),
            "suite",
        ),
        (
            AptRepository::new("d", "https://x", "bookworm", ["ma;in"], PGP),
            "components[0]",
        ),
        (
            AptRepository::new("d", "https://x", "bookworm", ["main"], "ssh-rsa AAAA"),
            "key",
        ),
        (
            AptRepository::new("../d", "https://x", "bookworm", ["main"], PGP),
            "name",
        ),
    ] {
        let e = RecipeLayer::new("l", vec![repo.into()]).unwrap_err();
        assert_eq!(
            e.field(),
            Some(format!("layer l.recipes[0].{field}").as_str())
        );
    }
}
