//! GEMMs of the fused training path, on row-major `f32` slices through roll's CPU GEMM
//! ([`crate::engine::cpu::gemm`]), the one the decoder runs: no tensors, no copies around the
//! products, and a transposed operand read through its strides.

pub(crate) use crate::engine::cpu::gemm::{Init, MatRef, PackedA, PackedB, matmul, matmul_packed};
pub(crate) use crate::engine::cpu::matrix::add_in_place;
use crate::engine::cpu::scratch;
use std::ops::Range;

/// An owned row-major matrix.
#[derive(Debug, Clone)]
pub(crate) struct Mat {
    pub values: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
}

/// Its values go back to the pool ([`scratch`]): the tape's matrices are a step's activations.
impl Drop for Mat {
    fn drop(&mut self) {
        scratch::recycle(std::mem::take(&mut self.values));
    }
}

impl Mat {
    /// `values` as a `rows × cols` matrix.
    pub(crate) fn new(values: Vec<f32>, rows: usize, cols: usize) -> Self {
        debug_assert_eq!(values.len(), rows * cols);
        Self { values, rows, cols }
    }

    /// A view of it.
    pub(crate) fn view(&self) -> MatRef<'_> {
        MatRef::row_major(&self.values, self.rows, self.cols)
    }

    /// Its shape, as a gradient is registered.
    pub(crate) fn dims(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }
}

/// `A·B`, `B` packed for this product.
pub(crate) fn mul(a: MatRef<'_>, b: MatRef<'_>) -> Vec<f32> {
    mul_packed(a, &PackedB::new(b))
}

/// `A·B` for a `B` packed once (a weight read by many products).
pub(crate) fn mul_packed(a: MatRef<'_>, b: &PackedB) -> Vec<f32> {
    let mut c = scratch::overwritten(a.rows() * b.n());
    matmul(&mut c, a, b, Init::Overwrite);
    c
}

/// `C += A·B`: a gradient added where it accumulates.
pub(crate) fn add_mul(c: &mut [f32], a: MatRef<'_>, b: MatRef<'_>) {
    matmul(c, a, &PackedB::new(b), Init::Accumulate);
}

/// The columns `cols` of a row-major matrix of `width` columns, as a row-major matrix of their
/// own.
pub(crate) fn columns(values: &[f32], width: usize, cols: Range<usize>) -> Vec<f32> {
    values
        .chunks_exact(width)
        .flat_map(|row| &row[cols.clone()])
        .copied()
        .collect()
}

/// The bias gradient: the sums over the tokens of `dy`'s columns `cols`, added to `into`.
pub(crate) fn add_column_sums(into: &mut [f32], dy: OutputGrad<'_>, cols: Range<usize>) {
    match dy {
        OutputGrad::Rows { values, width } => {
            for row in values.chunks_exact(width) {
                add_in_place(into, &row[cols.clone()]);
            }
        }
        OutputGrad::Cols { values, tokens } => {
            for (sum, row) in into
                .iter_mut()
                .zip(values.chunks_exact(tokens.max(1)).skip(cols.start))
            {
                *sum += row.iter().sum::<f32>();
            }
        }
    }
}

/// The gradient of a projection's output, in either layout the backward produces it in.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OutputGrad<'a> {
    /// Per token: `[tokens, width]`.
    Rows { values: &'a [f32], width: usize },
    /// Transposed: `[width, tokens]` (as the decoder keeps activations).
    Cols { values: &'a [f32], tokens: usize },
}

impl<'a> OutputGrad<'a> {
    /// Tokens.
    pub(crate) fn tokens(&self) -> usize {
        match *self {
            Self::Rows { values, width } => values.len() / width.max(1),
            Self::Cols { tokens, .. } => tokens,
        }
    }

    /// As a `[tokens, width]` matrix (a strided view of a transposed one).
    pub(crate) fn view(&self) -> MatRef<'a> {
        match *self {
            Self::Rows { values, width } => MatRef::row_major(values, self.tokens(), width),
            Self::Cols { values, tokens } => {
                MatRef::row_major(values, values.len() / tokens.max(1), tokens).t()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_sums_and_views_agree_in_both_layouts() {
        // Three tokens, four columns; `cols` the middle two.
        let rows = [
            1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0,
        ];
        let cols_major = [
            1.0, 5.0, 9.0, 2.0, 6.0, 10.0, 3.0, 7.0, 11.0, 4.0, 8.0, 12.0,
        ];
        let by_rows = OutputGrad::Rows {
            values: &rows,
            width: 4,
        };
        let by_cols = OutputGrad::Cols {
            values: &cols_major,
            tokens: 3,
        };
        for dy in [by_rows, by_cols] {
            let mut sums = vec![0.5; 2];
            add_column_sums(&mut sums, dy, 1..3);
            assert_eq!(sums, [2.0 + 6.0 + 10.0 + 0.5, 3.0 + 7.0 + 11.0 + 0.5]);
            assert_eq!(dy.tokens(), 3);
            let product = mul(
                dy.view().columns(1..3),
                MatRef::row_major(&[1.0, 10.0], 2, 1),
            );
            assert_eq!(product, [32.0, 76.0, 120.0]);
        }
        assert_eq!(columns(&rows, 4, 1..3), [2.0, 3.0, 6.0, 7.0, 10.0, 11.0]);
    }
}
