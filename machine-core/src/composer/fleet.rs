//! Many machines at once, with bounded concurrency and a result per machine.

use std::num::NonZeroUsize;

use futures_util::stream::{self, StreamExt};
use tokio_util::sync::CancellationToken;

use super::{Composer, Provisioned};
use crate::error::Result;
use crate::name::MachineName;
use crate::spec::{MachineSpec, check_unique_names};

/// The outcome for one machine of a fleet.
#[derive(Debug)]
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
        let mut results: Vec<(usize, FleetResult)> = stream::iter(specs.iter().enumerate())
            .map(|(i, spec)| async move {
                let outcome = self.provision(spec, cancel).await;
                (
                    i,
                    FleetResult {
                        name: spec.name.clone(),
                        outcome,
                    },
                )
            })
            .buffer_unordered(concurrency.get())
            .collect()
            .await;
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
        let mut results: Vec<(usize, (MachineName, Result<()>))> =
            stream::iter(names.iter().enumerate())
                .map(|(i, name)| async move {
                    (i, (name.clone(), self.deprovision(name, cancel).await))
                })
                .buffer_unordered(concurrency.get())
                .collect()
                .await;
        results.sort_unstable_by_key(|(i, _)| *i);
        results.into_iter().map(|(_, r)| r).collect()
    }
}
