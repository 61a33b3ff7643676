#![allow(clippy::unwrap_used)]

use super::*;
use crate::engine::cpu::uniform;

/// Element `(i, j)` of `A·B` as the contract says: one fused multiply-add chain over `k` in
/// order, from `start`.
fn chain(a: MatRef<'_>, b: MatRef<'_>, i: usize, j: usize, start: f32) -> f32 {
    (0..a.cols()).fold(start, |c, k| a.at(i, k).mul_add(b.at(k, j), c))
}

fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut rnd = uniform(seed);
    (0..len).map(|_| rnd()).collect()
}

/// Every element is the in-order FMA chain, bit for bit, for shapes that exercise every edge:
/// one row or column, partial tiles and panels, several K blocks, both orders of the loops over
/// tiles, the row and the column split between threads, and a transposed left operand.
#[test]
fn every_element_is_the_in_order_fma_chain() {
    let shapes = [
        (1, 1, 1),
        (1, 37, 5),
        (5, 3, 17),
        (7, 300, 33),
        (13, 513, 1),
        (64, 96, 700),
        (300, 64, 40),
        (97, 700, 130),
        // Long enough steps that the loops turn around, over several blocks of panels of
        // `B` (the last one partial, with an odd panel that is itself partial).
        (50, 400, 530),
    ];
    for (seed, &(m, k, n)) in shapes.iter().enumerate() {
        let a = random(m * k, seed as u64);
        let b = random(k * n, 100 + seed as u64);
        let bm = MatRef::row_major(&b, k, n);
        let packed = PackedB::new(bm);
        for transposed in [false, true] {
            let at = if transposed {
                crate::engine::cpu::matrix::transpose(&a, m, k)
            } else {
                a.clone()
            };
            let am = if transposed {
                MatRef::row_major(&at, k, m).t()
            } else {
                MatRef::row_major(&at, m, k)
            };
            let mut c = vec![f32::NAN; m * n];
            matmul(&mut c, am, &packed, Init::Overwrite);
            for i in 0..m {
                for j in 0..n {
                    assert_eq!(
                        c[i * n + j].to_bits(),
                        chain(am, bm, i, j, 0.0).to_bits(),
                        "{m}x{k}x{n} (A transposed: {transposed}) at ({i}, {j})"
                    );
                }
            }
        }
    }
}

/// A left operand packed once — from its values, or as the transpose of a packed right operand
/// — gives every element's chain bit for bit, overwriting or accumulating, for shapes with
/// partial panels and blocks, several row blocks and K blocks, and both splits between threads.
#[test]
fn a_packed_left_operand_is_the_chain_too() {
    let shapes = [
        (1, 1, 1),
        (5, 3, 17),
        (7, 300, 33),
        (97, 700, 130),
        (300, 530, 64),
        (64, 96, 700),
        (1000, 40, 300),
        (40, 600, 290),
    ];
    for (seed, &(m, k, n)) in shapes.iter().enumerate() {
        let a = random(m * k, 20 + seed as u64);
        let b = random(k * n, 40 + seed as u64);
        let start = random(m * n, 60 + seed as u64);
        let (am, bm) = (MatRef::row_major(&a, m, k), MatRef::row_major(&b, k, n));
        let packed_b = PackedB::new(bm);
        // `A` as the transpose of a right operand `Aᵀ` (`k × m`), packed.
        let a_t = crate::engine::cpu::matrix::transpose(&a, m, k);
        let from_b = PackedA::transposed_from(&PackedB::new(MatRef::row_major(&a_t, k, m)));
        for (packed_a, how) in [(PackedA::new(am), "packed"), (from_b, "from B")] {
            assert_eq!((packed_a.m(), packed_a.k()), (m, k));
            for init in [Init::Overwrite, Init::Accumulate] {
                let mut c = start.clone();
                matmul_packed(&mut c, &packed_a, &packed_b, init);
                for i in 0..m {
                    for j in 0..n {
                        let from = if init == Init::Overwrite {
                            0.0
                        } else {
                            start[i * n + j]
                        };
                        assert_eq!(
                            c[i * n + j].to_bits(),
                            chain(am, bm, i, j, from).to_bits(),
                            "{m}x{k}x{n} ({how}, {init:?}) at ({i}, {j})"
                        );
                    }
                }
            }
        }
    }
}

