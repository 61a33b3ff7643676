//! Failures, timeouts, stalls and the incident log.

use super::{EnvManager, INCIDENT_LOG, SlotState};
use crate::EnvError;
use crate::manager::Phase;
use crate::manager::book::Lost;
use crate::manager::incident::{Incident, IncidentKind};
use roll_core::episode::EpisodeIds;
use roll_core::scheduler::RolloutStats;
use std::time::Instant;

impl EnvManager {
    /// Writes off a failed episode: counts it, records the incident, replaces it in its group.
    pub(super) fn lose(
        &mut self,
        slot: usize,
        job: u64,
        episode: Option<EpisodeIds>,
        kind: IncidentKind,
        stats: &mut RolloutStats,
    ) {
        self.fail(stats, true);
        self.last_error = Some(match &kind {
            IncidentKind::Panicked { message } => format!("panicked: {message}"),
            IncidentKind::Failed { error } => error.clone(),
            IncidentKind::TimedOut { phase, after } => {
                format!("{} timed out after {after:?}", phase.as_str())
            }
            _ => String::new(),
        });
        self.record(slot, episode, kind);
        if let Lost::GroupDropped { failures } = self.book.lost(job, true) {
            stats.prompts_started += 1;
            self.record(slot, episode, IncidentKind::GroupDropped { failures });
        }
    }

    pub(super) fn fail(&mut self, stats: &mut RolloutStats, episode_lost: bool) {
        self.consecutive_failures += 1;
        if episode_lost {
            stats.samples_failed += 1;
            self.totals.episodes_failed += 1;
        }
    }

    /// Restarts threads stuck in environment code past the step timeout, and reports stalls.
    pub(super) fn check_threads(&mut self, stats: &mut RolloutStats) -> Result<(), EnvError> {
        let now = Instant::now();
        for index in 0..self.slots.len() {
            let status = self.slots[index].shared.status(self.factory.kind());
            let waited = now.saturating_duration_since(status.since);
            let busy = matches!(
                self.slots[index].state,
                SlotState::Busy(_) | SlotState::Starting
            );
            if !busy {
                continue;
            }
            if status.phase != Phase::Idle
                && waited > self.config.hung_timeout
                && self.slots[index].stall_reported != Some(status.since)
            {
                self.slots[index].stall_reported = Some(status.since);
                self.totals.stalls += 1;
                stats.calls_overdue += 1;
                let kind = IncidentKind::Stalled {
                    phase: status.phase,
                    since: status.since,
                };
                self.record(index, status.episode, kind);
            }
            if status.phase.in_env() && waited > self.config.step_timeout {
                self.abandon(index, status.phase, status.episode, stats)?;
            }
        }
        Ok(())
    }

    /// Gives up on a hung thread: its episode is lost and a new thread takes its place.
    pub(super) fn abandon(
        &mut self,
        index: usize,
        phase: Phase,
        episode: Option<EpisodeIds>,
        stats: &mut RolloutStats,
    ) -> Result<(), EnvError> {
        self.totals.timeouts += 1;
        let slot = &mut self.slots[index];
        slot.shared.abandon();
        slot.jobs = None;
        let kind = IncidentKind::TimedOut {
            phase,
            after: self.config.step_timeout,
        };
        match slot.state {
            SlotState::Busy(job) => self.lose(index, job, episode, kind, stats),
            _ => {
                self.fail(stats, false);
                self.record(index, None, kind);
            }
        }
        self.start_thread(index, true)
    }

    pub(super) fn record(&mut self, slot: usize, episode: Option<EpisodeIds>, kind: IncidentKind) {
        let label = match &kind {
            IncidentKind::Panicked { .. } => "panicked",
            IncidentKind::TimedOut { .. } => "timed_out",
            IncidentKind::Failed { .. } => "failed",
            IncidentKind::BuildFailed { .. } => "build_failed",
            IncidentKind::Stalled { .. } => "stalled",
            IncidentKind::GroupDropped { .. } => "group_dropped",
        };
        metrics::counter!(
            "roll_env_incidents_total",
            "env" => self.factory.kind().to_string(),
            "kind" => label
        )
        .increment(1);
        let incident = Incident {
            at: Instant::now(),
            slot,
            env: self.factory.kind().to_string(),
            episode,
            kind,
        };
        if let Some(hook) = &self.hook {
            hook(&incident);
        }
        if self.incidents.len() == INCIDENT_LOG {
            self.incidents.pop_front();
        }
        self.incidents.push_back(incident);
    }
}
