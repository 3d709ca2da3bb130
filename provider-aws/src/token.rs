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
//!   are `<owner+name digest>-<epoch>-<seq>`, and a create continues the sequence of the
//!   newest token it can see on an instance of the name (`seq + 1`): EC2 lists
//!   terminated instances, with their `ClientToken`, for about an hour, so a recreate
//!   within that time costs one RunInstances, however many generations came before.
//! - When no instance of the name is visible (the name is new, or its last instance was
//!   terminated long ago), the sequence starts afresh in the current epoch (ten minutes
//!   of wall-clock time): a token of an earlier epoch is never reused, so the tokens
//!   EC2 still holds from days of recreations cost nothing. Only launches of this same
//!   epoch that EC2 already stopped listing can be in the way; `create` steps past each
//!   with one call (EC2 answers with the terminated instance, or a mismatch that a
//!   lookup shows is not a live instance), so the count of calls is one plus such
//!   launches, with no cap.
//!
//! Two creators that straddle an epoch boundary with nothing visible send different
//! tokens; both may launch, and `create`'s race settlement (the oldest instance of the
//! name wins, the others are terminated by their own creators) keeps one, as it does
//! on endpoints that ignore tokens (moto).

use sha2::{Digest, Sha256};

/// Length of an epoch, in seconds of Unix time.
const EPOCH_SECS: u64 = 600;

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
    /// that name EC2 still lists (any state) and the current Unix time: the successor
    /// of the newest of ours among them, or the first of the current epoch.
    pub(crate) fn choose<'a>(
        owner: &str,
        name: &str,
        seen: impl IntoIterator<Item = &'a str>,
        unix_secs: u64,
    ) -> ClientToken {
        let prefix = Self::prefix(owner, name);
        let newest = seen
            .into_iter()
            .filter_map(|t| Self::parse(&prefix, t))
            .max_by_key(|t| (t.epoch, t.seq));
        match newest {
            Some(t) => t.next(),
            None => ClientToken {
                prefix,
                epoch: unix_secs / EPOCH_SECS,
                seq: 0,
            },
        }
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
        // Continues the newest of its own tokens, ignoring others' and old formats.
        let older = ClientToken::choose("ci", "web-1", [], 1_700_000_000).next();
        let theirs = ClientToken::choose("ci", "web-2", [], 1_900_000_000).to_string();
        let seen = [
            s.clone(),
            t.next().next().to_string(),
            older.to_string(),
            theirs,
            "0123abcd-g0".to_owned(),
        ];
        let chosen = ClientToken::choose("ci", "web-1", seen.iter().map(String::as_str), 0);
        assert_eq!(chosen, t.next().next().next());
        // A later epoch starts afresh when nothing is visible.
        let later = ClientToken::choose("ci", "web-1", [], 1_800_000_000 + EPOCH_SECS);
        assert_ne!(later, t);
        assert_eq!(later.seq, 0);
    }
}
