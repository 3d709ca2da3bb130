//! [`Bootstrap`]: several layers (base OS team, platform team, application team) made
//! into one machine's user data, merged or as a multipart, fitted to the provider's
//! budget, with a size report per layer.

use std::fmt;

use machine_core::user_data::{assemble, fit};
use machine_core::{
    ContentEncoding, CoupledSoftware, Error, MachineSpec, Result, Software, UserData,
    UserDataDelivery, UserDataFormat, UserDataPart, check_dns_label,
};

use crate::layer::CloudConfigLayer;
use crate::merge::{MERGE_TYPE, merge};
use crate::model::CloudConfig;
use crate::render::render_unchecked;
use crate::secret::summary;
use crate::validate::validate_with;

/// How several layers become user data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Output {
    /// One cloud-config merged here (conflicts refused), followed by the layers' other
    /// parts; a single `#cloud-config` document when there are none.
    #[default]
    Merged,
    /// One cloud-config part per layer, each with the `Merge-Type` header, for
    /// cloud-init to merge; like `cloud-init devel make-mime`.
    Multipart,
}

/// Layers combined into one machine's user data. Whatever the [`Output`], the layers
/// are merged here first, so a conflict, a duplicate user or a file owned by a user no
/// layer creates is an error before any API call.
///
/// ```
/// use bootstrap_cloudinit::{Bootstrap, CloudConfig, CloudConfigLayer, Output, User};
/// let base = CloudConfigLayer::new("base", CloudConfig::new().with_package("curl"))?;
/// let app = CloudConfigLayer::new("app", CloudConfig::new().with_runcmd("echo ready"))?;
/// let bootstrap = Bootstrap::new("web", vec![base, app])?.output(Output::Merged);
/// let doc = bootstrap.render_merged()?;
/// assert!(doc.starts_with("#cloud-config\n"));
/// # Ok::<(), machine_core::Error>(())
/// ```
///
/// Debug shows names, sizes and hashes only (see [`CloudConfigLayer`]).
#[derive(Clone)]
pub struct Bootstrap {
    name: String,
    layers: Vec<CloudConfigLayer>,
    output: Output,
    merged: CloudConfig,
}

impl fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let merged = render_unchecked(&self.merged)
            .map(|doc| summary(doc.as_bytes()))
            .unwrap_or_else(|_| "not renderable".to_owned());
        f.debug_struct("Bootstrap")
            .field("name", &self.name)
            .field("layers", &self.layers)
            .field("output", &self.output)
            .field("merged", &merged)
            .finish()
    }
}

impl Bootstrap {
    /// Combines `layers` in order under `name` (a DNS label); merges and validates now.
    pub fn new(name: impl Into<String>, layers: Vec<CloudConfigLayer>) -> Result<Self> {
        let name = name.into();
        check_dns_label("bootstrap.name", &name)?;
        for (i, l) in layers.iter().enumerate() {
            if layers[..i].iter().any(|o| o.layer_name() == l.layer_name()) {
                return Err(Error::invalid_spec(
                    format!("bootstrap.layers[{i}].name"),
                    format!("layer name {:?} is used twice", l.layer_name()),
                ));
            }
        }
        let merged = merge(layers.iter().map(|l| (l.layer_name(), l.config())))?;
        let system: Vec<String> = layers
            .iter()
            .flat_map(|l| l.system_users().iter().cloned())
            .collect();
        validate_with(&merged, &system)?;
        Ok(Bootstrap {
            name,
            layers,
            output: Output::Merged,
            merged,
        })
    }

    /// Sets the output form.
    pub fn output(mut self, output: Output) -> Self {
        self.output = output;
        self
    }

    /// The layers.
    pub fn layers(&self) -> &[CloudConfigLayer] {
        &self.layers
    }

    /// The merged cloud-config.
    pub fn merged(&self) -> &CloudConfig {
        &self.merged
    }

    /// The merged cloud-config as one `#cloud-config` document.
    pub fn render_merged(&self) -> Result<String> {
        render_unchecked(&self.merged)
    }

    /// The user-data parts in the chosen [`Output`] form.
    pub fn parts(&self) -> Result<Vec<UserDataPart>> {
        self.parts_for("check-view")
    }

