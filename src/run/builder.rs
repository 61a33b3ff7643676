//! [`RunBuilder`] → [`Run`]: a config (plus the user's own prompts, rewards and environments)
//! becomes a pipeline with a real actor, and the run loop that trains it.

use super::plan::{RolloutPlan, RunPlan};
use roll_backend_burn::{
    BurnPolicy, BurnReference, ChatTemplate, HfTokenizer, PolicyOptions, load_model,
};
use roll_core::config::Config;
use roll_core::pipeline::{RlvrPipeline, StepReport};
use roll_core::policy::{Generate, Score};
use roll_core::scheduler::{RlvrScheduler, Scheduler};
use roll_core::strategy::SingleDevice;
use roll_core::{Env, Error, Prompt, Result, RewardWorker, Tokenizer};
use roll_env::{AgenticScheduler, EnvManager, EnvRegistry};
use roll_reward::router::{PromptMixer, RewardRegistry, RewardRouter};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

/// Builds the scheduler around the actor's generating side (see [`RlvrPipeline::new`]).
type BuildScheduler = Box<dyn FnOnce(Arc<dyn Generate>) -> Result<Box<dyn Scheduler>>>;

/// Assembles a [`Run`] from a [`Config`]: the actor is the model of `model.source` as a
/// [`BurnPolicy`] (plus a [`BurnReference`] when the algorithm needs one), the rollout side is
/// what `pipeline` says. Your own parts join by name: an environment kind for
/// `agentic.env.kind`, a reward kind for `domains.<name>.reward.kind`, and the prompts of an RLVR
/// run.
///
/// ```no_run
/// # async fn demo() -> roll_core::Result<()> {
/// use roll::prelude::*;
/// let config = Config::from_file("examples/configs/rlvr_tiny.toml")?;
/// let prompts = (0..64).map(|i| Prompt::new(PromptId(i), "Q: 1+1=? A:", "arithmetic").with_ground_truth("2"));
/// let mut run = RunBuilder::new(config).prompts(prompts).build()?;
/// run.train().await?;
/// # Ok(()) }
/// ```
pub struct RunBuilder {
    config: Config,
    envs: EnvRegistry,
    rewards: RewardRegistry,
    dataset: Option<Vec<Prompt>>,
}

impl RunBuilder {
    /// A run of `config`, with roll's built-in environments and reward workers registered.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            envs: EnvRegistry::with_builtins(),
            rewards: RewardRegistry::with_builtins(),
            dataset: None,
        }
    }

    /// The dataset of an RLVR run, any tags mixed: each prompt is resolved to its domain by the
    /// config's tags (once, when the run is built, so an unknown tag is an error before anything
    /// generates), and every step draws the domains in their configured ratios, each domain's
    /// prompts repeating when used up.
    #[must_use]
    pub fn prompts(mut self, dataset: impl IntoIterator<Item = Prompt>) -> Self {
        self.dataset = Some(dataset.into_iter().collect());
        self
    }

    /// Registers a reward worker under `kind`, for `domains.<name>.reward.kind = "<kind>"` (it
    /// takes the wrapper options — timeout, weight, clip, ... — and no options of its own).
    #[must_use]
    pub fn reward(mut self, kind: &str, worker: impl RewardWorker + 'static) -> Self {
        let worker: Arc<dyn RewardWorker> = Arc::new(worker);
        self.rewards
            .register(kind, move |_: NoOptions, _| Ok(Shared(worker.clone())));
        self
    }

    /// Registers an environment under `kind`, for `agentic.env.kind = "<kind>"`: `make` builds a
    /// fresh instance (the manager builds one per episode slot, and again after a failure).
    #[must_use]
    pub fn env<E: Env + 'static>(
        mut self,
        kind: &str,
        make: impl Fn() -> E + Send + Sync + 'static,
    ) -> Self {
        self.envs.register(kind, move |_: &NoOptions| Ok(make()));
        self
    }

    /// Loads the model and tokenizer, starts the actor and builds the pipeline.
    ///
    /// # Errors
    /// A config that does not validate, a model directory that does not load, an RLVR run
    /// without prompts, an unknown reward or environment kind (named with its key).
    pub fn build(self) -> Result<Run> {
        let plan = RunPlan::from_config(&self.config)?;
        if let Some((spec, seed)) = &plan.model.new {
            roll_backend_burn::hf::write_new_model(spec, &plan.model.dir, *seed)?;
        }
        let device = roll_backend_burn::device(plan.model.device)?;
        let model = load_model(&plan.model.dir, &device)?;
        let mut tokenizer = HfTokenizer::from_dir(&plan.model.dir)?;
        if plan.model.plain_prompts {
            tokenizer = tokenizer.with_chat_template(ChatTemplate::Plain);
        }
        let tokenizer: Arc<dyn Tokenizer> = Arc::new(tokenizer);
        let options = PolicyOptions {
            strategy: SingleDevice::new(plan.model.device),
            engine: plan.engine.clone(),
            scoring: plan.scoring,
            ..PolicyOptions::default()
        };
        let reference: Option<Arc<dyn Score>> = if plan.algorithm.uses_reference() {
            Some(Arc::new(BurnReference::new(
                model.clone(),
                options.clone(),
            )?))
        } else {
            None
        };
        let actor = Arc::new(BurnPolicy::new(
            model,
            tokenizer.clone(),
            plan.trainer.clone(),
            options,
        )?);
        let config = self.config.clone();
        let scheduler = self.scheduler(&plan, tokenizer)?;
        let mut pipeline = RlvrPipeline::new(
            actor.clone(),
            scheduler,
            plan.algorithm.clone(),
            plan.pipeline.clone(),
        )?;
        if let Some(reference) = reference {
            pipeline = pipeline.with_reference(reference);
        }
        Run::start(plan, config, pipeline, actor)
    }

    /// The scheduler the plan describes, as the pipeline's factory: it receives the actor's
    /// generating side.
    fn scheduler(self, plan: &RunPlan, tokenizer: Arc<dyn Tokenizer>) -> Result<BuildScheduler> {
        let filter = plan.filter;
        let built: BuildScheduler = match &plan.rollout {
            RolloutPlan::Rlvr { scheduler, domains } => {
                let dataset = self.dataset.ok_or_else(|| {
                    Error::invalid_data(
                        "run",
                        "an RLVR run needs prompts: call RunBuilder::prompts",
                    )
                })?;
                let router = Arc::new(RewardRouter::from_config(domains, &self.rewards)?);
                let prompts =
                    PromptMixer::from_config(domains, dataset, scheduler.prompts_per_step)?;
                let config = scheduler.clone();
                Box::new(move |actor| {
                    let mut s = RlvrScheduler::new(config, actor, tokenizer, router, prompts)?;
                    if let Some(f) = filter {
                        s = s.with_filter(f);
                    }
                    Ok(Box::new(s) as Box<dyn Scheduler>)
                })
            }
            RolloutPlan::Agentic {
                manager,
                env,
                num_groups,
            } => {
                let factory = self.envs.factory(env)?;
                let (manager, num_groups) = (manager.clone(), *num_groups);
                Box::new(move |actor| {
                    let manager = EnvManager::new(manager, factory, actor, tokenizer)?;
                    let mut s = AgenticScheduler::new(manager, num_groups)?;
                    if let Some(f) = filter {
                        s = s.with_filter(f);
                    }
                    Ok(Box::new(s) as Box<dyn Scheduler>)
                })
            }
        };
        Ok(built)
    }
}

