//! Name lookups shared across a fleet: one DescribeInstances, filtered by the owner's
//! tags and by the `Name` tag of every name asked meanwhile, answers many machines.
//!
//! Tag-filtered DescribeInstances is EC2's most expensive and most throttled call, and
//! a fleet used to make one per machine for every create, find, race check and delete.
//! Here a caller asks for a name's instances as listed *after* a given instant
//! (normally when its own operation began, so that it never acts on state older than
//! its call: a create refreshes before it trusts an absence). Names asked while a
//! listing is under way, or while the view waits out its batching gap, go into the next
//! listing together (up to [`NAMES_PER_LISTING`] per call).
//!
//! A listing waits until [`BATCH`] names are asked, or until a gap after the previous
//! listing that grows with the operations in flight ([`GAP_PER_OPERATION`] each, at
//! most [`MAX_GAP`]), or until every operation in flight is waiting for a lookup,
//! whichever comes first: a lone caller never waits, a busy fleet lists as soon as a
//! batch is full (so a lookup waits about the time the fleet takes to ask [`BATCH`]
//! names, not a gap proportional to its size), a quiet one makes about one listing per
//! gap, and the last operations of a burst do not wait for names nobody is left to
//! ask. Listing
//! only the names asked (not every instance of the owner) keeps each call's cost to the
//! server proportional to the batch, not to the fleet and its terminated instances.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_ec2::types::Instance;
use machine_core::Result;

/// EC2 accepts up to 200 values in one filter.
pub(crate) const NAMES_PER_LISTING: usize = 200;

/// How many names a listing waits for (at most the gap): at least ten names a listing
/// keeps tag-filtered lookups under 0.1 per machine.
pub(crate) const BATCH: usize = 12;

/// How much longer the view waits between listings for each operation in flight.
pub(crate) const GAP_PER_OPERATION: Duration = Duration::from_millis(100);

/// The longest wait between two listings, however many operations are in flight.
pub(crate) const MAX_GAP: Duration = Duration::from_secs(5);

/// How long an answer is kept: no operation waits that long for a lookup.
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// One name's instances, as one listing found them.
#[derive(Debug)]
pub(crate) struct NameSnapshot {
    /// When the listing started: it shows everything done before this instant.
    pub started: Instant,
    /// Every instance of the owner with the name, in any state EC2 still lists.
    pub instances: Vec<Instance>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Names asked for and not yet taken into a listing.
    pending: BTreeSet<String>,
    /// The latest answer for each name asked.
    answers: HashMap<String, Arc<NameSnapshot>>,
    /// When the latest listing started.
    last_started: Option<Instant>,
}

/// The counts a listing waiting to fill its batch watches, and its wake-up call.
#[derive(Debug, Default)]
struct Activity {
    /// Operations (create, find, delete) in flight.
    in_flight: AtomicUsize,
    /// Callers waiting for a lookup (asked, not yet answered).
    asking: AtomicUsize,
    /// Woken when a name is asked or an operation ends.
    changed: tokio::sync::Notify,
}

impl Activity {
    /// Whether no operation in flight is left to ask a name: every one is waiting for
    /// a lookup already, so waiting longer gathers nothing.
    fn all_asking(&self) -> bool {
        self.asking.load(Ordering::SeqCst) >= self.in_flight.load(Ordering::SeqCst)
    }
}

/// Batched lookups of names, and the count of operations that may ask for them.
#[derive(Debug, Default)]
pub(crate) struct FleetView {
    listing: tokio::sync::Mutex<()>,
    inner: Mutex<Inner>,
    activity: Arc<Activity>,
}

/// Counts one operation in flight while it lives (see [`FleetView::operation`]).
pub(crate) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

/// Counts one caller waiting for a lookup while it lives.
struct Asking<'a>(&'a Activity);

impl<'a> Asking<'a> {
    fn new(activity: &'a Activity) -> Self {
        activity.asking.fetch_add(1, Ordering::SeqCst);
        activity.changed.notify_waiters();
        Asking(activity)
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.0.asking.fetch_sub(1, Ordering::SeqCst);
    }
}

