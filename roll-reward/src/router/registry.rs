//! [`RewardRegistry`]: reward workers built by name from a [`ComponentSpec`].

use super::context::{JudgeModel, RegistryContext};
use super::options::RouteOptions;
use super::wrapping::{WRAPPER_KEYS, WrapperOptions, apply_wrappers};
use crate::error::RewardError;
use crate::shared::SharedWorker;
use roll_core::config::ComponentSpec;
use roll_core::tokenizer::Tokenizer;
use roll_core::{Generate, RewardWorker};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A worker built from a spec: the worker with its value wrappers applied, and the route
/// options (timeout, concurrency) the router enforces around it.
#[derive(Debug, Clone)]
pub struct BuiltWorker {
    /// The worker.
    pub worker: SharedWorker,
    /// Timeout and concurrency for the route.
    pub options: RouteOptions,
}

type Factory =
    Arc<dyn Fn(Value, &RegistryContext) -> Result<SharedWorker, RewardError> + Send + Sync>;

/// Builds reward workers by name (`kind`) from a [`ComponentSpec`], as a run's
/// `[domains.<name>.reward]` config asks.
///
/// [`with_builtins`](Self::with_builtins) knows `math_rule`, `ifeval`, `format`,
/// `multiple_choice`, `code_sandbox` and `llm_judge` (which needs
/// [`with_judge`](Self::with_judge)); users
/// [`register`](Self::register) their own kinds — or replace a built-in — with a serde config
/// type and a constructor.
///
/// Options are split in two: the reserved [`WrapperOptions`] keys (`timeout_s`,
/// `max_concurrency`, `weight`, `clip`, `repetition_penalty`, `length_penalty`, `cache`) and the
/// rest, deserialised into the worker's own config. Give that config
/// `#[serde(deny_unknown_fields)]` (the built-ins all do) and a misspelt key is an error naming
/// it. Value wrappers are applied innermost first: repetition penalty, length penalty, weight,
/// clip, cache.
///
/// ```
/// use roll_core::config::ComponentSpec;
/// use roll_core::{Reward, Sample};
/// use roll_reward::router::RewardRegistry;
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// #[serde(deny_unknown_fields)]
/// struct LengthBonus { per_char: f32 }
///
/// let mut registry = RewardRegistry::with_builtins();
/// registry.register("length_bonus", |c: LengthBonus, _ctx| {
///     Ok(move |s: &Sample| c.per_char * s.text.len() as f32)
/// });
/// let built = registry.build(&ComponentSpec::new("length_bonus").with_option("per_char", 0.1).with_option("weight", 2.0))?;
/// let err = registry.build(&ComponentSpec::new("length_bonus").with_option("per_chr", 0.1)).unwrap_err();
/// assert!(err.to_string().contains("unknown field `per_chr`"), "{err}");
/// # Ok::<(), roll_reward::RewardError>(())
/// ```
#[derive(Clone, Default)]
pub struct RewardRegistry {
    factories: BTreeMap<String, Factory>,
    context: RegistryContext,
}

impl fmt::Debug for RewardRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RewardRegistry")
            .field("kinds", &self.kinds())
            .field("judge", &self.context.judge().is_some())
            .finish()
    }
}

impl RewardRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Gives the registry a judge policy and its tokenizer (for `llm_judge`).
    #[must_use]
    pub fn with_judge(mut self, policy: Arc<dyn Generate>, tokenizer: Arc<dyn Tokenizer>) -> Self {
        self.context.set_judge(JudgeModel { policy, tokenizer });
        self
    }

    /// Registers (or replaces) the kind `kind`: its options deserialise into `C`, and `build`
    /// makes the worker from them.
    pub fn register<C, W, F>(&mut self, kind: impl Into<String>, build: F) -> &mut Self
    where
        C: DeserializeOwned,
        W: RewardWorker + 'static,
        F: Fn(C, &RegistryContext) -> Result<W, RewardError> + Send + Sync + 'static,
    {
        let kind = kind.into();
        let name = kind.clone();
        let factory: Factory = Arc::new(move |options, ctx| {
            let config: C = serde_json::from_value(options).map_err(|e| {
                let mut message = e.to_string();
                if message.starts_with("unknown field") {
                    message.push_str(&format!(
                        " (or one of the wrapper options {})",
                        WRAPPER_KEYS
                            .iter()
                            .map(|k| format!("`{k}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
                RewardError::InvalidOptions {
                    kind: name.clone(),
                    at: String::new(),
                    message,
                }
            })?;
            Ok(SharedWorker::new(build(config, ctx)?))
        });
        self.factories.insert(kind, factory);
        self
    }

    /// The registered kinds, sorted.
    pub fn kinds(&self) -> Vec<&str> {
        self.factories.keys().map(String::as_str).collect()
    }

    /// Whether `kind` is registered.
    pub fn contains(&self, kind: &str) -> bool {
        self.factories.contains_key(kind)
    }

    /// Builds the worker `spec` describes.
    ///
    /// # Errors
    /// [`RewardError::UnknownKind`] listing the registered kinds;
    /// [`RewardError::InvalidOptions`] naming a bad key; whatever the worker's constructor
    /// returns.
    pub fn build(&self, spec: &ComponentSpec) -> Result<BuiltWorker, RewardError> {
        self.build_at(spec, "")
    }

    /// [`build`](Self::build), with errors saying the spec sits at `at` (a dotted config key).
    pub(crate) fn build_at(
        &self,
        spec: &ComponentSpec,
        at: &str,
    ) -> Result<BuiltWorker, RewardError> {
        let factory = self
            .factories
            .get(&spec.kind)
            .ok_or_else(|| RewardError::UnknownKind {
                kind: spec.kind.clone(),
                at: at.to_owned(),
                known: self.factories.keys().cloned().collect(),
            })?;
        let invalid = |message: String| RewardError::InvalidOptions {
            kind: spec.kind.clone(),
            at: at.to_owned(),
            message,
        };
        let (mut wrapper_map, mut own) = (Map::new(), Map::new());
        for (k, v) in &spec.options {
            if WRAPPER_KEYS.contains(&k.as_str()) {
                wrapper_map.insert(k.clone(), v.clone());
            } else {
                own.insert(k.clone(), v.clone());
            }
        }
        let wrappers: WrapperOptions = serde_json::from_value(Value::Object(wrapper_map))
            .map_err(|e| invalid(e.to_string()))?;
        let worker = factory(Value::Object(own), &self.context).map_err(|e| match e {
            RewardError::InvalidOptions {
                kind,
                at: a,
                message,
            } if a.is_empty() => RewardError::InvalidOptions {
                kind,
                at: at.to_owned(),
                message,
            },
            other => other,
        })?;
        let worker = apply_wrappers(worker, &wrappers).map_err(|e| invalid(e.to_string()))?;
        let mut options = RouteOptions::default();
        if let Some(t) = wrappers.timeout_s {
            let after = Duration::try_from_secs_f64(t)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    invalid(format!(
                        "`timeout_s` = {t} is not a positive number of seconds"
                    ))
                })?;
            options.timeout = Some(after);
        }
        if let Some(c) = wrappers.max_concurrency {
            if c == 0 {
                return Err(invalid(
                    "`max_concurrency` = 0; at least 1 is needed".to_owned(),
                ));
            }
            options.max_concurrency = c;
        }
        Ok(BuiltWorker { worker, options })
    }
}
