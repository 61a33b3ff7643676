//! A run across ranks, on threads: rank 0 runs the RLVR pipeline and leads, the other ranks
//! `follow`. Colocated, rank 1 is a second data-parallel replica of the actor's trainer;
//! disaggregated (`rollout.ranks`), ranks 1 and 2 only generate and rank 0 trains. Either way
//! it trains as the same run in one process (the same rollouts, so the same steps), the
//! followers are released when the leader's run ends, and a run stopped after a step resumes
//! from its checkpoint on every rank and ends where the uninterrupted run does. With
//! `model.tensor_parallel` or `model.pipeline_parallel` the training ranks hold the actor in
//! parts, and the run still trains as the one in one process.
//! (`roll-mpi`'s tests run the same across processes under `mpirun`.)

use roll::backend::{ExpertSplit, PartKind};
use roll::core::config::ConfigLoader;
use roll::prelude::*;
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{
    even_bytes, first_digit, moe_model_dir, moe_model_dir_with, out_dir, sums, tiny_rlvr_toml,
};

/// The tiny RLVR run, synchronous (so that both runs see the same rollouts), with a learning
/// rate that moves the weights visibly in two steps, and `extra` overrides.
///
/// Rewarded by [`even_bytes`], which about half of the samples collect, so that every step has
/// advantages and trains: under `first_digit` neither the fixture's samples nor a random
/// model's collected anything in these two steps, and every run compared two sets of weights
/// that no gradient had moved. AdamW's ε is 1e-5 rather than 1e-8: the update `m/(√v + ε)` of a
/// gradient that cancels to almost nothing turns the rounding of a sum taken in another order
/// (another layout of the model across ranks) into a visible part of the step. Measured (lr
/// 1e-3, each step moving the weights by ~1e-3): the largest difference of a run from the
/// one-process run is up to 1e-4 at ε = 1e-8 (tensor parallelism of the fixture), 2.7e-6–1.1e-5
/// for the mixtures of experts (1.9–4.2e-6 at 1e-6); at 1e-5 every run is within 1.4e-6, so the
/// bar of 1e-5 tells a wrong layout from rounding with room to spare.
fn config(out: &std::path::Path, extra: &[&str]) -> Config {
    ConfigLoader::new()
        .toml_str(tiny_rlvr_toml(out))
        .overrides(["rollout.max_staleness=0", "train.learning_rate=1e-3"])
        .overrides([
            "domains.arithmetic.reward.kind=even_bytes",
            "train.optimizer.kind=adam_w",
            "train.optimizer.eps=1e-5",
        ])
        .overrides(extra.iter().copied())
        .load()
        .expect("config")
}

/// `config` run across `ranks` ranks on threads: the leader's step reports and final weights,
/// and what each follower did (each must be released when the leader's run ends).
async fn led_run(
    config: Config,
    ranks: usize,
) -> (Vec<StepReport>, roll::backend::CausalLm, Vec<Followed>) {
    let (summary, model, served) = led_run_of(build(config.clone()), config, ranks).await;
    (summary.rl, model, served)
}

/// [`led_run`] of the run `builder` builds from `config`: the leader's summary, final weights
/// and what each follower did.
async fn led_run_of(
    builder: RunBuilder,
    config: Config,
    ranks: usize,
) -> (RunSummary, roll::backend::CausalLm, Vec<Followed>) {
    let mut links = LocalGroup::replicas(vec![DeviceSpec::Cpu; ranks]).expect("group");
    let leader: Arc<dyn Messenger> = Arc::new(links.remove(0));
    let (served_tx, served_rx) = std::sync::mpsc::channel();
    for link in links {
        let (follower_config, served_tx) = (config.clone(), served_tx.clone());
        std::thread::spawn(move || {
            let rank = link.rank();
            let _ = served_tx.send((rank, follow(&follower_config, Arc::new(link))));
        });
    }
    let mut led = builder.lead(leader).build().expect("build");
    let summary = led.train().await.expect("train");
    let model = led.actor().model().expect("model");
    drop(led);
    let mut served: Vec<(usize, Followed)> = (1..ranks)
        .map(|_| {
            let (rank, followed) = served_rx
                .recv_timeout(Duration::from_secs(120))
                .expect("the followers were released when the leader's run ended");
            (rank, followed.expect("the follower served"))
        })
        .collect();
    served.sort_by_key(|(rank, _)| *rank);
    (summary, model, served.into_iter().map(|(_, f)| f).collect())
}

/// Tensor parallelism with a mixture's experts (if any) sliced.
const SLICED: PartKind = PartKind::Tensor {
    experts: ExpertSplit::Sliced,
};

fn trained(steps: usize) -> Vec<Followed> {
    vec![Followed::Trained {
        steps,
        part: None,
        engine: None,
    }]
}

