//! A run from a config: [`RunPlan`] reads the config once into every component's settings,
//! [`RunBuilder`] builds the components (writing a new model, loading the model, starting the
//! actor) and [`Run`] runs the stages — supervised warm start, held-out evaluation, RL, export —
//! writing the run directory; [`RunSummary`] is what it did.

use roll_core::Error;

mod builder;
mod checkpoint;
mod distributed;
mod plan;
mod plots;
mod runner;
mod summary;
mod telemetry;

pub use builder::RunBuilder;
pub use checkpoint::{Resumed, SkippedCheckpoint};
pub use distributed::{Followed, ServedExperts, follow};
pub use plan::{ModelPlan, RolloutPlan, RunPlan, RunSettings, SftPlan};
pub use plots::plot_metrics;
pub use runner::Run;
pub use summary::{EvalPoint, RunSummary, SftSummary};
pub use telemetry::{STEP_GAUGE, TENSORBOARD_DIR};

/// Maps an I/O error on `path` to roll's error, saying what was being done.
fn io(action: &'static str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io {
        action,
        path,
        source,
    }
}
