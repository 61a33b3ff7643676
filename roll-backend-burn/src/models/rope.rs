//! HuggingFace's rotary position embedding (`rotate_half`: dimension `i` pairs with `i + d/2`,
//! not Burn's interleaved pairs), with the angle tables computed in f32 as HF does.

use burn::tensor::{Int, Tensor, TensorData};

/// Rotary position embedding as HF computes it (`rotate_half`: pairs `(i, i + d/2)`, not Burn's
/// interleaved pairs).
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    /// Frequencies `1 / theta^(2i/d)` for `i < d/2`, computed in f32 as HF does.
    pub fn new(head_dim: usize, theta: f64) -> Self {
        let half = head_dim / 2;
        let inv_freq = (0..half)
            .map(|i| {
                let exponent = (2 * i) as f32 / head_dim as f32;
                1.0 / (theta as f32).powf(exponent)
            })
            .collect();
        Self { inv_freq }
    }

    /// The inverse frequencies `1 / theta^(2i/d)`, `i < d/2` (what the CPU decoder's angles use,
    /// so both paths rotate by the same f32 angles).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// `cos` and `sin` tables for the given positions.
    ///
    /// # Shapes
    /// - `position_ids`: `[batch, seq]`
    /// - output: two `[batch, 1, seq, head_dim]`
    pub fn cos_sin(&self, position_ids: &Tensor<2, Int>) -> (Tensor<4>, Tensor<4>) {
        let [batch, seq] = position_ids.dims();
        let device = position_ids.device();
        let half = self.inv_freq.len();
        let inv = Tensor::<1>::from_data(TensorData::new(self.inv_freq.clone(), [half]), &device)
            .reshape([1, 1, half]);
        let freqs = position_ids.clone().float().reshape([batch, seq, 1]) * inv;
        let emb = Tensor::cat(vec![freqs.clone(), freqs], 2).reshape([batch, 1, seq, 2 * half]);
        (emb.clone().cos(), emb.sin())
    }

    /// Rotates `x` by the positions' angles: `x * cos + rotate_half(x) * sin`.
    ///
    /// # Shapes
    /// - `x`: `[batch, heads, seq, head_dim]`, `cos`/`sin`: `[batch, 1, seq, head_dim]`
    /// - output: like `x`
    pub fn apply(x: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> Tensor<4> {
        let [b, h, t, d] = x.dims();
        let half = d / 2;
        let x1 = x.clone().narrow(3, 0, half);
        let x2 = x.clone().narrow(3, half, half);
        let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
        debug_assert_eq!(rotated.dims(), [b, h, t, d]);
        x * cos.clone() + rotated * sin.clone()
    }

    /// The sine table with `rotate_half`'s sign folded in: `[−sin(first half), sin(second half)]`,
    /// for [`Rope::rotate`].
    ///
    /// # Shapes
    /// - `sin`: `[batch, 1, seq, head_dim]`
    /// - output: like `sin`
    pub fn signed_sin(sin: &Tensor<4>) -> Tensor<4> {
        let half = sin.dims()[3] / 2;
        Tensor::cat(
            vec![
                sin.clone().narrow(3, 0, half).neg(),
                sin.clone().narrow(3, half, half),
            ],
            3,
        )
    }

    /// [`Rope::apply`] with the sign of `rotate_half` already in the sine table (from
    /// [`Rope::signed_sin`]): `x * cos + swap_halves(x) * signed_sin`, one pass fewer and the
    /// same values (a sign flip is exact).
    ///
    /// # Shapes
    /// - `x`: `[batch, heads, seq, head_dim]`, `cos`/`signed_sin`: `[batch, 1, seq, head_dim]`
    /// - output: like `x`
    pub fn rotate(x: Tensor<4>, cos: &Tensor<4>, signed_sin: &Tensor<4>) -> Tensor<4> {
        let half = x.dims()[3] / 2;
        let swapped = Tensor::cat(
            vec![
                x.clone().narrow(3, half, half),
                x.clone().narrow(3, 0, half),
            ],
            3,
        );
        x * cos.clone() + swapped * signed_sin.clone()
    }
}
