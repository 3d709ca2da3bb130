//! A shared view of every instance of one owner: one paginated DescribeInstances by the
//! owner tag serves the name lookups of many machines at once.
//!
//! Tag-filtered DescribeInstances is EC2's most expensive and most throttled call, and
//! a fleet used to make one per machine for every create, find, race check and delete.
//! Here a caller asks for a view *taken after* a given instant (normally when its own
//! operation began, so that it never acts on state older than its call), and callers
//! that ask while a listing is under way wait and share the next one: under
//! concurrency one listing serves every machine that asked in the meantime, and a lone
//! caller pays the single call it paid before.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use aws_sdk_ec2::types::Instance;
use machine_core::Result;

/// What one listing returned.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// When the listing started: it shows everything done before this instant.
    pub started: Instant,
    /// Every instance with the owner's tags, in any state EC2 still lists.
    pub instances: Vec<Instance>,
}

/// The latest listing, and a lock that lets one listing run at a time.
#[derive(Debug, Default)]
pub(crate) struct FleetView {
    listing: tokio::sync::Mutex<()>,
    latest: Mutex<Option<Arc<Snapshot>>>,
}

impl FleetView {
    fn latest_since(&self, since: Instant) -> Option<Arc<Snapshot>> {
        self.latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .filter(|s| s.started >= since)
    }

    /// A snapshot whose listing started at or after `since`: the latest one if it
    /// qualifies, else the next, made by `list` unless another caller is making it.
    pub(crate) async fn since<F, Fut>(&self, since: Instant, list: F) -> Result<Arc<Snapshot>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<Instance>>>,
    {
        if let Some(s) = self.latest_since(since) {
            return Ok(s);
        }
        let _one_at_a_time = self.listing.lock().await;
        // Whoever held the lock may have listed after `since`: share that.
        if let Some(s) = self.latest_since(since) {
            return Ok(s);
        }
        let started = Instant::now();
        let instances = list().await?;
        let snapshot = Arc::new(Snapshot { started, instances });
        let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        if latest.as_ref().is_none_or(|l| l.started < started) {
            *latest = Some(snapshot.clone());
        }
        Ok(snapshot)
    }
}
