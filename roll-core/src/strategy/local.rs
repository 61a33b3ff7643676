//! [`LocalGroup`]: data-parallel replicas in one process, one thread each, whose collectives
//! meet in shared memory.
//!
//! This is what data parallelism is on a device without collectives of its own (Burn's CPU
//! backend implements none), and what tests use to check that N replicas train exactly like one.

use super::{DeviceSpec, Messenger, ReduceOp, Strategy, check_members};
use crate::{Error, Result};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A group of in-process replicas; [`LocalGroup::replicas`] hands out one [`LocalReplica`] per
/// device, each to be driven by its own thread.
///
/// Every replica must issue the same collectives in the same order (as with MPI). A reduction
/// combines the contributions in rank order, once, and every replica receives that one result:
/// replicas stay bit-for-bit identical and a run is reproducible whatever the thread timing.
///
/// ```
/// use roll_core::strategy::{DeviceSpec, LocalGroup, ReduceOp, Strategy};
///
/// let replicas = LocalGroup::replicas(vec![DeviceSpec::Cpu; 2]).unwrap();
/// let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
///     let handles: Vec<_> = replicas
///         .iter()
///         .map(|r| {
///             s.spawn(move || {
///                 let mut v = [r.rank() as f32 + 1.0, 10.0];
///                 r.all_reduce(&mut v, ReduceOp::Sum).unwrap();
///                 v.to_vec()
///             })
///         })
///         .collect();
///     handles.into_iter().map(|h| h.join().unwrap()).collect()
/// });
/// assert_eq!(sums, vec![vec![3.0, 20.0], vec![3.0, 20.0]]);
/// ```
#[derive(Debug)]
pub struct LocalGroup {
    devices: Vec<DeviceSpec>,
    round: Mutex<Round>,
    done: Condvar,
    mail: Mutex<Mail>,
    posted: Condvar,
}

/// Point-to-point messages in flight, by (sender, receiver), oldest first.
type Mail = BTreeMap<(usize, usize), VecDeque<Vec<u8>>>;

/// A collective, as every replica must call it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Reduce {
        len: usize,
        op: ReduceOp,
    },
    Broadcast {
        root: usize,
    },
    /// A sub-group of these members (their hash: every rank must name the same).
    Split {
        members: u64,
    },
    AllToAll,
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Reduce { len, op } => write!(f, "{len} values to {op:?}"),
            Self::Broadcast { root } => write!(f, "a broadcast from replica {root}"),
            Self::Split { members } => write!(f, "a sub-group of members hashed {members:x}"),
            Self::AllToAll => f.write_str("an all-to-all"),
        }
    }
}

/// What one replica brings to a collective, and what it gets back.
#[derive(Debug, Clone)]
enum Payload {
    Values(Vec<f32>),
    Bytes(Vec<u8>),
    /// The members of a sub-group to make (contribution), the sub-group (result).
    Members(Vec<usize>),
    Group(Arc<LocalGroup>),
    /// One part per receiver (contribution); every sender's parts, by sender (result).
    Parts(Vec<Vec<f32>>),
    AllParts(Vec<Vec<Vec<f32>>>),
}

/// One collective in progress.
#[derive(Debug, Default)]
struct Round {
    /// Completed collectives; a waiter leaves when it changes.
    generation: u64,
    /// What the round's first caller called: every other must call the same.
    call: Option<Call>,
    contributions: Vec<Option<Payload>>,
    arrived: usize,
    /// The last completed collective's result.
    result: Option<Arc<Payload>>,
    /// The first replica that failed, and why: every collective after it fails.
    failed: Option<(usize, String)>,
}

impl LocalGroup {
    /// One replica per device, ranks in the order given.
    ///
    /// # Errors
    /// [`Error::InvalidValue`] for an empty device list.
    pub fn replicas(devices: Vec<DeviceSpec>) -> Result<Vec<LocalReplica>> {
        if devices.is_empty() {
            return Err(Error::InvalidValue {
                key: "model.data_parallel".into(),
                value: "0".into(),
                allowed: "at least one replica".into(),
                origin: None,
            });
        }
        let world = devices.len();
        let group = Self::new(devices);
        Ok((0..world)
            .map(|rank| LocalReplica {
                rank,
                group: group.clone(),
            })
            .collect())
    }

