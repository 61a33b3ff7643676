//! Model parallelism on threads, each rank a thread of a `LocalGroup` (the same code runs across
//! processes in `tests/mpi.rs` at the workspace root):
//! - expert parallelism of Qwen3-MoE: each rank holds a block of every mixture's experts, runs the
//!   forward of its own batch, and gets the logits of the whole model;
//! - tensor parallelism of dense Qwen2/Qwen3: each rank holds a slice of every layer's heads and
//!   MLP; its forward (Burn's and the CPU decoder's) gives the whole model's logits and log-probs,
//!   and a training step on the fused CPU path leaves every rank with its slice of the weights
//!   one whole trainer reaches;
//! - pipeline parallelism: each stage holds a block of the layers, micro-batches run one forward
//!   one backward with the activations and their gradients passed point to point, and every
//!   stage ends a step with its part of the whole trainer's weights;
//! - both: a pipeline of tensor-parallel stages, each rank a slice of a stage's layers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use roll_backend_burn::engine::cpu::CpuDecoder;
use roll_backend_burn::engine::{DecoderKind, Engine, EngineConfig};
use roll_backend_burn::train::{LoraConfig, TrainKernels, TrainStepReport, Trainer, TrainerConfig};
use roll_backend_burn::{
    CausalLm, Device, ExpertSplit, HfConfig, PaddingSide, SaveOptions, TokenBatch, load_model,
    save_model, tensor_pipeline_groups,
};
use roll_core::policy::{Objective, ScoreRequest, ScoreSequence};
use roll_core::rng::SplitMix64;
use roll_core::strategy::{DeviceSpec, LocalGroup, Messenger, Strategy};
use roll_core::{SampleId, TrainBatch, TrainSequence};
use std::collections::HashMap;
use std::sync::Arc;
use support::{fixture, max_abs_diff, on_ranks, qwen3_moe_config};

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
fn an_expert_parallel_model_refuses_lora_the_cpu_decoder_saving_and_a_lone_checkpoint() {
    let model = CausalLm::init(&qwen3_moe_config(), &Device::flex()).unwrap();
    let group = LocalGroup::replicas(vec![DeviceSpec::Cpu]).unwrap();
    let strategy: Arc<dyn Strategy> = Arc::new(group[0].clone());
    let shard = model.clone().shard_experts(strategy.clone()).unwrap();
    let device = Device::flex();
    let refusals = [
        Trainer::new(shard.clone(), lora_config(), &device)
            .err()
            .map(|e| e.to_string()),
        // Its engines step together on the device decoder (`expert_parallel_engine_tests.rs`).
        Engine::with_decoder(
            DecoderKind::Cpu,
            &shard,
            &device,
            EngineConfig::default(),
            None,
        )
        .err()
        .map(|e| e.to_string()),
        save_model(
            &shard,
            std::env::temp_dir().join("roll-ep-refused"),
            &SaveOptions::default(),
        )
        .err()
        .map(|e| e.to_string()),
        // Alone: the ranks of its group write their parts together (`save_part`).
        Trainer::new(shard.clone(), TrainerConfig::default(), &device)
            .unwrap()
            .save_checkpoint(std::env::temp_dir().join("roll-ep-refused"), 0)
            .err()
            .map(|e| e.to_string()),
    ];
    for (what, err) in [
        "trains without LoRA",
        "serve an inference engine",
        "be saved",
        "writes its part",
    ]
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

#[test]
fn expert_parallel_training_steps_equal_the_whole_trainers_steps() {
    // Each rank trains its own shard of every batch with its block of the experts; routed
    // tokens travel to their experts and back, forward and backward. Two ranks (rank 0 one
    // sequence, rank 1 three, one micro-batch each: rank 0 serves its experts through rank 1's
    // extra micro-batches), and four: two copies of the two blocks side by side, one sequence
    // each, the experts' gradients summed over the ranks holding the same block. Against the
    // whole trainer on the whole batch: the gradients after the all-reduce, the reports and
    // the weights after two clipped steps, and the whole model gathered from each copy.
    let model = qwen3_moe();
    let reference = expert_reference(&model);
    let (config, batches) = (&reference.config, &reference.batches);
    for ranks in [2, 4] {
        let per_rank = on_ranks(ranks, |group| {
            let rank = group.rank();
            // Copy `c` is ranks `2c, 2c + 1`; block `b`'s replicas are ranks `b, b + 2`.
            let mut copy = None;
            let mut replicas = None;
            if ranks == 4 {
                for c in [[0, 1], [2, 3]] {
                    copy = copy.or(group.subgroup(&c).unwrap());
                }
                for b in [[0, 2], [1, 3]] {
                    replicas = replicas.or(group.subgroup(&b).unwrap());
                }
            }
            let experts: Arc<dyn Strategy> = copy.unwrap_or_else(|| group.clone());
            let mut part = model.clone().shard_experts(experts).unwrap();
            if let Some(replicas) = replicas {
                part = part.with_expert_replicas(replicas).unwrap();
            }
            let mut trainer = Trainer::new(part, config.clone(), &Device::flex())
                .unwrap()
                .with_strategy(group);
            assert_eq!(trainer.kernels(), TrainKernels::Autodiff);
            let mine: Vec<TrainBatch> = batches
                .iter()
                .map(|b| {
                    let seqs = b.sequences();
                    let mine = match (ranks, rank) {
                        (2, 0) => &seqs[..1],
                        (2, _) => &seqs[1..],
                        _ => &seqs[rank..=rank],
                    };
                    TrainBatch::new(mine.to_vec()).unwrap()
                })
                .collect();
            let steps: Vec<_> = mine.iter().map(|b| step(&mut trainer, b)).collect();
            let params = by_id(&trainer.inference_model().unwrap(), None);
            let gathered = support::params(&trainer.whole_model().unwrap());
            (rank % 2, (steps, params), gathered)
        });
        check_expert_ranks(&reference, per_rank);
    }
    // Outside the group that holds its experts, an expert-parallel model does not train.
    let errors = on_ranks(2, |group| {
        let strategy: Arc<dyn Strategy> = group;
        let part = model.clone().shard_experts(strategy).unwrap();
        let mut alone = Trainer::new(part, config.clone(), &Device::flex()).unwrap();
        alone
            .step(&batches[0], &Objective::default())
            .unwrap_err()
            .to_string()
    });
    for err in errors {
        assert!(
            err.contains("data-parallel group that holds its experts")
                && err.contains("rank 0 of 1"),
            "{err}"
        );
    }
}

#[test]
fn pipelines_whose_stages_divide_their_experts_train_as_the_whole_trainer() {
    // Two pipelines of two stages side by side (4 threads: rank `s·2 + p` holds stage `s` of
    // pipeline `p`), each stage's experts divided between the two pipelines: a pipeline's tokens
    // travel to the other pipeline's rank of the same stage for the experts it holds, and back,
    // forward and backward. Pipeline 0 trains one sequence and pipeline 1 three, a micro-batch
    // each: pipeline 0 runs two idle micro-batches through both stages, serving its experts. Then
    // two such copies side by side (8 threads), the experts' gradients summed over the ranks
    // holding the same ones, one of the four pipelines with two sequences and one with none.
    // Against the whole trainer on the whole batch: the gradients after the all-reduces, the
    // reports and the weights after two clipped steps, and the whole model gathered on every
    // rank. (Three layers — a mixture, a dense layer, a mixture — so that each stage has one.)
    let model = {
        let mut c = qwen3_moe_config();
        c.num_hidden_layers = 3;
        c.mlp_only_layers = Some(vec![1]);
        let m = CausalLm::init(&c, &Device::flex()).unwrap();
        let _ = support::params(&m);
        m
    };
    let reference = expert_reference(&model);
    let (config, batches) = (&reference.config, &reference.batches);
    for copies in [1, 2] {
        let per_rank = on_ranks(4 * copies, |job| {
            let rank = job.rank();
            let (c, place) = (rank / 4, rank % 4);
            // Every rank forms every group, in the same order: the copies, each stage's ranks in
            // every pipeline (the data-parallel group), the ranks holding the same part.
            let mut copy = None;
            for c in 0..copies {
                copy = copy.or(job
                    .subgroup(&(4 * c..4 * c + 4).collect::<Vec<_>>())
                    .unwrap());
            }
            let mut data = None;
            for s in 0..2 {
                let stage: Vec<usize> = (0..4 * copies).filter(|r| r % 4 / 2 == s).collect();
                data = data.or(job.subgroup(&stage).unwrap());
            }
            let mut replicas = None;
            if copies == 2 {
                for p in 0..4 {
                    replicas = replicas.or(job.subgroup(&[p, p + 4]).unwrap());
                }
            }
            let (experts, link) = tensor_pipeline_groups(&copy.unwrap(), 2).unwrap();
            let mut part = model
                .clone()
                .split_stages(link)
                .unwrap()
                .shard_experts(experts)
                .unwrap();
            if let Some(replicas) = replicas {
                let replicas: Arc<dyn Strategy> = replicas;
                part = part.with_expert_replicas(replicas).unwrap();
            }
            let data: Arc<dyn Strategy> = data.unwrap();
            let mut trainer = Trainer::new(part, config.clone(), &Device::flex())
                .unwrap()
                .with_strategy(data);
            assert_eq!(trainer.part_index(), Some(place));
            let pipeline = 2 * c + place % 2;
            let mine = match (copies, pipeline) {
                (1, 0) => 0..1,
                (1, _) => 1..4,
                (_, 0) => 0..2,
                (_, 1) => 2..3,
                (_, 2) => 3..4,
                _ => 4..4,
            };
            let steps: Vec<_> = batches
                .iter()
                .map(|b| {
                    let shard = TrainBatch::new(b.sequences()[mine.clone()].to_vec()).unwrap();
                    step(&mut trainer, &shard)
                })
                .collect();
            let params = by_id(&trainer.inference_model().unwrap(), None);
            let gathered = support::params(&trainer.whole_model().unwrap());
            (rank, (steps, params), gathered)
        });
        check_expert_ranks(&reference, per_rank);
    }
    // A stage without a mixture has no experts to divide (nor exchanges to keep its
    // micro-batches in step); the experts are divided after the stages are split.
    let errors = on_ranks(2, |link| {
        let stage = qwen3_moe().split_stages(link).unwrap();
        let group = LocalGroup::replicas(vec![DeviceSpec::Cpu])
            .unwrap()
            .remove(0);
        let one: Arc<dyn Strategy> = Arc::new(group);
        let divided = stage.shard_experts(one.clone()).map(drop);
        let split = qwen3_moe().shard_experts(one).unwrap();
        let alone = LocalGroup::replicas(vec![DeviceSpec::Cpu])
            .unwrap()
            .remove(0);
        let link: Arc<dyn Messenger> = Arc::new(alone);
        (divided, split.split_stages(link).unwrap_err().to_string())
    });
    let stage0 = errors[0].0.as_ref().unwrap_err().to_string();
    assert!(
        stage0.contains("pipeline stage 0 of 2 holds layers 0..1, none of them a mixture"),
        "{stage0}"
    );
    assert!(errors[1].0.is_ok(), "stage 1 holds the mixture");
    assert!(
        errors[0].1.contains("then divide each stage's experts"),
        "{}",
        errors[0].1
    );
}

/// What the expert-parallel ranks of `expert_reference`'s model are checked against.
struct ExpertReference {
    /// Micro-batches of one sequence each.
    config: TrainerConfig,
    batches: [TrainBatch; 2],
    /// The whole trainer's two steps on the whole batches, and its weights after them.
    want: Trained,
    /// Those weights by path.
    want_gathered: std::collections::BTreeMap<String, Vec<f32>>,
}

/// Two clipped steps of the whole trainer of `model` on two batches (checked to move the
/// weights), one sequence per micro-batch.
fn expert_reference(model: &CausalLm) -> ExpertReference {
    let config = TrainerConfig {
        micro_batch_size: Some(1),
        ..step_config()
    };
    let batches = [train_batch(model, 31), train_batch(model, 32)];
    let mut whole = Trainer::new(model.clone(), config.clone(), &Device::flex()).unwrap();
    let want_steps = batches.iter().map(|b| step(&mut whole, b)).collect();
    let trained = whole.inference_model().unwrap();
    let want: Trained = (want_steps, by_id(&trained, None));
    assert!(
        max_abs_diff_by_id(&by_id(model, None), &want.1) > 1e-4,
        "the steps move the weights"
    );
    ExpertReference {
        config,
        batches,
        want,
        want_gathered: support::params(&trained),
    }
}

/// Checks each expert-parallel rank's steps, weights and gathered model (by its block `rank`)
/// against the whole trainer's.
fn check_expert_ranks(
    reference: &ExpertReference,
    ranks: Vec<(usize, Trained, std::collections::BTreeMap<String, Vec<f32>>)>,
) {
    let (want, want_gathered) = (&reference.want, &reference.want_gathered);
    let whole_params = want.1.len();
    for (rank, (steps, params), gathered) in ranks {
        let worst = want_gathered
            .iter()
            .map(|(path, v)| max_abs_diff(v, &gathered[path]))
            .fold(0.0, f32::max);
        assert!(worst <= 1e-5, "rank {rank}: gathered differs by {worst}");
        assert!(
            params.len() < whole_params,
            "rank {rank} holds only its experts"
        );
        for (i, ((want_grads, want), (grads, got))) in want.0.iter().zip(&steps).enumerate() {
            assert!(want.grad_norm > 0.5, "clipping is active");
            for (what, a, b) in [
                ("grad norm", want.grad_norm, got.grad_norm),
                ("loss", want.loss, got.loss),
            ] {
                let rel = (a - b).abs() / a.abs().max(1e-3);
                assert!(rel < 1e-5, "step {i} rank {rank}: {what} {b} vs {a}");
            }
            assert_slices(
                &format!("step {i} gradients"),
                want_grads,
                grads,
                rank,
                1e-5,
            );
        }
        assert_slices("weights", &want.1, &params, rank, 1e-5);
    }
}

// ---- Tensor parallelism ----

/// The tiny Qwen2 fixture (q/k/v biases, tied head, 4 heads over 2 key/value heads, MLP 352).
fn qwen2() -> CausalLm {
    load_model(fixture("tiny-qwen2-sft"), &Device::flex()).unwrap()
}

/// A random Qwen3 (QK-norm, untied head): vocabulary 97, hidden 64, 2 layers, 4 heads over 2,
/// head_dim 16, MLP 96.
fn qwen3() -> CausalLm {
    let mut c = HfConfig::new("qwen3", 97, 64, 96, 2, 4);
    c.num_key_value_heads = Some(2);
    c.head_dim = Some(16);
    c.tie_word_embeddings = false;
    let m = CausalLm::init(&c, &Device::flex()).unwrap();
    // Give every lazy parameter its value before the model is cloned.
    let _ = support::params(&m);
    m
}

/// Sequences of different lengths over `vocab`.
fn sequences(vocab: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = SplitMix64::new(seed);
    (0..4)
        .map(|i| {
            (0..5 + 3 * i)
                .map(|_| (rng.next_u64() % vocab as u64) as u32)
                .collect()
        })
        .collect()
}

/// Every sequence scored from its third token on.
fn score_request(seqs: &[Vec<u32>]) -> ScoreRequest {
    ScoreRequest {
        sequences: seqs
            .iter()
            .map(|s| ScoreSequence {
                prompt_ids: s[..2].to_vec(),
                response_ids: s[2..].to_vec(),
            })
            .collect(),
        with_entropy: true,
        ..Default::default()
    }
}

/// Logits of the Burn forward, and log-probs and entropies of the CPU decoder, of `seqs`.
fn outputs(model: &CausalLm, seqs: &[Vec<u32>]) -> [Vec<f32>; 2] {
    let batch = TokenBatch::new(
        seqs,
        PaddingSide::Right,
        0,
        model.vocab_size(),
        &Device::flex(),
    )
    .unwrap();
    let scores = CpuDecoder::from_model(model)
        .unwrap()
        .score(&score_request(seqs))
        .unwrap();
    let scored = scores
        .into_iter()
        .flat_map(|s| s.logprobs.into_iter().chain(s.entropy.unwrap_or_default()))
        .collect();
    [values(model.forward(&batch)), scored]
}

#[test]
fn tensor_parallel_forward_equals_the_whole_model_on_every_rank() {
    for (name, model) in [("qwen2", qwen2()), ("qwen3", qwen3())] {
        let seqs = sequences(model.vocab_size(), 7);
        let want = outputs(&model, &seqs);
        let per_rank = on_ranks(2, |group| {
            let shard = model
                .clone()
                .shard_tensors(group, ExpertSplit::Sliced)
                .unwrap();
            assert!(shard.tensor_shard().is_some() && model.tensor_shard().is_none());
            (outputs(&shard, &seqs), shard.num_params())
        });
        for (rank, (got, params)) in per_rank.iter().enumerate() {
            for (path, want, got) in [("burn", &want[0], &got[0]), ("cpu", &want[1], &got[1])] {
                assert_eq!(want.len(), got.len());
                // `f32::max` passes NaN over: finite outputs make the bound mean something.
                assert!(
                    got.iter().all(|v| v.is_finite()),
                    "{name} {path} rank {rank}"
                );
                let worst = max_abs_diff(want, got);
                assert!(
                    worst <= 1e-5,
                    "{name} {path} rank {rank}: differs by {worst}"
                );
            }
            assert!(
                *params < model.num_params(),
                "{name} rank {rank} holds a slice"
            );
        }
    }
}

type Values = HashMap<ParamId, (Vec<usize>, Vec<f32>)>;

/// A trainer's steps (gradients and report each) and its weights after them.
type Trained = (Vec<(Values, TrainStepReport)>, Values);

/// Every float parameter of a module (or its gradient in `grads`): id → (shape, values).
#[derive(Default)]
struct ById<'a> {
    grads: Option<&'a GradientsParams>,
    out: Values,
}

