//! The micro-kernels: one `R × NR` tile of `C` (`R ≤ MR` rows, [`NR`] columns) updated by a
//! packed `A` panel times a packed `B` panel, as chains of fused multiply-adds.
//!
//! Every output element is `c ← fma(a_k, b_k, c)` for `k = 0, 1, …` in order: the AVX-512 kernel
//! holds a row of two tiles (32 columns) in two 16-lane registers, for up to twelve rows, the AVX2 kernel a tile's 16
//! columns in two 8-lane registers, the portable kernel one `f32` at a time with
//! [`f32::mul_add`], and all round exactly the same way — one rounding per step of the chain. So
//! the bits of an element depend only on its own row of `A`, column of `B` and starting value,
//! never on the tile, the machine's vector width or the thread that computes it.

/// Rows of `A` per packed panel, and the most rows a tile has.
pub(crate) const MR: usize = 6;
/// Columns of `B` per packed panel: the width of every tile (two AVX2 registers).
pub(crate) const NR: usize = 16;

/// Computes one tile: `acc[r][j] ← fma(a[k·MR + r], b[k·NR + j], acc[r][j])` for each `k` in
/// order, `r < R`, `j < NR`. `a` holds `kc` steps of [`MR`] values, `b` `kc` steps of [`NR`].
pub(crate) trait MicroKernel: Copy {
    /// One tile of `R` rows.
    fn tile<const R: usize>(self, a: &[f32], b: &[f32], acc: &mut [[f32; NR]; R]);

    /// Two tiles side by side, `acc[r][..NR]` over panel `b0` and `acc[r][NR..]` over `b1`, both
    /// from the same `a`: the chains of two [`Self::tile`] calls, which is what this does unless
    /// the kernel has the registers to run them together.
    #[inline(always)]
    fn tile_pair<const R: usize>(
        self,
        a: &[f32],
        (b0, b1): (&[f32], &[f32]),
        acc: &mut [[[f32; NR]; 2]; R],
    ) {
        let mut halves: [[[f32; NR]; R]; 2] =
            core::array::from_fn(|h| core::array::from_fn(|r| acc[r][h]));
        self.tile(a, b0, &mut halves[0]);
        self.tile(a, b1, &mut halves[1]);
        for (r, row) in acc.iter_mut().enumerate() {
            *row = [halves[0][r], halves[1][r]];
        }
    }

    /// Two whole `A` panels over a pair of tiles: `acc[..MR]` from `a0`'s rows, `acc[MR..]` from
    /// `a1`'s, each over `b0` (columns `..NR`) and `b1` (`NR..`) — the chains of two
    /// [`Self::tile_pair`] calls, which is what this does unless the kernel has the registers
    /// to run all four tiles together.
    #[inline(always)]
    fn tile_quad(
        self,
        (a0, a1): (&[f32], &[f32]),
        b: (&[f32], &[f32]),
        acc: &mut [[[f32; NR]; 2]; 2 * MR],
    ) {
        for (a, rows) in [(a0, 0), (a1, MR)] {
            let mut half: [[[f32; NR]; 2]; MR] = core::array::from_fn(|r| acc[rows + r]);
            self.tile_pair::<MR>(a, b, &mut half);
            acc[rows..rows + MR].copy_from_slice(&half);
        }
    }
}

/// The portable kernel: one scalar fused multiply-add per element and step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Portable;

