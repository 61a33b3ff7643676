//! Gradient tests of every loss on Burn's autodiff device: the gradient with respect to `logp` has
//! the right sign, clipped tokens contribute exactly zero, stop-gradient weights carry none (the
//! gradient equals the weight-as-constant formula), and masked tokens get zero gradient.
#![allow(clippy::unwrap_used)]

use burn::tensor::{Bool, Device, Tensor};
use roll_algos::kl::KlEstimator;
use roll_algos::loss::{
    CorrectionLevel, Denominators, IsWeightConfig, KlLoss, LossAggregation, ObjectiveConfig,
    PolicyInputs, PolicyLoss, RatioLevel, TrainInferCorrection, ValueLossConfig, critic_loss,
    policy_objective,
};

const NAN: f32 = f32::NAN;
const B: usize = 2;
const T: usize = 4;
type Grid = [[f32; T]; B];

/// Trained tokens: 4 + 3; the last token of row 1 is padding.
const MASK: [[bool; T]; B] = [[true, true, true, true], [true, true, true, false]];
const N: f32 = 7.0;

fn dev() -> Device {
    Device::flex().autodiff()
}

fn t(d: &Device, g: Grid) -> Tensor<2> {
    Tensor::from_floats(g, d)
}

fn mask(d: &Device) -> Tensor<2, Bool> {
    Tensor::from_bool(MASK, d)
}

/// `old = −1`, `logp = −1 + ln r`, so that `exp(logp − old) = r`; padding holds garbage.
fn logp_for(r: Grid) -> Grid {
    let mut out = [[0.0; T]; B];
    for b in 0..B {
        for i in 0..T {
            out[b][i] = if MASK[b][i] {
                -1.0 + r[b][i].ln()
            } else {
                50.0
            };
        }
    }
    out
}

const OLD: Grid = [[-1.0; T], [-1.0, -1.0, -1.0, -100.0]];

/// Runs `f` on a fresh `logp` leaf and returns `∂loss/∂logp`, row-major.
fn grad_of(logp: Grid, f: impl FnOnce(Tensor<2>, &Device) -> Tensor<1>) -> Vec<f32> {
    let d = dev();
    let x = t(&d, logp).require_grad();
    let loss = f(x.clone(), &d);
    let value: f32 = loss.clone().into_scalar();
    assert!(value.is_finite(), "loss {value}");
    let grads = loss.backward();
    x.grad(&grads)
        .unwrap()
        .into_data()
        .try_into_vec::<f32>()
        .unwrap()
}

fn assert_close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() < 1e-5,
            "index {i}: got {got:?}, want {want:?}"
        );
    }
}

fn token_mean(policy_loss: PolicyLoss) -> ObjectiveConfig {
    ObjectiveConfig {
        policy_loss,
        loss_aggregation: LossAggregation::TokenMean {},
        ..ObjectiveConfig::default()
    }
}

/// The objective's loss for `logp` with the given advantages (padding advantage is NaN).
fn objective_loss(cfg: &ObjectiveConfig, logp: Tensor<2>, d: &Device, adv: Grid) -> Tensor<1> {
    let inputs = PolicyInputs::new(logp, t(d, OLD), t(d, adv), mask(d))
        .with_scores(Tensor::from_floats([1.0, -1.0], d));
    policy_objective(cfg, inputs, &Denominators::local())
        .unwrap()
        .loss
}

const ADV: Grid = [[2.0, 2.0, -1.0, -1.0], [-1.0, -1.0, 3.0, NAN]];
/// Ratios: inside, above 1.2 with A > 0, below 0.8 with A < 0, inside | 5 and 1.5 with A < 0
/// (unclipped by PPO, dual-clipped at c = 3 only for 5), 0.5 with A > 0 (unclipped).
const R: Grid = [[1.1, 1.5, 0.5, 0.9], [5.0, 1.5, 0.5, 1.0]];

fn ppo(dual_clip: Option<f32>) -> PolicyLoss {
    PolicyLoss::Ppo {
        clip_low: 0.2,
        clip_high: 0.2,
        dual_clip,
        ratio: RatioLevel::Token,
    }
}

