//! Retrying transient and throttled errors with capped exponential backoff and jitter.
//!
//! One policy type for every retry in the project: the [`crate::decorators::Retrying`]
//! decorator, provider wire clients and SSH connects all take a [`RetryPolicy`].

use std::future::Future;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder, Retryable};

use crate::error::{Error, Result};

/// How to retry: capped exponential backoff with jitter, for retryable errors only.
///
/// `#[non_exhaustive]`: start from [`RetryPolicy::default`] or [`RetryPolicy::none`] and
/// adjust with the `with_*` methods (or assign the public fields).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Attempts after the first; 0 disables retrying.
    pub max_retries: usize,
    /// The delay before the first retry (before jitter).
    pub initial_delay: Duration,
    /// The largest delay between two attempts.
    pub max_delay: Duration,
    /// The growth factor between delays.
    pub factor: f32,
    /// Draw each delay at random from its upper half (`[d/2, d]`, never above
    /// `max_delay`), seeded per process, so that many clients do not retry in step.
    pub jitter: bool,
    /// A budget for the whole call, retries and waits included, counted from the first
    /// attempt: no retry starts after it is spent, and no wait runs past it. `None`
    /// bounds the call by `max_retries` alone.
    pub max_elapsed: Option<Duration>,
}

impl Default for RetryPolicy {
    /// Five retries from 200 ms, doubling, capped at 10 s, with jitter, within one
    /// minute in all.
    fn default() -> Self {
        RetryPolicy {
            max_retries: 5,
            initial_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(10),
            factor: 2.0,
            jitter: true,
            max_elapsed: Some(Duration::from_secs(60)),
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries.
    pub fn none() -> Self {
        RetryPolicy {
            max_retries: 0,
            ..RetryPolicy::default()
        }
    }

    /// Sets the number of attempts after the first.
    pub fn with_max_retries(mut self, n: usize) -> Self {
        self.max_retries = n;
        self
    }

    /// Sets the delay before the first retry.
    pub fn with_initial_delay(mut self, d: Duration) -> Self {
        self.initial_delay = d;
        self
    }

    /// Sets the largest delay between two attempts.
    pub fn with_max_delay(mut self, d: Duration) -> Self {
        self.max_delay = d;
        self
    }

    /// Sets the growth factor between delays.
    pub fn with_factor(mut self, factor: f32) -> Self {
        self.factor = factor;
        self
    }

    /// Sets whether delays are jittered.
    pub fn with_jitter(mut self, jitter: bool) -> Self {
        self.jitter = jitter;
        self
    }

    /// Sets the budget for the whole call (`None`: bounded by the retry count alone).
    pub fn with_max_elapsed(mut self, budget: Option<Duration>) -> Self {
        self.max_elapsed = budget;
        self
    }

    /// The successive delays this policy would wait (with jitter when enabled).
    pub fn delays(&self) -> impl Iterator<Item = Duration> + use<> {
        self.backoff()
    }

    /// Exponential delays from backon, jittered here: backon's own jitter adds up to a
    /// whole delay on top of the cap, and without its `std` feature draws from a fixed
    /// seed, so replicas would retry in lockstep.
    fn backoff(&self) -> Jittered {
        Jittered {
            delays: ExponentialBuilder::default()
                .with_min_delay(self.initial_delay)
                .with_max_delay(self.max_delay)
                .with_factor(self.factor)
                .with_max_times(self.max_retries)
                .build(),
            // Seeded per process (and per call) from the OS: no two replicas in step.
            rng: self.jitter.then(fastrand::Rng::new),
        }
    }

    /// Runs `op` until it succeeds, fails with an error that is not retryable, or the
    /// retries or the time budget ([`RetryPolicy::max_elapsed`]) are used up (then the
    /// last error is returned). A throttled error's `retry_after` is honoured when longer
    /// than the backoff delay (capped at `max_delay`).
    pub async fn retry<T, F, Fut>(&self, what: &str, op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let max = self.max_delay;
        let budget = self.max_elapsed;
        let start = tokio::time::Instant::now();
        op.retry(self.backoff())
            .sleep(tokio::time::sleep)
            .when(Error::is_retryable)
            .adjust(move |e: &Error, delay| {
                let d = delay?;
                let d = match e.retry_after() {
                    Some(after) => d.max(after.min(max)),
                    None => d,
                };
                match budget {
                    // No retry once waiting would overrun the budget.
                    Some(b) if start.elapsed() + d >= b => None,
                    _ => Some(d),
                }
            })
            .notify(|e, delay| {
                tracing::debug!(what, error = %e, ?delay, "retrying");
            })
            .await
    }
}

/// Backoff delays with "equal jitter": each delay `d` becomes a uniform draw from
/// `[d/2, d]`, so it never exceeds the cap and never collapses to nothing.
struct Jittered {
    delays: backon::ExponentialBackoff,
    rng: Option<fastrand::Rng>,
}

impl Iterator for Jittered {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let d = self.delays.next()?;
        Some(match &mut self.rng {
            Some(rng) => d / 2 + (d / 2).mul_f64(rng.f64()),
            None => d,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn fast() -> RetryPolicy {
        RetryPolicy {
            max_retries: 4,
            initial_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(4),
            factor: 2.0,
            jitter: false,
            max_elapsed: None,
        }
    }

    #[tokio::test]
    async fn transient_errors_are_retried_until_success() {
        let calls = AtomicUsize::new(0);
        let out = fast()
            .retry("op", || async {
                if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                    Err(Error::transient("reset"))
                } else {
                    Ok(7)
                }
            })
            .await
            .unwrap();
        assert_eq!(out, 7);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn permanent_errors_fail_fast() {
        let calls = AtomicUsize::new(0);
        let e = fast()
            .retry("op", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(Error::invalid_spec("image", "no such image"))
            })
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn retries_are_capped() {
        let calls = AtomicUsize::new(0);
        let e = fast()
            .retry("op", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(Error::throttled("slow down", None))
            })
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Throttled);
        assert_eq!(calls.load(Ordering::SeqCst), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_honoured_up_to_the_cap() {
        let policy = RetryPolicy {
            max_delay: Duration::from_secs(3),
            ..fast()
        };
        let start = tokio::time::Instant::now();
        let calls = AtomicUsize::new(0);
        policy
            .retry("op", || async {
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    Err(Error::throttled("slow down", Some(Duration::from_secs(60))))
                } else {
                    Ok(())
                }
            })
            .await
            .unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn the_time_budget_stops_retries_that_max_retries_would_allow() {
        let policy = RetryPolicy {
            max_retries: 1000,
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(1),
            jitter: false,
            max_elapsed: Some(Duration::from_secs(5)),
            ..RetryPolicy::default()
        };
        let start = tokio::time::Instant::now();
        let calls = AtomicUsize::new(0);
        let e = policy
            .retry("op", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(Error::transient("reset"))
            })
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Transient);
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            5,
            "attempts at 0, 1, 2, 3 and 4 s"
        );
    }

    #[test]
    fn delays_grow_and_are_capped() {
        let d: Vec<_> = fast().delays().collect();
        assert_eq!(d, [1, 2, 4, 4].map(Duration::from_millis).to_vec());
    }

    #[test]
    fn jittered_delays_stay_within_the_upper_half_and_never_pass_the_cap() {
        let policy = RetryPolicy {
            max_retries: 50,
            ..RetryPolicy::default()
        };
        let plain: Vec<_> = RetryPolicy {
            jitter: false,
            ..policy
        }
        .delays()
        .collect();
        for _ in 0..20 {
            for (j, d) in policy.delays().zip(&plain) {
                assert!(
                    j <= *d && j >= *d / 2,
                    "{j:?} outside [{:?}, {d:?}]",
                    *d / 2
                );
                assert!(j <= policy.max_delay, "{j:?} exceeds the cap");
            }
        }
    }

    #[test]
    fn jitter_differs_between_draws_so_replicas_do_not_retry_together() {
        // Each policy seeds from the OS, as separate processes do: equal first delays to
        // the nanosecond across 8 draws would mean a fixed seed.
        let firsts: std::collections::HashSet<_> = (0..8)
            .map(|_| RetryPolicy::default().delays().next().unwrap())
            .collect();
        assert!(firsts.len() > 1, "every draw gave {firsts:?}");
    }
}
