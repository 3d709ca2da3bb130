//! Layers merged here and as a MIME multipart, checked against the real cloud-init:
//! Python's `email` parses the multipart, cloud-init's own part handler merges it, and
//! the result must equal this crate's merged document.

mod peers;

use bootstrap_cloudinit::{
    Bootstrap, CloudConfig, CloudConfigLayer, MERGE_TYPE, Ntp, Output, User, WriteFile,
};
use machine_core::{ContentEncoding, SizeBasis, UserDataDelivery, UserDataFormat};

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHx4bmxvZ2luLWtleS1mb3ItdGVzdHMtb25seQ ops@laptop";

fn layers() -> Vec<CloudConfigLayer> {
    let base = CloudConfigLayer::new(
        "base",
        CloudConfig {
            timezone: Some("Etc/UTC".into()),
            ntp: Some(Ntp {
                servers: vec!["ntp1.example.org".into()],
                ..Ntp::default()
            }),
            ..CloudConfig::new()
                .with_user(User::admin("ops", [KEY.to_owned()]))
                .with_package("curl")
                .with_file(WriteFile::new("/etc/motd", "base\n"))
        },
    )
    .unwrap()
    .with_boothook(
        "early.sh",
        "#cloud-boothook\n#!/bin/sh\necho early > /run/early\n",
    )
    .unwrap();
    let platform = CloudConfigLayer::new(
        "platform",
        CloudConfig {
            ntp: Some(Ntp {
                servers: vec!["ntp2.example.org".into()],
                ..Ntp::default()
            }),
            ..CloudConfig::new()
                .with_package("jq")
                .with_runcmd("echo platform")
        },
    )
    .unwrap()
    .with_script("agent.sh", "#!/bin/sh\necho agent\n")
    .unwrap();
    let app = CloudConfigLayer::with_system_users(
        "app",
        CloudConfig::new()
            .with_user(User::new("app"))
            .with_file(
                WriteFile::new("/srv/app/config", "port: 8080\n")
                    .owner("app:app")
                    .permissions("0640")
                    .deferred(),
            )
            .with_runcmd("echo app"),
        vec![],
    )
    .unwrap()
    .with_jinja2(
        "motd.j2",
        "## template: jinja\n#cloud-config\nfinal_message: \"up on {{ v1.local_hostname }}\"\n",
    )
    .unwrap();
    vec![base, platform, app]
}

const EMAIL_PARTS: &str = r#"
import sys, json, email
msg = email.message_from_bytes(sys.stdin.buffer.read())
out = []
for part in msg.walk():
    if part.get_content_maintype() == "multipart":
        continue
    out.append({
        "type": part.get_content_type(),
        "filename": part.get_filename(),
        "merge": part.get("Merge-Type"),
        "payload": part.get_payload(decode=True).decode("utf-8"),
    })
print(json.dumps({"root": msg.get_content_type(), "parts": out}))
"#;

const CLOUD_INIT_MERGE: &str = r#"
import sys, json, tempfile
from cloudinit import helpers, handlers, user_data as ud, util
from cloudinit.handlers.cloud_config import CloudConfigPartHandler
d = tempfile.mkdtemp()
paths = helpers.Paths({"cloud_dir": d, "run_dir": d})
paths.get_ipath = lambda name=None: d + "/" + (name or "instance")
msg = ud.UserDataProcessor(paths).process(sys.stdin.buffer.read())
h = CloudConfigPartHandler(paths)
h.handle_part(None, handlers.CONTENT_START, None, None, None, None)
for part in msg.walk():
    if part.get_content_type() == "text/cloud-config":
        h.handle_part(None, "text/cloud-config", part.get_filename(),
                      part.get_payload(decode=True).decode(), 1, dict(part.items()))
h.handle_part(None, handlers.CONTENT_END, None, None, None, None)
print(json.dumps(util.load_yaml(open(h.cloud_fn).read())))
"#;

fn delivery(max_bytes: usize, gzip: bool) -> UserDataDelivery {
    UserDataDelivery::new(
        max_bytes,
        SizeBasis::Base64,
        vec![UserDataFormat::CloudConfig, UserDataFormat::Mime],
    )
    .with_gzip(gzip)
}

