//! [`RunBuilder`]: a config (plus the user's own prompts, rewards, environments and SFT data)
//! becomes a [`Run`] with a real actor.

use super::checkpoint::{self, ACTOR, CHECKPOINTS, Resumed, SftProgress, StageState};
use super::distributed;
use super::plan::{RolloutPlan, RunPlan, SftPlan};
use super::runner::{ActorStart, BuildRl, Evaluation, Restored, Run, SftStage, Stage};
use roll_backend_burn::hf::HfSource;
use roll_backend_burn::remote::Disaggregated;
use roll_backend_burn::train::TrainerConfig;
use roll_backend_burn::{
    BurnPolicy, BurnReference, CausalLm, ChatTemplate, HfTokenizer, Placement, PolicyOptions,
};
use roll_core::config::{Config, DomainMap, LrSchedule};
use roll_core::pipeline::{RlvrPipeline, SftExample, SftPipeline};
use roll_core::policy::{Generate, Policy, Score};
use roll_core::scheduler::{RlvrScheduler, Scheduler};
use roll_core::strategy::Messenger;
use roll_core::{Env, Error, Prompt, Result, RewardWorker, Tokenizer};
use roll_env::manager::{Incident, IncidentHook};
use roll_env::{AgenticScheduler, EnvManager, EnvRegistry};
use roll_reward::router::{PromptMixer, RewardRegistry, RewardRouter};
use std::sync::Arc;

/// Builds the scheduler around the actor's generating side (see [`RlvrPipeline::new`]).
type BuildScheduler = Box<dyn FnOnce(Arc<dyn Generate>) -> Result<Box<dyn Scheduler>> + Send>;

/// Assembles a [`Run`] from a [`Config`]: the actor is the model of `model.source` as a
/// [`BurnPolicy`] (plus a [`BurnReference`] when the algorithm needs one), the rollout side is
/// what `pipeline` says. Your own parts join by name: an environment kind for
/// `agentic.env.kind`, a reward kind for `domains.<name>.reward.kind`; your data joins by
/// method: the prompts of an RLVR run, the pairs of an `[sft]` warm start, held-out prompts.
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
    sft: Option<Vec<SftExample>>,
    sft_eval: Vec<SftExample>,
    eval: Vec<Prompt>,
    eval_seeds: Vec<u64>,
    incident_hooks: Vec<IncidentHook>,
    /// Rank 0 of a run across processes, when this run leads one.
    group: Option<Arc<dyn Messenger>>,
}

