//! Linear layers applied as plain 2-D matrix products.

use burn::nn::Linear;
use burn::tensor::Tensor;

/// `x · W (+ b)` of a [`Linear`] layer on a matrix of rows, as one 2-D GEMM.
///
/// The same arithmetic as [`Linear::forward`], spelled out so that the forward and above all
/// the backward pass (`dx = dy · Wᵀ`, `dW = xᵀ · dy`) run as plain 2-D matrix products.
///
/// # Shapes
/// - `x`: `[rows, d_in]`
/// - output: `[rows, d_out]`
pub fn linear_rows(linear: &Linear, x: Tensor<2>) -> Tensor<2> {
    let y = x.matmul(linear.weight.val());
    match &linear.bias {
        Some(bias) => y + bias.val().unsqueeze_dim(0),
        None => y,
    }
}
