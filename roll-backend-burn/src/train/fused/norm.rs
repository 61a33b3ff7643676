//! RMSNorm forward (keeping the reciprocal root the backward needs) and its analytic backward.
//!
//! `y = g ⊙ x·r` with `r = (mean(x²) + ε)^(-1/2)`, HF's arithmetic (multiply by the reciprocal).
//! With `u = g ⊙ dy`: `dx = r·u − x·r³·(u·x)/n` and `dg = Σ_rows dy ⊙ x·r`.

use crate::engine::cpu::scratch;
use crate::engine::cpu::vectorized;
use rayon::prelude::*;

/// Rows per rayon task of the row-wise kernels.
const ROWS_PER_TASK: usize = 16;

/// The reciprocal root `(mean(x²) + ε)^(-1/2)` of one row.
fn root(x: &[f32], eps: f32) -> f32 {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    (ms + eps).sqrt().recip()
}

/// The reciprocal roots of every row of `x` (`[rows, width]`): all the backward needs of a
/// norm whose output it does not read.
pub(crate) fn roots(x: &[f32], width: usize, eps: f32) -> Vec<f32> {
    x.par_chunks(width).map(|row| root(row, eps)).collect()
}

/// Normalises each row of `x` (`[rows, g.len()]`): returns `(y, r)`.
pub(crate) fn forward(x: &[f32], g: &[f32], eps: f32) -> (Vec<f32>, Vec<f32>) {
    let n = g.len();
    let rows = x.len() / n;
    let mut y = scratch::overwritten(x.len());
    let mut r = vec![0.0; rows];
    y.par_chunks_mut(n * ROWS_PER_TASK)
        .zip(r.par_chunks_mut(ROWS_PER_TASK))
        .zip(x.par_chunks(n * ROWS_PER_TASK))
        .for_each(|((y, r), x)| {
            for ((y, r), x) in y
                .chunks_exact_mut(n)
                .zip(r.iter_mut())
                .zip(x.chunks_exact(n))
            {
                *r = root(x, eps);
                for ((y, &x), &g) in y.iter_mut().zip(x).zip(g) {
                    *y = g * (x * *r);
                }
            }
        });
    (y, r)
}

/// The input gradient of [`forward`], and the weight gradient added to `dg`.
pub(crate) fn backward(x: &[f32], r: &[f32], g: &[f32], dy: &[f32], dg: &mut [f32]) -> Vec<f32> {
    let n = g.len();
    let mut dx = scratch::overwritten(x.len());
    let partial: Vec<Vec<f32>> = dx
        .par_chunks_mut(n * ROWS_PER_TASK)
        .zip(x.par_chunks(n * ROWS_PER_TASK))
        .zip(dy.par_chunks(n * ROWS_PER_TASK))
        .zip(r.par_chunks(ROWS_PER_TASK))
        .map(|(((dx, x), dy), r)| {
            let mut dg = vec![0.0f32; n];
            vectorized!(|| {
                for (((dx, x), dy), &r) in dx
                    .chunks_exact_mut(n)
                    .zip(x.chunks_exact(n))
                    .zip(dy.chunks_exact(n))
                    .zip(r)
                {
                    let mut ux = 0.0f32;
                    for ((&x, &dy), &g) in x.iter().zip(dy).zip(g) {
                        ux += g * dy * x;
                    }
                    let c = r * r * r * ux / n as f32;
                    for (((dx, &x), &dy), (&g, dg)) in dx
                        .iter_mut()
                        .zip(x)
                        .zip(dy)
                        .zip(g.iter().zip(dg.iter_mut()))
                    {
                        *dx = r * g * dy - x * c;
                        *dg += dy * x * r;
                    }
                }
            });
            dg
        })
        .collect();
    for p in partial {
        super::mm::add_in_place(dg, &p);
    }
    dx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::fused::testing::{check_gradient, random};

    #[test]
    fn backward_matches_finite_differences() {
        let (n, rows) = (6, 3);
        let x = random(rows * n, 1);
        let g = random(n, 2);
        let w = random(rows * n, 3); // loss = Σ w ⊙ y
        let loss = |x: &[f32], g: &[f32]| -> f64 {
            let (y, _) = forward(x, g, 1e-6);
            y.iter().zip(&w).map(|(a, b)| f64::from(a * b)).sum()
        };
        let (_, r) = forward(&x, &g, 1e-6);
        let mut dg = vec![0.0; n];
        let dx = backward(&x, &r, &g, &w, &mut dg);
        check_gradient(&x, &dx, |x| loss(x, &g));
        check_gradient(&g, &dg, |g| loss(&x, g));
    }
}
