//! Repositories of the dnf/yum, zypper and apk families with their signing keys: bad
//! input refused naming the field; on real roots, the layer applied coupled (the real
//! cloud-init, told the distro is RHEL, openSUSE or Alpine so that its own package code
//! runs) and decoupled (the layer's steps) leaves the same files and the same
//! package-manager calls, with every repository in place before the first call, and a
//! second decoupled run changes nothing. The package managers and rpm are recording
//! stubs (no RPM or Alpine root can be fetched here); the roots are Debian.

mod machine;

use machine::{CALLS, Root, apply, boot, file_state, root};
use recipes::{
    ApkRepository, DnfRepository, Package, Packages, Recipe, RecipeLayer, ZypperRepository,
};

const PGP: &str = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZXhhbXBsZQ==\n=abcd\n-----END PGP PUBLIC KEY BLOCK-----\n";
const PEM: &str = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAexample\n-----END PUBLIC KEY-----\n";

/// A stub that also records which repository files and keys exist when it is called.
fn seeing_stub(tool: &str) -> String {
    format!(
        "#!/bin/sh\n# Test stub for {tool}: records the call and the repositories it would see.\n\
         case \"{tool} $1\" in 'rpm -q'*|'apk info') exit 1 ;; esac\n\
         seen=$(ls /etc/yum.repos.d /etc/zypp/repos.d /etc/apk/keys /etc/pki/rpm-gpg 2>/dev/null | grep -v ':$' | grep . | tr '\\n' ' ')\n\
         repos=$(cat /etc/apk/repositories 2>/dev/null | tr '\\n' ' ')\n\
         printf '%s | %s| %s\\n' \"{tool} $*\" \"$seen\" \"$repos\" >> {CALLS}\n"
    )
}

/// Applies `recipes` both ways and returns the decoupled machine's state after
/// checking the coupled one's is the same and a rerun changes nothing.
async fn both_ways(distro: &str, recipes: Vec<Recipe>, tools: &[&str], files: &[&str]) -> String {
    let layer = RecipeLayer::new("repos", recipes).unwrap();
    let stubs: Vec<(&str, String)> = tools.iter().map(|t| (*t, seeing_stub(t))).collect();
    let state = |r: &Root| {
        let mut s = String::new();
        for f in files {
            s.push_str(&format!("## {f}\n{}", file_state(r, f)));
        }
        s.push_str(&format!("## calls\n{}", file_state(r, CALLS)));
        s
    };
    let doc = layer.coupled().unwrap().render().unwrap();
    machine::peers::assert_valid_cloud_config(&doc);
    let coupled = root(doc.as_bytes(), &stubs);
    boot(&coupled, Some(distro));
    let result = coupled.read("/run/cloud-init/result.json");
    assert!(
        result.contains("\"errors\": []"),
        "cloud-init reported errors: {result}\n{}",
        coupled.read("/var/log/cloud-init-output.log")
    );
    let decoupled = root(b"", &stubs);
    apply(&layer, &decoupled).await.unwrap();
    let after = state(&decoupled);
    assert_eq!(
        state(&coupled),
        after,
        "coupled (left) and decoupled (right) differ"
    );
    apply(&layer, &decoupled).await.unwrap();
    assert_eq!(state(&decoupled), after, "the rerun changed the machine");
    after
}

#[tokio::test]
async fn a_dnf_repository_is_in_place_before_dnf_runs_on_both_paths() {
    let state = both_ways(
        "rhel",
        vec![
            Packages::dnf([Package::pinned("kubectl", "1.31.2")]).into(),
            DnfRepository::new(
                "example",
                "https://rpm.example.invalid/el/$releasever/",
                PGP,
            )
            .with_name("Example packages")
            .into(),
        ],
        &["dnf", "rpm"],
        &[
            "/etc/yum.repos.d/example.repo",
            "/etc/pki/rpm-gpg/RPM-GPG-KEY-example",
        ],
    )
    .await;
    for expected in [
        "## /etc/yum.repos.d/example.repo\n644 root:root\n[example]\nname=Example packages\nbaseurl=https://rpm.example.invalid/el/$releasever/\nenabled=1\ngpgcheck=1\ngpgkey=file:///etc/pki/rpm-gpg/RPM-GPG-KEY-example\n",
        &format!("## /etc/pki/rpm-gpg/RPM-GPG-KEY-example\n644 root:root\n{PGP}"),
        "dnf -y makecache | RPM-GPG-KEY-example example.repo |",
        "dnf -y install kubectl-1.31.2 | RPM-GPG-KEY-example example.repo |",
    ] {
        assert!(state.contains(expected), "missing {expected:?} in\n{state}");
    }
}

