//! A run across processes: rank 0 runs the whole pipeline (rollouts, rewards, the controller)
//! and trains ([`RunBuilder::lead`](super::RunBuilder::lead)); every other rank runs
//! [`follow`], in the role the config gives it:
//!
//! - **colocated** (`rollout.ranks = 0`): every rank is one more data-parallel replica of the
//!   actor's trainer; rank 0 generates beside its replica.
//! - **disaggregated** (`rollout.ranks = R > 0`): the last `R` ranks only generate, each with
//!   its own inference engine ([`roll_backend_burn::remote`]); the first `N − R` ranks train, as
//!   a data-parallel group of their own (a sub-group of the job), and rank 0 sends the rollout
//!   ranks the new weights after every step. With one training rank its replicas are in process
//!   (`model.data_parallel`).
//!
//! With `model.tensor_parallel = T` (or `model.pipeline_parallel = P`) the training ranks hold
//! the actor in copies of `T` (`P`) consecutive ranks, each rank a slice of every layer (a block
//! of the layers); the copies train data-parallel, every rank of a copy on the copy's shard of
//! each step. Whenever the leader needs the whole model — to start its engine, after each step,
//! to sync the rollout ranks — its copy gathers it ([`roll_backend_burn::CausalLm::gather`]).
//!
//! Before anything trains, the leader tells every rank where the actor starts — the model
//! directory and the trainer's config, or the checkpoint it resumes — so the others build the
//! same model from the same files (a shared file system, as on a cluster). From then on they
//! only serve the leader. A run with `[sft]` has two stages, each with its own trainers: when
//! the SFT stage ends the leader releases the training ranks, and tells them that the RL stage
//! starts from the fine-tuned export (`sft_model/`).

use roll_backend_burn::engine::{DecoderKind, Engine, EngineConfig, ServedWeights};
use roll_backend_burn::hf::HfSource;
use roll_backend_burn::remote::{RolloutServer, Served};
use roll_backend_burn::train::{Trainer, TrainerConfig};
use roll_backend_burn::{ChatTemplate, HfTokenizer, ModelParts, PartKind};
use roll_core::config::Config;
use roll_core::strategy::{Messenger, Strategy};
use roll_core::{Error, Result, Tokenizer};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;

use super::RunPlan;

/// Where a stage's actor starts, as rank 0 tells the others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Start {
    /// The actor's weights and trainer.
    pub actor: StartFrom,
    /// The stage is the SFT warm start: when it ends, rank 0 releases the training ranks and
    /// announces where the RL stage starts (to them alone).
    pub sft: bool,
}

/// Where an actor's weights and trainer come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum StartFrom {
    /// A fresh trainer with this config (the SFT stage's learning-rate schedule is sized to the
    /// leader's dataset) on the weights of this HF directory.
    Weights {
        /// The HF directory.
        dir: PathBuf,
        /// The trainer's config.
        trainer: Box<TrainerConfig>,
    },
    /// The trainer checkpoint in this directory.
    Checkpoint(PathBuf),
}

/// Tells the followers in `group` where the actor starts (rank 0).
pub(crate) fn announce(group: &dyn Strategy, start: &Start) -> Result<()> {
    let mut bytes =
        serde_json::to_vec(start).map_err(|e| Error::invalid_data("run start", e.to_string()))?;
    group.broadcast(&mut bytes, 0)
}

/// Where rank 0 says the actor starts: `what` names the announcement in an error.
fn receive(group: &dyn Strategy, what: &str) -> Result<Start> {
    let mut bytes = Vec::new();
    group.broadcast(&mut bytes, 0)?;
    serde_json::from_slice(&bytes)
        .map_err(|e| Error::invalid_data("a start from rank 0", format!("{what}: {e}")))
}

/// What each rank of a run across processes does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Roles {
    /// Every rank trains a replica; rank 0 also generates.
    Colocated,
    /// Ranks `0..trainers` train, the others generate.
    Disaggregated {
        /// Training ranks, from rank 0.
        trainers: usize,
        /// The rollout ranks: the rest of the job.
        rollout: Vec<usize>,
    },
}

