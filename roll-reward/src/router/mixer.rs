//! [`PromptMixer`]: the prompt stream of an RLVR run, its domains mixed by their ratios.

use super::quota::DomainQuota;
use super::status::{MixerEnd, MixerStatus};
use crate::error::RewardError;
use roll_core::config::{DomainConfig, DomainMap};
use roll_core::{Error, Prompt};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// A boxed item iterator that can move into a scheduler's task.
type Source<T> = Box<dyn Iterator<Item = T> + Send>;

/// The prompts of several domains as one stream, in the ratios of a [`DomainQuota`]: every
/// consecutive run of `batch_size` prompts holds each domain's share to within one prompt,
/// interleaved round-robin. It is an `Iterator<Item = Prompt> + Send + 'static`, so it is what
/// an RLVR run hands to `RlvrScheduler::new` as its prompt source.
///
/// Two ways to build it:
///
/// * [`from_config`](Self::from_config) / [`by_tag`](Self::by_tag): one dataset of prompts of
///   any tags. This is where a prompt's domain is resolved — once, by the run's [`DomainMap`] —
///   so the reward router, the reward cache and the batch builder downstream all see the
///   domain, never the tag, and two datasets of one domain are one domain.
/// * [`new`](Self::new): one iterator per domain (endless streams included), items taken as
///   they are (prompts keep the domain they carry).
///
/// # A dataset is read whole, when the mixer is built
///
/// `from_config` resolves and splits the whole dataset up front, so a bad dataset fails before
/// any generation runs, with one error listing every unknown tag ([`DomainMap::split`]), and a
/// domain with a positive ratio but no prompts is an error too. An unknown tag is never
/// skipped: it usually covers a whole dataset, and skipping it would silently train without
/// that dataset. The alternative — resolving lazily while the scheduler draws — cannot report
/// an error at all (a scheduler's prompt source is an `Iterator<Item = Prompt>` that cannot
/// fail), and would have to buffer the prompts of over-represented domains without bound
/// whenever the dataset's mix differs from the ratios. The cost: the dataset must be finite
/// (it is held in memory, as a run holds it anyway).
///
/// # When a domain runs dry
///
/// * From a dataset (`from_config`, `by_tag`): each domain's prompts start over, in the same
///   order, once they are used up — an epoch per domain, as ROLL's per-domain schedulers do,
///   so a small domain repeats more often than a large one and the ratios hold for the whole
///   run. The stream is endless; the run's step count ends it.
/// * From per-domain iterators (`new`): iteration ends when a domain cannot fill its share of
///   a batch ([`MixerEnd::Exhausted`], naming the domain, in the [`MixerStatus`] — take it with
///   [`status`](Self::status) before the mixer moves into a scheduler). The prompts already
///   drawn for that batch are not yielded, so every yielded batch keeps the ratios; the other
///   domains' prompts stay unread. Repeat a source with `.cycle()` for several epochs.
///
/// Metrics: counter `roll_mixer_prompts_total` with label `domain` (prompts drawn per domain).
///
/// ```
/// use roll_core::config::{ComponentSpec, DomainConfig};
/// use roll_core::{Prompt, PromptId};
/// use roll_reward::router::PromptMixer;
/// use std::collections::BTreeMap;
///
/// let mut math = DomainConfig::new(ComponentSpec::new("math_rule"));
/// math.tags = vec!["gsm8k".into(), "math500".into()];
/// math.ratio = 2.0;
/// let code = DomainConfig::new(ComponentSpec::new("code_sandbox"));
/// let domains = BTreeMap::from([("math".to_owned(), math), ("code".to_owned(), code)]);
///
/// let tags = ["gsm8k", "math500", "gsm8k", "code"];
/// let dataset = tags.iter().enumerate().map(|(i, t)| Prompt::new(PromptId(i as u64), "q", *t));
/// let mixer = PromptMixer::from_config(&domains, dataset, 3)?;
/// // Each run of 3 holds 1 code and 2 math prompts; the single code prompt repeats.
/// let got: Vec<(u64, String)> = mixer.take(6).map(|p| (p.id.0, p.domain)).collect();
/// let want = [(3, "code"), (0, "math"), (1, "math"), (3, "code"), (2, "math"), (0, "math")];
/// assert_eq!(got, want.map(|(id, d)| (id, d.to_owned())));
///
/// let bad = [Prompt::new(PromptId(9), "q", "chem")];
/// let err = PromptMixer::from_config(&domains, bad, 3).unwrap_err().to_string();
/// assert!(err.contains("tag `chem` (1, first prompt#9)"), "{err}");
/// # Ok::<(), roll_reward::RewardError>(())
/// ```
pub struct PromptMixer<T = Prompt> {
    quota: DomainQuota,
    /// Aligned with the quota's domains; `None` for a zero-ratio domain, never drawn from.
    sources: Vec<Option<Source<T>>>,
    batch_size: usize,
    ready: VecDeque<T>,
    status: MixerStatus,
}

