//! [`RewardRouter`]: sends each sample to its domain's worker, isolated and bounded.

use super::isolate::{Outcome, run_isolated};
use super::options::RouteOptions;
use super::quota::DomainQuota;
use super::registry::RewardRegistry;
use crate::error::RewardError;
use crate::join::join_all;
use crate::shared::SharedWorker;
use async_trait::async_trait;
use roll_core::config::DomainConfig;
use roll_core::{Reward, RewardWorker, Sample};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::Semaphore;

struct Route {
    worker: SharedWorker,
    options: RouteOptions,
    permits: Arc<Semaphore>,
}

struct Inner {
    routes: BTreeMap<String, Route>,
    ratios: Vec<(String, f64)>,
}

/// Sends each sample to the reward worker of its prompt's domain (ROLL's per-domain reward
/// clusters), and is itself a [`RewardWorker`], so a scheduler holds one worker whatever the
/// mix of domains.
///
/// * **Routing**: on `sample.prompt.domain`, which is already resolved: the prompt's dataset
///   tag was mapped to its domain once, when the prompt entered the pipeline
///   ([`PromptMixer`](super::PromptMixer), by the run's
///   [`DomainMap`](roll_core::config::DomainMap)). The router knows no tags. A domain it does
///   not route is [`RewardError::UnknownDomain`], listing the known domains, and costs that
///   sample only.
/// * **Isolation**: every call runs in its own Tokio task. A worker that returns an error,
///   panics, or runs past its domain's timeout costs exactly that sample an `Err` (the
///   scheduler drops it and counts it); the panic is caught, the timed-out task aborted.
/// * **Concurrency**: each domain has its own limit (a semaphore), so a slow domain queues its
///   own samples and never holds up another's. A worker that blocks its thread (instead of
///   awaiting) keeps its slot until it returns, so a stuck worker can take at most its
///   domain's slots.
/// * **Metrics** (through the `metrics` facade): counter `roll_reward_scored_total` with labels
///   `domain` and `outcome` (`ok`, `error`, `panic`, `timeout`), histogram
///   `roll_reward_seconds` with label `domain`.
/// * **Ratios**: [`quota`](Self::quota) gives the per-step prompt counts of each domain.
///
/// Each call clones the sample (token vectors included) into its task. Requires a Tokio
/// runtime with timers enabled (`#[tokio::main]` and `#[tokio::test]` have them; without one
/// the call is a [`RewardError::NoRuntime`] error, without timers Tokio panics); the
/// multi-threaded runtime is needed for a worker that blocks its thread to be timed out.
///
/// ```
/// use roll_core::{Prompt, PromptId, Sample, SampleId, GroupId, RewardWorker};
/// use roll_reward::math::MathRuleWorker;
/// use roll_reward::router::RewardRouter;
/// use std::sync::Arc;
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let router = RewardRouter::builder()
///     .route("math", MathRuleWorker::default())
///     .route("length", |s: &Sample| s.text.len() as f32)
///     .build()?;
/// // A gsm8k prompt, already resolved to its domain.
/// let prompt = Prompt::new(PromptId(0), "2+2?", "gsm8k")
///     .with_domain("math")
///     .with_ground_truth("4");
/// let mut sample = Sample::new(SampleId(0), GroupId(0), Arc::new(prompt), vec![]);
/// sample.text = r"\boxed{4}".into();
/// assert_eq!(router.score(&sample).await?.value, 1.0);
/// # Ok::<(), roll_core::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct RewardRouter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RewardRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RewardRouter")
            .field("domains", &self.domains())
            .finish()
    }
}

impl RewardRouter {
    /// A builder with no routes.
    pub fn builder() -> RewardRouterBuilder {
        RewardRouterBuilder::default()
    }

    /// The router a run's `[domains]` config describes: each domain's `reward` built by
    /// `registry`, and its ratio. The domains' `tags` are not the router's business: prompts
    /// reach it resolved ([`PromptMixer::from_config`](super::PromptMixer::from_config)).
    ///
    /// # Errors
    /// The first domain whose worker cannot be built (the error names the config key
    /// `domains.<name>.reward`), or an invalid ratio.
    pub fn from_config(
        domains: &BTreeMap<String, DomainConfig>,
        registry: &RewardRegistry,
    ) -> Result<Self, RewardError> {
        let mut b = Self::builder();
        for (name, domain) in domains {
            let built = registry.build_at(&domain.reward, &format!("domains.{name}.reward"))?;
            b = b.route_with(name.clone(), built.worker, built.options);
            b = b.ratio(name.clone(), domain.ratio);
        }
        b.build()
    }

    /// The routed domains, sorted.
    pub fn domains(&self) -> Vec<&str> {
        self.inner.routes.keys().map(String::as_str).collect()
    }

