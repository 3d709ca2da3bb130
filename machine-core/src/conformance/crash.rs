//! Crash points: a create or delete abandoned at an await point (the future dropped and
//! the provider instance thrown away, what a kill -9 leaves), then finished or undone by
//! a new instance.

use std::future::{Future, poll_fn};
use std::task::Poll;

use crate::machine::Phase;

use super::fixture::{Clients, Fixture};

/// Runs `fut` to the end, counting how often it was pending: the number of await points
/// at which it could have been abandoned.
async fn count_pendings<F: Future>(fut: F) -> (F::Output, usize) {
    let mut fut = Box::pin(fut);
    let mut pendings = 0;
    let out = poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(v) => Poll::Ready(v),
        Poll::Pending => {
            pendings += 1;
            Poll::Pending
        }
    })
    .await;
    (out, pendings)
}

/// Polls `fut` until it has been pending `pendings` times, then drops it where it
/// stands; `Some` when it finished first.
async fn abandon_after<F: Future>(fut: F, pendings: usize) -> Option<F::Output> {
    let mut fut = Box::pin(fut);
    let mut seen = 0;
    poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(v) => Poll::Ready(Some(v)),
        Poll::Pending if seen >= pendings => Poll::Ready(None),
        Poll::Pending => {
            seen += 1;
            Poll::Pending
        }
    })
    .await
}

/// The await point of `round` out of `rounds`, spread over `0..total` with some jitter,
/// so that every stretch of the call is hit over the rounds.
fn crash_point(round: usize, rounds: usize, total: usize) -> usize {
    if total == 0 {
        return 0;
    }
    let base = round * total / rounds.max(1);
    let stride = (total / rounds.max(1)).max(1);
    (base + fastrand::usize(..stride)).min(total - 1)
}

/// A create abandoned at an await point, its provider instance thrown away: a new
/// instance creating the same name gets one machine, which reaches running; no second
/// machine of that name is left standing. Over [`Fixture::crash_rounds`] rounds, each
/// at another await point of the create.
pub async fn create_survives_a_crash_at_any_point(c: &Clients, fx: &Fixture) {
    let case = "create_survives_a_crash_at_any_point";
    // One whole create, to learn how many await points a create has.
    let probe = c.new_instance(case).await;
    let spec = fx.spec("crash-probe");
    let (made, total) = count_pendings(probe.create(&spec, None)).await;
    let made = made.unwrap_or_else(|e| panic!("{probe}: create failed: {e}"));
    fx.cleanup(probe.as_ref(), &made).await;
    drop(probe);

    for round in 0..fx.crash_rounds {
        let what = format!("crash-create-{round}");
        let spec = fx.spec(&what);
        let at = crash_point(round, fx.crash_rounds, total);
        let doomed = c.new_instance(case).await;
        let finished = abandon_after(doomed.create(&spec, None), at).await;
        drop(doomed);
        if let Some(Err(e)) = &finished
            && !e.is_retryable()
        {
            panic!("create of {} failed before its crash point: {e}", spec.name);
        }

        let next = c.new_instance(case).await;
        let p = next.as_ref();
        let m = p.create(&spec, None).await.unwrap_or_else(|e| {
            panic!("{p}: create after a crash at await point {at} of {total} failed: {e}")
        });
        if let Some(Ok(first)) = &finished {
            assert_eq!(
                first.provider_id, m.provider_id,
                "{p}: a create after a finished create made another machine"
            );
        }
        let running = fx
            .wait_for(
                p,
                &m.provider_id,
                &format!("running after a crash at await point {at} of {total} of its create"),
                Phase::is_running,
            )
            .await;
        let standing: Vec<_> = p
            .list(&fx.case_selector(&what))
            .await
            .unwrap_or_else(|e| panic!("{p}: list failed: {e}"))
            .into_iter()
            .filter(|l| !l.phase.is_deleting())
            .collect();
        for other in standing.iter().filter(|l| l.provider_id != m.provider_id) {
            fx.cleanup(p, other).await;
        }
        assert_eq!(
            standing.len(),
            1,
            "{p}: a crash at await point {at} of {total} of a create left {} machines named {} standing",
            standing.len(),
            spec.name
        );
        fx.cleanup(p, &running).await;
    }
}

