//! A run from a config: [`RunPlan`] reads the config once into every component's settings,
//! [`RunBuilder`] builds the components (loading the model, starting the actor) and [`Run`]
//! trains, writing the run directory.

mod builder;
mod plan;

pub use builder::{Run, RunBuilder};
pub use plan::{ModelPlan, RolloutPlan, RunPlan, RunSettings};
