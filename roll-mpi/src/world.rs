//! [`MpiWorld`] and [`MpiReplica`]: the [`Strategy`] trait over `MPI_COMM_WORLD`.

use mpi::Threading;
use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Destination, Root, Source};
use roll_core::strategy::{DeviceSpec, Messenger, ReduceOp, Strategy};
use roll_core::{Error, Result};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The tag of roll's point-to-point messages (collectives do not match tags).
const MESSAGE_TAG: i32 = 7;

/// How long a receiver sleeps between two probes for a message: from `FIRST_PROBE`, doubling
/// while nothing comes, up to `LAST_PROBE`. An answer that comes at once is taken at once; a
/// rank that waits long (a rollout rank between two rounds) wakes a thousand times a second at
/// most, leaving its cores to the compute.
const FIRST_PROBE: Duration = Duration::from_micros(10);
const LAST_PROBE: Duration = Duration::from_millis(1);

/// This process's membership of the MPI job: MPI initialised (once per process, with calls
/// from any one thread at a time), the world's size and this process's rank. MPI is finalised
/// when the last handle (this and every [`MpiReplica`]) is dropped.
pub struct MpiWorld {
    universe: Universe,
    /// MPI was initialised for calls from any thread, one at a time: this is that "one".
    calls: Mutex<()>,
    rank: usize,
    size: usize,
}

impl std::fmt::Debug for MpiWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiWorld")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

fn strategy_error(message: String) -> Error {
    Error::Strategy(message.into())
}

impl MpiWorld {
    /// Initialises MPI for this process (`MPI_Init_thread`).
    ///
    /// # Errors
    /// [`Error::Strategy`] when MPI was already initialised in this process, or when the library
    /// cannot take calls from several threads one at a time (`MPI_THREAD_SERIALIZED`): roll's
    /// trainers run on worker threads.
    pub fn init() -> Result<Arc<Self>> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| strategy_error("MPI is already initialised in this process".into()))?;
        if matches!(threading, Threading::Single | Threading::Funneled) {
            return Err(strategy_error(format!(
                "the MPI library offers {threading:?} threading; roll needs Serialized or Multiple"
            )));
        }
        let world = universe.world();
        let (rank, size) = (world.rank(), world.size());
        Ok(Arc::new(Self {
            universe,
            calls: Mutex::new(()),
            rank: usize::try_from(rank).unwrap_or(0),
            size: usize::try_from(size).unwrap_or(1),
        }))
    }

    /// This process's rank in `0..size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Processes in the job.
    pub fn size(&self) -> usize {
        self.size
    }

    /// This process as one replica of a data-parallel group spanning the whole job, computing
    /// on `device`.
    pub fn replica(self: &Arc<Self>, device: DeviceSpec) -> MpiReplica {
        MpiReplica {
            world: self.clone(),
            device,
        }
    }

    /// The world communicator, while holding the right to call MPI.
    fn call(&self) -> (MutexGuard<'_, ()>, SimpleCommunicator) {
        // A poisoned lock only means another thread panicked between two MPI calls: MPI's state
        // is not behind it.
        let guard = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        (guard, self.universe.world())
    }
}

/// One process's replica of a data-parallel group over `MPI_COMM_WORLD` (see
/// [`MpiWorld::replica`]).
///
/// Every rank must make the same collective calls in the same order, as MPI requires. MPI's
/// default error handler ends the whole job on a failed call, and `mpirun` or `srun` end it
/// when a process exits without finishing MPI: a rank that dies stops the job, it does not
/// leave the others waiting. Sums use `MPI_SUM`, whose result is the same on every rank (MPI
/// reduces in one canonical order for all), so the replicas stay bit-for-bit identical.
#[derive(Debug, Clone)]
pub struct MpiReplica {
    world: Arc<MpiWorld>,
    device: DeviceSpec,
}

impl Strategy for MpiReplica {
    fn name(&self) -> String {
        format!(
            "mpi(rank {} of {}, {})",
            self.world.rank, self.world.size, self.device
        )
    }

    fn devices(&self) -> Vec<DeviceSpec> {
        vec![self.device]
    }