impl ModuleVisitor for ById<'_> {
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
        let t = match self.grads {
            Some(g) => match g.get::<D>(p.id) {
                Some(t) => t,
                None => return,
            },
            None => p.val(),
        };
        let shape = t.dims().to_vec();
        let v = t.into_data().convert::<f32>().try_into_vec().unwrap();
        self.out.insert(p.id, (shape, v));
    }
}

fn by_id(m: &CausalLm, grads: Option<&GradientsParams>) -> Values {
    let mut v = ById {
        grads,
        ..Default::default()
    };
    m.visit(&mut v);
    v.out
}

/// A trainer's steps on `batches` (gradients and reports) and its weights after them.
fn train(mut trainer: Trainer, batches: &[TrainBatch]) -> Trained {
    let steps = batches.iter().map(|b| step(&mut trainer, b)).collect();
    (steps, by_id(&trainer.inference_model().unwrap(), None))
}

/// Checks every rank's steps and weights against the whole trainer's (`want`): reports, the
/// gradients and the weights of what each rank holds (its slice of them).
fn assert_ranks_match(name: &str, want: &Trained, ranks: Vec<(usize, Trained)>) {
    for (rank, (steps, params)) in ranks {
        for (i, ((want_grads, want), (grads, got))) in want.0.iter().zip(&steps).enumerate() {
            assert!(want.grad_norm > 0.5, "{name}: clipping is active");
            let rel = (want.grad_norm - got.grad_norm).abs() / want.grad_norm;
            assert!(
                rel < 1e-5,
                "{name} step {i} rank {rank}: {got:?} vs {want:?}"
            );
            let loss = (want.loss - got.loss).abs() / want.loss.abs().max(1e-3);
            assert!(
                loss < 1e-5,
                "{name} step {i} rank {rank}: {got:?} vs {want:?}"
            );
            assert_eq!(want.micro_batches, got.micro_batches);
            assert_slices(
                &format!("{name} step {i} gradients"),
                want_grads,
                grads,
                rank,
                1e-5,
            );
        }
        assert_slices(&format!("{name} weights"), &want.1, &params, rank, 1e-5);
    }
}

