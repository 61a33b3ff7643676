//! A run killed with SIGKILL — once in its SFT stage, once in RL — and resumed each time ends
//! exactly where a run never stopped ends: same steps, same prompt position, same rewards, the
//! same weights bit for bit, even with its newest checkpoint corrupted and a metrics line cut
//! short before the last resume.
//!
//! The killed runs are child processes: this test binary started again with `ROLL_RESUME_CHILD`
//! naming the run directory (no harness, so `main` decides which role it plays).

use roll::core::config::ConfigLoader;
use roll::prelude::*;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{TINY_NEW_MODEL, first_digit, out_dir};

const CHILD: &str = "ROLL_RESUME_CHILD";
const RL_STEPS: u64 = 8;

fn config(out: &Path, resume: bool) -> Config {
    ConfigLoader::new()
        .toml_str(format!(
            r#"
            [run]
            seed = 5
            max_steps = {RL_STEPS}
            output_dir = "{}"
            save_every = 2
            keep_checkpoints = 3
            resume = {resume}
            {TINY_NEW_MODEL}
            [sft]
            batch_size = 8
            learning_rate = 3e-3
            save_every = 10
            shuffle = true
            [rollout]
            prompts_per_step = 2
            group_size = 4
            max_new_tokens = 3
            [train]
            learning_rate = 1e-3
            [domains.arithmetic]
            reward = {{ kind = "first_digit" }}
            "#,
            out.display()
        ))
        .load()
        .expect("config")
}

fn sum(id: u64, a: u64, b: u64) -> Prompt {
    Prompt::new(PromptId(id), format!("Q: {a}+{b}=? A:"), "arithmetic")
        .with_ground_truth((a + b).to_string())
}

fn build(out: &Path, resume: bool) -> Run {
    let pair = |a: u64, b: u64| SftExample::new(format!("Q: {a}+{b}=? A:"), format!(" {}", a + b));
    RunBuilder::new(config(out, resume))
        .reward("first_digit", first_digit)
        .prompts((0..64).map(|i| sum(i, i % 7, i / 7)))
        .sft_examples((0..320).map(|i| pair(i % 9, i / 40)), [pair(3, 4)])
        .eval_prompts((0..3).map(|a| sum(100 + a, a, 5)))
        .build()
        .expect("build")
}

fn train(out: &Path, resume: bool) -> (Run, RunSummary) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut run = build(out, resume);
    let summary = runtime.block_on(run.train()).expect("train");
    (run, summary)
}

/// Starts this binary as a child that trains (resuming) in `out`, and kills it with SIGKILL
/// once the checkpoint `wait_for` is complete.
fn kill_after(out: &Path, wait_for: &str) {
    let log = out.with_extension("child.log");
    let mut child = Command::new(std::env::current_exe().expect("own path"))
        .env(CHILD, out)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn the child run");
    let done = out.join("checkpoints").join(wait_for).join("MANIFEST.json");
    let deadline = Instant::now() + Duration::from_secs(600);
    while !done.exists() {
        if let Some(status) = child.try_wait().expect("wait") {
            panic!(
                "the child ended ({status}) before checkpoint {wait_for}:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "no checkpoint {wait_for}");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("reap");
    assert_eq!(
        status.signal(),
        Some(9),
        "the child was to die of SIGKILL, not {status}"
    );
}

fn checkpoint_state(out: &Path, name: &str) -> serde_json::Value {
    let path = out.join("checkpoints").join(name).join("state.json");
    let text = std::fs::read_to_string(&path).expect("state.json");
    serde_json::from_str::<serde_json::Value>(&text).expect("json")["stage"].clone()
}

fn metrics_stages(out: &Path) -> Vec<String> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .expect("metrics")
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("every line parses");
            v["stage"].as_str().unwrap_or_default().to_owned()
        })
        .collect()
}

