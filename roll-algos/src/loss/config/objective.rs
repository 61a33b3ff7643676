//! The actor's objective as configured: [`ObjectiveConfig`] (policy loss, aggregation, KL loss,
//! entropy bonus, train–inference correction, critic settings) and its [`KlLoss`] term. The loss is
//! computed by [`policy_objective`](crate::loss::policy_objective) (feature `tensor`).

use serde::{Deserialize, Serialize};

use super::aggregation::LossAggregation;
use super::correction::TrainInferCorrection;
use super::policy_loss::PolicyLoss;
use super::value_loss::ValueLossConfig;
use crate::Result;
use crate::kl::KlEstimator;
use crate::loss::check::{finite, non_negative};

/// A KL-to-reference loss term `coef·agg(KL(logp, ref_logp), m)` (ROLL's `use_kl_loss`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KlLoss {
    /// The coefficient (ROLL's `kl_loss_coef`).
    pub coef: f32,
    /// The estimator; ROLL hard-codes k3 (the default).
    #[serde(default)]
    pub estimator: KlEstimator,
}

/// Everything that defines the actor's loss, as found in the algorithm section of a config.
///
/// ```text
/// total = (pg + kl.coef·kl)·rl_loss_coef − entropy_coef·ent
/// pg    = agg(L_policy·w_IS, m', weights)      L_policy per `policy_loss`, w_IS from the correction
/// kl    = agg(KL(logp, ref_logp), m')
/// ent   = agg(H, m')
/// ```
///
/// `agg` is [`aggregate`](crate::loss::aggregate()) with `loss_aggregation`; `m'` is the loss mask after the
/// train–inference filters. The defaults are ROLL's (PPO with clip 0.2, seq-mean-token-mean, no
/// KL loss, no entropy bonus, no correction, no value clip).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ObjectiveConfig {
    /// The per-token policy loss.
    pub policy_loss: PolicyLoss,
    /// How per-token losses are reduced (policy, KL and entropy alike).
    pub loss_aggregation: LossAggregation,
    /// The KL-to-reference loss term; `None` = off (ROLL's default).
    pub kl_loss: Option<KlLoss>,
    /// Coefficient of the entropy bonus (ROLL's `entropy_loss_coef`, 0).
    pub entropy_coef: f32,
    /// Multiplies policy + KL loss, not the entropy bonus (ROLL's `rl_loss_coef`, 1).
    pub rl_loss_coef: f32,
    /// Train–inference mismatch correction; `None` = off (ROLL's default).
    pub train_infer_correction: Option<TrainInferCorrection>,
    /// The critic's loss settings (used by [`critic_loss`](crate::loss::critic_loss)).
    pub value_loss: ValueLossConfig,
}

impl Default for ObjectiveConfig {
    fn default() -> Self {
        Self {
            policy_loss: PolicyLoss::default(),
            loss_aggregation: LossAggregation::default(),
            kl_loss: None,
            entropy_coef: 0.0,
            rl_loss_coef: 1.0,
            train_infer_correction: None,
            value_loss: ValueLossConfig::default(),
        }
    }
}

impl ObjectiveConfig {
    /// Supervised fine-tuning: token-mean cross-entropy on the trained (response) tokens
    /// ([`PolicyLoss::CrossEntropy`]), nothing else — what an SFT pipeline gives the trainer.
    /// With the trainer's global denominators the loss of a micro-batched step is the mean NLL of
    /// every trained token of the batch, whatever the split.
    pub fn sft() -> Self {
        Self {
            policy_loss: PolicyLoss::CrossEntropy {},
            loss_aggregation: LossAggregation::TokenMean {},
            ..Self::default()
        }
    }

    /// Whether this is the supervised objective rather than a reinforcement-learning one.
    pub fn is_supervised(&self) -> bool {
        matches!(self.policy_loss, PolicyLoss::CrossEntropy {})
    }

    /// Checks every setting; keys are relative to the algorithm section (e.g.
    /// `policy_loss.clip_low`, `kl_loss.coef`).
    pub fn validate(&self) -> Result<()> {
        self.policy_loss.validate()?;
        self.loss_aggregation.validate()?;
        if let Some(kl) = &self.kl_loss {
            non_negative("kl_loss.coef", kl.coef)?;
        }
        finite("entropy_coef", self.entropy_coef)?;
        non_negative("rl_loss_coef", self.rl_loss_coef)?;
        if let Some(c) = &self.train_infer_correction {
            c.validate()?;
        }
        self.value_loss.validate()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::AlgoError;
    use crate::loss::RatioLevel;

    #[test]
    fn config_from_json_and_validation() {
        let cfg: ObjectiveConfig = serde_json::from_str(
            r#"{
                "policy_loss": {"kind": "ppo", "clip_high": 0.28, "ratio": "sequence"},
                "loss_aggregation": {"kind": "token-mean"},
                "kl_loss": {"coef": 0.001},
                "train_infer_correction": {"filters": [{"level": "geometric"}]}
            }"#,
        )
        .unwrap();
        assert_eq!(
            cfg.policy_loss,
            PolicyLoss::Ppo {
                clip_low: 0.2,
                clip_high: 0.28,
                dual_clip: None,
                ratio: RatioLevel::Sequence
            }
        );
        assert_eq!(
            cfg.kl_loss,
            Some(KlLoss {
                coef: 0.001,
                estimator: KlEstimator::K3
            })
        );
        assert_eq!(cfg.rl_loss_coef, 1.0);
        let tic = cfg.train_infer_correction.clone().unwrap();
        assert_eq!(tic.filters[0].low, 0.8);
        assert!(cfg.validate().is_ok());
        assert!(ObjectiveConfig::default().validate().is_ok());

        for bad in [
            r#"{"entropy_coeff": 0.1}"#,
            r#"{"policy_loss": {"kind": "ppo", "clip": 0.2}}"#,
            r#"{"kl_loss": {"coef": 0.1, "estimator": "k3", "target": 1}}"#,
            r#"{"train_infer_correction": {"is_weight": {"upper": 2}}}"#,
            r#"{"value_loss": {"value_clip": 0.2}}"#,
        ] {
            assert!(
                serde_json::from_str::<ObjectiveConfig>(bad).is_err(),
                "{bad}"
            );
        }
        let cfg = ObjectiveConfig {
            kl_loss: Some(KlLoss {
                coef: -1.0,
                estimator: KlEstimator::K3,
            }),
            ..Default::default()
        };
        assert!(
            matches!(cfg.validate(), Err(AlgoError::InvalidValue { ref key, .. }) if key == "kl_loss.coef")
        );
        let cfg = ObjectiveConfig {
            entropy_coef: f32::INFINITY,
            ..Default::default()
        };
        assert!(
            matches!(cfg.validate(), Err(AlgoError::InvalidValue { ref key, .. }) if key == "entropy_coef")
        );
    }
}
