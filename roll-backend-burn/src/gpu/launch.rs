//! Burn tensors in, kernel launched on their buffers, Burn tensors out.

use super::kernels;
use crate::engine::{Draw, SampledToken};
use crate::train::adamw::Constants;
use crate::{BackendError, Result};
use burn::backend::Cube;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::{CubeCount, CubeDim};

/// Units per cube of the row kernels (a power of two).
const ROW_UNITS: usize = 128;
/// Units per cube of the element-wise kernels.
const ELEMENT_UNITS: u32 = 256;

/// The cubecl tensor under `tensor` as a contiguous row-major buffer, which the kernels index: a
/// strided view (a transpose, a gradient summed from one) is copied into one on the device.
fn cube<const D: usize, K>(tensor: Tensor<D, K>, what: &str) -> Result<CubeTensor>
where
    K: burn::tensor::kind::Basic + burn::tensor::BackendPrimitive<Cube, Primitive = CubeTensor>,
{
    let t = tensor.try_into_primitive::<Cube>().map_err(|e| {
        BackendError::InvalidInput(format!(
            "{what}: the GPU kernels run on a cubecl device (wgpu), not here: {e:?}"
        ))
    })?;
    Ok(if t.is_contiguous() {
        t
    } else {
        burn_cubecl::kernel::into_contiguous(t)
    })
}

fn float<const D: usize>(tensor: Tensor<D>, what: &str) -> Result<CubeTensor> {
    if tensor.dtype() != DType::F32 {
        return Err(BackendError::InvalidInput(format!(
            "{what}: the GPU kernels are f32, got {:?}",
            tensor.dtype()
        )));
    }
    cube(tensor, what)
}

fn back<const D: usize>(t: CubeTensor) -> Tensor<D> {
    Tensor::from_primitive::<Cube>(t)
}

/// An i32 vector on `device`.
fn ints(values: &[i32], device: &Device) -> Result<CubeTensor> {
    let t = Tensor::<1, Int>::from_data(
        TensorData::new(values.to_vec(), [values.len()]),
        (device, DType::I32),
    );
    cube(t, "indices")
}

/// A zero f32 matrix on `device`, for a kernel to write.
fn zeros(dims: [usize; 2], device: &Device) -> Result<CubeTensor> {
    float(Tensor::<2>::zeros(dims, device), "output")
}

fn same_dims<const D: usize>(a: &Tensor<D>, b: &Tensor<D>, what: &str) -> Result<()> {
    if a.dims() != b.dims() {
        return Err(BackendError::InvalidInput(format!(
            "{what}: shapes {:?} and {:?} differ",
            a.dims(),
            b.dims()
        )));
    }
    Ok(())
}

fn elementwise(n: usize) -> Result<(CubeCount, CubeDim)> {
    let cubes = u32::try_from(n.div_ceil(ELEMENT_UNITS as usize))
        .map_err(|_| BackendError::InvalidInput(format!("{n} elements are too many")))?;
    Ok((
        CubeCount::Static(cubes.max(1), 1, 1),
        CubeDim::new_1d(ELEMENT_UNITS),
    ))
}

fn rows(n: usize) -> Result<(CubeCount, CubeDim)> {
    let cubes = u32::try_from(n)
        .map_err(|_| BackendError::InvalidInput(format!("{n} rows are too many")))?;
    Ok((
        CubeCount::Static(cubes.max(1), 1, 1),
        CubeDim::new_1d(ROW_UNITS as u32),
    ))
}

/// `silu(gate) · up`, element by element (SwiGLU's activation).
///
/// # Errors
/// Tensors not on a cubecl device, not f32, or of different shapes.
pub fn silu_mul<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Result<Tensor<D>> {
    same_dims(&gate, &up, "silu_mul")?;
    let out = gate.zeros_like();
    let n = out.dims().iter().product();
    let (gate, up, out) = (
        float(gate, "silu_mul gate")?,
        float(up, "silu_mul up")?,
        float(out, "silu_mul output")?,
    );
    let (count, dim) = elementwise(n)?;
    kernels::silu_mul::launch(
        &out.client.clone(),
        count,
        dim,
        gate.into_tensor_arg(),
        up.into_tensor_arg(),
        out.clone().into_tensor_arg(),
    );
    Ok(back(out))
}

/// RMSNorm of each row of `x` (`[rows, d]`) with weight `weight` (`[d]`).
///
/// # Errors
/// Tensors not on a cubecl device, not f32, or of mismatched widths.
pub fn rms_norm(x: Tensor<2>, weight: Tensor<1>, eps: f32) -> Result<Tensor<2>> {
    Ok(norm_rows(x, None, weight, eps, "rms_norm")?.1)
}

