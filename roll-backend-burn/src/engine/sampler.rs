//! Turning one row of logits into one token, per request.
//!
//! Every request owns a [`TokenSampler`]: its own random stream (seeded from the request's seed,
//! or from the engine's seed and the request's arrival number) that advances by exactly one draw
//! per generated token. What a request samples therefore depends only on its seed and its own
//! logits, never on which other requests share the batch.
//!
//! The log-prob reported for a sampled token is always taken under the **temperature-1,
//! unfiltered** distribution `log_softmax(logits)[token]`: the quantity the trainer recomputes,
//! so that importance ratios compare like with like. Temperature, top-k and top-p only decide
//! which token is drawn.

use super::cpu::exp::exp;
use super::logprob::{ExpSum, logprob};
use crate::{BackendError, Result};
use roll_core::policy::SamplingParams;
pub use roll_core::rng::SplitMix64;

/// How one request picks its tokens.
#[derive(Debug, Clone)]
pub struct TokenSampler {
    rule: SamplingRule,
    rng: SplitMix64,
    /// Reused buffer for one row's exponentials.
    scratch: Vec<f32>,
}

/// Which token a row of logits gives for a uniform draw: temperature, top-k, top-p.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingRule {
    /// 0 = greedy.
    pub temperature: f32,
    /// Keep the `k` most likely tokens (`None`: all).
    pub top_k: Option<usize>,
    /// Keep the smallest most-likely set holding this share of the mass (1 = all).
    pub top_p: f32,
}

/// One token's draw: the rule and the uniform number in `[0, 1)` it consumes. Taken from a
/// [`TokenSampler`] before the logits exist, so that whoever holds the logits — the host, or a
/// device kernel (`gpu::sample`) — can pick the token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    /// How the token is picked.
    pub rule: SamplingRule,
    /// The uniform number.
    pub u: f64,
}

/// One sampled token and its temperature-1 log-probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampledToken {
    /// The token id.
    pub id: u32,
    /// `log_softmax(logits)[id]` at temperature 1, without top-k/top-p filtering.
    pub logprob: f32,
}

impl TokenSampler {
    /// A sampler for `params`, drawing from a stream seeded with `seed`.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] for a negative or non-finite temperature, `top_p` outside
    /// `(0, 1]`, or `top_k = 0`.
    pub fn new(params: &SamplingParams, seed: u64) -> Result<Self> {
        if !params.temperature.is_finite() || params.temperature < 0.0 {
            return Err(BackendError::InvalidInput(format!(
                "sampling temperature must be finite and >= 0, got {}",
                params.temperature
            )));
        }
        if !(params.top_p > 0.0 && params.top_p <= 1.0) {
            return Err(BackendError::InvalidInput(format!(
                "sampling top_p must be in (0, 1], got {}",
                params.top_p
            )));
        }
        if params.top_k == Some(0) {
            return Err(BackendError::InvalidInput(
                "sampling top_k must be at least 1 (omit it to disable)".into(),
            ));
        }
        Ok(Self {
            rule: SamplingRule {
                temperature: params.temperature,
                top_k: params.top_k.map(|k| k as usize),
                top_p: params.top_p,
            },
            rng: SplitMix64::new(seed),
            scratch: Vec::new(),
        })
    }

    /// The next token's draw. Consumes exactly one random number, even when greedy, so a
    /// request's stream does not depend on its settings' history.
    pub fn next_draw(&mut self) -> Draw {
        Draw {
            rule: self.rule,
            u: self.rng.next_f64(),
        }
    }

    /// Draws the next token from one row of logits ([`TokenSampler::next_draw`], then
    /// [`Draw::pick`]).
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] if the row is empty or holds NaN.
    pub fn sample(&mut self, logits: &[f32]) -> Result<SampledToken> {
        let draw = self.next_draw();
        draw.pick(logits, &mut self.scratch)
    }
}

