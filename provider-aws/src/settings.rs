//! Per-machine EC2 settings: what [`MachineSpec::provider`](machine_core::MachineSpec)
//! may hold for this provider, the provider-wide defaults of the same shape, and the
//! checks that refuse malformed values before any API call.

use std::collections::BTreeMap;

use machine_core::{Error, MachineSpec, Result, shown, shown_key};
use serde::{Deserialize, Serialize};

/// EC2 settings of one machine. In a spec they sit under `provider:` in camelCase:
///
/// ```yaml
/// provider:
///   subnetId: subnet-0a1b2c3d4e5f60718
///   securityGroupIds: [sg-0123456789abcdef0]
///   keyName: ops
///   instanceProfile: node-role
///   rootVolume: {sizeGiB: 20, type: gp3}
///   tags: {CostCenter: "42"}
/// ```
///
/// Unknown fields are refused with their path (`provider.subnetID`). Every field is
/// optional: what a spec leaves out comes from [`crate::AwsConfig`]'s defaults; `tags`
/// are merged with the defaults' tags, the spec winning on equal keys.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Ec2Settings {
    /// The subnet to launch into (`subnet-` and 8 or 17 hex digits); EC2's default
    /// subnet of the zone when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet_id: Option<String>,
    /// Security groups by id (`sg-...`); the VPC's default group when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_group_ids: Option<Vec<String>>,
    /// The EC2 key pair whose public key is installed for the image's default user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_name: Option<String>,
    /// The IAM instance profile, by name or by ARN (`arn:aws:iam::...:instance-profile/...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_profile: Option<String>,
    /// The availability zone, for launches without a subnet (a subnet fixes its zone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<String>,
    /// Size and type of the root volume; the image's own when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_volume: Option<RootVolume>,
    /// The user SSH logs in as (`ec2-user`, `admin`, `ubuntu`: it depends on the image),
    /// when the spec has no `ssh.user`. Without either, machines report no SSH endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_user: Option<String>,
    /// Extra tags for the instance and its volumes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// The root EBS volume of a machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RootVolume {
    /// Size in GiB, 1 to 16384.
    #[serde(rename = "sizeGiB")]
    pub size_gib: i32,
    /// EBS volume type: `gp3` (the default), `gp2`, `io1`, `io2`, `st1`, `sc1` or `standard`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub volume_type: Option<String>,
    /// The image's root device name (`/dev/xvda`, `/dev/sda1`). When absent it is read
    /// from the image with one DescribeImages call per create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
    /// Whether to encrypt the volume (with the account's default EBS key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted: Option<bool>,
}

/// EBS volume types RunInstances accepts for a root volume.
pub const VOLUME_TYPES: [&str; 7] = ["gp3", "gp2", "io1", "io2", "st1", "sc1", "standard"];

/// The most tags EC2 keeps on one resource.
pub const MAX_TAGS: usize = 50;
/// The longest tag key EC2 accepts.
pub const MAX_TAG_KEY_LEN: usize = 128;
/// The longest tag value EC2 accepts.
pub const MAX_TAG_VALUE_LEN: usize = 256;

impl Ec2Settings {
    /// Reads and checks the settings in a spec's `provider` field (none gives the
    /// default). Errors are invalid-spec errors whose field is the path inside the spec
    /// (`provider.rootVolume.sizeGiB`).
    pub fn from_spec(spec: &MachineSpec) -> Result<Self> {
        let settings: Ec2Settings = spec.provider_settings()?;
        settings.validate().map_err(|e| e.within("provider"))?;
        Ok(settings)
    }

    /// Fills what `self` leaves out from `defaults`; tags are merged, `self` winning.
    pub fn or_defaults(mut self, defaults: &Ec2Settings) -> Ec2Settings {
        fn pick<T: Clone>(own: &mut Option<T>, default: &Option<T>) {
            if own.is_none() {
                own.clone_from(default);
            }
        }
        pick(&mut self.subnet_id, &defaults.subnet_id);
        pick(&mut self.security_group_ids, &defaults.security_group_ids);
        pick(&mut self.key_name, &defaults.key_name);
        pick(&mut self.instance_profile, &defaults.instance_profile);
        pick(&mut self.availability_zone, &defaults.availability_zone);
        pick(&mut self.root_volume, &defaults.root_volume);
        pick(&mut self.ssh_user, &defaults.ssh_user);
        for (k, v) in &defaults.tags {
            self.tags.entry(k.clone()).or_insert_with(|| v.clone());
        }
        self
    }

