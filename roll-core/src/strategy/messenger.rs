//! The [`Messenger`] trait: point-to-point messages between the ranks of a job.

use super::Strategy;
use crate::{Error, Result};
use std::sync::Arc;
use std::time::Duration;

/// A [`Strategy`] whose ranks can also send each other messages, one rank to one rank: how the
/// controller on rank 0 drives the ranks that only generate (disaggregated rollout,
/// `roll_backend_burn::remote`).
///
/// Messages from one rank to another arrive whole and in the order they were sent. A send may
/// wait until the receiver takes the message (MPI's `MPI_Send` does for large messages), so a
/// protocol over a messenger must never have two ranks send to each other at the same time and
/// receive only afterwards: roll's protocols are request and reply — one side sends, the other
/// receives, then the other way round.
///
/// ```
/// use roll_core::strategy::{DeviceSpec, LocalGroup, Messenger};
/// use std::time::Duration;
///
/// let ranks = LocalGroup::replicas(vec![DeviceSpec::Cpu; 2]).unwrap();
/// ranks[0].send(1, b"hello").unwrap();
/// let got = ranks[1].receive(0, Duration::from_secs(1)).unwrap();
/// assert_eq!(got.as_deref(), Some(&b"hello"[..]));
/// assert_eq!(ranks[1].receive(0, Duration::ZERO).unwrap(), None); // nothing more
/// ```
pub trait Messenger: Strategy {
    /// Sends `bytes` to rank `to`.
    ///
    /// # Errors
    /// A rank that is not in the job, a message too large for the transport, or a failed job
    /// ([`Error::ReplicaFailed`](crate::Error::ReplicaFailed)).
    fn send(&self, to: usize, bytes: &[u8]) -> Result<()>;

    /// The next message from rank `from`, waiting at most `timeout` for one; `None` when none
    /// came in time.
    ///
    /// # Errors
    /// A rank that is not in the job, or a failed job
    /// ([`Error::ReplicaFailed`](crate::Error::ReplicaFailed)).
    fn receive(&self, from: usize, timeout: Duration) -> Result<Option<Vec<u8>>>;

    /// A group of some of the job's ranks, with collectives and messages of its own: every rank
    /// of the job calls it with the same `members` (ranks of the job, ascending), as a
    /// collective; a member gets its replica of the group (its rank there is its index in
    /// `members`), any other rank `None`. How the trainers of a job with rollout ranks reduce
    /// among themselves only, and how the ranks holding parts of one model (tensor or pipeline
    /// parallel) exchange them. A sub-group's own sub-groups are formed the same way among its
    /// members.
    ///
    /// # Errors
    /// Members that are not distinct ascending ranks of the job, or a failed collective.
    fn subgroup(&self, members: &[usize]) -> Result<Option<Arc<dyn Messenger>>>;

    /// The same ranks on a channel of their own: its collectives and messages never meet this
    /// group's, so that one thread of each rank may use it while another uses the group — how
    /// the inference engines of training ranks step together (expert-parallel generation beside
    /// the trainers) while their trainers wait for, or make, collectives of their own. Every
    /// rank of the group calls it, as a collective; each call makes a new channel.
    ///
    /// # Errors
    /// A transport that cannot serve two threads at once (an MPI library without
    /// `MPI_THREAD_MULTIPLE`), or a failed collective.
    fn channel(&self) -> Result<Arc<dyn Messenger>>;
}

/// Checks the members of a sub-group ([`Messenger::subgroup`]): distinct ranks of a job of
/// `world_size`, ascending, at least one.
///
/// # Errors
/// [`Error::InvalidValue`] naming the members.
pub fn check_members(members: &[usize], world_size: usize) -> Result<()> {
    let ascending = members.windows(2).all(|w| w[0] < w[1]);
    if !members.is_empty() && ascending && members.iter().all(|&m| m < world_size) {
        return Ok(());
    }
    Err(Error::InvalidValue {
        key: "sub-group members".into(),
        value: format!("{members:?}"),
        allowed: format!("distinct ranks below {world_size}, ascending, at least one"),
        origin: None,
    })
}
