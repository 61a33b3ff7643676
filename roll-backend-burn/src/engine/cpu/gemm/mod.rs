//! roll's f32 GEMM for the CPU: `C = A·B` or `C += A·B`, with `B` packed once and reused (a
//! weight) or packed per call (an activation), `A` read through any strides (so transposes cost
//! no copy) or packed once (a weight on the left, for a transposed output), `C` row-major,
//! written in place.
//!
//! # The algorithm
//!
//! The loop nest of BLIS (Van Zee & van de Geijn, "BLIS: A Framework for Rapidly Instantiating
//! BLAS Functionality", ACM TOMS 2015): `B` is cut into panels of `NR` (16) columns laid out step by
//! step (`[k][NR]`, zero-padded), `A` into blocks of `MC` rows × `KC` steps packed as panels of
//! `MR` (6) rows (`[k][MR]`), and a micro-kernel (`kernel.rs`) updates one `MR × NR` tile of `C` held
//! in registers — or, where the kernel has the registers, two `A` panels over two `B` panels at
//! once (a `2·MR × 2·NR` tile: AVX-512's 32 registers hold its 24 accumulators). The `A` block
//! stays in L2; over short blocks of `k` the pair of `B` panels a tile reads stays in L1 across
//! the block's `A` panels, over long ones (where that pair outgrows L1) the `A` panels stay there
//! across a block of `B` panels held in L2. The work is split between rayon's threads by rows of `C`
//! when `C` has at least as many rows as columns, by panels of columns otherwise (a decode step's
//! few tokens against a wide weight) — and wherever a packed `A` leaves each chunk a pair of
//! panels, so that a chunk's slice of `B` stays in L2 across all of `A`.
//!
//! # Batch invariance, by construction
//!
//! Each element of `C` is one chain of fused multiply-adds over `k = 0, 1, …, K−1` in order,
//! started from 0 (or from `C`'s value when accumulating): the `K` blocks continue the chain from
//! the value the previous block stored, and a tile with fewer than `MR` rows runs the same chain on
//! its rows. So an element's bits depend on its row of `A` and column of `B` alone — not on how
//! many rows or columns `C` has, how it is split between threads, or whether the AVX2 or the
//! portable kernel runs. The decoder relies on this: a sequence's logits are the same bits alone
//! or in any batch, and the trainer's forward reproduces the sampler's log-probs exactly.
//! Subnormal operands are read as 0, the same way by every kernel: a subnormal holds nothing a
//! product of weights could resolve, and costs a microcode assist per FMA on Intel CPUs.

mod kernel;

use kernel::{MR, MicroKernel, NR, Portable};
use rayon::prelude::*;
use std::ops::Range;

/// Rows of `A` packed per block (a multiple of [`MR`], and of [`NR`] for
/// [`PackedA::transposed_from`], which reads whole panels of `B`): `MC × KC` floats, 192 KiB,
/// stay in L2.
const MC: usize = 96;
const _: () = assert!(MC.is_multiple_of(MR) && MC.is_multiple_of(NR));
/// Steps of `k` per block: a `B` panel's slice of `KC × NR` floats, 32 KiB.
const KC: usize = 512;
/// Pieces of `C` per rayon thread: more pieces than threads let work stealing even out a thread
/// that falls behind (on a shared host, one often does).
const CHUNKS_PER_THREAD: usize = 4;
/// Steps of a panel of `B` packed together from a column-contiguous `B` (4 KiB of the panel).
const PACK_STEPS: usize = 64;
/// Multiply-adds below which a product runs on the calling thread alone.
const PARALLEL_WORK: usize = 1 << 18;
/// Panels of `B` per block that each group of `A`'s rows sweeps before the next group: `KC ×
/// NC_PANELS·NR` floats, 512 KiB, stay in L2 while the group's panels stay in L1.
const NC_PANELS: usize = 16;
/// Steps up to which a pair of `B` panels (`2·NR` floats a step: 24 KiB) stays in L1 beside an
/// `A` panel; with more, the loops turn around (see [`drive`]).
const L1_STEPS: usize = 192;

