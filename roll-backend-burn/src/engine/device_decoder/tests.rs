//! The device decoder on the CPU (Flex; the GPU path is `tests/gpu_tests.rs`): prefill and
//! incremental decode equal full forwards for dense and mixture-of-experts models, prompts fed in
//! chunks equal prompts fed at once, a sequence's logits do not depend on what shares its call,
//! and the paged cache reuses, truncates and rejects as documented.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::engine::test_support::*;

fn decoder(model: &CausalLm) -> DeviceDecoder {
    DeviceDecoder::from_model(model, &Device::flex()).unwrap()
}

fn all_models() -> Vec<(&'static str, CausalLm, Vec<Vec<u32>>)> {
    let mut models = models_under_test();
    let moe = random(&qwen3_moe_config());
    let v = moe.vocab_size();
    models.push((
        "qwen3-moe",
        moe,
        vec![ids(1, v, 4), ids(21, v, 5), ids(37, v, 6)],
    ));
    models
}

#[test]
fn prefill_and_incremental_decode_match_full_forwards() {
    for (name, model, seqs) in all_models() {
        let dec = decoder(&model);
        let v = dec.vocab_size();
        for (i, seq) in seqs.iter().enumerate() {
            let want = full_logits(&model, seq);
            let id = i as u64;
            // The whole sequence at once.
            let mut cache = dec.new_cache(&cache_config(2, 128)).unwrap();
            let got = dec.forward(&mut cache, &[step(id, seq, 0)]).unwrap();
            let last = &want[(seq.len() - 1) * v..];
            let d = max_abs_diff(&got, last);
            assert!(d <= tolerance(last), "{name} seq {i} prefill: {d}");
            assert_eq!(cache.blocks().cached_len(SeqId(id)), seq.len());
            // A prefix, then chunks of 5 (across block boundaries), then one token at a time.
            let mut cache = dec.new_cache(&cache_config(2, 128)).unwrap();
            let mut p = 0;
            while p < seq.len() {
                let n = if p == 0 {
                    3
                } else if p < 20 {
                    5
                } else {
                    1
                };
                let end = (p + n).min(seq.len());
                let got = dec
                    .forward(&mut cache, &[step(id, &seq[p..end], p)])
                    .unwrap();
                let row = &want[(end - 1) * v..end * v];
                let d = max_abs_diff(&got, row);
                assert!(d <= tolerance(row), "{name} seq {i} up to {end}: {d}");
                p = end;
            }
        }
    }
}

/// The logits of a sequence are the same bits whether it runs alone or beside others (prefills
/// and decodes mixed in one call).
#[test]
fn a_sequence_gives_the_same_bits_whatever_shares_its_call() {
    for (name, model, _) in all_models() {
        let dec = decoder(&model);
        let v = dec.vocab_size();
        let (a, b, c) = (ids(19, v, 1), ids(33, v, 2), ids(7, v, 3));
        let mut alone = dec.new_cache(&cache_config(3, 256)).unwrap();
        let mut shared = dec.new_cache(&cache_config(3, 256)).unwrap();
        dec.forward(&mut shared, &[step(2, &b, 0)]).unwrap();
        let solo = dec.forward(&mut alone, &[step(1, &a[..18], 0)]).unwrap();
        let mixed = dec
            .forward(&mut shared, &[step(3, &c, 0), step(1, &a[..18], 0)])
            .unwrap();
        assert_eq!(solo, mixed[v..], "{name}: prefill beside another");
        let solo = dec.forward(&mut alone, &[step(1, &a[18..], 18)]).unwrap();
        let mixed = dec
            .forward(
                &mut shared,
                &[step(2, &[5], 33), step(1, &a[18..], 18), step(3, &[6], 7)],
            )
            .unwrap();
        assert_eq!(solo, mixed[v..2 * v], "{name}: decode beside others");
    }
}

