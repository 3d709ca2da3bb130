//! Rendering cloud-configs, checked by the real cloud-init: every document rendered here
//! goes through `cloud-init schema`, and values are read back by PyYAML, the parser
//! cloud-init itself uses.

mod peers;

use bootstrap_cloudinit::{
    CaCerts, CloudConfig, Command, Content, ManageEtcHosts, Ntp, PhoneHome, PhoneHomePost, Secret,
    SshHostKeys, User, UserEntry, WriteFile, parse, render,
};
use machine_core::ErrorKind;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHx4bmxvZ2luLWtleS1mb3ItdGVzdHMtb25seQ ops@laptop";
const CERT: &str =
    "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUX\n-----END CERTIFICATE-----\n";

/// A cloud-config using every modeled key.
fn full() -> CloudConfig {
    CloudConfig {
        hostname: Some("web-1".into()),
        fqdn: Some("web-1.example.org".into()),
        prefer_fqdn_over_hostname: Some(false),
        manage_etc_hosts: Some(ManageEtcHosts::Localhost),
        timezone: Some("Etc/UTC".into()),
        users: vec![
            UserEntry::Default,
            UserEntry::User(User {
                groups: vec!["adm".into(), "sudo".into()],
                gecos: Some("Operator: on call".into()),
                hashed_passwd: Some(Secret::new("$6$rounds=4096$salt$hash")),
                ..User::admin("ops", [KEY.to_owned()])
            }),
            UserEntry::User(User {
                system: Some(true),
                shell: Some("/usr/sbin/nologin".into()),
                ..User::new("app")
            }),
        ],
        ssh_pwauth: Some(false),
        disable_root: Some(true),
        ssh_keys: Some(SshHostKeys {
            ed25519_private: Some(Secret::new(
                "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU=\n-----END OPENSSH PRIVATE KEY-----\n",
            )),
            ed25519_public: Some(KEY.to_owned()),
            ..SshHostKeys::default()
        }),
        ca_certs: Some(CaCerts {
            remove_defaults: Some(false),
            trusted: vec![CERT.into()],
        }),
        ntp: Some(Ntp {
            enabled: Some(true),
            ntp_client: Some("chrony".into()),
            servers: vec!["ntp1.example.org".into()],
            pools: vec!["pool.ntp.org".into()],
        }),
        package_update: Some(true),
        package_upgrade: Some(false),
        packages: vec!["curl".into(), "jq".into()],
        write_files: vec![
            WriteFile::new("/etc/motd", "yes\n---\n#cloud-config\nkey: value\n")
                .permissions("0644"),
            WriteFile::new("/etc/app/token", Secret::new("s3cr3t-token"))
                .permissions("0600")
                .owner("app:app")
                .deferred(),
            WriteFile::new("/usr/local/bin/blob", vec![0u8, 159, 146, 150, 255])
                .permissions("0755"),
            WriteFile::new("/etc/environment", "EXTRA=1\n").appended(),
        ],
        bootcmd: vec![Command::Shell("echo early > /run/early".into())],
        runcmd: vec![
            Command::Shell("systemctl enable --now app: 'quoted' \"too\"".into()),
            Command::Argv(vec!["touch".into(), "/run/done; rm -rf /".into()]),
        ],
        phone_home: Some(PhoneHome {
            url: "http://127.0.0.1:8080/$INSTANCE_ID/".into(),
            post: PhoneHomePost::Fields(vec!["pub_key_ed25519".into(), "instance_id".into()]),
            tries: Some(3),
        }),
        final_message: Some("done after $UPTIME seconds".into()),
        extra: [(
            "locale".to_owned(),
            serde_json::Value::String("C.UTF-8".into()),
        )]
        .into(),
    }
}