#[test]
fn ppo_clipped_tokens_get_exactly_zero_gradient() {
    let cfg = token_mean(ppo(None));
    let g = grad_of(logp_for(R), |x, d| objective_loss(&cfg, x, d, ADV));
    // ∂(−r·A/N)/∂logp = −r·A/N where unclipped.
    let want = [
        -1.1 * 2.0 / N,
        0.0,
        0.0,
        0.9 / N,
        5.0 / N,
        1.5 / N,
        -1.5 / N,
        0.0,
    ];
    assert_close(&g, &want);
    assert_eq!(g[1], 0.0);
    assert_eq!(g[2], 0.0);
    assert_eq!(g[7], 0.0);
}

#[test]
fn ppo_dual_clip_zeroes_the_capped_token_only() {
    let cfg = token_mean(ppo(Some(3.0)));
    let g = grad_of(logp_for(R), |x, d| objective_loss(&cfg, x, d, ADV));
    let want = [
        -1.1 * 2.0 / N,
        0.0,
        0.0,
        0.9 / N,
        0.0,
        1.5 / N,
        -1.5 / N,
        0.0,
    ];
    assert_close(&g, &want);
    assert_eq!(g[4], 0.0);
}

#[test]
fn positive_advantage_pushes_logp_up_for_every_loss() {
    // All ratios 1 (on-policy), A = +1 on every token: each loss must decrease with logp.
    let adv = [[1.0; T], [1.0, 1.0, 1.0, NAN]];
    let logp = logp_for([[1.0; T]; B]);
    for loss in [
        ppo(None),
        ppo(Some(3.0)),
        PolicyLoss::Ppo {
            clip_low: 0.2,
            clip_high: 0.2,
            dual_clip: None,
            ratio: RatioLevel::Sequence,
        },
        PolicyLoss::Ppo {
            clip_low: 0.2,
            clip_high: 0.2,
            dual_clip: None,
            ratio: RatioLevel::Segment,
        },
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
        for agg in [
            LossAggregation::TokenMean {},
            LossAggregation::SeqMeanTokenSum {},
            LossAggregation::SeqMeanTokenMean {},
            LossAggregation::SeqMeanTokenSumNorm { horizon: None },
        ] {
            let cfg = ObjectiveConfig {
                policy_loss: loss,
                loss_aggregation: agg,
                ..Default::default()
            };
            let g = grad_of(logp, |x, d| objective_loss(&cfg, x, d, adv));
            for (i, gi) in g.iter().enumerate() {
                if i == 7 {
                    assert_eq!(*gi, 0.0, "{loss:?} {agg:?}: padding");
                } else {
                    assert!(*gi < 0.0, "{loss:?} {agg:?}: token {i} has gradient {gi}");
                }
            }
            // And the opposite sign for negative advantages.
            let neg = [[-1.0; T], [-1.0, -1.0, -1.0, NAN]];
            let g = grad_of(logp, |x, d| objective_loss(&cfg, x, d, neg));
            assert!(g[..7].iter().all(|gi| *gi > 0.0), "{loss:?} {agg:?}: {g:?}");
        }
    }
}

#[test]
fn masked_tokens_get_zero_gradient_despite_garbage() {
    // Padding has logp 50, old −100, advantage NaN, ref −1e4 and entropy NaN.
    let d0 = dev();
    let cfg = ObjectiveConfig {
        kl_loss: Some(KlLoss {
            coef: 0.1,
            estimator: KlEstimator::K3,
        }),
        entropy_coef: 0.01,
        train_infer_correction: Some(TrainInferCorrection::default()),
        ..token_mean(ppo(Some(3.0)))
    };
    cfg.validate().unwrap();
    let g = grad_of(logp_for(R), |x, d| {
        let inputs = PolicyInputs::new(x, t(d, OLD), t(d, ADV), mask(d))
            .with_ref_logp(t(d, [[-1.0; T], [-1.0, -1.0, -1.0, -1e4]]))
            .with_infer_logp(t(d, [[-1.0; T], [-1.0, -1.0, -1.0, NAN]]))
            .with_entropy(t(d, [[0.5; T], [0.5, 0.5, 0.5, NAN]]));
        policy_objective(&cfg, inputs, &Denominators::local())
            .unwrap()
            .loss
    });
    drop(d0);
    assert!(g.iter().all(|x| x.is_finite()), "{g:?}");
    assert_eq!(g[7], 0.0);
}

