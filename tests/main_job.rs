//! The main job's parts on CI-sized models: SFT through the `Policy` trait lowers the held-out
//! loss, GRPO with a real `BurnPolicy` raises held-out accuracy, and a run writes its whole
//! directory (exports, held-out prompts, metrics, plots, summary).

use roll::core::config::ConfigLoader;
use roll::prelude::*;

mod common;
use common::{FIXTURE, TINY_NEW_MODEL, first_digit, out_dir};

fn sum(id: u64, a: u64, b: u64) -> Prompt {
    Prompt::new(PromptId(id), format!("Q: {a}+{b}=? A:"), "arithmetic")
        .with_ground_truth((a + b).to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sft_from_scratch_lowers_held_out_loss_and_the_run_writes_its_directory() {
    let out = out_dir("sft");
    let config = ConfigLoader::new()
        .toml_str(format!(
            r#"
            [run]
            max_steps = 2
            output_dir = "{}"
            {TINY_NEW_MODEL}
            [sft]
            batch_size = 16
            learning_rate = 3e-3
            [rollout]
            prompts_per_step = 2
            group_size = 4
            max_new_tokens = 3
            [train]
            learning_rate = 1e-4
            [domains.arithmetic]
            reward = {{ kind = "math_rule", answer = "whole" }}
            "#,
            out.display()
        ))
        .load()
        .expect("config");
    // Training and held-out pairs are disjoint: a ≤ 4 trains, a ≥ 5 is held out.
    let pair = |a: u64, b: u64| SftExample::new(format!("Q: {a}+{b}=? A:"), format!(" {}", a + b));
    let train: Vec<SftExample> = (0..25)
        .cycle()
        .take(320)
        .map(|i| pair(i / 5, i % 5))
        .collect();
    let held_out: Vec<SftExample> = (5..10).map(|a| pair(a, 3)).collect();
    let mut run = RunBuilder::new(config)
        .prompts((0..16).map(|i| sum(i, i % 5, i / 5)))
        .sft_examples(train, held_out)
        .eval_prompts((5..9).map(|a| sum(100 + a, a, 2)))
        .build()
        .expect("build");
    let summary = run.train().await.expect("train");
    let sft = summary.sft.as_ref().expect("an SFT stage");
    assert_eq!(sft.steps, 20);
    assert!(
        sft.eval_loss < sft.eval_loss_start - 0.5,
        "held-out loss {:.3} → {:.3}",
        sft.eval_loss_start,
        sft.eval_loss
    );
    let labels: Vec<&str> = summary.evals.iter().map(|e| e.label.as_str()).collect();
    assert_eq!(labels, ["after SFT", "after RL"]);
    assert_eq!(summary.rl.len(), 2);
    for file in [
        "base_model/tokenizer.json",
        "sft_model/config.json",
        "sft_model/tokenizer.json",
        "final_model/model.safetensors",
        "eval_prompts.jsonl",
        "summary.md",
        "config.toml",
    ] {
        assert!(out.join(file).exists(), "{file}");
    }
    let held: Vec<serde_json::Value> = std::fs::read_to_string(out.join("eval_prompts.jsonl"))
        .expect("held-out prompts")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(
        held[0],
        serde_json::json!({"prompt": "Q: 5+2=? A:", "answer": "7"})
    );
    let stages: Vec<String> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .expect("metrics")
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json")["stage"].to_string())
        .collect();
    assert_eq!(stages.iter().filter(|s| *s == "\"sft\"").count(), 20);
    assert_eq!(stages.iter().filter(|s| *s == "\"rl\"").count(), 2);
    assert!(!summary.plots.is_empty());
    // The SFT export reloads with the weights it was exported with.
    let exported = load_model(out.join("sft_model"), &Device::flex()).expect("reload");
    assert_eq!(exported.vocab_size(), 259);
    let _ = std::fs::remove_dir_all(&out);
}

/// Mean reward of 4 seeded samples (temperature 1) per held-out prompt.
async fn held_out_reward(run: &Run, prompts: &[Prompt]) -> f64 {
    let four: Vec<Prompt> = prompts
        .iter()
        .flat_map(|p| [p.clone(), p.clone(), p.clone(), p.clone()])
        .collect();
    let params = SamplingParams {
        temperature: 1.0,
        max_new_tokens: 2,
        seed: Some(7),
        ..SamplingParams::default()
    };
    let tokenizer = HfTokenizer::from_dir(FIXTURE)
        .expect("tokenizer")
        .with_chat_template(ChatTemplate::Plain);
    let policy: std::sync::Arc<dyn Generate> = run.actor().clone();
    roll::core::pipeline::evaluate(
        policy,
        &tokenizer,
        std::sync::Arc::new(first_digit),
        &four,
        &params,
    )
    .await
    .expect("evaluate")
    .reward_mean()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpo_raises_held_out_reward_of_a_burn_policy() {
    let out = out_dir("grpo");
    let config = ConfigLoader::new()
        .toml_str(format!(
            r#"
            [run]
            max_steps = 20
            output_dir = "{}"
            [model]
            prompt_format = "plain"
            source = {{ kind = "hf_dir", path = "{FIXTURE}" }}
            [rollout]
            prompts_per_step = 4
            group_size = 8
            max_new_tokens = 2
            [train]
            learning_rate = 2e-3
            max_grad_norm = 1.0
            [algorithm.dynamic_filter]
            min_std = 0.0
            [domains.arithmetic]
            reward = {{ kind = "first_digit" }}
            "#,
            out.display()
        ))
        .load()
        .expect("config");
    // Held-out prompts pair the training's first operands with second operands it never uses.
    let held_out: Vec<Prompt> = (0..30).map(|i| sum(1000 + i, 20 + i, 38 + i % 2)).collect();
    let mut run = RunBuilder::new(config)
        .reward("first_digit", first_digit)
        .prompts((0..240).map(|i| sum(i, 20 + i % 30, 30 + i / 30)))
        .build()
        .expect("build");
    let before = held_out_reward(&run, &held_out).await;
    let summary = run.train().await.expect("train");
    let after = held_out_reward(&run, &held_out).await;
    let rewards: Vec<f32> = summary.rl.iter().map(|r| r.reward_mean).collect();
    assert!(
        after >= before + 0.06 && after >= 2.0 * before,
        "held-out reward {before:.3} → {after:.3}; rollout rewards {rewards:?}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
