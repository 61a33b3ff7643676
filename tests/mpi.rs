//! roll across three processes under `mpirun -np 3`, then four under `mpirun -np 4`, on this
//! machine (feature `mpi`).
//!
//! Run plainly, `main` launches itself under `mpirun`; each rank of the three then:
//! 1. trains three steps of the tiny fixture data-parallel — its own shard of each batch, the
//!    gradients summed over MPI — and checks that both ranks hold the same weights and that they
//!    are those of one trainer on the whole batch (rank 0 trains that one too);
//! 2. runs two GRPO steps of a run across processes: rank 0 runs the pipeline
//!    (`RunBuilder::lead`), ranks 1 and 2 serve it (`roll::run::follow`) as trainer replicas;
//! 3. runs the same two steps disaggregated (`rollout.ranks=1`): ranks 0 and 1 train as a
//!    sub-group of the job, rank 2 only generates and receives each step's weights; rank 0
//!    checks that both runs end on the same weights and rank 2 that it serves the trainer's last
//!    weight version;
//!    then the same two steps with the actor's layers in three pipeline stages, one per rank
//!    (`model.pipeline_parallel=3`, messages within a sub-group of the job), which must end on
//!    the same weights too; then two SFT steps before the two GRPO steps (`[sft]`), colocated
//!    and disaggregated, which must end on the same weights as each other;
//! 4. runs two GRPO steps of a Qwen3-MoE over the three ranks, data parallel with its experts
//!    whole, with its experts divided among the ranks (`model.expert_parallel=3`), and with one
//!    training rank and two rollout ranks holding half the experts each, their engines stepping
//!    together (`rollout.expert_parallel=2`), and with the experts divided among the three
//!    training ranks whose engines generate together (`rollout.expert_parallel=3`, each engine
//!    on its trainer's block, on an MPI channel beside the trainers' collectives), which must
//!    all end on the same weights; then a Qwen3-MoE forward expert-parallel (4 experts over 3
//!    ranks), each rank its own batch,
//!    and checks it against the whole model's forward; then trains it two steps, each rank on its
//!    own sequences, and checks the gathered model against one trainer's on all of them;
//! 5. runs the tiny fixture tensor-parallel over ranks 0 and 1 (a sub-group; its 4 heads do not
//!    split three ways): the forward's logits, then one training step on the fused CPU path,
//!    after which the sliced model's logits are the whole trainer's;
//! 6. trains the tiny fixture pipeline-parallel over three stages (its 4 layers as 1 + 1 + 2),
//!    micro-batches one forward one backward, activations and gradients as MPI messages (past
//!    the eager limit, so a schedule in which two ranks send to each other at once would hang),
//!    and checks each stage's weights after two steps against the whole trainer's.
//!
//! Each rank of the four runs two GRPO steps colocated, then the same two steps with the actor
//! in two pipeline stages of two tensor-parallel processes each (`model.tensor_parallel=2`,
//! `model.pipeline_parallel=2`: sub-groups of a sub-group of the job), which must end on the same
//! weights; then two GRPO steps of a Qwen3-MoE data parallel, and in two pipelines of two stages
//! whose experts are divided between the pipelines (`model.pipeline_parallel=2`,
//! `model.expert_parallel=2`), which must end on the same weights.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use roll::backend::train::{Trainer, TrainerConfig};
use roll::core::config::ConfigLoader;
use roll::core::rng::SplitMix64;
use roll::core::strategy::ReduceOp;
use roll::core::{SampleId, TrainSequence};
use roll::mpi::MpiWorld;
use roll::prelude::*;
use std::process::{Command, ExitCode};
use std::sync::Arc;

mod common;
use common::{
    FIXTURE, even_bytes, first_digit, moe_model_dir, moe_model_dir_with, out_dir, tiny_rlvr_toml,
};

const CHILD: &str = "ROLL_MPI_TEST_RANK";