#[test]
fn sequence_ratio_spreads_the_gradient_over_the_sequence() {
    // GSPO: every token of a sequence shares r_b = exp(mean log-ratio); A constant per sequence.
    // L = −Σ_b Σ_t r_b·A_b / N  ⇒  ∂L/∂logp_bt = −r_b·A_b·n_b/(n_b·N) = −r_b·A_b/N.
    let r: Grid = [[1.05, 0.98, 1.0, 1.01], [1.02, 0.99, 1.0, 1.0]];
    let adv = [[1.0; T], [-2.0, -2.0, -2.0, NAN]];
    let geo = |row: &[f32]| (row.iter().map(|x| x.ln()).sum::<f32>() / row.len() as f32).exp();
    let (r0, r1) = (geo(&r[0]), geo(&r[1][..3]));
    let cfg = token_mean(PolicyLoss::Ppo {
        clip_low: 0.2,
        clip_high: 0.2,
        dual_clip: None,
        ratio: RatioLevel::Sequence,
    });
    let g = grad_of(logp_for(r), |x, d| objective_loss(&cfg, x, d, adv));
    let (a, b) = (-r0 / N, 2.0 * r1 / N);
    assert_close(&g, &[a, a, a, a, b, b, b, 0.0]);
}

#[test]
fn vanilla_gradient_is_minus_advantage() {
    let g = grad_of(logp_for(R), |x, d| {
        objective_loss(&token_mean(PolicyLoss::Vanilla {}), x, d, ADV)
    });
    assert_close(
        &g,
        &[
            -2.0 / N,
            -2.0 / N,
            1.0 / N,
            1.0 / N,
            1.0 / N,
            1.0 / N,
            -3.0 / N,
            0.0,
        ],
    );
}

#[test]
fn tis_weight_is_a_constant() {
    // ∂L/∂logp = −min(r, 1)·A/N: the weight's own dependence on logp carries no gradient.
    let cfg = token_mean(PolicyLoss::Tis {
        lower_bound: 0.0,
        upper_bound: 1.0,
    });
    let g = grad_of(logp_for(R), |x, d| objective_loss(&cfg, x, d, ADV));
    let w = |r: f32| r.min(1.0);
    let want = [
        -w(1.1) * 2.0 / N,
        -w(1.5) * 2.0 / N,
        w(0.5) / N,
        w(0.9) / N,
        w(5.0) / N,
        w(1.5) / N,
        -w(0.5) * 3.0 / N,
        0.0,
    ];
    assert_close(&g, &want);
}

#[test]
fn topr_weights_are_constants() {
    // Row 0 scores +1 (w_pos = 2), row 1 scores −1 (w_neg = 0.5, truncated IS).
    let cfg = token_mean(PolicyLoss::Topr {
        positive_weight: 2.0,
        negative_weight: 0.5,
    });
    let g = grad_of(logp_for(R), |x, d| objective_loss(&cfg, x, d, ADV));
    let neg = |r: f32, a: f32| -0.5 * r.min(1.0) * a / N;
    let want = [
        -4.0 / N,
        -4.0 / N,
        2.0 / N,
        2.0 / N,
        neg(5.0, -1.0),
        neg(1.5, -1.0),
        neg(0.5, 3.0),
        0.0,
    ];
    assert_close(&g, &want);
}

#[test]
fn cispo_keeps_gradients_of_clipped_tokens_with_constant_weights() {
    let cfg = token_mean(PolicyLoss::Cispo {
        clip_low: 0.2,
        clip_high: 0.2,
        unified_mask: false,
    });
    let g = grad_of(logp_for(R), |x, d| objective_loss(&cfg, x, d, ADV));
    let w = |r: f32| r.clamp(0.8, 1.2);
    let want = [
        -w(1.1) * 2.0 / N,
        -w(1.5) * 2.0 / N,
        w(0.5) / N,
        w(0.9) / N,
        w(5.0) / N,
        w(1.5) / N,
        -w(0.5) * 3.0 / N,
        0.0,
    ];
    assert_close(&g, &want);
    // With the unified mask, the tokens PPO would clip (indices 1 and 2) get none.
    let cfg = token_mean(PolicyLoss::Cispo {
        clip_low: 0.2,
        clip_high: 0.2,
        unified_mask: true,
    });
    let g = grad_of(logp_for(R), |x, d| objective_loss(&cfg, x, d, ADV));
    let mut masked = want;
    masked[1] = 0.0;
    masked[2] = 0.0;
    assert_close(&g, &masked);
}

