//! [`CloudConfigLayer`]: one team's contribution to a machine's user data (a
//! cloud-config plus scripts, boothooks and Jinja parts), usable directly as a coupled
//! [`CoupledSoftware, Software`].

use std::fmt;

use machine_core::{
    CoupledSoftware, Error, MachineSpec, Result, Software, UserDataFormat, UserDataPart,
    check_dns_label,
};

use crate::check_view::render_view;
use crate::merge::MERGE_TYPE;
use crate::model::CloudConfig;
use crate::render::render_unchecked;
use crate::secret::summary;
use crate::validate::validate_with;

/// One part of a layer besides its cloud-config. Debug shows the kind, file name and
/// the content's size and hash: a script may carry a token.
#[derive(Clone, PartialEq)]
pub enum LayerPart {
    /// A script run once, late in the first boot (`text/x-shellscript`).
    ShellScript {
        /// File name cloud-init stores it under.
        filename: String,
        /// The script, beginning with `#!`.
        script: String,
    },
    /// A boothook run early on every boot (`text/cloud-boothook`).
    Boothook {
        /// File name.
        filename: String,
        /// The script.
        script: String,
    },
    /// A Jinja template cloud-init renders on the machine with its instance data
    /// (`text/jinja2`), beginning with `## template: jinja`.
    Jinja2 {
        /// File name.
        filename: String,
        /// The template.
        template: String,
        /// Whether the composer's checks see the template as setting nothing (added with
        /// [`CloudConfigLayer::with_jinja2_unchecked`]) rather than through a rendering
        /// with stand-in instance data.
        unchecked: bool,
    },
}

/// A layer of cloud-init user data: a typed cloud-config (validated on construction)
/// and optional extra parts.
///
/// Debug shows the name, parts' names, sizes and hashes, never content: the rendered
/// document holds password hashes, host private keys and secret files in clear.
///
/// As a [`CoupledSoftware, Software`] it is coupled only: its parts go into the machine's
/// user data, each cloud-config part carrying the `Merge-Type` header
/// ([`MERGE_TYPE`]) so that cloud-init merges several layers instead of letting the
/// last one win. Use [`crate::Bootstrap`] to combine layers into one document with
/// conflicts checked up front.
///
/// ```
/// use std::sync::Arc;
/// use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, User, WriteFile};
/// use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
/// use machine_core::{CancellationToken, Composer, MachineName, MachineSpec, Phase, SentinelFile};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> machine_core::Result<()> {
/// let config = CloudConfig::new()
///     .with_user(User::admin("ops", ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOps ops@laptop".to_owned()]))
///     .with_file(WriteFile::new("/etc/motd", "managed by cloud-init\n"))
///     .with_runcmd("systemctl enable --now nginx");
/// let base = CloudConfigLayer::new("base", config)?;
///
/// let cloud = SimCloud::new();
/// let provider = Arc::new(SimProvider::new(cloud.clone(), SimConfig::default())?);
/// let composer = Composer::builder(provider)
///     .coupled(Arc::new(base))
///     .connector(Arc::new(SimConnector::new(cloud.clone())))
///     .completion(Arc::new(SentinelFile::default()))
///     .build()?;
/// let spec = MachineSpec::new(MachineName::new("web-1")?);
/// let user_data = composer.user_data(&spec)?.expect("user data");
/// assert!(String::from_utf8(user_data.decoded()?).unwrap().contains("#cloud-config"));
/// let done = composer.provision(&spec, &CancellationToken::new()).await?;
/// assert_eq!(done.machine.phase, Phase::Ready);
/// let host = cloud.host(&done.machine.provider_id).unwrap();
/// assert!(host.file_text("/var/lib/cloud/instance/user-data.txt").is_some());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct CloudConfigLayer {
    name: String,
    config: CloudConfig,
    parts: Vec<LayerPart>,
    system_users: Vec<String>,
    /// The config rendered once at construction: layers are built once and used for
    /// many machines, and the config cannot change afterwards.
    rendered: std::sync::Arc<str>,
}

impl fmt::Debug for LayerPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, filename, content) = match self {
            LayerPart::ShellScript { filename, script } => ("ShellScript", filename, script),
            LayerPart::Boothook { filename, script } => ("Boothook", filename, script),
            LayerPart::Jinja2 {
                filename, template, ..
            } => ("Jinja2", filename, template),
        };
        f.debug_struct(kind)
            .field("filename", filename)
            .field("content", &summary(content.as_bytes()))
            .finish()
    }
}

