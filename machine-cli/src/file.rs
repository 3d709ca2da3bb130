//! The fleet file: where the machines come from (`provider`), what runs on them
//! (`layers`) and how many of which (`set`, a [`MachineSet`]). See the crate README for
//! the format with an example.
//!
//! Read in two passes so that every error names its field and line: the first pass
//! reads only `provider.kind`; the second reads the whole document with the settings of
//! that kind, refusing unknown keys everywhere.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, CloudInitStatus};
use machine_core::fleet::MachineSet;
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    CompletionCheck, ComposerSettings, CoupledSoftware, DecoupledSoftware, Error, Result,
    SentinelFile, at_document_line,
};
use serde::Deserialize;

/// The largest fleet file read: 4 MiB (a fleet file describes one set, not its machines).
pub const MAX_FLEET_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Label keys the CLI stamps on machines (what each was made from, field by field, so
/// that a plan names what differs) begin with this; a template may not use it.
pub const LABEL_PREFIX: &str = "machines/";

/// A fleet file, read and checked. Debug shows names and counts only: layer contents
/// and settings may hold secrets.
pub struct FleetFile {
    /// Where it was read from.
    pub path: PathBuf,
    /// Where the machines come from.
    pub provider: ProviderSettings,
    /// The composer's settings (deadlines, poll interval).
    pub settings: ComposerSettings,
    /// How a machine with coupled layers says its user data finished.
    pub completion: Completion,
    /// The software, in order.
    pub layers: Vec<FleetLayer>,
    /// The desired state.
    pub set: MachineSet,
    /// The text it was read from, to place the errors found later (it may hold secrets:
    /// never shown).
    pub(crate) text: String,
}

impl fmt::Debug for FleetFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetFile")
            .field("path", &self.path)
            .field("provider", &self.provider)
            .field("completion", &self.completion)
            .field("layers", &self.layers)
            .field("set", &self.set.name)
            .field("replicas", &self.set.replicas)
            .finish_non_exhaustive()
    }
}

/// The providers a fleet file may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// The built-in simulator, kept in a state file between runs.
    Sim,
    /// EC2 (provider-aws).
    Aws,
    /// vCenter (provider-vsphere).
    Vsphere,
    /// Redfish BMCs (provider-baremetal).
    Redfish,
    /// Real machines on this host (provider-local).
    Local,
}

impl ProviderKind {
    fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Sim => "sim",
            ProviderKind::Aws => "aws",
            ProviderKind::Vsphere => "vsphere",
            ProviderKind::Redfish => "redfish",
            ProviderKind::Local => "local",
        }
    }
}

/// The provider's settings, by kind. Only the simulator is wired into this build.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ProviderSettings {
    /// The built-in simulator.
    Sim(SimSettings),
}

impl ProviderSettings {
    /// The kind, as the file names it.
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderSettings::Sim(_) => ProviderKind::Sim.as_str(),
        }
    }
}

