//! Checks of the CPU decoder against the Burn models: prefill and incremental decode equal full
//! forwards, greedy decoding reproduces the fixture's reference, batches are bit-invariant, and
//! the paged cache reserves, releases and rejects as documented.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::engine::test_support::*;

#[test]
fn prefill_last_logits_match_full_forward() {
    for (name, model, seqs) in models_under_test() {
        let dec = CpuDecoder::from_model(&model).unwrap();
        let v = dec.vocab_size();
        let mut worst = 0.0f32;
        for (i, seq) in seqs.iter().enumerate() {
            let mut cache = dec.new_cache(&cache_config(4, 256)).unwrap();
            let got = dec.forward(&mut cache, &[step(i as u64, seq, 0)]).unwrap();
            let want = full_logits(&model, seq);
            let want = &want[(seq.len() - 1) * v..];
            let d = max_abs_diff(&got, want);
            worst = worst.max(d);
            assert!(d <= tolerance(want), "{name} seq {i}: max diff {d}");
            assert_eq!(cache.blocks().cached_len(SeqId(i as u64)), seq.len());
        }
        println!("{name}: prefill max |Δlogit| = {worst:e}");
    }
}

#[test]
fn incremental_decode_matches_full_forward_at_every_step() {
    for (name, model, seqs) in models_under_test() {
        let dec = CpuDecoder::from_model(&model).unwrap();
        let v = dec.vocab_size();
        let seq = seqs.last().unwrap();
        let want = full_logits(&model, seq);
        let mut cache = dec.new_cache(&cache_config(2, 128)).unwrap();
        let prefix = 3.min(seq.len());
        let mut worst = 0.0f32;
        let got = dec
            .forward(&mut cache, &[step(9, &seq[..prefix], 0)])
            .unwrap();
        let first = &want[(prefix - 1) * v..prefix * v];
        worst = worst.max(max_abs_diff(&got, first));
        assert!(worst <= tolerance(first), "{name} prefix: max diff {worst}");
        for p in prefix..seq.len() {
            let got = dec.forward(&mut cache, &[step(9, &seq[p..=p], p)]).unwrap();
            let want = &want[p * v..(p + 1) * v];
            let d = max_abs_diff(&got, want);
            assert!(d <= tolerance(want), "{name} position {p}: max diff {d}");
            worst = worst.max(d);
        }
        let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        println!(
            "{name}: incremental decode max |Δlogit| over {} steps = {worst:e} (max |logit| {scale})",
            seq.len()
        );
    }
}