/// Options of a component registered from code: none (an empty table).
#[derive(Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NoOptions {}

/// A reward worker registered from code, shared by every domain that names its kind.
struct Shared(Arc<dyn RewardWorker>);

#[async_trait::async_trait]
impl RewardWorker for Shared {
    async fn score(&self, sample: &roll_core::Sample) -> Result<roll_core::Reward> {
        self.0.score(sample).await
    }
}

/// A training run: the pipeline, its actor, and the run directory it writes.
pub struct Run {
    plan: RunPlan,
    pipeline: RlvrPipeline,
    actor: Arc<BurnPolicy>,
    metrics: std::fs::File,
}

impl Run {
    fn start(
        plan: RunPlan,
        config: Config,
        pipeline: RlvrPipeline,
        actor: Arc<BurnPolicy>,
    ) -> Result<Self> {
        let dir = &plan.run.output_dir;
        let io = |action, path: PathBuf| {
            move |source| Error::Io {
                action,
                path,
                source,
            }
        };
        std::fs::create_dir_all(dir).map_err(io("cannot create the run directory", dir.clone()))?;
        let resolved = dir.join("config.toml");
        std::fs::write(&resolved, config.to_toml()?)
            .map_err(io("cannot write the resolved config", resolved.clone()))?;
        let path = dir.join("metrics.jsonl");
        let metrics = std::fs::File::create(&path)
            .map_err(io("cannot create the metrics file", path.clone()))?;
        Ok(Self {
            plan,
            pipeline,
            actor,
            metrics,
        })
    }

    /// The settings every component was built from.
    pub fn plan(&self) -> &RunPlan {
        &self.plan
    }

    /// The actor.
    pub fn actor(&self) -> &BurnPolicy {
        &self.actor
    }

    /// Exports the actor's current weights as a HuggingFace directory, beside the files of the
    /// directory the model came from (config with every key, tokenizer, generation config).
    ///
    /// # Errors
    /// If the source directory cannot be read again or the export cannot be written.
    pub fn export(&self, out_dir: impl AsRef<std::path::Path>) -> Result<()> {
        let source = roll_backend_burn::hf::HfSource::open(&self.plan.model.dir)?;
        let options = roll_backend_burn::SaveOptions::default();
        Ok(self.actor.export(&source, out_dir, &options)?)
    }

    /// Runs one step and appends its metrics to `metrics.jsonl`.
    ///
    /// # Errors
    /// As [`RlvrPipeline::step`], or if the metrics cannot be written.
    pub async fn step(&mut self) -> Result<StepReport> {
        let report = self.pipeline.step().await?;
        let mut line = serde_json::Map::new();
        line.insert("step".into(), report.step.into());
        line.insert("weight_version".into(), report.weight_version.0.into());
        line.insert("reward_mean".into(), f64::from(report.reward_mean).into());
        line.insert("rollout_s".into(), report.rollout_time.as_secs_f64().into());
        line.insert("train_s".into(), report.train_time.as_secs_f64().into());
        for (k, v) in &report.metrics {
            line.insert(k.clone(), (*v).into());
        }
        let path = self.plan.run.output_dir.join("metrics.jsonl");
        writeln!(self.metrics, "{}", serde_json::Value::Object(line)).map_err(|source| {
            Error::Io {
                action: "cannot append to the metrics file",
                path,
                source,
            }
        })?;
        Ok(report)
    }

    /// Runs the remaining steps up to `run.max_steps`, printing a report line every
    /// `run.log_every` steps; returns every step's report.
    ///
    /// # Errors
    /// As [`Run::step`].
    pub async fn train(&mut self) -> Result<Vec<StepReport>> {
        let mut reports = Vec::new();
        while self.pipeline.steps_taken() < self.plan.run.max_steps {
            let report = self.step().await?;
            if (report.step + 1) % self.plan.run.log_every == 0 {
                println!("[{}] {report}", self.plan.run.name);
            }
            reports.push(report);
        }
        Ok(reports)
    }
}
