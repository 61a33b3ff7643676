//! HF `rotate_half` rotary embedding of one head at a time, from the model's inverse frequencies
//! ([`Rope::inv_freq`](crate::models::Rope::inv_freq)), with angles computed in f32 as HF does.

/// `cos` and `sin` of `pos · inv_freq` (the first half of HF's duplicated table; the second half
/// is identical), appended to `cos` and `sin`.
pub(crate) fn rope_angles(pos: usize, inv_freq: &[f32], cos: &mut Vec<f32>, sin: &mut Vec<f32>) {
    let p = pos as f32;
    for f in inv_freq {
        let angle = p * f;
        cos.push(angle.cos());
        sin.push(angle.sin());
    }
}

/// HF `rotate_half` RoPE of one head in place: `x * cos + rotate_half(x) * sin`, pairs
/// `(i, i + d/2)`.
pub(crate) fn rope_in_place(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    let (x1, x2) = x.split_at_mut(half);
    for (((a, b), c), s) in x1.iter_mut().zip(x2.iter_mut()).zip(cos).zip(sin) {
        let (u, v) = (*a, *b);
        *a = u * c + (-v) * s;
        *b = v * c + u * s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::Rope;

    #[test]
    fn rope_rotates_pairs_half_apart() {
        let rope = Rope::new(4, 10000.0);
        let inv = rope.inv_freq();
        let (mut c, mut s) = (Vec::new(), Vec::new());
        rope_angles(0, inv, &mut c, &mut s);
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        rope_in_place(&mut x, &c, &s);
        assert_eq!(x, vec![1.0, 2.0, 3.0, 4.0], "position 0 is the identity");
        let (mut c, mut s) = (Vec::new(), Vec::new());
        rope_angles(3, inv, &mut c, &mut s);
        let mut x = vec![1.0, 0.0, 0.0, 0.0];
        rope_in_place(&mut x, &c, &s);
        assert!((x[0] - 3.0f32.cos()).abs() < 1e-6 && (x[2] - 3.0f32.sin()).abs() < 1e-6);
    }
}