impl<T> std::fmt::Debug for PromptMixer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptMixer")
            .field("quota", &self.quota)
            .field("batch_size", &self.batch_size)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static> PromptMixer<T> {
    /// A mixer over `sources`, one iterator per domain of `quota` (in any order; zero-ratio
    /// domains may be left out), whose stream keeps the ratios in every run of `batch_size`.
    /// Items are yielded as they are.
    ///
    /// # Errors
    /// [`RewardError::InvalidConfig`] if a domain with a positive ratio has no source, a source
    /// names an unknown domain, or `batch_size` is 0.
    pub fn new<S, I, Src>(
        quota: DomainQuota,
        sources: Src,
        batch_size: usize,
    ) -> Result<Self, RewardError>
    where
        S: Into<String>,
        I: Iterator<Item = T> + Send + 'static,
        Src: IntoIterator<Item = (S, I)>,
    {
        check_batch_size(batch_size)?;
        let mut by_name: BTreeMap<String, Source<T>> = sources
            .into_iter()
            .map(|(n, i)| (n.into(), Box::new(i) as Source<T>))
            .collect();
        let mut aligned = Vec::with_capacity(quota.domains().len());
        let mut missing = Vec::new();
        for (name, &p) in quota.domains().iter().zip(quota.probabilities()) {
            let source = by_name.remove(name);
            if source.is_none() && p > 0.0 {
                missing.push(format!("`{name}`"));
            }
            // A zero-ratio domain is never drawn from, whatever it was given.
            aligned.push(source.filter(|_| p > 0.0));
        }
        if !missing.is_empty() {
            return Err(RewardError::invalid_config(
                "prompt mixer",
                format!("no prompt source for {}", missing.join(", ")),
            ));
        }
        if let Some(extra) = by_name.keys().next() {
            return Err(RewardError::invalid_config(
                "prompt mixer",
                format!("a prompt source for `{extra}`, which is not a domain of the quota"),
            ));
        }
        Ok(Self {
            quota,
            sources: aligned,
            batch_size,
            ready: VecDeque::with_capacity(batch_size),
            status: MixerStatus::default(),
        })
    }
}

impl PromptMixer<Prompt> {
    /// The prompt stream of a run's `[domains]` config: the `dataset` (prompts of any tags,
    /// finite) resolved to its domains by the config's tags, each domain repeating, yielded in
    /// the config's ratios in runs of `batch_size` (typically `rollout.prompts_per_step`).
    ///
    /// # Errors
    /// [`RewardError::InvalidConfig`] for prompts whose tag no domain claims (listing every
    /// unknown tag), a domain with a positive ratio and no prompts, tags that resolve
    /// ambiguously (naming the `domains.<name>.tags.<i>` key), invalid ratios, or a
    /// `batch_size` of 0.
    pub fn from_config(
        domains: &BTreeMap<String, DomainConfig>,
        dataset: impl IntoIterator<Item = Prompt>,
        batch_size: usize,
    ) -> Result<Self, RewardError> {
        let map = DomainMap::from_config(domains).map_err(|e| invalid("domains", e))?;
        Self::by_tag(
            DomainQuota::from_domains(domains)?,
            &map,
            dataset,
            batch_size,
        )
    }

