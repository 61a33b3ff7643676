//! [`RunSummary`]: what a run did, as numbers and as the `summary.md` table.

use roll_core::pipeline::StepReport;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// One held-out evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalPoint {
    /// When it ran: `base`, `after SFT`, `RL step N`, `after RL`.
    pub label: String,
    /// RL steps taken when it ran.
    pub rl_step: u64,
    /// Fraction of held-out prompts solved (RLVR), or of held-out episodes the environment
    /// reported a success for (agentic).
    pub accuracy: f64,
    /// Mean reward (RLVR) or episode score (agentic).
    pub reward_mean: f64,
    /// Prompts whose generation or reward failed, or episodes that failed.
    pub failed: usize,
    /// Seconds since the run started.
    pub at_s: f64,
    /// Accuracy per domain of an RLVR run's held-out prompts (empty for an agentic run).
    #[serde(default)]
    pub by_domain: BTreeMap<String, f64>,
    /// The greedy accuracy, when `accuracy` is that of answers or episodes sampled at
    /// `run.eval_temperature`; `None` when `accuracy` is the greedy one.
    #[serde(default)]
    pub greedy_accuracy: Option<f64>,
}

/// The SFT stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SftSummary {
    /// Optimiser steps.
    pub steps: u64,
    /// Mean training loss of the first and the last tenth of the steps.
    #[serde(deserialize_with = "nan_from_null")]
    pub loss_first: f64,
    /// See `loss_first`.
    #[serde(deserialize_with = "nan_from_null")]
    pub loss_last: f64,
    /// Held-out loss before the first step (NaN without held-out pairs).
    #[serde(deserialize_with = "nan_from_null")]
    pub eval_loss_start: f64,
    /// Held-out loss at the end (NaN without held-out pairs).
    #[serde(deserialize_with = "nan_from_null")]
    pub eval_loss: f64,
    /// Wall-clock time of the stage.
    pub time: Duration,
}

/// Where the supervised stage is, beyond its dataset position: what its summary is computed
/// from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct SftProgress {
    /// Every step's training loss so far.
    pub losses: Vec<f64>,
    /// The held-out loss before the first step (`None` until measured).
    pub eval_loss_start: Option<f64>,
    /// Time spent in the stage so far.
    pub elapsed: Duration,
}

impl SftProgress {
    /// The stage's summary, with the held-out loss at its end.
    pub(crate) fn summary(&self, eval_loss: f64) -> SftSummary {
        let losses = &self.losses;
        let k = (losses.len() / 10).max(1);
        let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len().max(1) as f64;
        SftSummary {
            steps: losses.len() as u64,
            loss_first: mean(&losses[..k.min(losses.len())]),
            loss_last: mean(&losses[losses.len().saturating_sub(k)..]),
            eval_loss_start: self.eval_loss_start.unwrap_or(f64::NAN),
            eval_loss,
            time: self.elapsed,
        }
    }
}

/// Reads a number that was written as `null` because it was NaN (JSON has no NaN).
fn nan_from_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// A whole run: stages, evaluations, exports.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RunSummary {
    /// `run.name`.
    pub name: String,
    /// The run directory.
    pub run_dir: PathBuf,
    /// The SFT stage, if the run had one.
    pub sft: Option<SftSummary>,
    /// Every RL step's report.
    pub rl: Vec<StepReport>,
    /// Wall-clock time of the RL stage.
    pub rl_time: Duration,
    /// Every held-out evaluation, in order.
    pub evals: Vec<EvalPoint>,
    /// Exported models: (what, directory).
    pub exports: Vec<(String, PathBuf)>,
    /// The plots of `metrics.jsonl`.
    pub plots: Vec<PathBuf>,
    /// Wall-clock time of the run.
    pub total_time: Duration,
}

impl RunSummary {
    /// The evaluation labelled `label`, if it ran.
    pub fn eval(&self, label: &str) -> Option<&EvalPoint> {
        self.evals.iter().find(|e| e.label == label)
    }

