//! One environment thread: builds its environment, then plays the episodes it is sent with
//! `play_episode`, driving the policy's futures through the runtime handle, and reports each
//! outcome. It never blocks the async runtime: it is an OS thread of its own.

use super::activity::{Phase, SlotShared};
use crate::{EnvError, EnvFactory};
use roll_core::episode::{EpisodeConfig, EpisodeIds, play_episode};
use roll_core::tokenizer::Tokenizer;
use roll_core::{AbortSignal, Env, Generate, Observation, StepResult, Trajectory};
use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::mpsc::UnboundedSender;

/// An episode to play.
pub(crate) struct Job {
    pub(crate) id: u64,
    pub(crate) ids: EpisodeIds,
    pub(crate) abort: AbortSignal,
}

/// How an episode ended.
pub(crate) enum Outcome {
    Finished(Box<Trajectory>),
    Failed(roll_core::Error),
    Panicked(String),
}

/// What a thread tells the manager. `epoch` identifies the thread, so reports of an abandoned
/// thread are recognised and ignored.
pub(crate) enum Event {
    /// Time to check for timeouts and stalls (from the watchdog thread).
    Tick,
    Ready {
        slot: usize,
        epoch: u64,
    },
    BuildFailed {
        slot: usize,
        epoch: u64,
        error: String,
    },
    Done {
        slot: usize,
        epoch: u64,
        job: u64,
        outcome: Outcome,
    },
}

/// Everything a thread needs.
pub(crate) struct SlotContext {
    pub(crate) slot: usize,
    pub(crate) epoch: u64,
    pub(crate) shared: Arc<SlotShared>,
    pub(crate) factory: EnvFactory,
    pub(crate) policy: Arc<dyn Generate>,
    pub(crate) tokenizer: Arc<dyn Tokenizer>,
    pub(crate) episode: Arc<EpisodeConfig>,
    pub(crate) runtime: Handle,
    pub(crate) events: UnboundedSender<Event>,
}

/// Starts the thread; jobs go to the returned sender, and dropping it ends the thread once its
/// current episode is over.
pub(crate) fn spawn(ctx: SlotContext) -> Result<mpsc::Sender<Job>, EnvError> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("roll-env-{}", ctx.slot))
        .spawn(move || run(ctx, rx))
        .map_err(EnvError::Spawn)?;
    Ok(tx)
}

/// Starts the watchdog thread: it wakes the manager every `every` so timeouts and stalls are
/// noticed without tokio's timer (which a runtime may not have enabled). At most one tick is
/// queued at a time (`pending`); the thread ends when the manager is dropped.
pub(crate) fn spawn_ticker(
    every: Duration,
    events: UnboundedSender<Event>,
    pending: Arc<AtomicBool>,
) -> Result<(), EnvError> {
    std::thread::Builder::new()
        .name("roll-env-watchdog".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                if events.is_closed() {
                    return;
                }
                if !pending.swap(true, Ordering::AcqRel) && events.send(Event::Tick).is_err() {
                    return;
                }
            }
        })
        .map(|_| ())
        .map_err(EnvError::Spawn)
}

fn run(ctx: SlotContext, jobs: mpsc::Receiver<Job>) {
    let (slot, epoch) = (ctx.slot, ctx.epoch);
    ctx.shared.set(Phase::Starting);
    let inner = match catch_unwind(AssertUnwindSafe(|| ctx.factory.build())) {
        Ok(Ok(env)) => env,
        Ok(Err(e)) => {
            let _ = ctx.events.send(Event::BuildFailed {
                slot,
                epoch,
                error: e.to_string(),
            });
            return;
        }
        Err(payload) => {
            let error = format!("panicked: {}", panic_message(payload.as_ref()));
            let _ = ctx.events.send(Event::BuildFailed { slot, epoch, error });
            return;
        }
    };
    ctx.shared.set(Phase::Idle);
    if ctx.events.send(Event::Ready { slot, epoch }).is_err() {
        return;
    }
    let mut env = WatchedEnv {
        inner,
        shared: ctx.shared.clone(),
    };
    while let Ok(job) = jobs.recv() {
        if ctx.shared.is_abandoned() {
            return;
        }
        ctx.shared.begin(job.ids);
        let played = catch_unwind(AssertUnwindSafe(|| {
            ctx.runtime.block_on(play_episode(
                &*ctx.policy,
                &*ctx.tokenizer,
                &mut env,
                job.ids,
                &ctx.episode,
                &job.abort,
            ))
        }));
        ctx.shared.set(Phase::Idle);
        // A panic or an environment error may leave the environment broken: the thread ends and
        // the manager starts a fresh one.
        let (outcome, fatal) = match played {
            Ok(Ok(trajectory)) => (Outcome::Finished(Box::new(trajectory)), false),
            Ok(Err(e)) => {
                let fatal = matches!(e, roll_core::Error::Env(_));
                (Outcome::Failed(e), fatal)
            }
            Err(payload) => (Outcome::Panicked(panic_message(payload.as_ref())), true),
        };
        let event = Event::Done {
            slot,
            epoch,
            job: job.id,
            outcome,
        };
        if ctx.events.send(event).is_err() || fatal || ctx.shared.is_abandoned() {
            return;
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Publishes when the environment's own code runs, for the step timeout and the watchdog.
struct WatchedEnv {
    inner: Box<dyn Env>,
    shared: Arc<SlotShared>,
}

impl Env for WatchedEnv {
    fn reset(&mut self, seed: u64) -> roll_core::Result<Observation> {
        self.shared.set(Phase::Resetting);
        let out = self.inner.reset(seed);
        self.shared.set(Phase::Generating);
        out
    }

    fn step(&mut self, action: &str) -> roll_core::Result<StepResult> {
        self.shared.set(Phase::Stepping);
        let out = self.inner.step(action);
        self.shared.set(Phase::Generating);
        out
    }
}
