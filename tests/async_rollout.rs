//! Asynchronous training with a real `BurnPolicy`: with `max_staleness = 1` the engine generates
//! the next batch's rollouts while the trainer trains (asserted from the engine's token counter
//! and from timestamps), and no sample more than one weight version old is trained on (asserted
//! from the versions the samples recorded).

use async_trait::async_trait;
use roll::core::config::NewModel;
use roll::core::policy::{Objective, ScoreRequest, TrainOutput};
use roll::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Instant;

mod common;
use common::out_dir;

/// One `train_step`: when, and the engine's sampled-token count at its start and end.
#[derive(Debug, Clone, Copy)]
struct TrainWindow {
    start: Instant,
    end: Instant,
    tokens_before: u64,
    tokens_after: u64,
}

/// The actor, with a record of when generations finished and when training ran.
struct Watched {
    actor: Arc<BurnPolicy>,
    finished: Mutex<Vec<Instant>>,
    trains: Mutex<Vec<TrainWindow>>,
}

#[async_trait]
impl Generate for Watched {
    async fn generate(&self, request: GenerationRequest) -> Result<Generation> {
        let generation = self.actor.generate(request).await;
        self.finished.lock().expect("lock").push(Instant::now());
        generation
    }

    fn weight_version(&self) -> WeightVersion {
        self.actor.weight_version()
    }
}

#[async_trait]
impl Score for Watched {
    async fn score(&self, request: &ScoreRequest) -> Result<Vec<roll::core::TokenScores>> {
        self.actor.score(request).await
    }
}

#[async_trait]
impl Train for Watched {
    async fn train_step(&self, batch: TrainBatch, objective: &Objective) -> Result<TrainOutput> {
        let tokens = || self.actor.engine().stats().generated_tokens;
        let (start, tokens_before) = (Instant::now(), tokens());
        let out = self.actor.train_step(batch, objective).await;
        let window = TrainWindow {
            start,
            end: Instant::now(),
            tokens_before,
            tokens_after: tokens(),
        };
        self.trains.lock().expect("lock").push(window);
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_mode_overlaps_generation_with_training_within_one_version() {
    // A fresh random model: it seldom samples its EOS, so every response is long enough to
    // still be generating when the trainer starts.
    let dir = out_dir("async-model");
    let spec = NewModel {
        model_type: "qwen2".into(),
        hidden_size: 64,
        intermediate_size: 128,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        max_position_embeddings: 64,
        rope_theta: 10_000.0,
        initializer_range: 0.02,
        tokenizer: Default::default(),
    };
    roll::backend::hf::write_new_model(&spec, &dir, 3, &[]).expect("model");
    let model = load_model(&dir, &Device::flex()).expect("load");
    let tokenizer: Arc<dyn Tokenizer> = Arc::new(
        HfTokenizer::from_dir(&dir)
            .expect("tokenizer")
            .with_chat_template(ChatTemplate::Plain),
    );
    let trainer = TrainerConfig {
        lr: 1e-3,
        ..TrainerConfig::default()
    };
    let actor = Arc::new(
        BurnPolicy::new(model, tokenizer.clone(), trainer, PolicyOptions::default())
            .expect("actor"),
    );
    let watched = Arc::new(Watched {
        actor: actor.clone(),
        finished: Mutex::new(Vec::new()),
        trains: Mutex::new(Vec::new()),
    });
    let config = RlvrSchedulerConfig {
        prompts_per_step: 2,
        group_size: 4,
        max_staleness: 1,
        sampling: SamplingParams {
            temperature: 1.0,
            max_new_tokens: 24,
            ..SamplingParams::default()
        },
        ..RlvrSchedulerConfig::default()
    };
    // Parity of the first sampled byte: a reward with spread, so every step trains.
    let reward = |s: &Sample| s.response().ids().first().map_or(0.0, |t| (t % 2) as f32);
    let prompts = (0..).map(|i| Prompt::new(PromptId(i), format!("Q: {i}? A:"), "toy"));
    let mut pipeline = RlvrPipeline::new(
        watched.clone(),
        move |generator| {
            let s = RlvrScheduler::new(config, generator, tokenizer, Arc::new(reward), prompts)?;
            Ok(Box::new(s) as Box<dyn Scheduler>)
        },
        AlgorithmConfig::default(),
        RlvrPipelineConfig {
            max_turn_tokens: 24,
            ..RlvrPipelineConfig::default()
        },
    )
    .expect("pipeline");

    let mut counts = [0u64; 4];
    for step in 0..5 {
        let report = pipeline.step().await.expect("step");
        assert_eq!(report.weight_version, WeightVersion(step + 1));
        for (total, n) in counts.iter_mut().zip(report.rollout.staleness_counts) {
            *total += n;
        }
    }
    // Never more than one version old, and one version old for real.
    assert_eq!(counts[2] + counts[3], 0, "staleness counts {counts:?}");
    assert!(counts[1] > 0, "staleness counts {counts:?}");
    // The engine sampled tokens while the trainer trained, and generations finished then.
    let trains = watched.trains.lock().expect("lock").clone();
    let finished = watched.finished.lock().expect("lock").clone();
    assert!(
        trains.iter().any(|w| w.tokens_after > w.tokens_before),
        "{trains:?}"
    );
    let during = finished
        .iter()
        .filter(|t| trains.iter().any(|w| w.start < **t && **t < w.end))
        .count();
    assert!(during > 0, "no generation finished during training");
    let _ = std::fs::remove_dir_all(&dir);
}