#[test]
fn released_and_truncated_blocks_are_reused_with_the_same_results() {
    let model = tiny("tiny-qwen2");
    let dec = decoder(&model);
    let v = dec.vocab_size();
    // 2 sequences, 64 tokens: 4 + 2 blocks.
    let mut cache = dec.new_cache(&cache_config(2, 64)).unwrap();
    assert_eq!(cache.blocks().total_blocks(), 6);
    let (a, b) = (ids(33, v, 1), ids(48, v, 2));
    let first = dec
        .forward(&mut cache, &[step(1, &a, 0), step(2, &b, 0)])
        .unwrap();
    assert_eq!(
        (cache.blocks().free_blocks(), cache.blocks().num_seqs()),
        (0, 2)
    );
    // Rewinding rewrites the positions it dropped: same logits from the same tokens.
    dec.truncate(&mut cache, SeqId(1), 20);
    assert_eq!(
        (
            cache.blocks().cached_len(SeqId(1)),
            cache.blocks().free_blocks()
        ),
        (20, 1)
    );
    let redo = dec.forward(&mut cache, &[step(1, &a[20..], 20)]).unwrap();
    assert_eq!(redo, first[..v]);
    // Freed blocks hold stale keys; a new sequence on them sees only its own.
    dec.release(&mut cache, SeqId(1));
    dec.release(&mut cache, SeqId(77)); // unknown: ignored
    assert_eq!(cache.blocks().free_blocks(), 3);
    let c = dec.forward(&mut cache, &[step(5, &a, 0)]).unwrap();
    assert_eq!(c, first[..v]);
    dec.release(&mut cache, SeqId(5));
    // Sequence 2 decodes on as if nothing happened, into a fresh block.
    let want = full_logits(&model, &[b.as_slice(), &[7]].concat());
    let got = dec.forward(&mut cache, &[step(2, &[7], 48)]).unwrap();
    assert!(max_abs_diff(&got, &want[48 * v..]) <= 1e-4);
    dec.release(&mut cache, SeqId(2));
    assert_eq!(
        (cache.blocks().free_blocks(), cache.blocks().num_seqs()),
        (6, 0)
    );
}

#[test]
fn bad_inputs_are_rejected_and_leave_the_cache_untouched() {
    let model = tiny("tiny-qwen2");
    let dec = decoder(&model);
    let v = dec.vocab_size();
    let mut cache = dec.new_cache(&cache_config(2, 40)).unwrap();
    let a = ids(20, v, 3);
    let before = dec.forward(&mut cache, &[step(1, &a[..19], 0)]).unwrap();
    let free = cache.blocks().free_blocks();
    let check = |cache: &DeviceCache| {
        assert_eq!(cache.blocks().cached_len(SeqId(1)), 19);
        assert_eq!(
            (cache.blocks().num_seqs(), cache.blocks().free_blocks()),
            (1, free)
        );
    };
    let msg = |r: Result<Vec<f32>>| r.unwrap_err().to_string();
    let e = msg(dec.forward(&mut cache, &[step(2, &a[..2], 0), step(1, &[3], 18)]));
    assert!(e.contains("SeqId(1)") && e.contains("start 18"), "{e}");
    check(&cache);
    let e = msg(dec.forward(&mut cache, &[step(1, &[3], 19), step(1, &[4], 20)]));
    assert!(e.contains("twice"), "{e}");
    check(&cache);
    let e = msg(dec.forward(&mut cache, &[step(1, &[v as u32], 19)]));
    assert!(e.contains(&format!("{v}")), "{e}");
    check(&cache);
    let e = msg(dec.forward(&mut cache, &[step(2, &ids(60, v, 4), 0)]));
    assert!(e.contains("cache full"), "{e}");
    check(&cache);
    let e = msg(dec.forward(&mut cache, &[step(2, &[1], 0), step(3, &[1], 0)]));
    assert!(e.contains("max_seqs"), "{e}");
    check(&cache);
    // A cache shaped for another model is refused.
    let other = decoder(&random(&qwen3_config()));
    let e = msg(other.forward(&mut cache, &[step(1, &[3], 19)]));
    assert!(e.contains("cache made for"), "{e}");
    check(&cache);
    // And the sequence still continues correctly.
    let next = dec.forward(&mut cache, &[step(1, &a[19..], 19)]).unwrap();
    let want = full_logits(&model, &a);
    assert!(max_abs_diff(&next, &want[19 * v..]) <= 1e-4);
    assert_eq!(before.len(), v);
}
