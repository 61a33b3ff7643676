//! Expert parallelism of Qwen3-MoE on threads: each rank holds a block of every mixture's
//! experts, runs the forward of its own batch, and gets the logits of the whole model. (The same
//! code runs across processes in `tests/mpi.rs` at the workspace root.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use burn::module::Module;
use roll_backend_burn::engine::{Engine, EngineConfig};
use roll_backend_burn::train::{Trainer, TrainerConfig};
use roll_backend_burn::{
    CausalLm, Device, PaddingSide, SaveOptions, TokenBatch, load_model, save_model,
};
use roll_core::strategy::{DeviceSpec, LocalGroup, Strategy};
use std::sync::Arc;
use support::{fixture, qwen3_moe_config};

/// Rank `rank`'s batch: its own sequences, lengths and padding.
fn batch(rank: usize, vocab: usize) -> TokenBatch {
    let seqs: Vec<Vec<u32>> = (0..=rank)
        .map(|s| {
            (0..3 + 2 * rank + s)
                .map(|t| ((t * 31 + s * 7 + rank * 13 + 1) % vocab) as u32)
                .collect()
        })
        .collect();
    TokenBatch::new(&seqs, PaddingSide::Right, 0, vocab, &Device::flex()).unwrap()
}

fn values(t: burn::tensor::Tensor<3>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_into_vec().unwrap()
}

#[test]
fn expert_parallel_forward_equals_the_whole_model_on_every_rank() {
    let model = CausalLm::init(&qwen3_moe_config(), &Device::flex()).unwrap();
    let vocab = model.vocab_size();
    // 4 experts over 2 ranks (2 + 2) and over 3 ranks (1 + 1 + 2).
    for ranks in [2usize, 3] {
        let group = LocalGroup::replicas(vec![DeviceSpec::Cpu; ranks]).unwrap();
        let results: Vec<(f32, usize, usize)> = std::thread::scope(|s| {
            let handles: Vec<_> = group
                .iter()
                .map(|replica| {
                    let model = &model;
                    s.spawn(move || {
                        let rank = replica.rank();
                        let want = values(model.forward(&batch(rank, vocab)));
                        let strategy: Arc<dyn Strategy> = Arc::new(replica.clone());
                        let shard = model.clone().shard_experts(strategy).unwrap();
                        assert!(shard.is_expert_sharded() && !model.is_expert_sharded());
                        let got = values(shard.forward(&batch(rank, vocab)));
                        // `f32::max` passes NaN over: finite logits make `worst` mean something.
                        assert!(got.iter().all(|v| v.is_finite()), "rank {rank}: non-finite");
                        let worst = want
                            .iter()
                            .zip(&got)
                            .map(|(a, b)| (a - b).abs())
                            .fold(0.0, f32::max);
                        (worst, shard.num_params(), got.len())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, &(worst, params, len)) in results.iter().enumerate() {
            assert!(len > 0);
            assert!(
                worst <= 1e-5,
                "{ranks} ranks, rank {rank}: logits differ by {worst}"
            );
            assert!(
                params < model.num_params(),
                "rank {rank} holds fewer parameters"
            );
        }
    }
}

#[test]
fn an_expert_parallel_model_scores_only() {
    let model = CausalLm::init(&qwen3_moe_config(), &Device::flex()).unwrap();
    let group = LocalGroup::replicas(vec![DeviceSpec::Cpu]).unwrap();
    let strategy: Arc<dyn Strategy> = Arc::new(group[0].clone());
    let shard = model.clone().shard_experts(strategy.clone()).unwrap();
    let device = Device::flex();
    let refusals = [
        Trainer::new(shard.clone(), TrainerConfig::default(), &device)
            .err()
            .map(|e| e.to_string()),
        Engine::for_model(&shard, &device, EngineConfig::default(), None)
            .err()
            .map(|e| e.to_string()),
        save_model(
            &shard,
            std::env::temp_dir().join("roll-ep-refused"),
            &SaveOptions::default(),
        )
        .err()
        .map(|e| e.to_string()),
    ];
    for (what, err) in ["train", "serve an inference engine", "be saved"]
        .iter()
        .zip(refusals)
    {
        let err = err.unwrap_or_else(|| panic!("a sharded model was allowed to {what}"));
        assert!(
            err.contains("expert-parallel") && err.contains(what),
            "{err}"
        );
    }
    // A dense model has no experts to share, and each rank needs one.
    let dense = load_model(fixture("tiny-qwen2"), &device).unwrap();
    let err = dense.shard_experts(strategy).unwrap_err().to_string();
    assert!(err.contains("mixture of experts"), "{err}");
    let five = LocalGroup::replicas(vec![DeviceSpec::Cpu; 5]).unwrap();
    let err = model
        .shard_experts(Arc::new(five[0].clone()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("5 expert-parallel ranks for 4 experts"),
        "{err}"
    );
}