impl SamplingRule {
    /// Whether the rule always takes the most likely token (temperature 0 or top-k 1).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == Some(1)
    }

    /// Whether top-k or top-p removes tokens from a vocabulary of `vocab`.
    pub fn filters(&self, vocab: usize) -> bool {
        self.top_k.is_some_and(|k| k < vocab) || self.top_p < 1.0
    }
}

impl Draw {
    /// The token this draw picks from one row of logits, and its temperature-1 log-prob.
    /// `scratch` is a buffer the caller may reuse between rows.
    ///
    /// Greedy: the first most likely token. Temperature 1 without filtering: the first token, in
    /// id order, whose cumulative probability exceeds `u`. Otherwise the candidates are ranked by
    /// descending logit (ties by ascending id), cut to the `top_k` best, then to the shortest
    /// prefix whose tempered mass reaches `top_p` of theirs, and the first whose cumulative
    /// tempered weight exceeds `u` of the kept mass is drawn.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] if the row is empty or holds NaN.
    pub fn pick(&self, logits: &[f32], scratch: &mut Vec<f32>) -> Result<SampledToken> {
        let (max, argmax) = max_and_argmax(logits)?;
        // exp(l − max) once: the normaliser of the log-prob, and the weights of a plain
        // temperature-1 draw.
        shifted_exps(logits, max, scratch);
        let total = ExpSum::of_row(scratch).total();
        let rule = &self.rule;
        let id = if rule.is_greedy() {
            argmax
        } else if rule.temperature == 1.0 && !rule.filters(logits.len()) {
            pick(
                scratch.iter().enumerate().map(|(i, &e)| (i, f64::from(e))),
                self.u * total,
            )
            .unwrap_or(logits.len() - 1)
        } else {
            self.draw(logits, max)
        };
        let logprob = logprob(logits[id], max, total);
        Ok(SampledToken {
            id: id as u32,
            logprob,
        })
    }

    /// Inverse-CDF draw from the tempered, top-k/top-p filtered distribution.
    fn draw(&self, logits: &[f32], max: f32) -> usize {
        let rule = &self.rule;
        let u = self.u;
        let inv_t = 1.0 / rule.temperature as f64;
        let weight = |l: f32| ((l as f64 - max as f64) * inv_t).exp();
        if !rule.filters(logits.len()) {
            let total: f64 = logits.iter().map(|&l| weight(l)).sum();
            return pick(
                logits.iter().enumerate().map(|(i, &l)| (i, weight(l))),
                u * total,
            )
            .unwrap_or(logits.len() - 1);
        }
        // Candidates by descending logit, ties by ascending id: a total order, so the filtered
        // set is the same on every run.
        let mut order: Vec<usize> = (0..logits.len()).collect();
        let by_logit = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
        if let Some(k) = rule.top_k.filter(|&k| k < logits.len()) {
            order.select_nth_unstable_by(k - 1, by_logit);
            order.truncate(k);
        }
        order.sort_unstable_by(by_logit);
        let weights: Vec<f64> = order.iter().map(|&i| weight(logits[i])).collect();
        let mut keep = weights.len();
        if rule.top_p < 1.0 {
            let total: f64 = weights.iter().sum();
            let target = rule.top_p as f64 * total;
            let mut cumulative = 0.0;
            for (n, w) in weights.iter().enumerate() {
                cumulative += w;
                if cumulative >= target {
                    keep = n + 1;
                    break;
                }
            }
        }
        let total: f64 = weights[..keep].iter().sum();
        pick(
            order[..keep]
                .iter()
                .copied()
                .zip(weights[..keep].iter().copied()),
            u * total,
        )
        .unwrap_or(order[keep - 1])
    }
}

