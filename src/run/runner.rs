//! [`Run`]: the stages of a training run — supervised warm start, held-out evaluation, RL,
//! export — and the run directory they write.

use super::checkpoint::{
    self, CHECKPOINTS, CheckpointId, Resumed, RunState, SftProgress, StageKind, StageState,
};
use super::distributed;
use super::io;
use super::plan::RunPlan;
use super::summary::{EvalPoint, RunSummary, SftSummary};
use super::telemetry::{STEP_GAUGE, Telemetry};
use indicatif::{ProgressBar, ProgressStyle};
use roll_backend_burn::hf::HfSource;
use roll_backend_burn::{BurnPolicy, CausalLm, SaveOptions};
use roll_core::config::Config;
use roll_core::episode::EpisodeConfig;
use roll_core::pipeline::{RlvrPipeline, SftPipeline, StepReport, evaluate};
use roll_core::policy::{Generate, SamplingParams};
use roll_core::strategy::Messenger;
use roll_core::{Error, Prompt, Result, RewardWorker, Tokenizer};
use roll_env::{EnvFactory, evaluate_episodes};
use serde_json::{Map, Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Threads that play held-out episodes at once (each waits on the engine most of the time; the
/// engine batches their requests).
const EVAL_THREADS: usize = 64;

/// Where a stage's actor comes from.
pub(crate) enum ActorStart {
    /// These weights, with a fresh optimiser.
    Weights(Box<CausalLm>),
    /// The actor checkpoint in this directory (weights, optimiser, RNG, step, weight version).
    Checkpoint(PathBuf),
}

/// Builds the RL pipeline and its actor.
pub(crate) type BuildRl =
    Box<dyn FnOnce(ActorStart) -> Result<(RlvrPipeline, Arc<BurnPolicy>)> + Send>;

/// The supervised warm start.
pub(crate) struct SftStage {
    pub pipeline: SftPipeline,
    pub policy: Arc<BurnPolicy>,
    /// In a run across processes, the training ranks that follow this one: when SFT ends,
    /// `policy` releases them and they are told where the RL stage starts.
    pub followers: Option<Arc<dyn Messenger>>,
    pub eval_every: u64,
    pub save_every: u64,
    pub progress: SftProgress,
}

/// What a held-out evaluation plays.
pub(crate) enum Evaluation {
    /// Prompts answered (greedily, and sampled with `run.eval_temperature` > 0) and the reward
    /// that scores them (RLVR).
    Prompts {
        prompts: Vec<Prompt>,
        reward: Arc<dyn RewardWorker>,
    },
    /// One episode per environment seed (agentic), greedy and, with `run.eval_temperature` > 0,
    /// sampled.
    Episodes {
        seeds: Vec<u64>,
        factory: EnvFactory,
        /// The rollout's episode settings; the evaluation sets the temperature and the seed.
        episode: EpisodeConfig,
        /// `agentic.step_timeout`: a held-out episode whose environment hangs costs that
        /// episode only.
        step_timeout: Duration,
    },
}

/// Where a run is: fine-tuning (the RL stage waits for its weights) or reinforcement learning.
pub(crate) enum Stage {
    Sft {
        sft: Box<SftStage>,
        /// Taken when SFT ends; `None` after a failed build (the run then cannot go on).
        build_rl: Option<BuildRl>,
    },
    Rl {
        pipeline: Box<RlvrPipeline>,
        actor: Arc<BurnPolicy>,
    },
}

/// What a resumed run takes from its checkpoint besides the stage.
pub(crate) struct Restored {
    pub resumed: Resumed,
    pub summary: RunSummary,
    pub metrics_lines: u64,
    pub elapsed: Duration,
}

/// Appends lines to `metrics.jsonl`.
struct Recorder {
    file: std::fs::File,
    path: PathBuf,
    /// TensorBoard and Prometheus, when the run asks for them.
    telemetry: Option<Telemetry>,
    /// Lines in the file.
    lines: u64,
    /// When the run started (earlier than this process for a resumed run): the clock of
    /// `time_s`, evaluations and the summary.
    started: Instant,
}

impl Recorder {
    /// Appends `line` and mirrors it to the `metrics` facade (see [`mirror`]), which feeds
    /// TensorBoard and Prometheus when the run asks for them, and any recorder of the user's.
    fn record(&mut self, mut line: Map<String, Value>) -> Result<()> {
        line.insert("time_s".into(), self.started.elapsed().as_secs_f64().into());
        mirror(&line);
        writeln!(self.file, "{}", Value::Object(line))
            .map_err(io("cannot append to the metrics file", &self.path))?;
        self.lines += 1;
        match &self.telemetry {
            Some(t) => t.check(),
            None => Ok(()),
        }
    }

    /// Makes every line so far durable (before a checkpoint counts them).
    fn sync(&mut self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(io("cannot fsync the metrics file", &self.path))
    }
}

/// Sets a gauge `<stage>/<key>` for every number of a metrics line, counts RL and SFT steps
/// (`roll_rl_steps_total`, `roll_sft_steps_total`), and then sets [`STEP_GAUGE`] to the line's
/// step (an evaluation's: the RL steps taken), which closes the line for TensorBoard.
fn mirror(line: &Map<String, Value>) {
    let stage = line.get("stage").and_then(Value::as_str).unwrap_or("run");
    for (key, value) in line {
        if let Some(v) = value.as_f64()
            && !matches!(key.as_str(), "step" | "rl_step")
        {
            metrics::gauge!(format!("{stage}/{key}")).set(v);
        }
    }
    let step = match stage {
        "rl" => {
            metrics::counter!("roll_rl_steps_total").increment(1);
            line.get("step")
        }
        "sft" => {
            metrics::counter!("roll_sft_steps_total").increment(1);
            line.get("step")
        }
        _ => line.get("rl_step"),
    };
    if let Some(step) = step.and_then(Value::as_f64) {
        metrics::gauge!(STEP_GAUGE).set(step);
    }
}

/// A training run: the stages, the current actor, and the run directory (`run.output_dir`):
///
/// | file | what |
/// |---|---|
/// | `config.toml` | the resolved config |
/// | `metrics.jsonl` | one JSON line per SFT step, RL step and evaluation (`"stage"` says which) |
/// | `eval_prompts.jsonl` / `eval_seeds.json` | the held-out prompts (`prompt`, `answer`) of an RLVR run / the held-out seeds of an agentic run |
/// | `base_model/` | the model a `new` source built |
/// | `sft_model/`, `final_model/` | the exported SFT-stage and final models (HF directories) |
/// | `tensorboard/` | TensorBoard event files (with `run.tensorboard`) |
/// | `plots/` | reward, held-out accuracy, KL, entropy, length, gap, step time, SFT loss |
/// | `summary.md` | [`RunSummary`] as a table |
/// | `checkpoints/` | the newest `run.keep_checkpoints` checkpoints (with `run.save_every` or `sft.save_every`) |
///
/// # Checkpoints and resume
/// A checkpoint holds the whole run between two steps: the actor's weights, optimiser moments,
/// RNG, step and weight version; the SFT dataset position, or the RL pipeline's step, KL
/// controller, reward moments and prompt position (prompts drawn, prompts to ask again); the
/// summary so far and how many lines of `metrics.jsonl` it covers. With `run.resume = true` the
/// run continues from the newest checkpoint that reads back (see the layout and the checks in
/// the checkpoint module); sampling seeds derive from prompt ids and the run seed, so a
/// synchronous run (`rollout.max_staleness = 0`) resumed asks the same prompts with the same
/// seeds and trains to the same weights as one never stopped. An asynchronous run's
/// checkpoint lists the prompts in flight as pending: they are generated again, on the resumed
/// weights.
pub struct Run {
    plan: RunPlan,
    source: HfSource,
    tokenizer: Arc<dyn Tokenizer>,
    stage: Stage,
    eval: Option<Evaluation>,
    recorder: Recorder,
    summary: RunSummary,
    resumed: Option<Resumed>,
}

impl Run {
    pub(crate) fn start(
        plan: RunPlan,
        config: &Config,
        source: HfSource,
        tokenizer: Arc<dyn Tokenizer>,
        stage: Stage,
        eval: Option<Evaluation>,
        restored: Option<Restored>,
    ) -> Result<Self> {
        let dir = plan.run.output_dir.clone();
        std::fs::create_dir_all(&dir).map_err(io("cannot create the run directory", &dir))?;
        let resolved = dir.join("config.toml");
        std::fs::write(&resolved, config.to_toml()?)
            .map_err(io("cannot write the resolved config", &resolved))?;
        match &eval {
            Some(Evaluation::Prompts { prompts, .. }) => {
                let path = dir.join("eval_prompts.jsonl");
                let mut text = String::new();
                for p in prompts {
                    text.push_str(&json!({"prompt": p.text, "answer": p.ground_truth}).to_string());
                    text.push('\n');
                }
                std::fs::write(&path, text)
                    .map_err(io("cannot write the held-out prompts", &path))?;
            }
            Some(Evaluation::Episodes { seeds, .. }) => {
                let path = dir.join("eval_seeds.json");
                std::fs::write(&path, json!(seeds).to_string())
                    .map_err(io("cannot write the held-out seeds", &path))?;
            }
            None => {}
        }
        let path = dir.join("metrics.jsonl");
        let (summary, started, resumed, lines) = match restored {
            Some(mut r) => {
                r.resumed.metrics_lines_dropped =
                    checkpoint::truncate_metrics(&path, r.metrics_lines)?;
                let started = Instant::now()
                    .checked_sub(r.elapsed)
                    .unwrap_or_else(Instant::now);
                (r.summary, started, Some(r.resumed), r.metrics_lines)
            }
            None => (
                RunSummary {
                    name: plan.run.name.clone(),
                    run_dir: dir,
                    ..RunSummary::default()
                },
                Instant::now(),
                None,
                0,
            ),
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io("cannot open the metrics file", &path))?;
        if resumed.is_none() {
            file.set_len(0)
                .map_err(io("cannot truncate the metrics file", &path))?;
        }
        let telemetry = Telemetry::start(
            &plan.run.output_dir,
            plan.run.tensorboard,
            plan.run.prometheus_port,
        )?;
        if let Some(address) = telemetry.as_ref().and_then(Telemetry::prometheus_address) {
            println!(
                "[{}] Prometheus metrics: http://{address}/metrics",
                plan.run.name
            );
        }
        let recorder = Recorder {
            file,
            path,
            telemetry,
            lines,
            started,
        };
        Ok(Self {
            plan,
            source,
            tokenizer,
            stage,
            eval,
            recorder,
            summary,
            resumed,
        })
    }

    /// Where the run serves its Prometheus metrics (`run.prometheus_port`; with port 0 the
    /// system's pick).
    pub fn prometheus_address(&self) -> Option<std::net::SocketAddr> {
        self.recorder
            .telemetry
            .as_ref()
            .and_then(Telemetry::prometheus_address)
    }

    /// The checkpoint this run resumed from (with `run.resume` and a checkpoint to resume).
    pub fn resumed(&self) -> Option<&Resumed> {
        self.resumed.as_ref()
    }

    /// The settings every component was built from.
    pub fn plan(&self) -> &RunPlan {
        &self.plan
    }

    /// The actor being trained: the SFT stage's until it ends, then the RL stage's.
    pub fn actor(&self) -> &Arc<BurnPolicy> {
        match &self.stage {
            Stage::Sft { sft, .. } => &sft.policy,
            Stage::Rl { actor, .. } => actor,
        }
    }

    /// What the run has done so far.
    pub fn summary(&self) -> &RunSummary {
        &self.summary
    }

    /// RL steps taken.
    pub fn steps_taken(&self) -> u64 {
        match &self.stage {
            Stage::Rl { pipeline, .. } => pipeline.steps_taken(),
            Stage::Sft { .. } => 0,
        }
    }

    /// Exports the actor's current weights as a HuggingFace directory, beside the files of the
    /// directory the model came from (config with every key, tokenizer, generation config).
    ///
    /// # Errors
    /// If the export cannot be written.
    pub fn export(&self, out_dir: impl AsRef<Path>) -> Result<()> {
        Ok(self
            .actor()
            .export(&self.source, out_dir, &SaveOptions::default())?)
    }

    /// Runs the supervised warm start to its end (nothing without `[sft]`, or once it has run):
    /// every step is a line of `metrics.jsonl` (a checkpoint every `sft.save_every` steps); then
    /// the held-out loss, the export to `sft_model/`, a held-out evaluation (`after SFT`), and
    /// the RL stage is built on the fine-tuned weights (and checkpointed, with
    /// `run.save_every`).
    ///
    /// # Errors
    /// The SFT pipeline's errors, or a file that cannot be written.
    pub async fn sft(&mut self) -> Result<Option<SftSummary>> {
        if !matches!(self.stage, Stage::Sft { .. }) {
            return Ok(None);
        }
        self.sft_steps().await?;
        let Stage::Sft { sft, .. } = &mut self.stage else {
            return Ok(None);
        };
        // Set once the export and the evaluation are done: an earlier call that failed after
        // them (building RL) retries only what follows.
        let summary = if self.summary.sft.is_none() {
            let eval_loss = sft.pipeline.eval_loss().await?;
            let summary = sft.progress.summary(eval_loss);
            let out = self.plan.run.output_dir.join("sft_model");
            self.export(&out)?;
            self.summary.exports.push(("after SFT".into(), out));
            self.evaluate("after SFT").await?;
            self.summary.sft = Some(summary.clone());
            Some(summary)
        } else {
            None
        };
        let Stage::Sft { sft, build_rl, .. } = &mut self.stage else {
            return Ok(summary);
        };
        let build = build_rl.take().ok_or_else(|| {
            Error::invalid_data(
                "run",
                "building the RL stage failed before; start a new run",
            )
        })?;
        // Every rank starts RL from the export's bytes (f32, the fine-tuned weights exactly); the
        // ranks that follow this one stop serving the SFT trainers first.
        let export = self.plan.run.output_dir.join("sft_model");
        if let Some(followers) = &sft.followers {
            sft.policy.release_followers()?;
            let start = distributed::Start {
                actor: distributed::StartFrom::Weights {
                    dir: export.clone(),
                    trainer: Box::new(self.plan.trainer.clone()),
                },
                sft: false,
            };
            distributed::announce(followers.as_ref(), &start)?;
        }
        let built = HfSource::open(&export)
            .and_then(|source| {
                source.load_model(&roll_backend_burn::device(self.plan.model.device)?)
            })
            .map_err(Error::from)
            .and_then(|model| build(ActorStart::Weights(Box::new(model))));
        let (pipeline, actor) = match (built, &sft.followers) {
            (Ok(built), _) => built,
            (Err(e), None) => return Err(e),
            (Err(e), Some(followers)) => {
                // The followers wait for the RL stage's trainer: stop the job rather than leave
                // them waiting.
                followers.abort(&format!(
                    "rank 0 (actor trainer): building the RL stage: {e}"
                ));
                return Err(e);
            }
        };
        self.stage = Stage::Rl {
            pipeline: Box::new(pipeline),
            actor,
        };
        if self.plan.run.save_every > 0 {
            self.save_checkpoint()?;
        }
        Ok(summary)
    }

    /// The SFT stage's steps from where it is to the end of its dataset.
    async fn sft_steps(&mut self) -> Result<()> {
        let Stage::Sft { sft, .. } = &self.stage else {
            return Ok(());
        };
        let total = sft.pipeline.total_steps();
        let bar = progress(total, "SFT");
        bar.set_position(sft.pipeline.position().step);
        while let Stage::Sft { sft, .. } = &mut self.stage {
            if sft.pipeline.is_done() {
                break;
            }
            let started = Instant::now();
            if sft.progress.eval_loss_start.is_none() {
                sft.progress.eval_loss_start = Some(sft.pipeline.eval_loss().await?);
            }
            let report = sft.pipeline.step().await?;
            sft.progress.losses.push(report.loss);
            let mut line = Map::new();
            line.insert("stage".into(), "sft".into());
            line.insert("step".into(), report.step.into());
            line.insert("epoch".into(), report.epoch.into());
            line.insert("tokens".into(), report.tokens.into());
            line.insert("step_s".into(), report.time.as_secs_f64().into());
            for (k, v) in &report.metrics {
                line.insert(k.clone(), (*v).into());
            }
            let done = report.step + 1;
            if sft.eval_every > 0 && done % sft.eval_every == 0 && done < total {
                let loss = sft.pipeline.eval_loss().await?;
                line.insert("eval_loss".into(), loss.into());
                bar.println(format!("[SFT] step {done}: held-out loss {loss:.4}"));
            }
            sft.progress.elapsed += started.elapsed();
            let save = sft.save_every > 0 && done % sft.save_every == 0;
            self.recorder.record(line)?;
            bar.set_message(format!("loss {:.4}", report.loss));
            bar.inc(1);
            if save {
                bar.suspend(|| self.save_checkpoint())?;
            }
        }
        bar.finish_and_clear();
        Ok(())
    }

    /// Saves a checkpoint of the run as it is now (between two steps) under
    /// `<run.output_dir>/checkpoints/`, keeping the newest `run.keep_checkpoints`; returns its
    /// directory.
    ///
    /// # Errors
    /// A file that cannot be written, or a scheduler that cannot be checkpointed (the
    /// agentic one, today).
    pub fn save_checkpoint(&mut self) -> Result<PathBuf> {
        let (id, stage, actor) = match &self.stage {
            Stage::Sft { sft, .. } => {
                let position = sft.pipeline.position();
                (
                    CheckpointId {
                        stage: StageKind::Sft,
                        step: position.step,
                    },
                    StageState::Sft {
                        position,
                        progress: sft.progress.clone(),
                    },
                    sft.policy.clone(),
                )
            }
            Stage::Rl { pipeline, actor } => (
                CheckpointId {
                    stage: StageKind::Rl,
                    step: pipeline.steps_taken(),
                },
                StageState::Rl {
                    pipeline: pipeline.state()?,
                },
                actor.clone(),
            ),
        };
        self.recorder.sync()?;
        let state = RunState::new(
            stage,
            self.summary.clone(),
            self.recorder.lines,
            self.recorder.started.elapsed(),
        );
        let root = self.plan.run.output_dir.join(CHECKPOINTS);
        let dir = checkpoint::save(&root, id, &state, self.plan.run.keep_checkpoints, |dir| {
            actor.save_checkpoint(dir)?;
            Ok(())
        })?;
        tracing::info!(checkpoint = %dir.display(), "checkpoint saved");
        Ok(dir)
    }

    /// Evaluates the current actor on the held-out set — greedily, and sampled at
    /// `run.eval_temperature` when that is above 0 (the sampled figure is then the accuracy, the
    /// greedy one `greedy_accuracy`) — and records it under `label`
    /// (`None` without one): RLVR answers the held-out prompts (accuracy: the share the reward
    /// scores as correct), agentic runs play one episode per held-out seed (accuracy: the
    /// success rate; the metrics line also has `success_rate` and `episode_len_mean`).
    ///
    /// # Errors
    /// A prompt that cannot be encoded, no tokio runtime or threads for the episodes, or the
    /// metrics file cannot be written. Failed generations, rewards and episodes count as
    /// unsolved.
    pub async fn evaluate(&mut self, label: &str) -> Result<Option<EvalPoint>> {
        let Some(eval) = &self.eval else {
            return Ok(None);
        };
        let (what, measure) = match eval {
            Evaluation::Prompts { prompts, .. } => {
                (format!("{} held-out prompts", prompts.len()), "accuracy")
            }
            Evaluation::Episodes { seeds, .. } => {
                (format!("{} held-out episodes", seeds.len()), "success rate")
            }
        };
        let bar = ProgressBar::new_spinner().with_message(format!("evaluating {what} ({label})"));
        bar.enable_steady_tick(Duration::from_millis(200));
        let policy: Arc<dyn Generate> = self.actor().clone();
        let greedy = SamplingParams {
            temperature: 0.0,
            max_new_tokens: self.plan.run.eval_max_new_tokens,
            ..SamplingParams::default()
        };
        let tokenizer = self.tokenizer.clone();
        let greedy = play_held_out(eval, policy.clone(), tokenizer.clone(), &greedy).await?;
        let (measured, greedy_accuracy) = match &self.plan.run.eval_sampling {
            Some(sampling) => {
                let sampled = play_held_out(eval, policy, tokenizer, sampling).await?;
                (sampled, Some(greedy.accuracy))
            }
            None => (greedy, None),
        };
        let Measured {
            accuracy,
            reward_mean,
            failed,
            time,
            by_domain,
            mut line,
        } = measured;
        bar.finish_and_clear();
        let point = EvalPoint {
            label: label.to_owned(),
            rl_step: self.steps_taken(),
            accuracy,
            reward_mean,
            failed,
            at_s: self.recorder.started.elapsed().as_secs_f64(),
            by_domain,
            greedy_accuracy,
        };
        let how = match (&self.plan.run.eval_sampling, greedy_accuracy) {
            (Some(sampling), Some(greedy)) => format!(
                " sampled at temperature {} (greedy {:.1}%)",
                sampling.temperature,
                100.0 * greedy
            ),
            _ => String::new(),
        };
        println!(
            "[{}] held-out {measure} {label}: {:.1}%{how} ({what}, {:.1} s)",
            self.plan.run.name,
            100.0 * point.accuracy,
            time.as_secs_f64()
        );
        if point.by_domain.len() > 1 {
            let parts: Vec<String> = point
                .by_domain
                .iter()
                .map(|(d, a)| format!("{d} {:.1}%", 100.0 * a))
                .collect();
            println!("[{}]   by domain: {}", self.plan.run.name, parts.join(", "));
        }
        line.insert("stage".into(), "eval".into());
        line.insert("label".into(), label.into());
        line.insert("rl_step".into(), point.rl_step.into());
        line.insert("accuracy".into(), point.accuracy.into());
        if let Some(greedy) = greedy_accuracy {
            line.insert("greedy_accuracy".into(), greedy.into());
        }
        line.insert("reward_mean".into(), point.reward_mean.into());
        line.insert("failed".into(), point.failed.into());
        line.insert("eval_s".into(), time.as_secs_f64().into());
        self.recorder.record(line)?;
        self.summary.evals.push(point.clone());
        Ok(Some(point))
    }

    /// Runs one RL step (after the SFT stage, which runs first if it has not) and appends its
    /// metrics to `metrics.jsonl`.
    ///
    /// # Errors
    /// As [`RlvrPipeline::step`], or if the metrics cannot be written.
    pub async fn step(&mut self) -> Result<StepReport> {
        self.sft().await?;
        let Stage::Rl { pipeline, .. } = &mut self.stage else {
            return Err(Error::invalid_data(
                "run",
                "the RL stage could not be built",
            ));
        };
        let report = pipeline.step().await?;
        let mut line = Map::new();
        line.insert("stage".into(), "rl".into());
        line.insert("step".into(), report.step.into());
        line.insert("weight_version".into(), report.weight_version.0.into());
        line.insert("reward_mean".into(), f64::from(report.reward_mean).into());
        line.insert(
            "response_len_mean".into(),
            f64::from(report.response_len_mean).into(),
        );
        line.insert("rollout_s".into(), report.rollout_time.as_secs_f64().into());
        line.insert("train_s".into(), report.train_time.as_secs_f64().into());
        for (k, v) in &report.metrics {
            line.insert(k.clone(), (*v).into());
        }
        self.recorder.record(line)?;
        self.summary.rl.push(report.clone());
        Ok(report)
    }

    /// The whole run: the SFT stage (with `[sft]`; else a held-out evaluation of the base
    /// model), RL steps up to `run.max_steps` (evaluating every `run.eval_every`), a final
    /// evaluation, the export of the final model to `final_model/`, and `summary.md`.
    ///
    /// # Errors
    /// As [`Run::sft`], [`Run::step`] and [`Run::evaluate`].
    pub async fn train(&mut self) -> Result<RunSummary> {
        if matches!(self.stage, Stage::Sft { .. }) {
            self.sft().await?;
        } else if self.summary.evals.is_empty() && self.steps_taken() == 0 {
            self.evaluate("base").await?;
        }
        let bar = progress(self.plan.run.max_steps, "RL");
        bar.set_position(self.steps_taken());
        while self.steps_taken() < self.plan.run.max_steps {
            let started = Instant::now();
            let report = self.step().await?;
            let done = report.step + 1;
            bar.set_message(format!(
                "reward {:.3}, {:.2} s/step",
                report.reward_mean,
                (report.rollout_time + report.train_time).as_secs_f64()
            ));
            bar.inc(1);
            if done % self.plan.run.log_every == 0 {
                bar.println(format!("[{}] {report}", self.plan.run.name));
            }
            let every = self.plan.run.eval_every;
            if every > 0 && done % every == 0 && done < self.plan.run.max_steps {
                self.evaluate(&format!("RL step {done}")).await?;
            }
            self.summary.rl_time += started.elapsed();
            let save = self.plan.run.save_every;
            if save > 0 && (done % save == 0 || done == self.plan.run.max_steps) {
                bar.suspend(|| self.save_checkpoint())?;
            }
        }
        bar.finish_and_clear();
        self.evaluate("after RL").await?;
        let out = self.plan.run.output_dir.join("final_model");
        self.export(&out)?;
        self.summary.exports.push(("final".into(), out));
        self.summary.total_time = self.recorder.started.elapsed();
        self.summary.plots = super::plot_metrics(&self.plan.run.output_dir)?;
        let path = self.plan.run.output_dir.join("summary.md");
        std::fs::write(&path, self.summary.to_string())
            .map_err(io("cannot write the run summary", &path))?;
        Ok(self.summary.clone())
    }
}

fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    let style = ProgressStyle::with_template(&format!(
        "{what:>4} [{{bar:30}}] {{pos}}/{{len}} {{msg}} (eta {{eta}})"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar
}

/// One pass over the held-out set with one way of sampling.
struct Measured {
    /// Share solved (RLVR) or succeeded (agentic).
    accuracy: f64,
    /// Mean reward (RLVR) or episode score (agentic).
    reward_mean: f64,
    failed: usize,
    time: Duration,
    /// Accuracy per domain (RLVR).
    by_domain: std::collections::BTreeMap<String, f64>,
    /// The measures the metrics line gets besides those above.
    line: Map<String, Value>,
}

/// Plays `eval` once with `policy`, sampling as `params` says (for episodes: its temperature,
/// top-p, top-k and seed; each turn's length is the episode's own).
async fn play_held_out(
    eval: &Evaluation,
    policy: Arc<dyn Generate>,
    tokenizer: Arc<dyn Tokenizer>,
    params: &SamplingParams,
) -> Result<Measured> {
    let mut line = Map::new();
    match eval {
        Evaluation::Prompts { prompts, reward } => {
            let report = evaluate(policy, &*tokenizer, reward.clone(), prompts, params).await?;
            let by_domain = report.accuracy_by_domain();
            for (domain, accuracy) in &by_domain {
                line.insert(format!("domain/{domain}/accuracy"), (*accuracy).into());
            }
            Ok(Measured {
                accuracy: report.accuracy(),
                reward_mean: report.reward_mean(),
                failed: report.failed(),
                time: report.time,
                by_domain,
                line,
            })
        }
        Evaluation::Episodes {
            seeds,
            factory,
            episode,
            step_timeout,
        } => {
            let mut episode = episode.clone();
            let sampling = &mut episode.sampling;
            sampling.temperature = params.temperature;
            sampling.top_p = params.top_p;
            sampling.top_k = params.top_k;
            sampling.seed = params.seed;
            let report = evaluate_episodes(
                policy,
                tokenizer,
                factory,
                seeds,
                &episode,
                EVAL_THREADS,
                *step_timeout,
            )
            .await?;
            line.insert("success_rate".into(), report.success_rate().into());
            line.insert("episode_len_mean".into(), report.turns_mean().into());
            for end in ["terminated", "truncated", "context_full"] {
                line.insert(format!("ended_{end}"), report.ended(end).into());
            }
            Ok(Measured {
                accuracy: report.success_rate(),
                reward_mean: report.score_mean(),
                failed: report.failed(),
                time: report.time,
                by_domain: Default::default(),
                line,
            })
        }
    }
}
