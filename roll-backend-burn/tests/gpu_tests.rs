//! The GPU path end to end on the machine's Vulkan adapter (lavapipe in CI; `.ci/gpu`): a
//! trainer step — forward, backward, global clip and the fused AdamW kernel — on the wgpu device
//! leaves the parameters where the same step on the CPU does (with one trainer, with two
//! data-parallel replicas on the device, with two tensor-parallel ranks training block by block
//! — a dense model, and a mixture of experts with two whole experts per rank — with two
//! pipeline stages on Burn's autodiff path, with two stages of two tensor-parallel ranks
//! each, and with two pipelines of two stages dividing each stage's experts), and the engine's
//! device decoder
//! generates the CPU decoder's greedy and seeded sampled tokens on the device, on both fixtures
//! (and the oracle's on a mixture of experts).
#![cfg(feature = "wgpu")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::params;

use burn::module::Module;
use roll_backend_burn::engine::{DecoderKind, Engine, EngineConfig};
use roll_backend_burn::gpu::vulkan_device;
use roll_backend_burn::train::{DataParallel, TrainStepReport, Trainer, TrainerConfig};
use roll_backend_burn::{
    CausalLm, Device, DeviceSpec, ExpertSplit, load_model, tensor_pipeline_groups,
};
use roll_core::policy::{Generation, GenerationRequest, Objective, SamplingParams};
use roll_core::strategy::{LocalGroup, Messenger, Strategy};
use roll_core::{SampleId, TrainBatch, TrainSequence};
use std::sync::Arc;

fn gpu() -> Device {
    vulkan_device(0).expect("a Vulkan adapter (lavapipe: apt-get install mesa-vulkan-drivers)")
}

/// Three sequences with advantages of both signs, some tokens untrained.
fn batch() -> TrainBatch {
    let seqs = (0..3u32)
        .map(|i| {
            let response_ids: Vec<u32> = (0..6).map(|t| 20 + (i * 7 + t * 3) % 40).collect();
            let r = response_ids.len();
            TrainSequence {
                sample: SampleId(u64::from(i)),
                prompt_ids: vec![5 + i, 9, 13],
                response_ids,
                loss_mask: (0..r).map(|t| t != 2).collect(),
                old_logprobs: vec![-2.0; r],
                rollout_logprobs: vec![-2.0; r],
                ref_logprobs: None,
                advantages: (0..r)
                    .map(|t| {
                        if (t + i as usize).is_multiple_of(2) {
                            1.0
                        } else {
                            -0.5
                        }
                    })
                    .collect(),
                returns: None,
                old_values: None,
                weight: 1.0,
                score: 0.0,
            }
        })
        .collect();
    TrainBatch::new(seqs).unwrap()
}

#[test]
fn a_trainer_step_on_the_gpu_matches_the_same_step_on_the_cpu() {
    let config = TrainerConfig {
        lr: 1e-3,
        weight_decay: 0.01,
        // The key projection's bias has a true gradient of 0 (a shift of every score of a
        // query), so its computed gradient is rounding noise, different on each device; with
        // ε = 1e-8 Adam scales that noise up to a full `lr` step of random sign. A larger ε keeps
        // such steps as small as their gradients, and the comparison about the arithmetic.
        eps: 1e-6,
        // Low enough that the clip acts: the coefficient enters the fused AdamW kernel.
        max_grad_norm: Some(0.01),
        ..TrainerConfig::default()
    };
    // One trainer, or data-parallel replicas on the same devices (their gradients summed
    // through the host).
    let step_on = |devices: &[DeviceSpec]| {
        let model = load_model(support::fixture("tiny-qwen2-sft"), &Device::flex()).unwrap();
        let mut group = DataParallel::new(devices, |device| {
            Trainer::new(model.clone().to_device(&device), config.clone(), &device)
        })
        .unwrap();
        let mut reports = Vec::new();
        for _ in 0..2 {
            reports.push(group.step(&batch(), &Objective::default()).unwrap());
        }
        (params(group.first().training_model().unwrap()), reports)
    };
    let (on_cpu, cpu_reports) = step_on(&[DeviceSpec::Cpu]);
    let gpu = DeviceSpec::Vulkan(0);
    for replicas in [1, 2] {
        let (on_gpu, gpu_reports) = step_on(&vec![gpu; replicas]);
        assert_close(&on_cpu, &cpu_reports, &on_gpu, &gpu_reports);
    }
}