    /// Checks every field's form; errors name the field in camelCase (`subnetId`,
    /// `securityGroupIds[1]`, `tags.Owner`).
    pub fn validate(&self) -> Result<()> {
        if let Some(subnet) = &self.subnet_id {
            check_resource_id("subnetId", "subnet", subnet)?;
        }
        if let Some(groups) = &self.security_group_ids {
            if groups.is_empty() {
                return Err(Error::invalid_spec(
                    "securityGroupIds",
                    "is empty; leave it out for the VPC's default group",
                ));
            }
            for (i, g) in groups.iter().enumerate() {
                check_resource_id(&format!("securityGroupIds[{i}]"), "sg", g)?;
            }
        }
        if let Some(key) = &self.key_name
            && (key.is_empty() || key.len() > 255 || !key.is_ascii())
        {
            return Err(Error::invalid_spec(
                "keyName",
                format!(
                    "{} is not a key pair name (1-255 ASCII characters)",
                    shown(key)
                ),
            ));
        }
        if let Some(profile) = &self.instance_profile {
            check_instance_profile(profile)?;
        }
        if let Some(zone) = &self.availability_zone {
            check_zone(zone)?;
        }
        if let Some(root) = &self.root_volume {
            root.validate().map_err(|e| e.within("rootVolume"))?;
        }
        if let Some(user) = &self.ssh_user
            && (user.is_empty()
                || !user
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            return Err(Error::invalid_spec(
                "sshUser",
                format!("{} is not a valid user name", shown(user)),
            ));
        }
        for (k, v) in &self.tags {
            check_tag(&format!("tags.{}", shown_key(k)), k, v)?;
        }
        Ok(())
    }
}

impl RootVolume {
    /// Checks size, type and device name; errors name `sizeGiB`, `type` or `deviceName`.
    pub fn validate(&self) -> Result<()> {
        if !(1..=16384).contains(&self.size_gib) {
            return Err(Error::invalid_spec(
                "sizeGiB",
                format!("{} GiB is outside EBS's 1-16384 GiB", self.size_gib),
            ));
        }
        if let Some(t) = &self.volume_type
            && !VOLUME_TYPES.contains(&t.as_str())
        {
            return Err(Error::invalid_spec(
                "type",
                format!(
                    "{} is not an EBS volume type (one of {VOLUME_TYPES:?})",
                    shown(t)
                ),
            ));
        }
        if let Some(d) = &self.device_name
            && (!d.starts_with("/dev/") || d.len() <= 5)
        {
            return Err(Error::invalid_spec(
                "deviceName",
                format!("{} is not a device name like /dev/xvda", shown(d)),
            ));
        }
        Ok(())
    }
}

/// Checks an EC2 resource id: `<prefix>-` and 8 or 17 lowercase hex digits.
pub fn check_resource_id(field: &str, prefix: &str, id: &str) -> Result<()> {
    let hex = id
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('-'));
    let ok = hex.is_some_and(|h| {
        (h.len() == 8 || h.len() == 17)
            && h.chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    });
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_spec(
            field,
            format!(
                "{} is not a {prefix} id ({prefix}- and 8 or 17 hex digits)",
                shown(id)
            ),
        ))
    }
}

/// Checks an image reference: an AMI id, or a Systems Manager parameter as
/// `resolve:ssm:/path` (which EC2 resolves at launch). Errors name `image`.
pub fn check_image(image: &str) -> Result<()> {
    if image.trim().is_empty() {
        return Err(Error::invalid_spec(
            "image",
            "is empty; give an AMI id (ami-...) or resolve:ssm:<parameter>",
        ));
    }
    if let Some(param) = image.strip_prefix("resolve:ssm:") {
        if param.is_empty() || param.chars().any(char::is_whitespace) {
            return Err(Error::invalid_spec(
                "image",
                format!("{} names no SSM parameter", shown(image)),
            ));
        }
        return Ok(());
    }
    check_resource_id("image", "ami", image)
}