    /// [`from_config`](Self::from_config) with the quota and the resolver given separately
    /// (they must name the same domains).
    ///
    /// # Errors
    /// As [`from_config`](Self::from_config), and if `quota` and `map` name different domains.
    pub fn by_tag(
        quota: DomainQuota,
        map: &DomainMap,
        dataset: impl IntoIterator<Item = Prompt>,
        batch_size: usize,
    ) -> Result<Self, RewardError> {
        check_batch_size(batch_size)?;
        let in_quota: BTreeSet<&String> = quota.domains().iter().collect();
        let in_map: BTreeSet<&String> = map.domains().iter().collect();
        if let Some(d) = in_quota.symmetric_difference(&in_map).next() {
            let (has, lacks) = if in_quota.contains(d) {
                ("the quota", "the tag map")
            } else {
                ("the tag map", "the quota")
            };
            return Err(RewardError::invalid_config(
                "prompt mixer",
                format!("domain `{d}` is in {has} but not in {lacks}"),
            ));
        }
        let mut split = map
            .split(dataset)
            .map_err(|e| invalid("prompt dataset", e))?;
        let mut sources: Vec<(String, std::iter::Cycle<std::vec::IntoIter<Prompt>>)> = Vec::new();
        let mut empty = Vec::new();
        let mut skipped = 0;
        for (name, &p) in quota.domains().iter().zip(quota.probabilities()) {
            let prompts = split.remove(name).unwrap_or_default();
            if p == 0.0 {
                skipped += prompts.len();
            } else if prompts.is_empty() {
                empty.push(format!("`{name}`"));
            } else {
                sources.push((name.clone(), prompts.into_iter().cycle()));
            }
        }
        if !empty.is_empty() {
            return Err(RewardError::invalid_config(
                "prompt dataset",
                format!(
                    "no prompts for {}, which the ratios sample from (give the domain prompts \
                     tagged with its name or one of its `tags`, or set its ratio to 0)",
                    empty.join(", ")
                ),
            ));
        }
        let mixer = Self::new(quota, sources, batch_size)?;
        mixer.status.count_skipped(skipped);
        Ok(mixer)
    }
}

impl<T> PromptMixer<T> {
    /// The quota, with its running deficits.
    pub fn quota(&self) -> &DomainQuota {
        &self.quota
    }

    /// The prompts per run in which the ratios hold.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// A handle on the mixer's counters and, once it has stopped, the reason.
    pub fn status(&self) -> MixerStatus {
        self.status.clone()
    }

    /// Draws the next batch into `ready`, or records why there is none.
    fn fill(&mut self) {
        let counts = self.quota.next_counts(self.batch_size);
        let mut drawn: Vec<std::vec::IntoIter<T>> = Vec::with_capacity(counts.len());
        let mut total = 0;
        for (i, &n) in counts.iter().enumerate() {
            let items: Vec<T> = match self.sources.get_mut(i) {
                Some(Some(source)) => source.by_ref().take(n).collect(),
                _ => Vec::new(),
            };
            total += items.len();
            if items.len() < n {
                let domain = self.quota.domains().get(i).cloned().unwrap_or_default();
                self.status.set_end(MixerEnd::Exhausted {
                    domain,
                    dropped: total,
                });
                return;
            }
            drawn.push(items.into_iter());
        }
        for (name, &n) in self.quota.domains().iter().zip(&counts) {
            metrics::counter!("roll_mixer_prompts_total", "domain" => name.clone())
                .increment(n as u64);
        }
        // Interleave: one of each domain in turn while any is left.
        loop {
            let before = self.ready.len();
            self.ready
                .extend(drawn.iter_mut().filter_map(Iterator::next));
            if self.ready.len() == before {
                break;
            }
        }
    }
}

impl<T> Iterator for PromptMixer<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        if self.ready.is_empty() && !self.status.has_ended() {
            self.fill();
        }
        let item = self.ready.pop_front()?;
        self.status.count_yielded();
        Some(item)
    }
}

fn check_batch_size(batch_size: usize) -> Result<(), RewardError> {
    if batch_size == 0 {
        return Err(RewardError::invalid_config(
            "batch_size",
            "0 prompts per batch",
        ));
    }
    Ok(())
}

/// A roll-core config or data error as this crate's, keeping its message.
fn invalid(what: &str, e: Error) -> RewardError {
    let reason = match e {
        Error::InvalidData { reason, .. } => reason,
        other => other.to_string(),
    };
    RewardError::invalid_config(what, reason)
}

#[cfg(test)]
mod tests {
    use super::*;
    use roll_core::PromptId;