/// One step of `trainer` on `batch`: the gradients by id, then the update's report.
fn step(trainer: &mut Trainer, batch: &TrainBatch) -> (Values, TrainStepReport) {
    let g = trainer
        .accumulate_gradients(batch, &Objective::default())
        .unwrap();
    let grads = by_id(trainer.training_model().unwrap(), Some(&g.grads));
    (grads, trainer.apply_gradients(g).unwrap())
}

/// Compares every parameter (or gradient) `got` of tensor-parallel rank `rank` with its slice of
/// `want`; `scale` is what a difference is measured against.
fn assert_slices(what: &str, want: &Values, got: &Values, rank: usize, tolerance: f32) {
    assert!(!got.is_empty(), "{what}: nothing to compare");
    for (id, (shape, v)) in got {
        let slice = slice_of(&want[id], shape, rank);
        assert!(v.iter().all(|x| x.is_finite()), "{what} rank {rank}");
        let scale = slice.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let worst = max_abs_diff(&slice, v);
        assert!(
            worst <= tolerance * scale.max(1.0),
            "{what} rank {rank}: shape {shape:?} differs by {worst} (largest value {scale})"
        );
    }
}

/// Rank `rank`'s slice of a whole parameter, found by comparing shapes: the columns (or rows, or
/// the part of a vector) of the shard's size at the rank's offset.
fn slice_of(whole: &(Vec<usize>, Vec<f32>), shard: &[usize], rank: usize) -> Vec<f32> {
    let (shape, v) = whole;
    match (shape.as_slice(), shard) {
        (a, b) if a == b => v.clone(),
        ([rows, cols], [r, c]) if rows == r => v
            .chunks_exact(*cols)
            .flat_map(|row| &row[rank * c..(rank + 1) * c])
            .copied()
            .collect(),
        ([_, cols], [r, _]) => v[rank * r * cols..(rank + 1) * r * cols].to_vec(),
        ([_], [n]) => v[rank * n..(rank + 1) * n].to_vec(),
        _ => panic!("no slice of {shape:?} has shape {shard:?}"),
    }
}