/// A delete abandoned at an await point, its provider instance thrown away: a new
/// instance's delete succeeds and the machine goes; the name is then free and a create
/// of it makes a new machine that runs. Over [`Fixture::crash_rounds`] rounds, each at
/// another await point of the delete.
pub async fn delete_survives_a_crash_at_any_point(c: &Clients, fx: &Fixture) {
    let case = "delete_survives_a_crash_at_any_point";
    let probe = c.new_instance(case).await;
    let (_, m) = fx.create(probe.as_ref(), "crash-probe-delete").await;
    fx.wait_for(probe.as_ref(), &m.provider_id, "running", Phase::is_running)
        .await;
    let (deleted, total) = count_pendings(probe.delete(&m.provider_id)).await;
    deleted.unwrap_or_else(|e| panic!("{probe}: delete failed: {e}"));
    fx.wait_gone(probe.as_ref(), &m.provider_id).await;
    drop(probe);

    for round in 0..fx.crash_rounds {
        let what = format!("crash-delete-{round}");
        let at = crash_point(round, fx.crash_rounds, total);
        let maker = c.new_instance(case).await;
        let (spec, m) = fx.create(maker.as_ref(), &what).await;
        fx.wait_for(maker.as_ref(), &m.provider_id, "running", Phase::is_running)
            .await;
        drop(maker);

        let doomed = c.new_instance(case).await;
        let finished = abandon_after(doomed.delete(&m.provider_id), at).await;
        drop(doomed);
        if let Some(Err(e)) = finished
            && !e.is_retryable()
        {
            panic!(
                "delete of {} failed before its crash point: {e}",
                m.provider_id
            );
        }

        let next = c.new_instance(case).await;
        let p = next.as_ref();
        p.delete(&m.provider_id).await.unwrap_or_else(|e| {
            panic!("{p}: delete after a crash at await point {at} of {total} failed: {e}")
        });
        fx.wait_gone(p, &m.provider_id).await;
        let found = p
            .find(&spec.name)
            .await
            .unwrap_or_else(|e| panic!("{p}: find failed: {e}"));
        assert!(
            found.is_none(),
            "{p}: find returns {} after a delete crashed at await point {at} of {total} and was finished",
            spec.name
        );
        // The name is free again and nothing of the old machine stands in the way.
        let again = p.create(&spec, None).await.unwrap_or_else(|e| {
            panic!("{p}: create of a name freed by a crashed delete failed: {e}")
        });
        assert_ne!(
            again.provider_id, m.provider_id,
            "{p}: create of a deleted machine's name returned the deleted machine"
        );
        let running = fx
            .wait_for(
                p,
                &again.provider_id,
                "running after its name was freed by a crashed delete",
                Phase::is_running,
            )
            .await;
        fx.cleanup(p, &running).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn abandon_after_drops_a_future_at_the_asked_await_point() {
        let steps = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let s = steps.clone();
        let work = async move {
            for _ in 0..5 {
                tokio::task::yield_now().await;
                s.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            "done"
        };
        assert_eq!(abandon_after(work, 2).await, None);
        assert_eq!(steps.load(std::sync::atomic::Ordering::SeqCst), 2);
        let (out, pendings) = count_pendings(async {
            for _ in 0..5 {
                tokio::task::yield_now().await;
            }
            7
        })
        .await;
        assert_eq!((out, pendings), (7, 5));
    }

    #[test]
    fn crash_points_cover_every_stretch_of_the_call() {
        let points: Vec<_> = (0..8).map(|r| crash_point(r, 8, 40)).collect();
        for (r, p) in points.iter().enumerate() {
            assert!((r * 5..r * 5 + 5).contains(p), "round {r}: {p}");
        }
        assert_eq!(crash_point(3, 8, 0), 0);
        assert!((0..8).all(|r| crash_point(r, 8, 3) < 3));
    }
}
