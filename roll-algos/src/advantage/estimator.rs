//! The typed estimator selector and the batch entry point that computes advantages and returns.

use serde::{Deserialize, Serialize};

use super::agentic::agentic_reinforce_returns;
use super::gae::gae;
use super::gigpo::gigpo_advantages;
use super::grpo::grpo_advantages;
use super::raft::raft_pp_advantages;
use super::reinforce::{last_valid_index, reinforce_returns};
use super::reinforce_pp::reinforce_pp_advantages;
use super::rloo::rloo_advantages;
use super::step_norm::{EpisodeNormalization, StepNormalization};
use super::step_reinforce::step_reinforce_advantages;
use super::steps::StepInfo;
use crate::shaping::AdvantageShaping;
use crate::shaping::config::zero_masked;
use crate::shaping::stats::{check_finite, check_finite_masked, check_len, ensure};
use crate::{AlgoError, Result};

const MISSING_VALUES: AlgoError = AlgoError::MissingInput {
    what: "values",
    needed_by: "advantage.kind = \"gae\"",
};

const MISSING_STEPS: AlgoError = AlgoError::MissingInput {
    what: "steps",
    needed_by: "advantage.kind = \"gigpo\"",
};

const MISSING_STEPS_STEP_REINFORCE: AlgoError = AlgoError::MissingInput {
    what: "steps",
    needed_by: "advantage.kind = \"step_reinforce\"",
};

fn one() -> f32 {
    1.0
}

fn default_lambda() -> f32 {
    0.95
}

fn default_step_reward_gamma() -> f32 {
    0.95
}

fn yes() -> bool {
    true
}

