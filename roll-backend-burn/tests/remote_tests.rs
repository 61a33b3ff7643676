//! Disaggregated rollout on threads: rank 0 trains (a `BurnPolicy`), the other ranks generate
//! (`RolloutServer`), linked by roll-core's in-process `Messenger`. The same code runs across
//! processes over MPI (`tests/mpi.rs` at the workspace root).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use roll_backend_burn::engine::EngineConfig;
use roll_backend_burn::remote::{Disaggregated, RemoteRollout, RolloutServer, Served};
use roll_backend_burn::train::TrainerConfig;
use roll_backend_burn::{BurnPolicy, Device, HfTokenizer, PolicyOptions, load_model};
use roll_core::policy::{
    Generate, Generation, GenerationRequest, Objective, SamplingParams, Train,
};
use roll_core::strategy::{DeviceSpec, LocalGroup, LocalReplica, Messenger, Strategy};
use roll_core::{
    AbortHandle, FinishReason, SampleId, Tokenizer, TrainBatch, TrainSequence, WeightVersion,
};
use std::sync::Arc;
use std::thread::ScopedJoinHandle;
use support::fixture;

const MODEL: &str = "tiny-qwen2-sft";

fn tokenizer() -> Arc<dyn Tokenizer> {
    Arc::new(HfTokenizer::from_dir(fixture(MODEL)).unwrap())
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn actor() -> BurnPolicy {
    let model = load_model(fixture(MODEL), &Device::flex()).unwrap();
    let trainer = TrainerConfig {
        lr: 1e-3,
        ..TrainerConfig::default()
    };
    BurnPolicy::new(model, tokenizer(), trainer, PolicyOptions::default()).unwrap()
}

fn server() -> RolloutServer {
    let template = load_model(fixture(MODEL), &Device::flex()).unwrap();
    RolloutServer::new(
        template,
        Some(tokenizer()),
        EngineConfig::default(),
        Device::flex(),
    )
}

fn sampled(seed: u64, max_new_tokens: u32) -> SamplingParams {
    SamplingParams {
        max_new_tokens,
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

/// `ranks` ranks on threads: rank 0 runs `controller`, the others serve it until it drops its
/// link. Returns the controller's result and what each rollout rank served.
fn job<T: Send>(
    ranks: usize,
    controller: impl FnOnce(Arc<dyn Messenger>) -> T + Send,
) -> (T, Vec<roll_backend_burn::Result<Served>>) {
    let mut links: Vec<LocalReplica> = LocalGroup::replicas(vec![DeviceSpec::Cpu; ranks]).unwrap();
    let link0: Arc<dyn Messenger> = Arc::new(links.remove(0));
    std::thread::scope(|s| {
        let servers: Vec<ScopedJoinHandle<_>> = links
            .into_iter()
            .map(|link| s.spawn(move || server().serve(&link, 0)))
            .collect();
        let out = controller(link0);
        (
            out,
            servers.into_iter().map(|h| h.join().unwrap()).collect(),
        )
    })
}

/// Every prompt generated at once (seeded by its index), results in prompt order.
async fn generate_all(g: Arc<dyn Generate>, prompts: &[Vec<u32>], tokens: u32) -> Vec<Generation> {
    let tasks: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (g, request) = (
                g.clone(),
                GenerationRequest::new(p.clone(), sampled(i as u64, tokens)),
            );
            tokio::spawn(async move { g.generate(request).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap().unwrap());
    }
    out
}

fn prompts() -> Vec<Vec<u32>> {
    (0..6u32)
        .map(|i| vec![10 + i, 11, 12 + 2 * i, 13])
        .collect()
}

/// A batch that rewards exactly the generated tokens.
fn reinforce(prompt: &[u32], g: &Generation) -> TrainBatch {
    let n = g.token_ids.len();
    TrainBatch::new(vec![TrainSequence {
        sample: SampleId(0),
        prompt_ids: prompt.to_vec(),
        response_ids: g.token_ids.clone(),
        loss_mask: vec![true; n],
        old_logprobs: g.logprobs.clone(),
        rollout_logprobs: g.logprobs.clone(),
        ref_logprobs: None,
        advantages: vec![1.0; n],
        returns: None,
        old_values: None,
        weight: 1.0,
        score: 1.0,
    }])
    .unwrap()
}

#[test]
fn rollout_ranks_generate_what_the_actor_would_and_follow_its_weight_version() {
    let actor = actor();
    let prompts = prompts();
    let ((local, remote, after), served) = job(3, |link| {
        let disaggregated = Disaggregated::connect(actor.clone(), link, vec![1, 2]).unwrap();
        let (local_side, remote_side): (Arc<dyn Generate>, Arc<dyn Generate>) =
            (Arc::new(actor.clone()), Arc::new(disaggregated.clone()));
        rt().block_on(async {
            assert_eq!(disaggregated.weight_version(), WeightVersion(0));
            let local = generate_all(local_side.clone(), &prompts, 8).await;
            let remote = generate_all(remote_side.clone(), &prompts, 8).await;
            let mut after = Vec::new();
            for step in 1..=2u64 {
                let out = disaggregated
                    .train_step(reinforce(&prompts[0], &remote[0]), &Objective::default())
                    .await
                    .unwrap();
                assert_eq!(out.weight_version, WeightVersion(step));
                assert_eq!(disaggregated.weight_version(), WeightVersion(step));
                assert!(out.metrics["rollout_weight_sync_s"] >= 0.0);
                // After the step the rollout ranks generate what the trained actor does.
                let want = generate_all(local_side.clone(), &prompts, 8).await;
                let got = generate_all(remote_side.clone(), &prompts, 8).await;
                after.push((want, got));
            }
            (local, remote, after)
        })
    });
    assert_eq!(
        remote, local,
        "same weights, same seeds: the same tokens and log-probs"
    );
    assert!(remote.iter().all(|g| g.weight_version == WeightVersion(0)));
    for (step, (want, got)) in after.iter().enumerate() {
        assert_eq!(got, want, "step {}", step + 1);
        assert!(
            got.iter()
                .all(|g| g.weight_version == WeightVersion(step as u64 + 1))
        );
    }
    assert_ne!(
        after[0].0, local,
        "the steps changed what the actor generates"
    );
    let served: Vec<Served> = served.into_iter().map(Result::unwrap).collect();
    // Both ranks took requests (the least busy gets the next), and each saw all 3 weights.
    assert_eq!(served.iter().map(|s| s.requests).sum::<u64>(), 3 * 6);
    assert!(served.iter().all(|s| s.requests > 0), "{served:?}");
    assert!(
        served
            .iter()
            .all(|s| s.weight_syncs == 3 && s.version == WeightVersion(2))
    );
}

#[test]
fn a_refused_request_fails_alone_and_an_abort_reaches_the_rollout_rank() {
    let actor = actor();
    let (outcomes, served) = job(2, |link| {
        let remote =
            RemoteRollout::connect(link, vec![1], &actor.model().unwrap(), WeightVersion(0))
                .unwrap();
        rt().block_on(async {
            let bad = remote
                .generate(GenerationRequest::new(vec![10, 999_999], sampled(1, 4)))
                .await
                .unwrap_err()
                .to_string();
            // Aborted before it is sent: the abort travels in the same round as the request.
            let (handle, signal) = AbortHandle::new();
            handle.abort();
            let long = GenerationRequest {
                abort: signal,
                ..GenerationRequest::new(vec![10, 11], sampled(2, 500))
            };
            let aborted = remote.generate(long).await.unwrap();
            let fine = remote
                .generate(GenerationRequest::new(vec![10, 11], sampled(3, 4)))
                .await
                .unwrap();
            (bad, aborted, fine)
        })
    });
    let (bad, aborted, fine) = outcomes;
    assert!(
        bad.contains("rollout rank 1") && bad.contains("999999"),
        "the error names the rank and the token: {bad}"
    );
    assert_eq!(aborted.finish_reason, FinishReason::Abort);
    assert!(aborted.token_ids.len() < 500);
    assert_eq!(fine.token_ids.len(), 4);
    assert_eq!(served[0].as_ref().unwrap().requests, 3);
}

#[test]
fn a_failed_rollout_rank_fails_the_requests_with_its_rank_not_a_hang() {
    let actor = actor();
    let model = actor.model().unwrap();
    let mut links = LocalGroup::replicas(vec![DeviceSpec::Cpu; 2]).unwrap();
    let rollout = links.remove(1);
    let link0: Arc<dyn Messenger> = Arc::new(links.remove(0));
    let err = std::thread::scope(|s| {
        s.spawn(move || {
            // Serves the first weights, then dies.
            let _first = rollout.receive(0, std::time::Duration::from_secs(60));
            rollout.abort("rank 1 (rollout): out of memory");
        });
        RemoteRollout::connect(link0, vec![1], &model, WeightVersion(0)).unwrap_err()
    });
    let err = err.to_string();
    assert!(
        err.contains("out of memory") && err.contains("replica 1 of 2"),
        "{err}"
    );
}

#[test]
fn rollout_ranks_divide_the_experts_only_in_whole_groups_of_a_mixture() {
    let links = LocalGroup::replicas(vec![DeviceSpec::Cpu; 4]).unwrap();
    let link: Arc<dyn Messenger> = Arc::new(links[0].clone());
    let dense = actor().model().unwrap();
    let connect = |ranks: Vec<usize>, experts| {
        RemoteRollout::connect_with_experts(link.clone(), ranks, experts, &dense, WeightVersion(0))
            .unwrap_err()
            .to_string()
    };
    let err = connect(vec![1, 2, 3], 2);
    assert!(
        err.contains("3 rollout ranks do not form groups of 2"),
        "{err}"
    );
    let err = connect(vec![1, 2], 0);
    assert!(err.contains("groups of 0"), "{err}");
    let err = connect(vec![1, 2], 2);
    assert!(err.contains("this model is dense"), "{err}");
}

#[test]
fn a_controller_cannot_be_its_own_rollout_rank() {
    let links = LocalGroup::replicas(vec![DeviceSpec::Cpu; 2]).unwrap();
    let link: Arc<dyn Messenger> = Arc::new(links[0].clone());
    let model = actor().model().unwrap();
    for ranks in [vec![], vec![0], vec![1, 1], vec![2]] {
        let err = RemoteRollout::connect(link.clone(), ranks, &model, WeightVersion(0))
            .unwrap_err()
            .to_string();
        assert!(err.contains("other than this rank (0)"), "{err}");
    }
    assert_eq!(links[1].rank(), 1);
}
