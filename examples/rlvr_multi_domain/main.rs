//! rlvr_multi_domain — three reward domains in one RLVR run on a transformer built from scratch:
//! math (roll-reward's math verifier), code (its sandbox, running Python test cases) and
//! instruction following (its IFEval rules), mixed by the ratios of `[domains]`, each sample
//! scored by its own domain's worker.
//!
//! 1. Draws the three tasks (`task.rs`): arithmetic, one-line Python functions, sentences under
//!    an instruction; per domain, held-out prompts never trained on.
//! 2. Builds a 0.8M-parameter Qwen2 whose BPE tokenizer is learned from the warm start's text,
//!    and warm-starts it with SFT on all three domains (some answers by a novice who makes the
//!    plausible mistakes).
//! 3. Trains it with GRPO; every step's 16 prompts hold each domain's share of
//!    `rollout.prompts_per_step` (to within one prompt), and the reward router sends each sample
//!    to its domain's worker.
//! 4. Reports greedy held-out accuracy per domain after SFT and after RL.
//!
//! ```sh
//! cargo run --release --example rlvr_multi_domain [-- --model DIR] [-- key.path=value ...]
//! ```
//!
//! Before training, the expert's answer to every held-out prompt goes through the reward router
//! and must score 1: a task and a worker that disagree, or a worker that cannot run, stop the
//! run there. The code sandbox runs each program confined (namespaces, an unprivileged user,
//! rlimits), which needs root and util-linux; elsewhere this check fails with the sandbox's
//! reason (`domains.code.reward.allow_unconfined=true` runs the programs with rlimits only).

#[path = "../common/cli.rs"]
mod cli;
mod task;

use roll::core::config::DomainMap;
use roll::core::pipeline::evaluate;
use roll::core::{GroupId, SampleId};
use roll::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    roll::init_logging();
    let config = cli::config("examples/configs/rlvr_multi_domain.toml")?;
    let task: task::Task = config.task()?;
    task.validate()?;
    let data = task.datasets(config.run.seed);
    let held_out = HeldOut::new(&config, data.held_out.clone())?;
    held_out.check(&data.held_out_answers).await?;

    let has_sft = config.sft.is_some();
    let mut run = RunBuilder::new(config)
        .prompts(data.rl)
        .eval_prompts(data.held_out);
    if has_sft {
        run = run.sft_examples(data.sft, data.sft_held_out);
    }
    let mut run = run.build()?;
    let dir = run.plan().run.output_dir.display().to_string();
    println!("resolved config: {dir}/config.toml");
    run.sft().await?;
    // A run resumed in the middle of RL has no "before RL" model left to measure.
    let before = match run.steps_taken() {
        0 => Some(held_out.accuracy(&run).await?),
        _ => None,
    };
    let summary = run.train().await?;
    let after = held_out.accuracy(&run).await?;

    println!("\n{summary}");
    println!("held-out accuracy by domain (greedy):");
    println!(
        "  {:<8} {:>8} {:>10} {:>9}",
        "domain", "prompts", "before RL", "after RL"
    );
    for domain in task::DOMAINS {
        let count = held_out.count(domain);
        let percent = |a: Option<&f64>| a.map_or("-".into(), |a| format!("{:.1}%", 100.0 * a));
        let first = percent(before.as_ref().and_then(|b| b.get(domain)));
        let last = percent(after.get(domain));
        println!("  {domain:<8} {count:>8} {first:>10} {last:>9}");
    }
    println!("summary: {dir}/summary.md\nmetrics: {dir}/metrics.jsonl");
    Ok(())
}

/// The held-out prompts, resolved to their domains, and the reward router that scores them.
struct HeldOut {
    prompts: Vec<Prompt>,
    reward: RewardRouter,
}

impl HeldOut {
    fn new(config: &Config, mut prompts: Vec<Prompt>) -> anyhow::Result<Self> {
        let map = DomainMap::from_config(&config.domains)?;
        for p in &mut prompts {
            map.resolve_prompt(p)?;
        }
        let registry = RewardRegistry::with_builtins();
        let reward = RewardRouter::from_config(&config.domains, &registry)?;
        Ok(Self { prompts, reward })
    }

    /// Scores `answers` (one per held-out prompt) and fails unless every one scores 1.
    async fn check(&self, answers: &[String]) -> anyhow::Result<()> {
        let samples: Vec<Sample> = (self.prompts.iter().zip(answers).enumerate())
            .map(|(i, (p, answer))| {
                let i = i as u64;
                let mut s = Sample::new(SampleId(i), GroupId(i), Arc::new(p.clone()), Vec::new());
                s.text = answer.clone();
                s
            })
            .collect();
        for (s, scored) in samples.iter().zip(self.reward.score_batch(&samples).await) {
            let (domain, id) = (&s.prompt.domain, s.prompt.id);
            let reward = scored.map_err(|e| {
                anyhow::anyhow!("the {domain} worker cannot score held-out prompt {id}: {e}")
            })?;
            anyhow::ensure!(
                reward.score.unwrap_or(reward.value) >= 1.0,
                "the {domain} worker scores the right answer {:?} to held-out prompt {id} \
                 ({:?}) {}: the task and the worker disagree",
                s.text,
                s.prompt.text,
                reward.value
            );
        }
        Ok(())
    }

    fn count(&self, domain: &str) -> usize {
        self.prompts.iter().filter(|p| p.domain == domain).count()
    }

    /// The share of each domain's held-out prompts the run's current model answers right,
    /// greedily: the run's own held-out evaluation, split by domain.
    async fn accuracy(&self, run: &Run) -> anyhow::Result<BTreeMap<String, f64>> {
        let plan = run.plan();
        let mut tokenizer = HfTokenizer::from_dir(&plan.model.dir)?;
        if plan.model.plain_prompts {
            tokenizer = tokenizer.with_chat_template(ChatTemplate::Plain);
        }
        let greedy = SamplingParams {
            temperature: 0.0,
            max_new_tokens: plan.run.eval_max_new_tokens,
            ..SamplingParams::default()
        };
        let actor: Arc<dyn Generate> = run.actor().clone();
        let reward: Arc<dyn RewardWorker> = Arc::new(self.reward.clone());
        let report = evaluate(actor, &tokenizer, reward, &self.prompts, &greedy).await?;
        let mut tally: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for o in &report.outcomes {
            let (solved, all) = tally.entry(o.prompt.domain.clone()).or_default();
            *solved += usize::from(o.solved);
            *all += 1;
        }
        Ok(tally
            .into_iter()
            .map(|(d, (solved, all))| (d, solved as f64 / all as f64))
            .collect())
    }
}
