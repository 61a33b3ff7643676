//! The warm start's data: FrozenLake episodes played by two scripted players, as conversations,
//! and held-out seeds whose maps the warm start never sees.
//!
//! - The **planner** walks a shortest path around the holes (breadth-first search on the map).
//! - The **hole-blind walker** steps toward the goal (a move that shortens the distance, either
//!   when there are two) without looking at the holes.
//!
//! Mixed, they give a policy that knows the way to the goal but is unsure, where a hole lies
//! ahead, between going round it and walking in: the part RL has to learn from rewards.

use roll::core::config::Config;
use roll::core::rng::{SplitMix64, derive_seed};
use roll::core::tokenizer::{ChatMessage, Role};
use roll::env::grid::Direction;
use roll::env::{FrozenLake, FrozenLakeConfig};
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
    /// Share of the warm start's episodes played by the planner, in [0, 1]; the rest by the
    /// hole-blind walker.
    pub planner_share: f64,
    /// Held-out seeds: one greedy episode each after SFT, during and after RL.
    pub held_out: usize,
}

/// The warm start's conversations and the held-out seeds.
pub struct Datasets {
    /// SFT conversations.
    pub sft: Vec<SftExample>,
    /// Conversations for the SFT stage's held-out loss.
    pub sft_held_out: Vec<SftExample>,
    /// Seeds of the held-out evaluation episodes.
    pub eval_seeds: Vec<u64>,
    /// How often the planner and the walker solved their warm-start episodes.
    pub planner_success: f64,
    /// See `planner_success`.
    pub walker_success: f64,
}

impl Task {
    /// Checks the settings.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.sft_episodes > 0, "task.sft_episodes must be at least 1");
        anyhow::ensure!(self.held_out > 0, "task.held_out must be at least 1");
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.planner_share),
            "task.planner_share must be in [0, 1], got {}",
            self.planner_share
        );
        Ok(())
    }

    /// Plays the warm start's episodes and draws the held-out seeds, from the run seed: maps of
    /// held-out seeds are kept out of the warm start.
    pub fn datasets(&self, config: &Config) -> anyhow::Result<Datasets> {
        let agentic = config
            .agentic
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("the example needs an [agentic] section"))?;
        anyhow::ensure!(
            agentic.env.kind == "frozen_lake",
            "agentic.env.kind must be \"frozen_lake\" for this example, got {:?}",
            agentic.env.kind
        );
        let spec = roll::env::AgenticScheduler::env_spec(agentic);
        let lake: FrozenLakeConfig =
            serde_json::from_value(serde_json::Value::Object(spec.options.into_iter().collect()))?;
        let mut env = FrozenLake::new(lake)?;
        let max_turns = agentic.max_turns;

        let mut held_out_rng = SplitMix64::new(derive_seed(config.run.seed, "held-out seeds"));
        let eval_seeds: Vec<u64> = (0..self.held_out).map(|_| held_out_rng.next_u64()).collect();
        let mut held_out_maps = HashSet::new();
        for &seed in &eval_seeds {
            env.reset(seed)?;
            held_out_maps.insert(env.render());
        }

        let mut rng = SplitMix64::new(derive_seed(config.run.seed, "warm start"));
        let wanted = self.sft_episodes + self.sft_held_out;
        let mut conversations = Vec::with_capacity(wanted);
        let (mut solved, mut played) = ([0usize; 2], [0usize; 2]);
        while conversations.len() < wanted {
            let seed = rng.next_u64();
            let first = env.reset(seed)?;
            if held_out_maps.contains(&env.render()) {
                continue;
            }
            let planner = rng.next_f64() < self.planner_share;
            let mut messages = vec![ChatMessage::new(Role::User, first.text)];
            let mut success = false;
            for _ in 0..max_turns {
                let dir = if planner {
                    plan(&env)
                } else {
                    walk_blind(&env, &mut rng)
                };
                messages.push(ChatMessage::new(Role::Assistant, dir.answer()));
                let step = env.step(&dir.answer())?;
                if step.is_done() {
                    success = step.info.get("success").and_then(|v| v.as_bool()) == Some(true);
                    break;
                }
                messages.push(ChatMessage::new(Role::User, step.observation));
            }
            if messages.last().map(|m| m.role) == Some(Role::User) {
                // Truncated by the turn limit: the last observation is not answered.
                messages.pop();
            }
            let who = usize::from(!planner);
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
            planner_success: rate(0),
            walker_success: rate(1),
        })
    }
}

/// The first move of a shortest path around the holes (any move when there is none).
fn plan(env: &FrozenLake) -> Direction {
    env.solve()
        .and_then(|path| path.first().copied())
        .unwrap_or(Direction::Down)
}

/// A move that shortens the distance to the goal, holes or not (either, at random, when two do).
fn walk_blind(env: &FrozenLake, rng: &mut SplitMix64) -> Direction {
    let map = env.map();
    let size = map.size();
    let (r, c) = (env.position() / size, env.position() % size);
    let (gr, gc) = (map.goal() / size, map.goal() % size);
    let mut options = Vec::with_capacity(2);
    if gr > r {
        options.push(Direction::Down);
    } else if gr < r {
        options.push(Direction::Up);
    }
    if gc > c {
        options.push(Direction::Right);
    } else if gc < c {
        options.push(Direction::Left);
    }
    match options.len() {
        0 => Direction::Down,
        n => options[(rng.next_u64() % n as u64) as usize],
    }
}