/// The residual add and the next RMSNorm in one pass: returns `(x + residual,
/// rmsnorm(x + residual) · weight)`.
///
/// # Errors
/// As [`rms_norm`], or `x` and `residual` of different shapes.
pub fn rms_norm_residual(
    x: Tensor<2>,
    residual: Tensor<2>,
    weight: Tensor<1>,
    eps: f32,
) -> Result<(Tensor<2>, Tensor<2>)> {
    same_dims(&x, &residual, "rms_norm_residual")?;
    let (summed, normed) = norm_rows(x, Some(residual), weight, eps, "rms_norm_residual")?;
    Ok((summed, normed))
}

/// [`kernels::rms_norm_rows`], with the residual add when `residual` is given; returns the sum
/// (a one-element placeholder without a residual) and the normalised rows.
fn norm_rows(
    x: Tensor<2>,
    residual: Option<Tensor<2>>,
    weight: Tensor<1>,
    eps: f32,
    what: &str,
) -> Result<(Tensor<2>, Tensor<2>)> {
    let [n, d] = x.dims();
    if weight.dims() != [d] {
        return Err(BackendError::InvalidInput(format!(
            "{what}: rows of {d} but a weight of {:?}",
            weight.dims()
        )));
    }
    let device = x.device();
    let add_residual = residual.is_some();
    let placeholder = || Tensor::<2>::zeros([1, 1], &device);
    let residual = float(residual.unwrap_or_else(placeholder), "residual")?;
    let summed = if add_residual {
        zeros([n, d], &device)?
    } else {
        float(placeholder(), "placeholder")?
    };
    let (x, weight) = (float(x, "x")?, float(weight, "weight")?);
    let out = zeros([n, d], &device)?;
    let (count, dim) = rows(n)?;
    kernels::rms_norm_rows::launch(
        &out.client.clone(),
        count,
        dim,
        x.into_tensor_arg(),
        residual.into_tensor_arg(),
        weight.into_tensor_arg(),
        summed.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        eps,
        add_residual,
        ROW_UNITS,
    );
    Ok((back(summed), back(out)))
}

/// Rotary embedding of `x` (`[rows · heads, head_dim]`, row `r`'s heads at `positions[r]`)
/// with the `[max_position, head_dim / 2]` tables `cos` and `sin`.
///
/// # Errors
/// Tensors not on a cubecl device or not f32, an odd `head_dim`, shapes that disagree, or a
/// position beyond the tables.
pub fn rope(
    x: Tensor<2>,
    heads: usize,
    positions: &[usize],
    cos: Tensor<2>,
    sin: Tensor<2>,
) -> Result<Tensor<2>> {
    let [n, head_dim] = x.dims();
    let [table, half] = cos.dims();
    if head_dim % 2 != 0
        || half * 2 != head_dim
        || sin.dims() != cos.dims()
        || n != positions.len() * heads
    {
        return Err(BackendError::InvalidInput(format!(
            "rope: x {:?} with {heads} heads per row, {} positions, tables {:?} / {:?}",
            x.dims(),
            positions.len(),
            cos.dims(),
            sin.dims()
        )));
    }
    let positions: Vec<i32> = positions
        .iter()
        .map(|&p| {
            i32::try_from(p)
                .ok()
                .filter(|&p| (p as usize) < table)
                .ok_or_else(|| {
                    BackendError::InvalidInput(format!(
                        "rope: position {p} beyond the {table} positions of the tables"
                    ))
                })
        })
        .collect::<Result<_>>()?;
    let device = x.device();
    let positions = ints(&positions, &device)?;
    let (x, cos, sin) = (
        float(x, "rope x")?,
        float(cos, "rope cos")?,
        float(sin, "rope sin")?,
    );
    let out = zeros([n, head_dim], &device)?;
    let (count, dim) = elementwise(n * half)?;
    kernels::rope_rows::launch(
        &out.client.clone(),
        count,
        dim,
        x.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        positions.into_tensor_arg(),
        cos.into_tensor_arg(),
        sin.into_tensor_arg(),
        heads,
        head_dim,
    );
    Ok(back(out))
}