#[test]
fn greedy_decoding_reproduces_the_fixture_reference() {
    let text = std::fs::read_to_string(fixture("tiny-qwen2").join("reference/cases.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let as_ids = |key: &str| -> Vec<u32> {
        v["greedy"][key]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let (prompt, expected) = (as_ids("prompt_ids"), as_ids("new_tokens"));
    let dec = CpuDecoder::from_model(&tiny("tiny-qwen2")).unwrap();
    let mut cache = dec.new_cache(&cache_config(1, 64)).unwrap();
    let mut logits = dec.forward(&mut cache, &[step(0, &prompt, 0)]).unwrap();
    let mut generated = Vec::new();
    let mut pos = prompt.len();
    while generated.len() < expected.len() {
        let next = argmax(&logits);
        generated.push(next);
        logits = dec.forward(&mut cache, &[step(0, &[next], pos)]).unwrap();
        pos += 1;
    }
    assert_eq!(generated, expected);
}

/// Runs `seq` alone (prefill of `prefix`, then one decode per remaining token) and returns the
/// logits of every call.
fn alone(dec: &CpuDecoder, seq: &[u32], prefix: usize) -> Vec<Vec<f32>> {
    let mut cache = dec.new_cache(&cache_config(1, 256)).unwrap();
    let mut out = vec![
        dec.forward(&mut cache, &[step(0, &seq[..prefix], 0)])
            .unwrap(),
    ];
    for p in prefix..seq.len() {
        out.push(dec.forward(&mut cache, &[step(0, &seq[p..=p], p)]).unwrap());
    }
    out
}

/// Sequence `target` (prefill then decodes) shares every call with other sequences: some in
/// prefill, some decoding, a different mix at each step, placed before and after it. Its logits
/// must equal those of running it alone, bit for bit.
fn check_batch_invariance(model: &CausalLm, label: &str) {
    let dec = CpuDecoder::from_model(model).unwrap();
    let v = dec.vocab_size();
    let target = ids(30, v, 99);
    let prefix = 13;
    let want = alone(&dec, &target, prefix);

    let others: Vec<Vec<u32>> = (0..40)
        .map(|i| ids(5 + (i * 7) % 31, v, i as u64))
        .collect();
    let mut cache = dec.new_cache(&cache_config(48, 48 * 64)).unwrap();
    let mut cached = vec![0usize; others.len()];
    // Steps: (first other, count, how many tokens each other appends at most).
    let plan: Vec<(usize, usize, usize)> = vec![
        (0, 5, 64),
        (0, 12, 1),
        (3, 20, 1),
        (10, 30, 3),
        (0, 40, 1),
        (5, 33, 1),
    ];
    for (call, want_logits) in want.iter().enumerate() {
        let (first, count, chunk) = plan[call % plan.len()];
        let (t_tokens, t_start) = if call == 0 {
            (&target[..prefix], 0)
        } else {
            let p = prefix + call - 1;
            (&target[p..=p], p)
        };
        let mut inputs = Vec::new();
        let mut spans = Vec::new();
        for (j, other) in others.iter().enumerate().skip(first).take(count) {
            let start = cached[j];
            let remaining = other.len().saturating_sub(start);
            if remaining == 0 {
                continue;
            }
            let len = remaining.min(chunk);
            spans.push((j, start + len));
            inputs.push(step(100 + j as u64, &other[start..start + len], start));
        }
        // The target goes first, in the middle or last.
        let at = match call % 3 {
            0 => 0,
            1 => inputs.len() / 2,
            _ => inputs.len(),
        };
        inputs.insert(at, step(0, t_tokens, t_start));
        let logits = dec.forward(&mut cache, &inputs).unwrap();
        assert_eq!(logits.len(), inputs.len() * v);
        let got = &logits[at * v..(at + 1) * v];
        assert!(
            got == want_logits.as_slice(),
            "{label} call {call}: batched logits differ from alone (max diff {:e}, batch of {})",
            max_abs_diff(got, want_logits),
            inputs.len()
        );
        for (j, len) in spans {
            cached[j] = len;
        }
    }
}

#[test]
fn logits_are_bit_identical_alone_and_in_mixed_batches() {
    check_batch_invariance(&tiny("tiny-qwen2"), "tiny-qwen2");
    check_batch_invariance(&random(&qwen3_config()), "qwen3");
}

#[test]
fn batch_invariance_holds_at_the_small_benchmark_shapes() {
    check_batch_invariance(&random(&small_qwen2_config()), "small-qwen2");
}

#[test]
fn released_blocks_are_reused_and_give_the_same_results() {
    let model = tiny("tiny-qwen2");
    let dec = CpuDecoder::from_model(&model).unwrap();
    let v = dec.vocab_size();
    // 2 sequences, 64 tokens: 4 + 2 blocks.
    let mut cache = dec.new_cache(&cache_config(2, 64)).unwrap();
    assert_eq!(cache.blocks().total_blocks(), 6);
    let a = ids(33, v, 1); // 3 blocks
    let b = ids(48, v, 2); // 3 blocks
    let first = dec
        .forward(&mut cache, &[step(1, &a, 0), step(2, &b, 0)])
        .unwrap();
    assert_eq!(cache.blocks().free_blocks(), 0);
    assert_eq!(cache.blocks().num_seqs(), 2);
    // Full: a third sequence is refused, and so is a token that needs a fourth block.
    let err = dec.forward(&mut cache, &[step(3, &a[..1], 0)]).unwrap_err();
    assert!(err.to_string().contains("max_seqs"), "{err}");
    let err = dec.forward(&mut cache, &[step(1, &[1], 33), step(2, &[1], 48)]);
    assert!(err.unwrap_err().to_string().contains("cache full"));
    // Still consistent after the refusals.
    assert_eq!(cache.blocks().cached_len(SeqId(1)), 33);
    assert_eq!(cache.blocks().cached_len(SeqId(2)), 48);
    assert_eq!(cache.blocks().free_blocks(), 0);

    dec.release(&mut cache, SeqId(1));
    dec.release(&mut cache, SeqId(77)); // unknown: ignored
    assert_eq!(cache.blocks().free_blocks(), 3);
    assert_eq!(cache.blocks().cached_len(SeqId(1)), 0);
    // Reuse the freed blocks for the old id from scratch, then for a new id.
    let again = dec.forward(&mut cache, &[step(1, &a, 0)]).unwrap();
    assert_eq!(
        again,
        first[..v].to_vec(),
        "same id, reused blocks, same logits"
    );
    // Truncation rolls positions back and frees the emptied block.
    dec.truncate(&mut cache, SeqId(1), 20);
    assert_eq!(cache.blocks().cached_len(SeqId(1)), 20);
    assert_eq!(cache.blocks().free_blocks(), 1);
    let redo = dec.forward(&mut cache, &[step(1, &a[20..], 20)]).unwrap();
    assert_eq!(redo, first[..v].to_vec(), "re-decoding after truncate");
    dec.release(&mut cache, SeqId(1));
    let c = dec.forward(&mut cache, &[step(5, &a, 0)]).unwrap();
    assert_eq!(c, first[..v].to_vec());
    dec.release(&mut cache, SeqId(5));
    // Sequence 2 still decodes as if nothing happened, into a fresh block.
    let want = full_logits(&model, &[b.as_slice(), &[7]].concat());
    let got = dec.forward(&mut cache, &[step(2, &[7], 48)]).unwrap();
    assert!(max_abs_diff(&got, &want[48 * v..]) <= 1e-4);
    assert_eq!(cache.blocks().free_blocks(), 2);
    dec.release(&mut cache, SeqId(2));
    assert_eq!(cache.blocks().free_blocks(), 6);
    assert_eq!(cache.blocks().num_seqs(), 0);
}

#[test]
fn bad_inputs_are_rejected_and_leave_the_cache_untouched() {
    let dec = CpuDecoder::from_model(&tiny("tiny-qwen2")).unwrap();
    let v = dec.vocab_size();
    let mut cache = dec.new_cache(&cache_config(3, 40)).unwrap();
    let a = ids(20, v, 3);
    dec.forward(&mut cache, &[step(1, &a, 0)]).unwrap();
    let free = cache.blocks().free_blocks();
    let check = |cache: &CpuCache| {
        assert_eq!(cache.blocks().cached_len(SeqId(1)), 20);
        assert_eq!(cache.blocks().num_seqs(), 1);
        assert_eq!(cache.blocks().free_blocks(), free);
    };

    let msg = |r: Result<Vec<f32>>| r.unwrap_err().to_string();
    // start disagrees with the cache (names the sequence).
    let e = msg(dec.forward(&mut cache, &[step(2, &a[..2], 0), step(1, &[3], 19)]));
    assert!(e.contains("SeqId(1)") && e.contains("start 19"), "{e}");
    check(&cache);
    let e = msg(dec.forward(&mut cache, &[step(4, &a[..3], 2)]));
    assert!(e.contains("SeqId(4)"), "{e}");
    check(&cache);
    // Twice in one call.
    let e = msg(dec.forward(&mut cache, &[step(1, &[3], 20), step(1, &[4], 21)]));
    assert!(e.contains("twice"), "{e}");
    check(&cache);
    // Empty input.
    let e = msg(dec.forward(&mut cache, &[step(2, &[], 0)]));
    assert!(e.contains("no tokens"), "{e}");
    check(&cache);
    // Out of vocabulary.
    let r = dec.forward(&mut cache, &[step(2, &[1, v as u32], 0)]);
    assert!(matches!(
        r,
        Err(BackendError::TokenOutOfVocab { id, vocab_size }) if id as usize == v && vocab_size == v
    ));
    check(&cache);
    // Too many sequences (3 allowed, 1 cached).
    let e = msg(dec.forward(
        &mut cache,
        &[step(2, &[1], 0), step(3, &[1], 0), step(4, &[1], 0)],
    ));
    assert!(e.contains("max_seqs"), "{e}");
    check(&cache);
    // Pool exhausted: 40 tokens + 3 sequences = 6 blocks; seq 1 holds 2.
    let long = ids(70, v, 4);
    let e = msg(dec.forward(&mut cache, &[step(2, &long, 0)]));
    assert!(e.contains("cache full"), "{e}");
    check(&cache);
    // An empty call is a no-op.
    assert!(dec.forward(&mut cache, &[]).unwrap().is_empty());
    // Still usable.
    assert_eq!(
        dec.forward(&mut cache, &[step(1, &[5], 20)]).unwrap().len(),
        v
    );
}

/// A sequence made to start at a position ([`PagedBlocks::start_at`]) holds fresh blocks for
/// it, and is refused when it exists already or when the cache has no room.
#[test]
fn a_sequence_started_at_a_position_holds_its_blocks_or_is_refused() {
    let dec = CpuDecoder::from_model(&tiny("tiny-qwen2")).unwrap();
    // 40 tokens + 2 sequences = 5 blocks.
    let mut cache = dec.new_cache(&cache_config(2, 40)).unwrap();
    let blocks = &mut cache.blocks;
    blocks.start_at(SeqId(1), 17).unwrap();
    assert_eq!(blocks.cached_len(SeqId(1)), 17);
    assert_eq!(blocks.table(SeqId(1)).map(<[u32]>::len), Some(2));
    assert_eq!(blocks.free_blocks(), 3);
    let e = blocks.start_at(SeqId(1), 3).unwrap_err().to_string();
    assert!(e.contains("SeqId(1)") && e.contains("already"), "{e}");
    let e = blocks.start_at(SeqId(2), 49).unwrap_err().to_string();
    assert!(e.contains("cache full") && e.contains("4 blocks"), "{e}");
    blocks.start_at(SeqId(2), 48).unwrap();
    let e = blocks.start_at(SeqId(3), 1).unwrap_err().to_string();
    assert!(e.contains("max_seqs"), "{e}");
    assert_eq!(blocks.free_blocks(), 0);
    blocks.release(SeqId(1));
    assert_eq!(blocks.free_blocks(), 2);
}

#[test]
fn caches_fit_models_of_the_same_shape_only() {
    let base = CpuDecoder::from_model(&tiny("tiny-qwen2")).unwrap();
    let sft = CpuDecoder::from_model(&tiny("tiny-qwen2-sft")).unwrap();
    let q3 = CpuDecoder::from_model(&random(&qwen3_config())).unwrap();
    let mut cache = base.new_cache(&cache_config(2, 32)).unwrap();
    assert!(base.fits(&cache) && sft.fits(&cache) && !q3.fits(&cache));
    // Weights swapped mid-sequence: the new weights continue the old cache.
    let v = base.vocab_size();
    let a = ids(10, v, 5);
    base.forward(&mut cache, &[step(1, &a, 0)]).unwrap();
    assert_eq!(
        sft.forward(&mut cache, &[step(1, &[2], 10)]).unwrap().len(),
        v
    );
    let e = q3.forward(&mut cache, &[step(1, &[2], 11)]).unwrap_err();
    assert!(matches!(e, BackendError::InvalidInput(_)), "{e}");
    assert!(base.new_cache(&cache_config(0, 10)).is_err());
}

#[test]
fn moe_models_are_refused_with_a_clear_error() {
    let mut c = qwen3_config();
    c.model_type = "qwen3_moe".into();
    c.num_experts = Some(4);
    c.num_experts_per_tok = Some(2);
    c.moe_intermediate_size = Some(32);
    let err = CpuDecoder::from_model(&random(&c)).unwrap_err();
    assert!(
        matches!(&err, BackendError::UnsupportedByDecoder { what } if what.contains("qwen3_moe")),
        "{err}"
    );
}

/// A request of sequences of different lengths, with one empty response and a one-token prompt.
fn score_request(vocab: usize, with_entropy: bool) -> roll_core::policy::ScoreRequest {
    use roll_core::policy::{ScoreRequest, ScoreSequence};
    let seq = |prompt: usize, response: usize, seed: u64| {
        let all = ids(prompt + response, vocab, seed);
        ScoreSequence {
            prompt_ids: all[..prompt].to_vec(),
            response_ids: all[prompt..].to_vec(),
        }
    };
    ScoreRequest {
        sequences: vec![
            seq(5, 12, 11),
            seq(1, 30, 12),
            seq(9, 0, 13),
            seq(17, 3, 14),
            seq(3, 1, 15),
            seq(40, 25, 16),
        ],
        with_entropy,
        ..Default::default()
    }
}

fn burn_scores(
    model: &CausalLm,
    request: &roll_core::policy::ScoreRequest,
) -> Result<Vec<roll_core::policy::TokenScores>> {
    crate::score(
        model,
        None,
        request,
        &crate::ScoringOptions::default(),
        &Device::flex(),
    )
}

#[test]
fn scores_match_the_burn_scoring_path() {
    let models = [
        ("tiny-qwen2", tiny("tiny-qwen2")),
        ("tiny-qwen2-sft", tiny("tiny-qwen2-sft")),
        ("qwen3", random(&qwen3_config())),
    ];
    for (name, model) in &models {
        let dec = CpuDecoder::from_model(model).unwrap();
        for with_entropy in [false, true] {
            let request = score_request(model.vocab_size(), with_entropy);
            let want = burn_scores(model, &request).unwrap();
            let got = dec.score(&request).unwrap();
            assert_eq!(got.len(), want.len());
            // Absolute differences, and relative to `max(1, |want|)` (f32 round-off of a logit of
            // magnitude ~20 is already ~1e-6 per operation).
            let (mut lp_diff, mut ent_diff, mut lp_rel) = (0.0f32, 0.0f32, 0.0f32);
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.logprobs.len(), w.logprobs.len(), "{name}");
                assert_eq!(g.entropy.is_some(), w.entropy.is_some(), "{name}");
                assert_eq!(g.values, None, "{name}");
                assert_eq!(w.values, None, "{name}");
                lp_diff = lp_diff.max(max_abs_diff(&g.logprobs, &w.logprobs));
                for (x, y) in g.logprobs.iter().zip(&w.logprobs) {
                    lp_rel = lp_rel.max((x - y).abs() / y.abs().max(1.0));
                }
                if let (Some(ge), Some(we)) = (&g.entropy, &w.entropy) {
                    ent_diff = ent_diff.max(max_abs_diff(ge, we));
                }
            }
            println!(
                "{name} entropy={with_entropy}: logprobs {lp_diff:e} (relative {lp_rel:e}), \
                 entropy {ent_diff:e}"
            );
            assert!(
                lp_rel <= 1e-5,
                "{name}: logprob diff {lp_diff} (relative {lp_rel})"
            );
            assert!(ent_diff <= 1e-4, "{name}: entropy diff {ent_diff}");

            // Small groups cut sequences across forward calls; results stay bit-identical.
            for budget in [1, 7, 16, 40] {
                assert_eq!(
                    dec.score_in_groups(&request, budget).unwrap().0,
                    got,
                    "{name} budget {budget}"
                );
            }
            // Each sequence scored alone gives the same bits as in the batch.
            for (s, g) in request.sequences.iter().zip(&got) {
                let alone = roll_core::policy::ScoreRequest {
                    sequences: vec![s.clone()],
                    with_entropy,
                    ..Default::default()
                };
                assert_eq!(&dec.score(&alone).unwrap()[0], g, "{name}");
            }
        }
    }
}

