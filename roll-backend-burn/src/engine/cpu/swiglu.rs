//! The SwiGLU product `silu(gate) · up` of the MLP.

use super::exp::exp;
use super::vectorized;
use rayon::prelude::*;

/// Elements per rayon task: a few pages, enough to outweigh the task's scheduling.
const CHUNK: usize = 4096;

/// `silu(gate) · up` from a transposed gate/up GEMM output (`[2 · inter, cols]`: the gate rows,
/// then the up rows), as `[inter, cols]`. Element-wise, so the chunking and the vector width
/// change no bit.
pub(crate) fn silu_mul(gate_up_t: &[f32]) -> Vec<f32> {
    let (gate, up) = gate_up_t.split_at(gate_up_t.len() / 2);
    let mut out = super::scratch::overwritten(gate.len());
    out.par_chunks_mut(CHUNK)
        .zip(gate.par_chunks(CHUNK).zip(up.par_chunks(CHUNK)))
        .for_each(|(out, (gate, up))| {
            vectorized!(|| {
                for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                    *o = g / (1.0 + exp(-g)) * u;
                }
            });
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_mul_pairs_gate_and_up_rows() {
        let y = silu_mul(&[0.0, 1.0, 2.0, 3.0]);
        assert_eq!(y[0], 0.0);
        assert!((y[1] - 3.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);
        // Across several rayon chunks, every element is the scalar formula's, bit for bit.
        let n = 3 * CHUNK + 17;
        let gate_up: Vec<f32> = (0..2 * n).map(|i| (i as f32 * 0.37).sin() * 6.0).collect();
        let y = silu_mul(&gate_up);
        for (i, y) in y.iter().enumerate() {
            let (g, u) = (gate_up[i], gate_up[n + i]);
            assert_eq!(
                y.to_bits(),
                (g / (1.0 + exp(-g)) * u).to_bits(),
                "element {i}"
            );
        }
    }
}