fn main() -> ExitCode {
    if std::env::var_os(CHILD).is_some() {
        return match rank_main() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e:#}");
                ExitCode::FAILURE
            }
        };
    }
    // Honour `cargo test -- <filter>` as a libtest binary would: nothing here matches `--list`.
    if std::env::args().any(|a| a == "--list") {
        println!("mpirun_three_then_four_ranks: test");
        return ExitCode::SUCCESS;
    }
    let three = [
        "rank 0: data parallel over MPI equals one trainer",
        "rank 1: data parallel over MPI equals one trainer",
        "rank 2: data parallel over MPI equals one trainer",
        "rank 0: led 2 GRPO steps",
        "rank 1: served 2 steps",
        "rank 2: served 2 steps",
        "rank 0: led 2 disaggregated GRPO steps, the same weights as colocated",
        "rank 0: led 2 GRPO steps over 3 pipeline stages, the same weights as colocated",
        "rank 2: generated for 2 steps, serving weight version 2 with the whole model",
        "rank 1: served 4 steps",
        "rank 0: led 2 SFT and 2 GRPO steps, colocated and disaggregated alike",
        "rank 0: expert-parallel forward equals the whole model",
        "rank 1: expert-parallel forward equals the whole model",
        "rank 2: expert-parallel forward equals the whole model",
        "rank 0: expert-parallel training over 3 processes equals one trainer",
        "rank 0: led 2 GRPO steps with the experts divided over 3 processes",
        "rank 2: served 2 steps holding Experts",
        "rank 0: led 2 GRPO steps with the experts divided over 2 rollout processes",
        "rank 1: generated for 2 steps, serving weight version 2 with 1/2 of the experts",
        "rank 2: generated for 2 steps, serving weight version 2 with 1/2 of the experts",
        "rank 0: led 2 GRPO steps generating with the experts divided over 3 training processes",
        "rank 1: served 2 steps holding Experts, its engine",
        "rank 2: served 2 steps holding Experts, its engine",
        "rank 0: tensor-parallel forward and training step equal the whole model's",
        "rank 1: tensor-parallel forward and training step equal the whole model's",
        "rank 0: pipeline stage of layers 0..1 trains as the whole model",
        "rank 1: pipeline stage of layers 1..2 trains as the whole model",
        "rank 2: pipeline stage of layers 2..4 trains as the whole model",
    ];
    let four = [
        "rank 0: led 2 GRPO steps over 2 pipeline stages of 2 tensor-parallel processes, the \
         same weights as colocated",
        "rank 1: served 2 steps holding TensorPipeline { tensor: 2, experts: Sliced }",
        "rank 3: served 2 steps holding TensorPipeline { tensor: 2, experts: Sliced }",
        "rank 0: led 2 GRPO steps over 2 pipelines of 2 stages dividing their experts, the \
         same weights as data parallel",
        "rank 3: served 2 steps holding PipelineExperts { experts: 2 }",
    ];
    for (ranks, expected) in [(3, &three[..]), (4, &four[..])] {
        if let Err(e) = mpirun(ranks, expected) {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    }
    println!("test mpirun_three_then_four_ranks ... ok");
    ExitCode::SUCCESS
}

