//! Disaggregated rollout across processes (feature `mpi`): generation throughput with 0, 1 or 2
//! rollout ranks, and the time of a weight sync against the model's size.
//!
//! ```sh
//! cargo bench --features mpi --bench rollout_ranks --no-run   # prints the binary's path
//! B=target/release/deps/rollout_ranks-<hash>
//! mpirun -np 1 -x RAYON_NUM_THREADS=2 $B   # colocated: the engine in the controller's process
//! mpirun -np 2 -x RAYON_NUM_THREADS=2 $B   # one rollout rank with 2 threads
//! mpirun -np 3 -x RAYON_NUM_THREADS=1 $B   # two rollout ranks with 1 thread each
//! ```
//! (as root add `--allow-run-as-root`, with more ranks than cores `--oversubscribe`.)
//!
//! With `ROLL_BENCH_EXPERTS=E` the model is a small Qwen3-MoE (8 experts, 2 per token) and the
//! rollout ranks hold its experts divided among groups of `E` (`RolloutServer::with_experts`,
//! their engines stepping together); `E = 1` is the same model whole on every rank, the
//! comparison. No weight-sync table then.
//! ```sh
//! mpirun -np 3 -x RAYON_NUM_THREADS=1 -x ROLL_BENCH_EXPERTS=1 $B   # 2 rollout ranks, whole
//! mpirun -np 3 -x RAYON_NUM_THREADS=1 -x ROLL_BENCH_EXPERTS=2 $B   # the experts split in two
//! ```
//!
//! Throughput: rank 0 submits 32 requests at once (16-token prompt, 64 new tokens, temperature
//! 1, seeded, no stop) to the ~28M model of `shared/baselines.md`, four rounds after one
//! warm-up, and counts new tokens per second — the engine bench's workload, through
//! [`RemoteRollout`] and MPI when there are rollout ranks. Weight sync: rank 0 pushes a model's
//! weights to every rollout rank three times ([`RemoteRollout::sync`]: read the parameters,
//! send them in 64 MiB buckets, each rank rebuilds the model and its engine serves it) for
//! models from 0.8M to ~330M parameters.
//!
//! Not a criterion bench: criterion picks iteration counts per process, and every rank here
//! must take part in the same exchanges.

// The bench prints its table; it has no API.
#![allow(missing_docs)]

use roll::backend::engine::{Engine, EngineConfig};
use roll::backend::remote::{RemoteRollout, RolloutServer};
use roll::backend::{CausalLm, Device, HfConfig};
use roll::core::WeightVersion;
use roll::core::policy::{Generate, GenerationRequest, SamplingParams};
use roll::core::strategy::{DeviceSpec, Messenger};
use roll::mpi::MpiWorld;
use std::sync::Arc;
use std::time::Instant;

const REQUESTS: usize = 32;
const PROMPT: usize = 16;
const NEW: u32 = 64;
const ROUNDS: u64 = 4;
const SYNCS: u64 = 3;

