//! GEMMs through Burn's Flex backend on a transposed weight, cut into row blocks run concurrently
//! and inner slices of at most [`MAX_K`], so that each output element is always summed the same
//! way (batch invariance).

use super::matrix::{add_in_place, transpose};
use crate::{BackendError, Result};
use burn::tensor::{Device, Tensor, TensorData};
use rayon::prelude::*;

/// Widest slice of the inner dimension one GEMM call gets (see [`Gemm`]).
const MAX_K: usize = 512;

/// Row blocks of a [`Gemm`] start at multiples of this (gemm's micro-kernel height for f32), so
/// every output row is computed by the same micro-kernel rows as without blocks.
const ROW_ALIGN: usize = 16;

/// A linear layer's weight, held transposed (`Wᵀ`, `[d_out, d_in]`) as Burn tensors for Flex's
/// GEMM, with an optional bias.
///
/// The weight is cut two ways, once, at construction:
///
/// - **output rows** into one block per rayon thread (at most 8), multiplied concurrently.
///   Flex threads a single GEMM only above 192³ multiply-adds, which a decode step's are not,
///   whereas independent row blocks run ~1.6× faster than one GEMM on the 2-core machine
///   (memory streams in parallel: a decode step's GEMMs are mostly memory-bound). Wider
///   products (prefill, training) are threaded inside each block as well — measured faster than
///   running the blocks in turn;
/// - an **inner dimension** wider than [`MAX_K`] into near-equal slices, each its own contiguous
///   tensor, whose products are summed in order. `gemm` blocks such a depth internally too, but
///   then reads each weight row in strided pieces; contiguous slices stream, which doubles the
///   speed of a one-token step's `down` projection.
///
/// Neither cut depends on the input, so each output element is always computed the same way.
#[derive(Debug, Clone)]
pub(crate) struct Gemm {
    /// Row blocks: output rows `r0..r1`, and the slices of `Wᵀ[r0..r1]` with the input rows
    /// `k0..k1` each multiplies.
    blocks: Vec<RowBlock>,
    bias: Option<Vec<f32>>,
    d_in: usize,
    d_out: usize,
}

/// Output rows `r0..r1` of a [`Gemm`].
#[derive(Debug, Clone)]
struct RowBlock {
    r0: usize,
    r1: usize,
    /// `Wᵀ[r0..r1, k0..k1]` and `(k0, k1)`.
    slices: Vec<(Tensor<2>, usize, usize)>,
}

/// The slices `k0..k1` of an inner dimension of `d_in`.
fn k_slices(d_in: usize) -> Vec<(usize, usize)> {
    let pieces = d_in.div_ceil(MAX_K).max(1);
    let width = d_in.div_ceil(pieces);
    (0..pieces)
        .map(|p| (p * width, ((p + 1) * width).min(d_in)))
        .filter(|(a, b)| a < b)
        .collect()
}

/// Weights below which a [`Gemm`] is one row block: for small matrices, spreading the work over
/// threads costs more than it saves.
const MIN_PARALLEL_WEIGHTS: usize = 1 << 18;

/// The row blocks `r0..r1` of a `[d_out, d_in]` matrix: one per rayon thread (at most 8),
/// aligned to [`ROW_ALIGN`]; a single block below [`MIN_PARALLEL_WEIGHTS`].
fn row_blocks(d_out: usize, d_in: usize) -> Vec<(usize, usize)> {
    let wanted = if d_out * d_in < MIN_PARALLEL_WEIGHTS {
        1
    } else {
        rayon::current_num_threads().clamp(1, 8)
    };
    let height = d_out.div_ceil(wanted).div_ceil(ROW_ALIGN) * ROW_ALIGN;
    (0..wanted)
        .map(|b| (b * height, ((b + 1) * height).min(d_out)))
        .filter(|(a, b)| a < b)
        .collect()
}

