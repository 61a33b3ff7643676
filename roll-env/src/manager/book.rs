//! The manager's bookkeeping of groups and episodes, without threads: which episodes to start
//! next, which group a result belongs to, when a group is complete, what to replace.

use roll_core::episode::EpisodeIds;
use roll_core::scheduler::sample_seed;
use roll_core::{AbortHandle, AbortSignal, Group, GroupId, SampleId, Trajectory};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// An episode that has been created and not yet accounted for.
pub(crate) struct JobInfo {
    pub(crate) ids: EpisodeIds,
    abort: AbortHandle,
    signal: AbortSignal,
}

struct OpenGroup {
    done: Vec<Trajectory>,
    failed: u32,
    /// Jobs queued or running.
    outstanding: BTreeSet<u64>,
}

/// Where a finished trajectory went.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Landed {
    /// Into its group, which needs more.
    Counted,
    /// Into its group, which is now complete (its other episodes were aborted).
    Completed,
    /// Nowhere: its group was already complete or dropped (a redundant episode).
    Late,
}

/// What losing an episode (failure or abort) did to its group.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Lost {
    /// This many replacement episodes were queued (possibly 0: redundancy covers it).
    Requeued(usize),
    /// The group failed more episodes than it started, was dropped, and a new group started.
    GroupDropped { failures: u32 },
    /// The episode's group was already complete or dropped.
    Ignored,
}

pub(crate) struct Book {
    group_size: usize,
    per_group: usize,
    seed: u64,
    jobs: HashMap<u64, JobInfo>,
    groups: BTreeMap<GroupId, OpenGroup>,
    /// The first `group_size` episodes of each group, and replacements (in front).
    primary: VecDeque<u64>,
    /// Redundant episodes: started only when no primary episode waits.
    spare: VecDeque<u64>,
    ready: Vec<Group>,
    next_group: u64,
    next_sample: u64,
    next_job: u64,
}

impl Book {
    pub(crate) fn new(group_size: usize, redundancy: usize, seed: u64) -> Self {
        Self {
            group_size: group_size.max(1),
            per_group: group_size.max(1).saturating_add(redundancy),
            seed,
            jobs: HashMap::new(),
            groups: BTreeMap::new(),
            primary: VecDeque::new(),
            spare: VecDeque::new(),
            ready: Vec::new(),
            next_group: 0,
            next_sample: 0,
            next_job: 0,
        }
    }

    /// The next group and sample ids.
    pub(crate) fn position(&self) -> (u64, u64) {
        (self.next_group, self.next_sample)
    }

    /// Continues the id streams at `(next_group, next_sample)`.
    pub(crate) fn resume_at(&mut self, (next_group, next_sample): (u64, u64)) {
        self.next_group = next_group;
        self.next_sample = next_sample;
    }

    /// Groups started and not yet complete, dropped or aborted.
    pub(crate) fn open_groups(&self) -> Vec<GroupId> {
        self.groups.keys().copied().collect()
    }

    /// Opens a group and queues its episodes, all on the group's seed.
    pub(crate) fn start_group(&mut self) -> GroupId {
        let id = GroupId(self.next_group);
        self.next_group += 1;
        self.open(id);
        id
    }

    /// Opens group `id` again (one that was open when a checkpoint was taken): the same seed,
    /// new sample ids.
    pub(crate) fn reopen_group(&mut self, id: GroupId) {
        if !self.groups.contains_key(&id) {
            self.open(id);
        }
    }

    fn open(&mut self, id: GroupId) {
        let seed = sample_seed(self.seed, id.0, 0);
        self.groups.insert(
            id,
            OpenGroup {
                done: Vec::with_capacity(self.group_size),
                failed: 0,
                outstanding: BTreeSet::new(),
            },
        );
        for i in 0..self.per_group {
            let job = self.new_job(id, seed);
            if i < self.group_size {
                self.primary.push_back(job);
            } else {
                self.spare.push_back(job);
            }
        }
    }