    fn world_size(&self) -> usize {
        self.world.size
    }

    fn rank(&self) -> usize {
        self.world.rank
    }

    fn all_reduce(&self, values: &mut [f32], op: ReduceOp) -> Result<()> {
        if self.world.size == 1 {
            return Ok(());
        }
        let operation = match op {
            ReduceOp::Sum | ReduceOp::Mean => SystemOperation::sum(),
            ReduceOp::Max => SystemOperation::max(),
            ReduceOp::Min => SystemOperation::min(),
        };
        let send = values.to_vec();
        {
            let (_call, world) = self.world.call();
            world.all_reduce_into(&send[..], values, operation);
        }
        if op == ReduceOp::Mean {
            let n = self.world.size as f32;
            values.iter_mut().for_each(|v| *v /= n);
        }
        Ok(())
    }

    fn broadcast(&self, bytes: &mut Vec<u8>, root: usize) -> Result<()> {
        let size = self.world.size;
        if root >= size {
            return Err(Error::InvalidValue {
                key: "broadcast root".into(),
                value: root.to_string(),
                allowed: format!("a rank below {size}"),
                origin: None,
            });
        }
        if size == 1 {
            return Ok(());
        }
        let (_call, world) = self.world.call();
        let root_rank = i32::try_from(root).unwrap_or(0);
        let root = world.process_at_rank(root_rank);
        let mut len = [bytes.len() as u64];
        root.broadcast_into(&mut len[..]);
        let len = usize::try_from(len[0])
            .map_err(|_| strategy_error(format!("a broadcast of {} bytes", len[0])))?;
        bytes.resize(len, 0);
        root.broadcast_into(&mut bytes[..]);
        Ok(())
    }

    fn abort(&self, reason: &str) {
        eprintln!(
            "roll: rank {} of {} failed, ending the MPI job: {reason}",
            self.world.rank, self.world.size
        );
        let (_call, world) = self.world.call();
        world.abort(1);
    }
}

impl MpiReplica {
    fn peer(&self, rank: usize, what: &str) -> Result<i32> {
        match i32::try_from(rank) {
            Ok(r) if rank < self.world.size => Ok(r),
            _ => Err(Error::InvalidValue {
                key: what.into(),
                value: rank.to_string(),
                allowed: format!("a rank below {}", self.world.size),
                origin: None,
            }),
        }
    }
}

/// Messages are `MPI_Send`s with roll's tag, received by probing (`MPI_Improbe`, then
/// `MPI_Mrecv`) at growing intervals ([`FIRST_PROBE`] to [`LAST_PROBE`]) without holding the lock
/// in between: a rank waiting for a message neither spins on a core nor keeps its other threads
/// from MPI.
impl Messenger for MpiReplica {
    fn send(&self, to: usize, bytes: &[u8]) -> Result<()> {
        let to = self.peer(to, "message receiver")?;
        if i32::try_from(bytes.len()).is_err() {
            return Err(strategy_error(format!(
                "a message of {} bytes: MPI counts are 32-bit, send it in parts below 2 GiB",
                bytes.len()
            )));
        }
        let (_call, world) = self.world.call();
        world.process_at_rank(to).send_with_tag(bytes, MESSAGE_TAG);
        Ok(())
    }

    fn receive(&self, from: usize, timeout: Duration) -> Result<Option<Vec<u8>>> {
        let from = self.peer(from, "message sender")?;
        let deadline = Instant::now() + timeout;
        let mut pause = FIRST_PROBE;
        loop {
            {
                let (_call, world) = self.world.call();
                if let Some((message, status)) = world
                    .process_at_rank(from)
                    .immediate_matched_probe_with_tag(MESSAGE_TAG)
                {
                    let len = usize::try_from(status.count(u8::equivalent_datatype()))
                        .map_err(|_| strategy_error("a message of negative length".into()))?;
                    let mut bytes = vec![0u8; len];
                    message.matched_receive_into(&mut bytes[..]);
                    return Ok(Some(bytes));
                }
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            pause = (pause * 2).min(LAST_PROBE);
        }
    }
}
