//! What the agentic examples share: the command line, a warm start of scripted episodes as SFT
//! conversations, held-out seeds kept out of it, and the run.
//!
//! Each example brings an environment and two scripted players: an **expert** (a planner or a
//! solver) and a **novice** (a player with a blind spot). Mixed, they give a warm-started policy
//! that knows the game's moves but not always the right one: the part RL learns from rewards.

use roll::core::config::Config;
use roll::core::rng::{SplitMix64, derive_seed};
use roll::core::tokenizer::{ChatMessage, Role};
use roll::env::grid::Direction;
use roll::prelude::*;
use serde::Deserialize;
use std::collections::HashSet;

/// `[task]` of the config: every key is read here (unknown keys are refused).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// Episodes of the warm start (SFT).
    pub sft_episodes: usize,
    /// Episodes whose loss the SFT stage reports as its held-out loss.
    pub sft_held_out: usize,
    /// Share of the warm start's episodes the expert plays, in [0, 1]; the novice plays the rest.
    pub expert_share: f64,
    /// Held-out seeds: one episode each (greedy, and sampled with `run.eval_temperature`) after
    /// SFT, during and after RL.
    pub held_out: usize,
}

/// A game the warm start can play: an environment whose state the players can read.
pub trait Game: Env {
    /// The state as text: two seeds with equal renderings are the same puzzle.
    fn state(&self) -> String;
    /// The expert's next move.
    fn expert(&self) -> Direction;
    /// The novice's next move.
    fn novice(&self, rng: &mut SplitMix64) -> Direction;
}

/// The warm start's conversations and the held-out seeds.
pub struct Datasets {
    /// SFT conversations.
    pub sft: Vec<SftExample>,
    /// Conversations for the SFT stage's held-out loss.
    pub sft_held_out: Vec<SftExample>,
    /// Seeds of the held-out evaluation episodes.
    pub eval_seeds: Vec<u64>,
    /// How often the expert and the novice solved their warm-start episodes.
    pub success: [f64; 2],
}

/// The options of the environment `kind` that `config` plays (`agentic.env`, with the section's
/// format penalty filled in), as the environment's own options type.
pub fn env_options<T: serde::de::DeserializeOwned>(
    config: &Config,
    kind: &str,
) -> anyhow::Result<T> {
    let agentic = config
        .agentic
        .as_ref()
        .filter(|a| a.env.kind == kind)
        .ok_or_else(|| anyhow::anyhow!("this example plays `agentic.env.kind = \"{kind}\"`"))?;
    let options = roll::env::AgenticScheduler::env_spec(agentic).options;
    Ok(serde_json::from_value(serde_json::to_value(options)?)?)
}

impl Task {
    /// Checks the settings.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.sft_episodes > 0,
            "task.sft_episodes must be at least 1"
        );
        anyhow::ensure!(self.held_out > 0, "task.held_out must be at least 1");
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.expert_share),
            "task.expert_share must be in [0, 1], got {}",
            self.expert_share
        );
        Ok(())
    }

    /// Plays the warm start's episodes on `game` and draws the held-out seeds, all from the run
    /// seed; puzzles of held-out seeds are kept out of the warm start.
    pub fn datasets(&self, game: &mut impl Game, config: &Config) -> anyhow::Result<Datasets> {
        let max_turns = config.agentic.as_ref().map_or(10, |a| a.max_turns);
        let mut held_out_rng = SplitMix64::new(derive_seed(config.run.seed, "held-out seeds"));
        let eval_seeds: Vec<u64> = (0..self.held_out)
            .map(|_| held_out_rng.next_u64())
            .collect();
        let mut held_out = HashSet::new();
        for &seed in &eval_seeds {
            game.reset(seed)?;
            held_out.insert(game.state());
        }
        let mut rng = SplitMix64::new(derive_seed(config.run.seed, "warm start"));
        let wanted = self.sft_episodes + self.sft_held_out;
        let mut conversations = Vec::with_capacity(wanted);
        let (mut solved, mut played) = ([0usize; 2], [0usize; 2]);
        while conversations.len() < wanted {
            let seed = rng.next_u64();
            let first = game.reset(seed)?;
            if held_out.contains(&game.state()) {
                continue;
            }
            let expert = rng.next_f64() < self.expert_share;
            let mut messages = vec![ChatMessage::new(Role::User, first.text)];
            let mut success = false;
            for _ in 0..max_turns {
                let dir = if expert {
                    game.expert()
                } else {
                    game.novice(&mut rng)
                };
                messages.push(ChatMessage::new(Role::Assistant, dir.answer()));
                let step = game.step(&dir.answer())?;
                if step.is_done() {
                    success = step.info.get("success").and_then(|v| v.as_bool()) == Some(true);
                    break;
                }
                messages.push(ChatMessage::new(Role::User, step.observation));
            }
            if messages.last().map(|m| m.role) == Some(Role::User) {
                // Cut by the turn limit: the last observation is not answered.
                messages.pop();
            }
            let who = usize::from(!expert);
            played[who] += 1;
            solved[who] += usize::from(success);
            conversations.push(SftExample::conversation(messages));
        }
        let sft_held_out = conversations.split_off(self.sft_episodes);
        let rate = |i: usize| solved[i] as f64 / played[i].max(1) as f64;
        Ok(Datasets {
            sft: conversations,
            sft_held_out,
            eval_seeds,
            success: [rate(0), rate(1)],
        })
    }
}

/// Builds the run (SFT on the warm start, then RL, evaluated on the held-out seeds) and trains.
pub async fn train(config: Config, data: Datasets, players: [&str; 2]) -> anyhow::Result<()> {
    println!(
        "warm start: {} episodes ({} solves {:.0}%, {} {:.0}%); {} held-out seeds",
        data.sft.len(),
        players[0],
        100.0 * data.success[0],
        players[1],
        100.0 * data.success[1],
        data.eval_seeds.len()
    );
    let run = RunBuilder::new(config)
        .sft_examples(data.sft, data.sft_held_out)
        .eval_seeds(data.eval_seeds);
    crate::cli::train(run).await
}