/// Runs this test's checks for `ranks` processes under `mpirun`; an error unless every rank
/// succeeds and the output has every `expected` line.
fn mpirun(ranks: usize, expected: &[&str]) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(ranks.to_string())
        .arg(exe)
        .env(CHILD, "1")
        .output()
        .map_err(|e| format!("mpirun: {e}: install MPI (Debian: openmpi-bin libopenmpi-dev)"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let missing: Vec<&str> = expected
        .iter()
        .copied()
        .filter(|line| !stdout.contains(line))
        .collect();
    if !out.status.success() || !missing.is_empty() {
        return Err(format!(
            "mpirun -np {ranks} failed or lines are missing: {missing:?}\n{stdout}\n{stderr}"
        ));
    }
    println!("{stdout}");
    Ok(())
}

fn rank_main() -> anyhow::Result<()> {
    let world = MpiWorld::init()?;
    let group: Arc<dyn Messenger> = Arc::new(world.replica(DeviceSpec::Cpu));
    let checked = match group.world_size() {
        4 => tensor_pipeline_run(&group),
        _ => every_check(&group),
    };
    if let Err(e) = &checked {
        // The other ranks may be waiting in a collective: end the job rather than let it hang.
        group.abort(&format!("{e:#}"));
    }
    checked
}

fn every_check(group: &Arc<dyn Messenger>) -> anyhow::Result<()> {
    let group = group.clone();
    let rank = group.rank();
    let worst = data_parallel_equals_one_trainer(&(group.clone() as Arc<dyn Strategy>))?;
    println!("rank {rank}: data parallel over MPI equals one trainer{worst}");
    let colocated = grpo_run_across_ranks(&group, &[], false)?;
    let disaggregated = grpo_run_across_ranks(&group, &["rollout.ranks=1"], false)?;
    let pipelined = grpo_run_across_ranks(&group, &["model.pipeline_parallel=3"], false)?;
    if let (Some(a), Some(b), Some(c)) = (colocated, disaggregated, pipelined) {
        let worst = max_diff(&flat(&a), &flat(&b));
        anyhow::ensure!(
            worst <= 1e-5,
            "disaggregated differs from colocated by {worst}"
        );
        println!("rank 0: led 2 disaggregated GRPO steps, the same weights as colocated");
        let worst = max_diff(&flat(&a), &flat(&c));
        anyhow::ensure!(worst <= 1e-5, "pipelined differs from colocated by {worst}");
        println!("rank 0: led 2 GRPO steps over 3 pipeline stages, the same weights as colocated");
    }
    let colocated = grpo_run_across_ranks(&group, &[], true)?;
    let disaggregated = grpo_run_across_ranks(&group, &["rollout.ranks=1"], true)?;
    if let (Some(a), Some(b)) = (colocated, disaggregated) {
        // Three trainers against two: the same sums in another order, which four Adam steps
        // amplify to ~1e-4 (tests/distributed.rs); a wrong start would differ by the learning
        // rate.
        let worst = max_diff(&flat(&a), &flat(&b));
        anyhow::ensure!(
            worst <= 5e-4,
            "SFT then GRPO: disaggregated differs from colocated by {worst}"
        );
        println!("rank 0: led 2 SFT and 2 GRPO steps, colocated and disaggregated alike");
    }
    if let Some([worst, rollout, generating]) = expert_parallel_run(&group)? {
        println!(
            "rank 0: led 2 GRPO steps with the experts divided over 3 processes, the same \
             weights as data parallel (max |Δ| {worst:e})"
        );
        println!(
            "rank 0: led 2 GRPO steps with the experts divided over 2 rollout processes, the \
             same weights as data parallel (max |Δ| {rollout:e})"
        );
        println!(
            "rank 0: led 2 GRPO steps generating with the experts divided over 3 training \
             processes, the same weights as data parallel (max |Δ| {generating:e})"
        );
    }
    let (worst, trained) = expert_parallel_forward(&group)?;
    println!("rank {rank}: expert-parallel forward equals the whole model (max |Δ| {worst:e})");
    if let Some(worst) = trained {
        println!(
            "rank 0: expert-parallel training over 3 processes equals one trainer (max |Δ| \
             {worst:e})"
        );
    }
    if let Some(pair) = group.subgroup(&[0, 1])? {
        let [before, after] = tensor_parallel_step(pair)?;
        println!(
            "rank {rank}: tensor-parallel forward and training step equal the whole model's \
             (max |Δ| of the logits {before:e} before the step, {after:e} after)"
        );
    }
    let (layers, worst) = pipeline_steps(group.clone())?;
    println!(
        "rank {rank}: pipeline stage of layers {layers:?} trains as the whole model \
         (max |Δ| {worst:e})"
    );
    Ok(())
}

/// Two GRPO steps colocated, then with the actor in 2 pipeline stages of 2 tensor-parallel
/// processes each; rank 0 checks that both end on the same weights.
fn tensor_pipeline_run(group: &Arc<dyn Messenger>) -> anyhow::Result<()> {
    let colocated = grpo_run_across_ranks(group, &[], false)?;
    let parts = ["model.tensor_parallel=2", "model.pipeline_parallel=2"];
    let both = grpo_run_across_ranks(group, &parts, false)?;
    if let (Some(a), Some(b)) = (colocated, both) {
        let worst = max_diff(&flat(&a), &flat(&b));
        anyhow::ensure!(
            worst <= 1e-5,
            "2 stages of 2 slices differ from colocated by {worst}"
        );
        println!(
            "rank 0: led 2 GRPO steps over 2 pipeline stages of 2 tensor-parallel processes, \
             the same weights as colocated (max |Δ| {worst:e})"
        );
    }
    // A Qwen3-MoE whose stages each hold a mixture (a mixture, a dense layer, a mixture),
    // written by rank 0: data parallel with its experts whole, then two pipelines of two stages
    // each dividing the stage's experts between the pipelines — its tokens travel to the other
    // pipeline's process of the same stage while activations pass between stages.
    let base = rank0_dir(group, "mpi-staged-moe")?;
    let dir = base.join("model");
    if group.rank() == 0 {
        std::fs::create_dir_all(&base)?;
        moe_model_dir_with(&base, "model", &[true, false, true]);
    }
    group.broadcast(&mut Vec::new(), 0)?; // the model is written
    let source = format!("model.source.path={}", dir.display());
    let whole = grpo_run_across_ranks(group, &[&source], false)?;
    let parts = [
        source.as_str(),
        "model.pipeline_parallel=2",
        "model.expert_parallel=2",
    ];
    let staged = grpo_run_across_ranks(group, &parts, false)?;
    group.broadcast(&mut Vec::new(), 0)?; // every rank is done with the model
    if let (Some(a), Some(b)) = (whole, staged) {
        let _ = std::fs::remove_dir_all(&base);
        let worst = max_diff(&flat(&a), &flat(&b));
        anyhow::ensure!(
            worst <= 1e-5,
            "2 pipelines dividing their stages' experts differ from data parallel by {worst}"
        );
        println!(
            "rank 0: led 2 GRPO steps over 2 pipelines of 2 stages dividing their experts, the \
             same weights as data parallel (max |Δ| {worst:e})"
        );
    }
    Ok(())
}

/// Two steps of the fixture over the job's ranks as pipeline stages, against the whole
/// trainer's: this stage's layers and the largest difference of its weights.
fn pipeline_steps(link: Arc<dyn Messenger>) -> anyhow::Result<(std::ops::Range<usize>, f32)> {
    use std::collections::HashMap;
    let device = Device::flex();
    let model = load_model(FIXTURE, &device)?;
    let config = TrainerConfig {
        lr: 1e-4,
        micro_batch_tokens: Some(24),
        ..TrainerConfig::default()
    };
    let objective = roll::core::policy::Objective::default();
    let mut whole = Trainer::new(model.clone(), config.clone(), &device)?;
    let stage = model.clone().split_stages(link)?;
    let layers = stage
        .pipeline_stage()
        .map(|s| s.layers())
        .unwrap_or_default();
    let mut part = Trainer::new(stage, config, &device)?;
    for seed in [3, 4] {
        let batch = batch(seed);
        let want = whole.step(&batch, &objective)?;
        let got = part.step(&batch, &objective)?;
        anyhow::ensure!(
            got.micro_batches >= 3,
            "{} micro-batches",
            got.micro_batches
        );
        let rel = (want.grad_norm - got.grad_norm).abs() / want.grad_norm;
        anyhow::ensure!(
            rel < 1e-5,
            "grad norm {} vs {}",
            got.grad_norm,
            want.grad_norm
        );
    }
    let by_id = |m: &roll::backend::CausalLm| {
        #[derive(Default)]
        struct Collect(HashMap<burn::module::ParamId, Vec<f32>>);
        impl ModuleVisitor for Collect {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
                let data = p.val().into_data().convert::<f32>();
                self.0
                    .insert(p.id, data.try_to_vec::<f32>().unwrap_or_default());
            }
        }
        let mut c = Collect::default();
        m.visit(&mut c);
        c.0
    };
    let want = by_id(&whole.inference_model()?);
    let got = by_id(&part.inference_model()?);
    let mut worst = 0.0f32;
    for (id, v) in &got {
        anyhow::ensure!(v.iter().all(|x| x.is_finite()), "non-finite weights");
        let w = want
            .get(id)
            .ok_or_else(|| anyhow::anyhow!("a stage parameter the whole model lacks"))?;
        worst = worst.max(max_diff(w, v));
    }
    anyhow::ensure!(worst <= 1e-5, "a stage's weights differ by {worst}");
    Ok((layers, worst))
}