    /// Mean RL reward over the first and the last quarter of the steps.
    pub fn rl_reward_first_last(&self) -> Option<(f64, f64)> {
        if self.rl.is_empty() {
            return None;
        }
        let k = (self.rl.len() / 4).max(1);
        let mean = |r: &[StepReport]| {
            r.iter().map(|s| f64::from(s.reward_mean)).sum::<f64>() / r.len() as f64
        };
        Some((mean(&self.rl[..k]), mean(&self.rl[self.rl.len() - k..])))
    }
}

impl fmt::Display for RunSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "# {}\n", self.name)?;
        writeln!(
            f,
            "Run directory `{}`, {:.0} s in all.\n",
            self.run_dir.display(),
            self.total_time.as_secs_f64()
        )?;
        if !self.evals.is_empty() {
            if self.evals.iter().any(|e| e.greedy_accuracy.is_some()) {
                writeln!(f, "## Held-out evaluation (sampled; greedy beside)\n")?;
                writeln!(
                    f,
                    "| when | RL step | solved (sampled) | solved (greedy) | mean reward | failed | at (s) |"
                )?;
                writeln!(f, "|---|---:|---:|---:|---:|---:|---:|")?;
            } else {
                writeln!(f, "## Held-out evaluation (greedy)\n")?;
                writeln!(
                    f,
                    "| when | RL step | solved | mean reward | failed | at (s) |"
                )?;
                writeln!(f, "|---|---:|---:|---:|---:|---:|")?;
            }
            for e in &self.evals {
                let greedy = e
                    .greedy_accuracy
                    .map(|g| format!(" {:.1}% |", 100.0 * g))
                    .unwrap_or_default();
                writeln!(
                    f,
                    "| {} | {} | {:.1}% |{greedy} {:.3} | {} | {:.0} |",
                    e.label,
                    e.rl_step,
                    100.0 * e.accuracy,
                    e.reward_mean,
                    e.failed,
                    e.at_s
                )?;
            }
            writeln!(f)?;
            let domains: Vec<&String> = self
                .evals
                .iter()
                .flat_map(|e| e.by_domain.keys())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            if domains.len() > 1 {
                writeln!(f, "### Solved per domain\n")?;
                let names: Vec<&str> = domains.iter().map(|d| d.as_str()).collect();
                writeln!(f, "| when | {} |", names.join(" | "))?;
                writeln!(f, "|---|{}", "---:|".repeat(domains.len()))?;
                for e in &self.evals {
                    let cells: Vec<String> = domains
                        .iter()
                        .map(|d| match e.by_domain.get(*d) {
                            Some(a) => format!("{:.1}%", 100.0 * a),
                            None => "–".into(),
                        })
                        .collect();
                    writeln!(f, "| {} | {} |", e.label, cells.join(" | "))?;
                }
                writeln!(f)?;
            }
        }
        writeln!(f, "## Stages\n")?;
        writeln!(f, "| stage | steps | time (s) | start → end |")?;
        writeln!(f, "|---|---:|---:|---|")?;
        if let Some(s) = &self.sft {
            writeln!(
                f,
                "| SFT | {} | {:.0} | train loss {:.3} → {:.3}; held-out loss {:.3} → {:.3} |",
                s.steps,
                s.time.as_secs_f64(),
                s.loss_first,
                s.loss_last,
                s.eval_loss_start,
                s.eval_loss
            )?;
        }
        if let Some((first, last)) = self.rl_reward_first_last() {
            writeln!(
                f,
                "| RL | {} | {:.0} | mean rollout reward {first:.3} → {last:.3} (first and last quarter) |",
                self.rl.len(),
                self.rl_time.as_secs_f64(),
            )?;
        }
        if !self.plots.is_empty() {
            writeln!(f, "\n## Plots\n")?;
            for p in &self.plots {
                writeln!(f, "- `{}`", p.display())?;
            }
        }
        if !self.exports.is_empty() {
            writeln!(f, "\n## Exported models (HuggingFace directories)\n")?;
            for (what, dir) in &self.exports {
                writeln!(f, "- {what}: `{}`", dir.display())?;
            }
        }
        Ok(())
    }
}