/// The token of every row of `logits` (`[rows, vocab]`, row-major) that has a draw, picked on the
/// host, rows in parallel (each row's pick depends only on the row and its draw).
pub fn pick_rows(
    logits: &[f32],
    vocab: usize,
    draws: &[Option<Draw>],
) -> Vec<Option<Result<SampledToken>>> {
    use rayon::prelude::*;
    draws
        .par_iter()
        .enumerate()
        .map_init(Vec::new, |scratch, (row, draw)| {
            let draw = draw.as_ref()?;
            Some(match logits.get(row * vocab..(row + 1) * vocab) {
                Some(row) => draw.pick(row, scratch),
                None => Err(BackendError::InvalidInput(format!(
                    "no logits row {row} in {} logits of {vocab}",
                    logits.len()
                ))),
            })
        })
        .collect()
}

/// The first candidate whose cumulative weight exceeds `threshold`.
fn pick(candidates: impl Iterator<Item = (usize, f64)>, threshold: f64) -> Option<usize> {
    let mut cumulative = 0.0;
    for (i, w) in candidates {
        cumulative += w;
        if cumulative > threshold {
            return Some(i);
        }
    }
    None
}

/// Largest logit and its first index.
fn max_and_argmax(logits: &[f32]) -> Result<(f32, usize)> {
    let mut best = (f32::NEG_INFINITY, usize::MAX);
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            return Err(BackendError::InvalidInput(format!(
                "logit {i} is NaN: the model produced non-finite values"
            )));
        }
        if l > best.0 || best.1 == usize::MAX {
            best = (l, i);
        }
    }
    if best.1 == usize::MAX {
        return Err(BackendError::InvalidInput("empty logits row".into()));
    }
    Ok(best)
}

/// `exp(l − max)` of every logit, into `out` (the CPU kernels' vectorised exponential, within
/// 2 ulps of libm's).
fn shifted_exps(logits: &[f32], max: f32, out: &mut Vec<f32>) {
    out.clear();
    out.extend(logits.iter().map(|&l| exp(l - max)));
}