impl Roles {
    /// The roles of a job of `world_size` processes running `plan`, checked on every rank
    /// alike.
    ///
    /// # Errors
    /// `rollout.ranks` that leaves no rank to train; `model.data_parallel` above 1 where several
    /// processes train (the processes are the replicas).
    pub(crate) fn of(plan: &RunPlan, world_size: usize) -> Result<Self> {
        let rollout = plan.rollout_ranks;
        if rollout >= world_size {
            return Err(Error::InvalidValue {
                key: "rollout.ranks".into(),
                value: rollout.to_string(),
                allowed: format!(
                    "fewer than the job's {world_size} processes: rank 0 trains and runs the \
                     controller, and the last `rollout.ranks` processes generate"
                ),
                origin: None,
            });
        }
        let trainers = world_size - rollout;
        if let Some((kind, width)) = plan.model.parts {
            let key = part_key(kind);
            if !trainers.is_multiple_of(width) {
                return Err(Error::InvalidValue {
                    key: key.into(),
                    value: width.to_string(),
                    allowed: format!(
                        "a divisor of the {trainers} training processes (the job's {world_size} \
                         less `rollout.ranks`): each copy of the actor spans that many"
                    ),
                    origin: None,
                });
            }
        }
        if trainers > 1 && plan.model.trainer_devices.len() != 1 {
            return Err(Error::invalid_data(
                "config",
                format!(
                    "`model.data_parallel` must be 1 when {trainers} processes train: each \
                     runs one replica, and the processes are the data-parallel group"
                ),
            ));
        }
        Ok(match rollout {
            0 => Self::Colocated,
            _ => Self::Disaggregated {
                trainers,
                rollout: (trainers..world_size).collect(),
            },
        })
    }

    /// This rank's group of rollout ranks holding a mixture's experts divided among them
    /// (`rollout.expert_parallel`): consecutive rollout ranks, `None` on any other rank or
    /// without. A collective: every rank calls it once, after [`Roles::trainer_groups`].
    ///
    /// # Errors
    /// A failed collective.
    pub(crate) fn rollout_experts(
        &self,
        job: &Arc<dyn Messenger>,
        plan: &RunPlan,
    ) -> Result<Option<Arc<dyn Strategy>>> {
        let Self::Disaggregated { rollout, .. } = self else {
            return Ok(None);
        };
        let width = plan.rollout_experts;
        if width <= 1 {
            return Ok(None);
        }
        // Every rank of the job forms every group, in the same order.
        let mut mine = None;
        for ranks in rollout.chunks(width) {
            let group = job.subgroup(ranks)?;
            mine = mine.or(group.map(|g| -> Arc<dyn Strategy> { g }));
        }
        Ok(mine)
    }

    /// This rank's groups as a trainer (`None` on a rollout rank). A collective: every rank
    /// calls it once, after the start is announced.
    ///
    /// # Errors
    /// A failed collective.
    pub(crate) fn trainer_groups(
        &self,
        job: &Arc<dyn Messenger>,
        plan: &RunPlan,
    ) -> Result<Option<TrainerGroups>> {
        let trainers = match self {
            Self::Colocated => job.world_size(),
            Self::Disaggregated { trainers, .. } => *trainers,
        };
        let all = match self {
            Self::Colocated => Some(job.clone()),
            Self::Disaggregated { .. } => job.subgroup(&(0..trainers).collect::<Vec<_>>())?,
        };
        let Some((kind, width)) = plan.model.parts else {
            return Ok(all.map(|all| TrainerGroups { all, parts: None }));
        };
        // Copy `c` is ranks `c·width ..`; the ranks holding part `p` of every copy are `p`,
        // `p + width`, …. Every rank of the job forms every group, in the same order.
        let subgroups = |groups: Vec<Vec<usize>>| -> Result<Option<Arc<dyn Messenger>>> {
            let mut mine = None;
            for members in groups {
                mine = mine.or(job.subgroup(&members)?);
            }
            Ok(mine)
        };
        let copy = subgroups(
            (0..trainers / width)
                .map(|c| (c * width..(c + 1) * width).collect())
                .collect(),
        )?;
        let same_part = subgroups(
            (0..width)
                .map(|p| (p..trainers).step_by(width).collect())
                .collect(),
        )?;
        let (data, expert_replicas) = match kind {
            // The copy's ranks hold different tokens: every training rank is one data-parallel
            // group (the layers every rank holds), or every pipeline's rank of a stage (`s·E +
            // p` of each copy) is.
            PartKind::Experts => (all.clone(), Some(same_part)),
            PartKind::PipelineExperts { experts } => {
                let stages = subgroups(
                    (0..width / experts)
                        .map(|s| (0..trainers).filter(|r| r % width / experts == s).collect())
                        .collect(),
                )?;
                (stages, Some(same_part))
            }
            _ => (same_part, None),
        };
        // Colocated `rollout.expert_parallel`: the first copy's ranks generate together.
        let generates = matches!(self, Self::Colocated)
            && kind == PartKind::Experts
            && plan.rollout_experts > 1
            && job.rank() < width;
        Ok(match (all, copy, data) {
            (Some(all), Some(group), Some(data)) => Some(TrainerGroups {
                all,
                parts: Some(ModelParts {
                    kind,
                    group,
                    data,
                    expert_replicas: expert_replicas
                        .flatten()
                        .map(|g| -> Arc<dyn Strategy> { g }),
                    generates,
                }),
            }),
            _ => None,
        })
    }
}