/// Per row of `logits` (`[rows, vocab]`): the log-prob of `targets[row]` and the entropy of
/// the row's distribution, without writing a softmax.
///
/// # Errors
/// Tensors not on a cubecl device or not f32, one target per row not given, or a target
/// outside the vocabulary.
pub fn logprob_entropy(logits: Tensor<2>, targets: &[u32]) -> Result<(Tensor<1>, Tensor<1>)> {
    let [n, vocab] = logits.dims();
    if targets.len() != n {
        return Err(BackendError::InvalidInput(format!(
            "logprob_entropy: {n} rows but {} targets",
            targets.len()
        )));
    }
    let targets: Vec<i32> = targets
        .iter()
        .map(|&t| {
            i32::try_from(t)
                .ok()
                .filter(|&t| (t as usize) < vocab)
                .ok_or(BackendError::TokenOutOfVocab {
                    id: t,
                    vocab_size: vocab,
                })
        })
        .collect::<Result<_>>()?;
    let device = logits.device();
    let targets = ints(&targets, &device)?;
    let logits = float(logits, "logprob_entropy logits")?;
    let logprobs = float(Tensor::<1>::zeros([n], &device), "log-probs")?;
    let entropies = float(Tensor::<1>::zeros([n], &device), "entropies")?;
    let (count, dim) = rows(n)?;
    kernels::logprob_entropy_rows::launch(
        &logits.client.clone(),
        count,
        dim,
        logits.into_tensor_arg(),
        targets.into_tensor_arg(),
        logprobs.clone().into_tensor_arg(),
        entropies.clone().into_tensor_arg(),
        vocab,
        ROW_UNITS,
    );
    Ok((back(logprobs), back(entropies)))
}

/// Units per cube of [`paged_attention`] (each takes every `ATTENTION_UNITS`-th position).
const ATTENTION_UNITS: usize = 32;

/// Causal grouped-query attention of `q` (`[tokens · heads, head_dim]`, token-major, already
/// rotated) over keys and values read from paged pools (`[pool_rows, kv_heads · head_dim]`):
/// the query of token `i` sits at position `start + i` and attends to positions `0 ..= start + i`,
/// whose pool rows `rows` (an i32 vector of `start + tokens` rows) gives. Scores are scaled by
/// `scale`. Returns `[tokens · heads, head_dim]`. See the kernel `paged_attention` (`gpu/kernels.rs`).
///
/// # Errors
/// Tensors not on a cubecl device or not f32, `rows` not i32, or shapes that disagree (heads not
/// a multiple of `kv_heads`, pools of another width, a row count other than `start + tokens`).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    q: Tensor<2>,
    k_pool: Tensor<2>,
    v_pool: Tensor<2>,
    rows: Tensor<1, Int>,
    start: usize,
    heads: usize,
    kv_heads: usize,
    scale: f32,
) -> Result<Tensor<2>> {
    let [n, head_dim] = q.dims();
    let [pool_rows, width] = k_pool.dims();
    let [len] = rows.dims();
    let tokens = n.checked_div(heads).unwrap_or(0);
    if kv_heads == 0
        || !heads.is_multiple_of(kv_heads)
        || tokens * heads != n
        || tokens == 0
        || width != kv_heads * head_dim
        || v_pool.dims() != [pool_rows, width]
        || len != start + tokens
    {
        return Err(BackendError::InvalidInput(format!(
            "paged_attention: q {:?} with {heads} heads / {kv_heads} kv heads, pools {:?} / {:?}, \
             {len} rows for start {start}",
            q.dims(),
            k_pool.dims(),
            v_pool.dims()
        )));
    }
    if rows.dtype() != DType::I32 {
        return Err(BackendError::InvalidInput(format!(
            "paged_attention: rows must be i32, got {:?}",
            rows.dtype()
        )));
    }
    let start = u32::try_from(start).map_err(|_| {
        BackendError::InvalidInput(format!("paged_attention: start {start} is too large"))
    })?;
    let device = q.device();
    let (q, k_pool, v_pool) = (
        float(q, "paged_attention q")?,
        float(k_pool, "paged_attention keys")?,
        float(v_pool, "paged_attention values")?,
    );
    let rows = cube(rows, "paged_attention rows")?;
    let out = zeros([n, head_dim], &device)?;
    let cubes = u32::try_from(n)
        .map_err(|_| BackendError::InvalidInput(format!("{n} query rows are too many")))?;
    kernels::paged_attention::launch(
        &out.client.clone(),
        CubeCount::Static(cubes, 1, 1),
        CubeDim::new_1d(ATTENTION_UNITS as u32),
        q.into_tensor_arg(),
        k_pool.into_tensor_arg(),
        v_pool.into_tensor_arg(),
        rows.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        start,
        scale,
        heads,
        kv_heads,
        head_dim,
        ATTENTION_UNITS,
    );
    Ok(back(out))
}