#[tokio::test]
async fn a_zypper_repository_and_its_imported_key_are_in_place_before_zypper_runs() {
    let state = both_ways(
        "opensuse",
        vec![
            Packages::zypper([Package::new("nginx")]).into(),
            ZypperRepository::new("example", "https://rpm.example.invalid/suse/", PGP).into(),
        ],
        &["zypper", "rpm"],
        &[
            "/etc/zypp/repos.d/example.repo",
            "/etc/pki/rpm-gpg/RPM-GPG-KEY-example",
        ],
    )
    .await;
    for expected in [
        "## /etc/zypp/repos.d/example.repo\n644 root:root\n[example]\nname=example\nenabled=1\nautorefresh=1\nbaseurl=https://rpm.example.invalid/suse/\ntype=rpm-md\ngpgcheck=1\ngpgkey=file:///etc/pki/rpm-gpg/RPM-GPG-KEY-example\n",
        &format!("## /etc/pki/rpm-gpg/RPM-GPG-KEY-example\n644 root:root\n{PGP}"),
        // The key is imported first, then zypper refreshes and installs.
        "## calls\n644 root:root\nrpm --import /etc/pki/rpm-gpg/RPM-GPG-KEY-example | RPM-GPG-KEY-example |",
        "zypper --non-interactive refresh | RPM-GPG-KEY-example example.repo |",
        "zypper --non-interactive install --auto-agree-with-licenses nginx | RPM-GPG-KEY-example example.repo |",
    ] {
        assert!(state.contains(expected), "missing {expected:?} in\n{state}");
    }
}

#[tokio::test]
async fn an_apk_repository_line_and_key_are_in_place_before_apk_runs() {
    let url = "https://dl.example.invalid/alpine/v3.20/main";
    let state = both_ways(
        "alpine",
        vec![
            Packages::apk([Package::pinned("curl", "8.9.1-r1")]).into(),
            ApkRepository::new(url, "example-5d5f2a7e.rsa.pub", PEM).into(),
        ],
        &["apk"],
        &[
            "/etc/apk/repositories",
            "/etc/apk/keys/example-5d5f2a7e.rsa.pub",
        ],
    )
    .await;
    for expected in [
        &format!("## /etc/apk/repositories\n644 root:root\n{url}\n"),
        &format!("## /etc/apk/keys/example-5d5f2a7e.rsa.pub\n644 root:root\n{PEM}"),
        &format!("apk --quiet update | example-5d5f2a7e.rsa.pub | {url} \n"),
        &format!("apk --quiet add curl=8.9.1-r1 | example-5d5f2a7e.rsa.pub | {url} \n"),
    ] {
        assert!(state.contains(expected), "missing {expected:?} in\n{state}");
    }
}

#[tokio::test]
async fn the_apk_line_is_added_once_next_to_the_images_own() {
    let url = "https://dl.example.invalid/alpine/v3.20/main";
    let layer = RecipeLayer::new(
        "repos",
        vec![ApkRepository::new(url, "example.rsa.pub", PEM).into()],
    )
    .unwrap();
    let machine = root(b"", &[]);
    let list = machine.upper("/etc/apk/repositories");
    std::fs::create_dir_all(list.parent().unwrap()).unwrap();
    // The image's list, without a final newline.
    std::fs::write(&list, "https://dl-cdn.alpinelinux.org/alpine/v3.20/main").unwrap();
    apply(&layer, &machine).await.unwrap();
    machine.run(&format!("rm {}", layer.decoupled().unwrap().state_path()));
    apply(&layer, &machine).await.unwrap();
    assert_eq!(
        machine.read("/etc/apk/repositories"),
        format!("https://dl-cdn.alpinelinux.org/alpine/v3.20/main\n{url}\n")
    );
}

fn field_of(recipe: Recipe) -> String {
    RecipeLayer::new("l", vec![recipe])
        .expect_err("must be refused")
        .field()
        .expect("a field")
        .to_owned()
}

