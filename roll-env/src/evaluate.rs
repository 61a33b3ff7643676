//! Held-out evaluation of a policy on an environment: one episode per seed, played on a pool of
//! threads so that the policy's engine sees many requests at once.

use crate::wrappers::CallTimeout;
use crate::{EnvError, EnvFactory};
use roll_core::episode::{EpisodeConfig, EpisodeIds, play_episode};
use roll_core::policy::Generate;
use roll_core::{AbortSignal, GroupId, SampleId, Tokenizer};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

/// One evaluated episode.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeOutcome {
    /// The environment seed.
    pub seed: u64,
    /// Sum of the step rewards (0 for a failed episode).
    pub score: f32,
    /// Whether the environment reported success on the last step (its `success` info, as the
    /// bundled environments and ROLL's report it); `false` for a failed episode or an environment
    /// that reports none.
    pub success: bool,
    /// Assistant turns played.
    pub turns: usize,
    /// How the episode ended (`terminated`, `truncated`, `context_full`, `aborted`; `failed`
    /// for a failed episode).
    pub end: String,
    /// Why the episode failed (the environment, the policy or a panic), if it did.
    pub error: Option<String>,
}

/// The outcomes of an evaluation, in seed order.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeEval {
    /// One per seed.
    pub outcomes: Vec<EpisodeOutcome>,
    /// Wall-clock time.
    pub time: Duration,
}

impl EpisodeEval {
    /// Fraction of episodes that succeeded (failed episodes count as unsuccessful).
    pub fn success_rate(&self) -> f64 {
        self.mean(|o| f64::from(u8::from(o.success)))
    }

    /// Mean episode score.
    pub fn score_mean(&self) -> f64 {
        self.mean(|o| f64::from(o.score))
    }

    /// Mean turns per episode.
    pub fn turns_mean(&self) -> f64 {
        self.mean(|o| o.turns as f64)
    }

    /// Fraction of episodes that ended `how` (see [`EpisodeOutcome::end`]).
    pub fn ended(&self, how: &str) -> f64 {
        self.mean(|o| f64::from(u8::from(o.end == how)))
    }

    /// Episodes that failed.
    pub fn failed(&self) -> usize {
        self.outcomes.iter().filter(|o| o.error.is_some()).count()
    }

    fn mean(&self, f: impl Fn(&EpisodeOutcome) -> f64) -> f64 {
        if self.outcomes.is_empty() {
            return 0.0;
        }
        self.outcomes.iter().map(f).sum::<f64>() / self.outcomes.len() as f64
    }
}

/// Plays one episode per seed of `seeds` with `policy` under `episode` (pass greedy sampling,
/// `temperature = 0`, for a deterministic evaluation) on up to `threads` threads, each with its
/// own environment from `factory`.
///
/// An environment that fails, panics, or takes longer than `step_timeout` in a reset or step
/// costs its episode (recorded with the error; its thread builds a fresh environment), never the
/// evaluation: each environment runs behind a [`CallTimeout`], and one that hangs is abandoned
/// on its own thread. (A generation that never returns is the engine's to bound.)
///
/// # Errors
/// [`EnvError::NoRuntime`] outside a tokio runtime; [`EnvError::Spawn`] if no thread starts.
pub async fn evaluate_episodes(
    policy: Arc<dyn Generate>,
    tokenizer: Arc<dyn Tokenizer>,
    factory: &EnvFactory,
    seeds: &[u64],
    episode: &EpisodeConfig,
    threads: usize,
    step_timeout: Duration,
) -> Result<EpisodeEval, EnvError> {
    let runtime = Handle::try_current().map_err(|_| EnvError::NoRuntime)?;
    let started = Instant::now();
    let threads = threads.clamp(1, seeds.len().max(1));
    let (seeds, factory, episode) = (seeds.to_vec(), factory.clone(), episode.clone());
    // Off the runtime: the threads block on it for their generations.
    let outcomes = tokio::task::spawn_blocking(move || {
        let next = AtomicUsize::new(0);
        let job = Job {
            runtime,
            policy,
            tokenizer,
            factory,
            episode,
            step_timeout,
            seeds: &seeds,
            next: &next,
        };
        let mut outcomes: Vec<Option<EpisodeOutcome>> = vec![None; seeds.len()];
        std::thread::scope(|scope| {
            let mut workers = Vec::with_capacity(threads);
            for t in 0..threads {
                let worker = std::thread::Builder::new()
                    .name(format!("roll-eval-{t}"))
                    .spawn_scoped(scope, || job.run())
                    .map_err(EnvError::Spawn)?;
                workers.push(worker);
            }
            // A worker's own panics are caught per episode; one in its bookkeeping loses its
            // outcomes, reported below as failed episodes.
            for played in workers.into_iter().filter_map(|w| w.join().ok()) {
                for (i, outcome) in played {
                    outcomes[i] = Some(outcome);
                }
            }
            Ok::<_, EnvError>(())
        })?;
        Ok::<_, EnvError>(
            outcomes
                .into_iter()
                .zip(&seeds)
                .map(|(o, &seed)| {
                    o.unwrap_or_else(|| failed(seed, "the evaluation thread stopped".into()))
                })
                .collect(),
        )
    })
    .await
    .map_err(|e| EnvError::Spawn(std::io::Error::other(e.to_string())))??;
    Ok(EpisodeEval {
        outcomes,
        time: started.elapsed(),
    })
}