#[test]
fn full_document_passes_the_real_schema_and_reads_back_identically() {
    let config = full();
    let doc = render(&config).unwrap();
    assert!(doc.starts_with("#cloud-config\n"), "{doc}");
    peers::assert_valid_cloud_config(&doc);
    // Read back by this crate and by PyYAML.
    assert_eq!(parse(&doc, &["locale"]).unwrap(), config);
    let py = peers::pyyaml_load_all(std::slice::from_ref(&doc));
    assert_eq!(py[0], serde_json::to_value(&config).unwrap());
    // The binary file went as base64, text as text.
    assert_eq!(py[0]["write_files"][2]["encoding"], "b64");
    assert_eq!(py[0]["write_files"][0]["permissions"], "0644");
}

#[test]
fn debug_of_a_config_never_shows_secrets() {
    let shown = format!("{:?}", full());
    assert!(!shown.contains("s3cr3t-token"), "{shown}");
    assert!(
        !shown.contains("b3BlbnNzaC1rZXktdjEAAAAABG5vbmU"),
        "{shown}"
    );
    assert!(!shown.contains("$6$rounds"), "{shown}");
}

#[test]
fn empty_config_is_a_valid_document() {
    let doc = render(&CloudConfig::new()).unwrap();
    assert_eq!(doc.trim_end(), "#cloud-config\n{}");
    peers::assert_valid_cloud_config(&doc);
    assert_eq!(parse(&doc, &[]).unwrap(), CloudConfig::new());
}

fn invalid(config: CloudConfig, field: &str, words: &str) {
    let e = render(&config).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{e}");
    assert_eq!(e.field(), Some(field), "{e}");
    assert!(e.to_string().contains(words), "{e}");
}

#[test]
fn bad_write_files_are_refused_naming_the_field() {
    invalid(
        CloudConfig::new().with_file(WriteFile::new("etc/motd", "x")),
        "write_files[0].path",
        "relative",
    );
    invalid(
        CloudConfig::new()
            .with_file(WriteFile::new("/a", "x"))
            .with_file(WriteFile::new("", "x")),
        "write_files[1].path",
        "empty",
    );
    for bad in ["644x", "rw-r--r--", "99999", "0o8", "", "12"] {
        invalid(
            CloudConfig::new().with_file(WriteFile::new("/a", "x").permissions(bad)),
            "write_files[0].permissions",
            "octal",
        );
    }
    invalid(
        CloudConfig::new().with_file(WriteFile::new("/a", "x").owner("ghost")),
        "write_files[0].owner",
        "neither created in users nor a system account",
    );
    invalid(
        CloudConfig::new()
            .with_user(User::new("app"))
            .with_file(WriteFile::new("/a", "x").owner("app:app")),
        "write_files[0].defer",
        "set defer: true",
    );
    // A system account or a deferred file for a created user is fine.
    render(&CloudConfig::new().with_file(WriteFile::new("/a", "x").owner("www-data:www-data")))
        .unwrap();
}

#[test]
fn other_bad_values_are_refused_naming_the_field() {
    invalid(
        CloudConfig::new().with_hostname("web_1"),
        "hostname",
        "host name",
    );
    invalid(
        CloudConfig::new().with_user(User::new("Bad User")),
        "users[0].name",
        "account name",
    );
    invalid(
        CloudConfig::new()
            .with_user(User::new("a"))
            .with_user(User::new("a")),
        "users[1].name",
        "twice",
    );
    invalid(
        CloudConfig::new().with_user(User::admin("a", ["not a key".to_owned()])),
        "users[0].ssh_authorized_keys[0]",
        "OpenSSH public key",
    );
    invalid(CloudConfig::new().with_runcmd("  "), "runcmd[0]", "empty");
    invalid(
        CloudConfig::new().with_package("curl jq"),
        "packages[0]",
        "package name",
    );
    invalid(
        CloudConfig::new().with_extra("runcmd", serde_json::json!(["x"])),
        "extra.runcmd",
        "typed model covers",
    );
    invalid(
        CloudConfig {
            phone_home: Some(PhoneHome {
                url: "ftp://x".into(),
                post: PhoneHomePost::All,
                tries: None,
            }),
            ..CloudConfig::new()
        },
        "phone_home.url",
        "http",
    );
}

