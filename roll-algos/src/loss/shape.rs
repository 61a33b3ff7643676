//! Shape checks and device reads shared by the tensor losses and the tensor KL estimator
//! (crate-private).
//!
//! Before touching a tensor every public tensor function compares shapes, naming the input that is
//! wrong; metrics are read back from the device without panicking.

use burn::tensor::Tensor;

use crate::{AlgoError, Result};

/// `Ok(())` when `actual == expected`, else [`AlgoError::ShapeMismatch`] naming `what`.
pub(crate) fn expect_shape<const D: usize>(
    what: &'static str,
    actual: [usize; D],
    expected: [usize; D],
) -> Result<()> {
    if actual == expected {
        Ok(())
    } else {
        Err(AlgoError::ShapeMismatch {
            what,
            expected: expected.to_vec(),
            actual: actual.to_vec(),
        })
    }
}

/// `[B, T]` of a per-token tensor, rejecting an empty batch (`B = 0` or `T = 0`).
pub(crate) fn batch_dims(what: &'static str, tensor: &Tensor<2>) -> Result<[usize; 2]> {
    let dims = tensor.dims();
    if dims[0] == 0 || dims[1] == 0 {
        return Err(AlgoError::Empty(what));
    }
    Ok(dims)
}

/// Reads a 1-D tensor back to the host as `f32` (one device sync).
pub(crate) fn read_f32s(what: &'static str, tensor: Tensor<1>) -> Result<Vec<f32>> {
    tensor
        .try_into_vec_as::<f32>()
        .map_err(|e| AlgoError::TensorRead {
            what,
            message: e.to_string(),
        })
}
