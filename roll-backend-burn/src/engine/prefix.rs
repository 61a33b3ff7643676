//! Prefix caching across requests: the key/value entries of finished sequences, kept so that a
//! later request whose prompt begins with the same tokens skips their prefill.
//!
//! A multi-turn episode asks for one generation per turn, each prompt being the previous prompt,
//! the previous answer and the environment's reply: without reuse the engine prefills the whole
//! conversation at every turn, quadratic in the number of turns. With it, a finished sequence's
//! cache entry is *parked* here instead of freed; a new request takes over the parked entry
//! sharing the longest prefix with its prompt (cut back to that prefix) and prefills only the
//! rest — vLLM's automatic prefix caching, for the one-conversation-one-entry case agentic
//! rollouts have. Adoption moves the entry (no copy), so one parked entry serves one request.
//!
//! **Bitwise neutral.** Keys and values depend only on the weights, the tokens and their
//! positions, and the decoders are batch-invariant (a token's logits are the same bits whether
//! it was prefilled in one chunk, several chunks, or decoded), so a request served from a parked
//! prefix samples exactly the tokens and log-probs it would have sampled from scratch. Entries
//! are valid for the weights that computed them only: a weight sync clears them all, and a
//! sequence that finishes on older weights is not parked.
//!
//! Parked entries hold cache space that running requests do not need: the engine evicts the
//! least recently parked ones whenever an admission needs their tokens or their sequence slot.
//!
//! **Between running sequences** (decoders that [continue prompts](super::DecodeBackend::continues_prompts)):
//! GRPO asks for several samples of each prompt at once, and chat prompts open with the same
//! system prompt. Before each step, a prompt not yet computed takes the longest run of opening
//! tokens another running sequence holds — if that is longer than what it has (say, a parked
//! entry sharing `Q: `): copied from that sequence's cache entry when cached
//! ([`DecodeBackend::fork`](super::DecodeBackend::fork)), or, when that sequence computes them
//! in this very step, continued in the same call
//! ([`DecodeBackend::forward_sample_continuing`](super::DecodeBackend::forward_sample_continuing):
//! each layer copies the keys and values once written, before anything attends). Copies sit in
//! the slots the sequence's own prefill would have written, so the bits are unchanged here too.
//! A GRPO step of 8 prompts × 8 samples prefills ~200 prompt tokens instead of ~700.

use super::backend::SeqId;
use std::collections::VecDeque;

/// The cache entry of one finished sequence.
#[derive(Debug)]
struct Parked {
    seq: SeqId,
    /// The tokens whose keys and values the entry holds, positions `0..tokens.len()`.
    tokens: Vec<u32>,
}

/// A request's match among the parked entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PrefixMatch {
    /// The entry's sequence.
    pub seq: SeqId,
    /// Positions the entry holds now.
    pub held: usize,
    /// Positions the request reuses: the common prefix, at most `prompt.len() − 1` (the last
    /// prompt token is always fed, for the logits the first sample is drawn from).
    pub reused: usize,
}

/// Finished sequences' cache entries, least recently parked first.
#[derive(Debug, Default)]
pub(super) struct PrefixPark {
    entries: VecDeque<Parked>,
    tokens: usize,
}

impl PrefixPark {
    /// Entries parked.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Cache positions the parked entries hold, summed.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Keeps `seq`'s entry, which holds the keys and values of `tokens`.
    pub fn park(&mut self, seq: SeqId, tokens: Vec<u32>) {
        self.tokens += tokens.len();
        self.entries.push_back(Parked { seq, tokens });
    }

