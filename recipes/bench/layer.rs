//! The 10-recipe layer of `examples/bench_recipes.rs` for machine `i`, shared with
//! `tests/pinned_output.rs`, which pins its output, so that the figures in
//! BENCHMARKS.md are of the layer whose output the tests check.

use recipes::{
    Account, Directory, DropIn, File, Hostname, KernelModules, LineInFile, Package, Packages,
    Recipe, Sysctl, SystemdUnit, Timezone,
};

/// The administrator's public key the layer installs.
pub const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBm9yXk2nL3sWq0cJ8pHh6YfTzQe1nM5bVrX2aD4uKgE ops@laptop";

/// Machine `i`'s recipes: host name and file content differ per machine, so nothing is
/// shared between layers.
pub fn bench_layer(i: usize) -> Vec<Recipe> {
    vec![
        Hostname::new(format!("web-{i}")).into(),
        Timezone::new("Europe/Paris").into(),
        Account::admin("ops", [KEY]).with_group("deploy").into(),
        Packages::apt([Package::pinned("nginx", "1.22.1-9"), Package::new("curl")]).into(),
        File::new("/etc/app/app.conf", format!("port = 8080\nid = {i}\n"))
            .with_mode(0o640)
            .with_owner("ops:deploy")
            .into(),
        Directory::new("/srv/app").with_owner("ops").into(),
        LineInFile::new("/etc/motd", format!("machine {i}")).into(),
        SystemdUnit::new(
            "app.service",
            "[Service]\nExecStart=/usr/bin/app\n[Install]\nWantedBy=multi-user.target\n",
        )
        .with_drop_in(DropIn::new("limits", "[Service]\nLimitNOFILE=65536\n"))
        .into(),
        Sysctl::new("90-app", [("net.ipv4.ip_forward", "1")]).into(),
        KernelModules::new("app", ["overlay", "br_netfilter"]).into(),
    ]
}
