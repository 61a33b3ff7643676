//! The inference engine on the reference fixtures, for every decoder: greedy reference text,
//! sampling reproducibility, continuous batching with joins and aborts, stops, capacity, weight
//! sync, and the log-prob agreement with scoring.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use roll_backend_burn::engine::{
    DecoderKind, Engine, EngineConfig, GenerationEvent, InFlightPolicy,
};
use roll_backend_burn::{CausalLm, Device, HfTokenizer, ScoringOptions, load_model, score};
use roll_core::policy::{GenerationRequest, SamplingParams, ScoreRequest, ScoreSequence};
use roll_core::{AbortHandle, FinishReason, Tokenizer, WeightVersion};
use std::sync::Arc;
use support::fixture;

fn decoders() -> Vec<DecoderKind> {
    vec![DecoderKind::Cpu, DecoderKind::Device, DecoderKind::Burn]
}

fn sft() -> (CausalLm, Device) {
    let device = Device::flex();
    (
        load_model(fixture("tiny-qwen2-sft"), &device).unwrap(),
        device,
    )
}

fn engine(kind: DecoderKind, model: &CausalLm, device: &Device, config: EngineConfig) -> Engine {
    Engine::with_decoder(kind, model, device, config, None).unwrap()
}

/// A runtime on the test's thread, to await several requests' events in turn.
fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

fn sampled(max_new: u32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        max_new_tokens: max_new,
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

fn greedy(max_new: u32) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_new_tokens: max_new,
        ..SamplingParams::default()
    }
}

fn run(engine: &Engine, prompt: &[u32], params: SamplingParams) -> roll_core::policy::Generation {
    engine
        .submit(GenerationRequest::new(prompt.to_vec(), params))
        .unwrap()
        .wait()
        .unwrap()
}

/// Each of `prompts` run alone, one after the other, on a fresh engine of `kind` with the default
/// config, prompt `i` with `params(i)`: what a request samples with nothing beside it.
fn each_alone(
    kind: DecoderKind,
    model: &CausalLm,
    device: &Device,
    prompts: &[Vec<u32>],
    params: impl Fn(usize) -> SamplingParams,
) -> Vec<roll_core::policy::Generation> {
    let e = engine(kind, model, device, EngineConfig::default());
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| run(&e, p, params(i)))
        .collect()
}

fn reference_greedy(name: &str) -> (Vec<u32>, Vec<u32>) {
    let cases: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture(name).join("reference/cases.json")).unwrap())
            .unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    (
        ids(&cases["greedy"]["prompt_ids"]),
        ids(&cases["greedy"]["new_tokens"]),
    )
}

#[test]
fn greedy_generation_reproduces_the_reference_tokens() {
    for name in ["tiny-qwen2", "tiny-qwen2-sft"] {
        let device = Device::flex();
        let model = load_model(fixture(name), &device).unwrap();
        let (prompt, expected) = reference_greedy(name);
        for kind in decoders() {
            let e = engine(kind, &model, &device, EngineConfig::default());
            let g = run(&e, &prompt, greedy(expected.len() as u32));
            assert_eq!(g.token_ids, expected, "{name} {kind:?}");
            assert_eq!(g.finish_reason, FinishReason::Length);
            // top-k = 1 at temperature 1 is greedy too.
            let mut top1 = sampled(expected.len() as u32, 99);
            top1.top_k = Some(1);
            assert_eq!(
                run(&e, &prompt, top1).token_ids,
                expected,
                "{name} {kind:?}"
            );
        }
    }
}

#[test]
fn seeded_requests_are_reproducible_and_seeds_matter() {
    let (model, device) = sft();
    for kind in decoders() {
        let e = engine(kind, &model, &device, EngineConfig::default());
        let a = run(&e, &[5, 6, 7], sampled(24, 1));
        let b = run(&e, &[5, 6, 7], sampled(24, 1));
        let c = run(&e, &[5, 6, 7], sampled(24, 2));
        assert_eq!(a, b, "{kind:?}");
        assert_ne!(a.token_ids, c.token_ids, "{kind:?}");
    }
}

