//! Every kernel against a plain CPU reference (f64 where it sums), on the machine's Vulkan
//! adapter — lavapipe in CI. A machine with no Vulkan adapter at all fails here, naming what to
//! install: the GPU tests never skip silently.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use burn::tensor::{Device, Tensor, TensorData};

fn device() -> Device {
    vulkan_device(0).expect("a Vulkan adapter (lavapipe: apt-get install mesa-vulkan-drivers)")
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = roll_core::rng::SplitMix64::new(seed);
    (0..n)
        .map(|_| (rng.next_f64() * 4.0 - 2.0) as f32)
        .collect()
}

fn matrix(v: &[f32], dims: [usize; 2], device: &Device) -> Tensor<2> {
    Tensor::from_data(TensorData::new(v.to_vec(), dims), device)
}

fn vector(v: &[f32], device: &Device) -> Tensor<1> {
    Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), device)
}

fn read<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_into_vec::<f32>().expect("f32")
}

/// Max over elements of `|got − want| / max(1, |want|)`.
fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).abs() / w.abs().max(1.0))
        .fold(0.0, f64::max)
}

#[test]
fn silu_mul_matches_the_reference() {
    let dev = device();
    let (gate, up) = (values(3 * 700, 1), values(3 * 700, 2));
    let got = read(silu_mul(matrix(&gate, [3, 700], &dev), matrix(&up, [3, 700], &dev)).unwrap());
    let want: Vec<f64> = gate
        .iter()
        .zip(&up)
        .map(|(&g, &u)| {
            let g = f64::from(g);
            g / (1.0 + (-g).exp()) * f64::from(u)
        })
        .collect();
    assert!(rel_err(&got, &want) <= 1e-5, "{}", rel_err(&got, &want));
}