/// Checks an instance type's form (`t3.micro`, `m7g.2xlarge`); errors name `size`.
pub fn check_instance_type(t: &str) -> Result<()> {
    let ok = match t.split_once('.') {
        Some((family, size)) => {
            let part = |s: &str| {
                !s.is_empty()
                    && s.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            };
            part(family) && part(size)
        }
        None => false,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_spec(
            "size",
            format!("{} is not an instance type like t3.micro", shown(t)),
        ))
    }
}

fn check_instance_profile(profile: &str) -> Result<()> {
    let ok = if let Some(rest) = profile.strip_prefix("arn:") {
        rest.contains(":instance-profile/")
    } else {
        !profile.is_empty()
            && profile.len() <= 128
            && profile
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+=,.@-_".contains(c))
    };
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_spec(
            "instanceProfile",
            format!(
                "{} is neither an instance profile name nor its ARN",
                shown(profile)
            ),
        ))
    }
}

fn check_zone(zone: &str) -> Result<()> {
    // A region name followed by a zone letter: us-east-1a, eu-central-1b.
    let ok = zone.len() > 2
        && zone.ends_with(|c: char| c.is_ascii_lowercase())
        && crate::config::check_region(&zone[..zone.len() - 1]).is_ok();
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_spec(
            "availabilityZone",
            format!(
                "{} is not an availability zone like us-east-1a",
                shown(zone)
            ),
        ))
    }
}