#[test]
fn multipart_parts_read_back_by_python_email_as_written() {
    let b = Bootstrap::new("web", layers())
        .unwrap()
        .output(Output::Multipart);
    let parts = b.parts().unwrap();
    let built = b.build(&delivery(64 * 1024, true)).unwrap();
    assert_eq!(built.user_data.format, UserDataFormat::Mime);
    let got: serde_json::Value = serde_json::from_str(&peers::python(
        EMAIL_PARTS,
        &built.user_data.decoded().unwrap(),
    ))
    .unwrap();
    assert_eq!(got["root"], "multipart/mixed");
    let got = got["parts"].as_array().unwrap();
    assert_eq!(got.len(), parts.len());
    for (i, (g, p)) in got.iter().zip(&parts).enumerate() {
        assert_eq!(g["type"], p.format.mime_type().unwrap(), "{g}");
        // The assembly prefixes the index so that cloud-init runs scripts in order.
        assert_eq!(g["filename"], format!("{i:02}-{}", p.filename));
        assert_eq!(g["payload"], String::from_utf8(p.content.clone()).unwrap());
        if p.format == UserDataFormat::CloudConfig {
            assert_eq!(g["merge"], MERGE_TYPE);
            peers::assert_valid_cloud_config(g["payload"].as_str().unwrap());
        }
    }
    let types: Vec<&str> = got.iter().map(|g| g["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "text/cloud-config",
            "text/cloud-boothook",
            "text/cloud-config",
            "text/x-shellscript",
            "text/cloud-config",
            "text/jinja2"
        ]
    );
}

#[test]
fn cloud_init_merges_the_multipart_into_exactly_our_merged_document() {
    let multi = Bootstrap::new("web", layers())
        .unwrap()
        .output(Output::Multipart);
    let built = multi.build(&delivery(64 * 1024, true)).unwrap();
    let merged_by_cloud_init: serde_json::Value = serde_json::from_str(&peers::python(
        CLOUD_INIT_MERGE,
        &built.user_data.decoded().unwrap(),
    ))
    .unwrap();
    let ours = multi.render_merged().unwrap();
    peers::assert_valid_cloud_config(&ours);
    let ours_read = peers::pyyaml_load_all(&[ours]);
    assert_eq!(merged_by_cloud_init, ours_read[0]);
    assert_eq!(
        merged_by_cloud_init["packages"],
        serde_json::json!(["curl", "jq"])
    );
    assert_eq!(
        merged_by_cloud_init["ntp"]["servers"],
        serde_json::json!(["ntp1.example.org", "ntp2.example.org"])
    );
}

#[test]
fn merged_output_is_one_cloud_config_plus_the_other_parts() {
    let merged = Bootstrap::new("web", layers()).unwrap();
    let parts = merged.parts().unwrap();
    assert_eq!(parts[0].format, UserDataFormat::CloudConfig);
    assert_eq!(
        parts
            .iter()
            .filter(|p| p.format == UserDataFormat::CloudConfig)
            .count(),
        1
    );
    // Without other parts, the user data is a plain #cloud-config document.
    let plain = Bootstrap::new(
        "web",
        vec![
            CloudConfigLayer::new("a", CloudConfig::new().with_package("curl")).unwrap(),
            CloudConfigLayer::new("b", CloudConfig::new().with_package("jq")).unwrap(),
        ],
    )
    .unwrap();
    let built = plain.build(&delivery(16 * 1024, true)).unwrap();
    assert_eq!(built.user_data.format, UserDataFormat::CloudConfig);
    let text = String::from_utf8(built.user_data.decoded().unwrap()).unwrap();
    peers::assert_valid_cloud_config(&text);
}

