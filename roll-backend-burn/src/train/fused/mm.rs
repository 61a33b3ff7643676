//! Row-major GEMMs of the fused training path, through Burn's Flex matmul (the `gemm` crate's
//! packed kernels, run at near peak by Flex; no `unsafe` here).

use crate::{BackendError, Result};
use burn::tensor::{Device, Tensor, TensorData};

/// A row-major `[rows, cols]` activation as a Flex tensor (the values move, they are not copied).
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

/// `A·B` for `a` `[m, k]` and a weight `b` `[k, n]`.
pub(crate) fn mul(a: &[f32], m: usize, b: &Tensor<2>, device: &Device) -> Result<Vec<f32>> {
    let k = b.dims()[0];
    values(tensor(a.to_vec(), m, k, device).matmul(b.clone()))
}

/// `A·Bᵀ` for `a` `[m, n]` and a weight `b` `[k, n]` (the input gradient of `X·B`).
pub(crate) fn mul_t(a: &[f32], m: usize, b: &Tensor<2>, device: &Device) -> Result<Vec<f32>> {
    let n = b.dims()[1];
    values(tensor(a.to_vec(), m, n, device).matmul(b.clone().transpose()))
}

/// `Aᵀ·B` for activations `a` `[m, k]` and `b` `[m, n]` (the weight gradient of `A·W`).
pub(crate) fn t_mul(a: &[f32], b: &[f32], m: usize, device: &Device) -> Result<Vec<f32>> {
    let (k, n) = (a.len() / m.max(1), b.len() / m.max(1));
    let a = tensor(a.to_vec(), m, k, device);
    values(a.transpose().matmul(tensor(b.to_vec(), m, n, device)))
}

/// Adds `bias` to every row of `y` (`[rows, bias.len()]`).
pub(crate) fn add_bias(y: &mut [f32], bias: &[f32]) {
    for row in y.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// The bias gradient: the column sums of `dy` (`[rows, width]`), added to `into`.
pub(crate) fn add_column_sums(into: &mut [f32], dy: &[f32]) {
    for row in dy.chunks_exact(into.len()) {
        for (g, d) in into.iter_mut().zip(row) {
            *g += d;
        }
    }
}

/// `x += y`, element-wise.
pub(crate) fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
