//! The kernels, in CubeCL. f32 throughout; every tensor a contiguous row-major buffer.
//!
//! Row kernels run one cube per row: its units stride over the row, put their partial sums (or
//! maxima) in shared memory, each reads all of them back in the same order — so every unit holds
//! the same total — and they finish the row together. `units` (the cube size) is known when the
//! kernel is compiled. (A halving tree reduction, the usual way, fails cubecl 0.11's IR
//! verification when launched on wgpu: "Expected operand type cube.ptr, but found cube.index".)

use cubecl::prelude::*;

/// `out[i] = silu(gate[i]) · up[i]`, SwiGLU's element-wise half.
#[cube(launch)]
pub fn silu_mul(gate: &Tensor<f32>, up: &Tensor<f32>, out: &mut Tensor<f32>) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let g = gate[i];
        out[i] = g / (1.0 + f32::exp(-g)) * up[i];
    }
}

/// Sums `partial` over the cube's `units` units through shared memory of its own; every unit
/// gets the total.
#[cube]
fn cube_sum(partial: f32, #[comptime] units: usize) -> f32 {
    let mut shared = Shared::<[f32]>::new_slice(units);
    shared[UNIT_POS as usize] = partial;
    sync_cube();
    let mut total = 0.0f32;
    for k in 0..units {
        total += shared[k];
    }
    sync_cube();
    total
}

/// The maximum of `partial` over the cube's units (as [`cube_sum`]).
#[cube]
fn cube_max(partial: f32, #[comptime] units: usize) -> f32 {
    let mut shared = Shared::<[f32]>::new_slice(units);
    shared[UNIT_POS as usize] = partial;
    sync_cube();
    let mut total = shared[0];
    for k in 1..units {
        total = f32::max(total, shared[k]);
    }
    sync_cube();
    total
}

/// RMSNorm of each row of `x` (`[rows, d]`, one cube per row): `out = h / sqrt(mean(h²) + eps) · w`
/// with `h = x`, or, with `add_residual`, the residual stream's add in the same pass:
/// `h = x + residual`, written to `summed` as well. Without it `residual` and `summed` are not
/// touched (the launcher passes placeholders).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_rows(
    x: &Tensor<f32>,
    residual: &Tensor<f32>,
    weight: &Tensor<f32>,
    summed: &mut Tensor<f32>,
    out: &mut Tensor<f32>,
    eps: f32,
    #[comptime] add_residual: bool,
    #[comptime] units: usize,
) {
    let d = weight.len();
    let base = CUBE_POS * d;
    let unit = UNIT_POS as usize;
    let mut partial = 0.0f32;
    let mut i = unit;
    while i < d {
        let mut v = x[base + i];
        if add_residual {
            v += residual[base + i];
            summed[base + i] = v;
        }
        partial += v * v;
        i += units;
    }
    let sum = cube_sum(partial, units);
    let inv = 1.0 / f32::sqrt(sum / (d as f32) + eps);
    let mut j = unit;
    while j < d {
        let mut v = x[base + j];
        if add_residual {
            v = summed[base + j];
        }
        out[base + j] = v * inv * weight[j];
        j += units;
    }
}

/// Rotary embedding, Qwen's (HF `rotate_half`) layout: each head vector of `x`
/// (`[rows · heads, head_dim]`) has its halves `(a, b)` turned to `(a·cos − b·sin, b·cos + a·sin)`
/// by the angles of its row's position, read from the `[positions, head_dim / 2]` tables.
#[cube(launch)]
pub fn rope_rows(
    x: &Tensor<f32>,
    out: &mut Tensor<f32>,
    positions: &Tensor<i32>,
    cos: &Tensor<f32>,
    sin: &Tensor<f32>,
    #[comptime] heads: usize,
    #[comptime] head_dim: usize,
) {
    let half = head_dim / 2;
    let idx = ABSOLUTE_POS;
    if idx < x.len() / 2 {
        let pair = idx / half;
        let j = idx % half;
        let row = pair / heads;
        let at = (positions[row] as usize) * half + j;
        let base = pair * head_dim;
        let a = x[base + j];
        let b = x[base + j + half];
        let c = cos[at];
        let s = sin[at];
        out[base + j] = a * c - b * s;
        out[base + j + half] = b * c + a * s;
    }
}

