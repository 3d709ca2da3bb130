//! The RunInstances `ClientToken`: one name, one instance, whatever the controllers
//! creating it disagree on.
//!
//! EC2 keeps a token bound to the instance it launched, for at least 24 hours after
//! that instance is terminated: the same token with the same parameters answers with
//! that instance (in whatever state it is now), the same token with other parameters
//! fails with `IdempotentParameterMismatch`. So:
//!
//! - The token depends on the owner and the name only, never on the spec: two
//!   controllers launching one name at once send one token, and EC2 itself lets one of
//!   them launch; the other gets the instance (same spec) or a mismatch, which `create`
//!   turns into a conflict error (other spec). A spec-derived token would let each
//!   launch its own instance.
//! - A deliberate recreate after a delete needs a token that is not bound yet. Tokens
//!   are `<owner+name digest>-<epoch>-<seq>`. The epoch is the ten-minute span of Unix
//!   time in which the listing that showed the name free *started*; a create continues
//!   the sequence of the newest token of that epoch it sees on an instance of the name
//!   (`seq + 1`), else starts at `seq` 0. Name lookups leave terminated instances
//!   out (they would be most of a churning fleet's answers), so a provider also
//!   counts the token of its own latest launch of the name: its recreates cost one
//!   RunInstances however many generations came before. When another controller
//!   launched the newest generations, the token chosen is bound already: EC2
//!   answers with the terminated instance (or a mismatch whose holder a lookup shows
//!   is not live), and one lookup of the name in every state (EC2 lists terminated
//!   instances, with their `ClientToken`, for about an hour) gives the newest token
//!   to continue from. Tokens of earlier epochs are never reused, so the tokens EC2
//!   holds from days of recreations cost nothing; a token of this epoch that EC2 no
//!   longer lists is stepped past with one call.
//!
//! # When a create must look for a rival launch
//!
//! Within one epoch the tokens that were ever bound form a prefix `0..=k` of the
//! sequence (a create uses `seq + 1` only after seeing `seq` bound, or steps past
//! it), so every creator of that epoch walks the same chain and reaches the same
//! instance: two launches of one name and epoch are one instance (or a conflict error,
//! for another spec). A rival launch needs a rival *epoch*. Let a create's listing
//! start at `s` (epoch `E`) and its RunInstances be acknowledged at `a`; call it
//! *early* when `a` is at least [`LATE_MARGIN`] before the end of `E`, *late*
//! otherwise. With instances visible to listings [`VISIBILITY_LAG`] after their
//! launch and clocks within [`CLOCK_SKEW`] of each other:
//!
//! - A rival of a later epoch started its listing after `E` ended, yet before our
//!   instance was visible (it saw the name free): before `a + VISIBILITY_LAG`. So `a`
//!   lies within `VISIBILITY_LAG + 2 * CLOCK_SKEW` of the end of `E`: we are late. An
//!   early create has no rival of a later epoch.
//! - A rival of an earlier epoch is, by the same argument with the roles swapped, late.
//!
//! So an early create keeps its instance without looking again; a late one waits
//! until every rival of a later epoch must be visible ([`late_wait`]) and yields to the
//! newest epoch it sees, which is never late towards an even later one unless that one
//! exists and is seen too. On an endpoint that ignores tokens (moto) every create
//! settles by the oldest launch instead (`create`, `ClientTokens::Ignored`).
//!
//! A create does not launch late when it can help it: when its launch would be
//! acknowledged within [`LATE_MARGIN`] (plus [`LAUNCH_ALLOWANCE`] for the call) of its
//! listing's epoch end, it waits for the next epoch and lists again
//! ([`defer_launch`]): at most 15 s instead of [`late_wait`] (80 s by default) after
//! the launch. Only a launch slower than the allowance still ends late and settles.

use std::time::Duration;

use sha2::{Digest, Sha256};

/// Length of an epoch, in seconds of Unix time.
const EPOCH_SECS: u64 = 600;

/// The longest a launched instance takes to appear in every listing started after
/// it. EC2's reads are eventually consistent, usually within a second; the bound is
/// generous because a wrong guess costs a duplicate, a generous one only a wait.
pub(crate) const VISIBILITY_LAG: Duration = Duration::from_secs(5);

/// The most two controllers' clocks (and EC2's) may disagree; NTP keeps real hosts
/// within milliseconds.
pub(crate) const CLOCK_SKEW: Duration = Duration::from_secs(1);

/// A create acknowledged later than this before the end of its token's epoch settles
/// races: more than [`VISIBILITY_LAG`] plus twice [`CLOCK_SKEW`] (see the module docs).
pub(crate) const LATE_MARGIN: Duration = Duration::from_secs(10);
const _: () = assert!(LATE_MARGIN.as_secs() > VISIBILITY_LAG.as_secs() + 2 * CLOCK_SKEW.as_secs());