/// Two steps of `model` in one trainer on the CPU, and over `ranks` ranks on the GPU each
/// holding `part_of` it: the GPU's gathered weights and norms within 1e-4 of the CPU's. Where
/// `part_of` also gives a data-parallel group (ranks holding different tokens: experts divided
/// among pipelines), each rank trains in it on its rank's contiguous share of the batch.
fn parts_on_the_gpu_train_as_the_whole_model_on_the_cpu(
    model: CausalLm,
    ranks: usize,
    part_of: impl Fn(CausalLm, Arc<dyn Messenger>) -> (CausalLm, Option<Arc<dyn Strategy>>) + Sync,
) {
    let config = TrainerConfig {
        lr: 1e-3,
        eps: 1e-6,
        max_grad_norm: Some(0.01),
        ..TrainerConfig::default()
    };
    let mut whole = Trainer::new(model.clone(), config.clone(), &Device::flex()).unwrap();
    let cpu_reports: Vec<_> = (0..2)
        .map(|_| whole.step(&batch(), &Objective::default()).unwrap())
        .collect();
    let on_cpu = params(&whole.inference_model().unwrap());
    let ranks = LocalGroup::replicas(vec![DeviceSpec::Vulkan(0); ranks]).unwrap();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|rank| {
                let (model, config, part_of) = (model.clone(), config.clone(), &part_of);
                let group: Arc<dyn Messenger> = Arc::new(rank.clone());
                s.spawn(move || {
                    let device = gpu();
                    let (part, data) = part_of(model, group);
                    let mut trainer =
                        Trainer::new(part.to_device(&device), config, &device).unwrap();
                    let mut mine = batch();
                    if let Some(data) = data {
                        let seqs = mine.sequences();
                        let share = seqs.len().div_ceil(data.world_size());
                        let from = (data.rank() * share).min(seqs.len());
                        let to = (from + share).min(seqs.len());
                        mine = TrainBatch::new(seqs[from..to].to_vec()).unwrap();
                        trainer = trainer.with_strategy(data);
                    }
                    let reports: Vec<_> = (0..2)
                        .map(|_| trainer.step(&mine, &Objective::default()).unwrap())
                        .collect();
                    (params(&trainer.whole_model().unwrap()), reports)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (on_gpu, gpu_reports) in &results {
        assert_close(&on_cpu, &cpu_reports, on_gpu, gpu_reports);
    }
}

#[test]
fn tensor_and_pipeline_parallel_steps_on_the_gpu_match_the_whole_model_on_the_cpu() {
    let model = load_model(support::fixture("tiny-qwen2-sft"), &Device::flex()).unwrap();
    // Two ranks holding slices of every layer, two pipeline stages, then two stages of two
    // slices each.
    parts_on_the_gpu_train_as_the_whole_model_on_the_cpu(model.clone(), 2, |m, group| {
        (m.shard_tensors(group, ExpertSplit::Sliced).unwrap(), None)
    });
    parts_on_the_gpu_train_as_the_whole_model_on_the_cpu(model.clone(), 2, |m, link| {
        (m.split_stages(link).unwrap(), None)
    });
    parts_on_the_gpu_train_as_the_whole_model_on_the_cpu(model, 4, |m, copy| {
        let (slices, link) = tensor_pipeline_groups(&copy, 2).unwrap();
        let part = m.split_stages(link).unwrap();
        (
            part.shard_tensors(slices, ExpertSplit::Sliced).unwrap(),
            None,
        )
    });
}

#[test]
fn pipelines_dividing_their_experts_train_on_the_gpu_as_the_whole_model_on_the_cpu() {
    // Two pipelines of two stages (a mixture on each), each on its share of the batch, each
    // stage's four experts divided between the two pipelines' ranks holding it: the stage's
    // ranks exchange tokens through the host while the device trains block by block.
    let config = support::qwen3_moe_config();
    let model = CausalLm::init(&config, &Device::flex()).unwrap();
    let _ = params(&model);
    parts_on_the_gpu_train_as_the_whole_model_on_the_cpu(model, 4, |m, copy| {
        let (stage, link) = tensor_pipeline_groups(&copy, 2).unwrap();
        let data: Arc<dyn Strategy> = stage.clone();
        let part = m.split_stages(link).unwrap().shard_experts(stage).unwrap();
        (part, Some(data))
    });
}

#[test]
fn a_tensor_parallel_mixture_of_experts_trains_on_the_gpu_as_the_whole_model_on_the_cpu() {
    // Each rank holds half of the attention heads and two of the four experts, whole, plus half
    // of the shared expert (`model.expert_parallel = model.tensor_parallel`).
    let mut config = support::qwen3_moe_config();
    config.shared_expert_intermediate_size = Some(32);
    let model = CausalLm::init(&config, &Device::flex()).unwrap();
    let _ = params(&model);
    parts_on_the_gpu_train_as_the_whole_model_on_the_cpu(model, 2, |m, group| {
        (m.shard_tensors(group, ExpertSplit::Whole).unwrap(), None)
    });
}

/// Parameters and gradient norms of the GPU's steps within 1e-4 (relative) of the CPU's.
fn assert_close(
    on_cpu: &std::collections::BTreeMap<String, Vec<f32>>,
    cpu_reports: &[TrainStepReport],
    on_gpu: &std::collections::BTreeMap<String, Vec<f32>>,
    gpu_reports: &[TrainStepReport],
) {
    for (c, g) in cpu_reports.iter().zip(gpu_reports) {
        let (c, g) = (c.grad_norm, g.grad_norm);
        assert!(c > 0.01, "the clip must act: norm {c}");
        assert!(
            (c - g).abs() <= 1e-4 * c,
            "grad norm {g} on the GPU, {c} on the CPU"
        );
    }
    assert_eq!(
        on_cpu.keys().collect::<Vec<_>>(),
        on_gpu.keys().collect::<Vec<_>>()
    );
    let mut moved = 0;
    for (name, cpu) in on_cpu {
        let gpu = &on_gpu[name];
        let worst = cpu
            .iter()
            .zip(gpu)
            .map(|(c, g)| (c - g).abs() / c.abs().max(1e-2))
            .fold(0.0f32, f32::max);
        assert!(worst <= 1e-4, "{name}: relative difference {worst}");
        moved += usize::from(cpu.iter().any(|x| x.is_finite()));
    }
    assert!(moved > 10, "{moved} parameter tensors compared");
}

/// Generations of `prompts` side by side on `kind` over `model` on `device`, request `i` with
/// `params(i)`.
fn generate(
    kind: DecoderKind,
    model: &CausalLm,
    device: &Device,
    prompts: &[Vec<u32>],
    params: impl Fn(usize) -> SamplingParams,
) -> Vec<Generation> {
    let engine = Engine::with_decoder(kind, model, device, EngineConfig::default(), None).unwrap();
    let handles: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            engine
                .submit(GenerationRequest::new(p.clone(), params(i)))
                .unwrap()
        })
        .collect();
    handles.into_iter().map(|h| h.wait().unwrap()).collect()
}

/// Greedy generations (see [`generate`]).
fn greedy(
    kind: DecoderKind,
    model: &CausalLm,
    device: &Device,
    prompts: &[Vec<u32>],
    max_new_tokens: u32,
) -> Vec<Generation> {
    let params = SamplingParams {
        temperature: 0.0,
        max_new_tokens,
        ..SamplingParams::default()
    };
    generate(kind, model, device, prompts, |_| params.clone())
}

/// Same tokens, and log-probs within 1e-4.
fn assert_same(want: &[Generation], got: &[Generation], what: &str) {
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        assert_eq!(g.token_ids, w.token_ids, "{what}, request {i}");
        let gap = w
            .logprobs
            .iter()
            .zip(&g.logprobs)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(gap <= 1e-4, "{what}, request {i}: log-prob gap {gap}");
    }
}