/// Checks one tag against EC2's limits: key 1-128 characters not starting with the
/// reserved `aws:`, value at most 256 characters. Errors name `field`.
pub fn check_tag(field: &str, key: &str, value: &str) -> Result<()> {
    let key_len = key.chars().count();
    if key_len == 0 || key_len > MAX_TAG_KEY_LEN {
        return Err(Error::invalid_spec(
            field,
            format!("tag key is {key_len} characters; EC2 allows 1-{MAX_TAG_KEY_LEN}"),
        ));
    }
    if key.to_ascii_lowercase().starts_with("aws:") {
        return Err(Error::invalid_spec(
            field,
            "tag keys starting with \"aws:\" are reserved for AWS",
        ));
    }
    let value_len = value.chars().count();
    if value_len > MAX_TAG_VALUE_LEN {
        return Err(Error::invalid_spec(
            field,
            format!("tag value is {value_len} characters; EC2 allows at most {MAX_TAG_VALUE_LEN}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use machine_core::{ErrorKind, MachineName};
    use serde_json::json;

    fn settings_in(provider: serde_json::Value) -> Result<Ec2Settings> {
        let spec = MachineSpec::new(MachineName::new("m").unwrap()).with_provider(provider);
        Ec2Settings::from_spec(&spec)
    }

    #[test]
    fn spec_settings_are_read_in_camel_case() {
        let s = settings_in(json!({
            "subnetId": "subnet-0a1b2c3d4e5f60718",
            "securityGroupIds": ["sg-12345678"],
            "keyName": "ops",
            "instanceProfile": "arn:aws:iam::123456789012:instance-profile/node",
            "rootVolume": {"sizeGiB": 20, "type": "gp3"},
            "tags": {"CostCenter": "42"}
        }))
        .unwrap();
        assert_eq!(s.subnet_id.as_deref(), Some("subnet-0a1b2c3d4e5f60718"));
        assert_eq!(s.root_volume.unwrap().size_gib, 20);
        assert_eq!(
            settings_in(serde_json::Value::Null).unwrap(),
            Ec2Settings::default()
        );
    }

    #[test]
    fn unknown_and_mistyped_fields_are_named_by_path() {
        let e = settings_in(json!({"subnetID": "subnet-12345678"})).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec);
        assert_eq!(e.field(), Some("provider.subnetID"), "{e}");
        assert!(e.message().contains("unknown field"), "{e}");
        let e = settings_in(json!({"rootVolume": {"sizeGiB": "big"}})).unwrap_err();
        assert_eq!(e.field(), Some("provider.rootVolume.sizeGiB"), "{e}");
        let e = settings_in(json!({"rootVolume": {"sizeGiB": 8, "iops": 3}})).unwrap_err();
        assert_eq!(e.field(), Some("provider.rootVolume.iops"), "{e}");
        let e = settings_in(json!("subnet-12345678")).unwrap_err();
        assert_eq!(e.field(), Some("provider"), "{e}");
    }

    #[test]
    fn malformed_ids_are_refused_naming_the_field() {
        for (value, field) in [
            (json!({"subnetId": "subnet-xyz"}), "provider.subnetId"),
            (json!({"subnetId": "sg-12345678"}), "provider.subnetId"),
            (
                json!({"securityGroupIds": ["sg-12345678", "default"]}),
                "provider.securityGroupIds[1]",
            ),
            (json!({"securityGroupIds": []}), "provider.securityGroupIds"),
            (
                json!({"instanceProfile": "a role"}),
                "provider.instanceProfile",
            ),
            (
                json!({"availabilityZone": "mars-1a"}),
                "provider.availabilityZone",
            ),
            (
                json!({"rootVolume": {"sizeGiB": 0}}),
                "provider.rootVolume.sizeGiB",
            ),
            (
                json!({"rootVolume": {"sizeGiB": 8, "type": "ssd"}}),
                "provider.rootVolume.type",
            ),
            (
                json!({"rootVolume": {"sizeGiB": 8, "deviceName": "xvda"}}),
                "provider.rootVolume.deviceName",
            ),
            (json!({"keyName": ""}), "provider.keyName"),
        ] {
            let e = settings_in(value.clone()).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{value}");
            assert_eq!(e.field(), Some(field), "{value}: {e}");
        }
    }

    #[test]
    fn tags_over_ec2_limits_are_refused() {
        let long_key = "k".repeat(129);
        let e = settings_in(json!({"tags": {long_key.clone(): "v"}})).unwrap_err();
        assert_eq!(
            e.field(),
            Some(format!("provider.tags.{}…", &long_key[..64]).as_str())
        );
        assert!(e.message().contains("1-128"), "{e}");
        let e = settings_in(json!({"tags": {"k": "v".repeat(257)}})).unwrap_err();
        assert_eq!(e.field(), Some("provider.tags.k"));
        assert!(e.message().contains("256"), "{e}");
        let e = settings_in(json!({"tags": {"aws:x": "v"}})).unwrap_err();
        assert!(e.message().contains("reserved"), "{e}");
        // The limits themselves are accepted.
        settings_in(json!({"tags": {"k".repeat(128): "v".repeat(256)}})).unwrap();
    }

    #[test]
    fn images_and_instance_types_are_checked() {
        check_image("ami-760aaa0f").unwrap();
        check_image("ami-0123456789abcdef0").unwrap();
        check_image("resolve:ssm:/aws/service/debian/release/12/latest/amd64").unwrap();
        for bad in ["", "  ", "debian-12", "ami-XYZ", "resolve:ssm:"] {
            assert_eq!(
                check_image(bad).unwrap_err().field(),
                Some("image"),
                "{bad:?}"
            );
        }
        check_instance_type("t3.micro").unwrap();
        check_instance_type("m7g.2xlarge").unwrap();
        for bad in ["", "t3", "T3.micro", "t3.", "t3 micro"] {
            assert_eq!(
                check_instance_type(bad).unwrap_err().field(),
                Some("size"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn spec_settings_win_over_defaults_and_tags_merge() {
        let defaults = Ec2Settings {
            subnet_id: Some("subnet-11111111".into()),
            key_name: Some("default-key".into()),
            tags: BTreeMap::from([("a".into(), "1".into()), ("b".into(), "1".into())]),
            ..Ec2Settings::default()
        };
        let own = Ec2Settings {
            key_name: Some("mine".into()),
            tags: BTreeMap::from([("b".into(), "2".into())]),
            ..Ec2Settings::default()
        };
        let merged = own.or_defaults(&defaults);
        assert_eq!(merged.subnet_id.as_deref(), Some("subnet-11111111"));
        assert_eq!(merged.key_name.as_deref(), Some("mine"));
        assert_eq!(merged.tags["a"], "1");
        assert_eq!(merged.tags["b"], "2");
    }
}
