//! The machine-core conformance suite against a pool of sushy-tools fake systems:
//! directly (every case, the crash-point and replica cases included), through
//! Retrying(FaultInjecting), and with a proxy in front of sushy answering as a BMC that
//! refuses or throttles.
//!
//! sushy applies a reset 1-11 s after it accepts it, and a delete waits for the
//! power-on to land and then for the power-off, so one machine's life is about 12 s and
//! the suite's ~60 machines one after another would take over 10 minutes. The cases
//! therefore run at once, each in its own task, on a pool large enough for all of them
//! (the cases use names of their own), the crash-point and replica cases on an emulator
//! of their own. The crash and replica rounds are tuned down from the suite's defaults
//! (see [`fixture`]) for the same reason.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::future::BoxFuture;
use machine_core::conformance::{self, BackendFault, Clients, FaultHook, Fixture};
use machine_core::decorators::{FaultConfig, FaultInjecting, Retrying};
use machine_core::{MachineProvisioner, MachineSpec, RetryPolicy};

use common::flaky::{Answer, Flaky, Rule, redfish_error};
use common::{PoolShape, Sushy};

/// The size classes the pools' servers take in turn.
const SIZES: [&str; 2] = ["small", "Large-2x4096"];

/// Servers for every promise case at once, both owners' machines included (the
/// largest case holds six machines, most one or two).
const POOL: usize = 48;

/// Servers for the crash-point and replica cases at once (the replica case holds four
/// machines, a crash case at most two; the rest lets a name deleted and created again
/// land on another server).
const CRASH_POOL: usize = 16;

/// The suite's fixture for a pool of `pool` servers.
///
/// Crash rounds: 4 of each crash case (the suite's default is 8), each at another
/// quarter of the create's (delete's) await points; a round costs 15-30 s of sushy's
/// reset delays, and the delete case, the longest of all, sets the run's length.
/// Replica rounds: 2 of 3 replicas creating 4 names (default 3 rounds), each round
/// about 50 s since the suite deletes the four machines one after another.
fn fixture(pool: usize) -> Fixture {
    let mut fx = Fixture::new("redfish://127.0.0.1:1/no-such-system", |name| {
        MachineSpec::new(name.clone())
    });
    // sushy applies a reset 1-11 s after it is asked; delete waits for power off; an
    // ignored power-on is asked again after the pool's grace (15 s).
    fx.timeout = Duration::from_secs(90);
    fx.boot_timeout = Duration::from_secs(90);
    fx.poll = Duration::from_millis(500);
    fx.sizes = SIZES.iter().map(|s| (*s).to_owned()).collect();
    fx.capacity = Some(pool);
    fx.crash_rounds = 4;
    fx.replica_rounds = 2;
    fx
}

/// A sushy of `pool` fake systems, its claim directory, and the pool YAML of `owner`
/// with the BMC at `endpoint` (sushy's own when `None`).
struct Pool {
    sushy: Sushy,
    claims: tempfile::TempDir,
}

impl Pool {
    fn start(pool: usize) -> Pool {
        Pool {
            sushy: Sushy::start(pool),
            claims: tempfile::tempdir().unwrap(),
        }
    }

    fn yaml(&self, endpoint: Option<&str>, owner: &str) -> String {
        let shape = PoolShape {
            endpoint,
            sizes: &SIZES,
            grace: None,
        };
        common::pool_yaml_shaped(&self.sushy, self.claims.path(), owner, &shape)
    }
}

/// Clients over `yaml` (owner `conf`) and `other` (owner `conf-other`), each wrapped by
/// `wrap`; new instances of `conf` for the crash and replica cases.
async fn clients(
    yaml: String,
    other: String,
    wrap: fn(Arc<dyn MachineProvisioner>) -> Arc<dyn MachineProvisioner>,
) -> Clients {
    let fresh = {
        let yaml = yaml.clone();
        move || -> BoxFuture<'static, Arc<dyn MachineProvisioner>> {
            let yaml = yaml.clone();
            Box::pin(async move { wrap(common::provider_of(&yaml).await) })
        }
    };
    Clients::new(
        wrap(common::provider_of(&yaml).await),
        wrap(common::provider_of(&yaml).await),
        wrap(common::provider_of(&other).await),
    )
    .with_fresh(fresh)
}