/// The device decoder — paged cache on the GPU, roll's kernels, prompts and decodes of several
/// requests side by side, past several cache blocks — generates the CPU decoder's greedy tokens.
#[test]
fn the_engine_generates_the_cpu_decoders_greedy_tokens_on_the_gpu() {
    let prompts = vec![vec![11u32, 12, 13, 14], (1..=21).collect(), vec![40]];
    for fixture in ["tiny-qwen2", "tiny-qwen2-sft"] {
        let cpu = Device::flex();
        let on_cpu = load_model(support::fixture(fixture), &cpu).unwrap();
        let on_gpu = load_model(support::fixture(fixture), &gpu()).unwrap();
        assert_eq!(DecoderKind::auto(&on_gpu, &gpu()), DecoderKind::Device);
        let want = greedy(DecoderKind::Cpu, &on_cpu, &cpu, &prompts, 24);
        let got = greedy(DecoderKind::Device, &on_gpu, &gpu(), &prompts, 24);
        assert_same(&want, &got, fixture);
    }
}

/// Qwen3-MoE (QK-norm, routed experts beside a dense layer) on the GPU against the recomputing
/// oracle on the CPU.
#[test]
fn a_mixture_of_experts_decodes_on_the_gpu_as_the_oracle_does() {
    let mut c = support::qwen3_moe_config();
    c.mlp_only_layers = Some(vec![0]);
    let cpu = Device::flex();
    let model = CausalLm::init(&c, &cpu).unwrap();
    let prompts = vec![vec![3u32, 14, 15], (30..50).collect()];
    let want = greedy(DecoderKind::Burn, &model, &cpu, &prompts, 10);
    let on_gpu = model.to_device(&gpu());
    let got = greedy(DecoderKind::Device, &on_gpu, &gpu(), &prompts, 10);
    assert_same(&want, &got, "qwen3-moe");
}

