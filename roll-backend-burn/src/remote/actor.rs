//! [`Disaggregated`]: the actor with its generation on rollout ranks.

use super::RemoteRollout;
use crate::policy::blocking;
use crate::{BurnPolicy, Result};
use async_trait::async_trait;
use roll_core::policy::{
    Generate, Generation, GenerationRequest, Objective, Score, ScoreRequest, TokenScores, Train,
    TrainOutput,
};
use roll_core::strategy::Messenger;
use roll_core::{TrainBatch, WeightVersion};
use std::sync::Arc;
use std::time::Instant;

/// The actor of a disaggregated run: [`Generate`] on the rollout ranks ([`RemoteRollout`]),
/// [`Score`] and [`Train`] with the local [`BurnPolicy`]. A train step that changes the weights
/// returns only once every rollout rank serves them, with the step's version, and reports the
/// time the sync took as `rollout_weight_sync_s`.
///
/// The local policy keeps its own engine: it serves evaluation and the train–inference gap
/// probe, on the same kernels and weights as the rollout ranks.
#[derive(Debug, Clone)]
pub struct Disaggregated {
    actor: BurnPolicy,
    rollout: RemoteRollout,
}

impl Disaggregated {
    /// `actor`, generating on the rollout `ranks` of `link` from now on: starts their engines on
    /// the actor's current weights and version. Blocking (see [`RemoteRollout::connect`]).
    ///
    /// # Errors
    /// As [`RemoteRollout::connect`].
    pub fn connect(actor: BurnPolicy, link: Arc<dyn Messenger>, ranks: Vec<usize>) -> Result<Self> {
        Self::connect_with_experts(actor, link, ranks, 1)
    }

    /// [`Disaggregated::connect`] to rollout ranks holding the experts divided among groups of
    /// `experts` (see [`RemoteRollout::connect_with_experts`]).
    ///
    /// # Errors
    /// As [`RemoteRollout::connect_with_experts`].
    pub fn connect_with_experts(
        actor: BurnPolicy,
        link: Arc<dyn Messenger>,
        ranks: Vec<usize>,
        experts: usize,
    ) -> Result<Self> {
        let rollout = RemoteRollout::connect_with_experts(
            link,
            ranks,
            experts,
            &actor.model()?,
            actor.weight_version(),
        )?;
        Ok(Self { actor, rollout })
    }

    /// The local policy (trainer, scoring, checkpoints, export).
    pub fn actor(&self) -> &BurnPolicy {
        &self.actor
    }

    /// The rollout ranks' side.
    pub fn rollout(&self) -> &RemoteRollout {
        &self.rollout
    }
}

#[async_trait]
impl Generate for Disaggregated {
    async fn generate(&self, request: GenerationRequest) -> roll_core::Result<Generation> {
        self.rollout.generate(request).await
    }

    fn weight_version(&self) -> WeightVersion {
        self.rollout.weight_version()
    }
}

#[async_trait]
impl Score for Disaggregated {
    async fn score(&self, request: &ScoreRequest) -> roll_core::Result<Vec<TokenScores>> {
        self.actor.score(request).await
    }
}

#[async_trait]
impl Train for Disaggregated {
    async fn train_step(
        &self,
        batch: TrainBatch,
        objective: &Objective,
    ) -> roll_core::Result<TrainOutput> {
        let mut output = self.actor.train_step(batch, objective).await?;
        let version = output.weight_version;
        if self.rollout.weight_version() != version {
            let (actor, rollout) = (self.actor.clone(), self.rollout.clone());
            let start = Instant::now();
            blocking(move || rollout.sync(&actor.model()?, version)).await?;
            output.metrics.insert(
                "rollout_weight_sync_s".into(),
                start.elapsed().as_secs_f64(),
            );
        }
        Ok(output)
    }
}
