//! The agentic pipeline on a real transformer: a run on FrozenLake with the tiny Qwen2 fixture
//! trains, evaluates on held-out seeds and checkpoints, and the trajectories it trains on mask
//! exactly the assistant turns of the conversation the chat template renders.

use roll::backend::HfTokenizer;
use roll::core::config::{ComponentSpec, ConfigLoader};
use roll::core::episode::EpisodeConfig;
use roll::core::tokenizer::{ChatMessage, Role, Tokenizer};
use roll::prelude::*;
use std::sync::Arc;

mod common;
use common::{FIXTURE, out_dir};

fn lake() -> ComponentSpec {
    ComponentSpec::new("frozen_lake")
        .with_option("size", 3)
        .with_option("is_slippery", false)
        .with_option("max_steps", 2)
}

/// An agentic run of the fixture on 3×3 lakes: 2 groups of 2 two-turn episodes a step, with
/// `agentic` added to the `[agentic]` section.
fn lake_run(out: &std::path::Path, max_steps: u64, save_every: u64, agentic: &str) -> Config {
    ConfigLoader::new()
        .toml_str(format!(
            r#"
            pipeline = "agentic"
            [run]
            max_steps = {max_steps}
            output_dir = "{}"
            save_every = {save_every}
            [model.source]
            kind = "hf_dir"
            path = "{FIXTURE}"
            [agentic]
            num_groups = 2
            group_size = 2
            max_turns = 2
            max_tokens_per_turn = 6
            {agentic}
            [agentic.env]
            kind = "frozen_lake"
            size = 3
            is_slippery = false
            max_steps = 2
            "#,
            out.display()
        ))
        .load()
        .expect("config")
}

