//! Both pipelines, built from a config by `RunBuilder`, on a real `BurnPolicy` (the tiny Qwen2
//! fixture), with a user's own reward closure and a user's own environment.

use roll::core::config::ConfigLoader;
use roll::prelude::*;

mod common;
use common::{FIXTURE, first_digit, out_dir, sums, tiny_rlvr_toml};

fn load(toml: &str, overrides: &[&str]) -> roll::core::Result<Config> {
    ConfigLoader::new()
        .toml_str(toml)
        .overrides(overrides.iter().copied())
        .load()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlvr_trains_a_burn_policy_from_a_config_and_writes_the_run_directory() {
    let out = out_dir("rlvr");
    let config = load(&tiny_rlvr_toml(&out), &[]).expect("config");
    let mut run = RunBuilder::new(config.clone())
        .reward("first_digit", first_digit)
        .prompts(sums())
        .build()
        .expect("build");
    let reports = run.train().await.expect("train").rl;
    assert_eq!(reports.len(), 2);
    assert_eq!(run.actor().weight_version(), WeightVersion(2));
    for r in &reports {
        assert_eq!(r.samples, 8, "{r}");
        // The probe's engine log-probs and the training forward's agree.
        let gap = r.metrics["actor/train_infer_logprob_gap"];
        assert!(gap < 1e-3, "gap {gap}");
        assert_eq!(r.metrics["actor/epochs"], 1.0);
    }
    let lines = std::fs::read_to_string(out.join("metrics.jsonl")).expect("metrics");
    assert_eq!(lines.lines().count(), 2);
    let first: serde_json::Value =
        serde_json::from_str(lines.lines().next().unwrap_or("")).expect("json");
    assert_eq!((&first["stage"], &first["step"]), (&"rl".into(), &0.into()));
    assert!(out.join("final_model/config.json").exists());
    assert!(out.join("summary.md").exists());
    let resolved = Config::from_file(out.join("config.toml")).expect("the resolved config loads");
    assert_eq!(resolved, config);
    // The trained policy exports beside the source's files and loads back as what it generates.
    let exported = out.join("model");
    run.export(&exported).expect("export");
    let reloaded = load_model(&exported, &Device::flex()).expect("reload");
    let request = roll::core::policy::ScoreRequest {
        sequences: vec![roll::core::policy::ScoreSequence {
            prompt_ids: vec![5, 6, 7],
            response_ids: vec![8, 9],
        }],
        ..Default::default()
    };
    let scored = roll::backend::score(
        &reloaded,
        None,
        &request,
        &Default::default(),
        &Device::flex(),
    )
    .expect("score");
    let live = run.actor().score(&request).await.expect("live score");
    for (a, b) in scored[0].logprobs.iter().zip(&live[0].logprobs) {
        assert!((a - b).abs() < 1e-5, "exported {a} vs live {b}");
    }
    for file in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        assert_eq!(
            std::fs::read(exported.join(file)).expect(file),
            std::fs::read(std::path::Path::new(FIXTURE).join(file)).expect(file),
            "{file}"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recomputed_old_logprobs_and_the_train_inference_correction_run() {
    let out = out_dir("correction");
    let config = load(
        &tiny_rlvr_toml(&out),
        &[
            "run.max_steps=1",
            "train.recompute_old_logprobs=true",
            "algorithm.objective.train_infer_correction.is_weight.upper_bound=1.5",
            "train.ppo_epochs=2",
        ],
    )
    .expect("config");
    let mut run = RunBuilder::new(config)
        .reward("first_digit", first_digit)
        .prompts(sums())
        .build()
        .expect("build");
    let report = run.step().await.expect("step");
    // Two epochs, one weight sync.
    assert_eq!(report.metrics["actor/epochs"], 2.0);
    assert_eq!(run.actor().weight_version(), WeightVersion(1));
    // The correction saw rollout log-probs next to recomputed ones: on the CPU they agree.
    let diff = report.metrics["actor/train_infer/max_abs_diff"];
    assert!(
        diff.is_finite() && diff < 1e-3,
        "max |train − infer| {diff}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn an_rlvr_run_without_prompts_or_with_an_unknown_reward_is_refused() {
    let out = out_dir("refused");
    let config = load(&tiny_rlvr_toml(&out), &[]).expect("config");
    let err = RunBuilder::new(config.clone())
        .reward("first_digit", first_digit)
        .build()
        .err()
        .expect("no prompts")
        .to_string();
    assert!(err.contains("prompts"), "{err}");
    let err = RunBuilder::new(config)
        .prompts(sums())
        .build()
        .err()
        .expect("unknown reward kind")
        .to_string();
    assert!(err.contains("first_digit"), "{err}");
    let _ = std::fs::remove_dir_all(&out);
}

/// A user's environment: guess the digit the seed picks; "higher"/"lower" hints.
struct Guess {
    target: u64,
}

impl Env for Guess {
    fn reset(&mut self, seed: u64) -> roll::core::Result<Observation> {
        self.target = seed % 10;
        Ok(Observation::new(
            "Guess a digit from 0 to 9. Answer with the digit only.",
        ))
    }
    fn step(&mut self, action: &str) -> roll::core::Result<StepResult> {
        Ok(match action.trim().parse::<u64>() {
            Ok(g) if g == self.target => StepResult::terminated("Correct!", 1.0),
            Ok(g) if g < self.target => StepResult::running("Higher.", 0.0),
            Ok(_) => StepResult::running("Lower.", 0.0),
            Err(_) => StepResult::running("Answer with one digit.", -0.1),
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agentic_trains_a_burn_policy_on_a_users_environment() {
    let out = out_dir("agentic");
    let config = load(
        &format!(
            r#"
            pipeline = "agentic"
            [run]
            max_steps = 1
            output_dir = "{out}"
            [model]
            source = {{ kind = "hf_dir", path = "{FIXTURE}" }}
            [train]
            learning_rate = 1e-4
            [agentic]
            num_groups = 2
            group_size = 2
            max_turns = 2
            max_tokens_per_turn = 4
            env = {{ kind = "guess" }}
            "#,
            out = out.display()
        ),
        &[],
    )
    .expect("config");
    let mut run = RunBuilder::new(config)
        .env("guess", || Guess { target: 0 })
        .build()
        .expect("build");
    let reports = run.train().await.expect("train").rl;
    assert_eq!(reports[0].groups, 2);
    assert_eq!(reports[0].samples, 4);
    assert!(reports[0].trained_tokens > 0);
    assert_eq!(run.actor().weight_version(), WeightVersion(1));
    let _ = std::fs::remove_dir_all(&out);
}

/// The example config files run as shipped (made small by overrides): every setting that
/// validates also runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_configs_run() {
    let root = env!("CARGO_MANIFEST_DIR");
    let source = format!("model.source.path=\"{FIXTURE}\"");
    let out = out_dir("examples");
    let output = format!("run.output_dir=\"{}\"", out.display());

    let rlvr = ConfigLoader::new()
        .file(format!("{root}/examples/configs/rlvr_tiny.toml"))
        .overrides([
            source.as_str(),
            output.as_str(),
            "run.max_steps=1",
            "train.warmup_steps=0",
            "rollout.prompts_per_step=4",
            "rollout.group_size=2",
            "rollout.max_new_tokens=4",
        ])
        .load()
        .expect("rlvr_tiny.toml");
    // Two dataset tags, one per configured domain: math answers and the `A: 47` format.
    let dataset = (0..16u64).map(|i| {
        let tag = if i % 2 == 0 { "arithmetic" } else { "format" };
        Prompt::new(PromptId(i), format!("Q: {i}+{i}=? A:"), tag)
            .with_ground_truth((2 * i).to_string())
    });
    let mut run = RunBuilder::new(rlvr)
        .prompts(dataset)
        .build()
        .expect("build rlvr");
    let report = run.step().await.expect("rlvr step");
    assert_eq!(report.groups, 4);

    // The agentic examples' configs: a model from scratch with a learned tokenizer, a
    // multi-turn warm start, GiGPO, held-out seeds.
    for file in ["agentic_frozen_lake.toml", "agentic_sokoban.toml"] {
        agentic_example_config_runs(&format!("{root}/examples/configs/{file}"), &output).await;
    }
    let _ = std::fs::remove_dir_all(&out);
}

async fn agentic_example_config_runs(path: &str, output: &str) {
    let config = ConfigLoader::new()
        .file(path)
        .overrides([
            output,
            "run.max_steps=2",
            "run.eval_every=1",
            "run.save_every=0",
            "train.warmup_steps=0",
            "sft.warmup_steps=0",
            "model.source.hidden_size=32",
            "model.source.intermediate_size=64",
            "model.source.num_hidden_layers=1",
            "model.source.tokenizer.vocab_size=300",
            "agentic.num_groups=2",
            "agentic.group_size=2",
            "agentic.max_turns=2",
        ])
        .load()
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let episode = |first: &str, second: &str| {
        SftExample::conversation([
            ChatMessage::new(Role::User, first),
            ChatMessage::new(Role::Assistant, "<answer>Right</answer>"),
            ChatMessage::new(Role::User, second),
            ChatMessage::new(Role::Assistant, "<answer>Down</answer>"),
        ])
    };
    let warm_start: Vec<SftExample> = (0..8)
        .map(|i| episode(&format!("Turn 1:\nP_G {i}"), &format!("Turn 2:\n_PG {i}")))
        .collect();
    let mut run = RunBuilder::new(config)
        .sft_examples(warm_start, [episode("Turn 1:\nP__", "Turn 2:\n_P_")])
        .eval_seeds([7, 8])
        .build()
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let summary = run.train().await.expect("the agentic example trains");
    assert_eq!(summary.rl.len(), 2);
    assert!(summary.sft.is_some());
    assert_eq!(summary.evals.len(), 3, "after SFT, RL step 1, after RL");
}
