//! Importance ratios between the current policy and the policy that produced the samples.

use super::config::policy_loss::RatioLevel;
use super::masked::{row_mean, zero_untrained};
use super::shape::{batch_dims, expect_shape};
use crate::Result;
use burn::tensor::{Bool, IndexingUpdateOp, Int, Tensor};

/// Log-ratio on trained tokens, zero elsewhere: `ℓ_bt = (logp_bt − old_bt)·m_bt`.
///
/// # Shapes
/// `logp`, `old_logp`, `mask`: `[B, T]` → `[B, T]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree.
pub fn log_ratio(logp: Tensor<2>, old_logp: Tensor<2>, mask: Tensor<2, Bool>) -> Result<Tensor<2>> {
    let dims = batch_dims("logp", &logp)?;
    expect_shape("old_logp", old_logp.dims(), dims)?;
    expect_shape("loss mask", mask.dims(), dims)?;
    Ok(zero_untrained(logp - old_logp, mask))
}

/// Token-level ratio: `r_bt = exp((logp_bt − old_bt)·m_bt)`, i.e. `1` on untrained tokens.
///
/// # Shapes
/// `logp`, `old_logp`, `mask`: `[B, T]` → `[B, T]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree.
pub fn token_ratio(
    logp: Tensor<2>,
    old_logp: Tensor<2>,
    mask: Tensor<2, Bool>,
) -> Result<Tensor<2>> {
    Ok(log_ratio(logp, old_logp, mask)?.exp())
}

/// Sequence-level ratio (GSPO): `r_b = exp(Σ_t m_bt·(logp_bt − old_bt) / max(n_b, 1))` broadcast
/// to every token of sequence `b` (`1` for a sequence without trained tokens).
///
/// The gradient reaches every trained token of the sequence: `∂r_b/∂logp_bt = r_b·m_bt / n_b`.
///
/// # Shapes
/// `logp`, `old_logp`, `mask`: `[B, T]` → `[B, T]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree.
pub fn sequence_ratio(
    logp: Tensor<2>,
    old_logp: Tensor<2>,
    mask: Tensor<2, Bool>,
) -> Result<Tensor<2>> {
    let [_, t] = logp.dims();
    let l = log_ratio(logp, old_logp, mask.clone())?;
    Ok(row_mean(l, mask).exp().repeat_dim(1, t))
}

/// Segment-level ratio (ROLL's agentic `ratio_type = "segment"`): one ratio per segment, the
/// geometric mean of its token ratios, broadcast to the segment's tokens,
///
/// ```text
/// r_bt = exp(Σ_{u ∈ S} (logp_bu − old_bu) / |S|)   for t in segment S of row b
/// r_bt = 1                                          on untrained tokens
/// ```
///
/// where the segments of a row are the maximal runs of trained tokens (the assistant turns of a
/// trajectory; [`segments`](crate::advantage::segments) on the host). Segments never share a
/// ratio, even in the same row; a row of one segment gets GSPO's [`sequence_ratio`]. The gradient
/// reaches every token of the segment: `∂r_bt/∂logp_bu = r_bt / |S|` for `u ∈ S`, 0 elsewhere.
/// ROLL's `compute_segment_masked_mean`, computed on the device without reading the mask back:
/// each trained token gets the bin `b·T + k − 1` of its row's `k`-th segment (a cumulative sum
/// of segment starts), untrained tokens a spare bin holding 0; the log-ratios are summed and
/// counted per bin and the bin means gathered back.
///
/// # Shapes
/// `logp`, `old_logp`, `mask`: `[B, T]` → `[B, T]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree,
/// [`AlgoError::Empty`](crate::AlgoError::Empty) for an empty batch.
pub fn segment_ratio(
    logp: Tensor<2>,
    old_logp: Tensor<2>,
    mask: Tensor<2, Bool>,
) -> Result<Tensor<2>> {
    let [b, t] = logp.dims();
    // Fails on an empty batch, so `t ≥ 1` below.
    let l = log_ratio(logp, old_logp, mask.clone())?;
    let device = l.device();
    let bins = b * t;
    let m = mask.clone().int();
    let before = Tensor::cat(
        vec![
            Tensor::<2, Int>::zeros([b, 1], &device),
            m.clone().slice([0..b, 0..t - 1]),
        ],
        1,
    );
    // 1 where a segment starts; its running count numbers the segments of the row from 1.
    let number = (m - before).clamp_min(0).cumsum(1);
    let row_start = Tensor::<1, Int>::arange(0..b as i64, &device)
        .mul_scalar(t as i64)
        .unsqueeze_dim::<2>(1);
    let bin = (number - 1 + row_start)
        .mask_fill(mask.clone().bool_not(), bins as i64)
        .reshape([bins]);
    let per_bin = |x: Tensor<2>| {
        Tensor::<1>::zeros([bins + 1], &device).select_assign(
            0,
            bin.clone(),
            x.reshape([bins]),
            IndexingUpdateOp::Add,
        )
    };
    let mean = per_bin(l) / per_bin(mask.float()).clamp_min(1.0);
    Ok(mean.select(0, bin).reshape([b, t]).exp())
}

