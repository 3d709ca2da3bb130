//! Replicas: several instances of the provider, one owner, creating the same names at
//! the same moment, as the replicas of a controller do when two pick up one object.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use crate::error::{ErrorKind, Result};
use crate::machine::{Machine, ProviderId};
use crate::name::MachineName;
use crate::provisioner::MachineProvisioner;
use crate::spec::MachineSpec;

use super::fixture::{Clients, Fixture};

/// How often a replica retries a retryable error of its create, as a controller would
/// requeue it.
const RETRIES: u32 = 5;

/// Creates `spec` on `p`, retrying retryable errors a few times.
async fn create_as_a_controller(p: &dyn MachineProvisioner, spec: &MachineSpec) -> Result<Machine> {
    let mut tries = 0;
    loop {
        match p.create(spec, None).await {
            Err(e) if e.is_retryable() && tries < RETRIES => {
                tries += 1;
                tokio::time::sleep(e.retry_after().unwrap_or(Duration::from_millis(200))).await;
            }
            other => return other,
        }
    }
}

/// [`Fixture::replicas`] new instances of the provider (one owner) create the same
/// [`Fixture::replica_names`] names at the same moment, over [`Fixture::replica_rounds`]
/// rounds: every create succeeds (retryable errors retried a few times; never quota,
/// capacity or conflict while the backend has room), every creator of a name is told the
/// same provider ID, one machine per name stands, and deleting them leaves nothing.
pub async fn replicas_creating_one_name_make_one_machine(c: &Clients, fx: &Fixture) {
    let case = "replicas_creating_one_name_make_one_machine";
    let names = fx
        .replica_names
        .min(fx.capacity.unwrap_or(usize::MAX))
        .max(1);
    for round in 0..fx.replica_rounds {
        let mut replicas: Vec<Arc<dyn MachineProvisioner>> = Vec::new();
        for _ in 0..fx.replicas.max(2) {
            replicas.push(c.new_instance(case).await);
        }
        let specs: Vec<_> = (0..names)
            .map(|i| fx.spec(&format!("replica-{round}-{i}")))
            .collect();
        let creates = replicas.iter().flat_map(|r| {
            specs.iter().map(move |spec| async move {
                (
                    r.to_string(),
                    spec.name.clone(),
                    create_as_a_controller(r.as_ref(), spec).await,
                )
            })
        });
        let results = join_all(creates).await;

        let p = replicas[0].as_ref();
        let mut told: BTreeMap<MachineName, Vec<ProviderId>> = BTreeMap::new();
        let mut failures = Vec::new();
        for (who, name, r) in results {
            match r {
                Ok(m) => told.entry(name).or_default().push(m.provider_id),
                Err(e) => failures.push((who, name, e)),
            }
        }
        // What stands, read before any assertion so that a failure still cleans up.
        let mut standing: BTreeMap<MachineName, Vec<Machine>> = BTreeMap::new();
        for (i, spec) in specs.iter().enumerate() {
            let listed = p
                .list(&fx.case_selector(&format!("replica-{round}-{i}")))
                .await
                .unwrap_or_else(|e| panic!("{p}: list failed: {e}"));
            for m in listed.into_iter().filter(|m| !m.phase.is_deleting()) {
                standing.entry(spec.name.clone()).or_default().push(m);
            }
        }
        for m in standing.values().flatten() {
            fx.cleanup(p, m).await;
        }

        if let Some((who, name, e)) = failures.first() {
            let limit = matches!(
                e.kind(),
                ErrorKind::QuotaExceeded | ErrorKind::InsufficientCapacity | ErrorKind::Conflict
            );
            panic!(
                "{who}: {} of {} replica creates failed{}; the first, of {name}: {e}",
                failures.len(),
                replicas.len() * names,
                if limit {
                    " with a limit or conflict while the backend had room (duplicate claims?)"
                } else {
                    ""
                }
            );
        }
        for spec in &specs {
            let ids = told.get(&spec.name).cloned().unwrap_or_default();
            assert!(
                ids.windows(2).all(|w| w[0] == w[1]),
                "{p}: replicas creating {} at once were told different machines: {ids:?}",
                spec.name
            );
            let count = standing.get(&spec.name).map_or(0, Vec::len);
            assert_eq!(
                count, 1,
                "{p}: replicas creating {} at once left {count} machines standing",
                spec.name
            );
        }
        for (i, _) in specs.iter().enumerate() {
            let left = p
                .list(&fx.case_selector(&format!("replica-{round}-{i}")))
                .await
                .unwrap_or_else(|e| panic!("{p}: list failed: {e}"));
            assert!(
                left.is_empty(),
                "{p}: teardown of the replicas' machines left {:?}",
                left.iter().map(|m| &m.provider_id).collect::<Vec<_>>()
            );
        }
    }
}
