//! Inference engines over an expert-parallel Qwen3-MoE, one per rank of a `LocalGroup` (each
//! rank a thread): every rank serves requests of its own, the mixtures exchange tokens with the
//! ranks holding their experts, and the engines step together (`engine::lockstep`). Each
//! request's generation must be the whole model's — the same tokens, log-probs ≤ 1e-5 —
//! whatever the other ranks serve, across a weight sync, and with a rank serving nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use roll_backend_burn::engine::{DecoderKind, Engine, EngineConfig, GenerationEvent};
use roll_backend_burn::{CausalLm, Device};
use roll_core::WeightVersion;
use roll_core::policy::{Generation, GenerationRequest, SamplingParams};
use roll_core::strategy::Strategy;
use std::sync::Arc;
use support::{on_ranks, qwen3_moe_config};

/// A request: prompt and sampling parameters.
type Request = (Vec<u32>, SamplingParams);

fn params(max_new_tokens: u32, seed: Option<u64>) -> SamplingParams {
    SamplingParams {
        // `None`: greedy.
        temperature: if seed.is_some() { 1.0 } else { 0.0 },
        max_new_tokens,
        seed,
        ..SamplingParams::default()
    }
}

fn prompt(len: usize, salt: usize) -> Vec<u32> {
    (0..len)
        .map(|t| ((t * 13 + salt * 7 + 3) % 97) as u32)
        .collect()
}

/// Rank `rank`'s requests: rank 0 has three (prompts across cache blocks, sampled and greedy),
/// rank 1 one, rank 2 none — so that every rank serves steps it has no tokens in.
fn requests(rank: usize) -> Vec<Request> {
    match rank {
        0 => vec![
            (prompt(5, 1), params(9, Some(11))),
            (prompt(19, 2), params(4, None)),
            (prompt(33, 3), params(12, Some(12))),
        ],
        1 => vec![(prompt(7, 4), params(14, Some(13)))],
        _ => Vec::new(),
    }
}

/// What a whole model's engine generates for `request`, alone.
fn whole(model: &CausalLm, request: &Request) -> Generation {
    let engine = Engine::with_decoder(
        DecoderKind::Device,
        model,
        &Device::flex(),
        EngineConfig::default(),
        None,
    )
    .unwrap();
    let (prompt, params) = request.clone();
    engine
        .submit(GenerationRequest::new(prompt, params))
        .unwrap()
        .wait()
        .unwrap()
}

fn assert_same(got: &Generation, want: &Generation, what: &str) {
    assert_eq!(got.token_ids, want.token_ids, "{what}: tokens");
    assert_eq!(got.finish_reason, want.finish_reason, "{what}: finish");
    assert_eq!(got.weight_version, want.weight_version, "{what}: version");
    let worst = got
        .logprobs
        .iter()
        .zip(&want.logprobs)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        got.logprobs.iter().all(|v| v.is_finite()),
        "{what}: non-finite log-probs"
    );
    assert!(worst <= 1e-5, "{what}: log-probs differ by {worst}");
}

/// Runs `body` on every rank of a group of `ranks` threads, with its rank's part of `model`.
fn on_each_rank<T: Send>(
    model: &CausalLm,
    ranks: usize,
    body: impl Fn(Arc<dyn Strategy>, CausalLm) -> T + Sync,
) -> Vec<T> {
    on_ranks(ranks, |link| {
        let group: Arc<dyn Strategy> = link;
        body(group.clone(), model.clone().shard_experts(group).unwrap())
    })
}

#[test]
fn expert_parallel_engines_generate_what_the_whole_model_does() {
    let model = CausalLm::init(&qwen3_moe_config(), &Device::flex()).unwrap();
    // 4 experts over 2 ranks (2 + 2) and over 3 (1 + 1 + 2; rank 2 submits nothing).
    for ranks in [2usize, 3] {
        let generated = on_each_rank(&model, ranks, |group, part| {
            let engine =
                Engine::for_model(&part, &Device::flex(), EngineConfig::default(), None).unwrap();
            let handles: Vec<_> = requests(group.rank())
                .into_iter()
                .map(|(prompt, params)| {
                    engine
                        .submit(GenerationRequest::new(prompt, params))
                        .unwrap()
                })
                .collect();
            let out: Vec<Generation> = handles.into_iter().map(|h| h.wait().unwrap()).collect();
            // Dropping the engine waits for the peers' to be done too.
            drop(engine);
            out
        });
        for (rank, generations) in generated.iter().enumerate() {
            let want = requests(rank);
            assert_eq!(generations.len(), want.len());
            for (i, (got, request)) in generations.iter().zip(&want).enumerate() {
                assert!(!got.token_ids.is_empty());
                assert_same(
                    got,
                    &whole(&model, request),
                    &format!("{ranks} ranks, rank {rank}, request {i}"),
                );
            }
        }
    }
}