/// A read-only `rows × cols` matrix in a slice, element `(i, j)` at `i·row_stride + j·col_stride`.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> MatRef<'a> {
    /// A row-major `rows × cols` matrix.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        debug_assert_eq!(data.len(), rows * cols, "a {rows}x{cols} matrix");
        Self {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose: the same elements, rows and columns swapped (no copy).
    pub fn t(self) -> Self {
        Self {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
        }
    }

    /// The columns `range` of it (no copy).
    ///
    /// # Panics
    /// If `range` reaches past its last column.
    pub fn columns(self, range: Range<usize>) -> Self {
        assert!(
            range.start <= range.end && range.end <= self.cols,
            "columns {range:?} of a matrix with {} columns",
            self.cols
        );
        Self {
            data: self
                .data
                .get(range.start * self.col_stride..)
                .unwrap_or(&[]),
            cols: range.len(),
            ..self
        }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    #[cfg(test)]
    fn at(&self, i: usize, j: usize) -> f32 {
        self.data[i * self.row_stride + j * self.col_stride]
    }
}

/// The right operand of a product, packed: panels of 16 (`NR`) columns, each `[k][NR]` (the last
/// zero-padded). A weight packed once serves every product that reads it.
#[derive(Debug, Clone)]
pub struct PackedB {
    k: usize,
    n: usize,
    panels: Vec<f32>,
}

/// Its panels go back to the CPU kernels' pool of recycled buffers (`engine::cpu::scratch`):
/// products pack a new operand per call.
impl Drop for PackedB {
    fn drop(&mut self) {
        super::scratch::recycle(std::mem::take(&mut self.panels));
    }
}

impl PackedB {
    /// Packs `b` (`k × n`, any strides).
    pub fn new(b: MatRef<'_>) -> Self {
        let (k, n) = (b.rows, b.cols);
        let mut panels = super::scratch::zeroed(n.div_ceil(NR) * k * NR);
        // Along `b`'s contiguous dimension, as `pack_a` does.
        let pack = |p: usize, panel: &mut [f32]| {
            let j0 = p * NR;
            let width = NR.min(n - j0);
            if b.col_stride == 1 {
                for (kk, step) in panel.chunks_exact_mut(NR).enumerate() {
                    let at = kk * b.row_stride + j0;
                    for (v, &x) in step.iter_mut().zip(&b.data[at..at + width]) {
                        *v = flushed(x);
                    }
                }
            } else {
                // Down each column, a block of steps at a time: the panel's rows being written
                // stay in L1 while the `NR` columns are read (a whole panel of a long `k` does
                // not fit there).
                for k0 in (0..k).step_by(PACK_STEPS) {
                    let block = &mut panel[k0 * NR..(k0 + PACK_STEPS).min(k) * NR];
                    for j in 0..width {
                        let column = (j0 + j) * b.col_stride + k0 * b.row_stride;
                        for (kk, step) in block.chunks_exact_mut(NR).enumerate() {
                            step[j] = flushed(b.data[column + kk * b.row_stride]);
                        }
                    }
                }
            }
        };
        if k > 0 {
            if k * n < PARALLEL_WORK {
                panels
                    .chunks_exact_mut(k * NR)
                    .enumerate()
                    .for_each(|(p, panel)| pack(p, panel));
            } else {
                panels
                    .par_chunks_exact_mut(k * NR)
                    .enumerate()
                    .for_each(|(p, panel)| pack(p, panel));
            }
        }
        Self { k, n, panels }
    }

    /// The inner dimension (rows of `B`).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Columns of `B`.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Steps `k0..k1` of panel `p`.
    fn panel(&self, p: usize, steps: Range<usize>) -> &[f32] {
        let base = p * self.k * NR;
        &self.panels[base + steps.start * NR..base + steps.end * NR]
    }
}

/// What a product does with `C`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Init {
    /// `C = A·B` (`C`'s values are ignored).
    Overwrite,
    /// `C += A·B`, each element's chain starting from its value.
    Accumulate,
}

/// `C = A·B` or `C += A·B` for `A` `m × k` (any strides), `B` packed `k × n`, `C` row-major
/// `m × n`.
///
/// # Panics
/// If the shapes disagree (a bug in the caller, not an input error).
pub fn matmul(c: &mut [f32], a: MatRef<'_>, b: &PackedB, init: Init) {
    product(c, Left::Strided(a), b, init);
}

/// `C = A·B` or `C += A·B` for `A` packed once (a weight on the left: `Yᵀ = Wᵀ·Xᵀ`, the
/// transposed output of a linear layer written in place), `B` packed `k × n`, `C` row-major
/// `m × n`. The same bits as [`matmul`] of the unpacked `A`.
///
/// # Panics
/// If the shapes disagree (a bug in the caller, not an input error).
pub fn matmul_packed(c: &mut [f32], a: &PackedA, b: &PackedB, init: Init) {
    product(c, Left::Packed(a), b, init);
}