/// The run in one process, on `out_dir(name)`: that directory, its step reports and final
/// weights — what every run across ranks is compared with.
async fn alone_run(name: &str) -> (std::path::PathBuf, Vec<StepReport>, roll::backend::CausalLm) {
    let out = out_dir(name);
    let mut alone = build(config(&out, &[])).build().expect("build");
    let reports = alone.train().await.expect("train").rl;
    assert_trains(&reports);
    let model = alone.actor().model().expect("model");
    (out, reports, model)
}

/// The tiny run (`extra` overrides) of the random mixture of experts in `model`.
fn moe_config(model: &std::path::Path, out: &std::path::Path, extra: &[&str]) -> Config {
    let source = format!("model.source.path={}", model.display());
    config(out, &[&[source.as_str()], extra].concat())
}

/// Asserts that every step of a run changed the weights: a gradient, from samples whose rewards
/// differ. (A run that must train as another then checks training, not two steps that did
/// nothing.)
fn assert_trains(reports: &[StepReport]) {
    for (step, r) in reports.iter().enumerate() {
        let norm = r.metrics["actor/grad_norm"];
        assert!(norm > 0.0, "step {}: no gradient ({norm})", step + 1);
    }
}

/// The run `make` configures (with `extra`) on `ranks` ranks in `out`, stopped after its first
/// step (a checkpoint) and resumed from it: how many parts the checkpoint holds (one per rank of
/// the first copy of a model held in parts), the resumed run's final weights, and what its
/// followers did.
async fn stopped_and_resumed(
    out: &std::path::Path,
    ranks: usize,
    extra: &[&str],
    make: impl Fn(&std::path::Path, &[&str]) -> Config,
) -> (usize, roll::backend::CausalLm, Vec<Followed>) {
    let first = make(
        out,
        &[extra, &["run.save_every=1", "run.max_steps=1"]].concat(),
    );
    led_run(first, ranks).await;
    let actor = out.join("checkpoints/rl-00000001/actor");
    let parts = (0..)
        .take_while(|i| actor.join(format!("part-{i}")).is_dir())
        .count();
    let rest = make(
        out,
        &[extra, &["run.save_every=1", "run.resume=true"]].concat(),
    );
    let (_, resumed, served) = led_run(rest, ranks).await;
    (parts, resumed, served)
}

/// Each step of `runs` drew the samples of the same step in `alone` and matches it on `keys`.
fn same_steps(alone: &[StepReport], runs: &[StepReport], keys: &[&str]) {
    assert_eq!(runs.len(), alone.len());
    for (step, (a, b)) in alone.iter().zip(runs).enumerate() {
        assert_eq!(a.samples, b.samples, "step {}", step + 1);
        for &key in keys {
            assert_eq!(a.metrics[key], b.metrics[key], "step {}: {key}", step + 1);
        }
    }
}