/// Per row of `logits` (`[rows, vocab]`, one cube per row): the log-prob of the row's target
/// token and the entropy of the row's distribution, `H = ln S − Σ eᵢ(lᵢ − m) / S` with
/// `m = max l`, `eᵢ = exp(lᵢ − m)`, `S = Σ eᵢ` — no `[rows, vocab]` softmax is written.
#[cube(launch)]
pub fn logprob_entropy_rows(
    logits: &Tensor<f32>,
    targets: &Tensor<i32>,
    logprobs: &mut Tensor<f32>,
    entropies: &mut Tensor<f32>,
    #[comptime] vocab: usize,
    #[comptime] units: usize,
) {
    let row = CUBE_POS;
    let base = row * vocab;
    let unit = UNIT_POS as usize;
    let mut partial = f32::new(-3.0e38);
    let mut i = unit;
    while i < vocab {
        partial = f32::max(partial, logits[base + i]);
        i += units;
    }
    let m = cube_max(partial, units);
    let mut s = 0.0f32;
    let mut t = 0.0f32;
    let mut j = unit;
    while j < vocab {
        let z = logits[base + j] - m;
        let e = f32::exp(z);
        s += e;
        t += e * z;
        j += units;
    }
    let s = cube_sum(s, units);
    let t = cube_sum(t, units);
    if unit == 0 {
        let ln_s = f32::ln(s);
        let target = targets[row] as usize;
        logprobs[row] = logits[base + target] - m - ln_s;
        entropies[row] = ln_s - t / s;
    }
}

/// One AdamW step over a flat parameter buffer (written to fresh buffers: the inputs may be
/// shared), the gradient scaled by `scale` (the global-norm clip coefficient) in the same pass —
/// the CPU optimiser's update ([`FusedAdamW`](crate::train)), operation for operation:
///
/// ```text
/// g ← g·scale
/// m ← β₁m + (1−β₁)g;  v ← β₂v + (1−β₂)g²        (first step: m = (1−β₁)g, v = (1−β₂)g²)
/// p ← p·decay − lr · (m / c₁) / (sqrt(v / c₂) + ε)      decay = 1 − lr·λ,  cₖ = 1 − βₖᵗ
/// ```
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn adamw_update(
    params: &Tensor<f32>,
    grads: &Tensor<f32>,
    m: &Tensor<f32>,
    v: &Tensor<f32>,
    params_out: &mut Tensor<f32>,
    m_out: &mut Tensor<f32>,
    v_out: &mut Tensor<f32>,
    c: &Tensor<f32>,
    #[comptime] first: bool,
) {
    // The constants, in the order `AdamWConstants::as_array` writes them.
    let (beta1, beta2, factor1, factor2) = (c[0], c[1], c[2], c[3]);
    let (correction1, correction2, eps, decay, lr, scale) = (c[4], c[5], c[6], c[7], c[8], c[9]);
    let i = ABSOLUTE_POS;
    if i < params.len() {
        let g = grads[i] * scale;
        let mut mi = g * factor1;
        let mut vi = (g * g) * factor2;
        if !first {
            mi = m[i] * beta1 + g * factor1;
            vi = v[i] * beta2 + (g * g) * factor2;
        }
        m_out[i] = mi;
        v_out[i] = vi;
        let delta = (mi / correction1) / (f32::sqrt(vi / correction2) + eps);
        params_out[i] = params[i] * decay - delta * lr;
    }
}