#[test]
fn cross_layer_conflicts_and_owners_are_refused_before_any_call() {
    let e = Bootstrap::new(
        "web",
        vec![
            CloudConfigLayer::new("base", CloudConfig::new().with_hostname("a")).unwrap(),
            CloudConfigLayer::new("app", CloudConfig::new().with_hostname("b")).unwrap(),
        ],
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("hostname"));
    // A file owned by a user another layer creates is fine once merged (deferred).
    let owner_layer = CloudConfigLayer::with_system_users(
        "files",
        CloudConfig::new().with_file(WriteFile::new("/a", "x").owner("svc").deferred()),
        vec!["svc".into()],
    )
    .unwrap();
    let users =
        CloudConfigLayer::new("users", CloudConfig::new().with_user(User::new("svc"))).unwrap();
    Bootstrap::new("web", vec![users, owner_layer.clone()]).unwrap();
    // The same user created by two layers would be created twice.
    let twice =
        CloudConfigLayer::new("more", CloudConfig::new().with_user(User::new("ops"))).unwrap();
    let e = Bootstrap::new("web", vec![layers().remove(0), twice]).unwrap_err();
    assert_eq!(e.field(), Some("users[1].name"));
}

#[test]
fn budgets_gzip_when_needed_and_name_sizes_and_largest_layers() {
    let noise: String = (0..30_000)
        .map(|i| char::from(b'a' + ((i * 7919 + i / 13) % 26) as u8))
        .collect();
    let big = CloudConfigLayer::new(
        "bulky",
        CloudConfig::new().with_file(WriteFile::new("/srv/blob", noise)),
    )
    .unwrap();
    let b = Bootstrap::new("web", vec![layers().remove(0), big]).unwrap();
    // Fits only compressed: gzip is chosen.
    let built = b.build(&delivery(32 * 1024, true)).unwrap();
    assert_eq!(built.user_data.encoding, ContentEncoding::Gzip);
    let r = &built.report;
    assert!(r.counted <= 32 * 1024, "{r}");
    assert_eq!(r.layers[1].0, "bulky");
    assert!(r.layers[1].1 > 30_000, "{r}");
    let shown = r.to_string();
    assert!(shown.contains("layer bulky"), "{shown}");
    // Without gzip it does not fit: the error names sizes and the largest part's layer.
    let e = b.build(&delivery(16 * 1024, false)).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("16384"), "{msg}");
    assert!(msg.contains("web.cloud-config.yaml"), "{msg}");
    let e = Bootstrap::new(
        "web",
        vec![
            CloudConfigLayer::new(
                "bulky",
                CloudConfig::new().with_file(WriteFile::new("/srv/blob", vec![7u8; 10])),
            )
            .unwrap(),
        ],
    )
    .unwrap()
    .output(Output::Multipart)
    .build(&delivery(4, false))
    .unwrap_err();
    assert!(e.to_string().contains("bulky.cloud-config.yaml"), "{e}");
}

#[test]
fn multipart_matches_cloud_init_make_mime_part_for_part() {
    let b = Bootstrap::new("web", layers())
        .unwrap()
        .output(Output::Multipart);
    let parts = b.parts().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["devel".to_owned(), "make-mime".to_owned()];
    for (i, p) in parts.iter().enumerate() {
        // Named as the assembly names them (index prefix, for cloud-init's script order).
        let name = format!("{i:02}-{}", p.filename);
        std::fs::write(dir.path().join(&name), &p.content).unwrap();
        let subtype = p.format.mime_type().unwrap().trim_start_matches("text/");
        args.push("-a".into());
        args.push(format!("{name}:{subtype}"));
    }
    let out = std::process::Command::new("/usr/bin/cloud-init")
        .args(&args)
        .current_dir(dir.path())
        .output()
        .expect("cloud-init is missing: run scripts/peers/20-cloud-init.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: serde_json::Value =
        serde_json::from_str(&peers::python(EMAIL_PARTS, &out.stdout)).unwrap();
    let ours_ud = b.build(&delivery(64 * 1024, true)).unwrap().user_data;
    let ours: serde_json::Value =
        serde_json::from_str(&peers::python(EMAIL_PARTS, &ours_ud.decoded().unwrap())).unwrap();
    assert_eq!(ours["root"], theirs["root"]);
    let (ours, theirs) = (
        ours["parts"].as_array().unwrap(),
        theirs["parts"].as_array().unwrap(),
    );
    assert_eq!(ours.len(), theirs.len());
    for (o, t) in ours.iter().zip(theirs) {
        assert_eq!(o["type"], t["type"]);
        assert_eq!(o["filename"], t["filename"]);
        assert_eq!(o["payload"], t["payload"]);
    }
}
