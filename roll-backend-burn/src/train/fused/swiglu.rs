//! SwiGLU: `a = silu(g) ⊙ u` with `silu(g) = g·σ(g)`, and its backward
//! `dg = da ⊙ u ⊙ σ(g)·(1 + g·(1 − σ(g)))`, `du = da ⊙ silu(g)`.

use crate::engine::cpu::exp::exp;
use crate::engine::cpu::vectorized;
use rayon::prelude::*;

/// Elements per rayon task.
const CHUNK: usize = 4096;

#[inline(always)]
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

/// `d gate|up` from `d a`, transposed as the decoder keeps them: `gate_up_t` is
/// `[2·inter, tokens]` (the gate rows, then the up rows), `da_t` `[inter, tokens]`, the result
/// `gate_up_t`'s shape. Element-wise over the gate and up halves.
pub(crate) fn backward(gate_up_t: &[f32], da_t: &[f32]) -> Vec<f32> {
    let (gate, up) = gate_up_t.split_at(gate_up_t.len() / 2);
    let mut d_gate_up = crate::engine::cpu::scratch::overwritten(gate_up_t.len());
    let (dg, du) = d_gate_up.split_at_mut(gate.len());
    dg.par_chunks_mut(CHUNK)
        .zip(du.par_chunks_mut(CHUNK))
        .zip(
            gate.par_chunks(CHUNK)
                .zip(up.par_chunks(CHUNK))
                .zip(da_t.par_chunks(CHUNK)),
        )
        .for_each(|((dg, du), ((g, u), da))| {
            // Indexed over slices of one length: a zip of five iterators does not vectorise
            // (4× slower, measured).
            let n = dg.len();
            let (du, g, u, da) = (&mut du[..n], &g[..n], &u[..n], &da[..n]);
            vectorized!(|| {
                for i in 0..n {
                    let s = sigmoid(g[i]);
                    dg[i] = da[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
                    du[i] = da[i] * g[i] * s;
                }
            });
        });
    d_gate_up
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::fused::testing::{check_gradient, random};

    #[test]
    fn backward_matches_finite_differences() {
        // Five units of two tokens: the gate rows, then the up rows.
        let (gate_up_t, w) = (random(20, 6), random(10, 8));
        let loss = |gu: &[f32]| -> f64 {
            let (gate, up) = gu.split_at(10);
            forward(gate, up)
                .iter()
                .zip(&w)
                .map(|(a, b)| f64::from(a * b))
                .sum()
        };
        check_gradient(&gate_up_t, &backward(&gate_up_t, &w), loss);
    }
}
