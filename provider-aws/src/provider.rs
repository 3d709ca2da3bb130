//! [`AwsProvider`]: the [`MachineProvisioner`] for EC2.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use aws_sdk_ec2::types::Instance;
use machine_core::conditions as C;
use machine_core::{
    Capabilities, Error, ErrorKind, Labels, Machine, MachineName, MachineProvisioner, MachineSpec,
    PowerOp, PowerOperations, ProviderId, Result, SizeBasis, UserData, UserDataDelivery,
    UserDataFormat, user_data,
};

use crate::client::{Ec2, Launch, filter};
use crate::config::{AwsConfig, ClientTokens};
use crate::hostkeys::parse_host_keys;
use crate::instance::{instance_id, is_gone_or_going, is_owned_by, to_machine};
use crate::settings::{self, Ec2Settings};
use crate::tags::{self, MANAGED_TAG, OWNER_TAG};
use crate::token::{self, ClientToken};
use crate::view::FleetView;

/// EC2's user-data limit: 16 KiB of raw bytes, before base64.
pub const USER_DATA_LIMIT: usize = 16 * 1024;

/// How often `get` looks at a running machine's console for host keys until it finds them.
const HOST_KEY_RECHECK: Duration = Duration::from_secs(15);

/// How long after its launch a creator waits before it looks for a rival launch of
/// the same name. EC2 (and moto) report launch times to the second, so two launches in
/// one second tie and are ordered by instance ID instead; a rival that ties with us
/// must be visible before we choose, or each creator keeps its own. One second of
/// granularity plus a margin for the rival's RunInstances to be answered.
const RACE_WINDOW: Duration = Duration::from_millis(1500);

/// How many entries a [`Memo`] holds before it starts afresh.
const NAMES_REMEMBERED: usize = 100_000;

/// A bounded memory of hints a lookup could tell again, so forgetting all of them at
/// once (past [`NAMES_REMEMBERED`] entries) costs calls, never correctness.
struct Memo<K, V>(Mutex<HashMap<K, V>>);

impl<K: std::hash::Hash + Eq, V: Clone> Memo<K, V> {
    fn new() -> Self {
        Memo(Mutex::new(HashMap::new()))
    }

    fn insert_all(&self, entries: impl IntoIterator<Item = (K, V)>) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() > NAMES_REMEMBERED {
            map.clear();
        }
        map.extend(entries);
    }

    fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(key).cloned()
    }
}

/// How old a name lookup `delete` may use to find a machine's duplicates.
const DUPLICATE_LOOKUP_AGE: Duration = Duration::from_secs(30);

/// Instance states a live machine can be in (terminated ones do not count).
const LIVE_STATES: [&str; 5] = ["pending", "running", "shutting-down", "stopping", "stopped"];

/// Creates, finds and deletes EC2 instances as machines. See the [crate docs](crate)
/// for tags, idempotency and retries.
pub struct AwsProvider {
    config: AwsConfig,
    ec2: Ec2,
    capabilities: Capabilities,
    /// Instances this provider created lately, for EC2's eventual consistency: a
    /// not-found about one of them is transient.
    recent: Mutex<HashMap<String, Instant>>,
    /// Host keys read from consoles, and when each console was last read.
    host_keys: Mutex<HashMap<String, (Vec<String>, Instant)>>,
    /// Name lookups shared across the fleet.
    view: FleetView,
    /// The name of each instance a name lookup showed.
    names: Memo<String, MachineName>,
    /// The client token of this provider's latest launch of each name: name lookups
    /// leave terminated instances out, and with them the tokens they hold, so a
    /// recreate of a name this provider launched continues from here.
    tokens: Memo<MachineName, String>,
}