fn main() -> anyhow::Result<()> {
    let world = MpiWorld::init()?;
    let link: Arc<dyn Messenger> = Arc::new(world.replica(DeviceSpec::Cpu));
    let device = Device::flex();
    let rollout: Vec<usize> = (1..world.size()).collect();
    let engine = EngineConfig {
        max_seqs: REQUESTS,
        max_cached_tokens: REQUESTS * (PROMPT + NEW as usize),
        ..EngineConfig::default()
    };
    let experts: Option<usize> = std::env::var("ROLL_BENCH_EXPERTS")
        .ok()
        .map(|e| e.parse())
        .transpose()?;
    let (name, config) = match experts {
        Some(_) => ("Qwen3-MoE 8 experts", moe()),
        None => ("28M model", qwen2(8192, 512, 1408, 8, 8, 4)),
    };
    let model = CausalLm::init(&config, &device)?;
    // Every rank forms every group of rollout ranks holding the experts, in order.
    let mut group = None;
    if let Some(width) = experts.filter(|&e| e > 1) {
        for ranks in rollout.chunks(width) {
            group = group.or(link.subgroup(ranks)?);
        }
    }
    if world.rank() > 0 {
        let mut server = RolloutServer::new(model, None, engine.clone(), device.clone());
        if let Some(group) = group {
            server = server.with_experts(group)?;
        }
        server.serve(link.as_ref(), 0)?;
        if experts.is_some() {
            return Ok(());
        }
        for (_, config) in sync_sizes() {
            let template = CausalLm::init(&config, &device)?;
            RolloutServer::new(template, None, engine.clone(), device.clone())
                .serve(link.as_ref(), 0)?;
        }
        return Ok(());
    }
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "all".into());
    let where_ = match (rollout.len(), experts) {
        (0, _) => "colocated engine".to_string(),
        (r, Some(e)) if e > 1 => format!("{r} rollout rank(s), the experts divided {e} ways"),
        (r, _) => format!("{r} rollout rank(s)"),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()?;
    let rate = if rollout.is_empty() {
        let local = Arc::new(LocalEngine(Engine::for_model(
            &model, &device, engine, None,
        )?));
        runtime.block_on(throughput(local))?
    } else {
        let remote = RemoteRollout::connect_with_experts(
            link.clone(),
            rollout.clone(),
            experts.unwrap_or(1),
            &model,
            WeightVersion(0),
        )?;
        runtime.block_on(throughput(Arc::new(remote)))?
    };
    println!(
        "generation, {name}, {REQUESTS} requests × {NEW} new tokens, {where_}, \
         {threads} threads per rank: {rate:.0} tokens/s"
    );
    if rollout.is_empty() || experts.is_some() {
        return Ok(());
    }
    for (name, config) in sync_sizes() {
        let model = CausalLm::init(&config, &device)?;
        let params = burn::module::Module::num_params(&model);
        let remote =
            RemoteRollout::connect(link.clone(), rollout.clone(), &model, WeightVersion(0))?;
        let mut times = Vec::new();
        for version in 1..=SYNCS {
            let start = Instant::now();
            remote.sync(&model, WeightVersion(version))?;
            times.push(start.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let gb = params as f64 * 4.0 / 1e9;
        println!(
            "weight sync, {name} ({:.1}M parameters, {gb:.3} GB f32) to {} rank(s): median {:.1} ms \
             ({:.2} GB/s delivered, end to end)",
            params as f64 / 1e6,
            rollout.len(),
            median * 1e3,
            gb * rollout.len() as f64 / median
        );
    }
    Ok(())
}

fn qwen2(
    vocab: usize,
    hidden: usize,
    ffn: usize,
    layers: usize,
    heads: usize,
    kv: usize,
) -> HfConfig {
    let mut c = HfConfig::new("qwen2", vocab, hidden, ffn, layers, heads);
    c.num_key_value_heads = Some(kv);
    c.tie_word_embeddings = true;
    c
}

/// A small Qwen3-MoE: every layer a mixture of 8 experts, 2 per token.
fn moe() -> HfConfig {
    let mut c = HfConfig::new("qwen3_moe", 8192, 256, 704, 4, 4);
    c.num_key_value_heads = Some(2);
    c.head_dim = Some(64);
    c.num_experts = Some(8);
    c.num_experts_per_tok = Some(2);
    c.moe_intermediate_size = Some(352);
    c.tie_word_embeddings = true;
    c
}

/// Models of growing size for the weight-sync table.
fn sync_sizes() -> Vec<(&'static str, HfConfig)> {
    vec![
        ("tiny", qwen2(259, 64, 176, 2, 4, 2)),
        ("28M", qwen2(8192, 512, 1408, 8, 8, 4)),
        ("110M", qwen2(32000, 768, 2048, 12, 12, 4)),
        ("330M", qwen2(32000, 1024, 2816, 24, 16, 4)),
    ]
}

/// The engine in this process, as a [`Generate`].
struct LocalEngine(Engine);

#[async_trait::async_trait]
impl Generate for LocalEngine {
    async fn generate(
        &self,
        request: GenerationRequest,
    ) -> roll::core::Result<roll::core::policy::Generation> {
        Ok(self.0.submit(request)?.finish().await?)
    }

    fn weight_version(&self) -> WeightVersion {
        self.0.weight_version()
    }
}

/// New tokens per second over [`ROUNDS`] rounds, after one warm-up round.
async fn throughput(g: Arc<dyn Generate>) -> anyhow::Result<f64> {
    let mut tokens = 0usize;
    let mut start = Instant::now();
    for round in 0..=ROUNDS {
        if round == 1 {
            (tokens, start) = (0, Instant::now());
        }
        let tasks: Vec<_> = (0..REQUESTS)
            .map(|i| {
                let prompt = (0..PROMPT)
                    .map(|t| ((i * 131 + t * 17 + 3) % 8192) as u32)
                    .collect();
                let params = SamplingParams {
                    temperature: 1.0,
                    max_new_tokens: NEW,
                    seed: Some(round * 1000 + i as u64),
                    ..SamplingParams::default()
                };
                let g = g.clone();
                tokio::spawn(
                    async move { g.generate(GenerationRequest::new(prompt, params)).await },
                )
            })
            .collect();
        for t in tasks {
            tokens += t.await??.token_ids.len();
        }
    }
    Ok(tokens as f64 / start.elapsed().as_secs_f64())
}
