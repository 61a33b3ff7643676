//! SwiGLU: `a = silu(g) ⊙ u` with `silu(g) = g·σ(g)`, and its backward
//! `dg = da ⊙ u ⊙ σ(g)·(1 + g·(1 − σ(g)))`, `du = da ⊙ silu(g)`.

use crate::engine::cpu::exp::exp;
use rayon::prelude::*;

/// Elements per rayon task.
const CHUNK: usize = 4096;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `silu(gate) ⊙ up` (the forward runs the CPU decoder's; this one checks the backward).
#[cfg(test)]
fn forward(gate: &[f32], up: &[f32]) -> Vec<f32> {
    let mut a = vec![0.0; gate.len()];
    a.par_chunks_mut(CHUNK)
        .zip(gate.par_chunks(CHUNK).zip(up.par_chunks(CHUNK)))
        .for_each(|(a, (g, u))| {
            for ((a, &g), &u) in a.iter_mut().zip(g).zip(u) {
                *a = g * sigmoid(g) * u;
            }
        });
    a
}

/// `(d gate, d up)` from `d a`.
pub(crate) fn backward(gate: &[f32], up: &[f32], da: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut dg = vec![0.0; gate.len()];
    let mut du = vec![0.0; gate.len()];
    dg.par_chunks_mut(CHUNK)
        .zip(du.par_chunks_mut(CHUNK))
        .zip(
            gate.par_chunks(CHUNK)
                .zip(up.par_chunks(CHUNK))
                .zip(da.par_chunks(CHUNK)),
        )
        .for_each(|((dg, du), ((g, u), da))| {
            for ((((dg, du), &g), &u), &da) in
                dg.iter_mut().zip(du.iter_mut()).zip(g).zip(u).zip(da)
            {
                let s = sigmoid(g);
                *dg = da * u * s * (1.0 + g * (1.0 - s));
                *du = da * g * s;
            }
        });
    (dg, du)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::fused::testing::{check_gradient, random};

    #[test]
    fn backward_matches_finite_differences() {
        let (g, u, w) = (random(10, 6), random(10, 7), random(10, 8));
        let loss = |g: &[f32], u: &[f32]| -> f64 {
            forward(g, u)
                .iter()
                .zip(&w)
                .map(|(a, b)| f64::from(a * b))
                .sum()
        };
        let (dg, du) = backward(&g, &u, &w);
        check_gradient(&g, &dg, |g| loss(g, &u));
        check_gradient(&u, &du, |u| loss(&g, u));
    }
}
