//! Plots of a run directory's `metrics.jsonl`: reward, held-out accuracy (per domain too),
//! per-domain task score, episodes' success rate and length (agentic runs), KL, entropy,
//! response length, the train–inference log-prob gap, step time and the SFT loss, one PNG each
//! under `plots/`.

use plotters::prelude::*;
use roll_core::{Error, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Fonts tried, in order, for the PNGs' text (plotters draws text with a TrueType font it is
/// given; none is bundled).
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "/Library/Fonts/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Registers the first font found as plotters' `sans-serif`; `false` when there is none.
fn font_registered() -> bool {
    static FOUND: OnceLock<bool> = OnceLock::new();
    *FOUND.get_or_init(|| {
        FONT_CANDIDATES.iter().any(|path| {
            let Ok(bytes) = std::fs::read(path) else {
                return false;
            };
            // Registered once per process; plotters keeps a reference for its lifetime.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
        })
    })
}

/// One line of a chart.
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

/// Writes the plots of `run_dir/metrics.jsonl` to `run_dir/plots/` and returns their paths.
/// Lines that do not parse (a truncated last line) are skipped; a plot whose metric never
/// appears is not written. The files are PNGs when a TrueType font is installed (DejaVu or
/// Liberation Sans, Arial), else SVGs (text rendered by the viewer).
///
/// # Errors
/// [`Error::Io`] if the metrics cannot be read or a plot cannot be written.
pub fn plot_metrics(run_dir: impl AsRef<Path>) -> Result<Vec<PathBuf>> {
    let run_dir = run_dir.as_ref();
    let path = run_dir.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
        action: "cannot read the metrics",
        path: path.clone(),
        source,
    })?;
    let lines: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let stage = |s: &'static str| lines.iter().filter(move |l| l["stage"] == s);
    let series = |stage_name: &'static str, x: &str, y: &str, name: &str| Series {
        name: name.to_owned(),
        points: stage(stage_name)
            .filter_map(|l| Some((l[x].as_f64()?, l[y].as_f64()?)))
            .collect(),
    };
    let rl = |y: &str, name: &str| series("rl", "step", y, name);
    let step_time: Vec<(f64, f64)> = stage("rl")
        .filter_map(|l| {
            let t = l["rollout_s"].as_f64()? + l["train_s"].as_f64()?;
            Some((l["step"].as_f64()?, t))
        })
        .collect();
    // Per-domain series (`domain/<name>/<metric>`) are drawn when a run mixes domains.
    let per_domain = |stage_name: &'static str, x: &str, metric: &str| -> Vec<Series> {
        let suffix = format!("/{metric}");
        let names: std::collections::BTreeSet<&str> = stage(stage_name)
            .filter_map(Value::as_object)
            .flat_map(|l| l.keys())
            .filter_map(|k| k.strip_prefix("domain/")?.strip_suffix(suffix.as_str()))
            .collect();
        if names.len() < 2 {
            return Vec::new();
        }
        names
            .into_iter()
            .map(|d| series(stage_name, x, &format!("domain/{d}/{metric}"), d))
            .collect()
    };
    let mut accuracy = vec![series("eval", "rl_step", "accuracy", "all")];
    accuracy.extend(per_domain("eval", "rl_step", "accuracy"));
    let charts = [
        (
            "reward",
            "RL: mean rollout reward",
            vec![rl("reward_mean", "reward")],
        ),
        (
            "accuracy",
            "held-out accuracy (greedy) by RL step",
            accuracy,
        ),
        (
            "domain_score",
            "RL: mean task score per domain",
            per_domain("rl", "step", "score_mean"),
        ),
        (
            "success_rate",
            "episodes: success rate",
            vec![
                rl("episode/success_rate", "rollout (sampled)"),
                series("eval", "rl_step", "success_rate", "held-out (greedy)"),
            ],
        ),
        (
            "episode_length",
            "episodes: turns per episode",
            vec![
                rl("episode/turns_mean", "rollout (sampled)"),
                series("eval", "rl_step", "episode_len_mean", "held-out (greedy)"),
            ],
        ),
        (
            "kl",
            "RL: KL to the rollout policy",
            vec![
                rl("actor/approx_kl", "approx KL"),
                rl("batch/token_kl_mean", "token KL to reference"),
            ],
        ),
        (
            "entropy",
            "RL: token entropy",
            vec![rl("actor/entropy", "entropy")],
        ),
        (
            "response_length",
            "RL: mean response length (tokens)",
            vec![rl("response_len_mean", "tokens")],
        ),
        (
            "train_infer_gap",
            "RL: train-inference log-prob gap",
            vec![
                rl("actor/train_infer_logprob_gap", "probe |Δ logp|"),
                rl("actor/train_infer/mean_abs_diff", "batch mean |Δ logp|"),
            ],
        ),
        (
            "step_time",
            "RL: seconds per step",
            vec![
                Series {
                    name: "rollout + train".into(),
                    points: step_time,
                },
                rl("rollout_s", "rollout"),
                rl("train_s", "train"),
            ],
        ),
        (
            "sft_loss",
            "SFT: cross-entropy per response token",
            vec![
                series("sft", "step", "loss", "train"),
                series("sft", "step", "eval_loss", "held-out"),
            ],
        ),
    ];
    let dir = run_dir.join("plots");
    std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
        action: "cannot create the plots directory",
        path: dir.clone(),
        source,
    })?;
    let png = font_registered();
    let mut written = Vec::new();
    for (name, title, series) in charts {
        let series: Vec<Series> = series
            .into_iter()
            .filter(|s| !s.points.is_empty())
            .collect();
        if series.is_empty() {
            continue;
        }
        let path = dir.join(format!("{name}.{}", if png { "png" } else { "svg" }));
        let drawn = if png {
            draw(
                BitMapBackend::new(&path, (800, 450)).into_drawing_area(),
                title,
                &series,
            )
        } else {
            draw(
                SVGBackend::new(&path, (800, 450)).into_drawing_area(),
                title,
                &series,
            )
        };
        drawn.map_err(|e| Error::Io {
            action: "cannot draw a plot",
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        written.push(path);
    }
    Ok(written)
}

const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

fn draw<DB: DrawingBackend>(
    area: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    series: &[Series],
) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.fill(&WHITE).map_err(e)?;
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        if x.is_finite() && y.is_finite() {
            (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
        }
    }
    if x0 > x1 {
        return Ok(());
    }
    if x1 - x0 < 1e-9 {
        x1 = x0 + 1.0;
    }
    let pad = ((y1 - y0) * 0.05).max(1e-6);
    let (y0, y1) = (y0 - pad, y1 + pad);
    let mut chart = ChartBuilder::on(&area)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(e)?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        if s.points.len() <= 30 {
            chart
                .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(e)?;
        }
    }
    if series.len() > 1 {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(e)?;
    }
    area.present().map_err(e)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn plots_skip_bad_lines_and_missing_metrics() {
        let dir = std::env::temp_dir().join(format!("roll-plots-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut text = String::new();
        for step in 0..5 {
            text.push_str(&format!(
                "{{\"stage\":\"rl\",\"step\":{step},\"reward_mean\":{},\"rollout_s\":0.5,\"train_s\":0.2}}\n",
                0.1 * f64::from(step)
            ));
        }
        text.push_str(
            "{\"stage\":\"eval\",\"rl_step\":0,\"accuracy\":0.2}\n{\"stage\":\"rl\",\"st",
        );
        std::fs::write(dir.join("metrics.jsonl"), text).unwrap();
        let written = plot_metrics(&dir).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["reward", "accuracy", "step_time"]);
        for p in &written {
            assert!(
                std::fs::metadata(p).unwrap().len() > 1000,
                "{}",
                p.display()
            );
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn domains_and_episodes_get_their_own_plots() {
        let dir = std::env::temp_dir().join(format!("roll-plots-domains-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut text = String::new();
        for step in 0..4 {
            text.push_str(&format!(
                "{{\"stage\":\"rl\",\"step\":{step},\"domain/math/score_mean\":0.5,\"domain/code/score_mean\":0.25,\"episode/success_rate\":0.4,\"episode/turns_mean\":3.5}}\n"
            ));
        }
        text.push_str("{\"stage\":\"eval\",\"rl_step\":4,\"accuracy\":0.3,\"domain/math/accuracy\":0.4,\"domain/code/accuracy\":0.2,\"success_rate\":0.3,\"episode_len_mean\":4.0}\n");
        // One domain only: no per-domain chart for the lines below.
        let single = dir.join("single");
        std::fs::create_dir_all(&single).unwrap();
        std::fs::write(
            single.join("metrics.jsonl"),
            "{\"stage\":\"rl\",\"step\":0,\"domain/math/score_mean\":0.5}\n",
        )
        .unwrap();
        std::fs::write(dir.join("metrics.jsonl"), text).unwrap();
        let stems = |written: Vec<PathBuf>| -> Vec<String> {
            written
                .iter()
                .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(
            stems(plot_metrics(&dir).unwrap()),
            ["accuracy", "domain_score", "success_rate", "episode_length"]
        );
        assert!(stems(plot_metrics(&single).unwrap()).is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