/// The ratio at the chosen granularity: [`token_ratio`], [`segment_ratio`] or [`sequence_ratio`].
///
/// # Shapes
/// `logp`, `old_logp`, `mask`: `[B, T]` → `[B, T]`.
///
/// # Errors
/// [`AlgoError::ShapeMismatch`](crate::AlgoError::ShapeMismatch) if the shapes disagree.
pub fn importance_ratio(
    level: RatioLevel,
    logp: Tensor<2>,
    old_logp: Tensor<2>,
    mask: Tensor<2, Bool>,
) -> Result<Tensor<2>> {
    match level {
        RatioLevel::Token => token_ratio(logp, old_logp, mask),
        RatioLevel::Segment => segment_ratio(logp, old_logp, mask),
        RatioLevel::Sequence => sequence_ratio(logp, old_logp, mask),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::test_util::{assert_close as close, floats as v};
    use burn::tensor::{Device, TensorData};

    #[test]
    fn token_and_sequence_ratios() {
        let dev = Device::flex();
        let logp = Tensor::<2>::from_floats([[-1.0, -2.0, -3.0], [-0.5, -0.5, 7.0]], &dev);
        let old = Tensor::<2>::from_floats([[-1.2, -1.7, -3.0], [-1.0, -0.5, 0.0]], &dev);
        let mask = Tensor::<2, Bool>::from_bool([[true, true, false], [true, false, false]], &dev);
        let tok = v(token_ratio(logp.clone(), old.clone(), mask.clone()).unwrap());
        close(
            &tok,
            &[0.2f32.exp(), (-0.3f32).exp(), 1.0, 0.5f32.exp(), 1.0, 1.0],
        );
        // Row 0: mean log-ratio (0.2 − 0.3)/2 = −0.05; row 1: 0.5 / 1.
        let seq = v(sequence_ratio(logp, old, mask).unwrap());
        let (a, b) = ((-0.05f32).exp(), 0.5f32.exp());
        close(&seq, &[a, a, a, b, b, b]);
    }

    /// `exp` of the segment means of `x` under `mask`, one row: `logp = x`, `old = 0`, and junk
    /// under the mask's zeros that must not be read.
    fn segment_of(mask: &[u8], x: &[f32]) -> Vec<f32> {
        let dev = Device::flex();
        let n = mask.len();
        let m: Vec<bool> = mask.iter().map(|v| *v == 1).collect();
        let logp: Vec<f32> = x
            .iter()
            .zip(&m)
            .map(|(x, m)| if *m { *x } else { f32::NAN })
            .collect();
        let logp = Tensor::<2>::from_data(TensorData::new(logp, [1, n]), &dev);
        let old = Tensor::<2>::zeros([1, n], &dev);
        let mask = Tensor::<2, Bool>::from_data(TensorData::new(m, [1, n]), &dev);
        v(segment_ratio(logp, old, mask).unwrap())
    }

    fn exp(xs: &[f32]) -> Vec<f32> {
        xs.iter().map(|x| x.exp()).collect()
    }

    /// ROLL's `tests/agentic/test_segment_masked_mean.py`: the segment means it expects are the
    /// log of the ratio here (0 → ratio 1 outside every segment).
    #[test]
    fn segment_ratio_reproduces_roll_cases() {
        let cases: [(&[u8], &[f32], &[f32]); 9] = [
            // Single segment: (2 + 4 + 6)/3 = 4.
            (
                &[0, 0, 1, 1, 1, 0, 0],
                &[0., 0., 2., 4., 6., 0., 0.],
                &[0., 0., 4., 4., 4., 0., 0.],
            ),
            // (1 + 2)/2 = 1.5 and (3 + 4 + 5)/3 = 4.
            (
                &[0, 1, 1, 0, 1, 1, 1, 0],
                &[0., 1., 2., 0., 3., 4., 5., 0.],
                &[0., 1.5, 1.5, 0., 4., 4., 4., 0.],
            ),
            // Starts with a segment: (2 + 4)/2 = 3, then 6.
            (
                &[1, 1, 0, 1, 0],
                &[2., 4., 0., 6., 0.],
                &[3., 3., 0., 6., 0.],
            ),
            // Ends with a segment: (2 + 4 + 6)/3 = 4.
            (&[0, 1, 1, 1], &[0., 2., 4., 6.], &[0., 4., 4., 4.]),
            // All trained: (1 + 2 + 3)/3 = 2.
            (&[1, 1, 1], &[1., 2., 3.], &[2., 2., 2.]),
            // Nothing trained.
            (&[0, 0, 0], &[1., 2., 3.], &[0., 0., 0.]),
            // A single trained token.
            (
                &[0, 0, 1, 0, 0],
                &[0., 0., 5., 0., 0.],
                &[0., 0., 5., 0., 0.],
            ),
            // Three segments: 1.5, 4, 6.
            (
                &[1, 1, 0, 0, 1, 1, 1, 0, 1],
                &[1., 2., 0., 0., 3., 4., 5., 0., 6.],
                &[1.5, 1.5, 0., 0., 4., 4., 4., 0., 6.],
            ),
            // Segments are not multiplied together: 1 and 10, not one value for the row.
            (
                &[1, 1, 0, 1, 1],
                &[1., 1., 0., 10., 10.],
                &[1., 1., 0., 10., 10.],
            ),
        ];
        for (mask, x, want) in cases {
            let got = segment_of(mask, x);
            let want = exp(want);
            for (g, w) in got.iter().zip(&want) {
                assert!((g / w - 1.0).abs() < 1e-5, "{mask:?}: {got:?} vs {want:?}");
            }
        }
    }

    #[test]
    fn segment_ratio_batch_rows_are_independent() {
        // ROLL's batch case: row 0 [0,1,1,0] x [0,2,4,0] → 3; row 1 [1,1,0,1] x [1,3,0,5] → 2, 5.
        let dev = Device::flex();
        let logp = Tensor::<2>::from_floats([[0.0, 2.0, 4.0, 0.0], [1.0, 3.0, 0.0, 5.0]], &dev);
        let old = Tensor::<2>::zeros([2, 4], &dev);
        let mask = Tensor::<2, Bool>::from_bool(
            [[false, true, true, false], [true, true, false, true]],
            &dev,
        );
        let got = v(segment_ratio(logp, old, mask).unwrap());
        let want = exp(&[0.0, 3.0, 3.0, 0.0, 2.0, 2.0, 0.0, 5.0]);
        for (g, w) in got.iter().zip(&want) {
            assert!((g / w - 1.0).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn segment_ratio_gradient_stays_in_its_segment() {
        // Log-ratios [0.2, −0.4, junk, 0.3], mask [1, 1, 0, 1]: r₀ = exp(−0.1) on tokens 0–1,
        // r₁ = exp(0.3) on token 3. L = Σ_t w_t·r_t with w = [1, 2, 5, 3]:
        // ∂L/∂logp₀ = ∂L/∂logp₁ = (1 + 2)·r₀/2, ∂L/∂logp₂ = 0, ∂L/∂logp₃ = 3·r₁.
        let dev = Device::flex().autodiff();
        let logp = Tensor::<2>::from_floats([[0.2, -0.4, 7.0, 0.3]], &dev).require_grad();
        let old = Tensor::<2>::from_floats([[0.0, 0.0, f32::NAN, 0.0]], &dev);
        let mask = Tensor::<2, Bool>::from_bool([[true, true, false, true]], &dev);
        let w = Tensor::<2>::from_floats([[1.0, 2.0, 5.0, 3.0]], &dev);
        let r = segment_ratio(logp.clone(), old, mask).unwrap();
        let grads = (r * w).sum().backward();
        let g = v(logp.grad(&grads).unwrap());
        let (r0, r1) = ((-0.1f32).exp(), 0.3f32.exp());
        close(&g, &[1.5 * r0, 1.5 * r0, 0.0, 3.0 * r1]);
    }

    #[test]
    fn segment_ratio_of_an_empty_batch_is_an_error() {
        let dev = Device::flex();
        let empty = Tensor::<2>::zeros([0, 3], &dev);
        let mask = Tensor::<2, Bool>::from_data(TensorData::new(Vec::<bool>::new(), [0, 3]), &dev);
        assert_eq!(
            segment_ratio(empty.clone(), empty, mask).unwrap_err(),
            crate::AlgoError::Empty("logp")
        );
    }

    #[test]
    fn shape_mismatch() {
        let dev = Device::flex();
        let logp = Tensor::<2>::zeros([2, 3], &dev);
        let old = Tensor::<2>::zeros([2, 2], &dev);
        let mask = Tensor::<2, Bool>::from_bool([[true, true, true], [true, true, true]], &dev);
        assert!(matches!(
            token_ratio(logp.clone(), old.clone(), mask.clone()),
            Err(crate::AlgoError::ShapeMismatch {
                what: "old_logp",
                ..
            })
        ));
        assert!(matches!(
            segment_ratio(logp, old, mask),
            Err(crate::AlgoError::ShapeMismatch {
                what: "old_logp",
                ..
            })
        ));
    }
}