/// `provider: {kind: sim, ...}`: the simulator, its machines kept in a state file so
/// that every run of the CLI sees the same ones.
#[derive(Debug, Clone, PartialEq)]
pub struct SimSettings {
    /// The state file (relative paths are taken from the fleet file's folder).
    pub state: PathBuf,
    /// The owner tag of the machines.
    pub owner: String,
    /// Time from create to running.
    pub boot_latency: Duration,
    /// Random extra boot time, up to this.
    pub boot_jitter: Duration,
    /// Time from delete to gone.
    pub delete_latency: Duration,
    /// Share of machines that fail to boot (0.0 to 1.0).
    pub boot_failure_rate: f64,
    /// Time each command or file transfer over the simulated transport takes.
    pub transport_latency: Duration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SimDoc {
    #[allow(dead_code)]
    kind: ProviderKind,
    #[serde(default)]
    state: Option<PathBuf>,
    #[serde(default = "default_owner")]
    owner: String,
    #[serde(default = "default_boot_latency", with = "humantime_serde")]
    boot_latency: Duration,
    #[serde(default = "default_boot_jitter", with = "humantime_serde")]
    boot_jitter: Duration,
    #[serde(default = "default_delete_latency", with = "humantime_serde")]
    delete_latency: Duration,
    #[serde(default)]
    boot_failure_rate: f64,
    #[serde(default = "default_transport_latency", with = "humantime_serde")]
    transport_latency: Duration,
}

fn default_owner() -> String {
    "machines".to_owned()
}
fn default_boot_latency() -> Duration {
    Duration::from_millis(800)
}
fn default_boot_jitter() -> Duration {
    Duration::from_millis(400)
}
fn default_delete_latency() -> Duration {
    Duration::from_millis(200)
}
fn default_transport_latency() -> Duration {
    Duration::from_millis(20)
}

/// The longest simulated latency accepted: an hour.
const MAX_SIM_LATENCY: Duration = Duration::from_secs(3600);

impl SimDoc {
    fn settings(self, file: &Path) -> Result<SimSettings> {
        for (field, d) in [
            ("provider.bootLatency", self.boot_latency),
            ("provider.bootJitter", self.boot_jitter),
            ("provider.deleteLatency", self.delete_latency),
            ("provider.transportLatency", self.transport_latency),
        ] {
            if d > MAX_SIM_LATENCY {
                return Err(Error::invalid_spec(
                    field,
                    format!(
                        "{} is longer than the simulator's longest, {}",
                        humantime::format_duration(d),
                        humantime::format_duration(MAX_SIM_LATENCY)
                    ),
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.boot_failure_rate) {
            return Err(Error::invalid_spec(
                "provider.bootFailureRate",
                format!(
                    "{} is not a share between 0.0 and 1.0",
                    self.boot_failure_rate
                ),
            ));
        }
        machine_core::check_dns_label("provider.owner", &self.owner)?;
        let state = match self.state {
            Some(p) if p.as_os_str().is_empty() => {
                return Err(Error::invalid_spec("provider.state", "is empty"));
            }
            Some(p) => p,
            None => default_state(file),
        };
        let state = if state.is_relative() {
            file.parent().unwrap_or(Path::new(".")).join(state)
        } else {
            state
        };
        Ok(SimSettings {
            state,
            owner: self.owner,
            boot_latency: self.boot_latency,
            boot_jitter: self.boot_jitter,
            delete_latency: self.delete_latency,
            boot_failure_rate: self.boot_failure_rate,
            transport_latency: self.transport_latency,
        })
    }
}

/// `fleet.yaml` keeps its simulator in `fleet.sim-state.json` beside it.
fn default_state(file: &Path) -> PathBuf {
    let stem = file
        .file_stem()
        .map_or_else(|| "fleet".into(), |s| s.to_string_lossy().into_owned());
    PathBuf::from(format!("{stem}.sim-state.json"))
}

/// How a machine with coupled layers says its user data finished (only asked when there
/// are coupled layers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Completion {
    /// A sentinel file written once every part succeeded (machine-core's
    /// `SentinelFile`); works on the simulator and with any cloud-init.
    #[default]
    Sentinel,
    /// `cloud-init status` over the transport (bootstrap-cloudinit's `CloudInitStatus`).
    CloudInitStatus,
    /// None: a machine is taken as done when it runs (refused with both coupled and
    /// decoupled layers).
    None,
}

impl Completion {
    /// The check, if any.
    pub fn check(self) -> Option<Arc<dyn CompletionCheck>> {
        match self {
            Completion::Sentinel => Some(Arc::new(SentinelFile::default())),
            Completion::CloudInitStatus => Some(Arc::new(CloudInitStatus::new())),
            Completion::None => None,
        }
    }
}

/// Whether a layer goes into user data or over the transport.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerMode {
    /// Rendered into user data at creation: a change needs a new machine.
    #[default]
    Coupled,
    /// Applied over the transport once the machine runs: a change is applied in place.
    Decoupled,
}

impl fmt::Display for LayerMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LayerMode::Coupled => "coupled",
            LayerMode::Decoupled => "decoupled",
        })
    }
}