/// [`matmul`] and [`matmul_packed`].
fn product(c: &mut [f32], a: Left<'_>, b: &PackedB, init: Init) {
    let (m, a_cols) = match a {
        Left::Strided(a) => (a.rows, a.cols),
        Left::Packed(a) => (a.m, a.k),
    };
    let (k, n) = (b.k, b.n);
    assert!(
        a_cols == k && c.len() == m * n,
        "GEMM shapes: A {m}x{a_cols}, B {k}x{n}, C has {} values",
        c.len()
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if init == Init::Overwrite {
            c.fill(0.0);
        }
        return;
    }
    let threads = rayon::current_num_threads();
    if threads == 1 || m * n * k < PARALLEL_WORK {
        let out = c.chunks_exact_mut(n).collect();
        let panels = 0..n.div_ceil(NR);
        run(
            Chunk {
                rows: 0..m,
                panels,
                out,
            },
            a,
            b,
            init,
        );
        return;
    }
    let panels = n.div_ceil(NR);
    let pieces = threads * CHUNKS_PER_THREAD;
    // By rows where `C` is tall; by columns where it is wide, or wherever a packed `A` leaves
    // every chunk a pair of panels at least: then each chunk keeps its panels of `B` in L2
    // across all of `A`'s blocks, where chunks of rows would each stream all of `B` from L3 once
    // per block (a 2816-row weight times 2048 tokens ran 10% slower so).
    let by_rows = m >= n && !(matches!(a, Left::Packed(_)) && panels >= 2 * pieces);
    // Split by columns, every chunk reads all of `A`: pack it once for all of them.
    let shared_a = match a {
        Left::Strided(strided) if !by_rows => Some(PackedA::new(strided)),
        _ => None,
    };
    let a = shared_a.as_ref().map_or(a, Left::Packed);
    let chunks: Vec<Chunk<'_>> = if by_rows {
        // Rows of C, in multiples of MR; of MC for a packed `A`, whose blocks start there.
        let step = match a {
            Left::Strided(_) => MR,
            Left::Packed(_) => MC,
        };
        let per = m.div_ceil(pieces).max(MC).div_ceil(step) * step;
        c.chunks_mut(per * n)
            .enumerate()
            .map(|(t, block)| {
                let r0 = t * per;
                let out = block.chunks_exact_mut(n).collect::<Vec<_>>();
                Chunk {
                    rows: r0..r0 + out.len(),
                    panels: 0..panels,
                    out,
                }
            })
            .collect()
    } else {
        // Panels of columns, an even number per chunk (panels run in pairs); every row of C
        // cut at the same columns.
        let per = panels.div_ceil(pieces).next_multiple_of(2);
        let bounds: Vec<Range<usize>> = (0..panels)
            .step_by(per)
            .map(|p0| p0..(p0 + per).min(panels))
            .collect();
        let mut parts: Vec<Vec<&mut [f32]>> =
            bounds.iter().map(|_| Vec::with_capacity(m)).collect();
        for row in c.chunks_exact_mut(n) {
            let mut rest = row;
            for (part, range) in parts.iter_mut().zip(&bounds) {
                let width = (range.end * NR).min(n) - range.start * NR;
                let (piece, tail) = rest.split_at_mut(width);
                part.push(piece);
                rest = tail;
            }
        }
        bounds
            .into_iter()
            .zip(parts)
            .map(|(range, out)| Chunk {
                rows: 0..m,
                panels: range,
                out,
            })
            .collect()
    };
    chunks
        .into_par_iter()
        .for_each(|chunk| run(chunk, a, b, init));
}

