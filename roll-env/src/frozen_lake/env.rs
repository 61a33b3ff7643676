//! The [`FrozenLake`] environment itself.

use super::{FrozenLakeConfig, LakeMap, LakeMapKind, Tile};
use crate::EnvError;
use crate::action::{extract_action, parse_choice};
use crate::grid::Direction;
use crate::prompt::TurnPrompt;
use crate::rng::Rng;
use crate::wrappers::{EnvExt, Episodic};
use roll_core::episode::STATE_INFO;
use roll_core::{Env, Observation, StepResult};

const INSTRUCTIONS: &str = "You are solving the FrozenLake puzzle. Avoid the holes and walk to the goal. \
You may slide in an unintended direction on the slippery ice.\n\
The meaning of each symbol in the state is:\n\
P: player, _: empty, O: hole, G: goal, X: player in hole, √: player on goal\n\
Your available actions are:\nLeft, Down, Right, Up";
const ANSWER_FORMAT: &str = "Answer with one action as <answer>Right</answer>.";
const ACTIONS: [(&str, Direction); 4] = [
    ("left", Direction::Left),
    ("down", Direction::Down),
    ("right", Direction::Right),
    ("up", Direction::Up),
];

/// The FrozenLake environment (registered as `frozen_lake`): the lake's rules in [`Episodic`]
/// wrappers for `max_steps` and `format_penalty`.
#[derive(Debug, Clone)]
pub struct FrozenLake {
    env: Episodic<Lake>,
}

/// The rules of the lake, without the episode rules the wrappers add.
#[derive(Debug, Clone)]
struct Lake {
    config: FrozenLakeConfig,
    map: LakeMap,
    position: usize,
    /// Steps since the reset, for the prompt's turn index and actions left.
    steps: u32,
    rng: Rng,
}

impl FrozenLake {
    /// An environment with these options; call [`Env::reset`] before stepping.
    ///
    /// # Errors
    /// [`EnvError::InvalidOption`] if an option is out of range.
    pub fn new(config: FrozenLakeConfig) -> Result<Self, EnvError> {
        config.validate()?;
        let (max_steps, penalty) = (config.max_steps, config.format_penalty);
        let lake = Lake {
            config,
            map: LakeMap::standard_4x4(),
            position: 0,
            steps: 0,
            rng: Rng::new(0, 0),
        };
        Ok(Self {
            env: lake.episodic("frozen_lake", max_steps, penalty)?,
        })
    }

    /// The current map.
    pub fn map(&self) -> &LakeMap {
        &self.env.base().map
    }

    /// The player's cell (row-major index).
    pub fn position(&self) -> usize {
        self.env.base().position
    }

    /// A shortest hole-free path from the player to the goal (optimal on non-slippery ice).
    pub fn solve(&self) -> Option<Vec<Direction>> {
        self.map().shortest_path(self.position())
    }

    /// The grid as text.
    pub fn render(&self) -> String {
        self.env.base().render()
    }
}

impl Env for FrozenLake {
    fn reset(&mut self, seed: u64) -> roll_core::Result<Observation> {
        self.env.reset(seed)
    }

    fn step(&mut self, action: &str) -> roll_core::Result<StepResult> {
        self.env.step(action)
    }
}

impl Lake {
    fn render(&self) -> String {
        let size = self.map.size();
        let mut s = String::with_capacity(size * (size + 1) * 2);
        for cell in 0..size * size {
            if cell > 0 && cell % size == 0 {
                s.push('\n');
            }
            let tile = self.map.tile(cell).unwrap_or(Tile::Frozen);
            s.push(match (cell == self.position, tile) {
                (true, Tile::Hole) => 'X',
                (true, Tile::Goal) => '√',
                (true, _) => 'P',
                (false, Tile::Hole) => 'O',
                (false, Tile::Goal) => 'G',
                (false, _) => '_',
            });
        }
        s
    }

    fn prompt(&self, instructions: bool, feedback: Option<&str>) -> String {
        TurnPrompt {
            instructions: instructions.then_some(INSTRUCTIONS),
            turn: self.steps + 1,
            feedback,
            observation: &self.render(),
            actions_left: self.config.max_steps.saturating_sub(self.steps),
            answer_format: ANSWER_FORMAT,
        }
        .render()
    }

    /// Where a move in `dir` actually goes on (possibly slippery) ice.
    fn slide(&mut self, dir: Direction) -> Direction {
        if !self.config.is_slippery || self.rng.chance(self.config.slip_success) {
            return dir;
        }
        dir.perpendicular()[self.rng.below(2)]
    }
}