    fn new(devices: Vec<DeviceSpec>) -> Arc<Self> {
        let world = devices.len();
        Arc::new(Self {
            devices,
            round: Mutex::new(Round {
                contributions: vec![None; world],
                ..Round::default()
            }),
            done: Condvar::new(),
            mail: Mutex::new(BTreeMap::new()),
            posted: Condvar::new(),
        })
    }

    fn world_size(&self) -> usize {
        self.devices.len()
    }

    /// The round's state; a replica that panicked while holding the lock left it consistent
    /// (every update is completed before anything that can panic), so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, Round> {
        self.round.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The failure that ended the group, if one did.
    fn failed(&self) -> Option<Error> {
        self.lock().failed.as_ref().map(|f| self.failure(f))
    }

    fn check_rank(&self, rank: usize, what: &str) -> Result<()> {
        super::check_rank(rank, self.world_size(), what)
    }

    fn failure(&self, (rank, reason): &(usize, String)) -> Error {
        Error::ReplicaFailed {
            rank: *rank,
            world_size: self.world_size(),
            reason: reason.clone(),
        }
    }
}

/// The collective's result from every replica's contribution: reductions combine them in rank
/// order, a broadcast takes the root's.
fn complete(contributions: &mut [Option<Payload>], call: Call, devices: &[DeviceSpec]) -> Payload {
    match call {
        Call::Reduce { op, .. } => {
            let values = contributions.iter().map(|c| match c {
                Some(Payload::Values(v)) => v.as_slice(),
                _ => &[],
            });
            Payload::Values(reduce(values, op))
        }
        Call::Broadcast { root } => contributions[root]
            .take()
            .unwrap_or(Payload::Bytes(Vec::new())),
        Call::Split { .. } => {
            let members = match contributions.first() {
                Some(Some(Payload::Members(m))) => m.clone(),
                _ => Vec::new(),
            };
            Payload::Group(LocalGroup::new(
                members.iter().map(|&m| devices[m]).collect(),
            ))
        }
        Call::AllToAll => Payload::AllParts(
            contributions
                .iter_mut()
                .map(|c| match c.take() {
                    Some(Payload::Parts(parts)) => parts,
                    _ => Vec::new(),
                })
                .collect(),
        ),
    }
}

/// Combines contributions in rank order.
fn reduce<'a>(contributions: impl ExactSizeIterator<Item = &'a [f32]>, op: ReduceOp) -> Vec<f32> {
    let n = contributions.len() as f32;
    let mut parts = contributions;
    let mut out = parts.next().map(<[f32]>::to_vec).unwrap_or_default();
    for part in parts {
        for (o, &v) in out.iter_mut().zip(part) {
            *o = match op {
                ReduceOp::Sum | ReduceOp::Mean => *o + v,
                ReduceOp::Max => o.max(v),
                ReduceOp::Min => o.min(v),
            };
        }
    }
    if op == ReduceOp::Mean {
        out.iter_mut().for_each(|o| *o /= n);
    }
    out
}

/// One member of a [`LocalGroup`].
#[derive(Debug, Clone)]
pub struct LocalReplica {
    rank: usize,
    group: Arc<LocalGroup>,
}