/// The fixture's logits sharded over `pair`, against the whole model's, before and after one
/// training step (on the fused CPU path): the largest differences.
fn tensor_parallel_step(pair: Arc<dyn Strategy>) -> anyhow::Result<[f32; 2]> {
    use roll::backend::{PaddingSide, TokenBatch};
    let device = Device::flex();
    let model = load_model(FIXTURE, &device)?;
    let train = batch(7);
    let seqs: Vec<Vec<u32>> = train
        .sequences()
        .iter()
        .map(|s| [s.prompt_ids.as_slice(), &s.response_ids].concat())
        .collect();
    let tokens = TokenBatch::new(&seqs, PaddingSide::Right, 0, model.vocab_size(), &device)?;
    let logits = |m: &roll::backend::CausalLm| {
        let v = m.forward(&tokens).into_data().convert::<f32>();
        v.try_into_vec::<f32>()
            .map_err(|e| anyhow::anyhow!("{e:?}"))
    };
    let config = TrainerConfig {
        lr: 1e-4,
        ..TrainerConfig::default()
    };
    let objective = roll::core::policy::Objective::default();
    let mut whole = Trainer::new(model.clone(), config.clone(), &device)?;
    let mut sliced = Trainer::new(
        model
            .clone()
            .shard_tensors(pair, roll::backend::ExpertSplit::Sliced)?,
        config,
        &device,
    )?;
    let mut worst = [0.0; 2];
    for (i, w) in worst.iter_mut().enumerate() {
        if i == 1 {
            whole.step(&train, &objective)?;
            sliced.step(&train, &objective)?;
        }
        let want = logits(&whole.inference_model()?)?;
        let got = logits(&sliced.inference_model()?)?;
        anyhow::ensure!(got.iter().all(|v| v.is_finite()), "non-finite logits");
        // The row-parallel products add their halves in another order than the whole model's
        // GEMM, so logits differ by rounding, and by how much follows their scale and the host's
        // kernels: 1.2e-5 at a largest logit of 10.8 on an AVX2 host (13 ulps of 10.8), under
        // 1e-5 on an AVX-512 one. After the step the weights differ by rounding too (≤ 1e-6).
        // Either way the bound is relative to the largest logit.
        let largest = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let bound = 1e-5 * largest.max(1.0);
        *w = max_diff(&want, &got);
        anyhow::ensure!(
            *w <= bound,
            "tensor-parallel logits differ by {w} (step {i}, largest logit {largest})"
        );
    }
    let moved = max_diff(&logits(&model)?, &logits(&whole.inference_model()?)?);
    anyhow::ensure!(
        moved > 100.0 * worst[1],
        "the step moved the logits by only {moved}"
    );
    Ok(worst)
}