/// A layer of the file, built.
#[derive(Clone)]
pub struct FleetLayer {
    /// Its name.
    pub name: String,
    /// Its mode.
    pub mode: LayerMode,
    /// What it is made of: `cloudConfig` or `steps`.
    pub source: &'static str,
    /// The layer in its coupled role, when coupled.
    pub coupled: Option<Arc<dyn CoupledSoftware>>,
    /// The layer in its decoupled role, when decoupled.
    pub decoupled: Option<Arc<dyn DecoupledSoftware>>,
}

impl fmt::Debug for FleetLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} {})", self.name, self.mode, self.source)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct LayerDoc {
    name: String,
    #[serde(default)]
    mode: LayerMode,
    #[serde(default)]
    cloud_config: Option<CloudConfig>,
    /// Top-level cloud-config keys outside bootstrap-cloudinit's model to keep.
    #[serde(default)]
    extra_keys: Vec<String>,
    #[serde(default)]
    steps: Option<Vec<StepDoc>>,
    #[serde(default)]
    state_dir: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
enum StepDoc {
    WriteFile(WriteFileDoc),
    Run(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WriteFileDoc {
    path: String,
    content: String,
    #[serde(default)]
    mode: Option<FileMode>,
}

/// A file mode in octal digits, quoted or not (`0644`, `"755"`, `0o600`): read as the
/// scalar's text, since YAML readers disagree on what a bare `0644` is as a number
/// (octal, decimal, a float) and `0o644` would read as 420.
struct FileMode(String);

impl<'de> Deserialize<'de> for FileMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = FileMode;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quoted octal permission mode such as \"0644\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<FileMode, E> {
                Ok(FileMode(v.to_owned()))
            }
        }
        d.deserialize_str(Visitor)
    }
}

impl FileMode {
    fn bits(&self) -> std::result::Result<u32, String> {
        let digits = self.0.trim().trim_start_matches("0o");
        u32::from_str_radix(digits, 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| format!("{digits:?} is not an octal permission mode such as \"0644\""))
    }
}

/// The first pass: only the provider's kind; every other key is read in the second.
#[derive(Deserialize)]
struct KindDoc {
    #[serde(default)]
    provider: Option<KindOnly>,
}

#[derive(Deserialize)]
struct KindOnly {
    kind: ProviderKind,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    rename_all = "camelCase",
    bound(deserialize = "P: Deserialize<'de>")
)]
struct FleetDoc<P> {
    #[serde(default)]
    provider: Option<P>,
    #[serde(default)]
    settings: Option<ComposerSettings>,
    #[serde(default)]
    completion: Completion,
    #[serde(default)]
    layers: Vec<LayerDoc>,
    set: MachineSet,
}

/// Field paths whose values may be secret: an error reading them does not quote them.
pub fn is_secret_field(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    path.ends_with("hashed_passwd")
        || path.ends_with("_private")
        || path.ends_with(".content")
        || path.contains(".content.")
        || ["password", "secret", "token", "credential"]
            .iter()
            .any(|w| lower.contains(w))
}

impl FleetFile {
    /// Reads the fleet file at `path`: missing, not a regular file or over
    /// [`MAX_FLEET_FILE_BYTES`] is refused; see [`FleetFile::from_yaml`].
    pub fn read(path: &Path) -> Result<FleetFile> {
        let bytes = machine_core::read_user_file("file", path, MAX_FLEET_FILE_BYTES)?;
        let text = String::from_utf8(bytes)
            .map_err(|_| Error::invalid_spec("file", format!("{} is not UTF-8", path.display())))?;
        FleetFile::from_yaml(&text, path)
    }

    /// Reads a fleet file's text (`path` only places relative paths); errors are
    /// invalid-spec errors naming the field and its line.
    pub fn from_yaml(yaml: &str, path: &Path) -> Result<FleetFile> {
        FleetFile::parse(yaml, path).map_err(|e| at_document_line(e, yaml))
    }

