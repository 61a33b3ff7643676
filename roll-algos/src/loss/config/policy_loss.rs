//! The typed selector of the policy loss (ROLL's `pg_variant` plus the PPO knobs): which
//! per-token loss the trainer minimises, with each variant's formula. The losses themselves are the
//! functions of [`crate::loss`] named in each variant (feature `tensor`).

use serde::{Deserialize, Serialize};

use crate::Result;
use crate::loss::check::{invalid, non_negative, open_range, positive};

/// The dual-clip constant `c` of the dual-clip paper (arXiv:1912.09729, §3.1), also verl's
/// `clip_ratio_c` default.
pub const DEFAULT_DUAL_CLIP: f32 = 3.0;

/// The dual-clip constant ROLL uses when `dual_clip_loss: true`: `c = 1 + 2·pg_clip`
/// (`1.4` for the default `pg_clip = 0.2`). Pass it as `dual_clip` to reproduce ROLL.
pub fn roll_dual_clip(pg_clip: f32) -> f32 {
    1.0 + 2.0 * pg_clip
}

/// Granularity of the PPO importance ratio (ROLL's `importance_sampling`, and its agentic
/// `ratio_type` for [`Segment`](Self::Segment)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RatioLevel {
    /// One ratio per token: `r_bt = exp(logp_bt − old_bt)` (PPO, arXiv:1707.06347).
    #[default]
    Token,
    /// One ratio per segment (a maximal run of trained tokens: an assistant turn of a
    /// trajectory), the geometric mean of its token ratios, broadcast to its tokens (ROLL's
    /// agentic `ratio_type = "segment"`): `r_bt = exp(Σ_{u ∈ S} (logp_bu − old_bu) / |S|)` for
    /// `t ∈ S`. See [`segment_ratio`](crate::loss::segment_ratio). A config refuses it outside
    /// the agentic pipeline, where a response is one segment and it is [`Sequence`](Self::Sequence).
    Segment,
    /// One ratio per sequence, the geometric mean of its token ratios, broadcast to its tokens
    /// (GSPO, arXiv:2507.18071): `r_b = exp(Σ_t m_bt·(logp_bt − old_bt) / max(n_b, 1))`.
    Sequence,
}

fn d_clip() -> f32 {
    0.2
}
fn d_tis_upper() -> f32 {
    1.0
}
fn d_one() -> f32 {
    1.0
}
fn d_cispo_clip() -> f32 {
    0.1
}
fn d_kimi_tau() -> f32 {
    0.1
}