/// Rank 0 says by how much the group's weights differ from one trainer's.
fn data_parallel_equals_one_trainer(group: &Arc<dyn Strategy>) -> anyhow::Result<String> {
    let device = Device::flex();
    let model = load_model(FIXTURE, &device)?;
    let config = TrainerConfig {
        lr: 1e-3,
        eps: 1e-3,
        micro_batch_tokens: Some(40),
        ..TrainerConfig::default()
    };
    let objective = roll::core::policy::Objective::default();
    let mut replica =
        Trainer::new(model.clone(), config.clone(), &device)?.with_strategy(group.clone());
    let mut alone = (group.rank() == 0).then(|| Trainer::new(model, config, &device));
    for seed in 0..3 {
        let batch = batch(seed);
        let tokens: Vec<usize> = batch
            .sequences()
            .iter()
            .map(|s| s.prompt_ids.len() + s.response_ids.len())
            .collect();
        let mine = &group.partition(&tokens)[group.rank()];
        let shard = TrainBatch::new(mine.iter().map(|&i| batch.sequences()[i].clone()).collect())?;
        replica.step(&shard, &objective)?;
        if let Some(Ok(alone)) = &mut alone {
            alone.step(&batch, &objective)?;
        }
    }
    let mine = flat(&replica.inference_model()?);
    // Both ranks hold the same bits: the element-wise max and min over the ranks are equal.
    let (mut high, mut low) = (mine.clone(), mine.clone());
    group.all_reduce(&mut high, ReduceOp::Max)?;
    group.all_reduce(&mut low, ReduceOp::Min)?;
    anyhow::ensure!(high == low, "the replicas' weights differ across ranks");
    if let Some(alone) = alone {
        let one = flat(&alone?.inference_model()?);
        let worst = max_diff(&one, &mine);
        anyhow::ensure!(
            worst <= 1e-5,
            "data parallel differs from one trainer by {worst}"
        );
        let moved = max_diff(&flat(&load_model(FIXTURE, &device)?), &one);
        anyhow::ensure!(moved > 1e-4, "the steps changed nothing");
        return Ok(format!(
            " (max |Δ| {worst:e}, the steps moved weights by up to {moved:e})"
        ));
    }
    Ok(String::new())
}