/// The largest difference between two models' parameters of the same ids.
fn max_abs_diff_by_id(a: &Values, b: &Values) -> f32 {
    a.iter()
        .map(|(id, (_, v))| max_abs_diff(v, &b[id].1))
        .fold(0.0, f32::max)
}

/// `n` sequences of varied lengths, advantages of both signs; old log-probs are the model's own
/// (the CPU decoder's, or Burn's scoring for a mixture of experts, which the decoder does not run).
fn train_batch(model: &CausalLm, seed: u64) -> TrainBatch {
    let seqs = sequences(model.vocab_size(), seed);
    let request = score_request(&seqs);
    let scores = match CpuDecoder::from_model(model) {
        Ok(decoder) => decoder.score(&request).unwrap(),
        Err(_) => roll_backend_burn::score(
            model,
            None,
            &request,
            &roll_backend_burn::ScoringOptions::default(),
            &Device::flex(),
        )
        .unwrap(),
    };
    let mut rng = SplitMix64::new(seed + 1);
    let seqs = seqs
        .iter()
        .zip(scores)
        .enumerate()
        .map(|(i, (s, sc))| {
            let r = s.len() - 2;
            TrainSequence {
                sample: SampleId(i as u64),
                prompt_ids: s[..2].to_vec(),
                response_ids: s[2..].to_vec(),
                loss_mask: vec![true; r],
                old_logprobs: sc.logprobs.clone(),
                rollout_logprobs: sc.logprobs,
                ref_logprobs: None,
                advantages: (0..r).map(|_| rng.next_f64() as f32 * 2.0 - 0.8).collect(),
                returns: None,
                old_values: None,
                weight: 1.0,
                score: 0.0,
            }
        })
        .collect();
    TrainBatch::new(seqs).unwrap()
}

