//! The whole actor objective of one micro-batch: the policy loss, the KL loss, the entropy bonus
//! and the train–inference correction, configured by [`ObjectiveConfig`] (whose doc holds the
//! formula) and computed by [`policy_objective`].

use burn::tensor::{Bool, Tensor};
use serde::Serialize;

use super::aggregate::aggregate;
use super::config::aggregation::Denominators;
use super::config::objective::ObjectiveConfig;
use super::correction::CorrectionMetrics;
use super::masked::masked_mean;
use super::shape::{batch_dims, expect_shape, read_f32s};
use super::token_loss::TokenLoss;
use crate::kl::{KlEstimator, kl_tensor};
use crate::{AlgoError, Result};

/// The per-token inputs of one micro-batch. All per-token tensors are `[B, T]` over response
/// tokens; per-sample tensors are `[B]`. Only `logp` (and `entropy`) should carry gradients; the
/// others are detached on use.
#[derive(Debug, Clone)]
pub struct PolicyInputs {
    /// Log-probabilities of the sampled tokens under the policy being trained (with gradient).
    pub logp: Tensor<2>,
    /// Log-probabilities under the policy that generated the samples, as the training engine
    /// computes them ("old" log-probs).
    pub old_logp: Tensor<2>,
    /// Log-probabilities under the reference policy; needed by a KL loss.
    pub ref_logp: Option<Tensor<2>>,
    /// Per-token advantages.
    pub advantages: Tensor<2>,
    /// Loss mask, `true` = trained token.
    pub mask: Tensor<2, Bool>,
    /// Per-sample loss weights `[B]` (ROLL's difficulty/length weights); `None` = all 1.
    pub sample_weights: Option<Tensor<1>>,
    /// Per-sample scores `[B]` whose sign splits TOPR's positive and negative samples.
    pub scores: Option<Tensor<1>>,
    /// Log-probabilities reported by the rollout engine; needed by the train–inference
    /// correction.
    pub infer_logp: Option<Tensor<2>>,
    /// Per-token policy entropy (with gradient when the entropy bonus is on).
    pub entropy: Option<Tensor<2>>,
}

impl PolicyInputs {
    /// The required inputs; add optional ones with the `with_*` methods.
    pub fn new(
        logp: Tensor<2>,
        old_logp: Tensor<2>,
        advantages: Tensor<2>,
        mask: Tensor<2, Bool>,
    ) -> Self {
        Self {
            logp,
            old_logp,
            ref_logp: None,
            advantages,
            mask,
            sample_weights: None,
            scores: None,
            infer_logp: None,
            entropy: None,
        }
    }

    /// Sets the reference log-probabilities.
    pub fn with_ref_logp(mut self, ref_logp: Tensor<2>) -> Self {
        self.ref_logp = Some(ref_logp);
        self
    }

    /// Sets the per-sample loss weights.
    pub fn with_sample_weights(mut self, weights: Tensor<1>) -> Self {
        self.sample_weights = Some(weights);
        self
    }

    /// Sets the per-sample scores (TOPR).
    pub fn with_scores(mut self, scores: Tensor<1>) -> Self {
        self.scores = Some(scores);
        self
    }

    /// Sets the rollout engine's log-probabilities.
    pub fn with_infer_logp(mut self, infer_logp: Tensor<2>) -> Self {
        self.infer_logp = Some(infer_logp);
        self
    }

    /// Sets the per-token entropy.
    pub fn with_entropy(mut self, entropy: Tensor<2>) -> Self {
        self.entropy = Some(entropy);
        self
    }

    /// Checks every shape against `logp`'s `[B, T]`.
    fn check(&self) -> Result<[usize; 2]> {
        let dims = batch_dims("logp", &self.logp)?;
        expect_shape("old_logp", self.old_logp.dims(), dims)?;
        expect_shape("advantages", self.advantages.dims(), dims)?;
        expect_shape("loss mask", self.mask.dims(), dims)?;
        for (what, t) in [
            ("ref_logp", &self.ref_logp),
            ("infer_logp", &self.infer_logp),
            ("entropy", &self.entropy),
        ] {
            if let Some(t) = t {
                expect_shape(what, t.dims(), dims)?;
            }
        }
        for (what, t) in [
            ("sample weights", &self.sample_weights),
            ("scores", &self.scores),
        ] {
            if let Some(t) = t {
                expect_shape(what, t.dims(), [dims[0]])?;
            }
        }
        Ok(dims)
    }
}