/// Rank 0 starts a long request on the first weights; both ranks sync to new weights while it
/// runs (finishing on its own, `InFlightPolicy::Finish`); then each starts one on the new
/// weights. The engines then step over two versions at once, rank 1 serving the old version's
/// tokens with weights it keeps for its peer.
#[test]
fn expert_parallel_engines_sync_together_and_finish_old_sequences_on_old_weights() {
    let device = Device::flex();
    let before = CausalLm::init(&qwen3_moe_config(), &device).unwrap();
    let after = CausalLm::init(&qwen3_moe_config(), &device).unwrap();
    let long: Request = (prompt(6, 9), params(48, Some(21)));
    let late = |rank: usize| -> Request { (prompt(4 + rank, 10 + rank), params(10, Some(30))) };
    let results = on_each_rank(&before, 2, |group, first_part| {
        let engine =
            Engine::for_model(&first_part, &device, EngineConfig::default(), None).unwrap();
        let mut first = None;
        if group.rank() == 0 {
            let (prompt, params) = long.clone();
            let mut handle = engine
                .submit(GenerationRequest::new(prompt, params))
                .unwrap();
            // Running (a token out) before the sync.
            match handle.next_event_blocking() {
                Some(GenerationEvent::Token(_)) => {}
                other => panic!("expected a token, got {other:?}"),
            }
            first = Some(handle);
        }
        // This rank's part of the new weights, over the same group as the first.
        let new_part = after.clone().shard_experts(group.clone()).unwrap();
        // Returns once the other rank has synced as well.
        let version = engine.sync_weights_blocking(&new_part).unwrap();
        let (prompt, params) = late(group.rank());
        let second = engine
            .submit(GenerationRequest::new(prompt, params))
            .unwrap()
            .wait()
            .unwrap();
        let first = first.map(|h| h.wait().unwrap());
        (first, second, version)
    });
    for (rank, (first, second, version)) in results.iter().enumerate() {
        assert_eq!(*version, WeightVersion(1), "rank {rank}");
        let mut want = whole(&after, &late(rank));
        want.weight_version = WeightVersion(1);
        assert_same(second, &want, &format!("rank {rank}, after the sync"));
        if let Some(first) = first {
            assert_eq!(first.weight_version, WeightVersion(0));
            assert_eq!(first.token_ids.len(), 48);
            assert_same(first, &whole(&before, &long), "rank 0, across the sync");
        }
    }
}

#[test]
fn an_expert_parallel_engine_refuses_a_whole_model_sync_and_other_decoders() {
    let device = Device::flex();
    let model = CausalLm::init(&qwen3_moe_config(), &device).unwrap();
    let errors = on_each_rank(&model, 1, |_, part| {
        let engine = Engine::for_model(&part, &device, EngineConfig::default(), None).unwrap();
        let sync = engine
            .sync_weights_blocking(&model)
            .unwrap_err()
            .to_string();
        let burn = Engine::with_decoder(
            DecoderKind::Burn,
            &part,
            &device,
            EngineConfig::default(),
            None,
        )
        .unwrap_err()
        .to_string();
        (sync, burn)
    });
    let (sync, burn) = &errors[0];
    assert!(
        sync.contains("a whole model") && sync.contains("rank 0 of 1 expert-parallel ranks"),
        "{sync}"
    );
    assert!(
        burn.contains("expert-parallel") && burn.contains("only the device decoder"),
        "{burn}"
    );
}

/// A rank that fails (here: before it starts its engine) makes its peers' engines fail their
/// requests with an error and stop, instead of waiting for it for ever.
#[test]
fn an_expert_parallel_engine_whose_peer_is_gone_fails_its_requests() {
    let model = CausalLm::init(&qwen3_moe_config(), &Device::flex()).unwrap();
    let outcomes = on_each_rank(&model, 2, |group, part| {
        if group.rank() == 1 {
            group.abort("rank 1 failed to load its weights");
            return None;
        }
        let engine =
            Engine::for_model(&part, &Device::flex(), EngineConfig::default(), None).unwrap();
        let (prompt, params) = requests(0).remove(0);
        let result = engine
            .submit(GenerationRequest::new(prompt, params))
            .and_then(|h| h.wait());
        Some(result.unwrap_err().to_string())
    });
    let err = outcomes[0].as_ref().unwrap();
    assert!(err.contains("rank 1 failed to load its weights"), "{err}");
}