/// The groups a training rank of a run across processes belongs to.
pub(crate) struct TrainerGroups {
    /// Every training rank: rank 0 announces each step to them.
    pub all: Arc<dyn Messenger>,
    /// Where each copy of the actor spans several ranks: how, this rank's copy, and its
    /// data-parallel group. `None`: `all` is the data-parallel group.
    pub parts: Option<ModelParts>,
}

/// Refuses rollout ranks, and a model divided among ranks, in a run of one process.
pub(crate) fn check_single_process(plan: &RunPlan) -> Result<()> {
    if let Some((kind, width)) = plan.model.parts {
        let key = part_key(kind);
        return Err(Error::InvalidValue {
            key: key.into(),
            value: width.to_string(),
            allowed: "1 in a run of one process: the parts of the model are held by processes \
                      of a job started by `mpirun` or `srun` whose rank 0 calls \
                      `RunBuilder::lead`"
                .into(),
            origin: None,
        });
    }
    if plan.rollout_ranks == 0 {
        return Ok(());
    }
    Err(Error::InvalidValue {
        key: "rollout.ranks".into(),
        value: plan.rollout_ranks.to_string(),
        allowed: "0 in a run of one process: rollout ranks are processes of a job started by \
                  `mpirun` or `srun` whose rank 0 calls `RunBuilder::lead`"
            .into(),
        origin: None,
    })
}

/// Refuses, naming `model.expert_parallel`, experts divided among training ranks that hold
/// different tokens ([`PartKind::Experts`], [`PartKind::PipelineExperts`]) where the model
/// cannot take it: a dense model, more ranks than experts, a pipeline stage without a mixture.
/// Rank 0 checks before any rank loads the weights, which would each refuse alone.
pub(crate) fn check_divided_experts(
    config: &roll_backend_burn::HfConfig,
    kind: PartKind,
    width: usize,
) -> Result<()> {
    let (experts, stages) = match kind {
        PartKind::Experts => (width, 1),
        PartKind::PipelineExperts { experts } => (experts, width / experts.max(1)),
        PartKind::Tensor { .. } | PartKind::Pipeline | PartKind::TensorPipeline { .. } => {
            return Ok(());
        }
    };
    // Lazily initialised: no weight is allocated.
    let template = roll_backend_burn::CausalLm::init(config, &roll_backend_burn::Device::flex())?;
    template
        .check_expert_division(experts, stages)
        .map_err(|e| Error::InvalidValue {
            key: "model.expert_parallel".into(),
            value: experts.to_string(),
            allowed: format!("a division of the experts this model takes ({e})"),
            origin: None,
        })
}

/// The config key that divides the actor among processes this way.
fn part_key(kind: PartKind) -> &'static str {
    match kind {
        PartKind::Tensor { .. } => "model.tensor_parallel",
        PartKind::Pipeline => "model.pipeline_parallel",
        PartKind::TensorPipeline { .. } => "model.tensor_parallel × model.pipeline_parallel",
        PartKind::Experts => "model.expert_parallel",
        PartKind::PipelineExperts { .. } => "model.pipeline_parallel × model.expert_parallel",
    }
}

/// What a rank of a run across processes did, as [`follow`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Followed {
    /// A trainer replica: the steps it trained.
    Trained {
        /// Steps served, SFT's and RL's.
        steps: usize,
        /// The part of the actor it held (`model.tensor_parallel`, `model.pipeline_parallel`);
        /// `None`: all of it.
        part: Option<roll_backend_burn::PartKind>,
        /// Where its copy generated together (colocated `rollout.expert_parallel`), what its
        /// engine did; `None`: it ran none.
        engine: Option<ServedExperts>,
    },
    /// A rollout rank: the requests it served and the weights it received.
    Generated(Served),
}