/// Causal grouped-query attention read straight from a paged key/value cache (one cube per query
/// row and head; no `[t, t]` scores are written).
///
/// `q` is `[tokens · heads, head_dim]`, token-major: row `i · heads + h` is head `h` of the query
/// at position `start + i`, which attends to positions `0 ..= start + i`. Position `p`'s keys and
/// values are row `rows[p]` of the pools (`[pool_rows, kv_heads · head_dim]`); query head `h`
/// reads kv head `h / (heads / kv_heads)`.
///
/// Split-K inside the cube: unit `u` takes positions `u, u + units, …` with an online softmax of
/// its own (running maximum `m`, normaliser `s`, accumulator `a` of the weighted values); the
/// units' partial results are then merged —
/// `M = max mᵤ`, `S = Σ sᵤ·e^(mᵤ−M)`, `out = Σ aᵤ·e^(mᵤ−M) / S` — every output element summing
/// the units in the same order, so the result does not depend on scheduling.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    q: &Tensor<f32>,
    k_pool: &Tensor<f32>,
    v_pool: &Tensor<f32>,
    rows: &Tensor<i32>,
    out: &mut Tensor<f32>,
    start: u32,
    scale: f32,
    #[comptime] heads: usize,
    #[comptime] kv_heads: usize,
    #[comptime] head_dim: usize,
    #[comptime] units: usize,
) {
    let row = CUBE_POS;
    let i = row / heads;
    let g = (row % heads) / (heads / kv_heads);
    let len = start as usize + i + 1;
    let unit = UNIT_POS as usize;
    let q_base = row * head_dim;
    let kv_width = kv_heads * head_dim;
    let mut acc = Shared::<[f32]>::new_slice(units * head_dim);
    let own = unit * head_dim;
    for j in 0..head_dim {
        acc[own + j] = 0.0;
    }
    let mut m = f32::new(-3.0e38);
    let mut s = 0.0f32;
    let mut p = unit;
    while p < len {
        let base = (rows[p] as usize) * kv_width + g * head_dim;
        let mut dot = 0.0f32;
        for j in 0..head_dim {
            dot += q[q_base + j] * k_pool[base + j];
        }
        let score = dot * scale;
        let m_new = f32::max(m, score);
        let alpha = f32::exp(m - m_new);
        let w = f32::exp(score - m_new);
        s = s * alpha + w;
        for j in 0..head_dim {
            acc[own + j] = acc[own + j] * alpha + w * v_pool[base + j];
        }
        m = m_new;
        p += units;
    }
    let mut maxima = Shared::<[f32]>::new_slice(units);
    let mut sums = Shared::<[f32]>::new_slice(units);
    maxima[unit] = m;
    sums[unit] = s;
    sync_cube();
    let mut top = maxima[0];
    for u in 1..units {
        top = f32::max(top, maxima[u]);
    }
    let mut total = 0.0f32;
    for u in 0..units {
        total += sums[u] * f32::exp(maxima[u] - top);
    }
    let mut j = unit;
    while j < head_dim {
        let mut o = 0.0f32;
        for u in 0..units {
            o += acc[u * head_dim + j] * f32::exp(maxima[u] - top);
        }
        out[q_base + j] = o / total;
        j += units;
    }
}

/// "No candidate": the id sentinel of the sampling helpers, and the cut that keeps every tie.
const NONE: u32 = 4294967295u32;

/// The order key of a logit: the f32 bits made monotone, so that a larger logit has a larger key
/// (negative floats have their bits flipped, positive ones their sign bit set).
#[cube]
fn order_key(x: f32) -> u32 {
    let bits = u32::reinterpret(x);
    let flipped = 4294967295u32 - bits;
    let signed = bits | 2147483648u32;
    select(bits >= 2147483648u32, flipped, signed)
}

/// Whether a candidate of key `key` and id `i` is within the cut `(cut_key, cut_id)`: the ranking
/// (descending logit, ties by ascending id) up to and including that candidate.
#[cube]
fn in_cut(key: u32, i: u32, cut_key: u32, cut_id: u32) -> bool {
    key > cut_key || (key == cut_key && i <= cut_id)
}

/// A candidate's weight: 1 when counting, else its tempered probability up to the normaliser.
#[cube]
fn candidate_weight(l: f32, m: f32, inv_t: f32, count: bool) -> f32 {
    select(count, 1.0f32, f32::exp((l - m) * inv_t))
}

/// Whether a cumulative weight has reached `threshold` (`strict`: exceeded it).
#[cube]
fn reaches(cumulative: f32, threshold: f32, strict: bool) -> bool {
    (strict && cumulative > threshold) || (!strict && cumulative >= threshold)
}

/// The weight of the cut's candidates whose key is above `above`, summed over the cube.
#[cube]
#[allow(clippy::too_many_arguments)]
fn cut_mass(
    logits: &Tensor<f32>,
    base: usize,
    m: f32,
    inv_t: f32,
    count: bool,
    above: u32,
    cut_key: u32,
    cut_id: u32,
    #[comptime] vocab: usize,
    #[comptime] units: usize,
) -> f32 {
    let mut partial = 0.0f32;
    let mut i = UNIT_POS as usize;
    while i < vocab {
        let l = logits[base + i];
        let key = order_key(l);
        if key > above && in_cut(key, i as u32, cut_key, cut_id) {
            partial += candidate_weight(l, m, inv_t, count);
        }
        i += units;
    }
    cube_sum(partial, units)
}