    /// The parts, Jinja parts with check views rendered for a machine named `machine`.
    fn parts_for(&self, machine: &str) -> Result<Vec<UserDataPart>> {
        let mut parts = Vec::new();
        match self.output {
            Output::Merged => {
                if self.merged != CloudConfig::default() {
                    let mut part = UserDataPart::new(
                        UserDataFormat::CloudConfig,
                        format!("{}.cloud-config.yaml", self.name),
                        self.render_merged()?,
                    );
                    if self.layers.iter().any(|l| !l.extra_parts().is_empty()) {
                        part = part.with_header("Merge-Type", MERGE_TYPE);
                    }
                    parts.push(part);
                }
                for l in &self.layers {
                    for part in l.other_parts(machine) {
                        parts.push(part?);
                    }
                }
            }
            Output::Multipart => {
                for l in &self.layers {
                    parts.extend(l.parts_for(machine)?);
                }
            }
        }
        Ok(parts)
    }

    /// Assembles the parts and fits them to `delivery`: gzip when over the limit and
    /// accepted (the provider applies base64 itself, counted as
    /// [`UserDataDelivery::size_basis`] says); still over the limit is an invalid-spec
    /// error naming the sizes and the largest parts. Nothing is sent anywhere.
    pub fn build(&self, delivery: &UserDataDelivery) -> Result<Built> {
        let parts = self.parts()?;
        let Some(assembled) = assemble(&parts)? else {
            return Err(Error::invalid_spec(
                format!("bootstrap {}", self.name),
                "no layer contributes anything",
            ));
        };
        let assembled_len = assembled.bytes.len();
        let user_data = fit(assembled, &parts, delivery)?;
        let layers = self
            .layers
            .iter()
            .map(|l| (l.layer_name().to_owned(), l.size()))
            .collect();
        let report = SizeReport {
            layers,
            assembled: assembled_len,
            format: user_data.format,
            encoding: user_data.encoding,
            final_bytes: user_data.bytes.len(),
            counted: delivery.size_basis.counted(user_data.bytes.len()),
            limit: delivery.max_bytes,
        };
        tracing::debug!(bootstrap = %self.name, report = %report, "user data built");
        Ok(Built { user_data, report })
    }
}

/// User data ready for a provider, and its size report.
#[derive(Debug, Clone)]
pub struct Built {
    /// The user data (Debug shows only its size and hash).
    pub user_data: UserData,
    /// Sizes, safe to log.
    pub report: SizeReport,
}

/// Where the bytes of a machine's user data come from. Holds sizes only, never
/// content, so it is safe to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeReport {
    /// Each layer's name and the bytes of its own parts, uncompressed.
    pub layers: Vec<(String, usize)>,
    /// Bytes of the assembled document before compression.
    pub assembled: usize,
    /// The format of the final user data.
    pub format: UserDataFormat,
    /// The compression applied.
    pub encoding: ContentEncoding,
    /// Bytes of the final user data.
    pub final_bytes: usize,
    /// Bytes counted against the provider's limit (base64 size where it counts that).
    pub counted: usize,
    /// The provider's limit.
    pub limit: usize,
}

impl fmt::Display for SizeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} user data: {} B assembled, {} B {:?}, {} of {} B counted",
            self.format, self.assembled, self.final_bytes, self.encoding, self.counted, self.limit
        )?;
        for (name, bytes) in &self.layers {
            write!(f, "; layer {name}: {bytes} B")?;
        }
        Ok(())
    }
}

impl Software for Bootstrap {
    fn name(&self) -> &str {
        &self.name
    }
}

/// Coupled only: cloud-init applies it at first boot.
impl CoupledSoftware for Bootstrap {
    fn user_data_parts(&self, spec: &MachineSpec) -> Result<Vec<UserDataPart>> {
        self.parts_for(spec.name.as_str())
    }

    /// Every layer's host keys, so that the composer pins what the merged document
    /// installs.
    fn host_keys(&self, spec: &MachineSpec) -> Result<Vec<String>> {
        let mut keys = Vec::new();
        for layer in &self.layers {
            keys.extend(layer.host_keys(spec)?);
        }
        Ok(keys)
    }
}
