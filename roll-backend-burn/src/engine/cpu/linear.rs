//! A linear layer of the CPU decoder: its weight packed once for roll's GEMM ([`super::gemm`]),
//! and its bias.

use super::gemm::{Init, MatRef, PackedA, PackedB, matmul, matmul_packed};
use std::sync::OnceLock;

/// `X · W + bias` for the decoder's transposed activations.
///
/// The weight `W` (`[d_in, d_out]`) is packed once, at construction, as the right operand of
/// products with few tokens; the activations are the left operand, read through their
/// transposed layout (`[d_in, tokens]`) without a copy. From [`TRANSPOSED_FROM`] tokens a
/// transposed output is computed as `Yᵀ = Wᵀ·Xᵀ` instead, with `Wᵀ` packed once as the left
/// operand (the first time such a product runs): the output lands in the decoder's layout with
/// no transpose, and the activations pack as a right operand, along their contiguous rows. Each
/// output element is one in-order chain of fused multiply-adds over `d_in` either way (see
/// [`super::gemm`]), whatever the number of tokens: a token's outputs are the same bits alone or
/// in a batch.
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    weight: PackedB,
    weight_t: OnceLock<PackedA>,
    bias: Option<Vec<f32>>,
}

/// Tokens from which [`Linear::forward`] multiplies as `Wᵀ·Xᵀ`: its tiles are 16 tokens wide, so
/// fewer tokens would leave most of each tile's lanes idle, where `X·W` tiles them by 6.
const TRANSPOSED_FROM: usize = 32;

impl Linear {
    /// `W` given row-major `[d_in, d_out]` (Burn's `Linear` layout).
    pub(crate) fn new(weight: &[f32], d_in: usize, d_out: usize, bias: Option<Vec<f32>>) -> Self {
        Self {
            weight: PackedB::new(MatRef::row_major(weight, d_in, d_out)),
            weight_t: OnceLock::new(),
            bias,
        }
    }

    /// `W` given as `Wᵀ`, row-major `[d_out, d_in]` (an embedding table as a tied LM head).
    pub(crate) fn from_transposed(weight_t: &[f32], d_in: usize, d_out: usize) -> Self {
        Self {
            weight: PackedB::new(MatRef::row_major(weight_t, d_out, d_in).t()),
            weight_t: OnceLock::new(),
            bias: None,
        }
    }

    /// Input features.
    pub(crate) fn d_in(&self) -> usize {
        self.weight.k()
    }

    /// Output features.
    pub(crate) fn d_out(&self) -> usize {
        self.weight.n()
    }

    /// `X · W` (no bias), token-major (`[cols, d_out]`), for transposed activations `xt`.
    fn product(&self, xt: &[f32], cols: usize) -> Vec<f32> {
        let mut y = super::scratch::overwritten(cols * self.d_out());
        let x = MatRef::row_major(xt, self.d_in(), cols).t();
        matmul(&mut y, x, &self.weight, Init::Overwrite);
        y
    }

    /// `X · W + bias`, token-major (`[cols, d_out]`), for transposed activations `xt`
    /// (`[d_in, cols]`).
    pub(crate) fn forward_rows(&self, xt: &[f32], cols: usize) -> Vec<f32> {
        let mut y = self.product(xt, cols);
        if let Some(bias) = &self.bias {
            for row in y.chunks_exact_mut(self.d_out()) {
                for (v, b) in row.iter_mut().zip(bias) {
                    *v += b;
                }
            }
        }
        y
    }

    /// `(X · W + bias)ᵀ` (`[d_out, cols]`), the decoder's transposed layout, for transposed
    /// activations `xt` (`[d_in, cols]`).
    pub(crate) fn forward(&self, xt: &[f32], cols: usize) -> Vec<f32> {
        let mut out = if cols < TRANSPOSED_FROM {
            let y = self.product(xt, cols);
            let out = super::matrix::transpose(&y, cols, self.d_out());
            super::scratch::recycle(y);
            out
        } else {
            let weight_t =
                super::pool::made_once(&self.weight_t, || PackedA::transposed_from(&self.weight));
            let x = PackedB::new(MatRef::row_major(xt, self.d_in(), cols));
            let mut out = super::scratch::overwritten(self.d_out() * cols);
            matmul_packed(&mut out, weight_t, &x, Init::Overwrite);
            out
        };
        if let Some(bias) = &self.bias {
            for (row, b) in out.chunks_exact_mut(cols.max(1)).zip(bias) {
                for v in row {
                    *v += b;
                }
            }
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::engine::cpu::matrix::transpose;
    use crate::engine::cpu::uniform;

    #[test]
    fn a_linear_layer_matches_a_hand_product() {
        let w = [1., 2., 3., 4., 5., 6.]; // [2, 3]
        let l = Linear::new(&w, 2, 3, Some(vec![0.5, 0., 0.]));
        // Tokens (1, 1) and (2, 0), transposed.
        assert_eq!(l.forward(&[1., 2., 1., 0.], 2), [5.5, 2.5, 7., 4., 9., 6.]);
        assert_eq!(
            l.forward_rows(&[1., 2., 1., 0.], 2),
            [5.5, 7., 9., 2.5, 4., 6.]
        );
        assert_eq!(l.forward(&[1., 1.], 1), [5.5, 7., 9.]);
        let tied = Linear::from_transposed(&transpose(&w, 2, 3), 2, 3);
        assert_eq!(tied.forward_rows(&[1., 1.], 1), [5., 7., 9.]);
    }

    /// Each token's outputs are bit-identical whatever the token count, one token included.
    #[test]
    fn a_tokens_outputs_do_not_depend_on_the_token_count() {
        let mut rnd = uniform(12345);
        for (k, n) in [(1408usize, 96usize), (352, 128), (128, 704), (96, 64)] {
            let w: Vec<f32> = (0..k * n).map(|_| rnd()).collect();
            let l = Linear::new(&w, k, n, None);
            let x: Vec<f32> = (0..70 * k).map(|_| rnd()).collect(); // [70 tokens, k]
            let alone: Vec<Vec<f32>> = (0..70)
                .map(|t| l.forward(&x[t * k..(t + 1) * k], 1))
                .collect();
            // Below and from `TRANSPOSED_FROM`, where the product turns around.
            for m in [2, 3, 5, 7, 16, 31, 32, 33, 70] {
                let y = transpose(&l.forward(&transpose(&x[..m * k], m, k), m), n, m);
                for (t, want) in alone.iter().take(m).enumerate() {
                    assert!(
                        &y[t * n..(t + 1) * n] == want.as_slice(),
                        "k {k} m {m} token {t}"
                    );
                }
            }
        }
    }
}