impl RunBuilder {
    /// A run of `config`, with roll's built-in environments and reward workers registered.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            envs: EnvRegistry::with_builtins(),
            rewards: RewardRegistry::with_builtins(),
            dataset: None,
            sft: None,
            sft_eval: Vec::new(),
            eval: Vec::new(),
            eval_seeds: Vec::new(),
            incident_hooks: Vec::new(),
            group: None,
        }
    }

    /// The dataset of an RLVR run, any tags mixed: each prompt is resolved to its domain by the
    /// config's tags (once, when the run is built, so an unknown tag is an error before anything
    /// generates), and every step draws the domains in their configured ratios, each domain's
    /// prompts repeating when used up. The dataset is collected here, so it must be finite.
    #[must_use]
    pub fn prompts(mut self, dataset: impl IntoIterator<Item = Prompt>) -> Self {
        self.dataset = Some(dataset.into_iter().collect());
        self
    }

    /// The prompt/response pairs of the `[sft]` warm start (e.g.
    /// [`SftExample::read_jsonl`]), in the order a curriculum wants them when `sft.shuffle` is
    /// off; `held_out` pairs give the SFT stage's evaluation loss.
    #[must_use]
    pub fn sft_examples(
        mut self,
        examples: impl IntoIterator<Item = SftExample>,
        held_out: impl IntoIterator<Item = SftExample>,
    ) -> Self {
        self.sft = Some(examples.into_iter().collect());
        self.sft_eval = held_out.into_iter().collect();
        self
    }

    /// Held-out prompts (with ground truths), answered greedily and scored by the domains' reward
    /// workers before RL, every `run.eval_every` steps and after RL. They are also written to
    /// `eval_prompts.jsonl` in the run directory, so any framework can evaluate the exported
    /// models on exactly these prompts.
    #[must_use]
    pub fn eval_prompts(mut self, prompts: impl IntoIterator<Item = Prompt>) -> Self {
        self.eval = prompts.into_iter().collect();
        self
    }

    /// Held-out environment seeds of an agentic run: one greedy episode each (sampling seeds
    /// aside, the same settings as training episodes) before RL, every `run.eval_every` steps
    /// and after RL; the success rate (the environment's `success` report on the last step) is
    /// the run's held-out accuracy. The seeds are written to `eval_seeds.json` in the run
    /// directory. Training episodes play seeds drawn from the run seed over all of `u64`, so a
    /// held-out seed meets RL only by a one-in-2⁶⁴ chance; two seeds can still deal the same
    /// puzzle, which the agentic examples rule out for their warm start by comparing renderings.
    #[must_use]
    pub fn eval_seeds(mut self, seeds: impl IntoIterator<Item = u64>) -> Self {
        self.eval_seeds = seeds.into_iter().collect();
        self
    }

    /// Makes this process rank 0 of a run across processes: it runs the pipeline and trains;
    /// ranks 1.. of `group` run [`follow`](super::follow) with the same config. With
    /// `rollout.ranks = 0` each of them is one more replica of the actor's trainer: the steps
    /// are split across the group by tokens and their gradients summed (see
    /// [`roll_backend_burn::train::DataParallel::leader`]). With `rollout.ranks = R` the
    /// last `R` ranks only generate, the others train as a data-parallel group of their own,
    /// and after each step this rank sends the rollout ranks the new weights
    /// ([`Disaggregated`]). `group` is typically `roll_mpi`'s strategy under
    /// `mpirun` or `srun`.
    ///
    /// With `[sft]` the training ranks fine-tune together first (data-parallel, and holding
    /// parts of the actor as its RL stage would), then start RL from the export. [`RunBuilder::build`] then refuses `model.data_parallel` above 1 where
    /// several processes train.
    #[must_use]
    pub fn lead(mut self, group: Arc<dyn Messenger>) -> Self {
        self.group = Some(group);
        self
    }

    /// Calls `hook` with every incident of an agentic run's environments — a panic, a failed
    /// episode, a step cut at `agentic.step_timeout`, an episode the watchdog saw make no
    /// progress for `agentic.hung_timeout` — as it happens (on the manager's task: keep it
    /// short). The run logs each one as a `tracing` warning either way; a hook is for alerting
    /// or counting.
    #[must_use]
    pub fn on_incident(mut self, hook: impl Fn(&Incident) + Send + Sync + 'static) -> Self {
        self.incident_hooks.push(Arc::new(hook));
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

    /// Writes the model of a `new` source, loads the model and tokenizer, and builds the stages:
    /// the SFT pipeline (with `[sft]`) and the RL pipeline (at once without `[sft]`, else when
    /// SFT ends, from the fine-tuned weights). With `run.resume`, the stage of the newest
    /// readable checkpoint is restored instead (a fresh start when there is none); without it,
    /// checkpoints of an earlier run in the same directory are deleted.
    ///
    /// # Errors
    /// A config that does not validate, a model directory that does not load, an RLVR run
    /// without prompts, an unknown reward or environment kind (named with its key), `[sft]`
    /// without SFT examples or SFT examples without `[sft]`, `run.eval_every` without held-out
    /// prompts, held-out prompts in an agentic run, a checkpoint that does not fit the run.
    /// Leading a run across processes ([`RunBuilder::lead`]), the error also ends the job
    /// ([`Strategy::abort`](roll_core::strategy::Strategy::abort), naming rank 0): the other
    /// ranks wait for this one, and would wait for ever.
    pub fn build(self) -> Result<Run> {
        let group = self.group.clone();
        let built = self.build_run();
        if let (Err(e), Some(group)) = (&built, group) {
            group.abort(&format!("rank 0 (controller): {e}"));
        }
        built
    }

    fn build_run(mut self) -> Result<Run> {
        let mut plan = RunPlan::from_config(&self.config)?;
        for caution in self.config.cautions() {
            tracing::warn!("{caution}");
        }
        let roles = match &self.group {
            Some(group) => Some(distributed::Roles::of(&plan, group.world_size())?),
            None => {
                distributed::check_single_process(&plan)?;
                None
            }
        };
        let root = plan.run.output_dir.join(CHECKPOINTS);
        let (found, skipped) = if plan.run.resume {
            checkpoint::newest(&root)?
        } else {
            checkpoint::clear(&root)?;
            (None, Vec::new())
        };
        if found.is_none()
            && let Some((spec, seed)) = &plan.model.new
        {
            // A learned tokenizer's corpus is the text the model is first trained on.
            let corpus: Vec<&str> = self
                .sft
                .iter()
                .flatten()
                .flat_map(SftExample::texts)
                .collect();
            roll_backend_burn::hf::write_new_model(spec, &plan.model.dir, *seed, &corpus)?;
        }
        let device = roll_backend_burn::device(plan.model.device)?;
        let source = HfSource::open(&plan.model.dir)?;
        let experts = match source.config().model_type.as_str() {
            "qwen3_moe" => source.config().num_experts.unwrap_or(0),
            _ => 0,
        };
        if plan.rollout_experts > 1 && experts < plan.rollout_experts {
            // Each rollout rank of a group holds at least one expert of every mixture.
            return Err(Error::InvalidValue {
                key: "rollout.expert_parallel".into(),
                value: plan.rollout_experts.to_string(),
                allowed: format!(
                    "1 for this model ({} with {experts} experts): the rollout ranks divide a \
                     mixture of experts' experts, at least one each",
                    source.config().model_type
                ),
                origin: None,
            });
        }
        if let Some((kind, width)) = plan.model.parts {
            distributed::check_divided_experts(source.config(), kind, width)?;
        }
        if let (RolloutPlan::Agentic { manager, .. }, Some(context)) =
            (&mut plan.rollout, source.config().max_position_embeddings)
        {
            // An episode ends when its next turn would not fit the model's context (the
            // engine refuses a request that does not).
            manager.episode.max_context_tokens = context;
        }
        let mut tokenizer = HfTokenizer::from_dir(&plan.model.dir)?;
        if plan.model.plain_prompts {
            tokenizer = tokenizer.with_chat_template(ChatTemplate::Plain);
        }
        let tokenizer: Arc<dyn Tokenizer> = Arc::new(tokenizer);
        let sft = self.sft_data(&plan)?;
        let local = Placement::Devices(plan.model.trainer_devices.clone());
        // The training ranks that follow this one, told where the RL stage starts when SFT ends.
        let mut followers = None;
        let (placement, rollout) = match (&self.group, roles) {
            (Some(group), Some(roles)) => {
                let actor = match (&found, &sft) {
                    (Some((dir, _)), _) => distributed::StartFrom::Checkpoint(dir.join(ACTOR)),
                    (None, Some((sft, data))) => distributed::StartFrom::Weights {
                        dir: plan.model.dir.clone(),
                        trainer: Box::new(sft_trainer(sft, data.train.len())?),
                    },
                    (None, None) => distributed::StartFrom::Weights {
                        dir: plan.model.dir.clone(),
                        trainer: Box::new(plan.trainer.clone()),
                    },
                };
                let in_sft = match &found {
                    Some((_, state)) => matches!(state.stage, StageState::Sft { .. }),
                    None => sft.is_some(),
                };
                distributed::announce(group.as_ref(), &distributed::Start { actor, sft: in_sft })?;
                let trainers = roles.trainer_groups(group, &plan)?.ok_or_else(|| {
                    Error::invalid_data("run", "rank 0 is not among the training ranks")
                })?;
                // Rank 0 holds no rollout rank's experts, but forms their groups with the job.
                roles.rollout_experts(group, &plan)?;
                let placement = if trainers.all.world_size() > 1 {
                    followers = Some(trainers.all.clone());
                    Placement::Leader {
                        device: plan.model.device,
                        group: trainers.all,
                        parts: trainers.parts,
                    }
                } else {
                    local
                };
                match roles {
                    distributed::Roles::Colocated => (placement, None),
                    distributed::Roles::Disaggregated { rollout, .. } => (
                        placement,
                        Some((group.clone(), rollout, plan.rollout_experts)),
                    ),
                }
            }
            _ => (local, None),
        };
        let options = PolicyOptions {
            placement,
            engine: plan.engine.clone(),
            scoring: plan.scoring,
            gap_probe_tokens: plan.gap_probe_tokens,
            ..PolicyOptions::default()
        };
        let (rl, eval_reward) =
            self.rl_stage(&plan, tokenizer.clone(), options.clone(), &source, rollout)?;
        let eval = self.evaluation(&plan, eval_reward)?;
        let (stage, restored) = match found {
            None => {
                let model = Box::new(source.load_model(&device)?);
                let stage = match sft {
                    Some((sft, data)) => Stage::Sft {
                        sft: sft_stage(
                            sft,
                            data,
                            ActorStart::Weights(model),
                            SftProgress::default(),
                            &tokenizer,
                            &options,
                            followers,
                        )?,
                        build_rl: Some(rl),
                    },
                    None => {
                        let (pipeline, actor) = rl(ActorStart::Weights(model))?;
                        Stage::Rl {
                            pipeline: Box::new(pipeline),
                            actor,
                        }
                    }
                };
                (stage, None)
            }
            Some((dir, state)) => {
                let actor = ActorStart::Checkpoint(dir.join(ACTOR));
                let stage = match (state.stage, sft) {
                    (StageState::Sft { position, progress }, Some((sft, data))) => {
                        let mut sft =
                            sft_stage(sft, data, actor, progress, &tokenizer, &options, followers)?;
                        sft.pipeline.resume_at(position)?;
                        Stage::Sft {
                            sft,
                            build_rl: Some(rl),
                        }
                    }
                    (StageState::Sft { .. }, None) => {
                        return Err(Error::invalid_data(
                            "checkpoint",
                            format!(
                                "{} was taken in an SFT stage, and the config has no `[sft]`",
                                dir.display()
                            ),
                        ));
                    }
                    (StageState::Rl { pipeline: state }, _) => {
                        let (mut pipeline, actor) = rl(actor)?;
                        pipeline.restore(state)?;
                        Stage::Rl {
                            pipeline: Box::new(pipeline),
                            actor,
                        }
                    }
                };
                tracing::info!(checkpoint = %dir.display(), "resuming");
                let restored = Restored {
                    resumed: Resumed {
                        checkpoint: dir,
                        skipped,
                        metrics_lines_dropped: 0,
                    },
                    summary: state.summary,
                    metrics_lines: state.metrics_lines,
                    elapsed: state.elapsed,
                };
                (stage, Some(restored))
            }
        };
        Run::start(plan, &self.config, source, tokenizer, stage, eval, restored)
    }

    /// The SFT stage's plan with its training and held-out pairs; `None` without `[sft]`.
    ///
    /// # Errors
    /// `[sft]` without SFT examples, or SFT examples without `[sft]`.
    fn sft_data<'p>(&mut self, plan: &'p RunPlan) -> Result<Option<(&'p SftPlan, SftData)>> {
        match (&plan.sft, self.sft.take()) {
            (None, None) => Ok(None),
            (Some(_), None) => Err(Error::invalid_data(
                "run",
                "the config has an `[sft]` section but no SFT examples were given: call \
                 RunBuilder::sft_examples",
            )),
            (None, Some(_)) => Err(Error::invalid_data(
                "run",
                "SFT examples were given but the config has no `[sft]` section to train them \
                 with",
            )),
            (Some(sft), Some(train)) => Ok(Some((
                sft,
                SftData {
                    train,
                    held_out: std::mem::take(&mut self.sft_eval),
                },
            ))),
        }
    }

    /// The held-out prompts, resolved to their domains, with the reward that scores them.
    ///
    /// # Errors
    /// `run.eval_every` without held-out prompts, held-out prompts in an agentic run, a prompt
    /// whose tag names no domain.
    fn evaluation(
        &mut self,
        plan: &RunPlan,
        reward: Option<Arc<dyn RewardWorker>>,
    ) -> Result<Option<Evaluation>> {
        if let RolloutPlan::Agentic { manager, env, .. } = &plan.rollout {
            if !self.eval.is_empty() {
                return Err(Error::invalid_data(
                    "run",
                    "held-out prompts are scored by the `[domains]` reward workers, which an \
                     agentic run does not have: evaluate it on environment seeds with \
                     RunBuilder::eval_seeds",
                ));
            }
            if self.eval_seeds.is_empty() {
                if plan.run.eval_every > 0 {
                    return Err(Error::invalid_data(
                        "run",
                        "`run.eval_every` is set but no held-out seeds were given: call \
                         RunBuilder::eval_seeds",
                    ));
                }
                return Ok(None);
            }
            return Ok(Some(Evaluation::Episodes {
                seeds: std::mem::take(&mut self.eval_seeds),
                factory: self.envs.factory(env)?,
                episode: manager.episode.clone(),
                step_timeout: manager.step_timeout,
            }));
        }
        if !self.eval_seeds.is_empty() {
            return Err(Error::invalid_data(
                "run",
                "held-out environment seeds need `pipeline = \"agentic\"`; an RLVR run is \
                 evaluated on held-out prompts (RunBuilder::eval_prompts)",
            ));
        }
        if self.eval.is_empty() {
            if plan.run.eval_every > 0 {
                return Err(Error::invalid_data(
                    "run",
                    "`run.eval_every` is set but no held-out prompts were given: call \
                     RunBuilder::eval_prompts",
                ));
            }
            return Ok(None);
        }
        let (RolloutPlan::Rlvr { domains, .. }, Some(reward)) = (&plan.rollout, reward) else {
            return Err(Error::invalid_data(
                "run",
                "held-out prompts are scored by the `[domains]` reward workers, which an agentic \
                 run does not have",
            ));
        };
        let map = DomainMap::from_config(domains)?;
        let mut prompts = std::mem::take(&mut self.eval);
        for p in &mut prompts {
            map.resolve_prompt(p)?;
        }
        Ok(Some(Evaluation::Prompts { prompts, reward }))
    }

    /// The RL stage as a function of the weights it starts from, and the reward that scores
    /// held-out prompts (RLVR only).
    ///
    /// A resumed RL stage's reference is the model RL started from: the SFT stage's export
    /// (`sft_model/`) after a warm start, else the source model.
    fn rl_stage(
        &self,
        plan: &RunPlan,
        tokenizer: Arc<dyn Tokenizer>,
        options: PolicyOptions,
        source: &HfSource,
        rollout: Option<(Arc<dyn Messenger>, Vec<usize>, usize)>,
    ) -> Result<(BuildRl, Option<Arc<dyn RewardWorker>>)> {
        let (scheduler, reward) = self.scheduler(plan, tokenizer.clone())?;
        let (trainer, algorithm, pipeline) = (
            plan.trainer.clone(),
            plan.algorithm.clone(),
            plan.pipeline.clone(),
        );
        let rl_start = if plan.sft.is_some() {
            HfSource::open(plan.run.output_dir.join("sft_model"))
        } else {
            Ok(source.clone())
        };
        let device = plan.model.device;
        let build: BuildRl = Box::new(move |start: ActorStart| {
            let reference = |model: &CausalLm| -> Result<Option<Arc<dyn Score>>> {
                if !algorithm.uses_reference() {
                    return Ok(None);
                }
                Ok(Some(Arc::new(BurnReference::new(
                    model.clone(),
                    options.clone(),
                )?)))
            };
            let (actor, reference) = match start {
                ActorStart::Weights(model) => {
                    let model = *model;
                    let reference = reference(&model)?;
                    let actor = BurnPolicy::new(model, tokenizer, trainer, options.clone())?;
                    (actor, reference)
                }
                ActorStart::Checkpoint(dir) => {
                    let reference = if algorithm.uses_reference() {
                        let model = rl_start?.load_model(&roll_backend_burn::device(device)?)?;
                        reference(&model)?
                    } else {
                        None
                    };
                    (
                        BurnPolicy::resume(dir, tokenizer, options.clone())?,
                        reference,
                    )
                }
            };
            let generating: Arc<dyn Policy> = match rollout {
                Some((link, ranks, experts)) => Arc::new(Disaggregated::connect_with_experts(
                    actor.clone(),
                    link,
                    ranks,
                    experts,
                )?),
                None => Arc::new(actor.clone()),
            };
            let actor = Arc::new(actor);
            let mut rl = RlvrPipeline::new(generating, scheduler, algorithm, pipeline)?;
            if let Some(reference) = reference {
                rl = rl.with_reference(reference);
            }
            Ok((rl, actor))
        });
        Ok((build, reward))
    }

    /// The scheduler the plan describes, as the pipeline's factory (it receives the actor's
    /// generating side), and the reward router of an RLVR run.
    fn scheduler(
        &self,
        plan: &RunPlan,
        tokenizer: Arc<dyn Tokenizer>,
    ) -> Result<(BuildScheduler, Option<Arc<dyn RewardWorker>>)> {
        let filter = plan.filter;
        Ok(match &plan.rollout {
            RolloutPlan::Rlvr { scheduler, domains } => {
                let dataset = self.dataset.clone().ok_or_else(|| {
                    Error::invalid_data(
                        "run",
                        "an RLVR run needs prompts: call RunBuilder::prompts",
                    )
                })?;
                let router = Arc::new(RewardRouter::from_config(domains, &self.rewards)?);
                let prompts =
                    PromptMixer::from_config(domains, dataset, scheduler.prompts_per_step)?;
                let config = scheduler.clone();
                let reward: Arc<dyn RewardWorker> = router.clone();
                let build: BuildScheduler = Box::new(move |actor| {
                    let mut s = RlvrScheduler::new(config, actor, tokenizer, router, prompts)?;
                    if let Some(f) = filter {
                        s = s.with_filter(f);
                    }
                    Ok(Box::new(s) as Box<dyn Scheduler>)
                });
                (build, Some(reward))
            }
            RolloutPlan::Agentic {
                manager,
                env,
                num_groups,
            } => {
                let factory = self.envs.factory(env)?;
                let (manager, num_groups) = (manager.clone(), *num_groups);
                let hooks = self.incident_hooks.clone();
                let report: IncidentHook = Arc::new(move |incident: &Incident| {
                    tracing::warn!("{incident}");
                    for hook in &hooks {
                        hook(incident);
                    }
                });
                let build: BuildScheduler = Box::new(move |actor| {
                    let manager = EnvManager::new(manager, factory, actor, tokenizer)?
                        .with_incident_hook(report);
                    let mut s = AgenticScheduler::new(manager, num_groups)?;
                    if let Some(f) = filter {
                        s = s.with_filter(f);
                    }
                    Ok(Box::new(s) as Box<dyn Scheduler>)
                });
                (build, None)
            }
        })
    }
}