fn killed_run_resumes_identically() {
    let straight = out_dir("resume-straight");
    let killed = out_dir("resume-killed");
    let (run, expected) = train(&straight, false);
    assert_eq!(run.steps_taken(), RL_STEPS);
    drop(run);

    // Killed in SFT after its second checkpoint (step 20), resumed, killed again in RL after
    // step 4's checkpoint.
    kill_after(&killed, "sft-00000020");
    kill_after(&killed, "rl-00000004");
    // The newest checkpoint is corrupted (one byte of the weights flipped) and the last metrics
    // line is cut short, as a crash in the middle of writing leaves them.
    let newest = std::fs::read_dir(killed.join("checkpoints"))
        .expect("checkpoints")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("rl-"))
        })
        .max()
        .expect("an RL checkpoint");
    let weights = std::fs::read_dir(newest.join("actor"))
        .expect("actor")
        .filter_map(|e| e.ok().map(|e| e.path().join("model.bpk")))
        .find(|p| p.exists())
        .expect("the actor's weights");
    let mut bytes = std::fs::read(&weights).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&weights, bytes).expect("corrupt");
    let metrics = killed.join("metrics.jsonl");
    let mut text = std::fs::read_to_string(&metrics).expect("metrics");
    text.push_str("{\"stage\":\"rl\",\"step\":");
    std::fs::write(&metrics, text).expect("cut line");

    let (run, resumed) = train(&killed, true);
    let from = run.resumed().expect("resumed");
    assert_eq!(from.skipped.len(), 1, "{from:?}");
    assert_eq!(from.skipped[0].path, newest);
    // The one before the newest: an RL checkpoint after some steps (not the stage's start,
    // where nothing of the pipeline's own state would be tested).
    let name = from
        .checkpoint
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    assert!(
        matches!(
            name.as_deref(),
            Some("rl-00000002" | "rl-00000004" | "rl-00000006")
        ),
        "{from:?}"
    );

    assert_eq!(run.steps_taken(), RL_STEPS);
    let rewards = |s: &RunSummary| s.rl.iter().map(|r| r.reward_mean).collect::<Vec<_>>();
    assert_eq!(rewards(&resumed), rewards(&expected));
    // RL had something to learn from (identical weights are not a model that never moved).
    assert!(
        rewards(&expected).iter().any(|r| *r > 0.0 && *r < 1.0),
        "{:?}",
        rewards(&expected)
    );
    assert_eq!(resumed.sft.as_ref().map(|s| s.steps), Some(40));
    let accuracy = |s: &RunSummary| s.evals.iter().map(|e| e.accuracy).collect::<Vec<_>>();
    assert_eq!(accuracy(&resumed), accuracy(&expected));
    // Same prompt position, KL controller and reward moments at the end.
    let last = format!("rl-{RL_STEPS:08}");
    assert_eq!(
        checkpoint_state(&killed, &last),
        checkpoint_state(&straight, &last)
    );
    // The same weights, bit for bit.
    let weights = |out: &Path| {
        std::fs::read(out.join("final_model/model.safetensors")).expect("final weights")
    };
    assert!(
        weights(&killed) == weights(&straight),
        "the resumed run's final weights differ"
    );
    // One metrics line per step and evaluation, as without the kills.
    assert_eq!(metrics_stages(&killed), metrics_stages(&straight));
    for dir in [straight, killed] {
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_file(dir.with_extension("child.log"));
    }
}

fn main() {
    if let Some(out) = std::env::var_os(CHILD) {
        let out = PathBuf::from(out);
        let resume = out.join("checkpoints").exists();
        train(&out, resume);
        return;
    }
    let name = "killed_run_resumes_identically";
    if std::env::args().any(|a| a == "--list") {
        println!("{name}: test");
        return;
    }
    // `cargo test -- <filter>`: run only when the filter matches this test's name.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
        return;
    }
    println!("test {name} ...");
    killed_run_resumes_identically();
    println!("test {name} ... ok");
}