/// Which per-token policy loss to train with. `r = exp(logp − old)`, `A` the advantage,
/// `sg` stop-gradient. Defaults follow ROLL.
///
/// `Vanilla {}` is a struct variant so that serde rejects stray fields after `kind = "vanilla"`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum PolicyLoss {
    /// PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347):
    /// `L = −min(r·A, clamp(r, 1 − clip_low, 1 + clip_high)·A)`, with optional dual clip
    /// `L = −max(min(…), c·A)` for `A < 0` (Ye et al. 2020, arXiv:1912.09729). A larger
    /// `clip_high` is DAPO's "clip-higher" (arXiv:2503.14476); `ratio: sequence` is GSPO
    /// (arXiv:2507.18071). See [`ppo_clip_loss`](crate::loss::ppo_clip_loss).
    Ppo {
        /// `ε_low`: the ratio is clipped below at `1 − ε_low` (ROLL `pg_clip_low`, 0.2).
        #[serde(default = "d_clip")]
        clip_low: f32,
        /// `ε_high`: the ratio is clipped above at `1 + ε_high` (ROLL `pg_clip_high`, 0.2).
        #[serde(default = "d_clip")]
        clip_high: f32,
        /// Dual-clip constant `c > 1`; `None` disables it (ROLL's default). The paper's value is
        /// [`DEFAULT_DUAL_CLIP`] = 3; ROLL's `dual_clip_loss: true`
        /// uses `c = 1 + 2·pg_clip` = 1.4 ([`roll_dual_clip`]).
        #[serde(default)]
        dual_clip: Option<f32>,
        /// Token-, segment- (ROLL agentic `ratio_type`) or sequence-level (GSPO) ratio (ROLL
        /// `importance_sampling`).
        #[serde(default)]
        ratio: RatioLevel,
    },
    /// Vanilla policy gradient (REINFORCE, Williams 1992): `L = −A·logp`. See
    /// [`vanilla_pg_loss`](crate::loss::vanilla_pg_loss).
    Vanilla {},
    /// Truncated importance sampling: `L = −sg(clamp(r, lower_bound, upper_bound))·A·logp`
    /// (as in ROLL's `pg_variant: tis`; truncated IS after Espeholt et al. 2018,
    /// arXiv:1802.01561). See [`tis_loss`](crate::loss::tis_loss).
    Tis {
        /// Lower truncation of the weight (ROLL 0).
        #[serde(default)]
        lower_bound: f32,
        /// Upper truncation of the weight (ROLL 1).
        #[serde(default = "d_tis_upper")]
        upper_bound: f32,
    },
    /// TOPR, Tapered Off-Policy REINFORCE (Le Roux et al. 2025, arXiv:2503.14286): positive
    /// samples `L = −w_pos·A·logp`, negative ones `L = −w_neg·sg(clamp(r, 0, 1))·A·logp`, the sign
    /// taken from the per-sample score. See [`topr_loss`](crate::loss::topr_loss).
    Topr {
        /// `w_pos` (ROLL `topr_positive_weight`, 1).
        #[serde(default = "d_one")]
        positive_weight: f32,
        /// `w_neg` (ROLL `topr_negative_weight`, 1).
        #[serde(default = "d_one")]
        negative_weight: f32,
    },
    /// CISPO (MiniMax-M1, arXiv:2506.13585): `L = −sg(clamp(r, 1 − clip_low, 1 + clip_high))·A·logp`.
    /// See [`cispo_loss`](crate::loss::cispo_loss).
    Cispo {
        /// `ε_low` of the weight clamp (ROLL 0.1).
        #[serde(default = "d_cispo_clip")]
        clip_low: f32,
        /// `ε_high` of the weight clamp (ROLL 0.1).
        #[serde(default = "d_cispo_clip")]
        clip_high: f32,
        /// Zero the loss of tokens PPO would clip (the paper's unified mask); default off.
        #[serde(default)]
        unified_mask: bool,
    },
    /// Kimi-1.5 (Kimi Team 2025, arXiv:2501.12599): `L = −A·logp + τ/2·(logp − old)²`.
    /// See [`kimi15_loss`](crate::loss::kimi15_loss).
    Kimi15 {
        /// `τ` (ROLL 0.1).
        #[serde(default = "d_kimi_tau")]
        tau: f32,
    },
    /// Supervised fine-tuning: the negative log-likelihood of each trained token, `L = −logp`
    /// ([`nll_loss`](crate::loss::pg_variants::nll_loss)). Advantages and old log-probs are not
    /// read. This is the SFT objective ([`ObjectiveConfig::sft`]) given to the same trainer as the
    /// RL losses; a reinforcement-learning config refuses it.
    ///
    /// [`ObjectiveConfig::sft`]: crate::loss::ObjectiveConfig::sft
    CrossEntropy {},
}

impl Default for PolicyLoss {
    /// PPO with ROLL's defaults: symmetric clip 0.2, no dual clip, token-level ratio.
    fn default() -> Self {
        Self::Ppo {
            clip_low: d_clip(),
            clip_high: d_clip(),
            dual_clip: None,
            ratio: RatioLevel::Token,
        }
    }
}