/// The pairs of the SFT stage.
struct SftData {
    train: Vec<SftExample>,
    held_out: Vec<SftExample>,
}

/// The SFT stage: its actor (new from weights, with the learning-rate schedule sized to the
/// dataset, or resumed from a checkpoint) and its pipeline; `followers` are the training ranks
/// of a run across processes that this one leads (see [`SftStage::followers`]).
///
/// # Errors
/// As [`sft_trainer`], [`BurnPolicy::new`], [`BurnPolicy::resume`] and [`SftPipeline::new`].
fn sft_stage(
    plan: &SftPlan,
    data: SftData,
    start: ActorStart,
    progress: SftProgress,
    tokenizer: &Arc<dyn Tokenizer>,
    options: &PolicyOptions,
    followers: Option<Arc<dyn Messenger>>,
) -> Result<Box<SftStage>> {
    let policy = Arc::new(match start {
        ActorStart::Weights(model) => BurnPolicy::new(
            *model,
            tokenizer.clone(),
            sft_trainer(plan, data.train.len())?,
            options.clone(),
        )?,
        ActorStart::Checkpoint(dir) => BurnPolicy::resume(dir, tokenizer.clone(), options.clone())?,
    });
    let pipeline = SftPipeline::new(
        policy.clone(),
        tokenizer.clone(),
        data.train,
        plan.pipeline.clone(),
    )?
    .with_eval(data.held_out)?;
    Ok(Box::new(SftStage {
        pipeline,
        policy,
        followers,
        eval_every: plan.eval_every,
        save_every: plan.save_every,
        progress,
    }))
}

/// The SFT stage's trainer for `examples` training pairs: `sft.*`'s, its learning-rate schedule
/// sized to the stage's steps.
///
/// # Errors
/// `sft.warmup_steps` not shorter than a decaying schedule's stage.
fn sft_trainer(plan: &SftPlan, examples: usize) -> Result<TrainerConfig> {
    let mut trainer = plan.trainer.clone();
    let steps =
        examples.div_ceil(plan.pipeline.batch_size) as u64 * u64::from(plan.pipeline.epochs);
    let decays = !matches!(trainer.schedule, LrSchedule::Constant {});
    if decays && trainer.warmup_steps >= steps {
        return Err(Error::InvalidValue {
            key: "sft.warmup_steps".into(),
            value: trainer.warmup_steps.to_string(),
            allowed: format!(
                "fewer than the SFT stage's {steps} steps ({examples} examples, batches of {}, \
                 {} epochs): the schedule decays after the warm-up",
                plan.pipeline.batch_size, plan.pipeline.epochs
            ),
            origin: None,
        });
    }
    trainer.total_steps = Some(steps);
    Ok(trainer)
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