    fn parse(yaml: &str, path: &Path) -> Result<FleetFile> {
        // Pass 1: the kind (a document that is not a map at all fails here too).
        let first: KindDoc = machine_core::from_yaml_redacting(yaml, is_secret_field)?;
        let kind = first.provider.map_or(ProviderKind::Sim, |p| p.kind);
        let (provider, doc) = match kind {
            ProviderKind::Sim => {
                let mut doc: FleetDoc<SimDoc> =
                    machine_core::from_yaml_redacting(yaml, is_secret_field)?;
                let sim = doc.provider.take().unwrap_or_else(default_sim);
                (ProviderSettings::Sim(sim.settings(path)?), doc)
            }
            other => {
                return Err(Error::invalid_spec(
                    "provider.kind",
                    format!(
                        "{} is not wired into this build of machines, which drives the simulator (kind: sim); the crate README says what wiring another provider takes",
                        other.as_str()
                    ),
                ));
            }
        };
        let settings = match doc.settings {
            Some(s) => {
                s.validate().map_err(|e| e.within("settings"))?;
                s
            }
            // The simulator answers at once: look again sooner than a cloud needs.
            None => ComposerSettings::default().with_poll_interval(match &provider {
                ProviderSettings::Sim(_) => Duration::from_millis(200),
            }),
        };
        let mut layers = Vec::with_capacity(doc.layers.len());
        for (i, l) in doc.layers.into_iter().enumerate() {
            layers.push(build_layer(l).map_err(|e| e.within(&format!("layers[{i}]")))?);
        }
        let set = doc.set;
        set.validate().map_err(|e| e.within("set"))?;
        if let Some(key) = set
            .template
            .labels
            .keys()
            .find(|k| k.starts_with(LABEL_PREFIX))
        {
            return Err(Error::invalid_spec(
                format!("set.template.labels.{}", machine_core::shown_key(key)),
                format!("labels under {LABEL_PREFIX} are stamped by the machines CLI"),
            ));
        }
        Ok(FleetFile {
            path: path.to_owned(),
            provider,
            settings,
            completion: doc.completion,
            layers,
            set,
            text: yaml.to_owned(),
        })
    }
}

fn default_sim() -> SimDoc {
    SimDoc {
        kind: ProviderKind::Sim,
        state: None,
        owner: default_owner(),
        boot_latency: default_boot_latency(),
        boot_jitter: default_boot_jitter(),
        delete_latency: default_delete_latency(),
        boot_failure_rate: 0.0,
        transport_latency: default_transport_latency(),
    }
}

/// A layer in its coupled role, its decoupled role, or (for none) neither.
type Roles = (
    Option<Arc<dyn CoupledSoftware>>,
    Option<Arc<dyn DecoupledSoftware>>,
);