/// The key of the first candidate, in ranking order within the cut, at which the cumulative
/// weight reaches `threshold`: the smallest key `K` whose candidates above it do not reach it,
/// found by bisecting the 32-bit key space (every step one pass over the row).
#[cube]
#[allow(clippy::too_many_arguments)]
fn boundary_key(
    logits: &Tensor<f32>,
    base: usize,
    m: f32,
    inv_t: f32,
    count: bool,
    threshold: f32,
    strict: bool,
    cut_key: u32,
    cut_id: u32,
    #[comptime] vocab: usize,
    #[comptime] units: usize,
) -> u32 {
    let mut lo = 0u32;
    let mut hi = 4294967295u32;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let above = cut_mass(
            logits, base, m, inv_t, count, mid, cut_key, cut_id, vocab, units,
        );
        if reaches(above, threshold, strict) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// In id order, the first of the cut's candidates (with key `key` when `match_key`, else all of
/// them) at which `start` plus their cumulative weight reaches `threshold`; [`NONE`] if none.
/// The cube's units take contiguous chunks of the row, add up their own, and the one whose chunk
/// crosses the threshold walks it.
#[cube]
#[allow(clippy::too_many_arguments)]
fn first_in_id_order(
    logits: &Tensor<f32>,
    base: usize,
    m: f32,
    inv_t: f32,
    count: bool,
    key: u32,
    match_key: bool,
    cut_key: u32,
    cut_id: u32,
    start: f32,
    threshold: f32,
    strict: bool,
    #[comptime] vocab: usize,
    #[comptime] units: usize,
) -> u32 {
    let unit = UNIT_POS as usize;
    #[allow(clippy::manual_div_ceil)] // `div_ceil` is not a cube operation
    let chunk = (vocab + units - 1) / units;
    let begin = unit * chunk;
    let end = usize::min(begin + chunk, vocab);
    let mut own = 0.0f32;
    let mut i = begin;
    while i < end {
        let l = logits[base + i];
        let k = order_key(l);
        if (!match_key || k == key) && in_cut(k, i as u32, cut_key, cut_id) {
            own += candidate_weight(l, m, inv_t, count);
        }
        i += 1;
    }
    let mut sums = Shared::<[f32]>::new_slice(units);
    sums[unit] = own;
    sync_cube();
    let mut before = start;
    for v in 0..unit {
        before += sums[v];
    }
    let mut found = 4294967295u32; // NONE
    if !reaches(before, threshold, strict) && reaches(before + own, threshold, strict) {
        // The crossing is in this chunk; if rounding hides it, its last candidate.
        let mut cumulative = before;
        let mut last = 4294967295u32; // NONE
        let mut j = begin;
        while j < end && found == NONE {
            let l = logits[base + j];
            let k = order_key(l);
            if (!match_key || k == key) && in_cut(k, j as u32, cut_key, cut_id) {
                cumulative += candidate_weight(l, m, inv_t, count);
                last = j as u32;
                if reaches(cumulative, threshold, strict) {
                    found = j as u32;
                }
            }
            j += 1;
        }
        if found == NONE {
            found = last;
        }
    }
    let mut founds = Shared::<[u32]>::new_slice(units);
    founds[unit] = found;
    sync_cube();
    let mut first = 4294967295u32; // NONE
    for v in 0..units {
        first = u32::min(first, founds[v]);
    }
    sync_cube();
    first
}

/// One token per row of `logits` (`[rows, vocab]`, one cube per row), picked as
/// [`Draw::pick`](crate::engine::Draw::pick) picks it on the host, and its temperature-1
/// log-prob. `params` holds per row `[u, temperature, top_k (0: all), top_p]`. A row holding
/// NaN gets the id −1.
///
/// Greedy takes the first maximum. An unfiltered draw walks the row in id order
/// ([`first_in_id_order`]). A filtered one never sorts: each cut of the ranking — the `top_k`-th
/// candidate, the end of the `top_p` nucleus, the drawn candidate — is a key found by bisection
/// ([`boundary_key`]) and, among the candidates sharing that key, a position in id order.
#[cube(launch)]
pub fn sample_rows(
    logits: &Tensor<f32>,
    params: &Tensor<f32>,
    ids: &mut Tensor<i32>,
    logprobs: &mut Tensor<f32>,
    #[comptime] vocab: usize,
    #[comptime] units: usize,
) {
    let row = CUBE_POS;
    let base = row * vocab;
    let unit = UNIT_POS as usize;
    let u = params[row * 4];
    let temperature = params[row * 4 + 1];
    let top_k = params[row * 4 + 2] as u32;
    let top_p = params[row * 4 + 3];

    // The first maximum, and whether the row holds NaN.
    let mut best = 0.0f32;
    let mut best_i = 4294967295u32; // NONE
    let mut nan = 0u32;
    let mut i = unit;
    while i < vocab {
        let l = logits[base + i];
        // NaN by its bits: WGSL lets a compiler assume `l != l` is false.
        let bits = u32::reinterpret(l);
        if (bits & 2139095040u32) == 2139095040u32 && (bits & 8388607u32) != 0 {
            nan = 1u32;
        } else if best_i == NONE || l > best {
            best = l;
            best_i = i as u32;
        }
        i += units;
    }
    let mut maxima = Shared::<[f32]>::new_slice(units);
    let mut argmaxima = Shared::<[u32]>::new_slice(units);
    let mut nans = Shared::<[u32]>::new_slice(units);
    maxima[unit] = best;
    argmaxima[unit] = best_i;
    nans[unit] = nan;
    sync_cube();
    let mut m = 0.0f32;
    let mut arg = 4294967295u32; // NONE
    let mut any_nan = 0u32;
    for v in 0..units {
        let a = argmaxima[v];
        if a != NONE && (arg == NONE || maxima[v] > m || (maxima[v] == m && a < arg)) {
            m = maxima[v];
            arg = a;
        }
        any_nan = u32::max(any_nan, nans[v]);
    }
    sync_cube();

    let mut s = 0.0f32;
    let mut j = unit;
    while j < vocab {
        s += f32::exp(logits[base + j] - m);
        j += units;
    }
    let normaliser = cube_sum(s, units);

    let mut id = arg;
    if !(temperature == 0.0 || top_k == 1) && any_nan == 0 {
        let inv_t = 1.0 / temperature;
        let by_k = top_k > 0 && top_k < vocab as u32;
        if !by_k && top_p >= 1.0 {
            let total = cut_mass(logits, base, m, inv_t, false, 0, 0, NONE, vocab, units);
            id = first_in_id_order(
                logits,
                base,
                m,
                inv_t,
                false,
                0,
                false,
                0,
                NONE,
                0.0,
                u * total,
                true,
                vocab,
                units,
            );
        } else {
            let mut cut_key = 0u32;
            let mut cut_id = 4294967295u32; // NONE
            if by_k {
                let k = top_k as f32;
                let key = boundary_key(
                    logits, base, m, inv_t, true, k, false, cut_key, cut_id, vocab, units,
                );
                let above = cut_mass(
                    logits, base, m, inv_t, true, key, cut_key, cut_id, vocab, units,
                );
                cut_id = first_in_id_order(
                    logits, base, m, inv_t, true, key, true, cut_key, cut_id, above, k, false,
                    vocab, units,
                );
                cut_key = key;
            }
            if top_p < 1.0 {
                let total = cut_mass(
                    logits, base, m, inv_t, false, 0, cut_key, cut_id, vocab, units,
                );
                let threshold = top_p * total;
                let key = boundary_key(
                    logits, base, m, inv_t, false, threshold, false, cut_key, cut_id, vocab, units,
                );
                let above = cut_mass(
                    logits, base, m, inv_t, false, key, cut_key, cut_id, vocab, units,
                );
                let at = first_in_id_order(
                    logits, base, m, inv_t, false, key, true, cut_key, cut_id, above, threshold,
                    false, vocab, units,
                );
                if at != NONE {
                    cut_key = key;
                    cut_id = at;
                }
            }
            let total = cut_mass(
                logits, base, m, inv_t, false, 0, cut_key, cut_id, vocab, units,
            );
            let threshold = u * total;
            let key = boundary_key(
                logits, base, m, inv_t, false, threshold, true, cut_key, cut_id, vocab, units,
            );
            let above = cut_mass(
                logits, base, m, inv_t, false, key, cut_key, cut_id, vocab, units,
            );
            id = first_in_id_order(
                logits, base, m, inv_t, false, key, true, cut_key, cut_id, above, threshold, true,
                vocab, units,
            );
            if id == NONE {
                // Rounding left nothing to draw: the cut's last candidate.
                id = cut_id;
            }
        }
        id = u32::min(id, vocab as u32 - 1);
    }
    if unit == 0 {
        if any_nan > 0 {
            ids[row] = -1;
        } else {
            ids[row] = id as i32;
            logprobs[row] = logits[base + id as usize] - m - f32::ln(normaliser);
        }
    }
}