/// [`grpo_groups`] to score, the second response of the 17-token prompt left empty (a sequence
/// with nothing to score, whose prompt another one still shares).
fn grouped_score_request(vocab: usize, with_entropy: bool) -> roll_core::policy::ScoreRequest {
    use roll_core::policy::{ScoreRequest, ScoreSequence};
    let mut sequences: Vec<ScoreSequence> = grpo_groups(vocab, 20)
        .into_iter()
        .map(|(prompt_ids, response_ids)| ScoreSequence {
            prompt_ids,
            response_ids,
        })
        .collect();
    // The groups are interleaved, five prompts a round: round 1's third sequence.
    sequences[5 + 2].response_ids.clear();
    ScoreRequest {
        sequences,
        with_entropy,
        ..Default::default()
    }
}

/// A prompt several sequences share is computed once, and every sequence's scores keep the bits
/// it has scored alone — whether the sequences continuing it run in the call that computes it or
/// copy it from an earlier call, and where calls cut sequences in pieces.
#[test]
fn shared_prompts_are_scored_once_with_the_bits_of_each_sequence_alone() {
    for (name, model, _) in models_under_test() {
        let dec = CpuDecoder::from_model(&model).unwrap();
        let request = grouped_score_request(model.vocab_size(), true);
        let alone: Vec<_> = request
            .sequences
            .iter()
            .map(|s| {
                let one = roll_core::policy::ScoreRequest {
                    sequences: vec![s.clone()],
                    ..request.clone()
                };
                dec.score(&one).unwrap().remove(0)
            })
            .collect();
        let whole: usize = request
            .sequences
            .iter()
            .filter(|s| !s.response_ids.is_empty())
            .map(|s| s.prompt_ids.len() + s.response_ids.len())
            .sum();
        // Two later sequences of each shared prompt (but the 17-token one's second has no
        // response) start at its last token.
        let saved: usize = [5, 16, 35].iter().map(|n| 2 * (n - 1)).sum::<usize>() + 16;
        for budget in [1, 7, 16, 40, 512] {
            let (got, computed) = dec.score_in_groups(&request, budget).unwrap();
            assert_eq!(computed, whole - saved, "{name} budget {budget}");
            for (i, (g, a)) in got.iter().zip(&alone).enumerate() {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&g.logprobs), bits(&a.logprobs), "{name} {budget} {i}");
                let entropy = |t: &TokenScores| t.entropy.as_deref().map(bits);
                assert_eq!(entropy(g), entropy(a), "{name} {budget} {i}");
            }
        }
    }
}