impl AwsProvider {
    /// A provider for `config`. Builds the SDK client (reading the environment and
    /// shared config files for the standard credential chain) without calling EC2.
    pub async fn new(config: AwsConfig) -> Result<Self> {
        let ec2 = Ec2::connect(&config).await?;
        let capabilities = Capabilities::default()
            .with_user_data(
                UserDataDelivery::new(
                    USER_DATA_LIMIT,
                    SizeBasis::Raw,
                    // EC2 passes user data through untouched; what runs it is the image's
                    // agent: cloud-init, Ignition (Fedora CoreOS, Flatcar), EC2Launch
                    // (PowerShell).
                    UserDataFormat::ALL.to_vec(),
                )
                .with_gzip(true),
            )
            .with_power(PowerOperations::all())
            .with_console_output(true)
            .with_host_key_discovery(config.host_key_discovery);
        Ok(AwsProvider {
            config,
            ec2,
            capabilities,
            recent: Mutex::new(HashMap::new()),
            host_keys: Mutex::new(HashMap::new()),
            view: FleetView::default(),
            names: Memo::new(),
            tokens: Memo::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &AwsConfig {
        &self.config
    }

    /// The machine of every instance with the marker and this owner's tag, in any state
    /// (terminated ones included, as `Deleted`, while EC2 still lists them). For audits
    /// and tests: it shows what `list` hides.
    pub async fn owned_instances(&self) -> Result<Vec<Machine>> {
        let owner = self.config.owner.as_str();
        self.list_owned()
            .await?
            .iter()
            .filter(|i| is_owned_by(i, owner))
            .map(|i| to_machine(i, self.default_ssh_user()))
            .collect()
    }

    /// One paginated DescribeInstances by the owner's tags: what [`FleetView`] shares.
    async fn list_owned(&self) -> Result<Vec<Instance>> {
        self.ec2
            .describe(
                &[],
                &[
                    filter(&format!("tag:{MANAGED_TAG}"), &["true"]),
                    filter(&format!("tag:{OWNER_TAG}"), &[self.config.owner.as_str()]),
                ],
            )
            .await
    }

    fn default_ssh_user(&self) -> Option<&str> {
        self.config.defaults.ssh_user.as_deref()
    }

    fn remember_created(&self, id: &str) {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        let window = self.config.consistency_window;
        recent.retain(|_, at| at.elapsed() < window);
        recent.insert(id.to_owned(), Instant::now());
    }

    /// Remembers the name of `instances`, so that a delete of one of them can use a
    /// name lookup instead of a check by id.
    fn remember_names(&self, instances: &[Instance], name: &MachineName) {
        let ids = instances.iter().filter_map(Instance::instance_id);
        self.names
            .insert_all(ids.map(|iid| (iid.to_owned(), name.clone())));
    }

    fn created_lately(&self, id: &str) -> bool {
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent
            .get(id)
            .is_some_and(|at| at.elapsed() < self.config.consistency_window)
    }

    /// A not-found about `id` is transient within the consistency window after this
    /// provider created it: EC2 may not know the new id everywhere yet.
    fn not_found(&self, id: &str, e: Option<Error>) -> Error {
        let message = format!("instance {id} does not exist");
        if self.created_lately(id) {
            let e = Error::transient(format!(
                "{message} yet: created moments ago, EC2 is eventually consistent"
            ));
            return e;
        }
        match e {
            Some(e) => Error::not_found(message).with_source(e),
            None => Error::not_found(message),
        }
    }

    /// What EC2 says about instance `id`.
    async fn lookup(&self, id: &ProviderId) -> Result<Lookup> {
        let iid = instance_id(id)?;
        let found = match self.ec2.describe(&[iid], &[]).await {
            Ok(found) => found,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Lookup::Missing(Some(e))),
            Err(e) => return Err(e),
        };
        Ok(
            match found.into_iter().find(|i| i.instance_id() == Some(iid)) {
                None => Lookup::Missing(None),
                Some(inst) if is_owned_by(&inst, &self.config.owner) => {
                    Lookup::Owned(Box::new(inst))
                }
                Some(_) => Lookup::Foreign,
            },
        )
    }

    /// The owned instance `id`, or a not-found error (transient right after create).
    async fn owned(&self, id: &ProviderId) -> Result<Instance> {
        match self.lookup(id).await? {
            Lookup::Owned(inst) => Ok(*inst),
            Lookup::Missing(e) => Err(self.not_found(instance_id(id)?, e)),
            Lookup::Foreign => Err(self.foreign(id, ErrorKind::NotFound)),
        }
    }

    fn foreign(&self, id: &ProviderId, kind: ErrorKind) -> Error {
        Error::new(
            kind,
            format!(
                "{id} is not a machine of owner {:?} (it lacks the owner or marker tag)",
                self.config.owner
            ),
        )
    }

    /// Deleting what does not exist succeeds, unless it was created moments ago.
    fn gone(&self, iid: &str, e: Option<Error>) -> Result<()> {
        match self.not_found(iid, e) {
            e if e.kind() == ErrorKind::NotFound => Ok(()),
            e => Err(e),
        }
    }

    /// DescribeInstances of the instances not terminated with the `Name` tags `names`
    /// and the owner's tag, following pages: what [`FleetView`] batches.
    ///
    /// Terminated instances are left out: EC2 lists them for about an hour, so in a
    /// fleet that replaces machines they would be most of every answer (and, on a
    /// server that scans, most of its work: on moto, a listing of 12 names among 500
    /// instances, 468 of them terminated, takes 280 ms of CPU with them and 54 ms
    /// without; 458 ms with the owner filter first). Only a create needs
    /// them, for the client tokens they hold, and it gets them from
    /// [`AwsProvider::named_in_any_state`] when a launch shows it must.
    ///
    /// The marker tag is checked on the answer (`named`), not filtered for: only this
    /// library writes the owner tag. Cheap filters go first, the names before the owner:
    /// a server that applies filters in order per instance (moto does) then reads tags
    /// only of the few instances left.
    async fn list_names(&self, names: Vec<String>) -> Result<Vec<Instance>> {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        self.ec2
            .describe(
                &[],
                &[
                    filter("instance-state-name", &LIVE_STATES),
                    filter(&format!("tag:{}", tags::NAME_TAG), &names),
                    filter(&format!("tag:{OWNER_TAG}"), &[self.config.owner.as_str()]),
                ],
            )
            .await
    }

    /// The owned instances named `name` in every state EC2 still lists, terminated
    /// ones included, from a listing of this name alone started now: for a create whose
    /// client token turned out to be bound already.
    async fn named_in_any_state(&self, name: &MachineName) -> Result<Named> {
        let started = Instant::now();
        let found = self
            .ec2
            .describe(
                &[],
                &[
                    filter(&format!("tag:{}", tags::NAME_TAG), &[name.as_str()]),
                    filter(&format!("tag:{OWNER_TAG}"), &[self.config.owner.as_str()]),
                ],
            )
            .await?;
        Ok(self.named_from(&found, name, started))
    }

    /// The owned instances named `name` that are not terminated, from a listing that
    /// started at or after `since` (shared with every other lookup that asked
    /// meanwhile).
    async fn named(&self, name: &MachineName, since: Instant) -> Result<Named> {
        let snapshot = self
            .view
            .named(name.as_str(), since, |names| self.list_names(names))
            .await?;
        Ok(self.named_from(&snapshot.instances, name, snapshot.started))
    }

    /// The token to launch `name` with after the listing `named` (started at
    /// `listed_at`, Unix time) and the token `bound`, known to be bound already (see
    /// [`ClientToken::choose`]).
    fn token_after(
        &self,
        name: &MachineName,
        named: &Named,
        bound: Option<&str>,
        listed_at: Duration,
    ) -> ClientToken {
        let seen = named.all.iter().filter_map(Instance::client_token);
        ClientToken::choose(
            &self.config.owner,
            name.as_str(),
            seen.chain(bound),
            listed_at.as_secs(),
        )
    }

    /// The owned instances named `name` among `instances`, listed at `started`.
    fn named_from(&self, instances: &[Instance], name: &MachineName, started: Instant) -> Named {
        let owner = self.config.owner.as_str();
        let all: Vec<Instance> = instances
            .iter()
            .filter(|i| is_owned_by(i, owner) && name_of(i) == Some(name.as_str()))
            .cloned()
            .collect();
        self.remember_names(&all, name);
        let mut live: Vec<Instance> = all
            .iter()
            .filter(|i| state_name(i).is_some_and(|s| LIVE_STATES.contains(&s)))
            .cloned()
            .collect();
        // Instances that are not going first, then in the order of their claims, so that
        // every replica picks the same one when a race or an outside launch made two.
        live.sort_by_key(|i| self.claim(name, i));
        Named { all, live, started }
    }

    /// Where `inst` stands among the live instances of `name`: the least claim keeps the
    /// name, every other is a duplicate to terminate. Instances being terminated come
    /// last. Where client tokens are ignored, the oldest launch wins (launch time to
    /// the second, then instance id), the order every creator's race check uses. Where
    /// they are honoured, the newest token epoch wins first (a late create yields to a
    /// rival of a later epoch, and an early one keeps its launch without looking: see
    /// `token.rs`), instances without a token of ours last; then the oldest. The order
    /// depends on nothing that changes but the state, so whoever settles, whenever,
    /// keeps the same instance and terminates only instances that lose to it.
    fn claim(&self, name: &MachineName, inst: &Instance) -> Claim {
        let epoch = match self.config.client_tokens {
            ClientTokens::Ignored => 0,
            ClientTokens::Honoured => inst
                .client_token()
                .and_then(|t| ClientToken::epoch_of(&self.config.owner, name.as_str(), t))
                .map_or(0, |e| e + 1),
        };
        (
            is_gone_or_going(inst),
            std::cmp::Reverse(epoch),
            inst.launch_time().map(|t| (t.secs(), t.subsec_nanos())),
            inst.instance_id().map(str::to_owned),
        )
    }

    /// After a launch, makes sure one machine carries the name, as cheaply as the
    /// endpoint's token semantics allow. Where tokens are honoured, a launch
    /// acknowledged well inside its token's epoch has no rival and is kept without
    /// another look; a late one yields to a rival of a later epoch (see `token.rs` for
    /// why). Where tokens are ignored, every launch settles by the oldest instance.
    async fn settle(
        &self,
        spec: &MachineSpec,
        launched: Instance,
        listed_at: Duration,
    ) -> Result<Machine> {
        if self.config.client_tokens == ClientTokens::Ignored {
            // Every launch that could tie with ours on launch time must be visible
            // before the oldest is chosen (see `RACE_WINDOW`).
            tokio::time::sleep(RACE_WINDOW).await;
        } else if token::is_late(listed_at, unix_now()) {
            // A rival launched under a later epoch's token must be visible.
            tokio::time::sleep(token::late_wait(
                self.config.sdk_max_attempts,
                self.config.attempt_timeout,
            ))
            .await;
        } else {
            return self.machine(&launched, false).await;
        }
        let named = self.named(&spec.name, Instant::now()).await?;
        self.keep_one(&spec.name, &named, Some(&launched)).await
    }

    /// How long to wait before adopting `inst`, the least claim a listing shows, where
    /// client tokens are ignored: a rival launched in the same second of launch time
    /// may rank before it (ties go by instance id) and not be listed yet, and every
    /// creator of the name keeps that rival after its race check. So an instance is
    /// adopted once [`RACE_WINDOW`] has passed since the start of its launch second
    /// (what a creator waits after its own launch), plus [`token::CLOCK_SKEW`] between
    /// this host and EC2; an older one at once. `None` where tokens are honoured: one
    /// token epoch launches one instance.
    fn rivals_may_show(&self, inst: &Instance) -> Option<Duration> {
        if self.config.client_tokens == ClientTokens::Honoured || is_gone_or_going(inst) {
            return None;
        }
        let launched = u64::try_from(inst.launch_time()?.secs()).ok()?;
        let settled = Duration::from_secs(launched) + RACE_WINDOW + token::CLOCK_SKEW;
        let now = unix_now();
        (now < settled).then(|| settled - now)
    }

    /// Keeps the instance with the least claim (see [`AwsProvider::claim`]) among the
    /// name's live instances in `named`, and `launched` (this create's own, which the
    /// listing may not show yet), and terminates every other one that is not going
    /// already: duplicates made by a race, from outside, or by a process that died
    /// before its own race check. Whoever settles keeps the same instance, so a
    /// process killed at any point leaves no duplicate behind the next create, find or
    /// delete of the name. Returns the kept machine; with `launched`, that may be
    /// another controller's instance (our launch is then terminated). When every live
    /// instance is being terminated, the first of them is returned as it is (Deleting).
    async fn keep_one(
        &self,
        name: &MachineName,
        named: &Named,
        launched: Option<&Instance>,
    ) -> Result<Machine> {
        let mut candidates: Vec<&Instance> = named.live.iter().collect();
        if let Some(own) = launched
            && !named
                .live
                .iter()
                .any(|i| i.instance_id() == own.instance_id())
        {
            candidates.push(own);
        }
        candidates.sort_by_key(|i| self.claim(name, i));
        let Some(kept) = candidates.first().copied() else {
            return Err(Error::transient(format!(
                "machine {name}: no instance of the name is listed"
            )));
        };
        let losers: Vec<&str> = candidates[1..]
            .iter()
            .filter(|i| !is_gone_or_going(i))
            .filter_map(|i| i.instance_id())
            .collect();
        let mut m = self.machine(kept, false).await?;
        if is_gone_or_going(kept) || losers.is_empty() {
            mark_duplicates(&mut m, &named.live);
            return Ok(m);
        }
        tracing::info!(machine = %name, kept = kept.instance_id(), duplicates = ?losers, "terminating duplicates of the machine");
        self.terminate_ids(&losers)
            .await
            .map_err(|e| e.context(format_args!("terminating duplicates {losers:?} of {name}")))?;
        m.set_condition(
            C::DUPLICATES,
            false,
            C::UNIQUE,
            format!(
                "terminated {} duplicate instance(s) of the name: {}",
                losers.len(),
                losers.join(", ")
            ),
        );
        Ok(m)
    }

    /// TerminateInstances for `ids` in one call; when EC2 refuses the batch because one
    /// of them is gone, one call each. An id that is gone counts as terminated, except
    /// right after this provider created it (then the not-found is transient). So does
    /// a refusal (a conflict, or a permanent error) when the instances are all being
    /// terminated already: two processes settling one name's duplicates at the same
    /// moment terminate the same instances, and the second may be refused (EC2 with
    /// `IncorrectInstanceState`, moto with `InvalidAttachment.NotFound`, its volume
    /// detached by the first).
    async fn terminate_ids(&self, ids: &[&str]) -> Result<()> {
        let e = match self.ec2.terminate_all(ids).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if e.kind() == ErrorKind::NotFound && ids.len() > 1 {
            for t in ids {
                if let Err(e) = self.ec2.terminate(t).await {
                    self.refused_termination(&[t], e).await?;
                }
            }
            return Ok(());
        }
        self.refused_termination(ids, e).await
    }

    /// Whether the refused TerminateInstances of `ids` (error `e`) failed only because
    /// the instances are gone or going already (see [`AwsProvider::terminate_ids`]).
    async fn refused_termination(&self, ids: &[&str], e: Error) -> Result<()> {
        match e.kind() {
            ErrorKind::NotFound if ids.len() == 1 => self.gone(ids[0], Some(e)),
            ErrorKind::Conflict | ErrorKind::Permanent => {
                let Ok(found) = self.ec2.describe(ids, &[]).await else {
                    return Err(e);
                };
                let going = ids.iter().all(|id| {
                    found
                        .iter()
                        .find(|i| i.instance_id() == Some(id))
                        .is_some_and(is_gone_or_going)
                });
                if going { Ok(()) } else { Err(e) }
            }
            _ => Err(e),
        }
    }

    /// The machine of `inst`, with host keys when discovery is on and it runs.
    async fn machine(&self, inst: &Instance, read_console: bool) -> Result<Machine> {
        let mut m = to_machine(inst, self.default_ssh_user())?;
        let Some(iid) = inst.instance_id() else {
            return Ok(m);
        };
        if is_gone_or_going(inst) {
            self.host_keys
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(iid);
            return Ok(m);
        }
        if !self.config.host_key_discovery || !m.phase.is_running() {
            return Ok(m);
        }
        let cached = self
            .host_keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(iid)
            .cloned();
        let stale = match &cached {
            Some((keys, _)) if !keys.is_empty() => false,
            Some((_, at)) => at.elapsed() >= HOST_KEY_RECHECK,
            None => true,
        };
        let keys = if stale && read_console {
            match self.ec2.console_output(iid).await {
                Ok(console) => {
                    let keys = console.as_deref().map(parse_host_keys).unwrap_or_default();
                    self.host_keys
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(iid.to_owned(), (keys.clone(), Instant::now()));
                    keys
                }
                Err(e) => {
                    // Host keys are a bonus: a failed console read must not fail `get`.
                    tracing::debug!(instance = iid, error = %e, "console output unavailable");
                    cached.map(|(k, _)| k).unwrap_or_default()
                }
            }
        } else {
            cached.map(|(k, _)| k).unwrap_or_default()
        };
        m.access.host_keys = keys;
        Ok(m)
    }
}

/// What EC2 says about one instance id.
enum Lookup {
    /// A machine of this owner.
    Owned(Box<Instance>),
    /// No such instance (with EC2's error, when it gave one).
    Missing(Option<Error>),
    /// An instance without this owner's tags.
    Foreign,
}

/// Everything `create` decided before its first call.
struct Plan {
    image: String,
    instance_type: String,
    settings: Ec2Settings,
    tags: Vec<(String, String)>,
}

impl AwsProvider {
    /// Checks the spec and user data and works out the launch, without any call.
    fn plan(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Plan> {
        spec.validate()?;
        let settings = Ec2Settings::from_spec(spec)?.or_defaults(&self.config.defaults);
        let image = match spec.image.as_deref().or(self.config.image.as_deref()) {
            Some(image) => image.to_owned(),
            None => {
                return Err(Error::invalid_spec(
                    "image",
                    "no image: set the spec's image or the provider's default image",
                ));
            }
        };
        settings::check_image(&image)?;
        let instance_type = spec
            .size
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| self.config.instance_type.clone());
        settings::check_instance_type(&instance_type)?;
        user_data::admit(user_data, self.capabilities.user_data.as_ref())?;
        if image.starts_with("resolve:ssm:")
            && settings
                .root_volume
                .as_ref()
                .is_some_and(|r| r.device_name.is_none())
        {
            return Err(Error::invalid_spec(
                "provider.rootVolume.deviceName",
                "is required with a resolve:ssm: image, whose root device cannot be looked up",
            ));
        }
        let ssh_user = spec
            .ssh
            .as_ref()
            .map(|s| s.user.as_str())
            .or(settings.ssh_user.as_deref());
        let tags = tags::machine_tags(spec, &self.config.owner, ssh_user, &settings.tags)?;

        Ok(Plan {
            image,
            instance_type,
            settings,
            tags,
        })
    }
}

impl fmt::Display for AwsProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "aws(region={}, owner={})",
            self.config.region, self.config.owner
        )
    }
}

