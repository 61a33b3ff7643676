//! Benchmarks of the orchestration around the model: building a train batch from rewarded groups
//! (masks, shaping, GRPO advantages) and the scheduler's per-sample overhead with a mock policy.
//!
//! `cargo bench --bench core`

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use roll::algos::AlgorithmConfig;
use roll::algos::shaping::DomainMoments;
use roll::core::pipeline::{BatchInputs, build_train_batch};
use roll::core::scheduler::{RlvrScheduler, RlvrSchedulerConfig};
use roll::core::testing::{ByteTokenizer, ConstantReward, MockPolicy};
use roll::core::{FinishReason, GroupId, SampleId};
use roll::prelude::*;
use std::sync::Arc;

fn groups(n_groups: usize, group_size: usize, len: usize) -> Vec<Group> {
    (0..n_groups)
        .map(|g| {
            let prompt = Arc::new(Prompt::new(PromptId(g as u64), "q", "math"));
            let samples = (0..group_size)
                .map(|i| {
                    let mut s = Sample::new(
                        SampleId((g * group_size + i) as u64),
                        GroupId(g as u64),
                        prompt.clone(),
                        vec![1; 32],
                    );
                    let ids: Vec<u32> = (0..len as u32).collect();
                    let lp = vec![-1.0; len];
                    s.push_turn(&ids, &lp, "", WeightVersion(0), FinishReason::Stop)
                        .expect("aligned");
                    s.reward = Some(Reward::new((i % 2) as f32));
                    s
                })
                .collect();
            Group::new(GroupId(g as u64), prompt, samples).expect("valid group")
        })
        .collect()
}

fn batch_builder(c: &mut Criterion) {
    let mut group = c.benchmark_group("build_train_batch");
    for &len in &[64usize, 512] {
        let gs = groups(16, 8, len);
        group.throughput(Throughput::Elements((16 * 8 * len) as u64));
        group.bench_with_input(BenchmarkId::new("grpo_tokens", len), &gs, |b, gs| {
            let algorithm = AlgorithmConfig::default();
            let inputs = BatchInputs {
                max_turn_tokens: len,
                ..Default::default()
            };
            b.iter(|| {
                let mut moments = DomainMoments::new();
                build_train_batch(gs, &algorithm, &inputs, &mut moments).expect("batch")
            });
        });
    }
    group.finish();
}

fn scheduler_overhead(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("rlvr_scheduler");
    let (prompts_per_step, group_size) = (8usize, 8usize);
    group.throughput(Throughput::Elements((prompts_per_step * group_size) as u64));
    group.bench_function("next_batch_mock_policy_64_samples", |b| {
        let policy: Arc<dyn Policy> = Arc::new(MockPolicy::digits());
        let prompts = (0..).map(|i| Prompt::new(PromptId(i), "q", "d"));
        let mut scheduler = RlvrScheduler::new(
            RlvrSchedulerConfig {
                prompts_per_step,
                group_size,
                sampling: SamplingParams {
                    max_new_tokens: 8,
                    ..Default::default()
                },
                ..Default::default()
            },
            policy,
            Arc::new(ByteTokenizer),
            Arc::new(ConstantReward(1.0)),
            prompts,
        )
        .expect("scheduler");
        b.iter(|| {
            runtime
                .block_on(scheduler.next_batch(WeightVersion(0)))
                .expect("batch")
        });
    });
    group.finish();
}

criterion_group!(benches, batch_builder, scheduler_overhead);
criterion_main!(benches);
