//! Row-major GEMMs of the fused training path, through Burn's Flex matmul (the `gemm` crate's
//! packed kernels, run at near peak by Flex; no `unsafe` here).

use crate::{BackendError, Result};
use burn::tensor::{Device, Tensor, TensorData};

/// A row-major `[rows, cols]` activation as a Flex tensor (the values move, they are not copied).
///
/// Activations that only feed GEMMs live as tensors from the moment they are made: a tensor's
/// clone shares its buffer, so the three projections of one input (and, in the backward, the
/// weight and input gradients of one output gradient) read one copy.
pub(crate) fn tensor(values: Vec<f32>, rows: usize, cols: usize, device: &Device) -> Tensor<2> {
    debug_assert_eq!(values.len(), rows * cols);
    Tensor::from_data(TensorData::new(values, [rows, cols]), device)
}

/// A tensor's values, row-major.
///
/// # Errors
/// [`BackendError::Train`] if Flex hands back something other than f32 (a bug).
pub(crate) fn values(t: Tensor<2>) -> Result<Vec<f32>> {
    t.into_data()
        .try_into_vec::<f32>()
        .map_err(|e| BackendError::Train(format!("fused path: cannot read a product: {e:?}")))
}

/// `A·B` for an activation `a` `[m, k]` and a weight `b` `[k, n]`.
pub(crate) fn mul(a: &Tensor<2>, b: &Tensor<2>) -> Result<Vec<f32>> {
    values(a.clone().matmul(b.clone()))
}

/// `A·Bᵀ` for `a` `[m, n]` and a weight `b` `[k, n]` (the input gradient of `X·B`).
pub(crate) fn mul_t(a: &Tensor<2>, b: &Tensor<2>) -> Result<Vec<f32>> {
    values(a.clone().matmul(b.clone().transpose()))
}

/// `Aᵀ·B` for activations `a` `[m, k]` and `b` `[m, n]` (the weight gradient of `A·W`).
pub(crate) fn t_mul(a: &Tensor<2>, b: &Tensor<2>) -> Result<Vec<f32>> {
    values(a.clone().transpose().matmul(b.clone()))
}

/// The bias gradient: the column sums of `dy` (`[rows, width]`), added to `into`.
pub(crate) fn add_column_sums(into: &mut [f32], dy: &[f32]) {
    for row in dy.chunks_exact(into.len()) {
        for (g, d) in into.iter_mut().zip(row) {
            *g += d;
        }
    }
}

pub(crate) use crate::engine::cpu::matrix::add_in_place;
