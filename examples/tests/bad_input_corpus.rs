//! The bad-input corpus: every public parser and constructor of the workspace fed input a
//! user could write by mistake or an attacker on purpose. Each row must give an error
//! (never a panic) that names the field path, and the line where the input is a document,
//! within a bounded time, and the whole run within a bounded memory.
//!
//! One row per case: a name that reads as a sentence, the input, the expected field path,
//! the expected line. provider-aws has its own rows in provider-aws/tests/bad_input_corpus.rs
//! (this crate does not build the AWS SDK).

use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, Templates};
use bootstrap_ssh::{HostKeyPin, SshTarget};
use machine_core::conformance::{BadInput, check_bad_inputs};
use machine_core::user_data::assemble;
use machine_core::{
    ComposerSettings, FleetSpec, MachineName, MachineSpec, ProviderId, UserDataFormat,
    UserDataPart, check_ssh_public_key,
};
use provider_baremetal::StaticHostsConfig;

/// A genuine key (generated for this corpus, never used anywhere).
const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOXLZCJgZESodBc7Vjr3vb4fE0hSuOzUa5iERyuZmke1 ops@laptop";
const BLOB: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIOXLZCJgZESodBc7Vjr3vb4fE0hSuOzUa5iERyuZmke1";
const RSA_BLOB: &str = "AAAAB3NzaC1yc2EAAAADAQABAAAAgQDsHeU5QhAuez5UfKd786Bn2u/uxsI5duc8/45A4Po1DTyViio3ymH/y1b3YuaJFxXAm1ORGUOtEp52ZF1ifdvA2KYM3zVPX+UuCg6cPHMd/+i+9zmQ6nvYhoZMF55TQdFmkVRDV1Tf5O0y8OIgp+oh/E8LdoZllsZLKZXM6/xBJQ==";

/// The most memory the whole run may reach, inputs included (two 65 MiB documents).
const MAX_PEAK_RSS_KIB: u64 = 768 * 1024;