/// Two GRPO steps led by rank 0 with `extra` overrides, after two SFT steps (8 pairs in
/// batches of 4) with `sft`; rank 0 returns the final weights.
fn grpo_run_across_ranks(
    group: &Arc<dyn Messenger>,
    extra: &[&str],
    sft: bool,
) -> anyhow::Result<Option<roll::backend::CausalLm>> {
    let out = out_dir("mpi-grpo");
    let mut toml = tiny_rlvr_toml(&out);
    if sft {
        toml.push_str("\n[sft]\nbatch_size = 4\nlearning_rate = 1e-3\nwarmup_steps = 0\n");
    }
    let config = ConfigLoader::new()
        .toml_str(toml)
        .overrides(["rollout.max_staleness=0"])
        .overrides(TRAINING_RUN)
        .overrides(extra.iter().copied())
        .load()?;
    if group.rank() > 0 {
        match follow(&config, group.clone())? {
            Followed::Trained {
                steps,
                part,
                engine,
            } => {
                let part = part.map(|p| format!(" holding {p:?}")).unwrap_or_default();
                let engine = engine
                    .map(|e| {
                        format!(
                            ", its engine {} forward steps to weight version {}",
                            e.steps, e.version.0
                        )
                    })
                    .unwrap_or_default();
                println!("rank {}: served {steps} steps{part}{engine}", group.rank())
            }
            Followed::Generated(s) => println!(
                "rank {}: generated for {} steps, serving weight version {} with {} ({} \
                 requests)",
                group.rank(),
                s.weight_syncs - 1,
                s.version.0,
                match s.expert_parallel {
                    1 => "the whole model".to_string(),
                    e => format!("1/{e} of the experts"),
                },
                s.requests
            ),
        }
        return Ok(None);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (steps, model) = runtime.block_on(async {
        let prompts = (0..16u64).map(|i| {
            Prompt::new(PromptId(i), format!("Q: {i}+{i}=? A:"), "arithmetic")
                .with_ground_truth((2 * i).to_string())
        });
        let mut run = RunBuilder::new(config)
            .reward("first_digit", first_digit)
            .reward("even_bytes", even_bytes)
            .prompts(prompts)
            .lead(group.clone());
        if sft {
            let pair = |a: u64| SftExample::new(format!("Q: {a}+{a}=? A:"), format!(" {}", 2 * a));
            run = run.sft_examples((20..28).map(pair), [pair(40)]);
        }
        let mut run = run.build()?;
        let summary = run.train().await?;
        anyhow::ensure!(run.actor().weight_version() == WeightVersion(2));
        for (step, r) in summary.rl.iter().enumerate() {
            let norm = r.metrics["actor/grad_norm"];
            anyhow::ensure!(norm > 0.0, "GRPO step {}: no gradient", step + 1);
        }
        anyhow::Ok((summary.rl.len(), run.actor().model()?))
    })?;
    if extra.is_empty() && !sft {
        println!("rank 0: led {steps} GRPO steps");
    }
    let _ = std::fs::remove_dir_all(&out);
    Ok(Some(model))
}

/// Rank 0's `out_dir(name)`, on every rank (each process would name its own).
fn rank0_dir(group: &Arc<dyn Messenger>, name: &str) -> anyhow::Result<std::path::PathBuf> {
    let mut path = out_dir(name).to_string_lossy().into_owned().into_bytes();
    group.broadcast(&mut path, 0)?;
    Ok(std::path::PathBuf::from(String::from_utf8(path)?))
}

/// What every GRPO run here overrides: a reward about half of the samples collect (the
/// fixture's and a random mixture of experts' alike; none collects `first_digit`'s in two
/// steps), so that every step trains, and AdamW's ε at 1e-5, which keeps the rounding of
/// another layout's sums from showing in the update of a gradient that cancels to almost
/// nothing (see `config` in `tests/distributed.rs`).
const TRAINING_RUN: [&str; 3] = [
    "domains.arithmetic.reward.kind=even_bytes",
    "train.optimizer.kind=adam_w",
    "train.optimizer.eps=1e-5",
];

/// Two GRPO steps of a random Qwen3-MoE (`moe_model_dir`, written by rank 0) over
/// the three ranks, data parallel with the experts whole and with the experts divided among the
/// ranks (`model.expert_parallel=3`: 4 experts as 1 + 1 + 2), then with one training rank and
/// two rollout ranks holding half the experts each (`rollout.expert_parallel=2`, their engines
/// stepping together over MPI), then with the experts divided among the three training ranks
/// whose engines generate together, each on its own trainer's block, on a channel of their own
/// beside the trainers' collectives (`rollout.expert_parallel=3`); rank 0 returns how far apart
/// each ends from the first.
fn expert_parallel_run(group: &Arc<dyn Messenger>) -> anyhow::Result<Option<[f32; 3]>> {
    let base = rank0_dir(group, "mpi-moe-run")?;
    let dir = if group.rank() == 0 {
        std::fs::create_dir_all(&base)?;
        moe_model_dir(&base)
    } else {
        base.join("moe-model")
    };
    group.broadcast(&mut Vec::new(), 0)?; // the model is written
    let source = format!("model.source.path={}", dir.display());
    let whole = grpo_run_across_ranks(group, &[&source], false)?;
    let divided = grpo_run_across_ranks(group, &[&source, "model.expert_parallel=3"], false)?;
    let rollout = grpo_run_across_ranks(
        group,
        &[&source, "rollout.ranks=2", "rollout.expert_parallel=2"],
        false,
    )?;
    let generating = grpo_run_across_ranks(
        group,
        &[
            &source,
            "model.expert_parallel=3",
            "rollout.expert_parallel=3",
        ],
        false,
    )?;
    group.broadcast(&mut Vec::new(), 0)?; // every rank is done with the model
    let (Some(a), Some(b), Some(c), Some(d)) = (whole, divided, rollout, generating) else {
        return Ok(None);
    };
    let _ = std::fs::remove_dir_all(&base);
    let worst = max_diff(&flat(&a), &flat(&b));
    anyhow::ensure!(
        worst <= 1e-5,
        "experts divided over the ranks differ from data parallel by {worst}"
    );
    let rollout = max_diff(&flat(&a), &flat(&c));
    anyhow::ensure!(
        rollout <= 1e-5,
        "experts divided over the rollout ranks differ from data parallel by {rollout}"
    );
    let generating = max_diff(&flat(&a), &flat(&d));
    anyhow::ensure!(
        generating <= 1e-5,
        "experts divided over the ranks, which generate together, differ from data parallel by \
         {generating}"
    );
    Ok(Some([worst, rollout, generating]))
}

/// Rank 0 writes a random Qwen3-MoE for every rank to load; each rank runs its own batch through
/// its shard of the experts and through the whole model. Then every rank trains its shard of
/// the experts on its own sequences of two batches (sequence `i` to rank `i mod 3`, one per
/// micro-batch: rank 0 has one more, which ranks 1 and 2 serve), and rank 0 compares the model
/// gathered from the ranks with one trainer's on the whole batches. Returns the largest
/// difference of the logits, and rank 0 that of the trained weights.
fn expert_parallel_forward(group: &Arc<dyn Messenger>) -> anyhow::Result<(f32, Option<f32>)> {
    use roll::backend::{CausalLm, HfConfig, PaddingSide, SaveOptions, TokenBatch, save_model};
    let device = Device::flex();
    let dir = rank0_dir(group, "mpi-moe")?;
    if group.rank() == 0 {
        // Seeded: the same model every run, so a failure can be rerun.
        device.seed(17);
        let mut config = HfConfig::new("qwen3_moe", 97, 64, 96, 2, 4);
        config.num_key_value_heads = Some(2);
        config.head_dim = Some(24);
        config.num_experts = Some(4);
        config.num_experts_per_tok = Some(2);
        config.moe_intermediate_size = Some(32);
        save_model(
            &CausalLm::init(&config, &device)?,
            &dir,
            &SaveOptions::default(),
        )?;
    }
    group.broadcast(&mut Vec::new(), 0)?; // the model is written
    let model = load_model(&dir, &device)?;
    let rank = group.rank();
    let seqs: Vec<Vec<u32>> = (0..=rank)
        .map(|s| {
            (0..4 + 3 * rank + s)
                .map(|t| ((t * 29 + s * 5 + rank * 11 + 2) % 97) as u32)
                .collect()
        })
        .collect();
    let batch = TokenBatch::new(&seqs, PaddingSide::Right, 0, 97, &device)?;
    let values = |t: Tensor<3>| t.into_data().convert::<f32>().try_into_vec::<f32>();
    let want = values(model.forward(&batch)).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let shard = model.shard_experts(group.clone())?;
    let got = values(shard.forward(&batch)).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let worst = max_diff(&want, &got);
    // `f32::max` passes NaN over: the logits must be finite for `worst` to mean anything.
    anyhow::ensure!(
        got.iter().all(|v| v.is_finite()),
        "rank {rank}: non-finite logits"
    );
    anyhow::ensure!(
        worst <= 1e-5,
        "rank {rank}: expert-parallel logits differ by {worst}"
    );
    // AdamW moves an element by about `lr` whatever the size of its gradient once `eps` is
    // below it, so an element whose gradient is rounding (an expert few tokens reach) would move
    // by a step's size one way or the other: 2e-5 apart in one run with the default `eps`. As in
    // the data-parallel test, an `eps` above rounding makes the comparison one of gradients.
    let config = TrainerConfig {
        lr: 1e-3,
        eps: 1e-3,
        max_grad_norm: Some(0.5),
        micro_batch_size: Some(1),
        ..Default::default()
    };
    let objective = roll::core::policy::Objective::default();
    let batches = [batch_over(41, 97), batch_over(42, 97)];
    let strategy: Arc<dyn Strategy> = group.clone();
    let part = load_model(&dir, &device)?.shard_experts(strategy.clone())?;
    let mut trainer = Trainer::new(part, config.clone(), &device)?.with_strategy(strategy);
    for b in &batches {
        let mine = b
            .sequences()
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 3 == rank);
        let mine = TrainBatch::new(mine.map(|(_, s)| s.clone()).collect())?;
        trainer.step(&mine, &objective)?;
    }
    let gathered = flat(&trainer.whole_model()?);
    let mut trained = None;
    if rank == 0 {
        let mut whole = Trainer::new(load_model(&dir, &device)?, config, &device)?;
        for b in &batches {
            whole.step(b, &objective)?;
        }
        let worst = max_diff(&flat(&whole.inference_model()?), &gathered);
        anyhow::ensure!(
            worst <= 1e-5,
            "expert-parallel training differs from one trainer by {worst}"
        );
        trained = Some(worst);
    }
    group.broadcast(&mut Vec::new(), 0)?; // every rank has read the model
    if rank == 0 {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok((worst, trained))
}

/// Seven sequences of varied lengths from the fixture's vocabulary, advantages of both signs.
fn batch(seed: u64) -> TrainBatch {
    batch_over(seed, 200)
}

/// [`batch`] over a vocabulary of `vocab` tokens.
fn batch_over(seed: u64, vocab: u64) -> TrainBatch {
    let mut rng = SplitMix64::new(seed);
    let mut below = |n: u64| (rng.next_u64() % n) as u32;
    let seqs = (0..7)
        .map(|i| {
            let (p, r) = (2 + below(6) as usize, 3 + below(9) as usize);
            TrainSequence {
                sample: SampleId(i),
                prompt_ids: (0..p).map(|_| below(vocab)).collect(),
                response_ids: (0..r).map(|_| below(vocab)).collect(),
                loss_mask: vec![true; r],
                old_logprobs: vec![-3.0; r],
                rollout_logprobs: vec![-3.0; r],
                ref_logprobs: None,
                advantages: (0..r)
                    .map(|t| below(100) as f32 / 50.0 - 1.0 + t as f32 * 0.01)
                    .collect(),
                returns: None,
                old_values: None,
                weight: 1.0,
                score: 0.0,
            }
        })
        .collect();
    TrainBatch::new(seqs).expect("a valid batch")
}

/// The largest |a − b| (NaN passes over: check finiteness where it can occur).
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Every parameter of `model`, end to end.
fn flat(model: &roll::backend::CausalLm) -> Vec<f32> {
    #[derive(Default)]
    struct Collect(Vec<f32>);
    impl ModuleVisitor for Collect {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let data = p.val().into_data().convert::<f32>();
            self.0.extend(data.try_to_vec::<f32>().unwrap_or_default());
        }
    }
    let mut c = Collect::default();
    model.visit(&mut c);
    c.0
}