/// Which advantage estimator turns rewards into per-token advantages and returns.
///
/// Serialised with a `kind` tag and the variant's settings beside it, e.g. TOML
/// `kind = "gae"` / `gamma = 1.0` / `lambda = 0.95`; every setting has ROLL's default and may be left
/// out, and unknown keys are rejected. ROLL's spellings `lambd`, `episode_reward_weight` and
/// `step_reward_weight` are accepted as aliases.
///
/// [`Gigpo`](Self::Gigpo) and [`StepReinforce`](Self::StepReinforce) are step-level: each row is
/// one environment step of a multi-turn episode, described by [`AdvantageInput::steps`]
/// (see [`is_step_level`](Self::is_step_level)).
///
/// Every estimator works in two steps (see [`AdvantageEstimator::compute`]): a per-sequence
/// advantage computed from the sequence rewards (the baseline: group mean, leave-one-out, ...),
/// then a per-token return over the response (REINFORCE, GAE or turn-level REINFORCE).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum AdvantageEstimator {
    /// Generalized Advantage Estimation with a critic (Schulman et al. 2016, "High-Dimensional
    /// Continuous Control Using Generalized Advantage Estimation", arXiv:1506.02438): the sequence
    /// reward is placed on the last valid token and [`gae()`] runs with the critic's
    /// values. PPO's estimator.
    Gae {
        /// Discount γ ∈ [0, 1] (default 1).
        #[serde(default = "one")]
        gamma: f32,
        /// GAE λ ∈ [0, 1] (default 0.95; ROLL's key `lambd` also accepted).
        #[serde(default = "default_lambda", alias = "lambd")]
        lambda: f32,
    },
    /// REINFORCE (Williams 1992, "Simple Statistical Gradient-Following Algorithms for
    /// Connectionist Reinforcement Learning", Machine Learning 8): the raw sequence reward on the
    /// last valid token, then the discounted return [`reinforce_returns`].
    /// Combine with [`RewardShaping`](crate::shaping::RewardShaping) normalisation for a baseline.
    Reinforce {
        /// Discount γ ∈ [0, 1] (default 1).
        #[serde(default = "one")]
        gamma: f32,
    },
    /// GRPO (Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300): group-normalised sequence reward
    /// [`grpo_advantages`], then the REINFORCE return. With
    /// `std_normalize = false` it is Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training:
    /// A Critical Perspective", arXiv:2503.20783), which drops the std division. The default
    /// estimator.
    Grpo {
        /// Discount γ ∈ [0, 1] of the token-level return (default 1).
        #[serde(default = "one")]
        gamma: f32,
        /// Divide by the group std (default true); false = Dr.GRPO.
        #[serde(default = "yes")]
        std_normalize: bool,
    },
    /// REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large
    /// Language Models", arXiv:2501.03262): batch-normalised sequence reward
    /// [`reinforce_pp_advantages`], then the REINFORCE return.
    ReinforcePlusPlus {
        /// Discount γ ∈ [0, 1] of the token-level return (default 1).
        #[serde(default = "one")]
        gamma: f32,
    },
    /// RLOO (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
    /// Learning from Human Feedback in LLMs", arXiv:2402.14740): leave-one-out baseline
    /// [`rloo_advantages`], then the REINFORCE return.
    Rloo {
        /// Discount γ ∈ [0, 1] of the token-level return (default 1).
        #[serde(default = "one")]
        gamma: f32,
    },
    /// RAFT++ (Xiong et al. 2025, "A Minimalist Approach to LLM Reasoning: from Rejection Sampling
    /// to Reinforce", arXiv:2504.11343): advantage 1 for positively rewarded samples and 0 for the
    /// rest, [`raft_pp_advantages`], then the REINFORCE return. Pair it
    /// with a KL loss as the paper does.
    RaftPlusPlus {
        /// Discount γ ∈ [0, 1] of the token-level return (default 1).
        #[serde(default = "one")]
        gamma: f32,
    },
    /// GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training",
    /// arXiv:2505.10978): each row is one environment step;
    /// `A = episode_weight·A_ep + step_weight·A_step` from
    /// [`gigpo_advantages`], then the REINFORCE return over the step's
    /// response. Needs [`AdvantageInput::steps`].
    Gigpo {
        /// Discount γ ∈ [0, 1] of the token-level return (default 1).
        #[serde(default = "one")]
        gamma: f32,
        /// Weight of the episode-level advantage, ≥ 0 (default 1; ROLL's
        /// `episode_reward_weight`).
        #[serde(default = "one", alias = "episode_reward_weight")]
        episode_weight: f32,
        /// Weight of the step-level advantage, ≥ 0 (default 1; ROLL's `step_reward_weight`).
        #[serde(default = "one", alias = "step_reward_weight")]
        step_weight: f32,
        /// Discount γ_s ∈ [0, 1] of the step rewards within an episode (default 0.95).
        #[serde(default = "default_step_reward_gamma")]
        step_reward_gamma: f32,
        /// How the episode scores are normalised (default `{ mean = "group", std = "group" }`,
        /// the paper's; ROLL's `reward_normalization`).
        #[serde(default = "EpisodeNormalization::group")]
        episode_normalization: EpisodeNormalization,
        /// Divide the step component by its anchor-state std (default true); false =
        /// mean-centring only.
        #[serde(default = "yes")]
        step_std_normalize: bool,
    },
    /// Step-level REINFORCE (ROLL's agentic `step_reinforce`): each row is one environment step;
    /// `A` = the step's discounted return within its episode, normalised over step-samples by
    /// `normalization` ([`step_reinforce_advantages`]), then the
    /// REINFORCE return over the step's response. Needs [`AdvantageInput::steps`].
    StepReinforce {
        /// Discount γ ∈ [0, 1] of the token-level return (default 1).
        #[serde(default = "one")]
        gamma: f32,
        /// Discount γ_s ∈ [0, 1] of the step rewards within an episode (default 0.95, ROLL's).
        #[serde(default = "default_step_reward_gamma")]
        step_reward_gamma: f32,
        /// How the step returns are normalised (default `{ mean = "group", std = "group" }`;
        /// ROLL's `reward_normalization`, whose own default is none).
        #[serde(default = "StepNormalization::group")]
        normalization: StepNormalization,
    },
    /// Agentic REINFORCE over a multi-turn trajectory (ROLL's `agentic_reinforce`): each row is a
    /// whole trajectory whose mask has one segment per assistant turn; every token of a turn gets
    /// the discounted return from that turn on,
    /// [`agentic_reinforce_returns`]. Put turn rewards in
    /// [`AdvantageInput::token_rewards`] (see [`place_step_rewards`](super::place_step_rewards)).
    AgenticReinforce {
        /// Discount γ ∈ [0, 1] between turns (default 1).
        #[serde(default = "one")]
        gamma: f32,
    },
}

impl Default for AdvantageEstimator {
    /// GRPO with γ = 1 and std normalisation, the usual choice for verifiable rewards.
    fn default() -> Self {
        Self::Grpo {
            gamma: 1.0,
            std_normalize: true,
        }
    }
}