#[test]
fn parse_refuses_unmodeled_keys_unless_allowed() {
    let doc = "#cloud-config\nhostname: a\nsnap:\n  commands: [echo]\n";
    let e = parse(doc, &[]).unwrap_err();
    assert_eq!(e.field(), Some("snap"));
    assert!(e.to_string().contains("line 3"), "{e}");
    let ok = parse(doc, &["snap"]).unwrap();
    assert_eq!(ok.extra["snap"]["commands"][0], "echo");
    let e = parse("hostname: a\n", &[]).unwrap_err();
    assert!(e.to_string().contains("#cloud-config"), "{e}");
    let e = parse(
        "#cloud-config\nwrite_files:\n  - path: /a\n    mode: '0644'\n",
        &[],
    )
    .unwrap_err();
    assert!(e.to_string().contains("mode"), "{e}");
}

/// Strings chosen to break naive YAML writers, mixed with arbitrary text.
fn nasty() -> impl Strategy<Value = String> {
    let tokens = prop_oneof![
        Just("0644".to_owned()),
        Just("yes".to_owned()),
        Just("on".to_owned()),
        Just("No".to_owned()),
        Just("null".to_owned()),
        Just("~".to_owned()),
        Just("1e3".to_owned()),
        Just("0x1F".to_owned()),
        Just(".inf".to_owned()),
        Just("#cloud-config".to_owned()),
        Just("---".to_owned()),
        Just("...".to_owned()),
        Just("!!python/object:os.system".to_owned()),
        Just("!binary".to_owned()),
        Just("&anchor".to_owned()),
        Just("*alias".to_owned()),
        Just("key: value".to_owned()),
        Just("- item".to_owned()),
        Just("{a: b}".to_owned()),
        Just("[1, 2]".to_owned()),
        Just("'".to_owned()),
        Just("\"".to_owned()),
        Just("\\".to_owned()),
        Just("%TAG".to_owned()),
        Just("@".to_owned()),
        Just("`".to_owned()),
        Just("|".to_owned()),
        Just(">".to_owned()),
        Just(" ".to_owned()),
        Just("\t".to_owned()),
        Just("\n".to_owned()),
        Just("\r\n".to_owned()),
        Just("\r".to_owned()),
        Just("\u{85}".to_owned()),
        Just("\u{2028}".to_owned()),
        Just("\u{feff}".to_owned()),
        Just("\u{7f}".to_owned()),
        Just("\u{1b}".to_owned()),
        Just("\u{0}".to_owned()),
        Just("\u{9f}".to_owned()),
        Just("\u{fffe}".to_owned()),
        Just("é€😀".to_owned()),
        "[a-z0-9 ]{0,12}",
        "[a-z ]{60,200}",
        "\\PC{0,12}",
    ];
    proptest::collection::vec(tokens, 0..8).prop_map(|v| v.concat())
}

fn sample() -> impl Strategy<Value = CloudConfig> {
    (
        nasty(),
        nasty(),
        nasty(),
        nasty(),
        "[a-z0-9._-]{1,20}",
        nasty(),
    )
        .prop_map(|(content, cmd, msg, gecos, file, extra)| {
            let mut c = CloudConfig::new()
                .with_file(WriteFile::new(format!("/etc/{file}"), content.clone()))
                .with_file(WriteFile::new(
                    "/etc/bytes",
                    Content::Bytes(content.clone().into_bytes()),
                ));
            c.final_message = Some(msg);
            c.users.push(UserEntry::User(User {
                gecos: Some(gecos),
                ..User::new("ops")
            }));
            if !cmd.trim().is_empty() && !cmd.contains('\0') {
                c.runcmd.push(Command::Shell(cmd.clone()));
                c.bootcmd.push(Command::Argv(vec!["echo".into(), cmd]));
            }
            c.extra
                .insert("x_note".into(), serde_json::Value::String(extra));
            c
        })
}

