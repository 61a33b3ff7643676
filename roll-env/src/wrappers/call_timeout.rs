//! [`CallTimeout`]: an environment whose calls give up after a time limit.

use roll_core::{Env, Error, Observation, Result, StepResult};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

/// Runs the inner environment on a thread of its own and waits at most `limit` for each
/// `reset` or `step`: a call that takes longer returns [`Error::Timeout`], and the environment
/// is abandoned — its thread is left to finish (a thread cannot be killed) and every later call
/// fails at once, so the caller builds a fresh environment. For callers without a watchdog of
/// their own (the held-out evaluation); the [`EnvManager`](crate::EnvManager) restarts its
/// threads itself.
///
/// A panic inside the environment is returned as an [`Error::Env`] naming it (the thread is then
/// gone, as after a timeout).
///
/// ```
/// use roll_core::testing::EchoEnv;
/// use roll_core::Env;
/// use roll_env::wrappers::CallTimeout;
/// use std::time::Duration;
///
/// let mut env = CallTimeout::new(EchoEnv::new(100), Duration::from_secs(5))?;
/// env.reset(0)?;
/// assert_eq!(env.step("hi")?.reward, 1.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct CallTimeout {
    limit: Duration,
    /// `None` once abandoned.
    worker: Option<Worker>,
}

#[derive(Debug)]
struct Worker {
    calls: Sender<Call>,
    answers: Receiver<Answer>,
}

enum Call {
    Reset(u64),
    Step(String),
}

enum Answer {
    Reset(Result<Observation>),
    Step(Result<StepResult>),
}

impl CallTimeout {
    /// `inner` on its own thread, each call limited to `limit`.
    ///
    /// # Errors
    /// [`Error::Env`] if the thread cannot be started; [`Error::InvalidValue`] for a zero limit.
    pub fn new(inner: impl Env + 'static, limit: Duration) -> Result<Self> {
        if limit.is_zero() {
            return Err(Error::InvalidValue {
                key: "step_timeout".into(),
                value: "0s".into(),
                allowed: "a positive duration".into(),
                origin: None,
            });
        }
        let (calls, inbox) = mpsc::channel::<Call>();
        let (outbox, answers) = mpsc::channel::<Answer>();
        let mut env = inner;
        std::thread::Builder::new()
            .name("roll-env-call".into())
            .spawn(move || {
                // Ends when the wrapper is dropped (its sender with it) or the caller stops
                // listening.
                for call in inbox {
                    let answer = match call {
                        Call::Reset(seed) => Answer::Reset(env.reset(seed)),
                        Call::Step(action) => Answer::Step(env.step(&action)),
                    };
                    if outbox.send(answer).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| Error::Env(Box::new(e)))?;
        Ok(Self {
            limit,
            worker: Some(Worker { calls, answers }),
        })
    }

    /// The limit of one call.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// Whether a call timed out or panicked (every call fails from then on).
    pub fn is_abandoned(&self) -> bool {
        self.worker.is_none()
    }

    fn call(&mut self, call: Call, what: &str) -> Result<Answer> {
        let Some(worker) = &self.worker else {
            return Err(Error::Env(
                "the environment was abandoned after a call that timed out or panicked; build a \
                 fresh one"
                    .into(),
            ));
        };
        let sent = worker.calls.send(call);
        let answer = match sent {
            Ok(()) => worker.answers.recv_timeout(self.limit),
            Err(_) => Err(RecvTimeoutError::Disconnected),
        };
        match answer {
            Ok(answer) => Ok(answer),
            Err(RecvTimeoutError::Timeout) => {
                self.worker = None;
                Err(Error::Timeout {
                    what: format!("the environment's {what}"),
                    after: self.limit,
                })
            }
            Err(RecvTimeoutError::Disconnected) => {
                self.worker = None;
                Err(Error::Env(
                    format!("the environment panicked in its {what}").into(),
                ))
            }
        }
    }
}

impl Env for CallTimeout {
    fn reset(&mut self, seed: u64) -> Result<Observation> {
        match self.call(Call::Reset(seed), "reset")? {
            Answer::Reset(r) => r,
            Answer::Step(_) => Err(Error::Env("a step answered a reset".into())),
        }
    }

    fn step(&mut self, action: &str) -> Result<StepResult> {
        match self.call(Call::Step(action.to_owned()), "step")? {
            Answer::Step(r) => r,
            Answer::Reset(_) => Err(Error::Env("a reset answered a step".into())),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use roll_core::testing::EchoEnv;
    use std::time::Instant;

    /// Sleeps `delay` in each step; panics on the action "panic".
    struct Slow {
        delay: Duration,
    }

    impl Env for Slow {
        fn reset(&mut self, _seed: u64) -> Result<Observation> {
            Ok(Observation::new("go"))
        }

        fn step(&mut self, action: &str) -> Result<StepResult> {
            assert_ne!(action, "panic", "asked to");
            std::thread::sleep(self.delay);
            Ok(StepResult::running("ok", 1.0))
        }
    }

    #[test]
    fn calls_pass_through_within_the_limit() {
        let mut env = CallTimeout::new(EchoEnv::new(10), Duration::from_secs(5)).unwrap();
        assert_eq!(
            env.reset(3).unwrap().text,
            EchoEnv::new(10).reset(3).unwrap().text
        );
        let step = env.step("abc").unwrap();
        assert_eq!((step.observation.as_str(), step.reward), ("abc", 1.0));
        assert!(!env.is_abandoned());
    }

    #[test]
    fn a_hung_step_times_out_and_the_environment_is_abandoned() {
        let mut env = CallTimeout::new(
            Slow {
                delay: Duration::from_secs(5),
            },
            Duration::from_millis(100),
        )
        .unwrap();
        env.reset(0).unwrap();
        let started = Instant::now();
        let err = env.step("x").unwrap_err().to_string();
        assert!(started.elapsed() < Duration::from_secs(2), "it waited");
        assert_eq!(err, "the environment's step timed out after 100ms");
        assert!(env.is_abandoned());
        let again = env.reset(1).unwrap_err().to_string();
        assert!(again.contains("abandoned"), "{again}");
    }

    #[test]
    fn a_panic_is_an_error_naming_the_call() {
        let mut env = CallTimeout::new(
            Slow {
                delay: Duration::ZERO,
            },
            Duration::from_secs(5),
        )
        .unwrap();
        env.reset(0).unwrap();
        let err = env.step("panic").unwrap_err().to_string();
        assert!(err.contains("panicked in its step"), "{err}");
        assert!(env.is_abandoned());
        assert!(CallTimeout::new(EchoEnv::new(1), Duration::ZERO).is_err());
    }
}
