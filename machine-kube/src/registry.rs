//! Which composer serves an object: the controller's user registers providers and
//! layers under names, and a `Machine` object names them.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use machine_core::{Composer, Result};

/// Builds the composer for a provider name and layer names, or refuses them with an
/// invalid-spec error naming `spec.provider` or `spec.layers[i]`.
///
/// The composer's layers are expected one per name, in the names' order: that is how
/// the reconciler tells which named layers are coupled (a change of them needs a new
/// machine) from decoupled ones (added to a running machine). A factory that builds
/// another number of layers makes every layer count as coupled. The reconciler also
/// asks for a provider with no layers, to find and delete machines.
pub type ComposerFactory = dyn Fn(&str, &[String]) -> Result<Composer> + Send + Sync;

/// Built composers by provider name and layer names.
type Built = HashMap<(String, Vec<String>), Arc<Composer>>;

/// The composers a controller serves, built on first use by its factory and kept for
/// every object that names the same provider and layers.
pub struct Registry {
    factory: Box<ComposerFactory>,
    built: Mutex<Built>,
}

impl Registry {
    /// A registry building composers with `factory`.
    pub fn new(
        factory: impl Fn(&str, &[String]) -> Result<Composer> + Send + Sync + 'static,
    ) -> Self {
        Registry {
            factory: Box::new(factory),
            built: Mutex::new(HashMap::new()),
        }
    }

    /// The composer for `provider` and `layers`.
    pub fn composer(&self, provider: &str, layers: &[String]) -> Result<Arc<Composer>> {
        let key = (provider.to_owned(), layers.to_vec());
        if let Some(c) = self.lock().get(&key) {
            return Ok(c.clone());
        }
        // Built outside the lock: a factory may take its time; a rare double build
        // keeps the first.
        let built = Arc::new((self.factory)(provider, layers)?);
        Ok(self.lock().entry(key).or_insert(built).clone())
    }

    /// A composer of its own for `provider` and `layers`, not kept: a fleet reconciler
    /// owns the composer it drives a set through.
    pub fn build(&self, provider: &str, layers: &[String]) -> Result<Composer> {
        (self.factory)(provider, layers)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Built> {
        self.built.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("built", &self.lock().len())
            .finish_non_exhaustive()
    }
}
