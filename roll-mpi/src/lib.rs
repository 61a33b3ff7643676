//! # roll-mpi — roll across processes and machines, on MPI
//!
//! roll does not ship a distributed runtime of its own: processes are started by the standard
//! launchers and talk through the system's MPI library (OpenMPI, MPICH, a vendor's). This crate
//! is the one place that touches it: `MpiWorld` initialises MPI once per process and hands out
//! `MpiReplica`, roll-core's [`Strategy`](roll_core::Strategy) over `MPI_COMM_WORLD` — the
//! rank, the world size, the all-reduces that keep data-parallel trainer replicas identical and
//! the broadcast with which rank 0 hands out each step.
//!
//! What a run across processes does with it is in `roll::run` (`RunBuilder::lead` on rank 0,
//! `roll::run::follow` on the others) and `examples/distributed_grpo.rs`.
//!
//! ```sh
//! # One machine, two processes (as root, as in CI, add --allow-run-as-root):
//! mpirun -np 2 target/release/examples/distributed_grpo
//! # A Slurm cluster: one process per task, the launcher sets the ranks.
//! srun --ntasks=4 target/release/examples/distributed_grpo
//! ```
//!
//! Everything is behind the cargo feature `mpi`, which needs the MPI headers and `libclang` at
//! build time (Debian: `apt-get install openmpi-bin libopenmpi-dev libclang-dev`); without it
//! the crate is empty and a plain workspace build needs no system library.
//!
//! Every rank must make the same collective calls in the same order, on each communicator. MPI is
//! initialised for calls from any threads at once (`MPI_THREAD_MULTIPLE`) where the library
//! offers it, else one at a time (`MPI_THREAD_SERIALIZED`, a lock in `MpiWorld` taking them in
//! turn). Either way a group's collectives should come from the one thread that drives its
//! replica, or two threads' calls interleave in an order the other ranks do not share; a second
//! thread of every rank (the inference engines of expert-parallel training ranks) makes its own
//! on a channel (`Messenger::channel`), which needs `MPI_THREAD_MULTIPLE`.
//!
//! Running as root (containers, CI), OpenMPI refuses to start without `--allow-run-as-root` (or
//! `OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1` in the environment); with more
//! ranks than cores it also needs `--oversubscribe`.
#![cfg_attr(
    feature = "mpi",
    doc = "\n\nStart with [`MpiWorld::init`], then [`MpiWorld::replica`] for this process's [`MpiReplica`]."
)]
#![cfg_attr(
    not(feature = "mpi"),
    doc = "\n\n**This build has the feature `mpi` off and contains nothing: enable feature `mpi`.**"
)]
#![warn(missing_docs)]

#[cfg(feature = "mpi")]
mod world;

#[cfg(feature = "mpi")]
pub use world::{MpiGroup, MpiReplica, MpiWorld};
