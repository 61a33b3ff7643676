//! [`DataParallel`]: N replicas of a trainer in this process, one thread each, trained as one.

use super::core::TrainStepReport;
use super::follow::{Command, announce, shards};
use super::{CriticTrainer, Trainer};
use crate::{BackendError, Result};
use roll_core::TrainBatch;
use roll_core::policy::Objective;
use roll_core::strategy::{DeviceSpec, LocalGroup, Strategy};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

/// A trainer that can be one replica of a data-parallel group: [`Trainer`] and
/// [`CriticTrainer`].
pub trait Replica: Send + Sized {
    /// Joins `strategy`'s group (see [`Trainer::with_strategy`]).
    #[must_use]
    fn with_strategy(self, strategy: Arc<dyn Strategy>) -> Self;

    /// One optimisation step on this replica's shard (see [`Trainer::step`]).
    ///
    /// # Errors
    /// As the trainer's `step`.
    fn step(&mut self, shard: &TrainBatch, objective: &Objective) -> Result<TrainStepReport>;

    /// Takes part in gathering the whole model where this replica holds a part of it (see
    /// [`Trainer::whole_model`]); nothing for a whole one.
    ///
    /// # Errors
    /// A failed collective.
    fn gather(&self) -> Result<()> {
        Ok(())
    }

    /// Writes this replica's part of a checkpoint under `dir` where it holds a part of the model
    /// (see [`Trainer::save_part`]); nothing for a whole one.
    ///
    /// # Errors
    /// A file that cannot be written.
    fn save_part(&self, _dir: &std::path::Path, _weight_version: u64) -> Result<()> {
        Ok(())
    }
}

impl Replica for Trainer {
    fn with_strategy(self, strategy: Arc<dyn Strategy>) -> Self {
        Trainer::with_strategy(self, strategy)
    }
    fn step(&mut self, shard: &TrainBatch, objective: &Objective) -> Result<TrainStepReport> {
        Trainer::step(self, shard, objective)
    }
    fn gather(&self) -> Result<()> {
        self.whole_model().map(drop)
    }
    fn save_part(&self, dir: &std::path::Path, weight_version: u64) -> Result<()> {
        Trainer::save_part(self, dir, weight_version)
    }
}

impl Replica for CriticTrainer {
    fn with_strategy(self, strategy: Arc<dyn Strategy>) -> Self {
        CriticTrainer::with_strategy(self, strategy)
    }
    fn step(&mut self, shard: &TrainBatch, objective: &Objective) -> Result<TrainStepReport> {
        CriticTrainer::step(self, shard, objective)
    }
}

/// Data parallelism in one process: each step splits the batch across the replicas by tokens
/// ([`Strategy::partition`]), every replica runs forward and backward on its shard on its own
/// thread and device, the replicas sum their gradients ([`LocalGroup`]) and apply the same
/// update. The result is the single-trainer step on the whole batch, to rounding: the loss
/// denominators are the whole batch's, and the replicas stay bit-for-bit identical.
///
/// On the CPU the replicas share the cores (each one's kernels use the same rayon pool): this is
/// how several GPUs of one machine train one policy, and the reference the multi-process
/// strategy (`roll-mpi`) is tested against. A step that fails on one
/// replica fails on all of them, with the failing replica's error; the group then refuses every
/// further step (resume from a checkpoint).
///
/// ```no_run
/// use roll_backend_burn::train::{DataParallel, Trainer, TrainerConfig};
/// use roll_backend_burn::{Device, DeviceSpec, load_model};
/// # let batch = roll_core::TrainBatch::default();
/// let model = load_model("tiny-qwen2", &Device::flex())?;
/// let mut group = DataParallel::new(&[DeviceSpec::Cpu, DeviceSpec::Cpu], |device| {
///     Trainer::new(model.clone(), TrainerConfig::default(), &device)
/// })?;
/// let report = group.step(&batch, &roll_core::policy::Objective::default())?;
/// let model_for_inference = group.first().inference_model()?;
/// # let _ = (report, model_for_inference);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DataParallel<T: Replica> {
    /// The replicas in this process.
    replicas: Vec<T>,
    /// Each local replica's place in the group.
    strategies: Vec<Arc<dyn Strategy>>,
    /// The ranks in other processes that [`follow`](super::follow) this one (every training
    /// rank: more than the data-parallel group when its replicas are tensor- or
    /// pipeline-parallel copies).
    followers: Option<Arc<dyn Strategy>>,
    /// The followers were released ([`DataParallel::release`]): the group trains no more.
    released: bool,
}

