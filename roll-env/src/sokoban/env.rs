//! The [`Sokoban`] environment itself.

use super::level::MoveOutcome;
use super::{Level, SokobanConfig, generate, solver};
use crate::EnvError;
use crate::action::{extract_action, parse_choice};
use crate::grid::Direction;
use crate::prompt::TurnPrompt;
use crate::wrappers::{EnvExt, Episodic};
use roll_core::episode::STATE_INFO;
use roll_core::{Env, Observation, StepResult};

const ACTIONS: [(&str, Direction); 4] = [
    ("up", Direction::Up),
    ("down", Direction::Down),
    ("left", Direction::Left),
    ("right", Direction::Right),
];
const ANSWER_FORMAT: &str = "Answer with one action as <answer>Right</answer>.";
/// gym-sokoban's rewards.
const STEP_REWARD: f32 = -0.1;
const BOX_ON_TARGET: f32 = 1.0;
const BOX_OFF_TARGET: f32 = -1.0;
const SOLVED: f32 = 10.0;

/// The Sokoban environment (kinds `sokoban`, `larger_sokoban`, `sokoban_vocab`): the puzzle's
/// rules in [`Episodic`] wrappers for `max_steps` and `format_penalty`.
#[derive(Debug, Clone)]
pub struct Sokoban {
    env: Episodic<Puzzle>,
}

/// The rules of the puzzle, without the episode rules the wrappers add.
#[derive(Debug, Clone)]
struct Puzzle {
    config: SokobanConfig,
    instructions: String,
    level: Option<Level>,
    /// Steps since the reset, for the prompt's turn index and actions left.
    steps: u32,
}

impl Sokoban {
    /// An environment with these options; call [`Env::reset`] before stepping.
    ///
    /// # Errors
    /// [`EnvError::InvalidOption`] if an option is out of range.
    pub fn new(config: SokobanConfig) -> Result<Self, EnvError> {
        config.validate()?;
        let legend: Vec<String> = config
            .symbols
            .legend()
            .iter()
            .map(|(c, meaning)| format!("{c}: {meaning}"))
            .collect();
        let instructions = format!(
            "You are solving the Sokoban puzzle. You are the player and you need to push all boxes \
             to targets. When you are right next to a box, you can push it by moving in the same \
             direction. You cannot push a box through a wall, and you cannot pull a box.\n\
             The meaning of each symbol in the state is:\n{}\n\
             Your available actions are:\nUp, Down, Left, Right",
            legend.join(", ")
        );
        let (max_steps, penalty) = (config.max_steps, config.format_penalty);
        let puzzle = Puzzle {
            config,
            instructions,
            level: None,
            steps: 0,
        };
        Ok(Self {
            env: puzzle.episodic("sokoban", max_steps, penalty)?,
        })
    }

    /// The current level (`None` before the first reset).
    pub fn level(&self) -> Option<&Level> {
        self.env.base().level.as_ref()
    }

    /// A shortest solution from the current state, searching at most `max_states` states
    /// (`None` if there is none within that budget, or before the first reset).
    pub fn solve(&self, max_states: usize) -> Option<Vec<Direction>> {
        solver::solve(self.level()?, max_states)
    }

    /// The grid as text with the configured symbols (empty before the first reset).
    pub fn render(&self) -> String {
        self.env.base().render()
    }
}

impl Env for Sokoban {
    fn reset(&mut self, seed: u64) -> roll_core::Result<Observation> {
        self.env.reset(seed)
    }

    fn step(&mut self, action: &str) -> roll_core::Result<StepResult> {
        self.env.step(action)
    }
}

impl Puzzle {
    fn render(&self) -> String {
        self.level
            .as_ref()
            .map(|l| l.render(&self.config.symbols))
            .unwrap_or_default()
    }

    fn prompt(&self, first: bool, feedback: Option<&str>) -> String {
        TurnPrompt {
            instructions: first.then_some(self.instructions.as_str()),
            turn: self.steps + 1,
            feedback,
            observation: &self.render(),
            actions_left: self.config.max_steps.saturating_sub(self.steps),
            answer_format: ANSWER_FORMAT,
        }
        .render()
    }
}