fn build(config: Config) -> RunBuilder {
    RunBuilder::new(config)
        .reward("first_digit", first_digit)
        .reward("even_bytes", even_bytes)
        .prompts(sums())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_led_across_two_ranks_trains_as_one_process() {
    let (alone_out, alone_reports, alone_model) = alone_run("distributed-alone").await;

    let led_out = out_dir("distributed-led");
    let (led_reports, led_model, served) = led_run(config(&led_out, &[]), 2).await;
    assert_eq!(served, trained(2));
    same_steps(
        &alone_reports,
        &led_reports,
        &["actor/trained_tokens", "actor/sequences"],
    );
    for b in &led_reports {
        let gap = b.metrics["actor/train_infer_logprob_gap"];
        assert_eq!(gap, 0.0, "the leader's replica serves the engine's bits");
    }
    let worst = max_param_diff(&alone_model, &led_model);
    assert!(
        worst <= 1e-5,
        "the led run differs from one process by {worst}"
    );
    // Stopped after its first step and resumed: every rank starts from the checkpoint, and the
    // run ends where the uninterrupted one did.
    let resumed_out = out_dir("distributed-resumed");
    let first = config(&resumed_out, &["run.save_every=1", "run.max_steps=1"]);
    let (_, _, served) = led_run(first, 2).await;
    assert_eq!(served, trained(1));
    let rest = config(&resumed_out, &["run.save_every=1", "run.resume=true"]);
    let (reports, resumed_model, served) = led_run(rest, 2).await;
    // The summary covers the whole run; the follower trained only the step that was left.
    assert_eq!((served, reports.len()), (trained(1), 2));
    let worst = max_param_diff(&alone_model, &resumed_model);
    assert!(
        worst <= 1e-5,
        "the resumed run differs from the uninterrupted one by {worst}"
    );
    for dir in [alone_out, led_out, resumed_out] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disaggregated_run_trains_as_one_process_and_its_rollout_ranks_follow_the_weights() {
    let (alone_out, alone_reports, alone_model) = alone_run("disaggregated-alone").await;

    // Rank 0 trains, ranks 1 and 2 generate.
    let out = out_dir("disaggregated");
    let (reports, model, served) = led_run(config(&out, &["rollout.ranks=2"]), 3).await;
    same_steps(
        &alone_reports,
        &reports,
        &["actor/trained_tokens", "actor/sequences", "reward/mean"],
    );
    for b in &reports {
        assert!(b.metrics["actor/rollout_weight_sync_s"] >= 0.0);
        assert_eq!(b.metrics["actor/train_infer_logprob_gap"], 0.0);
    }
    let worst = max_param_diff(&alone_model, &model);
    assert!(worst <= 1e-5, "the disaggregated run differs by {worst}");
    // Each rollout rank started on version 0 and was sent each step's weights.
    two_rollout_ranks_followed(&served, 1);

    // Two trainers (a data-parallel sub-group of the job) and two rollout ranks.
    let both_out = out_dir("disaggregated-both");
    let (reports, model, served) = led_run(config(&both_out, &["rollout.ranks=2"]), 4).await;
    same_steps(&alone_reports, &reports, &["actor/trained_tokens"]);
    let worst = max_param_diff(&alone_model, &model);
    assert!(
        worst <= 1e-5,
        "2 trainers + 2 rollout ranks differ by {worst}"
    );
    assert_eq!(
        served[0],
        Followed::Trained {
            steps: 2,
            part: None,
            engine: None,
        }
    );
    assert!(matches!(
        served[1..],
        [Followed::Generated(_), Followed::Generated(_)]
    ));

    // Stopped after its first step and resumed: the rollout ranks start on the checkpoint's
    // weights (version 1), and the run ends where the uninterrupted one did.
    let resumed_out = out_dir("disaggregated-resumed");
    let extra = ["rollout.ranks=1", "run.save_every=1"];
    let first = config(&resumed_out, &[&extra[..], &["run.max_steps=1"]].concat());
    led_run(first, 2).await;
    let rest = config(&resumed_out, &[&extra[..], &["run.resume=true"]].concat());
    let (_, resumed_model, served) = led_run(rest, 2).await;
    let Followed::Generated(s) = served[0] else {
        panic!("rank 1 trained: {served:?}");
    };
    assert_eq!((s.weight_syncs, s.version), (2, WeightVersion(2)));
    let worst = max_param_diff(&alone_model, &resumed_model);
    assert!(worst <= 1e-5, "the resumed run differs by {worst}");
    for dir in [alone_out, out, both_out, resumed_out] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_whose_ranks_hold_parts_of_the_actor_train_as_one_process() {
    let (alone_out, alone_reports, alone_model) = alone_run("parts-alone").await;
    let mut outs = vec![alone_out];
    // Two ranks holding slices of every layer; two pipeline stages; two stages of two slices
    // each; and two copies of two slices each, trained data-parallel, beside a rollout rank.
    let cases: [(&str, &[&str], usize, PartKind); 4] = [
        ("parts-tensor", &["model.tensor_parallel=2"], 2, SLICED),
        (
            "parts-pipeline",
            &["model.pipeline_parallel=2"],
            2,
            PartKind::Pipeline,
        ),
        (
            "parts-tensor-pipeline",
            &["model.tensor_parallel=2", "model.pipeline_parallel=2"],
            4,
            PartKind::TensorPipeline {
                tensor: 2,
                experts: ExpertSplit::Sliced,
            },
        ),
        (
            "parts-tensor-data",
            &["model.tensor_parallel=2", "rollout.ranks=1"],
            5,
            SLICED,
        ),
    ];
    for (name, extra, ranks, kind) in cases {
        let out = out_dir(name);
        let (reports, model, served) = led_run(config(&out, extra), ranks).await;
        outs.push(out);
        same_steps(
            &alone_reports,
            &reports,
            &["actor/trained_tokens", "actor/sequences"],
        );
        for b in &reports {
            let gap = b.metrics["actor/train_infer_logprob_gap"];
            assert_eq!(gap, 0.0, "{name}: the engine serves the gathered model");
        }
        let worst = max_param_diff(&alone_model, &model);
        assert!(worst <= 1e-5, "{name} differs from one process by {worst}");
        if ranks != 5 {
            // Stopped after its first step and resumed: every rank reads its part of the
            // checkpoint, and the run ends where the uninterrupted one did.
            let out = out_dir(&format!("{name}-resumed"));
            let (_, resumed, served) = stopped_and_resumed(&out, ranks, extra, config).await;
            outs.push(out);
            let expected = Followed::Trained {
                steps: 1,
                part: Some(kind),
                engine: None,
            };
            assert_eq!(
                served,
                vec![expected; ranks - 1],
                "{name}: the followers trained the step left"
            );
            let worst = max_param_diff(&alone_model, &resumed);
            assert!(worst <= 1e-5, "{name} resumed differs by {worst}");
        }
        let trainers = served
            .iter()
            .filter(|f| {
                **f == Followed::Trained {
                    steps: 2,
                    part: Some(kind),
                    engine: None,
                }
            })
            .count();
        assert_eq!(
            trainers,
            ranks - 1 - usize::from(ranks == 5),
            "{name}: {served:?}"
        );
    }
    for dir in outs {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelines_whose_stages_divide_their_experts_train_as_one_process() {
    // `model.pipeline_parallel = 2` with `model.expert_parallel = 2`: two pipelines of two stages
    // (ranks 0 and 2 are pipeline 0, 1 and 3 pipeline 1), each on its own shard of every step,
    // each stage's experts divided between the two pipelines' ranks holding it (a mixture, then
    // a dense layer and a mixture). The same samples and weights as one process; stopped after
    // its first step and resumed from the four parts of its checkpoint, the same again; and two
    // such copies side by side (8 ranks), the experts' gradients summed over the ranks holding
    // the same ones.
    let base = out_dir("staged-moe-model");
    std::fs::create_dir_all(&base).expect("dir");
    let dir = moe_model_dir_with(&base, "model", &[true, false, true]);
    let alone_out = out_dir("staged-moe-alone");
    let mut alone = build(moe_config(&dir, &alone_out, &[]))
        .build()
        .expect("build");
    let alone_reports = alone.train().await.expect("train").rl;
    let alone_model = alone.actor().model().expect("model");
    drop(alone);
    assert_trains(&alone_reports);
    let part = Some(PartKind::PipelineExperts { experts: 2 });
    let overrides = ["model.pipeline_parallel=2", "model.expert_parallel=2"];
    let mut outs = vec![base, alone_out];
    for ranks in [4, 8] {
        let out = out_dir(&format!("staged-moe-{ranks}"));
        let (reports, model, served) = led_run(moe_config(&dir, &out, &overrides), ranks).await;
        outs.push(out);
        same_steps(
            &alone_reports,
            &reports,
            &["actor/trained_tokens", "actor/sequences"],
        );
        let trained = Followed::Trained {
            steps: 2,
            part,
            engine: None,
        };
        assert_eq!(served, vec![trained; ranks - 1]);
        let worst = max_param_diff(&alone_model, &model);
        assert!(
            worst <= 1e-5,
            "{ranks} ranks differ from one process by {worst}"
        );
    }
    let out = out_dir("staged-moe-resumed");
    let moe = |out: &std::path::Path, extra: &[&str]| moe_config(&dir, out, extra);
    let (parts, resumed, served) = stopped_and_resumed(&out, 4, &overrides, moe).await;
    outs.push(out);
    assert_eq!(parts, 4, "every rank wrote its part");
    assert_eq!(
        served,
        [Followed::Trained {
            steps: 1,
            part,
            engine: None,
        }; 3]
    );
    let worst = max_param_diff(&alone_model, &resumed);
    assert!(worst <= 1e-5, "resumed differs from one process by {worst}");
    for out in outs {
        let _ = std::fs::remove_dir_all(out);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixture_of_experts_trains_with_its_experts_divided_among_the_ranks() {
    // The same run of a mixture of experts in one process, and over two ranks: holding half the
    // heads each and half the experts (`model.expert_parallel = 2`) or half of every expert; or,
    // without tensor parallelism, half the experts each and their own tokens, which travel to
    // their experts and back (`model.expert_parallel = 2` alone); or in two pipeline stages (the
    // dense layer, the mixture), and in two stages of two ranks holding half the heads and half
    // the experts each: all three at once.
    let base = out_dir("moe-model");
    std::fs::create_dir_all(&base).expect("dir");
    let dir = moe_model_dir(&base);
    let alone_out = out_dir("moe-alone");
    let mut alone = build(moe_config(&dir, &alone_out, &[]))
        .build()
        .expect("build");
    let alone_reports = alone.train().await.expect("train").rl;
    assert_trains(&alone_reports);
    let alone_model = alone.actor().model().expect("model");
    drop(alone);
    let mut outs = vec![base, alone_out];
    let tensor = |experts| PartKind::Tensor { experts };
    for (name, extra, part, ranks) in [
        (
            "moe-experts-whole",
            &["model.tensor_parallel=2", "model.expert_parallel=2"][..],
            tensor(ExpertSplit::Whole),
            2,
        ),
        (
            "moe-experts-sliced",
            &["model.tensor_parallel=2"][..],
            tensor(ExpertSplit::Sliced),
            2,
        ),
        (
            "moe-experts-across",
            &["model.expert_parallel=2"][..],
            PartKind::Experts,
            2,
        ),
        (
            "moe-stages",
            &["model.pipeline_parallel=2"][..],
            PartKind::Pipeline,
            2,
        ),
        (
            "moe-stages-of-experts",
            &[
                "model.tensor_parallel=2",
                "model.pipeline_parallel=2",
                "model.expert_parallel=2",
            ][..],
            PartKind::TensorPipeline {
                tensor: 2,
                experts: ExpertSplit::Whole,
            },
            4,
        ),
    ] {
        let out = out_dir(name);
        let (reports, model, served) = led_run(moe_config(&dir, &out, extra), ranks).await;
        outs.push(out);
        same_steps(
            &alone_reports,
            &reports,
            &["actor/trained_tokens", "actor/sequences"],
        );
        let part = Some(part);
        let trained = Followed::Trained {
            steps: 2,
            part,
            engine: None,
        };
        assert_eq!(served, vec![trained; ranks - 1], "{name}");
        let worst = max_param_diff(&alone_model, &model);
        assert!(worst <= 1e-5, "{name} differs from one process by {worst}");
        if name == "moe-experts-across" {
            // Stopped after its first step and resumed: each rank writes its experts (and its
            // optimiser state) to its part of the checkpoint and reads it back.
            let out = out_dir(&format!("{name}-resumed"));
            let moe = |out: &std::path::Path, extra: &[&str]| moe_config(&dir, out, extra);
            let (parts, resumed, served) = stopped_and_resumed(&out, 2, extra, moe).await;
            outs.push(out);
            assert_eq!(parts, 2, "{name}: every rank wrote its part");
            assert_eq!(
                served,
                [Followed::Trained {
                    steps: 1,
                    part,
                    engine: None,
                }],
                "{name}"
            );
            let worst = max_param_diff(&alone_model, &resumed);
            assert!(worst <= 1e-5, "{name} resumed differs by {worst}");
        }
    }
    // The experts divided among two training ranks beside a rollout rank, which generates with
    // the whole model gathered after each step.
    let out = out_dir("moe-experts-across-rollout");
    let overrides = ["model.expert_parallel=2", "rollout.ranks=1"];
    let (reports, model, served) = led_run(moe_config(&dir, &out, &overrides), 3).await;
    outs.push(out);
    same_steps(
        &alone_reports,
        &reports,
        &["actor/trained_tokens", "actor/sequences"],
    );
    let trained = Followed::Trained {
        steps: 2,
        part: Some(PartKind::Experts),
        engine: None,
    };
    assert_eq!(served[0], trained, "{served:?}");
    assert!(
        matches!(served[1], Followed::Generated(s) if s.version.0 == 2),
        "{served:?}"
    );
    let worst = max_param_diff(&alone_model, &model);
    assert!(worst <= 1e-5, "beside a rollout rank: differs by {worst}");
    // One trainer, and two rollout ranks holding half the experts each: every request runs on
    // one of them, its mixtures' tokens travel to the other's experts and back, and their
    // engines step together. The same samples, and the same weights, as one process.
    let out = out_dir("moe-rollout-experts");
    let overrides = ["rollout.ranks=2", "rollout.expert_parallel=2"];
    let (reports, model, served) = led_run(moe_config(&dir, &out, &overrides), 3).await;
    outs.push(out);
    same_steps(
        &alone_reports,
        &reports,
        &["actor/trained_tokens", "actor/sequences", "reward/mean"],
    );
    two_rollout_ranks_followed(&served, 2);
    let worst = max_param_diff(&alone_model, &model);
    assert!(
        worst <= 1e-5,
        "experts divided among rollout ranks: differs by {worst}"
    );
    // Asynchronous (generation up to one version ahead of training, over four steps): weight
    // syncs reach the rollout ranks while their requests run, and their engines step over two
    // weight versions at once until the old ones finish.
    let out = out_dir("moe-rollout-experts-async");
    let overrides = [
        &overrides[..],
        &["rollout.max_staleness=1", "run.max_steps=4"],
    ]
    .concat();
    let (reports, _, served) = led_run(moe_config(&dir, &out, &overrides), 3).await;
    outs.push(out);
    assert_eq!(reports.len(), 4);
    let mut one_behind = 0.0;
    for step in &reports {
        assert!(step.metrics["rollout/max_staleness"] <= 1.0, "{step}");
        one_behind += step.metrics["rollout/staleness_1"];
    }
    assert!(one_behind > 0.0, "no sample came from the version before");
    for f in &served {
        let Followed::Generated(s) = f else {
            panic!("a rollout rank trained: {served:?}");
        };
        assert_eq!(
            (s.version, s.expert_parallel),
            (WeightVersion(4), 2),
            "{s:?}"
        );
    }
    // Colocated, the two training ranks generate together (`rollout.expert_parallel = 2`):
    // rank 0's engine takes every request on its own block of the experts, rank 1's serves its
    // block's share of those tokens, and after each step each syncs from its own trainer. The
    // same samples and rewards, and the same weights, as one process; rank 1's engine took part
    // in the steps and followed every weight version.
    let generating = ["model.expert_parallel=2", "rollout.expert_parallel=2"];
    let out = out_dir("moe-experts-generating");
    let (reports, model, served) = led_run(moe_config(&dir, &out, &generating), 2).await;
    outs.push(out);
    same_steps(
        &alone_reports,
        &reports,
        &["actor/trained_tokens", "actor/sequences", "reward/mean"],
    );
    for step in &reports {
        let gap = step.metrics["actor/train_infer_logprob_gap"];
        assert!(
            gap <= 1e-5,
            "the divided engines' log-probs are {gap} off: {step}"
        );
    }
    let worst = max_param_diff(&alone_model, &model);
    assert!(
        worst <= 1e-5,
        "generating with divided experts: differs by {worst}"
    );
    let [
        Followed::Trained {
            steps: 2,
            part: Some(PartKind::Experts),
            engine: Some(engine),
        },
    ] = served[..]
    else {
        panic!("rank 1 did not train and generate: {served:?}");
    };
    assert_eq!(engine.version, WeightVersion(2), "{engine:?}");
    assert!(
        engine.steps > 0,
        "rank 1's engine never stepped: {engine:?}"
    );
    // Asynchronously (generation up to a version ahead): each rank's engine steps over its
    // channel while its trainer exchanges tokens of its own over the copy's group. Without the
    // gap probe (`train.gap_probe_tokens = 0`), nothing gathers the whole model during the run.
    let out = out_dir("moe-experts-generating-async");
    let overrides = [
        &generating[..],
        &[
            "rollout.max_staleness=1",
            "run.max_steps=4",
            "train.gap_probe_tokens=0",
        ],
    ]
    .concat();
    let (reports, _, served) = led_run(moe_config(&dir, &out, &overrides), 2).await;
    outs.push(out);
    assert_eq!(reports.len(), 4);
    assert!(
        reports
            .iter()
            .all(|s| !s.metrics.contains_key("actor/train_infer_logprob_gap")),
        "a probe ran with train.gap_probe_tokens = 0"
    );
    assert!(
        reports
            .iter()
            .any(|s| s.metrics["rollout/staleness_1"] > 0.0),
        "no sample came from the version before"
    );
    assert!(
        matches!(served[..], [Followed::Trained { steps: 4, engine: Some(e), .. }]
            if e.version == WeightVersion(4)),
        "{served:?}"
    );
    // Two copies of the two blocks of experts over four training ranks, the experts' gradients
    // summed over the ranks holding the same block; stopped after a step and resumed (the
    // first copy writes the parts, both read them).
    let out = out_dir("moe-experts-copies");
    let overrides = ["model.expert_parallel=2"];
    let (reports, model, served) = led_run(moe_config(&dir, &out, &overrides), 4).await;
    outs.push(out);
    same_steps(
        &alone_reports,
        &reports,
        &["actor/trained_tokens", "actor/sequences"],
    );
    assert_eq!(served, vec![trained; 3]);
    let worst = max_param_diff(&alone_model, &model);
    assert!(worst <= 1e-5, "two copies: differ by {worst}");
    let out = out_dir("moe-experts-copies-resumed");
    let moe = |out: &std::path::Path, extra: &[&str]| moe_config(&dir, out, extra);
    let (parts, resumed, _) = stopped_and_resumed(&out, 4, &overrides, moe).await;
    outs.push(out);
    assert_eq!(parts, 2, "the first copy's ranks wrote their parts");
    let worst = max_param_diff(&alone_model, &resumed);
    assert!(worst <= 1e-5, "two copies resumed: differ by {worst}");
    for dir in outs {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The tiny run after an `[sft]` warm start of two steps (8 pairs in batches of 4), and `extra`
/// overrides.
fn sft_config(out: &std::path::Path, extra: &[&str]) -> Config {
    let toml = format!(
        "{}\n[sft]\nbatch_size = 4\nlearning_rate = 3e-3\nwarmup_steps = 0\n",
        tiny_rlvr_toml(out)
    );
    ConfigLoader::new()
        .toml_str(toml)
        .overrides(["rollout.max_staleness=0", "train.learning_rate=1e-3"])
        .overrides(extra.iter().copied())
        .load()
        .expect("config")
}

/// [`build`] with the SFT pairs of [`sft_config`] and two held-out ones.
fn build_sft(config: Config) -> RunBuilder {
    let pair = |a: u64, b: u64| SftExample::new(format!("Q: {a}+{b}=? A:"), format!(" {}", a + b));
    build(config).sft_examples(
        (0..8).map(|i| pair(10 + 3 * i, 20 + 7 * i)),
        [pair(41, 17), pair(33, 25)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_sft_fine_tunes_across_ranks_then_trains_rl_as_one_process() {
    let alone_out = out_dir("distributed-sft-alone");
    let mut alone = build_sft(sft_config(&alone_out, &[]))
        .build()
        .expect("build");
    let alone_summary = alone.train().await.expect("train");
    let alone_model = alone.actor().model().expect("model");
    drop(alone);
    let alone_sft = alone_summary.sft.clone().expect("an SFT stage");
    assert_eq!(alone_sft.steps, 2);

    // Colocated (two replicas), tensor-parallel (one copy in two slices), and colocated with a
    // checkpoint every SFT step, stopped after the first (its later checkpoints deleted, as if
    // the job had died there) and resumed on both ranks.
    let tensor = PartKind::Tensor {
        experts: ExpertSplit::Sliced,
    };
    let runs: [(&str, &[&str], Option<PartKind>); 3] = [
        ("distributed-sft-led", &[], None),
        (
            "distributed-sft-tensor",
            &["model.tensor_parallel=2"],
            Some(tensor),
        ),
        (
            "distributed-sft-resumed",
            &["sft.save_every=1", "run.keep_checkpoints=10"],
            None,
        ),
    ];
    for (name, extra, part) in runs {
        let out = out_dir(name);
        let config = sft_config(&out, extra);
        let (mut summary, mut model, mut served) =
            led_run_of(build_sft(config.clone()), config, 2).await;
        // SFT's steps and RL's, on the follower too.
        let mut steps = 4;
        if name.ends_with("resumed") {
            let root = out.join("checkpoints");
            let mut taken: Vec<String> = std::fs::read_dir(&root)
                .expect("checkpoints")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect();
            taken.sort();
            assert!(taken.contains(&"sft-00000001".to_string()), "{taken:?}");
            for later in taken.iter().filter(|t| *t != "sft-00000001") {
                std::fs::remove_dir_all(root.join(later)).expect("rm");
            }
            let config = sft_config(&out, &[extra, &["run.resume=true"]].concat());
            (summary, model, served) = led_run_of(build_sft(config.clone()), config, 2).await;
            steps = 3;
        }
        assert_eq!(
            served,
            vec![Followed::Trained {
                steps,
                part,
                engine: None,
            }],
            "{name}"
        );
        let sft = summary.sft.clone().expect("an SFT stage");
        assert_eq!(sft.steps, alone_sft.steps, "{name}");
        let loss_gap = (sft.eval_loss - alone_sft.eval_loss).abs();
        assert!(
            loss_gap <= 1e-5 * alone_sft.eval_loss.abs().max(1.0),
            "{name}: held-out loss after SFT {} against {} in one process",
            sft.eval_loss,
            alone_sft.eval_loss
        );
        same_steps(
            &alone_summary.rl,
            &summary.rl,
            &["actor/trained_tokens", "actor/sequences"],
        );
        // Adam amplifies rounding where a gradient is near zero: the one-process run itself,
        // micro-batched differently (`train.max_tokens_per_micro_batch=24`, the same sums in
        // another order), ends 2.5e-5 from itself, after SFT and at the end. The ranks' runs
        // measured 1.0e-5 (colocated) and 1.0e-4 (tensor-parallel), at both points; a wrong
        // learning rate or start would differ by the learning rate, 3e-3 (and fail the held-out
        // loss above first).
        let exported = |dir: &std::path::Path| {
            roll::backend::load_model(dir.join("sft_model"), &roll::backend::Device::flex())
                .expect("the SFT export")
        };
        let worst = max_param_diff(&exported(&alone_out), &exported(&out));
        assert!(
            worst <= 5e-4,
            "{name}: the fine-tuned weights differ from one process by {worst}"
        );
        let worst = max_param_diff(&alone_model, &model);
        assert!(
            worst <= 5e-4,
            "{name}: the run differs from one process by {worst}"
        );
        let _ = std::fs::remove_dir_all(out);
    }
    let _ = std::fs::remove_dir_all(alone_out);
}

/// Why rank 0 of a job of `ranks` ranks refuses to build the run `config` configures (before
/// any collective: the other ranks do not run).
fn refused_leading(config: Config, ranks: usize) -> String {
    let group = LocalGroup::replicas(vec![DeviceSpec::Cpu; ranks]).expect("group");
    build(config)
        .lead(Arc::new(group[0].clone()))
        .build()
        .err()
        .expect("refused")
        .to_string()
}

#[test]
fn rollout_ranks_are_refused_where_the_job_cannot_have_them() {
    let out = out_dir("disaggregated-refused");
    let alone = config(&out, &["rollout.ranks=1"]);
    let err = build(alone).build().err().expect("refused").to_string();
    assert!(
        err.contains("rollout.ranks") && err.contains("one process"),
        "{err}"
    );
    // Two processes cannot give both to rollout: one must train.
    let err = refused_leading(config(&out, &["rollout.ranks=2"]), 2);
    assert!(
        err.contains("rollout.ranks") && err.contains("fewer than the job's 2"),
        "{err}"
    );
    // The parts of a model are held by processes; three training ranks do not split in two.
    let err = build(config(&out, &["model.tensor_parallel=2"]))
        .build()
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("model.tensor_parallel") && err.contains("one process"),
        "{err}"
    );
    for (extra, expected) in [
        (
            &["model.pipeline_parallel=2"][..],
            "a divisor of the 3 training processes",
        ),
        (
            &["model.tensor_parallel=2", "model.pipeline_parallel=2"][..],
            "model.tensor_parallel × model.pipeline_parallel",
        ),
        (
            &["model.tensor_parallel=2", "model.expert_parallel=3"][..],
            "1 (every expert sliced) or model.tensor_parallel (whole experts)",
        ),
        (
            &["model.expert_parallel=2"][..],
            "a divisor of the 3 training processes",
        ),
        (
            &["rollout.ranks=1", "rollout.expert_parallel=2"][..],
            "a divisor of rollout.ranks (1)",
        ),
        // A dense model has no experts to divide.
        (
            &["rollout.ranks=2", "rollout.expert_parallel=2"][..],
            "1 for this model (qwen2 with 0 experts)",
        ),
    ] {
        let loaded = ConfigLoader::new()
            .toml_str(tiny_rlvr_toml(&out))
            .overrides(extra.iter().copied())
            .load();
        let err = match loaded {
            Ok(config) => refused_leading(config, 3),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(expected), "{extra:?}: {err}");
    }
    // Experts divided among training ranks holding different tokens, where the model cannot
    // take it: refused by rank 0 before any rank loads the weights, naming the key.
    let base = out_dir("divided-experts-refused");
    std::fs::create_dir_all(&base).expect("dir");
    let moe = format!("model.source.path={}", moe_model_dir(&base).display());
    for (extra, expected) in [
        (
            &["model.expert_parallel=2"][..],
            "this qwen2 model is dense",
        ),
        // The fixture's first layer is dense: the first of two stages would hold no mixture.
        (
            &[
                moe.as_str(),
                "model.expert_parallel=2",
                "model.pipeline_parallel=2",
            ][..],
            "pipeline stage 0 of 2 holds layers 0..1, none of them a mixture",
        ),
    ] {
        let err = refused_leading(config(&out, extra), 4);
        assert!(
            err.contains("model.expert_parallel") && err.contains(expected),
            "{extra:?}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(base);
}

#[test]
fn what_a_run_across_processes_does_not_take_is_refused_on_every_rank() {
    let out = out_dir("distributed-refused");
    let mut two = config(&out, &[]);
    two.model.data_parallel = 2;
    // A follower that cannot start tells the group, so the leader is not left waiting.
    let ranks = LocalGroup::replicas(vec![DeviceSpec::Cpu; 2]).expect("group");
    let err = follow(&two, Arc::new(ranks[1].clone()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.data_parallel"), "{err}");
    let mut bytes = b"start".to_vec();
    let err = ranks[0].broadcast(&mut bytes, 0).unwrap_err().to_string();
    assert!(
        err.contains("replica 1 of 2 failed") && err.contains("rank 1 (actor trainer)"),
        "{err}"
    );
    // Nor is a follower left waiting by a leader that cannot start: the config refused, or
    // anything else its build refuses (here: an RLVR run without prompts).
    for (leader, expected) in [
        (build(two.clone()), "model.data_parallel"),
        (
            RunBuilder::new(config(&out, &[])).reward("first_digit", first_digit),
            "prompts",
        ),
    ] {
        let ranks = LocalGroup::replicas(vec![DeviceSpec::Cpu; 2]).expect("group");
        let follower = {
            let (config, link) = (config(&out, &[]), ranks[1].clone());
            std::thread::spawn(move || follow(&config, Arc::new(link)))
        };
        let err = leader
            .lead(Arc::new(ranks[0].clone()))
            .build()
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains(expected), "{err}");
        let err = follower
            .join()
            .expect("the follower returned")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("rank 0 (controller)") && err.contains(expected),
            "{err}"
        );
    }
}

/// `served` is two rollout ranks that both generated, each started on version 0 and sent each
/// of two steps' weights, holding the experts divided `experts` ways (1: the whole model).
fn two_rollout_ranks_followed(served: &[Followed], experts: usize) {
    assert_eq!(served.len(), 2, "{served:?}");
    for f in served {
        let Followed::Generated(s) = f else {
            panic!("a rollout rank trained: {served:?}");
        };
        assert_eq!((s.weight_syncs, s.version), (3, WeightVersion(2)), "{s:?}");
        assert_eq!(s.expert_parallel, experts, "{s:?}");
        assert!(s.requests > 0, "both ranks generated: {served:?}");
    }
}

/// The largest |a − b| over every parameter of two models.
fn max_param_diff(a: &roll::backend::CausalLm, b: &roll::backend::CausalLm) -> f32 {
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::tensor::Tensor;
    #[derive(Default)]
    struct Collect(Vec<Vec<f32>>);
    impl ModuleVisitor for Collect {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            self.0.push(
                p.val()
                    .into_data()
                    .convert::<f32>()
                    .try_to_vec::<f32>()
                    .unwrap_or_default(),
            );
        }
    }
    let (mut x, mut y) = (Collect::default(), Collect::default());
    a.visit(&mut x);
    b.visit(&mut y);
    assert_eq!(x.0.len(), y.0.len());
    x.0.iter()
        .zip(&y.0)
        .flat_map(|(p, q)| p.iter().zip(q).map(|(u, v)| (u - v).abs()))
        .fold(0.0, f32::max)
}