/// Accumulating continues each element's chain from the value `C` held.
#[test]
fn accumulating_continues_the_chain_from_c() {
    let (m, k, n) = (70, 530, 45);
    let a = random(m * k, 7);
    let b = random(k * n, 8);
    let start = random(m * n, 9);
    let (am, bm) = (MatRef::row_major(&a, m, k), MatRef::row_major(&b, k, n));
    let mut c = start.clone();
    matmul(&mut c, am, &PackedB::new(bm), Init::Accumulate);
    for i in 0..m {
        for j in 0..n {
            assert_eq!(
                c[i * n + j].to_bits(),
                chain(am, bm, i, j, start[i * n + j]).to_bits()
            );
        }
    }
}

/// A row of `C` has the same bits whether it is computed alone or among others, whichever way
/// the product is split between threads.
#[test]
fn a_row_does_not_depend_on_the_rows_beside_it() {
    let (k, n) = (384, 1408);
    let b = random(k * n, 3);
    let packed = PackedB::new(MatRef::row_major(&b, k, n));
    let a = random(2048 * k, 4);
    let mut whole = vec![0.0; 2048 * n];
    matmul(
        &mut whole,
        MatRef::row_major(&a, 2048, k),
        &packed,
        Init::Overwrite,
    );
    for (m, row) in [(1, 0), (2, 1), (31, 17), (200, 150)] {
        let mut part = vec![0.0; m * n];
        let start = row.min(2048 - m);
        let rows = MatRef::row_major(&a[start * k..(start + m) * k], m, k);
        matmul(&mut part, rows, &packed, Init::Overwrite);
        assert!(
            part == whole[start * n..(start + m) * n],
            "{m} rows from {start}"
        );
    }
}

/// A product with no inner dimension is zero, or leaves `C` as it was.
#[test]
fn an_empty_inner_dimension_gives_zero() {
    let packed = PackedB::new(MatRef::row_major(&[], 0, 3));
    let mut c = vec![5.0; 6];
    matmul(
        &mut c,
        MatRef::row_major(&[], 2, 0),
        &packed,
        Init::Accumulate,
    );
    assert_eq!(c, [5.0; 6]);
    matmul(
        &mut c,
        MatRef::row_major(&[], 2, 0),
        &packed,
        Init::Overwrite,
    );
    assert_eq!(c, [0.0; 6]);
}

/// The portable kernel computes what the chain says (it runs where AVX2 does not, and in this
/// test everywhere).
#[test]
fn the_portable_kernel_is_the_chain() {
    let (kc, rows) = (37, 5);
    let a = random(kc * MR, 11);
    let b = random(kc * NR, 12);
    let mut acc = [[0.5f32; NR]; 5];
    Portable.tile::<5>(&a, &b, &mut acc);
    for r in 0..rows {
        for j in 0..NR {
            let want = (0..kc).fold(0.5f32, |c, k| a[k * MR + r].mul_add(b[k * NR + j], c));
            assert_eq!(acc[r][j].to_bits(), want.to_bits());
        }
    }
}