/// LoRA on the query projections, which a model divided among ranks refuses.
fn lora_config() -> TrainerConfig {
    TrainerConfig {
        lora: Some(LoraConfig {
            rank: 2,
            alpha: 4.0,
            target_modules: vec!["q_proj".into()],
        }),
        ..Default::default()
    }
}

/// Clipping active (the global norm sums the ranks' own parts' squares over the group), a
/// learning rate that moves the weights well past the tolerance.
fn step_config() -> TrainerConfig {
    TrainerConfig {
        lr: 1e-4,
        max_grad_norm: Some(0.5),
        ..Default::default()
    }
}

#[test]
fn tensor_parallel_training_steps_equal_the_whole_trainers_steps() {
    // Two steps (AdamW's moments per slice). AdamW's first update is `lr·sign(g)` nearly
    // everywhere, so the gradients themselves are compared too. On the fused CPU path and on
    // Burn's autodiff path (block by block), each against the whole trainer on the same path.
    for (name, model, kernels) in [
        ("qwen2 fused", qwen2(), TrainKernels::Auto),
        ("qwen3 fused", qwen3(), TrainKernels::Auto),
        ("qwen2 autodiff", qwen2(), TrainKernels::Autodiff),
        ("qwen3 autodiff", qwen3(), TrainKernels::Autodiff),
    ] {
        let config = TrainerConfig {
            kernels,
            ..step_config()
        };
        let batches = [train_batch(&model, 11), train_batch(&model, 12)];
        let whole = Trainer::new(model.clone(), config.clone(), &Device::flex()).unwrap();
        let want = train(whole, &batches);
        assert!(
            max_abs_diff_by_id(&by_id(&model, None), &want.1) > 1e-4,
            "{name}: the steps move the weights"
        );
        let ranks = on_ranks(2, |group| {
            let rank = group.rank();
            let shard = model
                .clone()
                .shard_tensors(group, ExpertSplit::Sliced)
                .unwrap();
            let trainer = Trainer::new(shard, config.clone(), &Device::flex()).unwrap();
            assert_eq!(trainer.kernels(), kernels);
            (rank, train(trainer, &batches))
        });
        assert_ranks_match(name, &want, ranks);
    }
}