impl Gemm {
    /// Wraps `Wᵀ`, given row-major `[d_out, d_in]` (each output feature's weights contiguous).
    pub(crate) fn from_transposed(
        weight_t: Vec<f32>,
        d_in: usize,
        d_out: usize,
        bias: Option<Vec<f32>>,
        device: &Device,
    ) -> Self {
        debug_assert_eq!(weight_t.len(), d_in * d_out);
        let slices = k_slices(d_in);
        let blocks = row_blocks(d_out, d_in)
            .into_iter()
            .map(|(r0, r1)| RowBlock {
                r0,
                r1,
                slices: slices
                    .iter()
                    .map(|&(k0, k1)| {
                        let piece: Vec<f32> = weight_t[r0 * d_in..r1 * d_in]
                            .chunks_exact(d_in)
                            .flat_map(|row| &row[k0..k1])
                            .copied()
                            .collect();
                        let shape = [r1 - r0, k1 - k0];
                        (
                            Tensor::from_data(TensorData::new(piece, shape), device),
                            k0,
                            k1,
                        )
                    })
                    .collect(),
            })
            .collect();
        Self {
            blocks,
            bias,
            d_in,
            d_out,
        }
    }

    /// Wraps `Wᵀ` held in a tensor `[d_out, d_in]`, without bias. Its storage is shared, not
    /// copied: blocks and slices are views.
    pub(crate) fn from_tensor_t(weight_t: Tensor<2>, d_in: usize, d_out: usize) -> Self {
        debug_assert_eq!(weight_t.dims(), [d_out, d_in]);
        let slices = k_slices(d_in);
        let blocks = row_blocks(d_out, d_in)
            .into_iter()
            .map(|(r0, r1)| {
                let rows = weight_t.clone().narrow(0, r0, r1 - r0);
                RowBlock {
                    r0,
                    r1,
                    slices: slices
                        .iter()
                        .map(|&(k0, k1)| (rows.clone().narrow(1, k0, k1 - k0), k0, k1))
                        .collect(),
                }
            })
            .collect();
        Self {
            blocks,
            bias: None,
            d_in,
            d_out,
        }
    }

    /// Wraps `W`, given row-major `[d_in, d_out]` (Burn's `Linear` layout).
    pub(crate) fn new(
        weight: Vec<f32>,
        d_in: usize,
        d_out: usize,
        bias: Option<Vec<f32>>,
        device: &Device,
    ) -> Self {
        Self::from_transposed(transpose(&weight, d_in, d_out), d_in, d_out, bias, device)
    }

    /// `(X · W + bias)ᵀ = Wᵀ · Xᵀ (+ bias)` for transposed activations `xt` (`[d_in, cols]`),
    /// returned transposed (`[d_out, cols]`).
    ///
    /// A single column is padded with a zero column: for one column `gemm` switches to a
    /// matrix-vector kernel whose summation order differs from its matrix-matrix kernel, which
    /// would break batch invariance. From two columns on, each output column is bit-identical
    /// whatever the column count (checked by the tests).
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] if Flex hands back something other than f32 (a bug).
    pub(crate) fn forward(&self, xt: Vec<f32>, cols: usize) -> Result<Product> {
        debug_assert_eq!(xt.len(), cols * self.d_in);
        let (mut xt, padded) = if cols == 1 {
            (xt.iter().flat_map(|&x| [x, 0.0]).collect(), 2)
        } else {
            (xt, cols)
        };
        // One input tensor per inner slice, shared by the row blocks.
        let slices = &self.blocks.first().map_or(&[][..], |b| &b.slices[..]);
        let device = slices
            .first()
            .map_or_else(Device::flex, |(w, _, _)| w.device());
        let inputs: Vec<Tensor<2>> = slices
            .iter()
            .map(|&(_, k0, k1)| {
                let data = if slices.len() == 1 {
                    std::mem::take(&mut xt)
                } else {
                    xt[k0 * padded..k1 * padded].to_vec()
                };
                Tensor::from_data(TensorData::new(data, [k1 - k0, padded]), &device)
            })
            .collect();
        let block_product = |block: &RowBlock| -> Result<Product> {
            let mut acc: Option<Product> = None;
            for ((w, _, _), x) in block.slices.iter().zip(&inputs) {
                let part = Product(w.clone().matmul(x.clone()).into_data());
                match &mut acc {
                    None => acc = Some(part),
                    Some(acc) => add_in_place(acc.values_mut()?, part.values()?),
                }
            }
            acc.ok_or_else(|| BackendError::InvalidInput("GEMM without weights".into()))
        };
        let mut y = if self.blocks.len() == 1 {
            block_product(&self.blocks[0])?
        } else {
            let parts = self
                .blocks
                .par_iter()
                .map(block_product)
                .collect::<Result<Vec<_>>>()?;
            let mut all = Vec::with_capacity(self.d_out * padded);
            for (block, part) in self.blocks.iter().zip(&parts) {
                debug_assert_eq!(part.values()?.len(), (block.r1 - block.r0) * padded);
                all.extend_from_slice(part.values()?);
            }
            Product(TensorData::new(all, [self.d_out, padded]))
        };
        if padded != cols {
            let column: Vec<f32> = y.values()?.iter().step_by(padded).copied().collect();
            y = Product(TensorData::new(column, [self.d_out, 1]));
        }
        if let Some(bias) = &self.bias {
            for (row, b) in y.values_mut()?.chunks_exact_mut(cols).zip(bias) {
                for v in row {
                    *v += b;
                }
            }
        }
        Ok(y)
    }
}