impl LocalReplica {
    /// Takes part in one collective: waits for every replica's contribution (or a failure),
    /// and returns the result, computed once by the last to arrive.
    fn exchange(&self, call: Call, contribution: Payload) -> Result<Arc<Payload>> {
        let group = &self.group;
        let mut round = group.lock();
        if let Some(failed) = &round.failed {
            return Err(group.failure(failed));
        }
        match round.call {
            None => round.call = Some(call),
            Some(expected) if expected != call => {
                let error = Error::CollectiveMismatch {
                    rank: self.rank,
                    expected: expected.to_string(),
                    got: call.to_string(),
                };
                round.failed = Some((self.rank, error.to_string()));
                group.done.notify_all();
                return Err(error);
            }
            Some(_) => {}
        }
        round.contributions[self.rank] = Some(contribution);
        round.arrived += 1;
        if round.arrived == group.world_size() {
            let result = complete(&mut round.contributions, call, &group.devices);
            round.result = Some(Arc::new(result));
            round.contributions.iter_mut().for_each(|c| *c = None);
            round.arrived = 0;
            round.call = None;
            round.generation += 1;
            group.done.notify_all();
        } else {
            let generation = round.generation;
            while round.generation == generation && round.failed.is_none() {
                round = group.done.wait(round).unwrap_or_else(|e| e.into_inner());
            }
            if round.generation == generation
                && let Some(failed) = &round.failed
            {
                return Err(group.failure(failed));
            }
        }
        round
            .result
            .clone()
            .ok_or_else(|| Error::Strategy("a collective completed without a result".into()))
    }
}

impl Strategy for LocalReplica {
    fn name(&self) -> String {
        let devices: Vec<String> = self.group.devices.iter().map(|d| d.to_string()).collect();
        format!("data_parallel[{}]", devices.join(","))
    }

    fn devices(&self) -> Vec<DeviceSpec> {
        vec![self.group.devices[self.rank]]
    }