#[test]
fn pipeline_parallel_training_steps_equal_the_whole_trainers_steps() {
    // Micro-batches of at most 16 tokens: 3–4 per batch, so the schedule has a steady state. On
    // the fused CPU path and on Burn's autodiff path (each stage block by block), where a
    // mixture of experts trains (its dense layer on stage 0, its mixture on stage 1).
    use TrainKernels::{Auto as Fused, Autodiff};
    for (name, model, stages, kernels) in [
        ("qwen2", qwen2(), 2, Fused),
        ("qwen2", qwen2(), 3, Fused),
        ("qwen3", qwen3(), 2, Fused),
        ("qwen2", qwen2(), 3, Autodiff),
        ("qwen3", qwen3(), 2, Autodiff),
        ("qwen3_moe", qwen3_moe(), 2, Autodiff),
    ] {
        let config = TrainerConfig {
            micro_batch_tokens: Some(16),
            kernels,
            ..step_config()
        };
        let name = format!("{name} over {stages} stages, {kernels:?}");
        let batches = [train_batch(&model, 11), train_batch(&model, 12)];
        let whole = Trainer::new(model.clone(), config.clone(), &Device::flex()).unwrap();
        let want = train(whole, &batches);
        assert!(want.0[0].1.micro_batches >= 3, "{name}: {:?}", want.0[0].1);
        let ranks = on_ranks(stages, |link| {
            let stage = link.rank();
            let part = model.clone().split_stages(link).unwrap();
            let layers = part.pipeline_stage().unwrap().layers();
            let trainer = Trainer::new(part, config.clone(), &Device::flex()).unwrap();
            // Stage 0's slice of every parameter is the parameter itself.
            ((stage, layers), (0, train(trainer, &batches)))
        });
        let (layers, ranks): (Vec<_>, Vec<_>) = ranks.into_iter().unzip();
        // Contiguous blocks that cover every layer, the larger ones last (4 over 3: 1, 1, 2).
        let mut next = 0;
        for (stage, held) in layers {
            assert!(
                held.start == next && !held.is_empty(),
                "stage {stage}: {held:?}"
            );
            next = held.end;
        }
        assert_eq!(next, model.decoder_config().num_hidden_layers);
        assert_ranks_match(&name, &want, ranks);
    }
}

/// Slice `t` of stage `s` of a pipeline of stages of 2 tensor-parallel ranks, on rank `s·2 + t`
/// of `copy` (split into stages first, or sliced first), a mixture's experts divided as `split`.
fn tensor_pipeline_part(
    model: CausalLm,
    copy: &Arc<dyn Messenger>,
    stages_first: bool,
    split: ExpertSplit,
) -> CausalLm {
    let (slices, link) = tensor_pipeline_groups(copy, 2).unwrap();
    assert_eq!(copy.rank(), link.rank() * 2 + slices.rank());
    let part = if stages_first {
        model
            .split_stages(link)
            .unwrap()
            .shard_tensors(slices, split)
    } else {
        model
            .shard_tensors(slices, split)
            .unwrap()
            .split_stages(link)
    };
    part.unwrap()
}

#[test]
fn tensor_parallel_pipeline_stages_train_as_the_whole_trainer() {
    // A pipeline of 2 stages of 2 tensor-parallel ranks (4 threads), micro-batches of at most 24
    // tokens (3–4 per batch), two clipped AdamW steps: every rank's gradients, reports and
    // weights equal its slice of its stage's part of the whole trainer's, on the fused CPU path
    // and on Burn's autodiff path (block by block) — where a mixture of experts trains, its
    // experts sliced or whole within each stage (a dense first layer on stage 0, the mixture on
    // stage 1).
    use ExpertSplit::{Sliced, Whole};
    use TrainKernels::{Auto as Fused, Autodiff};
    for (name, model, kernels, split) in [
        ("qwen2", qwen2(), Fused, Sliced),
        ("qwen3", qwen3(), Fused, Sliced),
        ("qwen2", qwen2(), Autodiff, Sliced),
        ("qwen3", qwen3(), Autodiff, Sliced),
        ("qwen3_moe", qwen3_moe(), Autodiff, Sliced),
        ("qwen3_moe", qwen3_moe(), Autodiff, Whole),
    ] {
        let config = TrainerConfig {
            micro_batch_tokens: Some(16),
            kernels,
            ..step_config()
        };
        let name = format!("{name} over 2 stages of 2 slices, {kernels:?}, experts {split:?}");
        let batches = [train_batch(&model, 11), train_batch(&model, 12)];
        let whole = Trainer::new(model.clone(), config.clone(), &Device::flex()).unwrap();
        let want = train(whole, &batches);
        assert!(want.0[0].1.micro_batches >= 3, "{name}: {:?}", want.0[0].1);
        let ranks = on_ranks(4, |copy| {
            let part = tensor_pipeline_part(model.clone(), &copy, true, split);
            let slice = part.tensor_shard().unwrap().rank();
            let trainer = Trainer::new(part, config.clone(), &Device::flex()).unwrap();
            assert_eq!(trainer.kernels(), kernels);
            assert_eq!(trainer.part_index(), Some(copy.rank()));
            (slice, train(trainer, &batches))
        });
        assert_ranks_match(&name, &want, ranks);
    }
}