/// The left operand of a product: read through its strides and packed block by block as the
/// product runs, or packed already.
#[derive(Clone, Copy)]
enum Left<'a> {
    Strided(MatRef<'a>),
    Packed(&'a PackedA),
}

/// The left operand of a product, packed whole, block by block as a product packs its own: block
/// `(i0 / MC, k0 / KC)` at `(i0 / MC · k_blocks + k0 / KC) · block`. A weight packed once serves
/// every product that reads it; an activation that chunks split by columns all read is packed
/// once for all of them.
#[derive(Debug, Clone)]
pub struct PackedA {
    data: Vec<f32>,
    m: usize,
    k: usize,
    k_blocks: usize,
    /// Floats per block: [`block_len`] of the whole of `A`.
    block: usize,
}

/// The floats a packed block of `A` needs for `rows` rows and `k` steps (at most `MC × KC`):
/// a small product's block is as small as its operand, not the 192 KiB of a whole one, which
/// zeroing would otherwise cost at every call.
fn block_len(rows: usize, k: usize) -> usize {
    rows.div_ceil(MR).min(MC / MR) * MR * k.min(KC)
}

/// Its blocks go back to the CPU kernels' pool of recycled buffers, as [`PackedB`]'s panels do.
impl Drop for PackedA {
    fn drop(&mut self) {
        super::scratch::recycle(std::mem::take(&mut self.data));
    }
}

impl PackedA {
    /// Packs `a` (`m × k`, any strides).
    pub fn new(a: MatRef<'_>) -> Self {
        Self::by_blocks(a.rows, a.cols, |rows, steps, out| {
            pack_a(a, rows, steps, out)
        })
    }

    /// `Bᵀ` packed as a left operand, from `b` packed as a right one: a weight packed for
    /// `X·W` serves `Wᵀ·Xᵀ` too, without its unpacked values. The same floats as
    /// [`PackedA::new`] of `Bᵀ` (packing flushed them already).
    pub fn transposed_from(b: &PackedB) -> Self {
        Self::by_blocks(b.n, b.k, |rows, steps, out| {
            // Row `j` of `Bᵀ` is lane `j % NR` of `b`'s panel `j / NR`: each of the block's
            // `B` panels is read once, step by step, its lanes written to the rows of the `A`
            // panels they are (a block's rows start at a multiple of `MC`, so of `NR`).
            let kc = steps.len();
            for j0 in rows.clone().step_by(NR) {
                let lanes = NR.min(rows.end - j0);
                // Where lane `l`'s values go in `out`, at step 0.
                let to: [usize; NR] = core::array::from_fn(|l| {
                    let r = j0 + l - rows.start;
                    r / MR * kc * MR + r % MR
                });
                let panel = b.panel(j0 / NR, steps.clone());
                for (kk, step) in panel.chunks_exact(NR).enumerate() {
                    for (&at, &x) in to.iter().zip(step).take(lanes) {
                        out[at + kk * MR] = x;
                    }
                }
            }
        })
    }

    /// An `m × k` left operand whose blocks `pack(rows, steps, out)` fills, in parallel, each
    /// from zeros (the padding of a last partial panel stays 0).
    fn by_blocks(
        m: usize,
        k: usize,
        pack: impl Fn(Range<usize>, Range<usize>, &mut [f32]) + Sync,
    ) -> Self {
        let k_blocks = k.div_ceil(KC);
        let block = block_len(m, k);
        let mut data = super::scratch::zeroed(m.div_ceil(MC) * k_blocks * block);
        // An empty operand has no blocks (and chunks of no floats do not exist).
        data.par_chunks_exact_mut(block.max(1))
            .enumerate()
            .for_each(|(i, out)| {
                let (i0, k0) = (i / k_blocks * MC, i % k_blocks * KC);
                pack(i0..(i0 + MC).min(m), k0..(k0 + KC).min(k), out);
            });
        Self {
            data,
            m,
            k,
            k_blocks,
            block,
        }
    }

    /// Rows of `A`.
    pub fn m(&self) -> usize {
        self.m
    }

    /// The inner dimension (columns of `A`).
    pub fn k(&self) -> usize {
        self.k
    }

    /// The packed block of rows from `i0` and steps from `k0`.
    fn block(&self, i0: usize, k0: usize) -> &[f32] {
        let at = (i0 / MC * self.k_blocks + k0 / KC) * self.block;
        &self.data[at..at + self.block]
    }
}

/// The part of `C` one thread computes: rows `rows` and panels `panels`, given as one slice per
/// row covering exactly those panels' columns.
struct Chunk<'c> {
    rows: Range<usize>,
    panels: Range<usize>,
    out: Vec<&'c mut [f32]>,
}