impl fmt::Debug for CloudConfigLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CloudConfigLayer")
            .field("name", &self.name)
            .field("cloud_config", &summary(self.rendered.as_bytes()))
            .field("parts", &self.parts)
            .field("system_users", &self.system_users)
            .finish()
    }
}

impl CloudConfigLayer {
    /// A layer named `name` (a DNS label) holding `config`, which is validated now:
    /// an invalid config is an invalid-spec error naming the field.
    pub fn new(name: impl Into<String>, config: CloudConfig) -> Result<Self> {
        Self::with_system_users(name, config, Vec::new())
    }

    /// Like [`CloudConfigLayer::new`], also accepting `system_users` (accounts the
    /// image has before cloud-init runs, or that another layer creates) as file owners.
    pub fn with_system_users(
        name: impl Into<String>,
        config: CloudConfig,
        system_users: Vec<String>,
    ) -> Result<Self> {
        let name = name.into();
        check_dns_label("layer.name", &name)?;
        validate_with(&config, &system_users).map_err(|e| e.within(&format!("layer {name}")))?;
        let rendered = render_unchecked(&config)?.into();
        Ok(CloudConfigLayer {
            name,
            config,
            parts: Vec::new(),
            system_users,
            rendered,
        })
    }

    /// Adds a shell script part; it must begin with `#!`.
    pub fn with_script(
        mut self,
        filename: impl Into<String>,
        script: impl Into<String>,
    ) -> Result<Self> {
        let (filename, script) = (filename.into(), script.into());
        check_part(&self.name, &filename, &script, "#!", "a script")?;
        self.parts.push(LayerPart::ShellScript { filename, script });
        Ok(self)
    }

    /// Adds a boothook part; it must begin with `#!` or `#cloud-boothook`.
    pub fn with_boothook(
        mut self,
        filename: impl Into<String>,
        script: impl Into<String>,
    ) -> Result<Self> {
        let (filename, script) = (filename.into(), script.into());
        let prefix = if script.starts_with("#cloud-boothook") {
            "#cloud-boothook"
        } else {
            "#!"
        };
        check_part(&self.name, &filename, &script, prefix, "a boothook")?;
        self.parts.push(LayerPart::Boothook { filename, script });
        Ok(self)
    }

    /// Adds a Jinja part cloud-init renders on the machine; it must begin with
    /// `## template: jinja`.
    ///
    /// The composer checks it against the other layers through a rendering with stand-in
    /// instance data: the machine's name as `v1.local_hostname` (and its aliases),
    /// placeholders for what only the machine knows, anything else empty. So a template
    /// setting `hostname` conflicts with another layer's `hostname` as it would on the
    /// machine. A template that cannot be rendered so is refused here; add it with
    /// [`CloudConfigLayer::with_jinja2_unchecked`] if it sets nothing another layer sets.
    pub fn with_jinja2(
        self,
        filename: impl Into<String>,
        template: impl Into<String>,
    ) -> Result<Self> {
        self.add_jinja2(filename.into(), template.into(), false)
    }

    /// Adds a Jinja part that the composer's checks see as setting nothing: for a
    /// template that cannot be rendered without the machine's real instance data, and
    /// that its author knows sets no key, user, file or host key another layer sets.
    /// Its merge settings are still refused.
    pub fn with_jinja2_unchecked(
        self,
        filename: impl Into<String>,
        template: impl Into<String>,
    ) -> Result<Self> {
        self.add_jinja2(filename.into(), template.into(), true)
    }

    fn add_jinja2(mut self, filename: String, template: String, unchecked: bool) -> Result<Self> {
        check_part(
            &self.name,
            &filename,
            &template,
            "## template: jinja",
            "a cloud-init Jinja template",
        )?;
        if !unchecked {
            render_view(&template, "check-view")
                .map_err(|e| e.within(&format!("layer {}.parts.{filename}", self.name)))?;
        }
        self.parts.push(LayerPart::Jinja2 {
            filename,
            template,
            unchecked,
        });
        Ok(self)
    }

    /// The layer's name.
    pub fn layer_name(&self) -> &str {
        &self.name
    }

    /// The layer's cloud-config.
    pub fn config(&self) -> &CloudConfig {
        &self.config
    }

    /// The layer's other parts.
    pub fn extra_parts(&self) -> &[LayerPart] {
        &self.parts
    }

    pub(crate) fn system_users(&self) -> &[String] {
        &self.system_users
    }

    /// The layer's cloud-config rendered as a `#cloud-config` document.
    pub fn render(&self) -> Result<String> {
        Ok(self.rendered.to_string())
    }