    fn new_job(&mut self, group: GroupId, seed: u64) -> u64 {
        let id = self.next_job;
        self.next_job += 1;
        let ids = EpisodeIds {
            sample: SampleId(self.next_sample),
            group,
            seed,
        };
        self.next_sample += 1;
        let (abort, signal) = AbortHandle::new();
        self.jobs.insert(id, JobInfo { ids, abort, signal });
        if let Some(g) = self.groups.get_mut(&group) {
            g.outstanding.insert(id);
        }
        id
    }

    /// The next episode to start, if any.
    pub(crate) fn next_job(&mut self) -> Option<(u64, EpisodeIds, AbortSignal)> {
        while let Some(id) = self.primary.pop_front().or_else(|| self.spare.pop_front()) {
            if let Some(j) = self.jobs.get(&id) {
                return Some((id, j.ids, j.signal.clone()));
            }
        }
        None
    }

    /// Puts a job that could not be handed to a thread back in front.
    pub(crate) fn requeue(&mut self, job: u64) {
        if self.jobs.contains_key(&job) {
            self.primary.push_front(job);
        }
    }

    /// The episode of a job still accounted for.
    pub(crate) fn job(&self, id: u64) -> Option<&JobInfo> {
        self.jobs.get(&id)
    }

    /// Records a finished trajectory.
    pub(crate) fn finished(
        &mut self,
        job: u64,
        trajectory: Trajectory,
    ) -> roll_core::Result<Landed> {
        let Some(info) = self.jobs.remove(&job) else {
            return Ok(Landed::Late);
        };
        let Some(g) = self.groups.get_mut(&info.ids.group) else {
            return Ok(Landed::Late);
        };
        g.outstanding.remove(&job);
        g.done.push(trajectory);
        if g.done.len() < self.group_size {
            return Ok(Landed::Counted);
        }
        let id = info.ids.group;
        if let Some(mut g) = self.close(id) {
            g.done.sort_by_key(|t| t.id);
            let prompt = g.done[0].prompt.clone();
            self.ready.push(Group::new(id, prompt, g.done)?);
        }
        Ok(Landed::Completed)
    }

    /// Records an episode that produced nothing (`failure`: it failed, rather than was aborted).
    pub(crate) fn lost(&mut self, job: u64, failure: bool) -> Lost {
        let Some(info) = self.jobs.remove(&job) else {
            return Lost::Ignored;
        };
        // An abandoned thread that wakes up must not go on generating.
        info.abort.abort();
        let id = info.ids.group;
        let Some(g) = self.groups.get_mut(&id) else {
            return Lost::Ignored;
        };
        g.outstanding.remove(&job);
        if failure {
            g.failed += 1;
        }
        if g.failed as usize > self.per_group {
            let failures = g.failed;
            self.close(id);
            self.start_group();
            return Lost::GroupDropped { failures };
        }
        let needed = self
            .group_size
            .saturating_sub(g.done.len() + g.outstanding.len());
        for _ in 0..needed {
            let job = self.new_job(id, info.ids.seed);
            self.primary.push_front(job);
        }
        Lost::Requeued(needed)
    }

    /// Removes a group and aborts its outstanding episodes.
    fn close(&mut self, id: GroupId) -> Option<OpenGroup> {
        let g = self.groups.remove(&id)?;
        for job in &g.outstanding {
            if let Some(j) = self.jobs.remove(job) {
                j.abort.abort();
            }
        }
        Some(g)
    }

    /// The complete group that completed first, if any.
    pub(crate) fn pop_ready(&mut self) -> Option<Group> {
        (!self.ready.is_empty()).then(|| self.ready.remove(0))
    }