/// The result of [`policy_objective`].
#[derive(Debug, Clone)]
pub struct PolicyLossOutput {
    /// The total loss (`[1]`) to call `backward()` on.
    pub loss: Tensor<1>,
    /// The loss mask actually used (after the train–inference filters), `[B, T]`.
    pub mask: Tensor<2, Bool>,
    /// Diagnostics read back as numbers.
    pub metrics: PolicyMetrics,
}

/// Diagnostics of one micro-batch.
///
/// Loss values are the aggregated terms as differentiated, so with global [`Denominators`] they
/// are this micro-batch's *contribution* (sum them over micro-batches). The fractions and KL
/// diagnostics are means over this micro-batch's trained tokens (after the filters).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct PolicyMetrics {
    /// The total loss.
    pub total_loss: f32,
    /// The aggregated policy loss `pg`.
    pub pg_loss: f32,
    /// The aggregated KL to the reference before its coefficient (configured estimator, or k3
    /// when only `ref_logp` is given); `0` without `ref_logp`.
    pub kl_loss: f32,
    /// The aggregated entropy before its coefficient; `0` without `entropy`.
    pub entropy: f32,
    /// Fraction of tokens where the lower ratio clip was active (see [`TokenLoss`]).
    pub clip_frac_low: f32,
    /// Fraction of tokens where the upper ratio clip was active.
    pub clip_frac_high: f32,
    /// Fraction of tokens where PPO's dual clip was active.
    pub dual_clip_frac: f32,
    /// `mean(½·(logp − old)²)`, k2 to the old policy (ROLL's `approxkl`).
    pub approx_kl: f32,
    /// `mean(logp − old)`, k1 to the old policy (ROLL's `policykl`).
    pub policy_kl: f32,
    /// Mean token ratio `mean(exp(logp − old))`.
    pub ratio_mean: f32,
    /// Train–inference diagnostics, when the correction is configured.
    pub correction: Option<CorrectionMetrics>,
}

