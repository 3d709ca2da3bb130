//! Benchmark of bootstrap-cloudinit: merge three layers (base OS, platform, application)
//! of a realistic ~30 KiB cloud-config, render it, gzip it and base64 it, on one core;
//! then compare the compressed size with `gzip -9` on the same bytes, in the same run.
//!
//! `cargo run --release -p examples --example bench_cloudinit`

use std::io::Write;
use std::process::{Command as Process, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use bootstrap_cloudinit::{
    Bootstrap, CaCerts, CloudConfig, CloudConfigLayer, Ntp, User, WriteFile,
};
use machine_core::user_data::{GZIP_BEST_LEVEL, GZIP_FAST_LEVEL, gzip};
use machine_core::{ContentEncoding, SizeBasis, UserDataDelivery, UserDataFormat};

/// Deterministic pseudo-random base64 text, like certificate bodies.
fn pem(seed: u64, lines: usize) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut raw = Vec::with_capacity(lines * 48);
    for _ in 0..lines * 48 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        raw.push(x as u8);
    }
    let b64 = base64::engine::general_purpose::STANDARD.encode(raw);
    let body: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        body.join("\n")
    )
}

fn layers() -> anyhow::Result<Vec<CloudConfigLayer>> {
    let keys: Vec<String> = (0..6)
        .map(|i| {
            format!(
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{} ops{i}@example.org",
                &pem(i, 1)[28..71]
            )
        })
        .collect();
    let base = CloudConfig {
        timezone: Some("Etc/UTC".into()),
        ntp: Some(Ntp {
            servers: vec!["ntp1.example.org".into(), "ntp2.example.org".into()],
            ..Ntp::default()
        }),
        ca_certs: Some(CaCerts {
            remove_defaults: None,
            trusted: (0..3).map(|i| pem(100 + i, 20)).collect(),
        }),
        package_update: Some(true),
        packages: [
            "curl",
            "jq",
            "chrony",
            "auditd",
            "unattended-upgrades",
            "ca-certificates",
        ]
        .map(String::from)
        .to_vec(),
        ..CloudConfig::new()
            .with_hostname("node-1")
            .with_user(User::admin("ops", keys.clone()))
            .with_file(WriteFile::new(
                "/etc/audit/rules.d/base.rules",
                (0..120)
                    .map(|i| format!("-w /etc/config{i} -p wa -k config\n"))
                    .collect::<String>(),
            ))
    };
    let kubelet: String = (0..260)
        .map(|i| format!("  setting{i}: \"value-{i}-{}\"\n", i * 7919 % 1000))
        .collect();
    let platform = CloudConfig::new()
        .with_file(WriteFile::new("/etc/kubernetes/kubelet.yaml", format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{kubelet}")).permissions("0600"))
        .with_file(WriteFile::new("/etc/kubernetes/pki/ca.crt", pem(7, 18)))
        .with_file(WriteFile::new(
            "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf",
            "[Service]\nEnvironment=\"KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf\"\nExecStart=\nExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS\n",
        ))
        .with_runcmd("kubeadm join --config /etc/kubernetes/join.yaml")
        .with_runcmd("systemctl enable --now kubelet");
    let app_script: String = (0..90)
        .map(|i| {
            format!(
                "install -d -m 0750 /srv/app/data{i} && echo 'ready {i}' > /srv/app/data{i}/state\n"
            )
        })
        .collect();
    let app = CloudConfig::new()
        .with_user(User::new("app"))
        .with_file(WriteFile::new("/srv/app/setup.sh", app_script).permissions("0755"))
        .with_file(
            WriteFile::new(
                "/srv/app/app.env",
                (0..40)
                    .map(|i| format!("APP_OPTION_{i}=value{i}\n"))
                    .collect::<String>(),
            )
            .owner("app:app")
            .permissions("0640")
            .deferred(),
        )
        .with_runcmd("/srv/app/setup.sh");
    Ok(vec![
        CloudConfigLayer::new("base", base)?,
        CloudConfigLayer::new("platform", platform)?,
        CloudConfigLayer::new("app", app)?,
    ])
}

/// CPU time this thread has run, from the scheduler (ns precision), so that the figure
/// is per core-second even when other work shares the machine.
fn thread_cpu() -> Duration {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let ns: u64 = text
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Duration::from_nanos(ns)
}

/// Runs `f` for `budget` of wall time; returns (calls per wall second, calls per CPU second).
fn measure(
    budget: Duration,
    mut f: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<(f64, f64)> {
    let (start, cpu0) = (Instant::now(), thread_cpu());
    let mut n = 0u64;
    while start.elapsed() < budget {
        f()?;
        n += 1;
    }
    let (wall, cpu) = (start.elapsed(), thread_cpu() - cpu0);
    Ok((
        n as f64 / wall.as_secs_f64(),
        n as f64 / cpu.as_secs_f64().max(1e-9),
    ))
}

fn main() -> anyhow::Result<()> {
    let layers = layers()?;
    let sample = Bootstrap::new("node", layers.clone())?.render_merged()?;
    println!(
        "bootstrap-cloudinit bench: 3 layers, merged cloud-config of {} bytes",
        sample.len()
    );
    // EC2's budget: 16 KiB raw, gzip accepted; the provider sends base64.
    let delivery = UserDataDelivery::new(
        16 * 1024,
        SizeBasis::Raw,
        vec![UserDataFormat::CloudConfig, UserDataFormat::Mime],
    )
    .with_gzip(true);
    let mut gz_len = 0;
    let mut b64_len = 0;
    let mut full = || -> anyhow::Result<()> {
        let built = Bootstrap::new("node", layers.clone())?.build(&delivery)?;
        anyhow::ensure!(built.user_data.encoding == ContentEncoding::Gzip);
        let b64 = base64::engine::general_purpose::STANDARD.encode(&built.user_data.bytes);
        gz_len = built.user_data.bytes.len();
        b64_len = std::hint::black_box(b64).len();
        Ok(())
    };
    measure(Duration::from_millis(300), &mut full)?;
    let (wall, cpu) = measure(Duration::from_secs(3), &mut full)?;
    let (r_wall, r_cpu) = measure(Duration::from_secs(1), || {
        std::hint::black_box(Bootstrap::new("node", layers.clone())?.render_merged()?);
        Ok(())
    })?;
    let (n_wall, n_cpu) = measure(Duration::from_secs(1), || {
        std::hint::black_box(Bootstrap::new("node", layers.clone())?);
        Ok(())
    })?;
    println!("  merge (Bootstrap::new) only: {n_cpu:.0} per CPU-second ({n_wall:.0} wall)");
    let (g_wall, g_cpu) = measure(Duration::from_secs(1), || {
        std::hint::black_box(gzip(sample.as_bytes(), GZIP_FAST_LEVEL));
        Ok(())
    })?;
    let (g9_wall, g9_cpu) = measure(Duration::from_secs(1), || {
        std::hint::black_box(gzip(sample.as_bytes(), GZIP_BEST_LEVEL));
        Ok(())
    })?;
    let level9 = gzip(sample.as_bytes(), GZIP_BEST_LEVEL).len();

    // The peer: gzip -9 on the same bytes, in the same run.
    let mut child = Process::new("gzip")
        .args(["-9", "-c", "-n"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("gzip is missing ({e}): apt-get install gzip"))?;
    child.stdin.take().unwrap().write_all(sample.as_bytes())?;
    let peer = child.wait_with_output()?;
    anyhow::ensure!(peer.status.success(), "gzip -9 failed");
    let peer_len = peer.stdout.len();

    println!(
        "merge 3 layers + render + gzip + base64: {cpu:.0} per CPU-second on one thread ({wall:.0} per wall-second)"
    );
    println!("  merge + render only: {r_cpu:.0} per CPU-second ({r_wall:.0} wall)");
    println!(
        "  gzip level {} (zlib-rs): {g_cpu:.0} per CPU-second ({g_wall:.0} wall); level 9: {g9_cpu:.0} per CPU-second ({g9_wall:.0} wall), {level9} bytes",
        GZIP_FAST_LEVEL
    );
    println!(
        "  compressed: {gz_len} bytes (ours) vs {peer_len} bytes (gzip -9), ratio {:.4}; base64 {b64_len} bytes",
        gz_len as f64 / peer_len as f64
    );
    // Size and speed per deflate level, to show where the chosen level sits.
    for level in 1..=9 {
        let gz = |b: &[u8]| {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
            e.write_all(b).unwrap();
            e.finish().unwrap()
        };
        let len = gz(sample.as_bytes()).len();
        let (_, c) = measure(Duration::from_millis(300), || {
            std::hint::black_box(gz(sample.as_bytes()));
            Ok(())
        })?;
        println!(
            "  level {level}: {len} bytes ({:.4} of gzip -9), {c:.0} per CPU-second",
            len as f64 / peer_len as f64
        );
    }
    Ok(())
}