impl Env for Puzzle {
    fn reset(&mut self, seed: u64) -> roll_core::Result<Observation> {
        self.level = Some(generate::generate(&self.config, seed)?);
        self.steps = 0;
        let mut obs = Observation::new(self.prompt(true, None));
        obs.info
            .insert("env_instruction".into(), self.instructions.clone().into());
        obs.info.insert(STATE_INFO.into(), self.render().into());
        Ok(obs)
    }

    /// An unparseable action is a no-op step (−0.1, as any step), marked invalid.
    fn step(&mut self, action: &str) -> roll_core::Result<StepResult> {
        // Only reachable before the first reset if used unguarded.
        let Some(level) = self.level.as_mut() else {
            return Err(EnvError::NotReset {
                env: "sokoban".into(),
            }
            .into());
        };
        self.steps += 1;
        let mut reward = STEP_REWARD;
        let (valid, effective, feedback) = match parse_choice(action, &ACTIONS) {
            None => (
                false,
                false,
                format!(
                    "At turn {}, you did not provide a valid action.",
                    self.steps
                ),
            ),
            Some(dir) => {
                let outcome = level.apply(dir);
                if let MoveOutcome::Pushed {
                    onto_target,
                    off_target,
                } = outcome
                {
                    if onto_target {
                        reward += BOX_ON_TARGET;
                    }
                    if off_target {
                        reward += BOX_OFF_TARGET;
                    }
                }
                let effective = outcome != MoveOutcome::Blocked;
                let what = if effective {
                    "which is effective"
                } else {
                    "which is not effective"
                };
                (
                    true,
                    effective,
                    format!("At turn {}, you moved {dir}, {what}.", self.steps),
                )
            }
        };
        let solved = level.is_solved();
        let boxes_on_target = level.boxes_on_target();
        let observation = self.prompt(false, Some(&feedback));
        let step = if solved {
            StepResult::terminated(observation, reward + SOLVED)
        } else {
            StepResult::running(observation, reward)
        };
        Ok(step
            .with_action_valid(valid)
            .with_info("action_is_effective", effective)
            .with_info("boxes_on_target", boxes_on_target)
            .with_info("success", solved)
            .with_info("action", extract_action(action))
            .with_info(STATE_INFO, self.render()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roll_core::EnvStatus;

    #[test]
    fn the_solver_path_earns_the_solve_bonus() {
        let mut env = Sokoban::new(SokobanConfig {
            max_steps: 200,
            ..SokobanConfig::larger()
        })
        .unwrap();
        let obs = env.reset(3).unwrap();
        assert!(obs.text.contains("Turn 1:") && obs.text.contains("200 actions left"));
        let path = env.solve(1_000_000).unwrap();
        assert!(!path.is_empty());
        let mut total = 0.0;
        let mut last = None;
        for dir in &path {
            let r = env.step(&dir.answer()).unwrap();
            total += r.reward;
            last = Some(r);
        }
        let last = last.unwrap();
        assert_eq!(last.status, EnvStatus::Terminated);
        assert_eq!(last.info["success"], true);
        // Two boxes onto targets (+2) and the bonus, minus 0.1 a step; boxes may go on and
        // off targets in between, which nets zero.
        let expected = 12.0 - 0.1 * path.len() as f32;
        assert!((total - expected).abs() < 1e-3, "{total} vs {expected}");
    }

    #[test]
    fn invalid_actions_cost_the_penalty_and_do_not_move() {
        let mut env = Sokoban::new(SokobanConfig {
            format_penalty: -0.15,
            ..SokobanConfig::different_grid_vocab()
        })
        .unwrap();
        env.reset(9).unwrap();
        let before = env.render();
        assert!(before.contains('A') || before.contains('@'), "{before}");
        let r = env.step("I refuse").unwrap();
        assert!((r.reward - (-0.25)).abs() < 1e-6);
        assert_eq!(r.status, EnvStatus::Running);
        assert_eq!(r.info["action_is_valid"], false);
        assert_eq!(env.render(), before);
        assert!(r.observation.contains("did not provide a valid action"));
    }
}
