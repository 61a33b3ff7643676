//! Property tests of the slice-level advantage and shaping code: group-normalised advantages sum to
//! zero, whitened values have zero mean and unit variance, and masked positions never influence
//! unmasked outputs.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use roll_algos::advantage::{
    AdvantageEstimator, AdvantageInput, EpisodeNormalization, NormScope, StepInfo,
    StepNormalization, agentic_reinforce_returns, gae, grpo_advantages, reinforce_pp_advantages,
    reinforce_returns, rloo_advantages,
};
use roll_algos::masks::{SampleWeightConfig, renormalize_weights};
use roll_algos::shaping::{
    AdvantageShaping, NormKind, RewardNormalization, RunningMoments, masked_whiten,
    normalize_by_key, normalize_rewards,
};

fn config() -> ProptestConfig {
    ProptestConfig::with_cases(64)
}

/// Rewards of `groups` groups of `n`, either 0/1 (verifier-like) or continuous.
fn grouped_rewards() -> impl Strategy<Value = (usize, Vec<f32>)> {
    (2usize..8, 1usize..4, any::<bool>()).prop_flat_map(|(n, groups, binary)| {
        let value = if binary {
            prop_oneof![Just(0.0f32), Just(1.0f32)].boxed()
        } else {
            (-10.0f32..10.0).boxed()
        };
        (Just(n), prop::collection::vec(value, n * groups))
    })
}

/// A padded batch: `(rows, seq_len, mask, token values, perturbed token values)` where the
/// perturbed copy differs from the original only at masked-off positions (possibly by NaN).
fn padded_batch(rows: usize) -> impl Strategy<Value = (usize, Vec<bool>, Vec<f32>, Vec<f32>)> {
    (1usize..8).prop_flat_map(move |t| {
        let n = rows * t;
        (
            Just(t),
            prop::collection::vec(any::<bool>(), n),
            prop::collection::vec(-5.0f32..5.0, n),
            prop::collection::vec(prop_oneof![4 => -1e3f32..1e3, 1 => Just(f32::NAN)], n),
        )
    })
}

/// `x` with its masked-off entries replaced by the entries of `junk`.
fn perturb(x: &[f32], mask: &[bool], junk: &[f32]) -> Vec<f32> {
    x.iter()
        .zip(mask)
        .zip(junk)
        .map(|((x, m), j)| if *m { *x } else { *j })
        .collect()
}

