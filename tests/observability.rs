//! The dashboards: a run with `run.tensorboard` and `run.prometheus_port` serves its metrics on
//! loopback while it trains, and its TensorBoard event file parses back to exactly the scalars
//! of `metrics.jsonl`. One test in its own binary: both sinks hang off the process's one global
//! `metrics` recorder.

use roll::core::config::ConfigLoader;
use roll::prelude::*;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use tfrecord::protobuf::event::What;
use tfrecord::protobuf::summary::value::Value as SummaryValue;
use tfrecord::{EventIter, RecordReaderConfig};

mod common;
use common::{TINY_NEW_MODEL, out_dir};

fn http_get(address: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(address).expect("the endpoint accepts");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").expect("request");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("response");
    text
}

fn config(out: &std::path::Path, prometheus_port: u16) -> Config {
    ConfigLoader::new()
        .toml_str(format!(
            r#"
            [run]
            max_steps = 3
            output_dir = "{}"
            tensorboard = true
            prometheus_port = {prometheus_port}
            {TINY_NEW_MODEL}
            [rollout]
            prompts_per_step = 4
            group_size = 2
            max_new_tokens = 3
            [train]
            learning_rate = 1e-4
            [domains.sums]
            ratio = 1.0
            reward = {{ kind = "math_rule", answer = "whole" }}
            [domains.differences]
            ratio = 1.0
            reward = {{ kind = "math_rule", answer = "whole" }}
            "#,
            out.display()
        ))
        .load()
        .expect("config")
}

fn prompts() -> Vec<Prompt> {
    (0..16)
        .map(|i| {
            let (a, b) = (i % 7, i / 3);
            if i % 2 == 0 {
                Prompt::new(PromptId(i), format!("Q: {a}+{b}=? A:"), "sums")
                    .with_ground_truth((a + b).to_string())
            } else {
                Prompt::new(PromptId(i), format!("Q: {a}-{b}=? A:"), "differences")
                    .with_ground_truth((a as i64 - b as i64).to_string())
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_answers_on_loopback_and_tensorboard_reads_back_the_logged_scalars() {
    let out = out_dir("observability");
    let mut run = RunBuilder::new(config(&out, 0))
        .prompts(prompts())
        .build()
        .expect("build");
    let address = run.prometheus_address().expect("an endpoint");
    assert!(address.ip().is_loopback(), "{address}");

    // One run at a time owns the sinks: a second one says so instead of mixing numbers.
    let second_out = out_dir("observability-2");
    let second = RunBuilder::new(config(&second_out, 0))
        .prompts(prompts())
        .build();
    let err = second.err().expect("a second run with sinks").to_string();
    assert!(err.contains("another run"), "{err}");
    let _ = std::fs::remove_dir_all(second_out);

    for step in 1..=3 {
        run.step().await.expect("step");
        let page = http_get(address, "/metrics");
        assert!(page.starts_with("HTTP/1.1 200 OK"), "{page}");
        assert!(
            page.contains(&format!("roll_rl_steps_total {step}\n")),
            "step {step}:\n{page}"
        );
        // The run's own line, and a component's counter with its labels.
        assert!(page.contains("rl_reward_mean "), "{page}");
        assert!(
            page.contains("roll_reward_scored_total{domain=\"sums\""),
            "{page}"
        );
        // The inference engine's token counters.
        for counter in [
            "roll_engine_generated_tokens_total ",
            "roll_engine_prompt_tokens_computed_total ",
        ] {
            assert!(page.contains(counter), "{counter}:\n{page}");
        }
    }
    assert!(http_get(address, "/other").starts_with("HTTP/1.1 404"));
    assert!(http_get(address, "/metrics").contains("rl_domain_differences_prompts 2\n"));
    drop(run);
    assert!(
        TcpStream::connect(address).is_err(),
        "the endpoint stops with its run"
    );

    // Every number of every RL line is in the event file at that line's step.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .expect("metrics")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 3);
    let file = std::fs::read_dir(out.join("tensorboard"))
        .expect("the TensorBoard directory")
        .map(|e| e.expect("entry").path())
        .find(|p| p.to_string_lossy().contains("tfevents"))
        .expect("an event file");
    let mut scalars: BTreeMap<(String, i64), f32> = BTreeMap::new();
    let mut first = None;
    for event in EventIter::open(&file, RecordReaderConfig::default()).expect("open") {
        let event = event.expect("a record with valid checksums");
        match event.what {
            Some(What::FileVersion(v)) => first = first.or(Some(v)),
            Some(What::Summary(summary)) => {
                for v in summary.value {
                    if let Some(SummaryValue::SimpleValue(x)) = v.value {
                        scalars.insert((v.tag, event.step), x);
                    }
                }
            }
            _ => {}
        }
    }
    assert_eq!(first.as_deref(), Some("brain.Event:2"));
    let mut checked = 0;
    for line in &lines {
        let step = line["step"].as_i64().expect("step");
        for (key, value) in line.as_object().expect("object") {
            let Some(value) = value.as_f64() else {
                continue;
            };
            if key == "step" {
                continue;
            }
            let tag = format!("rl/{key}");
            let logged = scalars
                .get(&(tag.clone(), step))
                .unwrap_or_else(|| panic!("{tag} at step {step} is not in the event file"));
            assert_eq!(*logged, value as f32, "{tag} at step {step}");
            checked += 1;
        }
    }
    assert!(checked > 60, "{checked} scalars checked");
    assert!(
        scalars.contains_key(&("rl/domain/sums/score_mean".to_owned(), 2)),
        "per-domain metrics reach TensorBoard"
    );
    // Counters land as running totals on the step whose rollout counted them.
    let scored = |step: i64| {
        scalars
            .iter()
            .filter(|((tag, s), _)| tag.starts_with("roll_reward_scored_total/") && *s == step)
            .map(|(_, v)| f64::from(*v))
            .sum::<f64>()
    };
    assert!(scored(0) >= 8.0, "{}", scored(0));
    assert!(scored(1) >= scored(0) + 8.0 && scored(2) >= scored(1) + 8.0);
    let _ = std::fs::remove_dir_all(out);
}
