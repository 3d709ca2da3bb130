//! The tags that make an instance a machine of this library: how they are written at
//! create, and how instances are found again by them after a crash.
//!
//! | tag | value |
//! |---|---|
//! | `Name` | the machine name (what the EC2 console shows) |
//! | `machine-provisioning/managed` | `true`: the library's marker |
//! | `machine-provisioning/owner` | the provider's owner ([`crate::AwsConfigBuilder::owner`]) |
//! | `machine-provisioning/label/<key>` | one per label of the spec |
//! | `machine-provisioning/ssh-user` | the SSH user, when one is known |
//!
//! The instance and its volumes get the same tags, so a volume left behind is traceable.

use std::collections::BTreeMap;

use machine_core::{Error, Labels, MachineName, MachineSpec, Result};

use crate::settings::{MAX_TAGS, check_tag};

/// The tag holding the machine name.
pub const NAME_TAG: &str = "Name";
/// The library's marker tag; its value is always `true`.
pub const MANAGED_TAG: &str = "machine-provisioning/managed";
/// The tag holding the owner.
pub const OWNER_TAG: &str = "machine-provisioning/owner";
/// The prefix of label tags: label `team` is tag `machine-provisioning/label/team`.
pub const LABEL_PREFIX: &str = "machine-provisioning/label/";
/// The tag holding the SSH user.
pub const SSH_USER_TAG: &str = "machine-provisioning/ssh-user";

/// The full tag key of label `key`.
pub fn label_tag(key: &str) -> String {
    format!("{LABEL_PREFIX}{key}")
}

fn reserved(key: &str) -> bool {
    key == NAME_TAG || key.starts_with("machine-provisioning/")
}

/// The tags of a new machine: the library's own, one per label, and `extra` (from the
/// provider settings). Refuses, naming the field, extra tags that would overwrite the
/// library's, any tag over EC2's size limits, and more than [`MAX_TAGS`] in all.
pub fn machine_tags(
    spec: &MachineSpec,
    owner: &str,
    ssh_user: Option<&str>,
    extra: &BTreeMap<String, String>,
) -> Result<Vec<(String, String)>> {
    let mut tags = vec![
        (NAME_TAG.to_owned(), spec.name.to_string()),
        (MANAGED_TAG.to_owned(), "true".to_owned()),
        (OWNER_TAG.to_owned(), owner.to_owned()),
    ];
    if let Some(user) = ssh_user {
        tags.push((SSH_USER_TAG.to_owned(), user.to_owned()));
    }
    let own = tags.len();
    for (k, v) in &spec.labels {
        let key = label_tag(k);
        check_tag(&format!("labels.{k}"), &key, v)?;
        tags.push((key, v.clone()));
    }
    for (k, v) in extra {
        let field = format!("provider.tags.{k}");
        if reserved(k) {
            return Err(Error::invalid_spec(
                field,
                format!("tag {k:?} is the library's own (Name and machine-provisioning/*)"),
            ));
        }
        check_tag(&field, k, v)?;
        tags.push((k.clone(), v.clone()));
    }
    if tags.len() > MAX_TAGS {
        let field = if own + spec.labels.len() > MAX_TAGS {
            "labels"
        } else {
            "provider.tags"
        };
        return Err(Error::invalid_spec(
            field,
            format!(
                "{} tags ({own} of the library's, {} labels, {} provider tags) exceed EC2's {MAX_TAGS} per resource",
                tags.len(),
                spec.labels.len(),
                extra.len()
            ),
        ));
    }
    Ok(tags)
}

/// What the tags of an instance say about it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    /// The machine name, when the `Name` tag holds a valid one.
    pub name: Option<MachineName>,
    /// Whether the marker tag is set.
    pub managed: bool,
    /// The owner tag.
    pub owner: Option<String>,
    /// The labels.
    pub labels: Labels,
    /// The SSH user tag.
    pub ssh_user: Option<String>,
}

/// Reads an instance's tags.
pub fn parse<'a>(tags: impl IntoIterator<Item = (&'a str, &'a str)>) -> Parsed {
    let mut p = Parsed::default();
    for (k, v) in tags {
        match k {
            NAME_TAG => p.name = MachineName::new(v).ok(),
            MANAGED_TAG => p.managed = v == "true",
            OWNER_TAG => p.owner = Some(v.to_owned()),
            SSH_USER_TAG => p.ssh_user = Some(v.to_owned()),
            _ => {
                if let Some(label) = k.strip_prefix(LABEL_PREFIX) {
                    p.labels.insert(label.to_owned(), v.to_owned());
                }
            }
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use machine_core::ErrorKind;

    fn spec() -> MachineSpec {
        MachineSpec::new(MachineName::new("web-1").unwrap()).with_label("team", "web")
    }

    #[test]
    fn tags_round_trip_through_parse() {
        let extra = BTreeMap::from([("CostCenter".to_owned(), "42".to_owned())]);
        let tags = machine_tags(&spec(), "ci", Some("admin"), &extra).unwrap();
        let p = parse(tags.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        assert_eq!(p.name.unwrap().as_str(), "web-1");
        assert!(p.managed);
        assert_eq!(p.owner.as_deref(), Some("ci"));
        assert_eq!(p.ssh_user.as_deref(), Some("admin"));
        assert_eq!(p.labels, Labels::from([("team".into(), "web".into())]));
        assert!(tags.contains(&("CostCenter".into(), "42".into())));
    }

    #[test]
    fn too_many_tags_are_refused_naming_the_field() {
        let extra: BTreeMap<String, String> =
            (0..47).map(|i| (format!("t{i}"), "v".to_owned())).collect();
        let e = machine_tags(&spec(), "ci", None, &extra).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec);
        assert_eq!(e.field(), Some("provider.tags"), "{e}");
        assert!(e.message().contains("51 tags"), "{e}");
        let extra: BTreeMap<String, String> =
            (0..46).map(|i| (format!("t{i}"), "v".to_owned())).collect();
        assert_eq!(machine_tags(&spec(), "ci", None, &extra).unwrap().len(), 50);

        let mut many = spec();
        for i in 0..48 {
            many.labels.insert(format!("l{i}"), "v".into());
        }
        let e = machine_tags(&many, "ci", None, &BTreeMap::new()).unwrap_err();
        assert_eq!(e.field(), Some("labels"), "{e}");
    }

    #[test]
    fn extra_tags_cannot_overwrite_the_librarys() {
        for key in ["Name", "machine-provisioning/owner"] {
            let extra = BTreeMap::from([(key.to_owned(), "x".to_owned())]);
            let e = machine_tags(&spec(), "ci", None, &extra).unwrap_err();
            assert_eq!(e.field(), Some(format!("provider.tags.{key}").as_str()));
        }
    }
}
