//! Names and labels of a set's machines: `<set>-<slot>-<generation>`, and the labels the
//! reconciler reads back from the provider.

use std::time::{Duration, SystemTime};

use crate::machine::Machine;
use crate::name::MachineName;

/// The label naming the set a machine belongs to.
pub const SET_LABEL: &str = "machine-core/set";
/// The label holding a machine's slot (its replica's place) in its set.
pub const SLOT_LABEL: &str = "machine-core/slot";
/// The label holding a machine's creation time, in seconds since the Unix epoch.
pub const CREATED_LABEL: &str = "machine-core/created";

/// The name of generation `generation` of `slot` in `set`.
pub(crate) fn machine_name(set: &str, slot: u32, generation: u32) -> MachineName {
    // A set name is a checked DNS label of at most MAX_SET_NAME_LEN characters, and the
    // numbers add digits and hyphens only.
    MachineName::new(format!("{set}-{slot}-{generation}")).expect("a DNS label")
}

/// The slot and generation a machine's name gives, when it is one of `set`'s names.
pub(crate) fn parse(set: &str, name: &MachineName) -> Option<(u32, u32)> {
    let rest = name.as_str().strip_prefix(set)?.strip_prefix('-')?;
    let (slot, generation) = rest.split_once('-')?;
    let number = |s: &str| {
        (!s.is_empty()
            && s.bytes().all(|b| b.is_ascii_digit())
            && (s == "0" || !s.starts_with('0')))
        .then(|| s.parse().ok())
        .flatten()
    };
    Some((number(slot)?, number(generation)?))
}

/// When `m` was made, from its [`CREATED_LABEL`].
pub(crate) fn created(m: &Machine) -> Option<SystemTime> {
    let secs: u64 = m.labels.get(CREATED_LABEL)?.parse().ok()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// The value of [`CREATED_LABEL`] for now.
pub(crate) fn created_now() -> String {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_others_are_not_taken_for_members() {
        let n = machine_name("web", 3, 12);
        assert_eq!(n.as_str(), "web-3-12");
        assert_eq!(parse("web", &n), Some((3, 12)));
        for other in [
            "web-3",
            "web-3-x",
            "webs-3-1",
            "web-03-1",
            "web--1",
            "web-1-2-3",
        ] {
            let name = MachineName::new(other).unwrap();
            assert_eq!(parse("web", &name), None, "{other}");
        }
        // A set whose name is a prefix of another's does not take its machines.
        assert_eq!(parse("web", &machine_name("web-1", 0, 1)), None);
    }
}