/// What is fed to which parser.
enum Input {
    Spec(String),
    SpecJson(String),
    Fleet(String),
    FleetJson(String),
    Settings(String),
    Inventory(String),
    InventoryJson(String),
    CloudConfig(String),
    Template(&'static str, String),
    Render(&'static str, String, serde_json::Value),
    Layer(String),
    Target(String),
    HostKey(String),
    PublicKey(String),
    Name(String),
    ProviderId(String),
    Header(String, String),
    Filename(String),
}

type Case = BadInput<Input>;

fn row(name: &'static str, input: Input, field: &str, line: Option<u32>) -> Case {
    BadInput::new(name, input, field, line)
}

fn s(text: &str) -> String {
    text.to_owned()
}

fn run(input: &Input) -> machine_core::Result<()> {
    match input {
        Input::Spec(y) => MachineSpec::from_yaml(y).map(drop),
        Input::SpecJson(j) => MachineSpec::from_json(j).map(drop),
        Input::Fleet(y) => FleetSpec::from_yaml(y).map(drop),
        Input::FleetJson(j) => FleetSpec::from_json(j).map(drop),
        Input::Settings(y) => ComposerSettings::from_yaml(y).map(drop),
        Input::Inventory(y) => StaticHostsConfig::from_yaml(y).map(drop),
        Input::InventoryJson(j) => StaticHostsConfig::from_json(j).map(drop),
        Input::CloudConfig(y) => bootstrap_cloudinit::parse(y, &[]).map(drop),
        Input::Template(name, source) => Templates::new().add(*name, source.as_str()),
        Input::Render(name, source, context) => {
            let mut t = Templates::new();
            t.add(*name, source.as_str())?;
            t.render_cloud_config(name, context, &[]).map(drop)
        }
        Input::Layer(name) => {
            CloudConfigLayer::new(name.as_str(), CloudConfig::default()).map(drop)
        }
        Input::Target(t) => SshTarget::parse(t, "root").map(drop),
        Input::HostKey(k) => HostKeyPin::parse("hostKeys[0]", k).map(drop),
        Input::PublicKey(k) => check_ssh_public_key("authorizedKeys[0]", k),
        Input::Name(n) => MachineName::new(n.as_str()).map(drop),
        Input::ProviderId(p) => ProviderId::new(p.as_str()).map(drop),
        Input::Header(name, value) => {
            let part = UserDataPart::new(UserDataFormat::CloudConfig, "a.yaml", "#cloud-config\n")
                .with_header(name.as_str(), value.as_str());
            assemble(&[part]).map(drop)
        }
        Input::Filename(f) => {
            let part = UserDataPart::new(UserDataFormat::ShellScript, f.as_str(), "#!/bin/sh\n");
            let other = UserDataPart::new(UserDataFormat::CloudConfig, "b.yaml", "#cloud-config\n");
            assemble(&[part, other]).map(drop)
        }
    }
}

fn spec_with_key(key: &str) -> String {
    format!("name: a\nssh:\n  user: ops\n  authorizedKeys:\n    - {key:?}\n")
}

fn inventory(top: &str, host: &str) -> String {
    format!("{top}hosts:\n  - name: h1\n    address: 10.0.0.1\n  - name: h2\n{host}")
}

fn nested(depth: usize) -> String {
    format!(
        "name: a\nprovider: {}{}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    )
}

fn alias_bomb() -> String {
    let mut y = String::from("name: a\nprovider:\n  a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let prev = i - 1;
        y.push_str(&format!(
            "  a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
        ));
    }
    y
}

fn huge_document() -> String {
    let mut y = String::with_capacity(machine_core::MAX_DOCUMENT_BYTES + 64);
    y.push_str("name: a\nimage: \"");
    y.push_str(&"x".repeat(machine_core::MAX_DOCUMENT_BYTES));
    y.push_str("\"\n");
    y
}

fn cases() -> Vec<Case> {
    use Input::*;
    let long = "v".repeat(10_000);
    let long_key = format!("{}…", "k".repeat(64));
    vec![
        // MachineSpec from YAML.
        row(
            "a spec without a name is refused",
            Spec(s("image: x\n")),
            "",
            Some(1),
        ),
        row(
            "an upper-case name is refused",
            Spec(s("name: Web\n")),
            "name",
            Some(1),
        ),
        row(
            "a name with an underscore is refused",
            Spec(s("image: x\nname: web_1\n")),
            "name",
            Some(2),
        ),
        row(
            "a name of 64 characters is refused",
            Spec(format!("name: {}\n", "a".repeat(64))),
            "name",
            Some(1),
        ),
        row(
            "a name starting with a dash is refused",
            Spec(s("name: \"-web\"\n")),
            "name",
            Some(1),
        ),
        row(
            "an empty name is refused",
            Spec(s("name: \"\"\n")),
            "name",
            Some(1),
        ),
        row(
            "a 10 KB name is refused and shown cut",
            Spec(format!("name: {long}\n")),
            "name",
            Some(1),
        ),
        row(
            "a name given as a list is refused",
            Spec(s("name: [a]\n")),
            "name",
            Some(1),
        ),
        row(
            "an unknown field is refused",
            Spec(s("name: a\nflavour: big\n")),
            "flavour",
            Some(2),
        ),
        row(
            "a 10 KB unknown field is refused and shown cut",
            Spec(format!("name: a\n{long}: 1\n")),
            "",
            Some(2),
        ),
        row(
            "an unknown field under ssh is refused",
            Spec(s("name: a\nssh: {user: ops, keys: []}\n")),
            "ssh.keys",
            Some(2),
        ),
        row(
            "a label key with a space is refused",
            Spec(s("name: a\nlabels: {\"a b\": c}\n")),
            "labels.a b",
            Some(2),
        ),
        row(
            "a label value with a space is refused",
            Spec(s("name: a\nlabels:\n  k: \"a b\"\n")),
            "labels.k",
            Some(3),
        ),
        row(
            "a label value of 64 characters is refused",
            Spec(format!("name: a\nlabels: {{k: {}}}\n", "v".repeat(64))),
            "labels.k",
            Some(2),
        ),
        row(
            "a 10 KB label key is refused and its path cut",
            Spec(format!("name: a\nlabels: {{{}: v}}\n", "k".repeat(10_000))),
            &format!("labels.{long_key}"),
            Some(2),
        ),
        row(
            "a 10 KB label value is refused and shown cut",
            Spec(format!("name: a\nlabels: {{k: \"{long} \"}}\n")),
            "labels.k",
            Some(2),
        ),
        row(
            "labels given as a list are refused",
            Spec(s("name: a\nlabels: [a, b]\n")),
            "labels",
            Some(2),
        ),
        row(
            "an ssh user with a space is refused",
            Spec(s("name: a\nssh: {user: \"a b\"}\n")),
            "ssh.user",
            Some(2),
        ),
        row(
            "an empty ssh user is refused",
            Spec(s("name: a\nssh: {user: \"\"}\n")),
            "ssh.user",
            Some(2),
        ),
        row(
            "an authorized key that is one word is refused",
            Spec(spec_with_key("hello")),
            "ssh.authorizedKeys[0]",
            Some(5),
        ),
        row(
            "an authorized key with an embedded newline is refused",
            Spec(spec_with_key(&format!(
                "{KEY}\nssh-ed25519 {BLOB} intruder"
            ))),
            "ssh.authorizedKeys[0]",
            Some(5),
        ),
        row(
            "an authorized key with a carriage return is refused",
            Spec(spec_with_key(&format!("{KEY}\r"))),
            "ssh.authorizedKeys[0]",
            Some(5),
        ),
        row(
            "an authorized key with a NUL is refused",
            Spec(spec_with_key(&format!("ssh-ed25519 {BLOB}\0"))),
            "ssh.authorizedKeys[0]",
            Some(5),
        ),
        row(
            "an authorized key whose blob is not base64 is refused",
            Spec(spec_with_key("ssh-ed25519 AAAA!!!!")),
            "ssh.authorizedKeys[0]",
            Some(5),
        ),
        row(
            "an authorized key whose blob is cut short is refused",
            Spec(spec_with_key("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE")),
            "ssh.authorizedKeys[0]",
            Some(5),
        ),
        row(
            "an authorized key whose blob holds another key type is refused",
            Spec(spec_with_key(&format!("ssh-ed25519 {RSA_BLOB}"))),
            "ssh.authorizedKeys[0]",
            Some(5),
        ),
        row(
            "a bad second authorized key is named by its index",
            Spec(format!(
                "name: a\nssh:\n  user: ops\n  authorizedKeys:\n    - {KEY:?}\n    - \"ssh-rsa {BLOB}\"\n"
            )),
            "ssh.authorizedKeys[1]",
            Some(6),
        ),
        row(
            "a field given twice is refused",
            Spec(s("name: a\nname: b\n")),
            "",
            Some(2),
        ),
        row(
            "an unclosed flow list is refused",
            Spec(s("name: a\nimage: [x\n")),
            "image",
            Some(2),
        ),
        row(
            "two documents in one are refused",
            Spec(s("name: a\n---\nname: b\n")),
            "",
            Some(3),
        ),
        row("an empty document is refused", Spec(s("")), "", None),
        row("a null document is refused", Spec(s("~\n")), "", Some(1)),
        row(
            "a list where a spec should be is refused",
            Spec(s("- name: a\n")),
            "",
            Some(1),
        ),
        row(
            "a 10 KB image given as a list is refused and shown cut",
            Spec(format!("name: a\nimage: [\"{long}\"]\n")),
            "image",
            Some(2),
        ),
        row(
            "a document nested 200 levels deep is refused",
            Spec(nested(200)),
            "",
            Some(2),
        ),
        row("an alias bomb is refused", Spec(alias_bomb()), "", None),
        row(
            "a document over 64 MiB is refused unread",
            Spec(huge_document()),
            "",
            None,
        ),
        // FleetSpec from YAML.
        row(
            "a fleet naming a machine twice is refused",
            Fleet(s("machines:\n  - name: a\n  - name: b\n  - name: a\n")),
            "machines[2].name",
            Some(4),
        ),
        row(
            "a bad label in a fleet's second machine is placed in the fleet",
            Fleet(s(
                "machines:\n  - name: a\n  - name: b\n    labels: {k: \"a b\"}\n",
            )),
            "machines[1].labels.k",
            Some(4),
        ),
        row(
            "a fleet whose machines are not a list is refused",
            Fleet(s("machines: a\n")),
            "machines",
            Some(1),
        ),
        row(
            "an unknown field in a fleet's machine is refused",
            Fleet(s("machines:\n  - name: a\n    flavor: x\n")),
            "machines[0].flavor",
            Some(3),
        ),
        row(
            "a bad name in a fleet is refused with its index",
            Fleet(s("machines:\n  - name: a\n  - name: B\n")),
            "machines[1].name",
            Some(3),
        ),
        row(
            "a fleet with a bad key in its third machine is refused",
            Fleet(format!(
                "machines:\n  - name: a\n  - name: b\n  - name: c\n    ssh: {{user: ops, authorizedKeys: [\"ssh-ed25519 {BLOB}\\nx\"]}}\n"
            )),
            "machines[2].ssh.authorizedKeys[0]",
            Some(5),
        ),
        // MachineSpec and FleetSpec from JSON.
        row(
            "a bad name in JSON is refused",
            SpecJson(s("{\"name\": \"Web\"}")),
            "name",
            Some(1),
        ),
        row(
            "a bad label in JSON is refused with its line",
            SpecJson(s(
                "{\n  \"name\": \"a\",\n  \"labels\": {\"k\": \"a b\"}\n}",
            )),
            "labels.k",
            Some(3),
        ),
        row(
            "an unknown field in JSON is refused",
            SpecJson(s("{\"name\": \"a\",\n \"flavour\": 1}")),
            "flavour",
            Some(2),
        ),
        row(
            "a bad authorized key in JSON is refused",
            SpecJson(format!(
                "{{\"name\": \"a\",\n \"ssh\": {{\"user\": \"ops\", \"authorizedKeys\": [\"ssh-ed25519 {BLOB}\\nx\"]}}}}"
            )),
            "ssh.authorizedKeys[0]",
            Some(2),
        ),
        row(
            "trailing text after a JSON spec is refused",
            SpecJson(s("{\"name\": \"a\"} {}")),
            "",
            Some(1),
        ),
        row(
            "a JSON syntax error is refused",
            SpecJson(s("{\"name\": \"a\",\n")),
            "",
            Some(2),
        ),
        row(
            "a JSON spec nested 200 levels deep is refused",
            SpecJson(format!(
                "{{\"name\": \"a\", \"provider\": {}{}}}",
                "[".repeat(200),
                "]".repeat(200)
            )),
            "",
            Some(1),
        ),
        row(
            "a JSON fleet naming a machine twice is refused",
            FleetJson(s(
                "{\"machines\": [\n {\"name\": \"a\"},\n {\"name\": \"a\"}]}",
            )),
            "machines[1].name",
            Some(3),
        ),
        row(
            "a JSON fleet with a 10 KB name is refused and shown cut",
            FleetJson(format!("{{\"machines\": [{{\"name\": \"{long}\"}}]}}")),
            "machines[0].name",
            Some(1),
        ),
        // ComposerSettings.
        row(
            "a deadline too long to add to a clock is refused",
            Settings(s(
                "deadlines: {create: 18446744073709551615s, boot: 1s, bootstrap: 1s, delete: 1s}\n",
            )),
            "deadlines.create",
            Some(1),
        ),
        row(
            "a poll interval over an hour is refused",
            Settings(s("pollInterval: 2h\n")),
            "pollInterval",
            None,
        ),
        row(
            "a bootstrap deadline over thirty days is refused",
            Settings(s(
                "deadlines: {create: 1s, boot: 1s, bootstrap: 31days, delete: 1s}\n",
            )),
            "deadlines.bootstrap",
            None,
        ),
        row(
            "an SSH target with a NUL in its host is refused",
            Target(s("root@host\u{0}evil")),
            "host",
            None,
        ),
        row(
            "an SSH target with a slash in its host is refused",
            Target(s("root@../../etc/passwd")),
            "host",
            None,
        ),
        row(
            "a poll interval of zero is refused",
            Settings(s("poll_interval: 0s\n")),
            "pollInterval",
            None,
        ),
        row(
            "a negative poll interval is refused",
            Settings(s("poll_interval: -5s\n")),
            "poll_interval",
            Some(1),
        ),
        row(
            "a deadline without a unit is refused",
            Settings(s("deadlines:\n  create: 5\n")),
            "deadlines.create",
            Some(2),
        ),
        row(
            "an unknown composer setting is refused",
            Settings(s("pol_interval: 1s\n")),
            "pol_interval",
            Some(1),
        ),
        row(
            "an unknown failure policy is refused",
            Settings(s("on_failure: Explode\n")),
            "on_failure",
            Some(1),
        ),
        row(
            "a deadline of zero is refused",
            Settings(s(
                "deadlines: {create: 1s, boot: 0s, bootstrap: 1s, delete: 1s}\n",
            )),
            "deadlines.boot",
            None,
        ),
        // Static-hosts inventory.
        row(
            "an inventory without hosts is refused",
            Inventory(s("hosts: []\n")),
            "hosts",
            Some(1),
        ),
        row(
            "an address that looks like an option is refused",
            Inventory(inventory("", "    address: \"-x\"\n")),
            "hosts[1].address",
            Some(5),
        ),
        row(
            "an address carrying an ssh option is refused",
            Inventory(inventory("", "    address: \"-oProxyCommand=sh\"\n")),
            "hosts[1].address",
            Some(5),
        ),
        row(
            "an address with a shell metacharacter is refused",
            Inventory(inventory("", "    address: \"x;reboot\"\n")),
            "hosts[1].address",
            Some(5),
        ),
        row(
            "an address of 300 characters is refused",
            Inventory(inventory(
                "",
                &format!("    address: {}\n", "a".repeat(300)),
            )),
            "hosts[1].address",
            Some(5),
        ),
        row(
            "a claim directory climbing out of / is refused",
            Inventory(inventory("claimDir: /../../etc\n", "    address: x\n")),
            "claimDir",
            Some(1),
        ),
        row(
            "a relative claim directory is refused",
            Inventory(inventory("claimDir: claims\n", "    address: x\n")),
            "claimDir",
            Some(1),
        ),
        row(
            "a claim directory ending in .. is refused",
            Inventory(inventory("claimDir: /srv/claims/..\n", "    address: x\n")),
            "claimDir",
            Some(1),
        ),
        row(
            "a claim directory with a . component is refused",
            Inventory(inventory("claimDir: /srv/./claims\n", "    address: x\n")),
            "claimDir",
            Some(1),
        ),
        row(
            "a claim directory with an empty component is refused",
            Inventory(inventory("claimDir: /srv//claims\n", "    address: x\n")),
            "claimDir",
            Some(1),
        ),
        row(
            "a claim directory with a trailing slash is refused",
            Inventory(inventory("claimDir: /srv/claims/\n", "    address: x\n")),
            "claimDir",
            Some(1),
        ),
        row(
            "the root as claim directory is refused",
            Inventory(inventory("claimDir: /\n", "    address: x\n")),
            "claimDir",
            Some(1),
        ),
        row(
            "a probe timeout of zero is refused",
            Inventory(inventory("probeTimeout: 0s\n", "    address: x\n")),
            "probeTimeout",
            Some(1),
        ),
        row(
            "a probe timeout of 2^64-1 seconds is refused",
            Inventory(inventory(
                "probeTimeout: 18446744073709551615s\n",
                "    address: x\n",
            )),
            "probeTimeout",
            Some(1),
        ),
        row(
            "a probe timeout over a day is refused",
            Inventory(inventory("probeTimeout: 25h\n", "    address: x\n")),
            "probeTimeout",
            Some(1),
        ),
        row(
            "a probe timeout without a unit is refused",
            Inventory(inventory("probeTimeout: 10\n", "    address: x\n")),
            "probeTimeout",
            Some(1),
        ),
        row(
            "port 0 is refused",
            Inventory(inventory("", "    address: x\n    port: 0\n")),
            "hosts[1].port",
            Some(6),
        ),
        row(
            "port 70000 is refused",
            Inventory(inventory("", "    address: x\n    port: 70000\n")),
            "hosts[1].port",
            Some(6),
        ),
        row(
            "a user that looks like an option is refused",
            Inventory(inventory("", "    address: x\n    user: \"-x\"\n")),
            "hosts[1].user",
            Some(6),
        ),
        row(
            "a user with a space is refused",
            Inventory(inventory("", "    address: x\n    user: \"a b\"\n")),
            "hosts[1].user",
            Some(6),
        ),
        row(
            "a pinned host key that is a word is refused",
            Inventory(inventory("", "    address: x\n    hostKeys: [nonsense]\n")),
            "hosts[1].hostKeys[0]",
            Some(6),
        ),
        row(
            "a pinned host key with an embedded newline is refused",
            Inventory(inventory(
                "",
                &format!(
                    "    address: x\n    hostKeys: [\"ssh-ed25519 {BLOB}\\nssh-ed25519 {BLOB}\"]\n"
                ),
            )),
            "hosts[1].hostKeys[0]",
            Some(6),
        ),
        row(
            "a host named twice is refused",
            Inventory(inventory(
                "",
                "    address: x\n  - name: h1\n    address: y\n",
            )),
            "hosts[2].name",
            Some(6),
        ),
        row(
            "a host name with an underscore is refused",
            Inventory(s("hosts:\n  - name: rack_1\n    address: x\n")),
            "hosts[0].name",
            Some(2),
        ),
        row(
            "a host label with a space is refused",
            Inventory(inventory(
                "",
                "    address: x\n    labels: {rack: \"r 1\"}\n",
            )),
            "hosts[1].labels.rack",
            Some(6),
        ),
        row(
            "an empty owner is refused",
            Inventory(inventory("owner: \"\"\n", "    address: x\n")),
            "owner",
            Some(1),
        ),
        row(
            "a misspelled host field is refused",
            Inventory(inventory("", "    adress: x\n")),
            "hosts[1].adress",
            Some(5),
        ),
        row(
            "a host without an address is refused",
            Inventory(inventory("", "    port: 22\n")),
            "hosts[1]",
            Some(5),
        ),
        row(
            "a JSON inventory with a climbing claim directory is refused",
            InventoryJson(s(
                "{\"claimDir\": \"/../../etc\",\n \"hosts\": [{\"name\": \"a\", \"address\": \"x\"}]}",
            )),
            "claimDir",
            Some(1),
        ),
        row(
            "a JSON inventory with an option-like address is refused",
            InventoryJson(s(
                "{\"hosts\": [\n {\"name\": \"a\", \"address\": \"-x\"}]}",
            )),
            "hosts[0].address",
            Some(2),
        ),
        row(
            "a JSON inventory with a huge probe timeout is refused",
            InventoryJson(s(
                "{\"probeTimeout\": \"5000000000s\",\n \"hosts\": [{\"name\": \"a\", \"address\": \"x\"}]}",
            )),
            "probeTimeout",
            Some(1),
        ),
        // cloud-config documents (bootstrap_cloudinit::parse).
        row(
            "a cloud-config without its header is refused",
            CloudConfig(s("hostname: a\n")),
            "cloud-config",
            Some(1),
        ),
        row(
            "an unknown top-level cloud-config key is refused",
            CloudConfig(s("#cloud-config\nhostname: a\nbootcmd_typo: [x]\n")),
            "bootcmd_typo",
            Some(3),
        ),
        row(
            "a cloud-config syntax error is refused",
            CloudConfig(s("#cloud-config\nruncmd: [x\n")),
            "runcmd",
            Some(2),
        ),
        row(
            "a cloud-config hostname with an underscore is refused",
            CloudConfig(s("#cloud-config\nhostname: web_1\n")),
            "hostname",
            None,
        ),
        row(
            "a cloud-config user with a space is refused",
            CloudConfig(s("#cloud-config\nusers:\n  - name: \"a b\"\n")),
            "users[0].name",
            None,
        ),
        row(
            "a cloud-config file with a relative path is refused",
            CloudConfig(s(
                "#cloud-config\nwrite_files:\n  - path: etc/motd\n    content: hi\n",
            )),
            "write_files[0].path",
            None,
        ),
        row(
            "a cloud-config file with a bad mode is refused",
            CloudConfig(s(
                "#cloud-config\nwrite_files:\n  - path: /etc/motd\n    content: hi\n    permissions: \"0999\"\n",
            )),
            "write_files[0].permissions",
            None,
        ),
        // Templates and layers.
        row(
            "a template with a syntax error is refused",
            Template("t.yaml", s("#cloud-config\nhostname: {{ name\n")),
            "template t.yaml",
            Some(2),
        ),
        row(
            "a template with an undefined variable is refused",
            Render(
                "t.yaml",
                s("#cloud-config\nhostname: {{ name }}\n"),
                serde_json::json!({}),
            ),
            "template t.yaml",
            Some(2),
        ),
        row(
            "a template rendering a bad hostname is refused",
            Render(
                "t.yaml",
                s("#cloud-config\nhostname: {{ name }}\n"),
                serde_json::json!({"name": "web_1"}),
            ),
            "hostname",
            None,
        ),
        row(
            "a layer named with a slash is refused",
            Layer(s("a/b")),
            "layer.name",
            None,
        ),
        row(
            "a layer with an empty name is refused",
            Layer(s("")),
            "layer.name",
            None,
        ),
        // SSH targets and host keys (bootstrap-ssh).
        row(
            "an empty ssh target is refused",
            Target(s("")),
            "host",
            None,
        ),
        row(
            "an ssh target with port 0 is refused",
            Target(s("host:0")),
            "port",
            None,
        ),
        row(
            "an ssh target with port 99999 is refused",
            Target(s("host:99999")),
            "port",
            None,
        ),
        row(
            "an ssh target with a word for a port is refused",
            Target(s("host:ssh")),
            "port",
            None,
        ),
        row(
            "an ssh target with an unclosed bracket is refused",
            Target(s("[::1")),
            "host",
            None,
        ),
        row(
            "an ssh target with junk after its bracket is refused",
            Target(s("[::1]x")),
            "host",
            None,
        ),
        row(
            "an ssh target whose user has a space is refused",
            Target(s("a b@host")),
            "user",
            None,
        ),
        row(
            "an ssh target with an empty user is refused",
            Target(s("@host")),
            "user",
            None,
        ),
        row(
            "an ssh target whose host has a space is refused",
            Target(s("a host")),
            "host",
            None,
        ),
        row(
            "an empty host key is refused",
            HostKey(s("")),
            "hostKeys[0]",
            None,
        ),
        row(
            "a bare SHA256 prefix is refused as a host key",
            HostKey(s("SHA256:")),
            "hostKeys[0]",
            None,
        ),
        row(
            "a short fingerprint is refused as a host key",
            HostKey(s("SHA256:abc")),
            "hostKeys[0]",
            None,
        ),
        row(
            "a host key with a cut blob is refused",
            HostKey(s("ssh-ed25519 AAAA")),
            "hostKeys[0]",
            None,
        ),
        row(
            "a host key that is not base64 is refused",
            HostKey(s("ssh-ed25519 !!!!")),
            "hostKeys[0]",
            None,
        ),
        // Public key lines (machine_core::check_ssh_public_key).
        row(
            "a public key with an embedded newline is refused",
            PublicKey(format!("{KEY}\nssh-ed25519 {BLOB} second")),
            "authorizedKeys[0]",
            None,
        ),
        row(
            "a public key with a non-base64 blob is refused",
            PublicKey(s("ssh-ed25519 not*base64 c")),
            "authorizedKeys[0]",
            None,
        ),
        row(
            "a public key whose blob is another key type is refused",
            PublicKey(format!("ssh-rsa {BLOB}")),
            "authorizedKeys[0]",
            None,
        ),
        row(
            "a public key without a blob is refused",
            PublicKey(s("ssh-ed25519")),
            "authorizedKeys[0]",
            None,
        ),
        row(
            "a public key of 20 KB is refused",
            PublicKey(format!("ssh-ed25519 {}", "A".repeat(20_000))),
            "authorizedKeys[0]",
            None,
        ),
        row(
            "a public key with an unknown type is refused",
            PublicKey(format!("foo {BLOB}")),
            "authorizedKeys[0]",
            None,
        ),
        row(
            "a public key with a vertical tab is refused",
            PublicKey(format!("ssh-ed25519\u{b}{BLOB}")),
            "authorizedKeys[0]",
            None,
        ),
        // Names and provider IDs.
        row(
            "an empty machine name is refused",
            Name(s("")),
            "name",
            None,
        ),
        row(
            "a machine name with a dot is refused",
            Name(s("a.b")),
            "name",
            None,
        ),
        row(
            "a machine name with a NUL is refused",
            Name(s("a\0b")),
            "name",
            None,
        ),
        row(
            "a 10 KB machine name is refused",
            Name("x".repeat(10_000)),
            "name",
            None,
        ),
        row(
            "a provider ID without a scheme is refused",
            ProviderId(s("i-0abc")),
            "providerID",
            None,
        ),
        row(
            "a provider ID with an upper-case scheme is refused",
            ProviderId(s("AWS:///x")),
            "providerID",
            None,
        ),
        row(
            "a provider ID with nothing after its scheme is refused",
            ProviderId(s("sim:///")),
            "providerID",
            None,
        ),
        // MIME headers of user-data parts.
        row(
            "a header name carrying a second header is refused",
            Header(s("X-A: 1\r\nX-Injected"), s("v")),
            "userData.parts[0].headers[0]",
            None,
        ),
        row(
            "a header name with a space is refused",
            Header(s("Merge Type"), s("v")),
            "userData.parts[0].headers[0]",
            None,
        ),
        row(
            "a header name with a colon is refused",
            Header(s("Merge-Type:"), s("v")),
            "userData.parts[0].headers[0]",
            None,
        ),
        row(
            "an empty header name is refused",
            Header(s(""), s("v")),
            "userData.parts[0].headers[0]",
            None,
        ),
        row(
            "a non-ASCII header name is refused",
            Header(s("Mérge-Type"), s("v")),
            "userData.parts[0].headers[0]",
            None,
        ),
        row(
            "a header value with a line break is refused",
            Header(
                s("Merge-Type"),
                s("dict()\r\nContent-Type: text/x-shellscript"),
            ),
            "userData.parts[0].headers[0]",
            None,
        ),
        row(
            "a header value with a bare LF is refused",
            Header(s("Merge-Type"), s("a\nb")),
            "userData.parts[0].headers[0]",
            None,
        ),
        row(
            "a part setting its own Content-Type is refused",
            Header(s("content-type"), s("text/plain")),
            "userData.parts[0].headers[0]",
            None,
        ),
        row(
            "a part file name with a line break is refused",
            Filename(s("a.sh\r\nX-Evil: 1")),
            "userData.parts[0].filename",
            None,
        ),
    ]
}

#[test]
fn every_bad_input_is_refused_by_field_and_line_without_panic_in_bounded_time_and_memory() {
    let cases = cases();
    assert!(cases.len() >= 100, "{} cases", cases.len());
    check_bad_inputs(&cases, run);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let peak: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    assert!(peak <= MAX_PEAK_RSS_KIB, "peak memory {peak} KiB");
}
