//! Helpers shared by the unit tests.

/// Asserts equal lengths and element-wise agreement within 1e-5 (the tolerance every
/// hand-computed expectation in this crate is checked to).
pub(crate) fn assert_close(actual: &[f32], expected: &[f32]) {
    assert_eq!(actual.len(), expected.len(), "{actual:?} != {expected:?}");
    for (a, e) in actual.iter().zip(expected) {
        assert!((a - e).abs() < 1e-5, "{actual:?} != {expected:?}");
    }
}

/// The values of a `[B, T]` float tensor, row-major.
#[cfg(feature = "tensor")]
pub(crate) fn floats(t: burn::tensor::Tensor<2>) -> Vec<f32> {
    t.into_data().try_into_vec::<f32>().unwrap()
}

/// The values of an optional `[B, T]` bool tensor (which must be present), row-major.
#[cfg(feature = "tensor")]
pub(crate) fn bools(t: Option<burn::tensor::Tensor<2, burn::tensor::Bool>>) -> Vec<bool> {
    t.unwrap().into_data().try_into_vec::<bool>().unwrap()
}