/// The result of a [`Gemm`]: `[d_out, cols]`, row-major, f32.
#[derive(Debug)]
pub(crate) struct Product(TensorData);

impl Product {
    /// The values.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] if Flex produced another dtype than f32 (a bug).
    pub(crate) fn values(&self) -> Result<&[f32]> {
        self.0
            .as_slice::<f32>()
            .map_err(|e| BackendError::InvalidInput(format!("cannot read a GEMM back: {e:?}")))
    }

    /// The values, mutable.
    ///
    /// # Errors
    /// As [`Product::values`].
    pub(crate) fn values_mut(&mut self) -> Result<&mut [f32]> {
        self.0
            .as_mut_slice::<f32>()
            .map_err(|e| BackendError::InvalidInput(format!("cannot read a GEMM back: {e:?}")))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::engine::cpu::uniform;

    #[test]
    fn gemm_matches_a_hand_product() {
        let device = Device::flex();
        let w = vec![1., 2., 3., 4., 5., 6.]; // [2, 3]
        let g = Gemm::new(w, 2, 3, Some(vec![0.5, 0., 0.]), &device);
        // Tokens (1, 1) and (2, 0), transposed.
        let y = g.forward(vec![1., 2., 1., 0.], 2).unwrap();
        assert_eq!(y.values().unwrap(), [5.5, 2.5, 7., 4., 9., 6.]);
        let y = g.forward(vec![1., 1.], 1).unwrap();
        assert_eq!(y.values().unwrap(), [5.5, 7., 9.]);
    }

    /// Each output column is bit-identical whatever the column count, including one column
    /// (padded) and inner dimensions above gemm's 512-wide depth blocks.
    #[test]
    fn gemm_columns_do_not_depend_on_the_column_count() {
        let device = Device::flex();
        let mut rnd = uniform(12345);
        for (k, n) in [(1408usize, 96usize), (352, 128), (128, 704), (96, 64)] {
            let w: Vec<f32> = (0..k * n).map(|_| rnd()).collect();
            let g = Gemm::new(w, k, n, None, &device);
            let x: Vec<f32> = (0..70 * k).map(|_| rnd()).collect(); // [70 tokens, k]
            let alone: Vec<Vec<f32>> = (0..70)
                .map(|t| {
                    let y = g.forward(x[t * k..(t + 1) * k].to_vec(), 1).unwrap();
                    y.values().unwrap().to_vec()
                })
                .collect();
            for m in [2, 3, 5, 7, 16, 33, 70] {
                let y = g.forward(transpose(&x[..m * k], m, k), m).unwrap();
                let y = transpose(y.values().unwrap(), n, m);
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