impl fmt::Debug for AwsProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsProvider")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl MachineProvisioner for AwsProvider {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// Checks everything it can before any call (spec, settings, image and type form,
    /// tags, user data size), then looks the name up in a listing of the owner's
    /// instances made after the call began (shared with concurrent lookups) and returns
    /// a live instance it finds (adoption), terminating any duplicate of it (see
    /// `find`); where tokens are ignored, an instance launched in the last moments is
    /// adopted only once a rival that could tie with it must be listed. Otherwise it
    /// launches one with RunInstances and a ClientToken of owner and name (see
    /// `token.rs`): a controller launching the same name at the same moment with
    /// another spec gets a conflict error, and a recreate after a delete continues the
    /// token sequence of the instances it sees. After a launch that may have a rival
    /// (always where tokens are ignored), it keeps the instance every creator keeps
    /// and terminates the others, its own launch or a rival's.
    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        let _op = self.view.operation();
        let plan = self.plan(spec, user_data)?;
        let mut root_device: Option<Option<String>> = None;
        let mut since = Instant::now();
        // Each turn looks the name up; it ends when the lookup shows a machine, or a
        // launch on its strength settles. A new turn starts only when the answer grew
        // older than `LISTING_FRESH_FOR` before a launch was sent (see `token.rs`).
        'lookup: loop {
            let named = self.named(&spec.name, since).await?;
            let answered = Instant::now();
            // A machine being deleted still holds its name (the trait's contract): it
            // is returned, phase Deleting, and the caller creates anew once it is gone.
            // Duplicates of the adopted instance are terminated: their creator may have
            // died before its race check.
            if let Some(existing) = named.live.first() {
                if let Some(wait) = self.rivals_may_show(existing) {
                    tracing::debug!(machine = %spec.name, instance = existing.instance_id(), wait_ms = wait.as_millis() as u64, "adopting a launch of the last moments: waiting for rivals that may tie with it");
                    tokio::time::sleep(wait).await;
                    since = Instant::now();
                    continue 'lookup;
                }
                tracing::debug!(machine = %spec.name, instance = existing.instance_id(), "adopting");
                return self.keep_one(&spec.name, &named, None).await;
            }
            let root_device = match &mut root_device {
                Some(d) => d.clone(),
                None => {
                    let d = match &plan.settings.root_volume {
                        Some(root) => Some(match &root.device_name {
                            Some(d) => d.clone(),
                            None => self.ec2.root_device_name(&plan.image).await?,
                        }),
                        None => None,
                    };
                    root_device = Some(d.clone());
                    d
                }
            };
            // The Unix time the listing started: its epoch is the token's.
            let listed_at = unix_now().saturating_sub(named.started.elapsed());
            // Terminated holders of this epoch's tokens are not listed; this provider's
            // own latest launch of the name is remembered.
            let launched = self.tokens.get(&spec.name);
            let mut token = self.token_after(&spec.name, &named, launched.as_deref(), listed_at);
            // Whether the name's terminated instances were looked at for their tokens.
            let mut looked_at_terminated = false;
            // Each turn either launches, adopts, fails, or steps past a token that an
            // earlier generation of this name holds; the tokens ahead are finite (one
            // per launch EC2 remembers), so this ends without a fixed cap.
            loop {
                if answered.elapsed() > token::LISTING_FRESH_FOR {
                    since = Instant::now();
                    continue 'lookup;
                }
                // A launch ending late in its token's epoch would wait `late_wait`
                // after it; waiting for the next epoch costs far less.
                if self.config.client_tokens == ClientTokens::Honoured
                    && let Some(wait) = token::defer_launch(listed_at, unix_now())
                {
                    tracing::debug!(machine = %spec.name, wait_ms = wait.as_millis() as u64, "launch would end late in its token epoch; waiting for the next");
                    tokio::time::sleep(wait).await;
                    since = Instant::now();
                    continue 'lookup;
                }
                let token_text = token.to_string();
                let launch = Launch {
                    image: &plan.image,
                    instance_type: &plan.instance_type,
                    settings: &plan.settings,
                    root_device: root_device.as_deref(),
                    user_data: user_data.map(|u| u.bytes.as_slice()),
                    tags: &plan.tags,
                    client_token: &token_text,
                };
                match self.ec2.run_instance(&launch).await {
                    Ok(inst) if is_gone_or_going(&inst) => {
                        if inst.client_token().is_some_and(|t| t != token_text) {
                            return Err(Error::permanent(format!(
                                "RunInstances answered client token {token_text} with instance {} of token {}",
                                inst.instance_id().unwrap_or("?"),
                                inst.client_token().unwrap_or("?")
                            )));
                        }
                        tracing::debug!(machine = %spec.name, token = token_text, "client token held by a terminated instance; next generation");
                        token = if looked_at_terminated {
                            token.next()
                        } else {
                            // Another controller's generations, not listed: continue
                            // after the newest of them instead of one call each.
                            looked_at_terminated = true;
                            let all = self.named_in_any_state(&spec.name).await?;
                            self.token_after(&spec.name, &all, Some(&token_text), listed_at)
                        };
                    }
                    Ok(inst) => {
                        if let Some(iid) = inst.instance_id() {
                            self.remember_created(iid);
                        }
                        // Its delete then needs no check by id: it is ours, by this name.
                        self.remember_names(std::slice::from_ref(&inst), &spec.name);
                        // Lookups will not show its token once it is terminated.
                        self.tokens
                            .insert_all([(spec.name.clone(), token_text.clone())]);
                        tracing::info!(machine = %spec.name, instance = inst.instance_id(), "launched");
                        return self.settle(spec, inst, listed_at).await;
                    }
                    Err(e) if is_token_mismatch(&e) => {
                        // The token is bound to other parameters: an earlier generation
                        // launched with another spec, or another controller launching
                        // this name right now with another spec. A fresh listing tells
                        // which; when it shows no holder, one made after the holder must
                        // be visible settles it (stepping past a live holder would make
                        // a second instance in the token's epoch). The holder may be
                        // terminated: this lookup shows every state.
                        looked_at_terminated = true;
                        let mut named = self.named_in_any_state(&spec.name).await?;
                        let shows_holder = |n: &Named| {
                            n.all
                                .iter()
                                .any(|i| i.client_token() == Some(token_text.as_str()))
                        };
                        if !shows_holder(&named) && named.live.is_empty() {
                            tokio::time::sleep(token::VISIBILITY_LAG).await;
                            named = self.named_in_any_state(&spec.name).await?;
                        }
                        let holder = named
                            .all
                            .iter()
                            .find(|i| i.client_token() == Some(token_text.as_str()));
                        if let Some(holder) = holder.filter(|i| !is_gone_or_going(i)) {
                            return Err(conflict(spec, &plan, holder, &token_text).with_source(e));
                        }
                        if !named.live.is_empty() {
                            // Launched meanwhile under another token (another epoch).
                            return self.keep_one(&spec.name, &named, None).await;
                        }
                        // Held by a terminated instance, listed or no longer listed:
                        // after the newest token of the epoch this lookup shows.
                        token = self.token_after(&spec.name, &named, Some(&token_text), listed_at);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }

    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        let inst = self.owned(id).await?;
        self.machine(&inst, true).await
    }

    /// The live instance of the name that holds it (one that is not being terminated,
    /// when there is one: the oldest, or where client tokens are honoured the newest
    /// token epoch's; see `AwsProvider::claim`). Any other live instance of the name is
    /// a duplicate, left by a race, from outside, or by a process that died before its
    /// race check: it is terminated here (one TerminateInstances), and the machine
    /// says so in its `Duplicates` condition. No console read: a caller that finds a
    /// machine may be about to delete it; `get` reads host keys when they are wanted.
    async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
        let _op = self.view.operation();
        let named = self.named(name, Instant::now()).await?;
        if named.live.is_empty() {
            return Ok(None);
        }
        self.keep_one(name, &named, None).await.map(Some)
    }

    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
        let mut filters = vec![
            filter(&format!("tag:{OWNER_TAG}"), &[self.config.owner.as_str()]),
            filter(&format!("tag:{MANAGED_TAG}"), &["true"]),
            filter("instance-state-name", &LIVE_STATES),
        ];
        for (k, v) in selector {
            filters.push(filter(
                &format!("tag:{}", tags::label_tag(k)),
                &[v.as_str()],
            ));
        }
        let found = self.ec2.describe(&[], &filters).await?;
        let owned: Vec<Instance> = found
            .into_iter()
            .filter(|i| is_owned_by(i, &self.config.owner))
            .collect();
        let mut out = Vec::with_capacity(owned.len());
        for inst in &owned {
            let mut m = self.machine(inst, false).await?;
            // Filters select already; checking again keeps a lax server honest.
            if selector.iter().all(|(k, v)| m.labels.get(k) == Some(v)) {
                let same_name: Vec<Instance> = owned
                    .iter()
                    .filter(|i| name_of(i) == Some(m.name.as_str()))
                    .cloned()
                    .collect();
                mark_duplicates(&mut m, &same_name);
                out.push(m);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name).then(a.provider_id.cmp(&b.provider_id)));
        Ok(out)
    }

    /// Terminates the machine: the instance and every other live instance of the same
    /// owner and name (a duplicate made by a race or from outside is never left
    /// running), in one TerminateInstances. The instance and its name's other instances
    /// come from a name lookup of the last half minute (usually the one that settled its
    /// creation) or one shared with the fleet's other lookups; an instance that lookup
    /// does not show is checked by id (ownership, state, name: one cheap call). Succeeds for an
    /// unknown id, except right after this provider created it (then the not-found is
    /// transient, so a retry terminates it once EC2 knows it). Does nothing to an
    /// instance already terminated or shutting down, so a late delete of an old ID
    /// leaves a newer machine of the name alone. Refuses, with a conflict error, to
    /// touch an instance of another owner.
    async fn delete(&self, id: &ProviderId) -> Result<()> {
        let _op = self.view.operation();
        let began = Instant::now();
        let iid = instance_id(id)?;
        // A lookup of the last half minute will do for the name's other instances: a
        // racing launch is settled by its own creator, and a teardown looks the name up
        // afresh before it is done.
        let since = began.checked_sub(DUPLICATE_LOOKUP_AGE).unwrap_or(began);
        let known = self.names.get(iid);
        let mut named = match &known {
            Some(name) => Some(self.named(name, since).await?),
            None => None,
        };
        let listed = named
            .as_ref()
            .and_then(|n| n.all.iter().find(|i| i.instance_id() == Some(iid)).cloned());
        let inst = match listed {
            // The name lookup shows it with the owner's tags: no check by id needed.
            Some(inst) => inst,
            // This provider launched it moments ago, with the owner's tags and this name,
            // after the lookup it has: terminating it (a no-op if it is gone already) is
            // all there is to do. Nothing else of the name was live then, or the create
            // would have adopted it; a teardown looks the name up afresh when done.
            None if known.is_some() && self.created_lately(iid) => {
                return match self.ec2.terminate(iid).await {
                    Err(e) if e.kind() == ErrorKind::NotFound => self.gone(iid, Some(e)),
                    other => other,
                };
            }
            None => match self.lookup(id).await? {
                Lookup::Owned(inst) => *inst,
                Lookup::Missing(e) => return self.gone(iid, e),
                // Someone else's instance is not ours to terminate.
                Lookup::Foreign => return Err(self.foreign(id, ErrorKind::Conflict)),
            },
        };
        if is_gone_or_going(&inst) {
            // Deleted already. Its name may carry a newer machine by now (a recreate),
            // which a late or repeated delete of the old ID must leave alone.
            return Ok(());
        }
        let name = name_of(&inst).and_then(|n| MachineName::new(n).ok());
        if let Some(name) = name.as_ref().filter(|n| Some(*n) != known.as_ref()) {
            named = Some(self.named(name, since).await?);
        }
        let mut targets: Vec<String> = vec![iid.to_owned()];
        for other in named.map(|n| n.live).unwrap_or_default() {
            let Some(other_id) = other.instance_id() else {
                continue;
            };
            if other_id != iid && !is_gone_or_going(&other) {
                tracing::info!(instance = other_id, machine = ?name, "terminating a duplicate of the machine");
                targets.push(other_id.to_owned());
            }
        }
        let targets: Vec<&str> = targets.iter().map(String::as_str).collect();
        self.terminate_ids(&targets).await
    }

    async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>> {
        self.owned(id).await?;
        let Some(bytes) = self.ec2.user_data(instance_id(id)?).await? else {
            return Ok(None);
        };
        Ok(Some(UserData::sniff(bytes)))
    }

    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        self.owned(id).await?;
        let iid = instance_id(id)?;
        match op {
            PowerOp::Start => self.ec2.start(iid).await,
            PowerOp::Stop => self.ec2.stop(iid).await,
            PowerOp::Reboot => self.ec2.reboot(iid).await,
            // An operation machine-core adds later is refused until mapped here.
            _ => Err(machine_core::unsupported_power_op(self, op)),
        }
    }

    async fn console_output(&self, id: &ProviderId) -> Result<Option<String>> {
        self.owned(id).await?;
        self.ec2.console_output(instance_id(id)?).await
    }
}