fn build_layer(l: LayerDoc) -> Result<FleetLayer> {
    machine_core::check_dns_label("name", &l.name)?;
    match (l.cloud_config, l.steps) {
        (Some(_), Some(_)) | (None, None) => Err(Error::new(
            machine_core::ErrorKind::InvalidSpec,
            "a layer has either cloudConfig (a cloud-config document) or steps (writeFile, run), exactly one",
        )),
        (Some(config), None) => {
            if l.mode == LayerMode::Decoupled {
                return Err(Error::invalid_spec(
                    "mode",
                    "a cloudConfig layer is coupled (cloud-init reads it at first boot); write decoupled software as steps",
                ));
            }
            if l.state_dir.is_some() {
                return Err(Error::invalid_spec(
                    "stateDir",
                    "is a setting of steps layers",
                ));
            }
            for key in config.extra.keys() {
                if !l.extra_keys.contains(key) {
                    return Err(Error::invalid_spec(
                        format!("cloudConfig.{}", machine_core::shown_key(key)),
                        format!(
                            "is not a key of bootstrap-cloudinit's cloud-config model; list it in extraKeys to keep it as written (the model covers {})",
                            bootstrap_cloudinit::MODELED_KEYS.join(", ")
                        ),
                    ));
                }
            }
            let layer = Arc::new(
                CloudConfigLayer::new(l.name.clone(), config)
                    .map_err(|e| e.within("cloudConfig"))?,
            );
            Ok(FleetLayer {
                name: l.name,
                mode: LayerMode::Coupled,
                source: "cloudConfig",
                coupled: Some(layer),
                decoupled: None,
            })
        }
        (None, Some(steps)) => {
            if !l.extra_keys.is_empty() {
                return Err(Error::invalid_spec(
                    "extraKeys",
                    "is a setting of cloudConfig layers",
                ));
            }
            let mut built = Vec::with_capacity(steps.len());
            for (i, s) in steps.into_iter().enumerate() {
                built.push(match s {
                    StepDoc::Run(command) => Step::run(command),
                    StepDoc::WriteFile(w) => {
                        let mode = match &w.mode {
                            None => 0o644,
                            Some(m) => m.bits().map_err(|why| {
                                Error::invalid_spec(format!("steps[{i}].writeFile.mode"), why)
                            })?,
                        };
                        Step::write_file_mode(w.path, w.content, mode)
                    }
                });
            }
            let mut layer = StepLayer::new(l.name.clone(), built).map_err(step_field)?;
            if let Some(dir) = l.state_dir {
                layer = layer
                    .with_state_dir(dir)
                    .map_err(|e| Error::invalid_spec("stateDir", e.message().to_owned()))?;
            }
            let layer = Arc::new(layer);
            let (coupled, decoupled): Roles = match l.mode {
                LayerMode::Coupled => (Some(layer), None),
                LayerMode::Decoupled => (None, Some(layer)),
            };
            Ok(FleetLayer {
                name: l.name,
                mode: l.mode,
                source: "steps",
                coupled,
                decoupled,
            })
        }
    }
}

