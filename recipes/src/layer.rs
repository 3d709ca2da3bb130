//! [`RecipeLayer`]: a list of recipes, rendered as either kind of software layer.

use std::fmt;

use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer};
use machine_core::steps::{Step, StepLayer};
use machine_core::{Result, check_dns_label};

use crate::plan::Plan;
use crate::recipe::Recipe;

/// A named list of recipes, checked once at construction and rendered to either path:
/// [`RecipeLayer::coupled`] gives a cloud-init layer for user data,
/// [`RecipeLayer::decoupled`] a step layer applied over a transport. Both have the same
/// effect on a machine (the `tests` crate proves it on real machines).
///
/// The order within a layer is cloud-init's, on both paths: repository commands (zypper
/// key imports, apk repository lines), repository files, host name and time zone,
/// groups, accounts, packages, files, then the recipes' commands (sudo rules among them)
/// in recipe order.
///
/// ```
/// use recipes::{Account, File, Package, Packages, RecipeLayer, SystemdUnit};
///
/// let layer = RecipeLayer::new("base", vec![
///     Account::admin("ops", ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOpsOpsOpsOps ops@laptop"]).into(),
///     Packages::apt([Package::pinned("nginx", "1.22.1-9"), Package::new("curl")]).into(),
///     File::new("/etc/app.conf", "port = 8080\n").with_mode(0o640).with_owner("ops").into(),
///     SystemdUnit::new("app.service", "[Service]\nExecStart=/usr/bin/app\n[Install]\nWantedBy=multi-user.target\n").into(),
/// ])?;
/// let coupled = layer.coupled()?;   // a bootstrap_cloudinit::CloudConfigLayer
/// assert!(coupled.render()?.contains("nginx=1.22.1-9"));
/// let decoupled = layer.decoupled()?; // a machine_core::steps::StepLayer
/// assert!(!decoupled.steps().is_empty());
///
/// let bad = RecipeLayer::new("base", vec![Packages::apt([Package::new("curl;reboot")]).into()]);
/// assert_eq!(bad.unwrap_err().field(), Some("layer base.recipes[0].packages[0].name"));
/// # Ok::<(), machine_core::Error>(())
/// ```
#[derive(Clone)]
pub struct RecipeLayer {
    name: String,
    recipes: Vec<Recipe>,
    plan: Plan,
    existing_users: Vec<String>,
}

impl fmt::Debug for RecipeLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Recipes' own Debug keeps file contents out.
        f.debug_struct("RecipeLayer")
            .field("name", &self.name)
            .field("recipes", &self.recipes)
            .finish()
    }
}

impl RecipeLayer {
    /// A layer named `name` (a DNS label: it names the user-data part and the state file)
    /// holding `recipes`, every one checked now. An error is an invalid-spec error whose
    /// field is `layer <name>.recipes[<i>].<field>`.
    pub fn new(name: impl Into<String>, recipes: Vec<Recipe>) -> Result<Self> {
        let name = name.into();
        check_dns_label("layer.name", &name)?;
        let within = format!("layer {name}");
        let mut plan = Plan {
            layer: name.clone(),
            ..Plan::default()
        };
        for (i, recipe) in recipes.iter().enumerate() {
            let field = format!("recipes[{i}]");
            recipe
                .check()
                .map_err(|e| e.within(&field).within(&within))?;
            recipe
                .plan(&mut plan, &field)
                .map_err(|e| e.within(&within))?;
        }
        plan.seal();
        Ok(RecipeLayer {
            name,
            recipes,
            plan,
            existing_users: Vec::new(),
        })
    }

    /// Accounts that exist on the machine before this layer runs (made by the image or
    /// another layer), which files may name as owners. Only the coupled path checks
    /// owners ahead; decoupled, `chown` fails on a missing one.
    pub fn with_existing_users(
        mut self,
        users: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.existing_users = users.into_iter().map(Into::into).collect();
        self
    }

    /// The layer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The recipes, as given.
    pub fn recipes(&self) -> &[Recipe] {
        &self.recipes
    }

    /// The cloud-config of the coupled path.
    pub fn cloud_config(&self) -> CloudConfig {
        self.plan.cloud_config()
    }

    /// The coupled path: a cloud-init layer (validated by bootstrap-cloudinit) to put in
    /// the machine's user data.
    pub fn coupled(&self) -> Result<CloudConfigLayer> {
        CloudConfigLayer::with_system_users(
            self.name.clone(),
            self.cloud_config(),
            self.existing_users.clone(),
        )
    }

    /// The steps of the decoupled path.
    pub fn steps(&self) -> Vec<Step> {
        self.plan.steps()
    }

    /// The decoupled path: a step layer applied over a transport, which records each
    /// step done in its state file so that a rerun runs only what changed.
    pub fn decoupled(&self) -> Result<StepLayer> {
        StepLayer::new(self.name.clone(), self.steps())
    }
}
