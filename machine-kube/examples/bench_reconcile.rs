//! How fast the reconciler takes Machine objects to Ready: N objects on the simulator,
//! through kube's real client and the tests' stand-in API server in the same process.
//! The reconciler runs on one thread (one core); the server runs on the same thread, or
//! with `--server-thread` on a thread of its own, so the reconciler's own share shows.
//! Prints objects per second, requests per object and peak memory.
//!
//! ```text
//! cargo run --release -p machine-kube --example bench_reconcile -- 10000 [--server-thread]
//! ```

// The tests' stand-in API server.
#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use machine_core::sim::{SimCloud, SimConfig, SimProvider};
use machine_core::{Composer, Error};
use machine_kube::{Context, MachineObject, Registry, reconcile};
use serde_json::json;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args().nth(1).map_or(Ok(10_000), |a| a.parse())?;
    let own_thread = std::env::args().any(|a| a == "--server-thread");
    let api = common::FakeApi::default();
    let client = if own_thread {
        common::client(api.start_on_own_thread())
    } else {
        api.start().await
    };
    let config = SimConfig::default()
        .with_boot_latency(Duration::ZERO)
        .with_boot_jitter(Duration::ZERO);
    let sim = Arc::new(SimProvider::new(SimCloud::new(), config)?);
    let registry = Registry::new(move |provider, _| {
        if provider != "sim" {
            return Err(Error::invalid_spec("spec.provider", "only sim"));
        }
        Composer::builder(sim.clone()).build()
    });
    let ctx = Arc::new(Context::new(client, registry));
    for i in 0..n {
        api.insert(json!({
            "apiVersion": "machine-provisioning.dev/v1alpha1",
            "kind": "Machine",
            "metadata": { "name": format!("m-{i:05}"), "namespace": "default" },
            "spec": { "provider": "sim", "machine": { "labels": { "bench": "yes" } } }
        }));
    }
    // The creates above are the server's writes, not the reconciler's.
    let created = api.writes.load(Ordering::SeqCst);
    let started = Instant::now();
    let reconciles = futures_util::stream::iter(0..n)
        .map(|i| {
            let (api, ctx) = (api.clone(), ctx.clone());
            async move {
                let name = format!("m-{i:05}");
                let mut calls = 0u32;
                loop {
                    let stored = api.get("default", &name).expect("object");
                    if stored["status"]["machine"]["phase"] == "Ready" {
                        return calls;
                    }
                    let obj: MachineObject = serde_json::from_value(stored).expect("object");
                    calls += 1;
                    if let Err(e) = reconcile(Arc::new(obj), ctx.clone()).await {
                        panic!("{name}: {e}");
                    }
                    assert!(calls < 20, "{name} is not Ready after 20 reconciles");
                }
            }
        })
        .buffer_unordered(64)
        .fold(0u64, |sum, calls| async move { sum + u64::from(calls) })
        .await;
    let wall = started.elapsed();
    let requests = api.writes.load(Ordering::SeqCst) - created;
    println!("objects:            {n}");
    println!(
        "server:             {}",
        if own_thread {
            "own thread"
        } else {
            "same thread"
        }
    );
    println!("wall:               {:.2} s", wall.as_secs_f64());
    println!("objects/s:          {:.0}", n as f64 / wall.as_secs_f64());
    println!("reconciles/object:  {:.2}", reconciles as f64 / n as f64);
    println!("API writes/object:  {:.2}", requests as f64 / n as f64);
    println!("peak RSS:           {} MiB", peak_rss_kib() / 1024);
    Ok(())
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