impl<T: Replica> std::fmt::Debug for DataParallel<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = self
            .strategies
            .first()
            .map(|s| s.name())
            .unwrap_or_default();
        f.debug_struct("DataParallel")
            .field("group", &name)
            .finish_non_exhaustive()
    }
}

impl<T: Replica> DataParallel<T> {
    /// One replica per device, each built by `replica` on that device from the same weights and
    /// config (the caller's closure must build identical trainers: same model, same config).
    ///
    /// # Errors
    /// An empty device list, a device that is not built in, or `replica`'s error.
    pub fn new(
        devices: &[DeviceSpec],
        mut replica: impl FnMut(crate::Device) -> Result<T>,
    ) -> Result<Self> {
        let group = LocalGroup::replicas(devices.to_vec())
            .map_err(|e| BackendError::InvalidInput(e.to_string()))?;
        let mut replicas = Vec::with_capacity(devices.len());
        let mut strategies: Vec<Arc<dyn Strategy>> = Vec::with_capacity(devices.len());
        for (member, &spec) in group.into_iter().zip(devices) {
            let strategy: Arc<dyn Strategy> = Arc::new(member);
            replicas.push(replica(crate::device(spec)?)?.with_strategy(strategy.clone()));
            strategies.push(strategy);
        }
        Ok(Self {
            replicas,
            strategies,
            followers: None,
            released: false,
        })
    }

    /// Rank 0 of a group that spans processes (e.g. over MPI): `replica` trains here, and every
    /// other rank runs [`follow`](super::follow) with a replica built from the same weights and
    /// config. Each step is announced to them; dropping the group tells them to stop.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] when `strategy` is not rank 0.
    pub fn leader(replica: T, strategy: Arc<dyn Strategy>) -> Result<Self> {
        Self::leader_of(replica, strategy.clone(), strategy)
    }

    /// [`DataParallel::leader`] of a job whose replicas are tensor- or pipeline-parallel
    /// copies: steps are announced to every rank of `announce` (which run
    /// [`follow_in`](super::follow_in)); `data` is the data-parallel group of this rank's copy.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] when this process is not rank 0 of both.
    pub fn leader_of(
        replica: T,
        announce: Arc<dyn Strategy>,
        data: Arc<dyn Strategy>,
    ) -> Result<Self> {
        if announce.rank() != 0 || data.rank() != 0 {
            return Err(BackendError::InvalidInput(format!(
                "the leader of a data-parallel group is rank 0, not rank {}: other ranks follow",
                announce.rank().max(data.rank())
            )));
        }
        Ok(Self {
            replicas: vec![replica.with_strategy(data.clone())],
            strategies: vec![data],
            followers: Some(announce),
            released: false,
        })
    }

    /// Releases the ranks that follow this one now rather than when the group is dropped: their
    /// [`follow`](super::follow) returns, and they can serve another group this rank leads on
    /// them (a run's SFT stage, then its RL stage). The group trains no more, and a copy that
    /// holds a part of the model no longer gathers or saves it; a group without followers is
    /// unchanged.
    ///
    /// # Errors
    /// A failed announcement.
    pub fn release(&mut self) -> Result<()> {
        match self.followers.take() {
            Some(followers) => {
                self.released = true;
                announce(followers.as_ref(), &Command::Stop)
            }
            None => Ok(()),
        }
    }

    /// Tells the followers that the weights changed, for the ranks whose inference engines step
    /// with this one's to sync theirs to their parts (see
    /// [`follow_serving`](super::follow::follow_serving)); nothing without followers.
    ///
    /// # Errors
    /// A failed announcement, or followers already released.
    pub fn announce_serve(&self) -> Result<()> {
        match self.followers("sync the engines")? {
            Some(followers) => announce(followers.as_ref(), &Command::Serve),
            None => Ok(()),
        }
    }

    /// The ranks to announce work to, if any; an error once they were released.
    fn followers(&self, work: &str) -> Result<Option<&Arc<dyn Strategy>>> {
        if self.released {
            return Err(BackendError::InvalidInput(format!(
                "cannot {work}: the ranks of this data-parallel group were released"
            )));
        }
        Ok(self.followers.as_ref())
    }

    /// The replicas, in rank order.
    pub fn replicas(&self) -> &[T] {
        &self.replicas
    }

    /// Rank 0 (all replicas hold the same weights): what inference and checkpoints read.
    pub fn first(&self) -> &T {
        // `new` refuses an empty group.
        &self.replicas[0]
    }

    /// The shards `batch` is split into, one per rank of the group (see
    /// [`Strategy::partition`]).
    pub fn shards(&self, batch: &TrainBatch) -> Result<Vec<TrainBatch>> {
        shards(batch, self.strategies[0].as_ref())
    }

