//! The rendered output of fixed layers, pinned byte for byte: the coupled cloud-config
//! and the decoupled step layer (as its coupled script, which holds every step, its
//! content and its hash). A change to how recipes render (a speed-up, a refactoring)
//! must leave these unchanged, or machines would see new step hashes and rerun steps.
//!
//! The pinned files are under `tests/pinned/`. After an intended change of output, write
//! them anew with `RECIPES_WRITE_PINNED=1 cargo test -p recipes --test pinned_output`
//! and review the diff.

use std::path::PathBuf;

use recipes::{
    Account, ApkRepository, AptRepository, Containerd, Directory, DnfRepository, File, Group,
    KernelModules, LineInFile, Package, PackageFamily, Packages, Recipe, RecipeLayer,
    SUDO_ALL_NOPASSWD, SwapOff, Sysctl, SystemdUnit, ZypperRepository,
};

const PGP: &str = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZXhhbXBsZQ==\n=abcd\n-----END PGP PUBLIC KEY BLOCK-----\n";
const PEM: &str = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAexample\n-----END PUBLIC KEY-----\n";

#[path = "../bench/layer.rs"]
mod layer;
use layer::{KEY, bench_layer};

/// Every other kind of recipe, with quoting-worthy values (a `'`, spaces, a newline).
fn other_kinds() -> Vec<Recipe> {
    vec![
        Group::new("deploy").into(),
        Group::new("audit").into(),
        Account::new("app")
            .with_gecos("App's account")
            .with_shell("/bin/bash")
            .with_group("deploy")
            .with_sudo("ALL=(root) NOPASSWD: /usr/bin/systemctl restart app")
            .into(),
        Account::admin("ops", [KEY])
            .with_sudo(SUDO_ALL_NOPASSWD)
            .into(),
        AptRepository::new(
            "example",
            "https://apt.example.invalid/debian",
            "bookworm",
            ["main", "contrib"],
            PGP,
        )
        .into(),
        Packages::apt([Package::new("nginx")]).into(),
        File::new("/etc/app/it's.conf", "a 'quoted' line\n\tand a tab\n").into(),
        File::new("/etc/app/bin", vec![0u8, 159, 146, 150, 255]).into(),
        Directory::new("/srv/data")
            .with_owner("app:deploy")
            .with_mode(0o750)
            .into(),
        LineInFile::new("/etc/app/it's.conf", "x = 'y' # z").into(),
        SystemdUnit::new(
            "app.service",
            "[Unit]\nDescription=app\n[Service]\nExecStart=/usr/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n",
        )
        .into(),
        Sysctl::new("90-k8s", [("net.ipv4.ip_forward", "1"), ("vm.swappiness", "0")]).into(),
        KernelModules::new("k8s", ["overlay"]).into(),
        SwapOff.into(),
        Containerd::new(PackageFamily::Apt)
            .with_sandbox_image("registry.k8s.io/pause:3.9")
            .into(),
    ]
}

fn layers() -> Vec<(&'static str, Vec<Recipe>)> {
    vec![
        ("bench-7", bench_layer(7)),
        ("other-kinds", other_kinds()),
        (
            "dnf",
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
        ),
        (
            "zypper",
            vec![
                Packages::zypper([Package::new("nginx")]).into(),
                ZypperRepository::new("example", "https://rpm.example.invalid/suse/", PGP).into(),
            ],
        ),
        (
            "apk",
            vec![
                Packages::apk([Package::pinned("curl", "8.9.1-r1")]).into(),
                ApkRepository::new(
                    "https://dl.example.invalid/alpine/v3.20/main",
                    "example-5d5f2a7e.rsa.pub",
                    PEM,
                )
                .into(),
            ],
        ),
    ]
}

#[test]
fn rendered_layers_match_the_pinned_output_byte_for_byte() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/pinned");
    let write = std::env::var_os("RECIPES_WRITE_PINNED").is_some();
    let mut differ = Vec::new();
    for (name, recipes) in layers() {
        let layer = RecipeLayer::new("base", recipes).unwrap();
        let coupled = layer.coupled().unwrap().render().unwrap();
        let decoupled = layer.decoupled().unwrap().render_script();
        for (file, got) in [
            (format!("{name}.cloud-config.yaml"), coupled),
            (format!("{name}.steps.sh"), decoupled),
        ] {
            let path = dir.join(&file);
            if write {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &got).unwrap();
                continue;
            }
            let pinned = std::fs::read_to_string(&path).unwrap_or_else(|e| {
                panic!(
                    "cannot read {}: {e}; write it with RECIPES_WRITE_PINNED=1",
                    path.display()
                )
            });
            if pinned != got {
                differ.push(format!("{file}:\n--- pinned\n{pinned}\n--- now\n{got}"));
            }
        }
    }
    assert!(differ.is_empty(), "output changed:\n{}", differ.join("\n"));
}