/// Serves as rank `group.rank()` (≥ 1) of a run across processes whose rank 0 runs `config`
/// with [`RunBuilder::lead`](super::RunBuilder::lead), in the role the config gives this rank
/// (colocated: one more trainer replica; disaggregated: a trainer of the training sub-group or a
/// rollout rank), until the leader's run ends.
///
/// Every rank is started with the same config (e.g. the same command line under `mpirun` or
/// `srun`). A failure here is reported to the whole job (it stops, naming this rank and role).
///
/// # Errors
/// A config that does not validate or that a distributed run does not take, a model or
/// checkpoint that does not load, a failed step, a lost leader.
pub fn follow(config: &Config, group: Arc<dyn Messenger>) -> Result<Followed> {
    let rank = group.rank();
    let mut role = "actor trainer";
    // On a thread of its own: serving blocks, which an async runtime's thread must not.
    let served = std::thread::scope(|s| {
        s.spawn(|| serve(config, &group, &mut role))
            .join()
            .unwrap_or_else(|_| Err(Error::invalid_data("follower", "serving panicked")))
    });
    if let Err(e) = &served {
        group.abort(&format!("rank {rank} ({role}): {e}"));
    }
    served
}

fn serve(config: &Config, group: &Arc<dyn Messenger>, role: &mut &str) -> Result<Followed> {
    let plan = RunPlan::from_config(config)?;
    let roles = Roles::of(&plan, group.world_size())?;
    let mut start = receive(group.as_ref(), "the run's start")?;
    let device = roll_backend_burn::device(plan.model.device)?;
    let trainers = roles.trainer_groups(group, &plan)?;
    let experts = roles.rollout_experts(group, &plan)?;
    let Some(trainers) = trainers else {
        *role = "rollout";
        // The architecture and tokenizer come from the model directory; the weights from
        // rank 0, which starts every rollout rank on its actor's. Built, not loaded: Burn
        // initialises a parameter when it is first read, so a rank keeping a block of the
        // experts (`with_experts`) never allocates the others'.
        let template =
            roll_backend_burn::CausalLm::init(HfSource::open(&plan.model.dir)?.config(), &device)?;
        let mut tokenizer = HfTokenizer::from_dir(&plan.model.dir)?;
        if plan.model.plain_prompts {
            tokenizer = tokenizer.with_chat_template(ChatTemplate::Plain);
        }
        let tokenizer: Arc<dyn Tokenizer> = Arc::new(tokenizer);
        let mut server = RolloutServer::new(template, Some(tokenizer), plan.engine.clone(), device);
        if let Some(experts) = experts {
            *role = "rollout rank holding some of the experts";
            server = server.with_experts(experts)?;
        }
        let served = server.serve(group.as_ref(), 0)?;
        tracing::info!(
            rank = group.rank(),
            requests = served.requests,
            weight_syncs = served.weight_syncs,
            "the leader's run ended"
        );
        return Ok(Followed::Generated(served));
    };
    if trainers.parts.is_some() {
        *role = "actor trainer holding a part of the model";
    }
    let all: Arc<dyn Strategy> = trainers.all.clone();
    let data = trainers
        .parts
        .as_ref()
        .map_or(all.clone(), |p| p.data.clone());
    let mut steps = 0;
    let mut engines = StageEngines::default();
    loop {
        let (trainer, version) = match &start.actor {
            StartFrom::Weights { dir, trainer } => {
                let mut model = HfSource::open(dir)?.load_model(&device)?;
                if let Some(parts) = &trainers.parts {
                    model = parts.part_of(model)?;
                }
                (Trainer::new(model, (**trainer).clone(), &device)?, 0)
            }
            StartFrom::Checkpoint(dir) => match &trainers.parts {
                Some(parts) => parts.load_checkpoint(dir, &device)?,
                None => Trainer::load_checkpoint(dir, &device)?,
            },
        };
        let mut trainer = trainer.with_strategy(data.clone());
        let engine = match &trainers.parts {
            Some(parts) => {
                // No request of its own: one sequence's worth of cache, not a whole engine's.
                let config = EngineConfig {
                    start_version: version,
                    max_seqs: 1,
                    max_cached_tokens: 1,
                    ..plan.engine.clone()
                };
                FollowerEngine::start(parts, &trainer, config, &device)?
            }
            None => None,
        };
        if engine.is_some() {
            *role = "actor trainer generating with its block of the experts";
        }
        let serve = |t: &Trainer| engine.as_ref().map_or(Ok(()), |e| e.sync(t));
        let followed = roll_backend_burn::train::follow_serving(
            &mut trainer,
            all.as_ref(),
            data.as_ref(),
            serve,
        );
        // Let go of the engine before a failure returns too: dropped here, it would wait for
        // its peers to stop, and they wait for this rank's failure to reach them.
        engines.close(engine);
        steps += followed?.len();
        if !start.sft {
            break;
        }
        start = receive(all.as_ref(), "the RL stage's start")?;
    }
    let served = engines.wait()?;
    tracing::info!(rank = group.rank(), steps, "the leader's run ended");
    Ok(Followed::Trained {
        steps,
        part: trainers.parts.as_ref().map(|p| p.kind),
        engine: served,
    })
}

