//! [`EnvRegistry`]: environments by name, so a config can choose them (`kind = "sokoban"`).

use crate::{
    EnvError, FrozenLake, FrozenLakeConfig, Shop, ShopConfig, Sokoban, SokobanConfig, ToolUse,
    ToolUseConfig,
};
use roll_core::Env;
use roll_core::config::ComponentSpec;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// The options of a [`ComponentSpec`]: every key of its table besides `kind`.
pub type EnvOptions = BTreeMap<String, serde_json::Value>;

type BuildFn = dyn Fn() -> Result<Box<dyn Env>, EnvError> + Send + Sync;
type MakeFactory = dyn Fn(&EnvOptions) -> Result<EnvFactory, EnvError> + Send + Sync;

/// Builds fresh instances of one configured environment: what the [`EnvManager`](crate::EnvManager)
/// calls for each of its threads, and again to replace an instance that panicked or hung.
///
/// Any closure returning an environment type will do; no cast to `Box<dyn Env>` is needed (a
/// closure that returns one still works, since a boxed environment is an environment):
///
/// ```
/// use roll_core::testing::EchoEnv;
/// use roll_core::Env;
/// use roll_env::EnvFactory;
/// use roll_env::wrappers::EnvExt;
///
/// let factory = EnvFactory::new("echo", || Ok(EchoEnv::new(3)));
/// let mut env = factory.build()?;
/// assert!(env.reset(5)?.text.contains("#5"));
/// // Wrapped environments are environments too.
/// let limited = EnvFactory::new("echo", || EchoEnv::new(100).with_step_limit(3));
/// assert_eq!(limited.kind(), "echo");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct EnvFactory {
    kind: Arc<str>,
    build: Arc<BuildFn>,
}

impl EnvFactory {
    /// A factory named `kind` (used in reports) that calls `build`.
    pub fn new<E, F>(kind: impl Into<String>, build: F) -> Self
    where
        E: Env + 'static,
        F: Fn() -> Result<E, EnvError> + Send + Sync + 'static,
    {
        Self {
            kind: kind.into().into(),
            build: Arc::new(move || build().map(|env| Box::new(env) as Box<dyn Env>)),
        }
    }

    /// The environment kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// A fresh instance.
    ///
    /// # Errors
    /// Whatever the environment's constructor returns.
    pub fn build(&self) -> Result<Box<dyn Env>, EnvError> {
        (self.build)()
    }
}

impl fmt::Debug for EnvFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnvFactory")
            .field("kind", &self.kind)
            .finish()
    }
}

/// Environments by name.
///
/// [`with_builtins`](Self::with_builtins) registers `frozen_lake`, `sokoban`, `larger_sokoban`,
/// `sokoban_vocab`, `shop` and `tool_use`. Options are read into the environment's config struct
/// over its defaults (the variant's preset for the Sokoban kinds); a config with
/// `#[serde(deny_unknown_fields)]` — all built-in ones — rejects unknown keys with an error that
/// names the key. Options are checked once, when the [`EnvFactory`] is made, so a bad config
/// fails at start-up, not in an environment thread.
///
/// ```
/// use roll_core::config::ComponentSpec;
/// use roll_core::{Env, Observation, StepResult};
/// use roll_env::EnvRegistry;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Default, Clone, Serialize, Deserialize)]
/// #[serde(deny_unknown_fields, default)]
/// struct CoinConfig { sides: u32 }
///
/// struct Coin(u32);
/// impl Env for Coin {
///     fn reset(&mut self, seed: u64) -> roll_core::Result<Observation> {
///         Ok(Observation::new(format!("seed {seed}, {} sides", self.0)))
///     }
///     fn step(&mut self, _: &str) -> roll_core::Result<StepResult> {
///         Ok(StepResult::terminated("heads", 1.0))
///     }
/// }
///
/// let mut registry = EnvRegistry::with_builtins();
/// registry.register("coin", |c: &CoinConfig| Ok(Coin(c.sides)));
/// let mut env = registry.build(&ComponentSpec::new("coin").with_option("sides", 2)).unwrap();
/// assert_eq!(env.reset(1).unwrap().text, "seed 1, 2 sides");
///
/// let err = registry.factory(&ComponentSpec::new("coin").with_option("sieds", 2)).unwrap_err();
/// assert!(err.to_string().contains("sieds"));
/// let err = registry.factory(&ComponentSpec::new("coins")).unwrap_err();
/// assert!(err.to_string().contains("coin"));
/// ```
#[derive(Clone, Default)]
pub struct EnvRegistry {
    entries: BTreeMap<String, Arc<MakeFactory>>,
}

/// The kinds [`EnvRegistry::with_builtins`] registers.
pub const BUILTIN_KINDS: [&str; 6] = [
    "frozen_lake",
    "sokoban",
    "larger_sokoban",
    "sokoban_vocab",
    "shop",
    "tool_use",
];