#[test]
fn kimi15_gradient_adds_the_penalty_pull() {
    // ∂/∂logp [−A·logp + τ/2·(logp − old)²] = −A + τ·ln r.
    let cfg = token_mean(PolicyLoss::Kimi15 { tau: 0.1 });
    let g = grad_of(logp_for(R), |x, d| objective_loss(&cfg, x, d, ADV));
    let a = [2.0, 2.0, -1.0, -1.0, -1.0, -1.0, 3.0];
    let r = [1.1f32, 1.5, 0.5, 0.9, 5.0, 1.5, 0.5];
    let mut want: Vec<f32> = (0..7).map(|i| (-a[i] + 0.1 * r[i].ln()) / N).collect();
    want.push(0.0);
    assert_close(&g, &want);
}

#[test]
fn kl_loss_gradients_per_estimator() {
    // Vanilla with A = 0 isolates the KL term: ∂(β·Σ KL/N)/∂logp with d = logp − ref.
    let zero_adv = [[0.0; T], [0.0, 0.0, 0.0, NAN]];
    let logp = [[-1.0, -1.5, -0.5, -1.0], [-1.0, -20.0, -1.0, 0.0]];
    let reff = [[-1.0, -1.0, -1.0, -1.0], [-1.2, -1.0, -1.0, -1.0]];
    let beta = 0.5;
    let d: Vec<f32> = (0..8)
        .map(|i| logp[i / T][i % T] - reff[i / T][i % T])
        .collect();
    for est in [
        KlEstimator::K1,
        KlEstimator::Abs,
        KlEstimator::K2,
        KlEstimator::K3,
    ] {
        let cfg = ObjectiveConfig {
            kl_loss: Some(KlLoss {
                coef: beta,
                estimator: est,
            }),
            ..token_mean(PolicyLoss::Vanilla {})
        };
        let g = grad_of(logp, |x, dv| {
            let inputs = PolicyInputs::new(x, t(dv, OLD), t(dv, zero_adv), mask(dv))
                .with_ref_logp(t(dv, reff));
            policy_objective(&cfg, inputs, &Denominators::local())
                .unwrap()
                .loss
        });
        let want: Vec<f32> = (0..8)
            .map(|i| {
                if i == 7 {
                    return 0.0;
                }
                let di = d[i];
                let dk = match est {
                    KlEstimator::K1 => 1.0,
                    KlEstimator::Abs => di.signum() * (di != 0.0) as u8 as f32,
                    KlEstimator::K2 => di,
                    // k3 = exp(−d) + d − 1, clamped at 10: token 5 (d = −19) is clamped.
                    KlEstimator::K3 if i == 5 => 0.0,
                    KlEstimator::K3 => 1.0 - (-di).exp(),
                };
                beta * dk / N
            })
            .collect();
        assert_close(&g, &want);
        // KL to the reference pulls logp towards it: positive d ⇒ positive gradient.
        if est != KlEstimator::K1 {
            assert!(g[2] > 0.0 && g[1] < 0.0, "{est:?}: {g:?}");
        }
    }
}

#[test]
fn entropy_bonus_gradient() {
    // ∂total/∂H = −coef/N on trained tokens, 0 on padding.
    let d = dev();
    let h = t(&d, [[0.5; T], [0.5, 0.5, 0.5, NAN]]).require_grad();
    let cfg = ObjectiveConfig {
        entropy_coef: 0.01,
        ..token_mean(PolicyLoss::Vanilla {})
    };
    let inputs = PolicyInputs::new(t(&d, logp_for(R)), t(&d, OLD), t(&d, ADV), mask(&d))
        .with_entropy(h.clone());
    let out = policy_objective(&cfg, inputs, &Denominators::local()).unwrap();
    let g: Vec<f32> = h
        .grad(&out.loss.backward())
        .unwrap()
        .into_data()
        .try_into_vec()
        .unwrap();
    let c = -0.01 / N;
    assert_close(&g, &[c, c, c, c, c, c, c, 0.0]);
}