impl FleetView {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks an operation (create, find, delete) as in flight until the guard drops:
    /// the more there are, the longer the view batches names before listing.
    pub(crate) fn operation(&self) -> InFlight {
        self.activity.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self.activity.clone())
    }

    fn answered_since(&self, name: &str, since: Instant) -> Option<Arc<NameSnapshot>> {
        self.inner()
            .answers
            .get(name)
            .filter(|s| s.started >= since)
            .cloned()
    }

    /// `name`'s instances from a listing that started at or after `since`: the latest
    /// answer if it qualifies, else the next listing, made by `list` (given the names to
    /// list, it returns their instances) unless another caller is making it.
    pub(crate) async fn named<F, Fut>(
        &self,
        name: &str,
        since: Instant,
        list: F,
    ) -> Result<Arc<NameSnapshot>>
    where
        F: FnOnce(Vec<String>) -> Fut,
        Fut: Future<Output = Result<Vec<Instance>>>,
    {
        if let Some(s) = self.answered_since(name, since) {
            return Ok(s);
        }
        self.inner().pending.insert(name.to_owned());
        let _asking = Asking::new(&self.activity);
        let _one_at_a_time = self.listing.lock().await;
        // Whoever held the lock may have listed this name after `since`: share that.
        if let Some(s) = self.answered_since(name, since) {
            return Ok(s);
        }
        // Wait out the gap, so that the names of the other operations in flight join.
        let gap = (GAP_PER_OPERATION * self.activity.in_flight.load(Ordering::SeqCst) as u32)
            .saturating_sub(GAP_PER_OPERATION)
            .min(MAX_GAP);
        let last = self.inner().last_started;
        if let Some(last) = last {
            let until = tokio::time::Instant::from(last + gap);
            loop {
                let changed = self.activity.changed.notified();
                if self.inner().pending.len() >= BATCH || self.activity.all_asking() {
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => break,
                    _ = changed => {}
                }
            }
        }
        let names: Vec<String> = {
            let mut inner = self.inner();
            inner.pending.remove(name);
            let mut names = vec![name.to_owned()];
            while names.len() < NAMES_PER_LISTING {
                let Some(n) = inner.pending.pop_first() else {
                    break;
                };
                names.push(n);
            }
            names
        };
        let started = Instant::now();
        let found = match list(names.clone()).await {
            Ok(found) => found,
            Err(e) => {
                // The others asked too: their names go into the next listing.
                let mut inner = self.inner();
                inner.pending.extend(names.into_iter().skip(1));
                return Err(e);
            }
        };
        let mut by_name: HashMap<String, Vec<Instance>> =
            names.iter().map(|n| (n.clone(), Vec::new())).collect();
        for inst in found {
            let tagged = inst
                .tags()
                .iter()
                .find(|t| t.key() == Some(crate::tags::NAME_TAG))
                .and_then(|t| t.value())
                .map(str::to_owned);
            if let Some(list) = tagged.and_then(|n| by_name.get_mut(&n)) {
                list.push(inst);
            }
        }
        let own = Arc::new(NameSnapshot {
            started,
            instances: by_name.remove(name).unwrap_or_default(),
        });
        let mut inner = self.inner();
        inner.last_started = Some(started);
        // Answers older than any operation still running serve nobody.
        inner
            .answers
            .retain(|_, s| s.started.elapsed() < FORGET_AFTER);
        for (n, instances) in by_name {
            inner
                .answers
                .insert(n, Arc::new(NameSnapshot { started, instances }));
        }
        inner.answers.insert(name.to_owned(), own.clone());
        Ok(own)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::types::Tag;
    use std::sync::Mutex as StdMutex;

    /// Records each listing's names; answers one instance per name.
    #[derive(Default)]
    struct Lister(StdMutex<Vec<Vec<String>>>);

    impl Lister {
        async fn list(&self, names: Vec<String>) -> Result<Vec<Instance>> {
            self.0.lock().unwrap().push(names.clone());
            Ok(names
                .into_iter()
                .map(|n| {
                    Instance::builder()
                        .instance_id(format!("i-{n}"))
                        .tags(Tag::builder().key(crate::tags::NAME_TAG).value(n).build())
                        .build()
                })
                .collect())
        }

        fn listings(&self) -> Vec<Vec<String>> {
            self.0.lock().unwrap().clone()
        }
    }

    /// A first listing, so that the next ones have a gap to wait out.
    async fn primed(view: &FleetView, lister: &Lister) {
        let _op = view.operation();
        view.named("first", Instant::now(), |n| lister.list(n))
            .await
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_caller_never_waits() {
        let (view, lister) = (FleetView::default(), Lister::default());
        primed(&view, &lister).await;
        let _op = view.operation();
        let t = tokio::time::Instant::now();
        let s = view
            .named("a", Instant::now(), |n| lister.list(n))
            .await
            .unwrap();
        assert_eq!(t.elapsed(), Duration::ZERO);
        assert_eq!(s.instances[0].instance_id(), Some("i-a"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_fleet_lists_a_full_batch_without_waiting_out_the_gap() {
        let (view, lister) = (FleetView::default(), Lister::default());
        primed(&view, &lister).await;
        // Far more operations in flight than ask: the gap would be MAX_GAP.
        let others: Vec<InFlight> = (0..60).map(|_| view.operation()).collect();
        let t = tokio::time::Instant::now();
        let lookups = (0..BATCH).map(|i| {
            let (view, lister) = (&view, &lister);
            async move {
                let _op = view.operation();
                tokio::time::sleep(Duration::from_millis(10 * i as u64)).await;
                view.named(&format!("m{i:02}"), Instant::now(), |n| lister.list(n))
                    .await
                    .unwrap()
            }
        });
        let answers = futures_util::future::join_all(lookups).await;
        assert!(t.elapsed() < MAX_GAP, "waited {:?}", t.elapsed());
        assert_eq!(lister.listings().len(), 2, "{:?}", lister.listings());
        assert_eq!(lister.listings()[1].len(), BATCH);
        for (i, a) in answers.iter().enumerate() {
            assert_eq!(a.instances[0].instance_id(), Some(&*format!("i-m{i:02}")));
        }
        drop(others);
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_operations_of_a_burst_list_as_soon_as_nobody_else_can_ask() {
        let (view, lister) = (FleetView::default(), Lister::default());
        primed(&view, &lister).await;
        // Ten operations in flight: a gap of 900 ms after the previous listing.
        let mut bystanders: Vec<InFlight> = (0..8).map(|_| view.operation()).collect();
        let t = tokio::time::Instant::now();
        let ask = |name: &'static str| {
            let (view, lister) = (&view, &lister);
            async move {
                let _op = view.operation();
                view.named(name, Instant::now(), |n| lister.list(n))
                    .await
                    .unwrap()
            }
        };
        let end_bystanders = async {
            // The bystanders end (a delete, a launch) without asking any name.
            tokio::time::sleep(Duration::from_millis(200)).await;
            bystanders.clear();
        };
        let (a, b, ()) = tokio::join!(ask("a"), ask("b"), end_bystanders);
        assert_eq!(
            t.elapsed(),
            Duration::from_millis(200),
            "listed when the bystanders ended, not after the gap"
        );
        assert_eq!(
            lister.listings()[1..],
            [vec!["a".to_owned(), "b".to_owned()]]
        );
        assert_eq!(a.instances[0].instance_id(), Some("i-a"));
        assert_eq!(b.instances[0].instance_id(), Some("i-b"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_listed_after_the_callers_start_is_shared() {
        let (view, lister) = (FleetView::default(), Lister::default());
        let since = Instant::now();
        primed(&view, &lister).await;
        let _op = view.operation();
        let s = view
            .named("first", since, |n| lister.list(n))
            .await
            .unwrap();
        assert_eq!(lister.listings().len(), 1, "no second listing");
        assert_eq!(s.instances[0].instance_id(), Some("i-first"));
        // One from before the caller began is not trusted.
        let s = view
            .named("first", Instant::now(), |n| lister.list(n))
            .await
            .unwrap();
        assert_eq!(lister.listings().len(), 2);
        assert_eq!(s.instances.len(), 1);
    }
}