/// Asserts equality at valid positions (bit for bit) and zeros at masked ones when `zeros`.
fn same_where_valid(a: &[f32], b: &[f32], mask: &[bool], zeros: bool) -> Result<(), TestCaseError> {
    prop_assert_eq!(a.len(), b.len());
    for ((x, y), m) in a.iter().zip(b).zip(mask) {
        if *m {
            prop_assert_eq!(x.to_bits(), y.to_bits(), "{:?} vs {:?}", a, b);
        } else if zeros {
            prop_assert_eq!(*x, 0.0);
            prop_assert_eq!(*y, 0.0);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn group_normalised_advantages_sum_to_zero((n, rewards) in grouped_rewards(), std in any::<bool>()) {
        let grpo = grpo_advantages(&rewards, n, std).unwrap();
        let rloo = rloo_advantages(&rewards, n).unwrap();
        let mut shaped = rewards.clone();
        let norm = RewardNormalization {
            mean: NormKind::Group,
            std: if std { NormKind::Group } else { NormKind::None },
        };
        normalize_rewards(&mut shaped, n, norm, &mut RunningMoments::new()).unwrap();
        for a in [&grpo, &rloo, &shaped] {
            for group in a.chunks(n) {
                let sum: f32 = group.iter().sum();
                prop_assert!(sum.abs() < 1e-3, "group {:?} sums to {}", group, sum);
            }
        }
        prop_assert_eq!(&grpo, &shaped);
        let batch: f32 = reinforce_pp_advantages(&rewards).iter().sum();
        prop_assert!(batch.abs() < 1e-3);
    }

    #[test]
    fn std_normalised_groups_have_unit_variance((n, rewards) in grouped_rewards()) {
        let a = grpo_advantages(&rewards, n, true).unwrap();
        for (group, raw) in a.chunks(n).zip(rewards.chunks(n)) {
            let raw: Vec<f64> = raw.iter().map(|r| f64::from(*r)).collect();
            let mean = raw.iter().sum::<f64>() / n as f64;
            let std = (raw.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt();
            let var = group.iter().map(|x| x * x).sum::<f32>() / (n - 1) as f32;
            if std > 0.01 {
                // (σ / (σ + 1e-6))² is within 2e-4 of 1 for σ > 0.01.
                prop_assert!((var - 1.0).abs() < 1e-3, "variance {} of {:?}", var, group);
            } else if std == 0.0 {
                prop_assert!(group.iter().all(|x| *x == 0.0), "{:?}", group);
            }
        }
    }

    #[test]
    fn whitened_values_have_zero_mean_and_unit_variance(
        (values, mask) in (2usize..64).prop_flat_map(|n| (
            prop::collection::vec(-100.0f32..100.0, n),
            prop::collection::vec(any::<bool>(), n),
        ))
    ) {
        let valid: Vec<f64> = values.iter().zip(&mask).filter(|(_, m)| **m).map(|(x, _)| f64::from(*x)).collect();
        prop_assume!(valid.len() >= 2);
        let mean = valid.iter().sum::<f64>() / valid.len() as f64;
        let var = valid.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (valid.len() - 1) as f64;
        prop_assume!(var > 1e-3);

        let mut w = values.clone();
        masked_whiten(&mut w, &mask).unwrap();
        let out: Vec<f64> = w.iter().zip(&mask).filter(|(_, m)| **m).map(|(x, _)| f64::from(*x)).collect();
        let k = out.len() as f64;
        let out_mean = out.iter().sum::<f64>() / k;
        let out_var = out.iter().map(|x| (x - out_mean).powi(2)).sum::<f64>() / (k - 1.0);
        prop_assert!(out_mean.abs() < 1e-4, "mean {}", out_mean);
        prop_assert!((out_var - 1.0).abs() < 1e-3, "variance {}", out_var);
        for ((a, b), m) in w.iter().zip(&values).zip(&mask) {
            if !m {
                prop_assert_eq!(a.to_bits(), b.to_bits());
            }
        }
    }

    #[test]
    fn masked_positions_never_influence_token_functions(
        (t, mask, rewards, junk) in padded_batch(1),
        values in prop::collection::vec(-5.0f32..5.0, 8),
        gamma in 0.0f32..=1.0,
        lambda in 0.0f32..=1.0,
    ) {
        let values = &values[..t];
        let rewards_p = perturb(&rewards, &mask, &junk);
        let values_p = perturb(values, &mask, &junk);

        let a = gae(&rewards, values, &mask, gamma, lambda).unwrap();
        let b = gae(&rewards_p, &values_p, &mask, gamma, lambda).unwrap();
        same_where_valid(&a.advantages, &b.advantages, &mask, true)?;
        same_where_valid(&a.returns, &b.returns, &mask, true)?;

        let a = reinforce_returns(&rewards, &mask, gamma).unwrap();
        let b = reinforce_returns(&rewards_p, &mask, gamma).unwrap();
        same_where_valid(&a, &b, &mask, true)?;
        // REINFORCE is GAE with V = 0 and λ = 1.
        let g = gae(&rewards, &vec![0.0; t], &mask, gamma, 1.0).unwrap();
        same_where_valid(&a, &g.advantages, &mask, true)?;

        let a = agentic_reinforce_returns(&rewards, &mask, gamma).unwrap();
        let b = agentic_reinforce_returns(&rewards_p, &mask, gamma).unwrap();
        same_where_valid(&a, &b, &mask, true)?;

        let mut a = rewards.clone();
        let mut b = rewards_p.clone();
        masked_whiten(&mut a, &mask).unwrap();
        masked_whiten(&mut b, &mask).unwrap();
        same_where_valid(&a, &b, &mask, false)?;
    }

    #[test]
    fn masked_positions_never_influence_estimators(
        (group_size, groups) in (1usize..4, 1usize..4),
        seed in prop::collection::vec(-1.0f32..1.0, 16),
        ids in prop::collection::vec((0u64..2, 0u32..3, 0u64..3), 16),
        batch in (1usize..8).prop_flat_map(|t| (
            Just(t),
            prop::collection::vec(any::<bool>(), 16 * t),
            prop::collection::vec(-1.0f32..1.0, 16 * t),
            prop::collection::vec(-5.0f32..5.0, 16 * t),
            prop::collection::vec(prop_oneof![4 => -1e3f32..1e3, 1 => Just(f32::NAN)], 16 * t),
        )),
        shaping in (any::<bool>(), any::<bool>(), prop::option::of(0.5f32..3.0)),
    ) {
        let rows = group_size * groups;
        let (t, mask, token_rewards, values, junk) = batch;
        let n = rows * t;
        let (mask, token_rewards, values, junk) = (&mask[..n], &token_rewards[..n], &values[..n], &junk[..n]);
        let rewards = &seed[..rows];
        let steps: Vec<StepInfo> = ids[..rows]
            .iter()
            .enumerate()
            .map(|(i, (episode, step, state))| StepInfo {
                group: (i / group_size) as u64,
                episode: *episode,
                step: *step,
                state: *state,
                tag: (i % 2) as u64,
            })
            .collect();
        let shaping = AdvantageShaping { whiten_rewards: shaping.0, whiten_advantages: shaping.1, clip: shaping.2 };
        let token_rewards_p = perturb(token_rewards, mask, junk);
        let values_p = perturb(values, mask, junk);

        let estimators = [
            AdvantageEstimator::Gae { gamma: 0.99, lambda: 0.95 },
            AdvantageEstimator::Reinforce { gamma: 0.9 },
            AdvantageEstimator::Grpo { gamma: 1.0, std_normalize: true },
            AdvantageEstimator::Grpo { gamma: 1.0, std_normalize: false },
            AdvantageEstimator::ReinforcePlusPlus { gamma: 1.0 },
            AdvantageEstimator::Rloo { gamma: 1.0 },
            AdvantageEstimator::RaftPlusPlus { gamma: 1.0 },
            AdvantageEstimator::Gigpo {
                gamma: 1.0,
                episode_weight: 1.0,
                step_weight: 0.5,
                step_reward_gamma: 0.95,
                episode_normalization: EpisodeNormalization::group(),
                step_std_normalize: true,
            },
            AdvantageEstimator::StepReinforce {
                gamma: 1.0,
                step_reward_gamma: 0.9,
                normalization: StepNormalization { mean: NormScope::State, std: NormScope::Tag },
            },
            AdvantageEstimator::AgenticReinforce { gamma: 0.9 },
        ];
        for e in &estimators {
            let input = AdvantageInput::new(rewards, mask, t)
                .with_group_size(group_size)
                .with_steps(&steps);
            let a = e
                .compute(&input.with_token_rewards(token_rewards).with_values(values), &shaping)
                .unwrap();
            let b = e
                .compute(&input.with_token_rewards(&token_rewards_p).with_values(&values_p), &shaping)
                .unwrap();
            same_where_valid(&a.advantages, &b.advantages, mask, true)?;
            same_where_valid(&a.returns, &b.returns, mask, true)?;
            prop_assert!(a.advantages.iter().all(|x| x.is_finite()));
            if let Some(c) = shaping.clip {
                prop_assert!(a.advantages.iter().all(|x| x.abs() <= c));
            }
        }
    }

    #[test]
    fn keyed_normalisation_ignores_the_order_of_samples(
        (rewards, keys, rotation) in (1usize..24).prop_flat_map(|n| (
            prop::collection::vec(-3.0f32..3.0, n),
            prop::collection::vec(0u8..4, n),
            0..n,
        )),
    ) {
        // A group is every sample with an equal key, wherever it sits: rotating the batch rotates
        // the result, and each key's normalised rewards sum to zero (or are all zero).
        let norm = RewardNormalization { mean: NormKind::Group, std: NormKind::Group };
        let mut a = rewards.clone();
        normalize_by_key(&mut a, &keys, norm, &mut RunningMoments::new()).unwrap();
        let (mut b, mut kb) = (rewards.clone(), keys.clone());
        b.rotate_left(rotation);
        kb.rotate_left(rotation);
        normalize_by_key(&mut b, &kb, norm, &mut RunningMoments::new()).unwrap();
        b.rotate_right(rotation);
        for (x, y) in a.iter().zip(&b) {
            prop_assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
        for key in 0u8..4 {
            let sum: f32 = a.iter().zip(&keys).filter(|(_, k)| **k == key).map(|(x, _)| x).sum();
            prop_assert!(sum.abs() < 1e-3, "key {key}: {a:?}");
        }
    }

    #[test]
    fn sample_weights_sum_to_batch_size(
        (difficulty, lengths) in (1usize..32).prop_flat_map(|n| (
            prop::collection::vec(-0.5f32..1.5, n),
            prop::collection::vec(0usize..4096, n),
        )),
        flags in (any::<bool>(), any::<bool>()),
    ) {
        let config = SampleWeightConfig { difficulty: flags.0, length: flags.1 };
        let w = config.sample_weights(&difficulty, &lengths).unwrap();
        let sum: f32 = w.iter().sum();
        prop_assert!((sum - lengths.len() as f32).abs() < 1e-3 * lengths.len() as f32);
        prop_assert!(w.iter().all(|x| *x > 0.0));
        let mut again = w.clone();
        renormalize_weights(&mut again);
        for (a, b) in again.iter().zip(&w) {
            prop_assert!((a - b).abs() < 1e-5);
        }
    }
}