#[test]
fn model_parallel_refusals_name_the_cause() {
    let device = Device::flex();
    let errors = on_ranks(3, |group| {
        // 4 query heads over 3 ranks.
        qwen2()
            .shard_tensors(group, ExpertSplit::Sliced)
            .unwrap_err()
            .to_string()
    });
    assert!(errors[0].contains("4 query heads"), "{}", errors[0]);
    let errors = on_ranks(5, |link| {
        // 4 layers over 5 stages.
        qwen2().split_stages(link).unwrap_err().to_string()
    });
    assert!(
        errors[0].contains("5 pipeline stages for 4 layers"),
        "{}",
        errors[0]
    );
    let lora = lora_config();
    let error = |r: Result<_, roll_backend_burn::BackendError>| r.err().map(|e| e.to_string());
    let errors = on_ranks(1, |link| {
        let tensor = |m: CausalLm| m.shard_tensors(link.clone(), ExpertSplit::Sliced).unwrap();
        let stages = |m: CausalLm| m.split_stages(link.clone()).unwrap();
        let parts = [
            ("tensor-parallel", tensor(qwen2())),
            ("pipeline stage", stages(qwen2())),
            (
                "pipeline stage of a tensor-parallel model",
                tensor(stages(qwen2())),
            ),
        ];
        parts.map(|(kind, part)| {
            let refused = [
                (
                    "without LoRA",
                    error(Trainer::new(part.clone(), lora.clone(), &device).map(drop)),
                ),
                (
                    "serve an inference engine",
                    error(
                        Engine::for_model(&part, &device, EngineConfig::default(), None).map(drop),
                    ),
                ),
                (
                    "be saved",
                    error(
                        save_model(
                            &part,
                            std::env::temp_dir().join("roll-mp-refused"),
                            &SaveOptions::default(),
                        )
                        .map(drop),
                    ),
                ),
                // Each way once: a stage can be sliced, and a slice split into stages.
                (
                    "already sharded",
                    error(match part.tensor_shard() {
                        Some(_) => part
                            .clone()
                            .shard_tensors(link.clone(), ExpertSplit::Sliced)
                            .map(drop),
                        None => part.clone().split_stages(link.clone()).map(drop),
                    }),
                ),
            ];
            (kind, refused)
        })
    });
    for (kind, refused) in errors.into_iter().flatten() {
        for (what, err) in refused {
            let err = err.unwrap_or_else(|| panic!("a {kind} was allowed: {what}"));
            assert!(err.contains(what) && err.contains(kind), "{err}");
        }
    }
    // What only a whole model does, and expert parallelism across ranks holding different
    // tokens, which does not take stages (a stage divides its own experts: see
    // `pipelines_whose_stages_divide_their_experts_train_as_the_whole_trainer`).
    let errors = on_ranks(1, |link| {
        let stage = qwen2().split_stages(link.clone()).unwrap();
        let moe = || CausalLm::init(&qwen3_moe_config(), &device).unwrap();
        let experts = || moe().shard_experts(link.clone()).unwrap();
        [
            (
                "run a whole forward",
                error(CpuDecoder::from_model(&stage).map(drop)),
            ),
            (
                "an expert-parallel model (CausalLm::shard_experts) holds only some of its \
                 experts: it is already sharded",
                error(experts().split_stages(link.clone()).map(drop)),
            ),
            (
                "cannot form pipeline stages of 2",
                error(tensor_pipeline_groups(&link, 2).map(drop)),
            ),
        ]
    });
    for (what, err) in errors.into_iter().flatten() {
        let err = err.unwrap_or_else(|| panic!("allowed: {what}"));
        assert!(err.contains(what), "{err}");
    }
}

#[test]
fn gathering_the_parts_gives_the_whole_model_on_every_rank() {
    for (name, model) in [("qwen2", qwen2()), ("qwen3", qwen3())] {
        let want = support::params(&model);
        let tensor = on_ranks(2, |group| {
            let part = model
                .clone()
                .shard_tensors(group, ExpertSplit::Sliced)
                .unwrap();
            support::params(&part.gather().unwrap())
        });
        let layers = model.decoder_config().num_hidden_layers;
        let pipeline = on_ranks(layers, |link| {
            let part = model.clone().split_stages(link).unwrap();
            support::params(&part.gather().unwrap())
        });
        // Sliced first this time (the training test splits into stages first).
        let both = on_ranks(4, |copy| {
            let part = tensor_pipeline_part(model.clone(), &copy, false, ExpertSplit::Sliced);
            support::params(&part.gather().unwrap())
        });
        for (kind, got) in [("tensor", tensor), ("pipeline", pipeline), ("both", both)] {
            for (rank, got) in got.iter().enumerate() {
                // Bit for bit: each value is written once and added to zeros.
                assert!(got == &want, "{name} {kind} rank {rank}");
            }
        }
    }
    // A whole model gathers to itself.
    let model = qwen2();
    assert!(support::params(&model.gather().unwrap()) == support::params(&model));
}