impl EnvRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// A registry with the built-in environments ([`BUILTIN_KINDS`]).
    pub fn with_builtins() -> Self {
        let mut r = Self::new();
        r.register("frozen_lake", |c: &FrozenLakeConfig| {
            FrozenLake::new(c.clone())
        });
        r.register_preset("sokoban", SokobanConfig::simple(), |c: &SokobanConfig| {
            Sokoban::new(c.clone())
        });
        r.register_preset(
            "larger_sokoban",
            SokobanConfig::larger(),
            |c: &SokobanConfig| Sokoban::new(c.clone()),
        );
        r.register_preset(
            "sokoban_vocab",
            SokobanConfig::different_grid_vocab(),
            |c: &SokobanConfig| Sokoban::new(c.clone()),
        );
        r.register("shop", |c: &ShopConfig| Shop::new(c.clone()));
        r.register("tool_use", |c: &ToolUseConfig| ToolUse::new(c.clone()));
        r
    }

    /// Registers `kind`: options are read into `C` over `C::default()` and `make` builds an
    /// environment from the result. Replaces an earlier registration of the same name.
    pub fn register<C, E, F>(&mut self, kind: &str, make: F) -> &mut Self
    where
        C: Default + Serialize + DeserializeOwned + Send + Sync + 'static,
        E: Env + 'static,
        F: Fn(&C) -> Result<E, EnvError> + Send + Sync + 'static,
    {
        self.register_preset(kind, C::default(), make)
    }

    /// Registers `kind` with `preset` as the defaults that options override (how the Sokoban
    /// variants share one config type).
    pub fn register_preset<C, E, F>(&mut self, kind: &str, preset: C, make: F) -> &mut Self
    where
        C: Serialize + DeserializeOwned + Send + Sync + 'static,
        E: Env + 'static,
        F: Fn(&C) -> Result<E, EnvError> + Send + Sync + 'static,
    {
        let base = serde_json::to_value(&preset);
        let make = Arc::new(make);
        let name: Arc<str> = kind.into();
        let factory = move |options: &EnvOptions| -> Result<EnvFactory, EnvError> {
            let invalid = |message: String| EnvError::InvalidOptions {
                kind: name.to_string(),
                message,
            };
            let mut value = base.as_ref().map_err(|e| invalid(e.to_string()))?.clone();
            if let serde_json::Value::Object(map) = &mut value {
                map.extend(options.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            let config: Arc<C> =
                Arc::new(serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?);
            // Build one instance now so that a bad value fails here, not in a thread.
            make(&config)?;
            let make = make.clone();
            Ok(EnvFactory::new(name.to_string(), move || make(&config)))
        };
        self.entries.insert(kind.to_string(), Arc::new(factory));
        self
    }

    /// Registers `kind` with a function from raw options to a factory, for environments whose
    /// options are not one serde struct.
    pub fn register_factory(
        &mut self,
        kind: &str,
        make: impl Fn(&EnvOptions) -> Result<EnvFactory, EnvError> + Send + Sync + 'static,
    ) -> &mut Self {
        self.entries.insert(kind.to_string(), Arc::new(make));
        self
    }

    /// The registered names, sorted.
    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// A factory for `spec`, its options checked.
    ///
    /// # Errors
    /// [`EnvError::UnknownKind`], [`EnvError::InvalidOptions`] (naming the key), or the
    /// environment's own validation error.
    pub fn factory(&self, spec: &ComponentSpec) -> Result<EnvFactory, EnvError> {
        let make = self
            .entries
            .get(&spec.kind)
            .ok_or_else(|| EnvError::UnknownKind {
                kind: spec.kind.clone(),
                known: self.entries.keys().cloned().collect(),
            })?;
        make(&spec.options)
    }

    /// One environment for `spec`.
    ///
    /// # Errors
    /// As [`factory`](Self::factory).
    pub fn build(&self, spec: &ComponentSpec) -> Result<Box<dyn Env>, EnvError> {
        self.factory(spec)?.build()
    }
}

impl fmt::Debug for EnvRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.entries.keys()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_build_with_and_without_options() {
        let r = EnvRegistry::with_builtins();
        assert_eq!(r.kinds().count(), BUILTIN_KINDS.len());
        for kind in BUILTIN_KINDS {
            let mut env = r.build(&ComponentSpec::new(kind)).unwrap();
            assert!(env.reset(0).unwrap().text.contains("Turn 1:"), "{kind}");
        }
        let spec = ComponentSpec::new("larger_sokoban").with_option("max_steps", 7);
        let mut env = r.build(&spec).unwrap();
        let text = env.reset(0).unwrap().text;
        assert!(text.contains("7 actions left"), "{text}");
        assert_eq!(
            text.lines()
                .filter(|l| l.len() == 8 && l.starts_with('#'))
                .count(),
            8
        );
    }

    #[test]
    fn bad_options_name_the_key_or_the_value() {
        let r = EnvRegistry::with_builtins();
        let err = r
            .factory(&ComponentSpec::new("frozen_lake").with_option("is_slipery", false))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("is_slipery") && err.contains("frozen_lake"),
            "{err}"
        );
        let err = r
            .factory(&ComponentSpec::new("sokoban").with_option("num_boxes", 9))
            .unwrap_err()
            .to_string();
        assert!(err.contains("num_boxes"), "{err}");
        let err = r
            .factory(&ComponentSpec::new("shop").with_option("max_steps", "many"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("shop") && err.contains("many"), "{err}");
        let err = r
            .factory(&ComponentSpec::new("sokobn"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("sokobn") && err.contains("sokoban"), "{err}");
    }
}