#[test]
fn no_value_can_break_the_document_structure() {
    let mut runner = TestRunner::new(Config {
        cases: 96,
        ..Config::default()
    });
    let rendered: std::cell::RefCell<Vec<(CloudConfig, String)>> = Default::default();
    runner
        .run(&sample(), |config| {
            let doc = render(&config).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(doc.starts_with("#cloud-config\n"));
            let back =
                parse(&doc, &["x_note"]).map_err(|e| TestCaseError::fail(format!("{e}\n{doc}")))?;
            prop_assert_eq!(&back, &config, "{}", doc);
            rendered.borrow_mut().push((config, doc));
            Ok(())
        })
        .unwrap();
    let rendered = rendered.into_inner();
    // PyYAML, cloud-init's parser, reads each document to exactly the model's values.
    let docs: Vec<String> = rendered.iter().map(|(_, d)| d.clone()).collect();
    let parsed = peers::pyyaml_load_all(&docs);
    for ((config, doc), py) in rendered.iter().zip(&parsed) {
        assert_eq!(
            py,
            &serde_json::to_value(config).unwrap(),
            "PyYAML read a different value from:\n{doc}"
        );
    }
    // And cloud-init's schema validator (the code behind `cloud-init schema -c`) accepts
    // each one; a handful also go through the command itself.
    let script = r#"
import sys, os, tempfile
from cloudinit.config.schema import validate_cloudconfig_file, get_schema
schema = get_schema()
bad = []
for i, doc in enumerate(sys.stdin.buffer.read().split(b"\0")):
    with tempfile.NamedTemporaryFile(suffix=".yaml", delete=False) as f:
        f.write(doc)
    try:
        validate_cloudconfig_file(f.name, schema)
    except Exception as e:
        bad.append("%d: %s" % (i, e))
    finally:
        os.unlink(f.name)
print("\n".join(bad) if bad else "all valid")
"#;
    let out = peers::python(script, docs.join("\0").as_bytes());
    assert_eq!(out.trim(), "all valid", "{out}");
    for doc in docs.iter().take(4) {
        peers::assert_valid_cloud_config(doc);
    }
}

proptest! {
    #![proptest_config(Config { cases: 256, ..Config::default() })]

    /// Whatever a user hands in, reading it returns a value or an error, never a panic.
    #[test]
    fn parsing_any_text_never_panics(body in "(\\PC|\n| |:|-|\\[|\\]|\\{|\\}|'|\"|#|&|\\*|!|\\|){0,200}") {
        let _ = parse(&format!("#cloud-config\n{body}"), &["x"]);
    }

    /// Same for templates: syntax or render errors, never a panic.
    #[test]
    fn templates_never_panic(source in "(\\PC|\\{\\{|\\}\\}|\\{%|%\\}|\n| ){0,120}") {
        let mut t = bootstrap_cloudinit::Templates::new();
        if t.add("t.yaml", source).is_ok() {
            let _ = t.render("t.yaml", &serde_json::json!({"a": 1}));
        }
    }
}

#[test]
fn template_values_cannot_break_the_document_either() {
    let mut t = bootstrap_cloudinit::Templates::new();
    t.add(
        "doc.yaml",
        "#cloud-config\nfinal_message: {{ v }}\nwrite_files:\n  - path: /etc/{{ name | safe }}\n    content: {{ v }}\n",
    )
    .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 64,
        ..Config::default()
    });
    let docs = std::cell::RefCell::new(Vec::new());
    runner
        .run(&(nasty(), "[a-z]{1,12}"), |(v, name)| {
            let ctx = serde_json::json!({"v": v, "name": name});
            let text = t
                .render("doc.yaml", &ctx)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let c = t
                .render_cloud_config("doc.yaml", &ctx, &[])
                .map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
            prop_assert_eq!(c.final_message.as_deref(), Some(v.as_str()));
            prop_assert_eq!(c.write_files[0].content.bytes(), v.as_bytes());
            docs.borrow_mut().push((v, text));
            Ok(())
        })
        .unwrap();
    // PyYAML reads the same value from the template's own output.
    let docs = docs.into_inner();
    let texts: Vec<String> = docs.iter().map(|(_, t)| t.clone()).collect();
    for ((v, text), py) in docs.iter().zip(peers::pyyaml_load_all(&texts)) {
        assert_eq!(
            py["final_message"],
            serde_json::Value::String(v.clone()),
            "{text}"
        );
    }
    peers::assert_valid_cloud_config(&texts[0]);
}
