//! The arithmetic task: `Q: a op b=? A:` prompts answered ` c`, a held-out set disjoint from
//! everything trained on, and an SFT curriculum from small operands to the full range.

use roll::core::rng::{SplitMix64, derive_seed};
use roll::prelude::*;
use serde::Deserialize;
use std::collections::HashSet;

/// `[task]` of the config: every key is read here (unknown keys are refused).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// Operators drawn from: any of `+`, `-`, `*`.
    pub operators: Vec<char>,
    /// Operands are drawn from `0..=max_operand`.
    pub max_operand: u64,
    /// Held-out prompts (never trained on, by SFT or RL).
    pub held_out: usize,
    /// SFT pairs; the stage's steps are `sft_examples × sft.epochs / sft.batch_size`.
    pub sft_examples: usize,
    /// The SFT curriculum: its first stage's share of the pairs uses operands up to its
    /// `max_operand`, and so on; the rest use the full range.
    #[serde(default)]
    pub curriculum: Vec<CurriculumStage>,
    /// RL prompts (the scheduler cycles through them).
    pub rl_prompts: usize,
}

/// One stage of the SFT curriculum.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CurriculumStage {
    /// Share of the SFT pairs in this stage, in `(0, 1]`.
    pub fraction: f64,
    /// Largest operand of this stage.
    pub max_operand: u64,
}

/// One problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Problem {
    a: u64,
    op: char,
    b: u64,
}

impl Problem {
    fn prompt(self) -> String {
        format!("Q: {}{}{}=? A:", self.a, self.op, self.b)
    }

    fn pair(self) -> SftExample {
        SftExample::new(self.prompt(), format!(" {}", self.answer()))
    }

    fn answer(self) -> String {
        let (a, b) = (self.a as i64, self.b as i64);
        match self.op {
            '+' => a + b,
            '-' => a - b,
            _ => a * b,
        }
        .to_string()
    }
}

/// The task's three disjoint datasets, drawn from `seed`.
pub struct Datasets {
    /// Held-out prompts with their answers.
    pub held_out: Vec<Prompt>,
    /// SFT pairs in curriculum order.
    pub sft: Vec<SftExample>,
    /// The first 100 held-out problems as pairs: the SFT stage's held-out loss.
    pub sft_held_out: Vec<SftExample>,
    /// RL prompts with their answers.
    pub rl: Vec<Prompt>,
}

impl Task {
    /// Checks the settings.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.operators.is_empty() && self.operators.iter().all(|o| "+-*".contains(*o)),
            "task.operators: {:?} must be a non-empty list of \"+\", \"-\", \"*\"",
            self.operators
        );
        anyhow::ensure!(self.max_operand >= 1, "task.max_operand must be >= 1");
        let total: f64 = self.curriculum.iter().map(|s| s.fraction).sum();
        anyhow::ensure!(
            self.curriculum.iter().all(|s| s.fraction > 0.0) && total <= 1.0,
            "task.curriculum: fractions must be > 0 and sum to at most 1"
        );
        let space = self.operators.len() as u64 * (self.max_operand + 1).pow(2);
        anyhow::ensure!(
            (self.held_out as u64) * 2 <= space,
            "task.held_out: {} is more than half of the {space} distinct problems",
            self.held_out
        );
        Ok(())
    }

    /// Draws the datasets: the held-out problems first, then SFT and RL problems from the rest.
    pub fn datasets(&self, run_seed: u64) -> Datasets {
        let mut rng = SplitMix64::new(derive_seed(run_seed, "task"));
        let mut draw = |max: u64, ops: &[char]| Problem {
            a: rng.next_u64() % (max + 1),
            op: ops[(rng.next_u64() % ops.len() as u64) as usize],
            b: rng.next_u64() % (max + 1),
        };
        let mut held: HashSet<Problem> = HashSet::new();
        let mut held_out = Vec::with_capacity(self.held_out);
        let mut sft_held_out = Vec::new();
        while held_out.len() < self.held_out {
            let p = draw(self.max_operand, &self.operators);
            if held.insert(p) {
                if sft_held_out.len() < 100 {
                    sft_held_out.push(p.pair());
                }
                held_out.push(prompt(held_out.len() as u64, p));
            }
        }
        // Each curriculum stage ends at its cumulative share of the pairs.
        let mut ends = Vec::new();
        let mut end = 0.0;
        for stage in &self.curriculum {
            end += stage.fraction * self.sft_examples as f64;
            ends.push((end as usize, stage.max_operand.min(self.max_operand)));
        }
        let mut sft = Vec::with_capacity(self.sft_examples);
        while sft.len() < self.sft_examples {
            let max = ends
                .iter()
                .find(|(end, _)| sft.len() < *end)
                .map_or(self.max_operand, |&(_, max)| max);
            let p = draw(max, &self.operators);
            if !held.contains(&p) {
                sft.push(p.pair());
            }
        }
        let mut rl = Vec::with_capacity(self.rl_prompts);
        while rl.len() < self.rl_prompts {
            let p = draw(self.max_operand, &self.operators);
            if !held.contains(&p) {
                rl.push(prompt(rl.len() as u64, p));
            }
        }
        Datasets {
            held_out,
            sft,
            sft_held_out,
            rl,
        }
    }
}

fn prompt(id: u64, p: Problem) -> Prompt {
    Prompt::new(PromptId(id), p.prompt(), "arithmetic").with_ground_truth(p.answer())
}