/// Runs `cases` at once, each in a task of its own; panics naming every case that
/// failed, with its message, once all have ended.
macro_rules! run_at_once {
    ($clients:expr, $fixture:expr; $($case:ident),+ $(,)?) => {{
        let (clients, fixture) = (Arc::new($clients), Arc::new($fixture));
        let start = Instant::now();
        let tasks = vec![$((
            stringify!($case),
            tokio::spawn({
                let (c, fx) = (clients.clone(), fixture.clone());
                async move {
                    let start = Instant::now();
                    conformance::$case(&c, &fx).await;
                    start.elapsed()
                }
            }),
        )),+];
        let mut failed = Vec::new();
        for (case, task) in tasks {
            match task.await {
                Ok(took) => eprintln!("{case}: ok in {took:.1?}"),
                Err(e) => {
                    let message = e
                        .try_into_panic()
                        .ok()
                        .and_then(|p| {
                            p.downcast_ref::<String>()
                                .cloned()
                                .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        })
                        .unwrap_or_else(|| "cancelled".to_owned());
                    eprintln!("{case}: FAILED: {message}");
                    failed.push(format!("{case}: {message}"));
                }
            }
        }
        eprintln!("all cases ended in {:.1?}", start.elapsed());
        assert!(failed.is_empty(), "{} cases failed:\n{}", failed.len(), failed.join("\n"));
    }};
}

fn bare(p: Arc<dyn MachineProvisioner>) -> Arc<dyn MachineProvisioner> {
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_against_sushy() {
    let pool = Pool::start(POOL);
    let c = clients(pool.yaml(None, "conf"), pool.yaml(None, "conf-other"), bare).await;
    run_at_once!(c, fixture(POOL);
        unknown_id_is_not_found,
        create_get_find_list_delete,
        labels_round_trip,
        list_selects_by_labels,
        list_is_in_name_order,
        create_twice_gives_one_machine,
        concurrent_creates_make_one_machine,
        delete_twice_succeeds,
        new_client_adopts,
        owners_never_see_each_other,
        machines_reach_running,
        bootstrap_finished_is_idempotent,
        declared_power_operations_work,
        undeclared_operations_are_refused,
        user_data_round_trips,
        oversized_user_data_is_refused_before_any_call,
        undeclared_user_data_is_refused,
        cancelled_provision_is_found_by_deprovision,
        running_machines_say_how_to_reach_them,
        the_spec_is_honoured,
        names_are_exact,
        delete_is_seen,
        power_has_effect,
        bootstrap_finished_withdraws_user_data,
    );
}

/// The crash-point and replica cases, on a sushy of their own: beside the other cases
/// on one emulator, its sqlite state answered "database is locked" (HTTP 500) under a
/// loaded machine's CPU starvation. The longest test of the file: its name sorts it
/// right after the short faults test, so that the test harness (two at a time on two
/// cores) runs it beside the other two rather than after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_crash_points_and_replicas_against_sushy() {
    let pool = Pool::start(CRASH_POOL);
    let c = clients(pool.yaml(None, "conf"), pool.yaml(None, "conf-other"), bare).await;
    run_at_once!(c, fixture(CRASH_POOL);
        create_survives_a_crash_at_any_point,
        delete_survives_a_crash_at_any_point,
        replicas_creating_one_name_make_one_machine,
    );
}

fn retrying_fault_injecting(p: Arc<dyn MachineProvisioner>) -> Arc<dyn MachineProvisioner> {
    // A fixed seed per client, so that a failure can be replayed.
    static SEED: AtomicUsize = AtomicUsize::new(16);
    let faults = FaultConfig::default()
        .with_error_rate(0.1)
        .with_lost_response_rate(0.1)
        .with_seed(Some(SEED.fetch_add(1, Ordering::Relaxed) as u64));
    let faulty = FaultInjecting::new(p, faults).expect("fault config");
    Arc::new(Retrying::new(faulty, RetryPolicy::default()))
}