    /// One step of the group on `batch`: rank 0's report, whose loss, counts and metrics are the
    /// whole batch's.
    ///
    /// # Errors
    /// The error of the replica that failed (the others fail with
    /// [`BackendError::Collective`], which is returned only when no replica failed on its own).
    pub fn step(&mut self, batch: &TrainBatch, objective: &Objective) -> Result<TrainStepReport> {
        if let Some(followers) = self.followers("train a step")? {
            let command = Command::Step {
                sequences: batch.sequences().to_vec(),
                objective: objective.clone(),
            };
            announce(followers.as_ref(), &command)?;
        }
        if let ([alone], 1) = (
            self.replicas.as_mut_slice(),
            self.strategies[0].world_size(),
        ) {
            return alone.step(batch, objective);
        }
        // Each local replica takes its rank's shard (ranks are distinct, so nothing is taken
        // twice); the leader's one replica runs on a thread too, so that a panic tells the group.
        let mut shards = self.shards(batch)?;
        let mine: Vec<TrainBatch> = self
            .strategies
            .iter()
            .map(|s| {
                shards
                    .get_mut(s.rank())
                    .map(std::mem::take)
                    .unwrap_or_default()
            })
            .collect();
        let results: Vec<Result<TrainStepReport>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .replicas
                .iter_mut()
                .zip(&mine)
                .zip(&self.strategies)
                .enumerate()
                .map(|(rank, ((replica, shard), strategy))| {
                    scope.spawn(move || {
                        catch_unwind(AssertUnwindSafe(|| replica.step(shard, objective)))
                            .unwrap_or_else(|panic| {
                                let what = panic_message(panic.as_ref());
                                strategy.abort(&format!("panicked: {what}"));
                                Err(BackendError::Train(format!(
                                    "data-parallel replica {rank} panicked: {what}"
                                )))
                            })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(BackendError::Train("a replica's thread panicked".into()))
                    })
                })
                .collect()
        });
        let (mut own, mut collective, mut report) = (None, None, None);
        for result in results {
            match result {
                Ok(r) => {
                    report.get_or_insert(r);
                }
                Err(e @ BackendError::Collective(_)) => {
                    collective.get_or_insert(e);
                }
                Err(e) => {
                    own.get_or_insert(e);
                }
            }
        }
        if let Some(e) = own.or(collective) {
            return Err(e);
        }
        report.ok_or_else(|| BackendError::Train("a data-parallel group has no replica".into()))
    }
}

impl DataParallel<Trainer> {
    /// The whole model the group trains, on the plain device with adapters merged: the first
    /// replica's [`Trainer::inference_model`], or, when the replicas are tensor- or
    /// pipeline-parallel copies, the model gathered from the parts (the followers are told to
    /// take part).
    ///
    /// # Errors
    /// As [`Trainer::whole_model`], or a failed announcement.
    pub fn whole_model(&self) -> Result<crate::CausalLm> {
        let first = self.first();
        if first.holds_part()
            && let Some(followers) = self.followers("gather the model")?
        {
            announce(followers.as_ref(), &Command::Gather)?;
        }
        first.whole_model()
    }

    /// Writes the trainer's checkpoint under `dir`: the first replica's, or, when the replicas
    /// are tensor- or pipeline-parallel copies, every part of the first copy, each by the rank
    /// holding it ([`Trainer::save_part`]; the followers are told, and this returns once every
    /// part is written).
    ///
    /// # Errors
    /// As [`Trainer::save_checkpoint`], or a failed announcement.
    pub fn save_checkpoint(
        &self,
        dir: &std::path::Path,
        weight_version: u64,
    ) -> Result<std::path::PathBuf> {
        let first = self.first();
        if !first.holds_part() {
            return first.save_checkpoint(dir, weight_version);
        }
        let followers = self.followers("save the model's parts")?;
        if let Some(followers) = followers {
            let command = Command::Checkpoint {
                dir: dir.to_path_buf(),
                weight_version,
            };
            announce(followers.as_ref(), &command)?;
        }
        let saved = first.save_part(dir, weight_version);
        if let Some(followers) = followers {
            // Every part is written when the followers reach this too.
            followers
                .all_reduce(&mut [0.0], roll_core::strategy::ReduceOp::Sum)
                .map_err(super::group::collective)?;
        }
        saved.map(|()| dir.to_path_buf())
    }
}

impl<T: Replica> Drop for DataParallel<T> {
    /// Releases the ranks that follow this one (their [`follow`](super::follow) returns).
    fn drop(&mut self) {
        if let Some(followers) = &self.followers
            && let Err(e) = announce(followers.as_ref(), &Command::Stop)
        {
            tracing::warn!(error = %e, "could not tell the data-parallel group to stop");
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
