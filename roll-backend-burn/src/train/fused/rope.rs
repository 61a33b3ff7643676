//! HF rotary embeddings (`rotate_half`) applied in place, and their transpose for the backward.
//!
//! For pair `i < d/2` at position `p`, angle `θ = p·inv_freq[i]`:
//! `(a, b) → (a·cos θ − b·sin θ, b·cos θ + a·sin θ)` on elements `(i, i + d/2)` of each head. The
//! backward applies the inverse rotation (angle `−θ`).

/// The cosines and sines of every position `0..len` (`[len, d/2]` each).
pub(crate) fn tables(len: usize, inv_freq: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut cos = Vec::with_capacity(len * inv_freq.len());
    let mut sin = Vec::with_capacity(len * inv_freq.len());
    for p in 0..len {
        for &f in inv_freq {
            let angle = p as f32 * f;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    (cos, sin)
}

/// Rotates the heads in the first `rotated` columns of each row of `x` (`[tokens, width]`) whose
/// token sits at `positions[t]`, leaving the other columns; `inverse` rotates by `−θ` (the
/// backward).
pub(crate) fn rotate(
    x: &mut [f32],
    rotated: usize,
    positions: &[usize],
    head_dim: usize,
    cos: &[f32],
    sin: &[f32],
    inverse: bool,
) {
    let half = head_dim / 2;
    let width = x.len() / positions.len().max(1);
    let sign = if inverse { -1.0 } else { 1.0 };
    for (row, &p) in x.chunks_exact_mut(width).zip(positions) {
        let (c, s) = (
            &cos[p * half..(p + 1) * half],
            &sin[p * half..(p + 1) * half],
        );
        for head in row[..rotated].chunks_exact_mut(head_dim) {
            let (a, b) = head.split_at_mut(half);
            for i in 0..half {
                let (x1, x2, si) = (a[i], b[i], sign * s[i]);
                a[i] = x1 * c[i] - x2 * si;
                b[i] = x2 * c[i] + x1 * si;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::fused::testing::{check_gradient, random};

    #[test]
    fn the_inverse_rotation_is_the_backward() {
        // Two rotated heads, then one that is not (as the values beside queries and keys).
        let (d, heads) = (8, 3);
        let rotated = 2 * d;
        let positions = [0, 3, 7];
        let inv_freq: Vec<f32> = (0..d / 2)
            .map(|i| 1.0 / 10_000f32.powf(2.0 * i as f32 / d as f32))
            .collect();
        let (cos, sin) = tables(8, &inv_freq);
        let x = random(positions.len() * heads * d, 4);
        let w = random(x.len(), 5);
        let loss = |x: &[f32]| -> f64 {
            let mut y = x.to_vec();
            rotate(&mut y, rotated, &positions, d, &cos, &sin, false);
            y.iter().zip(&w).map(|(a, b)| f64::from(a * b)).sum()
        };
        let mut dx = w.clone();
        rotate(&mut dx, rotated, &positions, d, &cos, &sin, true);
        check_gradient(&x, &dx, loss);
        // The column past `rotated` passes through: its gradient is the loss's weight.
        for (t, row) in dx.chunks_exact(heads * d).enumerate() {
            assert_eq!(
                row[rotated..],
                w[t * heads * d + rotated..(t + 1) * heads * d]
            );
        }
    }
}