/// An instance's place among the live instances of its name (see
/// [`AwsProvider::claim`]): going or not, the reversed token epoch, launch time, id.
type Claim = (
    bool,
    std::cmp::Reverse<u64>,
    Option<(i64, u32)>,
    Option<String>,
);

/// What a listing shows of one name.
struct Named {
    /// Every instance of the name the listing showed: terminated ones only from
    /// [`AwsProvider::named_in_any_state`].
    all: Vec<Instance>,
    /// The ones not terminated, in the order of their claims to the name (those not
    /// being terminated first; see [`AwsProvider::claim`]).
    live: Vec<Instance>,
    /// When the listing started.
    started: Instant,
}

/// Now, as a duration since the Unix epoch (zero for a clock before 1970).
fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// The `Name` tag of an instance.
fn name_of(inst: &Instance) -> Option<&str> {
    inst.tags()
        .iter()
        .find(|t| t.key() == Some(tags::NAME_TAG))
        .and_then(|t| t.value())
}

fn state_name(inst: &Instance) -> Option<&str> {
    crate::instance::state(inst).map(|s| s.as_str())
}

/// Sets the `Duplicates` condition on `m` from `same_name`, the instances that carry
/// its name: true, naming the others, when more than one of them is live and not being
/// terminated.
fn mark_duplicates(m: &mut Machine, same_name: &[Instance]) {
    let own = m.provider_id.resource_id().to_owned();
    let others: Vec<&str> = same_name
        .iter()
        .filter(|i| state_name(i).is_some_and(|s| LIVE_STATES.contains(&s)))
        .filter(|i| !is_gone_or_going(i))
        .filter_map(|i| i.instance_id())
        .filter(|i| *i != own)
        .collect();
    if others.is_empty() {
        if m.condition(C::DUPLICATES).is_some() {
            m.set_condition(
                C::DUPLICATES,
                false,
                C::UNIQUE,
                "one live instance carries the name",
            );
        }
        return;
    }
    m.set_condition(
        C::DUPLICATES,
        true,
        C::DUPLICATES_FOUND,
        format!(
            "{} other live instance(s) carry this name: {}; deleting the machine terminates them all",
            others.len(),
            others.join(", ")
        ),
    );
}

/// Whether `e` is EC2's answer to a client token reused with other parameters.
fn is_token_mismatch(e: &Error) -> bool {
    e.kind() == ErrorKind::Conflict && e.message().contains("IdempotentParameterMismatch")
}

/// The error for a name another controller is launching with other parameters.
fn conflict(spec: &MachineSpec, plan: &Plan, holder: &Instance, token: &str) -> Error {
    Error::new(
        ErrorKind::Conflict,
        format!(
            "machine {} is already being created with other parameters: instance {} \
             (image {}, type {}) holds client token {token}, and EC2 refused this create \
             (image {}, type {}) with IdempotentParameterMismatch; two controllers of one \
             owner disagree on the spec",
            spec.name,
            holder.instance_id().unwrap_or("?"),
            holder.image_id().unwrap_or("?"),
            holder.instance_type().map_or("?", |t| t.as_str()),
            plan.image,
            plan.instance_type,
        ),
    )
}
