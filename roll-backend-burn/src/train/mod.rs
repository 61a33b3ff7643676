//! The trainer: optimisation steps on a [`roll_core::TrainBatch`] with a roll-algos objective.