    fn take<T: Send + 'static>(m: &mut PromptMixer<T>, n: usize) -> Vec<T> {
        m.by_ref().take(n).collect()
    }

    #[test]
    fn zero_ratio_domains_get_nothing_and_need_no_source() {
        let q = DomainQuota::new([("a", 1.0), ("z", 0.0)]).unwrap();
        let mut m = PromptMixer::new(q.clone(), [("a", 0..)], 3).unwrap();
        assert_eq!(take(&mut m, 3), vec![0, 1, 2]);
        let mut m = PromptMixer::new(q, [("a", 0..), ("z", 100..)], 3).unwrap();
        assert_eq!(take(&mut m, 6), vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn mixer_ends_when_a_domain_runs_dry_and_checks_sources() {
        let q = DomainQuota::new([("a", 1.0), ("b", 1.0)]).unwrap();
        let mut m = PromptMixer::new(q.clone(), [("a", 0..3), ("b", 10..100)], 4).unwrap();
        let status = m.status();
        assert_eq!(take(&mut m, 4), vec![0, 10, 1, 11]);
        assert_eq!(status.end(), None);
        // The second batch needs two of `a`, which has one left: nothing of it is yielded.
        assert_eq!(m.next(), None);
        assert_eq!(m.next(), None, "an ended mixer stays ended");
        assert_eq!(
            status.end(),
            Some(MixerEnd::Exhausted {
                domain: "a".into(),
                dropped: 1
            })
        );
        assert_eq!(status.yielded(), 4);
        assert!(PromptMixer::new(q.clone(), [("a", 0..3)], 4).is_err());
        assert!(PromptMixer::new(q.clone(), [("a", 0..3), ("b", 0..3), ("c", 0..3)], 4).is_err());
        assert!(PromptMixer::new(q, [("a", 0..3), ("b", 0..3)], 0).is_err());
    }

    fn dataset(tags: &[&str]) -> Vec<Prompt> {
        tags.iter()
            .enumerate()
            .map(|(i, t)| Prompt::new(PromptId(i as u64), format!("q{i}"), *t))
            .collect()
    }

    fn ids_and_domains(prompts: Vec<Prompt>) -> Vec<(u64, String)> {
        prompts.into_iter().map(|p| (p.id.0, p.domain)).collect()
    }

    #[test]
    fn a_dataset_is_resolved_split_by_domain_and_each_domain_repeats() {
        let q = DomainQuota::new([("code", 1.0), ("math", 1.0)]).unwrap();
        let map = DomainMap::new([("math", vec!["gsm8k"]), ("code", vec!["mbpp"])]).unwrap();
        // Sorted by tag; math has three prompts, code two, so code starts over first.
        let source = dataset(&["gsm8k", "gsm8k", "math", "mbpp", "code"]);
        let mut m = PromptMixer::by_tag(q, &map, source, 2).unwrap();
        let want = [
            (3, "code"),
            (0, "math"),
            (4, "code"),
            (1, "math"),
            (3, "code"),
            (2, "math"),
            (4, "code"),
            (0, "math"),
        ];
        assert_eq!(
            ids_and_domains(take(&mut m, 8)),
            want.map(|(id, d)| (id, d.to_owned()))
        );
        assert_eq!(m.status().end(), None);
    }

    #[test]
    fn unknown_tags_and_empty_domains_fail_at_construction() {
        let q = DomainQuota::new([("code", 1.0), ("math", 1.0)]).unwrap();
        let map = DomainMap::new([("math", vec!["gsm8k"]), ("code", vec![])]).unwrap();
        let err = PromptMixer::by_tag(q.clone(), &map, dataset(&["gsm8k", "chem", "code"]), 2)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("tag `chem` (1, first prompt#1)") && err.contains("known tags: `gsm8k`"),
            "{err}"
        );
        let err = PromptMixer::by_tag(q, &map, dataset(&["gsm8k"]), 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no prompts for `code`"), "{err}");
    }

    #[test]
    fn prompts_of_zero_ratio_domains_are_skipped_and_counted() {
        let q = DomainQuota::new([("math", 1.0), ("off", 0.0)]).unwrap();
        let map = DomainMap::new([("math", Vec::<String>::new()), ("off", vec![])]).unwrap();
        let mut m =
            PromptMixer::by_tag(q, &map, dataset(&["off", "math", "off", "math"]), 1).unwrap();
        let status = m.status();
        let ids: Vec<u64> = take(&mut m, 4).iter().map(|p| p.id.0).collect();
        assert_eq!(ids, vec![1, 3, 1, 3]);
        assert_eq!((status.yielded(), status.skipped()), (4, 2));
    }

    #[test]
    fn quota_and_map_must_name_the_same_domains() {
        let q = DomainQuota::new([("math", 1.0)]).unwrap();
        let map = DomainMap::new([("math", Vec::<String>::new()), ("code", vec![])]).unwrap();
        let err = PromptMixer::by_tag(q, &map, Vec::new(), 4)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`code` is in the tag map but not in the quota"),
            "{err}"
        );
    }
}