/// Requests join mid-flight and one is aborted; the survivors get exactly what they get alone.
#[test]
fn continuous_batching_matches_running_each_request_alone() {
    let (model, device) = sft();
    let prompts: Vec<Vec<u32>> = vec![
        vec![20, 21, 22, 23],
        vec![30, 31],
        vec![40, 41, 42, 43, 44, 45, 46],
        vec![50],
    ];
    for kind in decoders() {
        let alone = each_alone(kind, &model, &device, &prompts, |i| {
            sampled(20, 100 + i as u64)
        });
        let config = EngineConfig {
            max_batch_tokens: 5, // forces prompt chunking alongside decodes
            ..EngineConfig::default()
        };
        let e = engine(kind, &model, &device, config);
        let rt = current_thread();
        rt.block_on(async {
            let submit = |i: usize| {
                e.submit(GenerationRequest::new(
                    prompts[i].clone(),
                    sampled(20, 100 + i as u64),
                ))
                .unwrap()
            };
            let mut first = submit(0);
            let aborted = submit(2);
            // Wait until request 0 has produced three tokens, then add two more.
            let mut seen = 0;
            while seen < 3 {
                match first.next_event().await {
                    Some(GenerationEvent::Token(_)) => seen += 1,
                    other => panic!("{kind:?}: expected a token, got {other:?}"),
                }
            }
            let second = submit(1);
            let mut to_abort = aborted;
            let mut streamed = Vec::new();
            while streamed.len() < 2 {
                match to_abort.next_event().await {
                    Some(GenerationEvent::Token(t)) => streamed.push(t.id),
                    other => panic!("{kind:?}: expected a token, got {other:?}"),
                }
            }
            to_abort.abort();
            let fourth = submit(3);
            let cut = to_abort.finish().await.unwrap();
            assert_eq!(cut.finish_reason, FinishReason::Abort, "{kind:?}");
            assert!(cut.token_ids.len() >= 2 && cut.token_ids.len() < 20);
            assert_eq!(cut.token_ids[..], alone[2].token_ids[..cut.token_ids.len()]);
            assert_eq!(cut.logprobs[..], alone[2].logprobs[..cut.logprobs.len()]);
            for (i, handle) in [(0, first), (1, second), (3, fourth)] {
                let g = handle.finish().await.unwrap();
                assert_eq!(g.token_ids, alone[i].token_ids, "{kind:?} request {i}");
                assert_eq!(g.logprobs, alone[i].logprobs, "{kind:?} request {i}");
            }
        });
    }
}

#[test]
fn engine_logprobs_equal_scoring_logprobs() {
    let (model, device) = sft();
    let prompt = vec![11u32, 12, 13, 14];
    for kind in decoders() {
        let e = engine(kind, &model, &device, EngineConfig::default());
        let g = run(&e, &prompt, sampled(16, 5));
        let scored = score(
            &model,
            None,
            &ScoreRequest {
                sequences: vec![ScoreSequence {
                    prompt_ids: prompt.clone(),
                    response_ids: g.token_ids.clone(),
                }],
                with_entropy: false,
                ..Default::default()
            },
            &ScoringOptions::default(),
            &device,
        )
        .unwrap();
        let gap = scored[0]
            .logprobs
            .iter()
            .zip(&g.logprobs)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(gap <= 1e-4, "{kind:?}: train-inference log-prob gap {gap}");
    }
}