    /// The route options of `domain`.
    pub fn options(&self, domain: &str) -> Option<RouteOptions> {
        self.inner.routes.get(domain).map(|r| r.options)
    }

    /// The per-step prompt quota of the domains' ratios (every domain ratio 1 unless set).
    ///
    /// # Errors
    /// If the ratios are invalid (all 0).
    pub fn quota(&self) -> Result<DomainQuota, RewardError> {
        DomainQuota::new(self.inner.ratios.iter().cloned())
    }

    /// Scores all `samples` concurrently (each domain within its own limit); results are in the
    /// order of `samples`.
    pub async fn score_batch(&self, samples: &[Sample]) -> Vec<roll_core::Result<Reward>> {
        join_all(samples.iter().map(|s| self.score(s)).collect()).await
    }
}

#[async_trait]
impl RewardWorker for RewardRouter {
    async fn score(&self, sample: &Sample) -> roll_core::Result<Reward> {
        let domain = sample.prompt.domain.as_str();
        let Some(route) = self.inner.routes.get(domain) else {
            return Err(RewardError::UnknownDomain {
                domain: domain.to_owned(),
                known: self.inner.routes.keys().cloned().collect(),
            }
            .into());
        };
        let start = Instant::now();
        let permit = route
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| roll_core::Error::Closed("the reward router"))?;
        let (result, outcome) = run_isolated(
            domain,
            route.worker.clone(),
            sample.clone(),
            permit,
            route.options.timeout,
        )
        .await;
        let label = domain.to_owned();
        metrics::counter!("roll_reward_scored_total", "domain" => label.clone(), "outcome" => outcome.name())
            .increment(1);
        metrics::histogram!("roll_reward_seconds", "domain" => label)
            .record(start.elapsed().as_secs_f64());
        debug_assert!(result.is_ok() == (outcome == Outcome::Ok));
        result
    }
}

/// Builds a [`RewardRouter`] route by route.
#[derive(Default)]
pub struct RewardRouterBuilder {
    routes: Vec<(String, SharedWorker, RouteOptions)>,
    ratios: BTreeMap<String, f64>,
    defaults: RouteOptions,
}

impl RewardRouterBuilder {
    /// Routes `domain` to `worker` with the default options.
    #[must_use]
    pub fn route(self, domain: impl Into<String>, worker: impl RewardWorker + 'static) -> Self {
        let options = self.defaults;
        self.route_with(domain, SharedWorker::new(worker), options)
    }

    /// Routes `domain` to `worker` with `options`.
    #[must_use]
    pub fn route_with(
        mut self,
        domain: impl Into<String>,
        worker: SharedWorker,
        options: RouteOptions,
    ) -> Self {
        self.routes.push((domain.into(), worker, options));
        self
    }

    /// Options for routes added later with [`route`](Self::route).
    #[must_use]
    pub fn default_options(mut self, options: RouteOptions) -> Self {
        self.defaults = options;
        self
    }

    /// Sets the sampling ratio of `domain` (default 1).
    #[must_use]
    pub fn ratio(mut self, domain: impl Into<String>, ratio: f64) -> Self {
        self.ratios.insert(domain.into(), ratio);
        self
    }

    /// The router.
    ///
    /// # Errors
    /// [`RewardError::InvalidConfig`] for no routes, a domain routed twice, a concurrency of 0,
    /// or a ratio for an unknown domain or out of range.
    pub fn build(self) -> Result<RewardRouter, RewardError> {
        if self.routes.is_empty() {
            return Err(RewardError::invalid_config("reward router", "no routes"));
        }
        let mut routes = BTreeMap::new();
        for (domain, worker, options) in self.routes {
            if options.max_concurrency == 0 {
                return Err(RewardError::invalid_config(
                    format!("domains.{domain}.reward.max_concurrency"),
                    "0; at least 1 is needed",
                ));
            }
            let route = Route {
                worker,
                permits: Arc::new(Semaphore::new(options.max_concurrency)),
                options,
            };
            if routes.insert(domain.clone(), route).is_some() {
                return Err(RewardError::invalid_config(
                    format!("domains.{domain}"),
                    "the domain is routed twice",
                ));
            }
        }
        if let Some(unknown) = self.ratios.keys().find(|d| !routes.contains_key(*d)) {
            return Err(RewardError::invalid_config(
                format!("domains.{unknown}.ratio"),
                format!("a ratio for `{unknown}`, which is not a routed domain"),
            ));
        }
        let ratios: Vec<(String, f64)> = routes
            .keys()
            .map(|d| (d.clone(), self.ratios.get(d).copied().unwrap_or(1.0)))
            .collect();
        DomainQuota::new(ratios.iter().cloned())?;
        Ok(RewardRouter {
            inner: Arc::new(Inner { routes, ratios }),
        })
    }
}
