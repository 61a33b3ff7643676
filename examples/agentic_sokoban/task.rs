//! Sokoban's two scripted players: the **solver** plays the first move of a shortest solution
//! (breadth-first search over player and box positions); the **wanderer** moves at random.

use crate::warm_start::Game;
use roll::core::rng::SplitMix64;
use roll::env::Sokoban;
use roll::env::grid::Direction;

/// States the solver may visit per move: one-box rooms of the default size need far fewer.
const MAX_STATES: usize = 50_000;

impl Game for Sokoban {
    fn state(&self) -> String {
        self.render()
    }

    fn expert(&self) -> Direction {
        self.solve(MAX_STATES)
            .and_then(|path| path.first().copied())
            .unwrap_or(Direction::Up)
    }

    fn novice(&self, rng: &mut SplitMix64) -> Direction {
        Direction::ALL[(rng.next_u64() % 4) as usize]
    }
}
