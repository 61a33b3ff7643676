//! Domains resolved once: prompts of two dataset tags of one domain are normalised together by
//! the batch builder, because it buckets by the resolved `prompt.domain`, never by the tag.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use roll_algos::AlgorithmConfig;
use roll_algos::advantage::AdvantageEstimator;
use roll_algos::shaping::{DomainMoments, NormKind};
use roll_core::config::{ComponentSpec, DomainConfig, DomainMap};
use roll_core::pipeline::{BatchInputs, build_train_batch};
use roll_core::{
    FinishReason, Group, GroupId, Prompt, PromptId, Reward, Sample, SampleId, WeightVersion,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// `[domains.math]` claiming the tags `a` and `b`.
fn config() -> BTreeMap<String, DomainConfig> {
    let mut math = DomainConfig::new(ComponentSpec::new("math_rule"));
    math.tags = vec!["a".into(), "b".into()];
    BTreeMap::from([("math".to_owned(), math)])
}

/// A group of two one-token samples answering `prompt`, both rewarded `reward`.
fn group(id: u64, prompt: Prompt, reward: f32) -> Group {
    let prompt = Arc::new(prompt);
    let samples = (0..2)
        .map(|k| {
            let mut s = Sample::new(SampleId(id * 10 + k), GroupId(id), prompt.clone(), vec![1]);
            s.push_turn(&[7], &[-0.5], "x", WeightVersion(0), FinishReason::Stop)
                .unwrap();
            s.reward = Some(Reward::new(reward));
            s
        })
        .collect();
    Group::new(GroupId(id), prompt, samples).unwrap()
}

/// REINFORCE over batch-mean-centred rewards: each advantage is `r − mean(bucket)`, so the
/// advantages show which samples shared a bucket.
fn algorithm() -> AlgorithmConfig {
    let mut a = AlgorithmConfig {
        advantage: AdvantageEstimator::Reinforce { gamma: 1.0 },
        ..AlgorithmConfig::default()
    };
    a.reward_shaping.normalization.mean = NormKind::Batch;
    a
}

fn advantages(groups: &[Group], moments: &mut DomainMoments) -> Vec<f32> {
    let inputs = BatchInputs {
        max_turn_tokens: 8,
        ..BatchInputs::default()
    };
    let (batch, _) = build_train_batch(groups, &algorithm(), &inputs, moments).unwrap();
    let mut by_sample: Vec<(SampleId, f32)> = batch
        .sequences()
        .iter()
        .map(|s| (s.sample, s.advantages[0]))
        .collect();
    by_sample.sort_by_key(|(id, _)| *id);
    by_sample.into_iter().map(|(_, a)| a).collect()
}

#[test]
fn two_tags_of_one_domain_are_normalised_in_one_bucket() {
    let map = DomainMap::from_config(&config()).unwrap();
    let mut from_a = Prompt::new(PromptId(1), "1+1?", "a");
    let mut from_b = Prompt::new(PromptId(2), "2+2?", "b");
    map.resolve_prompt(&mut from_a).unwrap();
    map.resolve_prompt(&mut from_b).unwrap();
    assert_eq!(
        (from_a.domain.as_str(), from_b.domain.as_str()),
        ("math", "math")
    );

    let groups = [group(1, from_a, 1.0), group(2, from_b, 0.0)];
    let mut moments = DomainMoments::new();
    // One bucket {1, 1, 0, 0}: mean 0.5, so the advantages are ±0.5.
    assert_eq!(
        advantages(&groups, &mut moments),
        vec![0.5, 0.5, -0.5, -0.5]
    );
    let keys: Vec<&str> = moments.iter().map(|(d, _)| d).collect();
    assert_eq!(
        keys,
        vec!["math"],
        "moments are kept per domain, not per tag"
    );
}

/// The control: the same prompts left unresolved (domain = tag) fall into two buckets, each
/// centred on its own mean, and every advantage is 0 — what the old grouping by tag did.
#[test]
fn unresolved_tags_would_be_normalised_apart() {
    let groups = [
        group(1, Prompt::new(PromptId(1), "1+1?", "a"), 1.0),
        group(2, Prompt::new(PromptId(2), "2+2?", "b"), 0.0),
    ];
    let mut moments = DomainMoments::new();
    assert_eq!(advantages(&groups, &mut moments), vec![0.0; 4]);
    assert_eq!(moments.iter().count(), 2);
}
