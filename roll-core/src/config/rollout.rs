//! `[rollout]`: how many samples are generated per step, how far generation may run ahead of
//! training, and how tokens are sampled.

use serde::{Deserialize, Serialize};

use super::check::Checker;
use crate::Result;

/// `[rollout]`: the shape of one step's generation and the scheduler's limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutConfig {
    /// Prompts per training step, across all domains. Default `128`. ROLL: `rollout_batch_size`.
    pub prompts_per_step: u32,
    /// Samples generated per prompt (the group size `n`). Default `8`.
    /// ROLL: `num_return_sequences_in_group` (ROLL default 1).
    pub group_size: u32,
    /// Most tokens generated per response, in tokens. Default `512`.
    /// ROLL: `actor_infer.generating_args.max_new_tokens`.
    pub max_new_tokens: u32,
    /// How many weight versions generation may run ahead of training: `0` = synchronous (generate,
    /// then train), `k` = a sample may come from a policy up to `k` versions old. Default `0`.
    /// ROLL: `async_generation_ratio`.
    pub max_staleness: u32,
    /// Extra prompts kept in flight beyond `prompts_per_step`, so slow or filtered groups do not
    /// stall a step; leftovers are aborted. Default `0`. ROLL: `max_additional_running_prompts`
    /// (used when `is_use_additional_prompts`).
    pub oversample_prompts: u32,
    /// Most generation requests running at once in the inference engine. Default `128`.
    /// ROLL: `max_running_requests`.
    pub max_running_requests: u32,
    /// How the next token is chosen.
    pub sampling: SamplingConfig,
    /// Name in the log (a warning) every generation or reward call that has waited longer than
    /// this many seconds, with how long it has waited; `0`: off. Default `120`.
    pub hang_warning_s: u64,
    /// In a run across processes, how many of them only generate (disaggregated rollout): the
    /// last `ranks` processes of the job each run an inference engine, the first trains and
    /// runs the controller, and after every step the new weights go to each rollout process
    /// with their version. `0`: generation runs beside the trainer (colocated). A run in one
    /// process refuses any other value. Default `0`. ROLL: `actor_infer.device_mapping` on
    /// devices of its own.
    pub ranks: u32,
    /// With rollout ranks, a mixture of experts' experts divided among groups of this many
    /// consecutive rollout ranks (expert parallelism in the inference engines): each rank keeps
    /// one block of every mixture's experts and serves requests of its own, its mixtures send
    /// each token to the rank holding its expert, and the group's engines step together. A
    /// model whose experts do not fit one rollout process then still generates. Must divide
    /// `ranks`. Colocated (`ranks = 0`), the training ranks that hold the first copy of a
    /// model whose experts they divide (`model.expert_parallel`, which this must equal) generate
    /// together the same way, each engine on its own trainer's block of experts: rank 0's takes
    /// the requests, the others serve their experts' share of its tokens, and after each step
    /// every engine syncs from its own trainer — no weights travel, and no rank holds the whole
    /// model to generate. Needs an MPI library that takes calls from several threads at once
    /// (`MPI_THREAD_MULTIPLE`). `1`: rank 0 generates alone on the whole model, gathered after
    /// each step. Default `1`. ROLL: vLLM's `enable_expert_parallel` on `actor_infer`.
    pub expert_parallel: u32,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        Self {
            prompts_per_step: 128,
            group_size: 8,
            max_new_tokens: 512,
            max_staleness: 0,
            oversample_prompts: 0,
            max_running_requests: 128,
            sampling: SamplingConfig::default(),
            hang_warning_s: 120,
            ranks: 0,
            expert_parallel: 1,
        }
    }
}

impl RolloutConfig {
    /// The rollout's sampling as request parameters: temperature, top-p, top-k, stop strings
    /// and `max_new_tokens`; no seed (each request gets its own).
    pub fn sampling_params(&self) -> crate::policy::SamplingParams {
        let sampling = &self.sampling;
        crate::policy::SamplingParams {
            temperature: sampling.temperature as f32,
            top_p: sampling.top_p as f32,
            top_k: sampling.top_k,
            max_new_tokens: self.max_new_tokens,
            stop_token_ids: Vec::new(),
            stop: sampling.stop.clone(),
            seed: None,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let c = Checker::new("rollout");
        c.at_least("prompts_per_step", self.prompts_per_step.into(), 1)?;
        c.at_least("group_size", self.group_size.into(), 1)?;
        c.at_least("max_new_tokens", self.max_new_tokens.into(), 1)?;
        c.at_least("max_running_requests", self.max_running_requests.into(), 1)?;
        c.at_least("expert_parallel", self.expert_parallel.into(), 1)?;
        // How it divides the ranks: `Config::validate_rollout_experts`, beside `[model]`.
        self.sampling.validate()
    }
}

/// `[rollout.sampling]`: next-token sampling. ROLL: `actor_infer.generating_args`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingConfig {
    /// Softmax temperature; `0` = greedy. Default `1.0`. ROLL: `temperature`.
    pub temperature: f64,
    /// Nucleus sampling: keep the smallest set of tokens whose probability sums to `top_p`,
    /// in (0, 1]. Default `1.0` (off). ROLL: `top_p`.
    pub top_p: f64,
    /// Keep only the `top_k` most likely tokens; unset = all. Default unset. ROLL: `top_k`
    /// (`-1` = off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Strings that end a response when generated (the stop string is kept). Default none.
    /// ROLL: `stop_strings`.
    pub stop: Vec<String>,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            stop: Vec::new(),
        }
    }
}

impl SamplingConfig {
    fn validate(&self) -> Result<()> {
        let c = Checker::new("rollout.sampling");
        c.require(
            self.temperature.is_finite() && self.temperature >= 0.0,
            "temperature",
            self.temperature,
            "a finite number >= 0 (0 = greedy)",
        )?;
        c.require(
            self.top_p > 0.0 && self.top_p <= 1.0,
            "top_p",
            self.top_p,
            "a number in (0, 1]",
        )?;
        if let Some(k) = self.top_k {
            c.at_least("top_k", k.into(), 1)?;
        }
        if let Some(i) = self.stop.iter().position(String::is_empty) {
            return Err(c.invalid(&format!("stop.{i}"), "\"\"", "a non-empty string"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert!(RolloutConfig::default().validate().is_ok());
    }

    #[test]
    fn out_of_range_sampling_names_the_key() {
        let mut rollout = RolloutConfig::default();
        rollout.sampling.top_p = 1.5;
        let err = rollout.validate().expect_err("top_p").to_string();
        assert!(
            err.contains("rollout.sampling.top_p") && err.contains("1.5"),
            "{err}"
        );
        rollout.sampling.top_p = 0.9;
        rollout.sampling.temperature = -0.1;
        let err = rollout.validate().expect_err("temperature").to_string();
        assert!(err.contains("rollout.sampling.temperature"), "{err}");
        rollout.sampling.temperature = 0.0;
        rollout.sampling.stop = vec!["</answer>".into(), String::new()];
        let err = rollout.validate().expect_err("stop").to_string();
        assert!(err.contains("rollout.sampling.stop.1"), "{err}");
    }
}
