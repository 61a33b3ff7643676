//! Row-major f32 matrices held as flat slices: the transpose that moves activations between the
//! token-major and the transposed (`[features, tokens]`) layout, and the residual add.

/// `x += y` elementwise (the residual connection).
pub(crate) fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// The transpose of a row-major `[rows, cols]` matrix.
///
/// Works through tiles of [`TILE`] rows, writing each output row's piece contiguously: writing
/// straight down a column would touch `cols` lines spaced `rows · 4` bytes apart, which alias in
/// the L1 cache when `rows` is a multiple of 1024.
pub(crate) fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; m.len()];
    if rows == 0 || cols == 0 {
        return t;
    }
    for (tile, src) in m.chunks(TILE * cols).enumerate() {
        let r0 = tile * TILE;
        let n = src.len() / cols;
        for (c, dst) in t.chunks_exact_mut(rows).enumerate() {
            for (d, row) in dst[r0..r0 + n].iter_mut().zip(src.chunks_exact(cols)) {
                *d = row[c];
            }
        }
    }
    t
}

/// Rows per tile of [`transpose`].
const TILE: usize = 64;
