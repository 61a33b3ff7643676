//! [`EnvManagerConfig`].

use crate::EnvError;
use roll_core::config::AgenticConfig;
use roll_core::episode::EpisodeConfig;
use std::time::Duration;

/// How the [`EnvManager`](super::EnvManager) plays episodes.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvManagerConfig {
    /// Episodes per group that count: a group is complete with this many finished trajectories,
    /// all on the group's seed. Default `8`. ROLL: `group_size`.
    pub group_size: usize,
    /// Extra episodes started per group; whichever `group_size` finish first form the group and
    /// the rest are aborted (long-tail and failure tolerance). Default `0`.
    /// ROLL: `group_size_redundancy`.
    pub group_size_redundancy: usize,
    /// How one episode is played: turn and token limits, sampling, system prompt, domain.
    pub episode: EpisodeConfig,
    /// Longest an environment may take for one `reset` or `step` (or to be built). Past it the
    /// episode is dropped, the thread abandoned and a fresh environment built. Default 30 s.
    pub step_timeout: Duration,
    /// A busy environment thread that has made no progress (no reset, step or generation
    /// finished) for this long is reported by the watchdog. Default 3600 s. ROLL:
    /// `env_monitor.hung_timeout`.
    pub hung_timeout: Duration,
    /// Environment threads, i.e. episodes played at once. `0` (default): one per episode of a
    /// batch, at most 16 per CPU core — threads mostly wait for the policy, so more threads than
    /// cores keep the inference engine's batch full.
    pub num_threads: usize,
    /// The run seed. The environment seed of group `g` is derived from it and `g`; it is also the
    /// sampling run seed unless `episode.sampling.seed` is set, and each turn's request gets its
    /// own seed derived from that, the group, the episode and the turn
    /// ([`EpisodeIds::turn_seed`](roll_core::episode::EpisodeIds::turn_seed)). The same seed
    /// replays the same rollout (groups without redundancy, where timing cannot choose which
    /// episodes count). Default `42`.
    pub seed: u64,
    /// `0`: synchronous batches. `k ≥ 1`: when a batch is handed over, the next batch's groups
    /// start at once (they play while the policy trains), and a finished group is kept only if
    /// its oldest turn is at most `k` weight versions old. `agentic.max_staleness`.
    pub max_staleness: u64,
    /// Episodes that may fail in a row before [`collect`](super::EnvManager::collect) gives up.
    /// `0` (default): twice the episodes of a batch, at least 8.
    pub max_consecutive_failures: u64,
}

impl Default for EnvManagerConfig {
    fn default() -> Self {
        Self {
            group_size: 8,
            group_size_redundancy: 0,
            episode: EpisodeConfig::default(),
            step_timeout: Duration::from_secs(30),
            hung_timeout: Duration::from_secs(3600),
            num_threads: 0,
            seed: 42,
            max_staleness: 0,
            max_consecutive_failures: 0,
        }
    }
}

impl EnvManagerConfig {
    /// The manager settings of an `[agentic]` config section: group sizes, turn and token limits,
    /// the step timeout and the watchdog's bound; the domain is the environment kind and `seed` seeds groups and sampling.
    ///
    /// # Errors
    /// [`EnvError::InvalidOption`] if `step_timeout` or `hung_timeout` is not a usable number
    /// of seconds.
    pub fn from_agentic(agentic: &AgenticConfig, seed: u64) -> Result<Self, EnvError> {
        let seconds = |key: &'static str, value: f64| {
            Duration::try_from_secs_f64(value)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| EnvError::InvalidOption {
                    key,
                    value: value.to_string(),
                    allowed: "a positive number of seconds".into(),
                })
        };
        let step_timeout = seconds("step_timeout", agentic.step_timeout)?;
        let hung_timeout = seconds("hung_timeout", agentic.hung_timeout)?;
        let mut episode = EpisodeConfig {
            max_turns: agentic.max_turns,
            max_tokens_per_turn: agentic.max_tokens_per_turn,
            domain: agentic.env.kind.clone(),
            ..EpisodeConfig::default()
        };
        episode.sampling.seed = Some(seed);
        Ok(Self {
            group_size: agentic.group_size as usize,
            group_size_redundancy: agentic.group_size_redundancy as usize,
            episode,
            step_timeout,
            hung_timeout,
            seed,
            max_staleness: u64::from(agentic.max_staleness),
            ..Self::default()
        })
    }

    /// Episodes started per group.
    pub(crate) fn episodes_per_group(&self) -> usize {
        self.group_size.saturating_add(self.group_size_redundancy)
    }

    /// Threads for a batch of `episodes` episodes.
    pub(crate) fn threads_for(&self, episodes: usize) -> usize {
        if self.num_threads > 0 {
            return self.num_threads;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        episodes.clamp(1, cores.saturating_mul(16))
    }

    /// Failures in a row tolerated for a batch of `episodes` episodes.
    pub(crate) fn failure_limit(&self, episodes: usize) -> u64 {
        if self.max_consecutive_failures > 0 {
            self.max_consecutive_failures
        } else {
            (episodes as u64).saturating_mul(2).max(8)
        }
    }

    /// How often the manager checks for timeouts and stalls while it waits.
    pub(crate) fn tick(&self) -> Duration {
        (self.step_timeout.min(self.hung_timeout) / 4)
            .clamp(Duration::from_millis(5), Duration::from_secs(1))
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`EnvError::InvalidOption`] naming the first bad field.
    pub fn validate(&self) -> Result<(), EnvError> {
        if self.group_size == 0 {
            return Err(EnvError::InvalidOption {
                key: "group_size",
                value: "0".into(),
                allowed: "an integer ≥ 1".into(),
            });
        }
        for (key, d) in [
            ("step_timeout", self.step_timeout),
            ("hung_timeout", self.hung_timeout),
        ] {
            if d.is_zero() {
                return Err(EnvError::InvalidOption {
                    key,
                    value: "0s".into(),
                    allowed: "a positive duration".into(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roll_core::config::ComponentSpec;

    #[test]
    fn reads_the_agentic_section() {
        let mut a = AgenticConfig::new(ComponentSpec::new("sokoban"));
        a.group_size = 4;
        a.group_size_redundancy = 2;
        a.step_timeout = 0.5;
        let c = EnvManagerConfig::from_agentic(&a, 7).unwrap();
        assert_eq!((c.group_size, c.episodes_per_group()), (4, 6));
        assert_eq!(c.step_timeout, Duration::from_millis(500));
        assert_eq!(
            (c.episode.domain.as_str(), c.episode.sampling.seed),
            ("sokoban", Some(7))
        );
        a.step_timeout = f64::NAN;
        assert!(EnvManagerConfig::from_agentic(&a, 7).is_err());
        assert!(c.threads_for(1000) >= 16 && c.threads_for(3) == 3);
        assert!(EnvManagerConfig { group_size: 0, ..c }.validate().is_err());
    }
}