/// What an estimator is computed from: a padded batch of `B = sequence_rewards.len()` responses,
/// per-token quantities row-major `[B, seq_len]` (row `i` is `[i·seq_len, (i+1)·seq_len)`), the same
/// layout a `[B, T]` tensor has.
///
/// Build it with [`AdvantageInput::new`] and the `with_*` methods; which optional parts an estimator
/// needs is said on its variant.
#[derive(Debug, Clone, Copy)]
pub struct AdvantageInput<'a> {
    /// `[B]`: one scalar reward per response (after [`RewardShaping`](crate::shaping::RewardShaping)):
    /// the verifier's reward in RLVR, the environment's step reward for step-level rows (GiGPO, step REINFORCE), the final
    /// trajectory reward (or 0) for agentic REINFORCE.
    pub sequence_rewards: &'a [f32],
    /// `[B, seq_len]`: the loss mask, `true` = the token is trained on.
    pub mask: &'a [bool],
    /// `T`, the padded response length.
    pub seq_len: usize,
    /// `[B, seq_len]`: per-token rewards added to the placed sequence reward (a KL penalty
    /// `−β·KL_t`, turn rewards); `None` = zeros.
    pub token_rewards: Option<&'a [f32]>,
    /// `[B, seq_len]`: the critic's values; required by GAE, ignored otherwise.
    pub values: Option<&'a [f32]>,
    /// Samples per prompt; groups are contiguous (used by GRPO and RLOO; default 1).
    pub group_size: usize,
    /// `[B]`: episode, step, state and tag of each row; required by the step-level estimators
    /// (GiGPO, step REINFORCE), ignored otherwise.
    pub steps: Option<&'a [StepInfo]>,
}

impl<'a> AdvantageInput<'a> {
    /// A batch of sequence rewards `[B]` and masks `[B, seq_len]`, with no per-token rewards, no
    /// values, no step information and groups of 1.
    pub fn new(sequence_rewards: &'a [f32], mask: &'a [bool], seq_len: usize) -> Self {
        Self {
            sequence_rewards,
            mask,
            seq_len,
            token_rewards: None,
            values: None,
            group_size: 1,
            steps: None,
        }
    }

    /// Adds per-token rewards `[B, seq_len]`.
    pub fn with_token_rewards(mut self, token_rewards: &'a [f32]) -> Self {
        self.token_rewards = Some(token_rewards);
        self
    }

    /// Adds the critic's values `[B, seq_len]`.
    pub fn with_values(mut self, values: &'a [f32]) -> Self {
        self.values = Some(values);
        self
    }

    /// Sets the number of contiguous samples per prompt.
    pub fn with_group_size(mut self, group_size: usize) -> Self {
        self.group_size = group_size;
        self
    }

    /// Adds the step information `[B]` of the step-level estimators.
    pub fn with_steps(mut self, steps: &'a [StepInfo]) -> Self {
        self.steps = Some(steps);
        self
    }

    /// The number of responses `B`.
    pub fn rows(&self) -> usize {
        self.sequence_rewards.len()
    }

    /// Checks presence, shapes and finiteness: `values` is given for GAE and `steps` for the
    /// step-level estimators;
    /// `mask`, `token_rewards`, `values` hold `B·seq_len` entries and `steps` holds `B`; sequence
    /// rewards are finite, and so are token rewards and values at valid positions (masked positions
    /// may hold anything).
    fn check(&self, needs_values: bool, needs_steps: Option<AlgoError>) -> Result<()> {
        let tokens = self.rows().saturating_mul(self.seq_len);
        check_len("mask", tokens, self.mask.len())?;
        check_finite("sequence_rewards", self.sequence_rewards)?;
        if let Some(r) = self.token_rewards {
            check_len("token_rewards", tokens, r.len())?;
            check_finite_masked("token_rewards", r, self.mask)?;
        }
        if needs_values {
            let v = self.values.ok_or(MISSING_VALUES)?;
            check_len("values", tokens, v.len())?;
            check_finite_masked("values", v, self.mask)?;
        }
        if let Some(missing) = needs_steps {
            let s = self.steps.ok_or(missing)?;
            check_len("steps", self.rows(), s.len())?;
        }
        Ok(())
    }
}

/// Advantages and returns of a batch, `[B, seq_len]` row-major, 0 at masked-off positions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdvantageOutput {
    /// `[B, seq_len]`: the advantages the policy loss uses (after advantage shaping).
    pub advantages: Vec<f32>,
    /// `[B, seq_len]`: the returns (the critic's targets for GAE; equal to the unshaped advantages
    /// for the REINFORCE family).
    pub returns: Vec<f32>,
    /// `[B]`: the per-sequence advantage of step 1 (normalised reward, leave-one-out advantage, ...),
    /// for metrics.
    pub sequence_advantages: Vec<f32>,
    /// How many advantages the advantage clip changed (0 without a clip).
    pub clipped: usize,
}