/// The promises kept through retries over injected errors and lost responses. The
/// crash-point and replica cases run in [`conformance_against_sushy`] only: the
/// decorators change nothing of what a crash leaves or how replicas meet in the claim
/// directory, and those cases are most of the suite's time against sushy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_retrying_fault_injecting() {
    let pool = Pool::start(40);
    let c = clients(
        pool.yaml(None, "conf"),
        pool.yaml(None, "conf-other"),
        retrying_fault_injecting,
    )
    .await;
    run_at_once!(c, fixture(40);
        unknown_id_is_not_found,
        create_get_find_list_delete,
        labels_round_trip,
        list_selects_by_labels,
        list_is_in_name_order,
        create_twice_gives_one_machine,
        concurrent_creates_make_one_machine,
        delete_twice_succeeds,
        new_client_adopts,
        owners_never_see_each_other,
        machines_reach_running,
        bootstrap_finished_is_idempotent,
        declared_power_operations_work,
        undeclared_operations_are_refused,
        user_data_round_trips,
        oversized_user_data_is_refused_before_any_call,
        undeclared_user_data_is_refused,
        cancelled_provision_is_found_by_deprovision,
        running_machines_say_how_to_reach_them,
        the_spec_is_honoured,
        names_are_exact,
        delete_is_seen,
        power_has_effect,
        bootstrap_finished_withdraws_user_data,
    );
}

/// A proxy in front of sushy that answers as a BMC refusing or throttling: every
/// request while a fault is injected. A BMC has no account quota, and a pool's lack of
/// room is the provider's own finding (no free server), not a BMC's answer: only
/// permission and throttling are on the wire.
struct BmcFaults {
    proxy: Arc<Flaky>,
    injected: AtomicUsize,
}

#[async_trait]
impl FaultHook for BmcFaults {
    fn supports(&self, fault: BackendFault) -> bool {
        matches!(fault, BackendFault::Permission | BackendFault::Throttle)
    }

    async fn inject(&self, fault: BackendFault) {
        self.proxy.clear();
        let n = self.injected.fetch_add(1, Ordering::SeqCst);
        let answer = match fault {
            // DMTF's Base registry message for an account lacking the privilege.
            BackendFault::Permission => Answer::Status(
                403,
                Vec::new(),
                redfish_error(
                    "InsufficientPrivilege",
                    "There are insufficient privileges for the account or credentials associated with the current session to perform the requested operation.",
                ),
            ),
            // 429 and 503 with Retry-After in turn: BMCs say "slow down" both ways.
            BackendFault::Throttle => Answer::Status(
                if n.is_multiple_of(2) { 429 } else { 503 },
                vec![("retry-after", "1".to_owned())],
                redfish_error(
                    "ServiceTemporarilyUnavailable",
                    "The service is temporarily unavailable. Retry in 1 seconds.",
                ),
            ),
            other => panic!("asked for {other}, which this hook does not support"),
        };
        self.proxy.push(Rule::all(answer));
    }

    async fn clear(&self) {
        self.proxy.clear();
    }

    fn answered(&self) -> u64 {
        self.proxy.answered()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_faults_come_back_with_their_kind() {
    let pool = Pool::start(4);
    let proxy = Arc::new(Flaky::forwarding(&pool.sushy.endpoint).await);
    let c = clients(
        pool.yaml(Some(&proxy.endpoint), "conf"),
        pool.yaml(Some(&proxy.endpoint), "conf-other"),
        bare,
    )
    .await;
    let mut fx = fixture(4);
    fx.faults = Some(Arc::new(BmcFaults {
        proxy: proxy.clone(),
        injected: AtomicUsize::new(0),
    }));
    run_at_once!(c, fx; backend_faults_come_back_with_their_kind);
}
