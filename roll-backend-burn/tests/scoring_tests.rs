#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Padding and micro-batching do not change scores; scores match the HF reference.

mod support;

use roll_backend_burn::{
    CausalLm, Device, PaddingSide, ScoringOptions, TokenBatch, ValueHead, load_model, score,
};
use roll_core::policy::{ScoreRequest, ScoreSequence};
use support::{cases, fixture, max_abs_diff, read_npy};

fn request(with_entropy: bool) -> ScoreRequest {
    let sequences = cases("tiny-qwen2-sft")
        .into_iter()
        .enumerate()
        .map(|(i, (ids, _))| {
            let split = 2 + i; // different prompt lengths
            ScoreSequence {
                prompt_ids: ids[..split].to_vec(),
                response_ids: ids[split..].to_vec(),
            }
        })
        .collect();
    ScoreRequest {
        sequences,
        with_entropy,
        ..Default::default()
    }
}

fn model() -> (CausalLm, Device) {
    let device = Device::flex();
    (
        load_model(fixture("tiny-qwen2-sft"), &device).unwrap(),
        device,
    )
}

#[test]
fn scores_match_reference_logprobs() {
    let (model, device) = model();
    let req = request(false);
    let out = score(&model, None, &req, &ScoringOptions::default(), &device).unwrap();
    for (i, (seq, got)) in req.sequences.iter().zip(&out).enumerate() {
        let (_, reference) =
            read_npy(&fixture("tiny-qwen2-sft").join(format!("reference/case{i}_logprobs.npy")));
        let from = seq.prompt_ids.len() - 1;
        let diff = max_abs_diff(&got.logprobs, &reference[from..]);
        assert!(diff <= 1e-5, "case {i}: {diff}");
        assert!(got.entropy.is_none() && got.values.is_none());
    }
}

#[test]
fn padding_side_and_micro_batching_do_not_change_scores() {
    let (model, device) = model();
    let req = request(true);
    // One at a time: each sequence alone.
    let alone: Vec<_> = req
        .sequences
        .iter()
        .map(|s| {
            let one = ScoreRequest {
                sequences: vec![s.clone()],
                with_entropy: true,
                ..Default::default()
            };
            score(&model, None, &one, &ScoringOptions::default(), &device)
                .unwrap()
                .remove(0)
        })
        .collect();
    for padding in [PaddingSide::Left, PaddingSide::Right] {
        for budget in [1, 40, 10_000] {
            let opts = ScoringOptions::default()
                .with_padding(padding)
                .with_max_tokens_per_micro_batch(budget);
            let batched = score(&model, None, &req, &opts, &device).unwrap();
            for (a, b) in alone.iter().zip(&batched) {
                assert_eq!(a.logprobs.len(), b.logprobs.len());
                let d = max_abs_diff(&a.logprobs, &b.logprobs);
                assert!(d <= 1e-5, "{padding:?} budget {budget}: logprobs {d}");
                let e = max_abs_diff(a.entropy.as_ref().unwrap(), b.entropy.as_ref().unwrap());
                assert!(e <= 1e-5, "{padding:?} budget {budget}: entropy {e}");
            }
        }
    }
}

#[test]
fn left_padded_logits_equal_unpadded_logits() {
    let (model, device) = model();
    let seqs: Vec<Vec<u32>> = cases("tiny-qwen2-sft").into_iter().map(|c| c.0).collect();
    let v = model.vocab_size();
    for padding in [PaddingSide::Left, PaddingSide::Right] {
        let batch = TokenBatch::new(&seqs, padding, 0, v, &device).unwrap();
        let logits: Vec<f32> = model.forward(&batch).into_data().try_into_vec().unwrap();
        let width = seqs.iter().map(Vec::len).max().unwrap();
        for (r, seq) in seqs.iter().enumerate() {
            let alone = TokenBatch::single(seq, v, &device).unwrap();
            let want: Vec<f32> = model.forward(&alone).into_data().try_into_vec().unwrap();
            for t in 0..seq.len() {
                let c = batch.column(r, t);
                let row = &logits[(r * width + c) * v..(r * width + c + 1) * v];
                let d = max_abs_diff(row, &want[t * v..(t + 1) * v]);
                assert!(d <= 1e-5, "{padding:?} row {r} token {t}: {d}");
            }
        }
    }
}

#[test]
fn entropy_is_consistent_and_values_come_from_the_head() {
    let (model, device) = model();
    let head = ValueHead::init(model.hidden_size(), &device);
    let req = request(true);
    let out = score(
        &model,
        Some(&head),
        &req,
        &ScoringOptions::default(),
        &device,
    )
    .unwrap();
    for (s, o) in req.sequences.iter().zip(&out) {
        let n = s.response_ids.len();
        let ent = o.entropy.as_ref().unwrap();
        let val = o.values.as_ref().unwrap();
        assert_eq!((o.logprobs.len(), ent.len(), val.len()), (n, n, n));
        let max_entropy = (model.vocab_size() as f32).ln();
        assert!(ent.iter().all(|&h| (0.0..=max_entropy + 1e-4).contains(&h)));
        assert!(o.logprobs.iter().all(|&l| l <= 0.0));
        assert!(val.iter().all(|x| x.is_finite()));
    }
}

#[test]
fn bad_inputs_are_errors() {
    let (model, device) = model();
    let oov = ScoreRequest {
        sequences: vec![ScoreSequence {
            prompt_ids: vec![1, 2],
            response_ids: vec![512],
        }],
        with_entropy: false,
        ..Default::default()
    };
    let err = score(&model, None, &oov, &ScoringOptions::default(), &device).unwrap_err();
    assert!(
        matches!(
            err,
            roll_backend_burn::BackendError::TokenOutOfVocab {
                id: 512,
                vocab_size: 512
            }
        ),
        "{err}"
    );
    let no_prompt = ScoreRequest {
        sequences: vec![ScoreSequence {
            prompt_ids: vec![],
            response_ids: vec![3],
        }],
        with_entropy: false,
        ..Default::default()
    };
    assert!(
        score(
            &model,
            None,
            &no_prompt,
            &ScoringOptions::default(),
            &device
        )
        .is_err()
    );
    let empty_response = ScoreRequest {
        sequences: vec![ScoreSequence {
            prompt_ids: vec![3],
            response_ids: vec![],
        }],
        with_entropy: false,
        ..Default::default()
    };
    let out = score(
        &model,
        None,
        &empty_response,
        &ScoringOptions::default(),
        &device,
    )
    .unwrap();
    assert!(out[0].logprobs.is_empty());
}
