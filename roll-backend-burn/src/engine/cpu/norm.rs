//! HF RMSNorm over f32 slices, with every sum of squares in a fixed order.

/// Accumulators of [`sum_sq`].
const LANES: usize = 8;

/// `Σ xᵢ²` in a fixed order: [`LANES`] strided partial sums, then the lanes left to right, then
/// the tail.
pub(crate) fn sum_sq(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v * v;
        }
    }
    let mut s = acc.iter().fold(0.0f32, |s, a| s + a);
    for v in tail {
        s += v * v;
    }
    s
}

/// An RMSNorm: weight and epsilon (the f32 that Burn adds to an f32 tensor).
#[derive(Debug, Clone)]
pub(crate) struct Norm {
    /// Per-feature scale.
    pub weight: Vec<f32>,
    /// Added to the mean square.
    pub eps: f32,
}

/// HF RMSNorm of one vector in place: `x = weight * (x * (1 / sqrt(mean(x²) + eps)))`.
pub(crate) fn rms_norm_in_place(x: &mut [f32], norm: &Norm) {
    let inv = 1.0 / (sum_sq(x) / x.len() as f32 + norm.eps).sqrt();
    for (v, w) in x.iter_mut().zip(&norm.weight) {
        *v = w * (*v * inv);
    }
}

/// HF RMSNorm of every column of `xt` (`[norm.weight.len(), cols]`) into a new buffer of that
/// shape. Each column's sum of squares runs over the features in order, so it does not depend on
/// `cols`.
pub(crate) fn rms_norm_cols(xt: &[f32], cols: usize, norm: &Norm) -> Vec<f32> {
    rms_norm_cols_keeping_roots(xt, cols, norm).0
}

/// [`rms_norm_cols`], and each column's reciprocal root `1/√(mean(x²) + eps)`.
pub(crate) fn rms_norm_cols_keeping_roots(
    xt: &[f32],
    cols: usize,
    norm: &Norm,
) -> (Vec<f32>, Vec<f32>) {
    let width = norm.weight.len();
    let mut ss = vec![0.0f32; cols];
    for row in xt.chunks_exact(cols) {
        for (s, v) in ss.iter_mut().zip(row) {
            *s += v * v;
        }
    }
    let inv: Vec<f32> = ss
        .iter()
        .map(|s| 1.0 / (s / width as f32 + norm.eps).sqrt())
        .collect();
    let mut out = super::scratch::overwritten(xt.len());
    for ((o, row), w) in out
        .chunks_exact_mut(cols)
        .zip(xt.chunks_exact(cols))
        .zip(&norm.weight)
    {
        for ((o, v), i) in o.iter_mut().zip(row).zip(&inv) {
            *o = w * (v * i);
        }
    }
    (out, inv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cpu::matrix::transpose;
    use crate::engine::cpu::uniform;

    #[test]
    fn norms_match_the_textbook_formula() {
        let mut rnd = uniform(3);
        let x: Vec<f32> = (0..37).map(|_| rnd()).collect();
        let naive: f32 = x.iter().map(|a| a * a).sum();
        assert!((sum_sq(&x) - naive).abs() < 1e-5);
        // Columns of a [37, 3] matrix against the one-vector norm.
        let norm = Norm {
            weight: (0..37).map(|_| rnd()).collect(),
            eps: 1e-6,
        };
        let cols: Vec<Vec<f32>> = (0..3).map(|_| (0..37).map(|_| rnd()).collect()).collect();
        let xt = transpose(&cols.concat(), 3, 37);
        let normed = rms_norm_cols(&xt, 3, &norm);
        for (c, col) in cols.iter().enumerate() {
            let mut want = col.clone();
            rms_norm_in_place(&mut want, &norm);
            for (i, want) in want.iter().enumerate() {
                assert!((normed[i * 3 + c] - want).abs() < 1e-5);
            }
        }
    }
}