/// Runs a chunk with the best kernel this CPU has: AVX-512, AVX2, or the portable one (the same
/// bits from each).
fn run(chunk: Chunk<'_>, a: Left<'_>, b: &PackedB, init: Init) {
    let args = Args(chunk, a, b, init);
    #[cfg(target_arch = "x86_64")]
    {
        /// The loop nest over a chunk with kernel `kern`, as one call that `vectorize` compiles
        /// with the kernel's instructions enabled.
        struct Op<'a, 'c, K> {
            kern: K,
            args: Args<'a, 'c>,
        }
        impl<K: MicroKernel> pulp::NullaryFnOnce for Op<'_, '_, K> {
            type Output = ();
            #[inline(always)]
            fn call(self) {
                let Args(chunk, a, b, init) = self.args;
                drive(self.kern, chunk, a, b, init);
            }
        }
        if let Some(simd) = pulp::x86::V4::try_new() {
            let kern = kernel::Avx512(simd);
            return simd.vectorize(Op { kern, args });
        }
        if let Some(simd) = pulp::x86::V3::try_new() {
            let kern = kernel::Avx2(simd);
            return simd.vectorize(Op { kern, args });
        }
    }
    let Args(chunk, a, b, init) = args;
    drive(Portable, chunk, a, b, init);
}