#[test]
fn train_infer_weight_is_a_constant_even_when_old_is_the_live_logp() {
    // Without old-logp recomputation ROLL sets old = the current logp. Pass the live tensor as
    // `old_logp` too: both the ratio's denominator and the IS weight must be stop-gradient, so
    // ∂L/∂logp = −w·r·A/N with r = 1 and w = min(exp(old − infer), 1.2).
    let infer = [[-1.0, -1.3, -0.9, -1.0], [-1.5, -1.0, -1.0, NAN]];
    let logp = [[-1.0; T], [-1.0, -1.0, -1.0, 0.0]];
    let cfg = ObjectiveConfig {
        train_infer_correction: Some(TrainInferCorrection {
            is_weight: Some(IsWeightConfig {
                level: CorrectionLevel::Token,
                upper_bound: 1.2,
            }),
            filters: Vec::new(),
        }),
        ..token_mean(ppo(None))
    };
    let g = grad_of(logp, |x, d| {
        let inputs =
            PolicyInputs::new(x.clone(), x, t(d, ADV), mask(d)).with_infer_logp(t(d, infer));
        policy_objective(&cfg, inputs, &Denominators::local())
            .unwrap()
            .loss
    });
    let a = [2.0, 2.0, -1.0, -1.0, -1.0, -1.0, 3.0];
    let mut want: Vec<f32> = (0..7)
        .map(|i| {
            let w = (logp[i / T][i % T] - infer[i / T][i % T]).exp().min(1.2);
            -w * a[i] / N
        })
        .collect();
    want.push(0.0);
    assert_close(&g, &want);
}

#[test]
fn sample_weights_scale_the_gradient() {
    let d = dev();
    let x = t(&d, logp_for([[1.0; T]; B])).require_grad();
    let adv = [[1.0; T], [1.0, 1.0, 1.0, NAN]];
    let cfg = ObjectiveConfig {
        loss_aggregation: LossAggregation::SeqMeanTokenMean {},
        ..token_mean(PolicyLoss::Vanilla {})
    };
    let inputs = PolicyInputs::new(x.clone(), t(&d, OLD), t(&d, adv), mask(&d))
        .with_sample_weights(Tensor::from_floats([2.0, 0.5], &d));
    let out = policy_objective(&cfg, inputs, &Denominators::local()).unwrap();
    let g: Vec<f32> = x
        .grad(&out.loss.backward())
        .unwrap()
        .into_data()
        .try_into_vec()
        .unwrap();
    // ∂/∂logp_bt of −Σ_b w_b·mean_t(logp_bt)/S with S = 2: −w_b/(n_b·2).
    let (a, b) = (-2.0 / 8.0, -0.5 / 6.0);
    assert_close(&g, &[a, a, a, a, b, b, b, 0.0]);
}

#[test]
fn critic_gradient_and_value_clip() {
    // ∂/∂v of 0.5·(v − R)² / N is (v − R)/N; the clipped branch (token 1) gives 0.
    let d = dev();
    let v = Tensor::<2>::from_floats([[1.0, 2.0], [0.0, 3.0]], &d).require_grad();
    let old = Tensor::<2>::from_floats([[0.9, 1.0], [0.5, 9.0]], &d);
    let ret = Tensor::<2>::from_floats([[2.0, 2.5], [-1.0, NAN]], &d);
    let m = Tensor::<2, Bool>::from_bool([[true, true], [true, false]], &d);
    for (clip, want) in [
        (None, [-1.0 / 3.0, -0.5 / 3.0, 1.0 / 3.0, 0.0]),
        (Some(0.5), [-1.0 / 3.0, 0.0, 1.0 / 3.0, 0.0]),
    ] {
        let out = critic_loss(
            v.clone(),
            old.clone(),
            ret.clone(),
            m.clone(),
            &ValueLossConfig { clip },
            LossAggregation::TokenMean {},
            &Denominators::local(),
        )
        .unwrap();
        let g: Vec<f32> = v
            .grad(&out.loss.backward())
            .unwrap()
            .into_data()
            .try_into_vec()
            .unwrap();
        assert_close(&g, &want);
    }
}
