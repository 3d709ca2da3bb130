//! What the provider benchmarks measure the same way: this process's CPU, another
//! process's CPU, and their numeric flags. Included with `#[path]` by
//! `provider-*/examples/bench_*.rs`: a shared crate for it would be the examples crate,
//! which depends on the providers.

use anyhow::{Context, Result};
use nix::sys::resource::{UsageWho, getrusage};
use nix::unistd::{SysconfVar, sysconf};

/// CPU seconds (user + system) this process has used so far.
pub fn cpu_seconds() -> Result<f64> {
    let u = getrusage(UsageWho::RUSAGE_SELF)?;
    let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
    Ok(t(u.user_time()) + t(u.system_time()))
}

/// CPU seconds (user + system) process `pid` has used so far, from /proc: a peer's side
/// of the same calls.
pub fn process_cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name in parentheses: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("unexpected /proc stat format")?
        .1
        .split_whitespace()
        .collect();
    let ticks = |i: usize| -> Result<f64> {
        Ok(fields.get(i).context("short /proc stat")?.parse::<u64>()? as f64)
    };
    let hz = sysconf(SysconfVar::CLK_TCK)?.context("no CLK_TCK")? as f64;
    Ok((ticks(11)? + ticks(12)?) / hz)
}

/// The number after flag `name` on the command line, or `default` without the flag.
pub fn arg(name: &str, default: usize) -> Result<usize> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .with_context(|| format!("{name} needs a number"))?
            .parse()
            .with_context(|| format!("{name} needs a number")),
        None => Ok(default),
    }
}