/// The longest after a listing's answer that a create sends RunInstances on its
/// strength; an older answer is refreshed first. It bounds how late after its listing a rival's
/// instance can appear, and so how long a late create waits ([`late_wait`]).
pub(crate) const LISTING_FRESH_FOR: Duration = Duration::from_secs(10);

/// The longest the SDK's backoff waits between two attempts of one call.
const SDK_MAX_BACKOFF: Duration = Duration::from_secs(20);

/// How long a RunInstances is expected to take to be acknowledged, when a create
/// decides whether to send it now or after its token's epoch ([`defer_launch`]).
const LAUNCH_ALLOWANCE: Duration = Duration::from_secs(5);

/// The end of the epoch in which a listing started at `listing_start` (Unix time).
fn epoch_end(listing_start: Duration) -> Duration {
    Duration::from_secs((listing_start.as_secs() / EPOCH_SECS + 1) * EPOCH_SECS)
}

/// Whether a create whose listing started at `listing_start` and whose RunInstances
/// was acknowledged at `acked` (both since the Unix epoch) must look for a rival
/// launch: whether it is *late* in the module docs' sense.
pub(crate) fn is_late(listing_start: Duration, acked: Duration) -> bool {
    acked + LATE_MARGIN > epoch_end(listing_start)
}

/// Whether a create holding a listing started at `listing_start` should hold its
/// launch at `now` (both Unix time): `None` to launch now, or how long to wait before
/// listing again when a launch sent now would likely be acknowledged late (then the
/// next listing, and so the token, is of the next epoch, and the launch early in it).
pub(crate) fn defer_launch(listing_start: Duration, now: Duration) -> Option<Duration> {
    let end = epoch_end(listing_start);
    // A little past the end, so that the next listing surely starts in the next epoch.
    (now + LATE_MARGIN + LAUNCH_ALLOWANCE > end)
        .then(|| end.saturating_sub(now) + Duration::from_millis(100))
}

/// How long after its acknowledgement a late create waits before its lookup. A rival
/// of a later epoch started its listing before our launch was visible (within
/// [`VISIBILITY_LAG`] of the acknowledgement), had its answer within the SDK's attempts
/// (one page), sent RunInstances within [`LISTING_FRESH_FOR`] of that, EC2 carried it
/// out within the SDK's attempts, and it became visible [`VISIBILITY_LAG`] later. The
/// assumption, as for any client: a request is carried out within its attempts'
/// timeouts or not at all.
pub(crate) fn late_wait(attempts: u32, attempt_timeout: Duration) -> Duration {
    let call = attempt_timeout * attempts + SDK_MAX_BACKOFF * attempts.saturating_sub(1);
    VISIBILITY_LAG * 2 + LISTING_FRESH_FOR + call * 2
}

/// One token: a digest of owner and name, an epoch and a sequence number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientToken {
    prefix: String,
    epoch: u64,
    seq: u64,
}

impl ClientToken {
    /// The digest that starts every token of `owner`'s machine `name` (32 hex digits;
    /// a whole token stays well under EC2's 64 characters).
    pub(crate) fn prefix(owner: &str, name: &str) -> String {
        let mut h = Sha256::new();
        h.update(owner.as_bytes());
        h.update([0]);
        h.update(name.as_bytes());
        h.finalize()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The token to launch `owner`'s `name` with, given the tokens of the instances of
    /// that name a listing showed (any state) and the Unix time the listing started:
    /// the successor of the newest of ours of that epoch among them, or the epoch's
    /// first.
    pub(crate) fn choose<'a>(
        owner: &str,
        name: &str,
        seen: impl IntoIterator<Item = &'a str>,
        listing_unix_secs: u64,
    ) -> ClientToken {
        let prefix = Self::prefix(owner, name);
        let epoch = listing_unix_secs / EPOCH_SECS;
        let newest = seen
            .into_iter()
            .filter_map(|t| Self::parse(&prefix, t))
            .filter(|t| t.epoch == epoch)
            .max_by_key(|t| t.seq);
        match newest {
            Some(t) => t.next(),
            None => ClientToken {
                prefix,
                epoch,
                seq: 0,
            },
        }
    }

    /// The epoch of `token` if it is one of `owner`'s for `name`.
    pub(crate) fn epoch_of(owner: &str, name: &str, token: &str) -> Option<u64> {
        Self::parse(&Self::prefix(owner, name), token).map(|t| t.epoch)
    }

    /// The token of the next generation.
    pub(crate) fn next(&self) -> ClientToken {
        ClientToken {
            prefix: self.prefix.clone(),
            epoch: self.epoch,
            seq: self.seq + 1,
        }
    }