impl PolicyLoss {
    /// Checks the settings; keys are relative to the algorithm section (`policy_loss.*`).
    pub fn validate(&self) -> Result<()> {
        match *self {
            Self::Ppo {
                clip_low,
                clip_high,
                dual_clip,
                ..
            } => {
                open_range("policy_loss.clip_low", clip_low, 0.0, 1.0)?;
                positive("policy_loss.clip_high", clip_high)?;
                match dual_clip {
                    Some(c) if !(c.is_finite() && c > 1.0) => Err(invalid(
                        "policy_loss.dual_clip",
                        c,
                        "a finite number > 1 (3 in the paper), or unset",
                    )),
                    _ => Ok(()),
                }
            }
            Self::Vanilla {} => Ok(()),
            Self::Tis {
                lower_bound,
                upper_bound,
            } => {
                non_negative("policy_loss.lower_bound", lower_bound)?;
                if upper_bound.is_finite() && upper_bound > lower_bound {
                    Ok(())
                } else {
                    Err(invalid(
                        "policy_loss.upper_bound",
                        upper_bound,
                        &format!("a finite number > lower_bound ({lower_bound})"),
                    ))
                }
            }
            Self::Topr {
                positive_weight,
                negative_weight,
            } => {
                non_negative("policy_loss.positive_weight", positive_weight)?;
                non_negative("policy_loss.negative_weight", negative_weight)
            }
            Self::Cispo {
                clip_low,
                clip_high,
                ..
            } => {
                non_negative("policy_loss.clip_low", clip_low)?;
                non_negative("policy_loss.clip_high", clip_high)
            }
            Self::Kimi15 { tau } => non_negative("policy_loss.tau", tau),
            Self::CrossEntropy {} => Ok(()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::AlgoError;

    #[test]
    fn serde_defaults_and_unknown_fields() {
        let p: PolicyLoss = serde_json::from_str(r#"{"kind":"ppo"}"#).unwrap();
        assert_eq!(p, PolicyLoss::default());
        let p: PolicyLoss = serde_json::from_str(
            r#"{"kind":"ppo","clip_high":0.28,"dual_clip":3.0,"ratio":"sequence"}"#,
        )
        .unwrap();
        assert_eq!(
            p,
            PolicyLoss::Ppo {
                clip_low: 0.2,
                clip_high: 0.28,
                dual_clip: Some(3.0),
                ratio: RatioLevel::Sequence
            }
        );
        let p: PolicyLoss = serde_json::from_str(r#"{"kind":"ppo","ratio":"segment"}"#).unwrap();
        assert!(matches!(
            p,
            PolicyLoss::Ppo {
                ratio: RatioLevel::Segment,
                ..
            }
        ));
        assert!(serde_json::from_str::<PolicyLoss>(r#"{"kind":"ppo","ratio":"turn"}"#).is_err());
        let p: PolicyLoss = serde_json::from_str(r#"{"kind":"kimi15"}"#).unwrap();
        assert_eq!(p, PolicyLoss::Kimi15 { tau: 0.1 });
        let p: PolicyLoss = serde_json::from_str(r#"{"kind":"cispo"}"#).unwrap();
        assert_eq!(
            p,
            PolicyLoss::Cispo {
                clip_low: 0.1,
                clip_high: 0.1,
                unified_mask: false
            }
        );
        // Typos in a tagged variant are rejected, not silently dropped (as dacite does in ROLL).
        assert!(serde_json::from_str::<PolicyLoss>(r#"{"kind":"ppo","clip_hgih":0.28}"#).is_err());
        assert!(serde_json::from_str::<PolicyLoss>(r#"{"kind":"tis","tau":0.1}"#).is_err());
        assert!(serde_json::from_str::<PolicyLoss>(r#"{"kind":"grpo"}"#).is_err());
        assert_eq!(
            serde_json::from_str::<PolicyLoss>(r#"{"kind":"vanilla"}"#).unwrap(),
            PolicyLoss::Vanilla {}
        );
        assert!(serde_json::from_str::<PolicyLoss>(r#"{"kind":"vanilla","tau":0.1}"#).is_err());
    }

    #[test]
    fn validation_names_keys() {
        let bad = PolicyLoss::Ppo {
            clip_low: -0.1,
            clip_high: 0.2,
            dual_clip: None,
            ratio: RatioLevel::Token,
        };
        assert_eq!(
            bad.validate().unwrap_err(),
            AlgoError::InvalidValue {
                key: "policy_loss.clip_low".into(),
                value: "-0.1".into(),
                allowed: "a number in (0, 1)".into()
            }
        );
        let bad = PolicyLoss::Ppo {
            clip_low: 0.2,
            clip_high: 0.2,
            dual_clip: Some(0.5),
            ratio: RatioLevel::Token,
        };
        assert!(
            matches!(bad.validate(), Err(AlgoError::InvalidValue { ref key, .. }) if key == "policy_loss.dual_clip")
        );
        let bad = PolicyLoss::Tis {
            lower_bound: 0.5,
            upper_bound: 0.5,
        };
        assert!(
            matches!(bad.validate(), Err(AlgoError::InvalidValue { ref key, .. }) if key == "policy_loss.upper_bound")
        );
        assert!(PolicyLoss::Kimi15 { tau: f32::NAN }.validate().is_err());
        for ok in [
            PolicyLoss::default(),
            PolicyLoss::Vanilla {},
            PolicyLoss::Tis {
                lower_bound: 0.0,
                upper_bound: 1.0,
            },
            PolicyLoss::Topr {
                positive_weight: 1.0,
                negative_weight: 1.0,
            },
            PolicyLoss::Cispo {
                clip_low: 0.1,
                clip_high: 0.1,
                unified_mask: true,
            },
            PolicyLoss::Kimi15 { tau: 0.1 },
        ] {
            assert!(ok.validate().is_ok(), "{ok:?}");
        }
    }
}