/// What the evaluation threads share.
struct Job<'a> {
    runtime: Handle,
    policy: Arc<dyn Generate>,
    tokenizer: Arc<dyn Tokenizer>,
    factory: EnvFactory,
    episode: EpisodeConfig,
    step_timeout: Duration,
    seeds: &'a [u64],
    next: &'a AtomicUsize,
}

impl Job<'_> {
    /// Plays the next seed not yet taken until none is left; the outcomes by seed index.
    fn run(&self) -> Vec<(usize, EpisodeOutcome)> {
        let mut env = None;
        let mut played = Vec::new();
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(&seed) = self.seeds.get(i) else {
                return played;
            };
            played.push((i, self.play(&mut env, i, seed)));
        }
    }

    fn play(
        &self,
        env: &mut Option<Box<dyn roll_core::Env>>,
        i: usize,
        seed: u64,
    ) -> EpisodeOutcome {
        if env.is_none() {
            match catch_unwind(AssertUnwindSafe(|| self.factory.build())) {
                Ok(Ok(e)) => match CallTimeout::new(e, self.step_timeout) {
                    Ok(timed) => *env = Some(Box::new(timed)),
                    Err(e) => return failed(seed, e.to_string()),
                },
                Ok(Err(e)) => return failed(seed, e.to_string()),
                Err(_) => return failed(seed, "building the environment panicked".into()),
            }
        }
        let Some(current) = env.as_mut() else {
            return failed(seed, "no environment".into());
        };
        let ids = EpisodeIds {
            sample: SampleId(i as u64),
            group: GroupId(i as u64),
            seed,
        };
        let played = catch_unwind(AssertUnwindSafe(|| {
            self.runtime.block_on(play_episode(
                &*self.policy,
                &*self.tokenizer,
                &mut **current,
                ids,
                &self.episode,
                &AbortSignal::never(),
            ))
        }));
        match played {
            Ok(Ok(t)) => EpisodeOutcome {
                seed,
                score: t.reward.as_ref().map_or(0.0, |r| r.value),
                success: t.info.get("success").and_then(serde_json::Value::as_bool) == Some(true),
                turns: t.turns().len(),
                end: t
                    .info
                    .get("episode_end")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("unknown")
                    .to_owned(),
                error: None,
            },
            // The environment may be left broken: the next episode gets a fresh one.
            Ok(Err(e)) => {
                *env = None;
                failed(seed, e.to_string())
            }
            Err(_) => {
                *env = None;
                failed(seed, "the episode panicked".into())
            }
        }
    }
}

