//! [`DomainQuota`]: how many prompts of each domain a batch of prompts holds.

use crate::error::RewardError;
use roll_core::config::DomainConfig;
use std::collections::BTreeMap;

/// Per-step prompt counts for domains sampled with given ratios (ROLL's
/// `domain_interleave_probs`).
///
/// With `pᵢ = ratioᵢ / Σ ratio` and a batch of `B` prompts, domain `i` gets `⌊pᵢ·B⌋` or
/// `⌊pᵢ·B⌋ + 1` prompts in every batch — always within ±1 of `pᵢ·B`, and the counts sum to `B`.
/// Which domains get the `+1` is decided deterministically by the fraction each is owed so far
/// (its cumulative deficit `pᵢ·B·t − Nᵢ(t)`, largest first, ties to the earlier domain), so
/// over many steps every domain's total stays within about one prompt of `pᵢ·B·t`.
///
/// ROLL takes `int(pᵢ·B)` for every domain but the last, which gets the remainder: the other
/// domains are rounded down every step (a 0.15 share of 10 prompts is 1, never 2) and the last
/// domain absorbs all the rounding, up to one prompt per other domain off its share.
///
/// ```
/// use roll_reward::router::DomainQuota;
///
/// let mut q = DomainQuota::new([("math", 0.45), ("code", 0.45), ("chat", 0.1)])?;
/// // 0.45·5 = 2.25, 0.45·5 = 2.25, 0.1·5 = 0.5: the odd prompt goes where it is owed most.
/// assert_eq!(q.next_counts(5), vec![2, 2, 1]);
/// assert_eq!(q.next_counts(5), vec![3, 2, 0]);
/// assert_eq!(q.next_counts(5), vec![2, 3, 0]);
/// assert_eq!(q.next_counts(5), vec![2, 2, 1]);
/// # Ok::<(), roll_reward::RewardError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct DomainQuota {
    domains: Vec<String>,
    probs: Vec<f64>,
    deficit: Vec<f64>,
}

impl DomainQuota {
    /// Domains and their relative sampling ratios (need not sum to 1).
    ///
    /// # Errors
    /// [`RewardError::InvalidConfig`] for no domains, a duplicate, a ratio that is negative or
    /// not finite, or ratios summing to 0.
    pub fn new<I, S>(ratios: I) -> Result<Self, RewardError>
    where
        I: IntoIterator<Item = (S, f64)>,
        S: Into<String>,
    {
        let mut domains = Vec::new();
        let mut weights = Vec::new();
        for (name, ratio) in ratios {
            let name = name.into();
            if !(ratio.is_finite() && ratio >= 0.0) {
                return Err(RewardError::invalid_config(
                    format!("domains.{name}.ratio"),
                    format!("{ratio} is not a finite number >= 0"),
                ));
            }
            if domains.contains(&name) {
                return Err(RewardError::invalid_config(
                    format!("domains.{name}"),
                    "the domain is given twice",
                ));
            }
            domains.push(name);
            weights.push(ratio);
        }
        let total: f64 = weights.iter().sum();
        if domains.is_empty() || total <= 0.0 {
            return Err(RewardError::invalid_config(
                "domains",
                format!("ratios summing to {total}; at least one domain needs a ratio > 0"),
            ));
        }
        Ok(Self {
            probs: weights.iter().map(|w| w / total).collect(),
            deficit: vec![0.0; domains.len()],
            domains,
        })
    }

    /// The ratios of a run's `[domains]` config.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn from_domains(domains: &BTreeMap<String, DomainConfig>) -> Result<Self, RewardError> {
        Self::new(domains.iter().map(|(n, d)| (n.clone(), d.ratio)))
    }

    /// The domains, in the order of [`next_counts`](Self::next_counts).
    pub fn domains(&self) -> &[String] {
        &self.domains
    }

    /// Each domain's share `pᵢ`.
    pub fn probabilities(&self) -> &[f64] {
        &self.probs
    }

    /// The number of prompts of each domain in the next batch of `batch_size`.
    pub fn next_counts(&mut self, batch_size: usize) -> Vec<usize> {
        let exact: Vec<f64> = self.probs.iter().map(|p| p * batch_size as f64).collect();
        let mut counts: Vec<usize> = exact
            .iter()
            .map(|&e| {
                // Shares within float noise of an integer are that integer.
                let r = e.round();
                if (e - r).abs() < 1e-9 {
                    r as usize
                } else {
                    e.floor() as usize
                }
            })
            .collect();
        for ((d, &e), &c) in self.deficit.iter_mut().zip(&exact).zip(&counts) {
            *d += e - c as f64;
        }
        let total: usize = counts.iter().sum();
        let mut order: Vec<usize> = (0..counts.len()).filter(|&i| self.probs[i] > 0.0).collect();
        order.sort_by(|&a, &b| self.deficit[b].total_cmp(&self.deficit[a]).then(a.cmp(&b)));
        if total <= batch_size {
            for &i in order.iter().take(batch_size - total) {
                counts[i] += 1;
                self.deficit[i] -= 1.0;
            }
        } else {
            // Only reachable through float rounding: give back from the most over-served.
            let mut excess = total - batch_size;
            for &i in order.iter().rev() {
                if excess == 0 {
                    break;
                }
                if counts[i] > 0 {
                    counts[i] -= 1;
                    self.deficit[i] += 1.0;
                    excess -= 1;
                }
            }
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_sum_to_the_batch_and_stay_within_one() {
        let mut q = DomainQuota::new([("a", 0.4), ("b", 0.3), ("c", 0.2), ("d", 0.1)]).unwrap();
        for batch in [1, 3, 7, 10, 64, 99] {
            let c = q.next_counts(batch);
            assert_eq!(c.iter().sum::<usize>(), batch);
            for (n, p) in c.iter().zip(q.probabilities()) {
                assert!((*n as f64 - p * batch as f64).abs() <= 1.0);
            }
        }
    }

    #[test]
    fn roll_would_starve_a_small_domain_this_one_does_not() {
        // 0.15 of 10 prompts: ROLL takes int(1.5) = 1 every step; here 1 and 2 alternate.
        let mut q = DomainQuota::new([("small", 0.15), ("big", 0.85)]).unwrap();
        let small: usize = (0..10).map(|_| q.next_counts(10)[0]).sum();
        assert_eq!(small, 15);
    }

    #[test]
    fn bad_ratios_are_rejected() {
        assert!(DomainQuota::new([("a", -1.0)]).is_err());
        assert!(DomainQuota::new([("a", 0.0)]).is_err());
        assert!(DomainQuota::new([("a", f64::NAN)]).is_err());
        assert!(DomainQuota::new(Vec::<(String, f64)>::new()).is_err());
        assert!(DomainQuota::new([("a", 1.0), ("a", 1.0)]).is_err());
    }
}