#[test]
fn stop_ids_stop_strings_and_length_end_requests() {
    let (model, device) = sft();
    let tokenizer: Arc<dyn Tokenizer> =
        Arc::new(HfTokenizer::from_dir(fixture("tiny-qwen2-sft")).unwrap());
    for kind in decoders() {
        let e = Engine::with_decoder(
            kind,
            &model,
            &device,
            EngineConfig::default(),
            Some(tokenizer.clone()),
        )
        .unwrap();
        let prompt = tokenizer.encode("Q: 12+35=? A:").unwrap();
        // The tokenizer's EOS ends a generation without being configured (the model answers
        // and then emits `<|endoftext|>`); the EOS is kept in the ids, not in the text.
        let eos = tokenizer.eos_token_id().unwrap();
        let answered = run(&e, &prompt, greedy(32));
        assert_eq!(answered.finish_reason, FinishReason::Stop);
        assert_eq!(answered.token_ids.last(), Some(&eos));
        // Within a shorter budget the length limit ends it.
        let budget = answered.token_ids.len() - 1;
        let free = run(&e, &prompt, greedy(budget as u32));
        assert_eq!(free.finish_reason, FinishReason::Length);
        assert_eq!(free.token_ids, answered.token_ids[..budget]);
        assert_eq!(free.text, tokenizer.decode(&free.token_ids).unwrap());

        // Stop at the third generated token's id.
        let mut params = greedy(budget as u32);
        params.stop_token_ids = vec![free.token_ids[2]];
        let first_hit = free
            .token_ids
            .iter()
            .position(|&t| t == free.token_ids[2])
            .unwrap();
        let stopped = run(&e, &prompt, params);
        assert_eq!(stopped.finish_reason, FinishReason::Stop);
        assert_eq!(stopped.token_ids, free.token_ids[..=first_hit]);
        // The stop token is not part of the text.
        assert_eq!(
            stopped.text,
            tokenizer.decode(&free.token_ids[..first_hit]).unwrap()
        );

        // A stop string cuts the text before it.
        let needle: String = free.text.chars().skip(2).take(2).collect();
        let mut params = greedy(budget as u32);
        params.stop = vec![needle.clone()];
        let cut = run(&e, &prompt, params);
        assert_eq!(cut.finish_reason, FinishReason::Stop, "{needle:?}");
        assert!(!cut.text.contains(&needle) && free.text.starts_with(&cut.text));
    }
}

#[test]
fn capacity_limits_queue_requests_and_reject_oversized_ones() {
    let (model, device) = sft();
    for kind in decoders() {
        let config = EngineConfig {
            max_seqs: 2,
            max_cached_tokens: 64,
            ..EngineConfig::default()
        };
        let e = engine(kind, &model, &device, config);
        let handles: Vec<_> = (0..5)
            .map(|i| {
                e.submit(GenerationRequest::new(
                    vec![10 + i, 11],
                    sampled(8, i as u64),
                ))
                .unwrap()
            })
            .collect();
        for h in handles {
            assert_eq!(h.wait().unwrap().token_ids.len(), 8);
        }
        let too_big = e.submit(GenerationRequest::new(vec![1; 60], sampled(8, 0)));
        assert!(
            too_big
                .unwrap_err()
                .to_string()
                .contains("max_cached_tokens")
        );
        let bad_id = e.submit(GenerationRequest::new(vec![1, 100_000], sampled(4, 0)));
        assert!(bad_id.unwrap_err().to_string().contains("100000"));
        assert!(
            e.submit(GenerationRequest::new(vec![], sampled(4, 0)))
                .is_err()
        );
    }
}

#[test]
fn abort_signal_of_the_request_is_honoured_even_while_queued() {
    let (model, device) = sft();
    for kind in decoders() {
        let config = EngineConfig {
            max_seqs: 1,
            ..EngineConfig::default()
        };
        let e = engine(kind, &model, &device, config);
        let busy = e
            .submit(GenerationRequest::new(vec![3, 4], sampled(30, 0)))
            .unwrap();
        let (handle, signal) = AbortHandle::new();
        let mut request = GenerationRequest::new(vec![5, 6], sampled(30, 0));
        request.abort = signal;
        let queued = e.submit(request).unwrap();
        handle.abort();
        let g = queued.wait().unwrap();
        assert_eq!(g.finish_reason, FinishReason::Abort);
        assert!(g.token_ids.is_empty());
        assert_eq!(busy.wait().unwrap().token_ids.len(), 30);
    }
}