// ---- Tensor parallelism of a mixture of experts ----

/// A random Qwen3-MoE with a dense first layer (MLP 96) and a sparse second one: four experts
/// of width 32, two per token, and a gated shared expert of width 48.
fn qwen3_moe() -> CausalLm {
    let mut c = qwen3_moe_config();
    c.mlp_only_layers = Some(vec![0]);
    c.shared_expert_intermediate_size = Some(48);
    let m = CausalLm::init(&c, &Device::flex()).unwrap();
    let _ = support::params(&m);
    m
}

/// Both ways a tensor-parallel group divides a mixture's experts.
const SPLITS: [ExpertSplit; 2] = [ExpertSplit::Sliced, ExpertSplit::Whole];

#[test]
fn a_tensor_parallel_mixture_of_experts_forward_equals_the_whole_model() {
    let model = qwen3_moe();
    let seqs = sequences(model.vocab_size(), 5);
    let batch = |m: &CausalLm| {
        let tokens = TokenBatch::new(&seqs, PaddingSide::Right, 0, 97, &Device::flex()).unwrap();
        values(m.forward(&tokens))
    };
    let want = batch(&model);
    for split in SPLITS {
        let per_rank = on_ranks(2, |group| {
            let part = model.clone().shard_tensors(group, split).unwrap();
            (batch(&part), part.num_params())
        });
        for (rank, (got, params)) in per_rank.iter().enumerate() {
            assert!(got.iter().all(|v| v.is_finite()), "{split:?} rank {rank}");
            let worst = max_abs_diff(&want, got);
            assert!(worst <= 1e-5, "{split:?} rank {rank}: differs by {worst}");
            assert!(*params < model.num_params(), "{split:?} rank {rank}");
        }
    }
}

#[test]
fn tensor_parallel_mixture_of_experts_training_equals_the_whole_trainers_steps() {
    // Burn's autodiff path, block by block: the mixture's partial output is this rank's experts'
    // (or expert slices') weighted sum plus its slice of the shared expert; the router's and the
    // shared expert gate's gradients are completed over the group like the norm gains'.
    let model = qwen3_moe();
    let batches = [train_batch(&model, 21), train_batch(&model, 22)];
    let whole = Trainer::new(model.clone(), step_config(), &Device::flex()).unwrap();
    let want = train(whole, &batches);
    assert!(
        max_abs_diff_by_id(&by_id(&model, None), &want.1) > 1e-4,
        "the steps move the weights"
    );
    for split in SPLITS {
        let ranks = on_ranks(2, |group| {
            let rank = group.rank();
            let part = model.clone().shard_tensors(group, split).unwrap();
            let trainer = Trainer::new(part, step_config(), &Device::flex()).unwrap();
            assert_eq!(trainer.kernels(), TrainKernels::Autodiff);
            (rank, train(trainer, &batches))
        });
        // A whole expert keeps its id and shape: `slice_of` compares it as it is.
        assert_ranks_match(&format!("{split:?}"), &want, ranks);
    }
}

#[test]
fn a_tensor_parallel_mixture_of_experts_gathers_whole_and_names_what_it_refuses() {
    let model = qwen3_moe();
    let want = support::params(&model);
    for split in SPLITS {
        let got = on_ranks(2, |group| {
            let part = model.clone().shard_tensors(group, split).unwrap();
            support::params(&part.gather().unwrap())
        });
        // And in two pipeline stages of two such ranks each.
        let staged = on_ranks(4, |copy| {
            let part = tensor_pipeline_part(model.clone(), &copy, false, split);
            support::params(&part.gather().unwrap())
        });
        for (rank, got) in got.iter().chain(&staged).enumerate() {
            assert!(got == &want, "{split:?} rank {rank}");
        }
    }
    let errors = on_ranks(3, |group| {
        // Two key/value heads over three ranks fail first: ask about the experts on a model
        // whose heads divide.
        let mut c = qwen3_moe_config();
        c.num_key_value_heads = Some(3);
        c.num_attention_heads = 3;
        let m = CausalLm::init(&c, &Device::flex()).unwrap();
        [
            m.clone().shard_tensors(group.clone(), ExpertSplit::Whole),
            m.shard_tensors(group.clone(), ExpertSplit::Sliced),
            qwen2().shard_tensors(group, ExpertSplit::Whole),
        ]
        .map(|r| r.map(drop).unwrap_err().to_string())
    });
    let [whole, sliced, dense] = &errors[0];
    assert!(whole.contains("4 experts (num_experts)"), "{whole}");
    assert!(
        sliced.contains("32 expert units (moe_intermediate_size)"),
        "{sliced}"
    );
    assert!(
        dense.contains("model.expert_parallel") && dense.contains("dense"),
        "{dense}"
    );
}