/// Computes the actor loss of one micro-batch (the formula is on [`ObjectiveConfig`]) and its
/// metrics.
///
/// Steps: validate the config and shapes → apply the train–inference correction (weights and
/// filtered mask `m'`, from `old_logp` vs `infer_logp`) → zero every input on untrained tokens
/// (so their gradient is exactly zero and padding garbage cannot produce NaN) → per-token policy
/// loss × IS weight → aggregate → add the KL term, scale, subtract the entropy bonus → read all
/// metrics in one device sync (the graph of `loss` is untouched).
///
/// # Shapes
/// See [`PolicyInputs`]; the loss is `[1]`.
///
/// # Errors
/// [`AlgoError::InvalidValue`] for a bad config; [`AlgoError::ShapeMismatch`] /
/// [`AlgoError::Empty`] for bad inputs; [`AlgoError::MissingInput`] when the config needs an
/// input that is `None` (`ref_logp` for `kl_loss`, `infer_logp` for the correction, `entropy` for
/// a non-zero `entropy_coef`, `scores` for TOPR); [`AlgoError::TensorRead`] if the metrics cannot
/// be read.
pub fn policy_objective(
    config: &ObjectiveConfig,
    inputs: PolicyInputs,
    denominators: &Denominators,
) -> Result<PolicyLossOutput> {
    config.validate()?;
    inputs.check()?;
    let PolicyInputs {
        logp,
        old_logp,
        ref_logp,
        advantages,
        mask,
        sample_weights,
        scores,
        infer_logp,
        entropy,
    } = inputs;
    let dev = logp.device();
    let mode = config.loss_aggregation;

    let (mask, is_weights, correction) = match &config.train_infer_correction {
        Some(c) => {
            let infer = infer_logp.ok_or(AlgoError::MissingInput {
                what: "infer_logp",
                needed_by: "train_infer_correction",
            })?;
            let out = c.apply(old_logp.clone(), infer, mask)?;
            (out.mask, out.weights, Some(out.diagnostics))
        }
        None => (mask, None, None),
    };

    let untrained = mask.clone().bool_not();
    let clean = |t: Tensor<2>| t.mask_fill(untrained.clone(), 0.0);
    let logp = clean(logp);
    let old_logp = clean(old_logp.detach());
    let advantages = clean(advantages.detach());

    let TokenLoss {
        loss: token_loss,
        clipped_low,
        clipped_high,
        dual_clipped,
    } = config.policy_loss.token_loss(
        logp.clone(),
        old_logp.clone(),
        advantages,
        mask.clone(),
        scores,
    )?;
    let token_loss = match is_weights {
        Some(w) => token_loss * w,
        None => token_loss,
    };
    let weights = sample_weights.map(|w| w.detach());
    let pg = aggregate(token_loss, mask.clone(), mode, weights, denominators)?;

    let kl = match (&config.kl_loss, ref_logp) {
        (Some(k), Some(r)) => {
            let per_token = kl_tensor(k.estimator, logp.clone(), clean(r.detach()))?;
            Some((
                aggregate(per_token, mask.clone(), mode, None, denominators)?,
                k.coef,
            ))
        }
        (Some(_), None) => {
            return Err(AlgoError::MissingInput {
                what: "ref_logp",
                needed_by: "kl_loss",
            });
        }
        (None, Some(r)) => {
            let per_token = kl_tensor(KlEstimator::K3, logp.clone().detach(), clean(r.detach()))?;
            Some((
                aggregate(per_token, mask.clone(), mode, None, denominators)?,
                0.0,
            ))
        }
        (None, None) => None,
    };
    let mut total = pg.clone();
    if let Some((kl, coef)) = &kl
        && *coef != 0.0
    {
        total = total + kl.clone().mul_scalar(*coef);
    }
    total = total.mul_scalar(config.rl_loss_coef);

    let ent = match entropy {
        Some(h) => Some(aggregate(clean(h), mask.clone(), mode, None, denominators)?),
        None if config.entropy_coef != 0.0 => {
            return Err(AlgoError::MissingInput {
                what: "entropy",
                needed_by: "entropy_coef",
            });
        }
        None => None,
    };
    if let Some(e) = &ent
        && config.entropy_coef != 0.0
    {
        total = total - e.clone().mul_scalar(config.entropy_coef);
    }

    // Metrics: detached, one read.
    let zero = || Tensor::<1>::zeros([1], &dev);
    let frac = |c: Option<Tensor<2, Bool>>| match c {
        Some(c) => masked_mean(c.float(), mask.clone()),
        None => zero(),
    };
    let log_ratio = logp.detach() - old_logp;
    let mut stats = vec![
        total.clone().detach(),
        pg.detach(),
        kl.map_or_else(zero, |(k, _)| k.detach()),
        ent.map_or_else(zero, |e| e.detach()),
        frac(clipped_low),
        frac(clipped_high),
        frac(dual_clipped),
        masked_mean(log_ratio.clone().square().mul_scalar(0.5), mask.clone()),
        masked_mean(log_ratio.clone(), mask.clone()),
        masked_mean(log_ratio.exp(), mask.clone()),
    ];
    let has_correction = correction.is_some();
    if let Some(d) = correction {
        stats.extend(d.into_tensors());
    }
    let v = read_f32s("policy metrics", Tensor::cat(stats, 0))?;
    let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
    let metrics = PolicyMetrics {
        total_loss: at(0),
        pg_loss: at(1),
        kl_loss: at(2),
        entropy: at(3),
        clip_frac_low: at(4),
        clip_frac_high: at(5),
        dual_clip_frac: at(6),
        approx_kl: at(7),
        policy_kl: at(8),
        ratio_mean: at(9),
        correction: has_correction
            .then(|| CorrectionMetrics::from_values(v.get(10..).unwrap_or(&[]))),
    };
    Ok(PolicyLossOutput {
        loss: total,
        mask,
        metrics,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::loss::{KlLoss, LossAggregation, PolicyLoss, TrainInferCorrection};
    use burn::tensor::Device;

    const NAN: f32 = f32::NAN;

    /// Log-ratios ℓ = [[0, ln 1.5, ln 0.5], [0, 0, pad]], A = [[1, 1, −1], [2, −2, pad]],
    /// d = logp − ref = [[.1, .2, .3], [.4, .5, pad]], H = [[1, 1, 1], [2, 2, pad]].
    fn inputs() -> PolicyInputs {
        let dev = Device::flex();
        let old = Tensor::<2>::from_floats([[-1.0, -1.0, -1.0], [-2.0, -2.0, NAN]], &dev);
        let l = Tensor::<2>::from_floats([[0.0, 1.5f32.ln(), 0.5f32.ln()], [0.0, 0.0, 0.0]], &dev);
        let logp = old.clone() + l;
        let d = Tensor::<2>::from_floats([[0.1, 0.2, 0.3], [0.4, 0.5, 0.0]], &dev);
        let reference = logp.clone() - d;
        let adv = Tensor::<2>::from_floats([[1.0, 1.0, -1.0], [2.0, -2.0, NAN]], &dev);
        let mask = Tensor::<2, Bool>::from_bool([[true, true, true], [true, true, false]], &dev);
        let h = Tensor::<2>::from_floats([[1.0, 1.0, 1.0], [2.0, 2.0, NAN]], &dev);
        PolicyInputs::new(logp, old, adv, mask)
            .with_ref_logp(reference)
            .with_entropy(h)
    }

    fn config() -> ObjectiveConfig {
        ObjectiveConfig {
            loss_aggregation: LossAggregation::TokenMean {},
            kl_loss: Some(KlLoss {
                coef: 0.1,
                estimator: KlEstimator::K1,
            }),
            entropy_coef: 0.01,
            rl_loss_coef: 2.0,
            ..ObjectiveConfig::default()
        }
    }

    #[test]
    fn total_loss_and_metrics_by_hand() {
        let out = policy_objective(&config(), inputs(), &Denominators::local()).unwrap();
        // PPO per token: −1, −1.2 (clipped high), 0.8 (clipped low), −2, 2 → pg = −1.4/5 = −0.28.
        // KL (k1) = 1.5/5 = 0.3; entropy = 7/5 = 1.4.
        // total = (−0.28 + 0.1·0.3)·2 − 0.01·1.4 = −0.514.
        let m = out.metrics;
        let close = |a: f32, b: f32| assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        close(out.loss.into_scalar::<f32>(), -0.514);
        close(m.total_loss, -0.514);
        close(m.pg_loss, -0.28);
        close(m.kl_loss, 0.3);
        close(m.entropy, 1.4);
        close(m.clip_frac_low, 0.2);
        close(m.clip_frac_high, 0.2);
        close(m.dual_clip_frac, 0.0);
        let (a, b) = (1.5f32.ln(), 0.5f32.ln());
        close(m.approx_kl, 0.5 * (a * a + b * b) / 5.0);
        close(m.policy_kl, (a + b) / 5.0);
        close(m.ratio_mean, 1.0);
        assert!(m.correction.is_none());
    }

    #[test]
    fn correction_filters_tokens_and_reports() {
        // Rollout logp equal to old except token (0, 0), off by ln 2: the token filter drops it.
        let cfg = ObjectiveConfig {
            train_infer_correction: Some(TrainInferCorrection {
                is_weight: None,
                filters: vec![Default::default()],
            }),
            ..config()
        };
        let i = inputs();
        let dev = Device::flex();
        let off = Tensor::<2>::from_floats([[2.0f32.ln(), 0.0, 0.0], [0.0, 0.0, 0.0]], &dev);
        let infer = i.old_logp.clone() - off;
        let out = policy_objective(&cfg, i.with_infer_logp(infer), &Denominators::local()).unwrap();
        let kept: Vec<bool> = out.mask.into_data().try_into_vec().unwrap();
        assert_eq!(kept, [false, true, true, true, true, false]);
        // Remaining PPO losses −1.2, 0.8, −2, 2 → pg = −0.4/4 = −0.1.
        assert!((out.metrics.pg_loss + 0.1).abs() < 1e-5);
        let c = out.metrics.correction.unwrap();
        assert!((c.filtered_frac - 0.2).abs() < 1e-5);
        assert!((c.max_abs_diff - 2.0f32.ln()).abs() < 1e-5);
        assert!((c.mean_is_weight - 1.0).abs() < 1e-6);
    }

    #[test]
    fn missing_inputs_are_named() {
        let missing = |cfg: ObjectiveConfig, i: PolicyInputs| match policy_objective(
            &cfg,
            i,
            &Denominators::local(),
        ) {
            Err(AlgoError::MissingInput { what, .. }) => what,
            other => panic!("expected MissingInput, got {other:?}"),
        };
        let mut i = inputs();
        i.ref_logp = None;
        assert_eq!(missing(config(), i), "ref_logp");
        let mut i = inputs();
        i.entropy = None;
        assert_eq!(missing(config(), i), "entropy");
        let cfg = ObjectiveConfig {
            train_infer_correction: Some(Default::default()),
            ..config()
        };
        assert_eq!(missing(cfg, inputs()), "infer_logp");
        let cfg = ObjectiveConfig {
            policy_loss: PolicyLoss::Topr {
                positive_weight: 1.0,
                negative_weight: 1.0,
            },
            ..config()
        };
        assert_eq!(missing(cfg, inputs()), "scores");
    }

    #[test]
    fn shape_mismatches_are_errors() {
        let dev = Device::flex();
        let i = inputs().with_sample_weights(Tensor::from_floats([1.0, 1.0, 1.0], &dev));
        assert!(matches!(
            policy_objective(&config(), i, &Denominators::local()),
            Err(AlgoError::ShapeMismatch {
                what: "sample weights",
                ..
            })
        ));
        let mut i = inputs();
        i.advantages = Tensor::zeros([2, 2], &dev);
        assert!(matches!(
            policy_objective(&config(), i, &Denominators::local()),
            Err(AlgoError::ShapeMismatch { what: "advantages", expected, actual })
                if expected == vec![2, 3] && actual == vec![2, 2]
        ));
    }
}