fn rms_reference(x: &[f32], w: &[f32], eps: f64) -> Vec<f64> {
    let d = w.len();
    x.chunks(d)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / d as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            row.iter()
                .zip(w)
                .map(move |(&v, &w)| f64::from(v) * inv * f64::from(w))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn rms_norm_and_its_residual_form_match_the_reference() {
    let dev = device();
    // Widths below, at and above the cube's 128 units, not multiples of it.
    for d in [5usize, 128, 333] {
        let rows = 7;
        let (x, r, w) = (
            values(rows * d, d as u64),
            values(rows * d, 99),
            values(d, 7),
        );
        let got = read(rms_norm(matrix(&x, [rows, d], &dev), vector(&w, &dev), 1e-3).unwrap());
        let want = rms_reference(&x, &w, 1e-3);
        assert!(
            rel_err(&got, &want) <= 1e-5,
            "d {d}: {}",
            rel_err(&got, &want)
        );

        let (summed, normed) = rms_norm_residual(
            matrix(&x, [rows, d], &dev),
            matrix(&r, [rows, d], &dev),
            vector(&w, &dev),
            1e-6,
        )
        .unwrap();
        let sum: Vec<f32> = x.iter().zip(&r).map(|(a, b)| a + b).collect();
        assert_eq!(read(summed), sum, "d {d}: the residual sum is exact");
        let want = rms_reference(&sum, &w, 1e-6);
        let got = read(normed);
        assert!(
            rel_err(&got, &want) <= 1e-5,
            "d {d}: {}",
            rel_err(&got, &want)
        );
    }
}

#[test]
fn rope_matches_the_reference_at_every_position() {
    let dev = device();
    let (heads, head_dim, table) = (3usize, 16usize, 40usize);
    let half = head_dim / 2;
    let angle = |p: usize, j: usize| p as f64 * 1e4f64.powf(-2.0 * j as f64 / head_dim as f64);
    let cos: Vec<f32> = (0..table * half)
        .map(|i| angle(i / half, i % half).cos() as f32)
        .collect();
    let sin: Vec<f32> = (0..table * half)
        .map(|i| angle(i / half, i % half).sin() as f32)
        .collect();
    let positions = [0usize, 5, 39, 17];
    let n = positions.len() * heads;
    let x = values(n * head_dim, 3);
    let got = read(
        rope(
            matrix(&x, [n, head_dim], &dev),
            heads,
            &positions,
            matrix(&cos, [table, half], &dev),
            matrix(&sin, [table, half], &dev),
        )
        .unwrap(),
    );
    let mut want = vec![0.0f64; x.len()];
    for (pair, chunk) in x.chunks(head_dim).enumerate() {
        let p = positions[pair / heads];
        for j in 0..half {
            let (c, s) = (f64::from(cos[p * half + j]), f64::from(sin[p * half + j]));
            let (a, b) = (f64::from(chunk[j]), f64::from(chunk[j + half]));
            want[pair * head_dim + j] = a * c - b * s;
            want[pair * head_dim + j + half] = b * c + a * s;
        }
    }
    assert!(rel_err(&got, &want) <= 1e-5, "{}", rel_err(&got, &want));
    // A position past the tables is an error, not a read out of bounds.
    let err = rope(
        matrix(&x[..heads * head_dim], [heads, head_dim], &dev),
        heads,
        &[table],
        matrix(&cos, [table, half], &dev),
        matrix(&sin, [table, half], &dev),
    )
    .unwrap_err();
    assert!(err.to_string().contains("beyond"), "{err}");
}

#[test]
fn logprob_and_entropy_match_the_reference() {
    let dev = device();
    for vocab in [7usize, 1000] {
        let rows = 5;
        // Large logits: the kernel must subtract the row maximum.
        let logits: Vec<f32> = values(rows * vocab, vocab as u64)
            .iter()
            .map(|v| v * 20.0)
            .collect();
        let targets: Vec<u32> = (0..rows as u32).map(|r| (r * 37) % vocab as u32).collect();
        let (lp, h) = logprob_entropy(matrix(&logits, [rows, vocab], &dev), &targets).unwrap();
        let (mut want_lp, mut want_h) = (Vec::new(), Vec::new());
        for (row, t) in logits.chunks(vocab).zip(&targets) {
            let m = row.iter().map(|&v| f64::from(v)).fold(f64::MIN, f64::max);
            let lse = m + row
                .iter()
                .map(|&v| (f64::from(v) - m).exp())
                .sum::<f64>()
                .ln();
            want_lp.push(f64::from(row[*t as usize]) - lse);
            want_h.push(
                -row.iter()
                    .map(|&v| {
                        let lp = f64::from(v) - lse;
                        lp.exp() * lp
                    })
                    .sum::<f64>(),
            );
        }
        let (lp, h) = (read(lp), read(h));
        assert!(
            rel_err(&lp, &want_lp) <= 1e-5,
            "vocab {vocab}: {}",
            rel_err(&lp, &want_lp)
        );
        assert!(
            rel_err(&h, &want_h) <= 1e-5,
            "vocab {vocab}: {}",
            rel_err(&h, &want_h)
        );
    }
    let err = logprob_entropy(matrix(&[0.0; 6], [2, 3], &dev), &[0, 3]).unwrap_err();
    assert!(err.to_string().contains('3'), "{err}");
}

/// The device kernel against the CPU optimiser itself, through Burn's `Optimizer` interface:
/// several steps (the first one special), weight decay, a clip factor, a 2-D parameter.
#[test]
fn adamw_on_the_device_is_the_cpu_optimisers_update() {
    use crate::train::TrainerConfig;
    use crate::train::adamw::{FusedAdamW, GradScale};
    use burn::optim::Optimizer;
    let dev = device();
    let cpu = Device::flex();
    let config = TrainerConfig {
        weight_decay: 0.1,
        ..TrainerConfig::default()
    };
    let scale = GradScale::new();
    scale.set(0.37);
    let optimizer = FusedAdamW::new(&config, scale);
    let dims = [30, 50];
    let start = values(1500, 11);
    let (mut on_gpu, mut on_cpu) = (matrix(&start, dims, &dev), matrix(&start, dims, &cpu));
    let (mut gpu_state, mut cpu_state) = (None, None);
    for step in 1..=4u64 {
        let g = values(1500, 100 + step);
        (on_gpu, gpu_state) = optimizer.step(1e-2, on_gpu, matrix(&g, dims, &dev), gpu_state);
        (on_cpu, cpu_state) = optimizer.step(1e-2, on_cpu, matrix(&g, dims, &cpu), cpu_state);
        let want: Vec<f64> = read(on_cpu.clone()).iter().map(|&x| f64::from(x)).collect();
        let got = read(on_gpu.clone());
        assert!(
            rel_err(&got, &want) <= 1e-5,
            "step {step}: {}",
            rel_err(&got, &want)
        );
        let (gs, cs) = (gpu_state.as_ref().unwrap(), cpu_state.as_ref().unwrap());
        assert_eq!(gs.momentum.time, cs.momentum.time);
        let want: Vec<f64> = read(cs.momentum.moment_2.clone())
            .iter()
            .map(|&x| f64::from(x))
            .collect();
        let got = read(gs.momentum.moment_2.clone());
        assert!(
            rel_err(&got, &want) <= 1e-5,
            "step {step}: {}",
            rel_err(&got, &want)
        );
    }
    assert!(on_cube_device(&on_gpu) && !on_cube_device(&on_cpu));
}

#[test]
fn tensors_off_the_gpu_are_refused_with_a_clear_error() {
    let cpu = Device::flex();
    let err = silu_mul(Tensor::<1>::zeros([4], &cpu), Tensor::<1>::zeros([4], &cpu)).unwrap_err();
    assert!(err.to_string().contains("cubecl device"), "{err}");
}

/// Attention over scattered pool rows against a direct f64 softmax: a prefill chunk (several
/// queries, each seeing a different prefix) and a decode step, grouped-query heads, more
/// positions than the kernel's units (so every unit merges several).
#[test]
fn paged_attention_matches_the_reference() {
    let dev = device();
    let (heads, kv_heads, d) = (4usize, 2usize, 24usize);
    let width = kv_heads * d;
    let pool_rows = 160;
    let (k_pool, v_pool) = (values(pool_rows * width, 11), values(pool_rows * width, 12));
    let scale = (d as f32).powf(-0.5);
    // Positions land on rows in no particular order, as blocks do.
    let all_rows: Vec<usize> = (0..100).map(|p| (p * 37 + 5) % pool_rows).collect();
    for (start, tokens) in [(70usize, 5usize), (99, 1), (0, 3)] {
        let rows = &all_rows[..start + tokens];
        let q = values(tokens * heads * d, 13 + start as u64);
        let index: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
        let index = Tensor::<1, burn::tensor::Int>::from_data(
            TensorData::new(index, [rows.len()]),
            (&dev, burn::tensor::DType::I32),
        );
        let got = read(
            paged_attention(
                matrix(&q, [tokens * heads, d], &dev),
                matrix(&k_pool, [pool_rows, width], &dev),
                matrix(&v_pool, [pool_rows, width], &dev),
                index,
                start,
                heads,
                kv_heads,
                scale,
            )
            .unwrap(),
        );
        let mut want = Vec::with_capacity(got.len());
        for i in 0..tokens {
            for h in 0..heads {
                let g = h / (heads / kv_heads);
                let qv = &q[(i * heads + h) * d..][..d];
                let at = |p: usize| rows[p] * width + g * d;
                let scores: Vec<f64> = (0..=start + i)
                    .map(|p| {
                        qv.iter()
                            .zip(&k_pool[at(p)..][..d])
                            .map(|(&a, &b)| f64::from(a) * f64::from(b))
                            .sum::<f64>()
                            * f64::from(scale)
                    })
                    .collect();
                let top = scores.iter().copied().fold(f64::MIN, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let total: f64 = weights.iter().sum();
                for j in 0..d {
                    let o: f64 = weights
                        .iter()
                        .enumerate()
                        .map(|(p, w)| w * f64::from(v_pool[at(p) + j]))
                        .sum();
                    want.push(o / total);
                }
            }
        }
        let err = rel_err(&got, &want);
        assert!(err <= 1e-5, "start {start}, {tokens} tokens: {err}");
    }
    // A row count that disagrees with start + tokens is refused, not read out of bounds.
    let short = Tensor::<1, burn::tensor::Int>::from_data(
        TensorData::new(vec![0i32; 3], [3]),
        (&dev, burn::tensor::DType::I32),
    );
    let err = paged_attention(
        matrix(&values(heads * d, 1), [heads, d], &dev),
        matrix(&k_pool, [pool_rows, width], &dev),
        matrix(&v_pool, [pool_rows, width], &dev),
        short,
        5,
        heads,
        kv_heads,
        scale,
    )
    .unwrap_err();
    assert!(err.to_string().contains("3 rows for start 5"), "{err}");
}

/// The device's pick against the host's ([`Draw::pick`]) for the same rule and uniform number:
/// greedy, plain and tempered draws, top-k, top-p and both, on rows with and without tied
/// logits. Where a draw lies within 1e-4 of a boundary of the cumulative distribution the two
/// may round to neighbours, so those are left out — and must be rare.
#[test]
fn sampling_on_the_device_picks_the_hosts_tokens() {
    use crate::engine::{Draw, SamplingRule};
    let dev = device();
    let vocab = 300;
    let mut rows: Vec<Vec<f32>> = (0..5)
        .map(|r| {
            values(vocab, 40 + r)
                .iter()
                .map(|v| v * (1.0 + r as f32))
                .collect()
        })
        .collect();
    // Many ties: logits on a grid of halves.
    rows.push(
        values(vocab, 77)
            .iter()
            .map(|v| (v * 2.0).round() / 2.0)
            .collect(),
    );
    let rule = |temperature, top_k, top_p| SamplingRule {
        temperature,
        top_k,
        top_p,
    };
    let rules = [
        rule(0.0, None, 1.0),
        rule(1.0, None, 1.0),
        rule(0.7, None, 1.0),
        rule(1.0, Some(1), 1.0),
        rule(1.0, Some(5), 1.0),
        rule(1.3, None, 0.5),
        rule(0.8, Some(40), 0.8),
        rule(1.0, Some(vocab + 10), 0.95),
    ];
    let mut rng = roll_core::rng::SplitMix64::new(5);
    let (mut logits, mut draws) = (Vec::new(), Vec::new());
    for row in &rows {
        for rule in rules {
            for _ in 0..12 {
                logits.extend_from_slice(row);
                draws.push(Draw {
                    rule,
                    u: rng.next_f64(),
                });
            }
        }
    }
    let n = draws.len();
    let got = sample(matrix(&logits, [n, vocab], &dev), &draws).unwrap();
    let mut scratch = Vec::new();
    let mut compared = 0;
    for (i, (draw, got)) in draws.iter().zip(got).enumerate() {
        let row = &logits[i * vocab..(i + 1) * vocab];
        let want = draw.pick(row, &mut scratch).unwrap();
        let got = got.unwrap();
        let nudged = |du: f64| {
            let d = Draw {
                u: (draw.u + du).clamp(0.0, 1.0 - 1e-12),
                ..*draw
            };
            d.pick(row, &mut Vec::new()).unwrap().id
        };
        if nudged(-1e-4) != want.id || nudged(1e-4) != want.id {
            continue;
        }
        compared += 1;
        assert_eq!(got.id, want.id, "draw {i}: {draw:?}");
        assert!(
            (got.logprob - want.logprob).abs() <= 1e-5,
            "draw {i}: log-prob {} vs {}",
            got.logprob,
            want.logprob
        );
    }
    assert!(
        compared * 10 >= n * 9,
        "only {compared} of {n} draws away from a boundary"
    );

    // A NaN row fails alone; a draw count that disagrees is refused.
    let mut bad = rows[0].clone();
    bad[17] = f32::NAN;
    let two = [bad, rows[1].clone()].concat();
    let draw = draws[20];
    let picked = sample(matrix(&two, [2, vocab], &dev), &[draw, draw]).unwrap();
    let err = picked[0].as_ref().unwrap_err().to_string();
    assert!(err.contains("row 0 holds NaN"), "{err}");
    assert!(picked[1].is_ok());
    assert!(sample(matrix(&two, [2, vocab], &dev), &[draw]).is_err());
}