thread_local! {
    /// This thread's buffer for the blocks of a strided `A` it packs, kept from one product to
    /// the next (at most `MC × KC` floats, 192 KiB): a fresh one per product was a page fault per
    /// 4 KiB and a `memset`. Its stale values are harmless: [`pack_a`] writes every row a tile
    /// reads, and a partial panel's tile reads only its own rows.
    static A_BLOCK: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// What [`drive`] takes besides the kernel, carried into a `vectorize` call.
struct Args<'a, 'c>(Chunk<'c>, Left<'a>, &'a PackedB, Init);

/// The blocked loop nest over one chunk.
#[inline(always)]
fn drive<K: MicroKernel>(kern: K, chunk: Chunk<'_>, a: Left<'_>, b: &PackedB, init: Init) {
    let Chunk {
        rows,
        panels,
        mut out,
    } = chunk;
    let (k, n) = (b.k, b.n);
    let col0 = panels.start * NR;
    let mut own_a = match a {
        Left::Packed(_) => Vec::new(),
        Left::Strided(_) => {
            let mut block = A_BLOCK.take();
            let len = block_len(rows.len(), k);
            if block.len() < len {
                block.resize(len, 0.0);
            }
            block
        }
    };
    for i0 in rows.clone().step_by(MC) {
        let i1 = (i0 + MC).min(rows.end);
        for k0 in (0..k).step_by(KC) {
            let k1 = (k0 + KC).min(k);
            let kc = k1 - k0;
            // A chunk of a packed `A` starts its blocks where the packing's start.
            let packed_a: &[f32] = match a {
                Left::Packed(packed) => packed.block(i0, k0),
                Left::Strided(a) => {
                    pack_a(a, i0..i1, k0..k1, &mut own_a);
                    &own_a
                }
            };
            let load = k0 > 0 || init == Init::Accumulate;
            let a_panel = |q: usize| &packed_a[q * kc * MR..(q + 1) * kc * MR];
            // Which operand stays in L1 while the other streams from L2. Over few steps, a pair
            // of `B` panels does, across every row group of the `A` block (BLIS's order). Over
            // more, the pair outgrows L1 (a 512-step pair is 64 KiB) and both would stream: a
            // row group's two `A` panels (24 KiB at 512 steps) stay instead, across a block of
            // `NC_PANELS` panels of `B` held in L2 — 10–20% faster on the 28M model's 2816-row
            // products, the same on the tiny model's. Every element is the same chain either
            // way: only the order of the tiles changes.
            let block_panels = if kc <= L1_STEPS { 2 } else { NC_PANELS };
            for pb in (panels.start..panels.end).step_by(block_panels) {
                let pe = (pb + block_panels).min(panels.end);
                let (mut q, mut r0) = (0, i0);
                while r0 < i1 {
                    // Two whole `A` panels run over pairs of `B` panels as tiles of
                    // `2·MR × 2·NR`; a last partial group of rows, one panel at a time.
                    let height = if r0 + 2 * MR <= i1 {
                        2 * MR
                    } else {
                        MR.min(i1 - r0)
                    };
                    let out_rows = &mut out[r0 - rows.start..r0 + height - rows.start];
                    let mut p = pb;
                    while p < pe {
                        // Two whole panels side by side run as a pair (one read of the `A`
                        // panel for both); a last odd or partial panel alone.
                        let pair = p + 1 < pe && (p + 2) * NR <= n;
                        let b_next = pair.then(|| b.panel(p + 1, k0..k1));
                        let tile = |q: usize| Tile {
                            a: a_panel(q),
                            b: b.panel(p, k0..k1),
                            b_next,
                            j0: p * NR - col0,
                            width: NR.min(n - p * NR),
                            load,
                        };
                        if let (true, Some(b_next)) = (height == 2 * MR, b_next) {
                            tile(q).run_quad(kern, (a_panel(q + 1), b_next), out_rows);
                        } else if height == 2 * MR {
                            // A last odd or partial panel under two whole `A` panels.
                            let (top, bottom) = out_rows.split_at_mut(MR);
                            tile(q).run::<MR, K>(kern, top);
                            tile(q + 1).run::<MR, K>(kern, bottom);
                        } else {
                            let tile = tile(q);
                            match out_rows.len() {
                                6 => tile.run::<6, K>(kern, out_rows),
                                5 => tile.run::<5, K>(kern, out_rows),
                                4 => tile.run::<4, K>(kern, out_rows),
                                3 => tile.run::<3, K>(kern, out_rows),
                                2 => tile.run::<2, K>(kern, out_rows),
                                _ => tile.run::<1, K>(kern, out_rows),
                            }
                        }
                        p += if pair { 2 } else { 1 };
                    }
                    (q, r0) = (q + height.div_ceil(MR), r0 + height);
                }
            }
        }
    }
    if !own_a.is_empty() {
        A_BLOCK.set(own_a);
    }
}

/// A tile's accumulators on the stack, on whole cache lines: a vector register loaded from a
/// line-crossing slot just written is not forwarded from the store, and stalls until it commits.
#[repr(C, align(64))]
struct Aligned<T>(T);

/// One tile's operands and where it lands in its rows of `C`.
struct Tile<'p> {
    a: &'p [f32],
    b: &'p [f32],
    /// The next panel, whole, run side by side with this one (`2·NR` columns from `j0`).
    b_next: Option<&'p [f32]>,
    /// First column of the tile in the chunk's row slices, and how many of its [`NR`] are real.
    j0: usize,
    width: usize,
    /// Whether the chains continue from `C`'s values (else they start from 0).
    load: bool,
}

/// The whole tile of `NR` columns of a row of `C` from column `at`, as an array (a vector load
/// or store; `copy_from_slice` of a run-time length would call `memmove` per row and tile).
fn whole(row: &[f32], at: usize) -> Option<&[f32; NR]> {
    row.get(at..at + NR).and_then(|c| c.try_into().ok())
}

/// [`whole`], to write.
fn whole_mut(row: &mut [f32], at: usize) -> Option<&mut [f32; NR]> {
    row.get_mut(at..at + NR).and_then(|c| c.try_into().ok())
}

impl Tile<'_> {
    /// This tile's panels with the next whole `A` panel below and the next whole `B` panel
    /// beside (`next`): `2·MR` rows of `out` over `2·NR` columns.
    #[inline(always)]
    fn run_quad<K: MicroKernel>(
        &self,
        kern: K,
        (a_next, b_next): (&[f32], &[f32]),
        out: &mut [&mut [f32]],
    ) {
        let j0 = self.j0;
        let mut acc = Aligned([[[0.0f32; NR]; 2]; 2 * MR]);
        let acc = &mut acc.0;
        for (row, c) in acc.iter_mut().zip(out.iter()).filter(|_| self.load) {
            for (half, at) in row.iter_mut().zip([j0, j0 + NR]) {
                if let Some(c) = whole(c, at) {
                    *half = *c;
                }
            }
        }
        kern.tile_quad((self.a, a_next), (self.b, b_next), acc);
        for (row, c) in acc.iter().zip(out.iter_mut()) {
            for (half, at) in row.iter().zip([j0, j0 + NR]) {
                if let Some(c) = whole_mut(c, at) {
                    *c = *half;
                }
            }
        }
    }

    #[inline(always)]
    fn run<const R: usize, K: MicroKernel>(&self, kern: K, out: &mut [&mut [f32]]) {
        let j0 = self.j0;
        if let Some(b_next) = self.b_next {
            let mut acc = Aligned([[[0.0f32; NR]; 2]; R]);
            let acc = &mut acc.0;
            for (row, c) in acc.iter_mut().zip(out.iter()).filter(|_| self.load) {
                for (half, at) in row.iter_mut().zip([j0, j0 + NR]) {
                    if let Some(c) = whole(c, at) {
                        *half = *c;
                    }
                }
            }
            kern.tile_pair::<R>(self.a, (self.b, b_next), acc);
            for (row, c) in acc.iter().zip(out.iter_mut()) {
                for (half, at) in row.iter().zip([j0, j0 + NR]) {
                    if let Some(c) = whole_mut(c, at) {
                        *c = *half;
                    }
                }
            }
            return;
        }
        let mut acc = Aligned([[0.0f32; NR]; R]);
        let acc = &mut acc.0;
        if self.width == NR {
            for (row, c) in acc.iter_mut().zip(out.iter()).filter(|_| self.load) {
                if let Some(c) = whole(c, j0) {
                    *row = *c;
                }
            }
            kern.tile::<R>(self.a, self.b, acc);
            for (row, c) in acc.iter().zip(out.iter_mut()) {
                if let Some(c) = whole_mut(c, j0) {
                    *c = *row;
                }
            }
        } else {
            let cols = j0..j0 + self.width;
            for (row, c) in acc.iter_mut().zip(out.iter()).filter(|_| self.load) {
                for (v, &x) in row.iter_mut().zip(&c[cols.clone()]) {
                    *v = x;
                }
            }
            kern.tile::<R>(self.a, self.b, acc);
            for (row, c) in acc.iter().zip(out.iter_mut()) {
                for (x, &v) in c[cols.clone()].iter_mut().zip(row) {
                    *x = v;
                }
            }
        }
    }
}