    fn world_size(&self) -> usize {
        self.group.world_size()
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn all_reduce(&self, values: &mut [f32], op: ReduceOp) -> Result<()> {
        let call = Call::Reduce {
            len: values.len(),
            op,
        };
        if let Payload::Values(v) = self
            .exchange(call, Payload::Values(values.to_vec()))?
            .as_ref()
        {
            values.copy_from_slice(v);
        }
        Ok(())
    }

    fn broadcast(&self, bytes: &mut Vec<u8>, root: usize) -> Result<()> {
        self.group.check_rank(root, "broadcast root")?;
        let call = Call::Broadcast { root };
        let mine = if self.rank == root {
            std::mem::take(bytes)
        } else {
            Vec::new()
        };
        if let Payload::Bytes(b) = self.exchange(call, Payload::Bytes(mine))?.as_ref() {
            bytes.clone_from(b);
        }
        Ok(())
    }

    fn all_to_all(&self, send: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>> {
        super::check_parts(send.len(), self.world_size())?;
        let result = self.exchange(Call::AllToAll, Payload::Parts(send))?;
        let Payload::AllParts(all) = result.as_ref() else {
            return Err(Error::Strategy(
                "an all-to-all completed without parts".into(),
            ));
        };
        Ok(all
            .iter()
            .map(|parts| parts.get(self.rank).cloned().unwrap_or_default())
            .collect())
    }

    fn abort(&self, reason: &str) {
        let mut round = self.group.lock();
        if round.failed.is_none() {
            round.failed = Some((self.rank, reason.to_string()));
        }
        self.group.done.notify_all();
        drop(round);
        // A receiver waiting for mail learns of the failure too.
        let _mail = self.group.mail.lock();
        self.group.posted.notify_all();
    }
}

impl Messenger for LocalReplica {
    fn subgroup(&self, members: &[usize]) -> Result<Option<Arc<dyn Messenger>>> {
        check_members(members, self.world_size())?;
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(members, &mut hasher);
        let call = Call::Split {
            members: std::hash::Hasher::finish(&hasher),
        };
        let result = self.exchange(call, Payload::Members(members.to_vec()))?;
        let Some(rank) = members.iter().position(|&m| m == self.rank) else {
            return Ok(None);
        };
        match result.as_ref() {
            Payload::Group(group) => Ok(Some(Arc::new(LocalReplica {
                rank,
                group: group.clone(),
            }))),
            _ => Err(Error::Strategy("a split completed without a group".into())),
        }
    }

    /// A group of every member, made as [`Messenger::subgroup`] makes one: a new group with
    /// collectives and mail of its own.
    fn channel(&self) -> Result<Arc<dyn Messenger>> {
        let all: Vec<usize> = (0..self.world_size()).collect();
        self.subgroup(&all)?
            .ok_or_else(|| Error::Strategy("a replica is not a member of its own group".into()))
    }

    fn send(&self, to: usize, bytes: &[u8]) -> Result<()> {
        let group = &self.group;
        group.check_rank(to, "message receiver")?;
        if let Some(failed) = group.failed() {
            return Err(failed);
        }
        let mut mail = group.mail.lock().unwrap_or_else(|e| e.into_inner());
        mail.entry((self.rank, to))
            .or_default()
            .push_back(bytes.to_vec());
        group.posted.notify_all();
        Ok(())
    }

    fn receive(&self, from: usize, timeout: Duration) -> Result<Option<Vec<u8>>> {
        let group = &self.group;
        group.check_rank(from, "message sender")?;
        let deadline = Instant::now() + timeout;
        let mut mail = group.mail.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(bytes) = mail
                .get_mut(&(from, self.rank))
                .and_then(VecDeque::pop_front)
            {
                return Ok(Some(bytes));
            }
            // Lock order: mail, then round (`abort` never holds both).
            if let Some(failed) = group.failed() {
                return Err(failed);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            mail = group
                .posted
                .wait_timeout(mail, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Runs `body` on every replica's thread; results in rank order.
    fn on_each<T: Send>(
        replicas: &[LocalReplica],
        body: impl Fn(&LocalReplica) -> T + Sync,
    ) -> Vec<T> {
        std::thread::scope(|s| {
            let handles: Vec<_> = replicas
                .iter()
                .map(|r| {
                    let body = &body;
                    s.spawn(move || body(r))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn reductions_agree_on_every_replica_round_after_round() {
        let replicas = LocalGroup::replicas(vec![DeviceSpec::Cpu; 3]).unwrap();
        let out = on_each(&replicas, |r| {
            let x = r.rank() as f32;
            let mut seen = Vec::new();
            for round in 0..50 {
                let mut v = [x + round as f32, -x];
                r.all_reduce(&mut v, ReduceOp::Sum).unwrap();
                seen.push(v);
                let mut m = [x, x];
                r.all_reduce(&mut m, ReduceOp::Max).unwrap();
                let mut n = [x];
                r.all_reduce(&mut n, ReduceOp::Min).unwrap();
                let mut mean = [x * 3.0];
                r.all_reduce(&mut mean, ReduceOp::Mean).unwrap();
                seen.push([m[0], n[0] + mean[0]]);
            }
            seen
        });
        // Ranks 0, 1, 2: sums 3 + 3·round and −3; max 2; min 0 plus mean of 0, 3, 6 = 3.
        for seen in &out {
            for round in 0..50 {
                assert_eq!(seen[2 * round], [3.0 + 3.0 * round as f32, -3.0]);
                assert_eq!(seen[2 * round + 1], [2.0, 3.0]);
            }
        }
    }

    #[test]
    fn sums_are_taken_in_rank_order_whatever_the_arrival_order() {
        // In f32, (1 + 1e8) − 1e8 = 0 (1e8 + 1 rounds to 1e8) but (−1e8 + 1e8) + 1 = 1: the
        // result tells which order the sum was taken in.
        let replicas = LocalGroup::replicas(vec![DeviceSpec::Cpu; 3]).unwrap();
        let out = on_each(&replicas, |r| {
            // Ranks arrive in reverse order.
            std::thread::sleep(std::time::Duration::from_millis(20 * (2 - r.rank()) as u64));
            let mut v = [[1.0f32, 1e8, -1e8][r.rank()]];
            r.all_reduce(&mut v, ReduceOp::Sum).unwrap();
            v[0]
        });
        assert_eq!(out, vec![0.0; 3]);
    }

    #[test]
    fn a_failed_replica_releases_the_others_with_its_rank_and_reason() {
        let replicas = LocalGroup::replicas(vec![DeviceSpec::Cpu; 3]).unwrap();
        let out = on_each(&replicas, |r| {
            if r.rank() == 1 {
                std::thread::sleep(std::time::Duration::from_millis(30));
                r.abort("sample#7: token out of vocabulary");
                return None;
            }
            let mut v = [1.0];
            Some(r.all_reduce(&mut v, ReduceOp::Sum).unwrap_err().to_string())
        });
        for err in [&out[0], &out[2]] {
            let err = err.as_deref().unwrap();
            assert!(
                err.contains("replica 1 of 3") && err.contains("sample#7"),
                "{err}"
            );
        }
    }

    #[test]
    fn replicas_that_disagree_on_a_collective_get_an_error_not_a_hang() {
        let replicas = LocalGroup::replicas(vec![DeviceSpec::Cpu; 2]).unwrap();
        let out = on_each(&replicas, |r| {
            if r.rank() == 1 {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let mut v = vec![0.0; 1 + r.rank()];
            r.all_reduce(&mut v, ReduceOp::Sum).unwrap_err().to_string()
        });
        assert!(
            out[1].contains("replica 1 passed 2 values to Sum"),
            "{}",
            out[1]
        );
        assert!(out[0].contains("replica 1 of 2 failed"), "{}", out[0]);
    }

    #[test]
    fn broadcasts_deliver_the_roots_bytes_to_everyone() {
        let replicas = LocalGroup::replicas(vec![DeviceSpec::Cpu; 3]).unwrap();
        let out = on_each(&replicas, |r| {
            let mut got = Vec::new();
            for root in [2, 0] {
                let mut bytes = vec![r.rank() as u8; 1 + r.rank()];
                r.broadcast(&mut bytes, root).unwrap();
                got.push(bytes);
            }
            assert!(r.broadcast(&mut Vec::new(), 3).is_err());
            got
        });
        for got in out {
            assert_eq!(got, vec![vec![2, 2, 2], vec![0]]);
        }
    }

    #[test]
    fn messages_arrive_in_order_per_sender_and_only_to_their_receiver() {
        let ranks = LocalGroup::replicas(vec![DeviceSpec::Cpu; 3]).unwrap();
        let wait = Duration::from_secs(5);
        let out = on_each(&ranks, |r| match r.rank() {
            0 => {
                for i in 0..3u8 {
                    r.send(2, &[i]).unwrap();
                }
                vec![]
            }
            1 => {
                r.send(2, &[10]).unwrap();
                // Rank 2 answers only rank 1's message.
                vec![r.receive(2, wait).unwrap().unwrap()]
            }
            _ => {
                let from_0: Vec<Vec<u8>> = (0..3)
                    .map(|_| r.receive(0, wait).unwrap().unwrap())
                    .collect();
                let from_1 = r.receive(1, wait).unwrap().unwrap();
                r.send(1, &[from_1[0] + 1]).unwrap();
                assert_eq!(r.receive(0, Duration::ZERO).unwrap(), None);
                from_0
            }
        });
        assert_eq!(out[1], vec![vec![11]]);
        assert_eq!(out[2], vec![vec![0], vec![1], vec![2]]);
        assert!(ranks[0].send(3, &[]).is_err());
        assert!(ranks[0].receive(7, Duration::ZERO).is_err());
    }

    #[test]
    fn a_receiver_waiting_for_a_failed_rank_gets_its_failure_not_a_hang() {
        let ranks = LocalGroup::replicas(vec![DeviceSpec::Cpu; 2]).unwrap();
        let out = on_each(&ranks, |r| {
            if r.rank() == 1 {
                std::thread::sleep(Duration::from_millis(20));
                r.abort("rank 1 (rollout): engine stopped");
                return None;
            }
            Some(
                r.receive(1, Duration::from_secs(60))
                    .unwrap_err()
                    .to_string(),
            )
        });
        let err = out[0].as_deref().unwrap();
        assert!(
            err.contains("replica 1 of 2") && err.contains("rollout"),
            "{err}"
        );
        assert!(
            ranks[1].send(0, &[1]).is_err(),
            "a failed job sends nothing"
        );
    }

    #[test]
    fn a_subgroup_reduces_among_its_members_only() {
        let devices = (0..4).map(DeviceSpec::Cuda).collect();
        let ranks = LocalGroup::replicas(devices).unwrap();
        let out = on_each(&ranks, |r| {
            let sub = r.subgroup(&[0, 2]).unwrap();
            let mine = sub.as_ref().map(|g| {
                let mut v = [r.rank() as f32 + 1.0];
                g.all_reduce(&mut v, ReduceOp::Sum).unwrap();
                (g.rank(), g.world_size(), g.devices(), v[0])
            });
            // The job's own collectives still work beside it.
            let mut all = [1.0];
            r.all_reduce(&mut all, ReduceOp::Sum).unwrap();
            (mine, all[0])
        });
        assert_eq!(out[0].0, Some((0, 2, vec![DeviceSpec::Cuda(0)], 4.0)));
        assert_eq!(out[2].0, Some((1, 2, vec![DeviceSpec::Cuda(2)], 4.0)));
        assert_eq!((out[1].0.clone(), out[3].0.clone()), (None, None));
        assert!(out.iter().all(|o| o.1 == 4.0));
        for bad in [&[][..], &[2, 0], &[0, 4], &[1, 1]] {
            assert!(ranks[0].subgroup(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_channel_serves_a_second_thread_of_every_rank_beside_the_group() {
        let ranks = LocalGroup::replicas(vec![DeviceSpec::Cpu; 2]).unwrap();
        let out = on_each(&ranks, |r| {
            let channel = r.channel().unwrap();
            assert_eq!((channel.rank(), channel.world_size()), (r.rank(), 2));
            // Rank 0's group waits for rank 1's group broadcast, which rank 1 makes only after
            // twenty reductions on the channel that both ranks' second threads take part in:
            // one shared queue of collectives would deadlock here.
            std::thread::scope(|s| {
                let beside = s.spawn(|| {
                    let mut sums = Vec::new();
                    for i in 0..20 {
                        let mut v = [(r.rank() + i) as f32];
                        channel.all_reduce(&mut v, ReduceOp::Sum).unwrap();
                        sums.push(v[0]);
                    }
                    sums
                });
                if r.rank() == 1 {
                    while !beside.is_finished() {
                        std::thread::yield_now();
                    }
                }
                let mut bytes = if r.rank() == 1 { vec![7] } else { Vec::new() };
                r.broadcast(&mut bytes, 1).unwrap();
                (beside.join().unwrap(), bytes)
            })
        });
        for (sums, bytes) in &out {
            assert_eq!(
                sums,
                &(0..20).map(|i| (2 * i + 1) as f32).collect::<Vec<_>>()
            );
            assert_eq!(bytes, &[7]);
        }
    }

    #[test]
    fn all_to_all_delivers_each_part_to_its_receiver() {
        let ranks = LocalGroup::replicas(vec![DeviceSpec::Cpu; 3]).unwrap();
        let out = on_each(&ranks, |r| {
            // Rank s sends rank d `s` copies of `10s + d` (rank 0 sends nothing).
            let me = r.rank();
            let send = (0..3).map(|d| vec![(10 * me + d) as f32; me]).collect();
            r.all_to_all(send).unwrap()
        });
        for (d, got) in out.iter().enumerate() {
            let want: Vec<Vec<f32>> = (0..3).map(|s| vec![(10 * s + d) as f32; s]).collect();
            assert_eq!(got, &want);
        }
        assert!(ranks[0].all_to_all(vec![vec![]; 2]).is_err());
    }

    #[test]
    fn the_group_needs_a_replica_and_names_each_device() {
        assert!(LocalGroup::replicas(Vec::new()).is_err());
        let r = LocalGroup::replicas(vec![DeviceSpec::Cuda(0), DeviceSpec::Cuda(1)]).unwrap();
        assert_eq!(r[1].devices(), vec![DeviceSpec::Cuda(1)]);
        assert_eq!((r[1].rank(), r[1].world_size()), (1, 2));
        assert_eq!(r[0].name(), "data_parallel[cuda:0,cuda:1]");
    }
}