/// A training rank's inference engine, on its own block of the experts, stepping with the
/// copy's others (colocated `rollout.expert_parallel`): it has no requests of its own and
/// serves its experts' share of rank 0's tokens.
struct FollowerEngine {
    engine: Engine,
    kind: DecoderKind,
    channel: Arc<dyn Strategy>,
}

impl FollowerEngine {
    /// The engine of this rank where its copy generates together ([`ModelParts::generates`]),
    /// serving `trainer`'s part from weight version `config.start_version`; `None` elsewhere.
    fn start(
        parts: &ModelParts,
        trainer: &Trainer,
        config: EngineConfig,
        device: &roll_backend_burn::Device,
    ) -> Result<Option<Self>> {
        let Some(channel) = parts.engine_channel()? else {
            return Ok(None);
        };
        let part = trainer.served_part(&channel)?;
        // The leader's choice for the same model (the device decoder: a mixture of experts).
        let kind = DecoderKind::auto(&part, device);
        let engine = Engine::with_decoder(kind, &part, device, config, None)?;
        Ok(Some(Self {
            engine,
            kind,
            channel,
        }))
    }

    /// Syncs the engine to `trainer`'s current part, with every other engine of the copy.
    fn sync(&self, trainer: &Trainer) -> roll_backend_burn::Result<()> {
        let part = trainer.served_part(&self.channel)?;
        self.engine
            .sync_served_blocking(&ServedWeights::new(part, self.kind)?)?;
        Ok(())
    }
}

/// The engines of a follower's stages, closing: an engine that steps with its peers stops only
/// when all of theirs stop too, so each stage's is let go of on a thread of its own (the
/// follower must go on to the next stage, whose start the leader sends before its own engine
/// stops), and the follower waits for them all before it reports.
#[derive(Default)]
struct StageEngines {
    closing: Vec<std::thread::JoinHandle<ServedExperts>>,
}

impl StageEngines {
    /// Lets go of a stage's engine, if any.
    fn close(&mut self, engine: Option<FollowerEngine>) {
        if let Some(FollowerEngine { engine, .. }) = engine {
            self.closing.push(std::thread::spawn(move || {
                let stats = engine.stats();
                drop(engine);
                ServedExperts {
                    steps: stats.steps,
                    version: stats.weight_version,
                }
            }));
        }
    }

    /// What the stages' engines did, once every one has stopped: their forward steps summed,
    /// the last one's weight version; `None` without an engine.
    ///
    /// # Errors
    /// A closing thread that panicked.
    fn wait(self) -> Result<Option<ServedExperts>> {
        let mut served: Option<ServedExperts> = None;
        for closing in self.closing {
            let stage = closing
                .join()
                .map_err(|_| Error::invalid_data("follower", "an engine panicked as it stopped"))?;
            served = Some(ServedExperts {
                steps: served.map_or(0, |s| s.steps) + stage.steps,
                version: stage.version,
            });
        }
        Ok(served)
    }
}

/// What a training rank's inference engine did where the ranks of its copy generate together
/// (colocated `rollout.expert_parallel`), as [`Followed::Trained`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServedExperts {
    /// Forward steps it took part in: with no requests of its own, each served its experts'
    /// share of rank 0's tokens.
    pub steps: u64,
    /// The weight version it served last.
    pub version: roll_core::WeightVersion,
}