/// `x`, or 0 for a subnormal `x`: what packing stores. A product whose operands hold subnormals
/// (a softmax's far tail scaled by a loss's `1/tokens`, say) otherwise runs many times slower on
/// CPUs that handle them in microcode — Intel's take a microcode assist per such FMA (a 28M
/// training step ran 4× slower), and the safe code this crate is written in cannot set the
/// flush-to-zero mode. Values below `2⁻¹²⁶` carry nothing a product of f32 weights could resolve.
#[inline(always)]
fn flushed(x: f32) -> f32 {
    if x.abs() < f32::MIN_POSITIVE { 0.0 } else { x }
}

/// Packs rows `rows` × steps `steps` of `a` into panels of [`MR`] rows, each `[k][MR]`.
///
/// Reads `a` along its contiguous dimension: a transposed operand (unit row stride) step by
/// step across all the rows, a row-major one row by row. Walking the other way would touch one
/// cache line per element at a stride that, for power-of-two widths, maps every line to the same
/// L1 set.
fn pack_a(a: MatRef<'_>, rows: Range<usize>, steps: Range<usize>, out: &mut [f32]) {
    let kc = steps.len();
    if a.row_stride == 1 {
        for (kk, k) in steps.enumerate() {
            let column = &a.data[k * a.col_stride + rows.start..k * a.col_stride + rows.end];
            for (q, panel_rows) in column.chunks(MR).enumerate() {
                let at = q * kc * MR + kk * MR;
                for (v, &x) in out[at..at + MR].iter_mut().zip(panel_rows) {
                    *v = flushed(x);
                }
            }
        }
    } else if a.col_stride == 1 {
        // Row-major: a whole panel takes its `MR` rows step by step, each step one contiguous
        // run of the output (`MR` reads from `MR` streams, no strided writes).
        for (q, r0) in rows.clone().step_by(MR).enumerate() {
            let panel = &mut out[q * kc * MR..(q + 1) * kc * MR];
            let height = MR.min(rows.end - r0);
            let row =
                |r: usize| &a.data[(r0 + r.min(height - 1)) * a.row_stride + steps.start..][..kc];
            let src: [&[f32]; MR] = core::array::from_fn(row);
            for (kk, step) in panel.chunks_exact_mut(MR).enumerate() {
                for (v, src) in step.iter_mut().zip(&src).take(height) {
                    *v = flushed(src[kk]);
                }
            }
        }
    } else {
        for (q, r0) in rows.clone().step_by(MR).enumerate() {
            let panel = &mut out[q * kc * MR..(q + 1) * kc * MR];
            for r in 0..MR.min(rows.end - r0) {
                let row = r0 + r;
                for (kk, k) in steps.clone().enumerate() {
                    panel[kk * MR + r] = flushed(a.data[row * a.row_stride + k * a.col_stride]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
