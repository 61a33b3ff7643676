//! GEMMs of the fused training path, on row-major `f32` slices through roll's CPU GEMM
//! ([`crate::engine::cpu::gemm`]), the one the decoder runs: no tensors, no copies around the
//! products, and a transposed operand read through its strides.

pub(crate) use crate::engine::cpu::gemm::{Init, MatRef, PackedB, matmul};
pub(crate) use crate::engine::cpu::matrix::add_in_place;

/// An owned row-major matrix.
#[derive(Debug, Clone)]
pub(crate) struct Mat {
    pub values: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
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
    let mut c = vec![0.0; a.rows() * b.n()];
    matmul(&mut c, a, b, Init::Overwrite);
    c
}

/// `C += A·B`: a gradient added where it accumulates.
pub(crate) fn add_mul(c: &mut [f32], a: MatRef<'_>, b: MatRef<'_>) {
    matmul(c, a, &PackedB::new(b), Init::Accumulate);
}

/// The bias gradient: the column sums of `dy` (`[rows, width]`), added to `into`.
pub(crate) fn add_column_sums(into: &mut [f32], dy: &[f32]) {
    for row in dy.chunks_exact(into.len()) {
        for (g, d) in into.iter_mut().zip(row) {
            *g += d;
        }
    }
}