/// A one-step agentic run of the fixture on plain prompts, one turn per episode, with `run` added
/// to the `[run]` section and `agentic` (the environment included) to `[agentic]`.
fn one_turn_run(out: &std::path::Path, run: &str, agentic: &str) -> Config {
    ConfigLoader::new()
        .toml_str(format!(
            r#"
            pipeline = "agentic"
            [run]
            max_steps = 1
            output_dir = "{}"
            {run}
            [model]
            prompt_format = "plain"
            [model.source]
            kind = "hf_dir"
            path = "{FIXTURE}"
            [agentic]
            max_turns = 1
            {agentic}
            "#,
            out.display()
        ))
        .load()
        .expect("config")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agentic_run_on_frozen_lake_trains_evaluates_and_checkpoints() {
    let out = out_dir("agentic-run");
    let config = lake_run(&out, 2, 1, "");
    let held_out = [1u64 << 63, (1 << 63) + 1, (1 << 63) + 2];
    let mut run = RunBuilder::new(config)
        .eval_seeds(held_out)
        .build()
        .expect("build");
    let summary = run.train().await.expect("train");
    assert_eq!(summary.rl.len(), 2);
    for step in &summary.rl {
        assert!(step.metrics["actor/trained_tokens"] > 0.0, "{step}");
        assert_eq!(step.metrics["rollout/samples_failed"], 0.0);
        assert!(step.metrics["rollout/env_s"] > 0.0, "{step}");
    }
    // Held-out episodes before and after RL, written beside the metrics.
    let labels: Vec<&str> = summary.evals.iter().map(|e| e.label.as_str()).collect();
    assert_eq!(labels, ["base", "after RL"]);
    assert!(summary.evals.iter().all(|e| e.failed == 0));
    let seeds: Vec<u64> =
        serde_json::from_str(&std::fs::read_to_string(out.join("eval_seeds.json")).unwrap())
            .unwrap();
    assert_eq!(seeds, held_out);
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let evals: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v["stage"] == "eval")
        .collect();
    assert_eq!(evals.len(), 2);
    for e in &evals {
        let ended: f64 = ["terminated", "truncated", "context_full"]
            .iter()
            .map(|k| e[format!("ended_{k}")].as_f64().unwrap())
            .sum();
        assert!(
            (ended - 1.0).abs() < 1e-9,
            "every episode ended somehow: {e}"
        );
        assert!(e["episode_len_mean"].as_f64().unwrap() >= 1.0);
    }
    // The agentic scheduler checkpoints: the same config resumed finds the last step's
    // checkpoint and continues from it.
    let resumed = ConfigLoader::new()
        .file(out.join("config.toml"))
        .overrides(["run.resume=true", "run.max_steps=3"])
        .load()
        .expect("the resolved config");
    let mut run = RunBuilder::new(resumed)
        .eval_seeds(held_out)
        .build()
        .expect("resume");
    assert!(run.resumed().is_some(), "a checkpoint was found");
    assert_eq!(run.steps_taken(), 2);
    let report = run.step().await.expect("a step after the resume");
    assert_eq!(report.step, 2);
    let _ = std::fs::remove_dir_all(out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trajectories_mask_exactly_the_assistant_turns_of_the_rendered_conversation() {
    let tokenizer = Arc::new(HfTokenizer::from_dir(FIXTURE).expect("tokenizer"));
    let model = roll::backend::load_model(FIXTURE, &roll::backend::Device::flex()).unwrap();
    let actor = Arc::new(
        BurnPolicy::new(
            model,
            tokenizer.clone() as Arc<dyn Tokenizer>,
            TrainerConfig::default(),
            PolicyOptions::default(),
        )
        .expect("policy"),
    );
    let factory = EnvRegistry::with_builtins().factory(&lake()).unwrap();
    let config = EnvManagerConfig {
        group_size: 3,
        episode: EpisodeConfig {
            max_turns: 2,
            max_tokens_per_turn: 6,
            max_context_tokens: 512,
            sampling: SamplingParams {
                seed: Some(4),
                ..Default::default()
            },
            ..Default::default()
        },
        ..Default::default()
    };
    let mut manager = EnvManager::new(config, factory.clone(), actor.clone(), tokenizer.clone())
        .expect("manager");
    let batch = manager.collect(2).await.expect("collect");
    // Each turn after the first continued from the cache entry the turn before left: the
    // engine computed none of the conversation so far again.
    let reusable: usize = batch
        .groups
        .iter()
        .flat_map(|g| g.samples())
        .flat_map(|traj| {
            let turns = traj.response().segments();
            let prompt = traj.prompt_ids.len();
            (1..turns.len()).map(move |k| prompt + turns[k - 1].end - 1)
        })
        .sum();
    // And every prompt token was computed once or taken from another entry; the group's
    // episodes, which open alike, share more than that.
    let prompted: usize = batch
        .groups
        .iter()
        .flat_map(|g| g.samples())
        .flat_map(|traj| {
            let prompt = traj.prompt_ids.len();
            traj.response()
                .segments()
                .into_iter()
                .map(move |turn| prompt + turn.start)
        })
        .sum();
    assert!(reusable > 0);
    let stats = actor.engine().stats();
    assert!(
        stats.reused_prompt_tokens >= reusable as u64,
        "{} reused, {reusable} expected at least",
        stats.reused_prompt_tokens
    );
    assert_eq!(
        stats.reused_prompt_tokens + stats.prefill_tokens,
        prompted as u64
    );
    let eos = tokenizer.eos_token_id().expect("eos");
    let mut turns_checked = 0;
    for traj in batch.groups.iter().flat_map(|g| g.samples()) {
        let response = traj.response();
        let mask = response.loss_mask();
        let segments = response.segments();
        assert_eq!(
            segments.len(),
            traj.turns().len(),
            "one masked run per turn"
        );
        // Replay the episode: the environment's observations, the agent's decoded actions.
        let mut env = factory.build().unwrap();
        let first = env.reset(traj.prompt.id.0).unwrap();
        let mut messages = vec![ChatMessage::new(Role::User, first.text)];
        let all: Vec<u32> = traj
            .prompt_ids
            .iter()
            .chain(response.ids())
            .copied()
            .collect();
        let offset = traj.prompt_ids.len();
        for (k, seg) in segments.iter().enumerate() {
            assert_eq!(seg, &traj.turns()[k].span);
            // Everything before the turn — generated EOS aside, which the template does not
            // write — is the conversation so far as the template renders it, ending in the
            // generation prompt.
            let context: Vec<u32> = (0..offset + seg.start)
                .filter(|&t| !(t >= offset && mask[t - offset] && all[t] == eos))
                .map(|t| all[t])
                .collect();
            assert_eq!(
                tokenizer.decode(&context).unwrap(),
                tokenizer.render_chat(&messages, true).unwrap(),
                "{}: context of turn {k}",
                traj.id
            );
            // The masked run is the turn's generated tokens and nothing else.
            let generated = &response.ids()[seg.clone()];
            let mut content = generated.len();
            while content > 0 && generated[content - 1] == eos {
                content -= 1;
            }
            let action = tokenizer.decode(&generated[..content]).unwrap();
            assert_eq!(response.logprobs()[seg.clone()].len(), seg.len());
            assert!(response.logprobs()[seg.clone()].iter().all(|l| *l <= 0.0));
            let step = env.step(&action).unwrap();
            messages.push(ChatMessage::new(Role::Assistant, action));
            messages.push(ChatMessage::new(Role::User, step.observation));
            turns_checked += 1;
        }
        // Nothing after the last turn is trained, and everything trained is a turn.
        let trained: usize = segments.iter().map(|s| s.len()).sum();
        assert_eq!(trained, mask.iter().filter(|m| **m).count());
    }
    assert!(turns_checked >= 6, "{turns_checked} turns checked");
}

/// One-turn episodes; one of them hangs in its step for 3 s.
struct Hangs {
    seed: u64,
    hang_on: Arc<std::sync::Mutex<Option<u64>>>,
}

impl roll::core::Env for Hangs {
    fn reset(&mut self, seed: u64) -> roll::core::Result<roll::core::Observation> {
        self.seed = seed;
        // The first seed dealt hangs in the first of its episodes to step; the one that takes
        // its place in the group (same seed) does not.
        let mut hang_on = self.hang_on.lock().expect("the shared seed");
        if hang_on.is_none() {
            *hang_on = Some(seed);
        }
        Ok(roll::core::Observation::new("Q: 1+1=? A:"))
    }

    fn step(&mut self, _action: &str) -> roll::core::Result<roll::core::StepResult> {
        let mut hang_on = self.hang_on.lock().expect("the shared seed");
        if *hang_on == Some(self.seed) {
            *hang_on = Some(u64::MAX);
            drop(hang_on);
            std::thread::sleep(std::time::Duration::from_secs(3));
        }
        Ok(roll::core::StepResult::terminated("done", 1.0).with_info("success", true))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_environment_costs_its_episode_and_the_watchdog_names_it() {
    let out = out_dir("agentic-hang");
    let config = one_turn_run(
        &out,
        "",
        r#"
        env = { kind = "hangs" }
        num_groups = 2
        group_size = 2
        max_tokens_per_turn = 3
        step_timeout = 1.0
        hung_timeout = 0.2
        "#,
    );
    let hang_on = Arc::new(std::sync::Mutex::new(None));
    let incidents = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = incidents.clone();
    let shared = hang_on.clone();
    let mut run = RunBuilder::new(config)
        .env("hangs", move || Hangs {
            seed: 0,
            hang_on: shared.clone(),
        })
        .on_incident(move |i| seen.lock().unwrap().push(i.to_string()))
        .build()
        .expect("build");
    let report = run
        .step()
        .await
        .expect("the step completes without the hung episode");
    assert_eq!(report.groups, 2);
    assert_eq!(report.samples, 4, "{report}");
    assert_eq!(report.metrics["rollout/samples_failed"], 1.0, "{report}");
    assert!(report.metrics["rollout/calls_overdue"] >= 1.0, "{report}");
    let incidents = incidents.lock().unwrap().clone();
    let stalled = incidents
        .iter()
        .find(|i| i.contains("has made no progress in step for"))
        .unwrap_or_else(|| panic!("no stall report in {incidents:#?}"));
    assert!(
        stalled.starts_with("environment `hangs` on thread") && stalled.contains("seed"),
        "{stalled}"
    );
    assert!(
        incidents
            .iter()
            .any(|i| i.contains("did not finish its step within 1s; restarted")),
        "{incidents:#?}"
    );
    let _ = std::fs::remove_dir_all(out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_agentic_run_overlaps_play_and_training_within_the_bound() {
    let out = out_dir("agentic-async");
    let config = lake_run(&out, 2, 2, "max_staleness = 1");
    let mut run = RunBuilder::new(config).build().expect("build");
    let summary = run.train().await.expect("train");
    assert_eq!(summary.rl.len(), 2);
    let mut one_behind = 0.0;
    for step in &summary.rl {
        assert_eq!(step.groups, 2, "{step}");
        assert!(step.metrics["rollout/max_staleness"] <= 1.0, "{step}");
        one_behind += step.metrics["rollout/staleness_1"];
    }
    // The groups of the second step started while the first trained.
    assert!(one_behind > 0.0, "no episode overlapped a training step");
    // The checkpoint lists the next batch's groups, already playing when it was taken.
    let dir = std::fs::read_dir(out.join("checkpoints"))
        .expect("checkpoints")
        .map(|e| e.expect("entry").path())
        .find(|p| p.join("state.json").exists())
        .expect("the last step's checkpoint");
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("state.json")).expect("state"))
            .expect("JSON");
    fn find<'a>(v: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
        match v {
            serde_json::Value::Object(m) => {
                m.get(key).or_else(|| m.values().find_map(|v| find(v, key)))
            }
            _ => None,
        }
    }
    assert_eq!(
        find(&state, "open_groups"),
        Some(&serde_json::json!([4, 5]))
    );
    let _ = std::fs::remove_dir_all(out);
}

/// One-turn episodes scoring the answer's bytes: any two different answers almost surely score
/// differently, so sampled episodes show in the mean score.
struct Bytes;

impl roll::core::Env for Bytes {
    fn reset(&mut self, seed: u64) -> roll::core::Result<roll::core::Observation> {
        Ok(roll::core::Observation::new(format!("Q: {seed}+1=? A:")))
    }

    fn step(&mut self, action: &str) -> roll::core::Result<roll::core::StepResult> {
        let score = action.bytes().map(f32::from).sum::<f32>() / 100.0;
        Ok(roll::core::StepResult::terminated("done", score).with_info("success", score > 1.0))
    }
}

/// `run.eval_temperature`: held-out episodes are also sampled, seeded from the run seed (the
/// same weights score the same twice), the sampled figure is the evaluation's accuracy and the
/// greedy one stands beside it, equal to what a greedy-only evaluation reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_out_episodes_can_be_sampled_at_a_temperature_beside_greedy() {
    let held_out: Vec<u64> = (0..8).map(|i| (1u64 << 62) + i).collect();
    let evaluate = |name: &str, temperature: f64| {
        let out = out_dir(name);
        let config = one_turn_run(
            &out,
            &format!("eval_temperature = {temperature:?}"),
            r#"
            env = { kind = "bytes" }
            max_tokens_per_turn = 4
            "#,
        );
        let held_out = held_out.clone();
        async move {
            let mut run = RunBuilder::new(config)
                .env("bytes", || Bytes)
                .eval_seeds(held_out)
                .build()
                .expect("build");
            let first = run.evaluate("first").await.expect("eval").expect("a point");
            let second = run
                .evaluate("second")
                .await
                .expect("eval")
                .expect("a point");
            let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
            drop(run);
            let _ = std::fs::remove_dir_all(&out);
            (first, second, metrics)
        }
    };
    let (greedy, _, greedy_lines) = evaluate("eval-greedy", 0.0).await;
    let (sampled, again, lines) = evaluate("eval-sampled", 1.0).await;
    assert_eq!(greedy.greedy_accuracy, None);
    assert!(!greedy_lines.contains("greedy_accuracy"));
    assert_eq!(sampled.greedy_accuracy, Some(greedy.accuracy));
    assert!(lines.contains("\"greedy_accuracy\""), "{lines}");
    // Seeded: the same weights draw the same episodes.
    assert_eq!(
        (sampled.accuracy, sampled.reward_mean),
        (again.accuracy, again.reward_mean)
    );
    // And they are drawn: sampled answers do not score as the greedy ones do.
    assert_ne!(sampled.reward_mean, greedy.reward_mean);
}