    /// The entry sharing the longest prefix with `prompt` (the most recently parked among equals),
    /// if any shares at least one reusable position.
    pub fn best_match(&self, prompt: &[u32]) -> Option<PrefixMatch> {
        let limit = prompt.len().saturating_sub(1);
        let mut best: Option<PrefixMatch> = None;
        for entry in &self.entries {
            let reused = entry
                .tokens
                .iter()
                .zip(&prompt[..limit])
                .take_while(|(a, b)| a == b)
                .count();
            if reused > 0 && best.is_none_or(|b| reused >= b.reused) {
                best = Some(PrefixMatch {
                    seq: entry.seq,
                    held: entry.tokens.len(),
                    reused,
                });
            }
        }
        best
    }

    /// Removes `seq`'s entry (a request adopts it).
    pub fn take(&mut self, seq: SeqId) {
        if let Some(index) = self.entries.iter().position(|e| e.seq == seq)
            && let Some(entry) = self.entries.remove(index)
        {
            self.tokens -= entry.tokens.len();
        }
    }

    /// Removes the least recently parked entry, except `keep`, and returns its sequence (to be
    /// released from the cache).
    pub fn evict_oldest(&mut self, keep: Option<SeqId>) -> Option<SeqId> {
        let index = self.entries.iter().position(|e| Some(e.seq) != keep)?;
        let entry = self.entries.remove(index)?;
        self.tokens -= entry.tokens.len();
        Some(entry.seq)
    }

    /// Removes every entry and returns their sequences (to be released from the cache).
    pub fn clear(&mut self) -> Vec<SeqId> {
        self.tokens = 0;
        self.entries.drain(..).map(|e| e.seq).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parked(entries: &[(u64, &[u32])]) -> PrefixPark {
        let mut park = PrefixPark::default();
        for &(seq, tokens) in entries {
            park.park(SeqId(seq), tokens.to_vec());
        }
        park
    }

    #[test]
    fn the_longest_common_prefix_wins_and_the_last_prompt_token_is_always_fed() {
        let park = parked(&[(1, &[5, 6, 7]), (2, &[5, 6, 7, 8, 9]), (3, &[5, 9])]);
        assert_eq!(park.tokens(), 10);
        // Entry 2 shares four positions; entry 1 three; entry 3 one.
        let m = park.best_match(&[5, 6, 7, 8, 1, 2]).expect("a match");
        assert_eq!((m.seq, m.held, m.reused), (SeqId(2), 5, 4));
        // A prompt equal to an entry's tokens reuses all but its last token.
        let m = park.best_match(&[5, 6, 7]).expect("a match");
        assert_eq!((m.seq, m.reused), (SeqId(2), 2));
        // Nothing in common, or a one-token prompt: no match.
        assert_eq!(park.best_match(&[4, 5, 6]), None);
        assert_eq!(park.best_match(&[5]), None);
    }

    #[test]
    fn among_equal_matches_the_most_recently_parked_wins() {
        let park = parked(&[(1, &[1, 2, 3]), (2, &[1, 2, 4])]);
        let m = park.best_match(&[1, 2, 9]).expect("a match");
        assert_eq!((m.seq, m.reused), (SeqId(2), 2));
    }

    #[test]
    fn take_evict_and_clear_keep_the_token_count() {
        let mut park = parked(&[(1, &[1, 2, 3]), (2, &[4, 5]), (3, &[6])]);
        let m = park.best_match(&[4, 5, 0]).expect("a match");
        park.take(m.seq);
        assert_eq!((park.len(), park.tokens()), (2, 4));
        // The oldest is entry 1, unless it is the one to keep.
        assert_eq!(park.evict_oldest(Some(SeqId(1))), Some(SeqId(3)));
        assert_eq!(park.evict_oldest(Some(SeqId(1))), None);
        assert_eq!(park.evict_oldest(None), Some(SeqId(1)));
        assert_eq!((park.len(), park.tokens()), (0, 0));
        let mut park = parked(&[(7, &[1]), (8, &[2, 3])]);
        assert_eq!(park.clear(), vec![SeqId(7), SeqId(8)]);
        assert_eq!((park.len(), park.tokens()), (0, 0));
    }
}