fn failed(seed: u64, error: String) -> EpisodeOutcome {
    EpisodeOutcome {
        seed,
        score: 0.0,
        success: false,
        turns: 0,
        end: "failed".into(),
        error: Some(error),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::EnvRegistry;
    use roll_core::config::ComponentSpec;
    use roll_core::testing::{ByteTokenizer, MockPolicy, ScriptedPolicy};

    const SECOND: Duration = Duration::from_secs(1);

    fn lake() -> EnvFactory {
        // gymnasium's 4×4 map, not slippery: Right, Right, Down, Down, Down, Right reaches the
        // goal; Left at the start never moves.
        EnvRegistry::with_builtins()
            .factory(
                &ComponentSpec::new("frozen_lake")
                    .with_option("map", "4x4")
                    .with_option("is_slippery", false)
                    .with_option("max_steps", 6),
            )
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn counts_successes_scores_and_turns_per_seed() {
        let config = EpisodeConfig {
            max_turns: 6,
            ..Default::default()
        };
        let stuck = evaluate_episodes(
            Arc::new(ScriptedPolicy::new(["<answer>Left</answer>"])),
            Arc::new(ByteTokenizer),
            &lake(),
            &[1, 2, 3],
            &config,
            2,
            SECOND,
        )
        .await
        .unwrap();
        assert_eq!(stuck.outcomes.len(), 3);
        assert_eq!(stuck.success_rate(), 0.0);
        assert_eq!(stuck.turns_mean(), 6.0, "truncated after max_steps");
        assert_eq!(stuck.failed(), 0);
        assert_eq!(stuck.ended("truncated"), 1.0);
        assert_eq!(
            stuck.outcomes.iter().map(|o| o.seed).collect::<Vec<_>>(),
            [1, 2, 3],
            "in seed order"
        );
        // The first column is `S F F H`: Down, Down, Down ends in the hole after three turns,
        // unsuccessful, score 0.
        let holed = evaluate_episodes(
            Arc::new(ScriptedPolicy::new(["<answer>Down</answer>"])),
            Arc::new(ByteTokenizer),
            &lake(),
            &[5],
            &config,
            1,
            SECOND,
        )
        .await
        .unwrap();
        assert_eq!(holed.outcomes[0].turns, 3);
        assert!(!holed.outcomes[0].success);
        assert_eq!(holed.outcomes[0].score, 0.0);
        assert_eq!(holed.outcomes[0].end, "terminated");
        // Right, Right, Down, Down, Down, Right reaches the goal on the sixth turn.
        let path = ["Right", "Right", "Down", "Down", "Down", "Right"]
            .map(|a| format!("<answer>{a}</answer>"));
        let solved = evaluate_episodes(
            Arc::new(ScriptedPolicy::new(path)),
            Arc::new(ByteTokenizer),
            &lake(),
            &[9],
            &config,
            1,
            SECOND,
        )
        .await
        .unwrap();
        let o = &solved.outcomes[0];
        assert_eq!((o.success, o.score, o.turns), (true, 1.0, 6));
        assert_eq!(solved.success_rate(), 1.0);
        assert_eq!(solved.score_mean(), 1.0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_environment_costs_its_episode() {
        let broken = EnvFactory::new("broken", || -> Result<crate::FrozenLake, EnvError> {
            Err(EnvError::InvalidOption {
                key: "x",
                value: "1".into(),
                allowed: "nothing".into(),
            })
        });
        let eval = evaluate_episodes(
            Arc::new(MockPolicy::digits()),
            Arc::new(ByteTokenizer),
            &broken,
            &[1, 2],
            &EpisodeConfig::default(),
            2,
            SECOND,
        )
        .await
        .unwrap();
        assert_eq!(eval.failed(), 2);
        assert!(eval.outcomes[0].error.as_deref().unwrap().contains("`x`"));
        assert_eq!(eval.success_rate(), 0.0);
    }

    /// FrozenLake, except that the episode of seed 2 hangs in its first step.
    struct HangsOnSeed2 {
        lake: Box<dyn roll_core::Env>,
        seed: u64,
    }

    impl roll_core::Env for HangsOnSeed2 {
        fn reset(&mut self, seed: u64) -> roll_core::Result<roll_core::Observation> {
            self.seed = seed;
            self.lake.reset(seed)
        }

        fn step(&mut self, action: &str) -> roll_core::Result<roll_core::StepResult> {
            if self.seed == 2 {
                std::thread::sleep(Duration::from_secs(30));
            }
            self.lake.step(action)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hung_environment_costs_its_episode_not_the_evaluation() {
        let hangs = EnvFactory::new("hangs", || {
            Ok::<_, EnvError>(HangsOnSeed2 {
                lake: lake().build()?,
                seed: 0,
            })
        });
        let started = Instant::now();
        let eval = evaluate_episodes(
            Arc::new(ScriptedPolicy::new(["<answer>Down</answer>"])),
            Arc::new(ByteTokenizer),
            &hangs,
            &[1, 2, 3, 4],
            &EpisodeConfig {
                max_turns: 6,
                ..Default::default()
            },
            // One thread: the episodes after the hung one run on a fresh environment.
            1,
            Duration::from_millis(200),
        )
        .await
        .unwrap();
        assert!(started.elapsed() < Duration::from_secs(10), "it waited");
        let failed: Vec<bool> = eval.outcomes.iter().map(|o| o.error.is_some()).collect();
        assert_eq!(failed, [false, true, false, false]);
        let error = eval.outcomes[1].error.as_deref().unwrap();
        assert!(error.contains("step timed out after 200ms"), "{error}");
        assert_eq!(eval.outcomes[3].end, "terminated", "seed 4 played out");
    }
}
