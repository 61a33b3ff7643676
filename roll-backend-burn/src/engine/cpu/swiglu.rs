//! The SwiGLU product `silu(gate) · up` of the MLP.

use super::exp::exp;

/// `silu(gate) · up` from a transposed gate/up GEMM output (`[2 · inter, cols]`: the gate rows,
/// then the up rows), as `[inter, cols]`.
pub(crate) fn silu_mul(gate_up_t: &[f32]) -> Vec<f32> {
    let (gate, up) = gate_up_t.split_at(gate_up_t.len() / 2);
    gate.iter()
        .zip(up)
        .map(|(g, u)| g / (1.0 + exp(-g)) * u)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_mul_pairs_gate_and_up_rows() {
        let y = silu_mul(&[0.0, 1.0, 2.0, 3.0]);
        assert_eq!(y[0], 0.0);
        assert!((y[1] - 3.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);
    }
}