    /// The ids of the complete groups not yet taken.
    pub(crate) fn ready_ids(&self) -> impl Iterator<Item = GroupId> + '_ {
        self.ready.iter().map(Group::id)
    }

    /// Complete groups not yet taken.
    pub(crate) fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// Complete groups, in completion order.
    pub(crate) fn take_ready(&mut self) -> Vec<Group> {
        std::mem::take(&mut self.ready)
    }

    /// Aborts and forgets everything open.
    pub(crate) fn abort_all(&mut self) {
        for j in self.jobs.values() {
            j.abort.abort();
        }
        self.jobs.clear();
        self.groups.clear();
        self.primary.clear();
        self.spare.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roll_core::Prompt;
    use roll_core::PromptId;
    use std::sync::Arc;

    fn trajectory(ids: EpisodeIds) -> Trajectory {
        let prompt = Arc::new(Prompt::new(PromptId(ids.seed), "p", "env"));
        Trajectory::new(ids.sample, ids.group, prompt, vec![1])
    }

    fn take(book: &mut Book) -> (u64, EpisodeIds, AbortSignal) {
        book.next_job().unwrap()
    }

    #[test]
    fn a_group_completes_with_its_first_group_size_episodes_and_aborts_the_rest() {
        let mut book = Book::new(2, 1, 7);
        let g = book.start_group();
        let jobs: Vec<_> = (0..3).map(|_| take(&mut book)).collect();
        assert!(book.next_job().is_none());
        assert!(
            jobs.iter()
                .all(|j| j.1.group == g && j.1.seed == jobs[0].1.seed)
        );
        // The redundant episode finishes first, then one primary: complete.
        assert_eq!(
            book.finished(jobs[2].0, trajectory(jobs[2].1)).unwrap(),
            Landed::Counted
        );
        assert_eq!(
            book.finished(jobs[0].0, trajectory(jobs[0].1)).unwrap(),
            Landed::Completed
        );
        assert!(jobs[1].2.is_aborted());
        assert_eq!(
            book.finished(jobs[1].0, trajectory(jobs[1].1)).unwrap(),
            Landed::Late
        );
        let ready = book.take_ready();
        assert_eq!(ready.len(), 1);
        let ids: Vec<u64> = ready[0].samples().iter().map(|s| s.id.0).collect();
        assert_eq!(ids, vec![jobs[0].1.sample.0, jobs[2].1.sample.0]);
    }

    #[test]
    fn primaries_go_before_spares_and_failures_are_replaced_on_the_same_seed() {
        let mut book = Book::new(2, 1, 7);
        let a = book.start_group();
        let b = book.start_group();
        let order: Vec<GroupId> = (0..4).map(|_| take(&mut book).1.group).collect();
        assert_eq!(order, vec![a, a, b, b]);
        let spare_a = take(&mut book);
        let spare_b = take(&mut book);
        // Losing the spare of `a` needs no replacement; losing a second episode does.
        assert_eq!(book.lost(spare_a.0, true), Lost::Requeued(0));
        let job = book.job(0).map(|j| j.ids).unwrap();
        assert_eq!(book.lost(0, true), Lost::Requeued(1));
        assert!(spare_a.2.is_aborted(), "a lost episode is aborted");
        let replacement = take(&mut book);
        assert_eq!((replacement.1.group, replacement.1.seed), (a, job.seed));
        assert_ne!(replacement.1.sample, job.sample);
        assert_eq!(book.lost(spare_b.0, false), Lost::Requeued(0));
    }

    #[test]
    fn a_group_that_fails_more_episodes_than_it_started_is_replaced() {
        let mut book = Book::new(1, 0, 7);
        let g = book.start_group();
        let job = take(&mut book);
        assert_eq!(book.lost(job.0, true), Lost::Requeued(1));
        let job = take(&mut book);
        assert_eq!(job.1.group, g);
        assert_eq!(book.lost(job.0, true), Lost::GroupDropped { failures: 2 });
        let next = take(&mut book);
        assert_eq!(next.1.group, GroupId(1));
        assert_ne!(next.1.seed, job.1.seed);
        book.abort_all();
        assert!(next.2.is_aborted() && book.next_job().is_none());
    }
}