/// Every kernel this CPU can run — portable, AVX2, AVX-512 — computes the chain bit for bit,
/// one tile at a time, two side by side (`tile_pair`) and four (`tile_quad`: two `A` panels
/// over two `B` panels; both are the AVX-512 kernel's own).
#[test]
fn every_kernel_of_this_cpu_is_the_chain_alone_and_in_pairs() {
    fn check<K: MicroKernel>(name: &str, kern: K) {
        let kc = 37;
        let a = random(kc * MR, 21);
        let (b0, b1) = (random(kc * NR, 22), random(kc * NR, 23));
        let chain = |b: &[f32], r: usize, j: usize, start: f32| {
            (0..kc).fold(start, |c, k| a[k * MR + r].mul_add(b[k * NR + j], c))
        };
        let a1 = random(kc * MR, 24);
        let mut quad: [[[f32; NR]; 2]; 2 * MR] =
            core::array::from_fn(|r| [[r as f32; NR], [-(r as f32); NR]]);
        kern.tile_quad((&a, &a1), (&b0, &b1), &mut quad);
        for (r, row) in quad.iter().enumerate() {
            let (panel, i) = if r < MR { (&a, r) } else { (&a1, r - MR) };
            for (half, (b, start)) in row.iter().zip([(&b0, r as f32), (&b1, -(r as f32))]) {
                for (j, &got) in half.iter().enumerate() {
                    let want =
                        (0..kc).fold(start, |c, k| panel[k * MR + i].mul_add(b[k * NR + j], c));
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{name}: quad row {r} col {j}"
                    );
                }
            }
        }
        let mut one = [[0.25f32; NR]; 5];
        kern.tile::<5>(&a, &b0, &mut one);
        let mut pair = [[[0.5f32; NR], [-0.5f32; NR]]; 5];
        kern.tile_pair::<5>(&a, (&b0, &b1), &mut pair);
        for r in 0..5 {
            for j in 0..NR {
                let bits = |x: f32| x.to_bits();
                assert_eq!(bits(one[r][j]), bits(chain(&b0, r, j, 0.25)), "{name}");
                assert_eq!(bits(pair[r][0][j]), bits(chain(&b0, r, j, 0.5)), "{name}");
                assert_eq!(bits(pair[r][1][j]), bits(chain(&b1, r, j, -0.5)), "{name}");
            }
        }
    }
    check("portable", Portable);
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(simd) = pulp::x86::V3::try_new() {
            check("avx2", super::kernel::Avx2(simd));
        }
        if let Some(simd) = pulp::x86::V4::try_new() {
            check("avx512", super::kernel::Avx512(simd));
        }
    }
}

/// Subnormal operands are read as zero (by every kernel alike): the product is the chain over
/// the operands with those entries zeroed, bit for bit — in `A`, in `B`, row-major or transposed.
#[test]
fn subnormal_operands_count_as_zero() {
    let (m, k, n) = (7, 40, 35);
    let tiny = f32::MIN_POSITIVE / 8.0;
    assert!(tiny > 0.0 && tiny.is_subnormal());
    let mut a = random(m * k, 31);
    let mut b = random(k * n, 32);
    // Row 0 of `A` and column 3 of `B` wholly subnormal (their products would be too, and not
    // 0), and more scattered about.
    for (i, x) in a
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| i % 5 == 0 || *i < k)
    {
        *x = if i % 2 == 0 { tiny } else { -tiny };
    }
    for (i, x) in b
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| i % 7 == 0 || i % n == 3)
    {
        *x = tiny * (1 + i % 3) as f32;
    }
    let zeroed = |v: &[f32]| -> Vec<f32> {
        v.iter()
            .map(|&x| if x.is_subnormal() { 0.0 } else { x })
            .collect()
    };
    let (a0, b0) = (zeroed(&a), zeroed(&b));
    for b_transposed in [false, true] {
        let bt = crate::engine::cpu::matrix::transpose(&b, k, n);
        let bm = if b_transposed {
            MatRef::row_major(&bt, n, k).t()
        } else {
            MatRef::row_major(&b, k, n)
        };
        let mut c = vec![f32::NAN; m * n];
        matmul(
            &mut c,
            MatRef::row_major(&a, m, k),
            &PackedB::new(bm),
            Init::Overwrite,
        );
        let (am0, bm0) = (MatRef::row_major(&a0, m, k), MatRef::row_major(&b0, k, n));
        for i in 0..m {
            for j in 0..n {
                assert_eq!(c[i * n + j].to_bits(), chain(am0, bm0, i, j, 0.0).to_bits());
            }
        }
        assert!(
            c[..n]
                .iter()
                .chain(c.iter().skip(3).step_by(n))
                .all(|&x| x == 0.0)
        );
    }
}
