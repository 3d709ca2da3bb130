//! The NoCloud seed ISO read back by a real ISO 9660 reader (xorriso).

use std::path::Path;
use std::process::Command;

use provider_baremetal::redfish::seed_iso::Seed;

fn xorriso(args: &[&str]) -> String {
    let out = Command::new("xorriso")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("running xorriso: {e}: run scripts/peers/60-sushy-tools.sh (installs xorriso)")
        });
    assert!(
        out.status.success(),
        "xorriso {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn extract(iso: &Path, out: &Path, joliet: bool) {
    let joliet = if joliet { "on" } else { "off" };
    xorriso(&[
        "-joliet",
        joliet,
        "-indev",
        iso.to_str().unwrap(),
        "-osirrox",
        "on",
        "-extract",
        "/",
        out.to_str().unwrap(),
    ]);
}

#[test]
fn xorriso_reads_the_label_and_the_exact_files() {
    let dir = tempfile::tempdir().unwrap();
    let user_data = format!(
        "#cloud-config\nhostname: web-1\nwrite_files:\n  - path: /etc/motd\n    content: |\n{}",
        "      a line of the motd\n".repeat(300)
    );
    let seed = Seed {
        user_data: user_data.as_bytes(),
        meta_data: b"instance-id: web-1\nlocal-hostname: web-1\n",
        network_config: Some(b"version: 2\nethernets: {}\n"),
    };
    let iso = dir.path().join("seed.iso");
    std::fs::write(&iso, seed.to_iso().unwrap()).unwrap();

    let info = xorriso(&["-indev", iso.to_str().unwrap(), "-pvd_info"]);
    assert!(info.contains("Volume Id    : cidata"), "{info}");

    let out = dir.path().join("joliet");
    extract(&iso, &out, true);
    assert_eq!(
        std::fs::read(out.join("user-data")).unwrap(),
        user_data.as_bytes()
    );
    assert_eq!(
        std::fs::read(out.join("meta-data")).unwrap(),
        b"instance-id: web-1\nlocal-hostname: web-1\n"
    );
    assert_eq!(
        std::fs::read(out.join("network-config")).unwrap(),
        b"version: 2\nethernets: {}\n"
    );
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["meta-data", "network-config", "user-data"]);

    // The primary tree alone (what a reader without Joliet sees) holds the same bytes.
    let out = dir.path().join("primary");
    extract(&iso, &out, false);
    let primary: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let user = primary
        .iter()
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .eq_ignore_ascii_case("user-data")
        })
        .unwrap_or_else(|| panic!("no user-data in the primary tree: {primary:?}"));
    assert_eq!(std::fs::read(user).unwrap(), user_data.as_bytes());
}
