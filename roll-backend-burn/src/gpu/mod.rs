//! GPU kernels written once in CubeCL (features `wgpu` and `cuda`): the pieces of a Qwen forward,
//! backward and decode step that Burn would otherwise run as several separate kernels, each
//! reading and writing its whole tensor — residual-add + RMSNorm, rotary embedding, SwiGLU, the
//! log-prob/entropy of a token row, attention read straight from a paged key/value cache and the
//! sampling of a token from a row of logits (the
//! [`DeviceDecoder`](crate::engine::DeviceDecoder)'s), and the AdamW update with the clip factor
//! applied in the same pass (the trainer's optimiser runs it for every parameter on a cubecl
//! device).
//!
//! Each kernel is a `#[cube(launch)]` function over Burn's own cubecl tensors: a wrapper takes
//! Burn [`Tensor`](burn::tensor::Tensor)s on a cubecl device (wgpu, or CUDA where it can be built — Burn's `Cube`
//! backend is one type for every cubecl runtime), launches the kernel on their buffers and hands
//! the result back as a Burn tensor, so callers mix these kernels with Burn's matmul and
//! everything else. Every kernel has a CPU reference, and the tests run them on whatever Vulkan
//! adapter the machine has — on a machine without a GPU, Mesa's lavapipe (Vulkan on the CPU;
//! Debian `mesa-vulkan-drivers`), which is what CI does.
//!
//! Kernels index their tensors as contiguous row-major buffers; the wrappers copy a strided view
//! (a transpose, a gradient summed from one) into one on the device rather than read it wrongly.

mod kernels;
mod launch;
#[cfg(feature = "wgpu")]
mod vulkan;

pub(crate) use launch::{adamw_apply, on_cube_device};
pub use launch::{
    logprob_entropy, paged_attention, rms_norm, rms_norm_residual, rope, sample, silu_mul,
};
#[cfg(feature = "wgpu")]
pub use vulkan::vulkan_device;

#[cfg(all(test, feature = "wgpu"))]
mod tests;