/// StepLayer names its fields `layer.steps[i].path`: the file's are `steps[i].writeFile.path`.
fn step_field(e: Error) -> Error {
    let Some(field) = e.field().map(str::to_owned) else {
        return e;
    };
    let field = field.strip_prefix("layer.").unwrap_or(&field).to_owned();
    let field = match field.rsplit_once('.') {
        Some((step, "path" | "mode")) => format!("{step}.writeFile.{}", &field[step.len() + 1..]),
        Some((step, "command")) => format!("{step}.run"),
        _ => field,
    };
    Error::invalid_spec(field, e.message().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "s3cr3t-0f-the-fleet";

    fn read(yaml: &str) -> Result<FleetFile> {
        FleetFile::from_yaml(yaml, Path::new("/srv/fleets/web.yaml"))
    }

    #[test]
    fn the_example_reads_with_the_simulator_beside_it() {
        let text = include_str!("../fleets/web.yaml");
        let f = FleetFile::from_yaml(text, Path::new("fleets/web.yaml")).unwrap();
        let ProviderSettings::Sim(sim) = &f.provider;
        assert_eq!(sim.state, Path::new("fleets/web.sim-state.json"));
        assert_eq!(sim.boot_latency, Duration::from_millis(800));
        assert_eq!(
            f.layers
                .iter()
                .map(|l| (l.name.as_str(), l.mode))
                .collect::<Vec<_>>(),
            [("base", LayerMode::Coupled), ("app", LayerMode::Decoupled)]
        );
        assert_eq!(f.set.replicas, 3);
    }

    #[test]
    fn without_a_provider_it_is_the_simulator_with_its_defaults() {
        let f = read("set: {name: web, replicas: 1, template: {name: web}}\n").unwrap();
        let ProviderSettings::Sim(sim) = &f.provider;
        assert_eq!(sim.state, Path::new("/srv/fleets/web.sim-state.json"));
        assert_eq!(sim.owner, "machines");
        assert_eq!(f.settings.poll_interval, Duration::from_millis(200));
        assert_eq!(f.completion, Completion::Sentinel);
    }

    #[test]
    fn file_modes_are_octal_however_written() {
        for (written, bits) in [
            ("\"0755\"", 0o755),
            ("\"640\"", 0o640),
            ("\"0o600\"", 0o600),
            ("0644", 0o644),
            ("750", 0o750),
            ("0o640", 0o640),
        ] {
            let yaml = format!(
                "layers:\n  - name: app\n    steps:\n      - writeFile: {{path: /x, content: y, mode: {written}}}\nset: {{name: web, replicas: 1, template: {{name: web}}}}\n"
            );
            let f = read(&yaml).unwrap_or_else(|e| panic!("{written}: {e}"));
            assert_eq!(f.layers.len(), 1, "{written}");
            let coupled = f.layers[0].coupled.as_ref().unwrap();
            let spec = machine_core::MachineSpec::new(machine_core::MachineName::new("m").unwrap());
            let script =
                String::from_utf8(coupled.user_data_parts(&spec).unwrap()[0].content.clone())
                    .unwrap();
            assert!(
                script.contains(&format!("chmod {bits:o} ")),
                "{written}: {script}"
            );
        }
        for bad in ["\"0789\"", "9", "\"rw-r--r--\"", "017777"] {
            let e = read(&format!("layers:\n  - name: app\n    steps:\n      - writeFile: {{path: /x, content: y, mode: {bad}}}\nset: {{name: web, replicas: 1, template: {{name: web}}}}\n")).unwrap_err();
            assert_eq!(
                e.field(),
                Some("layers[0].steps[0].writeFile.mode"),
                "{bad}: {e}"
            );
            assert!(e.to_string().contains("line 4"), "{e}");
            assert!(e.to_string().contains("\"0644\""), "{e}");
        }
    }

    #[test]
    fn debug_shows_no_content_and_errors_do_not_quote_secrets() {
        let yaml = format!(
            "layers:
  - name: base
    cloudConfig:
      write_files:
        - {{path: /etc/token, content: {SECRET}}}
  - name: app
    mode: decoupled
    steps:
      - writeFile: {{path: /etc/app-token, content: {SECRET}}}
set: {{name: web, replicas: 1, template: {{name: web}}}}
"
        );
        let f = read(&yaml).unwrap();
        let shown = format!("{f:?} {:?} {:?}", f.provider, f.layers);
        assert!(!shown.contains(SECRET), "{shown}");
        assert!(shown.contains("base (coupled cloudConfig)"), "{shown}");

        // A value of the wrong form in a field that may be secret is not quoted.
        for bad in [
            format!(
                "layers:\n  - name: app\n    steps:\n      - writeFile: {{path: /x, content: [{SECRET}]}}\nset: {{name: web, replicas: 1, template: {{name: web}}}}\n"
            ),
            format!(
                "layers:\n  - name: base\n    cloudConfig:\n      users: [{{name: ops, hashed_passwd: [{SECRET}]}}]\nset: {{name: web, replicas: 1, template: {{name: web}}}}\n"
            ),
        ] {
            let e = read(&bad).unwrap_err();
            assert!(!e.to_string().contains(SECRET), "{e}");
            assert!(e.to_string().contains("line 4"), "{e}");
        }
    }

    #[test]
    fn a_layer_is_cloud_config_or_steps_and_cloud_config_is_coupled() {
        let e =
            read("layers:\n  - name: app\nset: {name: web, replicas: 1, template: {name: web}}\n")
                .unwrap_err();
        assert_eq!(e.field(), Some("layers[0]"));
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = read("layers:\n  - name: base\n    mode: decoupled\n    cloudConfig: {packages: [a]}\nset: {name: web, replicas: 1, template: {name: web}}\n").unwrap_err();
        assert_eq!(e.field(), Some("layers[0].mode"));
        assert!(e.to_string().contains("line 3"), "{e}");
        let e = read("layers:\n  - name: Base\n    steps: []\nset: {name: web, replicas: 1, template: {name: web}}\n").unwrap_err();
        assert_eq!(e.field(), Some("layers[0].name"));
    }
}