    /// Bytes of the layer's own parts (its cloud-config and the others), uncompressed.
    pub fn size(&self) -> usize {
        let config = if self.config == CloudConfig::default() {
            0
        } else {
            self.rendered.len()
        };
        config
            + self
                .parts
                .iter()
                .map(|p| match p {
                    LayerPart::ShellScript { script, .. } | LayerPart::Boothook { script, .. } => {
                        script.len()
                    }
                    LayerPart::Jinja2 { template, .. } => template.len(),
                })
                .sum::<usize>()
    }

    /// The layer's user-data parts: the cloud-config (when not empty) with the
    /// `Merge-Type` header, then the other parts in the order added. File names start
    /// with the layer's name, so size errors and reports name the layer. Jinja parts
    /// carry check views rendered for a machine named `check-view`; the composer asks
    /// for them per machine ([`CoupledSoftware::user_data_parts`]).
    pub fn parts(&self) -> Result<Vec<UserDataPart>> {
        self.parts_for("check-view")
    }

    pub(crate) fn parts_for(&self, machine: &str) -> Result<Vec<UserDataPart>> {
        let mut out = Vec::with_capacity(1 + self.parts.len());
        if self.config != CloudConfig::default() {
            out.push(
                UserDataPart::new(
                    UserDataFormat::CloudConfig,
                    format!("{}.cloud-config.yaml", self.name),
                    self.render()?,
                )
                .with_header("Merge-Type", MERGE_TYPE),
            );
        }
        for part in self.other_parts(machine) {
            out.push(part?);
        }
        Ok(out)
    }

    /// The parts besides the cloud-config; Jinja parts with their check views for a
    /// machine named `machine`.
    pub(crate) fn other_parts<'a>(
        &'a self,
        machine: &'a str,
    ) -> impl Iterator<Item = Result<UserDataPart>> + 'a {
        self.parts.iter().map(move |p| {
            Ok(match p {
                LayerPart::ShellScript { filename, script } => UserDataPart::new(
                    UserDataFormat::ShellScript,
                    format!("{}.{filename}", self.name),
                    script.clone(),
                ),
                LayerPart::Boothook { filename, script } => UserDataPart::new(
                    UserDataFormat::CloudBoothook,
                    format!("{}.{filename}", self.name),
                    script.clone(),
                ),
                // cloud-init hands the rendered template, with this part's headers, to the
                // handler of what it rendered to: a cloud-config needs the merge header too.
                LayerPart::Jinja2 {
                    filename,
                    template,
                    unchecked,
                } => {
                    let view = if *unchecked {
                        b"#cloud-config\n".to_vec()
                    } else {
                        render_view(template, machine).map_err(|e| {
                            e.within(&format!("layer {}.parts.{filename}", self.name))
                        })?
                    };
                    UserDataPart::new(
                        UserDataFormat::Jinja2,
                        format!("{}.{filename}", self.name),
                        template.clone(),
                    )
                    .with_header("Merge-Type", MERGE_TYPE)
                    .with_check_view(view)
                }
            })
        })
    }
}

fn check_part(layer: &str, filename: &str, content: &str, prefix: &str, what: &str) -> Result<()> {
    if filename.is_empty() || filename.contains(['/', '\0', '"', '\n', '\r']) {
        return Err(Error::invalid_spec(
            format!("layer {layer}.parts.{filename}"),
            "a part's file name must be a plain file name",
        ));
    }
    if !content.starts_with(prefix) {
        return Err(Error::invalid_spec(
            format!("layer {layer}.parts.{filename}"),
            format!("{what} must begin with {prefix:?}"),
        ));
    }
    Ok(())
}

impl Software for CloudConfigLayer {
    fn name(&self) -> &str {
        &self.name
    }
}

/// Coupled only: cloud-init applies it at first boot.
impl CoupledSoftware for CloudConfigLayer {
    fn user_data_parts(&self, spec: &MachineSpec) -> Result<Vec<UserDataPart>> {
        self.parts_for(spec.name.as_str())
    }

    /// The public halves of the layer's `ssh_keys`, so that the composer pins the host
    /// keys this layer installs.
    fn host_keys(&self, _spec: &MachineSpec) -> Result<Vec<String>> {
        let Some(keys) = &self.config.ssh_keys else {
            return Ok(Vec::new());
        };
        Ok([&keys.ed25519_public, &keys.ecdsa_public, &keys.rsa_public]
            .into_iter()
            .flatten()
            .cloned()
            .collect())
    }
}
