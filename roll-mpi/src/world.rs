//! [`MpiWorld`] and [`MpiReplica`]: the [`Strategy`] trait over `MPI_COMM_WORLD`.

use mpi::Threading;
use mpi::collective::SystemOperation;
use mpi::datatype::{Equivalence, Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Destination, Group, Root, Source};
use roll_core::strategy::{DeviceSpec, Messenger, ReduceOp, Strategy, check_rank};
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

/// This process's membership of the MPI job: MPI initialised (once per process, for calls from
/// any thread), the world's size and this process's rank. MPI is finalised when the last handle
/// (this and every [`MpiReplica`], group and channel) is dropped.
pub struct MpiWorld {
    universe: Universe,
    /// Where the library takes calls from one thread at a time only (`MPI_THREAD_SERIALIZED`),
    /// the right to make one; `None` where it takes them from any threads at once
    /// (`MPI_THREAD_MULTIPLE`).
    calls: Option<Mutex<()>>,
    /// Channels made over each set of members ([`MpiWorld::channel`]).
    channels: Mutex<std::collections::HashMap<Vec<i32>, u64>>,
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
    /// Initialises MPI for this process (`MPI_Init_thread`), asking for calls from any threads
    /// at once (`MPI_THREAD_MULTIPLE`, which OpenMPI and MPICH offer): the engines of training
    /// ranks then step together on [channels](Messenger::channel) of their own beside their
    /// trainers. A library that offers calls from one thread at a time only
    /// (`MPI_THREAD_SERIALIZED`) serves everything else: a lock here takes the calls in turn,
    /// and [`Messenger::channel`] is refused.
    ///
    /// # Errors
    /// [`Error::Strategy`] when MPI was already initialised in this process, or when the library
    /// cannot take calls from several threads even one at a time: roll's trainers run on worker
    /// threads.
    pub fn init() -> Result<Arc<Self>> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| strategy_error("MPI is already initialised in this process".into()))?;
        let calls = match threading {
            Threading::Multiple => None,
            Threading::Serialized => Some(Mutex::new(())),
            Threading::Single | Threading::Funneled => {
                return Err(strategy_error(format!(
                    "the MPI library offers {threading:?} threading; roll needs Serialized or \
                     Multiple"
                )));
            }
        };
        let world = universe.world();
        let (rank, size) = (world.rank(), world.size());
        Ok(Arc::new(Self {
            universe,
            calls,
            channels: Mutex::default(),
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

    /// Whether the library takes calls from several threads at once (`MPI_THREAD_MULTIPLE`).
    pub fn concurrent(&self) -> bool {
        self.calls.is_none()
    }

    /// The right to call MPI: a turn where calls are taken one at a time, nothing otherwise.
    fn turn(&self) -> Option<MutexGuard<'_, ()>> {
        // A poisoned lock only means another thread panicked between two MPI calls: MPI's state
        // is not behind it.
        self.calls
            .as_ref()
            .map(|calls| calls.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The world communicator, with the right to call MPI.
    fn call(&self) -> (Option<MutexGuard<'_, ()>>, SimpleCommunicator) {
        (self.turn(), self.universe.world())
    }

    /// A channel over `members` (ranks of the job, ascending, this one among them), the
    /// members' `made`-th (each member counts the channels it made over them, so all agree).
    fn channel(
        self: &Arc<Self>,
        members: &[i32],
        rank: usize,
        device: DeviceSpec,
    ) -> Result<Arc<dyn Messenger>> {
        if !self.concurrent() {
            return Err(strategy_error(
                "a channel beside a group needs an MPI library that takes calls from several \
                 threads at once (MPI_THREAD_MULTIPLE); this one takes them one at a time \
                 (OpenMPI: built with --enable-mpi-thread-multiple, the default since 3.0)"
                    .into(),
            ));
        }
        let made = {
            let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
            let made = channels.entry(members.to_vec()).or_insert(0);
            *made += 1;
            *made
        };
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&(members, made), &mut hasher);
        let hash = std::hash::Hasher::finish(&hasher);
        let pick = |tags: &std::ops::Range<i32>| tags.start + (hash % tags.len() as u64) as i32;
        Ok(Arc::new(MpiGroup {
            world: self.clone(),
            members: members.into(),
            rank,
            size: members.len(),
            device,
            tag: pick(&GROUP_TAGS),
            channel: Some(pick(&CHANNEL_TAGS)),
        }))
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

/// The tag `MPI_Comm_create_group` uses among the members (not [`MESSAGE_TAG`]: its messages
/// must never match roll's).
const SUBGROUP_TAG: i32 = 8;

/// The tags `MPI_Comm_create_group` uses for channels' communicators, one per channel: not
/// [`SUBGROUP_TAG`], so that a channel's collective on one thread never meets a group's on
/// another (MPI tells concurrent creations apart by their tags), and below the messages' tags.
const CHANNEL_TAGS: std::ops::Range<i32> = 10..100;

/// The tags of sub-groups' messages, one per group (by its members): above roll's other tags
/// and below 32767, the least upper bound MPI guarantees.
const GROUP_TAGS: std::ops::Range<i32> = 100..32_000;

/// A collective over the whole job, some of its ranks (ascending) or a channel's, with the
/// right to call MPI held. For some ranks, and for every channel, a communicator over them is
/// made for the call (`MPI_Comm_create_group`, among the members alone) and freed after it: a
/// communicator is not `Send`, so it cannot be kept by a strategy that any thread may use. That
/// costs ~15 µs between two processes here, 20 times a one-float all-reduce; a group of every
/// rank uses the world's communicator instead.
///
/// (Keeping each group's communicator on a thread that makes every MPI call of the process was
/// measured and not kept: handing each call to that thread cost more than it saved — one-float
/// all-reduces over the world 0.7 → 8.6 µs and over a group 15.6 → 7.9 µs between two
/// processes, and 7.9 → 70.6 µs and 105 → 112 µs among four processes on two cores.)
fn collective<T>(
    world: &MpiWorld,
    over: Over<'_>,
    body: impl FnOnce(&SimpleCommunicator) -> Result<T>,
) -> Result<T> {
    let (_call, comm) = world.call();
    let (members, tag) = match over {
        Over::World => return body(&comm),
        // Every rank of the job, ascending: their ranks in the group are their ranks in the job.
        Over::Group(members) if members.len() == world.size => return body(&comm),
        Over::Group(members) => (members, SUBGROUP_TAG),
        Over::Channel { members, tag } => (members, tag),
    };
    let group = comm.group().include(members);
    let sub = comm
        .split_by_subgroup_with_tag(&group, tag)
        .ok_or_else(|| {
            strategy_error(format!(
                "rank {} is not a member of the group {members:?}",
                world.rank
            ))
        })?;
    body(&sub)
}

/// The ranks a collective is among.
#[derive(Clone, Copy)]
enum Over<'a> {
    /// Every rank of the job, on the world's communicator.
    World,
    /// A group of ranks of the job (ascending).
    Group(&'a [i32]),
    /// A channel's ranks of the job (ascending), on a communicator made with its tag.
    Channel { members: &'a [i32], tag: i32 },
}

/// Element-wise reduction of `values` over the ranks of `comm` (`size` of them).
fn all_reduce_on(comm: &SimpleCommunicator, values: &mut [f32], op: ReduceOp) {
    let operation = match op {
        ReduceOp::Sum | ReduceOp::Mean => SystemOperation::sum(),
        ReduceOp::Max => SystemOperation::max(),
        ReduceOp::Min => SystemOperation::min(),
    };
    let send = values.to_vec();
    comm.all_reduce_into(&send[..], values, operation);
    if op == ReduceOp::Mean {
        let n = comm.size() as f32;
        values.iter_mut().for_each(|v| *v /= n);
    }
}

/// `root`'s bytes on every rank of `comm`: the length first, then the bytes.
///
/// `patient` (at `MPI_THREAD_MULTIPLE`, where no lock is held across the call): the length is
/// broadcast without blocking (`MPI_Ibcast`) and tested at growing intervals, as a message is
/// probed for ([`FIRST_PROBE`] to [`LAST_PROBE`]), because a rank waiting here may wait long —
/// a follower for the leader's next step — and a blocking MPI call spins on a core the whole
/// time: beside an inference engine stepping on the same cores (colocated expert-parallel
/// generation on the project's 2 cores) that spinning thread made the engines' steps 17 →
/// 70–100 ms. The bytes, which follow at once, are broadcast blocking.
fn broadcast_on(
    comm: &SimpleCommunicator,
    bytes: &mut Vec<u8>,
    root: usize,
    patient: bool,
) -> Result<()> {
    let root = comm.process_at_rank(i32::try_from(root).unwrap_or(0));
    let mut len = [bytes.len() as u64];
    if patient {
        mpi::request::scope(|scope| {
            let mut request = root.immediate_broadcast_into(scope, &mut len[..]);
            let mut pause = FIRST_PROBE;
            loop {
                match request.test() {
                    Ok(_) => break,
                    Err(pending) => request = pending,
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(LAST_PROBE);
            }
        });
    } else {
        root.broadcast_into(&mut len[..]);
    }
    let len = usize::try_from(len[0])
        .map_err(|_| strategy_error(format!("a broadcast of {} bytes", len[0])))?;
    bytes.resize(len, 0);
    // An empty Vec's pointer is dangling, which OpenMPI refuses (MPI_ERR_ARG) even for 0 bytes.
    if len > 0 {
        root.broadcast_into(&mut bytes[..]);
    }
    Ok(())
}

/// `send[d]` to rank `d` of `comm`, every rank's part for this one back: the counts first
/// (`MPI_Alltoall`), then the floats (`MPI_Alltoallv`).
fn all_to_all_on(comm: &SimpleCommunicator, send: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>> {
    let count = |n: usize| {
        i32::try_from(n).map_err(|_| strategy_error(format!("an all-to-all of {n} floats")))
    };
    let send_counts = send
        .iter()
        .map(|p| count(p.len()))
        .collect::<Result<Vec<i32>>>()?;
    let mut recv_counts = vec![0i32; send.len()];
    comm.all_to_all_into(&send_counts[..], &mut recv_counts[..]);
    let displacements = |counts: &[i32]| -> Result<Vec<i32>> {
        let mut at = 0usize;
        counts
            .iter()
            .map(|&c| {
                let here = count(at)?;
                at += c as usize;
                Ok(here)
            })
            .collect()
    };
    let (send_at, recv_at) = (displacements(&send_counts)?, displacements(&recv_counts)?);
    // At least one element each: an empty Vec's pointer is dangling, which OpenMPI may refuse
    // (MPI_ERR_ARG) even when nothing is sent.
    let mut flat: Vec<f32> = send.concat();
    flat.push(0.0);
    let mut received = vec![0f32; recv_counts.iter().map(|&c| c as usize).sum::<usize>() + 1];
    {
        let sent = Partition::new(&flat[..], &send_counts[..], &send_at[..]);
        let mut into = PartitionMut::new(&mut received[..], &recv_counts[..], &recv_at[..]);
        comm.all_to_all_varcount_into(&sent, &mut into);
    }
    Ok(recv_at
        .iter()
        .zip(&recv_counts)
        .map(|(&at, &n)| received[at as usize..(at + n) as usize].to_vec())
        .collect())
}

/// Ends the job from any of its ranks.
fn abort_job(world: &MpiWorld, reason: &str) {
    eprintln!(
        "roll: rank {} of {} failed, ending the MPI job: {reason}",
        world.rank, world.size
    );
    let (_call, comm) = world.call();
    comm.abort(1);
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
        collective(&self.world, Over::World, |comm| {
            all_reduce_on(comm, values, op);
            Ok(())
        })
    }

    fn broadcast(&self, bytes: &mut Vec<u8>, root: usize) -> Result<()> {
        check_rank(root, self.world.size, "broadcast root")?;
        if self.world.size == 1 {
            return Ok(());
        }
        let patient = self.world.concurrent();
        collective(&self.world, Over::World, |comm| {
            broadcast_on(comm, bytes, root, patient)
        })
    }

    fn all_to_all(&self, send: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>> {
        roll_core::strategy::check_parts(send.len(), self.world.size)?;
        collective(&self.world, Over::World, |comm| all_to_all_on(comm, send))
    }

    fn abort(&self, reason: &str) {
        abort_job(&self.world, reason);
    }
}

/// Some ranks of the job as a group of their own, with collectives among them alone (see
/// [`Messenger::subgroup`]): the trainers of a job whose other ranks generate. Its ranks are
/// indices into the members; a failure still ends the whole job.
///
/// Or a channel of some ranks (or all, see [`Messenger::channel`]): collectives and messages
/// that never meet those of any group over the same ranks, so that another thread of each rank
/// may make them at the same time. Each of its collectives makes a communicator among the
/// members with the channel's own tag (`MPI_Comm_create_group`), as a group of some ranks does
/// with the groups' tag, and frees it after the call — even over every rank of the job, where a
/// group uses the world's communicator: the world's may be busy on another thread. (Keeping one
/// communicator for the channel's life would save those ~7 µs a call, but the `mpi` crate's
/// communicators may not move between threads, and this workspace allows no `unsafe` to vouch
/// that MPI's may.)
#[derive(Debug, Clone)]
pub struct MpiGroup {
    world: Arc<MpiWorld>,
    /// Ranks of the job, ascending.
    members: Arc<[i32]>,
    rank: usize,
    size: usize,
    device: DeviceSpec,
    /// The tag of the group's messages.
    tag: i32,
    /// For a channel, the tag its communicators are made with (in [`CHANNEL_TAGS`]).
    channel: Option<i32>,
}

impl MpiGroup {
    /// The ranks its collectives are among.
    fn over(&self) -> Over<'_> {
        match self.channel {
            Some(tag) => Over::Channel {
                members: &self.members,
                tag,
            },
            None => Over::Group(&self.members),
        }
    }
}

impl Strategy for MpiGroup {
    fn name(&self) -> String {
        format!(
            "mpi(rank {} of group {:?}, {})",
            self.rank, self.members, self.device
        )
    }

    fn devices(&self) -> Vec<DeviceSpec> {
        vec![self.device]
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn all_reduce(&self, values: &mut [f32], op: ReduceOp) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        collective(&self.world, self.over(), |comm| {
            all_reduce_on(comm, values, op);
            Ok(())
        })
    }

    fn broadcast(&self, bytes: &mut Vec<u8>, root: usize) -> Result<()> {
        check_rank(root, self.size, "broadcast root")?;
        if self.size == 1 {
            return Ok(());
        }
        let patient = self.world.concurrent();
        collective(&self.world, self.over(), |comm| {
            broadcast_on(comm, bytes, root, patient)
        })
    }

    fn all_to_all(&self, send: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>> {
        roll_core::strategy::check_parts(send.len(), self.size)?;
        collective(&self.world, self.over(), |comm| all_to_all_on(comm, send))
    }

    fn abort(&self, reason: &str) {
        abort_job(&self.world, reason);
    }
}

impl MpiReplica {
    fn peer(&self, rank: usize, what: &str) -> Result<i32> {
        check_rank(rank, self.world.size, what)?;
        i32::try_from(rank).map_err(|_| strategy_error(format!("rank {rank} beyond MPI's range")))
    }
}

/// Sends `bytes` to rank `to` of `comm` with `tag`.
fn send_tagged(
    world: &MpiWorld,
    comm: &SimpleCommunicator,
    to: i32,
    tag: i32,
    bytes: &[u8],
) -> Result<()> {
    if i32::try_from(bytes.len()).is_err() {
        return Err(strategy_error(format!(
            "a message of {} bytes: MPI counts are 32-bit, send it in parts below 2 GiB",
            bytes.len()
        )));
    }
    let _turn = world.turn();
    comm.process_at_rank(to).send_with_tag(bytes, tag);
    Ok(())
}

/// The next message with `tag` from rank `from` of `comm`, probing at growing intervals until
/// `timeout`.
fn receive_tagged(
    world: &MpiWorld,
    comm: &SimpleCommunicator,
    from: i32,
    tag: i32,
    timeout: Duration,
) -> Result<Option<Vec<u8>>> {
    let deadline = Instant::now() + timeout;
    let mut pause = FIRST_PROBE;
    loop {
        {
            let _turn = world.turn();
            if let Some((message, status)) = comm
                .process_at_rank(from)
                .immediate_matched_probe_with_tag(tag)
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

/// A sub-group of the job over `members` (ranks of the job, ascending; checked by the caller)
/// as `rank` sees it; `None` when `rank` is not a member.
fn group_of(
    world: &Arc<MpiWorld>,
    members: &[usize],
    device: DeviceSpec,
) -> Result<Option<Arc<dyn Messenger>>> {
    let Some(rank) = members.iter().position(|&m| m == world.rank) else {
        return Ok(None);
    };
    let ranks: Vec<i32> = members
        .iter()
        .map(|&m| i32::try_from(m))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| strategy_error(format!("ranks {members:?} beyond MPI's range")))?;
    // A tag of the group's own, so that its messages never match the job's (or another
    // group's) between the same two processes.
    let mut hasher = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(&ranks, &mut hasher);
    let tag =
        GROUP_TAGS.start + (std::hash::Hasher::finish(&hasher) % GROUP_TAGS.len() as u64) as i32;
    Ok(Some(Arc::new(MpiGroup {
        world: world.clone(),
        members: ranks.into(),
        rank,
        size: members.len(),
        device,
        tag,
        channel: None,
    })))
}

/// Messages are `MPI_Send`s with roll's tag, received by probing (`MPI_Improbe`, then
/// `MPI_Mrecv`) at growing intervals (10 µs, doubling up to 1 ms) without holding the lock
/// in between: a rank waiting for a message neither spins on a core nor keeps its other threads
/// from MPI.
impl Messenger for MpiReplica {
    /// No message is exchanged: each collective of the group makes its communicator among the
    /// members alone (`MPI_Comm_create_group`), so the other ranks need not take part.
    fn subgroup(&self, members: &[usize]) -> Result<Option<Arc<dyn Messenger>>> {
        roll_core::strategy::check_members(members, self.world.size)?;
        group_of(&self.world, members, self.device)
    }

    fn send(&self, to: usize, bytes: &[u8]) -> Result<()> {
        let to = self.peer(to, "message receiver")?;
        send_tagged(
            &self.world,
            &self.world.universe.world(),
            to,
            MESSAGE_TAG,
            bytes,
        )
    }

    fn receive(&self, from: usize, timeout: Duration) -> Result<Option<Vec<u8>>> {
        let from = self.peer(from, "message sender")?;
        let world = self.world.universe.world();
        receive_tagged(&self.world, &world, from, MESSAGE_TAG, timeout)
    }

    /// A group of every rank whose collectives make communicators with a tag of its own (see
    /// [`MpiGroup`]).
    fn channel(&self) -> Result<Arc<dyn Messenger>> {
        let members: Vec<i32> = (0..self.world.size)
            .map(|m| self.peer(m, "channel member"))
            .collect::<Result<_>>()?;
        self.world.channel(&members, self.world.rank, self.device)
    }
}

/// A sub-group's messages go between its members' processes with the group's own tag.
impl Messenger for MpiGroup {
    /// Members are ranks of this group; as [`MpiReplica`]'s, no message is exchanged.
    fn subgroup(&self, members: &[usize]) -> Result<Option<Arc<dyn Messenger>>> {
        roll_core::strategy::check_members(members, self.size)?;
        let of_job: Vec<usize> = members
            .iter()
            .map(|&m| usize::try_from(self.members[m]).unwrap_or(usize::MAX))
            .collect();
        group_of(&self.world, &of_job, self.device)
    }

    fn send(&self, to: usize, bytes: &[u8]) -> Result<()> {
        check_rank(to, self.size, "message receiver")?;
        let world = self.world.universe.world();
        send_tagged(&self.world, &world, self.members[to], self.tag, bytes)
    }

    fn receive(&self, from: usize, timeout: Duration) -> Result<Option<Vec<u8>>> {
        check_rank(from, self.size, "message sender")?;
        let world = self.world.universe.world();
        receive_tagged(&self.world, &world, self.members[from], self.tag, timeout)
    }

    /// A group of the same members whose collectives make communicators with a tag of its own
    /// (see [`MpiGroup`]).
    fn channel(&self) -> Result<Arc<dyn Messenger>> {
        self.world.channel(&self.members, self.rank, self.device)
    }
}