/// One token per row of `logits` (`[rows, vocab]`) for the row's draw, picked on the device as
/// [`Draw::pick`] picks it on the host — same rule, same uniform number, so a seeded request
/// draws the same tokens wherever its logits are (up to the rounding of sums near a boundary of
/// the cumulative distribution) — with its temperature-1 log-prob. Two numbers per row come back
/// instead of the row. See the kernel `sample_rows` (`gpu/kernels.rs`).
///
/// # Errors
/// Logits not on a cubecl device or not f32, or not one draw per row; a row holding NaN fails
/// on its own, naming the row.
pub fn sample(logits: Tensor<2>, draws: &[Draw]) -> Result<Vec<Result<SampledToken>>> {
    let [n, vocab] = logits.dims();
    if draws.len() != n || vocab == 0 {
        return Err(BackendError::InvalidInput(format!(
            "sample: {n} rows of {vocab} logits but {} draws",
            draws.len()
        )));
    }
    if vocab >= 1 << 24 {
        return Err(BackendError::InvalidInput(format!(
            "sample: a vocabulary of {vocab} is beyond the kernel's 2^24"
        )));
    }
    let params: Vec<f32> = draws
        .iter()
        .flat_map(|d| {
            let top_k = d
                .rule
                .top_k
                .filter(|&k| k < vocab)
                .map_or(0.0, |k| k as f32);
            [d.u as f32, d.rule.temperature, top_k, d.rule.top_p]
        })
        .collect();
    let device = logits.device();
    let params = float(
        Tensor::<2>::from_data(TensorData::new(params, [n, 4]), &device),
        "sample params",
    )?;
    let logits = float(logits, "sample logits")?;
    let ids = cube(
        Tensor::<1, Int>::zeros([n], (&device, DType::I32)),
        "sampled ids",
    )?;
    let logprobs = float(Tensor::<1>::zeros([n], &device), "sampled log-probs")?;
    let (count, dim) = rows(n)?;
    kernels::sample_rows::launch(
        &logits.client.clone(),
        count,
        dim,
        logits.into_tensor_arg(),
        params.into_tensor_arg(),
        ids.clone().into_tensor_arg(),
        logprobs.clone().into_tensor_arg(),
        vocab,
        ROW_UNITS,
    );
    let read = |e| BackendError::InvalidInput(format!("reading sampled tokens: {e:?}"));
    let ids: Vec<i32> = Tensor::<1, Int>::from_primitive::<Cube>(ids)
        .into_data()
        .try_into_vec()
        .map_err(read)?;
    let logprobs: Vec<f32> = back::<1>(logprobs)
        .into_data()
        .try_into_vec()
        .map_err(read)?;
    Ok(ids
        .into_iter()
        .zip(logprobs)
        .enumerate()
        .map(|(row, (id, logprob))| match u32::try_from(id) {
            Ok(id) => Ok(SampledToken { id, logprob }),
            Err(_) => Err(BackendError::InvalidInput(format!(
                "logits row {row} holds NaN: the model produced non-finite values"
            ))),
        })
        .collect())
}

/// Whether `tensor` lives on a cubecl device (where these kernels run).
pub(crate) fn on_cube_device<const D: usize>(tensor: &Tensor<D>) -> bool {
    tensor.clone().try_into_primitive::<Cube>().is_ok()
}

/// One fused AdamW update of a parameter with the CPU optimiser's constants `c` (see
/// [`kernels::adamw_update`]): returns the new parameter and moments.
///
/// # Errors
/// Tensors not on a cubecl device, not f32, or of different shapes.
pub(crate) fn adamw_apply<const D: usize>(
    params: Tensor<D>,
    grads: Tensor<D>,
    m: Tensor<D>,
    v: Tensor<D>,
    c: &Constants,
) -> Result<(Tensor<D>, Tensor<D>, Tensor<D>)> {
    for (other, what) in [(&grads, "grads"), (&m, "m"), (&v, "v")] {
        same_dims(&params, other, &format!("adamw {what}"))?;
    }
    let n = params.dims().iter().product();
    let device = params.device();
    let constants = float(
        Tensor::<1>::from_data(TensorData::new(c.as_array().to_vec(), [10]), &device),
        "adamw constants",
    )?;
    let (p_out, m_out, v_out) = (
        params.zeros_like(),
        params.zeros_like(),
        params.zeros_like(),
    );
    let (p_out, m_out, v_out) = (
        float(p_out, "adamw output")?,
        float(m_out, "adamw output")?,
        float(v_out, "adamw output")?,
    );
    let (params, grads, m, v) = (
        float(params, "adamw params")?,
        float(grads, "adamw grads")?,
        float(m, "adamw m")?,
        float(v, "adamw v")?,
    );
    let (count, dim) = elementwise(n)?;
    kernels::adamw_update::launch(
        &params.client.clone(),
        count,
        dim,
        params.into_tensor_arg(),
        grads.into_tensor_arg(),
        m.into_tensor_arg(),
        v.into_tensor_arg(),
        p_out.clone().into_tensor_arg(),
        m_out.clone().into_tensor_arg(),
        v_out.clone().into_tensor_arg(),
        constants.into_tensor_arg(),
        c.first,
    );
    Ok((back(p_out), back(m_out), back(v_out)))
}
