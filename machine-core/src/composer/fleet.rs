//! Many machines at once, with bounded concurrency and a result per machine.

use std::num::NonZeroUsize;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio_util::sync::CancellationToken;

use super::{Composer, Provisioned};
use crate::error::Result;
use crate::name::MachineName;
use crate::spec::{MachineSpec, check_unique_names};

/// The outcome for one machine of a fleet.
#[derive(Debug)]
#[non_exhaustive]
pub struct FleetResult {
    /// The machine's name.
    pub name: MachineName,
    /// What became of it.
    pub outcome: Result<Provisioned>,
}

impl Composer {
    /// Provisions every spec, at most `concurrency` at a time, and returns one result per
    /// spec in the order given. One machine's failure does not stop the others.
    /// Duplicate names and invalid specs are refused before anything starts, naming
    /// `machines[i]`.
    pub async fn provision_fleet(
        &self,
        specs: &[MachineSpec],
        concurrency: NonZeroUsize,
        cancel: &CancellationToken,
    ) -> Result<Vec<FleetResult>> {
        check_unique_names(specs)?;
        // A plain loop over FuturesUnordered rather than a stream combinator with a
        // closure: rustc cannot prove such closures general over lifetimes, which would
        // make the fleet future impossible to spawn. Futures are made only as slots free
        // up, so memory follows the concurrency, not the fleet size.
        let mut todo = specs.iter().enumerate();
        let mut running = FuturesUnordered::new();
        let mut results = Vec::with_capacity(specs.len());
        loop {
            while running.len() < concurrency.get() {
                let Some((i, spec)) = todo.next() else { break };
                running.push(self.fleet_member(i, spec, cancel));
            }
            match running.next().await {
                Some(done) => results.push(done),
                None => break,
            }
        }
        results.sort_unstable_by_key(|(i, _)| *i);
        Ok(results.into_iter().map(|(_, r)| r).collect())
    }

    /// Deprovisions every named machine, at most `concurrency` at a time; one result
    /// per name, in order.
    pub async fn deprovision_fleet(
        &self,
        names: &[MachineName],
        concurrency: NonZeroUsize,
        cancel: &CancellationToken,
    ) -> Vec<(MachineName, Result<()>)> {
        let mut todo = names.iter().enumerate();
        let mut running = FuturesUnordered::new();
        let mut results = Vec::with_capacity(names.len());
        loop {
            while running.len() < concurrency.get() {
                let Some((i, name)) = todo.next() else { break };
                running.push(self.fleet_deletion(i, name, cancel));
            }
            match running.next().await {
                Some(done) => results.push(done),
                None => break,
            }
        }
        results.sort_unstable_by_key(|(i, _)| *i);
        results.into_iter().map(|(_, r)| r).collect()
    }

    async fn fleet_member(
        &self,
        i: usize,
        spec: &MachineSpec,
        cancel: &CancellationToken,
    ) -> (usize, FleetResult) {
        let outcome = self.provision(spec, cancel).await;
        let name = spec.name.clone();
        (i, FleetResult { name, outcome })
    }

    async fn fleet_deletion(
        &self,
        i: usize,
        name: &MachineName,
        cancel: &CancellationToken,
    ) -> (usize, (MachineName, Result<()>)) {
        (i, (name.clone(), self.deprovision(name, cancel).await))
    }
}
