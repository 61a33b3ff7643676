//! Row-major f32 matrices held as flat slices: the transpose that moves activations between the
//! token-major and the transposed (`[features, tokens]`) layout, and the residual add.

use rayon::prelude::*;

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
/// the L1 cache when `rows` is a multiple of 1024. A large matrix's output rows are split into
/// bands written concurrently (a transpose is exact, so the split changes no value).
pub(crate) fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = super::scratch::overwritten(m.len());
    if rows == 0 || cols == 0 {
        return t;
    }
    // Output rows `c0..` of one band.
    let band = |c0: usize, out: &mut [f32]| {
        for (tile, src) in m.chunks(TILE * cols).enumerate() {
            let r0 = tile * TILE;
            let n = src.len() / cols;
            for (c, dst) in out.chunks_exact_mut(rows).enumerate() {
                for (d, row) in dst[r0..r0 + n].iter_mut().zip(src.chunks_exact(cols)) {
                    *d = row[c0 + c];
                }
            }
        }
    };
    if m.len() < PARALLEL_ELEMENTS {
        band(0, &mut t);
    } else {
        let per_band = cols.div_ceil(rayon::current_num_threads().max(1) * 2);
        t.par_chunks_mut(per_band * rows)
            .enumerate()
            .for_each(|(b, out)| band(b * per_band, out));
    }
    t
}

/// Elements from which [`transpose`] runs in bands on several threads.
const PARALLEL_ELEMENTS: usize = 1 << 16;

/// Rows per tile of [`transpose`].
const TILE: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_moves_every_element_small_and_in_bands() {
        // Below and above `PARALLEL_ELEMENTS`, with a column count no band size divides.
        for (rows, cols) in [(3, 5), (70, 1), (300, 701), (1031, 67)] {
            let m: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let t = transpose(&m, rows, cols);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(
                        t[c * rows + r],
                        m[r * cols + c],
                        "{rows}x{cols} at ({r}, {c})"
                    );
                }
            }
            assert_eq!(transpose(&t, cols, rows), m);
        }
    }
}