#[test]
fn weight_sync_versions_and_in_flight_policies() {
    let device = Device::flex();
    let base = load_model(fixture("tiny-qwen2"), &device).unwrap();
    let tuned = load_model(fixture("tiny-qwen2-sft"), &device).unwrap();
    for kind in decoders() {
        let expected_new = {
            let e = engine(kind, &tuned, &device, EngineConfig::default());
            run(&e, &[7, 8, 9], sampled(40, 3))
        };
        for policy in [InFlightPolicy::Finish, InFlightPolicy::Requeue] {
            let config = EngineConfig {
                on_weight_sync: policy,
                ..EngineConfig::default()
            };
            let e = engine(kind, &base, &device, config);
            assert_eq!(e.weight_version(), WeightVersion(0));
            let old = run(&e, &[7, 8, 9], sampled(40, 3));
            // Long enough to be still running when the sync lands (converting the weights
            // takes longer than 40 tiny-model steps; the CPU decoder, the fastest, once
            // finished 200 first with the other tests of this file running beside it on two
            // cores, so it runs to near the fixture's 512 positions); a seeded request's first
            // 40 tokens are those of the 40-token one.
            let long = if kind == DecoderKind::Cpu { 500 } else { 200 };
            let mut in_flight = e
                .submit(GenerationRequest::new(vec![7, 8, 9], sampled(long, 3)))
                .unwrap();
            // Make sure it has started before the sync.
            match in_flight.next_event_blocking() {
                Some(GenerationEvent::Token(_)) => {}
                other => panic!("{kind:?}: expected a token, got {other:?}"),
            }
            let v = e.sync_weights_blocking(&tuned).unwrap();
            assert_eq!(v, WeightVersion(1));
            assert_eq!(e.weight_version(), WeightVersion(1));
            let g = in_flight.wait().unwrap();
            let first = &g.token_ids[..40.min(g.token_ids.len())];
            match policy {
                InFlightPolicy::Finish => {
                    assert_eq!(g.weight_version, WeightVersion(0), "{kind:?}");
                    assert_eq!(first, old.token_ids, "{kind:?}");
                }
                InFlightPolicy::Requeue => {
                    assert_eq!(g.weight_version, WeightVersion(1), "{kind:?}");
                    assert_eq!(first, expected_new.token_ids, "{kind:?}");
                }
            }
            let after = run(&e, &[7, 8, 9], sampled(40, 3));
            assert_eq!(after.weight_version, WeightVersion(1));
            assert_eq!(after.token_ids, expected_new.token_ids);
        }
    }
}

/// Dense models on the CPU get the fast decoder; Qwen3-MoE gets the device decoder (a paged
/// cache in Burn tensors) and still generates exactly what a full forward's argmax gives.
#[test]
fn decoder_choice_and_the_moe_fallback() {
    let (model, device) = sft();
    assert_eq!(DecoderKind::auto(&model, &device), DecoderKind::Cpu);
    assert_eq!(
        DecoderKind::auto(&model, &device.clone().autodiff()),
        DecoderKind::Cpu
    );

    let moe = CausalLm::init(&support::qwen3_moe_config(), &device).unwrap();
    assert_eq!(DecoderKind::auto(&moe, &device), DecoderKind::Device);
    assert!(
        Engine::with_decoder(
            DecoderKind::Cpu,
            &moe,
            &device,
            EngineConfig::default(),
            None
        )
        .is_err()
    );
    let e = Engine::for_model(&moe, &device, EngineConfig::default(), None).unwrap();
    let prompt = vec![3u32, 14, 15];
    let g = run(&e, &prompt, greedy(5));
    let mut seq = prompt.clone();
    for &t in &g.token_ids {
        let batch = roll_backend_burn::TokenBatch::single(&seq, 97, &device).unwrap();
        let logits: Vec<f32> = moe.forward(&batch).into_data().try_into_vec().unwrap();
        let last = &logits[(seq.len() - 1) * 97..];
        let argmax = (0..97)
            .max_by(|&a, &b| last[a].total_cmp(&last[b]).then(b.cmp(&a)))
            .unwrap();
        assert_eq!(t as usize, argmax);
        seq.push(t);
    }
}

