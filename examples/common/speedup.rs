//! What the two speedup examples share: timing a run's RL steps, and the table that compares the
//! synchronous run with the asynchronous one.

use roll::prelude::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// The RL steps of one mode.
pub struct Outcome {
    /// Wall-clock time of the steps.
    pub time: Duration,
    /// Each step's mean reward.
    pub rewards: Vec<f32>,
    /// Samples trained on that were generated (partly) on older weights.
    pub stale: u64,
}

/// `STEPS`, the first command-line argument, or `default`.
fn steps_arg(default: u64) -> anyhow::Result<u64> {
    Ok(match std::env::args().nth(1) {
        Some(s) => s.parse()?,
        None => default,
    })
}

/// The example's comparison: `STEPS` (first argument, else `default_steps`) RL steps of the run
/// `build(max_staleness, steps, output_dir)` makes, synchronous (0) then asynchronous (1), timed,
/// and the table (`what` is rewarded). Each run's output directory is removed afterwards.
pub async fn compare(
    name: &str,
    default_steps: u64,
    what: &str,
    build: impl Fn(u32, u64, &Path) -> anyhow::Result<Run>,
) -> anyhow::Result<()> {
    let steps = steps_arg(default_steps)?;
    let mut outcomes = Vec::with_capacity(2);
    for max_staleness in [0, 1] {
        let out = std::env::temp_dir().join(format!("roll-{name}-{max_staleness}"));
        let mut run = build(max_staleness, steps, &out)?;
        outcomes.push(time_steps(&mut run, steps).await?);
        drop(run);
        let _ = std::fs::remove_dir_all(&out);
    }
    print(steps, what, &outcomes[0], &outcomes[1]);
    Ok(())
}

/// Runs and times `steps` RL steps of `run`.
async fn time_steps(run: &mut Run, steps: u64) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let (mut rewards, mut stale) = (Vec::new(), 0);
    for _ in 0..steps {
        let report = run.step().await?;
        rewards.push(report.reward_mean);
        stale += report.rollout.staleness_counts[1..].iter().sum::<u64>();
    }
    Ok(Outcome {
        time: started.elapsed(),
        rewards,
        stale,
    })
}

/// Prints both modes' time, reward at the start and the end (`what` is rewarded), and the
/// speedup.
fn print(steps: u64, what: &str, sync: &Outcome, asynchronous: &Outcome) {
    let ends = |r: &[f32]| {
        let k = r.len().min(5);
        let mean = |s: &[f32]| s.iter().sum::<f32>() / s.len().max(1) as f32;
        (mean(&r[..k]), mean(&r[r.len() - k..]))
    };
    println!(
        "| mode | RL time (s) | s/step | {what} reward, first 5 → last 5 steps | samples ≥ 1 version old |"
    );
    println!("|---|---:|---:|---|---:|");
    for (name, o) in [
        ("sync (max_staleness 0)", sync),
        ("async (max_staleness 1)", asynchronous),
    ] {
        let (first, last) = ends(&o.rewards);
        println!(
            "| {name} | {:.1} | {:.2} | {first:.3} → {last:.3} | {} |",
            o.time.as_secs_f64(),
            o.time.as_secs_f64() / steps as f64,
            o.stale
        );
    }
    println!(
        "\nasync speedup over sync: {:.2}× ({steps} steps each)",
        sync.time.as_secs_f64() / asynchronous.time.as_secs_f64()
    );
}
