//! The learning rate of each optimiser step.

use super::config::{LrSchedule, TrainerConfig};

/// Learning rate of optimiser step `step` (0 = the first step), as HF transformers'
/// `get_constant_schedule_with_warmup` / `get_cosine_with_min_lr_schedule_with_warmup` compute it
/// (`W` = `warmup_steps`, `T` = `total_steps`, `lr` the peak):
///
/// ```text
/// step < W:   lr · step / W                          (so the very first step has lr 0 when W > 0)
/// constant:   lr
/// cosine:     lr · (r + (1 − r) · ½(1 + cos(π·p)))    p = min(1, (step − W) / (T − W)), r = min_lr_ratio
/// ```
///
/// Departure from HF: the cosine is held at its floor after `T` (HF's curve would rise again).
pub fn lr_at(config: &TrainerConfig, step: u64) -> f64 {
    let peak = config.lr;
    let warmup = config.warmup_steps;
    if step < warmup {
        return peak * step as f64 / warmup as f64;
    }
    match config.schedule {
        LrSchedule::Constant {} => peak,
        LrSchedule::Cosine { min_lr_ratio } => {
            let total = config.total_steps.unwrap_or(warmup + 1).max(warmup + 1);
            let progress = ((step - warmup) as f64 / (total - warmup) as f64).min(1.0);
            let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
            peak * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_to_the_floor() {
        let cfg = TrainerConfig {
            lr: 1e-3,
            warmup_steps: 4,
            total_steps: Some(14),
            schedule: LrSchedule::Cosine { min_lr_ratio: 0.1 },
            ..TrainerConfig::default()
        };
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-15, "{a} vs {b}");
        close(lr_at(&cfg, 0), 0.0);
        close(lr_at(&cfg, 1), 2.5e-4);
        close(lr_at(&cfg, 3), 7.5e-4);
        close(lr_at(&cfg, 4), 1e-3);
        // Half-way through the cosine: 0.1 + 0.9·0.5 = 0.55.
        close(lr_at(&cfg, 9), 5.5e-4);
        // Progress 2/10: ½(1 + cos(0.2π)) = 0.904508...
        close(lr_at(&cfg, 6), 1e-3 * (0.1 + 0.9 * 0.904_508_497_187_473_7));
        close(lr_at(&cfg, 14), 1e-4);
        close(lr_at(&cfg, 100), 1e-4);
    }

    #[test]
    fn constant_with_and_without_warmup() {
        let mut cfg = TrainerConfig {
            lr: 2.0,
            ..TrainerConfig::default()
        };
        assert_eq!(lr_at(&cfg, 0), 2.0);
        assert_eq!(lr_at(&cfg, 1000), 2.0);
        cfg.warmup_steps = 2;
        assert_eq!(lr_at(&cfg, 0), 0.0);
        assert_eq!(lr_at(&cfg, 1), 1.0);
        assert_eq!(lr_at(&cfg, 2), 2.0);
    }
}