/// A token budget smaller than the decoding batch serves sequences in turn: all finish, each with
/// exactly the tokens it gets alone.
#[test]
fn a_tight_token_budget_serves_every_sequence_in_turn() {
    let (model, device) = sft();
    for kind in decoders() {
        let alone: Vec<_> = {
            let e = engine(kind, &model, &device, EngineConfig::default());
            (0..4u32)
                .map(|i| run(&e, &[60 + i, 61], sampled(10, u64::from(i))))
                .collect()
        };
        let config = EngineConfig {
            max_batch_tokens: 2,
            ..EngineConfig::default()
        };
        let e = engine(kind, &model, &device, config);
        let handles: Vec<_> = (0..4u32)
            .map(|i| {
                e.submit(GenerationRequest::new(
                    vec![60 + i, 61],
                    sampled(10, u64::from(i)),
                ))
                .unwrap()
            })
            .collect();
        for (h, expected) in handles.into_iter().zip(&alone) {
            assert_eq!(h.wait().unwrap().token_ids, expected.token_ids, "{kind:?}");
        }
    }
}

/// Plays `conversations` side by side for `turns` turns on `engine`: each turn's prompt is the
/// previous prompt, the previous answer and two "observation" tokens, as a multi-turn episode
/// builds it. Returns every turn's generation, per conversation.
fn converse(
    engine: &Engine,
    conversations: usize,
    turns: usize,
) -> Vec<Vec<roll_core::policy::Generation>> {
    let mut prompts: Vec<Vec<u32>> = (0..conversations as u32)
        .map(|c| vec![20 + c, 21, 22, 23, 24])
        .collect();
    let mut played = vec![Vec::new(); conversations];
    for turn in 0..turns as u32 {
        let handles: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(c, p)| {
                let seed = 1000 * c as u64 + u64::from(turn);
                engine
                    .submit(GenerationRequest::new(p.clone(), sampled(6, seed)))
                    .unwrap()
            })
            .collect();
        for (c, h) in handles.into_iter().enumerate() {
            let g = h.wait().unwrap();
            prompts[c].extend_from_slice(&g.token_ids);
            prompts[c].extend_from_slice(&[40 + turn, 41]);
            played[c].push(g);
        }
    }
    played
}

/// `got` plays as `want` (tokens and log-probs): bit for bit on the decoders whose kernels are row-invariant (the CPU
/// decoder; the recomputing oracle), and on the device decoder the same tokens with log-probs
/// within 1e-5 — its Burn GEMMs and reductions may round differently when a prompt is cut into
/// other chunks, or resumed from a cached prefix.
fn assert_same_play(
    kind: DecoderKind,
    got: &[Vec<roll_core::policy::Generation>],
    want: &[Vec<roll_core::policy::Generation>],
    what: &str,
) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
        assert_eq!(g.token_ids, w.token_ids, "{kind:?} {what}");
        if kind != DecoderKind::Device {
            assert_eq!(g.logprobs, w.logprobs, "{kind:?} {what}");
            continue;
        }
        let gap = g
            .logprobs
            .iter()
            .zip(&w.logprobs)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(gap <= 1e-5, "{kind:?} {what}: log-prob gap {gap}");
    }
}