#[test]
fn bad_repositories_are_refused_naming_the_field() {
    let dnf = || DnfRepository::new("example", "https://x.invalid/", PGP);
    let zypper = || ZypperRepository::new("example", "https://x.invalid/", PGP);
    let apk = || ApkRepository::new("https://x.invalid/main", "k.rsa.pub", PEM);
    for (recipe, field) in [
        (
            DnfRepository {
                id: "../x".into(),
                ..dnf()
            }
            .into(),
            "id",
        ),
        (
            DnfRepository {
                id: "a b".into(),
                ..dnf()
            }
            .into(),
            "id",
        ),
        (dnf().with_name("two\nlines").into(), "name"),
        (
            DnfRepository {
                baseurl: "ftp://x".into(),
                ..dnf()
            }
            .into(),
            "baseurl",
        ),
        (
            DnfRepository {
                baseurl: "https://x y".into(),
                ..dnf()
            }
            .into(),
            "baseurl",
        ),
        (
            DnfRepository {
                key: "ssh-rsa AAAA".into(),
                ..dnf()
            }
            .into(),
            "key",
        ),
        (
            ZypperRepository {
                id: "".into(),
                ..zypper()
            }
            .into(),
            "id",
        ),
        (
            ZypperRepository {
                baseurl: "https://x'$(id)'".into(),
                ..zypper()
            }
            .into(),
            "baseurl",
        ),
        (
            ZypperRepository {
                key: PEM.into(),
                ..zypper()
            }
            .into(),
            "key",
        ),
        (
            ApkRepository {
                url: "https://x.invalid/$arch".into(),
                ..apk()
            }
            .into(),
            "url",
        ),
        (
            ApkRepository {
                url: "/srv/repo".into(),
                ..apk()
            }
            .into(),
            "url",
        ),
        (
            ApkRepository {
                key_name: "../k.rsa.pub".into(),
                ..apk()
            }
            .into(),
            "key_name",
        ),
        (
            ApkRepository {
                key_name: "k.pem".into(),
                ..apk()
            }
            .into(),
            "key_name",
        ),
        (
            ApkRepository {
                key: PGP.into(),
                ..apk()
            }
            .into(),
            "key",
        ),
    ] {
        assert_eq!(field_of(recipe), format!("layer l.recipes[0].{field}"));
    }
    // Two recipes writing one file or one line.
    let e = RecipeLayer::new("l", vec![dnf().into(), dnf().into()]).unwrap_err();
    assert_eq!(e.field(), Some("layer l.recipes[1].id"));
    let e = RecipeLayer::new("l", vec![dnf().into(), zypper().into()]).unwrap_err();
    assert_eq!(e.field(), Some("layer l.recipes[1].id"));
    let e = RecipeLayer::new(
        "l",
        vec![
            apk().into(),
            ApkRepository {
                key_name: "other.rsa.pub".into(),
                ..apk()
            }
            .into(),
        ],
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("layer l.recipes[1].url"));
}

#[test]
fn debug_shows_the_keys_size_not_the_key() {
    let shown = format!(
        "{:?}",
        RecipeLayer::new(
            "l",
            vec![
                DnfRepository::new("d", "https://x.invalid/", PGP).into(),
                ApkRepository::new("https://x.invalid/main", "k.rsa.pub", PEM).into(),
            ],
        )
        .unwrap()
    );
    assert!(
        !shown.contains("mDMEZXhhbXBsZQ") && !shown.contains("MIIBIjAN"),
        "{shown}"
    );
}

#[test]
fn the_zypper_key_import_runs_once_per_instance_coupled_though_bootcmd_runs_every_boot() {
    let layer = RecipeLayer::new(
        "repos",
        vec![ZypperRepository::new("example", "https://rpm.example.invalid/suse/", PGP).into()],
    )
    .unwrap();
    let doc = layer.coupled().unwrap().render().unwrap();
    let machine = root(doc.as_bytes(), &[("rpm", seeing_stub("rpm"))]);
    boot(&machine, Some("opensuse"));
    boot(&machine, Some("opensuse"));
    let calls = machine.read(CALLS);
    assert_eq!(calls.matches("rpm --import").count(), 1, "{calls}");
}