impl AdvantageEstimator {
    /// The estimator's `kind` tag, e.g. `"grpo"` (for logs and metrics).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Gae { .. } => "gae",
            Self::Reinforce { .. } => "reinforce",
            Self::Grpo { .. } => "grpo",
            Self::ReinforcePlusPlus { .. } => "reinforce_plus_plus",
            Self::Rloo { .. } => "rloo",
            Self::RaftPlusPlus { .. } => "raft_plus_plus",
            Self::Gigpo { .. } => "gigpo",
            Self::StepReinforce { .. } => "step_reinforce",
            Self::AgenticReinforce { .. } => "agentic_reinforce",
        }
    }

    /// The discount γ of the token-level return.
    pub fn gamma(&self) -> f32 {
        match *self {
            Self::Gae { gamma, .. }
            | Self::Reinforce { gamma }
            | Self::Grpo { gamma, .. }
            | Self::ReinforcePlusPlus { gamma }
            | Self::Rloo { gamma }
            | Self::RaftPlusPlus { gamma }
            | Self::Gigpo { gamma, .. }
            | Self::StepReinforce { gamma, .. }
            | Self::AgenticReinforce { gamma } => gamma,
        }
    }

    /// Whether the estimator needs the critic's values (only GAE does), i.e. whether a critic must
    /// be trained.
    pub fn uses_critic(&self) -> bool {
        matches!(self, Self::Gae { .. })
    }

    /// Whether a sample's advantage is its reward against the other samples of its prompt's
    /// group ([`grpo_advantages`], [`rloo_advantages`]): in a group of one it is 0, so such an
    /// estimator needs groups of two samples or more.
    pub fn compares_within_group(&self) -> bool {
        matches!(self, Self::Grpo { .. } | Self::Rloo { .. })
    }

    /// Whether each row is one environment step described by [`AdvantageInput::steps`] (GiGPO,
    /// step REINFORCE) rather than a whole response or trajectory.
    pub fn is_step_level(&self) -> bool {
        matches!(self, Self::Gigpo { .. } | Self::StepReinforce { .. })
    }

    /// Whether [`StepInfo::state`] is read: GiGPO groups steps by anchor state, step REINFORCE
    /// when a statistic of its normalisation is taken over states.
    pub fn uses_states(&self) -> bool {
        match self {
            Self::Gigpo { .. } => true,
            Self::StepReinforce { normalization, .. } => normalization.uses_states(),
            _ => false,
        }
    }

    /// The error when a step-level estimator gets no steps (`None` for the others).
    fn missing_steps(&self) -> Option<AlgoError> {
        match self {
            Self::Gigpo { .. } => Some(MISSING_STEPS),
            Self::StepReinforce { .. } => Some(MISSING_STEPS_STEP_REINFORCE),
            _ => None,
        }
    }

    /// Checks every setting: discounts and λ in `[0, 1]`, GiGPO weights finite and ≥ 0. The error
    /// names the key, e.g. `advantage.gamma`.
    pub fn validate(&self) -> Result<()> {
        let unit =
            |key: &str, v: f32| ensure((0.0..=1.0).contains(&v), key, v, "a number in [0, 1]");
        unit("advantage.gamma", self.gamma())?;
        match *self {
            Self::Gae { lambda, .. } => unit("advantage.lambda", lambda)?,
            Self::Gigpo {
                episode_weight,
                step_weight,
                step_reward_gamma,
                ..
            } => {
                unit("advantage.step_reward_gamma", step_reward_gamma)?;
                for (key, w) in [
                    ("advantage.episode_weight", episode_weight),
                    ("advantage.step_weight", step_weight),
                ] {
                    ensure(w.is_finite() && w >= 0.0, key, w, "a finite number ≥ 0")?;
                }
            }
            Self::StepReinforce {
                step_reward_gamma, ..
            } => unit("advantage.step_reward_gamma", step_reward_gamma)?,
            _ => {}
        }
        Ok(())
    }

    /// Step 1 of [`compute`](Self::compute): the per-sequence advantage `[B]` from the sequence
    /// rewards — the reward itself for GAE, REINFORCE and agentic REINFORCE, otherwise the
    /// estimator's baseline-corrected value (see each variant).
    ///
    /// Fails when the group layout does not fit the batch, or a step-level estimator has no (or
    /// too few) steps.
    pub fn sequence_advantages(&self, input: &AdvantageInput<'_>) -> Result<Vec<f32>> {
        let rewards = input.sequence_rewards;
        match *self {
            Self::Gae { .. } | Self::Reinforce { .. } | Self::AgenticReinforce { .. } => {
                Ok(rewards.to_vec())
            }
            Self::Grpo { std_normalize, .. } => {
                grpo_advantages(rewards, input.group_size, std_normalize)
            }
            Self::ReinforcePlusPlus { .. } => Ok(reinforce_pp_advantages(rewards)),
            Self::Rloo { .. } => rloo_advantages(rewards, input.group_size),
            Self::RaftPlusPlus { .. } => Ok(raft_pp_advantages(rewards)),
            Self::Gigpo {
                episode_weight,
                step_weight,
                step_reward_gamma,
                episode_normalization,
                step_std_normalize,
                ..
            } => {
                let steps = input.steps.ok_or(MISSING_STEPS)?;
                let parts = gigpo_advantages(
                    rewards,
                    steps,
                    step_reward_gamma,
                    episode_normalization,
                    step_std_normalize,
                )?;
                Ok(parts.combined(episode_weight, step_weight))
            }
            Self::StepReinforce {
                step_reward_gamma,
                normalization,
                ..
            } => {
                let steps = input.steps.ok_or(MISSING_STEPS_STEP_REINFORCE)?;
                step_reinforce_advantages(rewards, steps, step_reward_gamma, normalization)
            }
        }
    }

    /// Advantages and returns of a batch:
    ///
    /// 1. `a_i` = [`sequence_advantages`](Self::sequence_advantages) (`[B]`);
    /// 2. token rewards `r_{i,t} = token_rewards_{i,t} + a_i·[t = last valid token of row i]`,
    ///    0 at masked positions;
    /// 3. `shaping.whiten_rewards`: masked whitening of `r` over the batch;
    /// 4. per row: GAE `(A, R)` with the values, or the REINFORCE return `A = R = c`, or the
    ///    turn-level return for agentic REINFORCE (formulas on the functions each variant names);
    /// 5. `shaping.whiten_advantages`, `A ← A·m`, `shaping.clip` (see [`AdvantageShaping`]).
    ///
    /// Masked-off positions are never read (rewards and values there may be anything, even NaN) and
    /// are 0 in both outputs. A row without valid tokens gets zeros.
    ///
    /// # Shapes
    /// See [`AdvantageInput`]; outputs are `[B, seq_len]` (and `[B]` for the sequence advantages).
    ///
    /// # Errors
    /// [`AlgoError::InvalidValue`] for invalid settings; [`AlgoError::MissingInput`] when GAE has
    /// no values or a step-level estimator no steps; [`AlgoError::LengthMismatch`] when the inputs do not fit
    /// `[B, seq_len]`; [`AlgoError::GroupSize`] when `group_size` does not divide `B` (GRPO, RLOO);
    /// [`AlgoError::NonFinite`] for a NaN or infinite reward or value at a valid position.
    pub fn compute(
        &self,
        input: &AdvantageInput<'_>,
        shaping: &AdvantageShaping,
    ) -> Result<AdvantageOutput> {
        self.validate()?;
        shaping.validate()?;
        input.check(self.uses_critic(), self.missing_steps())?;
        let sequence_advantages = self.sequence_advantages(input)?;

        let t = input.seq_len;
        let mask = input.mask;
        let mut token_rewards = input
            .token_rewards
            .map_or_else(|| vec![0.0; mask.len()], <[f32]>::to_vec);
        zero_masked(&mut token_rewards, mask);
        for (row, a) in sequence_advantages.iter().enumerate() {
            if let Some(last) = last_valid_index(&mask[row * t..(row + 1) * t]) {
                token_rewards[row * t + last] += a;
            }
        }
        shaping.shape_token_rewards(&mut token_rewards, mask)?;

        let gamma = self.gamma();
        let mut advantages = Vec::with_capacity(mask.len());
        let mut returns = Vec::with_capacity(mask.len());
        for row in 0..input.rows() {
            let span = row * t..(row + 1) * t;
            let (r, m) = (&token_rewards[span.clone()], &mask[span.clone()]);
            match *self {
                Self::Gae { lambda, .. } => {
                    let values = input.values.ok_or(MISSING_VALUES)?;
                    let out = gae(r, &values[span], m, gamma, lambda)?;
                    advantages.extend_from_slice(&out.advantages);
                    returns.extend_from_slice(&out.returns);
                }
                Self::AgenticReinforce { .. } => {
                    let c = agentic_reinforce_returns(r, m, gamma)?;
                    advantages.extend_from_slice(&c);
                    returns.extend_from_slice(&c);
                }
                _ => {
                    let c = reinforce_returns(r, m, gamma)?;
                    advantages.extend_from_slice(&c);
                    returns.extend_from_slice(&c);
                }
            }
        }
        let clipped = shaping.shape_advantages(&mut advantages, mask)?;
        Ok(AdvantageOutput {
            advantages,
            returns,
            sequence_advantages,
            clipped,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    use crate::advantage::NormScope;
    use crate::test_util::assert_close;

    const NONE: AdvantageShaping = AdvantageShaping {
        whiten_rewards: false,
        whiten_advantages: false,
        clip: None,
    };

    #[test]
    fn serde_defaults_and_tags() {
        let e: AdvantageEstimator = serde_json::from_str(r#"{"kind":"gae"}"#).unwrap();
        assert_eq!(
            e,
            AdvantageEstimator::Gae {
                gamma: 1.0,
                lambda: 0.95
            }
        );
        let e: AdvantageEstimator = serde_json::from_str(r#"{"kind":"gae","lambd":0.9}"#).unwrap();
        assert_eq!(
            e,
            AdvantageEstimator::Gae {
                gamma: 1.0,
                lambda: 0.9
            }
        );
        let e: AdvantageEstimator =
            serde_json::from_str(r#"{"kind":"grpo","std_normalize":false}"#).unwrap();
        assert_eq!(
            e,
            AdvantageEstimator::Grpo {
                gamma: 1.0,
                std_normalize: false
            }
        );
        let e: AdvantageEstimator =
            serde_json::from_str(r#"{"kind":"gigpo","episode_reward_weight":0.5}"#).unwrap();
        assert_eq!(
            e,
            AdvantageEstimator::Gigpo {
                gamma: 1.0,
                episode_weight: 0.5,
                step_weight: 1.0,
                step_reward_gamma: 0.95,
                episode_normalization: EpisodeNormalization::group(),
                step_std_normalize: true
            }
        );
        // GiGPO's former `std_normalize` (both parts) is refused rather than silently narrowed.
        assert!(
            serde_json::from_str::<AdvantageEstimator>(r#"{"kind":"gigpo","std_normalize":false}"#)
                .is_err()
        );
        let e: AdvantageEstimator = serde_json::from_str(
            r#"{"kind":"step_reinforce","step_reward_gamma":1.0,
                "normalization":{"mean":"traj_group_id","std":"batch"}}"#,
        )
        .unwrap();
        assert_eq!(
            e,
            AdvantageEstimator::StepReinforce {
                gamma: 1.0,
                step_reward_gamma: 1.0,
                normalization: StepNormalization {
                    mean: NormScope::Group,
                    std: NormScope::Batch
                }
            }
        );
        assert!(e.is_step_level() && !e.uses_states() && !e.compares_within_group());
        let e: AdvantageEstimator = serde_json::from_str(r#"{"kind":"step_reinforce"}"#).unwrap();
        assert_eq!(
            e,
            AdvantageEstimator::StepReinforce {
                gamma: 1.0,
                step_reward_gamma: 0.95,
                normalization: StepNormalization::group()
            }
        );
        assert_eq!(e.name(), "step_reinforce");
        assert!(
            serde_json::from_str::<AdvantageEstimator>(
                r#"{"kind":"step_reinforce","normalization":{"grouping":"batch"}}"#
            )
            .is_err()
        );
        for kind in [
            "reinforce",
            "reinforce_plus_plus",
            "rloo",
            "raft_plus_plus",
            "agentic_reinforce",
        ] {
            let e: AdvantageEstimator =
                serde_json::from_str(&format!(r#"{{"kind":"{kind}"}}"#)).unwrap();
            assert_eq!(e.name(), kind);
            assert_eq!(e.gamma(), 1.0);
            let back: AdvantageEstimator =
                serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
            assert_eq!(back, e);
        }
        assert_eq!(AdvantageEstimator::default().name(), "grpo");
        assert!(AdvantageEstimator::default().compares_within_group());
    }

    #[test]
    fn serde_rejects_unknown_fields_and_kinds() {
        let err = serde_json::from_str::<AdvantageEstimator>(r#"{"kind":"grpo","gama":0.9}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `gama`"), "{err}");
        // A field of another variant is unknown too.
        assert!(
            serde_json::from_str::<AdvantageEstimator>(r#"{"kind":"reinforce","lambda":0.9}"#)
                .is_err()
        );
        assert!(serde_json::from_str::<AdvantageEstimator>(r#"{"kind":"ppo"}"#).is_err());
        assert!(serde_json::from_str::<AdvantageEstimator>(r#"{"gamma":1.0}"#).is_err());
    }

    #[test]
    fn validate_names_the_key() {
        let e = AdvantageEstimator::Gae {
            gamma: 1.5,
            lambda: 0.95,
        };
        assert_eq!(
            e.validate(),
            Err(AlgoError::InvalidValue {
                key: "advantage.gamma".into(),
                value: "1.5".into(),
                allowed: "a number in [0, 1]".into()
            })
        );
        let e = AdvantageEstimator::Gae {
            gamma: 1.0,
            lambda: f32::NAN,
        };
        assert!(
            matches!(e.validate(), Err(AlgoError::InvalidValue { key, .. }) if key == "advantage.lambda")
        );
        let e = AdvantageEstimator::Gigpo {
            gamma: 1.0,
            episode_weight: -1.0,
            step_weight: 1.0,
            step_reward_gamma: 0.95,
            episode_normalization: EpisodeNormalization::group(),
            step_std_normalize: true,
        };
        assert!(
            matches!(e.validate(), Err(AlgoError::InvalidValue { key, .. }) if key == "advantage.episode_weight")
        );
        let e = AdvantageEstimator::StepReinforce {
            gamma: 1.0,
            step_reward_gamma: 1.5,
            normalization: StepNormalization::group(),
        };
        assert!(
            matches!(e.validate(), Err(AlgoError::InvalidValue { key, .. }) if key == "advantage.step_reward_gamma")
        );
        assert!(AdvantageEstimator::default().validate().is_ok());
    }

    #[test]
    fn grpo_batch_end_to_end() {
        // Two groups of two, T = 3, second response of each group is padded after 2 tokens.
        let rewards = [1.0, 0.0, 1.0, 1.0];
        let mask = [
            true, true, true, //
            true, true, false, //
            true, true, true, //
            true, false, false,
        ];
        let input = AdvantageInput::new(&rewards, &mask, 3).with_group_size(2);
        let out = AdvantageEstimator::default()
            .compute(&input, &NONE)
            .unwrap();
        let a = 0.707_105_8;
        assert_close(&out.sequence_advantages, &[a, -a, 0.0, 0.0]);
        assert_close(
            &out.advantages,
            &[a, a, a, -a, -a, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        );
        assert_eq!(out.returns, out.advantages);
        assert_eq!(out.clipped, 0);
    }

    #[test]
    fn gae_batch_with_kl_token_rewards() {
        // One row, T = 3, last position is padding holding junk. Token rewards −0.1 (a KL term)
        // on each valid token, sequence reward 1 on token 1. γ = 1, λ = 1, V = [0.5, 0.5, junk]:
        // r = [−0.1, 0.9]; δ₁ = 0.9 − 0.5 = 0.4, A₁ = 0.4; δ₀ = −0.1 + 0.5 − 0.5 = −0.1, A₀ = 0.3.
        let input = AdvantageInput::new(&[1.0], &[true, true, false], 3)
            .with_token_rewards(&[-0.1, -0.1, f32::NAN])
            .with_values(&[0.5, 0.5, f32::NAN]);
        let e = AdvantageEstimator::Gae {
            gamma: 1.0,
            lambda: 1.0,
        };
        let out = e.compute(&input, &NONE).unwrap();
        assert_close(&out.advantages, &[0.3, 0.4, 0.0]);
        assert_close(&out.returns, &[0.8, 0.9, 0.0]);
    }

    #[test]
    fn gae_without_values_is_an_error() {
        let input = AdvantageInput::new(&[1.0], &[true], 1);
        let e = AdvantageEstimator::Gae {
            gamma: 1.0,
            lambda: 0.95,
        };
        assert_eq!(e.compute(&input, &NONE), Err(MISSING_VALUES));
    }

    #[test]
    fn shaping_whitens_and_clips() {
        // REINFORCE, γ = 1, rows [1] and [3] of one token each: advantages [1, 3] → whitened
        // [−0.7071068, 0.7071068] → clipped at 0.5. Returns stay unwhitened.
        let input = AdvantageInput::new(&[1.0, 3.0], &[true, true], 1);
        let shaping = AdvantageShaping {
            whiten_rewards: false,
            whiten_advantages: true,
            clip: Some(0.5),
        };
        let out = AdvantageEstimator::Reinforce { gamma: 1.0 }
            .compute(&input, &shaping)
            .unwrap();
        assert_close(&out.advantages, &[-0.5, 0.5]);
        assert_close(&out.returns, &[1.0, 3.0]);
        assert_eq!(out.clipped, 2);
    }

    #[test]
    fn whiten_rewards_runs_before_returns() {
        // One row of two tokens, reward 2 on the last: token rewards [0, 2] → whitened
        // [−0.7071068, 0.7071068]; REINFORCE γ = 1 → [0, 0.7071068].
        let input = AdvantageInput::new(&[2.0], &[true, true], 2);
        let shaping = AdvantageShaping {
            whiten_rewards: true,
            ..NONE
        };
        let out = AdvantageEstimator::Reinforce { gamma: 1.0 }
            .compute(&input, &shaping)
            .unwrap();
        assert_close(&out.advantages, &[0.0, std::f32::consts::FRAC_1_SQRT_2]);
    }

    #[test]
    fn rloo_raft_and_reinforce_pp_batches() {
        let rewards = [1.0, 0.0, 0.0, 1.0];
        let mask = [true; 4];
        let input = AdvantageInput::new(&rewards, &mask, 1).with_group_size(2);
        let rloo = AdvantageEstimator::Rloo { gamma: 1.0 }
            .compute(&input, &NONE)
            .unwrap();
        assert_close(&rloo.advantages, &[1.0, -1.0, -1.0, 1.0]);
        let raft = AdvantageEstimator::RaftPlusPlus { gamma: 1.0 }
            .compute(&input, &NONE)
            .unwrap();
        assert_close(&raft.advantages, &[1.0, 0.0, 0.0, 1.0]);
        // Batch mean 0.5, std sqrt(1/3) → ±0.8660239.
        let rpp = AdvantageEstimator::ReinforcePlusPlus { gamma: 1.0 }
            .compute(&input, &NONE)
            .unwrap();
        let a = 0.866_023_9;
        assert_close(&rpp.advantages, &[a, -a, -a, a]);
    }

    #[test]
    fn gigpo_batch_uses_steps() {
        // Two one-step episodes of one group at the same state, rewards 1 and 0; one token each.
        let steps = [
            StepInfo {
                group: 0,
                episode: 0,
                step: 0,
                state: 7,
                tag: 0,
            },
            StepInfo {
                group: 0,
                episode: 1,
                step: 0,
                state: 7,
                tag: 0,
            },
        ];
        let input = AdvantageInput::new(&[1.0, 0.0], &[true, true], 1).with_steps(&steps);
        let e = AdvantageEstimator::Gigpo {
            gamma: 1.0,
            episode_weight: 1.0,
            step_weight: 1.0,
            step_reward_gamma: 0.95,
            episode_normalization: EpisodeNormalization::group(),
            step_std_normalize: true,
        };
        let out = e.compute(&input, &NONE).unwrap();
        // A_ep = A_step = ±0.7071058 → ±1.4142116.
        assert_close(&out.advantages, &[1.414_211_6, -1.414_211_6]);
        let missing = AdvantageInput::new(&[1.0, 0.0], &[true, true], 1);
        assert_eq!(e.compute(&missing, &NONE), Err(MISSING_STEPS));
    }

    #[test]
    fn step_reinforce_batch_uses_steps() {
        // One episode of two steps (rows given in reverse), rewards 0 (step 0) and 1 (step 1),
        // two tokens per row with the second of row 1 padded; γ_s = 0.5, γ = 1.
        // G: step 1 → 1, step 0 → 0 + 0.5·1 = 0.5. Batch mean 0.75, no std → ±0.25.
        // Row 0 (step 1): 0.25 on both tokens; row 1 (step 0): −0.25 on its token.
        let steps = [
            StepInfo {
                step: 1,
                ..StepInfo::default()
            },
            StepInfo::default(),
        ];
        let mask = [true, true, true, false];
        let input = AdvantageInput::new(&[1.0, 0.0], &mask, 2).with_steps(&steps);
        let e = AdvantageEstimator::StepReinforce {
            gamma: 1.0,
            step_reward_gamma: 0.5,
            normalization: StepNormalization {
                mean: NormScope::Batch,
                std: NormScope::None,
            },
        };
        let out = e.compute(&input, &NONE).unwrap();
        assert_close(&out.sequence_advantages, &[0.25, -0.25]);
        assert_close(&out.advantages, &[0.25, 0.25, -0.25, 0.0]);
        let missing = AdvantageInput::new(&[1.0, 0.0], &mask, 2);
        assert_eq!(
            e.compute(&missing, &NONE),
            Err(MISSING_STEPS_STEP_REINFORCE)
        );
        let short = input.with_steps(&steps[..1]);
        assert!(matches!(
            e.compute(&short, &NONE),
            Err(AlgoError::LengthMismatch { what: "steps", .. })
        ));
    }

    #[test]
    fn agentic_reinforce_batch() {
        // Turn rewards 0.5 and 1 at the ends of two segments, no sequence reward; γ = 0.9.
        let mask = [true, false, true, true];
        let input = AdvantageInput::new(&[0.0], &mask, 4).with_token_rewards(&[0.5, 9.0, 0.0, 1.0]);
        let out = AdvantageEstimator::AgenticReinforce { gamma: 0.9 }
            .compute(&input, &NONE)
            .unwrap();
        assert_close(&out.advantages, &[1.4, 0.0, 1.0, 1.0]);
    }

    #[test]
    fn shape_and_value_errors() {
        let e = AdvantageEstimator::default();
        let bad_mask = AdvantageInput::new(&[1.0, 0.0], &[true; 3], 2);
        assert!(matches!(
            e.compute(&bad_mask, &NONE),
            Err(AlgoError::LengthMismatch { what: "mask", .. })
        ));
        let bad_group = AdvantageInput::new(&[1.0, 0.0, 1.0], &[true; 3], 1).with_group_size(2);
        assert!(matches!(
            e.compute(&bad_group, &NONE),
            Err(AlgoError::GroupSize { .. })
        ));
        let nan = AdvantageInput::new(&[f32::NAN], &[true], 1);
        assert!(matches!(
            e.compute(&nan, &NONE),
            Err(AlgoError::NonFinite { .. })
        ));
        let empty = AdvantageInput::new(&[], &[], 5);
        assert_eq!(
            e.compute(&empty, &NONE).unwrap(),
            AdvantageOutput::default()
        );
        let no_tokens = AdvantageInput::new(&[1.0, 0.0], &[], 0).with_group_size(2);
        assert!(e.compute(&no_tokens, &NONE).unwrap().advantages.is_empty());
    }
}
