//! Every built-in environment: deterministic under a seed, beaten by an optimal agent, sometimes
//! beaten by a random one, and unmoved (but penalised) by invalid actions.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use roll_core::config::ComponentSpec;
use roll_core::testing::SplitMix64;
use roll_core::{Env, EnvStatus};
use roll_env::frozen_lake::{FrozenLake, FrozenLakeConfig};
use roll_env::grid::Direction;
use roll_env::sokoban::{Sokoban, SokobanConfig};
use roll_env::{BUILTIN_KINDS, EnvRegistry, Shop, ShopConfig, ToolUse, ToolUseConfig};

/// Actions a random agent picks from, per kind: valid ones and some junk.
fn vocabulary(kind: &str) -> Vec<String> {
    let mut v: Vec<String> = match kind {
        "shop" => [
            "search[shoes]",
            "search[organic tea]",
            "click[next >]",
            "click[< prev]",
            "buy",
            "click[back to search]",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        "tool_use" => [
            "calculator[12*34]",
            "<answer>408</answer>",
            "calculator[(1+2)^3]",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        _ => Direction::ALL.iter().map(|d| d.answer()).collect(),
    };
    v.push("I am not sure.".into());
    v
}

/// Plays `steps` random actions (the agent seeded with `agent_seed`) and records everything.
fn transcript(
    env: &mut dyn Env,
    seed: u64,
    agent_seed: u64,
    steps: usize,
    vocab: &[String],
) -> Vec<String> {
    let mut rng = SplitMix64::new(agent_seed);
    let mut log = vec![env.reset(seed).unwrap().text];
    for _ in 0..steps {
        let action = &vocab[(rng.next_u64() % vocab.len() as u64) as usize];
        let r = env.step(action).unwrap();
        // The reported state (GiGPO's anchor, added after the pins were taken) is the grid the
        // observation shows; the rules are what the fingerprint checks.
        let mut info = r.info.clone();
        if let Some(state) = info.remove(roll_core::episode::STATE_INFO) {
            let grid = state.as_str().unwrap();
            assert!(!grid.is_empty() && r.observation.contains(grid), "{grid:?}");
        }
        log.push(format!(
            "{action} -> {} {:?} {:?}\n{}",
            r.reward, r.status, info, r.observation
        ));
        if r.is_done() {
            break;
        }
    }
    log
}

#[test]
fn the_same_seed_gives_the_same_episode_for_every_env() {
    let registry = EnvRegistry::with_builtins();
    for kind in BUILTIN_KINDS {
        let vocab = vocabulary(kind);
        let mut a = registry.build(&ComponentSpec::new(kind)).unwrap();
        let mut b = registry.build(&ComponentSpec::new(kind)).unwrap();
        let mut firsts = std::collections::BTreeSet::new();
        for seed in 0..20 {
            let x = transcript(&mut *a, seed, seed + 100, 12, &vocab);
            // The same env object reused, and a fresh one, replay identically.
            let y = transcript(&mut *b, seed, seed + 100, 12, &vocab);
            let z = transcript(&mut *a, seed, seed + 100, 12, &vocab);
            assert_eq!(x, y, "{kind} seed {seed}");
            assert_eq!(x, z, "{kind} seed {seed}");
            firsts.insert(x[0].clone());
        }
        assert!(
            firsts.len() >= 15,
            "{kind}: seeds should give different episodes"
        );
    }
}

#[test]
fn a_bfs_agent_solves_every_sokoban_variant() {
    for config in [
        SokobanConfig::simple(),
        SokobanConfig::larger(),
        SokobanConfig::different_grid_vocab(),
    ] {
        let mut env = Sokoban::new(SokobanConfig {
            max_steps: 500,
            ..config
        })
        .unwrap();
        for seed in 0..50 {
            env.reset(seed).unwrap();
            let plan = env.solve(2_000_000).unwrap();
            let mut last = None;
            for (i, dir) in plan.iter().enumerate() {
                let r = env.step(&dir.answer()).unwrap();
                assert_eq!(r.is_done(), i + 1 == plan.len());
                last = Some(r);
            }
            let last = last.unwrap();
            assert_eq!(last.status, EnvStatus::Terminated);
            // The last move pushes the last box home: −0.1 + 1 + 10.
            assert!(
                (last.reward - 10.9).abs() < 1e-4,
                "solve bonus: {}",
                last.reward
            );
            assert_eq!(last.info["success"], true);
        }
    }
}

#[test]
fn a_bfs_agent_reaches_the_frozen_lake_goal() {
    let mut env = FrozenLake::new(FrozenLakeConfig {
        is_slippery: false,
        size: 8,
        max_steps: 100,
        ..Default::default()
    })
    .unwrap();
    for seed in 0..100 {
        env.reset(seed).unwrap();
        let plan = env.solve().unwrap();
        let mut last = None;
        for dir in plan {
            last = Some(env.step(&format!("Action: {dir}")).unwrap());
        }
        let last = last.unwrap();
        assert_eq!(
            (last.reward, last.status),
            (1.0, EnvStatus::Terminated),
            "seed {seed}"
        );
    }
}

#[test]
fn experts_earn_full_reward_in_shop_and_tool_use() {
    let mut shop = Shop::new(ShopConfig::default()).unwrap();
    let mut tools = ToolUse::new(ToolUseConfig::default()).unwrap();
    for seed in 0..50 {
        shop.reset(seed).unwrap();
        let mut last = None;
        for a in shop.expert_actions() {
            last = Some(shop.step(&format!("<answer>{a}</answer>")).unwrap());
        }
        assert_eq!(last.unwrap().reward, 1.0, "shop seed {seed}");
        tools.reset(seed).unwrap();
        let task = tools.task().unwrap().clone();
        tools
            .step(&format!("calculator[{}]", task.expression))
            .unwrap();
        let r = tools
            .step(&format!("<answer>{}</answer>", task.answer))
            .unwrap();
        assert_eq!(r.reward, 1.0, "tool_use seed {seed}");
    }
}

/// Success rate of a uniformly random mover over `episodes` seeds.
fn random_success(env: &mut dyn Env, episodes: u64) -> f64 {
    let moves: Vec<String> = Direction::ALL.iter().map(|d| d.answer()).collect();
    let mut rng = SplitMix64::new(99);
    let mut wins = 0;
    for seed in 0..episodes {
        env.reset(seed).unwrap();
        loop {
            let r = env.step(&moves[(rng.next_u64() % 4) as usize]).unwrap();
            if r.is_done() {
                if r.info["success"] == true {
                    wins += 1;
                }
                break;
            }
        }
    }
    wins as f64 / episodes as f64
}

#[test]
fn a_random_agent_succeeds_sometimes_but_rarely() {
    let mut lake = FrozenLake::new(FrozenLakeConfig::default()).unwrap();
    let lake_rate = random_success(&mut lake, 1000);
    let mut simple = Sokoban::new(SokobanConfig::simple()).unwrap();
    let simple_rate = random_success(&mut simple, 500);
    let mut larger = Sokoban::new(SokobanConfig::larger()).unwrap();
    let larger_rate = random_success(&mut larger, 300);
    eprintln!(
        "random success: lake {lake_rate:.3}, simple sokoban {simple_rate:.3}, larger {larger_rate:.3}"
    );
    assert!((0.02..0.5).contains(&lake_rate), "frozen lake {lake_rate}");
    assert!(
        (0.02..0.6).contains(&simple_rate),
        "simple sokoban {simple_rate}"
    );
    assert!(
        larger_rate < simple_rate,
        "larger {larger_rate} vs simple {simple_rate}"
    );
}

#[test]
fn invalid_actions_are_penalised_no_ops_in_every_env() {
    let registry = EnvRegistry::with_builtins();
    for kind in BUILTIN_KINDS {
        let spec = ComponentSpec::new(kind).with_option("format_penalty", -0.5);
        let mut env = registry.build(&spec).unwrap();
        let first = env.reset(3).unwrap().text;
        let state = |text: &str| {
            let start = text.find("Observation:").unwrap();
            let end = text.rfind("You have").unwrap();
            text[start..end].to_string()
        };
        for junk in [
            "",
            "<answer>teleport</answer>",
            "Action: dance",
            "<|im_end|>",
        ] {
            let r = env.step(junk).unwrap();
            let expected = if kind.contains("sokoban") { -0.6 } else { -0.5 };
            assert!(
                (r.reward - expected).abs() < 1e-6,
                "{kind} {junk:?}: {}",
                r.reward
            );
            assert_eq!(r.status, EnvStatus::Running, "{kind}");
            assert_eq!(r.info["action_is_valid"], false, "{kind}");
            assert_eq!(
                state(&r.observation),
                state(&first),
                "{kind}: the state must not change"
            );
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Whatever the model writes, a running environment answers with a step, never an error.
    #[test]
    fn any_text_is_a_step_never_an_error(texts in proptest::collection::vec(".{0,48}", 1..6), seed in 0u64..1000) {
        let registry = EnvRegistry::with_builtins();
        for kind in BUILTIN_KINDS {
            let mut env = registry.build(&ComponentSpec::new(kind)).unwrap();
            env.reset(seed).unwrap();
            for text in &texts {
                let r = env.step(text).unwrap();
                proptest::prop_assert!(r.reward.is_finite());
                if r.is_done() {
                    break;
                }
            }
        }
    }
}

/// FNV-1a over the texts.
fn fingerprint(texts: &[String]) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for text in texts {
        for b in text.bytes().chain([0]) {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3);
        }
    }
    h
}

/// Every observation, reward, status and info of fixed random-agent episodes — valid and invalid
/// actions, terminations and truncations (`max_steps = 6` of 8 attempted steps) — fingerprinted
/// per kind. Taken before the step limit, format penalty and episode guard moved out of the
/// environments into wrappers: the rules must play exactly as before.
#[test]
fn transcripts_match_the_pinned_fingerprints() {
    let registry = EnvRegistry::with_builtins();
    let mut got = Vec::new();
    for kind in BUILTIN_KINDS {
        let spec = ComponentSpec::new(kind)
            .with_option("format_penalty", -0.1)
            .with_option("max_steps", 6);
        let mut env = registry.build(&spec).unwrap();
        let vocab = vocabulary(kind);
        let mut log = Vec::new();
        for seed in 0..30 {
            log.extend(transcript(&mut *env, seed, seed + 7, 8, &vocab));
        }
        got.push(fingerprint(&log));
    }
    assert_eq!(got, PINNED_TRANSCRIPTS, "{got:#018X?}");
}

const PINNED_TRANSCRIPTS: [u64; 6] = [
    0x2CC3_1058_BC5C_9DCE,
    0xD878_0A2A_51EF_6EAA,
    0x6C13_0AFB_A219_9B1A,
    0x635E_5C13_700F_D19C,
    0x48C0_BE05_E8E5_EBA8,
    0xD931_6606_37F3_23B5,
];

#[test]
fn every_env_refuses_steps_outside_an_episode() {
    let registry = EnvRegistry::with_builtins();
    for kind in BUILTIN_KINDS {
        let spec = ComponentSpec::new(kind).with_option("max_steps", 1);
        let mut env = registry.build(&spec).unwrap();
        let err = env.step("<answer>Up</answer>").unwrap_err().to_string();
        assert!(err.contains("before reset"), "{kind}: {err}");
        env.reset(0).unwrap();
        assert!(env.step("junk").unwrap().is_truncated(), "{kind}");
        let err = env.step("junk").unwrap_err().to_string();
        assert!(err.contains("truncated"), "{kind}: {err}");
        env.reset(1).unwrap();
        assert!(env.step("junk").is_ok(), "{kind}: a reset starts over");
    }
}
