//! `[run]`: the identity, length and bookkeeping of one training run.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::check::Checker;
use crate::Result;

/// `[run]`: name, seed, length, outputs, checkpoints and logging cadence of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    /// Name of the experiment, printed in every report line and the run summary. Default
    /// `"roll"`. ROLL: `exp_name`.
    pub name: String,
    /// The one seed of the run: every other seed (sampling, data order, environments, trainer
    /// initialisation) derives from it ([`derive_seed`](crate::rng::derive_seed)). Default `42`.
    /// ROLL: `seed`.
    pub seed: u64,
    /// Number of training steps (one step = one rollout batch and its updates). Default `500`.
    /// ROLL: `max_steps`.
    pub max_steps: u64,
    /// Directory of the run's outputs: the resolved config (`config.toml`) and one JSON line of
    /// metrics per step (`metrics.jsonl`). Default `"./output"`. ROLL: `output_dir`.
    pub output_dir: PathBuf,
    /// Print a report line every this many steps, in steps (>= 1; metrics are recorded every
    /// step). Default `1`. ROLL: `logging_steps`.
    pub log_every: u64,
    /// Evaluate the held-out prompts (greedy) every this many RL steps, besides before the
    /// first and after the last; `0`: only those two. Needs held-out prompts (the run builder's
    /// `eval_prompts`). Default `0`. ROLL: `eval_steps`.
    pub eval_every: u64,
    /// Temperature of the held-out evaluation. `0` (default): greedy answers and episodes.
    /// Above 0: each held-out prompt or episode is also sampled once at this temperature (the
    /// rollout's top-p and top-k, seeds derived from `run.seed`, so every evaluation draws the
    /// same way), and that sampled figure is the evaluation's accuracy, with the greedy one
    /// beside it (`greedy_accuracy`). What RL optimises is the sampling policy: in environments
    /// where a deterministic agent can loop forever the two differ.
    pub eval_temperature: f64,
    /// Save a checkpoint of the whole run (weights, optimiser, data position, RNGs, controller
    /// state, metrics so far) to `<output_dir>/checkpoints/` every this many RL steps and after
    /// the last; `0`: never. Default `0`. ROLL: `save_steps`.
    pub save_every: u64,
    /// Complete checkpoints kept; older ones are deleted once a newer one is written (>= 1).
    /// Default `2` (one to fall back to if the newest turns out unreadable). ROLL:
    /// `max_ckpt_to_keep`.
    pub keep_checkpoints: u32,
    /// Continue from the newest readable checkpoint in `<output_dir>/checkpoints/` (a fresh
    /// start when there is none). Default `false`. ROLL: `resume_from_checkpoint`.
    pub resume: bool,
    /// Write TensorBoard event files (every metric as a scalar, by step) to
    /// `<output_dir>/tensorboard/`, beside `metrics.jsonl`. Default `false`. ROLL:
    /// `track_with = "tensorboard"`.
    pub tensorboard: bool,
    /// Serve the run's metrics in Prometheus' text format at
    /// `http://127.0.0.1:<port>/metrics` while it runs (loopback only); `0` lets the system
    /// pick a free port, which the log names. Default: none (no endpoint). ROLL has no
    /// equivalent.
    pub prometheus_port: Option<u16>,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            name: "roll".to_owned(),
            seed: 42,
            max_steps: 500,
            output_dir: PathBuf::from("./output"),
            log_every: 1,
            eval_every: 0,
            eval_temperature: 0.0,
            save_every: 0,
            keep_checkpoints: 2,
            resume: false,
            tensorboard: false,
            prometheus_port: None,
        }
    }
}

impl RunConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        let c = Checker::new("run");
        c.require(!self.name.is_empty(), "name", "\"\"", "a non-empty string")?;
        c.at_least("max_steps", self.max_steps, 1)?;
        c.require(
            !self.output_dir.as_os_str().is_empty(),
            "output_dir",
            "\"\"",
            "a non-empty path",
        )?;
        c.at_least("log_every", self.log_every, 1)?;
        c.non_negative("eval_temperature", self.eval_temperature)?;
        c.at_least("keep_checkpoints", self.keep_checkpoints.into(), 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert!(RunConfig::default().validate().is_ok());
    }

    #[test]
    fn zero_steps_is_rejected() {
        let run = RunConfig {
            max_steps: 0,
            ..RunConfig::default()
        };
        let err = run.validate().expect_err("max_steps 0").to_string();
        assert!(err.contains("run.max_steps"), "{err}");
    }
}