/// Seeded sampling — plain, tempered, top-k, top-p — draws the CPU engine's tokens on the GPU,
/// where the sampling kernel picks them from logits that never leave the device.
#[test]
fn seeded_sampling_on_the_gpu_draws_the_cpu_engines_tokens() {
    let prompts: Vec<Vec<u32>> = (0..4u32).map(|i| vec![11 + i, 12, 13, 14]).collect();
    let params = |i: usize| SamplingParams {
        temperature: [1.0, 0.8, 1.0, 1.2][i],
        top_k: [None, None, Some(20), Some(50)][i],
        top_p: [1.0, 1.0, 1.0, 0.9][i],
        max_new_tokens: 16,
        seed: Some(100 + i as u64),
        ..SamplingParams::default()
    };
    for fixture in ["tiny-qwen2", "tiny-qwen2-sft"] {
        let cpu = Device::flex();
        let on_cpu = load_model(support::fixture(fixture), &cpu).unwrap();
        let on_gpu = load_model(support::fixture(fixture), &gpu()).unwrap();
        let want = generate(DecoderKind::Cpu, &on_cpu, &cpu, &prompts, params);
        let got = generate(DecoderKind::Device, &on_gpu, &gpu(), &prompts, params);
        assert_same(&want, &got, fixture);
    }
}
