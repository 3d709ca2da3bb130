//! A sudo rule takes effect only once `visudo` on the machine accepts it, on both
//! paths: a broken rule fails its step naming the field, sudo keeps working for
//! everyone and the rule in place before stays; a good rule lands identically coupled
//! (the real cloud-init) and decoupled (the layer's steps), in a Debian root with sudo.

mod machine;

use machine::{Root, apply, boot, file_state, root};
use recipes::{Account, RecipeLayer};

const RULE: &str = "/etc/sudoers.d/90-recipes-ops";
const GOOD: &str = "ALL=(ALL) NOPASSWD:ALL";
/// `NOPASSWD` without its colon: sudo cannot parse it, and with it in place would
/// refuse to run for anyone, root included.
const BROKEN: &str = "ALL=(ALL) NOPASSWD ALL";
/// The rule an earlier run left.
const OLD: &str = "ops ALL=(ALL) NOPASSWD:/usr/bin/true\n";

fn layer(rule: &str) -> RecipeLayer {
    RecipeLayer::new("admins", vec![Account::new("ops").with_sudo(rule).into()]).unwrap()
}

/// sudo parses every sudoers file at each run: `sudo -n true` as root succeeds only
/// while they all parse.
fn assert_sudo_works(root: &Root) {
    let out = root.run("sudo -n true");
    assert!(
        out.status.success(),
        "sudo no longer works: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The files of /etc/sudoers.d but the image's default user's, which cloud-init writes
/// at first boot (the decoupled roots here never booted).
fn sudoers_d(root: &Root) -> String {
    let out = root.run("ls -A /etc/sudoers.d | grep -vx 90-cloud-init-users");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn a_good_rule_lands_the_same_on_both_paths() {
    let doc = layer(GOOD).coupled().unwrap().render().unwrap();
    let coupled = root(doc.as_bytes(), &[]);
    boot(&coupled, None);
    let decoupled = root(b"", &[]);
    apply(&layer(GOOD), &decoupled).await.unwrap();
    let state = file_state(&decoupled, RULE);
    assert_eq!(state, "440 root:root\nops ALL=(ALL) NOPASSWD:ALL\n");
    assert_eq!(file_state(&coupled, RULE), state);
    assert_eq!(sudoers_d(&coupled), sudoers_d(&decoupled));
    assert_sudo_works(&coupled);
    assert_sudo_works(&decoupled);
}

#[tokio::test]
async fn a_broken_rule_fails_decoupled_naming_the_field_and_the_old_rule_stays() {
    let machine = root(b"", &[]);
    apply(&layer(GOOD), &machine).await.unwrap();
    let before = file_state(&machine, RULE);
    let e = apply(&layer(BROKEN), &machine)
        .await
        .expect_err("visudo must refuse the rule");
    let shown = e.to_string();
    assert!(
        shown.contains("layer admins.recipes[0].sudo") && shown.contains("syntax error"),
        "the error names the field and says what visudo said: {shown}"
    );
    assert_eq!(file_state(&machine, RULE), before, "the old rule changed");
    assert_eq!(sudoers_d(&machine), "90-recipes-ops\nREADME\n");
    assert_sudo_works(&machine);
}

#[tokio::test]
async fn a_broken_rule_fails_coupled_and_the_old_rule_stays() {
    let doc = layer(BROKEN).coupled().unwrap().render().unwrap();
    let machine = root(doc.as_bytes(), &[]);
    // The image already holds a rule for the account.
    let old = machine.upper(RULE);
    std::fs::create_dir_all(old.parent().unwrap()).unwrap();
    std::fs::write(&old, OLD).unwrap();
    machine.run(&format!("chmod 0440 {RULE}"));
    boot(&machine, None);
    assert_eq!(file_state(&machine, RULE), format!("440 root:root\n{OLD}"));
    assert_eq!(sudoers_d(&machine), "90-recipes-ops\nREADME\n");
    assert_sudo_works(&machine);
    // cloud-init reports the failure, and its log names the field.
    let log = machine.read("/var/log/cloud-init-output.log");
    assert!(
        log.contains("layer admins.recipes[0].sudo: visudo refuses the sudo rule"),
        "{log}"
    );
    let result = machine.read("/run/cloud-init/result.json");
    assert!(result.contains("scripts-user"), "{result}");
}