    /// Reads `token` if it starts with `prefix` (tokens of other names, or of earlier
    /// versions of this library, are not ours to continue).
    fn parse(prefix: &str, token: &str) -> Option<ClientToken> {
        let rest = token.strip_prefix(prefix)?.strip_prefix('-')?;
        let (epoch, seq) = rest.split_once('-')?;
        Some(ClientToken {
            prefix: prefix.to_owned(),
            epoch: epoch.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }
}

impl std::fmt::Display for ClientToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}-{}", self.prefix, self.epoch, self.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_depend_on_owner_and_name_only_and_continue_the_newest() {
        let t = ClientToken::choose("ci", "web-1", [], 1_800_000_000);
        assert_eq!(t, ClientToken::choose("ci", "web-1", [], 1_800_000_001));
        assert_ne!(t, ClientToken::choose("ci", "web-2", [], 1_800_000_000));
        assert_ne!(t, ClientToken::choose("cd", "web-1", [], 1_800_000_000));
        let s = t.to_string();
        assert!(s.len() <= 64, "{s}");
        // Continues the newest of its own tokens of the listing's epoch, ignoring other
        // epochs', other names' and old formats.
        let older = ClientToken::choose("ci", "web-1", [], 1_700_000_000)
            .next()
            .next()
            .next()
            .next();
        let theirs = ClientToken::choose("ci", "web-2", [], 1_800_000_000)
            .next()
            .next()
            .next()
            .next()
            .to_string();
        let seen = [
            s.clone(),
            t.next().next().to_string(),
            older.to_string(),
            theirs,
            "0123abcd-g0".to_owned(),
        ];
        let chosen = ClientToken::choose(
            "ci",
            "web-1",
            seen.iter().map(String::as_str),
            1_800_000_000,
        );
        assert_eq!(chosen, t.next().next().next());
        assert_eq!(ClientToken::epoch_of("ci", "web-1", &s), Some(t.epoch));
        assert_eq!(ClientToken::epoch_of("ci", "web-2", &s), None);
        // A later epoch starts afresh when nothing is visible.
        let later = ClientToken::choose("ci", "web-1", [], 1_800_000_000 + EPOCH_SECS);
        assert_ne!(later, t);
        assert_eq!(later.seq, 0);
    }

    #[test]
    fn only_a_create_acknowledged_near_its_epochs_end_settles() {
        let secs = Duration::from_secs;
        // 1_800_000_000 is the start of an epoch (a multiple of 600).
        let start = secs(1_800_000_000);
        let end = start + secs(EPOCH_SECS);
        // Far from the end: no rival of another epoch can exist.
        assert!(!is_late(start, start + secs(1)));
        assert!(!is_late(start + secs(300), start + secs(302)));
        assert!(!is_late(start, end - LATE_MARGIN));
        // Within the margin of the end, or acknowledged after it: settle.
        assert!(is_late(start + secs(300), end - LATE_MARGIN + secs(1)));
        assert!(is_late(end - secs(3), end - secs(1)));
        assert!(is_late(end - secs(3), end + secs(30)));
        // A listing late in its epoch with a slow launch is late too.
        assert!(is_late(end - secs(60), end + secs(400)));
        // The margin covers what the argument needs.
        assert!(LATE_MARGIN > VISIBILITY_LAG + CLOCK_SKEW * 2);
        // The wait covers two visibility lags, the answer's age and two calls' attempts.
        assert_eq!(late_wait(1, secs(30)), secs(80));
        assert_eq!(late_wait(2, secs(30)), secs(180));
    }

    #[test]
    fn a_launch_that_would_end_late_waits_for_the_next_epoch() {
        let secs = Duration::from_secs;
        let start = secs(1_800_000_000);
        let end = start + secs(EPOCH_SECS);
        // Well inside the epoch: launch now.
        assert_eq!(defer_launch(start, start + secs(1)), None);
        assert_eq!(
            defer_launch(start, end - LATE_MARGIN - LAUNCH_ALLOWANCE),
            None
        );
        // Close to the end: wait until just past it, then list again.
        let now = end - secs(12);
        let wait = defer_launch(start + secs(580), now).expect("deferred");
        assert!(now + wait > end && now + wait < end + secs(1), "{wait:?}");
        // The next listing's epoch is the next one, and a launch right after it is early.
        assert!(!is_late(now + wait, now + wait + LAUNCH_ALLOWANCE));
        // A listing of the previous epoch used after its end: list again at once.
        assert!(defer_launch(end - secs(2), end + secs(3)).unwrap() < secs(1));
        // Whatever is not deferred and acknowledged within the allowance is early.
        for at in (0..EPOCH_SECS).map(secs) {
            if defer_launch(start, start + at).is_none() {
                assert!(!is_late(start, start + at + LAUNCH_ALLOWANCE), "{at:?}");
            }
        }
    }
}