impl Env for Lake {
    fn reset(&mut self, seed: u64) -> roll_core::Result<Observation> {
        self.rng = Rng::new(seed, 0xF207);
        self.map = match self.config.map {
            LakeMapKind::Random => LakeMap::random(self.config.size, self.config.p, &mut self.rng),
            LakeMapKind::Standard4x4 => LakeMap::standard_4x4(),
            LakeMapKind::Standard8x8 => LakeMap::standard_8x8(),
        };
        self.position = self.map.start();
        self.steps = 0;
        let mut obs = Observation::new(self.prompt(true, None));
        obs.info
            .insert("env_instruction".into(), INSTRUCTIONS.into());
        obs.info.insert(STATE_INFO.into(), self.render().into());
        Ok(obs)
    }

    /// An unparseable action is a no-op with reward 0, marked invalid.
    fn step(&mut self, action: &str) -> roll_core::Result<StepResult> {
        self.steps += 1;
        let content = extract_action(action);
        let Some(dir) = parse_choice(action, &ACTIONS) else {
            let feedback = format!(
                "At turn {}, you did not provide a valid action.",
                self.steps
            );
            return Ok(
                StepResult::running(self.prompt(false, Some(&feedback)), 0.0)
                    .with_action_valid(false)
                    .with_info("action_is_effective", false)
                    .with_info("success", false)
                    .with_info("action", content)
                    .with_info(STATE_INFO, self.render()),
            );
        };
        let actual = self.slide(dir);
        let before = self.position;
        self.position = self.map.next_cell(self.position, actual);
        let effective = before != self.position;
        let what = if effective {
            "which is effective"
        } else {
            "which is not effective"
        };
        let feedback = format!("At turn {}, you moved {dir}, {what}.", self.steps);
        let observation = self.prompt(false, Some(&feedback));
        let tile = self.map.tile(self.position);
        let success = tile == Some(Tile::Goal);
        let step = if success {
            StepResult::terminated(observation, 1.0)
        } else if tile == Some(Tile::Hole) {
            StepResult::terminated(observation, 0.0)
        } else {
            StepResult::running(observation, 0.0)
        };
        Ok(step
            .with_action_valid(true)
            .with_info("action_is_effective", effective)
            .with_info("moved", actual.name())
            .with_info("success", success)
            .with_info("action", content)
            .with_info(STATE_INFO, self.render()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roll_core::EnvStatus;

    fn lake(options: FrozenLakeConfig) -> FrozenLake {
        FrozenLake::new(options).unwrap()
    }

    #[test]
    fn standard_map_renders_like_roll_and_walks_to_the_goal() {
        let mut env = lake(FrozenLakeConfig {
            map: LakeMapKind::Standard4x4,
            is_slippery: false,
            ..Default::default()
        });
        let obs = env.reset(0).unwrap();
        assert!(obs.text.contains("P___\n_O_O\n___O\nO__G"), "{}", obs.text);
        assert!(obs.text.contains("Turn 1:") && obs.text.contains("20 actions left"));
        let path = env.solve().unwrap();
        let mut last = None;
        for dir in path {
            last = Some(env.step(&dir.answer()).unwrap());
        }
        let last = last.unwrap();
        assert_eq!((last.reward, last.status), (1.0, EnvStatus::Terminated));
        assert!(last.observation.contains('√'));
        assert!(env.step("<answer>Up</answer>").is_err());
    }

    #[test]
    fn a_hole_terminates_with_zero_and_the_step_limit_truncates() {
        let mut env = lake(FrozenLakeConfig {
            map: LakeMapKind::Standard4x4,
            is_slippery: false,
            max_steps: 2,
            ..Default::default()
        });
        env.reset(0).unwrap();
        env.step("Action: right").unwrap();
        let r = env.step("Action: down").unwrap();
        assert_eq!((r.reward, r.status), (0.0, EnvStatus::Terminated));
        assert!(r.observation.contains('X'));
        env.reset(0).unwrap();
        env.step("Action: left").unwrap();
        let r = env.step("Action: up").unwrap();
        assert_eq!(r.status, EnvStatus::Truncated);
        assert_eq!(r.info["action_is_effective"], false);
    }

    #[test]
    fn slippery_ice_sometimes_slides_sideways() {
        let mut env = lake(FrozenLakeConfig {
            size: 8,
            ..Default::default()
        });
        let mut slid = 0;
        for seed in 0..50 {
            env.reset(seed).unwrap();
            let r = env.step("<answer>Down</answer>").unwrap();
            if r.info["moved"] != "Down" {
                slid += 1;
            }
        }
        assert!((15..=45).contains(&slid), "{slid}");
    }
}