/// Per-token log-probabilities of `ids` under the temperature-1 distributions in `rows`
/// (`rows[i]` predicts `ids[i]`); the same formula the sampler reports.
///
/// # Errors
/// [`BackendError::InvalidInput`] if a row is empty or holds NaN, or an id is out of range.
pub fn logprobs_of(rows: &[&[f32]], ids: &[u32]) -> Result<Vec<f32>> {
    rows.iter()
        .zip(ids)
        .map(|(row, &id)| {
            let (max, _) = max_and_argmax(row)?;
            let l = *row.get(id as usize).ok_or(BackendError::TokenOutOfVocab {
                id,
                vocab_size: row.len(),
            })?;
            let mut exps = Vec::with_capacity(row.len());
            shifted_exps(row, max, &mut exps);
            Ok(logprob(l, max, ExpSum::of_row(&exps).total()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: Option<u32>, top_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            ..SamplingParams::default()
        }
    }

    fn counts(sampler: &mut TokenSampler, logits: &[f32], n: usize) -> Vec<usize> {
        let mut c = vec![0; logits.len()];
        for _ in 0..n {
            c[sampler.sample(logits).unwrap().id as usize] += 1;
        }
        c
    }

    const LOGITS: [f32; 4] = [2.0, 1.0, 0.0, -1.0];

    fn softmax(l: &[f32], t: f64) -> Vec<f64> {
        let e: Vec<f64> = l.iter().map(|&x| (x as f64 / t).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    }

    #[test]
    fn logprob_is_temperature_one_and_unfiltered() {
        let mut s = TokenSampler::new(&params(0.3, Some(2), 0.5), 1).unwrap();
        let t = s.sample(&LOGITS).unwrap();
        let expected = softmax(&LOGITS, 1.0)[t.id as usize].ln() as f32;
        assert!((t.logprob - expected).abs() < 1e-6);
    }

    #[test]
    fn greedy_and_top_k_one_take_the_argmax() {
        let logits = [0.1, 3.0, 2.9, -4.0];
        for p in [params(0.0, None, 1.0), params(1.0, Some(1), 1.0)] {
            let mut s = TokenSampler::new(&p, 7).unwrap();
            for _ in 0..20 {
                assert_eq!(s.sample(&logits).unwrap().id, 1);
            }
        }
    }

    #[test]
    fn same_seed_same_tokens_other_seed_other_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let run = |seed| {
            let mut s = TokenSampler::new(&params(1.0, None, 1.0), seed).unwrap();
            (0..64)
                .map(|_| s.sample(&logits).unwrap().id)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
    }

    /// Pearson χ² of observed counts against expected probabilities.
    fn chi2(observed: &[usize], expected: &[f64], n: usize) -> f64 {
        observed
            .iter()
            .zip(expected)
            .filter(|(_, p)| **p > 0.0)
            .map(|(&o, &p)| {
                let e = p * n as f64;
                (o as f64 - e).powi(2) / e
            })
            .sum()
    }

    #[test]
    fn temperature_matches_the_tempered_softmax() {
        // χ² with 3 degrees of freedom: 16.27 is the 0.1% critical value.
        let n = 20_000;
        for t in [0.5f32, 1.0, 2.0] {
            let mut s = TokenSampler::new(&params(t, None, 1.0), 11).unwrap();
            let c = counts(&mut s, &LOGITS, n);
            let p = softmax(&LOGITS, t as f64);
            assert!(chi2(&c, &p, n) < 16.27, "t={t}: {c:?} vs {p:?}");
        }
        // And temperature visibly sharpens: the top token's share grows as t falls.
        let share = |t: f32| {
            let mut s = TokenSampler::new(&params(t, None, 1.0), 5).unwrap();
            counts(&mut s, &LOGITS, 5000)[0]
        };
        assert!(share(0.5) > share(1.0) && share(1.0) > share(2.0));
    }

    #[test]
    fn top_p_keeps_the_smallest_nucleus_and_renormalises() {
        // p(T=1) = [0.644, 0.237, 0.087, 0.032]; top_p 0.8 keeps tokens 0 and 1.
        let n = 20_000;
        let mut s = TokenSampler::new(&params(1.0, None, 0.8), 13).unwrap();
        let c = counts(&mut s, &LOGITS, n);
        assert_eq!(c[2] + c[3], 0, "{c:?}");
        let p = softmax(&LOGITS, 1.0);
        let kept = [p[0] / (p[0] + p[1]), p[1] / (p[0] + p[1]), 0.0, 0.0];
        assert!(chi2(&c, &kept, n) < 10.83, "{c:?}"); // 1 dof, 0.1%
    }

    #[test]
    fn top_k_restricts_to_the_k_best() {
        let n = 20_000;
        let mut s = TokenSampler::new(&params(1.0, Some(3), 1.0), 17).unwrap();
        let c = counts(&mut s, &LOGITS, n);
        assert_eq!(c[3], 0);
        let p = softmax(&LOGITS[..3], 1.0);
        assert!(chi2(&c[..3], &p, n) < 13.82, "{c:?}"); // 2 dof, 0.1%
    }

    #[test]
    fn bad_parameters_and_logits_are_errors() {
        assert!(TokenSampler::new(&params(-1.0, None, 1.0), 0).is_err());
        assert!(TokenSampler::new(&params(1.0, None, 0.0), 0).is_err());
        assert!(TokenSampler::new(&params(1.0, None, 1.5), 0).is_err());
        assert!(TokenSampler::new(&params(1.0, Some(0), 1.0), 0).is_err());
        let mut s = TokenSampler::new(&params(1.0, None, 1.0), 0).unwrap();
        assert!(s.sample(&[]).is_err());
        assert!(s.sample(&[0.0, f32::NAN]).is_err());
    }

    #[test]
    fn logprobs_of_agrees_with_the_sampler() {
        let mut s = TokenSampler::new(&params(1.0, None, 1.0), 2).unwrap();
        let t = s.sample(&LOGITS).unwrap();
        assert_eq!(logprobs_of(&[&LOGITS], &[t.id]).unwrap(), vec![t.logprob]);
        assert!(logprobs_of(&[&LOGITS], &[9]).is_err());
    }
}
