//! FrozenLake's two scripted players: the **planner** walks a shortest path round the holes
//! (breadth-first search on the map); the **hole-blind walker** steps toward the goal (a move
//! that shortens the distance, either when two do) without looking at the holes.

use crate::warm_start::Game;
use roll::core::rng::SplitMix64;
use roll::env::FrozenLake;
use roll::env::grid::Direction;

impl Game for FrozenLake {
    fn state(&self) -> String {
        self.render()
    }

    fn expert(&self) -> Direction {
        self.solve()
            .and_then(|path| path.first().copied())
            .unwrap_or(Direction::Down)
    }

    fn novice(&self, rng: &mut SplitMix64) -> Direction {
        let map = self.map();
        let size = map.size();
        let (r, c) = (self.position() / size, self.position() % size);
        let (gr, gc) = (map.goal() / size, map.goal() % size);
        let mut options = Vec::with_capacity(2);
        if gr != r {
            options.push(if gr > r {
                Direction::Down
            } else {
                Direction::Up
            });
        }
        if gc != c {
            options.push(if gc > c {
                Direction::Right
            } else {
                Direction::Left
            });
        }
        match options.len() {
            0 => Direction::Down,
            n => options[(rng.next_u64() % n as u64) as usize],
        }
    }
}