/// Prefix caching across turns: a conversation's next turn takes over the cache entry its last
/// turn left and prefills only the new tokens — with exactly the tokens and log-probs a cold
/// prefill gives (see [`assert_same_play`]), when entries have to be evicted for room, and not
/// across a weight sync.
#[test]
fn multi_turn_prompts_reuse_their_cached_prefix_bit_for_bit() {
    let (model, device) = sft();
    let without = EngineConfig {
        prefix_cache: false,
        ..EngineConfig::default()
    };
    // Tight budgets: prompt chunks share steps with decodes.
    let with = EngineConfig {
        max_batch_tokens: 7,
        ..EngineConfig::default()
    };
    // Room for two conversations' reservations only: parked entries must be evicted.
    let cramped = EngineConfig {
        max_seqs: 3,
        max_cached_tokens: 90,
        ..EngineConfig::default()
    };
    for kind in decoders() {
        let cold = engine(kind, &model, &device, without.clone());
        let expected = converse(&cold, 3, 4);
        assert_eq!(cold.stats().reused_prompt_tokens, 0, "{kind:?}");

        let warm = engine(kind, &model, &device, with.clone());
        assert_same_play(kind, &converse(&warm, 3, 4), &expected, "warm");
        // Every turn after the first reuses all its previous turn had cached: the previous
        // prompt and answer but the answer's last token, which was sampled, never fed.
        let reusable: u64 = expected
            .iter()
            .flat_map(|turns| {
                turns[..turns.len() - 1].iter().scan(5u64, |prompt, g| {
                    let cached = *prompt + g.token_ids.len() as u64 - 1;
                    *prompt += g.token_ids.len() as u64 + 2;
                    Some(cached)
                })
            })
            .sum();
        let (cold_stats, warm_stats) = (cold.stats(), warm.stats());
        assert_eq!(warm_stats.reused_prompt_tokens, reusable, "{kind:?}");
        assert_eq!(
            cold_stats.prefill_tokens - warm_stats.prefill_tokens,
            reusable,
            "{kind:?}: reused tokens are not computed again"
        );
        // A prompt equal to a parked entry's tokens still feeds its last token; one that shares
        // only part of an entry (history rewritten after 8 tokens) reuses those 8 and
        // recomputes the rest.
        let last_turn = &expected[0][3];
        let mut parked: Vec<u32> = vec![20, 21, 22, 23, 24];
        for (turn, g) in expected[0][..3].iter().enumerate() {
            parked.extend_from_slice(&g.token_ids);
            parked.extend_from_slice(&[40 + turn as u32, 41]);
        }
        parked.extend_from_slice(&last_turn.token_ids[..last_turn.token_ids.len() - 1]);
        for (prompt, reuses) in [
            (parked.clone(), parked.len() as u64 - 1),
            ([&parked[..8], &[77, 78]].concat(), 8),
        ] {
            let before = warm.stats().reused_prompt_tokens;
            let g = run(&warm, &prompt, sampled(6, 5));
            assert_eq!(
                warm.stats().reused_prompt_tokens - before,
                reuses,
                "{kind:?}"
            );
            assert_same_play(
                kind,
                &[vec![g]],
                &[vec![run(&cold, &prompt, sampled(6, 5))]],
                "",
            );
        }

        let small = engine(kind, &model, &device, cramped.clone());
        assert_same_play(kind, &converse(&small, 3, 4), &expected, "under eviction");
        let reused = small.stats().reused_prompt_tokens;
        assert!(
            reused > 0 && reused < reusable,
            "{kind:?}: a cramped engine reuses some prefixes, not all ({reused} of {reusable})"
        );

        // A weight sync forgets the parked prefixes: the next turn is computed by the new
        // weights from its first token, as a cold engine does.
        let base = load_model(fixture("tiny-qwen2"), &device).unwrap();
        let e = engine(kind, &base, &device, with.clone());
        let first = run(&e, &[20, 21, 22], sampled(6, 9));
        e.sync_weights_blocking(&model).unwrap();
        let mut next = vec![20, 21, 22];
        next.extend_from_slice(&first.token_ids);
        next.push(40);
        let before = e.stats().reused_prompt_tokens;
        let g = run(&e, &next, sampled(6, 10));
        assert_eq!(e.stats().reused_prompt_tokens, before, "{kind:?}");
        let cold = run(
            &engine(kind, &model, &device, without.clone()),
            &next,
            sampled(6, 10),
        );
        assert_same_play(kind, &[vec![g]], &[vec![cold]], "after a sync");
    }
}