impl MicroKernel for Portable {
    #[inline(always)]
    fn tile<const R: usize>(self, a: &[f32], b: &[f32], acc: &mut [[f32; NR]; R]) {
        for (ak, bk) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
            for (row, &ar) in acc.iter_mut().zip(ak) {
                for (c, &bj) in row.iter_mut().zip(bk) {
                    *c = ar.mul_add(bj, *c);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::Avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) use avx512::Avx512;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{MR, MicroKernel, NR};
    use pulp::f32x16;
    use pulp::x86::V4;

    /// The AVX-512 kernel (x86-64-v4): a tile's row is one 16-lane register, and a pair of
    /// tiles keeps `2·R` of the 32 registers accumulating — twelve independent chains for six
    /// rows, enough to keep both fused multiply-add units busy through their latency (the AVX2
    /// kernel's twelve 8-lane chains do half the work per instruction). Only reachable through
    /// [`V4::vectorize`], which runs it with those instructions enabled.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Avx512(pub(crate) V4);

    impl MicroKernel for Avx512 {
        #[inline(always)]
        fn tile<const R: usize>(self, a: &[f32], b: &[f32], acc: &mut [[f32; NR]; R]) {
            let simd = self.0;
            let b: &[f32x16] = bytemuck::cast_slice(b);
            let mut c: [f32x16; R] = core::array::from_fn(|r| bytemuck::cast(acc[r]));
            for (ak, &bk) in a.chunks_exact(MR).zip(b) {
                for (row, &ar) in c.iter_mut().zip(ak) {
                    *row = simd.mul_add_f32x16(simd.splat_f32x16(ar), bk, *row);
                }
            }
            for (out, row) in acc.iter_mut().zip(c) {
                *out = bytemuck::cast(row);
            }
        }

        #[inline(always)]
        fn tile_pair<const R: usize>(
            self,
            a: &[f32],
            (b0, b1): (&[f32], &[f32]),
            acc: &mut [[[f32; NR]; 2]; R],
        ) {
            let simd = self.0;
            let b0: &[f32x16] = bytemuck::cast_slice(b0);
            let b1: &[f32x16] = bytemuck::cast_slice(b1);
            let mut c: [[f32x16; 2]; R] =
                core::array::from_fn(|r| [bytemuck::cast(acc[r][0]), bytemuck::cast(acc[r][1])]);
            for ((ak, &p0), &p1) in a.chunks_exact(MR).zip(b0).zip(b1) {
                for (row, &ar) in c.iter_mut().zip(ak) {
                    let ar = simd.splat_f32x16(ar);
                    row[0] = simd.mul_add_f32x16(ar, p0, row[0]);
                    row[1] = simd.mul_add_f32x16(ar, p1, row[1]);
                }
            }
            for (out, row) in acc.iter_mut().zip(c) {
                *out = [bytemuck::cast(row[0]), bytemuck::cast(row[1])];
            }
        }

        /// Twenty-four chains in registers (of 32): per step two `B` loads and twelve
        /// broadcasts of `A` feed twenty-four multiply-adds, where a pair's twelve leave the
        /// loads and the loop's bookkeeping a larger share of each cycle.
        #[inline(always)]
        fn tile_quad(
            self,
            (a0, a1): (&[f32], &[f32]),
            (b0, b1): (&[f32], &[f32]),
            acc: &mut [[[f32; NR]; 2]; 2 * MR],
        ) {
            let simd = self.0;
            let b0: &[f32x16] = bytemuck::cast_slice(b0);
            let b1: &[f32x16] = bytemuck::cast_slice(b1);
            let mut c: [[f32x16; 2]; 2 * MR] =
                core::array::from_fn(|r| [bytemuck::cast(acc[r][0]), bytemuck::cast(acc[r][1])]);
            let (top, bottom) = c.split_at_mut(MR);
            let steps = a0.chunks_exact(MR).zip(a1.chunks_exact(MR));
            for ((a0k, a1k), (&p0, &p1)) in steps.zip(b0.iter().zip(b1)) {
                for (rows, ak) in [(&mut *top, a0k), (&mut *bottom, a1k)] {
                    for (row, &ar) in rows.iter_mut().zip(ak) {
                        let ar = simd.splat_f32x16(ar);
                        row[0] = simd.mul_add_f32x16(ar, p0, row[0]);
                        row[1] = simd.mul_add_f32x16(ar, p1, row[1]);
                    }
                }
            }
            for (out, row) in acc.iter_mut().zip(c) {
                *out = [bytemuck::cast(row[0]), bytemuck::cast(row[1])];
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{MR, MicroKernel, NR};
    use pulp::f32x8;
    use pulp::x86::V3;

    /// The AVX2 + FMA kernel (x86-64-v3): a tile's rows in `2·R` registers, each step one
    /// broadcast of `a` and two vector fused multiply-adds per row. Only reachable through
    /// [`V3::vectorize`], which runs it with those instructions enabled.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Avx2(pub(crate) V3);

    impl MicroKernel for Avx2 {
        #[inline(always)]
        fn tile<const R: usize>(self, a: &[f32], b: &[f32], acc: &mut [[f32; NR]; R]) {
            let simd = self.0;
            let b: &[f32x8] = bytemuck::cast_slice(b);
            let mut c: [[f32x8; 2]; R] = core::array::from_fn(|r| bytemuck::cast(acc[r]));
            for (ak, bk) in a.chunks_exact(MR).zip(b.chunks_exact(2)) {
                let (b0, b1) = (bk[0], bk[1]);
                for (row, &ar) in c.iter_mut().zip(ak) {
                    let ar = simd.splat_f32x8(ar);
                    row[0] = simd.mul_add_f32x8(ar, b0, row[0]);
                    row[1] = simd.mul_add_f32x8(ar, b1, row[1]);
                }
            }
            for (out, row) in acc.iter_mut().zip(c) {
                *out = bytemuck::cast(row);
            }
        }
    }
}