#[test]
fn score_errors_match_the_burn_scoring_path() {
    use roll_core::policy::{ScoreRequest, ScoreSequence};
    let model = tiny("tiny-qwen2");
    let dec = CpuDecoder::from_model(&model).unwrap();
    let v = model.vocab_size() as u32;
    let seq = |prompt: Vec<u32>, response: Vec<u32>| ScoreSequence {
        prompt_ids: prompt,
        response_ids: response,
    };
    let cases = [
        // A response without a prompt.
        vec![seq(vec![1, 2], vec![3]), seq(vec![], vec![4, 5])],
        // An id outside the vocabulary, in the prompt and in the response.
        vec![seq(vec![1, v], vec![3])],
        vec![seq(vec![1, 2], vec![3]), seq(vec![1], vec![v + 5])],
    ];
    for sequences in cases {
        let request = ScoreRequest {
            sequences,
            with_entropy: true,
            ..Default::default()
        };
        let want = burn_scores(&model, &request).unwrap_err();
        let got = dec.score(&request).unwrap_err();
        assert_eq!(
            std::mem::discriminant(&got),
            std::mem::discriminant(&want),
            "{got} vs {want}"
        );
        assert_eq!(got.to_string(), want.to_string());
    }
    // Empty responses (even with an empty prompt or out-of-vocab ids) and empty requests are
    // fine.
    let request = ScoreRequest {
        sequences: vec![seq(vec![], vec![]), seq(vec![v], vec![])],
        with_entropy: true,
        ..Default::default()
    };
    assert_eq!(
        dec.score(&request).unwrap(),
        burn_scores(&model, &request).unwrap()
    );
    let empty = ScoreRequest {
        sequences: vec![],
        with_entropy: false,
        ..Default::default()
    };
    assert!(dec.score(&empty).unwrap().is_empty());
}
