//! Accounts and groups with fixed numbers get them on both paths: the same layer applied
//! coupled (the real cloud-init at first boot) in one Debian root and decoupled (the
//! layer's steps) in another whose image already has its default user, as a decoupled
//! machine has from its first boot. Without fixed numbers, the order of creation
//! decides, and the two machines differ: what the docs warn of.

mod machine;

use machine::{Root, apply, boot, root};
use recipes::{Account, Group, RecipeLayer};

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBm9yXk2nL3sWq0cJ8pHh6YfTzQe1nM5bVrX2aD4uKgE ops@laptop";

fn layer() -> RecipeLayer {
    RecipeLayer::new(
        "ids",
        vec![
            Account::admin("ops", [KEY])
                .with_uid(2001)
                .with_group("deploy")
                .into(),
            // After the account that names it: fixed groups are made first all the same.
            Group::new("deploy").with_gid(2345).into(),
        ],
    )
    .unwrap()
}

/// `name:uid:gid` from passwd, or `name:gid` from group.
fn ids(root: &Root, file: &str, name: &str) -> String {
    let line = root
        .account(file, name)
        .unwrap_or_else(|| panic!("no {name} in {file}"));
    let f: Vec<&str> = line.split(':').collect();
    match file {
        "/etc/passwd" => format!("{}:{}:{}", f[0], f[2], f[3]),
        _ => format!("{}:{}", f[0], f[2]),
    }
}

#[tokio::test]
async fn fixed_uids_and_gids_are_the_same_coupled_and_decoupled() {
    let layer = layer();
    let doc = layer.coupled().unwrap().render().unwrap();
    let coupled = root(doc.as_bytes(), &[]);
    boot(&coupled, None);
    let decoupled = root(b"", &[]);
    // The image's default user, made at the decoupled machine's first boot.
    let made = decoupled.run("useradd -m debian");
    assert!(made.status.success(), "{made:?}");
    apply(&layer, &decoupled).await.unwrap();

    for (file, name, expected) in [
        ("/etc/passwd", "ops", "ops:2001:2001"),
        ("/etc/group", "ops", "ops:2001"),
        ("/etc/group", "deploy", "deploy:2345"),
    ] {
        assert_eq!(ids(&coupled, file, name), expected, "coupled {file}");
        assert_eq!(ids(&decoupled, file, name), expected, "decoupled {file}");
    }
    // cloud-init found the account made early and still did its part.
    for r in [&coupled, &decoupled] {
        let keys = r.run("cat /home/ops/.ssh/authorized_keys; passwd -S ops | cut -d' ' -f2");
        let out = String::from_utf8_lossy(&keys.stdout).into_owned();
        assert!(out.contains(KEY) && out.ends_with("L\n"), "{out}");
        let groups = r.run("id -nG ops");
        assert!(String::from_utf8_lossy(&groups.stdout).contains("deploy"));
    }
}

#[tokio::test]
async fn without_fixed_numbers_the_order_of_creation_decides() {
    // What the docs warn of: cloud-init makes the layer's groups before any account,
    // while the decoupled machine had the image's default user (and its group) first.
    let layer = RecipeLayer::new(
        "ids",
        vec![Group::new("web").into(), Account::new("app").into()],
    )
    .unwrap();
    let doc = layer.coupled().unwrap().render().unwrap();
    let coupled = root(doc.as_bytes(), &[]);
    boot(&coupled, None);
    let decoupled = root(b"", &[]);
    let made = decoupled.run("useradd -m debian");
    assert!(made.status.success(), "{made:?}");
    apply(&layer, &decoupled).await.unwrap();
    assert_ne!(
        ids(&coupled, "/etc/group", "web"),
        ids(&decoupled, "/etc/group", "web")
    );
}

#[tokio::test]
async fn an_account_that_exists_with_another_uid_fails_saying_both() {
    let layer = layer();
    let machine = root(b"", &[]);
    let made = machine.run("useradd -m --uid 3000 ops");
    assert!(made.status.success(), "{made:?}");
    let e = apply(&layer, &machine).await.expect_err("must fail");
    let shown = e.to_string();
    assert!(
        shown.contains("account ops exists with UID 3000, not 2001"),
        "{shown}"
    );
}