/// Prompts admitted in one step that open with the same tokens — the samples of one prompt, as
/// GRPO asks for them, and prompts sharing a system prompt — compute the shared tokens once on
/// the CPU decoder: each continues the first one's keys and values, and samples exactly the
/// tokens and log-probs it samples alone. The other decoders compute every prompt whole.
#[test]
fn prompts_admitted_together_compute_their_shared_opening_once_bit_for_bit() {
    let (model, device) = sft();
    let group: Vec<u32> = (20..29).collect();
    let mut prompts = vec![group.clone(); 4];
    prompts.push([&group[..5], &[60, 61]].concat());
    prompts.push([&group[..5], &[70]].concat());
    prompts.push(vec![90, 91, 92]);
    let params = |i: usize| sampled(40, 300 + i as u64);
    let needs: Vec<usize> = prompts.iter().map(|p| p.len() + 40).collect();
    let total: usize = needs.iter().sum();
    let smallest = needs.iter().copied().min().unwrap();
    // The first group sample computes the 9 tokens; the three others continue its first 8, the
    // next two prompts its first 5.
    let shared = 3 * 8 + 2 * 5;
    for kind in decoders() {
        let alone = each_alone(kind, &model, &device, &prompts, params);
        // Room for every prompt at once, or for a blocker that leaves none: the prompts queue
        // behind it and are admitted together when it is aborted.
        let config = EngineConfig {
            max_cached_tokens: total,
            ..EngineConfig::default()
        };
        let e = engine(kind, &model, &device, config);
        let rt = current_thread();
        rt.block_on(async {
            let blocker_params = sampled((total - smallest - 1) as u32, 9);
            let mut blocker = e
                .submit(GenerationRequest::new(vec![5, 6], blocker_params))
                .unwrap();
            assert!(matches!(
                blocker.next_event().await,
                Some(GenerationEvent::Token(_))
            ));
            let handles: Vec<_> = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    e.submit(GenerationRequest::new(p.clone(), params(i)))
                        .unwrap()
                })
                .collect();
            blocker.abort();
            let cut = blocker.finish().await.unwrap();
            assert_eq!(cut.finish_reason, FinishReason::Abort, "{kind:?}");
            for (i, handle) in handles.into_iter().enumerate() {
                let g = handle.finish().await.unwrap();
                assert_eq!(g.token_ids, alone[i].token_ids, "{kind:?} request {i}");
                assert_eq!(g.logprobs, alone[i].logprobs, "{kind:?} request {i}");
            }
        });
        let stats = e.stats();
        let want = if kind == DecoderKind::Cpu { shared } else { 0 };
        assert_eq!(stats.reused_prompt_tokens, want as u64, "{kind:?}");
        let prompt_tokens: usize = prompts.iter().map(Vec::len).sum::<usize>() + 2;
        assert_eq!(
            stats.prefill_tokens,
            (prompt_tokens - want) as u64,
            "{kind:?}: shared tokens are not computed"
        );
    }
}

/// Samples of one prompt that arrive while the first is already decoding start from a copy of
/// its cached prompt on the CPU decoder (all but their last prompt token), with exactly the
/// tokens and log-probs each samples alone.
#[test]
fn later_samples_of_a_prompt_copy_its_cached_prefix_bit_for_bit() {
    let (model, device) = sft();
    let prompt: Vec<u32> = (30..41).collect();
    let params = |i: usize| sampled(if i == 0 { 200 } else { 12 }, 500 + i as u64);
    for kind in decoders() {
        let alone = each_alone(kind, &model, &device, &vec![prompt.clone(); 4], params);
        let e = engine(kind, &model, &device, EngineConfig::default());
        let rt = current_thread();
        rt.block_on(async {
            let mut first = e
                .submit(GenerationRequest::new(prompt.clone(), params(0)))
                .unwrap();
            let mut streamed = Vec::new();
            if let Some(GenerationEvent::Token(t)) = first.next_event().await {
                streamed.push(t);
            }
            assert_eq!(streamed.len(), 1, "{kind:?}: the first sample decodes");
            let later: Vec<_> = (1..4)
                .map(|i| {
                    e.submit(GenerationRequest::new(prompt.clone(), params(i)))
                        .unwrap()
                })
                .collect();
            for (i, handle) in later.into_iter().enumerate() {
                let g = handle.finish().await.unwrap();
                assert_eq!(
                    g.token_ids,
                    alone[i + 1].token_ids,
                    "{kind:?} sample {}",
                    i + 1
                );
                assert_eq!(
                    g.logprobs,
                    alone[i + 1].logprobs,
                    "{kind:?} sample {}",
                    i + 1
                );
            }
            let g = first.finish().await.unwrap();
            assert_eq!(g.token_ids, alone[0].token_ids, "{kind:?}");
            assert_eq!(g.logprobs, alone[0].logprobs, "{kind:?}");
        });
        let want = if kind == DecoderKind::Cpu { 3 * 10 } else { 0 };
        assert_eq!(e.stats().reused_prompt_tokens, want, "{kind:?}");
    }
}
